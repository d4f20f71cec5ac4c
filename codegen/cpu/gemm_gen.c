/* codegen/cpu/gemm_gen.c — builds the GEMM's register-blocked macro-kernel
 * with the LLVM C API's IR builder (the packing routines it consumes are in
 * gemm_pack.c).
 *
 * The micro-kernel keeps an mr x nr tile of C in mr * (nr / vl) vector
 * accumulators; each k step loads nr / vl vectors of packed B, broadcasts mr
 * scalars of packed A, and issues one llvm.fma (or, for bf16 pairs, one
 * vdpbf16ps covering two k) per accumulator. With AMX the tile is 32 x 32
 * on tdpbf16ps (gemm_amx.c). Packing zero-pads partial tiles, so the k loop never branches on
 * edges; only the tile's store is masked. The layouts are described in
 * cpu_internal.h; the epilogue and C's store are in gemm_epi.c. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "codegen/cpu/gemm_ir.h"

/* ---- the macro-kernel ---- */

enum { PREFETCH_K = MPT_CPU_PREFETCH_K, PREFETCH_A = MPT_CPU_PREFETCH_A };

/* AMX tiles prefetch the next tile's C rows only below this k block (gen_macro) */
enum { AMX_C_PREFETCH_KC = 256 };

/* A gathered element of dtype dt at p, as an f32 (bf16 and f16 widen exactly). */
static LLVMValueRef gathered_f32(mpt_cpu_gen *g, mpt_dtype dt, LLVMValueRef p) {
    if (dt == MPT_DT_BF16) {
        LLVMValueRef h = load(g, g->i16, LLVMBuildBitCast(g->b, p, LLVMPointerType(g->i16, 0), ""), 2);
        LLVMValueRef w = LLVMBuildShl(g->b, LLVMBuildZExt(g->b, h, g->i32, ""), ci32(g, 16), "");
        return LLVMBuildBitCast(g->b, w, g->f32, "");
    }
    if (dt == MPT_DT_F16)
        return LLVMBuildFPExt(
            g->b, load(g, g->half, LLVMBuildBitCast(g->b, p, LLVMPointerType(g->half, 0), ""), 2),
            g->f32, "");
    return load(g, g->f32, LLVMBuildBitCast(g->b, p, LLVMPointerType(g->f32, 0), ""), 4);
}

/* Starts a loop counting from iv0 (its phi in *iv) with n_acc accumulator
 * phis (from acc_in, or zeros), and leaves the builder in the header for the
 * caller's exit test into *body or *exit. close_acc_loop ends it. */
static LLVMBasicBlockRef open_acc_loop(mpt_cpu_gen *g, const char *name, LLVMValueRef iv0,
                                       const LLVMValueRef *acc_in, int n_acc, LLVMValueRef *iv,
                                       LLVMValueRef *phi, LLVMBasicBlockRef *body,
                                       LLVMBasicBlockRef *exit) {
    char nm[32];
    LLVMBasicBlockRef pre = LLVMGetInsertBlock(g->b);
    LLVMBasicBlockRef header = LLVMAppendBasicBlockInContext(g->c, g->fn, name);
    snprintf(nm, sizeof nm, "%sbody", name);
    *body = LLVMAppendBasicBlockInContext(g->c, g->fn, nm);
    snprintf(nm, sizeof nm, "%sexit", name);
    *exit = LLVMAppendBasicBlockInContext(g->c, g->fn, nm);
    LLVMBuildBr(g->b, header);
    LLVMPositionBuilderAtEnd(g->b, header);
    LLVMValueRef fzero = LLVMConstNull(g->vf);
    *iv = LLVMBuildPhi(g->b, g->i64, name);
    LLVMAddIncoming(*iv, &iv0, &pre, 1);
    for (int i = 0; i < n_acc; i++) {
        phi[i] = LLVMBuildPhi(g->b, g->vf, "acc");
        LLVMAddIncoming(phi[i], acc_in ? (LLVMValueRef *)&acc_in[i] : &fzero, &pre, 1);
    }
    return header;
}

/* Ends the body of a loop counting iv up by one with accumulator phis
 * (their next values in next): branches back to header, and leaves the
 * builder at exit with the sums in acc. */
static void close_acc_loop_by(mpt_cpu_gen *g, LLVMBasicBlockRef header, LLVMBasicBlockRef exit,
                              LLVMValueRef iv, int64_t step, LLVMValueRef *phi, LLVMValueRef *next,
                              int n_acc, LLVMValueRef *acc) {
    LLVMValueRef iv1 = LLVMBuildAdd(g->b, iv, ci64(g, step), "");
    LLVMBasicBlockRef latch = LLVMGetInsertBlock(g->b);
    LLVMBuildBr(g->b, header);
    LLVMAddIncoming(iv, &iv1, &latch, 1);
    for (int i = 0; i < n_acc; i++)
        LLVMAddIncoming(phi[i], &next[i], &latch, 1);
    LLVMPositionBuilderAtEnd(g->b, exit);
    for (int i = 0; i < n_acc; i++)
        acc[i] = phi[i];
}

static void close_acc_loop(mpt_cpu_gen *g, LLVMBasicBlockRef header, LLVMBasicBlockRef exit,
                           LLVMValueRef iv, LLVMValueRef *phi, LLVMValueRef *next, int n_acc,
                           LLVMValueRef *acc) {
    close_acc_loop_by(g, header, exit, iv, 1, phi, next, n_acc, acc);
}

/* The tile's k loop over [k_start, kk) of the block, adding to acc_in
 * (NULL: zeros); the sums into acc. */
static void gen_tile_k_loop(mpt_cpu_gen *g, LLVMValueRef a_sl, LLVMValueRef b_sl,
                            LLVMValueRef k_start, LLVMValueRef kk, const LLVMValueRef *a_rows,
                            LLVMValueRef a_col, mpt_dtype a_dt, const LLVMValueRef *acc_in,
                            LLVMValueRef *acc) {
    const mpt_cpu_gemm_shape *s = g->s;
    int nv = s->nr / s->vl, n_acc = s->mr * nv;
    LLVMBasicBlockRef body, exit;
    LLVMValueRef phi[14 * 4], k;
    LLVMValueRef acc_u[14 * 4];
    if (a_rows && mpt_cpu_gather_asm(g, a_dt)) {
        /* MPT_CPU_GATHER_U steps at a time as assembly (gemm_asm.c); the
         * last few below */
        LLVMValueRef next_u[14 * 4], ku;
        LLVMBasicBlockRef uh = open_acc_loop(g, "ku", k_start, acc_in, n_acc, &ku, phi, &body, &exit);
        LLVMValueRef more = LLVMBuildICmp(
            g->b, LLVMIntSLE, LLVMBuildAdd(g->b, ku, ci64(g, MPT_CPU_GATHER_U), ""), kk, "");
        LLVMBuildCondBr(g->b, more, body, exit);
        LLVMPositionBuilderAtEnd(g->b, body);
        mpt_cpu_gather_steps_asm(g, a_rows, a_col, b_sl, ku, phi, next_u);
        close_acc_loop_by(g, uh, exit, ku, MPT_CPU_GATHER_U, phi, next_u, n_acc, acc_u);
        k_start = ku;
        acc_in = acc_u;
    }
    LLVMBasicBlockRef header = open_acc_loop(g, "k", k_start, acc_in, n_acc, &k, phi, &body, &exit);
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, k, kk, ""), body, exit);
    LLVMPositionBuilderAtEnd(g->b, body);
    /* packed B: nr 4-byte cells per k (an f32, or a bf16 pair); A: mr cells */
    /* Software prefetch PREFETCH_K steps ahead: with a long k block the
     * slivers of A and B stream from L2, and the hardware prefetcher alone
     * left the FMA ports waiting (measured: 85-92% -> 94-100% of OpenBLAS). */
    int b_lines = (s->nr * 4 + 63) / 64;
    /* (a gathered A's rows are prefetched below) */
    for (int h = 0; h <= b_lines - (a_rows != NULL); h++) {
        int is_a = h == b_lines, cells = is_a ? s->mr : s->nr;
        LLVMValueRef ci = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, k, ci64(g, cells), ""),
                                       ci64(g, PREFETCH_K * cells + (is_a ? 0 : h * 16)), "");
        prefetch_l1(g, addr(g, is_a ? a_sl : b_sl, ci, 4, g->i8), 0);
    }
    LLVMValueRef bv[4];
    LLVMTypeRef cell_vec = s->pair ? g->vi32 : g->vf;
    for (int v = 0; v < nv; v++) {
        LLVMValueRef bi =
            LLVMBuildAdd(g->b, LLVMBuildMul(g->b, k, ci64(g, s->nr), ""), ci64(g, v * s->vl), "");
        bv[v] = load(g, cell_vec, addr(g, b_sl, bi, 4, cell_vec), 64);
    }
    LLVMValueRef next[14 * 4];
    /* gathered: row r's element k is at a_rows[r] + a_col[k] bytes; in
     * pairs (bf16 on vdpbf16ps), cell k is elements 2k and 2k + 1, which
     * the tables put side by side (a tap's channels c and c + 1, c even) */
    int per_cell = s->pair ? 2 : 1;
    LLVMValueRef ko = a_rows ? load(g, g->i64, addr(g, a_col, LLVMBuildMul(g->b, k, ci64(g, per_cell), ""), 8, g->i64), 8)
                             : NULL;
    if (a_rows && g->a_pf_rows) {
        /* A's rows in place, a line (16 k) at a time each: row k mod 16
         * (the last one for slots past mr), PREFETCH_A k ahead. The
         * hardware alone left runs of a few lines to wait on L2 (ResNet-50
         * stage 2-3 shapes 10-12% faster; convnet64 f32 2-8%). */
        LLVMValueRef slot = smin(g, LLVMBuildAnd(g->b, k, ci64(g, 15), ""), ci64(g, s->mr - 1));
        LLVMValueRef rp = g->a_pf_step ? addr(g, a_rows[0], LLVMBuildMul(g->b, slot, g->a_pf_step, ""), 1, g->i8)
                                       : load(g, g->p8, addr(g, g->a_pf_rows, slot, 8, g->p8), 8);
        LLVMValueRef kp = smin(g, LLVMBuildAdd(g->b, k, ci64(g, PREFETCH_A), ""),
                               LLVMBuildSub(g->b, g->a_pf_end, ci64(g, 1), ""));
        LLVMValueRef off = load(g, g->i64, addr(g, a_col, LLVMBuildMul(g->b, kp, ci64(g, per_cell), ""), 8, g->i64), 8);
        prefetch_l1(g, LLVMBuildGEP2(g->b, g->i8, rp, &off, 1, ""), 0);
    }
    for (int r = 0; r < s->mr; r++) {
        LLVMTypeRef cell = s->pair ? g->i32 : g->f32;
        LLVMValueRef av;
        if (a_rows && s->pair) {
            LLVMValueRef p = LLVMBuildGEP2(g->b, g->i8, a_rows[r], &ko, 1, "");
            av = load(g, g->i32, LLVMBuildBitCast(g->b, p, LLVMPointerType(g->i32, 0), ""), 2);
        } else if (a_rows) {
            av = gathered_f32(g, a_dt, LLVMBuildGEP2(g->b, g->i8, a_rows[r], &ko, 1, ""));
        } else {
            LLVMValueRef ai =
                LLVMBuildAdd(g->b, LLVMBuildMul(g->b, k, ci64(g, s->mr), ""), ci64(g, r), "");
            av = load(g, cell, addr(g, a_sl, ai, 4, cell), 4);
        }
        LLVMValueRef a = splat(g, av, cell_vec);
        for (int v = 0; v < nv; v++) {
            LLVMValueRef acc_in = phi[r * nv + v];
            if (s->pair) {
                LLVMValueRef args[3] = {acc_in, a, bv[v]};
                next[r * nv + v] =
                    call_intrinsic(g, "llvm.x86.avx512bf16.dpbf16ps.512", NULL, 0, args, 3);
            } else {
                next[r * nv + v] = vfma(g, a, bv[v], acc_in);
            }
        }
    }
    close_acc_loop(g, header, exit, k, phi, next, n_acc, acc);
}

/* A whole mr x nr tile (no row or column past the block's edge). */
static LLVMValueRef whole_tile(mpt_cpu_gen *g, LLVMValueRef m_rem, LLVMValueRef n_rem) {
    return LLVMBuildAnd(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, m_rem, ci64(g, g->s->mr), ""),
                        LLVMBuildICmp(g->b, LLVMIntEQ, n_rem, ci64(g, g->s->nr), ""), "");
}

/* Whether a whole tile's sums go to dst as raw f32 (partial sums, or a
 * final store with no epilogue into an f32 C), skipping the stack tile. */
static LLVMValueRef stores_raw(mpt_cpu_gen *g, const mpt_cpu_gemm_desc *d, LLVMValueRef whole,
                               LLVMValueRef is_final) {
    if (d->n_steps > 0 || d->c_dt != MPT_DT_F32 || d->c_rows)
        return LLVMBuildAnd(g->b, whole, LLVMBuildNot(g->b, is_final, ""), "");
    return whole;
}

/* Full tiles whose sums go to C as raw f32 (stores_raw) skip the stack
 * tile: the accumulators are added to prior and stored from registers,
 * without masks. Branches to done when it applies; falls through (builder
 * in a new block) when not. */
static void gen_direct_store(mpt_cpu_gen *g, const mpt_cpu_gemm_desc *d, LLVMValueRef *acc,
                             LLVMValueRef m_rem, LLVMValueRef n_rem, LLVMValueRef is_final,
                             LLVMValueRef has_prior, LLVMValueRef prior, LLVMValueRef ldp,
                             LLVMValueRef dst, LLVMValueRef ldd, LLVMValueRef i0, LLVMValueRef j0,
                             LLVMBasicBlockRef done) {
    const mpt_cpu_gemm_shape *s = g->s;
    int nv = s->nr / s->vl;
    LLVMValueRef full = stores_raw(g, d, whole_tile(g, m_rem, n_rem), is_final);
    LLVMBasicBlockRef direct = LLVMAppendBasicBlockInContext(g->c, g->fn, "direct");
    LLVMBasicBlockRef spill = LLVMAppendBasicBlockInContext(g->c, g->fn, "spill");
    LLVMBuildCondBr(g->b, full, direct, spill);
    LLVMPositionBuilderAtEnd(g->b, direct);
    LLVMBasicBlockRef with = LLVMAppendBasicBlockInContext(g->c, g->fn, "withprior");
    LLVMBasicBlockRef without = LLVMAppendBasicBlockInContext(g->c, g->fn, "noprior");
    LLVMBuildCondBr(g->b, has_prior, with, without);
    for (int h = 0; h < 2; h++) {
        LLVMPositionBuilderAtEnd(g->b, h ? without : with);
        for (int r = 0; r < s->mr; r++) {
            LLVMValueRef row = LLVMBuildAdd(g->b, i0, ci64(g, r), "");
            for (int v = 0; v < nv; v++) {
                LLVMValueRef col = LLVMBuildAdd(g->b, j0, ci64(g, v * s->vl), "");
                LLVMValueRef x = acc[r * nv + v];
                if (!h) {
                    LLVMValueRef pi = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, row, ldp, ""), col, "");
                    x = LLVMBuildFAdd(g->b, x, load(g, g->vf, addr(g, prior, pi, 4, g->vf), 4), "");
                }
                LLVMValueRef di = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, row, ldd, ""), col, "");
                store(g, x, addr(g, dst, di, 4, g->vf), 4);
            }
        }
        LLVMBuildBr(g->b, done);
    }
    LLVMPositionBuilderAtEnd(g->b, spill);
}

/* A gathered tile's k loops. Row r's nonzero k are within [lo, hi) and,
 * where k_run > 0, within [seg_lo, seg_hi) of each run of k_run k's
 * (krange: [M][4] of lo, hi, seg_lo, seg_hi; NULL: every k). The tile runs
 * over the union of its rows' ranges, clipped to this block's [k0, k0 + kk),
 * one segment per run: a convolution's taps in the top and bottom padding
 * (lo, hi) and in the left and right padding (the segment of each kernel
 * row). */
static void gen_ranged_k_loops(mpt_cpu_gen *g, LLVMValueRef a_sl, LLVMValueRef b_sl,
                               LLVMValueRef kk, const LLVMValueRef *rows, LLVMValueRef a_col,
                               LLVMValueRef krange, LLVMValueRef k_run, LLVMValueRef k0,
                               LLVMValueRef i0, LLVMValueRef m_rem, mpt_dtype a_dt,
                               LLVMValueRef *acc) {
    const mpt_cpu_gemm_shape *s = g->s;
    int n_acc = s->mr * (s->nr / s->vl);
    /* the ranges count elements; in pairs the block holds 2 kk of them and
     * every bound is even (whole taps of an even number of channels) */
    if (s->pair) kk = LLVMBuildMul(g->b, kk, ci64(g, 2), "");
    /* without runs, one segment longer than any k */
    LLVMValueRef big = ci64(g, (int64_t)1 << 40);
    LLVMBasicBlockRef from = LLVMGetInsertBlock(g->b);
    LLVMBasicBlockRef ranged = LLVMAppendBasicBlockInContext(g->c, g->fn, "krange");
    LLVMBasicBlockRef joined = LLVMAppendBasicBlockInContext(g->c, g->fn, "kranged");
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntNE, krange, LLVMConstNull(g->p8), ""), ranged,
                    joined);
    LLVMPositionBuilderAtEnd(g->b, ranged);
    LLVMValueRef v[4] = {NULL, NULL, NULL, NULL};
    for (int r = 0; r < s->mr; r++) {
        /* rows past the block's edge repeat its first row */
        LLVMValueRef ri = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, ci64(g, r), m_rem, ""),
                                          LLVMBuildAdd(g->b, i0, ci64(g, r), ""), i0, "");
        LLVMValueRef four = LLVMBuildMul(g->b, ri, ci64(g, 4), "");
        for (int f = 0; f < 4; f++) {
            LLVMValueRef e = load(g, g->i64,
                                  addr(g, krange, LLVMBuildAdd(g->b, four, ci64(g, f), ""), 8, g->i64), 8);
            int lower = f % 2 == 0; /* lo, seg_lo: the least; hi, seg_hi: the greatest */
            v[f] = !r ? e
                   : lower ? smin(g, v[f], e)
                           : LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSGT, e, v[f], ""), e, v[f], "");
        }
    }
    /* into this block's k: [k0, k0 + kk) */
    LLVMValueRef lo = LLVMBuildSub(g->b, v[0], k0, ""), hi = smin(g, LLVMBuildSub(g->b, v[1], k0, ""), kk);
    lo = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, lo, ci64(g, 0), ""), ci64(g, 0), lo, "");
    LLVMValueRef runs = LLVMBuildICmp(g->b, LLVMIntSGT, k_run, ci64(g, 0), "");
    LLVMValueRef run = LLVMBuildSelect(g->b, runs, k_run, big, "");
    LLVMValueRef sa = LLVMBuildSelect(g->b, runs, v[2], ci64(g, 0), "");
    LLVMValueRef sb = LLVMBuildSelect(g->b, runs, v[3], big, "");
    LLVMBasicBlockRef ranged_end = LLVMGetInsertBlock(g->b);
    LLVMBuildBr(g->b, joined);
    LLVMPositionBuilderAtEnd(g->b, joined);
    LLVMValueRef in[5][2] = {{ci64(g, 0), lo}, {kk, hi}, {big, run}, {ci64(g, 0), sa}, {big, sb}};
    LLVMValueRef ph[5];
    LLVMBasicBlockRef bbs[2] = {from, ranged_end};
    for (int i = 0; i < 5; i++) {
        ph[i] = LLVMBuildPhi(g->b, g->i64, "");
        LLVMAddIncoming(ph[i], in[i], bbs, 2);
    }
    lo = ph[0], hi = ph[1], run = ph[2], sa = ph[3], sb = ph[4];
    /* runs r from the one holding k0 + lo; run r's segment in block terms
     * is [r*run + sa - k0, r*run + sb - k0) */
    LLVMValueRef r0 = LLVMBuildSDiv(g->b, LLVMBuildAdd(g->b, k0, lo, ""), run, "");
    LLVMBasicBlockRef body, exit;
    LLVMValueRef phi[14 * 4], r;
    LLVMBasicBlockRef header = open_acc_loop(g, "seg", r0, NULL, n_acc, &r, phi, &body, &exit);
    LLVMValueRef base = LLVMBuildSub(g->b, LLVMBuildMul(g->b, r, run, ""), k0, "");
    LLVMValueRef start = LLVMBuildAdd(g->b, base, sa, "");
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, start, hi, ""), body, exit);
    LLVMPositionBuilderAtEnd(g->b, body);
    LLVMValueRef ks = LLVMBuildSelect(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, start, lo, ""), lo, start, "");
    LLVMValueRef ke = smin(g, LLVMBuildAdd(g->b, base, sb, ""), hi);
    LLVMValueRef next[14 * 4];
    if (s->pair) {
        ks = LLVMBuildAShr(g->b, ks, ci64(g, 1), "");
        ke = LLVMBuildAShr(g->b, ke, ci64(g, 1), "");
    }
    gen_tile_k_loop(g, a_sl, b_sl, ks, ke, rows, a_col, a_dt, phi, next);
    close_acc_loop(g, header, exit, r, phi, next, n_acc, acc);
}

/* A gathered tile whose rows are each desc.a_row_step bytes after the one
 * before (checked tile by tile) runs its k loops on its first row's
 * pointer alone, row r at the constant displacement r * step: mr live
 * pointers outnumber the general registers, and half of them were
 * reloaded from the stack every k step. Other tiles take them as before. */
static void gen_strided_or_not(mpt_cpu_gen *g, const mpt_cpu_gemm_desc *d, LLVMValueRef a_sl,
                               LLVMValueRef b_sl, LLVMValueRef kk, const LLVMValueRef *rows,
                               LLVMValueRef a_col, LLVMValueRef krange, LLVMValueRef k_run,
                               LLVMValueRef k0, LLVMValueRef i0, LLVMValueRef m_rem,
                               LLVMValueRef *acc) {
    const mpt_cpu_gemm_shape *s = g->s;
    int n_acc = s->mr * (s->nr / s->vl);
    LLVMValueRef even = LLVMBuildICmp(g->b, LLVMIntEQ, m_rem, ci64(g, s->mr), "");
    LLVMValueRef first = LLVMBuildPtrToInt(g->b, rows[0], g->i64, ""), part[2][14 * 4], srows[14];
    for (int r = 1; r < s->mr; r++) {
        LLVMValueRef at = LLVMBuildSub(g->b, LLVMBuildPtrToInt(g->b, rows[r], g->i64, ""), first, "");
        even = LLVMBuildAnd(g->b, even, LLVMBuildICmp(g->b, LLVMIntEQ, at, ci64(g, r * d->a_row_step), ""), "");
    }
    LLVMBasicBlockRef way[2] = {LLVMAppendBasicBlockInContext(g->c, g->fn, "strided"),
                                LLVMAppendBasicBlockInContext(g->c, g->fn, "general")};
    LLVMBasicBlockRef joined = LLVMAppendBasicBlockInContext(g->c, g->fn, "stridedjoin"), ends[2];
    LLVMBuildCondBr(g->b, even, way[0], way[1]);
    for (int h = 0; h < 2; h++) {
        LLVMPositionBuilderAtEnd(g->b, way[h]);
        for (int r = 0; r < s->mr; r++)
            srows[r] = h ? rows[r]
                         : LLVMBuildGEP2(g->b, g->i8, rows[0], (LLVMValueRef[]){ci64(g, r * d->a_row_step)}, 1, "");
        g->a_pf_step = h ? NULL : ci64(g, d->a_row_step);
        gen_ranged_k_loops(g, a_sl, b_sl, kk, srows, a_col, krange, k_run, k0, i0, m_rem, d->a_dt, part[h]);
        ends[h] = LLVMGetInsertBlock(g->b);
        LLVMBuildBr(g->b, joined);
    }
    g->a_pf_step = NULL;
    LLVMPositionBuilderAtEnd(g->b, joined);
    for (int i = 0; i < n_acc; i++) {
        acc[i] = LLVMBuildPhi(g->b, g->vf, "");
        LLVMAddIncoming(acc[i], (LLVMValueRef[]){part[0][i], part[1][i]}, ends, 2);
    }
}

/* What the rows of a tile's epilogue read: gen_macro's values. */
typedef struct {
    const mpt_cpu_gemm_desc *d;
    const mpt_cpu_epi_operand *ops;
    LLVMValueRef tile, i0, j0, row0, col0, has_prior, prior_in_tiles, prior, ldp, is_final, dst,
        ldd;
    LLVMValueRef c_row; /* desc.c_rows: the table of C's row offsets; else NULL */
    const LLVMValueRef *masks;
    int nv;
} tile_rows;

/* Rows r .. r + n - 1 (n 1 or 2) of the stack tile: add prior, then
 * either the epilogue or raw f32. Two rows at once give the epilogue
 * twice the independent chains per iteration: GELU's derivative is about
 * 80 dependent operations, and with one row's two vectors an iteration
 * the MLP's data gradient (2048 x 512 x 128 times gelu') took 5.0-5.5
 * ms, with two rows 4.1-4.3 (GELU itself and the other epilogues: no
 * change; four rows at once: no gain). */
static void gen_tile_rows(mpt_cpu_gen *g, const tile_rows *t, LLVMValueRef r, int n) {
    const mpt_cpu_gemm_shape *s = g->s;
    int nv = t->nv;
    LLVMValueRef bi[2], x[2][4], xp[2][4];
    for (int k = 0; k < n; k++) {
        LLVMValueRef rk = LLVMBuildAdd(g->b, r, ci64(g, k), "");
        bi[k] = LLVMBuildAdd(g->b, t->i0, rk, "");
        for (int v = 0; v < nv; v++) {
            LLVMValueRef ti =
                LLVMBuildAdd(g->b, LLVMBuildMul(g->b, rk, ci64(g, s->nr), ""), ci64(g, v * s->vl), "");
            x[k][v] = load(g, g->vf, addr(g, t->tile, ti, 4, g->vf), 64);
        }
    }
    /* Prior is read only where there is one: a masked load whose mask is
     * all false still walks the page of its address, and near NULL that
     * walk fails into a microcode assist costing hundreds of cycles a row
     * (measured: ~1.7 ns per element of C, which made short-K GEMMs with
     * an epilogue or a bf16 C run at a fraction of their rate). */
    LLVMBasicBlockRef from = LLVMGetInsertBlock(g->b);
    LLVMBasicBlockRef add_prior = LLVMAppendBasicBlockInContext(g->c, g->fn, "addprior");
    LLVMBasicBlockRef added = LLVMAppendBasicBlockInContext(g->c, g->fn, "added");
    LLVMBuildCondBr(g->b,
                    LLVMBuildAnd(g->b, t->has_prior, LLVMBuildNot(g->b, t->prior_in_tiles, ""), ""),
                    add_prior, added);
    LLVMPositionBuilderAtEnd(g->b, add_prior);
    for (int k = 0; k < n; k++)
        for (int v = 0; v < nv; v++) {
            LLVMValueRef pi = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, bi[k], t->ldp, ""),
                                           LLVMBuildAdd(g->b, t->j0, ci64(g, v * s->vl), ""), "");
            xp[k][v] = LLVMBuildFAdd(g->b, x[k][v],
                                     load_vec_f32(g, MPT_DT_F32, t->prior, pi, t->masks[v]), "");
        }
    LLVMBuildBr(g->b, added);
    LLVMPositionBuilderAtEnd(g->b, added);
    for (int k = 0; k < n; k++)
        for (int v = 0; v < nv; v++) {
            LLVMValueRef phi = LLVMBuildPhi(g->b, g->vf, "");
            LLVMValueRef vals[2] = {x[k][v], xp[k][v]};
            LLVMBasicBlockRef bbs[2] = {from, add_prior};
            LLVMAddIncoming(phi, vals, bbs, 2);
            x[k][v] = phi;
        }
    LLVMBasicBlockRef fin = LLVMAppendBasicBlockInContext(g->c, g->fn, "final");
    LLVMBasicBlockRef raw = LLVMAppendBasicBlockInContext(g->c, g->fn, "raw");
    LLVMBasicBlockRef rows_done = LLVMAppendBasicBlockInContext(g->c, g->fn, "rowsdone");
    LLVMBuildCondBr(g->b, t->is_final, fin, raw);
    LLVMPositionBuilderAtEnd(g->b, fin);
    LLVMValueRef y[2][4];
    for (int k = 0; k < n; k++)
        for (int v = 0; v < nv; v++) {
            LLVMValueRef jcol = LLVMBuildAdd(g->b, t->j0, ci64(g, v * s->vl), "");
            y[k][v] = mpt_cpu_gemm_apply_epilogue(g, t->d, t->ops, x[k][v],
                                                  LLVMBuildAdd(g->b, t->row0, bi[k], ""),
                                                  LLVMBuildAdd(g->b, t->col0, jcol, ""), t->masks[v]);
        }
    for (int k = 0; k < n; k++) {
        /* the row's start: dst + row * ldd, or its offset in the table */
        LLVMValueRef base = t->dst, at = LLVMBuildMul(g->b, bi[k], t->ldd, "");
        if (t->c_row) {
            LLVMValueRef off = load(g, g->i64, addr(g, t->c_row, LLVMBuildAdd(g->b, t->row0, bi[k], ""),
                                                    8, g->i64), 8);
            base = LLVMBuildGEP2(g->b, g->i8, t->dst, &off, 1, "");
            at = ci64(g, 0);
        }
        for (int v = 0; v < nv; v++) {
            LLVMValueRef jcol = LLVMBuildAdd(g->b, t->j0, ci64(g, v * s->vl), "");
            mpt_cpu_gemm_store_vec(g, t->d->c_dt, y[k][v], base, LLVMBuildAdd(g->b, at, jcol, ""),
                                   t->masks[v]);
        }
    }
    LLVMBuildBr(g->b, rows_done);
    LLVMPositionBuilderAtEnd(g->b, raw);
    for (int k = 0; k < n; k++)
        for (int v = 0; v < nv; v++) {
            LLVMValueRef jcol = LLVMBuildAdd(g->b, t->j0, ci64(g, v * s->vl), "");
            mpt_cpu_gemm_store_vec(g, MPT_DT_F32, x[k][v], t->dst,
                                   LLVMBuildAdd(g->b, LLVMBuildMul(g->b, bi[k], t->ldd, ""), jcol, ""),
                                   t->masks[v]);
        }
    LLVMBuildBr(g->b, rows_done);
    LLVMPositionBuilderAtEnd(g->b, rows_done);
}

static void gen_macro(mpt_cpu_gen *g, const mpt_cpu_gemm_desc *d, const char *name) {
    const mpt_cpu_gemm_shape *s = g->s;
    int nv = s->nr / s->vl;
    LLVMTypeRef params[19] = {g->p8,  g->p8,  g->i64, g->i64, g->i64, g->p8,  g->i64,
                              g->p8,  g->i64, g->i32, g->i64, g->i64, g->p8,  g->i64,
                              g->p8,  g->p8,  g->p8,  g->i64, g->i64};
    g->fn =
        LLVMAddFunction(g->m, name, LLVMFunctionType(LLVMVoidTypeInContext(g->c), params, 19, 0));
    mpt_cpu_jit_set_fn_attrs(g->jit, g->fn);
    LLVMValueRef P[19];
    for (int i = 0; i < 19; i++)
        P[i] = LLVMGetParam(g->fn, (unsigned)i);
    /* ap: the packed A block, or (a_gather) the block's first row offset */
    LLVMValueRef ap = P[0], bp = P[1], mc = P[2], nc = P[3], kc = P[4], prior = P[5], ldp = P[6],
                 dst = P[7], ldd = P[8], final = P[9], row0 = P[10], col0 = P[11], epi = P[12],
                 a_row_bytes = P[13], a_base = P[14], a_col = P[15], a_krange = P[16],
                 k0 = P[17], k_run = P[18];
    LLVMPositionBuilderAtEnd(g->b, LLVMAppendBasicBlockInContext(g->c, g->fn, "entry"));
    LLVMTypeRef tile_t = LLVMArrayType(g->f32, (unsigned)(s->mr * s->nr));
    LLVMValueRef tile = LLVMBuildAlloca(g->b, tile_t, "tile");
    LLVMSetAlignment(tile, 64);
    tile = LLVMBuildBitCast(g->b, tile, g->p8, "");
    g->a_pf_rows = NULL;
    if (d->a_gather)
        g->a_pf_rows = LLVMBuildBitCast(
            g->b, LLVMBuildAlloca(g->b, LLVMArrayType(g->p8, 16), "arows"), g->p8, "");

    mpt_cpu_epi_operand ops[MPT_CPU_EPI_MAX];
    for (int i = 0; i < d->n_steps; i++) {
        int64_t base = i * (int64_t)sizeof(mpt_cpu_epi_arg);
        ops[i].ptr = load(
            g, g->p8, addr(g, epi, ci64(g, base + offsetof(mpt_cpu_epi_arg, ptr)), 1, g->p8), 8);
        ops[i].ld = load(g, g->i64,
                         addr(g, epi, ci64(g, base + offsetof(mpt_cpu_epi_arg, ld)), 1, g->i64), 8);
        ops[i].scalar =
            load(g, g->f32,
                 addr(g, epi, ci64(g, base + offsetof(mpt_cpu_epi_arg, scalar)), 1, g->f32), 4);
    }
    LLVMValueRef c_row = d->c_rows ? load(g, g->p8,
                                          addr(g, epi, ci64(g, offsetof(mpt_cpu_epilogue_args, c_row)),
                                               1, g->p8), 8)
                                   : NULL;
    LLVMValueRef has_prior = LLVMBuildICmp(g->b, LLVMIntNE, prior, LLVMConstNull(g->p8), "");
    LLVMValueRef is_final = LLVMBuildICmp(g->b, LLVMIntNE, final, ci32(g, 0), "");
    LLVMValueRef kk = cells_per_k(g, kc);
    g->a_pf_end = kk;
    /* bytes between rows of A: packed slivers, or (AMX) A read in place */
    LLVMValueRef a_stride = LLVMBuildMul(g->b, kk, ci64(g, 4), "");
    if (s->amx) {
        mpt_cpu_amx_configure(g);
        LLVMValueRef in_place = LLVMBuildICmp(g->b, LLVMIntNE, a_row_bytes, ci64(g, 0), "");
        a_stride = LLVMBuildSelect(g->b, in_place, a_row_bytes, a_stride, "");
    }
    LLVMValueRef nt =
        LLVMBuildSDiv(g->b, LLVMBuildAdd(g->b, nc, ci64(g, s->nr - 1), ""), ci64(g, s->nr), "");
    LLVMValueRef mt =
        LLVMBuildSDiv(g->b, LLVMBuildAdd(g->b, mc, ci64(g, s->mr - 1), ""), ci64(g, s->mr), "");
    LLVMValueRef lanes[16];
    for (int i = 0; i < s->vl; i++)
        lanes[i] = ci32(g, i);
    LLVMValueRef lane_idx = LLVMConstVector(lanes, (unsigned)s->vl);

    mpt_cpu_loop lj, li, lr;
    LLVMValueRef jt = loop_begin(g, &lj, ci64(g, 0), nt, "jt");
    LLVMValueRef j0 = LLVMBuildMul(g->b, jt, ci64(g, s->nr), "");
    LLVMValueRef b_sl = LLVMBuildGEP2(
        g->b, g->i8, bp,
        (LLVMValueRef[]){LLVMBuildMul(g->b, LLVMBuildMul(g->b, j0, kk, ""), ci64(g, 4), "")}, 1,
        "");
    LLVMValueRef n_rem = smin(g, ci64(g, s->nr), LLVMBuildSub(g->b, nc, j0, ""));
    LLVMValueRef masks[4];
    LLVMValueRef n_rem32 = LLVMBuildTrunc(g->b, n_rem, g->i32, "");
    for (int v = 0; v < nv; v++)
        masks[v] = LLVMBuildICmp(
            g->b, LLVMIntSLT, lane_idx,
            splat(g, LLVMBuildSub(g->b, n_rem32, ci32(g, v * s->vl), ""), g->vi32), "");

    LLVMValueRef it = loop_begin(g, &li, ci64(g, 0), mt, "it");
    LLVMValueRef i0 = LLVMBuildMul(g->b, it, ci64(g, s->mr), "");
    LLVMValueRef a_ofs = LLVMBuildMul(g->b, i0, a_stride, "");
    LLVMValueRef a_sl = LLVMBuildGEP2(g->b, g->i8, ap, &a_ofs, 1, "");
    /* The tile's rows of C are mr different pages apart; touching the next
     * tile's rows now overlaps their cache misses with this tile's k loop
     * instead of stalling the stores after it (with K = 10 this tile's own
     * k loop is too short to hide them: 51% -> 56% of OpenBLAS). Prefetches
     * never fault, so rows past mc are harmless. AMX tiles do it only for
     * a k block shorter than AMX_C_PREFETCH_KC: C's rows of a wide N share
     * an L1 set or two, and 64 lines a tile pushed out the operands' lines
     * that the tile loads of a long k loop were reading (2 threads, bf16,
     * bench_gemm: 512 x 1024 x 1024 +8-9%, 1024 x 1024 x 512 (A
     * transposed) +10-16%, 6272 x 128 x 512 +13-20%; K = 64 2-3% slower
     * without it, so short blocks keep it). */
    LLVMBasicBlockRef pf_done = NULL;
    if (s->amx) {
        LLVMBasicBlockRef pf = LLVMAppendBasicBlockInContext(g->c, g->fn, "cprefetch");
        pf_done = LLVMAppendBasicBlockInContext(g->c, g->fn, "cprefetched");
        LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSLT, kc, ci64(g, AMX_C_PREFETCH_KC), ""),
                        pf, pf_done);
        LLVMPositionBuilderAtEnd(g->b, pf);
    }
    for (int r = 0; r < s->mr; r++) {
        LLVMValueRef row = LLVMBuildAdd(g->b, i0, ci64(g, s->mr + r), "");
        /* without a prior, its lines would be addresses near NULL, whose
         * failing page walks cost more than they save: touch dst twice */
        LLVMValueRef pa = LLVMBuildSelect(
            g->b, has_prior,
            addr(g, prior, LLVMBuildAdd(g->b, LLVMBuildMul(g->b, row, ldp, ""), j0, ""), 4, g->i8),
            addr(g, dst, LLVMBuildAdd(g->b, LLVMBuildMul(g->b, row, ldd, ""), j0, ""),
                 mpt_dtype_size(d->c_dt) > 2 ? 4 : 2, g->i8),
            "");
        LLVMValueRef da = addr(g, dst, LLVMBuildAdd(g->b, LLVMBuildMul(g->b, row, ldd, ""), j0, ""),
                               mpt_dtype_size(d->c_dt) > 2 ? 4 : 2, g->i8);
        for (int h = 0; h < 4; h++) /* prior then dst, two cache lines each */
            prefetch_l1(g, LLVMBuildGEP2(g->b, g->i8, h < 2 ? pa : da,
                                         (LLVMValueRef[]){ci64(g, (h & 1) * 64)}, 1, ""),
                        h >= 2);
    }
    if (pf_done) {
        LLVMBuildBr(g->b, pf_done);
        LLVMPositionBuilderAtEnd(g->b, pf_done);
    }
    /* The same for the [M, N] operands the epilogue reads (a residual, a
     * ReLU mask, GELU's pre-activation): their rows are as far apart as
     * C's, and the hardware prefetchers follow no stream across them. The
     * gelu' GEMM of GPT's MLP (2048 x 512, its pre-activation long out of
     * cache) spent as long waiting for those loads as multiplying. */
    for (int i = 0; i < d->n_steps; i++) {
        mpt_cpu_epi_op op = d->steps[i].op;
        if (op != MPT_CPU_EPI_RESIDUAL && op != MPT_CPU_EPI_RELU_MASK && op != MPT_CPU_EPI_GELU_GRAD)
            continue;
        int esz = mpt_dtype_size(d->steps[i].dt) > 2 ? 4 : 2, lines = (s->nr * esz + 63) / 64;
        for (int r = 0; r < s->mr; r++) {
            LLVMValueRef row = LLVMBuildAdd(g->b, row0, LLVMBuildAdd(g->b, i0, ci64(g, s->mr + r), ""), "");
            LLVMValueRef at = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, row, ops[i].ld, ""),
                                           LLVMBuildAdd(g->b, col0, j0, ""), "");
            LLVMValueRef pa = addr(g, ops[i].ptr, at, esz, g->i8);
            for (int h = 0; h < lines; h++)
                prefetch_l1(g, LLVMBuildGEP2(g->b, g->i8, pa, (LLVMValueRef[]){ci64(g, h * 64)}, 1, ""), 0);
        }
    }
    LLVMValueRef m_rem = smin(g, ci64(g, s->mr), LLVMBuildSub(g->b, mc, i0, ""));
    LLVMBasicBlockRef tile_done = LLVMAppendBasicBlockInContext(g->c, g->fn, "tiledone");
    LLVMValueRef prior_in_tiles = LLVMConstInt(g->i1, 0, 0);
    if (s->amx) {
        /* Full tiles keep partial sums in the tile registers: prior loaded
         * into them, partial sums (or a raw f32 C) stored from them, so a
         * k block costs 4 tile loads and 4 tile stores instead of a pass of
         * vector loads, adds and stores through the stack tile. */
        LLVMValueRef full = whole_tile(g, m_rem, n_rem);
        prior_in_tiles = LLVMBuildAnd(g->b, full, has_prior, "");
        LLVMValueRef a_sl1 = NULL, tile_col = NULL;
        if (d->a_tiles) {
            /* the tile's two 16-row halves start at rows i0 and i0 + 16 */
            LLVMValueRef r0 = load(g, g->i64, addr(g, ap, i0, 8, g->i64), 8);
            LLVMValueRef r1 = load(g, g->i64,
                                   addr(g, ap, LLVMBuildAdd(g->b, i0, ci64(g, 16), ""), 8, g->i64),
                                   8);
            a_sl = LLVMBuildGEP2(g->b, g->i8, a_base, &r0, 1, "");
            a_sl1 = LLVMBuildGEP2(g->b, g->i8, a_base, &r1, 1, "");
            tile_col = a_col;
        }
        mpt_cpu_amx_k_loop(g, a_sl, a_sl1, tile_col, a_stride, b_sl, kk, prior_in_tiles, prior, ldp,
                       i0, j0);
        LLVMValueRef direct = stores_raw(g, d, full, is_final);
        LLVMBasicBlockRef to_dst = LLVMAppendBasicBlockInContext(g->c, g->fn, "cdirect");
        LLVMBasicBlockRef to_tile = LLVMAppendBasicBlockInContext(g->c, g->fn, "cspill");
        LLVMBuildCondBr(g->b, direct, to_dst, to_tile);
        LLVMPositionBuilderAtEnd(g->b, to_dst);
        mpt_cpu_amx_store_c(g, dst, ldd, i0, j0);
        LLVMBuildBr(g->b, tile_done);
        LLVMPositionBuilderAtEnd(g->b, to_tile);
        mpt_cpu_amx_store_c(g, tile, ci64(g, s->nr), ci64(g, 0), ci64(g, 0));
    } else {
        LLVMValueRef acc[14 * 4], rows[14];
        if (d->a_gather)
            /* rows past the block's edge repeat its first row: their sums
             * are never stored */
            for (int r = 0; r < s->mr; r++) {
                LLVMValueRef ri = LLVMBuildSelect(
                    g->b, LLVMBuildICmp(g->b, LLVMIntSLT, ci64(g, r), m_rem, ""),
                    LLVMBuildAdd(g->b, i0, ci64(g, r), ""), i0, "");
                LLVMValueRef off = load(g, g->i64, addr(g, ap, ri, 8, g->i64), 8);
                rows[r] = LLVMBuildGEP2(g->b, g->i8, a_base, &off, 1, "");
                store(g, rows[r], addr(g, g->a_pf_rows, ci64(g, r), 8, g->p8), 8);
            }
        if (d->a_gather && d->a_row_step != 0 && s->vl == 16)
            gen_strided_or_not(g, d, a_sl, b_sl, kk, rows, a_col, a_krange, k_run, k0, i0, m_rem,
                               acc);
        else if (d->a_gather)
            gen_ranged_k_loops(g, a_sl, b_sl, kk, rows, a_col, a_krange, k_run, k0, i0, m_rem,
                               d->a_dt, acc);
        else
            gen_tile_k_loop(g, a_sl, b_sl, ci64(g, 0), kk, NULL, a_col, d->a_dt, NULL, acc);
        gen_direct_store(g, d, acc, m_rem, n_rem, is_final, has_prior, prior, ldp, dst, ldd, i0, j0,
                         tile_done);
        for (int i = 0; i < s->mr * nv; i++)
            store(g, acc[i], addr(g, tile, ci64(g, i * s->vl), 4, g->vf), 64);
    }

    /* the tile's rows two at a time, then an odd last one */
    tile_rows tr = {d, ops, tile, i0, j0, row0, col0, has_prior, prior_in_tiles, prior, ldp,
                    is_final, dst, ldd, c_row, masks, nv};
    LLVMValueRef pair =
        loop_begin(g, &lr, ci64(g, 0), LLVMBuildSDiv(g->b, m_rem, ci64(g, 2), ""), "rows2");
    gen_tile_rows(g, &tr, LLVMBuildMul(g->b, pair, ci64(g, 2), ""), 2);
    loop_end(g, &lr);
    LLVMBasicBlockRef odd = LLVMAppendBasicBlockInContext(g->c, g->fn, "rowodd");
    LLVMBuildCondBr(g->b,
                    LLVMBuildICmp(g->b, LLVMIntNE, LLVMBuildAnd(g->b, m_rem, ci64(g, 1), ""),
                                  ci64(g, 0), ""),
                    odd, tile_done);
    LLVMPositionBuilderAtEnd(g->b, odd);
    gen_tile_rows(g, &tr, LLVMBuildSub(g->b, m_rem, ci64(g, 1), ""), 1);
    LLVMBuildBr(g->b, tile_done);
    LLVMPositionBuilderAtEnd(g->b, tile_done);
    loop_end(g, &li);
    loop_end(g, &lj);
    if (s->amx)
        call_intrinsic(g, "llvm.x86.tilerelease", NULL, 0, NULL, 0);
    LLVMBuildRetVoid(g->b);
}

void mpt_cpu_gemm_generate(mpt_cpu_jit *j, LLVMModuleRef m, const mpt_cpu_gemm_desc *d,
                           const mpt_cpu_gemm_shape *s, const char *prefix) {
    mpt_cpu_gen g = {.jit = j, .s = s, .m = m, .c = LLVMGetModuleContext(m)};
    g.b = LLVMCreateBuilderInContext(g.c);
    g.f32 = LLVMFloatTypeInContext(g.c);
    g.half = LLVMHalfTypeInContext(g.c);
    g.i1 = LLVMInt1TypeInContext(g.c);
    g.i8 = LLVMInt8TypeInContext(g.c);
    g.i16 = LLVMInt16TypeInContext(g.c);
    g.i32 = LLVMInt32TypeInContext(g.c);
    g.i64 = LLVMInt64TypeInContext(g.c);
    g.p8 = LLVMPointerType(g.i8, 0);
    g.vf = LLVMVectorType(g.f32, (unsigned)s->vl);
    g.vh = LLVMVectorType(g.half, (unsigned)s->vl);
    g.vi16 = LLVMVectorType(g.i16, (unsigned)s->vl);
    g.vi32 = LLVMVectorType(g.i32, (unsigned)s->vl);
    g.vmask = LLVMVectorType(g.i1, (unsigned)s->vl);
    g.cvt_bf16 = d->flush_denormals && s->vl == 16 && mpt_cpu_jit_has_bf16_dot(j);
    char name[128];
    snprintf(name, sizeof name, "%s_pack_a", prefix);
    if (s->amx)
        mpt_cpu_gen_pack_rows(&g, s->mr, name);
    else
        mpt_cpu_gen_pack(&g, d->a_dt, s->mr, name);
    snprintf(name, sizeof name, "%s_pack_b", prefix);
    mpt_cpu_gen_pack(&g, d->b_dt, s->nr, name);
    snprintf(name, sizeof name, "%s_macro", prefix);
    gen_macro(&g, d, name);
    LLVMDisposeBuilder(g.b);
}
