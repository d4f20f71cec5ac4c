/* codegen/cpu/attention_impl.h — what the fused attention kernels'
 * forward (attention.c) and backward (attention_grad.c) share: the job
 * both read, the loads and stores in each dtype, the softmax's exp, the
 * mask and dropout of a row of keys, the vector type the register-blocked
 * tiles are written in, and the tile products both directions run.
 * Private to codegen/cpu/. */
#ifndef MPT_CODEGEN_CPU_ATTENTION_IMPL_H
#define MPT_CODEGEN_CPU_ATTENTION_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "codegen/cpu/emit.h"

/* a tile of scores is BQ x BK floats (8 KiB), the Q block and the K, V
 * blocks a few KiB for head sizes up to 64: all in L1 */
enum { BQ = 32, BK = 64 };
#define MASKED_SCORE (-1e9f)

/* one clone per ISA, chosen at load by the host's; a build given
 * -DHOST_CLONES='__attribute__((target("arch=x86-64-v3")))' (or empty)
 * runs that one alone, to test the AVX2 (or baseline) code on this host */
#ifndef HOST_CLONES
#define HOST_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

typedef struct {
    int64_t B, H, Tq, Tk, E, Ev, q_blocks;
    int causal, zero_masked, mask_rank, mask_all; /* mask == NULL: mask_all 1 every key visible */
    int bthd;             /* q, k, v, o, do, dq, dk, dv stored [B,T,H,D] (ops.def) */
    float scale;
    const uint8_t *mask;
    mpt_dtype q_dt, k_dt, v_dt, o_dt, do_dt;
    const void *q, *k, *v, *o, *dO;
    const float *lse_in;
    float *kt;            /* forward: k^T of every head, [B, H, E, ldt] */
    float *vc;            /* forward of a bthd op: v of every head in f32, [B, H, Tk, Ev] */
    int64_t ldt;          /* the rows of a k^T or v^T: Tk rounded up to BK (a tile reads
                           * whole blocks), plus 16, so that they are not a multiple of
                           * 2 KiB apart, where L1's sets would hold too few of the E
                           * rows a tile reads */
    void *out_o;          /* forward: o, or NULL */
    mpt_dtype out_dt;
    float *out_lse;       /* forward: lse, or NULL */
    void *dq, *dk, *dv;   /* backward: each NULL when the kernel does not write it */
    mpt_dtype dq_dt, dk_dt, dv_dt;
    uint64_t drop_key;    /* dropout (drop_below > 0): the hash of its seed and counter */
    int64_t drop_below;
    float drop_scale;
    float **scratch;
    int threads, tasks;   /* the pool's threads, the job's tasks */
    int dot;              /* attention_amx.c's products on vdpbf16ps, not AMX tiles */
} attn_job;

static inline void load(mpt_dtype dt, const void *p, int64_t at, int64_t n, float *dst) {
    if (dt == MPT_DT_F32) memcpy(dst, (const float *)p + at, (size_t)n * sizeof *dst);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = mpt_cpu_f32_at(dt, p, at + i);
}

/* exp(x) for the softmax: x = n ln2 + r, n the nearest integer (by adding
 * and subtracting 1.5 * 2^23: floorf is not vectorized unless traps are
 * off), |r| <= ln2/2, e^r by Cephes' expf polynomial (relative error
 * about 1e-7), 2^n through the exponent bits; 0 below -87.3 (the masked
 * scores' -1e9), inf above 88.72. Plain arithmetic and selects, so loops
 * over it vectorize. */
static inline float exp_f(float x) {
    float c = x < -87.3f ? -87.3f : x > 88.3f ? 88.3f : x;
    float n = (c * 1.44269504f + 12582912.0f) - 12582912.0f;
    float r = c - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, 4);
    float y = p * two_n;
    return x < -87.3f ? 0.0f : x > 88.72f ? INFINITY : y;
}

/* the visible keys [j0, j0 + nb) of query row i, 1 or 0 each, into vis;
 * NULL when every one is (no mask array, no causal cut in the tile) */
static inline const float *visible(const attn_job *jb, int64_t b, int64_t i, int64_t j0,
                                   int64_t nb, float *vis) {
    const uint8_t *m = jb->mask ? jb->mask + (jb->mask_rank == 2 ? b * jb->Tk : (b * jb->Tq + i) * jb->Tk) + j0
                                : NULL;
    if (!m && jb->mask_all && (!jb->causal || j0 + nb - 1 <= i)) return NULL;
    int64_t last = jb->causal ? i - j0 : nb - 1; /* keys after it are masked */
    for (int64_t c = 0; c < nb; c++) vis[c] = (float)((m ? m[c] != 0 : jb->mask_all) && c <= last);
    return vis;
}

/* splitmix64, as ir/interp_impl.h's mpt_mix64: dropout draws the bits
 * random_uniform does, so the fused and unfused steps drop the same
 * probabilities */
static inline uint64_t mix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* dropout's factors of keys [j0, j0 + nb) of row i of head bh: 0 or
 * 1 / (1 - rate); NULL without dropout */
static inline const float *drop_row(const attn_job *jb, int64_t bh, int64_t i, int64_t j0,
                                    int64_t nb, float *d) {
    if (!jb->drop_below) return NULL;
    uint64_t at = (uint64_t)((bh * jb->Tq + i) * jb->Tk + j0), below = (uint64_t)jb->drop_below;
    for (int64_t c = 0; c < nb; c++)
        d[c] = mix64(jb->drop_key ^ (at + (uint64_t)c)) >> 40 < below ? 0.0f : jb->drop_scale;
    return d;
}

/* head sizes as constants where they are common, so the loops over them
 * unroll and their rows stay in registers */
#define BY_HEAD_SIZE(n, call) \
    switch (n) {              \
    case 16: call(16); break; \
    case 32: call(32); break; \
    case 64: call(64); break; \
    default: call(n); break;  \
    }

/* call(e, ev, k) with the head sizes E (q, k) and Ev (v) as the constants
 * 16, 32 or 64 (anything else: 64) and nk groups of rows as 1-4, so that
 * each combination inlines its own register-blocked code */
#define BY_GROUP_NK_(e, ev, nk, call)         \
    do {                                      \
        if ((nk) == 4) call(e, ev, 4);        \
        else if ((nk) == 3) call(e, ev, 3);   \
        else if ((nk) == 2) call(e, ev, 2);   \
        else call(e, ev, 1);                  \
    } while (0)
#define BY_GROUP_EV_(e, Ev, nk, call)                    \
    do {                                                 \
        if ((Ev) == 16) BY_GROUP_NK_(e, 16, nk, call);   \
        else if ((Ev) == 32) BY_GROUP_NK_(e, 32, nk, call); \
        else BY_GROUP_NK_(e, 64, nk, call);              \
    } while (0)
#define BY_GROUP_SHAPE(E, Ev, nk, call)                  \
    do {                                                 \
        if ((E) == 16) BY_GROUP_EV_(16, Ev, nk, call);   \
        else if ((E) == 32) BY_GROUP_EV_(32, Ev, nk, call); \
        else BY_GROUP_EV_(64, Ev, nk, call);             \
    } while (0)

/* 16 floats as one value: accumulators declared as these stay in
 * registers (GCC kept float arrays indexed in a loop in memory and
 * stored them on every pass); one AVX-512 register, two AVX2 ones */
typedef float vf16 __attribute__((vector_size(64)));

/* macros, not functions: a vector-valued function changes the ABI
 * in the clones without AVX-512 (-Wpsabi) */
#define vld(p)                          \
    __extension__({                     \
        vf16 v_;                        \
        memcpy(&v_, (p), sizeof v_);    \
        v_;                             \
    })
#define vst(p, x)                       \
    do {                                \
        vf16 x_ = (x);                  \
        memcpy((p), &x_, sizeof x_);    \
    } while (0)

/* where row t of head bh of a [B,H,T,D] value starts (a bthd op's are
 * [B,T,H,D]), and how far apart its rows are */
static inline int64_t row_at(const attn_job *jb, int64_t bh, int64_t t, int64_t T, int64_t D) {
    if (!jb->bthd) return (bh * T + t) * D;
    return ((bh / jb->H * T + t) * jb->H + bh % jb->H) * D;
}

static inline int64_t row_ld(const attn_job *jb, int64_t D) { return jb->bthd ? jb->H * D : D; }

/* row copies of D floats, in vectors of 16: a bthd head's rows are short
 * (a head size) and many, where memcpy's call would cost more than the
 * copy (GCC turns a plain copy loop into that call) */
#define copy_row(dst, src, D)                                                  \
    do {                                                                       \
        float *cd_ = (dst);                                                    \
        const float *cs_ = (src);                                              \
        int64_t ce_ = 0;                                                       \
        for (; ce_ + 16 <= (D); ce_ += 16) vst(cd_ + ce_, vld(cs_ + ce_));     \
        for (; ce_ < (D); ce_++) cd_[ce_] = cs_[ce_];                          \
    } while (0)

/* rows [t, t + n) of head bh, D wide, widened to f32 rows side by side */
static inline __attribute__((always_inline)) void
load_rows(const attn_job *jb, mpt_dtype dt, const void *p, int64_t bh, int64_t t, int64_t n,
          int64_t T, int64_t D, float *dst) {
    if (!jb->bthd) {
        load(dt, p, row_at(jb, bh, t, T, D), n * D, dst);
        return;
    }
    for (int64_t r = 0; r < n; r++) {
        int64_t at = row_at(jb, bh, t + r, T, D);
        if (dt == MPT_DT_F32) copy_row(dst + r * D, (const float *)p + at, D);
        else
            for (int64_t e = 0; e < D; e++) dst[r * D + e] = mpt_cpu_f32_at(dt, p, at + e);
    }
}

/* the f32 rows src [n, D] side by side to rows [t, t + n) of head bh */
static inline __attribute__((always_inline)) void
store_rows(const attn_job *jb, mpt_dtype dt, void *p, int64_t bh, int64_t t, int64_t n, int64_t T,
           int64_t D, const float *src) {
    if (!jb->bthd) {
        mpt_cpu_store_at(dt, p, row_at(jb, bh, t, T, D), src, n * D);
        return;
    }
    for (int64_t r = 0; r < n; r++) {
        int64_t at = row_at(jb, bh, t + r, T, D);
        if (dt == MPT_DT_F32) copy_row((float *)p + at, src + r * D, D);
        else mpt_cpu_store_at(dt, p, at, src + r * D, D);
    }
}

typedef int32_t vi16 __attribute__((vector_size(64)));
typedef uint32_t vu16 __attribute__((vector_size(64)));

/* the lanes of a where m is set, else those of b (C has no vector ?:) */
#define vsel(m, a, b) ((vf16)(((vi16)(a) & (m)) | ((vi16)(b) & ~(m))))
#define vsplat(x) ((vf16){0} + (x))
#define vmax(a, b)                  \
    __extension__({                 \
        vf16 a_ = (a), b_ = (b);    \
        vsel(b_ > a_, b_, a_);      \
    })
#define vadd(a, b) ((a) + (b))

/* op (vmax or vadd) over the lanes of each of a, b, c, d at once, by
 * halves as a tree (the order a sum over one vector's lanes by halves
 * takes): lanes 0-3 of the result hold a's, 4-7 b's, 8-11 c's, 12-15
 * d's. A quarter of the shuffles of four separate reductions, and the
 * four results land in one vector, where the four rows' statistics
 * (their maxima, their factors exp(m_old - m_new), their sums) are
 * computed together. */
#define vred4(op, a, b, c, d)                                                                     \
    __extension__({                                                                               \
        vf16 w0_ = (a), w1_ = (b), w2_ = (c), w3_ = (d);                                              \
        vf16 w4_ = op(__builtin_shufflevector(w0_, w1_, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23), \
                     __builtin_shufflevector(w0_, w1_, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31)); \
        vf16 w5_ = op(__builtin_shufflevector(w2_, w3_, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23), \
                     __builtin_shufflevector(w2_, w3_, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31)); \
        vf16 w6_ = op(__builtin_shufflevector(w4_, w5_, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27), \
                     __builtin_shufflevector(w4_, w5_, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31)); \
        w6_ = op(w6_, __builtin_shufflevector(w6_, w6_, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13)); \
        op(w6_, __builtin_shufflevector(w6_, w6_, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14)); \
    })

/* exp_f on 16 lanes of x <= 88 (a score less its row's maximum or
 * log-sum-exp): exp_f's steps, the same value in every lane x >= -87.3
 * and 0 below (exp_f clamps such x and then selects 0; here the garbage
 * of an unclamped x is what the select drops). 2^n from the bits of the
 * rounding sum t = x log2(e) + 1.5 * 2^23, whose low mantissa bits hold
 * n: shifted left 23 they are n's exponent field (the bits above wrap
 * out), without a conversion. */
#define vexp_neg(x)                                                              \
    __extension__({                                                              \
        vf16 x_ = (x);                                                           \
        vf16 t_ = x_ * 1.44269504f + 12582912.0f, n_ = t_ - 12582912.0f;         \
        vf16 r_ = x_ - n_ * 0.693359375f + n_ * 2.12194440e-4f;                  \
        vf16 p_ = vsplat(1.9875691500e-4f);                                      \
        p_ = p_ * r_ + 1.3981999507e-3f;                                         \
        p_ = p_ * r_ + 8.3334519073e-3f;                                         \
        p_ = p_ * r_ + 4.1665795894e-2f;                                         \
        p_ = p_ * r_ + 1.6666665459e-1f;                                         \
        p_ = p_ * r_ + 5.0000001201e-1f;                                         \
        p_ = p_ * r_ * r_ + r_ + 1.0f;                                           \
        vu16 e_ = ((vu16)t_ << 23) + (127u << 23);                                \
        vsel(x_ < vsplat(-87.3f), vsplat(0.0f), p_ * (vf16)e_);                  \
    })

/* m [16] (16 x 16 floats) transposed in registers: the off-diagonal
 * blocks of 8, then of 4, 2 and 1 swapped, each row a shuffle of two */
#define vtranspose16(m)                                                                  \
    do {                                                                                 \
        for (int i_ = 0; i_ < 16; i_++)                                             \
            if (!(i_ & 8)) {                                                      \
                vf16 a_ = (m)[i_], b_ = (m)[i_ + 8];                                 \
                (m)[i_] = __builtin_shufflevector(a_, b_, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);  \
                (m)[i_ + 8] = __builtin_shufflevector(a_, b_, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);  \
            }                                                                     \
        for (int i_ = 0; i_ < 16; i_++)                                             \
            if (!(i_ & 4)) {                                                      \
                vf16 a_ = (m)[i_], b_ = (m)[i_ + 4];                                 \
                (m)[i_] = __builtin_shufflevector(a_, b_, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);  \
                (m)[i_ + 4] = __builtin_shufflevector(a_, b_, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);  \
            }                                                                     \
        for (int i_ = 0; i_ < 16; i_++)                                             \
            if (!(i_ & 2)) {                                                      \
                vf16 a_ = (m)[i_], b_ = (m)[i_ + 2];                                 \
                (m)[i_] = __builtin_shufflevector(a_, b_, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);  \
                (m)[i_ + 2] = __builtin_shufflevector(a_, b_, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);  \
            }                                                                     \
        for (int i_ = 0; i_ < 16; i_++)                                             \
            if (!(i_ & 1)) {                                                      \
                vf16 a_ = (m)[i_], b_ = (m)[i_ + 1];                                 \
                (m)[i_] = __builtin_shufflevector(a_, b_, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);  \
                (m)[i_ + 1] = __builtin_shufflevector(a_, b_, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);  \
            }                                                                     \
    } while (0)

/* dst [w, ldt] (first n columns) = the rows [n, w] at element at of
 * src, lds apart, widened: 16 rows by 16 columns at a time through
 * vtranspose16, read in order and written in whole vectors; the rest one
 * by one. Inlined always: a call would reach a copy built for no ISA at
 * all. */
static inline __attribute__((always_inline)) void
transpose_in(mpt_dtype dt, const void *src, int64_t at, int64_t n, int64_t w, int64_t lds,
             float *restrict dst, int64_t ldt) {
    int64_t n16 = n / 16 * 16, w16 = w / 16 * 16;
    for (int64_t j0 = 0; j0 < n16; j0 += 16)
        for (int64_t e0 = 0; e0 < w16; e0 += 16) {
            vf16 m[16];
            for (int i = 0; i < 16; i++) {
                if (dt == MPT_DT_F32) m[i] = vld((const float *)src + at + (j0 + i) * lds + e0);
                else
                    for (int l = 0; l < 16; l++) m[i][l] = mpt_cpu_f32_at(dt, src, at + (j0 + i) * lds + e0 + l);
            }
            vtranspose16(m);
            for (int i = 0; i < 16; i++) vst(dst + (e0 + i) * ldt + j0, m[i]);
        }
    for (int64_t j = 0; j < n; j++)
        for (int64_t e = j < n16 ? w16 : 0; e < w; e++) dst[e * ldt + j] = mpt_cpu_f32_at(dt, src, at + j * lds + e);
}

/* attention.c: s [rows, BK] (first nb columns) = a [rows, K] . bt [K, ldb] */
void mpt_cpu_attn_tile_mul(int64_t rows, int64_t nb, int64_t K, const float *restrict a,
                           const float *restrict bt, int64_t ldb, float *restrict s);
/* attention.c: dst [rows, n] = dst * alpha (per row; alpha NULL: 1) + w src,
 * w a tile [rows, BK] (first nb columns), src [nb, n] */
void mpt_cpu_attn_rows_gather(int64_t rows, int64_t nb, int64_t n, const float *restrict w,
                              const float *restrict src, const float *restrict alpha,
                              float *restrict dst);
/* attention_grad.c: the backward of one (batch, head), a pool task */
void mpt_cpu_attn_bwd_task(void *ctx, int task, int thread);

/* attention_amx.c: the bf16 kernels on AMX tiles. fits: 1 when the job
 * is one they take; head_floats: the forward's per-head operands (in
 * jb->kt, written by prep_task, a task a head); scratch: the floats a
 * thread's task uses; fwd_task, bwd_task: as fwd_task and
 * mpt_cpu_attn_bwd_task */
int mpt_cpu_attn_amx_fits(const attn_job *jb, int backward);
size_t mpt_cpu_attn_amx_head_floats(const attn_job *jb);
size_t mpt_cpu_attn_amx_scratch(const attn_job *jb, int backward);
void mpt_cpu_attn_amx_prep_task(void *ctx, int task, int thread);
void mpt_cpu_attn_amx_fwd_task(void *ctx, int task, int thread);
void mpt_cpu_attn_amx_bwd_task(void *ctx, int task, int thread);

#endif
