/* tests/test_grad.c — mpt_autodiff checked against finite differences.
 *
 * Every case builds out = op(inputs) in f64, then y = reduce_sum(out * w)
 * with fixed random weights w, so every element of out matters and with a
 * weight of its own (a wrong transpose or a gradient sent to the wrong
 * element cannot cancel). The gradient of y with respect to every float
 * input is built by mpt_autodiff, run on the reference interpreter, and
 * compared element by element with the central difference
 *     (y(x + h) - y(x - h)) / (2h),  h = 1e-6 * max(1, |x|).
 *
 * Why |fd - ad| <= 1e-6 + 1e-5 |fd| is the right bound in f64: the central
 * difference's truncation error is h^2 |y'''| / 6, about 1e-13 for the
 * smooth, O(1)-sized functions here; its rounding error is about
 * eps |y| / h = 1e-16 * |y| / 1e-6 = 1e-10 |y|, at most ~1e-8 for the
 * |y| < 100 of these cases. Both sit two orders below the bound, while a
 * wrong rule (a missing factor, a transpose, a sign, a lost consumer) is off
 * by O(|fd|) and fails it. Inputs are kept away from kinks (relu and abs at
 * 0, ties of max, reduce_max and max_pool) by more than h, where the
 * one-sided derivatives differ and no finite difference is meaningful.
 */
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "tests/check.h"

#define MAX_CASE_INPUTS 8

typedef struct {
    mpt_graph *g;
    int n;
    int node[MAX_CASE_INPUTS];
    mpt_tensor val[MAX_CASE_INPUTS];
    uint64_t rng;
} gcase;

static double rnd(gcase *c) { /* xorshift64*, uniform in [0, 1) */
    c->rng ^= c->rng >> 12;
    c->rng ^= c->rng << 25;
    c->rng ^= c->rng >> 27;
    return (double)((c->rng * 2685821657736338717ull) >> 11) * 0x1p-53;
}

static int add_input(gcase *c, const char *name, mpt_dtype dt, mpt_shape s) {
    CHECK(c->n < MAX_CASE_INPUTS);
    int id = mpt_b_input(c->g, name, dt, s);
    c->node[c->n] = id;
    CHECK(mpt_tensor_alloc(&c->val[c->n], dt, s) == 0);
    c->n++;
    return id;
}

/* an f64 input uniform in [lo, hi) */
static int in_uniform(gcase *c, const char *name, mpt_shape s, double lo, double hi) {
    int id = add_input(c, name, MPT_DT_F64, s);
    for (int64_t i = 0; i < mpt_shape_numel(s); i++)
        mpt_tensor_set(&c->val[c->n - 1], i, lo + (hi - lo) * rnd(c));
    return id;
}

/* an f64 input in [-2, 2] with |v| >= 0.1: away from the kinks at 0 */
static int in_nonzero(gcase *c, const char *name, mpt_shape s) {
    int id = add_input(c, name, MPT_DT_F64, s);
    for (int64_t i = 0; i < mpt_shape_numel(s); i++) {
        double v = 0.1 + 1.9 * rnd(c);
        mpt_tensor_set(&c->val[c->n - 1], i, rnd(c) < 0.5 ? -v : v);
    }
    return id;
}

/* n values pairwise at least 0.05 apart (a shuffled ladder plus jitter), so
 * no max ties and none created by perturbing */
static void distinct_values(gcase *c, double *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) v[i] = -1.0 + 0.1 * (double)i + 0.04 * rnd(c);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(rnd(c) * (double)(i + 1));
        double t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

static int in_distinct(gcase *c, const char *name, mpt_shape s) {
    int id = add_input(c, name, MPT_DT_F64, s);
    distinct_values(c, c->val[c->n - 1].data, mpt_shape_numel(s));
    return id;
}

static int in_ids(gcase *c, const char *name, mpt_shape s, const int *ids) {
    int id = add_input(c, name, MPT_DT_I32, s);
    for (int64_t i = 0; i < mpt_shape_numel(s); i++) mpt_tensor_set(&c->val[c->n - 1], i, ids[i]);
    return id;
}

static int64_t all_axes(mpt_shape s) { return (1LL << s.rank) - 1; }

/* Runs c->g; out[0] is y, out[1 + k] the k-th gradient. */
static int run(gcase *c, mpt_tensor *out) {
    mpt_tensor feed[MAX_CASE_INPUTS];
    for (int k = 0; k < mpt_graph_n_inputs(c->g); k++) {
        int node = mpt_graph_input_node(c->g, k);
        for (int j = 0; j < c->n; j++)
            if (c->node[j] == node) feed[k] = c->val[j];
    }
    char err[512];
    if (mpt_interp_run(c->g, feed, NULL, out, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "interpreter: %s\n", err);
        return -1;
    }
    return 0;
}

static double run_y(gcase *c) {
    mpt_tensor out[1 + MAX_CASE_INPUTS];
    if (run(c, out) != 0) return NAN;
    double y = mpt_tensor_get(&out[0], 0);
    for (int k = 0; k < c->g->n_outputs; k++) mpt_tensor_free(&out[k]);
    return y;
}

/* The harness: out = build(c); y = sum(out * w); check every float input. */
static void check_case(const char *name, int (*build)(gcase *c), uint64_t seed) {
    gcase c = {.g = mpt_graph_new(name), .rng = seed * 0x9E3779B97F4A7C15ull + 1};
    int out = build(&c);
    int n_case = c.n;
    int w = in_uniform(&c, "fd_weights", c.g->nodes[out].shape, 0.5, 1.5);
    int prod = mpt_b_binary(c.g, MPT_OP_MUL, out, w);
    int y = c.g->nodes[prod].shape.rank ? mpt_b_reduce(c.g, MPT_OP_REDUCE_SUM, prod,
                                                       all_axes(c.g->nodes[prod].shape))
                                        : prod;
    int wrt[MAX_CASE_INPUTS], grads[MAX_CASE_INPUTS], which[MAX_CASE_INPUTS], n_wrt = 0;
    for (int j = 0; j < n_case; j++)
        if (mpt_dtype_is_float(c.g->nodes[c.node[j]].dtype)) {
            which[n_wrt] = j;
            wrt[n_wrt++] = c.node[j];
        }
    char err[512], vbuf[512];
    int rc = mpt_autodiff(c.g, y, -1, wrt, n_wrt, grads, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: autodiff failed: %s", name, err);
    const char *bad = mpt_graph_verify(c.g, vbuf, sizeof vbuf);
    CHECK_MSG(!bad, "%s: graph after autodiff does not verify: %s", name, bad);
    if (rc != 0 || bad) goto done;
    mpt_graph_add_output(c.g, "y", y);
    for (int k = 0; k < n_wrt; k++) {
        char oname[32];
        snprintf(oname, sizeof oname, "grad%d", k);
        /* no gradient means zero: the finite difference must agree */
        if (grads[k] >= 0) mpt_graph_add_output(c.g, oname, grads[k]);
    }
    mpt_tensor res[1 + MAX_CASE_INPUTS];
    if (run(&c, res) != 0) {
        CHECK_MSG(0, "%s: the interpreter failed on the gradient graph", name);
        goto done;
    }
    int failures_before = check_failures;
    for (int k = 0, out_k = 1; k < n_wrt; k++) {
        mpt_tensor *x = &c.val[which[k]];
        const mpt_tensor *ad = grads[k] >= 0 ? &res[out_k++] : NULL;
        for (int64_t i = 0; i < mpt_shape_numel(x->shape); i++) {
            double x0 = mpt_tensor_get(x, i), h = 1e-6 * (fabs(x0) > 1 ? fabs(x0) : 1);
            mpt_tensor_set(x, i, x0 + h);
            double yp = run_y(&c);
            double xp = mpt_tensor_get(x, i);
            mpt_tensor_set(x, i, x0 - h);
            double ym = run_y(&c);
            double xm = mpt_tensor_get(x, i);
            mpt_tensor_set(x, i, x0);
            double fd = (yp - ym) / (xp - xm), g = ad ? mpt_tensor_get(ad, i) : 0.0;
            CHECK_MSG(fabs(fd - g) <= 1e-6 + 1e-5 * fabs(fd),
                      "%s: d y / d %s[%lld]: autodiff %.12g, finite difference %.12g", name,
                      c.g->nodes[wrt[k]].name, (long long)i, g, fd);
            if (check_failures - failures_before > 8) break; /* enough to see the pattern */
        }
    }
    for (int k = 0; k < c.g->n_outputs; k++) mpt_tensor_free(&res[k]);
done:
    for (int j = 0; j < c.n; j++) mpt_tensor_free(&c.val[j]);
    mpt_graph_free(c.g);
}

/* ---- elementwise ----------------------------------------------------------- */

static const mpt_shape S23 = {2, {2, 3}};

#define UNARY_CASE(fn, op, maker)                                              \
    static int fn(gcase *c) { return mpt_b_unary(c->g, op, maker); }
UNARY_CASE(c_neg, MPT_OP_NEG, in_uniform(c, "x", S23, -2, 2))
UNARY_CASE(c_abs, MPT_OP_ABS, in_nonzero(c, "x", S23))
UNARY_CASE(c_exp, MPT_OP_EXP, in_uniform(c, "x", S23, -2, 2))
UNARY_CASE(c_log, MPT_OP_LOG, in_uniform(c, "x", S23, 0.3, 3))
UNARY_CASE(c_sqrt, MPT_OP_SQRT, in_uniform(c, "x", S23, 0.3, 3))
UNARY_CASE(c_rsqrt, MPT_OP_RSQRT, in_uniform(c, "x", S23, 0.3, 3))
UNARY_CASE(c_recip, MPT_OP_RECIP, in_nonzero(c, "x", S23))
UNARY_CASE(c_square, MPT_OP_SQUARE, in_uniform(c, "x", S23, -2, 2))
UNARY_CASE(c_relu, MPT_OP_RELU, in_nonzero(c, "x", S23))
UNARY_CASE(c_sigmoid, MPT_OP_SIGMOID, in_uniform(c, "x", S23, -3, 3))
UNARY_CASE(c_tanh, MPT_OP_TANH, in_uniform(c, "x", S23, -2, 2))
UNARY_CASE(c_gelu, MPT_OP_GELU, in_uniform(c, "x", S23, -3, 3))
UNARY_CASE(c_gelu_grad, MPT_OP_GELU_GRAD, in_uniform(c, "x", S23, -3, 3))
UNARY_CASE(c_sin, MPT_OP_SIN, in_uniform(c, "x", S23, -4, 4))
UNARY_CASE(c_cos, MPT_OP_COS, in_uniform(c, "x", S23, -4, 4))

#define BINARY_CASE(fn, op, make_a, make_b)                                    \
    static int fn(gcase *c) {                                                  \
        int a = make_a, b = make_b;                                            \
        return mpt_b_binary(c->g, op, a, b);                                   \
    }
BINARY_CASE(c_add, MPT_OP_ADD, in_uniform(c, "a", S23, -2, 2), in_uniform(c, "b", S23, -2, 2))
BINARY_CASE(c_sub, MPT_OP_SUB, in_uniform(c, "a", S23, -2, 2), in_uniform(c, "b", S23, -2, 2))
BINARY_CASE(c_mul, MPT_OP_MUL, in_uniform(c, "a", S23, -2, 2), in_uniform(c, "b", S23, -2, 2))
BINARY_CASE(c_div, MPT_OP_DIV, in_uniform(c, "a", S23, -2, 2), in_nonzero(c, "b", S23))
BINARY_CASE(c_pow, MPT_OP_POW, in_uniform(c, "a", S23, 0.3, 2), in_uniform(c, "b", S23, -2, 2))

/* max/min: a and b drawn from one ladder so no pair ties */
static int max_min(gcase *c, mpt_op op) {
    double v[12];
    distinct_values(c, v, 12);
    int a = add_input(c, "a", MPT_DT_F64, S23), b = add_input(c, "b", MPT_DT_F64, S23);
    memcpy(c->val[c->n - 2].data, v, 6 * sizeof(double));
    memcpy(c->val[c->n - 1].data, v + 6, 6 * sizeof(double));
    return mpt_b_binary(c->g, op, a, b);
}
static int c_max(gcase *c) { return max_min(c, MPT_OP_MAX); }
static int c_min(gcase *c) { return max_min(c, MPT_OP_MIN); }

/* select: gradients to both branches, none to the condition's source */
static int c_select(gcase *c) {
    int k = in_nonzero(c, "k", S23);
    int a = in_uniform(c, "a", S23, -2, 2), b = in_uniform(c, "b", S23, -2, 2);
    int cond = mpt_b_binary(c->g, MPT_OP_GT, k, mpt_b_const(c->g, MPT_DT_F64, S23, 0.0));
    return mpt_b_select(c->g, cond, a, b);
}

/* several consumers of one node: the gradients must add up */
static int c_fanout(gcase *c) {
    int x = in_uniform(c, "x", S23, -1, 1);
    int e = mpt_b_unary(c->g, MPT_OP_EXP, x);
    return mpt_b_binary(c->g, MPT_OP_ADD, mpt_b_binary(c->g, MPT_OP_MUL, x, x),
                        mpt_b_binary(c->g, MPT_OP_MUL, e, x));
}

/* ---- reductions and data movement --------------------------------------------- */

static const mpt_shape S234 = {3, {2, 3, 4}};

static int c_reduce_sum_02(gcase *c) {
    return mpt_b_reduce(c->g, MPT_OP_REDUCE_SUM, in_uniform(c, "x", S234, -1, 1), 0x5);
}
static int c_reduce_sum_all(gcase *c) {
    return mpt_b_reduce(c->g, MPT_OP_REDUCE_SUM, in_uniform(c, "x", S234, -1, 1), 0x7);
}
static int c_reduce_max_1(gcase *c) {
    return mpt_b_reduce(c->g, MPT_OP_REDUCE_MAX, in_distinct(c, "x", S234), 0x2);
}
static int c_reduce_max_01(gcase *c) {
    return mpt_b_reduce(c->g, MPT_OP_REDUCE_MAX, in_distinct(c, "x", S234), 0x3);
}

/* broadcast cases: the input's shape, the output's, the dims mask */
static int bcast(gcase *c, mpt_shape in, mpt_shape out, int64_t mask) {
    return mpt_b_broadcast(c->g, in_uniform(c, "x", in, -1, 1), out, mask);
}
static int c_bcast_c_bc(gcase *c) { return bcast(c, mpt_shape_1(3), S23, 0x2); }
static int c_bcast_1c_bc(gcase *c) { return bcast(c, mpt_shape_2(1, 3), S23, 0x3); }
static int c_bcast_b1_bc(gcase *c) { return bcast(c, mpt_shape_2(2, 1), S23, 0x3); }
static int c_bcast_scalar(gcase *c) { return bcast(c, mpt_shape_scalar(), S23, 0x0); }
static int c_bcast_c_bhc(gcase *c) { return bcast(c, mpt_shape_1(4), S234, 0x4); }
static int c_bcast_b1c_bhc(gcase *c) {
    return bcast(c, (mpt_shape){3, {2, 1, 4}}, S234, 0x7);
}

static int c_reshape(gcase *c) {
    return mpt_b_reshape(c->g, in_uniform(c, "x", S234, -1, 1), mpt_shape_2(6, 4));
}
static int c_transpose(gcase *c) {
    static const int perm[3] = {2, 0, 1};
    return mpt_b_transpose(c->g, in_uniform(c, "x", S234, -1, 1), perm);
}

/* slices of x [2,3,4]: zeros after, before, on both sides and none in dx */
static int slice_case(gcase *c, int axis, int64_t start, int64_t len) {
    return mpt_b_slice(c->g, in_uniform(c, "x", S234, -1, 1), axis, start, len);
}
static int c_slice_first(gcase *c) { return slice_case(c, 0, 1, 1); }
static int c_slice_middle(gcase *c) { return slice_case(c, 1, 1, 1); }
static int c_slice_last(gcase *c) { return slice_case(c, 2, 0, 3); }
static int c_slice_all(gcase *c) { return slice_case(c, 1, 0, 3); }

/* concat of a [2,3,4] and b (its shape with dim axis = n) along axis */
static int concat_case(gcase *c, int axis, int64_t n) {
    mpt_shape sb = S234;
    sb.dim[axis] = n;
    int a = in_uniform(c, "a", S234, -1, 1);
    return mpt_b_concat(c->g, a, in_uniform(c, "b", sb, -1, 1), axis);
}
static int c_concat_first(gcase *c) { return concat_case(c, 0, 1); }
static int c_concat_middle(gcase *c) { return concat_case(c, 1, 2); }
static int c_concat_last(gcase *c) { return concat_case(c, 2, 3); }
/* one input twice: both slices of dy add up */
static int c_concat_self(gcase *c) {
    int x = in_uniform(c, "x", S234, -1, 1);
    return mpt_b_concat(c->g, x, x, 1);
}
/* an LSTM's gates: one [2,8] pre-activation split in two, each through its
 * own activation, and the halves joined again */
static int c_gates(gcase *c) {
    int z = in_uniform(c, "z", mpt_shape_2(2, 8), -2, 2);
    int i = mpt_b_unary(c->g, MPT_OP_SIGMOID, mpt_b_slice(c->g, z, 1, 0, 4));
    int g = mpt_b_unary(c->g, MPT_OP_TANH, mpt_b_slice(c->g, z, 1, 4, 4));
    return mpt_b_concat(c->g, mpt_b_binary(c->g, MPT_OP_MUL, i, g), i, 0);
}

/* ids repeat, so rows of the table gather from several places */
static int c_gather(gcase *c) {
    static const int ids[6] = {1, 4, 1, 0, 1, 3};
    int table = in_uniform(c, "table", mpt_shape_2(5, 3), -1, 1);
    return mpt_b_gather(c->g, table, in_ids(c, "ids", mpt_shape_2(2, 3), ids));
}
static int c_scatter_add(gcase *c) {
    static const int ids[4] = {2, 0, 2, 4};
    int idn = in_ids(c, "ids", mpt_shape_1(4), ids);
    return mpt_b_scatter_add(c->g, idn, in_uniform(c, "upd", mpt_shape_2(4, 3), -1, 1), 5);
}

/* ---- GEMM and convolution ----------------------------------------------------- */

/* [3,4] x [4,2] with the operands stored transposed where the flags say */
static int matmul_case(gcase *c, int ta, int tb) {
    int a = in_uniform(c, "a", ta ? mpt_shape_2(4, 3) : mpt_shape_2(3, 4), -1, 1);
    int b = in_uniform(c, "b", tb ? mpt_shape_2(2, 4) : mpt_shape_2(4, 2), -1, 1);
    return mpt_b_matmul(c->g, a, b, ta, tb);
}
static int c_matmul_nn(gcase *c) { return matmul_case(c, 0, 0); }
static int c_matmul_nt(gcase *c) { return matmul_case(c, 0, 1); }
static int c_matmul_tn(gcase *c) { return matmul_case(c, 1, 0); }
static int c_matmul_tt(gcase *c) { return matmul_case(c, 1, 1); }

/* batch_matmul of [2, 3,4] x [2, 4,2] (rank 3) or [2,2, 3,4] x [2,2, 4,2]
 * (rank 4), the last two dims stored transposed where the flags say */
static int bmm_case(gcase *c, int rank, int ta, int tb) {
    int64_t da[4] = {2, 2}, db[4] = {2, 2}, l = rank - 2;
    da[l] = ta ? 4 : 3, da[l + 1] = ta ? 3 : 4;
    db[l] = tb ? 2 : 4, db[l + 1] = tb ? 4 : 2;
    int a = in_uniform(c, "a", mpt_shape_make(rank, da), -1, 1);
    int b = in_uniform(c, "b", mpt_shape_make(rank, db), -1, 1);
    return mpt_b_batch_matmul(c->g, a, b, ta, tb);
}
static int c_bmm_nn(gcase *c) { return bmm_case(c, 3, 0, 0); }
static int c_bmm_nt(gcase *c) { return bmm_case(c, 3, 0, 1); }
static int c_bmm_tn(gcase *c) { return bmm_case(c, 3, 1, 0); }
static int c_bmm_tt(gcase *c) { return bmm_case(c, 3, 1, 1); }
static int c_bmm4_nt(gcase *c) { return bmm_case(c, 4, 0, 1); }
static int c_bmm4_tn(gcase *c) { return bmm_case(c, 4, 1, 0); }
/* one operand twice (x x^T per batch): both gradients add up in dx */
static int c_bmm_self(gcase *c) {
    int x = in_uniform(c, "x", mpt_shape_make(3, (const int64_t[]){2, 3, 4}), -1, 1);
    return mpt_b_batch_matmul(c->g, x, x, 0, 1);
}
/* attention: softmax(q k^T * 0.5) v per batch and head, [2,2, 3,4] each */
static int c_attention(gcase *c) {
    mpt_shape s = mpt_shape_make(4, (const int64_t[]){2, 2, 3, 4});
    int q = in_uniform(c, "q", s, -1, 1), k = in_uniform(c, "k", s, -1, 1);
    int v = in_uniform(c, "v", s, -1, 1);
    int sc = mpt_b_batch_matmul(c->g, q, k, 0, 1);
    sc = mpt_b_binary(c->g, MPT_OP_MUL, sc, mpt_b_const(c->g, c->g->nodes[sc].dtype, c->g->nodes[sc].shape, 0.5));
    int e = mpt_b_unary(c->g, MPT_OP_EXP, sc);
    int sum = mpt_b_reduce(c->g, MPT_OP_REDUCE_SUM, e, 1 << 3);
    int den = mpt_b_broadcast(c->g, sum, c->g->nodes[e].shape, 0x7);
    return mpt_b_batch_matmul(c->g, mpt_b_binary(c->g, MPT_OP_DIV, e, den), v, 0, 0);
}

/* Geometry of a 3x3 convolution over x [2,h,5,3] to 2 channels. h=6 and
 * W=5 with stride 2 and "same" give uneven (0,1) and even (1,1) padding;
 * "valid" uses h=7 so that the stride tiles the rows exactly (mpt_infer
 * refuses windows that leave trailing rows unread). */
typedef struct {
    mpt_shape x, w, y;
    int s, ph, pw;
} conv_geom;

static conv_geom conv_geometry(int stride, int same) {
    int64_t h = same ? 6 : 7;
    conv_geom q = {.x = mpt_shape_4(2, h, 5, 3), .w = mpt_shape_4(3, 3, 3, 2), .s = stride};
    int64_t lo, hi, oh, ow;
    if (same) {
        mpt_same_padding(h, 3, stride, &lo, &hi, &oh);
        q.ph = (int)lo;
        mpt_same_padding(5, 3, stride, &lo, &hi, &ow);
        q.pw = (int)lo;
    } else {
        oh = mpt_conv_out_size(h, 3, stride, 0, 0);
        ow = mpt_conv_out_size(5, 3, stride, 0, 0);
    }
    q.y = mpt_shape_4(2, oh, ow, 2);
    return q;
}

static int conv_case(gcase *c, int stride, int same) {
    conv_geom q = conv_geometry(stride, same);
    int x = in_uniform(c, "x", q.x, -1, 1), w = in_uniform(c, "w", q.w, -1, 1);
    return mpt_b_conv2d(c->g, x, w, q.s, q.s, q.ph, q.pw, q.y);
}
static int c_conv_s1_same(gcase *c) { return conv_case(c, 1, 1); }
static int c_conv_s2_same(gcase *c) { return conv_case(c, 2, 1); }
static int c_conv_s1_valid(gcase *c) { return conv_case(c, 1, 0); }
static int c_conv_s2_valid(gcase *c) { return conv_case(c, 2, 0); }

/* the rules of the backward convolutions themselves (second order) */
static int c_conv_bwd_data(gcase *c) {
    conv_geom q = conv_geometry(2, 1);
    int dy = in_uniform(c, "dy", q.y, -1, 1), w = in_uniform(c, "w", q.w, -1, 1);
    return mpt_b_conv2d_bwd_data(c->g, dy, w, q.s, q.s, q.ph, q.pw, q.x);
}
static int c_conv_bwd_filter(gcase *c) {
    conv_geom q = conv_geometry(2, 1);
    int x = in_uniform(c, "x", q.x, -1, 1), dy = in_uniform(c, "dy", q.y, -1, 1);
    return mpt_b_conv2d_bwd_filter(c->g, x, dy, q.s, q.s, q.ph, q.pw, q.w);
}

/* ---- pooling -------------------------------------------------------------------- */

/* x [2,h,6,2]; "valid" uses h=4 so a stride-2 window tiles the rows */
static int pool_case(gcase *c, mpt_op op, int win, int stride, int same) {
    int64_t h = same ? 5 : 4, lo_h = 0, lo_w = 0, hi, oh, ow;
    mpt_shape xs = mpt_shape_4(2, h, 6, 2);
    if (same) {
        mpt_same_padding(h, win, stride, &lo_h, &hi, &oh);
        mpt_same_padding(6, win, stride, &lo_w, &hi, &ow);
    } else {
        oh = mpt_conv_out_size(h, win, stride, 0, 0);
        ow = mpt_conv_out_size(6, win, stride, 0, 0);
    }
    int x = op == MPT_OP_MAX_POOL ? in_distinct(c, "x", xs) : in_uniform(c, "x", xs, -1, 1);
    return mpt_b_pool(c->g, op, x, win, win, stride, stride, (int)lo_h, (int)lo_w,
                      mpt_shape_4(2, oh, ow, 2));
}
static int c_max_pool_2s2_valid(gcase *c) { return pool_case(c, MPT_OP_MAX_POOL, 2, 2, 0); }
static int c_max_pool_3s2_same(gcase *c) { return pool_case(c, MPT_OP_MAX_POOL, 3, 2, 1); }
static int c_avg_pool_2s1_valid(gcase *c) { return pool_case(c, MPT_OP_AVG_POOL, 2, 1, 0); }
static int c_avg_pool_3s2_same(gcase *c) { return pool_case(c, MPT_OP_AVG_POOL, 3, 2, 1); }

/* avg_pool_grad as a forward op: 3x3 stride 2 "same" on [1,5,6,2] */
static int c_avg_pool_grad(gcase *c) {
    int64_t lo_h, lo_w, hi, oh, ow;
    mpt_same_padding(5, 3, 2, &lo_h, &hi, &oh);
    mpt_same_padding(6, 3, 2, &lo_w, &hi, &ow);
    mpt_attr a = {.i = {3, 3, 2, 2, lo_h, lo_w}};
    int dy = in_uniform(c, "dy", mpt_shape_4(1, oh, ow, 2), -1, 1);
    return mpt_b_avg_pool_grad(c->g, dy, &a, mpt_shape_4(1, 5, 6, 2));
}

/* ---- composites ------------------------------------------------------------------ */

/* mean over the batch of -log softmax(logits)[label], from primitives, with
 * the max subtracted first as every real implementation does */
static int softmax_ce(mpt_graph *g, int logits, int ids) {
    mpt_shape s = g->nodes[logits].shape;
    int m = mpt_b_broadcast(g, mpt_b_reduce(g, MPT_OP_REDUCE_MAX, logits, 0x2), s, 0x1);
    int z = mpt_b_binary(g, MPT_OP_SUB, logits, m);
    int lse = mpt_b_unary(g, MPT_OP_LOG,
                          mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_unary(g, MPT_OP_EXP, z), 0x2));
    int logp = mpt_b_binary(g, MPT_OP_SUB, z, mpt_b_broadcast(g, lse, s, 0x1));
    int picked = mpt_b_binary(g, MPT_OP_MUL, mpt_b_one_hot(g, ids, (int)s.dim[1], MPT_DT_F64), logp);
    int total = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, picked, 0x3);
    return mpt_b_binary(g, MPT_OP_MUL, total, mpt_b_scalar(g, MPT_DT_F64, -1.0 / (double)s.dim[0]));
}

static int c_softmax_ce(gcase *c) {
    static const int labels[4] = {2, 0, 4, 2};
    int logits = in_distinct(c, "logits", mpt_shape_2(4, 5));
    return softmax_ce(c->g, logits, in_ids(c, "labels", mpt_shape_1(4), labels));
}

/* dense(5, relu) -> dense(3) -> softmax cross-entropy, every parameter checked */
static int c_mlp(gcase *c) {
    static const int labels[4] = {1, 0, 2, 1};
    mpt_graph *g = c->g;
    int x = in_uniform(c, "x", mpt_shape_2(4, 6), -1, 1);
    int w1 = in_uniform(c, "w1", mpt_shape_2(6, 5), -1, 1);
    int b1 = in_uniform(c, "b1", mpt_shape_1(5), -0.5, 0.5);
    int w2 = in_uniform(c, "w2", mpt_shape_2(5, 3), -1, 1);
    int b2 = in_uniform(c, "b2", mpt_shape_1(3), -0.5, 0.5);
    int ids = in_ids(c, "labels", mpt_shape_1(4), labels);
    int h = mpt_b_binary(g, MPT_OP_ADD, mpt_b_matmul(g, x, w1, 0, 0),
                         mpt_b_broadcast_to(g, b1, mpt_shape_2(4, 5)));
    h = mpt_b_unary(g, MPT_OP_RELU, h);
    int logits = mpt_b_binary(g, MPT_OP_ADD, mpt_b_matmul(g, h, w2, 0, 0),
                              mpt_b_broadcast_to(g, b2, mpt_shape_2(4, 3)));
    return softmax_ce(g, logits, ids);
}

/* ---- structure: dtypes, layers, dead and absent gradients, errors --------------- */

/* Runs g (inputs fed in node order from `feeds`, no variables) and returns
 * output k's element i; NAN on failure. */
static double value_of(const mpt_graph *g, const mpt_tensor *feeds, mpt_tensor *vars, int k,
                       int64_t i) {
    mpt_tensor out[4];
    char err[512];
    if (mpt_interp_run(g, feeds, vars, out, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "interpreter: %s\n", err);
        return NAN;
    }
    double v = mpt_tensor_get(&out[k], i);
    for (int j = 0; j < g->n_outputs; j++) mpt_tensor_free(&out[j]);
    return v;
}

/* f64 -> f32 -> f64 round trip: the gradient is the same pair of casts
 * backwards, so it is the incoming gradient rounded to f32 */
static void test_cast_pair(void) {
    mpt_graph *g = mpt_graph_new("cast_pair");
    int x = mpt_b_input(g, "x", MPT_DT_F64, S23);
    int back = mpt_b_cast(g, mpt_b_cast(g, x, MPT_DT_F32), MPT_DT_F64);
    int y = mpt_b_reduce(g, MPT_OP_REDUCE_SUM,
                         mpt_b_binary(g, MPT_OP_MUL, back, mpt_b_const(g, MPT_DT_F64, S23, 0.1)),
                         0x3);
    int gx;
    char err[256];
    CHECK(mpt_autodiff(g, y, -1, &x, 1, &gx, err, sizeof err) == 0);
    const mpt_node *n = &g->nodes[gx];
    CHECK(n->op == MPT_OP_CAST && n->dtype == MPT_DT_F64);
    CHECK(g->nodes[n->in[0]].op == MPT_OP_CAST && g->nodes[n->in[0]].dtype == MPT_DT_F32);
    mpt_graph_add_output(g, "dx", gx);
    mpt_tensor xv;
    CHECK(mpt_tensor_alloc(&xv, MPT_DT_F64, S23) == 0);
    double got = value_of(g, &xv, NULL, 0, 4);
    CHECK(got == mpt_round_to(MPT_DT_F32, 0.1) && got != 0.1);
    mpt_tensor_free(&xv);
    mpt_graph_free(g);
}

/* An f32 variable cast to f16 for an f16 matmul: the backward matmuls are
 * f16, the variable's gradient f32 (a cast back), each gradient node is
 * tagged with the layer of the node it differentiates, and the builder's
 * own layer is left as it was. */
static void test_mixed_precision(void) {
    mpt_graph *g = mpt_graph_new("mixed");
    mpt_b_layer(g, "dense_1");
    int x = mpt_b_input(g, "x", MPT_DT_F16, mpt_shape_2(2, 4));
    int w = mpt_b_variable(g, "dense_1/kernel", mpt_shape_2(4, 3), MPT_INIT_ZEROS, 4, 3, 0, 1);
    int m = mpt_b_matmul(g, x, mpt_b_cast(g, w, MPT_DT_F16), 0, 0);
    mpt_b_layer(g, "loss");
    int y = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_cast(g, m, MPT_DT_F32), 0x3);
    mpt_b_layer(g, "outer");
    int n0 = g->n_nodes, wrt[2] = {w, x}, grads[2];
    char err[256], vbuf[256];
    CHECK(mpt_autodiff(g, y, -1, wrt, 2, grads, err, sizeof err) == 0);
    CHECK(mpt_graph_verify(g, vbuf, sizeof vbuf) == NULL);
    CHECK(strcmp(mpt_b_current_layer(g), "outer") == 0);
    const mpt_node *gw = &g->nodes[grads[0]];
    CHECK(gw->dtype == MPT_DT_F32 && gw->op == MPT_OP_CAST);
    CHECK(g->nodes[gw->in[0]].op == MPT_OP_MATMUL && g->nodes[gw->in[0]].dtype == MPT_DT_F16);
    CHECK(g->nodes[grads[1]].dtype == MPT_DT_F16 && g->nodes[grads[1]].op == MPT_OP_MATMUL);
    int n_matmul = 0;
    for (int i = n0; i < g->n_nodes; i++) {
        const mpt_node *n = &g->nodes[i];
        CHECK_MSG(n->layer != NULL, "gradient node %d (%s) has no layer", i, mpt_op_name(n->op));
        if (n->op != MPT_OP_MATMUL) continue;
        n_matmul++;
        CHECK(n->dtype == MPT_DT_F16);
        CHECK(n->layer && strcmp(n->layer, "dense_1") == 0);
    }
    CHECK(n_matmul == 2);

    /* with dy = 1 everywhere, dW[k][j] = sum_m x[m][k]: exact in f16 here */
    mpt_graph_add_output(g, "dw", grads[0]);
    mpt_tensor xv, wv;
    CHECK(mpt_tensor_alloc(&xv, MPT_DT_F16, mpt_shape_2(2, 4)) == 0);
    CHECK(mpt_tensor_alloc(&wv, MPT_DT_F32, mpt_shape_2(4, 3)) == 0);
    for (int i = 0; i < 8; i++) mpt_tensor_set(&xv, i, 0.25 * i - 0.5);
    CHECK(value_of(g, &xv, &wv, 0, 1 * 3 + 2) == (0.25 * 1 - 0.5) + (0.25 * 5 - 0.5));
    mpt_tensor_free(&xv);
    mpt_tensor_free(&wv);
    mpt_graph_free(g);
}

/* Only gradients on paths from y to wrt are built; nodes that y does not
 * depend on, that come after y, or that hold ids get none. */
static void test_dead_and_absent(void) {
    mpt_graph *g = mpt_graph_new("dead");
    int a = mpt_b_input(g, "a", MPT_DT_F64, S23), b = mpt_b_input(g, "b", MPT_DT_F64, S23);
    int ids = mpt_b_input(g, "ids", MPT_DT_I32, mpt_shape_1(2));
    int unused = mpt_b_unary(g, MPT_OP_EXP, a);
    int y = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_binary(g, MPT_OP_MUL, a, b), 0x3);
    int after = mpt_b_unary(g, MPT_OP_EXP, y);
    int n0 = g->n_nodes, wrt[5] = {a, ids, unused, after, y}, grads[5];
    char err[256];
    CHECK(mpt_autodiff(g, y, -1, wrt, 5, grads, err, sizeof err) == 0);
    CHECK(grads[0] >= n0);
    CHECK(grads[1] == -1 && grads[2] == -1 && grads[3] == -1);
    CHECK(grads[4] >= n0 && g->nodes[grads[4]].op == MPT_OP_CONST); /* dy/dy = the seed 1 */
    for (int i = n0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++)
            CHECK_MSG(g->nodes[i].in[k] != a, "node %d builds b's gradient nobody asked for", i);
    mpt_graph_free(g);
}

/* An explicit seed scales the whole backward pass: d(3 sum x^2)/dx = 6x. */
static void test_seed(void) {
    mpt_graph *g = mpt_graph_new("seed");
    int x = mpt_b_input(g, "x", MPT_DT_F64, S23);
    int y = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_unary(g, MPT_OP_SQUARE, x), 0x3);
    int seed = mpt_b_scalar(g, MPT_DT_F64, 3.0), gx;
    char err[256];
    CHECK(mpt_autodiff(g, y, seed, &x, 1, &gx, err, sizeof err) == 0);
    mpt_graph_add_output(g, "dx", gx);
    mpt_tensor xv;
    CHECK(mpt_tensor_alloc(&xv, MPT_DT_F64, S23) == 0);
    for (int i = 0; i < 6; i++) mpt_tensor_set(&xv, i, 0.5 * i - 1);
    CHECK(value_of(g, &xv, NULL, 0, 5) == 6 * (0.5 * 5 - 1));

    /* a seed of the wrong dtype is refused with a message, not an assert */
    int bad = mpt_b_scalar(g, MPT_DT_F32, 1.0);
    err[0] = 0;
    CHECK(mpt_autodiff(g, y, bad, &x, 1, &gx, err, sizeof err) == -1 && strstr(err, "seed"));
    mpt_tensor_free(&xv);
    mpt_graph_free(g);
}

/* reduce_max shares the gradient equally among tied maxima */
static void test_reduce_max_ties(void) {
    mpt_graph *g = mpt_graph_new("ties");
    int x = mpt_b_input(g, "x", MPT_DT_F64, mpt_shape_1(4)), gx;
    int y = mpt_b_reduce(g, MPT_OP_REDUCE_MAX, x, 0x1);
    char err[256];
    CHECK(mpt_autodiff(g, y, -1, &x, 1, &gx, err, sizeof err) == 0);
    mpt_graph_add_output(g, "dx", gx);
    static const double v[4] = {1, 3, 3, 2}, want[4] = {0, 0.5, 0.5, 0};
    mpt_tensor xv;
    CHECK(mpt_tensor_alloc(&xv, MPT_DT_F64, mpt_shape_1(4)) == 0);
    for (int i = 0; i < 4; i++) mpt_tensor_set(&xv, i, v[i]);
    for (int i = 0; i < 4; i++) CHECK(value_of(g, &xv, NULL, 0, i) == want[i]);
    mpt_tensor_free(&xv);
    mpt_graph_free(g);
}

/* max_pool_grad has no gradient in dy: asking for one is an error naming
 * the op and the layer; its gradient in x alone is none, not an error. */
static void test_no_rule(void) {
    mpt_graph *g = mpt_graph_new("no_rule");
    mpt_b_layer(g, "pool_1");
    int x = mpt_b_input(g, "x", MPT_DT_F64, mpt_shape_4(1, 4, 4, 1));
    int dy = mpt_b_input(g, "dy", MPT_DT_F64, mpt_shape_4(1, 2, 2, 1));
    mpt_attr pa = {.i = {2, 2, 2, 2, 0, 0}};
    int r = mpt_b_max_pool_grad(g, x, dy, &pa);
    int y = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, r, 0xf);
    int wrt[2] = {x, dy}, grads[2];
    char err[256] = "";
    CHECK(mpt_autodiff(g, y, -1, wrt, 2, grads, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "max_pool_grad") && strstr(err, "pool_1"), "message: %s", err);
    CHECK(strcmp(mpt_b_current_layer(g), "pool_1") == 0);
    CHECK(mpt_autodiff(g, y, -1, &x, 1, grads, err, sizeof err) == 0 && grads[0] == -1);
    int i32 = mpt_b_input(g, "ids", MPT_DT_I32, mpt_shape_1(2));
    CHECK(mpt_autodiff(g, i32, -1, &x, 1, grads, err, sizeof err) == -1 && strstr(err, "i32"));
    mpt_graph_free(g);
}

int main(void) {
    static const struct {
        const char *name;
        int (*build)(gcase *);
    } cases[] = {
        {"neg", c_neg}, {"abs", c_abs}, {"exp", c_exp}, {"log", c_log}, {"sqrt", c_sqrt},
        {"rsqrt", c_rsqrt}, {"recip", c_recip}, {"square", c_square}, {"relu", c_relu},
        {"sigmoid", c_sigmoid}, {"tanh", c_tanh}, {"gelu", c_gelu}, {"gelu_grad", c_gelu_grad},
        {"sin", c_sin}, {"cos", c_cos},
        {"add", c_add}, {"sub", c_sub}, {"mul", c_mul}, {"div", c_div}, {"pow", c_pow},
        {"max", c_max}, {"min", c_min}, {"select", c_select}, {"fanout", c_fanout},
        {"reduce_sum_02", c_reduce_sum_02}, {"reduce_sum_all", c_reduce_sum_all},
        {"reduce_max_1", c_reduce_max_1}, {"reduce_max_01", c_reduce_max_01},
        {"broadcast_c_bc", c_bcast_c_bc}, {"broadcast_1c_bc", c_bcast_1c_bc},
        {"broadcast_b1_bc", c_bcast_b1_bc}, {"broadcast_scalar", c_bcast_scalar},
        {"broadcast_c_bhc", c_bcast_c_bhc}, {"broadcast_b1c_bhc", c_bcast_b1c_bhc},
        {"reshape", c_reshape}, {"transpose", c_transpose}, {"gather", c_gather},
        {"scatter_add", c_scatter_add}, {"slice_first", c_slice_first},
        {"slice_middle", c_slice_middle}, {"slice_last", c_slice_last}, {"slice_all", c_slice_all},
        {"concat_first", c_concat_first}, {"concat_middle", c_concat_middle},
        {"concat_last", c_concat_last}, {"concat_self", c_concat_self}, {"lstm_gates", c_gates},
        {"matmul_nn", c_matmul_nn}, {"matmul_nt", c_matmul_nt},
        {"matmul_tn", c_matmul_tn}, {"matmul_tt", c_matmul_tt},
        {"batch_matmul_nn", c_bmm_nn}, {"batch_matmul_nt", c_bmm_nt},
        {"batch_matmul_tn", c_bmm_tn}, {"batch_matmul_tt", c_bmm_tt},
        {"batch_matmul4_nt", c_bmm4_nt}, {"batch_matmul4_tn", c_bmm4_tn},
        {"batch_matmul_self", c_bmm_self}, {"attention", c_attention},
        {"conv2d_s1_same", c_conv_s1_same}, {"conv2d_s2_same", c_conv_s2_same},
        {"conv2d_s1_valid", c_conv_s1_valid}, {"conv2d_s2_valid", c_conv_s2_valid},
        {"conv2d_bwd_data", c_conv_bwd_data}, {"conv2d_bwd_filter", c_conv_bwd_filter},
        {"max_pool_2s2_valid", c_max_pool_2s2_valid}, {"max_pool_3s2_same", c_max_pool_3s2_same},
        {"avg_pool_2s1_valid", c_avg_pool_2s1_valid}, {"avg_pool_3s2_same", c_avg_pool_3s2_same},
        {"avg_pool_grad", c_avg_pool_grad}, {"softmax_ce", c_softmax_ce}, {"mlp", c_mlp},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int before = check_failures;
        check_case(cases[i].name, cases[i].build, i + 1);
        printf("%-22s %s\n", cases[i].name, check_failures == before ? "ok" : "FAILED");
    }
    test_cast_pair();
    test_mixed_precision();
    test_dead_and_absent();
    test_seed();
    test_reduce_max_ties();
    test_no_rule();
    return check_exit("test_grad");
}
