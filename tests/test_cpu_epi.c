/* tests/test_cpu_epi.c — a GEMM's epilogue on f16/bf16 chains (a mixed
 * policy's matmul, bias and ReLU): the ROUND step and a bias rounded once
 * loaded, bit for bit, first on the GEMM alone (host ISA and AVX2), then in
 * plans against the interpreter, with the ops counted into the GEMM. Then
 * a transformer MLP's GELU forward and backward: the STORE and GELU_GRAD
 * steps on the GEMM alone, and the chains through reshapes in a plan; and
 * their exact f16/bf16 form, over every input, and the f32 error bound it
 * rests on. */
#include <xmmintrin.h>

#include "cpu_check.h"

/* v rounded to dt, as the interpreter rounds a node's value */
static double rt(mpt_dtype dt, double v) { return mpt_round_to(dt, v); }

static uint16_t bits_of(mpt_dtype dt, double v) {
    return dt == MPT_DT_F16 ? mpt_f32_to_f16((float)v) : mpt_f32_to_bf16((float)v);
}

/* C = relu(round(round(round(A x B) + round(bias)) * s)) with K = 1 and A =
 * [1, -1]: the accumulator is exactly +-b, so each rounding shows. */
static void test_round_steps(mpt_cpu_jit *jit, mpt_pool *pool, const char *what) {
    enum { N = 2001 };
    static const mpt_dtype outs[] = {MPT_DT_F16, MPT_DT_BF16};
    float a[2] = {1.0f, -1.0f}, *b = malloc(N * sizeof *b), *bias = malloc(N * sizeof *bias);
    uint16_t *c = malloc(2 * N * sizeof *c);
    const float s = -1.75f; /* exact in both dtypes */
    for (int j = 0; j < N; j++) {
        b[j] = (float)(200 * urand() - 100);
        bias[j] = (float)(200 * urand() - 100);
    }
    b[0] = 1.0f + 0x1p-9f; /* ties of bf16 once the bias is added, and of f16 */
    bias[0] = 0.0f;
    b[1] = 1.0f + 0x1p-12f;
    for (int o = 0; o < 2; o++) {
        mpt_dtype dt = outs[o];
        mpt_cpu_gemm_desc d;
        memset(&d, 0, sizeof d);
        d.a_dt = d.b_dt = MPT_DT_F32;
        d.c_dt = dt;
        d.n_steps = 5;
        d.steps[0] = (mpt_cpu_epi_step){MPT_CPU_EPI_ROUND, dt, MPT_DT_F32};
        d.steps[1] = (mpt_cpu_epi_step){MPT_CPU_EPI_BIAS, MPT_DT_F32, dt};
        d.steps[2] = (mpt_cpu_epi_step){MPT_CPU_EPI_ROUND, dt, MPT_DT_F32};
        d.steps[3] = (mpt_cpu_epi_step){MPT_CPU_EPI_SCALE, MPT_DT_F32, MPT_DT_F32};
        d.steps[4] = (mpt_cpu_epi_step){MPT_CPU_EPI_RELU, MPT_DT_F32, MPT_DT_F32};
        char err[512] = "";
        mpt_cpu_gemm *g = mpt_cpu_gemm_compile(jit, &d, err, sizeof err);
        CHECK_MSG(g != NULL, "%s %s: compile: %s", what, mpt_dtype_name(dt), err);
        if (!g) continue;
        mpt_cpu_epilogue_args args;
        memset(&args, 0, sizeof args);
        args.step[1].ptr = bias;
        args.step[3].scalar = s;
        int rc = mpt_cpu_gemm_run(g, pool, 2, N, 1, a, 0, b, 0, c, 0, &args, err, sizeof err);
        CHECK_MSG(rc == 0, "%s %s: run: %s", what, mpt_dtype_name(dt), err);
        int bad = 0;
        for (int i = 0; i < 2 && rc == 0; i++)
            for (int j = 0; j < N; j++) {
                double x = rt(dt, rt(dt, rt(dt, a[i] * (double)b[j]) + rt(dt, bias[j])) * s);
                uint16_t want = bits_of(dt, x > 0 ? x : 0), got = c[i * N + j];
                if (got != want && bad++ < 5)
                    CHECK_MSG(0, "%s %s C[%d,%d]: 0x%04x, want 0x%04x (b %.9g, bias %.9g)", what,
                              mpt_dtype_name(dt), i, j, got, want, b[j], bias[j]);
            }
        CHECK_MSG(bad == 0, "%s %s: %d of %d differ", what, mpt_dtype_name(dt), bad, 2 * N);
        mpt_cpu_gemm_free(g);
    }
    /* ROUND to f32 is refused with a hint */
    mpt_cpu_gemm_desc d;
    memset(&d, 0, sizeof d);
    d.n_steps = 1;
    d.steps[0] = (mpt_cpu_epi_step){MPT_CPU_EPI_ROUND, MPT_DT_F32, MPT_DT_F32};
    char err[512] = "";
    CHECK(mpt_cpu_gemm_compile(jit, &d, err, sizeof err) == NULL && strstr(err, "hint"));
    free(b);
    free(bias);
    free(c);
}

/* y1 = relu(a x w + bias), y2 = (a x w) * 0.75 + bias, y3 = tanh(a x w3 +
 * bias), each in dt, K = 1
 * (products exact in f32, so every value is the interpreter's bit for bit,
 * TOL_EXACT): y1's and y2's chains must run in the GEMMs' epilogues. */
static void test_plans(void) {
    static const int64_t mn[][2] = {{37, 45}, {64, 96}, {1, 1023}};
    char what[128];
    for (int d = 0; d < 3; d++)
        for (size_t si = 0; si < sizeof mn / sizeof mn[0]; si++) {
            mpt_dtype dt = float_dts[d];
            int64_t M = mn[si][0], N = mn[si][1];
            mpt_graph *g = mpt_graph_new("epi");
            int a = mpt_b_cast(g, mpt_b_input(g, "a", MPT_DT_F32, mpt_shape_2(M, 1)), dt);
            int w = mpt_b_cast(g, mpt_b_variable(g, "w", mpt_shape_2(1, N), MPT_INIT_UNIFORM, 0, 0, 3, 1), dt);
            int bias = mpt_b_variable(g, "bias", mpt_shape_1(N), MPT_INIT_UNIFORM, 0, 0, 3, 1);
            int bb = mpt_b_broadcast(g, mpt_b_cast(g, bias, dt), mpt_shape_2(M, N), 0x2);
            int z = mpt_b_binary(g, MPT_OP_ADD, mpt_b_matmul(g, a, w, 0, 0), bb);
            mpt_graph_add_output(g, "y1", mpt_b_cast(g, mpt_b_unary(g, MPT_OP_RELU, z), MPT_DT_F32));
            int mm2 = mpt_b_matmul(g, a, mpt_b_cast(g, mpt_b_variable(g, "w2", mpt_shape_2(1, N), MPT_INIT_UNIFORM, 0, 0, 3, 1), dt), 0, 0);
            int sc = mpt_b_binary(g, MPT_OP_MUL, mm2, mpt_b_broadcast_to(g, mpt_b_scalar(g, dt, 0.75), mpt_shape_2(M, N)));
            mpt_graph_add_output(g, "y2", mpt_b_binary(g, MPT_OP_ADD, sc, bb));
            /* a low chain leaves tanh to the epilogue loop (done in double
             * there; an f32 chain takes the GEMM's f32 tanh, not exact) */
            if (dt != MPT_DT_F32) {
                int mm3 = mpt_b_matmul(g, a, mpt_b_cast(g, mpt_b_variable(g, "w3", mpt_shape_2(1, N), MPT_INIT_UNIFORM, 0, 0, 3, 1), dt), 0, 0);
                mpt_graph_add_output(g, "y3", mpt_b_unary(g, MPT_OP_TANH, mpt_b_binary(g, MPT_OP_ADD, mm3, bb)));
            }
            snprintf(what, sizeof what, "epilogue chain %s %lldx%lld", mpt_dtype_name(dt), (long long)M, (long long)N);
            run_both(g, 1, tol_for(TOL_EXACT, dt, 1), 0, what, BOTH);
            if (dt != MPT_DT_F32 && si == 0) {
                char *text = plan_text(g, what), *t = text ? text : "", y1[128], y2[128];
                const char *n = mpt_dtype_name(dt);
                /* y1's cast to f32 ends the chain: relu's value rounded
                 * again, stored as an f32 C */
                snprintf(y1, sizeof y1, "C=f32 trans=NN, 4 epilogue steps (round to %s, + bias f32 as %s, relu, round to %s)", n, n, n);
                /* (y1's kernel writes the cast bias too: y2 reads it) */
                snprintf(y2, sizeof y2, "4 epilogue steps (round to %s, * scalar, round to %s, + bias %s)", n, n, n);
                CHECK_MSG(strstr(t, y1) && strstr(t, y2), "%s: both chains in the GEMMs' epilogues:\n%s", what, t);
                free(text);
            }
            mpt_graph_free(g);
        }
}

/* gelu'(z) = Phi(z) + z phi(z), in double */
static double gelu_grad_ref(double z) {
    return 0.5 * erfc(-z / sqrt(2.0)) + z * exp(-0.5 * z * z) / sqrt(2.0 * M_PI);
}

/* C = (a x b + bias) * gelu'(aux), the sum stored on the way as dt (M = 3,
 * K = 1: the accumulator a[i] * b[j] is exact). The stored values are
 * checked bit for bit; C against double math with GELU's f32 bound (1e-6
 * relative, test_cpu_gemm's MATH_RTOL) plus 1e-7 absolute where Phi and
 * z phi cancel (gelu' is 0 at z = -0.7518). */
static void test_store_gelu_grad(mpt_cpu_jit *jit, mpt_pool *pool, const char *what) {
    enum { M = 3, N = 4001 };
    static const mpt_dtype sdts[] = {MPT_DT_F32, MPT_DT_BF16};
    float a[M] = {1.0f, -1.0f, 0.5f}, *b = malloc(N * sizeof *b), *bias = malloc(N * sizeof *bias);
    float *aux = malloc(M * N * sizeof *aux), *c = malloc(M * N * sizeof *c);
    void *st = malloc(M * N * sizeof(float));
    for (int j = 0; j < N; j++) {
        b[j] = (float)(200 * urand() - 100);
        bias[j] = (float)(20 * urand() - 10);
    }
    for (int i = 0; i < M * N; i++) aux[i] = (float)(-13.0 + 26.0 * (i % N) / (N - 1) + 0.1 * (i / N));
    for (size_t o = 0; o < sizeof sdts / sizeof sdts[0]; o++) {
        mpt_dtype dt = sdts[o];
        mpt_cpu_gemm_desc d;
        memset(&d, 0, sizeof d);
        d.a_dt = d.b_dt = d.c_dt = MPT_DT_F32;
        d.n_steps = 3;
        d.steps[0] = (mpt_cpu_epi_step){MPT_CPU_EPI_BIAS, MPT_DT_F32, MPT_DT_F32};
        d.steps[1] = (mpt_cpu_epi_step){MPT_CPU_EPI_STORE, dt, MPT_DT_F32};
        d.steps[2] = (mpt_cpu_epi_step){MPT_CPU_EPI_GELU_GRAD, MPT_DT_F32, MPT_DT_F32};
        char err[512] = "";
        mpt_cpu_gemm *g = mpt_cpu_gemm_compile(jit, &d, err, sizeof err);
        CHECK_MSG(g != NULL, "%s store %s: compile: %s", what, mpt_dtype_name(dt), err);
        if (!g) continue;
        mpt_cpu_epilogue_args args;
        memset(&args, 0, sizeof args);
        args.step[0].ptr = bias;
        args.step[1].ptr = st;
        args.step[2].ptr = aux;
        int rc = mpt_cpu_gemm_run(g, pool, M, N, 1, a, 0, b, 0, c, 0, &args, err, sizeof err);
        CHECK_MSG(rc == 0, "%s store %s: run: %s", what, mpt_dtype_name(dt), err);
        int bad = 0;
        double worst = 0;
        for (int i = 0; i < M * N && rc == 0; i++) {
            float sum = a[i / N] * b[i % N] + bias[i % N]; /* one f32 rounding, as the FMA-free add */
            double stored = dt == MPT_DT_F32 ? ((float *)st)[i]
                                             : mpt_bf16_to_f32(((uint16_t *)st)[i]);
            double want_st = dt == MPT_DT_F32 ? sum : rt(dt, sum);
            double ref = sum * gelu_grad_ref(aux[i]), e = fabs(c[i] - ref);
            if (e > worst) worst = e;
            if ((stored != want_st || !(e <= 1e-6 * fabs(ref) + 1e-7 * fabs(sum))) && bad++ < 5)
                CHECK_MSG(0, "%s store %s [%d]: stored %.9g want %.9g; C %.9g want %.9g (aux %.9g)",
                          what, mpt_dtype_name(dt), i, stored, want_st, c[i], ref, aux[i]);
        }
        CHECK_MSG(bad == 0, "%s store %s: %d of %d wrong", what, mpt_dtype_name(dt), bad, M * N);
        mpt_cpu_gemm_free(g);
    }
    free(b);
    free(bias);
    free(aux);
    free(c);
    free(st);
}

/* The finite check step (a weight gradient's loss-scale check in its
 * GEMM): each column's flag is 0 exactly where a value C stores in that
 * column is NaN or infinite, and C is as without the step. Column 5 holds
 * a NaN product, column 40 overflows f32 in some rows, column 60 sums to
 * 3.3995e38: finite in f32, infinite rounded to bf16, column 50 sums two
 * finite halves to an infinity. Shapes split along
 * N, along M (both threads on the same columns) and along K (f32 C: the
 * sums of the threads' parts checked again). */
static void test_finite_step(mpt_cpu_jit *jit, mpt_pool *pool, const char *what) {
    static const struct { mpt_dtype ab, c; int round; } kinds[] = {
        {MPT_DT_F32, MPT_DT_F32, 0}, {MPT_DT_BF16, MPT_DT_F32, 1}, {MPT_DT_BF16, MPT_DT_BF16, 1}};
    static const int64_t shapes[][3] = {{70, 75, 64}, {300, 70, 64}, {64, 64, 8192}};
    for (size_t kd = 0; kd < sizeof kinds / sizeof kinds[0]; kd++) {
        mpt_dtype ab = kinds[kd].ab, cdt = kinds[kd].c;
        char err[512] = "";
        mpt_cpu_gemm *g[2] = {NULL, NULL};
        for (int with = 0; with < 2; with++) {
            mpt_cpu_gemm_desc d;
            memset(&d, 0, sizeof d);
            d.a_dt = d.b_dt = ab;
            d.c_dt = cdt;
            if (kinds[kd].round) d.steps[d.n_steps++] = (mpt_cpu_epi_step){MPT_CPU_EPI_ROUND, MPT_DT_BF16, MPT_DT_F32};
            if (with) d.steps[d.n_steps++] = (mpt_cpu_epi_step){MPT_CPU_EPI_FINITE, MPT_DT_F32, MPT_DT_F32};
            g[with] = mpt_cpu_gemm_compile(jit, &d, err, sizeof err);
            CHECK_MSG(g[with] != NULL, "%s finite: compile: %s", what, err);
        }
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0] && g[0] && g[1]; si++) {
            int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
            size_t es = mpt_dtype_size(ab), cs = mpt_dtype_size(cdt);
            float *af = calloc((size_t)(M * K), 4), *bf = calloc((size_t)(K * N), 4);
            void *a = malloc((size_t)(M * K) * es), *b = malloc((size_t)(K * N) * es);
            char *c0 = malloc((size_t)(M * N) * cs), *c1 = malloc((size_t)(M * N) * cs);
            unsigned char *flag = malloc((size_t)N);
            for (int64_t i = 0; i < M * K; i++) af[i] = (float)(urand() - 0.5);
            for (int64_t i = 0; i < K * N; i++) bf[i] = (float)(urand() - 0.5);
            /* k = 0, 1, 2 carry the planted products */
            for (int64_t i = 0; i < M; i++) {
                af[i * K] = af[i * K + 1] = 1.0f;
                af[i * K + 2] = i % 7 == 3 ? 2.0f : 0.0f;
            }
            bf[5] = NAN;
            bf[2 * N + 40] = 3.0e38f;                 /* x 2: inf in rows i % 7 == 3 */
            bf[60] = mpt_bf16_to_f32(0x7f7f);         /* bf16's largest, 3.3895e38 */
            bf[N + 60] = mpt_bf16_to_f32(0x7b40);     /* + 9.97e35 */
            /* column 50: 2e38 at the first and the last k, finite parts
             * whose sum is not (split along K, one in each thread's part) */
            for (int64_t i = 0; i < M; i++) af[i * K + K - 1] = 1.0f;
            bf[50] = bf[(K - 1) * N + 50] = 2.0e38f;
            for (int64_t i = 0; i < M * K; i++)
                if (ab == MPT_DT_BF16) ((uint16_t *)a)[i] = mpt_f32_to_bf16(af[i]);
                else ((float *)a)[i] = af[i];
            for (int64_t i = 0; i < K * N; i++)
                if (ab == MPT_DT_BF16) ((uint16_t *)b)[i] = mpt_f32_to_bf16(bf[i]);
                else ((float *)b)[i] = bf[i];
            mpt_cpu_epilogue_args args;
            memset(&args, 0, sizeof args);
            memset(flag, 7, (size_t)N); /* the run sets them */
            args.step[kinds[kd].round].ptr = flag;
            int rc = mpt_cpu_gemm_run(g[0], pool, M, N, K, a, 0, b, 0, c0, 0, NULL, err, sizeof err) ||
                     mpt_cpu_gemm_run(g[1], pool, M, N, K, a, 0, b, 0, c1, 0, &args, err, sizeof err);
            CHECK_MSG(rc == 0, "%s finite: run: %s", what, err);
            char shape[160];
            snprintf(shape, sizeof shape, "%s finite %s/%s %lldx%lldx%lld", what, mpt_dtype_name(ab),
                     mpt_dtype_name(cdt), (long long)M, (long long)N, (long long)K);
            CHECK_MSG(rc || !memcmp(c0, c1, (size_t)(M * N) * cs), "%s: C changed by the check", shape);
            int bad = 0, cleared = 0;
            for (int64_t j = 0; j < N && !rc; j++) {
                int want = 1;
                for (int64_t i = 0; i < M; i++) {
                    float v = cdt == MPT_DT_BF16 ? mpt_bf16_to_f32(((uint16_t *)c1)[i * N + j])
                                                 : ((float *)c1)[i * N + j];
                    want &= isfinite(v) != 0;
                }
                cleared += !want;
                if (flag[j] != want && bad++ < 5)
                    CHECK_MSG(0, "%s: column %lld flag %d want %d", shape, (long long)j, flag[j], want);
            }
            /* the planted columns: 5, 40 and 50 always, 60 where C is rounded to bf16 */
            CHECK_MSG(rc || cleared == 3 + kinds[kd].round, "%s: %d columns not finite, want %d", shape,
                      cleared, 3 + kinds[kd].round);
            free(af);
            free(bf);
            free(a);
            free(b);
            free(c0);
            free(c1);
            free(flag);
        }
        mpt_cpu_gemm_free(g[0]);
        mpt_cpu_gemm_free(g[1]);
    }
}

/* GELU and x * gelu'(v) in an f16/bf16 chain, over every input of the
 * dtype (v, and the accumulator C = 1 x b = b, take all 2^16 bit patterns),
 * bit for bit against the interpreter's definition: f64 rounded once. This
 * is the proof of gemm_epi.c's gelu_exact (f32, double near midpoints). */
static void test_gelu_exact(mpt_cpu_jit *jit, mpt_pool *pool, const char *what) {
    enum { N = 65536 };
    static const mpt_dtype dts[] = {MPT_DT_F16, MPT_DT_BF16};
    float a[1] = {1.0f}, *b = malloc(N * sizeof *b), *ones = malloc(N * sizeof *ones);
    uint16_t *c = malloc(N * sizeof *c);
    for (int o = 0; o < 2; o++) {
        mpt_dtype dt = dts[o];
        if (dt == MPT_DT_F16 && mpt_cpu_jit_isa(jit) == MPT_CPU_ISA_SSE)
            continue; /* f16 GEMMs need F16C */
        uint16_t *v = malloc(N * sizeof *v);
        for (int j = 0; j < N; j++) {
            v[j] = (uint16_t)j;
            b[j] = dt == MPT_DT_F16 ? mpt_f16_to_f32((uint16_t)j) : mpt_bf16_to_f32((uint16_t)j);
            ones[j] = 1.0f;
        }
        for (int grad = 0; grad < 2; grad++) {
            mpt_cpu_gemm_desc d;
            memset(&d, 0, sizeof d);
            d.a_dt = d.b_dt = MPT_DT_F32;
            d.c_dt = dt;
            d.n_steps = 2;
            d.steps[0] = (mpt_cpu_epi_step){MPT_CPU_EPI_ROUND, dt, MPT_DT_F32};
            d.steps[1] = grad ? (mpt_cpu_epi_step){MPT_CPU_EPI_GELU_GRAD, dt, dt}
                              : (mpt_cpu_epi_step){MPT_CPU_EPI_GELU, MPT_DT_F32, dt};
            char err[512] = "";
            mpt_cpu_gemm *g = mpt_cpu_gemm_compile(jit, &d, err, sizeof err);
            CHECK_MSG(g != NULL, "%s gelu %s: compile: %s", what, mpt_dtype_name(dt), err);
            if (!g) continue;
            mpt_cpu_epilogue_args args;
            memset(&args, 0, sizeof args);
            args.step[1].ptr = v;
            int rc = mpt_cpu_gemm_run(g, pool, 1, N, 1, a, 0, grad ? ones : b, 0, c, 0, &args, err,
                                      sizeof err);
            CHECK_MSG(rc == 0, "%s gelu %s: run: %s", what, mpt_dtype_name(dt), err);
            int bad = 0;
            for (int j = 0; j < N && rc == 0; j++) {
                double x = b[j];
                double y = grad ? 0.5 * (1.0 + erf(x * M_SQRT1_2)) +
                                      x * exp(-0.5 * x * x) * (0.5 * M_2_SQRTPI * M_SQRT1_2)
                                : x * (0.5 * (1.0 + erf(x * M_SQRT1_2)));
                double r = rt(dt, y);
                uint16_t want = bits_of(dt, r);
                if (isnan(r) && ((c[j] & 0x7fff) > (dt == MPT_DT_F16 ? 0x7c00 : 0x7f80))) continue;
                if (!grad && x == 0 && signbit(x)) continue; /* 0 + 1 x -0 is +0 in C */
                if (c[j] != want && bad++ < 5)
                    CHECK_MSG(0, "%s gelu%s %s x=%.9g: 0x%04x, want 0x%04x", what, grad ? "_grad" : "",
                              mpt_dtype_name(dt), x, c[j], want);
            }
            CHECK_MSG(bad == 0, "%s gelu%s %s: %d of %d differ", what, grad ? "_grad" : "",
                      mpt_dtype_name(dt), bad, N);
            mpt_cpu_gemm_free(g);
        }
        free(v);
    }
    free(b);
    free(ones);
    free(c);
}

/* The bound gelu_exact rests on: the f32 GELU and gelu' (the steps in
 * f32) within 2^-17 of |y| (gelu': of |Phi| + |x phi|) for x >= -5, on a
 * dense sweep of f32 inputs (every 1031st f32 from -12 to 0, every 4099th
 * from 0 to the largest). Checked against 2^-19, a fourth of the bound;
 * the measured worst is printed. The f32 epilogue keeps that relative
 * precision in the left tail too (-12 <= x < -5, where Phi is down to
 * 2e-33), so the sweep goes there: the reference takes Phi from erfc,
 * which does not cancel. */
static void test_gelu_f32_bound(mpt_cpu_jit *jit, mpt_pool *pool, const char *what) {
    int64_t n = 0, cap = 3 << 20;
    float a[1] = {1.0f}, *x = malloc(cap * sizeof *x), *ones = malloc(cap * sizeof *ones);
    float *c = malloc(cap * sizeof *c);
    for (uint32_t u = 0x80000000u; n < cap; u += 1031) {
        float f;
        memcpy(&f, &u, 4);
        if (f < -12.0f) break;
        x[n++] = f;
    }
    for (uint32_t u = 0; u < 0x7f800000u && n < cap - 2; u += 4099) memcpy(&x[n++], &u, 4);
    x[n++] = INFINITY; /* the interpreter's values: GELU inf and NaN (-inf * 0), gelu' NaN */
    x[n++] = -INFINITY;
    for (int64_t i = 0; i < n; i++) ones[i] = 1.0f;
    for (int grad = 0; grad < 2; grad++) {
        mpt_cpu_gemm_desc d;
        memset(&d, 0, sizeof d);
        d.a_dt = d.b_dt = d.c_dt = MPT_DT_F32;
        d.n_steps = 1;
        d.steps[0] = grad ? (mpt_cpu_epi_step){MPT_CPU_EPI_GELU_GRAD, MPT_DT_F32, MPT_DT_F32}
                          : (mpt_cpu_epi_step){MPT_CPU_EPI_GELU, MPT_DT_F32, MPT_DT_F32};
        char err[512] = "";
        mpt_cpu_gemm *g = mpt_cpu_gemm_compile(jit, &d, err, sizeof err);
        CHECK_MSG(g != NULL, "%s gelu f32: compile: %s", what, err);
        if (!g) continue;
        mpt_cpu_epilogue_args args;
        memset(&args, 0, sizeof args);
        args.step[0].ptr = x;
        int rc = mpt_cpu_gemm_run(g, pool, 1, n, 1, a, 0, grad ? ones : x, 0, c, 0, &args, err,
                                  sizeof err);
        CHECK_MSG(rc == 0, "%s gelu f32: run: %s", what, err);
        double worst = 0, at = 0;
        for (int64_t i = 0; i < n && rc == 0; i++) {
            double v = x[i], cdf = 0.5 * erfc(-v * M_SQRT1_2);
            double xpdf = v * exp(-0.5 * v * v) * (0.5 * M_2_SQRTPI * M_SQRT1_2);
            double y = grad ? cdf + xpdf : v * cdf, mag = grad ? fabs(cdf) + fabs(xpdf) : fabs(y);
            if (!isfinite(y) || !isfinite(c[i])) continue; /* always recomputed */
            double e = fabs(c[i] - y) - 0x1p-112; /* the bound's floor */
            if (e > 0 && e / mag > worst) {
                worst = e / mag;
                at = v;
            }
        }
        if (rc == 0)
            CHECK_MSG((grad ? isnan(c[n - 2]) : c[n - 2] == INFINITY) && isnan(c[n - 1]),
                      "%s gelu%s f32: %g at +inf, %g at -inf", what, grad ? "_grad" : "",
                      c[n - 2], c[n - 1]);
        printf("%s gelu%s f32: worst error %.3g of the magnitude (2^%.1f) at x = %.9g, %lld inputs\n",
               what, grad ? "_grad" : "", worst, worst > 0 ? log2(worst) : -999.0, at, (long long)n);
        CHECK_MSG(worst <= 0x1p-19, "%s gelu%s f32: error %.3g at x = %.9g over 2^-19", what,
                  grad ? "_grad" : "", worst, at);
        mpt_cpu_gemm_free(g);
    }
    free(x);
    free(ones);
    free(c);
}

/* A transformer MLP as autodiff writes it (f32): z = reshape(a x w) + bias
 * and y = reshape(gelu(z)), both outputs; dz = reshape(dy x w2^T) *
 * gelu_grad(v) and its reshape, both outputs. Each must be one GEMM whose
 * epilogue does it all (no epilogue loop), against the interpreter (f32
 * GELU math: TOL_ACCUM). */
static void test_mlp_plan(void) {
    enum { M = 24, K = 7, N = 40 };
    mpt_graph *g = mpt_graph_new("mlp");
    mpt_shape s3 = mpt_shape_make(3, (int64_t[]){2, M / 2, N});
    int a = mpt_b_input(g, "a", MPT_DT_F32, mpt_shape_2(M, K));
    int w = mpt_b_variable(g, "w", mpt_shape_2(K, N), MPT_INIT_UNIFORM, 0, 0, 3, 1);
    int bias = mpt_b_variable(g, "bias", mpt_shape_1(N), MPT_INIT_UNIFORM, 0, 0, 3, 1);
    int z = mpt_b_binary(g, MPT_OP_ADD, mpt_b_reshape(g, mpt_b_matmul(g, a, w, 0, 0), s3),
                         mpt_b_broadcast(g, bias, s3, 0x4));
    mpt_graph_add_output(g, "z", z);
    mpt_graph_add_output(g, "y", mpt_b_reshape(g, mpt_b_unary(g, MPT_OP_GELU, z), mpt_shape_2(M, N)));
    int dy = mpt_b_input(g, "dy", MPT_DT_F32, mpt_shape_2(M, K));
    int w2 = mpt_b_variable(g, "w2", mpt_shape_2(N, K), MPT_INIT_UNIFORM, 0, 0, 3, 1);
    int v = mpt_b_input(g, "v", MPT_DT_F32, s3);
    int dz = mpt_b_binary(g, MPT_OP_MUL, mpt_b_reshape(g, mpt_b_matmul(g, dy, w2, 0, 1), s3),
                          mpt_b_unary(g, MPT_OP_GELU_GRAD, v));
    mpt_graph_add_output(g, "dz", dz);
    mpt_graph_add_output(g, "dz2", mpt_b_reshape(g, dz, mpt_shape_2(M, N)));
    run_both(g, 1, tol_for(TOL_ACCUM, MPT_DT_F32, K), 0, "gelu mlp", FUSED);
    char *text = plan_text(g, "gelu mlp"), *t = text ? text : "";
    CHECK_MSG(strstr(t, "0 generated functions, gemm M=24 N=40 K=7 A=f32 B=f32 C=f32 trans=NN, 3 "
                        "epilogue steps (+ bias f32, store f32, gelu)") &&
                  strstr(t, "0 generated functions, gemm M=24 N=40 K=7 A=f32 B=f32 C=f32 trans=NT, "
                            "2 epilogue steps (* gelu_grad f32, store f32)"),
              "gelu mlp: both chains whole in the GEMMs' epilogues:\n%s", t);
    free(text);
    mpt_graph_free(g);
}

/* The same MLP in bf16 with K = 1 (each product exact, so the plan must
 * match the interpreter bit for bit): GELU and gelu' join the GEMMs'
 * epilogues, rounded exactly (gemm_epi.c gelu_exact). */
static void test_mlp_plan_bf16(void) {
    enum { M = 24, K = 1, N = 40 };
    const mpt_dtype bf = MPT_DT_BF16;
    mpt_graph *g = mpt_graph_new("mlp_bf16");
    mpt_shape s3 = mpt_shape_make(3, (int64_t[]){2, M / 2, N});
    int a = mpt_b_input(g, "a", bf, mpt_shape_2(M, K));
    int w = mpt_b_input(g, "w", bf, mpt_shape_2(K, N));
    int bias = mpt_b_input(g, "bias", bf, mpt_shape_1(N));
    int z = mpt_b_binary(g, MPT_OP_ADD, mpt_b_reshape(g, mpt_b_matmul(g, a, w, 0, 0), s3),
                         mpt_b_broadcast(g, bias, s3, 0x4));
    mpt_graph_add_output(g, "z", z);
    mpt_graph_add_output(g, "y", mpt_b_reshape(g, mpt_b_unary(g, MPT_OP_GELU, z), mpt_shape_2(M, N)));
    int dy = mpt_b_input(g, "dy", bf, mpt_shape_2(M, K));
    int w2 = mpt_b_input(g, "w2", bf, mpt_shape_2(N, K));
    int v = mpt_b_input(g, "v", bf, s3);
    int dz = mpt_b_binary(g, MPT_OP_MUL, mpt_b_reshape(g, mpt_b_matmul(g, dy, w2, 0, 1), s3),
                          mpt_b_unary(g, MPT_OP_GELU_GRAD, v));
    mpt_graph_add_output(g, "dz", dz);
    run_both(g, 1, tol_for(TOL_EXACT, bf, K), 0, "gelu mlp bf16", FUSED);
    char *text = plan_text(g, "gelu mlp bf16"), *t = text ? text : "";
    CHECK_MSG(strstr(t, "gelu to bf16") && strstr(t, "* gelu_grad bf16"),
              "gelu mlp bf16: both chains in the GEMMs' epilogues:\n%s", t);
    free(text);
    mpt_graph_free(g);
}

int main(void) {
    char why[256];
    if (!mpt_backend_cpu.available(why, sizeof why)) {
        printf("skipped: the CPU JIT is not available here: %s\n", why);
        return 77;
    }
    char err[256];
    mpt_pool *pool = mpt_pool_new(2);
    mpt_cpu_jit *host = mpt_cpu_jit_new(MPT_CPU_ISA_HOST, err, sizeof err);
    CHECK_MSG(host != NULL, "%s", err);
    if (host) {
        TIMED(test_round_steps(host, pool, "host"));
        TIMED(test_store_gelu_grad(host, pool, "host"));
        TIMED(test_finite_step(host, pool, "host"));
        TIMED(test_gelu_exact(host, pool, "host"));
        TIMED(test_gelu_f32_bound(host, pool, "host"));
        if (mpt_cpu_jit_isa(host) == MPT_CPU_ISA_AVX512) {
            mpt_cpu_jit *avx2 = mpt_cpu_jit_new(MPT_CPU_ISA_AVX2, err, sizeof err);
            CHECK_MSG(avx2 != NULL, "%s", err);
            if (avx2) TIMED(test_round_steps(avx2, pool, "avx2"));
            if (avx2) TIMED(test_store_gelu_grad(avx2, pool, "avx2"));
            if (avx2) TIMED(test_finite_step(avx2, pool, "avx2"));
            if (avx2) TIMED(test_gelu_exact(avx2, pool, "avx2"));
            if (avx2) TIMED(test_gelu_f32_bound(avx2, pool, "avx2"));
            mpt_cpu_jit_free(avx2);
        }
        if (mpt_cpu_jit_isa(host) != MPT_CPU_ISA_SSE) {
            /* the GELU tables' gathers, four lanes and no F16C */
            mpt_cpu_jit *sse = mpt_cpu_jit_new(MPT_CPU_ISA_SSE, err, sizeof err);
            CHECK_MSG(sse != NULL, "%s", err);
            if (sse) TIMED(test_gelu_exact(sse, pool, "sse"));
            mpt_cpu_jit_free(sse);
        }
        mpt_cpu_jit_free(host);
    }
    mpt_pool_free(pool);
    TIMED(test_plans());
    TIMED(test_mlp_plan());
    TIMED(test_mlp_plan_bf16());
    return check_exit("test_cpu_epi");
}
