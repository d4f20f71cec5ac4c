/* fusion/views.c — reshapes as views of their operand's buffer.
 *
 * Every value is stored row-major and contiguous, so a reshape of a value
 * in memory has exactly that value's bytes. Written out by a kernel of its
 * own (or as an extra output of its operand's kernel) it costs a write and
 * the reads of a copy: a layer norm whose output feeds the Q, K and V
 * projections wrote it three times, once per reshape a GEMM reads, and a
 * weight reshaped for a GEMM was copied every step. As XLA treats a
 * bitcast, such a reshape becomes a view: no kernel writes it, its readers
 * read its root's buffer, and the memory plan keeps that buffer alive until
 * the view's last reader (plan.c). A kernel that reads the reshape inside
 * itself still computes it in registers. */
#include "fusion/fusion_impl.h"

/* Does some group read v from memory: a group reading v that does not
 * compute it, or one reading a view of v? */
int mpt_fuse_view_read(const fuser *F, int v) {
    for (int k = F->ustart[v]; k < F->ustart[v + 1]; k++) {
        int u = F->users[k];
        if (F->view_of[u] >= 0 && mpt_fuse_view_read(F, u)) return 1;
        if (F->home[u] >= 0 && !in_group(F, F->home[u], v)) return 1;
        for (int j = 0; j < F->clones[u].n; j++)
            if (!in_group(F, F->clones[u].v[j], v)) return 1;
    }
    return 0;
}

/* Does a member of group gi other than v itself read v? */
static int read_in_group(const fuser *F, int v, int gi) {
    for (int k = F->ustart[v]; k < F->ustart[v + 1]; k++) {
        int u = F->users[k];
        if (in_group(F, gi, u)) return 1;
    }
    return 0;
}

/* The view costs no kernel and no extra bytes when its root is a source
 * (a weight reshaped for a GEMM), is in memory anyway, or is computed in
 * the reshape's own kernel, which then writes the root instead of the
 * reshape (once however many reshapes read it). A root only cloned into
 * the reshape's kernel (a broadcast) would need a kernel of its own, and
 * a root written by another kernel counts only if the reshape's kernel
 * reads it from there: the view's readers then already wait for that
 * kernel. Where the reshape's kernel recomputed the root (a cast of an
 * input), that kernel may itself wait for the view's readers (the cast
 * written beside transposes of the projections it feeds). */
static int view_pays(const fuser *F, int r, int root) {
    const mpt_node *rn = &F->g->nodes[root];
    if (rn->op == MPT_OP_CONST) return 0; /* backends inline constants: no buffer */
    if (cls(F, root) == MPT_FCLS_SOURCE) return 1;
    int hq = F->home[root];
    if (hq < 0 || F->role[root] == ROLE_PRO) return 0; /* a prologue is never written */
    int h = F->home[r];
    return hq == h || (!in_group(F, h, root) && mpt_fuse_needed_outside(F, root, hq));
}

void mpt_fuse_views(fuser *F) {
    const mpt_graph *g = F->g;
    for (int r = 0; r < F->n; r++) { /* ascending: a reshape's operand is decided first */
        const mpt_node *nd = &g->nodes[r];
        if (!F->live[r] || nd->op != MPT_OP_RESHAPE || F->is_out[r]) continue;
        int h = F->home[r], q = nd->in[0];
        int root = F->view_of[q] >= 0 ? F->view_of[q] : q;
        if (h < 0 || nd->dtype != g->nodes[root].dtype) continue;
        if (!mpt_fuse_needed_outside(F, r, h) || !view_pays(F, r, root)) continue;
        F->view_of[r] = root;
        if (!read_in_group(F, r, h)) {
            ivec_remove(&F->grp[h].mem, r);
            F->home[r] = -1;
        }
    }
}
