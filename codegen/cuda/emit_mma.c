/* codegen/cuda/emit_mma.c — the Tensor Core GEMM and implicit-GEMM
 * convolution kernel: f16/bf16 operands, f32 accumulation.
 *
 * Block tile 128 x 128 (8 warps), 128 x 64 when N <= 64 (4 warps) or, for
 * f16/bf16 with N <= 32, 256 x 32 (4 warps), each warp 64 x 32 of the
 * output: 4 x 4 mma.sync.m16n8k16 per 16 of k, its
 * fragments read from shared memory by ldmatrix. k advances 32 at a time
 * through a 3-stage pipeline: while the Tensor Cores work on one stage,
 * the copies of the next two are in flight.
 *
 * Each operand's shared tile follows the operand's own layout in memory:
 * [m or n][k] where its elements run along k (x patches in the forward
 * convolution, dy in the data gradient), [k][m or n] where they run along
 * m or n (the filter w [K, Cout], dy in the filter gradient). A [k][mn]
 * tile is read by ldmatrix.trans, which hands each lane the same fragment
 * a [mn][k] tile gives it by ldmatrix. Rows are padded by 8 elements (16
 * bytes), which puts the 8 rows one ldmatrix reads in 8 different groups of
 * 4 banks.
 *
 * An operand that is a buffer of the kernel's type whose runs of
 * consecutive elements are multiples of 8 long (a channel count, a row
 * length) is copied with cp.async, 16 bytes (8 elements) at a time, from
 * global memory to shared memory without passing through registers; the
 * copy of a chunk outside the matrix or in a convolution's padding writes
 * zeros (its source size is 0). Any other operand (3 input channels, a
 * prologue cast from f32) is read element by element through the element
 * generators and stored into the stage by the threads.
 *
 * With MPTC_CUDA_WGMMA=1 (sm_90 only: NVRTC compiles such kernels for
 * sm_90a), f16/bf16 kernels use wgmma.mma_async instead: each warpgroup
 * (4 warps) computes 64 rows x the whole tile's columns, its operands read
 * by the Tensor Cores from shared memory through matrix descriptors. The
 * tiles are then stored in the canonical layout without swizzle: 8 x 8
 * core matrices (8 rows of 16 bytes, 128 contiguous bytes) in order of
 * (mn / 8, k / 8), rows running along k where the operand's elements do
 * (K-major) and along m or n otherwise (MN-major, wgmma's transpose flag);
 * so the core matrices next along k are 128 bytes apart (the descriptor's
 * leading byte offset) and those next along m or n 4 x 128 (its stride
 * byte offset). cp.async chunks go to consecutive 16-byte slots, a warp
 * storing 512 contiguous bytes. Shared memory written by the threads is
 * made visible to wgmma (the async proxy) by fence.proxy.async before the
 * stage's barrier. Four stages: one stage's wgmmas stay in flight while
 * the next is issued, and a load refills the stage two behind, whose
 * wgmmas every thread has waited for before the barrier.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cuda_internal.h"

#define L(...) mpt_cu_line(e, __VA_ARGS__)

enum { BK = 32, STAGES = 3, WM = 64, WN = 32 };

typedef struct {
    int bm, bn, threads, warps_n;
    int es, vec;   /* element bytes (2, or 4 for TF32's f32), elements a 16-byte chunk */
    int kc[2];     /* the shared tile is [mn][k] (1) or [k][mn] (0) */
    int direct[2]; /* copied by cp.async */
    int rows[2], cols[2];
    int wg;        /* wgmma (the canonical shared layout, warpgroups of 64 rows) */
} mma_tile;

static int wgmma_wanted(void) {
    const char *v = getenv("MPTC_CUDA_WGMMA");
    return v && strcmp(v, "1") == 0;
}

/* Elements of operand w's tile in one stage */
static int tile_elems(const mma_tile *t, int w) {
    return t->wg ? (w ? t->bn : t->bm) * BK : t->rows[w] * t->cols[w];
}

/* "[r][x]" of operand w's tile, or for wgmma the flat index of element
 * (r, x) in the canonical layout (r the tile row, x along its contiguous
 * dim): core matrix (mn / 8, k / 8), row r % 8, element x % 8 */
static void tile_at(const mma_tile *t, int w, const char *r, const char *x, char *buf, size_t n) {
    if (!t->wg) {
        snprintf(buf, n, "[%s][%s]", r, x);
        return;
    }
    const char *mn = t->kc[w] ? r : x, *k = t->kc[w] ? x : r;
    snprintf(buf, n, "[((%s >> 3) * %d + (%s >> 3)) * 64 + (%s & 7) * 8 + (%s & 7)]", mn, BK / 8,
             k, r, x);
}

static mma_tile tile_for(const mpt_cu_em *e, const mpt_cu_gemm *q, mpt_dtype in_dt) {
    mma_tile t = {.bm = 128, .bn = q->n <= 64 ? 64 : 128};
    t.es = in_dt == MPT_DT_F32 ? 4 : 2;
    /* at most 32 columns (a narrow convolution): 256 x 32, four warps down
     * the rows, where 128 x 64 would compute as many columns of padding as
     * of output; f16/bf16 only (TF32's f32 tiles would take 124 KiB) */
    if (q->n <= 32 && q->m >= 256 && t.es == 2) t.bm = 256, t.bn = 32;
    t.vec = 16 / t.es;
    t.warps_n = t.bn / WN;
    t.threads = 32 * (t.bm / WM) * t.warps_n;
    t.wg = t.es == 2 && wgmma_wanted();
    if (t.wg) t.threads = 128 * (t.bm / 64);
    for (int w = 0; w < 2; w++) {
        int node = w ? q->b : q->a, mn = w ? t.bn : t.bm;
        t.kc[w] = mpt_cu_gemm_k_contiguous(q, w);
        t.direct[w] = !e->in_kernel[node] && e->param_of[node] >= 0 &&
                      e->g->nodes[node].dtype == in_dt && mpt_cu_gemm_run(q, w) % t.vec == 0;
        t.rows[w] = t.kc[w] ? mn : BK;
        t.cols[w] = (t.kc[w] ? BK : mn) + t.vec; /* 16 bytes of padding */
    }
    return t;
}

/* Emits the copy of operand w's tile at k0 into stage s. */
static void load_operand(mpt_cu_em *e, const mpt_cu_gemm *q, const mma_tile *t, int w,
                         const char *conv) {
    const char *sh = w ? "Bs" : "As", *mn = w ? "gn" : "gm", *base = w ? "bn" : "bm";
    const char *lim = w ? "N_" : q->phased ? "MC_" : "M_";
    int span = w ? t->bn : t->bm;
    int cont = t->kc[w] ? BK : span;           /* the tile's contiguous length */
    int elems = span * BK;
    if (t->direct[w]) {
        int chunks = elems / t->vec, per = cont / t->vec;
        char idx[24];
        L("/* %s: 16-byte cp.async, %d a thread */", w ? "B" : "A",
          (chunks + t->threads - 1) / t->threads);
        L("#pragma unroll");
        L("for (int i = 0; i < %d; i++) {", (chunks + t->threads - 1) / t->threads);
        e->indent++;
        L("const int c = threadIdx.x + i * %d;", t->threads);
        if (chunks % t->threads) L("if (c >= %d) break;", chunks);
        if (!t->wg) {
            L("const int r = c / %d, x = c %% %d * %d;", per, per, t->vec);
        } else if (t->kc[w]) { /* chunk c is slot c of the canonical layout */
            L("const int r = (c >> 3) / %d * 8 + (c & 7), x = (c >> 3) %% %d * 8;", BK / 8, BK / 8);
        } else {
            L("const int r = (c >> 3) %% %d * 8 + (c & 7), x = (c >> 3) / %d * 8;", BK / 8, BK / 8);
        }
        if (t->kc[w]) L("const %s %s = %s + r, gk = k0 + x;", q->ity, mn, base);
        else L("const %s gk = k0 + r, %s = %s + x;", q->ity, mn, base);
        L("%s src = 0;", q->ity);
        L("bool v = false;");
        L("if (%s < %s && gk < K_) {", mn, lim);
        e->indent++;
        mpt_cu_fresh(e, "oi", idx);
        const char *ok = mpt_cu_gemm_index(e, q, w, idx);
        L("src = %s;", idx);
        L("v = %s;", ok);
        e->indent--;
        L("}");
        if (t->wg) L("mpt_cp16(&%s[s][c * 8], p%d + src, v);", sh, e->param_of[w ? q->b : q->a]);
        else L("mpt_cp16(&%s[s][r][x], p%d + src, v);", sh, e->param_of[w ? q->b : q->a]);
        e->indent--;
        L("}");
        return;
    }
    L("/* %s: element by element */", w ? "B" : "A");
    L("for (int i = threadIdx.x; i < %d; i += %d) {", elems, t->threads);
    e->indent++;
    L("const int r = i / %d, x = i %% %d;", cont, cont);
    if (t->kc[w]) L("const %s %s = %s + r, gk = k0 + x;", q->ity, mn, base);
    else L("const %s gk = k0 + r, %s = %s + x;", q->ity, mn, base);
    L("float v = 0.f;");
    L("if (%s < %s && gk < K_) {", mn, lim);
    e->indent++;
    mpt_cu_gemm_operand(e, q, w, "v");
    e->indent--;
    L("}");
    char at[96];
    tile_at(t, w, "r", "x", at, sizeof at);
    L("%s[s]%s = %s(v);", sh, at, conv);
    e->indent--;
    L("}");
}

/* A loop (`range` over mi or np) of ldmatrix.x4 into r0..r3, lane
 * addresses at_kc from a [mn][k] tile or at_mc (with .trans) from a
 * [k][mn] one. */
static void fragments(mpt_cu_em *e, const char *range, const char *var, int kc, const char *at_kc,
                      const char *at_mc, const char *r0, const char *r1, const char *r2,
                      const char *r3) {
    const char *it = range[0] == 'm' ? "mi" : "np";
    L("#pragma unroll");
    L("for (int %s = 0; %s) {", it, range);
    e->indent++;
    L("const unsigned %s = (unsigned)__cvta_generic_to_shared(%s);", var, kc ? at_kc : at_mc);
    L("asm volatile(\"ldmatrix.sync.aligned.m8n8.x4%s.shared.b16 {%%0,%%1,%%2,%%3}, [%%4];\"",
      kc ? "" : ".trans");
    L("    : \"=r\"(%s), \"=r\"(%s), \"=r\"(%s), \"=r\"(%s) : \"r\"(%s));", r0, r1, r2, r3, var);
    e->indent--;
    L("}");
}

/* The warp's 4 x 4 mma.sync of one k step on the fragments af (4 words a
 * row block) and bf (2 a column block), into acc. */
static void mma_all(mpt_cu_em *e, const char *shape, const char *ty) {
    L("#pragma unroll");
    L("for (int mi = 0; mi < 4; mi++)");
    L("#pragma unroll");
    L("for (int ni = 0; ni < 4; ni++)");
    L("    asm volatile(\"mma.sync.aligned.%s.row.col.f32.%s.%s.f32 "
      "{%%0,%%1,%%2,%%3}, {%%4,%%5,%%6,%%7}, {%%8,%%9}, {%%0,%%1,%%2,%%3};\"", shape, ty, ty);
    L("        : \"+f\"(acc[mi][ni][0]), \"+f\"(acc[mi][ni][1]), \"+f\"(acc[mi][ni][2]), "
      "\"+f\"(acc[mi][ni][3])");
    L("        : \"r\"(af[mi][0]), \"r\"(af[mi][1]), \"r\"(af[mi][2]), \"r\"(af[mi][3]), "
      "\"r\"(bf[ni][0]), \"r\"(bf[ni][1]));");
}

/* One stage's 32 of k: per 16, the A fragments of the warp's 4 row blocks
 * and the B fragments of its 4 column blocks by ldmatrix (x4: lanes 8j to
 * 8j + 7 address the rows of matrix j), then 16 mma.sync. */
static void mma_stage(mpt_cu_em *e, const mma_tile *t, const char *ty) {
    L("#pragma unroll");
    L("for (int kk = 0; kk < %d; kk += 16) {", BK);
    e->indent++;
    L("unsigned af[4][4], bf[4][2];");
    /* a0..a3: rows +0 k +0, rows +8 k +0, rows +0 k +8, rows +8 k +8 */
    fragments(e, "mi < 4; mi++", "sa", t->kc[0],
              "&As[s][wm + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][kk + (lane >> 4) * 8]",
              "&As[s][kk + (lane & 7) + (lane >> 4) * 8][wm + mi * 16 + ((lane >> 3) & 1) * 8]",
              "af[mi][0]", "af[mi][1]", "af[mi][2]", "af[mi][3]");
    /* n block 2np at k +0 and +8, then n block 2np + 1 */
    fragments(e, "np < 2; np++", "sb", t->kc[1],
              "&Bs[s][wn + np * 16 + (lane & 7) + (lane >> 4) * 8][kk + ((lane >> 3) & 1) * 8]",
              "&Bs[s][kk + (lane & 7) + ((lane >> 3) & 1) * 8][wn + np * 16 + (lane >> 4) * 8]",
              "bf[2 * np][0]", "bf[2 * np][1]", "bf[2 * np + 1][0]", "bf[2 * np + 1][1]");
    mma_all(e, "m16n8k16", ty);
    e->indent--;
    L("}");
}

/* TF32 (f32 operands): per 8 of k, each lane's elements of the A and B
 * fragments of mma.m16n8k8 read from the f32 tiles one by one (ldmatrix
 * moves 16-bit elements) and rounded to TF32 by cvt.rna: A rows g and g +
 * 8, columns q4 and q4 + 4; B rows (k) q4 and q4 + 4 of column g. */
static void mma_stage_tf32(mpt_cu_em *e, const mma_tile *t) {
    char at[4][96], bt[2][96];
    const char *ar[4] = {"r", "r + 8", "r", "r + 8"}, *ak[4] = {"k", "k", "k + 4", "k + 4"};
    for (int i = 0; i < 4; i++) {
        if (t->kc[0]) snprintf(at[i], sizeof at[i], "As[s][%s][%s]", ar[i], ak[i]);
        else snprintf(at[i], sizeof at[i], "As[s][%s][%s]", ak[i], ar[i]);
    }
    for (int i = 0; i < 2; i++) {
        const char *k = i ? "k + 4" : "k";
        if (t->kc[1]) snprintf(bt[i], sizeof bt[i], "Bs[s][c][%s]", k);
        else snprintf(bt[i], sizeof bt[i], "Bs[s][%s][c]", k);
    }
    L("#pragma unroll");
    L("for (int kk = 0; kk < %d; kk += 8) {", BK);
    e->indent++;
    L("unsigned af[4][4], bf[4][2];");
    L("const int k = kk + q4;");
    L("#pragma unroll");
    L("for (int mi = 0; mi < 4; mi++) {");
    L("    const int r = wm + mi * 16 + g;");
    for (int i = 0; i < 4; i++) L("    af[mi][%d] = mpt_tf32(%s);", i, at[i]);
    L("}");
    L("#pragma unroll");
    L("for (int ni = 0; ni < 4; ni++) {");
    L("    const int c = wn + ni * 8 + g;");
    for (int i = 0; i < 2; i++) L("    bf[ni][%d] = mpt_tf32(%s);", i, bt[i]);
    L("}");
    mma_all(e, "m16n8k8", "tf32");
    e->indent--;
    L("}");
}

/* Waits until at most `pending` wgmma groups are in flight. The empty asm
 * statements tie every accumulator to the wait, so the compiler moves no
 * read of one above it. */
static void wg_wait(mpt_cu_em *e, const mma_tile *t, int pending) {
    L("asm volatile(\"wgmma.wait_group.sync.aligned %%0;\" :: \"n\"(%d) : \"memory\");",
      pending);
    L("#pragma unroll");
    L("for (int i = 0; i < %d; i++) asm volatile(\"\" : \"+f\"(acc[i]) :: \"memory\");",
      t->bn / 2);
}

/* wgmma: the stage's 32 of k as two m64nNk16 per warpgroup, A its 64 rows
 * of the tile, B the whole tile, committed as one group; the group before
 * it is waited for, so one stage's wgmmas run while the next stage is
 * waited for and issued (the stage a load refills is two behind). */
static void wg_stage(mpt_cu_em *e, const mma_tile *t, const char *ty) {
    int na = t->bn / 2;
    mpt_sb d = {0};
    mpt_sb_printf(&d, "{");
    for (int i = 0; i < na; i++) mpt_sb_printf(&d, "%s%%%d", i ? "," : "", i);
    mpt_sb_printf(&d, "}");
    char *regs = mpt_sb_take(&d);
    L("asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");");
    L("#pragma unroll");
    L("for (int kk = 0; kk < %d; kk += 16) {", BK);
    e->indent++;
    L("const unsigned long long da = mpt_wg_desc(&As[s][(wgi * %d + kk / 8) * 64]);", 8 * BK / 8);
    L("const unsigned long long db = mpt_wg_desc(&Bs[s][(kk / 8) * 64]);");
    L("asm volatile(\"wgmma.mma_async.sync.aligned.m64n%dk16.f32.%s.%s %s, %%%d, %%%d, 1, 1, 1, "
      "%%%d, %%%d;\"", t->bn, ty, ty, regs ? regs : "{}", na, na + 1, na + 2, na + 3);
    free(regs);
    /* the accumulators, 8 a line */
    for (int i = 0; i < na; i += 8) {
        char line[256];
        int o = 0;
        for (int j = i; j < i + 8 && j < na; j++)
            o += snprintf(line + o, sizeof line - (size_t)o, "%s\"+f\"(acc[%d])%s",
                          j > i ? " " : "", j, j + 1 < na ? "," : "");
        L("    %s %s", i ? " " : ":", line);
    }
    L("    : \"l\"(da), \"l\"(db), \"n\"(%d), \"n\"(%d));", !t->kc[0], !t->kc[1]);
    e->indent--;
    L("}");
    L("asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");");
    wg_wait(e, t, 1);
}

/* wgmma's D fragment: warp w of the warpgroup holds rows 16 w + g and
 * 16 w + g + 8, and of each 8 columns ni the two at 2 q4: acc[4 ni + h] is
 * row + 8 (h >> 1), column + (h & 1), as mma.sync's C fragment per block */
static void wg_each(mpt_cu_em *e, mpt_cu_acc_body body) {
    L("#pragma unroll");
    L("for (int ni = 0; ni < %d; ni++)", e->wg_n / 8);
    L("#pragma unroll");
    L("for (int h = 0; h < 4; h++) {");
    e->indent++;
    if (e->row_map) L("const long long row = mpt_row(bm + wr + g + (h >> 1) * 8);");
    else L("const int row = bm + wr + g + (h >> 1) * 8;");
    L("const int col = bn + ni * 8 + 2 * q4 + (h & 1);");
    body(e, "acc[ni * 4 + h]");
    e->indent--;
    L("}");
}

static void wg_each_pair(mpt_cu_em *e, mpt_cu_pair_body body) {
    L("#pragma unroll");
    L("for (int ni = 0; ni < %d; ni++)", e->wg_n / 8);
    L("#pragma unroll");
    L("for (int hp = 0; hp < 2; hp++) {");
    e->indent++;
    if (e->row_map) L("const long long row = mpt_row(bm + wr + g + hp * 8);");
    else L("const int row = bm + wr + g + hp * 8;");
    L("const int col = bn + ni * 8 + 2 * q4;");
    body(e, "acc[ni * 4 + 2 * hp]", "acc[ni * 4 + 2 * hp + 1]");
    e->indent--;
    L("}");
}

/* The accumulators: mma's C fragment gives lane 4g + q4 rows g and g + 8,
 * columns 2 q4 and 2 q4 + 1 of each 16 x 8 block. */
static void row_of(mpt_cu_em *e, const char *local) {
    if (e->row_map) L("const long long row = mpt_row(%s);", local);
    else L("const int row = %s;", local);
}

static void mma_each(mpt_cu_em *e, mpt_cu_acc_body body) {
    L("#pragma unroll");
    L("for (int mi = 0; mi < 4; mi++)");
    L("#pragma unroll");
    L("for (int ni = 0; ni < 4; ni++)");
    L("#pragma unroll");
    L("for (int h = 0; h < 4; h++) {");
    e->indent++;
    row_of(e, "bm + wm + mi * 16 + g + (h >> 1) * 8");
    L("const int col = bn + wn + ni * 8 + 2 * q4 + (h & 1);");
    body(e, "acc[mi][ni][h]");
    e->indent--;
    L("}");
}

static void mma_each_pair(mpt_cu_em *e, mpt_cu_pair_body body) {
    L("#pragma unroll");
    L("for (int mi = 0; mi < 4; mi++)");
    L("#pragma unroll");
    L("for (int ni = 0; ni < 4; ni++)");
    L("#pragma unroll");
    L("for (int hp = 0; hp < 2; hp++) {");
    e->indent++;
    row_of(e, "bm + wm + mi * 16 + g + hp * 8");
    L("const int col = bn + wn + ni * 8 + 2 * q4;");
    body(e, "acc[mi][ni][2 * hp]", "acc[mi][ni][2 * hp + 1]");
    e->indent--;
    L("}");
}

void mpt_cu_emit_mma(mpt_cu_em *e, const mpt_cu_gemm *q_in, mpt_dtype in_dt,
                     mpt_cuda_kernel_src *out) {
    mpt_cu_gemm qq = *q_in;
    const mpt_cu_gemm *q = &qq;
    mma_tile t = tile_for(e, q, in_dt);
    /* ns stages, loads issued `ahead` stages ahead. wgmma keeps one
     * stage's group in flight while the next is issued, so the stage a
     * load refills must be two behind, not one: a fourth stage keeps two
     * loads in flight */
    const int ns = t.wg ? STAGES + 1 : STAGES, ahead = t.wg ? ns - 2 : ns - 1;
    const char *conv = in_dt == MPT_DT_F16 ? "mpt_f2h" : in_dt == MPT_DT_BF16 ? "mpt_f2b" : "";
    const char *ty = in_dt == MPT_DT_F16 ? "f16" : in_dt == MPT_DT_BF16 ? "bf16" : "tf32";
    mpt_cu_phase ph[MPT_CU_MAX_PHASES];
    int64_t m_tiles, k_max, kspan;
    int n_ph = mpt_cu_gemm_phases(&qq, t.bm, ph, &m_tiles, &k_max);
    e->row_map = q->phased;
    int64_t tiles = m_tiles * ((q->n + t.bn - 1) / t.bn);
    int splits = mpt_cu_gemm_splits(tiles, (k_max + BK - 1) / BK, &kspan);
    kspan *= BK;
    if (splits > 1) {
        out->scratch_bytes = (size_t)(q->m * q->n) * 4 * (size_t)splits;
        out->counter_bytes = (size_t)tiles * 4;
    }
    /* registers for two 256-thread blocks or three 128-thread blocks on an
     * SM (64K registers: 128 and 170 a thread); 64 accumulators, 24
     * fragment words and the loaders' indices fit in 128 but for a long
     * epilogue (a 128-thread block's relu gradient spilled 4 bytes) */
    /* TF32 takes more: its fragments are read and rounded element by
     * element (the 256-thread kernel spilled at 128), and its f32 tiles
     * (77-106 KiB) leave room for two blocks an SM at most: 255 for the
     * 128-thread kernel, and the 256-thread one is given one block an SM */
    snprintf(e->launch_bounds, sizeof e->launch_bounds, "__launch_bounds__(%d, %d)", t.threads,
             t.wg ? (t.threads == 512 ? 1 : 2)
             : t.es == 4 ? (t.threads == 256 ? 1 : 2) : t.threads == 256 ? 2 : 3);
    mpt_cu_signature(e, out);
    mpt_sb_printf(e->sb, " {\n");
    e->indent = 1;
    L("/* C[%lld,%lld] = A[%lld,%lld] B[%lld,%lld] (%s) */", (long long)q->m, (long long)q->n,
      (long long)q->m, (long long)q->k, (long long)q->k, (long long)q->n, mpt_op_name(q->op));
    mpt_cu_gemm_tile_ids(e, m_tiles, (q->n + t.bn - 1) / t.bn, out);
    if (t.wg)
        L("/* %dx%d block tile, %d warpgroups of 64x%d (wgmma), k step %d in %d stages; A %s "
          "%s-major, B %s %s-major */", t.bm, t.bn, t.threads / 128, t.bn, BK, ns,
          t.direct[0] ? "cp.async" : "by element", t.kc[0] ? "K" : "M",
          t.direct[1] ? "cp.async" : "by element", t.kc[1] ? "K" : "N");
    else
        L("/* %dx%d block tile, %d warps of %dx%d, k step %d in %d stages; A %s [%s], B %s [%s] "
          "*/", t.bm, t.bn, t.threads / 32, WM, WN, BK, ns,
          t.direct[0] ? "cp.async" : "by element", t.kc[0] ? "m][k" : "k][m",
          t.direct[1] ? "cp.async" : "by element", t.kc[1] ? "n][k" : "k][n");
    mpt_cu_gemm_emit_sizes(e, q, ph, n_ph);
    L("extern __shared__ __align__(16) unsigned char mpt_smem[];");
    const char *elem = t.es == 4 ? "float" : "unsigned short";
    if (t.wg) {
        L("typedef %s mpt_tile_a[%d];", elem, tile_elems(&t, 0));
        L("typedef %s mpt_tile_b[%d];", elem, tile_elems(&t, 1));
        L("/* a shared-memory matrix descriptor: start, leading byte offset (the next core");
        L(" * matrix along k) 128, stride byte offset (the next along m or n) %d, no swizzle */",
          BK / 8 * 128);
        L("auto mpt_wg_desc = [](const void *p) -> unsigned long long {");
        L("    const unsigned a = (unsigned)__cvta_generic_to_shared(p);");
        L("    return (unsigned long long)((a >> 4) & 0x3fff) | (unsigned long long)(128 >> 4) << "
          "16 |");
        L("           (unsigned long long)(%d >> 4) << 32;", BK / 8 * 128);
        L("};");
    } else {
        L("typedef %s mpt_tile_a[%d][%d];", elem, t.rows[0], t.cols[0]);
        L("typedef %s mpt_tile_b[%d][%d];", elem, t.rows[1], t.cols[1]);
    }
    if (t.es == 4) {
        L("/* f32 to TF32: round to nearest, ties away, to a 10-bit mantissa */");
        L("auto mpt_tf32 = [](float f) -> unsigned {");
        L("    unsigned r; asm(\"cvt.rna.tf32.f32 %%0, %%1;\" : \"=r\"(r) : \"f\"(f)); return r;");
        L("};");
    }
    L("mpt_tile_a *As = (mpt_tile_a *)mpt_smem;");
    L("mpt_tile_b *Bs = (mpt_tile_b *)(mpt_smem + %d * sizeof(mpt_tile_a));", ns);
    L("const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;");
    L("const int g = lane >> 2, q4 = lane & 3;");
    if (t.wg) L("const int wgi = warp >> 2, wr = wgi * 64 + (warp & 3) * 16;");
    else
        L("const int wm = (warp / %d) * %d, wn = (warp %% %d) * %d;", t.warps_n, WM, t.warps_n,
          WN);
    L("const %s bm = %s(%s)mpt_tm%s * %d, bn = (%s)mpt_tn * %d;", q->ity,
      q->phased ? "(" : "", q->ity, q->phased ? " - ph_t0)" : "", t.bm, q->ity, t.bn);
    L("const %s kbeg = (%s)blockIdx.z * %lld;", q->ity, q->ity, (long long)kspan);
    L("const int steps = (int)((min(K_, kbeg + %lld) - kbeg + %d) / %d);", (long long)kspan,
      BK - 1, BK);
    if (t.wg) L("float acc[%d];", t.bn / 2);
    else L("float acc[4][4][4];");
    L("#pragma unroll");
    L("for (int i = 0; i < %d; i++) (&acc[0]%s)[i] = 0.f;", t.wg ? t.bn / 2 : 64,
      t.wg ? "" : "[0][0]");
    L("auto load = [&](int s, %s k0) {", q->ity);
    e->indent++;
    int mark = mpt_cu_mark(e);
    load_operand(e, q, &t, 0, conv);
    load_operand(e, q, &t, 1, conv);
    mpt_cu_release(e, mark);
    e->indent--;
    L("};");
    L("/* the first stages in flight, then one stage in, one more out */");
    L("#pragma unroll");
    L("for (int s = 0; s < %d; s++) {", ahead);
    L("    if (s < steps) load(s, kbeg + s * %d);", BK);
    L("    mpt_cp_commit();");
    L("}");
    L("for (int kt = 0; kt < steps; kt++) {");
    e->indent++;
    L("mpt_cp_wait<%d>(); /* this thread's copies of stage kt have landed */", ahead - 1);
    if (t.wg) L("asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\"); /* for wgmma */");
    L("__syncthreads();   /* everyone's have, and stage kt - %d is free */", ns - ahead);
    L("const int next = kt + %d;", ahead);
    L("if (next < steps) load(next %% %d, kbeg + (%s)next * %d);", ns, q->ity, BK);
    L("mpt_cp_commit();");
    L("const int s = kt %% %d;", ns);
    if (t.es == 4) mma_stage_tf32(e, &t);
    else if (t.wg) wg_stage(e, &t, ty);
    else mma_stage(e, &t, ty);
    e->indent--;
    L("}");
    if (t.wg) wg_wait(e, &t, 0);
    e->wg_n = t.wg ? t.bn : 0;
    if (t.wg) mpt_cu_gemm_finish(e, q, splits, wg_each, wg_each_pair);
    else mpt_cu_gemm_finish(e, q, splits, mma_each, mma_each_pair);
    mpt_sb_printf(e->sb, "}\n");
    out->tensor_cores = 1;
    out->wgmma = t.wg;
    out->tf32 = t.es == 4;
    out->phases = q->phased ? n_ph : 0;
    out->tile_m = t.bm, out->tile_n = t.bn;
    out->block[0] = (unsigned)t.threads;
    out->grid[2] = (unsigned)splits;
    out->shared_bytes = (unsigned)(ns * (tile_elems(&t, 0) + tile_elems(&t, 1)) * t.es);
}
