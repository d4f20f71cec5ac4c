/* runtime/cli/cmd_devices.c — `mptc devices`: each device, its features, and
 * whether each policy will be fast on it (in the spirit of TensorFlow's
 * "Mixed precision compatibility check (mixed_float16): OK"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/cli.h"
#include "codegen/cpu/cpu.h"
#include "runtime/cuda/cuda.h"
#include "runtime/train/train.h"

static const mpt_cli_opt dev_opts[] = {
    {"has-gpu", 0, "print nothing; exit 0 when a CUDA GPU is usable, 1 otherwise"},
    {"quiet-check", 0, "is the machine quiet enough to time? every core's FMA rate against one "
                       "core's; exit 0 quiet, 3 busy"},
    {NULL, 0, NULL},
};

/* A figure taken under load is not a figure: the FMA loop on every core
 * must run at least 0.9 x cores x its one-core rate (best of 3 each) */
static int quiet_check(void) {
    char err[256];
    mpt_cpu_jit *j = mpt_cpu_jit_new(MPT_CPU_ISA_HOST, err, sizeof err);
    mpt_pool *one = j ? mpt_pool_new(1) : NULL, *all = j ? mpt_pool_new(0) : NULL;
    if (!one || !all) {
        fprintf(stderr, "mptc devices: %s\n", j ? "cannot start threads" : err);
        return 1;
    }
    double r1 = 0, rn = 0;
    for (int i = 0; i < 3; i++) {
        double a = mpt_cpu_fma_rate(j, one), b = mpt_cpu_fma_rate(j, all);
        if (a > r1) r1 = a;
        if (b > rn) rn = b;
    }
    int cores = mpt_pool_threads(all);
    double ratio = r1 > 0 ? rn / r1 : 0;
    int quiet = ratio >= 0.9 * cores;
    printf("fma: 1 thread %.1f GFLOP/s, %d threads %.1f GFLOP/s: %.2fx (%s)\n", r1, cores, rn,
           ratio, quiet ? "quiet" : "busy: another load shares the cores");
    mpt_pool_free(one);
    mpt_pool_free(all);
    return quiet ? 0 : 3;
}

int mpt_cmd_devices(int argc, char **argv) {
    mpt_cli c;
    int prc = mpt_cli_parse(&c, "devices", "devices, their features, and which policies are fast on them",
                            dev_opts, argc, argv);
    if (prc) return prc == 1 ? 0 : 2;
    mpt_cuda_device_info gpus[8];
    char why[256] = "";
    int n_gpu = mpt_cuda_devices(gpus, 8, why, sizeof why);
    if (mpt_cli_has(&c, dev_opts, "has-gpu")) return n_gpu > 0 ? 0 : 1;

    if (mpt_cli_has(&c, dev_opts, "quiet-check")) return quiet_check();

    mpt_cpu_info cpu;
    mpt_devices_cpu(&cpu);
    char jit[512];
    mpt_cpu_host_features(jit, sizeof jit);
    int amx = strstr(jit, "amx in use") != NULL;
    printf("cpu: %s, %d cores\n  features: %s\n  JIT target: %s\n", cpu.name, cpu.cores, cpu.features, jit);
    const char *isa = getenv("MPTC_CPU_ISA");
    if (isa && *isa && strcmp(isa, "host"))
        printf("  MPTC_CPU_ISA=%s: the CPU backend compiles for that ISA instead (what a smaller CPU "
               "runs; the lines below are for the host)\n", isa);
    /* the advice from rates measured here (codegen/cpu/ceiling.c: the
     * peak loops of the instructions the GEMMs use, on every core) */
    char jerr[256];
    mpt_cpu_jit *j = mpt_cpu_jit_new(MPT_CPU_ISA_HOST, jerr, sizeof jerr);
    mpt_pool *pool = j ? mpt_pool_new(0) : NULL;
    const mpt_cpu_ceilings *ce = j && pool ? mpt_cpu_ceilings_measure(j, pool) : NULL;
    double r = ce && ce->f32_gflops > 0 ? ce->bf16_gflops / ce->f32_gflops : 1, dot = 0;
    if (ce)
        printf("  measured peaks: f32 %.0f GFLOP/s (%s), bf16 %.0f GFLOP/s (%s), %d threads\n",
               ce->f32_gflops, ce->f32_how, ce->bf16_gflops, ce->bf16_how, ce->threads);
    /* the ceiling of what MPTC_CPU_ISA compiles (bench/conv_shapes.py holds
     * peers limited to the same ISA against it): a smaller ISA has no bf16
     * dot product, so bf16 runs on its FMAs too */
    if (ce && pool && isa && *isa && strcmp(isa, "host")) {
        static const mpt_cpu_isa small[] = {MPT_CPU_ISA_AVX2, MPT_CPU_ISA_SSE};
        for (int i = 0; i < 2; i++) {
            if (strcmp(isa, mpt_cpu_isa_name(small[i]))) continue;
            mpt_cpu_jit *sj = mpt_cpu_jit_new(small[i], jerr, sizeof jerr);
            if (!sj) break;
            double f = mpt_cpu_fma_rate(sj, pool);
            printf("  measured peak at MPTC_CPU_ISA=%s: f32 %.0f GFLOP/s (%s), bf16 on the same "
                   "FMAs, %d threads\n", isa, f, f > 0 ? "AVX2 FMA loop" : "no FMA: not measured",
                   ce->threads);
            mpt_cpu_jit_free(sj);
        }
    }
    printf("  float32:        OK (FMA %s)\n", cpu.fma ? "yes" : "no: scalar multiply-add");
    printf("  mixed_float16:  %s\n", cpu.f16c ? "storage OK (F16C converts f16<->f32; math runs in f32, so expect memory savings, not speed)"
                                               : "slow: no F16C, f16 is converted in software");
    if (ce && r >= 1.25)
        printf("  mixed_bfloat16: faster: bf16 GEMMs peak at %.1fx the f32 rate here (%s%s); "
               "`mptc bench` measures a model\n", r, amx ? "AMX tiles" : "vdpbf16ps",
               amx ? "" : ", no AMX");
    else if (ce && cpu.avx512_bf16 && !amx && j && !mpt_cpu_bf16_dot_pays(j, &dot))
        if (dot < 0)
            printf("  mixed_bfloat16: storage OK: bf16 is multiplied in f32 FMAs "
                   "(MPT_CPU_BF16_DOT=0); expect memory savings, not speed\n");
        else
            printf("  mixed_bfloat16: storage OK: bf16 is multiplied in f32 FMAs here (vdpbf16ps "
                   "peaks at %.2fx their rate on one core); expect memory savings, not speed\n",
                   dot);
    else if (ce && cpu.avx512_bf16)
        printf("  mixed_bfloat16: storage OK: bf16 dot products peak at %.1fx the f32 rate here; "
               "expect memory savings, not speed\n", r);
    else
        printf("  mixed_bfloat16: %s\n", cpu.avx512_bf16 ? "storage OK: bf16 dot products, no AMX"
                                                      : "storage only: no AVX512_BF16, dot products run in f32");
    if (pool) mpt_pool_free(pool);
    if (j) mpt_cpu_jit_free(j);
    printf("cuda libraries:\n");
    mpt_cuda_describe_libraries(stdout);
    if (n_gpu <= 0) {
        printf("cuda: none (%s)\n", why[0] ? why : "no device");
        return 0;
    }
    for (int i = 0; i < n_gpu; i++) {
        const mpt_cuda_device_info *g = &gpus[i];
        printf("cuda:%d: %s, compute capability %d.%d, %.1f GiB\n", i, g->name, g->cc_major, g->cc_minor,
               (double)g->total_mem / (1 << 30));
        int cc = g->cc_major * 10 + g->cc_minor;
        printf("  Mixed precision compatibility check (mixed_float16): %s\n",
               cc >= 70 ? "OK (f16 Tensor Cores)" : "WARNING: compute capability < 7.0, no f16 Tensor Cores; expect little speed-up");
        printf("  Mixed precision compatibility check (mixed_bfloat16): %s\n",
               cc >= 80 ? "OK (bf16 Tensor Cores)" : "WARNING: compute capability < 8.0, no bf16 Tensor Cores");
    }
    return 0;
}
