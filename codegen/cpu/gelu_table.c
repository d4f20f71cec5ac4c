/* codegen/cpu/gelu_table.c — GELU and its derivative of every f16 and bf16
 * value, as the interpreter computes and rounds them, for the GEMM
 * epilogue's low-precision GELU steps (gemm_epi.c gelu_exact).
 *
 * A GELU whose result is an f16/bf16 node must equal the interpreter's
 * double value rounded once to that dtype. Its input is a value of the
 * same dtype: 2^16 bit patterns, so the exact results fit a table of
 * 2^16 f32 bit patterns (256 KiB; a layer's inputs touch a few KiB of it).
 * Each table is filled once a process, on the first kernel generated with
 * its step, with ir/interp_ops.c's own formulas (Keras' exact GELU: libm's
 * erf in double) and ir's rounding; the JIT resolves the kernels' symbol
 * to it (jit.c). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "codegen/cpu/cpu_internal.h"

enum { ENTRIES = 1 << 16 };

static uint32_t tables[4][ENTRIES] __attribute__((aligned(64)));
static pthread_once_t once[4] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT,
                                 PTHREAD_ONCE_INIT};

static const char *const names[4] = {"mpt_cpu_gelu_bf16", "mpt_cpu_gelu_grad_bf16",
                                     "mpt_cpu_gelu_f16", "mpt_cpu_gelu_grad_f16"};

static int which(mpt_dtype dt, int grad) { return (dt == MPT_DT_F16 ? 2 : 0) + (grad != 0); }

/* ir/interp_ops.c's MPT_OP_GELU and MPT_OP_GELU_GRAD */
static double normal_cdf(double x) { return 0.5 * (1.0 + erf(x * M_SQRT1_2)); }
static double gelu(double x) { return x * normal_cdf(x); }
static double gelu_grad(double x) {
    return normal_cdf(x) + x * exp(-0.5 * x * x) * (0.5 * M_2_SQRTPI * M_SQRT1_2);
}

static void fill(int w) {
    mpt_dtype dt = w >= 2 ? MPT_DT_F16 : MPT_DT_BF16;
    for (uint32_t b = 0; b < ENTRIES; b++) {
        double x = dt == MPT_DT_F16 ? mpt_f16_to_f32((uint16_t)b) : mpt_bf16_to_f32((uint16_t)b);
        float y = (float)mpt_round_to(dt, w & 1 ? gelu_grad(x) : gelu(x));
        memcpy(&tables[w][b], &y, 4);
    }
}

static void fill0(void) { fill(0); }
static void fill1(void) { fill(1); }
static void fill2(void) { fill(2); }
static void fill3(void) { fill(3); }

const char *mpt_cpu_gelu_table_name(mpt_dtype dt, int grad) { return names[which(dt, grad)]; }

void mpt_cpu_gelu_table_fill(mpt_dtype dt, int grad) {
    static void (*const fills[4])(void) = {fill0, fill1, fill2, fill3};
    int w = which(dt, grad);
    pthread_once(&once[w], fills[w]);
}

int mpt_cpu_gelu_tables(const char **name, const void **addr) {
    for (int w = 0; w < 4; w++) {
        name[w] = names[w];
        addr[w] = tables[w];
    }
    return 4;
}
