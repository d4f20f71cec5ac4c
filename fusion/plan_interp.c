/* fusion/plan_interp.c — runs a kernel plan on the reference interpreter,
 * one kernel at a time.
 *
 * Each kernel becomes a small graph: an INPUT standing in for every value it
 * reads from memory (constants are copied in, as backends inline them), its
 * own nodes, and an output per value it writes. Values crossing kernels are
 * held as tensors in their node's dtype, exactly what a backend's buffers
 * hold. Since the interpreter rounds every node to its dtype whether or not
 * the node is fused, a fused and an unfused plan give bit-identical results:
 * fusion never changes the rounding the policy asked for. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "fusion/fusion_impl.h"

static int fail(char *err, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

/* The kernel as a graph of its own; in_map[i] is the graph node the i-th
 * INPUT of the subgraph stands for. */
static mpt_graph *kernel_graph(const mpt_graph *g, const mpt_kernel *K, int *map, int *in_map,
                               int *n_feeds) {
    char name[64];
    mpt_graph *s = mpt_graph_new(K->name);
    *n_feeds = 0;
    for (int i = 0; i < K->n_inputs; i++) {
        int q = K->inputs[i];
        const mpt_node *nd = &g->nodes[q];
        if (nd->op == MPT_OP_CONST) {
            map[q] = mpt_graph_copy_node(s, g, q, map);
            continue;
        }
        snprintf(name, sizeof name, "in%d", q);
        map[q] = mpt_graph_add_raw(s, MPT_OP_INPUT, nd->dtype, nd->shape, 0, NULL, NULL, name,
                                   nd->layer);
        in_map[(*n_feeds)++] = q;
    }
    for (int i = 0; i < K->n_nodes; i++) map[K->nodes[i]] = mpt_graph_copy_node(s, g, K->nodes[i], map);
    for (int i = 0; i < K->n_outputs; i++) {
        snprintf(name, sizeof name, "out%d", K->outputs[i]);
        mpt_graph_add_output(s, name, map[K->outputs[i]]);
    }
    return s;
}

/* The value of a source node the kernels never computed. */
static int source_value(const mpt_graph *g, int id, mpt_tensor *const *val, mpt_tensor *out) {
    const mpt_node *nd = &g->nodes[id];
    if (mpt_tensor_alloc(out, nd->dtype, nd->shape)) return -1;
    if (val[id]) {
        memcpy(out->data, val[id]->data, mpt_tensor_bytes(out));
        return 0;
    }
    for (int64_t i = 0; i < mpt_shape_numel(nd->shape); i++) mpt_tensor_set(out, i, nd->attr.f);
    return 0;
}

int mpt_plan_interp_run(const mpt_plan *p, const mpt_tensor *inputs, mpt_tensor *vars,
                        mpt_tensor *outputs, char *err, size_t errlen) {
    const mpt_graph *g = p->g;
    int n = g->n_nodes, rc = -1;
    /* val[id]: the tensor holding node id; owned[id] when this run made it */
    mpt_tensor **val = calloc((size_t)n + 1, sizeof *val);
    mpt_tensor *owned = calloc((size_t)n + 1, sizeof *owned);
    int *map = malloc(((size_t)n + 1) * sizeof *map);
    int *in_map = malloc(((size_t)n + 1) * sizeof *in_map);
    mpt_tensor *feeds = calloc((size_t)n + 1, sizeof *feeds);
    mpt_tensor *outs = calloc((size_t)n + 1, sizeof *outs);
    mpt_tensor *next = calloc((size_t)g->n_updates + 1, sizeof *next);
    if (!val || !owned || !map || !in_map || !feeds || !outs || !next) {
        fail(err, errlen, "out of memory running plan %s", g->name);
        goto done;
    }
    for (int k = 0, ni = 0, nv = 0; k < n; k++) {
        if (g->nodes[k].op == MPT_OP_INPUT) val[k] = (mpt_tensor *)&inputs[ni++];
        if (g->nodes[k].op == MPT_OP_VARIABLE) val[k] = &vars[nv++];
    }
    for (int k = 0; k < p->n_kernels; k++) {
        const mpt_kernel *K = &p->kernels[k];
        int n_feeds;
        for (int i = 0; i < n; i++) map[i] = -1;
        mpt_graph *s = kernel_graph(g, K, map, in_map, &n_feeds);
        for (int i = 0; i < n_feeds; i++) {
            int q = mpt_plan_storage(p, in_map[i]);
            if (!val[q]) {
                mpt_graph_free(s);
                fail(err, errlen, "kernel %s reads %%%d before any kernel wrote it", K->name, q);
                goto done;
            }
            /* a view is its root's bytes under its own shape */
            feeds[i] = *val[q];
            feeds[i].shape = g->nodes[in_map[i]].shape;
        }
        char msg[512];
        int r = mpt_interp_run(s, feeds, NULL, outs, NULL, msg, sizeof msg);
        mpt_graph_free(s);
        if (r) {
            fail(err, errlen, "kernel %s: %s", K->name, msg);
            goto done;
        }
        for (int i = 0; i < K->n_outputs; i++) {
            int o = K->outputs[i];
            owned[o] = outs[i];
            val[o] = &owned[o];
        }
    }
    for (int i = 0; i < g->n_outputs; i++) {
        outputs[i] = (mpt_tensor){0};
        if (source_value(g, g->outputs[i].node, val, &outputs[i])) {
            for (int j = 0; j < i; j++) mpt_tensor_free(&outputs[j]);
            fail(err, errlen, "out of memory for output %s", g->outputs[i].name);
            goto done;
        }
    }
    /* all updates read the old values first, then land together */
    for (int i = 0; i < g->n_updates; i++)
        if (source_value(g, g->updates[i].value, val, &next[i])) {
            for (int j = 0; j < g->n_outputs; j++) mpt_tensor_free(&outputs[j]);
            fail(err, errlen, "out of memory for the update of %s", g->nodes[g->updates[i].var].name);
            goto done;
        }
    for (int i = 0; i < g->n_updates; i++) {
        mpt_tensor *v = val[g->updates[i].var];
        memcpy(v->data, next[i].data, mpt_tensor_bytes(v));
    }
    rc = 0;
done:
    if (owned)
        for (int i = 0; i < n; i++) mpt_tensor_free(&owned[i]);
    if (next)
        for (int i = 0; i < g->n_updates; i++) mpt_tensor_free(&next[i]);
    free(next);
    free(outs);
    free(feeds);
    free(in_map);
    free(map);
    free(owned);
    free(val);
    return rc;
}
