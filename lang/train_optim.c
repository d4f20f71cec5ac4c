/* lang/train_optim.c — the train block's `optimizer = ...` (with a
 * learning-rate schedule, clipping and weight decay) and `callbacks =
 * [...]`, Keras 3's names, argument orders and defaults; and the command
 * line's --optimizer, parsed the same way. */
#include <stdlib.h>
#include <string.h>

#include "lang/model.h"

static const char *const opt_names[MPT_OPT_COUNT] = {
    [MPT_OPT_SGD] = "sgd",       [MPT_OPT_ADAM] = "adam", [MPT_OPT_RMSPROP] = "rmsprop",
    [MPT_OPT_ADAMW] = "adamw",   [MPT_OPT_LION] = "lion", [MPT_OPT_ADAFACTOR] = "adafactor"};

void mpt_optimizer_defaults(mpt_optimizer_config *o, mpt_opt_kind kind) {
    *o = (mpt_optimizer_config){.kind = kind, .beta_1 = 0.9, .beta_2 = 0.999, .epsilon = 1e-7,
                                .rho = 0.9};
    o->learning_rate = kind == MPT_OPT_SGD ? 0.01 : 0.001;
    if (kind == MPT_OPT_LION) o->beta_2 = 0.99;
    if (kind == MPT_OPT_ADAMW) o->weight_decay = 0.004;
    o->beta_2_decay = -0.8, o->epsilon_1 = 1e-30, o->epsilon_2 = 1e-3, o->clip_threshold = 1;
    o->relative_step = 1;
}

static int get_bool(mpt_diag *d, const mpt_value *v, int *out) {
    static const char *const bools[] = {"false", "true"};
    int b = mpt_set_pick(d, v, "boolean", bools, 2);
    if (b >= 0) *out = b;
    return b < 0 ? -1 : 0;
}

/* The argument names of a call, positional ones by Keras' order: the name
 * of argument i, or NULL after an error. */
static const char *arg_name(mpt_diag *d, const mpt_value *call, int i, const char *what,
                            const char *const *names, int n) {
    const char *name = call->keys[i] ? call->keys[i] : (i < n ? names[i] : NULL);
    for (int j = 0; name && j < n; j++)
        if (strcmp(names[j], name) == 0) return name;
    char hint[200];
    mpt_diag_error(d, call->items[i].loc,
                   name ? mpt_diag_did_you_mean(hint, sizeof hint, name, names, n) : NULL,
                   "%s has no argument '%s'", what, name ? name : "(positional)");
    return NULL;
}

static int number_list(mpt_diag *d, const mpt_value *v, const char *what, double *out, int max) {
    if (v->kind != MPT_V_LIST || v->n < 1 || v->n > max) {
        mpt_diag_error(d, v->loc, NULL, "%s must be a list of 1 to %d numbers", what, max);
        return -1;
    }
    for (int k = 0; k < v->n; k++)
        if (mpt_set_number(d, &v->items[k], what, -1e30, 1e30, &out[k]) != 0) return -1;
    return v->n;
}

/* ---- learning-rate schedules ---------------------------------------------- */

static const char *const sched_names[] = {"exponential_decay", "inverse_time_decay",
                                          "cosine_decay", "piecewise_constant"};
static const mpt_lr_kind sched_kinds[] = {MPT_LR_EXPONENTIAL, MPT_LR_INVERSE_TIME, MPT_LR_COSINE,
                                          MPT_LR_PIECEWISE};

static void set_schedule(mpt_diag *d, const mpt_value *v, mpt_optimizer_config *o) {
    int k = mpt_set_pick(d, v, "learning-rate schedule", sched_names, 4);
    if (k < 0) return;
    mpt_lr_schedule s = {.kind = sched_kinds[k]};
    static const char *const decay_args[] = {"initial_learning_rate", "decay_steps",
                                             "decay_rate", "staircase"};
    static const char *const cos_args[] = {"initial_learning_rate", "decay_steps", "alpha",
                                           "warmup_target", "warmup_steps"};
    static const char *const pw_args[] = {"boundaries", "values"};
    const char *const *names = k < 2 ? decay_args : k == 2 ? cos_args : pw_args;
    int n_names = k < 2 ? 4 : k == 2 ? 5 : 2, seen = 0, n_values = -1;
    for (int i = 0; i < v->n; i++) {
        const char *name = arg_name(d, v, i, sched_names[k], names, n_names);
        if (!name) continue;
        const mpt_value *x = &v->items[i];
        for (int j = 0; j < n_names; j++)
            if (strcmp(names[j], name) == 0) seen |= 1 << j;
        if (strcmp(name, "initial_learning_rate") == 0)
            mpt_set_number(d, x, name, 0, 1e6, &s.initial);
        else if (strcmp(name, "decay_steps") == 0)
            mpt_set_number(d, x, name, 1e-9, 1e15, &s.decay_steps);
        else if (strcmp(name, "decay_rate") == 0) mpt_set_number(d, x, name, 0, 1e15, &s.decay_rate);
        else if (strcmp(name, "staircase") == 0) get_bool(d, x, &s.staircase);
        else if (strcmp(name, "alpha") == 0) mpt_set_number(d, x, name, 0, 1, &s.alpha);
        else if (strcmp(name, "warmup_steps") == 0)
            mpt_set_number(d, x, name, 0, 1e15, &s.warmup_steps);
        else if (strcmp(name, "warmup_target") == 0) {
            if (mpt_set_number(d, x, name, 0, 1e6, &s.warmup_target) == 0)
                s.has_warmup_target = 1;
        } else if (strcmp(name, "boundaries") == 0) {
            s.n_boundaries = number_list(d, x, name, s.boundaries, MPT_LR_MAX_PIECES);
            if (s.n_boundaries < 0) s.n_boundaries = 0;
        } else if (strcmp(name, "values") == 0) {
            n_values = number_list(d, x, name, s.values, MPT_LR_MAX_PIECES + 1);
        }
    }
    int required = k < 2 ? 7 : 3; /* the first two, and decay_rate for the decays */
    for (int j = 0; j < n_names; j++)
        if ((required >> j & 1) && !(seen >> j & 1)) {
            mpt_diag_error(d, v->loc, NULL, "%s needs %s", sched_names[k], names[j]);
            return;
        }
    if (k == 3 && n_values >= 0 && n_values != s.n_boundaries + 1) {
        mpt_diag_error(d, v->loc, "one more value than boundaries: values[0] up to the first "
                       "boundary, the last one after the last",
                       "piecewise_constant has %d boundaries and %d values", s.n_boundaries,
                       n_values);
        return;
    }
    if (k == 3) o->learning_rate = s.values[0];
    else o->learning_rate = s.initial;
    o->schedule = s;
}

/* ---- optimizers ------------------------------------------------------------ */

static void set_exclude(mpt_diag *d, const mpt_value *v, mpt_train_config *c) {
    const mpt_value *items = v->kind == MPT_V_LIST ? v->items : v;
    int n = v->kind == MPT_V_LIST ? v->n : 1;
    for (int k = 0; k < c->n_wd_exclude; k++) free(c->wd_exclude[k]);
    free(c->wd_exclude);
    c->wd_exclude = calloc((size_t)n + 1, sizeof *c->wd_exclude);
    c->n_wd_exclude = 0;
    for (int k = 0; k < n; k++) {
        if (items[k].kind != MPT_V_STR && items[k].kind != MPT_V_SYM) {
            mpt_diag_error(d, items[k].loc, "e.g. [\"bias\", \"norm\"]",
                           "exclude_from_weight_decay lists name patterns");
            continue;
        }
        c->wd_exclude[c->n_wd_exclude++] = strdup(items[k].s);
    }
}

void mpt_set_optimizer(mpt_diag *d, const mpt_value *v, mpt_train_config *c) {
    mpt_optimizer_config *o = &c->optimizer;
    int k = mpt_set_pick(d, v, "optimizer", opt_names, MPT_OPT_COUNT);
    if (k < 0) return;
    mpt_optimizer_defaults(o, (mpt_opt_kind)k);
    static const char *const own[MPT_OPT_COUNT][6] = {
        [MPT_OPT_SGD] = {"learning_rate", "momentum", "nesterov"},
        [MPT_OPT_ADAM] = {"learning_rate", "beta_1", "beta_2", "epsilon"},
        [MPT_OPT_ADAMW] = {"learning_rate", "weight_decay", "beta_1", "beta_2", "epsilon"},
        [MPT_OPT_RMSPROP] = {"learning_rate", "rho", "momentum", "epsilon", "legacy"},
        [MPT_OPT_LION] = {"learning_rate", "beta_1", "beta_2"},
        [MPT_OPT_ADAFACTOR] = {"learning_rate", "beta_2_decay", "epsilon_1", "epsilon_2",
                               "clip_threshold", "relative_step"},
    };
    static const char *const common[] = {"clipnorm", "clipvalue", "global_clipnorm",
                                         "weight_decay", "exclude_from_weight_decay"};
    const char *names[12];
    int n_own = 0, n_names = 0;
    while (n_own < 6 && own[k][n_own]) names[n_names++] = own[k][n_own++];
    for (int j = 0; j < 5; j++)
        if (k != MPT_OPT_ADAMW || strcmp(common[j], "weight_decay") != 0) names[n_names++] = common[j];
    for (int i = 0; v->kind == MPT_V_CALL && i < v->n; i++) {
        const char *name = arg_name(d, v, i, opt_names[k], names, i < n_own || v->keys[i] ? n_names : n_own);
        if (!name) continue;
        const mpt_value *x = &v->items[i];
        if (strcmp(name, "nesterov") == 0) get_bool(d, x, &o->nesterov);
        else if (strcmp(name, "legacy") == 0) get_bool(d, x, &o->legacy);
        else if (strcmp(name, "relative_step") == 0) get_bool(d, x, &o->relative_step);
        else if (strcmp(name, "beta_2_decay") == 0) mpt_set_number(d, x, name, -1e6, -1e-9, &o->beta_2_decay);
        else if (strcmp(name, "learning_rate") == 0 && x->kind == MPT_V_CALL) set_schedule(d, x, o);
        else if (strcmp(name, "exclude_from_weight_decay") == 0) set_exclude(d, x, c);
        else {
            double *field = strcmp(name, "learning_rate") == 0     ? &o->learning_rate
                            : strcmp(name, "momentum") == 0        ? &o->momentum
                            : strcmp(name, "beta_1") == 0          ? &o->beta_1
                            : strcmp(name, "beta_2") == 0          ? &o->beta_2
                            : strcmp(name, "rho") == 0             ? &o->rho
                            : strcmp(name, "clipnorm") == 0        ? &o->clipnorm
                            : strcmp(name, "clipvalue") == 0       ? &o->clipvalue
                            : strcmp(name, "global_clipnorm") == 0 ? &o->global_clipnorm
                            : strcmp(name, "weight_decay") == 0    ? &o->weight_decay
                            : strcmp(name, "epsilon_1") == 0       ? &o->epsilon_1
                            : strcmp(name, "epsilon_2") == 0       ? &o->epsilon_2
                            : strcmp(name, "clip_threshold") == 0  ? &o->clip_threshold
                                                                   : &o->epsilon;
            int unbounded = strcmp(name, "learning_rate") == 0 || strstr(name, "clip") != NULL;
            mpt_set_number(d, x, name, 0, unbounded ? 1e6 : 1, field);
        }
    }
    o->exclude_from_weight_decay = (const char *const *)c->wd_exclude;
    o->n_exclude = c->n_wd_exclude;
}

/* ---- callbacks --------------------------------------------------------------- */

static const char *const cb_names[MPT_CB_COUNT] = {
    [MPT_CB_EARLY_STOPPING] = "early_stopping", [MPT_CB_REDUCE_LR] = "reduce_lr_on_plateau",
    [MPT_CB_CHECKPOINT] = "model_checkpoint"};

static void set_callback(mpt_diag *d, const mpt_value *v, mpt_callback_config *cb) {
    int k = mpt_set_pick(d, v, "callback", cb_names, MPT_CB_COUNT);
    if (k < 0) return;
    *cb = (mpt_callback_config){.kind = (mpt_callback_kind)k, .line = v->loc.line,
                                .col = v->loc.col};
    cb->monitor = strdup("val_loss");
    cb->factor = 0.1;
    cb->patience = k == MPT_CB_REDUCE_LR ? 10 : 0;
    cb->min_delta = k == MPT_CB_REDUCE_LR ? 1e-4 : 0;
    static const char *const args[MPT_CB_COUNT][8] = {
        [MPT_CB_EARLY_STOPPING] = {"monitor", "min_delta", "patience", "mode",
                                   "restore_best_weights", "start_from_epoch"},
        [MPT_CB_REDUCE_LR] = {"monitor", "factor", "patience", "mode", "min_delta", "cooldown",
                              "min_lr"},
        [MPT_CB_CHECKPOINT] = {"filepath", "monitor", "mode", "save_best_only"},
    };
    int n = 0;
    while (n < 8 && args[k][n]) n++;
    for (int i = 0; v->kind == MPT_V_CALL && i < v->n; i++) {
        const char *name = arg_name(d, v, i, cb_names[k], args[k], n);
        if (!name) continue;
        const mpt_value *x = &v->items[i];
        if (strcmp(name, "monitor") == 0 || strcmp(name, "filepath") == 0) {
            if (x->kind != MPT_V_STR && x->kind != MPT_V_SYM) {
                mpt_diag_error(d, x->loc, NULL, "%s must be a string", name);
                continue;
            }
            char **f = strcmp(name, "monitor") == 0 ? &cb->monitor : &cb->filepath;
            free(*f);
            *f = strdup(x->s);
        } else if (strcmp(name, "mode") == 0) {
            static const char *const modes[] = {"auto", "min", "max"};
            int m = mpt_set_pick(d, x, "mode", modes, 3);
            if (m >= 0) cb->mode = m;
        } else if (strcmp(name, "restore_best_weights") == 0) {
            get_bool(d, x, &cb->restore_best_weights);
        } else if (strcmp(name, "save_best_only") == 0) {
            get_bool(d, x, &cb->save_best_only);
        } else if (strcmp(name, "patience") == 0) {
            mpt_set_count(d, x, name, 0, &cb->patience);
        } else if (strcmp(name, "cooldown") == 0) {
            mpt_set_count(d, x, name, 0, &cb->cooldown);
        } else if (strcmp(name, "start_from_epoch") == 0) {
            mpt_set_count(d, x, name, 0, &cb->start_from_epoch);
        } else if (strcmp(name, "factor") == 0) {
            if (mpt_set_number(d, x, name, 0, 1, &cb->factor) == 0 && cb->factor >= 1)
                mpt_diag_error(d, x->loc, "Keras' default is 0.1",
                               "reduce_lr_on_plateau: factor must be below 1");
        } else {
            mpt_set_number(d, x, name, 0, 1e30, strcmp(name, "min_lr") == 0 ? &cb->min_lr
                                                                             : &cb->min_delta);
        }
    }
    if (k == MPT_CB_CHECKPOINT && !cb->filepath)
        mpt_diag_error(d, v->loc, "model_checkpoint(\"best.safetensors\", save_best_only=true)",
                       "model_checkpoint needs a filepath");
}

void mpt_set_callbacks(mpt_diag *d, const mpt_value *v, mpt_train_config *c) {
    const mpt_value *items = v->kind == MPT_V_LIST ? v->items : v;
    int n = v->kind == MPT_V_LIST ? v->n : 1;
    if (n > MPT_MAX_CALLBACKS) {
        mpt_diag_error(d, v->loc, NULL, "at most %d callbacks", MPT_MAX_CALLBACKS);
        return;
    }
    for (int k = 0; k < n; k++) {
        mpt_callback_config *cb = &c->callbacks[c->n_callbacks];
        set_callback(d, &items[k], cb);
        if (cb->monitor) c->n_callbacks++;
    }
}

/* ---- the command line's --optimizer ------------------------------------------ */

int mpt_optimizer_parse(const char *text, mpt_train_config *c, char *err, size_t n) {
    const char *pre = "train {\n    optimizer = ";
    size_t len = strlen(pre) + strlen(text) + 4;
    char *src = malloc(len), *diag_text = NULL;
    size_t diag_len = 0;
    FILE *out = open_memstream(&diag_text, &diag_len);
    if (!src || !out) {
        free(src);
        if (out) fclose(out);
        free(diag_text);
        snprintf(err, n, "out of memory");
        return -1;
    }
    snprintf(src, len, "%s%s\n}\n", pre, text);
    mpt_diag d = {.path = "--optimizer", .src = src, .len = strlen(src), .out = out};
    mpt_ast *file = mpt_parse(&d);
    const mpt_ast *train = NULL;
    for (int i = 0; file && !d.n_errors && i < file->n_kids; i++)
        if (file->kids[i]->kind == MPT_AST_TRAIN) train = file->kids[i];
    if (train && train->n_kids == 1 && strcmp(train->kids[0]->name, "optimizer") == 0) {
        mpt_value v;
        if (mpt_eval(&d, train->kids[0]->a, NULL, &v) == 0) {
            mpt_set_optimizer(&d, &v, c);
            mpt_value_free(&v);
        }
    } else if (!d.n_errors) {
        mpt_diag_error(&d, (mpt_loc){.line = 2, .col = 17}, NULL, "not one optimizer");
    }
    mpt_ast_free(file);
    fclose(out);
    int bad = d.n_errors > 0;
    if (bad) snprintf(err, n, "--optimizer %s:\n%s  hint: e.g. --optimizer adam, or "
                      "--optimizer \"adamw(learning_rate=3e-4, weight_decay=0.01)\"", text,
                      diag_text ? diag_text : "");
    free(diag_text);
    free(src);
    return bad ? -1 : 0;
}
