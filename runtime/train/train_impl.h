/* runtime/train/train_impl.h — private to runtime/train/: the callbacks
 * of the train block (callbacks.c), which train_epochs.c calls at the end
 * of every epoch and of the run. */
#ifndef MPT_RUNTIME_TRAIN_IMPL_H
#define MPT_RUNTIME_TRAIN_IMPL_H

#include "runtime/train/train.h"

/* One epoch's logs, Keras' names: "loss", "accuracy", ..., "val_loss",
 * "val_accuracy", ..., "learning_rate". */
#define MPT_MAX_LOGS 16
typedef struct {
    char name[MPT_MAX_LOGS][32];
    double value[MPT_MAX_LOGS];
    int n;
} mpt_epoch_logs;

void mpt_logs_add(mpt_epoch_logs *l, const char *prefix, const char *name, double v);

typedef struct {
    const mpt_callback_config *cfg;
    int higher_is_better;
    double best;
    long wait, cooldown, best_epoch;
    mpt_tensor *best_weights; /* early_stopping(restore_best_weights=true) */
} mpt_callback_state;

typedef struct mpt_callbacks {
    mpt_callback_state cb[MPT_MAX_CALLBACKS];
    int n;
    int lr_var; /* state index of "optimizer/learning_rate", or -1 (a schedule) */
    int n_vars;
} mpt_callbacks;

/* Checks every callback's monitor against what the run logs (the metrics
 * asked for, val_* only with validation data) and that a
 * reduce_lr_on_plateau has a learning rate to set. 0, or -1 said on
 * stderr with a hint. */
int mpt_callbacks_init(mpt_callbacks *c, mpt_session *s, int has_val);
/* After epoch `epoch` (1-based) and its validation: each callback's
 * decision, printed as Keras prints it. *stop is set when early stopping
 * ends the run. -1 when a checkpoint cannot be written (said). */
int mpt_callbacks_epoch_end(mpt_callbacks *c, mpt_train_state *R, long epoch,
                            const mpt_epoch_logs *logs, int *stop);
/* At the end of the run: early stopping's best weights restored. */
int mpt_callbacks_train_end(mpt_callbacks *c, mpt_train_state *R);
void mpt_callbacks_free(mpt_callbacks *c);

/* The learning rate in the state (after any reduce_lr_on_plateau), or
 * -1 when a schedule computes it. */
double mpt_session_learning_rate(mpt_session *s);

#endif
