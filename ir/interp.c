/* ir/interp.c — the reference interpreter: runs a graph op by op on the host.
 *
 * It is the oracle every backend is tested against, so it favours being
 * exactly right over being fast:
 *   - every value is held as doubles and, once computed, rounded to its
 *     node's dtype (f32 to float, f16/bf16 to nearest even, i32 truncated
 *     and saturated, bool to 0/1, f64 kept). An f16 graph therefore
 *     overflows, underflows and loses bits exactly where real f16 would;
 *   - matmul, conv and reductions accumulate in double and round once;
 *   - the semantics of each op live in ir/interp_ops.c.
 * Only the nodes that outputs and updates depend on are computed, and each
 * value is freed after its last use, so memory stays bounded by the live set.
 *
 * random_uniform: element i of a node with seed s fed counter c is
 *     h = mix(mix(mix(s) ^ (uint32)c) ^ i)     mix = splitmix64's step
 *     u = (h >> 40) * 2^-24                     for f32 and f64
 *     u = (h >> 53) * 2^-11 for f16, (h >> 56) * 2^-8 for bf16
 * i.e. the top bits that the dtype can hold exactly, so u is in [0, 1) after
 * rounding, and the same (s, c, i) gives the same u on every backend.
 *
 * The on_node callback sees each value in its node dtype's own storage
 * (float, uint16_t f16/bf16 bits, int32_t, uint8_t, double), as a backend
 * would hold it. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ir/interp_impl.h"

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* A fed tensor must match its node exactly: the interpreter never guesses a
 * conversion the user did not ask for. */
static int check_feed(const mpt_graph *g, int id, const mpt_tensor *t, char *err, size_t errlen) {
    const mpt_node *n = &g->nodes[id];
    const char *what = n->op == MPT_OP_INPUT ? "input" : "variable";
    char want[96], got[96];
    mpt_shape_str(n->shape, want, sizeof want);
    if (!t || !t->data)
        return fail(err, errlen, "%s \"%s\" was not given a tensor (hint: pass one %s[%s] per %s)",
                    what, n->name, mpt_dtype_name(n->dtype), want, what);
    if (t->dtype < 0 || t->dtype >= MPT_DT_COUNT || t->shape.rank < 0 ||
        t->shape.rank > MPT_MAX_DIMS)
        return fail(err, errlen, "%s \"%s\": the tensor fed is not initialised", what, n->name);
    if (t->dtype != n->dtype || !mpt_shape_eq(t->shape, n->shape)) {
        mpt_shape_str(t->shape, got, sizeof got);
        return fail(err, errlen, "%s \"%s\": fed %s%s but the graph expects %s%s (hint: %s)",
                    what, n->name, mpt_dtype_name(t->dtype), got, mpt_dtype_name(n->dtype), want,
                    t->dtype != n->dtype ? "convert the data to the graph's dtype"
                                         : "feed the shape the graph was built for");
    }
    return 0;
}

/* rounds every element of v (a value of node n) to the node's dtype */
static void round_value(const mpt_node *n, double *v) {
    int64_t numel = mpt_shape_numel(n->shape);
    switch (n->dtype) {
    case MPT_DT_F64: return;
    case MPT_DT_F32:
        for (int64_t i = 0; i < numel; i++) v[i] = (double)(float)v[i];
        return;
    case MPT_DT_F16: case MPT_DT_BF16: case MPT_DT_I32: case MPT_DT_BOOL:
        for (int64_t i = 0; i < numel; i++) v[i] = mpt_round_to(n->dtype, v[i]);
        return;
    case MPT_DT_COUNT: break;
    }
}

/* v as a tensor of n's dtype, for the callback and for outputs */
static int materialise(const mpt_node *n, const double *v, mpt_tensor *t) {
    if (mpt_tensor_alloc(t, n->dtype, n->shape) != 0) return -1;
    mpt_tensor_store(t, v);
    return 0;
}

static double *alloc_value(const mpt_node *n) {
    int64_t numel = mpt_shape_numel(n->shape);
    return malloc((numel > 0 ? (size_t)numel : 1) * sizeof(double));
}

static int is_shard_op(mpt_op op) {
    return op == MPT_OP_REDUCE_SCATTER || op == MPT_OP_ALL_GATHER || op == MPT_OP_RANK_SLICE;
}

/* The sharded optimizer's ops, on the ranks of mpt_collective (f64 values) */
static int shard_op(const mpt_graph *g, int id, double **val, char *err, size_t errlen) {
    const mpt_node *nd = &g->nodes[id];
    int64_t in_n = mpt_shape_numel(g->nodes[nd->in[0]].shape), out_n = mpt_shape_numel(nd->shape);
    const double *in = val[nd->in[0]];
    if (nd->op == MPT_OP_RANK_SLICE) {
        mpt_collective_rank_slice(in, in_n, val[id], out_n, MPT_DT_F64);
        return 0;
    }
    if (nd->op == MPT_OP_REDUCE_SCATTER)
        return mpt_collective_reduce_scatter(in, in_n, val[id], out_n, MPT_DT_F64, err, errlen);
    return mpt_collective_all_gather(in, in_n, val[id], out_n, MPT_DT_F64, err, errlen);
}

int mpt_interp_run(const mpt_graph *g, const mpt_tensor *inputs, mpt_tensor *vars,
                   mpt_tensor *outputs, const mpt_interp_opts *opts, char *err,
                   size_t errlen) {
    char vmsg[512];
    if (mpt_graph_verify(g, vmsg, sizeof vmsg))
        return fail(err, errlen, "graph %s is not sound: %s (hint: run mpt_graph_verify after the "
                    "pass that built it)", g->name, vmsg);
    int n = g->n_nodes, rc = -1;
    double **val = calloc((size_t)n + 1, sizeof *val);
    int *uses = calloc((size_t)n + 1, sizeof *uses);
    int *feed = calloc((size_t)n + 1, sizeof *feed); /* k of the k-th INPUT/VARIABLE */
    char *needed = calloc((size_t)n + 1, 1);
    if (!val || !uses || !feed || !needed) {
        fail(err, errlen, "out of memory preparing graph %s", g->name);
        goto done;
    }

    int n_in = 0, n_var = 0;
    for (int id = 0; id < n; id++) {
        const mpt_node *nd = &g->nodes[id];
        if (nd->op == MPT_OP_INPUT) {
            feed[id] = n_in;
            if (check_feed(g, id, inputs ? &inputs[n_in] : NULL, err, errlen)) goto done;
            n_in++;
        } else if (nd->op == MPT_OP_VARIABLE) {
            feed[id] = n_var;
            if (check_feed(g, id, vars ? &vars[n_var] : NULL, err, errlen)) goto done;
            n_var++;
        }
    }

    /* outputs and updates pin their values (one use never released) */
    for (int k = 0; k < g->n_outputs; k++) {
        needed[g->outputs[k].node] = 1;
        uses[g->outputs[k].node]++;
    }
    for (int k = 0; k < g->n_updates; k++) {
        needed[g->updates[k].value] = 1;
        uses[g->updates[k].value]++;
    }
    for (int id = n - 1; id >= 0; id--)
        if (needed[id])
            for (int k = 0; k < g->nodes[id].n_in; k++) {
                needed[g->nodes[id].in[k]] = 1;
                uses[g->nodes[id].in[k]]++;
            }

    for (int id = 0; id < n; id++) {
        if (!needed[id]) continue;
        const mpt_node *nd = &g->nodes[id];
        char sh[96];
        if (!(val[id] = alloc_value(nd))) {
            fail(err, errlen, "out of memory for %%%d (%s %s%s)", id, mpt_op_name(nd->op),
                 mpt_dtype_name(nd->dtype), mpt_shape_str(nd->shape, sh, sizeof sh));
            goto done;
        }
        if (nd->op == MPT_OP_INPUT) {
            mpt_tensor_load(&inputs[feed[id]], val[id]);
        } else if (nd->op == MPT_OP_VARIABLE) {
            mpt_tensor_load(&vars[feed[id]], val[id]);
        } else {
            if (is_shard_op(nd->op)) {
                if (shard_op(g, id, val, err, errlen)) goto done;
            } else if (mpt_interp_eval(g, id, val, val[id]) != 0) {
                fail(err, errlen, "out of memory computing %%%d (%s %s%s)", id,
                     mpt_op_name(nd->op), mpt_dtype_name(nd->dtype),
                     mpt_shape_str(nd->shape, sh, sizeof sh));
                goto done;
            }
            /* ALLREDUCE evaluates to its input above; the ranks' sum here,
             * in f64 as every value of the interpreter, rounded once */
            if (nd->op == MPT_OP_ALLREDUCE &&
                mpt_collective_allreduce(val[id], mpt_shape_numel(nd->shape), MPT_DT_F64, err,
                                         errlen) != 0)
                goto done;
            round_value(nd, val[id]);
        }
        for (int k = 0; k < nd->n_in; k++) {
            int src = nd->in[k];
            if (--uses[src] == 0) {
                free(val[src]);
                val[src] = NULL;
            }
        }
        if (opts && opts->on_node) {
            mpt_tensor t;
            if (materialise(nd, val[id], &t) != 0) {
                fail(err, errlen, "out of memory showing %%%d to on_node", id);
                goto done;
            }
            int stop = opts->on_node(opts->ctx, g, id, &t);
            mpt_tensor_free(&t);
            if (stop) {
                fail(err, errlen, "stopped by on_node after %%%d (%s)", id, mpt_op_name(nd->op));
                goto done;
            }
        }
    }

    for (int k = 0; k < g->n_outputs; k++) {
        int id = g->outputs[k].node;
        if (materialise(&g->nodes[id], val[id], &outputs[k]) != 0) {
            for (int j = 0; j < k; j++) mpt_tensor_free(&outputs[j]);
            fail(err, errlen, "out of memory for output \"%s\"", g->outputs[k].name);
            goto done;
        }
    }
    /* every update reads values computed before any variable changes */
    for (int k = 0; k < g->n_updates; k++)
        mpt_tensor_store(&vars[feed[g->updates[k].var]], val[g->updates[k].value]);
    rc = 0;

done:
    if (val)
        for (int id = 0; id < n; id++) free(val[id]);
    free(val);
    free(uses);
    free(feed);
    free(needed);
    return rc;
}
