/* ir/infer.c — shape and dtype inference: what each op yields from its
 * inputs and attributes. The builder calls it on every new node; the
 * verifier calls it again on every node of a finished graph. */
#include <assert.h>

#include "ir/ir.h"

static int is_float(mpt_dtype dt) { return mpt_dtype_is_float(dt); }

static const char *same_inputs(const mpt_graph *g, int n_in, const int *in) {
    for (int k = 1; k < n_in; k++) {
        const mpt_node *a = &g->nodes[in[0]], *b = &g->nodes[in[k]];
        if (!mpt_shape_eq(a->shape, b->shape))
            return "elementwise inputs differ in shape (widen with broadcast first)";
        if (a->dtype != b->dtype) return "elementwise inputs differ in dtype (insert a cast)";
    }
    return NULL;
}

static const char *infer_pool_like(const mpt_shape x, const mpt_attr *a, mpt_shape *out) {
    if (x.rank != 4) return "pooling needs an NHWC input of rank 4";
    int64_t wh = a->i[0], ww = a->i[1], sh = a->i[2], sw = a->i[3], ph = a->i[4], pw = a->i[5];
    if (wh <= 0 || ww <= 0 || sh <= 0 || sw <= 0 || ph < 0 || pw < 0)
        return "pooling window, strides and padding must be positive";
    if (out->rank != 4 || out->dim[0] != x.dim[0] || out->dim[3] != x.dim[3])
        return "pooling output must be NHWC with the input's batch and channels";
    /* bottom/right padding is implied by the output size; it must be sane */
    int64_t hi_h = (out->dim[1] - 1) * sh + wh - x.dim[1] - ph;
    int64_t hi_w = (out->dim[2] - 1) * sw + ww - x.dim[2] - pw;
    /* a strided "valid" window may leave up to stride-1 trailing rows unread */
    if (out->dim[1] < 1 || out->dim[2] < 1 || hi_h <= -sh || hi_w <= -sw || hi_h >= wh + sh ||
        hi_w >= ww + sw)
        return "pooling output size does not follow from input, window, strides and padding";
    return NULL;
}

/* x NHWC, w HWIO, y NHWC: checks the three agree under the attributes. */
static const char *check_conv(mpt_shape x, mpt_shape w, mpt_shape y, const mpt_attr *a) {
    if (x.rank != 4 || w.rank != 4 || y.rank != 4)
        return "conv2d needs NHWC activations and an HWIO filter (rank 4)";
    int64_t sh = a->i[0], sw = a->i[1], ph = a->i[2], pw = a->i[3];
    if (sh <= 0 || sw <= 0 || ph < 0 || pw < 0) return "conv2d strides must be positive and padding non-negative";
    if (w.dim[2] != x.dim[3]) return "conv2d filter input channels differ from the input's channels";
    if (w.dim[3] != y.dim[3]) return "conv2d filter output channels differ from the output's channels";
    if (x.dim[0] != y.dim[0]) return "conv2d input and output batch differ";
    int64_t hi_h = (y.dim[1] - 1) * sh + w.dim[0] - x.dim[1] - ph;
    int64_t hi_w = (y.dim[2] - 1) * sw + w.dim[1] - x.dim[2] - pw;
    /* a strided "valid" convolution may leave up to stride-1 trailing rows unread */
    if (y.dim[1] < 1 || y.dim[2] < 1 || hi_h <= -sh || hi_w <= -sw || hi_h >= w.dim[0] + sh ||
        hi_w >= w.dim[1] + sw)
        return "conv2d output size does not follow from input, filter, strides and padding";
    return NULL;
}

/* attention's q [B,H,Tq,E], k [B,H,Tk,E], v [B,H,Tk,Ev] (v may be NULL)
 * of one float dtype, and its mask bool [B,Tk] or [B,Tq,Tk] */
static const char *check_attention(const mpt_node *q, const mpt_node *k, const mpt_node *v,
                                   const mpt_node *m) {
    if (q->shape.rank != 4 || k->shape.rank != 4 || (v && v->shape.rank != 4))
        return "attention needs q, k, v of rank 4 [B,H,T,E]";
    if (!is_float(q->dtype) || k->dtype != q->dtype || (v && v->dtype != q->dtype))
        return "attention's q, k and v must share a float dtype";
    for (int d = 0; d < 2; d++)
        if (k->shape.dim[d] != q->shape.dim[d] || (v && v->shape.dim[d] != q->shape.dim[d]))
            return "attention's q, k and v differ in batch or heads";
    if (k->shape.dim[3] != q->shape.dim[3]) return "attention's q and k differ in their last dim";
    if (v && v->shape.dim[2] != k->shape.dim[2]) return "attention's k and v differ in length";
    int64_t b = q->shape.dim[0], tq = q->shape.dim[2], tk = k->shape.dim[2];
    int ok = m->dtype == MPT_DT_BOOL &&
             ((m->shape.rank == 2 && m->shape.dim[0] == b && m->shape.dim[1] == tk) ||
              (m->shape.rank == 3 && m->shape.dim[0] == b && m->shape.dim[1] == tq &&
               m->shape.dim[2] == tk));
    return ok ? NULL : "attention's mask must be bool [B,Tk] or [B,Tq,Tk]";
}

const char *mpt_infer(const mpt_graph *g, mpt_op op, int n_in, const int *in,
                      const mpt_attr *attr, mpt_shape *shape, mpt_dtype *dt) {
    if (op < 0 || op >= MPT_OP_COUNT) return "unknown op";
    if (n_in != mpt_op_table[op].arity) return "wrong number of inputs for this op";
    for (int k = 0; k < n_in; k++)
        if (in[k] < 0 || in[k] >= g->n_nodes) return "input is not an earlier node";
    const mpt_node *a = n_in > 0 ? &g->nodes[in[0]] : NULL;
    const mpt_node *b = n_in > 1 ? &g->nodes[in[1]] : NULL;
    const mpt_node *c = n_in > 2 ? &g->nodes[in[2]] : NULL;
    const char *e;

    switch (op) {
    case MPT_OP_INPUT:
    case MPT_OP_VARIABLE:
    case MPT_OP_CONST:
        return NULL; /* the caller's shape and dtype are the definition */
    case MPT_OP_IOTA:
        if (attr->i[0] < 0 || attr->i[0] >= shape->rank) return "iota axis out of range";
        return NULL;
    case MPT_OP_RANDOM_UNIFORM:
        if (a->dtype != MPT_DT_I32 || a->shape.rank != 0)
            return "random_uniform needs an i32 scalar counter";
        if (!is_float(*dt)) return "random_uniform yields a float dtype";
        return NULL;

    case MPT_OP_NEG: case MPT_OP_ABS: case MPT_OP_EXP: case MPT_OP_LOG:
    case MPT_OP_SQRT: case MPT_OP_RSQRT: case MPT_OP_RECIP: case MPT_OP_SQUARE:
    case MPT_OP_RELU: case MPT_OP_SIGMOID: case MPT_OP_TANH: case MPT_OP_GELU:
    case MPT_OP_GELU_GRAD: case MPT_OP_SIN: case MPT_OP_COS:
        if (!is_float(a->dtype) && !(a->dtype == MPT_DT_I32 &&
                                      (op == MPT_OP_NEG || op == MPT_OP_ABS || op == MPT_OP_SQUARE)))
            return "this op needs a float input";
        *shape = a->shape;
        *dt = a->dtype;
        return NULL;
    case MPT_OP_CAST:
        if (attr->dt < 0 || attr->dt >= MPT_DT_COUNT) return "cast to an unknown dtype";
        *shape = a->shape;
        *dt = attr->dt;
        return NULL;
    case MPT_OP_IS_FINITE:
        if (!is_float(a->dtype)) return "is_finite needs a float input";
        *shape = a->shape;
        *dt = MPT_DT_BOOL;
        return NULL;
    case MPT_OP_ALLREDUCE:
        if (a->dtype != MPT_DT_F32 && a->dtype != MPT_DT_F64)
            return "allreduce sums f32 (or f64) values only";
        *shape = a->shape;
        *dt = a->dtype;
        return NULL;
    case MPT_OP_REDUCE_SCATTER:
    case MPT_OP_ALL_GATHER:
    case MPT_OP_RANK_SLICE:
        if (op == MPT_OP_REDUCE_SCATTER && a->dtype != MPT_DT_F32 && a->dtype != MPT_DT_F64)
            return "reduce_scatter sums f32 (or f64) values only";
        if (op == MPT_OP_ALL_GATHER && a->dtype != MPT_DT_F32 && a->dtype != MPT_DT_F64 &&
            a->dtype != MPT_DT_I32)
            return "all_gather moves f32, f64 or i32 values only";
        if (op == MPT_OP_RANK_SLICE && !is_float(a->dtype)) return "rank_slice takes a float value";
        if (a->shape.rank != 1 || shape->rank != 1 || shape->dim[0] < 1 || a->shape.dim[0] < 1)
            return "a rank's shard and the whole are both flat ([s] and [n])";
        if (op == MPT_OP_ALL_GATHER ? shape->dim[0] < a->shape.dim[0]
                                    : shape->dim[0] > a->shape.dim[0])
            return "a shard is no larger than the whole";
        *dt = a->dtype;
        return NULL;
    case MPT_OP_NOT:
        if (a->dtype != MPT_DT_BOOL) return "not needs a bool input";
        *shape = a->shape;
        *dt = MPT_DT_BOOL;
        return NULL;

    case MPT_OP_ADD: case MPT_OP_SUB: case MPT_OP_MUL: case MPT_OP_DIV:
    case MPT_OP_MAX: case MPT_OP_MIN: case MPT_OP_POW:
        if ((e = same_inputs(g, n_in, in))) return e;
        if (a->dtype == MPT_DT_BOOL) return "arithmetic on bool";
        *shape = a->shape;
        *dt = a->dtype;
        return NULL;
    case MPT_OP_LT: case MPT_OP_GT: case MPT_OP_EQ:
        if ((e = same_inputs(g, n_in, in))) return e;
        *shape = a->shape;
        *dt = MPT_DT_BOOL;
        return NULL;
    case MPT_OP_AND:
        if ((e = same_inputs(g, n_in, in))) return e;
        if (a->dtype != MPT_DT_BOOL) return "and needs bool inputs";
        *shape = a->shape;
        *dt = MPT_DT_BOOL;
        return NULL;
    case MPT_OP_SELECT:
        if (a->dtype != MPT_DT_BOOL) return "select's condition must be bool";
        if (!mpt_shape_eq(a->shape, b->shape)) return "select's condition and values differ in shape";
        if ((e = same_inputs(g, 2, in + 1))) return e;
        *shape = b->shape;
        *dt = b->dtype;
        (void)c;
        return NULL;

    case MPT_OP_REDUCE_SUM:
    case MPT_OP_REDUCE_MAX:
    case MPT_OP_REDUCE_ALL: {
        int64_t axes = attr->i[0];
        if (axes <= 0 || axes >= (1LL << a->shape.rank)) return "reduction axes out of range";
        if (op == MPT_OP_REDUCE_ALL ? a->dtype != MPT_DT_BOOL : a->dtype == MPT_DT_BOOL)
            return op == MPT_OP_REDUCE_ALL ? "reduce_all needs bool" : "this reduction needs numbers";
        mpt_shape s = {0};
        for (int d = 0; d < a->shape.rank; d++)
            if (!(axes & (1LL << d))) s.dim[s.rank++] = a->shape.dim[d];
        *shape = s;
        *dt = a->dtype;
        return NULL;
    }
    case MPT_OP_ARGMAX: {
        int64_t ax = attr->i[0];
        if (ax < 0 || ax >= a->shape.rank) return "argmax axis out of range";
        mpt_shape s = {0};
        for (int d = 0; d < a->shape.rank; d++)
            if (d != ax) s.dim[s.rank++] = a->shape.dim[d];
        *shape = s;
        *dt = MPT_DT_I32;
        return NULL;
    }

    case MPT_OP_BROADCAST: {
        int64_t dims = attr->i[0];
        if (dims < 0 || dims >= (1LL << shape->rank)) return "broadcast dims out of range";
        int k = 0;
        for (int d = 0; d < shape->rank; d++)
            if (dims & (1LL << d)) {
                if (k >= a->shape.rank) return "broadcast maps more dims than the input has";
                if (a->shape.dim[k] != shape->dim[d] && a->shape.dim[k] != 1)
                    return "broadcast: an input dim is neither 1 nor the output's";
                k++;
            }
        if (k != a->shape.rank) return "broadcast must map every input dim";
        *dt = a->dtype;
        return NULL;
    }
    case MPT_OP_RESHAPE:
        if (mpt_shape_numel(*shape) != mpt_shape_numel(a->shape))
            return "reshape changes the number of elements";
        *dt = a->dtype;
        return NULL;
    case MPT_OP_TRANSPOSE: {
        int seen = 0;
        mpt_shape s = {a->shape.rank, {0}};
        for (int d = 0; d < a->shape.rank; d++) {
            int p = (int)((attr->i[0] >> (4 * d)) & 0xf);
            if (p >= a->shape.rank || (seen & (1 << p))) return "transpose perm is not a permutation";
            seen |= 1 << p;
            s.dim[d] = a->shape.dim[p];
        }
        *shape = s;
        *dt = a->dtype;
        return NULL;
    }
    case MPT_OP_ONE_HOT: {
        if (a->dtype != MPT_DT_I32) return "one_hot needs i32 ids";
        if (attr->i[0] <= 0) return "one_hot depth must be positive";
        if (a->shape.rank >= MPT_MAX_DIMS) return "one_hot: too many dims";
        mpt_shape s = a->shape;
        s.dim[s.rank++] = attr->i[0];
        *shape = s;
        if (!is_float(*dt)) *dt = MPT_DT_F32;
        return NULL;
    }
    case MPT_OP_GATHER: {
        if (a->shape.rank != 2) return "gather's table must be [V, D]";
        if (b->dtype != MPT_DT_I32) return "gather's ids must be i32";
        if (b->shape.rank >= MPT_MAX_DIMS) return "gather: too many dims";
        mpt_shape s = b->shape;
        s.dim[s.rank++] = a->shape.dim[1];
        *shape = s;
        *dt = a->dtype;
        return NULL;
    }
    case MPT_OP_SCATTER_ADD: {
        if (a->dtype != MPT_DT_I32) return "scatter_add's ids must be i32";
        if (b->shape.rank != a->shape.rank + 1) return "scatter_add's updates must be [ids..., D]";
        for (int d = 0; d < a->shape.rank; d++)
            if (a->shape.dim[d] != b->shape.dim[d]) return "scatter_add's updates must be [ids..., D]";
        if (attr->i[0] <= 0) return "scatter_add rows must be positive";
        *shape = mpt_shape_2(attr->i[0], b->shape.dim[b->shape.rank - 1]);
        *dt = b->dtype;
        return NULL;
    }
    case MPT_OP_SLICE: {
        int64_t ax = attr->i[0], start = attr->i[1];
        if (ax < 0 || ax >= a->shape.rank) return "slice axis out of range of the input's rank";
        if (shape->rank != a->shape.rank) return "slice changes the rank";
        for (int d = 0; d < a->shape.rank; d++)
            if (d != ax && shape->dim[d] != a->shape.dim[d])
                return "slice changes a dim other than its axis";
        if (shape->dim[ax] < 1) return "slice length must be positive";
        if (start < 0 || start > a->shape.dim[ax] - shape->dim[ax])
            return "slice [start, start+len) is not within the input along the axis";
        *dt = a->dtype;
        return NULL;
    }
    case MPT_OP_CONCAT: {
        int64_t ax = attr->i[0];
        if (a->dtype != b->dtype) return "concat inputs differ in dtype (insert a cast)";
        if (a->shape.rank != b->shape.rank) return "concat inputs differ in rank";
        if (ax < 0 || ax >= a->shape.rank) return "concat axis out of range of the inputs' rank";
        for (int d = 0; d < a->shape.rank; d++)
            if (d != ax && a->shape.dim[d] != b->shape.dim[d])
                return "concat inputs differ in a dim other than the axis";
        if (a->shape.dim[ax] < 1 || b->shape.dim[ax] < 1)
            return "concat inputs must be non-empty along the axis";
        mpt_shape s = a->shape;
        s.dim[ax] += b->shape.dim[ax];
        *shape = s;
        *dt = a->dtype;
        return NULL;
    }

    case MPT_OP_MATMUL: {
        if (a->shape.rank != 2 || b->shape.rank != 2) return "matmul needs rank-2 operands";
        if (a->dtype != b->dtype) return "matmul operands differ in dtype (insert a cast)";
        if (!is_float(a->dtype)) return "matmul needs float operands";
        int64_t m = attr->i[0] ? a->shape.dim[1] : a->shape.dim[0];
        int64_t ka = attr->i[0] ? a->shape.dim[0] : a->shape.dim[1];
        int64_t kb = attr->i[1] ? b->shape.dim[1] : b->shape.dim[0];
        int64_t n = attr->i[1] ? b->shape.dim[0] : b->shape.dim[1];
        if (ka != kb) return "matmul inner dimensions differ";
        *shape = mpt_shape_2(m, n);
        *dt = a->dtype;
        return NULL;
    }
    case MPT_OP_BATCH_MATMUL: {
        int r = a->shape.rank;
        if (r < 3 || r > 4) return "batch_matmul needs operands of rank 3 or 4";
        if (b->shape.rank != r) return "batch_matmul operands differ in rank";
        for (int d = 0; d < r - 2; d++)
            if (a->shape.dim[d] != b->shape.dim[d])
                return "batch_matmul batch dims differ (it does not broadcast)";
        if (a->dtype != b->dtype) return "batch_matmul operands differ in dtype (insert a cast)";
        if (!is_float(a->dtype)) return "batch_matmul needs float operands";
        const int64_t *ad = a->shape.dim + r - 2, *bd = b->shape.dim + r - 2;
        int64_t m = attr->i[0] ? ad[1] : ad[0], ka = attr->i[0] ? ad[0] : ad[1];
        int64_t kb = attr->i[1] ? bd[1] : bd[0], n = attr->i[1] ? bd[0] : bd[1];
        if (ka != kb) return "batch_matmul inner dimensions differ";
        mpt_shape s = a->shape;
        s.dim[r - 2] = m;
        s.dim[r - 1] = n;
        *shape = s;
        *dt = attr->i[2] ? MPT_DT_F32 : a->dtype;
        return NULL;
    }
    case MPT_OP_ATTENTION:
    case MPT_OP_ATTENTION_LSE:
    case MPT_OP_ATTENTION_GRAD: {
        const mpt_node *m = &g->nodes[in[op == MPT_OP_ATTENTION_LSE ? 2 : op == MPT_OP_ATTENTION ? 3 : 6]];
        int64_t bthd = attr->i[op == MPT_OP_ATTENTION_LSE ? 1 : 6];
        if (bthd != 0 && bthd != 1) return "attention's bthd is 0 or 1";
        /* the checks read [B,H,T,E]; a bthd op's operands are stored [B,T,H,E] */
        const mpt_node *v = op == MPT_OP_ATTENTION_LSE ? NULL : c;
        mpt_node qa = *a, ka = *b, va = v ? *v : *a;
        if (bthd) {
            const mpt_node *st[3] = {a, b, v};
            mpt_node *lg[3] = {&qa, &ka, &va};
            for (int x = 0; x < 3; x++)
                if (st[x] && st[x]->shape.rank == 4) {
                    lg[x]->shape.dim[1] = st[x]->shape.dim[2];
                    lg[x]->shape.dim[2] = st[x]->shape.dim[1];
                }
        }
        if ((e = check_attention(&qa, &ka, v ? &va : NULL, m))) return e;
        if (op != MPT_OP_ATTENTION_LSE) {
            const mpt_node *n = &g->nodes[in[op == MPT_OP_ATTENTION ? 4 : 7]];
            if (n->dtype != MPT_DT_I32 || n->shape.rank != 0) return "attention's counter must be i32[]";
            if (attr->i[4] < 0 || attr->i[4] > (1 << 24)) return "attention's drop_below is in [0, 2^24]";
        }
        mpt_shape s = a->shape;
        if (op == MPT_OP_ATTENTION) {
            s.dim[3] = c->shape.dim[3];
            *shape = s;
            *dt = attr->i[2] ? MPT_DT_F32 : c->dtype;
            return NULL;
        }
        if (op == MPT_OP_ATTENTION_LSE) { /* f32; f64 in the interpreter's gradient checks */
            s = qa.shape;
            s.rank = 3;
            *shape = s;
            *dt = a->dtype == MPT_DT_F64 ? MPT_DT_F64 : MPT_DT_F32;
            return NULL;
        }
        /* o and do as the attention's output, lse as attention_lse's */
        const mpt_node *o = &g->nodes[in[3]], *d = &g->nodes[in[4]], *l = &g->nodes[in[5]];
        s.dim[3] = c->shape.dim[3];
        if (!mpt_shape_eq(o->shape, s) || !mpt_shape_eq(d->shape, s) || !is_float(o->dtype) ||
            !is_float(d->dtype))
            return "attention_grad's o and do must be float [B,H,Tq,Ev] (bthd: [B,Tq,H,Ev])";
        s = qa.shape;
        s.rank = 3;
        if (!mpt_shape_eq(l->shape, s) || l->dtype != (a->dtype == MPT_DT_F64 ? MPT_DT_F64 : MPT_DT_F32))
            return "attention_grad's lse must be f32 [B,H,Tq] (f64 for f64 inputs)";
        if (attr->i[0] < 0 || attr->i[0] > 2) return "attention_grad's which is 0 (dq), 1 (dk) or 2 (dv)";
        const mpt_node *w = attr->i[0] == 0 ? a : attr->i[0] == 1 ? b : c;
        *shape = w->shape;
        *dt = w->dtype;
        return NULL;
    }
    case MPT_OP_CONV2D:
        if (a->dtype != b->dtype || !is_float(a->dtype)) return "conv2d operands must share a float dtype";
        if ((e = check_conv(a->shape, b->shape, *shape, attr))) return e;
        *dt = a->dtype;
        return NULL;
    case MPT_OP_CONV2D_BWD_DATA: /* dy, w -> dx */
        if (a->dtype != b->dtype || !is_float(a->dtype)) return "conv2d operands must share a float dtype";
        if ((e = check_conv(*shape, b->shape, a->shape, attr))) return e;
        *dt = a->dtype;
        return NULL;
    case MPT_OP_CONV2D_BWD_FILTER: /* x, dy -> dw */
        if (a->dtype != b->dtype || !is_float(a->dtype)) return "conv2d operands must share a float dtype";
        if ((e = check_conv(a->shape, *shape, b->shape, attr))) return e;
        *dt = a->dtype;
        return NULL;

    case MPT_OP_MAX_POOL:
    case MPT_OP_AVG_POOL:
        if (!is_float(a->dtype)) return "pooling needs a float input";
        if ((e = infer_pool_like(a->shape, attr, shape))) return e;
        *dt = a->dtype;
        return NULL;
    case MPT_OP_MAX_POOL_GRAD: { /* x, dy -> dx */
        mpt_shape y = b->shape;
        if ((e = infer_pool_like(a->shape, attr, &y))) return e;
        if (a->dtype != b->dtype) return "max_pool_grad operands differ in dtype";
        *shape = a->shape;
        *dt = a->dtype;
        return NULL;
    }
    case MPT_OP_AVG_POOL_GRAD: { /* dy -> dx */
        mpt_shape y = a->shape;
        if ((e = infer_pool_like(*shape, attr, &y))) return e;
        *dt = a->dtype;
        return NULL;
    }
    case MPT_OP_COUNT:
        break;
    }
    return "unknown op";
}
