/* codegen/cpu/gemm_asm.c — the gathered GEMM tile's k steps as inline
 * assembly (gemm_gen.c's tile loop calls them, MPT_CPU_GATHER_U steps an
 * iteration; docs/DECISIONS.md). A gathered tile broadcasts each row's
 * element from its own address, row base + the step's offset, and LLVM's
 * version of that loop spent more instructions on addresses, reloads of
 * the bases and prefetch slots than on FMAs. The assembly does the same
 * FMAs in the same order, so the sums are bit for bit the IR loop's; LLVM
 * keeps the loop, the addresses it passes in and the last odd step.
 *
 * AVX-512's 10-row tile (about 57 instructions a step around 20 FMAs in
 * LLVM's loop) was tried the same way, each row's base loaded once an
 * iteration from the tile's row array: convnet64's forward and data
 * gradients 3-5% faster, its gathered filter gradient (each k a new
 * pixel, a new line in every row) 10% slower, the step even; left to
 * LLVM (docs/BENCHMARKS.md).
 */
#include <stdio.h>

#include "codegen/cpu/gemm_ir.h"

/* AVX2: MPT_CPU_GATHER_MR_AVX2 = 6 rows of 2 ymm. As IR, LLVM hoisted all
 * six broadcasts (12 accumulators, 2 of B, 6 broadcasts: 20 of 16 ymm)
 * and spilled accumulators in the k loop (36-40% of the FMA peak); a
 * 4-row tile fitted but took about 48 instructions a step (45-60%). Here
 * a step is its offset's load, B's two vectors, and per row a broadcast
 * from row base + offset into one scratch register and its two FMAs (15
 * ymm, the six bases in general registers); an iteration prefetches the
 * six rows' lines PREFETCH_A k ahead, B's PREFETCH_K. */
int mpt_cpu_gather_asm(const mpt_cpu_gen *g, mpt_dtype a_dt) {
    const mpt_cpu_gemm_shape *s = g->s;
    return s->vl == 8 && s->fma && !s->pair && s->mr == MPT_CPU_GATHER_MR_AVX2 && s->nr == 16 &&
           a_dt == MPT_DT_F32;
}

void mpt_cpu_gather_steps_asm(mpt_cpu_gen *g, const LLVMValueRef *a_rows, LLVMValueRef a_col,
                              LLVMValueRef b_sl, LLVMValueRef k, const LLVMValueRef *acc,
                              LLVMValueRef *next) {
    enum { MR = MPT_CPU_GATHER_MR_AVX2, NA = MR * 2, T = NA, B0 = NA + 1, B1 = NA + 2, OFS = NA + 3,
           ROW = NA + 4, COL = ROW + MR, BK = COL + 1, PFC = BK + 1, N_IN = MR + 3 + NA };
    char text[4096], cons[512];
    int t = 0, c = 0;
#define EMIT(...) (t += snprintf(text + t, sizeof text - (size_t)t, __VA_ARGS__))
    for (int u = 0; u < MPT_CPU_GATHER_U; u++) {
        EMIT("movq %d(${%d}), ${%d}\n\t", 8 * u, COL, OFS);
        EMIT("vmovups %d(${%d}), ${%d}\n\t", 64 * u, BK, B0);
        EMIT("vmovups %d(${%d}), ${%d}\n\t", 64 * u + 32, BK, B1);
        EMIT("prefetcht0 %d(${%d})\n\t", 64 * (MPT_CPU_PREFETCH_K + u), BK);
        for (int r = 0; r < MR; r++) {
            EMIT("vbroadcastss (${%d},${%d}), ${%d}\n\t", ROW + r, OFS, T);
            EMIT("vfmadd231ps ${%d}, ${%d}, ${%d}\n\t", B0, T, 2 * r);
            EMIT("vfmadd231ps ${%d}, ${%d}, ${%d}\n\t", B1, T, 2 * r + 1);
        }
    }
    EMIT("movq (${%d}), ${%d}\n\t", PFC, OFS);
    for (int r = 0; r < MR; r++) EMIT("prefetcht0 (${%d},${%d})\n\t", ROW + r, OFS);
#undef EMIT
    for (int i = 0; i < NA; i++) c += snprintf(cons + c, sizeof cons - (size_t)c, "=x,");
    c += snprintf(cons + c, sizeof cons - (size_t)c, "=&x,=&x,=&x,=&r");
    for (int i = 0; i < MR + 3; i++) c += snprintf(cons + c, sizeof cons - (size_t)c, ",r");
    for (int i = 0; i < NA; i++) c += snprintf(cons + c, sizeof cons - (size_t)c, ",%d", i);
    LLVMTypeRef outs[NA + 4], ins[N_IN];
    LLVMValueRef args[N_IN];
    for (int i = 0; i < NA + 3; i++) outs[i] = g->vf;
    outs[NA + 3] = g->i64;
    for (int r = 0; r < MR; r++) args[r] = a_rows[r];
    args[MR] = addr(g, a_col, k, 8, g->i64);
    args[MR + 1] = addr(g, b_sl, LLVMBuildMul(g->b, k, ci64(g, 16), ""), 4, g->i8);
    LLVMValueRef kp = smin(g, LLVMBuildAdd(g->b, k, ci64(g, MPT_CPU_PREFETCH_A), ""),
                           LLVMBuildSub(g->b, g->a_pf_end, ci64(g, 1), ""));
    args[MR + 2] = addr(g, a_col, kp, 8, g->i64);
    for (int i = 0; i < NA; i++) args[MR + 3 + i] = acc[i];
    for (int i = 0; i < N_IN; i++) ins[i] = LLVMTypeOf(args[i]);
    LLVMTypeRef ret = LLVMStructTypeInContext(g->c, outs, NA + 4, 0);
    LLVMTypeRef fty = LLVMFunctionType(ret, ins, N_IN, 0);
    LLVMValueRef fn = LLVMGetInlineAsm(fty, text, (size_t)t, cons, (size_t)c, 1, 0,
                                       LLVMInlineAsmDialectATT, 0);
    LLVMValueRef res = LLVMBuildCall2(g->b, fty, fn, args, N_IN, "");
    for (int i = 0; i < NA; i++) next[i] = LLVMBuildExtractValue(g->b, res, (unsigned)i, "");
}

