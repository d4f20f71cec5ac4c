/* tests/test_inputs.c — models of several inputs, and multi_head_attention's
 * attention_mask:
 *
 *   (a) lowering: the inputs are the graph's first INPUTs, "x" then
 *       "x/<name>", with the dtype their readers give them;
 *   (b) gradients through masked attention against central differences,
 *       in f64 on the interpreter (tests/test_layers.c's bound);
 *   (c) the CPU JIT against the interpreter, two train steps of a model of
 *       two and of three inputs, with padding masks that leave some rows
 *       fully masked (tests/cpu_check.h's tolerance table);
 *   (d) what a mask means: a masked key changes nothing, a fully masked
 *       row attends to nothing (its output is the output bias, as Keras 3's
 *       Softmax zeroes masked probabilities), a [T, S] mask of ones with
 *       the causal mask is the causal mask alone (AND); and a step with
 *       fully masked rows stays finite under mixed_float16;
 *   (e) data: synthetic feeds every input (its own shape, dtype and
 *       stream; masks as padding masks), text feeds a mask of ones, and a
 *       one-input source refuses a second input with a hint.
 */
#include <unistd.h>

#include "cpu_check.h"
#include "runtime/data/data.h"

#define BATCH 3
#define TRAIN "train {\n    optimizer = adam(learning_rate=0.001)\n}\n"

typedef struct {
    const char *name;
    const char *src;
} model_case;

static const model_case cases[] = {
    /* a padding mask [S], and a [T, S] mask with the causal one */
    {"features_masks",
     "model m {\n    input x: [5, 6]\n    input mask: [5]\n    input pairs: [5, 5]\n"
     "    dense e(units=8, activation=tanh)\n"
     "    multi_head_attention a(num_heads=2, key_dim=3, attention_mask=mask)\n"
     "    multi_head_attention c(num_heads=2, key_dim=3, use_causal_mask=true, attention_mask=pairs)\n"
     "    global_avg_pool1d g\n    dense out(units=3)\n    activation p(softmax, dtype=float32)\n}\n" TRAIN},
    /* token ids and features side by side; the mask read inside a block */
    {"tokens_side",
     "block enc(m) {\n    multi_head_attention att(num_heads=2, key_dim=4, attention_mask=m)\n"
     "    layer_norm ln\n}\n"
     "model m {\n    input tokens: [4]\n    input side: [3]\n    input pad: [4]\n"
     "    embedding emb(input_dim=10, output_dim=8)\n    enc e(pad)\n    global_max_pool1d g\n"
     "    dense s(units=5, activation=relu) from side\n    concatenate j from g, s\n"
     "    dense out(units=3)\n    activation p(softmax, dtype=float32)\n}\n" TRAIN},
};
#define N_CASES ((int)(sizeof cases / sizeof *cases))

static mpt_model *load_src(const char *name, const char *src, int training) {
    mpt_lower_opts lo = {.batch_size = BATCH, .training = training};
    mpt_model *m = NULL;
    int bad = mpt_lang_load_string(name, src, &lo, &m, stderr);
    CHECK_MSG(bad == 0 && m, "%s does not load", name);
    return bad ? NULL : m;
}

/* A padding mask for every INPUT whose name ends in "mask", "pad" or
 * "pairs": sample 0 fully masked, the others a prefix of ones (pairs: the
 * same prefix on every row); token ids in [0, 10); labels in [0, 3). */
static void plant_masks(const mpt_graph *g, mpt_tensor *in) {
    for (int k = 0; k < mpt_graph_n_inputs(g); k++) {
        const mpt_node *nd = &g->nodes[mpt_graph_input_node(g, k)];
        const char *nm = nd->name;
        int64_t n = mpt_shape_numel(nd->shape), b = nd->shape.dim[0], per = n / b;
        int64_t steps = nd->shape.dim[nd->shape.rank - 1];
        if (strstr(nm, "mask") || strstr(nm, "pad") || strstr(nm, "pairs")) {
            for (int64_t i = 0; i < n; i++) {
                int64_t r = i / per, len = r == 0 ? 0 : 1 + (r * 2) % steps;
                mpt_tensor_set(&in[k], i, i % steps < len ? 1.0 : 0.0);
            }
        } else if (strcmp(nm, "y") == 0 && nd->dtype == MPT_DT_I32) {
            for (int64_t i = 0; i < n; i++) mpt_tensor_set(&in[k], i, (double)(i % 3));
        }
    }
}

/* ---- (a) lowering ---- */

static void test_lowering(void) {
    mpt_model *m = load_src(cases[1].name, cases[1].src, 1);
    if (!m) return;
    CHECK(m->n_inputs == 3);
    static const char *const names[] = {"x", "x/side", "x/pad"};
    static const mpt_dtype dts[] = {MPT_DT_I32, MPT_DT_F32, MPT_DT_F32};
    for (int k = 0; k < 3 && k < m->n_inputs; k++) {
        const mpt_node *nd = &m->graph->nodes[mpt_graph_input_node(m->graph, k)];
        CHECK_MSG(strcmp(nd->name, names[k]) == 0 && strcmp(m->inputs[k].graph_name, names[k]) == 0,
                  "input %d is '%s', want '%s'", k, nd->name, names[k]);
        CHECK(nd->dtype == dts[k] && m->inputs[k].dtype == dts[k]);
        CHECK(nd->shape.dim[0] == BATCH && nd->shape.rank == m->inputs[k].shape.rank + 1);
    }
    CHECK(m->inputs[0].vocab == 10 && !m->inputs[0].mask_only);
    CHECK(!m->inputs[1].mask_only && m->inputs[2].mask_only);
    CHECK(mpt_shape_eq(m->input_shape, m->inputs[0].shape) && m->input_dtype == MPT_DT_I32);
    mpt_model_free(m);
}

/* ---- (b) gradients through the masks, in f64 ---- */

static mpt_graph *as_f64(const mpt_graph *src) {
    mpt_graph *g = mpt_graph_new(src->name);
    int *map = calloc((size_t)src->n_nodes + 1, sizeof *map);
    for (int i = 0; i < src->n_nodes; i++) {
        map[i] = mpt_graph_copy_node(g, src, i, map);
        if (g->nodes[map[i]].dtype == MPT_DT_F32) g->nodes[map[i]].dtype = MPT_DT_F64;
    }
    for (int k = 0; k < src->n_outputs; k++)
        mpt_graph_add_output(g, src->outputs[k].name, map[src->outputs[k].node]);
    free(map);
    return g;
}

static double first_output(const mpt_graph *g, const mpt_tensor *in, mpt_tensor *vars) {
    mpt_tensor out[64];
    char err[256];
    double y = NAN;
    if (mpt_interp_run(g, in, vars, out, NULL, err, sizeof err) != 0) {
        CHECK_MSG(0, "interpreter: %s", err);
        return y;
    }
    y = mpt_tensor_get(&out[0], 0);
    for (int k = 0; k < g->n_outputs; k++) mpt_tensor_free(&out[k]);
    return y;
}

static void check_gradients(const model_case *c) {
    mpt_model *m = load_src(c->name, c->src, 1);
    if (!m) return;
    mpt_graph *g = as_f64(m->graph);
    int out = g->outputs[mpt_graph_find_output(g, "output")].node;
    mpt_shape os = g->nodes[out].shape;
    int w = mpt_b_input(g, "fd_weights", MPT_DT_F64, os);
    int y = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_binary(g, MPT_OP_MUL, out, w),
                         (1LL << os.rank) - 1);
    int n_vars = mpt_graph_n_variables(g);
    int *wrt = calloc((size_t)n_vars + 1, sizeof *wrt), *grads = calloc((size_t)n_vars + 1, sizeof *grads);
    for (int k = 0; k < n_vars; k++) wrt[k] = mpt_graph_variable_node(g, k);
    char err[512];
    int rc = mpt_autodiff(g, y, -1, wrt, n_vars, grads, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: autodiff: %s", c->name, err);
    mpt_graph *h = mpt_graph_new(c->name);
    int *map = calloc((size_t)g->n_nodes + 1, sizeof *map);
    for (int i = 0; i < g->n_nodes; i++) map[i] = mpt_graph_copy_node(h, g, i, map);
    mpt_graph_add_output(h, "y", map[y]);
    for (int k = 0; k < n_vars; k++)
        if (grads[k] >= 0) mpt_graph_add_output(h, h->nodes[map[wrt[k]]].name, map[grads[k]]);
    free(map);
    int ni = mpt_graph_n_inputs(h);
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in), *vars = calloc((size_t)n_vars + 1, sizeof *vars);
    mpt_init_variables(h, vars, 7);
    for (int k = 0; k < ni; k++) {
        const mpt_node *nd = &h->nodes[mpt_graph_input_node(h, k)];
        mpt_tensor_alloc(&in[k], nd->dtype, nd->shape);
        for (int64_t i = 0; i < mpt_shape_numel(nd->shape); i++)
            mpt_tensor_set(&in[k], i, strcmp(nd->name, "fd_weights") == 0 ? 0.5 + urand()
                                      : nd->dtype == MPT_DT_I32             ? floor(urand() * 10)
                                                                            : 2 * urand() - 1);
    }
    plant_masks(h, in);
    for (int k = 0; k < n_vars; k++) /* off the kinks of relu and max */
        for (int64_t i = 0; i < mpt_shape_numel(vars[k].shape); i++)
            mpt_tensor_set(&vars[k], i, mpt_tensor_get(&vars[k], i) + 0.2 * (urand() - 0.5));
    mpt_tensor outs[64];
    if (rc == 0 && h->n_outputs <= 64 && mpt_interp_run(h, in, vars, outs, NULL, err, sizeof err) == 0) {
        int before = check_failures, o = 1, checked = 0;
        for (int k = 0; k < n_vars; k++) {
            if (grads[k] < 0) continue;
            const mpt_tensor *ad = &outs[o++];
            int64_t n = mpt_shape_numel(vars[k].shape), stride = n > 24 ? n / 24 : 1;
            for (int64_t i = 0; i < n; i += stride) {
                double x0 = mpt_tensor_get(&vars[k], i), step = 1e-6 * (fabs(x0) > 1 ? fabs(x0) : 1);
                mpt_tensor_set(&vars[k], i, x0 + step);
                double yp = first_output(h, in, vars);
                mpt_tensor_set(&vars[k], i, x0 - step);
                double ym = first_output(h, in, vars);
                mpt_tensor_set(&vars[k], i, x0);
                double fd = (yp - ym) / (2 * step), got = mpt_tensor_get(ad, i);
                CHECK_MSG(fabs(fd - got) <= 1e-6 + 1e-5 * fabs(fd),
                          "%s: d y / d %s[%lld]: autodiff %.12g, finite difference %.12g", c->name,
                          h->nodes[mpt_graph_variable_node(h, k)].name, (long long)i, got, fd);
                checked++;
                if (check_failures - before > 8) break;
            }
        }
        CHECK(checked > 50);
        for (int k = 0; k < h->n_outputs; k++) mpt_tensor_free(&outs[k]);
    } else {
        CHECK_MSG(0, "%s: the interpreter failed on the gradient graph: %s", c->name, err);
    }
    for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    for (int k = 0; k < n_vars; k++) mpt_tensor_free(&vars[k]);
    free(in);
    free(vars);
    free(wrt);
    free(grads);
    mpt_graph_free(h);
    mpt_graph_free(g);
    mpt_model_free(m);
}

/* ---- (c) the CPU JIT against the interpreter ---- */

static mpt_graph *train_step(const mpt_model *m, const char *policy, const char *what) {
    char err[512];
    mpt_policy_opts po = {0};
    mpt_policy_lookup(policy, &po.global);
    mpt_graph *typed = mpt_policy_apply(m->graph, &po, err, sizeof err);
    CHECK_MSG(typed != NULL, "%s: policy: %s", what, err);
    mpt_train_opts to = {.loss = m->train.loss, .opt = m->train.optimizer,
                         .loss_scale = m->train.loss_scale, .metrics = {.accuracy = 1}};
    to.loss_scale.mode = strcmp(policy, "mixed_float16") ? MPT_LS_NONE : MPT_LS_DYNAMIC;
    mpt_graph *step = typed ? mpt_train_step(typed, &to, err, sizeof err) : NULL;
    CHECK_MSG(step != NULL, "%s: train step: %s", what, err);
    mpt_graph_free(typed);
    return step;
}

static void check_backend(const model_case *c, const char *policy) {
    mpt_model *m = load_src(c->name, c->src, 1);
    if (!m) return;
    char what[160];
    snprintf(what, sizeof what, "%s %s", c->name, policy);
    mpt_graph *step = train_step(m, policy, what);
    if (step) {
        mpt_dtype dt = strcmp(policy, "float32") == 0 ? MPT_DT_F32
                       : strcmp(policy, "mixed_float16") == 0 ? MPT_DT_F16 : MPT_DT_BF16;
        tol t = tol_for(TOL_ACCUM, dt, 1);
        t.atol += 1.2e-3 * 2; /* Adam: a step of lr where a gradient is 0 on one side (test_layers) */
        plant = plant_masks;
        run_both(step, 2, t, 0, what, FUSED);
        plant = NULL;
    }
    mpt_graph_free(step);
    mpt_model_free(m);
}

/* ---- (d) what a mask means ---- */

static int forward(const mpt_graph *g, mpt_tensor *in, mpt_tensor *out) {
    int nv = mpt_graph_n_variables(g);
    mpt_tensor *vars = calloc((size_t)nv + 1, sizeof *vars);
    mpt_init_variables(g, vars, 11);
    for (int k = 0; k < nv; k++) /* biases off zero, so "the bias alone" is visible */
        if (strstr(g->nodes[mpt_graph_variable_node(g, k)].name, "bias"))
            for (int64_t i = 0; i < mpt_shape_numel(vars[k].shape); i++) mpt_tensor_set(&vars[k], i, 0.1 * (double)(i + 1));
    char err[256];
    int rc = mpt_interp_run(g, in, vars, out, NULL, err, sizeof err);
    CHECK_MSG(rc == 0, "forward: %s", err);
    for (int k = 0; k < nv; k++) mpt_tensor_free(&vars[k]);
    free(vars);
    return rc;
}

static void test_mask_meaning(void) {
    static const char *src =
        "model m {\n    input x: [4, 6]\n    input mask: [4]\n"
        "    multi_head_attention a(num_heads=2, key_dim=4, attention_mask=mask)\n}\n";
    mpt_model *m = load_src("meaning", src, 0);
    if (!m) return;
    mpt_tensor in[2], o1[1], o2[1];
    mpt_tensor_alloc(&in[0], MPT_DT_F32, mpt_shape_make(3, (int64_t[]){BATCH, 4, 6}));
    mpt_tensor_alloc(&in[1], MPT_DT_F32, mpt_shape_2(BATCH, 4));
    for (int64_t i = 0; i < BATCH * 24; i++) mpt_tensor_set(&in[0], i, 2 * urand() - 1);
    /* sample 0: keys 0, 1; sample 1: none; sample 2: keys 0, 2, 3 (2 is "any nonzero") */
    static const double mask[BATCH * 4] = {1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 2, 1};
    for (int i = 0; i < BATCH * 4; i++) mpt_tensor_set(&in[1], i, mask[i]);
    if (forward(m->graph, in, o1) == 0) {
        /* a masked key's step changed: every other step's output stays */
        for (int64_t j = 0; j < 6; j++) mpt_tensor_set(&in[0], 3 * 6 + j, 5.0 + (double)j);
        for (int64_t j = 0; j < 6; j++) mpt_tensor_set(&in[0], (2 * 4 + 1) * 6 + j, -4.0);
        if (forward(m->graph, in, o2) == 0) {
            int same = 1, finite = 1, bias_only = 1;
            for (int64_t i = 0; i < BATCH * 24; i++) {
                int64_t b = i / 24, t = (i / 6) % 4;
                if (!((b == 0 && t == 3) || (b == 2 && t == 1)))
                    same &= mpt_tensor_get(&o1[0], i) == mpt_tensor_get(&o2[0], i);
                finite &= isfinite(mpt_tensor_get(&o1[0], i));
                /* sample 1 attends to nothing: the output bias, 0.1 (j + 1) */
                if (b == 1) bias_only &= fabs(mpt_tensor_get(&o1[0], i) - 0.1 * (double)(i % 6 + 1)) < 1e-6;
            }
            CHECK_MSG(same, "a masked key's value changes the output of other steps");
            CHECK_MSG(finite, "masked attention gives a non-finite output");
            CHECK_MSG(bias_only, "a fully masked row is not the output bias alone (Keras 3: zero weights)");
            mpt_tensor_free(&o2[0]);
        }
        mpt_tensor_free(&o1[0]);
    }
    mpt_tensor_free(&in[0]);
    mpt_tensor_free(&in[1]);
    mpt_model_free(m);

    /* a [T, S] mask of ones AND the causal mask is the causal mask alone */
    static const char *with_mask =
        "model m {\n    input x: [4, 6]\n    input mask: [4, 4]\n"
        "    multi_head_attention a(num_heads=2, key_dim=4, use_causal_mask=true, attention_mask=mask)\n}\n";
    static const char *causal =
        "model m {\n    input x: [4, 6]\n"
        "    multi_head_attention a(num_heads=2, key_dim=4, use_causal_mask=true)\n}\n";
    mpt_model *a = load_src("and", with_mask, 0), *b = load_src("causal", causal, 0);
    if (a && b) {
        mpt_tensor_alloc(&in[0], MPT_DT_F32, mpt_shape_make(3, (int64_t[]){BATCH, 4, 6}));
        mpt_tensor_alloc(&in[1], MPT_DT_F32, mpt_shape_make(3, (int64_t[]){BATCH, 4, 4}));
        for (int64_t i = 0; i < BATCH * 24; i++) mpt_tensor_set(&in[0], i, 2 * urand() - 1);
        for (int64_t i = 0; i < BATCH * 16; i++) mpt_tensor_set(&in[1], i, 1.0);
        if (forward(a->graph, in, o1) == 0 && forward(b->graph, in, o2) == 0) {
            int same = 1;
            for (int64_t i = 0; i < BATCH * 24; i++)
                same &= fabs(mpt_tensor_get(&o1[0], i) - mpt_tensor_get(&o2[0], i)) < 1e-6;
            CHECK_MSG(same, "a mask of ones with use_causal_mask differs from the causal mask alone");
            mpt_tensor_free(&o1[0]);
            mpt_tensor_free(&o2[0]);
        }
        mpt_tensor_free(&in[0]);
        mpt_tensor_free(&in[1]);
    }
    mpt_model_free(a);
    mpt_model_free(b);
}

/* Every row of sample 0 fully masked, under mixed_float16 with dynamic
 * loss scaling: the -1e9 is an f32 constant on f32 scores, so the step is
 * finite and applied (with float16 scores it would be -inf and NaN). */
static void test_masked_mixed_float16(void) {
    mpt_model *m = load_src(cases[0].name, cases[0].src, 1);
    if (!m) return;
    mpt_graph *step = train_step(m, "mixed_float16", "fully masked rows");
    if (step) {
        int ni = mpt_graph_n_inputs(step), nv = mpt_graph_n_variables(step);
        mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in), *vars = calloc((size_t)nv + 1, sizeof *vars);
        mpt_tensor out[32];
        char err[256];
        mpt_init_variables(step, vars, 3);
        fill_inputs(step, in, 0);
        plant_masks(step, in);
        int rc = step->n_outputs <= 32 ? mpt_interp_run(step, in, vars, out, NULL, err, sizeof err) : -1;
        CHECK_MSG(rc == 0, "fully masked rows: %s", err);
        if (rc == 0) {
            CHECK_MSG(mpt_tensor_get(&out[mpt_graph_find_output(step, "finite")], 0) == 1 &&
                          isfinite(mpt_tensor_get(&out[mpt_graph_find_output(step, "loss")], 0)),
                      "a mixed_float16 step with fully masked rows is not finite");
            for (int k = 0; k < step->n_outputs; k++) mpt_tensor_free(&out[k]);
        }
        for (int k = 0; k < nv; k++) {
            double s = 0;
            for (int64_t i = 0; i < mpt_shape_numel(vars[k].shape); i++) s += mpt_tensor_get(&vars[k], i);
            CHECK_MSG(isfinite(s), "variable %s is not finite after the step",
                      step->nodes[mpt_graph_variable_node(step, k)].name);
            mpt_tensor_free(&vars[k]);
        }
        for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
        free(in);
        free(vars);
    }
    mpt_graph_free(step);
    mpt_model_free(m);
}

/* ---- (e) data ---- */

static void test_data(void) {
    char err[1024];
    mpt_data_input ins[3] = {
        {.name = "x", .shape = mpt_shape_2(4, 6), .dtype = MPT_DT_F32},
        {.name = "mask", .shape = mpt_shape_2(5, 4), .dtype = MPT_DT_F32, .mask_only = 1},
        {.name = "ids", .shape = mpt_shape_1(3), .dtype = MPT_DT_I32, .vocab = 7},
    };
    const char *spec = "synthetic(classes=3, samples=40, seed=5)";
    mpt_dataset *d = NULL, *one = NULL, *again = NULL;
    CHECK(mpt_data_open_inputs(spec, MPT_DATA_TRAIN, ins, 3, &d, err, sizeof err) == 0);
    CHECK(mpt_data_open(spec, MPT_DATA_TRAIN, ins[0].shape, &one, err, sizeof err) == 0);
    CHECK(mpt_data_open_inputs(spec, MPT_DATA_TRAIN, ins, 3, &again, err, sizeof err) == 0);
    if (d && one && again) {
        CHECK(mpt_data_n_inputs(d) == 3 && mpt_data_n_inputs(one) == 1);
        mpt_tensor x[3], x2[3], x1, y, y1;
        mpt_tensor_alloc(&x[0], MPT_DT_F32, mpt_shape_make(3, (int64_t[]){8, 4, 6}));
        mpt_tensor_alloc(&x[1], MPT_DT_F32, mpt_shape_make(3, (int64_t[]){8, 5, 4}));
        mpt_tensor_alloc(&x[2], MPT_DT_I32, mpt_shape_2(8, 3));
        for (int k = 0; k < 3; k++) mpt_tensor_alloc(&x2[k], x[k].dtype, x[k].shape);
        mpt_tensor_alloc(&x1, MPT_DT_F32, x[0].shape);
        mpt_tensor_alloc(&y, MPT_DT_I32, mpt_shape_1(8));
        mpt_tensor_alloc(&y1, MPT_DT_I32, mpt_shape_1(8));
        mpt_data_shuffle(d, 9, 1);
        mpt_data_shuffle(one, 9, 1);
        mpt_data_shuffle(again, 9, 1);
        CHECK(mpt_data_batch(d, 1, 8, x, &y, NULL, err, sizeof err) == 0);
        CHECK(mpt_data_batch(one, 1, 8, &x1, &y1, NULL, err, sizeof err) == 0);
        CHECK(mpt_data_batch(again, 1, 8, x2, NULL, NULL, err, sizeof err) == 0);
        /* the first input is what a one-input model gets; the rest repeat */
        CHECK(memcmp(x[0].data, x1.data, 8 * 24 * 4) == 0 && memcmp(y.data, y1.data, 8 * 4) == 0);
        for (int k = 1; k < 3; k++)
            CHECK(memcmp(x[k].data, x2[k].data, (size_t)mpt_shape_numel(x[k].shape) * 4) == 0);
        int padding = 1, ids_ok = 1, lengths = 0;
        for (int r = 0; r < 8; r++) {
            int len = 0;
            for (int j = 0; j < 4; j++) len += mpt_tensor_get(&x[1], r * 20 + j) == 1.0;
            for (int t = 0; t < 5; t++) /* every row of the [5, 4] mask: the same prefix */
                for (int j = 0; j < 4; j++)
                    padding &= mpt_tensor_get(&x[1], r * 20 + t * 4 + j) == (j < len ? 1.0 : 0.0);
            padding &= len >= 1;
            lengths |= 1 << len;
            for (int j = 0; j < 3; j++) {
                double v = mpt_tensor_get(&x[2], r * 3 + j);
                ids_ok &= v >= 0 && v < 7;
            }
        }
        CHECK_MSG(padding, "synthetic masks are prefixes of ones, at least one");
        CHECK_MSG(lengths != (1 << 4) && lengths != 0, "synthetic masks have several lengths");
        CHECK_MSG(ids_ok, "synthetic ids below the input's vocab");
        /* a tensor of the wrong shape for input 2 is an internal error */
        mpt_tensor bad[3] = {x[0], x[1], x1};
        CHECK(mpt_data_batch(d, 0, 8, bad, NULL, NULL, err, sizeof err) == -1 &&
              strstr(err, "input tensor 2"));
        for (int k = 0; k < 3; k++) {
            mpt_tensor_free(&x[k]);
            mpt_tensor_free(&x2[k]);
        }
        mpt_tensor_free(&x1);
        mpt_tensor_free(&y);
        mpt_tensor_free(&y1);
    }
    mpt_data_free(d);
    mpt_data_free(one);
    mpt_data_free(again);

    /* text: its mask is ones; another further input is refused */
    char path[] = "/tmp/mptc_test_inputs_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    for (int i = 0; i < 200; i++) CHECK(write(fd, "the quick brown fox ", 20) == 20);
    close(fd);
    char text[256];
    snprintf(text, sizeof text, "text(\"%s\", seq_len=8)", path);
    mpt_data_input tx[2] = {{.name = "tokens", .shape = mpt_shape_1(8), .dtype = MPT_DT_I32},
                            {.name = "pad", .shape = mpt_shape_1(8), .dtype = MPT_DT_F32, .mask_only = 1}};
    mpt_dataset *t = NULL;
    CHECK(mpt_data_open_inputs(text, MPT_DATA_TRAIN, tx, 2, &t, err, sizeof err) == 0);
    if (t) {
        mpt_tensor x[2], y;
        mpt_tensor_alloc(&x[0], MPT_DT_I32, mpt_shape_2(4, 8));
        mpt_tensor_alloc(&x[1], MPT_DT_F32, mpt_shape_2(4, 8));
        mpt_tensor_alloc(&y, MPT_DT_I32, mpt_shape_2(4, 8));
        CHECK(mpt_data_batch(t, 0, 4, x, &y, NULL, err, sizeof err) == 0);
        int ones = 1;
        for (int i = 0; i < 32; i++) ones &= mpt_tensor_get(&x[1], i) == 1.0;
        CHECK_MSG(ones, "text's padding mask is all ones");
        mpt_tensor_free(&x[0]);
        mpt_tensor_free(&x[1]);
        mpt_tensor_free(&y);
        mpt_data_free(t);
    }
    tx[1].mask_only = 0;
    CHECK(mpt_data_open_inputs(text, MPT_DATA_TRAIN, tx, 2, &t, err, sizeof err) == -1 &&
          strstr(err, "model's input 'pad' is neither") && strstr(err, "hint:"));
    unlink(path);
    /* a source of one input a sample, where this machine has it */
    if (access(MPT_DATA_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) == 0) {
        mpt_data_input fm[2] = {{.name = "x", .shape = mpt_shape_1(784)},
                                {.name = "aux", .shape = mpt_shape_1(3)}};
        CHECK(mpt_data_open_inputs("fashion_mnist", MPT_DATA_TRAIN, fm, 2, &t, err, sizeof err) == -1 &&
              strstr(err, "has one input a sample") && strstr(err, "'aux'") && strstr(err, "hint:"));
    }
}

int main(void) {
    char why[256];
    int cpu = mpt_backend_cpu.available(why, sizeof why);
    if (!cpu) printf("note: no CPU JIT here (%s): the backend comparisons are skipped\n", why);
    static const char *const policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
    test_lowering();
    for (int i = 0; i < N_CASES; i++) {
        TIMED(check_gradients(&cases[i]));
        for (int p = 0; cpu && p < 3; p++)
            if (p == 0 || p == 1 + i % 2) TIMED(check_backend(&cases[i], policies[p]));
    }
    test_mask_meaning();
    test_masked_mixed_float16();
    test_data();
    return check_exit("test_inputs");
}
