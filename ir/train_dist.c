/* ir/train_dist.c — what data parallelism adds to the train step
 * (ir/train.c with ranks > 1): the ranks' sums of gradients in buckets,
 * the means of the loss and of batch norm's statistics, embedding
 * gradients exchanged as (ids, rows), and each rank's slice of the
 * global batch's dropout draws. Every piece is graph ops (ALLREDUCE,
 * ALL_GATHER, ...: ir/ops.def), the same on every rank. */
#include <stdlib.h>
#include <string.h>

#include "ir/train_impl.h"

/* Data parallelism: a rank draws its dropout masks as its slice of what
 * one process draws for the global batch (the draws whose leading dim is
 * the batch: rank r's element i is the global batch's r * numel + i), so
 * N ranks drop what one process would, not the same mask N times. */
void mpt_train_rank_draws(mpt_graph *g, int ranks) {
    int x = mpt_graph_find_input(g, "x");
    if (ranks <= 1 || x < 0 || g->nodes[x].shape.rank < 1) return;
    int64_t batch = g->nodes[x].shape.dim[0];
    for (int i = 0; i < g->n_nodes; i++) {
        mpt_node *n = &g->nodes[i];
        if (n->op == MPT_OP_RANDOM_UNIFORM && n->shape.rank >= 1 && n->shape.dim[0] == batch)
            n->attr.i[1] = mpt_shape_numel(n->shape);
    }
}

/* The mean of a value across the ranks, in its own dtype (the sum in f32) */
int mpt_train_rank_mean(mpt_graph *g, int value, int ranks) {
    char layer[256] = "";
    if (mpt_b_current_layer(g)) snprintf(layer, sizeof layer, "%s", mpt_b_current_layer(g));
    mpt_b_layer(g, "allreduce");
    mpt_dtype dt = g->nodes[value].dtype;
    int sum = mpt_b_allreduce(g, mpt_b_cast(g, value, MPT_DT_F32));
    int mean = mpt_b_binary(g, MPT_OP_MUL, sum,
                            mpt_b_broadcast_to(g, mpt_b_scalar(g, MPT_DT_F32, 1.0 / ranks),
                                               g->nodes[sum].shape));
    mean = mpt_b_cast(g, mean, dt);
    mpt_b_layer(g, layer[0] ? layer : NULL);
    return mean;
}

/* An embedding's gradient: the SCATTER_ADD of the batch's rows into the
 * table (behind a cast under a mixed policy), or -1 */
int mpt_train_scatter_of(const mpt_graph *g, int grad) {
    if (g->nodes[grad].op == MPT_OP_CAST) grad = g->nodes[grad].in[0];
    return g->nodes[grad].op == MPT_OP_SCATTER_ADD ? grad : -1;
}

/* Data parallelism's embedding gradients, as the SparseOperationKit notes
 * exchange them: each rank's gradient touches only the rows of its
 * batch's ids, so where that is less to move than the dense table, the
 * ranks all-gather their (ids, rows) and every rank scatters all of them
 * into the table: the sum over ranks (f32), the same on every rank.
 * Returns it, or -1 where the dense sum moves less. */
int mpt_train_sparse_sum(mpt_graph *g, int sa, int ranks) {
    const mpt_node *s = &g->nodes[sa];
    int ids = s->in[0], rows = s->in[1];
    int64_t m = mpt_shape_numel(g->nodes[ids].shape), v = s->shape.dim[0], d = s->shape.dim[1];
    if ((double)ranks * (double)m * (double)(d + 1) >= (double)v * (double)d) return -1;
    mpt_b_layer(g, "allreduce");
    int all_ids = mpt_b_shard_op(g, MPT_OP_ALL_GATHER, mpt_b_reshape(g, ids, mpt_shape_1(m)),
                                 ranks * m);
    int flat = mpt_b_reshape(g, mpt_b_cast(g, rows, MPT_DT_F32), mpt_shape_1(m * d));
    int all_rows = mpt_b_reshape(g, mpt_b_shard_op(g, MPT_OP_ALL_GATHER, flat, ranks * m * d),
                                 mpt_shape_2(ranks * m, d));
    int sum = mpt_b_scatter_add(g, all_ids, all_rows, v);
    mpt_b_layer(g, "loss_scale");
    return sum;
}


void mpt_train_sum_grads(mpt_graph *g, int *grads, const char *sum, int n) {
    mpt_b_layer(g, "allreduce");
    /* in the order the backward pass finishes them, the last variables'
     * first: the backend's buckets (fusion/buckets.c) fill in plan order */
    for (int i = n - 1; i >= 0; i--)
        if (sum[i]) grads[i] = mpt_b_allreduce(g, grads[i]);
    mpt_b_layer(g, "loss_scale");
}
