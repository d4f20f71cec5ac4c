/* ir/autodiff.c — reverse-mode differentiation on the IR.
 *
 * mpt_autodiff walks the graph from y back to the nodes in wrt[] and
 * appends the gradient nodes of each forward op with the builder, so every
 * gradient node is shape- and dtype-checked as it is made.
 *
 * Three decisions shape everything below:
 *   - Only nodes on a path from some wrt node to y get a gradient (the
 *     "active" set), so nothing is built for the labels, for a branch the
 *     loss does not read, or for inputs nobody asked about.
 *   - A gradient has its node's dtype. Every rule is built in its op's
 *     dtype, and the only op whose float input dtype differs from its
 *     output's is CAST, whose rule casts back. So an f32 variable cast to f16
 *     for an f16 matmul gets f16 backward matmuls and an f32 gradient at the
 *     end: mixed precision falls out of the rules without a special case.
 *   - Gradients never flow into i32 or bool values (ids, masks, counters):
 *     such edges are on no differentiable path.
 *
 * Where an op is not differentiable we make TensorFlow's choices, so a Keras
 * user sees the gradients they expect:
 *   relu'(0) = 0; abs'(0) = 0 (sign(0) = 0); max/min ties send the whole
 *   gradient to the first operand; reduce_max divides it equally among the
 *   elements equal to the maximum; max_pool gives it to the first maximum of
 *   each window (max_pool_grad's definition); pow's gradient with respect to
 *   the exponent is 0 where the base is not positive.
 *
 * Second derivatives: conv2d_bwd_data, conv2d_bwd_filter, avg_pool_grad and
 * gelu_grad have rules (the first three are linear in each input). Only
 * max_pool_grad with respect to its dy input has none; asking for it is an
 * error. Its gradient with respect to x is zero almost everywhere.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

typedef struct {
    mpt_graph *g;
    int *grad;    /* gradient node of each original node, or -1 */
    char *active; /* on a differentiable path from a wrt node to y */
} mpt_ad;

/* ---- small builders ----------------------------------------------------- */

/* A constant with node `like`'s shape and dtype. */
static int full_like(mpt_graph *g, int like, double v) {
    return mpt_b_const(g, g->nodes[like].dtype, g->nodes[like].shape, v);
}

static int un(mpt_graph *g, mpt_op op, int a) { return mpt_b_unary(g, op, a); }
static int bin(mpt_graph *g, mpt_op op, int a, int b) { return mpt_b_binary(g, op, a, b); }
static int mul(mpt_graph *g, int a, int b) { return bin(g, MPT_OP_MUL, a, b); }
static int scale_by(mpt_graph *g, int a, double v) { return mul(g, a, full_like(g, a, v)); }

/* select(cond, a, 0) and select(cond, 0, a) */
static int where(mpt_graph *g, int cond, int a) {
    return mpt_b_select(g, cond, a, full_like(g, a, 0.0));
}
static int where_not(mpt_graph *g, int cond, int a) {
    return mpt_b_select(g, cond, full_like(g, a, 0.0), a);
}

/* Bit mask of the dims of a rank-`rank` tensor that are not in `axes`. */
static int64_t kept_dims(int rank, int64_t axes) { return ~axes & ((1LL << rank) - 1); }

static int wants(const mpt_ad *ad, int id) { return ad->active[id]; }

/* Adds contribution c to the gradient of node id: several consumers sum. */
static void accumulate(mpt_ad *ad, int id, int c) {
    mpt_graph *g = ad->g;
    assert(g->nodes[c].dtype == g->nodes[id].dtype && "gradient in the wrong dtype");
    assert(mpt_shape_eq(g->nodes[c].shape, g->nodes[id].shape) && "gradient in the wrong shape");
    ad->grad[id] = ad->grad[id] < 0 ? c : bin(g, MPT_OP_ADD, ad->grad[id], c);
}

/* ---- rules that need more than a line ------------------------------------ */

/* abs: dy * sign(x) with sign(0) = 0 */
static int abs_rule(mpt_graph *g, int x, int dy) {
    int zero = full_like(g, x, 0.0);
    int below = where(g, bin(g, MPT_OP_LT, x, zero), un(g, MPT_OP_NEG, dy));
    return mpt_b_select(g, bin(g, MPT_OP_GT, x, zero), dy, below);
}

/* gelu'(x) = Phi(x) + x phi(x), so gelu''(x) = phi(x) (2 - x^2) with
 * phi(x) = exp(-x^2/2) / sqrt(2 pi). */
static int gelu_grad_rule(mpt_graph *g, int x, int dy) {
    int x2 = un(g, MPT_OP_SQUARE, x);
    int phi = scale_by(g, un(g, MPT_OP_EXP, scale_by(g, x2, -0.5)), 0.39894228040143267794);
    int two_minus = bin(g, MPT_OP_SUB, full_like(g, x, 2.0), x2);
    return mul(g, dy, mul(g, phi, two_minus));
}

/* y = a ^ b: da = dy b a^(b-1); db = dy y log(a), 0 where a <= 0 (log of 1
 * there, so no NaN is ever made and then discarded). */
static void pow_rule(mpt_ad *ad, int y, int a, int b, int dy) {
    mpt_graph *g = ad->g;
    if (wants(ad, a)) {
        int bm1 = bin(g, MPT_OP_SUB, b, full_like(g, b, 1.0));
        accumulate(ad, a, mul(g, dy, mul(g, b, bin(g, MPT_OP_POW, a, bm1))));
    }
    if (wants(ad, b)) {
        int one = full_like(g, a, 1.0);
        int safe_a = mpt_b_select(g, bin(g, MPT_OP_GT, a, full_like(g, a, 0.0)), a, one);
        accumulate(ad, b, mul(g, mul(g, dy, y), un(g, MPT_OP_LOG, safe_a)));
    }
}

/* y = reduce_max(x, axes): dy shared equally among the maxima of each
 * reduced slice (TensorFlow's choice; any split is a valid subgradient). */
static int reduce_max_rule(mpt_graph *g, int x, int y, int dy, int64_t axes) {
    mpt_shape xs = g->nodes[x].shape;
    int64_t kept = kept_dims(xs.rank, axes);
    int is_max = bin(g, MPT_OP_EQ, x, mpt_b_broadcast(g, y, xs, kept));
    int count = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, where(g, is_max, full_like(g, x, 1.0)), axes);
    int share = bin(g, MPT_OP_DIV, dy, count);
    return where(g, is_max, mpt_b_broadcast(g, share, xs, kept));
}

/* y = broadcast(x): sum dy over the output dims x does not have and over
 * the size-1 dims of x that were stretched, then restore x's size-1 dims. */
static int broadcast_rule(mpt_graph *g, int x, int y, int dy) {
    mpt_shape xs = g->nodes[x].shape, ys = g->nodes[y].shape;
    int64_t dims = g->nodes[y].attr.i[0], axes = 0;
    int k = 0;
    for (int d = 0; d < ys.rank; d++) {
        if (!(dims & (1LL << d))) {
            axes |= 1LL << d;
            continue;
        }
        if (xs.dim[k] == 1 && ys.dim[d] != 1) axes |= 1LL << d;
        k++;
    }
    int summed = axes ? mpt_b_reduce(g, MPT_OP_REDUCE_SUM, dy, axes) : dy;
    return mpt_b_reshape(g, summed, xs);
}

/* y = transpose(x, perm): dx = transpose(dy, perm^-1). */
static int transpose_rule(mpt_graph *g, int y, int dy) {
    int rank = g->nodes[y].shape.rank, inv[MPT_MAX_DIMS];
    for (int d = 0; d < rank; d++) inv[(g->nodes[y].attr.i[0] >> (4 * d)) & 0xf] = d;
    return mpt_b_transpose(g, dy, inv);
}

/* y = slice(x, axis, start): dx is dy at [start, start+len) along the axis
 * and zeros before and after it (a part of no length is left out). The
 * zeros are constants of the part's shape, not broadcasts: a constant is
 * read as a literal where the concat is computed, a broadcast would be a
 * kernel of its own writing zeros to memory. */
static int slice_rule(mpt_graph *g, int x, int y, int dy) {
    int ax = (int)g->nodes[y].attr.i[0];
    int64_t start = g->nodes[y].attr.i[1], len = g->nodes[y].shape.dim[ax];
    mpt_shape part = g->nodes[x].shape;
    int64_t after = part.dim[ax] - start - len;
    mpt_dtype dt = g->nodes[dy].dtype;
    int dx = dy;
    if (start > 0) {
        part.dim[ax] = start;
        dx = mpt_b_concat(g, mpt_b_const(g, dt, part, 0.0), dx, ax);
    }
    if (after > 0) {
        part.dim[ax] = after;
        dx = mpt_b_concat(g, dx, mpt_b_const(g, dt, part, 0.0), ax);
    }
    return dx;
}

/* y = concat(a, b, axis): each input's gradient is its part of dy. */
static void concat_rule(mpt_ad *ad, int y, int a, int b, int dy) {
    mpt_graph *g = ad->g;
    int ax = (int)g->nodes[y].attr.i[0];
    int64_t la = g->nodes[a].shape.dim[ax], lb = g->nodes[b].shape.dim[ax];
    if (wants(ad, a)) accumulate(ad, a, mpt_b_slice(g, dy, ax, 0, la));
    if (wants(ad, b)) accumulate(ad, b, mpt_b_slice(g, dy, ax, la, lb));
}

/* C = op(A) op(B) with op = transpose where the flag says. Each gradient is
 * one matmul whose flags absorb the transposes, so no TRANSPOSE node is
 * made:
 *   ta tb   dA                 dB
 *   0  0    dC B^T             A^T dC
 *   0  1    dC B               dC^T A
 *   1  0    B dC^T             A dC
 *   1  1    B^T dC^T           dC^T A^T
 * batch_matmul's rule is the same per batch, the transposes acting on the
 * last two dims, so its gradients are batch_matmuls with these flags. */
static void matmul_rule(mpt_ad *ad, int c, int a, int b, int dc) {
    mpt_graph *g = ad->g;
    int ta = (int)g->nodes[c].attr.i[0], tb = (int)g->nodes[c].attr.i[1];
    /* a batch matmul that wrote f32 from low operands: its gradient runs
     * in the operands' dtype, as the cast back of any op's gradient */
    mpt_dtype in_dt = g->nodes[a].dtype;
    if (g->nodes[c].op == MPT_OP_BATCH_MATMUL && g->nodes[dc].dtype != in_dt)
        dc = mpt_b_cast(g, dc, in_dt);
    int (*mm)(mpt_graph *, int, int, int, int) =
        g->nodes[c].op == MPT_OP_BATCH_MATMUL ? mpt_b_batch_matmul : mpt_b_matmul;
    if (wants(ad, a)) accumulate(ad, a, ta ? mm(g, b, dc, tb, 1) : mm(g, dc, b, 0, !tb));
    if (wants(ad, b)) accumulate(ad, b, tb ? mm(g, dc, a, 1, ta) : mm(g, a, dc, !ta, 0));
}

/* o = attention(q, k, v, mask): FlashAttention-2's backward, one
 * attention_grad per wanted input, reading the row log-sum-exp of the
 * scores (attention_lse; fusion computes it in the forward kernel) rather
 * than the probabilities, which are never stored. */
static void attention_rule(mpt_ad *ad, int o, int dout) {
    mpt_graph *g = ad->g;
    mpt_node n = g->nodes[o];
    int lse = mpt_b_attention_lse(g, n.in[0], n.in[1], n.in[3], (int)n.attr.i[0], (int)n.attr.i[6], n.attr.f);
    int in[8] = {n.in[0], n.in[1], n.in[2], o, dout, lse, n.in[3], n.in[4]};
    /* which, causal, zero_masked, the dropout's seed, threshold, scale, the layout */
    mpt_attr a = {.i = {0, n.attr.i[0], n.attr.i[1], n.attr.i[3], n.attr.i[4], n.attr.i[5], n.attr.i[6]},
                  .f = n.attr.f};
    for (int w = 0; w < 3; w++)
        if (wants(ad, n.in[w])) {
            a.i[0] = w;
            accumulate(ad, n.in[w], mpt_b_attention_grad(g, in, &a));
        }
}

/* The three convolution ops are one bilinear form <dy, conv2d(x, w)> seen
 * from each side, so their gradients are each other with the same attrs:
 *   y  = conv2d(x, w):            dx = bwd_data(dy, w),  dw = bwd_filter(x, dy)
 *   dx = bwd_data(dy, w), grad g: ddy = conv2d(g, w),    dw = bwd_filter(g, dy)
 *   dw = bwd_filter(x, dy), g:    dx = bwd_data(dy, g),  ddy = conv2d(x, g) */
static void conv_rule(mpt_ad *ad, int id, int dout) {
    mpt_graph *g = ad->g;
    mpt_node n = g->nodes[id];
    int a = n.in[0], b = n.in[1];
    int sh = (int)n.attr.i[0], sw = (int)n.attr.i[1], ph = (int)n.attr.i[2],
        pw = (int)n.attr.i[3];
    mpt_shape as = g->nodes[a].shape, bs = g->nodes[b].shape;
    if (n.op == MPT_OP_CONV2D) { /* a = x, b = w */
        if (wants(ad, a)) accumulate(ad, a, mpt_b_conv2d_bwd_data(g, dout, b, sh, sw, ph, pw, as));
        if (wants(ad, b)) accumulate(ad, b, mpt_b_conv2d_bwd_filter(g, a, dout, sh, sw, ph, pw, bs));
    } else if (n.op == MPT_OP_CONV2D_BWD_DATA) { /* a = dy, b = w */
        if (wants(ad, a)) accumulate(ad, a, mpt_b_conv2d(g, dout, b, sh, sw, ph, pw, as));
        if (wants(ad, b)) accumulate(ad, b, mpt_b_conv2d_bwd_filter(g, dout, a, sh, sw, ph, pw, bs));
    } else { /* a = x, b = dy */
        assert(n.op == MPT_OP_CONV2D_BWD_FILTER);
        if (wants(ad, a)) accumulate(ad, a, mpt_b_conv2d_bwd_data(g, b, dout, sh, sw, ph, pw, as));
        if (wants(ad, b)) accumulate(ad, b, mpt_b_conv2d(g, a, dout, sh, sw, ph, pw, bs));
    }
}

/* ---- the rule table ---------------------------------------------------------
 * Adds the contributions of node id, whose gradient is dy, to the gradients
 * of its active inputs. Returns NULL, or a static message when the op has no
 * gradient for an input that needs one. */
static const char *rule(mpt_ad *ad, int id, int dy) {
    mpt_graph *g = ad->g;
    mpt_node n = g->nodes[id]; /* a copy: building may move g->nodes */
    int x = n.n_in > 0 ? n.in[0] : -1, b = n.n_in > 1 ? n.in[1] : -1;
    int c = n.n_in > 2 ? n.in[2] : -1;
    int64_t axes = n.attr.i[0];

    switch (n.op) {
    /* sources, and ops whose results are ids or truth values: nothing flows */
    case MPT_OP_INPUT: case MPT_OP_VARIABLE: case MPT_OP_CONST: case MPT_OP_IOTA:
    case MPT_OP_RANDOM_UNIFORM: case MPT_OP_IS_FINITE: case MPT_OP_NOT: case MPT_OP_LT:
    case MPT_OP_GT: case MPT_OP_EQ: case MPT_OP_AND: case MPT_OP_REDUCE_ALL:
    case MPT_OP_ARGMAX: case MPT_OP_ONE_HOT:
        return NULL;

    case MPT_OP_ATTENTION: attention_rule(ad, id, dy); return NULL;
    case MPT_OP_ATTENTION_LSE:
    case MPT_OP_ATTENTION_GRAD:
        return "attention_lse and attention_grad have no gradient (no second derivatives of attention)";
    /* the sum over ranks of x: each rank's x reaches every rank's result */
    case MPT_OP_ALLREDUCE: accumulate(ad, x, mpt_b_allreduce(g, dy)); return NULL;
    /* the sharded optimizer's ops come after the backward pass */
    case MPT_OP_REDUCE_SCATTER: case MPT_OP_ALL_GATHER: case MPT_OP_RANK_SLICE:
        return "the sharded optimizer's collectives have no gradient";
    case MPT_OP_NEG: accumulate(ad, x, un(g, MPT_OP_NEG, dy)); return NULL;
    case MPT_OP_ABS: accumulate(ad, x, abs_rule(g, x, dy)); return NULL;
    case MPT_OP_EXP: accumulate(ad, x, mul(g, dy, id)); return NULL;
    case MPT_OP_LOG: accumulate(ad, x, bin(g, MPT_OP_DIV, dy, x)); return NULL;
    case MPT_OP_SQRT: accumulate(ad, x, bin(g, MPT_OP_DIV, scale_by(g, dy, 0.5), id)); return NULL;
    case MPT_OP_RSQRT: /* d x^(-1/2) = -1/2 x^(-3/2) = -1/2 y^3 */
        accumulate(ad, x, mul(g, scale_by(g, dy, -0.5), mul(g, id, un(g, MPT_OP_SQUARE, id))));
        return NULL;
    case MPT_OP_RECIP: /* d 1/x = -1/x^2 = -y^2 */
        accumulate(ad, x, un(g, MPT_OP_NEG, mul(g, dy, un(g, MPT_OP_SQUARE, id))));
        return NULL;
    case MPT_OP_SQUARE: accumulate(ad, x, mul(g, scale_by(g, x, 2.0), dy)); return NULL;
    case MPT_OP_RELU:
        /* the mask from the output (y > 0 exactly where x > 0): the
         * pre-activation is then needed by nothing after the forward pass,
         * so a GEMM with a relu epilogue stores only y (and cuBLASLt's
         * RELU_BIAS can run it, which stores no pre-activation) */
        accumulate(ad, x, where(g, bin(g, MPT_OP_GT, id, full_like(g, id, 0.0)), dy));
        return NULL;
    case MPT_OP_SIGMOID: { /* s (1 - s), from the forward output */
        int one_minus = bin(g, MPT_OP_SUB, full_like(g, id, 1.0), id);
        accumulate(ad, x, mul(g, dy, mul(g, id, one_minus)));
        return NULL;
    }
    case MPT_OP_TANH: {
        int one_minus = bin(g, MPT_OP_SUB, full_like(g, id, 1.0), un(g, MPT_OP_SQUARE, id));
        accumulate(ad, x, mul(g, dy, one_minus));
        return NULL;
    }
    case MPT_OP_SIN: accumulate(ad, x, mul(g, dy, un(g, MPT_OP_COS, x))); return NULL;
    case MPT_OP_COS: accumulate(ad, x, mul(g, dy, un(g, MPT_OP_NEG, un(g, MPT_OP_SIN, x)))); return NULL;
    case MPT_OP_GELU: accumulate(ad, x, mul(g, dy, un(g, MPT_OP_GELU_GRAD, x))); return NULL;
    case MPT_OP_GELU_GRAD: accumulate(ad, x, gelu_grad_rule(g, x, dy)); return NULL;
    case MPT_OP_CAST: accumulate(ad, x, mpt_b_cast(g, dy, g->nodes[x].dtype)); return NULL;

    case MPT_OP_ADD:
        if (wants(ad, x)) accumulate(ad, x, dy);
        if (wants(ad, b)) accumulate(ad, b, dy);
        return NULL;
    case MPT_OP_SUB:
        if (wants(ad, x)) accumulate(ad, x, dy);
        if (wants(ad, b)) accumulate(ad, b, un(g, MPT_OP_NEG, dy));
        return NULL;
    case MPT_OP_MUL:
        if (wants(ad, x)) accumulate(ad, x, mul(g, dy, b));
        if (wants(ad, b)) accumulate(ad, b, mul(g, dy, x));
        return NULL;
    case MPT_OP_DIV: /* y = a / b: da = dy / b, db = -dy y / b */
        if (wants(ad, x)) accumulate(ad, x, bin(g, MPT_OP_DIV, dy, b));
        if (wants(ad, b))
            accumulate(ad, b, un(g, MPT_OP_NEG, bin(g, MPT_OP_DIV, mul(g, dy, id), b)));
        return NULL;
    case MPT_OP_MAX:
    case MPT_OP_MIN: { /* the first operand wins ties */
        int second = bin(g, n.op == MPT_OP_MAX ? MPT_OP_LT : MPT_OP_GT, x, b);
        if (wants(ad, x)) accumulate(ad, x, where_not(g, second, dy));
        if (wants(ad, b)) accumulate(ad, b, where(g, second, dy));
        return NULL;
    }
    case MPT_OP_POW: pow_rule(ad, id, x, b, dy); return NULL;
    case MPT_OP_SELECT: /* x is the condition: no gradient */
        if (wants(ad, b)) accumulate(ad, b, where(g, x, dy));
        if (wants(ad, c)) accumulate(ad, c, where_not(g, x, dy));
        return NULL;

    case MPT_OP_REDUCE_SUM:
        accumulate(ad, x, mpt_b_broadcast(g, dy, g->nodes[x].shape,
                                          kept_dims(g->nodes[x].shape.rank, axes)));
        return NULL;
    case MPT_OP_REDUCE_MAX: accumulate(ad, x, reduce_max_rule(g, x, id, dy, axes)); return NULL;

    case MPT_OP_BROADCAST: accumulate(ad, x, broadcast_rule(g, x, id, dy)); return NULL;
    case MPT_OP_RESHAPE: accumulate(ad, x, mpt_b_reshape(g, dy, g->nodes[x].shape)); return NULL;
    case MPT_OP_TRANSPOSE: accumulate(ad, x, transpose_rule(g, id, dy)); return NULL;
    case MPT_OP_GATHER: /* table rows receive the sum of their gathered copies */
        if (wants(ad, x))
            accumulate(ad, x, mpt_b_scatter_add(g, b, dy, g->nodes[x].shape.dim[0]));
        return NULL;
    case MPT_OP_SCATTER_ADD: /* x = ids; each update reads its row back */
        if (wants(ad, b)) accumulate(ad, b, mpt_b_gather(g, dy, x));
        return NULL;
    case MPT_OP_SLICE: accumulate(ad, x, slice_rule(g, x, id, dy)); return NULL;
    case MPT_OP_CONCAT: concat_rule(ad, id, x, b, dy); return NULL;

    case MPT_OP_MATMUL:
    case MPT_OP_BATCH_MATMUL:
        matmul_rule(ad, id, x, b, dy);
        return NULL;
    case MPT_OP_CONV2D:
    case MPT_OP_CONV2D_BWD_DATA:
    case MPT_OP_CONV2D_BWD_FILTER:
        conv_rule(ad, id, dy);
        return NULL;

    case MPT_OP_MAX_POOL: accumulate(ad, x, mpt_b_max_pool_grad(g, x, dy, &n.attr)); return NULL;
    case MPT_OP_MAX_POOL_GRAD:
        /* piecewise constant in x (zero gradient almost everywhere); linear
         * in dy, but its transpose (read dx at each window's first maximum)
         * is no op of the IR */
        if (wants(ad, b))
            return "max_pool_grad has no gradient with respect to dy (second derivatives of "
                   "max pooling are not supported)";
        return NULL;
    case MPT_OP_AVG_POOL:
        accumulate(ad, x, mpt_b_avg_pool_grad(g, dy, &n.attr, g->nodes[x].shape));
        return NULL;
    case MPT_OP_AVG_POOL_GRAD: /* the transpose of avg_pool, so its transpose is avg_pool */
        accumulate(ad, x, mpt_b_pool(g, MPT_OP_AVG_POOL, dy, (int)n.attr.i[0], (int)n.attr.i[1],
                                     (int)n.attr.i[2], (int)n.attr.i[3], (int)n.attr.i[4],
                                     (int)n.attr.i[5], g->nodes[x].shape));
        return NULL;

    case MPT_OP_COUNT:
        break;
    }
    assert(!"autodiff rule: not an op");
    return "not an op";
}

/* ---- the pass --------------------------------------------------------------- */

/* active[i]: i is float, depends on some wrt node through float values, and
 * y depends on it through float values. */
static void mark_active(const mpt_graph *g, int y, const int *wrt, int n_wrt, char *active) {
    char *from_wrt = calloc((size_t)y + 1, 1);
    assert(from_wrt && "out of memory in autodiff");
    for (int i = 0; i < n_wrt; i++)
        if (wrt[i] <= y) from_wrt[wrt[i]] = 1;
    for (int i = 0; i <= y; i++) {
        const mpt_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in && !from_wrt[i]; k++) from_wrt[i] = from_wrt[n->in[k]];
        if (!mpt_dtype_is_float(n->dtype)) from_wrt[i] = 0;
    }
    active[y] = from_wrt[y];
    for (int i = y; i >= 0; i--) {
        if (!active[i]) continue;
        const mpt_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            if (from_wrt[n->in[k]]) active[n->in[k]] = 1;
    }
    free(from_wrt);
}

static int any_input_active(const mpt_ad *ad, int id) {
    const mpt_node *n = &ad->g->nodes[id];
    for (int k = 0; k < n->n_in; k++)
        if (ad->active[n->in[k]]) return 1;
    return 0;
}

/* A non-scalar y is accepted: its seed of ones makes the result the
 * gradient of the sum of y's elements, as tf.GradientTape does. */
int mpt_autodiff(mpt_graph *g, int y, int seed, const int *wrt, int n_wrt, int *grads,
                 char *err, size_t errlen) {
    if (y < 0 || y >= g->n_nodes) {
        snprintf(err, errlen, "autodiff: y is node %d, not a node of the graph", y);
        return -1;
    }
    const mpt_node *yn = &g->nodes[y];
    if (!mpt_dtype_is_float(yn->dtype)) {
        snprintf(err, errlen, "autodiff: y (node %d, %s) is %s; only float values have gradients",
                 y, mpt_op_name(yn->op), mpt_dtype_name(yn->dtype));
        return -1;
    }
    if (seed >= 0 && (seed >= g->n_nodes || g->nodes[seed].dtype != yn->dtype ||
                      !mpt_shape_eq(g->nodes[seed].shape, yn->shape))) {
        snprintf(err, errlen, "autodiff: the seed (node %d) must have y's shape and dtype (%s)",
                 seed, mpt_dtype_name(yn->dtype));
        return -1;
    }
    for (int i = 0; i < n_wrt; i++)
        if (wrt[i] < 0 || wrt[i] >= g->n_nodes) {
            snprintf(err, errlen, "autodiff: wrt[%d] is node %d, not a node of the graph", i,
                     wrt[i]);
            return -1;
        }

    int n0 = g->n_nodes; /* gradient nodes are appended after these */
    mpt_ad ad = {g, malloc((size_t)n0 * sizeof(int)), calloc((size_t)n0, 1)};
    assert(ad.grad && ad.active && "out of memory in autodiff");
    for (int i = 0; i < n0; i++) ad.grad[i] = -1;
    mark_active(g, y, wrt, n_wrt, ad.active);

    /* builder state is the caller's: new nodes carry the layer whose
     * gradient they compute, and the caller's layer comes back at the end */
    char *saved_layer = g->build_layer ? strdup(g->build_layer) : NULL;
    const char *msg = NULL;
    if (ad.active[y]) {
        mpt_b_layer(g, g->nodes[y].layer);
        ad.grad[y] = seed >= 0 ? seed : full_like(g, y, 1.0);
    }
    for (int i = y; i >= 0 && !msg; i--) {
        if (!ad.active[i] || ad.grad[i] < 0 || !any_input_active(&ad, i)) continue;
        mpt_b_layer(g, g->nodes[i].layer);
        msg = rule(&ad, i, ad.grad[i]);
        if (msg) {
            const char *layer = g->nodes[i].layer;
            snprintf(err, errlen, "autodiff: node %d (%s%s%s): %s", i, mpt_op_name(g->nodes[i].op),
                     layer ? ", layer " : "", layer ? layer : "", msg);
        }
    }
    mpt_b_layer(g, saved_layer);
    free(saved_layer);

    if (!msg)
        for (int i = 0; i < n_wrt; i++) grads[i] = ad.active[wrt[i]] ? ad.grad[wrt[i]] : -1;
    free(ad.grad);
    free(ad.active);
    return msg ? -1 : 0;
}
