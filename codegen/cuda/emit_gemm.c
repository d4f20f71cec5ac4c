/* codegen/cuda/emit_gemm.c — GEMM and implicit-GEMM convolution kernels
 * with the whole fused epilogue applied to the f32 accumulators before the
 * store.
 *
 * One tiled kernel serves matmul and the three convolutions: only the
 * operand loaders differ. C[M,N] = A[M,K] B[K,N], output element (m, n) at
 * linear index m*N + n in every case:
 *   matmul            A = in0 (or in0^T), B = in1 (or in1^T)
 *   conv2d            M = batch*OH*OW, N = Cout, K = KH*KW*Cin; A = x patches, B = w [K, Cout]
 *   conv2d_bwd_data   M = batch*H*W,   N = Cin,  K = KH*KW*Cout; A = dy gathered, B = w^T per tap
 *   conv2d_bwd_filter M = KH*KW*Cin,   N = Cout, K = batch*OH*OW; A = x patches^T, B = dy [K, Cout]
 * f16/bf16 operands run on Tensor Cores (mma.sync.m16n8k16, f32
 * accumulation) from shared-memory tiles; f32 operands on a SIMT kernel in
 * true fp32. Operands are read through the element generators, so prologue
 * casts (f32 master weights to f16) happen while the tile is loaded.
 */
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cuda_internal.h"

typedef struct {
    mpt_op op;
    int64_t m, n, k;
    int a, b;             /* operand nodes */
    mpt_shape xs, ws, ys; /* conv: input image, filter, output image */
    int64_t sh, sw, ph, pw;
    int trans_a, trans_b;
} gemm_geom;

static gemm_geom geometry(const mpt_graph *g, int root) {
    const mpt_node *r = &g->nodes[root];
    gemm_geom q = {.op = r->op, .a = r->in[0], .b = r->in[1]};
    mpt_shape s0 = g->nodes[r->in[0]].shape, s1 = g->nodes[r->in[1]].shape;
    if (r->op == MPT_OP_MATMUL) {
        q.trans_a = (int)r->attr.i[0];
        q.trans_b = (int)r->attr.i[1];
        q.m = r->shape.dim[0];
        q.n = r->shape.dim[1];
        q.k = q.trans_a ? s0.dim[0] : s0.dim[1];
        return q;
    }
    q.sh = r->attr.i[0];
    q.sw = r->attr.i[1];
    q.ph = r->attr.i[2];
    q.pw = r->attr.i[3];
    if (r->op == MPT_OP_CONV2D) { q.xs = s0; q.ws = s1; q.ys = r->shape; }
    else if (r->op == MPT_OP_CONV2D_BWD_DATA) { q.ys = s0; q.ws = s1; q.xs = r->shape; }
    else { q.xs = s0; q.ys = s1; q.ws = r->shape; }
    int64_t nb = q.xs.dim[0], cin = q.ws.dim[2], cout = q.ws.dim[3];
    int64_t taps = q.ws.dim[0] * q.ws.dim[1];
    int64_t pix_in = q.xs.dim[1] * q.xs.dim[2], pix_out = q.ys.dim[1] * q.ys.dim[2];
    if (r->op == MPT_OP_CONV2D) { q.m = nb * pix_out; q.n = cout; q.k = taps * cin; }
    else if (r->op == MPT_OP_CONV2D_BWD_DATA) { q.m = nb * pix_in; q.n = cin; q.k = taps * cout; }
    else { q.m = taps * cin; q.n = cout; q.k = nb * pix_out; }
    return q;
}

#define L(...) mpt_cu_line(e, __VA_ARGS__)

/* Emits `dst = A(gm, gk)` (which 0) or `dst = B(gk, gn)` (which 1), zero
 * outside the matrix and in the convolution's padding. */
static void operand(mpt_cu_em *e, const gemm_geom *q, int which, const char *dst) {
    char idx[24], v[24];
    mpt_cu_fresh(e, "oi", idx);
    const char *valid = "true";
    long long H = q->xs.dim[1], W = q->xs.dim[2], C = q->ws.dim[2], CO = q->ws.dim[3];
    long long OH = q->ys.dim[1], OW = q->ys.dim[2], KW = q->ws.dim[1];
    int node = which ? q->b : q->a;
    if (q->op == MPT_OP_MATMUL) {
        if (which == 0)
            L("const long long %s = %s;", idx, q->trans_a ? "gk * M_ + gm" : "gm * K_ + gk");
        else
            L("const long long %s = %s;", idx, q->trans_b ? "gn * K_ + gk" : "gk * N_ + gn");
    } else if (which == 1 && q->op != MPT_OP_CONV2D_BWD_DATA) {
        L("const long long %s = gk * N_ + gn;", idx); /* w [K, Cout] or dy [K, Cout] */
    } else if (which == 1) {
        /* k = (tap, co), n = ci: w[tap][ci][co] */
        L("const long long %s = ((gk / %lld) * %lld + gn) * %lld + gk %% %lld;", idx, CO, C, CO, CO);
    } else if (q->op == MPT_OP_CONV2D || q->op == MPT_OP_CONV2D_BWD_FILTER) {
        /* pixel p (batch, oh, ow) and tap/channel t (kh, kw, ci) */
        const char *p = q->op == MPT_OP_CONV2D ? "gm" : "gk";
        const char *t = q->op == MPT_OP_CONV2D ? "gk" : "gm";
        L("const long long ob = %s / %lld, oy = %s / %lld %% %lld, ox = %s %% %lld;", p, OH * OW,
          p, OW, OH, p, OW);
        L("const long long ci = %s %% %lld, kx = %s / %lld %% %lld, ky = %s / %lld;", t, C, t, C,
          KW, t, C * KW);
        L("const long long iy = oy * %lld - %lld + ky, ix = ox * %lld - %lld + kx;",
          (long long)q->sh, (long long)q->ph, (long long)q->sw, (long long)q->pw);
        L("const bool ok = iy >= 0 && iy < %lld && ix >= 0 && ix < %lld;", H, W);
        L("const long long %s = ok ? ((ob * %lld + iy) * %lld + ix) * %lld + ci : 0;", idx, H, W,
          C);
        valid = "ok";
    } else {
        /* bwd data: m = (batch, iy, ix), k = (ky, kx, co); dy at oy = (iy + ph - ky) / sh */
        L("const long long ib = gm / %lld, iy = gm / %lld %% %lld, ix = gm %% %lld;", H * W, W, H,
          W);
        L("const long long co = gk %% %lld, kx = gk / %lld %% %lld, ky = gk / %lld;", CO, CO, KW,
          CO * KW);
        L("const long long ty = iy + %lld - ky, tx = ix + %lld - kx;", (long long)q->ph,
          (long long)q->pw);
        L("const bool ok = ty >= 0 && tx >= 0 && ty %% %lld == 0 && tx %% %lld == 0 && "
          "ty / %lld < %lld && tx / %lld < %lld;", (long long)q->sh, (long long)q->sw,
          (long long)q->sh, OH, (long long)q->sw, OW);
        L("const long long %s = ok ? ((ib * %lld + ty / %lld) * %lld + tx / %lld) * %lld + co : 0;",
          idx, OH, (long long)q->sh, OW, (long long)q->sw, CO);
        valid = "ok";
    }
    int mark = mpt_cu_mark(e);
    mpt_cu_value(e, node, idx, v);
    L("%s = %s ? (float)%s : 0.f;", dst, valid, v);
    mpt_cu_release(e, mark);
}

/* The tile loaders: A tile [BM][BK] and B tile [BN][BK] from global,
 * converted by conv into the shared tiles As, Bs. Consecutive threads read
 * consecutive k of A and consecutive n of B. The loop is left rolled: fully
 * unrolled (16 elements a thread, all loads in flight at once), the
 * convolutions' index arithmetic took 255 registers and spilled. */
static void load_tiles(mpt_cu_em *e, const gemm_geom *q, int bm, int bn, int bk, int threads,
                       const char *conv) {
    L("for (int t = threadIdx.x; t < %d; t += %d) {", bm * bk, threads);
    e->indent++;
    L("const int lm = t / %d, lk = t %% %d;", bk, bk);
    L("const long long gm = bm + lm, gk = k0 + lk;");
    L("float a = 0.f;");
    L("if (gm < M_ && gk < K_) {");
    e->indent++;
    operand(e, q, 0, "a");
    e->indent--;
    L("}");
    L("As[lm][lk] = %s(a);", conv);
    e->indent--;
    L("}");
    L("for (int t = threadIdx.x; t < %d; t += %d) {", bn * bk, threads);
    e->indent++;
    L("const int ln = t %% %d, lk = t / %d;", bn, bn);
    L("const long long gn = bn + ln, gk = k0 + lk;");
    L("float b = 0.f;");
    L("if (gn < N_ && gk < K_) {");
    e->indent++;
    operand(e, q, 1, "b");
    e->indent--;
    L("}");
    L("Bs[ln][lk] = %s(b);", conv);
    e->indent--;
    L("}");
}

/* The main loop over k: load the tiles at k0, multiply them (body). */
static void k_loop(mpt_cu_em *e, const gemm_geom *q, int bm, int bn, int bk, int threads,
                   const char *conv, void (*body)(mpt_cu_em *e, const char *ty), const char *ty) {
    L("for (long long k0 = 0; k0 < K_; k0 += %d) {", bk);
    e->indent++;
    load_tiles(e, q, bm, bn, bk, threads, conv);
    L("__syncthreads();");
    body(e, ty);
    L("__syncthreads();");
    e->indent--;
    L("}");
}

/* The fused epilogue for accumulator `accv` at (row, col). */
static void epilogue(mpt_cu_em *e, const char *accv) {
    const mpt_node *r = &e->g->nodes[e->k->root];
    L("if (row < M_ && col < N_) {");
    e->indent++;
    L("const long long o = row * N_ + col;");
    int mark = mpt_cu_mark(e);
    char v[24];
    mpt_cu_fresh(e, "acc", v);
    /* the GEMM's own value is rounded once to its dtype, as the interpreter */
    L("const float %s = %s(%s);", v, mpt_cu_round_fn(r->dtype), accv);
    mpt_cu_bind(e, e->k->root, "o", v);
    for (int i = 0; i < e->k->n_outputs; i++) {
        int id = e->k->outputs[i];
        if (mpt_shape_numel(e->g->nodes[id].shape) != mpt_shape_numel(r->shape)) {
            e->err = "a GEMM epilogue output must have the GEMM's shape";
            e->err_node = id;
            continue;
        }
        char w[24];
        mpt_cu_value(e, id, "o", w);
        mpt_cu_store(e, id, "o", w);
    }
    mpt_cu_release(e, mark);
    e->indent--;
    L("}");
}

/* One k step of 32 on the shared tiles: fragments by ldmatrix (four 8x8
 * matrices a load: rows given by lanes 8j..8j+7 of matrix j, each lane
 * receiving row lane/4, columns 2 (lane % 4) and the next of each), then
 * 2 x 4 mma.sync m16n8k16 per warp. As is [m][k], Bs [n][k], so both give
 * the row/col fragments mma wants without a transpose. */
static void mma_body(mpt_cu_em *e, const char *ty) {
    L("#pragma unroll");
    L("for (int kk = 0; kk < 32; kk += 16) {");
    e->indent++;
    L("unsigned af[2][4], bf[4][2];");
    L("#pragma unroll");
    L("for (int mi = 0; mi < 2; mi++) {");
    L("    /* matrices: rows +0 and +8 at k +0, then at k +8 */");
    L("    const unsigned sa = (unsigned)__cvta_generic_to_shared("
      "&As[wm + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][kk + (lane >> 4) * 8]);");
    L("    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%%0,%%1,%%2,%%3}, [%%4];\"");
    L("        : \"=r\"(af[mi][0]), \"=r\"(af[mi][1]), \"=r\"(af[mi][2]), \"=r\"(af[mi][3]) "
      ": \"r\"(sa));");
    L("}");
    L("#pragma unroll");
    L("for (int np = 0; np < 2; np++) {");
    L("    /* matrices: n block 2np at k +0 and +8, then n block 2np + 1 */");
    L("    const unsigned sb = (unsigned)__cvta_generic_to_shared("
      "&Bs[wn + np * 16 + (lane & 7) + (lane >> 4) * 8][kk + ((lane >> 3) & 1) * 8]);");
    L("    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%%0,%%1,%%2,%%3}, [%%4];\"");
    L("        : \"=r\"(bf[2 * np][0]), \"=r\"(bf[2 * np][1]), \"=r\"(bf[2 * np + 1][0]), "
      "\"=r\"(bf[2 * np + 1][1]) : \"r\"(sb));");
    L("}");
    L("#pragma unroll");
    L("for (int mi = 0; mi < 2; mi++)");
    L("#pragma unroll");
    L("for (int ni = 0; ni < 4; ni++)");
    L("    asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.%s.%s.f32 "
      "{%%0,%%1,%%2,%%3}, {%%4,%%5,%%6,%%7}, {%%8,%%9}, {%%0,%%1,%%2,%%3};\"", ty, ty);
    L("        : \"+f\"(acc[mi][ni][0]), \"+f\"(acc[mi][ni][1]), \"+f\"(acc[mi][ni][2]), "
      "\"+f\"(acc[mi][ni][3])");
    L("        : \"r\"(af[mi][0]), \"r\"(af[mi][1]), \"r\"(af[mi][2]), \"r\"(af[mi][3]), "
      "\"r\"(bf[ni][0]), \"r\"(bf[ni][1]));");
    e->indent--;
    L("}");
}

static void emit_mma(mpt_cu_em *e, const gemm_geom *q, mpt_dtype in_dt) {
    const char *conv = in_dt == MPT_DT_F16 ? "mpt_f2h" : "mpt_f2b";
    const char *ty = in_dt == MPT_DT_F16 ? "f16" : "bf16";
    L("/* 64x64 block tile, 4 warps of 32x32, k step 32; ldmatrix, mma.sync m16n8k16 */");
    L("__shared__ __align__(16) unsigned short As[64][40];");
    L("__shared__ __align__(16) unsigned short Bs[64][40];");
    L("const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;");
    L("const int g = lane >> 2, q4 = lane & 3;");
    L("const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;");
    L("const long long bm = (long long)blockIdx.y * 64, bn = (long long)blockIdx.x * 64;");
    L("float acc[2][4][4];");
    L("#pragma unroll");
    L("for (int i = 0; i < 32; i++) (&acc[0][0][0])[i] = 0.f;");
    k_loop(e, q, 64, 64, 32, 128, conv, mma_body, ty);
    L("#pragma unroll");
    L("for (int mi = 0; mi < 2; mi++)");
    L("#pragma unroll");
    L("for (int ni = 0; ni < 4; ni++)");
    L("#pragma unroll");
    L("for (int h = 0; h < 4; h++) {");
    e->indent++;
    L("const long long row = bm + wm + mi * 16 + g + (h >> 1) * 8;");
    L("const long long col = bn + wn + ni * 8 + 2 * q4 + (h & 1);");
    epilogue(e, "acc[mi][ni][h]");
    e->indent--;
    L("}");
}

static void simt_body(mpt_cu_em *e, const char *ty) {
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
}

static void emit_simt(mpt_cu_em *e, const gemm_geom *q) {
    L("/* 64x64 block tile, 16x16 threads of 4x4 outputs, k step 16, fp32 FMA */");
    L("__shared__ float As[64][17];");
    L("__shared__ float Bs[64][17];");
    L("const int ty = threadIdx.x / 16, tx = threadIdx.x %% 16;");
    L("const long long bm = (long long)blockIdx.y * 64, bn = (long long)blockIdx.x * 64;");
    L("float acc[4][4];");
    L("#pragma unroll");
    L("for (int i = 0; i < 16; i++) (&acc[0][0])[i] = 0.f;");
    k_loop(e, q, 64, 64, 16, 256, "", simt_body, NULL);
    L("#pragma unroll");
    L("for (int i = 0; i < 4; i++)");
    L("#pragma unroll");
    L("for (int j = 0; j < 4; j++) {");
    e->indent++;
    L("const long long row = bm + ty + 16 * i, col = bn + tx + 16 * j;");
    epilogue(e, "acc[i][j]");
    e->indent--;
    L("}");
}

int mpt_cu_emit_gemm(mpt_cu_em *e, mpt_cuda_kernel_src *out) {
    int root = e->k->root;
    const mpt_graph *g = e->g;
    if (root < 0) {
        e->err = "GEMM/conv kernel without a root";
        return 0;
    }
    gemm_geom q = geometry(g, root);
    mpt_dtype da = g->nodes[q.a].dtype, db = g->nodes[q.b].dtype;
    int mma = da == db && (da == MPT_DT_F16 || da == MPT_DT_BF16);
    if (!mma && !(da == MPT_DT_F32 && db == MPT_DT_F32)) {
        e->err = "GEMM operands must both be f16, both bf16 or both f32";
        e->err_node = root;
        return 0;
    }
    mpt_cu_signature(e, out);
    mpt_sb_printf(e->sb, " {\n");
    e->indent = 1;
    L("/* C[%lld,%lld] = A[%lld,%lld] B[%lld,%lld] (%s) */", (long long)q.m, (long long)q.n,
      (long long)q.m, (long long)q.k, (long long)q.k, (long long)q.n, mpt_op_name(q.op));
    L("const long long M_ = %lldLL, N_ = %lldLL, K_ = %lldLL;", (long long)q.m, (long long)q.n,
      (long long)q.k);
    if (mma) emit_mma(e, &q, da);
    else emit_simt(e, &q);
    mpt_sb_printf(e->sb, "}\n");
    out->tensor_cores = mma;
    out->block[0] = mma ? 128 : 256;
    out->grid[0] = (unsigned)((q.n + 63) / 64);
    out->grid[1] = (unsigned)((q.m + 63) / 64);
    if (q.m > 65535LL * 64) {
        e->err = "GEMM has more than 4194240 rows (grid.y limit)";
        e->err_node = root;
    }
    return 0;
}
