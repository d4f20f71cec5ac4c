/* codegen/cpu/attention_amx.c — the fused attention on AMX tiles, for
 * bf16 q, k and v on a host whose bf16 GEMMs run on AMX (the kernel's
 * amx flag: mpt_cpu_jit_has_amx). The same FlashAttention loops as
 * attention.c and attention_grad.c, with every product on tdpbf16ps:
 *
 *   forward, a task a block of BQ query rows of one (batch, head):
 *     s = q k^T (f32), the online softmax in f32 as before, p rounded to
 *     bf16, o_blk = p v on the tiles, acc = acc alpha + o_blk;
 *   backward, a task one (batch, head): per key block and query block
 *     s = q k^T, dp = do v^T, p and ds = p (dp - D) scale in f32, then
 *     dv^T += do^T p, dk^T += q^T ds (the key block's, in f32 memory
 *     across its query blocks), dq += ds k.
 *
 * The products' operands are bf16 as AMX reads them: A as rows with k
 * contiguous, B as pairs of k rows interleaved ([K/2][N][2]). Each head's
 * operands are copied into those layouts once (q, k, v, do are bf16
 * already under mixed_bfloat16: a copy, not a rounding; an f32 do is
 * rounded); p and ds are rounded to bf16 as operands of the next product,
 * as FlashAttention does on Tensor Cores (tests/cpu_check.h TOL_MMA).
 * Statistics, the softmax, D and every accumulator are f32.
 *
 * A product is a "quad": a [32, 32] f32 block in tiles 0-3, A's two row
 * halves in tiles 4-5, B's two column halves in 6-7, K in steps of 32.
 * On a host without AMX whose vdpbf16ps outruns f32 FMAs (jb->dot) the
 * same loops run with each quad on vdpbf16ps instead (quad_dot).
 *
 * Taken causal and/or under a mask array (both only with zero_masked),
 * with or without dropout, head sizes up to 256 (zeros to a multiple of
 * 32, where that adds at most half the products);
 * elsewhere attention.c's kernels. A mask array's row is read as 64 bits
 * a key block (mask_bits) and applied as attention.c applies it: -1e9 for
 * a masked key's score, the block's keys past Tk left out, ds 0 and
 * zero_masked's p 0 where masked. Dropout draws drop_row's factors 16
 * keys at a time (drop16) and applies them as attention.c and
 * attention_grad.c do: p v takes p times the factors while the softmax's
 * sum counts p; dv takes p times them, ds = p (d dp - D) scale.
 */
#include "codegen/cpu/attention_impl.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))

enum { AMX_K = 32, /* the k of one tdpbf16ps: 16 pairs */
       QS = 2 * BQ   /* the backward's query rows a step */ };

static int64_t up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* a head size as the tiles take it: zeros up to a multiple of 32, which
 * add nothing to q k^T and give columns of p v, dq, dk and dv that are
 * never stored */
static int64_t padded(int64_t d) { return up(d, AMX_K); }

int mpt_cpu_attn_amx_fits(const attn_job *jb, int backward) {
    /* a mask array with the causal cut only where masked probabilities
     * are zeroed (Keras' attention_mask): a row that sees no key then
     * gives zeros whatever its softmax's sum counted, which attention.c
     * bounds by its query block's keys and the tiles by the row's */
    if ((jb->mask && jb->causal && !jb->zero_masked) || (!jb->mask && !jb->mask_all) || !jb->v)
        return 0;
    /* head sizes padded to multiples of 32 (padded()) where that adds at
     * most half the products: 48 runs 3x the FMA kernels' speed padded to
     * 64, 16 (twice the products padded, and a register path of the FMA
     * kernels) no faster */
    if (jb->E > 256 || jb->Ev > 256 || 2 * (padded(jb->E) + padded(jb->Ev)) > 3 * (jb->E + jb->Ev))
        return 0;
    if (jb->q_dt != MPT_DT_BF16 || jb->k_dt != MPT_DT_BF16 || jb->v_dt != MPT_DT_BF16) return 0;
    return !backward || jb->do_dt == MPT_DT_BF16 || jb->do_dt == MPT_DT_F32;
}

/* the sizes below in floats (bf16 buffers rounded up to whole floats) */
static size_t halves(int64_t n) { return (size_t)(n + 1) / 2; }

size_t mpt_cpu_attn_amx_head_floats(const attn_job *jb) {
    return halves((padded(jb->E) + padded(jb->Ev)) * up(jb->Tk, BK));
}

size_t mpt_cpu_attn_amx_scratch(const attn_job *jb, int backward) {
    int64_t E = padded(jb->E), Ev = padded(jb->Ev), tqp = up(jb->Tq, BQ), tkp = up(jb->Tk, BK);
    if (!backward) { /* a task's, or prep_task's rows of k or v */
        size_t task = (size_t)(BQ * BK + 3 * BQ * Ev) + halves(BQ * E + 2 * BQ * BK);
        size_t prep = halves(tkp * (E > Ev ? E : Ev));
        return task > prep ? task : prep;
    }
    return (size_t)(tqp * E + (E + Ev) * BK + 2 * QS * BK + tqp + jb->Tk * (E + Ev)) +
           halves(2 * tqp * E + 2 * tkp * E + 2 * tqp * Ev + tkp * Ev + 3 * QS * BK +
                  (tqp > tkp ? tqp : tkp) * (E > Ev ? E : Ev));
}

/* rows [t0, t0 + n) of head bh of p ([.., T, D]) as tp bf16 rows of Dp
 * (>= D) side by side, zeros after each row's D and after the n */
AMX_TARGET static void rows_bf16(const attn_job *jb, mpt_dtype dt, const void *p, int64_t bh, int64_t T,
                                 int64_t t0, int64_t n, int64_t tp, int64_t D, int64_t Dp,
                                 uint16_t *restrict dst) {
    for (int64_t t = 0; t < tp; t++) {
        uint16_t *d = dst + t * Dp;
        if (t >= n) {
            memset(d, 0, (size_t)Dp * sizeof *d);
            continue;
        }
        int64_t at = row_at(jb, bh, t0 + t, T, D);
        if (dt == MPT_DT_BF16) memcpy(d, (const uint16_t *)p + at, (size_t)D * sizeof *d);
        else
            for (int64_t e = 0; e < D; e++) d[e] = mpt_cpu_bf16_of(mpt_cpu_f32_at(dt, p, at + e));
        if (Dp > D) memset(d + D, 0, (size_t)(Dp - D) * sizeof *d);
    }
}

/* rows [n, Dp] side by side as rows [n, D] (D <= Dp), in place */
static void unpad_rows(float *rows, int64_t n, int64_t Dp, int64_t D) {
    if (D == Dp) return;
    for (int64_t r = 0; r < n; r++) memmove(rows + r * D, rows + r * Dp, (size_t)D * sizeof *rows);
}

/* src [n, D] bf16 rows (n even, D a multiple of 32) as n/2 rows of
 * pairs [n/2][D][2]: rows 2i and 2i + 1 interleaved */
AMX_TARGET static void pair_rows(const uint16_t *restrict src, int64_t n, int64_t D, uint16_t *restrict dst) {
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                        39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t r = 0; r < n; r += 2)
        for (int64_t e = 0; e < D; e += 32) {
            __m512i a = _mm512_loadu_si512(src + r * D + e), b = _mm512_loadu_si512(src + (r + 1) * D + e);
            uint16_t *d = dst + (r / 2 * D + e) * 2;
            _mm512_storeu_si512(d, _mm512_permutex2var_epi16(a, lo, b));
            _mm512_storeu_si512(d + 32, _mm512_permutex2var_epi16(a, hi, b));
        }
}

/* dst [c, ldd] = src [r, c]^T in 32-bit words (a pair of bf16 each), r
 * and c multiples of 16 */
AMX_TARGET static void transpose32(const uint32_t *restrict src, int64_t r, int64_t c, uint32_t *restrict dst,
                                   int64_t ldd) {
    for (int64_t i0 = 0; i0 < r; i0 += 16)
        for (int64_t j0 = 0; j0 < c; j0 += 16) {
            vf16 m[16];
            for (int i = 0; i < 16; i++) m[i] = vld(src + (i0 + i) * c + j0);
            vtranspose16(m);
            for (int i = 0; i < 16; i++) vst(dst + (j0 + i) * ldd + i0, m[i]);
        }
}

/* palette 1, all eight tiles 16 rows of 64 bytes; the state is per
 * thread, so every task loads it (and releases it at its end) */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

AMX_TARGET static void tiles_on(void) {
    tile_config c __attribute__((aligned(64)));
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.colsb[t] = 64, c.rows[t] = 16;
    _tile_loadconfig(&c);
}

/* quad() on vdpbf16ps (jb->dot: a host without AMX where it outruns f32
 * FMAs): eight rows at a time, 16 accumulators, each k pair of a row one
 * 32-bit broadcast against B's two vectors of pairs; the same layouts */
AMX_TARGET static void quad_dot(float *c, int64_t ldc, int acc, const uint16_t *a, int64_t lda,
                                const uint16_t *b, int64_t ldb, int64_t K) {
    for (int64_t r0 = 0; r0 < 32; r0 += 8) {
        __m512 s[8][2];
        for (int r = 0; r < 8; r++)
            for (int h = 0; h < 2; h++)
                s[r][h] = acc ? _mm512_loadu_ps(c + (r0 + r) * ldc + 16 * h) : _mm512_setzero_ps();
        for (int64_t k = 0; k < K; k += 2) {
            const uint16_t *bk = b + k / 2 * ldb;
            __m512bh b0 = (__m512bh)_mm512_loadu_si512(bk), b1 = (__m512bh)_mm512_loadu_si512(bk + 32);
            for (int r = 0; r < 8; r++) {
                int32_t pair;
                memcpy(&pair, a + (r0 + r) * lda + k, sizeof pair);
                __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
                s[r][0] = _mm512_dpbf16_ps(s[r][0], av, b0);
                s[r][1] = _mm512_dpbf16_ps(s[r][1], av, b1);
            }
        }
        for (int r = 0; r < 8; r++)
            for (int h = 0; h < 2; h++) _mm512_storeu_ps(c + (r0 + r) * ldc + 16 * h, s[r][h]);
    }
}

/* c [32, 32] f32 (rows ldc floats apart) = (acc: c +) a b, a [32, K] bf16
 * rows lda apart, b K/2 rows of pairs ldb elements apart from its first
 * column's pair; K a multiple of 32. On AMX tiles, or (dot) vdpbf16ps. */
AMX_TARGET static inline __attribute__((always_inline)) void
quad(int dot, float *c, int64_t ldc, int acc, const uint16_t *a, int64_t lda, const uint16_t *b,
     int64_t ldb, int64_t K) {
    if (dot) {
        quad_dot(c, ldc, acc, a, lda, b, ldb, K);
        return;
    }
    if (acc) {
        _tile_loadd(0, c, ldc * 4);
        _tile_loadd(1, c + 16, ldc * 4);
        _tile_loadd(2, c + 16 * ldc, ldc * 4);
        _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t k = 0; k < K; k += AMX_K) {
        _tile_loadd(4, a + k, lda * 2);
        _tile_loadd(5, a + 16 * lda + k, lda * 2);
        _tile_loadd(6, b + k / 2 * ldb, ldb * 2);
        _tile_loadd(7, b + k / 2 * ldb + 32, ldb * 2);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, ldc * 4);
    _tile_stored(1, c + 16, ldc * 4);
    _tile_stored(2, c + 16 * ldc, ldc * 4);
    _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
}

/* 16 floats as bf16 bits (round to nearest even, NaN kept) */
AMX_TARGET static inline __m256i bf16x16(vf16 x) {
    __m512 v;
    memcpy(&v, &x, sizeof v);
    return (__m256i)_mm512_cvtneps_pbh(v);
}

/* the lanes of rows a and b as 16 pairs (a[c], b[c]): B's layout */
AMX_TARGET static inline __m512i pairs16(vf16 a, vf16 b) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                         23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512 va, vb;
    memcpy(&va, &a, sizeof va);
    memcpy(&vb, &b, sizeof vb);
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(vb, va));
}

/* the keys row i sees in the block from j0, at most BK (0 for rows past
 * Tq, which the tiles run with zeros) */
static inline int64_t seen(const attn_job *jb, int64_t i, int64_t j0, int64_t end) {
    if (i >= jb->Tq) return 0;
    int64_t x = (jb->causal && i + 1 < end ? i + 1 : end) - j0;
    return x < 0 ? 0 : x < BK ? x : BK;
}

/* a mask array's visible keys of row i in the key block at j0, a bit
 * each (no mask array: all; rows past Tq: none) */
AMX_TARGET static inline uint64_t mask_bits(const attn_job *jb, int64_t b, int64_t i, int64_t j0) {
    if (!jb->mask) return ~0ull;
    if (i >= jb->Tq) return 0;
    int64_t n = jb->Tk - j0 < BK ? jb->Tk - j0 : BK;
    const uint8_t *m = jb->mask + (jb->mask_rank == 2 ? b * jb->Tk : (b * jb->Tq + i) * jb->Tk) + j0;
    __mmask64 len = n >= 64 ? ~0ull : (1ull << n) - 1;
    __m512i x = _mm512_maskz_loadu_epi8(len, m);
    return _mm512_test_epi8_mask(x, x) & len;
}

/* splitmix64 (attention_impl.h's mix64) of 8 lanes */
AMX_TARGET static inline __m512i mix64x8(__m512i x) {
    __m512i z = _mm512_add_epi64(x, _mm512_set1_epi64((long long)0x9E3779B97F4A7C15ull));
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)),
                           _mm512_set1_epi64((long long)0xBF58476D1CE4E5B9ull));
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)),
                           _mm512_set1_epi64((long long)0x94D049BB133111EBull));
    return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}

/* dropout's factors (drop_row's, bit for bit) of the 16 keys whose
 * counters start at at: 0 or 1 / (1 - rate) */
AMX_TARGET static inline vf16 drop16(const attn_job *jb, uint64_t at) {
    const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i key = _mm512_set1_epi64((long long)jb->drop_key);
    const __m512i below = _mm512_set1_epi64((long long)jb->drop_below);
    __mmask16 dropped = 0;
    for (int h = 0; h < 2; h++) {
        __m512i c = _mm512_add_epi64(_mm512_set1_epi64((long long)(at + 8 * (uint64_t)h)), lane);
        __mmask8 d = _mm512_cmplt_epu64_mask(_mm512_srli_epi64(mix64x8(_mm512_xor_si512(key, c)), 40), below);
        dropped |= (__mmask16)((unsigned)d << (8 * h));
    }
    __m512 f = _mm512_maskz_mov_ps((__mmask16)~dropped, _mm512_set1_ps(jb->drop_scale));
    vf16 r;
    memcpy(&r, &f, sizeof r);
    return r;
}

/* the dropout counter of row i's key j of head bh (drop_row's) */
static inline uint64_t drop_at(const attn_job *jb, int64_t bh, int64_t i, int64_t j) {
    return (uint64_t)((bh * jb->Tq + i) * jb->Tk + j);
}

/* lanes 16 v .. 16 v + 15 of bits as a vector condition */
#define BITS16(bits, v) (((((vi16){0} + (int32_t)(((bits) >> (16 * (v))) & 0xffff)) >> iota) & 1) != 0)

/* ---- forward ---- */

/* head bh's k as pairs of e rows ([E/2][tkp][2]: B of q k^T) and v as
 * pairs of key rows ([tkp/2][Ev][2]: B of p v), zeros past Tk */
AMX_TARGET void mpt_cpu_attn_amx_prep_task(void *ctx, int task, int thread) {
    const attn_job *jb = ctx;
    int64_t E = padded(jb->E), Ev = padded(jb->Ev), Tk = jb->Tk, tkp = up(Tk, BK), bh = task;
    uint16_t *kv = (uint16_t *)jb->kt + bh * (E + Ev) * tkp, *vv = kv + E * tkp;
    uint16_t *rows = (uint16_t *)jb->scratch[thread];
    rows_bf16(jb, jb->k_dt, jb->k, bh, Tk, 0, Tk, tkp, jb->E, E, rows);
    transpose32((const uint32_t *)rows, tkp, E / 2, (uint32_t *)kv, tkp);
    rows_bf16(jb, jb->v_dt, jb->v, bh, Tk, 0, Tk, tkp, jb->Ev, Ev, rows);
    pair_rows(rows, tkp, Ev, vv);
}

/* the online softmax of the BQ rows' scores s [BQ, BK] of the key block
 * at j0 (scaled, masked past each row's last key): p to pb as bf16, the
 * rows' factors exp(m_old - m_new) to alpha; four rows at a time, their
 * statistics in one vector each (vred4's layout: row k in lanes
 * 4k .. 4k + 3, as attention.c's fwd_group) */
AMX_TARGET static inline __attribute__((always_inline)) void
fwd_softmax(const attn_job *jb, const float *restrict s, int64_t bh, int64_t i0, int64_t j0, int64_t jend,
            uint16_t *restrict pb, float *restrict alpha, vf16 *m4, vf16 *l4) {
    int64_t b = bh / jb->H;
    const vi16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    /* masked keys score -1e9 as in attention.c; under a mask array the
     * block's keys past Tk count for nothing (-inf), so that a row seeing
     * no key averages over the Tk keys alone */
    const vf16 past = vsplat(jb->mask ? -INFINITY : MASKED_SCORE);
    uint64_t bits[4];
    for (int64_t g = 0; g < BQ / 4; g++) {
        vf16 x[4][BK / 16], mv[4], sum[4];
        for (int k = 0; k < 4; k++) {
            int64_t r = 4 * g + k;
            vi16 lim = (vi16){0} + (int32_t)seen(jb, i0 + r, j0, jend);
            bits[k] = mask_bits(jb, b, i0 + r, j0);
            for (int v = 0; v < BK / 16; v++) {
                vf16 sv = vsel(BITS16(bits[k], v), vld(s + r * BK + 16 * v) * jb->scale, vsplat(MASKED_SCORE));
                x[k][v] = vsel(iota + 16 * v < lim, sv, i0 + r < jb->Tq ? past : vsplat(MASKED_SCORE));
                mv[k] = v ? vmax(mv[k], x[k][v]) : x[k][v];
            }
        }
        vf16 mo = m4[g], mn = vmax(vred4(vmax, mv[0], mv[1], mv[2], mv[3]), mo);
        vf16 al = vexp_neg(mo - mn); /* 0 while m_old is -inf */
        m4[g] = mn;
        for (int k = 0; k < 4; k++) {
            int64_t r = 4 * g + k;
            vf16 mx = vsplat(mn[4 * k]);
            sum[k] = (vf16){0};
            for (int v = 0; v < BK / 16; v++) {
                vf16 p = vexp_neg(x[k][v] - mx);
                sum[k] += p;
                if (jb->mask && jb->zero_masked) p = vsel(BITS16(bits[k], v), p, vsplat(0.0f));
                if (jb->drop_below && i0 + r < jb->Tq) p *= drop16(jb, drop_at(jb, bh, i0 + r, j0 + 16 * v));
                _mm256_storeu_si256((__m256i *)(pb + r * BK + 16 * v), bf16x16(p));
            }
            alpha[r] = al[4 * k];
        }
        l4[g] = l4[g] * al + vred4(vadd, sum[0], sum[1], sum[2], sum[3]);
    }
}

/* The key blocks in a pipeline of two: block b's p v runs after block
 * b + 1's scores, and block b + 1's softmax before acc takes block b's
 * p v. A tile load of what vector stores just wrote (p), or a vector
 * load of what a tile store just wrote (s, p v), waits for the stores to
 * drain; the other block's work fills that wait. */
AMX_TARGET void mpt_cpu_attn_amx_fwd_task(void *ctx, int task, int thread) {
    const attn_job *jb = ctx;
    int64_t E = padded(jb->E), Ev = padded(jb->Ev), Tk = jb->Tk, Tq = jb->Tq, tkp = up(Tk, BK),
            bh = task / jb->q_blocks;
    int64_t i0 = task % jb->q_blocks * BQ, rows = i0 + BQ < Tq ? BQ : Tq - i0;
    const uint16_t *kv = (const uint16_t *)jb->kt + bh * (E + Ev) * tkp, *vv = kv + E * tkp;
    float *s = jb->scratch[thread], *pv = s + BQ * BK, *acc = pv + BQ * Ev, *o = acc + BQ * Ev;
    uint16_t *qb = (uint16_t *)(o + BQ * Ev), *pb[2] = {qb + BQ * E, qb + BQ * E + BQ * BK};
    float m[BQ], l[BQ], alpha[2][BQ];
    vf16 m4[BQ / 4], l4[BQ / 4];
    for (int64_t g = 0; g < BQ / 4; g++) m4[g] = vsplat(-INFINITY), l4[g] = (vf16){0};
    rows_bf16(jb, jb->q_dt, jb->q, bh, Tq, i0, rows, BQ, jb->E, E, qb);
    memset(acc, 0, (size_t)(BQ * Ev) * sizeof *acc);
    int64_t jend = jb->causal && i0 + rows < Tk ? i0 + rows : Tk, blocks = (jend + BK - 1) / BK;
    if (!jb->dot) tiles_on();
    /* a block's keys in halves of 32, the second only where a row sees it */
#define KH(b) ((b) * BK + 32 < jend ? 2 : 1)
#define SCORES(b)                                                                                  \
    for (int64_t h_ = 0; h_ < KH(b); h_++)                                                        \
        quad(jb->dot, s + 32 * h_, BK, 0, qb, E, kv + ((b) * BK + 32 * h_) * 2, tkp * 2, E)
    if (blocks > 0) {
        SCORES(0);
        fwd_softmax(jb, s, bh, i0, 0, jend, pb[0], alpha[0], m4, l4);
    }
    for (int64_t b = 0; b < blocks; b++) {
        if (b + 1 < blocks) SCORES(b + 1);
        for (int64_t n0 = 0; n0 < Ev; n0 += 32)
            quad(jb->dot, pv + n0, Ev, 0, pb[b % 2], BK, vv + b * BK / 2 * Ev * 2 + n0 * 2, Ev * 2, 32 * KH(b));
        if (b + 1 < blocks)
            fwd_softmax(jb, s, bh, i0, (b + 1) * BK, jend, pb[(b + 1) % 2], alpha[(b + 1) % 2], m4, l4);
        const float *al = alpha[b % 2];
        for (int64_t r = 0; r < BQ; r++)
            for (int64_t e = 0; e < Ev; e += 16)
                vst(acc + r * Ev + e, vld(acc + r * Ev + e) * al[r] + vld(pv + r * Ev + e));
    }
#undef SCORES
#undef KH
    if (!jb->dot) _tile_release();
    for (int64_t r = 0; r < BQ; r++) m[r] = m4[r / 4][r % 4 * 4], l[r] = l4[r / 4][r % 4 * 4];
    for (int64_t r = 0; r < rows; r++) {
        float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
        for (int64_t e = 0; e < jb->Ev; e++) o[r * jb->Ev + e] = acc[r * Ev + e] * inv;
        if (jb->out_lse) jb->out_lse[bh * Tq + i0 + r] = m[r] + logf(l[r]);
    }
    if (jb->out_o) store_rows(jb, jb->out_dt, jb->out_o, bh, i0, rows, Tq, jb->Ev, o);
}

/* ---- backward ---- */

AMX_TARGET void mpt_cpu_attn_amx_bwd_task(void *ctx, int task, int thread) {
    const attn_job *jb = ctx;
    int64_t E = padded(jb->E), Ev = padded(jb->Ev), Tq = jb->Tq, Tk = jb->Tk, bh = task;
    int64_t tqp = up(Tq, BQ), tkp = up(Tk, BK);
    float *dq = jb->scratch[thread], *dkt = dq + tqp * E, *dvt = dkt + E * BK, *s = dvt + Ev * BK,
          *dp = s + QS * BK, *D = dp + QS * BK, *dk = D + tqp, *dv = dk + Tk * E;
    uint16_t *qb = (uint16_t *)(dv + Tk * Ev), *qt = qb + tqp * E, *kv = qt + E * tqp,
             *kp = kv + E * tkp, *dob = kp + tkp * E, *dot = dob + tqp * Ev, *vv = dot + Ev * tqp,
             *pp = vv + Ev * tkp, *dsp = pp + QS * BK, *dsb = dsp + QS * BK, *tmp = dsb + QS * BK;
    const float *lse = jb->lse_in + bh * Tq;
    /* the head's operands in the tiles' layouts, zeros past Tq and Tk:
     * rows (q, do), pairs of e rows (k and v, as B of q k^T and do v^T:
     * their rows transposed in pairs), pairs of key rows (k, as B of ds k)
     * and rows of e (q^T and do^T, as A of q^T ds and do^T p: the pairs
     * of their rows transposed); tmp holds rows on the way */
    rows_bf16(jb, jb->q_dt, jb->q, bh, Tq, 0, Tq, tqp, jb->E, E, qb);
    pair_rows(qb, tqp, E, tmp);
    transpose32((const uint32_t *)tmp, tqp / 2, E, (uint32_t *)qt, tqp / 2);
    rows_bf16(jb, jb->do_dt, jb->dO, bh, Tq, 0, Tq, tqp, jb->Ev, Ev, dob);
    pair_rows(dob, tqp, Ev, tmp);
    transpose32((const uint32_t *)tmp, tqp / 2, Ev, (uint32_t *)dot, tqp / 2);
    rows_bf16(jb, jb->k_dt, jb->k, bh, Tk, 0, Tk, tkp, jb->E, E, tmp);
    transpose32((const uint32_t *)tmp, tkp, E / 2, (uint32_t *)kv, tkp);
    pair_rows(tmp, tkp, E, kp);
    rows_bf16(jb, jb->v_dt, jb->v, bh, Tk, 0, Tk, tkp, jb->Ev, Ev, tmp);
    transpose32((const uint32_t *)tmp, tkp, Ev / 2, (uint32_t *)vv, tkp);
    /* D_i = do_i . o_i in f32, 16 lanes of partial sums then across */
    for (int64_t i = 0; i < tqp; i++) {
        float lane[16] = {0}, d = 0;
        int64_t at = i < Tq ? row_at(jb, bh, i, Tq, jb->Ev) : 0;
        for (int64_t e = 0; i < Tq && e < jb->Ev; e += 16)
            for (int c = 0; c < 16 && e + c < jb->Ev; c++)
                lane[c] += mpt_cpu_f32_at(jb->do_dt, jb->dO, at + e + c) * mpt_cpu_f32_at(jb->o_dt, jb->o, at + e + c);
        for (int c = 0; c < 16; c++) d += lane[c];
        D[i] = d;
    }
    memset(dq, 0, (size_t)(tqp * E) * sizeof *dq);
    const vi16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const float scale = jb->scale;
    if (!jb->dot) tiles_on();
    for (int64_t j0 = 0; j0 < Tk; j0 += BK) {
        int64_t nb = j0 + BK < Tk ? BK : Tk - j0, kk = nb > 32 ? 64 : 32;
        memset(dkt, 0, (size_t)((E + Ev) * BK) * sizeof *dkt);
        /* two query blocks a step (QS rows), so that the products into
         * dk^T and dv^T, whose [32, 32] blocks are loaded and stored
         * back around every product, take K = 64 rows at once; a step's
         * products, then the previous step's updates, then this step's
         * p and ds: a vector load of what a tile store just wrote (s,
         * dp), or a tile load of what vector stores just wrote (p, ds),
         * waits for the stores to drain, and the other step's products
         * fill that wait */
        int64_t prev = -1, prev_n = 0;
        for (int64_t i0 = jb->causal ? j0 / BQ * BQ : 0; i0 < Tq + QS; i0 += QS) {
            int64_t n = i0 >= Tq ? 0 : i0 + QS <= tqp ? QS / BQ : 1; /* blocks of BQ rows */
            for (int64_t x = 0; x < n; x++)
                for (int64_t h = 0; h < 2; h++) {
                    quad(jb->dot, s + x * BQ * BK + 32 * h, BK, 0, qb + (i0 + x * BQ) * E, E, kv + (j0 + 32 * h) * 2, tkp * 2, E);
                    quad(jb->dot, dp + x * BQ * BK + 32 * h, BK, 0, dob + (i0 + x * BQ) * Ev, Ev, vv + (j0 + 32 * h) * 2,
                         tkp * 2, Ev);
                }
            if (prev >= 0) {
                for (int64_t h = 0; h < 2; h++) {
                    for (int64_t n0 = 0; n0 < Ev; n0 += 32)
                        quad(jb->dot, dvt + n0 * BK + 32 * h, BK, 1, dot + n0 * tqp + prev, tqp, pp + 32 * h * 2, BK * 2, BQ * prev_n);
                    for (int64_t n0 = 0; n0 < E; n0 += 32)
                        quad(jb->dot, dkt + n0 * BK + 32 * h, BK, 1, qt + n0 * tqp + prev, tqp, dsp + 32 * h * 2, BK * 2, BQ * prev_n);
                }
                for (int64_t x = 0; x < prev_n; x++)
                    for (int64_t e0 = 0; e0 < E; e0 += 32)
                        quad(jb->dot, dq + (prev + x * BQ) * E + e0, E, 1, dsb + x * BQ * BK, BK, kp + j0 / 2 * E * 2 + e0 * 2,
                             E * 2, kk);
            }
            if (!n) break;
            for (int64_t r = 0; r < n * BQ; r += 2) {
                vf16 p[2][BK / 16], ds[2][BK / 16];
                for (int k = 0; k < 2; k++) {
                    int64_t i = i0 + r + k;
                    vi16 lim = (vi16){0} + (int32_t)seen(jb, i, j0, Tk);
                    uint64_t bits = mask_bits(jb, bh / jb->H, i, j0);
                    float L = i < Tq ? lse[i] : 0, Di = i < Tq ? D[i] : 0;
                    for (int v = 0; v < BK / 16; v++) {
                        /* as attention_grad.c's grad_row: a masked key's
                         * score -1e9, its ds 0, its p zero_masked's */
                        vi16 vis = BITS16(bits, v);
                        vf16 x = vsel(vis, vld(s + (r + k) * BK + 16 * v) * scale, vsplat(MASKED_SCORE)) - L;
                        vf16 pe = vsel(iota + 16 * v < lim, vexp_neg(x), vsplat(0.0f));
                        vf16 dpv = vld(dp + (r + k) * BK + 16 * v), d = vsplat(1.0f);
                        if (jb->drop_below && i < Tq) d = drop16(jb, drop_at(jb, bh, i, j0 + 16 * v));
                        ds[k][v] = vsel(vis, pe * (d * dpv - Di) * scale, vsplat(0.0f));
                        p[k][v] = (jb->zero_masked ? vsel(vis, pe, vsplat(0.0f)) : pe) * d;
                        _mm256_storeu_si256((__m256i *)(dsb + (r + k) * BK + 16 * v), bf16x16(ds[k][v]));
                    }
                }
                for (int v = 0; v < BK / 16; v++) {
                    _mm512_storeu_si512(pp + (r / 2 * BK + 16 * v) * 2, pairs16(p[0][v], p[1][v]));
                    _mm512_storeu_si512(dsp + (r / 2 * BK + 16 * v) * 2, pairs16(ds[0][v], ds[1][v]));
                }
            }
            prev = i0, prev_n = n;
        }
        transpose_in(MPT_DT_F32, dkt, 0, E, nb, BK, dk + j0 * E, E);
        transpose_in(MPT_DT_F32, dvt, 0, Ev, nb, BK, dv + j0 * Ev, Ev);
    }
    if (!jb->dot) _tile_release();
    unpad_rows(dq, Tq, E, jb->E);
    unpad_rows(dk, Tk, E, jb->E);
    unpad_rows(dv, Tk, Ev, jb->Ev);
    if (jb->dq) store_rows(jb, jb->dq_dt, jb->dq, bh, 0, Tq, Tq, jb->E, dq);
    if (jb->dk) store_rows(jb, jb->dk_dt, jb->dk, bh, 0, Tk, Tk, jb->E, dk);
    if (jb->dv) store_rows(jb, jb->dv_dt, jb->dv, bh, 0, Tk, Tk, jb->Ev, dv);
}

#else /* not x86-64: never taken */

int mpt_cpu_attn_amx_fits(const attn_job *jb, int backward) {
    (void)jb, (void)backward;
    return 0;
}
size_t mpt_cpu_attn_amx_head_floats(const attn_job *jb) { return (void)jb, 0; }
size_t mpt_cpu_attn_amx_scratch(const attn_job *jb, int backward) { return (void)jb, (void)backward, 0; }
void mpt_cpu_attn_amx_prep_task(void *ctx, int task, int thread) { (void)ctx, (void)task, (void)thread; }
void mpt_cpu_attn_amx_fwd_task(void *ctx, int task, int thread) { (void)ctx, (void)task, (void)thread; }
void mpt_cpu_attn_amx_bwd_task(void *ctx, int task, int thread) { (void)ctx, (void)task, (void)thread; }

#endif
