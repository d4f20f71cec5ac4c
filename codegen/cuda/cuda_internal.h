/* codegen/cuda/cuda_internal.h — what the CUDA generator's files share:
 * a growing string, and the element emitter that composes one expression per
 * op into a kernel body.
 */
#ifndef MPT_CODEGEN_CUDA_INTERNAL_H
#define MPT_CODEGEN_CUDA_INTERNAL_H

#include <stdarg.h>

#include "codegen/cuda/cuda.h"

typedef struct {
    char *s;
    size_t len, cap;
    int oom;
} mpt_sb;

void mpt_sb_printf(mpt_sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *mpt_sb_take(mpt_sb *b); /* the string (caller frees); b is reset */

/* A value already computed in the code: node `node` at linear index
 * variable `idx` ("*" matches any index: bound values such as a GEMM
 * accumulator or a block's reduction result) lives in variable `var`. */
typedef struct {
    int node;
    char idx[24];
    char var[24];
} mpt_cu_memo;

typedef struct {
    const mpt_graph *g;
    const mpt_kernel *k;
    mpt_sb *sb;
    int indent;
    char *in_kernel;     /* per graph node */
    int *param_of;       /* per graph node: parameter index or -1 */
    mpt_cu_memo *memo;
    int n_memo, cap_memo;
    int tmp;
    /* In a reduction kernel, a BROADCAST of shape alias_shape over the kept
     * dims alias_mask, read at the row's element index "e", is the row's
     * value at index "row". */
    int alias_on;
    mpt_shape alias_shape;
    int64_t alias_mask;
    /* In a LOOP kernel's vector loop: each thread takes MPT_CU_LANES
     * consecutive elements of vec_n, at index variables l0, l1, ...; a
     * buffer of vec_n elements read there is read with one vector load. */
    int64_t vec_n;
    /* A phased GEMM: the accumulators' rows are the class's, whose row in
     * the output mpt_row (emitted in the kernel) gives. */
    int row_map;
    /* A wgmma kernel: its accumulators are one m64 x wg_n fragment a
     * warpgroup (0: mma.sync's) */
    int wg_n;
    /* f32 GEMMs and convolutions on TF32 Tensor Cores (mpt_plan.tf32) */
    int tf32;
    /* "__launch_bounds__(256, 2)" for mpt_cu_signature, or NULL */
    char launch_bounds[48];
    const char *err;     /* first failure (static string), NULL while fine */
    int err_node;
} mpt_cu_em;

#define MPT_CU_LANES 4

/* Sets up an emitter for kernel k of p writing into sb, and fills out's
 * params (inputs that are not folded, then outputs). 0 or -1 (oom). */
int mpt_cu_em_init(mpt_cu_em *e, const mpt_plan *p, int k, mpt_sb *sb,
                   mpt_cuda_kernel_src *out);
void mpt_cu_em_free(mpt_cu_em *e);
/* Writes one indented line. */
void mpt_cu_line(mpt_cu_em *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The variable holding node's value at linear index variable idx (over the
 * node's own shape), emitting whatever code computes it. Names are written
 * into var (24 bytes). On an unsupported op sets e->err. */
void mpt_cu_value(mpt_cu_em *e, int node, const char *idx, char *var);
/* Records that node's value is in var at every index (idx "*") or at idx. */
void mpt_cu_bind(mpt_cu_em *e, int node, const char *idx, const char *var);
/* Forgets values computed after memo entry `mark` (leaving a C scope). */
static inline int mpt_cu_mark(const mpt_cu_em *e) { return e->n_memo; }
static inline void mpt_cu_release(mpt_cu_em *e, int mark) { e->n_memo = mark; }
/* A fresh variable name with the given prefix. */
void mpt_cu_fresh(mpt_cu_em *e, const char *prefix, char *var);

/* Ops that read their operand at computed places (one_hot, gather,
 * pooling and its gradients): emits the code and writes the value's
 * expression into expr. 0 when op is not one of them. emit_opaque.c. */
int mpt_cu_value_movement(mpt_cu_em *e, int node, const char *idx, char *expr, size_t n);
/* Round-to-dtype function name ("mpt_rh", "mpt_rb" or ""). */
const char *mpt_cu_round_fn(mpt_dtype dt);
int64_t mpt_cu_stride(mpt_shape s, int d);

/* Buffer element type, register type, load and store. */
const char *mpt_cu_ctype(mpt_dtype dt);
const char *mpt_cu_regtype(mpt_dtype dt);
/* Emits "param[idx] = value" for an output node. */
void mpt_cu_store(mpt_cu_em *e, int node, const char *idx, const char *value);
/* The parameter list "(const float* __restrict__ p0, ...)" into sb. */
void mpt_cu_signature(mpt_cu_em *e, const mpt_cuda_kernel_src *out);
/* The shared helpers every kernel source starts with. */
extern const char mpt_cu_prelude[];

/* Kernel generators by kind (emit_*.c). Each fills out->source's body via
 * e->sb, and out's launch configuration. */
int mpt_cu_emit_loop(mpt_cu_em *e, mpt_cuda_kernel_src *out);
int mpt_cu_emit_reduction(mpt_cu_em *e, mpt_cuda_kernel_src *out);
int mpt_cu_emit_opaque(mpt_cu_em *e, mpt_cuda_kernel_src *out);
/* emit_attn.c: an attention kernel (attention with its attention_lse, or
 * the attention_grad ops of one attention): on Tensor Cores
 * (emit_attn_mma.c) for f16/bf16 heads of multiples of 16 up to 128, else
 * one thread per row (SIMT) */
int mpt_cu_emit_attention(mpt_cu_em *e, mpt_cuda_kernel_src *out);

/* One attention's sizes and attrs, read from its nodes (emit_attn.c) */
typedef struct {
    mpt_cu_em *e;
    int64_t B, H, Tq, Tk, E, Ev;
    int causal, zero_masked;
    int bthd;              /* q, k, v, o, do and the gradients stored [B,T,H,D] (ops.def) */
    double scale;
    const mpt_node *mask;
    int mask_p;            /* the mask's parameter, -1 when a constant */
    int counter_p;         /* dropout's counter parameter, -1 when a constant */
    double counter_const;
    int64_t drop_seed, drop_below;
    float drop_scale;
} mpt_cu_attn;
/* The index of the first element of row t (an expression of the
 * kernel's variables) of head bh of a [B,H,T,D] value, or of a bthd op's
 * [B,T,H,D] one, into buf; returns buf */
const char *mpt_cu_attn_row(const mpt_cu_attn *a, char *buf, size_t n, const char *t, int64_t T, int64_t D);
/* Emits `int vis` (0/1: (b, i, j) not masked, causal included) and
 * `const float dfac` (dropout's factor of (bh, i, j)) from the variables
 * b, bh, i, j and dkey of the kernel. */
void mpt_cu_attn_mask_drop(mpt_cu_attn *a);
/* Emits `dkey`, dropout's key of this step, where there is dropout. */
void mpt_cu_attn_drop_key(mpt_cu_attn *a);
/* element `idx` of parameter p (a buffer of dt) as a float expression */
void mpt_cu_attn_load(char *buf, size_t n, mpt_dtype dt, int p, const char *idx);
/* the function rounding a float to dt's storage ("" for f32) */
const char *mpt_cu_attn_store_fn(mpt_dtype dt);
/* emit_attn_mma.c: 1 when the Tensor Core kernels take this attention
 * (q, k, v in one 16-bit dtype, E and Ev multiples of 16 up to 128); then the forward (o >= 0, lse may be -1) or the backward (grad[3]:
 * dq, dk, dv nodes or -1) kernel. */
int mpt_cu_attn_mma_fits(const mpt_cu_attn *a, const mpt_node *nd, int backward);
int mpt_cu_emit_attention_mma(mpt_cu_attn *a, mpt_cuda_kernel_src *out, int o, int lse,
                              const int *grad);
int mpt_cu_emit_gemm(mpt_cu_em *e, mpt_cuda_kernel_src *out);

/* ---- GEMM and convolution kernels (emit_gemm.c, emit_mma.c) ---- */

/* C[M,N] = A[M,K] B[K,N] of a MATMUL or one of the convolutions, the
 * output element (m, n) at linear index m*N + n (see emit_gemm.c). */
typedef struct {
    mpt_op op;
    int64_t m, n, k;
    int a, b;             /* operand nodes */
    mpt_shape xs, ws, ys; /* conv: input image, filter, output image */
    int64_t sh, sw, ph, pw;
    int trans_a, trans_b;
    /* the type of the kernel's indices: "int" where every index of every
     * matrix and buffer fits in 31 bits (fewer registers, cheaper
     * division by the image sizes), else "long long" */
    const char *ity;
    /* A strided convolution's data gradient taken by phase (emit_mma.c):
     * the pixels of dx whose (y + ph) mod sh, (x + pw) mod sw are one
     * class each, a dense GEMM over only the taps that reach them; the
     * kernel's variables ph_* describe the block's class. */
    int phased;
} mpt_cu_gemm;

/* One class of a phased data gradient (emit_gemm.c): the pixels of dx
 * with (y + ph) mod sh = a, (x + pw) mod sw = b, from iy0, ix0 on in
 * steps of the stride (hc x wc of them an image), meeting nky x nkx taps;
 * (iy + ph - ky) / sh = dy0 + jy - tky. m x k is its GEMM, in `tiles` row
 * tiles. */
enum { MPT_CU_MAX_PHASES = 16 };
typedef struct {
    int64_t a, b, iy0, ix0, hc, wc, nky, nkx, dy0, dx0, m, k, tiles;
} mpt_cu_phase;
/* For a strided data gradient (at most 16 classes): fills ph for row tiles
 * of bm, sets q->phased and returns the number of classes with pixels;
 * else 0. Either way *m_tiles is the grid's row tiles and *k_max the
 * longest k. */
int mpt_cu_gemm_phases(mpt_cu_gemm *q, int bm, mpt_cu_phase *ph, int64_t *m_tiles,
                       int64_t *k_max);
/* The block's class (ph_* variables, MC_ and K_) from blockIdx.y, and
 * mpt_row(l): a class row's row of dx, or M_ past the class. */
void mpt_cu_gemm_emit_phases(mpt_cu_em *e, const mpt_cu_gemm *q, const mpt_cu_phase *ph, int n);
/* Emits M_, N_ and K_: constants, or (phased) K_ and the class's rows
 * MC_ from mpt_cu_gemm_emit_phases. */
void mpt_cu_gemm_emit_sizes(mpt_cu_em *e, const mpt_cu_gemm *q, const mpt_cu_phase *ph, int n);
/* Emits mpt_tm and mpt_tn, the block's row and column tile. Row tiles
 * run along grid.y, or along grid.x where there are more of them than
 * grid.y takes (65535; MPTC_CUDA_MAX_GRID_Y lowers it for the tests);
 * fills out->grid[0..1] to match. */
void mpt_cu_gemm_tile_ids(mpt_cu_em *e, int64_t m_tiles, int64_t n_tiles, mpt_cuda_kernel_src *out);

/* Emits, in a scope where gm and gk (which 0: A) or gk and gn (which 1:
 * B) are defined and inside the matrix, `const long long idx = ...;`: the
 * operand buffer's linear index of that element. Returns the expression
 * that is false where the element is a convolution's padding ("true" when
 * there is none); idx is 0 there. */
const char *mpt_cu_gemm_index(mpt_cu_em *e, const mpt_cu_gemm *q, int which, const char *idx);
/* Emits `dst = A(gm, gk)` (which 0) or `dst = B(gk, gn)` (which 1) as a
 * float, 0 in the padding, through the element generators. */
void mpt_cu_gemm_operand(mpt_cu_em *e, const mpt_cu_gemm *q, int which, const char *dst);
/* 1 when the operand's elements are consecutive in memory along k, 0
 * along m (A) or n (B). */
int mpt_cu_gemm_k_contiguous(const mpt_cu_gemm *q, int which);
/* The number of consecutive elements along that dimension before the
 * index jumps (C of a convolution's NHWC image, the row length of a
 * matrix): chunks of 8 that start at multiples of 8 never cross a jump
 * when it is a multiple of 8. */
int64_t mpt_cu_gemm_run(const mpt_cu_gemm *q, int which);

/* Emits the loops over a kernel's accumulators: `row`, `col` defined and
 * in the tile, body called with the accumulator's expression. */
typedef void (*mpt_cu_acc_body)(mpt_cu_em *e, const char *acc);
typedef void (*mpt_cu_each_acc)(mpt_cu_em *e, mpt_cu_acc_body body);
/* The same over pairs of accumulators at (row, col) and (row, col + 1),
 * col even. */
typedef void (*mpt_cu_pair_body)(mpt_cu_em *e, const char *acc0, const char *acc1);
typedef void (*mpt_cu_each_pair)(mpt_cu_em *e, mpt_cu_pair_body body);
/* The end of a GEMM kernel: the serial split-K reduction when splits > 1
 * (see emit_gemm.c), then the fused epilogue on each accumulator, on
 * pairs where `pairs` is given and N is even (each output's two values
 * stored by one instruction). */
void mpt_cu_gemm_finish(mpt_cu_em *e, const mpt_cu_gemm *q, int splits, mpt_cu_each_acc each,
                        mpt_cu_each_pair pairs);
/* How many blocks along k (grid.z) for a grid of `tiles` output tiles
 * over k_tiles steps of k, and the steps each takes. */
int mpt_cu_gemm_splits(int64_t tiles, int64_t k_tiles, int64_t *per_split);
/* The fp32 CUDA-core kernel (emit_simt.c): the whole kernel and its launch shape. */
void mpt_cu_emit_simt(mpt_cu_em *e, const mpt_cu_gemm *q, mpt_cuda_kernel_src *out);
/* The Tensor Core kernel (emit_mma.c): body, launch shape, shared memory. */
void mpt_cu_emit_mma(mpt_cu_em *e, const mpt_cu_gemm *q, mpt_dtype in_dt,
                     mpt_cuda_kernel_src *out);

/* A grid for a grid-stride loop over n elements with `block` threads. */
unsigned mpt_cu_grid_for(int64_t n, unsigned block);

#endif
