/* tests/test_moments.c — a batch norm's variance in the mean's read
 * (ir/moments.c).
 *
 * The training statistics as lang/lower.c builds them (mean, variance,
 * moving-mean update) are rewritten and checked:
 *   - structure: one rewrite, and the variance's sum no longer reads the
 *     mean's sum spread back over the tensor (chain depth 2 -> 1), so both
 *     sums take one read;
 *   - values in f64: rewritten and original variances agree to 1e-13
 *     relative with the moving mean (the shift) at the batch mean, and to
 *     1e-13 (1 + mean^2 / variance) with it at 0;
 *   - values in f32 against the f64 original: with the shift at the batch
 *     mean, within the sum tolerance of the CPU backend's table (rtol 2e-5);
 *     with the shift at 0 (the first step) and |mean| ~ 40 std, within that
 *     tolerance times 1 + mean^2 / variance, the growth the rewrite's
 *     comment states.
 * And what must be left alone: a variance over the last dim only (layer
 * norm), one whose mean updates no moving mean, a sum of squares about a
 * value that is not the mean. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "tests/check.h"
#include "tests/ir_check.h"

enum { N = 3, H = 4, W = 5, C = 6 };
static const int64_t AXES = 0x7; /* N, H, W */

/* outputs: var; the moving mean's update; variable 0 is the moving mean */
static mpt_graph *bn_stats(mpt_dtype dt, int with_update) {
    mpt_graph *g = mpt_graph_new("bn");
    mpt_shape s = mpt_shape_4(N, H, W, C), cs = mpt_shape_1(C);
    int x = mpt_b_input(g, "x", dt, s);
    int mm = mpt_b_variable_dt(g, "moving_mean", dt, cs, MPT_INIT_ZEROS, 0);
    int mean, xc, var = bn_moments(g, x, s, cs, dt, AXES, N * H * W, &mean, &xc);
    mpt_graph_add_output(g, "var", var);
    if (with_update) {
        int upd = mpt_b_binary(g, MPT_OP_ADD,
                               mpt_b_binary(g, MPT_OP_MUL, mm, mpt_b_const(g, dt, cs, 0.99)),
                               mpt_b_binary(g, MPT_OP_MUL, mean, mpt_b_const(g, dt, cs, 0.01)));
        mpt_graph_add_update(g, mm, upd);
    } else {
        mpt_graph_add_output(g, "mm", mm);
    }
    return g;
}

/* x with per-channel mean ~40 std; the moving mean at 0 or at x's mean */
static void run(const mpt_graph *g, int shift_at_mean, double *var, double *mean_out) {
    const mpt_node *xn = &g->nodes[mpt_graph_input_node(g, 0)];
    mpt_tensor in, mm, out[2];
    CHECK(mpt_tensor_alloc(&in, xn->dtype, xn->shape) == 0);
    CHECK(mpt_tensor_alloc(&mm, xn->dtype, mpt_shape_1(C)) == 0);
    double mean[C] = {0};
    for (int64_t i = 0; i < mpt_shape_numel(xn->shape); i++) {
        double v = 30.0 + 0.5 * (double)(i % C) + sin(0.7 * (double)i);
        mpt_tensor_set(&in, i, v);
        mean[i % C] += mpt_tensor_get(&in, i) / (N * H * W);
    }
    for (int c = 0; c < C; c++) {
        mpt_tensor_set(&mm, c, shift_at_mean ? mean[c] : 0.0);
        if (mean_out) mean_out[c] = mean[c];
    }
    char err[256];
    int rc = mpt_interp_run(g, &in, &mm, out, NULL, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    for (int c = 0; rc == 0 && c < C; c++) var[c] = mpt_tensor_get(&out[0], c);
    if (rc == 0)
        for (int k = 0; k < g->n_outputs; k++) mpt_tensor_free(&out[k]);
    mpt_tensor_free(&in);
    mpt_tensor_free(&mm);
}

static void test_rewrite(void) {
    mpt_graph *g64 = bn_stats(MPT_DT_F64, 1), *g32 = bn_stats(MPT_DT_F32, 1);
    int n64 = 0, n32 = 0;
    mpt_graph *r64 = rewrite_dce(mpt_fold_variance, g64, &n64), *r32 = rewrite_dce(mpt_fold_variance, g32, &n32);
    CHECK_MSG(n64 == 1 && n32 == 1, "rewrote %d (f64) and %d (f32), want 1", n64, n32);
    CHECK_MSG(pass_depth(g64, AXES) == 2, "original depth %d, want 2", pass_depth(g64, AXES));
    CHECK_MSG(pass_depth(r64, AXES) == 1, "rewritten depth %d, want 1", pass_depth(r64, AXES));
    for (int at_mean = 0; at_mean < 2; at_mean++) {
        double ref[C], a[C], b[C], mean[C];
        run(g64, at_mean, ref, mean);
        run(r64, at_mean, a, NULL);
        run(r32, at_mean, b, NULL);
        for (int c = 0; c < C; c++) {
            /* a sum's rounding (60 terms: ~1e-14 in f64, the table's 2e-5
             * in f32), grown by (mean - shift)^2 / variance */
            double grow = at_mean ? 1.0 : 1.0 + mean[c] * mean[c] / ref[c];
            CHECK_NEAR(a[c], ref[c], 0, 1e-13 * grow);
            CHECK_NEAR(b[c], ref[c], 0, 2e-5 * grow);
        }
    }
    mpt_graph_free(g64);
    mpt_graph_free(g32);
    mpt_graph_free(r64);
    mpt_graph_free(r32);
}

static void test_left_alone(void) {
    /* no moving mean updated from the mean */
    mpt_graph *g = bn_stats(MPT_DT_F32, 0);
    int n = -1;
    mpt_graph *f = mpt_fold_variance(g, &n);
    CHECK_MSG(n == 0, "no moving mean: rewrote %d", n);
    mpt_graph_free(f);
    mpt_graph_free(g);
    for (int which = 0; which < 2; which++) {
        g = mpt_graph_new("keep");
        mpt_shape s = mpt_shape_2(4, 3);
        int x = mpt_b_input(g, "x", MPT_DT_F32, s);
        int64_t axes = which == 0 ? 0x2 : 0x1; /* layer norm's last dim; batch axis */
        mpt_shape rs = mpt_shape_1(which == 0 ? 4 : 3);
        int64_t kept = which == 0 ? 0x1 : 0x2;
        int mm = mpt_b_variable_dt(g, "mm", MPT_DT_F32, rs, MPT_INIT_ZEROS, 0);
        int mean = mpt_b_binary(g, MPT_OP_MUL, mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, axes),
                                mpt_b_const(g, MPT_DT_F32, rs, 0.25));
        /* which 1: the squares are about the moving mean, not the mean */
        int about = which == 0 ? mean : mm;
        int sq = mpt_b_unary(g, MPT_OP_SQUARE,
                             mpt_b_binary(g, MPT_OP_SUB, x, mpt_b_broadcast(g, about, s, kept)));
        mpt_graph_add_output(g, "v", mpt_b_reduce(g, MPT_OP_REDUCE_SUM, sq, axes));
        mpt_graph_add_update(g, mm, mpt_b_binary(g, MPT_OP_ADD,
                                                 mpt_b_binary(g, MPT_OP_MUL, mm, mpt_b_const(g, MPT_DT_F32, rs, 0.9)),
                                                 mpt_b_binary(g, MPT_OP_MUL, mean, mpt_b_const(g, MPT_DT_F32, rs, 0.1))));
        f = mpt_fold_variance(g, &n);
        CHECK_MSG(n == 0, "case %d: rewrote %d", which, n);
        CHECK_MSG(f->n_nodes == g->n_nodes, "case %d: %d nodes, want %d", which, f->n_nodes, g->n_nodes);
        mpt_graph_free(f);
        mpt_graph_free(g);
    }
}

int main(void) {
    test_rewrite();
    test_left_alone();
    return check_exit("test_moments");
}
