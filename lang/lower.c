/* lang/lower.c — a checked flat model to the IR forward graph.
 *
 * Every layer becomes primitive ops (softmax, batch norm, layer norm and
 * dropout included), all f32: the precision policy is a later pass. Shapes
 * in comments carry the batch dim B first. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "lang/lower_impl.h"

static mpt_shape with_batch(long batch, mpt_shape s) {
    mpt_shape r = {.rank = s.rank + 1};
    r.dim[0] = batch;
    for (int k = 0; k < s.rank; k++) r.dim[k + 1] = s.dim[k];
    return r;
}

mpt_shape mpt_lw_shape(const lowerer *lw, int node) { return lw->g->nodes[node].shape; }

int mpt_lw_fconst(lowerer *lw, mpt_shape s, double v) { return mpt_b_const(lw->g, MPT_DT_F32, s, v); }

static char *var_name(const char *layer, const char *weight) {
    size_t n = strlen(layer) + strlen(weight) + 2;
    char *s = malloc(n);
    snprintf(s, n, "%s/%s", layer, weight);
    return s;
}

int mpt_lw_weight(lowerer *lw, const mpt_flat_layer *L, const char *w, mpt_shape s, int init,
                  int64_t fan_in, int64_t fan_out, double f, int trainable) {
    char *name = var_name(L->name, w);
    int id = mpt_b_variable(lw->g, name, s, init, fan_in, fan_out, f, trainable);
    free(name);
    return id;
}

/* The mask of every dim but the last: where per-channel vectors broadcast. */
int64_t mpt_lw_all_but_last(int rank) { return ((1LL << rank) - 1) & ~(1LL << (rank - 1)); }

/* softmax over the last axis, stable: exp(x - max) / sum */
int mpt_lw_softmax(lowerer *lw, int x) {
    mpt_graph *g = lw->g;
    mpt_shape s = mpt_lw_shape(lw, x);
    int64_t last = 1LL << (s.rank - 1), rest = mpt_lw_all_but_last(s.rank);
    int mx = mpt_b_broadcast(g, mpt_b_reduce(g, MPT_OP_REDUCE_MAX, x, last), s, rest);
    int e = mpt_b_unary(g, MPT_OP_EXP, mpt_b_binary(g, MPT_OP_SUB, x, mx));
    int sum = mpt_b_broadcast(g, mpt_b_reduce(g, MPT_OP_REDUCE_SUM, e, last), s, rest);
    return mpt_b_binary(g, MPT_OP_DIV, e, sum);
}

int mpt_lw_activate(lowerer *lw, int i, int x, mpt_activation act) {
    switch (act) {
    case MPT_ACT_LINEAR: return x;
    case MPT_ACT_RELU: return mpt_b_unary(lw->g, MPT_OP_RELU, x);
    case MPT_ACT_GELU: return mpt_b_unary(lw->g, MPT_OP_GELU, x);
    case MPT_ACT_SIGMOID: return mpt_b_unary(lw->g, MPT_OP_SIGMOID, x);
    case MPT_ACT_TANH: return mpt_b_unary(lw->g, MPT_OP_TANH, x);
    case MPT_ACT_SOFTMAX:
        if (i >= 0) lw->pre[i] = x; /* the layer's own output: its logits */
        return mpt_lw_softmax(lw, x);
    case MPT_ACT_COUNT: break;
    }
    assert(!"activate: not an activation");
    return x;
}

int mpt_lw_add_bias(lowerer *lw, const mpt_flat_layer *L, int y, int64_t n) {
    if (!L->use_bias) return y;
    int b = mpt_lw_weight(lw, L, "bias", mpt_shape_1(n), MPT_INIT_ZEROS, 0, 0, 0, 1);
    return mpt_b_binary(lw->g, MPT_OP_ADD, y, mpt_b_broadcast_to(lw->g, b, mpt_lw_shape(lw, y)));
}

/* x is (B, ..., cin), kernel (cin, units); a rank > 2 input is folded to 2-D
 * around the matmul, so the kernel applies to the last axis as in Keras. */
static int dense(lowerer *lw, int i, const mpt_flat_layer *L, int x) {
    mpt_graph *g = lw->g;
    mpt_shape s = mpt_lw_shape(lw, x);
    int64_t cin = s.dim[s.rank - 1];
    int w = mpt_lw_weight(lw, L, "kernel", mpt_shape_2(cin, L->units), MPT_INIT_GLOROT_UNIFORM, cin,
                   L->units, 0, 1);
    int x2 = mpt_b_reshape(g, x, mpt_shape_2(mpt_shape_numel(s) / cin, cin));
    mpt_shape out = s;
    out.dim[s.rank - 1] = L->units;
    int y = mpt_b_reshape(g, mpt_b_matmul(g, x2, w, 0, 0), out);
    return mpt_lw_activate(lw, i, mpt_lw_add_bias(lw, L, y, L->units), L->act);
}

/* x is (B, H, W, cin), kernel (kh, kw, cin, filters) -> (B, OH, OW, filters) */
static int conv2d(lowerer *lw, int i, const mpt_flat_layer *L, int x) {
    mpt_shape s = mpt_lw_shape(lw, x);
    int64_t cin = s.dim[3], kh = L->kernel[0], kw = L->kernel[1];
    int w = mpt_lw_weight(lw, L, "kernel", mpt_shape_4(kh, kw, cin, L->filters), MPT_INIT_GLOROT_UNIFORM,
                   kh * kw * cin, kh * kw * L->filters, 0, 1);
    int64_t ph, pw, oh, ow;
    mpt_window_out(L, 0, s.dim[1], &ph, &oh);
    mpt_window_out(L, 1, s.dim[2], &pw, &ow);
    int y = mpt_b_conv2d(lw->g, x, w, (int)L->strides[0], (int)L->strides[1], (int)ph, (int)pw,
                         mpt_shape_4(s.dim[0], oh, ow, L->filters));
    return mpt_lw_activate(lw, i, mpt_lw_add_bias(lw, L, y, L->filters), L->act);
}

static int pool(lowerer *lw, const mpt_flat_layer *L, int x) {
    mpt_shape s = mpt_lw_shape(lw, x);
    int64_t ph, pw, oh, ow;
    mpt_window_out(L, 0, s.dim[1], &ph, &oh);
    mpt_window_out(L, 1, s.dim[2], &pw, &ow);
    mpt_op op = L->kind == MPT_L_MAX_POOL2D ? MPT_OP_MAX_POOL : MPT_OP_AVG_POOL;
    return mpt_b_pool(lw->g, op, x, (int)L->pool[0], (int)L->pool[1], (int)L->strides[0],
                      (int)L->strides[1], (int)ph, (int)pw, mpt_shape_4(s.dim[0], oh, ow, s.dim[3]));
}

/* x is (B, ..., C); statistics per channel C over all other dims. Training
 * mode normalises with the batch's mean and biased variance and moves the
 * moving statistics toward them; inference uses the moving statistics. */
static int batch_norm(lowerer *lw, const mpt_flat_layer *L, int x) {
    mpt_graph *g = lw->g;
    mpt_shape s = mpt_lw_shape(lw, x);
    int64_t c = s.dim[s.rank - 1];
    mpt_shape cs = mpt_shape_1(c);
    int gamma = mpt_lw_weight(lw, L, "gamma", cs, MPT_INIT_ONES, 0, 0, 0, 1);
    int beta = mpt_lw_weight(lw, L, "beta", cs, MPT_INIT_ZEROS, 0, 0, 0, 1);
    int mmean = mpt_lw_weight(lw, L, "moving_mean", cs, MPT_INIT_ZEROS, 0, 0, 0, 0);
    int mvar = mpt_lw_weight(lw, L, "moving_variance", cs, MPT_INIT_ONES, 0, 0, 0, 0);
    int mean = mmean, var = mvar, xc;
    if (lw->o->training) {
        int64_t axes = mpt_lw_all_but_last(s.rank);
        int inv_n = mpt_lw_fconst(lw, cs, 1.0 / (double)(mpt_shape_numel(s) / c));
        mean = mpt_b_binary(g, MPT_OP_MUL, mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, axes), inv_n);
        xc = mpt_b_binary(g, MPT_OP_SUB, x, mpt_b_broadcast_to(g, mean, s));
        var = mpt_b_binary(g, MPT_OP_MUL,
                           mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_unary(g, MPT_OP_SQUARE, xc), axes),
                           inv_n);
        int mom = mpt_lw_fconst(lw, cs, L->momentum), rest = mpt_lw_fconst(lw, cs, 1.0 - L->momentum);
        int new_mean = mpt_b_binary(g, MPT_OP_ADD, mpt_b_binary(g, MPT_OP_MUL, mmean, mom),
                                    mpt_b_binary(g, MPT_OP_MUL, mean, rest));
        int new_var = mpt_b_binary(g, MPT_OP_ADD, mpt_b_binary(g, MPT_OP_MUL, mvar, mom),
                                   mpt_b_binary(g, MPT_OP_MUL, var, rest));
        mpt_graph_add_update(g, mmean, new_mean);
        mpt_graph_add_update(g, mvar, new_var);
    } else {
        xc = mpt_b_binary(g, MPT_OP_SUB, x, mpt_b_broadcast_to(g, mean, s));
    }
    int inv_std = mpt_b_unary(g, MPT_OP_RSQRT,
                              mpt_b_binary(g, MPT_OP_ADD, var, mpt_lw_fconst(lw, cs, L->epsilon)));
    int scale = mpt_b_binary(g, MPT_OP_MUL, gamma, inv_std);
    int y = mpt_b_binary(g, MPT_OP_MUL, xc, mpt_b_broadcast_to(g, scale, s));
    return mpt_b_binary(g, MPT_OP_ADD, y, mpt_b_broadcast_to(g, beta, s));
}

/* x is (B, ..., D); normalised over D per position, then scaled and shifted */
static int layer_norm(lowerer *lw, const mpt_flat_layer *L, int x) {
    mpt_graph *g = lw->g;
    mpt_shape s = mpt_lw_shape(lw, x);
    int64_t dlast = s.dim[s.rank - 1], last = 1LL << (s.rank - 1), rest = mpt_lw_all_but_last(s.rank);
    int gamma = mpt_lw_weight(lw, L, "gamma", mpt_shape_1(dlast), MPT_INIT_ONES, 0, 0, 0, 1);
    int beta = mpt_lw_weight(lw, L, "beta", mpt_shape_1(dlast), MPT_INIT_ZEROS, 0, 0, 0, 1);
    int sum = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, last);
    mpt_shape rs = mpt_lw_shape(lw, sum);
    int inv_n = mpt_lw_fconst(lw, rs, 1.0 / (double)dlast);
    int mean = mpt_b_binary(g, MPT_OP_MUL, sum, inv_n);
    int xc = mpt_b_binary(g, MPT_OP_SUB, x, mpt_b_broadcast(g, mean, s, rest));
    int var = mpt_b_binary(g, MPT_OP_MUL,
                           mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_unary(g, MPT_OP_SQUARE, xc), last),
                           inv_n);
    int inv_std = mpt_b_unary(g, MPT_OP_RSQRT,
                              mpt_b_binary(g, MPT_OP_ADD, var, mpt_lw_fconst(lw, rs, L->epsilon)));
    int y = mpt_b_binary(g, MPT_OP_MUL, xc, mpt_b_broadcast(g, inv_std, s, rest));
    y = mpt_b_binary(g, MPT_OP_MUL, y, mpt_b_broadcast_to(g, gamma, s));
    return mpt_b_binary(g, MPT_OP_ADD, y, mpt_b_broadcast_to(g, beta, s));
}

/* A stable per-layer seed, so adding a layer elsewhere does not change this
 * layer's dropout masks. */
static int64_t layer_seed(const char *name) {
    uint32_t h = 2166136261u;
    for (; *name; name++) h = (h ^ (unsigned char)*name) * 16777619u;
    return (int64_t)(h & 0x7fffffff);
}

/* inverted dropout: keep where u >= rate, scaled by 1 / (1 - rate) */
int mpt_lw_dropout(lowerer *lw, const mpt_flat_layer *L, int x) {
    if (!lw->o->training || L->rate == 0) return x;
    mpt_graph *g = lw->g;
    if (lw->counter < 0) {
        char *layer = mpt_b_current_layer(g) ? strdup(mpt_b_current_layer(g)) : NULL;
        mpt_b_layer(g, NULL);
        lw->counter = mpt_b_variable_dt(g, "rng/counter", MPT_DT_I32, mpt_shape_scalar(),
                                        MPT_INIT_ZEROS, 0);
        mpt_b_layer(g, layer);
        free(layer);
    }
    mpt_shape s = mpt_lw_shape(lw, x);
    int u = mpt_b_random_uniform(g, lw->counter, s, layer_seed(L->name));
    int drop = mpt_b_binary(g, MPT_OP_LT, u, mpt_lw_fconst(lw, s, L->rate));
    int keep = mpt_b_unary(g, MPT_OP_NOT, drop);
    int scaled = mpt_b_binary(g, MPT_OP_MUL, x, mpt_lw_fconst(lw, s, 1.0 / (1.0 - L->rate)));
    return mpt_b_select(g, keep, scaled, mpt_lw_fconst(lw, s, 0));
}

int mpt_lw_value(const lowerer *lw, int in) {
    return in < 0 ? lw->inputs[MPT_FLAT_INPUT_OF(in)] : lw->val[in];
}

static int lower_layer(lowerer *lw, int i) {
    const mpt_flat_layer *L = &lw->m->layers[i];
    mpt_graph *g = lw->g;
    int x = mpt_lw_value(lw, L->in[0]);
    long batch = lw->o->batch_size;
    switch (L->kind) {
    case MPT_L_DENSE: return dense(lw, i, L, x);
    case MPT_L_CONV2D: return conv2d(lw, i, L, x);
    case MPT_L_BATCH_NORM: return batch_norm(lw, L, x);
    case MPT_L_ACTIVATION: return mpt_lw_activate(lw, i, x, L->act);
    case MPT_L_MAX_POOL2D:
    case MPT_L_AVG_POOL2D: return pool(lw, L, x);
    case MPT_L_GLOBAL_AVG_POOL2D: {
        mpt_shape s = mpt_lw_shape(lw, x);
        int sum = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, (1 << 1) | (1 << 2));
        return mpt_b_binary(g, MPT_OP_MUL, sum,
                            mpt_lw_fconst(lw, mpt_lw_shape(lw, sum), 1.0 / (double)(s.dim[1] * s.dim[2])));
    }
    case MPT_L_FLATTEN:
    case MPT_L_RESHAPE: return mpt_b_reshape(g, x, with_batch(batch, L->out));
    case MPT_L_ADD: {
        int y = x;
        for (int k = 1; k < L->n_in; k++) {
            int z = mpt_lw_value(lw, L->in[k]);
            y = mpt_b_binary(g, MPT_OP_ADD, y, z);
        }
        return y;
    }
    case MPT_L_EMBEDDING: {
        int table = mpt_lw_weight(lw, L, "embeddings", mpt_shape_2(L->input_dim, L->output_dim),
                           MPT_INIT_UNIFORM, L->input_dim, L->output_dim, 0.05, 1);
        return mpt_b_gather(g, table, x);
    }
    case MPT_L_DROPOUT: return mpt_lw_dropout(lw, L, x);
    case MPT_L_LAYER_NORM: return layer_norm(lw, L, x);
    case MPT_L_COUNT: break;
    case MPT_L_MULTIPLY: case MPT_L_CONCATENATE: case MPT_L_UP_SAMPLING2D:
    case MPT_L_CONV2D_TRANSPOSE: case MPT_L_GLOBAL_MAX_POOL2D: case MPT_L_GLOBAL_AVG_POOL1D:
    case MPT_L_GLOBAL_MAX_POOL1D: case MPT_L_POSITION_EMBEDDING: case MPT_L_LSTM:
    case MPT_L_GRU: case MPT_L_DEPTHWISE_CONV2D: case MPT_L_SEPARABLE_CONV2D:
    case MPT_L_MULTI_HEAD_ATTENTION:
        return mpt_lower_more(lw, i, L, x);
    }
    assert(!"lower_layer: not a layer kind");
    return x;
}

mpt_graph *mpt_lower(const mpt_flat_model *m, const mpt_lower_opts *opts) {
    lowerer lw = {.g = mpt_graph_new(m->name), .m = m, .o = opts, .counter = -1};
    lw.val = calloc((size_t)m->n_layers + 1, sizeof *lw.val);
    lw.pre = calloc((size_t)m->n_layers + 1, sizeof *lw.pre);
    mpt_b_layer(lw.g, NULL);
    /* the model's inputs are the graph's first INPUTs, in their order */
    for (int k = 0; k < m->n_inputs; k++) {
        const mpt_flat_input *in = &m->inputs[k];
        char name[256];
        snprintf(name, sizeof name, k ? "x/%s" : "x", in->name);
        lw.inputs[k] = mpt_b_input(lw.g, name, in->dtype, with_batch(opts->batch_size, in->shape));
    }
    for (int i = 0; i < m->n_layers; i++) {
        lw.pre[i] = -1;
        mpt_b_layer(lw.g, m->layers[i].name);
        lw.val[i] = lower_layer(&lw, i);
    }
    mpt_b_layer(lw.g, NULL);
    int out = mpt_lw_value(&lw, m->output);
    mpt_graph_add_output(lw.g, "output", out);
    if (m->output >= 0 && lw.pre[m->output] >= 0)
        mpt_graph_add_output(lw.g, "logits", lw.pre[m->output]);
    if (lw.counter >= 0) {
        int one = mpt_b_scalar(lw.g, MPT_DT_I32, 1);
        mpt_graph_add_update(lw.g, lw.counter, mpt_b_binary(lw.g, MPT_OP_ADD, lw.counter, one));
    }
    free(lw.val);
    free(lw.pre);
    return lw.g;
}
