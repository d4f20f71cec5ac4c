/* ir/loss.c — losses and the accuracy count of the train and eval steps,
 * lowered to primitive f32 ops, as Keras computes them:
 *
 *  - crossentropy from logits (the forward graph has "logits" when it ends
 *    in a softmax): log-softmax in f32, shifted by the row maximum, so a
 *    low-precision model never takes an f16 log;
 *  - crossentropy from probabilities (no logits): Keras clips to
 *    [1e-7, 1 - 1e-7] and takes the log; categorical first renormalises the
 *    rows to sum 1, sparse takes the log-softmax of the clipped logs, which
 *    is the same renormalisation after clipping (both exactly as tf.keras);
 *  - mean squared error: the mean over every element;
 *  - every loss is the mean over the batch ("sum over batch size");
 *  - an output of more dims, [B, ..., C] (a language model's [B, T, V]),
 *    has classes on its last axis and a label per position ([B, ..., ]
 *    class ids, or [B, ..., C] targets); the loss is the mean over every
 *    position, as Keras' SparseCategoricalCrossentropy on such outputs,
 *    and accuracy counts each example's fraction of right positions, so
 *    the runtime's mean over examples is the mean over positions.
 */
#include <assert.h>
#include <stdio.h>

#include "ir/train_impl.h"

#define KERAS_EPSILON 1e-7 /* backend.epsilon() */

int mpt_train_const_like(mpt_graph *g, double v, mpt_shape s) {
    return mpt_b_broadcast_to(g, mpt_b_scalar(g, MPT_DT_F32, v), s);
}

/* a [B] vector widened along the class dim of s [B, C] */
static int rows_like(mpt_graph *g, int v, mpt_shape s) { return mpt_b_broadcast(g, v, s, 1); }

int mpt_train_add_labels(mpt_graph *g, mpt_loss_kind loss, int output, char *err,
                         size_t errlen) {
    mpt_shape os = g->nodes[output].shape;
    char buf[64];
    switch (loss) {
    case MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY:
    case MPT_LOSS_CATEGORICAL_CROSSENTROPY:
        if (os.rank < 2) {
            snprintf(err, errlen,
                     "%s needs a model output of shape [batch, classes] (or [batch, ..., "
                     "classes]: a label per position), not %s (hint: end the model with a "
                     "dense layer of one unit per class)",
                     mpt_loss_name(loss), mpt_shape_str(os, buf, sizeof buf));
            return -1;
        }
        if (loss == MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY) {
            mpt_shape ys = os;
            ys.rank--; /* one class id a position */
            return mpt_b_input(g, "y", MPT_DT_I32, ys);
        }
        return mpt_b_input(g, "y", MPT_DT_F32, os);
    case MPT_LOSS_MEAN_SQUARED_ERROR:
        if (os.rank < 1) {
            snprintf(err, errlen, "mean_squared_error needs a batch dim in the model output");
            return -1;
        }
        return mpt_b_input(g, "y", MPT_DT_F32, os);
    case MPT_LOSS_COUNT:
        break;
    }
    snprintf(err, errlen, "unknown loss (expected sparse_categorical_crossentropy, "
                          "categorical_crossentropy or mean_squared_error)");
    return -1;
}

/* Per-example crossentropy [B] of targets t [B, C] against log-probs. */
static int xent_rows(mpt_graph *g, int t, int logp) {
    return mpt_b_unary(g, MPT_OP_NEG, mpt_b_reduce(g, MPT_OP_REDUCE_SUM,
                                                   mpt_b_binary(g, MPT_OP_MUL, t, logp), 2));
}

/* log-softmax of f32 logits [B, C] */
static int log_softmax(mpt_graph *g, int logits) {
    mpt_shape s = g->nodes[logits].shape;
    int m = mpt_b_reduce(g, MPT_OP_REDUCE_MAX, logits, 2);
    int z = mpt_b_binary(g, MPT_OP_SUB, logits, rows_like(g, m, s));
    int sum = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_unary(g, MPT_OP_EXP, z), 2);
    return mpt_b_binary(g, MPT_OP_SUB, z, rows_like(g, mpt_b_unary(g, MPT_OP_LOG, sum), s));
}

/* When out is the model's own f32 softmax of logits along the last axis
 * (div(exp(z), bcast(sum(exp(z)))), z = x - bcast(max(x)), x the logits
 * or their f32 cast), the log-softmax from its z and sum: the same values
 * as log_softmax computes, and the step takes the row maximum, the exps
 * and their sums once instead of twice (GPT's [2048, 256] logits: a
 * reduction kernel and 0.5 ms of exps at one thread). -1 if not. */
static int log_softmax_of_output(const mpt_graph *g0, int out, int logits) {
    const mpt_node *n = g0->nodes;
    if (out < 0 || logits < 0 || n[out].op != MPT_OP_DIV || n[out].dtype != MPT_DT_F32) return -1;
    int e = n[out].in[0], b = n[out].in[1];
    int rank = n[out].shape.rank;
    int64_t last = (int64_t)1 << (rank - 1), kept = last - 1;
    if (n[b].op != MPT_OP_BROADCAST || n[b].attr.i[0] != kept) return -1;
    int sum = n[b].in[0];
    if (n[sum].op != MPT_OP_REDUCE_SUM || n[sum].in[0] != e || n[sum].attr.i[0] != last) return -1;
    if (n[e].op != MPT_OP_EXP) return -1;
    int z = n[e].in[0];
    if (n[z].op != MPT_OP_SUB) return -1;
    int x = n[z].in[0], bm = n[z].in[1];
    if (x != logits && !(n[x].op == MPT_OP_CAST && n[x].in[0] == logits)) return -1;
    if (n[bm].op != MPT_OP_BROADCAST || n[bm].attr.i[0] != kept) return -1;
    int m = n[bm].in[0];
    if (n[m].op != MPT_OP_REDUCE_MAX || n[m].in[0] != x || n[m].attr.i[0] != last) return -1;
    return sum;
}

static int clip_probs(mpt_graph *g, int p) {
    mpt_shape s = g->nodes[p].shape;
    int lo = mpt_train_const_like(g, KERAS_EPSILON, s);
    int hi = mpt_train_const_like(g, 1.0 - KERAS_EPSILON, s);
    return mpt_b_binary(g, MPT_OP_MIN, mpt_b_binary(g, MPT_OP_MAX, p, lo), hi);
}

/* [B, ..., C] as [N, C] (N positions), and its labels as [N] or [N, C] */
static int positions(mpt_graph *g, int x, int64_t n, int keep_last) {
    if (x < 0) return x;
    mpt_shape s = g->nodes[x].shape;
    if (keep_last && s.rank == 2) return x;
    if (!keep_last && s.rank == 1) return x;
    return mpt_b_reshape(g, x, keep_last ? mpt_shape_2(n, s.dim[s.rank - 1]) : mpt_shape_1(n));
}

int mpt_train_loss(mpt_graph *g, mpt_loss_kind loss, int output, int logits, int y) {
    int out = mpt_b_cast(g, output, MPT_DT_F32);
    mpt_shape s = g->nodes[out].shape;
    int shared = -1; /* the log-softmax from the output's own softmax */
    if (loss != MPT_LOSS_MEAN_SQUARED_ERROR) {
        int sum = log_softmax_of_output(g, out, logits);
        if (sum >= 0) {
            int z = g->nodes[g->nodes[sum].in[0]].in[0];
            shared = mpt_b_binary(g, MPT_OP_SUB, z,
                                  mpt_b_broadcast(g, mpt_b_unary(g, MPT_OP_LOG, sum), s,
                                                  ((int64_t)1 << (s.rank - 1)) - 1));
        }
    }
    if (loss != MPT_LOSS_MEAN_SQUARED_ERROR && s.rank > 2) {
        int64_t n = mpt_shape_numel(s) / s.dim[s.rank - 1];
        out = positions(g, out, n, 1);
        logits = positions(g, logits, n, 1);
        shared = positions(g, shared, n, 1);
        y = positions(g, y, n, loss == MPT_LOSS_CATEGORICAL_CROSSENTROPY);
        s = g->nodes[out].shape;
    }
    int per = -1; /* per-example losses [B] */
    switch (loss) {
    case MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY:
    case MPT_LOSS_CATEGORICAL_CROSSENTROPY: {
        int t = loss == MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY
                    ? mpt_b_one_hot(g, y, (int)s.dim[1], MPT_DT_F32)
                    : y;
        int logp;
        if (shared >= 0) {
            logp = shared;
        } else if (logits >= 0) {
            logp = log_softmax(g, mpt_b_cast(g, logits, MPT_DT_F32));
        } else if (loss == MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY) {
            logp = log_softmax(g, mpt_b_unary(g, MPT_OP_LOG, clip_probs(g, out)));
        } else {
            int sum = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, out, 2);
            int norm = mpt_b_binary(g, MPT_OP_DIV, out, rows_like(g, sum, s));
            logp = mpt_b_unary(g, MPT_OP_LOG, clip_probs(g, norm));
        }
        per = xent_rows(g, t, logp);
        break;
    }
    case MPT_LOSS_MEAN_SQUARED_ERROR: {
        int sq = mpt_b_unary(g, MPT_OP_SQUARE, mpt_b_binary(g, MPT_OP_SUB, out, y));
        int64_t all = (1LL << s.rank) - 1;
        int total = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, sq, all);
        return mpt_b_binary(g, MPT_OP_DIV, total,
                            mpt_b_scalar(g, MPT_DT_F32, (double)mpt_shape_numel(s)));
    }
    case MPT_LOSS_COUNT:
        assert(!"mpt_train_loss: not a loss (checked by mpt_train_add_labels)");
        return -1;
    }
    int total = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, per, 1);
    return mpt_b_binary(g, MPT_OP_DIV, total, mpt_b_scalar(g, MPT_DT_F32, (double)s.dim[0]));
}

/* A per-position count [N positions] as a count of examples: / (N / B) */
static int per_example(mpt_graph *g, int count, mpt_shape s) {
    int64_t per = mpt_shape_numel(s) / s.dim[s.rank - 1] / s.dim[0];
    return per == 1 ? count : mpt_b_binary(g, MPT_OP_DIV, count, mpt_b_scalar(g, MPT_DT_F32, (double)per));
}

int mpt_train_correct(mpt_graph *g, mpt_loss_kind loss, int output, int y, char *err,
                      size_t errlen) {
    mpt_shape s = g->nodes[output].shape;
    char buf[64];
    if (s.rank > 2 && loss != MPT_LOSS_MEAN_SQUARED_ERROR) {
        int64_t n = mpt_shape_numel(s) / s.dim[s.rank - 1];
        int c = mpt_train_correct(g, loss, positions(g, output, n, 1),
                                  positions(g, y, n, loss == MPT_LOSS_CATEGORICAL_CROSSENTROPY),
                                  err, errlen);
        return c < 0 ? c : per_example(g, c, s);
    }
    if (s.rank < 1 || s.rank > 2) {
        snprintf(err, errlen,
                 "accuracy needs a model output of shape [batch] or [batch, classes], not %s "
                 "(hint: drop `accuracy` from metrics for this model)",
                 mpt_shape_str(s, buf, sizeof buf));
        return -1;
    }
    int hit; /* bool, one per example */
    int binary = s.rank == 1 || s.dim[1] == 1;
    if (loss == MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY) {
        hit = mpt_b_binary(g, MPT_OP_EQ, mpt_b_argmax(g, output, 1), y);
    } else if (loss == MPT_LOSS_CATEGORICAL_CROSSENTROPY || !binary) {
        hit = mpt_b_binary(g, MPT_OP_EQ, mpt_b_argmax(g, output, 1), mpt_b_argmax(g, y, 1));
    } else {
        /* Keras' binary_accuracy: threshold 0.5, compared with y as given */
        int out = mpt_b_cast(g, output, MPT_DT_F32);
        int above = mpt_b_binary(g, MPT_OP_GT, out, mpt_train_const_like(g, 0.5, s));
        hit = mpt_b_binary(g, MPT_OP_EQ, mpt_b_cast(g, above, MPT_DT_F32), y);
    }
    int ones = mpt_b_cast(g, hit, MPT_DT_F32);
    int64_t all = (1LL << g->nodes[ones].shape.rank) - 1;
    return mpt_b_reduce(g, MPT_OP_REDUCE_SUM, ones, all);
}

int mpt_train_errors(mpt_graph *g, mpt_loss_kind loss, int output, int y, int squared,
                     char *err, size_t errlen) {
    const char *name = squared ? "mse" : "mae";
    if (loss == MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY) {
        snprintf(err, errlen, "%s compares targets of the model output's shape, but "
                 "sparse_categorical_crossentropy gives class ids (hint: use accuracy or "
                 "top_k_accuracy with class ids; %s with mean_squared_error or "
                 "categorical_crossentropy)", name, name);
        return -1;
    }
    mpt_shape s = g->nodes[output].shape;
    int d = mpt_b_binary(g, MPT_OP_SUB, y, mpt_b_cast(g, output, MPT_DT_F32));
    int e = mpt_b_unary(g, squared ? MPT_OP_SQUARE : MPT_OP_ABS, d);
    int64_t all = (1LL << s.rank) - 1, per = s.rank ? mpt_shape_numel(s) / s.dim[0] : 1;
    int total = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, e, all);
    return mpt_b_binary(g, MPT_OP_DIV, total, mpt_b_scalar(g, MPT_DT_F32, (double)per));
}

int mpt_train_top_k(mpt_graph *g, mpt_loss_kind loss, int output, int y, int k, char *err,
                    size_t errlen) {
    mpt_shape s = g->nodes[output].shape;
    char buf[64];
    if (s.rank > 2 && loss != MPT_LOSS_MEAN_SQUARED_ERROR) {
        int64_t n = mpt_shape_numel(s) / s.dim[s.rank - 1];
        int c = mpt_train_top_k(g, loss, positions(g, output, n, 1),
                                positions(g, y, n, loss == MPT_LOSS_CATEGORICAL_CROSSENTROPY), k,
                                err, errlen);
        return c < 0 ? c : per_example(g, c, s);
    }
    if (s.rank != 2 || loss == MPT_LOSS_MEAN_SQUARED_ERROR) {
        snprintf(err, errlen, "top_k_accuracy needs class scores [batch, classes] and class "
                 "labels (a crossentropy loss), not %s with %s", mpt_shape_str(s, buf, sizeof buf),
                 mpt_loss_name(loss));
        return -1;
    }
    int out = mpt_b_cast(g, output, MPT_DT_F32);
    /* the true class's score: one-hot of the label (or of the target's
     * largest entry) times the scores, summed over the classes */
    int ids = loss == MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY ? y : mpt_b_argmax(g, y, 1);
    int onehot = mpt_b_one_hot(g, ids, (int)s.dim[1], MPT_DT_F32);
    int mine = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_binary(g, MPT_OP_MUL, onehot, out), 2);
    int above = mpt_b_binary(g, MPT_OP_GT, out, rows_like(g, mine, s));
    int n_above = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_cast(g, above, MPT_DT_F32), 2);
    int in = mpt_b_binary(g, MPT_OP_LT, n_above,
                          mpt_train_const_like(g, (double)k, g->nodes[n_above].shape));
    return mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_cast(g, in, MPT_DT_F32), 1);
}
