/* lang/train_block.c — the train block: data, loss, optimizer, metrics, sizes,
 * precision policy and loss scaling, with Keras' defaults where silent. */
#include <stdlib.h>
#include <string.h>

#include "lang/model.h"

static const char *const loss_names[MPT_LOSS_COUNT] = {
    [MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY] = "sparse_categorical_crossentropy",
    [MPT_LOSS_CATEGORICAL_CROSSENTROPY] = "categorical_crossentropy",
    [MPT_LOSS_MEAN_SQUARED_ERROR] = "mean_squared_error",
};

static const char *const policy_names[] = {"float32", "mixed_float16", "mixed_bfloat16"};
static const char *const data_names[] = {"fashion_mnist", "synthetic", "images", "idx", "text"};

static const char *const setting_names[] = {
    "data",     "validation_data", "validation_split", "loss",        "optimizer",
    "metrics",  "batch_size",      "epochs",           "policy",      "loss_scale",
    "seed",     "compute_ops",     "float32_ops",      "follow_ops",  "callbacks",
    "augment"};
enum { N_SETTINGS = sizeof setting_names / sizeof *setting_names };


void mpt_train_config_defaults(mpt_train_config *c) {
    *c = (mpt_train_config){0};
    c->data = strdup("fashion_mnist");
    c->loss = MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY;
    mpt_optimizer_defaults(&c->optimizer, MPT_OPT_RMSPROP);
    c->batch_size = 32;
    c->epochs = 1;
    c->policy = strdup("float32");
    c->loss_scale = (mpt_loss_scale_config){.mode = MPT_LS_DEFAULT, .initial = 32768,
                                            .period = 2000, .factor = 2, .min_scale = 1,
                                            .max_scale = 16777216, .max_skipped = 50};
}

static void free_list(char **v, int n) {
    for (int k = 0; k < n; k++) free(v[k]);
    free(v);
}

void mpt_train_config_free(mpt_train_config *c) {
    free(c->data);
    free(c->validation_data);
    free(c->policy);
    free_list(c->compute_ops, c->n_compute_ops);
    free_list(c->float32_ops, c->n_float32_ops);
    free_list(c->follow_ops, c->n_follow_ops);
    free_list(c->wd_exclude, c->n_wd_exclude);
    for (int k = 0; k < c->n_callbacks; k++) {
        free(c->callbacks[k].monitor);
        free(c->callbacks[k].filepath);
    }
    free(c->augment);
    *c = (mpt_train_config){0};
}

/* The index of v's name in names, or -1 after an error with a hint. */
int mpt_set_pick(mpt_diag *d, const mpt_value *v, const char *what, const char *const *names,
                 int n) {
    if (v->kind == MPT_V_SYM || v->kind == MPT_V_STR || v->kind == MPT_V_CALL) {
        for (int k = 0; k < n; k++)
            if (strcmp(v->s, names[k]) == 0) return k;
        char hint[400], list[300] = "";
        for (int k = 0; k < n; k++) {
            if (k) strncat(list, ", ", sizeof list - strlen(list) - 1);
            strncat(list, names[k], sizeof list - strlen(list) - 1);
        }
        if (!mpt_diag_did_you_mean(hint, sizeof hint, v->s, names, n))
            snprintf(hint, sizeof hint, "one of: %s", list);
        mpt_diag_error(d, v->loc, hint, "unknown %s '%s'", what, v->s);
        return -1;
    }
    mpt_diag_error(d, v->loc, NULL, "%s must be a name, got %s", what,
                   mpt_value_kind_name(v->kind));
    return -1;
}

int mpt_set_number(mpt_diag *d, const mpt_value *v, const char *what, double lo, double hi,
                   double *out) {
    if (!mpt_value_is_number(v) || mpt_value_number(v) < lo || mpt_value_number(v) > hi) {
        mpt_diag_error(d, v->loc, NULL, "%s must be a number in [%g, %g]", what, lo, hi);
        return -1;
    }
    *out = mpt_value_number(v);
    return 0;
}

int mpt_set_count(mpt_diag *d, const mpt_value *v, const char *what, long lo, long *out) {
    if (v->kind != MPT_V_INT || v->i < lo || v->i > 2147483647) {
        mpt_diag_error(d, v->loc, NULL, "%s must be an integer from %ld to 2147483647", what, lo);
        return -1;
    }
    *out = (long)v->i;
    return 0;
}

/* The source text of a data spec, whitespace runs folded to one space. */
static char *source_text(const mpt_diag *d, mpt_loc loc) {
    size_t n = (size_t)(loc.end - loc.begin);
    char *s = malloc(n + 1);
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = d->src[loc.begin + i];
        int space = ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
        if (space && j > 0 && s[j - 1] == ' ') continue;
        s[j++] = space ? ' ' : ch;
    }
    s[j] = '\0';
    return s;
}

static void set_data(mpt_diag *d, const mpt_ast *expr, const mpt_value *v, char **out) {
    if (v->kind == MPT_V_STR || mpt_set_pick(d, v, "data set", data_names, 5) >= 0) {
        free(*out);
        *out = source_text(d, expr->loc);
    }
}

static void set_names(mpt_diag *d, const mpt_value *v, const char *what, char ***out, int *n) {
    if (v->kind != MPT_V_LIST) {
        mpt_diag_error(d, v->loc, "e.g. [matmul, conv2d]", "%s must be a list of op names", what);
        return;
    }
    free_list(*out, *n);
    *out = calloc((size_t)v->n + 1, sizeof **out);
    *n = 0;
    for (int k = 0; k < v->n; k++) {
        const mpt_value *x = &v->items[k];
        if (x->kind != MPT_V_SYM && x->kind != MPT_V_STR)
            mpt_diag_error(d, x->loc, NULL, "%s must list names", what);
        else
            (*out)[(*n)++] = strdup(x->s);
    }
}

static void set_loss_scale(mpt_diag *d, const mpt_value *v, mpt_loss_scale_config *ls) {
    if (mpt_value_is_number(v)) {
        if (mpt_set_number(d, v, "a fixed loss scale", 1e-30, 1e30, &ls->initial) == 0)
            ls->mode = MPT_LS_FIXED;
        return;
    }
    static const char *const modes[] = {"dynamic", "none"};
    int k = mpt_set_pick(d, v, "loss scale", modes, 2);
    if (k < 0) return;
    ls->mode = k == 0 ? MPT_LS_DYNAMIC : MPT_LS_NONE;
    if (v->kind != MPT_V_CALL) return;
    static const char *const args[] = {"initial", "period", "factor", "min_scale", "max_scale",
                                       "max_skipped"};
    for (int i = 0; i < v->n; i++) {
        const char *name = v->keys[i] ? v->keys[i] : (i < 6 ? args[i] : "?");
        const mpt_value *x = &v->items[i];
        long n;
        if (strcmp(name, "initial") == 0) mpt_set_number(d, x, name, 1e-30, 1e30, &ls->initial);
        else if (strcmp(name, "factor") == 0) mpt_set_number(d, x, name, 1, 1e6, &ls->factor);
        else if (strcmp(name, "min_scale") == 0) mpt_set_number(d, x, name, 1e-30, 1e30, &ls->min_scale);
        else if (strcmp(name, "max_scale") == 0) mpt_set_number(d, x, name, 1e-30, 1e30, &ls->max_scale);
        else if (strcmp(name, "period") == 0) {
            if (mpt_set_count(d, x, name, 1, &n) == 0) ls->period = n;
        } else if (strcmp(name, "max_skipped") == 0) {
            if (mpt_set_count(d, x, name, 1, &n) == 0) ls->max_skipped = (int)n;
        } else {
            char hint[200];
            mpt_diag_error(d, x->loc, mpt_diag_did_you_mean(hint, sizeof hint, name, args, 6),
                           "dynamic loss scaling has no argument '%s'", name);
        }
    }
}

/* Keras' names, and their long forms */
static void set_metrics(mpt_diag *d, const mpt_value *v, mpt_train_config *c) {
    static const char *const metrics[] = {
        "accuracy", "acc", "mae", "mean_absolute_error", "mse", "mean_squared_error",
        "top_k_accuracy", "sparse_top_k_categorical_accuracy", "top_k_categorical_accuracy"};
    const mpt_value *items = v->kind == MPT_V_LIST ? v->items : v;
    int n = v->kind == MPT_V_LIST ? v->n : 1;
    memset(&c->metrics, 0, sizeof c->metrics);
    for (int k = 0; k < n; k++) {
        const mpt_value *x = &items[k];
        int m = mpt_set_pick(d, x, "metric", metrics, 9);
        if (m < 0) continue;
        if (m < 2) c->metrics.accuracy = 1;
        else if (m < 4) c->metrics.mae = 1;
        else if (m < 6) c->metrics.mse = 1;
        else {
            long kk = 5; /* Keras' default k */
            for (int i = 0; x->kind == MPT_V_CALL && i < x->n; i++) {
                const char *name = x->keys[i] ? x->keys[i] : "k";
                if (strcmp(name, "k") != 0) {
                    mpt_diag_error(d, x->items[i].loc, "top_k_accuracy(k=5)",
                                   "top_k_accuracy has no argument '%s'", name);
                    continue;
                }
                double v_k;
                if (mpt_set_number(d, &x->items[i], "k", 1, 1e6, &v_k) == 0) kk = (long)v_k;
            }
            c->metrics.top_k = (int)kk;
        }
    }
}

static void apply(mpt_diag *d, int which, const mpt_ast *expr, const mpt_value *v,
                  mpt_train_config *c) {
    long n;
    int k;
    switch (which) {
    case 0: set_data(d, expr, v, &c->data); break;
    case 1: set_data(d, expr, v, &c->validation_data); break;
    case 2: mpt_set_number(d, v, "validation_split", 0, 0.99, &c->validation_split); break;
    case 3:
        k = mpt_set_pick(d, v, "loss", loss_names, MPT_LOSS_COUNT);
        if (k >= 0) c->loss = (mpt_loss_kind)k;
        break;
    case 4: mpt_set_optimizer(d, v, c); break;
    case 5: set_metrics(d, v, c); break;
    case 6: if (mpt_set_count(d, v, "batch_size", 1, &n) == 0) c->batch_size = n; break;
    case 7: if (mpt_set_count(d, v, "epochs", 1, &n) == 0) c->epochs = n; break;
    case 8:
        k = mpt_set_pick(d, v, "policy", policy_names, 3);
        if (k >= 0) {
            free(c->policy);
            c->policy = strdup(policy_names[k]);
        }
        break;
    case 9: set_loss_scale(d, v, &c->loss_scale); break;
    case 10: if (mpt_set_count(d, v, "seed", 0, &n) == 0) c->seed = n; break;
    case 11: set_names(d, v, "compute_ops", &c->compute_ops, &c->n_compute_ops); break;
    case 12: set_names(d, v, "float32_ops", &c->float32_ops, &c->n_float32_ops); break;
    case 13: set_names(d, v, "follow_ops", &c->follow_ops, &c->n_follow_ops); break;
    case 14: mpt_set_callbacks(d, v, c); break;
    case 15:
        if (v->kind != MPT_V_LIST && v->kind != MPT_V_CALL) {
            mpt_diag_error(d, v->loc, "e.g. augment = [random_flip(\"horizontal\"), "
                           "random_translation(0.1, 0.1)]", "augment must be a list of "
                           "augmentations");
            break;
        }
        free(c->augment);
        c->augment = source_text(d, expr->loc);
        break;
    default: break;
    }
}

void mpt_train_from_ast(mpt_diag *d, const mpt_ast *train, mpt_train_config *c) {
    mpt_loc seen[N_SETTINGS] = {{0}};
    for (int i = 0; i < train->n_kids; i++) {
        const mpt_ast *s = train->kids[i];
        int which = -1;
        for (int k = 0; k < N_SETTINGS; k++)
            if (strcmp(setting_names[k], s->name) == 0) which = k;
        if (which < 0) {
            char hint[200];
            mpt_diag_error(d, s->name_loc,
                           mpt_diag_did_you_mean(hint, sizeof hint, s->name, setting_names,
                                                 N_SETTINGS),
                           "unknown train setting '%s'", s->name);
            continue;
        }
        if (seen[which].line) {
            mpt_diag_error(d, s->name_loc, NULL, "'%s' is already set on line %d", s->name,
                           seen[which].line);
            continue;
        }
        seen[which] = s->name_loc;
        mpt_value v;
        if (mpt_eval(d, s->a, NULL, &v) != 0) continue;
        apply(d, which, s->a, &v, c);
        mpt_value_free(&v);
    }
}
