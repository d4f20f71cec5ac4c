/* codegen/cpu/cpu.h — the CPU backend's public surface (GEMM part).
 *
 * The CPU backend generates machine code for the host through the LLVM C API
 * (ORC LLJIT). This header covers:
 *   - the JIT (mpt_cpu_jit): one per process or per plan, compiled for the
 *     host CPU's own name and features (or a forced, smaller ISA for tests);
 *   - the thread pool (mpt_pool): persistent workers, created once;
 *   - the GEMM generator (mpt_cpu_gemm): packed, cache- and register-blocked
 *     C = A x B with a fused epilogue applied in registers before the store.
 *
 * Shapes are runtime arguments: one compiled kernel serves every M, N, K for a
 * given (input dtypes, trans_a, trans_b, epilogue, output dtype, beta). The
 * micro-kernel's register tile is fixed at compile time, so the hot loop is
 * fully unrolled over the tile either way; compile-time shapes would only
 * remove the edge checks, which run once per tile, not per k.
 */
#ifndef MPT_CODEGEN_CPU_H
#define MPT_CODEGEN_CPU_H
#include <stddef.h>
#include <stdint.h>

#include "ir/ir.h"

/* ---- host ---- */

/* Instruction set level the generated code targets. */
typedef enum {
    MPT_CPU_ISA_HOST,   /* whatever the host has (the default) */
    MPT_CPU_ISA_SSE,    /* x86-64 baseline: 4-wide, no FMA, no F16C */
    MPT_CPU_ISA_AVX2,   /* Haswell: 8-wide, FMA, F16C */
    MPT_CPU_ISA_AVX512, /* 16-wide; bf16 dot products if the host has AVX512_BF16;
                           never AMX (HOST uses AMX where it can) */
} mpt_cpu_isa;

const char *mpt_cpu_isa_name(mpt_cpu_isa isa); /* "host", "sse", "avx2", "avx512" */

/* Writes "CPU-NAME: avx2 fma f16c avx512f avx512_bf16 ..." (the key features
 * present, and whether AMX is usable, with the reason when not) into buf.
 * Returns buf. */
char *mpt_cpu_host_features(char *buf, size_t n);

/* ---- JIT ---- */

typedef struct mpt_cpu_jit mpt_cpu_jit;

/* A JIT for the host (isa MPT_CPU_ISA_HOST) or for a smaller ISA, which the
 * host must be able to run. NULL with a message in err on failure. */
mpt_cpu_jit *mpt_cpu_jit_new(mpt_cpu_isa isa, char *err, size_t n);
void mpt_cpu_jit_free(mpt_cpu_jit *j);
/* The ISA the JIT actually targets (HOST resolved to SSE, AVX2 or AVX512). */
mpt_cpu_isa mpt_cpu_jit_isa(const mpt_cpu_jit *j);
/* 1 when generated code may use vdpbf16ps. */
int mpt_cpu_jit_has_bf16_dot(const mpt_cpu_jit *j);
/* 1 when bf16 x bf16 GEMMs run on AMX tiles (host ISA only: the host has
 * AMX-BF16, Linux granted the tile state, MPT_CPU_NO_AMX is unset). */
int mpt_cpu_jit_has_amx(const mpt_cpu_jit *j);
/* Seconds spent in LLVM optimisation + machine code generation so far. */
double mpt_cpu_jit_compile_seconds(const mpt_cpu_jit *j);

/* ---- thread pool ---- */

typedef struct mpt_pool mpt_pool;

/* n_threads <= 0 means one per online core. The calling thread is worker 0,
 * so n_threads - 1 threads are created. */
mpt_pool *mpt_pool_new(int n_threads);
/* Sets the calling thread's MXCSR to flush f32/f64 denormals to zero (flush:
 * results and inputs, as TensorFlow's and XLA's CPU kernels do) or to keep
 * them, and returns the previous control word for mpt_cpu_denormals_end.
 * The pool's workers take the caller's control word with each job. */
unsigned mpt_cpu_denormals_begin(int flush);
void mpt_cpu_denormals_end(unsigned old);
void mpt_pool_free(mpt_pool *p);
int mpt_pool_threads(const mpt_pool *p);
/* Runs fn(ctx, task, thread) for task in [0, n_tasks) on the pool's threads
 * and returns when all are done. thread is in [0, mpt_pool_threads). Not
 * reentrant: one mpt_pool_run at a time per pool. p may be NULL (runs inline). */
void mpt_pool_run(mpt_pool *p, int n_tasks, void (*fn)(void *ctx, int task, int thread),
                  void *ctx);

/* ---- ceilings (ceiling.c) ---- */

/* What the host reaches at most on the pool's threads, measured once per
 * process by microbenchmarks: f32 and bf16 GFLOP/s (the bf16 figure is the
 * f32 one where bf16 runs on f32 FMAs) and copy bandwidth in GB/s (bytes
 * read plus written); *_how names the loop that measured each. */
typedef struct {
    double f32_gflops, bf16_gflops, gbps;
    const char *f32_how, *bf16_how, *mem_how;
    int threads;
} mpt_cpu_ceilings;

const mpt_cpu_ceilings *mpt_cpu_ceilings_measure(mpt_cpu_jit *jit, mpt_pool *pool);
/* The f32 FMA loop's rate on pool's threads now, not cached: run on one
 * thread and on every core, it tells a quiet machine (about cores times
 * one thread's rate) from a busy one. 0 without FMA. */
double mpt_cpu_fma_rate(mpt_cpu_jit *jit, mpt_pool *pool);
/* Whether bf16 x bf16 products should use vdpbf16ps rather than f32 FMAs
 * on widened operands (AMX aside): the host has AVX512_BF16 and its
 * vdpbf16ps loop reaches at least 1.25x the FMA loop's GFLOP/s on one
 * thread, measured once per process; *ratio (if not NULL) gets that
 * ratio, -1 when MPT_CPU_BF16_DOT=0/1 forces the answer (read at each
 * call). */
int mpt_cpu_bf16_dot_pays(const mpt_cpu_jit *jit, double *ratio);

/* ---- GEMM ---- */

/* Epilogue steps, applied in order to each f32 accumulator in registers. */
typedef enum {
    MPT_CPU_EPI_BIAS,      /* x += bias[col];          operand [N] */
    MPT_CPU_EPI_RESIDUAL,  /* x += res[row*ld + col];  operand [M,N] */
    MPT_CPU_EPI_SCALE,     /* x *= scalar */
    MPT_CPU_EPI_RELU,      /* x = max(x, 0) */
    MPT_CPU_EPI_SIGMOID,
    MPT_CPU_EPI_TANH,
    MPT_CPU_EPI_GELU,      /* exact: x * Phi(x), Phi through erfc */
    MPT_CPU_EPI_RELU_MASK, /* x = aux[row*ld + col] > 0 ? x : 0;  operand [M,N] */
    MPT_CPU_EPI_ROUND,     /* x = (float)(dt)x: a low-precision node's value */
    MPT_CPU_EPI_GELU_GRAD, /* x *= gelu'(aux[row*ld + col]);  operand [M,N] */
    MPT_CPU_EPI_STORE,     /* out[row*ld + col] = (dt)x, x unchanged: a value
                            * the chain passes through that is needed later */
    MPT_CPU_EPI_FINITE,    /* flag[col] = 0 where x is NaN or infinite, x
                            * unchanged; operand bytes [N], set to 1 by the
                            * run: a column reduce_all(is_finite) of the
                            * value C stores (the loss scale's check of a
                            * weight gradient). The last step; a f16/bf16 C
                            * needs a ROUND to its dtype just before */
} mpt_cpu_epi_op;

#define MPT_CPU_EPI_MAX 8

typedef struct {
    mpt_cpu_epi_op op;
    /* operand dtype (f32, f16, bf16) for BIAS, RESIDUAL, RELU_MASK,
     * GELU_GRAD, STORE; for ROUND the dtype rounded to (f16, bf16) */
    mpt_dtype dt;
    /* f16 or bf16: BIAS's and RESIDUAL's operand is rounded to it once
     * loaded (an f32 tensor cast inside the kernel); GELU's result and
     * GELU_GRAD's gelu' are rounded to it exactly, as the interpreter
     * rounds its f64 value (a low-precision chain); f32: none */
    mpt_dtype odt;
} mpt_cpu_epi_step;

/* What one compiled GEMM kernel computes:
 *   C[M,N] (+)= epilogue(A[M,K] x B[K,N])
 * A is stored [M,K] row-major, or [K,M] when trans_a; B is stored [K,N], or
 * [N,K] when trans_b (the IR's MATMUL). Accumulation is always f32. */
typedef struct {
    mpt_dtype a_dt, b_dt, c_dt; /* each f32, f16 or bf16 */
    int trans_a, trans_b;
    /* beta = 1: C = epilogue(C + A x B) instead of epilogue(A x B). f32 C only;
     * meant for gradient accumulation. */
    int accumulate;
    int n_steps;
    mpt_cpu_epi_step steps[MPT_CPU_EPI_MAX];
    /* A is gathered (mpt_cpu_gemm_run_gather): element (i, k) at byte
     * base + row[i] + col[k]; trans_a is ignored. The product is then
     * computed in f32 FMAs whatever the dtypes (f16/bf16 widen exactly),
     * unless a_pairs. */
    int a_gather;
    /* a_gather, bf16 A and B: element (i, 2k + 1) is always the bf16 right
     * after (i, 2k) (col[2k + 1] = col[2k] + 2; K even), so where
     * vdpbf16ps pays (mpt_cpu_bf16_dot_pays) the tile reads each pair as
     * one 32-bit broadcast and multiplies on it, B packed in pairs */
    int a_pairs;
    /* a_gather, AVX-512: the bytes between consecutive rows where they are
     * evenly spaced (a convolution's output positions along an image row),
     * or 0. A register tile whose rows all are (checked tile by tile at
     * run time) reads them from one pointer at constant displacements
     * instead of a pointer a row. */
    int64_t a_row_step;
    /* the N the kernel will mostly run with, where known (0: not known):
     * with a_row_step, 64 or more takes a register tile 64 columns wide */
    int64_t n_hint;
    /* AMX only: A is read through the same tables a tile at a time
     * (mpt_cpu_gemm_run_gather with tile_stride): the 16 rows of a tile
     * at row[i0] + col[k0] + r * tile_stride for r < 16, each 32
     * consecutive k. row[] is read at multiples of 16 (up to M rounded up
     * to 32), col[] at multiples of 32; K and kc are multiples of 32. */
    int a_tiles;
    /* C's row i is stored at byte C + c_row[i]
     * (mpt_cpu_epilogue_args.c_row; ldc is then unused), in the final
     * stores only: partial sums between k blocks keep their own rows. A
     * convolution whose tiles take its output positions in another order
     * than NHWC's writes them in place through it, and so does a strided
     * data gradient's gathered GEMM, a stride phase's rows. */
    int c_rows;
    /* keep the optimised LLVM IR and host assembly for mpt_cpu_gemm_text */
    int keep_text;
    /* runs with MXCSR flushing denormals (mpt_cpu_denormals_begin): a bf16
     * C may then be rounded by an instruction that flushes them itself */
    int flush_denormals;
    /* cache blocks in elements, 0 for the ISA's default (benchmark tuning);
     * rounded to the register tile */
    int kc, mc, nc;
} mpt_cpu_gemm_desc;

/* Runtime operands of the epilogue, indexed like desc->steps. */
typedef struct {
    const void *ptr; /* BIAS, RESIDUAL, RELU_MASK, GELU_GRAD operand; STORE's output */
    int64_t ld;      /* RESIDUAL, RELU_MASK, GELU_GRAD, STORE row stride in elements (0: N) */
    float scalar;    /* SCALE factor */
} mpt_cpu_epi_arg;

typedef struct {
    mpt_cpu_epi_arg step[MPT_CPU_EPI_MAX];
    const int64_t *c_row; /* desc.c_rows: [M] byte offsets of C's rows */
} mpt_cpu_epilogue_args;

typedef struct mpt_cpu_gemm mpt_cpu_gemm;

/* Generates, optimises and JIT-compiles one GEMM kernel. NULL with a message
 * in err when the description is not supported (with a hint) or LLVM fails. */
mpt_cpu_gemm *mpt_cpu_gemm_compile(mpt_cpu_jit *j, const mpt_cpu_gemm_desc *desc, char *err,
                                   size_t n);
void mpt_cpu_gemm_free(mpt_cpu_gemm *g);

/* C[M,N] = ... as described above. lda/ldb/ldc are row strides in elements of
 * the stored layouts; 0 means dense (K or M for A, N or K for B, N for C).
 * Residual and aux operands may alias C. Returns 0, or -1 with err filled when
 * a buffer could not be allocated. Not reentrant on the same g. pool may be NULL. */
int mpt_cpu_gemm_run(mpt_cpu_gemm *g, mpt_pool *pool, int64_t M, int64_t N, int64_t K,
                     const void *A, int64_t lda, const void *B, int64_t ldb, void *C,
                     int64_t ldc, const mpt_cpu_epilogue_args *epi, char *err, size_t n);

/* An operand produced window by window while the GEMM runs, instead of read
 * from memory: implicit GEMM, where a convolution's im2col columns are
 * written a register tile at a time into a buffer that stays in L1/L2 and
 * packed from there, so the [P, KH*KW*C] column matrix never exists.
 * fill writes element (w, k) of the window at (w0, k0), w in [0, wc) and k
 * in [0, kc), to dst[w*sw + k*sk] (elements of the operand's dtype); w is
 * A's row (M) or B's column (N), k runs along K. The GEMM calls it with
 * sw = 1 when the source's runs go along w (w_runs), else with sk = 1,
 * from any of the pool's threads at once. */
typedef void (*mpt_cpu_fill_fn)(const void *ctx, int64_t w0, int64_t wc, int64_t k0, int64_t kc,
                                void *dst, int64_t sw, int64_t sk);

/* Optional, for B on AMX: writes the window's sliver of `width` columns
 * (w0 a multiple of width) in the packed layout itself, k in pairs:
 * element (w, k) at dst[((k/2)*width + w)*2 + k%2] (2-byte elements), for
 * w < width and k < kp, zeros where w >= wc or k >= kc. */
typedef void (*mpt_cpu_fill_pairs_fn)(const void *ctx, int64_t w0, int64_t wc, int64_t k0,
                                      int64_t kc, void *dst, int64_t width, int64_t kp);

typedef struct {
    mpt_cpu_fill_fn fill; /* NULL only with fill_pairs, for AMX variants */
    const void *ctx;
    int w_runs; /* consecutive elements of a run differ in w (else in k) */
    mpt_cpu_fill_pairs_fn fill_pairs; /* or NULL */
} mpt_cpu_gemm_source;

/* mpt_cpu_gemm_run with either operand (or both) produced by a source;
 * a NULL source means the operand is read from A (or B) as usual. */
int mpt_cpu_gemm_run_src(mpt_cpu_gemm *g, mpt_pool *pool, int64_t M, int64_t N, int64_t K,
                         const mpt_cpu_gemm_source *a_src, const void *A, int64_t lda,
                         const mpt_cpu_gemm_source *b_src, const void *B, int64_t ldb, void *C,
                         int64_t ldc, const mpt_cpu_epilogue_args *epi, char *err, size_t n);

/* An A read in place through two offset tables: element (i, k) of A is
 * the element (of desc.a_dt) at (const char *)base + row[i] + col[k]. A convolution's column
 * matrix is one (row: an output position's corner in a zero-padded image,
 * col: a tap and channel's offset from it, or the other way round for the
 * filter gradient), so the micro-kernel broadcasts its elements straight
 * from the image: nothing is filled or packed. For a GEMM compiled with
 * desc.a_gather. */
typedef struct {
    const void *base;
    const int64_t *row, *col; /* [M] and [K] byte offsets */
    /* optional [M][4]: row i's elements outside k in [lo, hi) are zeros
     * (a convolution's taps in the top and bottom padding), and where
     * k_run > 0 so are those outside [seg_lo, seg_hi) of each run of
     * k_run k's (the left and right padding), all of which the kernel may
     * skip; NULL: every k */
    const int64_t *k_range;
    int64_t tile_stride; /* desc.a_tiles: bytes between a tile's rows */
    int64_t k_run;
} mpt_cpu_gemm_gather;

int mpt_cpu_gemm_run_gather(mpt_cpu_gemm *g, mpt_pool *pool, int64_t M, int64_t N, int64_t K,
                            const mpt_cpu_gemm_gather *a, const void *B, int64_t ldb, void *C,
                            int64_t ldc, const mpt_cpu_epilogue_args *epi, char *err, size_t n);

/* Compiles now what a run with N output columns will need (the narrow
 * tile is otherwise built on its first run, inside a step's time).
 * 0, or -1 with a message. */
int mpt_cpu_gemm_prepare(mpt_cpu_gemm *g, int64_t N, char *err, size_t n);

/* The same with B produced by a source (a convolution's filter gradient
 * takes dy's rows in the order of its gathered columns). */
int mpt_cpu_gemm_run_gather_src(mpt_cpu_gemm *g, mpt_pool *pool, int64_t M, int64_t N, int64_t K,
                                const mpt_cpu_gemm_gather *a, const mpt_cpu_gemm_source *b_src,
                                void *C, int64_t ldc, const mpt_cpu_epilogue_args *epi, char *err,
                                size_t n);

/* "ir" (optimised LLVM IR text) or "asm" (host assembly); NULL unless compiled
 * with keep_text. Owned by g. */
const char *mpt_cpu_gemm_text(const mpt_cpu_gemm *g, const char *what);

/* Register tile and cache blocks the kernel was generated with, for reports. */
void mpt_cpu_gemm_blocking(const mpt_cpu_gemm *g, int *mr, int *nr, int *kc, int *mc, int *nc);

#endif
