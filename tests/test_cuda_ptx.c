/* tests/test_cuda_ptx.c — CUDA code generation and NVRTC, no GPU needed.
 *
 * Plans are built by hand (mpt_plan filled directly) so each kernel's
 * contents are exactly what the check expects, whatever fusion/ decides:
 * a fused f16 dense layer (prologue cast, matmul, bias, relu, cast), a
 * softmax cross-entropy reduction, an optimizer update loop, and f16/bf16
 * convolutions (forward, data and filter gradients). Each is generated,
 * compiled by NVRTC for sm_80 and sm_90, and its PTX searched for the
 * instructions the kernel must contain. Skips (77) only when libnvrtc
 * cannot be loaded.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cuda/cuda.h"
#include "runtime/cuda/cuda.h"
#include "tests/attention.h"
#include "tests/check.h"

/* A kernel over `nodes` (ascending); inputs are the operands outside it. */
static void kernel_init(mpt_kernel *k, const mpt_graph *g, mpt_kernel_kind kind,
                        const char *name, int root, const int *nodes, int n_nodes,
                        const int *outs, int n_outs) {
    memset(k, 0, sizeof *k);
    k->kind = kind;
    k->name = strdup(name);
    k->root = root;
    k->nodes = malloc(sizeof(int) * (size_t)n_nodes);
    memcpy(k->nodes, nodes, sizeof(int) * (size_t)n_nodes);
    k->n_nodes = n_nodes;
    k->outputs = malloc(sizeof(int) * (size_t)n_outs);
    memcpy(k->outputs, outs, sizeof(int) * (size_t)n_outs);
    k->n_outputs = n_outs;
    char *seen = calloc((size_t)g->n_nodes, 1);
    for (int i = 0; i < n_nodes; i++) seen[nodes[i]] = 1;
    k->inputs = malloc(sizeof(int) * (size_t)g->n_nodes);
    char *inp = calloc((size_t)g->n_nodes, 1);
    for (int i = 0; i < n_nodes; i++) {
        const mpt_node *nd = &g->nodes[nodes[i]];
        for (int j = 0; j < nd->n_in; j++)
            if (!seen[nd->in[j]]) inp[nd->in[j]] = 1;
    }
    for (int i = 0; i < g->n_nodes; i++)
        if (inp[i]) k->inputs[k->n_inputs++] = i;
    free(seen);
    free(inp);
}

static void plan_free(mpt_plan *p) {
    for (int i = 0; i < p->n_kernels; i++) {
        free(p->kernels[i].name);
        free(p->kernels[i].nodes);
        free(p->kernels[i].inputs);
        free(p->kernels[i].outputs);
    }
    free(p->kernels);
}

/* Generates kernel ki and compiles it for arch; returns the PTX (caller frees). */
static char *ptx_of(const mpt_plan *p, int ki, const char *arch, int *tensor_cores) {
    char err[4096];
    mpt_cuda_kernel_src src;
    if (mpt_cuda_emit_kernel(p, ki, &src, err, sizeof err)) {
        CHECK_MSG(0, "emit %s: %s", p->kernels[ki].name, err);
        return NULL;
    }
    if (tensor_cores) *tensor_cores = src.tensor_cores;
    mpt_cuda_binary bin;
    char *ptx = NULL;
    if (mpt_cuda_compile(src.source, src.name, arch, &bin, err, sizeof err)) {
        CHECK_MSG(0, "compile %s for %s: %s\n%s", src.name, arch, err, src.source);
    } else {
        ptx = bin.ptx;
        bin.ptx = NULL;
        CHECK(strstr(ptx, src.name) != NULL); /* the entry point is there */
        if (arch[0] == 's') CHECK_MSG(bin.regs > 0, "ptxas -v registers in log: %s", bin.log);
        /* no generated kernel may spill (a fully unrolled tile loader once
         * took the convolutions to 255 registers and local memory) */
        if (arch[0] == 's')
            CHECK_MSG(bin.spill_stores == 0 && bin.spill_loads == 0, "%s spills on %s: %s",
                      src.name, arch, bin.log);
        mpt_cuda_binary_free(&bin);
    }
    mpt_cuda_kernel_src_free(&src);
    return ptx;
}

static int has(const char *ptx, const char *what) { return ptx && strstr(ptx, what) != NULL; }

static void test_dense(void) {
    mpt_graph *g = mpt_graph_new("dense");
    mpt_b_layer(g, "dense_1");
    int x = mpt_b_input(g, "x", MPT_DT_F16, mpt_shape_2(64, 128));
    int w = mpt_b_variable(g, "w", mpt_shape_2(128, 256), MPT_INIT_GLOROT_UNIFORM, 128, 256, 0, 1);
    int b16 = mpt_b_input(g, "b16", MPT_DT_F16, mpt_shape_1(256));
    int w16 = mpt_b_cast(g, w, MPT_DT_F16);
    int mm = mpt_b_matmul(g, x, w16, 0, 0);
    int bb = mpt_b_broadcast(g, b16, mpt_shape_2(64, 256), 2);
    int add = mpt_b_binary(g, MPT_OP_ADD, mm, bb);
    int relu = mpt_b_unary(g, MPT_OP_RELU, add);
    int out = mpt_b_cast(g, relu, MPT_DT_F32);
    /* the same layer without the prologue cast: cuBLASLt's RELU_BIAS */
    int w16in = mpt_b_input(g, "w16", MPT_DT_F16, mpt_shape_2(128, 256));
    int mm2 = mpt_b_matmul(g, x, w16in, 0, 0);
    int bb2 = mpt_b_broadcast(g, b16, mpt_shape_2(64, 256), 2);
    int add2 = mpt_b_binary(g, MPT_OP_ADD, mm2, bb2);
    int relu2 = mpt_b_unary(g, MPT_OP_RELU, add2);
    int sig = mpt_b_unary(g, MPT_OP_SIGMOID, mm2);
    /* bf16 with gelu */
    int xb = mpt_b_input(g, "xb", MPT_DT_BF16, mpt_shape_2(64, 128));
    int wb = mpt_b_input(g, "wb", MPT_DT_BF16, mpt_shape_2(256, 128));
    int mm3 = mpt_b_matmul(g, xb, wb, 0, 1);
    int gelu = mpt_b_unary(g, MPT_OP_GELU, mm3);
    /* f32 SIMT */
    int xf = mpt_b_input(g, "xf", MPT_DT_F32, mpt_shape_2(128, 64));
    int mm4 = mpt_b_matmul(g, xf, w, 1, 0);
    char vbuf[256];
    CHECK_MSG(mpt_graph_verify(g, vbuf, sizeof vbuf) == NULL, "%s", vbuf);

    mpt_plan p = {.g = g, .n_kernels = 5};
    p.kernels = calloc(5, sizeof *p.kernels);
    kernel_init(&p.kernels[0], g, MPT_KERNEL_GEMM, "gemm_dense_1__cast_bias_relu_cast_f32", mm,
                (int[]){w16, mm, bb, add, relu, out}, 6, (int[]){out}, 1);
    kernel_init(&p.kernels[1], g, MPT_KERNEL_GEMM, "gemm_bias_relu", mm2,
                (int[]){mm2, bb2, add2, relu2}, 4, (int[]){relu2}, 1);
    kernel_init(&p.kernels[2], g, MPT_KERNEL_GEMM, "gemm_sigmoid", mm2, (int[]){mm2, sig}, 2,
                (int[]){sig}, 1);
    kernel_init(&p.kernels[3], g, MPT_KERNEL_GEMM, "gemm_bf16_gelu", mm3, (int[]){mm3, gelu}, 2,
                (int[]){mm3, gelu}, 2);
    kernel_init(&p.kernels[4], g, MPT_KERNEL_GEMM, "gemm_f32", mm4, (int[]){mm4}, 1,
                (int[]){mm4}, 1);

    /* the cuBLASLt matcher */
    mpt_lt_call call;
    const char *why = mpt_cuda_match_lt(g, &p.kernels[1], &call);
    CHECK_MSG(why == NULL, "%s", why);
    CHECK(call.epilogue == MPT_LT_EPI_RELU_BIAS && call.bias == b16 && call.d == relu2);
    CHECK(call.m == 64 && call.n == 256 && call.k == 128 && call.d_dt == MPT_DT_F16);
    CHECK(MPT_LT_EPI_RELU_BIAS == 6 && MPT_LT_EPI_GELU_AUX_BIAS == 164 &&
          MPT_LT_EPI_DGELU_BGRAD == 208 && MPT_LT_EPI_BGRADB == 512);
    why = mpt_cuda_match_lt(g, &p.kernels[2], &call);
    CHECK_MSG(why && strstr(why, "beyond"), "sigmoid must be refused: %s", why ? why : "(none)");
    why = mpt_cuda_match_lt(g, &p.kernels[0], &call);
    CHECK_MSG(why && strstr(why, "prologue"), "prologue cast must be refused: %s",
              why ? why : "(none)");
    why = mpt_cuda_match_lt(g, &p.kernels[3], &call);
    /* cuBLASLt's GELU is the tanh approximation; mptc's gelu is exact */
    CHECK_MSG(why && strstr(why, "tanh"), "gelu must be refused: %s",
              why ? why : mpt_lt_epilogue_name(call.epilogue));
    why = mpt_cuda_match_lt(g, &p.kernels[4], &call);
    CHECK(why == NULL && call.epilogue == MPT_LT_EPI_DEFAULT && call.trans_a == 1);

    const char *archs[] = {"sm_80", "sm_90"};
    for (int a = 0; a < 2; a++) {
        int tc = 0;
        char *ptx = ptx_of(&p, 0, archs[a], &tc);
        CHECK(tc);
        CHECK_MSG(has(ptx, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"), "%s: no f16 mma",
                  archs[a]);
        CHECK_MSG(has(ptx, "ldmatrix.sync.aligned.m8n8.x4.shared.b16"), "%s: fragments by ldmatrix",
                  archs[a]);
        CHECK_MSG(has(ptx, "max.f32"), "relu as max.f32");
        CHECK_MSG(has(ptx, "cvt.rn.f16.f32"), "casts to f16");
        CHECK_MSG(has(ptx, "cvt.f32.f16"), "f16 widened for the epilogue");
        free(ptx);
        ptx = ptx_of(&p, 3, archs[a], &tc);
        CHECK_MSG(has(ptx, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"), "bf16 mma");
        CHECK_MSG(has(ptx, "cvt.rn.bf16.f32"), "bf16 stores");
        free(ptx);
        ptx = ptx_of(&p, 4, archs[a], &tc);
        CHECK(!tc);
        CHECK_MSG(has(ptx, "fma.rn.f32") && !has(ptx, "mma.sync"), "f32 GEMM is SIMT fp32");
        free(ptx);
        /* --tf32: the same GEMM on TF32 Tensor Cores, operands rounded by cvt.rna */
        p.tf32 = 1;
        ptx = ptx_of(&p, 4, archs[a], &tc);
        CHECK(tc);
        CHECK_MSG(has(ptx, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32") &&
                      has(ptx, "cvt.rna.tf32.f32") && has(ptx, "cp.async"),
                  "%s: TF32 GEMM", archs[a]);
        free(ptx);
        p.tf32 = 0;
    }
    plan_free(&p);
    mpt_graph_free(g);
}

static void test_softmax_xent(void) {
    mpt_graph *g = mpt_graph_new("xent");
    mpt_shape s = mpt_shape_2(32, 10);
    int logits = mpt_b_input(g, "logits", MPT_DT_F32, s);
    int labels = mpt_b_input(g, "labels", MPT_DT_F32, s);
    int mx = mpt_b_reduce(g, MPT_OP_REDUCE_MAX, logits, 2);
    int mxb = mpt_b_broadcast(g, mx, s, 1);
    int sh = mpt_b_binary(g, MPT_OP_SUB, logits, mxb);
    int ex = mpt_b_unary(g, MPT_OP_EXP, sh);
    int sum = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, ex, 2);
    int lse = mpt_b_unary(g, MPT_OP_LOG, sum);
    int lseb = mpt_b_broadcast(g, lse, s, 1);
    int logp = mpt_b_binary(g, MPT_OP_SUB, sh, lseb);
    int prod = mpt_b_binary(g, MPT_OP_MUL, labels, logp);
    int nll = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, prod, 2);
    int loss = mpt_b_unary(g, MPT_OP_NEG, nll);
    int sumb = mpt_b_broadcast(g, sum, s, 1);
    int prob = mpt_b_binary(g, MPT_OP_DIV, ex, sumb);
    int am = mpt_b_argmax(g, logits, 1);
    mpt_plan p = {.g = g, .n_kernels = 2};
    p.kernels = calloc(2, sizeof *p.kernels);
    kernel_init(&p.kernels[0], g, MPT_KERNEL_REDUCTION, "reduce_softmax_xent", mx,
                (int[]){mx, mxb, sh, ex, sum, lse, lseb, logp, prod, nll, loss, sumb, prob}, 13,
                (int[]){loss, prob}, 2);
    kernel_init(&p.kernels[1], g, MPT_KERNEL_OPAQUE, "argmax", am, (int[]){am}, 1, (int[]){am}, 1);
    char *ptx = ptx_of(&p, 0, "sm_90", NULL);
    CHECK_MSG(has(ptx, "shfl.sync.bfly.b32"), "warp shuffles");
    CHECK_MSG(has(ptx, "ex2.approx"), "exp");
    CHECK_MSG(has(ptx, "bar.sync"), "block reduction");
    free(ptx);
    ptx = ptx_of(&p, 1, "compute_80", NULL);
    CHECK_MSG(has(ptx, "shfl.sync.bfly.b32"), "argmax shuffles");
    free(ptx);
    plan_free(&p);
    mpt_graph_free(g);
}

/* Adam-like update plus the f16 copy of the new weights, in one loop; the
 * second run must come from the disk cache. */
static void test_optimizer_loop_and_cache(void) {
    mpt_graph *g = mpt_graph_new("opt");
    mpt_shape s = mpt_shape_2(256, 128);
    int w = mpt_b_variable(g, "w", s, MPT_INIT_ZEROS, 1, 1, 0, 1);
    int m = mpt_b_variable(g, "w/m", s, MPT_INIT_ZEROS, 1, 1, 0, 0);
    int grad = mpt_b_input(g, "g", MPT_DT_F32, s);
    int b1 = mpt_b_broadcast_to(g, mpt_b_scalar(g, MPT_DT_F32, 0.9), s);
    int c1 = mpt_b_broadcast_to(g, mpt_b_scalar(g, MPT_DT_F32, 0.1), s);
    int lr = mpt_b_broadcast_to(g, mpt_b_scalar(g, MPT_DT_F32, 0.001), s);
    int eps = mpt_b_broadcast_to(g, mpt_b_scalar(g, MPT_DT_F32, 1e-7), s);
    int m1 = mpt_b_binary(g, MPT_OP_MUL, b1, m);
    int m2 = mpt_b_binary(g, MPT_OP_MUL, c1, grad);
    int mn = mpt_b_binary(g, MPT_OP_ADD, m1, m2);
    int sq = mpt_b_unary(g, MPT_OP_SQUARE, grad);
    int rt = mpt_b_unary(g, MPT_OP_SQRT, sq);
    int den = mpt_b_binary(g, MPT_OP_ADD, rt, eps);
    int step = mpt_b_binary(g, MPT_OP_DIV, mn, den);
    int upd = mpt_b_binary(g, MPT_OP_MUL, lr, step);
    int wn = mpt_b_binary(g, MPT_OP_SUB, w, upd);
    int w16 = mpt_b_cast(g, wn, MPT_DT_F16);
    int nodes[32], nn = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        mpt_op op = g->nodes[i].op;
        if (op != MPT_OP_INPUT && op != MPT_OP_VARIABLE && op != MPT_OP_CONST) nodes[nn++] = i;
    }
    mpt_plan p = {.g = g, .n_kernels = 1};
    p.kernels = calloc(1, sizeof *p.kernels);
    kernel_init(&p.kernels[0], g, MPT_KERNEL_LOOP, "loop_adam_update_cast_f16", -1, nodes, nn,
                (int[]){mn, wn, w16}, 3);
    mpt_cuda_kernel_src src;
    char err[4096];
    CHECK_MSG(mpt_cuda_emit_kernel(&p, 0, &src, err, sizeof err) == 0, "%s", err);
    CHECK(src.n_params == 6); /* w, m, g; mn, wn, w16: scalars are folded */
    mpt_cuda_binary a, b;
    CHECK_MSG(mpt_cuda_compile(src.source, src.name, "sm_80", &a, err, sizeof err) == 0, "%s", err);
    CHECK(!a.cache_hit);
    CHECK(has(a.ptx, "cvt.rn.f16.f32") && has(a.ptx, "sqrt.rn.f32") && has(a.ptx, "div.rn.f32"));
    /* four elements per load and store: f32 as one 16-byte vector, the f16
     * copy as two half2 words */
    CHECK_MSG(has(a.ptx, "ld.global.nc.v4.f32") && has(a.ptx, "st.global.v4.f32") &&
              has(a.ptx, "st.global.v2.u32") && !has(a.ptx, "ld.global.nc.f32"),
              "the update loop's loads and stores must be vectors");
    CHECK_MSG(mpt_cuda_compile(src.source, src.name, "sm_80", &b, err, sizeof err) == 0, "%s", err);
    CHECK_MSG(b.cache_hit, "second compile must hit the disk cache");
    CHECK(a.ptx && b.ptx && strcmp(a.ptx, b.ptx) == 0 && a.cubin_len == b.cubin_len);
    CHECK(b.regs == a.regs);
    mpt_cuda_binary_free(&a);
    mpt_cuda_binary_free(&b);
    /* a different arch is a different entry */
    CHECK(mpt_cuda_compile(src.source, src.name, "sm_90", &a, err, sizeof err) == 0 && !a.cache_hit);
    mpt_cuda_binary_free(&a);
    CHECK(mpt_cuda_compile(src.source, src.name, "sm_70", &a, err, sizeof err) != 0 &&
          strstr(err, "hint"));
    mpt_cuda_kernel_src_free(&src);
    plan_free(&p);
    mpt_graph_free(g);
}

/* A 3x3 stride-2 convolution's three kernels: forward with relu, data
 * gradient, filter gradient cast to f32. The filter gradient sums over
 * 64 x 8 x 8 pixels into 2 output tiles: split along k. */
static mpt_graph *conv_plan(mpt_dtype dt, mpt_plan *p) {
    mpt_graph *g = mpt_graph_new("conv");
    mpt_b_layer(g, "conv_1");
    int x = mpt_b_input(g, "x", dt, mpt_shape_4(64, 16, 16, 16));
    int w = mpt_b_input(g, "w", dt, mpt_shape_4(3, 3, 16, 32));
    int y = mpt_b_conv2d(g, x, w, 2, 2, 1, 1, mpt_shape_4(64, 8, 8, 32));
    int r = mpt_b_unary(g, MPT_OP_RELU, y);
    int dy = mpt_b_input(g, "dy", dt, mpt_shape_4(64, 8, 8, 32));
    int dx = mpt_b_conv2d_bwd_data(g, dy, w, 2, 2, 1, 1, mpt_shape_4(64, 16, 16, 16));
    int dw = mpt_b_conv2d_bwd_filter(g, x, dy, 2, 2, 1, 1, mpt_shape_4(3, 3, 16, 32));
    int dwf = mpt_b_cast(g, dw, MPT_DT_F32);
    *p = (mpt_plan){.g = g, .n_kernels = 3};
    p->kernels = calloc(3, sizeof *p->kernels);
    kernel_init(&p->kernels[0], g, MPT_KERNEL_CONV, "conv_1__relu", y, (int[]){y, r}, 2,
                (int[]){r}, 1);
    kernel_init(&p->kernels[1], g, MPT_KERNEL_CONV, "conv_1_bwd_data", dx, (int[]){dx}, 1,
                (int[]){dx}, 1);
    kernel_init(&p->kernels[2], g, MPT_KERNEL_CONV, "conv_1_bwd_filter__cast_f32", dw,
                (int[]){dw, dwf}, 2, (int[]){dwf}, 1);
    return g;
}

static void test_conv(mpt_dtype dt, const char *mma) {
    mpt_plan p;
    mpt_graph *g = conv_plan(dt, &p);
    /* 3x3 stride 2: not a GEMM for cuBLASLt */
    mpt_lt_call call;
    for (int k = 0; k < 3; k++) {
        const char *why = mpt_cuda_match_lt(g, &p.kernels[k], &call);
        CHECK_MSG(why && strstr(why, "1x1"), "%s", why ? why : "(matched)");
    }
    for (int k = 0; k < 3; k++) {
        int tc = 0;
        char *ptx = ptx_of(&p, k, k == 1 ? "sm_80" : "sm_90", &tc);
        CHECK_MSG(tc && has(ptx, mma), "%s %s: %s", p.kernels[k].name, mpt_dtype_name(dt), mma);
        if (k == 0) CHECK(has(ptx, "max.f32"));
        /* 16 input and 32 output channels: every operand by cp.async, in a
         * pipeline; a tile laid out [k][m or n] (w, and x and dy in the
         * filter gradient) read by ldmatrix.trans, the data gradient's
         * [m or n][k] tiles without */
        CHECK_MSG(has(ptx, "cp.async.cg.shared.global") && has(ptx, "cp.async.wait_group 1") &&
                      has(ptx, "cp.async.commit_group"),
                  "%s: operands by cp.async", p.kernels[k].name);
        CHECK_MSG(has(ptx, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") == (k != 1),
                  "%s: ldmatrix.trans", p.kernels[k].name);
        /* split-K: each block's partial stored past L1, the tile's last
         * block found by an atomic counter */
        CHECK_MSG(has(ptx, "atom.global.add.u32") == (k == 2) && has(ptx, "st.global.cg.f32") == (k == 2),
                  "%s: split-K only in the filter gradient", p.kernels[k].name);
        free(ptx);
    }
    /* mptc ptx: files and report */
    char dir[] = "/tmp/mptc_ptx_XXXXXX", err[4096];
    CHECK(mkdtemp(dir) != NULL);
    char *rep = NULL;
    size_t rlen = 0;
    FILE *f = open_memstream(&rep, &rlen);
    CHECK_MSG(mpt_cuda_emit_plan(&p, "sm_90", dir, f, err, sizeof err) == 0, "%s", err);
    fclose(f);
    CHECK_MSG(rep && strstr(rep, "mma.sync") && strstr(rep, "registers"), "report: %s", rep);
    /* the stride-2 data gradient by its 4 phases, the filter gradient split */
    CHECK_MSG(rep && strstr(rep, "block 128, tile 256x32, 4 phases") &&
                  strstr(rep, "3 on Tensor Cores (0 TF32), 1 split along k, 1 strided data "
                              "gradients by phase"),
              "report: %s", rep);
    char path[256], *text = NULL;
    snprintf(path, sizeof path, "%s/k0_conv_1__relu.cu", dir);
    FILE *cu = fopen(path, "r");
    CHECK_MSG(cu != NULL, "%s written", path);
    if (cu) {
        text = calloc(1, 1 << 16);
        CHECK(fread(text, 1, (1 << 16) - 1, cu) > 0);
        fclose(cu);
        CHECK(strstr(text, "layer conv_1") && strstr(text, "relu"));
        free(text);
        remove(path);
    }
    for (int k = 0; k < 3; k++) {
        mpt_cuda_kernel_src s;
        if (mpt_cuda_emit_kernel(&p, k, &s, err, sizeof err) == 0) {
            snprintf(path, sizeof path, "%s/%s.ptx", dir, s.name);
            CHECK_MSG(access(path, R_OK) == 0, "%s written", path);
            remove(path);
            snprintf(path, sizeof path, "%s/%s.cu", dir, s.name);
            remove(path);
            mpt_cuda_kernel_src_free(&s);
        }
    }
    rmdir(dir);
    free(rep);
    plan_free(&p);
    mpt_graph_free(g);
}

static void test_opaque(void) {
    mpt_graph *g = mpt_graph_new("opaque");
    int x = mpt_b_input(g, "x", MPT_DT_F16, mpt_shape_4(2, 8, 8, 4));
    int mp = mpt_b_pool(g, MPT_OP_MAX_POOL, x, 2, 2, 2, 2, 0, 0, mpt_shape_4(2, 4, 4, 4));
    int ids = mpt_b_input(g, "ids", MPT_DT_I32, mpt_shape_1(16));
    int upd = mpt_b_input(g, "upd", MPT_DT_F32, mpt_shape_2(16, 8));
    int sc = mpt_b_scatter_add(g, ids, upd, 100);
    int ctr = mpt_b_input(g, "step", MPT_DT_I32, mpt_shape_scalar());
    int ru = mpt_b_random_uniform(g, ctr, mpt_shape_2(4, 4), 42);
    mpt_plan p = {.g = g, .n_kernels = 3};
    p.kernels = calloc(3, sizeof *p.kernels);
    kernel_init(&p.kernels[0], g, MPT_KERNEL_OPAQUE, "max_pool", mp, (int[]){mp}, 1, (int[]){mp}, 1);
    kernel_init(&p.kernels[1], g, MPT_KERNEL_OPAQUE, "scatter_add", sc, (int[]){sc}, 1, (int[]){sc}, 1);
    kernel_init(&p.kernels[2], g, MPT_KERNEL_OPAQUE, "random", ru, (int[]){ru}, 1, (int[]){ru}, 1);
    char *ptx = ptx_of(&p, 0, "compute_90", NULL);
    CHECK(has(ptx, "max.f32"));
    free(ptx);
    ptx = ptx_of(&p, 1, "compute_90", NULL);
    CHECK(has(ptx, "atom.global.add.f32") || has(ptx, "red.global.add.f32"));
    free(ptx);
    ptx = ptx_of(&p, 2, "compute_90", NULL);
    CHECK(has(ptx, "mul.lo.s64") || has(ptx, "mul.lo.u64"));
    free(ptx);
    plan_free(&p);
    mpt_graph_free(g);
}

/* Slice and concat computed inside a loop (bf16 operands joined along the
 * last axis, a gate sliced out of the join and squashed) and a concat
 * along the first axis alone: NVRTC compiles both for sm_80 and sm_90
 * (the emulator, tests/test_cuda_emu.c, checks their values). */
static void test_slice_concat(void) {
    mpt_graph *g = mpt_graph_new("slice_concat");
    int a = mpt_b_input(g, "a", MPT_DT_BF16, mpt_shape_2(6, 13));
    int b = mpt_b_input(g, "b", MPT_DT_BF16, mpt_shape_2(6, 7));
    int cat = mpt_b_concat(g, a, b, 1);
    int sl = mpt_b_slice(g, cat, 1, 11, 5);
    int sig = mpt_b_unary(g, MPT_OP_SIGMOID, sl);
    int cat0 = mpt_b_concat(g, a, a, 0);
    mpt_plan p = {.g = g, .n_kernels = 2};
    p.kernels = calloc(2, sizeof *p.kernels);
    kernel_init(&p.kernels[0], g, MPT_KERNEL_LOOP, "loop_concat_slice_sigmoid", -1,
                (int[]){cat, sl, sig}, 3, (int[]){cat, sig}, 2);
    kernel_init(&p.kernels[1], g, MPT_KERNEL_LOOP, "loop_concat", -1, (int[]){cat0}, 1,
                (int[]){cat0}, 1);
    for (int k = 0; k < 2; k++)
        for (int arch = 0; arch < 2; arch++) {
            char *ptx = ptx_of(&p, k, arch ? "sm_90" : "sm_80", NULL);
            CHECK_MSG(has(ptx, "ld.global"), "kernel %d reads its operands", k);
            free(ptx);
        }
    plan_free(&p);
    mpt_graph_free(g);
}

/* Attention and its gradient in each float dtype, fused: NVRTC compiles
 * every kernel for sm_80 and sm_90, and the batch_matmul kernels (one
 * thread per output element, for where cuBLASLt does not run them) read
 * both operands and loop over k; the emulator (tests/test_cuda_emu.c)
 * checks their values. The cuBLASLt matcher makes each one strided-batched
 * call. */
static void test_batch_matmul(void) {
    static const mpt_dtype dts[] = {MPT_DT_F32, MPT_DT_F16, MPT_DT_BF16};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        mpt_graph *g = mpt_graph_new("attention");
        CHECK(attention_graph(g, dts[d], mpt_shape_make(4, (const int64_t[]){2, 3, 7, 33}), 1) == 0);
        mpt_fusion_opts fo;
        mpt_fusion_opts_default(&fo);
        mpt_plan *p = mpt_fuse(g, &fo);
        int n_bmm = 0;
        for (int k = 0; k < p->n_kernels; k++) {
            int bmm = p->kernels[k].root >= 0 && g->nodes[p->kernels[k].root].op == MPT_OP_BATCH_MATMUL;
            n_bmm += bmm;
            for (int arch = 0; arch < 2; arch++) {
                int tc = -1;
                char *ptx = ptx_of(p, k, arch ? "sm_90" : "sm_80", &tc);
                if (bmm)
                    CHECK_MSG(has(ptx, "ld.global") && tc == 0 && !has(ptx, "mma."),
                              "%s: batch_matmul kernel %s", mpt_dtype_name(dts[d]), p->kernels[k].name);
                free(ptx);
            }
            /* and where cuBLASLt loads, one strided-batched call: 2 x 3
             * batches, the node's flags and dtype, no epilogue */
            if (!bmm) continue;
            const mpt_node *r = &g->nodes[p->kernels[k].root];
            mpt_lt_call c;
            const char *why = mpt_cuda_match_lt(g, &p->kernels[k], &c);
            CHECK_MSG(!why && c.batch == 6 && c.m == r->shape.dim[2] && c.n == r->shape.dim[3] &&
                          c.trans_a == r->attr.i[0] && c.trans_b == r->attr.i[1] &&
                          c.d_dt == r->dtype && c.a_dt == dts[d] &&
                          c.epilogue == MPT_LT_EPI_DEFAULT && c.d == p->kernels[k].root,
                      "%s: %s: %s", mpt_dtype_name(dts[d]), p->kernels[k].name,
                      why ? why : "a wrong call");
            /* a batch_matmul kernel with another op in it is not one call */
            mpt_kernel two;
            kernel_init(&two, g, MPT_KERNEL_OPAQUE, "bmm_and_more", (int)(r - g->nodes),
                        (int[]){r->in[0], (int)(r - g->nodes)}, 2, (int[]){(int)(r - g->nodes)}, 1);
            why = mpt_cuda_match_lt(g, &two, &c);
            CHECK_MSG(why && strstr(why, "other ops"), "%s", why ? why : "matched");
            free(two.name), free(two.nodes), free(two.inputs), free(two.outputs);
        }
        /* forward 2, backward 4 (dq, dk from dS; dP, dv from dO) */
        CHECK_MSG(n_bmm == 6, "%s: %d batch_matmul kernels", mpt_dtype_name(dts[d]), n_bmm);
        mpt_plan_free(p);
        mpt_graph_free(g);
    }
}

/* Kernels compiled on several threads at once give what one at a time
 * gives; kernels whose code differs only in name and header comment are
 * compiled once (3 and 5 are 1's code); a broken one is reported by name,
 * the first by index. */
static void test_compile_all(void) {
    enum { N = 6 };
    char text[N][400], name[N][32];
    const char *srcs[N], *names[N];
    for (int i = 0; i < N; i++) {
        int code = i == 3 || i == 5 ? 1 : i;
        /* names of another length: the PTX's mangled statics carry it */
        snprintf(name[i], sizeof name[i], i == 5 ? "k_all_%d_longer_name" : "k_all_%d", i);
        snprintf(text[i], sizeof text[i], "/* kernel %d, header %d */\nextern \"C\" "
                 "__global__ void %s(float *p) { __shared__ float t[32]; t[threadIdx.x] = "
                 "p[threadIdx.x]; __syncthreads(); p[threadIdx.x] = t[31 - threadIdx.x] * "
                 "%d.0f + 1.0f; }\n", i, i, name[i], code + 2);
        srcs[i] = text[i];
        names[i] = name[i];
    }
    char err[4096];
    setenv("MPTC_COMPILE_JOBS", "3", 1);
    CHECK(mpt_cuda_compile_jobs() == 3);
    mpt_cuda_binary all[N], one;
    CHECK_MSG(mpt_cuda_compile_all(N, srcs, names, "sm_80", all, err, sizeof err) == 0, "%s",
              err);
    size_t cubin_len_1 = all[1].cubin_len;
    for (int i = 0; i < N; i++) {
        int dup = i == 3 || i == 5;
        CHECK(!all[i].cache_hit && all[i].cubin && has(all[i].ptx, name[i]));
        CHECK_MSG(all[i].same_as == (dup ? 1 : -1), "kernel %d: same_as %d", i, all[i].same_as);
        CHECK(dup ? all[i].entry && strcmp(all[i].entry, "k_all_1") == 0 : !all[i].entry);
        CHECK(dup ? all[i].cubin_len == cubin_len_1 : 1);
        CHECK(mpt_cuda_compile(srcs[i], names[i], "sm_80", &one, err, sizeof err) == 0);
        /* the cache is keyed by the code, not the name: kernel 1's entry,
         * read back under this kernel's name */
        CHECK(one.cache_hit && one.same_as == -1);
        CHECK(dup ? one.entry && strcmp(one.entry, "k_all_1") == 0 : !one.entry);
        CHECK_MSG(one.ptx && all[i].ptx && strcmp(one.ptx, all[i].ptx) == 0,
                  "kernel %d: the PTX of a threaded (or shared) compile must be the one a "
                  "single compile gives:\n%s\n---\n%s", i, all[i].ptx, one.ptx);
        mpt_cuda_binary_free(&one);
        mpt_cuda_binary_free(&all[i]);
    }
    /* the same kernels under other names: all read from the cache, each
     * function named as compiled (kernel 1's code under "k_all_1") */
    char text2[N][400], name2[N][32];
    const char *srcs2[N], *names2[N];
    for (int i = 0; i < N; i++) {
        snprintf(name2[i], sizeof name2[i], "%s_b", name[i]);
        char *at = strstr(text[i], name[i]);
        snprintf(text2[i], sizeof text2[i], "%.*s%s%s", (int)(at - text[i]), text[i], name2[i],
                 at + strlen(name[i]));
        srcs2[i] = text2[i];
        names2[i] = name2[i];
    }
    CHECK_MSG(mpt_cuda_compile_all(N, srcs2, names2, "sm_80", all, err, sizeof err) == 0, "%s",
              err);
    for (int i = 0; i < N; i++) {
        int dup = i == 3 || i == 5;
        CHECK(dup ? all[i].same_as == 1 : all[i].cache_hit);
        const char *want = dup ? "k_all_1" : name[i];
        CHECK_MSG(all[i].entry && strcmp(all[i].entry, want) == 0,
                  "kernel %d: the cubin's function is %s, not %s", i, want,
                  all[i].entry ? all[i].entry : "(its own name)");
        CHECK(has(all[i].ptx, name2[i]) && all[i].cubin &&
              memmem(all[i].cubin, all[i].cubin_len, want, strlen(want)));
        mpt_cuda_binary_free(&all[i]);
    }
    /* a cache entry whose name disagrees with its PTX and cubin (two
     * processes writing the same code under two names at once) is a miss
     * (the entry holds the name, then the cache's 32-byte footer) */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "f=$(for e in \"%s\"/*.name; do [ \"$(head -c 8 \"$e\")\" = "
             "k_all_0m ] && echo \"$e\"; done; true) && [ -n \"$f\" ] && "
             "printf k_all_0_elsewhere > \"$f\"", getenv("MPTC_CACHE_DIR"));
    CHECK_MSG(system(cmd) == 0, "%s", cmd);
    CHECK(mpt_cuda_compile(srcs[0], names[0], "sm_80", &one, err, sizeof err) == 0);
    CHECK_MSG(!one.cache_hit && !one.entry && has(one.ptx, ".entry k_all_0("),
              "a disagreeing cache entry must be compiled again");
    mpt_cuda_binary_free(&one);
    CHECK(mpt_cuda_compile(srcs[0], names[0], "sm_80", &one, err, sizeof err) == 0 &&
          one.cache_hit && !one.entry);
    mpt_cuda_binary_free(&one);
    /* kernels 2 and 4 do not compile: the error names kernel 2 */
    snprintf(text[2], sizeof text[2], "extern \"C\" __global__ void k_all_2() { undeclared(); }\n");
    snprintf(text[3], sizeof text[3], "extern \"C\" __global__ void k_all_3() { }\n");
    snprintf(text[4], sizeof text[4], "extern \"C\" __global__ void k_all_4() { nope; }\n");
    CHECK(mpt_cuda_compile_all(N, srcs, names, "sm_80", all, err, sizeof err) != 0);
    CHECK_MSG(strstr(err, "k_all_2") && strstr(err, "undeclared") && !strstr(err, "k_all_4"),
              "%s", err);
    for (int i = 0; i < N; i++) CHECK(all[i].ptx == NULL && all[i].cubin == NULL);
    setenv("MPTC_COMPILE_JOBS", "0", 1);
    CHECK(mpt_cuda_compile_jobs() >= 1);
    unsetenv("MPTC_COMPILE_JOBS");
}

/* A 1x1 stride-1 convolution is a GEMM over the N*H*W pixels for cuBLASLt:
 * forward NN, data gradient NT, filter gradient TN; the forward's bias,
 * cast inside the kernel from its f32 variable, is read before the cast
 * when D is f32. Strided, it is not. */
static void test_conv_lt(void) {
    mpt_graph *g = mpt_graph_new("conv1x1");
    mpt_b_layer(g, "mix");
    int x = mpt_b_input(g, "x", MPT_DT_F16, mpt_shape_4(4, 6, 5, 8));
    int w = mpt_b_input(g, "w", MPT_DT_F16, mpt_shape_4(1, 1, 8, 16));
    int b = mpt_b_input(g, "b", MPT_DT_F32, mpt_shape_1(16));
    int y = mpt_b_conv2d(g, x, w, 1, 1, 0, 0, mpt_shape_4(4, 6, 5, 16));
    int b16 = mpt_b_cast(g, b, MPT_DT_F16);
    int bb = mpt_b_broadcast(g, b16, mpt_shape_4(4, 6, 5, 16), 8);
    int add = mpt_b_binary(g, MPT_OP_ADD, y, bb);
    int out = mpt_b_cast(g, add, MPT_DT_F32);
    int dy = mpt_b_input(g, "dy", MPT_DT_F16, mpt_shape_4(4, 6, 5, 16));
    int dx = mpt_b_conv2d_bwd_data(g, dy, w, 1, 1, 0, 0, mpt_shape_4(4, 6, 5, 8));
    int dw = mpt_b_conv2d_bwd_filter(g, x, dy, 1, 1, 0, 0, mpt_shape_4(1, 1, 8, 16));
    int ys = mpt_b_conv2d(g, x, w, 2, 2, 0, 0, mpt_shape_4(4, 3, 3, 16));
    int bh = mpt_b_input(g, "bh", MPT_DT_F16, mpt_shape_1(16));
    int bbh = mpt_b_broadcast(g, bh, mpt_shape_4(4, 6, 5, 16), 8);
    int addh = mpt_b_binary(g, MPT_OP_ADD, y, bbh);
    int wide = mpt_b_cast(g, addh, MPT_DT_F32);
    mpt_plan p = {.g = g, .n_kernels = 6};
    p.kernels = calloc(6, sizeof *p.kernels);
    kernel_init(&p.kernels[0], g, MPT_KERNEL_CONV, "mix__bias_cast_f32", y,
                (int[]){y, b16, bb, add, out}, 5, (int[]){out}, 1);
    kernel_init(&p.kernels[1], g, MPT_KERNEL_CONV, "mix_bwd_data", dx, (int[]){dx}, 1,
                (int[]){dx}, 1);
    kernel_init(&p.kernels[2], g, MPT_KERNEL_CONV, "mix_bwd_filter", dw, (int[]){dw}, 1,
                (int[]){dw}, 1);
    kernel_init(&p.kernels[3], g, MPT_KERNEL_CONV, "mix_strided", ys, (int[]){ys}, 1,
                (int[]){ys}, 1);
    /* the same forward writing f16: the f32 bias is refused */
    kernel_init(&p.kernels[4], g, MPT_KERNEL_CONV, "mix__bias", y, (int[]){y, b16, bb, add}, 4,
                (int[]){add}, 1);
    /* a widening cast left in the kernel for its readers elsewhere (not
     * an output): D is the f16 sum */
    kernel_init(&p.kernels[5], g, MPT_KERNEL_CONV, "mix__bias_cast_f32", y,
                (int[]){y, bbh, addh, wide}, 4, (int[]){addh}, 1);
    mpt_lt_call c;
    const char *why = mpt_cuda_match_lt(g, &p.kernels[5], &c);
    CHECK_MSG(!why, "%s", why);
    CHECK(c.d == addh && c.d_dt == MPT_DT_F16 && c.bias == bh && c.epilogue == MPT_LT_EPI_BIAS);
    why = mpt_cuda_match_lt(g, &p.kernels[0], &c);
    CHECK_MSG(!why, "%s", why);
    CHECK(c.m == 120 && c.n == 16 && c.k == 8 && !c.trans_a && !c.trans_b && c.a == x &&
          c.b == w && c.d == out && c.d_dt == MPT_DT_F32 && c.bias == b &&
          c.bias_dt == MPT_DT_F32 && c.epilogue == MPT_LT_EPI_BIAS);
    why = mpt_cuda_match_lt(g, &p.kernels[1], &c);
    CHECK_MSG(!why, "%s", why);
    CHECK(c.m == 120 && c.n == 8 && c.k == 16 && !c.trans_a && c.trans_b && c.a == dy &&
          c.b == w && c.d == dx);
    why = mpt_cuda_match_lt(g, &p.kernels[2], &c);
    CHECK_MSG(!why, "%s", why);
    CHECK(c.m == 8 && c.n == 16 && c.k == 120 && c.trans_a && !c.trans_b && c.a == x &&
          c.b == dy && c.d == dw);
    why = mpt_cuda_match_lt(g, &p.kernels[3], &c);
    CHECK_MSG(why && strstr(why, "1x1"), "%s", why ? why : "(strided 1x1 matched)");
    why = mpt_cuda_match_lt(g, &p.kernels[4], &c);
    CHECK_MSG(why && strstr(why, "bias"), "%s", why ? why : "(f32 bias with an f16 D matched)");
    plan_free(&p);
    mpt_graph_free(g);
}

/* MPTC_CUDA_WGMMA=1: the same convolutions (forward, data gradient by
 * phase, filter gradient split along k) as wgmma kernels, compiled for
 * sm_90 (NVRTC is given sm_90a) with no mma.sync or ldmatrix left; for
 * sm_80 the compile fails and says why */
static void test_conv_wgmma(mpt_dtype dt) {
    setenv("MPTC_CUDA_WGMMA", "1", 1);
    mpt_plan p;
    mpt_graph *g = conv_plan(dt, &p);
    char want[96];
    /* 256x32 tiles (m64n32) for the forward and data gradient, 128x64
     * (m64n64) for the filter gradient's 144 rows */
    snprintf(want, sizeof want, "k16.f32.%s.%s", mpt_dtype_name(dt), mpt_dtype_name(dt));
    for (int k = 0; k < 3; k++) {
        int tc = 0;
        char *ptx = ptx_of(&p, k, "sm_90", &tc);
        CHECK_MSG(has(ptx, k == 2 ? "wgmma.mma_async.sync.aligned.m64n64k16"
                                  : "wgmma.mma_async.sync.aligned.m64n32k16") &&
                      has(ptx, want) && has(ptx, "wgmma.fence.sync.aligned") &&
                      has(ptx, "wgmma.commit_group.sync.aligned") &&
                      has(ptx, "wgmma.wait_group.sync.aligned") &&
                      has(ptx, "fence.proxy.async.shared::cta") && has(ptx, ".target sm_90a"),
                  "%s %s: %s and its fences", p.kernels[k].name, mpt_dtype_name(dt), want);
        CHECK_MSG(!has(ptx, "mma.sync") && !has(ptx, "ldmatrix"), "%s: no mma.sync left",
                  p.kernels[k].name);
        CHECK(has(ptx, "cp.async.cg.shared.global"));
        free(ptx);
    }
    mpt_cuda_kernel_src src;
    char err[4096];
    mpt_cuda_binary bin;
    CHECK(mpt_cuda_emit_kernel(&p, 0, &src, err, sizeof err) == 0);
    CHECK(src.wgmma == 1 && src.tensor_cores == 1);
    CHECK(mpt_cuda_compile(src.source, src.name, "sm_80", &bin, err, sizeof err) != 0 &&
          strstr(err, "wgmma") && strstr(err, "sm_90"));
    mpt_cuda_kernel_src_free(&src);
    plan_free(&p);
    mpt_graph_free(g);
    unsetenv("MPTC_CUDA_WGMMA");
}

/* ptxas' notes that it serialized wgmma: none for a wgmma whose registers
 * wait for wgmma.wait_group, one (C7517, an injected warpgroup.wait)
 * where the accumulator is read while the wgmma is in flight; the same
 * from the disk cache */
static void test_wgmma_notes(void) {
    static const char fmt[] =
        "extern \"C\" __global__ void %s(float *out, const unsigned short *in) {\n"
        "    __shared__ __align__(128) unsigned short s[64 * 16 + 8 * 16];\n"
        "    for (int i = threadIdx.x; i < 64 * 16 + 8 * 16; i += 128) s[i] = in[i];\n"
        "    asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n"
        "    __syncthreads();\n"
        "    const unsigned a = (unsigned)__cvta_generic_to_shared(s);\n"
        "    const unsigned long long da = ((a >> 4) & 0x3fff) | 8ull << 16 | 16ull << 32;\n"
        "    const unsigned long long db = da + 128;\n"
        "    float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;\n"
        "    asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n"
        "    asm volatile(\"wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 \"\n"
        "                 \"{%%0,%%1,%%2,%%3}, %%4, %%5, 1, 1, 1, 0, 0;\"\n"
        "                 : \"+f\"(d0), \"+f\"(d1), \"+f\"(d2), \"+f\"(d3)\n"
        "                 : \"l\"(da), \"l\"(db));\n"
        "    %s\n"
        "    asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n"
        "    asm volatile(\"wgmma.wait_group.sync.aligned 0;\" ::: \"memory\");\n"
        "    asm volatile(\"\" : \"+f\"(d0), \"+f\"(d1), \"+f\"(d2), \"+f\"(d3) :: \"memory\");\n"
        "    float *o = out + threadIdx.x * 4;\n"
        "    o[0] = d0; o[1] = d1; o[2] = d2; o[3] = d3;\n"
        "}\n";
    for (int bad = 0; bad < 2; bad++) {
        const char *name = bad ? "wg_early_read" : "wg_waited";
        char src[4096], err[4096], note[256];
        snprintf(src, sizeof src, fmt, name, bad ? "d0 *= in[0];" : "");
        for (int pass = 0; pass < 2; pass++) { /* compiled, then from the cache */
            mpt_cuda_binary b;
            if (mpt_cuda_compile(src, name, "sm_90", &b, err, sizeof err)) {
                CHECK_MSG(0, "%s: %s", name, err);
                continue;
            }
            const char *msg = mpt_cuda_wgmma_note(&b, note, sizeof note);
            CHECK_MSG(b.cache_hit == pass, "%s: cache hit on the second compile", name);
            if (bad)
                CHECK_MSG(b.wgmma_serial == 1 && msg && strncmp(msg, "(C75", 4) == 0 &&
                              strstr(msg, "warpgroup.wait") && !strstr(msg, "in function"),
                          "%s: %d notes, '%s' in %s", name, b.wgmma_serial, msg ? msg : "",
                          b.log);
            else
                CHECK_MSG(b.wgmma_serial == 0 && !msg, "%s: ptxas: %s", name, b.log);
            mpt_cuda_binary_free(&b);
        }
    }
}

/* occupancy by the programming guide's limits, one case for each */
static void test_blocks_per_sm(void) {
    const char *why = NULL;
    /* 104 registers x 256 threads = 26624: 2 of 65536 (shared: 3, threads: 8) */
    CHECK(mpt_cuda_blocks_per_sm("sm_90", 256, 102, 65536, &why) == 2 &&
          strcmp(why, "registers") == 0);
    /* 69 KiB + 1 KiB reserved: 2 in sm_80's 164 KiB (registers: 8) */
    CHECK(mpt_cuda_blocks_per_sm("sm_80", 128, 64, 69120, &why) == 2 &&
          strcmp(why, "shared memory") == 0);
    CHECK(mpt_cuda_blocks_per_sm("sm_90", 128, 64, 69120, &why) == 3 &&
          strcmp(why, "shared memory") == 0);
    /* sm_86: 1536 threads an SM */
    CHECK(mpt_cuda_blocks_per_sm("sm_86", 1024, 16, 0, &why) == 1 && strcmp(why, "threads") == 0);
    CHECK(mpt_cuda_blocks_per_sm("sm_90", 32, 16, 0, &why) == 32 && strcmp(why, "blocks") == 0);
    CHECK(mpt_cuda_blocks_per_sm("compute_90", 256, -1, 0, &why) == 8 &&
          strcmp(why, "threads") == 0);
    /* 255 registers x 1024 threads does not fit */
    CHECK(mpt_cuda_blocks_per_sm("sm_90", 1024, 255, 0, &why) == 0 &&
          strcmp(why, "registers") == 0);
}

int main(void) {
    char why[512];
    if (!mpt_cuda_nvrtc(why, sizeof why)) {
        printf("skip: %s\n", why);
        return 77;
    }
    char dir[] = "/tmp/mptc_cache_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    setenv("MPTC_CACHE_DIR", dir, 1);
    test_dense();
    test_softmax_xent();
    test_optimizer_loop_and_cache();
    test_compile_all();
    test_conv(MPT_DT_F16, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32");
    test_conv(MPT_DT_BF16, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32");
    test_opaque();
    test_slice_concat();
    test_batch_matmul();
    test_conv_wgmma(MPT_DT_F16);
    test_conv_wgmma(MPT_DT_BF16);
    test_wgmma_notes();
    test_blocks_per_sm();
    test_conv_lt();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    return check_exit("test_cuda_ptx");
}
