/* codegen/cpu/ceiling.c — what this CPU can do at most, measured, for the
 * profile's "% of ceiling" column.
 *
 * Three short microbenchmarks on every thread of the pool at once, run the
 * first time a profile asks and kept for the process:
 *   - f32: vector FMAs on twelve independent accumulators (AVX-512 or
 *     AVX2+FMA, whichever the host has; enough chains to cover the FMA
 *     latency on two ports), 2 flops per lane per FMA;
 *   - bf16: AMX tdpbf16ps on four accumulator tiles where the JIT uses AMX
 *     (16 x 16 x 32 multiply-adds each), else vdpbf16ps where the host has
 *     AVX512_BF16 (32 per instruction), else the f32 figure (bf16 GEMMs
 *     then run on f32 FMAs);
 *   - memory: memcpy of a 256 MiB buffer split over the threads, counting
 *     the bytes read and written.
 * Each is the best of three runs of about 20 ms, so a busy core shows as a
 * lower ceiling rather than a failure.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen/cpu/cpu.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- f32 FMA ---- */

/* twelve named accumulators: an array would be kept in memory, and its
 * loads and stores, not the FMAs, would set the pace */
#define CHAINS(T, init, step, add, first)                                                        \
    T x0 = init(0.f), x1 = init(1.f), x2 = init(2.f), x3 = init(3.f), x4 = init(4.f),        \
      x5 = init(5.f), x6 = init(6.f), x7 = init(7.f), x8 = init(8.f), x9 = init(9.f),        \
      x10 = init(10.f), x11 = init(11.f);                                                    \
    for (long i = 0; i < iters; i++) {                                                       \
        x0 = step(x0); x1 = step(x1); x2 = step(x2); x3 = step(x3); x4 = step(x4);           \
        x5 = step(x5); x6 = step(x6); x7 = step(x7); x8 = step(x8); x9 = step(x9);           \
        x10 = step(x10); x11 = step(x11);                                                    \
    }                                                                                        \
    return first(add(add(add(add(x0, x1), add(x2, x3)), add(add(x4, x5), add(x6, x7))),      \
                     add(add(x8, x9), add(x10, x11))))

__attribute__((target("avx512f"), noinline)) static float fma_512(long iters) {
    const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
#define STEP(x) _mm512_fmadd_ps(x, m, c)
    CHAINS(__m512, _mm512_set1_ps, STEP, _mm512_add_ps, _mm512_cvtss_f32);
#undef STEP
}

__attribute__((target("avx2,fma"), noinline)) static float fma_256(long iters) {
    const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
#define STEP(x) _mm256_fmadd_ps(x, m, c)
    CHAINS(__m256, _mm256_set1_ps, STEP, _mm256_add_ps, _mm256_cvtss_f32);
#undef STEP
}

/* ---- bf16 dot products ---- */

__attribute__((target("avx512f,avx512bf16"), noinline)) static float dot_bf16(long iters) {
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3c00);
#define STEP(x) _mm512_dpbf16_ps(x, a, b)
    CHAINS(__m512, _mm512_set1_ps, STEP, _mm512_add_ps, _mm512_cvtss_f32);
#undef STEP
}

/* 64-byte tile configuration: palette 1, tiles 0-3 C (16 x 16 f32), 4-5 A
 * (16 rows x 32 bf16), 6-7 B (16 rows of 16 bf16 pairs) */
__attribute__((target("amx-tile,amx-bf16"), noinline)) static float amx_bf16(long iters) {
    unsigned char cfg[64] __attribute__((aligned(64)));
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;
    for (int t = 0; t < 8; t++) {
        cfg[16 + 2 * t] = 64; /* bytes per row */
        cfg[48 + t] = 16;     /* rows */
    }
    static unsigned short src[16 * 32] __attribute__((aligned(64)));
    for (int i = 0; i < 16 * 32; i++) src[i] = 0x3c00;
    float out[16 * 16] __attribute__((aligned(64)));
    _tile_loadconfig(cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, src, 64);
    _tile_loadd(5, src, 64);
    _tile_loadd(6, src, 64);
    _tile_loadd(7, src, 64);
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return out[0];
}

/* ---- running one on every thread ---- */

typedef enum { K_FMA512, K_FMA256, K_DOT_BF16, K_AMX, K_COPY } kind;

typedef struct {
    kind k;
    long iters;
    char *src, *dst;
    size_t chunk;
    volatile float sink;
} job;

static void run_one(void *ctx, int task, int thread) {
    job *j = ctx;
    float r = 0;
    switch (j->k) {
    case K_FMA512: r = fma_512(j->iters); break;
    case K_FMA256: r = fma_256(j->iters); break;
    case K_DOT_BF16: r = dot_bf16(j->iters); break;
    case K_AMX: r = amx_bf16(j->iters); break;
    case K_COPY:
        memcpy(j->dst + (size_t)task * j->chunk, j->src + (size_t)task * j->chunk, j->chunk);
        break;
    }
    if (r == 12345.f) j->sink = r; /* keeps the loops */
}

/* best seconds of three runs over all threads */
static double best_of_3(mpt_pool *pool, job *j, int tasks) {
    double best = 1e30;
    mpt_pool_run(pool, tasks, run_one, j); /* warm-up: clocks, pages, tile state */
    for (int r = 0; r < 3; r++) {
        double t0 = now();
        mpt_pool_run(pool, tasks, run_one, j);
        double t = now() - t0;
        if (t < best) best = t;
    }
    return best;
}

/* flops per iteration of each loop, per thread */
static double flops_per_iter(kind k) {
    switch (k) {
    case K_FMA512: return 12 * 16 * 2;
    case K_FMA256: return 12 * 8 * 2;
    case K_DOT_BF16: return 12 * 32 * 2;
    case K_AMX: return 4 * 16 * 16 * 32 * 2;
    case K_COPY: break;
    }
    return 0;
}

static double compute_gflops(mpt_pool *pool, kind k) {
    int threads = mpt_pool_threads(pool);
    job j = {.k = k, .iters = 1000};
    /* grow to about 20 ms per run */
    for (;;) {
        double t = best_of_3(pool, &j, threads);
        if (t > 0.015 || j.iters > (1L << 32)) return flops_per_iter(k) * (double)j.iters * threads / t * 1e-9;
        j.iters *= t > 1e-4 ? (long)(0.02 / t) + 1 : 100;
    }
}

static mpt_cpu_ceilings cached;
static int measured;

double mpt_cpu_fma_rate(mpt_cpu_jit *jit, mpt_pool *pool) {
    mpt_cpu_isa isa = jit ? mpt_cpu_jit_isa(jit) : MPT_CPU_ISA_SSE;
    if (isa == MPT_CPU_ISA_AVX512 && __builtin_cpu_supports("avx512f"))
        return compute_gflops(pool, K_FMA512);
    if (isa == MPT_CPU_ISA_AVX2 || isa == MPT_CPU_ISA_AVX512) return compute_gflops(pool, K_FMA256);
    return 0;
}

const mpt_cpu_ceilings *mpt_cpu_ceilings_measure(mpt_cpu_jit *jit, mpt_pool *pool) {
    if (measured) return &cached;
    memset(&cached, 0, sizeof cached);
    mpt_cpu_isa isa = jit ? mpt_cpu_jit_isa(jit) : MPT_CPU_ISA_SSE;
    if (isa == MPT_CPU_ISA_AVX512 && __builtin_cpu_supports("avx512f")) {
        cached.f32_gflops = compute_gflops(pool, K_FMA512);
        cached.f32_how = "AVX-512 FMA loop";
    } else if (isa == MPT_CPU_ISA_AVX2 || isa == MPT_CPU_ISA_AVX512) {
        cached.f32_gflops = compute_gflops(pool, K_FMA256);
        cached.f32_how = "AVX2 FMA loop";
    }
    if (jit && mpt_cpu_jit_has_amx(jit)) {
        cached.bf16_gflops = compute_gflops(pool, K_AMX);
        cached.bf16_how = "AMX tdpbf16ps loop";
    } else if (jit && mpt_cpu_bf16_dot_pays(jit, NULL)) {
        cached.bf16_gflops = compute_gflops(pool, K_DOT_BF16);
        cached.bf16_how = "vdpbf16ps loop";
    } else {
        /* bf16 GEMMs and convolutions run on f32 FMAs */
        cached.bf16_gflops = cached.f32_gflops;
        cached.bf16_how = jit && mpt_cpu_jit_has_bf16_dot(jit)
                              ? "f32 FMAs: vdpbf16ps is slower here"
                              : cached.f32_how;
    }
    int threads = mpt_pool_threads(pool);
    size_t bytes = (size_t)256 << 20;
    job c = {.k = K_COPY, .chunk = bytes / (size_t)threads};
    c.src = malloc(bytes);
    c.dst = malloc(bytes);
    if (c.src && c.dst) {
        memset(c.src, 1, bytes);
        memset(c.dst, 0, bytes);
        cached.gbps = 2.0 * (double)(c.chunk * (size_t)threads) / best_of_3(pool, &c, threads) * 1e-9;
        cached.mem_how = "memcpy of 256 MiB";
    }
    free(c.src);
    free(c.dst);
    cached.threads = threads;
    measured = 1;
    return &cached;
}

/* ---- bf16 dot products or f32 FMAs ----
 * AVX512_BF16 does not make vdpbf16ps fast: on this project's Xeon VM
 * (model 207, no AMX) one vdpbf16ps (32 products) issues every other
 * cycle, 86 GFLOP/s a core, while f32 FMAs (16 products) issue two a
 * cycle, 175 GFLOP/s; oneDNN's bf16 matmul there runs at 84 GFLOP/s
 * against its f32 152. bf16 widens to f32 exactly (and a product of two
 * bf16 is exact in f32), so where the dot product is not clearly faster the
 * GEMMs and convolutions multiply bf16 operands in f32 FMAs instead. Both
 * loops run on the calling thread, about 2 ms each, best of three
 * interleaved; a busy core slows both alike. */
static int dot_pays;
static double dot_ratio;
static pthread_once_t dot_once = PTHREAD_ONCE_INIT;

static double one_thread_gflops(kind k, long iters) {
    job j = {.k = k, .iters = iters};
    run_one(&j, 0, 0); /* warm-up: clocks, AVX-512 license */
    double t0 = now();
    run_one(&j, 0, 0);
    double t = now() - t0;
    return t > 0 ? flops_per_iter(k) * (double)iters / t * 1e-9 : 0;
}

static void measure_dot(void) {
    if (!__builtin_cpu_supports("avx512f")) return;
    double dot = 0, fma = 0;
    for (int r = 0; r < 3; r++) {
        /* about 2 ms each at this host's rates */
        double d = one_thread_gflops(K_DOT_BF16, 20000), f = one_thread_gflops(K_FMA512, 40000);
        if (d > dot) dot = d;
        if (f > fma) fma = f;
    }
    dot_ratio = fma > 0 ? dot / fma : 0;
    /* a margin: at parity the f32 path's gathered convolutions (no fill,
     * no packing) still win */
    dot_pays = dot_ratio >= 1.25;
}

int mpt_cpu_bf16_dot_pays(const mpt_cpu_jit *jit, double *ratio) {
    if (!jit || !mpt_cpu_jit_has_bf16_dot(jit)) {
        if (ratio) *ratio = 0;
        return 0;
    }
    /* read at every call, so that a test can compile both ways */
    const char *env = getenv("MPT_CPU_BF16_DOT");
    if (env && (!strcmp(env, "0") || !strcmp(env, "1"))) {
        if (ratio) *ratio = -1;
        return env[0] == '1';
    }
    pthread_once(&dot_once, measure_dot);
    if (ratio) *ratio = dot_ratio;
    return dot_pays;
}
