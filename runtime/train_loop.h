/* runtime/train_loop.h — the training loop behind `mptc train` (private to
 * runtime/). */
#ifndef MPT_TRAIN_LOOP_H
#define MPT_TRAIN_LOOP_H

#include "runtime/data.h"
#include "runtime/runtime.h"

typedef struct {
    mpt_compile_opts copts;
    uint64_t seed;
    int seed_set;
    long epochs, steps_per_epoch, max_steps, max_skipped, save_every;
    double validation_split; /* < 0: the train block's */
    const char *data, *log_path, *save_path, *resume_path, *init_weights;
    int no_test, quiet, profile;
    int compare_fusion; /* run one step fused and unfused, report, exit */
} mpt_train_run;

int mpt_train_main(const mpt_train_run *r);

/* Evaluates the session's eval step over a whole data set (the last batch
 * padded, only real rows counted). */
int mpt_evaluate(mpt_session *s, mpt_dataset *d, double *loss, double *accuracy, char *err,
                 size_t n);

/* After a run of skipped steps: re-runs the step op by op on the
 * interpreter and prints the first op whose value was not finite, its layer
 * and whether it is in the forward or backward pass, with a hint. */
void mpt_report_nonfinite(mpt_session *s, const mpt_tensor *inputs, FILE *f);

/* A data set whose class ids reach past the model's output units (whose
 * rows would become all-zero one-hot rows and add nothing to the loss):
 * -1, said on stderr naming the largest label; 0 when it fits or d has
 * no class ids. what: "training", "validation", "test", ... */
int mpt_check_labels(const mpt_session *s, const mpt_dataset *d, const char *what,
                     const char *spec);

/* ---- train_epochs.c: the epochs of a run ---- */

typedef struct {
    int x, y;                         /* INPUT order of "x" and "y" */
    int loss, correct, scale, finite; /* output indices, -1 when absent */
} step_io_idx;

typedef struct {
    const mpt_train_run *r;
    mpt_session *s;
    mpt_dataset *train, *val;
    FILE *logf;                     /* --log, or NULL */
    step_io_idx io;
    mpt_tensor *in, *in_next, *out; /* this batch, the one read ahead (or NULL), outputs */
    uint64_t seed;
    long epochs, max_skipped;
    int64_t nb;                     /* steps an epoch */
    long global;                    /* steps taken, a resumed run's included */
    int scaling, tty;
    int signal;                     /* the SIGINT/SIGTERM that stopped the run, or 0 */
    char err[4096];
} mpt_train_state;

enum { MPT_RUN_DONE, MPT_RUN_INTERRUPTED, MPT_RUN_NONFINITE, MPT_RUN_FAILED };

/* Runs the epochs from step R->global on: MPT_RUN_DONE, or how it ended
 * early (each said on stderr). SIGINT and SIGTERM are caught meanwhile:
 * the step running finishes, then MPT_RUN_INTERRUPTED with R->signal. */
int mpt_train_epochs(mpt_train_state *R);
/* --save's checkpoint at step R->global; -1 said on stderr */
int mpt_train_save(mpt_train_state *R);
/* the log's "test" line; -1 when it cannot be written (said) */
int mpt_train_log_test(mpt_train_state *R, double loss, double accuracy);

#endif
