/* tests/test_lang.c — the front end: every example loads and lowers to a
 * sound graph, layer tables (shapes, parameter counts) of known models,
 * block naming, train settings and defaults, diagnostics against golden
 * files (tests/lang/bad_*.mpt -> .err), and robustness on hostile input.
 *
 *   test_lang            run all checks (from the repository root)
 *   test_lang --update   rewrite the golden .err files (review the diff!)
 *   test_lang --dump F   print F's diagnostics or its layer table
 */
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lang/lang.h"
#include "tests/check.h"

static const char *examples[] = {"mlp_small", "mlp_cpu", "mnist_mlp", "convnet",
                                 "convnet_small", "text_tiny", "resnet50"};
enum { N_EXAMPLES = sizeof examples / sizeof *examples };

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    *len = fread(buf, 1, (size_t)n, f);
    buf[*len] = '\0';
    fclose(f);
    return buf;
}

/* Loads src, collecting the diagnostics into *diag_text (caller frees). */
static int load_str(const char *src, const mpt_lower_opts *o, mpt_model **m, char **diag_text) {
    size_t n;
    FILE *f = open_memstream(diag_text, &n);
    int errs = mpt_lang_load_string("test.mpt", src, o, m, f);
    fclose(f);
    return errs;
}

static const mpt_layer_info *layer(const mpt_model *m, const char *name) {
    for (int i = 0; i < m->n_layers; i++)
        if (strcmp(m->layers[i].name, name) == 0) return &m->layers[i];
    return NULL;
}

static int64_t total_params(const mpt_model *m, int64_t *trainable) {
    int64_t t = 0, tr = 0;
    for (int i = 0; i < m->n_layers; i++) {
        t += m->layers[i].n_params;
        tr += m->layers[i].n_trainable;
    }
    if (trainable) *trainable = tr;
    return t;
}

static void dump(const char *path) {
    mpt_lower_opts o = {.batch_size = 2, .training = 1};
    mpt_model *m;
    int errs = mpt_lang_load(path, &o, &m, stdout);
    printf("%d error(s)\n", errs);
    if (errs) return;
    char buf[96];
    for (int i = 0; i < m->n_layers; i++) {
        const mpt_layer_info *L = &m->layers[i];
        printf("%-32s %-18s %-20s %10lld %s\n", L->name, L->type,
               mpt_shape_str(L->out_shape, buf, sizeof buf), (long long)L->n_params,
               L->dtype ? L->dtype : "");
    }
    int64_t tr, t = total_params(m, &tr);
    printf("total %lld, trainable %lld, nodes %d\n", (long long)t, (long long)tr,
           m->graph->n_nodes);
    mpt_model_free(m);
}

/* ---- every example ---------------------------------------------------- */

static void test_examples(void) {
    for (int k = 0; k < N_EXAMPLES; k++) {
        for (int training = 0; training <= 1; training++) {
            char path[256];
            snprintf(path, sizeof path, "examples/%s.mpt", examples[k]);
            mpt_lower_opts o = {.batch_size = 2, .training = training};
            mpt_model *m = NULL;
            int errs = mpt_lang_load(path, &o, &m, stderr);
            CHECK_MSG(errs == 0 && m, "%s: %d errors", path, errs);
            if (!m) continue;
            char msg[512];
            const char *bad = mpt_graph_verify(m->graph, msg, sizeof msg);
            CHECK_MSG(!bad, "%s: %s", path, bad);
            CHECK(mpt_graph_find_input(m->graph, "x") >= 0);
            CHECK(mpt_graph_find_output(m->graph, "output") >= 0);
            /* every example ends in a float32 softmax, so logits exist */
            CHECK_MSG(mpt_graph_find_output(m->graph, "logits") >= 0, "%s", path);
            for (int i = 0; i < m->graph->n_nodes; i++) {
                const mpt_node *nd = &m->graph->nodes[i];
                if (nd->op == MPT_OP_INPUT || nd->name) continue;
                if (nd->op == MPT_OP_CONST && !nd->layer) continue; /* the rng step */
                if (nd->op == MPT_OP_ADD && !nd->layer) continue;
                CHECK_MSG(nd->layer != NULL, "%s: node %d (%s) has no layer", path, i,
                          mpt_op_name(nd->op));
                CHECK_MSG(nd->dtype != MPT_DT_F16 && nd->dtype != MPT_DT_BF16,
                          "%s: lowering must not pick low precision", path);
            }
            mpt_model_free(m);
        }
    }
}

/* ---- layer tables ------------------------------------------------------ */

static void test_mnist_mlp(void) {
    mpt_lower_opts o = {.batch_size = 8192, .training = 1};
    mpt_model *m = NULL;
    CHECK(mpt_lang_load("examples/mnist_mlp.mpt", &o, &m, stderr) == 0);
    if (!m) return;
    CHECK(m->n_layers == 4);
    const mpt_layer_info *d1 = layer(m, "dense_1"), *d2 = layer(m, "dense_2");
    const mpt_layer_info *lg = layer(m, "dense_logits"), *p = layer(m, "predictions");
    CHECK(d1 && d2 && lg && p);
    if (!(d1 && d2 && lg && p)) return;
    CHECK(d1->n_params == 784 * 4096 + 4096);
    CHECK(d2->n_params == 4096 * 4096 + 4096);
    CHECK(lg->n_params == 4096 * 10 + 10);
    CHECK(p->n_params == 0);
    CHECK(total_params(m, NULL) == 784 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 10 + 10);
    CHECK(mpt_shape_eq(d1->out_shape, mpt_shape_2(8192, 4096)));
    CHECK(mpt_shape_eq(p->out_shape, mpt_shape_2(8192, 10)));
    CHECK(p->dtype && strcmp(p->dtype, "float32") == 0);
    CHECK(d1->dtype == NULL);
    CHECK(strcmp(p->type, "activation") == 0 && strcmp(d1->type, "dense") == 0);
    CHECK(d1->line == 5 && d1->col == 5);
    int w = mpt_graph_find_variable(m->graph, "dense_1/kernel");
    CHECK(w >= 0 && mpt_shape_eq(m->graph->nodes[w].shape, mpt_shape_2(784, 4096)));
    CHECK(w >= 0 && m->graph->nodes[w].attr.i[0] == MPT_INIT_GLOROT_UNIFORM &&
          m->graph->nodes[w].attr.i[1] == 784 && m->graph->nodes[w].attr.i[2] == 4096);
    int b = mpt_graph_find_variable(m->graph, "dense_logits/bias");
    CHECK(b >= 0 && mpt_shape_eq(m->graph->nodes[b].shape, mpt_shape_1(10)));
    int x = mpt_graph_find_input(m->graph, "x");
    CHECK(x >= 0 && mpt_shape_eq(m->graph->nodes[x].shape, mpt_shape_2(8192, 784)) &&
          m->graph->nodes[x].dtype == MPT_DT_F32);
    const mpt_train_config *t = &m->train;
    CHECK(strcmp(t->data, "fashion_mnist") == 0);
    CHECK(t->loss == MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY);
    CHECK(t->optimizer.kind == MPT_OPT_RMSPROP);
    CHECK_NEAR(t->optimizer.learning_rate, 0.001, 0, 0);
    CHECK_NEAR(t->optimizer.rho, 0.9, 0, 0);
    CHECK_NEAR(t->optimizer.epsilon, 1e-7, 0, 0);
    CHECK(t->metrics.accuracy == 1);
    CHECK(t->batch_size == 8192 && t->epochs == 5);
    CHECK_NEAR(t->validation_split, 0.2, 0, 0);
    CHECK(strcmp(t->policy, "float32") == 0);
    CHECK(t->loss_scale.mode == MPT_LS_DEFAULT);
    mpt_model_free(m);
}

static void test_resnet50(void) {
    mpt_lower_opts o = {.batch_size = 1, .training = 1};
    mpt_model *m = NULL;
    CHECK(mpt_lang_load("examples/resnet50.mpt", &o, &m, stderr) == 0);
    if (!m) return;
    int64_t trainable, total = total_params(m, &trainable);
    /* keras.applications.ResNet50(weights=None).summary() */
    CHECK_MSG(total == 25636712, "total %lld", (long long)total);
    CHECK_MSG(trainable == 25583592, "trainable %lld", (long long)trainable);
    struct { const char *name; int64_t h, w, c; } shapes[] = {
        {"conv1_conv", 112, 112, 64},           {"pool1_pool", 56, 56, 64},
        {"conv2/proj/out", 56, 56, 256},        {"conv2/identity_2/out", 56, 56, 256},
        {"conv3/proj/conv_1", 28, 28, 128},     {"conv3/identity_3/out", 28, 28, 512},
        {"conv4/identity_5/out", 14, 14, 1024}, {"conv5/proj/shortcut_conv", 7, 7, 2048},
        {"conv5/identity_2/out", 7, 7, 2048},
    };
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        const mpt_layer_info *L = layer(m, shapes[k].name);
        CHECK_MSG(L != NULL, "no layer %s", shapes[k].name);
        if (L)
            CHECK_MSG(mpt_shape_eq(L->out_shape,
                                   mpt_shape_4(1, shapes[k].h, shapes[k].w, shapes[k].c)),
                      "%s", shapes[k].name);
    }
    const mpt_layer_info *bn = layer(m, "conv2/proj/bn_1");
    CHECK(bn && bn->n_params == 4 * 64 && bn->n_trainable == 2 * 64);
    CHECK(layer(m, "conv2/identity_3") == NULL && layer(m, "conv4/identity_5/sum"));
    const mpt_layer_info *p = layer(m, "predictions");
    CHECK(p && mpt_shape_eq(p->out_shape, mpt_shape_2(1, 1000)));
    /* 53 batch norms, each with two moving statistics updated per step */
    CHECK(m->graph->n_updates == 2 * 53);
    mpt_model_free(m);
}

/* ---- naming, blocks, functional graphs --------------------------------- */

static void test_naming(void) {
    const char *src =
        "block pair(units, act=relu) {\n"
        "    dense(units=units, activation=act)\n"
        "    dense second(units=units * 2 - 1)\n"
        "}\n"
        "model m {\n"
        "    input x: [8]\n"
        "    dense(\n"
        "      units=4)\n" /* newlines inside ( ) do not end the statement */
        "    dense(units=4); dense dense_2(units=4)\n"
        "    pair b1(units=3)\n"
        "    pair(5, act=tanh, dtype=mixed_bfloat16)\n"
        "    repeat 2 { dense r(units=9) }\n"
        "    dense skip(units=9) from b1\n"
        "    add total from r_1, r_2, skip\n"
        "}\n";
    mpt_lower_opts o = {.batch_size = 3, .training = 0};
    mpt_model *m = NULL;
    char *diag = NULL;
    int errs = load_str(src, &o, &m, &diag);
    CHECK_MSG(errs == 0, "%s", diag);
    free(diag);
    if (!m) return;
    /* auto names skip the explicit dense_2 */
    const char *want[] = {"dense", "dense_1", "dense_2", "b1/dense", "b1/second", "pair/dense",
                          "pair/second", "r_1", "r_2", "skip", "total"};
    CHECK(m->n_layers == 11);
    for (int i = 0; i < m->n_layers && i < 11; i++)
        CHECK_MSG(strcmp(m->layers[i].name, want[i]) == 0, "layer %d is %s, want %s", i,
                  m->layers[i].name, want[i]);
    const mpt_layer_info *s = layer(m, "b1/second");
    CHECK(s && mpt_shape_eq(s->out_shape, mpt_shape_2(3, 5)));
    const mpt_layer_info *p = layer(m, "pair/second");
    CHECK(p && mpt_shape_eq(p->out_shape, mpt_shape_2(3, 9)) && p->dtype &&
          strcmp(p->dtype, "mixed_bfloat16") == 0);
    const mpt_layer_info *sk = layer(m, "skip");
    CHECK(sk && sk->n_params == 5 * 9 + 9); /* from b1's output [3,5] */
    CHECK(mpt_graph_find_variable(m->graph, "b1/second/kernel") >= 0);
    CHECK(mpt_graph_find_output(m->graph, "logits") < 0);
    mpt_model_free(m);
}

/* ---- train settings ---------------------------------------------------- */

static void test_train_config(void) {
    mpt_train_config c;
    mpt_train_config_defaults(&c);
    CHECK(c.optimizer.kind == MPT_OPT_RMSPROP && c.batch_size == 32 && c.epochs == 1);
    CHECK(strcmp(c.policy, "float32") == 0 && c.seed == 0 && c.validation_data == NULL);
    CHECK(c.loss_scale.initial == 32768 && c.loss_scale.period == 2000 &&
          c.loss_scale.factor == 2 && c.loss_scale.min_scale == 1 &&
          c.loss_scale.max_scale == 16777216 && c.loss_scale.max_skipped == 50);
    mpt_train_config_free(&c);

    const char *src =
        "model m { input x: [4]\n dense(units=2) }\n"
        "train {\n"
        "  data = synthetic(shape=[4],\n     classes=2)  ; validation_data = images(\"v d\", size=[8, 8])\n"
        "  loss = categorical_crossentropy\n"
        "  optimizer = sgd(learning_rate=0.1, momentum=0.9, nesterov=true)\n"
        "  metrics = [accuracy]\n"
        "  policy = mixed_float16\n"
        "  loss_scale = dynamic(initial=1024, period=100, factor=4, max_skipped=7)\n"
        "  seed = 42\n"
        "  compute_ops = [matmul, conv2d]; float32_ops = [softmax]; follow_ops = []\n"
        "}\n";
    mpt_model *m = NULL;
    char *diag = NULL;
    CHECK_MSG(load_str(src, NULL, &m, &diag) == 0, "%s", diag);
    free(diag);
    if (m) {
        const mpt_train_config *t = &m->train;
        CHECK(strcmp(t->data, "synthetic(shape=[4], classes=2)") == 0);
        CHECK(strcmp(t->validation_data, "images(\"v d\", size=[8, 8])") == 0);
        CHECK(t->loss == MPT_LOSS_CATEGORICAL_CROSSENTROPY);
        CHECK(t->optimizer.kind == MPT_OPT_SGD && t->optimizer.learning_rate == 0.1 &&
              t->optimizer.momentum == 0.9 && t->optimizer.nesterov == 1);
        CHECK(strcmp(t->policy, "mixed_float16") == 0);
        CHECK(t->loss_scale.mode == MPT_LS_DYNAMIC && t->loss_scale.initial == 1024 &&
              t->loss_scale.period == 100 && t->loss_scale.factor == 4 &&
              t->loss_scale.max_skipped == 7 && t->loss_scale.max_scale == 16777216);
        CHECK(t->seed == 42 && t->batch_size == 32);
        CHECK(t->n_compute_ops == 2 && strcmp(t->compute_ops[1], "conv2d") == 0);
        CHECK(t->n_float32_ops == 1 && t->n_follow_ops == 0);
        /* no opts: the train block's batch size, training mode */
        int x = mpt_graph_find_input(m->graph, "x");
        CHECK(x >= 0 && m->graph->nodes[x].shape.dim[0] == 32);
        mpt_model_free(m);
    }

    const char *fixed = "model m { input x: [4]; dense(units=2) }\n"
                        "train { optimizer = adam; loss_scale = 1024 }\n";
    CHECK(load_str(fixed, NULL, &m, &diag) == 0);
    free(diag);
    if (m) {
        CHECK(m->train.loss_scale.mode == MPT_LS_FIXED && m->train.loss_scale.initial == 1024);
        CHECK(m->train.optimizer.kind == MPT_OPT_ADAM && m->train.optimizer.beta_1 == 0.9 &&
              m->train.optimizer.beta_2 == 0.999 && m->train.optimizer.epsilon == 1e-7 &&
              m->train.optimizer.learning_rate == 0.001);
        mpt_model_free(m);
    }
    CHECK(strcmp(mpt_loss_name(MPT_LOSS_MEAN_SQUARED_ERROR), "mean_squared_error") == 0);
    CHECK(strcmp(mpt_opt_name(MPT_OPT_ADAM), "adam") == 0);
}

/* ---- numerics through the reference interpreter ------------------------ */

typedef struct {
    mpt_model *m;
    mpt_tensor in, *vars, *outs;
    int n_vars;
} run_state;

static int run(run_state *r, const char *src, long batch, int training, const double *x) {
    mpt_lower_opts o = {.batch_size = batch, .training = training};
    char *diag = NULL;
    memset(r, 0, sizeof *r);
    int errs = load_str(src, &o, &r->m, &diag);
    CHECK_MSG(errs == 0, "%s", diag);
    free(diag);
    if (errs) return -1;
    const mpt_graph *g = r->m->graph;
    const mpt_node *xn = &g->nodes[mpt_graph_find_input(g, "x")];
    mpt_tensor_alloc(&r->in, xn->dtype, xn->shape);
    for (int64_t i = 0; i < mpt_shape_numel(xn->shape); i++) mpt_tensor_set(&r->in, i, x[i]);
    r->n_vars = mpt_graph_n_variables(g);
    r->vars = calloc((size_t)r->n_vars + 1, sizeof *r->vars);
    r->outs = calloc((size_t)g->n_outputs + 1, sizeof *r->outs);
    CHECK(mpt_init_variables(g, r->vars, 1) == 0);
    char err[512];
    int rc = mpt_interp_run(g, &r->in, r->vars, r->outs, NULL, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    return rc;
}

static void run_free(run_state *r) {
    if (!r->m) return;
    for (int k = 0; k < r->n_vars; k++) mpt_tensor_free(&r->vars[k]);
    for (int k = 0; k < r->m->graph->n_outputs; k++) mpt_tensor_free(&r->outs[k]);
    free(r->vars);
    free(r->outs);
    mpt_tensor_free(&r->in);
    mpt_model_free(r->m);
}

static mpt_tensor *var(run_state *r, const char *name) {
    int id = mpt_graph_find_variable(r->m->graph, name);
    for (int k = 0; k < r->n_vars; k++)
        if (mpt_graph_variable_node(r->m->graph, k) == id) return &r->vars[k];
    return NULL;
}

static mpt_tensor *out(run_state *r, const char *name) {
    int k = mpt_graph_find_output(r->m->graph, name);
    return k >= 0 ? &r->outs[k] : NULL;
}

static void test_numerics(void) {
    run_state r;
    /* softmax rows sum to 1 and logits are the dense output */
    double x4[8] = {1, -2, 3, 0.5, -1, 2, 0, 4};
    if (run(&r, "model m { input x: [4]\n dense d(units=3)\n activation(softmax) }", 2, 1,
            x4) == 0) {
        mpt_tensor *y = out(&r, "output"), *lg = out(&r, "logits");
        mpt_tensor *w = var(&r, "d/kernel");
        CHECK(y && lg && w);
        for (int b = 0; b < 2 && y && lg && w; b++) {
            double sum = 0, mx = -1e30;
            for (int j = 0; j < 3; j++) {
                double z = 0;
                for (int i = 0; i < 4; i++) z += x4[b * 4 + i] * mpt_tensor_get(w, i * 3 + j);
                CHECK_NEAR(mpt_tensor_get(lg, b * 3 + j), z, 1e-5, 1e-5);
                if (z > mx) mx = z;
            }
            for (int j = 0; j < 3; j++) sum += exp(mpt_tensor_get(lg, b * 3 + j) - mx);
            for (int j = 0; j < 3; j++)
                CHECK_NEAR(mpt_tensor_get(y, b * 3 + j),
                           exp(mpt_tensor_get(lg, b * 3 + j) - mx) / sum, 1e-6, 1e-5);
        }
    }
    run_free(&r);

    /* batch norm, training mode: per-channel batch statistics, moving
     * statistics move by (1 - momentum) toward them */
    double xb[8] = {1, 10, 2, 20, 3, 30, 6, 60};
    if (run(&r, "model m { input x: [2]\n batch_norm bn(momentum=0.9, epsilon=0.001) }", 4, 1,
            xb) == 0) {
        mpt_tensor *y = out(&r, "output");
        const mpt_graph *g = r.m->graph;
        CHECK(g->n_updates == 2);
        for (int c = 0; c < 2; c++) {
            double mean = 0, var_ = 0;
            for (int b = 0; b < 4; b++) mean += xb[b * 2 + c] / 4;
            for (int b = 0; b < 4; b++) var_ += (xb[b * 2 + c] - mean) * (xb[b * 2 + c] - mean) / 4;
            for (int b = 0; b < 4; b++)
                CHECK_NEAR(mpt_tensor_get(y, b * 2 + c), (xb[b * 2 + c] - mean) / sqrt(var_ + 1e-3),
                           1e-5, 1e-4);
            /* the interpreter wrote the updates back into vars */
            CHECK_NEAR(mpt_tensor_get(var(&r, "bn/moving_mean"), c), 0.1 * mean, 1e-5, 1e-5);
            CHECK_NEAR(mpt_tensor_get(var(&r, "bn/moving_variance"), c), 0.9 + 0.1 * var_, 1e-4,
                       1e-5);
        }
    }
    run_free(&r);

    /* dropout: kept values scaled by 1/(1-rate), about rate of them zero,
     * and the step counter advances */
    double ones[1000];
    for (int i = 0; i < 1000; i++) ones[i] = 1;
    if (run(&r, "model m { input x: [500]\n dropout(rate=0.25) }", 2, 1, ones) == 0) {
        mpt_tensor *y = out(&r, "output");
        int zeros = 0, scaled = 0;
        for (int i = 0; i < 1000; i++) {
            double v = mpt_tensor_get(y, i);
            zeros += v == 0;
            scaled += fabs(v - 1 / 0.75) < 1e-6;
        }
        CHECK(zeros + scaled == 1000);
        CHECK_MSG(zeros > 180 && zeros < 320, "%d zeros", zeros);
        CHECK(mpt_tensor_get(var(&r, "rng/counter"), 0) == 1);
    }
    run_free(&r);

    /* dropout is the identity in inference mode; layer norm normalises the
     * last axis; global average pooling averages H and W */
    double xi[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    if (run(&r, "model m { input x: [2, 3, 2]\n dropout(rate=0.5)\n layer_norm(epsilon=1e-6) }", 1,
            0, xi) == 0) {
        mpt_tensor *y = out(&r, "output");
        for (int i = 0; i < 12; i++) CHECK_NEAR(mpt_tensor_get(y, i), i % 2 ? 1 : -1, 1e-4, 0);
        CHECK(mpt_graph_find_variable(r.m->graph, "rng/counter") < 0);
    }
    run_free(&r);
    if (run(&r, "model m { input x: [2, 3, 2]\n global_avg_pool2d }", 1, 0, xi) == 0) {
        mpt_tensor *y = out(&r, "output");
        CHECK_NEAR(mpt_tensor_get(y, 0), 6, 1e-6, 0);
        CHECK_NEAR(mpt_tensor_get(y, 1), 7, 1e-6, 0);
    }
    run_free(&r);
}

/* ---- diagnostics golden files ------------------------------------------ */

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static void test_goldens(int update) {
    DIR *dir = opendir("tests/lang");
    CHECK_MSG(dir != NULL, "run from the repository root");
    if (!dir) return;
    int n_files = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (strncmp(e->d_name, "bad_", 4) != 0 || !ends_with(e->d_name, ".mpt")) continue;
        n_files++;
        char path[512], golden[512];
        snprintf(path, sizeof path, "tests/lang/%s", e->d_name);
        snprintf(golden, sizeof golden, "tests/lang/%.*s.err", (int)strlen(e->d_name) - 4,
                 e->d_name);
        char *got = NULL;
        size_t got_len;
        FILE *f = open_memstream(&got, &got_len);
        mpt_model *m = NULL;
        int errs = mpt_lang_load(path, NULL, &m, f);
        fclose(f);
        CHECK_MSG(errs > 0 && m == NULL, "%s: expected errors", path);
        /* the diagnostics count what they print */
        int printed = 0;
        for (const char *p = got; (p = strstr(p, ": error: ")); p++) printed++;
        CHECK_MSG(printed == errs, "%s: %d errors, %d printed", path, errs, printed);
        if (update) {
            FILE *g = fopen(golden, "w");
            if (g) {
                fputs(got, g);
                fclose(g);
            }
        } else {
            size_t want_len = 0;
            char *want = read_all(golden, &want_len);
            CHECK_MSG(want != NULL, "missing %s (run test_lang --update and review)", golden);
            if (want)
                CHECK_MSG(strcmp(want, got) == 0, "%s differs.\n--- want\n%s--- got\n%s", golden,
                          want, got);
            free(want);
        }
        mpt_model_free(m);
        free(got);
    }
    closedir(dir);
    CHECK(n_files >= 8);
}

/* ---- hostile input ----------------------------------------------------- */

/* Loads raw bytes (NULs included) through a file; returns the error count. */
static int load_bytes(const char *bytes, size_t n) {
    char path[] = "/tmp/mpt_lang_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "wb");
    fwrite(bytes, 1, n, f);
    fclose(f);
    mpt_model *m = NULL;
    FILE *sink = fopen("/dev/null", "w");
    mpt_lower_opts o = {.batch_size = 2, .training = 1};
    int errs = mpt_lang_load(path, &o, &m, sink);
    fclose(sink);
    unlink(path);
    CHECK_MSG((errs == 0) == (m != NULL), "errors and model disagree");
    mpt_model_free(m);
    return errs;
}

static int load_text(const char *s) { return load_bytes(s, strlen(s)); }

static char *repeat_str(const char *head, const char *unit, int n, const char *tail) {
    size_t len = strlen(head) + strlen(unit) * (size_t)n + strlen(tail) + 1;
    char *s = malloc(len), *p = s;
    p += sprintf(p, "%s", head);
    for (int i = 0; i < n; i++) p += sprintf(p, "%s", unit);
    sprintf(p, "%s", tail);
    return s;
}

static void test_robustness(void) {
    CHECK(load_text("") == 1);
    CHECK(load_text("\n\n   # nothing\n") == 1);
    CHECK(load_text("model m { input x: [4] /* never closed") >= 1);
    CHECK(load_text("model m { input x: [4]\n dense(units=\"never closed) }") >= 1);
    CHECK(load_text("model m { input x: [1e999999]\n dense(units=2) }") >= 1);
    CHECK(load_text("model m { input x: [99999999999999999999]\n dense(units=2) }") >= 1);
    CHECK(load_text("model m { input x: [4]\n dense(units=9223372036854775807 * 2) }") >= 1);
    CHECK(load_text("model m { input x: [2147483647, 2147483647, 2147483647]\n flatten }") >= 1);
    CHECK(load_text("model m { input x: [4]\n dense(units=2147483647)\n dense(units=2147483647) }") >= 1);
    CHECK(load_text("model m { input x: [4]\n repeat 1000000000 { dense(units=2) } }") >= 1);
    CHECK(load_text("block a() { a }\nmodel m { input x: [4]\n a }") == 1);
    CHECK(load_text("block a() { b }\nblock b() { a }\nmodel m { input x: [4]\n a }") == 1);
    CHECK(load_bytes("model m {\0 input x: [4] }", 26) >= 1);
    /* deep nesting: parentheses, lists, blocks, repeats, long expressions */
    char *s = repeat_str("model m { input x: [", "(", 100000, "1");
    CHECK(load_text(s) >= 1);
    free(s);
    s = repeat_str("model m { input x: [4]\n dense(units=", "[", 100000, "");
    CHECK(load_text(s) >= 1);
    free(s);
    s = repeat_str("model m { input x: [4]\n dense(units=1", "+1", 200000, ") }");
    CHECK(load_text(s) >= 1);
    free(s);
    s = repeat_str("model m { input x: [4]\n dense(units=", "-", 200000, "1) }");
    CHECK(load_text(s) >= 1);
    free(s);
    s = repeat_str("model m { input x: [4]\n", "repeat 1 {", 50000, "dense(units=2)");
    CHECK(load_text(s) >= 1);
    free(s);
    /* a chain of 40 blocks, each using the next: over the nesting limit */
    s = malloc(40 * 64 + 64);
    char *p = s;
    for (int i = 0; i < 40; i++) p += sprintf(p, "block b%d() { b%d }\n", i, i + 1);
    sprintf(p, "block b40() { dense(units=2) }\nmodel m { input x: [4]\n b0 }\n");
    CHECK(load_text(s) == 1);
    free(s);

    /* auto names of a block with a very long name, used twice */
    char longname[301];
    memset(longname, 'b', 300);
    longname[300] = '\0';
    s = malloc(1024);
    snprintf(s, 1024, "block %s() { dense(units=2) }\nmodel m { input x: [4]\n %s\n %s }\n",
             longname, longname, longname);
    CHECK(load_text(s) == 0);
    free(s);

    /* random bytes, and random bytes after a valid beginning */
    uint64_t st = 12345;
    char buf[600];
    for (int it = 0; it < 400; it++) {
        size_t n = 0, len = 1 + (size_t)(it * 7919 % 500);
        if (it % 2) n = (size_t)sprintf(buf, "model m {\n input x: [4]\n dense(units=");
        for (; n < len + 40 && n < sizeof buf; n++) {
            st = st * 6364136223846793005ULL + 1442695040888963407ULL;
            buf[n] = (char)(st >> 56);
        }
        CHECK(load_bytes(buf, n) >= 1);
    }

    /* every prefix of every example: errors unless the model is complete */
    for (int k = 0; k < N_EXAMPLES; k++) {
        char path[256];
        snprintf(path, sizeof path, "examples/%s.mpt", examples[k]);
        size_t len;
        char *src = read_all(path, &len);
        CHECK(src != NULL);
        if (!src) continue;
        const char *model = strstr(src, "\nmodel ");
        size_t model_at = model ? (size_t)(model - src) : 0;
        for (size_t n = 0; n < len; n++) {
            int errs = load_bytes(src, n);
            if (n <= model_at + 20) CHECK_MSG(errs >= 1, "%s: prefix %zu accepted", path, n);
        }
        free(src);
    }
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--dump") == 0) {
        dump(argv[2]);
        return 0;
    }
    int update = argc == 2 && strcmp(argv[1], "--update") == 0;
    test_examples();
    test_mnist_mlp();
    test_resnet50();
    test_naming();
    test_train_config();
    test_numerics();
    test_goldens(update);
    test_robustness();
    return check_exit("test_lang");
}
