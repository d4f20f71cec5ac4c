/* codegen/cpu/emit_planes.c — a stride-1 bf16 filter gradient on AMX from
 * channel planes (mpt_cpu_kx.planes).
 *
 * dw[(kh, kw, c), o] = sum over images n and output positions (oh, ow) of
 * x[n, oh + kh - PH, ow + kw - PW, c] * dy[n, oh, ow, o]. With the image
 * copied into one zero-padded plane per channel, WP wide, and the output
 * positions numbered t = oh * WP + ow on the same grid (the columns ow >=
 * OW are positions whose dy is zero), the image elements of tap (kh, kw)
 * at consecutive t are consecutive in channel c's plane, from kh * WP + kw
 * on. So A = the column matrix transposed, [KH*KW*C, positions], is read
 * a tile at a time in place: a tile's 16 rows are 16 channels of one tap,
 * a plane apart, each 32 consecutive positions. B is dy on that grid, in
 * AMX's pairs, zeros on the extra columns. Each image's positions are
 * rounded up to whole tiles (T, a multiple of 32), and each plane is long
 * enough that a tile reading the last of them stays inside it, on zeros.
 *
 * Nothing the size of the column matrix is written: the planes are the
 * image once (with its padding), B is dy once. The kernel rows of
 * emit_krow.c wrote the columns (KH times the image) into B instead.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/emit.h"

static int64_t round32(int64_t v) { return (v + 31) / 32 * 32; }

/* The grid's geometry: WP (padded row), T (positions of an image, whole
 * tiles), PL (a plane); HP (padded rows). */
static void grid_of(const int64_t *q, int64_t *wp, int64_t *t, int64_t *pl, int64_t *hp) {
    int64_t need_h = q[MPT_G_OH] - 1 + q[MPT_G_KH], need_w = q[MPT_G_OW] - 1 + q[MPT_G_KW];
    *hp = need_h > q[MPT_G_PH] + q[MPT_G_H] ? need_h : q[MPT_G_PH] + q[MPT_G_H];
    *wp = need_w > q[MPT_G_PW] + q[MPT_G_W] ? need_w : q[MPT_G_PW] + q[MPT_G_W];
    *t = round32(q[MPT_G_OH] * *wp);
    int64_t reach = *t + (q[MPT_G_KH] - 1) * *wp + q[MPT_G_KW] - 1;
    *pl = round32(reach > *hp * *wp ? reach : *hp * *wp);
}

int64_t mpt_cpu_planes_pay(const mpt_cpu_jit *j, mpt_dtype a_dt, mpt_dtype b_dt,
                           const int64_t *q) {
    const char *env = getenv("MPT_CPU_CONV_PLANES");
    if ((env && !strcmp(env, "0")) || !mpt_cpu_jit_has_amx(j) || a_dt != MPT_DT_BF16 ||
        b_dt != MPT_DT_BF16)
        return 0;
    if (q[MPT_G_SH] != 1 || q[MPT_G_SW] != 1 || q[MPT_G_C] % 16 ||
        q[MPT_G_KH] * q[MPT_G_KW] == 1)
        return 0;
    /* a batch of 32s has tiles of its own (mpt_cpu_wgrad_tiles_pay); the
     * grid's extra positions must stay a small share of the products */
    int64_t wp, t, pl, hp;
    grid_of(q, &wp, &t, &pl, &hp);
    if ((q[MPT_G_N] % 32 == 0 && !(env && !strcmp(env, "1"))) ||
        4 * t > 5 * q[MPT_G_OH] * q[MPT_G_OW])
        return 0;
    return t;
}

int mpt_cpu_planes_plan(mpt_cpu_kx *x, int64_t es, char *err, size_t n) {
    const int64_t *q = x->geom;
    int64_t wp, t, pl, hp, C = q[MPT_G_C], N = q[MPT_G_N];
    grid_of(q, &wp, &t, &pl, &hp);
    x->planes = t;
    int64_t M = q[MPT_G_KH] * q[MPT_G_KW] * C, K = N * t;
    x->g_row = malloc((size_t)(M + 32) * 8);
    x->g_col = malloc((size_t)K * 8);
    x->g_perm = malloc((size_t)K * 8);
    x->pad_slot = mpt_cpu_kx_slot(x, -6, N * C * pl * es);
    if (!x->g_row || !x->g_col || !x->g_perm || x->pad_slot < 0) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    for (int64_t i = 0; i < M; i++) {
        int64_t kh = i / (q[MPT_G_KW] * C), kw = i / C % q[MPT_G_KW], c = i % C;
        x->g_row[i] = (c * pl + kh * wp + kw) * es;
    }
    /* the last tile's second half reads 16 rows past M */
    for (int64_t i = M; i < M + 32; i++) x->g_row[i] = x->g_row[0];
    for (int64_t k = 0; k < K; k++) {
        int64_t b = k / t, at = k % t, oh = at / wp, ow = at % wp;
        x->g_col[k] = (b * C * pl + at) * es;
        x->g_perm[k] = oh < q[MPT_G_OH] && ow < q[MPT_G_OW] ? (b * q[MPT_G_OH] + oh) * q[MPT_G_OW] + ow
                                                           : -1;
    }
    return 0;
}

/* The planes of image rows (n, hp) for every channel: a padded row of WP,
 * zeros outside the image; an image's last row also zeroes its planes'
 * tails past HP*WP. */
typedef struct {
    const int64_t *q;
    const uint16_t *x;
    uint16_t *p;
    int64_t hp, wp, pl;
    int n_tasks;
} planes_copy;

static void planes_task(void *ctx, int task, int thread) {
    (void)thread;
    const planes_copy *pc = ctx;
    const int64_t *q = pc->q;
    int64_t C = q[MPT_G_C], H = q[MPT_G_H], W = q[MPT_G_W], PH = q[MPT_G_PH], PW = q[MPT_G_PW];
    int64_t rows = q[MPT_G_N] * pc->hp, lo = rows * task / pc->n_tasks, hi = rows * (task + 1) / pc->n_tasks;
    for (int64_t r = lo; r < hi; r++) {
        int64_t b = r / pc->hp, hp = r % pc->hp, ih = hp - PH;
        uint16_t *plane0 = pc->p + b * C * pc->pl + hp * pc->wp;
        if (ih < 0 || ih >= H) {
            for (int64_t c = 0; c < C; c++) memset(plane0 + c * pc->pl, 0, (size_t)pc->wp * 2);
        } else {
            const uint16_t *src = pc->x + (b * H + ih) * W * C;
            int64_t w8 = W / 8 * 8;
            for (int64_t c = 0; c < C; c++) {
                uint16_t *o = plane0 + c * pc->pl;
                memset(o, 0, (size_t)PW * 2);
                memset(o + PW + W, 0, (size_t)(pc->wp - PW - W) * 2);
            }
            for (int64_t w = 0; w < w8; w += 8)
                for (int64_t c = 0; c < C; c += 8)
                    mpt_cpu_tr8x8_u16(src + w * C + c, C, plane0 + c * pc->pl + PW + w, pc->pl);
            for (int64_t w = w8; w < W; w++)
                for (int64_t c = 0; c < C; c++) plane0[c * pc->pl + PW + w] = src[w * C + c];
        }
        if (hp == pc->hp - 1)
            for (int64_t c = 0; c < C; c++)
                memset(pc->p + (b * C + c) * pc->pl + pc->hp * pc->wp, 0,
                       (size_t)(pc->pl - pc->hp * pc->wp) * 2);
    }
}

/* B: dy's rows on the grid (zeros where perm < 0), in AMX's pairs. */
typedef struct {
    const char *dy;
    const int64_t *perm;
    int64_t O;
} grid_rows;

static void grid_rows_pairs(const void *ctx, int64_t w0, int64_t wc, int64_t k0, int64_t kc,
                            void *dst, int64_t width, int64_t kp) {
    const grid_rows *gr = ctx;
    uint16_t *o = dst;
    static const uint16_t zeros[32];
    for (int64_t k = 0; k < kp; k += 2, o += 2 * width) {
        int64_t r0 = k < kc ? gr->perm[k0 + k] : -1, r1 = k + 1 < kc ? gr->perm[k0 + k + 1] : -1;
        const uint16_t *a = r0 >= 0 ? (const uint16_t *)gr->dy + r0 * gr->O + w0 : zeros;
        const uint16_t *b = r1 >= 0 ? (const uint16_t *)gr->dy + r1 * gr->O + w0 : zeros;
        if (width == 32 && wc == 32) {
            mpt_cpu_pairs32_u16(a, b, o);
            continue;
        }
        for (int64_t w = 0; w < width; w++) {
            o[2 * w] = w < wc && r0 >= 0 ? a[w] : 0;
            o[2 * w + 1] = w < wc && r1 >= 0 ? b[w] : 0;
        }
    }
}

int mpt_cpu_planes_run(mpt_cpu_kx *x, mpt_pool *pool, size_t es, char *err, size_t n) {
    const int64_t *q = x->geom;
    void **s = x->slots;
    int64_t wp, t, pl, hp;
    grid_of(q, &wp, &t, &pl, &hp);
    planes_copy pc = {q, s[x->a_slot], s[x->pad_slot], hp, wp, pl, 1};
    mpt_cpu_pool_rows(pool, q[MPT_G_N] * hp, &pc.n_tasks, planes_task, &pc);
    mpt_cpu_gemm_gather ga = {s[x->pad_slot], x->g_row, x->g_col, NULL, pl * (int64_t)es, 0};
    grid_rows gr = {s[x->b_slot], x->g_perm, q[MPT_G_O]};
    mpt_cpu_gemm_source src = {NULL, &gr, 1, grid_rows_pairs};
    return mpt_cpu_gemm_run_gather_src(x->gemm, pool, x->M, x->N, x->K, &ga, &src, s[x->c_slot], 0,
                                       NULL, err, n);
}
