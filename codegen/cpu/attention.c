/* codegen/cpu/attention.c — the fused attention kernels (attention with
 * its attention_lse, and attention_grad; ops.def, ir/interp_attn.c) as C
 * on the pool, run from mpt_cpu_run_opaque.
 *
 * Forward, FlashAttention's: a task is a block of BQ query rows of one
 * (batch, head). It walks the key blocks of BK keys (with a causal mask
 * only those at or before its last row), computes the [BQ, BK] tile of
 * scores, and keeps per row the running maximum m, the running sum l of
 * exp(s - m) and the running output acc = sum_j exp(s_j - m) v_j,
 * rescaled by exp(m_old - m_new) whenever the maximum grows. At the end
 * o = acc / l and lse = m + log(l). The T x T scores never exist: a tile
 * and a row block's statistics are all the scratch.
 *
 * Backward, FlashAttention-2's: a task is one (batch, head). For every
 * key block and every query block that sees it, the tile of scores is
 * recomputed and p = exp(s - lse) read off the saved statistics; then
 *   dv_j += p'_ij do_i,  dp_ij = do_i.v_j,  ds_ij = p_ij (dp_ij - D_i),
 *   dq_i += scale ds_ij k_j,  dk_j += scale ds_ij q_i,  D_i = do_i.o_i,
 * into f32 accumulators for the whole head, written once at the end.
 *
 * Dropout multiplies p (after the statistics) by 0 or 1 / (1 - rate),
 * drawn per position with random_uniform's hash, in both directions.
 *
 * Layouts: q [B,H,Tq,E], k [B,H,Tk,E], v [B,H,Tk,Ev], o/do [B,H,Tq,Ev],
 * lse [B,H,Tq] f32, mask bool [B,Tk] or [B,Tq,Tk] (or a constant). Inputs
 * are read in f32, bf16 or f16 and widened; every sum is f32 in a fixed
 * order (independent of the threads), rounded once to each output's
 * dtype. exp is a polynomial (exp_f below) so that the softmax
 * vectorizes. Masked scores are -1e9, as in the unfused graph.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/emit.h"

/* a tile of scores is BQ x BK floats (8 KiB), the Q block and the K, V
 * blocks a few KiB for head sizes up to 64: all in L1 */
enum { BQ = 32, BK = 64 };
enum { MAX_LOCAL = 64 }; /* head sizes up to this are summed in a local row */
#define MASKED_SCORE (-1e9f)

#define HOST_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

typedef struct {
    int64_t B, H, Tq, Tk, E, Ev, q_blocks;
    int causal, zero_masked, mask_rank, mask_all; /* mask == NULL: mask_all 1 every key visible */
    float scale;
    const uint8_t *mask;
    mpt_dtype q_dt, k_dt, v_dt, o_dt, do_dt;
    const void *q, *k, *v, *o, *dO;
    const float *lse_in;
    float *kt;            /* forward: k^T of every head, [B, H, E, ldt] */
    int64_t ldt;          /* the rows of a k^T or v^T: Tk rounded up to 16, plus 16, so
                           * that they are not a multiple of 2 KiB apart, where L1's sets
                           * would hold too few of the E rows a tile reads */
    void *out_o;          /* forward: o, or NULL */
    mpt_dtype out_dt;
    float *out_lse;       /* forward: lse, or NULL */
    void *dq, *dk, *dv;   /* backward: each NULL when the kernel does not write it */
    mpt_dtype dq_dt, dk_dt, dv_dt;
    uint64_t drop_key;    /* dropout (drop_below > 0): the hash of its seed and counter */
    int64_t drop_below;
    float drop_scale;
    float **scratch;
} attn_job;

static inline float f32_at(mpt_dtype dt, const void *p, int64_t i) {
    if (dt == MPT_DT_F32) return ((const float *)p)[i];
    if (dt == MPT_DT_BF16) {
        uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    return mpt_f16_to_f32(((const uint16_t *)p)[i]);
}

static void load(mpt_dtype dt, const void *p, int64_t at, int64_t n, float *dst) {
    if (dt == MPT_DT_F32) memcpy(dst, (const float *)p + at, (size_t)n * sizeof *dst);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = f32_at(dt, p, at + i);
}

static void store(mpt_dtype dt, void *out, int64_t at, const float *v, int64_t n) {
    if (dt == MPT_DT_F32) memcpy((float *)out + at, v, (size_t)n * sizeof *v);
    else if (dt == MPT_DT_BF16)
        for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[at + i] = mpt_cpu_bf16_of(v[i]);
    else
        for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[at + i] = mpt_f32_to_f16(v[i]);
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
static const float *visible(const attn_job *jb, int64_t b, int64_t i, int64_t j0, int64_t nb,
                            float *vis) {
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
static const float *drop_row(const attn_job *jb, int64_t bh, int64_t i, int64_t j0, int64_t nb,
                             float *d) {
    if (!jb->drop_below) return NULL;
    uint64_t at = (uint64_t)((bh * jb->Tq + i) * jb->Tk + j0), below = (uint64_t)jb->drop_below;
    for (int64_t c = 0; c < nb; c++)
        d[c] = mix64(jb->drop_key ^ (at + (uint64_t)c)) >> 40 < below ? 0.0f : jb->drop_scale;
    return d;
}

/* s [rows, BK] (first nb columns) = a [rows, K] . bt [K, ldb] (columns
 * from 0), four rows per pass so each load of bt feeds four rows */
static inline __attribute__((always_inline)) void
tile_mul_k(int64_t rows, const int64_t nb, const int64_t K, const float *restrict a,
           const float *restrict bt, int64_t ldb, float *restrict s) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        float *restrict s0 = s + r * BK, *restrict s1 = s0 + BK, *restrict s2 = s1 + BK,
                        *restrict s3 = s2 + BK;
        for (int64_t c = 0; c < nb; c++) s0[c] = s1[c] = s2[c] = s3[c] = 0;
        for (int64_t e = 0; e < K; e++) {
            float a0 = a[r * K + e], a1 = a[(r + 1) * K + e], a2 = a[(r + 2) * K + e],
                  a3 = a[(r + 3) * K + e];
            const float *restrict br = bt + e * ldb;
            for (int64_t c = 0; c < nb; c++) {
                s0[c] += a0 * br[c];
                s1[c] += a1 * br[c];
                s2[c] += a2 * br[c];
                s3[c] += a3 * br[c];
            }
        }
    }
    for (; r < rows; r++) {
        float *restrict s0 = s + r * BK;
        for (int64_t c = 0; c < nb; c++) s0[c] = 0;
        for (int64_t e = 0; e < K; e++) {
            float a0 = a[r * K + e];
            const float *restrict br = bt + e * ldb;
            for (int64_t c = 0; c < nb; c++) s0[c] += a0 * br[c];
        }
    }
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

/* tile_mul_k for four rows of a full tile (BK = 64 columns, four vf16 a
 * row): the 16 accumulators live in registers over the whole sum, each
 * load of a bt row feeds four rows; the same sums in the same order */
static inline __attribute__((always_inline)) void
tile_mul4_v(const int64_t K, const float *restrict a, const float *restrict bt, int64_t ldb,
            float *restrict s) {
    vf16 c[4][BK / 16];
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < BK / 16; v++) c[r][v] = (vf16){0};
    for (int64_t e = 0; e < K; e++) {
        vf16 b[BK / 16];
        for (int v = 0; v < BK / 16; v++) b[v] = vld(bt + e * ldb + 16 * v);
        for (int r = 0; r < 4; r++) {
            float x = a[r * K + e];
            for (int v = 0; v < BK / 16; v++) c[r][v] += x * b[v];
        }
    }
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < BK / 16; v++) vst(s + r * BK + 16 * v, c[r][v]);
}

/* a full tile (nb = BK) with its width a constant: four rows of BK
 * accumulators stay in registers over the whole sum */
HOST_CLONES
static void tile_mul(int64_t rows, int64_t nb, int64_t K, const float *restrict a,
                     const float *restrict bt, int64_t ldb, float *restrict s) {
#define TM_FULL(k)                                                            \
    do {                                                                      \
        int64_t r4 = rows / 4 * 4;                                            \
        for (int64_t r = 0; r < r4; r += 4) tile_mul4_v(k, a + r * (k), bt, ldb, s + r * BK); \
        tile_mul_k(rows - r4, BK, k, a + r4 * (k), bt, ldb, s + r4 * BK);     \
    } while (0)
#define TM(k) tile_mul_k(rows, nb, k, a, bt, ldb, s)
    if (nb == BK) {
        BY_HEAD_SIZE(K, TM_FULL)
    } else {
        BY_HEAD_SIZE(K, TM)
    }
#undef TM
#undef TM_FULL
}

/* The maximum and the sum of n floats in 16 lanes, then across them: a
 * fixed order, and loops the compiler vectorizes (GCC 12 kept a loop with
 * an OpenMP simd reduction scalar, for the memset of its private copy). */
static inline __attribute__((always_inline)) float lanes_max(const float *restrict x, int64_t n,
                                                             float init) {
    float lane[16];
    for (int l = 0; l < 16; l++) lane[l] = init;
    int64_t c = 0;
    for (; c + 16 <= n; c += 16)
        for (int l = 0; l < 16; l++) lane[l] = x[c + l] > lane[l] ? x[c + l] : lane[l];
    float m = init;
    for (; c < n; c++) m = x[c] > m ? x[c] : m;
    for (int l = 0; l < 16; l++) m = lane[l] > m ? lane[l] : m;
    return m;
}

static inline __attribute__((always_inline)) float lanes_sum(const float *restrict x, int64_t n) {
    float lane[16];
    for (int l = 0; l < 16; l++) lane[l] = 0;
    int64_t c = 0;
    for (; c + 16 <= n; c += 16)
        for (int l = 0; l < 16; l++) lane[l] += x[c + l];
    float t = 0;
    for (; c < n; c++) t += x[c];
    for (int l = 0; l < 16; l++) t += lane[l];
    return t;
}

/* one row of the online softmax over a tile: s (nb scores; masked to
 * -1e9 here where vis says, vis NULL: all visible) becomes p (times
 * dropout's factors, drop NULL: none); returns the new maximum, updates
 * l and sets *alpha, the factor exp(m_old - m_new) of the row's acc */
HOST_CLONES
static float online_row(float *restrict s, const float *restrict vis, const float *restrict drop,
                        int64_t nb, float m, float *l, float *alpha, int zero_masked) {
    float mx = m;
    if (vis) {
#pragma omp simd
        for (int64_t c = 0; c < nb; c++) s[c] = vis[c] != 0 ? s[c] : MASKED_SCORE;
    }
    mx = lanes_max(s, nb, mx);
    *alpha = exp_f(m - mx);
    for (int64_t c = 0; c < nb; c++) s[c] = exp_f(s[c] - mx);
    *l = *l * *alpha + lanes_sum(s, nb);
    if (zero_masked && vis)
        for (int64_t c = 0; c < nb; c++) s[c] *= vis[c];
    if (drop)
        for (int64_t c = 0; c < nb; c++) s[c] *= drop[c];
    return mx;
}

/* dst [rows, n] = dst * alpha (per row; alpha NULL: 1) + w src, w a tile
 * [rows, BK] (first nb columns), src [nb, n]: row r of dst gains
 * sum_c w[r, c] src[c] with c in order. Four rows per pass, so that each
 * load of a src row feeds four rows, their n accumulators in registers
 * while c runs (for the head sizes BY_HEAD_SIZE makes constants). */
static inline __attribute__((always_inline)) void
rows_gather_n(int64_t rows, int64_t nb, const int64_t n, const float *restrict w,
              const float *restrict src, const float *restrict alpha, float *restrict dst) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        float *restrict d0 = dst + r * n, *restrict d1 = d0 + n, *restrict d2 = d1 + n,
                        *restrict d3 = d2 + n;
        const float *restrict w0 = w + r * BK;
        if (alpha) {
            float a0 = alpha[r], a1 = alpha[r + 1], a2 = alpha[r + 2], a3 = alpha[r + 3];
            for (int64_t e = 0; e < n; e++) {
                d0[e] *= a0;
                d1[e] *= a1;
                d2[e] *= a2;
                d3[e] *= a3;
            }
        }
        for (int64_t c = 0; c < nb; c++) {
            float x0 = w0[c], x1 = w0[BK + c], x2 = w0[2 * BK + c], x3 = w0[3 * BK + c];
            const float *restrict sr = src + c * n;
            for (int64_t e = 0; e < n; e++) {
                d0[e] += x0 * sr[e];
                d1[e] += x1 * sr[e];
                d2[e] += x2 * sr[e];
                d3[e] += x3 * sr[e];
            }
        }
    }
    for (; r < rows; r++) {
        float *restrict d0 = dst + r * n;
        if (alpha)
            for (int64_t e = 0; e < n; e++) d0[e] *= alpha[r];
        for (int64_t c = 0; c < nb; c++) {
            float x0 = w[r * BK + c];
            const float *restrict sr = src + c * n;
            for (int64_t e = 0; e < n; e++) d0[e] += x0 * sr[e];
        }
    }
}

/* rows_gather_n's four rows with n = 16 nv, the 4 nv accumulators in
 * registers */
static inline __attribute__((always_inline)) void
rows_gather4_v(int64_t nb, const int nv, const float *restrict w, const float *restrict src,
               const float *restrict alpha, float *restrict dst) {
    vf16 d[4][4];
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < nv; v++) {
            d[r][v] = vld(dst + (r * nv + v) * 16);
            if (alpha) d[r][v] *= alpha[r];
        }
    for (int64_t c = 0; c < nb; c++) {
        vf16 x[4];
        for (int v = 0; v < nv; v++) x[v] = vld(src + (c * nv + v) * 16);
        for (int r = 0; r < 4; r++) {
            float y = w[r * BK + c];
            for (int v = 0; v < nv; v++) d[r][v] += y * x[v];
        }
    }
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < nv; v++) vst(dst + (r * nv + v) * 16, d[r][v]);
}

HOST_CLONES
static void rows_gather(int64_t rows, int64_t nb, int64_t n, const float *restrict w,
                        const float *restrict src, const float *restrict alpha,
                        float *restrict dst) {
    if (n == 16 || n == 32 || n == 64) {
        int64_t r4 = rows / 4 * 4;
        for (int64_t r = 0; r < r4; r += 4) {
            const float *al = alpha ? alpha + r : NULL;
            if (n == 16) rows_gather4_v(nb, 1, w + r * BK, src, al, dst + r * n);
            else if (n == 32) rows_gather4_v(nb, 2, w + r * BK, src, al, dst + r * n);
            else rows_gather4_v(nb, 4, w + r * BK, src, al, dst + r * n);
        }
        rows -= r4, w += r4 * BK, dst += r4 * n;
        if (alpha) alpha += r4;
    }
#define RG(k) rows_gather_n(rows, nb, k, w, src, alpha, dst)
    BY_HEAD_SIZE(n, RG)
#undef RG
}

/* k^T of one (batch, head), [E, Tk], for the forward's tasks: each query
 * block reads it, so it is transposed (and widened) once per head, not
 * once per query block */
static void kt_task(void *ctx, int task, int thread) {
    (void)thread;
    const attn_job *jb = ctx;
    int64_t E = jb->E, Tk = jb->Tk, bh = task;
    float *kt = jb->kt + bh * E * jb->ldt;
    for (int64_t j0 = 0; j0 < Tk; j0 += 16) /* 16 keys a pass: each row of kt written in runs */
        for (int64_t e = 0; e < E; e++)
            for (int64_t j = j0; j < j0 + 16 && j < Tk; j++)
                kt[e * jb->ldt + j] = f32_at(jb->k_dt, jb->k, (bh * Tk + j) * E + e);
}

static void fwd_task(void *ctx, int task, int thread) {
    const attn_job *jb = ctx;
    int64_t E = jb->E, Ev = jb->Ev, Tk = jb->Tk, bh = task / jb->q_blocks, b = bh / jb->H;
    int64_t i0 = task % jb->q_blocks * BQ, i1 = i0 + BQ < jb->Tq ? i0 + BQ : jb->Tq, rows = i1 - i0;
    float *q = jb->scratch[thread], *vb = q + BQ * E, *s = vb + BK * Ev, *acc = s + BQ * BK,
          *vis = acc + BQ * Ev, *dr = vis + BK;
    const float *kt = jb->kt + bh * E * jb->ldt;
    float m[BQ], l[BQ], alpha[BQ];
    load(jb->q_dt, jb->q, (bh * jb->Tq + i0) * E, rows * E, q);
    for (int64_t x = 0; x < rows * E; x++) q[x] *= jb->scale;
    for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0;
    memset(acc, 0, (size_t)(rows * Ev) * sizeof *acc);
    int64_t jend = jb->causal && i1 < Tk ? i1 : Tk;
    for (int64_t j0 = 0; j0 < jend; j0 += BK) {
        int64_t nb = j0 + BK < jend ? BK : jend - j0;
        tile_mul(rows, nb, E, q, kt + j0, jb->ldt, s);
        for (int64_t r = 0; r < rows; r++)
            m[r] = online_row(s + r * BK, visible(jb, b, i0 + r, j0, nb, vis),
                              jb->v ? drop_row(jb, bh, i0 + r, j0, nb, dr) : NULL, nb, m[r], &l[r],
                              &alpha[r], jb->zero_masked);
        if (!jb->v) continue;
        const float *vt = (const float *)jb->v + (bh * Tk + j0) * Ev;
        if (jb->v_dt != MPT_DT_F32) {
            load(jb->v_dt, jb->v, (bh * Tk + j0) * Ev, nb * Ev, vb);
            vt = vb;
        }
        rows_gather(rows, nb, Ev, s, vt, alpha, acc);
    }
    for (int64_t r = 0; r < rows; r++) {
        /* a row that saw no key (Tk = 0) keeps l = 0: o is 0 and lse -inf */
        float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
        for (int64_t e = 0; e < Ev; e++) acc[r * Ev + e] *= inv;
        if (jb->out_lse) jb->out_lse[bh * jb->Tq + i0 + r] = m[r] + logf(l[r]);
    }
    if (jb->out_o) store(jb->out_dt, jb->out_o, (bh * jb->Tq + i0) * Ev, acc, rows * Ev);
}

/* dst [nb, n] += w^T src: row c of dst gains sum_r w[r * BK + c] src[r]
 * with r in order (w a tile [rows, BK], src [rows, n]). Four dst rows per
 * pass, so that each load of a src row feeds four of them, their n
 * accumulators in registers while r runs. */
static inline __attribute__((always_inline)) void
col_gather_n(int64_t rows, int64_t nb, const int64_t n, const float *restrict w,
             const float *restrict src, float *restrict dst) {
    int64_t c = 0;
    for (; c + 4 <= nb; c += 4) {
        float *restrict d0 = dst + c * n, *restrict d1 = d0 + n, *restrict d2 = d1 + n,
                        *restrict d3 = d2 + n;
        for (int64_t r = 0; r < rows; r++) {
            const float *restrict wr = w + r * BK + c, *restrict sr = src + r * n;
            float x0 = wr[0], x1 = wr[1], x2 = wr[2], x3 = wr[3];
            for (int64_t e = 0; e < n; e++) {
                d0[e] += x0 * sr[e];
                d1[e] += x1 * sr[e];
                d2[e] += x2 * sr[e];
                d3[e] += x3 * sr[e];
            }
        }
    }
    for (; c < nb; c++) {
        float *restrict d0 = dst + c * n;
        for (int64_t r = 0; r < rows; r++) {
            float x0 = w[r * BK + c];
            const float *restrict sr = src + r * n;
            for (int64_t e = 0; e < n; e++) d0[e] += x0 * sr[e];
        }
    }
}

/* col_gather_n's four dst rows (keys) with n = 16 nv, the 4 nv
 * accumulators in registers */
static inline __attribute__((always_inline)) void
col_gather4_v(int64_t rows, const int nv, const float *restrict w, const float *restrict src,
              float *restrict dst) {
    vf16 d[4][4];
    for (int c = 0; c < 4; c++)
        for (int v = 0; v < nv; v++) d[c][v] = vld(dst + (c * nv + v) * 16);
    for (int64_t r = 0; r < rows; r++) {
        vf16 x[4];
        for (int v = 0; v < nv; v++) x[v] = vld(src + (r * nv + v) * 16);
        for (int c = 0; c < 4; c++) {
            float y = w[r * BK + c];
            for (int v = 0; v < nv; v++) d[c][v] += y * x[v];
        }
    }
    for (int c = 0; c < 4; c++)
        for (int v = 0; v < nv; v++) vst(dst + (c * nv + v) * 16, d[c][v]);
}

HOST_CLONES
static void col_gather(int64_t rows, int64_t nb, int64_t n, const float *restrict w,
                       const float *restrict src, float *restrict dst) {
    if (n == 16 || n == 32 || n == 64) {
        int64_t c4 = nb / 4 * 4;
        for (int64_t c = 0; c < c4; c += 4) {
            if (n == 16) col_gather4_v(rows, 1, w + c, src, dst + c * n);
            else if (n == 32) col_gather4_v(rows, 2, w + c, src, dst + c * n);
            else col_gather4_v(rows, 4, w + c, src, dst + c * n);
        }
        nb -= c4, w += c4, dst += c4 * n;
    }
#define CG(k) col_gather_n(rows, nb, k, w, src, dst)
    BY_HEAD_SIZE(n, CG)
#undef CG
}

/* p, p' (times dropout's factors d, NULL: none) and ds of one tile row
 * from the scores s and dp (in place); vis NULL: every key visible (only
 * without dropout) */
HOST_CLONES
static void grad_row(float *restrict s, float *restrict dp, float *restrict pz,
                     const float *restrict vis, const float *restrict d, int64_t nb, float lse,
                     float D, float scale, int zero_masked) {
    if (!vis && !d) {
#pragma omp simd
        for (int64_t c = 0; c < nb; c++) {
            float p = exp_f(s[c] - lse);
            pz[c] = p;
            dp[c] = p * (dp[c] - D) * scale;
        }
        return;
    }
    if (!d) {
#pragma omp simd
        for (int64_t c = 0; c < nb; c++) {
            float p = exp_f((vis[c] != 0 ? s[c] : MASKED_SCORE) - lse);
            pz[c] = zero_masked ? p * vis[c] : p;
            dp[c] = vis[c] * p * (dp[c] - D) * scale;
        }
        return;
    }
    /* dropout: vis is never NULL here (the caller fills it with ones), a
     * pointer chosen per element kept the loop scalar */
#pragma omp simd
    for (int64_t c = 0; c < nb; c++) {
        float p = exp_f((vis[c] != 0 ? s[c] : MASKED_SCORE) - lse);
        pz[c] = (zero_masked ? p * vis[c] : p) * d[c];
        dp[c] = vis[c] * p * (d[c] * dp[c] - D) * scale;
    }
}

static void bwd_task(void *ctx, int task, int thread) {
    const attn_job *jb = ctx;
    int64_t E = jb->E, Ev = jb->Ev, Tq = jb->Tq, Tk = jb->Tk, bh = task, b = bh / jb->H;
    int64_t ldt = jb->ldt;
    float *q = jb->scratch[thread], *k = q + Tq * E, *kt = k + Tk * E, *vt = kt + E * ldt,
          *dO = vt + Ev * ldt, *D = dO + Tq * Ev, *dq = D + Tq, *dk = dq + Tq * E, *dv = dk + Tk * E,
          *s = dv + Tk * Ev, *dp = s + BQ * BK, *pz = dp + BQ * BK, *vis = pz + BQ * BK,
          *dr = vis + BK;
    const float *lse = jb->lse_in + bh * Tq;
    load(jb->q_dt, jb->q, bh * Tq * E, Tq * E, q);
    load(jb->k_dt, jb->k, bh * Tk * E, Tk * E, k);
    for (int64_t j = 0; j < Tk; j++)
        for (int64_t e = 0; e < E; e++) kt[e * ldt + j] = k[j * E + e];
    for (int64_t j = 0; j < Tk; j++)
        for (int64_t e = 0; e < Ev; e++) vt[e * ldt + j] = f32_at(jb->v_dt, jb->v, (bh * Tk + j) * Ev + e);
    load(jb->do_dt, jb->dO, bh * Tq * Ev, Tq * Ev, dO);
    for (int64_t i = 0; i < Tq; i++) {
        float d = 0;
        for (int64_t e = 0; e < Ev; e++) d += dO[i * Ev + e] * f32_at(jb->o_dt, jb->o, (bh * Tq + i) * Ev + e);
        D[i] = d;
    }
    memset(dq, 0, (size_t)(Tq * E + Tk * E + Tk * Ev) * sizeof *dq);
    for (int64_t j0 = 0; j0 < Tk; j0 += BK) {
        int64_t nb = j0 + BK < Tk ? BK : Tk - j0;
        int64_t first = jb->causal ? j0 / BQ * BQ : 0;
        for (int64_t i0 = first; i0 < Tq; i0 += BQ) {
            int64_t rows = i0 + BQ < Tq ? BQ : Tq - i0;
            tile_mul(rows, nb, E, q + i0 * E, kt + j0, ldt, s);
            tile_mul(rows, nb, Ev, dO + i0 * Ev, vt + j0, ldt, dp);
            for (int64_t r = 0; r < rows; r++) {
                int64_t i = i0 + r;
                float *sr = s + r * BK, *dpr = dp + r * BK, *pr = pz + r * BK;
                for (int64_t c = 0; c < nb; c++) sr[c] *= jb->scale;
                const float *vv = visible(jb, b, i, j0, nb, vis), *dd = drop_row(jb, bh, i, j0, nb, dr);
                if (dd && !vv) {
                    for (int64_t c = 0; c < nb; c++) vis[c] = 1.0f;
                    vv = vis;
                }
                grad_row(sr, dpr, pr, vv, dd, nb, lse[i], D[i], jb->scale, jb->zero_masked);
            }
            rows_gather(rows, nb, E, dp, k + j0 * E, NULL, dq + i0 * E);
            col_gather(rows, nb, Ev, pz, dO + i0 * Ev, dv + j0 * Ev);
            col_gather(rows, nb, E, dp, q + i0 * E, dk + j0 * E);
        }
    }
    if (jb->dq) store(jb->dq_dt, jb->dq, bh * Tq * E, dq, Tq * E);
    if (jb->dk) store(jb->dk_dt, jb->dk, bh * Tk * E, dk, Tk * E);
    if (jb->dv) store(jb->dv_dt, jb->dv, bh * Tk * Ev, dv, Tk * Ev);
}

/* Per-thread scratch, kept from one run to the next as pooling's is
 * (emit_opaque.c): the backward's is a head's rows, hundreds of KiB a
 * thread, and fresh pages every step cost page faults. */
static struct {
    float **v;
    size_t per;
    int threads;
} scratch_cache;

/* the forward's k^T of every head, kept likewise */
static struct {
    float *v;
    size_t n;
} kt_cache;

void mpt_cpu_attention_release(void) {
    for (int t = 0; t < scratch_cache.threads; t++) free(scratch_cache.v[t]);
    free(scratch_cache.v);
    memset(&scratch_cache, 0, sizeof scratch_cache);
    free(kt_cache.v);
    memset(&kt_cache, 0, sizeof kt_cache);
}

static float *kt_get(size_t n) {
    if (kt_cache.v && kt_cache.n >= n) return kt_cache.v;
    free(kt_cache.v);
    kt_cache.n = n;
    if (!(kt_cache.v = malloc((n ? n : 1) * sizeof(float)))) kt_cache.n = 0;
    return kt_cache.v;
}

static float **scratch_get(int threads, size_t per) {
    if (scratch_cache.v && scratch_cache.threads >= threads && scratch_cache.per >= per)
        return scratch_cache.v;
    mpt_cpu_attention_release();
    if (!(scratch_cache.v = calloc((size_t)threads, sizeof *scratch_cache.v))) return NULL;
    scratch_cache.threads = threads;
    scratch_cache.per = per;
    for (int t = 0; t < threads; t++)
        if (!(scratch_cache.v[t] = malloc(per * sizeof(float)))) {
            mpt_cpu_attention_release();
            return NULL;
        }
    return scratch_cache.v;
}

static int is_float_dt(mpt_dtype dt) {
    return dt == MPT_DT_F32 || dt == MPT_DT_F16 || dt == MPT_DT_BF16;
}

int mpt_cpu_run_attention(const mpt_graph *g, const mpt_kernel *K,
                          void *(*data)(const void *ctx, int node), const void *ctx, mpt_pool *pool,
                          char *err, size_t n) {
    int fwd = -1, lse = -1, grad[3] = {-1, -1, -1}, any = -1;
    for (int i = 0; i < K->n_nodes; i++) {
        const mpt_node *nd = &g->nodes[K->nodes[i]];
        if (nd->op == MPT_OP_ATTENTION) fwd = K->nodes[i];
        else if (nd->op == MPT_OP_ATTENTION_LSE) lse = K->nodes[i];
        else if (nd->op == MPT_OP_ATTENTION_GRAD) grad[nd->attr.i[0]] = K->nodes[i];
        else continue;
        any = K->nodes[i];
    }
    const mpt_node *nd = &g->nodes[fwd >= 0 ? fwd : any]; /* attention_lse has no v */
    const mpt_node *nq = &g->nodes[nd->in[0]], *nk = &g->nodes[nd->in[1]];
    int backward = nd->op == MPT_OP_ATTENTION_GRAD;
    int mask_in = nd->op == MPT_OP_ATTENTION ? 3 : nd->op == MPT_OP_ATTENTION_LSE ? 2 : 6;
    const mpt_node *nm = &g->nodes[nd->in[mask_in]];
    attn_job jb = {.B = nq->shape.dim[0], .H = nq->shape.dim[1], .Tq = nq->shape.dim[2],
                   .Tk = nk->shape.dim[2], .E = nq->shape.dim[3], .scale = (float)nd->attr.f,
                   .q_dt = nq->dtype, .k_dt = nk->dtype, .q = data(ctx, nd->in[0]),
                   .k = data(ctx, nd->in[1]), .mask_rank = nm->shape.rank,
                   .mask = data(ctx, nd->in[mask_in]), .mask_all = nm->attr.f != 0};
    if (nm->op != MPT_OP_CONST && !jb.mask) {
        snprintf(err, n, "kernel %s: the attention mask has no buffer", K->name);
        return -1;
    }
    if (nm->op == MPT_OP_CONST) jb.mask = NULL;
    if (!is_float_dt(jb.q_dt) || !is_float_dt(jb.k_dt)) {
        snprintf(err, n, "kernel %s: attention reads f32, f16 or bf16", K->name);
        return -1;
    }
    if (nd->op != MPT_OP_ATTENTION_LSE) {
        const mpt_node *nv = &g->nodes[nd->in[2]];
        jb.Ev = nv->shape.dim[3];
        jb.v_dt = nv->dtype;
        jb.v = data(ctx, nd->in[2]);
    }
    if (backward) {
        jb.causal = (int)nd->attr.i[1];
        jb.zero_masked = (int)nd->attr.i[2];
        jb.o_dt = g->nodes[nd->in[3]].dtype;
        jb.do_dt = g->nodes[nd->in[4]].dtype;
        jb.o = data(ctx, nd->in[3]);
        jb.dO = data(ctx, nd->in[4]);
        jb.lse_in = data(ctx, nd->in[5]);
        void **outs[3] = {&jb.dq, &jb.dk, &jb.dv};
        mpt_dtype *dts[3] = {&jb.dq_dt, &jb.dk_dt, &jb.dv_dt};
        for (int w = 0; w < 3; w++)
            if (grad[w] >= 0) {
                *outs[w] = data(ctx, grad[w]);
                *dts[w] = g->nodes[grad[w]].dtype;
            }
    } else {
        jb.causal = (int)nd->attr.i[0];
        if (fwd >= 0) {
            jb.zero_masked = (int)g->nodes[fwd].attr.i[1];
            jb.out_o = data(ctx, fwd);
            jb.out_dt = g->nodes[fwd].dtype;
        }
        if (lse >= 0) jb.out_lse = data(ctx, lse);
    }
    const mpt_node *dn = fwd >= 0 ? &g->nodes[fwd] : backward ? nd : NULL; /* the dropout's attrs */
    if (dn && dn->attr.i[4] > 0) {
        int cin = dn->in[dn->op == MPT_OP_ATTENTION ? 4 : 7];
        const int32_t *cp = data(ctx, cin);
        int32_t counter = cp ? *cp : (int32_t)g->nodes[cin].attr.f;
        uint32_t bits = (uint32_t)dn->attr.i[5];
        jb.drop_below = dn->attr.i[4];
        jb.drop_key = mix64(mix64((uint64_t)dn->attr.i[3]) ^ (uint64_t)(uint32_t)counter);
        memcpy(&jb.drop_scale, &bits, 4);
    }
    jb.q_blocks = (jb.Tq + BQ - 1) / BQ;
    jb.ldt = (jb.Tk + 15) / 16 * 16 + 16;
    int64_t bh = jb.B * jb.H, tasks = backward ? bh : bh * jb.q_blocks;
    if (tasks == 0) return 0;
    if (tasks > INT32_MAX) {
        snprintf(err, n, "kernel %s: %lld attention tasks are too many", K->name, (long long)tasks);
        return -1;
    }
    int64_t E = jb.E, Ev = jb.Ev, Tq = jb.Tq, Tk = jb.Tk;
    size_t per = backward ? (size_t)(Tq * E + Tk * E + E * jb.ldt + Ev * jb.ldt + Tq * Ev + Tq + Tq * E +
                                     Tk * E + Tk * Ev + 3 * BQ * BK + 2 * BK)
                          : (size_t)(BQ * E + BK * Ev + BQ * BK + BQ * Ev + 2 * BK);
    if (!(jb.scratch = scratch_get(mpt_pool_threads(pool), per))) {
        snprintf(err, n, "kernel %s: out of memory for attention scratch", K->name);
        return -1;
    }
    if (!backward) {
        if (!(jb.kt = kt_get((size_t)(bh * E * jb.ldt)))) {
            snprintf(err, n, "kernel %s: out of memory for attention scratch", K->name);
            return -1;
        }
        mpt_pool_run(pool, (int)bh, kt_task, &jb);
    }
    mpt_pool_run(pool, (int)tasks, backward ? bwd_task : fwd_task, &jb);
    return 0;
}
