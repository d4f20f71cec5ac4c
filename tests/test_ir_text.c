/* tests/test_ir_text.c — the IR text form round-trips every op, parse errors
 * carry line:col, the parser survives mangled text, and the verifier finds
 * planted faults. */
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "tests/check.h"

/* A graph using every op of ops.def at least once (the test checks that). */
static mpt_graph *build_all_ops(void) {
    mpt_graph *g = mpt_graph_new("all_ops");
    mpt_b_layer(g, "dense_1");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(4, 6));
    int w = mpt_b_variable(g, "dense_1/kernel", mpt_shape_2(6, 3), MPT_INIT_GLOROT_UNIFORM, 6, 3,
                           0, 1);
    int mm = mpt_b_matmul(g, x, w, 0, 0);             /* [4,3] */
    int mm_t = mpt_b_matmul(g, mm, w, 0, 1);          /* [4,6] */
    int gram = mpt_b_matmul(g, x, mm_t, 1, 0);        /* [6,6] */
    int both = mpt_b_matmul(g, gram, gram, 1, 1);     /* [6,6] */
    mpt_b_layer(g, "block 1/\"odd\"\tname");
    int half = mpt_b_const(g, MPT_DT_F32, mpt_shape_scalar(), 0.1);
    int halfb = mpt_b_broadcast_to(g, half, mpt_shape_2(4, 3));
    int u = mm;
    static const mpt_op unary[] = {MPT_OP_NEG,   MPT_OP_ABS,   MPT_OP_EXP,     MPT_OP_LOG,
                                   MPT_OP_SQRT,  MPT_OP_RSQRT, MPT_OP_RECIP,   MPT_OP_SQUARE,
                                   MPT_OP_RELU,  MPT_OP_SIGMOID, MPT_OP_TANH, MPT_OP_GELU,
                                   MPT_OP_GELU_GRAD, MPT_OP_SIN, MPT_OP_COS};
    for (size_t k = 0; k < sizeof unary / sizeof unary[0]; k++) u = mpt_b_unary(g, unary[k], u);
    static const mpt_op binary[] = {MPT_OP_ADD, MPT_OP_SUB, MPT_OP_MUL, MPT_OP_DIV,
                                    MPT_OP_MAX, MPT_OP_MIN, MPT_OP_POW};
    for (size_t k = 0; k < sizeof binary / sizeof binary[0]; k++)
        u = mpt_b_binary(g, binary[k], u, halfb);
    mpt_b_layer(g, NULL);
    int h = mpt_b_cast(g, u, MPT_DT_F16);
    int fin = mpt_b_unary(g, MPT_OP_IS_FINITE, h);
    int lt = mpt_b_binary(g, MPT_OP_LT, u, halfb);
    int gt = mpt_b_binary(g, MPT_OP_GT, u, halfb);
    int eq = mpt_b_binary(g, MPT_OP_EQ, u, halfb);
    int both_b = mpt_b_binary(g, MPT_OP_AND, lt, mpt_b_unary(g, MPT_OP_NOT, gt));
    int sel = mpt_b_select(g, mpt_b_binary(g, MPT_OP_AND, both_b, eq), u, halfb);
    int all = mpt_b_reduce(g, MPT_OP_REDUCE_ALL, fin, 3);
    int sum = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, sel, 2);  /* [4] */
    int mx = mpt_b_reduce(g, MPT_OP_REDUCE_MAX, both, 1);  /* [6] */
    int am = mpt_b_argmax(g, sel, 1);                      /* i32[4] */
    int rs = mpt_b_reshape(g, sel, mpt_shape_2(2, 6));
    int perm[2] = {1, 0};
    int tr = mpt_b_transpose(g, rs, perm);
    int ids = mpt_b_input(g, "ids", MPT_DT_I32, mpt_shape_1(5));
    int oh = mpt_b_one_hot(g, ids, 10, MPT_DT_F32);
    int table = mpt_b_variable(g, "embedding/table", mpt_shape_2(10, 3), MPT_INIT_UNIFORM, 0, 0,
                               0.05, 1);
    int gat = mpt_b_gather(g, table, ids);                 /* [5,3] */
    int sca = mpt_b_scatter_add(g, ids, gat, 10);          /* [10,3] */
    int io = mpt_b_iota(g, MPT_DT_I32, mpt_shape_2(2, 3), 1);
    int step = mpt_b_variable_dt(g, "step", MPT_DT_I32, mpt_shape_scalar(), MPT_INIT_ZEROS, 0);
    int rnd = mpt_b_random_uniform(g, step, mpt_shape_2(4, 3), -7);
    int img = mpt_b_input(g, "img", MPT_DT_F32, mpt_shape_4(2, 5, 5, 3));
    int filt = mpt_b_variable(g, "conv/kernel", mpt_shape_4(3, 3, 3, 4), MPT_INIT_HE_NORMAL, 27,
                              36, 0, 1);
    int64_t lo, hi, o;
    mpt_same_padding(5, 3, 2, &lo, &hi, &o);
    int cv = mpt_b_conv2d(g, img, filt, 2, 2, (int)lo, (int)lo, mpt_shape_4(2, o, o, 4));
    int dx = mpt_b_conv2d_bwd_data(g, cv, filt, 2, 2, (int)lo, (int)lo, mpt_shape_4(2, 5, 5, 3));
    int dw = mpt_b_conv2d_bwd_filter(g, img, cv, 2, 2, (int)lo, (int)lo, mpt_shape_4(3, 3, 3, 4));
    mpt_same_padding(5, 2, 2, &lo, &hi, &o);
    int mp = mpt_b_pool(g, MPT_OP_MAX_POOL, img, 2, 2, 2, 2, (int)lo, (int)lo, mpt_shape_4(2, o, o, 3));
    int ap = mpt_b_pool(g, MPT_OP_AVG_POOL, img, 3, 3, 1, 1, 1, 1, mpt_shape_4(2, 5, 5, 3));
    int mpg = mpt_b_max_pool_grad(g, img, mp, &g->nodes[mp].attr);
    int apg = mpt_b_avg_pool_grad(g, ap, &g->nodes[ap].attr, mpt_shape_4(2, 5, 5, 3));
    int ones = mpt_b_const(g, MPT_DT_I32, mpt_shape_scalar(), 1);
    int inf = mpt_b_const(g, MPT_DT_F32, mpt_shape_1(2), -1.0 / 0.0);
    int nan = mpt_b_const(g, MPT_DT_F64, mpt_shape_1(2), 0.0 / 0.0);
    int negz = mpt_b_const(g, MPT_DT_BF16, mpt_shape_1(2), -0.0);

    int sl = mpt_b_slice(g, sca, 0, 3, 5);                /* [5,3] */
    int cat = mpt_b_concat(g, sl, gat, 1);                /* [5,6] */
    int bm4 = mpt_b_batch_matmul(g, cv, cv, 0, 1);        /* [2,3,3,3] */
    int q = mpt_b_input(g, "q", MPT_DT_BF16, mpt_shape_make(3, (const int64_t[]){4, 5, 2}));
    int bm3 = mpt_b_batch_matmul(g, q, q, 1, 0);          /* bf16[4,2,2] */
    int ar = mpt_b_allreduce(g, inf);                       /* f32[2] */
    int rsc = mpt_b_shard_op(g, MPT_OP_REDUCE_SCATTER, ar, 1); /* f32[1] */
    int ag = mpt_b_shard_op(g, MPT_OP_ALL_GATHER, rsc, 2);
    int rsl = mpt_b_shard_op(g, MPT_OP_RANK_SLICE, negz, 1);
    int am2 = mpt_b_const(g, MPT_DT_BOOL, mpt_shape_2(2, 3), 1); /* attention's mask [B, Tk] */
    mpt_attr aa = {.i = {1, 1, 0, 7, 1 << 22, 0x3faaaaab}, .f = 0.5}; /* dropout 0.25 */
    int att = mpt_b_attention(g, (const int[]){cv, cv, cv, am2, step}, &aa); /* [2,3,3,3] */
    int lse = mpt_b_attention_lse(g, cv, cv, am2, 1, 0, 0.5);              /* f32[2,3,3] */
    aa.i[0] = 2;
    int agr = mpt_b_attention_grad(g, (const int[]){cv, cv, cv, att, att, lse, am2, step}, &aa);
    int outs[] = {all, sum, mx, am, tr, oh, sca, io, rnd, dx, dw, mpg, apg, inf, nan, negz, cat,
                  bm4, bm3, ar, ag, rsl, att, lse, agr};
    for (size_t k = 0; k < sizeof outs / sizeof outs[0]; k++) {
        char nm[32];
        snprintf(nm, sizeof nm, "out%zu", k);
        mpt_graph_add_output(g, nm, outs[k]);
    }
    mpt_graph_add_output(g, "odd \"name\"\n", mm);
    mpt_graph_add_update(g, w, mpt_b_binary(g, MPT_OP_SUB, w, mpt_b_broadcast_to(g, half,
                                                                                  mpt_shape_2(6, 3))));
    mpt_graph_add_update(g, step, mpt_b_binary(g, MPT_OP_ADD, step, ones));
    return g;
}

static int str_eq(const char *a, const char *b) {
    if (!a || !b) return a == b;
    return strcmp(a, b) == 0;
}

static int same_double(double a, double b) {
    return memcmp(&a, &b, sizeof a) == 0 || (a != a && b != b);
}

/* node-by-node, field-by-field equality */
static int graphs_equal(const mpt_graph *a, const mpt_graph *b) {
    int ok = 1;
    CHECK(str_eq(a->name, b->name));
    CHECK(a->n_nodes == b->n_nodes && a->n_outputs == b->n_outputs &&
          a->n_updates == b->n_updates);
    if (a->n_nodes != b->n_nodes || a->n_outputs != b->n_outputs || a->n_updates != b->n_updates)
        return 0;
    for (int i = 0; i < a->n_nodes; i++) {
        const mpt_node *x = &a->nodes[i], *y = &b->nodes[i];
        int same = x->op == y->op && x->dtype == y->dtype && mpt_shape_eq(x->shape, y->shape) &&
                   x->n_in == y->n_in && str_eq(x->name, y->name) && str_eq(x->layer, y->layer) &&
                   same_double(x->attr.f, y->attr.f) && x->attr.dt == y->attr.dt;
        for (int k = 0; k < x->n_in && same; k++) same = x->in[k] == y->in[k];
        for (int k = 0; k < MPT_MAX_ATTRS && same; k++) same = x->attr.i[k] == y->attr.i[k];
        CHECK_MSG(same, "node %d (%s) differs after the round trip", i, mpt_op_name(x->op));
        ok &= same;
    }
    for (int k = 0; k < a->n_outputs; k++) {
        CHECK(str_eq(a->outputs[k].name, b->outputs[k].name));
        CHECK(a->outputs[k].node == b->outputs[k].node);
    }
    for (int k = 0; k < a->n_updates; k++) {
        CHECK(a->updates[k].var == b->updates[k].var);
        CHECK(a->updates[k].value == b->updates[k].value);
    }
    return ok;
}

static void test_round_trip(void) {
    mpt_graph *g = build_all_ops();
    char buf[512];
    const char *e = mpt_graph_verify(g, buf, sizeof buf);
    CHECK_MSG(e == NULL, "%s", e);

    int used[MPT_OP_COUNT] = {0};
    for (int i = 0; i < g->n_nodes; i++) used[g->nodes[i].op] = 1;
    for (int op = 0; op < MPT_OP_COUNT; op++)
        CHECK_MSG(used[op], "op %s is not in the round-trip graph", mpt_op_name((mpt_op)op));

    char *s1 = mpt_graph_to_string(g);
    char err[256] = "";
    mpt_graph *g2 = mpt_graph_parse(s1, err, sizeof err);
    CHECK_MSG(g2 != NULL, "%s", err);
    if (g2) {
        char *s2 = mpt_graph_to_string(g2);
        CHECK_MSG(strcmp(s1, s2) == 0, "print(parse(print(g))) differs:\n%s\n---\n%s", s1, s2);
        CHECK(graphs_equal(g, g2));
        CHECK(mpt_graph_verify(g2, buf, sizeof buf) == NULL);
        free(s2);
        mpt_graph_free(g2);
    }
    /* spot checks of the documented spelling */
    CHECK(strstr(s1, "graph all_ops {\n") == s1);
    CHECK(strstr(s1, "= input \"x\" : f32[4,6] @dense_1\n") != NULL);
    CHECK(strstr(s1, "= matmul(%0, %1) {trans_a=0, trans_b=0} : f32[4,3] @dense_1\n") != NULL);
    CHECK(strstr(s1, "{f=0.10000000149011612} : f32[]") != NULL);
    CHECK(strstr(s1, "@\"block 1/\\\"odd\\\"\\tname\"\n") != NULL);
    CHECK(strstr(s1, "{f=-inf} : f32[2]") != NULL);
    CHECK(strstr(s1, "{f=nan} : f64[2]") != NULL);
    CHECK(strstr(s1, "{f=-0} : bf16[2]") != NULL);
    CHECK(strstr(s1, "random_uniform(%") != NULL && strstr(s1, "{seed=-7, rank_stride=0} : f32[4,3]") != NULL);
    CHECK(strstr(s1, "output \"odd \\\"name\\\"\\n\" = %2\n") != NULL);
    CHECK(strstr(s1, "update %1 = %") != NULL);
    CHECK(strstr(s1, "{perm=0x1} : f32[6,2]") != NULL);
    CHECK(strstr(s1, "reduce_sum(%38) {axes=0b10} : f32[4]") != NULL);
    CHECK(strstr(s1, "broadcast(%6) {dims=0b0} : f32[4,3]") != NULL);
    CHECK_MSG(strstr(s1, "{axis=0, start=3} : f32[5,3]") && strstr(s1, "{axis=1} : f32[5,6]"),
              "slice and concat spelled as documented:\n%s", s1);
    CHECK_MSG(strstr(s1, "{trans_a=0, trans_b=1, f32_out=0} : f32[2,3,3,3]") &&
              strstr(s1, "{trans_a=1, trans_b=0, f32_out=0} : bf16[4,2,2]") &&
              strstr(s1, "= batch_matmul(%"),
              "batch_matmul spelled as documented:\n%s", s1);
    free(s1);
    mpt_graph_free(g);
}

static void test_hand_written(void) {
    const char *text =
        "# a comment before the graph\n"
        "graph \"tiny net\" {\n"
        "  %0 = input \"x\" : f32[2,3]   # trailing comment\n"
        "  %1 = variable \"w\" {init=1, trainable=1} : f32[3,2] @dense\n"
        "  %2=matmul(%0,%1){trans_b=0,trans_a=0}:f32[2,2]@dense\n"
        "  %3 = cast(%2) : bf16[2,2]\n"
        "  %4 = const {f=1e-3} : f32[3,2]\n"
        "  %5 = sub(%1, %4) : f32[3,2]\n"
        "  %6 = transpose(%5) {perm=0x01} : f32[2,3]\n"
        "  %7 = reduce_sum(%6) {axes=0b10} : f32[2]\n"
        "  %8 = iota {axis=-0} : i32[4]\n"
        "  output \"y\" = %3\n"
        "  update %1 = %5\n"
        "}\n";
    char err[256] = "";
    mpt_graph *g = mpt_graph_parse(text, err, sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    if (!g) return;
    CHECK(str_eq(g->name, "tiny net"));
    CHECK(g->n_nodes == 9 && g->n_outputs == 1 && g->n_updates == 1);
    CHECK(g->nodes[6].attr.i[0] == 1 && g->nodes[7].attr.i[0] == 2);
    CHECK(g->nodes[1].attr.i[0] == MPT_INIT_ONES && g->nodes[1].attr.i[1] == 0 &&
          g->nodes[1].attr.i[3] == 1);
    CHECK(g->nodes[3].attr.dt == MPT_DT_BF16);
    CHECK(g->nodes[4].attr.f == 1e-3);
    CHECK(str_eq(g->nodes[2].layer, "dense") && g->nodes[3].layer == NULL);
    char buf[256];
    const char *e = mpt_graph_verify(g, buf, sizeof buf);
    CHECK_MSG(e == NULL, "%s", e);
    mpt_graph_free(g);
}

/* each malformed text must fail with exactly this "line:col: ..." prefix and
 * a message containing `what` */
static void expect_parse_error(const char *text, const char *where, const char *what) {
    char err[256] = "";
    mpt_graph *g = mpt_graph_parse(text, err, sizeof err);
    CHECK_MSG(g == NULL, "parsed, but expected error %s %s", where, what);
    mpt_graph_free(g);
    CHECK_MSG(strncmp(err, where, strlen(where)) == 0 && strstr(err, what) != NULL,
              "error \"%s\", expected \"%s ...%s...\"", err, where, what);
}

static void test_parse_errors(void) {
    expect_parse_error("", "1:1:", "graph");
    expect_parse_error("  \n  grph x {}", "2:3:", "expected 'graph");
    expect_parse_error("graph g {\n  %0 = input \"x\" : f32[2]\n", "3:1:", "end of the text");
    expect_parse_error("graph g {\n  %1 = input \"x\" : f32[2]\n}", "2:4:", "expected %0");
    expect_parse_error("graph g {\n  %0 = frobnicate \"x\" : f32[2]\n}", "2:8:", "unknown op 'frobnicate'");
    expect_parse_error("graph g {\n  %0 = input \"x\" : f31[2]\n}", "2:20:", "unknown dtype 'f31'");
    expect_parse_error("graph g {\n  %0 = input \"x\" : f32[2\n}", "3:1:", "']'");
    expect_parse_error("graph g {\n  %0 = input \"x : f32[2]\n}", "2:14:", "unterminated string");
    expect_parse_error("graph g {\n  %0 = input \"x\" : f32[2]\n  %1 = neg(%0, %0) : f32[2]\n}",
                       "3:16:", "neg takes 1 input");
    expect_parse_error("graph g {\n  %0 = input \"x\" : f32[2]\n  %1 = add(%0) : f32[2]\n}",
                       "3:15:", "add takes 2 inputs, got 1");
    expect_parse_error("graph g {\n  %0 = input \"x\" : f32[2]\n  %1 = neg(%3) : f32[2]\n}",
                       "3:12:", "%3 is not defined yet");
    expect_parse_error("graph g {\n  %0 = input \"x\" : f32[2] {axis=1}\n}", "2:27:", "expected");
    expect_parse_error("graph g {\n  %0 = iota {axes=1} : i32[2]\n}", "2:14:", "iota has no attribute 'axes'");
    expect_parse_error("graph g {\n  %0 = iota {axis=1, axis=0} : i32[2]\n}", "2:22:", "given twice");
    expect_parse_error("graph g {\n  %0 = iota {axis=x} : i32[2]\n}", "2:19:", "an integer");
    expect_parse_error("graph g {\n  %0 = iota {axis=0b2} : i32[2]\n}", "2:19:", "an integer");
    expect_parse_error("graph g {\n  %0 = iota {axis=0x8000000000000000} : i32[2]\n}", "2:19:",
                       "out of range");
    expect_parse_error("graph g {\n  %0 = iota {axis=99999999999999999999} : i32[2]\n}", "2:19:",
                       "out of range");
    expect_parse_error("graph g {\n  %0 = input \"x\" : f32[1,1,1,1,1,1,1]\n}", "2:36:", "more than 6 dims");
    expect_parse_error("graph g {\n  %0 = input \"x\" : f32[-2]\n}", "2:24:", "out of range");
    expect_parse_error("graph g {\n  %0 = input \"a\\q\" : f32[2]\n}", "2:16:", "unknown escape");
    expect_parse_error("graph g {\n  %0 = input \"x\" : f32[2]\n  update %0 = %0\n}", "3:10:",
                       "only variables are updated");
    expect_parse_error("graph g {\n  %0 = variable \"v\" : f32[2]\n  update %0 = %0\n  update %0 = %0\n}",
                       "4:10:", "already updated");
    expect_parse_error("graph g {\n  output y = %0\n}", "2:10:", "quoted string");
    expect_parse_error("graph g {\n  output \"y\" = %0\n}", "2:16:", "not defined yet");
    expect_parse_error("graph g {\n  nodes\n}", "2:3:", "found 'nodes'");
    expect_parse_error("graph g {\n}\nextra", "3:1:", "text after the end");
    /* a NULL text and a zero-length error buffer are handled */
    CHECK(mpt_graph_parse(NULL, NULL, 0) == NULL);
}

/* Every prefix and many single-byte corruptions of a real graph's text must
 * parse or fail cleanly, and whatever parses must verify or fail cleanly. */
static void test_parser_survives_mangling(void) {
    mpt_graph *g = build_all_ops();
    char *s = mpt_graph_to_string(g);
    mpt_graph_free(g);
    size_t n = strlen(s);
    char *t = malloc(n + 1);
    char err[256], buf[256];
    int bad_errors = 0, parsed = 0;
    static const char junk[] = "%{}()[]\",=:@#\\ \n0-9xfi";
    uint64_t r = 12345;
    for (size_t i = 0; i < n + 1200; i++) {
        memcpy(t, s, n + 1);
        if (i <= n) {
            t[i] = 0; /* every prefix */
        } else {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            t[(r >> 33) % n] = junk[(r >> 20) % (sizeof junk - 1)];
        }
        err[0] = 0;
        mpt_graph *h = mpt_graph_parse(t, err, sizeof err);
        if (h) {
            parsed++;
            mpt_graph_verify(h, buf, sizeof buf);
            mpt_graph_free(h);
        } else {
            int line, col;
            bad_errors += sscanf(err, "%d:%d:", &line, &col) != 2 || line < 1 || col < 1;
        }
    }
    CHECK_MSG(bad_errors == 0, "%d errors without line:col", bad_errors);
    CHECK(parsed >= 1); /* the full text at least */
    free(t);
    free(s);
}

static void expect_verify_error(mpt_graph *g, const char *what) {
    char buf[256];
    const char *e = mpt_graph_verify(g, buf, sizeof buf);
    CHECK_MSG(e != NULL && strstr(e, what) != NULL, "verify said \"%s\", expected \"...%s...\"",
              e ? e : "(sound)", what);
}

static mpt_graph *small_graph(void) {
    mpt_graph *g = mpt_graph_new("small");
    int x = mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(2, 3));
    int w = mpt_b_variable(g, "w", mpt_shape_2(3, 4), MPT_INIT_ZEROS, 0, 0, 0, 1);
    int y = mpt_b_matmul(g, x, w, 0, 0);
    mpt_b_cast(g, y, MPT_DT_F16);
    mpt_graph_add_output(g, "y", y);
    mpt_graph_add_update(g, w, w);
    return g;
}

static void test_verify(void) {
    mpt_graph *g = small_graph();
    char buf[256];
    CHECK(mpt_graph_verify(g, buf, sizeof buf) == NULL);

    g->nodes[2].shape.dim[1] = 5;
    expect_verify_error(g, "%2 (matmul): its inputs give f32[2,4] but the node says f32[2,5]");
    g->nodes[2].shape.dim[1] = 4;

    g->nodes[2].dtype = MPT_DT_F16;
    expect_verify_error(g, "but the node says f16[2,4]");
    g->nodes[2].dtype = MPT_DT_F32;

    g->nodes[2].in[1] = 7;
    expect_verify_error(g, "%2 (matmul): input 1 is %7, not an earlier node");
    g->nodes[2].in[1] = 2;
    expect_verify_error(g, "input 1 is %2, not an earlier node");
    g->nodes[2].in[1] = 1;

    g->nodes[2].n_in = 1;
    expect_verify_error(g, "has 1 inputs, the op takes 2");
    g->nodes[2].n_in = 2;

    g->nodes[3].attr.dt = MPT_DT_BF16;
    expect_verify_error(g, "%3 (cast): casts to bf16 but the node's dtype is f16");
    g->nodes[3].attr.dt = MPT_DT_F16;

    free(g->nodes[1].name);
    g->nodes[1].name = strdup("x");
    expect_verify_error(g, "%0 (input) and %1 (variable) share the name \"x\"");
    g->nodes[1].name[0] = 0;
    expect_verify_error(g, "%1 (variable): needs a non-empty name");
    g->nodes[1].name[0] = 'w';

    g->nodes[1].attr.i[0] = MPT_INIT_HE_NORMAL;
    expect_verify_error(g, "he_normal needs fan_in > 0");
    g->nodes[1].attr.i[0] = MPT_INIT_ZEROS;

    g->nodes[2].op = MPT_OP_COUNT;
    expect_verify_error(g, "not in the op table");
    g->nodes[2].op = MPT_OP_MATMUL;

    g->outputs[0].node = 9;
    expect_verify_error(g, "output \"y\" refers to %9");
    g->outputs[0].node = 2;

    g->updates[0].value = 2;
    expect_verify_error(g, "update of %1 (\"w\", f32[3,4]) takes %2, which is f32[2,4]");
    g->updates[0].value = 1;
    g->updates[0].var = 0;
    expect_verify_error(g, "targets %0, which is not a variable");
    g->updates[0].var = 1;

    mpt_graph_add_output(g, "y", 3);
    expect_verify_error(g, "two outputs are named \"y\"");
    g->n_outputs = 1;
    free(g->outputs[1].name);

    /* two updates of one variable (the builder merges them, so plant one) */
    mpt_graph_add_update(g, 1, 1);
    g->updates = realloc(g->updates, 2 * sizeof *g->updates);
    g->updates[1] = g->updates[0];
    g->n_updates = g->cap_updates = 2;
    expect_verify_error(g, "is updated twice");
    g->n_updates = 1;

    CHECK(mpt_graph_verify(g, buf, sizeof buf) == NULL);
    mpt_graph_free(g);

    /* the verifier also reads what the parser let through */
    char err[256];
    g = mpt_graph_parse("graph g {\n %0 = input \"x\" : f32[2]\n %1 = exp(%0) : f32[3]\n}", err,
                        sizeof err);
    CHECK(g != NULL);
    if (g) expect_verify_error(g, "%1 (exp): its inputs give f32[2] but the node says f32[3]");
    mpt_graph_free(g);
    g = mpt_graph_parse("graph g {\n %0 = input \"x\" : i32[2]\n %1 = exp(%0) : i32[2]\n}", err,
                        sizeof err);
    if (g) expect_verify_error(g, "%1 (exp): this op needs a float input");
    mpt_graph_free(g);
}

/* slice and concat misused: the verifier (and the builder, which stops on
 * the same message) says what is wrong */
static void test_verify_slice_concat(void) {
    static const struct {
        const char *node, *want;
    } cases[] = {
        {"slice(%0) {axis=1, start=1} : f32[3,2]", NULL},
        {"slice(%0) {axis=2} : f32[3,4]", "%5 (slice): slice axis out of range of the input's rank"},
        {"slice(%0) {axis=1, start=3} : f32[3,2]", "slice [start, start+len) is not within the input"},
        {"slice(%0) {axis=1, start=-1} : f32[3,2]", "is not within the input along the axis"},
        {"slice(%0) {axis=1} : f32[3,5]", "is not within the input along the axis"},
        {"slice(%0) {axis=1} : f32[2,2]", "slice changes a dim other than its axis"},
        {"slice(%0) {axis=1} : f32[3,0]", "slice length must be positive"},
        {"slice(%0) {axis=0} : f32[3]", "slice changes the rank"},
        {"slice(%0) {axis=0} : f16[1,4]", "its inputs give f32[1,4] but the node says f16[1,4]"},
        {"concat(%0, %2) {axis=0} : f32[5,4]", NULL},
        {"concat(%0, %0) {axis=1} : f32[3,8]", NULL},
        {"concat(%0, %1) {axis=0} : f32[6,4]", "concat inputs differ in dtype (insert a cast)"},
        {"concat(%0, %2) {axis=1} : f32[3,8]", "concat inputs differ in a dim other than the axis"},
        {"concat(%0, %0) {axis=2} : f32[3,8]", "concat axis out of range of the inputs' rank"},
        {"concat(%0, %0) {axis=1} : f32[3,7]", "its inputs give f32[3,8] but the node says f32[3,7]"},
        {"concat(%0, %3) {axis=0} : f32[7,4]", "concat inputs differ in rank"},
        {"concat(%0, %4) {axis=1} : f32[3,4]", "concat inputs must be non-empty along the axis"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[512], err[256], buf[256];
        snprintf(text, sizeof text,
                 "graph g {\n %%0 = input \"x\" : f32[3,4]\n %%1 = input \"h\" : f16[3,4]\n"
                 " %%2 = input \"y\" : f32[2,4]\n %%3 = input \"v\" : f32[4]\n"
                 " %%4 = input \"z\" : f32[3,0]\n %%5 = %s\n}", cases[i].node);
        mpt_graph *g = mpt_graph_parse(text, err, sizeof err);
        CHECK_MSG(g != NULL, "%s: %s", cases[i].node, err);
        if (!g) continue;
        if (cases[i].want) expect_verify_error(g, cases[i].want);
        else CHECK_MSG(mpt_graph_verify(g, buf, sizeof buf) == NULL, "%s: %s", cases[i].node, buf);
        mpt_graph_free(g);
    }
}

/* batch_matmul misused: the verifier says what is wrong */
static void test_verify_batch_matmul(void) {
    static const struct {
        const char *node, *want;
    } cases[] = {
        {"batch_matmul(%0, %1) {trans_a=0, trans_b=0} : f32[2,3,5]", NULL},
        {"batch_matmul(%0, %0) {trans_a=0, trans_b=1} : f32[2,3,3]", NULL},
        {"batch_matmul(%0, %0) {trans_a=1, trans_b=0} : f32[2,4,4]", NULL},
        {"batch_matmul(%1, %1) {trans_a=1, trans_b=1} : f32[2,3,3]",
         "batch_matmul inner dimensions differ"},
        {"batch_matmul(%2, %2) {trans_a=0, trans_b=1} : f32[2,2,4,4]", NULL},
        {"batch_matmul(%0, %1) {trans_a=0, trans_b=1} : f32[2,3,5]",
         "batch_matmul inner dimensions differ"},
        {"batch_matmul(%0, %3) {trans_a=0, trans_b=0} : f32[2,3,5]",
         "batch_matmul batch dims differ (it does not broadcast)"},
        {"batch_matmul(%0, %2) {trans_a=0, trans_b=0} : f32[2,3,4]",
         "batch_matmul operands differ in rank"},
        {"batch_matmul(%4, %4) {trans_a=0, trans_b=1} : f32[3,3]",
         "batch_matmul needs operands of rank 3 or 4"},
        {"batch_matmul(%0, %5) {trans_a=0, trans_b=0} : f32[2,3,5]",
         "batch_matmul operands differ in dtype (insert a cast)"},
        {"batch_matmul(%6, %6) {trans_a=0, trans_b=1} : i32[2,3,3]",
         "batch_matmul needs float operands"},
        {"batch_matmul(%0, %1) {trans_a=0, trans_b=0} : f32[2,3,4]",
         "its inputs give f32[2,3,5] but the node says f32[2,3,4]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[640], err[256], buf[256];
        snprintf(text, sizeof text,
                 "graph g {\n %%0 = input \"a\" : f32[2,3,4]\n %%1 = input \"b\" : f32[2,4,5]\n"
                 " %%2 = input \"c\" : f32[2,2,4,3]\n %%3 = input \"d\" : f32[3,4,5]\n"
                 " %%4 = input \"e\" : f32[3,4]\n %%5 = input \"f\" : bf16[2,4,5]\n"
                 " %%6 = input \"g\" : i32[2,3,4]\n %%7 = %s\n}", cases[i].node);
        mpt_graph *g = mpt_graph_parse(text, err, sizeof err);
        CHECK_MSG(g != NULL, "%s: %s", cases[i].node, err);
        if (!g) continue;
        if (cases[i].want) expect_verify_error(g, cases[i].want);
        else CHECK_MSG(mpt_graph_verify(g, buf, sizeof buf) == NULL, "%s: %s", cases[i].node, buf);
        mpt_graph_free(g);
    }
}

int main(void) {
    test_round_trip();
    test_hand_written();
    test_parse_errors();
    test_parser_survives_mangling();
    test_verify();
    test_verify_slice_concat();
    test_verify_batch_matmul();
    return check_exit("test_ir_text");
}
