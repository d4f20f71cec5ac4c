/* lang/shapes.c — shape inference and parameter counts of a flat model,
 * with the user-facing shape errors (conv on a vector, add of different
 * shapes, a valid-padded window larger than its input, ...). Shapes here
 * have no batch dim. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lang/model.h"

/* Larger tensors are surely a typo, and keep int64 element counts safe. */
#define MAX_ELEMENTS (1LL << 40)

/* Element count that saturates instead of overflowing. */
static int64_t safe_numel(mpt_shape s) {
    int64_t n = 1;
    for (int k = 0; k < s.rank; k++)
        if (__builtin_mul_overflow(n, s.dim[k], &n)) return INT64_MAX;
    return n;
}

/* a * b + c, saturating. */
static int64_t safe_mad(int64_t a, int64_t b, int64_t c) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r) || __builtin_add_overflow(r, c, &r)) return INT64_MAX;
    return r;
}

static const char *shape_str(mpt_shape s, char *buf, size_t len) {
    return mpt_shape_str(s, buf, len);
}

int mpt_layer_has_kernel(mpt_layer_kind k) {
    return k == MPT_L_CONV2D || k == MPT_L_CONV2D_TRANSPOSE || k == MPT_L_DEPTHWISE_CONV2D ||
           k == MPT_L_SEPARABLE_CONV2D;
}

int mpt_window_out(const mpt_flat_layer *L, int axis, int64_t in, int64_t *pad_lo,
                   int64_t *out) {
    int64_t k = mpt_layer_has_kernel(L->kind) ? L->kernel[axis] : L->pool[axis];
    int64_t s = L->strides[axis];
    int64_t hi = 0;
    switch (L->padding) {
    case MPT_PAD_SAME: mpt_same_padding(in, k, s, pad_lo, &hi, out); break;
    case MPT_PAD_VALID:
        *pad_lo = 0;
        *out = in >= k ? mpt_conv_out_size(in, k, s, 0, 0) : 0;
        break;
    case MPT_PAD_EXPLICIT:
        *pad_lo = L->pad[axis];
        *out = in + 2 * L->pad[axis] >= k ? mpt_conv_out_size(in, k, s, L->pad[axis], L->pad[axis])
                                          : 0;
        break;
    }
    return *out >= 1 ? 0 : -1;
}

static int image_input(mpt_diag *d, const mpt_flat_layer *L, mpt_shape in) {
    if (in.rank == 3) return 0;
    char buf[96];
    mpt_diag_error(d, L->loc,
                   in.rank == 1 ? "declare the input as an image, e.g. [28, 28, 1], or add "
                                  "reshape(shape=[28, 28, 1]) before it"
                                : NULL,
                   "%s needs an image input [height, width, channels], got %s",
                   mpt_layer_kind_name(L->kind), shape_str(in, buf, sizeof buf));
    return -1;
}

static int windowed(mpt_diag *d, mpt_flat_layer *L, mpt_shape in, int64_t channels) {
    if (image_input(d, L, in) != 0) return -1;
    /* explicit padding as wide as the window would give output rows that
     * see padding only (the IR refuses them, ir/infer.c) */
    const int64_t *win = mpt_layer_has_kernel(L->kind) ? L->kernel : L->pool;
    if (L->padding == MPT_PAD_EXPLICIT && (L->pad[0] >= win[0] || L->pad[1] >= win[1])) {
        char hint[96];
        snprintf(hint, sizeof hint, "padding=[%lld, %lld] at most, or padding=same",
                 (long long)(win[0] - 1), (long long)(win[1] - 1));
        mpt_diag_error(d, L->loc, hint,
                       "%s padding [%lld, %lld] is not smaller than its window %lldx%lld: "
                       "output rows would see padding only", mpt_layer_kind_name(L->kind),
                       (long long)L->pad[0], (long long)L->pad[1], (long long)win[0],
                       (long long)win[1]);
        return -1;
    }
    int64_t oh, ow, lo;
    int bad_h = mpt_window_out(L, 0, in.dim[0], &lo, &oh);
    int bad_w = mpt_window_out(L, 1, in.dim[1], &lo, &ow);
    if (bad_h || bad_w) {
        const int64_t *k = mpt_layer_has_kernel(L->kind) ? L->kernel : L->pool;
        mpt_diag_error(d, L->loc, "use padding=same, a smaller window, or a larger input",
                       "%s window %lldx%lld is larger than its padded input %lldx%lld",
                       mpt_layer_kind_name(L->kind), (long long)k[0], (long long)k[1],
                       (long long)(in.dim[0] + (L->padding == MPT_PAD_EXPLICIT ? 2 * L->pad[0] : 0)),
                       (long long)(in.dim[1] + (L->padding == MPT_PAD_EXPLICIT ? 2 * L->pad[1] : 0)));
        return -1;
    }
    L->out = mpt_shape_make(3, (int64_t[]){oh, ow, channels});
    return 0;
}

static int need_rank(mpt_diag *d, const mpt_flat_layer *L, mpt_shape in, int min_rank) {
    if (in.rank >= min_rank) return 0;
    mpt_diag_error(d, L->loc, NULL, "%s needs an input with at least %d dim%s",
                   mpt_layer_kind_name(L->kind), min_rank, min_rank == 1 ? "" : "s");
    return -1;
}

static const char *ref_name(const mpt_flat_model *m, int ref) {
    return ref < 0 ? m->inputs[MPT_FLAT_INPUT_OF(ref)].name : m->layers[ref].name;
}

static const char *input_name(const mpt_flat_model *m, const mpt_flat_layer *L, int k) {
    return ref_name(m, L->in[k]);
}

/* add and multiply: every input of the first's shape */
static int same_shapes(mpt_diag *d, const mpt_flat_model *m, const mpt_flat_layer *L,
                       const mpt_shape *ins) {
    char a[96], b[96];
    for (int k = 1; k < L->n_in; k++) {
        if (mpt_shape_eq(ins[k], ins[0])) continue;
        mpt_diag_error(d, L->loc,
                       L->kind == MPT_L_ADD ? "a projection (conv2d with 1x1 kernel) can match them"
                                            : "reshape or project one of them first",
                       "%s needs inputs of one shape: '%s' is %s but '%s' is %s",
                       mpt_layer_kind_name(L->kind), input_name(m, L, 0),
                       shape_str(ins[0], a, sizeof a), input_name(m, L, k),
                       shape_str(ins[k], b, sizeof b));
        return -1;
    }
    return 0;
}

/* Keras' axis counts the batch dim: -1 is the last, 1 the first after the
 * batch; 0 (the batch) is refused. The axis without the batch, or -1. */
static int concat_axis(mpt_diag *d, const mpt_flat_model *m, const mpt_flat_layer *L,
                       const mpt_shape *ins, int *out) {
    int rank = ins[0].rank;
    int ax = L->axis < 0 ? rank + 1 + L->axis : L->axis;
    if (ax < 1 || ax > rank) {
        mpt_diag_error(d, L->loc, "axis=-1 joins the last dims (channels, features)",
                       "concatenate axis %d is not a dim of its %d-dim inputs%s", L->axis, rank,
                       ax == 0 ? " (0 is the batch)" : "");
        return -1;
    }
    char a[96], b[96];
    for (int k = 1; k < L->n_in; k++) {
        int bad = ins[k].rank != rank;
        for (int j = 0; !bad && j < rank; j++) bad = j != ax - 1 && ins[k].dim[j] != ins[0].dim[j];
        if (!bad) continue;
        mpt_diag_error(d, L->loc, "the inputs must match in every dim but the axis joined",
                       "concatenate on axis %d: '%s' is %s but '%s' is %s", L->axis,
                       input_name(m, L, 0), shape_str(ins[0], a, sizeof a), input_name(m, L, k),
                       shape_str(ins[k], b, sizeof b));
        return -1;
    }
    *out = ax - 1;
    return 0;
}

/* multi_head_attention's attention_mask: [S] a sample (a padding mask over
 * the key's steps, the same for every query) or [T, S] (Keras' [B, T, S]),
 * for T query and S key steps */
static int attention_mask(mpt_diag *d, const mpt_flat_model *m, const mpt_flat_layer *L,
                          int64_t t, int64_t steps) {
    mpt_shape ms = L->mask < 0 ? m->inputs[MPT_FLAT_INPUT_OF(L->mask)].shape
                               : m->layers[L->mask].out;
    if ((ms.rank == 1 && ms.dim[0] == steps) ||
        (ms.rank == 2 && ms.dim[0] == t && ms.dim[1] == steps))
        return 0;
    char a[96], hint[160];
    snprintf(hint, sizeof hint, "a mask is [%lld] (a padding mask over the key's steps) or "
             "[%lld, %lld] (queries by keys), 1 to attend and 0 not", (long long)steps,
             (long long)t, (long long)steps);
    mpt_diag_error(d, L->mask_loc, hint,
                   "attention_mask '%s' is %s, but the attention has %lld query and %lld key "
                   "steps", ref_name(m, L->mask), shape_str(ms, a, sizeof a), (long long)t,
                   (long long)steps);
    return -1;
}

/* lstm, gru, the 1-D pools and position_embedding read [steps, features] */
static int sequence_input(mpt_diag *d, const mpt_flat_layer *L, mpt_shape in) {
    if (in.rank == 2) return 0;
    char buf[96];
    mpt_diag_error(d, L->loc,
                   in.rank == 1 ? "give it a sequence: an embedding's output, or "
                                  "reshape(shape=[steps, features])"
                                : "reshape(shape=[steps, features]) first",
                   "%s needs a sequence input [steps, features], got %s",
                   mpt_layer_kind_name(L->kind), shape_str(in, buf, sizeof buf));
    return -1;
}

static int infer_more(mpt_diag *d, mpt_flat_model *m, mpt_flat_layer *L, const mpt_shape *ins) {
    mpt_shape in = ins[0];
    int64_t c = in.rank ? in.dim[in.rank - 1] : 1;
    int ax;
    switch (L->kind) {
    case MPT_L_MULTIPLY:
        return same_shapes(d, m, L, ins);
    case MPT_L_CONCATENATE:
        if (concat_axis(d, m, L, ins, &ax)) return -1;
        for (int k = 1; k < L->n_in; k++) L->out.dim[ax] += ins[k].dim[ax];
        return 0;
    case MPT_L_UP_SAMPLING2D:
        if (image_input(d, L, in)) return -1;
        L->out = mpt_shape_make(3, (int64_t[]){in.dim[0] * L->size[0], in.dim[1] * L->size[1], c});
        return 0;
    case MPT_L_CONV2D_TRANSPOSE: {
        if (image_input(d, L, in)) return -1;
        if (L->padding == MPT_PAD_EXPLICIT) {
            mpt_diag_error(d, L->loc, "padding=same or padding=valid, as Keras' Conv2DTranspose",
                           "conv2d_transpose takes no explicit padding");
            return -1;
        }
        int64_t o[2];
        for (int k = 0; k < 2; k++)
            o[k] = L->padding == MPT_PAD_SAME ? in.dim[k] * L->strides[k]
                                              : (in.dim[k] - 1) * L->strides[k] + L->kernel[k];
        L->out = mpt_shape_make(3, (int64_t[]){o[0], o[1], L->filters});
        L->n_params = L->n_trainable = safe_mad(
            safe_mad(L->kernel[0] * L->kernel[1], c, 0), L->filters, L->use_bias ? L->filters : 0);
        return 0;
    }
    case MPT_L_GLOBAL_MAX_POOL2D:
        if (image_input(d, L, in)) return -1;
        L->out = mpt_shape_1(c);
        return 0;
    case MPT_L_GLOBAL_AVG_POOL1D:
    case MPT_L_GLOBAL_MAX_POOL1D:
        if (sequence_input(d, L, in)) return -1;
        L->out = mpt_shape_1(c);
        return 0;
    case MPT_L_POSITION_EMBEDDING:
        if (sequence_input(d, L, in)) return -1;
        if (in.dim[0] > L->max_length) {
            char hint[96];
            snprintf(hint, sizeof hint, "max_length=%lld at least", (long long)in.dim[0]);
            mpt_diag_error(d, L->loc, hint, "the sequence has %lld steps, more than max_length %lld",
                           (long long)in.dim[0], (long long)L->max_length);
            return -1;
        }
        L->n_params = L->n_trainable = safe_mad(L->max_length, c, 0);
        return 0;
    case MPT_L_DEPTHWISE_CONV2D:
    case MPT_L_SEPARABLE_CONV2D: {
        int64_t dm = L->depth_multiplier, kk = L->kernel[0] * L->kernel[1];
        int sep = L->kind == MPT_L_SEPARABLE_CONV2D;
        int64_t outc = sep ? L->filters : c * dm;
        if (windowed(d, L, in, outc)) return -1;
        L->n_params = L->n_trainable =
            safe_mad(kk * c, dm, (sep ? safe_mad(c * dm, L->filters, 0) : 0) + (L->use_bias ? outc : 0));
        return 0;
    }
    case MPT_L_MULTI_HEAD_ATTENTION: {
        /* query, value, key (the value when not given); Keras' EinsumDense
         * weights: query/key/value [d, heads, dim] and their biases,
         * attention_output [heads, value_dim, d_query] and its bias */
        for (int k = 0; k < L->n_in; k++)
            if (sequence_input(d, L, ins[k])) return -1;
        mpt_shape v = L->n_in > 1 ? ins[1] : in, kk = L->n_in > 2 ? ins[2] : v;
        if (v.dim[0] != kk.dim[0]) {
            char a[96], b[96];
            mpt_diag_error(d, L->loc, "the key and the value must have as many steps",
                           "multi_head_attention: the value is %s but the key %s",
                           shape_str(v, a, sizeof a), shape_str(kk, b, sizeof b));
            return -1;
        }
        if (L->mask != MPT_FLAT_NO_REF && attention_mask(d, m, L, in.dim[0], kk.dim[0])) return -1;
        int64_t h = L->num_heads, dk = L->key_dim, dv = L->value_dim ? L->value_dim : L->key_dim;
        int64_t b = L->use_bias;
        L->n_params = L->n_trainable =
            safe_mad(h * dk, c + kk.dim[1] + 2 * b, safe_mad(h * dv, v.dim[1] + b + c, b ? c : 0));
        return 0;
    }
    case MPT_L_LSTM:
    case MPT_L_GRU: {
        if (sequence_input(d, L, in)) return -1;
        int64_t gates = L->kind == MPT_L_LSTM ? 4 : 3, u = L->units;
        int64_t bias = !L->use_bias ? 0 : L->kind == MPT_L_GRU && L->reset_after ? 2 * gates * u
                                                                                 : gates * u;
        L->out = L->return_sequences ? mpt_shape_2(in.dim[0], u) : mpt_shape_1(u);
        L->n_params = L->n_trainable = safe_mad(c + u, gates * u, bias);
        return 0;
    }
    case MPT_L_DENSE: case MPT_L_CONV2D: case MPT_L_BATCH_NORM:
    case MPT_L_ACTIVATION: case MPT_L_MAX_POOL2D: case MPT_L_AVG_POOL2D:
    case MPT_L_GLOBAL_AVG_POOL2D: case MPT_L_FLATTEN: case MPT_L_RESHAPE:
    case MPT_L_ADD: case MPT_L_EMBEDDING: case MPT_L_DROPOUT:
    case MPT_L_LAYER_NORM: case MPT_L_COUNT:
        break;
    }
    return -1;
}

static int infer_one(mpt_diag *d, mpt_flat_model *m, mpt_flat_layer *L, const mpt_shape *ins) {
    mpt_shape in = ins[0];
    char a[96], b[96];
    int64_t c = in.rank ? in.dim[in.rank - 1] : 1;
    L->out = in;
    L->n_params = L->n_trainable = 0;
    switch (L->kind) {
    case MPT_L_DENSE:
        if (need_rank(d, L, in, 1)) return -1;
        L->out.dim[in.rank - 1] = L->units;
        L->n_params = L->n_trainable = safe_mad(c, L->units, L->use_bias ? L->units : 0);
        return 0;
    case MPT_L_CONV2D:
        if (windowed(d, L, in, L->filters)) return -1;
        L->n_params = L->n_trainable = safe_mad(
            safe_mad(L->kernel[0] * L->kernel[1], c, 0), L->filters, L->use_bias ? L->filters : 0);
        return 0;
    case MPT_L_MAX_POOL2D:
    case MPT_L_AVG_POOL2D:
        return windowed(d, L, in, c);
    case MPT_L_GLOBAL_AVG_POOL2D:
        if (image_input(d, L, in)) return -1;
        L->out = mpt_shape_1(c);
        return 0;
    case MPT_L_BATCH_NORM:
    case MPT_L_LAYER_NORM:
        if (need_rank(d, L, in, 1)) return -1;
        L->n_trainable = 2 * c;
        L->n_params = (L->kind == MPT_L_BATCH_NORM ? 4 : 2) * c;
        return 0;
    case MPT_L_ACTIVATION:
    case MPT_L_DROPOUT:
        return 0;
    case MPT_L_FLATTEN:
        L->out = mpt_shape_1(safe_numel(in));
        return 0;
    case MPT_L_RESHAPE:
        if (safe_numel(L->target) != safe_numel(in)) {
            mpt_diag_error(d, L->loc, NULL, "cannot reshape %s (%lld values) to %s (%lld values)",
                           shape_str(in, a, sizeof a), (long long)safe_numel(in),
                           shape_str(L->target, b, sizeof b),
                           (long long)safe_numel(L->target));
            return -1;
        }
        L->out = L->target;
        return 0;
    case MPT_L_ADD:
        return same_shapes(d, m, L, ins);
    case MPT_L_EMBEDDING:
        if (L->in[0] >= 0) {
            mpt_diag_error(d, L->loc, "put embedding first, right after the input",
                           "embedding takes token ids from the model input");
            return -1;
        }
        if (in.rank + 1 >= MPT_MAX_DIMS) {
            mpt_diag_error(d, L->loc, NULL, "embedding output would have too many dims");
            return -1;
        }
        L->out.dim[L->out.rank++] = L->output_dim;
        L->n_params = L->n_trainable = safe_mad(L->input_dim, L->output_dim, 0);
        return 0;
    case MPT_L_COUNT:
        break;
    case MPT_L_MULTIPLY: case MPT_L_CONCATENATE: case MPT_L_UP_SAMPLING2D:
    case MPT_L_CONV2D_TRANSPOSE: case MPT_L_GLOBAL_MAX_POOL2D: case MPT_L_GLOBAL_AVG_POOL1D:
    case MPT_L_GLOBAL_MAX_POOL1D: case MPT_L_POSITION_EMBEDDING: case MPT_L_LSTM:
    case MPT_L_GRU: case MPT_L_DEPTHWISE_CONV2D: case MPT_L_SEPARABLE_CONV2D:
    case MPT_L_MULTI_HEAD_ATTENTION:
        return infer_more(d, m, L, ins);
    }
    return -1;
}

/* An input read by an embedding holds i32 token ids, which no other layer
 * may read as numbers (attention_mask may: nonzero attends). */
static void input_dtypes(mpt_diag *d, mpt_flat_model *m) {
    for (int k = 0; k < m->n_inputs; k++) {
        mpt_flat_input *in = &m->inputs[k];
        int ref = MPT_FLAT_INPUT_REF(k), embeds = 0, float_users = 0, masks = 0;
        mpt_loc float_user = {0};
        for (int i = 0; i < m->n_layers; i++) {
            const mpt_flat_layer *L = &m->layers[i];
            masks += L->mask == ref;
            for (int j = 0; j < L->n_in; j++) {
                if (L->in[j] != ref) continue;
                if (L->kind == MPT_L_EMBEDDING) {
                    if (!in->vocab || L->input_dim < in->vocab) in->vocab = L->input_dim;
                    embeds++;
                } else if (!float_users++) {
                    float_user = L->loc;
                }
            }
        }
        if (embeds && float_users)
            mpt_diag_error(d, float_user, "only embedding layers may read the token ids",
                           "the input '%s' holds integer token ids (it feeds an embedding), "
                           "but this layer reads it as numbers", in->name);
        in->dtype = embeds ? MPT_DT_I32 : MPT_DT_F32;
        in->mask_only = masks && !embeds && !float_users;
    }
}

void mpt_infer_shapes(mpt_diag *d, mpt_flat_model *m) {
    for (int k = 0; k < m->n_inputs; k++) {
        if (safe_numel(m->inputs[k].shape) > MAX_ELEMENTS) {
            mpt_diag_error(d, m->inputs[k].loc, NULL, "the input is too large");
            return;
        }
    }
    char *ok = calloc((size_t)m->n_layers + 1, 1);
    for (int i = 0; i < m->n_layers; i++) {
        mpt_flat_layer *L = &m->layers[i];
        mpt_shape *ins = calloc((size_t)L->n_in, sizeof *ins);
        int inputs_ok = L->mask < 0 || ok[L->mask];
        for (int k = 0; k < L->n_in; k++) {
            int j = L->in[k];
            if (j < 0) {
                ins[k] = m->inputs[MPT_FLAT_INPUT_OF(j)].shape;
            } else {
                ins[k] = m->layers[j].out;
                if (!ok[j]) inputs_ok = 0;
            }
        }
        if (inputs_ok && infer_one(d, m, L, ins) == 0) {
            if (safe_numel(L->out) > MAX_ELEMENTS || L->out.rank + 1 > MPT_MAX_DIMS ||
                L->n_params > MAX_ELEMENTS) {
                char buf[96];
                mpt_diag_error(d, L->loc, NULL, "layer '%s' is too large (output %s)", L->name,
                               shape_str(L->out, buf, sizeof buf));
            } else {
                ok[i] = 1;
            }
        }
        free(ins);
    }
    input_dtypes(d, m);
    free(ok);
}
