/* tests/test_train_step.c — the train and eval steps (ir/train.c, loss.c,
 * optim.c) run on the reference interpreter: optimizer steps against hand
 * formulas in f64, loss scaling's skip/shrink/grow, the eval step, metrics,
 * and loss going down under every policy. The training controls
 * (schedules, clipping, weight decay, lion, adafactor) are
 * tests/test_train_controls.c's; the model, its hand gradient and the
 * tolerances tests/train_step_check.h's. */
#include "tests/train_step_check.h"

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
    return check_exit("test_train_step");
}
