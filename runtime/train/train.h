/* runtime/train/train.h — compiling a model for training and training it
 * (runtime/train/): the session (session.c: lower, policy, train step,
 * fusion, a backend's compile; backend.c picks the backend), the training
 * loop (train_loop.c around train_epochs.c), evaluation and metrics,
 * checkpoints (checkpoint.c), the report of a step that was not finite
 * (nonfinite.c) and what this machine has (devices.c). The folder's whole
 * public surface. */
#ifndef MPT_RUNTIME_TRAIN_H
#define MPT_RUNTIME_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "codegen/backend.h"
#include "fusion/fusion.h"
#include "ir/ir.h"
#include "lang/lang.h"
#include "runtime/data/data.h"

/* What the command line says about compiling; NULL/0 fields mean "as the
 * .mpt file says". */
typedef struct {
    const char *path;
    const char *policy;        /* --policy */
    long batch_size;           /* --batch-size */
    int xla;                   /* 1 fused (default), 0 --no-xla */
    unsigned fusion_disable;   /* --fusion-disable */
    const char *loss_scale;    /* --loss-scale dynamic|none|N */
    long loss_scale_period;    /* --loss-scale-period */
    const char *device;        /* --device auto|cpu|cuda|interp */
    const char *moves;         /* --policy-move op=list,... */
    int want_eval;             /* also build the evaluation step */
    const char *dump_after;    /* --dump-after STAGE: print the graph after it */
    int plan_only;             /* stop after fusion: no backend, no state (check, ir) */
    long threads;              /* --threads: CPU worker threads, 0 = the usable cores */
    int tf32;                  /* --tf32: CUDA f32 GEMMs on TF32 Tensor Cores */
    int want_grads;            /* also build the gradient step (histograms) */
    const char *optimizer;     /* --optimizer: a name or a whole call */
    double learning_rate;      /* --learning-rate (0: the file's) */
    /* data parallelism (runtime/dist/): the ranks sharing each batch, 0
     * or 1 for one process. The batch size is then the global batch and
     * each rank's step is compiled for batch / ranks of it */
    int ranks;
    int shard_optimizer;       /* --shard-optimizer: ZeRO-1 over the ranks */
    double bucket_mb;          /* --bucket-mb: 0 the default (25, as PyTorch DDP's), < 0 none */
    FILE *diag;                /* diagnostics (stderr) */
} mpt_compile_opts;

/* A model compiled for training: the graphs of every stage, the plans, the
 * executables and the state. */
typedef struct {
    mpt_model *model;        /* lowered in training mode */
    mpt_model *model_eval;   /* lowered in inference mode (when want_eval) */
    mpt_policy policy;
    mpt_policy_opts popts;
    mpt_train_opts topts;
    mpt_graph *typed;        /* forward graph after the policy pass and, with
                              * --xla, the attention rewrite */
    mpt_attention_note *attn_notes; /* the rewrite's matches in typed (--xla) */
    int n_attn_notes;
    mpt_graph *train;        /* the train step */
    mpt_graph *eval;         /* the evaluation step, or NULL */
    mpt_graph *grads;        /* the gradient step (mpt_grad_step), or NULL */
    mpt_plan *grads_plan;
    mpt_exec *grads_exec;
    int *grads_var;          /* grads VARIABLE k -> index into vars */
    mpt_plan *train_plan, *eval_plan;
    mpt_backend *backend;
    mpt_exec *train_exec, *eval_exec;
    mpt_tensor *vars;        /* the train step's VARIABLEs, in node order */
    int n_vars;
    int *eval_var;           /* eval VARIABLE k -> index into vars */
    long batch_size;         /* the batch one step of this process runs */
    long global_batch;       /* batch_size x ranks: the batch of an optimizer step */
    int ranks;               /* 1, or the ranks of a data-parallel run */
    double compile_seconds;
    int cache_hits, cache_misses; /* CPU kernel cache, over this session's compiles */
    /* policy-list moves parsed from the file and the command line */
    char **move_names;
    mpt_plist *move_lists;
    int n_moves;
} mpt_session;

/* Parses, lowers, applies the policy, builds the train (and eval) step,
 * verifies after every pass, fuses, and compiles on the chosen backend.
 * Returns 0, or non-zero after printing what went wrong to opts->diag. */
int mpt_session_open(const mpt_compile_opts *opts, mpt_session **out);
void mpt_session_free(mpt_session *s);
/* The fusion patterns a plan for `backend` ("cpu", "cuda", ...; NULL:
 * the default) leaves out: --fusion-disable, and reductions in GEMM/conv
 * epilogues on CUDA, whose generated epilogue writes GEMM-shaped values
 * only. */
unsigned mpt_session_fusion_disable(const mpt_compile_opts *o, const char *backend);
/* Bytes one train step needs under its plan (activations, state, inputs). */
int64_t mpt_session_step_bytes(const mpt_session *s);
/* The largest batch whose train step fits `limit` bytes, found by doubling
 * and bisection over plan-only compiles; 0 when not even batch 1 fits, -1
 * when the model does not compile. */
long mpt_largest_batch(const mpt_compile_opts *o, int64_t limit);
/* MemAvailable of this machine, or -1 when unknown. */
int64_t mpt_host_available_bytes(void);
/* Initialises the state from the seed (model variables, slots, scale). */
int mpt_session_init_state(mpt_session *s, uint64_t seed);
/* Index of a state variable by name, or -1. */
int mpt_session_var(const mpt_session *s, const char *name);
/* Brings s->vars up to date where the backend keeps the variables in its
 * own memory (CUDA, backend.h pull_vars), and tells the evaluation step to
 * read them again. Called before anything reads s->vars on the host:
 * evaluation, checkpoints, the non-finite report. 0, or -1 with err. */
int mpt_session_pull_vars(const mpt_session *s, char *err, size_t n);

/* Opens one part of the data a spec names for the session's model: every
 * input of the model fed by name (runtime/data/data.h, mpt_data_input).
 * Batches then fill the step's inputs from "x" on (a step's first INPUTs
 * are the model's, in order; mpt_session_open checks it). */
int mpt_session_open_data(const mpt_session *s, const char *spec, mpt_data_part part,
                          mpt_dataset **out, char *err, size_t n);
/* The same from a parsed spec. */
int mpt_session_open_data_spec(const mpt_session *s, const mpt_data_spec *spec,
                               mpt_data_part part, mpt_dataset **out, char *err, size_t n);

/* Resolves the policy name: --policy, then MPTC_AUTO_MIXED_PRECISION=1
 * (mixed_float16), then the train block, then float32. */
const char *mpt_resolve_policy(const char *cli, const char *file);

/* ---- checkpoints (checkpoint.c) ---- */

typedef enum {
    MPT_CKPT_ALL,     /* every state tensor and the metadata (--resume) */
    MPT_CKPT_WEIGHTS, /* the model's variables only (--init-weights, eval) */
} mpt_ckpt_what;

typedef struct {
    long step;
    uint64_t seed;
    long batch_size;      /* 0: not recorded */
    long steps_per_epoch; /* 0: not recorded */
} mpt_ckpt_meta;

int mpt_ckpt_save(const char *path, const mpt_session *s, const mpt_ckpt_meta *m, char *err,
                  size_t n);
/* Loads into the session's state by name. Nothing is changed unless every
 * wanted tensor matches; otherwise every missing, unexpected or mismatched
 * name, shape or dtype is listed in err (as many as fit in n). m may be
 * NULL. */
int mpt_ckpt_load(const char *path, mpt_session *s, mpt_ckpt_what what, mpt_ckpt_meta *m,
                  char *err, size_t n);

/* 1 when state variable k of the session is a model weight: a float
 * variable of the forward graph (batch-norm statistics count; optimizer
 * slots, the loss scale and rng/counter do not). */
int mpt_ckpt_is_weight(const mpt_session *s, int k);

/* For eval and predict: compiles the model with its evaluation step
 * (want_eval is set here) and loads the model's weights from path.
 * Returns 0, or -1 after printing what went wrong to stderr. */
int mpt_ckpt_open_inference(const mpt_compile_opts *o, const char *path, mpt_session **out);

/* ---- the training loop (train_loop.c, train_epochs.c) ---- */


typedef struct {
    mpt_compile_opts copts;
    uint64_t seed;
    int seed_set;
    long epochs, steps_per_epoch, max_steps, max_skipped, save_every;
    double validation_split; /* < 0: the train block's */
    const char *data, *log_path, *save_path, *resume_path, *init_weights;
    int no_test, quiet, profile;
    int compare_fusion; /* run one step fused and unfused, report, exit */
    const char *augment;     /* --augment: over the train block's augment */
    const char *tensorboard; /* --tensorboard DIR */
    long histogram_every;    /* --histogram-every N steps (0: each epoch's end) */
    int histogram_grads;     /* --histogram-grads: gradient histograms too */
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
    int loss, scale, finite, lr;      /* output indices, -1 when absent */
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
    int bits_per_byte;              /* text data: show the loss in bits a byte too */
    int signal;                     /* the SIGINT/SIGTERM that stopped the run, or 0 */
    struct mpt_callbacks *callbacks; /* the train block's (train_impl.h), or NULL */
    struct mpt_prefetch *prefetch;   /* with augmentation: the next batch on a thread */
    const struct mpt_augment *aug;
    struct mpt_tb *tb_train, *tb_val; /* --tensorboard DIR/train, DIR/validation */
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

/* ---- this machine (devices.c) ---- */


typedef struct {
    char name[128];
    char features[256]; /* the ones mptc uses, space-separated */
    int cores;
    int avx2, fma, f16c, avx512f, avx512_bf16;
} mpt_cpu_info;

void mpt_devices_cpu(mpt_cpu_info *out);

#endif
