/* tests/test_dist.c — data parallelism below MPI: the ALLREDUCE op and the
 * train step of one rank (ir/train.c with ranks > 1), on the interpreter
 * and the CPU JIT, with a collective that stands in for two ranks holding
 * the same batch (the sum is the value doubled). Each rank's step must then
 * be bit for bit one process's step on that batch: doubling and the
 * step's 1/2 are exact in binary floating point, so any other difference
 * is a wrong placement of the reduction (a gradient summed twice, the
 * mean taken of a sum, batch-norm statistics left out, a sum read before
 * it finished). tests/dist.t.sh
 * runs real ranks under mpirun. Also: the fusion plan keeps every
 * ALLREDUCE in a kernel of its own; runtime/dist/ in one process; the
 * errors a user can meet before MPI starts. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/dist/dist.h"
#include "runtime/train/train.h"
#include "tests/check.h"

static char dir[] = "/tmp/mptc-test-dist-XXXXXX";

static const char *model_src =
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

static int calls;
static int twice(void *ctx, void *buf, int64_t n, mpt_dtype dt, char *err, size_t len) {
    (void)ctx, (void)err, (void)len;
    calls++;
    for (int64_t i = 0; i < n; i++) {
        if (dt == MPT_DT_F64) ((double *)buf)[i] *= 2;
        else ((float *)buf)[i] *= 2;
    }
    return 0;
}

/* The non-blocking form: the doubling happens only at wait, so a kernel
 * that read a sum before the backend waited for it would see this rank's
 * value alone and the step would differ from one process's */
typedef struct {
    void *buf;
    int64_t n;
    mpt_dtype dt;
    int tests;
} deferred;
static int in_flight;
static int start_later(void *ctx, void *buf, int64_t n, mpt_dtype dt, void **req, char *err,
                       size_t len) {
    (void)ctx, (void)err, (void)len;
    deferred *d = malloc(sizeof *d);
    *d = (deferred){buf, n, dt, 0};
    *req = d;
    in_flight++;
    return 0;
}
static int wait_now(void *ctx, void *req, char *err, size_t len) {
    deferred *d = req;
    int rc = twice(ctx, d->buf, d->n, d->dt, err, len);
    free(d);
    in_flight--;
    return rc;
}
static int test_twice(void *ctx, void *req, char *err, size_t len) {
    deferred *d = req;
    if (++d->tests < 3) return 0; /* done at the third test */
    return wait_now(ctx, req, err, len) ? -1 : 1;
}

static double bucket_mb; /* 0: the default buckets; -1: one sum per gradient */

static mpt_session *open_model(const char *device, const char *policy, int ranks, long batch) {
    char path[600];
    snprintf(path, sizeof path, "%s/dp.mpt", dir);
    mpt_compile_opts o = {.path = path, .policy = policy, .xla = 1, .device = device,
                          .ranks = ranks, .batch_size = batch, .bucket_mb = bucket_mb,
                          .diag = stderr};
    mpt_session *s = NULL;
    if (mpt_session_open(&o, &s) || mpt_session_init_state(s, 7)) {
        mpt_session_free(s);
        return NULL;
    }
    return s;
}

static int count_op(const mpt_graph *g, mpt_op op) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
    return n;
}

/* one process at batch 8 against rank 0 of two at global batch 16 */
static void same_as_one_process(const char *device, const char *policy, int nonblocking) {
    mpt_session *one = open_model(device, policy, 1, 8);
    mpt_session *two = open_model(device, policy, 2, 16);
    CHECK_MSG(one && two, "%s %s: the sessions do not open", device, policy);
    if (!one || !two) goto done;
    CHECK(two->batch_size == 8 && two->global_batch == 16 && two->ranks == 2);
    CHECK(count_op(one->train, MPT_OP_ALLREDUCE) == 0);
    /* a gradient per trainable variable (conv, bn's gamma and beta, two
     * dense layers: 8), the loss, the accuracy count and bn's two moving
     * statistics */
    int want = 12;
    CHECK_MSG(count_op(two->train, MPT_OP_ALLREDUCE) == want, "%d ALLREDUCEs, want %d",
              count_op(two->train, MPT_OP_ALLREDUCE), want);
    /* the messages: buckets of several gradients by default, one each
     * with --bucket-mb 0; a member's reader closes a bucket early */
    mpt_buckets bk;
    CHECK(mpt_plan_buckets(two->train_plan, bucket_mb < 0 ? -1 : MPT_BUCKET_BYTES_DEFAULT, &bk) == 0);
    int widest = 0;
    for (int b = 0; b < bk.n; b++) {
        if (bk.b[b].n_members > widest) widest = bk.b[b].n_members;
        for (int m = 0; m < bk.b[b].n_members; m++)
            CHECK(bk.b[b].members[m] <= bk.b[b].start_after &&
                  bk.b[b].start_after < bk.b[b].wait_before);
    }
    CHECK_MSG(bucket_mb < 0 ? bk.n == 12 && widest == 1 : widest >= 4,
              "%d buckets, the widest of %d", bk.n, widest);
    int messages = bk.n;
    mpt_buckets_free(&bk);
    int alone = 0;
    for (int k = 0; k < two->train_plan->n_kernels; k++) {
        const mpt_kernel *kk = &two->train_plan->kernels[k];
        for (int j = 0; j < kk->n_nodes; j++)
            if (two->train->nodes[kk->nodes[j]].op == MPT_OP_ALLREDUCE)
                alone += kk->kind == MPT_KERNEL_OPAQUE && kk->n_nodes == 1;
    }
    CHECK_MSG(alone == want, "%d of %d ALLREDUCEs in a kernel of their own", alone, want);

    int nin = mpt_graph_n_inputs(one->train), nout = one->train->n_outputs;
    mpt_tensor in[4] = {0}, o1[16] = {0}, o2[16] = {0};
    CHECK(nin == 2 && nout <= 16 && two->train->n_outputs == nout);
    for (int k = 0; k < nin; k++) {
        const mpt_node *nd = &one->train->nodes[mpt_graph_input_node(one->train, k)];
        mpt_tensor_alloc(&in[k], nd->dtype, nd->shape);
        for (int64_t i = 0; i < mpt_shape_numel(nd->shape); i++)
            mpt_tensor_set(&in[k], i, nd->dtype == MPT_DT_I32 ? (double)(i % 5)
                                                              : sin(0.37 * (double)i) * 1.5);
    }
    mpt_collective c = {.rank = 0, .size = 2, .allreduce_sum = twice};
    if (nonblocking) c.start = start_later, c.test = test_twice, c.wait = wait_now;
    char err[1024];
    for (int step = 0; step < 3; step++) {
        mpt_collective_set(NULL);
        int r1 = one->backend->run(one->train_exec, in, one->vars, o1, err, sizeof err);
        CHECK_MSG(r1 == 0, "%s", err);
        mpt_collective_set(&c);
        calls = 0;
        int r2 = two->backend->run(two->train_exec, in, two->vars, o2, err, sizeof err);
        mpt_collective_set(NULL);
        CHECK_MSG(r2 == 0, "%s", err);
        /* the interpreter sums each ALLREDUCE; the CPU backend each bucket */
        CHECK_MSG(calls == (strcmp(device, "cpu") == 0 ? messages : want), "%d sums", calls);
        CHECK(in_flight == 0);
        if (r1 || r2) break;
        for (int k = 0; k < nout; k++) {
            const char *name = one->train->outputs[k].name;
            int j = mpt_graph_find_output(two->train, name);
            double a = mpt_tensor_get(&o1[k], 0), b = j >= 0 ? mpt_tensor_get(&o2[j], 0) : NAN;
            /* the metric sums are the global batch's: twice one process's */
            double want = strcmp(name, "correct") == 0 ? 2 * a : a;
            CHECK_MSG(b == want, "%s %s step %d: output %s is %.9g, one process %.9g", device,
                      policy, step, name, b, want);
        }
        for (int k = 0; k < nout; k++) mpt_tensor_free(&o1[k]), mpt_tensor_free(&o2[k]);
    }
    CHECK(one->n_vars == two->n_vars);
    for (int k = 0; k < one->n_vars && k < two->n_vars; k++)
        CHECK_MSG(memcmp(one->vars[k].data, two->vars[k].data, mpt_tensor_bytes(&one->vars[k])) == 0,
                  "%s %s: state %s differs after 3 steps", device, policy,
                  one->train->nodes[mpt_graph_variable_node(one->train, k)].name);
    for (int k = 0; k < nin; k++) mpt_tensor_free(&in[k]);
done:
    mpt_session_free(one);
    mpt_session_free(two);
}

/* the ALLREDUCE op itself: identity in one process, its gradient the
 * reduction of the gradient, text form round trip */
static void op_itself(void) {
    mpt_graph *g = mpt_graph_new("ar");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_1(3));
    int y = mpt_b_allreduce(g, x);
    mpt_graph_add_output(g, "y", y);
    char buf[256];
    CHECK(mpt_graph_verify(g, buf, sizeof buf) == NULL);
    mpt_tensor in = {0}, out = {0};
    mpt_tensor_alloc(&in, MPT_DT_F32, mpt_shape_1(3));
    for (int i = 0; i < 3; i++) mpt_tensor_set(&in, i, 0.5 + i);
    char err[256];
    CHECK(mpt_interp_run(g, &in, NULL, &out, NULL, err, sizeof err) == 0);
    CHECK(mpt_tensor_get(&out, 2) == 2.5);
    mpt_tensor_free(&out);
    mpt_collective c = {.rank = 1, .size = 2, .allreduce_sum = twice};
    mpt_collective_set(&c);
    CHECK(mpt_interp_run(g, &in, NULL, &out, NULL, err, sizeof err) == 0);
    mpt_collective_set(NULL);
    CHECK(mpt_tensor_get(&out, 2) == 5.0);
    mpt_tensor_free(&out);
    char *text = mpt_graph_to_string(g);
    mpt_graph *back = text ? mpt_graph_parse(text, err, sizeof err) : NULL;
    CHECK_MSG(back && count_op(back, MPT_OP_ALLREDUCE) == 1, "%s", err);
    mpt_graph_free(back);
    free(text);
    /* an i32 value is not reduced */
    int ids = mpt_b_input(g, "ids", MPT_DT_I32, mpt_shape_1(3));
    mpt_shape sh;
    mpt_dtype dt;
    CHECK(mpt_infer(g, MPT_OP_ALLREDUCE, 1, &ids, NULL, &sh, &dt) != NULL);
    mpt_tensor_free(&in);
    mpt_graph_free(g);
}

/* The sharded optimizer's ops on rank 1 of 2, with a stand-in second
 * rank that holds the same values (its sums double, its shards equal) */
static int rs_twice(void *ctx, const void *in, void *out, int64_t s, mpt_dtype dt, char *err,
                    size_t len) {
    (void)ctx, (void)err, (void)len;
    for (int64_t i = 0; i < s; i++) /* rank 1's shard, summed over two equal ranks */
        ((double *)out)[i] = 2 * ((const double *)in)[s + i];
    return dt == MPT_DT_F64 ? 0 : -1;
}
static int ag_same(void *ctx, const void *in, void *out, int64_t s, mpt_dtype dt, char *err,
                   size_t len) {
    (void)ctx, (void)err, (void)len;
    for (int r = 0; r < 2; r++) memcpy((double *)out + r * s, in, (size_t)s * sizeof(double));
    return dt == MPT_DT_F64 ? 0 : -1;
}

static void shard_ops(void) {
    mpt_graph *g = mpt_graph_new("zero");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_1(5));
    int rs = mpt_b_shard_op(g, MPT_OP_REDUCE_SCATTER, x, 3); /* shards of 3: [3, 4] then padding */
    int sl = mpt_b_shard_op(g, MPT_OP_RANK_SLICE, x, 3);
    int ag = mpt_b_shard_op(g, MPT_OP_ALL_GATHER, sl, 5);
    mpt_graph_add_output(g, "rs", rs);
    mpt_graph_add_output(g, "sl", sl);
    mpt_graph_add_output(g, "ag", ag);
    char buf[256], err[256];
    CHECK_MSG(mpt_graph_verify(g, buf, sizeof buf) == NULL, "%s", buf);
    mpt_shape sh = mpt_shape_1(6);
    mpt_dtype dt;
    CHECK(mpt_infer(g, MPT_OP_RANK_SLICE, 1, &x, NULL, &sh, &dt) != NULL); /* a shard past the whole */
    mpt_tensor in = {0}, out[3] = {{0}};
    mpt_tensor_alloc(&in, MPT_DT_F32, mpt_shape_1(5));
    for (int i = 0; i < 5; i++) mpt_tensor_set(&in, i, i + 1); /* 1 2 3 4 5 */
    /* one process: rank 0 of 1 */
    CHECK(mpt_interp_run(g, &in, NULL, out, NULL, err, sizeof err) == 0);
    CHECK(mpt_tensor_get(&out[0], 0) == 1 && mpt_tensor_get(&out[0], 2) == 3);
    CHECK(mpt_tensor_get(&out[2], 2) == 3 && mpt_tensor_get(&out[2], 4) == 0);
    for (int k = 0; k < 3; k++) mpt_tensor_free(&out[k]);
    mpt_collective c = {.rank = 1, .size = 2, .allreduce_sum = twice, .reduce_scatter = rs_twice,
                        .all_gather = ag_same};
    mpt_collective_set(&c);
    CHECK_MSG(mpt_interp_run(g, &in, NULL, out, NULL, err, sizeof err) == 0, "%s", err);
    mpt_collective_set(NULL);
    /* rank 1's shard: elements 3, 4 and a zero past the end */
    CHECK(mpt_tensor_get(&out[1], 0) == 4 && mpt_tensor_get(&out[1], 1) == 5 &&
          mpt_tensor_get(&out[1], 2) == 0);
    CHECK(mpt_tensor_get(&out[0], 0) == 8 && mpt_tensor_get(&out[0], 1) == 10 &&
          mpt_tensor_get(&out[0], 2) == 0);
    /* gathered: both ranks' [4 5 0], cut at 5 */
    CHECK(mpt_tensor_get(&out[2], 0) == 4 && mpt_tensor_get(&out[2], 3) == 4 &&
          mpt_tensor_get(&out[2], 4) == 5);
    for (int k = 0; k < 3; k++) mpt_tensor_free(&out[k]);
    mpt_tensor_free(&in);
    mpt_graph_free(g);
}

/* runtime/dist/ in one process, and a launcher without mptc's MPI library */
static void one_process(void) {
    char err[1024] = "";
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("PMI_SIZE");
    unsetenv("PMIX_SIZE");
    CHECK(mpt_dist_launched_size() == 1);
    CHECK(mpt_dist_init(err, sizeof err) == 0);
    CHECK(mpt_dist_rank() == 0 && mpt_dist_size() == 1 && mpt_collective_get()->size == 1);
    CHECK(mpt_dist_max(3) == 3);
    CHECK(mpt_dist_same(42, "x", err, sizeof err) == 0);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    setenv("MPTC_MPI_SHIM", "/nonexistent/libmptc_mpi.so", 1);
    CHECK(mpt_dist_launched_size() == 2);
    CHECK(mpt_dist_init(err, sizeof err) != 0);
    CHECK_MSG(strstr(err, "2 ranks") && strstr(err, "hint:") && strstr(err, "libopenmpi-dev"), "%s", err);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("MPTC_MPI_SHIM");
}

/* a global batch the ranks cannot share equally */
static void uneven_batch(void) {
    char path[600], errs[600];
    snprintf(path, sizeof path, "%s/dp.mpt", dir);
    snprintf(errs, sizeof errs, "%s/diag.txt", dir);
    FILE *diag = fopen(errs, "w+");
    mpt_compile_opts o = {.path = path, .xla = 1, .device = "interp", .ranks = 3,
                          .batch_size = 16, .diag = diag};
    mpt_session *s = NULL;
    CHECK(mpt_session_open(&o, &s) != 0);
    mpt_session_free(s);
    char text[1024] = "";
    rewind(diag);
    size_t got = fread(text, 1, sizeof text - 1, diag);
    text[got] = 0;
    fclose(diag);
    CHECK_MSG(strstr(text, "does not split over 3 ranks") && strstr(text, "--batch-size 15 or 18"),
              "%s", text);
}

int main(void) {
    if (!mkdtemp(dir)) return 1;
    char path[600];
    snprintf(path, sizeof path, "%s/dp.mpt", dir);
    FILE *f = fopen(path, "w");
    fputs(model_src, f);
    fclose(f);
    op_itself();
    shard_ops();
    one_process();
    uneven_batch();
    const char *devices[] = {"interp", "cpu"};
    const char *policies[] = {"float32", "mixed_bfloat16", "mixed_float16"};
    for (int d = 0; d < 2; d++)
        for (int p = 0; p < 3; p++) same_as_one_process(devices[d], policies[p], 0);
    /* the CPU backend starts each sum and waits where it is first read */
    for (int p = 0; p < 3; p++) same_as_one_process("cpu", policies[p], 1);
    /* one sum per gradient (--bucket-mb 0), in flight side by side */
    bucket_mb = -1;
    for (int d = 0; d < 2; d++) same_as_one_process(devices[d], policies[1], 1);
    bucket_mb = 0;
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", dir);
    return check_exit("test_dist");
}
