/* tests/test_cuda_examples.c — every example's train step through the CUDA
 * generator and NVRTC, no GPU needed.
 *
 * For every examples/ *.mpt, under float32, mixed_float16 and
 * mixed_bfloat16, fused and unfused, at the train block's batch size, every
 * kernel of the plan (GEMMs that cuBLASLt would run included) is generated
 * and compiled together (mpt_cuda_compile_all) for sm_80 or sm_90, each
 * plan for one of them, chosen so that plans sharing kernels share their
 * compiles while every example, policy and fusion meets both (see main).
 * (Both for every plan take far longer;
 * `build/tests/test_cuda_examples --all` runs them.)
 *
 * Of the kernels whose code differs only in its numbers (the layers of a
 * model with other shapes, the unrolled steps of an LSTM, the same op at
 * other offsets) and which launch alike (kind, block, tile, shared memory,
 * Tensor Core instruction, split-K, phases: code_path), the first on each
 * architecture is compiled and checked, and those of its very code (free:
 * the cache, or another name in its plan); the others would cost NVRTC
 * most of the test's time for the same code path. EXAMPLES_EVERY_KERNEL=1
 * (and --all) compiles and checks every kernel. Checks:
 *
 *   - every kernel checked compiles, ptxas reports its registers and no
 *     spills;
 *   - every GEMM and convolution whose operands are f16/bf16 is a Tensor
 *     Core kernel: its PTX holds mma.sync m16n8k16 of that dtype;
 *   - in those, every epilogue op leaves its instruction in the PTX: a
 *     cast to f16/bf16 its cvt.rn, relu its max, a comparison its setp,
 *     arithmetic f32 arithmetic (add, sub, mul or fma);
 *   - kernels compiled once for several (the same code under another
 *     name) carry that name's PTX.
 *
 * Then each example's fused float32 plan under --tf32, whose f32 GEMMs
 * and convolutions must be TF32 Tensor Core kernels (m16n8k8), without
 * spills either.
 *
 * Skips (77) when libnvrtc cannot be loaded. Run from the repository root. */
#include <ctype.h>
#include <glob.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "codegen/cuda/cuda.h"
#include "runtime/cuda/cuda.h"
#include "runtime/train/train.h"

static const char *const policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};

static int has(const char *ptx, const char *what) { return ptx && strstr(ptx, what) != NULL; }

/* The instruction an epilogue op must leave, or NULL where none is owed
 * (a broadcast, a cast to f32 of an f32 accumulator). */
static const char *owed(const mpt_graph *g, const mpt_node *nd, const char *ptx) {
    mpt_op op = nd->op;
    if (op == MPT_OP_CAST && nd->dtype == MPT_DT_F16)
        return has(ptx, "cvt.rn.f16.f32") ? NULL : "cvt.rn.f16.f32";
    if (op == MPT_OP_CAST && nd->dtype == MPT_DT_BF16)
        return has(ptx, "cvt.rn.bf16.f32") ? NULL : "cvt.rn.bf16.f32";
    if (op == MPT_OP_RELU || op == MPT_OP_MAX) return has(ptx, "max.f32") ? NULL : "max.f32";
    if (op == MPT_OP_GT || op == MPT_OP_LT || op == MPT_OP_EQ)
        return has(ptx, "setp.") ? NULL : "setp";
    if (op == MPT_OP_EXP) return has(ptx, "ex2.approx") ? NULL : "ex2.approx";
    /* the finite check: the exponent mask (of the f32, or of the bf16 or
     * f16 it was widened from), and its column flag cleared by a byte store */
    if (op == MPT_OP_IS_FINITE)
        return has(ptx, ", 2139095040;") || has(ptx, ", 32640;") || has(ptx, ", 31744;")
                   ? NULL
                   : "an exponent mask (0x7f800000, 0x7f80, 0x7c00)";
    if (op == MPT_OP_REDUCE_ALL) return has(ptx, "st.global.u8") ? NULL : "st.global.u8";
    if ((op == MPT_OP_ADD || op == MPT_OP_SUB || op == MPT_OP_MUL) &&
        g->nodes[nd->in[0]].dtype != MPT_DT_BOOL)
        return has(ptx, "add.f32") || has(ptx, "sub.f32") || has(ptx, "mul.f32") ||
                       has(ptx, "fma.rn.f32") || has(ptx, "add.rn.f32") || has(ptx, "mul.rn.f32")
                   ? NULL
                   : "f32 add/sub/mul/fma";
    return NULL;
}

/* the first argument of the kernel's __launch_bounds__, or 1024 */
static unsigned launch_bound(const char *src) {
    const char *p = strstr(src, "__launch_bounds__(");
    return p ? (unsigned)atoi(p + strlen("__launch_bounds__(")) : 1024;
}

static int n_plans, n_kernels, n_tensor_core, n_epilogue_ops, n_shared, n_wgmma;

static int all_plans, every_kernel, n_emit_only, n_compiled, n_represented;
static double nvrtc_seconds;

static uint64_t fnv1a(uint64_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* A kernel's code path: its source past the header comment with its name
 * and every number left out (shapes, offsets, strides: the constants that
 * differ between the layers of a model and the steps of a recurrence),
 * and what sets its resources: kind, block, tile, dynamic shared memory,
 * Tensor Core instruction, split-K and phases. The source is the same for
 * every architecture (the generator is not told which), so the path is
 * too: it is compiled for the first architecture it is met on, and its
 * launch checked against sm_80's limits, which fit sm_90's. Also the hash
 * of its exact code (name left out) and architecture, which the cache
 * keys on. */
static void code_path(const mpt_kernel *kn, const mpt_cuda_kernel_src *src, const char *arch,
                      uint64_t *path, uint64_t *exact) {
    const char *c = src->source, *end = strstr(c, "*/");
    if (strncmp(c, "/*", 2) == 0 && end) c = end + 2;
    size_t ln = strlen(src->name);
    uint64_t h = 1469598103934665603ull, x = h;
    char launch[160];
    snprintf(launch, sizeof launch, "%d %u %u %u %u %d %d %d %d %d %d %d", kn->kind,
             src->block[0], src->block[1], src->block[2], src->shared_bytes, src->tile_m,
             src->tile_n, src->tensor_cores, src->wgmma, src->tf32, src->grid[2] > 1,
             src->phases > 0);
    h = fnv1a(h, launch, strlen(launch));
    x = fnv1a(x, arch, strlen(arch));
    while (*c) {
        if (ln && strncmp(c, src->name, ln) == 0) {
            h = fnv1a(h, "@", 1), x = fnv1a(x, "@", 1), c += ln;
            continue;
        }
        int word = c > src->source && (isalnum((unsigned char)c[-1]) || c[-1] == '_');
        if (!word && isdigit((unsigned char)*c)) { /* a number: 12, 0x7f800000u, 1.5e-3f */
            const char *n = c;
            while (isalnum((unsigned char)*c) || *c == '.' ||
                   ((*c == '-' || *c == '+') && (c[-1] == 'e' || c[-1] == 'E') && n[1] != 'x'))
                c++;
            h = fnv1a(h, "#", 1), x = fnv1a(x, n, (size_t)(c - n));
            continue;
        }
        h = fnv1a(h, c, 1), x = fnv1a(x, c, 1), c++;
    }
    *path = h;
    *exact = x;
}

/* the code paths met so far: each with the exact code of the kernel that
 * was compiled for it */
static uint64_t (*paths)[2];
static int n_paths, cap_paths;

/* 1 when kernel k is to be compiled: the first of its code path, or the
 * very code of that first one (a cache hit, or another name in the same
 * plan: free, and what checks the sharing of compiles) */
static int compile_kernel(uint64_t path, uint64_t exact) {
    if (every_kernel) return 1;
    for (int i = 0; i < n_paths; i++)
        if (paths[i][0] == path) return paths[i][1] == exact;
    if (n_paths == cap_paths) {
        cap_paths = cap_paths ? 2 * cap_paths : 1024;
        paths = realloc(paths, sizeof *paths * (size_t)cap_paths);
    }
    paths[n_paths][0] = path;
    paths[n_paths++][1] = exact;
    return 1;
}

static void check_plan(const char *path, const char *policy, int fused, const char *arch,
                       int tf32) {
    mpt_compile_opts o = {.path = path, .policy = policy, .xla = fused, .plan_only = 1,
                          .device = "cuda", .tf32 = tf32, .diag = stderr};
    mpt_session *s = NULL;
    if (mpt_session_open(&o, &s)) {
        CHECK_MSG(0, "%s %s %s: the session does not open", path, policy,
                  fused ? "fused" : "unfused");
        return;
    }
    const mpt_plan *p = s->train_plan;
    const mpt_graph *g = p->g;
    int nk = p->n_kernels;
    mpt_cuda_kernel_src *src = calloc((size_t)nk, sizeof *src);
    mpt_cuda_binary *bin = calloc((size_t)nk, sizeof *bin);
    const char **srcs = calloc((size_t)nk, sizeof *srcs), **names = calloc((size_t)nk, sizeof *names);
    char err[8192];
    int ok = 1;
    for (int k = 0; k < nk && ok; k++) {
        ok = mpt_cuda_emit_kernel(p, k, &src[k], err, sizeof err) == 0;
        CHECK_MSG(ok, "%s %s: emit %s: %s", path, policy, p->kernels[k].name, err);
        srcs[k] = src[k].source;
        names[k] = src[k].name;
    }
    /* A large unfused plan under a mixed policy (the recurrent and
     * depthwise examples: 2000+ one-op kernels) is generated but not
     * compiled without --all: its kernels are the fused plans' ops one at a
     * time, which the float32 unfused plan compiles, and NVRTC on them
     * would take minutes of the suite's 15 */
    int emit_only = !all_plans && !fused && nk > 1500 && strcmp(policy, "float32") != 0;
    if (ok && emit_only) n_emit_only++;
    /* the kernels to compile (pick[0..n_pick)): without
     * EXAMPLES_EVERY_KERNEL=1, one of each code path (code_path) */
    int *pick = calloc((size_t)nk + 1, sizeof *pick), n_pick = 0;
    for (int k = 0; ok && !emit_only && k < nk; k++) {
        uint64_t cp, exact;
        code_path(&p->kernels[k], &src[k], arch, &cp, &exact);
        if (compile_kernel(cp, exact)) {
            srcs[n_pick] = src[k].source;
            names[n_pick] = src[k].name;
            pick[n_pick++] = k;
        }
    }
    if (ok && !emit_only) {
        n_represented += nk - n_pick;
        ok = mpt_cuda_compile_all(n_pick, srcs, names, arch, bin, err, sizeof err) == 0;
        CHECK_MSG(ok, "%s %s %s %s: %s", path, policy, fused ? "fused" : "unfused", arch, err);
    }
    if (emit_only) ok = 0; /* nothing compiled to check below */
    /* what this plan cost NVRTC: its kernels neither another's code nor
     * read from the cache (the suite's time goes here) */
    int n_nvrtc = 0;
    double nvrtc_s = 0;
    for (int j = 0; ok && j < n_pick; j++)
        if (bin[j].same_as < 0 && !bin[j].cache_hit) n_nvrtc++, nvrtc_s += bin[j].seconds;
    if (ok)
        printf("  %s %s %s%s%s %s: %d kernels, %d checked, %d compiled (%.1f s in NVRTC)\n",
               path, policy, fused ? "fused" : "unfused", tf32 ? " tf32" : "",
               getenv("MPTC_CUDA_WGMMA") ? " wgmma" : "", arch, nk, n_pick, n_nvrtc, nvrtc_s);
    n_compiled += n_nvrtc;
    nvrtc_seconds += nvrtc_s;
    for (int j = 0; ok && j < n_pick; j++) {
        int k = pick[j];
        const mpt_kernel *kn = &p->kernels[k];
        const char *ptx = bin[j].ptx;
        n_kernels++;
        n_shared += bin[j].same_as >= 0;
        CHECK_MSG(bin[j].regs > 0 && bin[j].spill_stores == 0 && bin[j].spill_loads == 0,
                  "%s %s %s: %d registers, %d bytes spilled", path, policy, src[k].name,
                  bin[j].regs, bin[j].spill_stores);
        CHECK_MSG(has(ptx, src[k].name), "%s: the PTX names its entry", src[k].name);
        /* the launch fits: at most 1024 threads, at least one block an SM
         * (registers, shared memory: mpt_cuda_blocks_per_sm), the static
         * (ptxas' smem) and dynamic shared memory within a block's opt-in
         * maximum (227 KiB on sm_90, 163 KiB on sm_80), and a
         * __launch_bounds__ no smaller; on sm_80, whose limits are the
         * tighter, except for wgmma kernels (sm_90 alone) */
        const char *fit = src[k].wgmma ? arch : "sm_80";
        unsigned threads = src[k].block[0] * src[k].block[1] * src[k].block[2];
        long smem = src[k].shared_bytes + bin[j].static_smem;
        long smem_max = strncmp(fit, "sm_90", 5) == 0 ? 232448 : 166912;
        const char *limit;
        int blocks = mpt_cuda_blocks_per_sm(fit, threads, bin[j].regs, (unsigned)smem, &limit);
        CHECK_MSG(threads >= 1 && threads <= 1024 && blocks >= 1 && smem <= smem_max &&
                      threads <= launch_bound(src[k].source),
                  "%s %s %s (%s, fits %s): %u threads of %d registers, %ld B shared (%d blocks "
                  "an SM: %s), bounds %u", path, policy, src[k].name, arch, fit, threads,
                  bin[j].regs, smem, blocks, limit, launch_bound(src[k].source));
        if (kn->kind != MPT_KERNEL_GEMM && kn->kind != MPT_KERNEL_CONV) continue;
        mpt_dtype dt = g->nodes[g->nodes[kn->root].in[0]].dtype;
        if (dt != MPT_DT_F16 && dt != MPT_DT_BF16 && !(dt == MPT_DT_F32 && tf32)) continue;
        const char *mma = dt == MPT_DT_F16   ? "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
                          : dt == MPT_DT_BF16 ? "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
                                              : "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32";
        /* MPTC_CUDA_WGMMA=1: sm_90's wgmma, m64nNk16 */
        if (src[k].wgmma) mma = dt == MPT_DT_F16 ? "k16.f32.f16.f16" : "k16.f32.bf16.bf16";
        CHECK_MSG(src[k].tensor_cores && has(ptx, mma) &&
                      (!src[k].wgmma || (has(ptx, "wgmma.mma_async.sync.aligned.m64n") &&
                                         !has(ptx, "mma.sync"))),
                  "%s %s %s (%s): no %s", path, policy, src[k].name, arch, mma);
        /* ptxas keeps the wgmmas in flight: it neither serialized them nor
         * added a warpgroup wait or arrive of its own */
        char note[256];
        CHECK_MSG(bin[j].wgmma_serial == 0, "%s %s %s: ptxas: %s", path, policy, src[k].name,
                  mpt_cuda_wgmma_note(&bin[j], note, sizeof note));
        n_wgmma += src[k].wgmma;
        n_tensor_core++;
        for (int i = 0; i < kn->n_nodes; i++) {
            if (kn->nodes[i] <= kn->root) continue; /* the root and its prologue */
            const mpt_node *nd = &g->nodes[kn->nodes[i]];
            const char *missing = owed(g, nd, ptx);
            n_epilogue_ops++;
            CHECK_MSG(!missing, "%s %s %s: epilogue %s (%%%d) left no %s in the PTX", path, policy,
                      src[k].name, mpt_op_name(nd->op), kn->nodes[i], missing);
        }
    }
    for (int k = 0; k < nk; k++) {
        mpt_cuda_binary_free(&bin[k]);
        mpt_cuda_kernel_src_free(&src[k]);
    }
    free(src);
    free(bin);
    free(pick);
    free(srcs);
    free(names);
    mpt_session_free(s);
    n_plans++;
}

/* the examples whose GEMMs and convolutions the TF32 and wgmma plans are
 * for: dense and convolutional models of every size */
static int is_gemm_example(const char *path) {
    static const char *const names[] = {"convnet.mpt", "convnet64.mpt", "convnet_small.mpt",
                                        "mlp_cpu.mpt", "mlp_small.mpt", "mnist_mlp.mpt",
                                        "resnet50.mpt", "text_tiny.mpt"};
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(base, names[i]) == 0) return 1;
    return 0;
}

int main(int argc, char **argv) {
    char why[512];
    if (!mpt_cuda_nvrtc(why, sizeof why)) {
        printf("skip: %s\n", why);
        return 77;
    }
    int all = argc > 1 && strcmp(argv[1], "--all") == 0;
    all_plans = all;
    const char *every = getenv("EXAMPLES_EVERY_KERNEL");
    every_kernel = all || (every && strcmp(every, "1") == 0);
    const char *only = argc > 1 && !all ? argv[1] : NULL;
    glob_t gl;
    if (glob("examples/*.mpt", 0, NULL, &gl) != 0 || gl.gl_pathc == 0) {
        fprintf(stderr, "test_cuda_examples: no examples/*.mpt here; run it from the repository "
                "root\n");
        return 1;
    }
    for (size_t e = 0, gi = 0; e < gl.gl_pathc; e++) {
        /* the layer examples (recurrent, attention, depthwise, U-Net) add
         * no GEMM or convolution kind the GEMM examples lack, and their
         * unfused plans are their fused plans' ops one at a time: without
         * --all they compile their fused plans under every policy only
         * (float32 and mixed_bfloat16 for sm_90, mixed_float16 for sm_80),
         * not the unfused, TF32 and wgmma variants (tests/test_cuda_emu.c
         * runs the new ops unfused on the host emulator) */
        int gemm_example = is_gemm_example(gl.gl_pathv[e]);
        /* Without --all, a GEMM example's plan compiles for one
         * architecture: sm_80 (the smaller shared memory a block), except
         * that the mixed policy whose wgmma plan is checked (f16 and bf16 by
         * turns) compiles its fused plan for sm_90 with it, and, by turns
         * over the GEMM examples (gi), either nothing else, or the float32
         * fused and TF32 plans, or the three unfused plans go to sm_90 too.
         * Plans that share kernels (the same plan with other GEMMs; the
         * one-op optimizer and loss kernels of unfused plans under every
         * policy) so share their compiles, the kernel cache being keyed by
         * code and architecture, and still every example, every policy
         * fused and unfused, and the TF32 and wgmma plans of both mixed
         * dtypes meet both architectures. */
        int twin = gi & 1 ? 2 : 1; /* the policy of the wgmma plan */
        int f32_on_90 = gi % 3 == 1, unfused_on_90 = gi % 3 == 2;
        gi += gemm_example;
        if (only && !strstr(gl.gl_pathv[e], only)) continue;
        for (int p = 0; p < 3; p++)
            for (int fused = 1; fused >= 0; fused--)
                for (int a = 0; a < 2; a++) {
                    int sm90 = !gemm_example ? (p + fused) & 1
                               : !fused      ? unfused_on_90
                               : p == 0      ? f32_on_90
                                             : p == twin;
                    if (!all && (a != sm90 || (!gemm_example && !fused))) continue;
                    check_plan(gl.gl_pathv[e], policies[p], fused, a ? "sm_90" : "sm_80", 0);
                }
        if (!all && !gemm_example) {
            printf("%s: %d plans so far\n", gl.gl_pathv[e], n_plans);
            continue;
        }
        /* float32 --tf32, fused: the TF32 Tensor Core kernels (for the
         * float32 fused plan's architecture; both with --all) */
        for (int a = 0; a < 2; a++)
            if (all || a == f32_on_90)
                check_plan(gl.gl_pathv[e], "float32", 1, a ? "sm_90" : "sm_80", 1);
        /* sm_90's wgmma kernels (MPTC_CUDA_WGMMA=1), fused, f16 and bf16 by
         * turns: Tensor Core instructions, epilogue ops, no spills */
        setenv("MPTC_CUDA_WGMMA", "1", 1);
        check_plan(gl.gl_pathv[e], policies[twin], 1, "sm_90", 0);
        unsetenv("MPTC_CUDA_WGMMA");
        printf("%s: %d plans so far\n", gl.gl_pathv[e], n_plans);
        fflush(stdout);
    }
    globfree(&gl);
    printf("%d plans, %d kernels (%d compiled as another's code), %d Tensor Core GEMMs and "
           "convolutions (%d of them wgmma) with %d epilogue ops checked; %d large unfused "
           "plans generated only (--all compiles them)\n", n_plans, n_kernels, n_shared,
           n_tensor_core, n_wgmma, n_epilogue_ops, n_emit_only);
    printf("%d kernels compiled by NVRTC (the others another's code or cached), %.1f s "
           "summed over the compiling threads; %d kernels of a code path already checked not "
           "compiled (EXAMPLES_EVERY_KERNEL=1 or --all compiles them)\n", n_compiled,
           nvrtc_seconds, n_represented);
    if (!all)
        printf("each plan compiled for one architecture, sm_80 or sm_90 (see main); the layer "
               "examples' fused plans only; --all: every plan for both\n");
    CHECK(n_plans > 0 && n_tensor_core > 0 && n_epilogue_ops > 0 && (only || n_shared > 0));
    CHECK(n_wgmma > 0);
    return check_exit("test_cuda_examples");
}
