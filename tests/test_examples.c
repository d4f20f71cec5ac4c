/* tests/test_examples.c — every example in examples/ *.mpt through the whole
 * compile pipeline (the same mpt_session_open the CLI uses), at batch 4,
 * under float32, mixed_float16 and mixed_bfloat16:
 *
 *   (a) the forward, typed, train-step and eval-step graphs print, parse
 *       back, verify and print to the same text;
 *   (b) kernel counts of the train step, fused and unfused, against
 *       tests/golden/kernels.txt;
 *   (c) for the small examples, two train steps run by the fused plan, the
 *       unfused plan and the plain interpreter from the same state and data
 *       agree bit for bit in every output and every variable;
 *   (d) per-layer dtypes (compute, variables, output) against
 *       tests/golden/<example>.dtypes.
 *
 * Golden files are text, so a change shows up as a readable diff. After a
 * deliberate change to fusion or the policy, regenerate them with
 *   build/tests/test_examples --update
 * and review `git diff tests/golden`. Run from the repository root. */
#include <glob.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime/train/train.h"

#define BATCH 4
#define GOLDEN_DIR "tests/golden"

static const char *const policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
#define N_POLICIES ((int)(sizeof policies / sizeof *policies))

/* Executed on the interpreter; the others (ResNet-50, the 256x256 convnet,
 * the 4096-wide MLPs) are far too slow there and get structural checks only. */
static const char *const executed[] = {"mlp_small", "convnet_small", "text_tiny"};

static int update_mode;

/* ---- a growing text buffer ------------------------------------------------ */

typedef struct {
    char *s;
    size_t len, cap;
} text;

static void text_add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_add(text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (t->len + (size_t)n + 1 > t->cap) {
        t->cap = (t->len + (size_t)n + 1) * 2;
        t->s = realloc(t->s, t->cap);
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    text t = {0};
    char buf[4096];
    size_t n;
    text_add(&t, "%s", "");
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) text_add(&t, "%.*s", (int)n, buf);
    fclose(f);
    return t.s;
}

/* Compares `got` with the golden file, or writes it in --update mode. A
 * mismatch prints the first differing line of each side. */
static void check_golden(const char *path, const char *got) {
    if (update_mode) {
        FILE *f = fopen(path, "w");
        CHECK_MSG(f != NULL, "cannot write %s", path);
        if (f) {
            fputs(got, f);
            fclose(f);
            printf("updated %s\n", path);
        }
        return;
    }
    char *want = read_file(path);
    CHECK_MSG(want != NULL, "%s is missing; create it with build/tests/test_examples --update", path);
    if (!want) return;
    if (strcmp(want, got) != 0) {
        const char *a = want, *b = got;
        int line = 1;
        while (*a && *a == *b) {
            if (*a == '\n') line++;
            a++, b++;
        }
        while (a > want && a[-1] != '\n') a--, b--;
        CHECK_MSG(0, "%s differs at line %d:\n  golden: %.*s\n  now:    %.*s\n"
                     "  hint: if the change is intended, run build/tests/test_examples --update "
                     "and review git diff %s",
                  path, line, (int)strcspn(a, "\n"), a, (int)strcspn(b, "\n"), b, path);
    }
    free(want);
}

/* ---- (a) the text form round trip ------------------------------------------ */

static void check_round_trip(const char *what, const mpt_graph *g) {
    if (!g) return;
    char *t1 = mpt_graph_to_string(g), err[512], vbuf[512];
    mpt_graph *back = mpt_graph_parse(t1, err, sizeof err);
    CHECK_MSG(back != NULL, "%s: the printed graph does not parse: %s", what, err);
    if (back) {
        const char *v = mpt_graph_verify(back, vbuf, sizeof vbuf);
        CHECK_MSG(v == NULL, "%s: the parsed graph does not verify: %s", what, v);
        char *t2 = mpt_graph_to_string(back);
        CHECK_MSG(strcmp(t1, t2) == 0, "%s: print -> parse -> print changed the text", what);
        CHECK(back->n_nodes == g->n_nodes && back->n_outputs == g->n_outputs &&
              back->n_updates == g->n_updates);
        free(t2);
        mpt_graph_free(back);
    }
    free(t1);
}

/* ---- (c) fused == unfused == interpreter ------------------------------------ */

static unsigned next_rand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return (*s >> 8) & 0xffffff;
}

/* The fewest rows of any embedding table: token ids must stay below it. */
static int64_t smallest_vocab(const mpt_graph *g) {
    int64_t v = INT64_MAX;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == MPT_OP_GATHER) {
            int64_t rows = g->nodes[g->nodes[i].in[0]].shape.dim[0];
            if (rows < v) v = rows;
        }
    return v == INT64_MAX ? 1 : v;
}

/* x: pixels in [0,1) or token ids; y: class ids, or one-hot targets. */
static void fill_batch(const mpt_graph *g, mpt_tensor *in, unsigned seed) {
    int y_id = mpt_graph_find_input(g, "y");
    int x_id = mpt_graph_find_input(g, "x");
    int64_t classes = 10;
    int out = mpt_graph_find_output(g, "output");
    if (out >= 0) {
        mpt_shape s = g->nodes[g->outputs[out].node].shape;
        classes = s.dim[s.rank - 1];
    }
    int64_t vocab = smallest_vocab(g);
    for (int k = 0; k < mpt_graph_n_inputs(g); k++) {
        int id = mpt_graph_input_node(g, k);
        const mpt_node *n = &g->nodes[id];
        mpt_tensor_alloc(&in[k], n->dtype, n->shape);
        int64_t count = mpt_shape_numel(n->shape);
        for (int64_t i = 0; i < count; i++) {
            unsigned r = next_rand(&seed);
            double v;
            if (id == y_id && n->dtype == MPT_DT_I32) v = (double)(r % (unsigned)classes);
            else if (id == y_id) v = (i % classes) == (int64_t)(r % (unsigned)classes);
            else if (id == x_id && n->dtype == MPT_DT_I32) v = (double)(r % (unsigned)vocab);
            else v = (double)r / 16777216.0;
            mpt_tensor_set(&in[k], i, v);
        }
    }
}

static int same_bits(const mpt_tensor *a, const mpt_tensor *b) {
    return a->dtype == b->dtype && mpt_shape_eq(a->shape, b->shape) &&
           memcmp(a->data, b->data, mpt_tensor_bytes(a)) == 0;
}

/* Runs two train steps three ways from the same state and data:
 * [0] mpt_interp_run on the whole graph, [1] the fused plan, [2] the
 * unfused plan. Every output and every updated variable must match [0]. */
static void check_bit_identical(const char *what, const mpt_graph *g, const mpt_plan *fused,
                                const mpt_plan *unfused) {
    int ni = mpt_graph_n_inputs(g), nv = mpt_graph_n_variables(g), no = g->n_outputs;
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in);
    mpt_tensor *vars[3], *outs[3];
    static const char *const how[3] = {"interpreter", "fused plan", "unfused plan"};
    char err[512];
    for (int r = 0; r < 3; r++) {
        vars[r] = calloc((size_t)nv + 1, sizeof **vars);
        outs[r] = calloc((size_t)no + 1, sizeof **outs);
        CHECK(mpt_init_variables(g, vars[r], 1234) == 0);
    }
    int loss = mpt_graph_find_output(g, "loss");
    for (int step = 0; step < 2; step++) {
        fill_batch(g, in, 99u + (unsigned)step);
        int rc[3];
        rc[0] = mpt_interp_run(g, in, vars[0], outs[0], NULL, err, sizeof err);
        CHECK_MSG(rc[0] == 0, "%s: interpreter: %s", what, err);
        rc[1] = mpt_plan_interp_run(fused, in, vars[1], outs[1], err, sizeof err);
        CHECK_MSG(rc[1] == 0, "%s: fused plan: %s", what, err);
        rc[2] = mpt_plan_interp_run(unfused, in, vars[2], outs[2], err, sizeof err);
        CHECK_MSG(rc[2] == 0, "%s: unfused plan: %s", what, err);
        if (rc[0] || rc[1] || rc[2]) break;
        /* a step whose loss is not finite would compare NaNs: not a test */
        CHECK_MSG(loss >= 0 && isfinite(mpt_tensor_get(&outs[0][loss], 0)), "%s: loss not finite", what);
        for (int r = 1; r < 3; r++) {
            for (int k = 0; k < no; k++)
                CHECK_MSG(same_bits(&outs[0][k], &outs[r][k]), "%s step %d: output %s of the %s differs",
                          what, step + 1, g->outputs[k].name, how[r]);
            for (int k = 0; k < nv; k++)
                CHECK_MSG(same_bits(&vars[0][k], &vars[r][k]), "%s step %d: variable %s of the %s differs",
                          what, step + 1, g->nodes[mpt_graph_variable_node(g, k)].name, how[r]);
        }
        for (int r = 0; r < 3; r++)
            for (int k = 0; k < no; k++) mpt_tensor_free(&outs[r][k]);
        for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    }
    for (int r = 0; r < 3; r++) {
        for (int k = 0; k < no; k++) mpt_tensor_free(&outs[r][k]);
        for (int k = 0; k < nv; k++) mpt_tensor_free(&vars[r][k]);
        free(vars[r]);
        free(outs[r]);
    }
    for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    free(in);
}

/* ---- (d) per-layer dtypes --------------------------------------------------- */

/* As `mptc check` reads them off the typed graph: compute = the layer's
 * GEMM/conv, else its last op that is not a cast, constant or broadcast;
 * output = its last node; variables = the dtypes of its VARIABLE nodes. */
static void layer_dtypes(text *t, const mpt_graph *g, const mpt_layer_info *L) {
    int gemm = -1, last = -1, last_op = -1;
    unsigned var_dts = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const mpt_node *n = &g->nodes[i];
        if (!n->layer || strcmp(n->layer, L->name) != 0) continue;
        if (n->op == MPT_OP_VARIABLE) {
            var_dts |= 1u << n->dtype;
            continue;
        }
        last = i;
        if (n->op != MPT_OP_CAST && n->op != MPT_OP_CONST && n->op != MPT_OP_BROADCAST) last_op = i;
        mpt_op_kind k = mpt_op_table[n->op].kind;
        if ((k == MPT_KIND_GEMM || k == MPT_KIND_CONV) && gemm < 0) gemm = i;
    }
    int c = gemm >= 0 ? gemm : last_op >= 0 ? last_op : last;
    char vars[64] = "";
    for (int d = 0; d < MPT_DT_COUNT; d++)
        if (var_dts & (1u << d))
            snprintf(vars + strlen(vars), sizeof vars - strlen(vars), "%s%s", *vars ? "," : "",
                     mpt_dtype_name((mpt_dtype)d));
    const char *out = last >= 0 ? mpt_dtype_name(g->nodes[last].dtype) : "-";
    text_add(t, "%-28s %-18s %-6s %-9s ", L->name, L->type,
             c >= 0 ? mpt_dtype_name(g->nodes[c].dtype) : "-", *vars ? vars : "-");
    if (L->dtype) text_add(t, "%-6s dtype=%s\n", out, L->dtype);
    else text_add(t, "%s\n", out);
}

/* ---- one example ------------------------------------------------------------- */

static int is_executed(const char *name) {
    for (size_t i = 0; i < sizeof executed / sizeof *executed; i++)
        if (strcmp(executed[i], name) == 0) return 1;
    return 0;
}

static void check_example(const char *path, text *kernels) {
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(base, "."), base);
    text dtypes = {0};
    text_add(&dtypes, "# %s: layer, type, compute, variables, output dtype per policy (batch %d)\n",
             name, BATCH);
    for (int p = 0; p < N_POLICIES; p++) {
        double t0 = mpt_now();
        mpt_compile_opts o = {.path = path, .policy = policies[p], .batch_size = BATCH, .xla = 1,
                              .device = "interp", .want_eval = 1, .diag = stderr};
        mpt_session *s = NULL;
        int rc = mpt_session_open(&o, &s);
        CHECK_MSG(rc == 0 && s, "%s under %s does not compile", path, policies[p]);
        if (rc || !s) continue;
        char what[160];
        snprintf(what, sizeof what, "%s %s", name, policies[p]);

        const char *stage[4] = {"forward", "typed", "train step", "eval step"};
        const mpt_graph *gs[4] = {s->model->graph, s->typed, s->train, s->eval};
        for (int k = 0; k < 4; k++) {
            char w[200];
            snprintf(w, sizeof w, "%s %s", what, stage[k]);
            CHECK_MSG(gs[k] != NULL, "%s: no graph", w);
            check_round_trip(w, gs[k]);
        }

        mpt_fusion_opts fo;
        mpt_fusion_opts_default(&fo);
        fo.enabled = 0;
        mpt_plan *unfused = mpt_fuse(s->train, &fo);
        CHECK(s->train_plan->n_kernels < unfused->n_kernels);
        text_add(kernels, "%s %s fused %d unfused %d\n", name, policies[p], s->train_plan->n_kernels,
                 unfused->n_kernels);

        if (is_executed(name)) check_bit_identical(what, s->train, s->train_plan, unfused);

        text_add(&dtypes, "policy %s\n", policies[p]);
        for (int i = 0; i < s->model->n_layers; i++) layer_dtypes(&dtypes, s->typed, &s->model->layers[i]);
        printf("%-32s %4d nodes, %4d kernels fused, %5d unfused%s (%.2fs)\n", what, s->train->n_nodes,
               s->train_plan->n_kernels, unfused->n_kernels, is_executed(name) ? ", executed" : "",
               mpt_now() - t0);
        mpt_plan_free(unfused);
        mpt_session_free(s);
    }
    char gpath[256];
    snprintf(gpath, sizeof gpath, GOLDEN_DIR "/%s.dtypes", name);
    check_golden(gpath, dtypes.s);
    free(dtypes.s);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--update") == 0) update_mode = 1;
        else {
            fprintf(stderr, "usage: %s [--update]  (run from the repository root)\n", argv[0]);
            return 2;
        }
    }
    glob_t gl;
    if (glob("examples/*.mpt", 0, NULL, &gl) != 0 || gl.gl_pathc == 0) {
        fprintf(stderr, "test_examples: no examples/*.mpt here; run it from the repository root\n");
        return 1;
    }
    text kernels = {0};
    text_add(&kernels, "# train-step kernels at batch %d: example policy fused N unfused M\n", BATCH);
    for (size_t i = 0; i < gl.gl_pathc; i++) check_example(gl.gl_pathv[i], &kernels);
    check_golden(GOLDEN_DIR "/kernels.txt", kernels.s);
    /* every executed example must exist, or (c) silently checks nothing */
    for (size_t e = 0; e < sizeof executed / sizeof *executed; e++) {
        int found = 0;
        for (size_t i = 0; i < gl.gl_pathc; i++) found |= strstr(gl.gl_pathv[i], executed[e]) != NULL;
        CHECK_MSG(found, "examples/%s.mpt is gone", executed[e]);
    }
    free(kernels.s);
    globfree(&gl);
    return check_exit("test_examples");
}
