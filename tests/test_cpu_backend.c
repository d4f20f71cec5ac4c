/* tests/test_cpu_backend.c — the CPU backend against the reference
 * interpreter: every op and every kernel kind, fused and unfused, in f32,
 * f16 and bf16, at odd sizes (1, 7, 9, 1023) and round ones; then real train
 * steps of examples/mlp_small.mpt (three policies) and
 * examples/convnet_small.mpt. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xmmintrin.h>

#include "check.h"
#include "codegen/cpu/cpu.h"
#include "codegen/cpu/cpu_backend.h"
#include "fusion/fusion.h"
#include "ir/ir.h"
#include "lang/lang.h"

/* ---- the tolerance table: |got - ref| <= atol + rtol * |ref| ---- */

typedef enum {
    TOL_EXACT,  /* elementwise ops, casts, movement, max/all, pooling, argmax */
    TOL_ACCUM,  /* sums, GEMMs and convolutions: f32 accumulation vs the interpreter's double */
    TOL_COUNT
} tol_class;

typedef struct {
    double atol, rtol;
} tol;

static const tol tol_table[TOL_COUNT][3] = {
    /* Elementwise work is bit-exact by construction: +,-,*,/,sqrt in f32 then
     * rounded equal the interpreter's double rounded once (24 >= 2p+2 bits),
     * and transcendentals run in double, then round once (round-to-odd f32
     * for f16/bf16): pow as the interpreter does, exp/log/tanh/erf by vector
     * code within 1-4 double ulps of libm (tests/test_cpu_math.c). Rounded
     * to a float dtype these agree unless the exact value lies within those
     * ulps of a rounding boundary, about 2^-27 of values, and the inputs
     * here hit none: any difference is a bug. */
    [TOL_EXACT] = {{0, 0}, {0, 0}, {0, 0}},
    /* f32: a sum of K terms accumulated in f32 (several vector accumulators,
     * another order) vs once-rounded double: error grows like K * 2^-24 of
     * the terms' magnitude; the atol below is scaled by K (tol_for). */
    /* f16: the f32 sum is within a few f32 ulps, so rounding it to f16 can
     * land one f16 ulp (2^-10 relative) away: 2e-3. */
    /* bf16: one bf16 ulp is 2^-7 relative: 1.6e-2. */
    [TOL_ACCUM] = {{2e-6, 2e-5}, {1e-3, 2e-3}, {1e-2, 1.6e-2}},
};

static tol tol_for(tol_class c, mpt_dtype dt, int64_t k) {
    int i = dt == MPT_DT_F16 ? 1 : dt == MPT_DT_BF16 ? 2 : 0;
    tol t = tol_table[c][i];
    if (c == TOL_ACCUM && i == 0) t.atol *= (double)(k > 1 ? k : 1);
    return t;
}

/* ---- running a graph both ways ---- */

static unsigned rng_state = 12345;
static double urand(void) {
    rng_state = rng_state * 1103515245u + 12345u;
    return (double)((rng_state >> 8) & 0xffffff) / 16777216.0;
}

/* inputs: floats in [-3, 3] (with 0, -0 and, when specials, inf and nan at
 * the front), i32 class ids in [0, 10) */
static void fill_inputs(const mpt_graph *g, mpt_tensor *in, int specials) {
    for (int k = 0; k < mpt_graph_n_inputs(g); k++) {
        const mpt_node *nd = &g->nodes[mpt_graph_input_node(g, k)];
        mpt_tensor_alloc(&in[k], nd->dtype, nd->shape);
        int64_t n = mpt_shape_numel(nd->shape);
        for (int64_t i = 0; i < n; i++) {
            double v = nd->dtype == MPT_DT_I32 ? floor(urand() * 10) : 6 * urand() - 3;
            if (specials && nd->dtype != MPT_DT_I32 && i < 4 && n > 8)
                v = (double[]){0.0, -0.0, INFINITY, NAN}[i];
            mpt_tensor_set(&in[k], i, v);
        }
    }
}

/* run_both calls it after filling the inputs, when set */
static void (*plant)(const mpt_graph *g, mpt_tensor *in);

static int compare(const mpt_tensor *got, const mpt_tensor *ref, tol t, const char *what) {
    int64_t n = mpt_shape_numel(ref->shape), bad = 0, first = -1;
    if (got->dtype != ref->dtype || !mpt_shape_eq(got->shape, ref->shape)) {
        CHECK_MSG(0, "%s: dtype or shape differs", what);
        return 1;
    }
    for (int64_t i = 0; i < n; i++) {
        double a = mpt_tensor_get(got, i), b = mpt_tensor_get(ref, i);
        int ok = (isnan(a) && isnan(b)) || a == b || fabs(a - b) <= t.atol + t.rtol * fabs(b);
        if (!ok && first < 0) first = i;
        bad += !ok;
    }
    CHECK_MSG(bad == 0, "%s: %lld of %lld elements differ; first [%lld] got %.9g want %.9g", what,
              (long long)bad, (long long)n, (long long)first,
              first >= 0 ? mpt_tensor_get(got, first) : 0.0, first >= 0 ? mpt_tensor_get(ref, first) : 0.0);
    return bad != 0;
}

/* Runs g for `steps` steps on the interpreter and on the CPU backend (fused
 * and unfused plans) from the same start, comparing every output and
 * variable after each step with tolerance t. */
enum { FUSED = 1, UNFUSED = 2, BOTH = 3 };

static void run_both(const mpt_graph *g, int steps, tol t, int specials, const char *what, int which) {
    int ni = mpt_graph_n_inputs(g), nv = mpt_graph_n_variables(g), no = g->n_outputs;
    char err[1024], msg[256];
    for (int fused = 0; fused < 2; fused++) {
        if (!(which & (fused ? FUSED : UNFUSED))) continue;
        mpt_fusion_opts fo;
        mpt_fusion_opts_default(&fo);
        fo.enabled = fused;
        mpt_plan *p = mpt_fuse(g, &fo);
        mpt_exec *x = mpt_backend_cpu.compile(p, err, sizeof err);
        CHECK_MSG(x != NULL, "%s: compile: %s", what, err);
        mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in);
        mpt_tensor *vr = calloc((size_t)nv + 1, sizeof *vr), *vc = calloc((size_t)nv + 1, sizeof *vc);
        mpt_tensor *outr = calloc((size_t)no + 1, sizeof *outr), *outc = calloc((size_t)no + 1, sizeof *outc);
        mpt_init_variables(g, vr, 42);
        mpt_init_variables(g, vc, 42);
        unsigned seed0 = rng_state;
        for (int s = 0; x && s < steps; s++) {
            fill_inputs(g, in, specials);
            if (plant) plant(g, in);
            int rc = mpt_interp_run(g, in, vr, outr, NULL, err, sizeof err);
            CHECK_MSG(rc == 0, "%s: interp: %s", what, err);
            rc = mpt_backend_cpu.run(x, in, vc, outc, err, sizeof err);
            CHECK_MSG(rc == 0, "%s: cpu: %s", what, err);
            int bad = 0;
            for (int k = 0; k < no && rc == 0; k++) {
                snprintf(msg, sizeof msg, "%s %s step %d output %s", what, fused ? "fused" : "unfused",
                         s, g->outputs[k].name);
                bad |= compare(&outc[k], &outr[k], t, msg);
            }
            for (int k = 0; k < nv && rc == 0; k++) {
                snprintf(msg, sizeof msg, "%s %s step %d variable %s", what, fused ? "fused" : "unfused",
                         s, g->nodes[mpt_graph_variable_node(g, k)].name);
                bad |= compare(&vc[k], &vr[k], t, msg);
            }
            if (bad && getenv("MPT_TEST_VERBOSE")) mpt_plan_print(p, stderr, 0);
            for (int k = 0; k < no; k++) {
                mpt_tensor_free(&outr[k]);
                if (rc == 0) mpt_tensor_free(&outc[k]);
            }
            for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
        }
        rng_state = seed0;
        for (int k = 0; k < nv; k++) {
            mpt_tensor_free(&vr[k]);
            mpt_tensor_free(&vc[k]);
        }
        free(in);
        free(vr);
        free(vc);
        free(outr);
        free(outc);
        if (x) mpt_backend_cpu.free(x);
        mpt_plan_free(p);
    }
}

static const mpt_dtype float_dts[3] = {MPT_DT_F32, MPT_DT_F16, MPT_DT_BF16};
static const int64_t sizes[] = {1, 7, 9, 1023, 64, 96};

/* ---- elementwise ops, one at a time, every float dtype and size ---- */

static void test_elementwise(void) {
    static const mpt_op unary[] = {MPT_OP_NEG, MPT_OP_ABS, MPT_OP_EXP, MPT_OP_LOG, MPT_OP_SQRT,
                                   MPT_OP_RSQRT, MPT_OP_RECIP, MPT_OP_SQUARE, MPT_OP_RELU,
                                   MPT_OP_SIGMOID, MPT_OP_TANH, MPT_OP_GELU, MPT_OP_GELU_GRAD,
                                   MPT_OP_IS_FINITE};
    static const mpt_op binary[] = {MPT_OP_ADD, MPT_OP_SUB, MPT_OP_MUL, MPT_OP_DIV, MPT_OP_MAX,
                                    MPT_OP_MIN, MPT_OP_POW, MPT_OP_LT, MPT_OP_GT, MPT_OP_EQ};
    char what[128];
    for (int d = 0; d < 3; d++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            mpt_dtype dt = float_dts[d];
            mpt_shape s = mpt_shape_2(3, sizes[si]);
            mpt_graph *g = mpt_graph_new("elementwise");
            int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, s), dt);
            int y = mpt_b_cast(g, mpt_b_input(g, "y", MPT_DT_F32, s), dt);
            for (size_t u = 0; u < sizeof unary / sizeof unary[0]; u++)
                mpt_graph_add_output(g, mpt_op_name(unary[u]), mpt_b_unary(g, unary[u], x));
            for (size_t b = 0; b < sizeof binary / sizeof binary[0]; b++)
                mpt_graph_add_output(g, mpt_op_name(binary[b]), mpt_b_binary(g, binary[b], x, y));
            int gt = mpt_b_binary(g, MPT_OP_GT, x, y);
            mpt_graph_add_output(g, "select", mpt_b_select(g, gt, x, y));
            mpt_graph_add_output(g, "not", mpt_b_unary(g, MPT_OP_NOT, gt));
            mpt_graph_add_output(g, "and", mpt_b_binary(g, MPT_OP_AND, gt, mpt_b_binary(g, MPT_OP_LT, x, x)));
            /* casts between every pair, i32 and bool included */
            int xi = mpt_b_cast(g, mpt_b_binary(g, MPT_OP_MUL, x, mpt_b_broadcast_to(g, mpt_b_scalar(g, dt, 1000), s)), MPT_DT_I32);
            mpt_graph_add_output(g, "cast_i32", xi);
            mpt_graph_add_output(g, "cast_back", mpt_b_cast(g, xi, dt));
            mpt_graph_add_output(g, "i32_add", mpt_b_binary(g, MPT_OP_ADD, xi, xi));
            /* (the divisor is a constant: a truncated float can be -0 inside
             * one interpreter run, which no i32 buffer can hold) */
            mpt_graph_add_output(g, "i32_div", mpt_b_binary(g, MPT_OP_DIV, xi, mpt_b_broadcast_to(g, mpt_b_scalar(g, MPT_DT_I32, -7), s)));
            mpt_graph_add_output(g, "cast_bool", mpt_b_cast(g, x, MPT_DT_BOOL));
            for (int d2 = 0; d2 < 3; d2++)
                if (d2 != d) mpt_graph_add_output(g, mpt_dtype_name(float_dts[d2]), mpt_b_cast(g, x, float_dts[d2]));
            snprintf(what, sizeof what, "elementwise %s [3,%lld]", mpt_dtype_name(dt), (long long)sizes[si]);
            run_both(g, 1, tol_for(TOL_EXACT, dt, 1), 1, what, sizes[si] == 9 || sizes[si] == 1023 ? BOTH : FUSED);
            mpt_graph_free(g);
        }
}

/* ---- index ops fused into loops: broadcast, transpose, reshape, iota,
 * one_hot, gather, random_uniform ---- */

static void test_movement(void) {
    char what[128];
    for (int d = 0; d < 3; d++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            mpt_dtype dt = float_dts[d];
            int64_t C = sizes[si], R = 5;
            mpt_shape s = mpt_shape_2(R, C);
            mpt_graph *g = mpt_graph_new("movement");
            int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, s), dt);
            int xt = mpt_b_input(g, "xt", MPT_DT_F32, mpt_shape_2(C, R));
            int bias = mpt_b_input(g, "bias", MPT_DT_F32, mpt_shape_1(C));
            int col = mpt_b_input(g, "col", MPT_DT_F32, mpt_shape_1(R));
            int ids = mpt_b_input(g, "ids", MPT_DT_I32, mpt_shape_1(R));
            int table = mpt_b_input(g, "table", MPT_DT_F32, mpt_shape_2(10, C));
            int counter = mpt_b_input(g, "counter", MPT_DT_I32, mpt_shape_scalar());
            /* bias along the vector dim, a column along rows, a scalar */
            int y = mpt_b_binary(g, MPT_OP_MUL, x, mpt_b_broadcast(g, mpt_b_cast(g, bias, dt), s, 0x2));
            y = mpt_b_binary(g, MPT_OP_ADD, y, mpt_b_broadcast(g, mpt_b_cast(g, col, dt), s, 0x1));
            y = mpt_b_binary(g, MPT_OP_SUB, y, mpt_b_broadcast_to(g, mpt_b_scalar(g, dt, 0.5), s));
            int t = mpt_b_transpose(g, mpt_b_cast(g, xt, dt), (int[]){1, 0});
            y = mpt_b_binary(g, MPT_OP_ADD, y, t);
            mpt_graph_add_output(g, "fused", mpt_b_unary(g, MPT_OP_RELU, y));
            mpt_graph_add_output(g, "reshape", mpt_b_reshape(g, mpt_b_unary(g, MPT_OP_NEG, x), mpt_shape_1(R * C)));
            mpt_graph_add_output(g, "iota", mpt_b_binary(g, MPT_OP_ADD, x, mpt_b_iota(g, dt, s, 1)));
            mpt_graph_add_output(g, "one_hot", mpt_b_one_hot(g, ids, (int)C, dt));
            mpt_graph_add_output(g, "gather", mpt_b_gather(g, mpt_b_cast(g, table, dt), ids));
            mpt_graph_add_output(g, "random", mpt_b_random_uniform(g, counter, mpt_shape_2(R, C), 1234 + d));
            snprintf(what, sizeof what, "movement %s [%lld,%lld]", mpt_dtype_name(dt), (long long)R, (long long)C);
            run_both(g, 1, tol_for(TOL_EXACT, dt, 1), 0, what, sizes[si] == 9 || sizes[si] == 1023 ? BOTH : FUSED);
            mpt_graph_free(g);
        }
}

/* ---- reductions: over the last dim (mode A), the first (mode B), all;
 * and the softmax kernel whose second pass reads the first's result ---- */

static void test_reductions(void) {
    char what[128];
    for (int d = 0; d < 3; d++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            mpt_dtype dt = float_dts[d];
            int64_t C = sizes[si], R = 7;
            mpt_shape s = mpt_shape_2(R, C);
            mpt_graph *g = mpt_graph_new("reduce");
            int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, s), dt);
            int sq = mpt_b_unary(g, MPT_OP_SQUARE, x);
            mpt_graph_add_output(g, "sum_last", mpt_b_reduce(g, MPT_OP_REDUCE_SUM, sq, 0x2));
            /* a second reduction of the same rows in the same pass (each
             * needs its own vector and scalar accumulators) */
            mpt_graph_add_output(g, "max_sq_last", mpt_b_reduce(g, MPT_OP_REDUCE_MAX, sq, 0x2));
            mpt_graph_add_output(g, "sum_first", mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, 0x1));
            mpt_graph_add_output(g, "sum_all", mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, 0x3));
            mpt_graph_add_output(g, "max_last", mpt_b_reduce(g, MPT_OP_REDUCE_MAX, x, 0x2));
            mpt_graph_add_output(g, "max_first", mpt_b_reduce(g, MPT_OP_REDUCE_MAX, x, 0x1));
            int fin = mpt_b_unary(g, MPT_OP_IS_FINITE, mpt_b_unary(g, MPT_OP_LOG, x));
            mpt_graph_add_output(g, "all", mpt_b_reduce(g, MPT_OP_REDUCE_ALL, fin, 0x3));
            mpt_graph_add_output(g, "all_last", mpt_b_reduce(g, MPT_OP_REDUCE_ALL, fin, 0x2));
            /* softmax: max, then exp(x - max) and its sum in one kernel, then / */
            int xf = mpt_b_cast(g, x, MPT_DT_F32);
            int m = mpt_b_reduce(g, MPT_OP_REDUCE_MAX, xf, 0x2);
            int ex = mpt_b_unary(g, MPT_OP_EXP, mpt_b_binary(g, MPT_OP_SUB, xf, mpt_b_broadcast(g, m, s, 0x1)));
            int den = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, ex, 0x2);
            int sm = mpt_b_binary(g, MPT_OP_DIV, ex, mpt_b_broadcast(g, den, s, 0x1));
            mpt_graph_add_output(g, "softmax", sm);
            /* a second pass over the row reading the first pass's result */
            int lse = mpt_b_unary(g, MPT_OP_LOG, den);
            int lp = mpt_b_binary(g, MPT_OP_SUB, xf, mpt_b_broadcast(g, lse, s, 0x1));
            mpt_graph_add_output(g, "logp_sum", mpt_b_reduce(g, MPT_OP_REDUCE_SUM, lp, 0x2));
            /* more reductions in one pass than a fixed table would hold
             * (ResNet-50's loss-scale check fuses dozens): twelve of
             * x * k over the same rows */
            for (int r = 0; r < 12; r++) {
                char name[32];
                snprintf(name, sizeof name, "many_%d", r);
                int xs = mpt_b_binary(g, MPT_OP_MUL, xf, mpt_b_broadcast_to(g, mpt_b_scalar(g, MPT_DT_F32, 1.0 + r), s));
                mpt_graph_add_output(g, name, mpt_b_reduce(g, r % 2 ? MPT_OP_REDUCE_MAX : MPT_OP_REDUCE_SUM, xs, 0x2));
            }
            snprintf(what, sizeof what, "reductions %s [%lld,%lld]", mpt_dtype_name(dt), (long long)R, (long long)C);
            run_both(g, 1, tol_for(TOL_ACCUM, dt, C * R), 0, what, sizes[si] == 9 || sizes[si] == 1023 ? BOTH : FUSED);
            mpt_graph_free(g);
        }
}

/* ---- batch statistics over many rows: the reductions split along the
 * reduced rows into chunks (codegen/cpu/emit_reduce.c mode S), with a
 * second pass reading the first's result, element outputs before and
 * after the reductions, an int reduction, kept dims over two axes, and
 * row counts that leave a partial chunk and a partial block of rows ---- */

static void test_split_reductions(void) {
    static const int64_t shapes[][3] = {{300, 64, 0}, {1023, 96, 0}, {281, 3, 32}};
    char what[128];
    for (int d = 0; d < 3; d++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            mpt_dtype dt = float_dts[d];
            int64_t R = shapes[si][0];
            mpt_shape s = shapes[si][2] ? mpt_shape_make(3, shapes[si]) : mpt_shape_2(R, shapes[si][1]);
            mpt_graph *g = mpt_graph_new("batch_stats");
            int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, s), dt);
            int dy = mpt_b_cast(g, mpt_b_input(g, "dy", MPT_DT_F32, s), dt);
            int xf = mpt_b_cast(g, x, MPT_DT_F32), dyf = mpt_b_cast(g, dy, MPT_DT_F32);
            int64_t keep = (int64_t)((1 << s.rank) - 2); /* every dim but the first */
            int inv_r = mpt_b_scalar(g, MPT_DT_F32, 1.0 / (double)R);
            int mean = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, xf, 0x1);
            mean = mpt_b_binary(g, MPT_OP_MUL, mean, mpt_b_broadcast_to(g, inv_r, g->nodes[mean].shape));
            int dev = mpt_b_binary(g, MPT_OP_SUB, xf, mpt_b_broadcast(g, mean, s, keep));
            int var = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_unary(g, MPT_OP_SQUARE, dev), 0x1);
            var = mpt_b_binary(g, MPT_OP_MUL, var, mpt_b_broadcast_to(g, inv_r, g->nodes[var].shape));
            int eps = mpt_b_scalar(g, MPT_DT_F32, 1e-3); /* before g->nodes is read */
            eps = mpt_b_broadcast_to(g, eps, g->nodes[var].shape);
            int rstd = mpt_b_unary(g, MPT_OP_RSQRT, mpt_b_binary(g, MPT_OP_ADD, var, eps));
            int xhat = mpt_b_binary(g, MPT_OP_MUL, dev, mpt_b_broadcast(g, rstd, s, keep));
            mpt_graph_add_output(g, "mean", mean);
            mpt_graph_add_output(g, "var", var);
            mpt_graph_add_output(g, "y", mpt_b_cast(g, xhat, dt));
            mpt_graph_add_output(g, "relu", mpt_b_unary(g, MPT_OP_RELU, x));
            mpt_graph_add_output(g, "max", mpt_b_reduce(g, MPT_OP_REDUCE_MAX, xf, 0x1));
            mpt_graph_add_output(g, "finite", mpt_b_reduce(g, MPT_OP_REDUCE_ALL, mpt_b_unary(g, MPT_OP_IS_FINITE, x), 0x1));
            /* the backward: two sums in one pass, then dx from both */
            int sdy = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, dyf, 0x1);
            int sdyx = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_binary(g, MPT_OP_MUL, dyf, xf), 0x1);
            int dx = mpt_b_binary(g, MPT_OP_SUB, dyf, mpt_b_broadcast(g, mpt_b_binary(g, MPT_OP_MUL, sdy,
                                  mpt_b_broadcast_to(g, inv_r, g->nodes[sdy].shape)), s, keep));
            dx = mpt_b_binary(g, MPT_OP_SUB, dx, mpt_b_binary(g, MPT_OP_MUL, xf, mpt_b_broadcast(g,
                              mpt_b_binary(g, MPT_OP_MUL, sdyx, mpt_b_broadcast_to(g, inv_r, g->nodes[sdyx].shape)), s, keep)));
            mpt_graph_add_output(g, "dx", mpt_b_cast(g, dx, dt));
            mpt_graph_add_output(g, "sum_dy", sdy);
            snprintf(what, sizeof what, "batch statistics %s [%lld,...]", mpt_dtype_name(dt), (long long)R);
            run_both(g, 1, tol_for(TOL_ACCUM, dt, R), 0, what, BOTH);
            mpt_graph_free(g);
            /* softmax down the columns: the max, then the sum of exp(x - max)
             * in a second pass, then the quotient (five stages, fused) */
            g = mpt_graph_new("column_softmax");
            x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, s), dt);
            xf = mpt_b_cast(g, x, MPT_DT_F32);
            int m = mpt_b_reduce(g, MPT_OP_REDUCE_MAX, xf, 0x1);
            int ex = mpt_b_unary(g, MPT_OP_EXP, mpt_b_binary(g, MPT_OP_SUB, xf, mpt_b_broadcast(g, m, s, keep)));
            int den = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, ex, 0x1);
            mpt_graph_add_output(g, "softmax", mpt_b_binary(g, MPT_OP_DIV, ex, mpt_b_broadcast(g, den, s, keep)));
            mpt_graph_add_output(g, "log_den", mpt_b_unary(g, MPT_OP_LOG, den));
            snprintf(what, sizeof what, "column softmax %s [%lld,...]", mpt_dtype_name(dt), (long long)R);
            run_both(g, 1, tol_for(TOL_ACCUM, dt, R), 0, what, BOTH);
            mpt_graph_free(g);
        }
}

/* ---- GEMMs with every transpose, epilogues mapped onto the GEMM (f32) or
 * run as a loop after it (f16/bf16), prologue casts ---- */

static void test_gemm(void) {
    /* N <= 16 with K >= 64: A read in place (a classifier's logits) */
    static const int64_t mnk[][3] = {{1, 1, 1}, {7, 9, 5}, {33, 17, 300}, {64, 64, 64},
                                     {37, 10, 100}, {1, 16, 64}};
    char what[160];
    for (int d = 0; d < 3; d++)
        for (size_t si = 0; si < sizeof mnk / sizeof mnk[0]; si++)
            for (int tr = 0; tr < 4; tr++) {
                if (tr && si != 2) continue; /* every transpose on one odd shape */
                mpt_dtype dt = float_dts[d];
                int64_t M = mnk[si][0], N = mnk[si][1], K = mnk[si][2];
                int ta = tr & 1, tb = tr >> 1;
                mpt_graph *g = mpt_graph_new("gemm");
                int a = mpt_b_input(g, "a", MPT_DT_F32, ta ? mpt_shape_2(K, M) : mpt_shape_2(M, K));
                int b = mpt_b_variable(g, "w", tb ? mpt_shape_2(N, K) : mpt_shape_2(K, N),
                                       MPT_INIT_GLOROT_UNIFORM, K, N, 0, 1);
                int bias = mpt_b_variable(g, "bias", mpt_shape_1(N), MPT_INIT_UNIFORM, 0, 0, 0.5, 1);
                int mm = mpt_b_matmul(g, mpt_b_cast(g, a, dt), mpt_b_cast(g, b, dt), ta, tb);
                int z = mpt_b_binary(g, MPT_OP_ADD, mm, mpt_b_broadcast(g, mpt_b_cast(g, bias, dt), mpt_shape_2(M, N), 0x2));
                mpt_graph_add_output(g, "y", mpt_b_cast(g, mpt_b_unary(g, MPT_OP_RELU, z), MPT_DT_F32));
                mpt_graph_add_output(g, "plain", mpt_b_matmul(g, mpt_b_cast(g, a, dt), mpt_b_cast(g, b, dt), ta, tb));
                snprintf(what, sizeof what, "gemm %s M=%lld N=%lld K=%lld trans=%d%d", mpt_dtype_name(dt),
                         (long long)M, (long long)N, (long long)K, ta, tb);
                run_both(g, 1, tol_for(TOL_ACCUM, dt, K), 0, what, si == 2 && tr == 0 ? BOTH : FUSED);
                mpt_graph_free(g);
            }
}

/* Non-finite values in two elements of the residual input r (inputs[1]):
 * the last row's last column and a middle row's column 1. */
static void plant_nonfinite(const mpt_graph *g, mpt_tensor *in) {
    const mpt_shape s = g->nodes[mpt_graph_input_node(g, 1)].shape;
    int64_t M = s.dim[0], N = s.dim[1];
    mpt_tensor_set(&in[1], M * N - 1, INFINITY);
    if (N > 1) mpt_tensor_set(&in[1], (M / 2) * N + 1, NAN);
}

/* The loss-scale check of a gradient in its GEMM's epilogue: flags =
 * reduce_all over the rows of is_finite(cast(a x w + r, f32) * scale),
 * one flag per column, computed by the epilogue loop (which the pool
 * splits by elements) next to an elementwise output or alone. */
static void test_gemm_epilogue_all_finite(void) {
    static const int64_t mnk[][3] = {{1, 1, 3}, {7, 9, 5}, {1023, 37, 20}, {96, 64, 128}};
    char what[160];
    for (int d = 0; d < 3; d++)
        for (size_t si = 0; si < sizeof mnk / sizeof mnk[0]; si++)
            for (int alone = 0; alone < 2; alone++) {
                mpt_dtype dt = float_dts[d];
                int64_t M = mnk[si][0], N = mnk[si][1], K = mnk[si][2];
                mpt_graph *g = mpt_graph_new("gemm_all_finite");
                mpt_shape mn = mpt_shape_2(M, N);
                int a = mpt_b_input(g, "a", MPT_DT_F32, mpt_shape_2(M, K));
                int r = mpt_b_input(g, "r", MPT_DT_F32, mn);
                int w = mpt_b_variable(g, "w", mpt_shape_2(K, N), MPT_INIT_GLOROT_UNIFORM, K, N, 0, 1);
                int mm = mpt_b_matmul(g, mpt_b_cast(g, a, dt), mpt_b_cast(g, w, dt), 0, 0);
                int y = mpt_b_binary(g, MPT_OP_ADD, mm, mpt_b_cast(g, r, dt));
                int g32 = mpt_b_binary(g, MPT_OP_MUL, mpt_b_cast(g, y, MPT_DT_F32),
                                       mpt_b_broadcast_to(g, mpt_b_scalar(g, MPT_DT_F32, 0.5), mn));
                int ok = mpt_b_reduce(g, MPT_OP_REDUCE_ALL, mpt_b_unary(g, MPT_OP_IS_FINITE, g32), 0x1);
                mpt_graph_add_output(g, "flags", ok);
                if (!alone) mpt_graph_add_output(g, "g", mpt_b_unary(g, MPT_OP_NEG, g32));
                mpt_fusion_opts fo;
                mpt_fusion_opts_default(&fo);
                mpt_plan *p = mpt_fuse(g, &fo);
                CHECK_MSG(p->n_kernels == 1 && p->kernels[0].kind == MPT_KERNEL_GEMM,
                          "the flags must be computed in the GEMM's epilogue (%d kernels)", p->n_kernels);
                mpt_plan_free(p);
                snprintf(what, sizeof what, "gemm all-finite %s M=%lld N=%lld K=%lld%s", mpt_dtype_name(dt),
                         (long long)M, (long long)N, (long long)K, alone ? " alone" : "");
                plant = plant_nonfinite;
                run_both(g, 2, tol_for(TOL_ACCUM, dt, K), 0, what, si == 2 ? BOTH : FUSED);
                plant = NULL;
                mpt_graph_free(g);
            }
}

/* ---- convolutions (forward and both gradients), pooling, argmax,
 * scatter_add ---- */

/* y = conv2d(x, w) (relu'd when relu_y), dx and dw from dy, for a k x k
 * kernel with equal pads p; *OH, *OW: the output size */
static mpt_graph *conv_graph(mpt_dtype dt, const char *name, int64_t N, int64_t H, int64_t W,
                             int64_t C, int64_t O, int64_t k, int64_t st, int64_t p, int relu_y,
                             int64_t *OH, int64_t *OW) {
    *OH = mpt_conv_out_size(H, k, st, p, p);
    *OW = mpt_conv_out_size(W, k, st, p, p);
    mpt_graph *g = mpt_graph_new(name);
    int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_4(N, H, W, C)), dt);
    int w = mpt_b_cast(g, mpt_b_input(g, "w", MPT_DT_F32, mpt_shape_4(k, k, C, O)), dt);
    int dy = mpt_b_cast(g, mpt_b_input(g, "dy", MPT_DT_F32, mpt_shape_4(N, *OH, *OW, O)), dt);
    int y = mpt_b_conv2d(g, x, w, st, st, p, p, mpt_shape_4(N, *OH, *OW, O));
    mpt_graph_add_output(g, "y", relu_y ? mpt_b_unary(g, MPT_OP_RELU, y) : y);
    mpt_graph_add_output(g, "dx", mpt_b_conv2d_bwd_data(g, dy, w, st, st, p, p, mpt_shape_4(N, H, W, C)));
    mpt_graph_add_output(g, "dw", mpt_b_conv2d_bwd_filter(g, x, dy, st, st, p, p, mpt_shape_4(k, k, C, O)));
    return g;
}

/* The CPU plan's report (`mptc asm`'s): what each kernel's core runs. */
static char *plan_text(mpt_graph *g, const char *what) {
    char *text = NULL, err[256];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    mpt_fusion_opts fo;
    mpt_fusion_opts_default(&fo);
    mpt_plan *p = mpt_fuse(g, &fo);
    int rc = mpt_cpu_emit_plan(p, "asm", "build/tests/conv_plan", f, err, sizeof err);
    fclose(f);
    CHECK_MSG(rc == 0, "%s: emit: %s", what, err);
    mpt_plan_free(p);
    return text;
}

static void test_conv_and_opaque(void) {
    char what[128];
    for (int d = 0; d < 3; d++) {
        mpt_dtype dt = float_dts[d];
        for (int k = 1; k <= 3; k += 2)
            for (int st = 1; st <= 2; st++) {
                int64_t N = 2, C = 3, O = 5, OH, OW;
                mpt_graph *g = conv_graph(dt, "conv", N, 9, 7, C, O, k, st, k / 2, 1, &OH, &OW);
                snprintf(what, sizeof what, "conv %s k=%d stride=%d", mpt_dtype_name(dt), k, st);
                run_both(g, 1, tol_for(TOL_ACCUM, dt, k * k * (C > O ? C : O) * N * OH * OW), 0, what, k == 3 && st == 2 ? BOTH : FUSED);
                mpt_graph_free(g);
            }
        /* a large strided kernel clipped on both sides of the image, an odd
         * batch split over the pool, and the data gradient by phases, then
         * by GEMM + col2im in several rounds of two images (a tiny chunk
         * budget) */
        {
            int64_t N = 5, C = 4, k = 5, OH, OW;
            for (int col2im = 0; col2im < 2; col2im++) {
                if (col2im) setenv("MPT_CPU_DGRAD", "col2im", 1);
                setenv("MPT_CPU_CONV_CHUNK_BYTES", "1", 1);
                mpt_graph *g = conv_graph(dt, "conv_big", N, 9, 7, C, 6, k, 2, 2, 0, &OH, &OW);
                snprintf(what, sizeof what, "conv %s k=5 stride=2 batch 5 %s", mpt_dtype_name(dt),
                         col2im ? "col2im in rounds" : "phases");
                run_both(g, 1, tol_for(TOL_ACCUM, dt, k * k * C * N * OH * OW), 0, what, FUSED);
                mpt_graph_free(g);
                unsetenv("MPT_CPU_CONV_CHUNK_BYTES");
                unsetenv("MPT_CPU_DGRAD");
            }
        }
        /* enough channels that K = KH*KW*C = 1200 passes the GEMM's k block
         * and the filter gradient's M covers several groups of slivers: the
         * implicit GEMM's windows cut kernel rows and image edges anywhere
         * (f32 gathers them from the padded image); then f32 filled and
         * packed instead; then the column matrix in memory */
        for (int cols = 0; cols < 3; cols++) {
            if (cols == 1 && dt != MPT_DT_F32) continue;
            int64_t N = 3, C = 48, k = 5, OH, OW;
            if (cols == 1) setenv("MPT_CPU_CONV_GATHER", "0", 1);
            if (cols == 2) setenv("MPT_CPU_CONV_EXPLICIT", "1", 1);
            mpt_graph *g = conv_graph(dt, "conv_wide", N, 11, 10, C, 40, k, 2, 2, 0, &OH, &OW);
            static const char *how[] = {"implicit", "implicit packed", "explicit"};
            snprintf(what, sizeof what, "conv %s k=5 C=48 %s columns", mpt_dtype_name(dt),
                     how[cols]);
            run_both(g, 1, tol_for(TOL_ACCUM, dt, k * k * C * N * OH * OW), 0, what, FUSED);
            mpt_graph_free(g);
            unsetenv("MPT_CPU_CONV_EXPLICIT");
            unsetenv("MPT_CPU_CONV_GATHER");
        }
        /* bf16 on AMX with a batch of 16s and 32s of channels: A's tiles are
         * read in place from an interleaved padded copy (forward and data
         * gradient), rows in (N/16, position, 16) order. 32 images, K over
         * the k block (1600), stride 2; then 16 images with 49 positions,
         * so the last 32-row tile is half past the end. Then batches of 8
         * (interleave 8, a tile's rows two positions of 8 images): stride 1
         * (forward and data gradient), and stride 2, where only the data
         * gradient's phases (4 grid columns each) step one column. First
         * layers (3 channels): 7x3 and 11x3 kernel rows as tiles (forward
         * where OW is 16); filter gradients with dy transposed (64 filters)
         * or packed, 225 positions leaving an odd pair, no padding; then
         * 32 channels, whose filter gradients (no tiles below a batch of
         * 32) take the kernel rows too. */
        if (dt == MPT_DT_BF16) {
            /* N, H, W, C, O, k, stride, pad; kernel rows: 1 first layer, 2 filter gradient */
            static const int64_t shapes[11][9] = {
                {32, 9, 7, 64, 64, 5, 2, 2, 0}, {16, 7, 7, 64, 32, 3, 1, 1, 0},
                {8, 6, 10, 64, 32, 3, 1, 1, 0}, {8, 8, 8, 64, 32, 3, 2, 1, 0},
                {2, 9, 31, 3, 40, 7, 2, 3, 1}, {3, 5, 16, 3, 24, 11, 1, 5, 1}, {2, 7, 37, 3, 32, 7, 2, 0, 1},
                {2, 6, 31, 3, 64, 7, 2, 3, 1}, {3, 5, 15, 3, 24, 11, 1, 5, 1},
                {4, 12, 12, 32, 16, 3, 1, 1, 2}, {4, 24, 24, 32, 32, 3, 2, 1, 2}};
            char feats[256];
            int amx = strstr(mpt_cpu_host_features(feats, sizeof feats), "amx in use") != NULL;
            for (int t = 0; t < 11; t++) {
                const int64_t *v = shapes[t];
                int64_t OH, OW;
                mpt_graph *g = conv_graph(dt, "conv_tiles", v[0], v[1], v[2], v[3], v[4], v[5],
                                          v[6], v[7], 1, &OH, &OW);
                snprintf(what, sizeof what, "conv bf16 k=%lld stride=%lld batch %lld AMX tiles",
                         (long long)v[5], (long long)v[6], (long long)v[0]);
                run_both(g, 1, tol_for(TOL_ACCUM, dt, v[5] * v[5] * v[3] * v[0] * OH * OW), 0,
                         what, FUSED);
                if (amx) {
                    /* the plan says which convolutions took which tiles: the
                     * interleave of 8; kernel rows (a first layer's forward
                     * where an output row is whole tiles, filter gradients) */
                    char *text = plan_text(g, what), *t = text ? text : "";
                    int fwd8 = strstr(t, "conv2d via AMX tiles in place, images in 8s") != NULL;
                    int bwd8 = strstr(t, "phased AMX tiles in place, images in 8s") != NULL;
                    int fwd = strstr(t, "conv2d via AMX tiles by kernel row") != NULL;
                    int dw = strstr(t, "conv2d_bwd_filter via AMX tiles by kernel row") != NULL;
                    CHECK_MSG(v[0] != 8 || (bwd8 && fwd8 == (v[6] == 1)), "%s: by 8s forward %d, "
                              "data gradient %d\n%s", what, fwd8, bwd8, t);
                    CHECK_MSG(dw == (v[8] != 0) && fwd == (v[8] == 1 && OW % 16 == 0), "%s: by "
                              "kernel row forward %d, filter gradient %d\n%s", what, fwd, dw, t);
                    free(text);
                }
                mpt_graph_free(g);
            }
        }
        /* stride 3 with an even kernel and unequal pads: the data gradient's
         * phases get 2 or 1 taps per dim and grids of unequal size (bf16 runs
         * it by phases) */
        {
            int64_t N = 3, H = 10, W = 8, C = 5, O = 7, kh = 4, kw = 2, st = 3, ph = 2, pw = 0;
            int64_t OH = mpt_conv_out_size(H, kh, st, ph, 1), OW = mpt_conv_out_size(W, kw, st, pw, 1);
            mpt_graph *g = mpt_graph_new("conv_phases");
            int w = mpt_b_cast(g, mpt_b_input(g, "w", MPT_DT_F32, mpt_shape_4(kh, kw, C, O)), dt);
            int dy = mpt_b_cast(g, mpt_b_input(g, "dy", MPT_DT_F32, mpt_shape_4(N, OH, OW, O)), dt);
            mpt_graph_add_output(g, "dx", mpt_b_conv2d_bwd_data(g, dy, w, st, st, ph, pw, mpt_shape_4(N, H, W, C)));
            snprintf(what, sizeof what, "conv %s 4x2 stride=3 data gradient", mpt_dtype_name(dt));
            run_both(g, 1, tol_for(TOL_ACCUM, dt, kh * kw * O), 0, what, FUSED);
            mpt_graph_free(g);
        }
        mpt_graph *g = mpt_graph_new("opaque");
        mpt_shape xs = mpt_shape_4(2, 7, 9, 3);
        int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, xs), dt);
        int mp = mpt_b_pool(g, MPT_OP_MAX_POOL, x, 2, 2, 2, 2, 0, 0, mpt_shape_4(2, 3, 4, 3));
        int ap = mpt_b_pool(g, MPT_OP_AVG_POOL, x, 3, 3, 2, 2, 1, 1, mpt_shape_4(2, 4, 5, 3));
        mpt_graph_add_output(g, "max_pool", mp);
        mpt_graph_add_output(g, "avg_pool", ap);
        /* overlapping windows with padding (ResNet-50's first pooling):
         * the gradient's ring of input rows wraps while rows are shared */
        int mp3 = mpt_b_pool(g, MPT_OP_MAX_POOL, x, 3, 3, 2, 2, 1, 1, mpt_shape_4(2, 4, 5, 3));
        mpt_graph_add_output(g, "max_pool_3x3", mp3);
        /* dy before g->nodes is read: a new node may move it */
        int n2 = mpt_b_unary(g, MPT_OP_NEG, mp), n3 = mpt_b_unary(g, MPT_OP_NEG, mp3);
        int na = mpt_b_unary(g, MPT_OP_NEG, ap);
        mpt_graph_add_output(g, "max_pool_grad", mpt_b_max_pool_grad(g, x, n2, &g->nodes[mp].attr));
        mpt_graph_add_output(g, "max_pool_3x3_grad", mpt_b_max_pool_grad(g, x, n3, &g->nodes[mp3].attr));
        mpt_graph_add_output(g, "avg_pool_grad", mpt_b_avg_pool_grad(g, na, &g->nodes[ap].attr, xs));
        int v = mpt_b_cast(g, mpt_b_input(g, "v", MPT_DT_F32, mpt_shape_2(9, 10)), dt);
        mpt_graph_add_output(g, "argmax", mpt_b_argmax(g, v, 1));
        int ids = mpt_b_input(g, "ids", MPT_DT_I32, mpt_shape_1(9));
        mpt_graph_add_output(g, "scatter_add", mpt_b_scatter_add(g, ids, mpt_b_unary(g, MPT_OP_NEG, v), 12));
        snprintf(what, sizeof what, "opaque %s", mpt_dtype_name(dt));
        run_both(g, 1, tol_for(TOL_EXACT, dt, 1), 0, what, BOTH);
        mpt_graph_free(g);
    }
}

/* ---- updates computed straight into their variables, and the profile ----
 * Some updates may be written in place (an elementwise step of a loop or
 * of a GEMM's epilogue), others may not: a swap of two variables, and a
 * weight a later kernel still reads. Three steps against the interpreter
 * catch a value overwritten too early; the profile says how many were. */

static void test_updates_and_profile(void) {
    mpt_graph *g = mpt_graph_new("updates");
    mpt_shape s = mpt_shape_2(33, 40);
    int w = mpt_b_variable(g, "w", s, MPT_INIT_UNIFORM, 0, 0, 1, 1);
    int gr = mpt_b_input(g, "g", MPT_DT_F32, s);
    int half = mpt_b_const(g, MPT_DT_F32, s, 0.5);
    int w_new = mpt_b_binary(g, MPT_OP_SUB, w, mpt_b_binary(g, MPT_OP_MUL, half, gr));
    mpt_graph_add_update(g, w, w_new);
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(16, 40));
    int dy = mpt_b_input(g, "dy", MPT_DT_F32, mpt_shape_2(16, 8));
    int wm = mpt_b_variable(g, "wm", mpt_shape_2(40, 8), MPT_INIT_GLOROT_UNIFORM, 40, 8, 0, 1);
    int gw = mpt_b_matmul(g, x, dy, 1, 0);
    int tenth = mpt_b_const(g, MPT_DT_F32, mpt_shape_2(40, 8), 0.1);
    mpt_graph_add_update(g, wm, mpt_b_binary(g, MPT_OP_SUB, wm, mpt_b_binary(g, MPT_OP_MUL, tenth, gw)));
    /* reads the old wm, and may be placed after the update's kernel */
    mpt_graph_add_output(g, "y", mpt_b_matmul(g, x, wm, 0, 0));
    int p = mpt_b_variable(g, "p", mpt_shape_1(40), MPT_INIT_UNIFORM, 0, 0, 1, 1);
    int q = mpt_b_variable(g, "q", mpt_shape_1(40), MPT_INIT_UNIFORM, 0, 0, 1, 1);
    mpt_graph_add_update(g, p, q);
    mpt_graph_add_update(g, q, p);
    mpt_graph_add_output(g, "w_sq", mpt_b_unary(g, MPT_OP_SQUARE, w_new));
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    mpt_cpu_profile(f);
    run_both(g, 3, tol_for(TOL_ACCUM, MPT_DT_F32, 40), 0, "in-place updates", BOTH);
    mpt_cpu_profile(NULL);
    fclose(f);
    int fused_in_place = -1, n_updates = 0;
    const char *at = text ? strstr(text, "cpu profile of updates") : NULL;
    const char *again = at ? strstr(at + 1, "cpu profile of updates") : NULL;
    const char *last = again ? again : at; /* the fused plan runs second */
    const char *c = last ? strstr(last, "updates computed in place") : NULL;
    while (c && c > last && c[-1] != '(') c--;
    if (c) sscanf(c, "%d of %d", &fused_in_place, &n_updates);
    if (getenv("MPT_TEST_VERBOSE")) fputs(text ? text : "", stderr);
    CHECK_MSG(at && again, "the profile has a table per plan:\n%s", text ? text : "");
    CHECK_MSG(text && strstr(text, "per layer:"), "the profile has the per-layer summary");
    /* measured ceilings, and each row's share of its ceiling */
    double f32 = 0, gbps = 0;
    const char *ce = text ? strstr(text, "ceilings on ") : NULL;
    const char *fc = ce ? strstr(ce, "f32 ") : NULL, *mc = ce ? strstr(ce, "memory ") : NULL;
    if (fc) sscanf(fc, "f32 %lf", &f32);
    if (mc) sscanf(mc, "memory %lf", &gbps);
    CHECK_MSG(f32 > 1 && gbps > 0.5, "ceilings measured: f32 %g GFLOP/s, %g GB/s", f32, gbps);
    CHECK(text && strstr(text, "of ceiling") && strstr(text, "%  "));
    CHECK_MSG(n_updates == 4 && fused_in_place >= 1 && fused_in_place <= 2,
              "fused plan: %d of %d updates in place (want 1 or 2 of 4: never the swap)",
              fused_in_place, n_updates);
    free(text);
    mpt_graph_free(g);
}

/* ---- denormals: flushed by default (as TensorFlow and XLA run on the
 * CPU), kept with MPTC_DENORMALS=keep; the caller's MXCSR either way ---- */

static void test_denormals(void) {
    mpt_shape s = mpt_shape_2(4, 4096);
    mpt_graph *g = mpt_graph_new("denormals");
    int x = mpt_b_input(g, "x", MPT_DT_F32, s), z = mpt_b_input(g, "z", MPT_DT_F32, s);
    mpt_graph_add_output(g, "prod", mpt_b_binary(g, MPT_OP_MUL, x, z));
    mpt_graph_add_output(g, "mm", mpt_b_matmul(g, x, z, 0, 1));
    char err[512];
    unsigned csr = _mm_getcsr();
    for (int keep = 0; keep < 2; keep++) {
        if (keep) setenv("MPTC_DENORMALS", "keep", 1);
        else unsetenv("MPTC_DENORMALS");
        mpt_fusion_opts fo;
        mpt_fusion_opts_default(&fo);
        mpt_plan *p = mpt_fuse(g, &fo);
        mpt_exec *e = mpt_backend_cpu.compile(p, err, sizeof err);
        CHECK_MSG(e != NULL, "denormals: compile: %s", err);
        mpt_tensor in[2], out[2];
        mpt_tensor_alloc(&in[0], MPT_DT_F32, s);
        mpt_tensor_alloc(&in[1], MPT_DT_F32, s);
        float *xv = in[0].data, *zv = in[1].data;
        for (int64_t i = 0; i < mpt_shape_numel(s); i++) {
            xv[i] = (i % 3 ? 1e-39f : -2e-39f); /* f32 denormals */
            zv[i] = 1.0f;
        }
        int rc = e ? mpt_backend_cpu.run(e, in, NULL, out, err, sizeof err) : -1;
        CHECK_MSG(rc == 0, "denormals: run: %s", err);
        CHECK_MSG(_mm_getcsr() == csr, "the step leaves the caller's MXCSR as it was");
        if (rc == 0) {
            const float *pv = out[0].data, *mv = out[1].data;
            int64_t bad = 0;
            for (int64_t i = 0; i < mpt_shape_numel(s); i++)
                bad += keep ? pv[i] != xv[i] : pv[i] != 0.0f;
            CHECK_MSG(bad == 0, "x * 1 over denormal x: %lld of %lld elements %s",
                      (long long)bad, (long long)mpt_shape_numel(s),
                      keep ? "not kept (MPTC_DENORMALS=keep)" : "not flushed to zero");
            /* each row sums 4096 products of a denormal with 1 */
            for (int i = 0; i < 16; i++)
                CHECK_MSG(keep ? mv[i] != 0.0f && fabsf(mv[i]) < 1e-35f : mv[i] == 0.0f,
                          "matmul of denormals [%d] = %g (keep=%d)", i, (double)mv[i], keep);
            mpt_tensor_free(&out[0]);
            mpt_tensor_free(&out[1]);
        }
        mpt_tensor_free(&in[0]);
        mpt_tensor_free(&in[1]);
        if (e) mpt_backend_cpu.free(e);
        mpt_plan_free(p);
    }
    unsetenv("MPTC_DENORMALS");
    mpt_graph_free(g);
}

/* ---- real train steps ---- */

static void train_steps(const char *path, const char *policy, int batch, int steps) {
    mpt_lower_opts lo = {.batch_size = batch, .training = 1};
    mpt_model *m = NULL;
    FILE *diag = fopen("/dev/null", "w");
    int bad = mpt_lang_load(path, &lo, &m, diag);
    fclose(diag);
    CHECK_MSG(bad == 0, "%s does not load", path);
    if (bad) return;
    char err[512], what[160];
    mpt_policy_opts po = {0};
    mpt_policy_lookup(policy, &po.global);
    mpt_graph *typed = mpt_policy_apply(m->graph, &po, err, sizeof err);
    CHECK_MSG(typed != NULL, "policy: %s", err);
    mpt_train_opts to = {.loss = m->train.loss, .opt = m->train.optimizer,
                         .loss_scale = m->train.loss_scale, .metric_accuracy = 1};
    to.loss_scale.mode = strcmp(policy, "mixed_float16") ? MPT_LS_NONE : MPT_LS_DYNAMIC;
    mpt_graph *step = typed ? mpt_train_step(typed, &to, err, sizeof err) : NULL;
    CHECK_MSG(step != NULL, "train step: %s", err);
    if (step) {
        /* loss and weights after a few steps: the GEMMs' f32 accumulation is
         * the only difference, so the accumulation tolerance of the compute
         * dtype; but Adam turns a gradient that is exactly 0 on one side and
         * rounding noise on the other into a whole learning-rate step
         * (m / sqrt(v) = +-1), so weights may differ by lr (1e-3) per step */
        mpt_dtype dt = strcmp(policy, "float32") == 0 ? MPT_DT_F32
                       : strcmp(policy, "mixed_float16") == 0 ? MPT_DT_F16 : MPT_DT_BF16;
        tol t = tol_for(TOL_ACCUM, dt, 1);
        t.atol += 1.2e-3 * steps;
        snprintf(what, sizeof what, "%s %s", path, policy);
        run_both(step, steps, t, 0, what, strcmp(policy, "mixed_float16") == 0 ? BOTH : FUSED);
    }
    mpt_graph_free(step);
    mpt_graph_free(typed);
    mpt_model_free(m);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#define TIMED(call)                                                                    \
    do {                                                                               \
        double t0_ = now();                                                            \
        call;                                                                          \
        printf("%-60s %6.2f s\n", #call, now() - t0_);                                 \
    } while (0)

int main(void) {
    char why[256];
    if (!mpt_backend_cpu.available(why, sizeof why)) {
        printf("skipped: the CPU JIT is not available here: %s\n", why);
        return 77;
    }
    TIMED(test_elementwise());
    TIMED(test_movement());
    TIMED(test_reductions());
    TIMED(test_split_reductions());
    TIMED(test_gemm());
    TIMED(test_gemm_epilogue_all_finite());
    TIMED(test_conv_and_opaque());
    TIMED(test_updates_and_profile());
    TIMED(test_denormals());
    TIMED(train_steps("examples/mlp_small.mpt", "float32", 16, 3));
    TIMED(train_steps("examples/mlp_small.mpt", "mixed_float16", 16, 3));
    TIMED(train_steps("examples/mlp_small.mpt", "mixed_bfloat16", 16, 3));
    TIMED(train_steps("examples/convnet_small.mpt", "float32", 4, 2));
    /* batch statistics over 512 rows: split reductions, two passes (float32) */
    TIMED(train_steps("tests/models/resblock.mpt", "float32", 8, 2));
    TIMED(train_steps("tests/models/resblock.mpt", "mixed_bfloat16", 8, 2));
    return check_exit("test_cpu_backend");
}
