/* tests/attention_cases.h — the attention models both attention tests
 * run (test_attention_fused.c, test_attention_kernels.c), and the steps
 * from a model to its train step and plan. */
#ifndef MPT_TESTS_ATTENTION_CASES_H
#define MPT_TESTS_ATTENTION_CASES_H

#include "cpu_check.h"

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
    /* 200 causal rows: four key blocks and seven query blocks, the AMX
     * forward's pipeline over several blocks and its backward's steps
     * of two query blocks with one left over */
    {"heads_32_long",
     "model m {\n    input x: [200, 6]\n    dense e(units=8, activation=tanh)\n"
     "    multi_head_attention a(num_heads=2, key_dim=32, use_causal_mask=true)\n"
     "    global_avg_pool1d g\n" HEAD, 1, 0},
    {"heads_32_64_cross",
     "model m {\n    input x: [40, 6]\n    input ctx: [70, 4]\n    dense c(units=6) from ctx\n"
     "    multi_head_attention a(num_heads=2, key_dim=32, value_dim=64) from x, c\n"
     "    global_avg_pool1d g\n" HEAD, 0, 0},
    /* mask arrays, which the AMX kernels read 64 keys at a time: a
     * padding mask over 70 keys (sample 0 sees none), alone and with the
     * causal cut, and a [T, T] one over 40 */
    {"heads_32_padding",
     "model m {\n    input x: [70, 6]\n    input mask: [70]\n    dense e(units=8, activation=tanh)\n"
     "    multi_head_attention a(num_heads=2, key_dim=32, attention_mask=mask)\n"
     "    global_avg_pool1d g\n" HEAD, 0, 2},
    {"heads_32_causal_padding",
     "model m {\n    input x: [70, 6]\n    input mask: [70]\n    dense e(units=8, activation=tanh)\n"
     "    multi_head_attention a(num_heads=2, key_dim=32, use_causal_mask=true, attention_mask=mask)\n"
     "    global_avg_pool1d g\n" HEAD, 1, 2},
    {"heads_64_pairs",
     "model m {\n    input x: [40, 6]\n    input pairs: [40, 40]\n    dense e(units=8, activation=tanh)\n"
     "    multi_head_attention a(num_heads=2, key_dim=64, value_dim=32, attention_mask=pairs)\n"
     "    global_avg_pool1d g\n" HEAD, 0, 3},
    /* dropout on the causal cut alone (a GPT's attention dropout): with
     * heads_64_dropout (under a padding mask), what the AMX kernels draw
     * 16 keys at a time against the interpreter's random_uniform */
    {"heads_32_causal_dropout",
     "model m {\n    input x: [70, 6]\n    dense e(units=8, activation=tanh)\n"
     "    multi_head_attention a(num_heads=2, key_dim=32, dropout=0.5, use_causal_mask=true)\n"
     "    global_avg_pool1d g\n" HEAD, 1, 0},
};
#define N_WIDE ((int)(sizeof wide_cases / sizeof *wide_cases))

static __attribute__((unused)) mpt_model *load_src(const char *name, const char *src, int training) {
    mpt_lower_opts lo = {.batch_size = BATCH, .training = training};
    mpt_model *m = NULL;
    int bad = mpt_lang_load_string(name, src, &lo, &m, stderr);
    CHECK_MSG(bad == 0 && m, "%s does not load", name);
    return bad ? NULL : m;
}

/* padding masks: sample 0 fully masked, the others a prefix of ones */
static __attribute__((unused)) void plant_masks(const mpt_graph *g, mpt_tensor *in) {
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

static __attribute__((unused)) int count_op(const mpt_graph *g, mpt_op op) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
    return n;
}

static __attribute__((unused)) mpt_graph *typed_of(const mpt_model *m, const char *policy) {
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

static __attribute__((unused)) mpt_graph *rewrite(const mpt_graph *fwd, const char *refuse, mpt_attention_note *note) {
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

static __attribute__((unused)) mpt_graph *train_step(const mpt_graph *typed, const mpt_model *m, const char *policy) {
    char err[512];
    mpt_train_opts to = {.loss = m->train.loss, .opt = m->train.optimizer,
                         .loss_scale = m->train.loss_scale, .metrics = {.accuracy = 1}};
    to.loss_scale.mode = strcmp(policy, "mixed_float16") ? MPT_LS_NONE : MPT_LS_DYNAMIC;
    mpt_graph *step = mpt_train_step(typed, &to, err, sizeof err);
    CHECK_MSG(step != NULL, "train step: %s", err);
    return step;
}

static __attribute__((unused)) mpt_plan *plan_of(const mpt_graph *step, int enabled) {
    mpt_fusion_opts fo;
    mpt_fusion_opts_default(&fo);
    fo.enabled = enabled;
    return mpt_fuse(step, &fo);
}

#endif
