/* tests/test_interp.c — the reference interpreter against hand-computed
 * values: every op, f16/bf16 overflow, underflow and ties, convolution and
 * pooling against naive formulas, updates, random numbers, initialisers
 * and user errors. */
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "tests/check.h"

/* ---- helpers ---------------------------------------------------------------- */

#define MAX_IO 8

/* Runs g: the k-th INPUT gets feed[k] (doubles rounded into its dtype),
 * variables start from seed 1 (or take *vars when given, which are then
 * updated in place); outs receive the outputs. Returns mpt_interp_run's
 * result and leaves its message in err. */
static int run(const mpt_graph *g, const double *const *feed, mpt_tensor *vars, mpt_tensor *outs,
               char *err, size_t errlen) {
    mpt_tensor in[MAX_IO], own_vars[MAX_IO];
    int n_in = mpt_graph_n_inputs(g), n_var = mpt_graph_n_variables(g);
    if (n_in > MAX_IO || n_var > MAX_IO) return -2;
    for (int k = 0; k < n_in; k++) {
        const mpt_node *n = &g->nodes[mpt_graph_input_node(g, k)];
        if (mpt_tensor_alloc(&in[k], n->dtype, n->shape) != 0) return -2;
        for (int64_t i = 0; i < mpt_shape_numel(n->shape); i++) mpt_tensor_set(&in[k], i, feed[k][i]);
    }
    if (!vars && mpt_init_variables(g, own_vars, 1) != 0) return -2;
    int rc = mpt_interp_run(g, in, vars ? vars : own_vars, outs, NULL, err, errlen);
    for (int k = 0; k < n_in; k++) mpt_tensor_free(&in[k]);
    if (!vars)
        for (int k = 0; k < n_var; k++) mpt_tensor_free(&own_vars[k]);
    return rc;
}

/* runs g expecting success; outs as run() */
static void run_ok(const mpt_graph *g, const double *const *feed, mpt_tensor *vars,
                   mpt_tensor *outs) {
    char err[256] = "";
    int rc = run(g, feed, vars, outs, err, sizeof err);
    CHECK_MSG(rc == 0, "run failed: %s", err);
    if (rc != 0)
        for (int k = 0; k < g->n_outputs; k++) mpt_tensor_alloc(&outs[k], MPT_DT_F64, g->nodes[g->outputs[k].node].shape);
}

static void free_outs(const mpt_graph *g, mpt_tensor *outs) {
    for (int k = 0; k < g->n_outputs; k++) mpt_tensor_free(&outs[k]);
}

/* out0 = op(x) for x a vector of dtype dt */
static void unary_case(mpt_op op, mpt_dtype dt, int n, const double *x, const double *want,
                       double rtol) {
    mpt_graph *g = mpt_graph_new("unary");
    int a = mpt_b_input(g, "x", dt, mpt_shape_1(n));
    int y = mpt_b_unary(g, op, a);
    mpt_graph_add_output(g, "y", y);
    mpt_tensor out[1];
    run_ok(g, (const double *const[]){x}, NULL, out);
    for (int i = 0; i < n; i++)
        CHECK_MSG(mpt_tensor_get(&out[0], i) == want[i] ||
                      fabs(mpt_tensor_get(&out[0], i) - want[i]) <= rtol * fabs(want[i]) ||
                      (isnan(want[i]) && isnan(mpt_tensor_get(&out[0], i))),
                  "%s(%.9g) = %.12g, want %.12g", mpt_op_name(op), x[i],
                  mpt_tensor_get(&out[0], i), want[i]);
    free_outs(g, out);
    mpt_graph_free(g);
}

/* out0 = op(a, b) elementwise for vectors of dtype dt; exact comparison */
static void binary_case(mpt_op op, mpt_dtype dt, int n, const double *a, const double *b,
                        const double *want) {
    mpt_graph *g = mpt_graph_new("binary");
    int x = mpt_b_input(g, "a", dt, mpt_shape_1(n));
    int y = mpt_b_input(g, "b", dt, mpt_shape_1(n));
    mpt_graph_add_output(g, "z", mpt_b_binary(g, op, x, y));
    mpt_tensor out[1];
    run_ok(g, (const double *const[]){a, b}, NULL, out);
    for (int i = 0; i < n; i++) {
        double got = mpt_tensor_get(&out[0], i);
        CHECK_MSG(got == want[i] || (isnan(got) && isnan(want[i])),
                  "%s %s(%.17g, %.17g) = %.17g, want %.17g", mpt_dtype_name(dt), mpt_op_name(op),
                  a[i], b[i], got, want[i]);
    }
    free_outs(g, out);
    mpt_graph_free(g);
}

/* ---- elementwise ---------------------------------------------------------------- */

static void test_unary(void) {
    const double x[] = {-2, -0.5, 0, 0.5, 2};
    const double rt = 1.2e-7; /* one f32 rounding of the exact value */
    unary_case(MPT_OP_NEG, MPT_DT_F32, 5, x, (const double[]){2, 0.5, 0, -0.5, -2}, 0);
    unary_case(MPT_OP_ABS, MPT_DT_F32, 5, x, (const double[]){2, 0.5, 0, 0.5, 2}, 0);
    unary_case(MPT_OP_RELU, MPT_DT_F32, 5, x, (const double[]){0, 0, 0, 0.5, 2}, 0);
    unary_case(MPT_OP_SQUARE, MPT_DT_F32, 5, x, (const double[]){4, 0.25, 0, 0.25, 4}, 0);
    unary_case(MPT_OP_EXP, MPT_DT_F32, 5, x,
               (const double[]){0.1353352832366127, 0.6065306597126334, 1, 1.6487212707001282,
                                7.38905609893065}, rt);
    unary_case(MPT_OP_SIGMOID, MPT_DT_F32, 5, x,
               (const double[]){0.11920292202211755, 0.3775406687981454, 0.5, 0.6224593312018546,
                                0.8807970779778823}, rt);
    unary_case(MPT_OP_TANH, MPT_DT_F32, 5, x,
               (const double[]){-0.9640275800758169, -0.46211715726000974, 0, 0.46211715726000974,
                                0.9640275800758169}, rt);
    /* sin and cos at -2, -0.5, 0, 0.5, 2 */
    unary_case(MPT_OP_SIN, MPT_DT_F32, 5, x,
               (const double[]){-0.9092974268256817, -0.479425538604203, 0, 0.479425538604203,
                                0.9092974268256817}, rt);
    unary_case(MPT_OP_COS, MPT_DT_F32, 5, x,
               (const double[]){-0.4161468365471424, 0.8775825618903728, 1, 0.8775825618903728,
                                -0.4161468365471424}, rt);
    /* gelu(x) = x Phi(x): Phi(-2) = 0.0227501319481792, Phi(-0.5) = 0.3085375387259869 */
    unary_case(MPT_OP_GELU, MPT_DT_F32, 5, x,
               (const double[]){-0.0455002638963584, -0.15426876936299344, 0, 0.34573123063700656,
                                1.9544997361036416}, rt);
    /* Phi(x) + x phi(x), phi(0.5) = 0.3520653267642995, phi(2) = 0.05399096651318806 */
    unary_case(MPT_OP_GELU_GRAD, MPT_DT_F32, 5, x,
               (const double[]){0.0227501319481792 - 2 * 0.05399096651318806,
                                0.3085375387259869 - 0.5 * 0.3520653267642995, 0.5,
                                0.6914624612740131 + 0.5 * 0.3520653267642995,
                                0.9772498680518208 + 2 * 0.05399096651318806}, rt);
    const double p[] = {0.25, 1, 4, 0};
    unary_case(MPT_OP_LOG, MPT_DT_F32, 4, p,
               (const double[]){-1.3862943611198906, 0, 1.3862943611198906, -INFINITY}, rt);
    unary_case(MPT_OP_SQRT, MPT_DT_F32, 4, p, (const double[]){0.5, 1, 2, 0}, 0);
    unary_case(MPT_OP_RSQRT, MPT_DT_F32, 4, p, (const double[]){2, 1, 0.5, INFINITY}, 0);
    unary_case(MPT_OP_RECIP, MPT_DT_F32, 4, p, (const double[]){4, 1, 0.25, INFINITY}, 0);
    const double odd[] = {NAN, INFINITY, -INFINITY, 1e300};
    unary_case(MPT_OP_RELU, MPT_DT_F32, 4, odd, (const double[]){NAN, INFINITY, 0, INFINITY}, 0);
    unary_case(MPT_OP_IS_FINITE, MPT_DT_F32, 4, odd, (const double[]){0, 0, 0, 0}, 0);
    unary_case(MPT_OP_IS_FINITE, MPT_DT_F64, 4, odd, (const double[]){0, 0, 0, 1}, 0);
    unary_case(MPT_OP_IS_FINITE, MPT_DT_F16, 3, (const double[]){65504, 65520, 1},
               (const double[]){1, 0, 1}, 0);
    unary_case(MPT_OP_NOT, MPT_DT_BOOL, 2, (const double[]){0, 1}, (const double[]){1, 0}, 0);
    unary_case(MPT_OP_NEG, MPT_DT_I32, 2, (const double[]){7, -3}, (const double[]){-7, 3}, 0);
}

static void test_binary(void) {
    const double a[] = {1, -7, 2.5, NAN}, b[] = {4, 2, 2.5, 1};
    binary_case(MPT_OP_ADD, MPT_DT_F32, 4, a, b, (const double[]){5, -5, 5, NAN});
    binary_case(MPT_OP_SUB, MPT_DT_F32, 4, a, b, (const double[]){-3, -9, 0, NAN});
    binary_case(MPT_OP_MUL, MPT_DT_F32, 4, a, b, (const double[]){4, -14, 6.25, NAN});
    binary_case(MPT_OP_DIV, MPT_DT_F32, 4, a, b, (const double[]){0.25, -3.5, 1, NAN});
    binary_case(MPT_OP_MAX, MPT_DT_F32, 4, a, b, (const double[]){4, 2, 2.5, NAN});
    binary_case(MPT_OP_MIN, MPT_DT_F32, 4, a, b, (const double[]){1, -7, 2.5, NAN});
    binary_case(MPT_OP_POW, MPT_DT_F32, 4, a, b, (const double[]){1, 49, (float)9.882117688026186, NAN});
    binary_case(MPT_OP_LT, MPT_DT_F32, 4, a, b, (const double[]){1, 1, 0, 0});
    binary_case(MPT_OP_GT, MPT_DT_F32, 4, a, b, (const double[]){0, 0, 0, 0});
    binary_case(MPT_OP_EQ, MPT_DT_F32, 4, a, b, (const double[]){0, 0, 1, 0});
    binary_case(MPT_OP_AND, MPT_DT_BOOL, 4, (const double[]){0, 0, 1, 1},
                (const double[]){0, 1, 0, 1}, (const double[]){0, 0, 0, 1});
    /* i32: division truncates toward zero, as C and XLA do */
    binary_case(MPT_OP_DIV, MPT_DT_I32, 3, (const double[]){7, -7, 6},
                (const double[]){2, 2, 3}, (const double[]){3, -3, 2});
    binary_case(MPT_OP_ADD, MPT_DT_I32, 2, (const double[]){2147483647, -5},
                (const double[]){1, 3}, (const double[]){2147483647, -2}); /* saturates */
}

/* The TensorFlow mixed-precision guide's examples, and ties to even. */
static void test_low_precision(void) {
    const double big[] = {256, 1e-5}, tiny_ulp = 0x1p-24;
    binary_case(MPT_OP_MUL, MPT_DT_F16, 2, big, big, (const double[]){INFINITY, 0});
    binary_case(MPT_OP_MUL, MPT_DT_BF16, 2, big, big,
                (const double[]){65536, mpt_round_to(MPT_DT_BF16,
                                                     mpt_round_to(MPT_DT_BF16, 1e-5) *
                                                         mpt_round_to(MPT_DT_BF16, 1e-5))});
    binary_case(MPT_OP_MUL, MPT_DT_F32, 1, big, big, (const double[]){65536});
    /* a f16 value below the smallest subnormal's half vanishes, above stays */
    binary_case(MPT_OP_MUL, MPT_DT_F16, 2, (const double[]){tiny_ulp, tiny_ulp},
                (const double[]){0.5, 0.75}, (const double[]){0, tiny_ulp});
    /* f16 sums round to nearest even: 1 + 2^-11 is a tie between 1 and
     * 1 + 2^-10 and goes to 1; 1 + 3 * 2^-11 goes up to 1 + 2^-9 */
    binary_case(MPT_OP_ADD, MPT_DT_F16, 2, (const double[]){1, 1},
                (const double[]){0x1p-11, 3 * 0x1p-11}, (const double[]){1, 1 + 0x1p-9});
    binary_case(MPT_OP_ADD, MPT_DT_BF16, 2, (const double[]){1, 1},
                (const double[]){0x1p-8, 3 * 0x1p-8}, (const double[]){1, 1 + 0x1p-6});

    /* casts: ties, overflow to inf at the f16 limit, truncation to i32 */
    const double x[] = {1 + 0x1p-11, 1 + 3 * 0x1p-11, 65519, 65520, -1.7, 0x1p-25, 3 * 0x1p-25};
    mpt_graph *g = mpt_graph_new("casts");
    int in = mpt_b_input(g, "x", MPT_DT_F64, mpt_shape_1(7));
    mpt_graph_add_output(g, "f16", mpt_b_cast(g, in, MPT_DT_F16));
    mpt_graph_add_output(g, "bf16", mpt_b_cast(g, in, MPT_DT_BF16));
    mpt_graph_add_output(g, "i32", mpt_b_cast(g, in, MPT_DT_I32));
    mpt_graph_add_output(g, "bool", mpt_b_cast(g, in, MPT_DT_BOOL));
    mpt_tensor out[4];
    run_ok(g, (const double *const[]){x}, NULL, out);
    const double f16[] = {1, 1 + 0x1p-9, 65504, INFINITY, -1.7001953125, 0, 0x1p-23};
    const double bf16[] = {1, 1, 65536, 65536, -1.703125, 0x1p-25, 3 * 0x1p-25};
    const double i32[] = {1, 1, 65519, 65520, -1, 0, 0};
    for (int i = 0; i < 7; i++) {
        CHECK_MSG(mpt_tensor_get(&out[0], i) == f16[i], "f16(%.17g) = %.17g", x[i], mpt_tensor_get(&out[0], i));
        CHECK_MSG(mpt_tensor_get(&out[1], i) == bf16[i], "bf16(%.17g) = %.17g", x[i], mpt_tensor_get(&out[1], i));
        CHECK(mpt_tensor_get(&out[2], i) == i32[i]);
        CHECK(mpt_tensor_get(&out[3], i) == 1);
    }
    CHECK(out[0].dtype == MPT_DT_F16 && ((uint16_t *)out[0].data)[3] == 0x7c00); /* +inf bits */
    free_outs(g, out);
    mpt_graph_free(g);
}

static void test_select_and_sources(void) {
    mpt_graph *g = mpt_graph_new("sources");
    int c = mpt_b_input(g, "c", MPT_DT_BOOL, mpt_shape_1(3));
    int a = mpt_b_const(g, MPT_DT_F32, mpt_shape_1(3), 2.5);
    int b = mpt_b_iota(g, MPT_DT_F32, mpt_shape_1(3), 0);
    mpt_graph_add_output(g, "sel", mpt_b_select(g, c, a, b));
    mpt_graph_add_output(g, "iota", mpt_b_iota(g, MPT_DT_I32, mpt_shape_2(2, 3), 0));
    mpt_graph_add_output(g, "iota1", mpt_b_iota(g, MPT_DT_I32, mpt_shape_2(2, 3), 1));
    mpt_graph_add_output(g, "big", mpt_b_iota(g, MPT_DT_F16, mpt_shape_1(2051), 0));
    mpt_tensor out[4];
    run_ok(g, (const double *const[]){(const double[]){1, 0, 1}}, NULL, out);
    CHECK(mpt_tensor_get(&out[0], 0) == 2.5 && mpt_tensor_get(&out[0], 1) == 1 &&
          mpt_tensor_get(&out[0], 2) == 2.5);
    const double i0[] = {0, 0, 0, 1, 1, 1}, i1[] = {0, 1, 2, 0, 1, 2};
    for (int i = 0; i < 6; i++) {
        CHECK(mpt_tensor_get(&out[1], i) == i0[i]);
        CHECK(mpt_tensor_get(&out[2], i) == i1[i]);
    }
    /* 2049 is not a f16: it ties to 2048, 2050 is exact */
    CHECK(mpt_tensor_get(&out[3], 2049) == 2048 && mpt_tensor_get(&out[3], 2050) == 2050);
    free_outs(g, out);
    mpt_graph_free(g);
}

/* ---- reductions and data movement ---------------------------------------------- */

static void test_reductions(void) {
    mpt_graph *g = mpt_graph_new("reduce");
    /* x[a,b,c] = 12a + 4b + c */
    int flat = mpt_b_iota(g, MPT_DT_F64, mpt_shape_1(24), 0);
    int x = mpt_b_reshape(g, flat, mpt_shape_make(3, (int64_t[]){2, 3, 4}));
    mpt_graph_add_output(g, "s0", mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, 0x1));
    mpt_graph_add_output(g, "s12", mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, 0x6));
    mpt_graph_add_output(g, "m2", mpt_b_reduce(g, MPT_OP_REDUCE_MAX, mpt_b_unary(g, MPT_OP_NEG, x), 0x4));
    int lt = mpt_b_binary(g, MPT_OP_LT, x, mpt_b_broadcast_to(g, mpt_b_scalar(g, MPT_DT_F64, 22),
                                                              g->nodes[x].shape));
    mpt_graph_add_output(g, "all", mpt_b_reduce(g, MPT_OP_REDUCE_ALL, lt, 0x5));
    mpt_tensor out[4];
    run_ok(g, NULL, NULL, out);
    for (int b = 0; b < 3; b++)
        for (int c = 0; c < 4; c++)
            CHECK(mpt_tensor_get(&out[0], b * 4 + c) == 2 * (4 * b + c) + 12);
    CHECK(mpt_tensor_get(&out[1], 0) == 66 && mpt_tensor_get(&out[1], 1) == 66 + 144);
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++) CHECK(mpt_tensor_get(&out[2], a * 3 + b) == -(12 * a + 4 * b));
    /* all over dims 0 and 2: row b=2 of a=1 holds 22 and 23 */
    CHECK(mpt_tensor_get(&out[3], 0) == 1 && mpt_tensor_get(&out[3], 1) == 1 &&
          mpt_tensor_get(&out[3], 2) == 0);
    free_outs(g, out);
    mpt_graph_free(g);

    /* f16 sum of 4096 ones is exact (4096 is a f16): one rounding at the end,
     * where summing in f16 would stall at 2048 */
    g = mpt_graph_new("sum16");
    int ones = mpt_b_const(g, MPT_DT_F16, mpt_shape_1(4096), 1);
    mpt_graph_add_output(g, "s", mpt_b_reduce(g, MPT_OP_REDUCE_SUM, ones, 1));
    run_ok(g, NULL, NULL, out);
    CHECK(mpt_tensor_get(&out[0], 0) == 4096);
    free_outs(g, out);
    mpt_graph_free(g);
}

static void test_argmax(void) {
    mpt_graph *g = mpt_graph_new("argmax");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(3, 4));
    mpt_graph_add_output(g, "rows", mpt_b_argmax(g, x, 1));
    mpt_graph_add_output(g, "cols", mpt_b_argmax(g, x, 0));
    const double v[] = {1, 3, 3, 2, /**/ 5, 5, 5, 5, /**/ -1, 9, 0, 9};
    mpt_tensor out[2];
    run_ok(g, (const double *const[]){v}, NULL, out);
    CHECK(out[0].dtype == MPT_DT_I32);
    CHECK(mpt_tensor_get(&out[0], 0) == 1 && mpt_tensor_get(&out[0], 1) == 0 &&
          mpt_tensor_get(&out[0], 2) == 1);
    const double cols[] = {1, 2, 1, 2};
    for (int i = 0; i < 4; i++) CHECK(mpt_tensor_get(&out[1], i) == cols[i]);
    free_outs(g, out);
    mpt_graph_free(g);
}

static void test_movement(void) {
    mpt_graph *g = mpt_graph_new("move");
    int row = mpt_b_input(g, "row", MPT_DT_F32, mpt_shape_1(3));
    int col = mpt_b_input(g, "col", MPT_DT_F32, mpt_shape_2(2, 1));
    mpt_graph_add_output(g, "rows", mpt_b_broadcast(g, row, mpt_shape_2(2, 3), 0x2));
    mpt_graph_add_output(g, "cols", mpt_b_broadcast(g, col, mpt_shape_2(2, 3), 0x3));
    mpt_graph_add_output(g, "lead", mpt_b_broadcast(g, row, mpt_shape_2(3, 2), 0x1));
    int cube = mpt_b_reshape(g, mpt_b_iota(g, MPT_DT_F32, mpt_shape_1(24), 0),
                             mpt_shape_make(3, (int64_t[]){2, 3, 4}));
    int t = mpt_b_transpose(g, cube, (const int[]){2, 0, 1}); /* [4,2,3] */
    mpt_graph_add_output(g, "t", t);
    mpt_tensor out[4];
    run_ok(g, (const double *const[]){(const double[]){1, 2, 3}, (const double[]){10, 20}}, NULL, out);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            CHECK(mpt_tensor_get(&out[0], i * 3 + j) == j + 1);
            CHECK(mpt_tensor_get(&out[1], i * 3 + j) == 10 * (i + 1));
            CHECK(mpt_tensor_get(&out[2], j * 2 + i) == j + 1);
        }
    CHECK(g->nodes[t].shape.dim[0] == 4 && g->nodes[t].shape.dim[1] == 2);
    /* t[c,a,b] = cube[a,b,c] = 12a + 4b + c */
    for (int c = 0; c < 4; c++)
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 3; b++)
                CHECK(mpt_tensor_get(&out[3], (c * 2 + a) * 3 + b) == 12 * a + 4 * b + c);
    free_outs(g, out);
    mpt_graph_free(g);
}

/* element i of a row-major tensor of shape s as a multi-index */
static void unravel(mpt_shape s, int64_t i, int64_t *idx) {
    for (int d = s.rank - 1; d >= 0; d--) {
        idx[d] = i % s.dim[d];
        i /= s.dim[d];
    }
}

static int64_t ravel(mpt_shape s, const int64_t *idx) {
    int64_t i = 0;
    for (int d = 0; d < s.rank; d++) i = i * s.dim[d] + idx[d];
    return i;
}

/* out must be src[..., start + k, ...] along axis at every multi-index */
static void check_slice_values(const mpt_tensor *src, const mpt_tensor *out, int axis,
                               int64_t start, const char *what) {
    int64_t idx[MPT_MAX_DIMS], bad = 0;
    for (int64_t i = 0; i < mpt_shape_numel(out->shape); i++) {
        unravel(out->shape, i, idx);
        idx[axis] += start;
        bad += mpt_tensor_get(out, i) != mpt_tensor_get(src, ravel(src->shape, idx));
    }
    CHECK_MSG(bad == 0, "%s: %lld elements differ from the source", what, (long long)bad);
}

/* out must be a where its axis index is below a's dim, else b */
static void check_concat_values(const mpt_tensor *a, const mpt_tensor *b, const mpt_tensor *out,
                                int axis, const char *what) {
    int64_t idx[MPT_MAX_DIMS], bad = 0, la = a->shape.dim[axis];
    CHECK(out->shape.dim[axis] == la + b->shape.dim[axis]);
    for (int64_t i = 0; i < mpt_shape_numel(out->shape); i++) {
        unravel(out->shape, i, idx);
        const mpt_tensor *src = idx[axis] < la ? a : b;
        if (idx[axis] >= la) idx[axis] -= la;
        bad += mpt_tensor_get(out, i) != mpt_tensor_get(src, ravel(src->shape, idx));
    }
    CHECK_MSG(bad == 0, "%s: %lld elements differ from the sources", what, (long long)bad);
}

/* slice and concat along the first, a middle and the last axis, ranks 1 to
 * 4; f32, bf16 and i32 (a copy is exact in every dtype) */
static void test_slice_concat(void) {
    static const struct {
        int rank;
        int64_t dims[4];
        int axis;
        int64_t start, len;
    } cases[] = {
        {1, {6}, 0, 2, 3},          {2, {3, 4}, 0, 1, 2},       {2, {3, 4}, 1, 1, 2},
        {3, {2, 3, 4}, 1, 1, 2},    {3, {2, 3, 4}, 2, 3, 1},    {3, {2, 3, 4}, 0, 0, 1},
        {4, {2, 2, 3, 2}, 2, 2, 1}, {4, {2, 2, 3, 2}, 3, 0, 2}, {4, {2, 2, 3, 2}, 1, 1, 1},
    };
    static const mpt_dtype dts[] = {MPT_DT_F32, MPT_DT_BF16, MPT_DT_I32};
    char what[96];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
            mpt_shape s = mpt_shape_make(cases[c].rank, cases[c].dims);
            int ax = cases[c].axis;
            mpt_graph *g = mpt_graph_new("slice_concat");
            int x = mpt_b_input(g, "x", dts[d], s);
            int y = mpt_b_unary(g, MPT_OP_NEG, x);
            int sl = mpt_b_slice(g, x, ax, cases[c].start, cases[c].len);
            mpt_graph_add_output(g, "x", x);
            mpt_graph_add_output(g, "neg", y);
            mpt_graph_add_output(g, "slice", sl);
            mpt_graph_add_output(g, "cat", mpt_b_concat(g, x, y, ax));
            mpt_graph_add_output(g, "cat_slice", mpt_b_concat(g, sl, x, ax));
            CHECK(g->nodes[sl].dtype == dts[d] && g->nodes[sl].shape.dim[ax] == cases[c].len);
            double feed[24];
            for (int64_t i = 0; i < mpt_shape_numel(s); i++) feed[i] = (double)(i * 3 % 17) - 4;
            mpt_tensor out[5];
            run_ok(g, (const double *const[]){feed}, NULL, out);
            snprintf(what, sizeof what, "%s rank %d axis %d", mpt_dtype_name(dts[d]),
                     cases[c].rank, ax);
            check_slice_values(&out[0], &out[2], ax, cases[c].start, what);
            check_concat_values(&out[0], &out[1], &out[3], ax, what);
            check_concat_values(&out[2], &out[0], &out[4], ax, what);
            free_outs(g, out);
            mpt_graph_free(g);
        }
    /* by hand: x = [[0,1,2,3],[4,5,6,7]]; x[:, 1:3] and [x, x[:, 1:3]] */
    mpt_graph *g = mpt_graph_new("by_hand");
    int x = mpt_b_iota(g, MPT_DT_F32, mpt_shape_2(2, 4), 1);
    x = mpt_b_binary(g, MPT_OP_ADD, x, mpt_b_binary(g, MPT_OP_MUL, mpt_b_iota(g, MPT_DT_F32, mpt_shape_2(2, 4), 0),
                                                   mpt_b_const(g, MPT_DT_F32, mpt_shape_2(2, 4), 4)));
    int sl = mpt_b_slice(g, x, 1, 1, 2);
    mpt_graph_add_output(g, "slice", sl);
    mpt_graph_add_output(g, "cat", mpt_b_concat(g, x, sl, 1));
    mpt_graph_add_output(g, "cat0", mpt_b_concat(g, sl, sl, 0));
    mpt_tensor out[3];
    run_ok(g, NULL, NULL, out);
    const double want_s[] = {1, 2, 5, 6}, want_c[] = {0, 1, 2, 3, 1, 2, 4, 5, 6, 7, 5, 6};
    const double want_c0[] = {1, 2, 5, 6, 1, 2, 5, 6};
    for (int i = 0; i < 4; i++) CHECK(mpt_tensor_get(&out[0], i) == want_s[i]);
    for (int i = 0; i < 12; i++) CHECK(mpt_tensor_get(&out[1], i) == want_c[i]);
    for (int i = 0; i < 8; i++) CHECK(mpt_tensor_get(&out[2], i) == want_c0[i]);
    free_outs(g, out);
    mpt_graph_free(g);
}

static void test_embedding_ops(void) {
    mpt_graph *g = mpt_graph_new("embed");
    int ids = mpt_b_input(g, "ids", MPT_DT_I32, mpt_shape_1(4));
    int table = mpt_b_input(g, "table", MPT_DT_F32, mpt_shape_2(3, 2));
    mpt_graph_add_output(g, "oh", mpt_b_one_hot(g, ids, 3, MPT_DT_BF16));
    int gat = mpt_b_gather(g, table, ids);
    mpt_graph_add_output(g, "gat", gat);
    mpt_graph_add_output(g, "sca", mpt_b_scatter_add(g, ids, gat, 3));
    const double idv[] = {2, 0, 2, 5}; /* 5 is out of range */
    const double tab[] = {1, 2, 3, 4, 5, 6};
    mpt_tensor out[3];
    run_ok(g, (const double *const[]){idv, tab}, NULL, out);
    const double oh[] = {0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0};
    const double gv[] = {5, 6, 1, 2, 5, 6, 0, 0};
    const double sv[] = {1, 2, 0, 0, 10, 12};
    CHECK(out[0].dtype == MPT_DT_BF16);
    for (int i = 0; i < 12; i++) CHECK(mpt_tensor_get(&out[0], i) == oh[i]);
    for (int i = 0; i < 8; i++) CHECK(mpt_tensor_get(&out[1], i) == gv[i]);
    for (int i = 0; i < 6; i++) CHECK(mpt_tensor_get(&out[2], i) == sv[i]);
    free_outs(g, out);
    mpt_graph_free(g);
}

/* ---- matmul ---------------------------------------------------------------------- */

static void test_matmul(void) {
    /* a [2,3], b [3,2]; a.b = [[5, 10], [11, 22]] by hand */
    const double a[] = {1, 2, 3, 4, 5, 6}, b[] = {1, 0, -1, 2, 2, 2};
    const double at[] = {1, 4, 2, 5, 3, 6}, bt[] = {1, -1, 2, 0, 2, 2};
    const double want[] = {5, 10, 11, 22};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            mpt_graph *g = mpt_graph_new("mm");
            int x = mpt_b_input(g, "a", MPT_DT_F32, ta ? mpt_shape_2(3, 2) : mpt_shape_2(2, 3));
            int y = mpt_b_input(g, "b", MPT_DT_F32, tb ? mpt_shape_2(2, 3) : mpt_shape_2(3, 2));
            mpt_graph_add_output(g, "c", mpt_b_matmul(g, x, y, ta, tb));
            mpt_tensor out[1];
            run_ok(g, (const double *const[]){ta ? at : a, tb ? bt : b}, NULL, out);
            for (int i = 0; i < 4; i++)
                CHECK_MSG(mpt_tensor_get(&out[0], i) == want[i], "trans %d%d: c[%d] = %g", ta, tb,
                          i, mpt_tensor_get(&out[0], i));
            free_outs(g, out);
            mpt_graph_free(g);
        }
    /* f16 accumulates wide and rounds once: 1 + 2^-11 + 2^-11 = 1 + 2^-10,
     * where f16 running sums would give 1 twice */
    mpt_graph *g = mpt_graph_new("mm16");
    int x = mpt_b_input(g, "a", MPT_DT_F16, mpt_shape_2(1, 3));
    int y = mpt_b_input(g, "b", MPT_DT_F16, mpt_shape_2(3, 1));
    mpt_graph_add_output(g, "c", mpt_b_matmul(g, x, y, 0, 0));
    mpt_tensor out[1];
    run_ok(g, (const double *const[]){(const double[]){1, 0x1p-11, 0x1p-11}, (const double[]){1, 1, 1}},
           NULL, out);
    CHECK(mpt_tensor_get(&out[0], 0) == 1 + 0x1p-10);
    free_outs(g, out);
    mpt_graph_free(g);
}

/* batch_matmul [..., M, K] x [..., K, N] against a naive triple loop, for
 * rank 3 and 4 and every trans combination, in f32 and bf16. Operands are
 * small integers, so every sum is exact in both dtypes and the results
 * must match exactly. */
static void bmm_case(int rank, mpt_dtype dt, int ta, int tb) {
    const int64_t B0 = 2, B1 = rank == 4 ? 3 : 1, M = 3, K = 5, N = 4, nb = B0 * B1;
    int64_t da[4], db[4], lead = rank - 2;
    da[0] = db[0] = B0;
    if (rank == 4) da[1] = db[1] = B1;
    da[lead] = ta ? K : M, da[lead + 1] = ta ? M : K;
    db[lead] = tb ? N : K, db[lead + 1] = tb ? K : N;
    double a[2 * 3 * 3 * 5], b[2 * 3 * 5 * 4];
    for (int i = 0; i < nb * M * K; i++) a[i] = (double)(i * 7 % 5) - 2;
    for (int i = 0; i < nb * K * N; i++) b[i] = (double)(i * 3 % 7) - 3;
    mpt_graph *g = mpt_graph_new("bmm");
    int x = mpt_b_input(g, "a", dt, mpt_shape_make(rank, da));
    int y = mpt_b_input(g, "b", dt, mpt_shape_make(rank, db));
    int c = mpt_b_batch_matmul(g, x, y, ta, tb);
    mpt_graph_add_output(g, "c", c);
    CHECK(g->nodes[c].dtype == dt && g->nodes[c].shape.rank == rank &&
          g->nodes[c].shape.dim[lead] == M && g->nodes[c].shape.dim[lead + 1] == N &&
          g->nodes[c].shape.dim[0] == B0);
    mpt_tensor out[1];
    run_ok(g, (const double *const[]){a, b}, NULL, out);
    int64_t bad = 0;
    for (int64_t q = 0; q < nb; q++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double want = 0;
                for (int64_t k = 0; k < K; k++)
                    want += a[q * M * K + (ta ? k * M + i : i * K + k)] *
                            b[q * K * N + (tb ? j * K + k : k * N + j)];
                bad += mpt_tensor_get(&out[0], (q * M + i) * N + j) != want;
            }
    CHECK_MSG(bad == 0, "batch_matmul rank %d %s trans %d%d: %lld elements wrong", rank,
              mpt_dtype_name(dt), ta, tb, (long long)bad);
    free_outs(g, out);
    mpt_graph_free(g);
}

static void test_batch_matmul(void) {
    for (int rank = 3; rank <= 4; rank++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                bmm_case(rank, MPT_DT_F32, ta, tb);
                bmm_case(rank, MPT_DT_BF16, ta, tb);
            }
    /* bf16 accumulates wide and rounds once, per batch: 1 + 2^-8 + 2^-8 =
     * 1 + 2^-7, where bf16 running sums would round to 1 twice; the second
     * batch's 2 + 2 + 2 = 6 */
    mpt_graph *g = mpt_graph_new("bmm16");
    int x = mpt_b_input(g, "a", MPT_DT_BF16, mpt_shape_make(3, (const int64_t[]){2, 1, 3}));
    int y = mpt_b_input(g, "b", MPT_DT_BF16, mpt_shape_make(3, (const int64_t[]){2, 3, 1}));
    mpt_graph_add_output(g, "c", mpt_b_batch_matmul(g, x, y, 0, 0));
    mpt_tensor out[1];
    run_ok(g, (const double *const[]){(const double[]){1, 0x1p-8, 0x1p-8, 1, 1, 1},
                                      (const double[]){1, 1, 1, 2, 2, 2}},
           NULL, out);
    CHECK(mpt_tensor_get(&out[0], 0) == 1 + 0x1p-7);
    CHECK(mpt_tensor_get(&out[0], 1) == 6);
    free_outs(g, out);
    mpt_graph_free(g);
}

/* ---- convolution ------------------------------------------------------------------- */

/* y[n,i,j,o] = sum x[n, i*s - p + u, j*s - p + v, c] w[u,v,c,o], zero outside */
static double naive_conv(const double *x, const double *w, int64_t H, int64_t W, int64_t C,
                         int64_t K, int64_t O, int64_t s, int64_t p, int64_t n, int64_t i,
                         int64_t j, int64_t o) {
    double acc = 0;
    for (int64_t u = 0; u < K; u++)
        for (int64_t v = 0; v < K; v++)
            for (int64_t c = 0; c < C; c++) {
                int64_t h = i * s - p + u, ww = j * s - p + v;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                acc += x[((n * H + h) * W + ww) * C + c] * w[((u * K + v) * C + c) * O + o];
            }
    return acc;
}

static double dot(const mpt_tensor *a, const double *b) {
    double s = 0;
    for (int64_t i = 0; i < mpt_shape_numel(a->shape); i++) s += mpt_tensor_get(a, i) * b[i];
    return s;
}

static void conv_case(int same, int stride) {
    const int64_t N = 2, H = 5, W = 5, C = 2, K = 3, O = 3;
    int64_t lo = 0, hi = 0, oh = (H - K) / stride + 1;
    if (same) mpt_same_padding(H, K, stride, &lo, &hi, &oh);
    double x[2 * 5 * 5 * 2], w[3 * 3 * 2 * 3], dy[2 * 5 * 5 * 3];
    for (int i = 0; i < (int)(sizeof x / sizeof x[0]); i++) x[i] = (i * 7 % 11) - 5;
    for (int i = 0; i < (int)(sizeof w / sizeof w[0]); i++) w[i] = (i * 5 % 7) * 0.25 - 0.5;
    for (int i = 0; i < (int)(sizeof dy / sizeof dy[0]); i++) dy[i] = (i * 3 % 5) - 2;
    mpt_graph *g = mpt_graph_new("conv");
    int xi = mpt_b_input(g, "x", MPT_DT_F64, mpt_shape_4(N, H, W, C));
    int wi = mpt_b_input(g, "w", MPT_DT_F64, mpt_shape_4(K, K, C, O));
    int di = mpt_b_input(g, "dy", MPT_DT_F64, mpt_shape_4(N, oh, oh, O));
    int s = stride, p = (int)lo;
    mpt_graph_add_output(g, "y", mpt_b_conv2d(g, xi, wi, s, s, p, p, mpt_shape_4(N, oh, oh, O)));
    mpt_graph_add_output(g, "dx", mpt_b_conv2d_bwd_data(g, di, wi, s, s, p, p, g->nodes[xi].shape));
    mpt_graph_add_output(g, "dw", mpt_b_conv2d_bwd_filter(g, xi, di, s, s, p, p, g->nodes[wi].shape));
    mpt_tensor out[3];
    run_ok(g, (const double *const[]){x, w, dy}, NULL, out);
    int bad = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < oh; i++)
            for (int64_t j = 0; j < oh; j++)
                for (int64_t o = 0; o < O; o++)
                    bad += mpt_tensor_get(&out[0], ((n * oh + i) * oh + j) * O + o) !=
                           naive_conv(x, w, H, W, C, K, O, stride, lo, n, i, j, o);
    CHECK_MSG(bad == 0, "conv2d same=%d stride=%d: %d elements differ", same, stride, bad);
    /* the backward ops are conv2d's adjoints: <conv(x,w), dy> = <x, dx> = <w, dw> */
    double ydy = dot(&out[0], dy);
    CHECK_NEAR(dot(&out[1], x), ydy, 1e-9, 1e-12);
    CHECK_NEAR(dot(&out[2], w), ydy, 1e-9, 1e-12);
    free_outs(g, out);
    mpt_graph_free(g);
}

static void test_conv(void) {
    conv_case(1, 1);
    conv_case(0, 1);
    conv_case(1, 2);
    conv_case(0, 2);
}

/* ---- pooling ---------------------------------------------------------------------- */

static void test_pooling(void) {
    mpt_graph *g = mpt_graph_new("pool");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_4(1, 4, 4, 1)); /* x = 0..15 */
    int mp = mpt_b_pool(g, MPT_OP_MAX_POOL, x, 2, 2, 2, 2, 0, 0, mpt_shape_4(1, 2, 2, 1));
    int ap = mpt_b_pool(g, MPT_OP_AVG_POOL, x, 2, 2, 2, 2, 0, 0, mpt_shape_4(1, 2, 2, 1));
    int as = mpt_b_pool(g, MPT_OP_AVG_POOL, x, 3, 3, 1, 1, 1, 1, mpt_shape_4(1, 4, 4, 1));
    int ms = mpt_b_pool(g, MPT_OP_MAX_POOL, mpt_b_unary(g, MPT_OP_NEG, x), 3, 3, 2, 2, 1, 1,
                        mpt_shape_4(1, 2, 2, 1));
    mpt_graph_add_output(g, "mp", mp);
    mpt_graph_add_output(g, "ap", ap);
    mpt_graph_add_output(g, "as", as);
    mpt_graph_add_output(g, "ms", ms);
    double xv[16];
    for (int i = 0; i < 16; i++) xv[i] = i;
    mpt_tensor out[4];
    run_ok(g, (const double *const[]){xv}, NULL, out);
    const double mpw[] = {5, 7, 13, 15}, apw[] = {2.5, 4.5, 10.5, 12.5};
    for (int i = 0; i < 4; i++) {
        CHECK(mpt_tensor_get(&out[0], i) == mpw[i]);
        CHECK(mpt_tensor_get(&out[1], i) == apw[i]);
    }
    /* padding is never counted: the corner averages {0,1,4,5}, an edge six */
    CHECK(mpt_tensor_get(&out[2], 0) == 2.5);
    CHECK(mpt_tensor_get(&out[2], 1) == 3); /* {0,1,2,4,5,6} */
    CHECK(mpt_tensor_get(&out[2], 5) == 5);
    /* max of negatives with padding: padding (0) must not win */
    CHECK(mpt_tensor_get(&out[3], 0) == 0 && mpt_tensor_get(&out[3], 1) == -1 &&
          mpt_tensor_get(&out[3], 3) == -5);
    free_outs(g, out);
    mpt_graph_free(g);

    /* max_pool_grad: the first maximum of a window takes its gradient */
    g = mpt_graph_new("pool_grad");
    x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_4(1, 2, 4, 1));
    int dy = mpt_b_input(g, "dy", MPT_DT_F32, mpt_shape_4(1, 1, 2, 1));
    mpt_attr pa = {.i = {2, 2, 2, 2, 0, 0}};
    mpt_graph_add_output(g, "dx", mpt_b_max_pool_grad(g, x, dy, &pa));
    int dy2 = mpt_b_input(g, "dy2", MPT_DT_F64, mpt_shape_4(1, 4, 4, 1));
    mpt_attr pa3 = {.i = {3, 3, 1, 1, 1, 1}};
    mpt_graph_add_output(g, "ag", mpt_b_avg_pool_grad(g, dy2, &pa3, mpt_shape_4(1, 4, 4, 1)));
    const double xg[] = {1, 1, 0, 9, /**/ 1, 1, 9, 2};
    double d2[16];
    for (int i = 0; i < 16; i++) d2[i] = (i * 5 % 7) - 3;
    mpt_tensor o2[2];
    run_ok(g, (const double *const[]){xg, (const double[]){10, 20}, d2}, NULL, o2);
    const double dxw[] = {10, 0, 0, 20, 0, 0, 0, 0};
    for (int i = 0; i < 8; i++) CHECK(mpt_tensor_get(&o2[0], i) == dxw[i]);
    /* avg_pool_grad is avg_pool's adjoint: <avg_pool(x), dy> = <x, grad(dy)> */
    double lhs = 0, cnt[16];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            double s = 0;
            int c = 0;
            for (int u = i - 1; u <= i + 1; u++)
                for (int v = j - 1; v <= j + 1; v++)
                    if (u >= 0 && u < 4 && v >= 0 && v < 4) s += xv[u * 4 + v], c++;
            cnt[i * 4 + j] = c;
            lhs += s / c * d2[i * 4 + j];
        }
    CHECK_NEAR(dot(&o2[1], xv), lhs, 1e-12, 1e-12);
    CHECK(cnt[0] == 4);
    free_outs(g, o2);
    mpt_graph_free(g);
}

/* ---- compositions, state, randomness ------------------------------------------------ */

static void test_softmax(void) {
    mpt_graph *g = mpt_graph_new("softmax");
    mpt_shape s = mpt_shape_2(2, 3);
    int x = mpt_b_input(g, "logits", MPT_DT_F32, s);
    int m = mpt_b_broadcast(g, mpt_b_reduce(g, MPT_OP_REDUCE_MAX, x, 0x2), s, 0x1);
    int e = mpt_b_unary(g, MPT_OP_EXP, mpt_b_binary(g, MPT_OP_SUB, x, m));
    int z = mpt_b_broadcast(g, mpt_b_reduce(g, MPT_OP_REDUCE_SUM, e, 0x2), s, 0x1);
    mpt_graph_add_output(g, "p", mpt_b_binary(g, MPT_OP_DIV, e, z));
    mpt_tensor out[1];
    run_ok(g, (const double *const[]){(const double[]){1, 2, 3, 1000, 1000, 1000}}, NULL, out);
    const double want[] = {0.09003057317038046, 0.24472847105479767, 0.6652409557748219,
                           1.0 / 3, 1.0 / 3, 1.0 / 3};
    for (int i = 0; i < 6; i++) CHECK_NEAR(mpt_tensor_get(&out[0], i), want[i], 0, 3e-7);
    free_outs(g, out);
    mpt_graph_free(g);
}

static void test_updates(void) {
    mpt_graph *g = mpt_graph_new("state");
    int w = mpt_b_variable(g, "w", mpt_shape_1(2), MPT_INIT_CONST, 0, 0, 2.5, 1);
    int step = mpt_b_variable_dt(g, "step", MPT_DT_I32, mpt_shape_scalar(), MPT_INIT_ZEROS, 0);
    mpt_graph_add_output(g, "w_before", w);
    mpt_graph_add_output(g, "step", step);
    mpt_graph_add_update(g, w, mpt_b_binary(g, MPT_OP_MUL, w, w));
    mpt_graph_add_update(g, step, mpt_b_binary(g, MPT_OP_ADD, step, mpt_b_scalar(g, MPT_DT_I32, 1)));
    mpt_tensor vars[2], out[2];
    CHECK(mpt_graph_n_variables(g) == 2 && mpt_graph_variable_node(g, 1) == step);
    CHECK(mpt_graph_n_inputs(g) == 0 && mpt_graph_input_node(g, 0) == -1);
    CHECK(mpt_init_variables(g, vars, 7) == 0);
    CHECK(mpt_tensor_get(&vars[0], 1) == 2.5 && mpt_tensor_get(&vars[1], 0) == 0);
    run_ok(g, NULL, vars, out);
    CHECK(mpt_tensor_get(&out[0], 0) == 2.5 && mpt_tensor_get(&out[1], 0) == 0);
    free_outs(g, out);
    run_ok(g, NULL, vars, out);
    CHECK(mpt_tensor_get(&out[0], 0) == 6.25 && mpt_tensor_get(&out[1], 0) == 1);
    free_outs(g, out);
    CHECK(mpt_tensor_get(&vars[0], 0) == 39.0625 && mpt_tensor_get(&vars[0], 1) == 39.0625);
    CHECK(vars[1].dtype == MPT_DT_I32 && ((int32_t *)vars[1].data)[0] == 2);
    mpt_tensor_free(&vars[0]);
    mpt_tensor_free(&vars[1]);
    mpt_graph_free(g);
}

/* the documented random_uniform hash, written out independently */
static uint64_t sm64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static void test_random_uniform(void) {
    mpt_graph *g = mpt_graph_new("rng");
    int ctr = mpt_b_input(g, "counter", MPT_DT_I32, mpt_shape_scalar());
    mpt_graph_add_output(g, "a", mpt_b_random_uniform(g, ctr, mpt_shape_1(4096), 99));
    mpt_graph_add_output(g, "b", mpt_b_random_uniform(g, ctr, mpt_shape_1(4096), 100));
    int h = mpt_b_random_uniform(g, ctr, mpt_shape_1(4096), 99);
    g->nodes[h].dtype = MPT_DT_F16; /* the builder makes f32; any float dtype is allowed */
    mpt_graph_add_output(g, "h", h);
    mpt_tensor r1[3], r2[3], r3[3];
    run_ok(g, (const double *const[]){(const double[]){5}}, NULL, r1);
    run_ok(g, (const double *const[]){(const double[]){5}}, NULL, r2);
    run_ok(g, (const double *const[]){(const double[]){6}}, NULL, r3);
    CHECK(memcmp(r1[0].data, r2[0].data, mpt_tensor_bytes(&r1[0])) == 0);
    double sum = 0, lo = 1, hi = 0, hmax = 0;
    int same_ctr = 0, same_seed = 0, f16_grid = 1;
    for (int i = 0; i < 4096; i++) {
        double v = mpt_tensor_get(&r1[0], i), hv = mpt_tensor_get(&r1[2], i);
        sum += v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        hmax = hv > hmax ? hv : hmax;
        f16_grid &= ldexp(hv, 11) == floor(ldexp(hv, 11));
        same_ctr += v == mpt_tensor_get(&r3[0], i);
        same_seed += v == mpt_tensor_get(&r1[1], i);
    }
    CHECK(lo >= 0 && hi < 1 && hmax < 1 && f16_grid);
    CHECK_NEAR(sum / 4096, 0.5, 0.02, 0);
    CHECK(same_ctr < 10 && same_seed < 10);
    uint64_t bits = sm64(sm64(sm64(99) ^ 5u) ^ 3u);
    CHECK(mpt_tensor_get(&r1[0], 3) == (double)(bits >> 40) * 0x1p-24);
    CHECK(mpt_tensor_get(&r1[2], 3) == (double)(bits >> 53) * 0x1p-11);
    free_outs(g, r1);
    free_outs(g, r2);
    free_outs(g, r3);
    mpt_graph_free(g);
}

static void test_init_variables(void) {
    mpt_graph *g = mpt_graph_new("init");
    mpt_b_variable(g, "glorot", mpt_shape_2(100, 50), MPT_INIT_GLOROT_UNIFORM, 100, 50, 0, 1);
    mpt_b_variable(g, "he", mpt_shape_2(200, 100), MPT_INIT_HE_NORMAL, 200, 100, 0, 1);
    mpt_b_variable(g, "u", mpt_shape_1(1000), MPT_INIT_UNIFORM, 0, 0, 0.25, 1);
    mpt_b_variable_dt(g, "half", MPT_DT_BF16, mpt_shape_1(3), MPT_INIT_CONST, 0.1);
    mpt_b_variable_dt(g, "count", MPT_DT_I32, mpt_shape_1(3), MPT_INIT_ONES, 0);
    mpt_tensor a[5], b[5], c[5];
    CHECK(mpt_init_variables(g, a, 42) == 0);
    CHECK(mpt_init_variables(g, b, 42) == 0);
    CHECK(mpt_init_variables(g, c, 43) == 0);
    for (int k = 0; k < 5; k++)
        CHECK(memcmp(a[k].data, b[k].data, mpt_tensor_bytes(&a[k])) == 0);
    CHECK(memcmp(a[0].data, c[0].data, mpt_tensor_bytes(&a[0])) != 0);
    double lim = sqrt(6.0 / 150), mx = 0, s2 = 0, tmax = 0, umax = 0;
    for (int i = 0; i < 5000; i++) mx = fmax(mx, fabs(mpt_tensor_get(&a[0], i)));
    CHECK(mx <= lim && mx > 0.95 * lim);
    for (int i = 0; i < 20000; i++) {
        double v = mpt_tensor_get(&a[1], i);
        s2 += v * v;
        tmax = fmax(tmax, fabs(v));
    }
    double sd = sqrt(2.0 / 200);
    CHECK_NEAR(sqrt(s2 / 20000), sd, 0, 0.03);
    CHECK(tmax <= 2 * sd / 0.87962566103423978 + 1e-7); /* truncated at 2 stddev */
    for (int i = 0; i < 1000; i++) umax = fmax(umax, fabs(mpt_tensor_get(&a[2], i)));
    CHECK(umax <= 0.25 && umax > 0.24);
    CHECK(a[3].dtype == MPT_DT_BF16 && mpt_tensor_get(&a[3], 2) == mpt_round_to(MPT_DT_BF16, 0.1));
    CHECK(a[4].dtype == MPT_DT_I32 && ((int32_t *)a[4].data)[1] == 1);

    /* a variable's values depend on its name and the seed only */
    mpt_graph *g2 = mpt_graph_new("init2");
    mpt_b_variable(g2, "extra", mpt_shape_1(7), MPT_INIT_GLOROT_UNIFORM, 3, 4, 0, 1);
    mpt_b_variable(g2, "he", mpt_shape_2(200, 100), MPT_INIT_HE_NORMAL, 200, 100, 0, 1);
    mpt_tensor d[2];
    CHECK(mpt_init_variables(g2, d, 42) == 0);
    CHECK(memcmp(d[1].data, a[1].data, mpt_tensor_bytes(&a[1])) == 0);
    for (int k = 0; k < 5; k++) {
        mpt_tensor_free(&a[k]);
        mpt_tensor_free(&b[k]);
        mpt_tensor_free(&c[k]);
    }
    mpt_tensor_free(&d[0]);
    mpt_tensor_free(&d[1]);
    mpt_graph_free(g2);
    mpt_graph_free(g);

    /* an i32 variable cannot be glorot-initialised */
    g = mpt_graph_new("bad_init");
    mpt_b_variable_dt(g, "n", MPT_DT_I32, mpt_shape_1(2), MPT_INIT_GLOROT_UNIFORM, 0);
    CHECK(mpt_init_variables(g, a, 1) == -1);
    mpt_graph_free(g);
}

/* ---- user errors and the callback ---------------------------------------------------- */

static void expect_run_error(const mpt_graph *g, const mpt_tensor *in, const char *what) {
    char err[256] = "";
    mpt_tensor out[MAX_IO];
    int rc = mpt_interp_run(g, in, NULL, out, NULL, err, sizeof err);
    CHECK_MSG(rc == -1 && strstr(err, what), "rc %d, error \"%s\", expected \"...%s...\"", rc, err, what);
}

static void test_errors(void) {
    mpt_graph *g = mpt_graph_new("errs");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(2, 3));
    mpt_graph_add_output(g, "y", mpt_b_unary(g, MPT_OP_EXP, x));
    mpt_tensor t;
    mpt_tensor_alloc(&t, MPT_DT_F16, mpt_shape_2(2, 3));
    expect_run_error(g, &t, "input \"x\": fed f16[2,3] but the graph expects f32[2,3]");
    mpt_tensor_free(&t);
    mpt_tensor_alloc(&t, MPT_DT_F32, mpt_shape_2(3, 2));
    expect_run_error(g, &t, "fed f32[3,2] but the graph expects f32[2,3]");
    expect_run_error(g, NULL, "input \"x\" was not given a tensor");
    g->nodes[1].shape.dim[0] = 4; /* planted: the run refuses an unsound graph */
    expect_run_error(g, &t, "graph errs is not sound: %1 (exp)");
    mpt_tensor_free(&t);
    mpt_graph_free(g);
    CHECK(mpt_tensor_alloc(&t, MPT_DT_F32, mpt_shape_1(-1)) == -1 && t.data == NULL);
}

typedef struct {
    int calls, stop_at;
    uint16_t bits;
} watch;

static int on_node(void *ctx, const mpt_graph *g, int id, const mpt_tensor *v) {
    watch *w = ctx;
    w->calls++;
    if (v->dtype == MPT_DT_F16) w->bits = ((const uint16_t *)v->data)[0];
    return id == w->stop_at;
}

static void test_on_node(void) {
    mpt_graph *g = mpt_graph_new("watch");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_1(2));
    int h = mpt_b_cast(g, x, MPT_DT_F16);
    int y = mpt_b_binary(g, MPT_OP_MUL, h, h);
    mpt_b_unary(g, MPT_OP_EXP, x); /* unused: never computed */
    mpt_graph_add_output(g, "y", y);
    mpt_tensor in, out[1];
    mpt_tensor_alloc(&in, MPT_DT_F32, mpt_shape_1(2));
    mpt_tensor_set(&in, 0, 300);
    watch w = {0, -1, 0};
    mpt_interp_opts opts = {on_node, &w};
    char err[256];
    CHECK(mpt_interp_run(g, &in, NULL, out, &opts, err, sizeof err) == 0);
    CHECK(w.calls == 3 && w.bits == 0x7c00); /* 300^2 overflows f16: +inf bits */
    mpt_tensor_free(&out[0]);
    w = (watch){0, h, 0};
    CHECK(mpt_interp_run(g, &in, NULL, out, &opts, err, sizeof err) == -1);
    CHECK(w.calls == 2 && strstr(err, "stopped by on_node after %1 (cast)"));
    mpt_tensor_free(&in);
    mpt_graph_free(g);
}

int main(void) {
    test_unary();
    test_binary();
    test_low_precision();
    test_select_and_sources();
    test_reductions();
    test_argmax();
    test_movement();
    test_slice_concat();
    test_embedding_ops();
    test_matmul();
    test_batch_matmul();
    test_conv();
    test_pooling();
    test_softmax();
    test_updates();
    test_random_uniform();
    test_init_variables();
    test_errors();
    test_on_node();
    return check_exit("test_interp");
}
