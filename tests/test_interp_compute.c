/* tests/test_interp_compute.c — the reference interpreter against
 * hand-computed values: matmul and batched matmul, convolution and pooling
 * against naive formulas, softmax, updates, random numbers, initialisers,
 * user errors and the per-node callback. */
#include <stdint.h>

#include "tests/interp_check.h"

/* ---- matmul ---------------------------------------------------------------------- */

static void test_matmul(void) {
    /* a [2,3], b [3,2]; a.b = [[5, 10], [11, 22]] by hand */
    const double a[] = {1, 2, 3, 4, 5, 6}, b[] = {1, 0, -1, 2, 2, 2};
    const double at[] = {1, 4, 2, 5, 3, 6}, bt[] = {1, -1, 2, 0, 2, 2};
    const double want[] = {5, 10, 11, 22};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            mpt_graph *g = mpt_graph_new("mm");
            int x = mpt_b_input(g, "a", MPT_DT_F32, ta ? mpt_shape_2(3, 2) : mpt_shape_2(2, 3));
            int y = mpt_b_input(g, "b", MPT_DT_F32, tb ? mpt_shape_2(2, 3) : mpt_shape_2(3, 2));
            mpt_graph_add_output(g, "c", mpt_b_matmul(g, x, y, ta, tb));
            mpt_tensor out[1];
            run_ok(g, (const double *const[]){ta ? at : a, tb ? bt : b}, NULL, out);
            for (int i = 0; i < 4; i++)
                CHECK_MSG(mpt_tensor_get(&out[0], i) == want[i], "trans %d%d: c[%d] = %g", ta, tb,
                          i, mpt_tensor_get(&out[0], i));
            free_outs(g, out);
            mpt_graph_free(g);
        }
    /* f16 accumulates wide and rounds once: 1 + 2^-11 + 2^-11 = 1 + 2^-10,
     * where f16 running sums would give 1 twice */
    mpt_graph *g = mpt_graph_new("mm16");
    int x = mpt_b_input(g, "a", MPT_DT_F16, mpt_shape_2(1, 3));
    int y = mpt_b_input(g, "b", MPT_DT_F16, mpt_shape_2(3, 1));
    mpt_graph_add_output(g, "c", mpt_b_matmul(g, x, y, 0, 0));
    mpt_tensor out[1];
    run_ok(g, (const double *const[]){(const double[]){1, 0x1p-11, 0x1p-11}, (const double[]){1, 1, 1}},
           NULL, out);
    CHECK(mpt_tensor_get(&out[0], 0) == 1 + 0x1p-10);
    free_outs(g, out);
    mpt_graph_free(g);
}

/* batch_matmul [..., M, K] x [..., K, N] against a naive triple loop, for
 * rank 3 and 4 and every trans combination, in f32 and bf16. Operands are
 * small integers, so every sum is exact in both dtypes and the results
 * must match exactly. */
static void bmm_case(int rank, mpt_dtype dt, int ta, int tb) {
    const int64_t B0 = 2, B1 = rank == 4 ? 3 : 1, M = 3, K = 5, N = 4, nb = B0 * B1;
    int64_t da[4], db[4], lead = rank - 2;
    da[0] = db[0] = B0;
    if (rank == 4) da[1] = db[1] = B1;
    da[lead] = ta ? K : M, da[lead + 1] = ta ? M : K;
    db[lead] = tb ? N : K, db[lead + 1] = tb ? K : N;
    double a[2 * 3 * 3 * 5], b[2 * 3 * 5 * 4];
    for (int i = 0; i < nb * M * K; i++) a[i] = (double)(i * 7 % 5) - 2;
    for (int i = 0; i < nb * K * N; i++) b[i] = (double)(i * 3 % 7) - 3;
    mpt_graph *g = mpt_graph_new("bmm");
    int x = mpt_b_input(g, "a", dt, mpt_shape_make(rank, da));
    int y = mpt_b_input(g, "b", dt, mpt_shape_make(rank, db));
    int c = mpt_b_batch_matmul(g, x, y, ta, tb);
    mpt_graph_add_output(g, "c", c);
    CHECK(g->nodes[c].dtype == dt && g->nodes[c].shape.rank == rank &&
          g->nodes[c].shape.dim[lead] == M && g->nodes[c].shape.dim[lead + 1] == N &&
          g->nodes[c].shape.dim[0] == B0);
    mpt_tensor out[1];
    run_ok(g, (const double *const[]){a, b}, NULL, out);
    int64_t bad = 0;
    for (int64_t q = 0; q < nb; q++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double want = 0;
                for (int64_t k = 0; k < K; k++)
                    want += a[q * M * K + (ta ? k * M + i : i * K + k)] *
                            b[q * K * N + (tb ? j * K + k : k * N + j)];
                bad += mpt_tensor_get(&out[0], (q * M + i) * N + j) != want;
            }
    CHECK_MSG(bad == 0, "batch_matmul rank %d %s trans %d%d: %lld elements wrong", rank,
              mpt_dtype_name(dt), ta, tb, (long long)bad);
    free_outs(g, out);
    mpt_graph_free(g);
}

static void test_batch_matmul(void) {
    for (int rank = 3; rank <= 4; rank++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                bmm_case(rank, MPT_DT_F32, ta, tb);
                bmm_case(rank, MPT_DT_BF16, ta, tb);
            }
    /* bf16 accumulates wide and rounds once, per batch: 1 + 2^-8 + 2^-8 =
     * 1 + 2^-7, where bf16 running sums would round to 1 twice; the second
     * batch's 2 + 2 + 2 = 6 */
    mpt_graph *g = mpt_graph_new("bmm16");
    int x = mpt_b_input(g, "a", MPT_DT_BF16, mpt_shape_make(3, (const int64_t[]){2, 1, 3}));
    int y = mpt_b_input(g, "b", MPT_DT_BF16, mpt_shape_make(3, (const int64_t[]){2, 3, 1}));
    mpt_graph_add_output(g, "c", mpt_b_batch_matmul(g, x, y, 0, 0));
    mpt_tensor out[1];
    run_ok(g, (const double *const[]){(const double[]){1, 0x1p-8, 0x1p-8, 1, 1, 1},
                                      (const double[]){1, 1, 1, 2, 2, 2}},
           NULL, out);
    CHECK(mpt_tensor_get(&out[0], 0) == 1 + 0x1p-7);
    CHECK(mpt_tensor_get(&out[0], 1) == 6);
    free_outs(g, out);
    mpt_graph_free(g);
}

/* ---- convolution ------------------------------------------------------------------- */

/* y[n,i,j,o] = sum x[n, i*s - p + u, j*s - p + v, c] w[u,v,c,o], zero outside */
static double naive_conv(const double *x, const double *w, int64_t H, int64_t W, int64_t C,
                         int64_t K, int64_t O, int64_t s, int64_t p, int64_t n, int64_t i,
                         int64_t j, int64_t o) {
    double acc = 0;
    for (int64_t u = 0; u < K; u++)
        for (int64_t v = 0; v < K; v++)
            for (int64_t c = 0; c < C; c++) {
                int64_t h = i * s - p + u, ww = j * s - p + v;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                acc += x[((n * H + h) * W + ww) * C + c] * w[((u * K + v) * C + c) * O + o];
            }
    return acc;
}

static double dot(const mpt_tensor *a, const double *b) {
    double s = 0;
    for (int64_t i = 0; i < mpt_shape_numel(a->shape); i++) s += mpt_tensor_get(a, i) * b[i];
    return s;
}

static void conv_case(int same, int stride) {
    const int64_t N = 2, H = 5, W = 5, C = 2, K = 3, O = 3;
    int64_t lo = 0, hi = 0, oh = (H - K) / stride + 1;
    if (same) mpt_same_padding(H, K, stride, &lo, &hi, &oh);
    double x[2 * 5 * 5 * 2], w[3 * 3 * 2 * 3], dy[2 * 5 * 5 * 3];
    for (int i = 0; i < (int)(sizeof x / sizeof x[0]); i++) x[i] = (i * 7 % 11) - 5;
    for (int i = 0; i < (int)(sizeof w / sizeof w[0]); i++) w[i] = (i * 5 % 7) * 0.25 - 0.5;
    for (int i = 0; i < (int)(sizeof dy / sizeof dy[0]); i++) dy[i] = (i * 3 % 5) - 2;
    mpt_graph *g = mpt_graph_new("conv");
    int xi = mpt_b_input(g, "x", MPT_DT_F64, mpt_shape_4(N, H, W, C));
    int wi = mpt_b_input(g, "w", MPT_DT_F64, mpt_shape_4(K, K, C, O));
    int di = mpt_b_input(g, "dy", MPT_DT_F64, mpt_shape_4(N, oh, oh, O));
    int s = stride, p = (int)lo;
    mpt_graph_add_output(g, "y", mpt_b_conv2d(g, xi, wi, s, s, p, p, mpt_shape_4(N, oh, oh, O)));
    mpt_graph_add_output(g, "dx", mpt_b_conv2d_bwd_data(g, di, wi, s, s, p, p, g->nodes[xi].shape));
    mpt_graph_add_output(g, "dw", mpt_b_conv2d_bwd_filter(g, xi, di, s, s, p, p, g->nodes[wi].shape));
    mpt_tensor out[3];
    run_ok(g, (const double *const[]){x, w, dy}, NULL, out);
    int bad = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < oh; i++)
            for (int64_t j = 0; j < oh; j++)
                for (int64_t o = 0; o < O; o++)
                    bad += mpt_tensor_get(&out[0], ((n * oh + i) * oh + j) * O + o) !=
                           naive_conv(x, w, H, W, C, K, O, stride, lo, n, i, j, o);
    CHECK_MSG(bad == 0, "conv2d same=%d stride=%d: %d elements differ", same, stride, bad);
    /* the backward ops are conv2d's adjoints: <conv(x,w), dy> = <x, dx> = <w, dw> */
    double ydy = dot(&out[0], dy);
    CHECK_NEAR(dot(&out[1], x), ydy, 1e-9, 1e-12);
    CHECK_NEAR(dot(&out[2], w), ydy, 1e-9, 1e-12);
    free_outs(g, out);
    mpt_graph_free(g);
}

static void test_conv(void) {
    conv_case(1, 1);
    conv_case(0, 1);
    conv_case(1, 2);
    conv_case(0, 2);
}

/* ---- pooling ---------------------------------------------------------------------- */

static void test_pooling(void) {
    mpt_graph *g = mpt_graph_new("pool");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_4(1, 4, 4, 1)); /* x = 0..15 */
    int mp = mpt_b_pool(g, MPT_OP_MAX_POOL, x, 2, 2, 2, 2, 0, 0, mpt_shape_4(1, 2, 2, 1));
    int ap = mpt_b_pool(g, MPT_OP_AVG_POOL, x, 2, 2, 2, 2, 0, 0, mpt_shape_4(1, 2, 2, 1));
    int as = mpt_b_pool(g, MPT_OP_AVG_POOL, x, 3, 3, 1, 1, 1, 1, mpt_shape_4(1, 4, 4, 1));
    int ms = mpt_b_pool(g, MPT_OP_MAX_POOL, mpt_b_unary(g, MPT_OP_NEG, x), 3, 3, 2, 2, 1, 1,
                        mpt_shape_4(1, 2, 2, 1));
    mpt_graph_add_output(g, "mp", mp);
    mpt_graph_add_output(g, "ap", ap);
    mpt_graph_add_output(g, "as", as);
    mpt_graph_add_output(g, "ms", ms);
    double xv[16];
    for (int i = 0; i < 16; i++) xv[i] = i;
    mpt_tensor out[4];
    run_ok(g, (const double *const[]){xv}, NULL, out);
    const double mpw[] = {5, 7, 13, 15}, apw[] = {2.5, 4.5, 10.5, 12.5};
    for (int i = 0; i < 4; i++) {
        CHECK(mpt_tensor_get(&out[0], i) == mpw[i]);
        CHECK(mpt_tensor_get(&out[1], i) == apw[i]);
    }
    /* padding is never counted: the corner averages {0,1,4,5}, an edge six */
    CHECK(mpt_tensor_get(&out[2], 0) == 2.5);
    CHECK(mpt_tensor_get(&out[2], 1) == 3); /* {0,1,2,4,5,6} */
    CHECK(mpt_tensor_get(&out[2], 5) == 5);
    /* max of negatives with padding: padding (0) must not win */
    CHECK(mpt_tensor_get(&out[3], 0) == 0 && mpt_tensor_get(&out[3], 1) == -1 &&
          mpt_tensor_get(&out[3], 3) == -5);
    free_outs(g, out);
    mpt_graph_free(g);

    /* max_pool_grad: the first maximum of a window takes its gradient */
    g = mpt_graph_new("pool_grad");
    x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_4(1, 2, 4, 1));
    int dy = mpt_b_input(g, "dy", MPT_DT_F32, mpt_shape_4(1, 1, 2, 1));
    mpt_attr pa = {.i = {2, 2, 2, 2, 0, 0}};
    mpt_graph_add_output(g, "dx", mpt_b_max_pool_grad(g, x, dy, &pa));
    int dy2 = mpt_b_input(g, "dy2", MPT_DT_F64, mpt_shape_4(1, 4, 4, 1));
    mpt_attr pa3 = {.i = {3, 3, 1, 1, 1, 1}};
    mpt_graph_add_output(g, "ag", mpt_b_avg_pool_grad(g, dy2, &pa3, mpt_shape_4(1, 4, 4, 1)));
    const double xg[] = {1, 1, 0, 9, /**/ 1, 1, 9, 2};
    double d2[16];
    for (int i = 0; i < 16; i++) d2[i] = (i * 5 % 7) - 3;
    mpt_tensor o2[2];
    run_ok(g, (const double *const[]){xg, (const double[]){10, 20}, d2}, NULL, o2);
    const double dxw[] = {10, 0, 0, 20, 0, 0, 0, 0};
    for (int i = 0; i < 8; i++) CHECK(mpt_tensor_get(&o2[0], i) == dxw[i]);
    /* avg_pool_grad is avg_pool's adjoint: <avg_pool(x), dy> = <x, grad(dy)> */
    double lhs = 0, cnt[16];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            double s = 0;
            int c = 0;
            for (int u = i - 1; u <= i + 1; u++)
                for (int v = j - 1; v <= j + 1; v++)
                    if (u >= 0 && u < 4 && v >= 0 && v < 4) s += xv[u * 4 + v], c++;
            cnt[i * 4 + j] = c;
            lhs += s / c * d2[i * 4 + j];
        }
    CHECK_NEAR(dot(&o2[1], xv), lhs, 1e-12, 1e-12);
    CHECK(cnt[0] == 4);
    free_outs(g, o2);
    mpt_graph_free(g);
}

/* ---- compositions, state, randomness ------------------------------------------------ */

static void test_softmax(void) {
    mpt_graph *g = mpt_graph_new("softmax");
    mpt_shape s = mpt_shape_2(2, 3);
    int x = mpt_b_input(g, "logits", MPT_DT_F32, s);
    int m = mpt_b_broadcast(g, mpt_b_reduce(g, MPT_OP_REDUCE_MAX, x, 0x2), s, 0x1);
    int e = mpt_b_unary(g, MPT_OP_EXP, mpt_b_binary(g, MPT_OP_SUB, x, m));
    int z = mpt_b_broadcast(g, mpt_b_reduce(g, MPT_OP_REDUCE_SUM, e, 0x2), s, 0x1);
    mpt_graph_add_output(g, "p", mpt_b_binary(g, MPT_OP_DIV, e, z));
    mpt_tensor out[1];
    run_ok(g, (const double *const[]){(const double[]){1, 2, 3, 1000, 1000, 1000}}, NULL, out);
    const double want[] = {0.09003057317038046, 0.24472847105479767, 0.6652409557748219,
                           1.0 / 3, 1.0 / 3, 1.0 / 3};
    for (int i = 0; i < 6; i++) CHECK_NEAR(mpt_tensor_get(&out[0], i), want[i], 0, 3e-7);
    free_outs(g, out);
    mpt_graph_free(g);
}

static void test_updates(void) {
    mpt_graph *g = mpt_graph_new("state");
    int w = mpt_b_variable(g, "w", mpt_shape_1(2), MPT_INIT_CONST, 0, 0, 2.5, 1);
    int step = mpt_b_variable_dt(g, "step", MPT_DT_I32, mpt_shape_scalar(), MPT_INIT_ZEROS, 0);
    mpt_graph_add_output(g, "w_before", w);
    mpt_graph_add_output(g, "step", step);
    mpt_graph_add_update(g, w, mpt_b_binary(g, MPT_OP_MUL, w, w));
    mpt_graph_add_update(g, step, mpt_b_binary(g, MPT_OP_ADD, step, mpt_b_scalar(g, MPT_DT_I32, 1)));
    mpt_tensor vars[2], out[2];
    CHECK(mpt_graph_n_variables(g) == 2 && mpt_graph_variable_node(g, 1) == step);
    CHECK(mpt_graph_n_inputs(g) == 0 && mpt_graph_input_node(g, 0) == -1);
    CHECK(mpt_init_variables(g, vars, 7) == 0);
    CHECK(mpt_tensor_get(&vars[0], 1) == 2.5 && mpt_tensor_get(&vars[1], 0) == 0);
    run_ok(g, NULL, vars, out);
    CHECK(mpt_tensor_get(&out[0], 0) == 2.5 && mpt_tensor_get(&out[1], 0) == 0);
    free_outs(g, out);
    run_ok(g, NULL, vars, out);
    CHECK(mpt_tensor_get(&out[0], 0) == 6.25 && mpt_tensor_get(&out[1], 0) == 1);
    free_outs(g, out);
    CHECK(mpt_tensor_get(&vars[0], 0) == 39.0625 && mpt_tensor_get(&vars[0], 1) == 39.0625);
    CHECK(vars[1].dtype == MPT_DT_I32 && ((int32_t *)vars[1].data)[0] == 2);
    mpt_tensor_free(&vars[0]);
    mpt_tensor_free(&vars[1]);
    mpt_graph_free(g);
}

/* the documented random_uniform hash, written out independently */
static uint64_t sm64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static void test_random_uniform(void) {
    mpt_graph *g = mpt_graph_new("rng");
    int ctr = mpt_b_input(g, "counter", MPT_DT_I32, mpt_shape_scalar());
    mpt_graph_add_output(g, "a", mpt_b_random_uniform(g, ctr, mpt_shape_1(4096), 99));
    mpt_graph_add_output(g, "b", mpt_b_random_uniform(g, ctr, mpt_shape_1(4096), 100));
    int h = mpt_b_random_uniform(g, ctr, mpt_shape_1(4096), 99);
    g->nodes[h].dtype = MPT_DT_F16; /* the builder makes f32; any float dtype is allowed */
    mpt_graph_add_output(g, "h", h);
    mpt_tensor r1[3], r2[3], r3[3];
    run_ok(g, (const double *const[]){(const double[]){5}}, NULL, r1);
    run_ok(g, (const double *const[]){(const double[]){5}}, NULL, r2);
    run_ok(g, (const double *const[]){(const double[]){6}}, NULL, r3);
    CHECK(memcmp(r1[0].data, r2[0].data, mpt_tensor_bytes(&r1[0])) == 0);
    double sum = 0, lo = 1, hi = 0, hmax = 0;
    int same_ctr = 0, same_seed = 0, f16_grid = 1;
    for (int i = 0; i < 4096; i++) {
        double v = mpt_tensor_get(&r1[0], i), hv = mpt_tensor_get(&r1[2], i);
        sum += v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        hmax = hv > hmax ? hv : hmax;
        f16_grid &= ldexp(hv, 11) == floor(ldexp(hv, 11));
        same_ctr += v == mpt_tensor_get(&r3[0], i);
        same_seed += v == mpt_tensor_get(&r1[1], i);
    }
    CHECK(lo >= 0 && hi < 1 && hmax < 1 && f16_grid);
    CHECK_NEAR(sum / 4096, 0.5, 0.02, 0);
    CHECK(same_ctr < 10 && same_seed < 10);
    uint64_t bits = sm64(sm64(sm64(99) ^ 5u) ^ 3u);
    CHECK(mpt_tensor_get(&r1[0], 3) == (double)(bits >> 40) * 0x1p-24);
    CHECK(mpt_tensor_get(&r1[2], 3) == (double)(bits >> 53) * 0x1p-11);
    free_outs(g, r1);
    free_outs(g, r2);
    free_outs(g, r3);
    mpt_graph_free(g);
}

static void test_init_variables(void) {
    mpt_graph *g = mpt_graph_new("init");
    mpt_b_variable(g, "glorot", mpt_shape_2(100, 50), MPT_INIT_GLOROT_UNIFORM, 100, 50, 0, 1);
    mpt_b_variable(g, "he", mpt_shape_2(200, 100), MPT_INIT_HE_NORMAL, 200, 100, 0, 1);
    mpt_b_variable(g, "u", mpt_shape_1(1000), MPT_INIT_UNIFORM, 0, 0, 0.25, 1);
    mpt_b_variable_dt(g, "half", MPT_DT_BF16, mpt_shape_1(3), MPT_INIT_CONST, 0.1);
    mpt_b_variable_dt(g, "count", MPT_DT_I32, mpt_shape_1(3), MPT_INIT_ONES, 0);
    mpt_tensor a[5], b[5], c[5];
    CHECK(mpt_init_variables(g, a, 42) == 0);
    CHECK(mpt_init_variables(g, b, 42) == 0);
    CHECK(mpt_init_variables(g, c, 43) == 0);
    for (int k = 0; k < 5; k++)
        CHECK(memcmp(a[k].data, b[k].data, mpt_tensor_bytes(&a[k])) == 0);
    CHECK(memcmp(a[0].data, c[0].data, mpt_tensor_bytes(&a[0])) != 0);
    double lim = sqrt(6.0 / 150), mx = 0, s2 = 0, tmax = 0, umax = 0;
    for (int i = 0; i < 5000; i++) mx = fmax(mx, fabs(mpt_tensor_get(&a[0], i)));
    CHECK(mx <= lim && mx > 0.95 * lim);
    for (int i = 0; i < 20000; i++) {
        double v = mpt_tensor_get(&a[1], i);
        s2 += v * v;
        tmax = fmax(tmax, fabs(v));
    }
    double sd = sqrt(2.0 / 200);
    CHECK_NEAR(sqrt(s2 / 20000), sd, 0, 0.03);
    CHECK(tmax <= 2 * sd / 0.87962566103423978 + 1e-7); /* truncated at 2 stddev */
    for (int i = 0; i < 1000; i++) umax = fmax(umax, fabs(mpt_tensor_get(&a[2], i)));
    CHECK(umax <= 0.25 && umax > 0.24);
    CHECK(a[3].dtype == MPT_DT_BF16 && mpt_tensor_get(&a[3], 2) == mpt_round_to(MPT_DT_BF16, 0.1));
    CHECK(a[4].dtype == MPT_DT_I32 && ((int32_t *)a[4].data)[1] == 1);

    /* a variable's values depend on its name and the seed only */
    mpt_graph *g2 = mpt_graph_new("init2");
    mpt_b_variable(g2, "extra", mpt_shape_1(7), MPT_INIT_GLOROT_UNIFORM, 3, 4, 0, 1);
    mpt_b_variable(g2, "he", mpt_shape_2(200, 100), MPT_INIT_HE_NORMAL, 200, 100, 0, 1);
    mpt_tensor d[2];
    CHECK(mpt_init_variables(g2, d, 42) == 0);
    CHECK(memcmp(d[1].data, a[1].data, mpt_tensor_bytes(&a[1])) == 0);
    for (int k = 0; k < 5; k++) {
        mpt_tensor_free(&a[k]);
        mpt_tensor_free(&b[k]);
        mpt_tensor_free(&c[k]);
    }
    mpt_tensor_free(&d[0]);
    mpt_tensor_free(&d[1]);
    mpt_graph_free(g2);
    mpt_graph_free(g);

    /* an i32 variable cannot be glorot-initialised */
    g = mpt_graph_new("bad_init");
    mpt_b_variable_dt(g, "n", MPT_DT_I32, mpt_shape_1(2), MPT_INIT_GLOROT_UNIFORM, 0);
    CHECK(mpt_init_variables(g, a, 1) == -1);
    mpt_graph_free(g);
}

/* ---- user errors and the callback ---------------------------------------------------- */

static void expect_run_error(const mpt_graph *g, const mpt_tensor *in, const char *what) {
    char err[256] = "";
    mpt_tensor out[MAX_IO];
    int rc = mpt_interp_run(g, in, NULL, out, NULL, err, sizeof err);
    CHECK_MSG(rc == -1 && strstr(err, what), "rc %d, error \"%s\", expected \"...%s...\"", rc, err, what);
}

static void test_errors(void) {
    mpt_graph *g = mpt_graph_new("errs");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(2, 3));
    mpt_graph_add_output(g, "y", mpt_b_unary(g, MPT_OP_EXP, x));
    mpt_tensor t;
    mpt_tensor_alloc(&t, MPT_DT_F16, mpt_shape_2(2, 3));
    expect_run_error(g, &t, "input \"x\": fed f16[2,3] but the graph expects f32[2,3]");
    mpt_tensor_free(&t);
    mpt_tensor_alloc(&t, MPT_DT_F32, mpt_shape_2(3, 2));
    expect_run_error(g, &t, "fed f32[3,2] but the graph expects f32[2,3]");
    expect_run_error(g, NULL, "input \"x\" was not given a tensor");
    g->nodes[1].shape.dim[0] = 4; /* planted: the run refuses an unsound graph */
    expect_run_error(g, &t, "graph errs is not sound: %1 (exp)");
    mpt_tensor_free(&t);
    mpt_graph_free(g);
    CHECK(mpt_tensor_alloc(&t, MPT_DT_F32, mpt_shape_1(-1)) == -1 && t.data == NULL);
}

typedef struct {
    int calls, stop_at;
    uint16_t bits;
} watch;

static int on_node(void *ctx, const mpt_graph *g, int id, const mpt_tensor *v) {
    watch *w = ctx;
    w->calls++;
    if (v->dtype == MPT_DT_F16) w->bits = ((const uint16_t *)v->data)[0];
    return id == w->stop_at;
}

static void test_on_node(void) {
    mpt_graph *g = mpt_graph_new("watch");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_1(2));
    int h = mpt_b_cast(g, x, MPT_DT_F16);
    int y = mpt_b_binary(g, MPT_OP_MUL, h, h);
    mpt_b_unary(g, MPT_OP_EXP, x); /* unused: never computed */
    mpt_graph_add_output(g, "y", y);
    mpt_tensor in, out[1];
    mpt_tensor_alloc(&in, MPT_DT_F32, mpt_shape_1(2));
    mpt_tensor_set(&in, 0, 300);
    watch w = {0, -1, 0};
    mpt_interp_opts opts = {on_node, &w};
    char err[256];
    CHECK(mpt_interp_run(g, &in, NULL, out, &opts, err, sizeof err) == 0);
    CHECK(w.calls == 3 && w.bits == 0x7c00); /* 300^2 overflows f16: +inf bits */
    mpt_tensor_free(&out[0]);
    w = (watch){0, h, 0};
    CHECK(mpt_interp_run(g, &in, NULL, out, &opts, err, sizeof err) == -1);
    CHECK(w.calls == 2 && strstr(err, "stopped by on_node after %1 (cast)"));
    mpt_tensor_free(&in);
    mpt_graph_free(g);
}

int main(void) {
    test_matmul();
    test_batch_matmul();
    test_conv();
    test_pooling();
    test_softmax();
    test_updates();
    test_random_uniform();
    test_init_variables();
    test_errors();
    test_on_node();
    return check_exit("test_interp_compute");
}
