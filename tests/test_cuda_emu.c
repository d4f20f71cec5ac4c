/* tests/test_cuda_emu.c — every generated CUDA kernel of the examples'
 * train and evaluation steps, run on the host, against the interpreter.
 *
 * The CUDA backend's kernels only run on a GPU; this test runs the same
 * CUDA C on the CPU (tests/cuda_emu.h: g++ with tests/cuda_host.hpp, the
 * inline PTX replaced by its definition in the PTX ISA), kernel by kernel:
 * each kernel's inputs are the interpreter's values of those nodes, and
 * its outputs must match the interpreter's within the per-dtype tolerance
 * below. Buffers end at an inaccessible page, and outputs start as NaN
 * (unless the kernel zeroes them), so an out-of-bounds access or an
 * element left unwritten fails. Models: mlp_small (dense, softmax
 * cross-entropy), convnet_small (convolutions, pooling, batch norm),
 * text_tiny (embedding, layer norm, dropout, gelu, Adam) and
 * tests/models/resblock (1x1 convolutions, residual adds) and
 * tests/models/odd_dense (odd widths), under float32,
 * mixed_float16 and mixed_bfloat16, fused and unfused, at batch 7 so no
 * GEMM tile is full. The plans are those without cuBLASLt
 * (MPTC_LIBCUBLASLT=none): every GEMM generated with its whole fused
 * epilogue, so the Tensor Core tiles are covered. A first pass over the
 * plans collects their kernels, whose codes are then compiled for the host
 * all at once, each once (a kernel in several plans, or train and
 * evaluation steps, is the same host build); the second pass runs them. A
 * launch identical to one made before (same build, launch and input bytes,
 * compared with the same values) is counted without running again (see
 * launch_seen; EMU_EVERY_LAUNCH=1 runs every one).
 *
 * What this cannot check is what only hardware shows: the inline PTX
 * itself (NVRTC and tests/test_cuda_ptx.c cover its syntax), timing, and
 * races a GPU would expose between threads that the host runs in turn.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen/cuda/cuda.h"
#include "fusion/fusion.h"
#include "runtime/train/train.h"
#include "tests/attention.h"
#include "tests/check.h"
#include "tests/cuda_emu.h"

/* ---- tolerances: |got - ref| <= atol + rtol |ref| ---- */

/* terms summed into each output element: K of a GEMM, batch_matmul or
 * convolution, the reduced elements of a reduction, 1 for element-wise
 * kernels */
static double terms_of(const mpt_graph *g, const mpt_kernel *k) {
    if (k->root < 0) return 1;
    const mpt_node *r = &g->nodes[k->root];
    double out = (double)mpt_shape_numel(r->shape);
    if (k->kind == MPT_KERNEL_GEMM || k->kind == MPT_KERNEL_CONV ||
        r->op == MPT_OP_BATCH_MATMUL)
        return mpt_kernel_flops(g, k) / (2 * out);
    if (k->kind == MPT_KERNEL_REDUCTION && r->n_in > 0)
        return (double)mpt_shape_numel(g->nodes[r->in[0]].shape) / out;
    return 1;
}

/* |got - ref| <= atol + rtol |ref|, with atol = a * terms * max |ref| over
 * the output. The kernels compute in f32 where the interpreter computes in
 * double and rounds each value to its dtype:
 * - rtol: one rounding of the output's dtype apart (2^-10 for f16, 2^-7
 *   for bf16, with room for two), or a few f32 ulps for f32 outputs (host libm's expf/logf/tanhf/erff are within 2 ulps);
 * - atol: a sum of `terms` f32 values is within about terms * 2^-24 of the
 *   magnitudes summed, which cancellation can leave much larger than the
 *   result, and later factors in the same kernel scale (layer norm's
 *   backward pass multiplies such a sum by rstd^3, softmax minus one-hot
 *   leaves 0 where double leaves 1e-8). The values summed are O(1) in
 *   these models, or bounded by the output's largest value: a = 2^-24 * 32
 *   of the larger, per term. An indexing error moves values by the size of
 *   the values themselves, far above this.
 * An f32 output computed from f16/bf16 values inside the kernel gets their
 * rtol: those values can round one ulp apart (a bf16 convolution's output
 * cast to f32). */
static mpt_dtype coarsest(const mpt_graph *g, const mpt_kernel *k, mpt_dtype dt) {
    for (int i = 0; i < k->n_nodes; i++) {
        mpt_dtype d = g->nodes[k->nodes[i]].dtype;
        if (d == MPT_DT_BF16 || (d == MPT_DT_F16 && dt != MPT_DT_BF16)) dt = d;
    }
    return dt;
}

/* A TF32 Tensor Core kernel (--tf32) rounds its f32 operands to 10-bit
 * mantissas (2^-11 relative each) before multiplying; the interpreter does
 * not. Each product is then off by up to 2^-10 of its size, and K such
 * independent errors add up to about sqrt(K) of them: rtol 2^-10 and atol 4
 * sqrt(K) 2^-10 of the largest value (four standard deviations). An
 * indexing error still moves values by their own size. */
static void tolerance_tf32(double terms, double max_ref, double *atol, double *rtol) {
    *rtol = 1.0 / 1024;
    *atol = 4 * sqrt(terms) / 1024 * fmax(max_ref, 1.0);
}

static int is_tf32(const mpt_graph *g, const mpt_kernel *k, int tf32) {
    return tf32 && (k->kind == MPT_KERNEL_GEMM || k->kind == MPT_KERNEL_CONV) &&
           g->nodes[g->nodes[k->root].in[0]].dtype == MPT_DT_F32;
}

static void tolerance(mpt_dtype dt, double terms, double max_ref, double *atol, double *rtol) {
    double a = 2e-6 * terms * fmax(max_ref, 1.0);
    switch (dt) {
    case MPT_DT_F32: *atol = a; *rtol = 1e-5; return;
    /* f16 subnormals are 2^-24 apart: one of those absolute */
    case MPT_DT_F16: *atol = a + 6e-8; *rtol = 2e-3; return;
    case MPT_DT_BF16: *atol = a; *rtol = 1.6e-2; return;
    /* integers and bools exactly */
    case MPT_DT_I32: case MPT_DT_BOOL: *atol = 0; *rtol = 0; return;
    case MPT_DT_F64: case MPT_DT_COUNT: break;
    }
    *atol = *rtol = 0;
}

/* ---- the interpreter's value of every node ---- */

/* ---- one plan ---- */

static int kernels_run, kernels_total, kernels_scratch;
static int mma_narrow; /* the 256 x 32 tile of narrow f16/bf16 GEMMs */
static int rows_on_x, rows_on_x_split, rows_on_x_phased, rows_on_x_wide;
static int simt_wide, simt_wide_split, simt_wide_phased, simt_wide_64;
/* Tensor Core kernels by how they load and sum: cp.async chunks, operands
 * read element by element, tiles read by ldmatrix.trans, split along k */
static int mma_cp_async, mma_by_element, mma_trans, mma_split_k, kernels_split_k;
/* strided data gradients taken by phase (classes of dx's pixels) */
static int kernels_phased, mma_tf32;
static int epilogue_flags, epilogue_flags_split; /* kernels with a reduce_all in the epilogue */
/* wgmma kernels (MPTC_CUDA_WGMMA=1): all, split k, by phase, 256 x 32, operands by element */
static int wg_kernels, wg_split, wg_phased, wg_narrow, wg_by_element;
/* their flags, as the interpreter has them: both values must be seen */
static long long flags_true, flags_false;
static double loss_scale_set; /* nonzero: the dynamic loss scale's value for the step */
/* Tensor Core epilogues storing pairs of neighbours (N even) or single elements */
static int mma_pairs, mma_singles;
static double build_s, run_s;
/* the first pass over the plans only queues their kernels' codes for one
 * build of them all (tests/cuda_emu.h: emu_add); the second runs them */
static int collecting;

/* Launches made so far, each as a hash of what it ran (the host build, its
 * launch, the bytes of its inputs, of its outputs and scratch before it,
 * the regions' sizes) and a hash of what its outputs were compared with
 * (the interpreter's values, the tolerances' terms): a launch made again
 * with both the same (a plan's evaluation step, or the same kernels under
 * another loss scale, with TF32 or wgmma GEMMs, or row tiles on x beside
 * them) would compute the same bytes and compare them the same way, so
 * it counts as run without running. Only launches that passed are kept.
 * That holds because a launch reads nothing else: the host build is one
 * function per code for the whole process (cuda_emu.h keeps its shared
 * objects loaded, so the pointer names the code), every parameter is a
 * buffer of its own filled here (the interpreter's value, or the output
 * fill), scratch is made NaN before every kernel (its size and offset are
 * hashed), the counters' bytes are hashed, the generated code keeps no
 * __device__ globals, and the host runs blocks and threads in a fixed
 * order. The hashes are 64-bit FNV-1a: two different launches of the
 * ~12000 would be taken for one with odds of about 1 in 10^11.
 * EMU_EVERY_LAUNCH=1 runs and compares every launch all the same. */
typedef struct {
    unsigned long long ran, compared;
} launch_seen;
static launch_seen *seen;
static int n_seen, cap_seen, launches_again, every_launch;

static unsigned long long fnv_bytes(unsigned long long h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void compare_output(const char *what, const mpt_graph *g, const mpt_kernel *K, int node,
                           const void *buf, const mpt_tensor *ref, int tf32) {
    const mpt_node *nd = &g->nodes[node];
    mpt_tensor got = {.dtype = nd->dtype, .shape = nd->shape, .data = (void *)buf};
    int64_t n = mpt_shape_numel(nd->shape), bad = 0, first = -1;
    double atol, rtol, max_ref = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(mpt_tensor_get(ref, i))) max_ref = fmax(max_ref, fabs(mpt_tensor_get(ref, i)));
    tolerance(nd->dtype, terms_of(g, K), max_ref, &atol, &rtol);
    if (nd->dtype == MPT_DT_F32) {
        double a2, r2;
        tolerance(coarsest(g, K, MPT_DT_F32), terms_of(g, K), max_ref, &a2, &r2);
        rtol = r2;
    }
    if (tf32) tolerance_tf32(terms_of(g, K), max_ref, &atol, &rtol);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = mpt_tensor_get(&got, i), b = mpt_tensor_get(ref, i);
        double d = fabs(a - b);
        int ok = (isnan(a) && isnan(b)) || a == b || d <= atol + rtol * fabs(b);
        if (!ok && first < 0) first = i;
        bad += !ok;
        if (ok && d / (atol + rtol * fabs(b)) > worst) worst = d / (atol + rtol * fabs(b));
    }
    CHECK_MSG(bad == 0, "%s kernel %s output %%%d (%s %s): %lld of %lld differ; first [%lld] "
              "cuda %.9g, interp %.9g", what, K->name, node, mpt_op_name(nd->op),
              mpt_dtype_name(nd->dtype), (long long)bad, (long long)n, (long long)first,
              first >= 0 ? mpt_tensor_get(&got, first) : 0.0,
              first >= 0 ? mpt_tensor_get(ref, first) : 0.0);
    if (getenv("EMU_VERBOSE"))
        printf("  %-40s %%%-5d %-5s worst %.3f of the tolerance\n", K->name, node,
               mpt_dtype_name(nd->dtype), worst);
}

/* An output's bytes before a launch: what the executor fills (zeros,
 * true flags), else NaN */
static int output_fill(const mpt_cuda_kernel_src *s, int j) {
    int fill = mpt_cuda_output_fill(s, j);
    return fill >= 0 ? fill : 0xff;
}

static void run_plan(const char *what, const mpt_plan *p) {
    const mpt_graph *g = p->g;
    char err[1024];
    if (collecting) {
        mpt_cuda_kernel_src s;
        int added = 0;
        for (int k = 0; k < p->n_kernels; k++) {
            if (mpt_cuda_emit_kernel(p, k, &s, err, sizeof err)) continue; /* said in the run */
            added |= emu_add(&s, 1);
            mpt_cuda_kernel_src_free(&s);
        }
        CHECK_MSG(added == 0, "%s: out of memory", what);
        return;
    }
    int ni = mpt_graph_n_inputs(g), nv = mpt_graph_n_variables(g);
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in), *vars = calloc((size_t)nv + 1, sizeof *vars);
    mpt_tensor *outs = calloc((size_t)g->n_outputs + 1, sizeof *outs);
    mpt_tensor *vals = calloc((size_t)g->n_nodes, sizeof *vals);
    mpt_cuda_kernel_src *src = calloc((size_t)p->n_kernels + 1, sizeof *src);
    emu_fill_inputs(g, in, 17);
    mpt_init_variables(g, vars, 3);
    for (int k = 0; loss_scale_set && k < nv; k++) {
        const char *name = g->nodes[mpt_graph_variable_node(g, k)].name;
        if (name && strcmp(name, "loss_scale/scale") == 0)
            mpt_tensor_set(&vars[k], 0, loss_scale_set);
    }
    mpt_interp_opts io = {.on_node = emu_capture, .ctx = vals};
    int rc = mpt_interp_run(g, in, vars, outs, &io, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: interpreter: %s", what, err);
    for (int k = 0; rc == 0 && k < p->n_kernels; k++) {
        rc = mpt_cuda_emit_kernel(p, k, &src[k], err, sizeof err);
        CHECK_MSG(rc == 0, "%s: %s", what, err);
    }
    emu_module m;
    if (rc == 0) {
        double t0 = now_s();
        rc = emu_build(&m, src, p->n_kernels, err, sizeof err);
        build_s += now_s() - t0;
        CHECK_MSG(rc == 0, "%s: %s", what, err);
    }
    /* One scratch and one counters region for all kernels, as the executor
     * gives them: the largest of each. Counters are zeroed once; scratch is
     * made NaN before every kernel, which must write it before reading. */
    size_t scratch_max = 0, counters_max = 0;
    for (int k = 0; rc == 0 && k < p->n_kernels; k++) {
        if (src[k].scratch_bytes > scratch_max) scratch_max = src[k].scratch_bytes;
        if (src[k].counter_bytes > counters_max) counters_max = src[k].counter_bytes;
    }
    void *scratch_map = NULL, *counters_map = NULL;
    size_t scratch_len = 0, counters_len = 0;
    float *scratch = scratch_max ? emu_buffer(scratch_max, &scratch_map, &scratch_len) : NULL;
    unsigned *counters = counters_max ? emu_buffer(counters_max, &counters_map, &counters_len)
                                      : NULL;
    if (counters) memset(counters, 0, counters_max);
    for (int k = 0; rc == 0 && k < p->n_kernels; k++) {
        const mpt_cuda_kernel_src *s = &src[k];
        void **args = calloc((size_t)s->n_params + 2, sizeof *args);
        void **maps = calloc((size_t)s->n_params + 2, sizeof *maps);
        size_t *lens = calloc((size_t)s->n_params + 2, sizeof *lens);
        int ok = args && maps && lens;
        for (int j = 0; ok && j < s->n_params; j++) {
            int node = s->params[j];
            const mpt_node *nd = &g->nodes[node];
            size_t bytes = (size_t)mpt_shape_numel(nd->shape) * mpt_dtype_size(nd->dtype);
            args[j] = emu_buffer(bytes, &maps[j], &lens[j]);
            if (!args[j]) { ok = 0; break; }
            if (j < s->n_inputs) {
                CHECK_MSG(vals[node].data != NULL, "%s: %%%d has no value", what, node);
                if (vals[node].data) memcpy(args[j], vals[node].data, bytes);
            } else {
                memset(args[j], output_fill(s, j), bytes);
            }
        }
        int n_args = s->n_params;
        /* the kernel's own sizes at the end of the shared regions, so a
         * read or write past them faults on the guard page */
        if (s->scratch_bytes) {
            memset(scratch, 0xff, scratch_max);
            args[n_args++] = (char *)scratch + (scratch_max - s->scratch_bytes);
        }
        if (s->counter_bytes) args[n_args++] = (char *)counters + (counters_max - s->counter_bytes);
        ok = ok && (!s->scratch_bytes || scratch) && (!s->counter_bytes || counters);
        CHECK(ok);
        /* the launch's hashes (launch_seen) */
        unsigned long long ran = 1469598103934665603ull, compared = ran;
        if (ok) {
            ran = fnv_bytes(ran, &m.run[k], sizeof m.run[k]);
            ran = fnv_bytes(ran, m.dims[k], sizeof m.dims[k]);
            size_t sizes[5] = {(size_t)s->n_params, s->scratch_bytes, scratch_max,
                               s->counter_bytes, counters_max};
            ran = fnv_bytes(ran, sizes, sizeof sizes);
            for (int j = 0; j < s->n_params; j++) {
                const mpt_node *nd = &g->nodes[s->params[j]];
                size_t bytes = (size_t)mpt_shape_numel(nd->shape) * mpt_dtype_size(nd->dtype);
                ran = fnv_bytes(ran, &bytes, sizeof bytes);
                ran = fnv_bytes(ran, args[j], bytes);
            }
            if (counters) ran = fnv_bytes(ran, counters, counters_max);
            int tf32 = is_tf32(g, &p->kernels[k], p->tf32);
            double terms = terms_of(g, &p->kernels[k]);
            mpt_dtype dt = coarsest(g, &p->kernels[k], MPT_DT_F32);
            compared = fnv_bytes(compared, &tf32, sizeof tf32);
            compared = fnv_bytes(compared, &terms, sizeof terms);
            compared = fnv_bytes(compared, &dt, sizeof dt);
            for (int j = s->n_inputs; j < s->n_params; j++) {
                const mpt_tensor *ref = &vals[s->params[j]];
                compared = fnv_bytes(compared, &ref->dtype, sizeof ref->dtype);
                if (ref->data) compared = fnv_bytes(compared, ref->data, mpt_tensor_bytes(ref));
            }
            int again = 0;
            for (int i = 0; i < n_seen && !again && !every_launch; i++)
                again = seen[i].ran == ran && seen[i].compared == compared;
            if (again) {
                for (int j = s->n_inputs; j < s->n_params; j++) {
                    const mpt_tensor *ref = &vals[s->params[j]];
                    int64_t nf = (s->set_true >> j & 1) ? mpt_shape_numel(ref->shape) : 0;
                    for (int64_t i = 0; i < nf; i++) {
                        flags_true += mpt_tensor_get(ref, i) != 0;
                        flags_false += mpt_tensor_get(ref, i) == 0;
                    }
                }
                kernels_run++;
                launches_again++;
                ok = 0;
            }
        }
        int failed_before = check_failures;
        if (ok) {
            fflush(stdout);
            double t0 = now_s();
            int lr = emu_launch(&m, k, args, err, sizeof err);
            /* a kernel with counters must leave them zero, for the next
             * kernel and its own next launch: run it again on outputs and
             * scratch made NaN, and compare that run */
            int reran = lr == 0 && s->counter_bytes;
            for (int j = s->n_inputs; reran && j < s->n_params; j++)
                memset(args[j], output_fill(s, j),
                       (size_t)mpt_shape_numel(g->nodes[s->params[j]].shape) *
                           mpt_dtype_size(g->nodes[s->params[j]].dtype));
            if (reran) {
                memset(scratch, 0xff, scratch_max);
                lr = emu_launch(&m, k, args, err, sizeof err);
            }
            size_t nonzero = 0;
            for (size_t c = 0; lr == 0 && c < counters_max / 4; c++) nonzero += counters[c] != 0;
            CHECK_MSG(nonzero == 0, "%s kernel %s left %zu counters nonzero", what, s->name,
                      nonzero);
            run_s += now_s() - t0;
            if (getenv("EMU_VERBOSE"))
                printf("  %.3f s %s grid %u,%u block %u\n", now_s() - t0, s->name, s->grid[0], s->grid[1], s->block[0]);
            CHECK_MSG(lr == 0, "%s kernel %s: %s", what, s->name, err);
            kernels_run += lr == 0;
            for (int j = s->n_inputs; lr == 0 && j < s->n_params; j++) {
                const mpt_tensor *ref = &vals[s->params[j]];
                int64_t nf = (s->set_true >> j & 1) ? mpt_shape_numel(ref->shape) : 0;
                for (int64_t i = 0; i < nf; i++) {
                    flags_true += mpt_tensor_get(ref, i) != 0;
                    flags_false += mpt_tensor_get(ref, i) == 0;
                }
                compare_output(what, g, &p->kernels[k], s->params[j], args[j], &vals[s->params[j]],
                               is_tf32(g, &p->kernels[k], p->tf32));
            }
            if (lr == 0 && check_failures == failed_before) {
                if (n_seen == cap_seen) {
                    cap_seen = cap_seen ? 2 * cap_seen : 1024;
                    seen = realloc(seen, (size_t)cap_seen * sizeof *seen);
                }
                if (seen) seen[n_seen++] = (launch_seen){ran, compared};
            }
        }
        kernels_total++;
        kernels_scratch += s->counter_bytes != 0;
        kernels_split_k += s->grid[2] > 1;
        kernels_phased += s->phases > 0;
        epilogue_flags += s->set_true != 0;
        wg_kernels += s->wgmma;
        wg_split += s->wgmma && s->grid[2] > 1;
        wg_phased += s->wgmma && s->phases > 0;
        wg_narrow += s->wgmma && s->tile_m == 256;
        wg_by_element += s->wgmma && s->source && strstr(s->source, "by element");
        epilogue_flags_split += s->set_true != 0 && s->grid[2] > 1;
        if (strstr(s->source, "16x16 threads of 8x")) { /* emit_simt.c's wide tile */
            simt_wide++;
            simt_wide_split += s->grid[2] > 1;
            simt_wide_phased += s->phases > 0;
            simt_wide_64 += strstr(s->source, "128x64 block tile") != NULL;
        }
        if (strstr(s->source, "row tiles along grid.x")) {
            rows_on_x++;
            rows_on_x_wide += strstr(s->source, "16x16 threads of 8x") != NULL;
            rows_on_x_split += s->grid[2] > 1;
            rows_on_x_phased += s->phases > 0;
        }
        if (s->tensor_cores) {
            mma_cp_async += strstr(s->source, "mpt_cp16(&") != NULL;
            mma_by_element += strstr(s->source, "element by element") != NULL;
            mma_trans += strstr(s->source, ".trans.") != NULL;
            mma_split_k += s->grid[2] > 1;
            mma_tf32 += strstr(s->source, ".tf32.tf32.") != NULL;
            mma_pairs += strstr(s->source, "o1 = o0 + 1") != NULL;
            mma_narrow += strstr(s->source, "256x32 block tile") != NULL;
            mma_singles += strstr(s->source, "o1 = o0 + 1") == NULL;
        }
        for (int j = 0; j < n_args; j++)
            if (maps && maps[j]) munmap(maps[j], lens[j]);
        free(args);
        free(maps);
        free(lens);
    }
    if (scratch_map) munmap(scratch_map, scratch_len);
    if (counters_map) munmap(counters_map, counters_len);
    if (rc == 0) emu_free(&m);
    for (int k = 0; k < p->n_kernels; k++) mpt_cuda_kernel_src_free(&src[k]);
    for (int i = 0; i < g->n_nodes; i++) mpt_tensor_free(&vals[i]);
    for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    for (int k = 0; k < nv; k++) mpt_tensor_free(&vars[k]);
    for (int k = 0; rc == 0 && k < g->n_outputs; k++) mpt_tensor_free(&outs[k]);
    free(src), free(vals), free(in), free(vars), free(outs);
}

static void run_model(const char *path, const char *policy, int xla, int tf32) {
    mpt_compile_opts o = {.path = path, .policy = policy, .batch_size = 7, .xla = xla,
                          .device = "cuda", .want_eval = 1, .plan_only = 1, .tf32 = tf32,
                          .diag = stderr};
    mpt_session *s = NULL;
    CHECK_MSG(mpt_session_open(&o, &s) == 0, "%s %s", path, policy);
    if (!s) return;
    char what[256];
    snprintf(what, sizeof what, "%s %s%s %s train", path, policy, tf32 ? " --tf32" : "",
             xla ? "fused" : "unfused");
    if (!collecting) printf("%s: %d kernels\n", what, s->train_plan->n_kernels);
    run_plan(what, s->train_plan);
    if (s->eval_plan) {
        snprintf(what, sizeof what, "%s %s%s %s eval", path, policy, tf32 ? " --tf32" : "",
                 xla ? "fused" : "unfused");
        if (!collecting) printf("%s: %d kernels\n", what, s->eval_plan->n_kernels);
        run_plan(what, s->eval_plan);
    }
    mpt_session_free(s);
}

/* Slice and concat in generated CUDA C: an LSTM-like cell ([x, h] joined,
 * one matmul, its output split into two gates) and 3-D joins along the
 * first and a middle axis, with the gradient of all of it (zeros-padded
 * concats, slices of dy), in each float dtype, fused and unfused. Widths
 * are odd so the vector loop's lanes cross the join. */
static void run_slice_concat(void) {
    static const mpt_dtype dts[] = {MPT_DT_F32, MPT_DT_F16, MPT_DT_BF16};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        mpt_dtype dt = dts[d];
        mpt_graph *g = mpt_graph_new("slice_concat");
        int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(7, 13));
        int h = mpt_b_input(g, "h", MPT_DT_F32, mpt_shape_2(7, 6));
        int t = mpt_b_input(g, "t", MPT_DT_F32, mpt_shape_make(3, (int64_t[]){3, 4, 5}));
        int w = mpt_b_variable(g, "w", mpt_shape_2(19, 10), MPT_INIT_GLOROT_UNIFORM, 19, 10, 0, 1);
        int xh = mpt_b_concat(g, mpt_b_cast(g, x, dt), mpt_b_cast(g, h, dt), 1);
        int z = mpt_b_matmul(g, xh, mpt_b_cast(g, w, dt), 0, 0);
        int gate = mpt_b_binary(g, MPT_OP_MUL, mpt_b_unary(g, MPT_OP_SIGMOID, mpt_b_slice(g, z, 1, 0, 5)),
                                mpt_b_unary(g, MPT_OP_TANH, mpt_b_slice(g, z, 1, 5, 5)));
        int tc = mpt_b_cast(g, t, dt);
        int mid = mpt_b_concat(g, mpt_b_slice(g, tc, 1, 1, 2), tc, 1);     /* [3,6,5] */
        int first = mpt_b_concat(g, mid, mpt_b_slice(g, mid, 0, 2, 1), 0); /* [4,6,5] */
        int sq = mpt_b_unary(g, MPT_OP_SQUARE, first);
        int y = mpt_b_binary(g, MPT_OP_ADD, mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_cast(g, gate, MPT_DT_F32), 0x3),
                             mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_cast(g, sq, MPT_DT_F32), 0x7));
        int wrt[3] = {x, t, w}, grads[3];
        char err[256];
        CHECK(mpt_autodiff(g, y, -1, wrt, 3, grads, err, sizeof err) == 0);
        mpt_graph_add_output(g, "gate", gate);
        mpt_graph_add_output(g, "first", first);
        mpt_graph_add_output(g, "dx", grads[0]);
        mpt_graph_add_output(g, "dt", grads[1]);
        mpt_graph_add_output(g, "dw", grads[2]);
        for (int xla = 1; xla >= 0; xla--) {
            mpt_fusion_opts fo;
            mpt_fusion_opts_default(&fo);
            fo.enabled = xla;
            mpt_plan *p = mpt_fuse(g, &fo);
            char what[96];
            snprintf(what, sizeof what, "slice/concat %s %s", mpt_dtype_name(dt), xla ? "fused" : "unfused");
            if (!collecting) printf("%s: %d kernels\n", what, p->n_kernels);
            run_plan(what, p);
            mpt_plan_free(p);
        }
        mpt_graph_free(g);
    }
}

/* batch_matmul in generated CUDA C: attention (a scaled softmax between
 * two batch_matmuls) and its gradient, whose batch_matmuls take the flags
 * nn, nt and tn, rank 4 [2,3,7,33] and rank 3 [3,33,7] (T and D odd), in
 * each float dtype, fused and unfused; and the four trans combinations
 * alone at rank 3. */
static void run_batch_matmul(void) {
    static const mpt_dtype dts[] = {MPT_DT_F32, MPT_DT_F16, MPT_DT_BF16};
    static const int64_t shapes[2][4] = {{2, 3, 7, 33}, {3, 33, 7}};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        for (int sh = 0; sh < 2; sh++) {
            mpt_graph *g = mpt_graph_new("attention");
            CHECK(attention_graph(g, dts[d], mpt_shape_make(sh ? 3 : 4, shapes[sh]), 1) == 0);
            for (int xla = 1; xla >= 0; xla--) {
                mpt_fusion_opts fo;
                mpt_fusion_opts_default(&fo);
                fo.enabled = xla;
                mpt_plan *p = mpt_fuse(g, &fo);
                char what[96];
                snprintf(what, sizeof what, "attention rank %d %s %s", sh ? 3 : 4,
                         mpt_dtype_name(dts[d]), xla ? "fused" : "unfused");
                if (!collecting) printf("%s: %d kernels\n", what, p->n_kernels);
                run_plan(what, p);
                mpt_plan_free(p);
            }
            mpt_graph_free(g);
        }
        mpt_graph *g = mpt_graph_new("batch_matmul");
        int64_t M = 7, N = 5, K = 9;
        int a = mpt_b_cast(g, mpt_b_input(g, "a", MPT_DT_F32, mpt_shape_make(3, (const int64_t[]){2, M, K})), dts[d]);
        int at = mpt_b_cast(g, mpt_b_input(g, "at", MPT_DT_F32, mpt_shape_make(3, (const int64_t[]){2, K, M})), dts[d]);
        int b = mpt_b_cast(g, mpt_b_input(g, "b", MPT_DT_F32, mpt_shape_make(3, (const int64_t[]){2, K, N})), dts[d]);
        int bt = mpt_b_cast(g, mpt_b_input(g, "bt", MPT_DT_F32, mpt_shape_make(3, (const int64_t[]){2, N, K})), dts[d]);
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                mpt_graph_add_output(g, ta ? (tb ? "tt" : "tn") : (tb ? "nt" : "nn"),
                                     mpt_b_batch_matmul(g, ta ? at : a, tb ? bt : b, ta, tb));
        mpt_fusion_opts fo;
        mpt_fusion_opts_default(&fo);
        mpt_plan *p = mpt_fuse(g, &fo);
        char what[96];
        snprintf(what, sizeof what, "batch_matmul %s", mpt_dtype_name(dts[d]));
        if (!collecting) printf("%s: %d kernels\n", what, p->n_kernels);
        run_plan(what, p);
        mpt_plan_free(p);
        mpt_graph_free(g);
    }
}

/* Every plan of the test: the examples' and test models' train and
 * evaluation steps under each policy, fused and unfused, and the variants
 * below; argv[1], when given, picks the models (or slice_concat,
 * batch_matmul) whose name holds it. */
static void run_plans(int argc, char **argv) {
    const char *models[] = {"examples/mlp_small.mpt", "examples/convnet_small.mpt",
                            "examples/text_tiny.mpt", "tests/models/resblock.mpt",
                            "tests/models/odd_dense.mpt", "tests/models/strided.mpt",
                            "tests/models/wide_f32.mpt"};
    const char *policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
    if (argc < 2 || strstr("slice_concat", argv[1])) run_slice_concat();
    if (argc < 2 || strstr("batch_matmul", argv[1])) run_batch_matmul();
    for (size_t m = 0; m < sizeof models / sizeof *models; m++)
        for (size_t p = 0; p < sizeof policies / sizeof *policies; p++)
            for (int xla = 1; xla >= 0; xla--) {
                if (argc > 1 && !strstr(models[m], argv[1])) continue;
                run_model(models[m], policies[p], xla, 0);
            }
    /* float32 under --tf32: its GEMMs and convolutions on TF32 Tensor Cores */
    for (size_t m = 0; m < sizeof models / sizeof *models; m++)
        if (argc < 2 || strstr(models[m], argv[1])) run_model(models[m], "float32", 1, 1);
    /* row tiles along grid.x, as where there are more than grid.y's 65535:
     * the strided model (split-K, phases), the residual block and the wide
     * fp32 tiles, with the swap taken from 2 row tiles on */
    setenv("MPTC_CUDA_MAX_GRID_Y", "1", 1);
    for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
        if (argc > 1 && !strstr(models[m], argv[1])) continue;
        if (strstr(models[m], "strided") || strstr(models[m], "resblock"))
            run_model(models[m], "mixed_float16", 1, 0);
        if (strstr(models[m], "strided") || strstr(models[m], "resblock") ||
            strstr(models[m], "wide_f32"))
            run_model(models[m], "float32", 1, 0);
    }
    unsetenv("MPTC_CUDA_MAX_GRID_Y");
    /* a loss scale too large for some of the f16 weight gradients, so that
     * the epilogues' finite checks find some columns false */
    loss_scale_set = atof(getenv("LS") ? getenv("LS") : "1e6");
    for (size_t m = 0; m < sizeof models / sizeof *models; m++)
        if (argc < 2 || strstr(models[m], argv[1])) run_model(models[m], "mixed_float16", 1, 0);
    loss_scale_set = 0;
    /* sm_90's wgmma kernels (shared-memory descriptors, warpgroups) */
    setenv("MPTC_CUDA_WGMMA", "1", 1);
    /* f16 and bf16 by turns over the models (both for a named model) */
    for (size_t m = 0; m < sizeof models / sizeof *models; m++)
        if (argc < 2 || strstr(models[m], argv[1])) {
            if (argc > 1 || m % 2 == 0) run_model(models[m], "mixed_float16", 1, 0);
            if (argc > 1 || m % 2 == 1) run_model(models[m], "mixed_bfloat16", 1, 0);
        }
    unsetenv("MPTC_CUDA_WGMMA");
}

int main(int argc, char **argv) {
    /* the plans as without cuBLASLt: every GEMM generated, with its whole
     * fused epilogue (with cuBLASLt, matmuls keep only bias, relu and cast;
     * test_cuda_steps runs those plans) */
    setenv("MPTC_LIBCUBLASLT", "none", 1);
    every_launch = getenv("EMU_EVERY_LAUNCH") && atoi(getenv("EMU_EVERY_LAUNCH"));
    if (system("g++ --version > /dev/null 2>&1") != 0) {
        printf("skip: no g++ to compile the generated CUDA C for the host\n");
        return 77;
    }
    /* every kernel's code compiled at once (g++ on every core, each code
     * once), then the plans run; where that build fails, each plan builds
     * what it runs, so the failures name their plans */
    collecting = 1;
    run_plans(argc, argv);
    char err[1024];
    double t0 = now_s();
    if (emu_build_pending(err, sizeof err)) {
        printf("building every kernel at once failed (%s); building plan by plan\n", err);
        emu_pending_clear();
    }
    build_s += now_s() - t0;
    collecting = 0;
    run_plans(argc, argv);
    printf("wgmma kernels: %d (%d split k, %d by phase, %d with the 256x32 tile, %d reading an "
           "operand by element)\n", wg_kernels, wg_split, wg_phased, wg_narrow, wg_by_element);
    if (argc == 1)
        CHECK(wg_kernels > 0 && wg_split > 0 && wg_phased > 0 && wg_narrow > 0 &&
              wg_by_element > 0);
    printf("fp32 CUDA-core kernels with the wide tile: %d (%d of them 128x64, %d split k, %d by "
           "phase)\n", simt_wide, simt_wide_64, simt_wide_split, simt_wide_phased);
    if (argc == 1)
        CHECK(simt_wide > simt_wide_64 && simt_wide_64 > 0 && simt_wide_split > 0 &&
              simt_wide_phased > 0);
    printf("%d kernels with their row tiles along grid.x (%d of them split k, %d by phase, %d "
           "wide fp32)\n", rows_on_x, rows_on_x_split, rows_on_x_phased, rows_on_x_wide);
    if (argc == 1)
        CHECK(rows_on_x > 0 && rows_on_x_split > 0 && rows_on_x_phased > 0 && rows_on_x_wide > 0);
    printf("%d of %d kernels ran on the host (%ld different codes compiled, %.1f s; %.1f s "
           "running them; %d launches the same as an earlier one, counted without running "
           "again)\n", kernels_run, kernels_total, emu_kernels_compiled, build_s, run_s,
           launches_again);
    CHECK(kernels_run == kernels_total);
    /* the split reductions (partials in scratch, the last block combining)
     * must be among them: the models' batch norms over 7 images are */
    printf("%d of them keep counters (split-K, split reductions), all in one shared region\n",
           kernels_scratch);
    if (argc == 1) CHECK(kernels_scratch > 0);
    /* the loss scale's finite check of the weight gradients, in the
     * gradient kernels' epilogues (mixed_float16) */
    printf("kernels with a reduce_all in the epilogue: %d (%d of them split k)\n", epilogue_flags,
           epilogue_flags_split);
    printf("their flags: %lld true, %lld false\n", flags_true, flags_false);
    if (argc == 1) CHECK(epilogue_flags > 0 && epilogue_flags_split > 0);
    if (argc == 1) CHECK(flags_true > 0 && flags_false > 0);
    printf("Tensor Core epilogues: %d store pairs, %d single elements\n", mma_pairs, mma_singles);
    printf("Tensor Core kernels with the 256x32 tile (at most 32 columns): %d\n", mma_narrow);
    if (argc == 1) CHECK(mma_narrow > 0);
    printf("Tensor Core kernels: %d load by cp.async, %d element by element, %d use "
           "ldmatrix.trans, %d split k, %d TF32; %d kernels in all split k, %d strided data "
           "gradients by phase\n", mma_cp_async, mma_by_element, mma_trans, mma_split_k, mma_tf32,
           kernels_split_k, kernels_phased);
    if (argc == 1) {
        CHECK(mma_cp_async > 0);
        CHECK(mma_by_element > 0);
        CHECK(mma_trans > 0);
        CHECK(mma_split_k > 0);
        CHECK(kernels_phased > 0);
        CHECK(mma_tf32 > 0);
        CHECK(mma_pairs > 0 && mma_singles > 0);
        CHECK(kernels_split_k > mma_split_k);
    }
    return check_exit("test_cuda_emu");
}
