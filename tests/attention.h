/* tests/attention.h — the attention graph the backends' batch_matmul tests
 * share (tests/test_cpu_backend.c, tests/test_cuda_emu.c,
 * tests/test_cuda_ptx.c). */
#ifndef MPT_TESTS_ATTENTION_H
#define MPT_TESTS_ATTENTION_H

#include <math.h>

#include "ir/ir.h"

/* Scaled dot-product attention per batch and head, computed in dt from f32
 * inputs q, k, v of shape s ([B,H,T,D] or [B,T,D]):
 *   S = q k^T / sqrt(D), P = softmax(S) along the last axis, O = P v.
 * The inputs are scaled by 1/4 first: S then stays well inside exp's range
 * without subtracting the row maximum, and a one-ulp difference of a
 * low-precision S moves P by a small part of the tolerance. Outputs "o",
 * and with grads the gradients of sum(O^2) (in f32) with respect to q, k
 * and v: "dq", "dk", "dv" (forward and backward hold batch_matmuls with
 * the flags nn, nt and tn). Returns 0, or -1 when autodiff fails. */
static inline int attention_graph(mpt_graph *g, mpt_dtype dt, mpt_shape s, int grads) {
    int r = s.rank, in[3];
    int64_t D = s.dim[r - 1];
    const char *names[3] = {"q", "k", "v"};
    int x[3];
    for (int i = 0; i < 3; i++) {
        in[i] = mpt_b_input(g, names[i], MPT_DT_F32, s);
        int scaled = mpt_b_binary(g, MPT_OP_MUL, in[i], mpt_b_const(g, MPT_DT_F32, s, 0.25));
        x[i] = mpt_b_cast(g, scaled, dt);
    }
    int sc = mpt_b_batch_matmul(g, x[0], x[1], 0, 1);
    mpt_shape ss = g->nodes[sc].shape; /* [..., T, T] */
    sc = mpt_b_binary(g, MPT_OP_MUL, sc, mpt_b_const(g, dt, ss, 1.0 / sqrt((double)D)));
    int e = mpt_b_unary(g, MPT_OP_EXP, sc);
    int sum = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, e, (int64_t)1 << (r - 1));
    int den = mpt_b_broadcast(g, sum, ss, ((int64_t)1 << (r - 1)) - 1);
    int pr = mpt_b_binary(g, MPT_OP_DIV, e, den);
    int o = mpt_b_batch_matmul(g, pr, x[2], 0, 0);
    mpt_graph_add_output(g, "o", o);
    if (!grads) return 0;
    int of = mpt_b_cast(g, o, MPT_DT_F32);
    int y = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_unary(g, MPT_OP_SQUARE, of),
                         ((int64_t)1 << r) - 1);
    int d[3];
    char err[256];
    if (mpt_autodiff(g, y, -1, in, 3, d, err, sizeof err)) return -1;
    mpt_graph_add_output(g, "dq", d[0]);
    mpt_graph_add_output(g, "dk", d[1]);
    mpt_graph_add_output(g, "dv", d[2]);
    return 0;
}

#endif
