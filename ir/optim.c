/* ir/optim.c — the optimizers as graph ops, exactly as tf.keras.optimizers
 * (v2) compute them on dense f32 variables. All state is f32 except
 * "optimizer/iterations" (i32, as Keras' int64 counter, started at 0).
 *
 *  sgd      no momentum:  w -= lr * g                   (ResourceApplyGradientDescent)
 *           momentum:     v = momentum * v - lr * g     (ResourceApplyKerasMomentum)
 *                         w += v, or with nesterov
 *                         w += momentum * v - lr * g
 *  adam     t = iterations + 1 in f32,
 *           lr_t = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)
 *           m += (g - m) * (1 - beta_1)                 (ResourceApplyAdam's form)
 *           v += (g^2 - v) * (1 - beta_2)
 *           w -= lr_t * m / (sqrt(v) + epsilon)         (epsilon is Keras' "epsilon hat")
 *  rmsprop  as Keras 3 and tf.keras >= 2.11 (keras.optimizers.RMSprop):
 *                         rms = rho * rms + (1 - rho) * g^2
 *                         step = lr * g / sqrt(rms + epsilon)
 *           no momentum:  w -= step
 *           momentum:     mom = momentum * mom + step; w -= mom
 *  rmsprop(legacy=true)   tf.keras <= 2.10 (the optimizer now in
 *                         tf.keras.optimizers.legacy):
 *           no momentum:  rms = rho * rms + (1 - rho) * g^2
 *                         w -= lr * g / (sqrt(rms) + epsilon)
 *           momentum:     rms += (g^2 - rms) * (1 - rho) (ResourceApplyRMSProp)
 *                         mom = momentum * mom + lr * g / sqrt(rms + epsilon)
 *                         w -= mom
 *           (epsilon inside the square root with momentum: that optimizer
 *           switched to TF's fused kernel there). On the MLP the two
 *           formulas' first steps differ by 34% in L2.
 * Slots start at zero (Keras v2) and are named "<var>/m", "<var>/v",
 * "<var>/momentum", "<var>/rms".
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/train_impl.h"

const char *mpt_opt_name(mpt_opt_kind k) {
    switch (k) {
    case MPT_OPT_SGD: return "sgd";
    case MPT_OPT_ADAM: return "adam";
    case MPT_OPT_RMSPROP: return "rmsprop";
    case MPT_OPT_COUNT: break;
    }
    return "?";
}

static int bad(char *err, size_t errlen, const char *what, double v, const char *want) {
    snprintf(err, errlen, "optimizer: %s = %g is out of range (hint: it must be %s)", what, v,
             want);
    return -1;
}

int mpt_optim_check(const mpt_optimizer_config *c, char *err, size_t errlen) {
    if (c->kind < 0 || c->kind >= MPT_OPT_COUNT) {
        snprintf(err, errlen, "unknown optimizer (expected sgd, adam or rmsprop)");
        return -1;
    }
    if (!(c->learning_rate > 0) || !isfinite(c->learning_rate))
        return bad(err, errlen, "learning_rate", c->learning_rate, "a positive number");
    switch (c->kind) {
    case MPT_OPT_SGD:
        if (!(c->momentum >= 0 && c->momentum <= 1))
            return bad(err, errlen, "momentum", c->momentum, "in [0, 1]");
        return 0;
    case MPT_OPT_ADAM:
        if (!(c->beta_1 >= 0 && c->beta_1 < 1))
            return bad(err, errlen, "beta_1", c->beta_1, "in [0, 1)");
        if (!(c->beta_2 >= 0 && c->beta_2 < 1))
            return bad(err, errlen, "beta_2", c->beta_2, "in [0, 1)");
        if (!(c->epsilon > 0) || !isfinite(c->epsilon))
            return bad(err, errlen, "epsilon", c->epsilon, "a positive number");
        return 0;
    case MPT_OPT_RMSPROP:
        if (!(c->rho >= 0 && c->rho < 1)) return bad(err, errlen, "rho", c->rho, "in [0, 1)");
        if (!(c->momentum >= 0 && c->momentum <= 1))
            return bad(err, errlen, "momentum", c->momentum, "in [0, 1]");
        if (!(c->epsilon > 0) || !isfinite(c->epsilon))
            return bad(err, errlen, "epsilon", c->epsilon, "a positive number");
        return 0;
    case MPT_OPT_COUNT:
        break;
    }
    return -1;
}

/* A zero-initialised f32 slot "<var>/<slot>" of the variable's shape. */
static int slot(mpt_graph *g, int var, const char *name) {
    const mpt_node *v = &g->nodes[var];
    size_t len = strlen(v->name) + strlen(name) + 2;
    char *full = malloc(len);
    assert(full && "out of memory naming an optimizer slot");
    snprintf(full, len, "%s/%s", v->name, name);
    int s = mpt_b_variable_dt(g, full, MPT_DT_F32, v->shape, MPT_INIT_ZEROS, 0);
    free(full);
    return s;
}

/* Shorthands over the builder for readability of the update rules. */
static int add(mpt_graph *g, int a, int b) { return mpt_b_binary(g, MPT_OP_ADD, a, b); }
static int sub(mpt_graph *g, int a, int b) { return mpt_b_binary(g, MPT_OP_SUB, a, b); }
static int mul(mpt_graph *g, int a, int b) { return mpt_b_binary(g, MPT_OP_MUL, a, b); }
static int dvd(mpt_graph *g, int a, int b) { return mpt_b_binary(g, MPT_OP_DIV, a, b); }
static int sqr(mpt_graph *g, int a) { return mpt_b_unary(g, MPT_OP_SQUARE, a); }
static int sqrt_(mpt_graph *g, int a) { return mpt_b_unary(g, MPT_OP_SQRT, a); }

/* scalar constant or scalar node widened to the shape of node `like` */
static int k(mpt_graph *g, double v, int like) {
    return mpt_train_const_like(g, v, g->nodes[like].shape);
}
static int widen(mpt_graph *g, int scalar, int like) {
    return mpt_b_broadcast_to(g, scalar, g->nodes[like].shape);
}

static int sgd(mpt_graph *g, const mpt_optimizer_config *c, int w, int gr, mpt_update *ups) {
    int lr_g = mul(g, k(g, c->learning_rate, w), gr);
    if (c->momentum == 0) {
        ups[0] = (mpt_update){w, sub(g, w, lr_g)};
        return 1;
    }
    int v = slot(g, w, "momentum");
    int v1 = sub(g, mul(g, k(g, c->momentum, w), v), lr_g);
    int step = c->nesterov ? sub(g, mul(g, k(g, c->momentum, w), v1), lr_g) : v1;
    ups[0] = (mpt_update){w, add(g, w, step)};
    ups[1] = (mpt_update){v, v1};
    return 2;
}

/* lr * sqrt(1 - beta_2^t) / (1 - beta_1^t), a scalar; t is f32 */
static int adam_lr(mpt_graph *g, const mpt_optimizer_config *c, int t) {
    int one = mpt_b_scalar(g, MPT_DT_F32, 1);
    int b1t = mpt_b_binary(g, MPT_OP_POW, mpt_b_scalar(g, MPT_DT_F32, c->beta_1), t);
    int b2t = mpt_b_binary(g, MPT_OP_POW, mpt_b_scalar(g, MPT_DT_F32, c->beta_2), t);
    int lr = mpt_b_scalar(g, MPT_DT_F32, c->learning_rate);
    return dvd(g, mul(g, lr, sqrt_(g, sub(g, one, b2t))), sub(g, one, b1t));
}

static int adam(mpt_graph *g, const mpt_optimizer_config *c, int w, int gr, int lr_t,
                mpt_update *ups) {
    int m = slot(g, w, "m"), v = slot(g, w, "v");
    int m1 = add(g, m, mul(g, sub(g, gr, m), k(g, 1 - c->beta_1, w)));
    int v1 = add(g, v, mul(g, sub(g, sqr(g, gr), v), k(g, 1 - c->beta_2, w)));
    int denom = add(g, sqrt_(g, v1), k(g, c->epsilon, w));
    int step = dvd(g, mul(g, widen(g, lr_t, w), m1), denom);
    ups[0] = (mpt_update){w, sub(g, w, step)};
    ups[1] = (mpt_update){m, m1};
    ups[2] = (mpt_update){v, v1};
    return 3;
}

static int rmsprop(mpt_graph *g, const mpt_optimizer_config *c, int w, int gr,
                   mpt_update *ups) {
    int rms = slot(g, w, "rms");
    int lr_g = mul(g, k(g, c->learning_rate, w), gr);
    if (!c->legacy) {
        int rms1 = add(g, mul(g, k(g, c->rho, w), rms), mul(g, k(g, 1 - c->rho, w), sqr(g, gr)));
        int step = dvd(g, lr_g, sqrt_(g, add(g, rms1, k(g, c->epsilon, w))));
        if (c->momentum == 0) {
            ups[0] = (mpt_update){w, sub(g, w, step)};
            ups[1] = (mpt_update){rms, rms1};
            return 2;
        }
        int mom = slot(g, w, "momentum");
        int mom1 = add(g, mul(g, k(g, c->momentum, w), mom), step);
        ups[0] = (mpt_update){w, sub(g, w, mom1)};
        ups[1] = (mpt_update){rms, rms1};
        ups[2] = (mpt_update){mom, mom1};
        return 3;
    }
    if (c->momentum == 0) {
        int rms1 = add(g, mul(g, k(g, c->rho, w), rms), mul(g, k(g, 1 - c->rho, w), sqr(g, gr)));
        int denom = add(g, sqrt_(g, rms1), k(g, c->epsilon, w));
        ups[0] = (mpt_update){w, sub(g, w, dvd(g, lr_g, denom))};
        ups[1] = (mpt_update){rms, rms1};
        return 2;
    }
    int mom = slot(g, w, "momentum");
    int rms1 = add(g, rms, mul(g, sub(g, sqr(g, gr), rms), k(g, 1 - c->rho, w)));
    int denom = sqrt_(g, add(g, rms1, k(g, c->epsilon, w)));
    int mom1 = add(g, mul(g, k(g, c->momentum, w), mom), dvd(g, lr_g, denom));
    ups[0] = (mpt_update){w, sub(g, w, mom1)};
    ups[1] = (mpt_update){rms, rms1};
    ups[2] = (mpt_update){mom, mom1};
    return 3;
}

int mpt_optim_build(mpt_graph *g, const mpt_optimizer_config *c, const int *vars,
                    const int *grads, int n, mpt_update *ups) {
    int n_ups = 0;
    int it = mpt_b_variable_dt(g, "optimizer/iterations", MPT_DT_I32, mpt_shape_scalar(),
                               MPT_INIT_ZEROS, 0);
    int it1 = mpt_b_binary(g, MPT_OP_ADD, it, mpt_b_scalar(g, MPT_DT_I32, 1));
    int lr_t = c->kind == MPT_OPT_ADAM ? adam_lr(g, c, mpt_b_cast(g, it1, MPT_DT_F32)) : -1;
    for (int i = 0; i < n; i++) {
        switch (c->kind) {
        case MPT_OPT_SGD: n_ups += sgd(g, c, vars[i], grads[i], ups + n_ups); break;
        case MPT_OPT_ADAM: n_ups += adam(g, c, vars[i], grads[i], lr_t, ups + n_ups); break;
        case MPT_OPT_RMSPROP: n_ups += rmsprop(g, c, vars[i], grads[i], ups + n_ups); break;
        case MPT_OPT_COUNT: assert(!"not an optimizer (checked by mpt_optim_check)"); break;
        }
    }
    ups[n_ups++] = (mpt_update){it, it1};
    return n_ups;
}
