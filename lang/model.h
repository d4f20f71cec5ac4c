/* lang/model.h — the model after block expansion: a flat list of layers in
 * topological order, each with its evaluated arguments, its inputs and (after
 * shape inference) its output shape. Internal to lang/. */
#ifndef MPT_LANG_MODEL_H
#define MPT_LANG_MODEL_H

#include "lang/ast.h"
#include "lang/lang.h"

typedef enum {
    MPT_L_DENSE,
    MPT_L_CONV2D,
    MPT_L_BATCH_NORM,
    MPT_L_ACTIVATION,
    MPT_L_MAX_POOL2D,
    MPT_L_AVG_POOL2D,
    MPT_L_GLOBAL_AVG_POOL2D,
    MPT_L_FLATTEN,
    MPT_L_RESHAPE,
    MPT_L_ADD,
    MPT_L_EMBEDDING,
    MPT_L_DROPOUT,
    MPT_L_LAYER_NORM,
    MPT_L_MULTIPLY,
    MPT_L_CONCATENATE,
    MPT_L_UP_SAMPLING2D,
    MPT_L_CONV2D_TRANSPOSE,
    MPT_L_GLOBAL_MAX_POOL2D,
    MPT_L_GLOBAL_AVG_POOL1D,
    MPT_L_GLOBAL_MAX_POOL1D,
    MPT_L_POSITION_EMBEDDING,
    MPT_L_LSTM,
    MPT_L_GRU,
    MPT_L_DEPTHWISE_CONV2D,
    MPT_L_SEPARABLE_CONV2D,
    MPT_L_MULTI_HEAD_ATTENTION,
    MPT_L_COUNT
} mpt_layer_kind;

typedef enum {
    MPT_ACT_LINEAR,
    MPT_ACT_RELU,
    MPT_ACT_GELU,
    MPT_ACT_SIGMOID,
    MPT_ACT_TANH,
    MPT_ACT_SOFTMAX,
    MPT_ACT_COUNT
} mpt_activation;

typedef enum { MPT_PAD_VALID, MPT_PAD_SAME, MPT_PAD_EXPLICIT } mpt_padding;

/* Model inputs as layer input indices: input k is -1 - k, so the first
 * (MPT_FLAT_INPUT) is -1 and every layer index is >= 0. */
#define MPT_FLAT_INPUT (-1)
#define MPT_FLAT_INPUT_REF(k) (-1 - (k))
#define MPT_FLAT_INPUT_OF(ref) (-1 - (ref))
/* no layer or input (an attention_mask not given) */
#define MPT_FLAT_NO_REF (-1000)

typedef struct {
    mpt_layer_kind kind;
    char *name;   /* full name: "b1/conv_1" inside instance b1 */
    char *dtype;  /* dtype= override, or NULL */
    mpt_loc loc;  /* the layer statement */
    int *in;      /* earlier layer indices, or MPT_FLAT_INPUT_REF(k) */
    int n_in;
    /* arguments; only those of the kind are meaningful */
    int64_t units, filters, input_dim, output_dim;
    int64_t kernel[2], strides[2], pool[2];
    mpt_padding padding;
    int64_t pad[2];          /* MPT_PAD_EXPLICIT: rows/cols added on each side */
    mpt_activation act;
    int use_bias;
    double momentum, epsilon, rate;
    mpt_shape target;        /* reshape, without the batch dim */
    int64_t size[2];         /* up_sampling2d */
    int axis;                /* concatenate: as written, negative from the end */
    int64_t max_length;      /* position_embedding */
    mpt_activation rec_act;  /* lstm, gru: recurrent_activation */
    int return_sequences, reset_after;
    int64_t depth_multiplier; /* depthwise_conv2d, separable_conv2d */
    int64_t num_heads, key_dim, value_dim; /* multi_head_attention (value_dim 0: key_dim) */
    int use_causal_mask;
    /* multi_head_attention's attention_mask=NAME: the name as written
     * (mask_name, NULL when not given) and, once resolved, its layer
     * index or input ref in mask (MPT_FLAT_NO_REF when not given) */
    char *mask_name;
    mpt_loc mask_loc;
    int mask;
    /* filled by shape inference; shapes without the batch dim */
    mpt_shape out;
    int64_t n_params, n_trainable;
} mpt_flat_layer;

/* One `input NAME: [dims]`; its dtype and role come from its readers
 * (shape inference). */
typedef struct {
    char *name;
    mpt_loc loc;
    mpt_shape shape;
    mpt_dtype dtype;  /* i32 when an embedding reads it, else f32 */
    int64_t vocab;    /* the smallest input_dim of the embeddings reading it, or 0 */
    int mask_only;    /* read only as attention_mask= */
} mpt_flat_input;

typedef struct {
    char *name;
    mpt_loc loc;
    mpt_flat_input inputs[MPT_MAX_MODEL_INPUTS];
    int n_inputs;
    mpt_flat_layer *layers;
    int n_layers, cap_layers;
    int output; /* the layer whose value is the model's output */
} mpt_flat_model;

void mpt_flat_model_free(mpt_flat_model *m);
const char *mpt_layer_kind_name(mpt_layer_kind k);
const char *mpt_activation_name(mpt_activation a);

/* Expands the model (blocks, repeats, names, inputs) of a parsed file into
 * m. Errors go to d. */
void mpt_expand(mpt_diag *d, const mpt_ast *model, const mpt_ast *file, mpt_flat_model *m);
/* Infers every layer's output shape and parameter counts; errors go to d. */
void mpt_infer_shapes(mpt_diag *d, mpt_flat_model *m);
/* Output size and top/left padding of a conv/pool window along axis 0 (h)
 * or 1 (w); -1 when the window does not fit. */
int mpt_window_out(const mpt_flat_layer *L, int axis, int64_t in, int64_t *pad_lo, int64_t *out);
/* Fills c from a train block (c already holds the defaults). */
void mpt_train_from_ast(mpt_diag *d, const mpt_ast *train, mpt_train_config *c);

/* Builds the forward graph of a checked model. */
mpt_graph *mpt_lower(const mpt_flat_model *m, const mpt_lower_opts *opts);

/* ---- layer types (lang/layers.c) ------------------------------------- */

int mpt_layer_kind_parse(const char *s, mpt_layer_kind *out); /* 0 on success */
const char *mpt_layer_kind_closest(const char *s);           /* a near type name or NULL */
void mpt_layer_arity(mpt_layer_kind k, int *min_in, int *max_in);
/* 1 for the layers whose window is their `kernel` (convolutions), 0 for
 * pools (their `pool`) */
int mpt_layer_has_kernel(mpt_layer_kind k);

/* ---- evaluated argument values (lang/value.c) ------------------------- */

typedef enum { MPT_V_INT, MPT_V_FLOAT, MPT_V_SYM, MPT_V_STR, MPT_V_LIST, MPT_V_CALL } mpt_value_kind;

typedef struct mpt_value mpt_value;
struct mpt_value {
    mpt_value_kind kind;
    mpt_loc loc;
    long long i;
    double f;
    char *s;         /* SYM, STR, CALL callee */
    mpt_value *items; /* LIST elements, CALL arguments */
    char **keys;      /* CALL: argument names (NULL entries for positional) */
    int n;
};

/* A name bound to a value: block parameters. */
typedef struct {
    const char *name;
    mpt_value value;
} mpt_binding;

typedef struct {
    const mpt_binding *b;
    int n;
} mpt_env;

/* Evaluates e: integer arithmetic is checked for overflow, names bound in
 * env are replaced by their values, other names are symbols. Returns 0, or
 * -1 after reporting an error. */
int mpt_eval(mpt_diag *d, const mpt_ast *e, const mpt_env *env, mpt_value *out);
void mpt_value_free(mpt_value *v);
mpt_value mpt_value_copy(const mpt_value *v);
/* "integer 3", "name relu", ... for messages */
const char *mpt_value_kind_name(mpt_value_kind k);
int mpt_value_is_number(const mpt_value *v);

/* Train-setting values (lang/train_block.c): the index of v's name in
 * names, a number in [lo, hi], a count from lo; each -1 after an error. */
int mpt_set_pick(mpt_diag *d, const mpt_value *v, const char *what, const char *const *names,
                 int n);
int mpt_set_number(mpt_diag *d, const mpt_value *v, const char *what, double lo, double hi,
                   double *out);
int mpt_set_count(mpt_diag *d, const mpt_value *v, const char *what, long lo, long *out);
/* lang/train_optim.c: `optimizer = ...` with its schedule, clipping and
 * weight decay; `callbacks = [...]`; Keras' defaults of an optimizer */
void mpt_set_optimizer(mpt_diag *d, const mpt_value *v, mpt_train_config *c);
void mpt_set_callbacks(mpt_diag *d, const mpt_value *v, mpt_train_config *c);
void mpt_optimizer_defaults(mpt_optimizer_config *o, mpt_opt_kind kind);
double mpt_value_number(const mpt_value *v);

/* Sets L's arguments (L->kind set) from a layer statement, defaults where
 * silent. Returns 0, or -1 after reporting errors. */
int mpt_layer_set_args(mpt_diag *d, const mpt_ast *stmt, const mpt_env *env, mpt_flat_layer *L);

#endif
