/* codegen/cpu/emit.h — what the CPU backend's generator files share: the
 * element emitter (one LLVM IR generator per op, composed node by node over
 * <w x float> / <w x i32> vectors), the index descriptors it composes, and
 * the kernel generators by kind. Private to codegen/cpu/.
 *
 * Every generated kernel function has the signature
 *     void f(i8 **slots, i64 lo, i64 hi)
 * slots[] holds one pointer per buffer the kernel touches (its inputs, its
 * outputs and its scratch values, numbered by mpt_cpu_kplan.slot_of); lo and
 * hi are the part of the iteration space this call covers (elements for
 * loops, rows for reductions), always on the boundaries the generator asked
 * for (mpt_cpu_fn.grain), so the pool can split a kernel between threads.
 */
#ifndef MPT_CODEGEN_CPU_EMIT_H
#define MPT_CODEGEN_CPU_EMIT_H

#include <llvm-c/Core.h>
#include <stdint.h>
#include <string.h>

#include "codegen/cpu/cpu_backend.h"
#include "codegen/cpu/cpu_internal.h"
#include "fusion/fusion.h"

/* Where the lanes of one vector of values live (linear indices over the
 * shape of the node being read). */
typedef enum {
    MPT_IX_CONTIG,  /* lane l at base + l, never crossing an aligned block of `span` */
    MPT_IX_UNIFORM, /* every lane at base */
    MPT_IX_GATHER,  /* lane l at vec[l] */
} mpt_ix_kind;

typedef struct {
    mpt_ix_kind kind;
    int w;              /* lanes */
    LLVMValueRef base;  /* i64; CONTIG and UNIFORM */
    LLVMValueRef vec;   /* <w x i64>; GATHER */
    int64_t span;       /* CONTIG: lanes stay inside one aligned block of span elements */
    int id;             /* memo key: values computed at the same index share it */
} mpt_ix;

typedef struct {
    int node, ix_id;
    LLVMValueRef v;
} mpt_ce_memo;

/* One generated function in progress. */
typedef struct {
    mpt_cpu_jit *jit;
    LLVMContextRef c;
    LLVMModuleRef m;
    LLVMBuilderRef b;
    const mpt_graph *g;
    const mpt_kernel *k;
    const char *in_fn;   /* per node: computed in this function (else read from its slot) */
    const int *slot_of;  /* per node: slot index or -1 */
    LLVMValueRef fn;
    LLVMValueRef *buf;   /* per slot: the pointer, loaded once in the entry block */
    int n_slots;
    int W;               /* vector lanes of the ISA */
    mpt_ce_memo *memo;
    int n_memo, cap_memo;
    int next_ix;
    /* reduction kernels: a BROADCAST of alias_in_shape to alias_shape over
     * alias_mask (the kept dims) read inside the current row is the row's
     * value at row_ix */
    int alias_on;
    mpt_shape alias_shape;
    int64_t alias_mask;
    const mpt_ix *row_ix;
    /* reductions split along the reduced rows (emit_reduce.c): which stage
     * this function is (-1: the whole kernel in one function) and the slot
     * of the stages' scratch */
    int red_stage, red_slot;
    /* loop functions of a GEMM/CONV epilogue: reduce_all nodes whose column
     * flags (set to 1 before) the loop clears (emit_loop.c and_column) */
    const int *and_targets;
    int n_and;
    const char *err;     /* first failure, a static string */
    int err_node;
    /* f32 -> bf16 by vcvtneps2bf16: the step flushes denormals and the host
     * has AVX512_BF16 (emit_loop.c bf16_bits) */
    int cvt_bf16;
    LLVMTypeRef f32, f64, i1, i8, i16, i32, i64, half, vd;
} mpt_ce;

/* A function generated for a kernel: its name, the unit its [lo, hi)
 * range is split on, and the size of the whole range. */
typedef struct {
    char name[64];
    int64_t total, grain; /* units of [lo, hi), split on multiples of grain */
    int64_t work;         /* elements touched, to decide whether threads pay */
    void (*fn)(void **slots, int64_t lo, int64_t hi);
} mpt_cpu_fn;

/* One kernel of a compiled plan: its buffers (slots), its generated
 * functions and, for GEMM/CONV, the core between them. */
#define MPT_CPU_MAX_FNS 8
typedef struct {
    const mpt_kernel *k;
    int n_slots, cap_slots;
    int *slot_node;        /* the node whose value the slot holds */
    int64_t *slot_scratch; /* byte offset in the scratch area, or -1 (a plan buffer) */
    void **slots;
    int64_t scratch_bytes;
    int n_fns, n_pre;      /* fns[0, n_pre) run before the core, the rest after it */
    mpt_cpu_fn fns[MPT_CPU_MAX_FNS];
    /* GEMM/CONV core: C = epilogue(A x B) with the operands in slots */
    mpt_cpu_gemm *gemm;
    int a_slot, b_slot, c_slot, col_slot, acc_slot, wt_slot;
    int64_t M, N, K;
    int n_epi;
    int epi_slot[MPT_CPU_EPI_MAX];
    int epi_node[MPT_CPU_EPI_MAX]; /* the node a STORE step writes, else -1 */
    float epi_scalar[MPT_CPU_EPI_MAX];
    int64_t geom[16];      /* CONV: MPT_G_* */
    int64_t chunk;         /* CONV data gradient by col2im: images per round */
    int dgrad_phased;      /* CONV data gradient: by phases (else GEMM + col2im) */
    int dgrad_in_place;    /* ... of stride 1, its rows in dx's order: the GEMM writes dx */
    int dgrad_rows;        /* ... gathered, strided or image by image: the GEMM stores each
                            * row at its dx position (g_crow, desc.c_rows) */
    int dgrad_direct;      /* CONV data gradient of a 1x1 stride-1 conv: one GEMM into dx */
    int implicit;          /* CONV forward, filter gradient: implicit GEMM (no column matrix) */
    /* CONV, f32: the GEMM broadcasts A's elements from the zero-padded
     * image (x, or dy for the data gradient; mpt_cpu_gemm_gather). pad_slot
     * holds that image (-1: the operand itself, no padding), pad its
     * geometry {N, H, W, C, top, left, HP, WP, element size}; the tables are the GEMM's
     * (every phase's, one after another) row and column byte offsets, made once */
    int gather, pad_slot;
    int64_t pad[10];
    /* the image is f16 (1) or bf16 (2) and its padded copy f32 (pad's
     * element size 4): the gathered GEMM then multiplies as in f32,
     * without widening each element it broadcasts; 0: same dtype */
    int pad_widen;
    /* a widened copy of a convolution's input whose kernel is smaller than
     * its stride ({SH, KH, SW, KW}; zeros: every element): only padded
     * rows hp with hp % SH < KH and columns likewise are ever read, so only
     * they are widened (a 1x1 stride-2 convolution reads a quarter) */
    int64_t pad_read[4];
    /* CONV, bf16 on AMX (forward and data gradient): the GEMM's A tiles are
     * read in place (desc.a_tiles) from a padded image with IL = tiles
     * images interleaved, [N/IL, HP, WP, IL, C] (pad[9] = IL), and the
     * GEMM's rows run over (N/IL, position, IL). IL = 16: a tile's 16 rows
     * are 16 images at one position, C elements apart. IL = 8 (a batch of
     * 8s, stride 1 along W, an even number of output columns): 8 images at
     * two neighbouring positions, which are 8 C apart, so again C apart.
     * The forward GEMM writes them to
     * acc_slot, permuted into NHWC after it; the data gradient's phase
     * scatter reads them in that order. The filter gradient's A (taps x
     * positions) comes from [N/32, HP, WP, C, 32] (pad[9] = 32), its k in
     * (N/32, oh, ow, 32) order, dy's rows following through g_perm. */
    int tiles;
    /* CONV, bf16 on AMX, kernel rows as tiles (mpt_cpu_krow_tiles_pay):
     * krow is the k of a kernel row, KW*C rounded up to 32. The forward of
     * an image's first layer (fewer than 16 channels): a tile's 16 rows are
     * 16 neighbouring output columns, each the 32 consecutive elements from
     * its window's corner in one padded image row, SW*C apart; the weights
     * are copied with zeros past each row's KW*C (wt_slot), so what a tile
     * row reads past its window counts for nothing. Filter gradients (a
     * first layer's, and wider ones without tiles of their own): dw^T [O,
     * KH*krow] = dy^T x the rows, B written in pairs straight from the
     * padded image, into acc_slot, then stored back without the columns
     * past KW*C; dy^T in wt_slot where the tiles read it in place. 0: not
     * this way. */
    int64_t krow;
    /* CONV filter gradient, bf16 on AMX, stride 1 (emit_planes.c): the
     * positions of an image on the padded grid, whole tiles (T); 0: not
     * this way */
    int64_t planes;
    /* g_krange: [M][4] nonzero k per row (mpt_cpu_gemm_gather.k_range), or
     * NULL */
    int64_t *g_row, *g_col, *g_krange;
    /* the step most of g_row's rows are apart (desc.a_row_step), or 0 */
    int64_t g_step;
    /* a forward convolution on tiles: the byte offset in y (NHWC) of each
     * of the GEMM's rows, which run in (N/IL, position, IL) order: the
     * GEMM stores them in place (desc.c_rows) */
    int64_t *g_crow;
    /* forward and data gradient: the GEMM's rows in (position, image)
     * order (MPT_CPU_SKIP_IMAGES), g_il = N images at a position; 0: in
     * (image, position) order */
    int64_t g_il;
    /* how the padding is skipped (MPT_CPU_SKIP_*; by segments, k_run is a
     * kernel row's k: KW*C forward, N*OW filter gradient, tw*O a data
     * gradient phase), and the share of the nominal k the tiles then run,
     * in percent, by emit_ranges.c's count; -1: no ranges */
    int g_skip, g_kpct;
    /* filter gradient: the position (dy row) of each k, which runs over
     * (oh, n, ow) so that a tap's rows in the padding form a prefix and a
     * suffix of k that g_krange leaves out; NULL: k is the position */
    int64_t *g_perm;
    /* reduce_all outputs of the epilogue loop: their slots, set to 1 (true)
     * before the loop clears the columns it finds false */
    int n_and;
    int and_slot[MPT_CPU_EPI_MAX];
    int64_t and_bytes[MPT_CPU_EPI_MAX];
    char core[384];        /* what the core runs, for `mptc asm` and errors */
    int amx;               /* OPAQUE: the JIT's bf16 GEMMs run on AMX (1) or vdpbf16ps
                            * without AMX (2); attention follows */
} mpt_cpu_kx;

/* What compiling a plan shares between kernels. */
typedef struct {
    mpt_cpu_jit *jit;
    LLVMModuleRef m;
    const mpt_plan *p;
    int *slot_of; /* per node, rebuilt per kernel */
    char *in_fn;  /* per node, set by the caller of mpt_cpu_gen */
    int keep_text;
    int flush_denormals; /* the step flushes denormals (MPTC_DENORMALS) */
    int n_gemms;
    mpt_cpu_gemm_desc *descs;
    mpt_cpu_gemm **gemms;
    int next_fn;
    int red_stage; /* the reduction stage mpt_cpu_gen emits, -1: unsplit */
    const int *and_targets; /* a loop's column reduce_all outputs (mpt_ce.and_targets) */
    int n_and;
} mpt_cpu_cc;

/* The scratch slot of a split reduction's partial results (no node). */
#define MPT_CPU_RED_SCRATCH (-5)

/* backend.c: the slot of node in x (added if new); scratch_bytes > 0 makes
 * it a scratch value of that size. -1 when out of memory. */
int mpt_cpu_kx_slot(mpt_cpu_kx *x, int node, int64_t scratch_bytes);
/* Generates a loop (reduction = 0, over targets) or the reduction kernel
 * (reduction = 1) with cc->in_fn as the computed nodes; appends it to x. */
int mpt_cpu_gen(mpt_cpu_cc *cc, mpt_cpu_kx *x, int reduction, const int *targets, int n_targets,
                char *err, size_t n);
/* A GEMM compiled once per description and shared. */
mpt_cpu_gemm *mpt_cpu_cc_gemm(mpt_cpu_cc *cc, const mpt_cpu_gemm_desc *d, char *err, size_t n);

/* emit_conv.c: GEMM and CONV kernels */
/* whether k writes node id (emit_epi.c) */
int mpt_cpu_kernel_output(const mpt_kernel *k, int id);
/* The GEMM epilogue steps for the ops after k's root (emit_epi.c): fills
 * d->steps and x's epilogue operands; returns the node C holds. */
int mpt_cpu_epi_chain(const mpt_graph *g, const mpt_kernel *k, const char *in_k, mpt_cpu_kx *x,
                      mpt_cpu_gemm_desc *d);
/* whether any of d's steps reads or writes an [M, N] operand at C's row
 * (or keeps column flags that each run sets afresh): not for a
 * convolution whose GEMM rows are not NHWC's or that runs in parts */
int mpt_cpu_epi_by_rows(const mpt_cpu_gemm_desc *d);
/* the runtime operands of x's epilogue steps into epi; NULL if none */
const mpt_cpu_epilogue_args *mpt_cpu_chain_args(const mpt_cpu_kx *x, mpt_cpu_epilogue_args *epi);
/* Where the kernel's outputs include the column reduce_all of is_finite(c)
 * (c: the chain's end, C's values), appends it to d's steps as the finite
 * check (a ROUND to c's dtype before it where C is f16/bf16), so that no
 * loop reads C again for it. */
void mpt_cpu_epi_finite(const mpt_graph *g, const mpt_kernel *k, const char *in_k, mpt_cpu_kx *x,
                        mpt_cpu_gemm_desc *d, int c);
/* d's epilogue steps in words ("round to bf16, + bias f32 as bf16, relu") */
void mpt_cpu_epi_describe(const mpt_cpu_gemm_desc *d, char *buf, size_t n);
int mpt_cpu_plan_gemm(mpt_cpu_cc *cc, mpt_cpu_kx *x, char *err, size_t n);
int mpt_cpu_plan_conv(mpt_cpu_cc *cc, mpt_cpu_kx *x, char *err, size_t n);
int mpt_cpu_run_core(const mpt_graph *g, mpt_cpu_kx *x, mpt_pool *pool, char *err, size_t n);

/* emit_opaque.c: pooling, scatter_add, argmax (and anything alone in an
 * OPAQUE kernel) as plain loops that compute in double like the interpreter;
 * im2col/col2im for the convolutions */
int mpt_cpu_run_opaque(const mpt_graph *g, mpt_cpu_kx *x, mpt_pool *pool, char *err, size_t n);
/* attention.c: an attention kernel (attention and attention_lse, or the
 * attention_grad ops of one attention), FlashAttention's blocked loops;
 * data gives each node's buffer (NULL for a constant); amx: bf16 heads
 * may run on AMX tiles (1) or attention_amx.c's loops on vdpbf16ps (2) */
int mpt_cpu_run_attention(const mpt_graph *g, const mpt_kernel *K,
                          void *(*data)(const void *ctx, int node), const void *ctx, int amx,
                          mpt_pool *pool, char *err, size_t n);
/* attention.c: 1 when an attention kernel runs on AMX tiles where the
 * JIT's bf16 GEMMs do (mpt_cpu_run_attention's amx), read off the graph */
int mpt_cpu_attention_amx_takes(const mpt_graph *g, const mpt_kernel *K);
/* frees the attention kernels' per-thread scratch (mpt_cpu_opaque_release calls it) */
void mpt_cpu_attention_release(void);
/* An ALLREDUCE kernel: its input copied to its output, and the sum across
 * the ranks started there (mpt_collective_start: *req to wait on, or NULL
 * when it already finished). */
int mpt_cpu_allreduce_start(const mpt_graph *g, mpt_cpu_kx *x, void **req, char *err, size_t n);
/* ---- data parallelism's sums (sums.c) ---- */
typedef struct mpt_cpu_sums mpt_cpu_sums;
/* The plan's ALLREDUCE kernels in buckets of bucket_bytes (fusion.h);
 * *out NULL for a plan without any. 0, or -1 out of memory. */
int mpt_cpu_sums_new(const mpt_plan *p, int64_t bucket_bytes, mpt_cpu_sums **out);
void mpt_cpu_sums_free(mpt_cpu_sums *s);
/* 1 when kernel k is an ALLREDUCE that s sends */
int mpt_cpu_sums_member(const mpt_cpu_sums *s, int k);
/* Runs ALLREDUCE kernel k: its value staged, its bucket's sum started
 * when k is the bucket's last member. */
int mpt_cpu_sums_run(mpt_cpu_sums *s, const mpt_graph *g, mpt_cpu_kx *kx, int k, char *err,
                     size_t n);
/* Finishes the buckets due before kernel k (every one at k = n_kernels),
 * their values copied to their members' buffers; the wait is added to
 * prof[the bucket's last member] when prof is not NULL. */
int mpt_cpu_sums_before(mpt_cpu_sums *s, const mpt_graph *g, mpt_cpu_kx *kx, int k, double *prof,
                        char *err, size_t n);
/* lets the oldest sum in flight progress */
int mpt_cpu_sums_progress(mpt_cpu_sums *s, char *err, size_t n);
/* An ALLREDUCE kernel's input and output buffers. */
int mpt_cpu_allreduce_slots(const mpt_graph *g, mpt_cpu_kx *x, void **in, void **out, char *err,
                            size_t n);
/* batch_matmul.c: out = op(a) op(b) per batch, f32 sums rounded once to
 * nd's dtype, over the pool (na, nb: the operand nodes) */
int mpt_cpu_run_batch_matmul(const mpt_node *nd, const mpt_node *na, const mpt_node *nb,
                             const void *a, const void *b, void *out, mpt_pool *pool, char *err,
                             size_t n);
/* opaque_index.c: scatter_add (out [rows, d] from ids and updates [.., d])
 * and argmax along nd's axis, over the pool, as the interpreter computes them */
int mpt_cpu_run_scatter_add(const mpt_node *nd, const mpt_node *na, const mpt_node *nb,
                            const void *ids, const void *upd, void *out, mpt_pool *pool,
                            char *err, size_t n);
void mpt_cpu_run_argmax(const mpt_node *nd, const mpt_node *na, const void *src, void *dst,
                        mpt_pool *pool);
/* frees the pooling scratch kept between runs */
void mpt_cpu_opaque_release(void);
/* cols [N*OH*OW, KH*KW*C] of x [N,H,W,C] (elements of esize bytes, zeros
 * outside the image) */
void mpt_cpu_im2col(mpt_pool *pool, const void *x, void *cols, size_t esize, const int64_t *geom);
/* dx [N,H,W,C] (f32) += the columns dcols [N*OH*OW, KH*KW*C] (f32) */
void mpt_cpu_col2im(mpt_pool *pool, const float *dcols, float *dx, const int64_t *geom);
/* geom: n, h, w, c, kh, kw, o, oh, ow, sh, sw, ph, pw */
enum { MPT_G_N, MPT_G_H, MPT_G_W, MPT_G_C, MPT_G_KH, MPT_G_KW, MPT_G_O, MPT_G_OH, MPT_G_OW,
       MPT_G_SH, MPT_G_SW, MPT_G_PH, MPT_G_PW, MPT_G_COUNT };
/* dst [cols, rows] = src [rows, cols] transposed, elements of esize bytes
 * (2 or 4), over the pool's threads (NULL: on the caller's) */
void mpt_cpu_transpose(mpt_pool *pool, const void *src, void *dst, int64_t rows, int64_t cols,
                       size_t esize);
/* dst[j * ds + i] = src[i * ss + j] for an 8 x 8 block of 2-byte elements
 * (i, j < 8), in SSE2 registers. */
void mpt_cpu_tr8x8_u16(const uint16_t *src, int64_t ss, uint16_t *dst, int64_t ds);
/* 32 2-byte elements of a and of b interleaved into o (a0 b0 a1 b1 ...):
 * two k rows as a sliver of AMX's B pairs */
void mpt_cpu_pairs32_u16(const uint16_t *a, const uint16_t *b, uint16_t *o);
/* f32 values rounded and stored as dt */
void mpt_cpu_store_f32(mpt_dtype dt, const float *src, void *dst, int64_t n);
/* mpt_f32_to_bf16 inline, for loops that store many: round to nearest
 * even, NaN kept quiet */
static inline uint16_t mpt_cpu_bf16_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    uint32_t q = (u >> 16) | 0x40u, r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(nan ? q : r);
}
/* element i of p (f32, bf16 or f16) widened exactly; bf16 inline (its
 * bits are f32's top half), so that loops over it vectorize */
static inline float mpt_cpu_f32_at(mpt_dtype dt, const void *p, int64_t i) {
    if (dt == MPT_DT_F32) return ((const float *)p)[i];
    if (dt == MPT_DT_BF16) {
        uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    return mpt_f16_to_f32(((const uint16_t *)p)[i]);
}
/* n f32 values rounded once to dt into elements [at, at + n) of out:
 * mpt_cpu_store_f32 inline, for the C kernels' target clones */
static inline void mpt_cpu_store_at(mpt_dtype dt, void *out, int64_t at, const float *v, int64_t n) {
    if (dt == MPT_DT_F32) memcpy((float *)out + at, v, (size_t)n * sizeof *v);
    else if (dt == MPT_DT_BF16)
        for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[at + i] = mpt_cpu_bf16_of(v[i]);
    else
        for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[at + i] = mpt_f32_to_f16(v[i]);
}

/* ---- emit_loop.c: the element emitter ---- */

/* Starts function `name` in module m; in_fn and slot_of as in mpt_ce. */
void mpt_ce_begin(mpt_ce *e, mpt_cpu_jit *j, LLVMModuleRef m, const mpt_graph *g,
                  const mpt_kernel *k, const char *in_fn, const int *slot_of, int n_slots,
                  const char *name);
void mpt_ce_end(mpt_ce *e);
/* Node's value at ix: <ix->w x float> (float dtypes) or <ix->w x i32> (i32,
 * bool), rounded to the node's dtype. Sets e->err on an unsupported op. */
LLVMValueRef mpt_ce_value(mpt_ce *e, int node, const mpt_ix *ix);
void mpt_ce_store(mpt_ce *e, int node, const mpt_ix *ix, LLVMValueRef v);
void mpt_ce_bind(mpt_ce *e, int node, const mpt_ix *ix, LLVMValueRef v);
static inline int mpt_ce_mark(const mpt_ce *e) { return e->n_memo; }
static inline void mpt_ce_release(mpt_ce *e, int mark) { e->n_memo = mark; }
mpt_ix mpt_ce_ix(mpt_ce *e, mpt_ix_kind kind, int w, LLVMValueRef base, int64_t span);
LLVMValueRef mpt_ce_i64(mpt_ce *e, int64_t v);
LLVMTypeRef mpt_ce_vec(LLVMTypeRef t, int w);
LLVMValueRef mpt_ce_splat(mpt_ce *e, LLVMValueRef scalar, int w);
int mpt_ce_is_int(mpt_dtype dt); /* i32/bool registers */
/* a small counted loop: *iv runs from lo while iv + step <= hi; returns the
 * block after the loop; the builder is left in the body */
typedef struct {
    LLVMValueRef var; /* alloca i64 */
    LLVMBasicBlockRef head, body, done;
    int64_t step;
} mpt_ce_loop;
void mpt_ce_loop_begin(mpt_ce *e, mpt_ce_loop *l, LLVMValueRef lo, LLVMValueRef hi,
                       int64_t step, const char *name);
LLVMValueRef mpt_ce_loop_iv(mpt_ce *e, const mpt_ce_loop *l);
void mpt_ce_loop_end(mpt_ce *e, mpt_ce_loop *l);
LLVMValueRef mpt_ce_alloca(mpt_ce *e, LLVMTypeRef t, const char *name);
/* fmax/fmin as the interpreter's max_nan (NaN wins) */
LLVMValueRef mpt_ce_max_nan(mpt_ce *e, LLVMValueRef a, LLVMValueRef b, int is_int, int is_min);
/* f32 (or i32) vector rounded to dt from the f32 domain */
LLVMValueRef mpt_ce_round_f32(mpt_ce *e, mpt_dtype dt, LLVMValueRef v);

/* helpers the generator files share */
typedef enum { MPT_CE_DOM_F, MPT_CE_DOM_D, MPT_CE_DOM_I } mpt_ce_dom; /* f32, double, i32 */
LLVMValueRef mpt_ce_fconst(mpt_ce *e, LLVMTypeRef t, double v, int w);
LLVMValueRef mpt_ce_iconst(mpt_ce *e, LLVMTypeRef t, int64_t v, int w);
int mpt_ce_width(LLVMValueRef v);
LLVMValueRef mpt_ce_intrinsic(mpt_ce *e, const char *name, LLVMTypeRef *tys, int n_tys,
                              LLVMValueRef *args, int n_args);
LLVMValueRef mpt_ce_intr1(mpt_ce *e, const char *name, LLVMValueRef a);
/* records the first failure and returns a placeholder of w lanes */
LLVMValueRef mpt_ce_fail(mpt_ce *e, int node, const char *why, int w);
/* v, computed in domain d, as a register value of dt, rounded once */
LLVMValueRef mpt_ce_finish(mpt_ce *e, mpt_dtype dt, LLVMValueRef v, mpt_ce_dom d);
/* emit_math.c: exp, log, tanh, erf of <w x double> x, inline, within a
 * few double ulps of libm (the file says how close and why that is enough) */
LLVMValueRef mpt_vm_exp(LLVMBuilderRef b, LLVMModuleRef m, LLVMValueRef x);
LLVMValueRef mpt_vm_log(LLVMBuilderRef b, LLVMModuleRef m, LLVMValueRef x);
LLVMValueRef mpt_vm_tanh(LLVMBuilderRef b, LLVMModuleRef m, LLVMValueRef x);
LLVMValueRef mpt_vm_erf(LLVMBuilderRef b, LLVMModuleRef m, LLVMValueRef x);
/* for tests: void f(const double *x, double *y, int64_t n) applying "exp",
 * "log", "tanh" or "erf" to n elements, n a multiple of the ISA's f32 lanes */
void *mpt_cpu_math_fn(mpt_cpu_jit *j, const char *fname, char *err, size_t n);
/* the lanes' linear indices as <ix->w x i64> */
LLVMValueRef mpt_ce_ix_lanes(mpt_ce *e, const mpt_ix *ix);
/* emit_slice.c: a slice or concat node at ix, and the run of a concat's
 * output elements a vector should stay inside (the loop's span) */
LLVMValueRef mpt_ce_slice(mpt_ce *e, int id, const mpt_ix *ix);
LLVMValueRef mpt_ce_concat(mpt_ce *e, int id, const mpt_ix *ix);
int64_t mpt_ce_concat_run(const mpt_ce *e, int id);
/* emit_elem.c: an elementwise node (or cast) at ix */
LLVMValueRef mpt_ce_elementwise(mpt_ce *e, int id, const mpt_ix *ix);

/* A loop function computing `targets` (nodes of equal element count) at
 * every linear index and storing them to their slots. */
int mpt_ce_emit_loop(mpt_ce *e, const int *targets, int n_targets, mpt_cpu_fn *out);

/* ---- emit_reduce.c ---- */
/* Emits the reduction kernel, or with e->red_stage >= 0 that stage of it. */
int mpt_ce_emit_reduction(mpt_ce *e, mpt_cpu_fn *out);
/* How kernel k's reductions run: 0 in one function, else split along the
 * reduced rows into that many stage functions (partial sums per chunk of
 * rows, their combination per pass, then the element outputs), which need
 * *scratch_bytes of scratch in slot MPT_CPU_RED_SCRATCH. */
int mpt_ce_reduction_stages(mpt_cpu_jit *j, const mpt_graph *g, const mpt_kernel *k,
                            const char *in_fn, int64_t *scratch_bytes);

/* ---- convolutions (emit_conv.c, emit_cols.c, emit_gather.c) ---- */

/* emit_cols.c: a convolution's implicit im2col columns, the GEMM's
 * source (mpt_cpu_cols_fill, an mpt_cpu_fill_fn over one of these) */
typedef struct {
    const int64_t *q;
    const char *x;
    size_t es;
    int p_is_w; /* the GEMM's w is p (A: forward) or j (B: filter gradient) */
} mpt_cpu_conv_cols;
void mpt_cpu_cols_fill(const void *ctx, int64_t w0, int64_t wc, int64_t k0, int64_t kc, void *dst,
                       int64_t sw, int64_t sk);
/* emit_cols.c: the k_run of a gathered GEMM whose kernel rows are `run`
 * k long (run where its rows skip the padding by segments, else 0) */
int64_t mpt_cpu_skip_run(const mpt_cpu_kx *x, int64_t run);
/* emit_cols.c: a planned data gradient by phases (x->dgrad_phased), run */
int mpt_cpu_run_dgrad(const mpt_graph *g, mpt_cpu_kx *x, mpt_pool *pool, char *err, size_t n);

/* One stride phase of a convolution's data gradient (emit_cols.c). */
typedef struct {
    int64_t th, tw;   /* taps of the phase per dim (0: its dx is zero) */
    int64_t q0h, q0w; /* first grid index whose dx position is in the image */
    int64_t nqh, nqw; /* grid points in the image */
} mpt_cpu_dgrad_phase;
mpt_cpu_dgrad_phase mpt_cpu_dgrad_phase_of(const int64_t *q, int64_t rh, int64_t rw);

/* Task `task` of n_tasks's share [*lo, *hi) of rows [0, n), split on
 * multiples of grain (so that tasks writing neighbouring rows do not share
 * cache lines). */
static inline void mpt_cpu_task_rows(int64_t n, int64_t grain, int task, int n_tasks, int64_t *lo,
                                     int64_t *hi) {
    int64_t blocks = (n + grain - 1) / grain;
    *lo = blocks * task / n_tasks * grain;
    *hi = blocks * (task + 1) / n_tasks * grain;
    *hi = *hi < n ? *hi : n;
}

/* fn(ctx, task, thread) over rows split into *n_tasks (set first; at
 * most 4 per thread) tasks on the pool, or inline when one is enough. */
void mpt_cpu_pool_rows(mpt_pool *pool, int64_t rows, int *n_tasks,
                       void (*fn)(void *ctx, int task, int thread), void *ctx);

/* mpt_cpu_kx.pad's fields: the image, its padding, the padded copy's
 * size, element size and interleave */
enum {
    MPT_CPU_PAD_N, MPT_CPU_PAD_H, MPT_CPU_PAD_W, MPT_CPU_PAD_C, MPT_CPU_PAD_TOP,
    MPT_CPU_PAD_LEFT, MPT_CPU_PAD_HP, MPT_CPU_PAD_WP, MPT_CPU_PAD_ES, MPT_CPU_PAD_IL
};
/* The padded image with il images interleaved and a forward
 * convolution's row table for tiles; room for K columns (emit_gather.c). */
int mpt_cpu_tile_tables(mpt_cpu_kx *x, int64_t es, int64_t il, int64_t K, char *err, size_t n);

/* Gathered convolutions (emit_gather.c): whether a GEMM with n output
 * columns and k_run channels per tap gathers (wgrad: a filter gradient's);
 * the forward/filter-gradient and data-gradient tables and padded-image
 * slot; the image to read. */
int mpt_cpu_gather_pays(const mpt_cpu_jit *j, mpt_dtype a_dt, int64_t n, int64_t k_run,
                        int one_tap, int wgrad, const int64_t *q);
/* The share of a convolution's window taps (q: MPT_G_*) that fall inside
 * the image, not on its padding (emit_ranges.c). */
double mpt_cpu_conv_inside(const int64_t *q);
/* 1 where bf16 products run on vdpbf16ps pairs (desc.a_pairs): AVX-512,
 * no AMX, and vdpbf16ps faster than f32 FMAs (mpt_cpu_bf16_dot_pays) */
int mpt_cpu_pairs_pay(const mpt_cpu_jit *j);
/* mpt_cpu_kx.pad_widen of a convolution that gathers (or not) an A of a_dt
 * from a B of b_dt; 0 for a gathered bf16 A read in pairs (desc.a_pairs),
 * which pairs_ok allows: an even number of channels a tap (forward, data
 * gradient), an even batch (filter gradient). The forward/filter-gradient
 * tables then in pairs (a filter gradient's from images interleaved in
 * twos). */
int mpt_cpu_gather_widen(const mpt_cpu_jit *j, int gather, mpt_dtype a_dt, mpt_dtype b_dt,
                         int pairs_ok);
int mpt_cpu_gather_plan(mpt_cpu_kx *x, int fwd, int64_t es, int pairs, char *err, size_t n);
int mpt_cpu_dgrad_gather_plan(mpt_cpu_kx *x, int64_t es, int tiles, int64_t ys, char *err,
                              size_t n);
/* The interleave with which a bf16 convolution reads its A tiles in place
 * (mpt_cpu_kx.tiles), or 0: AMX, k_run (channels per tap) a multiple of
 * 32, and a batch of 16s (16), or of 8s where pairs_ok says the GEMM's rows
 * step one position at a time along W in runs of an even length (8). */
int mpt_cpu_tiles_pay(const mpt_cpu_jit *j, mpt_dtype a_dt, mpt_dtype b_dt, int64_t batch,
                      int64_t k_run, int pairs_ok);
int mpt_cpu_tiles_plan(mpt_cpu_kx *x, int64_t es, int64_t ys, char *err, size_t n);
/* The filter gradient's: a batch of 32s, channels a multiple of 16. */
int mpt_cpu_wgrad_tiles_pay(const mpt_cpu_jit *j, mpt_dtype a_dt, mpt_dtype b_dt,
                            int64_t batch, int64_t channels);
int mpt_cpu_wgrad_tiles_plan(mpt_cpu_kx *x, int64_t es, char *err, size_t n);
/* A stride-1 filter gradient from channel planes (emit_planes.c,
 * mpt_cpu_kx.planes): T, or 0 where it does not apply or pay; its tables
 * and planes' slot; its run. */
int64_t mpt_cpu_planes_pay(const mpt_cpu_jit *j, mpt_dtype a_dt, mpt_dtype b_dt,
                           const int64_t *q);
int mpt_cpu_planes_plan(mpt_cpu_kx *x, int64_t es, char *err, size_t n);
int mpt_cpu_planes_run(mpt_cpu_kx *x, mpt_pool *pool, size_t es, char *err, size_t n);
/* Kernel rows as tiles (emit_krow.c, mpt_cpu_kx.krow): the k of a kernel row, or 0
 * where it does not apply or pay; its tables; its run. */
int64_t mpt_cpu_krow_tiles_pay(const mpt_cpu_jit *j, mpt_dtype a_dt, mpt_dtype b_dt,
                               const int64_t *geom, int fwd);
int mpt_cpu_krow_tiles_plan(mpt_cpu_kx *x, int fwd, int64_t es, char *err, size_t n);
int mpt_cpu_krow_tiles_run(mpt_cpu_kx *x, mpt_pool *pool, int fwd, mpt_dtype c_dt, size_t es,
                           char *err, size_t n);
/* Which k a gathered convolution's rows skip (emit_ranges.c). A row's
 * nonzero k: kernel rows [h0, h1) of `run` k's each, in each of them the
 * k in [s0, s1). */
typedef struct {
    int64_t h0, h1, s0, s1;
} mpt_cpu_krange;
enum {
    MPT_CPU_SKIP_ROWS,   /* the rows' own order, whole kernel rows (k_run 0) */
    MPT_CPU_SKIP_RUNS,   /* the same order, each kernel row to its segment */
    MPT_CPU_SKIP_IMAGES, /* rows in (position, image) order, by segments */
    MPT_CPU_SKIP_COUNT
};
/* The k iterations of the tiles of nb x np rows (r in (image, position)
 * order) skipping `how`; the cheapest (MPT_CPU_CONV_SKIP=rows|runs|images
 * forces one); r's ranges as mpt_cpu_gemm_gather.k_range [M][4], in the
 * GEMM's order for `how`. */
int64_t mpt_cpu_krange_cost(const mpt_cpu_krange *r, int64_t nb, int64_t np, int64_t run,
                            int how);
int mpt_cpu_krange_choose(const int64_t *cost);
/* The k iterations of tiles over `rows` rows that skip nothing. */
int64_t mpt_cpu_krange_nominal(int64_t rows, int64_t k);
void mpt_cpu_krange_write(const mpt_cpu_krange *r, int64_t nb, int64_t np, int64_t run, int how,
                          int64_t *kr);
/* Rows of the tiles' order (N/il, position, il) back to NHWC's (N, position). */
void mpt_cpu_tiles_unpermute(mpt_pool *pool, const void *src, void *dst, int64_t batch,
                             int64_t positions, size_t row_bytes, int il);
const void *mpt_cpu_gather_base(mpt_cpu_kx *x, mpt_pool *pool, const void *img);
/* desc.a_row_step of a gathered A with these m row offsets */
int64_t mpt_cpu_gather_row_step(const int64_t *row, int64_t m);

#endif
