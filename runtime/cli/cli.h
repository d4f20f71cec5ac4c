/* runtime/cli/cli.h — the command line (runtime/cli/): the commands
 * (cmd_*.c, main.c) and the option parsing they share (cli.c). Options are
 * `--name value` or `--name=value`; flags take none. */
#ifndef MPT_CLI_H
#define MPT_CLI_H

#include "runtime/train/train.h"

typedef struct {
    const char *name;  /* without the dashes */
    int takes_value;
    const char *help;  /* one line */
} mpt_cli_opt;

typedef struct {
    const char *cmd;
    const char *positional; /* e.g. MODEL.mpt */
    const char *value[64];  /* by option index; NULL when absent */
    int given[64];          /* flags and options seen */
    const char *pos;        /* the positional argument */
} mpt_cli;

/* Parses argv (argv[0] is the command name). Returns 0, 1 when --help was
 * printed, or 2 after printing an error and the usage. */
int mpt_cli_parse(mpt_cli *c, const char *cmd, const char *summary, const mpt_cli_opt *opts,
                  int argc, char **argv);
const char *mpt_cli_get(const mpt_cli *c, const mpt_cli_opt *opts, const char *name);
int mpt_cli_has(const mpt_cli *c, const mpt_cli_opt *opts, const char *name);
/* Integer option; prints an error and returns -1 when it is not a number >= min. */
int mpt_cli_long(const mpt_cli *c, const mpt_cli_opt *opts, const char *name, long min,
                 long *out);

/* The options every compiling command shares, and filling compile opts. */
#define MPT_CLI_COMPILE_OPTS                                                                  \
    {"policy", 1, "float32 | mixed_float16 | mixed_bfloat16 (default: the train block)"},   \
    {"batch-size", 1, "batch size (default: the train block's)"},                            \
    {"xla", 0, "fuse ops into kernels (the default)"},                                      \
    {"no-xla", 0, "one kernel per op, for comparison"},                                      \
    {"fusion-disable", 1,                                                                    \
     "epilogue,prologue,loop,reduction,multi_output,epilogue_reduce,gemm_extra,"             \
     "reduction_chain,attention,attention_layout"},                                                           \
    {"loss-scale", 1, "dynamic | none | N (default: dynamic for mixed_float16)"},            \
    {"loss-scale-period", 1, "finite steps before the dynamic scale grows (2000)"},          \
    {"policy-move", 1, "OP=compute|float32|follow,... move ops between policy lists"},       \
    {"device", 1, "auto | cpu | cuda | interp"},                                             \
    {"threads", 1, "CPU worker threads (default: the cores this process may run on)"},       \
    {"tf32", 0, "CUDA: float32 GEMMs and convolutions on TF32 Tensor Cores (default: fp32)"}, \
    {"dump-after", 1, "print the graph after a pass: lower, policy, train_step, fusion"},     \
    {"optimizer", 1, "override the train block's: adam, or \"adamw(weight_decay=0.01)\""}, \
    {"learning-rate", 1, "override the learning rate (a constant)"},                        \
    {"ranks", 1, "plan one rank of N data-parallel ranks (train: mpirun -np N gives it)"},   \
    {"shard-optimizer", 0, "data parallelism: shard the optimizer state over the ranks (ZeRO-1)"}, \
    {"bucket-mb", 1, "data parallelism: gradients summed in buckets of N MiB (default 25; 0: one each)"}

int mpt_cli_compile_opts(const mpt_cli *c, const mpt_cli_opt *opts, mpt_compile_opts *o);

/* The commands (runtime/cli/cmd_*.c); each returns the process exit status. */
int mpt_cmd_train(int argc, char **argv);
int mpt_cmd_check(int argc, char **argv);
int mpt_cmd_ir(int argc, char **argv);
int mpt_cmd_devices(int argc, char **argv);
int mpt_cmd_ptx(int argc, char **argv);
int mpt_cmd_asm(int argc, char **argv);
int mpt_cmd_bench(int argc, char **argv);
int mpt_cmd_eval(int argc, char **argv);
int mpt_cmd_predict(int argc, char **argv);

#endif
