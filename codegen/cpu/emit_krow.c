/* codegen/cpu/emit_krow.c — kernel rows as AMX tiles (mpt_cpu_kx.krow):
 * a convolution whose taps are too short for tiles of their own (an
 * image's first layer) or a filter gradient without tiles of its own
 * reads each kernel row's KW*C consecutive elements of the padded image
 * as one run of k. The padded image and the tables come from
 * emit_gather.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/emit.h"

/* A first layer's kernel rows as AMX tiles (mpt_cpu_kx.krow). With fewer
 * than 16 channels a tap is too short for tiles of its own, and the
 * gathered f32 FMAs that such a layer took before ran at a small fraction
 * of AMX's rate. But a kernel row's KW*C elements are consecutive in a
 * padded image row, and so are the elements just past them: a tile row
 * reads 32 (or 64) of them from its window's corner, and zero weights past
 * KW*C leave out what is not its window. The products with those zeros
 * are the price, krow / (KW*C) of the products; not where that passes 3,
 * and only where an output row is whole tiles (OW a multiple of 16, so
 * that a tile's rows are equally far apart). The filter gradient copies
 * the same rows into its B (the columns past KW*C give sums that are left
 * out), so it need not step along output rows. */
int64_t mpt_cpu_krow_tiles_pay(const mpt_cpu_jit *j, mpt_dtype a_dt, mpt_dtype b_dt,
                               const int64_t *q, int fwd) {
    const char *env = getenv("MPT_CPU_CONV_TILES"), *kr = getenv("MPT_CPU_CONV_KROW");
    if ((env && !strcmp(env, "0")) || (kr && !strcmp(kr, "0")))
        return 0;
    if (!mpt_cpu_jit_has_amx(j) || a_dt != MPT_DT_BF16 || b_dt != MPT_DT_BF16 ||
        (fwd && (q[MPT_G_C] >= 16 || q[MPT_G_OW] % 16)))
        return 0;
    int64_t run = q[MPT_G_KW] * q[MPT_G_C], krow = (run + 31) / 32 * 32;
    if (q[MPT_G_C] < 16)
        return krow <= 3 * run ? krow : 0;
    /* a wider filter gradient without tiles of its own (a batch of 32s
     * has them), where its two transposes are small next to its columns:
     * dy^T (O x P) where the columns have at least twice O, dw (O x KK)
     * where P is at least twice KK; not for a 1x1 kernel, whose columns
     * are only a subsample of the image. ResNet-50 at batch 8: the 3x3
     * convolutions of stages 2 and 3 15-25% faster; those of stages 4 and
     * 5 (P = 1568, 392) and the strided 1x1 convolutions slower. */
    int64_t P = q[MPT_G_N] * q[MPT_G_OH] * q[MPT_G_OW], KK = q[MPT_G_KH] * run;
    return run % 32 == 0 && q[MPT_G_N] % 32 && q[MPT_G_KH] * q[MPT_G_KW] > 1 &&
           KK >= 2 * q[MPT_G_O] && P >= 2 * KK ? krow : 0;
}

/* Rows in NHWC's (n, oh, ow) order at their window's corner in the padded
 * image; k = (kh, r) at kh padded rows and r elements from it, r < krow.
 * Always a padded copy, with KROW_TAIL bytes of zeros after it for the
 * last window's tile rows to read. */
enum { KROW_TAIL = 64 };

int mpt_cpu_krow_tiles_plan(mpt_cpu_kx *x, int fwd, int64_t es, char *err, size_t n) {
    const int64_t *q = x->geom;
    int64_t K = q[MPT_G_KH] * x->krow, P = q[MPT_G_N] * q[MPT_G_OH] * q[MPT_G_OW];
    if (mpt_cpu_tile_tables(x, es, 1, K, err, n))
        return -1;
    int64_t C = q[MPT_G_C], hp = x->pad[MPT_CPU_PAD_HP], wp = x->pad[MPT_CPU_PAD_WP];
    for (int64_t k = 0; k < K; k++) x->g_col[k] = (k / x->krow * wp * C + k % x->krow) * es;
    x->pad_slot = mpt_cpu_kx_slot(x, -6, q[MPT_G_N] * hp * wp * C * es + KROW_TAIL);
    if (fwd)
        x->wt_slot = mpt_cpu_kx_slot(x, -4, K * q[MPT_G_O] * es);
    else if ((x->acc_slot = mpt_cpu_kx_slot(x, -3, K * q[MPT_G_O] * 4)) >= 0 &&
             q[MPT_G_O] % 32 == 0 && P % 32 == 0)
        /* dy^T [O, P], which the GEMM's tiles read in place: packed from dy,
         * it was packed whole by each thread */
        x->wt_slot = mpt_cpu_kx_slot(x, -4, P * q[MPT_G_O] * es);
    if (x->pad_slot < 0 || (fwd ? x->wt_slot : x->acc_slot) < 0) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    return 0;
}

/* B of the filter gradient: k the positions, w = (kh, r) the kernel rows' elements. */
typedef struct {
    const char *base;
    const int64_t *row, *col;
    int64_t krow;
    size_t es;
} krow_rows;

/* B written straight into AMX's B sliver, positions in pairs (there is no
 * other fill: this path is AMX's only). A sliver of 32 columns inside one
 * kernel row is two rows of 64 bytes interleaved per pair. */
static void krow_rows_pairs(const void *ctx, int64_t w0, int64_t wc, int64_t k0, int64_t kc,
                            void *dst, int64_t width, int64_t kp) {
    const krow_rows *kr = ctx;
    uint16_t *o = dst;
    int whole = width == 32 && wc == 32 && kr->es == 2 && kr->krow % 32 == 0;
    for (int64_t k = 0; k < kp; k += 2, o += 2 * width) {
        if (whole && k + 1 < kc) {
            mpt_cpu_pairs32_u16((const uint16_t *)(kr->base + kr->row[k0 + k] + kr->col[w0]),
                                (const uint16_t *)(kr->base + kr->row[k0 + k + 1] + kr->col[w0]), o);
            continue;
        }
        for (int64_t w = 0; w < width; w++)
            for (int e = 0; e < 2; e++) {
                uint16_t v = 0;
                if (w < wc && k + e < kc)
                    memcpy(&v, kr->base + kr->row[k0 + k + e] + kr->col[w0 + w], 2);
                o[2 * w + e] = v;
            }
    }
}

/* dy [P, O] into dy^T [O, P] (2-byte elements, P a multiple of 32 and O
 * of 8), runs of 32 positions split over the pool's threads. */
typedef struct {
    const uint16_t *src;
    uint16_t *dst;
    int64_t P, O;
    int n_tasks;
} dy_transpose;

static void dy_transpose_task(void *ctx, int task, int thread) {
    (void)thread;
    const dy_transpose *t = ctx;
    /* 8 of dy^T's rows at a time, 128 positions along: dy^T's rows are
     * often a multiple of 4 KiB apart, and writing all O of them at once
     * thrashed a set of L1 (3x slower) */
    int64_t rows = t->P / 32, lo = rows * task / t->n_tasks, hi = rows * (task + 1) / t->n_tasks;
    for (int64_t r = lo * 32; r < hi * 32; r += 128) {
        int64_t end = r + 128 < hi * 32 ? r + 128 : hi * 32;
        for (int64_t o = 0; o < t->O; o += 8)
            for (int64_t i = r; i < end; i += 8)
                mpt_cpu_tr8x8_u16(t->src + i * t->O + o, t->O, t->dst + o * t->P + i, t->P);
    }
}

/* dw^T [O, KH*krow] in f32 into dw [KH, KW*C, O], the columns past KW*C
 * left out: blocks of 16 x 16, rows of dw split over the pool's threads
 * (ResNet-sized layers have millions of elements here), bf16 rounded
 * inline (mpt_cpu_bf16_of). */
typedef struct {
    const mpt_cpu_kx *x;
    mpt_dtype dt;
    int n_tasks;
} dw_store;

static void krow_dw_store_task(void *ctx, int task, int thread) {
    (void)thread;
    const dw_store *t = ctx;
    const mpt_cpu_kx *x = t->x;
    const int64_t *q = x->geom;
    int64_t O = q[MPT_G_O], run = q[MPT_G_KW] * q[MPT_G_C], K = q[MPT_G_KH] * x->krow;
    int64_t lo, hi;
    mpt_cpu_task_rows(q[MPT_G_KH] * run, 16, task, t->n_tasks, &lo, &hi);
    const float *acc = x->slots[x->acc_slot];
    void *dst = x->slots[x->c_slot];
    for (int64_t j0 = lo; j0 < hi; j0 += 16)
        for (int64_t o0 = 0; o0 < O; o0 += 16)
            for (int64_t j = j0; j < j0 + 16 && j < hi; j++) {
                const float *src = acc + j / run * x->krow + j % run;
                for (int64_t o = o0; o < o0 + 16 && o < O; o++) {
                    float v = src[o * K];
                    if (t->dt == MPT_DT_F32) {
                        ((float *)dst)[j * O + o] = v;
                        continue;
                    }
                    if (t->dt == MPT_DT_BF16)
                        ((uint16_t *)dst)[j * O + o] = mpt_cpu_bf16_of(v);
                    else
                        mpt_cpu_store_f32(t->dt, &v, (char *)dst + (size_t)(j * O + o) * 2, 1);
                }
            }
}

/* The padded image, with its tail of zeros (KROW_TAIL) after it. */
static const char *krow_image(mpt_cpu_kx *x, mpt_pool *pool, size_t es) {
    const int64_t *d = x->pad;
    char *base = (char *)mpt_cpu_gather_base(x, pool, x->slots[x->a_slot]);
    memset(base + (size_t)(d[MPT_CPU_PAD_N] * d[MPT_CPU_PAD_HP] * d[MPT_CPU_PAD_WP] * d[MPT_CPU_PAD_C]) * es, 0, KROW_TAIL);
    return base;
}

int mpt_cpu_krow_tiles_run(mpt_cpu_kx *x, mpt_pool *pool, int fwd, mpt_dtype c_dt, size_t es,
                           char *err, size_t n) {
    const int64_t *q = x->geom;
    void **s = x->slots;
    const char *base = krow_image(x, pool, es);
    if (!fwd) {
        krow_rows kr = {base, x->g_row, x->g_col, x->krow, es};
        mpt_cpu_gemm_source src = {NULL, &kr, 1, krow_rows_pairs};
        const void *a = s[x->b_slot];
        if (x->wt_slot >= 0) {
            dy_transpose t = {a, s[x->wt_slot], x->K, q[MPT_G_O], 1};
            mpt_cpu_pool_rows(pool, x->K / 32, &t.n_tasks, dy_transpose_task, &t);
            a = t.dst;
        }
        if (mpt_cpu_gemm_run_src(x->gemm, pool, q[MPT_G_O], q[MPT_G_KH] * x->krow, x->K, NULL,
                                 a, 0, &src, NULL, 0, s[x->acc_slot], 0, NULL, err, n))
            return -1;
        dw_store t = {x, c_dt, 1};
        mpt_cpu_pool_rows(pool, (q[MPT_G_KH] * q[MPT_G_KW] * q[MPT_G_C] + 15) / 16, &t.n_tasks,
                          krow_dw_store_task, &t);
        return 0;
    }
    /* the weights [KH, KW*C, O] into [KH, krow, O], zeros past KW*C */
    size_t run = (size_t)(q[MPT_G_KW] * q[MPT_G_C] * q[MPT_G_O]) * es;
    size_t row = (size_t)(x->krow * q[MPT_G_O]) * es;
    for (int64_t kh = 0; kh < q[MPT_G_KH]; kh++) {
        char *o = (char *)s[x->wt_slot] + (size_t)kh * row;
        memcpy(o, (const char *)s[x->b_slot] + (size_t)kh * run, run);
        memset(o + run, 0, row - run);
    }
    mpt_cpu_gemm_gather ga = {base, x->g_row, x->g_col, NULL,
                              q[MPT_G_SW] * q[MPT_G_C] * (int64_t)es, 0};
    mpt_cpu_epilogue_args epi;
    return mpt_cpu_gemm_run_gather(x->gemm, pool, x->M, x->N, q[MPT_G_KH] * x->krow, &ga,
                                   s[x->wt_slot], 0, s[x->c_slot], 0, mpt_cpu_chain_args(x, &epi),
                                   err, n);
}
