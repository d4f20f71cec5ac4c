/* codegen/cpu/gemm_pack.c — the GEMM's packing routines, built with the
 * LLVM C API: copies of an A or B window into the zero-padded sliver
 * layouts of cpu_internal.h, converting dtypes on the way. Each routine
 * picks, per sliver, the fastest path its strides allow: whole-vector
 * copies when a sliver's rows are contiguous, in-register transposes or
 * gathers when k is, and a scalar loop (any strides, partial slivers)
 * otherwise. */
#include "codegen/cpu/gemm_ir.h"

/* Every sliver of a window whose rows are contiguous (sw = 1), k
 * outermost: each source row is read from start to end across the
 * slivers, so the hardware prefetcher sees one stream per row instead of
 * a new line every row (or 2) down a sliver (rows N apart, pages apart for
 * a wide B; sliver by sliver the loads waited on memory: 1024 x 1024 bf16
 * B packed at ~10 GB/s; a 1x1 filter gradient's x^T, 64 rows of 14-row
 * slivers in bf16, packed at half the f32 speed). This one: an f32
 * (converted) per k and w, the n_full full slivers and then the partial
 * one, its loads masked to its rows (zeros past them). */
static void pack_f32_rows_across(mpt_cpu_gen *g, mpt_dtype dt, int width, LLVMValueRef src,
                                 LLVMValueRef sk, LLVMValueRef w0, LLVMValueRef k0,
                                 LLVMValueRef kc, LLVMValueRef wc, LLVMValueRef dst) {
    int vl = g->s->vl, nv = (width + vl - 1) / vl;
    unsigned align = width % vl ? 4 : 64;
    LLVMValueRef n_full = LLVMBuildSDiv(g->b, wc, ci64(g, width), "");
    LLVMValueRef rem = LLVMBuildSub(g->b, wc, LLVMBuildMul(g->b, n_full, ci64(g, width), ""), "");
    LLVMValueRef sliver = LLVMBuildMul(g->b, kc, ci64(g, width), "");
    LLVMValueRef all = LLVMConstAllOnes(g->vmask), tail = tail_mask(g, width), in[16];
    for (int v = 0; v < nv; v++) in[v] = lane_mask(g, vl, ci64(g, v * vl), rem);
    mpt_cpu_loop lk, lt;
    LLVMValueRef k = loop_begin(g, &lk, ci64(g, 0), kc, "ak");
    LLVMValueRef row = LLVMBuildAdd(
        g->b, LLVMBuildMul(g->b, LLVMBuildAdd(g->b, k0, k, ""), sk, ""), w0, "");
    LLVMValueRef kw = LLVMBuildMul(g->b, k, ci64(g, width), "");
    LLVMValueRef t = loop_begin(g, &lt, ci64(g, 0), n_full, "at");
    LLVMValueRef tw = LLVMBuildMul(g->b, t, ci64(g, width), "");
    LLVMValueRef d0 = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, t, sliver, ""), kw, "");
    for (int v = 0; v < nv; v++) {
        LLVMValueRef m = v == nv - 1 ? tail : all;
        LLVMValueRef si = LLVMBuildAdd(g->b, LLVMBuildAdd(g->b, row, tw, ""), ci64(g, v * vl), "");
        LLVMValueRef x = load_vec_f32(g, dt, src, si, m);
        masked_store(g, x, addr(g, dst, LLVMBuildAdd(g->b, d0, ci64(g, v * vl), ""), 4, g->vf), m,
                     align);
    }
    loop_end(g, &lt);
    LLVMBasicBlockRef part = LLVMAppendBasicBlockInContext(g->c, g->fn, "apart");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(g->c, g->fn, "adone");
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntSGT, rem, ci64(g, 0), ""), part, done);
    LLVMPositionBuilderAtEnd(g->b, part);
    LLVMValueRef tw_p = LLVMBuildMul(g->b, n_full, ci64(g, width), "");
    LLVMValueRef d_p = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, n_full, sliver, ""), kw, "");
    for (int v = 0; v < nv; v++) {
        LLVMValueRef si = LLVMBuildAdd(g->b, LLVMBuildAdd(g->b, row, tw_p, ""), ci64(g, v * vl), "");
        LLVMValueRef x = load_vec_f32(g, dt, src, si, in[v]);
        masked_store(g, x, addr(g, dst, LLVMBuildAdd(g->b, d_p, ci64(g, v * vl), ""), 4, g->vf),
                     v == nv - 1 ? tail : all, align);
    }
    LLVMBuildBr(g->b, done);
    LLVMPositionBuilderAtEnd(g->b, done);
    loop_end(g, &lk);
}

/* The shuffle of two width-lane rows a, b into pairs (a[i], b[i]) */
static LLVMValueRef interleave(mpt_cpu_gen *g, int width) {
    LLVMValueRef idx[128];
    for (int i = 0; i < width; i++) {
        idx[2 * i] = ci32(g, i);
        idx[2 * i + 1] = ci32(g, width + i);
    }
    return LLVMConstVector(idx, (unsigned)(2 * width));
}

/* The same for bf16 pairs: rows k0 + 2q and k0 + 2q + 1 loaded whole and
 * interleaved into [w][2]; a row at or past kc reads as zeros. */
static void pack_pairs_rows_across(mpt_cpu_gen *g, int width, LLVMValueRef src, LLVMValueRef sk,
                                   LLVMValueRef w0, LLVMValueRef k0, LLVMValueRef kc,
                                   LLVMValueRef kk, LLVMValueRef n_full, LLVMValueRef dst) {
    LLVMTypeRef vt = LLVMVectorType(g->i16, (unsigned)width);
    LLVMValueRef inter = interleave(g, width);
    LLVMValueRef sliver = LLVMBuildMul(g->b, kk, ci64(g, width), ""); /* cells */
    mpt_cpu_loop lq, lt;
    LLVMValueRef q = loop_begin(g, &lq, ci64(g, 0), kk, "aq");
    LLVMValueRef m[2], row[2];
    for (int h = 0; h < 2; h++) {
        LLVMValueRef k = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, q, ci64(g, 2), ""), ci64(g, h), "");
        LLVMValueRef valid = LLVMBuildICmp(g->b, LLVMIntSLT, k, kc, "");
        m[h] = LLVMBuildSelect(g->b, valid, const_mask(g, width, 1), const_mask(g, width, 0), "");
        row[h] = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, LLVMBuildAdd(g->b, k0, k, ""), sk, ""), w0,
                              "");
    }
    LLVMValueRef t = loop_begin(g, &lt, ci64(g, 0), n_full, "at");
    LLVMValueRef tw = LLVMBuildMul(g->b, t, ci64(g, width), "");
    LLVMValueRef v[2];
    for (int h = 0; h < 2; h++)
        v[h] = masked_load(g, vt, addr(g, src, LLVMBuildAdd(g->b, row[h], tw, ""), 2, vt), m[h], 2);
    LLVMValueRef x = LLVMBuildShuffleVector(g->b, v[0], v[1], inter, "");
    LLVMValueRef di = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, t, sliver, ""),
                                   LLVMBuildMul(g->b, q, ci64(g, width), ""), "");
    store(g, x, addr(g, dst, di, 4, LLVMTypeOf(x)), 64);
    loop_end(g, &lt);
    loop_end(g, &lq);
}

/* The same for one sliver of rem <= width rows (a partial one, or a
 * width the across copy does not take): loads masked to the rem and to
 * k < kc, zeros past them. Scalar before: the vdpbf16ps path's 1x1
 * filter gradient (x^T, 14-row slivers) spent more time packing A than
 * multiplying. */
static void pack_pairs_rows_vector(mpt_cpu_gen *g, int width, LLVMValueRef src, LLVMValueRef sk,
                                   LLVMValueRef wbase, LLVMValueRef k0, LLVMValueRef kc,
                                   LLVMValueRef kk, LLVMValueRef rem, LLVMValueRef dst_t) {
    LLVMTypeRef vt = LLVMVectorType(g->i16, (unsigned)width);
    LLVMValueRef inter = interleave(g, width);
    LLVMValueRef in = lane_mask(g, width, ci64(g, 0), rem), none = const_mask(g, width, 0);
    mpt_cpu_loop lq;
    LLVMValueRef q = loop_begin(g, &lq, ci64(g, 0), kk, "vq");
    LLVMValueRef v[2];
    for (int h = 0; h < 2; h++) {
        LLVMValueRef k = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, q, ci64(g, 2), ""), ci64(g, h), "");
        LLVMValueRef valid = LLVMBuildICmp(g->b, LLVMIntSLT, k, kc, "");
        LLVMValueRef m = LLVMBuildSelect(g->b, valid, in, none, "");
        LLVMValueRef row = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, LLVMBuildAdd(g->b, k0, k, ""), sk, ""),
                                        wbase, "");
        v[h] = masked_load(g, vt, addr(g, src, row, 2, vt), m, 2);
    }
    LLVMValueRef x = LLVMBuildShuffleVector(g->b, v[0], v[1], inter, "");
    store(g, x, addr(g, dst_t, LLVMBuildMul(g->b, q, ci64(g, width), ""), 4, LLVMTypeOf(x)), 4);
    loop_end(g, &lq);
}

/* bf16 pairs of a full sliver whose k is contiguous (sk = 1): each pair is
 * one aligned-or-not 4-byte cell, gathered across the width rows. Covers the
 * whole pairs [0, kc/2); the caller packs the rest. */
static void pack_pairs_gather(mpt_cpu_gen *g, int width, LLVMValueRef src, LLVMValueRef sw,
                              LLVMValueRef wbase, LLVMValueRef k0, LLVMValueRef kc,
                              LLVMValueRef dst_t) {
    int nv = width / g->s->vl;
    LLVMTypeRef pt = LLVMPointerType(g->i32, 0);
    LLVMTypeRef vpt = LLVMVectorType(pt, (unsigned)g->s->vl);
    LLVMTypeRef vi64 = LLVMVectorType(g->i64, (unsigned)g->s->vl);
    LLVMValueRef rowoff[4];
    for (int v = 0; v < nv; v++) {
        LLVMValueRef e[16];
        for (int i = 0; i < g->s->vl; i++)
            e[i] = ci64(g, v * g->s->vl + i);
        /* byte offset of row w: (wbase + w) * sw * 2 */
        LLVMValueRef w =
            LLVMBuildAdd(g->b, LLVMConstVector(e, (unsigned)g->s->vl), splat(g, wbase, vi64), "");
        rowoff[v] =
            LLVMBuildMul(g->b, w, splat(g, LLVMBuildMul(g->b, sw, ci64(g, 2), ""), vi64), "");
    }
    LLVMValueRef full = LLVMBuildSDiv(g->b, kc, ci64(g, 2), "");
    mpt_cpu_loop lq;
    LLVMValueRef q = loop_begin(g, &lq, ci64(g, 0), full, "gq");
    LLVMValueRef kb = LLVMBuildMul(
        g->b, LLVMBuildAdd(g->b, k0, LLVMBuildMul(g->b, q, ci64(g, 2), ""), ""), ci64(g, 2), "");
    LLVMValueRef base = LLVMBuildGEP2(g->b, g->i8, src, &kb, 1, "");
    for (int v = 0; v < nv; v++) {
        LLVMValueRef ptrs =
            LLVMBuildGEP2(g->b, g->i8, splat(g, base, LLVMVectorType(g->p8, (unsigned)g->s->vl)),
                          &rowoff[v], 1, "");
        ptrs = LLVMBuildBitCast(g->b, ptrs, vpt, "");
        LLVMTypeRef over[2] = {g->vi32, vpt};
        LLVMValueRef args[4] = {ptrs, ci32(g, 2), LLVMConstAllOnes(g->vmask),
                                LLVMGetUndef(g->vi32)};
        LLVMValueRef x = call_intrinsic(g, "llvm.masked.gather", over, 2, args, 4);
        LLVMValueRef di = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, q, ci64(g, width), ""),
                                       ci64(g, v * g->s->vl), "");
        store(g, x, addr(g, dst_t, di, 4, g->vi32), 64);
    }
    loop_end(g, &lq);
}

/* n x n transpose of 32-bit cells (n = 8 or 16): log2(n) stages, each
 * swapping bit s of the row index with bit s of the lane index between
 * rows i and i + s. */
static void transpose_cells(mpt_cpu_gen *g, LLVMValueRef *v, int n) {
    for (int s = n / 2; s >= 1; s /= 2) {
        LLVMValueRef lo[16], hi[16];
        for (int j = 0; j < n; j++) {
            lo[j] = ci32(g, j & s ? n + j - s : j);
            hi[j] = ci32(g, j & s ? n + j : j + s);
        }
        LLVMValueRef mlo = LLVMConstVector(lo, (unsigned)n), mhi = LLVMConstVector(hi, (unsigned)n);
        for (int i = 0; i < n; i++) {
            if (i & s)
                continue;
            LLVMValueRef a = v[i], b = v[i + s];
            v[i] = LLVMBuildShuffleVector(g->b, a, b, mlo, "");
            v[i + s] = LLVMBuildShuffleVector(g->b, a, b, mhi, "");
        }
    }
}

/* f32 dst[t] for a full sliver with contiguous k (sk = 1), k in chunks of
 * L = vl (8 or 16): per chunk and L rows, each row's L k loaded whole
 * (converted to f32), one L x L transpose in registers, and the k vectors
 * stored width lanes at a time. Gathers (per k, one element of each row)
 * ran at a fraction of this on Sapphire Rapids. Covers k in
 * [0, kc / L * L) and returns that end. */
static LLVMValueRef pack_transpose_f32(mpt_cpu_gen *g, mpt_dtype dt, int width, LLVMValueRef src,
                                       LLVMValueRef sw, LLVMValueRef wbase, LLVMValueRef k0,
                                       LLVMValueRef kc, LLVMValueRef dst_t) {
    int L = g->s->vl;
    LLVMValueRef all = LLVMConstAllOnes(g->vmask);
    LLVMValueRef n_chunks = LLVMBuildSDiv(g->b, kc, ci64(g, L), "");
    mpt_cpu_loop lc;
    LLVMValueRef c = loop_begin(g, &lc, ci64(g, 0), n_chunks, "tc");
    LLVMValueRef kb = LLVMBuildMul(g->b, c, ci64(g, L), "");
    LLVMValueRef col = LLVMBuildAdd(g->b, k0, kb, "");
    for (int h = 0; h * L < width; h++) {
        int n = width - h * L < L ? width - h * L : L;
        LLVMValueRef v[16];
        for (int w = 0; w < L; w++) {
            if (w >= n) {
                v[w] = LLVMConstNull(g->vf);
                continue;
            }
            LLVMValueRef r = LLVMBuildAdd(g->b, wbase, ci64(g, h * L + w), "");
            LLVMValueRef si = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, r, sw, ""), col, "");
            v[w] = load_vec_f32(g, dt, src, si, all);
        }
        transpose_cells(g, v, L);
        LLVMValueRef e[16];
        for (int i = 0; i < L; i++)
            e[i] = LLVMConstInt(g->i1, (uint64_t)(i < n), 0);
        LLVMValueRef m = LLVMConstVector(e, (unsigned)L);
        /* k row q of the sliver starts (kb + q) * width cells in */
        unsigned align = 64;
        while (align > 4 && ((width * 4) % align || (h * L * 4) % align))
            align /= 2;
        for (int q = 0; q < L; q++) {
            LLVMValueRef di = LLVMBuildAdd(
                g->b, LLVMBuildMul(g->b, LLVMBuildAdd(g->b, kb, ci64(g, q), ""), ci64(g, width), ""),
                ci64(g, h * L), "");
            masked_store(g, v[q], addr(g, dst_t, di, 4, g->vf), m, align);
        }
    }
    loop_end(g, &lc);
    return LLVMBuildMul(g->b, n_chunks, ci64(g, L), "");
}

/* f32 dst[t] for a full sliver with contiguous k (sk = 1): per k, the
 * width rows' elements are gathered, vl at a time. */
static void pack_gather_f32(mpt_cpu_gen *g, int width, LLVMValueRef src, LLVMValueRef sw,
                            LLVMValueRef wbase, LLVMValueRef k0, LLVMValueRef k_start,
                            LLVMValueRef kc, LLVMValueRef dst_t) {
    int vl = g->s->vl, nv = (width + vl - 1) / vl;
    LLVMValueRef all = LLVMConstAllOnes(g->vmask), tail = tail_mask(g, width);
    LLVMTypeRef vi64 = LLVMVectorType(g->i64, (unsigned)vl);
    LLVMTypeRef pf = LLVMPointerType(g->f32, 0), vpf = LLVMVectorType(pf, (unsigned)vl);
    LLVMValueRef rowoff[4];
    for (int v = 0; v < nv; v++) {
        LLVMValueRef e[16];
        for (int i = 0; i < vl; i++)
            e[i] = ci64(g, v * vl + i);
        LLVMValueRef w =
            LLVMBuildAdd(g->b, LLVMConstVector(e, (unsigned)vl), splat(g, wbase, vi64), "");
        rowoff[v] = LLVMBuildMul(g->b, w, splat(g, sw, vi64), "");
    }
    LLVMValueRef base = LLVMBuildBitCast(g->b, src, pf, "");
    mpt_cpu_loop lk;
    LLVMValueRef k = loop_begin(g, &lk, k_start, kc, "gk");
    LLVMValueRef kb =
        LLVMBuildGEP2(g->b, g->f32, base, (LLVMValueRef[]){LLVMBuildAdd(g->b, k0, k, "")}, 1, "");
    for (int v = 0; v < nv; v++) {
        LLVMValueRef m = v == nv - 1 ? tail : all;
        LLVMValueRef ptrs = LLVMBuildGEP2(g->b, g->f32, kb, &rowoff[v], 1, "");
        ptrs = LLVMBuildBitCast(g->b, ptrs, vpf, "");
        LLVMTypeRef over[2] = {g->vf, vpf};
        LLVMValueRef args[4] = {ptrs, ci32(g, 4), m, LLVMGetUndef(g->vf)};
        LLVMValueRef x = call_intrinsic(g, "llvm.masked.gather", over, 2, args, 4);
        LLVMValueRef di =
            LLVMBuildAdd(g->b, LLVMBuildMul(g->b, k, ci64(g, width), ""), ci64(g, v * vl), "");
        masked_store(g, x, addr(g, dst_t, di, 4, g->vf), m, width % vl ? 4 : 64);
    }
    loop_end(g, &lk);
}

void mpt_cpu_gen_pack(mpt_cpu_gen *g, mpt_dtype dt, int width, const char *name) {
    LLVMTypeRef params[8] = {g->p8, g->i64, g->i64, g->i64, g->i64, g->i64, g->i64, g->p8};
    g->fn =
        LLVMAddFunction(g->m, name, LLVMFunctionType(LLVMVoidTypeInContext(g->c), params, 8, 0));
    mpt_cpu_jit_set_fn_attrs(g->jit, g->fn);
    LLVMValueRef src = LLVMGetParam(g->fn, 0), sw = LLVMGetParam(g->fn, 1),
                 sk = LLVMGetParam(g->fn, 2), w0 = LLVMGetParam(g->fn, 3),
                 k0 = LLVMGetParam(g->fn, 4), wc = LLVMGetParam(g->fn, 5),
                 kc = LLVMGetParam(g->fn, 6), dst = LLVMGetParam(g->fn, 7);
    LLVMPositionBuilderAtEnd(g->b, LLVMAppendBasicBlockInContext(g->c, g->fn, "entry"));
    int pair = g->s->pair;
    LLVMValueRef kk = cells_per_k(g, kc);
    LLVMValueRef nt =
        LLVMBuildSDiv(g->b, LLVMBuildAdd(g->b, wc, ci64(g, width - 1), ""), ci64(g, width), "");
    LLVMValueRef t_start = ci64(g, 0);
    if (!pair || width % g->s->vl == 0) {
        /* slivers of contiguous rows all at once: every one (f32), the
         * full ones (pairs) */
        LLVMValueRef n_full = LLVMBuildSDiv(g->b, wc, ci64(g, width), "");
        LLVMBasicBlockRef from = LLVMGetInsertBlock(g->b);
        LLVMBasicBlockRef across = LLVMAppendBasicBlockInContext(g->c, g->fn, "across");
        LLVMBasicBlockRef rest = LLVMAppendBasicBlockInContext(g->c, g->fn, "rest");
        LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, sw, ci64(g, 1), ""), across, rest);
        LLVMPositionBuilderAtEnd(g->b, across);
        if (pair)
            pack_pairs_rows_across(g, width, src, sk, w0, k0, kc, kk, n_full, dst);
        else
            pack_f32_rows_across(g, dt, width, src, sk, w0, k0, kc, wc, dst);
        LLVMBasicBlockRef across_end = LLVMGetInsertBlock(g->b);
        LLVMBuildBr(g->b, rest);
        LLVMPositionBuilderAtEnd(g->b, rest);
        t_start = LLVMBuildPhi(g->b, g->i64, "tstart");
        LLVMValueRef vals[2] = {ci64(g, 0), pair ? n_full : nt};
        LLVMBasicBlockRef bbs[2] = {from, across_end};
        LLVMAddIncoming(t_start, vals, bbs, 2);
    }
    mpt_cpu_loop lt;
    LLVMValueRef t = loop_begin(g, &lt, t_start, nt, "pt");
    LLVMValueRef tw = LLVMBuildMul(g->b, t, ci64(g, width), "");
    LLVMValueRef rem = smin(g, ci64(g, width), LLVMBuildSub(g->b, wc, tw, ""));
    LLVMValueRef wbase = LLVMBuildAdd(g->b, w0, tw, "");
    /* both layouts use 4 bytes per (k or k pair, w) */
    LLVMValueRef dst_t = LLVMBuildGEP2(
        g->b, g->i8, dst,
        (LLVMValueRef[]){LLVMBuildMul(g->b, LLVMBuildMul(g->b, tw, kk, ""), ci64(g, 4), "")}, 1,
        "");
    LLVMBasicBlockRef general = LLVMAppendBasicBlockInContext(g->c, g->fn, "general");
    LLVMBasicBlockRef next = LLVMAppendBasicBlockInContext(g->c, g->fn, "next");
    LLVMValueRef full = LLVMBuildICmp(g->b, LLVMIntEQ, rem, ci64(g, width), "");
    LLVMValueRef zero = ci64(g, 0), gstart_v[2];
    LLVMBasicBlockRef gstart_bb[2];
    int n_gstart = 0;
    /* a sliver of pairs with contiguous rows that the across-slivers
     * copy above does not take (a width that is no whole number of
     * vectors, or a partial sliver): masked vector copies */
    if (pair) {
        LLVMBasicBlockRef fast = LLVMAppendBasicBlockInContext(g->c, g->fn, "fast");
        LLVMBasicBlockRef other = LLVMAppendBasicBlockInContext(g->c, g->fn, "other");
        LLVMValueRef is_fast = LLVMBuildICmp(g->b, LLVMIntEQ, sw, ci64(g, 1), "");
        LLVMBuildCondBr(g->b, is_fast, fast, other);
        LLVMPositionBuilderAtEnd(g->b, fast);
        pack_pairs_rows_vector(g, width, src, sk, wbase, k0, kc, kk, rem, dst_t);
        LLVMBuildBr(g->b, next);
        LLVMPositionBuilderAtEnd(g->b, other);
    }
    /* a full sliver with contiguous k: f32 transposed vl k at a time
     * (AVX-512, AVX2), the rest of k gathered across the rows (f32 sources)
     * or left to the general loop; for pairs whole ones gathered, the
     * general loop finishing the odd last one and the padding */
    int transposes = !pair && (g->s->vl == 16 || g->s->vl == 8) && width <= 2 * g->s->vl;
    if (pair ? width % g->s->vl == 0 : dt == MPT_DT_F32 || transposes) {
        LLVMBasicBlockRef gat = LLVMAppendBasicBlockInContext(g->c, g->fn, "gather");
        LLVMValueRef is_gat =
            LLVMBuildAnd(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, sk, ci64(g, 1), ""), full, "");
        gstart_v[n_gstart] = zero;
        gstart_bb[n_gstart++] = LLVMGetInsertBlock(g->b);
        LLVMBuildCondBr(g->b, is_gat, gat, general);
        LLVMPositionBuilderAtEnd(g->b, gat);
        if (pair) {
            pack_pairs_gather(g, width, src, sw, wbase, k0, kc, dst_t);
            gstart_v[n_gstart] = LLVMBuildSDiv(g->b, kc, ci64(g, 2), "");
            gstart_bb[n_gstart++] = LLVMGetInsertBlock(g->b);
            LLVMBuildBr(g->b, general);
        } else {
            LLVMValueRef k_done = zero;
            if (transposes)
                k_done = pack_transpose_f32(g, dt, width, src, sw, wbase, k0, kc, dst_t);
            if (dt == MPT_DT_F32) {
                pack_gather_f32(g, width, src, sw, wbase, k0, k_done, kc, dst_t);
                LLVMBuildBr(g->b, next);
            } else {
                /* the general loop packs the k past the last whole chunk */
                gstart_v[n_gstart] = k_done;
                gstart_bb[n_gstart++] = LLVMGetInsertBlock(g->b);
                LLVMBuildBr(g->b, general);
            }
        }
    } else {
        gstart_v[n_gstart] = zero;
        gstart_bb[n_gstart++] = LLVMGetInsertBlock(g->b);
        LLVMBuildBr(g->b, general);
    }
    /* general: any strides, a partial sliver, or bf16 pairs. Indices are
     * clamped into the window and the value zeroed, so loads never leave it. */
    LLVMPositionBuilderAtEnd(g->b, general);
    LLVMValueRef gstart = LLVMBuildPhi(g->b, g->i64, "gstart");
    LLVMAddIncoming(gstart, gstart_v, gstart_bb, (unsigned)n_gstart);
    mpt_cpu_loop lk;
    LLVMValueRef k = loop_begin(g, &lk, gstart, kk, "gk");
    for (int w = 0; w < width; w++) {
        LLVMValueRef wi = smin(g, ci64(g, w), LLVMBuildSub(g->b, rem, ci64(g, 1), ""));
        LLVMValueRef wvalid = LLVMBuildICmp(g->b, LLVMIntSLT, ci64(g, w), rem, "");
        LLVMValueRef wofs = LLVMBuildMul(g->b, LLVMBuildAdd(g->b, wbase, wi, ""), sw, "");
        for (int h = 0; h < (pair ? 2 : 1); h++) {
            LLVMValueRef kq =
                pair ? LLVMBuildAdd(g->b, LLVMBuildMul(g->b, k, ci64(g, 2), ""), ci64(g, h), "")
                     : k;
            LLVMValueRef valid = wvalid;
            if (pair) {
                valid = LLVMBuildAnd(g->b, valid, LLVMBuildICmp(g->b, LLVMIntSLT, kq, kc, ""), "");
                kq = smin(g, kq, LLVMBuildSub(g->b, kc, ci64(g, 1), ""));
            }
            LLVMValueRef si = LLVMBuildAdd(
                g->b, wofs, LLVMBuildMul(g->b, LLVMBuildAdd(g->b, k0, kq, ""), sk, ""), "");
            LLVMValueRef di =
                LLVMBuildAdd(g->b, LLVMBuildMul(g->b, k, ci64(g, width), ""), ci64(g, w), "");
            if (pair) {
                LLVMValueRef x = load(g, g->i16, addr(g, src, si, 2, g->i16), 2);
                x = LLVMBuildSelect(g->b, valid, x, LLVMConstInt(g->i16, 0, 0), "");
                di = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, di, ci64(g, 2), ""), ci64(g, h), "");
                store(g, x, addr(g, dst_t, di, 2, g->i16), 2);
            } else {
                LLVMValueRef x = load_scalar_f32(g, dt, src, si);
                x = LLVMBuildSelect(g->b, valid, x, LLVMConstReal(g->f32, 0.0), "");
                store(g, x, addr(g, dst_t, di, 4, g->f32), 4);
            }
        }
    }
    loop_end(g, &lk);
    LLVMBuildBr(g->b, next);
    LLVMPositionBuilderAtEnd(g->b, next);
    loop_end(g, &lt);
    LLVMBuildRetVoid(g->b);
}

/* A for AMX tiles: sliver t holds row w's k run contiguously, zero-padded
 * to kp = 2 * cells_per_k (a whole number of 32-element tile rows):
 * element (t*width + w, k) at bf16 index t*width*kp + w*kp + k. Rows with
 * contiguous k are copied with masked vector loads, others gathered. */
static void pack_rows_nest(mpt_cpu_gen *g, int width, int contiguous, LLVMValueRef src,
                           LLVMValueRef sw, LLVMValueRef sk, LLVMValueRef w0, LLVMValueRef k0,
                           LLVMValueRef wc, LLVMValueRef kc, LLVMValueRef kp, LLVMValueRef t0,
                           LLVMValueRef nt, LLVMValueRef dst) {
    LLVMTypeRef vt = LLVMVectorType(g->i16, 32);
    LLVMValueRef lanes[32];
    for (int i = 0; i < 32; i++)
        lanes[i] = ci64(g, i);
    LLVMValueRef lane64 = LLVMConstVector(lanes, 32);
    LLVMTypeRef vi64 = LLVMVectorType(g->i64, 32);
    mpt_cpu_loop lt, lw, lc;
    LLVMValueRef t = loop_begin(g, &lt, t0, nt, "rt");
    LLVMValueRef w = loop_begin(g, &lw, ci64(g, 0), ci64(g, width), "rw");
    LLVMValueRef row = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, t, ci64(g, width), ""), w, "");
    LLVMValueRef row_ok = LLVMBuildICmp(g->b, LLVMIntSLT, row, wc, "");
    LLVMValueRef row_ofs = LLVMBuildMul(g->b, LLVMBuildAdd(g->b, w0, row, ""), sw, "");
    LLVMValueRef c = loop_begin(g, &lc, ci64(g, 0), LLVMBuildSDiv(g->b, kp, ci64(g, 32), ""), "rc");
    LLVMValueRef kb = LLVMBuildMul(g->b, c, ci64(g, 32), "");
    LLVMValueRef m = lane_mask(g, 32, kb, kc);
    m = LLVMBuildAnd(
        g->b, m, LLVMBuildSelect(g->b, row_ok, const_mask(g, 32, 1), const_mask(g, 32, 0), ""), "");
    LLVMValueRef x;
    if (contiguous) {
        LLVMValueRef si = LLVMBuildAdd(g->b, row_ofs, LLVMBuildAdd(g->b, k0, kb, ""), "");
        x = masked_load(g, vt, addr(g, src, si, 2, vt), m, 2);
    } else {
        LLVMTypeRef vp = LLVMVectorType(LLVMPointerType(g->i16, 0), 32);
        LLVMValueRef ks =
            LLVMBuildAdd(g->b, lane64, splat(g, LLVMBuildAdd(g->b, k0, kb, ""), vi64), "");
        LLVMValueRef si = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, ks, splat(g, sk, vi64), ""),
                                       splat(g, row_ofs, vi64), "");
        LLVMValueRef base = LLVMBuildBitCast(g->b, src, LLVMPointerType(g->i16, 0), "");
        LLVMValueRef ptrs = LLVMBuildGEP2(g->b, g->i16, base, &si, 1, "");
        LLVMTypeRef over[2] = {vt, vp};
        LLVMValueRef args[4] = {ptrs, ci32(g, 2), m, LLVMConstNull(vt)};
        x = call_intrinsic(g, "llvm.masked.gather", over, 2, args, 4);
    }
    LLVMValueRef di = LLVMBuildAdd(
        g->b,
        LLVMBuildMul(g->b, LLVMBuildAdd(g->b, LLVMBuildMul(g->b, t, ci64(g, width), ""), w, ""), kp,
                     ""),
        kb, "");
    store(g, x, addr(g, dst, di, 2, vt), 64);
    loop_end(g, &lc);
    loop_end(g, &lw);
    loop_end(g, &lt);
}

/* The AMX A layout from a source whose rows are contiguous (sw = 1: A
 * stored [K, M], the dW = X^T dY case), full slivers [0, nt): per 32-k
 * chunk and 16 rows, rows k and k+1 are loaded and interleaved into 16
 * vectors of pairs indexed [q][w], and one 16 x 16 transpose of the 4-byte
 * pairs turns them into [w][q], 64 bytes of each row's k run. */
static void pack_rows_transposed(mpt_cpu_gen *g, int width, LLVMValueRef src, LLVMValueRef sk,
                                 LLVMValueRef w0, LLVMValueRef k0, LLVMValueRef kc,
                                 LLVMValueRef kp, LLVMValueRef nt, LLVMValueRef dst) {
    LLVMTypeRef v16 = LLVMVectorType(g->i16, 16), v32 = LLVMVectorType(g->i16, 32);
    LLVMTypeRef vi = LLVMVectorType(g->i32, 16);
    LLVMValueRef idx[32];
    for (int i = 0; i < 16; i++) {
        idx[2 * i] = ci32(g, i);
        idx[2 * i + 1] = ci32(g, 16 + i);
    }
    LLVMValueRef inter = LLVMConstVector(idx, 32);
    mpt_cpu_loop lt, lc;
    LLVMValueRef c = loop_begin(g, &lc, ci64(g, 0), LLVMBuildSDiv(g->b, kp, ci64(g, 32), ""), "xc");
    LLVMValueRef t = loop_begin(g, &lt, ci64(g, 0), nt, "xt");
    LLVMValueRef kb = LLVMBuildMul(g->b, c, ci64(g, 32), "");
    for (int h = 0; h < width / 16; h++) {
        LLVMValueRef wb = LLVMBuildAdd(
            g->b, w0, LLVMBuildAdd(g->b, LLVMBuildMul(g->b, t, ci64(g, width), ""), ci64(g, h * 16), ""),
            "");
        LLVMValueRef v[16];
        for (int q = 0; q < 16; q++) {
            LLVMValueRef rows[2];
            for (int e = 0; e < 2; e++) {
                LLVMValueRef k = LLVMBuildAdd(g->b, kb, ci64(g, 2 * q + e), "");
                LLVMValueRef ok = LLVMBuildICmp(g->b, LLVMIntSLT, k, kc, "");
                LLVMValueRef m =
                    LLVMBuildSelect(g->b, ok, const_mask(g, 16, 1), const_mask(g, 16, 0), "");
                LLVMValueRef si = LLVMBuildAdd(
                    g->b, LLVMBuildMul(g->b, LLVMBuildAdd(g->b, k0, k, ""), sk, ""), wb, "");
                rows[e] = masked_load(g, v16, addr(g, src, si, 2, v16), m, 2);
            }
            v[q] = LLVMBuildBitCast(g->b, LLVMBuildShuffleVector(g->b, rows[0], rows[1], inter, ""),
                                    vi, "");
        }
        transpose_cells(g, v, 16);
        for (int w = 0; w < 16; w++) {
            LLVMValueRef row = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, t, ci64(g, width), ""),
                                            ci64(g, h * 16 + w), "");
            LLVMValueRef di = LLVMBuildAdd(g->b, LLVMBuildMul(g->b, row, kp, ""), kb, "");
            store(g, LLVMBuildBitCast(g->b, v[w], v32, ""), addr(g, dst, di, 2, v32), 64);
        }
    }
    loop_end(g, &lt);
    loop_end(g, &lc);
}

void mpt_cpu_gen_pack_rows(mpt_cpu_gen *g, int width, const char *name) {
    LLVMTypeRef params[8] = {g->p8, g->i64, g->i64, g->i64, g->i64, g->i64, g->i64, g->p8};
    g->fn =
        LLVMAddFunction(g->m, name, LLVMFunctionType(LLVMVoidTypeInContext(g->c), params, 8, 0));
    mpt_cpu_jit_set_fn_attrs(g->jit, g->fn);
    LLVMValueRef P[8];
    for (int i = 0; i < 8; i++)
        P[i] = LLVMGetParam(g->fn, (unsigned)i);
    LLVMPositionBuilderAtEnd(g->b, LLVMAppendBasicBlockInContext(g->c, g->fn, "entry"));
    LLVMValueRef kp = LLVMBuildMul(g->b, cells_per_k(g, P[6]), ci64(g, 2), "");
    LLVMValueRef nt =
        LLVMBuildSDiv(g->b, LLVMBuildAdd(g->b, P[5], ci64(g, width - 1), ""), ci64(g, width), "");
    LLVMBasicBlockRef contig = LLVMAppendBasicBlockInContext(g->c, g->fn, "contig");
    LLVMBasicBlockRef strided = LLVMAppendBasicBlockInContext(g->c, g->fn, "strided");
    LLVMBasicBlockRef trans = LLVMAppendBasicBlockInContext(g->c, g->fn, "transposed");
    LLVMBasicBlockRef gather = LLVMAppendBasicBlockInContext(g->c, g->fn, "gather");
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, P[2], ci64(g, 1), ""), contig, strided);
    LLVMPositionBuilderAtEnd(g->b, contig);
    pack_rows_nest(g, width, 1, P[0], P[1], P[2], P[3], P[4], P[5], P[6], kp, ci64(g, 0), nt,
                   P[7]);
    LLVMBuildRetVoid(g->b);
    /* rows contiguous: full slivers transposed in registers, the partial
     * last one (and any other strides) gathered */
    LLVMPositionBuilderAtEnd(g->b, strided);
    LLVMValueRef full_t = LLVMBuildSDiv(g->b, P[5], ci64(g, width), "");
    LLVMBasicBlockRef from = LLVMGetInsertBlock(g->b);
    LLVMBuildCondBr(g->b, LLVMBuildICmp(g->b, LLVMIntEQ, P[1], ci64(g, 1), ""), trans, gather);
    LLVMPositionBuilderAtEnd(g->b, trans);
    pack_rows_transposed(g, width, P[0], P[2], P[3], P[4], P[6], kp, full_t, P[7]);
    LLVMBasicBlockRef trans_end = LLVMGetInsertBlock(g->b);
    LLVMBuildBr(g->b, gather);
    LLVMPositionBuilderAtEnd(g->b, gather);
    LLVMValueRef t0 = LLVMBuildPhi(g->b, g->i64, "t0");
    LLVMValueRef inc[2] = {ci64(g, 0), full_t};
    LLVMBasicBlockRef bbs[2] = {from, trans_end};
    LLVMAddIncoming(t0, inc, bbs, 2);
    pack_rows_nest(g, width, 0, P[0], P[1], P[2], P[3], P[4], P[5], P[6], kp, t0, nt, P[7]);
    LLVMBuildRetVoid(g->b);
}
