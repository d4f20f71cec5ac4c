/* codegen/backend.h — the one interface of the three executors: the
 * reference interpreter, the CPU JIT (codegen/cpu) and CUDA (runtime/cuda).
 * A backend compiles a kernel plan once and runs it every step. Below
 * runtime/, so that codegen implements it without reaching up. */
#ifndef MPT_BACKEND_H
#define MPT_BACKEND_H

#include <stddef.h>
#include "ir/ir.h"
#include "fusion/fusion.h"

typedef struct mpt_exec mpt_exec; /* a compiled plan, backend-private */

typedef struct {
    const char *name; /* "interp", "cpu", "cuda" */
    /* 1 when this machine can run it; else 0 and a reason in why */
    int (*available)(char *why, size_t n);
    mpt_exec *(*compile)(const mpt_plan *plan, char *err, size_t n);
    /* Same contract as mpt_interp_run: inputs by INPUT order, vars by
     * VARIABLE order (host copies, updated in place), outputs allocated;
     * except for a backend with pull_vars, below. */
    int (*run)(mpt_exec *e, const mpt_tensor *inputs, mpt_tensor *vars,
               mpt_tensor *outputs, char *err, size_t n);
    void (*free)(mpt_exec *e);
    /* Optional: a backend that keeps the variables in its own memory between
     * steps (CUDA, so a step moves only its inputs and outputs over PCIe).
     * Its run() reads the host copies on its first step and after push_vars,
     * and leaves the updated values with itself; pull_vars copies them into
     * the host copies (1 when it copied, 0 when those were current, -1 with
     * err); push_vars says the host copies changed (a checkpoint restored,
     * or another executor updated them). mpt_session_pull_vars does both for
     * a session's train and evaluation steps. */
    int (*pull_vars)(mpt_exec *e, mpt_tensor *vars, char *err, size_t n);
    void (*push_vars)(mpt_exec *e);
    /* Optional, with pull_vars: e's variable k is from's variable
     * from_var[k] (same dtype and shape), read where from keeps it instead
     * of a copy of e's own; e must update no variable and not run once from
     * is freed. 1 when shared, 0 when e keeps its own copy, -1 with err. */
    int (*share_vars)(mpt_exec *e, mpt_exec *from, const int *from_var, char *err, size_t n);
    /* Optional: names the inputs of the next run, so their upload can
     * overlap the step the coming run() computes (CUDA: copied on a second
     * stream while the kernels run). The next run() given tensors with the
     * same data pointers takes that copy; the caller must leave their
     * contents alone until then. Other tensors are uploaded as usual.
     * 1 when staged, 0 when the backend uploads at run() anyway, -1 with err. */
    int (*stage_next)(mpt_exec *e, const mpt_tensor *next, char *err, size_t n);
    double compile_seconds; /* of the last compile */
    int threads;            /* worker threads for the next compile; 0 = all cores */
    /* data parallelism: the ALLREDUCE buckets of the next compile
     * (mpt_plan_buckets): 0 the default, MPT_BUCKET_BYTES_DEFAULT; < 0
     * one message per ALLREDUCE */
    int64_t bucket_bytes;
} mpt_backend;

extern mpt_backend mpt_backend_interp;
/* monotonic seconds (codegen/backend.c) */
double mpt_now(void);
/* a byte count for people: "1.5 MiB", into buf */
const char *mpt_fmt_bytes(int64_t bytes, char *buf, size_t n);
/* "interp", "cpu", "cuda", "auto" -> a backend; NULL with a reason */
mpt_backend *mpt_backend_find(const char *name, char *err, size_t n);

#endif
