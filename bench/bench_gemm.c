/* bench/bench_gemm.c — the JIT GEMM against OpenBLAS on the MLP's training
 * GEMMs (batch 1024, 784 -> 4096 -> 4096 -> 10): forward, dX = dY W^T and
 * dW = X^T dY of every layer, f32, same thread count for both; then bf16
 * against our f32, and 2 threads against 1.
 *
 *   build/bench/bench_gemm [--threads N] [--reps N] [--kc N] [--kc-vs N] [--mc N] [--nc N] [--quick] [--cold]
 *       [--epi bias_gelu|gelu_grad]
 *                          [--cpu-time] [--isa host|avx512|avx2|sse]
 *
 * --isa compiles our kernels for a smaller ISA than the host's (what an
 * AVX2-only CPU runs, as MPTC_CPU_ISA does for mptc); hold them against the
 * OpenBLAS kernels of the same ISA with OPENBLAS_CORETYPE (Haswell for avx2).
 *
 * --cpu-time (one thread only) times with the calling thread's CPU clock
 * instead of the wall clock: both libraries then run in that thread, and
 * time the scheduler gives to other processes on a shared machine is left out.
 *
 * OpenBLAS runs the kernels of the best core type this CPU runs (see
 * pick_openblas_core; OPENBLAS_CORETYPE, if set, is kept), and the second
 * line printed says which ran and why.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codegen/cpu/cpu.h"

void openblas_set_num_threads(int num_threads);
char *openblas_get_corename(void);

typedef struct {
    const char *name;
    int64_t M, N, K;
    int trans_a, trans_b;
} shape;

static shape shapes[] = {
    {"fwd 1   X W", 1024, 4096, 784, 0, 0},    {"fwd 2   X W", 1024, 4096, 4096, 0, 0},
    {"fwd 3   X W", 1024, 10, 4096, 0, 0},     {"dX 1  dY W^T", 1024, 784, 4096, 0, 1},
    {"dX 2  dY W^T", 1024, 4096, 4096, 0, 1},  {"dX 3  dY W^T", 1024, 4096, 10, 0, 1},
    {"dW 1  X^T dY", 784, 4096, 1024, 1, 0},   {"dW 2  X^T dY", 4096, 4096, 1024, 1, 0},
    {"dW 3  X^T dY", 4096, 10, 1024, 1, 0},
};

static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now(void) {
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fill(float *p, int64_t n, unsigned seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
}

static void to_bf16(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = mpt_f32_to_bf16(x[i]);
}

typedef struct {
    mpt_cpu_gemm *g;
    mpt_pool *pool;
    const shape *s;
    const void *A, *B;
    float *C;
    int epi; /* with --epi's steps */
} ours_call;

/* --epi: the f32 table's kernels end as a step's do (the bias, the
 * pre-activation stored for the backward pass, GELU; or times GELU's
 * derivative at a stored pre-activation), the extra operands [M, N] */
static const char *epi_kind;
static mpt_cpu_epilogue_args epi_args;

static void run_ours(const ours_call *c) {
    char err[256];
    if (mpt_cpu_gemm_run(c->g, c->pool, c->s->M, c->s->N, c->s->K, c->A, 0, c->B, 0, c->C, 0,
                         c->epi ? &epi_args : NULL, err, sizeof err)) {
        fprintf(stderr, "bench_gemm: %s\n", err);
        exit(1);
    }
}

static void run_blas(const shape *s, const float *A, const float *B, float *C) {
    cblas_sgemm(CblasRowMajor, s->trans_a ? CblasTrans : CblasNoTrans,
                s->trans_b ? CblasTrans : CblasNoTrans, (int)s->M, (int)s->N, (int)s->K, 1.0f, A,
                s->trans_a ? (int)s->M : (int)s->K, B, s->trans_b ? (int)s->K : (int)s->N, 0.0f,
                C, (int)s->N);
}

/* Best of reps for ours and for OpenBLAS, alternating call by call so that
 * both see the same background load; one warm-up call each first
 * (first touch, packing buffers, OpenBLAS' thread start). */
static int cold; /* --cold: evict the caches before each timed call */

/* what a GEMM inside a training step finds: its operands written a few
 * kernels before, out of this core's caches. Twice the last-level cache
 * written (at least 64 MiB; this host's L3 is 260 MiB, where a step's
 * whole arena may stay). */
static void evict(void) {
    static volatile char *junk;
    static size_t size;
    if (!cold) return;
    if (!junk) {
        long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
        size = l3 > (32L << 20) ? 2 * (size_t)l3 : (size_t)64 << 20;
        if (!(junk = malloc(size))) return;
    }
    for (size_t i = 0; i < size; i += 64) junk[i] = (char)i;
}

static void time_pair(const ours_call *c, const float *A, const float *B, float *R, int reps,
                      double *t_ours, double *t_blas) {
    run_ours(c);
    run_blas(c->s, A, B, R);
    *t_ours = *t_blas = 1e30;
    for (int r = 0; r < reps; r++) {
        evict();
        double t = now();
        run_ours(c);
        t = now() - t;
        *t_ours = t < *t_ours ? t : *t_ours;
        evict();
        t = now();
        run_blas(c->s, A, B, R);
        t = now() - t;
        *t_blas = t < *t_blas ? t : *t_blas;
    }
}

/* Best of reps for each of n calls, taken round-robin call by call so that
 * all see the same background load; one warm-up call each first. */
static void time_calls(const ours_call *const *c, int n, int reps, double *best) {
    for (int i = 0; i < n; i++) {
        run_ours(c[i]);
        best[i] = 1e30;
    }
    for (int r = 0; r < reps; r++) {
        for (int i = 0; i < n; i++) {
            double t = now();
            run_ours(c[i]);
            t = now() - t;
            best[i] = t < best[i] ? t : best[i];
        }
    }
}

static mpt_cpu_gemm *compile(mpt_cpu_jit *jit, mpt_dtype dt, const shape *s,
                             const mpt_cpu_gemm_desc *tune) {
    mpt_cpu_gemm_desc d = *tune;
    d.a_dt = d.b_dt = dt;
    d.c_dt = MPT_DT_F32;
    d.trans_a = s->trans_a;
    d.trans_b = s->trans_b;
    char err[512];
    mpt_cpu_gemm *g = mpt_cpu_gemm_compile(jit, &d, err, sizeof err);
    if (!g) {
        fprintf(stderr, "bench_gemm: %s\n", err);
        exit(1);
    }
    return g;
}

/* ---- which OpenBLAS kernels run -------------------------------------------
 * A DYNAMIC_ARCH OpenBLAS picks its kernels ("core type") from CPUID when it
 * is loaded, and OPENBLAS_CORETYPE overrides that. Its own pick can be far
 * below the host: a VM's "Intel Xeon Processor" (unknown model) is taken for
 * a Prescott (SSE3, 1/8 of the speed), and a CPU newer than the library
 * falls back to whatever its table says. Forcing one fixed name is no better
 * (a name the build lacks, or has aliased to a smaller one, ends elsewhere:
 * "SkylakeX" has been seen to end on the AVX2 "Haswell" kernels). So: the
 * core types this host's features can run, best first, from CPUID; when
 * OpenBLAS's own pick is not the best of them, re-exec with
 * OPENBLAS_CORETYPE set to it, check with openblas_get_corename() that the
 * library took it, and step down the list when it did not. A user's own
 * OPENBLAS_CORETYPE is left alone. The note says what ran and why. */
#include <cpuid.h>

static int os_saves(unsigned mask) { /* XCR0 has these state components */
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & mask) == mask;
}

/* Up to 4 OpenBLAS core names this host can run, best first. */
static int openblas_candidates(const char **out) {
    unsigned a, b, c, d, b7 = 0, a71 = 0;
    int n = 0, amd = 0;
    if (__get_cpuid(0, &a, &b, &c, &d)) amd = b == 0x68747541u || b == 0x6f677948u; /* Auth, Hygo */
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b7, c, d);
        __cpuid_count(7, 1, a71, b, c, d);
    }
    int avx2 = (b7 & (1u << 5)) && os_saves(0x6);
    int avx512 = avx2 && (b7 & (1u << 16)) && (b7 & (1u << 17)) && (b7 & (1u << 30)) &&
                 (b7 & (1u << 31)) && os_saves(0xe6); /* F, DQ, BW, VL; opmask and zmm state */
    int bf16 = avx512 && (a71 & (1u << 5));          /* AVX512_BF16 */
    if (bf16) out[n++] = "Cooperlake";
    if (avx512) out[n++] = "SkylakeX";
    if (avx2) out[n++] = amd ? "Zen" : "Haswell";
    if (avx2 && amd) out[n++] = "Haswell";
    return n;
}

static int pick_openblas_core(char **argv, char *note, size_t n) {
    const char *cands[4];
    int nc = openblas_candidates(cands);
    const char *got = openblas_get_corename();
    const char *state = getenv("MPT_BENCH_GEMM_BLAS"); /* "own pick|index tried" between execs */
    const char *user = getenv("OPENBLAS_CORETYPE");
    if (!state && user) {
        snprintf(note, n, "%s (OPENBLAS_CORETYPE=%s, the user's)", got, user);
        return 0;
    }
    char own[64];
    int tried = -1;
    if (state) {
        const char *bar = strchr(state, '|');
        snprintf(own, sizeof own, "%.*s", bar ? (int)(bar - state) : 0, state);
        tried = bar ? atoi(bar + 1) : nc;
    } else {
        snprintf(own, sizeof own, "%s", got);
    }
    if (tried >= 0 && tried < nc && !strcasecmp(got, cands[tried])) {
        snprintf(note, n, "%s (set by bench_gemm for this CPU; OpenBLAS's own pick: %s)", got, own);
        return 0;
    }
    if (tried < 0 && (nc == 0 || !strcasecmp(got, cands[0]))) {
        snprintf(note, n, "%s (OpenBLAS's own pick%s)", got, nc ? ", the best for this CPU" : "");
        return 0;
    }
    int next = tried + 1;
    /* a step down that reaches OpenBLAS's own pick needs no forcing */
    if (next < nc && !strcasecmp(own, cands[next])) next = nc;
    if (next >= nc) {
        /* nothing better took: run on OpenBLAS's own pick */
        char buf[128];
        snprintf(buf, sizeof buf, "%s|%d", own, nc);
        if (tried >= 0 && user && strcasecmp(got, own)) {
            setenv("MPT_BENCH_GEMM_BLAS", buf, 1);
            unsetenv("OPENBLAS_CORETYPE");
            execv("/proc/self/exe", argv);
            perror("bench_gemm: re-exec without OPENBLAS_CORETYPE");
            return 1;
        }
        int own_rank = nc;
        for (int i = 0; i < nc; i++)
            if (!strcasecmp(own, cands[i])) { own_rank = i; break; }
        snprintf(note, n, "%s (OpenBLAS's own pick; this OpenBLAS build did not take", got);
        for (int i = 0; i < own_rank; i++) {
            size_t l = strlen(note);
            snprintf(note + l, n - l, "%s %s", i ? "," : "", cands[i]);
        }
        size_t l = strlen(note);
        snprintf(note + l, n - l, "%s)", own_rank < nc ? "" : ", which this CPU runs");
        if (own_rank == nc)
            fprintf(stderr, "bench_gemm: warning: OpenBLAS runs its %s kernels, below this CPU's\n", got);
        return 0;
    }
    char buf[128];
    snprintf(buf, sizeof buf, "%s|%d", own, next);
    setenv("MPT_BENCH_GEMM_BLAS", buf, 1);
    setenv("OPENBLAS_CORETYPE", cands[next], 1);
    if (tried >= 0)
        fprintf(stderr, "bench_gemm: OpenBLAS took %s for OPENBLAS_CORETYPE=%s; trying %s\n", got,
                cands[tried], cands[next]);
    execv("/proc/self/exe", argv);
    perror("bench_gemm: re-exec with OPENBLAS_CORETYPE");
    return 1;
}

int main(int argc, char **argv) {
    char blas_note[512];
    if (pick_openblas_core(argv, blas_note, sizeof blas_note)) return 1;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), reps = 3, quick = 0, custom = 0, kc_vs = 0;
    mpt_cpu_isa isa = MPT_CPU_ISA_HOST;
    mpt_cpu_gemm_desc tune;
    memset(&tune, 0, sizeof tune);
    for (int i = 1; i < argc; i++) {
        int has = i + 1 < argc;
        if (!strcmp(argv[i], "--threads") && has)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && has)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kc") && has)
            tune.kc = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kc-vs") && has)
            kc_vs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mc") && has)
            tune.mc = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--nc") && has)
            tune.nc = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && has) {
            /* one shape of your own instead of the MLP's: M,N,K[,trans_a,trans_b] */
            static shape one = {"custom", 0, 0, 0, 0, 0};
            long long m = 0, nn = 0, k = 0;
            int ta = 0, tb = 0;
            if (sscanf(argv[++i], "%lld,%lld,%lld,%d,%d", &m, &nn, &k, &ta, &tb) < 3 || m <= 0 ||
                nn <= 0 || k <= 0 || m * k > 4096 * 4096 || k * nn > 4096 * 4096 ||
                m * nn > 4096 * 4096) {
                fprintf(stderr, "bench_gemm: --shape M,N,K[,trans_a,trans_b], each matrix at "
                                "most 4096*4096 elements\n");
                return 2;
            }
            one.M = m, one.N = nn, one.K = k, one.trans_a = ta, one.trans_b = tb;
            for (size_t j = 0; j < sizeof shapes / sizeof shapes[0]; j++)
                shapes[j] = one;
            custom = 1;
        } else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--epi") && has)
            epi_kind = argv[++i];
        else if (!strcmp(argv[i], "--cold"))
            cold = 1;
        else if (!strcmp(argv[i], "--cpu-time"))
            bench_clock = CLOCK_THREAD_CPUTIME_ID;
        else if (!strcmp(argv[i], "--isa") && has) {
            const char *name = argv[++i];
            static const mpt_cpu_isa isas[] = {MPT_CPU_ISA_HOST, MPT_CPU_ISA_AVX512,
                                               MPT_CPU_ISA_AVX2, MPT_CPU_ISA_SSE};
            int found = 0;
            for (int j = 0; j < 4 && !found; j++)
                if (!strcmp(name, mpt_cpu_isa_name(isas[j]))) isa = isas[j], found = 1;
            if (!found) {
                fprintf(stderr, "bench_gemm: --isa %s is not an ISA the JIT compiles for (hint: "
                                "host, avx512, avx2 or sse)\n", name);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: %s [--threads N] [--reps N] [--kc N] [--kc-vs N] [--mc N] [--nc N] "
                            "[--quick] [--cold] [--cpu-time] [--shape M,N,K[,ta,tb]] [--isa ISA] [--epi bias_gelu|gelu_grad]\n", argv[0]);
            return 2;
        }
    }
    if (bench_clock == CLOCK_THREAD_CPUTIME_ID && threads != 1) {
        fprintf(stderr, "bench_gemm: --cpu-time needs --threads 1 (hint: other threads' CPU "
                        "time is not on the caller's clock)\n");
        return 2;
    }
    char err[512], feats[256];
    mpt_cpu_jit *jit = mpt_cpu_jit_new(isa, err, sizeof err);
    if (!jit) {
        fprintf(stderr, "bench_gemm: %s\n", err);
        return 1;
    }
    /* the same kernels without AMX: bf16 on vdpbf16ps */
    mpt_cpu_jit *jit512 = mpt_cpu_jit_isa(jit) == MPT_CPU_ISA_AVX512 && mpt_cpu_jit_has_amx(jit)
                              ? mpt_cpu_jit_new(MPT_CPU_ISA_AVX512, err, sizeof err)
                              : NULL;
    mpt_pool *pool = mpt_pool_new(threads), *pool1 = mpt_pool_new(1);
    openblas_set_num_threads(threads);
    size_t big = (size_t)4096 * 4096;
    float *A = malloc(big * 4), *B = malloc(big * 4), *C = malloc(big * 4), *R = malloc(big * 4);
    uint16_t *Ah = malloc(big * 2), *Bh = malloc(big * 2);
    float *X = calloc(big, 4), *S = malloc(big * 4); /* --epi's operands */
    fill(A, (int64_t)big, 1);
    fill(B, (int64_t)big, 2);
    to_bf16(A, Ah, (int64_t)big);
    to_bf16(B, Bh, (int64_t)big);

    double load[3] = {0};
    FILE *lf = fopen("/proc/loadavg", "r");
    if (lf) {
        if (fscanf(lf, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3)
            load[0] = -1;
        fclose(lf);
    }
    printf("host: %s; ISA %s; %d threads; best of %d (%s time); load average %.2f\n"
           "OpenBLAS core type: %s\n",
           mpt_cpu_host_features(feats, sizeof feats), mpt_cpu_isa_name(mpt_cpu_jit_isa(jit)),
           threads, reps, bench_clock == CLOCK_MONOTONIC ? "wall" : "thread CPU", load[0],
           blas_note);
    printf("%-14s %5s %5s %5s  %9s %9s %6s  %s\n", "f32 GEMM", "M", "N", "K", "ours GF/s",
           "BLAS GF/s", "ratio", "max|ours-BLAS|");
    double sum_ours = 0, sum_blas = 0;
    int n_shapes = custom ? 1 : quick ? 3 : (int)(sizeof shapes / sizeof shapes[0]);
    for (int i = 0; i < n_shapes; i++) {
        const shape *s = quick ? &shapes[(int[]){1, 4, 7}[i]] : &shapes[i];
        mpt_cpu_gemm_desc td = tune;
        if (epi_kind && !strcmp(epi_kind, "bias_gelu")) {
            td.n_steps = 3;
            td.steps[0] = (mpt_cpu_epi_step){MPT_CPU_EPI_BIAS, MPT_DT_F32, MPT_DT_F32};
            td.steps[1] = (mpt_cpu_epi_step){MPT_CPU_EPI_STORE, MPT_DT_F32, MPT_DT_F32};
            td.steps[2] = (mpt_cpu_epi_step){MPT_CPU_EPI_GELU, MPT_DT_F32, MPT_DT_F32};
            epi_args.step[0].ptr = X;
            epi_args.step[1].ptr = S;
        } else if (epi_kind && !strcmp(epi_kind, "gelu_grad")) {
            td.n_steps = 1;
            td.steps[0] = (mpt_cpu_epi_step){MPT_CPU_EPI_GELU_GRAD, MPT_DT_F32, MPT_DT_F32};
            epi_args.step[0].ptr = X;
        } else if (epi_kind) {
            fprintf(stderr, "bench_gemm: --epi %s: bias_gelu or gelu_grad\n", epi_kind);
            return 1;
        }
        mpt_cpu_gemm *g = compile(jit, MPT_DT_F32, s, &td);
        ours_call c = {g, pool, s, A, B, C, epi_kind != NULL};
        double flop = 2.0 * (double)s->M * (double)s->N * (double)s->K;
        double to, tb;
        time_pair(&c, A, B, R, reps, &to, &tb);
        double diff = 0;
        for (int64_t k = 0; k < s->M * s->N; k++)
            diff = fabsf(C[k] - R[k]) > diff ? fabsf(C[k] - R[k]) : diff;
        /* (with --epi, OpenBLAS's plain product is no reference) */
        printf("%-14s %5lld %5lld %5lld  %9.1f %9.1f %5.0f%%  ", s->name, (long long)s->M,
               (long long)s->N, (long long)s->K, flop / to * 1e-9, flop / tb * 1e-9,
               100 * tb / to);
        if (epi_kind)
            printf("- (%s)\n", epi_kind);
        else
            printf("%.2g\n", diff);
        sum_ours += to;
        sum_blas += tb;
        mpt_cpu_gemm_free(g);
    }
    printf("%-14s %23s  %9s %9s %5.0f%%  (total time, all shapes)\n", "all", "", "", "",
           100 * sum_blas / sum_ours);

    printf("\n%-14s %5s %5s %5s  %9s %9s %6s  %9s %6s\n", "bf16 vs f32", "M", "N", "K",
           "f32 GF/s", "bf16 GF/s", "speedup", "vdpbf16ps", "speedup");
    const int big_shapes[] = {1, 4, 7}, n_big = custom ? 1 : 3;
    for (int i = 0; i < n_big; i++) {
        const shape *s = &shapes[big_shapes[i]];
        mpt_cpu_gemm *g32 = compile(jit, MPT_DT_F32, s, &tune);
        mpt_cpu_gemm *g16 = compile(jit, MPT_DT_BF16, s, &tune);
        mpt_cpu_gemm *g512 = jit512 ? compile(jit512, MPT_DT_BF16, s, &tune) : NULL;
        /* --kc-vs: bf16 with another k block, timed in the same rounds */
        mpt_cpu_gemm_desc tune_vs = tune;
        tune_vs.kc = kc_vs;
        mpt_cpu_gemm *gvs = kc_vs ? compile(jit, MPT_DT_BF16, s, &tune_vs) : NULL;
        ours_call c32 = {g32, pool, s, A, B, C, 0}, c16 = {g16, pool, s, Ah, Bh, C, 0};
        ours_call c512 = {g512, pool, s, Ah, Bh, C, 0}, cvs = {gvs, pool, s, Ah, Bh, C, 0};
        double flop = 2.0 * (double)s->M * (double)s->N * (double)s->K;
        const ours_call *calls[4] = {&c32, &c16, g512 ? &c512 : &cvs, &cvs};
        double best[4] = {0, 0, 0, 0};
        time_calls(calls, 2 + (g512 != NULL) + (gvs != NULL), reps, best);
        double t32 = best[0], t16 = best[1], t512 = best[2], tvs = best[g512 ? 3 : 2];
        printf("%-14s %5lld %5lld %5lld  %9.1f %9.1f %5.2fx", s->name, (long long)s->M,
               (long long)s->N, (long long)s->K, flop / t32 * 1e-9, flop / t16 * 1e-9, t32 / t16);
        if (g512)
            printf("  %9.1f %5.2fx", flop / t512 * 1e-9, t32 / t512);
        if (gvs)
            printf("  kc=%d: %.1f", kc_vs, flop / tvs * 1e-9);
        printf("\n");
        mpt_cpu_gemm_free(gvs);
        mpt_cpu_gemm_free(g32);
        mpt_cpu_gemm_free(g16);
        mpt_cpu_gemm_free(g512);
    }

    /* Wall-clock speedups of ours and of OpenBLAS, 1 vs N threads, timed
     * call by call alternately, so that all four see the same background
     * load (with other jobs holding cores, best of many reps finds the
     * moments when N cores were free). */
    if (threads > 1 && bench_clock == CLOCK_MONOTONIC) {
        printf("\n%-14s %5s %5s %5s  %9s %9s %7s %7s\n", "threads", "M", "N", "K", "1 thr GF/s",
               "N thr GF/s", "ours", "BLAS");
        for (int i = 0; i < n_big; i++) {
            const shape *s = &shapes[big_shapes[i]];
            mpt_cpu_gemm *g = compile(jit, MPT_DT_F32, s, &tune);
            ours_call c1 = {g, pool1, s, A, B, C, 0}, cn = {g, pool, s, A, B, C, 0};
            double flop = 2.0 * (double)s->M * (double)s->N * (double)s->K;
            double best[4] = {1e30, 1e30, 1e30, 1e30};
            run_ours(&c1);
            run_ours(&cn);
            for (int r = 0; r < reps; r++) {
                for (int w = 0; w < 4; w++) {
                    if (w >= 2)
                        openblas_set_num_threads(w == 2 ? 1 : threads);
                    double t = now();
                    if (w < 2)
                        run_ours(w == 0 ? &c1 : &cn);
                    else
                        run_blas(s, A, B, R);
                    t = now() - t;
                    best[w] = t < best[w] ? t : best[w];
                }
            }
            printf("%-14s %5lld %5lld %5lld  %9.1f %9.1f %6.2fx %6.2fx\n", s->name,
                   (long long)s->M, (long long)s->N, (long long)s->K, flop / best[0] * 1e-9,
                   flop / best[1] * 1e-9, best[0] / best[1], best[2] / best[3]);
            mpt_cpu_gemm_free(g);
        }
        openblas_set_num_threads(threads);
    }
    printf("\nJIT compile time: %.2f s (all kernels above)\n", mpt_cpu_jit_compile_seconds(jit));
    free(A);
    free(B);
    free(C);
    free(R);
    free(Ah);
    free(Bh);
    free(X);
    free(S);
    mpt_pool_free(pool);
    mpt_pool_free(pool1);
    mpt_cpu_jit_free(jit512);
    mpt_cpu_jit_free(jit);
    return 0;
}
