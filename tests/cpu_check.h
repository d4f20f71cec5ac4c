/* tests/cpu_check.h — what the CPU backend's tests share: the per-dtype
 * tolerance table, inputs, and running a graph on the interpreter and on
 * the CPU backend side by side (tests/test_cpu_backend.c,
 * tests/test_cpu_conv.c). */
#ifndef MPT_TESTS_CPU_CHECK_H
#define MPT_TESTS_CPU_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "codegen/cpu/cpu.h"
#include "codegen/cpu/cpu_backend.h"
#include "fusion/fusion.h"
#include "ir/ir.h"
#include "lang/lang.h"

/* ---- the tolerance table: |got - ref| <= atol + rtol * |ref| ---- */

typedef enum {
    TOL_EXACT,  /* elementwise ops, casts, movement, max/all, pooling, argmax */
    TOL_ACCUM,  /* sums, GEMMs and convolutions: f32 accumulation vs the interpreter's double */
    TOL_MMA,    /* attention on Tensor Cores: probabilities rounded to the compute dtype */
    TOL_COUNT
} tol_class;

typedef struct {
    double atol, rtol;
} tol;

static const tol tol_table[TOL_COUNT][3] = {
    /* Elementwise work is bit-exact by construction: +,-,*,/,sqrt in f32 then
     * rounded equal the interpreter's double rounded once (24 >= 2p+2 bits),
     * and transcendentals run in double, then round once (round-to-odd f32
     * for f16/bf16): pow as the interpreter does, exp/log/tanh/erf by vector
     * code within 1-4 double ulps of libm (tests/test_cpu_math.c). Rounded
     * to a float dtype these agree unless the exact value lies within those
     * ulps of a rounding boundary, about 2^-27 of values, and the inputs
     * here hit none: any difference is a bug. */
    [TOL_EXACT] = {{0, 0}, {0, 0}, {0, 0}},
    /* f32: a sum of K terms accumulated in f32 (several vector accumulators,
     * another order) vs once-rounded double: error grows like K * 2^-24 of
     * the terms' magnitude; the atol below is scaled by K (tol_for). */
    /* f16: the f32 sum is within a few f32 ulps, so rounding it to f16 can
     * land one f16 ulp (2^-10 relative) away: 2e-3. */
    /* bf16: one bf16 ulp is 2^-7 relative: 1.6e-2. */
    [TOL_ACCUM] = {{2e-6, 2e-5}, {1e-3, 2e-3}, {1e-2, 1.6e-2}},
    /* f16/bf16 attention on Tensor Cores (codegen/cuda/emit_attn_mma.c),
     * and bf16 attention on AMX tiles (codegen/cpu/attention_amx.c):
     * the kernel rounds the probabilities p (and ds, and an f32 do) to the
     * compute dtype, as operands of the next mma, where the interpreter
     * keeps them exact. Each term of o = sum p v (and of dv, dk, dq) is then off by
     * up to half an ulp of that dtype relative (2^-11 f16, 2^-8 bf16), the
     * sum by that times the sum of the terms' magnitudes, which the
     * softmax's weights (summing to 1, 2 with dropout's factor) keep
     * within a few times the output's largest magnitude: atol is this
     * entry times the output's largest |ref| (tests/test_attention_mma.c),
     * 4 half-ulps of the compute dtype; rtol the output's own rounding as
     * TOL_ACCUM. f32 keeps the SIMT kernel (no entry needed: 0). */
    [TOL_MMA] = {{0, 0}, {2e-3, 2e-3}, {1.6e-2, 1.6e-2}},
};

static tol tol_for(tol_class c, mpt_dtype dt, int64_t k) {
    int i = dt == MPT_DT_F16 ? 1 : dt == MPT_DT_BF16 ? 2 : 0;
    tol t = tol_table[c][i];
    if (c == TOL_ACCUM && i == 0) t.atol *= (double)(k > 1 ? k : 1);
    return t;
}

/* ---- running a graph both ways ---- */

static unsigned rng_state = 12345;
static double urand(void) {
    rng_state = rng_state * 1103515245u + 12345u;
    return (double)((rng_state >> 8) & 0xffffff) / 16777216.0;
}

/* inputs: floats in [-3, 3] (with 0, -0 and, when specials, inf and nan at
 * the front), i32 class ids in [0, 10) */
static void fill_inputs(const mpt_graph *g, mpt_tensor *in, int specials) {
    for (int k = 0; k < mpt_graph_n_inputs(g); k++) {
        const mpt_node *nd = &g->nodes[mpt_graph_input_node(g, k)];
        mpt_tensor_alloc(&in[k], nd->dtype, nd->shape);
        int64_t n = mpt_shape_numel(nd->shape);
        for (int64_t i = 0; i < n; i++) {
            double v = nd->dtype == MPT_DT_I32 ? floor(urand() * 10) : 6 * urand() - 3;
            if (specials && nd->dtype != MPT_DT_I32 && i < 4 && n > 8)
                v = (double[]){0.0, -0.0, INFINITY, NAN}[i];
            mpt_tensor_set(&in[k], i, v);
        }
    }
}

/* run_both calls it after filling the inputs, when set */
static void (*plant)(const mpt_graph *g, mpt_tensor *in);

static int compare(const mpt_tensor *got, const mpt_tensor *ref, tol t, const char *what) {
    int64_t n = mpt_shape_numel(ref->shape), bad = 0, first = -1;
    if (got->dtype != ref->dtype || !mpt_shape_eq(got->shape, ref->shape)) {
        CHECK_MSG(0, "%s: dtype or shape differs", what);
        return 1;
    }
    for (int64_t i = 0; i < n; i++) {
        double a = mpt_tensor_get(got, i), b = mpt_tensor_get(ref, i);
        int ok = (isnan(a) && isnan(b)) || a == b || fabs(a - b) <= t.atol + t.rtol * fabs(b);
        if (!ok && first < 0) first = i;
        bad += !ok;
    }
    CHECK_MSG(bad == 0, "%s: %lld of %lld elements differ; first [%lld] got %.9g want %.9g", what,
              (long long)bad, (long long)n, (long long)first,
              first >= 0 ? mpt_tensor_get(got, first) : 0.0, first >= 0 ? mpt_tensor_get(ref, first) : 0.0);
    return bad != 0;
}

/* Runs g for `steps` steps on the interpreter and on the CPU backend (fused
 * and unfused plans) from the same start, comparing every output and
 * variable after each step with tolerance t. (unused: a test that only
 * compares, with the table, calls nothing else here) */
enum { FUSED = 1, UNFUSED = 2, BOTH = 3 };

__attribute__((unused)) static void run_both(const mpt_graph *g, int steps, tol t, int specials, const char *what, int which) {
    int ni = mpt_graph_n_inputs(g), nv = mpt_graph_n_variables(g), no = g->n_outputs;
    char err[1024], msg[256];
    for (int fused = 0; fused < 2; fused++) {
        if (!(which & (fused ? FUSED : UNFUSED))) continue;
        mpt_fusion_opts fo;
        mpt_fusion_opts_default(&fo);
        fo.enabled = fused;
        mpt_plan *p = mpt_fuse(g, &fo);
        mpt_exec *x = mpt_backend_cpu.compile(p, err, sizeof err);
        CHECK_MSG(x != NULL, "%s: compile: %s", what, err);
        mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in);
        mpt_tensor *vr = calloc((size_t)nv + 1, sizeof *vr), *vc = calloc((size_t)nv + 1, sizeof *vc);
        mpt_tensor *outr = calloc((size_t)no + 1, sizeof *outr), *outc = calloc((size_t)no + 1, sizeof *outc);
        mpt_init_variables(g, vr, 42);
        mpt_init_variables(g, vc, 42);
        unsigned seed0 = rng_state;
        for (int s = 0; x && s < steps; s++) {
            fill_inputs(g, in, specials);
            if (plant) plant(g, in);
            int rc = mpt_interp_run(g, in, vr, outr, NULL, err, sizeof err);
            CHECK_MSG(rc == 0, "%s: interp: %s", what, err);
            rc = mpt_backend_cpu.run(x, in, vc, outc, err, sizeof err);
            CHECK_MSG(rc == 0, "%s: cpu: %s", what, err);
            int bad = 0;
            for (int k = 0; k < no && rc == 0; k++) {
                snprintf(msg, sizeof msg, "%s %s step %d output %s", what, fused ? "fused" : "unfused",
                         s, g->outputs[k].name);
                bad |= compare(&outc[k], &outr[k], t, msg);
            }
            for (int k = 0; k < nv && rc == 0; k++) {
                snprintf(msg, sizeof msg, "%s %s step %d variable %s", what, fused ? "fused" : "unfused",
                         s, g->nodes[mpt_graph_variable_node(g, k)].name);
                bad |= compare(&vc[k], &vr[k], t, msg);
            }
            if (bad && getenv("MPT_TEST_VERBOSE")) mpt_plan_print(p, stderr, 0);
            for (int k = 0; k < no; k++) {
                mpt_tensor_free(&outr[k]);
                if (rc == 0) mpt_tensor_free(&outc[k]);
            }
            for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
        }
        rng_state = seed0;
        for (int k = 0; k < nv; k++) {
            mpt_tensor_free(&vr[k]);
            mpt_tensor_free(&vc[k]);
        }
        free(in);
        free(vr);
        free(vc);
        free(outr);
        free(outc);
        if (x) mpt_backend_cpu.free(x);
        mpt_plan_free(p);
    }
}

/* The CPU plan's report (`mptc asm`'s): what each kernel's core runs. */
static inline char *plan_text(mpt_graph *g, const char *what) {
    char *text = NULL, err[256];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    mpt_fusion_opts fo;
    mpt_fusion_opts_default(&fo);
    mpt_plan *p = mpt_fuse(g, &fo);
    int rc = mpt_cpu_emit_plan(p, "asm", "build/tests/cpu_plan", f, err, sizeof err);
    fclose(f);
    CHECK_MSG(rc == 0, "%s: emit: %s", what, err);
    mpt_plan_free(p);
    return text;
}

static const mpt_dtype float_dts[3] = {MPT_DT_F32, MPT_DT_F16, MPT_DT_BF16};
static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#define TIMED(call)                                                                    \
    do {                                                                               \
        double t0_ = now();                                                            \
        call;                                                                          \
        printf("%-60s %6.2f s\n", #call, now() - t0_);                                 \
    } while (0)

#endif
