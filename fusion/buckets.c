/* fusion/buckets.c — data parallelism's buckets: which of a plan's
 * ALLREDUCE kernels a backend sends as one message (fusion/fusion.h). The
 * train step sums each gradient with an ALLREDUCE of its own (ir/train.c),
 * placed by the plan where the gradient is final; grouping them here, in
 * plan order, gives the buckets the order in which the backward pass fills
 * them, with no copy in the graph. */
#include <stdlib.h>

#include "fusion/fusion.h"

static int is_allreduce(const mpt_plan *p, int k) {
    const mpt_kernel *kk = &p->kernels[k];
    return kk->kind == MPT_KERNEL_OPAQUE && p->g->nodes[kk->root].op == MPT_OP_ALLREDUCE;
}

/* the first kernel after k that reads its value, itself or through a
 * view of it (fusion/views.c), or n_kernels */
static int first_reader(const mpt_plan *p, int k) {
    int node = p->kernels[k].root;
    for (int j = k + 1; j < p->n_kernels; j++)
        for (int i = 0; i < p->kernels[j].n_inputs; i++)
            if (mpt_plan_storage(p, p->kernels[j].inputs[i]) == node) return j;
    return p->n_kernels;
}

void mpt_buckets_free(mpt_buckets *b) {
    for (int i = 0; b && i < b->n; i++) free(b->b[i].members);
    if (b) free(b->b);
    if (b) b->b = NULL, b->n = 0;
}

int mpt_plan_buckets(const mpt_plan *p, int64_t bucket_bytes, mpt_buckets *out) {
    out->b = calloc((size_t)p->n_kernels + 1, sizeof *out->b);
    out->n = 0;
    if (!out->b) return -1;
    mpt_bucket *cur = NULL;
    for (int k = 0; k < p->n_kernels; k++) {
        if (!is_allreduce(p, k)) continue;
        const mpt_node *nd = &p->g->nodes[p->kernels[k].root];
        int64_t bytes = mpt_shape_numel(nd->shape) * (int64_t)mpt_dtype_size(nd->dtype);
        int reader = first_reader(p, k);
        /* a member's reader runs before this kernel, or the bucket is full */
        if (cur && (bucket_bytes <= 0 || cur->wait_before <= k ||
                    cur->bytes + bytes > bucket_bytes || nd->dtype != p->g->nodes[
                        p->kernels[cur->members[0]].root].dtype))
            cur = NULL;
        if (!cur) {
            cur = &out->b[out->n++];
            if (!(cur->members = malloc(((size_t)p->n_kernels + 1) * sizeof *cur->members))) {
                mpt_buckets_free(out);
                return -1;
            }
            cur->wait_before = p->n_kernels;
        }
        cur->members[cur->n_members++] = k;
        cur->start_after = k;
        cur->bytes += bytes;
        if (reader < cur->wait_before) cur->wait_before = reader;
    }
    return 0;
}
