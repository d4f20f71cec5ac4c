/* runtime/cuda/cuda_profile.c — `--profile` of the CUDA backend: the table
 * a plan prints when it is freed (mpt_cuda_profile, cuda.h), from the CUDA
 * events cuda_exec.c records around every kernel, cuBLASLt call and NCCL
 * call of a step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/cuda_impl.h"

/* One row per kernel in plan order (GEMM/conv: TFLOP/s of the core's
 * flops; the rest: GB/s over the bytes its inputs and outputs hold), then
 * the time per layer, largest first. */
void mpt_cuda_profile_report(const mpt_exec *x) {
    FILE *f = x->prof_out;
    const mpt_graph *g = x->plan->g;
    double total = 0, steps = x->prof_steps;
    int n_lt = 0;
    for (int k = 0; k < x->n_steps; k++) total += x->steps[k].ms, n_lt += x->steps[k].is_lt;
    char mem[32];
    char refused[64] = "";
    if (x->n_lt_refused)
        snprintf(refused, sizeof refused, ", %d it had no algorithm for", x->n_lt_refused);
    fprintf(f, "cuda profile of %s: %d kernels (%d on cuBLASLt%s), %d step%s after the first, "
            "%.3f ms/step in kernels (CUDA events), %d of %d updates computed in place, %s on the device\n",
            g->name ? g->name : "plan", x->n_steps, n_lt, refused, x->prof_steps,
            x->prof_steps == 1 ? "" : "s",
            total / steps, x->n_in_place, g->n_updates, mpt_fmt_bytes(x->device_bytes, mem, sizeof mem));
    if (x->graphs)
        fprintf(f, "(timed kernel by kernel, each launched on its own; without --profile the "
                "step runs as one CUDA graph)\n");
    const mpt_cuda_ceilings *c = mpt_cuda_ceilings_measure();
    fprintf(f, "ceilings: f16 %.1f, bf16 %.1f, f32 %.1f, tf32 %.1f TFLOP/s (cuBLASLt GEMM 8192^3, "
            "fp32 4096^3), memory %.0f GB/s (device copy of 256 MiB)%s%s\n", c->f16_tflops,
            c->bf16_tflops, c->f32_tflops, c->tf32_tflops, c->gbps,
            c->why[0] ? "; not measured: " : "", c->why);
    fprintf(f, "  k  kind        ms/step     %%        rate   of ceiling  layer            kernel\n");
    const char **layers = calloc((size_t)x->n_steps + 1, sizeof *layers);
    double *layer_ms = calloc((size_t)x->n_steps + 1, sizeof *layer_ms);
    int n_layers = 0;
    for (int k = 0; k < x->n_steps; k++) {
        const mpt_kernel *K = &x->plan->kernels[k];
        double ms = x->steps[k].ms / steps, flops = mpt_kernel_flops(g, K);
        char rate[32];
        double achieved, ceiling;
        if (flops > 0) {
            achieved = ms > 0 ? flops / (ms * 1e-3) * 1e-12 : 0;
            mpt_dtype dt = g->nodes[g->nodes[K->root].in[0]].dtype;
            ceiling = dt == MPT_DT_F16    ? c->f16_tflops
                      : dt == MPT_DT_BF16 ? c->bf16_tflops
                      : x->plan->tf32     ? c->tf32_tflops
                                          : c->f32_tflops;
            snprintf(rate, sizeof rate, "%6.1f TF/s", achieved);
        } else {
            achieved = ms > 0 ? (double)mpt_kernel_bytes(g, K) / (ms * 1e-3) * 1e-9 : 0;
            ceiling = c->gbps;
            snprintf(rate, sizeof rate, "%6.1f GB/s", achieved);
        }
        const char *layer = mpt_kernel_layer(g, K);
        fprintf(f, "%3d  %-10s %8.4f %5.1f  %s %9.1f%%  %-16s %s\n", k,
                x->steps[k].is_lt  ? "cublasLt"
                : x->steps[k].coll ? "nccl"
                                   : mpt_kernel_kind_name(K->kind), ms,
                total > 0 ? 100.0 * x->steps[k].ms / total : 0, rate,
                ceiling > 0 ? 100.0 * achieved / ceiling : 0.0, layer, K->name);
        if (!layers || !layer_ms) continue;
        int l = 0;
        while (l < n_layers && strcmp(layers[l], layer)) l++;
        if (l == n_layers) layers[n_layers++] = layer;
        layer_ms[l] += x->steps[k].ms;
    }
    fprintf(f, "per layer:\n");
    for (int done = 0; done < n_layers; done++) {
        int best = -1;
        for (int l = 0; l < n_layers; l++)
            if (layer_ms[l] >= 0 && (best < 0 || layer_ms[l] > layer_ms[best])) best = l;
        fprintf(f, "  %-16s %8.4f ms/step %5.1f%%\n", layers[best], layer_ms[best] / steps,
                total > 0 ? 100.0 * layer_ms[best] / total : 0);
        layer_ms[best] = -1;
    }
    free(layers);
    free(layer_ms);
}
