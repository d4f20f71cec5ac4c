/* codegen/cpu/cpu_internal.h — what the files of codegen/cpu/ share with each
 * other and nobody else: the LLVM check helpers and the JIT's module API. */
#ifndef MPT_CODEGEN_CPU_INTERNAL_H
#define MPT_CODEGEN_CPU_INTERNAL_H
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>

#include "codegen/cpu/cpu.h"

/* Every LLVM call that can fail goes through one of these. They write
 * "file:line: func: statement: LLVM's message" into err and return -1, or
 * return 0 when the call succeeded. */
int mpt_llvm_check_error(LLVMErrorRef e, const char *stmt, const char *func, const char *file,
                         int line, char *err, size_t n);
/* For the calls that return a failure flag and a message to dispose. */
int mpt_llvm_check_flag(int failed, char *msg, const char *stmt, const char *func,
                        const char *file, int line, char *err, size_t n);

/* Both expect `err`, `n` and a `fail:` label in scope. */
#define MPT_LLVM_TRY(stmt)                                                                 \
    do {                                                                                   \
        if (mpt_llvm_check_error((stmt), #stmt, __func__, __FILE__, __LINE__, err, n))     \
            goto fail;                                                                     \
    } while (0)
/* stmt returns nonzero on failure and sets the char *msg named msgvar */
#define MPT_LLVM_TRY_MSG(stmt, msgvar)                                                     \
    do {                                                                                   \
        msgvar = NULL;                                                                     \
        int mpt_failed_ = (stmt);                                                          \
        if (mpt_llvm_check_flag(mpt_failed_, msgvar, #stmt, __func__, __FILE__, __LINE__,  \
                                err, n))                                                   \
            goto fail;                                                                     \
    } while (0)

/* The context every module of this JIT must be created in. */
LLVMContextRef mpt_cpu_jit_context(mpt_cpu_jit *j);
/* A new empty module with the JIT's triple and data layout. */
LLVMModuleRef mpt_cpu_jit_module_new(mpt_cpu_jit *j, const char *name);
/* Attributes every generated function gets: target cpu/features, vector width. */
void mpt_cpu_jit_set_fn_attrs(mpt_cpu_jit *j, LLVMValueRef fn);
/* Vector width in f32 lanes of the JIT's ISA (4, 8 or 16); 1 FMA flag. */
int mpt_cpu_jit_vector_lanes(const mpt_cpu_jit *j);
int mpt_cpu_jit_has_fma(const mpt_cpu_jit *j);
int mpt_cpu_jit_has_f16c(const mpt_cpu_jit *j);

/* A number unique within this JIT, for naming generated functions. */
int mpt_cpu_jit_next_id(mpt_cpu_jit *j);

/* Verifies and optimises m, optionally renders its IR and assembly (caller
 * frees with free()), and hands it to the JIT, which then owns it (also on
 * failure). Returns 0 or -1 with err filled. */
int mpt_cpu_jit_add_module(mpt_cpu_jit *j, LLVMModuleRef m, char **ir_text, char **asm_text,
                           char *err, size_t n);
/* Address of a function added with mpt_cpu_jit_add_module, or NULL with err. */
void *mpt_cpu_jit_lookup(mpt_cpu_jit *j, const char *name, char *err, size_t n);

/* ---- GEMM generator (gemm_gen.c) for the driver (gemm.c) ----
 *
 * Three functions are generated per kernel, named prefix_pack_a, prefix_pack_b
 * and prefix_macro:
 *
 * pack(src, sw, sk, w0, k0, wc, kc, dst): copies the [wc, kc] window starting
 *   at (w0, k0) of a matrix whose element (w, k) is src[w*sw + k*sk] into
 *   slivers of `width` (mr for A, nr for B) rows, zero-padded: sliver t holds
 *   element (t*width + w, k) at t*width*kk + k*width + w (f32), or, for bf16
 *   dot products, the pair (k = 2q, 2q+1) at (t*width*kk + q*width + w)*2 + h
 *   (bf16, kk = ceil(kc/2), rounded up to a multiple of 16 for AMX). For AMX,
 *   A instead keeps each row's k run contiguous: element (t*mr + w, k) at
 *   bf16 index t*mr*2kk + w*2kk + k. dst is 64-byte aligned.
 *
 * macro(ap, bp, mc, nc, kc, prior, ldp, dst, ldd, final, row0, col0, epi):
 *   the [mc, nc] block of C from packed A (mc x kc) and packed B (kc x nc).
 *   prior (f32, row stride ldp, may be NULL) is added first. final = 0 stores
 *   the f32 sums to dst (row stride ldd); final = 1 applies the epilogue, whose
 *   operands are addressed by global row0 + i, col0 + j, and stores c_dt. */
typedef struct {
    int vl;   /* f32 lanes per vector */
    int mr;   /* register tile rows */
    int nr;   /* register tile columns, a multiple of vl */
    int pair; /* bf16 pairs + vdpbf16ps (or AMX) */
    int amx;  /* AMX tiles: mr = nr = 32, A packed by rows (see gemm_gen.c) */
    int fma, f16c;
} mpt_cpu_gemm_shape;

/* The rows of a gathered A's register tile (AVX-512). Each has a pointer:
 * 14 of them (with the k index, B's pointer and the loop) outnumber the
 * general registers, and LLVM then hoisted all 14 broadcasts and spilled
 * half the accumulators (convnet64 convolutions ran 1.8x slower). */
/* AVX2's gathered f32 tile: 6 rows of 2 ymm, its k steps as inline
 * assembly (gemm_asm.c) */
/* Evenly spaced rows (desc.a_row_step) on one pointer leave registers
 * for a taller B: 7 rows of 4 zmm. */
enum { MPT_CPU_GATHER_MR = 10, MPT_CPU_GATHER_MR_AVX2 = 6, MPT_CPU_GATHER_MR_STEP = 7 };

typedef void (*mpt_cpu_pack_fn)(const void *src, int64_t sw, int64_t sk, int64_t w0, int64_t k0,
                                int64_t wc, int64_t kc, void *dst);
typedef void (*mpt_cpu_macro_fn)(const void *ap, const void *bp, int64_t mc, int64_t nc,
                                 int64_t kc, const float *prior, int64_t ldp, void *dst,
                                 int64_t ldd, int32_t final, int64_t row0, int64_t col0,
                                 const mpt_cpu_epilogue_args *epi, int64_t a_row_bytes,
                                 const void *a_base, const int64_t *a_col,
                                 const int64_t *a_krange, int64_t k0, int64_t k_run);

void mpt_cpu_gemm_generate(mpt_cpu_jit *j, LLVMModuleRef m, const mpt_cpu_gemm_desc *d,
                           const mpt_cpu_gemm_shape *s, const char *prefix);

/* gelu_table.c: the exact f16/bf16 GELU (grad: its derivative) of every
 * input of the dtype, as f32 bits indexed by the input's 16 bits: the
 * kernels' symbol for one table, its filling (once a process, before a
 * kernel that reads it runs), and every table's name and address for the
 * JIT's symbols (returns their count). */
const char *mpt_cpu_gelu_table_name(mpt_dtype dt, int grad);
void mpt_cpu_gelu_table_fill(mpt_dtype dt, int grad);
int mpt_cpu_gelu_tables(const char **name, const void **addr);

/* emit_math.c: GELU (grad: its derivative) of <w x double> x, in the
 * interpreter's order of operations; the GEMM epilogue's exact f16/bf16
 * GELU recomputes with it near rounding midpoints */
LLVMValueRef mpt_vm_gelu(LLVMBuilderRef b, LLVMModuleRef m, LLVMValueRef x, int grad);

#endif
