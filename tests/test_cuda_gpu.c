/* tests/test_cuda_gpu.c — the CUDA backend against the reference
 * interpreter, on a GPU. Skips (77) with the reason where there is none.
 *
 * Small graphs covering every kernel kind (a fused f16/bf16/f32 dense layer
 * with bias and relu, an f16 convolution with relu, softmax, an argmax, a
 * pool, an optimizer-style loop) are fused, fused and unfused, run once on
 * CUDA and once on the interpreter, and compared element by element.
 */
#include <stdlib.h>
#include <string.h>

#include "fusion/fusion.h"
#include "runtime/cuda/cuda.h"
#include "tests/check.h"

/* |got - ref| <= atol + rtol |ref|, per output dtype */
static void tolerance(mpt_dtype dt, double *atol, double *rtol) {
    switch (dt) {
    /* f32: accumulation order differs from the interpreter's f64 sums, and
     * NVRTC's default -fmad=true contracts a * b + c into one FMA, rounded
     * once where the interpreter rounds the product and the sum (a relative
     * difference of an f32 ulp or two a chain) */
    case MPT_DT_F32: *atol = 1e-5; *rtol = 1e-4; return;
    /* f16: values are rounded per op on both sides, but f32 intermediates
     * can round differently from f64 ones by one f16 ulp (2^-11) per op */
    case MPT_DT_F16: *atol = 2e-3; *rtol = 1e-2; return;
    /* bf16: the same argument with an ulp of 2^-8 */
    case MPT_DT_BF16: *atol = 1e-2; *rtol = 3e-2; return;
    /* integers and bools must match exactly */
    case MPT_DT_I32: case MPT_DT_BOOL: *atol = 0; *rtol = 0; return;
    case MPT_DT_F64: case MPT_DT_COUNT: break;
    }
    *atol = *rtol = 0;
}

static void fill(mpt_tensor *t, uint64_t seed) {
    for (int64_t i = 0; i < mpt_shape_numel(t->shape); i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        double u = (double)(seed >> 11) / 9007199254740992.0;
        mpt_tensor_set(t, i, t->dtype == MPT_DT_I32 ? (double)(int)(u * 10) : 2 * u - 1);
    }
}

/* cuda's tensor against the interpreter's, within the dtype tolerance;
 * at most three mismatches reported */
static void same(const char *model, const char *how, const char *what, const mpt_tensor *cuda,
                 const mpt_tensor *ref) {
    double atol, rtol;
    tolerance(ref->dtype, &atol, &rtol);
    int bad = 0;
    for (int64_t i = 0; i < mpt_shape_numel(ref->shape) && bad < 3; i++) {
        double a = mpt_tensor_get(cuda, i), b = mpt_tensor_get(ref, i);
        if (fabs(a - b) > atol + rtol * fabs(b)) {
            bad++;
            CHECK_MSG(0, "%s (%s) %s[%lld]: cuda %.9g, interp %.9g", model, how, what, (long long)i, a, b);
        }
    }
}

static void compare(mpt_graph *g, int fused) {
    mpt_fusion_opts o;
    mpt_fusion_opts_default(&o);
    o.enabled = fused;
    mpt_plan *p = mpt_fuse(g, &o);
    CHECK(p != NULL);
    if (!p) return;
    char err[4096];
    int ni = mpt_graph_n_inputs(g), nv = mpt_graph_n_variables(g);
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in);
    mpt_tensor *v1 = calloc((size_t)nv + 1, sizeof *v1), *v2 = calloc((size_t)nv + 1, sizeof *v2);
    mpt_tensor *o1 = calloc((size_t)g->n_outputs, sizeof *o1);
    mpt_tensor *o2 = calloc((size_t)g->n_outputs, sizeof *o2);
    for (int k = 0; k < ni; k++) {
        const mpt_node *nd = &g->nodes[mpt_graph_input_node(g, k)];
        mpt_tensor_alloc(&in[k], nd->dtype, nd->shape);
        fill(&in[k], 7 + (uint64_t)k);
    }
    mpt_init_variables(g, v1, 1);
    mpt_init_variables(g, v2, 1);
    mpt_exec *x = mpt_backend_cuda.compile(p, err, sizeof err);
    CHECK_MSG(x != NULL, "%s: %s", g->name, err);
    if (x) {
        /* two steps: the second reads the variables the first left on the
         * device (updated in place or copied over), then they are pulled */
        int rc = mpt_backend_cuda.run(x, in, v1, o1, err, sizeof err);
        CHECK_MSG(rc == 0, "%s: %s", g->name, err);
        CHECK(mpt_interp_run(g, in, v2, o2, NULL, err, sizeof err) == 0);
        for (int k = 0; rc == 0 && k < g->n_outputs; k++) {
            mpt_tensor_free(&o1[k]);
            mpt_tensor_free(&o2[k]);
        }
        if (rc == 0) {
            rc = mpt_backend_cuda.run(x, in, v1, o1, err, sizeof err);
            CHECK_MSG(rc == 0, "%s step 2: %s", g->name, err);
            CHECK(mpt_interp_run(g, in, v2, o2, NULL, err, sizeof err) == 0);
        }
        if (rc == 0) CHECK_MSG(mpt_backend_cuda.pull_vars(x, v1, err, sizeof err) >= 0, "%s", err);
        const char *how = fused ? "fused" : "unfused";
        for (int k = 0; rc == 0 && k < nv; k++) {
            char what[96];
            snprintf(what, sizeof what, "variable %d after 2 steps", k);
            same(g->name, how, what, &v1[k], &v2[k]);
        }
        for (int k = 0; rc == 0 && k < g->n_outputs; k++) {
            same(g->name, how, g->outputs[k].name, &o1[k], &o2[k]);
            mpt_tensor_free(&o1[k]);
            mpt_tensor_free(&o2[k]);
        }
        mpt_backend_cuda.free(x);
    }
    for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    for (int k = 0; k < nv; k++) { mpt_tensor_free(&v1[k]); mpt_tensor_free(&v2[k]); }
    free(in); free(v1); free(v2); free(o1); free(o2);
    mpt_plan_free(p);
}

static mpt_graph *dense(mpt_dtype dt) {
    mpt_graph *g = mpt_graph_new(mpt_dtype_name(dt));
    int x = mpt_b_input(g, "x", dt, mpt_shape_2(70, 96));
    int w = mpt_b_variable(g, "w", mpt_shape_2(96, 130), MPT_INIT_GLOROT_UNIFORM, 96, 130, 0, 1);
    int b = mpt_b_variable(g, "b", mpt_shape_1(130), MPT_INIT_UNIFORM, 0, 0, 0.5, 1);
    int wc = mpt_b_cast(g, w, dt), bc = mpt_b_cast(g, b, dt);
    int y = mpt_b_matmul(g, x, wc, 0, 0);
    y = mpt_b_binary(g, MPT_OP_ADD, y, mpt_b_broadcast(g, bc, mpt_shape_2(70, 130), 2));
    y = mpt_b_unary(g, MPT_OP_RELU, y);
    int yf = mpt_b_cast(g, y, MPT_DT_F32);
    int mx = mpt_b_reduce(g, MPT_OP_REDUCE_MAX, yf, 2);
    int e = mpt_b_unary(g, MPT_OP_EXP, mpt_b_binary(g, MPT_OP_SUB, yf,
                                                    mpt_b_broadcast(g, mx, mpt_shape_2(70, 130), 1)));
    int s = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, e, 2);
    int sm = mpt_b_binary(g, MPT_OP_DIV, e, mpt_b_broadcast(g, s, mpt_shape_2(70, 130), 1));
    mpt_graph_add_output(g, "relu", yf);
    mpt_graph_add_output(g, "softmax", sm);
    mpt_graph_add_output(g, "argmax", mpt_b_argmax(g, yf, 1));
    int upd = mpt_b_binary(g, MPT_OP_SUB, b, mpt_b_broadcast_to(g, mpt_b_scalar(g, MPT_DT_F32, 0.01), mpt_shape_1(130)));
    mpt_graph_add_update(g, b, upd);
    return g;
}

static mpt_graph *conv(void) {
    mpt_graph *g = mpt_graph_new("conv");
    int x = mpt_b_input(g, "x", MPT_DT_F16, mpt_shape_4(2, 9, 9, 8));
    int w = mpt_b_input(g, "w", MPT_DT_F16, mpt_shape_4(3, 3, 8, 16));
    int y = mpt_b_conv2d(g, x, w, 2, 2, 1, 1, mpt_shape_4(2, 5, 5, 16));
    y = mpt_b_unary(g, MPT_OP_RELU, y);
    int p = mpt_b_pool(g, MPT_OP_MAX_POOL, y, 2, 2, 2, 2, 0, 0, mpt_shape_4(2, 2, 2, 16));
    mpt_graph_add_output(g, "conv", y);
    mpt_graph_add_output(g, "pool", p);
    return g;
}

int main(void) {
    char why[512] = "";
    if (!mpt_backend_cuda.available(why, sizeof why)) {
        printf("skip: no CUDA GPU (%s)\n", why);
        return 77;
    }
    mpt_graph *gs[] = {dense(MPT_DT_F32), dense(MPT_DT_F16), dense(MPT_DT_BF16), conv()};
    for (size_t i = 0; i < sizeof gs / sizeof *gs; i++) {
        compare(gs[i], 1);
        compare(gs[i], 0);
        mpt_graph_free(gs[i]);
    }
    return check_exit("test_cuda_gpu");
}
