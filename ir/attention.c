/* ir/attention.c — finds attention's core in a typed forward graph and
 * rewrites it into one `attention` op (ops.def), before autodiff, as JAX
 * and XLA treat a custom call with its own VJP: the op's one gradient
 * rule (ir/autodiff.c) then gives the backward as attention_grad ops, and
 * fusion makes one kernel of each direction that never holds the T x T
 * scores in memory.
 *
 * The pattern is read from the ops, not from the layer's name, so a
 * hand-written attention of primitive layers is found as well:
 *
 *   o = batch_matmul([cast] [select(attend, p, 0)] p, v)       P.V
 *   p = e / broadcast(reduce_sum(e)),  e = exp(s - broadcast(reduce_max(s)))
 *   s = select(later, -1e9, x) | select(attend, x, -1e9) | x   the mask
 *   x = batch_matmul(q, k, trans_b) [* const]                  Q.K^T, scale
 *   later  = gt(iota axis 3, iota axis 2)                      causal
 *   attend = [and(m, not(later))] m, m a tree of elementwise ops over
 *            broadcasts of [B, Tk] or [B, Tq, Tk] values and constants
 *
 * Every value inside the pattern must be read only inside it. Where a
 * part does not fit, the note says why and the graph keeps the unfused
 * ops (a mask that varies per head; a padding mask without the select
 * that zeroes its probabilities, whose fully masked rows would need
 * statistics f32 cannot hold). Dropout on the probabilities,
 *   select(not(lt(random_uniform(counter), rate)), p * c, 0),
 * goes into the op's attrs: the kernels draw the same bits.
 *
 * Where q, k and v are each transpose(x, [0, 2, 1, 3]) of a [B, T, H, E]
 * value (multi_head_attention's projections), the op can read those
 * values in place and write o so (its bthd attr; `layout` 1): the
 * transposes that moved the heads in front and o's back, each a pass over
 * memory of its own, and their gradients are gone. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

#define MAX_TAKEN 24
#define MASKED_SCORE -1e9 /* what multi_head_attention writes; anything at or below it will do */

typedef struct {
    const mpt_graph *g;
    const int *uses;
    int pv, q, k, v, attend, causal, zero_masked, mask_rank;
    double scale;
    int drop_counter; /* dropout's step counter, or -1 */
    int64_t drop_seed, drop_below, drop_scale;
    int taken[MAX_TAKEN], n_taken;
    const char *reason;
} match;

static const mpt_node *N(const match *m, int id) { return &m->g->nodes[id]; }

static void take(match *m, int id) {
    if (m->n_taken < MAX_TAKEN) m->taken[m->n_taken++] = id;
}

static int is_const(const match *m, int id, double *v) {
    if (N(m, id)->op != MPT_OP_CONST) return 0;
    if (v) *v = N(m, id)->attr.f;
    return 1;
}

/* reduce over the last dim of a rank-4 value, broadcast back */
static int row_stat(match *m, int b, mpt_op op, int *of) {
    const mpt_node *nb = N(m, b);
    if (nb->op != MPT_OP_BROADCAST || nb->attr.i[0] != 0x7) return 0;
    const mpt_node *r = N(m, nb->in[0]);
    if (r->op != op || r->attr.i[0] != 0x8) return 0;
    take(m, b);
    take(m, nb->in[0]);
    *of = r->in[0];
    return 1;
}

/* gt(iota axis 3, iota axis 2): key after query */
static int is_later(const match *m, int id) {
    const mpt_node *n = N(m, id);
    if (n->op != MPT_OP_GT) return 0;
    const mpt_node *a = N(m, n->in[0]), *b = N(m, n->in[1]);
    return a->op == MPT_OP_IOTA && a->attr.i[0] == 3 && b->op == MPT_OP_IOTA && b->attr.i[0] == 2;
}

/* The rank of the head-free mask a bool [B,H,Tq,Tk] tree reduces to: 2
 * ([B,Tk]), 3 ([B,Tq,Tk]), or 0 when a leaf varies per head or is not a
 * broadcast or a constant. */
static int mask_rank(const match *m, int id) {
    const mpt_node *n = N(m, id);
    if (n->op == MPT_OP_CONST) return 2;
    if (n->op == MPT_OP_BROADCAST) { /* [B, Tk] or [B, Tq, Tk], no dim repeated */
        const mpt_node *x = N(m, n->in[0]);
        int r = n->attr.i[0] == 0x9 ? 2 : n->attr.i[0] == 0xd ? 3 : 0;
        if (!r || x->shape.dim[0] != n->shape.dim[0] || x->shape.dim[r - 1] != n->shape.dim[3] ||
            (r == 3 && x->shape.dim[1] != n->shape.dim[2]))
            return 0;
        return r;
    }
    if (n->op != MPT_OP_NOT && n->op != MPT_OP_EQ && n->op != MPT_OP_AND && n->op != MPT_OP_LT &&
        n->op != MPT_OP_GT)
        return 0;
    int r = 2;
    for (int k = 0; k < n->n_in; k++) {
        int rk = mask_rank(m, n->in[k]);
        if (!rk) return 0;
        if (rk > r) r = rk;
    }
    return r;
}

/* split `attend` into the causal part and the rest */
static void split_attend(match *m, int attend) {
    const mpt_node *a = N(m, attend);
    m->attend = attend;
    if (a->op != MPT_OP_AND) return;
    for (int s = 0; s < 2; s++) {
        const mpt_node *x = N(m, a->in[s]);
        if (x->op == MPT_OP_NOT && is_later(m, x->in[0])) {
            m->causal = 1;
            m->attend = a->in[1 - s];
            return;
        }
    }
}

/* keep = not(lt(random_uniform(counter), rate)), and the kept values
 * times the constant c: the dropout of lang/lower.c, as attention's
 * attrs (ops.def). 0 when it has another form. */
static int read_dropout(match *m, int keep, int scaled) {
    const mpt_node *n = N(m, keep);
    if (n->op != MPT_OP_NOT || N(m, n->in[0])->op != MPT_OP_LT) return 0;
    const mpt_node *lt = N(m, n->in[0]), *u = N(m, lt->in[0]);
    double rate, c;
    if (u->op != MPT_OP_RANDOM_UNIFORM || (u->dtype != MPT_DT_F32 && u->dtype != MPT_DT_F64) ||
        !is_const(m, lt->in[1], &rate) || N(m, lt->in[1])->dtype != u->dtype)
        return 0;
    const mpt_node *mul = N(m, scaled);
    if (mul->op != MPT_OP_MUL || !is_const(m, mul->in[1], &c)) return 0;
    /* random_uniform holds 24 random bits k as k 2^-24 in f32 and f64
     * alike (ir/interp.c): u < rate exactly where k < rate 2^24 */
    double r = u->dtype == MPT_DT_F32 ? (double)(float)rate : rate;
    if (!(r > 0 && r < 1)) return 0;
    m->drop_counter = u->in[0];
    m->drop_seed = u->attr.i[0];
    m->drop_below = (int64_t)ceil(r * 16777216.0);
    float cf = (float)c;
    uint32_t bits;
    memcpy(&bits, &cf, 4);
    m->drop_scale = bits;
    /* the kernel computes in f32; an f64 product (the interpreter's f64
     * checks) rounds the same constant only if it is an f32 */
    return mul->dtype == MPT_DT_F32 || (double)cf == c;
}

static int depends_on_random(const match *m, int id, int depth) {
    const mpt_node *n = N(m, id);
    if (n->op == MPT_OP_RANDOM_UNIFORM) return 1;
    if (depth > 8) return 0;
    for (int k = 0; k < n->n_in; k++)
        if (depends_on_random(m, n->in[k], depth + 1)) return 1;
    return 0;
}

/* Matches the pattern ending at the batch_matmul pv. 0: not attention
 * (no note); 1: attention, m->reason says whether it fuses. */
static int match_at(match *m, int pv) {
    const mpt_node *o = N(m, pv);
    if (o->op != MPT_OP_BATCH_MATMUL || o->shape.rank != 4 || o->attr.i[0] || o->attr.i[1]) return 0;
    m->pv = pv;
    m->v = o->in[1];
    int p = o->in[0], zero_attend = -1, dropout = 0;
    m->n_taken = 0;
    for (;;) { /* from P.V back to the softmax: casts, the zeroing select, dropout */
        const mpt_node *n = N(m, p);
        double z;
        if (n->op == MPT_OP_CAST) {
            take(m, p);
            p = n->in[0];
        } else if (n->op == MPT_OP_SELECT && is_const(m, n->in[2], &z) && z == 0) {
            take(m, p);
            if (depends_on_random(m, n->in[0], 0)) {
                dropout = dropout ? 2 : read_dropout(m, n->in[0], n->in[1]) ? 1 : 2;
                p = n->in[1];
                if (N(m, p)->op == MPT_OP_MUL && is_const(m, N(m, p)->in[1], NULL)) {
                    take(m, p);
                    p = N(m, p)->in[0];
                }
            } else {
                zero_attend = n->in[0];
                p = n->in[1];
            }
        } else {
            break;
        }
    }
    const mpt_node *d = N(m, p);
    int e, e2, s, s2;
    if (d->op != MPT_OP_DIV || !row_stat(m, d->in[1], MPT_OP_REDUCE_SUM, &e2) || e2 != d->in[0]) return 0;
    e = d->in[0];
    if (N(m, e)->op != MPT_OP_EXP || N(m, N(m, e)->in[0])->op != MPT_OP_SUB) return 0;
    const mpt_node *sub = N(m, N(m, e)->in[0]);
    if (!row_stat(m, sub->in[1], MPT_OP_REDUCE_MAX, &s2) || s2 != sub->in[0]) return 0;
    take(m, p);
    take(m, e);
    take(m, N(m, e)->in[0]);
    s = sub->in[0];
    m->reason = NULL;
    /* the mask */
    int x = s, score_attend = -1;
    const mpt_node *sn = N(m, s);
    double c;
    if (sn->op == MPT_OP_SELECT && is_const(m, sn->in[1], &c) && c <= MASKED_SCORE) {
        take(m, s);
        x = sn->in[2];
        if (is_later(m, sn->in[0])) m->causal = 1;
        else m->reason = "a mask the kernel cannot read (masked where a value other than the causal test is true)";
    } else if (sn->op == MPT_OP_SELECT && is_const(m, sn->in[2], &c) && c <= MASKED_SCORE) {
        take(m, s);
        x = sn->in[1];
        score_attend = sn->in[0];
        split_attend(m, score_attend);
    }
    /* the scores */
    m->scale = 1.0;
    if (N(m, x)->op == MPT_OP_MUL && is_const(m, N(m, x)->in[1], &m->scale)) {
        take(m, x);
        x = N(m, x)->in[0];
    }
    const mpt_node *qk = N(m, x);
    if (qk->op != MPT_OP_BATCH_MATMUL || qk->shape.rank != 4 || qk->attr.i[0] || !qk->attr.i[1]) {
        if (!m->reason) m->reason = "the scores are not a batch_matmul(q, k, trans_b) (times a constant)";
        return 1;
    }
    take(m, x);
    m->q = qk->in[0];
    m->k = qk->in[1];
    m->zero_masked = zero_attend >= 0;
    if (m->reason) return 1;
    if (dropout == 2) {
        m->reason = "dropout on the attention probabilities in a form the kernel does not draw "
                    "(select(not(lt(random_uniform, rate)), p * c, 0) with an f32 or f64 rate)";
        return 1;
    }
    if (qk->dtype != MPT_DT_F32 && qk->dtype != MPT_DT_F64) { /* f64: the interpreter's gradient checks */
        m->reason = "the scores are not f32 (the fused kernel keeps them and the softmax in f32)";
        return 1;
    }
    if (zero_attend >= 0 && zero_attend != score_attend) {
        m->reason = "the select zeroing the probabilities reads another mask than the scores' select";
        return 1;
    }
    if (score_attend >= 0 && zero_attend < 0) {
        m->reason = "a padding mask without the select that zeroes its probabilities (a fully "
                    "masked row's statistics would not survive f32)";
        return 1;
    }
    m->mask_rank = 2;
    if (m->attend >= 0 && !(m->mask_rank = mask_rank(m, m->attend))) {
        m->reason = "the mask differs between heads or is not built from broadcasts of [B, Tk] or "
                    "[B, Tq, Tk] values";
        return 1;
    }
    /* nothing inside may be read from outside */
    for (int i = 0; i < m->n_taken; i++) {
        int t = m->taken[i], inside = 0;
        for (int j = 0; j < m->n_taken; j++) {
            const mpt_node *u = N(m, m->taken[j]);
            for (int k = 0; k < u->n_in; k++) inside += u->in[k] == t;
        }
        inside += N(m, pv)->in[0] == t;
        if (m->uses[t] != inside) {
            m->reason = "a value inside attention (scores or probabilities) is read elsewhere";
            return 1;
        }
    }
    if (m->n_taken == MAX_TAKEN) m->reason = "attention pattern longer than the matcher follows";
    return 1;
}

/* the head-free mask of the tree at id, built in out from mapped nodes:
 * rank 2 [B, Tk] or 3 [B, Tq, Tk] */
static int build_mask(const mpt_graph *g, mpt_graph *out, const int *map, int id, mpt_shape ms) {
    const mpt_node *n = &g->nodes[id];
    if (n->op == MPT_OP_CONST) return mpt_b_const(out, n->dtype, ms, n->attr.f);
    if (n->op == MPT_OP_BROADCAST) {
        int x = map[n->in[0]];
        int leaf_rank = n->attr.i[0] == 0x9 ? 2 : 3;
        if (leaf_rank == ms.rank) return x;
        return mpt_b_broadcast(out, x, ms, 0x5); /* [B, Tk] -> [B, Tq, Tk] */
    }
    int a = build_mask(g, out, map, n->in[0], ms);
    if (n->n_in == 1) return mpt_b_unary(out, n->op, a);
    return mpt_b_binary(out, n->op, a, build_mask(g, out, map, n->in[1], ms));
}

static void describe(const match *m, char *buf, size_t len) {
    if (m->q < 0) {
        snprintf(buf, len, "softmax . V without Q.K^T scores");
        return;
    }
    const mpt_node *q = N(m, m->q);
    int o = snprintf(buf, len, "%s%s%s%s, scale %g, T %lld x %lld, ops", m->causal ? "causal" : "not causal",
                     m->attend >= 0 ? (m->mask_rank == 2 ? ", mask [B, Tk]" : ", mask [B, Tq, Tk]") : "",
                     m->zero_masked ? ", masked rows zeroed" : "", m->drop_below ? ", dropout" : "", m->scale,
                     (long long)q->shape.dim[2], (long long)N(m, m->k)->shape.dim[2]);
    /* the ops it took, in graph order */
    int sorted[MAX_TAKEN + 1], n = 0;
    for (int i = 0; i < m->n_taken; i++) sorted[n++] = m->taken[i];
    sorted[n++] = m->pv;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
            int t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
    for (int i = 0; i < n && o > 0 && (size_t)o < len; i++)
        o += snprintf(buf + o, len - (size_t)o, " %s", mpt_op_name(N(m, sorted[i])->op));
}

/* transpose [B,T,H,E] <-> [B,H,T,E], ops.def's packed perm (0, 2, 1, 3) */
#define HEADS ((const int[]){0, 2, 1, 3})
#define HEADS_PACKED 0x3120

static int is_heads_transpose(const mpt_graph *g, int id) {
    const mpt_node *n = &g->nodes[id];
    return n->op == MPT_OP_TRANSPOSE && n->shape.rank == 4 && n->attr.i[0] == HEADS_PACKED;
}

/* node i of g into out, except a heads transpose of a heads transpose
 * (the fused attention's o, transposed back, then again by its reader),
 * which is the inner value */
static int copy_or_cancel(mpt_graph *out, const mpt_graph *g, int i, const int *map) {
    if (is_heads_transpose(g, i)) {
        int x = map[g->nodes[i].in[0]];
        if (is_heads_transpose(out, x)) return out->nodes[x].in[0];
    }
    return mpt_graph_copy_node(out, g, i, map);
}

mpt_graph *mpt_attention_rewrite(const mpt_graph *g, const char *refuse_all, int layout,
                                 mpt_attention_note **notes, int *n_notes) {
    *notes = NULL;
    *n_notes = 0;
    int n = g->n_nodes, fused = 0, cap = 0;
    int *uses = mpt_graph_use_counts(g);
    int *map = malloc(((size_t)n + 1) * sizeof *map);
    mpt_graph *out = mpt_graph_new(g->name);
    if (!uses || !map || !out) goto fail;
    for (int i = 0; i < n; i++) {
        match m = {.g = g, .uses = uses, .attend = -1, .q = -1, .k = -1, .drop_counter = -1};
        if (!match_at(&m, i)) {
            map[i] = copy_or_cancel(out, g, i, map);
            continue;
        }
        if (!m.reason && refuse_all) m.reason = refuse_all;
        if (*n_notes == cap) {
            cap = cap ? 2 * cap : 8;
            mpt_attention_note *nv = realloc(*notes, (size_t)cap * sizeof *nv);
            if (!nv) goto fail;
            *notes = nv;
        }
        mpt_attention_note *note = &(*notes)[(*n_notes)++];
        memset(note, 0, sizeof *note);
        note->node = i;
        note->reason = m.reason;
        snprintf(note->layer, sizeof note->layer, "%s", g->nodes[i].layer ? g->nodes[i].layer : "-");
        describe(&m, note->what, sizeof note->what);
        if (m.reason) {
            map[i] = mpt_graph_copy_node(out, g, i, map);
            continue;
        }
        mpt_b_layer(out, g->nodes[i].layer);
        const mpt_node *q = N(&m, m.q);
        mpt_shape ms = m.mask_rank == 2 ? mpt_shape_2(q->shape.dim[0], N(&m, m.k)->shape.dim[2])
                                        : mpt_shape_make(3, (int64_t[]){q->shape.dim[0], q->shape.dim[2],
                                                                        N(&m, m.k)->shape.dim[2]});
        int mask = m.attend >= 0 ? build_mask(g, out, map, m.attend, ms)
                                 : mpt_b_const(out, MPT_DT_BOOL, ms, 1.0);
        int f32_out = g->nodes[i].dtype == MPT_DT_F32 && N(&m, m.v)->dtype != MPT_DT_F32;
        int counter = m.drop_counter >= 0 ? map[m.drop_counter]
                                          : mpt_b_const(out, MPT_DT_I32, mpt_shape_scalar(), 0);
        /* q, k and v transposed from [B,T,H,E] (multi_head_attention's
         * projections): the op reads them in place and writes o so too,
         * transposed back for the graph's readers, who mostly transpose
         * it again (copy_or_cancel drops such pairs) */
        int bthd = layout && is_heads_transpose(g, m.q) && is_heads_transpose(g, m.k) &&
                   is_heads_transpose(g, m.v);
        int in[5] = {map[m.q], map[m.k], map[m.v], mask, counter};
        if (bthd)
            for (int x = 0; x < 3; x++) in[x] = map[g->nodes[x == 0 ? m.q : x == 1 ? m.k : m.v].in[0]];
        mpt_attr a = {.i = {m.causal, m.zero_masked, f32_out, m.drop_seed, m.drop_below, m.drop_scale, bthd},
                      .f = m.scale};
        map[i] = mpt_b_attention(out, in, &a);
        if (bthd) map[i] = mpt_b_transpose(out, map[i], HEADS);
        mpt_b_layer(out, NULL);
        fused++;
    }
    for (int i = 0; i < g->n_outputs; i++) mpt_graph_add_output(out, g->outputs[i].name, map[g->outputs[i].node]);
    for (int i = 0; i < g->n_updates; i++) mpt_graph_add_update(out, map[g->updates[i].var], map[g->updates[i].value]);
    free(uses);
    free(map);
    if (!fused) {
        mpt_graph_free(out);
        return NULL;
    }
    mpt_graph *dce = mpt_graph_dce(out, NULL);
    mpt_graph_free(out);
    return dce;
fail:
    free(uses);
    free(map);
    if (out) mpt_graph_free(out);
    return NULL;
}
