/* codegen/cpu/batch_matmul.c — batch_matmul (attention's Q K^T and P V) as
 * a C kernel on the pool, run from mpt_cpu_run_opaque.
 *
 * out [..., M, N] = op(a) op(b) per batch index, op transposing the last
 * two dims where trans_a / trans_b say. Fusion keeps the op alone in an
 * OPAQUE kernel, so it reads its operands from memory and writes the
 * node's dtype. Every output element is one f32 sum over k in increasing
 * order, rounded once to the node's dtype, as the op table says of
 * matmul; the order does not depend on how the work is split, so a run
 * is deterministic. The JIT GEMM is not used: attention's matrices are
 * small (T x head_dim) and many, and this kernel only has to be correct
 * and reasonably fast.
 *
 * Both operands are first brought to one contiguous f32 layout, a [rows, K]
 * block of A per task and B [K, N] per batch, widened from f16/bf16 and
 * transposed where the flags say, so the inner loop always runs along N
 * over contiguous floats and vectorizes.
 */
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/emit.h"

/* rows of A per task: a [MB, K] block of A and the [MB, N] of C it makes
 * stay in L2 for attention's sizes, and a batch of a few hundred rows
 * still splits between threads */
enum { MB = 32, NB = 512 };

typedef struct {
    int64_t batches, M, N, K, row_blocks;
    int ta, tb;
    mpt_dtype a_dt, b_dt, out_dt;
    const void *a, *b;
    void *out;
    float *bp;          /* B of every batch as f32 [K, N] (NULL: b itself is) */
    float **scratch;    /* per thread: MB x K of A, then MB x N of C */
} bmm_job;

/* element i of p widened exactly; bf16 inline (its bits are f32's top
 * half), so that the packing loops vectorize */
static inline float f32_at(mpt_dtype dt, const void *p, int64_t i) {
    if (dt == MPT_DT_F32) return ((const float *)p)[i];
    if (dt == MPT_DT_BF16) {
        uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    return mpt_f16_to_f32(((const uint16_t *)p)[i]);
}

/* dst [r1 - r0, C] (f32) = rows [r0, r1) of the matrix src holds: src is
 * that [R, C] matrix row-major, or with trans its transpose [C, R] (R =
 * ld then). Transposed copies go in 32 x 32 blocks so that both sides
 * stay in cache. */
static void pack_rows(mpt_dtype dt, const void *src, int trans, int64_t ld, int64_t r0,
                      int64_t r1, int64_t C, float *dst) {
    if (!trans) {
        for (int64_t r = r0; r < r1; r++)
            for (int64_t c = 0; c < C; c++) dst[(r - r0) * C + c] = f32_at(dt, src, r * C + c);
        return;
    }
    enum { T = 32 };
    for (int64_t c0 = 0; c0 < C; c0 += T)
        for (int64_t rb = r0; rb < r1; rb += T) {
            int64_t c1 = c0 + T < C ? c0 + T : C, re = rb + T < r1 ? rb + T : r1;
            for (int64_t c = c0; c < c1; c++)
                for (int64_t r = rb; r < re; r++) dst[(r - r0) * C + c] = f32_at(dt, src, c * ld + r);
        }
}

/* The hot loop is plain C; the binary targets baseline x86-64, so it is
 * also compiled for x86-64-v3 (AVX2) and v4 (AVX-512) and the dynamic
 * linker picks one (GCC target clones, as in emit_opaque.c). */
#define HOST_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

/* c [rows, N] = a [rows, K] . b [K, N], all f32, contiguous. Four rows of
 * C per pass over a row of B, so each load of b feeds four multiply-adds;
 * columns in blocks of NB keep those four rows of C in L1. */
HOST_CLONES
static void rows_kernel(int64_t rows, int64_t N, int64_t K, const float *restrict a,
                        const float *restrict b, float *restrict c) {
    for (int64_t j0 = 0; j0 < N; j0 += NB) {
        int64_t nb = j0 + NB < N ? NB : N - j0;
        int64_t i = 0;
        for (; i + 4 <= rows; i += 4) {
            float *restrict c0 = c + i * N + j0, *restrict c1 = c0 + N, *restrict c2 = c1 + N,
                            *restrict c3 = c2 + N;
            memset(c0, 0, (size_t)nb * sizeof *c);
            memset(c1, 0, (size_t)nb * sizeof *c);
            memset(c2, 0, (size_t)nb * sizeof *c);
            memset(c3, 0, (size_t)nb * sizeof *c);
            for (int64_t p = 0; p < K; p++) {
                float a0 = a[i * K + p], a1 = a[(i + 1) * K + p], a2 = a[(i + 2) * K + p],
                      a3 = a[(i + 3) * K + p];
                const float *restrict br = b + p * N + j0;
                for (int64_t j = 0; j < nb; j++) {
                    float bj = br[j];
                    c0[j] += a0 * bj;
                    c1[j] += a1 * bj;
                    c2[j] += a2 * bj;
                    c3[j] += a3 * bj;
                }
            }
        }
        for (; i < rows; i++) {
            float *restrict c0 = c + i * N + j0;
            memset(c0, 0, (size_t)nb * sizeof *c);
            for (int64_t p = 0; p < K; p++) {
                float a0 = a[i * K + p];
                const float *restrict br = b + p * N + j0;
                for (int64_t j = 0; j < nb; j++) c0[j] += a0 * br[j];
            }
        }
    }
}

/* n f32 sums rounded once to dt */
static void store_row(mpt_dtype dt, void *out, int64_t at, const float *v, int64_t n) {
    if (dt == MPT_DT_F32) memcpy((float *)out + at, v, (size_t)n * sizeof *v);
    else if (dt == MPT_DT_BF16)
        for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[at + i] = mpt_cpu_bf16_of(v[i]);
    else
        for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[at + i] = mpt_f32_to_f16(v[i]);
}

/* task: batch q's B widened and/or transposed to [K, N] */
static void pack_b_task(void *ctx, int task, int thread) {
    (void)thread;
    const bmm_job *jb = ctx;
    int64_t K = jb->K, N = jb->N, es = jb->b_dt == MPT_DT_F32 ? 4 : 2;
    const char *src = (const char *)jb->b + (size_t)(task * K * N * es);
    pack_rows(jb->b_dt, src, jb->tb, K, 0, K, N, jb->bp + task * K * N);
}

/* task: rows [i0, i1) of batch q */
static void rows_task(void *ctx, int task, int thread) {
    const bmm_job *jb = ctx;
    int64_t M = jb->M, N = jb->N, K = jb->K;
    int64_t q = task / jb->row_blocks, i0 = task % jb->row_blocks * MB;
    int64_t i1 = i0 + MB < M ? i0 + MB : M;
    float *abuf = jb->scratch[thread], *cbuf = abuf + MB * K;
    const float *a = abuf;
    size_t a_es = jb->a_dt == MPT_DT_F32 ? 4 : 2;
    const char *a_batch = (const char *)jb->a + (size_t)(q * M * K) * a_es;
    if (jb->a_dt == MPT_DT_F32 && !jb->ta) a = (const float *)a_batch + i0 * K;
    else pack_rows(jb->a_dt, a_batch, jb->ta, M, i0, i1, K, abuf);
    const float *b = jb->bp ? jb->bp + q * K * N : (const float *)jb->b + q * K * N;
    int64_t at = (q * M + i0) * N;
    float *c = jb->out_dt == MPT_DT_F32 ? (float *)jb->out + at : cbuf;
    rows_kernel(i1 - i0, N, K, a, b, c);
    if (c == cbuf) store_row(jb->out_dt, jb->out, at, cbuf, (i1 - i0) * N);
}

static int is_float_dt(mpt_dtype dt) {
    return dt == MPT_DT_F32 || dt == MPT_DT_F16 || dt == MPT_DT_BF16;
}

int mpt_cpu_run_batch_matmul(const mpt_node *nd, const mpt_node *na, const mpt_node *nb,
                             const void *a, const void *b, void *out, mpt_pool *pool, char *err,
                             size_t n) {
    int r = nd->shape.rank;
    bmm_job jb = {.M = nd->shape.dim[r - 2], .N = nd->shape.dim[r - 1],
                  .K = nd->attr.i[0] ? na->shape.dim[r - 2] : na->shape.dim[r - 1],
                  .ta = (int)nd->attr.i[0], .tb = (int)nd->attr.i[1],
                  .a_dt = na->dtype, .b_dt = nb->dtype, .out_dt = nd->dtype,
                  .a = a, .b = b, .out = out, .batches = 1};
    if (!is_float_dt(jb.a_dt) || !is_float_dt(jb.b_dt) || !is_float_dt(jb.out_dt)) {
        snprintf(err, n, "batch_matmul: operands and result must be f32, f16 or bf16");
        return -1;
    }
    for (int d = 0; d < r - 2; d++) jb.batches *= nd->shape.dim[d];
    jb.row_blocks = (jb.M + MB - 1) / MB;
    int64_t tasks = jb.batches * jb.row_blocks;
    if (tasks == 0 || jb.N == 0) return 0;
    if (tasks > INT32_MAX || jb.batches > INT32_MAX) {
        snprintf(err, n, "batch_matmul: %lld batches of %lld rows are too many tasks",
                 (long long)jb.batches, (long long)jb.M);
        return -1;
    }
    int threads = mpt_pool_threads(pool), rc = -1;
    size_t per = (size_t)(MB * (jb.K + jb.N));
    jb.scratch = calloc((size_t)threads, sizeof *jb.scratch);
    if (jb.scratch)
        for (int t = 0; t < threads; t++)
            if (!(jb.scratch[t] = malloc((per ? per : 1) * sizeof(float)))) goto done;
    if (!jb.scratch) goto done;
    if (jb.b_dt != MPT_DT_F32 || jb.tb) {
        size_t bn = (size_t)(jb.batches * jb.K * jb.N);
        if (!(jb.bp = malloc((bn ? bn : 1) * sizeof(float)))) goto done;
        mpt_pool_run(pool, (int)jb.batches, pack_b_task, &jb);
    }
    mpt_pool_run(pool, (int)tasks, rows_task, &jb);
    rc = 0;
done:
    if (rc) snprintf(err, n, "batch_matmul: out of memory for its f32 operands");
    if (jb.scratch)
        for (int t = 0; t < threads; t++) free(jb.scratch[t]);
    free(jb.scratch);
    free(jb.bp);
    return rc;
}
