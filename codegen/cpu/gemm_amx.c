/* codegen/cpu/gemm_amx.c — the AMX side of the GEMM's macro-kernel
 * (gemm_gen.c): the tile configuration, one 32 x 32 tile's k loop on
 * tdpbf16ps, and its store. The tile is held in four 16 x 16 f32 tile
 * registers and fed 32 k at a time. */
#include "codegen/cpu/gemm_ir.h"

static void amx_call(mpt_cpu_gen *g, const char *name, LLVMValueRef *args, unsigned n_args) {
    call_intrinsic(g, name, NULL, 0, args, n_args);
}

static LLVMValueRef ci8(mpt_cpu_gen *g, int v) { return LLVMConstInt(g->i8, (uint64_t)v, 0); }

/* Tiles 0-3 hold the 32 x 32 f32 block of C as 2 x 2 16 x 16 tiles, 4-5
 * the two 16-row halves of A's 32-k step, 6-7 the two 16-column halves of
 * B's 16 pairs: palette 1, every tile 16 rows of 64 bytes. */
void mpt_cpu_amx_configure(mpt_cpu_gen *g) {
    unsigned char cfg[64] = {0};
    cfg[0] = 1;
    for (int t = 0; t < 8; t++) {
        cfg[16 + 2 * t] = 64; /* colsb, little-endian u16 */
        cfg[48 + t] = 16;     /* rows */
    }
    LLVMValueRef bytes[64];
    for (int i = 0; i < 64; i++)
        bytes[i] = ci8(g, cfg[i]);
    LLVMTypeRef at = LLVMArrayType(g->i8, 64);
    LLVMValueRef gv = LLVMAddGlobal(g->m, at, "amx_tile_config");
    LLVMSetInitializer(gv, LLVMConstArray(g->i8, bytes, 64));
    LLVMSetGlobalConstant(gv, 1);
    LLVMSetLinkage(gv, LLVMPrivateLinkage);
    LLVMSetAlignment(gv, 64);
    LLVMValueRef p = LLVMBuildBitCast(g->b, gv, g->p8, "");
    amx_call(g, "llvm.x86.ldtilecfg", &p, 1);
}

/* Address of tile t (2 x 2 of 16 x 16) of a 32 x 32 f32 block at (i0, j0)
 * of an f32 matrix with row stride ld. */
static LLVMValueRef amx_c_tile(mpt_cpu_gen *g, LLVMValueRef base, LLVMValueRef ld, LLVMValueRef i0,
                               LLVMValueRef j0, int t) {
    LLVMValueRef row = LLVMBuildAdd(g->b, i0, ci64(g, (t >> 1) * 16), "");
    LLVMValueRef col = LLVMBuildAdd(g->b, j0, ci64(g, (t & 1) * 16), "");
    return addr(g, base, LLVMBuildAdd(g->b, LLVMBuildMul(g->b, row, ld, ""), col, ""), 4, g->i8);
}

/* The k loop of one 32 x 32 tile on AMX, leaving the f32 block in tiles
 * 0-3. Where in_tiles is true the block starts from prior's partial sums,
 * loaded straight into the tiles (full tiles only: a tile load reads all 16
 * rows of 64 bytes); otherwise from zero. */
void mpt_cpu_amx_k_loop(mpt_cpu_gen *g, LLVMValueRef a_sl, LLVMValueRef a_sl1,
                           LLVMValueRef a_col, LLVMValueRef a_stride,
                           LLVMValueRef b_sl, LLVMValueRef kk, LLVMValueRef in_tiles,
                           LLVMValueRef prior, LLVMValueRef ldp,
                           LLVMValueRef i0, LLVMValueRef j0) {
    LLVMBasicBlockRef from_prior = LLVMAppendBasicBlockInContext(g->c, g->fn, "cprior");
    LLVMBasicBlockRef from_zero = LLVMAppendBasicBlockInContext(g->c, g->fn, "czero");
    LLVMBasicBlockRef ready = LLVMAppendBasicBlockInContext(g->c, g->fn, "cready");
    LLVMBuildCondBr(g->b, in_tiles, from_prior, from_zero);
    LLVMPositionBuilderAtEnd(g->b, from_prior);
    LLVMValueRef pstride = LLVMBuildMul(g->b, ldp, ci64(g, 4), "");
    for (int t = 0; t < 4; t++)
        amx_call(g, "llvm.x86.tileloadd64",
                 (LLVMValueRef[]){ci8(g, t), amx_c_tile(g, prior, ldp, i0, j0, t), pstride}, 3);
    LLVMBuildBr(g->b, ready);
    LLVMPositionBuilderAtEnd(g->b, from_zero);
    for (int t = 0; t < 4; t++)
        amx_call(g, "llvm.x86.tilezero", (LLVMValueRef[]){ci8(g, t)}, 1);
    LLVMBuildBr(g->b, ready);
    LLVMPositionBuilderAtEnd(g->b, ready);
    mpt_cpu_loop lc;
    LLVMValueRef c = loop_begin(g, &lc, ci64(g, 0), LLVMBuildSDiv(g->b, kk, ci64(g, 16), ""), "tk");
    LLVMValueRef a0, a1;
    if (a_col) {
        /* A's tiles in place (desc.a_tiles): both halves at the k step's
         * column offset, col[32 c] */
        LLVMValueRef off = load(g, g->i64, addr(g, a_col, LLVMBuildMul(g->b, c, ci64(g, 32), ""), 8,
                                                g->i64), 8);
        a0 = LLVMBuildGEP2(g->b, g->i8, a_sl, &off, 1, "");
        a1 = LLVMBuildGEP2(g->b, g->i8, a_sl1, &off, 1, "");
    } else {
        a0 = LLVMBuildGEP2(g->b, g->i8, a_sl,
                           (LLVMValueRef[]){LLVMBuildMul(g->b, c, ci64(g, 64), "")}, 1, "");
        a1 = LLVMBuildGEP2(g->b, g->i8, a0,
                           (LLVMValueRef[]){LLVMBuildMul(g->b, a_stride, ci64(g, 16), "")}, 1,
                           "");
    }
    LLVMValueRef b0 =
        LLVMBuildGEP2(g->b, g->i8, b_sl,
                      (LLVMValueRef[]){LLVMBuildMul(g->b, c, ci64(g, 16 * 32 * 4), "")}, 1, "");
    LLVMValueRef b1 = LLVMBuildGEP2(g->b, g->i8, b0, (LLVMValueRef[]){ci64(g, 64)}, 1, "");
    amx_call(g, "llvm.x86.tileloadd64", (LLVMValueRef[]){ci8(g, 4), a0, a_stride}, 3);
    amx_call(g, "llvm.x86.tileloadd64", (LLVMValueRef[]){ci8(g, 6), b0, ci64(g, 128)}, 3);
    amx_call(g, "llvm.x86.tileloadd64", (LLVMValueRef[]){ci8(g, 7), b1, ci64(g, 128)}, 3);
    amx_call(g, "llvm.x86.tdpbf16ps", (LLVMValueRef[]){ci8(g, 0), ci8(g, 4), ci8(g, 6)}, 3);
    amx_call(g, "llvm.x86.tdpbf16ps", (LLVMValueRef[]){ci8(g, 1), ci8(g, 4), ci8(g, 7)}, 3);
    amx_call(g, "llvm.x86.tileloadd64", (LLVMValueRef[]){ci8(g, 5), a1, a_stride}, 3);
    amx_call(g, "llvm.x86.tdpbf16ps", (LLVMValueRef[]){ci8(g, 2), ci8(g, 5), ci8(g, 6)}, 3);
    amx_call(g, "llvm.x86.tdpbf16ps", (LLVMValueRef[]){ci8(g, 3), ci8(g, 5), ci8(g, 7)}, 3);
    loop_end(g, &lc);
}

/* Tiles 0-3 stored as a 32 x 32 f32 block at base (row stride ld floats). */
void mpt_cpu_amx_store_c(mpt_cpu_gen *g, LLVMValueRef base, LLVMValueRef ld, LLVMValueRef i0,
                        LLVMValueRef j0) {
    LLVMValueRef stride = LLVMBuildMul(g->b, ld, ci64(g, 4), "");
    for (int t = 0; t < 4; t++)
        amx_call(g, "llvm.x86.tilestored64",
                 (LLVMValueRef[]){ci8(g, t), amx_c_tile(g, base, ld, i0, j0, t), stride}, 3);
}
