/* tests/plan_check.h — a fusion plan run kernel by kernel on the
 * interpreter (mpt_plan_interp_run) against the graph run whole, and the
 * plan invariants every plan keeps: shared by the tests of the fusion pass
 * and its views. */
#ifndef MPTC_TESTS_PLAN_CHECK_H
#define MPTC_TESTS_PLAN_CHECK_H

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fusion/fusion.h"
#include "ir/ir.h"

/* g planned with fusion on or off, the patterns in disable off, and
 * max_ops when not 0 */
static inline mpt_plan *fuse_with(const mpt_graph *g, int enabled, unsigned disable, int max_ops) {
    mpt_fusion_opts o;
    mpt_fusion_opts_default(&o);
    o.enabled = enabled;
    o.disable = disable;
    if (max_ops) o.max_ops = max_ops;
    return mpt_fuse(g, &o);
}

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

/* Every kernel plan invariant that does not depend on the graph. */
static inline void check_plan_sound(const mpt_plan *p) {
    const mpt_graph *g = p->g;
    int64_t sum0 = 0;
    for (int i = 0; i < p->n_buffers; i++)
        if (p->buffers[i].arena == 0) sum0 += (p->buffers[i].bytes + 63) / 64 * 64;
    CHECK(p->peak_bytes <= sum0); /* offsets are 64-byte aligned */
    for (int i = 0; i < p->n_buffers; i++)
        for (int j = i + 1; j < p->n_buffers; j++) {
            const mpt_buffer *a = &p->buffers[i], *b = &p->buffers[j];
            if (a->arena != b->arena) continue;
            int live_together = a->first <= b->last && b->first <= a->last;
            int share = a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
            CHECK_MSG(!(live_together && share), "buffers %%%d and %%%d overlap", a->node, b->node);
        }
    for (int k = 0; k < p->n_kernels; k++) {
        const mpt_kernel *K = &p->kernels[k];
        CHECK(K->n_nodes > 0 && K->n_outputs > 0);
        CHECK(strlen(K->name) < 120);
        for (int j = 0; j < k; j++) CHECK(strcmp(p->kernels[j].name, K->name) != 0);
        /* a kernel only reads values written by earlier kernels */
        for (int i = 0; i < K->n_inputs; i++) {
            int q = mpt_plan_storage(p, K->inputs[i]), ko = p->kernel_of[q];
            CHECK(ko < k);
            CHECK(p->kernel_of[K->inputs[i]] == ko);
            if (ko < 0) CHECK(g->nodes[q].op == MPT_OP_INPUT || g->nodes[q].op == MPT_OP_VARIABLE ||
                              g->nodes[q].op == MPT_OP_CONST);
        }
        /* no kernel writes a view; a view is a reshape of a root that is none */
        for (int i = 0; i < K->n_outputs; i++) CHECK(p->view_of[K->outputs[i]] < 0);
    }
    for (int i = 0; i < g->n_nodes; i++) {
        if (p->view_of[i] < 0) continue;
        CHECK(g->nodes[i].op == MPT_OP_RESHAPE && p->view_of[p->view_of[i]] < 0);
        CHECK(g->nodes[p->view_of[i]].op != MPT_OP_CONST);
        CHECK(mpt_shape_numel(g->nodes[i].shape) == mpt_shape_numel(g->nodes[p->view_of[i]].shape));
    }
}

static inline void plan_fill_inputs(const mpt_graph *g, mpt_tensor *in, unsigned seed) {
    for (int k = 0; k < mpt_graph_n_inputs(g); k++) {
        const mpt_node *nd = &g->nodes[mpt_graph_input_node(g, k)];
        mpt_tensor_alloc(&in[k], nd->dtype, nd->shape);
        int64_t n = mpt_shape_numel(nd->shape);
        for (int64_t i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            double u = (double)((seed >> 8) & 0xffff) / 65536.0;
            int64_t classes = nd->shape.rank ? 10 : 1;
            if (nd->dtype == MPT_DT_I32) mpt_tensor_set(&in[k], i, (double)((seed >> 9) % classes));
            else mpt_tensor_set(&in[k], i, 4 * u - 2);
        }
    }
}

/* the inputs of step s: the fusion tests' own draw, seeded by the step */
static inline void plan_fill_step(const mpt_graph *g, mpt_tensor *in, int s) {
    plan_fill_inputs(g, in, 7u + (unsigned)s);
}

/* the interpreter against the fused and the unfused plan */
static inline void check_bit_identical(const mpt_graph *g, const mpt_plan *fused,
                                       const mpt_plan *unfused, int steps) {
    const mpt_plan *plans[] = {fused, unfused};
    const char *names[] = {"fused", "unfused"};
    plans_bit_identical(g, plans, names, 2, steps, plan_fill_step);
}

#endif
