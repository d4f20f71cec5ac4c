/* tests/test_attention_fused.c — fused attention (ir/attention.c,
 * ir/interp_attn.c, codegen/cpu/attention.c):
 *
 *   (a) the rewrite: causal, padding and [T, S] masks, cross attention,
 *       dropout become one attention op each; a backend without the
 *       kernel keeps them unfused with its reason;
 *   (b) the ops' definition against the unfused graph on the
 *       interpreter, in f64: forward values and every weight's gradient
 *       (autodiff's attention_grad against autodiff through the primitive
 *       ops), and gradients against central differences;
 *   (c) the plan: one attention kernel forward and one attention_grad
 *       kernel backward per layer, no batch_matmul, and an activation
 *       peak that grows linearly with the context where the unfused
 *       one grows quadratically;
 *   (d) the CPU kernels against the interpreter: two train steps of
 *       rewritten models under float32, mixed_bfloat16 and
 *       mixed_float16, with lengths that are not multiples of the
 *       kernels' blocks and padding masks that leave rows fully masked
 *       (every value finite);
 *   (e) fused against unfused on the CPU: the same two train steps of
 *       the rewritten and the original graph, within the tolerances
 *       below and why; (d) and (e) again for head sizes 16, 32 and 64
 *       over 70 keys (wide_cases);
 *   (f) the synthetic data `mptc bench` feeds a sequence model: a class
 *       id at every position (synthetic(..., ids=[T]));
 *   (g) the generated CUDA kernels (codegen/cuda/emit_attn.c) on the host
 *       emulator (tests/cuda_emu.h) against the interpreter's values, and
 *       through NVRTC where libnvrtc is.
 * (a), (b) and (d) run with q, k and v read in the projections' [B, T, H,
 * E] (the rewrite's layout, the op's bthd) and after their transposes.
 */
#include "codegen/cuda/cuda.h"
#include "codegen/cuda/driver.h"
#include "codegen/cpu/emit.h"
#include "cpu_check.h"
#include "cuda_emu.h"
#include "runtime/data/data.h"

#define BATCH 3
#define TRAIN "train {\n    optimizer = adam(learning_rate=0.001)\n}\n"
#define HEAD "    dense out(units=3)\n    activation p(softmax, dtype=float32)\n}\n" TRAIN

typedef struct {
    const char *name;
    const char *src;
    int causal, mask_rank;
} model_case;

static const model_case cases[] = {
    {"causal",
     "model m {\n    input x: [70, 6]\n    dense e(units=8, activation=tanh)\n"
     "    multi_head_attention a(num_heads=2, key_dim=4, use_causal_mask=true)\n"
     "    global_avg_pool1d g\n" HEAD, 1, 0},
    {"padding",
     "model m {\n    input x: [37, 6]\n    input mask: [37]\n    dense e(units=8, activation=tanh)\n"
     "    multi_head_attention a(num_heads=2, key_dim=4, attention_mask=mask)\n"
     "    global_avg_pool1d g\n" HEAD, 0, 2},
    {"pairs_causal",
     "model m {\n    input x: [5, 6]\n    input pairs: [5, 5]\n"
     "    multi_head_attention a(num_heads=2, key_dim=3, use_causal_mask=true, attention_mask=pairs)\n"
     "    global_avg_pool1d g\n" HEAD, 1, 3},
    {"cross",
     "model m {\n    input x: [5, 6]\n    input ctx: [9, 4]\n    dense c(units=6) from ctx\n"
     "    multi_head_attention a(num_heads=2, key_dim=4, value_dim=3) from x, c\n"
     "    global_avg_pool1d g\n" HEAD, 0, 0},
    /* rate 0.5: 1 / (1 - rate) is 2 in f32 and in the f64 checks alike */
    {"dropout",
     "model m {\n    input x: [40, 6]\n    input mask: [40]\n    dense e(units=8, activation=tanh)\n"
     "    multi_head_attention a(num_heads=2, key_dim=4, dropout=0.5, use_causal_mask=true, attention_mask=mask)\n"
     "    global_avg_pool1d g\n" HEAD, 1, 2},
};
#define N_CASES ((int)(sizeof cases / sizeof *cases))

/* head sizes 16, 32 and 64, which the CPU kernels sum in registers on
 * their own paths (a full tile of 64 keys, four rows or keys at a time,
 * then the rest one by one: 70 is 64 + 6 keys, query blocks 32 + 32 + 6);
 * run through (d) and (e) only, the definition being the cases' above */
static const model_case wide_cases[] = {
    {"heads_32_16",
     "model m {\n    input x: [70, 6]\n    dense e(units=8, activation=tanh)\n"
     "    multi_head_attention a(num_heads=2, key_dim=32, value_dim=16, use_causal_mask=true)\n"
     "    global_avg_pool1d g\n" HEAD, 1, 0},
    {"heads_64_32",
     "model m {\n    input x: [70, 6]\n    dense e(units=8, activation=tanh)\n"
     "    multi_head_attention a(num_heads=2, key_dim=64, value_dim=32, use_causal_mask=true)\n"
     "    global_avg_pool1d g\n" HEAD, 1, 0},
    /* no mask: the register paths' cut at Tk (70, within the second key block) */
    {"heads_16_64",
     "model m {\n    input x: [70, 6]\n    dense e(units=8, activation=tanh)\n"
     "    multi_head_attention a(num_heads=2, key_dim=16, value_dim=64)\n"
     "    global_avg_pool1d g\n" HEAD, 0, 0},
    {"heads_64_dropout",
     "model m {\n    input x: [70, 6]\n    input mask: [70]\n    dense e(units=8, activation=tanh)\n"
     "    multi_head_attention a(num_heads=2, key_dim=64, dropout=0.5, attention_mask=mask)\n"
     "    global_avg_pool1d g\n" HEAD, 0, 2},
    /* cross attention without a mask, 40 queries against 70 keys: on an
     * AMX host bf16 heads of multiples of 32 run on the tiles
     * (attention_amx.c), as heads_64_32 does causal */
    {"heads_32_64_cross",
     "model m {\n    input x: [40, 6]\n    input ctx: [70, 4]\n    dense c(units=6) from ctx\n"
     "    multi_head_attention a(num_heads=2, key_dim=32, value_dim=64) from x, c\n"
     "    global_avg_pool1d g\n" HEAD, 0, 0},
};
#define N_WIDE ((int)(sizeof wide_cases / sizeof *wide_cases))

static mpt_model *load_src(const char *name, const char *src, int training) {
    mpt_lower_opts lo = {.batch_size = BATCH, .training = training};
    mpt_model *m = NULL;
    int bad = mpt_lang_load_string(name, src, &lo, &m, stderr);
    CHECK_MSG(bad == 0 && m, "%s does not load", name);
    return bad ? NULL : m;
}

/* padding masks: sample 0 fully masked, the others a prefix of ones */
static void plant_masks(const mpt_graph *g, mpt_tensor *in) {
    for (int k = 0; k < mpt_graph_n_inputs(g); k++) {
        const mpt_node *nd = &g->nodes[mpt_graph_input_node(g, k)];
        int64_t n = mpt_shape_numel(nd->shape), per = n / nd->shape.dim[0];
        int64_t steps = nd->shape.dim[nd->shape.rank - 1];
        if (strstr(nd->name, "mask") || strstr(nd->name, "pairs"))
            for (int64_t i = 0; i < n; i++) {
                int64_t r = i / per, len = r == 0 ? 0 : 1 + (r * 7) % steps;
                mpt_tensor_set(&in[k], i, i % steps < len ? 1.0 : 0.0);
            }
        else if (strcmp(nd->name, "y") == 0 && nd->dtype == MPT_DT_I32)
            for (int64_t i = 0; i < n; i++) mpt_tensor_set(&in[k], i, (double)(i % 3));
    }
}

static int count_op(const mpt_graph *g, mpt_op op) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
    return n;
}

static mpt_graph *typed_of(const mpt_model *m, const char *policy) {
    char err[512];
    mpt_policy_opts po = {0};
    mpt_policy_lookup(policy, &po.global);
    mpt_graph *typed = mpt_policy_apply(m->graph, &po, err, sizeof err);
    CHECK_MSG(typed != NULL, "policy %s: %s", policy, err);
    return typed;
}

/* the rewritten forward graph (NULL when nothing was rewritten) and its
 * one note */
/* the rewrite's layout argument: 1, q, k and v read where the
 * projections put them ([B, T, H, E], the op's bthd; CUDA's default), 0
 * after their transposes (the CPU's) */
static int layout = 1;

static mpt_graph *rewrite(const mpt_graph *fwd, const char *refuse, mpt_attention_note *note) {
    mpt_attention_note *notes;
    int n;
    mpt_graph *r = mpt_attention_rewrite(fwd, refuse, layout, &notes, &n);
    CHECK_MSG(n == 1, "%d attention notes, want 1", n);
    if (n >= 1) *note = notes[0];
    free(notes);
    char buf[512];
    const char *e = r ? mpt_graph_verify(r, buf, sizeof buf) : NULL;
    CHECK_MSG(e == NULL, "the rewritten graph is malformed: %s", e);
    return r;
}

static mpt_graph *train_step(const mpt_graph *typed, const mpt_model *m, const char *policy) {
    char err[512];
    mpt_train_opts to = {.loss = m->train.loss, .opt = m->train.optimizer,
                         .loss_scale = m->train.loss_scale, .metrics = {.accuracy = 1}};
    to.loss_scale.mode = strcmp(policy, "mixed_float16") ? MPT_LS_NONE : MPT_LS_DYNAMIC;
    mpt_graph *step = mpt_train_step(typed, &to, err, sizeof err);
    CHECK_MSG(step != NULL, "train step: %s", err);
    return step;
}

/* ---- (a) the rewrite ---- */

static void test_rewrite(void) {
    for (int c = 0; c < 2 * N_CASES; c++) {
        layout = c % 2;
        mpt_model *m = load_src(cases[c / 2].name, cases[c / 2].src, 1);
        if (!m) continue;
        mpt_graph *typed = typed_of(m, "mixed_bfloat16");
        mpt_attention_note note = {0};
        mpt_graph *r = typed ? rewrite(typed, NULL, &note) : NULL;
        CHECK_MSG(r && !note.reason, "%s: not rewritten: %s", cases[c / 2].name, note.reason ? note.reason : "");
        if (r) {
            CHECK(count_op(r, MPT_OP_ATTENTION) == 1 && count_op(r, MPT_OP_BATCH_MATMUL) == 0);
            /* the softmax went with it (the model's own softmax stays) */
            CHECK(count_op(r, MPT_OP_EXP) == count_op(typed, MPT_OP_EXP) - 1 &&
                  count_op(r, MPT_OP_REDUCE_MAX) == count_op(typed, MPT_OP_REDUCE_MAX) - 1);
            CHECK_MSG(count_op(r, MPT_OP_TRANSPOSE) == (layout ? 0 : count_op(typed, MPT_OP_TRANSPOSE)),
                      "%s: layout %d: %d transposes of %d", cases[c / 2].name, layout,
                      count_op(r, MPT_OP_TRANSPOSE), count_op(typed, MPT_OP_TRANSPOSE));
            for (int i = 0; i < r->n_nodes; i++) {
                const mpt_node *a = &r->nodes[i];
                if (a->op != MPT_OP_ATTENTION) continue;
                const mpt_node *mk = &r->nodes[a->in[3]];
                CHECK_MSG(a->attr.i[0] == cases[c / 2].causal, "%s: causal %lld", cases[c / 2].name,
                          (long long)a->attr.i[0]);
                CHECK_MSG(cases[c / 2].mask_rank ? mk->op != MPT_OP_CONST && mk->shape.rank == cases[c / 2].mask_rank
                                             : mk->op == MPT_OP_CONST,
                          "%s: the mask is %s of rank %d", cases[c / 2].name, mpt_op_name(mk->op), mk->shape.rank);
                CHECK(a->attr.i[1] == (cases[c / 2].mask_rank != 0)); /* Keras zeroes masked probabilities */
                CHECK(a->dtype == MPT_DT_F32 && r->nodes[a->in[0]].dtype == MPT_DT_BF16);
                /* with the layout, the op reads the projections' [B, T, H, E]
                 * and no transpose is left before or after it */
                CHECK_MSG(a->attr.i[6] == layout && a->shape.dim[layout ? 2 : 1] == 2,
                          "%s: layout %d: bthd %lld, o [%lld, %lld, %lld, %lld]", cases[c / 2].name, layout,
                          (long long)a->attr.i[6], (long long)a->shape.dim[0], (long long)a->shape.dim[1],
                          (long long)a->shape.dim[2], (long long)a->shape.dim[3]);
            }
        }
        /* a backend without the kernel: the same match, refused, nothing rewritten */
        mpt_attention_note no = {0};
        mpt_graph *none = typed ? rewrite(typed, "no kernel here", &no) : NULL;
        CHECK(none == NULL && no.reason && strcmp(no.reason, "no kernel here") == 0);
        mpt_graph_free(r);
        mpt_graph_free(typed);
        mpt_model_free(m);
    }
    /* dropout goes into the op: rate 0.1 drops where random_uniform's 24
     * bits are below ceil(0.1f 2^24), kept values times 1 / 0.9 in f32;
     * without training the same layer has none */
    static const char *drop = "model m {\n    input x: [6, 8]\n"
                              "    multi_head_attention a(num_heads=2, key_dim=4, dropout=0.1, use_causal_mask=true)\n"
                              "    global_avg_pool1d g\n" HEAD;
    for (int training = 1; training >= 0; training--) {
        mpt_model *m = load_src("dropout", drop, training);
        mpt_graph *typed = m ? typed_of(m, "float32") : NULL;
        mpt_attention_note note = {0};
        mpt_graph *r = typed ? rewrite(typed, NULL, &note) : NULL;
        CHECK_MSG(r && !note.reason, "dropout: %s", note.reason ? note.reason : "");
        CHECK(r && count_op(r, MPT_OP_RANDOM_UNIFORM) == 0);
        for (int i = 0; r && i < r->n_nodes; i++) {
            const mpt_node *a = &r->nodes[i];
            if (a->op != MPT_OP_ATTENTION) continue;
            float scale = 1.0f / 0.9f;
            uint32_t bits;
            memcpy(&bits, &scale, 4);
            CHECK_MSG(a->attr.i[4] == (training ? (int64_t)ceil((double)0.1f * 16777216.0) : 0) &&
                          (!training || a->attr.i[5] == (int64_t)bits),
                      "dropout attrs: below %lld, scale bits %llx", (long long)a->attr.i[4],
                      (long long)a->attr.i[5]);
            CHECK(r->nodes[a->in[4]].op == (training ? MPT_OP_VARIABLE : MPT_OP_CONST));
        }
        mpt_graph_free(r);
        mpt_graph_free(typed);
        mpt_model_free(m);
    }
}

/* ---- (b) the definition against the primitive ops, in f64 ---- */

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

/* g with y = sum(output * w) and outputs y, then d y / d every variable */
static mpt_graph *with_grads(const mpt_graph *fwd, int *n_grads) {
    mpt_graph *g = mpt_graph_new(fwd->name);
    int *map = calloc((size_t)fwd->n_nodes + 1, sizeof *map);
    for (int i = 0; i < fwd->n_nodes; i++) map[i] = mpt_graph_copy_node(g, fwd, i, map);
    int out = map[fwd->outputs[mpt_graph_find_output(fwd, "output")].node];
    free(map);
    mpt_shape os = g->nodes[out].shape;
    int w = mpt_b_input(g, "fd_weights", MPT_DT_F64, os);
    int y = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_binary(g, MPT_OP_MUL, out, w), (1LL << os.rank) - 1);
    int nv = mpt_graph_n_variables(g);
    int *wrt = calloc((size_t)nv + 1, sizeof *wrt), *grads = calloc((size_t)nv + 1, sizeof *grads);
    for (int k = 0; k < nv; k++) wrt[k] = mpt_graph_variable_node(g, k);
    char err[512];
    int rc = mpt_autodiff(g, y, -1, wrt, nv, grads, err, sizeof err);
    CHECK_MSG(rc == 0, "autodiff: %s", err);
    mpt_graph_add_output(g, "y", y);
    *n_grads = 0;
    for (int k = 0; rc == 0 && k < nv; k++) {
        if (!mpt_dtype_is_float(g->nodes[wrt[k]].dtype)) continue; /* dropout's step counter */
        CHECK_MSG(grads[k] >= 0, "no gradient for %s", g->nodes[wrt[k]].name);
        if (grads[k] >= 0) mpt_graph_add_output(g, g->nodes[wrt[k]].name, grads[k]), (*n_grads)++;
    }
    free(wrt);
    free(grads);
    return g;
}

static void fill(const mpt_graph *g, mpt_tensor *in, mpt_tensor *vars) {
    for (int k = 0; k < mpt_graph_n_inputs(g); k++) {
        const mpt_node *nd = &g->nodes[mpt_graph_input_node(g, k)];
        mpt_tensor_alloc(&in[k], nd->dtype, nd->shape);
        for (int64_t i = 0; i < mpt_shape_numel(nd->shape); i++)
            mpt_tensor_set(&in[k], i, strcmp(nd->name, "fd_weights") == 0 ? 0.5 + urand() : 2 * urand() - 1);
    }
    plant_masks(g, in);
    mpt_init_variables(g, vars, 7);
    for (int k = 0; k < mpt_graph_n_variables(g); k++) /* biases off zero */
        for (int64_t i = 0; i < mpt_shape_numel(vars[k].shape); i++)
            mpt_tensor_set(&vars[k], i, mpt_tensor_get(&vars[k], i) + 0.3 * (urand() - 0.5));
}

static double y_of(const mpt_graph *g, const mpt_tensor *in, mpt_tensor *vars) {
    mpt_tensor out[64];
    char err[256];
    if (mpt_interp_run(g, in, vars, out, NULL, err, sizeof err) != 0) return NAN;
    double y = mpt_tensor_get(&out[mpt_graph_find_output(g, "y")], 0);
    for (int k = 0; k < g->n_outputs; k++) mpt_tensor_free(&out[k]);
    return y;
}

static void check_definition(const model_case *c) {
    mpt_model *m = load_src(c->name, c->src, 1);
    if (!m) return;
    mpt_graph *f64 = as_f64(m->graph);
    mpt_attention_note note = {0};
    mpt_graph *fused = rewrite(f64, NULL, &note);
    CHECK_MSG(fused != NULL, "%s in f64: %s", c->name, note.reason ? note.reason : "not rewritten");
    int na = 0, nb = 0;
    mpt_graph *ga = fused ? with_grads(fused, &na) : NULL, *gb = with_grads(f64, &nb);
    if (ga && count_op(ga, MPT_OP_ATTENTION_GRAD) != 3)
        CHECK_MSG(0, "%s: %d attention_grad ops, want 3", c->name, count_op(ga, MPT_OP_ATTENTION_GRAD));
    int ni = mpt_graph_n_inputs(gb), nv = mpt_graph_n_variables(gb);
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in), *vars = calloc((size_t)nv + 1, sizeof *vars);
    mpt_tensor oa[64], ob[64];
    char err[256];
    fill(gb, in, vars);
    if (ga && na == nb && mpt_interp_run(ga, in, vars, oa, NULL, err, sizeof err) == 0) {
        if (mpt_interp_run(gb, in, vars, ob, NULL, err, sizeof err) == 0) {
            /* the same mathematics in f64: only the order of the sums
             * differs (and exp(s - lse) against exp(s - max) / sum) */
            for (int k = 0; k < ga->n_outputs; k++) {
                char what[160];
                snprintf(what, sizeof what, "%s f64 attention op against the primitive ops, %s", c->name,
                         ga->outputs[k].name);
                compare(&oa[k], &ob[k], (tol){1e-12, 1e-9}, what);
            }
            for (int k = 0; k < gb->n_outputs; k++) mpt_tensor_free(&ob[k]);
        }
        /* central differences of y through the attention ops */
        int before = check_failures, checked = 0;
        for (int k = 0; k < nv; k++) {
            int gk = mpt_graph_find_output(ga, ga->nodes[mpt_graph_variable_node(ga, k)].name);
            if (gk < 0) continue; /* not a float variable */
            const mpt_tensor *ad = &oa[gk];
            int64_t n = mpt_shape_numel(vars[k].shape), stride = n > 12 ? n / 12 : 1;
            for (int64_t i = 0; i < n; i += stride) {
                double x0 = mpt_tensor_get(&vars[k], i), step = 1e-6 * (fabs(x0) > 1 ? fabs(x0) : 1);
                mpt_tensor_set(&vars[k], i, x0 + step);
                double yp = y_of(ga, in, vars);
                mpt_tensor_set(&vars[k], i, x0 - step);
                double ym = y_of(ga, in, vars);
                mpt_tensor_set(&vars[k], i, x0);
                double fd = (yp - ym) / (2 * step), got = mpt_tensor_get(ad, i);
                /* the bound test_inputs' gradients use: O(step^2) truncation and the
                 * cancellation of two sums near 1 */
                CHECK_MSG(fabs(fd - got) <= 1e-6 + 1e-5 * fabs(fd), "%s: d y / d %s[%lld]: %.12g, fd %.12g",
                          c->name, ga->nodes[mpt_graph_variable_node(ga, k)].name, (long long)i, got, fd);
                checked++;
                if (check_failures - before > 8) break;
            }
        }
        CHECK(checked > 40);
        for (int k = 0; k < ga->n_outputs; k++) mpt_tensor_free(&oa[k]);
    } else {
        CHECK_MSG(0, "%s: the interpreter failed on the fused gradient graph: %s", c->name, err);
    }
    for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    for (int k = 0; k < nv; k++) mpt_tensor_free(&vars[k]);
    free(in);
    free(vars);
    mpt_graph_free(ga);
    mpt_graph_free(gb);
    mpt_graph_free(fused);
    mpt_graph_free(f64);
    mpt_model_free(m);
}

/* ---- (c) the plan ---- */

static mpt_plan *plan_of(const mpt_graph *step, int enabled) {
    mpt_fusion_opts fo;
    mpt_fusion_opts_default(&fo);
    fo.enabled = enabled;
    return mpt_fuse(step, &fo);
}

static int count_kernels(const mpt_plan *p, mpt_op root) {
    int n = 0;
    for (int k = 0; k < p->n_kernels; k++)
        n += p->kernels[k].kind == MPT_KERNEL_OPAQUE && p->g->nodes[p->kernels[k].root].op == root;
    return n;
}

/* the activation peak of gpt-like causal attention at context t, fused
 * (the rewrite) or not */
static int64_t peak_at(int64_t t, int fused) {
    char src[512];
    snprintf(src, sizeof src,
             "model m {\n    input x: [%lld]\n    embedding e(input_dim=16, output_dim=16)\n"
             "    multi_head_attention a(num_heads=4, key_dim=4, use_causal_mask=true)\n"
             "    global_avg_pool1d g\n    dense out(units=16)\n    activation p(softmax, dtype=float32)\n}\n" TRAIN,
             (long long)t);
    mpt_model *m = load_src("peak", src, 1);
    if (!m) return -1;
    mpt_graph *typed = typed_of(m, "float32"), *r = NULL;
    if (fused && typed) {
        mpt_attention_note note;
        r = rewrite(typed, NULL, &note);
    }
    mpt_graph *step = typed && (r || !fused) ? train_step(r ? r : typed, m, "float32") : NULL;
    int64_t peak = -1;
    if (step) {
        mpt_plan *p = plan_of(step, fused);
        peak = p->peak_bytes;
        if (fused) {
            CHECK(count_kernels(p, MPT_OP_ATTENTION) == 1 && count_kernels(p, MPT_OP_ATTENTION_GRAD) == 1);
            CHECK(count_kernels(p, MPT_OP_BATCH_MATMUL) == 0);
            /* the forward kernel writes the row statistics with o */
            for (int k = 0; k < p->n_kernels; k++) {
                if (p->kernels[k].kind != MPT_KERNEL_OPAQUE) continue;
                mpt_op op = p->g->nodes[p->kernels[k].root].op;
                if (op == MPT_OP_ATTENTION)
                    CHECK(p->kernels[k].n_nodes == 2 && p->kernels[k].n_outputs == 2);
            }
        }
        mpt_plan_free(p);
    }
    mpt_graph_free(step);
    mpt_graph_free(r);
    mpt_graph_free(typed);
    mpt_model_free(m);
    return peak;
}

static void test_plan(void) {
    /* doubling the context doubles a linear peak and quadruples a
     * quadratic one: between 128 and 512 the fused peak may grow at most
     * 4x plus a margin, the unfused one grows past 8x */
    int64_t f128 = peak_at(128, 1), f512 = peak_at(512, 1);
    int64_t u128 = peak_at(128, 0), u512 = peak_at(512, 0);
    CHECK_MSG(f128 > 0 && f512 <= 5 * f128, "fused peak %lld at 128, %lld at 512: not linear",
              (long long)f128, (long long)f512);
    CHECK_MSG(u128 > 0 && u512 > 8 * u128, "unfused peak %lld at 128, %lld at 512: expected quadratic",
              (long long)u128, (long long)u512);
}

/* ---- (d) the CPU kernels against the interpreter ---- */

static mpt_dtype compute_of(const char *policy) {
    return strcmp(policy, "float32") == 0 ? MPT_DT_F32 : strcmp(policy, "mixed_float16") == 0 ? MPT_DT_F16
                                                                                            : MPT_DT_BF16;
}

static void check_backend(const model_case *c, const char *policy) {
    mpt_model *m = load_src(c->name, c->src, 1);
    if (!m) return;
    char what[160];
    snprintf(what, sizeof what, "%s %s", c->name, policy);
    mpt_graph *typed = typed_of(m, policy), *r = NULL, *step = NULL;
    mpt_attention_note note;
    if (typed) r = rewrite(typed, NULL, &note);
    if (r) step = train_step(r, m, policy);
    if (step) {
        /* the table's accumulation tolerance, as test_inputs' attention
         * models: the kernel sums in f32 what the interpreter sums in f64
         * (its exp is a polynomial within 2e-7 of expf) */
        tol t = tol_for(TOL_ACCUM, compute_of(policy), 1);
        t.atol += 1.2e-3 * 2; /* Adam: a step of lr where a gradient is 0 on one side (test_layers) */
        plant = plant_masks;
        run_both(step, 2, t, 0, what, FUSED);
        plant = NULL;
    }
    mpt_graph_free(step);
    mpt_graph_free(r);
    mpt_graph_free(typed);
    mpt_model_free(m);
}

/* ---- (e) fused against unfused on the CPU ---- */

/* two steps of step on the CPU from the same start; outs[s] the loss of
 * step s, vars the variables after */
static int run_cpu(const mpt_graph *step, mpt_tensor *vars, double *loss) {
    char err[512];
    mpt_plan *p = plan_of(step, 1);
    mpt_exec *x = mpt_backend_cpu.compile(p, err, sizeof err);
    CHECK_MSG(x != NULL, "compile: %s", err);
    int ni = mpt_graph_n_inputs(step), no = step->n_outputs, rc = x ? 0 : -1;
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in), *out = calloc((size_t)no + 1, sizeof *out);
    mpt_init_variables(step, vars, 42);
    unsigned seed0 = rng_state;
    for (int s = 0; s < 2 && rc == 0; s++) {
        fill_inputs(step, in, 0);
        plant_masks(step, in);
        rc = mpt_backend_cpu.run(x, in, vars, out, err, sizeof err);
        CHECK_MSG(rc == 0, "run: %s", err);
        if (rc == 0) {
            loss[s] = mpt_tensor_get(&out[mpt_graph_find_output(step, "loss")], 0);
            for (int k = 0; k < no; k++) {
                for (int64_t i = 0; i < mpt_shape_numel(out[k].shape); i++)
                    CHECK_MSG(!mpt_dtype_is_float(out[k].dtype) || isfinite(mpt_tensor_get(&out[k], i)),
                              "output %s is not finite", step->outputs[k].name);
                mpt_tensor_free(&out[k]);
            }
        }
        for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    }
    rng_state = seed0;
    free(in);
    free(out);
    if (x) mpt_backend_cpu.free(x);
    mpt_plan_free(p);
    return rc;
}

static void check_fused_unfused(const model_case *c, const char *policy) {
    mpt_model *m = load_src(c->name, c->src, 1);
    if (!m) return;
    mpt_graph *typed = typed_of(m, policy), *r = NULL;
    mpt_attention_note note;
    if (typed) r = rewrite(typed, NULL, &note);
    mpt_graph *fs = r ? train_step(r, m, policy) : NULL, *us = typed ? train_step(typed, m, policy) : NULL;
    int nv = us ? mpt_graph_n_variables(us) : 0;
    if (fs && us && mpt_graph_n_variables(fs) == nv) {
        mpt_tensor *vf = calloc((size_t)nv + 1, sizeof *vf), *vu = calloc((size_t)nv + 1, sizeof *vu);
        double lf[2], lu[2];
        if (run_cpu(fs, vf, lf) == 0 && run_cpu(us, vu, lu) == 0) {
            /* The unfused graph rounds the scores to f32 and the
             * probabilities to the compute dtype before P.V; the fused
             * kernel keeps both in f32. The loss moves by about what that
             * rounding moves o: a few f32 ulps (float32), and at most
             * twice the half-ulp rounding of each probability, f16's 2^-11
             * and bf16's 2^-9 (seen: 1.4e-4 and 4.3e-4). */
            mpt_dtype dt = compute_of(policy);
            double rtol = dt == MPT_DT_F32 ? 1e-5 : dt == MPT_DT_F16 ? 1e-3 : 4e-3;
            if (getenv("MPT_TEST_VERBOSE"))
                printf("%s %s loss rel diff %.3g %.3g\n", c->name, policy, fabs(lf[0] - lu[0]) / fabs(lu[0]),
                       fabs(lf[1] - lu[1]) / fabs(lu[1]));
            for (int s = 0; s < 2; s++)
                CHECK_MSG(fabs(lf[s] - lu[s]) <= rtol * fabs(lu[s]), "%s %s step %d loss: fused %.9g, unfused %.9g",
                          c->name, policy, s, lf[s], lu[s]);
            /* the weights after two Adam steps: the table's accumulation
             * tolerance and Adam's lr where a gradient is near 0 */
            tol t = tol_for(TOL_ACCUM, dt, 1);
            t.atol += 1.2e-3 * 2;
            for (int k = 0; k < nv; k++) {
                char what[200];
                snprintf(what, sizeof what, "%s %s fused against unfused, variable %s", c->name, policy,
                         us->nodes[mpt_graph_variable_node(us, k)].name);
                compare(&vf[k], &vu[k], t, what);
            }
        }
        for (int k = 0; k < nv; k++) mpt_tensor_free(&vf[k]), mpt_tensor_free(&vu[k]);
        free(vf);
        free(vu);
    }
    mpt_graph_free(fs);
    mpt_graph_free(us);
    mpt_graph_free(r);
    mpt_graph_free(typed);
    mpt_model_free(m);
}

/* ---- (f) synthetic labels at every position ---- */

static void test_synthetic_ids(void) {
    mpt_dataset *d = NULL;
    char err[512];
    int rc = mpt_data_open("synthetic(shape=[6], classes=5, samples=8, dtype=i32, vocab=9, ids=[6])",
                           MPT_DATA_TRAIN, mpt_shape_1(6), &d, err, sizeof err);
    CHECK_MSG(rc == 0, "synthetic ids: %s", err);
    if (rc) return;
    mpt_shape ls = mpt_data_label_shape(d);
    CHECK(ls.rank == 1 && ls.dim[0] == 6 && mpt_data_label_dtype(d) == MPT_DT_I32);
    mpt_tensor x, y;
    mpt_tensor_alloc(&x, MPT_DT_I32, mpt_shape_2(4, 6));
    mpt_tensor_alloc(&y, MPT_DT_I32, mpt_shape_2(4, 6));
    int64_t real = 0;
    rc = mpt_data_batch(d, 0, 4, &x, &y, &real, err, sizeof err);
    CHECK_MSG(rc == 0 && real == 4, "synthetic ids batch: %s", err);
    int in_range = 1, distinct = 0;
    for (int64_t i = 0; i < 24; i++) {
        double v = mpt_tensor_get(&y, i);
        in_range &= v >= 0 && v < 5;
        distinct |= i % 6 && v != mpt_tensor_get(&y, i - 1);
    }
    CHECK_MSG(in_range && distinct, "labels at every position: in [0, 5) and not all one class");
    mpt_tensor_free(&x);
    mpt_tensor_free(&y);
    mpt_data_free(d);
}

/* ---- (d2) the CPU attention kernels alone, output by output ---- */

/* A train step's outputs are its loss and the variables after Adam, whose
 * update hides a gradient's scale (and its atol a small error): here the
 * kernels' own outputs (o, lse, dq, dk, dv) against the interpreter's
 * values of the same nodes. amx 1 runs the bf16 heads on AMX tiles where
 * the host has them (attention_amx.c; probabilities and ds rounded to
 * bf16: TOL_MMA's reason), amx 0 the FMA kernels. */
typedef struct {
    const mpt_kernel *k;
    mpt_tensor *vals, *outs;
} kernel_io;

static void *kernel_data(const void *ctx, int node) {
    const kernel_io *io = ctx;
    for (int i = 0; i < io->k->n_outputs; i++)
        if (io->k->outputs[i] == node) return io->outs[i].data;
    return io->vals[node].data;
}

static int host_amx = -1; /* the JIT's bf16 GEMMs on AMX here */
static int n_amx_kernels;

static void check_cpu_kernels(const model_case *c, const char *policy, int amx) {
    mpt_model *m = load_src(c->name, c->src, 1);
    if (!m) return;
    mpt_graph *typed = typed_of(m, policy), *r = NULL, *step = NULL;
    mpt_attention_note note;
    if (typed) r = rewrite(typed, NULL, &note);
    if (r) step = train_step(r, m, policy);
    mpt_plan *p = step ? plan_of(step, 1) : NULL;
    int ni = step ? mpt_graph_n_inputs(step) : 0, nv = step ? mpt_graph_n_variables(step) : 0;
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in), *vars = calloc((size_t)nv + 1, sizeof *vars);
    mpt_tensor *outs = calloc(64, sizeof *outs), *vals = step ? calloc((size_t)step->n_nodes, sizeof *vals) : NULL;
    mpt_pool *pool = mpt_pool_new(2);
    char err[1024];
    if (p && pool) {
        emu_fill_inputs(step, in, 7);
        plant_masks(step, in);
        mpt_init_variables(step, vars, 11);
        mpt_interp_opts io = {.on_node = emu_capture, .ctx = vals};
        int rc = mpt_interp_run(step, in, vars, outs, &io, err, sizeof err);
        CHECK_MSG(rc == 0, "%s %s: interpreter: %s", c->name, policy, err);
        for (int k = 0; rc == 0 && k < p->n_kernels; k++) {
            const mpt_kernel *K = &p->kernels[k];
            mpt_op op = p->g->nodes[K->root].op;
            if (K->kind != MPT_KERNEL_OPAQUE || (op != MPT_OP_ATTENTION && op != MPT_OP_ATTENTION_GRAD))
                continue;
            mpt_tensor got[8] = {0};
            kernel_io kio = {K, vals, got};
            for (int j = 0; j < K->n_outputs && j < 8; j++) {
                const mpt_node *nd = &p->g->nodes[K->outputs[j]];
                mpt_tensor_alloc(&got[j], nd->dtype, nd->shape);
                memset(got[j].data, 0xff, mpt_tensor_bytes(&got[j])); /* NaN: unwritten fails */
            }
            int kr = mpt_cpu_run_attention(p->g, K, kernel_data, &kio, amx, pool, err, sizeof err);
            CHECK_MSG(kr == 0, "%s %s: %s: %s", c->name, policy, K->name, err);
            n_amx_kernels += kr == 0 && amx;
            for (int j = 0; kr == 0 && j < K->n_outputs && j < 8; j++) {
                const mpt_tensor *ref = &vals[K->outputs[j]];
                double max_ref = 0;
                for (int64_t i = 0; i < mpt_shape_numel(ref->shape); i++) max_ref = fmax(max_ref, fabs(mpt_tensor_get(ref, i)));
                /* as the emulator's check (g): the output dtype's row of
                 * the table, atol from f32 sums of Tq E-long products */
                const mpt_node *q = &p->g->nodes[p->g->nodes[K->outputs[j]].in[0]];
                tol t = tol_for(TOL_ACCUM, ref->dtype, 1);
                /* on the tiles p and ds are bf16 whatever the output's
                 * dtype (an f32 o too): bf16's TOL_MMA row */
                if (amx) t = tol_for(TOL_MMA, MPT_DT_BF16, 1);
                t.atol = 8 * (double)(q->shape.dim[2] * q->shape.dim[3]) * 0x1p-24 * max_ref;
                if (ref->dtype != MPT_DT_F32 || amx) t.atol = fmax(t.atol, t.rtol * max_ref);
                char what[200];
                snprintf(what, sizeof what, "%s %s CPU%s %s output %%%d", c->name, policy, amx ? " (amx)" : "",
                         K->name, K->outputs[j]);
                compare(&got[j], ref, t, what);
            }
            for (int j = 0; j < K->n_outputs && j < 8; j++) mpt_tensor_free(&got[j]);
        }
        for (int k = 0; rc == 0 && k < step->n_outputs; k++) mpt_tensor_free(&outs[k]);
    }
    if (pool) mpt_pool_free(pool);
    for (int i = 0; vals && i < step->n_nodes; i++) mpt_tensor_free(&vals[i]);
    for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    for (int k = 0; k < nv; k++) mpt_tensor_free(&vars[k]);
    free(vals);
    free(outs);
    free(in);
    free(vars);
    mpt_plan_free(p);
    mpt_graph_free(step);
    mpt_graph_free(r);
    mpt_graph_free(typed);
    mpt_model_free(m);
}

/* ---- (g) the CUDA kernels on the host emulator ---- */

static int n_emu_kernels, n_nvrtc;

static void check_cuda(const model_case *c, const char *policy) {
    mpt_model *m = load_src(c->name, c->src, 1);
    if (!m) return;
    mpt_graph *typed = typed_of(m, policy), *r = NULL, *step = NULL;
    mpt_attention_note note;
    if (typed) r = rewrite(typed, NULL, &note);
    if (r) step = train_step(r, m, policy);
    mpt_plan *p = step ? plan_of(step, 1) : NULL;
    int ni = step ? mpt_graph_n_inputs(step) : 0, nv = step ? mpt_graph_n_variables(step) : 0;
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in), *vars = calloc((size_t)nv + 1, sizeof *vars);
    mpt_tensor *outs = calloc(64, sizeof *outs), *vals = step ? calloc((size_t)step->n_nodes, sizeof *vals) : NULL;
    char err[2048];
    if (p) {
        emu_fill_inputs(step, in, 5);
        plant_masks(step, in);
        mpt_init_variables(step, vars, 9);
        mpt_interp_opts io = {.on_node = emu_capture, .ctx = vals};
        int rc = mpt_interp_run(step, in, vars, outs, &io, err, sizeof err);
        CHECK_MSG(rc == 0, "%s %s: interpreter: %s", c->name, policy, err);
        mpt_cuda_kernel_src src[2];
        int n = 0;
        for (int k = 0; rc == 0 && k < p->n_kernels && n < 2; k++) {
            mpt_op op = p->g->nodes[p->kernels[k].root].op;
            if (p->kernels[k].kind != MPT_KERNEL_OPAQUE || (op != MPT_OP_ATTENTION && op != MPT_OP_ATTENTION_GRAD))
                continue;
            int e = mpt_cuda_emit_kernel(p, k, &src[n], err, sizeof err);
            CHECK_MSG(e == 0, "%s %s: emit: %s", c->name, policy, err);
            n += e == 0;
        }
        CHECK_MSG(n == 2, "%s %s: %d attention kernels emitted, want 2", c->name, policy, n);
        emu_module em;
        if (n == 2 && emu_build(&em, src, n, err, sizeof err) == 0) {
            for (int x = 0; x < n; x++) {
                const mpt_cuda_kernel_src *ksrc = &src[x];
                void **args = calloc((size_t)ksrc->n_params + 1, sizeof *args);
                void **maps = calloc((size_t)ksrc->n_params + 1, sizeof *maps);
                size_t *lens = calloc((size_t)ksrc->n_params + 1, sizeof *lens);
                for (int j = 0; j < ksrc->n_params; j++) {
                    const mpt_node *nd = &step->nodes[ksrc->params[j]];
                    size_t bytes = (size_t)mpt_shape_numel(nd->shape) * mpt_dtype_size(nd->dtype);
                    args[j] = emu_buffer(bytes, &maps[j], &lens[j]);
                    if (j < ksrc->n_inputs) memcpy(args[j], vals[ksrc->params[j]].data, bytes);
                    else memset(args[j], 0xff, bytes); /* NaN: an element left unwritten fails */
                }
                int lr = emu_launch(&em, x, args, err, sizeof err);
                CHECK_MSG(lr == 0, "%s %s: %s: %s", c->name, policy, ksrc->name, err);
                n_emu_kernels += lr == 0;
                for (int j = ksrc->n_inputs; lr == 0 && j < ksrc->n_params; j++) {
                    const mpt_tensor *ref = &vals[ksrc->params[j]];
                    mpt_tensor got = {ref->dtype, ref->shape, args[j]};
                    double max_ref = 0;
                    for (int64_t i = 0; i < mpt_shape_numel(ref->shape); i++)
                        max_ref = fmax(max_ref, fabs(mpt_tensor_get(ref, i)));
                    /* the table's accumulation tolerance of the output's
                     * dtype; atol: f32 sums of Tk terms of E-long products
                     * (the host's expf within 2 ulps), as test_cuda_emu's */
                    const mpt_node *q = &step->nodes[step->nodes[ksrc->params[j]].in[0]];
                    tol t = tol_for(TOL_ACCUM, ref->dtype == MPT_DT_F32 ? MPT_DT_F32 : ref->dtype, 1);
                    t.atol = 8 * (double)(q->shape.dim[2] * q->shape.dim[3]) * 0x1p-24 * max_ref;
                    if (ref->dtype != MPT_DT_F32) t.atol = fmax(t.atol, t.rtol * max_ref);
                    char what[200];
                    snprintf(what, sizeof what, "%s %s CUDA %s output %%%d", c->name, policy, ksrc->name,
                             ksrc->params[j]);
                    compare(&got, ref, t, what);
                }
                for (int j = 0; j < ksrc->n_params; j++) munmap(maps[j], lens[j]);
                free(args);
                free(maps);
                free(lens);
            }
            emu_free(&em);
        } else if (n == 2) {
            CHECK_MSG(0, "%s %s: emulator build: %s", c->name, policy, err);
        }
        char why[256];
        for (int x = 0; x < n && mpt_cuda_nvrtc(why, sizeof why); x++) {
            mpt_cuda_binary bin = {0};
            int cr = mpt_cuda_compile(src[x].source, src[x].name, "sm_90", &bin, err, sizeof err);
            CHECK_MSG(cr == 0, "%s %s: NVRTC: %s", c->name, policy, err);
            CHECK_MSG(cr != 0 || (bin.spill_stores == 0 && bin.spill_loads == 0),
                      "%s: %d bytes spilled", src[x].name, bin.spill_stores);
            n_nvrtc += cr == 0;
            mpt_cuda_binary_free(&bin);
        }
        for (int x = 0; x < n; x++) mpt_cuda_kernel_src_free(&src[x]);
        for (int k = 0; rc == 0 && k < step->n_outputs; k++) mpt_tensor_free(&outs[k]);
    }
    for (int i = 0; vals && i < step->n_nodes; i++) mpt_tensor_free(&vals[i]);
    for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    for (int k = 0; k < nv; k++) mpt_tensor_free(&vars[k]);
    free(vals);
    free(outs);
    free(in);
    free(vars);
    mpt_plan_free(p);
    mpt_graph_free(step);
    mpt_graph_free(r);
    mpt_graph_free(typed);
    mpt_model_free(m);
}

int main(void) {
    static const char *policies[] = {"float32", "mixed_bfloat16", "mixed_float16"};
    test_rewrite();
    layout = 1;
    for (int l = 0; l < 2; l++, layout = !layout)
        for (int c = 0; c < N_CASES; c++) check_definition(&cases[c]);
    test_plan();
    test_synthetic_ids();
    for (int c = 0; c < N_CASES; c++)
        for (int p = 0; p < 3; p++) {
            /* the CPU kernels on both layouts (the CPU's own, 0, in (e) and
             * test_examples); CUDA on its own, 1 */
            layout = p != 1;
            check_backend(&cases[c], policies[p]);
            layout = 0;
            check_fused_unfused(&cases[c], policies[p]);
            /* the CUDA kernels of each case under one policy, every dtype
             * in turn (each emulator build is a g++ run of seconds) */
            layout = 1;
            if (p == c % 3) check_cuda(&cases[c], policies[p]);
        }
    /* each policy's loads (f32, f16, bf16) once on the register paths, not
     * every pair (suite time): the causal 32/16 case in f32 and f16, the
     * dropout 64 case in bf16 */
    for (int c = 0; c < N_WIDE; c++)
        for (int p = 0; p < 3; p++) {
            if ((c == 0) != (p != 1)) continue;
            layout = c % 2;
            check_backend(&wide_cases[c], policies[p]);
            check_fused_unfused(&wide_cases[c], policies[p]);
        }
    /* the kernels alone: every case and policy on the FMA kernels, and
     * on an AMX host the bf16 ones on the tiles (those AMX takes: heads
     * of multiples of 32, causal or no mask, no dropout; the others run
     * the FMA kernels again) */
    mpt_cpu_jit *jit = mpt_cpu_jit_new(MPT_CPU_ISA_HOST, NULL, 0);
    host_amx = jit && mpt_cpu_jit_has_amx(jit);
    for (int c = 0; c < N_CASES + N_WIDE; c++)
        for (int p = 0; p < 3; p++) {
            const model_case *mc = c < N_CASES ? &cases[c] : &wide_cases[c - N_CASES];
            layout = c % 2;
            check_cpu_kernels(mc, policies[p], 0);
            if (host_amx && p == 1) check_cpu_kernels(mc, policies[p], 1);
        }
    if (jit) mpt_cpu_jit_free(jit);
    printf("CPU attention kernels: %d run with AMX allowed (host AMX: %s)\n", n_amx_kernels, host_amx ? "yes" : "no");
    printf("CUDA attention kernels: %d run on the emulator, %d compiled by NVRTC\n", n_emu_kernels, n_nvrtc);
    return check_exit("test_attention_fused");
}
