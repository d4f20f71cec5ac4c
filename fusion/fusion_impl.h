/* fusion/fusion_impl.h — private to the files of fusion/: how fusion classifies ops,
 * and the steps that turn grouped nodes into a finished plan. */
#ifndef MPT_FUSION_IMPL_H
#define MPT_FUSION_IMPL_H

#include <assert.h>
#include <stdlib.h>

#include "fusion/fusion.h"

/* What fusion may do with an op (finer than mpt_op_kind). */
typedef enum {
    MPT_FCLS_SOURCE,  /* input, variable, const: no kernel, read from memory or inlined */
    MPT_FCLS_ELEM,    /* reads its operands at its own linear index (elementwise, cast,
                         reshape) or at none (iota) */
    MPT_FCLS_INDEX,   /* one output element reads an operand at a computed index
                         (broadcast, transpose, one_hot, gather, random_uniform,
                         slice, concat) */
    MPT_FCLS_REDUCE,  /* reduce_sum, reduce_max, reduce_all */
    MPT_FCLS_GEMM,    /* matmul */
    MPT_FCLS_CONV,    /* conv2d and its two gradients */
    MPT_FCLS_OPAQUE,  /* pooling, pool gradients, scatter_add, argmax, batch_matmul, attention's ops */
} mpt_fusion_class;

mpt_fusion_class mpt_fusion_class_of(mpt_op op);

/* ---- the fuser's working state, shared by fuse.c and kernels.c ---- */

/* How a member of a group is evaluated. */
enum {
    ROLE_MAIN, /* at the kernel's output index (loop body, epilogue, post-reduction) */
    ROLE_PRE,  /* at the reduction input's index (a reduction kernel's body) */
    ROLE_PRO,  /* a cast evaluated where a GEMM/conv/index op reads its operand */
};

typedef struct {
    int *v;
    int n, cap;
} ivec;

static inline void ivec_push(ivec *a, int x) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 4;
        a->v = realloc(a->v, (size_t)a->cap * sizeof *a->v);
        assert(a->v && "out of memory in fusion");
    }
    a->v[a->n++] = x;
}

static inline int ivec_has(const ivec *a, int x) {
    for (int i = 0; i < a->n; i++)
        if (a->v[i] == x) return 1;
    return 0;
}

static inline void ivec_remove(ivec *a, int x) {
    for (int i = 0; i < a->n; i++)
        if (a->v[i] == x) {
            a->v[i] = a->v[--a->n];
            return;
        }
}

typedef struct {
    ivec mem;           /* members: nodes at home here, and clones */
    int root;           /* the GEMM/conv node, or -1 */
    int n_red;          /* reductions in the group */
    int64_t red_in;     /* element count the reductions read (ROLE_PRE), or -1 */
    int red_ref;        /* one of its reductions: all reduce that shape over those axes */
    int64_t main_numel; /* element count of ROLE_MAIN members */
} group;

typedef struct {
    const mpt_graph *g;
    const mpt_fusion_opts *o;
    int n;
    int *ustart, *users;   /* distinct live users of each node (CSR) */
    unsigned char *is_out; /* a graph output or an update's value */
    unsigned char *live;
    unsigned char *role;   /* role of each node in its home group */
    int *home;             /* group computing the node, -1 for sources */
    ivec *clones;          /* groups holding a recomputed copy of the node */
    group *grp;
    int n_grp;
    mpt_refusal *ref;
    int n_ref, cap_ref;
    int *view_of;          /* a reshape read as its root's buffer, or -1 (views.c) */
    int *seen;             /* cycle search: stamp per group */
    int stamp;
    ivec stack;
} fuser;

static inline mpt_fusion_class cls(const fuser *F, int id) {
    return mpt_fusion_class_of(F->g->nodes[id].op);
}

/* Does group gi compute id (at home or as a clone)? */
static inline int in_group(const fuser *F, int gi, int id) {
    return F->home[id] == gi || ivec_has(&F->clones[id], gi);
}

static inline int is_root_class(mpt_fusion_class c) { return c == MPT_FCLS_GEMM || c == MPT_FCLS_CONV; }

/* clone.c: is p cheap enough to recompute in every kernel that reads it? */
int mpt_fuse_cheap_to_clone(const fuser *F, int p);
/* clone.c: does cloning a cast of a source into its GEMM/conv readers move
 * no more bytes than storing it once? */
int mpt_fuse_prologue_clone_pays(const fuser *F, int p);
/* clone.c: what group gi takes as clones when it clones p (p first), into
 * add; returns how many (at most 4) */
int mpt_fuse_clone_set(const fuser *F, int p, int gi, int add[4]);

/* fuse.c: is p's value needed from memory by a kernel other than gi, or by
 * the graph's caller? */
int mpt_fuse_needed_outside(const fuser *F, int p, int gi);

/* split.c: cuts each reduction kernel whose row-sized work reads its own
 * reductions' results into passes (MPT_FUSE_REDUCTION_CHAIN disabled),
 * recording each cut edge through refuse. */
void mpt_fuse_split_chains(fuser *F, void (*refuse)(fuser *, int, int, const char *));
/* attention.c: joins each attention with the attention_lse of the same
 * scores, and the attention_grad ops of one attention, into one group
 * (through merge, recording a refused join through refuse) */
void mpt_fuse_attention(fuser *F, const char *(*merge)(fuser *, int, int),
                        void (*refuse)(fuser *, int, int, const char *));
/* views.c: turns each reshape that some kernel reads from memory into a
 * view of its operand's buffer where that costs no extra kernel (the
 * operand is a source or is written anyway, or is computed in the
 * reshape's own kernel, which then writes it instead). */
void mpt_fuse_views(fuser *F);
/* views.c: does a kernel other than one computing view v read v (or a view
 * of v) from memory? Then v's root must be in memory. */
int mpt_fuse_view_read(const fuser *F, int v);
/* kernels.c: fills p's kernels (members, inputs, outputs, kind) in an
 * execution order, kernel_of and view_of. */
void mpt_fuse_build_kernels(const fuser *F, mpt_plan *p);

/* plan.c: fills every kernel's name, the memory plan and bytes_moved of a
 * plan whose kernels, kernel_of and refusals are set. */
void mpt_plan_finish(mpt_plan *p);

#endif
