/* tests/fake/cuda.c — a recording CUDA driver and cuBLASLt for the tests of
 * the CUDA backend's host side on machines without a GPU.
 *
 * Built as a shared library and named by MPTC_LIBCUDA / MPTC_LIBCUBLASLT,
 * it exports the driver and cuBLASLt entry points mptc opens. Device memory
 * is host memory (calloc), so copies really copy, and cublasLtMatmul
 * computes (see below). Kernels do not run unless
 * the test registers a host build of them (fake_cuda_register, with the
 * functions tests/cuda_emu.h compiles): then a launch runs it on the
 * buffers its parameters point to. Every
 * pointer handed to a copy, memset, launch parameter table or matmul must
 * lie inside a live allocation, and a cubin must be an ELF image holding the
 * function asked for, or the call fails as the real driver would. The test
 * reads what happened through fake_cuda_stats.
 *
 *   FAKE_CUDA_MEM=BYTES     device memory (default 80 GiB)
 *   FAKE_CUDA_FAIL_LAUNCH=N the N-th launch (from 1) fails with
 *                           CUDA_ERROR_LAUNCH_FAILED
 *   FAKE_CUDA_DEVICES=N     N devices (default 1, at most 8), each with a
 *                           primary context of its own; memory is shared
 *
 * The same library is the tests' NCCL (tests/fake/nccl.c).
 */
#include <elf.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake.h"

typedef unsigned long long devptr;


static fake_cuda_counts C;

typedef struct { char *base; size_t size; } block;
static block *blocks;
static int n_blocks, cap_blocks;

fake_cuda_counts fake_cuda_stats(void) { return C; }

/* the live allocation holding [p, p + bytes), else -1 */
static int find(devptr p, size_t bytes) {
    for (int i = 0; i < n_blocks; i++) {
        devptr b = (devptr)(uintptr_t)blocks[i].base;
        if (p >= b && p + bytes <= b + blocks[i].size) return i;
    }
    return -1;
}

/* 1 when [p, p + bytes) lies in one live allocation: for the test's own checks */
int fake_cuda_valid(devptr p, size_t bytes) { return find(p, bytes) >= 0; }

static long long mem_limit(void) {
    const char *s = getenv("FAKE_CUDA_MEM");
    return s ? atoll(s) : 80LL << 30;
}

enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, INVALID_IMAGE = 200, NOT_FOUND = 500,
       LAUNCH_FAILED = 719 };

static int bad(void) {
    C.bad_calls++;
    return INVALID_VALUE;
}

/* ---- capture: a stream under capture records what is launched on it
 * (kernels, async memsets, matmuls) instead of running it, and a graph
 * runs the records in order. As in the driver's THREAD_LOCAL mode, a
 * synchronous call or work for another stream during a capture is refused
 * and invalidates it. ---- */
enum { CAPTURE_UNSUPPORTED = 900, CAPTURE_INVALIDATED = 901 };
typedef struct {
    int kind; /* 0 launch, 1 memset, 2 matmul, 3 device-to-device copy */
    void *f, *stream;
    unsigned g[3], b[3], shared;
    int n;
    devptr vals[72];      /* a launch's parameter values; a matmul's pointers */
    unsigned char v;
    size_t bytes;
    float alpha, beta;
    unsigned char algo[64];
} rec;
typedef struct { rec *r; int n; } graph;
static void *cap_stream;
static int cap_bad;
static graph cap;

/* 1 when the call must be refused: a capture is on and it is not work for
 * the captured stream */
static int capture_refuses(void *stream) {
    if (!cap_stream || stream == cap_stream) return 0;
    cap_bad = 1;
    C.bad_calls++;
    return 1;
}
int fake_cuda_capturing(void) { return cap_stream != NULL; }
void fake_cuda_bad_call(void) { C.bad_calls++; }

static rec *capture_add(void) {
    cap.r = realloc(cap.r, (size_t)(cap.n + 1) * sizeof *cap.r);
    memset(&cap.r[cap.n], 0, sizeof *cap.r);
    C.captured++;
    return &cap.r[cap.n++];
}


int cuInit(unsigned flags) { return OK; }
int cuDriverGetVersion(int *v) { *v = 13000; return OK; }
static int n_devices(void) {
    const char *s = getenv("FAKE_CUDA_DEVICES");
    int n = s ? atoi(s) : 1;
    return n < 1 ? 1 : n > 8 ? 8 : n;
}
int cuDeviceGetCount(int *n) { *n = n_devices(); return OK; }
int cuDeviceGet(int *d, int ordinal) {
    *d = ordinal;
    return ordinal >= 0 && ordinal < n_devices() ? OK : bad();
}
int cuDeviceGetName(char *name, int len, int d) {
    strncpy(name, "mptc test driver (records calls, runs no kernel)", (size_t)len - 1);
    name[len - 1] = 0;
    return OK;
}
int cuDeviceGetAttribute(int *v, int attr, int d) {
    switch (attr) {
    case 16: *v = 132; return OK;        /* multiprocessors */
    case 75: *v = 9; return OK;          /* compute capability 9.0 */
    case 76: *v = 0; return OK;
    case 97: *v = 227 << 10; return OK;  /* shared memory per block, opt-in */
    }
    *v = 0;
    return OK;
}
int cuDeviceTotalMem_v2(size_t *bytes, int d) { *bytes = (size_t)mem_limit(); return OK; }

static int ctx_token;  /* cuBLASLt's handle */
static int dev_ctx[8]; /* each device's primary context */
int cuDevicePrimaryCtxRetain(void **c, int d) {
    if (d < 0 || d >= n_devices()) return bad();
    *c = &dev_ctx[d];
    return OK;
}
int cuDevicePrimaryCtxRelease_v2(int d) { return d >= 0 && d < n_devices() ? OK : bad(); }
int cuCtxSetCurrent(void *c) {
    int d = (int)((int *)c - dev_ctx);
    if (!c || d < 0 || d >= n_devices()) return bad();
    C.current_device = d;
    return OK;
}
int cuCtxSynchronize(void) {
    if (capture_refuses(NULL)) return CAPTURE_UNSUPPORTED;
    fake_stream_sync();
    return OK;
}

typedef struct { const char *image; size_t size; } module;
/* kernels the test built for the host (run is tests/cuda_emu.h's
 * emu_entry: dims are the grid, block and dynamic shared bytes of the
 * launch) */
typedef int (*host_kernel)(void **args, const unsigned dims[7], char *err, unsigned long n);
typedef struct {
    host_kernel run; /* NULL: none registered */
    int n_params;
    unsigned grid[3], block[3], shared;
} hosted;
typedef struct { char name[256]; unsigned max_shared; hosted host; } function;

int cuModuleLoadData(void **m, const void *image) {
    const Elf64_Ehdr *h = image;
    if (!image || memcmp(h->e_ident, ELFMAG, SELFMAG) != 0) return INVALID_IMAGE;
    module *md = malloc(sizeof *md);
    md->image = image;
    /* the section headers come last in the images NVRTC writes */
    md->size = (size_t)h->e_shoff + (size_t)h->e_shnum * h->e_shentsize;
    *m = md;
    return OK;
}
int cuModuleUnload(void *m) { free(m); return OK; }
int cuModuleGetFunction(void **f, void *m, const char *name) {
    module *md = m;
    if (!md || !memmem(md->image, md->size, name, strlen(name))) return NOT_FOUND;
    function *fn = calloc(1, sizeof *fn);
    strncpy(fn->name, name, sizeof fn->name - 1);
    *f = fn;
    return OK;
}
/* attribute 8: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, which a
 * launch with more than 48 KiB of dynamic shared memory needs first */
int cuFuncSetAttribute(void *f, int attr, int value) {
    if (!f || value < 0) return bad();
    if (attr == 8) {
        if (value > (227 << 10)) return bad();
        ((function *)f)->max_shared = (unsigned)value;
    }
    return OK;
}

/* The host build of the function f (a handle cuModuleGetFunction gave):
 * its launches run it. Handles are never freed, so one stays its kernel's
 * however many modules name a function alike. */
void fake_cuda_register(void *f, host_kernel run, int n_params, const unsigned grid[3],
                        const unsigned block[3], unsigned shared) {
    hosted *h = &((function *)f)->host;
    h->run = run;
    h->n_params = n_params;
    memcpy(h->grid, grid, sizeof h->grid);
    memcpy(h->block, block, sizeof h->block);
    h->shared = shared;
}

/* Runs a registered kernel on the buffers of params: each must lie in a
 * live allocation, and the launch shape and dynamic shared memory must be
 * the ones it was built for. */
static int run_hosted(const function *fn, const unsigned g[3], const unsigned b[3],
                      unsigned shared, void **params) {
    const hosted *h = &fn->host;
    if (memcmp(g, h->grid, sizeof h->grid) || memcmp(b, h->block, sizeof h->block)) {
        fprintf(stderr, "fake cuda: %s launched with another grid or block\n", fn->name);
        return bad();
    }
    if (shared != h->shared) {
        fprintf(stderr, "fake cuda: %s launched with %u bytes of dynamic shared memory, not %u\n",
                fn->name, shared, h->shared);
        return bad();
    }
    void **args = calloc((size_t)h->n_params + 1, sizeof *args);
    for (int i = 0; i < h->n_params; i++) {
        devptr p = *(devptr *)params[i];
        if (find(p, 1) < 0) {
            fprintf(stderr, "fake cuda: %s parameter %d is not device memory\n", fn->name, i);
            free(args);
            return bad();
        }
        args[i] = (void *)(uintptr_t)p;
    }
    char err[512];
    const unsigned dims[7] = {g[0], g[1], g[2], b[0], b[1], b[2], shared};
    int rc = h->run(args, dims, err, sizeof err);
    free(args);
    if (rc) fprintf(stderr, "fake cuda: %s: %s\n", fn->name, err);
    return rc ? LAUNCH_FAILED : OK;
}

/* The parameter table has no count of its own (the real driver takes it
 * from the cubin), so only the first entry is checked for kernels not
 * registered; the test checks every buffer of every kernel through
 * mpt_cuda_exec_buffer. */
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    if (capture_refuses(stream)) return CAPTURE_UNSUPPORTED;
    if (cap_stream) { /* recorded, checked and run when the graph is launched */
        rec *r = capture_add();
        *r = (rec){.kind = 0, .f = f, .g = {gx, gy, gz}, .b = {bx, by, bz}, .shared = shared,
                   .n = 1};
        if (f && ((function *)f)->host.run) r->n = ((function *)f)->host.n_params;
        for (int i = 0; params && i < r->n && i < 72; i++)
            if (params[i]) r->vals[i] = *(devptr *)params[i];
        return OK;
    }
    fake_stream_work(stream);
    C.launches++;
    const char *fail = getenv("FAKE_CUDA_FAIL_LAUNCH");
    if (fail && atoll(fail) == C.launches) return LAUNCH_FAILED;
    if (!f || !gx || !gy || !gz || !bx || !by || !bz || (long long)bx * by * bz > 1024 ||
        shared > (227u << 10) || !params || !params[0])
        return bad();
    if (shared > (48u << 10) && shared > ((function *)f)->max_shared) return bad();
    if (find(*(devptr *)params[0], 1) < 0) return bad();
    if (((function *)f)->host.run) {
        C.hosted_launches++;
        return run_hosted(f, (unsigned[]){gx, gy, gz}, (unsigned[]){bx, by, bz}, shared, params);
    }
    return OK;
}

int cuMemAlloc_v2(devptr *p, size_t bytes) {
    if (!bytes) return bad();
    if (C.allocated + (long long)bytes > mem_limit()) return OUT_OF_MEMORY;
    if (n_blocks == cap_blocks) {
        cap_blocks = cap_blocks ? 2 * cap_blocks : 64;
        blocks = realloc(blocks, (size_t)cap_blocks * sizeof *blocks);
    }
    /* 256-byte aligned, as cuMemAlloc's blocks are */
    char *b = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!b) return OUT_OF_MEMORY;
    memset(b, 0, bytes);
    blocks[n_blocks++] = (block){b, bytes};
    C.allocated += (long long)bytes;
    if (C.allocated > C.peak) C.peak = C.allocated;
    C.n_alloc++;
    C.live_allocs++;
    *p = (devptr)(uintptr_t)b;
    return OK;
}
int cuMemFree_v2(devptr p) {
    for (int i = 0; i < n_blocks; i++)
        if ((devptr)(uintptr_t)blocks[i].base == p) {
            C.allocated -= (long long)blocks[i].size;
            C.live_allocs--;
            free(blocks[i].base);
            blocks[i] = blocks[--n_blocks];
            return OK;
        }
    return bad();
}
int cuMemGetInfo_v2(size_t *free_b, size_t *total) {
    *total = (size_t)mem_limit();
    *free_b = (size_t)(mem_limit() - C.allocated);
    return OK;
}
int cuMemcpyHtoD_v2(devptr dst, const void *src, size_t bytes) {
    if (capture_refuses(NULL)) return CAPTURE_UNSUPPORTED;
    if (find(dst, bytes) < 0 || !src) return bad();
    fake_stream_sync();
    memcpy((void *)(uintptr_t)dst, src, bytes);
    C.htod_bytes += (long long)bytes;
    return OK;
}
/* Copies at once, as the GPU would have by the next synchronization; an
 * async upload during a capture would be a copy the graph must not hold */
int cuMemcpyHtoDAsync_v2(devptr dst, const void *src, size_t bytes, void *stream) {
    if (cap_stream) {
        cap_bad = 1;
        C.bad_calls++;
        return CAPTURE_UNSUPPORTED;
    }
    if (find(dst, bytes) < 0 || !src || !stream) return bad();
    fake_stream_write(stream, dst, bytes);
    memcpy((void *)(uintptr_t)dst, src, bytes);
    C.htod_bytes += (long long)bytes;
    C.htod_async_bytes += (long long)bytes;
    return OK;
}
int cuMemcpyDtoH_v2(void *dst, devptr src, size_t bytes) {
    if (capture_refuses(NULL)) return CAPTURE_UNSUPPORTED;
    if (find(src, bytes) < 0 || !dst) return bad();
    fake_stream_sync();
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    C.dtoh_bytes += (long long)bytes;
    return OK;
}
int cuMemcpyDtoD_v2(devptr dst, devptr src, size_t bytes) {
    if (capture_refuses(NULL)) return CAPTURE_UNSUPPORTED;
    if (find(dst, bytes) < 0 || find(src, bytes) < 0) return bad();
    fake_stream_sync();
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
    C.dtod_bytes += (long long)bytes;
    return OK;
}
int cuMemsetD8_v2(devptr dst, unsigned char v, size_t bytes) {
    if (capture_refuses(NULL)) return CAPTURE_UNSUPPORTED;
    if (find(dst, bytes) < 0) return bad();
    fake_stream_sync();
    memset((void *)(uintptr_t)dst, v, bytes);
    C.memset_bytes += (long long)bytes;
    return OK;
}

int cuMemcpyDtoDAsync_v2(devptr dst, devptr src, size_t bytes, void *stream) {
    if (capture_refuses(stream)) return CAPTURE_UNSUPPORTED;
    if (!stream) return bad();
    if (!cap_stream) { /* ordered on its stream only: no synchronisation */
        if (find(dst, bytes) < 0 || find(src, bytes) < 0) return bad();
        fake_stream_write(stream, dst, bytes);
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
        C.dtod_bytes += (long long)bytes;
        return OK;
    }
    rec *r = capture_add();
    *r = (rec){.kind = 3, .stream = stream, .bytes = bytes};
    r->vals[0] = dst;
    r->vals[1] = src;
    return OK;
}

int cuMemsetD8Async(devptr dst, unsigned char v, size_t bytes, void *stream) {
    if (capture_refuses(stream)) return CAPTURE_UNSUPPORTED;
    if (!cap_stream) {
        if (find(dst, bytes) < 0) return bad();
        fake_stream_write(stream, dst, bytes);
        memset((void *)(uintptr_t)dst, v, bytes);
        C.memset_bytes += (long long)bytes;
        return OK;
    }
    rec *r = capture_add();
    *r = (rec){.kind = 1, .stream = stream, .v = v, .bytes = bytes};
    r->vals[0] = dst;
    return OK;
}

int cuStreamCreate(void **s, unsigned flags) {
    *s = malloc(1);
    return flags == 0 ? OK : bad();
}
int cuStreamDestroy_v2(void *s) {
    fake_stream_forget(s);
    free(s);
    return OK;
}
/* FAKE_CUDA_NO_CAPTURE=1: captures are refused (801, NOT_SUPPORTED) */
int cuStreamBeginCapture_v2(void *s, int mode) {
    if (!s || cap_stream || mode != 1) return bad(); /* THREAD_LOCAL */
    const char *no = getenv("FAKE_CUDA_NO_CAPTURE");
    if (no && atoi(no)) return 801;
    cap_stream = s;
    cap_bad = 0;
    cap = (graph){NULL, 0};
    return OK;
}
int cuStreamEndCapture(void *s, void **g) {
    *g = NULL;
    if (s != cap_stream) return bad();
    cap_stream = NULL;
    if (cap_bad) {
        free(cap.r);
        return CAPTURE_INVALIDATED;
    }
    graph *gr = malloc(sizeof *gr);
    *gr = cap;
    *g = gr;
    return OK;
}
int cuGraphInstantiateWithFlags(void **e, void *g, unsigned long long flags) {
    const graph *gr = g;
    graph *ex = malloc(sizeof *ex);
    ex->n = gr->n;
    ex->r = malloc((size_t)gr->n * sizeof *ex->r + 1);
    memcpy(ex->r, gr->r, (size_t)gr->n * sizeof *ex->r);
    *e = ex;
    return OK;
}
int cublasLtMatmul(void *h, void *d, const void *alpha, const void *A, void *ad, const void *B,
                   void *bd, const void *beta, const void *Cm, void *cd, void *D, void *dd,
                   const void *algo, void *ws, size_t ws_bytes, void *stream);
int cuGraphLaunch(void *e, void *stream) {
    const graph *ex = e;
    if (!ex || capture_refuses(stream)) return bad();
    C.graph_launches++;
    for (int i = 0; i < ex->n; i++) {
        const rec *r = &ex->r[i];
        int rc;
        if (r->kind == 0) {
            void *params[72];
            for (int j = 0; j < r->n; j++) params[j] = (void *)&r->vals[j];
            rc = cuLaunchKernel(r->f, r->g[0], r->g[1], r->g[2], r->b[0], r->b[1], r->b[2],
                                r->shared, stream, params, NULL);
        } else if (r->kind == 1) {
            rc = cuMemsetD8_v2(r->vals[0], r->v, r->bytes);
        } else if (r->kind == 3) {
            rc = cuMemcpyDtoD_v2(r->vals[0], r->vals[1], r->bytes);
        } else {
            const devptr *v = r->vals;
            rc = cublasLtMatmul((void *)(uintptr_t)v[0], (void *)(uintptr_t)v[1], &r->alpha,
                                (void *)(uintptr_t)v[2], (void *)(uintptr_t)v[3],
                                (void *)(uintptr_t)v[4], (void *)(uintptr_t)v[5], &r->beta,
                                (void *)(uintptr_t)v[6], (void *)(uintptr_t)v[7],
                                (void *)(uintptr_t)v[8], (void *)(uintptr_t)v[9], r->algo,
                                (void *)(uintptr_t)v[10], r->bytes, stream);
        }
        if (rc) return rc;
    }
    return OK;
}
int cuGraphExecDestroy(void *e) {
    if (e) free(((graph *)e)->r);
    free(e);
    return OK;
}
int cuGraphDestroy(void *g) { return cuGraphExecDestroy(g); }

/* events read a clock that each launch or matmul advances by 10 us, and
 * mark their stream's work for cuStreamWaitEvent (tests/fake/streams.c) */
typedef struct {
    long long t;
    fake_mark m;
    int recorded;
} event;
int cuEventCreate(void **e, unsigned flags) { *e = calloc(1, sizeof(event)); return OK; }
int cuEventRecord(void *e, void *s) {
    if (!e || capture_refuses(s)) return bad();
    ((event *)e)->t = C.launches + C.matmuls;
    fake_stream_record(&((event *)e)->m, s);
    ((event *)e)->recorded = 1;
    return OK;
}
int cuStreamWaitEvent(void *s, void *e, unsigned flags) {
    if (!s || !e || flags || capture_refuses(s)) return bad();
    /* an event never recorded is complete: a wait on it orders nothing */
    if (((event *)e)->recorded) fake_stream_wait(s, &((event *)e)->m);
    return OK;
}
int cuEventSynchronize(void *e) {
    fake_stream_sync();
    return OK;
}
int cuEventElapsedTime_v2(float *ms, void *a, void *b) {
    *ms = 0.01f * (float)(((event *)b)->t - ((event *)a)->t);
    return OK;
}
int cuEventElapsedTime(float *ms, void *a, void *b) { return cuEventElapsedTime_v2(ms, a, b); }
int cuEventDestroy_v2(void *e) { free(e); return OK; }
int cuGetErrorString(int r, const char **s) {
    *s = r == OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY (test driver)"
         : r == LAUNCH_FAILED ? "CUDA_ERROR_LAUNCH_FAILED (test driver)"
                              : "an error of the test driver";
    return OK;
}

/* ---- cuBLASLt: descriptors are plain records; the matmul checks its
 * pointers and computes, as cuBLASLt documents it, in column-major order:
 * D = epilogue(op(A) op(B)) with f32 accumulation (alpha 1, beta 0 as
 * mptc calls it), for the epilogues mptc uses (DEFAULT, RELU, BIAS,
 * RELU_BIAS); any other epilogue fails the call. Layouts take a batch
 * count and stride (CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, _STRIDED_BATCH_
 * OFFSET): a strided-batched call computes each product from its
 * matrices' offsets. As in cuBLASLt, every layout must have the same
 * count; here also D's matrices must not overlap (cuBLASLt's result would
 * be a race). Products of more than 2^30 multiply-adds are checked but not
 * computed. Each computed call is logged (fake_lt_log). ---- */

enum { LT_TRANSA = 3, LT_TRANSB = 4, LT_EPILOGUE = 7, LT_BIAS = 8, LT_AUX = 11,
       LT_BIAS_TYPE = 26 };
enum { R_32F = 0, R_16F = 2, R_16BF = 14 };
typedef struct { void *bias, *aux; int transa, transb, epilogue, bias_type, compute; } desc;
enum { LT_LAYOUT_BATCH_COUNT = 5, LT_LAYOUT_STRIDE = 6 };
typedef struct {
    unsigned long long rows, cols;
    long long ld;
    int type, batch;
    long long stride;
} layout;
static fake_lt_call *lt_log;
static long long n_lt_log, cap_lt_log;
long long fake_lt_log(const fake_lt_call **calls) {
    *calls = lt_log;
    return n_lt_log;
}

static size_t type_size(int t) { return t == R_32F ? 4 : 2; }

static float load_elem(const void *p, int type, size_t i) {
    if (type == R_32F) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    if (type == R_16F) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void store_elem(void *p, int type, size_t i, float v) {
    if (type == R_32F) { ((float *)p)[i] = v; return; }
    uint16_t h;
    if (type == R_16F) {
        _Float16 f = (_Float16)v;
        memcpy(&h, &f, 2);
    } else {
        uint32_t u;
        memcpy(&u, &v, 4);
        h = v != v ? 0x7fc0 : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    ((uint16_t *)p)[i] = h;
}

size_t cublasLtGetVersion(void) { return 130000; }
int cublasLtCreate(void **h) { *h = &ctx_token; return 0; }
int cublasLtDestroy(void *h) { return 0; }
int cublasLtMatmulDescCreate(void **d, int compute, int scale) {
    /* CUBLAS_COMPUTE_32F or 32F_FAST_TF32, scale CUDA_R_32F */
    if ((compute != 68 && compute != 77) || scale != 0) return bad();
    C.tf32_descs += compute == 77;
    desc *ds = calloc(1, sizeof(desc));
    ds->compute = compute;
    ds->epilogue = 1; /* DEFAULT */
    *d = ds;
    return 0;
}
int cublasLtMatmulDescDestroy(void *d) { free(d); return 0; }
int cublasLtMatmulDescSetAttribute(void *d, int attr, const void *buf, size_t n) {
    desc *ds = d;
    if (attr == LT_BIAS) memcpy(&ds->bias, buf, sizeof ds->bias);
    if (attr == LT_AUX) memcpy(&ds->aux, buf, sizeof ds->aux);
    if (attr == LT_TRANSA) memcpy(&ds->transa, buf, sizeof ds->transa);
    if (attr == LT_TRANSB) memcpy(&ds->transb, buf, sizeof ds->transb);
    if (attr == LT_EPILOGUE) memcpy(&ds->epilogue, buf, sizeof ds->epilogue);
    if (attr == LT_BIAS_TYPE) memcpy(&ds->bias_type, buf, sizeof ds->bias_type);
    return 0;
}
int cublasLtMatrixLayoutCreate(void **l, int type, unsigned long long rows, unsigned long long cols,
                               long long ld) {
    layout *ly = malloc(sizeof *ly);
    *ly = (layout){rows, cols, ld, type, 1, 0};
    *l = ly;
    return 0;
}
int cublasLtMatrixLayoutDestroy(void *l) { free(l); return 0; }
/* the batch's attributes with cuBLASLt's types (int32_t, int64_t); the
 * rest are taken and ignored */
int cublasLtMatrixLayoutSetAttribute(void *l, int attr, const void *buf, size_t n) {
    layout *ly = l;
    if (attr == LT_LAYOUT_BATCH_COUNT) {
        int32_t v;
        if (n != sizeof v) return 7; /* CUBLAS_STATUS_INVALID_VALUE */
        memcpy(&v, buf, sizeof v);
        if (v < 1) return 7;
        ly->batch = v;
    }
    if (attr == LT_LAYOUT_STRIDE) {
        if (n != sizeof ly->stride) return 7;
        memcpy(&ly->stride, buf, sizeof ly->stride);
    }
    return 0;
}
/* The preference's minimum alignments of A, B, C and D (attributes 5-8,
 * 256 unless set, as cuBLASLt's defaults) travel in the algorithm the
 * heuristic returns, with the bias pointer's alignment then: the matmul
 * fails a pointer less aligned than its algorithm was chosen for. */
typedef struct { uint32_t align[4]; } pref;
typedef struct { uint32_t align[4]; uint64_t bias_align; } algo_rec;
int cublasLtMatmulPreferenceCreate(void **p) {
    pref *pr = malloc(sizeof *pr);
    for (int i = 0; i < 4; i++) pr->align[i] = 256;
    *p = pr;
    return 0;
}
int cublasLtMatmulPreferenceDestroy(void *p) { free(p); return 0; }
int cublasLtMatmulPreferenceSetAttribute(void *p, int attr, const void *buf, size_t n) {
    if (attr >= 5 && attr <= 8 && n == 4) memcpy(&((pref *)p)->align[attr - 5], buf, 4);
    return 0;
}
static uint64_t align_of(const void *p) {
    uint64_t a = (uint64_t)(uintptr_t)p;
    return a ? a & -a : 256;
}
/* FAKE_LT_REFUSE=E: no algorithm for epilogue E (a cublasLtEpilogue_t
 * value), or for any with "all": CUBLAS_STATUS_NOT_SUPPORTED */
int cublasLtMatmulAlgoGetHeuristic(void *h, void *d, void *a, void *b, void *c, void *dd, void *p,
                                   int requested, void *results, int *n_results) {
    const char *refuse = getenv("FAKE_LT_REFUSE");
    const desc *ds = d;
    C.heuristics++;
    *n_results = 0;
    if (refuse && (!strcmp(refuse, "all") || atoi(refuse) == ds->epilogue)) return 15;
    memset(results, 0, 96);
    algo_rec al;
    memcpy(al.align, ((const pref *)p)->align, sizeof al.align);
    al.bias_align = align_of(ds->bias);
    memcpy(results, &al, sizeof al);
    *n_results = 1;
    return 0;
}

/* every matrix of the batch inside one allocation */
static int matrix_ok(const void *p, const layout *l) {
    if (l->stride < 0) return 0;
    size_t elems = (size_t)l->ld * l->cols + (size_t)(l->batch - 1) * (size_t)l->stride;
    return p && find((devptr)(uintptr_t)p, elems * type_size(l->type)) >= 0;
}

int cublasLtMatmul(void *h, void *d, const void *alpha, const void *A, void *ad, const void *B,
                   void *bd, const void *beta, const void *Cm, void *cd, void *D, void *dd,
                   const void *algo, void *ws, size_t ws_bytes, void *stream) {
    if (capture_refuses(stream)) return 7;
    if (cap_stream) {
        rec *r = capture_add();
        const void *ptrs[11] = {h, d, A, ad, B, bd, Cm, cd, D, dd, ws};
        r->kind = 2;
        for (int i = 0; i < 11; i++) r->vals[i] = (devptr)(uintptr_t)ptrs[i];
        r->alpha = *(const float *)alpha;
        r->beta = *(const float *)beta;
        r->bytes = ws_bytes;
        memcpy(r->algo, algo, sizeof r->algo);
        return 0;
    }
    fake_stream_work(stream);
    C.matmuls++;
    desc *ds = d;
    const layout *la = ad, *lb = bd, *lc = cd, *ld = dd;
    if (!matrix_ok(A, la) || !matrix_ok(B, lb) || !matrix_ok(D, ld) ||
        (ds->bias && find((devptr)(uintptr_t)ds->bias, 1) < 0) ||
        (ds->aux && find((devptr)(uintptr_t)ds->aux, 1) < 0))
        goto invalid;
    algo_rec al;
    memcpy(&al, algo, sizeof al);
    const void *ptrs[4] = {A, B, Cm, D};
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)ptrs[i] % al.align[i]) goto invalid;
    if (ds->bias && align_of(ds->bias) < al.bias_align && align_of(ds->bias) < 256) goto invalid;
    /* op(A) is m x k, op(B) k x n, D m x n */
    unsigned long long m = ds->transa ? la->cols : la->rows, k = ds->transa ? la->rows : la->cols;
    unsigned long long kb = ds->transb ? lb->cols : lb->rows, n = ds->transb ? lb->rows : lb->cols;
    if (k != kb || ld->rows != m || ld->cols != n || lc->rows != m || lc->cols != n ||
        *(const float *)alpha != 1.f || *(const float *)beta != 0.f)
        goto invalid;
    int batch = ld->batch;
    if (la->batch != batch || lb->batch != batch || lc->batch != batch ||
        (batch > 1 && ld->stride < ld->ld * (long long)n))
        goto invalid;
    /* TF32 takes f32 operands only (its rounding is not modelled here) */
    if (ds->compute == 77 && (la->type != R_32F || lb->type != R_32F)) goto invalid;
    int bias = ds->epilogue == 4 || ds->epilogue == 6, relu = ds->epilogue == 2 || ds->epilogue == 6;
    if (ds->epilogue != 1 && !bias && !relu) goto invalid;
    if (bias && (!ds->bias || find((devptr)(uintptr_t)ds->bias, m * type_size(ds->bias_type)) < 0))
        goto invalid;
    /* larger products (the profile's ceiling GEMMs) are checked, not computed */
    if (m * n * k * (unsigned long long)batch > (1ull << 30)) return 0;
    if (n_lt_log == cap_lt_log) {
        cap_lt_log = cap_lt_log ? 2 * cap_lt_log : 256;
        lt_log = realloc(lt_log, (size_t)cap_lt_log * sizeof *lt_log);
    }
    lt_log[n_lt_log++] = (fake_lt_call){m, n, k, batch, ds->transa, ds->transb, la->stride,
                                        lb->stride, ld->stride, la->type, ld->type};
    float *acc = calloc((size_t)(m * n) + 1, sizeof *acc);
    for (int q = 0; q < batch; q++) {
        size_t oa = (size_t)(q * la->stride), ob = (size_t)(q * lb->stride),
               od = (size_t)(q * ld->stride);
        memset(acc, 0, (size_t)(m * n) * sizeof *acc);
        for (unsigned long long j = 0; j < n; j++)
            for (unsigned long long p = 0; p < k; p++) {
                float b = load_elem(B, lb->type, ob + (ds->transb ? j + p * lb->ld : p + j * lb->ld));
                for (unsigned long long i = 0; i < m; i++)
                    acc[i + j * m] +=
                        load_elem(A, la->type, oa + (ds->transa ? p + i * la->ld : i + p * la->ld)) * b;
            }
        for (unsigned long long j = 0; j < n; j++)
            for (unsigned long long i = 0; i < m; i++) {
                float v = acc[i + j * m];
                if (bias) v += load_elem(ds->bias, ds->bias_type, i);
                if (relu && !(v > 0)) v = 0;
                store_elem(D, ld->type, od + i + j * ld->ld, v);
            }
    }
    free(acc);
    return 0;
invalid:
    C.bad_calls++;
    return 7; /* CUBLAS_STATUS_INVALID_VALUE */
}
