/* runtime/cuda/cuda_exec.c — the CUDA backend.
 *
 * Compiling a plan, on the process's device (0, or a data-parallel rank's
 * own: mpt_cuda_device): every generated kernel through NVRTC for its
 * architecture (cubin, loaded with cuModuleLoadData); every GEMM kernel
 * whose epilogue maps onto cuBLASLt as one cublasLtMatmul, its algorithm
 * chosen now (the shapes are static); and the memory plan's three arenas,
 * one cuMemAlloc each: activations, gradients and temporaries (arena 0,
 * space reused as the plan's lifetimes allow), the variables (1) and the
 * inputs (2). An update the plan allows to be written over its variable
 * (mpt_plan_update_in_place) gets the variable's own buffer; the others are
 * copied over their variable on the device at the end of the step.
 *
 * Its cuBLASLt calls are prepared in cuda_lt.c, its collectives (a
 * data-parallel rank's sums through NCCL) in cuda_nccl.c; the state the
 * files share is in cuda_impl.h.
 *
 * A step uploads the inputs, launches the kernels in plan order (as one
 * CUDA graph from the first run on), and downloads the outputs. The
 * variables stay on the device between steps:
 * uploaded on the first step and after push_vars, downloaded by pull_vars
 * (backend.h), so a training step moves only its batch and its outputs.
 * The evaluation step holds no copy of its own: share_vars points its
 * variables at the train step's buffers (its arena 1 is given back), so it
 * always reads the current values and uploads them only when the train
 * step has not yet, or the host copies changed since (push_vars).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/cuda/cuda_impl.h"

static FILE *profile_out;

void mpt_cuda_profile(FILE *out) { profile_out = out; }

static mpt_cuda_kernel_hook kernel_hook;
static void *kernel_hook_ctx;
void mpt_cuda_set_kernel_hook(mpt_cuda_kernel_hook fn, void *ctx) {
    kernel_hook = fn;
    kernel_hook_ctx = ctx;
}

void mpt_cuda_exec_memory(const mpt_exec *e, int64_t *device_bytes, int *private_buffers,
                          int *in_place_updates) {
    if (device_bytes) *device_bytes = e->device_bytes;
    if (private_buffers) *private_buffers = e->n_own;
    if (in_place_updates) *in_place_updates = e->n_in_place;
}

mpt_cu_deviceptr mpt_cuda_exec_buffer(const mpt_exec *e, int node) {
    return node >= 0 && node < e->plan->g->n_nodes ? e->buf[node] : 0;
}

mpt_cu_function mpt_cuda_exec_function(const mpt_exec *e, int k) {
    return k >= 0 && k < e->plan->n_kernels && k < e->n_steps && !e->steps[k].is_lt
               ? e->steps[k].fn
               : NULL;
}

static int cuda_available(char *why, size_t n) {
    mpt_cuda_device_info d;
    int c = mpt_cuda_devices(&d, 1, why, n);
    return c > 0;
}

static int64_t node_bytes(const mpt_graph *g, int node) {
    const mpt_node *nd = &g->nodes[node];
    return mpt_shape_numel(nd->shape) * (int64_t)mpt_dtype_size(nd->dtype);
}

static int dev_alloc(mpt_exec *x, const mpt_cu_api *cu, mpt_cu_deviceptr *p, int64_t bytes,
                     char *err, size_t n) {
    MPT_CU_CHECK(cu->mem_alloc(p, (size_t)(bytes > 0 ? bytes : 1)),
                 "the GPU is out of memory: use a smaller --batch-size");
    x->device_bytes += bytes > 0 ? bytes : 1;
    return 0;
fail:
    *p = 0;
    return -1;
}

static void cuda_free(mpt_exec *x) {
    if (!x) return;
    if (x->shared_from) x->shared_from->sharer = NULL;
    if (x->sharer) x->sharer->shared_from = NULL;
    if (x->prof_out && x->prof_steps > 0) mpt_cuda_profile_report(x);
    const mpt_cu_api *cu = mpt_cuda_driver(0, NULL, 0);
    const mpt_lt_api *lt = mpt_cuda_cublaslt(NULL, 0);
    /* the graph holds the modules' kernels: it goes first */
    if (cu && x->graph_exec) cu->graph_exec_destroy(x->graph_exec);
    if (cu && x->graph) cu->graph_destroy(x->graph);
    for (int i = 0; i < x->n_steps; i++) {
        cuda_step *s = &x->steps[i];
        if (s->mod && cu) cu->module_unload(s->mod);
        if (lt) mpt_cuda_lt_release(lt, s);
        mpt_cuda_kernel_src_free(&s->src);
    }
    if (cu) {
        for (int a = 0; a < 3; a++)
            if (x->arena[a]) cu->mem_free(x->arena[a]);
        for (int i = 0; i < x->n_own; i++) cu->mem_free(x->own[i]);
        if (x->stage) cu->mem_free(x->stage);
        if (x->workspace) cu->mem_free(x->workspace);
        if (x->shared_mem) cu->mem_free(x->shared_mem);
        if (x->stream) cu->stream_destroy(x->stream);
        if (x->copy_stream) cu->stream_destroy(x->copy_stream);
        if (x->staged) cu->mem_free(x->staged);
        if (x->coll_pad) cu->mem_free(x->coll_pad);
        mpt_cuda_coll_free(x, cu);
        for (int i = 0; x->events && i <= x->n_steps; i++)
            if (x->events[i]) cu->event_destroy(x->events[i]);
    }
    if (lt && x->lt) lt->destroy(x->lt);
    if (cu && x->ctx) cu->primary_ctx_release(x->dev);
    free(x->buf);
    free(x->args);
    free(x->staged_off);
    free(x->next_data);
    free(x->staged_data);
    free(x->staged_in);
    free(x->own);
    free(x->stage_off);
    free(x->in_place);
    free(x->events);
    free(x->steps);
    free(x);
}

/* the nodes step s reads or writes */
static int step_nodes(const cuda_step *s, int *ids) {
    int c = 0;
    if (s->is_lt) {
        int v[5] = {s->call.a, s->call.b, s->call.d, s->call.bias, s->call.aux};
        for (int j = 0; j < 5; j++)
            if (v[j] >= 0) ids[c++] = v[j];
        return c;
    }
    for (int j = 0; j < s->src.n_params; j++) ids[c++] = s->src.params[j];
    return c;
}

/* Places every value: the plan's buffers at their arena offsets, in-place
 * updates over their variables, views at their root's buffer; a value a
 * step touches outside the lifetime the plan gave it (or with no buffer in
 * the plan) gets one of its own, so a backend that reads more than the
 * plan says stays correct. */
static int place_buffers(mpt_exec *x, const mpt_cu_api *cu, int64_t stage_bytes,
                         int64_t counter_bytes, int64_t scratch_bytes, char *err, size_t n) {
    const mpt_plan *p = x->plan;
    const mpt_graph *g = p->g;
    int64_t size[3] = {0, 0, 0};
    for (int b = 0; b < p->n_buffers; b++) {
        const mpt_buffer *B = &p->buffers[b];
        if (B->offset + B->bytes > size[B->arena]) size[B->arena] = B->offset + B->bytes;
    }
    size_t free_b = 0, total_b = 0;
    int any_lt = 0;
    for (int k = 0; k < x->n_steps; k++) any_lt |= x->steps[k].is_lt;
    int64_t need = size[0] + size[1] + size[2] + stage_bytes + counter_bytes + scratch_bytes +
                   (any_lt ? LT_WORKSPACE : 0);
    if (cu->mem_get_info(&free_b, &total_b) == 0 && need > (int64_t)free_b) {
        char a[32], b[32];
        snprintf(err, n, "out of GPU memory: the step needs %s, the GPU has %s free\n"
                 "  hint: use a smaller --batch-size (`mptc check MODEL --memory SIZE` finds the "
                 "largest that fits)", mpt_fmt_bytes(need, a, sizeof a),
                 mpt_fmt_bytes((int64_t)free_b, b, sizeof b));
        return -1;
    }
    for (int a = 0; a < 3; a++) {
        if (dev_alloc(x, cu, &x->arena[a], size[a], err, n)) return -1;
        x->arena_bytes[a] = size[a] > 0 ? size[a] : 1;
    }
    if (stage_bytes && dev_alloc(x, cu, &x->stage, stage_bytes, err, n)) return -1;
    if (any_lt && dev_alloc(x, cu, &x->workspace, LT_WORKSPACE, err, n)) return -1;
    if (counter_bytes + scratch_bytes) {
        if (dev_alloc(x, cu, &x->shared_mem, counter_bytes + scratch_bytes, err, n)) return -1;
        /* zeroed once: the kernels leave their counters at zero */
        if (counter_bytes &&
            mpt_cu_check_(cu->memset_d8(x->shared_mem, 0, (size_t)counter_bytes),
                          "cu->memset_d8(x->counters)", __func__, __FILE__, __LINE__, "", err, n))
            return -1;
        x->counters = x->shared_mem;
        x->scratch = x->shared_mem + (mpt_cu_deviceptr)counter_bytes;
    }
    int *first = malloc((size_t)g->n_nodes * sizeof *first), *last = malloc((size_t)g->n_nodes * sizeof *last);
    int *ids = malloc(((size_t)g->n_nodes + 8) * sizeof *ids), rc = -1;
    x->own = calloc((size_t)g->n_nodes + 1, sizeof *x->own);
    if (!first || !last || !ids || !x->own) {
        snprintf(err, n, "out of memory placing the step's buffers");
        goto done;
    }
    for (int i = 0; i < g->n_nodes; i++) first[i] = -1, last[i] = -1;
    for (int b = 0; b < p->n_buffers; b++) {
        const mpt_buffer *B = &p->buffers[b];
        x->buf[B->node] = x->arena[B->arena] + (mpt_cu_deviceptr)B->offset;
        /* variables and inputs live through the whole step */
        first[B->node] = B->arena ? 0 : B->first;
        last[B->node] = B->arena ? p->n_kernels : B->last;
    }
    for (int i = 0; i < g->n_updates; i++)
        if (x->in_place[i]) {
            int v = g->updates[i].value;
            x->buf[v] = x->buf[g->updates[i].var];
            first[v] = 0;
            last[v] = p->n_kernels;
        }
    for (int k = 0; k < x->n_steps; k++) {
        int c = step_nodes(&x->steps[k], ids);
        for (int j = 0; j < c; j++) {
            int q = mpt_plan_storage(p, ids[j]); /* a view is its root's bytes */
            if (x->buf[q] && first[q] <= k && k <= last[q]) continue;
            if (dev_alloc(x, cu, &x->own[x->n_own], node_bytes(g, q), err, n)) goto done;
            x->buf[q] = x->own[x->n_own++];
            first[q] = 0;
            last[q] = p->n_kernels;
        }
    }
    for (int i = 0; i < g->n_nodes; i++) x->buf[i] = x->buf[mpt_plan_storage(p, i)];
    rc = 0;
done:
    free(first);
    free(last);
    free(ids);
    return rc;
}

static void free_compiles(const char **srcs, const char **names, int *gen,
                          mpt_cuda_binary *bins, int n_gen) {
    for (int j = 0; bins && j < n_gen; j++) mpt_cuda_binary_free(&bins[j]);
    free(srcs);
    free(names);
    free(gen);
    free(bins);
}

static mpt_exec *cuda_compile(const mpt_plan *p, char *err, size_t n) {
    const char **srcs = NULL, **names = NULL;
    int *gen = NULL, n_gen = 0;
    mpt_cuda_binary *bins = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const mpt_cu_api *cu = mpt_cuda_driver(1, err, n);
    if (!cu) return NULL;
    const mpt_lt_api *lt = mpt_cuda_cublaslt(NULL, 0); /* optional: generated GEMMs otherwise */
    const mpt_graph *g = p->g;
    mpt_cuda_device_info devs[16];
    int ordinal = mpt_cuda_device(), n_devs = mpt_cuda_devices(devs, 16, err, n);
    if (n_devs <= 0) return NULL;
    if (ordinal >= n_devs || ordinal >= 16) {
        snprintf(err, n, "CUDA device %d was chosen, but the driver sees %d", ordinal, n_devs);
        return NULL;
    }
    const mpt_cuda_device_info d = devs[ordinal];
    mpt_exec *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    x->plan = p;
    const char *sync_env = getenv("MPTC_CUDA_SYNC");
    x->sync_each = sync_env && atoi(sync_env) > 0;
    x->buf = calloc((size_t)g->n_nodes, sizeof *x->buf);
    x->steps = calloc((size_t)p->n_kernels + 1, sizeof *x->steps);
    x->in_place = calloc((size_t)g->n_updates + 1, 1);
    x->stage_off = malloc(((size_t)g->n_updates + 1) * sizeof *x->stage_off);
    if (!x->buf || !x->steps || !x->in_place || !x->stage_off) goto oom;
    MPT_CU_CHECK(cu->device_get(&x->dev, ordinal), "check nvidia-smi");
    MPT_CU_CHECK(cu->primary_ctx_retain(&x->ctx, x->dev), "another process may own the GPU");
    MPT_CU_CHECK(cu->ctx_set_current(x->ctx), "");
    if (cu->stream_create) {
        MPT_CU_CHECK(cu->stream_create(&x->stream, 0), "");
        const char *graphs_env = getenv("MPTC_CUDA_GRAPHS");
        x->graphs = !x->sync_each && !(graphs_env && strcmp(graphs_env, "0") == 0);
    }
    if (lt) MPT_LT_CHECK(lt->create(&x->lt), "cuBLASLt could not start; check the driver version");
    char arch[16];
    mpt_cuda_arch_name(d.cc_major, d.cc_minor, arch, sizeof arch);
    /* every generated kernel's source, then all compiled at once (NVRTC
     * on every core), then loaded in order */
    srcs = calloc((size_t)p->n_kernels + 1, sizeof *srcs);
    names = calloc((size_t)p->n_kernels + 1, sizeof *names);
    gen = calloc((size_t)p->n_kernels + 1, sizeof *gen);
    bins = calloc((size_t)p->n_kernels + 1, sizeof *bins);
    if (!srcs || !names || !gen || !bins) goto oom;
    for (int ki = 0; ki < p->n_kernels; ki++, x->n_steps++) {
        cuda_step *s = &x->steps[ki];
        const mpt_kernel *k = &p->kernels[ki];
        if (mpt_cuda_kernel_is_collective(p, ki)) {
            if (mpt_cuda_coll_prepare(x, cu, s, ki, err, n)) goto fail;
            continue;
        }
        if (lt && mpt_cuda_lt_candidate(g, k) && !mpt_cuda_match_lt(g, k, &s->call)) {
            char why[768];
            if (mpt_cuda_lt_prepare(x, lt, s, why, sizeof why) == 0) {
                s->is_lt = 1;
                continue;
            }
            /* a shape, dtype or epilogue this cuBLASLt has no algorithm for */
            mpt_cuda_lt_release(lt, s);
            char *nl = strchr(why, '\n');
            if (nl) *nl = 0;
            fprintf(stderr, "mptc: kernel %d %s: %s; a generated kernel runs it instead\n", ki,
                    k->name, why);
            x->n_lt_refused++;
        }
        if (mpt_cuda_emit_kernel(p, ki, &s->src, err, n)) goto fail;
        srcs[n_gen] = s->src.source;
        names[n_gen] = s->src.name;
        gen[n_gen++] = ki;
    }
    /* a launch passes at most 4 KB of parameters: 512 pointers */
    int most = 0;
    for (int j = 0; j < n_gen; j++) {
        const mpt_cuda_kernel_src *s = &x->steps[gen[j]].src;
        if (s->n_params + 2 > 512) {
            snprintf(err, n, "kernel %s reads and writes %d buffers, more than a CUDA launch's 4 KB "
                     "of parameters hold\n  hint: --fusion-disable=multi_output splits such "
                     "kernels", s->name, s->n_params);
            goto fail;
        }
        if (s->n_params > most) most = s->n_params;
    }
    x->args = malloc(((size_t)most + 2) * sizeof *x->args);
    if (!x->args) goto oom;
    if (mpt_cuda_compile_all(n_gen, srcs, names, arch, bins, err, n)) goto fail;
    for (int j = 0; j < n_gen; j++) {
        cuda_step *s = &x->steps[gen[j]];
        MPT_CU_CHECK(cu->module_load_data(&s->mod, bins[j].cubin),
                     "the driver rejected NVRTC's cubin; update the NVIDIA driver");
        MPT_CU_CHECK(cu->module_get_function(&s->fn, s->mod, bins[j].entry ? bins[j].entry
                                                                        : s->src.name), "");
        /* past 48 KiB of dynamic shared memory a kernel must opt in */
        if (s->src.shared_bytes > 48u * 1024)
            MPT_CU_CHECK(cu->func_set_attribute(s->fn, MPT_CU_FUNC_ATTR_MAX_DYNAMIC_SHARED,
                                                (int)s->src.shared_bytes),
                         "the GPU has less shared memory a block than the kernel needs (sm_80+ "
                         "give 163 KiB or more)");
    }
    free_compiles(srcs, names, gen, bins, n_gen);
    srcs = names = NULL;
    gen = NULL;
    bins = NULL;
    /* A kernel that zeroes its outputs before it runs (atomics) cannot
     * write one over a variable it also reads. Updates whose value is a
     * variable or a constant are held in `stage` until every update lands. */
    int64_t stage_bytes = 0;
    for (int i = 0; i < g->n_updates; i++) {
        int v = g->updates[i].value, kv = p->kernel_of[v];
        x->in_place[i] = mpt_plan_update_in_place(p, i) && kv >= 0 &&
                         (x->steps[kv].is_lt ||
                          (!x->steps[kv].src.zero_outputs && !x->steps[kv].src.set_true));
        x->n_in_place += x->in_place[i];
        mpt_op op = g->nodes[v].op;
        x->stage_off[i] = -1;
        if (v != g->updates[i].var && (op == MPT_OP_VARIABLE || op == MPT_OP_CONST)) {
            x->stage_off[i] = stage_bytes;
            stage_bytes += (node_bytes(g, v) + 255) / 256 * 256;
        }
    }
    int64_t counter_bytes = 0, scratch_bytes = 0;
    for (int ki = 0; ki < x->n_steps; ki++) {
        const cuda_step *s = &x->steps[ki];
        if (s->is_lt) continue;
        int64_t c = ((int64_t)s->src.counter_bytes + 255) / 256 * 256;
        int64_t d = ((int64_t)s->src.scratch_bytes + 255) / 256 * 256;
        if (c > counter_bytes) counter_bytes = c;
        if (d > scratch_bytes) scratch_bytes = d;
    }
    if (place_buffers(x, cu, stage_bytes, counter_bytes, scratch_bytes, err, n) ||
        mpt_cuda_coll_alloc(x, cu, mpt_backend_cuda.bucket_bytes, err, n))
        goto fail;
    for (int i = 0; i < g->n_updates; i++) {
        int v = g->updates[i].value;
        if (x->stage_off[i] < 0 || g->nodes[v].op != MPT_OP_CONST) continue;
        mpt_tensor c;
        if (mpt_tensor_alloc(&c, g->nodes[v].dtype, g->nodes[v].shape)) goto oom;
        for (int64_t e = 0; e < mpt_shape_numel(c.shape); e++) mpt_tensor_set(&c, e, g->nodes[v].attr.f);
        mpt_cu_result r = cu->memcpy_htod(x->stage + (mpt_cu_deviceptr)x->stage_off[i], c.data,
                                          mpt_tensor_bytes(&c));
        mpt_tensor_free(&c);
        MPT_CU_CHECK(r, "");
    }
    for (int ki = 0; ki < x->n_steps; ki++)
        if (x->steps[ki].is_lt && mpt_cuda_lt_bind(x, lt, &x->steps[ki], err, n)) goto fail;
    if (profile_out) {
        x->prof_out = profile_out;
        x->prof_steps = -1;
        x->events = calloc((size_t)x->n_steps + 1, sizeof *x->events);
        if (!x->events) goto oom;
        for (int i = 0; i <= x->n_steps; i++) MPT_CU_CHECK(cu->event_create(&x->events[i], 0), "");
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    mpt_backend_cuda.compile_seconds = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    return x;
oom:
    snprintf(err, n, "out of memory compiling the plan for CUDA");
fail:
    free_compiles(srcs, names, gen, bins, n_gen);
    cuda_free(x);
    return NULL;
}

static int upload_vars(mpt_exec *x, const mpt_cu_api *cu, const mpt_tensor *vars, char *err,
                       size_t n) {
    const mpt_graph *g = x->plan->g;
    for (int k = 0; k < mpt_graph_n_variables(g); k++)
        MPT_CU_CHECK(cu->memcpy_htod(x->buf[mpt_graph_variable_node(g, k)], vars[k].data,
                                     mpt_tensor_bytes(&vars[k])), "");
    x->vars_on_device = 1;
    x->device_newer = 0;
    return 0;
fail:
    return -1;
}

static int launch(mpt_exec *x, const mpt_cu_api *cu, const mpt_lt_api *lt, cuda_step *s,
                  char *err, size_t n) {
    const mpt_graph *g = x->plan->g;
    char hint[512];
    if (s->coll) return mpt_cuda_coll_launch(x, cu, s, err, n);
    if (s->is_lt) {
        const mpt_lt_call *c = &s->call;
        float one = 1.f, zero = 0.f;
        void *d = (void *)(uintptr_t)x->buf[c->d];
        /* the call's shape, dtypes and epilogue in the message */
        char *call = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&call, &len);
        if (f) {
            mpt_lt_call_print(c, g, f);
            fclose(f);
        }
        snprintf(hint, sizeof hint, "%s; report this shape; %s", call ? call : "cuBLASLt",
                 c->batch > 1 ? "MPTC_LIBCUBLASLT=none runs batched matmuls as generated kernels"
                              : "--no-xla avoids cuBLASLt epilogues");
        free(call);
        MPT_LT_CHECK(lt->matmul(x->lt, s->desc, &one, (void *)(uintptr_t)x->buf[c->b], s->la,
                                (void *)(uintptr_t)x->buf[c->a], s->lb, &zero, d, s->ld, d, s->ld,
                                &s->algo, (void *)(uintptr_t)x->workspace, LT_WORKSPACE,
                                x->stream),
                     hint);
        return 0;
    }
    /* one pointer a buffer, then scratch and counters: ResNet-50's
     * all-finite check of its 161 gradients takes 161 (1.3 KB of the 4 KB
     * of parameters every CUDA 12+ driver takes) */
    void **args = x->args;
    for (int j = 0; j < s->src.n_params; j++) {
        int node = s->src.params[j];
        int fill = mpt_cuda_output_fill(&s->src, j);
        if (fill >= 0)
            MPT_CU_CHECK(x->stream ? cu->memset_d8_async(x->buf[node], (unsigned char)fill,
                                                         (size_t)node_bytes(g, node), x->stream)
                                   : cu->memset_d8(x->buf[node], (unsigned char)fill,
                                                   (size_t)node_bytes(g, node)),
                         "");
        args[j] = &x->buf[node];
    }
    int a = s->src.n_params;
    if (s->src.scratch_bytes) args[a++] = &x->scratch;
    if (s->src.counter_bytes) args[a++] = &x->counters;
    snprintf(hint, sizeof hint, "kernel %d %s, grid (%u,%u,%u), block (%u,%u,%u), %u B of "
             "dynamic shared memory, %d buffers, failed to launch; `mptc ptx` writes its source; "
             "try --no-xla and report it", (int)(s - x->steps), s->src.name, s->src.grid[0],
             s->src.grid[1], s->src.grid[2], s->src.block[0], s->src.block[1], s->src.block[2],
             s->src.shared_bytes, s->src.n_params);
    MPT_CU_CHECK(cu->launch_kernel(s->fn, s->src.grid[0], s->src.grid[1], s->src.grid[2],
                                   s->src.block[0], s->src.block[1], s->src.block[2],
                                   s->src.shared_bytes, x->stream, args, NULL),
                 hint);
    return 0;
fail:
    return -1;
}

/* Graphs off for this step, said once a process: the step goes on with
 * its kernels launched one by one. */
static void graphs_off(mpt_exec *x, const mpt_cu_api *cu, const char *call, mpt_cu_result r,
                       const char *why) {
    static int said;
    x->graphs = 0;
    if (said++) return;
    const char *s = NULL;
    if (r && cu->get_error_string(r, &s)) s = NULL;
    fprintf(stderr, "mptc: could not capture the step as a CUDA graph (%s: %s); its kernels are "
            "launched one by one\n", call, why ? why : s ? s : "unknown error");
}

/* Records the step's launches into x->graph_exec. A failure turns graphs
 * off (a kernel that truly fails fails again when launched directly). */
static void capture(mpt_exec *x, const mpt_cu_api *cu, const mpt_lt_api *lt) {
    char why[512] = "";
    mpt_cu_result r = cu->stream_begin_capture(x->stream, MPT_CU_CAPTURE_THREAD_LOCAL);
    if (r) {
        graphs_off(x, cu, "cuStreamBeginCapture", r, NULL);
        return;
    }
    int failed = 0;
    for (int i = 0; i < x->n_steps && !failed; i++)
        failed = launch(x, cu, lt, &x->steps[i], why, sizeof why) != 0;
    mpt_cu_graph gr = NULL;
    r = cu->stream_end_capture(x->stream, &gr); /* ends it in every case */
    if (failed || r || !gr) {
        if (gr) cu->graph_destroy(gr);
        graphs_off(x, cu, failed ? "a launch" : "cuStreamEndCapture", r, failed ? why : NULL);
        return;
    }
    r = cu->graph_instantiate(&x->graph_exec, gr, 0);
    if (r) {
        cu->graph_destroy(gr);
        x->graph_exec = NULL;
        graphs_off(x, cu, "cuGraphInstantiate", r, NULL);
        return;
    }
    x->graph = gr;
}

static int cuda_run(mpt_exec *x, const mpt_tensor *inputs, mpt_tensor *vars, mpt_tensor *outputs,
                    char *err, size_t n) {
    const mpt_cu_api *cu = mpt_cuda_driver(0, err, n);
    const mpt_lt_api *lt = mpt_cuda_cublaslt(NULL, 0);
    const mpt_graph *g = x->plan->g;
    int n_out_done = 0;
    if (!cu) return -1;
    MPT_CU_CHECK(cu->ctx_set_current(x->ctx), "");
    for (int k = 0; k < mpt_graph_n_inputs(g); k++) {
        mpt_cu_deviceptr to = x->buf[mpt_graph_input_node(g, k)];
        size_t bytes = mpt_tensor_bytes(&inputs[k]);
        if (x->staged_data && x->staged_data[k] && x->staged_data[k] == inputs[k].data)
            MPT_CU_CHECK(cu->memcpy_dtod(to, x->staged + (mpt_cu_deviceptr)(x->staged_in[k] *
                                                                         x->staged_half +
                                                                         x->staged_off[k]),
                                         bytes), "");
        else
            MPT_CU_CHECK(cu->memcpy_htod(to, inputs[k].data, bytes), "");
        if (x->staged_data) x->staged_data[k] = NULL;
    }
    /* a sharing step's variables are current where the train step's are */
    int vars_current = x->vars_on_device || (x->shared_from && x->shared_from->vars_on_device);
    if (!vars_current && upload_vars(x, cu, vars, err, n)) goto fail;
    int timed = x->events && x->prof_steps >= 0;
    int sync_each = kernel_hook || x->sync_each;
    /* a profile times kernel by kernel; the hook reads each one's outputs */
    int graph = x->graphs && !x->events && !sync_each;
    if (graph && !x->graph_exec) capture(x, cu, lt);
    int replayed = graph && x->graph_exec;
    if (replayed)
        MPT_CU_CHECK(cu->graph_launch(x->graph_exec, x->stream),
                     "MPTC_CUDA_GRAPHS=0 launches the kernels one by one");
    for (int i = 0; !replayed && i < x->n_steps; i++) {
        if (timed) MPT_CU_CHECK(cu->event_record(x->events[i], x->stream), "");
        if (mpt_cuda_coll_wait(x, cu, i, err, n) || launch(x, cu, lt, &x->steps[i], err, n))
            goto fail;
        if (!sync_each) continue;
        char hint[400];
        snprintf(hint, sizeof hint, "kernel %d (%s) failed on the GPU; `mptc ptx` writes its "
                 "source", i, x->plan->kernels[i].name);
        MPT_CU_CHECK(cu->ctx_synchronize(), hint);
        if (kernel_hook) kernel_hook(kernel_hook_ctx, x, i);
    }
    if (!replayed && mpt_cuda_coll_wait(x, cu, x->n_steps, err, n)) goto fail;
    if (timed) MPT_CU_CHECK(cu->event_record(x->events[x->n_steps], x->stream), "");
    /* the next step's batch, on its way while these kernels run */
    int turn = x->staged_turn, uploaded = 0;
    for (int k = 0; x->next_data && k < mpt_graph_n_inputs(g); k++) {
        if (!x->next_data[k]) continue;
        mpt_cu_deviceptr to = x->staged + (mpt_cu_deviceptr)(turn * x->staged_half + x->staged_off[k]);
        MPT_CU_CHECK(cu->memcpy_htod_async(to, x->next_data[k],
                                           (size_t)node_bytes(g, mpt_graph_input_node(g, k)),
                                           x->copy_stream), "");
        x->staged_data[k] = x->next_data[k];
        x->staged_in[k] = turn;
        x->next_data[k] = NULL;
        uploaded = 1;
    }
    if (uploaded) x->staged_turn = 1 - turn;
    MPT_CU_CHECK(cu->ctx_synchronize(), "a kernel faulted; MPTC_CUDA_SYNC=1 synchronizes after "
                 "every kernel and names the one that faults; --no-xla narrows it further");
    if (timed)
        for (int i = 0; i < x->n_steps; i++) {
            float ms = 0;
            MPT_CU_CHECK(cu->event_elapsed_time(&ms, x->events[i], x->events[i + 1]), "");
            x->steps[i].ms += ms;
        }
    if (x->events) x->prof_steps++;
    /* outputs first: an output may be a variable this step updates */
    for (int k = 0; k < g->n_outputs; k++) {
        int node = g->outputs[k].node;
        if (mpt_tensor_alloc(&outputs[k], g->nodes[node].dtype, g->nodes[node].shape)) {
            snprintf(err, n, "out of memory for output %s", g->outputs[k].name);
            goto fail;
        }
        n_out_done++;
        const mpt_node *nd = &g->nodes[node];
        if (nd->op == MPT_OP_CONST) { /* folded into the kernels; no buffer */
            for (int64_t i = 0; i < mpt_shape_numel(nd->shape); i++) mpt_tensor_set(&outputs[k], i, nd->attr.f);
            continue;
        }
        if (!x->buf[node]) {
            snprintf(err, n, "output %s has no device buffer", g->outputs[k].name);
            goto fail;
        }
        MPT_CU_CHECK(cu->memcpy_dtoh(outputs[k].data, x->buf[node], mpt_tensor_bytes(&outputs[k])), "");
    }
    /* updates not computed in place land now, the held ones after all reads */
    for (int i = 0; i < g->n_updates; i++) {
        int v = g->updates[i].value;
        if (x->stage_off[i] >= 0 && g->nodes[v].op == MPT_OP_VARIABLE)
            MPT_CU_CHECK(cu->memcpy_dtod(x->stage + (mpt_cu_deviceptr)x->stage_off[i], x->buf[v],
                                         (size_t)node_bytes(g, v)), "");
    }
    for (int i = 0; i < g->n_updates; i++) {
        int var = g->updates[i].var, v = g->updates[i].value;
        if (x->in_place[i] || v == var) continue;
        mpt_cu_deviceptr src = x->stage_off[i] >= 0 ? x->stage + (mpt_cu_deviceptr)x->stage_off[i] : x->buf[v];
        MPT_CU_CHECK(cu->memcpy_dtod(x->buf[var], src, (size_t)node_bytes(g, var)), "");
    }
    if (g->n_updates) x->device_newer = 1;
    return 0;
fail:
    for (int k = 0; k < n_out_done; k++) mpt_tensor_free(&outputs[k]);
    /* a batch named for after a failed step is not read later */
    for (int k = 0; x->next_data && k < mpt_graph_n_inputs(g); k++) x->next_data[k] = NULL;
    return -1;
}

/* backend.h's stage_next: the buffers and the stream on first use; 0
 * where the driver lacks async copies or a tensor is not an input's size */
static int cuda_stage_next(mpt_exec *x, const mpt_tensor *next, char *err, size_t n) {
    const mpt_cu_api *cu = mpt_cuda_driver(0, err, n);
    const mpt_graph *g = x->plan->g;
    int ni = mpt_graph_n_inputs(g);
    if (!cu) return -1;
    /* MPTC_CUDA_STAGE=0: every batch uploads as run() is called (A/B) */
    const char *env = getenv("MPTC_CUDA_STAGE");
    if (!cu->memcpy_htod_async || !x->stream || ni == 0 || (env && strcmp(env, "0") == 0)) return 0;
    for (int k = 0; k < ni; k++)
        if (!next[k].data ||
            (int64_t)mpt_tensor_bytes(&next[k]) != node_bytes(g, mpt_graph_input_node(g, k)))
            return 0;
    MPT_CU_CHECK(cu->ctx_set_current(x->ctx), "");
    if (!x->staged) {
        x->staged_off = calloc((size_t)ni, sizeof *x->staged_off);
        x->next_data = calloc((size_t)ni, sizeof *x->next_data);
        x->staged_data = calloc((size_t)ni, sizeof *x->staged_data);
        x->staged_in = calloc((size_t)ni, sizeof *x->staged_in);
        if (!x->staged_off || !x->next_data || !x->staged_data || !x->staged_in) {
            snprintf(err, n, "out of memory");
            return -1;
        }
        int64_t total = 0;
        for (int k = 0; k < ni; k++) {
            x->staged_off[k] = total;
            total += (node_bytes(g, mpt_graph_input_node(g, k)) + 255) / 256 * 256;
        }
        MPT_CU_CHECK(cu->stream_create(&x->copy_stream, 0), "");
        x->staged_half = total;
        if (dev_alloc(x, cu, &x->staged, 2 * total, err, n)) return -1;
    }
    for (int k = 0; k < ni; k++) x->next_data[k] = next[k].data;
    return 1;
fail:
    return -1;
}

static int cuda_pull_vars(mpt_exec *x, mpt_tensor *vars, char *err, size_t n) {
    const mpt_cu_api *cu = mpt_cuda_driver(0, err, n);
    const mpt_graph *g = x->plan->g;
    if (!x->device_newer) return 0;
    if (!cu) return -1;
    MPT_CU_CHECK(cu->ctx_set_current(x->ctx), "");
    for (int k = 0; k < mpt_graph_n_variables(g); k++)
        MPT_CU_CHECK(cu->memcpy_dtoh(vars[k].data, x->buf[mpt_graph_variable_node(g, k)],
                                     mpt_tensor_bytes(&vars[k])), "");
    x->device_newer = 0;
    return 1;
fail:
    return -1;
}

static void cuda_push_vars(mpt_exec *x) {
    x->vars_on_device = 0;
    x->device_newer = 0;
    if (x->sharer) x->sharer->vars_on_device = 0; /* same buffers, same news */
}

static int cuda_share_vars(mpt_exec *x, mpt_exec *from, const int *from_var, char *err, size_t n) {
    const mpt_graph *g = x->plan->g, *fg = from->plan->g;
    const mpt_cu_api *cu = mpt_cuda_driver(0, err, n);
    const mpt_lt_api *lt = mpt_cuda_cublaslt(NULL, 0);
    if (!cu) return -1;
    /* a captured graph holds the variables' old addresses: no sharing then */
    if (g->n_updates || x->shared_from || x->sharer || from->sharer || x->graph_exec) return 0;
    /* only variables live in arena 1, and every one must match */
    for (int b = 0; b < x->plan->n_buffers; b++) {
        const mpt_buffer *B = &x->plan->buffers[b];
        if (B->arena == 1 && g->nodes[B->node].op != MPT_OP_VARIABLE) return 0;
    }
    for (int k = 0; k < mpt_graph_n_variables(g); k++) {
        const mpt_node *a = &g->nodes[mpt_graph_variable_node(g, k)];
        int f = from_var[k];
        if (f < 0 || f >= mpt_graph_n_variables(fg)) return 0;
        const mpt_node *b = &fg->nodes[mpt_graph_variable_node(fg, f)];
        if (a->dtype != b->dtype || !mpt_shape_eq(a->shape, b->shape)) return 0;
    }
    for (int k = 0; k < mpt_graph_n_variables(g); k++)
        x->buf[mpt_graph_variable_node(g, k)] = from->buf[mpt_graph_variable_node(fg, from_var[k])];
    for (int i = 0; i < g->n_nodes; i++) /* views of variables follow them */
        if (g->nodes[mpt_plan_storage(x->plan, i)].op == MPT_OP_VARIABLE)
            x->buf[i] = x->buf[mpt_plan_storage(x->plan, i)];
    /* cuBLASLt descriptors took the bias address at compile time */
    for (int i = 0; i < x->n_steps; i++) {
        cuda_step *s = &x->steps[i];
        if (!s->is_lt || s->call.bias < 0 ||
            g->nodes[mpt_plan_storage(x->plan, s->call.bias)].op != MPT_OP_VARIABLE)
            continue;
        void *bp = (void *)(uintptr_t)x->buf[s->call.bias];
        MPT_LT_CHECK(lt->matmul_desc_set_attribute(s->desc, MPT_LT_DESC_BIAS_POINTER, &bp, sizeof bp), "");
    }
    if (x->arena[1]) {
        MPT_CU_CHECK(cu->ctx_set_current(x->ctx), "");
        MPT_CU_CHECK(cu->mem_free(x->arena[1]), "");
        x->arena[1] = 0;
        x->device_bytes -= x->arena_bytes[1];
        x->arena_bytes[1] = 0;
    }
    x->shared_from = from;
    from->sharer = x;
    x->vars_on_device = 0;
    return 1;
fail:
    return -1;
}

mpt_backend mpt_backend_cuda = {
    .name = "cuda",
    .available = cuda_available,
    .compile = cuda_compile,
    .run = cuda_run,
    .free = cuda_free,
    .pull_vars = cuda_pull_vars,
    .push_vars = cuda_push_vars,
    .share_vars = cuda_share_vars,
    .stage_next = cuda_stage_next,
};
