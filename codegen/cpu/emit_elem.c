/* codegen/cpu/emit_elem.c — the element generators: one per op, a table
 * from op to generator (the renderer), and their composition for one
 * elementwise node. The numerics are explained at the top of emit_loop.c. */
#include <math.h>
#include <string.h>

#include "codegen/cpu/emit.h"

/* ---- element generators: one per op, in three flavours ----
 * f:  f32 operands, exact in f32 (see the top of the file);
 * d:  double operands (floats widened, ints converted), for the rest;
 * i:  i32/bool operands where integer code is exact.
 * Each returns its result and sets *d to its domain. */

LLVMValueRef mpt_ce_max_nan(mpt_ce *e, LLVMValueRef a, LLVMValueRef b, int is_int, int is_min) {
    if (is_int) return LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, is_min ? LLVMIntSLT : LLVMIntSGT, a, b, ""), a, b, "");
    /* (a > b || isnan(a)) ? a : b, as ir/interp_ops.c's max_nan */
    LLVMValueRef gt = LLVMBuildFCmp(e->b, is_min ? LLVMRealOLT : LLVMRealOGT, a, b, "");
    LLVMValueRef nan = LLVMBuildFCmp(e->b, LLVMRealUNO, a, a, "");
    return LLVMBuildSelect(e->b, LLVMBuildOr(e->b, gt, nan, ""), a, b, "");
}

typedef LLVMValueRef (*gen_fn)(mpt_ce *e, LLVMValueRef *a, mpt_ce_dom *d);

#define GEN(name) static LLVMValueRef name(mpt_ce *e, LLVMValueRef *a, mpt_ce_dom *d)
#define ONE(t) mpt_ce_fconst(e, t, 1.0, mpt_ce_width(a[0]))
static LLVMTypeRef elt(LLVMValueRef v) { return LLVMGetElementType(LLVMTypeOf(v)); }

GEN(g_neg) { return LLVMBuildFNeg(e->b, a[0], ""); }
GEN(g_abs) { return mpt_ce_intr1(e, "llvm.fabs", a[0]); }
GEN(g_sqrt) { return mpt_ce_intr1(e, "llvm.sqrt", a[0]); }
GEN(g_recip) { return LLVMBuildFDiv(e->b, ONE(elt(a[0])), a[0], ""); }
GEN(g_square) { return LLVMBuildFMul(e->b, a[0], a[0], ""); }
GEN(g_relu) { return mpt_ce_max_nan(e, a[0], LLVMConstNull(LLVMTypeOf(a[0])), 0, 0); }
GEN(g_add) { return LLVMBuildFAdd(e->b, a[0], a[1], ""); }
GEN(g_sub) { return LLVMBuildFSub(e->b, a[0], a[1], ""); }
GEN(g_mul) { return LLVMBuildFMul(e->b, a[0], a[1], ""); }
GEN(g_div) { return LLVMBuildFDiv(e->b, a[0], a[1], ""); }
GEN(g_max) { return mpt_ce_max_nan(e, a[0], a[1], 0, 0); }
GEN(g_min) { return mpt_ce_max_nan(e, a[0], a[1], 0, 1); }
static LLVMValueRef bool_of(mpt_ce *e, LLVMValueRef c, mpt_ce_dom *d) {
    *d = MPT_CE_DOM_I;
    return LLVMBuildZExt(e->b, c, mpt_ce_vec(e->i32, mpt_ce_width(c)), "");
}
GEN(g_lt) { return bool_of(e, LLVMBuildFCmp(e->b, LLVMRealOLT, a[0], a[1], ""), d); }
GEN(g_gt) { return bool_of(e, LLVMBuildFCmp(e->b, LLVMRealOGT, a[0], a[1], ""), d); }
GEN(g_eq) { return bool_of(e, LLVMBuildFCmp(e->b, LLVMRealOEQ, a[0], a[1], ""), d); }
GEN(g_is_finite) {
    LLVMValueRef inf = mpt_ce_fconst(e, elt(a[0]), INFINITY, mpt_ce_width(a[0]));
    return bool_of(e, LLVMBuildFCmp(e->b, LLVMRealONE, mpt_ce_intr1(e, "llvm.fabs", a[0]), inf, ""), d);
}
GEN(g_select) {
    LLVMValueRef c = LLVMBuildICmp(e->b, LLVMIntNE, a[0], LLVMConstNull(LLVMTypeOf(a[0])), "");
    return LLVMBuildSelect(e->b, c, a[1], a[2], "");
}

/* double flavours */
GEN(d_exp) { return mpt_vm_exp(e->b, e->m, a[0]); }
GEN(d_log) { return mpt_vm_log(e->b, e->m, a[0]); }
GEN(d_rsqrt) { return LLVMBuildFDiv(e->b, ONE(e->f64), mpt_ce_intr1(e, "llvm.sqrt", a[0]), ""); }
GEN(d_sigmoid) {
    LLVMValueRef ex = mpt_vm_exp(e->b, e->m, LLVMBuildFNeg(e->b, a[0], ""));
    return LLVMBuildFDiv(e->b, ONE(e->f64), LLVMBuildFAdd(e->b, ONE(e->f64), ex, ""), "");
}
GEN(d_tanh) { return mpt_vm_tanh(e->b, e->m, a[0]); }
/* libm's, through LLVM's intrinsics (a call per element): only the
 * learning-rate schedules use them, on one scalar a step, and the
 * interpreter's sin/cos are then matched to the bit */
GEN(d_sin) {
    LLVMTypeRef t = LLVMTypeOf(a[0]);
    return mpt_ce_intrinsic(e, "llvm.sin", &t, 1, a, 1);
}
GEN(d_cos) {
    LLVMTypeRef t = LLVMTypeOf(a[0]);
    return mpt_ce_intrinsic(e, "llvm.cos", &t, 1, a, 1);
}
GEN(d_gelu) { return mpt_vm_gelu(e->b, e->m, a[0], 0); }
GEN(d_gelu_grad) { return mpt_vm_gelu(e->b, e->m, a[0], 1); }
GEN(d_pow) {
    LLVMTypeRef t = LLVMTypeOf(a[0]);
    return mpt_ce_intrinsic(e, "llvm.pow", &t, 1, a, 2);
}

/* integer flavours */
static LLVMValueRef icmp_bool(mpt_ce *e, LLVMIntPredicate p, LLVMValueRef *a, mpt_ce_dom *d) {
    return bool_of(e, LLVMBuildICmp(e->b, p, a[0], a[1], ""), d);
}
GEN(i_lt) { return icmp_bool(e, LLVMIntSLT, a, d); }
GEN(i_gt) { return icmp_bool(e, LLVMIntSGT, a, d); }
GEN(i_eq) { return icmp_bool(e, LLVMIntEQ, a, d); }
GEN(i_and) {
    LLVMValueRef z = LLVMConstNull(LLVMTypeOf(a[0]));
    return bool_of(e, LLVMBuildAnd(e->b, LLVMBuildICmp(e->b, LLVMIntNE, a[0], z, ""),
                                   LLVMBuildICmp(e->b, LLVMIntNE, a[1], z, ""), ""), d);
}
GEN(i_not) { return bool_of(e, LLVMBuildICmp(e->b, LLVMIntEQ, a[0], LLVMConstNull(LLVMTypeOf(a[0])), ""), d); }
GEN(i_is_finite) { return bool_of(e, LLVMBuildICmp(e->b, LLVMIntEQ, a[0], a[0], ""), d); }
GEN(i_select) { *d = MPT_CE_DOM_I; return g_select(e, a, d); }
GEN(i_max) { *d = MPT_CE_DOM_I; return mpt_ce_max_nan(e, a[0], a[1], 1, 0); }
GEN(i_min) { *d = MPT_CE_DOM_I; return mpt_ce_max_nan(e, a[0], a[1], 1, 1); }

/* The renderer table: op -> its generators (NULL: that flavour does not exist). */
static const struct { gen_fn f, d, i; } gens[MPT_OP_COUNT] = {
    [MPT_OP_NEG] = {g_neg, g_neg, NULL},
    [MPT_OP_ABS] = {g_abs, g_abs, NULL},
    [MPT_OP_EXP] = {NULL, d_exp, NULL},
    [MPT_OP_LOG] = {NULL, d_log, NULL},
    [MPT_OP_SQRT] = {g_sqrt, g_sqrt, NULL},
    [MPT_OP_RSQRT] = {NULL, d_rsqrt, NULL},
    [MPT_OP_RECIP] = {g_recip, g_recip, NULL},
    [MPT_OP_SQUARE] = {g_square, g_square, NULL},
    [MPT_OP_RELU] = {g_relu, g_relu, NULL},
    [MPT_OP_SIGMOID] = {NULL, d_sigmoid, NULL},
    [MPT_OP_TANH] = {NULL, d_tanh, NULL},
    [MPT_OP_SIN] = {NULL, d_sin, NULL},
    [MPT_OP_COS] = {NULL, d_cos, NULL},
    [MPT_OP_GELU] = {NULL, d_gelu, NULL},
    [MPT_OP_GELU_GRAD] = {NULL, d_gelu_grad, NULL},
    [MPT_OP_IS_FINITE] = {g_is_finite, g_is_finite, i_is_finite},
    [MPT_OP_NOT] = {NULL, NULL, i_not},
    [MPT_OP_ADD] = {g_add, g_add, NULL},
    [MPT_OP_SUB] = {g_sub, g_sub, NULL},
    [MPT_OP_MUL] = {g_mul, g_mul, NULL},
    [MPT_OP_DIV] = {g_div, g_div, NULL},
    [MPT_OP_MAX] = {g_max, g_max, i_max},
    [MPT_OP_MIN] = {g_min, g_min, i_min},
    [MPT_OP_POW] = {NULL, d_pow, NULL},
    [MPT_OP_LT] = {g_lt, g_lt, i_lt},
    [MPT_OP_GT] = {g_gt, g_gt, i_gt},
    [MPT_OP_EQ] = {g_eq, g_eq, i_eq},
    [MPT_OP_AND] = {NULL, NULL, i_and},
    [MPT_OP_SELECT] = {g_select, NULL, i_select},
};

LLVMValueRef mpt_ce_elementwise(mpt_ce *e, int id, const mpt_ix *ix) {
    const mpt_node *nd = &e->g->nodes[id];
    LLVMValueRef a[MPT_MAX_INPUTS];
    for (int k = 0; k < nd->n_in; k++) a[k] = mpt_ce_value(e, nd->in[k], ix);
    if (nd->op == MPT_OP_CAST)
        return mpt_ce_finish(e, nd->dtype, a[0], mpt_ce_is_int(e->g->nodes[nd->in[0]].dtype) ? MPT_CE_DOM_I : MPT_CE_DOM_F);
    /* the operands' dtype picks the flavour (select: its values') */
    int ints = mpt_ce_is_int(e->g->nodes[nd->in[nd->op == MPT_OP_SELECT ? 1 : 0]].dtype);
    mpt_ce_dom d = MPT_CE_DOM_F;
    gen_fn f = NULL;
    if (ints && gens[nd->op].i) {
        f = gens[nd->op].i;
        d = MPT_CE_DOM_I;
    } else if (!ints && gens[nd->op].f) {
        f = gens[nd->op].f;
    } else if (gens[nd->op].d) {
        f = gens[nd->op].d;
        d = MPT_CE_DOM_D;
        LLVMTypeRef vd = mpt_ce_vec(e->f64, ix->w);
        for (int k = 0; k < nd->n_in; k++)
            a[k] = ints ? LLVMBuildSIToFP(e->b, a[k], vd, "") : LLVMBuildFPExt(e->b, a[k], vd, "");
    }
    if (!f) return mpt_ce_fail(e, id, "op has no CPU element generator for this dtype", ix->w);
    LLVMValueRef v = f(e, a, &d);
    return mpt_ce_finish(e, nd->dtype, v, d);
}

