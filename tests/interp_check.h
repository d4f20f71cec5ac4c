/* tests/interp_check.h — running a small graph on the reference
 * interpreter from doubles: shared by test_interp and test_interp_compute. */
#ifndef MPTC_TESTS_INTERP_CHECK_H
#define MPTC_TESTS_INTERP_CHECK_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "tests/check.h"

#define MAX_IO 8

/* Runs g: the k-th INPUT gets feed[k] (doubles rounded into its dtype),
 * variables start from seed 1 (or take *vars when given, which are then
 * updated in place); outs receive the outputs. Returns mpt_interp_run's
 * result and leaves its message in err. */
static inline int run(const mpt_graph *g, const double *const *feed, mpt_tensor *vars,
                      mpt_tensor *outs, char *err, size_t errlen) {
    mpt_tensor in[MAX_IO], own_vars[MAX_IO];
    int n_in = mpt_graph_n_inputs(g), n_var = mpt_graph_n_variables(g);
    if (n_in > MAX_IO || n_var > MAX_IO) return -2;
    for (int k = 0; k < n_in; k++) {
        const mpt_node *n = &g->nodes[mpt_graph_input_node(g, k)];
        if (mpt_tensor_alloc(&in[k], n->dtype, n->shape) != 0) return -2;
        for (int64_t i = 0; i < mpt_shape_numel(n->shape); i++) mpt_tensor_set(&in[k], i, feed[k][i]);
    }
    if (!vars && mpt_init_variables(g, own_vars, 1) != 0) return -2;
    int rc = mpt_interp_run(g, in, vars ? vars : own_vars, outs, NULL, err, errlen);
    for (int k = 0; k < n_in; k++) mpt_tensor_free(&in[k]);
    if (!vars)
        for (int k = 0; k < n_var; k++) mpt_tensor_free(&own_vars[k]);
    return rc;
}

/* runs g expecting success; outs as run() */
static inline void run_ok(const mpt_graph *g, const double *const *feed, mpt_tensor *vars,
                          mpt_tensor *outs) {
    char err[256] = "";
    int rc = run(g, feed, vars, outs, err, sizeof err);
    CHECK_MSG(rc == 0, "run failed: %s", err);
    if (rc != 0)
        for (int k = 0; k < g->n_outputs; k++) mpt_tensor_alloc(&outs[k], MPT_DT_F64, g->nodes[g->outputs[k].node].shape);
}

/* frees the n_outputs tensors run() or run_ok() gave */
static inline void free_outs(const mpt_graph *g, mpt_tensor *outs) {
    for (int k = 0; k < g->n_outputs; k++) mpt_tensor_free(&outs[k]);
}

#endif
