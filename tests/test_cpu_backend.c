/* tests/test_cpu_backend.c — the CPU backend against the reference
 * interpreter: every op and every kernel kind, fused and unfused, in f32,
 * f16 and bf16, at odd sizes (1, 7, 9, 1023) and round ones; then real train
 * steps of examples/mlp_small.mpt (three policies) and
 * examples/convnet_small.mpt; batch_matmul alone and in attention.
 * Convolutions, pooling, argmax and scatter_add:
 * tests/test_cpu_conv.c. */
#include <xmmintrin.h>

#include "attention.h"
#include "cpu_check.h"

static const int64_t sizes[] = {1, 7, 9, 1023, 64, 96};

/* ---- elementwise ops, one at a time, every float dtype and size ---- */

static void test_elementwise(void) {
    static const mpt_op unary[] = {MPT_OP_NEG, MPT_OP_ABS, MPT_OP_EXP, MPT_OP_LOG, MPT_OP_SQRT,
                                   MPT_OP_RSQRT, MPT_OP_RECIP, MPT_OP_SQUARE, MPT_OP_RELU,
                                   MPT_OP_SIGMOID, MPT_OP_TANH, MPT_OP_GELU, MPT_OP_GELU_GRAD,
                                   MPT_OP_SIN, MPT_OP_COS, MPT_OP_IS_FINITE};
    static const mpt_op binary[] = {MPT_OP_ADD, MPT_OP_SUB, MPT_OP_MUL, MPT_OP_DIV, MPT_OP_MAX,
                                    MPT_OP_MIN, MPT_OP_POW, MPT_OP_LT, MPT_OP_GT, MPT_OP_EQ};
    char what[128];
    for (int d = 0; d < 3; d++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            mpt_dtype dt = float_dts[d];
            mpt_shape s = mpt_shape_2(3, sizes[si]);
            mpt_graph *g = mpt_graph_new("elementwise");
            int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, s), dt);
            int y = mpt_b_cast(g, mpt_b_input(g, "y", MPT_DT_F32, s), dt);
            for (size_t u = 0; u < sizeof unary / sizeof unary[0]; u++)
                mpt_graph_add_output(g, mpt_op_name(unary[u]), mpt_b_unary(g, unary[u], x));
            for (size_t b = 0; b < sizeof binary / sizeof binary[0]; b++)
                mpt_graph_add_output(g, mpt_op_name(binary[b]), mpt_b_binary(g, binary[b], x, y));
            int gt = mpt_b_binary(g, MPT_OP_GT, x, y);
            mpt_graph_add_output(g, "select", mpt_b_select(g, gt, x, y));
            mpt_graph_add_output(g, "not", mpt_b_unary(g, MPT_OP_NOT, gt));
            mpt_graph_add_output(g, "and", mpt_b_binary(g, MPT_OP_AND, gt, mpt_b_binary(g, MPT_OP_LT, x, x)));
            /* casts between every pair, i32 and bool included */
            int xi = mpt_b_cast(g, mpt_b_binary(g, MPT_OP_MUL, x, mpt_b_broadcast_to(g, mpt_b_scalar(g, dt, 1000), s)), MPT_DT_I32);
            mpt_graph_add_output(g, "cast_i32", xi);
            mpt_graph_add_output(g, "cast_back", mpt_b_cast(g, xi, dt));
            mpt_graph_add_output(g, "i32_add", mpt_b_binary(g, MPT_OP_ADD, xi, xi));
            /* (the divisor is a constant: a truncated float can be -0 inside
             * one interpreter run, which no i32 buffer can hold) */
            mpt_graph_add_output(g, "i32_div", mpt_b_binary(g, MPT_OP_DIV, xi, mpt_b_broadcast_to(g, mpt_b_scalar(g, MPT_DT_I32, -7), s)));
            mpt_graph_add_output(g, "cast_bool", mpt_b_cast(g, x, MPT_DT_BOOL));
            for (int d2 = 0; d2 < 3; d2++)
                if (d2 != d) mpt_graph_add_output(g, mpt_dtype_name(float_dts[d2]), mpt_b_cast(g, x, float_dts[d2]));
            snprintf(what, sizeof what, "elementwise %s [3,%lld]", mpt_dtype_name(dt), (long long)sizes[si]);
            run_both(g, 1, tol_for(TOL_EXACT, dt, 1), 1, what, sizes[si] == 9 || sizes[si] == 1023 ? BOTH : FUSED);
            mpt_graph_free(g);
        }
}

/* ---- index ops fused into loops: broadcast, transpose, reshape, iota,
 * one_hot, gather, random_uniform ---- */

static void test_movement(void) {
    char what[128];
    for (int d = 0; d < 3; d++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            mpt_dtype dt = float_dts[d];
            int64_t C = sizes[si], R = 5;
            mpt_shape s = mpt_shape_2(R, C);
            mpt_graph *g = mpt_graph_new("movement");
            int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, s), dt);
            int xt = mpt_b_input(g, "xt", MPT_DT_F32, mpt_shape_2(C, R));
            int bias = mpt_b_input(g, "bias", MPT_DT_F32, mpt_shape_1(C));
            int col = mpt_b_input(g, "col", MPT_DT_F32, mpt_shape_1(R));
            int ids = mpt_b_input(g, "ids", MPT_DT_I32, mpt_shape_1(R));
            int table = mpt_b_input(g, "table", MPT_DT_F32, mpt_shape_2(10, C));
            int counter = mpt_b_input(g, "counter", MPT_DT_I32, mpt_shape_scalar());
            /* bias along the vector dim, a column along rows, a scalar */
            int y = mpt_b_binary(g, MPT_OP_MUL, x, mpt_b_broadcast(g, mpt_b_cast(g, bias, dt), s, 0x2));
            y = mpt_b_binary(g, MPT_OP_ADD, y, mpt_b_broadcast(g, mpt_b_cast(g, col, dt), s, 0x1));
            y = mpt_b_binary(g, MPT_OP_SUB, y, mpt_b_broadcast_to(g, mpt_b_scalar(g, dt, 0.5), s));
            int t = mpt_b_transpose(g, mpt_b_cast(g, xt, dt), (int[]){1, 0});
            y = mpt_b_binary(g, MPT_OP_ADD, y, t);
            mpt_graph_add_output(g, "fused", mpt_b_unary(g, MPT_OP_RELU, y));
            mpt_graph_add_output(g, "reshape", mpt_b_reshape(g, mpt_b_unary(g, MPT_OP_NEG, x), mpt_shape_1(R * C)));
            mpt_graph_add_output(g, "iota", mpt_b_binary(g, MPT_OP_ADD, x, mpt_b_iota(g, dt, s, 1)));
            mpt_graph_add_output(g, "one_hot", mpt_b_one_hot(g, ids, (int)C, dt));
            mpt_graph_add_output(g, "gather", mpt_b_gather(g, mpt_b_cast(g, table, dt), ids));
            mpt_graph_add_output(g, "random", mpt_b_random_uniform(g, counter, mpt_shape_2(R, C), 1234 + d));
            snprintf(what, sizeof what, "movement %s [%lld,%lld]", mpt_dtype_name(dt), (long long)R, (long long)C);
            run_both(g, 1, tol_for(TOL_EXACT, dt, 1), 0, what, sizes[si] == 9 || sizes[si] == 1023 ? BOTH : FUSED);
            mpt_graph_free(g);
        }
}

/* ---- slice and concat: along the last axis, where a vector's lanes must
 * not cross from one operand to the other (splits whose gcd is a whole
 * vector, and splits that make some vectors go lane by lane), a middle
 * axis and the first; alone, under elementwise ops, reading casts, as i32,
 * and in a reduction's body (mode A along the concatenated last dim, mode
 * B over the first) ---- */

static void test_slice_concat(void) {
    const size_t n_sizes = sizeof sizes / sizeof sizes[0];
    char what[128];
    for (int d = 0; d < 3; d++)
        for (size_t si = 0; si < n_sizes; si++) {
            mpt_dtype dt = float_dts[d];
            /* widths pair as (1,7) (7,9) (9,1023) (1023,64) (64,96) (96,1):
             * only (64,96) keeps whole 16-lane vectors on one side */
            int64_t R = 5, A = sizes[si], B = sizes[(si + 1) % n_sizes];
            int64_t start = A / 3, len = A - A / 3 - A / 4;
            mpt_graph *g = mpt_graph_new("slice_concat");
            int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(R, A)), dt);
            int y = mpt_b_cast(g, mpt_b_input(g, "y", MPT_DT_F32, mpt_shape_2(R, B)), dt);
            int t = mpt_b_cast(g, mpt_b_input(g, "t", MPT_DT_F32, mpt_shape_make(3, (int64_t[]){R, 3, A})), dt);
            int u = mpt_b_cast(g, mpt_b_input(g, "u", MPT_DT_F32, mpt_shape_make(3, (int64_t[]){2, 3, A})), dt);
            int cat = mpt_b_concat(g, x, y, 1);
            mpt_graph_add_output(g, "cat_last", cat);
            mpt_graph_add_output(g, "cat_relu_mul", mpt_b_binary(g, MPT_OP_MUL, mpt_b_unary(g, MPT_OP_RELU, cat), cat));
            int sl = mpt_b_slice(g, x, 1, start, len);
            mpt_graph_add_output(g, "slice_last", sl);
            int nx = mpt_b_unary(g, MPT_OP_NEG, x); /* a computed operand, from memory */
            mpt_graph_add_output(g, "slice_sigmoid_add", mpt_b_binary(g, MPT_OP_ADD, mpt_b_unary(g, MPT_OP_SIGMOID, sl),
                                                                      mpt_b_slice(g, nx, 1, start, len)));
            /* gates split and joined again, as an LSTM's */
            int lo = mpt_b_slice(g, cat, 1, 0, A), hi = mpt_b_slice(g, cat, 1, A, B);
            mpt_graph_add_output(g, "rejoin", mpt_b_concat(g, mpt_b_unary(g, MPT_OP_TANH, hi), lo, 1));
            mpt_graph_add_output(g, "cat_i32", mpt_b_concat(g, mpt_b_cast(g, x, MPT_DT_I32), mpt_b_cast(g, y, MPT_DT_I32), 1));
            int tm = mpt_b_slice(g, t, 1, 1, 2);
            mpt_graph_add_output(g, "slice_middle", mpt_b_unary(g, MPT_OP_ABS, tm));
            mpt_graph_add_output(g, "cat_middle", mpt_b_concat(g, t, tm, 1));
            mpt_graph_add_output(g, "cat_first", mpt_b_binary(g, MPT_OP_SUB, mpt_b_concat(g, u, t, 0),
                                                               mpt_b_concat(g, t, u, 0)));
            mpt_graph_add_output(g, "slice_first", mpt_b_slice(g, t, 0, 1, R - 1 ? R - 1 : 1));
            snprintf(what, sizeof what, "slice/concat %s [%lld,%lld|%lld]", mpt_dtype_name(dt),
                     (long long)R, (long long)A, (long long)B);
            run_both(g, 1, tol_for(TOL_EXACT, dt, 1), 1, what, BOTH);
            mpt_graph_free(g);

            g = mpt_graph_new("slice_concat_reduce");
            x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(R, A)), MPT_DT_F32);
            y = mpt_b_cast(g, mpt_b_input(g, "y", MPT_DT_F32, mpt_shape_2(R, B)), MPT_DT_F32);
            cat = mpt_b_unary(g, MPT_OP_SQUARE, mpt_b_concat(g, mpt_b_cast(g, x, dt), mpt_b_cast(g, y, dt), 1));
            mpt_graph_add_output(g, "sum_last", mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_cast(g, cat, MPT_DT_F32), 0x2));
            mpt_graph_add_output(g, "max_last", mpt_b_reduce(g, MPT_OP_REDUCE_MAX, cat, 0x2));
            mpt_graph_add_output(g, "sum_first", mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_slice(g, x, 1, start, len), 0x1));
            snprintf(what, sizeof what, "slice/concat reductions %s [%lld,%lld|%lld]", mpt_dtype_name(dt),
                     (long long)R, (long long)A, (long long)B);
            run_both(g, 1, tol_for(TOL_ACCUM, dt, R * (A + B)), 0, what, BOTH);
            mpt_graph_free(g);
        }
}

/* ---- batch_matmul: alone for every trans combination at sizes of 1, 7
 * and 33 (no vector or row block is full) and at sizes that fill the
 * register tiles and leave ragged edges, rank 3 and 4; and attention
 * (softmax between two batch_matmuls) with its gradient, fused and
 * unfused ---- */

static void test_batch_matmul(void) {
    static const int64_t mnk[][3] = {{1, 1, 1}, {7, 33, 1}, {33, 7, 7}, {1, 33, 33},
                                     {33, 1, 7}, {7, 7, 33}, {33, 33, 33},
                                     /* the register tiles: 64 and 24 columns wide (AVX-512,
                                      * AVX2), 8 x 1 vector, and what they leave */
                                     {13, 90, 5}, {37, 40, 17}};
    char what[128];
    for (int d = 0; d < 3; d++)
        for (size_t c = 0; c < sizeof mnk / sizeof mnk[0]; c++) {
            mpt_dtype dt = float_dts[d];
            int64_t M = mnk[c][0], N = mnk[c][1], K = mnk[c][2];
            int rank = c % 2 ? 4 : 3, l = rank - 2;
            int64_t lead[2] = {2, 3};
            mpt_graph *g = mpt_graph_new("batch_matmul");
            /* a and b stored plain and transposed: [.., M, K] [.., K, M] [.., K, N] [.., N, K] */
            int ops[2][2];
            for (int t = 0; t < 2; t++) {
                int64_t da[4] = {lead[0], lead[1]}, db[4] = {lead[0], lead[1]};
                da[l] = t ? K : M, da[l + 1] = t ? M : K;
                db[l] = t ? N : K, db[l + 1] = t ? K : N;
                ops[0][t] = mpt_b_cast(g, mpt_b_input(g, t ? "at" : "a", MPT_DT_F32, mpt_shape_make(rank, da)), dt);
                ops[1][t] = mpt_b_cast(g, mpt_b_input(g, t ? "bt" : "b", MPT_DT_F32, mpt_shape_make(rank, db)), dt);
            }
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++) {
                    char nm[8];
                    snprintf(nm, sizeof nm, "c%d%d", ta, tb);
                    mpt_graph_add_output(g, nm, mpt_b_batch_matmul(g, ops[0][ta], ops[1][tb], ta, tb));
                }
            snprintf(what, sizeof what, "batch_matmul %s rank %d M %lld N %lld K %lld", mpt_dtype_name(dt),
                     rank, (long long)M, (long long)N, (long long)K);
            run_both(g, 1, tol_for(TOL_ACCUM, dt, K), 0, what, FUSED);
            mpt_graph_free(g);
        }
    /* attention, with and without its gradient; T and D odd */
    static const int64_t shapes[2][4] = {{2, 3, 7, 33}, {3, 33, 7}};
    for (int d = 0; d < 3; d++)
        for (int sh = 0; sh < 2; sh++)
            for (int grads = 0; grads < 2; grads++) {
                mpt_dtype dt = float_dts[d];
                mpt_shape s = mpt_shape_make(sh ? 3 : 4, shapes[sh]);
                mpt_graph *g = mpt_graph_new("attention");
                CHECK(attention_graph(g, dt, s, grads) == 0);
                /* fused: the scale, exp, sum and divide between the two batch_matmuls
                 * are loop and reduction kernels of their own, never a batch_matmul's */
                mpt_fusion_opts fo;
                mpt_fusion_opts_default(&fo);
                mpt_plan *p = mpt_fuse(g, &fo);
                for (int k = 0; k < p->n_kernels; k++) {
                    const mpt_kernel *K = &p->kernels[k];
                    int has_bmm = 0;
                    for (int i = 0; i < K->n_nodes; i++)
                        has_bmm |= g->nodes[K->nodes[i]].op == MPT_OP_BATCH_MATMUL;
                    CHECK_MSG(!has_bmm || (K->kind == MPT_KERNEL_OPAQUE && K->n_nodes == 1),
                              "attention: kernel %s holds a batch_matmul with other ops", K->name);
                }
                mpt_plan_free(p);
                int64_t terms = s.dim[s.rank - 1] + s.dim[s.rank - 2];
                snprintf(what, sizeof what, "attention%s %s rank %d", grads ? " gradient" : "",
                         mpt_dtype_name(dt), s.rank);
                run_both(g, 1, tol_for(TOL_ACCUM, dt, terms), 0, what, BOTH);
                mpt_graph_free(g);
            }
}

/* ---- reductions: over the last dim (mode A), the first (mode B), all;
 * and the softmax kernel whose second pass reads the first's result ---- */

static void test_reductions(void) {
    char what[128];
    for (int d = 0; d < 3; d++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            mpt_dtype dt = float_dts[d];
            int64_t C = sizes[si], R = 7;
            mpt_shape s = mpt_shape_2(R, C);
            mpt_graph *g = mpt_graph_new("reduce");
            int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, s), dt);
            int sq = mpt_b_unary(g, MPT_OP_SQUARE, x);
            mpt_graph_add_output(g, "sum_last", mpt_b_reduce(g, MPT_OP_REDUCE_SUM, sq, 0x2));
            /* a second reduction of the same rows in the same pass (each
             * needs its own vector and scalar accumulators) */
            mpt_graph_add_output(g, "max_sq_last", mpt_b_reduce(g, MPT_OP_REDUCE_MAX, sq, 0x2));
            mpt_graph_add_output(g, "sum_first", mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, 0x1));
            mpt_graph_add_output(g, "sum_all", mpt_b_reduce(g, MPT_OP_REDUCE_SUM, x, 0x3));
            mpt_graph_add_output(g, "max_last", mpt_b_reduce(g, MPT_OP_REDUCE_MAX, x, 0x2));
            mpt_graph_add_output(g, "max_first", mpt_b_reduce(g, MPT_OP_REDUCE_MAX, x, 0x1));
            int fin = mpt_b_unary(g, MPT_OP_IS_FINITE, mpt_b_unary(g, MPT_OP_LOG, x));
            mpt_graph_add_output(g, "all", mpt_b_reduce(g, MPT_OP_REDUCE_ALL, fin, 0x3));
            mpt_graph_add_output(g, "all_last", mpt_b_reduce(g, MPT_OP_REDUCE_ALL, fin, 0x2));
            /* softmax: max, then exp(x - max) and its sum in one kernel, then / */
            int xf = mpt_b_cast(g, x, MPT_DT_F32);
            int m = mpt_b_reduce(g, MPT_OP_REDUCE_MAX, xf, 0x2);
            int ex = mpt_b_unary(g, MPT_OP_EXP, mpt_b_binary(g, MPT_OP_SUB, xf, mpt_b_broadcast(g, m, s, 0x1)));
            int den = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, ex, 0x2);
            int sm = mpt_b_binary(g, MPT_OP_DIV, ex, mpt_b_broadcast(g, den, s, 0x1));
            mpt_graph_add_output(g, "softmax", sm);
            /* a second pass over the row reading the first pass's result */
            int lse = mpt_b_unary(g, MPT_OP_LOG, den);
            int lp = mpt_b_binary(g, MPT_OP_SUB, xf, mpt_b_broadcast(g, lse, s, 0x1));
            mpt_graph_add_output(g, "logp_sum", mpt_b_reduce(g, MPT_OP_REDUCE_SUM, lp, 0x2));
            /* more reductions in one pass than a fixed table would hold
             * (ResNet-50's loss-scale check fuses dozens): twelve of
             * x * k over the same rows */
            for (int r = 0; r < 12; r++) {
                char name[32];
                snprintf(name, sizeof name, "many_%d", r);
                int xs = mpt_b_binary(g, MPT_OP_MUL, xf, mpt_b_broadcast_to(g, mpt_b_scalar(g, MPT_DT_F32, 1.0 + r), s));
                mpt_graph_add_output(g, name, mpt_b_reduce(g, r % 2 ? MPT_OP_REDUCE_MAX : MPT_OP_REDUCE_SUM, xs, 0x2));
            }
            snprintf(what, sizeof what, "reductions %s [%lld,%lld]", mpt_dtype_name(dt), (long long)R, (long long)C);
            run_both(g, 1, tol_for(TOL_ACCUM, dt, C * R), 0, what, sizes[si] == 9 || sizes[si] == 1023 ? BOTH : FUSED);
            mpt_graph_free(g);
        }
}

/* ---- batch statistics over many rows: the reductions split along the
 * reduced rows into chunks (codegen/cpu/emit_reduce.c mode S), with a
 * second pass reading the first's result, element outputs before and
 * after the reductions, an int reduction, kept dims over two axes, and
 * row counts that leave a partial chunk and a partial block of rows ---- */

static void test_split_reductions(void) {
    static const int64_t shapes[][3] = {{300, 64, 0}, {1023, 96, 0}, {281, 3, 32}};
    char what[128];
    for (int d = 0; d < 3; d++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            mpt_dtype dt = float_dts[d];
            int64_t R = shapes[si][0];
            mpt_shape s = shapes[si][2] ? mpt_shape_make(3, shapes[si]) : mpt_shape_2(R, shapes[si][1]);
            mpt_graph *g = mpt_graph_new("batch_stats");
            int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, s), dt);
            int dy = mpt_b_cast(g, mpt_b_input(g, "dy", MPT_DT_F32, s), dt);
            int xf = mpt_b_cast(g, x, MPT_DT_F32), dyf = mpt_b_cast(g, dy, MPT_DT_F32);
            int64_t keep = (int64_t)((1 << s.rank) - 2); /* every dim but the first */
            int inv_r = mpt_b_scalar(g, MPT_DT_F32, 1.0 / (double)R);
            int mean = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, xf, 0x1);
            mean = mpt_b_binary(g, MPT_OP_MUL, mean, mpt_b_broadcast_to(g, inv_r, g->nodes[mean].shape));
            int dev = mpt_b_binary(g, MPT_OP_SUB, xf, mpt_b_broadcast(g, mean, s, keep));
            int var = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_unary(g, MPT_OP_SQUARE, dev), 0x1);
            var = mpt_b_binary(g, MPT_OP_MUL, var, mpt_b_broadcast_to(g, inv_r, g->nodes[var].shape));
            int eps = mpt_b_scalar(g, MPT_DT_F32, 1e-3); /* before g->nodes is read */
            eps = mpt_b_broadcast_to(g, eps, g->nodes[var].shape);
            int rstd = mpt_b_unary(g, MPT_OP_RSQRT, mpt_b_binary(g, MPT_OP_ADD, var, eps));
            int xhat = mpt_b_binary(g, MPT_OP_MUL, dev, mpt_b_broadcast(g, rstd, s, keep));
            mpt_graph_add_output(g, "mean", mean);
            mpt_graph_add_output(g, "var", var);
            mpt_graph_add_output(g, "y", mpt_b_cast(g, xhat, dt));
            mpt_graph_add_output(g, "relu", mpt_b_unary(g, MPT_OP_RELU, x));
            mpt_graph_add_output(g, "max", mpt_b_reduce(g, MPT_OP_REDUCE_MAX, xf, 0x1));
            mpt_graph_add_output(g, "finite", mpt_b_reduce(g, MPT_OP_REDUCE_ALL, mpt_b_unary(g, MPT_OP_IS_FINITE, x), 0x1));
            /* the backward: two sums in one pass, then dx from both */
            int sdy = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, dyf, 0x1);
            int sdyx = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_binary(g, MPT_OP_MUL, dyf, xf), 0x1);
            int dx = mpt_b_binary(g, MPT_OP_SUB, dyf, mpt_b_broadcast(g, mpt_b_binary(g, MPT_OP_MUL, sdy,
                                  mpt_b_broadcast_to(g, inv_r, g->nodes[sdy].shape)), s, keep));
            dx = mpt_b_binary(g, MPT_OP_SUB, dx, mpt_b_binary(g, MPT_OP_MUL, xf, mpt_b_broadcast(g,
                              mpt_b_binary(g, MPT_OP_MUL, sdyx, mpt_b_broadcast_to(g, inv_r, g->nodes[sdyx].shape)), s, keep)));
            mpt_graph_add_output(g, "dx", mpt_b_cast(g, dx, dt));
            mpt_graph_add_output(g, "sum_dy", sdy);
            snprintf(what, sizeof what, "batch statistics %s [%lld,...]", mpt_dtype_name(dt), (long long)R);
            run_both(g, 1, tol_for(TOL_ACCUM, dt, R), 0, what, BOTH);
            mpt_graph_free(g);
            /* softmax down the columns: the max, then the sum of exp(x - max)
             * in a second pass, then the quotient (five stages, fused) */
            g = mpt_graph_new("column_softmax");
            x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, s), dt);
            xf = mpt_b_cast(g, x, MPT_DT_F32);
            int m = mpt_b_reduce(g, MPT_OP_REDUCE_MAX, xf, 0x1);
            int ex = mpt_b_unary(g, MPT_OP_EXP, mpt_b_binary(g, MPT_OP_SUB, xf, mpt_b_broadcast(g, m, s, keep)));
            int den = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, ex, 0x1);
            mpt_graph_add_output(g, "softmax", mpt_b_binary(g, MPT_OP_DIV, ex, mpt_b_broadcast(g, den, s, keep)));
            mpt_graph_add_output(g, "log_den", mpt_b_unary(g, MPT_OP_LOG, den));
            snprintf(what, sizeof what, "column softmax %s [%lld,...]", mpt_dtype_name(dt), (long long)R);
            run_both(g, 1, tol_for(TOL_ACCUM, dt, R), 0, what, BOTH);
            mpt_graph_free(g);
        }
}

/* ---- GEMMs with every transpose, epilogues mapped onto the GEMM (f32) or
 * run as a loop after it (f16/bf16), prologue casts ---- */

static void test_gemm(void) {
    /* N <= 16 with K >= 64: A read in place (a classifier's logits) */
    static const int64_t mnk[][3] = {{1, 1, 1}, {7, 9, 5}, {33, 17, 300}, {64, 64, 64},
                                     {37, 10, 100}, {1, 16, 64}};
    char what[160];
    for (int d = 0; d < 3; d++)
        for (size_t si = 0; si < sizeof mnk / sizeof mnk[0]; si++)
            for (int tr = 0; tr < 4; tr++) {
                if (tr && si != 2) continue; /* every transpose on one odd shape */
                mpt_dtype dt = float_dts[d];
                int64_t M = mnk[si][0], N = mnk[si][1], K = mnk[si][2];
                int ta = tr & 1, tb = tr >> 1;
                mpt_graph *g = mpt_graph_new("gemm");
                int a = mpt_b_input(g, "a", MPT_DT_F32, ta ? mpt_shape_2(K, M) : mpt_shape_2(M, K));
                int b = mpt_b_variable(g, "w", tb ? mpt_shape_2(N, K) : mpt_shape_2(K, N),
                                       MPT_INIT_GLOROT_UNIFORM, K, N, 0, 1);
                int bias = mpt_b_variable(g, "bias", mpt_shape_1(N), MPT_INIT_UNIFORM, 0, 0, 0.5, 1);
                int mm = mpt_b_matmul(g, mpt_b_cast(g, a, dt), mpt_b_cast(g, b, dt), ta, tb);
                int z = mpt_b_binary(g, MPT_OP_ADD, mm, mpt_b_broadcast(g, mpt_b_cast(g, bias, dt), mpt_shape_2(M, N), 0x2));
                mpt_graph_add_output(g, "y", mpt_b_cast(g, mpt_b_unary(g, MPT_OP_RELU, z), MPT_DT_F32));
                mpt_graph_add_output(g, "plain", mpt_b_matmul(g, mpt_b_cast(g, a, dt), mpt_b_cast(g, b, dt), ta, tb));
                snprintf(what, sizeof what, "gemm %s M=%lld N=%lld K=%lld trans=%d%d", mpt_dtype_name(dt),
                         (long long)M, (long long)N, (long long)K, ta, tb);
                run_both(g, 1, tol_for(TOL_ACCUM, dt, K), 0, what, si == 2 && tr == 0 ? BOTH : FUSED);
                mpt_graph_free(g);
            }
}

/* Non-finite values in two elements of the residual input r (inputs[1]):
 * the last row's last column and a middle row's column 1. */
static void plant_nonfinite(const mpt_graph *g, mpt_tensor *in) {
    const mpt_shape s = g->nodes[mpt_graph_input_node(g, 1)].shape;
    int64_t M = s.dim[0], N = s.dim[1];
    mpt_tensor_set(&in[1], M * N - 1, INFINITY);
    if (N > 1) mpt_tensor_set(&in[1], (M / 2) * N + 1, NAN);
}

/* The loss-scale check of a gradient in its GEMM's epilogue: flags =
 * reduce_all over the rows of is_finite(cast(a x w + r, f32) * scale),
 * one flag per column, computed by the epilogue loop (which the pool
 * splits by elements) next to an elementwise output or alone. */
static void test_gemm_epilogue_all_finite(void) {
    static const int64_t mnk[][3] = {{1, 1, 3}, {7, 9, 5}, {1023, 37, 20}, {96, 64, 128}};
    char what[160];
    for (int d = 0; d < 3; d++)
        for (size_t si = 0; si < sizeof mnk / sizeof mnk[0]; si++)
            for (int alone = 0; alone < 2; alone++) {
                mpt_dtype dt = float_dts[d];
                int64_t M = mnk[si][0], N = mnk[si][1], K = mnk[si][2];
                mpt_graph *g = mpt_graph_new("gemm_all_finite");
                mpt_shape mn = mpt_shape_2(M, N);
                int a = mpt_b_input(g, "a", MPT_DT_F32, mpt_shape_2(M, K));
                int r = mpt_b_input(g, "r", MPT_DT_F32, mn);
                int w = mpt_b_variable(g, "w", mpt_shape_2(K, N), MPT_INIT_GLOROT_UNIFORM, K, N, 0, 1);
                int mm = mpt_b_matmul(g, mpt_b_cast(g, a, dt), mpt_b_cast(g, w, dt), 0, 0);
                int y = mpt_b_binary(g, MPT_OP_ADD, mm, mpt_b_cast(g, r, dt));
                int g32 = mpt_b_binary(g, MPT_OP_MUL, mpt_b_cast(g, y, MPT_DT_F32),
                                       mpt_b_broadcast_to(g, mpt_b_scalar(g, MPT_DT_F32, 0.5), mn));
                int ok = mpt_b_reduce(g, MPT_OP_REDUCE_ALL, mpt_b_unary(g, MPT_OP_IS_FINITE, g32), 0x1);
                mpt_graph_add_output(g, "flags", ok);
                if (!alone) mpt_graph_add_output(g, "g", mpt_b_unary(g, MPT_OP_NEG, g32));
                mpt_fusion_opts fo;
                mpt_fusion_opts_default(&fo);
                mpt_plan *p = mpt_fuse(g, &fo);
                CHECK_MSG(p->n_kernels == 1 && p->kernels[0].kind == MPT_KERNEL_GEMM,
                          "the flags must be computed in the GEMM's epilogue (%d kernels)", p->n_kernels);
                mpt_plan_free(p);
                snprintf(what, sizeof what, "gemm all-finite %s M=%lld N=%lld K=%lld%s", mpt_dtype_name(dt),
                         (long long)M, (long long)N, (long long)K, alone ? " alone" : "");
                plant = plant_nonfinite;
                run_both(g, 2, tol_for(TOL_ACCUM, dt, K), 0, what, si == 2 ? BOTH : FUSED);
                plant = NULL;
                mpt_graph_free(g);
            }
}

/* ---- updates computed straight into their variables, and the profile ----
 * Some updates may be written in place (an elementwise step of a loop or
 * of a GEMM's epilogue), others may not: a swap of two variables, and a
 * weight a later kernel still reads. Three steps against the interpreter
 * catch a value overwritten too early; the profile says how many were. */

static void test_updates_and_profile(void) {
    mpt_graph *g = mpt_graph_new("updates");
    mpt_shape s = mpt_shape_2(33, 40);
    int w = mpt_b_variable(g, "w", s, MPT_INIT_UNIFORM, 0, 0, 1, 1);
    int gr = mpt_b_input(g, "g", MPT_DT_F32, s);
    int half = mpt_b_const(g, MPT_DT_F32, s, 0.5);
    int w_new = mpt_b_binary(g, MPT_OP_SUB, w, mpt_b_binary(g, MPT_OP_MUL, half, gr));
    mpt_graph_add_update(g, w, w_new);
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(16, 40));
    int dy = mpt_b_input(g, "dy", MPT_DT_F32, mpt_shape_2(16, 8));
    int wm = mpt_b_variable(g, "wm", mpt_shape_2(40, 8), MPT_INIT_GLOROT_UNIFORM, 40, 8, 0, 1);
    int gw = mpt_b_matmul(g, x, dy, 1, 0);
    int tenth = mpt_b_const(g, MPT_DT_F32, mpt_shape_2(40, 8), 0.1);
    mpt_graph_add_update(g, wm, mpt_b_binary(g, MPT_OP_SUB, wm, mpt_b_binary(g, MPT_OP_MUL, tenth, gw)));
    /* reads the old wm, and may be placed after the update's kernel */
    mpt_graph_add_output(g, "y", mpt_b_matmul(g, x, wm, 0, 0));
    int p = mpt_b_variable(g, "p", mpt_shape_1(40), MPT_INIT_UNIFORM, 0, 0, 1, 1);
    int q = mpt_b_variable(g, "q", mpt_shape_1(40), MPT_INIT_UNIFORM, 0, 0, 1, 1);
    mpt_graph_add_update(g, p, q);
    mpt_graph_add_update(g, q, p);
    mpt_graph_add_output(g, "w_sq", mpt_b_unary(g, MPT_OP_SQUARE, w_new));
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    mpt_cpu_profile(f);
    run_both(g, 3, tol_for(TOL_ACCUM, MPT_DT_F32, 40), 0, "in-place updates", BOTH);
    mpt_cpu_profile(NULL);
    fclose(f);
    int fused_in_place = -1, n_updates = 0;
    const char *at = text ? strstr(text, "cpu profile of updates") : NULL;
    const char *again = at ? strstr(at + 1, "cpu profile of updates") : NULL;
    const char *last = again ? again : at; /* the fused plan runs second */
    const char *c = last ? strstr(last, "updates computed in place") : NULL;
    while (c && c > last && c[-1] != '(') c--;
    if (c) sscanf(c, "%d of %d", &fused_in_place, &n_updates);
    if (getenv("MPT_TEST_VERBOSE")) fputs(text ? text : "", stderr);
    CHECK_MSG(at && again, "the profile has a table per plan:\n%s", text ? text : "");
    CHECK_MSG(text && strstr(text, "per layer:"), "the profile has the per-layer summary");
    /* measured ceilings, and each row's share of its ceiling */
    double f32 = 0, gbps = 0;
    const char *ce = text ? strstr(text, "ceilings on ") : NULL;
    const char *fc = ce ? strstr(ce, "f32 ") : NULL, *mc = ce ? strstr(ce, "memory ") : NULL;
    if (fc) sscanf(fc, "f32 %lf", &f32);
    if (mc) sscanf(mc, "memory %lf", &gbps);
    CHECK_MSG(f32 > 1 && gbps > 0.5, "ceilings measured: f32 %g GFLOP/s, %g GB/s", f32, gbps);
    CHECK(text && strstr(text, "of ceiling") && strstr(text, "%  "));
    CHECK_MSG(n_updates == 4 && fused_in_place >= 1 && fused_in_place <= 2,
              "fused plan: %d of %d updates in place (want 1 or 2 of 4: never the swap)",
              fused_in_place, n_updates);
    free(text);
    mpt_graph_free(g);
}

/* ---- denormals: flushed by default (as TensorFlow and XLA run on the
 * CPU), kept with MPTC_DENORMALS=keep; the caller's MXCSR either way ---- */

static void test_denormals(void) {
    mpt_shape s = mpt_shape_2(4, 4096);
    mpt_graph *g = mpt_graph_new("denormals");
    int x = mpt_b_input(g, "x", MPT_DT_F32, s), z = mpt_b_input(g, "z", MPT_DT_F32, s);
    mpt_graph_add_output(g, "prod", mpt_b_binary(g, MPT_OP_MUL, x, z));
    mpt_graph_add_output(g, "mm", mpt_b_matmul(g, x, z, 0, 1));
    char err[512];
    unsigned csr = _mm_getcsr();
    for (int keep = 0; keep < 2; keep++) {
        if (keep) setenv("MPTC_DENORMALS", "keep", 1);
        else unsetenv("MPTC_DENORMALS");
        mpt_fusion_opts fo;
        mpt_fusion_opts_default(&fo);
        mpt_plan *p = mpt_fuse(g, &fo);
        mpt_exec *e = mpt_backend_cpu.compile(p, err, sizeof err);
        CHECK_MSG(e != NULL, "denormals: compile: %s", err);
        mpt_tensor in[2], out[2];
        mpt_tensor_alloc(&in[0], MPT_DT_F32, s);
        mpt_tensor_alloc(&in[1], MPT_DT_F32, s);
        float *xv = in[0].data, *zv = in[1].data;
        for (int64_t i = 0; i < mpt_shape_numel(s); i++) {
            xv[i] = (i % 3 ? 1e-39f : -2e-39f); /* f32 denormals */
            zv[i] = 1.0f;
        }
        int rc = e ? mpt_backend_cpu.run(e, in, NULL, out, err, sizeof err) : -1;
        CHECK_MSG(rc == 0, "denormals: run: %s", err);
        CHECK_MSG(_mm_getcsr() == csr, "the step leaves the caller's MXCSR as it was");
        if (rc == 0) {
            const float *pv = out[0].data, *mv = out[1].data;
            int64_t bad = 0;
            for (int64_t i = 0; i < mpt_shape_numel(s); i++)
                bad += keep ? pv[i] != xv[i] : pv[i] != 0.0f;
            CHECK_MSG(bad == 0, "x * 1 over denormal x: %lld of %lld elements %s",
                      (long long)bad, (long long)mpt_shape_numel(s),
                      keep ? "not kept (MPTC_DENORMALS=keep)" : "not flushed to zero");
            /* each row sums 4096 products of a denormal with 1 */
            for (int i = 0; i < 16; i++)
                CHECK_MSG(keep ? mv[i] != 0.0f && fabsf(mv[i]) < 1e-35f : mv[i] == 0.0f,
                          "matmul of denormals [%d] = %g (keep=%d)", i, (double)mv[i], keep);
            mpt_tensor_free(&out[0]);
            mpt_tensor_free(&out[1]);
        }
        mpt_tensor_free(&in[0]);
        mpt_tensor_free(&in[1]);
        if (e) mpt_backend_cpu.free(e);
        mpt_plan_free(p);
    }
    unsetenv("MPTC_DENORMALS");
    mpt_graph_free(g);
}

/* ---- real train steps ---- */

static void train_steps(const char *path, const char *policy, int batch, int steps) {
    mpt_lower_opts lo = {.batch_size = batch, .training = 1};
    mpt_model *m = NULL;
    FILE *diag = fopen("/dev/null", "w");
    int bad = mpt_lang_load(path, &lo, &m, diag);
    fclose(diag);
    CHECK_MSG(bad == 0, "%s does not load", path);
    if (bad) return;
    char err[512], what[160];
    mpt_policy_opts po = {0};
    mpt_policy_lookup(policy, &po.global);
    mpt_graph *typed = mpt_policy_apply(m->graph, &po, err, sizeof err);
    CHECK_MSG(typed != NULL, "policy: %s", err);
    mpt_train_opts to = {.loss = m->train.loss, .opt = m->train.optimizer,
                         .loss_scale = m->train.loss_scale, .metrics = {.accuracy = 1}};
    to.loss_scale.mode = strcmp(policy, "mixed_float16") ? MPT_LS_NONE : MPT_LS_DYNAMIC;
    mpt_graph *step = typed ? mpt_train_step(typed, &to, err, sizeof err) : NULL;
    CHECK_MSG(step != NULL, "train step: %s", err);
    if (step) {
        /* loss and weights after a few steps: the GEMMs' f32 accumulation is
         * the only difference, so the accumulation tolerance of the compute
         * dtype; but Adam turns a gradient that is exactly 0 on one side and
         * rounding noise on the other into a whole learning-rate step
         * (m / sqrt(v) = +-1), so weights may differ by lr (1e-3) per step */
        mpt_dtype dt = strcmp(policy, "float32") == 0 ? MPT_DT_F32
                       : strcmp(policy, "mixed_float16") == 0 ? MPT_DT_F16 : MPT_DT_BF16;
        tol t = tol_for(TOL_ACCUM, dt, 1);
        t.atol += 1.2e-3 * steps;
        snprintf(what, sizeof what, "%s %s", path, policy);
        run_both(step, steps, t, 0, what, strcmp(policy, "mixed_float16") == 0 ? BOTH : FUSED);
    }
    mpt_graph_free(step);
    mpt_graph_free(typed);
    mpt_model_free(m);
}

int main(void) {
    char why[256];
    if (!mpt_backend_cpu.available(why, sizeof why)) {
        printf("skipped: the CPU JIT is not available here: %s\n", why);
        return 77;
    }
    TIMED(test_elementwise());
    TIMED(test_movement());
    TIMED(test_slice_concat());
    TIMED(test_batch_matmul());
    TIMED(test_reductions());
    TIMED(test_split_reductions());
    TIMED(test_gemm());
    TIMED(test_gemm_epilogue_all_finite());
    TIMED(test_updates_and_profile());
    TIMED(test_denormals());
    TIMED(train_steps("examples/mlp_small.mpt", "float32", 16, 3));
    TIMED(train_steps("examples/mlp_small.mpt", "mixed_float16", 16, 3));
    TIMED(train_steps("examples/mlp_small.mpt", "mixed_bfloat16", 16, 3));
    TIMED(train_steps("examples/convnet_small.mpt", "float32", 4, 2));
    /* batch statistics over 512 rows: split reductions, two passes (float32) */
    TIMED(train_steps("tests/models/resblock.mpt", "float32", 8, 2));
    TIMED(train_steps("tests/models/resblock.mpt", "mixed_bfloat16", 8, 2));
    /* what an AVX2 CPU runs (8 lanes, no AVX-512, no bf16 dot products),
     * compiled on this one: MPTC_CPU_ISA=avx2 */
    setenv("MPTC_CPU_ISA", "avx2", 1);
    TIMED(test_slice_concat()); /* joins crossed by 8-lane vectors at other places */
    TIMED(test_batch_matmul()); /* 24-column register tiles */
    TIMED(train_steps("examples/mlp_small.mpt", "float32", 16, 3));
    TIMED(train_steps("examples/convnet_small.mpt", "mixed_float16", 4, 2));
    TIMED(train_steps("examples/convnet_small.mpt", "mixed_bfloat16", 4, 2));
    /* the x86-64 baseline (no AVX2, FMA or F16C): f16 conversions are
     * calls into the process (jit.c), batch_matmul its plain loop */
    setenv("MPTC_CPU_ISA", "sse", 1);
    TIMED(test_batch_matmul());
    TIMED(train_steps("examples/mlp_small.mpt", "float32", 16, 3));
    TIMED(train_steps("examples/mlp_small.mpt", "mixed_bfloat16", 16, 3));
    unsetenv("MPTC_CPU_ISA");
    return check_exit("test_cpu_backend");
}
