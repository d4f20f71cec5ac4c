/* tests/train_step_check.h — what the train-step tests share: a
 * three-class softmax regression on four samples, its loss and gradient by
 * hand in f64, and a runner of its step graph on the reference interpreter
 * (test_train_step, test_train_controls).
 *
 * Tolerances (|got - ref| <= atol + rtol |ref|):
 *   f32 step vs f64 hand formula: rtol 1e-5, atol 1e-6. A step is a few
 *   dozen f32 roundings of 6e-8 each on values of order 1; 1e-5 leaves a
 *   hundredfold margin and still catches any wrong term (the smallest term
 *   checked, lr * g, is of order 1e-3 of the weights). */
#ifndef MPTC_TESTS_TRAIN_STEP_CHECK_H
#define MPTC_TESTS_TRAIN_STEP_CHECK_H

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

static inline params initial_params(void) {
    params p;
    for (int i = 0; i < IN; i++)
        for (int j = 0; j < C; j++) W(&p, i, j) = 0.1 * (i - j) + 0.05 * i * j + 0.02;
    for (int j = 0; j < C; j++) BIAS(&p, j) = 0.01 * j - 0.01;
    return p;
}

/* mean sparse crossentropy of softmax(x w + b); fills the gradient and the
 * number of correct argmax predictions */
static inline double hand_loss(const params *p, params *g, int *correct) {
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
static inline mpt_graph *model(int with_logits) {
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

static inline mpt_graph *typed(const mpt_graph *fwd, const char *policy) {
    mpt_policy_opts po = {0};
    char err[256] = "";
    if (mpt_policy_lookup(policy, &po.global) != 0) abort();
    mpt_graph *t = mpt_policy_apply(fwd, &po, err, sizeof err);
    CHECK_MSG(t != NULL, "%s", err);
    if (!t) exit(check_exit("test_train_step"));
    return t;
}

static inline mpt_train_opts opts(mpt_opt_kind kind, int ls_mode) {
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

static inline void runner_init(runner *r, mpt_graph *g) {
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

static inline void runner_free(runner *r) {
    for (int k = 0; k < r->n_vars; k++) mpt_tensor_free(&r->vars[k]);
    for (int k = 0; k < r->n_inputs; k++) mpt_tensor_free(&r->inputs[k]);
    for (int k = 0; k < r->g->n_outputs; k++) mpt_tensor_free(&r->outs[k]);
    free(r->vars);
    free(r->inputs);
    free(r->outs);
    mpt_graph_free(r->g);
}

static inline mpt_tensor *var(runner *r, const char *name) {
    for (int k = 0; k < r->n_vars; k++)
        if (strcmp(r->g->nodes[mpt_graph_variable_node(r->g, k)].name, name) == 0)
            return &r->vars[k];
    CHECK_MSG(0, "no variable %s", name);
    exit(check_exit("test_train_step"));
}

static inline mpt_tensor *input(runner *r, const char *name) {
    for (int k = 0; k < r->n_inputs; k++)
        if (strcmp(r->g->nodes[mpt_graph_input_node(r->g, k)].name, name) == 0)
            return &r->inputs[k];
    CHECK_MSG(0, "no input %s", name);
    exit(check_exit("test_train_step"));
}

static inline double out(runner *r, const char *name) {
    int k = mpt_graph_find_output(r->g, name);
    CHECK_MSG(k >= 0, "no output %s", name);
    return k >= 0 ? mpt_tensor_get(&r->outs[k], 0) : NAN;
}

static inline void set_params(runner *r, const params *p) {
    for (int i = 0; i < IN; i++)
        for (int j = 0; j < C; j++) mpt_tensor_set(var(r, "dense/kernel"), i * C + j, W(p, i, j));
    for (int j = 0; j < C; j++) mpt_tensor_set(var(r, "dense/bias"), j, BIAS(p, j));
}

static inline void check_params(runner *r, const params *p) {
    for (int i = 0; i < IN; i++)
        for (int j = 0; j < C; j++)
            CHECK_NEAR(mpt_tensor_get(var(r, "dense/kernel"), i * C + j), W(p, i, j), ATOL, RTOL);
    for (int j = 0; j < C; j++)
        CHECK_NEAR(mpt_tensor_get(var(r, "dense/bias"), j), BIAS(p, j), ATOL, RTOL);
}

static inline void feed(runner *r, double x_scale) {
    for (int n = 0; n < B; n++) {
        for (int i = 0; i < IN; i++) mpt_tensor_set(input(r, "x"), n * IN + i, X[n][i] * x_scale);
        mpt_tensor_set(input(r, "y"), n, Y[n]);
    }
}

static inline void run(runner *r) {
    for (int k = 0; k < r->g->n_outputs; k++) mpt_tensor_free(&r->outs[k]);
    char err[256] = "";
    int rc = mpt_interp_run(r->g, r->inputs, r->vars, r->outs, NULL, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    if (rc != 0) exit(check_exit("test_train_step"));
}

static inline runner make(const char *policy, const mpt_train_opts *o, int with_logits) {
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


#endif
