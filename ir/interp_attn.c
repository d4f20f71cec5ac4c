/* ir/interp_attn.c — the definition of the fused attention ops
 * (attention, attention_lse, attention_grad; ops.def), in doubles like
 * every op of the interpreter: each (batch, head) is a small dense
 * problem computed exactly and rounded once, by the caller, to the
 * node's dtype.
 *
 * Per (b, h), with q [Tq,E], k [Tk,E], v [Tk,Ev]:
 *   s_ij  = scale q_i.k_j, or -1e9 where (i, j) is masked
 *   lse_i = log sum_j exp(s_ij)                       (attention_lse)
 *   p_ij  = exp(s_ij - lse_i); p'_ij = 0 where masked and zero_masked,
 *           else p_ij, times d_ij: dropout's 0 or 1 / (1 - rate)
 *   o_i   = sum_j p'_ij v_j                           (attention)
 * and the gradient (FlashAttention-2's, from the given o and lse):
 *   D_i   = do_i.o_i
 *   dS_ij = 0 where masked, else p_ij (d_ij do_i.v_j - D_i)
 *   dq_i  = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i,
 *   dv_j  = sum_i p'_ij do_i                          (attention_grad)
 * D_i = sum_j p'_ij (do_i.v_j) holds because o_i = sum_j p'_ij v_j; with
 * zero_masked a masked dP' never reaches the scores, without it the mask
 * set those scores to a constant, so dS is 0 there either way. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/interp_impl.h"

typedef struct {
    int64_t B, H, Tq, Tk, E, Ev;
    int causal, zero_masked, mask_rank, bthd;
    double scale;
    const double *mask;
    int64_t drop_seed, drop_below; /* dropout: drop_below 0 is none */
    int32_t counter;
    double drop_scale;
} attn_geom;

static attn_geom geom(const mpt_graph *g, const mpt_node *nd, int mask_in, const double *mask) {
    const mpt_node *q = &g->nodes[nd->in[0]], *k = &g->nodes[nd->in[1]];
    const mpt_node *m = &g->nodes[nd->in[mask_in]];
    int bthd = (int)nd->attr.i[nd->op == MPT_OP_ATTENTION_LSE ? 1 : 6];
    attn_geom a = {.B = q->shape.dim[0], .H = q->shape.dim[bthd ? 2 : 1], .Tq = q->shape.dim[bthd ? 1 : 2],
                   .Tk = k->shape.dim[bthd ? 1 : 2], .E = q->shape.dim[3], .Ev = 0, .bthd = bthd,
                   .mask_rank = m->shape.rank, .scale = nd->attr.f, .mask = mask};
    if (nd->op == MPT_OP_ATTENTION) a.causal = (int)nd->attr.i[0], a.zero_masked = (int)nd->attr.i[1];
    if (nd->op == MPT_OP_ATTENTION_LSE) a.causal = (int)nd->attr.i[0];
    if (nd->op == MPT_OP_ATTENTION_GRAD) a.causal = (int)nd->attr.i[1], a.zero_masked = (int)nd->attr.i[2];
    if (nd->op != MPT_OP_ATTENTION_LSE) {
        a.Ev = g->nodes[nd->in[2]].shape.dim[3];
        a.drop_seed = nd->attr.i[3];
        a.drop_below = nd->attr.i[4];
        uint32_t bits = (uint32_t)nd->attr.i[5];
        float f;
        memcpy(&f, &bits, 4);
        a.drop_scale = f;
    }
    return a;
}

/* dropout's factor at (bh, i, j): 0, or 1 / (1 - rate); random_uniform's
 * 24 bits (ir/interp.c) at the position's index in [B,H,Tq,Tk] */
static double drop(const attn_geom *a, int64_t bh, int64_t i, int64_t j) {
    if (!a->drop_below) return 1;
    uint64_t bits = mpt_random_bits(a->drop_seed, a->counter, (bh * a->Tq + i) * a->Tk + j) >> 40;
    return bits < (uint64_t)a->drop_below ? 0 : a->drop_scale;
}

static int masked(const attn_geom *a, int64_t b, int64_t i, int64_t j) {
    if (a->causal && j > i) return 1;
    double m = a->mask_rank == 2 ? a->mask[b * a->Tk + j] : a->mask[(b * a->Tq + i) * a->Tk + j];
    return m == 0;
}

/* s [Tq, Tk] of head (b, h) */
static void scores(const attn_geom *a, int64_t b, const double *q, const double *k, double *s) {
    for (int64_t i = 0; i < a->Tq; i++)
        for (int64_t j = 0; j < a->Tk; j++) {
            double d = 0;
            for (int64_t e = 0; e < a->E; e++) d += q[i * a->E + e] * k[j * a->E + e];
            s[i * a->Tk + j] = masked(a, b, i, j) ? -1e9 : a->scale * d;
        }
}

static double row_lse(const double *s, int64_t n) {
    double m = -INFINITY, l = 0;
    for (int64_t j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
    for (int64_t j = 0; j < n; j++) l += exp(s[j] - m);
    return m + log(l);
}

/* [B,T,H,D] <-> [B,H,T,D]: a bthd op's operands into the layout the
 * definition below reads (to 1), its result back (to 0) */
static void swap_th(const double *src, double *dst, int64_t B, int64_t H, int64_t T, int64_t D, int to_bhtd) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                int64_t bhtd = ((b * H + h) * T + t) * D, bthd = ((b * T + t) * H + h) * D;
                memcpy(dst + (to_bhtd ? bhtd : bthd), src + (to_bhtd ? bthd : bhtd), (size_t)D * sizeof *dst);
            }
}

static int attention_bhtd(const mpt_graph *g, const mpt_node *nd, double *const *vals, double *out);

int mpt_interp_attention(const mpt_graph *g, const mpt_node *nd, double *const *vals, double *out) {
    int mask_in = nd->op == MPT_OP_ATTENTION ? 3 : nd->op == MPT_OP_ATTENTION_LSE ? 2 : 6;
    attn_geom a = geom(g, nd, mask_in, NULL);
    if (!a.bthd) return attention_bhtd(g, nd, vals, out);
    /* copies of the [B,T,H,D] operands in [B,H,T,D], the result likewise */
    int64_t T[5] = {a.Tq, a.Tk, a.Tk, a.Tq, a.Tq}, D[5] = {a.E, a.E, a.Ev, a.Ev, a.Ev};
    int n_rows = nd->op == MPT_OP_ATTENTION_LSE ? 2 : nd->op == MPT_OP_ATTENTION ? 3 : 5;
    double **v = calloc((size_t)g->n_nodes, sizeof *v), *copy[5] = {0}, *res = NULL;
    int rc = -1;
    if (!v) return -1;
    memcpy(v, vals, (size_t)g->n_nodes * sizeof *v);
    for (int x = 0; x < n_rows; x++) {
        if (!(copy[x] = malloc((size_t)(a.B * a.H * T[x] * D[x] + 1) * sizeof *copy[x]))) goto done;
        swap_th(vals[nd->in[x]], copy[x], a.B, a.H, T[x], D[x], 1);
        v[nd->in[x]] = copy[x];
    }
    if (nd->op == MPT_OP_ATTENTION_LSE) {
        rc = attention_bhtd(g, nd, v, out);
        goto done;
    }
    int64_t which = nd->op == MPT_OP_ATTENTION_GRAD ? nd->attr.i[0] : 3;
    int64_t rt = which == 0 || which == 3 ? a.Tq : a.Tk, rd = which == 2 || which == 3 ? a.Ev : a.E;
    if (!(res = malloc((size_t)(a.B * a.H * rt * rd + 1) * sizeof *res))) goto done;
    if ((rc = attention_bhtd(g, nd, v, res)) == 0) swap_th(res, out, a.B, a.H, rt, rd, 0);
done:
    for (int x = 0; x < 5; x++) free(copy[x]);
    free(res);
    free(v);
    return rc;
}

/* the definition over [B,H,T,D] operands (a bthd op's, once vals holds
 * them in that layout) */
static int attention_bhtd(const mpt_graph *g, const mpt_node *nd, double *const *vals, double *out) {
    int mask_in = nd->op == MPT_OP_ATTENTION ? 3 : nd->op == MPT_OP_ATTENTION_LSE ? 2 : 6;
    attn_geom a = geom(g, nd, mask_in, vals[nd->in[mask_in]]);
    if (nd->op != MPT_OP_ATTENTION_LSE) a.counter = (int32_t)vals[nd->in[mask_in + 1]][0];
    const double *Q = vals[nd->in[0]], *K = vals[nd->in[1]];
    double *s = malloc((size_t)(a.Tq * a.Tk + 1) * sizeof *s);
    if (!s) return -1;
    int64_t which = nd->op == MPT_OP_ATTENTION_GRAD ? nd->attr.i[0] : 0;
    if (nd->op == MPT_OP_ATTENTION_GRAD)
        memset(out, 0, (size_t)mpt_shape_numel(nd->shape) * sizeof *out);
    for (int64_t bh = 0; bh < a.B * a.H; bh++) {
        int64_t b = bh / a.H;
        const double *q = Q + bh * a.Tq * a.E, *k = K + bh * a.Tk * a.E;
        scores(&a, b, q, k, s);
        if (nd->op == MPT_OP_ATTENTION_LSE) {
            for (int64_t i = 0; i < a.Tq; i++) out[bh * a.Tq + i] = row_lse(s + i * a.Tk, a.Tk);
            continue;
        }
        const double *v = vals[nd->in[2]] + bh * a.Tk * a.Ev;
        if (nd->op == MPT_OP_ATTENTION) {
            for (int64_t i = 0; i < a.Tq; i++) {
                double lse = row_lse(s + i * a.Tk, a.Tk), *o = out + (bh * a.Tq + i) * a.Ev;
                memset(o, 0, (size_t)a.Ev * sizeof *o);
                for (int64_t j = 0; j < a.Tk; j++) {
                    double p = a.zero_masked && masked(&a, b, i, j) ? 0 : exp(s[i * a.Tk + j] - lse);
                    p *= drop(&a, bh, i, j);
                    for (int64_t e = 0; e < a.Ev; e++) o[e] += p * v[j * a.Ev + e];
                }
            }
            continue;
        }
        const double *o = vals[nd->in[3]] + bh * a.Tq * a.Ev, *dO = vals[nd->in[4]] + bh * a.Tq * a.Ev;
        const double *lse = vals[nd->in[5]] + bh * a.Tq;
        double *dst = out + bh * (which == 0 ? a.Tq * a.E : which == 1 ? a.Tk * a.E : a.Tk * a.Ev);
        for (int64_t i = 0; i < a.Tq; i++) {
            double D = 0;
            for (int64_t e = 0; e < a.Ev; e++) D += dO[i * a.Ev + e] * o[i * a.Ev + e];
            for (int64_t j = 0; j < a.Tk; j++) {
                int mk = masked(&a, b, i, j);
                double p = exp(s[i * a.Tk + j] - lse[i]), dd = drop(&a, bh, i, j);
                if (which == 2) {
                    double pp = (a.zero_masked && mk ? 0 : p) * dd;
                    for (int64_t e = 0; e < a.Ev; e++) dst[j * a.Ev + e] += pp * dO[i * a.Ev + e];
                    continue;
                }
                if (mk) continue;
                double dp = 0;
                for (int64_t e = 0; e < a.Ev; e++) dp += dO[i * a.Ev + e] * v[j * a.Ev + e];
                double ds = a.scale * p * (dd * dp - D);
                if (which == 0)
                    for (int64_t e = 0; e < a.E; e++) dst[i * a.E + e] += ds * k[j * a.E + e];
                else
                    for (int64_t e = 0; e < a.E; e++) dst[j * a.E + e] += ds * q[i * a.E + e];
            }
        }
    }
    free(s);
    return 0;
}
