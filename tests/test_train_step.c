/* tests/test_train_step.c — the train and eval steps (ir/train.c, loss.c,
 * optim.c) run on the reference interpreter: optimizer steps against hand
 * formulas in f64, loss scaling's skip/shrink/grow, the eval step, and
 * loss going down under every policy.
 *
 * Tolerances (|got - ref| <= atol + rtol |ref|):
 *   f32 step vs f64 hand formula: rtol 1e-5, atol 1e-6. A step is a few
 *   dozen f32 roundings of 6e-8 each on values of order 1; 1e-5 leaves a
 *   hundredfold margin and still catches any wrong term (the smallest term
 *   checked, lr * g, is of order 1e-3 of the weights). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "tests/check.h"

#define RTOL 1e-5
#define ATOL 1e-6

enum { B = 4, IN = 3, C = 3 };

static const double X[B][IN] = {{0.5, -1.0, 0.25}, {1.5, 0.5, -0.5}, {-0.75, 0.25, 1.0},
                                {0.1, 0.9, -1.2}};
static const int Y[B] = {0, 2, 1, 2};

/* ---- the model and its hand-computed gradient --------------------------- */

/* the kernel [IN, C] row-major, then the bias [C] */
enum { NP = IN * C + C };
typedef struct {
    double v[NP];
} params;
#define W(p, i, j) ((p)->v[(i) * C + (j)])
#define BIAS(p, j) ((p)->v[IN * C + (j)])

static params initial_params(void) {
    params p;
    for (int i = 0; i < IN; i++)
        for (int j = 0; j < C; j++) W(&p, i, j) = 0.1 * (i - j) + 0.05 * i * j + 0.02;
    for (int j = 0; j < C; j++) BIAS(&p, j) = 0.01 * j - 0.01;
    return p;
}

/* mean sparse crossentropy of softmax(x w + b); fills the gradient and the
 * number of correct argmax predictions */
static double hand_loss(const params *p, params *g, int *correct) {
    double loss = 0;
    memset(g, 0, sizeof *g);
    *correct = 0;
    for (int n = 0; n < B; n++) {
        double z[C], m = -1e300, s = 0;
        int best = 0;
        for (int j = 0; j < C; j++) {
            z[j] = BIAS(p, j);
            for (int i = 0; i < IN; i++) z[j] += X[n][i] * W(p, i, j);
            if (z[j] > m) m = z[j], best = j;
        }
        for (int j = 0; j < C; j++) s += exp(z[j] - m);
        loss += -(z[Y[n]] - m - log(s)) / B;
        *correct += best == Y[n];
        for (int j = 0; j < C; j++) {
            double d = (exp(z[j] - m) / s - (j == Y[n])) / B;
            BIAS(g, j) += d;
            for (int i = 0; i < IN; i++) W(g, i, j) += X[n][i] * d;
        }
    }
    return loss;
}

/* x -> dense -> predictions(softmax); outputs "output" and "logits" */
static mpt_graph *model(int with_logits) {
    mpt_graph *g = mpt_graph_new("tiny");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(B, IN));
    mpt_b_layer(g, "dense");
    int w = mpt_b_variable(g, "dense/kernel", mpt_shape_2(IN, C), MPT_INIT_GLOROT_UNIFORM, IN, C, 0, 1);
    int b = mpt_b_variable(g, "dense/bias", mpt_shape_1(C), MPT_INIT_ZEROS, 0, 0, 0, 1);
    int z = mpt_b_matmul(g, x, w, 0, 0);
    z = mpt_b_binary(g, MPT_OP_ADD, z, mpt_b_broadcast_to(g, b, g->nodes[z].shape));
    mpt_b_layer(g, "predictions");
    mpt_shape s = g->nodes[z].shape;
    int m = mpt_b_reduce(g, MPT_OP_REDUCE_MAX, z, 2);
    int e = mpt_b_unary(g, MPT_OP_EXP, mpt_b_binary(g, MPT_OP_SUB, z, mpt_b_broadcast(g, m, s, 1)));
    int sum = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, e, 2);
    mpt_graph_add_output(g, "output", mpt_b_binary(g, MPT_OP_DIV, e, mpt_b_broadcast(g, sum, s, 1)));
    if (with_logits) mpt_graph_add_output(g, "logits", z);
    return g;
}

static mpt_graph *typed(const mpt_graph *fwd, const char *policy) {
    mpt_policy_opts po = {0};
    char err[256] = "";
    if (mpt_policy_lookup(policy, &po.global) != 0) abort();
    mpt_graph *t = mpt_policy_apply(fwd, &po, err, sizeof err);
    CHECK_MSG(t != NULL, "%s", err);
    if (!t) exit(check_exit("test_train_step"));
    return t;
}

static mpt_train_opts opts(mpt_opt_kind kind, int ls_mode) {
    mpt_train_opts o = {0};
    o.loss = MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY;
    o.opt = (mpt_optimizer_config){.kind = kind, .learning_rate = 0.1, .beta_1 = 0.9,
                                   .beta_2 = 0.999, .epsilon = 1e-7, .rho = 0.9};
    o.loss_scale = (mpt_loss_scale_config){.mode = ls_mode, .initial = 32768, .period = 2000,
                                           .factor = 2, .min_scale = 1,
                                           .max_scale = 16777216, .max_skipped = 50};
    o.metrics.accuracy = 1;
    return o;
}

/* ---- running a step graph ---------------------------------------------- */

typedef struct {
    mpt_graph *g;
    mpt_tensor *vars, *inputs, *outs;
    int n_vars, n_inputs;
} runner;

static void runner_init(runner *r, mpt_graph *g) {
    r->g = g;
    r->n_vars = mpt_graph_n_variables(g);
    r->n_inputs = mpt_graph_n_inputs(g);
    r->vars = calloc((size_t)r->n_vars + 1, sizeof *r->vars);
    r->inputs = calloc((size_t)r->n_inputs + 1, sizeof *r->inputs);
    r->outs = calloc((size_t)g->n_outputs + 1, sizeof *r->outs);
    CHECK(mpt_init_variables(g, r->vars, 1) == 0);
    for (int k = 0; k < r->n_inputs; k++) {
        const mpt_node *n = &g->nodes[mpt_graph_input_node(g, k)];
        mpt_tensor_alloc(&r->inputs[k], n->dtype, n->shape);
    }
}

static void runner_free(runner *r) {
    for (int k = 0; k < r->n_vars; k++) mpt_tensor_free(&r->vars[k]);
    for (int k = 0; k < r->n_inputs; k++) mpt_tensor_free(&r->inputs[k]);
    for (int k = 0; k < r->g->n_outputs; k++) mpt_tensor_free(&r->outs[k]);
    free(r->vars);
    free(r->inputs);
    free(r->outs);
    mpt_graph_free(r->g);
}

static mpt_tensor *var(runner *r, const char *name) {
    for (int k = 0; k < r->n_vars; k++)
        if (strcmp(r->g->nodes[mpt_graph_variable_node(r->g, k)].name, name) == 0)
            return &r->vars[k];
    CHECK_MSG(0, "no variable %s", name);
    exit(check_exit("test_train_step"));
}

static mpt_tensor *input(runner *r, const char *name) {
    for (int k = 0; k < r->n_inputs; k++)
        if (strcmp(r->g->nodes[mpt_graph_input_node(r->g, k)].name, name) == 0)
            return &r->inputs[k];
    CHECK_MSG(0, "no input %s", name);
    exit(check_exit("test_train_step"));
}

static double out(runner *r, const char *name) {
    int k = mpt_graph_find_output(r->g, name);
    CHECK_MSG(k >= 0, "no output %s", name);
    return k >= 0 ? mpt_tensor_get(&r->outs[k], 0) : NAN;
}

static void set_params(runner *r, const params *p) {
    for (int i = 0; i < IN; i++)
        for (int j = 0; j < C; j++) mpt_tensor_set(var(r, "dense/kernel"), i * C + j, W(p, i, j));
    for (int j = 0; j < C; j++) mpt_tensor_set(var(r, "dense/bias"), j, BIAS(p, j));
}

static void check_params(runner *r, const params *p) {
    for (int i = 0; i < IN; i++)
        for (int j = 0; j < C; j++)
            CHECK_NEAR(mpt_tensor_get(var(r, "dense/kernel"), i * C + j), W(p, i, j), ATOL, RTOL);
    for (int j = 0; j < C; j++)
        CHECK_NEAR(mpt_tensor_get(var(r, "dense/bias"), j), BIAS(p, j), ATOL, RTOL);
}

static void feed(runner *r, double x_scale) {
    for (int n = 0; n < B; n++) {
        for (int i = 0; i < IN; i++) mpt_tensor_set(input(r, "x"), n * IN + i, X[n][i] * x_scale);
        mpt_tensor_set(input(r, "y"), n, Y[n]);
    }
}

static void run(runner *r) {
    for (int k = 0; k < r->g->n_outputs; k++) mpt_tensor_free(&r->outs[k]);
    char err[256] = "";
    int rc = mpt_interp_run(r->g, r->inputs, r->vars, r->outs, NULL, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    if (rc != 0) exit(check_exit("test_train_step"));
}

static runner make(const char *policy, const mpt_train_opts *o, int with_logits) {
    mpt_graph *fwd = model(with_logits);
    mpt_graph *t = typed(fwd, policy);
    char err[256] = "";
    mpt_graph *g = mpt_train_step(t, o, err, sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    if (!g) exit(check_exit("test_train_step"));
    mpt_graph_free(t);
    mpt_graph_free(fwd);
    runner r;
    runner_init(&r, g);
    params p = initial_params();
    set_params(&r, &p);
    feed(&r, 1);
    return r;
}

/* ---- tests --------------------------------------------------------------- */

static void test_sgd(int ls_mode) {
    mpt_train_opts o = opts(MPT_OPT_SGD, ls_mode);
    runner r = make("float32", &o, 1);
    params p = initial_params(), g;
    int correct;
    double loss = hand_loss(&p, &g, &correct);
    run(&r);
    CHECK_NEAR(out(&r, "loss"), loss, ATOL, RTOL);
    CHECK(out(&r, "correct") == correct);
    CHECK(out(&r, "finite") == 1);
    CHECK(out(&r, "loss_scale") == (ls_mode == MPT_LS_NONE ? 1 : 32768));
    for (int k = 0; k < NP; k++) p.v[k] -= 0.1 * g.v[k];
    check_params(&r, &p);
    CHECK(mpt_tensor_get(var(&r, "optimizer/iterations"), 0) == 1);
    if (ls_mode == MPT_LS_DYNAMIC) {
        CHECK(mpt_tensor_get(var(&r, "loss_scale/good_steps"), 0) == 1);
        CHECK(mpt_tensor_get(var(&r, "loss_scale/scale"), 0) == 32768);
    }
    runner_free(&r);
}

static void test_sgd_momentum(int nesterov) {
    mpt_train_opts o = opts(MPT_OPT_SGD, MPT_LS_DYNAMIC);
    o.opt.momentum = 0.9;
    o.opt.nesterov = nesterov;
    runner r = make("float32", &o, 1);
    params p = initial_params(), g, v = {0};
    int correct;
    for (int step = 0; step < 2; step++) {
        hand_loss(&p, &g, &correct);
        run(&r);
        for (int k = 0; k < NP; k++) {
            v.v[k] = 0.9 * v.v[k] - 0.1 * g.v[k];
            p.v[k] += nesterov ? 0.9 * v.v[k] - 0.1 * g.v[k] : v.v[k];
        }
    }
    check_params(&r, &p);
    for (int j = 0; j < C; j++)
        CHECK_NEAR(mpt_tensor_get(var(&r, "dense/bias/momentum"), j), BIAS(&v, j), ATOL, RTOL);
    runner_free(&r);
}

static void test_adam(void) {
    mpt_train_opts o = opts(MPT_OPT_ADAM, MPT_LS_DYNAMIC);
    o.opt.learning_rate = 0.01;
    runner r = make("float32", &o, 1);
    params p = initial_params(), g, m = {0}, v = {0};
    int correct;
    for (int t = 1; t <= 2; t++) {
        hand_loss(&p, &g, &correct);
        run(&r);
        double lr_t = 0.01 * sqrt(1 - pow(0.999, t)) / (1 - pow(0.9, t));
        for (int k = 0; k < NP; k++) {
            m.v[k] = 0.9 * m.v[k] + 0.1 * g.v[k];
            v.v[k] = 0.999 * v.v[k] + 0.001 * g.v[k] * g.v[k];
            p.v[k] -= lr_t * m.v[k] / (sqrt(v.v[k]) + 1e-7);
        }
    }
    check_params(&r, &p);
    for (int i = 0; i < IN * C; i++) {
        CHECK_NEAR(mpt_tensor_get(var(&r, "dense/kernel/m"), i), m.v[i], ATOL, RTOL);
        CHECK_NEAR(mpt_tensor_get(var(&r, "dense/kernel/v"), i), v.v[i], 1e-9, RTOL);
    }
    CHECK(mpt_tensor_get(var(&r, "optimizer/iterations"), 0) == 2);
    runner_free(&r);
}

/* Keras 3 (and tf.keras >= 2.11): epsilon inside the root, with or
 * without momentum; legacy (tf.keras <= 2.10): outside it without
 * momentum. The two differ in the first step, where rms = 0.1 g^2: with
 * epsilon 1e-3 (so it shows) g / sqrt(0.1 g^2 + eps) against
 * g / (sqrt(0.1 g^2) + eps). */
static void test_rmsprop(double momentum, int legacy) {
    mpt_train_opts o = opts(MPT_OPT_RMSPROP, MPT_LS_NONE);
    o.opt.learning_rate = 0.01;
    o.opt.momentum = momentum;
    o.opt.legacy = legacy;
    o.opt.epsilon = 1e-3;
    runner r = make("float32", &o, 1);
    params p = initial_params(), g;
    int correct;
    hand_loss(&p, &g, &correct);
    run(&r);
    for (int k = 0; k < NP; k++) {
        double rms = 0.1 * g.v[k] * g.v[k];
        p.v[k] -= legacy && momentum == 0 ? 0.01 * g.v[k] / (sqrt(rms) + 1e-3)
                                          : 0.01 * g.v[k] / sqrt(rms + 1e-3);
    }
    check_params(&r, &p);
    CHECK_NEAR(mpt_tensor_get(var(&r, "dense/bias/rms"), 1), 0.1 * BIAS(&g, 1) * BIAS(&g, 1),
               1e-9, RTOL);
    runner_free(&r);
}

/* the bytes of every variable except the loss scale's own state */
static int same_state(runner *r, mpt_tensor *saved) {
    int same = 1;
    for (int k = 0; k < r->n_vars; k++) {
        const char *name = r->g->nodes[mpt_graph_variable_node(r->g, k)].name;
        if (strncmp(name, "loss_scale/", 11) == 0) continue;
        if (memcmp(r->vars[k].data, saved[k].data, mpt_tensor_bytes(&r->vars[k])) != 0) {
            fprintf(stderr, "state %s changed on a skipped step\n", name);
            same = 0;
        }
    }
    return same;
}

static mpt_tensor *save_state(runner *r) {
    mpt_tensor *s = calloc((size_t)r->n_vars, sizeof *s);
    for (int k = 0; k < r->n_vars; k++) {
        mpt_tensor_alloc(&s[k], r->vars[k].dtype, r->vars[k].shape);
        memcpy(s[k].data, r->vars[k].data, mpt_tensor_bytes(&r->vars[k]));
    }
    return s;
}

static void free_state(runner *r, mpt_tensor *s) {
    for (int k = 0; k < r->n_vars; k++) mpt_tensor_free(&s[k]);
    free(s);
}

static void test_overflow_skips(void) {
    mpt_train_opts o = opts(MPT_OPT_ADAM, MPT_LS_DYNAMIC);
    o.opt.learning_rate = 0.01;
    runner r = make("mixed_float16", &o, 1);
    run(&r); /* a normal step first, so the slots are not all zero */
    CHECK(out(&r, "finite") == 1);
    CHECK(mpt_tensor_get(var(&r, "dense/kernel/m"), 0) != 0);
    mpt_tensor *saved = save_state(&r);
    feed(&r, 1e5); /* beyond f16's 65504: x becomes inf where the layer casts it */
    run(&r);
    CHECK(out(&r, "finite") == 0);
    CHECK(!isfinite(out(&r, "loss")));
    CHECK(out(&r, "loss_scale") == 32768); /* the scale this step used */
    CHECK(same_state(&r, saved));
    CHECK(mpt_tensor_get(var(&r, "loss_scale/scale"), 0) == 16384);
    CHECK(mpt_tensor_get(var(&r, "loss_scale/skipped"), 0) == 1);
    CHECK(mpt_tensor_get(var(&r, "loss_scale/good_steps"), 0) == 0);
    free_state(&r, saved);
    feed(&r, 1);
    run(&r);
    CHECK(out(&r, "finite") == 1 && out(&r, "loss_scale") == 16384);
    CHECK(mpt_tensor_get(var(&r, "loss_scale/skipped"), 0) == 1);
    CHECK(mpt_tensor_get(var(&r, "optimizer/iterations"), 0) == 2);
    runner_free(&r);
}

static void test_scale_grows(void) {
    mpt_train_opts o = opts(MPT_OPT_SGD, MPT_LS_DYNAMIC);
    o.loss_scale.period = 3;
    o.loss_scale.initial = 8;
    runner r = make("mixed_float16", &o, 1);
    double seen[5];
    for (int s = 0; s < 5; s++) {
        run(&r);
        seen[s] = out(&r, "loss_scale");
    }
    CHECK(seen[0] == 8 && seen[1] == 8 && seen[2] == 8);
    CHECK_MSG(seen[3] == 16 && seen[4] == 16, "scales %g %g", seen[3], seen[4]);
    CHECK(mpt_tensor_get(var(&r, "loss_scale/good_steps"), 0) == 2);
    CHECK(mpt_tensor_get(var(&r, "loss_scale/skipped"), 0) == 0);
    runner_free(&r);

    /* the ceiling holds */
    o.loss_scale.period = 1;
    o.loss_scale.max_scale = 32;
    r = make("mixed_float16", &o, 1);
    for (int s = 0; s < 4; s++) run(&r);
    CHECK(mpt_tensor_get(var(&r, "loss_scale/scale"), 0) == 32);
    runner_free(&r);
}

static void test_fixed_scale(void) {
    mpt_train_opts o = opts(MPT_OPT_SGD, MPT_LS_FIXED);
    o.loss_scale.initial = 128;
    runner r = make("mixed_float16", &o, 1);
    for (int s = 0; s < 3; s++) run(&r);
    CHECK(out(&r, "loss_scale") == 128 && out(&r, "finite") == 1);
    mpt_tensor *saved = save_state(&r);
    feed(&r, 1e5);
    run(&r);
    CHECK(out(&r, "finite") == 0);
    CHECK(same_state(&r, saved));
    CHECK(mpt_tensor_get(var(&r, "loss_scale/scale"), 0) == 128);
    CHECK(mpt_tensor_get(var(&r, "loss_scale/skipped"), 0) == 1);
    free_state(&r, saved);
    runner_free(&r);
}

static void test_eval(void) {
    mpt_train_opts o = opts(MPT_OPT_SGD, MPT_LS_DYNAMIC);
    params p = initial_params(), g;
    int correct;
    double loss = hand_loss(&p, &g, &correct);
    for (int with_logits = 0; with_logits <= 1; with_logits++) {
        mpt_graph *fwd = model(with_logits);
        char err[256] = "";
        mpt_graph *e = mpt_eval_step(fwd, &o, err, sizeof err);
        CHECK_MSG(e != NULL, "%s", err);
        if (!e) continue;
        CHECK(e->n_updates == 0);
        CHECK(mpt_graph_find_output(e, "loss") >= 0 && mpt_graph_find_output(e, "correct") >= 0);
        int ok = mpt_graph_find_output(e, "output");
        CHECK(ok >= 0 && mpt_shape_eq(e->nodes[e->outputs[ok].node].shape, mpt_shape_2(B, C)));
        runner r;
        runner_init(&r, e);
        set_params(&r, &p);
        feed(&r, 1);
        mpt_tensor *saved = save_state(&r);
        run(&r);
        /* from probabilities the loss goes through Keras' clip: equal here,
         * as no probability is below 1e-7 */
        CHECK_NEAR(out(&r, "loss"), loss, ATOL, RTOL);
        CHECK(out(&r, "correct") == correct);
        CHECK(same_state(&r, saved));
        free_state(&r, saved);
        runner_free(&r);
        mpt_graph_free(fwd);
    }
}

static void test_errors(void) {
    mpt_graph *fwd = model(1);
    char err[256] = "";
    mpt_train_opts o = opts(MPT_OPT_SGD, MPT_LS_DEFAULT);
    CHECK(mpt_train_step(fwd, &o, err, sizeof err) == NULL && strstr(err, "loss-scale"));
    o = opts(MPT_OPT_ADAM, MPT_LS_DYNAMIC);
    o.opt.learning_rate = -1;
    CHECK(mpt_train_step(fwd, &o, err, sizeof err) == NULL && strstr(err, "learning_rate"));
    o = opts(MPT_OPT_SGD, MPT_LS_DYNAMIC);
    o.loss_scale.factor = 1;
    CHECK(mpt_train_step(fwd, &o, err, sizeof err) == NULL && strstr(err, "factor"));
    CHECK(strcmp(mpt_loss_name(MPT_LOSS_MEAN_SQUARED_ERROR), "mean_squared_error") == 0);
    CHECK(strcmp(mpt_opt_name(MPT_OPT_RMSPROP), "rmsprop") == 0);
    mpt_graph_free(fwd);
}

/* 3 classes by the sign pattern of two features; a hidden layer of 16 */
static double train_synthetic(const char *policy, double *first) {
    enum { N = 32, F = 4, H = 16 };
    mpt_graph *fwd = mpt_graph_new("synthetic");
    int x = mpt_b_input(fwd, "x", MPT_DT_F32, mpt_shape_2(N, F));
    int h = x;
    const char *names[2] = {"dense_1", "dense_2"};
    int widths[2] = {H, 3};
    for (int l = 0; l < 2; l++) {
        char kn[32], bn[32];
        int in = (int)fwd->nodes[h].shape.dim[1];
        snprintf(kn, sizeof kn, "%s/kernel", names[l]);
        snprintf(bn, sizeof bn, "%s/bias", names[l]);
        mpt_b_layer(fwd, names[l]);
        int w = mpt_b_variable(fwd, kn, mpt_shape_2(in, widths[l]), MPT_INIT_GLOROT_UNIFORM, in, widths[l], 0, 1);
        int b = mpt_b_variable(fwd, bn, mpt_shape_1(widths[l]), MPT_INIT_ZEROS, 0, 0, 0, 1);
        int z = mpt_b_matmul(fwd, h, w, 0, 0);
        h = mpt_b_binary(fwd, MPT_OP_ADD, z, mpt_b_broadcast_to(fwd, b, fwd->nodes[z].shape));
        if (l == 0) h = mpt_b_unary(fwd, MPT_OP_RELU, h);
    }
    /* no softmax layer: the output is the logits, and the loss reads them */
    mpt_graph_add_output(fwd, "output", h);
    mpt_graph_add_output(fwd, "logits", h);
    mpt_graph *t = typed(fwd, policy);
    mpt_train_opts o = opts(MPT_OPT_ADAM, MPT_LS_DEFAULT);
    o.loss_scale.mode = strcmp(policy, "mixed_float16") == 0 ? MPT_LS_DYNAMIC : MPT_LS_NONE;
    o.opt.learning_rate = 0.02;
    char err[256] = "";
    mpt_graph *g = mpt_train_step(t, &o, err, sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    mpt_graph_free(t);
    mpt_graph_free(fwd);
    if (!g) return NAN;
    runner r;
    runner_init(&r, g);
    uint64_t s = 12345;
    for (int n = 0; n < N; n++) {
        double f[F];
        for (int i = 0; i < F; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            f[i] = (double)(s >> 11) / 9007199254740992.0 * 2 - 1;
            mpt_tensor_set(input(&r, "x"), n * F + i, f[i]);
        }
        mpt_tensor_set(input(&r, "y"), n, f[0] > 0 ? 0 : f[1] > 0 ? 1 : 2);
    }
    double last = NAN;
    for (int step = 0; step < 50; step++) {
        run(&r);
        if (step == 0) *first = out(&r, "loss");
        last = out(&r, "loss");
    }
    runner_free(&r);
    return last;
}

static void test_loss_decreases(void) {
    const char *policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
    for (int i = 0; i < 3; i++) {
        double first, last = train_synthetic(policies[i], &first);
        CHECK_MSG(isfinite(last) && last < 0.5 * first, "%s: loss %g -> %g", policies[i], first,
                  last);
    }
}

/* softmax(x w + b) of row n, class j */
static double prob(const params *p, int n, int j) {
    double z[C], m = -1e300, s = 0;
    for (int c = 0; c < C; c++) {
        z[c] = BIAS(p, c);
        for (int i = 0; i < IN; i++) z[c] += X[n][i] * W(p, i, c);
        if (z[c] > m) m = z[c];
    }
    for (int c = 0; c < C; c++) s += exp(z[c] - m);
    return exp(z[j] - m) / s;
}

/* Metrics beside the loss: top-k accuracy against class ids (k = 1 is
 * accuracy, k = C every example), mae and mse against one-hot targets
 * (categorical crossentropy), each a sum over the batch; mae with class
 * ids is refused with a message. */
static void test_metrics(void) {
    params p = initial_params();
    for (int k = 1; k <= C; k++) {
        mpt_train_opts o = opts(MPT_OPT_SGD, MPT_LS_NONE);
        o.metrics = (mpt_metrics){.accuracy = 1, .top_k = k};
        runner r = make("float32", &o, 1);
        run(&r);
        int hand = 0;
        for (int n = 0; n < B; n++) {
            int above = 0;
            for (int j = 0; j < C; j++) above += prob(&p, n, j) > prob(&p, n, Y[n]);
            hand += above < k;
        }
        CHECK_MSG(out(&r, "top_k_correct") == hand, "top_%d: %g, by hand %d", k,
                  out(&r, "top_k_correct"), hand);
        if (k == 1) CHECK(out(&r, "top_k_correct") == out(&r, "correct"));
        if (k == C) CHECK(hand == B);
        runner_free(&r);
    }
    mpt_train_opts o = opts(MPT_OPT_SGD, MPT_LS_NONE);
    o.metrics = (mpt_metrics){.mae = 1};
    mpt_graph *fwd = model(1), *t = typed(fwd, "float32");
    char err[512] = "";
    CHECK(mpt_train_step(t, &o, err, sizeof err) == NULL && strstr(err, "mae compares targets"));
    o.loss = MPT_LOSS_CATEGORICAL_CROSSENTROPY;
    o.metrics = (mpt_metrics){.mae = 1, .mse = 1, .top_k = 2};
    mpt_graph *g = mpt_train_step(t, &o, err, sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    mpt_graph_free(t);
    mpt_graph_free(fwd);
    if (!g) return;
    runner r;
    runner_init(&r, g);
    set_params(&r, &p);
    for (int n = 0; n < B; n++) {
        for (int i = 0; i < IN; i++) mpt_tensor_set(input(&r, "x"), n * IN + i, X[n][i]);
        for (int j = 0; j < C; j++) mpt_tensor_set(input(&r, "y"), n * C + j, j == Y[n]);
    }
    run(&r);
    double mae = 0, mse = 0;
    for (int n = 0; n < B; n++)
        for (int j = 0; j < C; j++) {
            double d = (j == Y[n]) - prob(&p, n, j);
            mae += fabs(d) / C;
            mse += d * d / C;
        }
    CHECK_NEAR(out(&r, "abs_error"), mae, ATOL, RTOL);
    CHECK_NEAR(out(&r, "sq_error"), mse, ATOL, RTOL);
    CHECK(mpt_graph_find_output(r.g, "correct") < 0); /* not asked */
    CHECK(out(&r, "top_k_correct") >= 0 && out(&r, "top_k_correct") <= B);
    runner_free(&r);
}

/* ---- training controls: schedules, clipping, weight decay, lion ---------- */

/* Each schedule's rate, read from the step's "learning_rate" output, is
 * mpt_lr_at's (in double) to f32 rounding of a few ops, and the update
 * uses it; a step the loss scale skips does not advance the schedule. */
static void test_schedules(void) {
    mpt_lr_schedule cases[6] = {
        {.kind = MPT_LR_EXPONENTIAL, .initial = 0.1, .decay_steps = 2, .decay_rate = 0.5},
        {.kind = MPT_LR_EXPONENTIAL, .initial = 0.1, .decay_steps = 2, .decay_rate = 0.5,
         .staircase = 1},
        {.kind = MPT_LR_INVERSE_TIME, .initial = 0.1, .decay_steps = 3, .decay_rate = 0.7,
         .staircase = 1},
        {.kind = MPT_LR_COSINE, .initial = 0.1, .decay_steps = 4, .alpha = 0.2},
        {.kind = MPT_LR_COSINE, .initial = 0.01, .decay_steps = 4, .has_warmup_target = 1,
         .warmup_target = 0.1, .warmup_steps = 2},
        {.kind = MPT_LR_PIECEWISE, .n_boundaries = 2, .boundaries = {1, 3},
         .values = {0.1, 0.05, 0.01}},
    };
    for (int c = 0; c < 6; c++) {
        mpt_train_opts o = opts(MPT_OPT_SGD, MPT_LS_DYNAMIC);
        o.opt.schedule = cases[c];
        runner r = make("mixed_float16", &o, 1);
        params p = initial_params(), g;
        int correct;
        long step = 0;
        for (int t = 0; t < 8; t++) {
            int skip = t == 3;
            feed(&r, skip ? 1e5 : 1); /* f16 overflow: the step is skipped */
            if (!skip) hand_loss(&p, &g, &correct);
            run(&r);
            double want = mpt_lr_at(&cases[c], 0.1, step);
            CHECK_MSG(fabs(out(&r, "learning_rate") - want) <= 1e-6 * want + 1e-9,
                      "%s step %ld: rate %.9g, want %.9g", mpt_lr_name(cases[c].kind), step,
                      out(&r, "learning_rate"), want);
            CHECK(out(&r, "finite") == !skip);
            if (skip) continue;
            for (int k = 0; k < NP; k++) p.v[k] -= want * g.v[k];
            step++;
        }
        CHECK(mpt_tensor_get(var(&r, "optimizer/iterations"), 0) == step);
        /* f16 activations: the update's error is f16's, not f32's */
        for (int k = 0; k < IN * C; k++)
            CHECK_NEAR(mpt_tensor_get(var(&r, "dense/kernel"), k), p.v[k], 2e-3, 2e-3);
        runner_free(&r);
    }
    /* the host's formula at hand-checked points */
    mpt_lr_schedule pw = cases[5], cw = cases[4];
    CHECK(mpt_lr_at(&pw, 0, 1) == 0.1 && mpt_lr_at(&pw, 0, 2) == 0.05 &&
          mpt_lr_at(&pw, 0, 4) == 0.01);
    CHECK_NEAR(mpt_lr_at(&cw, 0, 1), 0.055, 1e-12, 0);
    CHECK_NEAR(mpt_lr_at(&cw, 0, 4), 0.05, 1e-12, 0); /* half way down the cosine */
    CHECK_NEAR(mpt_lr_at(&cw, 0, 100), 0, 1e-12, 0);
}

/* the variables' gradients, clipped by hand: mode 0 clipnorm (each
 * variable), 1 global_clipnorm, 2 clipvalue */
static void hand_clip(params *g, int mode, double c) {
    double sk = 0, sb = 0;
    for (int k = 0; k < IN * C; k++) sk += g->v[k] * g->v[k];
    for (int j = 0; j < C; j++) sb += BIAS(g, j) * BIAS(g, j);
    for (int k = 0; k < NP; k++) {
        int bias = k >= IN * C;
        if (mode == 0) g->v[k] = g->v[k] * c / fmax(sqrt(bias ? sb : sk), c);
        else if (mode == 1) g->v[k] *= c * fmin(1 / sqrt(sk + sb), 1 / c);
        else g->v[k] = fmin(fmax(g->v[k], -c), c);
    }
}

static void test_clipping(int mode) {
    static const double clip[3] = {0.05, 0.08, 0.02};
    mpt_train_opts o = opts(MPT_OPT_SGD, MPT_LS_DYNAMIC);
    *(mode == 0 ? &o.opt.clipnorm : mode == 1 ? &o.opt.global_clipnorm : &o.opt.clipvalue) =
        clip[mode];
    runner r = make("float32", &o, 1);
    params p = initial_params(), g;
    int correct;
    for (int t = 0; t < 2; t++) {
        hand_loss(&p, &g, &correct);
        params unclipped = g;
        hand_clip(&g, mode, clip[mode]);
        int changed = 0;
        for (int k = 0; k < NP; k++) changed |= fabs(g.v[k] - unclipped.v[k]) > 1e-6;
        CHECK_MSG(changed, "clip mode %d changes nothing here: the test would not see it", mode);
        run(&r);
        for (int k = 0; k < NP; k++) p.v[k] -= 0.1 * g.v[k];
    }
    check_params(&r, &p);
    runner_free(&r);
}

/* decoupled weight decay (Keras 3): w - w * wd * lr, then the update,
 * for every variable an exclude pattern does not match */
static void test_weight_decay(void) {
    static const char *const exclude[] = {"bi.s$"};
    mpt_train_opts o = opts(MPT_OPT_SGD, MPT_LS_NONE);
    o.opt.weight_decay = 0.3;
    o.opt.exclude_from_weight_decay = exclude;
    o.opt.n_exclude = 1;
    runner r = make("float32", &o, 1);
    params p = initial_params(), g;
    int correct;
    hand_loss(&p, &g, &correct);
    run(&r);
    for (int k = 0; k < NP; k++) {
        if (k < IN * C) p.v[k] -= p.v[k] * 0.3 * 0.1;
        p.v[k] -= 0.1 * g.v[k];
    }
    check_params(&r, &p);
    runner_free(&r);

    /* adamw: adam from the decayed weights */
    o = opts(MPT_OPT_ADAMW, MPT_LS_DYNAMIC);
    o.opt.learning_rate = 0.01;
    o.opt.weight_decay = 0.004;
    r = make("float32", &o, 1);
    p = initial_params();
    params m = {0}, v = {0};
    for (int t = 1; t <= 2; t++) {
        hand_loss(&p, &g, &correct);
        run(&r);
        double lr_t = 0.01 * sqrt(1 - pow(0.999, t)) / (1 - pow(0.9, t));
        for (int k = 0; k < NP; k++) {
            p.v[k] -= p.v[k] * 0.004 * 0.01;
            m.v[k] = 0.9 * m.v[k] + 0.1 * g.v[k];
            v.v[k] = 0.999 * v.v[k] + 0.001 * g.v[k] * g.v[k];
            p.v[k] -= lr_t * m.v[k] / (sqrt(v.v[k]) + 1e-7);
        }
    }
    check_params(&r, &p);
    runner_free(&r);
}

static void test_lion(void) {
    mpt_train_opts o = opts(MPT_OPT_LION, MPT_LS_DYNAMIC);
    o.opt.learning_rate = 0.001;
    o.opt.beta_2 = 0.99;
    runner r = make("float32", &o, 1);
    params p = initial_params(), g, m = {0};
    int correct;
    for (int t = 0; t < 3; t++) {
        hand_loss(&p, &g, &correct);
        run(&r);
        for (int k = 0; k < NP; k++) {
            double d = 0.9 * m.v[k] + 0.1 * g.v[k];
            p.v[k] -= 0.001 * (d > 0 ? 1 : d < 0 ? -1 : 0);
            m.v[k] = 0.99 * m.v[k] + 0.01 * g.v[k];
        }
    }
    check_params(&r, &p);
    runner_free(&r);
}

/* Adafactor (Keras 3): the kernel [IN, C] through the factored moments,
 * the bias through the plain one; the step max(eps2, rms(w)) * min(lr,
 * 1/sqrt(t)), the update clipped by its RMS */
static void test_adafactor(void) {
    mpt_train_opts o = opts(MPT_OPT_ADAFACTOR, MPT_LS_DYNAMIC);
    o.opt.learning_rate = 0.5; /* above 1/sqrt(t) from t = 5 on: relative_step shows */
    o.opt.beta_2_decay = -0.8, o.opt.epsilon_1 = 1e-30, o.opt.epsilon_2 = 1e-3;
    o.opt.clip_threshold = 1, o.opt.relative_step = 1;
    runner r = make("float32", &o, 1);
    params p = initial_params(), g;
    double R[IN] = {0}, Cc[C] = {0}, Vb[C] = {0};
    int correct;
    for (int t = 1; t <= 6; t++) {
        hand_loss(&p, &g, &correct);
        run(&r);
        double rho = fmin(fmin(0.5, 1 / sqrt(t)), 1 / sqrt(t));
        double beta = 1 - pow(t, -0.8);
        /* kernel: rms(w), the factored v, u, its clip */
        double ms = 0, v[IN][C], u[IN][C], mu = 0, rmean = 0;
        for (int k = 0; k < IN * C; k++) ms += p.v[k] * p.v[k] / (IN * C);
        double alpha = fmax(1e-3, sqrt(ms)) * rho;
        for (int i = 0; i < IN; i++) {
            double m = 0;
            for (int j = 0; j < C; j++) m += (W(&g, i, j) * W(&g, i, j) + 1e-30) / C;
            R[i] = beta * R[i] + (1 - beta) * m;
        }
        for (int j = 0; j < C; j++) {
            double m = 0;
            for (int i = 0; i < IN; i++) m += (W(&g, i, j) * W(&g, i, j) + 1e-30) / IN;
            Cc[j] = beta * Cc[j] + (1 - beta) * m;
        }
        for (int i = 0; i < IN; i++) rmean += R[i] / IN;
        for (int i = 0; i < IN; i++)
            for (int j = 0; j < C; j++) {
                v[i][j] = R[i] / rmean * Cc[j];
                u[i][j] = W(&g, i, j) / sqrt(v[i][j]);
                mu += u[i][j] * u[i][j] / (IN * C);
            }
        double clip = fmax(1, sqrt(mu) / 1);
        for (int i = 0; i < IN; i++)
            for (int j = 0; j < C; j++) W(&p, i, j) -= alpha * u[i][j] / clip;
        /* bias */
        double bms = 0, ub[C], bmu = 0;
        for (int j = 0; j < C; j++) bms += BIAS(&p, j) * BIAS(&p, j) / C;
        double balpha = fmax(1e-3, sqrt(bms)) * rho;
        for (int j = 0; j < C; j++) {
            Vb[j] = beta * Vb[j] + (1 - beta) * (BIAS(&g, j) * BIAS(&g, j) + 1e-30);
            ub[j] = BIAS(&g, j) / sqrt(Vb[j]);
            bmu += ub[j] * ub[j] / C;
        }
        for (int j = 0; j < C; j++) BIAS(&p, j) -= balpha * ub[j] / fmax(1, sqrt(bmu));
    }
    /* six steps of divisions by square roots of small moments: 1e-4 */
    for (int k = 0; k < NP; k++) {
        const char *nm = k < IN * C ? "dense/kernel" : "dense/bias";
        int at = k < IN * C ? k : k - IN * C;
        CHECK_NEAR(mpt_tensor_get(var(&r, nm), at), p.v[k], 1e-5, 1e-4);
    }
    CHECK(var(&r, "dense/kernel/r")->shape.rank == 1 && var(&r, "dense/kernel/r")->shape.dim[0] == IN);
    CHECK(var(&r, "dense/kernel/c")->shape.rank == 1 && var(&r, "dense/kernel/c")->shape.dim[0] == C);
    runner_free(&r);
}

static void test_control_errors(void) {
    mpt_graph *fwd = model(1);
    mpt_graph *t = typed(fwd, "float32");
    char err[512];
    mpt_train_opts o = opts(MPT_OPT_SGD, MPT_LS_NONE);
    o.opt.clipnorm = 1;
    o.opt.clipvalue = 1;
    CHECK(mpt_train_step(t, &o, err, sizeof err) == NULL && strstr(err, "one of them"));
    o = opts(MPT_OPT_ADAMW, MPT_LS_NONE);
    static const char *const bad_re[] = {"(bias"};
    o.opt.exclude_from_weight_decay = bad_re;
    o.opt.n_exclude = 1;
    CHECK(mpt_train_step(t, &o, err, sizeof err) == NULL && strstr(err, "(bias") &&
          strstr(err, "hint"));
    o = opts(MPT_OPT_SGD, MPT_LS_NONE);
    o.opt.schedule = (mpt_lr_schedule){.kind = MPT_LR_PIECEWISE, .n_boundaries = 2,
                                       .boundaries = {5, 5}, .values = {1, 2, 3}};
    CHECK(mpt_train_step(t, &o, err, sizeof err) == NULL && strstr(err, "increase"));
    o.opt.schedule = (mpt_lr_schedule){.kind = MPT_LR_COSINE, .initial = 0.1, .decay_steps = 0};
    CHECK(mpt_train_step(t, &o, err, sizeof err) == NULL && strstr(err, "decay_steps"));
    mpt_graph_free(t);
    mpt_graph_free(fwd);
}

int main(void) {
    test_metrics();
    test_sgd(MPT_LS_NONE);
    test_sgd(MPT_LS_DYNAMIC);
    test_sgd_momentum(0);
    test_sgd_momentum(1);
    test_adam();
    test_rmsprop(0, 0);
    test_rmsprop(0.9, 0);
    test_rmsprop(0, 1);
    test_rmsprop(0.9, 1);
    test_overflow_skips();
    test_scale_grows();
    test_fixed_scale();
    test_eval();
    test_errors();
    test_loss_decreases();
    test_schedules();
    for (int mode = 0; mode < 3; mode++) test_clipping(mode);
    test_weight_decay();
    test_lion();
    test_adafactor();
    test_control_errors();
    return check_exit("test_train_step");
}
