/* codegen/cpu/emit_loop.c — the element emitter and LOOP kernels.
 *
 * A kernel is the composition of one element generator per op: the value of
 * a node at an index is built from its operands' values at the indices the
 * op reads them at (the same one for elementwise ops, a mapped one for
 * broadcast/transpose, a computed one for gather/one_hot), memoised per
 * (node, index) so every node is computed once per vector.
 *
 * Numerics, chosen so that generated code agrees with ir/interp.c bit for bit
 * on elementwise work:
 *   - +, -, *, /, sqrt, max, min, compares are done in f32 and then rounded
 *     to the node's dtype: for operands that are f32, f16 or bf16 values the
 *     f32 result rounded once more equals the exact result rounded once (24
 *     bits >= 2p + 2 for p = 11 and 8), which is what the interpreter does
 *     in double;
 *   - exp, log, tanh, sigmoid, gelu, pow, rsqrt are done in double, then
 *     rounded straight to the node's dtype (to f16/bf16 through round-to-odd
 *     f32, which makes the two roundings one): pow and rsqrt as the
 *     interpreter does them, exp, log, tanh and erf by the vector code of
 *     emit_math.c, within 1-4 double ulps of the interpreter's libm, so the
 *     rounded results agree unless an exact value lies that close to a
 *     rounding boundary of the narrow type (about 2^-27 of values; none in
 *     the tests' sweeps);
 *   - i32 arithmetic is done in double and saturated, as the interpreter's
 *     rounding to i32 does.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/emit.h"

/* ---- types and small builders ---- */

LLVMTypeRef mpt_ce_vec(LLVMTypeRef t, int w) { return LLVMVectorType(t, (unsigned)w); }

LLVMValueRef mpt_ce_i64(mpt_ce *e, int64_t v) {
    return LLVMConstInt(e->i64, (unsigned long long)v, 1);
}

int mpt_ce_is_int(mpt_dtype dt) {
    switch (dt) {
    case MPT_DT_F32: case MPT_DT_F16: case MPT_DT_BF16: case MPT_DT_F64: return 0;
    case MPT_DT_I32: case MPT_DT_BOOL: return 1;
    case MPT_DT_COUNT: break;
    }
    return 0;
}

int mpt_ce_width(LLVMValueRef v) { return (int)LLVMGetVectorSize(LLVMTypeOf(v)); }

LLVMValueRef mpt_ce_splat(mpt_ce *e, LLVMValueRef s, int w) {
    LLVMTypeRef vt = mpt_ce_vec(LLVMTypeOf(s), w);
    LLVMValueRef v = LLVMBuildInsertElement(e->b, LLVMGetUndef(vt), s, LLVMConstInt(e->i32, 0, 0), "");
    LLVMValueRef mask = LLVMConstNull(mpt_ce_vec(e->i32, w));
    return LLVMBuildShuffleVector(e->b, v, LLVMGetUndef(vt), mask, "");
}

static LLVMValueRef splat_const(LLVMValueRef c, int w) {
    LLVMValueRef el[64];
    for (int i = 0; i < w; i++) el[i] = c;
    return LLVMConstVector(el, (unsigned)w);
}

LLVMValueRef mpt_ce_fconst(mpt_ce *e, LLVMTypeRef t, double v, int w) {
    return splat_const(LLVMConstReal(t, v), w);
}

LLVMValueRef mpt_ce_iconst(mpt_ce *e, LLVMTypeRef t, int64_t v, int w) {
    return splat_const(LLVMConstInt(t, (unsigned long long)v, 1), w);
}

/* <0, 1, ..., w-1> as i64 */
static LLVMValueRef lane_ids(mpt_ce *e, int w) {
    LLVMValueRef el[64];
    for (int i = 0; i < w; i++) el[i] = LLVMConstInt(e->i64, (unsigned long long)i, 0);
    return LLVMConstVector(el, (unsigned)w);
}

/* A call of the overloaded intrinsic `name` on types tys. */
LLVMValueRef mpt_ce_intrinsic(mpt_ce *e, const char *name, LLVMTypeRef *tys, int n_tys,
                              LLVMValueRef *args, int n_args) {
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    LLVMValueRef f = LLVMGetIntrinsicDeclaration(e->m, id, tys, (size_t)n_tys);
    LLVMTypeRef ft = LLVMIntrinsicGetType(e->c, id, tys, (size_t)n_tys);
    return LLVMBuildCall2(e->b, ft, f, args, (unsigned)n_args, "");
}

LLVMValueRef mpt_ce_intr1(mpt_ce *e, const char *name, LLVMValueRef a) {
    LLVMTypeRef t = LLVMTypeOf(a);
    return mpt_ce_intrinsic(e, name, &t, 1, &a, 1);
}

LLVMValueRef mpt_ce_alloca(mpt_ce *e, LLVMTypeRef t, const char *name) {
    LLVMBuilderRef b = LLVMCreateBuilderInContext(e->c);
    LLVMBasicBlockRef entry = LLVMGetEntryBasicBlock(e->fn);
    LLVMValueRef first = LLVMGetFirstInstruction(entry);
    if (first) LLVMPositionBuilderBefore(b, first);
    else LLVMPositionBuilderAtEnd(b, entry);
    LLVMValueRef a = LLVMBuildAlloca(b, t, name);
    LLVMDisposeBuilder(b);
    return a;
}

void mpt_ce_loop_begin(mpt_ce *e, mpt_ce_loop *l, LLVMValueRef lo, LLVMValueRef hi,
                       int64_t step, const char *name) {
    l->step = step;
    l->var = mpt_ce_alloca(e, e->i64, name);
    LLVMBuildStore(e->b, lo, l->var);
    l->head = LLVMAppendBasicBlockInContext(e->c, e->fn, name);
    l->body = LLVMAppendBasicBlockInContext(e->c, e->fn, name);
    l->done = LLVMAppendBasicBlockInContext(e->c, e->fn, name);
    LLVMBuildBr(e->b, l->head);
    LLVMPositionBuilderAtEnd(e->b, l->head);
    LLVMValueRef iv = LLVMBuildLoad2(e->b, e->i64, l->var, "");
    /* the body runs while a whole step fits below hi */
    LLVMValueRef end = LLVMBuildAdd(e->b, iv, mpt_ce_i64(e, step), "");
    LLVMValueRef more = LLVMBuildICmp(e->b, LLVMIntSLE, end, hi, "");
    LLVMBuildCondBr(e->b, more, l->body, l->done);
    LLVMPositionBuilderAtEnd(e->b, l->body);
}

LLVMValueRef mpt_ce_loop_iv(mpt_ce *e, const mpt_ce_loop *l) {
    return LLVMBuildLoad2(e->b, e->i64, l->var, "iv");
}

void mpt_ce_loop_end(mpt_ce *e, mpt_ce_loop *l) {
    LLVMValueRef iv = LLVMBuildLoad2(e->b, e->i64, l->var, "");
    LLVMBuildStore(e->b, LLVMBuildAdd(e->b, iv, mpt_ce_i64(e, l->step), ""), l->var);
    LLVMBuildBr(e->b, l->head);
    LLVMPositionBuilderAtEnd(e->b, l->done);
}

/* ---- function frame ---- */

void mpt_ce_begin(mpt_ce *e, mpt_cpu_jit *j, LLVMModuleRef m, const mpt_graph *g,
                  const mpt_kernel *k, const char *in_fn, const int *slot_of, int n_slots,
                  const char *name) {
    memset(e, 0, sizeof *e);
    e->jit = j;
    e->m = m;
    e->c = LLVMGetModuleContext(m);
    e->g = g;
    e->k = k;
    e->in_fn = in_fn;
    e->slot_of = slot_of;
    e->n_slots = n_slots;
    e->err_node = -1;
    e->W = mpt_cpu_jit_vector_lanes(j);
    e->f32 = LLVMFloatTypeInContext(e->c);
    e->f64 = LLVMDoubleTypeInContext(e->c);
    e->half = LLVMHalfTypeInContext(e->c);
    e->i1 = LLVMInt1TypeInContext(e->c);
    e->i8 = LLVMInt8TypeInContext(e->c);
    e->i16 = LLVMInt16TypeInContext(e->c);
    e->i32 = LLVMInt32TypeInContext(e->c);
    e->i64 = LLVMInt64TypeInContext(e->c);
    e->vd = LLVMVoidTypeInContext(e->c);
    LLVMTypeRef pp = LLVMPointerType(LLVMPointerType(e->i8, 0), 0);
    LLVMTypeRef params[3] = {pp, e->i64, e->i64};
    e->fn = LLVMAddFunction(m, name, LLVMFunctionType(e->vd, params, 3, 0));
    mpt_cpu_jit_set_fn_attrs(j, e->fn);
    e->b = LLVMCreateBuilderInContext(e->c);
    LLVMPositionBuilderAtEnd(e->b, LLVMAppendBasicBlockInContext(e->c, e->fn, "entry"));
    /* every buffer pointer once, up front: stores through float pointers
     * could alias the table, so later loads would not be hoisted */
    e->buf = calloc((size_t)n_slots + 1, sizeof *e->buf);
    if (!e->buf) { e->err = "out of memory"; return; }
    LLVMValueRef slots = LLVMGetParam(e->fn, 0);
    for (int s = 0; s < n_slots; s++) {
        LLVMValueRef at = LLVMBuildGEP2(e->b, LLVMPointerType(e->i8, 0), slots,
                                        (LLVMValueRef[]){mpt_ce_i64(e, s)}, 1, "");
        e->buf[s] = LLVMBuildLoad2(e->b, LLVMPointerType(e->i8, 0), at, "slot");
    }
}

void mpt_ce_end(mpt_ce *e) {
    if (e->b) {
        LLVMBuildRetVoid(e->b);
        LLVMDisposeBuilder(e->b);
    }
    free(e->buf);
    free(e->memo);
    e->b = NULL;
    e->buf = NULL;
    e->memo = NULL;
}

mpt_ix mpt_ce_ix(mpt_ce *e, mpt_ix_kind kind, int w, LLVMValueRef base, int64_t span) {
    mpt_ix ix = {.kind = kind, .w = w, .base = base, .span = span, .id = e->next_ix++};
    return ix;
}

void mpt_ce_bind(mpt_ce *e, int node, const mpt_ix *ix, LLVMValueRef v) {
    if (e->n_memo == e->cap_memo) {
        int cap = e->cap_memo ? 2 * e->cap_memo : 64;
        mpt_ce_memo *m = realloc(e->memo, (size_t)cap * sizeof *m);
        if (!m) { e->err = "out of memory"; return; }
        e->memo = m;
        e->cap_memo = cap;
    }
    e->memo[e->n_memo++] = (mpt_ce_memo){node, ix->id, v};
}

static LLVMValueRef memo_find(const mpt_ce *e, int node, int ix_id) {
    for (int i = e->n_memo - 1; i >= 0; i--)
        if (e->memo[i].node == node && e->memo[i].ix_id == ix_id) return e->memo[i].v;
    return NULL;
}

LLVMValueRef mpt_ce_fail(mpt_ce *e, int node, const char *why, int w) {
    if (!e->err) { e->err = why; e->err_node = node; }
    return LLVMConstNull(mpt_ce_vec(e->f32, w));
}

/* ---- rounding and conversions ---- */

static LLVMTypeRef store_type(mpt_ce *e, mpt_dtype dt) {
    switch (dt) {
    case MPT_DT_F32: return e->f32;
    case MPT_DT_F16: case MPT_DT_BF16: return e->i16;
    case MPT_DT_I32: return e->i32;
    case MPT_DT_BOOL: return e->i8;
    case MPT_DT_F64: return e->f64;
    case MPT_DT_COUNT: break;
    }
    return e->f32;
}

/* bf16 bits (in the high half of an i32 vector) of f32 v, nearest even;
 * NaN stays a quiet NaN, as mpt_f32_to_bf16. With denormals flushed
 * (mpt_ce.cvt_bf16) 8 or 16 lanes take one vcvtneps2bf16, which rounds and
 * quiets the same way and reads a denormal as zero, as the step's DAZ
 * reads every operand: three instructions instead of eight. */
static LLVMValueRef bf16_bits(mpt_ce *e, LLVMValueRef v) {
    int w = mpt_ce_width(v);
    LLVMTypeRef vi = mpt_ce_vec(e->i32, w);
    if (e->cvt_bf16 && (w == 16 || w == 8)) {
        LLVMValueRef h = mpt_ce_intrinsic(e, w == 16 ? "llvm.x86.avx512bf16.cvtneps2bf16.512"
                                                     : "llvm.x86.avx512bf16.cvtneps2bf16.256",
                                          NULL, 0, &v, 1);
        return LLVMBuildShl(e->b, LLVMBuildZExt(e->b, h, vi, ""), mpt_ce_iconst(e, e->i32, 16, w), "");
    }
    LLVMValueRef u = LLVMBuildBitCast(e->b, v, vi, "");
    LLVMValueRef lsb = LLVMBuildAnd(e->b, LLVMBuildLShr(e->b, u, mpt_ce_iconst(e, e->i32, 16, w), ""),
                                    mpt_ce_iconst(e, e->i32, 1, w), "");
    LLVMValueRef r = LLVMBuildAdd(e->b, u, LLVMBuildAdd(e->b, lsb, mpt_ce_iconst(e, e->i32, 0x7fff, w), ""), "");
    LLVMValueRef q = LLVMBuildOr(e->b, u, mpt_ce_iconst(e, e->i32, 0x400000, w), "");
    LLVMValueRef nan = LLVMBuildFCmp(e->b, LLVMRealUNO, v, v, "");
    r = LLVMBuildSelect(e->b, nan, q, r, "");
    return LLVMBuildAnd(e->b, r, mpt_ce_iconst(e, e->i32, (int64_t)0xffff0000u, w), "");
}

LLVMValueRef mpt_ce_round_f32(mpt_ce *e, mpt_dtype dt, LLVMValueRef v) {
    int w = mpt_ce_width(v);
    switch (dt) {
    case MPT_DT_F32: return v;
    case MPT_DT_F16: {
        LLVMValueRef h = LLVMBuildFPTrunc(e->b, v, mpt_ce_vec(e->half, w), "");
        return LLVMBuildFPExt(e->b, h, mpt_ce_vec(e->f32, w), "");
    }
    case MPT_DT_BF16: return LLVMBuildBitCast(e->b, bf16_bits(e, v), mpt_ce_vec(e->f32, w), "");
    case MPT_DT_I32: case MPT_DT_BOOL: case MPT_DT_F64: case MPT_DT_COUNT: break;
    }
    return v;
}

/* double -> f32 rounded to odd: rounding that once more to p <= 22 bits
 * is the same as rounding the double once */
static LLVMValueRef round_odd_f32(mpt_ce *e, LLVMValueRef d) {
    int w = mpt_ce_width(d);
    LLVMTypeRef vi = mpt_ce_vec(e->i32, w);
    LLVMValueRef f = LLVMBuildFPTrunc(e->b, d, mpt_ce_vec(e->f32, w), "");
    LLVMValueRef back = LLVMBuildFPExt(e->b, f, LLVMTypeOf(d), "");
    LLVMValueRef inexact = LLVMBuildFCmp(e->b, LLVMRealONE, back, d, "");
    LLVMValueRef bits = LLVMBuildBitCast(e->b, f, vi, "");
    LLVMValueRef even = LLVMBuildICmp(e->b, LLVMIntEQ,
                                      LLVMBuildAnd(e->b, bits, mpt_ce_iconst(e, e->i32, 1, w), ""),
                                      mpt_ce_iconst(e, e->i32, 0, w), "");
    LLVMValueRef up = LLVMBuildFCmp(e->b, LLVMRealOLT, mpt_ce_intr1(e, "llvm.fabs", back),
                                    mpt_ce_intr1(e, "llvm.fabs", d), "");
    LLVMValueRef step = LLVMBuildSelect(e->b, up, mpt_ce_iconst(e, e->i32, 1, w), mpt_ce_iconst(e, e->i32, -1, w), "");
    LLVMValueRef adj = LLVMBuildSelect(e->b, LLVMBuildAnd(e->b, inexact, even, ""), step,
                                       mpt_ce_iconst(e, e->i32, 0, w), "");
    return LLVMBuildBitCast(e->b, LLVMBuildAdd(e->b, bits, adj, ""), mpt_ce_vec(e->f32, w), "");
}

static LLVMValueRef sat_i32(mpt_ce *e, LLVMValueRef fp) {
    LLVMTypeRef tys[2] = {mpt_ce_vec(e->i32, mpt_ce_width(fp)), LLVMTypeOf(fp)};
    return mpt_ce_intrinsic(e, "llvm.fptosi.sat", tys, 2, &fp, 1);
}

static LLVMValueRef to_bool(mpt_ce *e, LLVMValueRef v, int is_int) {
    int w = mpt_ce_width(v);
    LLVMValueRef nz = is_int ? LLVMBuildICmp(e->b, LLVMIntNE, v, LLVMConstNull(LLVMTypeOf(v)), "")
                             : LLVMBuildFCmp(e->b, LLVMRealUNE, v, LLVMConstNull(LLVMTypeOf(v)), "");
    return LLVMBuildZExt(e->b, nz, mpt_ce_vec(e->i32, w), "");
}


/* v (in domain d) as a register value of dtype dt, rounded once */
LLVMValueRef mpt_ce_finish(mpt_ce *e, mpt_dtype dt, LLVMValueRef v, mpt_ce_dom d) {
    int w = mpt_ce_width(v);
    switch (dt) {
    case MPT_DT_F32: case MPT_DT_F16: case MPT_DT_BF16:
        if (d == MPT_CE_DOM_I) {
            v = LLVMBuildSIToFP(e->b, v, mpt_ce_vec(e->f64, w), "");
            d = MPT_CE_DOM_D;
        }
        if (d == MPT_CE_DOM_F) return mpt_ce_round_f32(e, dt, v);
        if (dt == MPT_DT_F32) return LLVMBuildFPTrunc(e->b, v, mpt_ce_vec(e->f32, w), "");
        return mpt_ce_round_f32(e, dt, round_odd_f32(e, v));
    case MPT_DT_I32: return d == MPT_CE_DOM_I ? v : sat_i32(e, v);
    case MPT_DT_BOOL: return to_bool(e, v, d == MPT_CE_DOM_I);
    case MPT_DT_F64: case MPT_DT_COUNT: break;
    }
    return v;
}

/* ---- loads and stores ---- */

static LLVMValueRef elem_ptr(mpt_ce *e, int node, LLVMTypeRef st, LLVMValueRef at) {
    LLVMValueRef p = LLVMBuildBitCast(e->b, e->buf[e->slot_of[node]], LLVMPointerType(st, 0), "");
    return LLVMBuildGEP2(e->b, st, p, &at, 1, "");
}

LLVMValueRef mpt_ce_ix_lanes(mpt_ce *e, const mpt_ix *ix) {
    if (ix->kind == MPT_IX_GATHER) return ix->vec;
    LLVMValueRef b = mpt_ce_splat(e, ix->base, ix->w);
    return ix->kind == MPT_IX_CONTIG ? LLVMBuildAdd(e->b, b, lane_ids(e, ix->w), "") : b;
}

static LLVMValueRef widen(mpt_ce *e, mpt_dtype dt, LLVMValueRef raw) {
    int w = mpt_ce_width(raw);
    switch (dt) {
    case MPT_DT_F32: case MPT_DT_I32: return raw;
    case MPT_DT_F16:
        return LLVMBuildFPExt(e->b, LLVMBuildBitCast(e->b, raw, mpt_ce_vec(e->half, w), ""),
                              mpt_ce_vec(e->f32, w), "");
    case MPT_DT_BF16: {
        LLVMValueRef u = LLVMBuildZExt(e->b, raw, mpt_ce_vec(e->i32, w), "");
        u = LLVMBuildShl(e->b, u, mpt_ce_iconst(e, e->i32, 16, w), "");
        return LLVMBuildBitCast(e->b, u, mpt_ce_vec(e->f32, w), "");
    }
    case MPT_DT_BOOL: return LLVMBuildZExt(e->b, raw, mpt_ce_vec(e->i32, w), "");
    case MPT_DT_F64: case MPT_DT_COUNT: break;
    }
    return raw;
}

static LLVMValueRef load(mpt_ce *e, int node, const mpt_ix *ix) {
    mpt_dtype dt = e->g->nodes[node].dtype;
    LLVMTypeRef st = store_type(e, dt);
    LLVMTypeRef vt = mpt_ce_vec(st, ix->w);
    unsigned align = (unsigned)mpt_dtype_size(dt);
    LLVMValueRef raw;
    if (ix->kind == MPT_IX_CONTIG || ix->w == 1) {
        LLVMValueRef p = elem_ptr(e, node, st, ix->kind == MPT_IX_GATHER
                                                   ? LLVMBuildExtractElement(e->b, ix->vec, LLVMConstInt(e->i32, 0, 0), "")
                                                   : ix->base);
        raw = LLVMBuildLoad2(e->b, vt, LLVMBuildBitCast(e->b, p, LLVMPointerType(vt, 0), ""), "");
        LLVMSetAlignment(raw, align);
    } else if (ix->kind == MPT_IX_UNIFORM) {
        LLVMValueRef s = LLVMBuildLoad2(e->b, st, elem_ptr(e, node, st, ix->base), "");
        LLVMSetAlignment(s, align);
        raw = mpt_ce_splat(e, s, ix->w);
    } else {
        raw = LLVMGetUndef(vt);
        for (int l = 0; l < ix->w; l++) {
            LLVMValueRef li = LLVMConstInt(e->i32, (unsigned long long)l, 0);
            LLVMValueRef at = LLVMBuildExtractElement(e->b, ix->vec, li, "");
            LLVMValueRef s = LLVMBuildLoad2(e->b, st, elem_ptr(e, node, st, at), "");
            LLVMSetAlignment(s, align);
            raw = LLVMBuildInsertElement(e->b, raw, s, li, "");
        }
    }
    return widen(e, dt, raw);
}

void mpt_ce_store(mpt_ce *e, int node, const mpt_ix *ix, LLVMValueRef v) {
    mpt_dtype dt = e->g->nodes[node].dtype;
    int w = ix->w;
    LLVMTypeRef st = store_type(e, dt);
    LLVMValueRef raw = v;
    switch (dt) {
    case MPT_DT_F32: case MPT_DT_I32: break;
    case MPT_DT_F16:
        raw = LLVMBuildBitCast(e->b, LLVMBuildFPTrunc(e->b, v, mpt_ce_vec(e->half, w), ""),
                               mpt_ce_vec(e->i16, w), "");
        break;
    case MPT_DT_BF16:
        raw = LLVMBuildTrunc(e->b, LLVMBuildLShr(e->b, bf16_bits(e, v), mpt_ce_iconst(e, e->i32, 16, w), ""),
                             mpt_ce_vec(e->i16, w), "");
        break;
    case MPT_DT_BOOL: raw = LLVMBuildTrunc(e->b, to_bool(e, v, 1), mpt_ce_vec(e->i8, w), ""); break;
    case MPT_DT_F64: case MPT_DT_COUNT:
        mpt_ce_fail(e, node, "f64 values exist only in the interpreter", w);
        return;
    }
    if (e->slot_of[node] < 0) {
        mpt_ce_fail(e, node, "value has no buffer", w);
        return;
    }
    LLVMTypeRef vt = mpt_ce_vec(st, w);
    LLVMValueRef p = elem_ptr(e, node, st, ix->base);
    LLVMValueRef s = LLVMBuildStore(e->b, raw, LLVMBuildBitCast(e->b, p, LLVMPointerType(vt, 0), ""));
    LLVMSetAlignment(s, (unsigned)mpt_dtype_size(dt));
}

/* ---- index arithmetic ---- */

typedef struct {
    int n;
    int64_t os[MPT_MAX_DIMS], od[MPT_MAX_DIMS], is[MPT_MAX_DIMS];
    int outer[MPT_MAX_DIMS]; /* term of output dim 0: no modulo needed */
} ix_terms;

static int64_t stride_of(mpt_shape s, int d) {
    int64_t st = 1;
    for (int j = d + 1; j < s.rank; j++) st *= s.dim[j];
    return st;
}

/* input offset = sum over terms of (i / os % od) * is */
static void terms_of(const mpt_graph *g, const mpt_node *nd, ix_terms *t) {
    mpt_shape os = nd->shape, is = g->nodes[nd->in[0]].shape;
    t->n = 0;
    for (int d = 0, k = 0; d < os.rank; d++) {
        int src = -1;
        if (nd->op == MPT_OP_TRANSPOSE) {
            src = (int)(nd->attr.i[0] >> (4 * d) & 15);
        } else if (nd->attr.i[0] >> d & 1) {
            src = is.dim[k] == 1 ? -1 : k; /* a size-1 dim repeats */
            k++;
        }
        if (src < 0) continue;
        t->os[t->n] = stride_of(os, d);
        t->od[t->n] = os.dim[d];
        t->is[t->n] = stride_of(is, src);
        t->outer[t->n] = d == 0;
        t->n++;
    }
}

static LLVMValueRef map_terms(mpt_ce *e, const ix_terms *t, LLVMValueRef i, int w) {
    int vec = w > 0;
    LLVMValueRef sum = vec ? mpt_ce_iconst(e, e->i64, 0, w) : mpt_ce_i64(e, 0);
#define K(v) (vec ? mpt_ce_iconst(e, e->i64, (v), w) : mpt_ce_i64(e, (v)))
    for (int k = 0; k < t->n; k++) {
        LLVMValueRef q = t->os[k] == 1 ? i : LLVMBuildUDiv(e->b, i, K(t->os[k]), "");
        if (!t->outer[k]) q = LLVMBuildURem(e->b, q, K(t->od[k]), "");
        if (t->is[k] != 1) q = LLVMBuildMul(e->b, q, K(t->is[k]), "");
        sum = LLVMBuildAdd(e->b, sum, q, "");
    }
#undef K
    return sum;
}

/* The index broadcast/transpose node nd reads its input at, for ix. */
static mpt_ix map_index(mpt_ce *e, const mpt_node *nd, const mpt_ix *ix) {
    mpt_shape os = nd->shape;
    if (mpt_shape_numel(e->g->nodes[nd->in[0]].shape) == 1)
        return mpt_ce_ix(e, MPT_IX_UNIFORM, ix->w, mpt_ce_i64(e, 0), 0);
    ix_terms t;
    terms_of(e->g, nd, &t);
    int64_t last = os.rank ? os.dim[os.rank - 1] : 1;
    if (ix->kind == MPT_IX_UNIFORM || ix->w == 1)
        return mpt_ce_ix(e, ix->w == 1 ? MPT_IX_CONTIG : MPT_IX_UNIFORM, ix->w,
                         map_terms(e, &t, ix->base, 0), 1);
    if (ix->kind == MPT_IX_CONTIG && ix->span > 0 && last % ix->span == 0) {
        /* the lanes share every dim but the last: one scalar mapping */
        LLVMValueRef j0 = map_terms(e, &t, ix->base, 0);
        for (int k = 0; k < t.n; k++) {
            if (t.os[k] != 1) continue;
            if (t.is[k] == 1) return mpt_ce_ix(e, MPT_IX_CONTIG, ix->w, j0, ix->span);
            mpt_ix g = mpt_ce_ix(e, MPT_IX_GATHER, ix->w, NULL, 0);
            g.vec = LLVMBuildAdd(e->b, mpt_ce_splat(e, j0, ix->w),
                                 LLVMBuildMul(e->b, lane_ids(e, ix->w), mpt_ce_iconst(e, e->i64, t.is[k], ix->w), ""), "");
            return g;
        }
        return mpt_ce_ix(e, MPT_IX_UNIFORM, ix->w, j0, 0);
    }
    mpt_ix g = mpt_ce_ix(e, MPT_IX_GATHER, ix->w, NULL, 0);
    g.vec = map_terms(e, &t, mpt_ce_ix_lanes(e, ix), ix->w);
    return g;
}

static mpt_ix gather_ix(mpt_ce *e, LLVMValueRef vec, int w) {
    mpt_ix g = mpt_ce_ix(e, MPT_IX_GATHER, w, NULL, 0);
    g.vec = vec;
    return g;
}

/* i64 lanes as the node's dtype (small exact integers) */
static LLVMValueRef from_i64(mpt_ce *e, mpt_dtype dt, LLVMValueRef v) {
    int w = mpt_ce_width(v);
    if (mpt_ce_is_int(dt)) return mpt_ce_finish(e, dt, LLVMBuildTrunc(e->b, v, mpt_ce_vec(e->i32, w), ""), MPT_CE_DOM_I);
    return mpt_ce_finish(e, dt, LLVMBuildSIToFP(e->b, v, mpt_ce_vec(e->f64, w), ""), MPT_CE_DOM_D);
}

/* splitmix64's step on i64 lanes, as ir/interp_impl.h's mpt_mix64 */
static LLVMValueRef mix64(mpt_ce *e, LLVMValueRef x) {
    int w = mpt_ce_width(x);
    LLVMValueRef z = LLVMBuildAdd(e->b, x, mpt_ce_iconst(e, e->i64, (int64_t)0x9E3779B97F4A7C15ull, w), "");
    z = LLVMBuildMul(e->b, LLVMBuildXor(e->b, z, LLVMBuildLShr(e->b, z, mpt_ce_iconst(e, e->i64, 30, w), ""), ""),
                     mpt_ce_iconst(e, e->i64, (int64_t)0xBF58476D1CE4E5B9ull, w), "");
    z = LLVMBuildMul(e->b, LLVMBuildXor(e->b, z, LLVMBuildLShr(e->b, z, mpt_ce_iconst(e, e->i64, 27, w), ""), ""),
                     mpt_ce_iconst(e, e->i64, (int64_t)0x94D049BB133111EBull, w), "");
    return LLVMBuildXor(e->b, z, LLVMBuildLShr(e->b, z, mpt_ce_iconst(e, e->i64, 31, w), ""), "");
}

/* ops whose element i reads computed places: iota, one_hot, gather, random,
 * slice, concat */
static LLVMValueRef indexed(mpt_ce *e, int id, const mpt_ix *ix) {
    const mpt_node *nd = &e->g->nodes[id];
    int w = ix->w;
    if (nd->op == MPT_OP_SLICE) return mpt_ce_slice(e, id, ix);
    if (nd->op == MPT_OP_CONCAT) return mpt_ce_concat(e, id, ix);
    LLVMValueRef i = mpt_ce_ix_lanes(e, ix);
    if (nd->op == MPT_OP_IOTA) {
        int ax = (int)nd->attr.i[0];
        LLVMValueRef q = LLVMBuildUDiv(e->b, i, mpt_ce_iconst(e, e->i64, stride_of(nd->shape, ax), w), "");
        return from_i64(e, nd->dtype, LLVMBuildURem(e->b, q, mpt_ce_iconst(e, e->i64, nd->shape.dim[ax], w), ""));
    }
    if (nd->op == MPT_OP_ONE_HOT) {
        LLVMValueRef depth = mpt_ce_iconst(e, e->i64, nd->attr.i[0], w);
        mpt_ix r = gather_ix(e, LLVMBuildUDiv(e->b, i, depth, ""), w);
        LLVMValueRef dd = LLVMBuildURem(e->b, i, depth, "");
        LLVMValueRef ids = mpt_ce_value(e, nd->in[0], &r), hit;
        if (mpt_ce_is_int(e->g->nodes[nd->in[0]].dtype))
            hit = LLVMBuildICmp(e->b, LLVMIntEQ, LLVMBuildSExt(e->b, ids, mpt_ce_vec(e->i64, w), ""), dd, "");
        else
            hit = LLVMBuildFCmp(e->b, LLVMRealOEQ, LLVMBuildFPExt(e->b, ids, mpt_ce_vec(e->f64, w), ""),
                                LLVMBuildSIToFP(e->b, dd, mpt_ce_vec(e->f64, w), ""), "");
        return from_i64(e, nd->dtype, LLVMBuildZExt(e->b, hit, mpt_ce_vec(e->i64, w), ""));
    }
    if (nd->op == MPT_OP_GATHER) {
        const mpt_node *tab = &e->g->nodes[nd->in[0]];
        int64_t V = tab->shape.dim[0], D = tab->shape.dim[1];
        mpt_ix r = gather_ix(e, LLVMBuildUDiv(e->b, i, mpt_ce_iconst(e, e->i64, D, w), ""), w);
        LLVMValueRef col = LLVMBuildURem(e->b, i, mpt_ce_iconst(e, e->i64, D, w), "");
        LLVMValueRef ids = mpt_ce_value(e, nd->in[1], &r);
        if (!mpt_ce_is_int(e->g->nodes[nd->in[1]].dtype))
            return mpt_ce_fail(e, id, "gather ids must be i32", w);
        LLVMValueRef id64 = LLVMBuildSExt(e->b, ids, mpt_ce_vec(e->i64, w), "");
        LLVMValueRef ok = LLVMBuildAnd(e->b, LLVMBuildICmp(e->b, LLVMIntSGE, id64, mpt_ce_iconst(e, e->i64, 0, w), ""),
                                       LLVMBuildICmp(e->b, LLVMIntSLT, id64, mpt_ce_iconst(e, e->i64, V, w), ""), "");
        LLVMValueRef at = LLVMBuildAdd(e->b, LLVMBuildMul(e->b, id64, mpt_ce_iconst(e, e->i64, D, w), ""), col, "");
        mpt_ix t = gather_ix(e, LLVMBuildSelect(e->b, ok, at, mpt_ce_iconst(e, e->i64, 0, w), ""), w);
        LLVMValueRef v = mpt_ce_value(e, nd->in[0], &t);
        return LLVMBuildSelect(e->b, ok, v, LLVMConstNull(LLVMTypeOf(v)), "");
    }
    if (nd->op == MPT_OP_RANDOM_UNIFORM) {
        mpt_ix z = mpt_ce_ix(e, MPT_IX_UNIFORM, w, mpt_ce_i64(e, 0), 0);
        LLVMValueRef c = mpt_ce_value(e, nd->in[0], &z); /* i32 counter */
        if (!mpt_ce_is_int(e->g->nodes[nd->in[0]].dtype)) return mpt_ce_fail(e, id, "counter must be i32", w);
        LLVMValueRef h = mix64(e, mpt_ce_iconst(e, e->i64, nd->attr.i[0], w));
        h = mix64(e, LLVMBuildXor(e->b, h, LLVMBuildZExt(e->b, c, mpt_ce_vec(e->i64, w), ""), ""));
        /* a data-parallel rank's slice of the global batch's draws: the
         * rank is fixed for the process, so the offset is a constant */
        int64_t at = (int64_t)mpt_collective_get()->rank * nd->attr.i[1];
        if (at) i = LLVMBuildAdd(e->b, i, mpt_ce_iconst(e, e->i64, at, w), "");
        h = mix64(e, LLVMBuildXor(e->b, h, i, ""));
        int keep = nd->dtype == MPT_DT_F16 ? 11 : nd->dtype == MPT_DT_BF16 ? 8 : 24;
        LLVMValueRef bits = LLVMBuildLShr(e->b, h, mpt_ce_iconst(e, e->i64, 64 - keep, w), "");
        LLVMValueRef u = LLVMBuildFMul(e->b, LLVMBuildUIToFP(e->b, bits, mpt_ce_vec(e->f64, w), ""),
                                       mpt_ce_fconst(e, e->f64, ldexp(1.0, -keep), w), "");
        return mpt_ce_finish(e, nd->dtype, u, MPT_CE_DOM_D);
    }
    return mpt_ce_fail(e, id, "op cannot be computed element by element in this kernel", w);
}

/* ---- the composition ---- */

LLVMValueRef mpt_ce_value(mpt_ce *e, int id, const mpt_ix *ix) {
    LLVMValueRef hit = memo_find(e, id, ix->id);
    if (hit) return hit;
    const mpt_node *nd = &e->g->nodes[id];
    LLVMValueRef v;
    if (nd->dtype == MPT_DT_F64) return mpt_ce_fail(e, id, "f64 values exist only in the interpreter", ix->w);
    if (nd->op == MPT_OP_CONST) {
        v = mpt_ce_is_int(nd->dtype) ? mpt_ce_iconst(e, e->i32, (int64_t)nd->attr.f, ix->w)
                                     : mpt_ce_fconst(e, e->f32, nd->attr.f, ix->w);
    } else if (!e->in_fn[id]) {
        if (e->slot_of[id] < 0) return mpt_ce_fail(e, id, "value has no buffer", ix->w);
        v = load(e, id, ix);
    } else if (nd->op == MPT_OP_RESHAPE) {
        v = mpt_ce_value(e, nd->in[0], ix); /* row-major: the same linear index */
    } else if (nd->op == MPT_OP_BROADCAST && e->alias_on && e->row_ix &&
               mpt_shape_eq(nd->shape, e->alias_shape) && nd->attr.i[0] == e->alias_mask) {
        v = mpt_ce_value(e, nd->in[0], e->row_ix);
        if (e->row_ix->w != ix->w)
            v = mpt_ce_splat(e, LLVMBuildExtractElement(e->b, v, LLVMConstInt(e->i32, 0, 0), ""), ix->w);
    } else if (nd->op == MPT_OP_BROADCAST || nd->op == MPT_OP_TRANSPOSE) {
        mpt_ix j = map_index(e, nd, ix);
        v = mpt_ce_value(e, nd->in[0], &j);
    } else if (mpt_op_table[nd->op].kind == MPT_KIND_ELEMENTWISE) {
        v = mpt_ce_elementwise(e, id, ix);
    } else {
        v = indexed(e, id, ix);
    }
    mpt_ce_bind(e, id, ix, v);
    return v;
}

/* ---- LOOP kernels ---- */

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The longest run of linear indices the index ops the targets depend on
 * can all take as one vector: each needs its lanes inside one row of its
 * last dim. */
static void span_walk(mpt_ce *e, int id, char *seen, int64_t *s) {
    if (!e->in_fn[id] || seen[id]) return;
    seen[id] = 1;
    const mpt_node *nd = &e->g->nodes[id];
    int index_op = nd->op == MPT_OP_TRANSPOSE || nd->op == MPT_OP_IOTA ||
                   nd->op == MPT_OP_ONE_HOT || nd->op == MPT_OP_GATHER ||
                   nd->op == MPT_OP_SLICE || nd->op == MPT_OP_CONCAT ||
                   (nd->op == MPT_OP_BROADCAST && mpt_shape_numel(e->g->nodes[nd->in[0]].shape) > 1);
    if (index_op) {
        int64_t last = nd->shape.rank ? nd->shape.dim[nd->shape.rank - 1] : 1;
        if (nd->op == MPT_OP_CONCAT) last = mpt_ce_concat_run(e, id);
        *s = *s ? gcd64(*s, last) : last;
    }
    for (int q = 0; q < nd->n_in; q++) span_walk(e, nd->in[q], seen, s);
}

static int64_t row_span(mpt_ce *e, const int *targets, int n, int64_t total) {
    int64_t s = 0;
    char *seen = calloc((size_t)e->g->n_nodes + 1, 1);
    if (!seen) return 1; /* one lane at a time is always right */
    for (int t = 0; t < n; t++) span_walk(e, targets[t], seen, &s);
    for (int t = 0; t < e->n_and; t++) span_walk(e, e->and_targets[t], seen, &s);
    free(seen);
    return s ? s : total;
}

/* Column flag of reduce_all node r (bool [N] over the rows of its [.., N]
 * input) at ix: where a lane's input is false, its column's flag becomes 0.
 * Only zeros are stored, in a branch taken only then, so threads covering
 * the same columns never undo each other and the flags (set to 1 before
 * the loop) end as the AND over the rows whatever the split. */
static void and_column(mpt_ce *e, int r, const mpt_ix *ix) {
    const mpt_node *nd = &e->g->nodes[r];
    int w = ix->w;
    LLVMValueRef v = mpt_ce_value(e, nd->in[0], ix);
    LLVMValueRef zero = LLVMBuildICmp(e->b, LLVMIntEQ, v, LLVMConstNull(LLVMTypeOf(v)), "");
    LLVMValueRef any = w == 1 ? LLVMBuildExtractElement(e->b, zero, LLVMConstInt(e->i32, 0, 0), "")
                              : mpt_ce_intr1(e, "llvm.vector.reduce.or", zero);
    LLVMBasicBlockRef slow = LLVMAppendBasicBlockInContext(e->c, e->fn, "and.clear");
    LLVMBasicBlockRef cont = LLVMAppendBasicBlockInContext(e->c, e->fn, "and.done");
    LLVMBuildCondBr(e->b, any, slow, cont);
    LLVMPositionBuilderAtEnd(e->b, slow);
    LLVMValueRef n_col = mpt_ce_i64(e, nd->shape.dim[0]);
    for (int l = 0; l < w; l++) {
        LLVMValueRef z = LLVMBuildExtractElement(e->b, zero, LLVMConstInt(e->i32, (unsigned)l, 0), "");
        LLVMBasicBlockRef st = LLVMAppendBasicBlockInContext(e->c, e->fn, "and.lane");
        LLVMBasicBlockRef nx = LLVMAppendBasicBlockInContext(e->c, e->fn, "and.next");
        LLVMBuildCondBr(e->b, z, st, nx);
        LLVMPositionBuilderAtEnd(e->b, st);
        LLVMValueRef col = LLVMBuildURem(e->b, LLVMBuildAdd(e->b, ix->base, mpt_ce_i64(e, l), ""),
                                         n_col, "");
        LLVMBuildStore(e->b, LLVMConstInt(e->i8, 0, 0), elem_ptr(e, r, e->i8, col));
        LLVMBuildBr(e->b, nx);
        LLVMPositionBuilderAtEnd(e->b, nx);
    }
    LLVMBuildBr(e->b, cont);
    LLVMPositionBuilderAtEnd(e->b, cont);
}

static void loop_body(mpt_ce *e, const int *targets, int n, LLVMValueRef at, int w, int64_t span) {
    int mark = mpt_ce_mark(e);
    mpt_ix ix = mpt_ce_ix(e, MPT_IX_CONTIG, w, at, span);
    for (int t = 0; t < n; t++) mpt_ce_store(e, targets[t], &ix, mpt_ce_value(e, targets[t], &ix));
    for (int t = 0; t < e->n_and; t++) and_column(e, e->and_targets[t], &ix);
    mpt_ce_release(e, mark);
}

/* for row in [lo, hi) by L: vectors of W while they fit, then single lanes */
int mpt_ce_emit_loop(mpt_ce *e, const int *targets, int n_targets, mpt_cpu_fn *out) {
    if (!n_targets && !e->n_and) {
        e->err = "a loop kernel without outputs";
        return -1;
    }
    int first = n_targets ? targets[0] : e->g->nodes[e->and_targets[0]].in[0];
    int64_t total = mpt_shape_numel(e->g->nodes[first].shape);
    for (int t = 0; t < e->n_and; t++)
        if (mpt_shape_numel(e->g->nodes[e->g->nodes[e->and_targets[t]].in[0]].shape) != total) {
            e->err = "a column reduction must read values of the loop's element count";
            e->err_node = e->and_targets[t];
            return -1;
        }
    for (int t = 1; t < n_targets; t++)
        if (mpt_shape_numel(e->g->nodes[targets[t]].shape) != total) {
            e->err = "a loop kernel's outputs must have equal element counts";
            e->err_node = targets[t];
            return -1;
        }
    int64_t L = row_span(e, targets, n_targets, total);
    int flat = L == total;
    out->total = total;
    out->grain = flat ? 64 * (int64_t)e->W : L;
    out->work = total;
    snprintf(out->name, sizeof out->name, "%s", LLVMGetValueName2(e->fn, &(size_t){0}));
    LLVMValueRef lo = LLVMGetParam(e->fn, 1), hi = LLVMGetParam(e->fn, 2);
    mpt_ce_loop rows;
    LLVMValueRef r0 = lo, rend = hi;
    if (!flat) { /* lo and hi are multiples of L, which divides total */
        mpt_ce_loop_begin(e, &rows, lo, hi, L, "row");
        r0 = mpt_ce_loop_iv(e, &rows);
        rend = LLVMBuildAdd(e->b, r0, mpt_ce_i64(e, L), "");
    }
    mpt_ce_loop vl;
    mpt_ce_loop_begin(e, &vl, r0, rend, e->W, "vec");
    loop_body(e, targets, n_targets, mpt_ce_loop_iv(e, &vl), e->W, L);
    mpt_ce_loop_end(e, &vl);
    mpt_ce_loop tl;
    mpt_ce_loop_begin(e, &tl, mpt_ce_loop_iv(e, &vl), rend, 1, "tail");
    loop_body(e, targets, n_targets, mpt_ce_loop_iv(e, &tl), 1, L);
    mpt_ce_loop_end(e, &tl);
    if (!flat) mpt_ce_loop_end(e, &rows);
    return e->err ? -1 : 0;
}
