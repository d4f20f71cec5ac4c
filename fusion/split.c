/* fusion/split.c — a reduction kernel whose own work reads its reductions'
 * results, cut into passes for backends that reduce in parallel blocks.
 *
 * Batch norm's gradient is the case: dx = f(dy, x, sum(dy), sum(dy*xhat))
 * reads the two sums at every element, and the bias gradient of the layer
 * before it reduces dx again. Fusion puts all of it in one reduction
 * kernel, which a CPU thread runs well (columns in registers, two sweeps
 * over cached rows). A GPU kernel that reads its own sums must hold each
 * column's rows in one block, and with few columns that is one block for
 * the whole tensor: convnet's bn_1 gradient over 524,288 rows and 32
 * channels ran as one block of 256 threads on an H100 (52.6 ms a step at
 * batch 32, against JAX's 2.2). Cut at each reduction that is read inside
 * the kernel, every pass reduces or writes rows independently and splits
 * them over many blocks; each pass reads the inputs again, which costs a
 * few tens of microseconds where one block cost milliseconds.
 *
 * Each member gets a pass: the number of the kernel's reductions on its
 * longest path within the kernel. A reduction's result and what is
 * computed from results alone (the [C]-sized arithmetic of batch norm's
 * gradient) belong to the pass of the reductions they read: that pass's
 * epilogue computes them and writes them, small, for the next pass to
 * broadcast. An element-level value a later pass needs is recomputed
 * there (a clone) rather than written and read back at full size. */
#include <stdlib.h>
#include <string.h>

#include "fusion/fusion_impl.h"

/* rows per result under which one block per column group is fast enough */
#define SPLIT_MIN_ROWS 2048
/* results above which the one-pass kernel has blocks enough anyway */
#define SPLIT_MAX_RESULTS 65536

static int64_t numel(const fuser *F, int id) { return mpt_shape_numel(F->g->nodes[id].shape); }

static int is_red(const fuser *F, int id) { return cls(F, id) == MPT_FCLS_REDUCE; }

/* Clones node q (and the element-level members of group `from` it reads)
 * into group gi, where a later pass needs it. */
static void clone_into(fuser *F, int q, int from, int gi, int64_t big) {
    if (in_group(F, gi, q)) return;
    ivec_push(&F->clones[q], gi);
    ivec_push(&F->grp[gi].mem, q);
    const mpt_node *nd = &F->g->nodes[q];
    for (int k = 0; k < nd->n_in; k++) {
        int r = nd->in[k];
        if (in_group(F, from, r) && !is_red(F, r) && numel(F, r) == big) clone_into(F, r, from, gi, big);
    }
}

static int new_group(fuser *F, int64_t main_numel) {
    F->grp = realloc(F->grp, ((size_t)F->n_grp + 2) * sizeof *F->grp);
    assert(F->grp && "out of memory in fusion");
    group *G = &F->grp[F->n_grp];
    memset(G, 0, sizeof *G);
    G->root = -1;
    G->red_in = -1;
    G->red_ref = -1;
    G->main_numel = main_numel;
    return F->n_grp++;
}

/* Sets n_red, red_in, red_ref and main_numel of group gi from its members
 * at home; a pass without reductions is a loop over the rows. */
static void renote(fuser *F, int gi, int64_t big, int64_t small) {
    group *G = &F->grp[gi];
    G->n_red = 0;
    G->red_ref = -1;
    for (int i = 0; i < G->mem.n; i++) {
        int m = G->mem.v[i];
        if (F->home[m] != gi || !is_red(F, m)) continue;
        G->n_red++;
        if (G->red_ref < 0) G->red_ref = m;
    }
    G->red_in = G->n_red ? big : -1;
    G->main_numel = G->n_red ? small : big;
}

static void split_group(fuser *F, int gi, void (*refuse)(fuser *, int, int, const char *)) {
    group *G = &F->grp[gi];
    int64_t big = G->red_in, small = G->main_numel;
    /* members in node order (ids are topological) */
    int n = G->mem.n;
    int *mem = malloc(((size_t)n + 1) * sizeof *mem);
    int *pass = calloc((size_t)F->n + 1, sizeof *pass);
    assert(mem && pass);
    memcpy(mem, G->mem.v, (size_t)n * sizeof *mem);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && mem[j - 1] > mem[j]; j--) {
            int t = mem[j];
            mem[j] = mem[j - 1];
            mem[j - 1] = t;
        }
    /* depth: reductions on the longest path within the kernel */
    int deepest = 0;
    for (int i = 0; i < n; i++) {
        int m = mem[i], d = 0;
        const mpt_node *nd = &F->g->nodes[m];
        for (int k = 0; k < nd->n_in; k++) {
            int q = nd->in[k];
            if (!in_group(F, gi, q)) continue;
            int dq = pass[q] + is_red(F, q);
            if (dq > d) d = dq;
        }
        pass[m] = d;
        if (d > deepest) deepest = d;
    }
    /* the pass: a result-sized value computed from depth-d results belongs
     * to pass d - 1, whose epilogue has them */
    int cut = 0;
    for (int i = 0; i < n; i++) {
        int m = mem[i];
        if (!is_red(F, m) && numel(F, m) != big && pass[m] > 0) pass[m]--;
        if (pass[m] > 0 && numel(F, m) == big) cut = 1;
    }
    if (!cut) { /* no row-sized work reads a result: one pass already */
        free(pass);
        free(mem);
        return;
    }
    int *grp_of = malloc(((size_t)deepest + 2) * sizeof *grp_of);
    assert(grp_of);
    grp_of[0] = gi;
    for (int d = 1; d <= deepest; d++) grp_of[d] = new_group(F, small);
    /* move each member to its pass (home, or as a clone) */
    for (int i = 0; i < n; i++) {
        int m = mem[i], to = grp_of[pass[m]];
        if (to == gi) continue;
        ivec_remove(&F->grp[gi].mem, m);
        ivec_push(&F->grp[to].mem, m);
        if (F->home[m] == gi) F->home[m] = to;
        else {
            ivec_remove(&F->clones[m], gi);
            ivec_push(&F->clones[m], to);
        }
    }
    /* row-sized values of earlier passes are recomputed where read; the
     * cut edges are recorded for --explain */
    for (int i = 0; i < n; i++) {
        int m = mem[i], to = grp_of[pass[m]];
        const mpt_node *nd = &F->g->nodes[m];
        for (int k = 0; k < nd->n_in; k++) {
            int q = nd->in[k];
            if (in_group(F, to, q) || pass[q] >= pass[m] || cls(F, q) == MPT_FCLS_SOURCE) continue;
            int from = grp_of[pass[q]];
            if (!in_group(F, from, q)) continue;
            if ((!is_red(F, q) && numel(F, q) == big) || F->home[q] != from) {
                clone_into(F, q, from, to, big); /* row-sized, or a clone already */
            } else if (F->home[q] == from) {
                refuse(F, q, m, "a reduction's result read by row-sized work of its own kernel: "
                                "cut into passes so each splits its rows over many blocks (GPU)");
            }
        }
    }
    for (int d = 0; d <= deepest; d++) renote(F, grp_of[d], big, small);
    free(grp_of);
    free(pass);
    free(mem);
}

void mpt_fuse_split_chains(fuser *F, void (*refuse)(fuser *, int, int, const char *)) {
    /* MPTC_FUSION_CHAIN_ROWS sets another least (tests cut small models) */
    const char *env = getenv("MPTC_FUSION_CHAIN_ROWS");
    int64_t least = env && atoll(env) > 0 ? atoll(env) : SPLIT_MIN_ROWS;
    int n0 = F->n_grp;
    for (int gi = 0; gi < n0; gi++) {
        const group *G = &F->grp[gi];
        if (!G->mem.n || G->root >= 0 || !G->n_red || G->red_in < 0) continue;
        if (G->main_numel > SPLIT_MAX_RESULTS || G->red_in / G->main_numel < least)
            continue;
        int opaque = 0;
        for (int i = 0; i < G->mem.n; i++) opaque |= cls(F, G->mem.v[i]) == MPT_FCLS_OPAQUE;
        if (!opaque) split_group(F, gi, refuse);
    }
}
