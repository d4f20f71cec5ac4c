/* fusion/fuse.c — greedy producer-into-consumer fusion (after XLA's
 * instruction fusion).
 *
 * Every live computed node starts in a group of its own. Consumers are
 * visited in reverse topological order; each tries to pull every computed
 * operand (producer) into its group. A pull passes two separate checks:
 *   legality (fuse_legal): can the group's kernel compute the producer at
 *     all, given how the consumer reads it and what the group already is;
 *   cost (fuse_apply): is it worth it, and how: MOVE the producer when
 *     nobody outside needs it, CLONE a cheap producer (recompute it here
 *     and leave it where it is), or MULTI: move it and keep writing its
 *     value as an extra kernel output for the other readers.
 * A refused pull is recorded with a static reason. docs/FUSION.md has the
 * rules in prose. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "fusion/fusion_impl.h"

mpt_fusion_class mpt_fusion_class_of(mpt_op op) {
    switch (op) {
    case MPT_OP_INPUT:
    case MPT_OP_VARIABLE:
    case MPT_OP_CONST:
        return MPT_FCLS_SOURCE;
    case MPT_OP_IOTA:
    case MPT_OP_NEG: case MPT_OP_ABS: case MPT_OP_EXP: case MPT_OP_LOG:
    case MPT_OP_SQRT: case MPT_OP_RSQRT: case MPT_OP_RECIP: case MPT_OP_SQUARE:
    case MPT_OP_RELU: case MPT_OP_SIGMOID: case MPT_OP_TANH: case MPT_OP_GELU:
    case MPT_OP_GELU_GRAD: case MPT_OP_CAST: case MPT_OP_IS_FINITE: case MPT_OP_NOT:
    case MPT_OP_SIN: case MPT_OP_COS:
    case MPT_OP_ADD: case MPT_OP_SUB: case MPT_OP_MUL: case MPT_OP_DIV:
    case MPT_OP_MAX: case MPT_OP_MIN: case MPT_OP_POW: case MPT_OP_LT:
    case MPT_OP_GT: case MPT_OP_EQ: case MPT_OP_AND: case MPT_OP_SELECT:
    case MPT_OP_RESHAPE:
        return MPT_FCLS_ELEM;
    case MPT_OP_RANDOM_UNIFORM:
    case MPT_OP_BROADCAST:
    case MPT_OP_TRANSPOSE:
    case MPT_OP_ONE_HOT:
    case MPT_OP_GATHER:
    case MPT_OP_SLICE:
    case MPT_OP_CONCAT:
        return MPT_FCLS_INDEX;
    case MPT_OP_REDUCE_SUM:
    case MPT_OP_REDUCE_MAX:
    case MPT_OP_REDUCE_ALL:
        return MPT_FCLS_REDUCE;
    case MPT_OP_MATMUL:
        return MPT_FCLS_GEMM;
    case MPT_OP_CONV2D:
    case MPT_OP_CONV2D_BWD_DATA:
    case MPT_OP_CONV2D_BWD_FILTER:
        return MPT_FCLS_CONV;
    case MPT_OP_ARGMAX:
    case MPT_OP_SCATTER_ADD:
    case MPT_OP_BATCH_MATMUL: /* a kernel of its own, no epilogue (CUDA: one cuBLASLt call) */
    case MPT_OP_ATTENTION:    /* one kernel per direction with its siblings (fusion/attention.c) */
    case MPT_OP_ATTENTION_LSE:
    case MPT_OP_ATTENTION_GRAD:
    case MPT_OP_ALLREDUCE:    /* a collective call across the ranks, between kernels */
    case MPT_OP_REDUCE_SCATTER:
    case MPT_OP_ALL_GATHER:
    case MPT_OP_RANK_SLICE:
    case MPT_OP_MAX_POOL:
    case MPT_OP_MAX_POOL_GRAD:
    case MPT_OP_AVG_POOL:
    case MPT_OP_AVG_POOL_GRAD:
        return MPT_FCLS_OPAQUE;
    case MPT_OP_COUNT:
        break;
    }
    assert(!"mpt_fusion_class_of: op outside the op table");
    return MPT_FCLS_OPAQUE;
}

static int64_t numel(const fuser *F, int id) { return mpt_shape_numel(F->g->nodes[id].shape); }

static void refuse(fuser *F, int p, int c, const char *reason) {
    if (F->n_ref == F->cap_ref) {
        F->cap_ref = F->cap_ref ? 2 * F->cap_ref : 32;
        F->ref = realloc(F->ref, (size_t)F->cap_ref * sizeof *F->ref);
        assert(F->ref && "out of memory in fusion");
    }
    F->ref[F->n_ref++] = (mpt_refusal){.producer = p, .consumer = c, .reason = reason};
}

static const char *disabled(const fuser *F, unsigned bit) {
    if (!(F->o->disable & bit)) return NULL;
    switch (bit) {
    case MPT_FUSE_EPILOGUE: return "disabled by --fusion-disable=epilogue";
    case MPT_FUSE_PROLOGUE: return "disabled by --fusion-disable=prologue";
    case MPT_FUSE_LOOP: return "disabled by --fusion-disable=loop";
    case MPT_FUSE_REDUCTION: return "disabled by --fusion-disable=reduction";
    case MPT_FUSE_MULTI_OUTPUT: return "disabled by --fusion-disable=multi_output";
    case MPT_FUSE_EPILOGUE_REDUCE: return "disabled by --fusion-disable=epilogue_reduce";
    case MPT_FUSE_REDUCTION_CHAIN: return "disabled by --fusion-disable=reduction_chain";
    case MPT_FUSE_GEMM_EXTRA:
        return "kept out of the GEMM so cuBLASLt can run it (only bias, relu and cast fuse; "
               "--fusion-disable=gemm_extra)";
    }
    return "disabled by --fusion-disable";
}

/* Reductions a and b can share a pass: same input shape, same axes (the
 * backends run one reduction loop nest per kernel). */
static int same_reduction(const fuser *F, int a, int b) {
    const mpt_node *x = &F->g->nodes[a], *y = &F->g->nodes[b];
    return x->attr.i[0] == y->attr.i[0] &&
           mpt_shape_eq(F->g->nodes[x->in[0]].shape, F->g->nodes[y->in[0]].shape);
}

/* A producer read through a GEMM/conv operand or an index op may only be a
 * cast of something in memory: the consumer reads it at its own indices. */
static const char *legal_prologue(const fuser *F, int p, const char *otherwise, int *role) {
    if (cls(F, p) == MPT_FCLS_REDUCE && otherwise[0] == 'G')
        return "reduction output feeds a GEMM operand";
    if (F->g->nodes[p].op != MPT_OP_CAST) return otherwise;
    const char *d = disabled(F, MPT_FUSE_PROLOGUE);
    if (d) return d;
    *role = ROLE_PRO;
    return NULL;
}

/* Does elementwise p compute, through elementwise ops of its dtype alone
 * (no cast: a widening cast stored would double the bytes; at most `depth`
 * deep), from the output of a convolution that nothing else reads and
 * whose epilogue may hold them? Convolutions only: a batch norm's
 * backward is what this is for; GEMMs' plans (a dense layer's relu
 * gradient, a bias add before a softmax) are left as they were. */
static int from_conv_output(const fuser *F, int p, int depth) {
    const mpt_node *n = &F->g->nodes[p];
    if (cls(F, p) != MPT_FCLS_ELEM || n->op == MPT_OP_CAST || depth == 0) return 0;
    for (int k = 0; k < n->n_in; k++) {
        int q = n->in[k];
        if (numel(F, q) != numel(F, p) || F->g->nodes[q].dtype != n->dtype) continue;
        if (cls(F, q) == MPT_FCLS_CONV) {
            if (F->ustart[q + 1] - F->ustart[q] == 1 && !F->is_out[q] &&
                !(mpt_conv_is_gemm(F->g, q) && disabled(F, MPT_FUSE_GEMM_EXTRA)) &&
                !disabled(F, MPT_FUSE_EPILOGUE))
                return 1;
        } else if (F->ustart[q + 1] - F->ustart[q] == 1 && from_conv_output(F, q, depth - 1)) {
            return 1;
        }
    }
    return 0;
}

/* A reduction kernel pulling p, which another kernel reads from memory
 * anyway, and which the convolution producing its operand could compute in
 * its epilogue: a batch norm's backward pulling the relu gradient
 * select(gt(r, 0), g, 0) of a data gradient g. In the reduction, the
 * convolution writes g, the reduction reads g (and r) and writes p; in
 * the epilogue, the convolution reads r and writes p, the reduction reads
 * p: one write of the tensor less, and the reduction reads 2 tensors
 * instead of 3-5. */
static int better_in_epilogue(const fuser *F, int p, int gi) {
    return from_conv_output(F, p, 3) && mpt_fuse_needed_outside(F, p, gi);
}

/* Legality: can consumer c's group gi compute producer p, and in which
 * role. NULL, or why not. */
static const char *fuse_legal(const fuser *F, int p, int c, int gi, int *role) {
    const group *G = &F->grp[gi];
    mpt_fusion_class cc = cls(F, c), pc = cls(F, p);
    if (F->role[c] == ROLE_PRO) return "a prologue cast reads a materialised buffer";
    /* for cuBLASLt: no cast of an operand, nor of the bias a broadcast in
     * the epilogue reads (cuBLASLt reads both from memory), for matmuls and
     * the convolutions that are GEMMs (1x1, stride 1, unpadded: a f32
     * bias cast to f16 inside such a kernel kept it from cuBLASLt; cast
     * in a loop kernel it is a vector of Cout) */
    if (disabled(F, MPT_FUSE_GEMM_EXTRA) &&
        (cc == MPT_FCLS_GEMM || (cc == MPT_FCLS_CONV && mpt_conv_is_gemm(F->g, c)) ||
         (cc == MPT_FCLS_INDEX && G->root >= 0 &&
          (cls(F, G->root) == MPT_FCLS_GEMM || mpt_conv_is_gemm(F->g, G->root)))))
        return disabled(F, MPT_FUSE_GEMM_EXTRA);
    if (is_root_class(cc))
        return legal_prologue(F, p, "GEMM operand must be a materialised buffer", role);
    if (cc == MPT_FCLS_INDEX)
        return legal_prologue(F, p, "an index op (broadcast, transpose, gather) reads a "
                                    "materialised operand", role);
    if (cc == MPT_FCLS_OPAQUE) return "opaque op reads its operands from memory";
    if (cc == MPT_FCLS_SOURCE) return "sources have no kernel";

    /* c reads p 1:1: at the reduction input's index (c is a reduction or a
     * member of its body) or at the kernel's own index. */
    int r = (cc == MPT_FCLS_REDUCE || F->role[c] == ROLE_PRE) ? ROLE_PRE : ROLE_MAIN;
    int64_t want = r == ROLE_PRE ? G->red_in : G->main_numel;
    switch (pc) {
    case MPT_FCLS_SOURCE:
        return "sources have no kernel";
    case MPT_FCLS_OPAQUE:
        return "opaque op gets its own kernel";
    case MPT_FCLS_GEMM:
    case MPT_FCLS_CONV:
        if (r == ROLE_PRE || G->n_red) return "GEMM/conv output feeds a reduction";
        if (G->root >= 0) return "a kernel holds one GEMM/conv";
        if (numel(F, p) != G->main_numel) return "shapes differ: not a 1:1 loop";
        if (pc == MPT_FCLS_GEMM && disabled(F, MPT_FUSE_GEMM_EXTRA))
            for (int i = 0; i < G->mem.n; i++) {
                mpt_op op = F->g->nodes[G->mem.v[i]].op;
                if (op != MPT_OP_ADD && op != MPT_OP_RELU && op != MPT_OP_CAST &&
                    op != MPT_OP_BROADCAST)
                    return disabled(F, MPT_FUSE_GEMM_EXTRA);
            }
        *role = ROLE_MAIN;
        return disabled(F, MPT_FUSE_EPILOGUE);
    case MPT_FCLS_REDUCE:
        if (r == ROLE_PRE) return "reduction output feeds another reduction's input";
        if (G->root >= 0) return "reduction output feeds a GEMM epilogue";
        if (numel(F, p) != G->main_numel) return "shapes differ: not a 1:1 loop";
        if (G->n_red && !same_reduction(F, p, G->red_ref))
            return "reductions over different shapes in one kernel";
        *role = ROLE_MAIN;
        return disabled(F, MPT_FUSE_REDUCTION);
    case MPT_FCLS_ELEM:
    case MPT_FCLS_INDEX:
        if (numel(F, p) != want) return "shapes differ: not a 1:1 loop";
        *role = r;
        if (G->n_red && r == ROLE_PRE && better_in_epilogue(F, p, gi))
            return "stored anyway: computed in the epilogue of the convolution that produces its operand";
        if (G->n_red) return disabled(F, MPT_FUSE_REDUCTION);
        /* beside a matmul for cuBLASLt: only the bias's broadcast, of a
         * bias in memory */
        if (G->root >= 0 && cls(F, G->root) == MPT_FCLS_GEMM && disabled(F, MPT_FUSE_GEMM_EXTRA) &&
            F->g->nodes[p].op != MPT_OP_BROADCAST)
            return disabled(F, MPT_FUSE_GEMM_EXTRA);
        if (G->root >= 0) return disabled(F, MPT_FUSE_EPILOGUE);
        return disabled(F, MPT_FUSE_LOOP);
    }
    return "unknown op class";
}

/* What the size cap counts in group gi: its members that do real work.
 * Cheap plumbing (broadcasts, casts of sources, their clones) is not
 * counted: refusing it would materialise a broadcast or a cast, which
 * always costs more than recomputing it. */
static int group_size(const fuser *F, int gi) {
    const group *G = &F->grp[gi];
    int n = 0;
    for (int i = 0; i < G->mem.n; i++) n += !mpt_fuse_cheap_to_clone(F, G->mem.v[i]);
    return n;
}

/* Is p's value needed from memory by a kernel other than gi, or by the
 * graph's caller? */
int mpt_fuse_needed_outside(const fuser *F, int p, int gi) {
    if (F->is_out[p]) return 1;
    if (F->view_of[p] >= 0) return 0; /* its root is written instead */
    for (int k = F->ustart[p]; k < F->ustart[p + 1]; k++) {
        int u = F->users[k];
        if (F->view_of[u] >= 0 && mpt_fuse_view_read(F, u)) return 1;
        int h = F->home[u];
        if (h >= 0 && h != gi && !in_group(F, h, p)) return 1;
        for (int j = 0; j < F->clones[u].n; j++) {
            int cg = F->clones[u].v[j];
            if (cg != gi && !in_group(F, cg, p)) return 1;
        }
    }
    return 0;
}

/* Does a path of kernel dependencies lead from group `from` to group `to`
 * (back to itself when they are the same)? */
static int group_path(fuser *F, int from, int to) {
    F->stamp++;
    F->stack.n = 0;
    ivec_push(&F->stack, from);
    while (F->stack.n) {
        int x = F->stack.v[--F->stack.n];
        const group *X = &F->grp[x];
        for (int i = 0; i < X->mem.n; i++) {
            int m = X->mem.v[i];
            if (F->home[m] != x) continue; /* clones write nothing */
            for (int k = F->ustart[m]; k < F->ustart[m + 1]; k++) {
                int u = F->users[k];
                for (int j = -1; j < F->clones[u].n; j++) {
                    int y = j < 0 ? F->home[u] : F->clones[u].v[j];
                    if (y < 0 || y == x || in_group(F, y, m)) continue;
                    if (y == to) return 1;
                    if (F->seen[y] != F->stamp) {
                        F->seen[y] = F->stamp;
                        ivec_push(&F->stack, y);
                    }
                }
            }
        }
    }
    return 0;
}

static int group_in_cycle(fuser *F, int from) { return group_path(F, from, from); }

static void group_note(group *G, const fuser *F, int p) {
    mpt_fusion_class pc = cls(F, p);
    if (is_root_class(pc)) G->root = p;
    if (pc == MPT_FCLS_REDUCE) {
        G->n_red++;
        G->red_in = numel(F, F->g->nodes[p].in[0]);
        if (G->red_ref < 0) G->red_ref = p;
    }
}

static void move_node(fuser *F, int p, int gi, int role) {
    int from = F->home[p];
    ivec_remove(&F->grp[from].mem, p);
    ivec_push(&F->grp[gi].mem, p);
    F->home[p] = gi;
    F->role[p] = (unsigned char)role;
    group_note(&F->grp[gi], F, p);
}

static void unmove_node(fuser *F, int p, int from, int gi, int role, const group *saved) {
    ivec_remove(&F->grp[gi].mem, p);
    ivec_push(&F->grp[from].mem, p);
    F->home[p] = from;
    F->role[p] = (unsigned char)role;
    ivec mem = F->grp[gi].mem;
    F->grp[gi] = *saved;
    F->grp[gi].mem = mem;
}

static void ivec_replace(ivec *a, int from, int to) {
    for (int i = 0; i < a->n; i++)
        if (a->v[i] == from) a->v[i] = to;
}

/* Joins kernel h into kernel gi (both iterate the same space, neither
 * holds a GEMM/conv), unless the size cap or a cycle forbids it. */
static const char *merge_groups(fuser *F, int h, int gi) {
    group *H = &F->grp[h], *G = &F->grp[gi];
    if (group_size(F, gi) + group_size(F, h) > F->o->max_ops) return "kernel size cap reached";
    const char *d = disabled(F, MPT_FUSE_MULTI_OUTPUT);
    if (d) return d;
    int n0 = G->mem.n;
    ivec dropped = {0}; /* clones in h of nodes gi already has */
    for (int i = 0; i < H->mem.n; i++) {
        int m = H->mem.v[i];
        if (F->home[m] == h) {
            F->home[m] = gi;
        } else if (in_group(F, gi, m)) {
            ivec_remove(&F->clones[m], h);
            ivec_push(&dropped, m);
            continue;
        } else {
            ivec_replace(&F->clones[m], h, gi);
        }
        ivec_push(&G->mem, m);
    }
    if (group_in_cycle(F, gi)) {
        for (int i = n0; i < G->mem.n; i++) {
            int m = G->mem.v[i];
            if (F->home[m] == gi) F->home[m] = h;
            else ivec_replace(&F->clones[m], gi, h);
        }
        for (int i = 0; i < dropped.n; i++) ivec_push(&F->clones[dropped.v[i]], h);
        G->mem.n = n0;
        free(dropped.v);
        return "fusing would create a cycle between kernels";
    }
    free(dropped.v);
    G->n_red += H->n_red;
    if (H->red_in >= 0) G->red_in = H->red_in;
    if (G->red_ref < 0) G->red_ref = H->red_ref;
    H->mem.n = 0;
    return NULL;
}

/* Multi-output fusion of siblings: p already lives in kernel h, and c's
 * kernel gi reads it the same way; joining the two kernels (same iteration
 * space, no GEMM/conv) saves the read of p and a launch. This is what puts
 * an optimizer's weight and its slots in one kernel. */
static const char *merge_siblings(fuser *F, int p, int h, int gi, int role) {
    const char *why = "producer has consumers in different kernels";
    group *H = &F->grp[h], *G = &F->grp[gi];
    if (H->root >= 0 || G->root >= 0 || F->role[p] != role) return why;
    if (H->main_numel != G->main_numel) return why;
    if (H->n_red && G->n_red && !same_reduction(F, H->red_ref, G->red_ref))
        return "reductions over different shapes in one kernel";
    return merge_groups(F, h, gi);
}

/* Cost and application: moves, clones or multi-outputs p into gi, or says
 * why not. */
static const char *fuse_apply(fuser *F, int p, int gi, int role) {
    int from = F->home[p];
    int alone = F->grp[from].mem.n == 1;
    int outside = mpt_fuse_needed_outside(F, p, gi);
    int cheap = mpt_fuse_cheap_to_clone(F, p);
    if (cheap && F->g->nodes[p].op == MPT_OP_CAST && !mpt_fuse_prologue_clone_pays(F, p)) cheap = 0;
    if (!cheap && group_size(F, gi) + 1 > F->o->max_ops) return "kernel size cap reached";
    if (alone && !outside) {
        move_node(F, p, gi, role);
        return NULL;
    }
    if (cheap) {
        int add[4], n_add = mpt_fuse_clone_set(F, p, gi, add);
        for (int i = 0; i < n_add; i++) {
            ivec_push(&F->clones[add[i]], gi);
            ivec_push(&F->grp[gi].mem, add[i]);
        }
        if (!group_in_cycle(F, gi)) return NULL;
        for (int i = 0; i < n_add; i++) {
            ivec_remove(&F->clones[add[i]], gi);
            ivec_remove(&F->grp[gi].mem, add[i]);
        }
        return "fusing would create a cycle between kernels";
    }
    if (!alone) return merge_siblings(F, p, from, gi, role);
    if (role == ROLE_PRO) return "prologue cast is also read by other kernels";
    const char *d = disabled(F, MPT_FUSE_MULTI_OUTPUT);
    if (d) return d;
    group saved = F->grp[gi];
    int old_role = F->role[p];
    move_node(F, p, gi, role);
    if (!group_in_cycle(F, gi)) return NULL;
    unmove_node(F, p, from, gi, old_role, &saved);
    return "fusing would create a cycle between kernels";
}

static void fuser_init(fuser *F, const mpt_graph *g, const mpt_fusion_opts *o) {
    memset(F, 0, sizeof *F);
    int n = g->n_nodes;
    F->g = g;
    F->o = o;
    F->n = n;
    F->is_out = calloc((size_t)n + 1, 1);
    F->live = calloc((size_t)n + 1, 1);
    F->role = calloc((size_t)n + 1, 1);
    F->home = malloc(((size_t)n + 1) * sizeof *F->home);
    F->clones = calloc((size_t)n + 1, sizeof *F->clones);
    F->ustart = calloc((size_t)n + 2, sizeof *F->ustart);
    F->grp = calloc((size_t)n + 1, sizeof *F->grp);
    F->seen = calloc((size_t)n + 1, sizeof *F->seen);
    F->view_of = malloc(((size_t)n + 1) * sizeof *F->view_of);
    assert(F->is_out && F->live && F->role && F->home && F->clones && F->ustart && F->grp &&
           F->seen && F->view_of && "out of memory in fusion");
    for (int i = 0; i < n; i++) F->view_of[i] = -1;
    for (int i = 0; i < g->n_outputs; i++) F->is_out[g->outputs[i].node] = 1;
    for (int i = 0; i < g->n_updates; i++) F->is_out[g->updates[i].value] = 1;
    for (int i = 0; i < n; i++) F->live[i] = F->is_out[i];
    for (int i = n - 1; i >= 0; i--)
        if (F->live[i])
            for (int k = 0; k < g->nodes[i].n_in; k++) F->live[g->nodes[i].in[k]] = 1;
    /* distinct users, live ones only */
    for (int i = 0; i < n; i++) {
        if (!F->live[i]) continue;
        const mpt_node *nd = &g->nodes[i];
        for (int k = 0; k < nd->n_in; k++) {
            int dup = 0;
            for (int j = 0; j < k; j++) dup |= nd->in[j] == nd->in[k];
            if (!dup) F->ustart[nd->in[k] + 1]++;
        }
    }
    for (int i = 0; i < n; i++) F->ustart[i + 1] += F->ustart[i];
    F->users = malloc(((size_t)F->ustart[n] + 1) * sizeof *F->users);
    int *fill = malloc(((size_t)n + 1) * sizeof *fill);
    assert(F->users && fill);
    memcpy(fill, F->ustart, (size_t)n * sizeof *fill);
    for (int i = 0; i < n; i++) {
        if (!F->live[i]) continue;
        const mpt_node *nd = &g->nodes[i];
        for (int k = 0; k < nd->n_in; k++) {
            int dup = 0;
            for (int j = 0; j < k; j++) dup |= nd->in[j] == nd->in[k];
            if (!dup) F->users[fill[nd->in[k]]++] = i;
        }
    }
    free(fill);
    for (int i = 0; i < n; i++) {
        F->home[i] = -1;
        if (!F->live[i] || cls(F, i) == MPT_FCLS_SOURCE) continue;
        group *G = &F->grp[F->n_grp];
        G->root = -1;
        G->red_in = -1;
        G->red_ref = -1;
        G->main_numel = numel(F, i);
        ivec_push(&G->mem, i);
        group_note(G, F, i);
        F->home[i] = F->n_grp++;
    }
}

static void fuser_run(fuser *F) {
    const mpt_graph *g = F->g;
    for (int c = F->n - 1; c >= 0; c--) {
        if (F->home[c] < 0) continue;
        /* recomputed by every reader (a clone) and alone: its kernel
         * writes nothing, so a GEMM/conv pulled in would compute an
         * epilogue for nothing (a bias add no one reads from memory) */
        int dead = F->clones[c].n && F->grp[F->home[c]].mem.n == 1 &&
                   !mpt_fuse_needed_outside(F, c, F->home[c]);
        const mpt_node *nd = &g->nodes[c];
        for (int k = 0; k < nd->n_in; k++) {
            int p = nd->in[k], gi = F->home[c], role = ROLE_MAIN;
            if (cls(F, p) == MPT_FCLS_SOURCE || in_group(F, gi, p)) continue;
            const char *why = dead && is_root_class(cls(F, p))
                                  ? "consumer is recomputed by every reader: no epilogue to hold it"
                                  : fuse_legal(F, p, c, gi, &role);
            if (!why) why = fuse_apply(F, p, gi, role);
            if (why) refuse(F, p, c, why);
        }
    }
}

/* ---- reductions in a GEMM/conv epilogue ------------------------------- */

/* Can reduction kernel r run inside GEMM/conv kernel gi's epilogue? Only
 * reduce_all over every dim but the last of a value of the GEMM/conv's own
 * shape ([M, N] -> [N]; conv [B, H, W, C] -> [C]): AND is exact in any order
 * and idempotent, so the epilogue loop (split between threads by elements)
 * clears a column's flag wherever it meets a false element, with nothing
 * to combine afterwards. The case that matters is the loss-scale check
 * is_finite(gradient) of a weight's gradient GEMM: the gradient need not be
 * written out for a second kernel to read. Every value r reads must come
 * from gi's epilogue (or be a source), so joining cannot reorder kernels. */
static const char *epilogue_reduce_fits(fuser *F, int r, int gi) {
    const group *R = &F->grp[r], *G = &F->grp[gi];
    const mpt_shape root = F->g->nodes[G->root].shape;
    if (root.rank < 2) return "GEMM/conv output feeds a reduction";
    /* cuBLASLt has no reduction among its epilogues: matmuls and the
     * convolutions that are GEMMs stay its own */
    if (disabled(F, MPT_FUSE_GEMM_EXTRA) &&
        (cls(F, G->root) == MPT_FCLS_GEMM || mpt_conv_is_gemm(F->g, G->root)))
        return disabled(F, MPT_FUSE_GEMM_EXTRA);
    for (int i = 0; i < R->mem.n; i++) {
        int m = R->mem.v[i];
        const mpt_node *nd = &F->g->nodes[m];
        mpt_fusion_class c = cls(F, m);
        if (F->home[m] != r) { /* a clone: recomputed in the epilogue as well */
            if (c != MPT_FCLS_ELEM && c != MPT_FCLS_INDEX) return "GEMM/conv output feeds a reduction";
        } else if (c == MPT_FCLS_REDUCE) {
            if (nd->op != MPT_OP_REDUCE_ALL) return "only reduce_all joins a GEMM/conv epilogue";
            const mpt_shape in = F->g->nodes[nd->in[0]].shape;
            if (!mpt_shape_eq(in, root) || nd->attr.i[0] != (1LL << (root.rank - 1)) - 1)
                return "an epilogue reduction must reduce every dim but the last of the "
                       "GEMM/conv output";
        } else if ((c != MPT_FCLS_ELEM && c != MPT_FCLS_INDEX) || F->role[m] != ROLE_PRE) {
            return "an epilogue reduction's kernel may hold only what its input reads";
        }
        for (int q = 0; q < nd->n_in; q++) {
            int p = nd->in[q], h = F->home[p];
            if (cls(F, p) == MPT_FCLS_SOURCE || in_group(F, r, p)) continue;
            if (h == gi) {
                if (F->role[p] == ROLE_PRO)
                    return "an epilogue reduction reads a GEMM/conv operand";
                continue;
            }
            /* another kernel's value: it must not wait for gi (a scalar
             * such as the loss scale's reciprocal) */
            if (F->g->nodes[p].shape.rank > 0 && numel(F, p) > 1)
                return "an epilogue reduction reads a tensor its GEMM/conv kernel does not compute";
            if (group_path(F, gi, h)) return "fusing would create a cycle between kernels";
        }
    }
    if (group_size(F, gi) + group_size(F, r) > F->o->max_ops) return "kernel size cap reached";
    const char *d = disabled(F, MPT_FUSE_EPILOGUE);
    if (!d) d = disabled(F, MPT_FUSE_REDUCTION);
    return d ? d : disabled(F, MPT_FUSE_EPILOGUE_REDUCE);
}

/* The reduction kernel that reads p (of GEMM/conv kernel gi) or -1. */
static int reducer_of(const fuser *F, int p, int gi) {
    for (int k = F->ustart[p]; k < F->ustart[p + 1]; k++) {
        int h = F->home[F->users[k]];
        if (h >= 0 && h != gi && F->grp[h].root < 0 && F->grp[h].n_red) return h;
    }
    return -1;
}

static void fuse_epilogue_reductions(fuser *F) {
    for (int gi = 0; gi < F->n_grp; gi++) {
        group *G = &F->grp[gi];
        if (G->root < 0 || !G->mem.n) continue;
        for (int i = 0; i < G->mem.n; i++) {
            int p = G->mem.v[i];
            if (F->home[p] != gi) continue;
            int r = reducer_of(F, p, gi);
            if (r < 0 || epilogue_reduce_fits(F, r, gi)) continue;
            group *R = &F->grp[r];
            for (int j = 0; j < R->mem.n; j++) {
                int m = R->mem.v[j];
                if (F->home[m] == r) {
                    F->home[m] = gi;
                } else {
                    ivec_remove(&F->clones[m], r);
                    if (in_group(F, gi, m)) continue;
                    ivec_push(&F->clones[m], gi);
                }
                ivec_push(&G->mem, m);
            }
            G->n_red += R->n_red;
            R->mem.n = 0;
            R->n_red = 0;
            /* the refusals this join answered are no longer true */
            int w = 0;
            for (int k = 0; k < F->n_ref; k++)
                if (!(F->home[F->ref[k].producer] == gi && F->home[F->ref[k].consumer] == gi))
                    F->ref[w++] = F->ref[k];
            F->n_ref = w;
        }
    }
}

/* ---- sibling fusion ---------------------------------------------------- */

/* A group sibling fusion may join: no GEMM/conv, no opaque op. */
static int plain_group(const fuser *F, int gi) {
    const group *G = &F->grp[gi];
    if (!G->mem.n || G->root >= 0) return 0;
    for (int i = 0; i < G->mem.n; i++)
        if (F->home[G->mem.v[i]] == gi && cls(F, G->mem.v[i]) == MPT_FCLS_OPAQUE) return 0;
    return 1;
}

/* Does a member of group b read a value group a computes? Within one
 * kernel that read would be at a computed index (a broadcast of a
 * reduction's result), or a reduction's body would need a result of the
 * same pass: joined kernels must not read each other. */
static int group_reads(const fuser *F, int b, int a) {
    const group *B = &F->grp[b];
    for (int i = 0; i < B->mem.n; i++) {
        const mpt_node *nd = &F->g->nodes[B->mem.v[i]];
        for (int k = 0; k < nd->n_in; k++)
            if (F->home[nd->in[k]] == a) return 1;
    }
    return 0;
}

/* Can kernels a and b become one: two loops over the same element count,
 * or two reduction kernels whose reductions agree and whose results have
 * the same element count; and neither reads the other. */
static int siblings_fit(const fuser *F, int a, int b) {
    const group *A = &F->grp[a], *B = &F->grp[b];
    if (!plain_group(F, a) || !plain_group(F, b)) return 0;
    if (F->o->disable & (A->n_red ? MPT_FUSE_REDUCTION : MPT_FUSE_LOOP)) return 0;
    if (group_reads(F, a, b) || group_reads(F, b, a)) return 0;
    if (A->main_numel != B->main_numel || !A->n_red != !B->n_red) return 0;
    return !A->n_red || same_reduction(F, A->red_ref, B->red_ref);
}

/* Sibling multi-output fusion, after XLA's: kernels that read the same
 * materialised value and iterate the same space become one kernel, which
 * reads the value once (batch norm's sum and sum of squares of one
 * gradient; the mean and the variance of one input). A scalar is no reason
 * to merge: reading it twice costs nothing (XLA's "effective scalar"). */
static void fuse_siblings(fuser *F) {
    ivec rd = {0}, via = {0}; /* reading groups of v, and a node of each that reads it */
    for (int v = 0; v < F->n; v++) {
        if (!F->live[v] || F->g->nodes[v].op == MPT_OP_CONST || numel(F, v) <= 1) continue;
        rd.n = via.n = 0;
        for (int k = F->ustart[v]; k < F->ustart[v + 1]; k++) {
            int u = F->users[k];
            for (int j = -1; j < F->clones[u].n; j++) {
                int y = j < 0 ? F->home[u] : F->clones[u].v[j];
                if (y < 0 || in_group(F, y, v) || ivec_has(&rd, y)) continue;
                ivec_push(&rd, y);
                ivec_push(&via, u);
            }
        }
        for (int i = 0; i < rd.n; i++)
            for (int j = i + 1; j < rd.n; j++) {
                if (!siblings_fit(F, rd.v[i], rd.v[j])) continue;
                const char *why = merge_groups(F, rd.v[j], rd.v[i]);
                if (why) { /* a source's readers were never a producer's consumers */
                    if (F->home[v] >= 0) refuse(F, v, via.v[j], why);
                    continue;
                }
                rd.n--, via.n--;
                rd.v[j] = rd.v[rd.n];
                via.v[j--] = via.v[via.n];
            }
    }
    free(via.v);
    free(rd.v);
}

/* Horizontal fusion (after XLA's horizontal loop fusion): small kernels
 * that share nothing but iterate the same space are joined, since each
 * costs a launch more than its work. The case that matters: under dynamic
 * loss scaling every optimizer update waits for the all-finite check of
 * every gradient, so the updates can no longer ride in the epilogues of the
 * kernels computing their gradients; without this each variable and each
 * batch-norm statistic would get a loop of its own. Only small kernels
 * (HORIZONTAL_MAX_ELEMENTS): a big one is bound by memory, not launches,
 * and joining it only keeps its inputs alive longer. */
#define HORIZONTAL_MAX_ELEMENTS ((int64_t)1 << 18)
#define HORIZONTAL_TRIES 4 /* merge attempts per kernel: each is a cycle search */

static int64_t group_space(const group *G) { return G->n_red ? G->red_in : G->main_numel; }

static void fuse_horizontal(fuser *F) {
    if (F->o->disable & MPT_FUSE_MULTI_OUTPUT) return;
    ivec open = {0}; /* earlier small kernels that still have room */
    for (int b = 0; b < F->n_grp; b++) {
        if (!plain_group(F, b) || group_space(&F->grp[b]) > HORIZONTAL_MAX_ELEMENTS) continue;
        int merged = 0;
        for (int i = open.n - 1, tries = 0; i >= 0 && !merged && tries < HORIZONTAL_TRIES; i--) {
            int a = open.v[i];
            if (!siblings_fit(F, a, b)) continue;
            tries++;
            const char *why = merge_groups(F, b, a);
            merged = why == NULL;
            if (why && group_size(F, a) + 1 > F->o->max_ops) open.v[i] = open.v[--open.n];
        }
        if (!merged) ivec_push(&open, b);
    }
    free(open.v);
}

/* ---- from groups to kernels ------------------------------------------ */

static void fuser_free(fuser *F) {
    for (int i = 0; i < F->n; i++) free(F->clones[i].v);
    for (int i = 0; i < F->n_grp; i++) free(F->grp[i].mem.v);
    free(F->clones);
    free(F->grp);
    free(F->is_out);
    free(F->live);
    free(F->role);
    free(F->home);
    free(F->ustart);
    free(F->users);
    free(F->seen);
    free(F->view_of);
    free(F->stack.v);
}

mpt_plan *mpt_fuse(const mpt_graph *g, const mpt_fusion_opts *opts) {
    mpt_fusion_opts o;
    if (opts) o = *opts; else mpt_fusion_opts_default(&o);
    if (o.max_ops < 1) o.max_ops = 1;
    fuser F;
    fuser_init(&F, g, &o);
    if (o.enabled) {
        mpt_fuse_attention(&F, merge_groups, refuse);
        fuser_run(&F);
        fuse_epilogue_reductions(&F);
        fuse_siblings(&F);
        fuse_horizontal(&F);
        if (o.disable & MPT_FUSE_REDUCTION_CHAIN) mpt_fuse_split_chains(&F, refuse);
        mpt_fuse_views(&F);
    }
    mpt_plan *p = calloc(1, sizeof *p);
    assert(p);
    p->g = g;
    p->kernel_of = malloc(((size_t)g->n_nodes + 1) * sizeof *p->kernel_of);
    assert(p->kernel_of);
    mpt_fuse_build_kernels(&F, p);
    p->refusals = F.ref;
    p->n_refusals = F.n_ref;
    F.ref = NULL;
    fuser_free(&F);
    mpt_plan_finish(p);
    return p;
}
