/* runtime/cuda/cuda.h — the CUDA backend (runtime/cuda/): the executor of
 * a kernel plan on the process's device (cuda_exec.c), its cuBLASLt calls
 * (cuda_lt.c), data-parallel ranks' collectives through NCCL
 * (cuda_nccl.c) and the device's measured ceilings (cuda_ceiling.c). The libraries it
 * runs on, their ABI mirror and the device queries are below it, in
 * codegen/cuda/driver.h; its private state is cuda_impl.h. */
#ifndef MPT_RUNTIME_CUDA_H
#define MPT_RUNTIME_CUDA_H

#include <stdint.h>
#include <stdio.h>

#include "codegen/backend.h"
#include "codegen/cuda/driver.h"

/* Drops the cuBLASLt heuristic answers the CUDA backend keeps for the
 * process, per call shape (tests that change what cuBLASLt answers). */
void mpt_cuda_lt_forget(void);

/* What device 0 reaches at most, measured once per process in the current
 * context (runtime/cuda_ceiling.c): copy bandwidth in GB/s (bytes read plus
 * written) and cuBLASLt GEMM TFLOP/s per dtype; 0 where not measured, with
 * the reason in why. */
typedef struct {
    double f16_tflops, bf16_tflops, f32_tflops, tf32_tflops, gbps;
    char why[256];
} mpt_cuda_ceilings;
const mpt_cuda_ceilings *mpt_cuda_ceilings_measure(void);

/* The CUDA backend: compiles a plan with NVRTC for device 0's architecture
 * and runs it (runtime/cuda_exec.c). */
extern mpt_backend mpt_backend_cuda;
/* `--profile`: the plans compiled while out is set time every kernel with
 * CUDA events and print a table (ms, TFLOP/s or GB/s, layer) when freed;
 * NULL turns it off. */
void mpt_cuda_profile(FILE *out);
/* For tests: device bytes the executor allocated and how many values it had
 * to give a buffer of their own because the memory plan did not cover them
 * (0 when the plan's arenas hold every value). */
void mpt_cuda_exec_memory(const mpt_exec *e, int64_t *device_bytes, int *private_buffers,
                          int *in_place_updates);
/* the device address of a value's buffer, 0 when it has none */
mpt_cu_deviceptr mpt_cuda_exec_buffer(const mpt_exec *e, int node);
/* the driver function kernel k of the plan launches, NULL for a kernel run
 * by cuBLASLt (tests that run their own build of each kernel) */
mpt_cu_function mpt_cuda_exec_function(const mpt_exec *e, int k);
/* Called after kernel k of a run has finished (the run synchronizes after
 * every kernel while a hook is set), when its outputs are in their buffers
 * and no later kernel has reused them: for tests that find the first
 * kernel whose values part from the interpreter's. NULL removes it.
 * MPTC_CUDA_SYNC=1 synchronizes after every kernel too, so that a kernel
 * that faults is named in the error. */
typedef void (*mpt_cuda_kernel_hook)(void *ctx, const mpt_exec *x, int k);
void mpt_cuda_set_kernel_hook(mpt_cuda_kernel_hook fn, void *ctx);

/* Data parallelism on CUDA ranks: one GPU a rank, the sums through NCCL.
 * Joins this process, rank `rank` of `size`, to the ranks' NCCL
 * communicator: takes device local_rank modulo the host's devices for
 * every later plan (mpt_cuda_set_device), makes rank 0's NCCL id every
 * rank's with bcast (MPI's: mpt_dist_bcast, runtime/dist/dist.h) and
 * initialises the communicator. Every rank must call it, rank 0 too. Once
 * joined, the plans' collective kernels (allreduce, reduce_scatter,
 * all_gather) run as NCCL calls on the step's stream. 0, or -1 with a
 * message and a hint in err (NCCL not found, fewer GPUs than ranks on this
 * host, NCCL's own error). */
typedef int (*mpt_cuda_bcast_fn)(void *buf, int64_t bytes, char *err, size_t n);
int mpt_cuda_nccl_join(int rank, int size, int local_rank, mpt_cuda_bcast_fn bcast, char *err,
                       size_t n);
/* 1 once joined, with the communicator's rank and size; 0 before */
int mpt_cuda_nccl_joined(int *rank, int *size);
/* Destroys the communicator (after the last step; nothing before a join) */
void mpt_cuda_nccl_leave(void);

#endif
