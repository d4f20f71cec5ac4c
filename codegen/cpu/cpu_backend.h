/* codegen/cpu/cpu_backend.h — the CPU backend: executes whole kernel plans
 * with code JIT-compiled through the LLVM C API.
 *
 * LOOP and REDUCTION kernels are generated (codegen/cpu/emit_loop.c,
 * emit_reduce.c), GEMM kernels run the GEMM generator of cpu.h with the
 * fused epilogue mapped onto its epilogue where that is exact, CONV kernels
 * are im2col/col2im around the same GEMM (emit_conv.c), OPAQUE kernels are
 * plain loops (emit_opaque.c). This header needs no LLVM header, so runtime/
 * can include it.
 */
#ifndef MPT_CODEGEN_CPU_BACKEND_H
#define MPT_CODEGEN_CPU_BACKEND_H

#include <stdio.h>

#include "fusion/fusion.h"
#include "codegen/backend.h"

extern mpt_backend mpt_backend_cpu;

/* The environment variable MPT_CPU_CONV_CHUNK_BYTES (default 16 MiB) caps
 * the f32 columns a convolution's data gradient writes before col2im reads
 * them back; tests set it small to run several rounds. */

/* Plans compiled after this call time every kernel of every step and, when
 * freed, write a per-kernel table (ms/step, GFLOP/s or GB/s, layer) and the
 * time per layer to out; NULL turns it off. For `mptc bench --profile`. */
void mpt_cpu_profile(FILE *out);

/* Modules this process has loaded from the kernel cache (hits) and
 * compiled into it (misses), all JITs together; see codegen/cpu/jit.c */
void mpt_cpu_kcache_stats(int *hits, int *misses);

/* Where bf16 GEMMs and convolutions multiply on this host's JIT target:
 * "AMX tiles", "vdpbf16ps" (where it is measured faster than f32 FMAs),
 * or "f32 FMAs" (no AVX512_BF16, or vdpbf16ps slower: *ratio its rate
 * against theirs, 0 where there is none); NULL where the JIT cannot start.
 * For the advice of `mptc train` and `mptc devices`. */
const char *mpt_cpu_bf16_multiplier(double *ratio);

/* Compiles plan p keeping the optimised LLVM IR and host assembly, and writes
 * one file per kernel into outdir: NAME.ll (emit "llvm") or NAME.s (emit
 * "asm"), each starting with a comment naming the ops it fuses. One line per
 * kernel goes to report. 0, or -1 with err. */
int mpt_cpu_emit_plan(const mpt_plan *p, const char *emit, const char *outdir, FILE *report,
                      char *err, size_t n);

#endif
