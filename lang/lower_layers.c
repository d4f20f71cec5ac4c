/* lang/lower_layers.c — lowering of the layers for sequences, branches and
 * upsampling: multiply, concatenate, up_sampling2d, conv2d_transpose, the
 * global max pools and 1-D pools, position_embedding, lstm and gru. Each
 * is primitive ops, as every layer; the recurrent layers are unrolled over
 * their steps (the input's projection done once for every step, as Keras'
 * cuDNN-free kernels do). Shapes in comments carry the batch dim B first. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "lang/lower_impl.h"

static int bin(lowerer *lw, mpt_op op, int a, int b) { return mpt_b_binary(lw->g, op, a, b); }

/* the inputs joined along axis (with the batch dim), a balanced tree of
 * binary concats so n pieces are copied log n times, not n */
static int concat_tree(lowerer *lw, const int *v, int n, int axis) {
    if (n == 1) return v[0];
    int h = n / 2;
    return mpt_b_concat(lw->g, concat_tree(lw, v, h, axis), concat_tree(lw, v + h, n - h, axis),
                        axis);
}

/* x (B, H, W, C) -> (B, H*sh, W*sw, C), nearest: each pixel repeated */
static int up_sampling2d(lowerer *lw, const mpt_flat_layer *L, int x) {
    mpt_shape s = mpt_lw_shape(lw, x);
    int64_t sh = L->size[0], sw = L->size[1];
    mpt_shape wide = mpt_shape_make(6, (int64_t[]){s.dim[0], s.dim[1], sh, s.dim[2], sw, s.dim[3]});
    int rep = mpt_b_broadcast(lw->g, x, wide, (1 << 0) | (1 << 1) | (1 << 3) | (1 << 5));
    return mpt_b_reshape(lw->g, rep, mpt_shape_4(s.dim[0], s.dim[1] * sh, s.dim[2] * sw, s.dim[3]));
}

/* Keras' Conv2DTranspose: the data gradient of the convolution that would
 * map the output back to x; kernel (kh, kw, filters, cin) */
static int conv2d_transpose(lowerer *lw, int i, const mpt_flat_layer *L, int x) {
    mpt_shape s = mpt_lw_shape(lw, x);
    int64_t cin = s.dim[3], kh = L->kernel[0], kw = L->kernel[1];
    int w = mpt_lw_weight(lw, L, "kernel", mpt_shape_4(kh, kw, L->filters, cin),
                          MPT_INIT_GLOROT_UNIFORM, kh * kw * L->filters, kh * kw * cin, 0, 1);
    int64_t oh = L->out.dim[0], ow = L->out.dim[1], ph, pw, h, wd;
    mpt_window_out(L, 0, oh, &ph, &h);
    mpt_window_out(L, 1, ow, &pw, &wd);
    assert(h == s.dim[1] && wd == s.dim[2] && "conv2d_transpose: shapes.c's output size");
    int y = mpt_b_conv2d_bwd_data(lw->g, x, w, (int)L->strides[0], (int)L->strides[1], (int)ph,
                                  (int)pw, mpt_shape_4(s.dim[0], oh, ow, L->filters));
    return mpt_lw_activate(lw, i, mpt_lw_add_bias(lw, L, y, L->filters), L->act);
}

/* x (B, T, D) + the first T rows of a learned (max_length, D) table */
static int position_embedding(lowerer *lw, const mpt_flat_layer *L, int x) {
    mpt_shape s = mpt_lw_shape(lw, x);
    int64_t t = s.dim[1], d = s.dim[2];
    int emb = mpt_lw_weight(lw, L, "embeddings", mpt_shape_2(L->max_length, d),
                            MPT_INIT_GLOROT_UNIFORM, L->max_length, d, 0, 1);
    if (t < L->max_length) emb = mpt_b_slice(lw->g, emb, 0, 0, t);
    return bin(lw, MPT_OP_ADD, x, mpt_b_broadcast(lw->g, emb, s, (1 << 1) | (1 << 2)));
}

/* ---- depthwise convolutions ---------------------------------------------------- */

/* x (B, H, W, C) with `lo` zero rows (axis 1) or columns (axis 2) before
 * and `hi` after */
static int pad_axis(lowerer *lw, int x, int axis, int64_t lo, int64_t hi) {
    for (int side = 0; side < 2; side++) {
        int64_t n = side ? hi : lo;
        if (n <= 0) continue;
        mpt_shape zs = mpt_lw_shape(lw, x);
        zs.dim[axis] = n;
        int z = mpt_lw_fconst(lw, zs, 0);
        x = side ? mpt_b_concat(lw->g, x, z, axis) : mpt_b_concat(lw->g, z, x, axis);
    }
    return x;
}

/* rows start, start + s, ..., n of them, along axis of xp (whose length
 * covers start + n * s) */
static int strided(lowerer *lw, int xp, int axis, int64_t start, int64_t n, int64_t s) {
    mpt_graph *g = lw->g;
    if (s == 1) return mpt_b_slice(g, xp, axis, start, n);
    int run = mpt_b_slice(g, xp, axis, start, n * s);
    mpt_shape rs = mpt_lw_shape(lw, run), split = {.rank = rs.rank + 1};
    for (int d = 0, k = 0; d < rs.rank; d++) {
        if (d == axis) {
            split.dim[k++] = n;
            split.dim[k++] = s;
        } else {
            split.dim[k++] = rs.dim[d];
        }
    }
    int first = mpt_b_slice(g, mpt_b_reshape(g, run, split), axis + 1, 0, 1);
    rs.dim[axis] = n;
    return mpt_b_reshape(g, first, rs);
}

/* Keras' DepthwiseConv2D (and the depthwise half of SeparableConv2D):
 * output channel c * dm + m is channel c filtered by depthwise_kernel
 * [kh, kw, C, dm][:, :, c, m]. Built as kh * kw shifted views of the
 * padded input times the kernel's taps, summed: elementwise and index ops
 * that fusion makes one loop, as a depthwise convolution is memory-bound.
 * The separable layer then applies its pointwise_kernel [1, 1, C*dm, F]. */
static int depthwise(lowerer *lw, int i, const mpt_flat_layer *L, int x) {
    mpt_graph *g = lw->g;
    mpt_shape s = mpt_lw_shape(lw, x);
    int64_t c = s.dim[3], dm = L->depth_multiplier, kh = L->kernel[0], kw = L->kernel[1];
    int64_t sh = L->strides[0], sw = L->strides[1], ph, pw, oh, ow;
    mpt_window_out(L, 0, s.dim[1], &ph, &oh);
    mpt_window_out(L, 1, s.dim[2], &pw, &ow);
    int dk = mpt_lw_weight(lw, L, "depthwise_kernel", mpt_shape_4(kh, kw, c, dm),
                           MPT_INIT_GLOROT_UNIFORM, kh * kw * c, kh * kw * dm, 0, 1);
    /* enough rows and columns for every tap's strided run */
    int64_t need_h = kh - 1 + oh * sh, need_w = kw - 1 + ow * sw;
    int xp = pad_axis(lw, x, 1, ph, need_h - ph - s.dim[1]);
    xp = pad_axis(lw, xp, 2, pw, need_w - pw - s.dim[2]);
    mpt_shape os = mpt_shape_4(s.dim[0], oh, ow, c);
    int *per_m = calloc((size_t)dm + 1, sizeof *per_m);
    assert(per_m && "out of memory lowering a depthwise convolution");
    for (int64_t m = 0; m < dm; m++) {
        int acc = -1;
        for (int64_t a = 0; a < kh; a++)
            for (int64_t b = 0; b < kw; b++) {
                int view = strided(lw, strided(lw, xp, 1, a, oh, sh), 2, b, ow, sw);
                int tap = mpt_b_slice(g, mpt_b_slice(g, mpt_b_slice(g, dk, 0, a, 1), 1, b, 1), 3, m, 1);
                tap = mpt_b_broadcast(g, mpt_b_reshape(g, tap, mpt_shape_1(c)), os, 1 << 3);
                int term = bin(lw, MPT_OP_MUL, view, tap);
                acc = acc < 0 ? term : bin(lw, MPT_OP_ADD, acc, term);
            }
        per_m[m] = dm == 1 ? acc
                           : mpt_b_reshape(g, acc, mpt_shape_make(5, (int64_t[]){s.dim[0], oh, ow, c, 1}));
    }
    int y = dm == 1 ? per_m[0]
                    : mpt_b_reshape(g, concat_tree(lw, per_m, (int)dm, 4), mpt_shape_4(s.dim[0], oh, ow, c * dm));
    free(per_m);
    int64_t outc = c * dm;
    if (L->kind == MPT_L_SEPARABLE_CONV2D) {
        int pk = mpt_lw_weight(lw, L, "pointwise_kernel", mpt_shape_4(1, 1, c * dm, L->filters),
                               MPT_INIT_GLOROT_UNIFORM, c * dm, L->filters, 0, 1);
        y = mpt_b_conv2d(g, y, pk, 1, 1, 0, 0, mpt_shape_4(s.dim[0], oh, ow, L->filters));
        outc = L->filters;
    }
    return mpt_lw_activate(lw, i, mpt_lw_add_bias(lw, L, y, outc), L->act);
}

/* ---- attention ----------------------------------------------------------------- */

/* x [B, T, D] through an EinsumDense kernel [D, H, E] (+ bias [H, E]),
 * times scale unless it is 1: [B, H, T, E], the heads in front of the
 * steps. The scale applies before the heads move in front, as Keras scales
 * the [B, T, H, E] query: the same values, and the product joins the
 * projection's epilogue and its gradient the transposing kernel after
 * attention's backward, where scaled after the move each was a pass over
 * the tensor of its own. */
static int heads_of(lowerer *lw, const mpt_flat_layer *L, int x, const char *name, int64_t h,
                    int64_t e, double scale) {
    mpt_graph *g = lw->g;
    mpt_shape s = mpt_lw_shape(lw, x);
    int64_t b = s.dim[0], t = s.dim[1], d = s.dim[2];
    char w[64];
    snprintf(w, sizeof w, "%s/kernel", name);
    int k = mpt_lw_weight(lw, L, w, mpt_shape_make(3, (int64_t[]){d, h, e}),
                          MPT_INIT_GLOROT_UNIFORM, h * d, e * d, 0, 1);
    int y = mpt_b_matmul(g, mpt_b_reshape(g, x, mpt_shape_2(b * t, d)),
                         mpt_b_reshape(g, k, mpt_shape_2(d, h * e)), 0, 0);
    if (L->use_bias) {
        snprintf(w, sizeof w, "%s/bias", name);
        int bias = mpt_lw_weight(lw, L, w, mpt_shape_2(h, e), MPT_INIT_ZEROS, 0, 0, 0, 1);
        y = bin(lw, MPT_OP_ADD, y, mpt_b_broadcast(g, mpt_b_reshape(g, bias, mpt_shape_1(h * e)),
                                                   mpt_shape_2(b * t, h * e), 1 << 1));
    }
    y = mpt_b_reshape(g, y, mpt_shape_4(b, t, h, e));
    if (scale != 1.0) y = bin(lw, MPT_OP_MUL, y, mpt_lw_fconst(lw, mpt_lw_shape(lw, y), scale));
    static const int to_heads[4] = {0, 2, 1, 3};
    return mpt_b_transpose(g, y, to_heads);
}

/* An attention_mask m, [B, S] or [B, T, S] (f32 or i32), as a bool
 * [B, H, T, S]: true where m is nonzero (Keras casts it to bool). A
 * [B, S] padding mask is the same for every head and query. */
static int mask_of(lowerer *lw, int m, mpt_shape ss) {
    mpt_graph *g = lw->g;
    int rank = mpt_lw_shape(lw, m).rank;
    int64_t dims = rank == 2 ? (1 << 0) | (1 << 3) : (1 << 0) | (1 << 2) | (1 << 3);
    int wide = mpt_b_broadcast(g, m, ss, dims);
    int zero = mpt_b_const(g, g->nodes[m].dtype, ss, 0);
    return mpt_b_unary(g, MPT_OP_NOT, bin(lw, MPT_OP_EQ, wide, zero));
}

/* Keras' MultiHeadAttention: query from the first input, value from the
 * second (the first when alone), key from the third (the value when not
 * given). The query is scaled by 1/sqrt(key_dim) before its product with
 * the key, as Keras does; the scores, the mask and the softmax are f32
 * under every policy (the batch matmul writes f32, ir/policy.c), so a
 * score past float16's range or a masked position never becomes inf; the
 * causal mask and an attention_mask (ANDed, as Keras) set the scores of
 * masked steps to -1e9 (Keras' large negative number for f32), so even a
 * row with every step masked stays finite. */
static int multi_head_attention(lowerer *lw, const mpt_flat_layer *L, int x) {
    mpt_graph *g = lw->g;
    int value = L->n_in > 1 ? mpt_lw_value(lw, L->in[1]) : x;
    int key = L->n_in > 2 ? mpt_lw_value(lw, L->in[2]) : value;
    mpt_shape qs = mpt_lw_shape(lw, x);
    int64_t b = qs.dim[0], tq = qs.dim[1], dq = qs.dim[2], h = L->num_heads, dk = L->key_dim;
    int64_t dv = L->value_dim ? L->value_dim : L->key_dim;
    int q = heads_of(lw, L, x, "query", h, dk, 1.0 / sqrt((double)dk));
    int k = heads_of(lw, L, key, "key", h, dk, 1.0);
    int v = heads_of(lw, L, value, "value", h, dv, 1.0);
    int64_t tk = mpt_lw_shape(lw, k).dim[2];
    int scores = mpt_b_batch_matmul(g, q, k, 0, 1); /* [B, H, Tq, Tk] */
    mpt_shape ss = mpt_lw_shape(lw, scores);
    int later = -1, attend = -1; /* bool [B, H, Tq, Tk] */
    if (L->use_causal_mask)
        later = bin(lw, MPT_OP_GT, mpt_b_iota(g, MPT_DT_I32, ss, 3), mpt_b_iota(g, MPT_DT_I32, ss, 2));
    if (L->mask == MPT_FLAT_NO_REF) {
        if (later >= 0) scores = mpt_b_select(g, later, mpt_lw_fconst(lw, ss, -1e9), scores);
    } else { /* the given mask AND the causal one, as Keras */
        attend = mask_of(lw, mpt_lw_value(lw, L->mask), ss);
        if (later >= 0) attend = bin(lw, MPT_OP_AND, attend, mpt_b_unary(g, MPT_OP_NOT, later));
        scores = mpt_b_select(g, attend, scores, mpt_lw_fconst(lw, ss, -1e9));
    }
    int p = mpt_lw_softmax(lw, scores);
    /* a row with every step masked is uniform after the softmax; Keras 3's
     * Softmax zeroes the masked probabilities, so that row attends to
     * nothing (its output is the output projection's bias) */
    if (attend >= 0) p = mpt_b_select(g, attend, p, mpt_lw_fconst(lw, ss, 0));
    p = mpt_lw_dropout(lw, L, p);
    int o = mpt_b_batch_matmul(g, p, v, 0, 0); /* [B, H, Tq, dv] */
    static const int to_steps[4] = {0, 2, 1, 3};
    o = mpt_b_reshape(g, mpt_b_transpose(g, o, to_steps), mpt_shape_2(b * tq, h * dv));
    int wo = mpt_lw_weight(lw, L, "attention_output/kernel", mpt_shape_make(3, (int64_t[]){h, dv, dq}),
                           MPT_INIT_GLOROT_UNIFORM, dv * h, dq * h, 0, 1);
    int y = mpt_b_matmul(g, o, mpt_b_reshape(g, wo, mpt_shape_2(h * dv, dq)), 0, 0);
    if (L->use_bias) {
        int bo = mpt_lw_weight(lw, L, "attention_output/bias", mpt_shape_1(dq), MPT_INIT_ZEROS, 0, 0, 0, 1);
        y = bin(lw, MPT_OP_ADD, y, mpt_b_broadcast_to(g, bo, mpt_lw_shape(lw, y)));
    }
    (void)tk;
    return mpt_b_reshape(g, y, mpt_shape_make(3, (int64_t[]){b, tq, dq}));
}

/* ---- recurrent layers -------------------------------------------------------- */

/* piece k of width u of z (B, n*u) */
static int gate(lowerer *lw, int z, int k, int64_t u) { return mpt_b_slice(lw->g, z, 1, k * u, u); }

/* x (B, T, D) @ kernel (D, G) + bias -> (B, T, G): every step's input
 * projection in one matmul */
static int project_inputs(lowerer *lw, int x, int kernel, int bias) {
    mpt_graph *g = lw->g;
    mpt_shape s = mpt_lw_shape(lw, x);
    int64_t gw = mpt_lw_shape(lw, kernel).dim[1];
    int xw = mpt_b_matmul(g, mpt_b_reshape(g, x, mpt_shape_2(s.dim[0] * s.dim[1], s.dim[2])), kernel,
                          0, 0);
    xw = mpt_b_reshape(g, xw, mpt_shape_make(3, (int64_t[]){s.dim[0], s.dim[1], gw}));
    if (bias >= 0) xw = bin(lw, MPT_OP_ADD, xw, mpt_b_broadcast_to(g, bias, mpt_lw_shape(lw, xw)));
    return xw;
}

/* step t of xw (B, T, G) as (B, G) */
static int step_of(lowerer *lw, int xw, int64_t t) {
    mpt_shape s = mpt_lw_shape(lw, xw);
    return mpt_b_reshape(lw->g, mpt_b_slice(lw->g, xw, 1, t, 1), mpt_shape_2(s.dim[0], s.dim[2]));
}

/* the layer's output: the last h, or every step's (B, T, U) */
static int sequence_out(lowerer *lw, const mpt_flat_layer *L, int *hs, int64_t t, int h) {
    if (!L->return_sequences) return h;
    mpt_shape s = mpt_lw_shape(lw, h);
    for (int64_t k = 0; k < t; k++)
        hs[k] = mpt_b_reshape(lw->g, hs[k], mpt_shape_make(3, (int64_t[]){s.dim[0], 1, s.dim[1]}));
    return concat_tree(lw, hs, (int)t, 1);
}

/* Keras' LSTM: gates i, f, c, o in kernel (D, 4U), recurrent_kernel
 * (U, 4U) and bias (4U); c = f c + i act(z_c), h = o act(c) */
static int lstm(lowerer *lw, const mpt_flat_layer *L, int x) {
    mpt_shape s = mpt_lw_shape(lw, x);
    int64_t t = s.dim[1], d = s.dim[2], u = L->units;
    int kernel = mpt_lw_weight(lw, L, "kernel", mpt_shape_2(d, 4 * u), MPT_INIT_GLOROT_UNIFORM, d,
                               4 * u, 0, 1);
    int rec = mpt_lw_weight(lw, L, "recurrent_kernel", mpt_shape_2(u, 4 * u), MPT_INIT_ORTHOGONAL,
                            0, 0, 0, 1);
    int bias = L->use_bias ? mpt_lw_weight(lw, L, "bias", mpt_shape_1(4 * u), MPT_INIT_FORGET_BIAS,
                                           0, 0, 0, 1)
                           : -1;
    int xw = project_inputs(lw, x, kernel, bias);
    int *hs = calloc((size_t)t + 1, sizeof *hs);
    assert(hs && "out of memory lowering an lstm");
    int h = -1, c = -1;
    for (int64_t k = 0; k < t; k++) {
        int z = step_of(lw, xw, k);
        if (h >= 0) z = bin(lw, MPT_OP_ADD, z, mpt_b_matmul(lw->g, h, rec, 0, 0));
        int ig = mpt_lw_activate(lw, -1, gate(lw, z, 0, u), L->rec_act);
        int fg = mpt_lw_activate(lw, -1, gate(lw, z, 1, u), L->rec_act);
        int cg = mpt_lw_activate(lw, -1, gate(lw, z, 2, u), L->act);
        int og = mpt_lw_activate(lw, -1, gate(lw, z, 3, u), L->rec_act);
        int ic = bin(lw, MPT_OP_MUL, ig, cg);
        c = c < 0 ? ic : bin(lw, MPT_OP_ADD, bin(lw, MPT_OP_MUL, fg, c), ic);
        h = bin(lw, MPT_OP_MUL, og, mpt_lw_activate(lw, -1, c, L->act));
        hs[k] = h;
    }
    int out = sequence_out(lw, L, hs, t, h);
    free(hs);
    return out;
}

/* Keras' GRU: gates z, r, h in kernel (D, 3U) and recurrent_kernel (U, 3U).
 * reset_after (Keras 2+'s default): bias (2, 3U), the input's row and the
 * recurrent's, and hh = act(x_h + r * (h U_h + b_rh)); otherwise bias (3U)
 * and hh = act(x_h + (r * h) U_h). h = z h + (1 - z) hh. */
static int gru(lowerer *lw, const mpt_flat_layer *L, int x) {
    mpt_graph *g = lw->g;
    mpt_shape s = mpt_lw_shape(lw, x);
    int64_t t = s.dim[1], d = s.dim[2], u = L->units;
    int kernel = mpt_lw_weight(lw, L, "kernel", mpt_shape_2(d, 3 * u), MPT_INIT_GLOROT_UNIFORM, d,
                               3 * u, 0, 1);
    int rec = mpt_lw_weight(lw, L, "recurrent_kernel", mpt_shape_2(u, 3 * u), MPT_INIT_ORTHOGONAL,
                            0, 0, 0, 1);
    int in_bias = -1, rec_bias = -1;
    if (L->use_bias && L->reset_after) {
        int b = mpt_lw_weight(lw, L, "bias", mpt_shape_2(2, 3 * u), MPT_INIT_ZEROS, 0, 0, 0, 1);
        in_bias = mpt_b_reshape(g, mpt_b_slice(g, b, 0, 0, 1), mpt_shape_1(3 * u));
        rec_bias = mpt_b_reshape(g, mpt_b_slice(g, b, 0, 1, 1), mpt_shape_1(3 * u));
    } else if (L->use_bias) {
        in_bias = mpt_lw_weight(lw, L, "bias", mpt_shape_1(3 * u), MPT_INIT_ZEROS, 0, 0, 0, 1);
    }
    int xw = project_inputs(lw, x, kernel, in_bias);
    int *hs = calloc((size_t)t + 1, sizeof *hs);
    assert(hs && "out of memory lowering a gru");
    mpt_shape hsz = mpt_shape_2(s.dim[0], u);
    int h = -1; /* zero before the first step: its products are left out */
    int rec_zr = L->reset_after ? -1 : mpt_b_slice(g, rec, 1, 0, 2 * u);
    int rec_h = L->reset_after ? -1 : mpt_b_slice(g, rec, 1, 2 * u, u);
    for (int64_t k = 0; k < t; k++) {
        int xs = step_of(lw, xw, k), xz = gate(lw, xs, 0, u), xr = gate(lw, xs, 1, u);
        int xh = gate(lw, xs, 2, u), z, r, hh;
        if (L->reset_after) {
            int inner = h >= 0 ? mpt_b_matmul(g, h, rec, 0, 0) : -1;
            if (rec_bias >= 0) {
                int rb = mpt_b_broadcast_to(g, rec_bias, mpt_shape_2(s.dim[0], 3 * u));
                inner = inner >= 0 ? bin(lw, MPT_OP_ADD, inner, rb) : rb;
            }
            z = inner >= 0 ? bin(lw, MPT_OP_ADD, xz, gate(lw, inner, 0, u)) : xz;
            r = inner >= 0 ? bin(lw, MPT_OP_ADD, xr, gate(lw, inner, 1, u)) : xr;
            z = mpt_lw_activate(lw, -1, z, L->rec_act);
            r = mpt_lw_activate(lw, -1, r, L->rec_act);
            hh = inner >= 0 ? bin(lw, MPT_OP_ADD, xh, bin(lw, MPT_OP_MUL, r, gate(lw, inner, 2, u))) : xh;
        } else {
            int inner = h >= 0 ? mpt_b_matmul(g, h, rec_zr, 0, 0) : -1;
            z = mpt_lw_activate(lw, -1, inner >= 0 ? bin(lw, MPT_OP_ADD, xz, gate(lw, inner, 0, u)) : xz,
                                L->rec_act);
            r = mpt_lw_activate(lw, -1, inner >= 0 ? bin(lw, MPT_OP_ADD, xr, gate(lw, inner, 1, u)) : xr,
                                L->rec_act);
            hh = h >= 0 ? bin(lw, MPT_OP_ADD, xh, mpt_b_matmul(g, bin(lw, MPT_OP_MUL, r, h), rec_h, 0, 0))
                        : xh;
        }
        hh = mpt_lw_activate(lw, -1, hh, L->act);
        int fresh = bin(lw, MPT_OP_MUL, bin(lw, MPT_OP_SUB, mpt_lw_fconst(lw, hsz, 1), z), hh);
        h = h >= 0 ? bin(lw, MPT_OP_ADD, bin(lw, MPT_OP_MUL, z, h), fresh) : fresh;
        hs[k] = h;
    }
    int out = sequence_out(lw, L, hs, t, h);
    free(hs);
    return out;
}

int mpt_lower_more(lowerer *lw, int i, const mpt_flat_layer *L, int x) {
    mpt_graph *g = lw->g;
    switch (L->kind) {
    case MPT_L_MULTIPLY: {
        int y = x;
        for (int k = 1; k < L->n_in; k++) y = bin(lw, MPT_OP_MUL, y, mpt_lw_value(lw, L->in[k]));
        return y;
    }
    case MPT_L_CONCATENATE: {
        int rank = mpt_lw_shape(lw, x).rank, ax = L->axis < 0 ? rank + L->axis : L->axis;
        int *v = calloc((size_t)L->n_in + 1, sizeof *v);
        assert(v && "out of memory lowering a concatenate");
        for (int k = 0; k < L->n_in; k++) v[k] = mpt_lw_value(lw, L->in[k]);
        int y = concat_tree(lw, v, L->n_in, ax);
        free(v);
        return y;
    }
    case MPT_L_UP_SAMPLING2D: return up_sampling2d(lw, L, x);
    case MPT_L_CONV2D_TRANSPOSE: return conv2d_transpose(lw, i, L, x);
    case MPT_L_GLOBAL_MAX_POOL2D: return mpt_b_reduce(g, MPT_OP_REDUCE_MAX, x, (1 << 1) | (1 << 2));
    case MPT_L_GLOBAL_MAX_POOL1D: return mpt_b_reduce(g, MPT_OP_REDUCE_MAX, x, 1 << 1);
    case MPT_L_GLOBAL_AVG_POOL1D: {
        int sum = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, 1 << 1);
        return bin(lw, MPT_OP_MUL, sum,
                   mpt_lw_fconst(lw, mpt_lw_shape(lw, sum), 1.0 / (double)mpt_lw_shape(lw, x).dim[1]));
    }
    case MPT_L_POSITION_EMBEDDING: return position_embedding(lw, L, x);
    case MPT_L_LSTM: return lstm(lw, L, x);
    case MPT_L_GRU: return gru(lw, L, x);
    case MPT_L_DEPTHWISE_CONV2D:
    case MPT_L_SEPARABLE_CONV2D: return depthwise(lw, i, L, x);
    case MPT_L_MULTI_HEAD_ATTENTION: return multi_head_attention(lw, L, x);
    case MPT_L_DENSE: case MPT_L_CONV2D: case MPT_L_BATCH_NORM:
    case MPT_L_ACTIVATION: case MPT_L_MAX_POOL2D: case MPT_L_AVG_POOL2D:
    case MPT_L_GLOBAL_AVG_POOL2D: case MPT_L_FLATTEN: case MPT_L_RESHAPE:
    case MPT_L_ADD: case MPT_L_EMBEDDING: case MPT_L_DROPOUT:
    case MPT_L_LAYER_NORM: case MPT_L_COUNT:
        break;
    }
    assert(!"mpt_lower_more: not a layer kind");
    return x;
}
