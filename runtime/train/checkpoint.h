/* runtime/checkpoint.h — safetensors checkpoints (private to runtime/).
 *
 * A checkpoint is a safetensors file: 8 bytes little-endian header length,
 * a JSON header {"name": {"dtype", "shape", "data_offsets"}, ...,
 * "__metadata__": {...}}, then the raw little-endian tensors. Names are the
 * state names of the train step: "dense_1/kernel" [in, out],
 * "conv_1/kernel" [kh, kw, cin, cout], "bn_1/moving_mean", optimizer slots
 * "dense_1/kernel/m", "optimizer/iterations", "loss_scale/scale",
 * "rng/counter" ... The metadata holds the step, the seed, the policy, the
 * model name, the batch size and the steps per epoch (docs/CHECKPOINTS.md).
 * Writes go to PATH.tmp, which is fsynced and renamed over the target (and
 * the directory fsynced), so a run killed while saving leaves the previous
 * file intact. */
#ifndef MPT_CHECKPOINT_H
#define MPT_CHECKPOINT_H

#include "runtime/train/runtime.h"

typedef enum {
    MPT_CKPT_ALL,     /* every state tensor and the metadata (--resume) */
    MPT_CKPT_WEIGHTS, /* the model's variables only (--init-weights, eval) */
} mpt_ckpt_what;

typedef struct {
    long step;
    uint64_t seed;
    long batch_size;      /* 0: not recorded */
    long steps_per_epoch; /* 0: not recorded */
} mpt_ckpt_meta;

int mpt_ckpt_save(const char *path, const mpt_session *s, const mpt_ckpt_meta *m, char *err,
                  size_t n);
/* Loads into the session's state by name. Nothing is changed unless every
 * wanted tensor matches; otherwise every missing, unexpected or mismatched
 * name, shape or dtype is listed in err (as many as fit in n). m may be
 * NULL. */
int mpt_ckpt_load(const char *path, mpt_session *s, mpt_ckpt_what what, mpt_ckpt_meta *m,
                  char *err, size_t n);

/* 1 when state variable k of the session is a model weight: a float
 * variable of the forward graph (batch-norm statistics count; optimizer
 * slots, the loss scale and rng/counter do not). */
int mpt_ckpt_is_weight(const mpt_session *s, int k);

/* For eval and predict: compiles the model with its evaluation step
 * (want_eval is set here) and loads the model's weights from path.
 * Returns 0, or -1 after printing what went wrong to stderr. */
int mpt_ckpt_open_inference(const mpt_compile_opts *o, const char *path, mpt_session **out);

#endif
