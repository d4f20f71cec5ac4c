/* tests/test_cpu_gemm.c — the JIT-compiled CPU GEMM against a naive
 * double-precision reference: dtypes, transposes, every epilogue step, odd
 * sizes around the register tile and the k block, 1 and 2 threads, AMX where
 * the host has it, and the AVX512 (vdpbf16ps), AVX2 and SSE code paths forced
 * on this host. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/cpu.h"
#include "tests/check.h"

static uint64_t rng_state = 88172645463325252ull;
static double rnd(void) { /* uniform [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / (double)(1ull << 52) - 1.0;
}

static double get(mpt_dtype dt, const void *p, int64_t i) {
    switch (dt) {
    case MPT_DT_F32: return ((const float *)p)[i];
    case MPT_DT_F16: return mpt_f16_to_f32(((const uint16_t *)p)[i]);
    case MPT_DT_BF16: return mpt_bf16_to_f32(((const uint16_t *)p)[i]);
    case MPT_DT_I32:
    case MPT_DT_BOOL:
    case MPT_DT_F64:
    case MPT_DT_COUNT: break;
    }
    abort(); /* the test only makes f32, f16 and bf16 buffers */
}

static void put(mpt_dtype dt, void *p, int64_t i, double v) {
    switch (dt) {
    case MPT_DT_F32: ((float *)p)[i] = (float)v; return;
    case MPT_DT_F16: ((uint16_t *)p)[i] = mpt_f32_to_f16((float)v); return;
    case MPT_DT_BF16: ((uint16_t *)p)[i] = mpt_f32_to_bf16((float)v); return;
    case MPT_DT_I32:
    case MPT_DT_BOOL:
    case MPT_DT_F64:
    case MPT_DT_COUNT: break;
    }
    abort();
}

static void *random_buf(mpt_dtype dt, int64_t n, double scale) {
    void *p = malloc((size_t)(n > 0 ? n : 1) * mpt_dtype_size(dt));
    for (int64_t i = 0; i < n; i++)
        put(dt, p, i, scale * rnd());
    return p;
}

static double epi_ref(mpt_cpu_epi_op op, double x, double operand, double scalar) {
    switch (op) {
    case MPT_CPU_EPI_BIAS:
    case MPT_CPU_EPI_RESIDUAL: return x + operand;
    case MPT_CPU_EPI_SCALE: return x * scalar;
    case MPT_CPU_EPI_RELU: return x > 0 ? x : 0;
    case MPT_CPU_EPI_SIGMOID: return 1 / (1 + exp(-x));
    case MPT_CPU_EPI_TANH: return tanh(x);
    case MPT_CPU_EPI_GELU: return 0.5 * x * erfc(-x / sqrt(2.0));
    case MPT_CPU_EPI_RELU_MASK: return operand > 0 ? x : 0;
    case MPT_CPU_EPI_GELU_GRAD:
        return x * (0.5 * erfc(-operand / sqrt(2.0)) + operand * exp(-0.5 * operand * operand) / sqrt(2 * M_PI));
    case MPT_CPU_EPI_ROUND: /* bit for bit in tests/test_cpu_epi.c */
    case MPT_CPU_EPI_STORE: /* tests/test_cpu_epi.c */
    case MPT_CPU_EPI_FINITE: break; /* tests/test_cpu_epi.c */
    }
    abort();
}

/* Compiled kernels by (jit, desc): shapes are runtime arguments, so one
 * kernel serves every size of a case list, and the suite stays fast. */
typedef struct {
    mpt_cpu_jit *jit;
    mpt_cpu_gemm_desc d;
    mpt_cpu_gemm *g;
} cached_gemm;
static cached_gemm cache[128];
static int n_cache;

static mpt_cpu_gemm *compiled(mpt_cpu_jit *jit, const mpt_cpu_gemm_desc *d, char *err, size_t n) {
    for (int i = 0; i < n_cache; i++)
        if (cache[i].jit == jit && !memcmp(&cache[i].d, d, sizeof *d))
            return cache[i].g;
    mpt_cpu_gemm *g = mpt_cpu_gemm_compile(jit, d, err, n);
    if (g && n_cache < (int)(sizeof cache / sizeof cache[0]))
        cache[n_cache++] = (cached_gemm){jit, *d, g};
    else if (g)
        abort(); /* grow the cache */
    return g;
}

static void cache_free(mpt_cpu_jit *jit) {
    for (int i = 0; i < n_cache; i++)
        if (cache[i].jit == jit) {
            mpt_cpu_gemm_free(cache[i].g);
            cache[i--] = cache[--n_cache];
        }
}

typedef struct {
    mpt_cpu_gemm_desc d;
    int64_t M, N, K;
    int64_t pad; /* extra elements per row of every matrix (strided layouts) */
    int in_place; /* the RESIDUAL operand is C itself */
    /* operands through mpt_cpu_gemm_source: bit 0 A, bit 1 B; bit 2 makes
     * their runs go along w (else along k) */
    int source;
    /* A read through offset tables (desc.a_gather): stored [M, lda] with its
     * rows in reverse order, so that the row table is not an even stride;
     * 2: with per-row ranges of nonzero k; 3: and segments of runs of k */
    int gather;
    /* with gather: rows in order, a row's gap after every 13th, and
     * desc.a_row_step set to a row's bytes, so that most tiles' rows are
     * evenly spaced and some are not */
    int even;
} gemm_case;

/* where element (i, k) of A is stored */
static int64_t a_index(const gemm_case *gc, int64_t lda, int64_t i, int64_t k) {
    if (gc->gather && gc->even)
        return (i + i / 13) * lda + k;
    if (gc->gather)
        return (gc->M - 1 - i) * lda + k;
    return gc->d.trans_a ? k * lda + i : i * lda + k;
}

/* A stored matrix served through a source, element by element: (w, k) is
 * p[w*sw + k*sk]. */
typedef struct {
    const char *p;
    int64_t sw, sk;
    size_t es;
} dense_src;

static void dense_fill(const void *ctx, int64_t w0, int64_t wc, int64_t k0, int64_t kc, void *dst,
                       int64_t sw, int64_t sk) {
    const dense_src *s = ctx;
    for (int64_t w = 0; w < wc; w++)
        for (int64_t k = 0; k < kc; k++)
            memcpy((char *)dst + (size_t)(w * sw + k * sk) * s->es,
                   s->p + (size_t)((w0 + w) * s->sw + (k0 + k) * s->sk) * s->es, s->es);
}

/* Runs one case on jit/pool and checks every element of C.
 * Tolerance: an f32 sum of K products (recursive summation) errs by at most
 * about K * eps32 * sum_k |a_ik b_kj|; FMA and k blocking only make it
 * smaller. We allow (K + 2) * eps32 * that sum (the 2 covers bias/residual
 * additions and the prior partial sum), times the largest slope of the epilogue
 * steps, plus 4 ulp of f32 for the polynomial exp/erfc/tanh, plus half an ulp
 * of the output dtype for the final rounding. Inputs are generated already
 * rounded to their dtype, so f16/bf16 products are exact in f32 and the same
 * bound holds for them. */
static void run_case(mpt_cpu_jit *jit, mpt_pool *pool, const gemm_case *gc, const char *label) {
    const mpt_cpu_gemm_desc *d = &gc->d;
    int64_t M = gc->M, N = gc->N, K = gc->K;
    int64_t ar = d->trans_a ? K : M + (gc->even ? M / 13 : 0), ac = d->trans_a ? M : K;
    int64_t br = d->trans_b ? N : K, bc = d->trans_b ? K : N;
    int64_t lda = ac + gc->pad, ldb = bc + gc->pad, ldc = N + gc->pad;
    void *A = random_buf(d->a_dt, ar * lda, 1.0), *B = random_buf(d->b_dt, br * ldb, 1.0);
    void *C = random_buf(d->c_dt, M * ldc, 1.0);
    double *c0 = malloc((size_t)(M * ldc) * sizeof *c0);
    for (int64_t i = 0; i < M * ldc; i++)
        c0[i] = get(d->c_dt, C, i);
    mpt_cpu_epilogue_args args;
    memset(&args, 0, sizeof args);
    void *operands[MPT_CPU_EPI_MAX] = {0};
    double slope = 1;
    for (int s = 0; s < d->n_steps; s++) {
        mpt_cpu_epi_op op = d->steps[s].op;
        if (op == MPT_CPU_EPI_BIAS)
            operands[s] = random_buf(d->steps[s].dt, N, 1.0);
        if (op == MPT_CPU_EPI_RESIDUAL || op == MPT_CPU_EPI_RELU_MASK || op == MPT_CPU_EPI_GELU_GRAD)
            operands[s] = gc->in_place && op == MPT_CPU_EPI_RESIDUAL
                              ? NULL
                              : random_buf(d->steps[s].dt, M * ldc, 1.0);
        args.step[s].ptr = operands[s] ? operands[s] : C;
        args.step[s].ld = op == MPT_CPU_EPI_BIAS ? 0 : ldc;
        args.step[s].scalar = op == MPT_CPU_EPI_SCALE ? -1.75f : 0.0f;
        if (op == MPT_CPU_EPI_SCALE)
            slope *= 1.75;
        if (op == MPT_CPU_EPI_GELU || op == MPT_CPU_EPI_GELU_GRAD)
            slope *= 1.13;
    }
    /* desc.c_rows: C's rows stored in reverse order through the table */
    int64_t *crow = d->c_rows ? malloc((size_t)M * 8) : NULL;
    for (int64_t i = 0; crow && i < M; i++) crow[i] = (M - 1 - i) * ldc * (int64_t)mpt_dtype_size(d->c_dt);
    args.c_row = crow;
    char err[512] = "";
    mpt_cpu_gemm *g = compiled(jit, d, err, sizeof err);
    CHECK_MSG(g != NULL, "%s: compile: %s", label, err);
    if (!g)
        goto out;
    dense_src as = {A, d->trans_a ? 1 : lda, d->trans_a ? lda : 1, mpt_dtype_size(d->a_dt)};
    dense_src bs = {B, d->trans_b ? ldb : 1, d->trans_b ? 1 : ldb, mpt_dtype_size(d->b_dt)};
    mpt_cpu_gemm_source a_src = {dense_fill, &as, gc->source >> 2 & 1, NULL};
    mpt_cpu_gemm_source b_src = {dense_fill, &bs, gc->source >> 2 & 1, NULL};
    int rc;
    if (gc->gather) {
        int64_t *row = malloc((size_t)M * 8), *col = malloc((size_t)K * 8 + 8);
        int64_t es = (int64_t)mpt_dtype_size(d->a_dt);
        for (int64_t i = 0; i < M; i++)
            row[i] = a_index(gc, lda, i, 0) * es;
        for (int64_t k = 0; k < K; k++)
            col[k] = k * es;
        /* gather == 2: each row's nonzero k in a range of its own (some
         * empty, some the whole of K), zeros stored outside it; gather ==
         * 3: and within each run of k_run k's, in a segment of its own */
        int64_t *kr = gc->gather >= 2 ? malloc((size_t)M * 32) : NULL;
        int64_t run = gc->gather == 3 ? K / 6 + 3 : 0;
        for (int64_t i = 0; kr && i < M; i++) {
            int64_t lo = (i * 37) % (K + 1), hi = lo + (i * 53) % (K + 1);
            if (i % 5 == 0) lo = 0, hi = K;
            if (i % 7 == 3) hi = lo;
            int64_t sl = run ? (i * 11) % (run + 1) : 0, sh = run ? sl + (i * 7) % (run + 1) : 0;
            if (i % 4 == 1) sl = 0, sh = run;
            kr[4 * i] = lo;
            kr[4 * i + 1] = hi < K ? hi : K;
            kr[4 * i + 2] = sl;
            kr[4 * i + 3] = sh < run ? sh : run;
            for (int64_t k = 0; k < K; k++)
                if (k < kr[4 * i] || k >= kr[4 * i + 1] ||
                    (run && (k % run < kr[4 * i + 2] || k % run >= kr[4 * i + 3])))
                    put(d->a_dt, A, a_index(gc, lda, i, k), 0.0);
        }
        mpt_cpu_gemm_gather ga = {A, row, col, kr, 0, run};
        rc = mpt_cpu_gemm_run_gather(g, pool, M, N, K, &ga, B, ldb, C, ldc, &args, err,
                                     sizeof err);
        free(row);
        free(col);
        free(kr);
    } else {
        rc = mpt_cpu_gemm_run_src(g, pool, M, N, K, gc->source & 1 ? &a_src : NULL,
                                  gc->source & 1 ? NULL : A, lda, gc->source & 2 ? &b_src : NULL,
                                  gc->source & 2 ? NULL : B, ldb, C, ldc, &args, err, sizeof err);
    }
    CHECK_MSG(rc == 0, "%s: run: %s", label, err);
    double out_ulp = d->c_dt == MPT_DT_F32 ? 0x1p-24 : d->c_dt == MPT_DT_F16 ? 0x1p-11 : 0x1p-8;
    int bad = 0;
    for (int64_t i = 0; i < M && bad < 5; i++) {
        for (int64_t j = 0; j < N && bad < 5; j++) {
            double acc = d->accumulate ? c0[i * ldc + j] : 0, mag = fabs(acc);
            for (int64_t k = 0; k < K; k++) {
                double a = get(d->a_dt, A, a_index(gc, lda, i, k));
                double b = get(d->b_dt, B, d->trans_b ? j * ldb + k : k * ldb + j);
                acc += a * b;
                mag += fabs(a * b);
            }
            double x = acc;
            for (int s = 0; s < d->n_steps; s++) {
                mpt_cpu_epi_op op = d->steps[s].op;
                double operand = 0;
                if (op == MPT_CPU_EPI_BIAS)
                    operand = get(d->steps[s].dt, operands[s], j);
                else if (op == MPT_CPU_EPI_RESIDUAL && !operands[s])
                    operand = c0[i * ldc + j];
                else if (op == MPT_CPU_EPI_RESIDUAL || op == MPT_CPU_EPI_RELU_MASK ||
                         op == MPT_CPU_EPI_GELU_GRAD)
                    operand = get(d->steps[s].dt, operands[s], i * ldc + j);
                if (op == MPT_CPU_EPI_BIAS || op == MPT_CPU_EPI_RESIDUAL)
                    mag += fabs(operand);
                x = epi_ref(op, x, operand, args.step[s].scalar);
            }
            double got = get(d->c_dt, C, (crow ? M - 1 - i : i) * ldc + j);
            double tol = (double)(K + 2) * FLT_EPSILON * mag * slope + 4 * FLT_EPSILON * (1 + fabs(x)) +
                         out_ulp * fabs(x);
            if (!(fabs(got - x) <= tol)) {
                bad++;
                CHECK_MSG(0, "%s: C[%lld,%lld] = %.9g, want %.9g (tol %.3g)", label, (long long)i,
                          (long long)j, got, x, tol);
            }
        }
    }
    CHECK_MSG(bad == 0, "%s: %d mismatches", label, bad);
    /* the padding between rows of C must be untouched */
    for (int64_t i = 0; i < M && gc->pad; i++)
        for (int64_t j = N; j < ldc; j++)
            CHECK_MSG(get(d->c_dt, C, i * ldc + j) == c0[i * ldc + j], "%s: pad written", label);
out:
    free(crow);
    for (int s = 0; s < d->n_steps; s++)
        free(operands[s]);
    free(A);
    free(B);
    free(C);
    free(c0);
}

/* cache blocks small enough that every loop of the driver runs several
 * times, and a k block (40) is not a whole number of AMX tile rows (32) */
static void small_blocks(mpt_cpu_gemm_desc *d) {
    d->kc = 40;
    d->mc = 64;
    d->nc = 64;
}

static mpt_cpu_gemm_desc plain(mpt_dtype in, mpt_dtype out) {
    mpt_cpu_gemm_desc d;
    memset(&d, 0, sizeof d);
    d.a_dt = d.b_dt = in;
    d.c_dt = out;
    return d;
}

/* sizes around the tiles (1, 7, 9, 16, 64) and past the k block (1023);
 * 800 x 64 x 1056 has whole AMX tiles over two k blocks and two row blocks
 * (A read in place, partial sums kept in the tiles) */
static void test_shapes(mpt_cpu_jit *jit, mpt_pool *pool, mpt_dtype in, const char *what) {
    static const int64_t sz[][3] = {{1, 1, 1},   {7, 9, 16},  {9, 7, 1},     {16, 16, 16},
                                    {64, 64, 64}, {7, 1023, 9}, {1023, 9, 7}, {9, 7, 1023},
                                    {33, 65, 300}, {1, 64, 1023}, {64, 1, 513}, {800, 64, 1056}};
    for (int t = 0; t < 4; t++) {
        for (size_t s = 0; s < sizeof sz / sizeof sz[0]; s++) {
            gemm_case gc = {.d = plain(in, MPT_DT_F32), .M = sz[s][0], .N = sz[s][1], .K = sz[s][2]};
            gc.d.trans_a = t & 1;
            gc.d.trans_b = t >> 1;
            char label[128];
            snprintf(label, sizeof label, "%s %s ta=%d tb=%d %lldx%lldx%lld", what,
                     mpt_dtype_name(in), t & 1, t >> 1, (long long)gc.M, (long long)gc.N,
                     (long long)gc.K);
            run_case(jit, pool, &gc, label);
        }
    }
}

/* every step into every output dtype, or (!all) each step into one of them */
static void test_epilogues(mpt_cpu_jit *jit, mpt_pool *pool, const char *what, int all) {
    static const mpt_cpu_epi_op ops[] = {MPT_CPU_EPI_BIAS,    MPT_CPU_EPI_RESIDUAL,
                                         MPT_CPU_EPI_SCALE,   MPT_CPU_EPI_RELU,
                                         MPT_CPU_EPI_SIGMOID, MPT_CPU_EPI_TANH,
                                         MPT_CPU_EPI_GELU,    MPT_CPU_EPI_RELU_MASK,
                                         MPT_CPU_EPI_GELU_GRAD};
    static const mpt_dtype outs[] = {MPT_DT_F32, MPT_DT_F16, MPT_DT_BF16};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        for (size_t c = 0; c < 3; c++) {
            if (!all && c != o % 3)
                continue;
            /* N = 61 runs on the wide tile, 45 on the narrow one (AVX-512) */
            gemm_case gc = {.d = plain(MPT_DT_F32, outs[c]), .M = 37, .N = (o + c) % 2 ? 45 : 61,
                            .K = 19};
            gc.d.n_steps = 1;
            gc.d.steps[0].op = ops[o];
            gc.d.steps[0].dt = outs[(c + o) % 3]; /* every operand dtype somewhere */
            char label[128];
            snprintf(label, sizeof label, "%s epilogue %zu out %s", what, o, mpt_dtype_name(outs[c]));
            run_case(jit, pool, &gc, label);
        }
    }
    /* a chain as fusion produces it: bias, gelu, scale, residual; K past the
     * k block with a bf16 C (partial sums in scratch) */
    gemm_case chain = {.d = plain(MPT_DT_BF16, MPT_DT_BF16), .M = 50, .N = 70, .K = 700};
    mpt_cpu_epi_op seq[] = {MPT_CPU_EPI_BIAS, MPT_CPU_EPI_GELU, MPT_CPU_EPI_SCALE,
                            MPT_CPU_EPI_RESIDUAL};
    chain.d.n_steps = 4;
    for (int i = 0; i < 4; i++) {
        chain.d.steps[i].op = seq[i];
        chain.d.steps[i].dt = MPT_DT_BF16;
    }
    run_case(jit, pool, &chain, "chain bf16");
    chain.d = plain(MPT_DT_F16, MPT_DT_F16);
    chain.d.n_steps = 2;
    chain.d.steps[0] = (mpt_cpu_epi_step){MPT_CPU_EPI_BIAS, MPT_DT_F32, MPT_DT_F32};
    chain.d.steps[1] = (mpt_cpu_epi_step){MPT_CPU_EPI_TANH, MPT_DT_F32, MPT_DT_F32};
    run_case(jit, pool, &chain, "chain f16");
    /* residual read from C itself while C holds partial sums (K > kc) */
    gemm_case inplace = {.d = plain(MPT_DT_F32, MPT_DT_F32), .M = 20, .N = 40, .K = 600,
                         .in_place = 1};
    inplace.d.n_steps = 1;
    inplace.d.steps[0] = (mpt_cpu_epi_step){MPT_CPU_EPI_RESIDUAL, MPT_DT_F32, MPT_DT_F32};
    run_case(jit, pool, &inplace, "in-place residual");
    /* C += A x B (beta = 1) then relu, strided rows, K past the k block */
    gemm_case acc = {.d = plain(MPT_DT_F32, MPT_DT_F32), .M = 31, .N = 77, .K = 530, .pad = 5};
    acc.d.accumulate = 1;
    acc.d.trans_a = 1;
    acc.d.n_steps = 1;
    acc.d.steps[0].op = MPT_CPU_EPI_RELU;
    run_case(jit, pool, &acc, "accumulate");
    /* mixed input dtypes take the convert-on-pack path */
    gemm_case mixed = {.d = plain(MPT_DT_BF16, MPT_DT_F32), .M = 17, .N = 33, .K = 65};
    mixed.d.b_dt = MPT_DT_F16;
    run_case(jit, pool, &mixed, "mixed bf16 x f16");
}

/* The epilogue's math on its own: with K = 1 and A = [1] the accumulator is
 * exactly b, so the kernel's sigmoid/tanh/gelu are compared to libm's double
 * results directly. Bound: MATH_RTOL relative, plus a denormal-sized absolute
 * term (results below FLT_MIN lose relative precision by definition). */
#define MATH_RTOL 1e-6 /* ~8 f32 ulps; the worst measured is 4.5e-7 (gelu tail) */
static void test_epilogue_math(mpt_cpu_jit *jit, mpt_pool *pool, const char *what) {
    static const mpt_cpu_epi_op ops[] = {MPT_CPU_EPI_SIGMOID, MPT_CPU_EPI_TANH, MPT_CPU_EPI_GELU,
                                         MPT_CPU_EPI_RELU};
    enum { N = 4001 };
    float a = 1.0f, *b = malloc(N * sizeof *b), *c = malloc(N * sizeof *c);
    for (int j = 0; j < N; j++)
        b[j] = (float)(-13.0 + 26.0 * j / (N - 1));
    b[N / 2] = 1e-6f; /* tiny arguments: tanh must not cancel */
    b[N / 2 + 1] = -1e-6f;
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        mpt_cpu_gemm_desc d = plain(MPT_DT_F32, MPT_DT_F32);
        d.n_steps = 1;
        d.steps[0].op = ops[o];
        char err[512] = "";
        mpt_cpu_gemm *g = compiled(jit, &d, err, sizeof err);
        CHECK_MSG(g != NULL, "%s", err);
        if (!g)
            continue;
        mpt_cpu_gemm_run(g, pool, 1, N, 1, &a, 0, b, 0, c, 0, NULL, err, sizeof err);
        double worst = 0;
        int bad = 0;
        for (int j = 0; j < N; j++) {
            double ref = epi_ref(ops[o], b[j], 0, 0), e = fabs(c[j] - ref);
            if (e > MATH_RTOL * fabs(ref) + 1e-40 && bad++ < 5)
                CHECK_MSG(0, "%s epilogue %zu at x=%.9g: got %.9g want %.9g", what, o, b[j],
                          c[j], ref);
            if (fabs(ref) > 1e-37 && e / fabs(ref) > worst)
                worst = e / fabs(ref);
        }
        printf("%s epilogue op %d: worst relative error %.3g\n", what, (int)ops[o], worst);
    }
    /* identity epilogue into f16/bf16: exactly round-to-nearest-even, ties included */
    static const mpt_dtype outs[] = {MPT_DT_F16, MPT_DT_BF16};
    for (int o = 0; o < 2; o++) {
        for (int j = 0; j < N; j++)
            b[j] = (float)(rnd() * 100);
        b[0] = 1.0f + 0x1p-8f;     /* bf16 tie: down to even */
        b[1] = 1.0f + 3 * 0x1p-8f; /* bf16 tie: up to even */
        b[2] = 1.0f + 0x1p-11f;    /* f16 tie */
        b[3] = 1.0f + 3 * 0x1p-11f;
        b[4] = 70000.0f;           /* f16 overflow to inf */
        b[5] = 1e-7f;              /* f16 denormal */
        b[6] = NAN;
        mpt_cpu_gemm_desc d = plain(MPT_DT_F32, outs[o]);
        char err[512] = "";
        mpt_cpu_gemm *g = compiled(jit, &d, err, sizeof err);
        CHECK_MSG(g != NULL, "%s", err);
        if (!g)
            continue;
        uint16_t *h = malloc(N * sizeof *h);
        mpt_cpu_gemm_run(g, pool, 1, N, 1, &a, 0, b, 0, h, 0, NULL, err, sizeof err);
        int bad = 0;
        for (int j = 0; j < N; j++) {
            uint16_t want = outs[o] == MPT_DT_F16 ? mpt_f32_to_f16(b[j]) : mpt_f32_to_bf16(b[j]);
            int both_nan = isnan(get(outs[o], &h[j], 0)) && isnan(b[j]);
            if (h[j] != want && !both_nan && bad++ < 5)
                CHECK_MSG(0, "%s %s out of %.9g: 0x%04x, want 0x%04x", what,
                          mpt_dtype_name(outs[o]), b[j], h[j], want);
        }
        free(h);
    }
    free(b);
    free(c);
}

static void test_errors(mpt_cpu_jit *jit) {
    char err[512] = "";
    mpt_cpu_gemm_desc d = plain(MPT_DT_I32, MPT_DT_F32);
    CHECK(mpt_cpu_gemm_compile(jit, &d, err, sizeof err) == NULL);
    CHECK(strstr(err, "hint") != NULL);
    d = plain(MPT_DT_F32, MPT_DT_BF16);
    d.accumulate = 1;
    CHECK(mpt_cpu_gemm_compile(jit, &d, err, sizeof err) == NULL);
    CHECK(strstr(err, "f32") != NULL);
}

static void test_text(mpt_cpu_jit *jit) {
    char err[512] = "";
    mpt_cpu_gemm_desc d = plain(MPT_DT_F32, MPT_DT_F32);
    d.keep_text = 1;
    mpt_cpu_gemm *g = mpt_cpu_gemm_compile(jit, &d, err, sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    if (!g)
        return;
    const char *ir = mpt_cpu_gemm_text(g, "ir"), *as = mpt_cpu_gemm_text(g, "asm");
    CHECK(ir && strstr(ir, "llvm.fma"));
    CHECK(as && strstr(as, "vfmadd"));
    if (mpt_cpu_jit_isa(jit) == MPT_CPU_ISA_AVX512)
        CHECK(as && strstr(as, "zmm"));
    mpt_cpu_gemm_free(g);
    /* bf16: AMX where the host has it; else vdpbf16ps or, with
     * MPT_CPU_BF16_DOT=0 (where it does not pay), f32 FMAs on widened
     * operands */
    for (int dot = 1; dot >= 0; dot--) {
        if (!mpt_cpu_jit_has_bf16_dot(jit) && !mpt_cpu_jit_has_amx(jit))
            break;
        setenv("MPT_CPU_BF16_DOT", dot ? "1" : "0", 1);
        d = plain(MPT_DT_BF16, MPT_DT_F32);
        d.keep_text = 1;
        g = mpt_cpu_gemm_compile(jit, &d, err, sizeof err);
        CHECK_MSG(g != NULL, "%s", err);
        const char *want = mpt_cpu_jit_has_amx(jit) ? "tdpbf16ps" : dot ? "vdpbf16ps" : "vfmadd";
        if (g) {
            const char *as = mpt_cpu_gemm_text(g, "asm");
            CHECK_MSG(strstr(as, want), "no %s in the bf16 kernel (MPT_CPU_BF16_DOT=%d)", want, dot);
            if (!dot && !mpt_cpu_jit_has_amx(jit))
                CHECK_MSG(!strstr(as, "vdpbf16ps"), "vdpbf16ps with MPT_CPU_BF16_DOT=0");
        }
        mpt_cpu_gemm_free(g);
        unsetenv("MPT_CPU_BF16_DOT");
    }
}


/* operands made by a source (implicit GEMM): either or both, runs along w
 * or k, sizes around the tiles and past the k block, default and small
 * blocks (several groups of slivers per fill) */
static void test_sources(mpt_cpu_jit *jit, mpt_pool *pool, mpt_dtype in, const char *what) {
    static const int64_t sz[][3] = {{1, 1, 1}, {7, 9, 16}, {33, 65, 300}, {9, 7, 1100},
                                    {1023, 9, 7}, {100, 130, 201}};
    for (size_t s = 0; s < sizeof sz / sizeof sz[0]; s++)
        for (int src = 1; src < 8; src++) {
            if (src == 4)
                continue;
            gemm_case gc = {.d = plain(in, MPT_DT_F32), .M = sz[s][0], .N = sz[s][1],
                            .K = sz[s][2], .source = src, .pad = s & 1};
            gc.d.trans_a = src & 1 ? (int)(s & 1) : 0;
            gc.d.trans_b = (int)(s >> 1 & 1);
            if (s == 5) {
                small_blocks(&gc.d);
            }
            char label[128];
            snprintf(label, sizeof label, "%s %s source=%d %lldx%lldx%lld", what,
                     mpt_dtype_name(in), src, (long long)gc.M, (long long)gc.N, (long long)gc.K);
            run_case(jit, pool, &gc, label);
        }
}

/* A gathered through offset tables (what a convolution's columns are):
 * sizes around the tile (10 rows on AVX-512) and past the k block, small
 * blocks, an epilogue with a bf16 C, 1 and 2 threads (N split or not);
 * f32 operands, then bf16 and f16 ones (multiplied in f32 FMAs) */
static void test_gather_dt(mpt_cpu_jit *jit, mpt_pool *pool, const char *what, mpt_dtype in);

static void test_gather(mpt_cpu_jit *jit, mpt_pool *pool, const char *what) {
    for (int t = 0; t < 3; t++) {
        static const mpt_dtype dts[] = {MPT_DT_F32, MPT_DT_BF16, MPT_DT_F16};
        if (dts[t] == MPT_DT_F16 && mpt_cpu_jit_isa(jit) == MPT_CPU_ISA_SSE)
            continue;
        test_gather_dt(jit, pool, what, dts[t]);
    }
    /* a bf16 gathered GEMM is multiplied in f32, even where AMX is there */
    char err[512] = "";
    mpt_cpu_gemm_desc d = plain(MPT_DT_BF16, MPT_DT_F32);
    d.a_gather = 1;
    d.keep_text = 1;
    mpt_cpu_gemm *g = mpt_cpu_gemm_compile(jit, &d, err, sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    if (g) {
        const char *as = mpt_cpu_gemm_text(g, "asm");
        CHECK(as && !strstr(as, "tdpbf16ps") && !strstr(as, "vdpbf16ps"));
        if (mpt_cpu_jit_isa(jit) != MPT_CPU_ISA_SSE)
            CHECK(as && strstr(as, "vfmadd"));
        mpt_cpu_gemm_free(g);
    }
    /* the tables go with the flag */
    d = plain(MPT_DT_F32, MPT_DT_F32);
    g = compiled(jit, &d, err, sizeof err);
    float a = 1, b = 1, c = 0;
    int64_t off = 0;
    mpt_cpu_gemm_gather ga = {&a, &off, &off, NULL, 0, 0};
    CHECK(g && mpt_cpu_gemm_run_gather(g, pool, 1, 1, 1, &ga, &b, 0, &c, 0, NULL, err,
                                       sizeof err) == -1);
}

static void test_gather_dt(mpt_cpu_jit *jit, mpt_pool *pool, const char *what, mpt_dtype in) {
    static const int64_t sz[][3] = {{1, 1, 1},     {7, 9, 16},    {11, 64, 1100}, {33, 65, 300},
                                    {1023, 9, 7}, {100, 130, 201}, {21, 96, 40},
                                    {300, 10, 1100}}; /* N <= 16: the narrow gathered tile */
    for (size_t s = 0; s < sizeof sz / sizeof sz[0]; s++) {
        gemm_case gc = {.d = plain(in, s == 3 ? MPT_DT_BF16 : MPT_DT_F32), .M = sz[s][0],
                        .N = sz[s][1], .K = sz[s][2], .pad = s & 1, .gather = s < 2 ? 1 : 2 + (int)(s & 1)};
        gc.d.a_gather = 1;
        gc.d.trans_b = (int)(s >> 1 & 1);
        if (s == 3) {
            gc.d.n_steps = 2;
            gc.d.steps[0] = (mpt_cpu_epi_step){MPT_CPU_EPI_BIAS, MPT_DT_F32, MPT_DT_F32};
            gc.d.steps[1] = (mpt_cpu_epi_step){MPT_CPU_EPI_RELU, MPT_DT_F32, MPT_DT_F32};
        }
        if (s == 5) {
            small_blocks(&gc.d);
        }
        char label[128];
        snprintf(label, sizeof label, "%s gathered %s A %lldx%lldx%lld", what,
                 mpt_dtype_name(in), (long long)gc.M, (long long)gc.N, (long long)gc.K);
        run_case(jit, pool, &gc, label);
    }
    /* rows evenly spaced but for a gap every 13 (desc.a_row_step): N a
     * multiple of 64 takes the 7 x 64 tile, others 10 x 32; tiles on one
     * pointer and tiles across a gap, with ranges of k, two k blocks,
     * small blocks */
    static const int64_t ev[][4] = {{50, 64, 300, 3}, {71, 128, 1100, 2}, {45, 130, 201, 3},
                                    {200, 64, 77, 2}, {7, 64, 40, 1},     {96, 192, 33, 1}};
    for (size_t s = 0; s < sizeof ev / sizeof ev[0]; s++) {
        gemm_case gc = {.d = plain(in, MPT_DT_F32), .M = ev[s][0], .N = ev[s][1], .K = ev[s][2],
                        .pad = (int64_t)s, .gather = (int)ev[s][3], .even = 1};
        gc.d.a_gather = 1;
        gc.d.a_row_step = (gc.K + gc.pad) * (int64_t)mpt_dtype_size(in);
        gc.d.n_hint = gc.N;
        gc.d.trans_b = (int)(s & 1);
        if (s == 3)
            small_blocks(&gc.d);
        char label[128];
        snprintf(label, sizeof label, "%s gathered %s A, even rows, %lldx%lldx%lld", what,
                 mpt_dtype_name(in), (long long)gc.M, (long long)gc.N, (long long)gc.K);
        run_case(jit, pool, &gc, label);
    }
}

static void test_small_blocks(mpt_cpu_jit *jit, mpt_pool *pool, mpt_dtype in, const char *what) {
    for (int t = 0; t < 8; t++) {
        /* N = 40 takes the narrow (16-wide) tile where there is one */
        gemm_case gc = {.d = plain(in, MPT_DT_F32), .M = 100, .N = t < 4 ? 130 : 40, .K = 201,
                        .pad = 3};
        small_blocks(&gc.d);
        gc.d.trans_a = t & 1;
        gc.d.trans_b = (t >> 1) & 1;
        gc.d.accumulate = t == 3 || t == 7;
        char label[128];
        snprintf(label, sizeof label, "%s %s small blocks N=%lld ta=%d tb=%d", what,
                 mpt_dtype_name(in), (long long)gc.N, t & 1, (t >> 1) & 1);
        run_case(jit, pool, &gc, label);
    }
}

/* With denormals flushed (desc.flush_denormals), a bf16 C is rounded by
 * vcvtneps2bf16 where the host has AVX512_BF16: bit for bit what the
 * integer rounding gives under FTZ/DAZ (nearest even, NaN quieted), on AMX
 * or vdpbf16ps products, f32 FMAs (f32 operands), with and without an
 * epilogue, across k blocks, NaN and infinity included. */
static void test_bf16_store_flush(mpt_cpu_jit *jit, mpt_pool *pool, const char *what) {
    int64_t M = 45, N = 70, K = 300;
    for (int v = 0; v < 4; v++) {
        mpt_dtype in = v & 1 ? MPT_DT_F32 : MPT_DT_BF16;
        mpt_cpu_gemm_desc d = plain(in, MPT_DT_BF16);
        if (v & 2) {
            d.n_steps = 2;
            d.steps[0] = (mpt_cpu_epi_step){MPT_CPU_EPI_BIAS, MPT_DT_F32, MPT_DT_F32};
            d.steps[1] = (mpt_cpu_epi_step){MPT_CPU_EPI_GELU, MPT_DT_F32, MPT_DT_F32};
        }
        d.kc = 128; /* partial sums between k blocks */
        void *A = random_buf(in, M * K, 1.0), *B = random_buf(in, K * N, 1.0);
        float *bias = random_buf(MPT_DT_F32, N, 1.0);
        put(in, A, 3, NAN);
        put(in, A, 7 * K + 5, INFINITY);
        uint16_t *C[2] = {calloc((size_t)(M * N), 2), calloc((size_t)(M * N), 2)};
        mpt_cpu_epilogue_args args;
        memset(&args, 0, sizeof args);
        args.step[0].ptr = bias;
        char err[256];
        unsigned csr = mpt_cpu_denormals_begin(1);
        for (int f = 0; f < 2; f++) {
            d.flush_denormals = f;
            mpt_cpu_gemm *g = mpt_cpu_gemm_compile(jit, &d, err, sizeof err);
            CHECK_MSG(g && mpt_cpu_gemm_run(g, pool, M, N, K, A, 0, B, 0, C[f], 0, &args, err,
                                            sizeof err) == 0,
                      "%s: %s", what, err);
            mpt_cpu_gemm_free(g);
        }
        mpt_cpu_denormals_end(csr);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < M * N; i++)
            if (C[0][i] != C[1][i] && !bad++) first = i;
        CHECK_MSG(bad == 0, "%s bf16 C flushing (%s%s): %lld differ, first [%lld] %#x vs %#x", what,
                  mpt_dtype_name(in), v & 2 ? ", bias gelu" : "", (long long)bad, (long long)first,
                  first >= 0 ? C[0][first] : 0, first >= 0 ? C[1][first] : 0);
        free(A);
        free(B);
        free(bias);
        free(C[0]);
        free(C[1]);
    }
}

/* K far longer than M and N on 2 threads: split along K, each thread's
 * sums added at the end (gemm.c split K); K cut at a multiple of 32 that
 * falls inside a k block, every A layout and dtype. */
static void test_split_k(mpt_cpu_jit *jit, mpt_pool *pool, const char *what) {
    static const mpt_dtype ins[] = {MPT_DT_F32, MPT_DT_F16, MPT_DT_BF16};
    for (size_t i = 0; i < 3; i++)
        for (int ta = 0; ta < 2; ta++) {
            gemm_case gc = {.d = plain(ins[i], MPT_DT_F32), .M = 37, .N = 45, .K = 5000,
                            .pad = ta ? 0 : 3};
            gc.d.trans_a = ta;
            char label[128];
            snprintf(label, sizeof label, "%s split K %s ta=%d", what, mpt_dtype_name(ins[i]), ta);
            run_case(jit, pool, &gc, label);
        }
}

/* bf16 GEMMs both ways a host without AMX may run them: vdpbf16ps pairs
 * and f32 FMAs on widened operands (mpt_cpu_bf16_dot_pays picks one) */
static void test_bf16_both(mpt_cpu_jit *jit, mpt_pool *pool, const char *what) {
    for (int dot = 1; dot >= 0; dot--) {
        if (!dot && !mpt_cpu_jit_has_bf16_dot(jit))
            break; /* the default was the widened path already */
        char label[96];
        snprintf(label, sizeof label, "%s%s", what,
                 !mpt_cpu_jit_has_bf16_dot(jit) ? "" : dot ? " vdpbf16ps" : " widened");
        setenv("MPT_CPU_BF16_DOT", dot ? "1" : "0", 1);
        test_shapes(jit, pool, MPT_DT_BF16, label);
        test_small_blocks(jit, pool, MPT_DT_BF16, label);
        test_sources(jit, pool, MPT_DT_BF16, label);
        unsetenv("MPT_CPU_BF16_DOT");
    }
}

/* AMX's k block (choose_kc, codegen/cpu/gemm.c): all of K where it fits,
 * and (MPT_CPU_AMX_K_BYTES=0) fixed blocks, a bf16 C's partial sums in
 * scratch rows a task's columns wide; K past 1024, whole tiles or not, A
 * packed, in place or from a source; a C of f32, or bf16 after a bias and
 * a residual; C's rows through a table (desc.c_rows). */
static void test_amx_k_blocks(mpt_cpu_jit *jit, mpt_pool *pool, const char *what) {
    static const int64_t sz[][4] = {{800, 64, 1056, 0}, {100, 70, 2100, 0}, {96, 200, 3000, 1},
                                    {64, 96, 1152, 0}, {130, 64, 2100, 2}};
    for (int f = 0; f < 2 * mpt_cpu_jit_has_amx(jit); f++, unsetenv("MPT_CPU_AMX_K_BYTES"))
        for (size_t s = 0; s < 10; s++) {
            const int64_t *z = sz[s / 2];
            gemm_case gc = {.d = plain(MPT_DT_BF16, s % 2 ? MPT_DT_BF16 : MPT_DT_F32), .M = z[0],
                            .N = z[1], .K = z[2], .source = (int)z[3] & 1};
            gc.d.c_rows = z[3] == 2;
            gc.d.n_steps = s % 2 ? 2 : 0;
            gc.d.steps[0] = (mpt_cpu_epi_step){MPT_CPU_EPI_BIAS, MPT_DT_F32, MPT_DT_F32};
            gc.d.steps[1] = (mpt_cpu_epi_step){MPT_CPU_EPI_RESIDUAL, MPT_DT_BF16, MPT_DT_F32};
            char label[160];
            snprintf(label, sizeof label, "%s AMX k block %s %lldx%lldx%lld C %s%s%s", what,
                     f ? "fixed" : "whole", (long long)gc.M, (long long)gc.N, (long long)gc.K,
                     mpt_dtype_name(gc.d.c_dt), gc.source ? " A from a source" : "",
                     gc.d.c_rows ? " rows through a table" : "");
            if (f) setenv("MPT_CPU_AMX_K_BYTES", "0", 1);
            run_case(jit, pool, &gc, label);
        }
}

int main(void) {
    char err[512], feats[256];
    printf("host: %s\n", mpt_cpu_host_features(feats, sizeof feats));
    mpt_pool *pools[2] = {mpt_pool_new(1), mpt_pool_new(2)};
    mpt_cpu_jit *host = mpt_cpu_jit_new(MPT_CPU_ISA_HOST, err, sizeof err);
    CHECK_MSG(host != NULL, "%s", err);
    if (!host)
        return check_exit("test_cpu_gemm");
    printf("host ISA: %s, bf16 dot: %d, amx: %d\n", mpt_cpu_isa_name(mpt_cpu_jit_isa(host)),
           mpt_cpu_jit_has_bf16_dot(host), mpt_cpu_jit_has_amx(host));
    test_errors(host);
    test_text(host);
    test_epilogue_math(host, pools[1], "host");
    test_bf16_store_flush(host, pools[1], "host");
    for (int p = 0; p < 2; p++) {
        const char *what = p ? "host 2 threads" : "host 1 thread";
        test_shapes(host, pools[p], MPT_DT_F32, what);
        test_epilogues(host, pools[p], what, 1);
        test_small_blocks(host, pools[p], MPT_DT_F32, what);
        test_sources(host, pools[p], MPT_DT_F32, what);
        test_bf16_both(host, pools[p], what);
        test_gather(host, pools[p], what);
        test_amx_k_blocks(host, pools[p], what);
    }
    test_shapes(host, pools[1], MPT_DT_F16, "host");
    test_split_k(host, pools[1], "host 2 threads");
    printf("host JIT compile time: %.2f s\n", mpt_cpu_jit_compile_seconds(host));
    cache_free(host);
    mpt_cpu_jit_free(host);

    /* the smaller ISAs this binary falls back to on other machines; AVX512
     * forced keeps bf16 on vdpbf16ps where the host would use AMX */
    static const mpt_cpu_isa smaller[] = {MPT_CPU_ISA_AVX512, MPT_CPU_ISA_AVX2, MPT_CPU_ISA_SSE};
    for (int i = 0; i < 3; i++) {
        mpt_cpu_jit *jit = mpt_cpu_jit_new(smaller[i], err, sizeof err);
        if (!jit) {
            printf("skipping %s: %s\n", mpt_cpu_isa_name(smaller[i]), err);
            continue;
        }
        if (smaller[i] == MPT_CPU_ISA_AVX512) {
            CHECK(!mpt_cpu_jit_has_amx(jit));
            test_bf16_both(jit, pools[1], "avx512");
            test_bf16_store_flush(jit, pools[1], "avx512");
            test_text(jit);
            cache_free(jit);
            mpt_cpu_jit_free(jit);
            continue;
        }
        test_shapes(jit, pools[1], MPT_DT_F32, mpt_cpu_isa_name(smaller[i]));
        test_shapes(jit, pools[1], MPT_DT_BF16, mpt_cpu_isa_name(smaller[i]));
        test_sources(jit, pools[1], MPT_DT_F32, mpt_cpu_isa_name(smaller[i]));
        test_gather(jit, pools[1], mpt_cpu_isa_name(smaller[i]));
        if (smaller[i] == MPT_CPU_ISA_AVX2) {
            test_epilogues(jit, pools[1], "avx2", 0);
            test_epilogue_math(jit, pools[1], "avx2");
            test_text(jit);
        }
        cache_free(jit);
        mpt_cpu_jit_free(jit);
    }
    mpt_pool_free(pools[0]);
    mpt_pool_free(pools[1]);
    return check_exit("test_cpu_gemm");
}
