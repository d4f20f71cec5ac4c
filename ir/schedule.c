/* ir/schedule.c — what every optimizer shares before its own update, as
 * Keras 3's base optimizer does it: the learning rate of this step (a
 * constant state variable, or a schedule of the step counter), gradient
 * clipping and decoupled weight decay. All of it is graph ops, so it runs
 * inside the compiled step on every backend; mpt_lr_at is the same
 * schedule in double for the host (tests, the first progress line).
 *
 * The formulas are keras.optimizers.schedules' (ExponentialDecay,
 * InverseTimeDecay, CosineDecay with Keras 3's warmup,
 * PiecewiseConstantDecay), in f32, in the same order of operations. */
#include <assert.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <string.h>

#include "ir/train_impl.h"

const char *mpt_lr_name(mpt_lr_kind k) {
    switch (k) {
    case MPT_LR_CONSTANT: return "constant";
    case MPT_LR_EXPONENTIAL: return "exponential_decay";
    case MPT_LR_INVERSE_TIME: return "inverse_time_decay";
    case MPT_LR_COSINE: return "cosine_decay";
    case MPT_LR_PIECEWISE: return "piecewise_constant";
    case MPT_LR_COUNT: break;
    }
    return "?";
}

static double cosine_at(const mpt_lr_schedule *s, double step, double from) {
    double frac = step / s->decay_steps;
    double decayed = 0.5 * (1.0 + cos(M_PI * frac));
    return from * ((1 - s->alpha) * decayed + s->alpha);
}

double mpt_lr_at(const mpt_lr_schedule *s, double learning_rate, long step_) {
    double step = (double)step_, p;
    switch (s->kind) {
    case MPT_LR_CONSTANT: return learning_rate;
    case MPT_LR_EXPONENTIAL:
        p = step / s->decay_steps;
        return s->initial * pow(s->decay_rate, s->staircase ? floor(p) : p);
    case MPT_LR_INVERSE_TIME:
        p = step / s->decay_steps;
        return s->initial / (1 + s->decay_rate * (s->staircase ? floor(p) : p));
    case MPT_LR_COSINE:
        if (!s->has_warmup_target) return cosine_at(s, fmin(step, s->decay_steps), s->initial);
        step = fmin(step, s->decay_steps + s->warmup_steps);
        if (step < s->warmup_steps)
            return (s->warmup_target - s->initial) * (step / s->warmup_steps) + s->initial;
        return cosine_at(s, step - s->warmup_steps, s->warmup_target);
    case MPT_LR_PIECEWISE:
        for (int i = 0; i < s->n_boundaries; i++)
            if (step <= s->boundaries[i]) return s->values[i];
        return s->values[s->n_boundaries];
    case MPT_LR_COUNT: break;
    }
    return NAN;
}

static int bad(char *err, size_t errlen, const char *sched, const char *what, double v,
               const char *want) {
    snprintf(err, errlen, "%s: %s = %g is out of range (hint: it must be %s)", sched, what, v,
             want);
    return -1;
}

int mpt_lr_check(const mpt_lr_schedule *s, char *err, size_t errlen) {
    const char *name = mpt_lr_name(s->kind);
    switch (s->kind) {
    case MPT_LR_CONSTANT: return 0;
    case MPT_LR_EXPONENTIAL:
    case MPT_LR_INVERSE_TIME:
    case MPT_LR_COSINE:
        if (!(s->initial >= 0) || !isfinite(s->initial))
            return bad(err, errlen, name, "initial_learning_rate", s->initial, "0 or more");
        if (!(s->decay_steps > 0) || !isfinite(s->decay_steps))
            return bad(err, errlen, name, "decay_steps", s->decay_steps, "a positive number");
        if (s->kind != MPT_LR_COSINE) {
            if (!(s->decay_rate >= 0) || !isfinite(s->decay_rate))
                return bad(err, errlen, name, "decay_rate", s->decay_rate, "0 or more");
            return 0;
        }
        if (!(s->alpha >= 0 && s->alpha <= 1))
            return bad(err, errlen, name, "alpha", s->alpha, "in [0, 1]");
        if (!(s->warmup_steps >= 0) || !isfinite(s->warmup_steps))
            return bad(err, errlen, name, "warmup_steps", s->warmup_steps, "0 or more");
        if (s->has_warmup_target && s->warmup_steps == 0)
            return bad(err, errlen, name, "warmup_steps", 0, "positive with a warmup_target");
        return 0;
    case MPT_LR_PIECEWISE:
        if (s->n_boundaries < 1 || s->n_boundaries > MPT_LR_MAX_PIECES) {
            snprintf(err, errlen, "piecewise_constant: %d boundaries (hint: give 1 to %d, and "
                     "one value more than boundaries)", s->n_boundaries, MPT_LR_MAX_PIECES);
            return -1;
        }
        for (int i = 1; i < s->n_boundaries; i++)
            if (!(s->boundaries[i] > s->boundaries[i - 1])) {
                snprintf(err, errlen, "piecewise_constant: boundaries must increase (%g after "
                         "%g)", s->boundaries[i], s->boundaries[i - 1]);
                return -1;
            }
        for (int i = 0; i <= s->n_boundaries; i++)
            if (!(s->values[i] >= 0) || !isfinite(s->values[i]))
                return bad(err, errlen, name, "a value", s->values[i], "0 or more");
        return 0;
    case MPT_LR_COUNT: break;
    }
    snprintf(err, errlen, "unknown learning-rate schedule");
    return -1;
}

/* ---- graph ops -------------------------------------------------------------- */

static int f32(mpt_graph *g, double v) { return mpt_b_scalar(g, MPT_DT_F32, v); }
static int bin(mpt_graph *g, mpt_op op, int a, int b) { return mpt_b_binary(g, op, a, b); }
static int floor_pos(mpt_graph *g, int x) { /* x >= 0: truncation is the floor */
    return mpt_b_cast(g, mpt_b_cast(g, x, MPT_DT_I32), MPT_DT_F32);
}

static int cosine(mpt_graph *g, const mpt_lr_schedule *s, int step, double from) {
    int frac = bin(g, MPT_OP_DIV, step, f32(g, s->decay_steps));
    int c = mpt_b_unary(g, MPT_OP_COS, bin(g, MPT_OP_MUL, f32(g, M_PI), frac));
    int decayed = bin(g, MPT_OP_MUL, f32(g, 0.5), bin(g, MPT_OP_ADD, f32(g, 1.0), c));
    int mixed = bin(g, MPT_OP_ADD, bin(g, MPT_OP_MUL, f32(g, 1 - s->alpha), decayed),
                    f32(g, s->alpha));
    return bin(g, MPT_OP_MUL, f32(g, from), mixed);
}

int mpt_lr_build(mpt_graph *g, const mpt_optimizer_config *c, int iterations) {
    const mpt_lr_schedule *s = &c->schedule;
    if (s->kind == MPT_LR_CONSTANT)
        return mpt_b_variable_dt(g, "optimizer/learning_rate", MPT_DT_F32, mpt_shape_scalar(),
                                 MPT_INIT_CONST, c->learning_rate);
    int step = mpt_b_cast(g, iterations, MPT_DT_F32), p;
    switch (s->kind) {
    case MPT_LR_EXPONENTIAL:
    case MPT_LR_INVERSE_TIME:
        p = bin(g, MPT_OP_DIV, step, f32(g, s->decay_steps));
        if (s->staircase) p = floor_pos(g, p);
        if (s->kind == MPT_LR_EXPONENTIAL)
            return bin(g, MPT_OP_MUL, f32(g, s->initial), bin(g, MPT_OP_POW, f32(g, s->decay_rate), p));
        return bin(g, MPT_OP_DIV, f32(g, s->initial),
                   bin(g, MPT_OP_ADD, f32(g, 1), bin(g, MPT_OP_MUL, f32(g, s->decay_rate), p)));
    case MPT_LR_COSINE: {
        if (!s->has_warmup_target)
            return cosine(g, s, bin(g, MPT_OP_MIN, step, f32(g, s->decay_steps)), s->initial);
        int st = bin(g, MPT_OP_MIN, step, f32(g, s->decay_steps + s->warmup_steps));
        int warm = bin(g, MPT_OP_ADD,
                       bin(g, MPT_OP_MUL, f32(g, s->warmup_target - s->initial),
                           bin(g, MPT_OP_DIV, st, f32(g, s->warmup_steps))),
                       f32(g, s->initial));
        int decay = cosine(g, s, bin(g, MPT_OP_SUB, st, f32(g, s->warmup_steps)), s->warmup_target);
        return mpt_b_select(g, bin(g, MPT_OP_LT, st, f32(g, s->warmup_steps)), warm, decay);
    }
    case MPT_LR_PIECEWISE: {
        int lr = f32(g, s->values[s->n_boundaries]);
        for (int i = s->n_boundaries - 1; i >= 0; i--) {
            int within = mpt_b_unary(g, MPT_OP_NOT, bin(g, MPT_OP_GT, step, f32(g, s->boundaries[i])));
            lr = mpt_b_select(g, within, f32(g, s->values[i]), lr);
        }
        return lr;
    }
    case MPT_LR_CONSTANT:
    case MPT_LR_COUNT: break;
    }
    assert(!"mpt_lr_build: not a schedule (checked by mpt_lr_check)");
    return -1;
}

/* ---- clipping ----------------------------------------------------------------- */

/* sum(x^2) over every element, an f32 scalar */
static int sum_squares(mpt_graph *g, int x) {
    int sq = mpt_b_unary(g, MPT_OP_SQUARE, x);
    int rank = g->nodes[sq].shape.rank;
    return rank ? mpt_b_reduce(g, MPT_OP_REDUCE_SUM, sq, (1LL << rank) - 1) : sq;
}

static int widen(mpt_graph *g, int scalar, int like) {
    return mpt_b_broadcast_to(g, scalar, g->nodes[like].shape);
}

/* keras.ops clip_by_norm: x * c / max(norm, c), the norm 0 for a zero x */
static int clip_by_norm(mpt_graph *g, int x, double c) {
    int l2sum = sum_squares(g, x);
    int pred = bin(g, MPT_OP_GT, l2sum, f32(g, 0));
    int safe = mpt_b_select(g, pred, l2sum, f32(g, 1));
    int norm = mpt_b_select(g, pred, mpt_b_unary(g, MPT_OP_SQRT, safe), l2sum);
    int scaled = bin(g, MPT_OP_MUL, x, mpt_train_const_like(g, c, g->nodes[x].shape));
    return bin(g, MPT_OP_DIV, scaled, widen(g, bin(g, MPT_OP_MAX, norm, f32(g, c)), x));
}

void mpt_clip_build(mpt_graph *g, const mpt_optimizer_config *c, int *grads, int n) {
    if (c->clipnorm > 0) {
        for (int i = 0; i < n; i++) grads[i] = clip_by_norm(g, grads[i], c->clipnorm);
    } else if (c->global_clipnorm > 0) {
        /* clip_by_global_norm: scale = c * min(1 / norm, 1 / c), and
         * + (norm - norm) so a NaN norm makes every gradient NaN */
        if (n == 0) return;
        int total = -1;
        for (int i = 0; i < n; i++) {
            int ss = sum_squares(g, grads[i]);
            total = total < 0 ? ss : bin(g, MPT_OP_ADD, total, ss);
        }
        int norm = mpt_b_unary(g, MPT_OP_SQRT, total);
        int finite_scale = bin(g, MPT_OP_MUL, f32(g, c->global_clipnorm),
                               bin(g, MPT_OP_MIN, mpt_b_unary(g, MPT_OP_RECIP, norm),
                                   f32(g, 1 / c->global_clipnorm)));
        int scale = bin(g, MPT_OP_ADD, finite_scale, bin(g, MPT_OP_SUB, norm, norm));
        for (int i = 0; i < n; i++)
            grads[i] = bin(g, MPT_OP_MUL, grads[i], widen(g, scale, grads[i]));
    } else if (c->clipvalue > 0) {
        for (int i = 0; i < n; i++) {
            mpt_shape s = g->nodes[grads[i]].shape;
            int lo = mpt_train_const_like(g, -c->clipvalue, s);
            int hi = mpt_train_const_like(g, c->clipvalue, s);
            grads[i] = bin(g, MPT_OP_MIN, bin(g, MPT_OP_MAX, grads[i], lo), hi);
        }
    }
}

/* ---- weight decay ---------------------------------------------------------------- */

int mpt_decay_applies(const mpt_optimizer_config *c, const char *var_name) {
    if (!(c->weight_decay > 0)) return 0;
    for (int i = 0; i < c->n_exclude; i++) {
        regex_t re;
        if (regcomp(&re, c->exclude_from_weight_decay[i], REG_EXTENDED | REG_NOSUB) != 0)
            continue; /* checked by mpt_optim_check */
        int hit = regexec(&re, var_name, 0, NULL, 0) == 0;
        regfree(&re);
        if (hit) return 0;
    }
    return 1;
}

int mpt_decay_build(mpt_graph *g, const mpt_optimizer_config *c, int w, int lr) {
    /* variable - variable * wd * lr, in Keras' order of operations */
    int wd = mpt_train_const_like(g, c->weight_decay, g->nodes[w].shape);
    return bin(g, MPT_OP_SUB, w, bin(g, MPT_OP_MUL, bin(g, MPT_OP_MUL, w, wd), widen(g, lr, w)));
}
