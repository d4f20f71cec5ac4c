/* tests/test_views.c — reshapes as views of their operand's buffer: the
 * plan writes no reshape (the fused plan of a layer norm read by three
 * projections, weights and biases reshaped for their GEMMs), the views keep
 * their root alive and forbid an in-place update a later view reader would
 * see; the plan on the interpreter (bit for bit) and the CPU backend (fused
 * and unfused) agree with the reference interpreter over several steps. */
#include "cpu_check.h"
#include "plan_check.h"

static int count_kind(const mpt_plan *p, mpt_kernel_kind k) {
    int n = 0;
    for (int i = 0; i < p->n_kernels; i++) n += p->kernels[i].kind == k;
    return n;
}

static int non_sources(const mpt_graph *g) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++)
        n += g->nodes[i].op != MPT_OP_INPUT && g->nodes[i].op != MPT_OP_VARIABLE &&
             g->nodes[i].op != MPT_OP_CONST;
    return n;
}

/* cpu_check.h's draw (no special values), the same for every step */
static void fill_step(const mpt_graph *g, mpt_tensor *in, int s) { fill_inputs(g, in, 0); }

/* The plan run kernel by kernel on the interpreter (views fed as their
 * root's bytes) against the graph run whole, bit for bit, for `steps`
 * steps: outputs and updated variables. */
static void plan_matches_interp(const mpt_graph *g, const mpt_plan *p, int steps) {
    const char *name = "fused";
    plans_bit_identical(g, &p, &name, 1, steps, fill_step);
}

/* A layer norm's output read by three projections through reshapes to
 * [B*T, C], their weights [C, H, D] and biases [H, D] reshaped too (as
 * multi_head_attention lowers); and one weight updated by a kernel that
 * runs before the GEMM reading it. Every reshape is a view: no kernel
 * writes one, the loop writes y once (not once per reshape), and the
 * update may not be written over the weight a later GEMM reads through
 * its view. */
static mpt_shape shape_3(int64_t a, int64_t b, int64_t c) {
    mpt_shape s = mpt_shape_2(a, b);
    s.rank = 3;
    s.dim[2] = c;
    return s;
}

static mpt_graph *views_graph(int *y_out, int *reshapes, int *n_reshapes) {
    mpt_graph *g = mpt_graph_new("views");
    mpt_b_layer(g, "proj");
    int w[3], b[3];
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "proj/kernel_%d", i);
        w[i] = mpt_b_variable(g, name, shape_3(8, 2, 4), MPT_INIT_GLOROT_UNIFORM, 8, 8, 0, 1);
        snprintf(name, sizeof name, "proj/bias_%d", i);
        b[i] = mpt_b_variable(g, name, mpt_shape_2(2, 4), MPT_INIT_UNIFORM, 0, 0, 0.5, 1);
    }
    /* created first, so its kernel comes first */
    mpt_graph_add_update(g, w[0], mpt_b_binary(g, MPT_OP_MUL, w[0],
                                               mpt_b_const(g, MPT_DT_F32, shape_3(8, 2, 4), 0.5)));
    mpt_b_layer(g, "ln");
    int x = mpt_b_input(g, "x", MPT_DT_F32, shape_3(2, 6, 8));
    int s = mpt_b_variable(g, "ln/gamma", mpt_shape_1(8), MPT_INIT_UNIFORM, 0, 0, 1, 1);
    int y = mpt_b_binary(g, MPT_OP_ADD, mpt_b_binary(g, MPT_OP_MUL, x, mpt_b_broadcast_to(g, s, shape_3(2, 6, 8))), x);
    mpt_b_layer(g, "proj");
    *n_reshapes = 0;
    for (int i = 0; i < 3; i++) {
        int r = mpt_b_reshape(g, y, mpt_shape_2(12, 8));
        int wr = mpt_b_reshape(g, w[i], mpt_shape_2(8, 8));
        int br = mpt_b_reshape(g, b[i], mpt_shape_1(8));
        reshapes[(*n_reshapes)++] = r;
        reshapes[(*n_reshapes)++] = wr;
        reshapes[(*n_reshapes)++] = br;
        int z = mpt_b_binary(g, MPT_OP_ADD, mpt_b_matmul(g, r, wr, 0, 0),
                             mpt_b_broadcast_to(g, br, mpt_shape_2(12, 8)));
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        mpt_graph_add_output(g, name, mpt_b_unary(g, MPT_OP_RELU, z));
    }
    *y_out = y;
    return g;
}

static void test_reshape_views(void) {
    int y, r[9], nr;
    mpt_graph *g = views_graph(&y, r, &nr);
    mpt_plan *f = fuse_with(g, 1, 0, 0), *u = fuse_with(g, 0, 0, 0);
    CHECK_MSG(f->n_kernels == 5 && count_kind(f, MPT_KERNEL_GEMM) == 3,
              "%d kernels: the update, y's loop and three GEMMs", f->n_kernels);
    CHECK(f->n_views == nr);
    for (int i = 0; i < nr; i++) CHECK(f->view_of[r[i]] == g->nodes[r[i]].in[0]);
    for (int k = 0; k < f->n_kernels; k++) {
        const mpt_kernel *K = &f->kernels[k];
        for (int i = 0; i < K->n_nodes; i++)
            CHECK_MSG(g->nodes[K->nodes[i]].op != MPT_OP_RESHAPE, "kernel %s copies a reshape", K->name);
        if (K->kind != MPT_KERNEL_GEMM) continue;
        CHECK(K->n_inputs == 3);
        for (int i = 0; i < K->n_inputs; i++) CHECK(f->view_of[K->inputs[i]] >= 0);
    }
    const mpt_kernel *L = &f->kernels[f->kernel_of[y]];
    CHECK(L->kind == MPT_KERNEL_LOOP && L->n_outputs == 1 && L->outputs[0] == y);
    /* the GEMM reads w0 through its view after the update's kernel ran */
    CHECK(f->kernel_of[g->updates[0].value] < f->kernel_of[g->outputs[0].node]);
    CHECK(!mpt_plan_update_in_place(f, 0));
    /* y, read through three views, stays alive until the last GEMM */
    for (int i = 0; i < f->n_buffers; i++)
        if (f->buffers[i].node == y) CHECK(f->buffers[i].last == f->n_kernels - 1);
    /* unfused, every reshape is a kernel of its own */
    CHECK(u->n_views == 0 && u->n_kernels == non_sources(g));
    CHECK(f->bytes_moved < u->bytes_moved);
    /* every kernel reads what an earlier one wrote, through views too */
    for (int k = 0; k < f->n_kernels; k++)
        for (int i = 0; i < f->kernels[k].n_inputs; i++)
            CHECK(f->kernel_of[mpt_plan_storage(f, f->kernels[k].inputs[i])] < k);
    plan_matches_interp(g, f, 2);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    mpt_plan_print(f, m, 1);
    fclose(m);
    CHECK_MSG(text && strstr(text, "views (9): ") && strstr(text, "(view of %"),
              "explain names the views:\n%s", text ? text : "");
    free(text);
    mpt_plan_free(u);
    mpt_plan_free(f);
    mpt_graph_free(g);
}

/* The same graph as train steps on the CPU backend: the GEMMs read y and
 * the weights through views, and the first weight's update must not land
 * before its GEMM read it. */
static void test_cpu_steps(void) {
    int y, r[9], nr;
    mpt_graph *g = views_graph(&y, r, &nr);
    run_both(g, 3, tol_for(TOL_ACCUM, MPT_DT_F32, 8), 0, "reshape views", BOTH);
    mpt_graph_free(g);
}

int main(void) {
    char why[256];
    test_reshape_views();
    if (!mpt_backend_cpu.available(why, sizeof why)) {
        printf("skipped: the CPU JIT is not available here: %s\n", why);
        return check_exit("test_views");
    }
    test_cpu_steps();
    return check_exit("test_views");
}
