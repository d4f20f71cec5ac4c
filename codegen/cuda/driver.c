/* codegen/cuda/driver.c — the CUDA libraries (driver, NVRTC, cuBLASLt, NCCL)
 * through dlopen, the check helpers and device queries (driver.h). The
 * backend that runs plans is runtime/cuda/.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen/cuda/cuda.h"
#include "codegen/cuda/driver.h"

/* ---- loading ---- */

/* dlsym into *slot; remembers the first missing name */
static void load_sym(void *h, const char *name, void *slot, const char **missing) {
    void *p = dlsym(h, name);
    memcpy(slot, &p, sizeof p);
    if (!p && !*missing) *missing = name;
}

/* Tries each name bare (the loader's path) and under the toolkit's usual
 * directories, so NVRTC is found without LD_LIBRARY_PATH. */
static void *open_any(const char *const *names, char *tried, size_t n) {
    static const char *dirs[] = {"", "/usr/local/cuda/lib64/",
                                 "/usr/local/cuda/targets/x86_64-linux/lib/"};
    size_t o = 0;
    tried[0] = 0;
    for (size_t d = 0; d < sizeof dirs / sizeof *dirs; d++)
        for (int i = 0; names[i]; i++) {
            char path[256];
            snprintf(path, sizeof path, "%s%s", dirs[d], names[i]);
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (h) return h;
            if (d == 0 && o < n) o += (size_t)snprintf(tried + o, n - o, "%s%s", o ? ", " : "", names[i]);
        }
    return NULL;
}

/* $var names the file to open when set ("none": open nothing) */
static void *open_env(const char *var, const char *const *names, char *tried, size_t n) {
    const char *path = getenv(var);
    if (!path || !*path) return open_any(names, tried, n);
    snprintf(tried, n, "%s=%s", var, path);
    return strcmp(path, "none") == 0 ? NULL : dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

static mpt_cu_api cu_api;
static int cu_state; /* 0 untried, 1 loaded, -1 failed */
static char cu_why[256];
static int cu_said;

const mpt_cu_api *mpt_cuda_driver(int say_cpu, char *why, size_t n) {
    pthread_mutex_lock(&load_lock);
    if (cu_state == 0) {
        static const char *names[] = {"libcuda.so.1", "libcuda.so", NULL};
        char tried[200];
        void *h = open_env("MPTC_LIBCUDA", names, tried, sizeof tried);
        const char *missing = NULL;
        if (!h) {
            if (getenv("MPTC_LIBCUDA"))
                snprintf(cu_why, sizeof cu_why, "no CUDA driver: %s: %s", tried, dlerror());
            else
                snprintf(cu_why, sizeof cu_why, "no CUDA driver (libcuda.so.1) found");
        } else {
            mpt_cu_api *a = &cu_api;
            load_sym(h, "cuInit", &a->init, &missing);
            load_sym(h, "cuDriverGetVersion", &a->driver_get_version, &missing);
            load_sym(h, "cuDeviceGetCount", &a->device_get_count, &missing);
            load_sym(h, "cuDeviceGet", &a->device_get, &missing);
            load_sym(h, "cuDeviceGetName", &a->device_get_name, &missing);
            load_sym(h, "cuDeviceGetAttribute", &a->device_get_attribute, &missing);
            load_sym(h, "cuDeviceTotalMem_v2", &a->device_total_mem, &missing);
            load_sym(h, "cuDevicePrimaryCtxRetain", &a->primary_ctx_retain, &missing);
            load_sym(h, "cuDevicePrimaryCtxRelease_v2", &a->primary_ctx_release, &missing);
            load_sym(h, "cuCtxSetCurrent", &a->ctx_set_current, &missing);
            load_sym(h, "cuCtxSynchronize", &a->ctx_synchronize, &missing);
            load_sym(h, "cuModuleLoadData", &a->module_load_data, &missing);
            load_sym(h, "cuModuleUnload", &a->module_unload, &missing);
            load_sym(h, "cuModuleGetFunction", &a->module_get_function, &missing);
            load_sym(h, "cuFuncSetAttribute", &a->func_set_attribute, &missing);
            load_sym(h, "cuLaunchKernel", &a->launch_kernel, &missing);
            load_sym(h, "cuMemAlloc_v2", &a->mem_alloc, &missing);
            load_sym(h, "cuMemFree_v2", &a->mem_free, &missing);
            load_sym(h, "cuMemcpyHtoD_v2", &a->memcpy_htod, &missing);
            load_sym(h, "cuMemcpyDtoH_v2", &a->memcpy_dtoh, &missing);
            load_sym(h, "cuMemsetD8_v2", &a->memset_d8, &missing);
            load_sym(h, "cuMemcpyDtoD_v2", &a->memcpy_dtod, &missing);
            load_sym(h, "cuMemGetInfo_v2", &a->mem_get_info, &missing);
            load_sym(h, "cuEventCreate", &a->event_create, &missing);
            load_sym(h, "cuEventRecord", &a->event_record, &missing);
            load_sym(h, "cuEventSynchronize", &a->event_synchronize, &missing);
            load_sym(h, "cuEventDestroy_v2", &a->event_destroy, &missing);
            load_sym(h, "cuGetErrorString", &a->get_error_string, &missing);
            /* CUDA 13 renamed it; 12 has only the plain name */
            const char *m2 = NULL;
            load_sym(h, "cuEventElapsedTime_v2", &a->event_elapsed_time, &m2);
            if (m2) load_sym(h, "cuEventElapsedTime", &a->event_elapsed_time, &missing);
            const char *m3 = NULL; /* optional: without them steps launch kernel by kernel */
            load_sym(h, "cuStreamCreate", &a->stream_create, &m3);
            load_sym(h, "cuStreamDestroy_v2", &a->stream_destroy, &m3);
            load_sym(h, "cuStreamBeginCapture_v2", &a->stream_begin_capture, &m3);
            load_sym(h, "cuStreamEndCapture", &a->stream_end_capture, &m3);
            load_sym(h, "cuGraphInstantiateWithFlags", &a->graph_instantiate, &m3);
            load_sym(h, "cuGraphLaunch", &a->graph_launch, &m3);
            load_sym(h, "cuGraphExecDestroy", &a->graph_exec_destroy, &m3);
            load_sym(h, "cuGraphDestroy", &a->graph_destroy, &m3);
            load_sym(h, "cuMemsetD8Async", &a->memset_d8_async, &m3);
            load_sym(h, "cuMemcpyHtoDAsync_v2", &a->memcpy_htod_async, &m3);
            load_sym(h, "cuMemcpyDtoDAsync_v2", &a->memcpy_dtod_async, &m3);
            load_sym(h, "cuStreamWaitEvent", &a->stream_wait_event, &m3);
            if (m3) /* all or none: they close the struct (codegen/cuda/driver.h) */
                memset(&a->stream_create, 0, sizeof *a - offsetof(mpt_cu_api, stream_create));
            if (missing)
                snprintf(cu_why, sizeof cu_why, "libcuda.so.1 lacks %s (driver too old?)", missing);
        }
        cu_state = h && !missing ? 1 : -1;
    }
    if (cu_state < 0 && say_cpu && !cu_said) {
        cu_said = 1;
        fprintf(stderr, "no CUDA driver found: running on the CPU (%s)\n", cu_why);
    }
    int ok = cu_state > 0;
    pthread_mutex_unlock(&load_lock);
    if (!ok && why) snprintf(why, n, "%s", cu_why);
    return ok ? &cu_api : NULL;
}

static mpt_nvrtc_api nv_api;
static int nv_state;
static char nv_why[400];

const mpt_nvrtc_api *mpt_cuda_nvrtc(char *why, size_t n) {
    pthread_mutex_lock(&load_lock);
    if (nv_state == 0) {
        static const char *names[] = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", NULL};
        char tried[200];
        void *h = open_env("MPTC_LIBNVRTC", names, tried, sizeof tried);
        const char *missing = NULL;
        if (!h) {
            snprintf(nv_why, sizeof nv_why, "NVRTC not found (tried %s; hint: install the CUDA "
                     "toolkit's NVRTC, add its lib64 directory to LD_LIBRARY_PATH, or name the "
                     "file in MPTC_LIBNVRTC)", tried);
        } else {
            mpt_nvrtc_api *a = &nv_api;
            load_sym(h, "nvrtcVersion", &a->version, &missing);
            load_sym(h, "nvrtcCreateProgram", &a->create_program, &missing);
            load_sym(h, "nvrtcDestroyProgram", &a->destroy_program, &missing);
            load_sym(h, "nvrtcCompileProgram", &a->compile_program, &missing);
            load_sym(h, "nvrtcGetPTXSize", &a->get_ptx_size, &missing);
            load_sym(h, "nvrtcGetPTX", &a->get_ptx, &missing);
            load_sym(h, "nvrtcGetCUBINSize", &a->get_cubin_size, &missing);
            load_sym(h, "nvrtcGetCUBIN", &a->get_cubin, &missing);
            load_sym(h, "nvrtcGetProgramLogSize", &a->get_program_log_size, &missing);
            load_sym(h, "nvrtcGetProgramLog", &a->get_program_log, &missing);
            load_sym(h, "nvrtcGetErrorString", &a->get_error_string, &missing);
            if (missing)
                snprintf(nv_why, sizeof nv_why, "libnvrtc lacks %s (hint: NVRTC 11.1 or newer "
                         "is needed)", missing);
        }
        nv_state = h && !missing ? 1 : -1;
    }
    int ok = nv_state > 0;
    pthread_mutex_unlock(&load_lock);
    if (!ok && why) snprintf(why, n, "%s", nv_why);
    return ok ? &nv_api : NULL;
}

static mpt_lt_api lt_api;
static int lt_state;
static char lt_why[400];

const mpt_lt_api *mpt_cuda_cublaslt(char *why, size_t n) {
    pthread_mutex_lock(&load_lock);
    if (lt_state == 0) {
        static const char *names[] = {"libcublasLt.so", "libcublasLt.so.13", "libcublasLt.so.12",
                                      NULL};
        char tried[200];
        void *h = open_env("MPTC_LIBCUBLASLT", names, tried, sizeof tried);
        const char *missing = NULL;
        if (!h) {
            snprintf(lt_why, sizeof lt_why, "cuBLASLt not found (tried %s; hint: install "
                     "libcublas from the CUDA toolkit)", tried);
        } else {
            mpt_lt_api *a = &lt_api;
            load_sym(h, "cublasLtGetVersion", &a->get_version, &missing);
            load_sym(h, "cublasLtCreate", &a->create, &missing);
            load_sym(h, "cublasLtDestroy", &a->destroy, &missing);
            load_sym(h, "cublasLtMatmulDescCreate", &a->matmul_desc_create, &missing);
            load_sym(h, "cublasLtMatmulDescDestroy", &a->matmul_desc_destroy, &missing);
            load_sym(h, "cublasLtMatmulDescSetAttribute", &a->matmul_desc_set_attribute, &missing);
            load_sym(h, "cublasLtMatrixLayoutCreate", &a->layout_create, &missing);
            load_sym(h, "cublasLtMatrixLayoutDestroy", &a->layout_destroy, &missing);
            load_sym(h, "cublasLtMatrixLayoutSetAttribute", &a->layout_set_attribute, &missing);
            load_sym(h, "cublasLtMatmulPreferenceCreate", &a->pref_create, &missing);
            load_sym(h, "cublasLtMatmulPreferenceDestroy", &a->pref_destroy, &missing);
            load_sym(h, "cublasLtMatmulPreferenceSetAttribute", &a->pref_set_attribute, &missing);
            load_sym(h, "cublasLtMatmulAlgoGetHeuristic", &a->algo_get_heuristic, &missing);
            load_sym(h, "cublasLtMatmul", &a->matmul, &missing);
            if (missing) snprintf(lt_why, sizeof lt_why, "libcublasLt lacks %s", missing);
        }
        lt_state = h && !missing ? 1 : -1;
    }
    int ok = lt_state > 0;
    pthread_mutex_unlock(&load_lock);
    if (!ok && why) snprintf(why, n, "%s", lt_why);
    return ok ? &lt_api : NULL;
}

static mpt_nccl_api nccl_api;
static int nccl_state;
static char nccl_why[400];

const mpt_nccl_api *mpt_cuda_nccl(char *why, size_t n) {
    pthread_mutex_lock(&load_lock);
    if (nccl_state == 0) {
        static const char *names[] = {"libnccl.so.2", "libnccl.so", NULL};
        char tried[200];
        void *h = open_env("MPTC_LIBNCCL", names, tried, sizeof tried);
        const char *missing = NULL;
        if (!h) {
            snprintf(nccl_why, sizeof nccl_why, "NCCL not found (tried %s%s%s)", tried,
                     getenv("MPTC_LIBNCCL") ? ": " : "", getenv("MPTC_LIBNCCL") ? dlerror() : "");
        } else {
            mpt_nccl_api *a = &nccl_api;
            load_sym(h, "ncclGetVersion", &a->get_version, &missing);
            load_sym(h, "ncclGetUniqueId", &a->get_unique_id, &missing);
            load_sym(h, "ncclCommInitRank", &a->comm_init_rank, &missing);
            load_sym(h, "ncclCommDestroy", &a->comm_destroy, &missing);
            load_sym(h, "ncclAllReduce", &a->all_reduce, &missing);
            load_sym(h, "ncclReduceScatter", &a->reduce_scatter, &missing);
            load_sym(h, "ncclAllGather", &a->all_gather, &missing);
            load_sym(h, "ncclGetErrorString", &a->get_error_string, &missing);
            load_sym(h, "ncclGroupStart", &a->group_start, &missing);
            load_sym(h, "ncclGroupEnd", &a->group_end, &missing);
            if (missing)
                snprintf(nccl_why, sizeof nccl_why, "libnccl lacks %s (NCCL 2 is needed)", missing);
        }
        nccl_state = h && !missing ? 1 : -1;
    }
    int ok = nccl_state > 0;
    pthread_mutex_unlock(&load_lock);
    if (!ok && why) snprintf(why, n, "%s", nccl_why);
    return ok ? &nccl_api : NULL;
}

/* ---- checks ---- */

int mpt_cu_check_(mpt_cu_result r, const char *stmt, const char *func, const char *file,
                  int line, const char *hint, char *err, size_t n) {
    if (r == 0) return 0;
    const char *s = NULL;
    if (cu_state > 0) cu_api.get_error_string(r, &s);
    snprintf(err, n, "%s:%d: %s: %s failed: CUDA error %d (%s)\n  hint: %s", file, line, func,
             stmt, r, s ? s : "unknown", hint);
    return -1;
}

int mpt_nvrtc_check_(mpt_nvrtc_result r, const char *stmt, const char *func, const char *file,
                     int line, const char *hint, char *err, size_t n) {
    if (r == 0) return 0;
    snprintf(err, n, "%s:%d: %s: %s failed: NVRTC error %d (%s)\n  hint: %s", file, line, func,
             stmt, r, nv_state > 0 ? nv_api.get_error_string(r) : "?", hint);
    return -1;
}

const char *mpt_lt_status_name(mpt_lt_status r) {
    switch (r) { /* cublasStatus_t values */
    case 1: return "NOT_INITIALIZED";
    case 3: return "ALLOC_FAILED";
    case 7: return "INVALID_VALUE";
    case 8: return "ARCH_MISMATCH";
    case 13: return "EXECUTION_FAILED";
    case 14: return "INTERNAL_ERROR";
    case 15: return "NOT_SUPPORTED";
    }
    return "unknown";
}

int mpt_lt_check_(mpt_lt_status r, const char *stmt, const char *func, const char *file,
                  int line, const char *hint, char *err, size_t n) {
    if (r == 0) return 0;
    snprintf(err, n, "%s:%d: %s: %s failed: cuBLASLt status %d (%s)\n  hint: %s", file, line,
             func, stmt, r, mpt_lt_status_name(r), hint);
    return -1;
}

int mpt_nccl_check_(mpt_nccl_result r, const char *stmt, const char *func, const char *file,
                    int line, const char *hint, char *err, size_t n) {
    if (r == 0) return 0;
    snprintf(err, n, "%s:%d: %s: %s failed: NCCL error %d (%s)\n  hint: %s", file, line, func,
             stmt, r, nccl_state > 0 ? nccl_api.get_error_string(r) : "?", hint);
    return -1;
}

/* ---- devices ---- */

static int device_ordinal;

void mpt_cuda_set_device(int ordinal) { device_ordinal = ordinal; }

int mpt_cuda_device(void) { return device_ordinal; }

void mpt_cuda_arch_name(int cc_major, int cc_minor, char *buf, size_t n) {
    snprintf(buf, n, "sm_%d%d", cc_major, cc_minor);
}

int mpt_cuda_devices(mpt_cuda_device_info *out, int cap, char *why, size_t nwhy) {
    char *err = why;
    size_t n = nwhy;
    const mpt_cu_api *cu = mpt_cuda_driver(0, why, nwhy);
    if (!cu) return 0;
    mpt_cu_result r = cu->init(0);
    if (r == MPT_CU_ERROR_NO_DEVICE) {
        snprintf(why, nwhy, "the CUDA driver sees no device");
        return 0;
    }
    MPT_CU_CHECK(r, "check that the NVIDIA kernel module is loaded (nvidia-smi)");
    int count = 0;
    MPT_CU_CHECK(cu->device_get_count(&count), "check nvidia-smi");
    for (int i = 0; i < count && i < cap; i++) {
        mpt_cuda_device_info *d = &out[i];
        mpt_cu_device dev;
        memset(d, 0, sizeof *d);
        d->ordinal = i;
        MPT_CU_CHECK(cu->device_get(&dev, i), "check nvidia-smi");
        MPT_CU_CHECK(cu->device_get_name(d->name, sizeof d->name, dev), "check nvidia-smi");
        MPT_CU_CHECK(cu->device_get_attribute(&d->cc_major, MPT_CU_ATTR_CC_MAJOR, dev), "");
        MPT_CU_CHECK(cu->device_get_attribute(&d->cc_minor, MPT_CU_ATTR_CC_MINOR, dev), "");
        MPT_CU_CHECK(cu->device_get_attribute(&d->sm_count, MPT_CU_ATTR_MULTIPROCESSOR_COUNT, dev),
                     "");
        MPT_CU_CHECK(cu->device_total_mem(&d->total_mem, dev), "");
    }
    if (count == 0) snprintf(why, nwhy, "the CUDA driver sees no device");
    return count;
fail:
    return -1;
}

void mpt_cuda_print_devices(FILE *f) {
    mpt_cuda_device_info d[8];
    char why[512] = "";
    int c = mpt_cuda_devices(d, 8, why, sizeof why);
    if (c <= 0) {
        fprintf(f, "cuda: none (%s)\n", why);
        return;
    }
    for (int i = 0; i < c && i < 8; i++)
        fprintf(f, "cuda:%d: %s, sm_%d%d, %d SMs, %.1f GiB%s\n", i, d[i].name, d[i].cc_major,
                d[i].cc_minor, d[i].sm_count, (double)d[i].total_mem / (1 << 30),
                d[i].cc_major >= 8 ? ", f16 and bf16 Tensor Cores" : "");
}

int64_t mpt_cuda_free_bytes(void) {
    char err[256];
    size_t n = sizeof err;
    mpt_cuda_device_info d;
    if (mpt_cuda_devices(&d, 1, err, n) <= 0) return -1;
    const mpt_cu_api *cu = mpt_cuda_driver(0, NULL, 0);
    mpt_cu_device dev;
    mpt_cu_context ctx = NULL;
    size_t free_b = 0, total = 0;
    MPT_CU_CHECK(cu->device_get(&dev, device_ordinal), "");
    MPT_CU_CHECK(cu->primary_ctx_retain(&ctx, dev), "");
    MPT_CU_CHECK(cu->ctx_set_current(ctx), "");
    MPT_CU_CHECK(cu->mem_get_info(&free_b, &total), "");
    cu->primary_ctx_release(dev);
    return (int64_t)free_b;
fail:
    if (ctx) cu->primary_ctx_release(dev);
    return -1;
}

/* ---- what was loaded, from where ---- */

/* the file a loaded function came from */
static const char *file_of(const void *fn) {
    Dl_info info;
    void *p;
    memcpy(&p, &fn, sizeof p);
    return p && dladdr(p, &info) && info.dli_fname ? info.dli_fname : "?";
}

void mpt_cuda_describe_libraries(FILE *f) {
    char why[400];
    const mpt_cu_api *cu = mpt_cuda_driver(0, why, sizeof why);
    int v = 0;
    if (cu && cu->driver_get_version(&v) == 0)
        fprintf(f, "  driver:   %s, CUDA %d.%d\n", file_of((const void *)cu->init), v / 1000,
                v % 1000 / 10);
    else
        fprintf(f, "  driver:   none (%s)\n", cu ? "cuDriverGetVersion failed" : why);
    const mpt_nvrtc_api *nv = mpt_cuda_nvrtc(why, sizeof why);
    int major = 0, minor = 0;
    if (nv && nv->version(&major, &minor) == 0)
        fprintf(f, "  NVRTC:    %s, %d.%d\n", file_of((const void *)nv->version), major, minor);
    else
        fprintf(f, "  NVRTC:    none (%s)\n", why);
    const mpt_lt_api *lt = mpt_cuda_cublaslt(why, sizeof why);
    if (lt)
        fprintf(f, "  cuBLASLt: %s, %zu\n", file_of((const void *)lt->get_version),
                lt->get_version());
    else
        fprintf(f, "  cuBLASLt: none (%s)\n", why);
    const mpt_nccl_api *nc = mpt_cuda_nccl(why, sizeof why);
    if (nc && nc->get_version(&v) == 0) /* 22803 is 2.28.3 (2.9 on: major * 10000) */
        fprintf(f, "  NCCL:     %s, %d.%d.%d (data-parallel CUDA ranks)\n",
                file_of((const void *)nc->get_version), v / 10000, v / 100 % 100, v % 100);
    else
        fprintf(f, "  NCCL:     none (%s; needed only by data-parallel CUDA ranks)\n",
                nc ? "ncclGetVersion failed" : why);
}
