/* tests/test_cuda_exec.c — the CUDA backend's host side, on a machine
 * without a GPU: the backend runs against the recording driver of
 * tests/fake/cuda.c (device memory is host memory, kernels do not run),
 * with the real NVRTC compiling every kernel. What it checks:
 *   - memory: the memory plan's arenas, one allocation each; every buffer
 *     a kernel touches lies in device memory, values alive at the same time
 *     never share bytes, in-place updates write over their variable;
 *   - traffic: a step uploads its inputs and downloads its outputs; the
 *     variables are uploaded once and read back only when the host asks
 *     (mpt_session_pull_vars), which makes the evaluation step re-read them;
 *   - --profile: one row per kernel, from CUDA events;
 *   - failures: a launch error and a step that does not fit in the GPU's
 *     memory give messages, not crashes.
 * The numbers the kernels compute are checked on a real GPU by
 * test_cuda_gpu; here they are not computed at all.
 */
#include <dlfcn.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "codegen/cuda/cuda.h"
#include "runtime/cuda/cuda.h"
#include "runtime/train/train.h"
#include "tests/fake/fake.h"

static fake_cuda_counts (*fake_stats)(void);
static int (*fake_valid)(unsigned long long p, size_t bytes);

static int64_t bytes_of(const mpt_graph *g, int node) {
    const mpt_node *nd = &g->nodes[node];
    return mpt_shape_numel(nd->shape) * (int64_t)mpt_dtype_size(nd->dtype);
}

static int64_t var_bytes(const mpt_graph *g) {
    int64_t b = 0;
    for (int k = 0; k < mpt_graph_n_variables(g); k++) b += bytes_of(g, mpt_graph_variable_node(g, k));
    return b;
}

static int64_t input_bytes(const mpt_graph *g) {
    int64_t b = 0;
    for (int k = 0; k < mpt_graph_n_inputs(g); k++) b += bytes_of(g, mpt_graph_input_node(g, k));
    return b;
}

/* the generated kernels' scratch and counters (split reductions' and
 * split-K GEMMs' partial sums), which the step holds beside the plan's
 * arenas: one region of each for all kernels, the largest kernel's; an
 * over-count where cuBLASLt takes a GEMM */
static int64_t scratch_bytes(const mpt_plan *p) {
    int64_t s = 0, c = 0;
    for (int k = 0; k < p->n_kernels; k++) {
        mpt_cuda_kernel_src src;
        char err[512];
        if (mpt_cuda_emit_kernel(p, k, &src, err, sizeof err)) continue;
        if ((int64_t)src.scratch_bytes > s) s = (int64_t)src.scratch_bytes;
        if ((int64_t)src.counter_bytes > c) c = (int64_t)src.counter_bytes;
        mpt_cuda_kernel_src_free(&src);
    }
    return (s + 255) / 256 * 256 + (c + 255) / 256 * 256;
}

static int64_t output_bytes(const mpt_graph *g) {
    int64_t b = 0;
    for (int k = 0; k < g->n_outputs; k++) /* constants are filled on the host */
        if (g->nodes[g->outputs[k].node].op != MPT_OP_CONST) b += bytes_of(g, g->outputs[k].node);
    return b;
}

static mpt_session *open_cuda(const char *path, const char *policy, long batch, int xla, FILE *diag) {
    mpt_compile_opts o = {.path = path, .policy = policy, .batch_size = batch,
                          .xla = xla, .device = "cuda", .want_eval = 1, .diag = diag};
    mpt_session *s = NULL;
    if (mpt_session_open(&o, &s)) return NULL;
    if (mpt_session_init_state(s, 1)) {
        mpt_session_free(s);
        return NULL;
    }
    return s;
}

static void alloc_io(const mpt_graph *g, mpt_tensor **in, mpt_tensor **out) {
    int ni = mpt_graph_n_inputs(g);
    *in = calloc((size_t)ni + 1, sizeof **in);
    *out = calloc((size_t)g->n_outputs + 1, sizeof **out);
    for (int k = 0; k < ni; k++) {
        const mpt_node *nd = &g->nodes[mpt_graph_input_node(g, k)];
        mpt_tensor_alloc(&(*in)[k], nd->dtype, nd->shape);
    }
}

static void free_io(const mpt_graph *g, mpt_tensor *in, mpt_tensor *out) {
    for (int k = 0; k < mpt_graph_n_inputs(g); k++) mpt_tensor_free(&in[k]);
    free(in);
    free(out);
}

static void free_outputs(const mpt_graph *g, mpt_tensor *out) {
    for (int k = 0; k < g->n_outputs; k++) mpt_tensor_free(&out[k]);
}

/* every value a kernel touches has a buffer in device memory; values alive
 * at the same time (by the plan's lifetimes) never overlap */
static void check_placement(const mpt_session *s, const mpt_exec *x) {
    const mpt_plan *p = s->train_plan;
    const mpt_graph *g = p->g;
    int bad = 0;
    for (int k = 0; k < p->n_kernels; k++) {
        const mpt_kernel *K = &p->kernels[k];
        for (int i = 0; i < K->n_inputs + K->n_outputs; i++) {
            int q = i < K->n_inputs ? K->inputs[i] : K->outputs[i - K->n_inputs];
            if (g->nodes[q].op == MPT_OP_CONST || g->nodes[q].op == MPT_OP_IOTA) continue;
            unsigned long long a = mpt_cuda_exec_buffer(x, q);
            if (!a || !fake_valid(a, (size_t)bytes_of(g, q))) bad++;
        }
    }
    CHECK_MSG(bad == 0, "%d kernel buffers outside device memory", bad);
    int overlaps = 0;
    for (int i = 0; i < p->n_buffers; i++)
        for (int j = i + 1; j < p->n_buffers; j++) {
            const mpt_buffer *A = &p->buffers[i], *B = &p->buffers[j];
            if (A->arena || B->arena || A->last < B->first || B->last < A->first) continue;
            unsigned long long a = mpt_cuda_exec_buffer(x, A->node), b = mpt_cuda_exec_buffer(x, B->node);
            if (a < b + (unsigned long long)B->bytes && b < a + (unsigned long long)A->bytes) overlaps++;
        }
    /* an in-place update's value shares its variable's buffer on purpose;
     * no two values of arena 0 do */
    CHECK_MSG(overlaps == 0, "%d pairs of live values overlap", overlaps);
    int in_place = 0;
    for (int i = 0; i < g->n_updates; i++) {
        int shared = mpt_cuda_exec_buffer(x, g->updates[i].value) == mpt_cuda_exec_buffer(x, g->updates[i].var);
        in_place += shared;
        if (shared) CHECK(mpt_plan_update_in_place(p, i));
    }
    int64_t dev;
    int priv, n_in_place;
    mpt_cuda_exec_memory(x, &dev, &priv, &n_in_place);
    CHECK_MSG(priv == 0, "%d values needed a buffer outside the plan's arenas", priv);
    CHECK(n_in_place == in_place);
    CHECK_MSG(in_place > 0, "no update of %s was computed in place", g->name);
    /* arena 0 at the plan's peak: less than a buffer per value would take */
    int64_t per_value = 0;
    for (int b = 0; b < p->n_buffers; b++)
        if (p->buffers[b].arena == 0) per_value += p->buffers[b].bytes;
    CHECK_MSG(p->peak_bytes < per_value, "peak %lld, per value %lld", (long long)p->peak_bytes,
              (long long)per_value);
    CHECK_MSG(dev <= p->peak_bytes + var_bytes(g) + input_bytes(g) + scratch_bytes(p) +
                         (32 << 20) + 4096,
              "the step holds %lld device bytes", (long long)dev);
}

static void test_traffic(const char *path, const char *policy, int xla) {
    FILE *prof = tmpfile();
    mpt_cuda_profile(prof);
    mpt_session *s = open_cuda(path, policy, 8, xla, stderr);
    mpt_cuda_profile(NULL);
    CHECK_MSG(s != NULL, "session on the test driver (%s, %s)", path, policy);
    if (!s) return;
    CHECK(strcmp(s->backend->name, "cuda") == 0);
    const mpt_graph *g = s->train;
    char err[1024] = "";
    check_placement(s, s->train_exec);

    mpt_tensor *in, *out;
    alloc_io(g, &in, &out);
    fake_cuda_counts c0 = fake_stats();
    int steps = 3, ok = 1;
    for (int i = 0; i < steps && ok; i++) {
        ok = s->backend->run(s->train_exec, in, s->vars, out, err, sizeof err) == 0;
        CHECK_MSG(ok, "step %d: %s", i, err);
        if (ok) free_outputs(g, out);
    }
    fake_cuda_counts c1 = fake_stats();
    CHECK(c1.bad_calls == c0.bad_calls);
    CHECK_MSG(c1.htod_bytes - c0.htod_bytes == steps * input_bytes(g) + var_bytes(g),
              "uploaded %lld bytes in %d steps: inputs %lld per step, variables %lld",
              c1.htod_bytes - c0.htod_bytes, steps, (long long)input_bytes(g), (long long)var_bytes(g));
    CHECK_MSG(c1.dtoh_bytes - c0.dtoh_bytes == steps * output_bytes(g), "downloaded %lld bytes",
              c1.dtoh_bytes - c0.dtoh_bytes);
    CHECK(c1.launches + c1.matmuls - c0.launches - c0.matmuls == (long long)steps * s->train_plan->n_kernels);
    /* with cuBLASLt, fusion leaves every matmul of the MLP bias, relu and
     * cast epilogues only (MPT_FUSE_GEMM_EXTRA): all of them run there */
    if (strstr(path, "mlp")) {
        int gemms = 0;
        for (int k = 0; k < s->train_plan->n_kernels; k++) gemms += s->train_plan->kernels[k].kind == MPT_KERNEL_GEMM;
        CHECK_MSG(gemms > 0 && c1.matmuls - c0.matmuls == (long long)steps * gemms,
                  "%s %s: %lld cuBLASLt calls in %d steps of %d GEMM kernels", path, policy,
                  c1.matmuls - c0.matmuls, steps, gemms);
    }

    /* the host asks for the variables: one download, then none */
    CHECK(mpt_session_pull_vars(s, err, sizeof err) == 0);
    fake_cuda_counts c2 = fake_stats();
    CHECK(c2.dtoh_bytes - c1.dtoh_bytes == var_bytes(g));
    CHECK(mpt_session_pull_vars(s, err, sizeof err) == 0);
    CHECK(fake_stats().dtoh_bytes == c2.dtoh_bytes);

    /* the evaluation step reads the train step's variable buffers: it
     * uploads only its inputs, before and after a pull */
    const mpt_graph *e = s->eval;
    for (int k = 0; k < mpt_graph_n_variables(e); k++)
        CHECK(mpt_cuda_exec_buffer(s->eval_exec, mpt_graph_variable_node(e, k)) ==
              mpt_cuda_exec_buffer(s->train_exec, mpt_graph_variable_node(g, s->eval_var[k])));
    mpt_tensor *ein, *eout;
    alloc_io(e, &ein, &eout);
    mpt_tensor *ev = calloc((size_t)mpt_graph_n_variables(e) + 1, sizeof *ev);
    for (int k = 0; k < mpt_graph_n_variables(e); k++) ev[k] = s->vars[s->eval_var[k]];
    for (int i = 0; i < 2; i++) {
        fake_cuda_counts a = fake_stats();
        int rc = s->backend->run(s->eval_exec, ein, ev, eout, err, sizeof err);
        CHECK_MSG(rc == 0, "%s", err);
        if (rc == 0) free_outputs(e, eout);
        long long up = fake_stats().htod_bytes - a.htod_bytes;
        CHECK_MSG(up == input_bytes(e), "eval run %d uploaded %lld", i, up);
    }
    CHECK(s->backend->run(s->train_exec, in, s->vars, out, err, sizeof err) == 0);
    free_outputs(g, out);
    CHECK(mpt_session_pull_vars(s, err, sizeof err) == 0);
    fake_cuda_counts a = fake_stats();
    CHECK(s->backend->run(s->eval_exec, ein, ev, eout, err, sizeof err) == 0);
    free_outputs(e, eout);
    CHECK(fake_stats().htod_bytes - a.htod_bytes == input_bytes(e));
    /* host copies changed: the evaluation step uploads its variables once
     * (into the shared buffers), the train step all of them */
    s->backend->push_vars(s->train_exec);
    a = fake_stats();
    CHECK(s->backend->run(s->eval_exec, ein, ev, eout, err, sizeof err) == 0);
    free_outputs(e, eout);
    CHECK(s->backend->run(s->eval_exec, ein, ev, eout, err, sizeof err) == 0);
    free_outputs(e, eout);
    CHECK_MSG(fake_stats().htod_bytes - a.htod_bytes == 2 * input_bytes(e) + var_bytes(e),
              "eval after push uploaded %lld", fake_stats().htod_bytes - a.htod_bytes);

    /* host copies changed (a checkpoint restored): the next step uploads them */
    s->backend->push_vars(s->train_exec);
    a = fake_stats();
    CHECK(s->backend->run(s->train_exec, in, s->vars, out, err, sizeof err) == 0);
    free_outputs(g, out);
    CHECK(fake_stats().htod_bytes - a.htod_bytes == input_bytes(g) + var_bytes(g));

    /* a launch that fails: a message naming the call and a hint */
    if (fake_stats().launches > 0) {
        char n[32];
        snprintf(n, sizeof n, "%lld", fake_stats().launches + 2);
        setenv("FAKE_CUDA_FAIL_LAUNCH", n, 1);
        int rc = s->backend->run(s->train_exec, in, s->vars, out, err, sizeof err);
        unsetenv("FAKE_CUDA_FAIL_LAUNCH");
        CHECK(rc != 0);
        CHECK_MSG(strstr(err, "launch_kernel") && strstr(err, "hint:") && strstr(err, "LAUNCH_FAILED"),
                  "%s", err);
    }
    free(ev);
    free_io(e, ein, eout);
    free_io(g, in, out);
    int n_kernels = s->train_plan->n_kernels;
    mpt_session_free(s);
    CHECK(fake_stats().live_allocs == 0);

    /* --profile: a header and one row per kernel of the train step */
    rewind(prof);
    char line[1024];
    int rows = -1, header = 0, layers = 0, ceilings = 0;
    while (fgets(line, sizeof line, prof)) {
        if (getenv("SHOW_PROFILE")) fputs(line, stderr);
        /* the measured ceilings: the copy and the four GEMMs ran (the
         * recording driver's clock moves 10 us per matmul, not per copy) */
        if (strncmp(line, "ceilings: f16 ", 14) == 0 && !strstr(line, "not measured") &&
            !strstr(line, "f16 0.0,") && !strstr(line, "tf32 0.0 "))
            ceilings++;
        if (strncmp(line, "ceilings:", 9) == 0) continue;
        if (strncmp(line, "cuda profile of ", 16) == 0) {
            if (++header == 1) rows = 0;
            continue;
        }
        if (strstr(line, "per layer:")) layers = 1;
        if (header == 1 && !layers && rows >= 0 && strstr(line, " TF/s ")) rows++;
        if (header == 1 && !layers && rows >= 0 && strstr(line, " GB/s ")) rows++;
    }
    fclose(prof);
    CHECK_MSG(header == 2, "%d profile tables (train and evaluation steps)", header);
    CHECK_MSG(rows == n_kernels, "%d profile rows, %d kernels", rows, n_kernels);
    CHECK(layers);
    CHECK_MSG(ceilings == 2, "%d ceiling lines", ceilings);
}

/* --tf32: the f32 GEMMs cuBLASLt runs compute in CUBLAS_COMPUTE_32F_FAST_TF32,
 * none without it, and no f16 one with it */
static void test_tf32(void) {
    const char *policies[] = {"float32", "float32", "mixed_float16"};
    long long made[3];
    for (int i = 0; i < 3; i++) {
        mpt_compile_opts o = {.path = "examples/mlp_small.mpt", .policy = policies[i],
                              .batch_size = 32, .xla = 1, .device = "cuda", .tf32 = i != 1,
                              .diag = stderr};
        long long before = fake_stats().tf32_descs;
        mpt_session *s = NULL;
        CHECK_MSG(mpt_session_open(&o, &s) == 0, "%s tf32 %d", policies[i], o.tf32);
        made[i] = fake_stats().tf32_descs - before;
        mpt_session_free(s);
    }
    CHECK_MSG(made[0] >= 3 && made[1] == 0 && made[2] == 0,
              "TF32 descriptors: float32 --tf32 %lld, float32 %lld, mixed_float16 --tf32 %lld",
              made[0], made[1], made[2]);
}

/* cuBLASLt's heuristic is asked once per call shape in a process: a
 * second session of the same model asks nothing, and its calls run */
static void test_heuristic_memo(void) {
    long long asked[2], calls[2], prepared = 0;
    mpt_cuda_lt_forget();
    for (int i = 0; i < 2; i++) {
        long long h0 = fake_stats().heuristics, m0 = fake_stats().matmuls;
        mpt_session *s = open_cuda("examples/mnist_mlp.mpt", "mixed_float16", 16, 1, stderr);
        CHECK(s != NULL);
        if (!s) return;
        mpt_tensor *in, *out;
        alloc_io(s->train, &in, &out);
        char err[1024] = "";
        int rc = s->backend->run(s->train_exec, in, s->vars, out, err, sizeof err);
        CHECK_MSG(rc == 0, "%s", err);
        if (rc == 0) free_outputs(s->train, out);
        free_io(s->train, in, out);
        /* the calls both steps prepared: the evaluation step's forward GEMMs
         * have the train step's shapes */
        for (int p = 0; i == 0 && p < 2; p++) {
            const mpt_plan *pl = p ? s->eval_plan : s->train_plan;
            for (int k = 0; pl && k < pl->n_kernels; k++) {
                mpt_lt_call c;
                prepared += mpt_cuda_match_lt(pl->g, &pl->kernels[k], &c) == NULL;
            }
        }
        mpt_session_free(s);
        asked[i] = fake_stats().heuristics - h0;
        calls[i] = fake_stats().matmuls - m0;
    }
    printf("cuBLASLt heuristic asked %lld times for %lld calls, then %lld times\n", asked[0],
           prepared, asked[1]);
    CHECK_MSG(asked[0] > 0 && asked[0] < prepared && asked[1] == 0 && calls[0] >= 8 &&
                  calls[1] == calls[0],
              "heuristic asked %lld then %lld times for %lld calls; %lld then %lld matmuls",
              asked[0], asked[1], prepared, calls[0], calls[1]);
}

/* a step larger than the GPU: a message with the batch that fits */
static void test_out_of_memory(void) {
    char *buf = NULL;
    size_t len = 0;
    FILE *diag = open_memstream(&buf, &len);
    setenv("FAKE_CUDA_MEM", "200000000", 1);
    mpt_session *s = open_cuda("examples/mlp_small.mpt", "float32", 65536, 1, diag);
    unsetenv("FAKE_CUDA_MEM");
    fclose(diag);
    CHECK(s == NULL);
    mpt_session_free(s);
    CHECK_MSG(buf && strstr(buf, "out of memory") && strstr(buf, "the GPU has") &&
                  strstr(buf, "hint: --batch-size"),
              "%s", buf ? buf : "(nothing)");
    free(buf);
    CHECK(fake_stats().live_allocs == 0);

    /* past the session's estimate: the backend's own check */
    s = open_cuda("examples/mlp_small.mpt", "float32", 64, 1, stderr);
    CHECK(s != NULL);
    if (!s) return;
    char err[1024] = "";
    setenv("FAKE_CUDA_MEM", "1000000", 1);
    mpt_exec *x = s->backend->compile(s->train_plan, err, sizeof err);
    unsetenv("FAKE_CUDA_MEM");
    CHECK(x == NULL);
    CHECK_MSG(strstr(err, "out of GPU memory") && strstr(err, "hint:"), "%s", err);
    if (x) s->backend->free(x);
    mpt_session_free(s);
}

/* Does every input buffer on the (fake) device hold batch in's values? */
static int device_holds(const mpt_session *s, const mpt_tensor *in) {
    const mpt_graph *g = s->train;
    for (int k = 0; k < mpt_graph_n_inputs(g); k++) {
        mpt_cu_deviceptr p = mpt_cuda_exec_buffer(s->train_exec, mpt_graph_input_node(g, k));
        if (!p || memcmp((const void *)(uintptr_t)p, in[k].data, mpt_tensor_bytes(&in[k])) != 0)
            return 0;
    }
    return 1;
}

/* stage_next: the named batch goes up during the step before the one that
 * reads it (an async upload, not captured in the step's graph), each byte
 * once; a run given other tensors uploads those and drops the staged copy. */
static void test_staging(void) {
    mpt_session *s = open_cuda("examples/mlp_small.mpt", "mixed_float16", 8, 1, stderr);
    CHECK(s != NULL);
    if (!s) return;
    const mpt_graph *g = s->train;
    int ni = mpt_graph_n_inputs(g);
    mpt_tensor *a, *b, *c, *out;
    alloc_io(g, &a, &out);
    free(out);
    alloc_io(g, &b, &out);
    free(out);
    alloc_io(g, &c, &out);
    for (int k = 0; k < ni; k++) {
        memset(a[k].data, 0x11, mpt_tensor_bytes(&a[k]));
        memset(b[k].data, 0x22, mpt_tensor_bytes(&b[k]));
        memset(c[k].data, 0x33, mpt_tensor_bytes(&c[k]));
    }
    char err[1024] = "";
    int64_t in_b = input_bytes(g);
    fake_cuda_counts c0 = fake_stats();
    CHECK(s->backend->stage_next(s->train_exec, b, err, sizeof err) == 1);
    CHECK_MSG(s->backend->run(s->train_exec, a, s->vars, out, err, sizeof err) == 0, "%s", err);
    free_outputs(g, out);
    fake_cuda_counts c1 = fake_stats();
    CHECK(device_holds(s, a));
    CHECK(c1.htod_async_bytes - c0.htod_async_bytes == in_b);               /* b, staged */
    CHECK(c1.htod_bytes - c0.htod_bytes == 2 * in_b + var_bytes(g));        /* a, b, variables */
    /* b was staged: it goes up no more; a is staged for the run after */
    CHECK(s->backend->stage_next(s->train_exec, a, err, sizeof err) == 1);
    CHECK_MSG(s->backend->run(s->train_exec, b, s->vars, out, err, sizeof err) == 0, "%s", err);
    free_outputs(g, out);
    fake_cuda_counts c2 = fake_stats();
    CHECK(device_holds(s, b));
    CHECK(c2.htod_bytes - c1.htod_bytes == in_b && c2.htod_async_bytes - c1.htod_async_bytes == in_b);
    CHECK(c2.dtod_bytes - c1.dtod_bytes >= in_b);
    /* c was not staged (a was): c goes up as run() is called */
    CHECK_MSG(s->backend->run(s->train_exec, c, s->vars, out, err, sizeof err) == 0, "%s", err);
    free_outputs(g, out);
    fake_cuda_counts c3 = fake_stats();
    CHECK(device_holds(s, c));
    CHECK(c3.htod_bytes - c2.htod_bytes == in_b && c3.htod_async_bytes == c2.htod_async_bytes);
    /* ... and a staged copy is read once: a, staged for c's run, uploads */
    CHECK_MSG(s->backend->run(s->train_exec, a, s->vars, out, err, sizeof err) == 0, "%s", err);
    free_outputs(g, out);
    CHECK(device_holds(s, a) && fake_stats().htod_bytes - c3.htod_bytes == in_b);
    /* a tensor of another size is not staged */
    mpt_tensor small = {0};
    mpt_tensor_alloc(&small, a[0].dtype, mpt_shape_1(1));
    mpt_tensor saved = a[0];
    a[0] = small;
    CHECK(s->backend->stage_next(s->train_exec, a, err, sizeof err) == 0);
    a[0] = saved;
    mpt_tensor_free(&small);
    CHECK(fake_stats().bad_calls == c0.bad_calls);
    free_io(g, a, out);
    free_io(g, b, NULL);
    free_io(g, c, NULL);
    mpt_session_free(s);
}

int main(int argc, char **argv) {
    char why[512];
    if (!mpt_cuda_nvrtc(why, sizeof why)) {
        printf("skipped: the CUDA backend's tests need NVRTC: %s\n", why);
        return 77;
    }
    void *h = fake_cuda_load(argv[0]);
    fake_stats = h ? (fake_cuda_counts(*)(void))dlsym(h, "fake_cuda_stats") : NULL;
    fake_valid = h ? (int (*)(unsigned long long, size_t))dlsym(h, "fake_cuda_valid") : NULL;
    if (!fake_stats || !fake_valid) {
        fprintf(stderr, "the test driver lacks fake_cuda_stats\n");
        return 1;
    }
    test_traffic("examples/mlp_small.mpt", "float32", 1);
    test_traffic("examples/mlp_small.mpt", "mixed_float16", 1);
    test_traffic("examples/mlp_small.mpt", "mixed_bfloat16", 0);
    /* convolutions, pooling, batch norm; kernels that zero their outputs */
    test_traffic("examples/convnet_small.mpt", "float32", 1);
    test_traffic("examples/convnet_small.mpt", "mixed_float16", 1);
    /* kernels of 82 buffers, as ResNet-50's all-finite check of its 161
     * gradients: launches of more than 64 (the first H100 run refused
     * them, 2026-11-27) */
    test_traffic("tests/models/deep_mlp.mpt", "mixed_float16", 1);
    test_out_of_memory();
    test_staging();
    test_tf32();
    test_heuristic_memo();
    return check_exit("test_cuda_exec");
}
