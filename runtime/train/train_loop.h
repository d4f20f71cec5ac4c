/* runtime/train_loop.h — the training loop behind `mptc train` (private to
 * runtime/). */
#ifndef MPT_TRAIN_LOOP_H
#define MPT_TRAIN_LOOP_H

#include "runtime/data/data.h"
#include "runtime/train/runtime.h"

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

/* ---- metrics (mpt_metrics, ir/ir.h): sums over examples ---- */

enum { MPT_MET_ACCURACY, MPT_MET_MAE, MPT_MET_MSE, MPT_MET_TOP_K, MPT_N_MET };

typedef struct {
    int out[MPT_N_MET]; /* the step's output holding each sum, -1 when not asked */
    int top_k;
    double sum[MPT_N_MET];
    int64_t samples;
} mpt_metric_sums;

/* Which of g's outputs hold the metrics; sums at zero. */
void mpt_metric_sums_init(mpt_metric_sums *m, const mpt_graph *g, int top_k);
/* Adds a step's sums (its outputs outs) over `real` examples. */
void mpt_metric_sums_add(mpt_metric_sums *m, const mpt_tensor *outs, int64_t real);
/* Keras' name of metric i ("accuracy", "mae", "mse", "top_5_accuracy"),
 * written into buf (16 bytes are enough), and the mean so far (NAN before
 * any example) */
const char *mpt_metric_name(const mpt_metric_sums *m, int i, char *buf, size_t n);
double mpt_metric_mean(const mpt_metric_sums *m, int i);
/* " - accuracy: 0.8123 - mae: 0.1000" for the metrics asked, each name
 * after prefix ("val_"); into buf */
void mpt_metric_line(const mpt_metric_sums *m, const char *prefix, char *buf, size_t n);

typedef struct {
    double loss;
    mpt_metric_sums metrics;
} mpt_eval_result;

/* Evaluates the session's eval step over a whole data set (the last batch
 * padded, only real rows counted): the mean loss and every metric asked. */
int mpt_evaluate(mpt_session *s, mpt_dataset *d, mpt_eval_result *r, char *err, size_t n);

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
int mpt_train_log_test(mpt_train_state *R, const mpt_eval_result *test);

#endif
