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
} fake_cuda_counts;

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
