/* tests/test_attention_kernels.c — each fused attention kernel's own
 * outputs (o, lse, dq, dk, dv) against the interpreter's values of the
 * same nodes, for the models of tests/attention_cases.h:
 *
 *   (d2) the CPU kernels (codegen/cpu/attention.c, attention_grad.c,
 *        attention_amx.c) called alone on the interpreter's inputs;
 *   (g) the generated CUDA kernels (codegen/cuda/emit_attn.c,
 *       emit_attn_mma.c) on the host emulator (tests/cuda_emu.h), and
 *       through NVRTC where libnvrtc is.
 */
#include "attention_cases.h"
#include "codegen/cpu/emit.h"
#include "codegen/cuda/cuda.h"
#include "codegen/cuda/driver.h"
#include "cuda_emu.h"

/* ---- (d2) the CPU attention kernels alone, output by output ---- */

/* A train step's outputs are its loss and the variables after Adam, whose
 * update hides a gradient's scale (and its atol a small error): here the
 * kernels' own outputs (o, lse, dq, dk, dv) against the interpreter's
 * values of the same nodes. amx 1 runs the bf16 heads on AMX tiles where
 * the host has them (attention_amx.c; probabilities and ds rounded to
 * bf16: TOL_MMA's reason), amx 0 the FMA kernels. */
typedef struct {
    const mpt_kernel *k;
    mpt_tensor *vals, *outs;
} kernel_io;

static void *kernel_data(const void *ctx, int node) {
    const kernel_io *io = ctx;
    for (int i = 0; i < io->k->n_outputs; i++)
        if (io->k->outputs[i] == node) return io->outs[i].data;
    return io->vals[node].data;
}

static int host_amx = -1; /* the JIT's bf16 GEMMs on AMX here */
static int n_amx_kernels;

static void check_cpu_kernels(const model_case *c, const char *policy, int amx) {
    mpt_model *m = load_src(c->name, c->src, 1);
    if (!m) return;
    mpt_graph *typed = typed_of(m, policy), *r = NULL, *step = NULL;
    mpt_attention_note note;
    if (typed) r = rewrite(typed, NULL, &note);
    if (r) step = train_step(r, m, policy);
    mpt_plan *p = step ? plan_of(step, 1) : NULL;
    int ni = step ? mpt_graph_n_inputs(step) : 0, nv = step ? mpt_graph_n_variables(step) : 0;
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in), *vars = calloc((size_t)nv + 1, sizeof *vars);
    mpt_tensor *outs = calloc(64, sizeof *outs), *vals = step ? calloc((size_t)step->n_nodes, sizeof *vals) : NULL;
    mpt_pool *pool = mpt_pool_new(2);
    char err[1024];
    if (p && pool) {
        emu_fill_inputs(step, in, 7);
        plant_masks(step, in);
        mpt_init_variables(step, vars, 11);
        mpt_interp_opts io = {.on_node = emu_capture, .ctx = vals};
        int rc = mpt_interp_run(step, in, vars, outs, &io, err, sizeof err);
        CHECK_MSG(rc == 0, "%s %s: interpreter: %s", c->name, policy, err);
        for (int k = 0; rc == 0 && k < p->n_kernels; k++) {
            const mpt_kernel *K = &p->kernels[k];
            mpt_op op = p->g->nodes[K->root].op;
            if (K->kind != MPT_KERNEL_OPAQUE || (op != MPT_OP_ATTENTION && op != MPT_OP_ATTENTION_GRAD))
                continue;
            /* what `mptc asm` reports: AMX for the bf16 cases the tiles
             * take (heads of multiples of 32, causal or no mask, no
             * dropout), the FMA kernels for every other */
            int want = strcmp(policy, "mixed_bfloat16") == 0 &&
                       (!strcmp(c->name, "heads_64_32") || !strcmp(c->name, "heads_32_long") ||
                        !strcmp(c->name, "heads_32_64_cross"));
            CHECK_MSG(mpt_cpu_attention_amx_takes(p->g, K) == want, "%s %s: %s: AMX taken %d, want %d", c->name,
                      policy, K->name, mpt_cpu_attention_amx_takes(p->g, K), want);
            mpt_tensor got[8] = {0};
            kernel_io kio = {K, vals, got};
            for (int j = 0; j < K->n_outputs && j < 8; j++) {
                const mpt_node *nd = &p->g->nodes[K->outputs[j]];
                mpt_tensor_alloc(&got[j], nd->dtype, nd->shape);
                memset(got[j].data, 0xff, mpt_tensor_bytes(&got[j])); /* NaN: unwritten fails */
            }
            int kr = mpt_cpu_run_attention(p->g, K, kernel_data, &kio, amx, pool, err, sizeof err);
            CHECK_MSG(kr == 0, "%s %s: %s: %s", c->name, policy, K->name, err);
            n_amx_kernels += kr == 0 && amx;
            for (int j = 0; kr == 0 && j < K->n_outputs && j < 8; j++) {
                const mpt_tensor *ref = &vals[K->outputs[j]];
                double max_ref = 0;
                for (int64_t i = 0; i < mpt_shape_numel(ref->shape); i++) max_ref = fmax(max_ref, fabs(mpt_tensor_get(ref, i)));
                /* as the emulator's check (g): the output dtype's row of
                 * the table, atol from f32 sums of Tq E-long products */
                const mpt_node *q = &p->g->nodes[p->g->nodes[K->outputs[j]].in[0]];
                tol t = tol_for(TOL_ACCUM, ref->dtype, 1);
                /* on the tiles p and ds are bf16 whatever the output's
                 * dtype (an f32 o too): bf16's TOL_MMA row */
                if (amx) t = tol_for(TOL_MMA, MPT_DT_BF16, 1);
                t.atol = 8 * (double)(q->shape.dim[2] * q->shape.dim[3]) * 0x1p-24 * max_ref;
                if (ref->dtype != MPT_DT_F32 || amx) t.atol = fmax(t.atol, t.rtol * max_ref);
                char what[200];
                snprintf(what, sizeof what, "%s %s CPU%s %s output %%%d", c->name, policy, amx ? " (amx)" : "",
                         K->name, K->outputs[j]);
                compare(&got[j], ref, t, what);
            }
            for (int j = 0; j < K->n_outputs && j < 8; j++) mpt_tensor_free(&got[j]);
        }
        for (int k = 0; rc == 0 && k < step->n_outputs; k++) mpt_tensor_free(&outs[k]);
    }
    if (pool) mpt_pool_free(pool);
    for (int i = 0; vals && i < step->n_nodes; i++) mpt_tensor_free(&vals[i]);
    for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    for (int k = 0; k < nv; k++) mpt_tensor_free(&vars[k]);
    free(vals);
    free(outs);
    free(in);
    free(vars);
    mpt_plan_free(p);
    mpt_graph_free(step);
    mpt_graph_free(r);
    mpt_graph_free(typed);
    mpt_model_free(m);
}

/* ---- (g) the CUDA kernels on the host emulator ---- */

static int n_emu_kernels, n_nvrtc;

static void check_cuda(const model_case *c, const char *policy) {
    mpt_model *m = load_src(c->name, c->src, 1);
    if (!m) return;
    mpt_graph *typed = typed_of(m, policy), *r = NULL, *step = NULL;
    mpt_attention_note note;
    if (typed) r = rewrite(typed, NULL, &note);
    if (r) step = train_step(r, m, policy);
    mpt_plan *p = step ? plan_of(step, 1) : NULL;
    int ni = step ? mpt_graph_n_inputs(step) : 0, nv = step ? mpt_graph_n_variables(step) : 0;
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in), *vars = calloc((size_t)nv + 1, sizeof *vars);
    mpt_tensor *outs = calloc(64, sizeof *outs), *vals = step ? calloc((size_t)step->n_nodes, sizeof *vals) : NULL;
    char err[2048];
    if (p) {
        emu_fill_inputs(step, in, 5);
        plant_masks(step, in);
        mpt_init_variables(step, vars, 9);
        mpt_interp_opts io = {.on_node = emu_capture, .ctx = vals};
        int rc = mpt_interp_run(step, in, vars, outs, &io, err, sizeof err);
        CHECK_MSG(rc == 0, "%s %s: interpreter: %s", c->name, policy, err);
        mpt_cuda_kernel_src src[2];
        int n = 0;
        for (int k = 0; rc == 0 && k < p->n_kernels && n < 2; k++) {
            mpt_op op = p->g->nodes[p->kernels[k].root].op;
            if (p->kernels[k].kind != MPT_KERNEL_OPAQUE || (op != MPT_OP_ATTENTION && op != MPT_OP_ATTENTION_GRAD))
                continue;
            int e = mpt_cuda_emit_kernel(p, k, &src[n], err, sizeof err);
            CHECK_MSG(e == 0, "%s %s: emit: %s", c->name, policy, err);
            n += e == 0;
        }
        CHECK_MSG(n == 2, "%s %s: %d attention kernels emitted, want 2", c->name, policy, n);
        emu_module em;
        if (n == 2 && emu_build(&em, src, n, err, sizeof err) == 0) {
            for (int x = 0; x < n; x++) {
                const mpt_cuda_kernel_src *ksrc = &src[x];
                void **args = calloc((size_t)ksrc->n_params + 1, sizeof *args);
                void **maps = calloc((size_t)ksrc->n_params + 1, sizeof *maps);
                size_t *lens = calloc((size_t)ksrc->n_params + 1, sizeof *lens);
                for (int j = 0; j < ksrc->n_params; j++) {
                    const mpt_node *nd = &step->nodes[ksrc->params[j]];
                    size_t bytes = (size_t)mpt_shape_numel(nd->shape) * mpt_dtype_size(nd->dtype);
                    args[j] = emu_buffer(bytes, &maps[j], &lens[j]);
                    if (j < ksrc->n_inputs) memcpy(args[j], vals[ksrc->params[j]].data, bytes);
                    else memset(args[j], 0xff, bytes); /* NaN: an element left unwritten fails */
                }
                int lr = emu_launch(&em, x, args, err, sizeof err);
                CHECK_MSG(lr == 0, "%s %s: %s: %s", c->name, policy, ksrc->name, err);
                n_emu_kernels += lr == 0;
                for (int j = ksrc->n_inputs; lr == 0 && j < ksrc->n_params; j++) {
                    const mpt_tensor *ref = &vals[ksrc->params[j]];
                    mpt_tensor got = {ref->dtype, ref->shape, args[j]};
                    double max_ref = 0;
                    for (int64_t i = 0; i < mpt_shape_numel(ref->shape); i++)
                        max_ref = fmax(max_ref, fabs(mpt_tensor_get(ref, i)));
                    /* the table's accumulation tolerance of the output's
                     * dtype; atol: f32 sums of Tk terms of E-long products
                     * (the host's expf within 2 ulps), as test_cuda_emu's */
                    const mpt_node *q = &step->nodes[step->nodes[ksrc->params[j]].in[0]];
                    tol t = tol_for(TOL_ACCUM, ref->dtype == MPT_DT_F32 ? MPT_DT_F32 : ref->dtype, 1);
                    t.atol = 8 * (double)(q->shape.dim[2] * q->shape.dim[3]) * 0x1p-24 * max_ref;
                    if (ref->dtype != MPT_DT_F32) t.atol = fmax(t.atol, t.rtol * max_ref);
                    char what[200];
                    snprintf(what, sizeof what, "%s %s CUDA %s output %%%d", c->name, policy, ksrc->name,
                             ksrc->params[j]);
                    compare(&got, ref, t, what);
                }
                for (int j = 0; j < ksrc->n_params; j++) munmap(maps[j], lens[j]);
                free(args);
                free(maps);
                free(lens);
            }
            emu_free(&em);
        } else if (n == 2) {
            CHECK_MSG(0, "%s %s: emulator build: %s", c->name, policy, err);
        }
        char why[256];
        for (int x = 0; x < n && mpt_cuda_nvrtc(why, sizeof why); x++) {
            mpt_cuda_binary bin = {0};
            int cr = mpt_cuda_compile(src[x].source, src[x].name, "sm_90", &bin, err, sizeof err);
            CHECK_MSG(cr == 0, "%s %s: NVRTC: %s", c->name, policy, err);
            CHECK_MSG(cr != 0 || (bin.spill_stores == 0 && bin.spill_loads == 0),
                      "%s: %d bytes spilled", src[x].name, bin.spill_stores);
            n_nvrtc += cr == 0;
            mpt_cuda_binary_free(&bin);
        }
        for (int x = 0; x < n; x++) mpt_cuda_kernel_src_free(&src[x]);
        for (int k = 0; rc == 0 && k < step->n_outputs; k++) mpt_tensor_free(&outs[k]);
    }
    for (int i = 0; vals && i < step->n_nodes; i++) mpt_tensor_free(&vals[i]);
    for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    for (int k = 0; k < nv; k++) mpt_tensor_free(&vars[k]);
    free(vals);
    free(outs);
    free(in);
    free(vars);
    mpt_plan_free(p);
    mpt_graph_free(step);
    mpt_graph_free(r);
    mpt_graph_free(typed);
    mpt_model_free(m);
}

int main(void) {
    static const char *policies[] = {"float32", "mixed_bfloat16", "mixed_float16"};
    /* the CPU kernels alone: every case and policy on the FMA kernels,
     * and on an AMX host the bf16 ones on the tiles (those AMX takes:
     * heads of multiples of 32, causal or no mask, no dropout; the others
     * run the FMA kernels again) */
    mpt_cpu_jit *jit = mpt_cpu_jit_new(MPT_CPU_ISA_HOST, NULL, 0);
    host_amx = jit && mpt_cpu_jit_has_amx(jit);
    for (int c = 0; c < N_CASES + N_WIDE; c++)
        for (int p = 0; p < 3; p++) {
            const model_case *mc = c < N_CASES ? &cases[c] : &wide_cases[c - N_CASES];
            layout = c % 2;
            check_cpu_kernels(mc, policies[p], 0);
            if (host_amx && p == 1) check_cpu_kernels(mc, policies[p], 1);
        }
    if (jit) mpt_cpu_jit_free(jit);
    /* the CUDA kernels of each case under one policy, every dtype in turn
     * (each emulator build is a g++ run of seconds), on the CUDA layout */
    layout = 1;
    for (int c = 0; c < N_CASES; c++) check_cuda(&cases[c], policies[c % 3]);
    printf("CPU attention kernels: %d run with AMX allowed (host AMX: %s)\n", n_amx_kernels, host_amx ? "yes" : "no");
    printf("CUDA attention kernels: %d run on the emulator, %d compiled by NVRTC\n", n_emu_kernels, n_nvrtc);
    return check_exit("test_attention_kernels");
}
