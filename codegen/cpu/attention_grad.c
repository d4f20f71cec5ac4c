/* codegen/cpu/attention_grad.c — the fused attention's backward
 * (attention_grad, ops.def; ir/interp_attn.c), FlashAttention-2's: a task
 * is one (batch, head). For every key block and every query block that
 * sees it, the tile of scores is recomputed and p = exp(s - lse) read off
 * the saved statistics; then
 *   dv_j += p'_ij do_i,  dp_ij = do_i.v_j,  ds_ij = p_ij (dp_ij - D_i),
 *   dq_i += scale ds_ij k_j,  dk_j += scale ds_ij q_i,  D_i = do_i.o_i,
 * into f32 accumulators for the whole head, written once at the end.
 * Dropout multiplies p by the factors the forward drew (drop_row).
 * Layouts and dtypes as in attention.c.
 */
#include "codegen/cpu/attention_impl.h"

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

/* col_gather_n's nk dst rows (keys) with n = 16 nv, the nk nv
 * accumulators in registers: 16 of them (8 keys for n up to 32, 4 for
 * 64), enough sums in flight to cover the FMA's latency, and each load of
 * a src row feeding as many keys as the registers hold */
static inline __attribute__((always_inline)) void
col_gather_v(int64_t rows, const int nk, const int nv, const float *restrict w,
             const float *restrict src, float *restrict dst) {
    vf16 d[8][4];
    for (int c = 0; c < nk; c++)
        for (int v = 0; v < nv; v++) d[c][v] = vld(dst + (c * nv + v) * 16);
    for (int64_t r = 0; r < rows; r++) {
        vf16 x[4];
        for (int v = 0; v < nv; v++) x[v] = vld(src + (r * nv + v) * 16);
        for (int c = 0; c < nk; c++) {
            float y = w[r * BK + c];
            for (int v = 0; v < nv; v++) d[c][v] += y * x[v];
        }
    }
    for (int c = 0; c < nk; c++)
        for (int v = 0; v < nv; v++) vst(dst + (c * nv + v) * 16, d[c][v]);
}

HOST_CLONES
static void col_gather(int64_t rows, int64_t nb, int64_t n, const float *restrict w,
                       const float *restrict src, float *restrict dst) {
    if (n == 16 || n == 32 || n == 64) {
        int64_t nk = n == 64 ? 4 : 8, cs = nb / nk * nk;
        for (int64_t c = 0; c < cs; c += nk) {
            if (n == 16) col_gather_v(rows, 8, 1, w + c, src, dst + c * n);
            else if (n == 32) col_gather_v(rows, 8, 2, w + c, src, dst + c * n);
            else col_gather_v(rows, 4, 4, w + c, src, dst + c * n);
        }
        nb -= cs, w += cs, dst += cs * n;
    }
#define CG(k) col_gather_n(rows, nb, k, w, src, dst)
    BY_HEAD_SIZE(n, CG)
#undef CG
}

/* p, p' (times dropout's factors d, NULL: none) and ds of one tile row
 * from the scores s and dp (in place) under a mask array or dropout (vis
 * the row's visible keys; grad_tile takes the rows without either) */
HOST_CLONES
static void grad_row(float *restrict s, float *restrict dp, float *restrict pz,
                     const float *restrict vis, const float *restrict d, int64_t nb, float lse,
                     float D, float scale, int zero_masked) {
    if (!d) {
#pragma omp simd
        for (int64_t c = 0; c < nb; c++) {
            float p = exp_f((vis[c] != 0 ? s[c] : MASKED_SCORE) - lse);
            pz[c] = zero_masked ? p * vis[c] : p;
            dp[c] = vis[c] * p * (dp[c] - D) * scale;
        }
        return;
    }
    /* dropout: vis is never NULL here (grad_rows fills it with ones), a
     * pointer chosen per element kept the loop scalar */
#pragma omp simd
    for (int64_t c = 0; c < nb; c++) {
        float p = exp_f((vis[c] != 0 ? s[c] : MASKED_SCORE) - lse);
        pz[c] = (zero_masked ? p * vis[c] : p) * d[c];
        dp[c] = vis[c] * p * (d[c] * dp[c] - D) * scale;
    }
}

/* grad_row for the rows [i0, i0 + rows) of a tile at key j0 under a mask
 * array or dropout: a row of visible() and of drop_row() each */
static void grad_rows(const attn_job *jb, int64_t bh, int64_t i0, int64_t j0, int64_t rows,
                      int64_t nb, float *s, float *dp, float *pz, float *vis, float *dr,
                      const float *lse, const float *D) {
    for (int64_t r = 0; r < rows; r++) {
        int64_t i = i0 + r;
        float *sr = s + r * BK, *dpr = dp + r * BK, *pr = pz + r * BK;
        for (int64_t c = 0; c < nb; c++) sr[c] *= jb->scale;
        const float *vv = visible(jb, bh / jb->H, i, j0, nb, vis), *dd = drop_row(jb, bh, i, j0, nb, dr);
        if (dd && !vv) {
            for (int64_t c = 0; c < nb; c++) vis[c] = 1.0f;
            vv = vis;
        }
        grad_row(sr, dpr, pr, vv, dd, nb, lse[i], D[i], jb->scale, jb->zero_masked);
    }
}

/* grad_row for every row of a tile [rows, nb] when there is no mask
 * array and no dropout, in one call: the causal cut (keys after row
 * i0 + r, cut = i0 - j0) by comparing indices instead of building a row
 * of visible(); its keys' p is 0, as exp_f of the masked score is. s is
 * read unscaled (the scale applied here). lse and D are the tile's rows. */
HOST_CLONES
static void grad_tile(int64_t rows, int64_t nb, const float *restrict s, float *restrict dp,
                      float *restrict pz, const float *restrict lse, const float *restrict D,
                      float scale, int causal, int64_t cut) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict sr = s + r * BK;
        float *restrict dpr = dp + r * BK, *restrict pr = pz + r * BK;
        int64_t lim = causal && cut + r + 1 < nb ? cut + r + 1 : nb;
        float L = lse[r], Dr = D[r];
#pragma omp simd
        for (int64_t c = 0; c < nb; c++) {
            float p = c < lim ? exp_f(sr[c] * scale - L) : 0.0f;
            pr[c] = p;
            dpr[c] = p * (dpr[c] - Dr) * scale;
        }
    }
}

/* ---- the backward on registers: head sizes 16, 32 or 64, causal or no
 * mask, no dropout (gpt_tiny's attention) ---- */

/* a [4, 16 nk] tile of products of the four rows a [4, K] with the
 * columns bt [K, ldb] in 4 nk accumulators, each load of a bt row
 * feeding four rows */
#define TILE4(K, nk, a, bt, ldb, c)                                            \
    do {                                                                       \
        for (int tr_ = 0; tr_ < 4; tr_++)                                         \
            for (int tv_ = 0; tv_ < (nk); tv_++) (c)[tr_][tv_] = (vf16){0};         \
        for (int64_t te_ = 0; te_ < (K); te_++) {                                 \
            vf16 tb_[4];                                                        \
            for (int tv_ = 0; tv_ < (nk); tv_++) tb_[tv_] = vld((bt) + te_ * (ldb) + 16 * tv_); \
            for (int tr_ = 0; tr_ < 4; tr_++) {                                   \
                float tx_ = (a)[tr_ * (K) + te_];                                 \
                for (int tv_ = 0; tv_ < (nk); tv_++) (c)[tr_][tv_] += tx_ * tb_[tv_];  \
            }                                                                  \
        }                                                                      \
    } while (0)

/* grad_tile for four rows against a key block's first 16 nk keys (the
 * rows see none past them), with the products in registers: s = q k^T
 * and p = exp(s scale - lse) to pz (0 at or past a row's lim, where
 * masked), then dp = do v^T and ds = p (dp - D) scale to dp; the
 * columns from 16 nk to BK are zeros in both */
static inline __attribute__((always_inline)) void
bwd_group(const int64_t E, const int64_t Ev, const int nk, const float *restrict q,
          const float *restrict kt, const float *restrict dO, const float *restrict vt,
          int64_t ldt, const int64_t *lim, int masked, const float *lse, const float *D,
          float scale, float *restrict pz, float *restrict dp) {
    const vi16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    vf16 c[4][4];
    TILE4(E, nk, q, kt, ldt, c);
    for (int r = 0; r < 4; r++) {
        vf16 L = vsplat(lse[r]);
        for (int v = 0; v < nk; v++) {
            vf16 p = vexp_neg(c[r][v] * scale - L);
            if (masked) p = vsel(iota + 16 * v < (vi16){0} + (int32_t)lim[r], p, vsplat(0.0f));
            vst(pz + r * BK + 16 * v, p);
        }
        for (int v = nk; v < 4; v++) vst(pz + r * BK + 16 * v, vsplat(0.0f));
    }
    TILE4(Ev, nk, dO, vt, ldt, c);
    for (int r = 0; r < 4; r++) {
        vf16 Dr = vsplat(D[r]);
        for (int v = 0; v < nk; v++)
            vst(dp + r * BK + 16 * v, vld(pz + r * BK + 16 * v) * (c[r][v] - Dr) * scale);
        for (int v = nk; v < 4; v++) vst(dp + r * BK + 16 * v, vsplat(0.0f));
    }
}

/* bwd_group with its sizes constants, a call of its own (as the
 * forward's fwd_group_at, so that its loops keep their operands in
 * registers) */
HOST_CLONES __attribute__((noinline))
static void bwd_group_at(int64_t E, int64_t Ev, int nk, const float *q, const float *kt,
                         const float *dO, const float *vt, int64_t ldt, const int64_t *lim,
                         int masked, const float *lse, const float *D, float scale, float *pz,
                         float *dp) {
#define BG(e, ev, k) bwd_group(e, ev, k, q, kt, dO, vt, ldt, lim, masked, lse, D, scale, pz, dp)
    BY_GROUP_SHAPE(E, Ev, nk, BG);
#undef BG
}

/* pz and dp of the tile [rows, nb] at (i0, j0) without a mask array or
 * dropout: whole groups of four rows on registers (bwd_group_at) when
 * the head sizes allow, the rest through tile_mul and grad_tile */
static void grad_tile_rows(const attn_job *jb, int64_t i0, int64_t j0, int64_t rows, int64_t nb,
                           const float *q, const float *kt, const float *dO, const float *vt,
                           const float *lse, const float *D, float *s, float *pz, float *dp) {
    int64_t E = jb->E, Ev = jb->Ev, Tk = jb->Tk, ldt = jb->ldt, r4 = 0;
    if ((E == 16 || E == 32 || E == 64) && (Ev == 16 || Ev == 32 || Ev == 64) && nb == BK) {
        r4 = rows / 4 * 4;
        for (int64_t r = 0; r < r4; r += 4) {
            int64_t lim[4], i = i0 + r;
            for (int k = 0; k < 4; k++) {
                int64_t x = (jb->causal && i + k + 1 < Tk ? i + k + 1 : Tk) - j0;
                lim[k] = x < BK ? x : BK;
            }
            int nk = (int)((lim[3] + 15) / 16); /* lim[3] >= 1: i0 >= j0 */
            bwd_group_at(E, Ev, nk, q + i * E, kt + j0, dO + i * Ev, vt + j0, ldt, lim, lim[0] < 16 * nk,
                         lse + i, D + i, jb->scale, pz + r * BK, dp + r * BK);
        }
    }
    if (r4 == rows) return;
    mpt_cpu_attn_tile_mul(rows - r4, nb, E, q + (i0 + r4) * E, kt + j0, ldt, s + r4 * BK);
    mpt_cpu_attn_tile_mul(rows - r4, nb, Ev, dO + (i0 + r4) * Ev, vt + j0, ldt, dp + r4 * BK);
    grad_tile(rows - r4, nb, s + r4 * BK, dp + r4 * BK, pz + r4 * BK, lse + i0 + r4, D + i0 + r4,
              jb->scale, jb->causal, i0 + r4 - j0);
}

/* head bh's T rows of D in f32, side by side: the input itself when it
 * is f32 in [B,H,T,D], else widened or gathered into buf */
static inline __attribute__((always_inline)) const float *rows_f32(const attn_job *jb, mpt_dtype dt, const void *p, int64_t bh, int64_t T,
                             int64_t D, float *buf) {
    if (dt == MPT_DT_F32 && !jb->bthd) return (const float *)p + row_at(jb, bh, 0, T, D);
    load_rows(jb, dt, p, bh, 0, T, T, D, buf);
    return buf;
}

/* k^T and v^T [E or Ev, ldt] of head bh (transpose_in), and D_i =
 * do_i.o_i in 16 lanes of partial sums over e, then across them (a fixed
 * order that vectorizes) */
HOST_CLONES
static void bwd_inputs(const attn_job *jb, int64_t bh, const float *restrict k,
                       const float *restrict dO, float *restrict kt, float *restrict vt,
                       float *restrict D) {
    int64_t E = jb->E, Ev = jb->Ev, Tq = jb->Tq, Tk = jb->Tk, ldt = jb->ldt;
    transpose_in(MPT_DT_F32, k, 0, Tk, E, E, kt, ldt);
    transpose_in(jb->v_dt, jb->v, row_at(jb, bh, 0, Tk, Ev), Tk, Ev, row_ld(jb, Ev), vt, ldt);
    for (int64_t i = 0; i < Tq; i++) {
        const float *restrict g = dO + i * Ev;
        float lane[16] = {0}, d = 0;
        int64_t e = 0, at = row_at(jb, bh, i, Tq, Ev);
        for (; e + 16 <= Ev; e += 16)
            for (int l = 0; l < 16; l++) lane[l] += g[e + l] * mpt_cpu_f32_at(jb->o_dt, jb->o, at + e + l);
        for (; e < Ev; e++) d += g[e] * mpt_cpu_f32_at(jb->o_dt, jb->o, at + e);
        for (int l = 0; l < 16; l++) d += lane[l];
        D[i] = d;
    }
}

/* part of parts of head bh's inputs towards this core's L2: the task
 * this thread most likely runs next (the pool hands tasks out in turn)
 * then finds them there instead of in memory, where reading them (for
 * k^T, v^T and D) stalled */
static void prefetch_head(const attn_job *jb, int64_t bh, int64_t part, int64_t parts) {
    int64_t Tq = jb->Tq, Tk = jb->Tk, E = jb->E, Ev = jb->Ev;
    const void *p[5] = {jb->q, jb->k, jb->v, jb->o, jb->dO};
    mpt_dtype dt[5] = {jb->q_dt, jb->k_dt, jb->v_dt, jb->o_dt, jb->do_dt};
    int64_t T[5] = {Tq, Tk, Tk, Tq, Tq}, D[5] = {E, E, Ev, Ev, Ev};
    for (int x = 0; x < 5; x++) {
        int64_t size = dt[x] == MPT_DT_F32 ? 4 : 2;
        if (jb->bthd) { /* the head's rows lie apart: each row's bytes */
            for (int64_t t = part * T[x] / parts; t < (part + 1) * T[x] / parts; t++) {
                const char *row = (const char *)p[x] + row_at(jb, bh, t, T[x], D[x]) * size;
                for (int64_t at = 0; at < D[x] * size; at += 64) __builtin_prefetch(row + at, 0, 2);
            }
            continue;
        }
        int64_t bytes = T[x] * D[x] * size;
        const char *base = (const char *)p[x] + bh * bytes;
        for (int64_t at = part * bytes / parts / 64 * 64; at < (part + 1) * bytes / parts; at += 64)
            __builtin_prefetch(base + at, 0, 2);
    }
}

HOST_CLONES
void mpt_cpu_attn_bwd_task(void *ctx, int task, int thread) {
    const attn_job *jb = ctx;
    int64_t E = jb->E, Ev = jb->Ev, Tq = jb->Tq, Tk = jb->Tk, bh = task, ldt = jb->ldt;
    float *qb = jb->scratch[thread], *kb = qb + Tq * E, *kt = kb + Tk * E, *vt = kt + E * ldt,
          *dOb = vt + Ev * ldt, *D = dOb + Tq * Ev, *dq = D + Tq, *dk = dq + Tq * E, *dv = dk + Tk * E,
          *s = dv + Tk * Ev, *dp = s + BQ * BK, *pz = dp + BQ * BK, *vis = pz + BQ * BK,
          *dr = vis + BK;
    const float *lse = jb->lse_in + bh * Tq;
    const float *q = rows_f32(jb, jb->q_dt, jb->q, bh, Tq, E, qb),
                *k = rows_f32(jb, jb->k_dt, jb->k, bh, Tk, E, kb),
                *dO = rows_f32(jb, jb->do_dt, jb->dO, bh, Tq, Ev, dOb);
    bwd_inputs(jb, bh, k, dO, kt, vt, D);
    memset(dq, 0, (size_t)(Tq * E + Tk * E + Tk * Ev) * sizeof *dq);
    int64_t next = bh + jb->threads, parts = (Tk + BK - 1) / BK;
    for (int64_t j0 = 0; j0 < Tk; j0 += BK) {
        int64_t nb = j0 + BK < Tk ? BK : Tk - j0;
        int64_t first = jb->causal ? j0 / BQ * BQ : 0;
        if (next < jb->tasks) prefetch_head(jb, next, j0 / BK, parts);
        for (int64_t i0 = first; i0 < Tq; i0 += BQ) {
            int64_t rows = i0 + BQ < Tq ? BQ : Tq - i0;
            /* keys past those the tile's last row sees have p = ds = 0 */
            int64_t cols = nb;
            if (!jb->mask && jb->mask_all && !jb->drop_below) {
                grad_tile_rows(jb, i0, j0, rows, nb, q, kt, dO, vt, lse, D, s, pz, dp);
                if (jb->causal && i0 + rows - j0 < nb) cols = i0 + rows - j0;
            } else {
                mpt_cpu_attn_tile_mul(rows, nb, E, q + i0 * E, kt + j0, ldt, s);
                mpt_cpu_attn_tile_mul(rows, nb, Ev, dO + i0 * Ev, vt + j0, ldt, dp);
                grad_rows(jb, bh, i0, j0, rows, nb, s, dp, pz, vis, dr, lse, D);
            }
            mpt_cpu_attn_rows_gather(rows, cols, E, dp, k + j0 * E, NULL, dq + i0 * E);
            col_gather(rows, cols, Ev, pz, dO + i0 * Ev, dv + j0 * Ev);
            col_gather(rows, cols, E, dp, q + i0 * E, dk + j0 * E);
        }
    }
    if (jb->dq) store_rows(jb, jb->dq_dt, jb->dq, bh, 0, Tq, Tq, E, dq);
    if (jb->dk) store_rows(jb, jb->dk_dt, jb->dk, bh, 0, Tk, Tk, E, dk);
    if (jb->dv) store_rows(jb, jb->dv_dt, jb->dv, bh, 0, Tk, Tk, Ev, dv);
}
