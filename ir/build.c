/* ir/build.c — the graph builder: one call per op, shapes and dtypes
 * inferred. Misuse is a bug in the caller (lowering, autodiff, a pass), not a
 * user error, so it stops with the inference message. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

static int add(mpt_graph *g, mpt_op op, int n_in, const int *in, const mpt_attr *attr,
               mpt_shape shape, mpt_dtype dt, const char *name) {
    mpt_attr a0 = {0};
    if (!attr) attr = &a0;
    const char *e = mpt_infer(g, op, n_in, in, attr, &shape, &dt);
    if (e) {
        fprintf(stderr, "mptc: internal error building %s (layer %s): %s\n", mpt_op_name(op),
                g->build_layer ? g->build_layer : "-", e);
        assert(!"graph builder misuse (see the message above)");
        abort();
    }
    mpt_attr stored = *attr;
    if (op == MPT_OP_CAST) stored.dt = dt;
    return mpt_graph_add_raw(g, op, dt, shape, n_in, in, &stored, name, g->build_layer);
}

int mpt_b_input(mpt_graph *g, const char *name, mpt_dtype dt, mpt_shape s) {
    assert(mpt_graph_find_input(g, name) < 0 && "duplicate input name");
    return add(g, MPT_OP_INPUT, 0, NULL, NULL, s, dt, name);
}

int mpt_b_variable(mpt_graph *g, const char *name, mpt_shape s, int init, int64_t fan_in,
                   int64_t fan_out, double f, int trainable) {
    assert(mpt_graph_find_variable(g, name) < 0 && "duplicate variable name");
    mpt_attr a = {.i = {init, fan_in, fan_out, trainable}, .f = f};
    return add(g, MPT_OP_VARIABLE, 0, NULL, &a, s, MPT_DT_F32, name);
}

int mpt_b_variable_dt(mpt_graph *g, const char *name, mpt_dtype dt, mpt_shape s, int init,
                      double f) {
    assert(mpt_graph_find_variable(g, name) < 0 && "duplicate variable name");
    mpt_attr a = {.i = {init, 0, 0, 0}, .f = f};
    return add(g, MPT_OP_VARIABLE, 0, NULL, &a, s, dt, name);
}

int mpt_b_const(mpt_graph *g, mpt_dtype dt, mpt_shape s, double v) {
    mpt_attr a = {.f = mpt_round_to(dt, v)};
    return add(g, MPT_OP_CONST, 0, NULL, &a, s, dt, NULL);
}

int mpt_b_scalar(mpt_graph *g, mpt_dtype dt, double v) {
    return mpt_b_const(g, dt, mpt_shape_scalar(), v);
}

int mpt_b_iota(mpt_graph *g, mpt_dtype dt, mpt_shape s, int axis) {
    mpt_attr a = {.i = {axis}};
    return add(g, MPT_OP_IOTA, 0, NULL, &a, s, dt, NULL);
}

int mpt_b_unary(mpt_graph *g, mpt_op op, int x) {
    assert(mpt_op_table[op].arity == 1 && mpt_op_table[op].kind == MPT_KIND_ELEMENTWISE &&
           op != MPT_OP_CAST);
    return add(g, op, 1, &x, NULL, mpt_shape_scalar(), MPT_DT_F32, NULL);
}

int mpt_b_allreduce(mpt_graph *g, int x) {
    return add(g, MPT_OP_ALLREDUCE, 1, &x, NULL, mpt_shape_scalar(), MPT_DT_F32, NULL);
}

int mpt_b_shard_op(mpt_graph *g, mpt_op op, int x, int64_t len) {
    return add(g, op, 1, &x, NULL, mpt_shape_1(len), MPT_DT_F32, NULL);
}

int mpt_b_binary(mpt_graph *g, mpt_op op, int x, int y) {
    assert(mpt_op_table[op].arity == 2 && mpt_op_table[op].kind == MPT_KIND_ELEMENTWISE);
    int in[2] = {x, y};
    return add(g, op, 2, in, NULL, mpt_shape_scalar(), MPT_DT_F32, NULL);
}

int mpt_b_select(mpt_graph *g, int cond, int x, int y) {
    int in[3] = {cond, x, y};
    return add(g, MPT_OP_SELECT, 3, in, NULL, mpt_shape_scalar(), MPT_DT_F32, NULL);
}

int mpt_b_cast(mpt_graph *g, int x, mpt_dtype dt) {
    if (g->nodes[x].dtype == dt) return x;
    mpt_attr a = {.dt = dt};
    return add(g, MPT_OP_CAST, 1, &x, &a, mpt_shape_scalar(), dt, NULL);
}

int mpt_b_reduce(mpt_graph *g, mpt_op op, int x, int64_t axes_mask) {
    assert(mpt_op_table[op].kind == MPT_KIND_REDUCTION && op != MPT_OP_ARGMAX);
    mpt_attr a = {.i = {axes_mask}};
    return add(g, op, 1, &x, &a, mpt_shape_scalar(), MPT_DT_F32, NULL);
}

int mpt_b_argmax(mpt_graph *g, int x, int axis) {
    mpt_attr a = {.i = {axis}};
    return add(g, MPT_OP_ARGMAX, 1, &x, &a, mpt_shape_scalar(), MPT_DT_I32, NULL);
}

int mpt_b_broadcast(mpt_graph *g, int x, mpt_shape s, int64_t dims_mask) {
    if (mpt_shape_eq(g->nodes[x].shape, s)) return x;
    mpt_attr a = {.i = {dims_mask}};
    return add(g, MPT_OP_BROADCAST, 1, &x, &a, s, MPT_DT_F32, NULL);
}

int mpt_b_broadcast_to(mpt_graph *g, int x, mpt_shape s) {
    int r = g->nodes[x].shape.rank;
    assert(r <= s.rank && "broadcast_to a smaller rank");
    int64_t mask = 0;
    for (int d = s.rank - r; d < s.rank; d++) mask |= 1LL << d;
    return mpt_b_broadcast(g, x, s, mask);
}

int mpt_b_reshape(mpt_graph *g, int x, mpt_shape s) {
    if (mpt_shape_eq(g->nodes[x].shape, s)) return x;
    return add(g, MPT_OP_RESHAPE, 1, &x, NULL, s, MPT_DT_F32, NULL);
}

int mpt_b_transpose(mpt_graph *g, int x, const int *perm) {
    int64_t packed = 0;
    for (int d = 0; d < g->nodes[x].shape.rank; d++) packed |= (int64_t)perm[d] << (4 * d);
    mpt_attr a = {.i = {packed}};
    return add(g, MPT_OP_TRANSPOSE, 1, &x, &a, mpt_shape_scalar(), MPT_DT_F32, NULL);
}

int mpt_b_one_hot(mpt_graph *g, int ids, int depth, mpt_dtype dt) {
    mpt_attr a = {.i = {depth}};
    return add(g, MPT_OP_ONE_HOT, 1, &ids, &a, mpt_shape_scalar(), dt, NULL);
}

int mpt_b_gather(mpt_graph *g, int table, int ids) {
    int in[2] = {table, ids};
    return add(g, MPT_OP_GATHER, 2, in, NULL, mpt_shape_scalar(), MPT_DT_F32, NULL);
}

int mpt_b_scatter_add(mpt_graph *g, int ids, int upd, int64_t rows) {
    int in[2] = {ids, upd};
    mpt_attr a = {.i = {rows}};
    return add(g, MPT_OP_SCATTER_ADD, 2, in, &a, mpt_shape_scalar(), MPT_DT_F32, NULL);
}

int mpt_b_slice(mpt_graph *g, int x, int axis, int64_t start, int64_t len) {
    mpt_shape s = g->nodes[x].shape;
    if (axis >= 0 && axis < s.rank) s.dim[axis] = len; /* else mpt_infer says why */
    mpt_attr a = {.i = {axis, start}};
    return add(g, MPT_OP_SLICE, 1, &x, &a, s, MPT_DT_F32, NULL);
}

int mpt_b_concat(mpt_graph *g, int x, int y, int axis) {
    int in[2] = {x, y};
    mpt_attr a = {.i = {axis}};
    return add(g, MPT_OP_CONCAT, 2, in, &a, mpt_shape_scalar(), MPT_DT_F32, NULL);
}

int mpt_b_matmul(mpt_graph *g, int x, int y, int trans_a, int trans_b) {
    int in[2] = {x, y};
    mpt_attr a = {.i = {trans_a, trans_b}};
    return add(g, MPT_OP_MATMUL, 2, in, &a, mpt_shape_scalar(), MPT_DT_F32, NULL);
}

int mpt_b_batch_matmul(mpt_graph *g, int x, int y, int trans_a, int trans_b) {
    int in[2] = {x, y};
    mpt_attr a = {.i = {trans_a, trans_b}};
    return add(g, MPT_OP_BATCH_MATMUL, 2, in, &a, mpt_shape_scalar(), MPT_DT_F32, NULL);
}

int mpt_b_attention(mpt_graph *g, const int *in, const mpt_attr *a) {
    return add(g, MPT_OP_ATTENTION, 5, in, a, mpt_shape_scalar(), MPT_DT_F32, NULL);
}

int mpt_b_attention_lse(mpt_graph *g, int q, int k, int mask, int causal, int bthd, double scale) {
    int in[3] = {q, k, mask};
    mpt_attr a = {.i = {causal, bthd}, .f = scale};
    return add(g, MPT_OP_ATTENTION_LSE, 3, in, &a, mpt_shape_scalar(), MPT_DT_F32, NULL);
}

int mpt_b_attention_grad(mpt_graph *g, const int *in, const mpt_attr *a) {
    return add(g, MPT_OP_ATTENTION_GRAD, 8, in, a, mpt_shape_scalar(), MPT_DT_F32, NULL);
}

static mpt_attr conv_attr(int sh, int sw, int ph, int pw) {
    return (mpt_attr){.i = {sh, sw, ph, pw}};
}

int mpt_b_conv2d(mpt_graph *g, int x, int w, int sh, int sw, int ph, int pw, mpt_shape out) {
    int in[2] = {x, w};
    mpt_attr a = conv_attr(sh, sw, ph, pw);
    return add(g, MPT_OP_CONV2D, 2, in, &a, out, MPT_DT_F32, NULL);
}

int mpt_b_conv2d_bwd_data(mpt_graph *g, int dy, int w, int sh, int sw, int ph, int pw,
                          mpt_shape x_shape) {
    int in[2] = {dy, w};
    mpt_attr a = conv_attr(sh, sw, ph, pw);
    return add(g, MPT_OP_CONV2D_BWD_DATA, 2, in, &a, x_shape, MPT_DT_F32, NULL);
}

int mpt_b_conv2d_bwd_filter(mpt_graph *g, int x, int dy, int sh, int sw, int ph, int pw,
                            mpt_shape w_shape) {
    int in[2] = {x, dy};
    mpt_attr a = conv_attr(sh, sw, ph, pw);
    return add(g, MPT_OP_CONV2D_BWD_FILTER, 2, in, &a, w_shape, MPT_DT_F32, NULL);
}

int mpt_b_pool(mpt_graph *g, mpt_op op, int x, int wh, int ww, int sh, int sw, int ph, int pw,
               mpt_shape out) {
    assert(op == MPT_OP_MAX_POOL || op == MPT_OP_AVG_POOL);
    mpt_attr a = {.i = {wh, ww, sh, sw, ph, pw}};
    return add(g, op, 1, &x, &a, out, MPT_DT_F32, NULL);
}

int mpt_b_max_pool_grad(mpt_graph *g, int x, int dy, const mpt_attr *pool_attr) {
    int in[2] = {x, dy};
    return add(g, MPT_OP_MAX_POOL_GRAD, 2, in, pool_attr, mpt_shape_scalar(), MPT_DT_F32, NULL);
}

int mpt_b_avg_pool_grad(mpt_graph *g, int dy, const mpt_attr *pool_attr, mpt_shape x_shape) {
    return add(g, MPT_OP_AVG_POOL_GRAD, 1, &dy, pool_attr, x_shape, MPT_DT_F32, NULL);
}

int mpt_b_random_uniform(mpt_graph *g, int counter, mpt_shape s, int64_t seed) {
    mpt_attr a = {.i = {seed}};
    return add(g, MPT_OP_RANDOM_UNIFORM, 1, &counter, &a, s, MPT_DT_F32, NULL);
}
