/* lang/ — the .mpt language: flex lexer, bison parser, AST, diagnostics, and
 * the lowering of a model block to an IR forward graph.
 *
 * This header is the whole public surface of lang/.
 */
#ifndef MPT_LANG_H
#define MPT_LANG_H

#include <stdio.h>
#include "ir/ir.h"

/* mpt_loss_kind, mpt_optimizer_config and mpt_loss_scale_config live in
 * ir/ir.h: the train-step builder, an IR pass, gives them meaning. */

/* Callbacks of the train block (Keras 3's names, arguments and defaults):
 *   early_stopping(monitor="val_loss", min_delta=0, patience=0,
 *                  mode=auto, restore_best_weights=false, start_from_epoch=0)
 *   reduce_lr_on_plateau(monitor="val_loss", factor=0.1, patience=10,
 *                  mode=auto, min_delta=1e-4, cooldown=0, min_lr=0)
 *   model_checkpoint(filepath, monitor="val_loss", mode=auto,
 *                  save_best_only=false): "{epoch}" or "{epoch:02d}" in the
 *                  path is replaced by the epoch number
 * mode auto: max for a monitor naming accuracy, min otherwise. */
typedef enum { MPT_CB_EARLY_STOPPING, MPT_CB_REDUCE_LR, MPT_CB_CHECKPOINT, MPT_CB_COUNT } mpt_callback_kind;
enum { MPT_CB_MODE_AUTO, MPT_CB_MODE_MIN, MPT_CB_MODE_MAX };
#define MPT_MAX_CALLBACKS 8
typedef struct {
    mpt_callback_kind kind;
    char *monitor;
    int mode;
    double min_delta, factor, min_lr;
    long patience, cooldown, start_from_epoch;
    int restore_best_weights, save_best_only;
    char *filepath;
    int line, col; /* where the file names it */
} mpt_callback_config;

/* The train block. Fields the file does not set keep the defaults that
 * mpt_train_config_defaults gives; a *_set flag says the file set it. */
typedef struct {
    char *data;            /* a data spec: "fashion_mnist", "synthetic(...)", "images(\"dir\", size=[h,w])" */
    char *validation_data; /* NULL or a data spec */
    double validation_split; /* 0 = none */
    mpt_loss_kind loss;
    mpt_optimizer_config optimizer;
    mpt_metrics metrics;   /* none unless `metrics = [...]` names them */
    long batch_size;       /* 32 */
    long epochs;           /* 1 */
    char *policy;          /* "float32" unless set */
    mpt_loss_scale_config loss_scale;
    /* policy list overrides: op kinds moved between the lists, e.g.
     * compute_ops = [matmul, conv2d], float32_ops = [softmax, ...] */
    char **compute_ops;  int n_compute_ops;
    char **float32_ops;  int n_float32_ops;
    char **follow_ops;   int n_follow_ops;
    long seed;             /* 0 = not set */
    /* optimizer.exclude_from_weight_decay points into this list */
    char **wd_exclude;   int n_wd_exclude;
    mpt_callback_config callbacks[MPT_MAX_CALLBACKS];
    int n_callbacks;
    char *augment;         /* the source text of `augment = [...]`, or NULL */
} mpt_train_config;

/* The optimizer of a command-line override (`--optimizer adam`, or a whole
 * call such as "adamw(learning_rate=3e-4, weight_decay=0.01)"), parsed as
 * the train block parses it, into *c (which keeps the file's learning rate
 * when the text names none). 0, or -1 with a message in err. */
int mpt_optimizer_parse(const char *text, mpt_train_config *c, char *err, size_t n);

/* Fills the defaults; data ("fashion_mnist") and policy ("float32") are
 * heap strings that mpt_train_config_free frees, like every string here. */
void mpt_train_config_defaults(mpt_train_config *c);
void mpt_train_config_free(mpt_train_config *c);

/* A model has at most this many `input` statements. */
#define MPT_MAX_MODEL_INPUTS 8

/* One model layer, for `mptc check`, fusion explanations and policies. */
typedef struct {
    char *name;          /* "dense_1" (auto-named "<type>_<k>" when unnamed, as Keras) */
    char *type;          /* "dense", "conv2d", ... */
    char *dtype;         /* the layer's dtype= override (a policy name), or NULL */
    mpt_shape out_shape; /* with the batch dim */
    int64_t n_params;    /* trainable + non-trainable */
    int64_t n_trainable;
    int line, col;       /* where it is declared */
} mpt_layer_info;

/* One model input. The first is the graph's INPUT "x", input k > 0 the
 * INPUT "x/<name>"; in the graph they are the first INPUTs, in the order
 * declared, so a step's inputs start with them (runtime/ relies on it). */
typedef struct {
    char *name;        /* as declared: "tokens" */
    char *graph_name;  /* "x", "x/mask" */
    mpt_shape shape;   /* without the batch dim */
    mpt_dtype dtype;   /* f32, or i32 when it feeds an embedding */
    int64_t vocab;     /* i32: the smallest input_dim of the embeddings reading it */
    int mask_only;     /* read only as a multi_head_attention attention_mask */
    int line, col;
} mpt_model_input;

/* A model lowered to a forward graph for one batch size.
 * The graph has INPUT "x" (f32, [batch, ...input shape]), "x/<name>" for
 * every further input, and the output
 * "output" (the last layer's value); when the model ends in a softmax
 * activation, also the output "logits" (its input), so the loss can be built
 * from logits as Keras does. Every node carries the name of its layer.
 * Variables are named "<layer>/<weight>": dense_1/kernel [in,out],
 * dense_1/bias, conv_1/kernel [kh,kw,cin,cout], bn_1/gamma, bn_1/beta,
 * bn_1/moving_mean, bn_1/moving_variance, emb/embeddings [V,D],
 * ln/gamma, ln/beta; and "rng/counter" (i32 scalar) when dropout is used.
 * In training mode, batch_norm uses batch statistics and adds updates of its
 * moving statistics (momentum 0.99, epsilon 1e-3, as Keras), dropout is
 * active (inverted scaling) and rng/counter advances by one each step. */
typedef struct {
    char *name;        /* the model block's name */
    char *path;
    mpt_graph *graph;
    mpt_layer_info *layers;
    int n_layers;
    mpt_shape input_shape;  /* the first input's, without the batch dim */
    mpt_dtype input_dtype;  /* the first input's: f32, or i32 for embedding inputs */
    mpt_model_input inputs[MPT_MAX_MODEL_INPUTS];
    int n_inputs;
    mpt_train_config train;
} mpt_model;

typedef struct {
    long batch_size; /* the batch dim of every shape */
    int training;    /* 1: training-mode batch_norm/dropout */
} mpt_lower_opts;

/* Parses and lowers the file. Diagnostics go to diag as
 * "file:line:col: error: message", the source line and a caret; returns the
 * number of errors (0 = *out is set). Never exits, never crashes.
 * opts may be NULL, and opts->batch_size 0: then the train block's
 * batch_size (NULL opts also means training mode). diag may be NULL. */
int mpt_lang_load(const char *path, const mpt_lower_opts *opts, mpt_model **out,
                  FILE *diag);
/* Same, from a string; `path` names it in diagnostics. */
int mpt_lang_load_string(const char *path, const char *src,
                         const mpt_lower_opts *opts, mpt_model **out, FILE *diag);
void mpt_model_free(mpt_model *m);

/* The candidate closest to word by edit distance, or NULL when none is
 * close enough to suggest (the "did you mean" of the diagnostics, for the
 * command line too). */
const char *mpt_diag_closest(const char *word, const char *const *cands, int n);


#endif
