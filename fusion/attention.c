/* fusion/attention.c — attention's ops (ops.def: attention, its
 * attention_lse, attention_grad) as one kernel per direction. They are
 * OPAQUE: each reads its operands from memory and nothing joins them but
 * each other; a backend runs the group as one FlashAttention kernel
 * (codegen/cpu/attention.c). */
#include "fusion/fusion_impl.h"

/* Is b a sibling of attention op a: the attention_lse of the same scores,
 * or another attention_grad of the same attention? */
static int attention_sibling(const fuser *F, int a, int b) {
    const mpt_node *x = &F->g->nodes[a], *y = &F->g->nodes[b];
    if (x->attr.f != y->attr.f) return 0;
    if (x->op == MPT_OP_ATTENTION && y->op == MPT_OP_ATTENTION_LSE)
        return x->in[0] == y->in[0] && x->in[1] == y->in[1] && x->in[3] == y->in[2] &&
               x->attr.i[0] == y->attr.i[0];
    if (x->op != MPT_OP_ATTENTION_GRAD || y->op != MPT_OP_ATTENTION_GRAD) return 0;
    for (int k = 0; k < 8; k++)
        if (x->in[k] != y->in[k]) return 0;
    for (int k = 1; k < 6; k++) /* all attrs but which */
        if (x->attr.i[k] != y->attr.i[k]) return 0;
    return 1;
}

/* One kernel per direction: an attention with the attention_lse the
 * gradient reads (the forward pass writes the row statistics beside o),
 * and the attention_grad ops of one attention (one pass over the key
 * blocks computes dq, dk and dv together). */
void mpt_fuse_attention(fuser *F, const char *(*merge)(fuser *, int, int),
                        void (*refuse)(fuser *, int, int, const char *)) {
    for (int a = 0; a < F->n; a++) {
        mpt_op op = F->g->nodes[a].op;
        if (!F->live[a] || (op != MPT_OP_ATTENTION && op != MPT_OP_ATTENTION_GRAD)) continue;
        for (int b = a + 1; b < F->n; b++) {
            if (!F->live[b] || F->home[b] == F->home[a] || !attention_sibling(F, a, b)) continue;
            const char *why = merge(F, F->home[b], F->home[a]);
            if (why) refuse(F, a, b, why);
        }
    }
}
