/* tests/cuda_abi.cpp — mptc's mirror of the CUDA ABI against the toolkit's
 * own headers (and NCCL's nccl.h unless MPT_ABI_NO_NCCL), compiled by
 * tests/cuda_abi.t.sh.
 *
 * codegen/cuda/driver.h declares the driver, NVRTC and cuBLASLt functions, enums
 * and structs mptc uses, so that it builds without a toolkit and loads the
 * libraries with dlopen. A value or a signature that differs from the
 * headers would show only on a GPU: a wrong enum reads the wrong
 * attribute, a 32-bit size where the library writes 64 bits overwrites
 * the stack. Here every value and struct layout is a static_assert
 * against cuda.h, nvrtc.h, cublasLt.h and library_types.h, and every
 * function mptc loads (the list the script takes from codegen/cuda/driver.c's
 * load_sym calls, in cuda_abi_syms.inc) must match the header's
 * prototype of the symbol it names: the same number of parameters, each
 * of the same size and kind (integer, floating point, pointer, and for a
 * pointer what it points to), and the name must be the one the header's
 * own macros give the function today (cuMemAlloc is cuMemAlloc_v2).
 */
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include <cublasLt.h>
#include <cuda.h>
#include <library_types.h>
#include <nvrtc.h>
#ifndef MPT_ABI_NO_NCCL
#include <nccl.h>
#endif

extern "C" {
#include "codegen/cuda/cuda.h"
#include "codegen/cuda/driver.h"
}

/* ---- values ---- */

static_assert(MPT_CU_ATTR_MULTIPROCESSOR_COUNT == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
static_assert(MPT_CU_ATTR_CC_MAJOR == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
static_assert(MPT_CU_ATTR_CC_MINOR == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
static_assert(MPT_CU_ATTR_MAX_SHARED_OPTIN ==
              CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
static_assert(MPT_CU_FUNC_ATTR_MAX_DYNAMIC_SHARED ==
              CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
static_assert(MPT_CU_ERROR_NO_DEVICE == CUDA_ERROR_NO_DEVICE);
static_assert(MPT_CU_CAPTURE_THREAD_LOCAL == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
static_assert(CUDA_SUCCESS == 0 && NVRTC_SUCCESS == 0 && CUBLAS_STATUS_SUCCESS == 0);

static_assert(MPT_CUDA_R_32F == CUDA_R_32F && MPT_CUDA_R_16F == CUDA_R_16F);
static_assert(MPT_CUDA_R_32I == CUDA_R_32I && MPT_CUDA_R_16BF == CUDA_R_16BF);
static_assert(MPT_CUBLAS_COMPUTE_32F == CUBLAS_COMPUTE_32F);
static_assert(MPT_CUBLAS_COMPUTE_32F_FAST_TF32 == CUBLAS_COMPUTE_32F_FAST_TF32);
static_assert(MPT_CUBLAS_OP_N == CUBLAS_OP_N && MPT_CUBLAS_OP_T == CUBLAS_OP_T);
static_assert(MPT_LT_DESC_TRANSA == CUBLASLT_MATMUL_DESC_TRANSA);
static_assert(MPT_LT_DESC_TRANSB == CUBLASLT_MATMUL_DESC_TRANSB);
static_assert(MPT_LT_DESC_EPILOGUE == CUBLASLT_MATMUL_DESC_EPILOGUE);
static_assert(MPT_LT_DESC_BIAS_POINTER == CUBLASLT_MATMUL_DESC_BIAS_POINTER);
static_assert(MPT_LT_DESC_AUX_POINTER == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER);
static_assert(MPT_LT_DESC_AUX_LD == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD);
static_assert(MPT_LT_DESC_BIAS_DATA_TYPE == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE);
static_assert(MPT_LT_PREF_MAX_WORKSPACE_BYTES == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES);
static_assert(MPT_LT_PREF_MIN_ALIGNMENT_A_BYTES == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES);
static_assert(MPT_LT_PREF_MIN_ALIGNMENT_A_BYTES + 1 == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES);
static_assert(MPT_LT_PREF_MIN_ALIGNMENT_A_BYTES + 2 == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES);
static_assert(MPT_LT_PREF_MIN_ALIGNMENT_D_BYTES == CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES);
static_assert(MPT_LT_LAYOUT_ORDER == CUBLASLT_MATRIX_LAYOUT_ORDER);
static_assert(MPT_LT_LAYOUT_BATCH_COUNT == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
static_assert(MPT_LT_LAYOUT_STRIDED_BATCH_OFFSET == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
static_assert(MPT_LT_ORDER_ROW == CUBLASLT_ORDER_ROW);

#define EPI(x) static_assert(MPT_LT_EPI_##x == CUBLASLT_EPILOGUE_##x, #x)
EPI(DEFAULT); EPI(RELU); EPI(RELU_AUX); EPI(BIAS); EPI(RELU_BIAS); EPI(RELU_AUX_BIAS);
EPI(DRELU); EPI(DRELU_BGRAD); EPI(GELU); EPI(GELU_AUX); EPI(GELU_BIAS); EPI(GELU_AUX_BIAS);
EPI(DGELU); EPI(DGELU_BGRAD); EPI(BGRADA); EPI(BGRADB);

#ifndef MPT_ABI_NO_NCCL
static_assert(ncclSuccess == 0);
static_assert(MPT_NCCL_INT32 == ncclInt32 && MPT_NCCL_FLOAT32 == ncclFloat32);
static_assert(MPT_NCCL_SUM == ncclSum);
static_assert(MPT_NCCL_UNIQUE_ID_BYTES == NCCL_UNIQUE_ID_BYTES);
static_assert(sizeof(mpt_nccl_unique_id) == sizeof(ncclUniqueId));
static_assert(sizeof(mpt_nccl_result) == sizeof(ncclResult_t));
static_assert(sizeof(mpt_nccl_comm) == sizeof(ncclComm_t));
static_assert(sizeof(mpt_cu_stream) == sizeof(cudaStream_t));
#endif

/* ---- structs ---- */

static_assert(sizeof(mpt_cu_deviceptr) == sizeof(CUdeviceptr));
static_assert(sizeof(mpt_lt_algo) == sizeof(cublasLtMatmulAlgo_t));
static_assert(sizeof(mpt_lt_heuristic) == sizeof(cublasLtMatmulHeuristicResult_t));
static_assert(offsetof(mpt_lt_heuristic, workspace_size) ==
              offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize));
static_assert(offsetof(mpt_lt_heuristic, state) ==
              offsetof(cublasLtMatmulHeuristicResult_t, state));
static_assert(offsetof(mpt_lt_heuristic, waves_count) ==
              offsetof(cublasLtMatmulHeuristicResult_t, wavesCount));
static_assert(std::is_same_v<decltype(mpt_lt_heuristic::workspace_size),
                             decltype(cublasLtMatmulHeuristicResult_t::workspaceSize)>);
static_assert(std::is_same_v<decltype(mpt_lt_heuristic::waves_count),
                             decltype(cublasLtMatmulHeuristicResult_t::wavesCount)>);
static_assert(sizeof(mpt_lt_status) == sizeof(cublasStatus_t));

/* ---- signatures ---- */

/* a type as kind * 1000 + its size */
template <class T> constexpr long plain() {
    if constexpr (std::is_void_v<T>) return 0;
    else if constexpr (std::is_pointer_v<T>) return 1000 + (long)sizeof(T);
    else if constexpr (std::is_floating_point_v<T>) return 2000 + (long)sizeof(T);
    else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) return 3000 + (long)sizeof(T);
    else return 4000 + (long)sizeof(T); /* a struct passed by value */
}
/* what a pointer points to: a struct is one, of any size (a handle's is
 * opaque here and may be complete in the header; the layouts of the
 * structs mptc reads are asserted above) */
template <class T> constexpr long pointee() {
    if constexpr (std::is_class_v<T>) return 5000;
    else return plain<T>();
}
/* a parameter or result: for a pointer, what it points to, and once more
 * for a pointer to a pointer */
template <class T> constexpr long code() {
    if constexpr (std::is_pointer_v<T>) {
        using P = std::remove_cv_t<std::remove_pointer_t<T>>;
        if constexpr (std::is_pointer_v<P>)
            return 1000000000L + pointee<std::remove_cv_t<std::remove_pointer_t<P>>>() * 10000;
        else return 1000000000L + pointee<P>();
    }
    return plain<T>();
}

template <class F> struct sig;
template <class R, class... A> struct sig<R(A...)> {
    static constexpr int n = sizeof...(A) + 1;
    static constexpr long v[n] = {code<R>(), code<A>()...};
};
template <class R, class... A> struct sig<R (*)(A...)> : sig<R(A...)> {};

template <class Theirs, class Ours> constexpr int mismatch() {
    using T = sig<Theirs>;
    using O = sig<Ours>;
    if (T::n != O::n) return 100; /* the parameter count */
    for (int i = 0; i < T::n; i++)
        if (T::v[i] != O::v[i]) return i + 1; /* 1: the result, 2: the first parameter */
    return 0;
}

#define STR_(x) #x
#define STR(x) STR_(x)

struct sym {
    const char *loaded, *header_name; /* the name dlsym'd; the header's for its base */
    int bad;                          /* mismatch() */
};

/* SYM(name, base, table, member): name as codegen/cuda/driver.c loads it, base
 * the name without a _vN suffix */
#define SYM(name, base, table, member) \
    {#name, STR(base), mismatch<decltype(name), decltype(table::member)>()},
static const sym syms[] = {
#include "cuda_abi_syms.inc"
};

int main() {
    int failed = 0, n = (int)(sizeof syms / sizeof syms[0]);
    for (int i = 0; i < n; i++) {
        const sym *s = &syms[i];
        if (s->bad) {
            printf("FAIL %s: %s differs from the header's prototype\n", s->loaded,
                   s->bad == 100 ? "the parameter count"
                   : s->bad == 1 ? "the result"
                                 : "a parameter");
            if (s->bad > 1 && s->bad < 100) printf("    parameter %d\n", s->bad - 1);
            failed++;
        }
        /* the header's current name for this function is one mptc loads */
        int found = 0;
        for (int j = 0; j < n; j++) found |= strcmp(syms[j].loaded, s->header_name) == 0;
        if (!found) {
            printf("FAIL %s: the header calls it %s, which mptc does not load\n", s->loaded,
                   s->header_name);
            failed++;
        }
    }
    printf("cuda_abi: the values and struct layouts agree (checked when compiled); "
           "%d functions, %d failed\n", n, failed);
    return failed != 0;
}
