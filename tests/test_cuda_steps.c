/* tests/test_cuda_steps.c — whole train and evaluation steps through the
 * CUDA backend, with its kernels run on the host, against the interpreter.
 *
 * The session opens on the recording driver and cuBLASLt (tests/fake/cuda.c,
 * whose cublasLtMatmul computes as cuBLASLt documents it), so the GEMMs
 * mapped onto cuBLASLt epilogues run there, from the operand layouts and
 * transposes the backend passes. Every generated kernel
 * of the train and evaluation plans is also compiled for the host
 * (tests/cuda_emu.h) and registered with the driver as the function the
 * backend launches it by, so each launch computes on the device buffers its
 * parameters point to. (A first pass over the models only opens their
 * sessions and collects the kernels they launch, whose codes are then
 * built for the host all at once, each once.)
 * The backend's own host side then runs as on a GPU: the memory plan's
 * arenas and their reuse, in-place variable updates, the copies after the
 * step, outputs zeroed before atomics, constant outputs, variables kept on
 * the device between steps and pulled back. Three steps of each model
 * (mlp_small, convnet_small, text_tiny, tests/models/resblock, ...)
 * under each policy must match three interpreter steps: every output of
 * every step and every variable at the end, then one evaluation step.
 * tests/models/torch_gpt runs with --fusion-disable=attention, so its
 * attention is batch_matmuls: each must reach cuBLASLt as one
 * strided-batched call of its batch count, strides and dtypes.
 * tests/test_cuda_emu.c checks each kernel alone with tight tolerances;
 * this test is about the steps' plumbing, where a misplaced buffer gives
 * values unrelated to the right ones, so the tolerance here only allows
 * for three steps of f32-versus-double drift (see `near`).
 *
 * `test_cuda_steps --gpu [MODEL]` runs the same steps on a real GPU, its
 * driver and cuBLASLt, with the kernels NVRTC compiled (scripts/gpu_run.sh
 * runs it on the lent machine); it skips (77) where no GPU is usable.
 */
#include <dlfcn.h>
#include <libgen.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cuda.h"
#include "runtime/cuda/cuda.h"
#include "runtime/train/train.h"
#include "tests/check.h"
#include "tests/cuda_emu.h"
#include "tests/fake/fake.h"

static fake_cuda_counts (*fake_stats)(void);
static fake_lt_log_fn fake_lt_log;

typedef void (*register_fn)(void *function, emu_entry run, int n_params, const unsigned grid[3],
                            const unsigned block[3], unsigned shared);
static register_fn fake_register;
static int on_gpu; /* --gpu: the real driver, no host builds */

/* Three steps apart, values drift: f32 GEMM and reduction sums against
 * double ones, and through Adam, whose first steps move each weight by
 * about the learning rate times the sign of its gradient, a gradient that
 * is zero up to rounding may take either sign (2 lr = 2e-3 for mlp_small).
 * The f16/bf16 bounds are a few ulps of the values' magnitudes. */
/* The policy's compute dtype (F16, BF16; F32 for float32) of the model
 * running, for the GPU's bound below. */
static mpt_dtype compute_dt = MPT_DT_F32;

static int near(mpt_dtype dt, double a, double b) {
    if (isnan(a) && isnan(b)) return 1;
    /* On a GPU, f32 arithmetic is not the host build's: FMA contraction,
     * rsqrtf and expf approximations, Tensor Core accumulation. Under a
     * mixed policy a difference of one f32 ulp can flip the rounding of an
     * f16/bf16 activation (2^-11 / 2^-8 relative), and the f32 values
     * computed from them (the loss, the optimizer's slots) carry that from
     * step to step. So there an f32 value of a mixed run is held to the
     * compute dtype's bound. Seen on an H100 (2026-11-27): text_tiny
     * mixed_bfloat16 after two steps, loss 1.90471 against 1.89872, Adam's
     * first moment 0.39741 against 0.39346, within bf16's bound and over
     * f32's; the host build keeps f32's. */
    if (on_gpu && dt == MPT_DT_F32) dt = compute_dt;
    switch (dt) {
    case MPT_DT_F32: return fabs(a - b) <= 3e-3 + 1e-3 * fabs(b);
    case MPT_DT_F16: return fabs(a - b) <= 4e-3 + 1e-2 * fabs(b);
    case MPT_DT_BF16: return fabs(a - b) <= 2e-2 + 4e-2 * fabs(b);
    case MPT_DT_I32: case MPT_DT_BOOL: return a == b;
    case MPT_DT_F64: case MPT_DT_COUNT: break;
    }
    return 0;
}

static void same(const char *what, const char *name, const mpt_tensor *got, const mpt_tensor *ref) {
    int64_t n = mpt_shape_numel(ref->shape), bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (!near(ref->dtype, mpt_tensor_get(got, i), mpt_tensor_get(ref, i))) {
            if (first < 0) first = i;
            bad++;
        }
    CHECK_MSG(bad == 0, "%s %s: %lld of %lld differ; first [%lld] cuda %.9g, interp %.9g", what,
              name, (long long)bad, (long long)n, (long long)first,
              first >= 0 ? mpt_tensor_get(got, first) : 0.0,
              first >= 0 ? mpt_tensor_get(ref, first) : 0.0);
}

/* Compiles the kernels of plan p that x launches for the host and
 * registers each with the driver function x launches it by (whatever name
 * its cubin gives it: a kernel read from the kernel cache carries the name
 * of the kernel it was first compiled as). 0 or -1. */
static int host_kernels(const char *what, const mpt_plan *p, const mpt_exec *x, emu_module *m) {
    memset(m, 0, sizeof *m);
    if (on_gpu) return 0;
    char err[1024];
    /* the kernels x launches (not those cuBLASLt runs) and their functions */
    mpt_cuda_kernel_src *src = calloc((size_t)p->n_kernels + 1, sizeof *src);
    void **fn = calloc((size_t)p->n_kernels + 1, sizeof *fn);
    int rc = src && fn ? 0 : -1, n = 0;
    CHECK_MSG(rc == 0, "%s: out of memory", what);
    for (int k = 0; rc == 0 && k < p->n_kernels; k++) {
        if (!(fn[n] = mpt_cuda_exec_function(x, k))) continue;
        rc = mpt_cuda_emit_kernel(p, k, &src[n++], err, sizeof err);
        CHECK_MSG(rc == 0, "%s: %s", what, err);
    }
    if (rc == 0) {
        rc = emu_build(m, src, n, err, sizeof err);
        CHECK_MSG(rc == 0, "%s: %s", what, err);
    }
    for (int i = 0; rc == 0 && i < n; i++)
        fake_register(fn[i], m->run[i], src[i].n_params + (src[i].scratch_bytes != 0) +
                                            (src[i].counter_bytes != 0),
                      src[i].grid, src[i].block, src[i].shared_bytes);
    for (int i = 0; i < n; i++) mpt_cuda_kernel_src_free(&src[i]);
    free(src);
    free(fn);
    return rc;
}

/* The first step, kernel by kernel: every kernel's outputs against the
 * interpreter's values of those nodes, read right after the kernel ran.
 * The kernels read what the kernels before them computed, so differences
 * grow along the step; the first kernel whose values are off is where to
 * look. Printed only when the step's outputs did not match. */
typedef struct {
    const mpt_plan *p;
    mpt_tensor *vals; /* the interpreter's value of every node */
    char log[4096];
    size_t len;
    int found;
} divergence;

static void on_kernel(void *ctx, const mpt_exec *x, int k) {
    divergence *d = ctx;
    const mpt_cu_api *cu = mpt_cuda_driver(0, NULL, 0);
    const mpt_kernel *K = &d->p->kernels[k];
    const mpt_graph *g = d->p->g;
    for (int o = 0; cu && d->found < 3 && o < K->n_outputs; o++) {
        int id = K->outputs[o];
        mpt_cu_deviceptr at = mpt_cuda_exec_buffer(x, id);
        const mpt_tensor *ref = &d->vals[id];
        mpt_tensor got;
        if (!at || !ref->data || mpt_tensor_alloc(&got, ref->dtype, ref->shape)) continue;
        int64_t n = mpt_shape_numel(ref->shape), bad = 0, first = -1;
        if (cu->memcpy_dtoh(got.data, at, mpt_tensor_bytes(&got)) == 0)
            for (int64_t i = 0; i < n; i++)
                if (!near(ref->dtype, mpt_tensor_get(&got, i), mpt_tensor_get(ref, i))) {
                    if (first < 0) first = i;
                    bad++;
                }
        if (bad && d->len < sizeof d->log)
            d->len += (size_t)snprintf(d->log + d->len, sizeof d->log - d->len,
                                       "  kernel %d %s, %%%d %s: %lld of %lld differ; first [%lld] "
                                       "gpu %.9g, interp %.9g\n", k, K->name, id,
                                       mpt_op_name(g->nodes[id].op), (long long)bad, (long long)n,
                                       (long long)first, mpt_tensor_get(&got, first),
                                       mpt_tensor_get(ref, first));
        d->found += bad > 0;
        mpt_tensor_free(&got);
    }
}

/* the first pass over the models only opens their sessions and queues the
 * codes of the kernels they launch for one host build of them all
 * (tests/cuda_emu.h: emu_add); the second runs the steps */
static int collecting;

static void collect_kernels(const char *what, const mpt_plan *p, const mpt_exec *x) {
    char err[1024];
    int rc = 0;
    for (int k = 0; rc == 0 && p && x && k < p->n_kernels; k++) {
        mpt_cuda_kernel_src src;
        if (!mpt_cuda_exec_function(x, k) || mpt_cuda_emit_kernel(p, k, &src, err, sizeof err))
            continue; /* an emit error is said in the run */
        rc = emu_add(&src, 1);
        mpt_cuda_kernel_src_free(&src);
    }
    CHECK_MSG(rc == 0, "%s: out of memory", what);
}


/* The cuBLASLt call the batch_matmul kernel k of p must be, as the
 * recording cuBLASLt logs it: row-major D[M,N] = op(A) op(B) is
 * column-major D^T = op(B)^T op(A)^T, one per batch, every matrix of a
 * buffer right after the one before. */
static fake_lt_call batched_call(const mpt_plan *p, int k) {
    const mpt_graph *g = p->g;
    const mpt_node *r = &g->nodes[p->kernels[k].root], *a = &g->nodes[r->in[0]];
    int rank = r->shape.rank, ta = (int)r->attr.i[0], tb = (int)r->attr.i[1];
    long long m = r->shape.dim[rank - 2], n = r->shape.dim[rank - 1];
    long long kk = a->shape.dim[ta ? rank - 2 : rank - 1], batch = 1;
    for (int d = 0; d < rank - 2; d++) batch *= r->shape.dim[d];
    int at = a->dtype == MPT_DT_F16 ? 2 : a->dtype == MPT_DT_BF16 ? 14 : 0;
    int dt = r->dtype == MPT_DT_F16 ? 2 : r->dtype == MPT_DT_BF16 ? 14 : 0;
    return (fake_lt_call){(unsigned long long)n, (unsigned long long)m, (unsigned long long)kk,
                          (int)batch, tb, ta, kk * n, m * kk, m * n, at, dt};
}

static int same_call(const fake_lt_call *a, const fake_lt_call *b) {
    return a->m == b->m && a->n == b->n && a->k == b->k && a->batch == b->batch &&
           a->transa == b->transa && a->transb == b->transb && a->stride_a == b->stride_a &&
           a->stride_b == b->stride_b && a->stride_d == b->stride_d && a->a_type == b->a_type &&
           a->d_type == b->d_type;
}

/* Each batch_matmul kernel of the train plan p was one batched cuBLASLt
 * call a step in the `steps` steps whose calls are log[from, to) (none
 * when cuBLASLt refuses every call: then the generated kernel ran), and
 * no other call was batched. */
static void check_batched(const char *what, const mpt_plan *p, long long from, long long to,
                          int steps) {
    const fake_lt_call *log;
    fake_lt_log(&log);
    int refused = getenv("FAKE_LT_REFUSE") != NULL, n_bmm = 0;
    long long batched = 0;
    for (long long i = from; i < to; i++) batched += log[i].batch > 1;
    for (int k = 0; k < p->n_kernels; k++) {
        const mpt_kernel *K = &p->kernels[k];
        if (K->root < 0 || p->g->nodes[K->root].op != MPT_OP_BATCH_MATMUL) continue;
        n_bmm++;
        fake_lt_call want = batched_call(p, k);
        int alike = 0; /* kernels of the same call, this one included */
        for (int j = 0; j < p->n_kernels; j++) {
            const mpt_kernel *J = &p->kernels[j];
            if (J->root < 0 || p->g->nodes[J->root].op != MPT_OP_BATCH_MATMUL) continue;
            fake_lt_call c = batched_call(p, j);
            alike += same_call(&want, &c);
        }
        long long got = 0;
        for (long long i = from; i < to; i++) got += same_call(&log[i], &want);
        CHECK_MSG(got == (refused ? 0 : (long long)steps * alike),
                  "%s: kernel %d %s: %lld cuBLASLt calls of batch %d, M=%llu N=%llu K=%llu "
                  "(column-major), strides %lld %lld %lld; want %d", what, k, K->name, got,
                  want.batch, want.m, want.n, want.k, want.stride_a, want.stride_b,
                  want.stride_d, refused ? 0 : steps * alike);
    }
    CHECK_MSG(batched == (refused ? 0 : (long long)steps * n_bmm),
              "%s: %lld batched cuBLASLt calls in %d steps of %d batch_matmul kernels", what,
              batched, steps, n_bmm);
}

static void run_model_opts(const char *path, const char *policy, unsigned disable) {
    compute_dt = strcmp(policy, "mixed_float16") == 0    ? MPT_DT_F16
                 : strcmp(policy, "mixed_bfloat16") == 0 ? MPT_DT_BF16
                                                         : MPT_DT_F32;
    mpt_compile_opts o = {.path = path, .policy = policy, .batch_size = 7, .xla = 1,
                          .device = "cuda", .want_eval = 1, .diag = stderr,
                          .fusion_disable = disable};
    mpt_session *s = NULL;
    CHECK_MSG(mpt_session_open(&o, &s) == 0, "%s %s", path, policy);
    if (!s) return;
    char what[256], err[1024] = "";
    snprintf(what, sizeof what, "%s %s", path, policy);
    if (collecting) {
        collect_kernels(what, s->train_plan, s->train_exec);
        collect_kernels(what, s->eval_plan, s->eval_exec);
        mpt_session_free(s);
        return;
    }
    CHECK(strcmp(s->backend->name, "cuda") == 0);
    CHECK(mpt_session_init_state(s, 1) == 0);
    const mpt_graph *g = s->train;
    int ni = mpt_graph_n_inputs(g), nv = mpt_graph_n_variables(g);
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in), *ref_vars = calloc((size_t)nv + 1, sizeof *ref_vars);
    mpt_tensor *in_next = calloc((size_t)ni + 1, sizeof *in_next);
    mpt_tensor *out = calloc((size_t)g->n_outputs + 1, sizeof *out);
    mpt_tensor *ref = calloc((size_t)g->n_outputs + 1, sizeof *ref);
    for (int k = 0; k < nv; k++) {
        mpt_tensor_alloc(&ref_vars[k], s->vars[k].dtype, s->vars[k].shape);
        memcpy(ref_vars[k].data, s->vars[k].data, mpt_tensor_bytes(&s->vars[k]));
    }
    if (disable) snprintf(what + strlen(what), sizeof what - strlen(what), " (fusion off: %#x)",
                          disable);
    emu_module m;
    int rc = host_kernels(what, s->train_plan, s->train_exec, &m);
    const fake_lt_call *log;
    long long log_from = on_gpu ? 0 : fake_lt_log(&log);
    emu_fill_inputs(g, in, 11u);
    for (int step = 0; rc == 0 && step < 3; step++) {
        /* the next step's batch is staged (uploaded while this one runs)
         * from step 0 on, except before step 2 of every other model, whose
         * batch then goes up as run() is called */
        if (step < 2) {
            emu_fill_inputs(g, in_next, 12u + (unsigned)step);
            if (step == 0 || strstr(path, "_small") || strstr(path, "relu_bn"))
                CHECK_MSG(s->backend->stage_next(s->train_exec, in_next, err, sizeof err) == 1,
                          "%s step %d: stage_next: %s", what, step, err);
        }
        /* on a GPU, the first step also kernel by kernel (the interpreter
         * first, to have every node's value) */
        divergence *dv = on_gpu && step == 0 ? calloc(1, sizeof *dv) : NULL;
        if (dv) dv->vals = calloc((size_t)g->n_nodes, sizeof *dv->vals);
        if (dv && dv->vals) {
            dv->p = s->train_plan;
            mpt_interp_opts io = {.on_node = emu_capture, .ctx = dv->vals};
            CHECK(mpt_interp_run(g, in, ref_vars, ref, &io, err, sizeof err) == 0);
            mpt_cuda_set_kernel_hook(on_kernel, dv);
        } else {
            CHECK(mpt_interp_run(g, in, ref_vars, ref, NULL, err, sizeof err) == 0);
        }
        int failed_before = check_failures;
        rc = s->backend->run(s->train_exec, in, s->vars, out, err, sizeof err);
        mpt_cuda_set_kernel_hook(NULL, NULL);
        CHECK_MSG(rc == 0, "%s step %d: %s", what, step, err);
        char w[300];
        snprintf(w, sizeof w, "%s step %d output", what, step);
        for (int k = 0; rc == 0 && k < g->n_outputs; k++) same(w, g->outputs[k].name, &out[k], &ref[k]);
        if (dv) {
            if (check_failures > failed_before && dv->len)
                fprintf(stderr, "%s step 0, the first kernels whose outputs differ:\n%s", what,
                        dv->log);
            for (int i = 0; dv->vals && i < g->n_nodes; i++) mpt_tensor_free(&dv->vals[i]);
            free(dv->vals);
            free(dv);
        }
        for (int k = 0; k < g->n_outputs; k++) {
            if (rc == 0) mpt_tensor_free(&out[k]);
            mpt_tensor_free(&ref[k]);
        }
        for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
        mpt_tensor *t = in;
        in = in_next;
        in_next = t;
    }
    for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    free(in_next);
    if (rc == 0 && !on_gpu) check_batched(what, s->train_plan, log_from, fake_lt_log(&log), 3);
    if (rc == 0) {
        CHECK(mpt_session_pull_vars(s, err, sizeof err) == 0);
        for (int k = 0; k < nv; k++) {
            char w[300];
            snprintf(w, sizeof w, "%s after 3 steps, variable", what);
            same(w, g->nodes[mpt_graph_variable_node(g, k)].name, &s->vars[k], &ref_vars[k]);
        }
        if (!on_gpu) emu_free(&m);
    }
    /* the evaluation step, which reads the train step's variable buffers:
     * on the variables the train steps left, then on host copies changed
     * as a restored checkpoint changes them (push_vars: the evaluation step
     * must upload them into the shared buffers) */
    const mpt_graph *e = s->eval;
    if (rc == 0 && e && host_kernels(what, s->eval_plan, s->eval_exec, &m) == 0) {
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 1) {
                CHECK(mpt_init_variables(s->train, s->vars, 77) == 0);
                s->backend->push_vars(s->train_exec);
            }
            int ei = mpt_graph_n_inputs(e), ev_n = mpt_graph_n_variables(e);
            mpt_tensor *ein = calloc((size_t)ei + 1, sizeof *ein);
            mpt_tensor *ev = calloc((size_t)ev_n + 1, sizeof *ev), *rv = calloc((size_t)ev_n + 1, sizeof *rv);
            mpt_tensor *eo = calloc((size_t)e->n_outputs + 1, sizeof *eo);
            mpt_tensor *er = calloc((size_t)e->n_outputs + 1, sizeof *er);
            for (int k = 0; k < ev_n; k++) {
                ev[k] = s->vars[s->eval_var[k]];
                mpt_tensor_alloc(&rv[k], ev[k].dtype, ev[k].shape);
                memcpy(rv[k].data, ev[k].data, mpt_tensor_bytes(&ev[k]));
            }
            emu_fill_inputs(e, ein, 99);
            int r = s->backend->run(s->eval_exec, ein, ev, eo, err, sizeof err);
            CHECK_MSG(r == 0, "%s eval: %s", what, err);
            CHECK(mpt_interp_run(e, ein, rv, er, NULL, err, sizeof err) == 0);
            char w[300];
            snprintf(w, sizeof w, "%s eval output%s", what, pass ? " after push_vars" : "");
            for (int k = 0; r == 0 && k < e->n_outputs; k++) same(w, e->outputs[k].name, &eo[k], &er[k]);
            for (int k = 0; k < e->n_outputs; k++) {
                if (r == 0) mpt_tensor_free(&eo[k]);
                mpt_tensor_free(&er[k]);
            }
            for (int k = 0; k < ei; k++) mpt_tensor_free(&ein[k]);
            for (int k = 0; k < ev_n; k++) mpt_tensor_free(&rv[k]);
            free(ein), free(ev), free(rv), free(eo), free(er);
        }
        if (!on_gpu) emu_free(&m);
    }
    for (int k = 0; k < nv; k++) mpt_tensor_free(&ref_vars[k]);
    free(in), free(ref_vars), free(out), free(ref);
    mpt_session_free(s);
}

static void run_model(const char *path, const char *policy) {
    run_model_opts(path, policy, 0);
}

/* The models' steps in order (argv's MODEL, when given, picks those whose
 * name holds it), and what the test driver counted between them. */
static void run_models(const char *only) {
    const char *models[] = {"examples/mlp_small.mpt", "examples/convnet_small.mpt",
                            "examples/text_tiny.mpt", "tests/models/resblock.mpt",
                            "tests/models/conv1x1.mpt", "tests/models/strided.mpt",
                            "tests/models/wide_f32.mpt", "tests/models/relu_bn.mpt",
                            "tests/models/controls.mpt"};
    const char *policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++)
        for (size_t p = 0; p < sizeof policies / sizeof *policies; p++) {
            /* the training controls (schedule, clipping, decay) are the
             * same graph ops under every policy: mixed_float16's run, with
             * its loss scale, is the one that adds to the others */
            if (!only && strstr(models[i], "controls") && p != 1) continue;
            if (!only || strstr(models[i], only)) run_model(models[i], policies[p]);
        }
    /* attention as batch_matmuls (the fused attention kernels off): their
     * strided-batched cuBLASLt calls, f32 scores from f16 operands; the
     * three policies when asked for by name (suite time), bf16 below with
     * the generated kernels */
    for (size_t p = 0; p < sizeof policies / sizeof *policies; p++)
        if (only ? strstr("tests/models/torch_gpt.mpt bmm", only) != NULL : p == 1)
            run_model_opts("tests/models/torch_gpt.mpt", policies[p], MPT_FUSE_ATTENTION);
    if (on_gpu) return;
    if (!collecting) {
        /* both paths ran: cuBLASLt calls and generated kernels, none refused */
        printf("%lld kernel launches, %lld cuBLASLt matmuls; %lld steps launched as CUDA "
               "graphs (%lld launches, memsets and matmuls captured)\n", fake_stats().launches,
               fake_stats().matmuls, fake_stats().graph_launches, fake_stats().captured);
        CHECK(only || (fake_stats().matmuls > 0 && fake_stats().launches > 0));
        /* and every launch ran the host build of its kernel */
        CHECK(fake_stats().hosted_launches == fake_stats().launches);
        /* every step after the first capture is one graph launch: a step
         * whose replay left out a kernel, or ran one on stale parameters,
         * differs from the interpreter above */
        CHECK(only || (fake_stats().graph_launches > 0 && fake_stats().captured > 0));
        CHECK(fake_stats().bad_calls == 0);
    }
    /* sm_90's wgmma kernels (the test driver is an sm_90 device: NVRTC
     * compiles them for sm_90a, and their 64 KiB of shared memory take the
     * opt-in), in whole steps and graphs */
    if (!only || strstr("wgmma", only)) {
        setenv("MPTC_CUDA_WGMMA", "1", 1);
        long long launched = fake_stats().launches;
        run_model("examples/convnet_small.mpt", "mixed_float16");
        run_model("tests/models/strided.mpt", "mixed_bfloat16");
        unsetenv("MPTC_CUDA_WGMMA");
        if (!collecting) {
            printf("with wgmma kernels: %lld kernel launches\n",
                   fake_stats().launches - launched);
            CHECK(fake_stats().launches > launched);
            CHECK(fake_stats().bad_calls == 0);
        }
    }
    /* a cuBLASLt with no algorithm for what was matched: those kernels are
     * generated instead, and the steps still match the interpreter */
    if (!only || strstr("fallback", only)) {
        mpt_cuda_lt_forget(); /* what cuBLASLt answered so far no longer holds */
        setenv("FAKE_LT_REFUSE", "all", 1);
        long long before = fake_stats().matmuls, launched = fake_stats().launches;
        run_model("examples/mlp_small.mpt", "mixed_float16");
        run_model("tests/models/conv1x1.mpt", "float32");
        run_model_opts("tests/models/torch_gpt.mpt", "mixed_bfloat16", MPT_FUSE_ATTENTION);
        unsetenv("FAKE_LT_REFUSE");
        mpt_cuda_lt_forget();
        if (!collecting) {
            printf("with no cuBLASLt algorithm: %lld matmuls, %lld kernel launches\n",
                   fake_stats().matmuls - before, fake_stats().launches - launched);
            CHECK(fake_stats().matmuls == before);
            CHECK(fake_stats().launches > launched);
            CHECK(fake_stats().bad_calls == 0);
        }
        /* a driver that cannot capture: the kernels are launched one by one */
        setenv("FAKE_CUDA_NO_CAPTURE", "1", 1);
        long long graphs = fake_stats().graph_launches;
        launched = fake_stats().launches;
        run_model("examples/mlp_small.mpt", "mixed_float16");
        unsetenv("FAKE_CUDA_NO_CAPTURE");
        if (!collecting) {
            printf("with no CUDA graphs: %lld kernel launches\n",
                   fake_stats().launches - launched);
            CHECK(fake_stats().graph_launches == graphs);
            CHECK(fake_stats().launches > launched);
            CHECK(fake_stats().bad_calls == 0);
        }
    }
}

int main(int argc, char **argv) {
    char why[512];
    if (!mpt_cuda_nvrtc(why, sizeof why)) {
        printf("skip: the CUDA backend's tests need NVRTC: %s\n", why);
        return 77;
    }
    const char *only = argc > 1 ? argv[1] : NULL;
    if (only && strcmp(only, "--gpu") == 0) {
        on_gpu = 1;
        only = argc > 2 ? argv[2] : NULL;
        if (!mpt_backend_cuda.available(why, sizeof why)) {
            printf("skip: no CUDA GPU (%s)\n", why);
            return 77;
        }
    }
    if (!on_gpu && system("g++ --version > /dev/null 2>&1") != 0) {
        printf("skip: no g++ to compile the generated CUDA C for the host\n");
        return 77;
    }
    void *h = on_gpu ? NULL : fake_cuda_load(argv[0]);
    fake_register = h ? (register_fn)dlsym(h, "fake_cuda_register") : NULL;
    fake_stats = h ? (fake_cuda_counts(*)(void))dlsym(h, "fake_cuda_stats") : NULL;
    fake_lt_log = h ? (fake_lt_log_fn)dlsym(h, "fake_lt_log") : NULL;
    if (!on_gpu && (!fake_register || !fake_stats || !fake_lt_log)) {
        fprintf(stderr, "the test driver lacks fake_cuda_register\n");
        return 1;
    }
    /* Per-channel reductions split their rows over blocks from 16 rows on
     * (256 by default), so the small models' batch norms and bias
     * gradients take the path with partials in scratch, combined by the
     * last block, whose counters must be back at zero for the next step;
     * test_cuda_emu runs them with the default. */
    setenv("MPTC_CUDA_SPLIT_ROWS", "16", 1);
    /* and a reduction kernel whose row-sized work reads its own results is
     * cut into passes from 16 rows a result on (2048 by default), so
     * relu_bn's batch norm gradients at batch 7 run cut (fusion/split.c) */
    setenv("MPTC_FUSION_CHAIN_ROWS", "16", 1);
    if (!on_gpu) {
        /* every launched kernel's code built for the host at once (g++ on
         * every core, each code once), then the steps run; where that
         * build fails, each plan builds its own, so the failures name
         * their plans */
        collecting = 1;
        run_models(only);
        collecting = 0;
        char err[1024];
        if (emu_build_pending(err, sizeof err)) {
            printf("building every kernel at once failed (%s); building plan by plan\n", err);
            emu_pending_clear();
        }
    }
    run_models(only);
    if (on_gpu) return check_exit("test_cuda_steps --gpu");
    CHECK(fake_stats().hosted_launches == fake_stats().launches);
    return check_exit("test_cuda_steps");
}
