/* tests/test_fusion_bn.c — the fusion rules a batch norm after a
 * convolution relies on: its f32 cast (mixed precision) or its bias add
 * (float32) and the centred value recomputed by every reader instead of
 * stored, and the relu gradient before its backward sums computed in the
 * convolution's epilogue. Each plan is also run fused and unfused and
 * compared bit for bit (tests/plan_check.h). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "plan_check.h"
#include "fusion/fusion.h"
#include "ir/ir.h"

/* A batch norm's statistics and normalisation of yf [2, 6, 6, 8] (relu
 * after it where asked), and one of its backward sums against dy: outputs
 * "y" and "dsum". Returns the centred value yf - mean. */
static int batch_norm_of(mpt_graph *g, int yf, int dy, mpt_shape ys, int relu) {
    int mean = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, yf, 0x7);
    int yc = mpt_b_binary(g, MPT_OP_SUB, yf, mpt_b_broadcast(g, mean, ys, 0x8));
    int var = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_unary(g, MPT_OP_SQUARE, yc), 0x7);
    int rstd = mpt_b_unary(g, MPT_OP_RSQRT, var);
    int y = mpt_b_binary(g, MPT_OP_MUL, yc, mpt_b_broadcast(g, rstd, ys, 0x8));
    mpt_graph_add_output(g, "y", relu ? mpt_b_unary(g, MPT_OP_RELU, y) : y);
    int dsum = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_binary(g, MPT_OP_MUL, yc, dy), 0x7);
    mpt_graph_add_output(g, "dsum", mpt_b_binary(g, MPT_OP_MUL, dsum, rstd));
    return yc;
}

/* A batch norm after a convolution without bias: the f32 cast of the
 * convolution's bf16 output and the centred value x - mean are recomputed
 * by each reader (the variance, the normalisation, a gradient's sum),
 * never stored in f32. */
static void test_conv_output_cast_cloned(void) {
    mpt_graph *g = mpt_graph_new("conv_bn");
    mpt_b_layer(g, "conv_1");
    mpt_shape ys = mpt_shape_4(2, 6, 6, 8);
    int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_4(2, 6, 6, 4)), MPT_DT_BF16);
    int w = mpt_b_cast(g, mpt_b_input(g, "w", MPT_DT_F32, mpt_shape_4(3, 3, 4, 8)), MPT_DT_BF16);
    int dy = mpt_b_input(g, "dy", MPT_DT_F32, ys);
    int y = mpt_b_conv2d(g, x, w, 1, 1, 1, 1, ys);
    int yf = mpt_b_cast(g, y, MPT_DT_F32);
    int yc = batch_norm_of(g, yf, dy, ys, 0);

    mpt_plan *f = fuse_with(g, 1, 0, 0), *u = fuse_with(g, 0, 0, 0);
    for (int i = 0; i < f->n_buffers; i++)
        CHECK_MSG(f->buffers[i].node != yf && f->buffers[i].node != yc,
                  "node %d (the f32 cast %d, the centred value %d) is stored",
                  f->buffers[i].node, yf, yc);
    check_plan_sound(f);
    check_bit_identical(g, f, u, 1);
    mpt_plan_free(u);
    mpt_plan_free(f);
    mpt_graph_free(g);
}

/* The float32 counterpart: a batch norm after a convolution with bias.
 * The bias add y + b and the centred value (y + b) - mean are recomputed by
 * each reader from the convolution's output, never stored; the
 * convolution writes y and computes no epilogue. */
static void test_conv_bias_add_cloned(void) {
    mpt_graph *g = mpt_graph_new("conv_bias_bn");
    mpt_b_layer(g, "conv_1");
    mpt_shape ys = mpt_shape_4(2, 6, 6, 8);
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_4(2, 6, 6, 4));
    int w = mpt_b_input(g, "w", MPT_DT_F32, mpt_shape_4(3, 3, 4, 8));
    int b = mpt_b_input(g, "b", MPT_DT_F32, mpt_shape_1(8));
    int dy = mpt_b_input(g, "dy", MPT_DT_F32, ys);
    int y = mpt_b_conv2d(g, x, w, 1, 1, 1, 1, ys);
    int yb = mpt_b_binary(g, MPT_OP_ADD, y, mpt_b_broadcast(g, b, ys, 0x8));
    int yc = batch_norm_of(g, yb, dy, ys, 1);

    mpt_plan *f = fuse_with(g, 1, 0, 0), *u = fuse_with(g, 0, 0, 0);
    for (int i = 0; i < f->n_buffers; i++)
        CHECK_MSG(f->buffers[i].node != yb && f->buffers[i].node != yc,
                  "node %d (the bias add %d, the centred value %d) is stored",
                  f->buffers[i].node, yb, yc);
    for (int k = 0; k < f->n_kernels; k++)
        if (f->kernels[k].kind == MPT_KERNEL_CONV)
            CHECK_MSG(f->kernels[k].n_nodes == 1, "the convolution's kernel holds %d nodes",
                      f->kernels[k].n_nodes);
    check_plan_sound(f);
    check_bit_identical(g, f, u, 1);
    mpt_plan_free(u);
    mpt_plan_free(f);
    mpt_graph_free(g);
}

/* A batch norm's backward after a convolution's data gradient g: the relu
 * gradient select(gt(r, 0), g, 0), read by the sums and by the data
 * gradient's loop, is computed in the convolution's epilogue, which writes
 * it instead of g; the sums read it. */
static void test_relu_grad_in_conv_epilogue(void) {
    mpt_graph *g = mpt_graph_new("bn_backward");
    mpt_b_layer(g, "conv_2");
    mpt_shape xs = mpt_shape_4(2, 6, 6, 8);
    int dy = mpt_b_input(g, "dy", MPT_DT_F32, mpt_shape_4(2, 6, 6, 4));
    int w = mpt_b_input(g, "w", MPT_DT_F32, mpt_shape_4(3, 3, 8, 4));
    int r = mpt_b_input(g, "r", MPT_DT_F32, xs);
    int xc = mpt_b_input(g, "xc", MPT_DT_F32, xs);
    int gd = mpt_b_conv2d_bwd_data(g, dy, w, 1, 1, 1, 1, xs);
    int zero = mpt_b_const(g, MPT_DT_F32, xs, 0.0);
    int d = mpt_b_select(g, mpt_b_binary(g, MPT_OP_GT, r, zero), gd, zero);
    int s1 = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, d, 0x7);
    int s2 = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_binary(g, MPT_OP_MUL, d, xc), 0x7);
    mpt_graph_add_output(g, "s1", s1);
    mpt_graph_add_output(g, "dx", mpt_b_binary(g, MPT_OP_MUL, mpt_b_binary(g, MPT_OP_SUB, d, xc),
                                               mpt_b_broadcast(g, s2, xs, 0x8)));

    mpt_plan *f = fuse_with(g, 1, 0, 0), *u = fuse_with(g, 0, 0, 0);
    int conv_has_d = 0;
    for (int k = 0; k < f->n_kernels; k++)
        for (int i = 0; i < f->kernels[k].n_nodes; i++)
            conv_has_d |= f->kernels[k].kind == MPT_KERNEL_CONV && f->kernels[k].nodes[i] == d;
    CHECK_MSG(conv_has_d, "the relu gradient %d is not in the convolution's kernel", d);
    for (int i = 0; i < f->n_buffers; i++)
        CHECK_MSG(f->buffers[i].node != gd, "the data gradient %d is stored", gd);
    check_plan_sound(f);
    check_bit_identical(g, f, u, 1);
    mpt_plan_free(u);
    mpt_plan_free(f);
    mpt_graph_free(g);
}

int main(void) {
    test_conv_output_cast_cloned();
    test_conv_bias_add_cloned();
    test_relu_grad_in_conv_epilogue();
    return check_exit("test_fusion_bn");
}
