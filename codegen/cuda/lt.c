/* codegen/cuda/lt.c — which GEMM kernels cuBLASLt can run, and with which
 * epilogue.
 *
 * The matcher reads the kernel's epilogue as a chain from the matmul:
 *   [add(broadcast(bias[N]))] [relu] [cast]
 * and accepts it only when every epilogue node is part of the chain and
 * nothing between is read outside the kernel. Anything else gets a reason
 * and a generated kernel. gelu is never matched: cuBLASLt's GELU, GELU_AUX
 * and DGELU epilogues compute the tanh approximation (PyTorch sends only
 * gelu(approximate="tanh") to them), while mptc's gelu and gelu_grad are
 * the exact erf forms, up to 4e-4 apart, as the interpreter and the CPU
 * backend compute them. BGRADA/BGRADB (bias gradients) are reductions, which fusion keeps
 * out of GEMM kernels, and DRELU needs the forward pass's RELU_AUX bit mask,
 * which the graph does not carry: neither is matched.
 *
 * A batch_matmul (attention's Q K^T and P V where the fused attention does
 * not apply) is a kernel of its own with no epilogue (fusion keeps it
 * alone), so it maps onto a DEFAULT call, batched: its operands and result
 * are contiguous [batches, rows, cols] buffers. The op does not broadcast
 * (ir/infer.c requires equal batch dims), so every stride is a whole
 * matrix. With f32_out, D is f32 from f16/bf16 operands, as cuBLASLt takes.
 */
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cuda.h"

const char *mpt_lt_epilogue_name(mpt_lt_epilogue e) {
    switch (e) {
    case MPT_LT_EPI_DEFAULT: return "DEFAULT";
    case MPT_LT_EPI_RELU: return "RELU";
    case MPT_LT_EPI_RELU_AUX: return "RELU_AUX";
    case MPT_LT_EPI_BIAS: return "BIAS";
    case MPT_LT_EPI_RELU_BIAS: return "RELU_BIAS";
    case MPT_LT_EPI_RELU_AUX_BIAS: return "RELU_AUX_BIAS";
    case MPT_LT_EPI_DRELU: return "DRELU";
    case MPT_LT_EPI_DRELU_BGRAD: return "DRELU_BGRAD";
    case MPT_LT_EPI_GELU: return "GELU";
    case MPT_LT_EPI_GELU_AUX: return "GELU_AUX";
    case MPT_LT_EPI_GELU_BIAS: return "GELU_BIAS";
    case MPT_LT_EPI_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case MPT_LT_EPI_DGELU: return "DGELU";
    case MPT_LT_EPI_DGELU_BGRAD: return "DGELU_BGRAD";
    case MPT_LT_EPI_BGRADA: return "BGRADA";
    case MPT_LT_EPI_BGRADB: return "BGRADB";
    }
    return "?";
}

static int in_kernel(const mpt_kernel *k, int id) {
    for (int i = 0; i < k->n_nodes; i++)
        if (k->nodes[i] == id) return 1;
    return 0;
}

static int is_output(const mpt_kernel *k, int id) {
    for (int i = 0; i < k->n_outputs; i++)
        if (k->outputs[i] == id) return 1;
    return 0;
}

/* The first node of k that reads `id`, or -1. */
static int consumer(const mpt_graph *g, const mpt_kernel *k, int id) {
    for (int i = 0; i < k->n_nodes; i++) {
        const mpt_node *nd = &g->nodes[k->nodes[i]];
        for (int j = 0; j < nd->n_in; j++)
            if (nd->in[j] == id) return k->nodes[i];
    }
    return -1;
}

/* The GEMM root r computes, row-major: a matmul as it is; a 1x1 stride-1
 * unpadded convolution in NHWC as one over the N*H*W pixels:
 *   forward         y[P,Co]  = x[P,Ci]    w[Ci,Co]
 *   data gradient   dx[P,Ci] = dy[P,Co]   w[Ci,Co]^T
 *   filter gradient dw[Ci,Co] = x[P,Ci]^T dy[P,Co]
 * Fills c's operands, sizes and transposes; NULL, or why not. */
static const char *gemm_of(const mpt_graph *g, const mpt_node *r, mpt_lt_call *c) {
    c->a = r->in[0];
    c->b = r->in[1];
    if (r->op == MPT_OP_MATMUL) {
        c->trans_a = (int)r->attr.i[0];
        c->trans_b = (int)r->attr.i[1];
        c->m = r->shape.dim[0];
        c->n = r->shape.dim[1];
        c->k = c->trans_a ? g->nodes[c->a].shape.dim[0] : g->nodes[c->a].shape.dim[1];
        return NULL;
    }
    if (r->op != MPT_OP_CONV2D && r->op != MPT_OP_CONV2D_BWD_DATA &&
        r->op != MPT_OP_CONV2D_BWD_FILTER)
        return "root is not a matmul or a convolution";
    if (!mpt_conv_is_gemm(g, (int)(r - g->nodes)))
        return "a convolution other than 1x1, stride 1, unpadded is not a GEMM";
    /* the filter [KH,KW,Ci,Co] and the image side [N,H,W,C] */
    const mpt_shape *w = r->op == MPT_OP_CONV2D_BWD_FILTER ? &r->shape : &g->nodes[c->b].shape;
    const mpt_shape *img = &g->nodes[c->a].shape;
    int64_t pixels = img->dim[0] * img->dim[1] * img->dim[2], ci = w->dim[2], co = w->dim[3];
    c->trans_a = r->op == MPT_OP_CONV2D_BWD_FILTER;
    c->trans_b = r->op == MPT_OP_CONV2D_BWD_DATA;
    c->m = r->op == MPT_OP_CONV2D_BWD_FILTER ? ci : pixels;
    c->n = r->op == MPT_OP_CONV2D_BWD_DATA ? ci : co;
    c->k = r->op == MPT_OP_CONV2D ? ci : r->op == MPT_OP_CONV2D_BWD_DATA ? co : pixels;
    return NULL;
}

int mpt_cuda_lt_candidate(const mpt_graph *g, const mpt_kernel *k) {
    return k->kind == MPT_KERNEL_GEMM || k->kind == MPT_KERNEL_CONV ||
           (k->kind == MPT_KERNEL_OPAQUE && k->root >= 0 &&
            g->nodes[k->root].op == MPT_OP_BATCH_MATMUL);
}

/* The batch_matmul kernel k as one strided-batched call, or why not */
static const char *batched(const mpt_graph *g, const mpt_kernel *k, mpt_lt_call *c) {
    const mpt_node *r = &g->nodes[k->root];
    if (k->n_nodes != 1 || k->n_outputs != 1 || k->outputs[0] != k->root)
        return "the batch_matmul kernel holds other ops (cuBLASLt runs the product alone)";
    const mpt_node *na = &g->nodes[r->in[0]], *nb = &g->nodes[r->in[1]];
    int rank = r->shape.rank;
    if (na->shape.rank != rank || nb->shape.rank != rank) return "operand ranks differ";
    c->batch = 1;
    for (int d = 0; d < rank - 2; d++) {
        if (na->shape.dim[d] != r->shape.dim[d] || nb->shape.dim[d] != r->shape.dim[d])
            return "the operands' batch dims differ from the result's";
        c->batch *= r->shape.dim[d];
    }
    /* cuBLASLt's batch count is an int32_t */
    if (c->batch > 0x7fffffff) return "more than 2^31-1 batches";
    c->a = r->in[0];
    c->b = r->in[1];
    c->trans_a = (int)r->attr.i[0];
    c->trans_b = (int)r->attr.i[1];
    c->m = r->shape.dim[rank - 2];
    c->n = r->shape.dim[rank - 1];
    c->k = na->shape.dim[c->trans_a ? rank - 2 : rank - 1];
    c->a_dt = na->dtype;
    c->b_dt = nb->dtype;
    c->d_dt = r->dtype;
    c->d = k->root;
    c->epilogue = MPT_LT_EPI_DEFAULT;
    if (c->a_dt != c->b_dt ||
        (c->a_dt != MPT_DT_F16 && c->a_dt != MPT_DT_BF16 && c->a_dt != MPT_DT_F32))
        return "operand dtypes are not both f16, both bf16 or both f32";
    if (c->d_dt != MPT_DT_F32 && c->d_dt != c->a_dt)
        return "D's dtype is neither f32 nor the operands' dtype";
    return NULL;
}

const char *mpt_cuda_match_lt(const mpt_graph *g, const mpt_kernel *k, mpt_lt_call *c) {
    memset(c, 0, sizeof *c);
    c->bias = c->aux = -1;
    c->batch = 1;
    if (k->root >= 0 && k->kind == MPT_KERNEL_OPAQUE && g->nodes[k->root].op == MPT_OP_BATCH_MATMUL)
        return batched(g, k, c);
    if ((k->kind != MPT_KERNEL_GEMM && k->kind != MPT_KERNEL_CONV) || k->root < 0)
        return "not a GEMM or convolution kernel";
    const mpt_node *r = &g->nodes[k->root];
    const char *why = gemm_of(g, r, c);
    if (why) return why;
    if (in_kernel(k, r->in[0]) || in_kernel(k, r->in[1]))
        return "an operand is computed by a fused prologue (cuBLASLt reads A and B as stored)";
    c->a_dt = g->nodes[c->a].dtype;
    c->b_dt = g->nodes[c->b].dtype;
    if (c->a_dt != c->b_dt ||
        (c->a_dt != MPT_DT_F16 && c->a_dt != MPT_DT_BF16 && c->a_dt != MPT_DT_F32))
        return "operand dtypes are not both f16, both bf16 or both f32";

    int used = 1; /* epilogue nodes the chain accounts for (the root counts) */
    int cast = 0; /* the bias is cast inside the kernel */
    int cur = k->root, pre_act = -1, act = 0; /* act: 1 relu */
    int nx = consumer(g, k, cur);
    if (nx >= 0 && g->nodes[nx].op == MPT_OP_MUL) {
        const mpt_node *m = &g->nodes[nx];
        int other = m->in[0] == cur ? m->in[1] : m->in[0];
        if (other >= 0 && g->nodes[other].op == MPT_OP_GELU_GRAD)
            return "cuBLASLt's DGELU is the tanh approximation's derivative; gelu_grad here is "
                   "the exact one";
        return "a multiply in the epilogue has no cuBLASLt epilogue";
    } else {
        if (nx >= 0 && g->nodes[nx].op == MPT_OP_ADD) {
            const mpt_node *a = &g->nodes[nx];
            int other = a->in[0] == cur ? a->in[1] : a->in[0];
            const mpt_node *o = &g->nodes[other];
            if (o->op != MPT_OP_BROADCAST || o->attr.i[0] != 1 << (o->shape.rank - 1) ||
                g->nodes[o->in[0]].shape.rank != 1)
                return "the epilogue adds a full matrix (residual), not a bias vector";
            /* a bias cast inside the kernel (f32 variable to f16/bf16) is
             * read before the cast: cuBLASLt adds it in f32 (where the
             * graph rounds it, and the sum, to f16/bf16), so only with a
             * D of f32, checked below */
            c->bias = o->in[0];
            const mpt_node *bc = &g->nodes[c->bias];
            cast = in_kernel(k, c->bias) && bc->op == MPT_OP_CAST &&
                       !in_kernel(k, bc->in[0]) && !is_output(k, c->bias);
            if (cast) c->bias = bc->in[0];
            if (in_kernel(k, c->bias)) return "the bias is computed inside the kernel";
            if (is_output(k, cur)) return "the GEMM's value before the bias is read outside";
            c->bias_dt = g->nodes[c->bias].dtype;
            if (cast && c->bias_dt != MPT_DT_F32)
                return "the bias is cast inside the kernel from other than f32";
            used += 1 + in_kernel(k, other) + cast;
            cur = nx;
            nx = consumer(g, k, cur);
        }
        if (nx >= 0 && g->nodes[nx].op == MPT_OP_GELU)
            return "cuBLASLt's GELU epilogues compute the tanh approximation; gelu here is the "
                   "exact erf form";
        if (nx >= 0 && g->nodes[nx].op == MPT_OP_RELU) {
            act = 1;
            pre_act = cur;
            used++;
            cur = nx;
            nx = consumer(g, k, cur);
        }
        if (pre_act >= 0 && is_output(k, pre_act))
            return "relu's input is read outside the kernel; cuBLASLt's RELU_AUX stores a "
                   "bit mask, not the value";
        int bias = c->bias >= 0;
        c->epilogue = act == 0 ? (bias ? MPT_LT_EPI_BIAS : MPT_LT_EPI_DEFAULT)
                               : (bias ? MPT_LT_EPI_RELU_BIAS : MPT_LT_EPI_RELU);
    }
    c->d_dt = g->nodes[cur].dtype;
    if (nx >= 0 && g->nodes[nx].op == MPT_OP_CAST && !is_output(k, nx) &&
        consumer(g, k, nx) < 0) {
        /* a widening cast cloned into its readers' kernels: none here */
        used++;
        nx = -1;
    }
    if (nx >= 0 && g->nodes[nx].op == MPT_OP_CAST) {
        if (is_output(k, cur)) return "the value before the final cast is read outside";
        c->d_dt = g->nodes[nx].dtype;
        used++;
        cur = nx;
        nx = consumer(g, k, cur);
    }
    if (nx >= 0 || used != k->n_nodes)
        return "the epilogue has ops beyond [bias] [relu] [cast] (no cuBLASLt epilogue)";
    if (c->d_dt != MPT_DT_F32 && c->d_dt != c->a_dt)
        return "D's dtype is neither f32 nor the operands' dtype";
    if (c->bias >= 0 && c->bias_dt != c->d_dt && c->d_dt != MPT_DT_F32)
        return cast ? "the bias is cast to D's dtype inside the kernel (cuBLASLt reads a bias "
                      "of D's dtype from memory)"
                    : "the bias dtype differs from D's (cuBLASLt takes a bias of D's dtype)";
    c->d = cur;
    return NULL;
}

void mpt_lt_call_print(const mpt_lt_call *c, const mpt_graph *g, FILE *f) {
    (void)g;
    fputs("cublasLt ", f);
    if (c->batch > 1) fprintf(f, "batch=%lld ", (long long)c->batch);
    fprintf(f, "M=%lld N=%lld K=%lld A=%s B=%s D=%s trans=%c%c epilogue=%s",
            (long long)c->m, (long long)c->n, (long long)c->k, mpt_dtype_name(c->a_dt),
            mpt_dtype_name(c->b_dt), mpt_dtype_name(c->d_dt), c->trans_a ? 'T' : 'N',
            c->trans_b ? 'T' : 'N', mpt_lt_epilogue_name(c->epilogue));
    if (c->bias >= 0) fprintf(f, " bias=%%%d(%s)", c->bias, mpt_dtype_name(c->bias_dt));
    if (c->aux >= 0) fprintf(f, " aux=%%%d", c->aux);
}
