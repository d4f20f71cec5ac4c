/* codegen/cuda/driver.h — the CUDA libraries, loaded with dlopen: the driver,
 * NVRTC, cuBLASLt and NCCL, their ABI mirror, the check macros and the
 * device queries. The CUDA backend that runs plans on them is runtime/cuda/
 * (runtime/cuda/cuda.h).
 *
 * mptc links nothing from CUDA: libcuda.so.1 (the driver), libnvrtc,
 * libcublasLt and libnccl are opened at run time, so one binary runs with or
 * without a GPU and NVRTC (which needs no GPU) can generate PTX anywhere.
 * The few types and enum values used here are declared below; each mirrors
 * the ABI of the CUDA 12/13 headers (cuda.h, nvrtc.h, cublasLt.h,
 * library_types.h) and of NCCL 2's nccl.h, which NVIDIA keeps stable, so no
 * toolkit header is needed to build. tests/cuda_abi.t.sh checks every value,
 * struct layout and function signature here against those headers where the
 * toolkit is installed.
 *
 * Every call into these libraries goes through one check macro per library
 * (MPT_CU_CHECK, MPT_NVRTC_CHECK, MPT_LT_CHECK, MPT_NCCL_CHECK). Each carries
 * the statement text, function, file and line, and a hint saying what the
 * user can do; on failure it writes the message into `err` (size `n`, both
 * in scope) and jumps to the enclosing function's `fail:` label.
 */
#ifndef MPT_CODEGEN_CUDA_DRIVER_H
#define MPT_CODEGEN_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>


/* ---- driver API (mirrors cuda.h) ---- */

typedef int mpt_cu_result;             /* CUresult; 0 is CUDA_SUCCESS */
typedef int mpt_cu_device;             /* CUdevice */
typedef struct mpt_cu_ctx_st *mpt_cu_context;
typedef struct mpt_cu_mod_st *mpt_cu_module;
typedef struct mpt_cu_func_st *mpt_cu_function;
typedef struct mpt_cu_event_st *mpt_cu_event;
typedef struct mpt_cu_stream_st *mpt_cu_stream;
typedef struct mpt_cu_graph_st *mpt_cu_graph;
typedef struct mpt_cu_graph_exec_st *mpt_cu_graph_exec;
typedef unsigned long long mpt_cu_deviceptr; /* CUdeviceptr (64-bit) */

enum { /* CUdevice_attribute values */
    MPT_CU_ATTR_MULTIPROCESSOR_COUNT = 16,
    MPT_CU_ATTR_CC_MAJOR = 75,
    MPT_CU_ATTR_CC_MINOR = 76,
    MPT_CU_ATTR_MAX_SHARED_OPTIN = 97,
};
enum { MPT_CU_FUNC_ATTR_MAX_DYNAMIC_SHARED = 8 }; /* CUfunction_attribute */
enum { MPT_CU_ERROR_NO_DEVICE = 100 };

typedef struct {
    mpt_cu_result (*init)(unsigned flags);
    mpt_cu_result (*driver_get_version)(int *v);
    mpt_cu_result (*device_get_count)(int *n);
    mpt_cu_result (*device_get)(mpt_cu_device *d, int ordinal);
    mpt_cu_result (*device_get_name)(char *name, int len, mpt_cu_device d);
    mpt_cu_result (*device_get_attribute)(int *v, int attr, mpt_cu_device d);
    mpt_cu_result (*device_total_mem)(size_t *bytes, mpt_cu_device d);
    mpt_cu_result (*primary_ctx_retain)(mpt_cu_context *c, mpt_cu_device d);
    mpt_cu_result (*primary_ctx_release)(mpt_cu_device d);
    mpt_cu_result (*ctx_set_current)(mpt_cu_context c);
    mpt_cu_result (*ctx_synchronize)(void);
    mpt_cu_result (*module_load_data)(mpt_cu_module *m, const void *image);
    mpt_cu_result (*module_unload)(mpt_cu_module m);
    mpt_cu_result (*module_get_function)(mpt_cu_function *f, mpt_cu_module m,
                                         const char *name);
    mpt_cu_result (*func_set_attribute)(mpt_cu_function f, int attr, int value);
    mpt_cu_result (*launch_kernel)(mpt_cu_function f, unsigned gx, unsigned gy,
                                   unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                   unsigned shared_bytes, mpt_cu_stream s,
                                   void **params, void **extra);
    mpt_cu_result (*mem_alloc)(mpt_cu_deviceptr *p, size_t bytes);
    mpt_cu_result (*mem_free)(mpt_cu_deviceptr p);
    mpt_cu_result (*memcpy_htod)(mpt_cu_deviceptr dst, const void *src, size_t bytes);
    mpt_cu_result (*memcpy_dtoh)(void *dst, mpt_cu_deviceptr src, size_t bytes);
    mpt_cu_result (*memset_d8)(mpt_cu_deviceptr dst, unsigned char v, size_t bytes);
    mpt_cu_result (*memcpy_dtod)(mpt_cu_deviceptr dst, mpt_cu_deviceptr src, size_t bytes);
    mpt_cu_result (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);
    mpt_cu_result (*event_create)(mpt_cu_event *e, unsigned flags);
    mpt_cu_result (*event_record)(mpt_cu_event e, mpt_cu_stream s);
    mpt_cu_result (*event_synchronize)(mpt_cu_event e);
    mpt_cu_result (*event_elapsed_time)(float *ms, mpt_cu_event a, mpt_cu_event b);
    mpt_cu_result (*event_destroy)(mpt_cu_event e);
    mpt_cu_result (*get_error_string)(mpt_cu_result r, const char **s);
    /* Streams and graphs (a step captured once, replayed in one launch):
     * all set, or all NULL where the driver lacks one of them. They stay
     * last: the loader clears them from stream_create to the end. */
    mpt_cu_result (*stream_create)(mpt_cu_stream *s, unsigned flags);
    mpt_cu_result (*stream_destroy)(mpt_cu_stream s);
    mpt_cu_result (*stream_begin_capture)(mpt_cu_stream s, int mode);
    mpt_cu_result (*stream_end_capture)(mpt_cu_stream s, mpt_cu_graph *g);
    mpt_cu_result (*graph_instantiate)(mpt_cu_graph_exec *e, mpt_cu_graph g,
                                       unsigned long long flags);
    mpt_cu_result (*graph_launch)(mpt_cu_graph_exec e, mpt_cu_stream s);
    mpt_cu_result (*graph_exec_destroy)(mpt_cu_graph_exec e);
    mpt_cu_result (*graph_destroy)(mpt_cu_graph g);
    mpt_cu_result (*memset_d8_async)(mpt_cu_deviceptr dst, unsigned char v, size_t bytes,
                                     mpt_cu_stream s);
    mpt_cu_result (*memcpy_htod_async)(mpt_cu_deviceptr dst, const void *src, size_t bytes,
                                       mpt_cu_stream s);
    mpt_cu_result (*memcpy_dtod_async)(mpt_cu_deviceptr dst, mpt_cu_deviceptr src, size_t bytes,
                                       mpt_cu_stream s);
    /* work queued on s after this call waits for e's recorded work */
    mpt_cu_result (*stream_wait_event)(mpt_cu_stream s, mpt_cu_event e, unsigned flags);
} mpt_cu_api;
enum { MPT_CU_CAPTURE_THREAD_LOCAL = 1 }; /* CUstreamCaptureMode */
enum { MPT_CU_EVENT_DISABLE_TIMING = 2 }; /* CU_EVENT_DISABLE_TIMING */

/* ---- NVRTC (mirrors nvrtc.h) ---- */

typedef int mpt_nvrtc_result; /* nvrtcResult; 0 is NVRTC_SUCCESS */
typedef struct mpt_nvrtc_prog_st *mpt_nvrtc_program;

typedef struct {
    mpt_nvrtc_result (*version)(int *major, int *minor);
    mpt_nvrtc_result (*create_program)(mpt_nvrtc_program *p, const char *src,
                                       const char *name, int n_headers,
                                       const char *const *headers,
                                       const char *const *include_names);
    mpt_nvrtc_result (*destroy_program)(mpt_nvrtc_program *p);
    mpt_nvrtc_result (*compile_program)(mpt_nvrtc_program p, int n_opts,
                                        const char *const *opts);
    mpt_nvrtc_result (*get_ptx_size)(mpt_nvrtc_program p, size_t *n);
    mpt_nvrtc_result (*get_ptx)(mpt_nvrtc_program p, char *ptx);
    mpt_nvrtc_result (*get_cubin_size)(mpt_nvrtc_program p, size_t *n);
    mpt_nvrtc_result (*get_cubin)(mpt_nvrtc_program p, char *cubin);
    mpt_nvrtc_result (*get_program_log_size)(mpt_nvrtc_program p, size_t *n);
    mpt_nvrtc_result (*get_program_log)(mpt_nvrtc_program p, char *log);
    const char *(*get_error_string)(mpt_nvrtc_result r);
} mpt_nvrtc_api;

/* ---- cuBLASLt (mirrors cublasLt.h, library_types.h) ---- */

typedef int mpt_lt_status; /* cublasStatus_t; 0 is CUBLAS_STATUS_SUCCESS */
typedef struct mpt_lt_handle_st *mpt_lt_handle;
typedef struct mpt_lt_desc_st *mpt_lt_matmul_desc;
typedef struct mpt_lt_layout_st *mpt_lt_layout;
typedef struct mpt_lt_pref_st *mpt_lt_pref;
typedef struct { uint64_t data[8]; } mpt_lt_algo; /* cublasLtMatmulAlgo_t */
typedef struct {                                  /* cublasLtMatmulHeuristicResult_t */
    mpt_lt_algo algo;
    size_t workspace_size;
    mpt_lt_status state;
    float waves_count;
    int reserved[4];
} mpt_lt_heuristic;

enum { /* cudaDataType_t */
    MPT_CUDA_R_32F = 0,
    MPT_CUDA_R_16F = 2,
    MPT_CUDA_R_32I = 10,
    MPT_CUDA_R_16BF = 14,
};
enum {
    MPT_CUBLAS_COMPUTE_32F = 68,
    MPT_CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
    MPT_CUBLAS_OP_N = 0,
    MPT_CUBLAS_OP_T = 1
};
enum { /* cublasLtMatmulDescAttributes_t */
    MPT_LT_DESC_TRANSA = 3,
    MPT_LT_DESC_TRANSB = 4,
    MPT_LT_DESC_EPILOGUE = 7,
    MPT_LT_DESC_BIAS_POINTER = 8,
    MPT_LT_DESC_AUX_POINTER = 11,
    MPT_LT_DESC_AUX_LD = 12,
    MPT_LT_DESC_BIAS_DATA_TYPE = 26,
};
enum {
    MPT_LT_PREF_MAX_WORKSPACE_BYTES = 1,
    MPT_LT_PREF_MIN_ALIGNMENT_A_BYTES = 5, /* ... B 6, C 7, D 8 */
    MPT_LT_PREF_MIN_ALIGNMENT_D_BYTES = 8,
};
enum { /* cublasLtMatrixLayoutAttribute_t */
    MPT_LT_LAYOUT_ORDER = 1,
    MPT_LT_LAYOUT_BATCH_COUNT = 5,           /* int32_t */
    MPT_LT_LAYOUT_STRIDED_BATCH_OFFSET = 6,  /* int64_t, in elements */
};
enum { MPT_LT_ORDER_ROW = 1 };

typedef struct {
    size_t (*get_version)(void);
    mpt_lt_status (*create)(mpt_lt_handle *h);
    mpt_lt_status (*destroy)(mpt_lt_handle h);
    mpt_lt_status (*matmul_desc_create)(mpt_lt_matmul_desc *d, int compute_type,
                                        int scale_type);
    mpt_lt_status (*matmul_desc_destroy)(mpt_lt_matmul_desc d);
    mpt_lt_status (*matmul_desc_set_attribute)(mpt_lt_matmul_desc d, int attr,
                                               const void *buf, size_t n);
    mpt_lt_status (*layout_create)(mpt_lt_layout *l, int type, uint64_t rows,
                                   uint64_t cols, int64_t ld);
    mpt_lt_status (*layout_destroy)(mpt_lt_layout l);
    mpt_lt_status (*layout_set_attribute)(mpt_lt_layout l, int attr, const void *buf,
                                          size_t n);
    mpt_lt_status (*pref_create)(mpt_lt_pref *p);
    mpt_lt_status (*pref_destroy)(mpt_lt_pref p);
    mpt_lt_status (*pref_set_attribute)(mpt_lt_pref p, int attr, const void *buf,
                                        size_t n);
    mpt_lt_status (*algo_get_heuristic)(mpt_lt_handle h, mpt_lt_matmul_desc d,
                                        mpt_lt_layout a, mpt_lt_layout b,
                                        mpt_lt_layout c, mpt_lt_layout dd,
                                        mpt_lt_pref p, int requested,
                                        mpt_lt_heuristic *results, int *n_results);
    mpt_lt_status (*matmul)(mpt_lt_handle h, mpt_lt_matmul_desc d, const void *alpha,
                            const void *A, mpt_lt_layout ad, const void *B,
                            mpt_lt_layout bd, const void *beta, const void *C,
                            mpt_lt_layout cd, void *D, mpt_lt_layout dd,
                            const mpt_lt_algo *algo, void *workspace, size_t ws_bytes,
                            mpt_cu_stream s);
} mpt_lt_api;

/* ---- NCCL (mirrors nccl.h, NCCL 2) ---- */

/* Data-parallel CUDA ranks sum their gradients with NCCL, one GPU a rank
 * (runtime/cuda/cuda_nccl.c). Its calls take the driver's streams: a
 * cudaStream_t is a CUstream. */
typedef int mpt_nccl_result;                 /* ncclResult_t; 0 is ncclSuccess */
typedef struct mpt_nccl_comm_st *mpt_nccl_comm; /* ncclComm_t */
enum { MPT_NCCL_UNIQUE_ID_BYTES = 128 };      /* NCCL_UNIQUE_ID_BYTES */
typedef struct { char internal[MPT_NCCL_UNIQUE_ID_BYTES]; } mpt_nccl_unique_id; /* ncclUniqueId */
enum { MPT_NCCL_INT32 = 2, MPT_NCCL_FLOAT32 = 7 }; /* ncclDataType_t */
enum { MPT_NCCL_SUM = 0 };                         /* ncclRedOp_t */

typedef struct {
    mpt_nccl_result (*get_version)(int *version);
    mpt_nccl_result (*get_unique_id)(mpt_nccl_unique_id *id);
    mpt_nccl_result (*comm_init_rank)(mpt_nccl_comm *comm, int nranks, mpt_nccl_unique_id id,
                                      int rank);
    mpt_nccl_result (*comm_destroy)(mpt_nccl_comm comm);
    mpt_nccl_result (*all_reduce)(const void *send, void *recv, size_t count, int dtype, int op,
                                  mpt_nccl_comm comm, mpt_cu_stream s);
    /* recv[recvcount] = shard `rank` of the sum of every rank's send[nranks * recvcount] */
    mpt_nccl_result (*reduce_scatter)(const void *send, void *recv, size_t recvcount, int dtype,
                                      int op, mpt_nccl_comm comm, mpt_cu_stream s);
    /* recv[nranks * sendcount] = every rank's send[sendcount] in rank order */
    mpt_nccl_result (*all_gather)(const void *send, void *recv, size_t sendcount, int dtype,
                                  mpt_nccl_comm comm, mpt_cu_stream s);
    const char *(*get_error_string)(mpt_nccl_result r);
    /* the collectives called between the two are one launch (NCCL's
     * aggregated operations): a bucket of gradients in one message */
    mpt_nccl_result (*group_start)(void);
    mpt_nccl_result (*group_end)(void);
} mpt_nccl_api;

/* ---- loading ---- */

/* Each returns the library's table, loading it on first use, or NULL with
 * the reason (which library names were tried, dlerror) in why. Thread-safe.
 * The driver's absence is said once on stderr the first time it is asked
 * for with say_cpu set: "no CUDA driver found: running on the CPU".
 * $MPTC_LIBCUDA and $MPTC_LIBCUBLASLT name a library file to open instead
 * (a driver outside the loader's path; the tests' recording driver), and
 * MPTC_LIBCUBLASLT=none runs every GEMM as a generated kernel. */
const mpt_cu_api *mpt_cuda_driver(int say_cpu, char *why, size_t n);
const mpt_nvrtc_api *mpt_cuda_nvrtc(char *why, size_t n);
const mpt_lt_api *mpt_cuda_cublaslt(char *why, size_t n);
/* libnccl.so.2, only for data-parallel CUDA ranks; $MPTC_LIBNCCL names the
 * file instead (the tests' recording NCCL). */
const mpt_nccl_api *mpt_cuda_nccl(char *why, size_t n);
/* One line each for the driver, NVRTC, cuBLASLt and NCCL: the file loaded
 * and its version, or why none was (`mptc devices`; scripts/gpu_run.sh
 * checks them before any step). MPTC_LIBCUDA, MPTC_LIBNVRTC,
 * MPTC_LIBCUBLASLT, MPTC_LIBNCCL name the files to load instead of the
 * search. */
void mpt_cuda_describe_libraries(FILE *f);

/* ---- the check macros ---- */

/* Each returns 0 when r is success, else writes "FILE:LINE: FUNC: STMT
 * failed: LIBRARY ERROR (hint: HINT)" into err and returns -1. */
int mpt_cu_check_(mpt_cu_result r, const char *stmt, const char *func, const char *file,
                  int line, const char *hint, char *err, size_t n);
int mpt_nvrtc_check_(mpt_nvrtc_result r, const char *stmt, const char *func,
                     const char *file, int line, const char *hint, char *err, size_t n);
/* "NOT_SUPPORTED" for a cublasStatus_t */
const char *mpt_lt_status_name(mpt_lt_status r);
int mpt_lt_check_(mpt_lt_status r, const char *stmt, const char *func, const char *file,
                  int line, const char *hint, char *err, size_t n);
int mpt_nccl_check_(mpt_nccl_result r, const char *stmt, const char *func, const char *file,
                    int line, const char *hint, char *err, size_t n);

#define MPT_CU_CHECK(stmt, hint)                                                     \
    do {                                                                             \
        if (mpt_cu_check_((stmt), #stmt, __func__, __FILE__, __LINE__, (hint), err, \
                          n))                                                        \
            goto fail;                                                               \
    } while (0)
#define MPT_NVRTC_CHECK(stmt, hint)                                                  \
    do {                                                                             \
        if (mpt_nvrtc_check_((stmt), #stmt, __func__, __FILE__, __LINE__, (hint),   \
                             err, n))                                                \
            goto fail;                                                               \
    } while (0)
#define MPT_LT_CHECK(stmt, hint)                                                     \
    do {                                                                             \
        if (mpt_lt_check_((stmt), #stmt, __func__, __FILE__, __LINE__, (hint), err, \
                          n))                                                        \
            goto fail;                                                               \
    } while (0)

#define MPT_NCCL_CHECK(stmt, hint)                                                   \
    do {                                                                             \
        if (mpt_nccl_check_((stmt), #stmt, __func__, __FILE__, __LINE__, (hint), err, \
                            n))                                                      \
            goto fail;                                                               \
    } while (0)

/* ---- devices ---- */

typedef struct {
    int ordinal;
    char name[256];
    int cc_major, cc_minor;
    int sm_count;
    size_t total_mem;
} mpt_cuda_device_info;

/* Number of devices (0 when there is no driver or no device; why says
 * which) and the first up to cap of them in out. -1 with err on a driver
 * error. */
int mpt_cuda_devices(mpt_cuda_device_info *out, int cap, char *why, size_t n);
/* "sm_90" for compute capability 9.0 */
void mpt_cuda_arch_name(int cc_major, int cc_minor, char *buf, size_t n);
/* One line per device, with what it supports (f16/bf16 Tensor Cores), for
 * `mptc devices`; or why there is none. */
void mpt_cuda_print_devices(FILE *f);

/* The device this process computes on: 0, unless a data-parallel rank
 * took its own (runtime/cuda's mpt_cuda_nccl_join: the local rank modulo
 * the devices). The CUDA backend compiles and runs on it. */
void mpt_cuda_set_device(int ordinal);
int mpt_cuda_device(void);

/* Bytes free on that device (cuMemGetInfo in a context of its own), or -1
 * when there is no device. */
int64_t mpt_cuda_free_bytes(void);

#endif
