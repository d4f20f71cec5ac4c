/* ir/train_impl.h — private to ir/train.c, train_dist.c, loss.c and optim.c: the
 * pieces the train-step builder assembles. All of them append f32 nodes
 * with the builder and report user errors as messages, never asserts. */
#ifndef MPT_IR_TRAIN_IMPL_H
#define MPT_IR_TRAIN_IMPL_H

#include "ir/ir.h"

/* An f32 constant v widened to shape s. */
int mpt_train_const_like(mpt_graph *g, double v, mpt_shape s);

/* Adds INPUT "y" for the loss: i32 [B] for sparse categorical
 * crossentropy, else f32 of the output's shape. Returns its id, or -1 with
 * a message when the output's shape does not suit the loss. */
int mpt_train_add_labels(mpt_graph *g, mpt_loss_kind loss, int output, char *err,
                         size_t errlen);

/* The mean loss over the batch (f32 scalar) from the model's output and,
 * when >= 0, its logits; y is the labels input. */
int mpt_train_loss(mpt_graph *g, mpt_loss_kind loss, int output, int logits, int y);

/* How many predictions of the batch match y (f32 scalar), Keras' accuracy
 * for the loss: sparse categorical, categorical, or binary for a single
 * output unit. -1 with a message for outputs of rank above 2. */
int mpt_train_correct(mpt_graph *g, mpt_loss_kind loss, int output, int y, char *err,
                      size_t errlen);

/* The batch's sum of per-example mean |y - output| (squared: (y - output)^2)
 * over an example's elements, f32 scalar; -1 with a message where y is not
 * of the output's shape (class ids). */
int mpt_train_errors(mpt_graph *g, mpt_loss_kind loss, int output, int y, int squared,
                     char *err, size_t errlen);

/* How many examples have their true class among the k highest outputs
 * (f32 scalar); -1 with a message for outputs that are not [batch, classes]. */
int mpt_train_top_k(mpt_graph *g, mpt_loss_kind loss, int output, int y, int k, char *err,
                    size_t errlen);

/* ---- ir/train_dist.c: data parallelism (ranks > 1) ---- */

/* Sets rank_stride on the draws whose leading dim is the batch. */
void mpt_train_rank_draws(mpt_graph *g, int ranks);
/* value's mean over the ranks, in its own dtype (summed in f32). */
int mpt_train_rank_mean(mpt_graph *g, int value, int ranks);
/* The SCATTER_ADD an embedding's gradient is (behind a cast), or -1. */
int mpt_train_scatter_of(const mpt_graph *g, int grad);
/* The ranks' sum of that gradient from their all-gathered (ids, rows), or
 * -1 where summing the dense table moves fewer values. */
int mpt_train_sparse_sum(mpt_graph *g, int scatter, int ranks);
/* The ranks' sums of grads[i] for each i with sum[i] set (f32 values),
 * replaced in place: an ALLREDUCE each (a backend sends them in buckets:
 * mpt_plan_buckets, fusion/fusion.h). */
void mpt_train_sum_grads(mpt_graph *g, int *grads, const char *sum, int n);

/* Checks hyperparameters; 0, or -1 with a message. */
int mpt_optim_check(const mpt_optimizer_config *c, char *err, size_t errlen);

/* Appends the optimizer step for vars[i] with gradient grads[i] (f32, the
 * variable's shape): its slot variables, "optimizer/iterations" and every
 * new value. Writes the (variable, new value) pairs to ups (room for
 * 4 * n + 1) and returns how many; *lr gets this step's learning rate
 * (an f32 scalar node). vars[i] may be a value other than a VARIABLE (a
 * rank's shard of one); names[i] then names it for its slots ("<name>/m")
 * and weight decay's exclusions (names NULL: the variables' own). */
int mpt_optim_build(mpt_graph *g, const mpt_optimizer_config *c, const int *vars,
                    const char *const *names, const int *grads, int n, mpt_update *ups,
                    int *lr);

/* ---- ir/schedule.c: what every optimizer shares ---- */

/* Checks a schedule's arguments; 0, or -1 with a message. */
int mpt_lr_check(const mpt_lr_schedule *s, char *err, size_t errlen);
/* This step's learning rate, an f32 scalar: the state variable
 * "optimizer/learning_rate" for a constant one, else the schedule of
 * iterations (i32, the applied steps before this one). */
int mpt_lr_build(mpt_graph *g, const mpt_optimizer_config *c, int iterations);
/* clipnorm, global_clipnorm or clipvalue (whichever is set) over the
 * gradients grads[0..n), replaced in place */
void mpt_clip_build(mpt_graph *g, const mpt_optimizer_config *c, int *grads, int n);
/* 1 when weight decay is on and no exclude pattern matches var_name */
int mpt_decay_applies(const mpt_optimizer_config *c, const char *var_name);
/* w - w * weight_decay * lr: the value the update then starts from */
int mpt_decay_build(mpt_graph *g, const mpt_optimizer_config *c, int w, int lr);

#endif
