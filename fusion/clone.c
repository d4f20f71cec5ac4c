/* fusion/clone.c — which producers fuse.c recomputes in every reader's
 * kernel (a clone) instead of storing them, and what a clone brings along.
 * The rules are in prose in docs/FUSION.md ("clone"). */
#include "fusion/fusion_impl.h"

static int64_t numel(const fuser *F, int id) { return mpt_shape_numel(F->g->nodes[id].shape); }

/* Cost: recomputing p in every consumer's kernel is cheaper than a buffer
 * only for ops that do no arithmetic worth the name and read at most one
 * value. Casts and reshapes only of sources, so the clone never drags
 * computed values into several kernels; broadcasts of anything, since
 * materialising a broadcast writes a big tensor for a small one; and a
 * scalar computed from sources alone (the loss scale's reciprocal), which
 * costs one operation where a kernel of its own costs a launch. */
/* A cast from a narrower float (f16, bf16 -> f32): exact, and its input is
 * half its size. Storing the input once and converting in every reader
 * moves half the bytes of storing the wide copy; mixed precision's batch
 * norm reads the cast of each convolution output three times forward and
 * again backward (ResNet-50, bf16 batch 8 on the CPU: reductions 211 -> 117
 * ms per step). Not a cast of a GEMM output or a convolution's gradient
 * itself: there the epilogue computes it in registers and its readers (a
 * weight's optimizer update) join the epilogue; a forward convolution's
 * output, which no optimizer reads, is cloned (a convolution without bias
 * before a batch norm: 154.5 -> 136.1 MiB moved per step for two such
 * layers at 56x56x64, batch 8, bf16). Cloning the data gradient's cast
 * split ResNet-like batch-norm backward kernels and moved more bytes
 * (convnet64 bf16 91.9 -> 100.9 MiB). */
static int widening_cast(const fuser *F, int p) {
    const mpt_node *n = &F->g->nodes[p];
    mpt_op in_op = F->g->nodes[n->in[0]].op;
    if (n->op != MPT_OP_CAST || (is_root_class(cls(F, n->in[0])) && in_op != MPT_OP_CONV2D))
        return 0;
    mpt_dtype from = F->g->nodes[n->in[0]].dtype, to = n->dtype;
    return (from == MPT_DT_F16 || from == MPT_DT_BF16) && to == MPT_DT_F32;
}

/* A convolution's bias add whose value a reduction reads (a batch norm's
 * statistics): the convolution cannot keep the reduction in its epilogue,
 * so one kernel writes y + bias and every reader reads it back. Its
 * readers recompute it from the convolution's output y instead (which the
 * convolution then writes in its place) and the bias: the same bytes for
 * each reader, one write of the whole tensor less. With the centred value
 * below cloned as well, a float32 batch norm after a convolution with bias
 * moves 4 passes over the tensor forward instead of 6: the statistics
 * kernel no longer writes y + bias, the normalisation no longer writes
 * x - mean for the backward, which recomputes it from y. */
static int bias_add_for_reduction(const fuser *F, int p) {
    const mpt_node *n = &F->g->nodes[p];
    if (n->op != MPT_OP_ADD) return 0;
    int conv = -1;
    for (int k = 0; k < 2; k++) {
        const mpt_node *a = &F->g->nodes[n->in[k]], *b = &F->g->nodes[n->in[1 - k]];
        if (a->op == MPT_OP_CONV2D && b->op == MPT_OP_BROADCAST && a->dtype == n->dtype &&
            mpt_shape_eq(a->shape, n->shape))
            conv = n->in[k];
    }
    if (conv < 0) return 0;
    for (int k = F->ustart[p]; k < F->ustart[p + 1]; k++)
        if (cls(F, F->users[k]) == MPT_FCLS_REDUCE) return 1;
    return 0;
}

/* the broadcast operand of a bias add above */
static int bias_broadcast(const fuser *F, int p) {
    const mpt_node *n = &F->g->nodes[p];
    return F->g->nodes[n->in[0]].op == MPT_OP_BROADCAST ? n->in[0] : n->in[1];
}

/* A batch norm's centred value x - mean, with x a widening cast: its
 * readers (the variance, the normalisation, the gradient's sums) recompute
 * it from the narrow x and the small mean, which are stored anyway,
 * instead of one kernel writing it in f32 for the backward to read again:
 * 4 bytes an element written and read per reader, against 2 read. A clone
 * brings its cast and broadcast along (fuse_apply). ResNet-50 bf16: bytes
 * moved per step 25.4 -> 20.3 GiB at batch 256; convnet64 bf16 91.9 ->
 * 77.4 MiB. */
static int centring(const fuser *F, int p) {
    const mpt_node *n = &F->g->nodes[p];
    return n->op == MPT_OP_SUB &&
           (widening_cast(F, n->in[0]) || bias_add_for_reduction(F, n->in[0])) &&
           F->g->nodes[n->in[1]].op == MPT_OP_BROADCAST;
}

int mpt_fuse_cheap_to_clone(const fuser *F, int p) {
    const mpt_node *n = &F->g->nodes[p];
    if (n->op == MPT_OP_IOTA || n->op == MPT_OP_BROADCAST || centring(F, p) ||
        bias_add_for_reduction(F, p))
        return 1;
    if (n->op == MPT_OP_CAST || n->op == MPT_OP_RESHAPE)
        return cls(F, n->in[0]) == MPT_FCLS_SOURCE || widening_cast(F, p);
    if (cls(F, p) != MPT_FCLS_ELEM || numel(F, p) != 1) return 0;
    for (int k = 0; k < n->n_in; k++)
        if (cls(F, n->in[k]) != MPT_FCLS_SOURCE) return 0;
    return 1;
}

static int64_t bytes(const fuser *F, int id) {
    const mpt_node *n = &F->g->nodes[id];
    return mpt_shape_numel(n->shape) * (int64_t)mpt_dtype_size(n->dtype);
}

/* Cost of a cast of a source as a GEMM/conv prologue. Backends convert a
 * prologue operand once into a scratch buffer before the GEMM re-reads it
 * tile by tile (the CPU packs it; cuBLASLt cannot take it at all), so each
 * GEMM/conv reading it through a clone pays: read the source, write and
 * read the converted copy. Materialised once, the cast costs one read of
 * the source and one write, then one read per reader. Cloning pays only
 * while it moves no more bytes: for one GEMM/conv reader (then it also
 * saves a launch), never for the forward and backward GEMMs of a weight. */
int mpt_fuse_prologue_clone_pays(const fuser *F, int p) {
    int64_t src = bytes(F, F->g->nodes[p].in[0]), cast = bytes(F, p);
    int64_t cloned = 0, stored = src + cast;
    for (int k = F->ustart[p]; k < F->ustart[p + 1]; k++) {
        int u = F->users[k];
        int gemm = is_root_class(cls(F, u));
        cloned += gemm ? src + 2 * cast : src;
        stored += cast;
    }
    return cloned <= stored;
}

/* The nodes group gi takes as clones when it clones p, p first, those it
 * already computes left out: a centred value brings its cast (or bias add)
 * and its broadcast of the mean, read from the narrow x (or the
 * convolution's output) and the small mean; a bias add brings its
 * broadcast of the bias. Returns how many (at most 4). */
int mpt_fuse_clone_set(const fuser *F, int p, int gi, int add[4]) {
    int n = 0;
    add[n++] = p;
    int x = centring(F, p) ? F->g->nodes[p].in[0] : bias_add_for_reduction(F, p) ? p : -1;
    if (x != p && x >= 0)
        for (int k = 0; k < 2; k++) {
            int q = F->g->nodes[p].in[k];
            if (!in_group(F, gi, q)) add[n++] = q;
        }
    if (x >= 0 && bias_add_for_reduction(F, x)) {
        int q = bias_broadcast(F, x);
        if (!in_group(F, gi, q)) add[n++] = q;
    }
    return n;
}
