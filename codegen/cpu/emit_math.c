/* codegen/cpu/emit_math.c — exp, log, tanh and erf on vectors of doubles,
 * built inline with the LLVM C API.
 *
 * The interpreter computes these in double with libm and rounds once to
 * the node's dtype. LLVM has no vector lowering for llvm.exp/llvm.log
 * without a vector math library, and none for tanh/erf at all, so calling
 * libm meant one scalar call per lane (a gelu MLP spent a third of its
 * step there). These run on whole vectors and stay within a few units in
 * the last place of double (exp, log 1; erf 2; tanh 4: tests/test_cpu_math.c
 * measures it against libm). A result rounded to f32, f16 or bf16 then
 * equals libm's rounded unless the exact value lies within those few
 * double ulps of a rounding boundary of the narrow type, about 2^-27 of
 * values; the tests' inputs never hit one (docs/DECISIONS.md).
 *
 *   exp(x)   x = n ln2 + r, |r| <= ln2/2, n by the 1.5 * 2^52 shifter; e^r
 *            by its Taylor series to r^13 (the rest < 2^-57); 2^n applied
 *            as two powers of two so that subnormal results round once.
 *   expm1(y) the same reduction, 2^n - 1 + 2^n (e^r - 1) (y >= 0 here).
 *   log(x)   x = 2^k m, m in [sqrt(1/2), sqrt(2)), f = m - 1, s = f/(2+f):
 *            log(1+f) = f - (f^2/2 - s (f^2/2 + R(s^2))), R the atanh
 *            series to s^20, k ln2 added in two parts.
 *   tanh(x)  q/(q+2) with q = expm1(2|x|), |x| capped at 20 (tanh = 1
 *            in double from 19.1), sign copied.
 *   erf(x)   |x| < 1: the Maclaurin series to x^39; 1 <= |x| < 6:
 *            1 - exp(-x^2) erfcx(|x|), erfcx as a Chebyshev series of
 *            degree 28 on [1, 6] (Clenshaw), x^2 split exactly with an
 *            FMA; |x| >= 6: 1 (erfc(6) < 2^-54).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codegen/cpu/emit.h"

typedef struct {
    LLVMBuilderRef b;
    LLVMModuleRef m;
    LLVMContextRef c;
    int w;
    LLVMTypeRef vd, vi; /* <w x double>, <w x i64> */
} vm;

static vm vm_of(LLVMBuilderRef b, LLVMModuleRef m, LLVMValueRef x) {
    vm v;
    v.b = b;
    v.m = m;
    v.c = LLVMGetModuleContext(m);
    v.w = (int)LLVMGetVectorSize(LLVMTypeOf(x));
    v.vd = LLVMTypeOf(x);
    v.vi = LLVMVectorType(LLVMInt64TypeInContext(v.c), (unsigned)v.w);
    return v;
}

static LLVMValueRef splat(vm *v, LLVMValueRef s) {
    LLVMValueRef el[64];
    for (int i = 0; i < v->w; i++) el[i] = s;
    return LLVMConstVector(el, (unsigned)v->w);
}
static LLVMValueRef K(vm *v, double x) { return splat(v, LLVMConstReal(LLVMDoubleTypeInContext(v->c), x)); }
static LLVMValueRef KI(vm *v, int64_t x) {
    return splat(v, LLVMConstInt(LLVMInt64TypeInContext(v->c), (unsigned long long)x, 1));
}

static LLVMValueRef intr(vm *v, const char *name, LLVMValueRef *args, int n) {
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    LLVMValueRef f = LLVMGetIntrinsicDeclaration(v->m, id, &v->vd, 1);
    LLVMTypeRef ft = LLVMIntrinsicGetType(v->c, id, &v->vd, 1);
    return LLVMBuildCall2(v->b, ft, f, args, (unsigned)n, "");
}
static LLVMValueRef fma3(vm *v, LLVMValueRef a, LLVMValueRef b, LLVMValueRef c) {
    return intr(v, "llvm.fma", (LLVMValueRef[]){a, b, c}, 3);
}
static LLVMValueRef add(vm *v, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFAdd(v->b, a, b, ""); }
static LLVMValueRef sub(vm *v, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFSub(v->b, a, b, ""); }
static LLVMValueRef mul(vm *v, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildFMul(v->b, a, b, ""); }
static LLVMValueRef sel(vm *v, LLVMValueRef c, LLVMValueRef a, LLVMValueRef b) {
    return LLVMBuildSelect(v->b, c, a, b, "");
}
static LLVMValueRef cmp(vm *v, LLVMRealPredicate p, LLVMValueRef a, LLVMValueRef b) {
    return LLVMBuildFCmp(v->b, p, a, b, "");
}
static LLVMValueRef as_int(vm *v, LLVMValueRef x) { return LLVMBuildBitCast(v->b, x, v->vi, ""); }
static LLVMValueRef as_dbl(vm *v, LLVMValueRef x) { return LLVMBuildBitCast(v->b, x, v->vd, ""); }
static LLVMValueRef is_nan(vm *v, LLVMValueRef x) { return cmp(v, LLVMRealUNO, x, x); }

#define LOG2E 1.4426950408889634
#define SHIFT 6755399441055744.0               /* 1.5 * 2^52 */
#define LN2HI 6.93147180369123816490e-01       /* 32 bits: n * LN2HI is exact */
#define LN2LO 1.90821492927058770002e-10

/* 2^n for integer lanes n of an exponent a double can hold */
static LLVMValueRef pow2(vm *v, LLVMValueRef n) {
    return as_dbl(v, LLVMBuildShl(v->b, LLVMBuildAdd(v->b, n, KI(v, 1023), ""), KI(v, 52), ""));
}

/* x = n ln2 + r: sets *n (integer lanes) and returns r */
static LLVMValueRef reduce_ln2(vm *v, LLVMValueRef x, LLVMValueRef *n) {
    LLVMValueRef kd = fma3(v, x, K(v, LOG2E), K(v, SHIFT));
    LLVMValueRef nd = sub(v, kd, K(v, SHIFT));
    *n = LLVMBuildSub(v->b, as_int(v, kd), KI(v, 0x4338000000000000LL), "");
    LLVMValueRef r = fma3(v, nd, K(v, -LN2HI), x);
    return fma3(v, nd, K(v, -LN2LO), r);
}

/* e^r - 1 for |r| <= ln2/2: r + r^2 (1/2! + r/3! + ... + r^11/13!) */
static LLVMValueRef expm1_small(vm *v, LLVMValueRef r) {
    double fact = 6227020800.0; /* 13! */
    LLVMValueRef p = K(v, 1.0 / fact);
    for (int k = 12; k >= 2; k--) {
        fact /= (double)(k + 1);
        p = fma3(v, p, r, K(v, 1.0 / fact));
    }
    return fma3(v, mul(v, r, r), p, r);
}

LLVMValueRef mpt_vm_exp(LLVMBuilderRef b, LLVMModuleRef m, LLVMValueRef x0) {
    vm v = vm_of(b, m, x0);
    /* past 710 the result is inf, below -746 it is 0: clamping keeps n small
     * and the scaling below produces both (NaN is put back at the end) */
    LLVMValueRef x = sel(&v, cmp(&v, LLVMRealOGT, x0, K(&v, 710)), K(&v, 710), x0);
    x = sel(&v, cmp(&v, LLVMRealOLT, x, K(&v, -746)), K(&v, -746), x);
    LLVMValueRef n;
    LLVMValueRef r = reduce_ln2(&v, x, &n);
    LLVMValueRef p = add(&v, K(&v, 1.0), expm1_small(&v, r));
    LLVMValueRef n1 = LLVMBuildAShr(b, n, KI(&v, 1), "");
    LLVMValueRef n2 = LLVMBuildSub(b, n, n1, "");
    LLVMValueRef y = mul(&v, mul(&v, p, pow2(&v, n1)), pow2(&v, n2));
    return sel(&v, is_nan(&v, x0), x0, y);
}

/* e^y - 1 for 0 <= y <= 40 */
static LLVMValueRef expm1_pos(vm *v, LLVMValueRef y) {
    LLVMValueRef n;
    LLVMValueRef r = reduce_ln2(v, y, &n);
    LLVMValueRef s = pow2(v, n);
    return fma3(v, s, expm1_small(v, r), sub(v, s, K(v, 1.0)));
}

LLVMValueRef mpt_vm_tanh(LLVMBuilderRef b, LLVMModuleRef m, LLVMValueRef x) {
    vm v = vm_of(b, m, x);
    LLVMValueRef a = intr(&v, "llvm.fabs", &x, 1);
    a = sel(&v, cmp(&v, LLVMRealOGT, a, K(&v, 20)), K(&v, 20), a);
    LLVMValueRef q = expm1_pos(&v, add(&v, a, a));
    LLVMValueRef t = LLVMBuildFDiv(b, q, add(&v, q, K(&v, 2.0)), "");
    return intr(&v, "llvm.copysign", (LLVMValueRef[]){t, x}, 2);
}

LLVMValueRef mpt_vm_log(LLVMBuilderRef b, LLVMModuleRef m, LLVMValueRef x) {
    vm v = vm_of(b, m, x);
    const int64_t S = 0x3fe6a09e667f3bcdLL; /* sqrt(1/2) */
    /* subnormals scaled into the normal range first */
    LLVMValueRef sub_n = cmp(&v, LLVMRealOLT, x, K(&v, 0x1p-1022));
    LLVMValueRef xs = sel(&v, sub_n, mul(&v, x, K(&v, 0x1p54)), x);
    LLVMValueRef u = LLVMBuildAdd(b, as_int(&v, xs), KI(&v, 0x3ff0000000000000LL - S), "");
    LLVMValueRef k = LLVMBuildSub(b, LLVMBuildLShr(b, u, KI(&v, 52), ""), KI(&v, 1023), "");
    k = LLVMBuildSub(b, k, sel(&v, sub_n, KI(&v, 54), KI(&v, 0)), "");
    LLVMValueRef mant = as_dbl(&v, LLVMBuildAdd(b, LLVMBuildAnd(b, u, KI(&v, 0x000fffffffffffffLL), ""),
                                                KI(&v, S), ""));
    LLVMValueRef f = sub(&v, mant, K(&v, 1.0));
    LLVMValueRef s = LLVMBuildFDiv(b, f, add(&v, f, K(&v, 2.0)), "");
    LLVMValueRef z = mul(&v, s, s);
    /* R = sum_{i=1..10} 2 z^i / (2i + 1), z <= 0.0295: the first term left
     * out moves the result by under 0.01 ulp; the z^10 term is worth 0.2
     * ulp, z^9 about 5 (tests/test_cpu_math.c fails without it) */
    LLVMValueRef R = K(&v, 2.0 / 21);
    for (int i = 9; i >= 1; i--) R = fma3(&v, R, z, K(&v, 2.0 / (2 * i + 1)));
    R = mul(&v, R, z);
    LLVMValueRef hfsq = mul(&v, mul(&v, K(&v, 0.5), f), f);
    /* k as a double through the shifter (no i64 -> double instruction on AVX2) */
    LLVMValueRef kd = sub(&v, as_dbl(&v, LLVMBuildAdd(b, k, KI(&v, 0x4338000000000000LL), "")), K(&v, SHIFT));
    LLVMValueRef inner = add(&v, mul(&v, s, add(&v, hfsq, R)), mul(&v, kd, K(&v, LN2LO)));
    LLVMValueRef y = sub(&v, mul(&v, kd, K(&v, LN2HI)), sub(&v, sub(&v, hfsq, inner), f));
    /* log(0) = -inf, log(x < 0) = NaN, log(inf) = inf, NaN stays */
    y = sel(&v, cmp(&v, LLVMRealOEQ, x, K(&v, 0.0)), K(&v, -__builtin_inf()), y);
    y = sel(&v, cmp(&v, LLVMRealOLT, x, K(&v, 0.0)), K(&v, __builtin_nan("")), y);
    y = sel(&v, cmp(&v, LLVMRealOEQ, x, K(&v, __builtin_inf())), x, y);
    return sel(&v, is_nan(&v, x), x, y);
}

/* erfcx(a) = exp(a^2) erfc(a) on [1, 6]: Chebyshev coefficients in
 * u = (2a - 7) / 5, degree 28 (interpolation at 29 Chebyshev nodes in 40
 * digits; the series' own error is below 4e-18 of erfc) */
static const double erfcx_cheb[29] = {
    0.20196598791223083,     -0.147884835533987,      0.05188222158351389,
    -0.017525709964867527,   0.005721802417478219,    -0.0018109803028142997,
    0.0005570714353927344,   -0.00016689473052528832, 4.878565911493746e-05,
    -1.3935932859822488e-05, 3.895514595190115e-06,   -1.0668392337070025e-06,
    2.865502572057316e-07,   -7.555861081756622e-08,  1.957586342968354e-08,
    -4.987110132992565e-09,  1.2501871239431183e-09,  -3.0858852312872416e-10,
    7.504484747602063e-11,   -1.7990193064431427e-11, 4.253478301217652e-12,
    -9.923156075211234e-13,  2.2852946881888867e-13,  -5.1975450866167244e-14,
    1.1678400541510938e-14,  -2.5932901330272067e-15, 5.692635243339303e-16,
    -1.2335300698913424e-16, 2.5358417099784882e-17,
};

LLVMValueRef mpt_vm_erf(LLVMBuilderRef b, LLVMModuleRef m, LLVMValueRef x) {
    vm v = vm_of(b, m, x);
    LLVMValueRef a = intr(&v, "llvm.fabs", &x, 1);
    /* |x| < 1: (2/sqrt(pi)) a sum_{n=0..19} (-1)^n t^n / (n! (2n+1)), t = a^2 */
    LLVMValueRef t = mul(&v, a, a), p = K(&v, 0.0);
    for (int n = 19; n >= 0; n--) {
        double fact = 1;
        for (int i = 2; i <= n; i++) fact *= i;
        p = fma3(&v, p, t, K(&v, (n & 1 ? -1.0 : 1.0) / (fact * (2 * n + 1))));
    }
    LLVMValueRef small = mul(&v, mul(&v, a, p), K(&v, 1.12837916709551257390)); /* 2/sqrt(pi) */
    /* 1 <= |x| < 6 */
    LLVMValueRef aa = sel(&v, cmp(&v, LLVMRealOGT, a, K(&v, 6)), K(&v, 6), a);
    aa = sel(&v, cmp(&v, LLVMRealOLT, aa, K(&v, 1)), K(&v, 1), aa);
    LLVMValueRef u = LLVMBuildFDiv(b, fma3(&v, K(&v, 2.0), aa, K(&v, -7.0)), K(&v, 5.0), "");
    LLVMValueRef u2 = add(&v, u, u), b1 = K(&v, 0.0), b2 = K(&v, 0.0);
    for (int k = 28; k >= 1; k--) {
        LLVMValueRef nb = fma3(&v, u2, b1, sub(&v, K(&v, erfcx_cheb[k]), b2));
        b2 = b1;
        b1 = nb;
    }
    LLVMValueRef g = fma3(&v, u, b1, sub(&v, K(&v, erfcx_cheb[0]), b2));
    LLVMValueRef hi = mul(&v, aa, aa);
    LLVMValueRef lo = fma3(&v, aa, aa, LLVMBuildFNeg(b, hi, "")); /* aa^2 = hi + lo exactly */
    LLVMValueRef erfc = mul(&v, mpt_vm_exp(b, m, LLVMBuildFNeg(b, hi, "")), g);
    erfc = fma3(&v, LLVMBuildFNeg(b, erfc, ""), lo, erfc); /* times e^-lo ~ 1 - lo */
    LLVMValueRef big = sub(&v, K(&v, 1.0), erfc);
    LLVMValueRef r = sel(&v, cmp(&v, LLVMRealOLT, a, K(&v, 1)), small,
                         sel(&v, cmp(&v, LLVMRealOGE, a, K(&v, 6)), K(&v, 1.0), big));
    r = sel(&v, is_nan(&v, x), x, r);
    return intr(&v, "llvm.copysign", (LLVMValueRef[]){r, x}, 2);
}

/* GELU x Phi(x) (grad: its derivative Phi(x) + x phi(x)) of <w x double>,
 * in the interpreter's order of operations (ir/interp_ops.c), so its
 * constants fold alike: the loop's double path and the rare recompute of
 * a low-precision GEMM epilogue (codegen/cpu/gemm_epi.c) share it. */
LLVMValueRef mpt_vm_gelu(LLVMBuilderRef b, LLVMModuleRef m, LLVMValueRef x, int grad) {
    vm v = vm_of(b, m, x);
    LLVMValueRef er = mpt_vm_erf(b, m, mul(&v, x, K(&v, M_SQRT1_2)));
    LLVMValueRef cdf = mul(&v, K(&v, 0.5), add(&v, K(&v, 1.0), er));
    if (!grad) return mul(&v, x, cdf);
    const double c = 0.5 * M_2_SQRTPI * M_SQRT1_2; /* folded as the interpreter folds it */
    LLVMValueRef t = mul(&v, mul(&v, K(&v, -0.5), x), x);
    return add(&v, cdf, mul(&v, mul(&v, x, mpt_vm_exp(b, m, t)), K(&v, c)));
}

/* ---- a test hook: void f(const double *x, double *y, i64 n) ---- */

void *mpt_cpu_math_fn(mpt_cpu_jit *j, const char *fname, char *err, size_t n) {
    LLVMValueRef (*gen)(LLVMBuilderRef, LLVMModuleRef, LLVMValueRef) =
        !strcmp(fname, "exp") ? mpt_vm_exp : !strcmp(fname, "log") ? mpt_vm_log
        : !strcmp(fname, "tanh") ? mpt_vm_tanh : !strcmp(fname, "erf") ? mpt_vm_erf : NULL;
    if (!gen) {
        snprintf(err, n, "no vector function '%s'", fname);
        return NULL;
    }
    char name[64];
    snprintf(name, sizeof name, "vm_%s_%d", fname, mpt_cpu_jit_next_id(j));
    LLVMContextRef c = mpt_cpu_jit_context(j);
    LLVMModuleRef m = mpt_cpu_jit_module_new(j, name);
    LLVMTypeRef f64 = LLVMDoubleTypeInContext(c), i64 = LLVMInt64TypeInContext(c);
    LLVMTypeRef pd = LLVMPointerType(f64, 0);
    int w = mpt_cpu_jit_vector_lanes(j);
    LLVMTypeRef vd = LLVMVectorType(f64, (unsigned)w), pv = LLVMPointerType(vd, 0);
    LLVMValueRef fn = LLVMAddFunction(m, name, LLVMFunctionType(LLVMVoidTypeInContext(c),
                                                               (LLVMTypeRef[]){pd, pd, i64}, 3, 0));
    mpt_cpu_jit_set_fn_attrs(j, fn);
    LLVMBuilderRef b = LLVMCreateBuilderInContext(c);
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(c, fn, "entry");
    LLVMBasicBlockRef body = LLVMAppendBasicBlockInContext(c, fn, "body");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(c, fn, "done");
    LLVMPositionBuilderAtEnd(b, entry);
    LLVMValueRef zero = LLVMConstInt(i64, 0, 0);
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSGT, LLVMGetParam(fn, 2), zero, ""), body, done);
    LLVMPositionBuilderAtEnd(b, body);
    LLVMValueRef i = LLVMBuildPhi(b, i64, "i");
    LLVMValueRef px = LLVMBuildGEP2(b, f64, LLVMGetParam(fn, 0), &i, 1, "");
    LLVMValueRef py = LLVMBuildGEP2(b, f64, LLVMGetParam(fn, 1), &i, 1, "");
    LLVMValueRef xv = LLVMBuildLoad2(b, vd, LLVMBuildBitCast(b, px, pv, ""), "");
    LLVMSetAlignment(xv, 8);
    LLVMValueRef st = LLVMBuildStore(b, gen(b, m, xv), LLVMBuildBitCast(b, py, pv, ""));
    LLVMSetAlignment(st, 8);
    LLVMValueRef next = LLVMBuildAdd(b, i, LLVMConstInt(i64, (unsigned long long)w, 0), "");
    LLVMAddIncoming(i, (LLVMValueRef[]){zero, next}, (LLVMBasicBlockRef[]){entry, body}, 2);
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, next, LLVMGetParam(fn, 2), ""), body, done);
    LLVMPositionBuilderAtEnd(b, done);
    LLVMBuildRetVoid(b);
    LLVMDisposeBuilder(b);
    if (mpt_cpu_jit_add_module(j, m, NULL, NULL, err, n)) return NULL;
    return mpt_cpu_jit_lookup(j, name, err, n);
}
