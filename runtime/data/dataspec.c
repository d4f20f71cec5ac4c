/* runtime/data/dataspec.c — parsing data specs.
 *
 *   spec  = name [ "(" [ arg ("," arg)* ] ")" ]
 *   arg   = [ ident "=" ] value
 *   value = string | number | ident | "[" [ number ("," number)* ] "]"
 *
 * Positional arguments fill a kind's options in the order its table lists
 * them (images("dir") is images(dir="dir")).
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "runtime/data/data_impl.h"

#define KNOWN_SETS                                                             \
    "fashion_mnist, synthetic(...), images(\"dir\", size=[h,w]), idx(...), "           \
    "text(\"path\", seq_len=128)"
#define MAX_ARGS 16
#define MAX_ITEMS MPT_MAX_DIMS

typedef enum { V_NUM, V_STR, V_IDENT, V_LIST } value_kind;

typedef struct {
    value_kind kind;
    double num;
    char *str; /* V_STR, V_IDENT */
    int n_items;
    double items[MAX_ITEMS];
    int col;
} value;

typedef struct {
    char *key; /* NULL when positional */
    value v;
} arg;

typedef struct {
    const char *text;
    const char *p;
    char *err;
    size_t n;
} lexer;

const char *mpt_data_kind_name(mpt_data_kind k) {
    switch (k) {
    case MPT_DATA_FASHION_MNIST: return "fashion_mnist";
    case MPT_DATA_SYNTHETIC: return "synthetic";
    case MPT_DATA_IMAGES: return "images";
    case MPT_DATA_IDX: return "idx";
    case MPT_DATA_TEXT: return "text";
    case MPT_DATA_KIND_COUNT: break;
    }
    return "?";
}

/* A syntax error shows the spec with a caret under the column. */
static int syntax_error(lexer *lx, const char *at, const char *what) {
    int col = (int)(at - lx->text);
    return mpt_data_fail(lx->err, lx->n, "data spec: %s at column %d\n  %s\n  %*s^",
                         what, col + 1, lx->text, col, "");
}

static void skip_space(lexer *lx) {
    while (isspace((unsigned char)*lx->p))
        lx->p++;
}

static char *lex_ident(lexer *lx) {
    const char *s = lx->p;
    while (isalnum((unsigned char)*lx->p) || *lx->p == '_')
        lx->p++;
    return strndup(s, (size_t)(lx->p - s));
}

/* string = '"' { char | '\' char } '"' */
static int lex_string(lexer *lx, char **out) {
    const char *start = lx->p++;
    size_t len = 0, cap = 16;
    char *s = malloc(cap);
    while (*lx->p && *lx->p != '"') {
        char c = *lx->p++;
        if (c == '\\' && *lx->p)
            c = *lx->p++;
        if (len + 2 > cap)
            s = realloc(s, cap *= 2);
        s[len++] = c;
    }
    if (*lx->p != '"') {
        free(s);
        return syntax_error(lx, start, "unterminated string");
    }
    lx->p++;
    s[len] = 0;
    *out = s;
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

/* value = string | number | ident | list */
static int parse_value(lexer *lx, value *v) {
    skip_space(lx);
    memset(v, 0, sizeof *v);
    v->col = (int)(lx->p - lx->text) + 1;
    char c = *lx->p;
    if (c == '"') {
        v->kind = V_STR;
        return lex_string(lx, &v->str);
    }
    if (isalpha((unsigned char)c) || c == '_') {
        v->kind = V_IDENT;
        v->str = lex_ident(lx);
        return 0;
    }
    if (c == '[') {
        v->kind = V_LIST;
        lx->p++;
        skip_space(lx);
        if (*lx->p == ']') {
            lx->p++;
            return 0;
        }
        for (;;) {
            skip_space(lx);
            if (v->n_items == MAX_ITEMS)
                return syntax_error(lx, lx->p, "too many list items (at most 6)");
            if (lex_number(lx, &v->items[v->n_items++]))
                return -1;
            skip_space(lx);
            if (*lx->p == ']') {
                lx->p++;
                return 0;
            }
            if (*lx->p != ',')
                return syntax_error(lx, lx->p, "expected ',' or ']'");
            lx->p++;
        }
    }
    v->kind = V_NUM;
    return lex_number(lx, &v->num);
}

/* arg = [ ident "=" ] value */
static int parse_arg(lexer *lx, arg *a) {
    skip_space(lx);
    a->key = NULL;
    const char *save = lx->p;
    if (isalpha((unsigned char)*lx->p) || *lx->p == '_') {
        char *id = lex_ident(lx);
        skip_space(lx);
        if (*lx->p == '=') {
            lx->p++;
            a->key = id;
        } else {
            free(id);
            lx->p = save;
        }
    }
    return parse_value(lx, &a->v);
}

static void free_args(arg *args, int n) {
    for (int i = 0; i < n; i++) {
        free(args[i].key);
        free(args[i].v.str);
    }
}

/* ---- options of each kind ------------------------------------------------ */

typedef int (*option_fn)(mpt_data_spec *s, const value *v, const char *key,
                         char *err, size_t n);

typedef struct {
    const char *key;
    option_fn apply;
} option;

static const char *value_kind_name(value_kind k) {
    switch (k) {
    case V_NUM: return "a number";
    case V_STR: return "a string";
    case V_IDENT: return "a name";
    case V_LIST: return "a list";
    }
    return "?";
}

static int want(const value *v, value_kind k, const char *key, const char *example,
                char *err, size_t n) {
    if (v->kind == k)
        return 0;
    return mpt_data_fail(err, n, "data spec: %s must be %s like %s, not %s (column %d)",
                         key, value_kind_name(k), example, value_kind_name(v->kind),
                         v->col);
}

static int get_int(const value *v, const char *key, double lo, double hi,
                   int64_t *out, char *err, size_t n) {
    if (want(v, V_NUM, key, "10", err, n))
        return -1;
    if (v->num != floor(v->num) || v->num < lo || v->num > hi)
        return mpt_data_fail(err, n, "data spec: %s must be an integer in [%.0f, %.0f], not %g",
                             key, lo, hi, v->num);
    *out = (int64_t)v->num;
    return 0;
}

static int get_shape(const value *v, const char *key, const char *example,
                     mpt_shape *out, char *err, size_t n) {
    if (want(v, V_LIST, key, example, err, n))
        return -1;
    if (v->n_items == 0)
        return mpt_data_fail(err, n, "data spec: %s must not be empty (like %s)", key, example);
    out->rank = v->n_items;
    for (int i = 0; i < v->n_items; i++) {
        double d = v->items[i];
        if (d != floor(d) || d < 1 || d > 1e9)
            return mpt_data_fail(err, n, "data spec: %s must list positive integers like %s, not %g",
                                 key, example, d);
        out->dim[i] = (int64_t)d;
    }
    return 0;
}

static int get_string(const value *v, const char *key, char **out, char *err, size_t n) {
    if (want(v, V_STR, key, "\"/path\"", err, n))
        return -1;
    free(*out);
    *out = strdup(v->str);
    return 0;
}

/* An ident or a string from a fixed set; returns its index. */
static int get_choice(const value *v, const char *key, const char *const *choices,
                      int n_choices, int *out, char *err, size_t n) {
    if (v->kind == V_IDENT || v->kind == V_STR)
        for (int i = 0; i < n_choices; i++)
            if (!strcmp(v->str, choices[i])) {
                *out = i;
                return 0;
            }
    char list[128] = "";
    for (int i = 0; i < n_choices; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                 choices[i]);
    return mpt_data_fail(err, n, "data spec: %s must be one of %s (column %d)", key, list,
                         v->col);
}

static int opt_dir(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    return get_string(v, k, &s->dir, e, n);
}
static int opt_images_path(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    return get_string(v, k, &s->images_path, e, n);
}
static int opt_labels_path(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    return get_string(v, k, &s->labels_path, e, n);
}
static int opt_text_path(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    return get_string(v, k, &s->text_path, e, n);
}
static int opt_shape(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    return get_shape(v, k, "[784]", &s->shape, e, n);
}
static int opt_targets(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    return get_shape(v, k, "[10]", &s->targets, e, n);
}

static int opt_ids(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    return get_shape(v, k, "[128]", &s->ids, e, n);
}
static int opt_size(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    if (get_shape(v, k, "[32,32]", &s->size, e, n))
        return -1;
    if (s->size.rank != 2)
        return mpt_data_fail(e, n, "data spec: size must be [height, width], got %d values",
                             s->size.rank);
    return 0;
}
static int opt_classes(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    int64_t c;
    if (get_int(v, k, 1, 1 << 24, &c, e, n))
        return -1;
    s->classes = (int)c;
    return 0;
}
static int opt_samples(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    return get_int(v, k, 1, 1e12, &s->samples, e, n);
}
static int opt_test_samples(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    return get_int(v, k, 1, 1e12, &s->test_samples, e, n);
}
static int opt_seed(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    int64_t seed;
    if (get_int(v, k, 0, 9007199254740992.0, &seed, e, n))
        return -1;
    s->seed = (uint64_t)seed;
    s->seed_set = 1;
    return 0;
}
static int opt_vocab(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    return get_int(v, k, 1, 2147483647.0, &s->vocab, e, n);
}
static int opt_dtype(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    static const char *const names[] = {"f32", "i32", "float32", "int32"};
    int i;
    if (get_choice(v, k, names, 4, &i, e, n))
        return -1;
    s->dtype = (i % 2) ? MPT_DT_I32 : MPT_DT_F32;
    return 0;
}
static int opt_seq_len(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    if (want(v, V_NUM, k, "128", e, n))
        return -1;
    if (v->num != floor(v->num) || v->num < 1 || v->num > 1e9)
        return mpt_data_fail(e, n, "data spec: text: seq_len must be a whole number of at "
                             "least 1, not %g\n  hint: seq_len is how many bytes the model "
                             "reads per sample, as in text(\"corpus.txt\", seq_len=128)",
                             v->num);
    s->seq_len = (int64_t)v->num;
    return 0;
}
static int opt_test_fraction(mpt_data_spec *s, const value *v, const char *k, char *e,
                             size_t n) {
    if (want(v, V_NUM, k, "0.1", e, n))
        return -1;
    if (!(v->num > 0 && v->num < 1))
        return mpt_data_fail(e, n, "data spec: text: test_fraction must be between 0 and 1 "
                             "(exclusive), not %g\n  hint: test_fraction=0.1 keeps the last "
                             "tenth of the windows for the test part", v->num);
    s->test_fraction = v->num;
    return 0;
}
static int opt_validation_split(mpt_data_spec *s, const value *v, const char *k, char *e,
                                size_t n) {
    if (want(v, V_NUM, k, "0.2", e, n))
        return -1;
    if (!(v->num > 0 && v->num < 1))
        return mpt_data_fail(e, n, "data spec: validation_split must be between 0 and 1 "
                             "(exclusive), not %g", v->num);
    s->validation_split = v->num;
    return 0;
}
static int opt_on_error(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    static const char *const names[] = {"fatal", "skip"};
    int i;
    if (get_choice(v, k, names, 2, &i, e, n))
        return -1;
    s->on_error = i ? MPT_DATA_ON_ERROR_SKIP : MPT_DATA_ON_ERROR_FATAL;
    return 0;
}
static int opt_color_mode(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    static const char *const names[] = {"rgb", "grayscale"};
    int i;
    if (get_choice(v, k, names, 2, &i, e, n))
        return -1;
    s->channels = i ? 1 : 3;
    return 0;
}
static int opt_cache(mpt_data_spec *s, const value *v, const char *k, char *e, size_t n) {
    static const char *const names[] = {"auto", "true", "false"};
    static const mpt_data_cache modes[] = {MPT_DATA_CACHE_AUTO, MPT_DATA_CACHE_ON,
                                           MPT_DATA_CACHE_OFF};
    int i;
    if (get_choice(v, k, names, 3, &i, e, n))
        return -1;
    s->cache = modes[i];
    return 0;
}

/* Options in positional order, per kind. */
static const option fashion_options[] = {{"dir", opt_dir}};
static const option synthetic_options[] = {
    {"shape", opt_shape},     {"classes", opt_classes}, {"samples", opt_samples},
    {"seed", opt_seed},       {"targets", opt_targets}, {"dtype", opt_dtype},
    {"vocab", opt_vocab},     {"test_samples", opt_test_samples}, {"ids", opt_ids}};
static const option images_options[] = {
    {"dir", opt_dir},         {"size", opt_size},         {"validation_split", opt_validation_split},
    {"on_error", opt_on_error}, {"seed", opt_seed},       {"color_mode", opt_color_mode},
    {"cache", opt_cache}};
static const option idx_options[] = {
    {"images", opt_images_path}, {"labels", opt_labels_path}, {"classes", opt_classes}};
static const option text_options[] = {
    {"path", opt_text_path}, {"seq_len", opt_seq_len}, {"test_fraction", opt_test_fraction}};

static const option *options_of(mpt_data_kind k, int *count) {
#define OPTS(a) (*count = (int)(sizeof a / sizeof a[0]), a)
    switch (k) {
    case MPT_DATA_FASHION_MNIST: return OPTS(fashion_options);
    case MPT_DATA_SYNTHETIC: return OPTS(synthetic_options);
    case MPT_DATA_IMAGES: return OPTS(images_options);
    case MPT_DATA_IDX: return OPTS(idx_options);
    case MPT_DATA_TEXT: return OPTS(text_options);
    case MPT_DATA_KIND_COUNT: break;
    }
#undef OPTS
    *count = 0;
    return NULL;
}

static int apply_args(mpt_data_spec *s, arg *args, int n_args, char *err, size_t n) {
    int count;
    const option *opts = options_of(s->kind, &count);
    const char *kind = mpt_data_kind_name(s->kind);
    int seen[MAX_ARGS] = {0};
    for (int i = 0; i < n_args; i++) {
        int k = -1;
        if (!args[i].key) {
            if (i > 0 && args[i - 1].key)
                return mpt_data_fail(err, n, "data spec: %s: positional argument after "
                                     "a named one (column %d)", kind, args[i].v.col);
            if (i >= count)
                return mpt_data_fail(err, n, "data spec: %s takes at most %d positional "
                                     "argument%s", kind, count, count == 1 ? "" : "s");
            k = i;
        } else {
            for (int j = 0; j < count; j++)
                if (!strcmp(args[i].key, opts[j].key))
                    k = j;
            if (k < 0) {
                char list[256] = "";
                for (int j = 0; j < count; j++)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                             j ? ", " : "", opts[j].key);
                return mpt_data_fail(err, n, "data spec: %s: unknown option '%s' (known: %s)",
                                     kind, args[i].key, list);
            }
        }
        if (seen[k]++)
            return mpt_data_fail(err, n, "data spec: %s: option '%s' given twice", kind,
                                 opts[k].key);
        if (opts[k].apply(s, &args[i].v, opts[k].key, err, n))
            return -1;
    }
    return 0;
}

static int check_spec(mpt_data_spec *s, char *err, size_t n) {
    switch (s->kind) {
    case MPT_DATA_FASHION_MNIST:
        if (!s->dir)
            s->dir = strdup(MPT_DATA_FASHION_MNIST_DIR);
        return 0;
    case MPT_DATA_SYNTHETIC:
        if (s->dtype == MPT_DT_I32 && s->vocab == 0)
            s->vocab = 1000;
        if (s->dtype != MPT_DT_I32 && s->vocab)
            return mpt_data_fail(err, n, "data spec: synthetic: vocab= needs dtype=i32 "
                                 "(token inputs)");
        if (!s->test_samples)
            s->test_samples = s->samples / 6 > 0 ? s->samples / 6 : 1;
        return 0;
    case MPT_DATA_IMAGES:
        if (!s->dir)
            return mpt_data_fail(err, n, "data spec: images needs a directory\n"
                                 "  hint: images(\"path/to/dir\", size=[h,w])");
        return 0;
    case MPT_DATA_IDX:
        if (!s->images_path || !s->labels_path)
            return mpt_data_fail(err, n, "data spec: idx needs two files\n"
                                 "  hint: idx(\"train-images-idx3-ubyte.gz\", "
                                 "\"train-labels-idx1-ubyte.gz\")");
        return 0;
    case MPT_DATA_TEXT:
        if (!s->text_path)
            return mpt_data_fail(err, n, "data spec: text needs a file or a folder\n"
                                 "  hint: text(\"corpus.txt\", seq_len=128)");
        return 0;
    case MPT_DATA_KIND_COUNT: break;
    }
    return mpt_data_fail(err, n, "data spec: internal error: kind %d", (int)s->kind);
}

static void spec_defaults(mpt_data_spec *s) {
    s->classes = 0;
    s->samples = 60000;
    s->seed = s->kind == MPT_DATA_IMAGES ? 1337 : 1;
    s->dtype = MPT_DT_F32;
    s->channels = 3;
    s->on_error = MPT_DATA_ON_ERROR_FATAL;
    s->cache = MPT_DATA_CACHE_AUTO;
    if (s->kind == MPT_DATA_TEXT)
        s->test_fraction = 0.1;
}

int mpt_data_spec_parse(const char *text, mpt_data_spec *out, char *err, size_t n) {
    memset(out, 0, sizeof *out);
    lexer lx = {text, text, err, n};
    skip_space(&lx);
    if (!isalpha((unsigned char)*lx.p))
        return mpt_data_fail(err, n, "unknown data set '%s' (known: " KNOWN_SETS ")", text);
    char *name = lex_ident(&lx);
    int kind = -1;
    for (int k = 0; k < MPT_DATA_KIND_COUNT; k++)
        if (!strcmp(name, mpt_data_kind_name((mpt_data_kind)k)))
            kind = k;
    if (kind < 0) {
        mpt_data_fail(err, n, "unknown data set '%s' (known: " KNOWN_SETS ")", name);
        free(name);
        return -1;
    }
    free(name);
    out->kind = (mpt_data_kind)kind;
    spec_defaults(out);

    arg args[MAX_ARGS];
    int n_args = 0, rc = 0;
    skip_space(&lx);
    if (*lx.p == '(') {
        lx.p++;
        skip_space(&lx);
        if (*lx.p == ')')
            lx.p++;
        else
            for (;;) {
                if (n_args == MAX_ARGS) {
                    rc = syntax_error(&lx, lx.p, "too many arguments");
                    break;
                }
                rc = parse_arg(&lx, &args[n_args++]);
                if (rc)
                    break;
                skip_space(&lx);
                if (*lx.p == ')') {
                    lx.p++;
                    break;
                }
                if (*lx.p != ',') {
                    rc = syntax_error(&lx, lx.p, "expected ',' or ')'");
                    break;
                }
                lx.p++;
            }
    }
    if (!rc) {
        skip_space(&lx);
        if (*lx.p)
            rc = syntax_error(&lx, lx.p, "unexpected text after the data spec");
    }
    if (!rc)
        rc = apply_args(out, args, n_args, err, n);
    if (!rc)
        rc = check_spec(out, err, n);
    free_args(args, n_args);
    if (rc)
        mpt_data_spec_free(out);
    return rc;
}

void mpt_data_spec_free(mpt_data_spec *s) {
    free(s->dir);
    free(s->images_path);
    free(s->labels_path);
    free(s->text_path);
    s->dir = s->images_path = s->labels_path = s->text_path = NULL;
}

int mpt_data_kind_has_test(mpt_data_kind k) {
    switch (k) {
    case MPT_DATA_FASHION_MNIST:
    case MPT_DATA_SYNTHETIC:
    case MPT_DATA_TEXT: return 1;
    case MPT_DATA_IMAGES:
    case MPT_DATA_IDX:
    case MPT_DATA_KIND_COUNT: break;
    }
    return 0;
}

int mpt_data_has_test(const char *spec) {
    mpt_data_spec s;
    char err[512];
    if (mpt_data_spec_parse(spec, &s, err, sizeof err))
        return 0;
    int has = mpt_data_kind_has_test(s.kind);
    mpt_data_spec_free(&s);
    return has;
}
