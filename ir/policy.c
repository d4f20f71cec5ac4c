/* ir/policy.c — the precision policy pass: gives every node of an f32
 * forward graph its dtype under a Keras-style policy and inserts the casts
 * where dtypes meet.
 *
 * Decisions (Keras 2 mixed precision is the reference; seed 003):
 *
 *  - Policies: float32 (f32/f32), mixed_float16 (f16/f32), mixed_bfloat16
 *    (bf16/f32), and for per-layer use float16 and bfloat16 (both dtypes
 *    low). Variables are nevertheless always f32 master weights here: a
 *    float16 layer computes in f16 from a cast of its f32 variables.
 *  - A node's policy is its layer's: the layer's dtype= override if it has
 *    one, else the global policy. Nodes without a layer take the global one.
 *  - Three lists decide an op's dtype (mpt_policy_print_lists shows them):
 *      COMPUTE  matmul, batch_matmul, conv2d and its two backward ops: the
 *               layer's compute dtype; their inputs are cast to it.
 *      FLOAT32  exp, log, reduce_sum: always f32, inputs cast up. exp and log
 *               are where f16 overflows (exp(x) for x > 11) and loses the
 *               small end; reduce_sum produces every statistic (softmax
 *               denominators, batch/layer-norm mean and variance, pooled
 *               means). With these in f32 a softmax is f32 from its exp on
 *               and batch/layer norm run wholly in f32, as Keras' BN and LN
 *               upcast internally. This is stricter than Keras for a softmax
 *               left at the mixed policy (Keras would run it in f16), which
 *               the guide calls a mistake anyway.
 *      FOLLOW   every other op: the dtype of its inputs.
 *    Users move ops between lists by op name, or by these group names:
 *    "dense" (matmul), "conv" (the three conv ops), "softmax" (exp, log,
 *    reduce_sum), "reductions" (reduce_sum, reduce_max). Sources, variables
 *    and casts have no dtype choice and cannot be moved.
 *  - FOLLOW, precisely: inputs that are activations vote; variables (also
 *    seen through broadcast/reshape/transpose/slice, like a bias or an
 *    LSTM's gate kernels), constants and 0/1 masks do not (they are
 *    converted to whatever the op picks). An
 *    activation arriving from another layer (or an INPUT) votes with the
 *    consuming layer's compute dtype, because Keras casts a layer's floating
 *    inputs to its compute dtype when the layer is called. The widest vote
 *    wins (f32 over f16/bf16; f16 with bf16 gives f32), so mixing a low
 *    activation with an f32 statistic happens in f32. With no votes, an op
 *    on variables is state arithmetic (a moving average) and runs in the
 *    variables' f32; an op on constants only runs in the compute dtype.
 *  - Variables stay f32 and are cast where an op needs them low: one cast
 *    per (variable, dtype), shared by all its uses. An embedding lookup
 *    (gather from a variable) gathers the f32 rows and casts the result, as
 *    Keras' Embedding does, instead of casting the whole table.
 *  - Constants (const, and broadcast/reshape/transpose/slice of them),
 *    one_hot and casts from bool are rebuilt directly in the dtype their
 *    consumer needs, so no cast node is spent on them.
 *  - The INPUT "x" stays f32; the first layer casts it (the rule above).
 *  - Casts already in the forward graph keep their target dtype.
 *  - Every float output of the forward graph (the model's "output" and
 *    "logits") is cast to f32, unless the producing layer has a dtype=
 *    override with a low compute dtype: then it stays low and the caller
 *    warns.
 *  - Forward-graph updates (batch-norm moving statistics) are cast to their
 *    variable's dtype.
 *  - The pass only ever adds casts; nothing later may drop or merge them,
 *    so fused and unfused runs round at the same places.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

/* ---- policies ----------------------------------------------------------- */

static const mpt_policy policies[] = {
    {"float32", MPT_DT_F32, MPT_DT_F32},
    {"mixed_float16", MPT_DT_F16, MPT_DT_F32},
    {"mixed_bfloat16", MPT_DT_BF16, MPT_DT_F32},
    {"float16", MPT_DT_F16, MPT_DT_F16},
    {"bfloat16", MPT_DT_BF16, MPT_DT_BF16},
};

int mpt_policy_lookup(const char *name, mpt_policy *out) {
    if (!name) return -1;
    for (size_t i = 0; i < sizeof policies / sizeof policies[0]; i++)
        if (strcmp(policies[i].name, name) == 0) {
            *out = policies[i];
            return 0;
        }
    return -1;
}

/* ---- the lists ------------------------------------------------------------ */

/* Ops whose dtype is not a choice: fixed by the feed, the state, the
 * generator or the cast itself. */
static int has_dtype_choice(mpt_op op) {
    return op != MPT_OP_INPUT && op != MPT_OP_VARIABLE && op != MPT_OP_CONST &&
           op != MPT_OP_IOTA && op != MPT_OP_RANDOM_UNIFORM && op != MPT_OP_CAST;
}

static mpt_plist default_list(mpt_op op) {
    switch (op) {
    case MPT_OP_MATMUL:
    case MPT_OP_BATCH_MATMUL:
    case MPT_OP_CONV2D:
    case MPT_OP_CONV2D_BWD_DATA:
    case MPT_OP_CONV2D_BWD_FILTER:
    case MPT_OP_ATTENTION: case MPT_OP_ATTENTION_LSE: case MPT_OP_ATTENTION_GRAD:
        return MPT_PLIST_COMPUTE;
    case MPT_OP_EXP:
    case MPT_OP_LOG:
    case MPT_OP_SIN:
    case MPT_OP_COS:
    case MPT_OP_REDUCE_SUM:
    case MPT_OP_ALLREDUCE: /* sums across ranks in f32 */
    case MPT_OP_REDUCE_SCATTER:
    case MPT_OP_ALL_GATHER:
        return MPT_PLIST_FLOAT32;
    case MPT_OP_INPUT: case MPT_OP_VARIABLE: case MPT_OP_CONST: case MPT_OP_IOTA:
    case MPT_OP_RANDOM_UNIFORM: case MPT_OP_NEG: case MPT_OP_ABS: case MPT_OP_SQRT:
    case MPT_OP_RSQRT: case MPT_OP_RECIP: case MPT_OP_SQUARE: case MPT_OP_RELU:
    case MPT_OP_SIGMOID: case MPT_OP_TANH: case MPT_OP_GELU: case MPT_OP_GELU_GRAD:
    case MPT_OP_CAST: case MPT_OP_IS_FINITE: case MPT_OP_NOT: case MPT_OP_ADD:
    case MPT_OP_SUB: case MPT_OP_MUL: case MPT_OP_DIV: case MPT_OP_MAX: case MPT_OP_MIN:
    case MPT_OP_POW: case MPT_OP_LT: case MPT_OP_GT: case MPT_OP_EQ: case MPT_OP_AND:
    case MPT_OP_SELECT: case MPT_OP_REDUCE_MAX: case MPT_OP_REDUCE_ALL: case MPT_OP_ARGMAX:
    case MPT_OP_BROADCAST: case MPT_OP_RESHAPE: case MPT_OP_TRANSPOSE: case MPT_OP_ONE_HOT:
    case MPT_OP_GATHER: case MPT_OP_SCATTER_ADD: case MPT_OP_MAX_POOL:
    case MPT_OP_MAX_POOL_GRAD: case MPT_OP_AVG_POOL: case MPT_OP_AVG_POOL_GRAD:
    case MPT_OP_SLICE: case MPT_OP_CONCAT: case MPT_OP_RANK_SLICE:
        return MPT_PLIST_FOLLOW;
    case MPT_OP_COUNT:
        break;
    }
    assert(!"default_list: not an op");
    return MPT_PLIST_FOLLOW;
}

/* Group names a user may move instead of single ops. */
static const struct {
    const char *name;
    mpt_op ops[3];
    int n;
} groups[] = {
    {"dense", {MPT_OP_MATMUL}, 1},
    {"conv", {MPT_OP_CONV2D, MPT_OP_CONV2D_BWD_DATA, MPT_OP_CONV2D_BWD_FILTER}, 3},
    {"softmax", {MPT_OP_EXP, MPT_OP_LOG, MPT_OP_REDUCE_SUM}, 3},
    {"reductions", {MPT_OP_REDUCE_SUM, MPT_OP_REDUCE_MAX}, 2},
};
#define N_GROUPS (int)(sizeof groups / sizeof groups[0])

static int move_names_op(const char *name, mpt_op op) {
    mpt_op parsed;
    if (mpt_op_parse(name, &parsed) == 0) return parsed == op;
    for (int g = 0; g < N_GROUPS; g++)
        if (strcmp(groups[g].name, name) == 0)
            for (int k = 0; k < groups[g].n; k++)
                if (groups[g].ops[k] == op) return 1;
    return 0;
}

mpt_plist mpt_policy_list_of(const mpt_policy_opts *o, mpt_op op) {
    mpt_plist l = default_list(op);
    if (!has_dtype_choice(op) || !o) return l;
    for (int i = 0; i < o->n_moves; i++) /* later moves win */
        if (o->moves[i] && move_names_op(o->moves[i], op)) l = o->move_to[i];
    return l;
}

static const char *plist_name(mpt_plist l) {
    switch (l) {
    case MPT_PLIST_COMPUTE: return "compute";
    case MPT_PLIST_FLOAT32: return "float32";
    case MPT_PLIST_FOLLOW: return "follow";
    case MPT_PLIST_COUNT: break;
    }
    return "?";
}

void mpt_policy_print_lists(const mpt_policy_opts *o, FILE *f) {
    static const char *what[MPT_PLIST_COUNT] = {
        "the layer's compute dtype",
        "always f32",
        "the dtype of their inputs",
    };
    for (int l = 0; l < MPT_PLIST_COUNT; l++) {
        fprintf(f, "%-8s (%s):", plist_name((mpt_plist)l), what[l]);
        for (int op = 0; op < MPT_OP_COUNT; op++)
            if (has_dtype_choice((mpt_op)op) && mpt_policy_list_of(o, (mpt_op)op) == (mpt_plist)l)
                fprintf(f, " %s", mpt_op_name((mpt_op)op));
        fputc('\n', f);
    }
}

/* ---- the pass ------------------------------------------------------------- */

typedef struct {
    const mpt_graph *src;
    const mpt_policy_opts *o;
    mpt_graph *g;
    mpt_policy *layer_pol; /* parsed o->layer_policies */
    int *val;              /* val[i]: src node i in the new graph, its own dtype */
    int *as[MPT_DT_COUNT]; /* as[dt][i]: src node i converted to dt */
    char *weak;            /* WEAK_*: rebuilt per consumer dtype */
} pass;

/* Values the pass rebuilds in whatever dtype a consumer needs instead of
 * casting them: constants and masks (rebuilt outright), and movement ops
 * over variables (rebuilt over the variable's one shared cast). */
enum { WEAK_NONE, WEAK_CONST, WEAK_STATE };

static int same_layer(const char *a, const char *b) {
    if (!a || !b) return a == b;
    return strcmp(a, b) == 0;
}

/* The layer's override, or NULL. */
static const mpt_policy *layer_override(const pass *p, const char *layer) {
    if (!layer) return NULL;
    for (int i = 0; i < p->o->n_layers; i++)
        if (strcmp(p->o->layer_names[i], layer) == 0) return &p->layer_pol[i];
    return NULL;
}

static mpt_dtype compute_dtype(const pass *p, const char *layer) {
    const mpt_policy *pol = layer_override(p, layer);
    return pol ? pol->compute : p->o->global.compute;
}

static int is_low(mpt_dtype dt) { return dt == MPT_DT_F16 || dt == MPT_DT_BF16; }

/* The wider of two float dtypes; f16 and bf16 meet in f32. */
static mpt_dtype widest(mpt_dtype a, mpt_dtype b) {
    if (a == b) return a;
    return MPT_DT_F32;
}

/* Appends op with inferred dtype; the source node supplies attributes,
 * the shape of ops whose shape is given, and the name. */
static int emit(mpt_graph *g, mpt_op op, int n_in, const int *in, const mpt_attr *attr,
                mpt_shape shape, mpt_dtype dt, const char *name, const char *layer) {
    mpt_attr a = *attr;
    if (op == MPT_OP_CAST) a.dt = dt;
    const char *e = mpt_infer(g, op, n_in, in, &a, &shape, &dt);
    if (e) {
        fprintf(stderr, "mptc: internal error in the policy pass at %s (layer %s): %s\n",
                mpt_op_name(op), layer ? layer : "-", e);
        assert(!"policy pass built an ill-typed node (see the message above)");
        abort();
    }
    return mpt_graph_add_raw(g, op, dt, shape, n_in, in, &a, name, layer);
}

static int emit_cast(pass *p, int v, mpt_dtype dt, const char *layer) {
    mpt_attr a = {.dt = dt};
    return emit(p->g, MPT_OP_CAST, 1, &v, &a, p->g->nodes[v].shape, dt, NULL, layer);
}

static int convert(pass *p, int i, mpt_dtype dt, const char *layer);

/* Node i of src as it is (weak nodes in their source dtype). */
static int natural(pass *p, int i) {
    return p->weak[i] ? convert(p, i, p->src->nodes[i].dtype, p->src->nodes[i].layer)
                      : p->val[i];
}

/* A weak node rebuilt in dt. */
static int rebuild_weak(pass *p, int i, mpt_dtype dt) {
    const mpt_node *n = &p->src->nodes[i];
    int in[MPT_MAX_INPUTS];
    switch (n->op) {
    case MPT_OP_CONST: {
        mpt_attr a = n->attr;
        a.f = mpt_round_to(dt, n->attr.f);
        return emit(p->g, MPT_OP_CONST, 0, NULL, &a, n->shape, dt, NULL, n->layer);
    }
    case MPT_OP_ONE_HOT:
        in[0] = natural(p, n->in[0]);
        return emit(p->g, MPT_OP_ONE_HOT, 1, in, &n->attr, n->shape, dt, NULL, n->layer);
    case MPT_OP_CAST:
        return emit_cast(p, natural(p, n->in[0]), dt, n->layer);
    case MPT_OP_BROADCAST:
    case MPT_OP_RESHAPE:
    case MPT_OP_TRANSPOSE:
    case MPT_OP_SLICE:
        in[0] = convert(p, n->in[0], dt, n->layer);
        return emit(p->g, n->op, 1, in, &n->attr, n->shape, dt, NULL, n->layer);
    case MPT_OP_INPUT: case MPT_OP_VARIABLE: case MPT_OP_IOTA: case MPT_OP_RANDOM_UNIFORM:
    case MPT_OP_NEG: case MPT_OP_ABS: case MPT_OP_EXP: case MPT_OP_LOG: case MPT_OP_SQRT:
    case MPT_OP_RSQRT: case MPT_OP_RECIP: case MPT_OP_SQUARE: case MPT_OP_RELU:
    case MPT_OP_SIGMOID: case MPT_OP_TANH: case MPT_OP_GELU: case MPT_OP_GELU_GRAD:
    case MPT_OP_SIN: case MPT_OP_COS:
    case MPT_OP_IS_FINITE: case MPT_OP_NOT: case MPT_OP_ADD: case MPT_OP_SUB:
    case MPT_OP_MUL: case MPT_OP_DIV: case MPT_OP_MAX: case MPT_OP_MIN: case MPT_OP_POW:
    case MPT_OP_LT: case MPT_OP_GT: case MPT_OP_EQ: case MPT_OP_AND: case MPT_OP_SELECT:
    case MPT_OP_REDUCE_SUM: case MPT_OP_REDUCE_MAX: case MPT_OP_REDUCE_ALL:
    case MPT_OP_ARGMAX: case MPT_OP_GATHER: case MPT_OP_SCATTER_ADD: case MPT_OP_MATMUL:
    case MPT_OP_BATCH_MATMUL: case MPT_OP_CONV2D: case MPT_OP_CONV2D_BWD_DATA: case MPT_OP_CONV2D_BWD_FILTER:
    case MPT_OP_MAX_POOL: case MPT_OP_MAX_POOL_GRAD: case MPT_OP_AVG_POOL:
    case MPT_OP_AVG_POOL_GRAD: case MPT_OP_CONCAT: case MPT_OP_ALLREDUCE: case MPT_OP_REDUCE_SCATTER: case MPT_OP_ALL_GATHER:
    case MPT_OP_RANK_SLICE: case MPT_OP_ATTENTION: case MPT_OP_ATTENTION_LSE: case MPT_OP_ATTENTION_GRAD:
    case MPT_OP_COUNT:
        break;
    }
    assert(!"rebuild_weak: this op is never weak");
    return -1;
}

/* Src node i's value in dt, made once and shared. `layer` tags a new cast:
 * the consumer's layer (Keras casts at the layer's call). */
static int convert(pass *p, int i, mpt_dtype dt, const char *layer) {
    if (p->as[dt][i] >= 0) return p->as[dt][i];
    int r;
    if (p->weak[i]) {
        r = rebuild_weak(p, i, dt);
    } else {
        int v = p->val[i];
        if (p->g->nodes[v].dtype == dt) return v;
        /* a variable's cast belongs to the variable's layer: it is shared */
        const mpt_node *n = &p->src->nodes[i];
        r = emit_cast(p, v, dt, n->op == MPT_OP_VARIABLE ? n->layer : layer);
    }
    p->as[dt][i] = r;
    return r;
}

static int weak_kind(const pass *p, int i) {
    const mpt_node *n = &p->src->nodes[i];
    switch (n->op) {
    case MPT_OP_CONST:
        return mpt_dtype_is_float(n->dtype) ? WEAK_CONST : WEAK_NONE;
    case MPT_OP_ONE_HOT:
        return WEAK_CONST;
    case MPT_OP_CAST:
        return p->src->nodes[n->in[0]].dtype == MPT_DT_BOOL && mpt_dtype_is_float(n->dtype)
                   ? WEAK_CONST : WEAK_NONE;
    case MPT_OP_BROADCAST:
    case MPT_OP_RESHAPE:
    case MPT_OP_TRANSPOSE:
    case MPT_OP_SLICE: {
        const mpt_node *a = &p->src->nodes[n->in[0]];
        if (a->op == MPT_OP_VARIABLE && mpt_dtype_is_float(a->dtype)) return WEAK_STATE;
        return p->weak[n->in[0]];
    }
    case MPT_OP_INPUT: case MPT_OP_VARIABLE: case MPT_OP_IOTA: case MPT_OP_RANDOM_UNIFORM:
    case MPT_OP_NEG: case MPT_OP_ABS: case MPT_OP_EXP: case MPT_OP_LOG: case MPT_OP_SQRT:
    case MPT_OP_RSQRT: case MPT_OP_RECIP: case MPT_OP_SQUARE: case MPT_OP_RELU:
    case MPT_OP_SIGMOID: case MPT_OP_TANH: case MPT_OP_GELU: case MPT_OP_GELU_GRAD:
    case MPT_OP_SIN: case MPT_OP_COS:
    case MPT_OP_IS_FINITE: case MPT_OP_NOT: case MPT_OP_ADD: case MPT_OP_SUB:
    case MPT_OP_MUL: case MPT_OP_DIV: case MPT_OP_MAX: case MPT_OP_MIN: case MPT_OP_POW:
    case MPT_OP_LT: case MPT_OP_GT: case MPT_OP_EQ: case MPT_OP_AND: case MPT_OP_SELECT:
    case MPT_OP_REDUCE_SUM: case MPT_OP_REDUCE_MAX: case MPT_OP_REDUCE_ALL:
    case MPT_OP_ARGMAX: case MPT_OP_GATHER: case MPT_OP_SCATTER_ADD: case MPT_OP_MATMUL:
    case MPT_OP_BATCH_MATMUL: case MPT_OP_CONV2D: case MPT_OP_CONV2D_BWD_DATA: case MPT_OP_CONV2D_BWD_FILTER:
    case MPT_OP_MAX_POOL: case MPT_OP_MAX_POOL_GRAD: case MPT_OP_AVG_POOL:
    case MPT_OP_AVG_POOL_GRAD: case MPT_OP_CONCAT: case MPT_OP_ALLREDUCE: case MPT_OP_REDUCE_SCATTER: case MPT_OP_ALL_GATHER:
    case MPT_OP_RANK_SLICE: case MPT_OP_ATTENTION: case MPT_OP_ATTENTION_LSE: case MPT_OP_ATTENTION_GRAD:
    case MPT_OP_COUNT:
        return WEAK_NONE;
    }
    return WEAK_NONE;
}

/* The dtype a node with a dtype choice runs in (see the top of the file). */
static mpt_dtype choose_dtype(pass *p, int i) {
    const mpt_node *n = &p->src->nodes[i];
    mpt_dtype cd = compute_dtype(p, n->layer);
    switch (mpt_policy_list_of(p->o, n->op)) {
    case MPT_PLIST_COMPUTE: return cd;
    case MPT_PLIST_FLOAT32: return MPT_DT_F32;
    case MPT_PLIST_FOLLOW: break;
    case MPT_PLIST_COUNT: assert(!"not a list"); break;
    }
    int voted = 0, state = 0;
    mpt_dtype d = cd;
    for (int k = 0; k < n->n_in; k++) {
        int u = n->in[k];
        const mpt_node *un = &p->src->nodes[u];
        if (!mpt_dtype_is_float(un->dtype)) continue;
        if (un->op == MPT_OP_VARIABLE || p->weak[u] == WEAK_STATE) {
            state = 1;
            continue;
        }
        if (p->weak[u]) continue;
        int boundary = un->op == MPT_OP_INPUT || !same_layer(un->layer, n->layer);
        mpt_dtype vote = boundary ? cd : p->g->nodes[p->val[u]].dtype;
        d = voted ? widest(d, vote) : vote;
        voted = 1;
    }
    /* an embedding lookup yields the compute dtype, as Keras' Embedding */
    if (!voted && state && n->op != MPT_OP_GATHER) return MPT_DT_F32;
    return d;
}

static int build_node(pass *p, int i) {
    const mpt_node *n = &p->src->nodes[i];
    int in[MPT_MAX_INPUTS];
    if (!has_dtype_choice(n->op)) {
        /* sources, state and the graph's own casts keep their dtype */
        for (int k = 0; k < n->n_in; k++) in[k] = natural(p, n->in[k]);
        if (n->op == MPT_OP_CAST && p->g->nodes[in[0]].dtype == n->dtype) return in[0];
        return emit(p->g, n->op, n->n_in, in, &n->attr, n->shape, n->dtype, n->name, n->layer);
    }
    mpt_dtype d = choose_dtype(p, i);
    int gather_rows = n->op == MPT_OP_GATHER &&
                      p->src->nodes[n->in[0]].op == MPT_OP_VARIABLE &&
                      p->src->nodes[n->in[0]].dtype != d;
    for (int k = 0; k < n->n_in; k++) {
        int u = n->in[k];
        int keep = !mpt_dtype_is_float(p->src->nodes[u].dtype) || (gather_rows && k == 0);
        in[k] = keep ? natural(p, u) : convert(p, u, d, n->layer);
    }
    mpt_attr attr = n->attr;
    /* batch matmuls (attention's Q K^T and P V) write f32 from operands in
     * the compute dtype: the scores and the softmax after them stay f32,
     * so a score past float16's range is not inf (Keras computes the
     * attention softmax in f32 too) */
    if (n->op == MPT_OP_BATCH_MATMUL && d != MPT_DT_F32) attr.i[2] = 1;
    int v = emit(p->g, n->op, n->n_in, in, &attr, n->shape, n->dtype, n->name, n->layer);
    if (gather_rows) v = emit_cast(p, v, d, n->layer);
    return v;
}

static void pass_free(pass *p) {
    free(p->layer_pol);
    free(p->val);
    free(p->weak);
    for (int d = 0; d < MPT_DT_COUNT; d++) free(p->as[d]);
}

static const char *policy_names_hint =
    "expected float32, mixed_float16, mixed_bfloat16, float16 or bfloat16";

/* Checks the options; fills p->layer_pol. NULL when fine. */
static int check_opts(pass *p, char *err, size_t errlen) {
    const mpt_policy_opts *o = p->o;
    if (!mpt_dtype_is_float(o->global.compute)) {
        snprintf(err, errlen, "policy '%s' has a non-float compute dtype",
                 o->global.name ? o->global.name : "?");
        return -1;
    }
    for (int i = 0; i < o->n_layers; i++) {
        if (mpt_policy_lookup(o->layer_policies[i], &p->layer_pol[i]) != 0) {
            snprintf(err, errlen, "layer '%s': unknown dtype policy '%s' (%s)",
                     o->layer_names[i], o->layer_policies[i] ? o->layer_policies[i] : "",
                     policy_names_hint);
            return -1;
        }
    }
    for (int i = 0; i < o->n_moves; i++) {
        const char *m = o->moves[i] ? o->moves[i] : "";
        mpt_op op;
        int known = mpt_op_parse(m, &op) == 0;
        for (int g = 0; g < N_GROUPS && !known; g++) known = strcmp(groups[g].name, m) == 0;
        if (!known) {
            snprintf(err, errlen,
                     "cannot move '%s' between the policy lists: not an op name "
                     "(hint: use op names such as matmul, exp, reduce_sum, or the groups "
                     "dense, conv, softmax, reductions)", m);
            return -1;
        }
        if (known && mpt_op_parse(m, &op) == 0 && !has_dtype_choice(op)) {
            snprintf(err, errlen,
                     "cannot move '%s' between the policy lists: its dtype is fixed by "
                     "its feed, state or target (hint: move the ops that consume it)", m);
            return -1;
        }
        if (o->move_to[i] < 0 || o->move_to[i] >= MPT_PLIST_COUNT) {
            snprintf(err, errlen, "move of '%s' names no list", m);
            return -1;
        }
    }
    return 0;
}

mpt_graph *mpt_policy_apply(const mpt_graph *fwd, const mpt_policy_opts *o, char *err,
                            size_t errlen) {
    pass p = {.src = fwd, .o = o};
    int n = fwd->n_nodes;
    p.layer_pol = calloc((size_t)o->n_layers + 1, sizeof *p.layer_pol);
    p.val = malloc(((size_t)n + 1) * sizeof *p.val);
    p.weak = calloc((size_t)n + 1, 1);
    int ok = p.layer_pol && p.val && p.weak;
    for (int d = 0; d < MPT_DT_COUNT; d++) {
        p.as[d] = malloc(((size_t)n + 1) * sizeof *p.as[d]);
        ok = ok && p.as[d];
    }
    if (!ok) {
        snprintf(err, errlen, "out of memory in the policy pass");
        pass_free(&p);
        return NULL;
    }
    if (check_opts(&p, err, errlen) != 0) {
        pass_free(&p);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        p.val[i] = -1;
        for (int d = 0; d < MPT_DT_COUNT; d++) p.as[d][i] = -1;
    }

    p.g = mpt_graph_new(fwd->name);
    for (int i = 0; i < n; i++) {
        p.weak[i] = (char)weak_kind(&p, i);
        if (!p.weak[i]) p.val[i] = build_node(&p, i);
    }
    for (int k = 0; k < fwd->n_outputs; k++) {
        int u = fwd->outputs[k].node;
        const mpt_node *un = &fwd->nodes[u];
        const mpt_policy *ov = layer_override(&p, un->layer);
        int v = natural(&p, u);
        if (mpt_dtype_is_float(un->dtype) && !(ov && is_low(ov->compute)))
            v = convert(&p, u, MPT_DT_F32, un->layer);
        mpt_graph_add_output(p.g, fwd->outputs[k].name, v);
    }
    for (int k = 0; k < fwd->n_updates; k++) {
        int var = fwd->updates[k].var, u = fwd->updates[k].value;
        mpt_dtype vdt = fwd->nodes[var].dtype;
        int v = mpt_dtype_is_float(vdt) ? convert(&p, u, vdt, fwd->nodes[var].layer)
                                        : natural(&p, u);
        mpt_graph_add_update(p.g, p.val[var], v);
    }
    pass_free(&p);
    return p.g;
}
