/* tests/test_train_controls.c — the training controls of the train step
 * (ir/optim.c) on the reference interpreter: learning-rate schedules,
 * gradient clipping, weight decay, the lion and adafactor optimizers, and
 * their user errors; the model and its hand gradient are
 * tests/train_step_check.h's. */
#include "tests/train_step_check.h"

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
    test_schedules();
    for (int mode = 0; mode < 3; mode++) test_clipping(mode);
    test_weight_decay();
    test_lion();
    test_adafactor();
    test_control_errors();
    return check_exit("test_train_controls");
}
