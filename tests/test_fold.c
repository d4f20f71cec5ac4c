/* tests/test_fold.c — folding reductions of broadcast statistics
 * (ir/fold.c).
 *
 * A batch norm's backward, built by autodiff from the forward the lowering
 * emits, is folded and checked three ways:
 *   - structure: the longest chain of same-axes reductions reading each
 *     other's broadcast results drops from 3 (mean, variance, the mean's
 *     gradient) to 2, so a backend reads the tensor once less;
 *   - values in f64: folded and unfolded agree to 1e-10 relative to the
 *     largest gradient (the fold only reorders exact-arithmetic sums);
 *   - values in f32 against the f64 reference, both graphs, with the sum
 *     tolerance of the CPU backend's table (rtol 2e-5, atol 2e-6 per summed
 *     element of the row): the fold's sum(x) - count * mean cancels to
 *     rounding noise of order eps * |mean| / std relative to dx, and the
 *     inputs here have |mean| ~ 3 std to exercise it.
 * And what must not fold: a sum of a broadcast input (no statistic), a
 * statistic behind a nonlinear op, a statistic over the other axis. Duplicate sums merge.
 * A norm of a sum of tensors keeps sum(x) whole. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "tests/check.h"
#include "tests/ir_check.h"

enum { N = 3, H = 4, W = 5, C = 6 };
static const int64_t AXES = 0x7; /* N, H, W */

/* dx of sum(bn(x) * dy) with respect to x, as the train step builds it */
static mpt_graph *bn_backward(mpt_dtype dt) {
    mpt_graph *g = mpt_graph_new("bn");
    mpt_shape s = mpt_shape_4(N, H, W, C), cs = mpt_shape_1(C);
    int x = mpt_b_input(g, "x", dt, s);
    int dy = mpt_b_input(g, "dy", dt, s);
    int gamma = mpt_b_input(g, "gamma", dt, cs);
    int mean, xc, var = bn_moments(g, x, s, cs, dt, AXES, N * H * W, &mean, &xc);
    int rstd = mpt_b_unary(g, MPT_OP_RSQRT, mpt_b_binary(g, MPT_OP_ADD, var, mpt_b_const(g, dt, cs, 1e-3)));
    int y = mpt_b_binary(g, MPT_OP_MUL, xc, mpt_b_broadcast_to(g, mpt_b_binary(g, MPT_OP_MUL, gamma, rstd), s));
    int loss = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_binary(g, MPT_OP_MUL, y, dy), 0xf);
    int dx;
    char err[256];
    CHECK(mpt_autodiff(g, loss, -1, &x, 1, &dx, err, sizeof err) == 0);
    mpt_graph_add_output(g, "dx", dx);
    return g;
}

static double input_value(int k, int64_t i) {
    /* x: mean ~3 std per channel; dy and gamma of order 1 */
    if (k == 0) return 3.0 + sin(0.7 * (double)i) + 0.1 * (double)(i % C);
    if (k == 1) return cos(1.3 * (double)i) - 0.2;
    return 0.5 + 0.25 * (double)i;
}

static void run(const mpt_graph *g, mpt_tensor *out) {
    mpt_tensor in[3];
    for (int k = 0; k < 3; k++) {
        const mpt_node *n = &g->nodes[mpt_graph_input_node(g, k)];
        CHECK(mpt_tensor_alloc(&in[k], n->dtype, n->shape) == 0);
        for (int64_t i = 0; i < mpt_shape_numel(n->shape); i++) mpt_tensor_set(&in[k], i, input_value(k, i));
    }
    char err[256];
    int rc = mpt_interp_run(g, in, NULL, out, NULL, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    for (int k = 0; k < 3; k++) mpt_tensor_free(&in[k]);
}

static void test_batch_norm(void) {
    mpt_graph *g64 = bn_backward(MPT_DT_F64), *g32 = bn_backward(MPT_DT_F32);
    int n64 = 0, n32 = 0;
    mpt_graph *f64 = rewrite_dce(mpt_fold_reductions, g64, &n64), *f32 = rewrite_dce(mpt_fold_reductions, g32, &n32);
    CHECK_MSG(n64 == 1 && n32 == 1, "folded %d (f64) and %d (f32) reductions, want 1", n64, n32);
    CHECK_MSG(pass_depth(g64, AXES) == 3, "unfolded depth %d, want 3", pass_depth(g64, AXES));
    CHECK_MSG(pass_depth(f64, AXES) == 2, "folded depth %d, want 2", pass_depth(f64, AXES));
    int sums = 0;
    for (int i = 0; i < f64->n_nodes; i++) sums += f64->nodes[i].op == MPT_OP_REDUCE_SUM && f64->nodes[i].attr.i[0] == AXES;
    /* sum(x), sum(xc^2), sum(dy * xc) for the scale, and sum(dy) the fold
     * adds; a constant factor (2 xc) hoisted, not summed apart */
    CHECK_MSG(sums == 4, "%d sums over the batch axes, want 4", sums);

    mpt_tensor ref[1], a[1], b[1], c[1];
    run(g64, ref);
    run(f64, a);
    run(g32, b);
    run(f32, c);
    int64_t n = mpt_shape_numel(ref[0].shape);
    double big = 0;
    for (int64_t i = 0; i < n; i++) big = fmax(big, fabs(mpt_tensor_get(&ref[0], i)));
    CHECK(big > 0.1);
    double atol = 2e-6 * (N * H * W), rtol = 2e-5;
    for (int64_t i = 0; i < n; i++) {
        double r = mpt_tensor_get(&ref[0], i);
        CHECK_NEAR(mpt_tensor_get(&a[0], i), r, 1e-10 * big, 0);
        CHECK_NEAR(mpt_tensor_get(&b[0], i), r, atol, rtol);
        CHECK_NEAR(mpt_tensor_get(&c[0], i), r, atol, rtol);
    }
    mpt_tensor_free(&ref[0]);
    mpt_tensor_free(&a[0]);
    mpt_tensor_free(&b[0]);
    mpt_tensor_free(&c[0]);
    mpt_graph_free(g64);
    mpt_graph_free(g32);
    mpt_graph_free(f64);
    mpt_graph_free(f32);
}

/* graphs that must come out with nothing folded */
static void test_left_alone(void) {
    mpt_shape s = mpt_shape_2(4, 3), rs = mpt_shape_1(4);
    for (int which = 0; which < 3; which++) {
        mpt_graph *g = mpt_graph_new("keep");
        int x = mpt_b_input(g, "x", MPT_DT_F32, s);
        int v = mpt_b_input(g, "v", MPT_DT_F32, rs);
        int stat = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, 0x2);
        int body;
        if (which == 0) /* a broadcast input, no statistic */
            body = mpt_b_binary(g, MPT_OP_MUL, x, mpt_b_broadcast(g, v, s, 0x1));
        else if (which == 1) /* the statistic behind exp */
            body = mpt_b_unary(g, MPT_OP_EXP, mpt_b_binary(g, MPT_OP_SUB, x, mpt_b_broadcast(g, stat, s, 0x1)));
        else /* a statistic of the other axis: not constant along the rows */
            body = mpt_b_binary(g, MPT_OP_MUL, x,
                                mpt_b_broadcast(g, mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, 0x1), s, 0x2));
        mpt_graph_add_output(g, "r", mpt_b_reduce(g, MPT_OP_REDUCE_SUM, body, 0x2));
        mpt_graph_add_output(g, "stat", stat);
        int nf = -1;
        mpt_graph *f = mpt_fold_reductions(g, &nf);
        CHECK_MSG(nf == 0, "case %d: folded %d", which, nf);
        CHECK_MSG(f->n_nodes == g->n_nodes, "case %d: %d nodes, want %d", which, f->n_nodes, g->n_nodes);
        mpt_graph_free(f);
        mpt_graph_free(g);
    }
}

/* A norm whose input is a sum of tensors (a transformer's residual
 * stream): sum(x) stays one sum, not the sums of x's summands (each a
 * tensor more to read), and the folded gradient equals the unfolded one. */
static void test_summed_input(void) {
    mpt_graph *g = mpt_graph_new("bn_sum");
    mpt_shape s = mpt_shape_4(N, H, W, C), cs = mpt_shape_1(C);
    int a = mpt_b_input(g, "a", MPT_DT_F64, s), b = mpt_b_input(g, "b", MPT_DT_F64, s);
    int c = mpt_b_input(g, "c", MPT_DT_F64, s), dy = mpt_b_input(g, "dy", MPT_DT_F64, s);
    int x = mpt_b_binary(g, MPT_OP_ADD, mpt_b_binary(g, MPT_OP_ADD, a, b), c);
    int mean, xc, var = bn_moments(g, x, s, cs, MPT_DT_F64, AXES, N * H * W, &mean, &xc);
    int rstd = mpt_b_unary(g, MPT_OP_RSQRT, mpt_b_binary(g, MPT_OP_ADD, var, mpt_b_const(g, MPT_DT_F64, cs, 1e-3)));
    int y = mpt_b_binary(g, MPT_OP_MUL, xc, mpt_b_broadcast_to(g, rstd, s));
    int loss = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_binary(g, MPT_OP_MUL, y, dy), 0xf);
    int wrt[3] = {a, b, c}, d[3];
    char err[256];
    CHECK(mpt_autodiff(g, loss, -1, wrt, 3, d, err, sizeof err) == 0);
    mpt_graph_add_output(g, "da", d[0]);
    int nf = 0;
    mpt_graph *f = rewrite_dce(mpt_fold_reductions, g, &nf);
    CHECK_MSG(nf == 1, "folded %d reductions, want 1", nf);
    for (int i = 0; i < f->n_nodes; i++) {
        const mpt_node *r = &f->nodes[i];
        int in = r->op == MPT_OP_REDUCE_SUM && r->n_in ? r->in[0] : -1;
        CHECK_MSG(in < 0 || f->nodes[in].op != MPT_OP_INPUT || in == mpt_graph_input_node(f, 3),
                  "a summand of x is summed on its own (node %d)", i);
    }
    mpt_tensor in[4], o1[1], o2[1];
    for (int k = 0; k < 4; k++) {
        CHECK(mpt_tensor_alloc(&in[k], MPT_DT_F64, s) == 0);
        for (int64_t i = 0; i < mpt_shape_numel(s); i++) mpt_tensor_set(&in[k], i, input_value(k % 2, i + 7 * k) / 3);
    }
    CHECK(mpt_interp_run(g, in, NULL, o1, NULL, err, sizeof err) == 0);
    CHECK(mpt_interp_run(f, in, NULL, o2, NULL, err, sizeof err) == 0);
    for (int64_t i = 0; i < mpt_shape_numel(s); i++)
        CHECK_NEAR(mpt_tensor_get(&o2[0], i), mpt_tensor_get(&o1[0], i), 1e-10, 1e-9);
    for (int k = 0; k < 4; k++) mpt_tensor_free(&in[k]);
    mpt_tensor_free(&o1[0]);
    mpt_tensor_free(&o2[0]);
    mpt_graph_free(f);
    mpt_graph_free(g);
}

static void test_duplicate_sums_merge(void) {
    mpt_graph *g = mpt_graph_new("dup");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(4, 3));
    int a = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, 0x1);
    int b = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, 0x1);
    int c = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, 0x2);
    mpt_graph_add_output(g, "s", mpt_b_binary(g, MPT_OP_ADD, a, b));
    mpt_graph_add_output(g, "t", c);
    mpt_graph *f = mpt_fold_reductions(g, NULL);
    int sums = 0;
    for (int i = 0; i < f->n_nodes; i++) sums += f->nodes[i].op == MPT_OP_REDUCE_SUM;
    CHECK_MSG(sums == 2, "%d reduce_sum nodes, want 2 (one per axes)", sums);
    mpt_graph_free(f);
    mpt_graph_free(g);
}

int main(void) {
    test_batch_norm();
    test_left_alone();
    test_summed_input();
    test_duplicate_sums_merge();
    return check_exit("test_fold");
}
