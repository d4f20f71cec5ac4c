/* codegen/cuda/emit_opaque.c — ops that read their operands at computed
 * places: one_hot, gather, slice, concat, pooling, the pooling gradients
 * and batch_matmul (element generators that contain loops), and OPAQUE
 * kernels (scatter_add with f32 atomics; everything else is a grid-stride
 * loop over the op's output).
 *
 * Layouts: images NHWC; pool attrs win_h, win_w, stride_h, stride_w, pad_h,
 * pad_w (pad is top/left); windows never count padding, as Keras.
 */
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cuda_internal.h"

typedef struct {
    int64_t n, h, w, c;     /* the full-resolution image (pool input, grad output) */
    int64_t oh, ow;         /* the pooled image */
    int64_t wh, ww, sh, sw, ph, pw;
} pool_geom;

static pool_geom geom(const mpt_node *nd, mpt_shape big, mpt_shape small) {
    pool_geom p = {big.dim[0], big.dim[1], big.dim[2], big.dim[3], small.dim[1], small.dim[2],
                   nd->attr.i[0], nd->attr.i[1], nd->attr.i[2], nd->attr.i[3], nd->attr.i[4],
                   nd->attr.i[5]};
    return p;
}

/* Declares coordinates P_c, P_x, P_y, P_n of linear index idx over [n, y, x, c]. */
static void coords(mpt_cu_em *e, const char *P, const char *idx, int64_t y, int64_t x,
                   int64_t c) {
    mpt_cu_line(e, "const long long %s_c = %s %% %lldLL, %s_x = %s / %lldLL %% %lldLL;", P,
                idx, (long long)c, P, idx, (long long)c, (long long)x);
    mpt_cu_line(e, "const long long %s_y = %s / %lldLL %% %lldLL, %s_n = %s / %lldLL;", P,
                idx, (long long)(c * x), (long long)y, P, idx, (long long)(c * x * y));
}

/* Pool forward: acc over the valid part of the window of output element idx. */
static void pool_fwd(mpt_cu_em *e, const mpt_node *nd, const char *idx, char *expr, size_t n) {
    pool_geom p = geom(nd, e->g->nodes[nd->in[0]].shape, nd->shape);
    int is_max = nd->op == MPT_OP_MAX_POOL;
    char P[24], acc[24], xi[24], v[24];
    mpt_cu_fresh(e, "q", P);
    mpt_cu_fresh(e, "pacc", acc);
    mpt_cu_fresh(e, "xi", xi);
    coords(e, P, idx, p.oh, p.ow, p.c);
    mpt_cu_line(e, "float %s = %s; int %s_cnt = 0;", acc,
                is_max ? "__uint_as_float(0xff800000u)" : "0.f", acc);
    mpt_cu_line(e, "for (int kh = 0; kh < %lld; kh++) for (int kw = 0; kw < %lld; kw++) {",
                (long long)p.wh, (long long)p.ww);
    e->indent++;
    mpt_cu_line(e, "const long long ih = %s_y * %lld - %lld + kh, iw = %s_x * %lld - %lld + kw;",
                P, (long long)p.sh, (long long)p.ph, P, (long long)p.sw, (long long)p.pw);
    mpt_cu_line(e, "if (ih < 0 || ih >= %lld || iw < 0 || iw >= %lld) continue;", (long long)p.h,
                (long long)p.w);
    mpt_cu_line(e, "const long long %s = ((%s_n * %lld + ih) * %lld + iw) * %lld + %s_c;", xi, P,
                (long long)p.h, (long long)p.w, (long long)p.c, P);
    int mark = mpt_cu_mark(e);
    mpt_cu_value(e, nd->in[0], xi, v);
    mpt_cu_line(e, is_max ? "%s = fmaxf(%s, %s); %s_cnt++;" : "%s = %s + %s; %s_cnt++;", acc,
                acc, v, acc);
    mpt_cu_release(e, mark);
    e->indent--;
    mpt_cu_line(e, "}");
    if (is_max) snprintf(expr, n, "%s(%s)", mpt_cu_round_fn(nd->dtype), acc);
    else snprintf(expr, n, "%s(%s / (float)%s_cnt)", mpt_cu_round_fn(nd->dtype), acc, acc);
}

/* Pool gradients: dx at idx sums dy over the windows that contain it. */
static void pool_grad(mpt_cu_em *e, const mpt_node *nd, const char *idx, char *expr, size_t n) {
    int is_max = nd->op == MPT_OP_MAX_POOL_GRAD;
    int dy_in = is_max ? nd->in[1] : nd->in[0];
    pool_geom p = geom(nd, nd->shape, e->g->nodes[dy_in].shape);
    char P[24], acc[24], dyi[24], v[24];
    mpt_cu_fresh(e, "q", P);
    mpt_cu_fresh(e, "gacc", acc);
    mpt_cu_fresh(e, "dyi", dyi);
    coords(e, P, idx, p.h, p.w, p.c);
    mpt_cu_line(e, "float %s = 0.f;", acc);
    /* the windows holding row y start at oh with oh*sh - ph <= y < oh*sh - ph + wh */
    mpt_cu_line(e, "const long long %s_oh0 = %s_y + %lld - %lld < 0 ? 0 : (%s_y + %lld - %lld + %lld) / %lld;",
                P, P, (long long)p.ph, (long long)(p.wh - 1), P, (long long)p.ph,
                (long long)(p.wh - 1), (long long)(p.sh - 1), (long long)p.sh);
    mpt_cu_line(e, "const long long %s_ow0 = %s_x + %lld - %lld < 0 ? 0 : (%s_x + %lld - %lld + %lld) / %lld;",
                P, P, (long long)p.pw, (long long)(p.ww - 1), P, (long long)p.pw,
                (long long)(p.ww - 1), (long long)(p.sw - 1), (long long)p.sw);
    mpt_cu_line(e, "for (long long oh = %s_oh0; oh < %lld && oh * %lld - %lld <= %s_y; oh++)", P,
                (long long)p.oh, (long long)p.sh, (long long)p.ph, P);
    mpt_cu_line(e, "for (long long ow = %s_ow0; ow < %lld && ow * %lld - %lld <= %s_x; ow++) {", P,
                (long long)p.ow, (long long)p.sw, (long long)p.pw, P);
    e->indent++;
    mpt_cu_line(e, "const long long y0 = oh * %lld - %lld, x0 = ow * %lld - %lld;",
                (long long)p.sh, (long long)p.ph, (long long)p.sw, (long long)p.pw);
    mpt_cu_line(e, "const long long %s = ((%s_n * %lld + oh) * %lld + ow) * %lld + %s_c;", dyi, P,
                (long long)p.oh, (long long)p.ow, (long long)p.c, P);
    int mark = mpt_cu_mark(e);
    mpt_cu_value(e, dy_in, dyi, v);
    if (is_max) {
        char xi[24], xv[24];
        mpt_cu_fresh(e, "xi", xi);
        mpt_cu_line(e, "float best = __uint_as_float(0xff800000u); long long by = -1, bx = -1;");
        mpt_cu_line(e, "for (long long ih = y0 < 0 ? 0 : y0; ih < y0 + %lld && ih < %lld; ih++)",
                    (long long)p.wh, (long long)p.h);
        mpt_cu_line(e, "for (long long iw = x0 < 0 ? 0 : x0; iw < x0 + %lld && iw < %lld; iw++) {",
                    (long long)p.ww, (long long)p.w);
        e->indent++;
        mpt_cu_line(e, "const long long %s = ((%s_n * %lld + ih) * %lld + iw) * %lld + %s_c;", xi,
                    P, (long long)p.h, (long long)p.w, (long long)p.c, P);
        int m2 = mpt_cu_mark(e);
        mpt_cu_value(e, nd->in[0], xi, xv);
        mpt_cu_line(e, "if (by < 0 || %s > best) { best = %s; by = ih; bx = iw; }", xv, xv);
        mpt_cu_release(e, m2);
        e->indent--;
        mpt_cu_line(e, "}");
        mpt_cu_line(e, "if (by == %s_y && bx == %s_x) %s += %s;", P, P, acc, v);
    } else {
        mpt_cu_line(e, "const long long hy = (y0 + %lld < %lld ? y0 + %lld : %lld) - (y0 < 0 ? 0 : y0);",
                    (long long)p.wh, (long long)p.h, (long long)p.wh, (long long)p.h);
        mpt_cu_line(e, "const long long hx = (x0 + %lld < %lld ? x0 + %lld : %lld) - (x0 < 0 ? 0 : x0);",
                    (long long)p.ww, (long long)p.w, (long long)p.ww, (long long)p.w);
        mpt_cu_line(e, "%s += %s / (float)(hy * hx);", acc, v);
    }
    mpt_cu_release(e, mark);
    e->indent--;
    mpt_cu_line(e, "}");
    snprintf(expr, n, "%s(%s)", mpt_cu_round_fn(nd->dtype), acc);
}

/* Slice and concat, as codegen/cpu/emit_slice.c: output index idx = o *
 * row + r with row the output's len * inner elements along the axis. A
 * slice reads o * in_row + start * inner + r; a concat reads in0 where r <
 * la * inner and in1 after it, both loaded and one selected, each index
 * clamped into its operand so the other load stays inside its buffer. */
static void slice_concat(mpt_cu_em *e, const mpt_node *nd, const char *idx, char *expr, size_t n) {
    int ax = (int)nd->attr.i[0];
    int64_t inner = mpt_cu_stride(nd->shape, ax), row = nd->shape.dim[ax] * inner;
    int64_t ra = e->g->nodes[nd->in[0]].shape.dim[ax] * inner;
    char o[24], r[24], ja[24], jb[24], va[24], vb[24];
    mpt_cu_fresh(e, "o", o);
    mpt_cu_fresh(e, "r", r);
    mpt_cu_fresh(e, "j", ja);
    mpt_cu_line(e, "const long long %s = %s / %lldLL, %s = %s %% %lldLL;", o, idx, (long long)row,
                r, idx, (long long)row);
    if (nd->op == MPT_OP_SLICE) { /* ra: the input's row */
        mpt_cu_line(e, "const long long %s = %s * %lldLL + %lldLL + %s;", ja, o, (long long)ra,
                    (long long)(nd->attr.i[1] * inner), r);
        mpt_cu_value(e, nd->in[0], ja, va);
        snprintf(expr, n, "%s", va);
        return;
    }
    int64_t rb = row - ra;
    mpt_cu_fresh(e, "j", jb);
    mpt_cu_line(e, "const long long %s = %s * %lldLL + (%s < %lldLL ? %s : %lldLL);", ja, o,
                (long long)ra, r, (long long)ra, r, (long long)(ra - 1));
    mpt_cu_line(e, "const long long %s = %s * %lldLL + (%s < %lldLL ? 0LL : %s - %lldLL);", jb, o,
                (long long)rb, r, (long long)ra, r, (long long)ra);
    mpt_cu_value(e, nd->in[0], ja, va);
    mpt_cu_value(e, nd->in[1], jb, vb);
    snprintf(expr, n, "(%s < %lldLL ? %s : %s)", r, (long long)ra, va, vb);
}

/* batch_matmul: output element idx of [batches, M, N] is (q, i, j), one
 * f32 sum over k of a[q, i, k] b[q, k, j] (a stored [K, M] per batch where
 * trans_a, b [N, K] where trans_b), rounded once. One thread per output
 * element: the threads of a warp are neighbouring j, so they share a's
 * element and, without trans_b, read b coalesced. No shared-memory tiles
 * and no Tensor Cores yet: attention's matrices are small, and this is the
 * simple correct kernel (docs/CUDA.md). */
static void batch_matmul(mpt_cu_em *e, const mpt_node *nd, const char *idx, char *expr,
                         size_t n) {
    const mpt_node *na = &e->g->nodes[nd->in[0]];
    int r = nd->shape.rank, ta = (int)nd->attr.i[0], tb = (int)nd->attr.i[1];
    long long M = nd->shape.dim[r - 2], N = nd->shape.dim[r - 1];
    long long K = ta ? na->shape.dim[r - 2] : na->shape.dim[r - 1];
    char P[24], acc[24], ai[24], bi[24], va[24], vb[24];
    mpt_cu_fresh(e, "mm", P);
    mpt_cu_fresh(e, "macc", acc);
    mpt_cu_fresh(e, "ai", ai);
    mpt_cu_fresh(e, "bi", bi);
    mpt_cu_line(e, "const long long %s_q = %s / %lldLL, %s_i = %s / %lldLL %% %lldLL, "
                   "%s_j = %s %% %lldLL;", P, idx, M * N, P, idx, N, M, P, idx, N);
    mpt_cu_line(e, "float %s = 0.f;", acc);
    mpt_cu_line(e, "for (long long k = 0; k < %lldLL; k++) {", K);
    e->indent++;
    if (ta) mpt_cu_line(e, "const long long %s = %s_q * %lldLL + k * %lldLL + %s_i;", ai, P,
                        M * K, M, P);
    else mpt_cu_line(e, "const long long %s = (%s_q * %lldLL + %s_i) * %lldLL + k;", ai, P, M, P, K);
    if (tb) mpt_cu_line(e, "const long long %s = (%s_q * %lldLL + %s_j) * %lldLL + k;", bi, P, N, P,
                        K);
    else mpt_cu_line(e, "const long long %s = %s_q * %lldLL + k * %lldLL + %s_j;", bi, P, K * N, N,
                     P);
    int mark = mpt_cu_mark(e);
    mpt_cu_value(e, nd->in[0], ai, va);
    mpt_cu_value(e, nd->in[1], bi, vb);
    mpt_cu_line(e, "%s = fmaf((float)%s, (float)%s, %s);", acc, va, vb, acc);
    mpt_cu_release(e, mark);
    e->indent--;
    mpt_cu_line(e, "}");
    snprintf(expr, n, "%s(%s)", mpt_cu_round_fn(nd->dtype), acc);
}

int mpt_cu_value_movement(mpt_cu_em *e, int id, const char *idx, char *expr, size_t n) {
    const mpt_node *nd = &e->g->nodes[id];
    const char *rt = mpt_cu_regtype(nd->dtype);
    if (nd->op == MPT_OP_ONE_HOT) {
        int64_t depth = nd->attr.i[0];
        char j[24], v[24];
        mpt_cu_fresh(e, "j", j);
        mpt_cu_line(e, "const long long %s = %s / %lldLL;", j, idx, (long long)depth);
        mpt_cu_value(e, nd->in[0], j, v);
        snprintf(expr, n, "(%s)((long long)%s == %s %% %lldLL)", rt, v, idx, (long long)depth);
        return 1;
    }
    if (nd->op == MPT_OP_GATHER) {
        mpt_shape ts = e->g->nodes[nd->in[0]].shape;
        int64_t d = ts.dim[1];
        char j[24], ids[24], t[24], v[24];
        mpt_cu_fresh(e, "j", j);
        mpt_cu_fresh(e, "t", t);
        mpt_cu_line(e, "const long long %s = %s / %lldLL;", j, idx, (long long)d);
        mpt_cu_value(e, nd->in[1], j, ids);
        /* an id outside the table reads zeros instead of faulting */
        mpt_cu_line(e, "const long long %s = (%s >= 0 && %s < %lld) ? (long long)%s * %lldLL + %s %% %lldLL : 0;",
                    t, ids, ids, (long long)ts.dim[0], ids, (long long)d, idx, (long long)d);
        mpt_cu_value(e, nd->in[0], t, v);
        snprintf(expr, n, "((%s >= 0 && %s < %lld) ? %s : (%s)0)", ids, ids,
                 (long long)ts.dim[0], v, rt);
        return 1;
    }
    if (nd->op == MPT_OP_SLICE || nd->op == MPT_OP_CONCAT) {
        slice_concat(e, nd, idx, expr, n);
        return 1;
    }
    if (nd->op == MPT_OP_MAX_POOL || nd->op == MPT_OP_AVG_POOL) {
        pool_fwd(e, nd, idx, expr, n);
        return 1;
    }
    if (nd->op == MPT_OP_MAX_POOL_GRAD || nd->op == MPT_OP_AVG_POOL_GRAD) {
        pool_grad(e, nd, idx, expr, n);
        return 1;
    }
    if (nd->op == MPT_OP_BATCH_MATMUL) {
        batch_matmul(e, nd, idx, expr, n);
        return 1;
    }
    return 0;
}

/* out [rows, D] = sum of upd [..., D] rows by ids [...]; f32 atomics, so the
 * runtime zeroes out first (zero_outputs). */
static int emit_scatter(mpt_cu_em *e, mpt_cuda_kernel_src *out) {
    const mpt_node *nd = &e->g->nodes[e->k->root];
    if (nd->dtype != MPT_DT_F32 || e->k->n_outputs != 1 || e->k->outputs[0] != e->k->root) {
        e->err = "scatter_add is generated for a single f32 output only (f32 atomics)";
        e->err_node = e->k->root;
        return 0;
    }
    int64_t rows = nd->attr.i[0], d = nd->shape.dim[1];
    int64_t total = mpt_shape_numel(e->g->nodes[nd->in[1]].shape);
    mpt_cu_signature(e, out);
    mpt_sb_printf(e->sb, " {\n");
    e->indent = 1;
    mpt_cu_line(e, "const long long step = (long long)gridDim.x * blockDim.x;");
    mpt_cu_line(e, "for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; "
                   "i < %lldLL; i += step) {", (long long)total);
    e->indent++;
    char j[24], ids[24], v[24];
    mpt_cu_fresh(e, "j", j);
    mpt_cu_line(e, "const long long %s = i / %lldLL;", j, (long long)d);
    mpt_cu_value(e, nd->in[0], j, ids);
    mpt_cu_value(e, nd->in[1], "i", v);
    mpt_cu_line(e, "if (%s >= 0 && %s < %lld) atomicAdd(&p%d[(long long)%s * %lldLL + i %% %lldLL], %s);",
                ids, ids, (long long)rows, e->param_of[e->k->root], ids, (long long)d,
                (long long)d, v);
    e->indent--;
    mpt_cu_line(e, "}");
    mpt_sb_printf(e->sb, "}\n");
    out->zero_outputs = 1;
    out->block[0] = 256;
    out->grid[0] = mpt_cu_grid_for(total, 256);
    return 0;
}

int mpt_cu_emit_opaque(mpt_cu_em *e, mpt_cuda_kernel_src *out) {
    int root = e->k->root;
    if (root < 0) return mpt_cu_emit_loop(e, out);
    mpt_op op = e->g->nodes[root].op;
    if (op == MPT_OP_SCATTER_ADD) return emit_scatter(e, out);
    if (op == MPT_OP_ATTENTION || op == MPT_OP_ATTENTION_LSE || op == MPT_OP_ATTENTION_GRAD)
        return mpt_cu_emit_attention(e, out);
    if (mpt_op_table[op].kind == MPT_KIND_REDUCTION) return mpt_cu_emit_reduction(e, out);
    /* transpose, iota, random_uniform, one_hot, gather, pools,
     * batch_matmul: one thread per output element, through the element
     * generators */
    return mpt_cu_emit_loop(e, out);
}
