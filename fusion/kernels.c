/* fusion/kernels.c — from the fuser's groups to the plan's kernels: their
 * members, inputs and outputs, their kind, and an execution order. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "fusion/fusion_impl.h"

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int *dup_sorted(const ivec *a) {
    int *v = malloc(((size_t)a->n + 1) * sizeof *v);
    assert(v);
    if (a->n) memcpy(v, a->v, (size_t)a->n * sizeof *v);
    qsort(v, (size_t)a->n, sizeof *v, cmp_int);
    return v;
}

/* Home members whose value some other kernel or the caller reads. */
static void group_outputs(const fuser *F, int gi, ivec *out) {
    const group *G = &F->grp[gi];
    for (int i = 0; i < G->mem.n; i++) {
        int m = G->mem.v[i];
        if (F->home[m] == gi && mpt_fuse_needed_outside(F, m, gi)) ivec_push(out, m);
    }
}

static void group_inputs(const fuser *F, int gi, ivec *in) {
    const group *G = &F->grp[gi];
    for (int i = 0; i < G->mem.n; i++) {
        const mpt_node *nd = &F->g->nodes[G->mem.v[i]];
        for (int k = 0; k < nd->n_in; k++) {
            int q = nd->in[k];
            if (!in_group(F, gi, q) && !ivec_has(in, q)) ivec_push(in, q);
        }
    }
}

static mpt_kernel_kind group_kind(const fuser *F, int gi, int *root) {
    const group *G = &F->grp[gi];
    if (G->root >= 0) {
        *root = G->root;
        return cls(F, G->root) == MPT_FCLS_GEMM ? MPT_KERNEL_GEMM : MPT_KERNEL_CONV;
    }
    *root = -1;
    for (int i = 0; i < G->mem.n; i++) {
        int m = G->mem.v[i];
        if (F->home[m] == gi && cls(F, m) == MPT_FCLS_REDUCE && (*root < 0 || m < *root))
            *root = m;
    }
    if (*root >= 0) return MPT_KERNEL_REDUCTION;
    /* an opaque op alone, or attention's siblings (fuse.c) */
    int opaque = G->mem.n > 0;
    for (int i = 0; i < G->mem.n; i++) opaque &= cls(F, G->mem.v[i]) == MPT_FCLS_OPAQUE;
    if (opaque) {
        for (int i = 0; i < G->mem.n; i++)
            if (*root < 0 || G->mem.v[i] < *root) *root = G->mem.v[i];
        return MPT_KERNEL_OPAQUE;
    }
    return MPT_KERNEL_LOOP;
}

static void heap_push(int *h, int *n, int x, const int *key) {
    int i = (*n)++;
    h[i] = x;
    while (i > 0 && key[h[(i - 1) / 2]] > key[h[i]]) {
        int up = (i - 1) / 2, t = h[up];
        h[up] = h[i];
        h[i] = t;
        i = up;
    }
}

static int heap_pop(int *h, int *n, const int *key) {
    int top = h[0];
    h[0] = h[--*n];
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, s = i;
        if (l < *n && key[h[l]] < key[h[s]]) s = l;
        if (r < *n && key[h[r]] < key[h[s]]) s = r;
        if (s == i) break;
        int t = h[s];
        h[s] = h[i];
        h[i] = t;
        i = s;
    }
    return top;
}

/* Adds to succ the kept groups that read v, written by group x, from
 * memory: directly, or through a view of v (which reads x's buffer). */
static void add_readers(const fuser *F, int x, int v, const int *gk, ivec *succ, int *indeg) {
    for (int j = F->ustart[v]; j < F->ustart[v + 1]; j++) {
        int u = F->users[j];
        if (F->view_of[u] >= 0) add_readers(F, x, u, gk, succ, indeg);
        for (int c = -1; c < F->clones[u].n; c++) {
            int y = c < 0 ? F->home[u] : F->clones[u].v[c];
            if (y < 0 || y == x || gk[y] < 0 || in_group(F, y, v)) continue;
            if (!ivec_has(succ, gk[y])) {
                ivec_push(succ, gk[y]);
                indeg[gk[y]]++;
            }
        }
    }
}

/* Kernels in a topological order of their dependencies; among ready ones
 * the one holding the smallest node id first, so the plan reads like the
 * graph. */
static int *order_groups(const fuser *F, const int *keep, int n_keep) {
    int *gk = malloc(((size_t)F->n_grp + 1) * sizeof *gk); /* group -> keep index */
    int *indeg = calloc((size_t)n_keep + 1, sizeof *indeg);
    int *minid = malloc(((size_t)n_keep + 1) * sizeof *minid);
    int *order = malloc(((size_t)n_keep + 1) * sizeof *order);
    ivec *succ = calloc((size_t)n_keep + 1, sizeof *succ);
    assert(gk && indeg && minid && order && succ);
    for (int i = 0; i < F->n_grp; i++) gk[i] = -1;
    for (int k = 0; k < n_keep; k++) gk[keep[k]] = k;
    for (int k = 0; k < n_keep; k++) {
        const group *X = &F->grp[keep[k]];
        minid[k] = F->n;
        for (int i = 0; i < X->mem.n; i++) {
            int m = X->mem.v[i];
            if (F->home[m] != keep[k]) continue;
            if (m < minid[k]) minid[k] = m;
            add_readers(F, keep[k], m, gk, &succ[k], indeg);
        }
    }
    /* Kahn's algorithm with a binary min-heap on minid */
    int *heap = malloc(((size_t)n_keep + 1) * sizeof *heap), hn = 0;
    assert(heap);
    for (int k = 0; k < n_keep; k++)
        if (indeg[k] == 0) heap_push(heap, &hn, k, minid);
    for (int t = 0; t < n_keep; t++) {
        assert(hn > 0 && "fusion produced a cycle between kernels");
        int best = heap_pop(heap, &hn, minid);
        order[t] = keep[best];
        for (int i = 0; i < succ[best].n; i++)
            if (--indeg[succ[best].v[i]] == 0) heap_push(heap, &hn, succ[best].v[i], minid);
    }
    free(heap);
    for (int k = 0; k < n_keep; k++) free(succ[k].v);
    free(succ);
    free(minid);
    free(indeg);
    free(gk);
    return order;
}

void mpt_fuse_build_kernels(const fuser *F, mpt_plan *p) {
    int *keep = malloc(((size_t)F->n_grp + 1) * sizeof *keep);
    int n_keep = 0;
    assert(keep);
    ivec outs = {0};
    for (int gi = 0; gi < F->n_grp; gi++) {
        outs.n = 0;
        if (F->grp[gi].mem.n) group_outputs(F, gi, &outs);
        /* a group with no readers only held a node every reader recomputes */
        if (outs.n) keep[n_keep++] = gi;
    }
    int *order = order_groups(F, keep, n_keep);
    p->kernels = calloc((size_t)n_keep + 1, sizeof *p->kernels);
    assert(p->kernels);
    p->n_kernels = n_keep;
    for (int i = 0; i < F->n; i++) p->kernel_of[i] = -1;
    ivec ins = {0};
    for (int k = 0; k < n_keep; k++) {
        int gi = order[k];
        mpt_kernel *K = &p->kernels[k];
        K->kind = group_kind(F, gi, &K->root);
        K->nodes = dup_sorted(&F->grp[gi].mem);
        K->n_nodes = F->grp[gi].mem.n;
        outs.n = 0;
        group_outputs(F, gi, &outs);
        K->outputs = dup_sorted(&outs);
        K->n_outputs = outs.n;
        ins.n = 0;
        group_inputs(F, gi, &ins);
        K->inputs = dup_sorted(&ins);
        K->n_inputs = ins.n;
        for (int i = 0; i < K->n_nodes; i++)
            if (F->home[K->nodes[i]] == gi) p->kernel_of[K->nodes[i]] = k;
    }
    /* a node recomputed everywhere it is read belongs to its first reader */
    for (int k = 0; k < n_keep; k++)
        for (int i = 0; i < p->kernels[k].n_nodes; i++)
            if (p->kernel_of[p->kernels[k].nodes[i]] < 0) p->kernel_of[p->kernels[k].nodes[i]] = k;
    /* a view's bytes are written where its root's are */
    p->view_of = malloc(((size_t)F->n + 1) * sizeof *p->view_of);
    assert(p->view_of);
    memcpy(p->view_of, F->view_of, (size_t)F->n * sizeof *p->view_of);
    for (int i = 0; i < F->n; i++)
        if (F->view_of[i] >= 0) {
            p->kernel_of[i] = p->kernel_of[F->view_of[i]];
            p->n_views++;
        }
    free(ins.v);
    free(outs.v);
    free(order);
    free(keep);
}
