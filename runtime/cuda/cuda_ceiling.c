/* runtime/cuda/cuda_ceiling.c — what the GPU reaches at most, measured, for the
 * CUDA profile's "% of ceiling" column.
 *
 * Measured once per process, the first time a CUDA profile is printed, in
 * the context the step ran in, with CUDA events, each the best of three
 * after a warm-up run:
 *   - memory: a device-to-device copy of 256 MiB, counting the bytes read
 *     and written;
 *   - f16, bf16: a cuBLASLt GEMM of 8192 x 8192 x 8192 with f32
 *     accumulation (Tensor Cores), 2 M N K flops;
 *   - f32: a cuBLASLt GEMM of 4096^3 in true fp32 (CUBLAS_COMPUTE_32F, no
 *     TF32), as the float32 policy computes;
 *   - tf32: the f32 GEMM of 8192^3 in CUBLAS_COMPUTE_32F_FAST_TF32, the
 *     ceiling of f32 GEMMs and convolutions under --tf32.
 * Buffers are filled with a non-zero byte pattern (zeros would let the
 * chip save power and clock higher than real data allows). A figure that
 * cannot be measured (no cuBLASLt, too little free memory) is left 0 and
 * its reason kept.
 */
#include <stdio.h>
#include <string.h>

#include "runtime/cuda/cuda.h"

static mpt_cuda_ceilings cached;
static int measured;

/* best of three ms of fn(ctx) between two events, after one warm-up */
static int best_ms(const mpt_cu_api *cu, int (*fn)(void *ctx, char *err, size_t n), void *ctx,
                   float *best, char *err, size_t n) {
    mpt_cu_event a = NULL, b = NULL;
    *best = 0;
    MPT_CU_CHECK(cu->event_create(&a, 0), "");
    MPT_CU_CHECK(cu->event_create(&b, 0), "");
    if (fn(ctx, err, n)) goto fail;
    for (int r = 0; r < 3; r++) {
        MPT_CU_CHECK(cu->event_record(a, NULL), "");
        if (fn(ctx, err, n)) goto fail;
        MPT_CU_CHECK(cu->event_record(b, NULL), "");
        MPT_CU_CHECK(cu->event_synchronize(b), "");
        float ms = 0;
        MPT_CU_CHECK(cu->event_elapsed_time(&ms, a, b), "");
        if (r == 0 || ms < *best) *best = ms;
    }
    cu->event_destroy(a);
    cu->event_destroy(b);
    return 0;
fail:
    if (a) cu->event_destroy(a);
    if (b) cu->event_destroy(b);
    return -1;
}

/* ---- copy bandwidth ---- */

typedef struct {
    const mpt_cu_api *cu;
    mpt_cu_deviceptr src, dst;
    size_t bytes;
} copy_job;

static int run_copy(void *ctx, char *err, size_t n) {
    copy_job *j = ctx;
    MPT_CU_CHECK(j->cu->memcpy_dtod(j->dst, j->src, j->bytes), "");
    return 0;
fail:
    return -1;
}

/* ---- GEMM ---- */

typedef struct {
    const mpt_lt_api *lt;
    mpt_lt_handle h;
    mpt_lt_matmul_desc desc;
    mpt_lt_layout l;
    mpt_lt_algo algo;
    mpt_cu_deviceptr a, b, d, ws;
    size_t ws_bytes;
} gemm_job;

static int run_gemm(void *ctx, char *err, size_t n) {
    gemm_job *j = ctx;
    float one = 1.f, zero = 0.f;
    MPT_LT_CHECK(j->lt->matmul(j->h, j->desc, &one, (void *)(uintptr_t)j->a, j->l,
                               (void *)(uintptr_t)j->b, j->l, &zero, (void *)(uintptr_t)j->d, j->l,
                               (void *)(uintptr_t)j->d, j->l, &j->algo, (void *)(uintptr_t)j->ws,
                               j->ws_bytes, NULL), "");
    return 0;
fail:
    return -1;
}

/* TFLOP/s of an s^3 GEMM of type t (A, B and D all t), or 0 with why */
static double gemm_tflops(const mpt_cu_api *cu, const mpt_lt_api *lt, mpt_lt_handle h, int t,
                          int compute, uint64_t s, char *why, size_t wn) {
    char err[512];
    size_t n = sizeof err;
    size_t esz = t == MPT_CUDA_R_32F ? 4 : 2, bytes = (size_t)(s * s) * esz;
    gemm_job j = {.lt = lt, .h = h, .ws_bytes = (size_t)32 << 20};
    mpt_lt_pref pref = NULL;
    double tflops = 0;
    size_t free_b = 0, total = 0;
    MPT_CU_CHECK(cu->mem_get_info(&free_b, &total), "");
    if (free_b < 3 * bytes + j.ws_bytes + ((size_t)256 << 20)) {
        snprintf(why, wn, "%zu MiB free", free_b >> 20);
        return 0;
    }
    MPT_CU_CHECK(cu->mem_alloc(&j.a, bytes), "");
    MPT_CU_CHECK(cu->mem_alloc(&j.b, bytes), "");
    MPT_CU_CHECK(cu->mem_alloc(&j.d, bytes), "");
    MPT_CU_CHECK(cu->mem_alloc(&j.ws, j.ws_bytes), "");
    MPT_CU_CHECK(cu->memset_d8(j.a, 0x3c, bytes), "");
    MPT_CU_CHECK(cu->memset_d8(j.b, 0x3c, bytes), "");
    MPT_LT_CHECK(lt->matmul_desc_create(&j.desc, compute, MPT_CUDA_R_32F), "");
    MPT_LT_CHECK(lt->layout_create(&j.l, t, s, s, (int64_t)s), "");
    MPT_LT_CHECK(lt->pref_create(&pref), "");
    uint64_t ws = j.ws_bytes;
    MPT_LT_CHECK(lt->pref_set_attribute(pref, MPT_LT_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "");
    mpt_lt_heuristic hr;
    int found = 0;
    MPT_LT_CHECK(lt->algo_get_heuristic(h, j.desc, j.l, j.l, j.l, j.l, pref, 1, &hr, &found), "");
    if (found < 1) {
        snprintf(why, wn, "cuBLASLt has no algorithm");
        goto done;
    }
    j.algo = hr.algo;
    float ms = 0;
    if (best_ms(cu, run_gemm, &j, &ms, err, n)) goto fail;
    if (ms > 0) tflops = 2.0 * (double)s * (double)s * (double)s / (ms * 1e-3) * 1e-12;
    goto done;
fail:
    snprintf(why, wn, "%s", err);
done:
    if (pref) lt->pref_destroy(pref);
    if (j.l) lt->layout_destroy(j.l);
    if (j.desc) lt->matmul_desc_destroy(j.desc);
    if (j.a) cu->mem_free(j.a);
    if (j.b) cu->mem_free(j.b);
    if (j.d) cu->mem_free(j.d);
    if (j.ws) cu->mem_free(j.ws);
    return tflops;
}

const mpt_cuda_ceilings *mpt_cuda_ceilings_measure(void) {
    if (measured) return &cached;
    measured = 1;
    memset(&cached, 0, sizeof cached);
    char err[512], why[512];
    size_t n = sizeof err;
    const mpt_cu_api *cu = mpt_cuda_driver(0, why, sizeof why);
    if (!cu) {
        snprintf(cached.why, sizeof cached.why, "%.200s", why);
        return &cached;
    }
    copy_job c = {.cu = cu, .bytes = (size_t)256 << 20};
    size_t free_b = 0, total = 0;
    MPT_CU_CHECK(cu->mem_get_info(&free_b, &total), "");
    if (free_b > 2 * c.bytes + ((size_t)256 << 20)) {
        MPT_CU_CHECK(cu->mem_alloc(&c.src, c.bytes), "");
        MPT_CU_CHECK(cu->mem_alloc(&c.dst, c.bytes), "");
        MPT_CU_CHECK(cu->memset_d8(c.src, 0x3c, c.bytes), "");
        float ms = 0;
        if (best_ms(cu, run_copy, &c, &ms, err, n)) goto fail;
        if (ms > 0) cached.gbps = 2.0 * (double)c.bytes / (ms * 1e-3) * 1e-9;
    } else {
        snprintf(cached.why, sizeof cached.why, "memory: %zu MiB free", free_b >> 20);
    }
    const mpt_lt_api *lt = mpt_cuda_cublaslt(why, sizeof why);
    mpt_lt_handle h = NULL;
    if (!lt) {
        snprintf(cached.why, sizeof cached.why, "GEMM: %.200s", why);
    } else if (lt->create(&h) == 0) {
        why[0] = 0;
        const int f32 = MPT_CUBLAS_COMPUTE_32F;
        cached.f16_tflops = gemm_tflops(cu, lt, h, MPT_CUDA_R_16F, f32, 8192, why, sizeof why);
        cached.bf16_tflops = gemm_tflops(cu, lt, h, MPT_CUDA_R_16BF, f32, 8192, why, sizeof why);
        cached.f32_tflops = gemm_tflops(cu, lt, h, MPT_CUDA_R_32F, f32, 4096, why, sizeof why);
        cached.tf32_tflops = gemm_tflops(cu, lt, h, MPT_CUDA_R_32F,
                                         MPT_CUBLAS_COMPUTE_32F_FAST_TF32, 8192, why, sizeof why);
        if (why[0]) snprintf(cached.why, sizeof cached.why, "GEMM: %.200s", why);
        lt->destroy(h);
    }
    goto done;
fail:
    snprintf(cached.why, sizeof cached.why, "%.200s", err);
done:
    if (c.src) cu->mem_free(c.src);
    if (c.dst) cu->mem_free(c.dst);
    return &cached;
}
