/* codegen/cuda/cuda.h — CUDA C generation from a kernel plan, NVRTC
 * compilation with a disk cache, and the cuBLASLt epilogue matcher.
 *
 * This header is the whole public surface of codegen/cuda/. Nothing here
 * needs a GPU: sources are generated from the plan and its graph, and NVRTC
 * (dlopen'ed through codegen/cuda/driver.h) turns them into PTX and cubin anywhere.
 *
 * Generated kernels take one pointer per buffer, in the order params[] lists
 * (the kernel's inputs, then its outputs); shapes are compile-time constants.
 * CONST and IOTA inputs are folded into the code and get no parameter.
 * Every value is computed in f32 registers (i32/bool in int registers) and
 * rounded to its node's dtype after each op, as the reference interpreter
 * does, so fused and unfused kernels agree; buffers are loaded and stored in
 * their own dtype (f16/bf16 as 16-bit words, bool as one byte).
 */
#ifndef MPT_CODEGEN_CUDA_H
#define MPT_CODEGEN_CUDA_H

#include <stddef.h>
#include <stdio.h>

#include "fusion/fusion.h"
#include "ir/ir.h"

/* ---- cuBLASLt epilogues (values of cublasLtEpilogue_t in cublasLt.h) ---- */

typedef enum {
    MPT_LT_EPI_DEFAULT = 1,
    MPT_LT_EPI_RELU = 2,
    MPT_LT_EPI_RELU_AUX = 2 | 128,
    MPT_LT_EPI_BIAS = 4,
    MPT_LT_EPI_RELU_BIAS = 2 | 4,
    MPT_LT_EPI_RELU_AUX_BIAS = 2 | 128 | 4,
    MPT_LT_EPI_DRELU = 8 | 128,
    MPT_LT_EPI_DRELU_BGRAD = 8 | 128 | 16,
    MPT_LT_EPI_GELU = 32,
    MPT_LT_EPI_GELU_AUX = 32 | 128,
    MPT_LT_EPI_GELU_BIAS = 32 | 4,
    MPT_LT_EPI_GELU_AUX_BIAS = 32 | 128 | 4,
    MPT_LT_EPI_DGELU = 64 | 128,
    MPT_LT_EPI_DGELU_BGRAD = 64 | 128 | 16,
    MPT_LT_EPI_BGRADA = 256,
    MPT_LT_EPI_BGRADB = 512,
} mpt_lt_epilogue;

const char *mpt_lt_epilogue_name(mpt_lt_epilogue e); /* "RELU_BIAS" */

/* One cuBLASLt call: D[M,N] = epilogue(op(A) op(B) (+ bias)), row-major,
 * f32 accumulation. Node ids name the buffers. A batch_matmul is `batch`
 * such products, one after another in each buffer (strides M*K, K*N and
 * M*N elements): cuBLASLt's strided-batched matmul. */
typedef struct {
    int64_t m, n, k;
    int64_t batch;  /* 1 for a GEMM or convolution */
    int trans_a, trans_b;
    mpt_dtype a_dt, b_dt, d_dt, bias_dt;
    int a, b;   /* operand buffers (after any prologue cast, see a_src) */
    int d;      /* the value written */
    int bias;   /* [N] vector, or -1 */
    int aux;    /* value the AUX/D* epilogues store or read, or -1 */
    mpt_lt_epilogue epilogue;
} mpt_lt_call;

/* 1 when kernel k is one mpt_cuda_match_lt looks at: a GEMM, a convolution
 * or a batch_matmul (an opaque kernel of its own, no epilogue) */
int mpt_cuda_lt_candidate(const mpt_graph *g, const mpt_kernel *k);
/* Maps the GEMM kernel k's epilogue onto one cuBLASLt epilogue. Returns
 * NULL and fills *call, or a static reason why it cannot (then a generated
 * kernel runs it). */
const char *mpt_cuda_match_lt(const mpt_graph *g, const mpt_kernel *k, mpt_lt_call *call);
/* "cublasLt M=128 N=512 K=784 A=f16 B=f16 D=f16 trans=NN epilogue=RELU_BIAS",
 * "cublasLt batch=16 M=8 N=8 K=6 A=bf16 B=bf16 D=f32 trans=NT epilogue=DEFAULT" */
void mpt_lt_call_print(const mpt_lt_call *c, const mpt_graph *g, FILE *f);

/* ---- generated kernels ---- */

typedef struct {
    char *name;          /* entry point, extern "C" */
    char *source;        /* complete CUDA C, self-contained (no #include) */
    int *params;         /* node ids, one pointer parameter each */
    int n_params;
    int n_inputs;        /* params[0..n_inputs) are read, the rest written */
    unsigned grid[3], block[3];
    unsigned shared_bytes; /* dynamic shared memory */
    int zero_outputs;    /* outputs must be zeroed before the launch (atomics) */
    /* Bit j: params[j], a bool output, must be set true (every byte 1)
     * before the launch. These are the column flags of a reduce_all in a
     * GEMM/conv epilogue, which the kernel only clears. */
    unsigned long long set_true;
    int tensor_cores;    /* uses mma.sync, or wgmma where wgmma is set */
    int wgmma;           /* sm_90's wgmma.mma_async (MPTC_CUDA_WGMMA=1): compiled for sm_90a */
    int tf32;            /* ... on TF32 operands (--tf32) */
    int phases;          /* a strided data gradient taken in this many classes, else 0 */
    int tile_m, tile_n;  /* a GEMM or convolution's block tile (rows x columns), else 0 */
    /* When nonzero the kernel takes one more pointer parameter after
     * params, `scratch`: a device buffer of at least this many bytes that
     * it writes before it reads (partial sums), so it may hold anything
     * when the kernel starts. */
    size_t scratch_bytes;
    /* When nonzero, one more after that, `counters`: at least this many
     * bytes, zero when the kernel starts, and the kernel leaves them zero.
     * So the kernels of a step, which run one after another, can all be
     * given the same two regions: the step holds the largest scratch and
     * the largest counters, not their sums. */
    size_t counter_bytes;
} mpt_cuda_kernel_src;

/* The byte params[j] must be filled with before the launch (0 for
 * zero_outputs, 1 for set_true), or -1 where the kernel needs nothing */
int mpt_cuda_output_fill(const mpt_cuda_kernel_src *s, int j);

/* 1 when kernel k of p is a collective across data-parallel ranks
 * (allreduce, reduce_scatter, all_gather, rank_slice): no CUDA C is
 * generated for it; the CUDA backend makes it NCCL calls and device copies
 * on the step's stream (runtime/cuda/cuda_nccl.c). */
int mpt_cuda_kernel_is_collective(const mpt_plan *p, int k);

/* Generates kernel k of plan p. 0, or -1 with the reason in err (an op or
 * dtype the generator does not handle, a collective). */
int mpt_cuda_emit_kernel(const mpt_plan *p, int k, mpt_cuda_kernel_src *out, char *err,
                         size_t n);
void mpt_cuda_kernel_src_free(mpt_cuda_kernel_src *s);

/* ---- NVRTC ---- */

typedef struct {
    char *ptx;
    size_t ptx_len;
    void *cubin;        /* NULL when arch was compute_XX (PTX only) */
    size_t cubin_len;
    char *log;          /* NVRTC's log, ptxas' -v output included */
    int regs, spill_stores, spill_loads; /* from ptxas -v; -1 when unknown */
    int static_smem;    /* ptxas' "N bytes smem": static shared memory, 0 when unknown */
    int wgmma_serial;   /* ptxas' notes that it serialized wgmma or injected a warpgroup
                         * wait or arrive (mpt_cuda_wgmma_note): each costs the overlap */
    int cache_hit;      /* 1 when read from the disk cache */
    int same_as;        /* mpt_cuda_compile_all: the kernel whose code this is, or -1 */
    char *entry;        /* the cubin's function: that kernel's name (NULL: the own) */
    double seconds;     /* compile (or cache read) time */
} mpt_cuda_binary;

/* Compiles src for arch ("sm_80", "sm_90": PTX and cubin; "compute_90": PTX
 * only). Results are cached on disk keyed by a hash of the source, the
 * arch, the options and NVRTC's version. 0, or -1 with err (the NVRTC log
 * of a failed compile included). */
int mpt_cuda_compile(const char *src, const char *name, const char *arch,
                     mpt_cuda_binary *out, char *err, size_t n);
void mpt_cuda_binary_free(mpt_cuda_binary *b);
/* The first of b's wgmma_serial notes, as ptxas words it without its
 * "ptxas info    : " prefix and " in function ..." suffix, into buf; NULL
 * where there is none. */
const char *mpt_cuda_wgmma_note(const mpt_cuda_binary *b, char *buf, size_t n);
/* How many blocks of threads threads, regs registers each (-1: unknown,
 * not limiting) and shared bytes of shared memory one SM of arch runs at
 * once, and in *limit what stops it there ("registers", "shared memory",
 * "threads", "blocks"); 0 when one block does not fit. */
int mpt_cuda_blocks_per_sm(const char *arch, unsigned threads, int regs, unsigned shared,
                           const char **limit);
/* Compiles count kernels at once, on mpt_cuda_compile_jobs() threads: out[i]
 * is mpt_cuda_compile(srcs[i], names[i], arch). Kernels whose sources differ
 * only in their name and header comment (a repeated block's layers) are
 * compiled once: the later ones get same_as (the first's index), the PTX
 * with their own name, and the cubin, whose function is `entry`. 0, or -1
 * with the error of the first kernel (by index) that failed and every out[]
 * freed. */
int mpt_cuda_compile_all(int count, const char *const *srcs, const char *const *names,
                         const char *arch, mpt_cuda_binary *out, char *err, size_t n);
/* $MPTC_COMPILE_JOBS, else the CPUs online (1..64) */
int mpt_cuda_compile_jobs(void);
/* $MPTC_CACHE_DIR, else $HOME/.cache/mptc; written into buf, returned */
const char *mpt_cuda_cache_dir(char *buf, size_t n);
/* 0 when arch is sm_XY or compute_XY with XY >= 80 (mma.sync bf16, cvt.rn.bf16) */
int mpt_cuda_arch_check(const char *arch, char *err, size_t n);

/* For `mptc ptx`: for every kernel of p writes OUTDIR/NAME.cu (a header
 * comment names the ops and layers fused) and OUTDIR/NAME.ptx; kernels that
 * cuBLASLt runs are listed in report with shapes, dtypes and epilogue, and
 * generated kernels with registers and spills. 0, or -1 with err. */
int mpt_cuda_emit_plan(const mpt_plan *p, const char *arch, const char *outdir,
                       FILE *report, char *err, size_t n);

#endif
