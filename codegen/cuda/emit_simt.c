/* codegen/cuda/emit_simt.c — the fp32 GEMM and implicit-GEMM convolution
 * kernels on CUDA cores (true fp32: the float32 policy without --tf32).
 *
 * Two shapes:
 *
 * wide   128 x 128 (or 128 x 64 where N <= 64) block tile, 16 x 16 threads
 *        of 8 x 8 (8 x 4) outputs, k step 8. The shared tiles are stored k
 *        major (As[k][m], Bs[k][n]), so each step of k a thread reads its 8
 *        values of A and 8 of B as four float4s: 64 FMAs for 4 shared loads,
 *        where the small kernel's 16 take 8. Its outputs are two 4 x 4
 *        blocks 64 rows and 64 columns apart, which keeps the float4 reads
 *        of a warp on distinct banks. Two shared stages: the global loads of
 *        the next k step are issued into registers before the FMAs of this
 *        one, and stored into the other stage after them, so one barrier a
 *        step suffices and the loads' latency hides behind the FMAs.
 * small  64 x 64 block tile, 16 x 16 threads of 4 x 4 outputs, k step 16,
 *        one stage: for GEMMs of fewer than 256 rows or at most 32 columns,
 *        where the wide tile would mostly compute padding.
 *
 * MPTC_CUDA_SIMT_TILE=64 makes every fp32 GEMM take the small kernel, to
 * compare the two on a GPU.
 *
 * Global reads follow the operand's layout: consecutive threads read
 * consecutive elements along k where the operand runs along k (x patches,
 * dy gathered), else along m or n (w [K, Cout], dy in the filter gradient).
 */
#include <stdio.h>
#include <stdlib.h>

#include "codegen/cuda/cuda_internal.h"

#define L(...) mpt_cu_line(e, __VA_ARGS__)

/* ---- small: 64 x 64 ---- */

/* The tiles As[BM][BK] and Bs[BN][BK] from global at k0, as f32.
 * Consecutive threads read consecutive k of A and consecutive n of B. The
 * loop is left rolled: fully unrolled (16 elements a thread, all loads in
 * flight at once), the convolutions' index arithmetic took 255 registers
 * and spilled. */
static void small_load(mpt_cu_em *e, const mpt_cu_gemm *q) {
    L("for (int t = threadIdx.x; t < 64 * 16; t += 256) {");
    e->indent++;
    L("const int lm = t / 16, lk = t %% 16;");
    L("const %s gm = bm + lm, gk = k0 + lk;", q->ity);
    L("float a = 0.f;");
    L("if (gm < %s && gk < K_) {", q->phased ? "MC_" : "M_");
    e->indent++;
    mpt_cu_gemm_operand(e, q, 0, "a");
    e->indent--;
    L("}");
    L("As[lm][lk] = a;");
    e->indent--;
    L("}");
    L("for (int t = threadIdx.x; t < 64 * 16; t += 256) {");
    e->indent++;
    L("const int ln = t %% 64, lk = t / 64;");
    L("const %s gn = bn + ln, gk = k0 + lk;", q->ity);
    L("float b = 0.f;");
    L("if (gn < N_ && gk < K_) {");
    e->indent++;
    mpt_cu_gemm_operand(e, q, 1, "b");
    e->indent--;
    L("}");
    L("Bs[ln][lk] = b;");
    e->indent--;
    L("}");
}

static void small_each(mpt_cu_em *e, mpt_cu_acc_body body) {
    L("#pragma unroll");
    L("for (int i = 0; i < 4; i++)");
    L("#pragma unroll");
    L("for (int j = 0; j < 4; j++) {");
    e->indent++;
    if (e->row_map) L("const long long row = mpt_row(bm + ty + 16 * i);");
    else L("const int row = bm + ty + 16 * i;");
    L("const int col = bn + tx + 16 * j;");
    body(e, "acc[i][j]");
    e->indent--;
    L("}");
}

static void small_body(mpt_cu_em *e, const mpt_cu_gemm *q, int splits, int64_t kspan) {
    L("/* 64x64 block tile, 16x16 threads of 4x4 outputs, k step 16, fp32 FMA */");
    L("__shared__ float As[64][17];");
    L("__shared__ float Bs[64][17];");
    L("const int ty = threadIdx.x / 16, tx = threadIdx.x %% 16;");
    L("const %s bm = %s(%s)mpt_tm%s * 64, bn = (%s)mpt_tn * 64;", q->ity,
      q->phased ? "(" : "", q->ity, q->phased ? " - ph_t0)" : "", q->ity);
    L("const %s kbeg = (%s)blockIdx.z * %lld;", q->ity, q->ity, (long long)kspan);
    L("const %s kend = min(K_, kbeg + %lld);", q->ity, (long long)kspan);
    L("float acc[4][4];");
    L("#pragma unroll");
    L("for (int i = 0; i < 16; i++) (&acc[0][0])[i] = 0.f;");
    L("for (%s k0 = kbeg; k0 < kend; k0 += 16) {", q->ity);
    e->indent++;
    small_load(e, q);
    L("__syncthreads();");
    L("#pragma unroll");
    L("for (int kk = 0; kk < 16; kk++) {");
    L("    float a[4], b[4];");
    L("    #pragma unroll");
    L("    for (int i = 0; i < 4; i++) { a[i] = As[ty + 16 * i][kk]; b[i] = Bs[tx + 16 * i][kk]; }");
    L("    #pragma unroll");
    L("    for (int i = 0; i < 4; i++)");
    L("        #pragma unroll");
    L("        for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);");
    L("}");
    L("__syncthreads();");
    e->indent--;
    L("}");
    mpt_cu_gemm_finish(e, q, splits, small_each, NULL);
}

/* ---- wide: 128 x 128 or 128 x 64 ---- */

enum { WBM = 128, WBK = 8, WPAD = 4 };
/* float4 reads need 16-byte aligned rows: padded lengths of 4 floats */
_Static_assert((WBM + WPAD) % 4 == 0 && (64 + WPAD) % 4 == 0, "shared rows of whole float4s");

/* The global reads of operand w's tile at k `at` into registers p<w>[r],
 * r < count (elements of the tile a thread reads): element t + 256 r of
 * the tile, taken along k or along m/n as the operand runs in memory. */
static void wide_fetch(mpt_cu_em *e, const mpt_cu_gemm *q, int w, int span, const char *at) {
    int count = span * WBK / 256, along_k = mpt_cu_gemm_k_contiguous(q, w);
    const char *mn = w ? "n" : "m";
    L("#pragma unroll");
    L("for (int r = 0; r < %d; r++) {", count);
    e->indent++;
    L("const int t = threadIdx.x + 256 * r;");
    if (along_k) L("const int l%s = t / %d, lk = t %% %d;", mn, WBK, WBK);
    else L("const int l%s = t %% %d, lk = t / %d;", mn, span, span);
    L("const %s g%s = b%s + l%s, gk = %s + lk;", q->ity, mn, mn, mn, at);
    L("float v = 0.f;");
    if (w) L("if (gn < N_ && gk < K_) {");
    else L("if (gm < %s && gk < K_) {", q->phased ? "MC_" : "M_");
    e->indent++;
    mpt_cu_gemm_operand(e, q, w, "v");
    e->indent--;
    L("}");
    L("p%c[r] = v;", w ? 'b' : 'a');
    e->indent--;
    L("}");
}

/* p<w>[r] into stage `st` of its shared tile, at the element wide_fetch
 * read it from */
static void wide_store(mpt_cu_em *e, const mpt_cu_gemm *q, int w, int span, const char *st) {
    int count = span * WBK / 256, along_k = mpt_cu_gemm_k_contiguous(q, w);
    L("#pragma unroll");
    L("for (int r = 0; r < %d; r++) {", count);
    e->indent++;
    L("const int t = threadIdx.x + 256 * r;");
    if (along_k) L("%cs[%s][t %% %d][t / %d] = p%c[r];", w ? 'B' : 'A', st, WBK, WBK, w ? 'b' : 'a');
    else L("%cs[%s][t / %d][t %% %d] = p%c[r];", w ? 'B' : 'A', st, span, span, w ? 'b' : 'a');
    e->indent--;
    L("}");
}

/* Thread (ty, tx)'s outputs: rows 4 ty + (i & 3) + 64 (i >> 2), i < 8;
 * columns 4 tx + (j & 3) + 64 (j >> 2), j < tn (8, or 4 for 64 columns),
 * one at a time (pair 0) or two adjacent ones (pair 1). */
static void wide_loop(mpt_cu_em *e, int tn, int pair) {
    L("#pragma unroll");
    L("for (int i = 0; i < 8; i++)");
    L("#pragma unroll");
    L("for (int j = 0; j < %d; j += %d) {", tn, pair ? 2 : 1);
    e->indent++;
    if (e->row_map) L("const long long row = mpt_row(bm + 4 * ty + (i & 3) + 64 * (i >> 2));");
    else L("const int row = bm + 4 * ty + (i & 3) + 64 * (i >> 2);");
    L("const int col = bn + 4 * tx + (j & 3) + 64 * (j >> 2);");
}

static void wide_end(mpt_cu_em *e) {
    e->indent--;
    L("}");
}

static void wide8_each(mpt_cu_em *e, mpt_cu_acc_body body) {
    wide_loop(e, 8, 0);
    body(e, "acc[i][j]");
    wide_end(e);
}
static void wide4_each(mpt_cu_em *e, mpt_cu_acc_body body) {
    wide_loop(e, 4, 0);
    body(e, "acc[i][j]");
    wide_end(e);
}
static void wide8_pairs(mpt_cu_em *e, mpt_cu_pair_body body) {
    wide_loop(e, 8, 1);
    body(e, "acc[i][j]", "acc[i][j + 1]");
    wide_end(e);
}
static void wide4_pairs(mpt_cu_em *e, mpt_cu_pair_body body) {
    wide_loop(e, 4, 1);
    body(e, "acc[i][j]", "acc[i][j + 1]");
    wide_end(e);
}

static void wide_body(mpt_cu_em *e, const mpt_cu_gemm *q, int bn, int splits, int64_t kspan) {
    int tn = bn / 16;
    L("/* %dx%d block tile, 16x16 threads of 8x%d outputs, k step %d, two shared stages (the "
      "next step's loads in registers meanwhile), fp32 FMA */", WBM, bn, tn, WBK);
    L("__shared__ __align__(16) float As[2][%d][%d];", WBK, WBM + WPAD);
    L("__shared__ __align__(16) float Bs[2][%d][%d];", WBK, bn + WPAD);
    L("const int ty = threadIdx.x / 16, tx = threadIdx.x %% 16;");
    L("const %s bm = %s(%s)mpt_tm%s * %d, bn = (%s)mpt_tn * %d;", q->ity,
      q->phased ? "(" : "", q->ity, q->phased ? " - ph_t0)" : "", WBM, q->ity, bn);
    L("const %s kbeg = (%s)blockIdx.z * %lld;", q->ity, q->ity, (long long)kspan);
    L("const %s kend = min(K_, kbeg + %lld);", q->ity, (long long)kspan);
    L("float acc[8][%d];", tn);
    L("#pragma unroll");
    L("for (int i = 0; i < %d; i++) (&acc[0][0])[i] = 0.f;", 8 * tn);
    L("float pa[%d], pb[%d];", WBM * WBK / 256, bn * WBK / 256);
    wide_fetch(e, q, 0, WBM, "kbeg");
    wide_fetch(e, q, 1, bn, "kbeg");
    wide_store(e, q, 0, WBM, "0");
    wide_store(e, q, 1, bn, "0");
    L("__syncthreads();");
    L("int st = 0;");
    L("for (%s k0 = kbeg; k0 < kend; k0 += %d) {", q->ity, WBK);
    e->indent++;
    L("const bool more = k0 + %d < kend;", WBK);
    L("if (more) {");
    e->indent++;
    char next[32];
    snprintf(next, sizeof next, "k0 + %d", WBK);
    wide_fetch(e, q, 0, WBM, next);
    wide_fetch(e, q, 1, bn, next);
    e->indent--;
    L("}");
    L("#pragma unroll");
    L("for (int kk = 0; kk < %d; kk++) {", WBK);
    e->indent++;
    L("const float4 a0 = *(const float4 *)&As[st][kk][4 * ty];");
    L("const float4 a1 = *(const float4 *)&As[st][kk][64 + 4 * ty];");
    L("const float4 b0 = *(const float4 *)&Bs[st][kk][4 * tx];");
    if (tn == 8) {
        L("const float4 b1 = *(const float4 *)&Bs[st][kk][64 + 4 * tx];");
        L("const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};");
    } else {
        L("const float b[4] = {b0.x, b0.y, b0.z, b0.w};");
    }
    L("const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};");
    L("#pragma unroll");
    L("for (int i = 0; i < 8; i++)");
    L("    #pragma unroll");
    L("    for (int j = 0; j < %d; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);", tn);
    e->indent--;
    L("}");
    L("if (more) {");
    e->indent++;
    wide_store(e, q, 0, WBM, "st ^ 1");
    wide_store(e, q, 1, bn, "st ^ 1");
    e->indent--;
    L("}");
    L("__syncthreads();");
    L("st ^= 1;");
    e->indent--;
    L("}");
    mpt_cu_gemm_finish(e, q, splits, tn == 8 ? wide8_each : wide4_each,
                       tn == 8 ? wide8_pairs : wide4_pairs);
}

/* ---- the kernel ---- */

void mpt_cu_emit_simt(mpt_cu_em *e, const mpt_cu_gemm *q_in, mpt_cuda_kernel_src *out) {
    mpt_cu_gemm qq = *q_in;
    const mpt_cu_gemm *q = &qq;
    const char *env = getenv("MPTC_CUDA_SIMT_TILE");
    int wide = q->m >= 256 && q->n > 32 && !(env && atoi(env) == 64);
    int bm = wide ? WBM : 64, bn = wide && q->n > 64 ? 128 : 64, bk = wide ? WBK : 16;
    mpt_cu_phase ph[MPT_CU_MAX_PHASES];
    int64_t m_tiles, k_max, kspan;
    int n_ph = mpt_cu_gemm_phases(&qq, bm, ph, &m_tiles, &k_max);
    e->row_map = q->phased;
    int64_t n_tiles = (q->n + bn - 1) / bn, tiles = m_tiles * n_tiles;
    int splits = mpt_cu_gemm_splits(tiles, (k_max + bk - 1) / bk, &kspan);
    kspan *= bk;
    if (splits > 1) {
        out->scratch_bytes = (size_t)(q->m * q->n) * 4 * (size_t)splits;
        out->counter_bytes = (size_t)tiles * 4;
    }
    /* the wide kernel's 64 (32) accumulators, 16 operand values and the
     * prefetched ones beside a convolution's index arithmetic: at 128
     * registers (two blocks an SM) a strided convolution spilled 40 bytes
     * and a filter gradient with the SGD update in its epilogue 64 */
    if (wide) snprintf(e->launch_bounds, sizeof e->launch_bounds, "__launch_bounds__(256, 1)");
    mpt_cu_signature(e, out);
    mpt_sb_printf(e->sb, " {\n");
    e->indent = 1;
    L("/* C[%lld,%lld] = A[%lld,%lld] B[%lld,%lld] (%s) */", (long long)q->m, (long long)q->n,
      (long long)q->m, (long long)q->k, (long long)q->k, (long long)q->n, mpt_op_name(q->op));
    mpt_cu_gemm_tile_ids(e, m_tiles, n_tiles, out);
    mpt_cu_gemm_emit_sizes(e, q, ph, n_ph);
    if (wide) wide_body(e, q, bn, splits, kspan);
    else small_body(e, q, splits, kspan);
    mpt_sb_printf(e->sb, "}\n");
    out->block[0] = 256;
    out->phases = q->phased ? n_ph : 0;
    out->tile_m = bm, out->tile_n = bn;
    out->grid[2] = (unsigned)splits;
}
