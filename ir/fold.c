/* ir/fold.c — folding reductions whose input is linear in broadcast
 * statistics.
 *
 * The gradient of a batch norm's mean is
 *
 *     dmean = reduce_sum(-(dy * bcast(gamma * rstd) + 2 * xc * bcast(dvar / n)))
 *
 * and xc = x - bcast(mean). As written, the reduction reads values that
 * themselves need reductions of the same tensor (dvar needs sum(dy * xc)),
 * so a backend must read the whole tensor once more for it. Sums are linear,
 * and a factor broadcast along exactly the reduced axes is constant within
 * each reduced row, so
 *
 *     reduce_sum(a * bcast(v)) = v * reduce_sum(a)
 *     reduce_sum(a + b)        = reduce_sum(a) + reduce_sum(b)   (sub, neg alike)
 *     reduce_sum(bcast(v))     = v * count
 *     reduce_sum(a * c)        = c * reduce_sum(a)               (c a constant)
 *
 * and dmean becomes -(gamma * rstd * sum(dy) + 2 * dvar / n * (sum(x) - count * mean)):
 * row-level arithmetic on sums the step computes anyway (sum(dy) for beta's
 * gradient, sum(x) for the forward mean). The same holds for a layer norm's
 * backward along its rows.
 *
 * Decisions:
 *  - Only reduce_sum, only when every op on the way is add/sub/neg/mul (or
 *    a constant or broadcast factor) in the reduction's own dtype and the
 *    input's shape, and only when a hoisted factor depends on a reduction:
 *    a rewrite that removes no dependency on other statistics is not made,
 *    so ordinary sums (bias gradients, losses) keep their rounding.
 *  - Numerics: sum(x) - count * mean is the same zero as sum(x - mean) up
 *    to rounding of order eps * count * |mean|; it enters dx divided by the
 *    row length and scaled by dvar, a relative change of about
 *    eps * |mean| / std, far below the f32 tolerance of any test.
 *  - Only what holds a statistic is split: an add chain without one (a
 *    layer norm's input, the residual stream) is one term, summed whole.
 *  - At most MAX_TERMS summands per reduction, so a shared subexpression
 *    cannot blow up; beyond that the reduction stays as it is.
 *  - A sum the graph already computes (same input, same axes) is reused;
 *    duplicate reduce_sum nodes are merged while copying.
 *  - Runs on the finished train step (ir/train.c), so the interpreter and
 *    every backend compute the same folded graph.
 */
#include <stdlib.h>

#include "ir/ir.h"

enum { MAX_TERMS = 16 };

typedef struct {
    int leaf;   /* src node summed, or -1 for a broadcast row value */
    int factor; /* index into folder.fac: the product of hoisted row values, or -1 */
    double k;   /* constant multiplier */
} term;

/* a product of hoisted row values, as a chain: fac[parent] * src node v.
 * Nothing is built in the output graph until the fold is taken. */
typedef struct {
    int v, parent, built; /* built: its out node once made, else -1 */
} factor;

typedef struct {
    const mpt_graph *src;
    mpt_graph *out;
    const int *map;
    const char *dep_red; /* per src node: depends on a reduction */
    int red;             /* the reduction being folded (src id) */
    int64_t axes, kept;  /* reduced dims, and their complement, of the input */
    term t[MAX_TERMS];
    factor fac[MAX_TERMS];
    int n, n_fac, hoisted_stat, failed;
} folder;

/* the value a broadcast along exactly the reduced axes spreads, or -1 */
static int row_value(const folder *f, int n) {
    const mpt_node *b = &f->src->nodes[n];
    if (b->op != MPT_OP_BROADCAST || b->attr.i[0] != f->kept) return -1;
    const mpt_node *v = &f->src->nodes[b->in[0]];
    const mpt_node *r = &f->src->nodes[f->red];
    if (v->dtype != r->dtype || !mpt_shape_eq(v->shape, r->shape)) return -1;
    return b->in[0];
}

static int is_const(const folder *f, int n) {
    const mpt_node *c = &f->src->nodes[n];
    return c->op == MPT_OP_CONST && c->dtype == f->src->nodes[f->red].dtype;
}

/* the factor `parent` times row value v */
static int times(folder *f, int parent, int v) {
    if (f->n_fac == MAX_TERMS) {
        f->failed = 1;
        return -1;
    }
    f->fac[f->n_fac] = (factor){v, parent, -1};
    return f->n_fac++;
}

/* factor i's out node, made once */
static int factor_node(folder *f, int i) {
    factor *c = &f->fac[i];
    if (c->built < 0)
        c->built = c->parent < 0 ? f->map[c->v]
                                 : mpt_b_binary(f->out, MPT_OP_MUL, factor_node(f, c->parent), f->map[c->v]);
    return c->built;
}

static void add_term(folder *f, int leaf, int factor, double k) {
    if (f->n == MAX_TERMS) {
        f->failed = 1;
        return;
    }
    f->t[f->n++] = (term){leaf, factor, k};
}

/* does input-shaped node n hold, under its adds, subs, negations and
 * constant factors, a statistic spread over the rows (a factor the fold
 * would hoist)? Depth-capped: a long chain without one is a leaf anyway. */
static int holds_stat(const folder *f, int n, int depth) {
    const mpt_node *x = &f->src->nodes[n];
    const mpt_node *in = &f->src->nodes[f->src->nodes[f->red].in[0]];
    if (depth > 32 || x->dtype != in->dtype || !mpt_shape_eq(x->shape, in->shape)) return 0;
    int v;
    if (x->op == MPT_OP_ADD || x->op == MPT_OP_SUB)
        return holds_stat(f, x->in[0], depth + 1) || holds_stat(f, x->in[1], depth + 1);
    if (x->op == MPT_OP_NEG) return holds_stat(f, x->in[0], depth + 1);
    if (x->op == MPT_OP_MUL)
        for (int side = 0; side < 2; side++) {
            int a = x->in[side], b = x->in[1 - side];
            if (is_const(f, b)) return holds_stat(f, a, depth + 1);
            if ((v = row_value(f, b)) >= 0) return f->dep_red[v] || holds_stat(f, a, depth + 1);
        }
    if (x->op == MPT_OP_BROADCAST) return (v = row_value(f, n)) >= 0 && f->dep_red[v];
    return 0;
}

/* splits node n (input-shaped, scaled by factor * k) into terms. A sum of
 * terms none of which holds a statistic stays one term: a layer norm's
 * input x is the residual stream, a chain of a dozen adds, and splitting
 * sum(x) into the sums of its summands made GPT's last layer norm read
 * fifteen tensors instead of one. */
static void split(folder *f, int n, int factor, double k) {
    if (f->failed) return;
    const mpt_node *x = &f->src->nodes[n];
    const mpt_node *in = &f->src->nodes[f->src->nodes[f->red].in[0]];
    if (x->dtype != in->dtype || !mpt_shape_eq(x->shape, in->shape)) {
        add_term(f, n, factor, k);
        return;
    }
    int v;
    if ((x->op == MPT_OP_ADD || x->op == MPT_OP_SUB || x->op == MPT_OP_NEG) && !holds_stat(f, n, 0)) {
        add_term(f, n, factor, k);
        return;
    }
    if (x->op == MPT_OP_ADD || x->op == MPT_OP_SUB) {
        split(f, x->in[0], factor, k);
        split(f, x->in[1], factor, x->op == MPT_OP_SUB ? -k : k);
        return;
    } else if (x->op == MPT_OP_NEG) {
        split(f, x->in[0], factor, -k);
        return;
    } else if (x->op == MPT_OP_MUL) {
        for (int side = 0; side < 2; side++) {
            int a = x->in[side], b = x->in[1 - side];
            if (is_const(f, b)) {
                split(f, a, factor, k * f->src->nodes[b].attr.f);
                return;
            }
            if ((v = row_value(f, b)) >= 0) {
                f->hoisted_stat |= f->dep_red[v];
                split(f, a, times(f, factor, v), k);
                return;
            }
        }
    } else if (x->op == MPT_OP_BROADCAST && (v = row_value(f, n)) >= 0) {
        f->hoisted_stat |= f->dep_red[v];
        add_term(f, -1, times(f, factor, v), k);
        return;
    } else if (x->op == MPT_OP_CONST) {
        add_term(f, -1, factor, k * x->attr.f);
        return;
    }
    add_term(f, n, factor, k);
}

/* an existing reduce_sum of out node x over axes, or a new one */
static int sum_of(mpt_graph *g, int x, int64_t axes) {
    for (int i = g->n_nodes - 1; i > x; i--) {
        const mpt_node *n = &g->nodes[i];
        if (n->op == MPT_OP_REDUCE_SUM && n->in[0] == x && n->attr.i[0] == axes) return i;
    }
    return mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, axes);
}

/* builds the folded value of f->red in f->out */
static int build(folder *f) {
    const mpt_node *r = &f->src->nodes[f->red];
    int64_t count = 1;
    const mpt_node *in = &f->src->nodes[r->in[0]];
    for (int d = 0; d < in->shape.rank; d++)
        if (f->axes >> d & 1) count *= in->shape.dim[d];
    int acc = -1;
    for (int i = 0; i < f->n; i++) {
        term *t = &f->t[i];
        int v = t->leaf >= 0 ? sum_of(f->out, f->map[t->leaf], f->axes) : -1;
        double k = t->leaf >= 0 ? t->k : t->k * (double)count;
        int fv = t->factor >= 0 ? factor_node(f, t->factor) : -1;
        if (v < 0 && fv < 0) v = mpt_b_const(f->out, r->dtype, r->shape, k);
        else {
            if (v < 0) v = fv;
            else if (fv >= 0) v = mpt_b_binary(f->out, MPT_OP_MUL, v, fv);
            if (k == -1) v = mpt_b_unary(f->out, MPT_OP_NEG, v);
            else if (k != 1) v = mpt_b_binary(f->out, MPT_OP_MUL, v, mpt_b_const(f->out, r->dtype, r->shape, k));
        }
        acc = acc < 0 ? v : mpt_b_binary(f->out, MPT_OP_ADD, acc, v);
    }
    return acc;
}

mpt_graph *mpt_fold_reductions(const mpt_graph *g, int *n_folded) {
    int n = g->n_nodes;
    int *map = malloc(((size_t)n + 1) * sizeof *map);
    char *dep = calloc((size_t)n + 1, 1);
    if (!map || !dep) {
        free(map);
        free(dep);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        const mpt_node *x = &g->nodes[i];
        dep[i] = mpt_op_table[x->op].kind == MPT_KIND_REDUCTION;
        for (int k = 0; k < x->n_in; k++) dep[i] |= dep[x->in[k]];
    }
    mpt_graph *out = mpt_graph_new(g->name);
    int folded = 0;
    for (int i = 0; i < n; i++) {
        const mpt_node *x = &g->nodes[i];
        map[i] = -1;
        if (x->op == MPT_OP_REDUCE_SUM && x->dtype == g->nodes[x->in[0]].dtype &&
            mpt_dtype_is_float(x->dtype)) {
            int rank = g->nodes[x->in[0]].shape.rank;
            folder f = {.src = g, .out = out, .map = map, .dep_red = dep, .red = i,
                        .axes = x->attr.i[0], .kept = ((int64_t)1 << rank) - 1 - x->attr.i[0]};
            mpt_b_layer(out, x->layer);
            split(&f, x->in[0], -1, 1.0);
            if (!f.failed && f.hoisted_stat) {
                map[i] = build(&f);
                folded++;
            } else {
                map[i] = sum_of(out, map[x->in[0]], x->attr.i[0]);
            }
            mpt_b_layer(out, NULL);
            continue;
        }
        map[i] = mpt_graph_copy_node(out, g, i, map);
    }
    for (int i = 0; i < g->n_outputs; i++) mpt_graph_add_output(out, g->outputs[i].name, map[g->outputs[i].node]);
    for (int i = 0; i < g->n_updates; i++) mpt_graph_add_update(out, map[g->updates[i].var], map[g->updates[i].value]);
    free(map);
    free(dep);
    if (n_folded) *n_folded = folded;
    return out;
}
