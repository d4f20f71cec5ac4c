/* tests/test_interp.c — the reference interpreter against hand-computed
 * values: every elementwise op, f16/bf16 overflow, underflow and ties,
 * reductions and data movement. Matmul, convolution, pooling, updates,
 * random numbers, initialisers and user errors are
 * tests/test_interp_compute.c's. */
#include "tests/interp_check.h"

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
    return check_exit("test_interp");
}
