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
 * bf16: TOL_MMA's reason), amx 2 the same loops on vdpbf16ps where the
 * host has AVX512_BF16, amx 0 the FMA kernels. */
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
static int n_amx_kernels, n_dot_kernels;

/* A case's train step, its fused plan, and the interpreter's value of
 * every node of one run of it (inputs from in_seed, variables from
 * var_seed): what each kernel's outputs are checked against */
typedef struct {
    mpt_model *m;
    mpt_graph *typed, *r, *step;
    mpt_plan *p;
    int ni, nv;
    mpt_tensor *in, *vars, *outs, *vals;
    int ran; /* the interpreter ran: vals holds every node */
} captured;

static void capture_open(captured *cx, const model_case *c, const char *policy, unsigned in_seed,
                         unsigned var_seed) {
    memset(cx, 0, sizeof *cx);
    if (!(cx->m = load_src(c->name, c->src, 1))) return;
    mpt_attention_note note;
    if ((cx->typed = typed_of(cx->m, policy))) cx->r = rewrite(cx->typed, NULL, &note);
    if (cx->r) cx->step = train_step(cx->r, cx->m, policy);
    if (!cx->step || !(cx->p = plan_of(cx->step, 1))) return;
    cx->ni = mpt_graph_n_inputs(cx->step);
    cx->nv = mpt_graph_n_variables(cx->step);
    cx->in = calloc((size_t)cx->ni + 1, sizeof *cx->in);
    cx->vars = calloc((size_t)cx->nv + 1, sizeof *cx->vars);
    cx->outs = calloc(64, sizeof *cx->outs);
    cx->vals = calloc((size_t)cx->step->n_nodes, sizeof *cx->vals);
    emu_fill_inputs(cx->step, cx->in, in_seed);
    plant_masks(cx->step, cx->in);
    mpt_init_variables(cx->step, cx->vars, var_seed);
    mpt_interp_opts io = {.on_node = emu_capture, .ctx = cx->vals};
    char err[1024];
    int rc = mpt_interp_run(cx->step, cx->in, cx->vars, cx->outs, &io, err, sizeof err);
    CHECK_MSG(rc == 0, "%s %s: interpreter: %s", c->name, policy, err);
    cx->ran = rc == 0;
}

static void capture_close(captured *cx) {
    for (int k = 0; cx->ran && k < cx->step->n_outputs; k++) mpt_tensor_free(&cx->outs[k]);
    for (int i = 0; cx->vals && i < cx->step->n_nodes; i++) mpt_tensor_free(&cx->vals[i]);
    for (int k = 0; k < cx->ni; k++) mpt_tensor_free(&cx->in[k]);
    for (int k = 0; k < cx->nv; k++) mpt_tensor_free(&cx->vars[k]);
    free(cx->vals);
    free(cx->outs);
    free(cx->in);
    free(cx->vars);
    mpt_plan_free(cx->p);
    mpt_graph_free(cx->step);
    mpt_graph_free(cx->r);
    mpt_graph_free(cx->typed);
    mpt_model_free(cx->m);
}

/* The tolerance of a kernel output against the interpreter's ref: the
 * table's accumulation row of the output's dtype, or (mma: p and ds
 * rounded to bf16 as product operands, whatever the output's dtype)
 * bf16's TOL_MMA row; atol from f32 sums of Tq E-long products (the
 * host's expf within 2 ulps), as test_cuda_emu's, and for a narrow
 * output or an mma kernel at least rtol times ref's largest value */
static tol output_tol(const mpt_graph *g, int out, const mpt_tensor *ref, int mma) {
    double max_ref = 0;
    for (int64_t i = 0; i < mpt_shape_numel(ref->shape); i++) max_ref = fmax(max_ref, fabs(mpt_tensor_get(ref, i)));
    const mpt_node *q = &g->nodes[g->nodes[out].in[0]];
    tol t = mma ? tol_for(TOL_MMA, MPT_DT_BF16, 1) : tol_for(TOL_ACCUM, ref->dtype, 1);
    t.atol = 8 * (double)(q->shape.dim[2] * q->shape.dim[3]) * 0x1p-24 * max_ref;
    if (ref->dtype != MPT_DT_F32 || mma) t.atol = fmax(t.atol, t.rtol * max_ref);
    return t;
}

static void check_cpu_kernels(const model_case *c, const char *policy, int amx) {
    captured cx;
    capture_open(&cx, c, policy, 7, 11);
    mpt_pool *pool = cx.ran ? mpt_pool_new(2) : NULL;
    const mpt_plan *p = cx.p;
    char err[1024];
    for (int k = 0; pool && k < p->n_kernels; k++) {
        const mpt_kernel *K = &p->kernels[k];
        mpt_op op = p->g->nodes[K->root].op;
        if (K->kind != MPT_KERNEL_OPAQUE || (op != MPT_OP_ATTENTION && op != MPT_OP_ATTENTION_GRAD)) continue;
        /* what `mptc asm` reports: AMX for the bf16 cases with heads of 16
         * to 64 (padded to multiples of 32 where that adds at most half the
         * products: heads_32_16, heads_16_64; causal and/or a mask array;
         * with or without dropout), the FMA kernels for the heads of 3-4
         * and every other policy */
        int want = strcmp(policy, "mixed_bfloat16") == 0 && strncmp(c->name, "heads_", 6) == 0;
        int takes = mpt_cpu_attention_amx_takes(p->g, K);
        CHECK_MSG(takes == want, "%s %s: %s: AMX taken %d, want %d", c->name, policy, K->name, takes, want);
        mpt_tensor got[8] = {0};
        kernel_io kio = {K, cx.vals, got};
        for (int j = 0; j < K->n_outputs && j < 8; j++) {
            const mpt_node *nd = &p->g->nodes[K->outputs[j]];
            mpt_tensor_alloc(&got[j], nd->dtype, nd->shape);
            memset(got[j].data, 0xff, mpt_tensor_bytes(&got[j])); /* NaN: unwritten fails */
        }
        int kr = mpt_cpu_run_attention(p->g, K, kernel_data, &kio, amx, pool, err, sizeof err);
        CHECK_MSG(kr == 0, "%s %s: %s: %s", c->name, policy, K->name, err);
        n_amx_kernels += kr == 0 && amx == 1;
        n_dot_kernels += kr == 0 && amx == 2;
        for (int j = 0; kr == 0 && j < K->n_outputs && j < 8; j++) {
            char what[200];
            snprintf(what, sizeof what, "%s %s CPU%s %s output %%%d", c->name, policy,
                     amx == 2 ? " (vdpbf16ps)" : amx ? " (amx)" : "",
                     K->name, K->outputs[j]);
            const mpt_tensor *ref = &cx.vals[K->outputs[j]];
            compare(&got[j], ref, output_tol(p->g, K->outputs[j], ref, amx), what);
        }
        for (int j = 0; j < K->n_outputs && j < 8; j++) mpt_tensor_free(&got[j]);
    }
    if (pool) mpt_pool_free(pool);
    capture_close(&cx);
}

/* ---- (g) the CUDA kernels on the host emulator ---- */

static int n_emu_kernels, n_nvrtc;

static void check_cuda(const model_case *c, const char *policy) {
    captured cx;
    capture_open(&cx, c, policy, 5, 9);
    const mpt_plan *p = cx.p;
    const mpt_graph *step = cx.step;
    const mpt_tensor *vals = cx.vals;
    char err[2048];
    if (cx.ran) {
        mpt_cuda_kernel_src src[2];
        int n = 0;
        for (int k = 0; k < p->n_kernels && n < 2; k++) {
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
                    tol t = output_tol(step, ksrc->params[j], ref, 0);
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
    }
    capture_close(&cx);
}

int main(void) {
    static const char *policies[] = {"float32", "mixed_bfloat16", "mixed_float16"};
    /* the CPU kernels alone: every case and policy on the FMA kernels,
     * and on an AMX host the bf16 ones on the tiles (those AMX takes:
     * heads of multiples of 32, causal or no mask, no dropout; the others
     * run the FMA kernels again) */
    mpt_cpu_jit *jit = mpt_cpu_jit_new(MPT_CPU_ISA_HOST, NULL, 0);
    host_amx = jit && mpt_cpu_jit_has_amx(jit);
    int host_dot = jit && mpt_cpu_jit_has_bf16_dot(jit) && mpt_cpu_jit_vector_lanes(jit) == 16;
    for (int c = 0; c < N_CASES + N_WIDE; c++)
        for (int p = 0; p < 3; p++) {
            const model_case *mc = c < N_CASES ? &cases[c] : &wide_cases[c - N_CASES];
            layout = c % 2;
            check_cpu_kernels(mc, policies[p], 0);
            if (host_amx && p == 1) check_cpu_kernels(mc, policies[p], 1);
            /* the same loops with their products on vdpbf16ps (where it
             * outruns f32 FMAs and there is no AMX), on any AVX512_BF16 host */
            if (host_dot && p == 1) check_cpu_kernels(mc, policies[p], 2);
        }
    if (jit) mpt_cpu_jit_free(jit);
    /* the CUDA kernels of each case under one policy, every dtype in turn
     * (each emulator build is a g++ run of seconds), on the CUDA layout */
    layout = 1;
    for (int c = 0; c < N_CASES; c++) check_cuda(&cases[c], policies[c % 3]);
    printf("CPU attention kernels: %d run with AMX allowed (host AMX: %s), %d with vdpbf16ps\n", n_amx_kernels,
           host_amx ? "yes" : "no", n_dot_kernels);
    printf("CUDA attention kernels: %d run on the emulator, %d compiled by NVRTC\n", n_emu_kernels, n_nvrtc);
    return check_exit("test_attention_kernels");
}
