/* tests/plan_check.h — a fusion plan run kernel by kernel on the
 * interpreter (mpt_plan_interp_run) against the graph run whole: shared by
 * the tests of the fusion pass and its views. */
#ifndef MPTC_TESTS_PLAN_CHECK_H
#define MPTC_TESTS_PLAN_CHECK_H

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fusion/fusion.h"
#include "ir/ir.h"

static inline int plan_same_tensor(const mpt_tensor *a, const mpt_tensor *b) {
    return a->dtype == b->dtype && mpt_shape_eq(a->shape, b->shape) &&
           memcmp(a->data, b->data, mpt_tensor_bytes(a)) == 0;
}

/* Runs g by the interpreter and each of the n plans (named for the
 * messages) for `steps` steps from the same variables, the inputs of step s
 * from fill(g, in, s); every output and every variable must agree bit for
 * bit. */
static inline void plans_bit_identical(const mpt_graph *g, const mpt_plan *const *plans,
                                       const char *const *names, int n, int steps,
                                       void (*fill)(const mpt_graph *, mpt_tensor *, int)) {
    int ni = mpt_graph_n_inputs(g), nv = mpt_graph_n_variables(g), no = g->n_outputs;
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in);
    mpt_tensor **vars = calloc((size_t)n + 1, sizeof *vars), **outs = calloc((size_t)n + 1, sizeof *outs);
    char err[512];
    for (int r = 0; r <= n; r++) {
        vars[r] = calloc((size_t)nv + 1, sizeof **vars);
        outs[r] = calloc((size_t)no + 1, sizeof **outs);
        CHECK(mpt_init_variables(g, vars[r], 42) == 0);
    }
    for (int s = 0; s < steps; s++) {
        fill(g, in, s);
        CHECK_MSG(mpt_interp_run(g, in, vars[0], outs[0], NULL, err, sizeof err) == 0, "interp: %s", err);
        for (int r = 1; r <= n; r++)
            CHECK_MSG(mpt_plan_interp_run(plans[r - 1], in, vars[r], outs[r], err, sizeof err) == 0,
                      "%s plan: %s", names[r - 1], err);
        for (int r = 1; r <= n; r++) {
            for (int k = 0; k < no; k++)
                CHECK_MSG(plan_same_tensor(&outs[0][k], &outs[r][k]), "output %s %s step %d",
                          g->outputs[k].name, names[r - 1], s);
            for (int k = 0; k < nv; k++)
                CHECK_MSG(plan_same_tensor(&vars[0][k], &vars[r][k]), "variable %s %s step %d",
                          g->nodes[mpt_graph_variable_node(g, k)].name, names[r - 1], s);
        }
        for (int r = 0; r <= n; r++)
            for (int k = 0; k < no; k++) mpt_tensor_free(&outs[r][k]);
        for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    }
    for (int r = 0; r <= n; r++) {
        for (int k = 0; k < nv; k++) mpt_tensor_free(&vars[r][k]);
        free(vars[r]);
        free(outs[r]);
    }
    free(vars);
    free(outs);
    free(in);
}

#endif
