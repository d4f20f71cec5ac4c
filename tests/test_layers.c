/* tests/test_layers.c — the layers for sequences, branches and upsampling
 * (multiply, concatenate, up_sampling2d, conv2d_transpose, the global max
 * and 1-D pools, position_embedding, lstm, gru), each in a small model:
 *
 *   (a) gradients: the lowered forward graph, every float node retyped to
 *       f64, y = sum(output * w) with fixed random w; autodiff's gradient
 *       of every variable against central differences (the bound and its
 *       reasoning are tests/test_grad.c's: |fd - ad| <= 1e-6 + 1e-5 |fd|);
 *   (b) the CPU JIT against the interpreter: two train steps from the same
 *       state and batch under float32, mixed_float16 and mixed_bfloat16,
 *       with the accumulation tolerance of the compute dtype
 *       (tests/cpu_check.h's table; Adam can turn a gradient that is 0 on
 *       one side and rounding noise on the other into a whole step of lr,
 *       so weights may differ by lr per step, as train_steps there says);
 *   (c) Keras' parameter counts and shapes, and shape errors at the layer.
 */
#include "cpu_check.h"

#define BATCH 3

typedef struct {
    const char *name;
    const char *src;
    int64_t params; /* Keras' count */
} model_case;

#define TRAIN "train {\n    optimizer = adam(learning_rate=0.001)\n}\n"

static const model_case cases[] = {
    {"multiply_concat",
     "model m {\n    input x: [6]\n    dense a(units=4, activation=tanh)\n"
     "    dense b(units=4, activation=sigmoid) from x\n    multiply ab from a, b\n"
     "    concatenate j from ab, a, x\n    dense out(units=3)\n"
     "    activation p(softmax, dtype=float32)\n}\n" TRAIN,
     6 * 4 + 4 + 6 * 4 + 4 + 14 * 3 + 3},
    {"concat_middle_axis",
     "model m {\n    input x: [4, 3]\n    dense a(units=3, activation=tanh)\n"
     "    concatenate j(axis=1) from a, x\n    flatten\n    dense out(units=3)\n"
     "    activation p(softmax, dtype=float32)\n}\n" TRAIN,
     3 * 3 + 3 + 24 * 3 + 3},
    {"upsampling_transpose",
     "model m {\n    input x: [4, 4, 2]\n    conv2d c(filters=3, kernel=3, padding=same, activation=relu)\n"
     "    up_sampling2d u(size=[2, 3])\n    conv2d_transpose t(filters=2, kernel=3, strides=2, padding=same)\n"
     "    conv2d_transpose v(filters=2, kernel=[2, 3], activation=tanh)\n"
     "    global_max_pool2d g\n    dense out(units=3)\n    activation p(softmax, dtype=float32)\n}\n" TRAIN,
     3 * 3 * 2 * 3 + 3 + 3 * 3 * 3 * 2 + 2 + 2 * 3 * 2 * 2 + 2 + 2 * 3 + 3},
    {"pools_1d_position",
     "model m {\n    input x: [5, 4]\n    position_embedding pos(max_length=8)\n"
     "    dense d(units=4, activation=gelu)\n    global_avg_pool1d a from d\n"
     "    global_max_pool1d b from pos\n    add s from a, b\n    dense out(units=3)\n"
     "    activation p(softmax, dtype=float32)\n}\n" TRAIN,
     8 * 4 + 4 * 4 + 4 + 4 * 3 + 3},
    {"lstm",
     "model m {\n    input x: [3, 3]\n    lstm l(units=5, return_sequences=true)\n"
     "    lstm k(units=4)\n    dense out(units=3)\n    activation p(softmax, dtype=float32)\n}\n" TRAIN,
     (3 + 5) * 20 + 20 + (5 + 4) * 16 + 16 + 4 * 3 + 3},
    {"gru",
     "model m {\n    input x: [3, 3]\n    gru g(units=5, return_sequences=true)\n"
     "    gru h(units=4, reset_after=false)\n    dense out(units=3)\n"
     "    activation p(softmax, dtype=float32)\n}\n" TRAIN,
     (3 + 5) * 15 + 30 + (5 + 4) * 12 + 12 + 4 * 3 + 3},
    {"depthwise_separable",
     "model m {\n    input x: [7, 6, 3]\n    depthwise_conv2d d(kernel=3, strides=2, padding=same, depth_multiplier=2, activation=relu)\n"
     "    separable_conv2d s(filters=4, kernel=[2, 3], activation=tanh)\n"
     "    depthwise_conv2d v(kernel=[2, 1], use_bias=false)\n"
     "    global_avg_pool2d g\n    dense out(units=3)\n    activation p(softmax, dtype=float32)\n}\n" TRAIN,
     9 * 3 * 2 + 6 + (6 * 6 * 1 + 6 * 4 + 4) + 2 * 4 + 4 * 3 + 3},
    {"attention",
     "model m {\n    input x: [5, 6]\n    dense e(units=8, activation=tanh)\n"
     "    multi_head_attention self(num_heads=2, key_dim=3, use_causal_mask=true)\n"
     "    dense f(units=8) from x\n"
     "    multi_head_attention cross(num_heads=2, key_dim=4, value_dim=3) from self, f\n"
     "    global_avg_pool1d g\n    dense out(units=3)\n    activation p(softmax, dtype=float32)\n}\n" TRAIN,
     6 * 8 + 8 + (3 * (8 * 2 * 3 + 2 * 3) + 2 * 3 * 8 + 8) + 6 * 8 + 8 +
         (8 * 2 * 4 + 2 * 4 + 8 * 2 * 4 + 2 * 4 + 8 * 2 * 3 + 2 * 3 + 2 * 3 * 8 + 8) + 8 * 3 + 3},
};
#define N_CASES ((int)(sizeof cases / sizeof *cases))

static mpt_model *load(const model_case *c, int training, FILE *diag) {
    mpt_lower_opts lo = {.batch_size = BATCH, .training = training};
    mpt_model *m = NULL;
    int bad = mpt_lang_load_string(c->name, c->src, &lo, &m, diag);
    CHECK_MSG(bad == 0 && m, "%s does not load", c->name);
    return bad ? NULL : m;
}

/* ---- (a) gradients against finite differences, in f64 ---- */

static mpt_graph *as_f64(const mpt_graph *src) {
    mpt_graph *g = mpt_graph_new(src->name);
    int *map = calloc((size_t)src->n_nodes + 1, sizeof *map);
    for (int i = 0; i < src->n_nodes; i++) {
        map[i] = mpt_graph_copy_node(g, src, i, map);
        if (g->nodes[map[i]].dtype == MPT_DT_F32) g->nodes[map[i]].dtype = MPT_DT_F64;
    }
    for (int k = 0; k < src->n_outputs; k++)
        mpt_graph_add_output(g, src->outputs[k].name, map[src->outputs[k].node]);
    free(map);
    return g;
}

static double run_y(const mpt_graph *g, const mpt_tensor *in, mpt_tensor *vars, int n_vars) {
    /* the interpreter writes updates into vars: none here, but keep a copy */
    mpt_tensor *out = calloc((size_t)g->n_outputs + 1, sizeof *out);
    char err[256];
    double y = NAN;
    if (mpt_interp_run(g, in, vars, out, NULL, err, sizeof err) != 0) CHECK_MSG(0, "interpreter: %s", err);
    else y = mpt_tensor_get(&out[0], 0);
    for (int k = 0; k < g->n_outputs; k++) mpt_tensor_free(&out[k]);
    free(out);
    (void)n_vars;
    return y;
}

static void check_gradients(const model_case *c) {
    mpt_model *m = load(c, 1, stderr);
    if (!m) return;
    mpt_graph *g = as_f64(m->graph);
    int out = g->outputs[mpt_graph_find_output(g, "output")].node;
    mpt_shape os = g->nodes[out].shape;
    int w = mpt_b_input(g, "fd_weights", MPT_DT_F64, os);
    int prod = mpt_b_binary(g, MPT_OP_MUL, out, w);
    int y = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, prod, (1LL << os.rank) - 1);
    int n_vars = mpt_graph_n_variables(g);
    int *wrt = calloc((size_t)n_vars + 1, sizeof *wrt), *grads = calloc((size_t)n_vars + 1, sizeof *grads);
    for (int k = 0; k < n_vars; k++) wrt[k] = mpt_graph_variable_node(g, k);
    char err[512];
    int rc = mpt_autodiff(g, y, -1, wrt, n_vars, grads, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: autodiff: %s", c->name, err);
    /* outputs: y first, then each gradient */
    mpt_graph *h = mpt_graph_new(c->name);
    int *map = calloc((size_t)g->n_nodes + 1, sizeof *map);
    for (int i = 0; i < g->n_nodes; i++) map[i] = mpt_graph_copy_node(h, g, i, map);
    mpt_graph_add_output(h, "y", map[y]);
    for (int k = 0; k < n_vars; k++)
        if (grads[k] >= 0) mpt_graph_add_output(h, h->nodes[map[wrt[k]]].name, map[grads[k]]);
    free(map);
    const char *bad = mpt_graph_verify(h, err, sizeof err);
    CHECK_MSG(!bad, "%s: gradient graph: %s", c->name, bad);
    mpt_tensor *in = calloc(4, sizeof *in), *vars = calloc((size_t)n_vars + 1, sizeof *vars);
    mpt_init_variables(h, vars, 7);
    for (int k = 0; k < mpt_graph_n_inputs(h); k++) {
        const mpt_node *nd = &h->nodes[mpt_graph_input_node(h, k)];
        mpt_tensor_alloc(&in[k], nd->dtype, nd->shape);
        for (int64_t i = 0; i < mpt_shape_numel(nd->shape); i++)
            mpt_tensor_set(&in[k], i, strcmp(nd->name, "fd_weights") == 0 ? 0.5 + urand()
                                                                           : 2 * urand() - 1);
    }
    /* biases start at zero, where relu and max have kinks: move them off */
    for (int k = 0; k < n_vars; k++)
        for (int64_t i = 0; i < mpt_shape_numel(vars[k].shape); i++)
            mpt_tensor_set(&vars[k], i, mpt_tensor_get(&vars[k], i) + 0.2 * (urand() - 0.5));
    mpt_tensor outs[64];
    if (!bad && rc == 0 && h->n_outputs <= 64 &&
        mpt_interp_run(h, in, vars, outs, NULL, err, sizeof err) == 0) {
        int before = check_failures, o = 1;
        for (int k = 0; k < n_vars; k++) {
            if (grads[k] < 0) continue;
            const mpt_tensor *ad = &outs[o++];
            int64_t n = mpt_shape_numel(vars[k].shape), stride = n > 24 ? n / 24 : 1;
            for (int64_t i = 0; i < n; i += stride) {
                double x0 = mpt_tensor_get(&vars[k], i), step = 1e-6 * (fabs(x0) > 1 ? fabs(x0) : 1);
                mpt_tensor_set(&vars[k], i, x0 + step);
                double yp = run_y(h, in, vars, n_vars);
                mpt_tensor_set(&vars[k], i, x0 - step);
                double ym = run_y(h, in, vars, n_vars);
                mpt_tensor_set(&vars[k], i, x0);
                double fd = (yp - ym) / (2 * step), got = mpt_tensor_get(ad, i);
                CHECK_MSG(fabs(fd - got) <= 1e-6 + 1e-5 * fabs(fd),
                          "%s: d y / d %s[%lld]: autodiff %.12g, finite difference %.12g",
                          c->name, h->nodes[mpt_graph_variable_node(h, k)].name, (long long)i, got,
                          fd);
                if (check_failures - before > 8) break;
            }
        }
        for (int k = 0; k < h->n_outputs; k++) mpt_tensor_free(&outs[k]);
    } else {
        CHECK_MSG(0, "%s: the interpreter failed on the gradient graph: %s", c->name, err);
    }
    for (int k = 0; k < mpt_graph_n_inputs(h); k++) mpt_tensor_free(&in[k]);
    for (int k = 0; k < n_vars; k++) mpt_tensor_free(&vars[k]);
    free(in);
    free(vars);
    free(wrt);
    free(grads);
    mpt_graph_free(h);
    mpt_graph_free(g);
    mpt_model_free(m);
}

/* ---- (b) the CPU JIT against the interpreter, three policies ---- */

static void check_backend(const model_case *c, const char *policy) {
    mpt_model *m = load(c, 1, stderr);
    if (!m) return;
    char err[512], what[160];
    mpt_policy_opts po = {0};
    mpt_policy_lookup(policy, &po.global);
    mpt_graph *typed = mpt_policy_apply(m->graph, &po, err, sizeof err);
    CHECK_MSG(typed != NULL, "%s: policy: %s", c->name, err);
    mpt_train_opts to = {.loss = m->train.loss, .opt = m->train.optimizer,
                         .loss_scale = m->train.loss_scale, .metrics = {.accuracy = 1}};
    to.loss_scale.mode = strcmp(policy, "mixed_float16") ? MPT_LS_NONE : MPT_LS_DYNAMIC;
    mpt_graph *step = typed ? mpt_train_step(typed, &to, err, sizeof err) : NULL;
    CHECK_MSG(step != NULL, "%s: train step: %s", c->name, err);
    if (step) {
        mpt_dtype dt = strcmp(policy, "float32") == 0 ? MPT_DT_F32
                       : strcmp(policy, "mixed_float16") == 0 ? MPT_DT_F16 : MPT_DT_BF16;
        tol t = tol_for(TOL_ACCUM, dt, 1);
        t.atol += 1.2e-3 * 2;
        snprintf(what, sizeof what, "%s %s", c->name, policy);
        /* fused and unfused under float32 for the cases of few kernels (the
         * unfused recurrent, depthwise and attention steps are hundreds of
         * one-op kernels, each op already compared in test_cpu_backend); the
         * fused plan otherwise */
        int small = strstr(c->name, "lstm") == NULL && strstr(c->name, "gru") == NULL &&
                    strstr(c->name, "depthwise") == NULL && strstr(c->name, "attention") == NULL;
        run_both(step, 2, t, 0, what, dt == MPT_DT_F32 && small ? BOTH : FUSED);
    }
    mpt_graph_free(step);
    mpt_graph_free(typed);
    mpt_model_free(m);
}

/* ---- (c) shapes, parameters, errors ---- */

static void check_params(const model_case *c) {
    mpt_model *m = load(c, 0, stderr);
    if (!m) return;
    int64_t n = 0;
    for (int k = 0; k < m->n_layers; k++) n += m->layers[k].n_params;
    CHECK_MSG(n == c->params, "%s: %lld parameters, Keras counts %lld", c->name, (long long)n,
              (long long)c->params);
    mpt_model_free(m);
}

static void check_error(const char *src, const char *want) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    mpt_lower_opts lo = {.batch_size = 2, .training = 1};
    mpt_model *m = NULL;
    int bad = mpt_lang_load_string("bad.mpt", src, &lo, &m, f);
    fclose(f);
    CHECK_MSG(bad && strstr(text, want), "want an error with '%s', got:\n%s", want, text);
    mpt_model_free(m);
    free(text);
}

static void test_errors(void) {
    check_error("model m {\n    input x: [4, 2]\n    dense a(units=3)\n    concatenate j(axis=1) from a, x\n}\n",
                "bad.mpt:4:5: error: concatenate on axis 1: 'a' is [4,3] but 'x' is [4,2]");
    check_error("model m {\n    input x: [4, 2]\n    dense a(units=3)\n    concatenate j(axis=0) from a, x\n}\n",
                "concatenate axis 0 is not a dim of its 2-dim inputs (0 is the batch)");
    check_error("model m {\n    input x: [8]\n    lstm l(units=4)\n}\n",
                "bad.mpt:3:5: error: lstm needs a sequence input [steps, features], got [8]");
    check_error("model m {\n    input x: [9, 4]\n    position_embedding p(max_length=8)\n}\n",
                "the sequence has 9 steps, more than max_length 8");
    check_error("model m {\n    input x: [4, 4, 1]\n    conv2d_transpose t(filters=2, kernel=3, padding=1)\n}\n",
                "conv2d_transpose takes no explicit padding");
    check_error("model m {\n    input x: [6]\n    dense a(units=6)\n    multiply p from a\n}\n",
                "multiply takes 2 or more inputs, got 1");
    check_error("model m {\n    input x: [6]\n    up_sampling2d u\n}\n",
                "up_sampling2d needs an image input [height, width, channels], got [6]");
}

/* ---- a label per position: [B, T, C] outputs (a language model's) ---- */

static void test_sequence_loss(void) {
    static const model_case c = {
        "per_position",
        "model m {\n    input x: [5, 3]\n    dense out(units=4)\n    activation p(softmax, dtype=float32)\n}\n"
        "train {\n    data = text(\"corpus.txt\")\n    metrics = [accuracy, top_k_accuracy(k=2)]\n}\n", 0};
    mpt_model *m = load(&c, 1, stderr);
    if (!m) return;
    char err[512];
    mpt_train_opts to = {.loss = m->train.loss, .opt = m->train.optimizer,
                         .loss_scale = {.mode = MPT_LS_NONE}, .metrics = m->train.metrics};
    mpt_graph *step = mpt_train_step(m->graph, &to, err, sizeof err);
    CHECK_MSG(step != NULL, "per-position train step: %s", err);
    if (!step) {
        mpt_model_free(m);
        return;
    }
    int yi = mpt_graph_find_input(step, "y");
    CHECK(yi >= 0 && step->nodes[yi].dtype == MPT_DT_I32 && step->nodes[yi].shape.rank == 2 &&
          step->nodes[yi].shape.dim[1] == 5);
    /* the forward graph's probabilities, then the step's loss and counts */
    int nf = mpt_graph_n_variables(m->graph), ns = mpt_graph_n_variables(step);
    mpt_tensor *fv = calloc((size_t)nf + 1, sizeof *fv), *sv = calloc((size_t)ns + 1, sizeof *sv);
    mpt_init_variables(m->graph, fv, 3);
    mpt_init_variables(step, sv, 3); /* same names and seed: the same weights */
    mpt_tensor x, in[2], fo[4], so[8];
    mpt_tensor_alloc(&x, MPT_DT_F32, mpt_shape_make(3, (int64_t[]){BATCH, 5, 3}));
    for (int64_t i = 0; i < BATCH * 15; i++) mpt_tensor_set(&x, i, 2 * urand() - 1);
    mpt_tensor_alloc(&in[1], MPT_DT_I32, mpt_shape_2(BATCH, 5));
    for (int64_t i = 0; i < BATCH * 5; i++) mpt_tensor_set(&in[1], i, (double)(i * 7 % 4));
    in[0] = x;
    int ok = mpt_interp_run(m->graph, &x, fv, fo, NULL, err, sizeof err) == 0;
    ok = ok && mpt_interp_run(step, in, sv, so, NULL, err, sizeof err) == 0;
    CHECK_MSG(ok, "per-position run: %s", err);
    if (ok) {
        const mpt_tensor *p = &fo[mpt_graph_find_output(m->graph, "output")];
        double loss = 0, right = 0, top2 = 0;
        for (int64_t r = 0; r < BATCH * 5; r++) {
            int label = (int)mpt_tensor_get(&in[1], r), best = 0, above = 0;
            double mine = mpt_tensor_get(p, r * 4 + label);
            for (int k = 0; k < 4; k++) {
                double v = mpt_tensor_get(p, r * 4 + k);
                if (v > mpt_tensor_get(p, r * 4 + best)) best = k;
                above += v > mine;
            }
            loss -= log(mine) / (BATCH * 5);
            right += (best == label) / 5.0;
            top2 += (above < 2) / 5.0;
        }
        CHECK_NEAR(mpt_tensor_get(&so[mpt_graph_find_output(step, "loss")], 0), loss, 1e-6, 1e-5);
        CHECK_NEAR(mpt_tensor_get(&so[mpt_graph_find_output(step, "correct")], 0), right, 1e-6, 1e-6);
        CHECK_NEAR(mpt_tensor_get(&so[mpt_graph_find_output(step, "top_k_correct")], 0), top2, 1e-6,
                   1e-6);
        for (int k = 0; k < m->graph->n_outputs; k++) mpt_tensor_free(&fo[k]);
        for (int k = 0; k < step->n_outputs; k++) mpt_tensor_free(&so[k]);
    }
    mpt_tensor_free(&x);
    mpt_tensor_free(&in[1]);
    for (int k = 0; k < nf; k++) mpt_tensor_free(&fv[k]);
    for (int k = 0; k < ns; k++) mpt_tensor_free(&sv[k]);
    free(fv);
    free(sv);
    mpt_graph_free(step);
    mpt_model_free(m);
}

/* Scores past float16's range under mixed_float16: the batch matmuls write
 * f32 (ir/policy.c), so the softmax sees finite numbers and the step stays
 * finite, where a float16 score would be inf and the softmax NaN. */
static int largest_score(void *ctx, const mpt_graph *g, int id, const mpt_tensor *v) {
    if (g->nodes[id].op != MPT_OP_BATCH_MATMUL) return 0;
    double *best = ctx;
    for (int64_t i = 0; i < mpt_shape_numel(v->shape); i++)
        if (fabs(mpt_tensor_get(v, i)) > *best) *best = fabs(mpt_tensor_get(v, i));
    return 0;
}

static void test_attention_range(void) {
    static const model_case c = {
        "big_scores",
        "model m {\n    input x: [4, 8]\n    multi_head_attention a(num_heads=1, key_dim=8, use_causal_mask=true)\n"
        "    global_avg_pool1d g\n    dense out(units=3)\n    activation p(softmax, dtype=float32)\n}\n" TRAIN, 0};
    mpt_model *m = load(&c, 1, stderr);
    if (!m) return;
    char err[512];
    mpt_policy_opts po = {0};
    mpt_policy_lookup("mixed_float16", &po.global);
    mpt_graph *typed = mpt_policy_apply(m->graph, &po, err, sizeof err);
    int f32_scores = 0;
    for (int i = 0; typed && i < typed->n_nodes; i++)
        if (typed->nodes[i].op == MPT_OP_BATCH_MATMUL) {
            CHECK_MSG(typed->nodes[i].dtype == MPT_DT_F32 &&
                          typed->nodes[typed->nodes[i].in[0]].dtype == MPT_DT_F16,
                      "a batch matmul under mixed_float16 reads f16 and writes f32");
            f32_scores++;
        }
    CHECK(f32_scores == 2);
    mpt_train_opts to = {.loss = m->train.loss, .opt = m->train.optimizer,
                         .loss_scale = {.mode = MPT_LS_NONE}, .metrics = {.accuracy = 1}};
    mpt_graph *step = typed ? mpt_train_step(typed, &to, err, sizeof err) : NULL;
    CHECK_MSG(step != NULL, "big scores: %s", err);
    if (step) {
        int nv = mpt_graph_n_variables(step);
        mpt_tensor *vars = calloc((size_t)nv + 1, sizeof *vars), in[2], out[16];
        mpt_init_variables(step, vars, 5);
        for (int k = 0; k < nv; k++) { /* query and key kernels of 30: scores ~ 1e5..1e6 */
            const char *nm = step->nodes[mpt_graph_variable_node(step, k)].name;
            if (strstr(nm, "query/kernel") || strstr(nm, "key/kernel"))
                for (int64_t i = 0; i < mpt_shape_numel(vars[k].shape); i++)
                    mpt_tensor_set(&vars[k], i, i % 3 ? 30.0 : -30.0);
        }
        for (int k = 0; k < 2; k++) {
            const mpt_node *nd = &step->nodes[mpt_graph_input_node(step, k)];
            mpt_tensor_alloc(&in[k], nd->dtype, nd->shape);
            for (int64_t i = 0; i < mpt_shape_numel(nd->shape); i++)
                mpt_tensor_set(&in[k], i, nd->dtype == MPT_DT_I32 ? (double)(i % 3) : 3.0 + (i % 5));
        }
        double max_score = 0;
        mpt_interp_opts io = {.on_node = largest_score, .ctx = &max_score};
        int rc = mpt_interp_run(step, in, vars, out, &io, err, sizeof err);
        CHECK_MSG(rc == 0, "big scores: %s", err);
        if (rc == 0) {
            CHECK_MSG(mpt_tensor_get(&out[mpt_graph_find_output(step, "finite")], 0) == 1 &&
                          isfinite(mpt_tensor_get(&out[mpt_graph_find_output(step, "loss")], 0)),
                      "a step with scores past float16's range is finite");
            for (int k = 0; k < step->n_outputs; k++) mpt_tensor_free(&out[k]);
        }
        /* the test means it: the scores the step computed do pass 65504 */
        CHECK_MSG(max_score > 65504, "the planted scores reach %g", max_score);
        for (int k = 0; k < 2; k++) mpt_tensor_free(&in[k]);
        for (int k = 0; k < nv; k++) mpt_tensor_free(&vars[k]);
        free(vars);
    }
    mpt_graph_free(step);
    mpt_graph_free(typed);
    mpt_model_free(m);
}

int main(int argc, char **argv) {
    char why[256];
    int cpu = mpt_backend_cpu.available(why, sizeof why);
    if (!cpu) printf("note: no CPU JIT here (%s): the backend comparisons are skipped\n", why);
    /* every case under float32 and one mixed policy by turns, which keeps
     * the suite's time; --all runs each case under all three */
    int all = argc > 1 && strcmp(argv[1], "--all") == 0;
    static const char *const policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
    for (int i = 0; i < N_CASES; i++) {
        check_params(&cases[i]);
        TIMED(check_gradients(&cases[i]));
        for (int p = 0; cpu && p < 3; p++)
            if (all || p == 0 || p == 1 + i % 2) TIMED(check_backend(&cases[i], policies[p]));
    }
    test_errors();
    test_sequence_loss();
    test_attention_range();
    return check_exit("test_layers");
}
