/* runtime/data/augment_parse.c — parsing the augment list of a train block
 * (data.h, augmentation) into the layers augment.c applies.
 *
 *   augs  = [ "[" ] [ call ( "," call )* [ "," ] ] [ "]" ]
 *   call  = ident [ "(" [ arg ( "," arg )* ] ")" ]
 *   arg   = [ ident "=" ] value
 *   value = string | number | ident | list
 *   list  = ( "[" | "(" ) [ number ( "," number )* ] ( "]" | ")" )
 *
 * Positional arguments fill a layer's arguments in Keras' order; values
 * are checked as Keras checks them, and an error names the layer, the
 * argument and what to write instead.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "runtime/data/augment_impl.h"

#define MAX_ARGS 8
#define MAX_ITEMS 4

/* ---- values ---------------------------------------------------------------- */

typedef enum { V_NUM, V_STR, V_IDENT, V_LIST } value_kind;

typedef struct {
    value_kind kind;
    int n_items;
    double items[MAX_ITEMS]; /* V_NUM: items[0] */
    char str[64];            /* V_STR, V_IDENT */
} value;

typedef struct {
    const char *text, *p;
    char *err;
    size_t n;
} lexer;

/* Shows the line of the text that holds `at`, with a caret under it. */
static int syntax_error(lexer *lx, const char *at, const char *what) {
    const char *line = at;
    while (line > lx->text && line[-1] != '\n')
        line--;
    int len = (int)strcspn(line, "\n"), col = (int)(at - line);
    return mpt_data_fail(lx->err, lx->n, "augment: %s at column %d\n  %.*s\n  %*s^", what,
                         col + 1, len, line, col, "");
}

static void skip_space(lexer *lx) {
    while (isspace((unsigned char)*lx->p))
        lx->p++;
}

static int is_ident_start(char c) { return isalpha((unsigned char)c) || c == '_'; }

static int lex_ident(lexer *lx, char *out, size_t cap) {
    const char *s = lx->p;
    while (isalnum((unsigned char)*lx->p) || *lx->p == '_')
        lx->p++;
    if ((size_t)(lx->p - s) >= cap)
        return syntax_error(lx, s, "name too long");
    memcpy(out, s, (size_t)(lx->p - s));
    out[lx->p - s] = 0;
    return 0;
}

/* string = '"' chars '"' | "'" chars "'" (Python's two quotes) */
static int lex_string(lexer *lx, char *out, size_t cap) {
    const char *start = lx->p;
    char q = *lx->p++;
    size_t len = 0;
    while (*lx->p && *lx->p != q) {
        if (len + 1 >= cap)
            return syntax_error(lx, start, "string too long");
        out[len++] = *lx->p++;
    }
    if (*lx->p != q)
        return syntax_error(lx, start, "unterminated string");
    lx->p++;
    out[len] = 0;
    return 0;
}

static int lex_number(lexer *lx, double *out) {
    char *end;
    *out = strtod(lx->p, &end);
    if (end == lx->p || !isfinite(*out))
        return syntax_error(lx, lx->p, "expected a number");
    lx->p = end;
    return 0;
}

/* list = ("[" | "(") [ number ("," number)* ] ("]" | ")"); a pair is what
 * the arguments take, but the arity is theirs to check, so that the
 * message names the argument. */
static int lex_list(lexer *lx, value *v) {
    char close = *lx->p++ == '[' ? ']' : ')';
    v->kind = V_LIST;
    for (;;) {
        skip_space(lx);
        if (*lx->p == close && v->n_items == 0)
            break;
        if (v->n_items == MAX_ITEMS)
            return syntax_error(lx, lx->p, "too many numbers (a pair is [lo, hi])");
        if (lex_number(lx, &v->items[v->n_items++]))
            return -1;
        skip_space(lx);
        if (*lx->p == close)
            break;
        if (*lx->p != ',')
            return syntax_error(lx, lx->p, close == ']' ? "expected ',' or ']'"
                                                        : "expected ',' or ')'");
        lx->p++;
    }
    lx->p++;
    return 0;
}

/* value = string | number | ident | list */
static int parse_value(lexer *lx, value *v) {
    skip_space(lx);
    memset(v, 0, sizeof *v);
    char c = *lx->p;
    if (c == '"' || c == '\'') {
        v->kind = V_STR;
        return lex_string(lx, v->str, sizeof v->str);
    }
    if (is_ident_start(c)) {
        v->kind = V_IDENT;
        return lex_ident(lx, v->str, sizeof v->str);
    }
    if (c == '[' || c == '(')
        return lex_list(lx, v);
    v->kind = V_NUM;
    v->n_items = 1;
    return lex_number(lx, &v->items[0]);
}

/* Writes v as it was written, for messages. */
static const char *value_str(const value *v, char *buf, size_t n) {
    switch (v->kind) {
    case V_NUM: snprintf(buf, n, "%g", v->items[0]); return buf;
    case V_STR: snprintf(buf, n, "'%s'", v->str); return buf;
    case V_IDENT: snprintf(buf, n, "%s", v->str); return buf;
    case V_LIST: {
        int len = snprintf(buf, n, "[");
        for (int i = 0; i < v->n_items && (size_t)len < n; i++)
            len += snprintf(buf + len, n - (size_t)len, "%s%g", i ? ", " : "", v->items[i]);
        if ((size_t)len < n)
            snprintf(buf + len, n - (size_t)len, "]");
        return buf;
    }
    }
    return "?";
}

/* ---- arguments of each layer ---------------------------------------------- */

typedef struct {
    const char *aug, *key; /* for messages */
    const value *v;
    char *err;
    size_t n;
} arg_ctx;

typedef int (*arg_fn)(aug_op *op, const arg_ctx *a);

typedef struct {
    const char *key;
    arg_fn apply;
} arg_spec;

static int bad_arg(const arg_ctx *a, const char *want, const char *hint) {
    char buf[96];
    return mpt_data_fail(a->err, a->n, "%s: %s must be %s, not %s\n  hint: %s", a->aug, a->key,
                         want, value_str(a->v, buf, sizeof buf), hint);
}

/* A name from a fixed list, given as a string or bare; returns its index. */
static int get_choice(const arg_ctx *a, const char *const *names, int count,
                      const char *hint, int *out) {
    if (a->v->kind == V_STR || a->v->kind == V_IDENT)
        for (int i = 0; i < count; i++)
            if (!strcmp(a->v->str, names[i])) {
                *out = i;
                return 0;
            }
    char buf[96];
    return mpt_data_fail(a->err, a->n, "%s: unknown %s %s\n  hint: %s", a->aug, a->key,
                         value_str(a->v, buf, sizeof buf), hint);
}

/* A number in [-1, 1] gives [-|f|, |f|]; a pair in [-1, 1] is sorted, as
 * Keras' _set_factor does. */
static int get_signed_factor(const arg_ctx *a, const char *hint, double *lo, double *hi) {
    const value *v = a->v;
    const char *want = "a number in [-1, 1] or a pair [lo, hi] of them";
    if (!(v->kind == V_NUM || (v->kind == V_LIST && v->n_items == 2)))
        return bad_arg(a, want, hint);
    for (int i = 0; i < v->n_items; i++)
        if (v->items[i] < -1 || v->items[i] > 1)
            return bad_arg(a, want, hint);
    if (v->kind == V_NUM) {
        *hi = fabs(v->items[0]);
        *lo = -*hi;
    } else {
        *lo = fmin(v->items[0], v->items[1]);
        *hi = fmax(v->items[0], v->items[1]);
    }
    return 0;
}

static int arg_mode(aug_op *op, const arg_ctx *a) {
    static const char *const names[] = {"horizontal", "vertical", "horizontal_and_vertical"};
    int i = 0;
    if (get_choice(a, names, 3, "horizontal, vertical or horizontal_and_vertical", &i))
        return -1;
    op->flip_h = i != 1;
    op->flip_v = i != 0;
    return 0;
}

static int arg_height_factor(aug_op *op, const arg_ctx *a) {
    return get_signed_factor(a, "0.1 shifts up or down by up to 10% of the height", &op->lo[0],
                             &op->hi[0]);
}

static int arg_width_factor(aug_op *op, const arg_ctx *a) {
    return get_signed_factor(a, "0.1 shifts left or right by up to 10% of the width",
                             &op->lo[1], &op->hi[1]);
}

static int arg_rotation_factor(aug_op *op, const arg_ctx *a) {
    return get_signed_factor(a, "a fraction of a full turn: 0.05 rotates by up to 18 degrees "
                             "either way", &op->lo[0], &op->hi[0]);
}

/* random_contrast: f gives [1-f, 1+f], a pair [lo, hi] gives [1-lo, 1+hi],
 * each in [0, 1] so the factor stays >= 0. That is Keras' documented
 * meaning; Keras 3.x's code draws a single f from [1, 1+f]. */
static int arg_contrast_factor(aug_op *op, const arg_ctx *a) {
    const value *v = a->v;
    const char *hint = "0.2 scales each image's contrast by a factor in [0.8, 1.2]";
    const char *want = "a number in [0, 1] or a pair [lo, hi] of them";
    if (!(v->kind == V_NUM || (v->kind == V_LIST && v->n_items == 2)))
        return bad_arg(a, want, hint);
    for (int i = 0; i < v->n_items; i++)
        if (v->items[i] < 0 || v->items[i] > 1)
            return bad_arg(a, want, hint);
    op->lo[0] = 1.0 - v->items[0];
    op->hi[0] = 1.0 + v->items[v->n_items - 1];
    return 0;
}

static int arg_fill_mode(aug_op *op, const arg_ctx *a) {
    static const char *const names[] = {"reflect", "wrap", "constant", "nearest"};
    int i = 0;
    if (get_choice(a, names, 4, "reflect, wrap, constant or nearest", &i))
        return -1;
    op->fill = (fill_mode)i;
    return 0;
}

static int arg_interpolation(aug_op *op, const arg_ctx *a) {
    static const char *const names[] = {"bilinear", "nearest"};
    int i = 0;
    if (get_choice(a, names, 2, "bilinear or nearest", &i))
        return -1;
    op->nearest = i;
    return 0;
}

static int arg_fill_value(aug_op *op, const arg_ctx *a) {
    if (a->v->kind != V_NUM)
        return bad_arg(a, "a number", "the value of pixels outside the image with "
                       "fill_mode=\"constant\", e.g. 0.0");
    op->fill_value = (float)a->v->items[0];
    return 0;
}

static int arg_value_range(aug_op *op, const arg_ctx *a) {
    const value *v = a->v;
    if (v->kind != V_LIST || v->n_items != 2 || !(v->items[0] < v->items[1]))
        return bad_arg(a, "a pair [low, high] with low < high",
                       "pixels here are in [0, 1], the default");
    op->range[0] = (float)v->items[0];
    op->range[1] = (float)v->items[1];
    return 0;
}

static int arg_seed(aug_op *op, const arg_ctx *a) {
    const value *v = a->v;
    if (v->kind == V_IDENT && !strcmp(v->str, "None")) {
        op->seed = 0;
        return 0;
    }
    if (v->kind != V_NUM || v->items[0] != floor(v->items[0]) || v->items[0] < 0 ||
        v->items[0] > 9007199254740992.0)
        return bad_arg(a, "a non-negative integer or None",
                       "the draws already follow the training seed; seed= varies them");
    op->seed = (uint64_t)v->items[0] + 1;
    return 0;
}

/* Each layer's arguments in Keras' positional order. */
static const arg_spec flip_args[] = {{"mode", arg_mode}, {"seed", arg_seed}};
static const arg_spec translation_args[] = {
    {"height_factor", arg_height_factor}, {"width_factor", arg_width_factor},
    {"fill_mode", arg_fill_mode},         {"interpolation", arg_interpolation},
    {"seed", arg_seed},                   {"fill_value", arg_fill_value}};
static const arg_spec rotation_args[] = {
    {"factor", arg_rotation_factor}, {"fill_mode", arg_fill_mode},
    {"interpolation", arg_interpolation}, {"seed", arg_seed},
    {"fill_value", arg_fill_value}};
static const arg_spec contrast_args[] = {
    {"factor", arg_contrast_factor}, {"value_range", arg_value_range}, {"seed", arg_seed}};

typedef struct {
    const char *name;
    aug_kind kind;
    const arg_spec *args;
    int n_args, required; /* the first `required` arguments have no default */
    const char *example;
} layer_spec;

#define ARGS(a) a, (int)(sizeof a / sizeof a[0])
static const layer_spec layers[] = {
    {"random_flip", AUG_FLIP, ARGS(flip_args), 0, "random_flip(\"horizontal\")"},
    {"random_translation", AUG_TRANSLATION, ARGS(translation_args), 2,
     "random_translation(0.1, 0.1)"},
    {"random_rotation", AUG_ROTATION, ARGS(rotation_args), 1, "random_rotation(0.05)"},
    {"random_contrast", AUG_CONTRAST, ARGS(contrast_args), 1, "random_contrast(0.2)"},
};
#undef ARGS
#define N_LAYERS ((int)(sizeof layers / sizeof layers[0]))
#define KNOWN "random_flip, random_translation, random_rotation, random_contrast"

/* Keras' defaults, except value_range: Keras assumes [0, 255] pixels,
 * ours are [0, 1]. */
static void op_defaults(aug_op *op, aug_kind kind) {
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->flip_h = op->flip_v = 1;
    op->fill = FILL_REFLECT;
    op->range[1] = 1.0f;
}

/* ---- layer names ------------------------------------------------------------ */

/* Edit distance between a and b after lowercasing and dropping '_', so
 * RandomFlip and random_flp both find random_flip. */
static int name_distance(const char *a, const char *b) {
    char x[64], y[64];
    int m = 0, n = 0, d[64];
    for (; *a && m < 63; a++)
        if (*a != '_')
            x[m++] = (char)tolower((unsigned char)*a);
    for (; *b && n < 63; b++)
        if (*b != '_')
            y[n++] = (char)tolower((unsigned char)*b);
    for (int j = 0; j <= n; j++)
        d[j] = j;
    for (int i = 1; i <= m; i++) {
        int diag = d[0];
        d[0] = i;
        for (int j = 1; j <= n; j++) {
            int up = d[j];
            int best = diag + (x[i - 1] != y[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (d[j - 1] + 1 < best)
                best = d[j - 1] + 1;
            d[j] = best;
            diag = up;
        }
    }
    return d[n];
}

static int unknown_layer(lexer *lx, const char *name) {
    if (!strcmp(name, "random_crop") || !strcmp(name, "RandomCrop"))
        return mpt_data_fail(lx->err, lx->n, "augment: random_crop is not supported: it "
                             "changes the image size, which the model's input fixes\n  "
                             "hint: use random_translation instead, e.g. "
                             "random_translation(0.1, 0.1) shifts by up to 10%%");
    int best = -1, best_d = 4;
    for (int i = 0; i < N_LAYERS; i++) {
        int dist = name_distance(name, layers[i].name);
        if (dist < best_d) {
            best_d = dist;
            best = i;
        }
    }
    if (best >= 0)
        return mpt_data_fail(lx->err, lx->n, "augment: unknown augmentation '%s'\n  hint: did "
                             "you mean %s? (known: " KNOWN ")", name, layers[best].name);
    return mpt_data_fail(lx->err, lx->n, "augment: unknown augmentation '%s'\n  hint: known: "
                         KNOWN, name);
}

/* ---- parsing ---------------------------------------------------------------- */

typedef struct {
    char key[64]; /* "" when positional */
    value v;
} arg;

/* arg = [ ident "=" ] value */
static int parse_arg(lexer *lx, arg *a) {
    skip_space(lx);
    a->key[0] = 0;
    const char *save = lx->p;
    if (is_ident_start(*lx->p)) {
        if (lex_ident(lx, a->key, sizeof a->key))
            return -1;
        skip_space(lx);
        if (*lx->p == '=' && lx->p[1] != '=') {
            lx->p++;
        } else {
            a->key[0] = 0;
            lx->p = save;
        }
    }
    return parse_value(lx, &a->v);
}

/* "(" [ arg ("," arg)* ] ")", the "(" already seen */
static int parse_args(lexer *lx, arg *args, int *n_args) {
    lx->p++;
    skip_space(lx);
    if (*lx->p == ')') {
        lx->p++;
        return 0;
    }
    for (;;) {
        if (*n_args == MAX_ARGS)
            return syntax_error(lx, lx->p, "too many arguments");
        if (parse_arg(lx, &args[(*n_args)++]))
            return -1;
        skip_space(lx);
        if (*lx->p == ')') {
            lx->p++;
            return 0;
        }
        if (*lx->p != ',')
            return syntax_error(lx, lx->p, "expected ',' or ')'");
        lx->p++;
        skip_space(lx);
    }
}

/* Gives each argument to its layer's slot: positional in order, then named. */
static int apply_args(const layer_spec *L, aug_op *op, const arg *args, int n_args,
                      char *err, size_t n) {
    int seen[MAX_ARGS] = {0};
    for (int i = 0; i < n_args; i++) {
        int k = -1;
        if (!args[i].key[0]) {
            if (i > 0 && args[i - 1].key[0])
                return mpt_data_fail(err, n, "%s: positional argument after a named one\n"
                                     "  hint: name it, as in %s", L->name, L->example);
            if (i >= L->n_args)
                return mpt_data_fail(err, n, "%s: too many arguments (%d)\n  hint: it takes "
                                     "at most %d", L->name, n_args, L->n_args);
            k = i;
        }
        for (int j = 0; j < L->n_args && k < 0; j++)
            if (!strcmp(args[i].key, L->args[j].key))
                k = j;
        if (k < 0) {
            char list[192] = "";
            for (int j = 0; j < L->n_args; j++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                         j ? ", " : "", L->args[j].key);
            return mpt_data_fail(err, n, "%s: unknown argument '%s'\n  hint: it takes %s",
                                 L->name, args[i].key, list);
        }
        if (seen[k]++)
            return mpt_data_fail(err, n, "%s: argument %s given twice", L->name,
                                 L->args[k].key);
        arg_ctx ctx = {L->name, L->args[k].key, &args[i].v, err, n};
        if (L->args[k].apply(op, &ctx))
            return -1;
    }
    for (int k = 0; k < L->required; k++)
        if (!seen[k])
            return mpt_data_fail(err, n, "%s: missing argument %s\n  hint: for example %s",
                                 L->name, L->args[k].key, L->example);
    return 0;
}

/* call = ident [ "(" [ arg ("," arg)* ] ")" ] */
static int parse_call(lexer *lx, aug_op *op) {
    char name[64];
    if (!is_ident_start(*lx->p))
        return syntax_error(lx, lx->p, "expected an augmentation such as random_flip(...)");
    if (lex_ident(lx, name, sizeof name))
        return -1;
    const layer_spec *L = NULL;
    for (int i = 0; i < N_LAYERS; i++)
        if (!strcmp(name, layers[i].name))
            L = &layers[i];
    if (!L)
        return unknown_layer(lx, name);
    op_defaults(op, L->kind);
    arg args[MAX_ARGS];
    int n_args = 0;
    skip_space(lx);
    if (*lx->p == '(' && parse_args(lx, args, &n_args))
        return -1;
    return apply_args(L, op, args, n_args, lx->err, lx->n);
}

/* augs = [ "[" ] [ call ("," call)* [","] ] [ "]" ] */
static int parse_augs(lexer *lx, mpt_augment *a) {
    skip_space(lx);
    int bracket = *lx->p == '[';
    lx->p += bracket;
    for (;;) {
        skip_space(lx);
        if (!*lx->p || (bracket && *lx->p == ']'))
            break;
        if (a->n == MPT_AUGMENT_MAX_OPS)
            return syntax_error(lx, lx->p, "too many augmentations (at most 64)");
        if (parse_call(lx, &a->ops[a->n++]))
            return -1;
        skip_space(lx);
        if (*lx->p != ',')
            break;
        lx->p++;
    }
    if (bracket && *lx->p != ']')
        return syntax_error(lx, lx->p, "expected ',' or ']'");
    lx->p += bracket;
    skip_space(lx);
    if (*lx->p)
        return syntax_error(lx, lx->p, bracket ? "unexpected text after ']'"
                                               : "expected ',' between augmentations");
    return 0;
}

int mpt_augment_parse(const char *text, mpt_augment **out, char *err, size_t n) {
    mpt_augment *a = calloc(1, sizeof *a);
    lexer lx = {text, text, err, n};
    *out = NULL;
    if (parse_augs(&lx, a)) {
        free(a);
        return -1;
    }
    *out = a;
    return 0;
}

void mpt_augment_free(mpt_augment *a) { free(a); }

int mpt_augment_count(const mpt_augment *a) { return a ? a->n : 0; }
