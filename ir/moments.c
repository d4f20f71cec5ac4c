/* ir/moments.c — a batch norm's variance in the same read as its mean.
 *
 * Batch norm (lang/lower.c) computes, as Keras does,
 *
 *     mean = reduce_sum(x) * (1/n)
 *     v    = reduce_sum(square(x - bcast(mean)))
 *
 * and v needs mean first: a backend reads x twice. For any per-channel
 * value s, sum((x - mean)^2) = sum((x - s)^2) - n (mean - s)^2, and the
 * sums on the right read only x and s, so the fusion pass computes both in
 * one reduction kernel over x. s is the layer's moving mean before this
 * step's update: a variable the step has anyway, so the shift costs no
 * extra read or kernel (the first sample of x, tried first, made the
 * fusion pass materialise a copy of x to read it).
 *
 * Numerics: the rounding of the f32 sum grows by about (mean - s)^2 /
 * variance. Once the moving mean has followed the batch means, that is
 * near 0 and the result is as good as the two-pass one; at the first steps
 * (moving mean 0) it is the plain one-pass formula sum(x^2) - n mean^2,
 * which is what XLA's batch-norm expansion always uses. tests/test_moments.c
 * checks both ends, with |mean| ~ 40 std. The rewrite is exact in real
 * arithmetic and applies to the finished train step (after autodiff, whose
 * backward reads mean and x - mean as before), so the interpreter and
 * every backend compute the same graph.
 *
 * Matched: v = reduce_sum(square(sub(x, broadcast(m)))) over A, where
 * m = mul(reduce_sum(x over A), c) with c a constant, the broadcast spreads
 * m along exactly A, A is every dim but the last, everything is one float
 * dtype, and the step updates a variable from m as add(mul(var, const),
 * mul(m, const)), possibly behind loss scaling's select(finite, that, var)
 * and data parallelism's mean over the ranks (the moving mean). Anything
 * else is left alone.
 */
#include <stdlib.h>

#include "ir/ir.h"

/* the sum over axes whose scaled copy m is, or -1: m = mul(reduce_sum(x, axes), const) */
static int mean_of(const mpt_graph *g, int m, int x, int64_t axes) {
    const mpt_node *mn = &g->nodes[m];
    if (mn->op != MPT_OP_MUL) return -1;
    for (int side = 0; side < 2; side++) {
        const mpt_node *s = &g->nodes[mn->in[side]], *c = &g->nodes[mn->in[1 - side]];
        if (c->op == MPT_OP_CONST && s->op == MPT_OP_REDUCE_SUM && s->in[0] == x &&
            s->attr.i[0] == axes)
            return mn->in[side];
    }
    return -1;
}

/* v's x and m when v is the variance sum described above, else 0 */
static int match(const mpt_graph *g, int v, int *x, int *m) {
    const mpt_node *vn = &g->nodes[v];
    if (vn->op != MPT_OP_REDUCE_SUM || !mpt_dtype_is_float(vn->dtype)) return 0;
    const mpt_node *sq = &g->nodes[vn->in[0]];
    if (sq->op != MPT_OP_SQUARE) return 0;
    const mpt_node *d = &g->nodes[sq->in[0]];
    if (d->op != MPT_OP_SUB) return 0;
    const mpt_node *xn = &g->nodes[d->in[0]], *b = &g->nodes[d->in[1]];
    int rank = xn->shape.rank;
    int64_t axes = vn->attr.i[0], last = (int64_t)1 << (rank - 1);
    if (rank < 2 || axes != last - 1 || b->op != MPT_OP_BROADCAST || b->attr.i[0] != last)
        return 0;
    if (xn->dtype != vn->dtype || sq->dtype != vn->dtype || d->dtype != vn->dtype) return 0;
    if (mean_of(g, b->in[0], d->in[0], axes) < 0 || g->nodes[b->in[0]].dtype != vn->dtype) return 0;
    *x = d->in[0];
    *m = b->in[0];
    return 1;
}

/* The moving mean the step updates from m: a variable whose update is
 * add(mul(variable, const), mul(m, const)) in any operand order, or -1 */
static int moving_mean_of(const mpt_graph *g, int m) {
    for (int u = 0; u < g->n_updates; u++) {
        const mpt_node *val = &g->nodes[g->updates[u].value];
        int var = g->updates[u].var;
        /* loss scaling gates it: select(finite, new value, var) */
        if (val->op == MPT_OP_SELECT && (val->in[1] == var || val->in[2] == var))
            val = &g->nodes[val->in[val->in[1] == var ? 2 : 1]];
        /* data parallelism averages it over the ranks (ir/train.c):
         * mul(allreduce(new value), broadcast(const)); every rank's update
         * reads the same moving mean, so the shift is the same on all */
        if (val->op == MPT_OP_MUL)
            for (int side = 0; side < 2; side++) {
                const mpt_node *r = &g->nodes[val->in[side]], *c = &g->nodes[val->in[1 - side]];
                if (c->op == MPT_OP_BROADCAST) c = &g->nodes[c->in[0]];
                if (r->op == MPT_OP_ALLREDUCE && c->op == MPT_OP_CONST) {
                    val = &g->nodes[r->in[0]];
                    break;
                }
            }
        if (val->op != MPT_OP_ADD || g->nodes[var].dtype != g->nodes[m].dtype ||
            !mpt_shape_eq(g->nodes[var].shape, g->nodes[m].shape))
            continue;
        int has_var = 0, has_m = 0;
        for (int k = 0; k < 2; k++) {
            const mpt_node *t = &g->nodes[val->in[k]];
            if (t->op != MPT_OP_MUL) continue;
            for (int side = 0; side < 2; side++) {
                if (g->nodes[t->in[1 - side]].op != MPT_OP_CONST) continue;
                has_var |= t->in[side] == var;
                has_m |= t->in[side] == m;
            }
        }
        if (has_var && has_m) return var;
    }
    return -1;
}

mpt_graph *mpt_fold_variance(const mpt_graph *g, int *n_rewritten) {
    int n = g->n_nodes, done = 0;
    int *map = malloc(((size_t)n + 1) * sizeof *map);
    if (!map) return NULL;
    mpt_graph *out = mpt_graph_new(g->name);
    for (int i = 0; i < n; i++) {
        int x, m, mm = -1;
        if (!match(g, i, &x, &m) || (mm = moving_mean_of(g, m)) < 0) {
            map[i] = mpt_graph_copy_node(out, g, i, map);
            continue;
        }
        const mpt_node *v = &g->nodes[i], *xn = &g->nodes[x];
        mpt_dtype dt = v->dtype;
        int rank = xn->shape.rank;
        int64_t c = xn->shape.dim[rank - 1], rows = mpt_shape_numel(xn->shape) / c;
        mpt_b_layer(out, v->layer);
        int s = map[mm]; /* last step's moving mean */
        int d = mpt_b_binary(out, MPT_OP_SUB, map[x], mpt_b_broadcast_to(out, s, xn->shape));
        int sum_sq = mpt_b_reduce(out, MPT_OP_REDUCE_SUM, mpt_b_unary(out, MPT_OP_SQUARE, d),
                                  v->attr.i[0]);
        int off = mpt_b_unary(out, MPT_OP_SQUARE, mpt_b_binary(out, MPT_OP_SUB, map[m], s));
        int corr = mpt_b_binary(out, MPT_OP_MUL, off, mpt_b_const(out, dt, v->shape, (double)rows));
        map[i] = mpt_b_binary(out, MPT_OP_SUB, sum_sq, corr);
        mpt_b_layer(out, NULL);
        done++;
    }
    for (int i = 0; i < g->n_outputs; i++) mpt_graph_add_output(out, g->outputs[i].name, map[g->outputs[i].node]);
    for (int i = 0; i < g->n_updates; i++) mpt_graph_add_update(out, map[g->updates[i].var], map[g->updates[i].value]);
    free(map);
    if (n_rewritten) *n_rewritten = done;
    return out;
}
