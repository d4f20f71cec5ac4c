/* tests/test_policy.c — the precision policy pass (ir/policy.c) on small
 * forward graphs built with the builder, and f16's range in the interpreter
 * (seed 003's overflow and underflow examples). */
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "tests/check.h"

enum { B = 4, IN = 5, HID = 8, OUT = 3 };

/* dense layer: x [B, in] -> [B, out] (+ relu) */
static int dense(mpt_graph *g, const char *name, int x, int out, int relu) {
    char kn[64], bn[64];
    int in = (int)g->nodes[x].shape.dim[1];
    snprintf(kn, sizeof kn, "%s/kernel", name);
    snprintf(bn, sizeof bn, "%s/bias", name);
    mpt_b_layer(g, name);
    int k = mpt_b_variable(g, kn, mpt_shape_2(in, out), MPT_INIT_GLOROT_UNIFORM, in, out, 0, 1);
    int b = mpt_b_variable(g, bn, mpt_shape_1(out), MPT_INIT_ZEROS, 0, 0, 0, 1);
    int y = mpt_b_matmul(g, x, k, 0, 0);
    y = mpt_b_binary(g, MPT_OP_ADD, y, mpt_b_broadcast_to(g, b, g->nodes[y].shape));
    return relu ? mpt_b_unary(g, MPT_OP_RELU, y) : y;
}

/* softmax over dim 1 of [B, C], as lang lowers it */
static int softmax(mpt_graph *g, const char *name, int x) {
    mpt_b_layer(g, name);
    mpt_shape s = g->nodes[x].shape;
    int m = mpt_b_reduce(g, MPT_OP_REDUCE_MAX, x, 2);
    int e = mpt_b_unary(g, MPT_OP_EXP, mpt_b_binary(g, MPT_OP_SUB, x, mpt_b_broadcast(g, m, s, 1)));
    int sum = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, e, 2);
    return mpt_b_binary(g, MPT_OP_DIV, e, mpt_b_broadcast(g, sum, s, 1));
}

/* softmax over the last dim of a rank-4 x, in x's current layer */
static int softmax4(mpt_graph *g, int x) {
    mpt_shape s = g->nodes[x].shape;
    int m = mpt_b_reduce(g, MPT_OP_REDUCE_MAX, x, 8);
    int e = mpt_b_unary(g, MPT_OP_EXP, mpt_b_binary(g, MPT_OP_SUB, x, mpt_b_broadcast(g, m, s, 7)));
    int sum = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, e, 8);
    return mpt_b_binary(g, MPT_OP_DIV, e, mpt_b_broadcast(g, sum, s, 7));
}

/* x -> dense_1 (relu) -> dense_2 -> predictions (softmax) */
static mpt_graph *mlp(void) {
    mpt_graph *g = mpt_graph_new("mlp");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(B, IN));
    int h = dense(g, "dense_1", x, HID, 1);
    int logits = dense(g, "dense_2", h, OUT, 0);
    int p = softmax(g, "predictions", logits);
    mpt_graph_add_output(g, "output", p);
    mpt_graph_add_output(g, "logits", logits);
    return g;
}

static mpt_policy_opts opts_for(const char *policy) {
    mpt_policy_opts o = {0};
    if (mpt_policy_lookup(policy, &o.global) != 0) abort();
    return o;
}

static mpt_graph *apply(const mpt_graph *fwd, const mpt_policy_opts *o) {
    char err[256] = "";
    mpt_graph *t = mpt_policy_apply(fwd, o, err, sizeof err);
    CHECK_MSG(t != NULL, "%s", err);
    if (!t) exit(check_exit("test_policy"));
    char buf[256];
    const char *e = mpt_graph_verify(t, buf, sizeof buf);
    CHECK_MSG(e == NULL, "typed graph does not verify: %s", e);
    return t;
}

static int count_op(const mpt_graph *g, mpt_op op, const char *layer) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == op &&
            (!layer || (g->nodes[i].layer && strcmp(g->nodes[i].layer, layer) == 0)))
            n++;
    return n;
}

/* the dtype of the (only) node of op in layer */
static mpt_dtype dtype_of(const mpt_graph *g, mpt_op op, const char *layer) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == op && g->nodes[i].layer && strcmp(g->nodes[i].layer, layer) == 0)
            return g->nodes[i].dtype;
    return MPT_DT_COUNT;
}

static int output_node(const mpt_graph *g, const char *name) {
    int k = mpt_graph_find_output(g, name);
    return k < 0 ? -1 : g->outputs[k].node;
}

/* how many casts read node id */
static int casts_of(const mpt_graph *g, int id) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == MPT_OP_CAST && g->nodes[i].in[0] == id) n++;
    return n;
}

static void test_lookup(void) {
    mpt_policy p;
    CHECK(mpt_policy_lookup("mixed_float16", &p) == 0 && p.compute == MPT_DT_F16 &&
          p.variable == MPT_DT_F32);
    CHECK(mpt_policy_lookup("mixed_bfloat16", &p) == 0 && p.compute == MPT_DT_BF16);
    CHECK(mpt_policy_lookup("float32", &p) == 0 && p.compute == MPT_DT_F32);
    CHECK(mpt_policy_lookup("float16", &p) == 0 && p.compute == MPT_DT_F16 &&
          p.variable == MPT_DT_F16);
    CHECK(mpt_policy_lookup("bfloat16", &p) == 0 && p.compute == MPT_DT_BF16);
    CHECK(mpt_policy_lookup("mixed_float8", &p) != 0);
    CHECK(mpt_policy_lookup(NULL, &p) != 0);
}

static void test_mixed_float16(void) {
    mpt_graph *fwd = mlp();
    mpt_policy_opts o = opts_for("mixed_float16");
    mpt_graph *t = apply(fwd, &o);
    CHECK(dtype_of(t, MPT_OP_MATMUL, "dense_1") == MPT_DT_F16);
    CHECK(dtype_of(t, MPT_OP_MATMUL, "dense_2") == MPT_DT_F16);
    CHECK(dtype_of(t, MPT_OP_RELU, "dense_1") == MPT_DT_F16);
    CHECK(dtype_of(t, MPT_OP_ADD, "dense_1") == MPT_DT_F16); /* bias add follows */
    /* softmax: max and shift follow the f16 input, exp and the sum are f32 */
    CHECK(dtype_of(t, MPT_OP_REDUCE_MAX, "predictions") == MPT_DT_F16);
    CHECK(dtype_of(t, MPT_OP_EXP, "predictions") == MPT_DT_F32);
    CHECK(dtype_of(t, MPT_OP_REDUCE_SUM, "predictions") == MPT_DT_F32);
    /* variables stay f32 master weights, each with exactly one f16 cast */
    for (int k = 0; k < mpt_graph_n_variables(t); k++) {
        int v = mpt_graph_variable_node(t, k);
        CHECK(t->nodes[v].dtype == MPT_DT_F32);
        CHECK_MSG(casts_of(t, v) == 1, "%s has %d casts", t->nodes[v].name, casts_of(t, v));
    }
    CHECK(mpt_graph_n_variables(t) == mpt_graph_n_variables(fwd));
    /* x stays f32 and is cast once, in the first layer */
    int x = mpt_graph_find_input(t, "x");
    CHECK(t->nodes[x].dtype == MPT_DT_F32 && casts_of(t, x) == 1);
    for (int i = 0; i < t->n_nodes; i++)
        if (t->nodes[i].op == MPT_OP_CAST && t->nodes[i].in[0] == x)
            CHECK(t->nodes[i].dtype == MPT_DT_F16 && t->nodes[i].layer &&
                  strcmp(t->nodes[i].layer, "dense_1") == 0);
    /* the model's outputs are f32; logits through a cast of the f16 value */
    int out = output_node(t, "output"), lg = output_node(t, "logits");
    CHECK(t->nodes[out].dtype == MPT_DT_F32);
    CHECK(t->nodes[lg].dtype == MPT_DT_F32 && t->nodes[lg].op == MPT_OP_CAST &&
          t->nodes[t->nodes[lg].in[0]].dtype == MPT_DT_F16);
    mpt_graph_free(t);
    mpt_graph_free(fwd);
}

static void test_layer_override(void) {
    mpt_graph *fwd = mlp();
    mpt_policy_opts o = opts_for("mixed_float16");
    const char *names[] = {"dense_2"}, *pols[] = {"float32"};
    o.n_layers = 1;
    o.layer_names = names;
    o.layer_policies = pols;
    mpt_graph *t = apply(fwd, &o);
    CHECK(dtype_of(t, MPT_OP_MATMUL, "dense_1") == MPT_DT_F16);
    CHECK(dtype_of(t, MPT_OP_MATMUL, "dense_2") == MPT_DT_F32);
    CHECK(dtype_of(t, MPT_OP_ADD, "dense_2") == MPT_DT_F32);
    int k2 = mpt_graph_find_variable(t, "dense_2/kernel");
    CHECK(casts_of(t, k2) == 0); /* an f32 layer reads its f32 variable directly */
    /* dense_1's f16 output is cast up where dense_2 takes it */
    CHECK(count_op(t, MPT_OP_CAST, "dense_2") == 1);
    mpt_graph_free(t);

    /* a low override of the producing layer keeps an output low (the caller
     * warns); a float16 softmax is still f32 from its exp on (FLOAT32 list) */
    const char *names2[] = {"dense_2", "predictions"}, *pols2[] = {"float16", "float16"};
    o.n_layers = 2;
    o.layer_names = names2;
    o.layer_policies = pols2;
    t = apply(fwd, &o);
    CHECK(t->nodes[output_node(t, "logits")].dtype == MPT_DT_F16);
    CHECK(t->nodes[output_node(t, "output")].dtype == MPT_DT_F32);
    CHECK(dtype_of(t, MPT_OP_REDUCE_MAX, "predictions") == MPT_DT_F16);
    mpt_graph_free(t);
    o.n_layers = 1;

    const char *bad[] = {"mixed_float8"};
    o.layer_policies = bad;
    char err[256] = "";
    CHECK(mpt_policy_apply(fwd, &o, err, sizeof err) == NULL);
    CHECK_MSG(strstr(err, "mixed_float8") && strstr(err, "mixed_float16"), "%s", err);
    mpt_graph_free(fwd);
}

static void test_bfloat16_and_float32(void) {
    mpt_graph *fwd = mlp();
    mpt_policy_opts o = opts_for("mixed_bfloat16");
    mpt_graph *t = apply(fwd, &o);
    CHECK(dtype_of(t, MPT_OP_MATMUL, "dense_1") == MPT_DT_BF16);
    CHECK(dtype_of(t, MPT_OP_RELU, "dense_1") == MPT_DT_BF16);
    CHECK(t->nodes[output_node(t, "output")].dtype == MPT_DT_F32);
    mpt_graph_free(t);

    o = opts_for("float32");
    t = apply(fwd, &o);
    CHECK(count_op(t, MPT_OP_CAST, NULL) == 0);
    for (int i = 0; i < t->n_nodes; i++) CHECK(t->nodes[i].dtype == MPT_DT_F32);
    CHECK(count_op(t, MPT_OP_MATMUL, NULL) == 2);
    mpt_graph_free(t);
    mpt_graph_free(fwd);
}

static void test_moves(void) {
    mpt_graph *fwd = mlp();
    mpt_policy_opts o = opts_for("mixed_float16");
    CHECK(mpt_policy_list_of(&o, MPT_OP_MATMUL) == MPT_PLIST_COMPUTE);
    CHECK(mpt_policy_list_of(&o, MPT_OP_EXP) == MPT_PLIST_FLOAT32);
    CHECK(mpt_policy_list_of(&o, MPT_OP_RELU) == MPT_PLIST_FOLLOW);

    const char *moves[] = {"exp", "reduce_sum", "relu"};
    mpt_plist to[] = {MPT_PLIST_FOLLOW, MPT_PLIST_FOLLOW, MPT_PLIST_FLOAT32};
    o.moves = moves;
    o.move_to = to;
    o.n_moves = 3;
    CHECK(mpt_policy_list_of(&o, MPT_OP_EXP) == MPT_PLIST_FOLLOW);
    mpt_graph *t = apply(fwd, &o);
    CHECK(dtype_of(t, MPT_OP_EXP, "predictions") == MPT_DT_F16);
    CHECK(dtype_of(t, MPT_OP_REDUCE_SUM, "predictions") == MPT_DT_F16);
    CHECK(dtype_of(t, MPT_OP_RELU, "dense_1") == MPT_DT_F32);
    CHECK(t->nodes[output_node(t, "output")].dtype == MPT_DT_F32); /* still cast at the end */
    mpt_graph_free(t);

    /* the lists print with the moves applied */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    mpt_policy_print_lists(&o, f);
    fclose(f);
    char *fl = strstr(text, "float32"), *fo = strstr(text, "follow");
    CHECK(fl && fo && strstr(fl, " relu") && strstr(fo, " exp") && strstr(text, "matmul"));
    CHECK(!strstr(fl, " exp") || strstr(fl, " exp") > fo);
    free(text);

    /* a group name, and a move into compute */
    const char *m2[] = {"dense"};
    mpt_plist t2[] = {MPT_PLIST_FLOAT32};
    o.moves = m2;
    o.move_to = t2;
    o.n_moves = 1;
    t = apply(fwd, &o);
    CHECK(dtype_of(t, MPT_OP_MATMUL, "dense_1") == MPT_DT_F32);
    mpt_graph_free(t);

    char err[256] = "";
    const char *m3[] = {"softmaxx"};
    o.moves = m3;
    CHECK(mpt_policy_apply(fwd, &o, err, sizeof err) == NULL);
    CHECK_MSG(strstr(err, "softmaxx") && strstr(err, "hint"), "%s", err);
    const char *m4[] = {"cast"};
    o.moves = m4;
    CHECK(mpt_policy_apply(fwd, &o, err, sizeof err) == NULL);
    mpt_graph_free(fwd);
}

/* batch-norm statistics, a dropout mask and an embedding lookup */
static void test_stats_masks_gather(void) {
    mpt_graph *g = mpt_graph_new("bn");
    mpt_shape s = mpt_shape_2(B, HID);
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(B, IN));
    int h = dense(g, "dense_1", x, HID, 1);
    mpt_b_layer(g, "bn");
    int mv = mpt_b_variable(g, "bn/moving_mean", mpt_shape_1(HID), MPT_INIT_ZEROS, 0, 0, 0, 0);
    int mean = mpt_b_binary(g, MPT_OP_MUL, mpt_b_reduce(g, MPT_OP_REDUCE_SUM, h, 1),
                            mpt_b_const(g, MPT_DT_F32, mpt_shape_1(HID), 1.0 / B));
    int centered = mpt_b_binary(g, MPT_OP_SUB, h, mpt_b_broadcast_to(g, mean, s));
    int upd = mpt_b_binary(g, MPT_OP_ADD,
                           mpt_b_binary(g, MPT_OP_MUL, mv, mpt_b_const(g, MPT_DT_F32, mpt_shape_1(HID), 0.99)),
                           mpt_b_binary(g, MPT_OP_MUL, mean, mpt_b_const(g, MPT_DT_F32, mpt_shape_1(HID), 0.01)));
    mpt_graph_add_update(g, mv, upd);
    mpt_b_layer(g, "dropout");
    int ctr = mpt_b_variable_dt(g, "rng/counter", MPT_DT_I32, mpt_shape_scalar(), MPT_INIT_ZEROS, 0);
    int keep = mpt_b_binary(g, MPT_OP_GT, mpt_b_random_uniform(g, ctr, s, 7),
                            mpt_b_const(g, MPT_DT_F32, s, 0.5));
    int dropped = mpt_b_binary(g, MPT_OP_MUL, centered, mpt_b_cast(g, keep, MPT_DT_F32));
    mpt_graph_add_update(g, ctr, mpt_b_binary(g, MPT_OP_ADD, ctr, mpt_b_scalar(g, MPT_DT_I32, 1)));
    mpt_b_layer(g, "emb");
    int ids = mpt_b_input(g, "ids", MPT_DT_I32, mpt_shape_1(B));
    int table = mpt_b_variable(g, "emb/embeddings", mpt_shape_2(10, HID), MPT_INIT_UNIFORM, 0, 0, 0.05, 1);
    int rows = mpt_b_gather(g, table, ids);
    mpt_b_layer(g, "sum");
    int y = mpt_b_binary(g, MPT_OP_ADD, dropped, rows);
    mpt_graph_add_output(g, "output", y);

    mpt_policy_opts o = opts_for("mixed_float16");
    mpt_graph *t = apply(g, &o);
    CHECK(dtype_of(t, MPT_OP_REDUCE_SUM, "bn") == MPT_DT_F32);
    CHECK(dtype_of(t, MPT_OP_SUB, "bn") == MPT_DT_F32); /* a statistic meets f16: f32 */
    CHECK(dtype_of(t, MPT_OP_MUL, "dropout") == MPT_DT_F16); /* the mask follows x */
    CHECK(dtype_of(t, MPT_OP_GATHER, "emb") == MPT_DT_F32);  /* rows gathered, then cast */
    int table_t = mpt_graph_find_variable(t, "emb/embeddings");
    CHECK(casts_of(t, table_t) == 0);
    for (int k = 0; k < t->n_updates; k++) {
        int var = t->updates[k].var, val = t->updates[k].value;
        CHECK(t->nodes[val].dtype == t->nodes[var].dtype);
    }
    CHECK(t->n_updates == 2);
    /* the moving average is state arithmetic: f32, the variable never cast */
    CHECK(casts_of(t, mpt_graph_find_variable(t, "bn/moving_mean")) == 0);
    CHECK(dtype_of(t, MPT_OP_ADD, "bn") == MPT_DT_F32);
    mpt_graph_free(t);
    mpt_graph_free(g);
}

/* An LSTM-like cell: [x, h] joined, and one kernel variable sliced into
 * two gates' kernels. The join follows its inputs (the compute dtype); the
 * slices of the variable are seen as the variable: it is cast once and the
 * slices are taken of the cast, in the matmuls' dtype. */
static void test_slice_concat(void) {
    for (int mixed = 0; mixed < 2; mixed++) {
        mpt_graph *g = mpt_graph_new("cell");
        int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(B, IN));
        int h = mpt_b_input(g, "h", MPT_DT_F32, mpt_shape_2(B, HID));
        mpt_b_layer(g, "lstm");
        int k = mpt_b_variable(g, "lstm/kernel", mpt_shape_2(IN + HID, 2 * HID),
                               MPT_INIT_GLOROT_UNIFORM, IN + HID, 2 * HID, 0, 1);
        int xh = mpt_b_concat(g, x, h, 1);
        int zi = mpt_b_matmul(g, xh, mpt_b_slice(g, k, 1, 0, HID), 0, 0);
        int zc = mpt_b_matmul(g, xh, mpt_b_slice(g, k, 1, HID, HID), 0, 0);
        int y = mpt_b_binary(g, MPT_OP_MUL, mpt_b_unary(g, MPT_OP_SIGMOID, zi),
                             mpt_b_unary(g, MPT_OP_TANH, zc));
        mpt_graph_add_output(g, "output", y);
        mpt_policy_opts o = opts_for(mixed ? "mixed_float16" : "float32");
        mpt_graph *t = apply(g, &o);
        mpt_dtype cd = mixed ? MPT_DT_F16 : MPT_DT_F32;
        CHECK(dtype_of(t, MPT_OP_CONCAT, "lstm") == cd);
        CHECK(dtype_of(t, MPT_OP_MATMUL, "lstm") == cd);
        CHECK(casts_of(t, mpt_graph_find_variable(t, "lstm/kernel")) == mixed);
        int slices = 0;
        for (int i = 0; i < t->n_nodes; i++)
            if (t->nodes[i].op == MPT_OP_SLICE) {
                slices++;
                CHECK(t->nodes[i].dtype == cd);
                CHECK(mixed ? t->nodes[t->nodes[i].in[0]].op == MPT_OP_CAST
                            : t->nodes[i].in[0] == mpt_graph_find_variable(t, "lstm/kernel"));
            }
        CHECK(slices == 2);
        mpt_graph_free(t);
        mpt_graph_free(g);
    }
}

/* Attention in a layer: both batch_matmuls run in the compute dtype from
 * casts of the f32 inputs, as matmul does; the softmax between them keeps
 * exp and reduce_sum in f32, and P is cast back down for P v. */
static void test_batch_matmul(void) {
    static const char *policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
    static const mpt_dtype cds[] = {MPT_DT_F32, MPT_DT_F16, MPT_DT_BF16};
    for (int pi = 0; pi < 3; pi++) {
        mpt_graph *g = mpt_graph_new("attention");
        mpt_shape s = mpt_shape_make(4, (const int64_t[]){2, 2, 5, 4});
        int q = mpt_b_input(g, "q", MPT_DT_F32, s), v = mpt_b_input(g, "v", MPT_DT_F32, s);
        mpt_b_layer(g, "attention");
        int sc = mpt_b_batch_matmul(g, q, q, 0, 1);
        int p = softmax4(g, sc);
        mpt_graph_add_output(g, "output", mpt_b_batch_matmul(g, p, v, 0, 0));
        mpt_policy_opts o = opts_for(policies[pi]);
        CHECK(mpt_policy_list_of(&o, MPT_OP_BATCH_MATMUL) == MPT_PLIST_COMPUTE);
        mpt_graph *t = apply(g, &o);
        int n = 0;
        for (int i = 0; i < t->n_nodes; i++) {
            const mpt_node *nd = &t->nodes[i];
            if (nd->op != MPT_OP_BATCH_MATMUL) continue;
            n++;
            /* operands in the compute dtype, the product written in f32
             * (f32_out): attention's scores and softmax stay f32 */
            CHECK_MSG(nd->dtype == MPT_DT_F32 && nd->attr.i[2] == (pi != 0),
                      "%s: batch_matmul writes %s (f32_out=%lld)", policies[pi],
                      mpt_dtype_name(nd->dtype), (long long)nd->attr.i[2]);
            for (int k = 0; k < 2; k++) {
                const mpt_node *in = &t->nodes[nd->in[k]];
                CHECK(in->dtype == cds[pi]);
                CHECK(pi == 0 ? in->op != MPT_OP_CAST : in->op == MPT_OP_CAST);
            }
        }
        CHECK(n == 2);
        CHECK(dtype_of(t, MPT_OP_EXP, "attention") == MPT_DT_F32);
        mpt_graph_free(t);
        mpt_graph_free(g);
    }
}

/* x * x in the interpreter for one scalar x under a policy */
static double square_under(const char *policy, double xv, mpt_dtype *mul_dt) {
    mpt_graph *g = mpt_graph_new("sq");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_1(1));
    mpt_b_layer(g, "square");
    mpt_graph_add_output(g, "output", mpt_b_binary(g, MPT_OP_MUL, x, x));
    mpt_policy_opts o = opts_for(policy);
    mpt_graph *t = apply(g, &o);
    *mul_dt = dtype_of(t, MPT_OP_MUL, "square");
    mpt_tensor in, out = {0};
    mpt_tensor_alloc(&in, MPT_DT_F32, mpt_shape_1(1));
    mpt_tensor_set(&in, 0, xv);
    char err[256] = "";
    int rc = mpt_interp_run(t, &in, NULL, &out, NULL, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    double r = rc == 0 ? mpt_tensor_get(&out, 0) : NAN;
    CHECK(rc != 0 || out.dtype == MPT_DT_F32);
    mpt_tensor_free(&in);
    mpt_tensor_free(&out);
    mpt_graph_free(t);
    mpt_graph_free(g);
    return r;
}

static void test_f16_range(void) {
    mpt_dtype dt;
    double r = square_under("mixed_float16", 256, &dt);
    CHECK(dt == MPT_DT_F16);
    CHECK_MSG(isinf(r) && r > 0, "256^2 in f16 gave %g", r);
    r = square_under("mixed_float16", 1e-5, &dt);
    CHECK_MSG(r == 0, "1e-5^2 in f16 gave %g", r);
    /* the same graphs in f32 and bf16 keep both (bf16 has f32's range) */
    CHECK(square_under("float32", 256, &dt) == 65536 && dt == MPT_DT_F32);
    CHECK_NEAR(square_under("float32", 1e-5, &dt), 1e-10, 0, 1e-6);
    CHECK(square_under("mixed_bfloat16", 256, &dt) == 65536 && dt == MPT_DT_BF16);
    r = square_under("mixed_bfloat16", 1e-5, &dt);
    CHECK_NEAR(r, 1e-10, 0, 1e-2); /* bf16 keeps 8 bits: relative error ~ 2^-8 */
}

int main(void) {
    test_lookup();
    test_mixed_float16();
    test_layer_override();
    test_bfloat16_and_float32();
    test_moves();
    test_stats_masks_gather();
    test_slice_concat();
    test_batch_matmul();
    test_f16_range();
    return check_exit("test_policy");
}
