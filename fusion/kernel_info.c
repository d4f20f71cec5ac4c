/* fusion/kernel_info.c — facts about a plan's kernels that every backend
 * needs the same way: the layer a kernel belongs to, the bytes it moves, the
 * flops of its GEMM or convolution, and which variable updates may be
 * written over the variable itself. */
#include <string.h>

#include "fusion/fusion.h"

const char *mpt_kernel_kind_name(mpt_kernel_kind k) {
    switch (k) {
    case MPT_KERNEL_GEMM: return "gemm";
    case MPT_KERNEL_CONV: return "conv";
    case MPT_KERNEL_LOOP: return "loop";
    case MPT_KERNEL_REDUCTION: return "reduction";
    case MPT_KERNEL_OPAQUE: return "opaque";
    case MPT_KERNEL_COUNT: break;
    }
    return "?";
}

const char *mpt_kernel_layer(const mpt_graph *g, const mpt_kernel *k) {
    if (k->root >= 0 && g->nodes[k->root].layer) return g->nodes[k->root].layer;
    for (int i = 0; i < k->n_nodes; i++)
        if (g->nodes[k->nodes[i]].layer) return g->nodes[k->nodes[i]].layer;
    return "(step)";
}

static int64_t value_bytes(const mpt_node *nd) {
    return mpt_shape_numel(nd->shape) * (int64_t)mpt_dtype_size(nd->dtype);
}

int64_t mpt_kernel_bytes(const mpt_graph *g, const mpt_kernel *k) {
    int64_t b = 0;
    for (int i = 0; i < k->n_inputs; i++) {
        const mpt_node *nd = &g->nodes[k->inputs[i]];
        if (nd->op != MPT_OP_CONST) b += value_bytes(nd);
    }
    for (int i = 0; i < k->n_outputs; i++) b += value_bytes(&g->nodes[k->outputs[i]]);
    return b;
}

/* 2MNK for a matmul, times the batches for a batch_matmul. A convolution (forward or either backward pass) is
 * 2 x (output positions x output channels) x (filter taps x input channels):
 * 2 x numel(y) x numel(w) / O, with y (or dy) NHWC and O its last dim. */
double mpt_kernel_flops(const mpt_graph *g, const mpt_kernel *k) {
    if (k->root < 0) return 0;
    const mpt_node *nd = &g->nodes[k->root];
    const mpt_node *in0 = nd->n_in > 0 ? &g->nodes[nd->in[0]] : NULL;
    const mpt_node *in1 = nd->n_in > 1 ? &g->nodes[nd->in[1]] : NULL;
    const mpt_node *y = NULL, *w = NULL;
    if (nd->op == MPT_OP_MATMUL || nd->op == MPT_OP_BATCH_MATMUL) {
        int r = nd->shape.rank;
        if (!in0 || r < 2 || in0->shape.rank != r) return 0;
        double K = (double)(nd->attr.i[0] ? in0->shape.dim[r - 2] : in0->shape.dim[r - 1]);
        return 2.0 * (double)mpt_shape_numel(nd->shape) * K;
    }
    if (nd->op == MPT_OP_CONV2D) y = nd, w = in1;
    else if (nd->op == MPT_OP_CONV2D_BWD_DATA) y = in0, w = in1;
    else if (nd->op == MPT_OP_CONV2D_BWD_FILTER) y = in1, w = nd;
    if (!y || !w || y->shape.rank != 4 || y->shape.dim[3] <= 0) return 0;
    return 2.0 * (double)mpt_shape_numel(y->shape) * (double)mpt_shape_numel(w->shape) /
           (double)y->shape.dim[3];
}

int mpt_conv_is_gemm(const mpt_graph *g, int node) {
    const mpt_node *r = &g->nodes[node];
    if (r->op != MPT_OP_CONV2D && r->op != MPT_OP_CONV2D_BWD_DATA &&
        r->op != MPT_OP_CONV2D_BWD_FILTER)
        return 0;
    /* the filter [KH,KW,Ci,Co]: the gradient's own shape, else the operand */
    const mpt_shape *w = r->op == MPT_OP_CONV2D_BWD_FILTER ? &r->shape : &g->nodes[r->in[1]].shape;
    return w->dim[0] == 1 && w->dim[1] == 1 && r->attr.i[0] == 1 && r->attr.i[1] == 1 &&
           r->attr.i[2] == 0 && r->attr.i[3] == 0;
}

/* The kernel reads the variable at the very index it writes the value, so
 * every element is read before it is overwritten, however a backend splits
 * the kernel's elements over threads or blocks. */
int mpt_plan_update_in_place(const mpt_plan *p, int update) {
    const mpt_graph *g = p->g;
    const mpt_update *u = &g->updates[update];
    const mpt_node *vn = &g->nodes[u->var], *val = &g->nodes[u->value];
    if (val->op == MPT_OP_VARIABLE || val->op == MPT_OP_INPUT || val->op == MPT_OP_CONST) return 0;
    int K = p->kernel_of[u->value];
    if (K < 0 || val->dtype != vn->dtype || !mpt_shape_eq(val->shape, vn->shape)) return 0;
    mpt_kernel_kind kind = p->kernels[K].kind;
    if (kind != MPT_KERNEL_LOOP && kind != MPT_KERNEL_GEMM && kind != MPT_KERNEL_CONV) return 0;
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i].node == u->var || g->outputs[i].node == u->value) return 0;
    for (int i = 0; i < g->n_updates; i++)
        if (g->updates[i].value == u->var) return 0;
    /* kernels list the sources they read (clones of casts included); a view
     * of the variable reads its buffer as well */
    for (int k = K + 1; k < p->n_kernels; k++)
        for (int i = 0; i < p->kernels[k].n_inputs; i++)
            if (mpt_plan_storage(p, p->kernels[k].inputs[i]) == u->var) return 0;
    const mpt_kernel *kk = &p->kernels[K];
    for (int i = 0; i < kk->n_inputs; i++)
        if (kk->inputs[i] != u->var && mpt_plan_storage(p, kk->inputs[i]) == u->var) return 0;
    for (int m = 0; m < kk->n_nodes; m++) {
        const mpt_node *nd = &g->nodes[kk->nodes[m]];
        for (int q = 0; q < nd->n_in; q++)
            if (nd->in[q] == u->var && (mpt_op_table[nd->op].kind != MPT_KIND_ELEMENTWISE ||
                                        !mpt_shape_eq(nd->shape, vn->shape) || kk->nodes[m] == kk->root))
                return 0;
    }
    return 1;
}
