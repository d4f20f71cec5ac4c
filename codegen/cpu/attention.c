/* codegen/cpu/attention.c — the fused attention kernels (attention with
 * its attention_lse, and attention_grad; ops.def, ir/interp_attn.c) as C
 * on the pool, run from mpt_cpu_run_opaque; the backward's tasks are in
 * attention_grad.c.
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
 * Dropout multiplies p (after the statistics) by 0 or 1 / (1 - rate),
 * drawn per position with random_uniform's hash, in both directions.
 *
 * Layouts: q [B,H,Tq,E], k [B,H,Tk,E], v [B,H,Tk,Ev], o/do [B,H,Tq,Ev]
 * (each [B,T,H,D] for a bthd op: rows read and written through row_at),
 * lse [B,H,Tq] f32, mask bool [B,Tk] or [B,Tq,Tk] (or a constant). Inputs
 * are read in f32, bf16 or f16 and widened; every sum is f32 in a fixed
 * order (independent of the threads), rounded once to each output's
 * dtype. exp is a polynomial (exp_f, attention_impl.h) so that the
 * softmax vectorizes. Masked scores are -1e9, as in the unfused graph.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/attention_impl.h"

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
void mpt_cpu_attn_tile_mul(int64_t rows, int64_t nb, int64_t K, const float *restrict a,
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

/* rows_gather_n's nr rows with n = 16 nv, the nr nv accumulators in
 * registers (rows_gather: 16 of them, 8 rows for n up to 32, 4 for 64;
 * the forward's register path: its groups of 4) */
static inline __attribute__((always_inline)) void
rows_gather_v(int64_t nb, const int nr, const int nv, const float *restrict w,
              const float *restrict src, const float *restrict alpha, float *restrict dst) {
    vf16 d[8][4];
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < nv; v++) {
            d[r][v] = vld(dst + (r * nv + v) * 16);
            if (alpha) d[r][v] *= alpha[r];
        }
    for (int64_t c = 0; c < nb; c++) {
        vf16 x[4];
        for (int v = 0; v < nv; v++) x[v] = vld(src + (c * nv + v) * 16);
        for (int r = 0; r < nr; r++) {
            float y = w[r * BK + c];
            for (int v = 0; v < nv; v++) d[r][v] += y * x[v];
        }
    }
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < nv; v++) vst(dst + (r * nv + v) * 16, d[r][v]);
}

HOST_CLONES
void mpt_cpu_attn_rows_gather(int64_t rows, int64_t nb, int64_t n, const float *restrict w,
                              const float *restrict src, const float *restrict alpha,
                              float *restrict dst) {
    if (n == 16 || n == 32 || n == 64) {
        int64_t nr = n == 64 ? 4 : 8, rs = rows / nr * nr;
        for (int64_t r = 0; r < rs; r += nr) {
            const float *al = alpha ? alpha + r : NULL;
            if (n == 16) rows_gather_v(nb, 8, 1, w + r * BK, src, al, dst + r * n);
            else if (n == 32) rows_gather_v(nb, 8, 2, w + r * BK, src, al, dst + r * n);
            else rows_gather_v(nb, 4, 4, w + r * BK, src, al, dst + r * n);
        }
        rows -= rs, w += rs * BK, dst += rs * n;
        if (alpha) alpha += rs;
    }
#define RG(k) rows_gather_n(rows, nb, k, w, src, alpha, dst)
    BY_HEAD_SIZE(n, RG)
#undef RG
}

/* k^T of one (batch, head), [E, Tk], for the forward's tasks: each query
 * block reads it, so it is transposed (and widened) once per head, not
 * once per query block. A bthd op's v likewise, its rows side by side
 * (read in place, rows H Ev apart fell into few of L1's sets). */
HOST_CLONES
static void kt_task(void *ctx, int task, int thread) {
    (void)thread;
    const attn_job *jb = ctx;
    int64_t E = jb->E, Tk = jb->Tk, bh = task, pad = (Tk + BK - 1) / BK * BK;
    float *kt = jb->kt + bh * E * jb->ldt;
    transpose_in(jb->k_dt, jb->k, row_at(jb, bh, 0, Tk, E), Tk, E, row_ld(jb, E), kt, jb->ldt);
    if (jb->vc) load_rows(jb, jb->v_dt, jb->v, bh, 0, Tk, Tk, jb->Ev, jb->vc + bh * Tk * jb->Ev);
    /* the last block's keys past Tk are zeros: fwd_rows reads whole tiles */
    for (int64_t e = 0; e < E; e++) memset(kt + e * jb->ldt + Tk, 0, (size_t)(pad - Tk) * sizeof *kt);
}

/* ---- the forward on registers: head sizes 16, 32 or 64, causal or no
 * mask, no dropout (gpt_tiny's attention) ---- */

/* One group of four query rows against the key block at kt (its first
 * 16 nk keys; the group sees no key past them): the scores in 4 nk
 * accumulators over the whole sum of E products, each load of a k^T row
 * feeding four rows; keys at or past a row's lim (lim[rr] <  16 nk:
 * the causal cut or Tk) set to -1e9 by comparing lane indices; the
 * online softmax of the four rows with their statistics in one vector
 * each (vred4's layout: m4, l4, row rr in lanes 4 rr .. 4 rr + 3); p
 * stored to s [4, BK]; then acc [4, 16 nv] = acc alpha + p v over the
 * first cols keys, v [cols, 16 nv]. The P.V sums run in ns interleaved
 * sets of keys (key c into set c % ns, added in order at the end) so
 * that 16 accumulators are in flight whatever Ev is: a fixed order. */
static inline __attribute__((always_inline)) void
fwd_group(const int64_t E, const int nv, const int nk, const float *restrict q,
          const float *restrict kt, int64_t ldt, const int64_t *lim, int masked,
          const float *restrict vt, int64_t cols, float *restrict s, float *restrict acc,
          vf16 *m4, vf16 *l4) {
    const vi16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    vf16 c[4][4], mv[4], sum[4];
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < nk; v++) c[r][v] = (vf16){0};
    for (int64_t e = 0; e < E; e++) {
        vf16 b[4];
        for (int v = 0; v < nk; v++) b[v] = vld(kt + e * ldt + 16 * v);
        for (int r = 0; r < 4; r++) {
            float x = q[r * E + e];
            for (int v = 0; v < nk; v++) c[r][v] += x * b[v];
        }
    }
    for (int r = 0; r < 4; r++) {
        if (masked)
            for (int v = 0; v < nk; v++)
                c[r][v] = vsel(iota + 16 * v < (vi16){0} + (int32_t)lim[r], c[r][v], vsplat(MASKED_SCORE));
        mv[r] = c[r][0];
        for (int v = 1; v < nk; v++) mv[r] = vmax(mv[r], c[r][v]);
    }
    vf16 mo = *m4, mn = vmax(vred4(vmax, mv[0], mv[1], mv[2], mv[3]), mo);
    vf16 alpha = vexp_neg(mo - mn); /* 0 while m_old is -inf */
    *m4 = mn;
    for (int r = 0; r < 4; r++) {
        vf16 mx = vsplat(mn[4 * r]);
        sum[r] = (vf16){0};
        for (int v = 0; v < nk; v++) {
            vf16 p = vexp_neg(c[r][v] - mx);
            sum[r] += p;
            vst(s + r * BK + 16 * v, p);
        }
    }
    *l4 = *l4 * alpha + vred4(vadd, sum[0], sum[1], sum[2], sum[3]);
    const int ns = 4 / nv; /* 4, 2, 1 sets for Ev 16, 32, 64 */
    vf16 d[4][4][4];
    for (int k = 0; k < ns; k++)
        for (int r = 0; r < 4; r++)
            for (int v = 0; v < nv; v++)
                d[k][r][v] = k ? (vf16){0} : vld(acc + (r * nv + v) * 16) * alpha[4 * r];
    int64_t c0 = 0;
    for (; c0 + ns <= cols; c0 += ns)
        for (int k = 0; k < ns; k++) {
            vf16 x[4];
            for (int v = 0; v < nv; v++) x[v] = vld(vt + ((c0 + k) * nv + v) * 16);
            for (int r = 0; r < 4; r++) {
                float y = s[r * BK + c0 + k];
                for (int v = 0; v < nv; v++) d[k][r][v] += y * x[v];
            }
        }
    for (; c0 < cols; c0++) {
        vf16 x[4];
        for (int v = 0; v < nv; v++) x[v] = vld(vt + (c0 * nv + v) * 16);
        for (int r = 0; r < 4; r++) {
            float y = s[r * BK + c0];
            for (int v = 0; v < nv; v++) d[0][r][v] += y * x[v];
        }
    }
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < nv; v++) {
            vf16 t = d[0][r][v];
            if (ns == 2) t += d[1][r][v];
            if (ns == 4) t = (t + d[1][r][v]) + (d[2][r][v] + d[3][r][v]);
            vst(acc + (r * nv + v) * 16, t);
        }
}

/* fwd_group with its sizes constants, a call of its own: inlined into
 * the loops over key blocks and groups, GCC hoisted the softmax's
 * constants out of them, and the registers those held were missing in
 * the products, which then reloaded their operands and spilled */
HOST_CLONES __attribute__((noinline))
static void fwd_group_at(int64_t E, int64_t Ev, int nk, const float *q, const float *kt,
                         int64_t ldt, const int64_t *lim, int masked, const float *vt, int64_t cols,
                         float *s, float *acc, vf16 *m4, vf16 *l4) {
#define FG(e, ev, k) fwd_group(e, (ev) / 16, k, q, kt, ldt, lim, masked, vt, cols, s, acc, m4, l4)
    BY_GROUP_SHAPE(E, Ev, nk, FG);
#undef FG
}

/* The query rows [i0, i0 + rows) of head bh, four at a time (fwd_group),
 * over the key blocks their last row sees; a group reads only the
 * vectors of 16 keys its last row sees. q and acc have rows rounded up
 * to 4, the extra q rows 0; m and l likewise. Ev is 16, 32 or 64. */
HOST_CLONES
static void fwd_rows(const attn_job *jb, int64_t bh, int64_t i0, int64_t rows,
                     const float *restrict q, float *restrict s, float *restrict vb,
                     float *restrict acc, float *restrict m, float *restrict l) {
    int64_t E = jb->E, Tk = jb->Tk, Ev = jb->Ev, ldt = jb->ldt, groups = (rows + 3) / 4;
    const float *kt = jb->kt + bh * E * ldt;
    int64_t jend = jb->causal && i0 + rows < Tk ? i0 + rows : Tk;
    vf16 m4[BQ / 4], l4[BQ / 4];
    for (int64_t g = 0; g < groups; g++) m4[g] = vsplat(-INFINITY), l4[g] = (vf16){0};
    for (int64_t j0 = 0; j0 < jend; j0 += BK) {
        int64_t nb = j0 + BK < jend ? BK : jend - j0;
        /* rows side by side: a bthd op's v in vc, else in place or widened */
        const float *vt = (const float *)jb->v + row_at(jb, bh, j0, Tk, Ev);
        if (jb->vc) {
            vt = jb->vc + (bh * Tk + j0) * Ev;
        } else if (jb->v_dt != MPT_DT_F32) {
            load_rows(jb, jb->v_dt, jb->v, bh, j0, nb, Tk, Ev, vb);
            vt = vb;
        }
        for (int64_t g = 0; g < groups; g++) {
            int64_t lim[4], i = i0 + 4 * g;
            for (int r = 0; r < 4; r++) {
                int64_t x = (jb->causal && i + r + 1 < Tk ? i + r + 1 : Tk) - j0;
                lim[r] = x < BK ? x : BK;
            }
            int nk = (int)((lim[3] + 15) / 16); /* lim[3] >= 1: j0 <= i0, or Tk > j0 */
            int masked = lim[0] < 16 * nk;
            int64_t cols = lim[3] < nb ? lim[3] : nb;
            fwd_group_at(E, Ev, nk, q + 4 * g * E, kt + j0, ldt, lim, masked, vt, cols, s,
                         acc + 4 * g * Ev, &m4[g], &l4[g]);
        }
    }
    for (int64_t g = 0; g < groups; g++)
        for (int r = 0; r < 4; r++) {
            m[4 * g + r] = m4[g][4 * r];
            l[4 * g + r] = l4[g][4 * r];
        }
}

static int is_register_size(int64_t n) { return n == 16 || n == 32 || n == 64; }

/* the query rows [i0, i0 + rows) of head bh under any mask and dropout,
 * one tile of BQ rows and BK keys at a time (tile_mul, online_row per
 * row, rows_gather) */
static void fwd_tiles(const attn_job *jb, int64_t bh, int64_t i0, int64_t rows, const float *q,
                      float *s, float *vb, float *acc, float *vis, float *dr, float *m, float *l) {
    int64_t E = jb->E, Ev = jb->Ev, Tk = jb->Tk, b = bh / jb->H;
    const float *kt = jb->kt + bh * E * jb->ldt;
    float alpha[BQ];
    int64_t jend = jb->causal && i0 + rows < Tk ? i0 + rows : Tk;
    for (int64_t j0 = 0; j0 < jend; j0 += BK) {
        int64_t nb = j0 + BK < jend ? BK : jend - j0;
        mpt_cpu_attn_tile_mul(rows, nb, E, q, kt + j0, jb->ldt, s);
        for (int64_t r = 0; r < rows; r++)
            m[r] = online_row(s + r * BK, visible(jb, b, i0 + r, j0, nb, vis),
                              jb->v ? drop_row(jb, bh, i0 + r, j0, nb, dr) : NULL, nb, m[r], &l[r],
                              &alpha[r], jb->zero_masked);
        if (!jb->v) continue;
        const float *vt = jb->vc ? jb->vc + (bh * Tk + j0) * Ev : (const float *)jb->v + row_at(jb, bh, j0, Tk, Ev);
        if (!jb->vc && jb->v_dt != MPT_DT_F32) {
            load_rows(jb, jb->v_dt, jb->v, bh, j0, nb, Tk, Ev, vb);
            vt = vb;
        }
        mpt_cpu_attn_rows_gather(rows, nb, Ev, s, vt, alpha, acc);
    }
}

HOST_CLONES
static void fwd_task(void *ctx, int task, int thread) {
    const attn_job *jb = ctx;
    int64_t E = jb->E, Ev = jb->Ev, bh = task / jb->q_blocks;
    int64_t i0 = task % jb->q_blocks * BQ, rows = i0 + BQ < jb->Tq ? BQ : jb->Tq - i0;
    int64_t rows4 = (rows + 3) / 4 * 4; /* fwd_rows' groups of four */
    float *q = jb->scratch[thread], *vb = q + BQ * E, *s = vb + BK * Ev, *acc = s + BQ * BK,
          *vis = acc + BQ * Ev, *dr = vis + BK;
    float m[BQ], l[BQ];
    load_rows(jb, jb->q_dt, jb->q, bh, i0, rows, jb->Tq, E, q);
    for (int64_t x = 0; x < rows * E; x++) q[x] *= jb->scale;
    memset(q + rows * E, 0, (size_t)((rows4 - rows) * E) * sizeof *q);
    for (int64_t r = 0; r < rows4; r++) m[r] = -INFINITY, l[r] = 0;
    memset(acc, 0, (size_t)(rows4 * Ev) * sizeof *acc);
    if (jb->v && !jb->mask && jb->mask_all && !jb->drop_below && is_register_size(E) &&
        is_register_size(Ev))
        fwd_rows(jb, bh, i0, rows, q, s, vb, acc, m, l);
    else
        fwd_tiles(jb, bh, i0, rows, q, s, vb, acc, vis, dr, m, l);
    for (int64_t r = 0; r < rows; r++) {
        /* a row that saw no key (Tk = 0) keeps l = 0: o is 0 and lse -inf */
        float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
        for (int64_t e = 0; e < Ev; e++) acc[r * Ev + e] *= inv;
        if (jb->out_lse) jb->out_lse[bh * jb->Tq + i0 + r] = m[r] + logf(l[r]);
    }
    if (jb->out_o) store_rows(jb, jb->out_dt, jb->out_o, bh, i0, rows, jb->Tq, Ev, acc);
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

int mpt_cpu_attention_amx_takes(const mpt_graph *g, const mpt_kernel *K) {
    int fwd = -1, any = -1;
    for (int i = 0; i < K->n_nodes; i++) {
        mpt_op op = g->nodes[K->nodes[i]].op;
        if (op == MPT_OP_ATTENTION) fwd = K->nodes[i];
        else if (op == MPT_OP_ATTENTION_LSE || op == MPT_OP_ATTENTION_GRAD) any = K->nodes[i];
    }
    if (fwd < 0 && any < 0) return 0;
    const mpt_node *nd = &g->nodes[fwd >= 0 ? fwd : any];
    if (nd->op == MPT_OP_ATTENTION_LSE) return 0; /* the statistics alone: no v */
    int backward = nd->op == MPT_OP_ATTENTION_GRAD;
    const mpt_node *nq = &g->nodes[nd->in[0]], *nv = &g->nodes[nd->in[2]];
    const mpt_node *nm = &g->nodes[nd->in[backward ? 6 : 3]];
    static const uint8_t present; /* fits() asks whether a mask array and v exist */
    attn_job jb = {.E = nq->shape.dim[3], .Ev = nv->shape.dim[3], .q_dt = nq->dtype,
                   .k_dt = g->nodes[nd->in[1]].dtype, .v_dt = nv->dtype, .v = &present,
                   .mask = nm->op != MPT_OP_CONST ? &present : NULL, .mask_all = nm->attr.f != 0,
                   .drop_below = nd->attr.i[4] > 0 ? nd->attr.i[4] : 0,
                   .causal = (int)nd->attr.i[backward ? 1 : 0],
                   .zero_masked = (int)nd->attr.i[backward ? 2 : 1],
                   .do_dt = backward ? g->nodes[nd->in[4]].dtype : MPT_DT_F32};
    return mpt_cpu_attn_amx_fits(&jb, backward);
}

int mpt_cpu_run_attention(const mpt_graph *g, const mpt_kernel *K,
                          void *(*data)(const void *ctx, int node), const void *ctx, int amx,
                          mpt_pool *pool, char *err, size_t n) {
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
    int bthd = (int)nd->attr.i[nd->op == MPT_OP_ATTENTION_LSE ? 1 : 6];
    attn_job jb = {.B = nq->shape.dim[0], .H = nq->shape.dim[bthd ? 2 : 1], .Tq = nq->shape.dim[bthd ? 1 : 2],
                   .Tk = nk->shape.dim[bthd ? 1 : 2], .E = nq->shape.dim[3], .bthd = bthd,
                   .scale = (float)nd->attr.f,
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
    jb.ldt = (jb.Tk + BK - 1) / BK * BK + 16;
    int64_t bh = jb.B * jb.H, tasks = backward ? bh : bh * jb.q_blocks;
    if (tasks == 0) return 0;
    if (tasks > INT32_MAX) {
        snprintf(err, n, "kernel %s: %lld attention tasks are too many", K->name, (long long)tasks);
        return -1;
    }
    int64_t E = jb.E, Ev = jb.Ev, Tq = jb.Tq, Tk = jb.Tk;
    /* amx 2: attention_amx.c's loops with their products on vdpbf16ps */
    jb.dot = amx == 2;
    amx = amx && mpt_cpu_attn_amx_fits(&jb, backward);
    size_t per = amx ? mpt_cpu_attn_amx_scratch(&jb, backward) : backward ? (size_t)(Tq * E + Tk * E + E * jb.ldt + Ev * jb.ldt + Tq * Ev + Tq + Tq * E +
                                     Tk * E + Tk * Ev + 3 * BQ * BK + 2 * BK)
                          : (size_t)(BQ * E + BK * Ev + BQ * BK + BQ * Ev + 2 * BK);
    jb.threads = mpt_pool_threads(pool);
    jb.tasks = (int)tasks;
    if (!(jb.scratch = scratch_get(jb.threads, per))) {
        snprintf(err, n, "kernel %s: out of memory for attention scratch", K->name);
        return -1;
    }
    if (amx) {
        if (!backward && !(jb.kt = kt_get((size_t)bh * mpt_cpu_attn_amx_head_floats(&jb)))) {
            snprintf(err, n, "kernel %s: out of memory for attention scratch", K->name);
            return -1;
        }
        if (!backward) mpt_pool_run(pool, (int)bh, mpt_cpu_attn_amx_prep_task, &jb);
        mpt_pool_run(pool, (int)tasks, backward ? mpt_cpu_attn_amx_bwd_task : mpt_cpu_attn_amx_fwd_task, &jb);
        return 0;
    }
    if (!backward) {
        size_t vc = jb.bthd && jb.v ? (size_t)(bh * Tk * Ev) : 0;
        if (!(jb.kt = kt_get((size_t)(bh * E * jb.ldt) + vc))) {
            snprintf(err, n, "kernel %s: out of memory for attention scratch", K->name);
            return -1;
        }
        if (vc) jb.vc = jb.kt + bh * E * jb.ldt;
        mpt_pool_run(pool, (int)bh, kt_task, &jb);
    }
    mpt_pool_run(pool, (int)tasks, backward ? mpt_cpu_attn_bwd_task : fwd_task, &jb);
    return 0;
}
