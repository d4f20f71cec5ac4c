/* runtime/train/nonfinite.c — finding the first op that produced a non-finite
 * value, by re-running the step op by op on the reference interpreter. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/train/train.h"

typedef struct {
    int found;
    int node;
} hunt;

static int on_node(void *ctx, const mpt_graph *g, int id, const mpt_tensor *v) {
    hunt *h = ctx;
    if (!mpt_dtype_is_float(v->dtype)) return 0;
    int64_t n = mpt_shape_numel(v->shape);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(mpt_tensor_get(v, i))) {
            h->found = 1;
            h->node = id;
            return 1;
        }
    return 0;
}

void mpt_report_nonfinite(mpt_session *s, const mpt_tensor *inputs, FILE *f) {
    const mpt_graph *g = s->train;
    char err[256];
    if (mpt_session_pull_vars(s, err, sizeof err))
        fprintf(f, "note: the variables on the device could not be read back: %s\n", err);
    /* run on copies: the report must not change the state */
    mpt_tensor *vars = calloc((size_t)s->n_vars + 1, sizeof *vars);
    mpt_tensor *outs = calloc((size_t)g->n_outputs + 1, sizeof *outs);
    for (int k = 0; k < s->n_vars; k++) {
        mpt_tensor_alloc(&vars[k], s->vars[k].dtype, s->vars[k].shape);
        memcpy(vars[k].data, s->vars[k].data, mpt_tensor_bytes(&s->vars[k]));
    }
    hunt h = {0};
    mpt_interp_opts o = {.on_node = on_node, .ctx = &h};
    /* a data-parallel run's ranks each hunt in their own shard: the hunt
     * stops at a rank's first non-finite value, wherever that is, so the
     * ALLREDUCEs on its way are this rank's values alone (no rank waits
     * for a peer that stopped earlier) */
    mpt_collective ranks = *mpt_collective_get();
    mpt_collective_set(NULL);
    mpt_interp_run(g, inputs, vars, outs, &o, err, sizeof err);
    mpt_collective_set(&ranks);
    int loss_out = mpt_graph_find_output(g, "loss");
    int loss_node = loss_out >= 0 ? g->outputs[loss_out].node : g->n_nodes;
    if (h.found) {
        const mpt_node *n = &g->nodes[h.node];
        const char *pass = h.node <= loss_node ? "forward" : "backward";
        char shape[64];
        fprintf(f, "  first non-finite value: %%%d = %s (%s%s) in layer '%s', %s pass\n", h.node,
                mpt_op_name(n->op), mpt_dtype_name(n->dtype), mpt_shape_str(n->shape, shape, sizeof shape),
                n->layer ? n->layer : "-", pass);
        if (n->dtype == MPT_DT_F16)
            fprintf(f, "  hint: float16 overflows above 65504; give layer '%s' dtype=float32, "
                       "or train with --policy mixed_bfloat16\n", n->layer ? n->layer : "?");
        else if (n->dtype == MPT_DT_BF16)
            fprintf(f, "  hint: bfloat16 has float32's range, so the value overflowed in float32 "
                       "too: lower the learning rate, or check the input data for NaN or huge "
                       "values\n");
        else
            fprintf(f, "  hint: the value overflowed in float32 too: lower the learning rate, "
                       "or check the input data for NaN or huge values\n");
    } else if (s->topts.loss_scale.mode != MPT_LS_NONE) {
        fprintf(f, "  re-running the step op by op found no non-finite value (the skipped steps came from\n"
                   "  the scaled loss itself)\n  hint: lower the initial loss scale with --loss-scale N\n");
    } else {
        fprintf(f, "  re-running the step op by op on the reference interpreter (each op in double, "
                   "rounded to its dtype)\n  found no non-finite value: this backend's float32 "
                   "arithmetic overflowed inside a kernel,\n  with values near float32's largest "
                   "(3.4e38)\n  hint: lower the learning rate\n");
    }
    for (int k = 0; k < g->n_outputs; k++) mpt_tensor_free(&outs[k]);
    for (int k = 0; k < s->n_vars; k++) mpt_tensor_free(&vars[k]);
    free(outs);
    free(vars);
}
