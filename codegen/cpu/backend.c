/* codegen/cpu/backend.c — the CPU backend: compiles a kernel plan once into
 * one LLVM module (every LOOP/REDUCTION kernel and every GEMM/CONV prologue
 * and epilogue loop is a function of it; GEMM cores are the shared kernels
 * of codegen/cpu/gemm.c), allocates the memory plan's arena once, and runs
 * the kernels in order each step, splitting the large ones over the pool.
 *
 * Buffers: arena 0 of the plan is one allocation with the plan's offsets;
 * inputs and variables are read straight from the caller's tensors (no
 * copy in), updates are copied back after every kernel has run, outputs are
 * copied into fresh tensors. GEMM/CONV scratch (materialised prologue casts,
 * im2col columns, a product the epilogue loop reads) lives in one area
 * shared by all kernels, since kernels run one after another.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "codegen/cpu/emit.h"

struct mpt_exec {
    const mpt_plan *p;
    mpt_cpu_jit *jit;
    mpt_pool *pool;
    char *arena, *scratch;
    void **node_ptr;  /* per node: its buffer (arena 0) or the caller's tensor */
    int *feed;        /* per node: k of the k-th INPUT/VARIABLE */
    int *inplace;     /* per update: 1 when its value is computed straight into the variable */
    mpt_cpu_kx *kx;
    int n_kx;
    mpt_cpu_cc cc;
    char *ir_text, *asm_text;
    /* --profile: seconds per kernel over prof_steps steps, printed at free */
    FILE *prof_out;
    double *prof_s, *prof_core; /* the whole kernel; its GEMM/conv core */
    double prof_io;             /* the rest of the step: feeds, outputs, updates */
    int prof_steps;
    int flush_denormals;        /* MPTC_DENORMALS: flush (default) or keep */
    mpt_cpu_sums *sums; /* data parallelism: the plan's ALLREDUCE buckets, or NULL */
};

static FILE *profile_out;

void mpt_cpu_profile(FILE *out) { profile_out = out; }

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *alloc64(int64_t bytes) {
    size_t b = (size_t)(bytes > 0 ? bytes : 64);
    return aligned_alloc(64, (b + 63) / 64 * 64);
}

int mpt_cpu_kx_slot(mpt_cpu_kx *x, int node, int64_t scratch_bytes) {
    for (int s = 0; s < x->n_slots; s++)
        if (x->slot_node[s] == node) return s;
    if (x->n_slots == x->cap_slots) {
        int cap = x->cap_slots ? 2 * x->cap_slots : 16;
        int *sn = realloc(x->slot_node, (size_t)cap * sizeof *sn);
        if (!sn) return -1;
        x->slot_node = sn;
        int64_t *ss = realloc(x->slot_scratch, (size_t)cap * sizeof *ss);
        if (!ss) return -1;
        x->slot_scratch = ss;
        x->cap_slots = cap;
    }
    int s = x->n_slots++;
    x->slot_node[s] = node;
    x->slot_scratch[s] = -1;
    if (scratch_bytes > 0) {
        x->slot_scratch[s] = x->scratch_bytes;
        x->scratch_bytes += (scratch_bytes + 63) / 64 * 64;
    }
    return s;
}

mpt_cpu_gemm *mpt_cpu_cc_gemm(mpt_cpu_cc *cc, const mpt_cpu_gemm_desc *desc, char *err, size_t n) {
    mpt_cpu_gemm_desc dd = *desc, *d = &dd;
    dd.flush_denormals = cc->flush_denormals;
    for (int i = 0; i < cc->n_gemms; i++)
        if (!memcmp(&cc->descs[i], d, sizeof *d)) return cc->gemms[i];
    mpt_cpu_gemm_desc *nd = realloc(cc->descs, (size_t)(cc->n_gemms + 1) * sizeof *nd);
    if (nd) cc->descs = nd;
    mpt_cpu_gemm **ng = realloc(cc->gemms, (size_t)(cc->n_gemms + 1) * sizeof *ng);
    if (ng) cc->gemms = ng;
    if (!nd || !ng) {
        snprintf(err, n, "out of memory");
        return NULL;
    }
    mpt_cpu_gemm *g = mpt_cpu_gemm_compile(cc->jit, d, err, n);
    if (!g) return NULL;
    cc->descs[cc->n_gemms] = *d;
    cc->gemms[cc->n_gemms++] = g;
    return g;
}

int mpt_cpu_gen(mpt_cpu_cc *cc, mpt_cpu_kx *x, int reduction, const int *targets, int n_targets,
                char *err, size_t n) {
    const mpt_graph *g = cc->p->g;
    int ki = (int)(x->k - cc->p->kernels);
    if (x->n_fns == MPT_CPU_MAX_FNS) {
        snprintf(err, n, "kernel %s: too many generated functions", x->k->name);
        return -1;
    }
    for (int i = 0; i < g->n_nodes; i++) cc->slot_of[i] = -1;
    for (int s = 0; s < x->n_slots; s++)
        if (x->slot_node[s] >= 0) cc->slot_of[x->slot_node[s]] = s;
    char name[64];
    snprintf(name, sizeof name, "mpt_k%d_%d", ki, x->n_fns);
    mpt_ce e;
    mpt_ce_begin(&e, cc->jit, cc->m, g, x->k, cc->in_fn, cc->slot_of, x->n_slots, name);
    e.red_stage = reduction ? cc->red_stage : -1;
    e.cvt_bf16 = cc->flush_denormals && mpt_cpu_jit_has_bf16_dot(cc->jit);
    e.red_slot = -1;
    if (!reduction) {
        e.and_targets = cc->and_targets;
        e.n_and = cc->n_and;
    }
    for (int s = 0; s < x->n_slots; s++)
        if (x->slot_node[s] == MPT_CPU_RED_SCRATCH) e.red_slot = s;
    mpt_cpu_fn *f = &x->fns[x->n_fns];
    memset(f, 0, sizeof *f);
    if (!e.err) {
        if (reduction) mpt_ce_emit_reduction(&e, f);
        else mpt_ce_emit_loop(&e, targets, n_targets, f);
    }
    const char *why = e.err;
    int at = e.err_node;
    mpt_ce_end(&e);
    if (why) {
        snprintf(err, n, "kernel %s: %s (%%%d = %s %s) (hint: run with --device interp, and report "
                 "the model)", x->k->name, why, at, at >= 0 ? mpt_op_name(g->nodes[at].op) : "?",
                 at >= 0 ? mpt_dtype_name(g->nodes[at].dtype) : "?");
        return -1;
    }
    snprintf(f->name, sizeof f->name, "%s", name);
    x->n_fns++;
    return 0;
}

static int plan_kernel(mpt_cpu_cc *cc, mpt_cpu_kx *x, char *err, size_t n) {
    const mpt_graph *g = cc->p->g;
    const mpt_kernel *k = x->k;
    for (int i = 0; i < MPT_CPU_EPI_MAX; i++) x->epi_slot[i] = x->epi_node[i] = -1;
    switch (k->kind) {
    case MPT_KERNEL_GEMM: return mpt_cpu_plan_gemm(cc, x, err, n);
    case MPT_KERNEL_CONV: return mpt_cpu_plan_conv(cc, x, err, n);
    case MPT_KERNEL_LOOP: case MPT_KERNEL_REDUCTION: case MPT_KERNEL_OPAQUE:
        for (int i = 0; i < k->n_inputs; i++)
            if (g->nodes[k->inputs[i]].op != MPT_OP_CONST && mpt_cpu_kx_slot(x, k->inputs[i], 0) < 0)
                goto oom;
        for (int i = 0; i < k->n_outputs; i++)
            if (mpt_cpu_kx_slot(x, k->outputs[i], 0) < 0) goto oom;
        if (k->kind == MPT_KERNEL_OPAQUE) {
            /* attention's bf16 heads where the GEMMs' bf16 products run:
             * on the tiles, or on vdpbf16ps where it runs at 1.6x the f32
             * FMAs' rate or more (the tiles' loops pay layouts and a pass
             * through memory that the FMA kernels do not: about break-even
             * at 1.25x, the GEMMs' margin; docs/DECISIONS.md), unless told
             * not (MPT_CPU_NO_AMX_ATTENTION: the FMA kernels, to compare) */
            double dot_ratio = 0;
            int dot = mpt_cpu_jit_vector_lanes(cc->jit) == 16 && mpt_cpu_bf16_dot_pays(cc->jit, &dot_ratio) &&
                      (dot_ratio < 0 || dot_ratio >= 1.6); /* < 0: MPT_CPU_BF16_DOT=1 forces it */
            x->amx = getenv("MPT_CPU_NO_AMX_ATTENTION") ? 0 : mpt_cpu_jit_has_amx(cc->jit) ? 1 : dot ? 2 : 0;
            mpt_op op = g->nodes[k->root].op;
            if (op == MPT_OP_ATTENTION || op == MPT_OP_ATTENTION_LSE || op == MPT_OP_ATTENTION_GRAD)
                snprintf(x->core, sizeof x->core, "%s",
                         !x->amx || !mpt_cpu_attention_amx_takes(g, k)
                             ? "FlashAttention on f32 FMA register tiles (attention.c, attention_grad.c)"
                         : x->amx == 1
                             ? "FlashAttention on AMX tiles (attention_amx.c: tdpbf16ps, p and ds rounded to bf16)"
                             : "FlashAttention on vdpbf16ps pairs (attention_amx.c's loops, p and ds rounded to bf16)");
            return 0;
        }
        memset(cc->in_fn, 0, (size_t)g->n_nodes);
        for (int i = 0; i < k->n_nodes; i++) cc->in_fn[k->nodes[i]] = 1;
        if (k->kind == MPT_KERNEL_REDUCTION) {
            int64_t bytes = 0;
            int stages = mpt_ce_reduction_stages(cc->jit, g, k, cc->in_fn, &bytes);
            if (stages > 0 && mpt_cpu_kx_slot(x, MPT_CPU_RED_SCRATCH, bytes) < 0) goto oom;
            int rc = 0;
            for (int s = 0; s < (stages > 0 ? stages : 1) && !rc; s++) {
                cc->red_stage = stages > 0 ? s : -1;
                rc = mpt_cpu_gen(cc, x, 1, k->outputs, k->n_outputs, err, n);
            }
            cc->red_stage = -1;
            return rc;
        }
        return mpt_cpu_gen(cc, x, 0, k->outputs, k->n_outputs, err, n);
    case MPT_KERNEL_COUNT: break;
    }
    snprintf(err, n, "kernel %s: unknown kind", k->name);
    return -1;
oom:
    snprintf(err, n, "out of memory");
    return -1;
}

/* ---- profile ---- */

/* One row per kernel in execution order (GEMM/conv: GFLOP/s of the core's
 * 2MNK; the rest: GB/s over the bytes its inputs and outputs hold), then
 * the time per layer, largest first. */
static void profile_report(const mpt_exec *e) {
    FILE *f = e->prof_out;
    const mpt_graph *g = e->p->g;
    double total = 0;
    for (int k = 0; k < e->n_kx; k++) total += e->prof_s[k];
    double steps = e->prof_steps;
    int in_place = 0;
    for (int i = 0; i < g->n_updates; i++) in_place += e->inplace[i];
    fprintf(f, "cpu profile of %s: %d kernels, %d step%s after the first, %.2f ms/step in kernels, "
            "%.2f ms/step feeding and writing back (%d of %d updates computed in place)\n",
            g->name ? g->name : "plan", e->n_kx, e->prof_steps, e->prof_steps == 1 ? "" : "s",
            1e3 * total / steps, 1e3 * e->prof_io / steps, in_place, g->n_updates);
    const mpt_cpu_ceilings *c = mpt_cpu_ceilings_measure(e->jit, e->pool);
    fprintf(f, "ceilings on %d thread%s: f32 %.0f GFLOP/s (%s), bf16 %.0f GFLOP/s (%s), "
            "memory %.1f GB/s (%s)\n", c->threads, c->threads == 1 ? "" : "s", c->f32_gflops,
            c->f32_how ? c->f32_how : "not measured", c->bf16_gflops,
            c->bf16_how ? c->bf16_how : "not measured", c->gbps, c->mem_how ? c->mem_how : "not measured");
    fprintf(f, "  k  kind       ms/step     %%  core ms   core rate    of ceiling  layer            kernel\n");
    const char **layers = calloc((size_t)e->n_kx + 1, sizeof *layers);
    double *layer_s = calloc((size_t)e->n_kx + 1, sizeof *layer_s);
    int n_layers = 0;
    for (int k = 0; k < e->n_kx; k++) {
        const mpt_cpu_kx *x = &e->kx[k];
        double s = e->prof_s[k] / steps, co = e->prof_core[k] / steps;
        char rate[32];
        double achieved, ceiling;
        if (x->k->kind == MPT_KERNEL_GEMM || x->k->kind == MPT_KERNEL_CONV) {
            achieved = 2.0 * (double)x->M * (double)x->N * (double)x->K / co * 1e-9;
            /* a convolution's useful products: those of taps inside the
             * image (its GEMM's 2MNK counts the padding's too, which the
             * gathered kernels skip: convnet64's conv_3 read 115-120%) */
            if (x->k->kind == MPT_KERNEL_CONV)
                achieved *= mpt_cpu_conv_inside(x->geom);
            /* bf16 operands run at the bf16 ceiling; f16 widens to f32 FMAs */
            const mpt_node *root = &g->nodes[x->k->root];
            int bf16 = root->n_in > 0 && g->nodes[root->in[0]].dtype == MPT_DT_BF16;
            ceiling = bf16 ? c->bf16_gflops : c->f32_gflops;
            snprintf(rate, sizeof rate, "%7.3f %6.1f GF/s", 1e3 * co, achieved);
        } else if (x->k->kind == MPT_KERNEL_OPAQUE &&
                   g->nodes[x->k->root].op == MPT_OP_BATCH_MATMUL) {
            /* a plain f32 loop (batch_matmul.c), against the FMA ceiling:
             * 2 x batch x M x N x K flops, K the contracted dim */
            const mpt_node *root = &g->nodes[x->k->root], *a = &g->nodes[root->in[0]];
            int r = a->shape.rank;
            double kdim = (double)a->shape.dim[root->attr.i[0] ? r - 2 : r - 1];
            achieved = 2.0 * (double)mpt_shape_numel(root->shape) * kdim / s * 1e-9;
            ceiling = c->f32_gflops;
            snprintf(rate, sizeof rate, "%7.3f %6.1f GF/s", 1e3 * s, achieved);
        } else {
            achieved = (double)mpt_kernel_bytes(g, x->k) / s * 1e-9;
            ceiling = c->gbps;
            snprintf(rate, sizeof rate, "      - %6.1f GB/s", achieved);
        }
        const char *layer = mpt_kernel_layer(g, x->k);
        fprintf(f, "%3d  %-9s %8.3f %5.1f  %s %7.1f%%  %-16s %s\n", k,
                mpt_kernel_kind_name(x->k->kind), 1e3 * s, 100.0 * e->prof_s[k] / total, rate,
                ceiling > 0 ? 100.0 * achieved / ceiling : 0.0, layer, x->k->name);
        if (!layers || !layer_s) continue;
        int l = 0;
        while (l < n_layers && strcmp(layers[l], layer)) l++;
        if (l == n_layers) layers[n_layers++] = layer;
        layer_s[l] += e->prof_s[k];
    }
    double comm = 0;
    int n_comm = 0;
    for (int k = 0; k < e->n_kx; k++)
        if (e->kx[k].k->kind == MPT_KERNEL_OPAQUE && g->nodes[e->kx[k].k->root].op == MPT_OP_ALLREDUCE)
            comm += e->prof_s[k], n_comm++;
    if (n_comm)
        fprintf(f, "communication: %d allreduce kernels, %.3f ms/step, %.1f%% of the kernels' time "
                "(the wait for the slowest rank included)\n", n_comm, 1e3 * comm / steps,
                total > 0 ? 100.0 * comm / total : 0.0);
    fprintf(f, "per layer:\n");
    for (int done = 0; done < n_layers; done++) {
        int best = -1;
        for (int l = 0; l < n_layers; l++)
            if (layer_s[l] >= 0 && (best < 0 || layer_s[l] > layer_s[best])) best = l;
        fprintf(f, "  %-16s %8.3f ms/step %5.1f%%\n", layers[best], 1e3 * layer_s[best] / steps,
                100.0 * layer_s[best] / total);
        layer_s[best] = -1;
    }
    free(layers);
    free(layer_s);
}

static void exec_free(mpt_exec *e) {
    if (!e) return;
    if (e->prof_out && e->prof_s && e->prof_steps > 0) profile_report(e);
    free(e->prof_s);
    free(e->prof_core);
    for (int i = 0; i < e->n_kx; i++) {
        free(e->kx[i].g_row);
        free(e->kx[i].g_col);
        free(e->kx[i].g_krange);
        free(e->kx[i].g_perm);
        free(e->kx[i].g_crow);
        free(e->kx[i].slot_node);
        free(e->kx[i].slot_scratch);
        free(e->kx[i].slots);
    }
    free(e->kx);
    for (int i = 0; i < e->cc.n_gemms; i++) mpt_cpu_gemm_free(e->cc.gemms[i]);
    free(e->cc.gemms);
    free(e->cc.descs);
    free(e->cc.slot_of);
    free(e->cc.in_fn);
    mpt_cpu_jit_free(e->jit);
    mpt_pool_free(e->pool);
    free(e->arena);
    free(e->scratch);
    mpt_cpu_opaque_release();
    free(e->node_ptr);
    free(e->feed);
    free(e->inplace);
    mpt_cpu_sums_free(e->sums);
    free(e->ir_text);
    free(e->asm_text);
    free(e);
}

static mpt_cpu_jit *backend_jit(char *err, size_t n);

static mpt_exec *compile_plan(const mpt_plan *p, int keep_text, char *err, size_t n) {
    double t0 = now_seconds();
    const mpt_graph *g = p->g;
    mpt_exec *e = calloc(1, sizeof *e);
    size_t nn = (size_t)g->n_nodes + 1;
    if (!e) goto oom;
    e->p = p;
    e->node_ptr = calloc(nn, sizeof *e->node_ptr);
    e->feed = calloc(nn, sizeof *e->feed);
    e->kx = calloc((size_t)p->n_kernels + 1, sizeof *e->kx);
    e->cc.slot_of = malloc(nn * sizeof(int));
    e->cc.in_fn = calloc(nn, 1);
    e->arena = alloc64(p->peak_bytes);
    e->inplace = calloc((size_t)g->n_updates + 1, sizeof *e->inplace);
    if (!e->inplace || !e->node_ptr || !e->feed || !e->kx || !e->cc.slot_of || !e->cc.in_fn || !e->arena) goto oom;
    for (int i = 0, ni = 0, nv = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].op == MPT_OP_INPUT) e->feed[i] = ni++;
        if (g->nodes[i].op == MPT_OP_VARIABLE) e->feed[i] = nv++;
    }
    for (int b = 0; b < p->n_buffers; b++)
        if (p->buffers[b].arena == 0) e->node_ptr[p->buffers[b].node] = e->arena + p->buffers[b].offset;
    for (int i = 0; i < g->n_updates; i++) e->inplace[i] = mpt_plan_update_in_place(p, i);
    if (!(e->jit = backend_jit(err, n))) goto fail;
    e->pool = mpt_pool_new(mpt_backend_cpu.threads);
    const char *dn = getenv("MPTC_DENORMALS");
    e->flush_denormals = !(dn && !strcmp(dn, "keep"));
    if (profile_out) {
        e->prof_out = profile_out;
        e->prof_s = calloc((size_t)p->n_kernels + 1, sizeof *e->prof_s);
        e->prof_core = calloc((size_t)p->n_kernels + 1, sizeof *e->prof_core);
        if (!e->prof_s || !e->prof_core) goto oom;
        e->prof_steps = -1;
    }
    e->cc.jit = e->jit;
    e->cc.red_stage = -1;
    e->cc.p = p;
    e->cc.keep_text = keep_text;
    e->cc.flush_denormals = e->flush_denormals;
    e->cc.m = mpt_cpu_jit_module_new(e->jit, g->name ? g->name : "plan");
    int64_t scratch = 0;
    int any_fn = 0;
    for (int k = 0; k < p->n_kernels; k++) {
        mpt_cpu_kx *x = &e->kx[e->n_kx++];
        x->k = &p->kernels[k];
        if (plan_kernel(&e->cc, x, err, n)) goto fail;
        if (x->scratch_bytes > scratch) scratch = x->scratch_bytes;
        any_fn |= x->n_fns > 0;
    }
    LLVMModuleRef m = e->cc.m;
    e->cc.m = NULL;
    if (any_fn) {
        if (mpt_cpu_jit_add_module(e->jit, m, keep_text ? &e->ir_text : NULL,
                                   keep_text ? &e->asm_text : NULL, err, n))
            goto fail;
    } else {
        LLVMDisposeModule(m);
    }
    if (!(e->scratch = alloc64(scratch))) goto oom;
    for (int k = 0; k < e->n_kx; k++) {
        mpt_cpu_kx *x = &e->kx[k];
        for (int f = 0; f < x->n_fns; f++) {
            void *addr = mpt_cpu_jit_lookup(e->jit, x->fns[f].name, err, n);
            if (!addr) goto fail;
            x->fns[f].fn = (void (*)(void **, int64_t, int64_t))addr;
        }
        if (!(x->slots = calloc((size_t)x->n_slots + 1, sizeof *x->slots))) goto oom;
        for (int s = 0; s < x->n_slots; s++)
            if (x->slot_scratch[s] >= 0) x->slots[s] = e->scratch + x->slot_scratch[s];
    }
    if (mpt_cpu_sums_new(p, mpt_backend_cpu.bucket_bytes == 0 ? MPT_BUCKET_BYTES_DEFAULT
                                                              : mpt_backend_cpu.bucket_bytes,
                         &e->sums))
        goto oom;
    mpt_backend_cpu.compile_seconds = now_seconds() - t0;
    return e;
oom:
    snprintf(err, n, "out of memory compiling plan %s for the CPU", g->name);
fail:
    if (e && e->cc.m) LLVMDisposeModule(e->cc.m);
    exec_free(e);
    return NULL;
}

/* ---- running ---- */

typedef struct {
    const mpt_cpu_fn *f;
    void **slots;
    int n_tasks;
    int64_t units; /* grains */
} par_ctx;

static void par_task(void *vctx, int task, int thread) {
    par_ctx *c = vctx;
    int64_t g0 = c->units * task / c->n_tasks, g1 = c->units * (task + 1) / c->n_tasks;
    int64_t lo = g0 * c->f->grain, hi = g1 * c->f->grain;
    if (hi > c->f->total) hi = c->f->total;
    if (lo < hi) c->f->fn(c->slots, lo, hi);
}

/* Below this many elements a kernel runs on the calling thread: waking the
 * pool costs more than the work. */
enum { PAR_MIN_WORK = 1 << 15 };

static void call_fn(mpt_pool *pool, const mpt_cpu_fn *f, void **slots) {
    int threads = mpt_pool_threads(pool);
    int64_t units = (f->total + f->grain - 1) / f->grain;
    if (threads <= 1 || f->work < PAR_MIN_WORK || units < 2) {
        f->fn(slots, 0, f->total);
        return;
    }
    par_ctx c = {f, slots, (int)(units < 4 * threads ? units : 4 * threads), units};
    mpt_pool_run(pool, c.n_tasks, par_task, &c);
}

static int check_feed(const mpt_node *nd, const mpt_tensor *t, char *err, size_t n) {
    char want[96], got[96];
    const char *what = nd->op == MPT_OP_INPUT ? "input" : "variable";
    mpt_shape_str(nd->shape, want, sizeof want);
    if (!t || !t->data) {
        snprintf(err, n, "%s \"%s\" was not given a tensor (hint: pass one %s%s)", what, nd->name,
                 mpt_dtype_name(nd->dtype), want);
        return -1;
    }
    if (t->dtype != nd->dtype || !mpt_shape_eq(t->shape, nd->shape)) {
        mpt_shape_str(t->shape, got, sizeof got);
        snprintf(err, n, "%s \"%s\": fed %s%s but the graph expects %s%s (hint: convert the data "
                 "to the graph's dtype and shape)", what, nd->name, mpt_dtype_name(t->dtype), got,
                 mpt_dtype_name(nd->dtype), want);
        return -1;
    }
    return 0;
}

/* value of node id after the step into t (allocated) */
static int fetch(mpt_exec *e, int id, mpt_tensor *t) {
    const mpt_node *nd = &e->p->g->nodes[id];
    if (mpt_tensor_alloc(t, nd->dtype, nd->shape)) return -1;
    if (e->node_ptr[id]) {
        memcpy(t->data, e->node_ptr[id], mpt_tensor_bytes(t));
    } else {
        for (int64_t i = 0; i < mpt_shape_numel(nd->shape); i++) mpt_tensor_set(t, i, nd->attr.f);
    }
    return 0;
}

/* Runs the step's kernels in order, timing them where profiling. */
static int run_kernels(mpt_exec *e, double *t_kernels, char *err, size_t n) {
    const mpt_graph *g = e->p->g;
    for (int k = 0; k < e->n_kx; k++) {
        mpt_cpu_kx *x = &e->kx[k];
        double *prof = e->prof_s && e->prof_steps >= 0 ? e->prof_s : NULL;
        if (e->sums && mpt_cpu_sums_before(e->sums, g, e->kx, k, prof, err, n)) return -1;
        double t0 = e->prof_s ? now_seconds() : 0;
        if (mpt_cpu_sums_member(e->sums, k)) {
            if (mpt_cpu_sums_run(e->sums, g, e->kx, k, err, n)) return -1;
        } else if (x->k->kind == MPT_KERNEL_OPAQUE) {
            if (mpt_cpu_run_opaque(g, x, e->pool, err, n)) return -1;
        } else {
            for (int f = 0; f < x->n_pre; f++) call_fn(e->pool, &x->fns[f], x->slots);
            double t1 = e->prof_s ? now_seconds() : 0;
            if ((x->k->kind == MPT_KERNEL_GEMM || x->k->kind == MPT_KERNEL_CONV) &&
                mpt_cpu_run_core(g, x, e->pool, err, n))
                return -1;
            if (e->prof_s && e->prof_steps >= 0) e->prof_core[k] += now_seconds() - t1;
            for (int a = 0; a < x->n_and; a++) memset(x->slots[x->and_slot[a]], 1, (size_t)x->and_bytes[a]);
            for (int f = x->n_pre; f < x->n_fns; f++) call_fn(e->pool, &x->fns[f], x->slots);
        }
        if (e->prof_s && e->prof_steps >= 0) {
            e->prof_s[k] += now_seconds() - t0;
            *t_kernels += now_seconds() - t0;
        }
        if (e->sums && mpt_cpu_sums_progress(e->sums, err, n)) return -1;
    }
    double *prof = e->prof_s && e->prof_steps >= 0 ? e->prof_s : NULL;
    return e->sums ? mpt_cpu_sums_before(e->sums, g, e->kx, e->n_kx, prof, err, n) : 0;
}

static int cpu_run(mpt_exec *e, const mpt_tensor *inputs, mpt_tensor *vars, mpt_tensor *outputs,
                   char *err, size_t n) {
    const mpt_graph *g = e->p->g;
    double t_run = e->prof_s ? now_seconds() : 0, t_kernels = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const mpt_node *nd = &g->nodes[i];
        if (nd->op != MPT_OP_INPUT && nd->op != MPT_OP_VARIABLE) continue;
        const mpt_tensor *t = nd->op == MPT_OP_INPUT ? (inputs ? &inputs[e->feed[i]] : NULL)
                                                     : (vars ? &vars[e->feed[i]] : NULL);
        if (check_feed(nd, t, err, n)) return -1;
        e->node_ptr[i] = t->data;
    }
    for (int i = 0; i < g->n_updates; i++)
        if (e->inplace[i]) e->node_ptr[g->updates[i].value] = e->node_ptr[g->updates[i].var];
    /* a view reads its root's buffer: a feed, a variable or arena 0 */
    for (int i = 0; i < g->n_nodes; i++)
        if (mpt_plan_storage(e->p, i) != i) e->node_ptr[i] = e->node_ptr[mpt_plan_storage(e->p, i)];
    for (int k = 0; k < e->n_kx; k++) {
        mpt_cpu_kx *x = &e->kx[k];
        for (int s = 0; s < x->n_slots; s++)
            if (x->slot_scratch[s] < 0 && x->slot_node[s] >= 0) x->slots[s] = e->node_ptr[x->slot_node[s]];
    }
    /* denormals flushed, as TensorFlow's and XLA's CPU kernels run: a
     * softmax that saturates gives probabilities near 1e-40, and each FMA
     * on one takes a microcode assist (ResNet-50 f32's classifier GEMMs
     * 21.5 -> 5.3 ms a step). MPTC_DENORMALS=keep keeps them. */
    unsigned csr = mpt_cpu_denormals_begin(e->flush_denormals);
    int krc = run_kernels(e, &t_kernels, err, n);
    mpt_cpu_denormals_end(csr);
    if (krc) return -1;
    /* the first step (page faults, cold caches) is left out */
    if (e->prof_s) e->prof_steps++;
    for (int i = 0; i < g->n_outputs; i++)
        if (fetch(e, g->outputs[i].node, &outputs[i])) {
            for (int j = 0; j < i; j++) mpt_tensor_free(&outputs[j]);
            snprintf(err, n, "out of memory for output %s", g->outputs[i].name);
            return -1;
        }
    /* an update whose value is another variable reads it before any lands */
    mpt_tensor *held = calloc((size_t)g->n_updates + 1, sizeof *held);
    int rc = held ? 0 : -1;
    for (int i = 0; i < g->n_updates && !rc; i++) {
        int v = g->updates[i].value;
        if (g->nodes[v].op == MPT_OP_VARIABLE || !e->node_ptr[v]) rc = fetch(e, v, &held[i]);
    }
    for (int i = 0; i < g->n_updates && !rc; i++) {
        mpt_tensor *dst = &vars[e->feed[g->updates[i].var]];
        const void *src = held[i].data ? held[i].data : e->node_ptr[g->updates[i].value];
        if (src != dst->data) memcpy(dst->data, src, mpt_tensor_bytes(dst));
    }
    for (int i = 0; held && i < g->n_updates; i++) mpt_tensor_free(&held[i]);
    free(held);
    if (rc) snprintf(err, n, "out of memory writing the updates");
    if (e->prof_s && e->prof_steps > 0) e->prof_io += now_seconds() - t_run - t_kernels;
    return rc;
}

/* ---- the backend ---- */

/* The ISA the backend compiles for: the host's, or a smaller one named by
 * MPTC_CPU_ISA (avx512, avx2, sse), to run what a smaller CPU would on
 * this one. -1 (with a message) for a name it does not know. */
static int backend_isa(char *err, size_t n) {
    const char *env = getenv("MPTC_CPU_ISA");
    if (!env || !*env || !strcmp(env, "host")) return MPT_CPU_ISA_HOST;
    static const mpt_cpu_isa isas[] = {MPT_CPU_ISA_AVX512, MPT_CPU_ISA_AVX2, MPT_CPU_ISA_SSE};
    for (int i = 0; i < 3; i++)
        if (!strcmp(env, mpt_cpu_isa_name(isas[i]))) return isas[i];
    snprintf(err, n, "MPTC_CPU_ISA=%s is not an ISA the CPU backend compiles for (hint: host, "
             "avx512, avx2 or sse)", env);
    return -1;
}

static mpt_cpu_jit *backend_jit(char *err, size_t n) {
    int isa = backend_isa(err, n);
    return isa < 0 ? NULL : mpt_cpu_jit_new((mpt_cpu_isa)isa, err, n);
}

const char *mpt_cpu_bf16_multiplier(double *ratio) {
    char err[256];
    mpt_cpu_jit *j = backend_jit(err, sizeof err);
    if (!j) return NULL;
    double r = 0;
    const char *how = mpt_cpu_jit_has_amx(j)                 ? "AMX tiles"
                      : mpt_cpu_bf16_dot_pays(j, &r)         ? "vdpbf16ps"
                                                             : "f32 FMAs";
    mpt_cpu_jit_free(j);
    if (ratio) *ratio = r > 0 ? r : 0;
    return how;
}

static int cpu_available(char *why, size_t n) {
    mpt_cpu_jit *j = backend_jit(why, n);
    if (!j) return 0;
    mpt_cpu_jit_free(j);
    return 1;
}

static mpt_exec *cpu_compile(const mpt_plan *plan, char *err, size_t n) {
    return compile_plan(plan, 0, err, n);
}

mpt_backend mpt_backend_cpu = {
    .name = "cpu",
    .available = cpu_available,
    .compile = cpu_compile,
    .run = cpu_run,
    .free = exec_free,
};

/* ---- mptc asm ---- */

/* The text of function `name` in a module's IR ("define ... @name(" to its
 * closing brace) or assembly (".type name" to ".size name"). */
static void write_function(FILE *f, const char *text, const char *name, int ir) {
    char key[128];
    if (!text) return;
    snprintf(key, sizeof key, ir ? "@%s(" : "\t.type\t%s,", name);
    const char *at = strstr(text, key);
    if (!at) return;
    const char *start = at;
    while (start > text && start[-1] != '\n') start--;
    const char *end;
    if (ir) {
        end = strstr(at, "\n}\n");
        end = end ? end + 3 : at + strlen(at);
    } else {
        snprintf(key, sizeof key, "\t.size\t%s,", name);
        end = strstr(at, key);
        end = end ? strchr(end, '\n') : NULL;
        end = end ? end + 1 : at + strlen(at);
    }
    fwrite(start, 1, (size_t)(end - start), f);
    fputc('\n', f);
}

int mpt_cpu_emit_plan(const mpt_plan *p, const char *emit, const char *outdir, FILE *report,
                      char *err, size_t n) {
    int ir = strcmp(emit, "llvm") == 0;
    if (!ir && strcmp(emit, "asm") != 0) {
        snprintf(err, n, "unknown --emit '%s' (hint: llvm or asm)", emit);
        return -1;
    }
    char path[1200];
    snprintf(path, sizeof path, "%s", outdir);
    for (char *c = path + 1; *c; c++)
        if (*c == '/') {
            *c = 0;
            mkdir(path, 0755);
            *c = '/';
        }
    if (mkdir(path, 0755) && errno != EEXIST) {
        snprintf(err, n, "cannot create %s: %s (hint: pick another -o)", outdir, strerror(errno));
        return -1;
    }
    mpt_exec *e = compile_plan(p, 1, err, n);
    if (!e) return -1;
    const char *cm = ir ? ";" : "#";
    int rc = 0;
    for (int k = 0; k < e->n_kx && !rc; k++) {
        const mpt_cpu_kx *x = &e->kx[k];
        const mpt_kernel *K = x->k;
        char name[128];
        int o = snprintf(name, sizeof name, "k%02d_", k);
        for (const char *c = K->name; *c && o < 100; c++)
            name[o++] = (isalnum((unsigned char)*c) || *c == '_') ? *c : '_';
        name[o] = 0;
        snprintf(path, sizeof path, "%s/%s.%s", outdir, name, ir ? "ll" : "s");
        FILE *f = fopen(path, "w");
        if (!f) {
            snprintf(err, n, "cannot write %s: %s", path, strerror(errno));
            rc = -1;
            break;
        }
        fprintf(f, "%s mptc kernel %d: %s (%s), %d op%s fused:\n", cm, k, K->name, mpt_kernel_kind_name(K->kind),
                K->n_nodes, K->n_nodes == 1 ? "" : "s");
        for (int i = 0; i < K->n_nodes; i++) {
            const mpt_node *nd = &p->g->nodes[K->nodes[i]];
            char sh[64];
            fprintf(f, "%s   %%%d = %s %s%s%s%s\n", cm, K->nodes[i], mpt_op_name(nd->op),
                    mpt_dtype_name(nd->dtype), mpt_shape_str(nd->shape, sh, sizeof sh),
                    nd->layer ? "  layer " : "", nd->layer ? nd->layer : "");
        }
        if (x->core[0] && K->kind != MPT_KERNEL_OPAQUE)
            fprintf(f, "%s core: %s (its code follows the generated loops)\n", cm, x->core);
        if (x->core[0] && K->kind == MPT_KERNEL_OPAQUE) fprintf(f, "%s core: %s\n", cm, x->core);
        if (K->kind == MPT_KERNEL_OPAQUE)
            fprintf(f, "%s runs as a C loop (codegen/cpu/%s): no generated code\n", cm,
                    p->g->nodes[K->root].op == MPT_OP_BATCH_MATMUL ? "batch_matmul.c"
                    : mpt_op_table[p->g->nodes[K->root].op].kind == MPT_KIND_GEMM ? "attention.c"
                                                                                   : "emit_opaque.c");
        for (int i = 0; i < x->n_fns; i++) {
            fprintf(f, "\n%s %s: %s\n", cm, x->fns[i].name,
                    i < x->n_pre ? "prologue: materialises a GEMM/conv operand"
                    : K->kind == MPT_KERNEL_GEMM || K->kind == MPT_KERNEL_CONV ? "epilogue loop"
                    : "the kernel");
            write_function(f, ir ? e->ir_text : e->asm_text, x->fns[i].name, ir);
        }
        if (x->gemm) {
            const char *t = mpt_cpu_gemm_text(x->gemm, ir ? "ir" : "asm");
            if (t) fprintf(f, "\n%s the GEMM core's module:\n%s", cm, t);
        }
        fclose(f);
        if (report)
            fprintf(report, "k%02d %-9s %-48s %d generated function%s%s%s\n", k, mpt_kernel_kind_name(K->kind),
                    K->name, x->n_fns, x->n_fns == 1 ? "" : "s", x->core[0] ? ", " : "", x->core);
    }
    exec_free(e);
    return rc;
}
