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
 * f16/bf16 operands run on Tensor Cores (emit_mma.c); f32 operands on the
 * SIMT kernels (emit_simt.c), in true fp32. Operands that are not a plain
 * buffer of the kernel's type are read through the element generators, so prologue
 * casts (f32 master weights to f16) happen while the tile is loaded.
 *
 * A grid of few output tiles over a long k (a convolution's filter
 * gradient sums over every pixel of the batch) is split along k: see
 * mpt_cu_gemm_finish.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cuda_internal.h"

static const char *index_type(const mpt_cu_gemm *q, const mpt_graph *g, int root) {
    const int64_t lim = (int64_t)1 << 31;
    int64_t big = q->m * q->n;
    if (q->m * q->k > big) big = q->m * q->k;
    if (q->k * q->n > big) big = q->k * q->n;
    int ids[3] = {root, q->a, q->b};
    for (int i = 0; i < 3; i++)
        if (mpt_shape_numel(g->nodes[ids[i]].shape) > big) big = mpt_shape_numel(g->nodes[ids[i]].shape);
    /* + a tile's overhang past the matrix */
    return big + 256 * (q->m + q->n + q->k) < lim ? "int" : "long long";
}

static mpt_cu_gemm geometry(const mpt_graph *g, int root) {
    const mpt_node *r = &g->nodes[root];
    mpt_cu_gemm q = {.op = r->op, .a = r->in[0], .b = r->in[1]};
    mpt_shape s0 = g->nodes[r->in[0]].shape, s1 = g->nodes[r->in[1]].shape;
    if (r->op == MPT_OP_MATMUL) {
        q.trans_a = (int)r->attr.i[0];
        q.trans_b = (int)r->attr.i[1];
        q.m = r->shape.dim[0];
        q.n = r->shape.dim[1];
        q.k = q.trans_a ? s0.dim[0] : s0.dim[1];
        q.ity = index_type(&q, g, root);
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
    q.ity = index_type(&q, g, root);
    return q;
}

#define L(...) mpt_cu_line(e, __VA_ARGS__)

const char *mpt_cu_gemm_index(mpt_cu_em *e, const mpt_cu_gemm *q, int which, const char *idx) {
    long long H = q->xs.dim[1], W = q->xs.dim[2], C = q->ws.dim[2], CO = q->ws.dim[3];
    long long OH = q->ys.dim[1], OW = q->ys.dim[2], KW = q->ws.dim[1];
    if (q->op == MPT_OP_MATMUL) {
        if (which == 0)
            L("const %s %s = %s;", q->ity, idx, q->trans_a ? "gk * M_ + gm" : "gm * K_ + gk");
        else
            L("const %s %s = %s;", q->ity, idx, q->trans_b ? "gn * K_ + gk" : "gk * N_ + gn");
        return "true";
    }
    if (which == 1 && q->op != MPT_OP_CONV2D_BWD_DATA) {
        L("const %s %s = gk * N_ + gn;", q->ity, idx); /* w [K, Cout] or dy [K, Cout] */
        return "true";
    }
    if (which == 1 && q->phased) {
        /* k = (tky, tkx, co) of class (ph_a, ph_b), n = ci */
        L("const %s tt = gk / %lld;", q->ity, CO);
        L("const %s %s = (((ph_a + %lld * (tt / ph_nkx)) * %lld + ph_b + %lld * (tt %% ph_nkx)) "
          "* %lld + gn) * %lld + gk %% %lld;", q->ity, idx, (long long)q->sh, KW,
          (long long)q->sw, C, CO, CO);
        return "true";
    }
    if (which == 1) {
        /* k = (tap, co), n = ci: w[tap][ci][co] */
        L("const %s %s = ((gk / %lld) * %lld + gn) * %lld + gk %% %lld;", q->ity, idx, CO, C, CO, CO);
        return "true";
    }
    if (q->op == MPT_OP_CONV2D || q->op == MPT_OP_CONV2D_BWD_FILTER) {
        /* pixel p (batch, oh, ow) and tap/channel t (kh, kw, ci) */
        const char *p = q->op == MPT_OP_CONV2D ? "gm" : "gk";
        const char *t = q->op == MPT_OP_CONV2D ? "gk" : "gm";
        L("const %s ob = %s / %lld, oy = %s / %lld %% %lld, ox = %s %% %lld;", q->ity, p, OH * OW,
          p, OW, OH, p, OW);
        L("const %s ci = %s %% %lld, kx = %s / %lld %% %lld, ky = %s / %lld;", q->ity, t, C, t, C,
          KW, t, C * KW);
        L("const %s iy = oy * %lld - %lld + ky, ix = ox * %lld - %lld + kx;", q->ity,
          (long long)q->sh, (long long)q->ph, (long long)q->sw, (long long)q->pw);
        L("const bool ok = iy >= 0 && iy < %lld && ix >= 0 && ix < %lld;", H, W);
        L("const %s %s = ok ? ((ob * %lld + iy) * %lld + ix) * %lld + ci : 0;", q->ity, idx, H, W,
          C);
        return "ok";
    }
    if (q->phased && which == 0) {
        /* class (ph_a, ph_b): m = (batch, jy, jx) at iy = ph_iy0 + sh jy,
         * k = (tky, tkx, co) at ky = ph_a + sh tky; (iy + ph - ky) / sh is
         * then ph_dy0 + jy - tky, exactly */
        L("const %s ib = gm / (ph_hc * ph_wc), jy = gm / ph_wc %% ph_hc, jx = gm %% ph_wc;",
          q->ity);
        L("const %s co = gk %% %lld, tt = gk / %lld;", q->ity, CO, CO);
        L("const %s oy = ph_dy0 + jy - tt / ph_nkx, ox = ph_dx0 + jx - tt %% ph_nkx;", q->ity);
        L("const bool ok = oy >= 0 && oy < %lld && ox >= 0 && ox < %lld;", OH, OW);
        L("const %s %s = ok ? ((ib * %lld + oy) * %lld + ox) * %lld + co : 0;", q->ity, idx, OH,
          OW, CO);
        return "ok";
    }
    /* bwd data: m = (batch, iy, ix), k = (ky, kx, co); dy at oy = (iy + ph - ky) / sh */
    L("const %s ib = gm / %lld, iy = gm / %lld %% %lld, ix = gm %% %lld;", q->ity, H * W, W, H, W);
    L("const %s co = gk %% %lld, kx = gk / %lld %% %lld, ky = gk / %lld;", q->ity, CO, CO, KW,
      CO * KW);
    L("const %s ty = iy + %lld - ky, tx = ix + %lld - kx;", q->ity, (long long)q->ph,
      (long long)q->pw);
    L("const bool ok = ty >= 0 && tx >= 0 && ty %% %lld == 0 && tx %% %lld == 0 && "
      "ty / %lld < %lld && tx / %lld < %lld;", (long long)q->sh, (long long)q->sw,
      (long long)q->sh, OH, (long long)q->sw, OW);
    L("const %s %s = ok ? ((ib * %lld + ty / %lld) * %lld + tx / %lld) * %lld + co : 0;",
      q->ity, idx, OH, (long long)q->sh, OW, (long long)q->sw, CO);
    return "ok";
}

void mpt_cu_gemm_operand(mpt_cu_em *e, const mpt_cu_gemm *q, int which, const char *dst) {
    char idx[24], v[24];
    mpt_cu_fresh(e, "oi", idx);
    const char *valid = mpt_cu_gemm_index(e, q, which, idx);
    int mark = mpt_cu_mark(e);
    mpt_cu_value(e, which ? q->b : q->a, idx, v);
    L("%s = %s ? (float)%s : 0.f;", dst, valid, v);
    mpt_cu_release(e, mark);
}

int mpt_cu_gemm_k_contiguous(const mpt_cu_gemm *q, int which) {
    if (q->op == MPT_OP_MATMUL) return which ? q->trans_b : !q->trans_a;
    if (q->op == MPT_OP_CONV2D) return which == 0;     /* x patches along ci; w [K, Cout] */
    if (q->op == MPT_OP_CONV2D_BWD_DATA) return 1;     /* dy along co; w[tap][ci][co] */
    assert(q->op == MPT_OP_CONV2D_BWD_FILTER);
    return 0;                                          /* x along ci (m); dy [K, Cout] */
}

int64_t mpt_cu_gemm_run(const mpt_cu_gemm *q, int which) {
    if (q->op == MPT_OP_MATMUL) {
        if (mpt_cu_gemm_k_contiguous(q, which)) return q->k;
        return which ? q->n : q->m;
    }
    int64_t c = q->ws.dim[2], co = q->ws.dim[3];
    if (q->op == MPT_OP_CONV2D_BWD_DATA) return co;
    return which ? co : c; /* forward and filter gradient: x along ci, w and dy along co */
}

/* ---- strided data gradients by phase ---- */

/* The classes of a stride (sh, sw) data gradient: dx's pixels with
 * (y + ph) mod sh = a and (x + pw) mod sw = b meet only the taps ky = a +
 * sh i, kx = b + sw j; at stride 2 a 3x3 filter's 9 taps are 4, 2, 2 and 1
 * to the four classes, where the whole GEMM takes 9 for every pixel and
 * multiplies zeros for 3/4 of them. */
static int64_t count_from(int64_t first, int64_t n, int64_t step) {
    return first < n ? (n - first + step - 1) / step : 0;
}

static int phases_of(const mpt_cu_gemm *q, int bm, mpt_cu_phase *ph) {
    int64_t H = q->xs.dim[1], W = q->xs.dim[2], KH = q->ws.dim[0], KW = q->ws.dim[1];
    int n = 0;
    for (int64_t a = 0; a < q->sh; a++)
        for (int64_t b = 0; b < q->sw; b++) {
            mpt_cu_phase *c = &ph[n];
            c->a = a;
            c->b = b;
            c->iy0 = ((a - q->ph) % q->sh + q->sh) % q->sh;
            c->ix0 = ((b - q->pw) % q->sw + q->sw) % q->sw;
            c->hc = count_from(c->iy0, H, q->sh);
            c->wc = count_from(c->ix0, W, q->sw);
            c->nky = count_from(a, KH, q->sh);
            c->nkx = count_from(b, KW, q->sw);
            c->dy0 = (c->iy0 + q->ph - a) / q->sh;
            c->dx0 = (c->ix0 + q->pw - b) / q->sw;
            c->m = q->xs.dim[0] * c->hc * c->wc;
            c->k = c->nky * c->nkx * q->ws.dim[3];
            c->tiles = (c->m + bm - 1) / bm;
            n += c->tiles > 0; /* a class with no pixels has no blocks */
        }
    return n;
}

void mpt_cu_gemm_tile_ids(mpt_cu_em *e, int64_t m_tiles, int64_t n_tiles,
                          mpt_cuda_kernel_src *out) {
    const char *env = getenv("MPTC_CUDA_MAX_GRID_Y");
    int64_t max_y = env && atoll(env) > 0 && atoll(env) < 65535 ? atoll(env) : 65535;
    int on_x = m_tiles > max_y;
    if (on_x) L("/* more row tiles than grid.y takes: row tiles along grid.x */");
    L("const unsigned mpt_tm = blockIdx.%c, mpt_tn = blockIdx.%c;", on_x ? 'x' : 'y',
      on_x ? 'y' : 'x');
    out->grid[0] = (unsigned)(on_x ? m_tiles : n_tiles);
    out->grid[1] = (unsigned)(on_x ? n_tiles : m_tiles);
}

void mpt_cu_gemm_emit_sizes(mpt_cu_em *e, const mpt_cu_gemm *q, const mpt_cu_phase *ph, int n) {
    if (q->phased) {
        L("const %s M_ = %lld, N_ = %lld;", q->ity, (long long)q->m, (long long)q->n);
        mpt_cu_gemm_emit_phases(e, q, ph, n);
    } else {
        L("const %s M_ = %lld, N_ = %lld, K_ = %lld;", q->ity, (long long)q->m, (long long)q->n,
          (long long)q->k);
    }
}

/* The block's class from mpt_tm (the classes' row tiles one after
 * another) and mpt_row, a class row's row of dx. */
void mpt_cu_gemm_emit_phases(mpt_cu_em *e, const mpt_cu_gemm *q, const mpt_cu_phase *ph, int n) {
    L("/* by phase: %d classes of dx's pixels, each its own taps */", n);
    L("%s MC_ = 0, K_ = 0, ph_t0 = 0, ph_a = 0, ph_b = 0, ph_iy0 = 0, ph_ix0 = 0, ph_hc = 1, "
      "ph_wc = 1, ph_nkx = 1, ph_dy0 = 0, ph_dx0 = 0;", q->ity);
    int64_t t0 = 0;
    for (int i = 0; i < n; i++) {
        const mpt_cu_phase *c = &ph[i];
        L("%sif (mpt_tm < %lldu) {", i ? "else " : "", (long long)(t0 + c->tiles));
        L("    MC_ = %lld; K_ = %lld; ph_t0 = %lld; ph_a = %lld; ph_b = %lld;", (long long)c->m,
          (long long)c->k, (long long)t0, (long long)c->a, (long long)c->b);
        L("    ph_iy0 = %lld; ph_ix0 = %lld; ph_hc = %lld; ph_wc = %lld; ph_nkx = %lld; "
          "ph_dy0 = %lld; ph_dx0 = %lld;", (long long)c->iy0, (long long)c->ix0,
          (long long)c->hc, (long long)c->wc, (long long)(c->nkx ? c->nkx : 1),
          (long long)c->dy0, (long long)c->dx0);
        L("}");
        t0 += c->tiles;
    }
    L("auto mpt_row = [&](%s l) -> long long {", q->ity);
    L("    if (l >= MC_) return M_;");
    L("    const %s ib = l / (ph_hc * ph_wc), jy = l / ph_wc %% ph_hc, jx = l %% ph_wc;", q->ity);
    L("    return ((long long)ib * %lld + ph_iy0 + %lld * jy) * %lld + ph_ix0 + %lld * jx;",
      (long long)q->xs.dim[1], (long long)q->sh, (long long)q->xs.dim[2], (long long)q->sw);
    L("};");
}

int mpt_cu_gemm_phases(mpt_cu_gemm *q, int bm, mpt_cu_phase *ph, int64_t *m_tiles,
                       int64_t *k_max) {
    *m_tiles = (q->m + bm - 1) / bm;
    *k_max = q->k;
    if (q->op != MPT_OP_CONV2D_BWD_DATA || (q->sh == 1 && q->sw == 1) ||
        q->sh * q->sw > MPT_CU_MAX_PHASES)
        return 0;
    int n = phases_of(q, bm, ph);
    q->phased = 1;
    *m_tiles = *k_max = 0;
    for (int i = 0; i < n; i++) {
        *m_tiles += ph[i].tiles;
        if (ph[i].k > *k_max) *k_max = ph[i].k;
    }
    return n;
}

/* ---- the end of the kernel: split-K and the fused epilogue ---- */

/* One output's n values (at o0, o1) stored: a pair of neighbours in a row
 * (col even, N even: both in the matrix or neither, starting at an even
 * index) of an f16/bf16 output as one 32-bit store, of f32/i32 as one
 * 64-bit store. */
static void store_outputs(mpt_cu_em *e, int id, int n, char w[2][24]) {
    int p = e->param_of[id];
    mpt_dtype dt = e->g->nodes[id].dtype;
    if (n == 2 && (dt == MPT_DT_F16 || dt == MPT_DT_BF16)) {
        const char *f = dt == MPT_DT_F16 ? "mpt_f2h" : "mpt_f2b";
        L("*(unsigned *)(p%d + o0) = (unsigned)%s(%s) | (unsigned)%s(%s) << 16;", p, f, w[0], f,
          w[1]);
    } else if (n == 2 && (dt == MPT_DT_F32 || dt == MPT_DT_I32)) {
        const char *u = dt == MPT_DT_F32 ? "__float_as_uint" : "(unsigned)";
        L("{ const mpt_v2u t = {%s(%s), %s(%s)}; *(mpt_v2u *)(p%d + o0) = t; }", u, w[0], u, w[1],
          p);
    } else {
        for (int j = 0; j < n; j++) mpt_cu_store(e, id, j ? "o1" : "o0", w[j]);
    }
}

/* A column reduce_all of the epilogue (fusion's epilogue reductions, the
 * loss scale's finite check of a weight gradient): its flags were set
 * true before the launch (set_true), and a thread whose element is false
 * clears its column's. Threads that store the same 0 race harmlessly, and
 * AND taken in any order is the interpreter's. */
static void clear_flags(mpt_cu_em *e, int id, int n) {
    const mpt_node *nd = &e->g->nodes[id];
    const mpt_shape root = e->g->nodes[e->k->root].shape;
    if (!mpt_shape_eq(e->g->nodes[nd->in[0]].shape, root) ||
        nd->attr.i[0] != (1LL << (root.rank - 1)) - 1) {
        e->err = "an epilogue reduction must reduce every dim but the last of the GEMM/conv "
                 "output";
        e->err_node = id;
        return;
    }
    for (int j = 0; j < n; j++) {
        char v[24];
        mpt_cu_value(e, nd->in[0], j ? "o1" : "o0", v);
        L("if (!(%s)) p%d[col%s] = 0;", v, e->param_of[id], j ? " + 1" : "");
    }
}

/* The fused epilogue for the n (1 or 2) accumulators acc[] at (row, col)
 * and (row, col + 1). */
static void epilogue_of(mpt_cu_em *e, int n, const char *const acc[2]) {
    const mpt_node *r = &e->g->nodes[e->k->root];
    L("if (row < M_ && col < N_) {");
    e->indent++;
    L("const long long o0 = row * N_ + col%s;", n == 2 ? ", o1 = o0 + 1" : "");
    int mark = mpt_cu_mark(e);
    for (int j = 0; j < n; j++) {
        char v[24];
        mpt_cu_fresh(e, "acc", v);
        /* the GEMM's own value is rounded once to its dtype, as the interpreter */
        L("const float %s = %s(%s);", v, mpt_cu_round_fn(r->dtype), acc[j]);
        mpt_cu_bind(e, e->k->root, j ? "o1" : "o0", v);
    }
    for (int i = 0; i < e->k->n_outputs; i++) {
        int id = e->k->outputs[i];
        if (e->g->nodes[id].op == MPT_OP_REDUCE_ALL) {
            clear_flags(e, id, n);
            continue;
        }
        if (mpt_shape_numel(e->g->nodes[id].shape) != mpt_shape_numel(r->shape)) {
            e->err = "a GEMM epilogue output must have the GEMM's shape";
            e->err_node = id;
            continue;
        }
        char w[2][24];
        for (int j = 0; j < n; j++) mpt_cu_value(e, id, j ? "o1" : "o0", w[j]);
        store_outputs(e, id, n, w);
    }
    mpt_cu_release(e, mark);
    e->indent--;
    L("}");
}

static void epilogue(mpt_cu_em *e, const char *acc) {
    epilogue_of(e, 1, (const char *const[2]){acc, NULL});
}

static void epilogue_pair(mpt_cu_em *e, const char *acc0, const char *acc1) {
    epilogue_of(e, 2, (const char *const[2]){acc0, acc1});
}

static void split_store(mpt_cu_em *e, const char *acc) {
    L("if (row < M_ && col < N_) __stcg(&scratch[((size_t)blockIdx.z * M_ + row) * N_ + col], %s);",
      acc);
}

/* one accumulator's partials, in order of z: a loop of its own, not
 * unrolled, so the 64 accumulators stay the only values held across it
 * (a z loop around all of them spilled registers) and the code stays small */
static void split_sum(mpt_cu_em *e, const char *acc) {
    L("if (row < M_ && col < N_) {");
    L("    const float *part = scratch + (size_t)row * N_ + col;");
    L("    %s = __ldcg(part);", acc);
    L("    #pragma unroll 1");
    L("    for (unsigned z = 1; z < gridDim.z; z++) %s += __ldcg(part + (size_t)z * M_ * N_);", acc);
    L("}");
}

/* Split-K, deterministic: block z of a tile sums its own range of k and
 * stores it in scratch's z-th [M, N]; the tile's last block to finish (a
 * counter per tile) adds the partials in order of z, the same order on
 * every run whichever block is last ((0 + p0) + p1 + ..., what a chain of
 * blocks each adding its own to the sum so far gives), applies the
 * epilogue and sets the counter back to 0. No block waits for another, so
 * a tile may be split hundreds of ways: a first layer's filter gradient
 * (75 x 32 outputs over 524,288 pixels) has one tile. */
void mpt_cu_gemm_finish(mpt_cu_em *e, const mpt_cu_gemm *q, int splits, mpt_cu_each_acc each,
                        mpt_cu_each_pair pairs) {
    if (splits > 1) {
        L("/* split-K: every block's partial out; the tile's last block adds them in order of z */");
        L("unsigned *count = counters + blockIdx.y * gridDim.x + blockIdx.x;");
        L("__shared__ int mpt_split_last;");
        each(e, split_store);
        L("__threadfence();");
        L("__syncthreads();");
        L("if (threadIdx.x == 0) mpt_split_last = atomicAdd(count, 1u) == gridDim.z - 1;");
        L("__syncthreads();");
        L("if (!mpt_split_last) return;");
        L("__threadfence();");
        each(e, split_sum);
        L("if (threadIdx.x == 0) *count = 0; /* as the next launch must find it */");
    }
    if (pairs && q->n % 2 == 0) pairs(e, epilogue_pair);
    else each(e, epilogue);
}

/* Two waves of blocks on a 132-SM H100 (one block of 256 threads and
 * 64-128 registers a thread leaves room for two on an SM): a grid with
 * fewer output tiles than one wave is split along k until it has about
 * that many blocks, each at least 8 steps of k long, at most 264 to a
 * tile (the last block reads them all). */
int mpt_cu_gemm_splits(int64_t tiles, int64_t k_tiles, int64_t *per_split) {
    int64_t want = 1;
    if (tiles < 132 && k_tiles >= 16) {
        want = (264 + tiles - 1) / tiles;
        if (want > k_tiles / 8) want = k_tiles / 8;
    }
    *per_split = (k_tiles + want - 1) / want;
    return (int)((k_tiles + *per_split - 1) / *per_split);
}

int mpt_cu_emit_gemm(mpt_cu_em *e, mpt_cuda_kernel_src *out) {
    int root = e->k->root;
    const mpt_graph *g = e->g;
    if (root < 0) {
        e->err = "GEMM/conv kernel without a root";
        return 0;
    }
    mpt_cu_gemm q = geometry(g, root);
    mpt_dtype da = g->nodes[q.a].dtype, db = g->nodes[q.b].dtype;
    int mma = da == db && (da == MPT_DT_F16 || da == MPT_DT_BF16 || (da == MPT_DT_F32 && e->tf32));
    if (!mma && !(da == MPT_DT_F32 && db == MPT_DT_F32)) {
        e->err = "GEMM operands must both be f16, both bf16 or both f32";
        e->err_node = root;
        return 0;
    }
    for (int i = 0; i < e->k->n_outputs; i++) {
        int id = e->k->outputs[i];
        if (g->nodes[id].op != MPT_OP_REDUCE_ALL) continue;
        if (e->param_of[id] >= 64 || g->nodes[id].dtype != MPT_DT_BOOL) {
            e->err = e->param_of[id] >= 64 ? "an epilogue reduction's flags past the 64th buffer"
                                           : "an epilogue reduction must be of bool";
            e->err_node = id;
            return 0;
        }
        out->set_true |= 1ULL << e->param_of[id];
    }
    if (mma) {
        mpt_cu_emit_mma(e, &q, da, out);
    } else {
        mpt_cu_emit_simt(e, &q, out);
    }
    if ((int64_t)out->grid[1] > 65535) {
        e->err = "GEMM has more column tiles than grid.y allows (65535)";
        e->err_node = root;
    }
    return 0;
}
