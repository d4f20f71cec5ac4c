/* codegen/cpu/gemm_epi.c — the GEMM macro-kernel's epilogue (codegen/cpu/
 * gemm_gen.c): the fused steps applied to each f32 accumulator vector, the
 * math they need, and C's store in its dtype.
 */
#include <math.h>

#include "codegen/cpu/gemm_ir.h"

/* <vl x f32> -> bf16 bits, rounding to nearest even; NaN stays a quiet NaN.
 * With denormals flushed (desc.flush_denormals) on an AVX512_BF16 host, one
 * vcvtneps2bf16: it rounds the same way and quiets NaNs the same way, and
 * takes a denormal input as zero, which under the step's FTZ no GEMM result
 * is (FMAs, AMX tiles and the epilogue's arithmetic all flush), where the
 * integer sequence below costs nine instructions a vector: a 32 x 32 tile's
 * store with K = 256 took about a third as long as its products. */
static LLVMValueRef f32_to_bf16(mpt_cpu_gen *g, LLVMValueRef x) {
    if (g->cvt_bf16) {
        LLVMValueRef r = call_intrinsic(g, "llvm.x86.avx512bf16.cvtneps2bf16.512", NULL, 0, &x, 1);
        return LLVMBuildBitCast(g->b, r, g->vi16, "");
    }
    LLVMValueRef u = LLVMBuildBitCast(g->b, x, g->vi32, "");
    LLVMValueRef lsb =
        LLVMBuildAnd(g->b, LLVMBuildLShr(g->b, u, vconst_i32(g, 16), ""), vconst_i32(g, 1), "");
    LLVMValueRef r = LLVMBuildAdd(g->b, u, LLVMBuildAdd(g->b, lsb, vconst_i32(g, 0x7fff), ""), "");
    r = LLVMBuildLShr(g->b, r, vconst_i32(g, 16), "");
    LLVMValueRef nan = LLVMBuildFCmp(g->b, LLVMRealUNO, x, x, "");
    LLVMValueRef quiet =
        LLVMBuildOr(g->b, LLVMBuildLShr(g->b, u, vconst_i32(g, 16), ""), vconst_i32(g, 0x40), "");
    return LLVMBuildTrunc(g->b, LLVMBuildSelect(g->b, nan, quiet, r, ""), g->vi16, "");
}

void mpt_cpu_gemm_store_vec(mpt_cpu_gen *g, mpt_dtype dt, LLVMValueRef x, LLVMValueRef base,
                            LLVMValueRef idx, LLVMValueRef mask) {
    switch (dt) {
    case MPT_DT_F32: masked_store(g, x, addr(g, base, idx, 4, g->vf), mask, 4); return;
    case MPT_DT_F16: {
        LLVMValueRef h = LLVMBuildFPTrunc(g->b, x, g->vh, "");
        masked_store(g, LLVMBuildBitCast(g->b, h, g->vi16, ""), addr(g, base, idx, 2, g->vi16),
                     mask, 2);
        return;
    }
    case MPT_DT_BF16:
        masked_store(g, f32_to_bf16(g, x), addr(g, base, idx, 2, g->vi16), mask, 2);
        return;
    case MPT_DT_I32:
    case MPT_DT_BOOL:
    case MPT_DT_F64:
    case MPT_DT_COUNT: break;
    }
}

/* ---- epilogue math, on <vl x f32> ---- */

/* x rounded to dt (f16 or bf16) and widened back: the value a
 * low-precision node holds, rounded as C's store rounds it */
static LLVMValueRef round_to(mpt_cpu_gen *g, mpt_dtype dt, LLVMValueRef x) {
    if (dt == MPT_DT_F16)
        return LLVMBuildFPExt(g->b, LLVMBuildFPTrunc(g->b, x, g->vh, ""), g->vf, "");
    if (dt != MPT_DT_BF16)
        return x;
    LLVMValueRef w = LLVMBuildZExt(g->b, f32_to_bf16(g, x), g->vi32, "");
    return LLVMBuildBitCast(g->b, LLVMBuildShl(g->b, w, vconst_i32(g, 16), ""), g->vf, "");
}

static LLVMValueRef poly(mpt_cpu_gen *g, LLVMValueRef x, const double *c, int n) {
    LLVMValueRef p = vconst(g, c[0]);
    for (int i = 1; i < n; i++)
        p = vfma(g, p, x, vconst(g, c[i]));
    return p;
}

static LLVMValueRef fsel_lt(mpt_cpu_gen *g, LLVMValueRef a, LLVMValueRef b, LLVMValueRef t,
                            LLVMValueRef f) {
    return LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, LLVMRealOLT, a, b, ""), t, f, "");
}

/* e^x: n = round(x / ln 2), r = x - n ln 2 in two parts, a degree-6
 * polynomial for e^r (relative error ~1e-7) times 2^n built in the exponent
 * bits. The clamp keeps 2^n a normal number; NaN passes through. */
static LLVMValueRef vexp(mpt_cpu_gen *g, LLVMValueRef x) {
    static const double p[] = {1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
                               4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1};
    x = fsel_lt(g, x, vconst(g, -87.3), vconst(g, -87.3), x);
    x = fsel_lt(g, vconst(g, 88.3), x, vconst(g, 88.3), x);
    LLVMValueRef n =
        vunary(g, "llvm.floor", vfma(g, x, vconst(g, 1.44269504088896341), vconst(g, 0.5)));
    LLVMValueRef r = vfma(g, n, vconst(g, -0.693359375), x);
    r = vfma(g, n, vconst(g, 2.12194440e-4), r);
    LLVMValueRef r2 = LLVMBuildFMul(g->b, r, r, "");
    LLVMValueRef y = vfma(g, poly(g, r, p, 6), r2, LLVMBuildFAdd(g->b, r, vconst(g, 1.0), ""));
    LLVMValueRef e = LLVMBuildFPToSI(g->b, n, g->vi32, "");
    e = LLVMBuildShl(g->b, LLVMBuildAdd(g->b, e, vconst_i32(g, 127), ""), vconst_i32(g, 23), "");
    return LLVMBuildFMul(g->b, y, LLVMBuildBitCast(g->b, e, g->vf, ""), "");
}

static LLVMValueRef vsigmoid(mpt_cpu_gen *g, LLVMValueRef x) {
    LLVMValueRef e = vexp(g, LLVMBuildFNeg(g->b, x, ""));
    return LLVMBuildFDiv(g->b, vconst(g, 1.0), LLVMBuildFAdd(g->b, e, vconst(g, 1.0), ""), "");
}

/* Odd polynomial near 0 (where 1 - 2/(e^2x + 1) would cancel), the exp form
 * elsewhere with the sign of x. */
static LLVMValueRef vtanh(mpt_cpu_gen *g, LLVMValueRef x) {
    static const double p[] = {-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2,
                               1.33314422036e-1, -3.33332819422e-1};
    LLVMValueRef ax = vunary(g, "llvm.fabs", x);
    LLVMValueRef z = LLVMBuildFMul(g->b, x, x, "");
    LLVMValueRef small = vfma(g, LLVMBuildFMul(g->b, x, z, ""), poly(g, z, p, 5), x);
    LLVMValueRef e = vexp(g, LLVMBuildFMul(g->b, ax, vconst(g, 2.0), ""));
    LLVMValueRef big = LLVMBuildFSub(
        g->b, vconst(g, 1.0),
        LLVMBuildFDiv(g->b, vconst(g, 2.0), LLVMBuildFAdd(g->b, e, vconst(g, 1.0), ""), ""), "");
    LLVMValueRef args[2] = {big, x};
    LLVMTypeRef t = g->vf;
    big = call_intrinsic(g, "llvm.copysign", &t, 1, args, 2);
    return fsel_lt(g, ax, vconst(g, 0.625), small, big);
}

/* Phi(x), the standard normal CDF, in f32 with relative error about
 * 2^-21 everywhere it is a normal number, tails included.
 *
 * For a = |x|: Phi(-a) = exp(-a^2/2) Q(a) with Q(a) = erfcx(a/sqrt 2)/2,
 * smooth and slowly varying, so Q(a) = t f(t), t = 1 / (1 + a 17/64) in
 * (0, 1], f a degree-8 polynomial (a relative-error fit on a in [0, 13.3],
 * its own error 1.3e-8, 2^-21.4 with f32 rounding: docs/DECISIONS.md);
 * Phi(a) = 1 - Phi(-a). One exp and one division, where the form it
 * replaces (erfc as t exp(-z^2 + P(t)), Numerical Recipes' erfcc) needed
 * two exps and a degree-9 polynomial inside one of them, about 80
 * dependent operations: GPT's up-projection spent longer in its GELU
 * than in its products (one thread, GPT at context 512: the four GELUs'
 * GEMMs 14.0 -> 11.4 ms, the four gelu' ones 16.3 -> 15.0). Horner's
 * form: Estrin's shorter chain needs more live registers, and with two
 * rows of two vectors in flight the epilogue spilled (both slower than
 * Horner by 15%).
 *
 * An absolute error in the exponent is a relative error in the result,
 * and a^2/2 reaches ~87 before exp(-a^2/2) underflows, so x^2 carries its
 * rounding error (from an FMA) as a factor 1 - lo/2. Past |x| = 13.2 the
 * exp would underflow: it is 0 there, so Phi(x) is 0 or 1 and GELU's
 * gradient 1 or 0 with the interpreter's NaNs at infinities (inf * 0).
 * *pdf_e gets exp(-x^2/2), the normal density but for its 1/sqrt(2 pi). */
static LLVMValueRef vnormal_cdf(mpt_cpu_gen *g, LLVMValueRef x, LLVMValueRef *pdf_e) {
    static const double f[] = {3.067045433e-02, -1.423136625e-01, 2.121617430e-01,
                               -1.106311226e-01, 1.341949048e-01, 6.181820447e-02,
                               1.025737924e-01, 1.055369866e-01, 1.059887057e-01};
    LLVMValueRef a = vunary(g, "llvm.fabs", x);
    LLVMValueRef t =
        LLVMBuildFDiv(g->b, vconst(g, 1.0), vfma(g, a, vconst(g, 0.265625), vconst(g, 1.0)), "");
    LLVMValueRef fq = poly(g, t, f, 9);
    LLVMValueRef xx = LLVMBuildFMul(g->b, x, x, "");
    LLVMValueRef xx_lo = vfma(g, x, x, LLVMBuildFNeg(g->b, xx, ""));
    LLVMValueRef e = vexp(g, LLVMBuildFMul(g->b, xx, vconst(g, -0.5), ""));
    e = vfma(g, LLVMBuildFMul(g->b, e, xx_lo, ""), vconst(g, -0.5), e); /* e * exp(-lo/2) */
    e = fsel_lt(g, vconst(g, 13.2), a, vconst(g, 0.0), e);
    if (pdf_e)
        *pdf_e = e;
    LLVMValueRef tail = LLVMBuildFMul(g->b, e, LLVMBuildFMul(g->b, t, fq, ""), ""); /* Phi(-a) */
    return fsel_lt(g, x, vconst(g, 0.0), tail, LLVMBuildFSub(g->b, vconst(g, 1.0), tail, ""));
}

/* Exact GELU, x * Phi(x). */
static LLVMValueRef vgelu(mpt_cpu_gen *g, LLVMValueRef x) {
    return LLVMBuildFMul(g->b, x, vnormal_cdf(g, x, NULL), "");
}

/* GELU's derivative, Phi(x) + x phi(x) (the interpreter's gelu_grad). */
static LLVMValueRef vgelu_grad(mpt_cpu_gen *g, LLVMValueRef x) {
    LLVMValueRef e;
    LLVMValueRef cdf = vnormal_cdf(g, x, &e);
    LLVMValueRef xpdf = LLVMBuildFMul(g->b, x, LLVMBuildFMul(g->b, e, vconst(g, 0.39894228040143268), ""), "");
    return LLVMBuildFAdd(g->b, cdf, xpdf, "");
}

/* GELU (grad: its derivative) of x, a vector of f16/bf16 values, rounded
 * to dt (f16 or bf16) exactly as the interpreter rounds its f64 result:
 * looked up in gelu_table.c's table of every input's result, indexed by
 * x's 16 bits (x rounded to dt first, which leaves a dt value as it is).
 * One gather a vector. It replaced an f32 evaluation (vnormal_cdf) that
 * recomputed a whole vector in double wherever a lane fell near a rounding
 * midpoint or below -5: the gelu' steps of gpt_tiny's backward, whose
 * inputs cross gelu's zero of the derivative where its terms cancel, took
 * the double path often enough to cost as much as their products. */
static LLVMValueRef gelu_exact(mpt_cpu_gen *g, mpt_dtype dt, LLVMValueRef x, int grad) {
    mpt_cpu_gelu_table_fill(dt, grad);
    LLVMTypeRef at = LLVMArrayType(g->i32, 1 << 16);
    const char *name = mpt_cpu_gelu_table_name(dt, grad);
    LLVMValueRef table = LLVMGetNamedGlobal(g->m, name);
    if (!table) {
        table = LLVMAddGlobal(g->m, at, name);
        LLVMSetLinkage(table, LLVMExternalLinkage);
        LLVMSetGlobalConstant(table, 1);
        LLVMSetAlignment(table, 64);
    }
    LLVMValueRef idx;
    if (dt == MPT_DT_BF16) {
        LLVMValueRef bits = LLVMBuildBitCast(g->b, round_to(g, dt, x), g->vi32, "");
        idx = LLVMBuildLShr(g->b, bits, vconst_i32(g, 16), "");
    } else {
        LLVMValueRef h = LLVMBuildFPTrunc(g->b, x, g->vh, "");
        idx = LLVMBuildZExt(g->b, LLVMBuildBitCast(g->b, h, g->vi16, ""), g->vi32, "");
    }
    LLVMValueRef base = LLVMBuildBitCast(g->b, table, LLVMPointerType(g->i32, 0), "");
    LLVMValueRef ptrs = LLVMBuildGEP2(g->b, g->i32, base, &idx, 1, "");
    LLVMTypeRef over[2] = {g->vi32, LLVMTypeOf(ptrs)};
    LLVMValueRef args[4] = {ptrs, ci32(g, 4), LLVMConstAllOnes(g->vmask), LLVMGetUndef(g->vi32)};
    LLVMValueRef y = call_intrinsic(g, "llvm.masked.gather", over, 2, args, 4);
    return LLVMBuildBitCast(g->b, y, g->vf, "");
}

/* The finite check: where a lane of x (a valid column) is NaN or infinite,
 * its column's byte flag becomes 0. Only zeros are stored, in a branch
 * taken only then, so threads sharing columns never undo each other. */
static void finite_flags(mpt_cpu_gen *g, LLVMValueRef x, LLVMValueRef flags, LLVMValueRef col,
                         LLVMValueRef mask) {
    LLVMValueRef inf = vconst(g, INFINITY);
    /* |x| < inf is false for both infinities and (unordered) NaN */
    LLVMValueRef ok = LLVMBuildFCmp(g->b, LLVMRealOLT, vunary(g, "llvm.fabs", x), inf, "");
    LLVMValueRef bad = LLVMBuildAnd(g->b, LLVMBuildNot(g->b, ok, ""), mask, "");
    LLVMTypeRef mt = LLVMTypeOf(bad);
    LLVMValueRef any = call_intrinsic(g, "llvm.vector.reduce.or", &mt, 1, &bad, 1);
    LLVMBasicBlockRef clear = LLVMAppendBasicBlockInContext(g->c, g->fn, "finite.clear");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(g->c, g->fn, "finite.done");
    LLVMBuildCondBr(g->b, any, clear, done);
    LLVMPositionBuilderAtEnd(g->b, clear);
    LLVMTypeRef bt = LLVMVectorType(g->i8, (unsigned)g->s->vl);
    masked_store(g, LLVMConstNull(bt), addr(g, flags, col, 1, bt), bad, 1);
    LLVMBuildBr(g->b, done);
    LLVMPositionBuilderAtEnd(g->b, done);
}

LLVMValueRef mpt_cpu_gemm_apply_epilogue(mpt_cpu_gen *g, const mpt_cpu_gemm_desc *d,
                                         const mpt_cpu_epi_operand *ops, LLVMValueRef x,
                                         LLVMValueRef row, LLVMValueRef col, LLVMValueRef mask) {
    for (int i = 0; i < d->n_steps; i++) {
        const mpt_cpu_epi_step *st = &d->steps[i];
        LLVMValueRef idx = col;
        if (st->op == MPT_CPU_EPI_RESIDUAL || st->op == MPT_CPU_EPI_RELU_MASK ||
            st->op == MPT_CPU_EPI_GELU_GRAD || st->op == MPT_CPU_EPI_STORE)
            idx = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, row, ops[i].ld, ""), col, "");
        switch (st->op) {
        case MPT_CPU_EPI_BIAS:
        case MPT_CPU_EPI_RESIDUAL: {
            LLVMValueRef v = load_vec_f32(g, st->dt, ops[i].ptr, idx, mask);
            x = LLVMBuildFAdd(g->b, x, st->odt != st->dt ? round_to(g, st->odt, v) : v, "");
            break;
        }
        case MPT_CPU_EPI_ROUND: x = round_to(g, st->dt, x); break;
        case MPT_CPU_EPI_SCALE:
            x = LLVMBuildFMul(g->b, x, splat(g, ops[i].scalar, g->vf), "");
            break;
        case MPT_CPU_EPI_RELU:
            /* x > 0 or NaN ? x : +0, the interpreter's max(x, 0): NaN stays
             * NaN (maxnum would give 0), and -0 becomes +0 */
            x = LLVMBuildSelect(g->b, LLVMBuildFCmp(g->b, LLVMRealUGT, x, vconst(g, 0.0), ""), x,
                                vconst(g, 0.0), "");
            break;
        case MPT_CPU_EPI_SIGMOID: x = vsigmoid(g, x); break;
        case MPT_CPU_EPI_TANH: x = vtanh(g, x); break;
        case MPT_CPU_EPI_GELU: x = st->odt == MPT_DT_F32 ? vgelu(g, x) : gelu_exact(g, st->odt, x, 0); break;
        case MPT_CPU_EPI_RELU_MASK: {
            LLVMValueRef aux = load_vec_f32(g, st->dt, ops[i].ptr, idx, mask);
            LLVMValueRef on = LLVMBuildFCmp(g->b, LLVMRealOGT, aux, vconst(g, 0.0), "");
            x = LLVMBuildSelect(g->b, on, x, vconst(g, 0.0), "");
            break;
        }
        case MPT_CPU_EPI_GELU_GRAD: {
            LLVMValueRef aux = load_vec_f32(g, st->dt, ops[i].ptr, idx, mask);
            /* odt f16/bf16: the derivative is a node of that dtype,
             * rounded exactly before the product */
            x = LLVMBuildFMul(g->b, x,
                              st->odt == MPT_DT_F32 ? vgelu_grad(g, aux) : gelu_exact(g, st->odt, aux, 1), "");
            break;
        }
        case MPT_CPU_EPI_STORE: mpt_cpu_gemm_store_vec(g, st->dt, x, ops[i].ptr, idx, mask); break;
        case MPT_CPU_EPI_FINITE: finite_flags(g, x, ops[i].ptr, idx, mask); break;
        }
    }
    return x;
}
