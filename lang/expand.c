/* lang/expand.c — from the syntax tree of a model to a flat list of layers:
 * block instantiation (parameters, name prefixes "b1/conv"), repeat, Keras
 * style auto-names ("dense", "dense_1", ...), and input references. */
#include <stdlib.h>
#include <string.h>

#include "lang/model.h"

/* Instantiations nest at most this deep; deeper is almost surely runaway
 * recursion, and a cycle is reported by name before reaching it. */
enum { MAX_BLOCK_DEPTH = 32, MAX_LAYERS = 100000, MAX_REPEAT = 10000 };
#define NOT_FOUND MPT_FLAT_NO_REF

/* ---- a set of full names (open addressing, FNV-1a) -------------------- */

typedef struct {
    char **keys;
    size_t cap, n;
} name_set;

static size_t hash(const char *s) {
    size_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static int set_has(const name_set *s, const char *key) {
    if (!s->cap) return 0;
    for (size_t i = hash(key) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        if (!s->keys[i]) return 0;
        if (strcmp(s->keys[i], key) == 0) return 1;
    }
}

static void set_add(name_set *s, const char *key) {
    if (2 * (s->n + 1) > s->cap) {
        name_set bigger = {calloc(s->cap ? 2 * s->cap : 64, sizeof(char *)),
                           s->cap ? 2 * s->cap : 64, 0};
        for (size_t i = 0; i < s->cap; i++)
            if (s->keys[i]) set_add(&bigger, s->keys[i]);
        for (size_t i = 0; i < s->cap; i++) free(s->keys[i]);
        free(s->keys);
        *s = bigger;
    }
    size_t i = hash(key) & (s->cap - 1);
    while (s->keys[i]) {
        if (strcmp(s->keys[i], key) == 0) return;
        i = (i + 1) & (s->cap - 1);
    }
    s->keys[i] = strdup(key);
    s->n++;
}

static void set_free(name_set *s) {
    for (size_t i = 0; i < s->cap; i++) free(s->keys[i]);
    free(s->keys);
}

/* ---- scopes ------------------------------------------------------------ */

/* Auto-naming state of one model or block instance: the next counter of
 * each type, and the names written explicitly in its body (auto names
 * avoid them). */
typedef struct {
    int64_t next[MPT_L_COUNT];
    char **blocks;
    int64_t *block_next;
    int n_blocks;
    name_set explicit_names;
} naming;

typedef struct scope scope;
struct scope {
    scope *parent; /* repeat iterations see their enclosing scope; blocks do not */
    char **names;
    int *idx;
    int n, cap;
    int input;          /* what `input` refers to */
    const char *prefix; /* "b1/" */
    const char *suffix; /* "_2" inside the 2nd iteration of a repeat */
    naming *nm;
};

static void scope_add(scope *sc, const char *name, int idx) {
    if (sc->n == sc->cap) {
        sc->cap = sc->cap ? 2 * sc->cap : 8;
        sc->names = realloc(sc->names, (size_t)sc->cap * sizeof *sc->names);
        sc->idx = realloc(sc->idx, (size_t)sc->cap * sizeof *sc->idx);
    }
    sc->names[sc->n] = strdup(name);
    sc->idx[sc->n++] = idx;
}

static int scope_find(const scope *sc, const char *name) {
    for (; sc; sc = sc->parent) {
        if (strcmp(name, "input") == 0) return sc->input;
        for (int k = sc->n - 1; k >= 0; k--)
            if (strcmp(sc->names[k], name) == 0) return sc->idx[k];
    }
    return NOT_FOUND;
}

static void scope_free(scope *sc) {
    for (int k = 0; k < sc->n; k++) free(sc->names[k]);
    free(sc->names);
    free(sc->idx);
}

static void naming_free(naming *nm) {
    for (int k = 0; k < nm->n_blocks; k++) free(nm->blocks[k]);
    free(nm->blocks);
    free(nm->block_next);
    set_free(&nm->explicit_names);
}

static void collect_explicit(naming *nm, const mpt_ast *body) {
    for (int k = 0; k < body->n_kids; k++) {
        const mpt_ast *s = body->kids[k];
        if (s->kind == MPT_AST_LAYER && s->name) set_add(&nm->explicit_names, s->name);
        if (s->kind == MPT_AST_REPEAT) collect_explicit(nm, s);
    }
}

/* ---- the expander ---------------------------------------------------- */

typedef struct {
    mpt_diag *d;
    const mpt_ast *file;
    mpt_flat_model *m;
    name_set full;              /* full names of layers and block instances */
    const char *stack[MAX_BLOCK_DEPTH + 1];
    int depth;
    int stopped;                /* the layer limit was hit */
} expander;

static char *cat3(const char *a, const char *b, const char *c) {
    size_t n = strlen(a) + strlen(b) + strlen(c) + 1;
    char *s = malloc(n);
    snprintf(s, n, "%s%s%s", a, b, c);
    return s;
}

static const mpt_ast *find_block(const mpt_ast *file, const char *name) {
    for (int k = 0; k < file->n_kids; k++)
        if (file->kids[k]->kind == MPT_AST_BLOCK && strcmp(file->kids[k]->name, name) == 0)
            return file->kids[k];
    return NULL;
}

/* The next free "<type>", "<type>_1", ... in this naming scope. */
static char *auto_name(expander *ex, scope *sc, const char *type, int64_t *next) {
    for (;; (*next)++) {
        char num[32] = "";
        if (*next > 0) snprintf(num, sizeof num, "_%lld", (long long)*next);
        char *local = cat3(type, num, "");
        char *full = cat3(sc->prefix, local, "");
        int taken = set_has(&ex->full, full) || set_has(&sc->nm->explicit_names, local);
        free(full);
        if (!taken) {
            (*next)++;
            return local;
        }
        free(local);
    }
}

static int64_t *block_counter(naming *nm, const char *block) {
    for (int k = 0; k < nm->n_blocks; k++)
        if (strcmp(nm->blocks[k], block) == 0) return &nm->block_next[k];
    nm->blocks = realloc(nm->blocks, (size_t)(nm->n_blocks + 1) * sizeof *nm->blocks);
    nm->block_next = realloc(nm->block_next, (size_t)(nm->n_blocks + 1) * sizeof *nm->block_next);
    nm->blocks[nm->n_blocks] = strdup(block);
    nm->block_next[nm->n_blocks] = 0;
    return &nm->block_next[nm->n_blocks++];
}

/* A name a layer reads: the scope's (its layers, `input`), else one of
 * the model's inputs, which every block instance sees too. */
static int find_ref(const expander *ex, const scope *sc, const char *name) {
    int idx = scope_find(sc, name);
    for (int k = 0; idx == NOT_FOUND && k < ex->m->n_inputs; k++)
        if (strcmp(ex->m->inputs[k].name, name) == 0) idx = MPT_FLAT_INPUT_REF(k);
    return idx;
}

static void unknown_name_error(expander *ex, const scope *sc, const char *name, mpt_loc loc) {
    const char **cands = NULL;
    int n = 0;
    for (const scope *s = sc; s; s = s->parent) {
        cands = realloc(cands, (size_t)(n + s->n + 1) * sizeof *cands);
        for (int k = 0; k < s->n; k++) cands[n++] = s->names[k];
    }
    cands = realloc(cands, (size_t)(n + ex->m->n_inputs + 1) * sizeof *cands);
    for (int k = 0; k < ex->m->n_inputs; k++) cands[n++] = ex->m->inputs[k].name;
    char hint[200];
    const char *h = mpt_diag_did_you_mean(hint, sizeof hint, name, cands, n);
    if (!h) h = "a layer can take its inputs only from layers declared before it, the model's "
                "inputs, or 'input'";
    mpt_diag_error(ex->d, loc, h, "unknown layer '%s'", name);
    free(cands);
}

static int expand_body(expander *ex, scope *sc, const mpt_ast *body, const mpt_env *env,
                       const char *dtype, int cur);

/* Binds the instance's arguments to the block's parameters, in order or by
 * name; defaults see the parameters bound before them. */
static int bind_params(expander *ex, const mpt_ast *stmt, const mpt_ast *blk, const mpt_env *env,
                       mpt_binding *b, char **dtype) {
    int n = blk->n_args, errors = 0;
    int *given = calloc((size_t)n + 1, sizeof *given);
    for (int i = 0; i < stmt->n_args; i++) {
        const mpt_ast *arg = stmt->args[i];
        int slot = -1;
        if (!arg->name) {
            slot = i < n ? i : -1;
            if (slot < 0) {
                mpt_diag_error(ex->d, arg->loc, NULL, "block '%s' takes %d argument%s", blk->name,
                               n, n == 1 ? "" : "s");
                errors++;
                continue;
            }
        } else {
            for (int k = 0; k < n; k++)
                if (strcmp(blk->args[k]->name, arg->name) == 0) slot = k;
            if (slot < 0 && strcmp(arg->name, "dtype") == 0) {
                mpt_value v;
                if (mpt_eval(ex->d, arg->a, env, &v) != 0) {
                    errors++;
                } else if (v.kind != MPT_V_SYM && v.kind != MPT_V_STR) {
                    mpt_diag_error(ex->d, v.loc, NULL, "dtype must be a name");
                    errors++;
                } else {
                    free(*dtype);
                    *dtype = strdup(v.s);
                }
                mpt_value_free(&v);
                continue;
            }
            if (slot < 0) {
                const char **names = calloc((size_t)n + 1, sizeof *names);
                for (int k = 0; k < n; k++) names[k] = blk->args[k]->name;
                char hint[200];
                mpt_diag_error(ex->d, arg->name_loc,
                               mpt_diag_did_you_mean(hint, sizeof hint, arg->name, names, n),
                               "block '%s' has no parameter '%s'", blk->name, arg->name);
                free(names);
                errors++;
                continue;
            }
        }
        if (given[slot]) {
            mpt_diag_error(ex->d, arg->loc, NULL, "parameter '%s' given twice",
                           blk->args[slot]->name);
            errors++;
            continue;
        }
        if (mpt_eval(ex->d, arg->a, env, &b[slot].value) != 0) errors++;
        else given[slot] = 1;
    }
    for (int k = 0; k < n; k++) {
        b[k].name = blk->args[k]->name;
        if (given[k]) continue;
        if (!blk->args[k]->a) {
            mpt_diag_error(ex->d, stmt->loc, NULL, "block '%s' needs the argument '%s'",
                           blk->name, blk->args[k]->name);
            errors++;
            continue;
        }
        mpt_env defaults_env = {b, k};
        if (mpt_eval(ex->d, blk->args[k]->a, &defaults_env, &b[k].value) != 0) errors++;
        else given[k] = 1;
    }
    for (int k = 0; k < n; k++)
        if (!given[k]) b[k].value = (mpt_value){.kind = MPT_V_INT};
    free(given);
    return errors ? -1 : 0;
}

static int instantiate(expander *ex, scope *sc, const mpt_ast *stmt, const mpt_ast *blk,
                       const char *full, const int *in, int n_in, const mpt_env *env,
                       const char *outer_dtype) {
    for (int k = 0; k < ex->depth; k++) {
        if (strcmp(ex->stack[k], blk->name) == 0) {
            char chain[512] = "";
            for (int j = k; j < ex->depth; j++) {
                strncat(chain, ex->stack[j], sizeof chain - strlen(chain) - 1);
                strncat(chain, " -> ", sizeof chain - strlen(chain) - 1);
            }
            strncat(chain, blk->name, sizeof chain - strlen(chain) - 1);
            mpt_diag_error(ex->d, stmt->loc, "a block cannot contain itself, directly or not",
                           "block '%s' instantiates itself (%s)", blk->name, chain);
            return NOT_FOUND;
        }
    }
    if (ex->depth >= MAX_BLOCK_DEPTH) {
        mpt_diag_error(ex->d, stmt->loc, NULL, "blocks nested more than %d deep",
                       MAX_BLOCK_DEPTH);
        return NOT_FOUND;
    }
    if (n_in != 1) {
        mpt_diag_error(ex->d, stmt->loc, "inside the block, 'input' is that one input",
                       "block '%s' takes one input, got %d", blk->name, n_in);
        return NOT_FOUND;
    }
    mpt_binding *b = calloc((size_t)blk->n_args + 1, sizeof *b);
    char *dtype = outer_dtype ? strdup(outer_dtype) : NULL;
    int out = NOT_FOUND;
    if (bind_params(ex, stmt, blk, env, b, &dtype) == 0) {
        naming nm = {0};
        collect_explicit(&nm, blk);
        char *prefix = cat3(full, "/", "");
        scope inner = {.input = in[0], .prefix = prefix, .suffix = "", .nm = &nm};
        mpt_env benv = {b, blk->n_args};
        ex->stack[ex->depth++] = blk->name;
        out = expand_body(ex, &inner, blk, &benv, dtype, in[0]);
        ex->depth--;
        scope_free(&inner);
        naming_free(&nm);
        free(prefix);
    }
    for (int k = 0; k < blk->n_args; k++) mpt_value_free(&b[k].value);
    free(b);
    free(dtype);
    return out;
}

static mpt_flat_layer *push_layer(expander *ex) {
    mpt_flat_model *m = ex->m;
    if (m->n_layers == m->cap_layers) {
        m->cap_layers = m->cap_layers ? 2 * m->cap_layers : 16;
        m->layers = realloc(m->layers, (size_t)m->cap_layers * sizeof *m->layers);
    }
    mpt_flat_layer *L = &m->layers[m->n_layers++];
    *L = (mpt_flat_layer){0};
    return L;
}

/* layer = TYPE [NAME] [(args)] [from refs]; returns the index of its output
 * or NOT_FOUND after an error. */
static int expand_layer(expander *ex, scope *sc, const mpt_ast *stmt, const mpt_env *env,
                        const char *dtype, int cur) {
    mpt_layer_kind kind = MPT_L_COUNT;
    const mpt_ast *blk = NULL;
    if (mpt_layer_kind_parse(stmt->str, &kind) != 0) {
        blk = find_block(ex->file, stmt->str);
        if (!blk) {
            char hint[600];
            const char *close = mpt_layer_kind_closest(stmt->str);
            if (close) {
                snprintf(hint, sizeof hint, "did you mean '%s'?", close);
            } else { /* every type the table knows, so the list never goes stale */
                size_t o = (size_t)snprintf(hint, sizeof hint, "the layer types are");
                for (int k = 0; k < MPT_L_COUNT && o < sizeof hint; k++)
                    o += (size_t)snprintf(hint + o, sizeof hint - o, " %s,",
                                          mpt_layer_kind_name((mpt_layer_kind)k));
                if (o < sizeof hint) snprintf(hint + o, sizeof hint - o, " or a block");
            }
            mpt_diag_error(ex->d, stmt->loc, hint, "unknown layer type '%s'", stmt->str);
            return NOT_FOUND;
        }
    }
    int n_in = stmt->n_kids ? stmt->n_kids : 1;
    int *in = malloc((size_t)n_in * sizeof *in);
    in[0] = cur;
    int bad = 0;
    for (int k = 0; k < stmt->n_kids; k++) {
        in[k] = find_ref(ex, sc, stmt->kids[k]->str);
        if (in[k] == NOT_FOUND) {
            unknown_name_error(ex, sc, stmt->kids[k]->str, stmt->kids[k]->loc);
            bad = 1;
        }
    }
    char *local;
    if (stmt->name) {
        local = cat3(stmt->name, sc->suffix, "");
    } else {
        int64_t *next = blk ? block_counter(sc->nm, blk->name) : &sc->nm->next[kind];
        local = auto_name(ex, sc, blk ? blk->name : mpt_layer_kind_name(kind), next);
    }
    char *full = cat3(sc->prefix, local, "");
    if (set_has(&ex->full, full)) {
        mpt_diag_error(ex->d, stmt->name_loc, "every layer needs its own name",
                       "duplicate layer name '%s'", full);
        bad = 1;
    }
    set_add(&ex->full, full);
    int out = NOT_FOUND;
    if (bad) {
    } else if (blk) {
        out = instantiate(ex, sc, stmt, blk, full, in, n_in, env, dtype);
    } else {
        int min_in, max_in;
        mpt_layer_arity(kind, &min_in, &max_in);
        if (n_in < min_in || n_in > max_in) {
            if (min_in == max_in)
                mpt_diag_error(ex->d, stmt->loc, NULL, "%s takes %d input, got %d",
                               stmt->str, min_in, n_in);
            else {
                char hint[128];
                snprintf(hint, sizeof hint, "name them: %s joined from a, b", stmt->str);
                mpt_diag_error(ex->d, stmt->loc, hint, "%s takes %d or more inputs, got %d",
                               stmt->str, min_in, n_in);
            }
        } else {
            mpt_flat_layer *L = push_layer(ex);
            L->kind = kind;
            L->name = full;
            full = NULL;
            L->loc = stmt->loc;
            L->in = in;
            L->n_in = n_in;
            in = NULL;
            L->dtype = dtype ? strdup(dtype) : NULL;
            mpt_layer_set_args(ex->d, stmt, env, L);
            L->mask = NOT_FOUND;
            if (L->mask_name) {
                L->mask = find_ref(ex, sc, L->mask_name);
                if (L->mask == NOT_FOUND) unknown_name_error(ex, sc, L->mask_name, L->mask_loc);
            }
            out = ex->m->n_layers - 1;
        }
    }
    if (out != NOT_FOUND) {
        scope_add(sc, local, out);
        /* names made inside a repeat are also visible after it, suffixed */
        if (sc->parent && sc->suffix[0]) scope_add(sc->parent, local, out);
    }
    free(in);
    free(full);
    free(local);
    return out;
}

/* input = "input" NAME ":" "[" dims "]"; every input before the first layer */
static void expand_input(expander *ex, scope *sc, const mpt_ast *stmt, const mpt_env *env) {
    mpt_flat_model *m = ex->m;
    if (ex->depth > 0) {
        mpt_diag_error(ex->d, stmt->loc, "inside a block, its input is called 'input'",
                       "a block cannot declare an input");
        return;
    }
    if (m->n_layers > 0) {
        mpt_diag_error(ex->d, stmt->loc, "declare every input first, then the layers",
                       "the inputs must come before the layers");
        return;
    }
    for (int k = 0; k < m->n_inputs; k++) {
        if (strcmp(m->inputs[k].name, stmt->name) == 0) {
            mpt_diag_error(ex->d, stmt->loc, "every input needs its own name",
                           "the model already has an input '%s' (line %d)", stmt->name,
                           m->inputs[k].loc.line);
            return;
        }
    }
    if (m->n_inputs == MPT_MAX_MODEL_INPUTS) {
        mpt_diag_error(ex->d, stmt->loc, NULL, "a model has at most %d inputs",
                       MPT_MAX_MODEL_INPUTS);
        return;
    }
    int k = m->n_inputs++;
    mpt_flat_input *in = &m->inputs[k];
    in->loc = stmt->loc;
    in->name = strdup(stmt->name);
    in->dtype = MPT_DT_F32;
    scope_add(sc, stmt->name, MPT_FLAT_INPUT_REF(k));
    if (stmt->n_kids < 1 || stmt->n_kids >= MPT_MAX_DIMS) {
        mpt_diag_error(ex->d, stmt->loc, "e.g. input x: [28, 28, 1]",
                       "an input shape has 1 to %d dims, got %d", MPT_MAX_DIMS - 1,
                       stmt->n_kids);
        return;
    }
    in->shape.rank = stmt->n_kids;
    for (int j = 0; j < stmt->n_kids; j++) {
        mpt_value v;
        if (mpt_eval(ex->d, stmt->kids[j], env, &v) != 0) continue;
        if (v.kind != MPT_V_INT || v.i <= 0 || v.i > INT32_MAX)
            mpt_diag_error(ex->d, v.loc, NULL, "an input size must be an integer from 1 to %d",
                           INT32_MAX);
        else
            in->shape.dim[j] = v.i;
        mpt_value_free(&v);
    }
}

static int expand_repeat(expander *ex, scope *sc, const mpt_ast *stmt, const mpt_env *env,
                         const char *dtype, int cur) {
    mpt_value v;
    if (mpt_eval(ex->d, stmt->a, env, &v) != 0) return cur;
    long long n = v.kind == MPT_V_INT ? v.i : -1;
    if (n < 0 || n > MAX_REPEAT)
        mpt_diag_error(ex->d, v.loc, NULL, "repeat needs a count from 0 to %d", MAX_REPEAT);
    mpt_value_free(&v);
    for (long long k = 1; k <= n && n <= MAX_REPEAT && !ex->stopped; k++) {
        char num[32];
        snprintf(num, sizeof num, "_%lld", k);
        char *suffix = cat3(sc->suffix, num, "");
        scope iter = {.parent = sc, .input = sc->input, .prefix = sc->prefix, .suffix = suffix,
                      .nm = sc->nm};
        int errors = ex->d->n_errors;
        cur = expand_body(ex, &iter, stmt, env, dtype, cur);
        scope_free(&iter);
        free(suffix);
        if (ex->d->n_errors > errors) break; /* the same errors would repeat n times */
    }
    return cur;
}

static int expand_body(expander *ex, scope *sc, const mpt_ast *body, const mpt_env *env,
                       const char *dtype, int cur) {
    for (int k = 0; k < body->n_kids && !ex->stopped; k++) {
        const mpt_ast *s = body->kids[k];
        if (ex->m->n_layers >= MAX_LAYERS) {
            mpt_diag_error(ex->d, s->loc, NULL, "the model has more than %d layers", MAX_LAYERS);
            ex->stopped = 1;
            break;
        }
        if (s->kind == MPT_AST_INPUT) {
            expand_input(ex, sc, s, env);
        } else if (s->kind == MPT_AST_REPEAT) {
            cur = expand_repeat(ex, sc, s, env, dtype, cur);
        } else {
            int out = expand_layer(ex, sc, s, env, dtype, cur);
            if (out != NOT_FOUND) cur = out;
        }
    }
    return cur;
}

void mpt_expand(mpt_diag *d, const mpt_ast *model, const mpt_ast *file, mpt_flat_model *m) {
    expander ex = {.d = d, .file = file, .m = m};
    int errors_before = d->n_errors;
    naming nm = {0};
    collect_explicit(&nm, model);
    scope root = {.input = MPT_FLAT_INPUT, .prefix = "", .suffix = "", .nm = &nm};
    m->name = strdup(model->name);
    m->loc = model->name_loc;
    m->output = expand_body(&ex, &root, model, NULL, NULL, MPT_FLAT_INPUT);
    if (!m->n_inputs)
        mpt_diag_error(d, model->name_loc, "declare it first: input x: [784]",
                       "model '%s' has no input", model->name);
    else if (m->n_layers == 0 && d->n_errors == errors_before)
        mpt_diag_error(d, model->name_loc, NULL, "model '%s' has no layers", model->name);
    scope_free(&root);
    naming_free(&nm);
    set_free(&ex.full);
}

void mpt_flat_model_free(mpt_flat_model *m) {
    for (int k = 0; k < m->n_layers; k++) {
        free(m->layers[k].name);
        free(m->layers[k].dtype);
        free(m->layers[k].in);
        free(m->layers[k].mask_name);
    }
    free(m->layers);
    free(m->name);
    for (int k = 0; k < m->n_inputs; k++) free(m->inputs[k].name);
    *m = (mpt_flat_model){0};
}
