/* tests/test_cuda_nccl.c — data-parallel CUDA ranks (runtime/cuda/cuda_nccl.c)
 * on a machine without a GPU: the recording driver and NCCL of tests/fake/
 * (libfakecuda.so), the generated kernels run on the host (tests/cuda_emu.h)
 * as in test_cuda_steps.
 *
 *   - joining: the device is the local rank's (modulo the devices), rank 0
 *     makes the NCCL id and every rank initialises NCCL with the id the
 *     broadcast brought; a missing NCCL is an error with a hint;
 *   - whole train steps of rank 1 of 2 (a convnet with batch norm, a wide
 *     embedding whose gradient crosses as all-gathered ids and rows, a
 *     dropout MLP; plain and with --shard-optimizer) on the CUDA backend,
 *     its collectives NCCL calls, against the interpreter with the
 *     stand-in collective of test_dist (the other rank holds the same
 *     batch, so a sum doubles): every output of three steps and every
 *     variable after them. A sum left out, taken twice or read from the
 *     wrong buffer, a shard taken at the wrong rank or without its
 *     padding, changes them;
 *   - the NCCL calls of each step: the sums in buckets (fusion/buckets.c),
 *     each an ncclGroupStart, an in-place allreduce of every member's
 *     output and an ncclGroupEnd after its last member, on a stream of
 *     their own (or the step's, with MPTC_OVERLAP=0; or one call a sum at
 *     its kernel, with --bucket-mb 0 too); one reduce_scatter and
 *     all_gather per kernel in plan order on the step's stream; the
 *     kernels' device buffers (or the padding region where a value is not
 *     a whole number of shards), counts and dtypes, one communicator.
 *     The recording driver runs a sum only when the streams' order says
 *     it has (tests/fake/streams.c): a reader that does not wait for its
 *     bucket reads the gradient unsummed, and a sum issued before its
 *     copy is waited for is a bad call;
 *   - a one-rank communicator running a plan built for two ranks (what a
 *     single GPU can check, `--gpu`): the one-process values;
 *   - a failing NCCL call, and a plan with collectives but no communicator.
 *
 * `test_cuda_nccl --gpu` runs the one-rank steps on a real GPU with the real
 * NCCL against the interpreter (scripts/gpu_run.sh); it skips (77) where no
 * GPU or no NCCL is usable.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codegen/cuda/cuda.h"
#include "runtime/cuda/cuda.h"
#include "runtime/dist/dist.h"
#include "runtime/train/train.h"
#include "tests/check.h"
#include "tests/cuda_emu.h"
#include "tests/fake/fake.h"

static int on_gpu;
static fake_cuda_counts (*fake_stats)(void);
static fake_nccl_log_fn nccl_log;
static fake_nccl_state_fn nccl_state;
static int (*fake_unique_id)(mpt_nccl_unique_id *id);
typedef void (*register_fn)(void *function, emu_entry run, int n_params, const unsigned grid[3],
                            const unsigned block[3], unsigned shared);
static register_fn fake_register;

static char dir[] = "/tmp/mptc-test-nccl-XXXXXX";

static const char *convnet_src =
    "model dp {\n"
    "    input image: [6, 6, 2]\n"
    "    conv2d conv(filters=4, kernel=3, padding=same, activation=relu)\n"
    "    batch_norm bn\n"
    "    flatten flat\n"
    "    dense hidden(units=16, activation=relu)\n"
    "    dense logits(units=5)\n"
    "    activation predictions(softmax, dtype=float32)\n"
    "}\n"
    "train {\n"
    "    data = synthetic(shape=[6, 6, 2], classes=5, samples=64)\n"
    "    optimizer = adam(learning_rate=0.01)\n"
    "    metrics = [accuracy]\n"
    "    batch_size = 8\n"
    "}\n";

/* ---- the other rank: it holds this rank's values (test_dist's stand-in) ---- */

static int twice(void *ctx, void *buf, int64_t n, mpt_dtype dt, char *err, size_t len) {
    (void)ctx, (void)err, (void)len;
    for (int64_t i = 0; i < n; i++) ((double *)buf)[i] *= 2;
    return dt == MPT_DT_F64 ? 0 : -1;
}
static int rs_twice(void *ctx, const void *in, void *out, int64_t s, mpt_dtype dt, char *err,
                    size_t len) {
    (void)ctx, (void)err, (void)len;
    int r = mpt_collective_get()->rank;
    for (int64_t i = 0; i < s; i++) ((double *)out)[i] = 2 * ((const double *)in)[r * s + i];
    return dt == MPT_DT_F64 ? 0 : -1;
}
static int ag_same(void *ctx, const void *in, void *out, int64_t s, mpt_dtype dt, char *err,
                   size_t len) {
    (void)ctx, (void)err, (void)len;
    for (int r = 0; r < 2; r++) memcpy((double *)out + r * s, in, (size_t)s * sizeof(double));
    return dt == MPT_DT_F64 ? 0 : -1;
}
static const mpt_collective rank1_of_2 = {.rank = 1, .size = 2, .allreduce_sum = twice,
                                          .reduce_scatter = rs_twice, .all_gather = ag_same};

/* ---- broadcasts standing in for MPI's ---- */

static int n_bcast;
static mpt_nccl_unique_id sent;
/* rank 0's: records what it would send */
static int bcast_send(void *buf, int64_t bytes, char *err, size_t n) {
    n_bcast++;
    if (bytes != (int64_t)sizeof sent) {
        snprintf(err, n, "a broadcast of %lld bytes", (long long)bytes);
        return -1;
    }
    memcpy(&sent, buf, sizeof sent);
    return 0;
}
/* another rank's: receives an id rank 0 made */
static int bcast_receive(void *buf, int64_t bytes, char *err, size_t n) {
    n_bcast++;
    if (bytes != (int64_t)sizeof sent || !fake_unique_id || fake_unique_id(&sent) != 0) {
        snprintf(err, n, "no id to receive");
        return -1;
    }
    memcpy(buf, &sent, sizeof sent);
    return 0;
}

/* ---- tolerance (test_cuda_steps': three steps of f32 against double) ---- */

static mpt_dtype compute_dt = MPT_DT_F32;

static int near(mpt_dtype dt, double a, double b) {
    if (isnan(a) && isnan(b)) return 1;
    /* a GPU's f32 arithmetic flips f16/bf16 roundings now and then
     * (test_cuda_steps.c says more): there a mixed run's f32 values are
     * held to the compute dtype's bound */
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

/* Compiles plan p's generated kernels (every kernel but its collectives)
 * for the host and registers each with the driver function x launches it
 * by (test_cuda_steps.c: a kernel read from the kernel cache carries the
 * name it was first compiled under). 0 or -1. */
static int host_kernels(const char *what, const mpt_plan *p, const mpt_exec *x, emu_module *m) {
    memset(m, 0, sizeof *m);
    if (on_gpu) return 0;
    char err[1024];
    mpt_cuda_kernel_src *src = calloc((size_t)p->n_kernels + 1, sizeof *src);
    int *plan_k = calloc((size_t)p->n_kernels + 1, sizeof *plan_k); /* src[j] is kernel plan_k[j] */
    int rc = 0, n = 0;
    for (int k = 0; rc == 0 && k < p->n_kernels; k++) {
        if (mpt_cuda_kernel_is_collective(p, k)) {
            /* nor could the generator make one */
            CHECK(mpt_cuda_emit_kernel(p, k, &src[n], err, sizeof err) != 0 &&
                  strstr(err, "NCCL"));
            continue;
        }
        plan_k[n] = k;
        rc = mpt_cuda_emit_kernel(p, k, &src[n++], err, sizeof err);
        CHECK_MSG(rc == 0, "%s: %s", what, err);
    }
    if (rc == 0) {
        rc = emu_build(m, src, n, err, sizeof err);
        CHECK_MSG(rc == 0, "%s: %s", what, err);
    }
    for (int j = 0; rc == 0 && j < n; j++) {
        void *f = mpt_cuda_exec_function(x, plan_k[j]); /* NULL: cuBLASLt runs it */
        if (f)
            fake_register(f, m->run[j], src[j].n_params + (src[j].scratch_bytes != 0) +
                                            (src[j].counter_bytes != 0),
                          src[j].grid, src[j].block, src[j].shared_bytes);
    }
    free(plan_k);
    for (int k = 0; k < n; k++) mpt_cuda_kernel_src_free(&src[k]);
    free(src);
    return rc;
}

static int fake_nccl_op(mpt_op op) {
    return op == MPT_OP_ALLREDUCE        ? FAKE_NCCL_ALL_REDUCE
           : op == MPT_OP_REDUCE_SCATTER ? FAKE_NCCL_REDUCE_SCATTER
                                         : FAKE_NCCL_ALL_GATHER;
}

/* How a step's sums go (runtime/cuda/cuda_nccl.c): one call a sum at its
 * kernel (--bucket-mb 0 with MPTC_OVERLAP=0), buckets as NCCL groups on
 * the step's stream (MPTC_OVERLAP=0), or on a stream of their own */
enum { SUMS_EACH, SUMS_BUCKETS, SUMS_OVERLAP };
static int sums_mode = SUMS_OVERLAP;

/* The NCCL calls log[from, to) of one step against the plan's collective
 * kernels; counts the calls that went through the padding region */
static void check_calls(const char *what, const mpt_session *s, int from, int to, int ranks,
                        int *padded) {
    const mpt_plan *p = s->train_plan;
    const mpt_graph *g = p->g;
    const fake_nccl_call *log = NULL;
    nccl_log(&log);
    mpt_buckets bk = {0};
    CHECK(mpt_plan_buckets(p, sums_mode == SUMS_EACH ? -1 : MPT_BUCKET_BYTES_DEFAULT, &bk) == 0);
    void *sum_stream = NULL, *step_stream = NULL, *comm = NULL;
    int c = from, groups = 0;
    for (int k = 0; k < p->n_kernels; k++) {
        if (!mpt_cuda_kernel_is_collective(p, k)) continue;
        const mpt_node *nd = &g->nodes[p->kernels[k].root];
        if (nd->op == MPT_OP_RANK_SLICE) continue; /* a device copy, no NCCL */
        const mpt_bucket *b = NULL;
        for (int i = 0; sums_mode != SUMS_EACH && nd->op == MPT_OP_ALLREDUCE && i < bk.n; i++)
            for (int m = 0; m < bk.b[i].n_members; m++)
                if (bk.b[i].members[m] == k) b = &bk.b[i];
        if (b && k != b->start_after) continue; /* its sum goes with the bucket's last */
        if (c >= to) {
            CHECK_MSG(0, "%s: kernel %d %s made no NCCL call", what, k, p->kernels[k].name);
            break;
        }
        if (b) { /* the bucket: one group of in-place sums of the members' outputs */
            CHECK_MSG(log[c].op == FAKE_NCCL_GROUP_START, "%s: kernel %d: no ncclGroupStart", what, k);
            c++, groups++;
            for (int m = 0; m < b->n_members && c < to; m++, c++) {
                const fake_nccl_call *l = &log[c];
                int o = p->kernels[b->members[m]].root;
                unsigned long long out = mpt_cuda_exec_buffer(s->train_exec, o);
                CHECK_MSG(l->op == FAKE_NCCL_ALL_REDUCE && l->send == out && l->recv == out &&
                          (int64_t)l->count == mpt_shape_numel(g->nodes[o].shape) &&
                          l->dtype == MPT_NCCL_FLOAT32 && l->redop == MPT_NCCL_SUM,
                          "%s: bucket of kernel %d: member %d's sum", what, k, b->members[m]);
                if (!sum_stream) sum_stream = l->stream, comm = l->comm;
                CHECK(l->stream && l->stream == sum_stream && l->comm == comm);
            }
            CHECK_MSG(c < to && log[c].op == FAKE_NCCL_GROUP_END, "%s: kernel %d: no ncclGroupEnd", what, k);
            c++;
            continue;
        }
        const fake_nccl_call *l = &log[c++];
        unsigned long long in = mpt_cuda_exec_buffer(s->train_exec, nd->in[0]);
        unsigned long long out = mpt_cuda_exec_buffer(s->train_exec, p->kernels[k].root);
        int64_t n_in = mpt_shape_numel(g->nodes[nd->in[0]].shape), n_out = mpt_shape_numel(nd->shape);
        CHECK_MSG(l->op == fake_nccl_op(nd->op), "%s: kernel %d: NCCL call %d", what, k, l->op);
        CHECK(l->dtype == (nd->dtype == MPT_DT_I32 ? MPT_NCCL_INT32 : MPT_NCCL_FLOAT32));
        CHECK(l->redop == (nd->op == MPT_OP_ALL_GATHER ? -1 : MPT_NCCL_SUM));
        if (!comm) comm = l->comm;
        if (!step_stream) step_stream = l->stream;
        CHECK(l->stream && l->stream == step_stream && l->comm == comm);
        if (nd->op == MPT_OP_ALLREDUCE) {
            CHECK_MSG(l->send == in && l->recv == out && (int64_t)l->count == n_out,
                      "%s: kernel %d %s: allreduce of %zu values", what, k, p->kernels[k].name,
                      l->count);
        } else if (nd->op == MPT_OP_REDUCE_SCATTER) {
            int pad = ranks * n_out > n_in;
            CHECK_MSG((int64_t)l->count == n_out && l->recv == out && (l->send == in) == !pad,
                      "%s: kernel %d %s: reduce_scatter %lld -> %lld", what, k,
                      p->kernels[k].name, (long long)n_in, (long long)n_out);
            *padded += pad;
        } else {
            int pad = ranks * n_in > n_out;
            CHECK_MSG((int64_t)l->count == n_in && l->send == in && (l->recv == out) == !pad,
                      "%s: kernel %d %s: all_gather %lld -> %lld", what, k, p->kernels[k].name,
                      (long long)n_in, (long long)n_out);
            *padded += pad;
        }
    }
    CHECK_MSG(c == to, "%s: %d NCCL calls, %d collectives", what, to - from, c - from);
    CHECK_MSG((groups > 0) == (sums_mode != SUMS_EACH), "%s: %d groups of sums", what, groups);
    /* overlapped: the sums on a stream of their own */
    if (sum_stream && step_stream)
        CHECK_MSG((sum_stream != step_stream) == (sums_mode == SUMS_OVERLAP),
                  "%s: the sums' stream", what);
    mpt_buckets_free(&bk);
}

static int count_kernels(const mpt_plan *p, mpt_op op) {
    int n = 0;
    for (int k = 0; k < p->n_kernels; k++)
        n += mpt_cuda_kernel_is_collective(p, k) && p->g->nodes[p->kernels[k].root].op == op;
    return n;
}

/* Three train steps of `path` as a rank of `ranks` (2: rank 1 with the
 * stand-in; 1: the one-process values of a plan built for 2) against the
 * interpreter. Returns the calls that went through the padding region. */
static int run_steps(const char *path, const char *policy, int shard, int ranks) {
    compute_dt = strcmp(policy, "mixed_float16") == 0    ? MPT_DT_F16
                 : strcmp(policy, "mixed_bfloat16") == 0 ? MPT_DT_BF16
                                                         : MPT_DT_F32;
    char what[400], err[1024] = "";
    snprintf(what, sizeof what, "%s %s%s, rank of %d", strrchr(path, '/') + 1, policy,
             shard ? " sharded" : "", ranks);
    mpt_collective_set(ranks == 2 ? &rank1_of_2 : NULL);
    mpt_compile_opts o = {.path = path, .policy = policy, .batch_size = 16, .xla = 1,
                          .device = "cuda", .ranks = 2, .shard_optimizer = shard, .diag = stderr,
                          .bucket_mb = sums_mode == SUMS_EACH ? -1 : 0};
    if (sums_mode == SUMS_OVERLAP) unsetenv("MPTC_OVERLAP");
    else setenv("MPTC_OVERLAP", "0", 1);
    mpt_session *s = NULL;
    int padded = 0;
    CHECK_MSG(mpt_session_open(&o, &s) == 0, "%s: the session does not open", what);
    if (!s) goto done;
    CHECK(strcmp(s->backend->name, "cuda") == 0 && s->batch_size == 8);
    CHECK(mpt_session_init_state(s, 3) == 0);
    const mpt_graph *g = s->train;
    const mpt_plan *p = s->train_plan;
    CHECK_MSG(count_kernels(p, MPT_OP_ALLREDUCE) > 0, "%s: no allreduce", what);
    if (shard)
        CHECK_MSG(count_kernels(p, MPT_OP_REDUCE_SCATTER) > 0 &&
                  count_kernels(p, MPT_OP_ALL_GATHER) > 0 && count_kernels(p, MPT_OP_RANK_SLICE) > 0,
                  "%s: the sharded optimizer's collectives are missing", what);
    if (!on_gpu) CHECK(fake_stats().current_device == mpt_cuda_device());
    int ni = mpt_graph_n_inputs(g), nv = mpt_graph_n_variables(g), no = g->n_outputs;
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in), *ref_vars = calloc((size_t)nv + 1, sizeof *ref_vars);
    mpt_tensor *out = calloc((size_t)no + 1, sizeof *out), *ref = calloc((size_t)no + 1, sizeof *ref);
    for (int k = 0; k < nv; k++) {
        mpt_tensor_alloc(&ref_vars[k], s->vars[k].dtype, s->vars[k].shape);
        memcpy(ref_vars[k].data, s->vars[k].data, mpt_tensor_bytes(&s->vars[k]));
    }
    emu_module m;
    int rc = host_kernels(what, p, s->train_exec, &m);
    long long graphs = on_gpu ? 0 : fake_stats().graph_launches;
    long long unhosted = on_gpu ? 0 : fake_stats().launches - fake_stats().hosted_launches;
    long long bad = on_gpu ? 0 : fake_stats().bad_calls, failed = on_gpu ? 0 : nccl_state().failed;
    for (int step = 0; rc == 0 && step < 3; step++) {
        emu_fill_inputs(g, in, 21u + (unsigned)step);
        CHECK(mpt_interp_run(g, in, ref_vars, ref, NULL, err, sizeof err) == 0);
        const fake_nccl_call *log;
        int before = on_gpu ? 0 : nccl_log(&log);
        rc = s->backend->run(s->train_exec, in, s->vars, out, err, sizeof err);
        CHECK_MSG(rc == 0, "%s step %d: %s", what, step, err);
        if (!on_gpu && rc == 0) check_calls(what, s, before, nccl_log(&log), ranks, &padded);
        char w[500];
        snprintf(w, sizeof w, "%s step %d output", what, step);
        for (int k = 0; rc == 0 && k < no; k++) same(w, g->outputs[k].name, &out[k], &ref[k]);
        for (int k = 0; k < no; k++) {
            if (rc == 0) mpt_tensor_free(&out[k]);
            mpt_tensor_free(&ref[k]);
        }
        for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    }
    if (rc == 0) {
        CHECK(mpt_session_pull_vars(s, err, sizeof err) == 0);
        for (int k = 0; k < nv; k++) {
            char w[500];
            snprintf(w, sizeof w, "%s after 3 steps, variable", what);
            same(w, g->nodes[mpt_graph_variable_node(g, k)].name, &s->vars[k], &ref_vars[k]);
        }
    }
    if (!on_gpu) {
        /* NCCL calls are not captured: the steps ran kernel by kernel */
        CHECK(fake_stats().graph_launches == graphs);
        CHECK(fake_stats().bad_calls == bad && nccl_state().failed == failed);
        /* and every launch ran the host build of its kernel */
        CHECK(fake_stats().launches - fake_stats().hosted_launches == unhosted);
        emu_free(&m);
    }
    for (int k = 0; k < nv; k++) mpt_tensor_free(&ref_vars[k]);
    free(in), free(ref_vars), free(out), free(ref);
done:
    mpt_session_free(s);
    mpt_collective_set(NULL);
    return padded;
}

/* NCCL missing: an error with a hint, in a process of its own (the
 * library's absence is remembered for the process) */
static void missing_nccl(void) {
    pid_t pid = fork();
    if (pid == 0) {
        char err[1024] = "";
        setenv("MPTC_LIBNCCL", "/nonexistent/libnccl.so.2", 1);
        int rc = mpt_cuda_nccl_join(0, 2, 0, bcast_send, err, sizeof err);
        int ok = rc != 0 && strstr(err, "NCCL") && strstr(err, "hint:") &&
                 strstr(err, "MPTC_LIBNCCL") && strstr(err, "--device cpu") && n_bcast == 0;
        if (!ok) fprintf(stderr, "missing NCCL: rc %d: %s\n", rc, err);
        _exit(ok ? 0 : 1);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a missing NCCL is not an error with a hint");
}

static void join(void) {
    char err[1024] = "";
    /* rank 0 of 2, local rank 4 of a host with 3 devices: device 1 */
    setenv("FAKE_CUDA_DEVICES", "3", 1);
    fake_nccl_state before = nccl_state();
    CHECK_MSG(mpt_cuda_nccl_join(0, 2, 4, bcast_send, err, sizeof err) == 0, "%s", err);
    fake_nccl_state st = nccl_state();
    CHECK(mpt_cuda_device() == 1 && st.device == 1);
    CHECK(st.rank == 0 && st.nranks == 2 && st.inits == before.inits + 1);
    CHECK(st.unique_ids == before.unique_ids + 1 && n_bcast == 1);
    CHECK_MSG(memcmp(st.id, sent.internal, sizeof st.id) == 0, "NCCL did not get the id sent");
    int r = -1, sz = -1;
    CHECK(mpt_cuda_nccl_joined(&r, &sz) && r == 0 && sz == 2);
    CHECK(mpt_cuda_nccl_join(0, 2, 4, bcast_send, err, sizeof err) == 0); /* joined already */
    CHECK(nccl_state().inits == st.inits && n_bcast == 1);
    CHECK(mpt_cuda_nccl_join(1, 2, 4, bcast_send, err, sizeof err) != 0 && strstr(err, "internal"));
    mpt_cuda_nccl_leave();
    CHECK(!mpt_cuda_nccl_joined(&r, &sz) && nccl_state().destroys == before.destroys + 1);
    /* rank 1, local rank 1: makes no id, takes rank 0's from the broadcast */
    CHECK_MSG(mpt_cuda_nccl_join(1, 2, 1, bcast_receive, err, sizeof err) == 0, "%s", err);
    st = nccl_state();
    CHECK(st.rank == 1 && st.nranks == 2 && st.device == 1 && mpt_cuda_device() == 1);
    CHECK(st.unique_ids == before.unique_ids + 2); /* the one bcast_receive made for rank 0 */
    CHECK(memcmp(st.id, sent.internal, sizeof st.id) == 0);
}

/* the error paths of a joined rank's steps */
static void failures(const char *path) {
    char err[1024] = "", nth[32];
    mpt_collective_set(&rank1_of_2);
    mpt_compile_opts o = {.path = path, .batch_size = 16, .xla = 1, .device = "cuda", .ranks = 2,
                          .diag = stderr};
    mpt_session *s = NULL;
    CHECK(mpt_session_open(&o, &s) == 0 && mpt_session_init_state(s, 3) == 0);
    if (!s) goto done;
    /* the kernels of this plan (its launches run them) */
    emu_module m;
    if (host_kernels("failures", s->train_plan, s->train_exec, &m)) goto done;
    mpt_tensor in[4] = {{0}}, out[16] = {{0}};
    emu_fill_inputs(s->train, in, 5);
    const fake_nccl_call *log;
    int made = 0; /* collectives so far: FAKE_NCCL_FAIL counts them, not the group markers */
    for (int i = nccl_log(&log) - 1; i >= 0; i--) made += log[i].op < FAKE_NCCL_GROUP_START;
    snprintf(nth, sizeof nth, "%d", made + 1);
    setenv("FAKE_NCCL_FAIL", nth, 1);
    int rc = s->backend->run(s->train_exec, in, s->vars, out, err, sizeof err);
    unsetenv("FAKE_NCCL_FAIL");
    CHECK_MSG(rc != 0 && strstr(err, "NCCL error 1") && strstr(err, "all_reduce") &&
              strstr(err, "hint: kernel") && strstr(err, "NCCL_DEBUG=INFO"), "%s", err);
    for (int k = 0; k < mpt_graph_n_inputs(s->train); k++) mpt_tensor_free(&in[k]);
    emu_free(&m);
    /* no communicator: compiling a plan with collectives says so */
    mpt_cuda_nccl_leave();
    mpt_exec *x = mpt_backend_cuda.compile(s->train_plan, err, sizeof err);
    CHECK_MSG(!x && strstr(err, "joined no NCCL communicator") && strstr(err, "mpirun"), "%s", err);
    if (x) mpt_backend_cuda.free(x);
    /* nor does a session of 2 CUDA ranks open in a process of one */
    mpt_session *t = NULL;
    FILE *diag = tmpfile();
    o.diag = diag;
    CHECK(mpt_session_open(&o, &t) != 0);
    mpt_session_free(t);
    char text[1024] = "";
    rewind(diag);
    text[fread(text, 1, sizeof text - 1, diag)] = 0;
    fclose(diag);
    CHECK_MSG(strstr(text, "2 data-parallel CUDA ranks") && strstr(text, "mpirun -np 2"), "%s", text);
done:
    mpt_session_free(s);
    mpt_collective_set(NULL);
}

int main(int argc, char **argv) {
    char why[512];
    if (!mpt_cuda_nvrtc(why, sizeof why)) {
        printf("skip: the CUDA backend's tests need NVRTC: %s\n", why);
        return 77;
    }
    on_gpu = argc > 1 && strcmp(argv[1], "--gpu") == 0;
    if (on_gpu && !mpt_backend_cuda.available(why, sizeof why)) {
        printf("skip: no CUDA GPU (%s)\n", why);
        return 77;
    }
    if (on_gpu && !mpt_cuda_nccl(why, sizeof why)) {
        printf("skip: no NCCL (%s)\n", why);
        return 77;
    }
    if (!on_gpu && system("g++ --version > /dev/null 2>&1") != 0) {
        printf("skip: no g++ to compile the generated CUDA C for the host\n");
        return 77;
    }
    if (!mkdtemp(dir)) return 1;
    char convnet[600];
    snprintf(convnet, sizeof convnet, "%s/dp.mpt", dir);
    FILE *f = fopen(convnet, "w");
    if (!f || fputs(convnet_src, f) < 0 || fclose(f)) return 1;
    const char *policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
    if (on_gpu) {
        /* one GPU: a communicator of one rank, the plan built for two */
        char err[1024];
        CHECK_MSG(mpt_cuda_nccl_join(0, 1, 0, mpt_dist_bcast, err, sizeof err) == 0, "%s", err);
        for (int p = 0; p < 3; p++)
            for (int shard = 0; shard < 2; shard++) run_steps(convnet, policies[p], shard, 1);
        run_steps("tests/models/embed_wide.mpt", "float32", 1, 1);
        run_steps("tests/models/dropout_mlp.mpt", "mixed_float16", 0, 1);
        mpt_cuda_nccl_leave();
        return check_exit("test_cuda_nccl --gpu");
    }
    missing_nccl();
    void *h = fake_cuda_load(argv[0]);
    if (!h) return 1;
    setenv("MPTC_LIBNCCL", getenv("MPTC_LIBCUDA"), 1);
    fake_register = (register_fn)dlsym(h, "fake_cuda_register");
    fake_stats = (fake_cuda_counts(*)(void))dlsym(h, "fake_cuda_stats");
    nccl_log = (fake_nccl_log_fn)dlsym(h, "fake_nccl_log");
    nccl_state = (fake_nccl_state_fn)dlsym(h, "fake_nccl_state_get");
    fake_unique_id = (int (*)(mpt_nccl_unique_id *))dlsym(h, "ncclGetUniqueId");
    if (!fake_register || !fake_stats || !nccl_log || !nccl_state || !fake_unique_id) {
        fprintf(stderr, "the test library lacks its NCCL\n");
        return 1;
    }
    join(); /* leaves this process rank 1 of 2 on device 1 */
    int padded = 0;
    /* every policy, and the sharded optimizer under two of them; --all:
     * every policy with and without it (suite time) */
    int all = argc > 1 && strcmp(argv[1], "--all") == 0;
    for (int p = 0; p < 3; p++)
        for (int shard = 0; shard < 2; shard++)
            if (all || shard == (p != 1)) padded += run_steps(convnet, policies[p], shard, 2);
    /* the sums one call each at their kernels, and as groups on the
     * step's stream, besides the default (groups on a stream of their own) */
    sums_mode = SUMS_EACH;
    run_steps(convnet, "float32", 0, 2);
    sums_mode = SUMS_BUCKETS;
    run_steps(convnet, "mixed_float16", 0, 2);
    sums_mode = SUMS_OVERLAP;
    unsetenv("MPTC_OVERLAP");
    /* a dense logits bias of 5 values is 2 shards of 3: padded */
    CHECK_MSG(padded > 0, "no collective went through the padding region");
    run_steps("tests/models/embed_wide.mpt", "float32", 0, 2);
    /* not mixed_bfloat16: there, at the third step, one hidden unit's
     * pre-activation lies within bf16 rounding of 0 and its relu decides
     * differently on the host than in the interpreter's f64 (a kernel
     * hook showed the first difference at that `gt`, every collective
     * before it within bounds); the CPU JIT happens to decide as the
     * interpreter does */
    run_steps("tests/models/embed_wide.mpt", "mixed_float16", 1, 2);
    run_steps("tests/models/dropout_mlp.mpt", "mixed_float16", 0, 2);
    failures(convnet);
    /* what a single GPU checks: a one-rank communicator, a plan of two */
    char err[1024];
    CHECK_MSG(mpt_cuda_nccl_join(0, 1, 0, bcast_send, err, sizeof err) == 0, "%s", err);
    run_steps(convnet, "float32", 1, 1);
    run_steps("tests/models/embed_wide.mpt", "float32", 1, 1);
    mpt_cuda_nccl_leave();
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", dir);
    return check_exit("test_cuda_nccl");
}
