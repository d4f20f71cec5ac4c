/* tests/ir_check.h — graph checks shared by the tests of IR rewrites
 * (test_fold.c, test_moments.c). */
#ifndef MPT_TESTS_IR_CHECK_H
#define MPT_TESTS_IR_CHECK_H

#include <stdlib.h>

#include "ir/ir.h"
#include "tests/check.h"

/* pass(g) with what nothing reads dropped, verified; *n gets pass's count */
static inline mpt_graph *rewrite_dce(mpt_graph *(*pass)(const mpt_graph *, int *),
                                     const mpt_graph *g, int *n) {
    mpt_graph *f = pass(g, n);
    mpt_graph *d = mpt_graph_dce(f, NULL);
    mpt_graph_free(f);
    char buf[256];
    const char *e = mpt_graph_verify(d, buf, sizeof buf);
    CHECK_MSG(!e, "rewritten graph does not verify: %s", e);
    return d;
}

/* Longest chain of reduce_sums over axes where each reads the previous
 * one's result spread back over the tensor: the number of times a backend
 * must read the tensor. */
static inline int pass_depth(const mpt_graph *g, int64_t axes) {
    int *lv = calloc((size_t)g->n_nodes, sizeof *lv), most = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const mpt_node *x = &g->nodes[i];
        for (int k = 0; k < x->n_in; k++)
            if (lv[x->in[k]] > lv[i]) lv[i] = lv[x->in[k]];
        if (x->op == MPT_OP_REDUCE_SUM && x->attr.i[0] == axes) lv[i]++;
        if (lv[i] > most) most = lv[i];
    }
    free(lv);
    return most;
}

/* A batch norm's training statistics of x (shape s) over axes, n elements
 * per channel (shape cs), as lang/lower.c builds them: mean = sum(x) / n,
 * xc = x - mean, var = sum(xc^2) / n. Returns var; mean and xc through
 * the pointers. */
static inline int bn_moments(mpt_graph *g, int x, mpt_shape s, mpt_shape cs, mpt_dtype dt,
                             int64_t axes, double n, int *mean, int *xc) {
    int inv_n = mpt_b_const(g, dt, cs, 1.0 / n);
    *mean = mpt_b_binary(g, MPT_OP_MUL, mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, axes), inv_n);
    *xc = mpt_b_binary(g, MPT_OP_SUB, x, mpt_b_broadcast_to(g, *mean, s));
    return mpt_b_binary(g, MPT_OP_MUL,
                        mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_unary(g, MPT_OP_SQUARE, *xc), axes),
                        inv_n);
}

#endif
