/* runtime/cli/cmd_check.c — `mptc check`: layers, shapes, parameters, per-layer
 * dtypes under the policy, Tensor Core alignment and a memory estimate. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/cli.h"

static const mpt_cli_opt check_opts[] = {
    MPT_CLI_COMPILE_OPTS,
    {"memory", 1, "also find the largest batch whose train step fits this much memory, e.g. 80GiB"},
    {NULL, 0, NULL},
};

static void commas(int64_t v, char *buf, size_t n) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%lld", (long long)v);
    size_t len = strlen(tmp), o = 0;
    for (size_t i = 0; i < len && o + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = tmp[i];
    }
    buf[o] = 0;
}

/* The dtypes a layer computes in and produces, read off the typed graph:
 * compute = its GEMM/conv, else its last non-cast op; output = its last node. */
static void layer_dtypes(const mpt_graph *g, const char *layer, const char **compute,
                         const char **output) {
    int gemm = -1, last = -1, last_op = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        const mpt_node *n = &g->nodes[i];
        if (!n->layer || strcmp(n->layer, layer) != 0 || n->op == MPT_OP_VARIABLE) continue;
        last = i;
        if (n->op != MPT_OP_CAST && n->op != MPT_OP_CONST && n->op != MPT_OP_BROADCAST) last_op = i;
        mpt_op_kind k = mpt_op_table[n->op].kind;
        if ((k == MPT_KIND_GEMM || k == MPT_KIND_CONV) && gemm < 0) gemm = i;
    }
    int c = gemm >= 0 ? gemm : last_op >= 0 ? last_op : last;
    *compute = c >= 0 ? mpt_dtype_name(g->nodes[c].dtype) : "-";
    *output = last >= 0 ? mpt_dtype_name(g->nodes[last].dtype) : "-";
}

static void tensor_core_report(const mpt_session *s) {
    const mpt_graph *g = s->typed;
    int any = 0;
    printf("\nTensor Core alignment (f16/bf16 GEMM and conv dimensions should be multiples of 8):\n");
    for (int i = 0; i < g->n_nodes; i++) {
        const mpt_node *n = &g->nodes[i];
        if (n->dtype != MPT_DT_F16 && n->dtype != MPT_DT_BF16) continue;
        const char *what[3] = {0};
        int64_t dims[3] = {0};
        if (n->op == MPT_OP_MATMUL) {
            const mpt_node *a = &g->nodes[n->in[0]];
            what[0] = "batch (M)", dims[0] = n->shape.dim[0];
            what[1] = "units (N)", dims[1] = n->shape.dim[1];
            what[2] = "inputs (K)", dims[2] = n->attr.i[0] ? a->shape.dim[0] : a->shape.dim[1];
        } else if (n->op == MPT_OP_CONV2D) {
            const mpt_node *x = &g->nodes[n->in[0]];
            what[0] = "batch", dims[0] = n->shape.dim[0];
            what[1] = "filters", dims[1] = n->shape.dim[3];
            what[2] = "channels", dims[2] = x->shape.dim[3];
        } else {
            continue;
        }
        for (int k = 0; k < 3; k++)
            if (dims[k] % 8) {
                int64_t padded = (dims[k] + 7) / 8 * 8;
                printf("  %-24s %s %-10s %6lld -> padded to %lld by the CUDA GEMM/conv kernels (+%.1f%% work)\n",
                       n->layer ? n->layer : "-", mpt_op_name(n->op), what[k], (long long)dims[k],
                       (long long)padded, 100.0 * (double)(padded - dims[k]) / (double)dims[k]);
                any = 1;
            }
    }
    if (!any) printf("  all aligned (or no f16/bf16 GEMM/conv under this policy)\n");
}

static void memory_report(const mpt_session *s) {
    mpt_memory_breakdown m;
    mpt_plan_memory(s->train_plan, &m);
    char a[32], b[32], c[32], d[32], e[32];
    printf("\nMemory of one train step (batch %ld, policy %s, %d kernels):\n", s->batch_size,
           s->policy.name, s->train_plan->n_kernels);
    printf("  weights %s, optimizer and scaling state %s, one batch of inputs %s\n",
           mpt_fmt_bytes(m.weights, a, sizeof a), mpt_fmt_bytes(m.optimizer_state, b, sizeof b),
           mpt_fmt_bytes(m.inputs, c, sizeof c));
    printf("  activations, gradients and temporaries at peak %s (weight gradients %s of it)\n",
           mpt_fmt_bytes(m.activations, d, sizeof d), mpt_fmt_bytes(m.gradients, e, sizeof e));
    printf("  total %s; bytes moved per step %s\n", mpt_fmt_bytes(m.total, a, sizeof a),
           mpt_fmt_bytes(s->train_plan->bytes_moved, b, sizeof b));
}

/* What each rank moves a step, and the optimizer state a rank holds with
 * and without --shard-optimizer (other: the plan with the other choice) */
static void ranks_report(const mpt_session *s, const mpt_session *other, int64_t bucket_bytes) {
    if (s->ranks <= 1) return;
    int n[3] = {0}, sparse = 0;
    int64_t bytes[3] = {0}, sparse_bytes = 0, dense_bytes = 0;
    for (int i = 0; i < s->train->n_nodes; i++) {
        const mpt_node *nd = &s->train->nodes[i];
        /* an embedding's gradient exchanged as (ids, rows) (ir/train.c) */
        if (nd->op == MPT_OP_SCATTER_ADD && s->train->nodes[nd->in[0]].op == MPT_OP_ALL_GATHER) {
            sparse++;
            sparse_bytes += (mpt_shape_numel(s->train->nodes[nd->in[0]].shape) +
                             mpt_shape_numel(s->train->nodes[nd->in[1]].shape)) * 4;
            dense_bytes += mpt_shape_numel(nd->shape) * 4;
        }
        int kind = nd->op == MPT_OP_ALLREDUCE ? 0 : nd->op == MPT_OP_REDUCE_SCATTER ? 1
                 : nd->op == MPT_OP_ALL_GATHER ? 2 : -1;
        if (kind < 0) continue;
        n[kind]++;
        /* the whole value each moves: a reduce-scatter's input, a gather's output */
        const mpt_node *whole = kind == 1 ? &s->train->nodes[nd->in[0]] : nd;
        bytes[kind] += mpt_shape_numel(whole->shape) * (int64_t)mpt_dtype_size(nd->dtype);
    }
    char a[32], b[32], c[32];
    printf("\nData parallelism: %d ranks x batch %ld (global batch %ld), the memory above on each "
           "rank\n  a step all-reduces %d tensors (%s", s->ranks, s->batch_size, s->global_batch,
           n[0], mpt_fmt_bytes(bytes[0], a, sizeof a));
    printf(")");
    mpt_buckets bk = {0};
    if (n[0] && mpt_plan_buckets(s->train_plan, bucket_bytes, &bk) == 0 && bk.n < n[0]) {
        int widest = 0;
        for (int b = 0; b < bk.n; b++)
            if (bk.b[b].n_members > widest) widest = bk.b[b].n_members;
        printf(" in %d messages (buckets of up to %s, the widest %d tensors)", bk.n,
               mpt_fmt_bytes(bucket_bytes, c, sizeof c), widest);
    }
    mpt_buckets_free(&bk);
    if (n[1])
        printf(", reduce-scatters %d gradients (%s) and all-gathers %d weights", n[1],
               mpt_fmt_bytes(bytes[1], b, sizeof b), n[2] - 2 * sparse);
    printf("\n");
    if (sparse)
        printf("  %d embedding gradient%s exchanged as the ranks' ids and rows: %s all-gathered, "
               "where summing the dense table%s would move %s\n", sparse, sparse == 1 ? "" : "s",
               mpt_fmt_bytes(sparse_bytes, a, sizeof a), sparse == 1 ? "" : "s",
               mpt_fmt_bytes(dense_bytes, b, sizeof b));
    if (!other) return;
    mpt_memory_breakdown m, mo;
    mpt_plan_memory(s->train_plan, &m);
    mpt_plan_memory(other->train_plan, &mo);
    const mpt_memory_breakdown *sh = n[1] ? &m : &mo, *whole = n[1] ? &mo : &m;
    char d[32];
    printf("  optimizer and scaling state a rank: %s with --shard-optimizer, %s without; "
           "total %s with, %s without\n", mpt_fmt_bytes(sh->optimizer_state, a, sizeof a),
           mpt_fmt_bytes(whole->optimizer_state, b, sizeof b), mpt_fmt_bytes(sh->total, c, sizeof c),
           mpt_fmt_bytes(whole->total, d, sizeof d));
}

/* "80GiB", "512MiB", "16GB", "1000000" -> bytes; -1 when unreadable */
static int64_t parse_size(const char *v) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || x <= 0) return -1;
    static const struct { const char *suffix; double mult; } units[] = {
        {"", 1}, {"B", 1}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
        {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}};
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (strcmp(end, units[i].suffix) == 0) return (int64_t)(x * units[i].mult);
    return -1;
}

int mpt_cmd_check(int argc, char **argv) {
    mpt_cli c;
    int prc = mpt_cli_parse(&c, "check", "shapes, parameters, per-layer dtypes, alignment, memory",
                            check_opts, argc, argv);
    if (prc) return prc == 1 ? 0 : 2;
    mpt_compile_opts o;
    if (mpt_cli_compile_opts(&c, check_opts, &o)) return 2;
    o.plan_only = 1; /* checking compiles for no device */
    mpt_session *s;
    if (mpt_session_open(&o, &s)) return 1;
    const mpt_model *m = s->model;
    printf("Model: %s    policy: %s (compute %s, variables %s)\n", m->name, s->policy.name,
           mpt_dtype_name(s->policy.compute), mpt_dtype_name(s->policy.variable));
    /* the first column as wide as the longest "name (type)" (ResNet-50's
     * conv2/proj/shortcut_conv), so the columns after it line up */
    int w = 28;
    for (int i = 0; i < m->n_layers; i++) {
        int len = (int)(strlen(m->layers[i].name) + strlen(m->layers[i].type) + 3);
        if (len > w) w = len < 100 ? len : 100;
    }
    for (int k = 0; k < m->n_inputs; k++) {
        int len = (int)strlen(m->inputs[k].name) + 8;
        if (len > w) w = len < 100 ? len : 100;
    }
    int rule = w + 62;
    printf("%-*s %-20s %13s  %-7s %-9s %-6s\n", w, "Layer (type)", "Output Shape", "Param #",
           "Compute", "Variables", "Output");
    for (int i = 0; i < rule; i++) putchar('=');
    putchar('\n');
    /* the inputs first, as Keras' InputLayer rows: the shape and the dtype
     * the data must give */
    for (int k = 0; k < m->n_inputs; k++) {
        const mpt_model_input *in = &m->inputs[k];
        char lt[128], shape[64] = "(None";
        snprintf(lt, sizeof lt, "%s (input)", in->name);
        for (int d = 0; d < in->shape.rank; d++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), ", %lld", (long long)in->shape.dim[d]);
        strncat(shape, ")", sizeof shape - strlen(shape) - 1);
        printf("%-*s %-20s %13s  %-7s %-9s %-6s%s\n", w, lt, shape, "0", "-", "-",
               mpt_dtype_name(in->dtype), in->dtype == MPT_DT_I32 ? "  (token ids)"
                                          : in->mask_only ? "  (attention mask: nonzero attends)" : "");
    }
    int64_t total = 0, trainable = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const mpt_layer_info *L = &m->layers[i];
        char lt[128], shape[64] = "(None", num[32];
        snprintf(lt, sizeof lt, "%s (%s)", L->name, L->type);
        for (int d = 1; d < L->out_shape.rank; d++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), ", %lld", (long long)L->out_shape.dim[d]);
        strncat(shape, ")", sizeof shape - strlen(shape) - 1);
        commas(L->n_params, num, sizeof num);
        const char *cd, *od;
        layer_dtypes(s->typed, L->name, &cd, &od);
        printf("%-*s %-20s %13s  %-7s %-9s %-6s%s\n", w, lt, shape, num, cd,
               L->n_params ? "f32" : "-", od, L->dtype ? "  (dtype override)" : "");
        total += L->n_params;
        trainable += L->n_trainable;
    }
    char t1[32], t2[32], t3[32];
    commas(total, t1, sizeof t1);
    commas(trainable, t2, sizeof t2);
    commas(total - trainable, t3, sizeof t3);
    for (int i = 0; i < rule; i++) putchar('=');
    printf("\nTotal params: %s\nTrainable params: %s\nNon-trainable params: %s\n", t1, t2, t3);
    int out = mpt_graph_find_output(s->typed, "output");
    if (out >= 0) {
        mpt_dtype od = s->typed->nodes[s->typed->outputs[out].node].dtype;
        if (od == MPT_DT_F16 || od == MPT_DT_BF16)
            printf("\nwarning: the model's output is %s. Softmax and the loss in 16-bit floats are numerically\n"
                   "  unsafe (they overflow, underflow and lose precision); Keras' guide keeps them float32.\n"
                   "  hint: give the last layer dtype=float32\n", mpt_dtype_name(od));
    }
    printf("\nPolicy lists (%s):\n", s->policy.name);
    mpt_policy_print_lists(&s->popts, stdout);
    printf("Loss scaling: %s\n", s->topts.loss_scale.mode == MPT_LS_DYNAMIC ? "dynamic"
                                 : s->topts.loss_scale.mode == MPT_LS_FIXED ? "fixed"
                                                                            : "none");
    tensor_core_report(s);
    memory_report(s);
    if (s->ranks > 1) { /* the same plan with the other --shard-optimizer choice */
        mpt_compile_opts oo = o;
        oo.shard_optimizer = !o.shard_optimizer;
        oo.diag = NULL;
        FILE *quiet = fopen("/dev/null", "w");
        oo.diag = quiet ? quiet : stderr;
        mpt_session *other = NULL;
        if (mpt_session_open(&oo, &other)) other = NULL;
        if (quiet) fclose(quiet);
        ranks_report(s, other, o.bucket_mb < 0 ? -1
                               : o.bucket_mb > 0 ? (int64_t)(o.bucket_mb * 1048576.0)
                                                 : MPT_BUCKET_BYTES_DEFAULT);
        mpt_session_free(other);
    }
    mpt_session_free(s);
    const char *mem = mpt_cli_get(&c, check_opts, "memory");
    if (mem) {
        int64_t limit = parse_size(mem);
        if (limit <= 0) {
            fprintf(stderr, "mptc check: --memory wants a size such as 80GiB or 512MiB, got '%s'\n", mem);
            return 2;
        }
        long fits = mpt_largest_batch(&o, limit);
        if (fits < 0) printf("\nLargest batch for %s: the model does not compile at batch 1\n", mem);
        else if (fits == 0) printf("\nLargest batch for %s: none, even batch 1 needs more\n", mem);
        else printf("\nLargest batch that fits %s: %ld (the memory plan's estimate, without allocator overhead)\n",
                    mem, fits);
    }
    return 0;
}
