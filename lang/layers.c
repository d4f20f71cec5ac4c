/* lang/layers.c — the layer types of the language: their names, arguments
 * (kinds, defaults, which are required) and how many inputs they take. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lang/model.h"

typedef enum {
    ARG_INT,     /* a positive integer */
    ARG_FLOAT,   /* a number */
    ARG_PAIR,    /* an integer or [h, w] */
    ARG_ACT,     /* an activation name */
    ARG_PADDING, /* same | valid | an integer | [h, w] */
    ARG_BOOL,    /* true | false */
    ARG_DTYPE,   /* a policy or dtype name */
    ARG_SHAPE,   /* a list of positive integers */
    ARG_AXIS,    /* an integer, negative from the end */
    ARG_REF      /* the name of a layer or model input (resolved by expand.c) */
} arg_kind;

typedef struct {
    const char *name;
    arg_kind kind;
    int required;
} arg_spec;

typedef struct {
    const char *name;
    int min_in, max_in;
    arg_spec args[7]; /* positional order; ends at a NULL name */
} layer_spec;

/* Indexed by mpt_layer_kind. Every layer also takes dtype=. */
static const layer_spec specs[MPT_L_COUNT] = {
    [MPT_L_DENSE] = {"dense", 1, 1,
                     {{"units", ARG_INT, 1}, {"activation", ARG_ACT, 0}, {"use_bias", ARG_BOOL, 0}}},
    [MPT_L_CONV2D] = {"conv2d", 1, 1,
                      {{"filters", ARG_INT, 1}, {"kernel", ARG_PAIR, 1}, {"strides", ARG_PAIR, 0},
                       {"padding", ARG_PADDING, 0}, {"activation", ARG_ACT, 0},
                       {"use_bias", ARG_BOOL, 0}}},
    [MPT_L_BATCH_NORM] = {"batch_norm", 1, 1,
                          {{"momentum", ARG_FLOAT, 0}, {"epsilon", ARG_FLOAT, 0}}},
    [MPT_L_ACTIVATION] = {"activation", 1, 1, {{"activation", ARG_ACT, 1}}},
    [MPT_L_MAX_POOL2D] = {"max_pool2d", 1, 1,
                          {{"pool", ARG_PAIR, 0}, {"strides", ARG_PAIR, 0},
                           {"padding", ARG_PADDING, 0}}},
    [MPT_L_AVG_POOL2D] = {"avg_pool2d", 1, 1,
                          {{"pool", ARG_PAIR, 0}, {"strides", ARG_PAIR, 0},
                           {"padding", ARG_PADDING, 0}}},
    [MPT_L_GLOBAL_AVG_POOL2D] = {"global_avg_pool2d", 1, 1, {{NULL, ARG_INT, 0}}},
    [MPT_L_FLATTEN] = {"flatten", 1, 1, {{NULL, ARG_INT, 0}}},
    [MPT_L_RESHAPE] = {"reshape", 1, 1, {{"shape", ARG_SHAPE, 1}}},
    [MPT_L_ADD] = {"add", 2, INT32_MAX, {{NULL, ARG_INT, 0}}},
    [MPT_L_EMBEDDING] = {"embedding", 1, 1,
                         {{"input_dim", ARG_INT, 1}, {"output_dim", ARG_INT, 1}}},
    [MPT_L_DROPOUT] = {"dropout", 1, 1, {{"rate", ARG_FLOAT, 1}}},
    [MPT_L_LAYER_NORM] = {"layer_norm", 1, 1, {{"epsilon", ARG_FLOAT, 0}}},
    [MPT_L_MULTIPLY] = {"multiply", 2, INT32_MAX, {{NULL, ARG_INT, 0}}},
    [MPT_L_CONCATENATE] = {"concatenate", 2, INT32_MAX, {{"axis", ARG_AXIS, 0}}},
    [MPT_L_UP_SAMPLING2D] = {"up_sampling2d", 1, 1, {{"size", ARG_PAIR, 0}}},
    [MPT_L_CONV2D_TRANSPOSE] = {"conv2d_transpose", 1, 1,
                                {{"filters", ARG_INT, 1}, {"kernel", ARG_PAIR, 1},
                                 {"strides", ARG_PAIR, 0}, {"padding", ARG_PADDING, 0},
                                 {"activation", ARG_ACT, 0}, {"use_bias", ARG_BOOL, 0}}},
    [MPT_L_GLOBAL_MAX_POOL2D] = {"global_max_pool2d", 1, 1, {{NULL, ARG_INT, 0}}},
    [MPT_L_GLOBAL_AVG_POOL1D] = {"global_avg_pool1d", 1, 1, {{NULL, ARG_INT, 0}}},
    [MPT_L_GLOBAL_MAX_POOL1D] = {"global_max_pool1d", 1, 1, {{NULL, ARG_INT, 0}}},
    [MPT_L_POSITION_EMBEDDING] = {"position_embedding", 1, 1, {{"max_length", ARG_INT, 1}}},
    [MPT_L_LSTM] = {"lstm", 1, 1,
                    {{"units", ARG_INT, 1}, {"return_sequences", ARG_BOOL, 0},
                     {"activation", ARG_ACT, 0}, {"recurrent_activation", ARG_ACT, 0},
                     {"use_bias", ARG_BOOL, 0}}},
    [MPT_L_GRU] = {"gru", 1, 1,
                   {{"units", ARG_INT, 1}, {"return_sequences", ARG_BOOL, 0},
                    {"reset_after", ARG_BOOL, 0}, {"activation", ARG_ACT, 0},
                    {"recurrent_activation", ARG_ACT, 0}, {"use_bias", ARG_BOOL, 0}}},
    [MPT_L_DEPTHWISE_CONV2D] = {"depthwise_conv2d", 1, 1,
                                {{"kernel", ARG_PAIR, 1}, {"strides", ARG_PAIR, 0},
                                 {"padding", ARG_PADDING, 0}, {"depth_multiplier", ARG_INT, 0},
                                 {"activation", ARG_ACT, 0}, {"use_bias", ARG_BOOL, 0}}},
    [MPT_L_SEPARABLE_CONV2D] = {"separable_conv2d", 1, 1,
                                {{"filters", ARG_INT, 1}, {"kernel", ARG_PAIR, 1},
                                 {"strides", ARG_PAIR, 0}, {"padding", ARG_PADDING, 0},
                                 {"depth_multiplier", ARG_INT, 0}, {"activation", ARG_ACT, 0},
                                 {"use_bias", ARG_BOOL, 0}}},
    [MPT_L_MULTI_HEAD_ATTENTION] = {"multi_head_attention", 1, 3,
                                    {{"num_heads", ARG_INT, 1}, {"key_dim", ARG_INT, 1},
                                     {"value_dim", ARG_INT, 0}, {"dropout", ARG_FLOAT, 0},
                                     {"use_bias", ARG_BOOL, 0}, {"use_causal_mask", ARG_BOOL, 0},
                                     {"attention_mask", ARG_REF, 0}}},
};

static const char *const act_names[MPT_ACT_COUNT] = {
    [MPT_ACT_LINEAR] = "linear", [MPT_ACT_RELU] = "relu",       [MPT_ACT_GELU] = "gelu",
    [MPT_ACT_SIGMOID] = "sigmoid", [MPT_ACT_TANH] = "tanh", [MPT_ACT_SOFTMAX] = "softmax",
};

static const char *const dtype_names[] = {"float32", "mixed_float16", "mixed_bfloat16",
                                          "float16", "bfloat16"};

const char *mpt_layer_kind_name(mpt_layer_kind k) {
    return k < MPT_L_COUNT ? specs[k].name : "?";
}

const char *mpt_activation_name(mpt_activation a) {
    return a < MPT_ACT_COUNT ? act_names[a] : "?";
}

int mpt_layer_kind_parse(const char *s, mpt_layer_kind *out) {
    for (int k = 0; k < MPT_L_COUNT; k++) {
        if (strcmp(specs[k].name, s) == 0) {
            *out = (mpt_layer_kind)k;
            return 0;
        }
    }
    return -1;
}

const char *mpt_layer_kind_closest(const char *s) {
    const char *names[MPT_L_COUNT];
    for (int k = 0; k < MPT_L_COUNT; k++) names[k] = specs[k].name;
    return mpt_diag_closest(s, names, MPT_L_COUNT);
}

void mpt_layer_arity(mpt_layer_kind k, int *min_in, int *max_in) {
    *min_in = specs[k].min_in;
    *max_in = specs[k].max_in;
}

/* Keras' defaults. */
static void set_defaults(mpt_flat_layer *L) {
    L->act = MPT_ACT_LINEAR;
    L->use_bias = 1;
    L->strides[0] = L->strides[1] = 1;
    L->pool[0] = L->pool[1] = 2;
    L->padding = MPT_PAD_VALID;
    L->momentum = 0.99;
    L->epsilon = 1e-3;
    L->size[0] = L->size[1] = 2;
    L->depth_multiplier = 1;
    L->axis = -1;
    if (L->kind == MPT_L_LSTM || L->kind == MPT_L_GRU) { /* Keras' recurrent defaults */
        L->act = MPT_ACT_TANH;
        L->rec_act = MPT_ACT_SIGMOID;
        L->reset_after = 1;
    }
}

/* Sizes must also fit the IR builder's int arguments. */
static int positive_int(mpt_diag *d, const mpt_value *v, const char *arg, int64_t *out) {
    if (v->kind != MPT_V_INT || v->i <= 0 || v->i > INT32_MAX) {
        if (v->kind == MPT_V_INT)
            mpt_diag_error(d, v->loc, NULL, "%s must be between 1 and %d, got %lld", arg,
                           INT32_MAX, v->i);
        else
            mpt_diag_error(d, v->loc, NULL, "%s must be a positive integer, got %s", arg,
                           mpt_value_kind_name(v->kind));
        return -1;
    }
    *out = v->i;
    return 0;
}

static int pair(mpt_diag *d, const mpt_value *v, const char *arg, int64_t out[2], int allow_zero) {
    if (v->kind == MPT_V_LIST && v->n == 2) {
        for (int k = 0; k < 2; k++) {
            const mpt_value *x = &v->items[k];
            if (allow_zero && x->kind == MPT_V_INT && x->i == 0) out[k] = 0;
            else if (positive_int(d, x, arg, &out[k]) != 0) return -1;
        }
        return 0;
    }
    if (v->kind == MPT_V_INT && !(allow_zero && v->i == 0)) {
        if (positive_int(d, v, arg, &out[0]) != 0) return -1;
        out[1] = out[0];
        return 0;
    }
    if (v->kind == MPT_V_INT) {
        out[0] = out[1] = 0;
        return 0;
    }
    mpt_diag_error(d, v->loc, "write one integer for both dims, or [h, w]",
                   "%s must be an integer or a list [h, w], got %s", arg,
                   mpt_value_kind_name(v->kind));
    return -1;
}

static int symbol_in(mpt_diag *d, const mpt_value *v, const char *arg, const char *const *names,
                     int n, int *out) {
    if (v->kind == MPT_V_SYM || v->kind == MPT_V_STR) {
        for (int k = 0; k < n; k++) {
            if (names[k] && strcmp(names[k], v->s) == 0) {
                *out = k;
                return 0;
            }
        }
    }
    char list[256] = "", hint[300];
    for (int k = 0; k < n; k++) {
        if (!names[k]) continue;
        if (list[0]) strncat(list, ", ", sizeof list - strlen(list) - 1);
        strncat(list, names[k], sizeof list - strlen(list) - 1);
    }
    const char *close = v->s ? mpt_diag_closest(v->s, names, n) : NULL;
    if (close) snprintf(hint, sizeof hint, "did you mean '%s'?", close);
    else snprintf(hint, sizeof hint, "one of: %s", list);
    if (v->s)
        mpt_diag_error(d, v->loc, hint, "unknown %s '%s'", arg, v->s);
    else
        mpt_diag_error(d, v->loc, hint, "%s must be a name, got %s", arg,
                       mpt_value_kind_name(v->kind));
    return -1;
}

static int number(mpt_diag *d, const mpt_value *v, const char *arg, double lo, double hi,
                  int hi_open, double *out) {
    if (!mpt_value_is_number(v)) {
        mpt_diag_error(d, v->loc, NULL, "%s must be a number, got %s", arg,
                       mpt_value_kind_name(v->kind));
        return -1;
    }
    double x = mpt_value_number(v);
    if (x < lo || x > hi || (hi_open && x == hi)) {
        mpt_diag_error(d, v->loc, NULL, "%s must be in [%g, %g%c, got %g", arg, lo, hi,
                       hi_open ? ')' : ']', x);
        return -1;
    }
    *out = x;
    return 0;
}

static int set_arg(mpt_diag *d, mpt_flat_layer *L, const arg_spec *a, const mpt_value *v) {
    int k = 0;
    switch (a->kind) {
    case ARG_INT: {
        int64_t x;
        if (positive_int(d, v, a->name, &x) != 0) return -1;
        if (strcmp(a->name, "units") == 0) L->units = x;
        else if (strcmp(a->name, "filters") == 0) L->filters = x;
        else if (strcmp(a->name, "input_dim") == 0) L->input_dim = x;
        else if (strcmp(a->name, "max_length") == 0) L->max_length = x;
        else if (strcmp(a->name, "depth_multiplier") == 0) L->depth_multiplier = x;
        else if (strcmp(a->name, "num_heads") == 0) L->num_heads = x;
        else if (strcmp(a->name, "key_dim") == 0) L->key_dim = x;
        else if (strcmp(a->name, "value_dim") == 0) L->value_dim = x;
        else L->output_dim = x;
        return 0;
    }
    case ARG_FLOAT:
        if (strcmp(a->name, "rate") == 0 || strcmp(a->name, "dropout") == 0)
            return number(d, v, a->name, 0, 1, 1, &L->rate);
        if (strcmp(a->name, "momentum") == 0) return number(d, v, a->name, 0, 1, 0, &L->momentum);
        if (number(d, v, a->name, 0, 1, 0, &L->epsilon) != 0) return -1;
        if (L->epsilon <= 0) {
            mpt_diag_error(d, v->loc, NULL, "epsilon must be positive");
            return -1;
        }
        return 0;
    case ARG_PAIR:
        if (strcmp(a->name, "kernel") == 0) return pair(d, v, a->name, L->kernel, 0);
        if (strcmp(a->name, "pool") == 0) return pair(d, v, a->name, L->pool, 0);
        if (strcmp(a->name, "size") == 0) return pair(d, v, a->name, L->size, 0);
        return pair(d, v, a->name, L->strides, 0);
    case ARG_ACT:
        if (symbol_in(d, v, "activation", act_names, MPT_ACT_COUNT, &k) != 0) return -1;
        *(strcmp(a->name, "recurrent_activation") == 0 ? &L->rec_act : &L->act) = (mpt_activation)k;
        return 0;
    case ARG_AXIS:
        if (v->kind != MPT_V_INT || v->i < -MPT_MAX_DIMS || v->i >= MPT_MAX_DIMS) {
            mpt_diag_error(d, v->loc, "-1 is the last axis, 1 the first after the batch",
                           "axis must be an integer from %d to %d", -MPT_MAX_DIMS,
                           MPT_MAX_DIMS - 1);
            return -1;
        }
        L->axis = (int)v->i;
        return 0;
    case ARG_PADDING: {
        static const char *const pads[] = {"valid", "same"};
        if (v->kind == MPT_V_INT || v->kind == MPT_V_LIST) {
            L->padding = MPT_PAD_EXPLICIT;
            return pair(d, v, a->name, L->pad, 1);
        }
        if (symbol_in(d, v, "padding", pads, 2, &k) != 0) return -1;
        L->padding = k ? MPT_PAD_SAME : MPT_PAD_VALID;
        return 0;
    }
    case ARG_BOOL: {
        static const char *const bools[] = {"false", "true"};
        if (symbol_in(d, v, "boolean", bools, 2, &k) != 0) return -1;
        *(strcmp(a->name, "return_sequences") == 0 ? &L->return_sequences
          : strcmp(a->name, "reset_after") == 0    ? &L->reset_after
          : strcmp(a->name, "use_causal_mask") == 0 ? &L->use_causal_mask
                                                   : &L->use_bias) = k;
        return 0;
    }
    case ARG_DTYPE:
        if (symbol_in(d, v, "dtype", dtype_names, 5, &k) != 0) return -1;
        if (k >= 3) { /* Keras' float16/bfloat16 policies keep 16-bit variables */
            char hint[160];
            snprintf(hint, sizeof hint, "dtype=mixed_%s computes in %s and keeps float32 "
                     "variables (or dtype=float32)", dtype_names[k], dtype_names[k]);
            mpt_diag_error(d, v->loc, hint,
                           "dtype=%s means %s variables, as in Keras, which mptc does not train",
                           dtype_names[k], dtype_names[k]);
            return -1;
        }
        free(L->dtype);
        L->dtype = strdup(dtype_names[k]);
        return 0;
    case ARG_REF:
        if (v->kind != MPT_V_SYM) {
            mpt_diag_error(d, v->loc, "e.g. attention_mask=mask, naming an input or a layer",
                           "%s must name a layer or an input, got %s", a->name,
                           mpt_value_kind_name(v->kind));
            return -1;
        }
        free(L->mask_name);
        L->mask_name = strdup(v->s);
        L->mask_loc = v->loc;
        return 0;
    case ARG_SHAPE:
        if (v->kind != MPT_V_LIST || v->n < 1 || v->n >= MPT_MAX_DIMS) {
            mpt_diag_error(d, v->loc, NULL, "shape must be a list of 1 to %d sizes",
                           MPT_MAX_DIMS - 1);
            return -1;
        }
        L->target.rank = v->n;
        for (int i = 0; i < v->n; i++)
            if (positive_int(d, &v->items[i], "a size", &L->target.dim[i]) != 0) return -1;
        return 0;
    }
    return -1;
}

int mpt_layer_set_args(mpt_diag *d, const mpt_ast *stmt, const mpt_env *env, mpt_flat_layer *L) {
    static const arg_spec dtype_spec = {"dtype", ARG_DTYPE, 0};
    const layer_spec *s = &specs[L->kind];
    int n_spec = 0;
    while (n_spec < 7 && s->args[n_spec].name) n_spec++;
    int seen[8] = {0};
    int errors = 0;
    set_defaults(L);
    for (int i = 0; i < stmt->n_args; i++) {
        const mpt_ast *arg = stmt->args[i];
        int slot = -1;
        if (!arg->name) {
            if (i >= n_spec) {
                mpt_diag_error(d, arg->loc, "name the argument, e.g. dtype=float32",
                               "%s takes %d positional argument%s, this is number %d", s->name,
                               n_spec, n_spec == 1 ? "" : "s", i + 1);
                errors++;
                continue;
            }
            slot = i;
        } else {
            for (int k = 0; k < n_spec; k++)
                if (strcmp(s->args[k].name, arg->name) == 0) slot = k;
            if (strcmp(arg->name, "dtype") == 0) slot = n_spec;
            if (slot < 0) {
                const char *names[8];
                for (int k = 0; k < n_spec; k++) names[k] = s->args[k].name;
                names[n_spec] = "dtype";
                char hint[300];
                const char *h = mpt_diag_did_you_mean(hint, sizeof hint, arg->name, names,
                                                      n_spec + 1);
                if (!h) {
                    strcpy(hint, "it takes ");
                    for (int k = 0; k <= n_spec; k++) {
                        strncat(hint, names[k], sizeof hint - strlen(hint) - 3);
                        if (k < n_spec) strcat(hint, ", ");
                    }
                    h = hint;
                }
                mpt_diag_error(d, arg->name_loc, h, "%s has no argument '%s'", s->name,
                               arg->name);
                errors++;
                continue;
            }
        }
        const arg_spec *a = slot == n_spec ? &dtype_spec : &s->args[slot];
        if (seen[slot]) {
            mpt_diag_error(d, arg->loc, NULL, "argument '%s' given twice", a->name);
            errors++;
            continue;
        }
        seen[slot] = 1;
        mpt_value v;
        if (mpt_eval(d, arg->a, env, &v) != 0) {
            errors++;
            continue;
        }
        if (set_arg(d, L, a, &v) != 0) errors++;
        mpt_value_free(&v);
    }
    for (int k = 0; k < n_spec; k++) {
        if (s->args[k].required && !seen[k]) {
            mpt_diag_error(d, stmt->loc, NULL, "%s needs the argument '%s'", s->name,
                           s->args[k].name);
            errors++;
        }
    }
    /* Keras pools stride by their window unless told otherwise. */
    if ((L->kind == MPT_L_MAX_POOL2D || L->kind == MPT_L_AVG_POOL2D) && !seen[1]) {
        L->strides[0] = L->pool[0];
        L->strides[1] = L->pool[1];
    }
    return errors ? -1 : 0;
}
