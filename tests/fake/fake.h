/* tests/fake/fake.h — what the tests share about the recording driver
 * (tests/fake/cuda.c): its counters, and loading it in place of libcuda
 * and libcublasLt.
 */
#ifndef MPTC_TESTS_FAKE_H
#define MPTC_TESTS_FAKE_H

#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    long long htod_bytes, dtoh_bytes, dtod_bytes, memset_bytes;
    long long htod_async_bytes; /* of htod_bytes, uploaded by cuMemcpyHtoDAsync */
    long long allocated, peak, n_alloc, live_allocs;
    long long launches, matmuls, bad_calls;
    long long graph_launches, captured; /* graphs launched; launches, memsets, matmuls recorded */
    long long heuristics; /* cublasLtMatmulAlgoGetHeuristic calls */
    long long tf32_descs; /* matmul descriptors computing in CUBLAS_COMPUTE_32F_FAST_TF32 */
    int current_device;   /* the device of the context last made current */
    long long hosted_launches; /* of launches, those that ran a host build (fake_cuda_register) */
} fake_cuda_counts;

/* The recording NCCL (tests/fake/nccl.c), in the same library. A
 * communicator of c ranks stands in for c ranks that all hold this
 * process's values: a sum is c times the value, every rank's shard is this
 * rank's. Each collective call is logged (fake_nccl_log) and checked: its
 * buffers must lie in device memory, its stream must be one, and no
 * capture may be on. FAKE_NCCL_FAIL=N fails the N-th call (from 1). */
enum { FAKE_NCCL_ALL_REDUCE, FAKE_NCCL_REDUCE_SCATTER, FAKE_NCCL_ALL_GATHER,
       FAKE_NCCL_GROUP_START, FAKE_NCCL_GROUP_END }; /* the group calls: logged only */
typedef struct {
    int op;                        /* FAKE_NCCL_* */
    unsigned long long send, recv; /* device addresses */
    size_t count;                  /* all_reduce's count, reduce_scatter's recvcount, all_gather's sendcount */
    int dtype, redop;              /* ncclDataType_t, ncclRedOp_t (-1 for all_gather) */
    void *comm, *stream;
} fake_nccl_call;
typedef struct {
    int rank, nranks, device;      /* of the last ncclCommInitRank; device: the current context's */
    unsigned char id[128];         /* the id it was given */
    long long inits, destroys, unique_ids, failed;
} fake_nccl_state;
/* the calls so far (*calls: the log, valid until the next call) */
typedef int (*fake_nccl_log_fn)(const fake_nccl_call **calls);
typedef fake_nccl_state (*fake_nccl_state_fn)(void);

/* The cublasLtMatmul calls the recording cuBLASLt computed (captured ones
 * when a graph replays them), as cuBLASLt sees them: column-major
 * D[m,n] = op(A) op(B), op(A) m x k, in `batch` products whose matrices
 * lie stride_* elements apart in each buffer (1 and 0 when the layouts
 * set no batch). */
typedef struct {
    unsigned long long m, n, k;
    int batch, transa, transb;
    long long stride_a, stride_b, stride_d;
    int a_type, d_type;            /* cudaDataType_t */
} fake_lt_call;
/* the calls so far (*calls: the log, valid until the next call) */
typedef long long (*fake_lt_log_fn)(const fake_lt_call **calls);

/* The order between streams (tests/fake/streams.c), inside the library:
 * what an event records is its stream's latest work and NCCL calls. */
typedef struct {
    int stream;
    long long seq, nccl;
} fake_mark;
void fake_stream_work(void *s);
void fake_stream_write(void *s, unsigned long long dst, size_t bytes);
void fake_stream_record(fake_mark *m, void *s);
void fake_stream_wait(void *s, const fake_mark *m);
void fake_stream_sync(void);
void fake_stream_forget(void *s);
int fake_stream_ready(void *s, unsigned long long p, size_t bytes);

#ifdef MPT_CODEGEN_CUDA_DRIVER_H
/* Makes mptc load build/tests/fake/libfakecuda.so (beside the test program
 * argv0) as the driver and as cuBLASLt, loads it, and returns its handle
 * for dlsym; NULL with the reason on stderr. */
static inline void *fake_cuda_load(const char *argv0) {
    char path[4096], why[512], *dir = strdup(argv0);
    snprintf(path, sizeof path, "%s/fake/libfakecuda.so", dir ? dirname(dir) : ".");
    free(dir);
    setenv("MPTC_LIBCUDA", path, 1);
    setenv("MPTC_LIBCUBLASLT", path, 1);
    if (!mpt_cuda_driver(0, why, sizeof why)) {
        fprintf(stderr, "cannot load the test driver: %s\n", why);
        return NULL;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!h) fprintf(stderr, "the test driver is not loaded: %s\n", dlerror());
    return h;
}
#endif

#endif
