/* tests/test_cpu_math.c — the CPU backend's vector exp, log, tanh and erf
 * (codegen/cpu/emit_math.c) against libm, the interpreter's functions:
 * the error in units in the last place of double stays within each
 * function's bound over its ranges, special values come out exactly, and
 * every sampled result rounded to f32 equals libm's rounded (what the
 * element-exact tolerance of tests/test_cpu_backend.c relies on); and
 * the pool's workers run their jobs under the caller's MXCSR. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xmmintrin.h>

#include "codegen/cpu/emit.h"
#include "tests/check.h"

typedef void (*vec_fn)(const double *x, double *y, int64_t n);

/* |got - ref| in ulps of ref (subnormal spacing below 2^-1022) */
static double ulps(double got, double ref) {
    if (isnan(ref) || isnan(got)) return isnan(ref) && isnan(got) ? 0 : INFINITY;
    if (got == ref) return 0;
    if (isinf(ref) || isinf(got)) return INFINITY;
    double u = fabs(ref) < 0x1p-1022 ? 0x1p-1074 : ldexp(1.0, ilogb(ref) - 52);
    return fabs(got - ref) / u;
}

static uint64_t rng = 88172645463325252ull;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1p-53;
}

enum { N = 1 << 18 };
static double xs[N], ys[N];

/* N points uniform in [lo, hi] (log-uniform when geometric) */
static void sweep(const char *name, vec_fn f, double (*ref)(double), double lo, double hi,
                  int geometric, double max_ulps) {
    for (int i = 0; i < N; i++)
        xs[i] = geometric ? exp(log(lo) + (log(hi) - log(lo)) * urand()) : lo + (hi - lo) * urand();
    f(xs, ys, N);
    double worst = 0, at = 0;
    int f32_diff = 0;
    for (int i = 0; i < N; i++) {
        double r = ref(xs[i]), e = ulps(ys[i], r);
        if (e > worst) {
            worst = e;
            at = xs[i];
        }
        f32_diff += (float)ys[i] != (float)r;
    }
    CHECK_MSG(worst <= max_ulps, "%s on [%g, %g]: %.1f ulps at %.17g (bound %.0f)", name, lo, hi,
              worst, at, max_ulps);
    CHECK_MSG(f32_diff == 0, "%s on [%g, %g]: %d of %d results round to another f32 than libm's",
              name, lo, hi, f32_diff, N);
}

static void specials(const char *name, vec_fn f, double (*ref)(double)) {
    static const double sp[] = {0.0,     -0.0,    INFINITY, -INFINITY, NAN,       0x1p-1074,
                                -0x1p-1074, 0x1p-1022, 1e-310, 1.0,     -1.0,      0.5,
                                709.78,  709.79,  -745.1,   -745.2,    -708.5,    5.92,
                                6.0,     -6.0,    19.0,     -25.0,     1e300,     -1e300,
                                0x1.fffffffffffffp-1, 0x1.0000000000001p0, 0.17328679513998632};
    enum { M = 32 };
    double x[M], y[M];
    int n = (int)(sizeof sp / sizeof *sp);
    for (int i = 0; i < M; i++) x[i] = i < n ? sp[i] : 0.25 * i;
    f(x, y, M);
    for (int i = 0; i < n; i++) {
        double r = ref(x[i]);
        int same = (isnan(r) && isnan(y[i])) ||
                   (r == y[i] && signbit(r) == signbit(y[i])) || ulps(y[i], r) <= 4;
        CHECK_MSG(same, "%s(%a) = %a, libm %a", name, x[i], y[i], r);
        if (isinf(r) || r == 0 || isnan(r))
            CHECK_MSG((isnan(r) && isnan(y[i])) || (r == y[i] && signbit(r) == signbit(y[i])),
                      "%s(%a) = %a, libm %a: specials must match exactly", name, x[i], y[i], r);
    }
}

static double normal_cdf(double x) { return 0.5 * (1.0 + erf(x * M_SQRT1_2)); }
static vec_fn erf_v;
static void normal_cdf_v(const double *x, double *y, int64_t n) {
    double *t = calloc((size_t)n, sizeof *t);
    if (!t) abort();
    for (int64_t i = 0; i < n; i++) t[i] = x[i] * M_SQRT1_2;
    erf_v(t, y, n);
    for (int64_t i = 0; i < n; i++) y[i] = 0.5 * (1.0 + y[i]);
    free(t);
}

static void run_isa(mpt_cpu_isa isa) {
    char err[512];
    mpt_cpu_jit *j = mpt_cpu_jit_new(isa, err, sizeof err);
    if (!j) {
        printf("skip %s: %s\n", mpt_cpu_isa_name(isa), err);
        return;
    }
    printf("ISA %s (%d lanes)\n", mpt_cpu_isa_name(isa), mpt_cpu_jit_vector_lanes(j));
    vec_fn fexp = (vec_fn)mpt_cpu_math_fn(j, "exp", err, sizeof err);
    vec_fn flog = (vec_fn)mpt_cpu_math_fn(j, "log", err, sizeof err);
    vec_fn ftanh = (vec_fn)mpt_cpu_math_fn(j, "tanh", err, sizeof err);
    erf_v = (vec_fn)mpt_cpu_math_fn(j, "erf", err, sizeof err);
    CHECK_MSG(fexp && flog && ftanh && erf_v, "building the functions: %s", err);
    if (!fexp || !flog || !ftanh || !erf_v) {
        mpt_cpu_jit_free(j);
        return;
    }
    /* bounds: what the algorithms give (codegen/cpu/emit_math.c), measured
     * at 2M points each when they were written: exp and log 1 ulp, erf 2,
     * tanh 4 (q / (q + 2) adds two roundings to expm1's) */
    sweep("exp", fexp, exp, -30, 30, 0, 1);
    sweep("exp", fexp, exp, -760, 720, 0, 1);
    sweep("exp", fexp, exp, -1e-3, 1e-3, 0, 1);
    sweep("log", flog, log, 0.5, 2, 0, 1);
    sweep("log", flog, log, 1e-300, 1e300, 1, 1);
    sweep("log", flog, log, 0x1p-1074, 0x1p-1022, 1, 1);
    sweep("tanh", ftanh, tanh, -1, 1, 0, 4);
    sweep("tanh", ftanh, tanh, -30, 30, 0, 4);
    sweep("tanh", ftanh, tanh, 1e-300, 1e-3, 1, 4);
    sweep("erf", erf_v, erf, -1.5, 1.5, 0, 2);
    sweep("erf", erf_v, erf, -7, 7, 0, 2);
    sweep("erf", erf_v, erf, 1e-300, 1e-3, 1, 2);
    /* gelu's Phi: 1 + erf(x) cancels for x << 0 in libm as here; rounded
     * to f32 the two agree, which is what a node of gelu stores */
    sweep("normal_cdf", normal_cdf_v, normal_cdf, -1, 1, 0, 4);
    for (int i = 0; i < N; i++) xs[i] = -9 + 18 * urand();
    normal_cdf_v(xs, ys, N);
    int diff = 0;
    for (int i = 0; i < N; i++) diff += (float)ys[i] != (float)normal_cdf(xs[i]);
    CHECK_MSG(diff == 0, "normal_cdf on [-9, 9]: %d results round to another f32 than libm's", diff);

    specials("exp", fexp, exp);
    specials("log", flog, log);
    specials("tanh", ftanh, tanh);
    specials("erf", erf_v, erf);
    mpt_cpu_jit_free(j);
}

/* ---- the pool's workers run each job under the caller's MXCSR ---- */

typedef struct {
    atomic_int arrived;
    unsigned csr[2];
    int ran[2];
} csr_probe;

/* Each of the two tasks waits (up to a second) for the other, so the two
 * threads take one each, and records its thread's control word. */
static void csr_task(void *ctx, int task, int thread) {
    csr_probe *p = ctx;
    (void)task;
    atomic_fetch_add(&p->arrived, 1);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do clock_gettime(CLOCK_MONOTONIC, &t);
    while (atomic_load(&p->arrived) < 2 && t.tv_sec - t0.tv_sec < 2);
    p->csr[thread] = _mm_getcsr();
    p->ran[thread] = 1;
}

static void test_denormal_control(mpt_pool *pool) {
    const unsigned FTZ_DAZ = 0x8040;
    unsigned before = _mm_getcsr();
    for (int flush = 1; flush >= 0; flush--) {
        unsigned old = mpt_cpu_denormals_begin(flush);
        CHECK_MSG(old == before, "begin returns the caller's control word");
        csr_probe p = {0};
        mpt_pool_run(pool, 2, csr_task, &p);
        CHECK_MSG(p.ran[0] && p.ran[1], "both threads ran a task (%d %d)", p.ran[0], p.ran[1]);
        for (int t = 0; t < 2; t++)
            CHECK_MSG((p.csr[t] & FTZ_DAZ) == (flush ? FTZ_DAZ : 0),
                      "thread %d: MXCSR %#x with flush=%d", t, p.csr[t], flush);
        volatile float tiny = 1e-39f, one = 1.0f;
        float prod = tiny * one;
        CHECK_MSG(flush ? prod == 0.0f : prod == 1e-39f, "1e-39 * 1 = %g with flush=%d",
                  (double)prod, flush);
        mpt_cpu_denormals_end(old);
        CHECK_MSG(_mm_getcsr() == before, "end restores the caller's control word");
    }
}

int main(void) {
    mpt_pool *pool = mpt_pool_new(2);
    test_denormal_control(pool);
    mpt_pool_free(pool);
    /* the host's own ISA, and the smaller ones the backend can target
     * (no FMA on SSE: llvm.fma is then a libm call, still exact) */
    run_isa(MPT_CPU_ISA_HOST);
    run_isa(MPT_CPU_ISA_AVX2);
    run_isa(MPT_CPU_ISA_SSE);
    return check_exit("test_cpu_math");
}
