/* runtime/cuda/cuda_impl.h — what the files of the CUDA backend share
 * (cuda_exec.c: compiling and running a step; cuda_lt.c: its cuBLASLt
 * calls; cuda_nccl.c: its collectives; cuda_profile.c: --profile's table).
 * Private to runtime/cuda/: its public header is cuda.h.
 */
#ifndef MPT_RUNTIME_CUDA_IMPL_H
#define MPT_RUNTIME_CUDA_IMPL_H

#include <stdio.h>

#include "codegen/cuda/cuda.h"
#include "runtime/cuda/cuda.h"

typedef struct {
    int is_lt;
    int coll;                    /* a collective: NCCL calls (cuda_nccl.c), src.params its in and out */
    mpt_cuda_kernel_src src;     /* generated kernels */
    mpt_cu_module mod;
    mpt_cu_function fn;
    mpt_lt_call call;            /* cuBLASLt kernels */
    mpt_lt_matmul_desc desc;
    mpt_lt_layout la, lb, ld;
    mpt_lt_algo algo;
    double ms;                   /* --profile: summed over the timed steps */
} cuda_step;

struct mpt_exec {
    const mpt_plan *plan;
    mpt_cu_device dev;
    mpt_cu_context ctx;
    mpt_lt_handle lt;
    mpt_cu_deviceptr *buf;       /* per graph node: its device address, 0 if none */
    mpt_cu_deviceptr arena[3];   /* the memory plan's arenas */
    int64_t arena_bytes[3];      /* their sizes, as dev_alloc counted them */
    mpt_cu_deviceptr *own;       /* values the plan's arenas do not cover */
    int n_own;
    mpt_cu_deviceptr stage;      /* values of updates that must be held (below) */
    int64_t *stage_off;          /* per update: its offset in stage, or -1 */
    char *in_place;              /* per update */
    int n_in_place;
    int64_t device_bytes;
    mpt_cu_deviceptr workspace;
    /* One region shared by every generated kernel (they run one after
     * another): the largest counters, zeroed once and left zero by each
     * kernel, then the largest scratch (partial sums, written before read) */
    mpt_cu_deviceptr shared_mem, counters, scratch;
    cuda_step *steps;
    int n_steps;
    void **args;                 /* a launch's parameters: the most any kernel takes */
    int vars_on_device;          /* the device holds the current variables */
    int device_newer;            /* ... and they changed since the host had them */
    int sync_each;               /* MPTC_CUDA_SYNC: synchronize after every kernel */
    int n_lt_refused;            /* matched cuBLASLt calls it had no algorithm for */
    /* The step's kernels run on `stream` (blocking: the copies on the
     * default stream order themselves around it). With graphs on, the
     * first run captures the whole sequence into a graph and every run
     * launches it at once: one launch where the step had hundreds. */
    mpt_cu_stream stream;
    int graphs;                  /* capture and replay (off: MPTC_CUDA_GRAPHS=0, or it failed) */
    mpt_cu_graph graph;
    mpt_cu_graph_exec graph_exec;
    struct mpt_exec *shared_from; /* whose variable buffers this step reads */
    struct mpt_exec *sharer;      /* the step reading this one's */
    /* The next step's inputs (backend.h's stage_next): uploaded on
     * copy_stream while this step's kernels run on `stream`, into one of
     * two halves of `staged` (every input, packed), which the next run
     * copies into the input buffers on the device. The halves take turns:
     * a run uploads into the half the run before it copied from, a copy
     * that run's closing synchronization finished. */
    mpt_cu_stream copy_stream;
    mpt_cu_deviceptr staged;
    int64_t staged_half;         /* bytes of one half */
    int staged_turn;             /* the half the next upload writes */
    int64_t *staged_off;         /* per input, within a half */
    const void **next_data;      /* named by stage_next, to upload during this run */
    const void **staged_data;    /* the host data a half holds a copy of, or NULL */
    int *staged_in;              /* per input: which half */
    FILE *prof_out;
    mpt_cu_event *events;        /* n_steps + 1 */
    int prof_steps;              /* timed steps; the first is left out */
    /* The collectives' padded [ranks * shard] values, where a flat value
     * is not a whole number of shards: one region, as large as the
     * largest (they run one after another on `stream`) */
    mpt_cu_deviceptr coll_pad;
    int64_t coll_pad_bytes;
    struct cuda_buckets *buckets; /* the sums' buckets and their stream, or NULL (cuda_nccl.c) */
};

enum { LT_WORKSPACE = 32 << 20 };

/* cuda_lt.c. Picks cuBLASLt's algorithm for step s's call, before any
 * buffer is placed. 0, or -1 with why in err: the caller runs the kernel
 * generated instead, after mpt_cuda_lt_release. */
int mpt_cuda_lt_prepare(mpt_exec *x, const mpt_lt_api *lt, cuda_step *s, char *err, size_t n);
void mpt_cuda_lt_release(const mpt_lt_api *lt, cuda_step *s);
/* Once the buffers are placed: the call's pointers. 0, or -1 with err. */
int mpt_cuda_lt_bind(mpt_exec *x, const mpt_lt_api *lt, cuda_step *s, char *err, size_t n);

/* cuda_nccl.c. Makes kernel ki of the plan, a collective, step s: checks
 * its dtypes and the communicator (joined, the ranks the plan was built
 * for), turns graphs off for the plan, and counts its padding into
 * x->coll_pad_bytes. 0, or -1 with err. */
int mpt_cuda_coll_prepare(mpt_exec *x, const mpt_cu_api *cu, cuda_step *s, int ki, char *err,
                          size_t n);
/* Once the buffers are placed: the padding region, if any, and the sums'
 * buckets (bucket_bytes as backend.h's; MPTC_OVERLAP=0: on the step's
 * stream). 0, or -1 with err. */
int mpt_cuda_coll_alloc(mpt_exec *x, const mpt_cu_api *cu, int64_t bucket_bytes, char *err,
                        size_t n);
/* Before step i (n_steps: the step's end): the step's stream waits for
 * the buckets whose sums step i is the first to read. 0, or -1 with err. */
int mpt_cuda_coll_wait(mpt_exec *x, const mpt_cu_api *cu, int i, char *err, size_t n);
void mpt_cuda_coll_free(mpt_exec *x, const mpt_cu_api *cu);
/* Step s's NCCL call and copies, queued on x->stream. 0, or -1 with err. */
int mpt_cuda_coll_launch(mpt_exec *x, const mpt_cu_api *cu, const cuda_step *s, char *err,
                         size_t n);

/* cuda_profile.c: --profile's table, printed when the plan is freed */
void mpt_cuda_profile_report(const mpt_exec *x);

#endif
