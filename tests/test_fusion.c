/* tests/test_fusion.c — the fusion pass and memory plan: kernel counts and
 * kinds fused vs unfused, planted refusals and their reasons, kernel names,
 * bit-identical execution of fused, unfused and unplanned graphs, and buffer
 * reuse. Ends with the real train step of examples/mlp_small.mpt. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "plan_check.h"
#include "fusion/fusion.h"
#include "ir/ir.h"
#include "lang/lang.h"

static int count_kind(const mpt_plan *p, mpt_kernel_kind k) {
    int n = 0;
    for (int i = 0; i < p->n_kernels; i++) n += p->kernels[i].kind == k;
    return n;
}

static int has_refusal(const mpt_plan *p, int producer, int consumer, const char *reason) {
    for (int i = 0; i < p->n_refusals; i++)
        if ((producer < 0 || p->refusals[i].producer == producer) &&
            (consumer < 0 || p->refusals[i].consumer == consumer) &&
            strcmp(p->refusals[i].reason, reason) == 0)
            return 1;
    return 0;
}

static int non_sources(const mpt_graph *g) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++)
        n += g->nodes[i].op != MPT_OP_INPUT && g->nodes[i].op != MPT_OP_VARIABLE &&
             g->nodes[i].op != MPT_OP_CONST;
    return n;
}

/* x@W + b, relu, cast back: one GEMM with its prologue casts and epilogue. */
static void test_dense_forward(void) {
    mpt_graph *g = mpt_graph_new("dense");
    mpt_b_layer(g, "dense_1");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(8, 16));
    int w = mpt_b_variable(g, "dense_1/kernel", mpt_shape_2(16, 4), MPT_INIT_GLOROT_UNIFORM, 16, 4, 0, 1);
    int b = mpt_b_variable(g, "dense_1/bias", mpt_shape_1(4), MPT_INIT_UNIFORM, 0, 0, 0.5, 1);
    int mm = mpt_b_matmul(g, mpt_b_cast(g, x, MPT_DT_F16), mpt_b_cast(g, w, MPT_DT_F16), 0, 0);
    int bb = mpt_b_broadcast(g, mpt_b_cast(g, b, MPT_DT_F16), mpt_shape_2(8, 4), 0x2);
    int y = mpt_b_cast(g, mpt_b_unary(g, MPT_OP_RELU, mpt_b_binary(g, MPT_OP_ADD, mm, bb)), MPT_DT_F32);
    mpt_graph_add_output(g, "y", y);

    mpt_plan *f = fuse_with(g, 1, 0, 0), *u = fuse_with(g, 0, 0, 0);
    CHECK(f->n_kernels == 1);
    CHECK(f->kernels[0].kind == MPT_KERNEL_GEMM && f->kernels[0].root == mm);
    CHECK_MSG(strcmp(f->kernels[0].name, "gemm_dense_1__bias_relu_cast_f32") == 0, "name %s",
              f->kernels[0].name);
    CHECK(f->kernel_of[x] == -1 && f->kernel_of[w] == -1 && f->kernel_of[y] == 0);
    CHECK(u->n_kernels == non_sources(g));
    CHECK(u->n_refusals == 0);
    CHECK(f->bytes_moved < u->bytes_moved);
    check_plan_sound(f);
    check_plan_sound(u);
    check_bit_identical(g, f, u, 1);

    /* without epilogues the GEMM stands alone and the refusal says why */
    mpt_plan *ne = fuse_with(g, 1, MPT_FUSE_EPILOGUE, 0);
    CHECK(ne->n_kernels == 2 && count_kind(ne, MPT_KERNEL_GEMM) == 1);
    CHECK(has_refusal(ne, mm, -1, "disabled by --fusion-disable=epilogue"));
    /* without prologues the casts of W, x and b get kernels of their own */
    mpt_plan *np = fuse_with(g, 1, MPT_FUSE_PROLOGUE, 0);
    CHECK(np->n_kernels == 4);
    CHECK(has_refusal(np, -1, mm, "disabled by --fusion-disable=prologue"));
    mpt_plan_free(np);
    mpt_plan_free(ne);
    mpt_plan_free(u);
    mpt_plan_free(f);
    mpt_graph_free(g);
}

/* Softmax cross-entropy from logits: two reduction kernels that carry the
 * elementwise work before and after them, plus the max and the mean. */
static void test_softmax_cross_entropy(void) {
    mpt_graph *g = mpt_graph_new("xent");
    mpt_b_layer(g, "loss");
    mpt_shape s = mpt_shape_2(8, 10);
    int logits = mpt_b_input(g, "logits", MPT_DT_F32, s);
    int labels = mpt_b_input(g, "labels", MPT_DT_F32, s);
    int m = mpt_b_reduce(g, MPT_OP_REDUCE_MAX, logits, 0x2);
    int z = mpt_b_binary(g, MPT_OP_SUB, logits, mpt_b_broadcast(g, m, s, 0x1));
    int e = mpt_b_unary(g, MPT_OP_EXP, z);
    int sum = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, e, 0x2);
    int ls = mpt_b_unary(g, MPT_OP_LOG, sum);
    int logp = mpt_b_binary(g, MPT_OP_SUB, z, mpt_b_broadcast(g, ls, s, 0x1));
    int per = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_binary(g, MPT_OP_MUL, logp, labels), 0x2);
    int tot = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, per, 0x1);
    int loss = mpt_b_binary(g, MPT_OP_MUL, tot, mpt_b_scalar(g, MPT_DT_F32, -1.0 / 8));
    mpt_graph_add_output(g, "loss", loss);
    mpt_graph_add_output(g, "softmax_denominator", sum);

    mpt_plan *f = fuse_with(g, 1, 0, 0), *u = fuse_with(g, 0, 0, 0);
    CHECK_MSG(f->n_kernels == 4, "%d kernels", f->n_kernels);
    CHECK(count_kind(f, MPT_KERNEL_REDUCTION) == 4);
    CHECK(u->n_kernels == non_sources(g));
    /* exp(z) and the sum share a kernel, which also writes z for logp */
    CHECK(f->kernel_of[e] == f->kernel_of[sum] && f->kernel_of[z] == f->kernel_of[sum]);
    CHECK(f->kernel_of[ls] == f->kernel_of[sum]);
    CHECK(f->kernel_of[logp] == f->kernel_of[per] && f->kernel_of[loss] == f->kernel_of[tot]);
    CHECK(has_refusal(f, per, tot, "reduction output feeds another reduction's input"));
    CHECK(has_refusal(f, ls, -1, "an index op (broadcast, transpose, gather) reads a materialised operand"));
    CHECK(has_refusal(f, z, logp, "fusing would create a cycle between kernels"));
    check_plan_sound(f);
    check_bit_identical(g, f, u, 1);
    mpt_plan *nr = fuse_with(g, 1, MPT_FUSE_REDUCTION, 0);
    CHECK(has_refusal(nr, sum, ls, "disabled by --fusion-disable=reduction"));
    CHECK(nr->n_kernels > f->n_kernels);
    mpt_plan_free(nr);
    mpt_plan_free(u);
    mpt_plan_free(f);
    mpt_graph_free(g);
}

/* Backward of a dense+relu: the relu-grad mask stays materialised for the
 * weight-gradient GEMM; the bias gradient's reduction computes and writes it. */
static void test_dense_backward(void) {
    mpt_graph *g = mpt_graph_new("dense_bwd");
    mpt_b_layer(g, "dense_1");
    mpt_shape s = mpt_shape_2(8, 4);
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(8, 16));
    int z = mpt_b_input(g, "z", MPT_DT_F32, s);
    int dy = mpt_b_input(g, "dy", MPT_DT_F32, s);
    int zero = mpt_b_broadcast(g, mpt_b_scalar(g, MPT_DT_F32, 0), s, 0);
    int dz = mpt_b_select(g, mpt_b_binary(g, MPT_OP_GT, z, zero), dy, zero);
    int dw = mpt_b_matmul(g, x, dz, 1, 0);
    int db = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, dz, 0x1);
    mpt_graph_add_output(g, "dw", dw);
    mpt_graph_add_output(g, "db", db);

    mpt_plan *f = fuse_with(g, 1, 0, 0), *u = fuse_with(g, 0, 0, 0);
    CHECK(f->n_kernels == 2);
    CHECK(count_kind(f, MPT_KERNEL_GEMM) == 1 && count_kind(f, MPT_KERNEL_REDUCTION) == 1);
    CHECK(f->kernel_of[dz] == f->kernel_of[db]);
    CHECK(has_refusal(f, dz, dw, "GEMM operand must be a materialised buffer"));
    /* the broadcast zero is recomputed, never a buffer */
    for (int i = 0; i < f->n_buffers; i++) CHECK(f->buffers[i].node != zero);
    check_plan_sound(f);
    check_bit_identical(g, f, u, 1);
    mpt_plan_free(u);
    mpt_plan_free(f);
    mpt_graph_free(g);
}

/* An LSTM-like cell: [x, h] joined, one matmul, its output split into two
 * gates. The concat is a GEMM operand, so a loop of its own; the slices
 * read the GEMM's output at their own indices, so they cannot ride in its
 * epilogue, but they and the gates' activations are one loop. Its
 * gradient (slices back into zeros-padded concats, a concat back into
 * slices) runs bit for bit fused, unfused and op by op. */
static void test_slice_concat_gates(void) {
    mpt_graph *g = mpt_graph_new("gates");
    mpt_b_layer(g, "cell");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(8, 12));
    int h = mpt_b_input(g, "h", MPT_DT_F32, mpt_shape_2(8, 4));
    int w = mpt_b_variable(g, "cell/kernel", mpt_shape_2(16, 10), MPT_INIT_GLOROT_UNIFORM, 16, 10, 0, 1);
    int xh = mpt_b_concat(g, x, h, 1);
    int z = mpt_b_matmul(g, xh, w, 0, 0);
    int i = mpt_b_slice(g, z, 1, 0, 5), c = mpt_b_slice(g, z, 1, 5, 5);
    int out = mpt_b_binary(g, MPT_OP_MUL, mpt_b_unary(g, MPT_OP_SIGMOID, i), mpt_b_unary(g, MPT_OP_TANH, c));
    mpt_graph_add_output(g, "out", out);

    mpt_plan *f = fuse_with(g, 1, 0, 0);
    CHECK_MSG(f->n_kernels == 3, "%d kernels", f->n_kernels);
    CHECK(f->kernels[f->kernel_of[xh]].kind == MPT_KERNEL_LOOP);
    CHECK(f->kernels[f->kernel_of[z]].kind == MPT_KERNEL_GEMM);
    CHECK(f->kernel_of[i] == f->kernel_of[c] && f->kernel_of[i] == f->kernel_of[out]);
    CHECK(has_refusal(f, xh, z, "GEMM operand must be a materialised buffer"));
    CHECK(has_refusal(f, z, i, "an index op (broadcast, transpose, gather) reads a materialised operand"));
    check_plan_sound(f);
    mpt_plan_free(f);

    int y = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, out, 0x3);
    int wrt[3] = {x, h, w}, grads[3];
    char err[256];
    CHECK(mpt_autodiff(g, y, -1, wrt, 3, grads, err, sizeof err) == 0);
    mpt_graph_add_output(g, "dx", grads[0]);
    mpt_graph_add_output(g, "dh", grads[1]);
    mpt_graph_add_output(g, "dw", grads[2]);
    f = fuse_with(g, 1, 0, 0);
    mpt_plan *u = fuse_with(g, 0, 0, 0);
    check_plan_sound(f);
    check_plan_sound(u);
    check_bit_identical(g, f, u, 2);
    mpt_plan_free(u);
    mpt_plan_free(f);
    mpt_graph_free(g);
}

/* The finite check of a weight gradient joins its GEMM's epilogue: only a
 * reduce_all over the rows, only when every value it reads is the
 * epilogue's (or a scalar of another kernel), and not when disabled. */
static void test_epilogue_reduce_all(void) {
    for (int variant = 0; variant < 5; variant++) {
        mpt_graph *g = mpt_graph_new("epilogue_reduce");
        mpt_b_layer(g, "dense_1");
        mpt_shape mn = mpt_shape_2(16, 4);
        int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(8, 16));
        int dy = mpt_b_input(g, "dy", MPT_DT_F32, mpt_shape_2(8, 4));
        int other = mpt_b_input(g, "other", MPT_DT_F32, mn);
        int s = mpt_b_input(g, "s", MPT_DT_F32, mpt_shape_scalar());
        int inv = mpt_b_unary(g, MPT_OP_RECIP, mpt_b_unary(g, MPT_OP_EXP, s)); /* a scalar kernel */
        int dw = mpt_b_matmul(g, x, dy, 1, 0);
        int g32 = mpt_b_binary(g, MPT_OP_MUL, dw, mpt_b_broadcast_to(g, inv, mn));
        int fin = mpt_b_unary(g, MPT_OP_IS_FINITE, g32);
        if (variant == 3) { /* a tensor another kernel computes (a column sum) */
            int col = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, other, 0x1);
            fin = mpt_b_binary(g, MPT_OP_AND, fin,
                               mpt_b_unary(g, MPT_OP_IS_FINITE, mpt_b_broadcast_to(g, col, mn)));
        }
        int red = variant == 1 ? mpt_b_reduce(g, MPT_OP_REDUCE_ALL, fin, 0x2) /* keeps the rows */
                : variant == 2 ? mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_cast(g, fin, MPT_DT_F32), 0x1)
                               : mpt_b_reduce(g, MPT_OP_REDUCE_ALL, fin, 0x1);
        mpt_graph_add_output(g, "ok", red);
        mpt_graph_add_output(g, "new_w", mpt_b_binary(g, MPT_OP_SUB, other, g32));
        unsigned off = variant == 4 ? MPT_FUSE_EPILOGUE_REDUCE : 0;
        mpt_plan *f = fuse_with(g, 1, off, 0), *u = fuse_with(g, 0, 0, 0);
        int joined = f->kernel_of[red] == f->kernel_of[dw];
        CHECK_MSG(joined == (variant == 0), "variant %d: joined %d", variant, joined);
        if (variant == 0) {
            CHECK(f->kernels[f->kernel_of[dw]].kind == MPT_KERNEL_GEMM);
            CHECK(f->kernel_of[inv] != f->kernel_of[dw]);
            /* g32 is computed in the epilogue and never written out */
            for (int i = 0; i < f->n_buffers; i++) CHECK(f->buffers[i].node != g32);
            CHECK(!has_refusal(f, g32, fin, "producer has consumers in different kernels"));
        }
        if (variant == 4)
            CHECK(has_refusal(f, g32, fin, "producer has consumers in different kernels"));
        check_plan_sound(f);
        check_bit_identical(g, f, u, 1);
        mpt_plan_free(u);
        mpt_plan_free(f);
        mpt_graph_free(g);
    }
    unsigned bits = 0;
    char err[256];
    CHECK(mpt_fusion_parse_disable("epilogue_reduce", &bits, err, sizeof err) == 0 &&
          bits == MPT_FUSE_EPILOGUE_REDUCE);
}

/* Planted refusals: siblings, a reduction into a GEMM, the size cap. */
static void test_refusals(void) {
    mpt_graph *g = mpt_graph_new("planted");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(4, 8));
    int p = mpt_b_unary(g, MPT_OP_EXP, x);
    int c1 = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, p, 0x2);
    int c2 = mpt_b_unary(g, MPT_OP_LOG, p);
    mpt_graph_add_output(g, "a", c1);
    mpt_graph_add_output(g, "b", c2);
    int t = mpt_b_input(g, "t", MPT_DT_F32, mpt_shape_make(3, (int64_t[]){3, 4, 8}));
    int r = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, t, 0x1);
    int w = mpt_b_variable(g, "w", mpt_shape_2(8, 2), MPT_INIT_GLOROT_UNIFORM, 8, 2, 0, 1);
    int mm = mpt_b_matmul(g, r, w, 0, 0);
    mpt_graph_add_output(g, "mm", mm);
    int chain = x;
    for (int i = 0; i < 10; i++) chain = mpt_b_unary(g, i % 2 ? MPT_OP_TANH : MPT_OP_SQUARE, chain);
    mpt_graph_add_output(g, "chain", chain);

    mpt_plan *f = fuse_with(g, 1, 0, 4), *u = fuse_with(g, 0, 0, 0);
    CHECK(has_refusal(f, p, c1, "producer has consumers in different kernels"));
    CHECK(f->kernel_of[p] == f->kernel_of[c2] && f->kernel_of[c1] != f->kernel_of[c2]);
    CHECK(has_refusal(f, r, mm, "reduction output feeds a GEMM operand"));
    CHECK(has_refusal(f, -1, chain, "kernel size cap reached") ||
          has_refusal(f, -1, -1, "kernel size cap reached"));
    for (int k = 0; k < f->n_kernels; k++) CHECK(f->kernels[k].n_nodes <= 4);
    /* ten unary ops under a cap of four: three kernels (the last two ops
     * share theirs with exp and log, a small independent loop of the same
     * size: horizontal fusion) */
    int chain_kernels = 0;
    for (int k = 0; k < f->n_kernels; k++) {
        int has_chain = 0;
        for (int i = 0; i < f->kernels[k].n_nodes; i++) {
            mpt_op op = g->nodes[f->kernels[k].nodes[i]].op;
            has_chain |= op == MPT_OP_SQUARE || op == MPT_OP_TANH;
        }
        chain_kernels += f->kernels[k].kind == MPT_KERNEL_LOOP && has_chain;
    }
    CHECK_MSG(chain_kernels == 3, "%d kernels hold the chain", chain_kernels);
    check_plan_sound(f);
    check_bit_identical(g, f, u, 1);

    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    mpt_plan_print(f, mem, 1);
    fclose(mem);
    CHECK(strstr(text, "producer has consumers in different kernels") != NULL);
    CHECK(strstr(text, "reduction output feeds a GEMM operand") != NULL);
    CHECK(strstr(text, "gemm") != NULL);
    free(text);
    mpt_plan_free(u);
    mpt_plan_free(f);
    mpt_graph_free(g);
}

/* Batch-norm statistics of a gradient: sum(dy) and sum(dy * x) are two
 * reductions of the same input over the same axes, independent of each
 * other: one multi-output reduction kernel reads dy once. A reduction over
 * other axes, or one that needs the first's result (the centred variance),
 * stays apart. */
static void test_sibling_reductions(void) {
    mpt_graph *g = mpt_graph_new("bn_grad");
    mpt_b_layer(g, "bn");
    mpt_shape s = mpt_shape_2(64, 16);
    int dy = mpt_b_input(g, "dy", MPT_DT_F32, s);
    int x = mpt_b_input(g, "x", MPT_DT_F32, s);
    int sum_dy = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, dy, 0x1);
    int sum_dyx = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_binary(g, MPT_OP_MUL, dy, x), 0x1);
    int rows = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, dy, 0x2);
    int mean = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, 0x1);
    int centred = mpt_b_binary(g, MPT_OP_SUB, x, mpt_b_broadcast(g, mean, s, 0x2));
    int var = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_unary(g, MPT_OP_SQUARE, centred), 0x1);
    mpt_graph_add_output(g, "sum_dy", sum_dy);
    mpt_graph_add_output(g, "sum_dyx", sum_dyx);
    mpt_graph_add_output(g, "rows", rows);
    mpt_graph_add_output(g, "var", var);

    mpt_plan *f = fuse_with(g, 1, 0, 0), *u = fuse_with(g, 0, 0, 0);
    CHECK(f->kernel_of[sum_dy] == f->kernel_of[sum_dyx]);
    CHECK(f->kernel_of[rows] != f->kernel_of[sum_dy]);
    CHECK(f->kernel_of[var] != f->kernel_of[mean]);
    const mpt_kernel *K = &f->kernels[f->kernel_of[sum_dy]];
    CHECK(K->kind == MPT_KERNEL_REDUCTION && K->n_outputs >= 2);
    check_plan_sound(f);
    check_bit_identical(g, f, u, 1);
    mpt_plan *nm = fuse_with(g, 1, MPT_FUSE_MULTI_OUTPUT, 0);
    CHECK(nm->kernel_of[sum_dy] != nm->kernel_of[sum_dyx]);
    CHECK(nm->n_kernels > f->n_kernels);
    mpt_plan_free(nm);
    mpt_plan_free(u);
    mpt_plan_free(f);
    mpt_graph_free(g);
}

/* The mixed_float16 train step (dynamic loss scale) of a model file at
 * batch 8: the step, its typed forward graph and the model to free after,
 * or NULL (said) where the file does not load. */
static mpt_graph *train_step_of(const char *path, mpt_graph **typed, mpt_model **m) {
    mpt_lower_opts lo = {.batch_size = 8, .training = 1};
    *m = NULL;
    *typed = NULL;
    FILE *diag = fopen("/dev/null", "w");
    int rc = mpt_lang_load(path, &lo, m, diag);
    fclose(diag);
    CHECK_MSG(rc == 0, "%s does not load", path);
    if (rc) return NULL;
    char err[512];
    mpt_policy_opts po = {0};
    mpt_policy_lookup("mixed_float16", &po.global);
    *typed = mpt_policy_apply((*m)->graph, &po, err, sizeof err);
    CHECK_MSG(*typed != NULL, "policy: %s", err);
    mpt_train_opts to = {.loss = (*m)->train.loss, .opt = (*m)->train.optimizer,
                         .loss_scale = (*m)->train.loss_scale, .metrics = {.accuracy = 1}};
    to.loss_scale.mode = MPT_LS_DYNAMIC;
    mpt_graph *step = *typed ? mpt_train_step(*typed, &to, err, sizeof err) : NULL;
    CHECK_MSG(step != NULL, "train step: %s", err);
    return step;
}

/* Reduction kernels with row-sized work that reads one of the kernel's
 * own reductions (through any path inside the kernel). */
static int chained_kernels(const mpt_plan *p) {
    const mpt_graph *g = p->g;
    int n = 0;
    char *after = calloc((size_t)g->n_nodes + 1, 1); /* depends on an in-kernel reduction */
    for (int k = 0; k < p->n_kernels; k++) {
        const mpt_kernel *K = &p->kernels[k];
        if (K->kind != MPT_KERNEL_REDUCTION) continue;
        int64_t rows = mpt_shape_numel(g->nodes[g->nodes[K->root].in[0]].shape), bad = 0;
        for (int i = 0; i < K->n_nodes; i++) after[K->nodes[i]] = 0;
        for (int i = 0; i < K->n_nodes; i++) {
            const mpt_node *nd = &g->nodes[K->nodes[i]];
            for (int j = 0; j < nd->n_in; j++)
                for (int m = 0; m < K->n_nodes; m++)
                    if (K->nodes[m] == nd->in[j]) {
                        mpt_op op = g->nodes[nd->in[j]].op;
                        after[K->nodes[i]] |= after[nd->in[j]] || op == MPT_OP_REDUCE_SUM ||
                                              op == MPT_OP_REDUCE_MAX || op == MPT_OP_REDUCE_ALL;
                    }
            bad |= after[K->nodes[i]] && mpt_shape_numel(nd->shape) == rows;
        }
        n += bad > 0;
    }
    free(after);
    return n;
}

/* Convolutions with relu before batch norm: the batch norm's gradient dx
 * reads sum(dy) and sum(dy*xhat) at every element, and the bias gradient
 * of the convolution before it reduces relu's mask of dx again. One kernel
 * by default (a CPU thread runs it well); with reduction_chain disabled
 * (CUDA) and 2048 rows a channel, passes that each reduce or write rows
 * without reading their own results, which recompute row-sized values
 * rather than write them. Both plans run bit for bit as the interpreter. */
static void test_reduction_chain_split(void) {
    mpt_graph *typed;
    mpt_model *m;
    mpt_graph *step = train_step_of("tests/models/relu_bn.mpt", &typed, &m);
    if (step) {
        mpt_plan *one = fuse_with(step, 1, 0, 0), *u = fuse_with(step, 0, 0, 0);
        mpt_plan *cut = fuse_with(step, 1, MPT_FUSE_REDUCTION_CHAIN, 0);
        int cuts = 0;
        for (int i = 0; i < cut->n_refusals; i++)
            cuts += strstr(cut->refusals[i].reason, "cut into passes") != NULL;
        printf("relu_bn mixed_float16: %d chained reduction kernels, %d after the cut "
               "(%d kernels -> %d, %d edges cut)\n", chained_kernels(one), chained_kernels(cut),
               one->n_kernels, cut->n_kernels, cuts);
        CHECK(chained_kernels(one) >= 1);
        CHECK(chained_kernels(cut) == 0);
        CHECK(cut->n_kernels == one->n_kernels + chained_kernels(one));
        CHECK(cuts >= 1);
        /* row-sized values are recomputed, not written: no more bytes
         * written than the one-kernel plan's, beyond the small results */
        CHECK(cut->peak_bytes <= one->peak_bytes + 4096);
        check_plan_sound(cut);
        check_bit_identical(step, cut, u, 2);
        mpt_plan_free(cut);
        mpt_plan_free(u);
        mpt_plan_free(one);
        /* where 20480 rows a result are the least cut, 2048 stay one kernel */
        setenv("MPTC_FUSION_CHAIN_ROWS", "20480", 1);
        one = fuse_with(step, 1, 0, 0);
        cut = fuse_with(step, 1, MPT_FUSE_REDUCTION_CHAIN, 0);
        CHECK(cut->n_kernels == one->n_kernels && chained_kernels(cut) == chained_kernels(one));
        unsetenv("MPTC_FUSION_CHAIN_ROWS");
        mpt_plan_free(cut);
        mpt_plan_free(one);
    }
    mpt_graph_free(step);
    mpt_graph_free(typed);
    mpt_model_free(m);
}

/* The f16 copy of a weight read by the forward GEMM and the backward data
 * GEMM is written once by a loop kernel; a cast read by one GEMM stays a
 * prologue. bytes_moved counts a prologue as the backends run it, so the
 * materialised copy moves fewer bytes than two prologues. */
static void test_weight_cast_materialised(void) {
    mpt_graph *g = mpt_graph_new("fwd_bwd");
    mpt_b_layer(g, "dense_1");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(8, 32));
    int dy = mpt_b_input(g, "dy", MPT_DT_F16, mpt_shape_2(8, 16));
    int w = mpt_b_variable(g, "dense_1/kernel", mpt_shape_2(32, 16), MPT_INIT_GLOROT_UNIFORM, 32, 16, 0, 1);
    int w16 = mpt_b_cast(g, w, MPT_DT_F16);
    int x16 = mpt_b_cast(g, x, MPT_DT_F16);
    int y = mpt_b_matmul(g, x16, w16, 0, 0);
    int dx = mpt_b_matmul(g, dy, w16, 0, 1);
    mpt_graph_add_output(g, "y", y);
    mpt_graph_add_output(g, "dx", dx);

    mpt_plan *f = fuse_with(g, 1, 0, 0), *u = fuse_with(g, 0, 0, 0);
    CHECK(f->n_kernels == 3 && count_kind(f, MPT_KERNEL_LOOP) == 1);
    CHECK(f->kernel_of[w16] >= 0 && f->kernels[f->kernel_of[w16]].kind == MPT_KERNEL_LOOP);
    CHECK(f->kernel_of[x16] == f->kernel_of[y]); /* one reader: a prologue */
    CHECK(has_refusal(f, w16, dx, "prologue cast is also read by other kernels"));
    /* w read in f32 (4 B), cast written (2 B), read by both GEMMs (2 B each);
     * x through y's prologue: read, converted, read */
    int64_t want = 32 * 16 * (4 + 2 + 2 + 2) + 8 * 32 * (4 + 2 + 2) + 8 * 16 * 2 /* y */ +
                   8 * 16 * 2 /* dy */ + 8 * 32 * 2 /* dx */;
    CHECK_MSG(f->bytes_moved == want, "bytes moved %lld, want %lld", (long long)f->bytes_moved,
              (long long)want);
    check_plan_sound(f);
    check_bit_identical(g, f, u, 1);
    mpt_plan_free(u);
    mpt_plan_free(f);
    mpt_graph_free(g);
}

/* Horizontal fusion: small independent loops of one size share a kernel;
 * clones do not count against the size cap, so a broadcast is never
 * materialised because a kernel is full. The --explain summary counts
 * kernels by kind and refusals by reason. */
static void test_horizontal_and_summary(void) {
    mpt_graph *g = mpt_graph_new("updates");
    mpt_b_layer(g, "optimizer");
    int outs[3];
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "v%d", i);
        int v = mpt_b_variable(g, name, mpt_shape_1(16), MPT_INIT_UNIFORM, 0, 0, 1, 1);
        name[0] = 'g';
        int gr = mpt_b_input(g, name, MPT_DT_F32, mpt_shape_1(16));
        int lr = mpt_b_broadcast(g, mpt_b_scalar(g, MPT_DT_F32, 0.1), mpt_shape_1(16), 0);
        outs[i] = mpt_b_binary(g, MPT_OP_SUB, v, mpt_b_binary(g, MPT_OP_MUL, mpt_b_unary(g, MPT_OP_EXP, gr), lr));
        mpt_graph_add_update(g, v, outs[i]);
    }
    mpt_plan *f = fuse_with(g, 1, 0, 0), *u = fuse_with(g, 0, 0, 0);
    CHECK_MSG(f->n_kernels == 1 && f->kernels[0].n_outputs == 3, "%d kernels", f->n_kernels);
    /* a cap of 6 ops: two updates (exp, mul, sub) per kernel, and the
     * broadcasts ride along uncounted */
    mpt_plan *c = fuse_with(g, 1, 0, 6);
    CHECK_MSG(c->n_kernels == 2, "%d kernels", c->n_kernels);
    for (int i = 0; i < c->n_buffers; i++)
        CHECK(g->nodes[c->buffers[i].node].op != MPT_OP_BROADCAST);
    check_plan_sound(f);
    check_plan_sound(c);
    check_bit_identical(g, f, u, 2);
    check_bit_identical(g, c, u, 1);

    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    mpt_plan_print(u, mem, 1);
    fclose(mem);
    CHECK(strstr(text, "\nsummary: kernels 0 gemm, 0 conv, 12 loop, 0 reduce, 0 opaque; refusals none\n"));
    free(text);
    mpt_plan *ne = fuse_with(g, 1, MPT_FUSE_LOOP, 0);
    mem = open_memstream(&text, &len);
    mpt_plan_print(ne, mem, 1);
    fclose(mem);
    CHECK_MSG(strstr(text, "; refusals 9 \"disabled by --fusion-disable=loop\"\n"), "%s", text);
    free(text);
    mpt_plan_free(ne);
    mpt_plan_free(c);
    mpt_plan_free(u);
    mpt_plan_free(f);
    mpt_graph_free(g);
}

/* SGD with momentum in the IR text form: the weight and its slot are
 * written by one loop kernel (multi-output). */
static const char *sgd_text =
    "graph sgd {\n"
    "  %0 = variable \"w\" {init=5, trainable=1, f=1} : f32[16,4] @dense_1\n"
    "  %1 = variable \"w/momentum\" {init=0} : f32[16,4] @optimizer\n"
    "  %2 = input \"g\" : f32[16,4]\n"
    "  %3 = const {f=0.9} : f32[]\n"
    "  %4 = broadcast(%3) {dims=0} : f32[16,4] @optimizer\n"
    "  %5 = mul(%1, %4) : f32[16,4] @optimizer\n"
    "  %6 = add(%5, %2) : f32[16,4] @optimizer\n"
    "  %7 = const {f=0.01} : f32[]\n"
    "  %8 = broadcast(%7) {dims=0} : f32[16,4] @optimizer\n"
    "  %9 = mul(%6, %8) : f32[16,4] @optimizer\n"
    "  %10 = sub(%0, %9) : f32[16,4] @optimizer\n"
    "  %11 = cast(%10) : f16[16,4] @optimizer\n"
    "  output \"w16\" = %11\n"
    "  update %0 = %10\n"
    "  update %1 = %6\n"
    "}\n";

static void test_sgd_multi_output(void) {
    char err[256];
    mpt_graph *g = mpt_graph_parse(sgd_text, err, sizeof err);
    CHECK_MSG(g != NULL, "parse: %s", err);
    if (!g) return;
    CHECK(mpt_graph_verify(g, err, sizeof err) == NULL);
    mpt_plan *f = fuse_with(g, 1, 0, 0), *u = fuse_with(g, 0, 0, 0);
    CHECK(f->n_kernels == 1 && f->kernels[0].kind == MPT_KERNEL_LOOP);
    CHECK(f->kernels[0].n_outputs == 3);
    CHECK(u->n_kernels == 7);
    check_plan_sound(f);
    check_bit_identical(g, f, u, 2);
    mpt_plan *nm = fuse_with(g, 1, MPT_FUSE_MULTI_OUTPUT, 0);
    CHECK(nm->n_kernels == 3);
    CHECK(has_refusal(nm, 6, 9, "disabled by --fusion-disable=multi_output"));
    mpt_plan_free(nm);
    mpt_plan_free(u);
    mpt_plan_free(f);
    mpt_graph_free(g);
}

/* An unfused chain: each temporary dies after its reader, so the arena
 * reuses its space and the peak stays below the sum of the buffers. */
static void test_memory_reuse(void) {
    mpt_graph *g = mpt_graph_new("chain");
    int v = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(64, 64));
    for (int i = 0; i < 8; i++) v = mpt_b_unary(g, MPT_OP_SIGMOID, v);
    mpt_graph_add_output(g, "y", v);
    mpt_plan *u = fuse_with(g, 0, 0, 0), *f = fuse_with(g, 1, 0, 0);
    int64_t sum0 = 0;
    for (int i = 0; i < u->n_buffers; i++)
        if (u->buffers[i].arena == 0) sum0 += u->buffers[i].bytes;
    CHECK(u->n_kernels == 8 && f->n_kernels == 1);
    CHECK(sum0 == 8 * 64 * 64 * 4);
    CHECK_MSG(u->peak_bytes == 2 * 64 * 64 * 4, "peak %lld", (long long)u->peak_bytes);
    CHECK(f->peak_bytes == 64 * 64 * 4);
    CHECK(f->bytes_moved == 2 * 64 * 64 * 4 && u->bytes_moved == 8 * f->bytes_moved);
    check_plan_sound(u);
    mpt_memory_breakdown mb;
    mpt_plan_memory(u, &mb);
    CHECK(mb.activations == u->peak_bytes && mb.inputs == 64 * 64 * 4 && mb.weights == 0);
    CHECK(mb.total == mb.activations + mb.inputs);
    unsigned bits = 0;
    char err[128];
    CHECK(mpt_fusion_parse_disable("epilogue,multi_output", &bits, err, sizeof err) == 0);
    CHECK(bits == (MPT_FUSE_EPILOGUE | MPT_FUSE_MULTI_OUTPUT));
    CHECK(mpt_fusion_parse_disable("epilogue,bogus", &bits, err, sizeof err) == -1);
    CHECK(strstr(err, "bogus") != NULL);
    mpt_plan_free(f);
    mpt_plan_free(u);
    mpt_graph_free(g);
}

/* The real train step of examples/mlp_small.mpt under mixed_float16. */
static void test_mlp_small_train_step(void) {
    mpt_graph *typed;
    mpt_model *m;
    mpt_graph *step = train_step_of("examples/mlp_small.mpt", &typed, &m);
    if (step) {
        mpt_plan *f = fuse_with(step, 1, 0, 0), *u = fuse_with(step, 0, 0, 0);
        printf("mlp_small train step: %d nodes, %d kernels fused, %d unfused, %d refusals\n",
               step->n_nodes, f->n_kernels, u->n_kernels, f->n_refusals);
        CHECK(f->n_kernels * 2 < u->n_kernels);
        CHECK(f->bytes_moved < u->bytes_moved);
        CHECK(count_kind(f, MPT_KERNEL_GEMM) == count_kind(u, MPT_KERNEL_GEMM));
        int bias_relu = 0;
        for (int k = 0; k < f->n_kernels; k++)
            bias_relu += f->kernels[k].kind == MPT_KERNEL_GEMM && strstr(f->kernels[k].name, "bias_relu");
        CHECK(bias_relu >= 2);
        check_plan_sound(f);
        check_plan_sound(u);
        check_bit_identical(step, f, u, 2);
        if (getenv("MPT_TEST_VERBOSE")) mpt_plan_print(f, stdout, 1);
        mpt_plan_free(u);
        mpt_plan_free(f);
    }
    mpt_graph_free(step);
    mpt_graph_free(typed);
    mpt_model_free(m);
}

int main(void) {
    test_dense_forward();
    test_softmax_cross_entropy();
    test_dense_backward();
    test_slice_concat_gates();
    test_refusals();
    test_epilogue_reduce_all();
    test_sibling_reductions();
    test_reduction_chain_split();
    test_weight_cast_materialised();
    test_horizontal_and_summary();
    test_sgd_multi_output();
    test_memory_reuse();
    test_mlp_small_train_step();
    return check_exit("test_fusion");
}
