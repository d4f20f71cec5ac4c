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
 * small (T x head_dim) and many, and a batch of them is one pool run.
 *
 * B is brought to one contiguous f32 layout [K, N] per batch (widened
 * from f16/bf16, transposed where trans_b says), so that vectors run
 * along N; A is read in place where it is f32 (along its rows, or along
 * its columns when transposed) and widened into a block of the same
 * orientation otherwise. Register tiles of C (AVX-512, AVX2) do the
 * products, a vectorized loop the edges (see below). gpt_tiny's unfused
 * attention at context 512, one core: 34-41 -> 75-109 GFLOP/s on the
 * untransposed products, 14 -> 37-60 on the transposed ones.
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

/* dst [r1 - r0, C] (f32) = rows [r0, r1) of the matrix src holds: src is
 * that [R, C] matrix row-major, or with trans its transpose [C, R] (R =
 * ld then). Transposed copies go in 32 x 32 blocks so that both sides
 * stay in cache. */
static void pack_rows(mpt_dtype dt, const void *src, int trans, int64_t ld, int64_t r0,
                      int64_t r1, int64_t C, float *dst) {
    if (!trans) {
        for (int64_t r = r0; r < r1; r++)
            for (int64_t c = 0; c < C; c++) dst[(r - r0) * C + c] = mpt_cpu_f32_at(dt, src, r * C + c);
        return;
    }
    enum { T = 16 }; /* 2 KiB-apart rows of 32 share two sets of L1; 16 fit */
    for (int64_t c0 = 0; c0 < C; c0 += T)
        for (int64_t rb = r0; rb < r1; rb += T) {
            int64_t c1 = c0 + T < C ? c0 + T : C, re = rb + T < r1 ? rb + T : r1;
            for (int64_t c = c0; c < c1; c++)
                for (int64_t r = rb; r < re; r++) dst[(r - r0) * C + c] = mpt_cpu_f32_at(dt, src, c * ld + r);
        }
}

/* c [rows, n] = a [rows, K] . b [K, n], f32, rows of b ldb apart and of
 * c ldc apart: four rows of C per pass over a row of B, so each load of b
 * feeds four multiply-adds. What the register tiles below leave: ragged
 * columns and rows, and every shape on a CPU without AVX2. Every element
 * is the same sum in the same order as in the tiles: 0, then + a_p b_p for
 * p = 0, 1, ..., K - 1. The binary targets baseline x86-64, so this loop
 * is also compiled for x86-64-v3 and v4 and the dynamic linker picks one
 * (GCC target clones, as in emit_opaque.c). */
#define HOST_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

HOST_CLONES
static void strip_kernel(int64_t rows, int64_t n, int64_t K, const float *restrict a, int64_t rs,
                         int64_t ks, const float *restrict b, int64_t ldb, float *restrict c,
                         int64_t ldc) {
    for (int64_t j0 = 0; j0 < n; j0 += NB) {
        int64_t nb = j0 + NB < n ? NB : n - j0;
        int64_t i = 0;
        for (; i + 4 <= rows; i += 4) {
            float *restrict c0 = c + i * ldc + j0, *restrict c1 = c0 + ldc, *restrict c2 = c1 + ldc,
                            *restrict c3 = c2 + ldc;
            memset(c0, 0, (size_t)nb * sizeof *c);
            memset(c1, 0, (size_t)nb * sizeof *c);
            memset(c2, 0, (size_t)nb * sizeof *c);
            memset(c3, 0, (size_t)nb * sizeof *c);
            for (int64_t p = 0; p < K; p++) {
                float a0 = a[i * rs + p * ks], a1 = a[(i + 1) * rs + p * ks],
                      a2 = a[(i + 2) * rs + p * ks], a3 = a[(i + 3) * rs + p * ks];
                const float *restrict br = b + p * ldb + j0;
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
            float *restrict c0 = c + i * ldc + j0;
            memset(c0, 0, (size_t)nb * sizeof *c);
            for (int64_t p = 0; p < K; p++) {
                float a0 = a[i * rs + p * ks];
                const float *restrict br = b + p * ldb + j0;
                for (int64_t j = 0; j < nb; j++) c0[j] += a0 * br[j];
            }
        }
    }
}

/* Register tiles. The loop above keeps C in L1 and loads and stores it
 * for every multiply-add (about 40 GFLOP/s a core here); a tile of R rows
 * by V vectors of C stays in registers over the whole sum over k, each
 * load of a row of b feeding R rows. Two builds of the same source: one
 * for AVX-512 (16 lanes, 32 registers: 4 rows x 4 vectors, 64 columns),
 * one for AVX2 (8 lanes, 16 registers: 4 rows x 3 vectors, 24 columns);
 * columns left over go 8 rows x 1 vector at a time, then to the loop
 * above. Vector types as values stay in registers where float arrays
 * indexed in a loop did not (GCC 12), and macros instead of functions
 * keep vector arguments out of the ABI (-Wpsabi). */
typedef float vf16 __attribute__((vector_size(64)));
typedef float vf8 __attribute__((vector_size(32)));

#define BMM_TILE(NAME, VT, L, R, V, TARGET)                                                \
    static inline __attribute__((always_inline, target(TARGET))) void NAME(                \
        int64_t K, const float *restrict a, int64_t rs, int64_t ks, const float *restrict b, \
        int64_t ldb,                                                                       \
        float *restrict c, int64_t ldc) {                                                  \
        VT acc[R][V];                                                                      \
        for (int r = 0; r < R; r++)                                                        \
            for (int v = 0; v < V; v++) acc[r][v] = (VT){0};                               \
        for (int64_t p = 0; p < K; p++) {                                                  \
            VT bv[V];                                                                      \
            for (int v = 0; v < V; v++) memcpy(&bv[v], b + p * ldb + L * v, sizeof(VT));   \
            for (int r = 0; r < R; r++) {                                                  \
                const float x = a[r * rs + p * ks];                                        \
                for (int v = 0; v < V; v++) acc[r][v] += x * bv[v];                        \
            }                                                                              \
        }                                                                                  \
        for (int r = 0; r < R; r++)                                                        \
            for (int v = 0; v < V; v++) memcpy(c + r * ldc + L * v, &acc[r][v], sizeof(VT)); \
    }

/* rows x n of c by WIDE tiles (R rows x WV vectors), then 8 x 1 vector
 * tiles, then strip_kernel */
#define BMM_KERNEL(NAME, VT, L, WV, TARGET)                                               \
    BMM_TILE(NAME##_wide, VT, L, 4, WV, TARGET)                                            \
    BMM_TILE(NAME##_narrow, VT, L, 8, 1, TARGET)                                           \
    __attribute__((target(TARGET))) static void NAME(int64_t rows, int64_t N, int64_t K,  \
                                                     const float *restrict a, int64_t rs,  \
                                                     int64_t ks,                           \
                                                     const float *restrict b,              \
                                                     float *restrict c) {                  \
        int64_t j = 0;                                                                     \
        for (; j + WV * L <= N; j += WV * L) {                                             \
            int64_t i = 0;                                                                 \
            for (; i + 4 <= rows; i += 4) NAME##_wide(K, a + i * rs, rs, ks, b + j, N, c + i * N + j, N); \
            if (i < rows) strip_kernel(rows - i, WV * L, K, a + i * rs, rs, ks, b + j, N, c + i * N + j, N); \
        }                                                                                  \
        for (; j + L <= N; j += L) {                                                       \
            int64_t i = 0;                                                                 \
            for (; i + 8 <= rows; i += 8) NAME##_narrow(K, a + i * rs, rs, ks, b + j, N, c + i * N + j, N); \
            if (i < rows) strip_kernel(rows - i, L, K, a + i * rs, rs, ks, b + j, N, c + i * N + j, N); \
        }                                                                                  \
        if (j < N) strip_kernel(rows, N - j, K, a, rs, ks, b + j, N, c + j, N);                    \
    }

BMM_KERNEL(tiles_avx512, vf16, 16, 4, "arch=x86-64-v4")
BMM_KERNEL(tiles_avx2, vf8, 8, 3, "arch=x86-64-v3")

/* c [rows, N] = a [rows, K] . b [K, N], all f32, contiguous */
static void rows_kernel(int64_t rows, int64_t N, int64_t K, const float *restrict a, int64_t rs,
                        int64_t ks, const float *restrict b, float *restrict c) {
    /* 2: AVX-512, 1: AVX2, 0: neither; MPTC_CPU_ISA (avx2, sse) lowers it
     * as it lowers the JIT's target, so that an AVX2-only host can be
     * measured here (a race writes the same value) */
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") ? 2
              : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")       ? 1
                                                                                       : 0;
    }
    const char *env = getenv("MPTC_CPU_ISA");
    int want = !env ? 2 : !strcmp(env, "avx2") ? 1 : !strcmp(env, "sse") ? 0 : 2;
    int isa = has < want ? has : want;
    if (isa == 2) tiles_avx512(rows, N, K, a, rs, ks, b, c);
    else if (isa == 1) tiles_avx2(rows, N, K, a, rs, ks, b, c);
    else strip_kernel(rows, N, K, a, rs, ks, b, N, c, N);
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
    /* element (r, p) of the block is a[r rs + p ks]: A's rows in place or
     * widened; a transposed A (stored [K, M]) read along its rows, where
     * the block's rows are contiguous, in place or widened the same way
     * (transposing it into [rows, K] wrote 2 KiB apart and cost more than
     * the products) */
    int64_t rows = i1 - i0, rs = K, ks = 1;
    if (jb->ta) {
        rs = 1;
        ks = M;
        if (jb->a_dt == MPT_DT_F32) a = (const float *)a_batch + i0;
        else {
            for (int64_t p = 0; p < K; p++)
                for (int64_t r = 0; r < rows; r++) abuf[p * rows + r] = mpt_cpu_f32_at(jb->a_dt, a_batch, p * M + i0 + r);
            ks = rows;
        }
    } else if (jb->a_dt == MPT_DT_F32) a = (const float *)a_batch + i0 * K;
    else pack_rows(jb->a_dt, a_batch, 0, M, i0, i1, K, abuf);
    const float *b = jb->bp ? jb->bp + q * K * N : (const float *)jb->b + q * K * N;
    int64_t at = (q * M + i0) * N;
    float *c = jb->out_dt == MPT_DT_F32 ? (float *)jb->out + at : cbuf;
    rows_kernel(rows, N, K, a, rs, ks, b, c);
    if (c == cbuf) mpt_cpu_store_at(jb->out_dt, jb->out, at, cbuf, rows * N);
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
