/* lang/lower_impl.h — private to lang/lower.c and lang/lower_layers.c: the
 * state of lowering one model and the helpers every layer uses. */
#ifndef MPT_LANG_LOWER_IMPL_H
#define MPT_LANG_LOWER_IMPL_H

#include "lang/model.h"

typedef struct {
    mpt_graph *g;
    const mpt_flat_model *m;
    const mpt_lower_opts *o;
    int inputs[MPT_MAX_MODEL_INPUTS]; /* the INPUT node of each model input */
    int *val;    /* val[i]: the node holding layer i's output */
    int *pre;    /* pre[i]: the input of layer i's final softmax, or -1 */
    int counter; /* the rng/counter VARIABLE, or -1 until dropout needs it */
} lowerer;

mpt_shape mpt_lw_shape(const lowerer *lw, int node);
int mpt_lw_fconst(lowerer *lw, mpt_shape s, double v);
/* the variable "<layer>/<w>" (mpt_b_variable's arguments) */
int mpt_lw_weight(lowerer *lw, const mpt_flat_layer *L, const char *w, mpt_shape s, int init,
                  int64_t fan_in, int64_t fan_out, double f, int trainable);
int64_t mpt_lw_all_but_last(int rank);
int mpt_lw_activate(lowerer *lw, int i, int x, mpt_activation act);
int mpt_lw_add_bias(lowerer *lw, const mpt_flat_layer *L, int y, int64_t n);
/* inverted dropout at L->rate in training mode (the layer's own stream) */
int mpt_lw_dropout(lowerer *lw, const mpt_flat_layer *L, int x);
/* softmax over the last axis, shifted by the maximum */
int mpt_lw_softmax(lowerer *lw, int x);
/* the node of a layer input (a layer index or MPT_FLAT_INPUT_REF(k)) */
int mpt_lw_value(const lowerer *lw, int in);
/* lang/lower_layers.c: the layers added after the first thirteen */
int mpt_lower_more(lowerer *lw, int i, const mpt_flat_layer *L, int x);

#endif
