/* runtime/ — the compile pipeline, backends, training loop and the CLI.
 * This header is the folder's public surface (data loading is in data.h,
 * the backend interface in backend.h). */
#ifndef MPT_RUNTIME_H
#define MPT_RUNTIME_H

#include <stdio.h>
#include "fusion/fusion.h"
#include "ir/ir.h"
#include "lang/lang.h"
#include "codegen/backend.h"

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
    long threads;              /* --threads: CPU worker threads, 0 = all cores */
    int tf32;                  /* --tf32: CUDA f32 GEMMs on TF32 Tensor Cores */
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
    mpt_graph *typed;        /* forward graph after the policy pass */
    mpt_graph *train;        /* the train step */
    mpt_graph *eval;         /* the evaluation step, or NULL */
    mpt_plan *train_plan, *eval_plan;
    mpt_backend *backend;
    mpt_exec *train_exec, *eval_exec;
    mpt_tensor *vars;        /* the train step's VARIABLEs, in node order */
    int n_vars;
    int *eval_var;           /* eval VARIABLE k -> index into vars */
    long batch_size;
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

/* Resolves the policy name: --policy, then MPTC_AUTO_MIXED_PRECISION=1
 * (mixed_float16), then the train block, then float32. */
const char *mpt_resolve_policy(const char *cli, const char *file);

/* Commands (runtime/cmd_*.c); each returns the process exit status. */
int mpt_cmd_train(int argc, char **argv);
int mpt_cmd_check(int argc, char **argv);
int mpt_cmd_ir(int argc, char **argv);
int mpt_cmd_devices(int argc, char **argv);
int mpt_cmd_ptx(int argc, char **argv);
int mpt_cmd_asm(int argc, char **argv);
int mpt_cmd_bench(int argc, char **argv);
int mpt_cmd_eval(int argc, char **argv);
int mpt_cmd_predict(int argc, char **argv);

/* Human-readable byte counts: "1.5 MiB" */
const char *mpt_fmt_bytes(int64_t bytes, char *buf, size_t n);
double mpt_now(void); /* monotonic seconds */

#endif
