/* ir/ — the graph every stage of mptc reads and writes.
 *
 * This header is the whole public surface of ir/: dtypes, the op table,
 * graphs and their builder, the text form, the verifier, the passes (autodiff,
 * policy, train-step construction) and the reference interpreter.
 *
 * A graph is a list of nodes in topological order: a node's inputs always
 * have smaller ids. Passes never edit a graph they were given; they build a
 * new one (see mpt_graph_copy_node).
 */
#ifndef MPT_IR_H
#define MPT_IR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- dtypes ---------------------------------------------------------- */

typedef enum {
    MPT_DT_F32,
    MPT_DT_F16,
    MPT_DT_BF16,
    MPT_DT_I32,
    MPT_DT_BOOL,
    MPT_DT_F64, /* reference interpreter and gradient checks only */
    MPT_DT_COUNT
} mpt_dtype;

const char *mpt_dtype_name(mpt_dtype dt);          /* "f32", "f16", ... */
int mpt_dtype_parse(const char *s, mpt_dtype *out); /* 0 on success */
size_t mpt_dtype_size(mpt_dtype dt);                /* bytes per element */
int mpt_dtype_is_float(mpt_dtype dt);

/* IEEE binary16 and bfloat16, round to nearest even (NaN stays NaN). */
uint16_t mpt_f32_to_f16(float x);
float mpt_f16_to_f32(uint16_t h);
uint16_t mpt_f32_to_bf16(float x);
float mpt_bf16_to_f32(uint16_t h);
/* v rounded exactly to dt and widened back (f64 -> f64 unchanged). */
double mpt_round_to(mpt_dtype dt, double v);

/* ---- the op table ---------------------------------------------------- */

typedef enum {
    MPT_KIND_SOURCE,
    MPT_KIND_STATE,
    MPT_KIND_ELEMENTWISE,
    MPT_KIND_REDUCTION,
    MPT_KIND_MOVEMENT,
    MPT_KIND_GEMM,
    MPT_KIND_CONV,
    MPT_KIND_COLLECTIVE,
    MPT_KIND_COUNT
} mpt_op_kind;

typedef enum {
#define X(ID, name, arity, kind, attrs) MPT_OP_##ID,
#include "ops.def"
#undef X
    MPT_OP_COUNT
} mpt_op;

typedef struct {
    const char *name;
    int arity;
    mpt_op_kind kind;
    const char *attrs; /* comma-separated names of attr.i[] */
} mpt_op_info;

extern const mpt_op_info mpt_op_table[MPT_OP_COUNT];
const char *mpt_op_name(mpt_op op);
int mpt_op_parse(const char *s, mpt_op *out);     /* 0 on success */
int mpt_op_n_attrs(mpt_op op);                    /* how many attr.i[] it uses */
const char *mpt_op_attr_name(mpt_op op, int k, size_t *len); /* k-th name, not NUL-terminated */

/* ---- shapes ---------------------------------------------------------- */

#define MPT_MAX_DIMS 6
#define MPT_MAX_INPUTS 8
#define MPT_MAX_ATTRS 7

typedef struct {
    int rank;
    int64_t dim[MPT_MAX_DIMS];
} mpt_shape;

mpt_shape mpt_shape_make(int rank, const int64_t *dims);
mpt_shape mpt_shape_scalar(void);
mpt_shape mpt_shape_1(int64_t d0);
mpt_shape mpt_shape_2(int64_t d0, int64_t d1);
mpt_shape mpt_shape_4(int64_t d0, int64_t d1, int64_t d2, int64_t d3);
int64_t mpt_shape_numel(mpt_shape s);
int mpt_shape_eq(mpt_shape a, mpt_shape b);
/* "[128,10]" into buf; returns buf */
char *mpt_shape_str(mpt_shape s, char *buf, size_t len);

/* ---- nodes and graphs ------------------------------------------------ */

/* VARIABLE init kinds (attr.i[0]) */
enum {
    MPT_INIT_ZEROS,
    MPT_INIT_ONES,
    MPT_INIT_CONST,          /* every element = attr.f */
    MPT_INIT_GLOROT_UNIFORM, /* U(-l, l), l = sqrt(6 / (fan_in + fan_out)) */
    MPT_INIT_HE_NORMAL,      /* truncated N(0, 2 / fan_in) */
    MPT_INIT_UNIFORM,        /* U(-f, f) */
    MPT_INIT_ORTHOGONAL,     /* Keras' Orthogonal(gain=1) of [prod(dims[:-1]), dims[-1]] */
    MPT_INIT_FORGET_BIAS,    /* an LSTM's bias: 1 in the second quarter (the forget gate), else 0 */
    MPT_INIT_COUNT
};

typedef struct {
    int64_t i[MPT_MAX_ATTRS]; /* meaning per op: ops.def */
    double f;                 /* CONST value, VARIABLE init parameter */
    mpt_dtype dt;             /* CAST target (equals the node's dtype) */
} mpt_attr;

typedef struct {
    mpt_op op;
    mpt_dtype dtype;
    mpt_shape shape;
    int n_in;
    int in[MPT_MAX_INPUTS]; /* node ids, each smaller than this node's */
    mpt_attr attr;
    char *name;  /* INPUT/VARIABLE: the feed or state name; NULL otherwise */
    char *layer; /* the model layer this node came from, or NULL */
} mpt_node;

typedef struct {
    char *name;
    int node;
} mpt_output;

typedef struct {
    int var;   /* a VARIABLE node */
    int value; /* the node whose value the variable takes after the step */
} mpt_update;

typedef struct {
    char *name;
    mpt_node *nodes;
    int n_nodes, cap_nodes;
    mpt_output *outputs;
    int n_outputs, cap_outputs;
    mpt_update *updates;
    int n_updates, cap_updates;
    char *build_layer; /* builder state: the layer new nodes are tagged with */
} mpt_graph;

mpt_graph *mpt_graph_new(const char *name);
void mpt_graph_free(mpt_graph *g);
/* Appends a node whose shape and dtype the caller vouches for (the text
 * parser, passes copying nodes). Returns its id. Strings are copied. */
int mpt_graph_add_raw(mpt_graph *g, mpt_op op, mpt_dtype dt, mpt_shape shape,
                      int n_in, const int *in, const mpt_attr *attr,
                      const char *name, const char *layer);
void mpt_graph_add_output(mpt_graph *g, const char *name, int node);
void mpt_graph_add_update(mpt_graph *g, int var, int value);
/* Index of output/INPUT/VARIABLE by name, or -1. */
int mpt_graph_find_output(const mpt_graph *g, const char *name);
int mpt_graph_find_input(const mpt_graph *g, const char *name);
int mpt_graph_find_variable(const mpt_graph *g, const char *name);
/* The value the variable takes after a step (itself if never updated). */
int mpt_graph_update_of(const mpt_graph *g, int var);
/* consumer counts of every node (outputs and updates count); caller frees */
int *mpt_graph_use_counts(const mpt_graph *g);
/* The nodes reachable from outputs and updates, renumbered; map[old] = new
 * or -1 (map may be NULL). */
mpt_graph *mpt_graph_dce(const mpt_graph *g, int *map);
/* A copy of g where each reduce_sum whose input is linear in statistics
 * broadcast along its reduced axes is rewritten as row-level arithmetic on
 * plain sums (ir/fold.c); n_folded gets how many. NULL when out of memory. */
mpt_graph *mpt_fold_reductions(const mpt_graph *g, int *n_folded);
/* A copy of g where each batch-norm variance sum, sum((x - mean)^2) over
 * all dims but the last, is rewritten as sum((x - s)^2) - n (mean - s)^2
 * with s the first row of x, so it reads x in the same pass as the mean
 * (ir/moments.c); n_rewritten gets how many. NULL when out of memory. */
mpt_graph *mpt_fold_variance(const mpt_graph *g, int *n_rewritten);

/* Attention's core (scores, mask, softmax, P.V) rewritten into one
 * `attention` op per match (ir/attention.c), on a typed forward graph
 * before autodiff. One note per match: the P.V batch_matmul, its layer,
 * what was found and the ops taken, and NULL or why it stays unfused
 * (every match gets refuse_all as its reason when that is not NULL: a
 * backend without the kernel). layout 1: where q, k and v are transposed
 * from [B, T, H, E], the op reads them there (its bthd attr, ops.def).
 * Returns the rewritten graph, or NULL when
 * nothing was rewritten (or memory ran out); the caller frees *notes. */
typedef struct {
    int node;
    char layer[64];
    char what[240];
    const char *reason;
} mpt_attention_note;
mpt_graph *mpt_attention_rewrite(const mpt_graph *g, const char *refuse_all, int layout,
                                 mpt_attention_note **notes, int *n_notes);

/* ---- shape and dtype inference --------------------------------------- */

/* Infers the result of op on the given inputs. Returns NULL and fills
 * *shape and *dt, or a static message saying what is wrong. For ops whose
 * result shape is not a function of their inputs (INPUT, VARIABLE, CONST,
 * IOTA, RESHAPE, CONV2D_BWD_*, AVG_POOL_GRAD, BROADCAST, RANDOM_UNIFORM,
 * SLICE), the caller's *shape is taken as given and checked for
 * consistency. */
const char *mpt_infer(const mpt_graph *g, mpt_op op, int n_in, const int *in,
                      const mpt_attr *attr, mpt_shape *shape, mpt_dtype *dt);

/* ---- the builder ------------------------------------------------------
 * Each call infers shape and dtype and appends a node; a misuse is an
 * internal error (assert with the inference message). The layer recorded
 * on new nodes is g's current layer (mpt_b_layer). */
void mpt_b_layer(mpt_graph *g, const char *layer);
const char *mpt_b_current_layer(const mpt_graph *g);
int mpt_b_input(mpt_graph *g, const char *name, mpt_dtype dt, mpt_shape s);
int mpt_b_variable(mpt_graph *g, const char *name, mpt_shape s, int init,
                   int64_t fan_in, int64_t fan_out, double f, int trainable);
int mpt_b_variable_dt(mpt_graph *g, const char *name, mpt_dtype dt, mpt_shape s,
                      int init, double f); /* non-trainable state of any dtype */
int mpt_b_const(mpt_graph *g, mpt_dtype dt, mpt_shape s, double v);
int mpt_b_scalar(mpt_graph *g, mpt_dtype dt, double v);
int mpt_b_iota(mpt_graph *g, mpt_dtype dt, mpt_shape s, int axis);
int mpt_b_unary(mpt_graph *g, mpt_op op, int a);
int mpt_b_binary(mpt_graph *g, mpt_op op, int a, int b);
int mpt_b_allreduce(mpt_graph *g, int a); /* the sum over the ranks, a's dtype (f32) */
/* REDUCE_SCATTER, ALL_GATHER or RANK_SLICE of the flat a, giving [len] */
int mpt_b_shard_op(mpt_graph *g, mpt_op op, int a, int64_t len);
int mpt_b_select(mpt_graph *g, int cond, int a, int b);
int mpt_b_cast(mpt_graph *g, int a, mpt_dtype dt); /* returns a if already dt */
int mpt_b_reduce(mpt_graph *g, mpt_op op, int a, int64_t axes_mask);
int mpt_b_argmax(mpt_graph *g, int a, int axis);
/* widen a to shape s; dims_mask says which output dims a's dims map to */
int mpt_b_broadcast(mpt_graph *g, int a, mpt_shape s, int64_t dims_mask);
/* widen a scalar, or a's trailing dims, to s (numpy-style, leading dims added) */
int mpt_b_broadcast_to(mpt_graph *g, int a, mpt_shape s);
int mpt_b_reshape(mpt_graph *g, int a, mpt_shape s);
int mpt_b_transpose(mpt_graph *g, int a, const int *perm);
int mpt_b_one_hot(mpt_graph *g, int ids, int depth, mpt_dtype dt);
int mpt_b_gather(mpt_graph *g, int table, int ids);
int mpt_b_scatter_add(mpt_graph *g, int ids, int upd, int64_t rows);
/* x[..., start:start+len, ...] along axis (dtype follows x) */
int mpt_b_slice(mpt_graph *g, int x, int axis, int64_t start, int64_t len);
/* a then b along axis; n-ary joins are balanced trees of these */
int mpt_b_concat(mpt_graph *g, int a, int b, int axis);
int mpt_b_matmul(mpt_graph *g, int a, int b, int trans_a, int trans_b);
/* a [..., M, K] . b [..., K, N] per leading (batch) index, rank 3 or 4;
 * the flags transpose the last two dims of an operand */
int mpt_b_batch_matmul(mpt_graph *g, int a, int b, int trans_a, int trans_b);
/* fused attention (ops.def): in = {q, k, v, mask, counter}, a's i[] its
 * attrs and f its scale -> o; the row log-sum-exp of its scores; and its
 * gradients, in = {q, k, v, o, do, lse, mask, counter}, a->i[0] = which
 * (0 dq, 1 dk, 2 dv) */
int mpt_b_attention(mpt_graph *g, const int *in, const mpt_attr *a);
int mpt_b_attention_lse(mpt_graph *g, int q, int k, int mask, int causal, int bthd, double scale);
int mpt_b_attention_grad(mpt_graph *g, const int *in, const mpt_attr *a);
int mpt_b_conv2d(mpt_graph *g, int x, int w, int sh, int sw, int ph, int pw,
                 mpt_shape out);
int mpt_b_conv2d_bwd_data(mpt_graph *g, int dy, int w, int sh, int sw, int ph,
                          int pw, mpt_shape x_shape);
int mpt_b_conv2d_bwd_filter(mpt_graph *g, int x, int dy, int sh, int sw, int ph,
                            int pw, mpt_shape w_shape);
int mpt_b_pool(mpt_graph *g, mpt_op op, int x, int wh, int ww, int sh, int sw,
               int ph, int pw, mpt_shape out);
int mpt_b_max_pool_grad(mpt_graph *g, int x, int dy, const mpt_attr *pool_attr);
int mpt_b_avg_pool_grad(mpt_graph *g, int dy, const mpt_attr *pool_attr,
                        mpt_shape x_shape);
int mpt_b_random_uniform(mpt_graph *g, int counter, mpt_shape s, int64_t seed);
/* Copies node `id` of `src` into g with inputs remapped by map[]; returns the
 * new id. For passes that rebuild a graph. */
int mpt_graph_copy_node(mpt_graph *g, const mpt_graph *src, int id, const int *map);

/* Convolution/pool output size along one dim, and Keras-style padding. */
int64_t mpt_conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad_lo,
                          int64_t pad_hi);
/* padding "same": total padding and the low (top/left) part */
void mpt_same_padding(int64_t in, int64_t k, int64_t stride, int64_t *pad_lo,
                      int64_t *pad_hi, int64_t *out);

/* ---- text form, verifier --------------------------------------------- */

/* Writes g in the text form (ir/text.c documents it). */
void mpt_graph_print(const mpt_graph *g, FILE *f);
char *mpt_graph_to_string(const mpt_graph *g); /* caller frees */
/* Parses the text form. On error returns NULL and writes
 * "line:col: message" into err. */
mpt_graph *mpt_graph_parse(const char *text, char *err, size_t errlen);
/* Checks every invariant (topological order, arity, inferred shapes and
 * dtypes, outputs, updates). NULL when sound, else a message in buf. */
const char *mpt_graph_verify(const mpt_graph *g, char *buf, size_t len);

/* ---- tensors and the reference interpreter ---------------------------- */

/* A host tensor in its dtype's own storage: f32 float, f16/bf16 uint16_t,
 * i32 int32_t, bool uint8_t, f64 double. */
typedef struct {
    mpt_dtype dtype;
    mpt_shape shape;
    void *data;
} mpt_tensor;

int mpt_tensor_alloc(mpt_tensor *t, mpt_dtype dt, mpt_shape s); /* zeroed; 0 ok */
void mpt_tensor_free(mpt_tensor *t);
size_t mpt_tensor_bytes(const mpt_tensor *t);
double mpt_tensor_get(const mpt_tensor *t, int64_t i); /* element i widened */
void mpt_tensor_set(mpt_tensor *t, int64_t i, double v); /* rounded to dtype */

/* Fills every VARIABLE of g with its initial value, in node order, from a
 * seeded generator. vars[k] is the k-th VARIABLE node's tensor: one already
 * allocated with the variable's dtype and shape is filled in place, a zeroed
 * one is allocated. */
int mpt_graph_n_variables(const mpt_graph *g);
int mpt_graph_variable_node(const mpt_graph *g, int k); /* k-th VARIABLE's id */
int mpt_graph_n_inputs(const mpt_graph *g);
int mpt_graph_input_node(const mpt_graph *g, int k);    /* k-th INPUT's id */
int mpt_init_variables(const mpt_graph *g, mpt_tensor *vars, uint64_t seed);

/* The ranks of a data-parallel run, as ALLREDUCE sees them. In one
 * process (the default, size 1) ALLREDUCE is the identity. The runtime
 * (runtime/dist/) installs its MPI communicator here before compiling;
 * every executor's ALLREDUCE calls allreduce_sum, which sums n values of
 * dtype dt (f32 or f64) at buf in place across the ranks. It returns 0,
 * or -1 with a message (a rank that left, ...). */
typedef struct {
    int rank, size;
    int (*allreduce_sum)(void *ctx, void *buf, int64_t n, mpt_dtype dt, char *err, size_t len);
    void *ctx;
    /* Optional, the same sum without blocking (MPI_Iallreduce): start
     * returns a request in *req (NULL: it already finished), test says
     * whether it finished (1) and lets it progress, wait ends it; buf is
     * the caller's until then. A backend starts a gradient's sum once the
     * gradient is final and waits where a kernel first reads it, so the
     * reduction runs beside the rest of the backward pass. */
    int (*start)(void *ctx, void *buf, int64_t n, mpt_dtype dt, void **req, char *err,
                 size_t len);
    int (*test)(void *ctx, void *req, char *err, size_t len);
    int (*wait)(void *ctx, void *req, char *err, size_t len);
    /* ZeRO-1: out[s] = shard `rank` of the sum of every rank's in[size * s]
     * (MPI_Reduce_scatter_block); out[size * s] = every rank's in[s] in
     * rank order (MPI_Allgather) */
    int (*reduce_scatter)(void *ctx, const void *in, void *out, int64_t s, mpt_dtype dt,
                          char *err, size_t len);
    int (*all_gather)(void *ctx, const void *in, void *out, int64_t s, mpt_dtype dt, char *err,
                      size_t len);
} mpt_collective;

void mpt_collective_set(const mpt_collective *c); /* NULL: back to one process */
const mpt_collective *mpt_collective_get(void);   /* never NULL */
/* Sums buf across the ranks (nothing to do in one process). */
int mpt_collective_allreduce(void *buf, int64_t n, mpt_dtype dt, char *err, size_t len);
/* The non-blocking form (blocking, *req = NULL, where the collective has
 * none or in one process); wait on a NULL request is nothing. */
int mpt_collective_start(void *buf, int64_t n, mpt_dtype dt, void **req, char *err, size_t len);
int mpt_collective_test(void *req, char *err, size_t len); /* 1 done, 0 not yet, -1 error */
int mpt_collective_wait(void *req, char *err, size_t len);
/* The sharded optimizer's moves of a flat [n] value and a rank's [s]
 * shard of it (elements rank * s .. rank * s + s - 1, zero past n):
 * out[s] = this rank's shard of the sum over the ranks of in[n];
 * out[n] = every rank's shard in[s] in rank order, cut at n;
 * out[s] = this rank's shard of its own in[n] (no communication).
 * In one process the rank is 0 and the sum its own value. */
int mpt_collective_reduce_scatter(const void *in, int64_t n, void *out, int64_t s, mpt_dtype dt,
                                  char *err, size_t len);
int mpt_collective_all_gather(const void *in, int64_t s, void *out, int64_t n, mpt_dtype dt,
                              char *err, size_t len);
void mpt_collective_rank_slice(const void *in, int64_t n, void *out, int64_t s, mpt_dtype dt);

typedef struct {
    /* called after every node with its value; for non-finite hunting and
     * debugging. Return non-zero to stop the run. May be NULL. */
    int (*on_node)(void *ctx, const mpt_graph *g, int id, const mpt_tensor *value);
    void *ctx;
} mpt_interp_opts;

/* Runs g once, op by op, rounding every value to its node's dtype.
 * inputs[k] feeds the k-th INPUT node (its dtype and shape must match);
 * vars[k] holds the k-th VARIABLE's value and is overwritten with its
 * update; outputs[k] receives the k-th output (allocated here, the caller
 * frees with mpt_tensor_free). Returns 0, or -1 with a message in err. */
int mpt_interp_run(const mpt_graph *g, const mpt_tensor *inputs, mpt_tensor *vars,
                   mpt_tensor *outputs, const mpt_interp_opts *opts, char *err,
                   size_t errlen);

/* ---- training configuration (given meaning by the train-step builder) --- */

typedef enum {
    MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY,
    MPT_LOSS_CATEGORICAL_CROSSENTROPY,
    MPT_LOSS_MEAN_SQUARED_ERROR,
    MPT_LOSS_COUNT
} mpt_loss_kind;

typedef enum {
    MPT_OPT_SGD,
    MPT_OPT_ADAM,
    MPT_OPT_RMSPROP,
    MPT_OPT_ADAMW,
    MPT_OPT_LION,
    MPT_OPT_ADAFACTOR,
    MPT_OPT_COUNT
} mpt_opt_kind;

/* A learning-rate schedule, a function of the optimizer's step counter
 * "optimizer/iterations" (the applied steps before this one: a step the
 * loss scale skips does not count, as Keras' LossScaleOptimizer does not
 * increment iterations), built as graph ops so it runs inside the
 * compiled step on every backend. Keras 3's formulas and defaults:
 *   constant          lr = initial; kept in the state variable
 *                     "optimizer/learning_rate", which callbacks set
 *   exponential_decay initial * decay_rate ^ (step / decay_steps)
 *   inverse_time_decay initial / (1 + decay_rate * step / decay_steps)
 *                     (both: step / decay_steps floored when staircase)
 *   cosine_decay      with warmup_steps > 0 and a warmup_target: linear
 *                     from initial to warmup_target over warmup_steps,
 *                     then decay from warmup_target; the decay is
 *                     from * ((1 - alpha) * 0.5 (1 + cos(pi min(s, ds) / ds))
 *                     + alpha)
 *   piecewise_constant values[0] while step <= boundaries[0], values[i]
 *                     while boundaries[i-1] < step <= boundaries[i], the
 *                     last value after the last boundary */
typedef enum {
    MPT_LR_CONSTANT,
    MPT_LR_EXPONENTIAL,
    MPT_LR_INVERSE_TIME,
    MPT_LR_COSINE,
    MPT_LR_PIECEWISE,
    MPT_LR_COUNT
} mpt_lr_kind;

#define MPT_LR_MAX_PIECES 32
typedef struct {
    mpt_lr_kind kind;
    double initial, decay_steps, decay_rate, alpha, warmup_target, warmup_steps;
    int staircase, has_warmup_target;
    int n_boundaries; /* piecewise: values has n_boundaries + 1 entries */
    double boundaries[MPT_LR_MAX_PIECES], values[MPT_LR_MAX_PIECES + 1];
} mpt_lr_schedule;

/* Hyperparameters with Keras' defaults filled in where the file is silent:
 * sgd(learning_rate=0.01, momentum=0, nesterov=false),
 * adam(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7),
 * adamw(... as adam, weight_decay=0.004),
 * rmsprop(learning_rate=0.001, rho=0.9, momentum=0, epsilon=1e-7,
 * legacy=false): legacy is tf.keras <= 2.10's formula (ir/optim.c),
 * lion(learning_rate=0.001, beta_1=0.9, beta_2=0.99),
 * adafactor(learning_rate=0.001, beta_2_decay=-0.8, epsilon_1=1e-30,
 * epsilon_2=1e-3, clip_threshold=1, relative_step=true).
 * Every optimizer also takes, as Keras 3's base optimizer:
 *   clipnorm, clipvalue, global_clipnorm (0 = off; at most one of them),
 *   applied to the unscaled f32 gradients;
 *   weight_decay (decoupled: w -= w * weight_decay * lr before the
 *   update), skipped for every variable whose name a POSIX extended
 *   regular expression of exclude_from_weight_decay matches (re.search,
 *   as Keras). */
typedef struct {
    mpt_opt_kind kind;
    double learning_rate, momentum, beta_1, beta_2, epsilon, rho;
    int nesterov;
    int legacy;
    double beta_2_decay, epsilon_1, epsilon_2, clip_threshold; /* adafactor */
    int relative_step;
    mpt_lr_schedule schedule; /* kind CONSTANT: learning_rate above */
    double clipnorm, clipvalue, global_clipnorm;
    double weight_decay;
    const char *const *exclude_from_weight_decay;
    int n_exclude;
} mpt_optimizer_config;

/* Loss scaling. mode: 0 = the policy's default (dynamic for mixed_float16,
 * none otherwise), 1 = none, 2 = dynamic, 3 = fixed at `initial`. */
enum { MPT_LS_DEFAULT, MPT_LS_NONE, MPT_LS_DYNAMIC, MPT_LS_FIXED };
typedef struct {
    int mode;
    double initial;     /* 32768 */
    long period;        /* 2000 finite steps before growing */
    double factor;      /* 2 */
    double min_scale;   /* 1 */
    double max_scale;   /* 2^24 */
    int max_skipped;    /* stop after this many consecutive skipped steps: 50 */
} mpt_loss_scale_config;

const char *mpt_loss_name(mpt_loss_kind k);
const char *mpt_opt_name(mpt_opt_kind k);
const char *mpt_lr_name(mpt_lr_kind k);
/* The schedule's learning rate at step (the interpreter's formula in
 * double: for the progress line and tests). */
double mpt_lr_at(const mpt_lr_schedule *s, double learning_rate, long step);

/* ---- autodiff (ir/autodiff.c) -------------------------------------------
 * Reverse mode: appends to g the gradient of the scalar node y with respect
 * to each node in wrt[]. The backward pass starts from `seed` (a scalar node
 * of y's dtype), or from 1 when seed < 0. grads[i] receives the gradient
 * node of wrt[i] (same shape and dtype as wrt[i]), or -1 when y does not
 * depend on it. One gradient rule per op; gradients of an op are built in
 * that op's dtype, so a cast's gradient is the cast back. Returns 0, or -1
 * with a message (an op without a gradient on the path). */
int mpt_autodiff(mpt_graph *g, int y, int seed, const int *wrt, int n_wrt, int *grads,
                 char *err, size_t errlen);

/* ---- precision policy (ir/policy.c) -------------------------------------
 * Keras policies: float32 (f32/f32), mixed_float16 (f16/f32), mixed_bfloat16
 * (bf16/f32); also float16, bfloat16 (both dtypes low) for per-layer use. */
typedef struct {
    const char *name;
    mpt_dtype compute;
    mpt_dtype variable;
} mpt_policy;

/* 0 and *out set, or -1 for an unknown name */
int mpt_policy_lookup(const char *name, mpt_policy *out);

/* Which list an op kind is on (ir/policy.c prints the lists). */
typedef enum {
    MPT_PLIST_COMPUTE, /* runs in the compute dtype: matmul, conv */
    MPT_PLIST_FLOAT32, /* stays f32: softmax, losses, exp/log, statistics, updates */
    MPT_PLIST_FOLLOW,  /* follows its inputs */
    MPT_PLIST_COUNT
} mpt_plist;

typedef struct {
    mpt_policy global;
    /* per-layer dtype= overrides: layer_names[i] uses layer_policies[i] */
    int n_layers;
    const char *const *layer_names;
    const char *const *layer_policies;
    /* user moves between the lists: names of ops (ops.def spelling) or
     * layer-level kinds the policy pass documents */
    const char *const *moves;      /* op names */
    const mpt_plist *move_to;      /* their new list */
    int n_moves;
} mpt_policy_opts;

/* Returns a new forward graph in which every node has its dtype under the
 * policy and casts are inserted where dtypes meet; variables stay f32
 * (master weights) and are cast to the compute dtype where used. The
 * outputs "output" and "logits" are f32 unless a layer override forces them
 * low. NULL with a message on a bad option. */
mpt_graph *mpt_policy_apply(const mpt_graph *fwd, const mpt_policy_opts *o, char *err,
                            size_t errlen);
/* The list op kind `op` is on under the options' moves. */
mpt_plist mpt_policy_list_of(const mpt_policy_opts *o, mpt_op op);
/* Prints the three lists under the options' moves, one line each. */
void mpt_policy_print_lists(const mpt_policy_opts *o, FILE *f);

/* ---- the train step (ir/train.c) ----------------------------------------- */

/* The metrics a run reports beside the loss, by Keras' names. Each is an
 * f32 scalar output of the train and eval steps, summed over the batch's
 * examples; the runtime divides by the examples it counted:
 *   accuracy  "correct"        examples whose class is right (Keras'
 *                              accuracy for the loss)
 *   mae, mse  "abs_error",     per example, the mean |y - output| or
 *             "sq_error"       (y - output)^2 over its elements (targets of
 *                              the output's shape: mean_squared_error or
 *                              categorical_crossentropy)
 *   top_k     "top_k_correct"  examples whose true class is among the k
 *                              highest outputs, ties counted in (as TF's
 *                              in_top_k); 0 = off */
typedef struct {
    int accuracy, mae, mse, top_k;
} mpt_metrics;

typedef struct {
    mpt_loss_kind loss;
    mpt_optimizer_config opt;
    mpt_loss_scale_config loss_scale; /* mode already resolved: NONE, DYNAMIC or FIXED */
    mpt_metrics metrics;
    /* data parallelism: the ranks of the run (0 or 1: one process). With
     * ranks > 1 the step is one rank's share of a global batch of
     * ranks x its batch, and reduces across ranks with ALLREDUCE (see
     * mpt_train_step) */
    int ranks;
    /* ZeRO-1 (ranks > 1): each rank keeps and updates only its shard of
     * the optimizer state: gradients reduce-scattered, shards updated,
     * weights all-gathered. Slots are "<w>@shard/<slot>" of
     * ceil(numel(w) / ranks) values (runtime/train/checkpoint.c saves
     * them whole) */
    int shard_optimizer;
} mpt_train_opts;

/* From a typed forward graph (INPUT "x"; outputs "output", and "logits"
 * when the output is a softmax) builds the whole train step:
 *   inputs:  "x", "y" (i32 [B] class ids for sparse_categorical_crossentropy;
 *            f32 [B, C] otherwise)
 *   outputs: "loss" (f32 scalar: mean over the batch, before scaling),
 *            the metrics asked for (mpt_metrics: "correct", "abs_error",
 *            "sq_error", "top_k_correct", each an f32 sum over the batch),
 *            "loss_scale" (f32 scalar, the scale used this step), "finite"
 *            (bool scalar: were all gradients finite), "learning_rate"
 *            (f32 scalar, the rate this step used)
 *   state:   the model's variables; optimizer slots "<var>/m", "<var>/v"
 *            (adam), "<var>/momentum" (sgd with momentum, rmsprop with
 *            momentum), "<var>/rms" (rmsprop); "optimizer/iterations" (i32);
 *            loss-scale state "loss_scale/scale" (f32), "loss_scale/good_steps"
 *            (i32), "loss_scale/skipped" (i32) when scaling is on
 * Loss scaling is graph ops: loss * scale, backward, gradients cast to f32
 * and multiplied by 1/scale, one all-finite check, every update (weights,
 * slots, iterations, batch-norm statistics) selected on it, and the scale
 * grown or halved in the graph. */
/* With o->ranks = N > 1 (data parallelism, each rank a 1/N shard of the
 * global batch): every f32 gradient is ALLREDUCE'd (summed) right after
 * its cast, before the unscale, and multiplied by 1/N with it, so the
 * update is the global batch's mean gradient and the finite check sees
 * every rank's values (all ranks skip the same steps); "loss" is
 * averaged and the metric sums summed across ranks; the forward graph's
 * float state updates (batch-norm moving statistics) are averaged, so
 * every rank keeps the same state. The statistics batch norm normalizes
 * with are the rank's own (no synchronized batch norm). An embedding's
 * gradient (a SCATTER_ADD of the batch's rows) is exchanged as the ranks'
 * (ids, rows), ALL_GATHERed and scattered on every rank, where that moves
 * fewer values than the dense table: ranks * ids * (dim + 1) < rows * dim. */
mpt_graph *mpt_train_step(const mpt_graph *fwd, const mpt_train_opts *o, char *err,
                          size_t errlen);
/* The gradients alone, for histograms: inputs "x", "y"; an output
 * "grad/<variable>" (f32, unscaled as the train step unscales them,
 * before clipping) for every trainable variable with a gradient; the
 * variables are read, never updated (batch norm in training mode uses the
 * batch's statistics; dropout the mask the next train step draws). */
mpt_graph *mpt_grad_step(const mpt_graph *fwd, const mpt_train_opts *o, char *err,
                         size_t errlen);
/* Evaluation: inputs "x", "y"; outputs "loss", the metrics asked for,
 * "output"; no updates. fwd is the inference-mode forward graph. */
mpt_graph *mpt_eval_step(const mpt_graph *fwd, const mpt_train_opts *o, char *err,
                         size_t errlen);

#endif
