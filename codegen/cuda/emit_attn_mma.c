/* codegen/cuda/emit_attn_mma.c — the fused attention kernels on Tensor
 * Cores (FlashAttention-2): f16/bf16 q, k, v with head sizes E, Ev
 * multiples of 16 up to 128 (o and do of any float dtype: an f32 do, as an
 * f32_out attention's gradient is, is rounded to the compute dtype as it
 * enters its tile); emit_attn.c's SIMT kernels take the rest.
 *
 * Every product is mma.sync.m16n8k16 with f32 accumulators, its operands
 * read from shared tiles by ldmatrix as emit_mma.c reads them: a tile
 * [rows][E + 8] holds rows of a [B, H, T, E] operand (8 elements of
 * padding put the 8 rows one ldmatrix reads in different banks), copied
 * in by cp.async, rows past T as zeros. A warp computes 16 rows. The
 * accumulator of an m16n8 block (lane 4g + q4: rows g and g + 8, columns
 * 2 q4 and 2 q4 + 1) is, pair by pair, the A fragment of m16n8k16 for the
 * next product (two n blocks are one k step of 16): so the probabilities
 * (and ds) go from one mma to the next in registers, rounded to the
 * compute dtype there; the scores, the softmax's statistics and every sum
 * stay f32.
 *
 *   forward:  a block (4 warps) per 64 query rows of a (batch, head); each
 *             warp's q fragments read once; per block of 64 keys (those
 *             wholly after the causal diagonal skipped) k and v staged in
 *             shared memory, two stages (the next block's copies in
 *             flight during this one's work), s = q k^T by mma, scaled and masked, the
 *             online softmax on the accumulators (row maximum over the 4
 *             lanes of a row by __shfl_xor_sync, the running sum kept per
 *             lane and reduced at the end), dropout's factor from the same
 *             bits as the SIMT kernel, o += p v with v read by
 *             ldmatrix.trans; then o / l and lse = m + log l.
 *   backward: one launch, two kinds of block. A block per 64 keys keeps
 *             dk and dv in registers over the query blocks that see its
 *             keys: s^T = k q^T and dp^T = v do^T by mma, p from lse,
 *             dv += p'^T do, ds = p (d dp - D) scale, dk += ds^T q. A
 *             block per 64 queries does dq += ds k the same way over the
 *             key blocks. D_i = do_i.o_i (f32) is computed per block from
 *             o and do; no atomics, no [T, T] matrix.
 * Keys a row does not see (causal, past Tk) have score -inf, so p is 0
 * there as when the SIMT kernel skips them; masked scores are -1e9. The
 * backward's inner blocks (the query blocks of a key block, the key
 * blocks of a query block) are 32 rows for heads over 32, whose dk and dv
 * accumulators leave less room in 255 registers; their tiles (and the
 * query rows' lse and D) come in two stages as the forward's.
 */
#include <stdio.h>

#include "codegen/cuda/cuda_internal.h"

#define L(...) mpt_cu_line(e, __VA_ARGS__)

enum { ROWS = 64, THREADS = 128 };

int mpt_cu_attn_mma_fits(const mpt_cu_attn *a, const mpt_node *nd, int backward) {
    const mpt_cu_em *e = a->e;
    mpt_dtype dt = e->g->nodes[nd->in[0]].dtype;
    if (dt != MPT_DT_F16 && dt != MPT_DT_BF16) return 0;
    if (a->E % 16 || a->Ev % 16 || a->E > 128 || a->Ev > 128) return 0;
    /* q, k, v in one dtype; the backward's o and do of any float dtype
     * (o read element by element for D, an f32 do rounded into the tile) */
    for (int i = 0; i < (backward ? 5 : 3); i++)
        if ((i < 3 && e->g->nodes[nd->in[i]].dtype != dt) || e->param_of[nd->in[i]] < 0) return 0;
    return 1;
}

/* mma.sync, ldmatrix and the packing of two floats into an A register */
static void helpers(mpt_cu_em *e, mpt_dtype dt) {
    const char *ty = dt == MPT_DT_BF16 ? "bf16" : "f16", *cv = mpt_cu_attn_store_fn(dt);
    mpt_sb_printf(e->sb,
        "/* d += a b: one m16n8k16 mma.sync, f32 accumulators */\n"
        "__device__ __forceinline__ void mpt_mma16(float *d, const unsigned *a, unsigned b0, "
        "unsigned b1) {\n"
        "    asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.%s.%s.f32 "
        "{%%0,%%1,%%2,%%3}, {%%4,%%5,%%6,%%7}, {%%8,%%9}, {%%0,%%1,%%2,%%3};\"\n"
        "        : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])\n"
        "        : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b0), \"r\"(b1));\n}\n"
        "/* four 8x8 matrices of 16-bit elements: lanes 8j..8j+7 address the rows of matrix j */\n"
        "__device__ __forceinline__ void mpt_ldsm(unsigned *r, const void *p) {\n"
        "    const unsigned a = (unsigned)__cvta_generic_to_shared(p);\n"
        "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%%0,%%1,%%2,%%3}, [%%4];\"\n"
        "        : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(a));\n}\n"
        "__device__ __forceinline__ void mpt_ldsm_t(unsigned *r, const void *p) {\n"
        "    const unsigned a = (unsigned)__cvta_generic_to_shared(p);\n"
        "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%%0,%%1,%%2,%%3}, "
        "[%%4];\"\n"
        "        : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(a));\n}\n"
        "/* two f32 values rounded to %s, the lower column in the low half */\n"
        "__device__ __forceinline__ unsigned mpt_pack2(float lo, float hi) {\n"
        "    return (unsigned)%s(lo) | (unsigned)%s(hi) << 16;\n}\n",
        ty, ty, ty, cv, cv);
}

/* cp.async of rows [r0, r0 + rows) of head bh of parameter p ([.., T, D])
 * into the shared tile dst; rows past T are zeros */
static void tile_load(const mpt_cu_attn *a, const char *dst, int p, const char *r0, long long T,
                      long long D, int rows) {
    mpt_cu_em *e = a->e;
    long long per = D / 8;
    char t[64], row[128];
    snprintf(t, sizeof t, "(gr < %lldLL ? gr : 0)", T);
    L("for (int c = threadIdx.x; c < %lld; c += %d) {", rows * per, THREADS);
    e->indent++;
    L("const int r = c / %lld, x = c %% %lld * 8;", per, per);
    L("const long long gr = %s + r;", r0);
    L("mpt_cp16(&%s[r][x], p%d + (%s + x), gr < %lldLL);", dst, p,
      mpt_cu_attn_row(a, row, sizeof row, t, T, D), T);
    e->indent--;
    L("}");
}

/* The same tile from a buffer of another dtype (an f32 do): element by
 * element through the registers, rounded to the compute dtype (cv) */
static void tile_load_cvt(const mpt_cu_attn *a, const char *dst, int p, mpt_dtype src_dt,
                          const char *cv, const char *r0, long long T, long long D, int rows) {
    mpt_cu_em *e = a->e;
    char v[192], ix[144], row[128];
    snprintf(ix, sizeof ix, "%s + x", mpt_cu_attn_row(a, row, sizeof row, "gr", T, D));
    mpt_cu_attn_load(v, sizeof v, src_dt, p, ix);
    L("for (int c = threadIdx.x; c < %lld; c += %d) {", rows * D, THREADS);
    e->indent++;
    L("const int r = c / %lld, x = c %% %lld;", D, D);
    L("const long long gr = %s + r;", r0);
    L("%s[r][x] = %s(gr < %lldLL ? %s : 0.0f);", dst, cv, T, v);
    e->indent--;
    L("}");
}

/* acc[nb][4] += A B^T over k16 steps of 16: A the warp's 16 rows from
 * tile `at` (its rows warp * 16 on) or the registers `areg`[k16][4], B
 * the nb * 8 rows of tile `bt` ([n][k]: ldmatrix without .trans) */
static void mm_nt(mpt_cu_em *e, const char *acc, int nb, const char *at, const char *areg,
                  const char *bt, long long k16) {
    L("#pragma unroll");
    L("for (int kk = 0; kk < %lld; kk++) {", k16);
    e->indent++;
    if (areg) {
        L("const unsigned *a = %s[kk];", areg);
    } else {
        L("unsigned a[4];");
        L("mpt_ldsm(a, &%s[warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][kk * 16 + (lane >> 4) "
          "* 8]);", at);
    }
    L("#pragma unroll");
    L("for (int np = 0; np < %d; np++) {", nb / 2);
    e->indent++;
    L("unsigned b[4];");
    L("mpt_ldsm(b, &%s[np * 16 + (lane & 7) + (lane >> 4) * 8][kk * 16 + ((lane >> 3) & 1) * 8]);",
      bt);
    L("mpt_mma16(%s[2 * np], a, b[0], b[1]);", acc);
    L("mpt_mma16(%s[2 * np + 1], a, b[2], b[3]);", acc);
    e->indent--;
    L("}");
    e->indent--;
    L("}");
}

/* acc[nb][4] += P B over k16 steps: P the accumulators `src` (16 rows x
 * k16 * 16 columns) rounded to the compute dtype as A fragments, B the
 * tile `bt` ([k][n]: ldmatrix.trans) */
static void mm_pv(mpt_cu_em *e, const char *acc, long long nb, const char *src, const char *bt,
                  long long k16) {
    L("#pragma unroll");
    L("for (int kk = 0; kk < %lld; kk++) {", k16);
    e->indent++;
    L("const unsigned a[4] = {mpt_pack2(%s[2 * kk][0], %s[2 * kk][1]), "
      "mpt_pack2(%s[2 * kk][2], %s[2 * kk][3]),", src, src, src, src);
    L("                      mpt_pack2(%s[2 * kk + 1][0], %s[2 * kk + 1][1]), "
      "mpt_pack2(%s[2 * kk + 1][2], %s[2 * kk + 1][3])};", src, src, src, src);
    L("#pragma unroll");
    L("for (int np = 0; np < %lld; np++) {", nb / 2);
    e->indent++;
    L("unsigned b[4];");
    L("mpt_ldsm_t(b, &%s[kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][np * 16 + (lane >> 4) * 8]);",
      bt);
    L("mpt_mma16(%s[2 * np], a, b[0], b[1]);", acc);
    L("mpt_mma16(%s[2 * np + 1], a, b[2], b[3]);", acc);
    e->indent--;
    L("}");
    e->indent--;
    L("}");
}

static void zero(mpt_cu_em *e, const char *acc, long long nb) {
    L("float %s[%lld][4];", acc, nb);
    L("#pragma unroll");
    L("for (int n = 0; n < %lld; n++) %s[n][0] = %s[n][1] = %s[n][2] = %s[n][3] = 0.0f;", nb, acc,
      acc, acc, acc);
}

/* The loop over the accumulators' elements of nb blocks: the query row
 * ir and key jr (the accumulator's row is the query, or the key where
 * rows_are_keys), `valid` (a key the row sees), i and j (clamped into the
 * matrices), vis and dfac */
static void each_open(mpt_cu_attn *a, long long nb, int rows_are_keys) {
    mpt_cu_em *e = a->e;
    const char *row = "warp * 16 + g + (h >> 1) * 8", *col = "ni * 8 + 2 * q4 + (h & 1)";
    L("#pragma unroll");
    L("for (int ni = 0; ni < %lld; ni++)", nb);
    L("#pragma unroll");
    L("for (int h = 0; h < 4; h++) {");
    e->indent++;
    L("const long long ir = i0 + %s, jr = j0 + %s;", rows_are_keys ? col : row,
      rows_are_keys ? row : col);
    L("const int valid = ir < %lldLL && jr < %lldLL%s;", (long long)a->Tq, (long long)a->Tk,
      a->causal ? " && jr <= ir" : "");
    L("const long long i = valid ? ir : 0, j = valid ? jr : 0;");
    mpt_cu_attn_mask_drop(a);
}

static void each_close(mpt_cu_em *e) {
    e->indent--;
    L("}");
}

/* the dynamic shared memory: a kernel's typedefs of tile rows */
static void smem_rows(mpt_cu_em *e, const mpt_cu_attn *a) {
    L("extern __shared__ __align__(16) unsigned char mpt_smem[];");
    L("typedef unsigned short mpt_rq[%lld]; /* a row of q or k, 16 bytes of padding */",
      (long long)a->E + 8);
    L("typedef unsigned short mpt_rv[%lld]; /* a row of v or do */", (long long)a->Ev + 8);
    L("const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q4 = lane & 3;");
}

static void wait_tiles(mpt_cu_em *e) {
    L("mpt_cp_commit();");
    L("mpt_cp_wait<0>();");
    L("__syncthreads();");
}

/* the keys [0, jend) some query of the block [i0, i0 + 64) sees */
static void key_end(mpt_cu_em *e, const mpt_cu_attn *a) {
    long long tk = (long long)a->Tk, tq = (long long)a->Tq;
    if (a->causal)
        L("const long long jend = min(%lldLL, min(i0 + %d, %lldLL));", tk, ROWS, tq);
    else L("const long long jend = %lldLL;", tk);
}

static int emit_forward(mpt_cu_attn *a, mpt_cuda_kernel_src *out, int o_node, int lse_node) {
    mpt_cu_em *e = a->e;
    const mpt_graph *g = e->g;
    const mpt_node *nd = &g->nodes[o_node];
    int qp = e->param_of[nd->in[0]], kp = e->param_of[nd->in[1]], vp = e->param_of[nd->in[2]];
    mpt_dtype dt = g->nodes[nd->in[0]].dtype;
    long long E = a->E, Ev = a->Ev, Tq = a->Tq, Tk = a->Tk;
    long long nqb = (Tq + ROWS - 1) / ROWS;
    helpers(e, dt);
    /* two blocks an SM at least (255 registers a thread): with the bound
     * on threads alone ptxas kept 128 registers and spilled 16 bytes, with
     * three blocks (170) 24 bytes (heads of 64 with dropout, sm_90: the
     * mask and dropout's 64-bit hash of 32 scores a lane, unrolled) */
    snprintf(e->launch_bounds, sizeof e->launch_bounds, "__launch_bounds__(%d, 2)", THREADS);
    mpt_cu_signature(e, out);
    mpt_sb_printf(e->sb, " {\n");
    e->indent = 1;
    L("/* o [B,H,Tq,%lld], lse [B,H,Tq] of q [B,H,Tq,%lld], k [B,H,Tk,%lld], v [B,H,Tk,%lld]; "
      "Tq %lld, Tk %lld: block x = bh * %lld + (its 64 query rows) */", Ev, E, E, Ev, Tq, Tk, nqb);
    smem_rows(e, a);
    int stage = ROWS * (int)(E + 8 + Ev + 8) * 2;
    L("/* two stages of a key block's k and v tiles (%d bytes each), the next block's copies in "
      "flight while this one's are used; q's tile is stage 1's k at first */", stage);
    L("mpt_rq *Qs = (mpt_rq *)(mpt_smem + %d);", stage);
    L("const long long bh = blockIdx.x / %lld, b = bh / %lldLL, i0 = (long long)(blockIdx.x %% "
      "%lld) * %d;", nqb, (long long)a->H, nqb, ROWS);
    mpt_cu_attn_drop_key(a);
    key_end(e, a);
    tile_load(a, "Qs", qp, "i0", Tq, E, ROWS);
    L("{");
    e->indent++;
    L("mpt_rq *Kn = (mpt_rq *)mpt_smem;");
    L("mpt_rv *Vn = (mpt_rv *)(mpt_smem + %d * sizeof(mpt_rq));", ROWS);
    tile_load(a, "Kn", kp, "0", Tk, E, ROWS);
    tile_load(a, "Vn", vp, "0", Tk, Ev, ROWS);
    e->indent--;
    L("}");
    wait_tiles(e);
    L("unsigned qf[%lld][4];", E / 16);
    L("#pragma unroll");
    L("for (int kk = 0; kk < %lld; kk++)", E / 16);
    L("    mpt_ldsm(qf[kk], &Qs[warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][kk * 16 + (lane "
      ">> 4) * 8]);");
    L("/* rows g and g + 8: the running maximum m, the lane's part of the sum l */");
    L("float m[2] = {__int_as_float(0xff800000), __int_as_float(0xff800000)}, l[2] = {0.0f, "
      "0.0f};");
    zero(e, "o", Ev / 8);
    L("for (long long j0 = 0; j0 < jend; j0 += %d) {", ROWS);
    e->indent++;
    L("const int st = (int)(j0 / %d) & 1;", ROWS);
    L("__syncthreads(); /* every warp is done with the stage (or q's tile) the next copies overwrite */");
    L("if (j0 + %d < jend) {", ROWS);
    e->indent++;
    L("mpt_rq *Kn = (mpt_rq *)(mpt_smem + (st ^ 1) * %d);", stage);
    L("mpt_rv *Vn = (mpt_rv *)((unsigned char *)Kn + %d * sizeof(mpt_rq));", ROWS);
    tile_load(a, "Kn", kp, "j0 + 64", Tk, E, ROWS);
    tile_load(a, "Vn", vp, "j0 + 64", Tk, Ev, ROWS);
    e->indent--;
    L("}");
    L("mpt_cp_commit();");
    L("mpt_cp_wait<1>(); /* this thread's copies of this block have landed */");
    L("__syncthreads();  /* and everyone's */");
    L("mpt_rq *Ks = (mpt_rq *)(mpt_smem + st * %d);", stage);
    L("mpt_rv *Vs = (mpt_rv *)((unsigned char *)Ks + %d * sizeof(mpt_rq));", ROWS);
    zero(e, "s", ROWS / 8);
    mm_nt(e, "s", ROWS / 8, NULL, "qf", "Ks", E / 16);
    int keep = a->zero_masked || a->drop_below;
    if (keep) L("unsigned z = 0u; /* bit 4 ni + h: the probability is kept (not zeroed, not dropped) */");
    each_open(a, ROWS / 8, 0);
    L("s[ni][h] = !valid ? __int_as_float(0xff800000) : vis ? s[ni][h] * %.9ef : -1e9f;",
      (double)(float)a->scale);
    if (keep)
        L("z |= (unsigned)(%sdfac != 0.0f) << (ni * 4 + h);", a->zero_masked ? "vis && " : "");
    each_close(e);
    L("float mx[2] = {m[0], m[1]};");
    L("#pragma unroll");
    L("for (int ni = 0; ni < %d; ni++)", ROWS / 8);
    L("#pragma unroll");
    L("for (int h = 0; h < 4; h++) mx[h >> 1] = fmaxf(mx[h >> 1], s[ni][h]);");
    L("float al[2], mb[2];");
    L("#pragma unroll");
    L("for (int r = 0; r < 2; r++) {");
    e->indent++;
    L("mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));");
    L("mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));");
    L("mb[r] = mx[r] == __int_as_float(0xff800000) ? 0.0f : mx[r]; /* no key seen yet */");
    L("al[r] = expf(m[r] - mb[r]);");
    L("m[r] = mx[r];");
    L("l[r] *= al[r];");
    e->indent--;
    L("}");
    L("#pragma unroll");
    L("for (int ni = 0; ni < %d; ni++)", ROWS / 8);
    L("#pragma unroll");
    L("for (int h = 0; h < 4; h++) {");
    e->indent++;
    L("const float p = expf(s[ni][h] - mb[h >> 1]);");
    L("l[h >> 1] += p;");
    if (keep) {
        char f[32] = "";
        if (a->drop_below) snprintf(f, sizeof f, " * %.9ef", (double)a->drop_scale);
        L("s[ni][h] = (z >> (ni * 4 + h) & 1u) ? p%s : 0.0f;", f);
    } else {
        L("s[ni][h] = p;");
    }
    e->indent--;
    L("}");
    L("#pragma unroll");
    L("for (int n = 0; n < %lld; n++)", Ev / 8);
    L("#pragma unroll");
    L("for (int h = 0; h < 4; h++) o[n][h] *= al[h >> 1];");
    mm_pv(e, "o", Ev / 8, "s", "Vs", ROWS / 16);
    e->indent--;
    L("}");
    const mpt_node *o = &g->nodes[o_node];
    L("#pragma unroll");
    L("for (int r = 0; r < 2; r++) {");
    e->indent++;
    L("l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);");
    L("l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);");
    L("const long long i = i0 + warp * 16 + g + r * 8;");
    L("if (i >= %lldLL) continue;", Tq);
    L("const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;");
    L("#pragma unroll");
    L("for (int n = 0; n < %lld; n++)", Ev / 8);
    L("#pragma unroll");
    L("for (int c = 0; c < 2; c++)");
    char at[128];
    L("    p%d[%s + n * 8 + 2 * q4 + c] = %s(o[n][2 * r + c] * inv);", e->param_of[o_node],
      mpt_cu_attn_row(a, at, sizeof at, "i", Tq, Ev), mpt_cu_attn_store_fn(o->dtype));
    if (lse_node >= 0)
        L("if (q4 == 0) p%d[bh * %lldLL + i] = m[r] + logf(l[r]);", e->param_of[lse_node], Tq);
    e->indent--;
    L("}");
    mpt_sb_printf(e->sb, "}\n");
    out->block[0] = THREADS;
    out->grid[0] = (unsigned)(a->B * a->H * nqb);
    out->shared_bytes = (unsigned)(2 * stage);
    out->tensor_cores = 1;
    return 0;
}

/* ls[r], ds[r] for the `rows` query rows from i0: lse_i and D_i =
 * do_i.o_i in f32 (0 past Tq) */
static void row_stats(mpt_cu_attn *a, const mpt_node *nd, int rows, const char *i0,
                      const char *ls, const char *ds) {
    mpt_cu_em *e = a->e;
    const mpt_graph *g = e->g;
    long long Tq = a->Tq, Ev = a->Ev;
    char dov[192], ov[192], ix[144], row[128];
    snprintf(ix, sizeof ix, "%s + x", mpt_cu_attn_row(a, row, sizeof row, "i", Tq, Ev));
    mpt_cu_attn_load(dov, sizeof dov, g->nodes[nd->in[4]].dtype, e->param_of[nd->in[4]], ix);
    mpt_cu_attn_load(ov, sizeof ov, g->nodes[nd->in[3]].dtype, e->param_of[nd->in[3]], ix);
    L("for (int r = threadIdx.x; r < %d; r += %d) {", rows, THREADS);
    e->indent++;
    L("const long long i = %s + r;", i0);
    L("float D = 0.0f, lse = 0.0f;");
    L("if (i < %lldLL) {", Tq);
    L("    for (int x = 0; x < %lld; x++) D += %s * %s;", Ev, dov, ov);
    L("    lse = p%d[bh * %lldLL + i];", e->param_of[nd->in[5]], Tq);
    L("}");
    L("%s[r] = lse;", ls);
    L("%s[r] = D;", ds);
    e->indent--;
    L("}");
}

/* rows `r0` + warp * 16 + g (+ 8) of the accumulators acc[nb][4] into
 * grad node `node` ([B,H,T,D]), rows below T */
static void store_rows(const mpt_cu_attn *a, int node, const char *acc, const char *r0, long long T,
                       long long D) {
    mpt_cu_em *e = a->e;
    char at[128];
    L("#pragma unroll");
    L("for (int r = 0; r < 2; r++) {");
    e->indent++;
    L("const long long row = %s + warp * 16 + g + r * 8;", r0);
    L("if (row >= %lldLL) continue;", T);
    L("#pragma unroll");
    L("for (int n = 0; n < %lld; n++)", D / 8);
    L("#pragma unroll");
    L("for (int c = 0; c < 2; c++)");
    L("    p%d[%s + n * 8 + 2 * q4 + c] = %s(%s[n][2 * r + c]);", e->param_of[node],
      mpt_cu_attn_row(a, at, sizeof at, "row", T, D), mpt_cu_attn_store_fn(e->g->nodes[node].dtype), acc);
    e->indent--;
    L("}");
}

/* p from the score s (the accumulator `sv`) and the row's lse, then
 * ds = p (dfac dp - D) scale into `dsv` (dp read from it) */
static void p_and_ds(mpt_cu_attn *a, const char *sv, const char *lse, const char *dsv,
                     const char *D) {
    mpt_cu_em *e = a->e;
    L("const float p = valid ? expf((vis ? %s * %.9ef : -1e9f) - %s) : 0.0f;", sv,
      (double)(float)a->scale, lse);
    L("%s = valid && vis ? p * (dfac * %s - %s) * %.9ef : 0.0f;", dsv, dsv, D,
      (double)(float)a->scale);
}

/* T3<sfx>, T4<sfx>, Ls<sfx>, Ds<sfx>: the tiles and statistics of stage
 * `st` (an expression) of the backward's inner blocks */
static void stage_ptrs(mpt_cu_em *e, const char *sfx, const char *st, int stage, int bs) {
    L("mpt_rq *T3%s = (mpt_rq *)(stages + (%s) * %d);", sfx, st, stage);
    L("mpt_rv *T4%s = (mpt_rv *)((unsigned char *)T3%s + %d * sizeof(mpt_rq));", sfx, sfx, bs);
    L("float *Ls%s = (float *)((unsigned char *)T4%s + %d * sizeof(mpt_rv)), *Ds%s = Ls%s + %d;",
      sfx, sfx, bs, sfx, sfx, ROWS);
}

/* the copies of stage stg landed for every thread, and its pointers */
static void next_stage(mpt_cu_em *e, int stage, int bs) {
    L("mpt_cp_commit();");
    L("mpt_cp_wait<1>(); /* this thread's copies of this block have landed */");
    L("__syncthreads();  /* and everyone's, and the statistics */");
    stage_ptrs(e, "", "stg", stage, bs);
}

static int emit_backward(mpt_cu_attn *a, mpt_cuda_kernel_src *out, const int *grad) {
    mpt_cu_em *e = a->e;
    const mpt_graph *g = e->g;
    const mpt_node *nd = &g->nodes[grad[0] >= 0 ? grad[0] : grad[1] >= 0 ? grad[1] : grad[2]];
    int qp = e->param_of[nd->in[0]], kp = e->param_of[nd->in[1]], vp = e->param_of[nd->in[2]];
    int dop = e->param_of[nd->in[4]];
    mpt_dtype dt = g->nodes[nd->in[0]].dtype, dodt = g->nodes[nd->in[4]].dtype;
    long long E = a->E, Ev = a->Ev, Tq = a->Tq, Tk = a->Tk;
    /* the inner blocks: 32 rows where wider heads' accumulators take the
     * registers (heads of 64 with 64-row blocks took all 255 with dropout) */
    int bs = E > 32 || Ev > 32 ? 32 : 64;
    long long nkb = (Tk + ROWS - 1) / ROWS, nqb = (Tq + ROWS - 1) / ROWS, bhn = a->B * a->H;
    long long n_kv = grad[1] >= 0 || grad[2] >= 0 ? bhn * nkb : 0;
    long long n_q = grad[0] >= 0 ? bhn * nqb : 0;
    helpers(e, dt);
    /* the thread count alone: with two blocks an SM ptxas took all 255
     * registers for gpt_tiny's heads of 32 (168 without) */
    snprintf(e->launch_bounds, sizeof e->launch_bounds, "__launch_bounds__(%d)", THREADS);
    mpt_cu_signature(e, out);
    mpt_sb_printf(e->sb, " {\n");
    e->indent = 1;
    L("/* dq [B,H,Tq,%lld], dk [B,H,Tk,%lld], dv [B,H,Tk,%lld]; Tq %lld, Tk %lld. Blocks x < "
      "%lld: dk, dv of 64 keys (bh * %lld + key block); the rest dq of 64 queries (bh * %lld + "
      "query block) */", E, E, Ev, Tq, Tk, n_kv, nkb, nqb);
    smem_rows(e, a);
    int stage = bs * (int)(E + 8 + Ev + 8) * 2 + 2 * ROWS * 4;
    L("/* 64 rows of k (a key block) or q (a query block), 64 of v or do, then two stages (%d "
      "bytes each: the next inner block's copies in flight during this one's work) of %d rows "
      "of q or k, %d of do or v, 64 rows' lse and D */", stage, bs, bs);
    L("mpt_rq *T1 = (mpt_rq *)mpt_smem;");
    L("mpt_rv *T2 = (mpt_rv *)(mpt_smem + %d * sizeof(mpt_rq));", ROWS);
    L("unsigned char *const stages = mpt_smem + %d * (sizeof(mpt_rq) + sizeof(mpt_rv));", ROWS);
    mpt_cu_attn_drop_key(a);
    if (n_kv) {
        L("if (blockIdx.x < %lldu) {", n_kv);
        e->indent++;
        L("const long long bh = blockIdx.x / %lld, b = bh / %lldLL, j0 = (long long)(blockIdx.x %% "
          "%lld) * %d;", nkb, (long long)a->H, nkb, ROWS);
        tile_load(a, "T1", kp, "j0", Tk, E, ROWS);
        tile_load(a, "T2", vp, "j0", Tk, Ev, ROWS);
        zero(e, "dk", E / 8);
        zero(e, "dv", Ev / 8);
        /* causal: from the query block holding row j0, the rows before it
         * seeing none of these keys */
        char from[48] = "0";
        if (a->causal) snprintf(from, sizeof from, "j0 / %d * %d", bs, bs);
        L("const long long ibeg = %s;", from);
        L("if (ibeg < %lldLL) {", Tq);
        e->indent++;
        stage_ptrs(e, "n", "0", stage, bs);
        tile_load(a, "T3n", qp, "ibeg", Tq, E, bs);
        if (dodt == dt) tile_load(a, "T4n", dop, "ibeg", Tq, Ev, bs);
        else tile_load_cvt(a, "T4n", dop, dodt, mpt_cu_attn_store_fn(dt), "ibeg", Tq, Ev, bs);
        row_stats(a, nd, bs, "ibeg", "Lsn", "Dsn");
        e->indent--;
        L("}");
        L("mpt_cp_commit();");
        L("for (long long i0 = ibeg; i0 < %lldLL; i0 += %d) {", Tq, bs);
        e->indent++;
        L("const int stg = (int)((i0 - ibeg) / %d) & 1;", bs);
        L("__syncthreads(); /* every warp is done with the stage the next copies overwrite */");
        L("if (i0 + %d < %lldLL) {", bs, Tq);
        e->indent++;
        char nx[32];
        snprintf(nx, sizeof nx, "i0 + %d", bs);
        stage_ptrs(e, "n", "stg ^ 1", stage, bs);
        tile_load(a, "T3n", qp, nx, Tq, E, bs);
        if (dodt == dt) tile_load(a, "T4n", dop, nx, Tq, Ev, bs);
        else tile_load_cvt(a, "T4n", dop, dodt, mpt_cu_attn_store_fn(dt), nx, Tq, Ev, bs);
        row_stats(a, nd, bs, nx, "Lsn", "Dsn");
        e->indent--;
        L("}");
        next_stage(e, stage, bs);
        zero(e, "st", bs / 8);
        zero(e, "dpt", bs / 8);
        mm_nt(e, "st", bs / 8, "T1", NULL, "T3", E / 16);
        mm_nt(e, "dpt", bs / 8, "T2", NULL, "T4", Ev / 16);
        each_open(a, bs / 8, 1);
        L("const int c = ni * 8 + 2 * q4 + (h & 1);");
        p_and_ds(a, "st[ni][h]", "Ls[c]", "dpt[ni][h]", "Ds[c]");
        L("st[ni][h] = %sp * dfac;", a->zero_masked ? "(vis ? 1.0f : 0.0f) * " : "");
        each_close(e);
        if (grad[2] >= 0) mm_pv(e, "dv", Ev / 8, "st", "T4", bs / 16);
        if (grad[1] >= 0) mm_pv(e, "dk", E / 8, "dpt", "T3", bs / 16);
        e->indent--;
        L("}");
        /* causal keys past the last query (Tk > Tq): the loop never ran, so
         * nothing waited for k's and v's copies, and a block must not exit
         * with cp.async in flight into its shared memory */
        if (a->causal) L("mpt_cp_wait<0>();");
        if (grad[1] >= 0) store_rows(a, grad[1], "dk", "j0", Tk, E);
        if (grad[2] >= 0) store_rows(a, grad[2], "dv", "j0", Tk, Ev);
        L("return;");
        e->indent--;
        L("}");
    }
    if (n_q) {
        L("{");
        e->indent++;
        L("const long long t = blockIdx.x - %lldLL, bh = t / %lld, b = bh / %lldLL, i0 = t %% %lld "
          "* %d;", n_kv, nqb, (long long)a->H, nqb, ROWS);
        tile_load(a, "T1", qp, "i0", Tq, E, ROWS);
        if (dodt == dt) tile_load(a, "T2", dop, "i0", Tq, Ev, ROWS);
        else tile_load_cvt(a, "T2", dop, dodt, mpt_cu_attn_store_fn(dt), "i0", Tq, Ev, ROWS);
        L("{");
        e->indent++;
        /* the 64 rows' statistics in stage 1, whose tiles the first
         * loop's copies, after a barrier, are the first to overwrite */
        stage_ptrs(e, "n", "1", stage, bs);
        row_stats(a, nd, ROWS, "i0", "Lsn", "Dsn");
        e->indent--;
        L("}");
        zero(e, "dq", E / 8);
        key_end(e, a);
        L("{");
        e->indent++;
        stage_ptrs(e, "n", "0", stage, bs);
        tile_load(a, "T3n", kp, "0", Tk, E, bs);
        tile_load(a, "T4n", vp, "0", Tk, Ev, bs);
        e->indent--;
        L("}");
        wait_tiles(e);
        L("float lr[2], dr[2]; /* the warp's rows' lse and D */");
        L("{");
        e->indent++;
        stage_ptrs(e, "n", "1", stage, bs);
        L("lr[0] = Lsn[warp * 16 + g], lr[1] = Lsn[warp * 16 + g + 8];");
        L("dr[0] = Dsn[warp * 16 + g], dr[1] = Dsn[warp * 16 + g + 8];");
        e->indent--;
        L("}");
        L("for (long long j0 = 0; j0 < jend; j0 += %d) {", bs);
        e->indent++;
        L("const int stg = (int)(j0 / %d) & 1;", bs);
        L("__syncthreads(); /* every warp is done with the stage (or the statistics) the next copies overwrite */");
        L("if (j0 + %d < jend) {", bs);
        e->indent++;
        char nj[32];
        snprintf(nj, sizeof nj, "j0 + %d", bs);
        stage_ptrs(e, "n", "stg ^ 1", stage, bs);
        tile_load(a, "T3n", kp, nj, Tk, E, bs);
        tile_load(a, "T4n", vp, nj, Tk, Ev, bs);
        e->indent--;
        L("}");
        next_stage(e, stage, bs);
        zero(e, "s", bs / 8);
        zero(e, "dp", bs / 8);
        mm_nt(e, "s", bs / 8, "T1", NULL, "T3", E / 16);
        mm_nt(e, "dp", bs / 8, "T2", NULL, "T4", Ev / 16);
        each_open(a, bs / 8, 0);
        p_and_ds(a, "s[ni][h]", "lr[h >> 1]", "dp[ni][h]", "dr[h >> 1]");
        each_close(e);
        mm_pv(e, "dq", E / 8, "dp", "T3", bs / 16);
        e->indent--;
        L("}");
        store_rows(a, grad[0], "dq", "i0", Tq, E);
        e->indent--;
        L("}");
    }
    mpt_sb_printf(e->sb, "}\n");
    out->block[0] = THREADS;
    out->grid[0] = (unsigned)(n_kv + n_q);
    out->shared_bytes = (unsigned)(ROWS * (E + 8 + Ev + 8) * 2 + 2 * stage);
    out->tensor_cores = 1;
    return 0;
}

int mpt_cu_emit_attention_mma(mpt_cu_attn *a, mpt_cuda_kernel_src *out, int o, int lse,
                              const int *grad) {
    return o >= 0 ? emit_forward(a, out, o, lse) : emit_backward(a, out, grad);
}
