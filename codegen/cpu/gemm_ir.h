/* codegen/cpu/gemm_ir.h — the IR-building helpers that the GEMM generator's
 * two files (gemm_gen.c: micro/macro-kernel and epilogue; gemm_pack.c: the
 * packing routines) share. Private to codegen/cpu; everything is static
 * inline so each file takes only what it uses. */
#ifndef MPT_CODEGEN_CPU_GEMM_IR_H
#define MPT_CODEGEN_CPU_GEMM_IR_H
#include <stdint.h>
#include <string.h>

#include "codegen/cpu/cpu_internal.h"

/* The builder state for one kernel's module. */
typedef struct {
    mpt_cpu_jit *jit;
    const mpt_cpu_gemm_shape *s;
    LLVMContextRef c;
    LLVMModuleRef m;
    LLVMBuilderRef b;
    LLVMValueRef fn;
    LLVMTypeRef f32, i1, i8, i16, i32, i64, half, p8;
    LLVMTypeRef vf, vi16, vi32, vh, vmask; /* vl lanes */
    /* C's bf16 rounded by vcvtneps2bf16 (see gemm_gen.c f32_to_bf16) */
    int cvt_bf16;
    /* a gathered A's tile: its rows' pointers (an [16 x ptr] on the
     * stack) and the k block's end, for the k loop's prefetches */
    LLVMValueRef a_pf_rows, a_pf_end;
    /* a tile of evenly spaced rows (desc.a_row_step): the prefetched row is
     * its first row's pointer plus the slot times this step; else NULL */
    LLVMValueRef a_pf_step;
} mpt_cpu_gen;

typedef struct {
    LLVMBasicBlockRef header, body, exit;
    LLVMValueRef iv;
} mpt_cpu_loop;

static inline LLVMValueRef ci64(mpt_cpu_gen *g, int64_t v) {
    return LLVMConstInt(g->i64, (uint64_t)v, 1);
}
static inline LLVMValueRef ci32(mpt_cpu_gen *g, int64_t v) {
    return LLVMConstInt(g->i32, (uint64_t)v, 1);
}
static inline LLVMValueRef vconst(mpt_cpu_gen *g, double v) {
    LLVMValueRef e[16];
    for (int i = 0; i < g->s->vl; i++)
        e[i] = LLVMConstReal(g->f32, v);
    return LLVMConstVector(e, (unsigned)g->s->vl);
}
static inline LLVMValueRef vconst_i32(mpt_cpu_gen *g, int64_t v) {
    LLVMValueRef e[16];
    for (int i = 0; i < g->s->vl; i++)
        e[i] = ci32(g, v);
    return LLVMConstVector(e, (unsigned)g->s->vl);
}

static inline LLVMValueRef call_intrinsic(mpt_cpu_gen *g, const char *name, LLVMTypeRef *overload,
                                          size_t n_over, LLVMValueRef *args, unsigned n_args) {
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    LLVMValueRef f = LLVMGetIntrinsicDeclaration(g->m, id, overload, n_over);
    LLVMTypeRef ft = LLVMIntrinsicGetType(g->c, id, overload, n_over);
    return LLVMBuildCall2(g->b, ft, f, args, n_args, "");
}

static inline LLVMValueRef vunary(mpt_cpu_gen *g, const char *name, LLVMValueRef x) {
    LLVMTypeRef t = LLVMTypeOf(x);
    return call_intrinsic(g, name, &t, 1, &x, 1);
}

/* a * b + c, fused where the ISA has FMA */
static inline LLVMValueRef vfma(mpt_cpu_gen *g, LLVMValueRef a, LLVMValueRef b, LLVMValueRef c) {
    LLVMValueRef args[3] = {a, b, c};
    LLVMTypeRef t = LLVMTypeOf(a);
    return call_intrinsic(g, g->s->fma ? "llvm.fma" : "llvm.fmuladd", &t, 1, args, 3);
}

static inline LLVMValueRef splat(mpt_cpu_gen *g, LLVMValueRef scalar, LLVMTypeRef vec_type) {
    LLVMValueRef undef = LLVMGetUndef(vec_type);
    LLVMValueRef v = LLVMBuildInsertElement(g->b, undef, scalar, ci32(g, 0), "");
    LLVMValueRef zeros = LLVMConstNull(LLVMVectorType(g->i32, LLVMGetVectorSize(vec_type)));
    return LLVMBuildShuffleVector(g->b, v, undef, zeros, "");
}

/* byte pointer + index * elem_size, cast to a pointer to `to` */
static inline LLVMValueRef addr(mpt_cpu_gen *g, LLVMValueRef base, LLVMValueRef index,
                                int elem_size, LLVMTypeRef to) {
    LLVMValueRef off = LLVMBuildMul(g->b, index, ci64(g, elem_size), "");
    LLVMValueRef p = LLVMBuildGEP2(g->b, g->i8, base, &off, 1, "");
    return LLVMBuildBitCast(g->b, p, LLVMPointerType(to, 0), "");
}

static inline LLVMValueRef load(mpt_cpu_gen *g, LLVMTypeRef t, LLVMValueRef ptr, unsigned align) {
    LLVMValueRef v = LLVMBuildLoad2(g->b, t, ptr, "");
    LLVMSetAlignment(v, align);
    return v;
}
static inline void store(mpt_cpu_gen *g, LLVMValueRef v, LLVMValueRef ptr, unsigned align) {
    LLVMSetAlignment(LLVMBuildStore(g->b, v, ptr), align);
}

static inline LLVMValueRef smin(mpt_cpu_gen *g, LLVMValueRef a, LLVMValueRef b) {
    return LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, a, b, ""), a, b, "");
}

static inline LLVMValueRef loop_begin(mpt_cpu_gen *g, mpt_cpu_loop *l, LLVMValueRef start,
                                      LLVMValueRef end, const char *name) {
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(g->b);
    l->header = LLVMAppendBasicBlockInContext(g->c, g->fn, name);
    l->body = LLVMAppendBasicBlockInContext(g->c, g->fn, "body");
    l->exit = LLVMAppendBasicBlockInContext(g->c, g->fn, "exit");
    LLVMBuildBr(g->b, l->header);
    LLVMPositionBuilderAtEnd(g->b, l->header);
    l->iv = LLVMBuildPhi(g->b, g->i64, name);
    LLVMAddIncoming(l->iv, &start, &pre, 1);
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, l->iv, end, ""), l->body, l->exit);
    LLVMPositionBuilderAtEnd(g->b, l->body);
    return l->iv;
}

static inline void loop_end(mpt_cpu_gen *g, mpt_cpu_loop *l) {
    LLVMValueRef next = LLVMBuildAdd(g->b, l->iv, ci64(g, 1), "");
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(g->b);
    LLVMBuildBr(g->b, l->header);
    LLVMAddIncoming(l->iv, &next, &latch, 1);
    LLVMPositionBuilderAtEnd(g->b, l->exit);
}

/* ---- element conversions ---- */

/* bf16 bits (i16 or <n x i16>) -> f32 */
static inline LLVMValueRef bf16_to_f32(mpt_cpu_gen *g, LLVMValueRef bits, LLVMTypeRef i32t,
                                       LLVMTypeRef ft) {
    LLVMValueRef w = LLVMBuildZExt(g->b, bits, i32t, "");
    LLVMValueRef sh = LLVMGetTypeKind(i32t) == LLVMVectorTypeKind ? vconst_i32(g, 16) : ci32(g, 16);
    return LLVMBuildBitCast(g->b, LLVMBuildShl(g->b, w, sh, ""), ft, "");
}

/* one element of dt at p (a pointer to i16 or float) -> f32 */
static inline LLVMValueRef load_scalar_f32(mpt_cpu_gen *g, mpt_dtype dt, LLVMValueRef base,
                                           LLVMValueRef idx) {
    switch (dt) {
    case MPT_DT_F32: return load(g, g->f32, addr(g, base, idx, 4, g->f32), 4);
    case MPT_DT_F16:
        return LLVMBuildFPExt(g->b, load(g, g->half, addr(g, base, idx, 2, g->half), 2), g->f32,
                              "");
    case MPT_DT_BF16:
        return bf16_to_f32(g, load(g, g->i16, addr(g, base, idx, 2, g->i16), 2), g->i32, g->f32);
    case MPT_DT_I32:
    case MPT_DT_BOOL:
    case MPT_DT_F64:
    case MPT_DT_COUNT: break;
    }
    return NULL; /* unreachable: gemm.c admits f32, f16 and bf16 only */
}

static inline LLVMValueRef masked_load(mpt_cpu_gen *g, LLVMTypeRef vt, LLVMValueRef ptr,
                                       LLVMValueRef mask, unsigned align) {
    LLVMTypeRef over[2] = {vt, LLVMTypeOf(ptr)};
    LLVMValueRef args[4] = {ptr, ci32(g, align), mask, LLVMConstNull(vt)};
    return call_intrinsic(g, "llvm.masked.load", over, 2, args, 4);
}

static inline void masked_store(mpt_cpu_gen *g, LLVMValueRef v, LLVMValueRef ptr, LLVMValueRef mask,
                                unsigned align) {
    LLVMTypeRef over[2] = {LLVMTypeOf(v), LLVMTypeOf(ptr)};
    LLVMValueRef args[4] = {v, ptr, ci32(g, align), mask};
    call_intrinsic(g, "llvm.masked.store", over, 2, args, 4);
}

/* vl elements of dt at base[idx...] where mask is set (0 elsewhere) -> <vl x f32> */
static inline LLVMValueRef load_vec_f32(mpt_cpu_gen *g, mpt_dtype dt, LLVMValueRef base,
                                        LLVMValueRef idx, LLVMValueRef mask) {
    if (dt == MPT_DT_F32)
        return masked_load(g, g->vf, addr(g, base, idx, 4, g->vf), mask, 4);
    LLVMValueRef bits = masked_load(g, g->vi16, addr(g, base, idx, 2, g->vi16), mask, 2);
    if (dt == MPT_DT_F16)
        return LLVMBuildFPExt(g->b, LLVMBuildBitCast(g->b, bits, g->vh, ""), g->vf, "");
    return bf16_to_f32(g, bits, g->vi32, g->vf);
}

/* 4-byte cells per k of a packed sliver row: kc f32, or ceil(kc/2) bf16
 * pairs, rounded up to whole 16-pair AMX tiles when AMX consumes them. */
static inline LLVMValueRef cells_per_k(mpt_cpu_gen *g, LLVMValueRef kc) {
    if (!g->s->pair)
        return kc;
    LLVMValueRef kk = LLVMBuildSDiv(g->b, LLVMBuildAdd(g->b, kc, ci64(g, 1), ""), ci64(g, 2), "");
    if (!g->s->amx)
        return kk;
    kk = LLVMBuildAdd(g->b, kk, ci64(g, 15), "");
    return LLVMBuildAnd(g->b, kk, ci64(g, ~(int64_t)15), "");
}

/* the cache line at p into L1 (for a write: write = 1) */
static inline void prefetch_l1(mpt_cpu_gen *g, LLVMValueRef p, int write) {
    LLVMTypeRef pt = g->p8;
    LLVMValueRef args[4] = {p, LLVMConstInt(g->i32, (uint64_t)write, 0), LLVMConstInt(g->i32, 3, 0),
                            LLVMConstInt(g->i32, 1, 0)};
    call_intrinsic(g, "llvm.prefetch", &pt, 1, args, 4);
}

static inline LLVMValueRef const_mask(mpt_cpu_gen *g, int n, int on) {
    LLVMValueRef e[64];
    for (int i = 0; i < n; i++)
        e[i] = LLVMConstInt(g->i1, (uint64_t)on, 0);
    return LLVMConstVector(e, (unsigned)n);
}

/* lanes [0, n) of an i1 vector: (base + lane) < limit (i64 scalars) */
static inline LLVMValueRef lane_mask(mpt_cpu_gen *g, int n, LLVMValueRef base, LLVMValueRef limit) {
    LLVMValueRef e[64];
    for (int i = 0; i < n; i++)
        e[i] = ci32(g, i);
    LLVMValueRef room = LLVMBuildSub(g->b, limit, base, "");
    room = smin(g,
                LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, room, ci64(g, 0), ""),
                                ci64(g, 0), room, ""),
                ci64(g, n));
    LLVMTypeRef vt = LLVMVectorType(g->i32, (unsigned)n);
    LLVMValueRef r = LLVMBuildInsertElement(g->b, LLVMGetUndef(vt),
                                            LLVMBuildTrunc(g->b, room, g->i32, ""), ci32(g, 0), "");
    r = LLVMBuildShuffleVector(g->b, r, LLVMGetUndef(vt),
                               LLVMConstNull(LLVMVectorType(g->i32, (unsigned)n)), "");
    return LLVMBuildICmp(g->b, LLVMIntSLT, LLVMConstVector(e, (unsigned)n), r, "");
}

/* lanes [0, n % vl) set, or all when vl divides n: the last vector of a row
 * of n elements */
static inline LLVMValueRef tail_mask(mpt_cpu_gen *g, int n) {
    int tail = n % g->s->vl;
    LLVMValueRef e[16];
    for (int i = 0; i < g->s->vl; i++)
        e[i] = LLVMConstInt(g->i1, (uint64_t)(!tail || i < tail), 0);
    return LLVMConstVector(e, (unsigned)g->s->vl);
}

/* An epilogue step's operand, as the macro-kernel loaded it from its
 * mpt_cpu_epi_arg. */
typedef struct {
    LLVMValueRef ptr, ld, scalar;
} mpt_cpu_epi_operand;

/* gemm_epi.c: the steps of d applied to x, the accumulators of C's columns
 * col (a vector) in row `row`, lanes past the edge off in mask; and x stored
 * as dt at base[idx] under mask. */
LLVMValueRef mpt_cpu_gemm_apply_epilogue(mpt_cpu_gen *g, const mpt_cpu_gemm_desc *d,
                                         const mpt_cpu_epi_operand *ops, LLVMValueRef x,
                                         LLVMValueRef row, LLVMValueRef col, LLVMValueRef mask);
void mpt_cpu_gemm_store_vec(mpt_cpu_gen *g, mpt_dtype dt, LLVMValueRef x, LLVMValueRef base,
                            LLVMValueRef idx, LLVMValueRef mask);

/* Packing routines (gemm_pack.c), named as in cpu_internal.h: the sliver
 * layouts for the register tile (f32 or bf16 pairs), and for AMX's A. */
void mpt_cpu_gen_pack(mpt_cpu_gen *g, mpt_dtype dt, int width, const char *name);
void mpt_cpu_gen_pack_rows(mpt_cpu_gen *g, int width, const char *name);

/* gemm_amx.c: the AMX tile configuration (tiles 0-3 C, 4-5 A's halves,
 * 6-7 B's), a 32 x 32 tile's k loop over kk cells leaving C in tiles 0-3
 * (from prior's sums where in_tiles, else zeros; a_col: A's tiles in place
 * at those column offsets, else packed with a_stride bytes a row), and
 * tiles 0-3 stored at (i0, j0) of an f32 matrix of row stride ld. */
void mpt_cpu_amx_configure(mpt_cpu_gen *g);
void mpt_cpu_amx_k_loop(mpt_cpu_gen *g, LLVMValueRef a_sl, LLVMValueRef a_sl1, LLVMValueRef a_col,
                        LLVMValueRef a_stride, LLVMValueRef b_sl, LLVMValueRef kk,
                        LLVMValueRef in_tiles, LLVMValueRef prior, LLVMValueRef ldp,
                        LLVMValueRef i0, LLVMValueRef j0);
void mpt_cpu_amx_store_c(mpt_cpu_gen *g, LLVMValueRef base, LLVMValueRef ld, LLVMValueRef i0,
                         LLVMValueRef j0);

/* gemm_asm.c: a gathered f32 tile's k steps as inline assembly, where
 * mpt_cpu_gather_asm says this tile has such a form (AVX2's 6 rows);
 * mpt_cpu_gather_steps_asm emits MPT_CPU_GATHER_U steps from k (acc: the
 * sums so far; next: after). Prefetch distances are the tile loop's. */
enum { MPT_CPU_PREFETCH_K = 16, MPT_CPU_PREFETCH_A = 32, MPT_CPU_GATHER_U = 2 };
int mpt_cpu_gather_asm(const mpt_cpu_gen *g, mpt_dtype a_dt);
void mpt_cpu_gather_steps_asm(mpt_cpu_gen *g, const LLVMValueRef *a_rows, LLVMValueRef a_col,
                              LLVMValueRef b_sl, LLVMValueRef k, const LLVMValueRef *acc,
                              LLVMValueRef *next);

#endif
