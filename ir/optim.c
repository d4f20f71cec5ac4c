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
 *  adamw    adam after decoupled weight decay (weight_decay=0.004)
 *  lion     w -= lr * sign(beta_1 * m + (1 - beta_1) * g)   (Keras 3)
 *           m = beta_2 * m + (1 - beta_2) * g
 *  adafactor Keras 3's, below
 * Before any of them, as Keras 3's base optimizer (ir/schedule.c): this
 * step's learning rate (a state variable, or a schedule of iterations),
 * clipping of the unscaled gradients, and weight decay
 * w - w * weight_decay * lr, which the update then starts from.
 * Slots start at zero (Keras v2) and are named "<var>/m", "<var>/v",
 * "<var>/momentum", "<var>/rms".
 */
#include <assert.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/train_impl.h"

const char *mpt_opt_name(mpt_opt_kind k) {
    switch (k) {
    case MPT_OPT_SGD: return "sgd";
    case MPT_OPT_ADAM: return "adam";
    case MPT_OPT_RMSPROP: return "rmsprop";
    case MPT_OPT_ADAMW: return "adamw";
    case MPT_OPT_LION: return "lion";
    case MPT_OPT_ADAFACTOR: return "adafactor";
    case MPT_OPT_COUNT: break;
    }
    return "?";
}

static int bad(char *err, size_t errlen, const char *what, double v, const char *want) {
    snprintf(err, errlen, "optimizer: %s = %g is out of range (hint: it must be %s)", what, v,
             want);
    return -1;
}

static int check_common(const mpt_optimizer_config *c, char *err, size_t errlen) {
    if (c->schedule.kind == MPT_LR_CONSTANT &&
        (!(c->learning_rate > 0) || !isfinite(c->learning_rate)))
        return bad(err, errlen, "learning_rate", c->learning_rate, "a positive number");
    if (mpt_lr_check(&c->schedule, err, errlen) != 0) return -1;
    int clips = (c->clipnorm > 0) + (c->clipvalue > 0) + (c->global_clipnorm > 0);
    if (clips > 1) {
        snprintf(err, errlen, "optimizer: clipnorm, clipvalue and global_clipnorm are set "
                 "together (hint: set one of them, as Keras allows)");
        return -1;
    }
    if (c->clipnorm < 0 || c->clipvalue < 0 || c->global_clipnorm < 0 || !(c->weight_decay >= 0))
        return bad(err, errlen, c->weight_decay < 0 ? "weight_decay" : "a clip", -1, "0 or more");
    for (int i = 0; i < c->n_exclude; i++) {
        regex_t re;
        int rc = regcomp(&re, c->exclude_from_weight_decay[i], REG_EXTENDED | REG_NOSUB);
        if (rc != 0) {
            char why[128];
            regerror(rc, &re, why, sizeof why);
            snprintf(err, errlen, "optimizer: exclude_from_weight_decay pattern '%s': %s (hint: "
                     "a POSIX extended regular expression, matched anywhere in the variable's "
                     "name, such as \"bias\" or \"norm\")", c->exclude_from_weight_decay[i], why);
            return -1;
        }
        regfree(&re);
    }
    return 0;
}

int mpt_optim_check(const mpt_optimizer_config *c, char *err, size_t errlen) {
    if (c->kind < 0 || c->kind >= MPT_OPT_COUNT) {
        snprintf(err, errlen, "unknown optimizer (expected sgd, adam, adamw, rmsprop or lion)");
        return -1;
    }
    if (check_common(c, err, errlen) != 0) return -1;
    switch (c->kind) {
    case MPT_OPT_SGD:
        if (!(c->momentum >= 0 && c->momentum <= 1))
            return bad(err, errlen, "momentum", c->momentum, "in [0, 1]");
        return 0;
    case MPT_OPT_ADAM:
    case MPT_OPT_ADAMW:
        if (!(c->epsilon > 0) || !isfinite(c->epsilon))
            return bad(err, errlen, "epsilon", c->epsilon, "a positive number");
        /* fall through */
    case MPT_OPT_LION:
        if (!(c->beta_1 >= 0 && c->beta_1 < 1))
            return bad(err, errlen, "beta_1", c->beta_1, "in [0, 1)");
        if (!(c->beta_2 >= 0 && c->beta_2 < 1))
            return bad(err, errlen, "beta_2", c->beta_2, "in [0, 1)");
        return 0;
    case MPT_OPT_ADAFACTOR:
        if (!(c->beta_2_decay < 0) || !isfinite(c->beta_2_decay))
            return bad(err, errlen, "beta_2_decay", c->beta_2_decay, "negative");
        if (!(c->epsilon_1 > 0) || !(c->epsilon_2 > 0) || !(c->clip_threshold > 0))
            return bad(err, errlen, "epsilon_1, epsilon_2 or clip_threshold",
                       fmin(c->epsilon_1, fmin(c->epsilon_2, c->clip_threshold)), "positive");
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
/* The name of the variable being built: a VARIABLE's own, or for a rank's
 * shard of one (ZeRO-1, ir/train.c) the name given to mpt_optim_build */
static const char *building;
static const char *name_of(const mpt_graph *g, int var) {
    return g->nodes[var].name ? g->nodes[var].name : building;
}

static int slot(mpt_graph *g, int var, const char *name) {
    const mpt_node *v = &g->nodes[var];
    size_t len = strlen(name_of(g, var)) + strlen(name) + 2;
    char *full = malloc(len);
    assert(full && "out of memory naming an optimizer slot");
    snprintf(full, len, "%s/%s", name_of(g, var), name);
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

/* Each update rule: w is the variable (its slots are named after it), b
 * the value the update starts from (w, or w after weight decay), lr this
 * step's learning rate (an f32 scalar node). */
static int sgd(mpt_graph *g, const mpt_optimizer_config *c, int w, int b, int gr, int lr,
               mpt_update *ups) {
    int lr_g = mul(g, widen(g, lr, w), gr);
    if (c->momentum == 0) {
        ups[0] = (mpt_update){w, sub(g, b, lr_g)};
        return 1;
    }
    int v = slot(g, w, "momentum");
    int v1 = sub(g, mul(g, k(g, c->momentum, w), v), lr_g);
    int step = c->nesterov ? sub(g, mul(g, k(g, c->momentum, w), v1), lr_g) : v1;
    ups[0] = (mpt_update){w, add(g, b, step)};
    ups[1] = (mpt_update){v, v1};
    return 2;
}

/* lr * sqrt(1 - beta_2^t) / (1 - beta_1^t), a scalar; t is f32 */
static int adam_lr(mpt_graph *g, const mpt_optimizer_config *c, int t, int lr) {
    int one = mpt_b_scalar(g, MPT_DT_F32, 1);
    int b1t = mpt_b_binary(g, MPT_OP_POW, mpt_b_scalar(g, MPT_DT_F32, c->beta_1), t);
    int b2t = mpt_b_binary(g, MPT_OP_POW, mpt_b_scalar(g, MPT_DT_F32, c->beta_2), t);
    return dvd(g, mul(g, lr, sqrt_(g, sub(g, one, b2t))), sub(g, one, b1t));
}

static int adam(mpt_graph *g, const mpt_optimizer_config *c, int w, int b, int gr, int lr_t,
                mpt_update *ups) {
    int m = slot(g, w, "m"), v = slot(g, w, "v");
    int m1 = add(g, m, mul(g, sub(g, gr, m), k(g, 1 - c->beta_1, w)));
    int v1 = add(g, v, mul(g, sub(g, sqr(g, gr), v), k(g, 1 - c->beta_2, w)));
    int denom = add(g, sqrt_(g, v1), k(g, c->epsilon, w));
    int step = dvd(g, mul(g, widen(g, lr_t, w), m1), denom);
    ups[0] = (mpt_update){w, sub(g, b, step)};
    ups[1] = (mpt_update){m, m1};
    ups[2] = (mpt_update){v, v1};
    return 3;
}

/* A zero-initialised f32 slot "<var>/<name>" of shape s. */
static int slot_shaped(mpt_graph *g, int var, const char *name, mpt_shape s) {
    size_t len = strlen(name_of(g, var)) + strlen(name) + 2;
    char *full = malloc(len);
    assert(full && "out of memory naming an optimizer slot");
    snprintf(full, len, "%s/%s", name_of(g, var), name);
    int id = mpt_b_variable_dt(g, full, MPT_DT_F32, s, MPT_INIT_ZEROS, 0);
    free(full);
    return id;
}

static mpt_shape drop_dim(mpt_shape s, int d) {
    mpt_shape o = s;
    o.rank = s.rank - 1;
    for (int i = d; i < o.rank; i++) o.dim[i] = s.dim[i + 1];
    return o;
}

/* mean over axis d, the axis removed */
static int mean_axis(mpt_graph *g, int x, int d) {
    mpt_shape s = g->nodes[x].shape;
    int sum = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, 1LL << d);
    return mul(g, sum, k(g, 1.0 / (double)s.dim[d], sum));
}

/* sqrt(mean(x^2)) over every element, a scalar */
static int rms_all(mpt_graph *g, int x) {
    int rank = g->nodes[x].shape.rank;
    int sq = sqr(g, x);
    int sum = rank ? mpt_b_reduce(g, MPT_OP_REDUCE_SUM, sq, (1LL << rank) - 1) : sq;
    double n = (double)mpt_shape_numel(g->nodes[x].shape);
    return sqrt_(g, mul(g, sum, mpt_b_scalar(g, MPT_DT_F32, 1 / n)));
}

/* Adafactor (Keras 3): second moments factored into row and column means
 * for variables of rank >= 2 (slots r, c, and v, which Keras keeps at
 * full size), an update clipped by its RMS, a step of
 * max(epsilon_2, rms(w)) * min(lr, 1 / sqrt(t)). */
static int adafactor(mpt_graph *g, const mpt_optimizer_config *c, int w, int b, int gr, int lr,
                     int t, mpt_update *ups) {
    mpt_shape s = g->nodes[w].shape;
    int one = mpt_b_scalar(g, MPT_DT_F32, 1);
    int inv_sqrt_t = mpt_b_unary(g, MPT_OP_RECIP, sqrt_(g, t));
    if (c->relative_step) lr = mpt_b_binary(g, MPT_OP_MIN, lr, inv_sqrt_t);
    int rho_t = mpt_b_binary(g, MPT_OP_MIN, lr, inv_sqrt_t);
    int alpha_t = mul(g, mpt_b_binary(g, MPT_OP_MAX, mpt_b_scalar(g, MPT_DT_F32, c->epsilon_2),
                                      rms_all(g, b)), rho_t);
    int rgs = add(g, sqr(g, gr), k(g, c->epsilon_1, w));
    int beta = sub(g, one, mpt_b_binary(g, MPT_OP_POW, t, mpt_b_scalar(g, MPT_DT_F32, c->beta_2_decay)));
    int n = 0, v1, v = slot(g, w, "v");
    if (s.rank >= 2) {
        int last = s.rank - 1;
        int r = slot_shaped(g, w, "r", drop_dim(s, last)), cc = slot_shaped(g, w, "c", drop_dim(s, last - 1));
        int r1 = add(g, mul(g, widen(g, beta, r), r), mul(g, widen(g, sub(g, one, beta), r), mean_axis(g, rgs, last)));
        int c1 = add(g, mul(g, widen(g, beta, cc), cc),
                     mul(g, widen(g, sub(g, one, beta), cc), mean_axis(g, rgs, last - 1)));
        mpt_shape rs = g->nodes[r1].shape;
        int r_mean = mpt_b_broadcast(g, mean_axis(g, r1, rs.rank - 1), rs, (1LL << (rs.rank - 1)) - 1);
        int all = (1 << s.rank) - 1;
        int rn = mpt_b_broadcast(g, dvd(g, r1, r_mean), s, all & ~(1LL << last));
        int cn = mpt_b_broadcast(g, c1, s, all & ~(1LL << (last - 1)));
        v1 = mul(g, rn, cn);
        ups[n++] = (mpt_update){r, r1};
        ups[n++] = (mpt_update){cc, c1};
    } else {
        v1 = add(g, mul(g, widen(g, beta, v), v), mul(g, widen(g, sub(g, one, beta), v), rgs));
    }
    ups[n++] = (mpt_update){v, v1};
    int u = dvd(g, gr, sqrt_(g, v1));
    int denom = mpt_b_binary(g, MPT_OP_MAX, one,
                             dvd(g, rms_all(g, u), mpt_b_scalar(g, MPT_DT_F32, c->clip_threshold)));
    int u_hat = dvd(g, u, widen(g, denom, w));
    ups[n++] = (mpt_update){w, sub(g, b, mul(g, widen(g, alpha_t, w), u_hat))};
    return n;
}

/* Lion (Keras 3): w -= lr * sign(beta_1 m + (1 - beta_1) g);
 * m = beta_2 m + (1 - beta_2) g */
static int sign_of(mpt_graph *g, int x) {
    int zero = k(g, 0, x);
    int neg = mpt_b_select(g, mpt_b_binary(g, MPT_OP_LT, x, zero), k(g, -1, x), zero);
    return mpt_b_select(g, mpt_b_binary(g, MPT_OP_GT, x, zero), k(g, 1, x), neg);
}

static int lion(mpt_graph *g, const mpt_optimizer_config *c, int w, int b, int gr, int lr,
                mpt_update *ups) {
    int m = slot(g, w, "momentum");
    int dir = add(g, mul(g, m, k(g, c->beta_1, w)), mul(g, gr, k(g, 1 - c->beta_1, w)));
    ups[0] = (mpt_update){w, sub(g, b, mul(g, widen(g, lr, w), sign_of(g, dir)))};
    ups[1] = (mpt_update){m, add(g, mul(g, m, k(g, c->beta_2, w)), mul(g, gr, k(g, 1 - c->beta_2, w)))};
    return 2;
}

static int rmsprop(mpt_graph *g, const mpt_optimizer_config *c, int w, int b, int gr, int lr,
                   mpt_update *ups) {
    int rms = slot(g, w, "rms");
    int lr_g = mul(g, widen(g, lr, w), gr);
    if (!c->legacy) {
        int rms1 = add(g, mul(g, k(g, c->rho, w), rms), mul(g, k(g, 1 - c->rho, w), sqr(g, gr)));
        int step = dvd(g, lr_g, sqrt_(g, add(g, rms1, k(g, c->epsilon, w))));
        if (c->momentum == 0) {
            ups[0] = (mpt_update){w, sub(g, b, step)};
            ups[1] = (mpt_update){rms, rms1};
            return 2;
        }
        int mom = slot(g, w, "momentum");
        int mom1 = add(g, mul(g, k(g, c->momentum, w), mom), step);
        ups[0] = (mpt_update){w, sub(g, b, mom1)};
        ups[1] = (mpt_update){rms, rms1};
        ups[2] = (mpt_update){mom, mom1};
        return 3;
    }
    if (c->momentum == 0) {
        int rms1 = add(g, mul(g, k(g, c->rho, w), rms), mul(g, k(g, 1 - c->rho, w), sqr(g, gr)));
        int denom = add(g, sqrt_(g, rms1), k(g, c->epsilon, w));
        ups[0] = (mpt_update){w, sub(g, b, dvd(g, lr_g, denom))};
        ups[1] = (mpt_update){rms, rms1};
        return 2;
    }
    int mom = slot(g, w, "momentum");
    int rms1 = add(g, rms, mul(g, sub(g, sqr(g, gr), rms), k(g, 1 - c->rho, w)));
    int denom = sqrt_(g, add(g, rms1, k(g, c->epsilon, w)));
    int mom1 = add(g, mul(g, k(g, c->momentum, w), mom), dvd(g, lr_g, denom));
    ups[0] = (mpt_update){w, sub(g, b, mom1)};
    ups[1] = (mpt_update){rms, rms1};
    ups[2] = (mpt_update){mom, mom1};
    return 3;
}

int mpt_optim_build(mpt_graph *g, const mpt_optimizer_config *c, const int *vars,
                    const char *const *names, const int *grads_in, int n, mpt_update *ups,
                    int *lr_out) {
    int n_ups = 0;
    int it = mpt_b_variable_dt(g, "optimizer/iterations", MPT_DT_I32, mpt_shape_scalar(),
                               MPT_INIT_ZEROS, 0);
    int it1 = mpt_b_binary(g, MPT_OP_ADD, it, mpt_b_scalar(g, MPT_DT_I32, 1));
    int lr = mpt_lr_build(g, c, it);
    *lr_out = lr;
    int adam_like = c->kind == MPT_OPT_ADAM || c->kind == MPT_OPT_ADAMW;
    int lr_t = adam_like ? adam_lr(g, c, mpt_b_cast(g, it1, MPT_DT_F32), lr) : -1;
    int *grads = malloc(((size_t)n + 1) * sizeof *grads);
    assert(grads && "out of memory building the optimizer");
    memcpy(grads, grads_in, (size_t)n * sizeof *grads);
    mpt_clip_build(g, c, grads, n);
    for (int i = 0; i < n; i++) {
        int w = vars[i];
        building = names ? names[i] : g->nodes[w].name;
        int b = mpt_decay_applies(c, name_of(g, w)) ? mpt_decay_build(g, c, w, lr) : w;
        switch (c->kind) {
        case MPT_OPT_SGD: n_ups += sgd(g, c, w, b, grads[i], lr, ups + n_ups); break;
        case MPT_OPT_ADAM:
        case MPT_OPT_ADAMW: n_ups += adam(g, c, w, b, grads[i], lr_t, ups + n_ups); break;
        case MPT_OPT_RMSPROP: n_ups += rmsprop(g, c, w, b, grads[i], lr, ups + n_ups); break;
        case MPT_OPT_LION: n_ups += lion(g, c, w, b, grads[i], lr, ups + n_ups); break;
        case MPT_OPT_ADAFACTOR:
            n_ups += adafactor(g, c, w, b, grads[i], lr, mpt_b_cast(g, it1, MPT_DT_F32), ups + n_ups);
            break;
        case MPT_OPT_COUNT: assert(!"not an optimizer (checked by mpt_optim_check)"); break;
        }
    }
    free(grads);
    building = NULL;
    ups[n_ups++] = (mpt_update){it, it1};
    return n_ups;
}
