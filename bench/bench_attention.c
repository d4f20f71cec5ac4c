/* bench/bench_attention.c — attention's core alone on the CPU backend:
 * forward and backward of causal (or --padding: padding-masked)
 * self-attention, q, k, v [B, H, T, E],
 * as the primitive ops multi_head_attention lowers to (two batch_matmuls,
 * the mask, the softmax; each batch_matmul a kernel of its own, the
 * [B, H, T, T] scores in memory) against the same graph after the
 * attention rewrite (one attention kernel, one attention_grad kernel).
 * Both plans fused, under a policy (the scores and softmax f32 always).
 *
 *   build/bench/bench_attention [--threads N] [--reps N] [--policy P] [--fused-only] [--bthd] [--padding|--padding-causal] [--dropout R] [T ...]
 *
 * --fused-only times the fused plan alone (for a profiler). --bthd gives
 * q, k, v and o as [B, T, H, E] with the transposes multi_head_attention
 * has, which the attention rewrite folds into the op (ops.def's bthd).
 *
 * One thread (the default) is timed in the thread's CPU clock, so other
 * jobs on a shared machine do not count; more threads in wall time. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen/backend.h"
#include "codegen/cpu/cpu_backend.h"
#include "fusion/fusion.h"
#include "ir/ir.h"

enum { B = 4, H = 4, E = 32 };

static clockid_t bench_clock = CLOCK_THREAD_CPUTIME_ID;

static double now(void) {
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* the forward graph: o = softmax(causal(q k^T)) v, output "output" */
static int bthd; /* --bthd: q, k, v and o [B, T, H, E], as multi_head_attention's */
/* --padding: a padding mask [B, T] instead of the causal one, applied as
 * multi_head_attention's attention_mask is (lang/lower_layers.c): -1e9
 * where it is 0, and the masked probabilities zeroed; sample b sees its
 * first T - 16 b keys */
static int padding; /* 2 (--padding-causal): the padding mask AND the causal one */
/* --dropout R: the probabilities' dropout as multi_head_attention's
 * dropout lowers (lang/lower.c): random_uniform under a counter, kept
 * ones scaled by 1 / (1 - R) */
static double dropout;

static mpt_graph *forward(int64_t t) {
    static const int heads[4] = {0, 2, 1, 3};
    mpt_graph *g = mpt_graph_new("attention");
    mpt_shape s = bthd ? mpt_shape_4(B, t, H, E) : mpt_shape_4(B, H, t, E);
    int q = mpt_b_input(g, "x", MPT_DT_F32, s), k = mpt_b_input(g, "k", MPT_DT_F32, s);
    int v = mpt_b_input(g, "v", MPT_DT_F32, s);
    int mask = padding ? mpt_b_input(g, "mask", MPT_DT_F32, mpt_shape_2(B, t)) : -1;
    mpt_b_layer(g, "attn");
    q = mpt_b_binary(g, MPT_OP_MUL, q, mpt_b_const(g, MPT_DT_F32, s, 1.0 / sqrt((double)E)));
    if (bthd) {
        q = mpt_b_transpose(g, q, heads);
        k = mpt_b_transpose(g, k, heads);
        v = mpt_b_transpose(g, v, heads);
    }
    int sc = mpt_b_batch_matmul(g, q, k, 0, 1);
    mpt_shape ss = g->nodes[sc].shape;
    int attend = -1;
    if (padding) {
        int wide = mpt_b_broadcast(g, mask, ss, (1 << 0) | (1 << 3));
        attend = mpt_b_unary(g, MPT_OP_NOT, mpt_b_binary(g, MPT_OP_EQ, wide, mpt_b_const(g, MPT_DT_F32, ss, 0)));
        if (padding == 2) {
            int later = mpt_b_binary(g, MPT_OP_GT, mpt_b_iota(g, MPT_DT_I32, ss, 3), mpt_b_iota(g, MPT_DT_I32, ss, 2));
            attend = mpt_b_binary(g, MPT_OP_AND, attend, mpt_b_unary(g, MPT_OP_NOT, later));
        }
        sc = mpt_b_select(g, attend, sc, mpt_b_const(g, MPT_DT_F32, ss, -1e9));
    } else {
        int later = mpt_b_binary(g, MPT_OP_GT, mpt_b_iota(g, MPT_DT_I32, ss, 3), mpt_b_iota(g, MPT_DT_I32, ss, 2));
        sc = mpt_b_select(g, later, mpt_b_const(g, MPT_DT_F32, ss, -1e9), sc);
    }
    int mx = mpt_b_broadcast(g, mpt_b_reduce(g, MPT_OP_REDUCE_MAX, sc, 8), ss, 7);
    int e = mpt_b_unary(g, MPT_OP_EXP, mpt_b_binary(g, MPT_OP_SUB, sc, mx));
    int sum = mpt_b_broadcast(g, mpt_b_reduce(g, MPT_OP_REDUCE_SUM, e, 8), ss, 7);
    int pr = mpt_b_binary(g, MPT_OP_DIV, e, sum);
    if (attend >= 0) pr = mpt_b_select(g, attend, pr, mpt_b_const(g, MPT_DT_F32, ss, 0));
    if (dropout > 0) {
        int counter = mpt_b_input(g, "counter", MPT_DT_I32, mpt_shape_scalar());
        int u = mpt_b_random_uniform(g, counter, ss, 1234);
        int keep = mpt_b_unary(g, MPT_OP_NOT, mpt_b_binary(g, MPT_OP_LT, u, mpt_b_const(g, MPT_DT_F32, ss, dropout)));
        int scaled = mpt_b_binary(g, MPT_OP_MUL, pr, mpt_b_const(g, MPT_DT_F32, ss, 1.0 / (1.0 - dropout)));
        pr = mpt_b_select(g, keep, scaled, mpt_b_const(g, MPT_DT_F32, ss, 0));
    }
    int o = mpt_b_batch_matmul(g, pr, v, 0, 0);
    if (bthd) o = mpt_b_transpose(g, o, heads);
    mpt_graph_add_output(g, "output", o);
    return g;
}

/* the typed forward graph with y = sum(o * w) and its gradients in q, k, v */
static mpt_graph *step_of(const mpt_graph *typed) {
    mpt_graph *g = mpt_graph_new("step");
    int *map = calloc((size_t)typed->n_nodes + 1, sizeof *map);
    for (int i = 0; i < typed->n_nodes; i++) map[i] = mpt_graph_copy_node(g, typed, i, map);
    int o = mpt_b_cast(g, map[typed->outputs[0].node], MPT_DT_F32);
    free(map);
    int w = mpt_b_input(g, "w", MPT_DT_F32, g->nodes[o].shape);
    int y = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_binary(g, MPT_OP_MUL, o, w), 15);
    int wrt[3] = {mpt_graph_input_node(g, 0), mpt_graph_input_node(g, 1), mpt_graph_input_node(g, 2)}, d[3];
    char err[256];
    if (mpt_autodiff(g, y, -1, wrt, 3, d, err, sizeof err)) {
        fprintf(stderr, "bench_attention: autodiff: %s\n", err);
        exit(1);
    }
    mpt_graph_add_output(g, "y", y);
    for (int i = 0; i < 3; i++) mpt_graph_add_output(g, i == 0 ? "dq" : i == 1 ? "dk" : "dv", d[i]);
    return g;
}

/* best seconds of one step over reps; the plan's kernels and peak */
static double time_step(const mpt_graph *step, int reps, int *kernels, int64_t *peak) {
    mpt_fusion_opts fo;
    mpt_fusion_opts_default(&fo);
    mpt_plan *p = mpt_fuse(step, &fo);
    *kernels = p->n_kernels;
    *peak = p->peak_bytes;
    char err[1024];
    mpt_exec *x = mpt_backend_cpu.compile(p, err, sizeof err);
    if (!x) {
        fprintf(stderr, "bench_attention: compile: %s\n", err);
        exit(1);
    }
    int ni = mpt_graph_n_inputs(step), no = step->n_outputs;
    mpt_tensor *in = calloc((size_t)ni, sizeof *in), *out = calloc((size_t)no, sizeof *out);
    for (int k = 0; k < ni; k++) {
        const mpt_node *nd = &step->nodes[mpt_graph_input_node(step, k)];
        mpt_tensor_alloc(&in[k], nd->dtype, nd->shape);
        int is_mask = !strcmp(nd->name, "mask");
        for (int64_t i = 0; i < mpt_shape_numel(nd->shape); i++)
            mpt_tensor_set(&in[k], i, is_mask ? (double)(i % nd->shape.dim[1] < nd->shape.dim[1] - 16 * (i / nd->shape.dim[1]))
                                              : sin((double)i * 0.37 + k));
    }
    double best = INFINITY;
    for (int r = 0; r <= reps; r++) { /* the first run warms up */
        double t0 = now();
        if (mpt_backend_cpu.run(x, in, NULL, out, err, sizeof err)) {
            fprintf(stderr, "bench_attention: run: %s\n", err);
            exit(1);
        }
        double dt = now() - t0;
        if (r > 0 && dt < best) best = dt;
        for (int k = 0; k < no; k++) mpt_tensor_free(&out[k]);
    }
    for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    free(in);
    free(out);
    mpt_backend_cpu.free(x);
    mpt_plan_free(p);
    return best;
}

int main(int argc, char **argv) {
    int threads = 1, reps = 3, n_t = 0, fused_only = 0;
    const char *policy = "float32";
    int64_t ts[16];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--policy") && i + 1 < argc) policy = argv[++i];
        else if (!strcmp(argv[i], "--fused-only")) fused_only = 1;
        else if (!strcmp(argv[i], "--bthd")) bthd = 1;
        else if (!strcmp(argv[i], "--padding")) padding = 1;
        else if (!strcmp(argv[i], "--padding-causal")) padding = 2;
        else if (!strcmp(argv[i], "--dropout") && i + 1 < argc) dropout = atof(argv[++i]);
        else if (atoi(argv[i]) > 0 && n_t < 16) ts[n_t++] = atoi(argv[i]);
        else {
            fprintf(stderr, "usage: %s [--threads N] [--reps N] [--policy P] [--fused-only] [--bthd] [--padding|--padding-causal] [--dropout R] [T ...]\n", argv[0]);
            return 2;
        }
    }
    if (!n_t) ts[n_t++] = 256;
    if (threads != 1) bench_clock = CLOCK_MONOTONIC;
    mpt_backend_cpu.threads = threads;
    mpt_policy_opts po = {0};
    if (mpt_policy_lookup(policy, &po.global)) {
        fprintf(stderr, "bench_attention: unknown policy %s\n", policy);
        return 2;
    }
    printf("%s self-attention forward + backward, B %d, H %d, E %d, %s; %d thread%s (%s time), best of %d\n",
           padding == 2 ? "padding-masked causal" : padding ? "padding-masked" : "causal", B, H, E, policy, threads, threads == 1 ? "" : "s", threads == 1 ? "thread CPU" : "wall", reps);
    printf("%6s %14s %8s %10s %14s %8s %10s %8s\n", "T", "unfused ms", "kernels", "peak MiB", "fused ms",
           "kernels", "peak MiB", "speedup");
    for (int i = 0; i < n_t; i++) {
        char err[256];
        mpt_graph *fwd = forward(ts[i]);
        mpt_graph *typed = mpt_policy_apply(fwd, &po, err, sizeof err);
        mpt_attention_note *notes;
        int n_notes;
        mpt_graph *rewritten = typed ? mpt_attention_rewrite(typed, NULL, bthd, &notes, &n_notes) : NULL;
        if (!rewritten) {
            fprintf(stderr, "bench_attention: the rewrite did not apply: %s\n",
                    typed && n_notes ? notes[0].reason : err);
            return 1;
        }
        free(notes);
        mpt_graph *su = step_of(typed), *sf = step_of(rewritten);
        int ku = 0, kf;
        int64_t pu = 0, pf;
        double tu = fused_only ? NAN : time_step(su, reps, &ku, &pu), tf = time_step(sf, reps, &kf, &pf);
        printf("%6lld %14.2f %8d %10.1f %14.2f %8d %10.1f %7.2fx\n", (long long)ts[i], tu * 1e3, ku,
               (double)pu / 1048576.0, tf * 1e3, kf, (double)pf / 1048576.0, tu / tf);
        mpt_graph_free(su);
        mpt_graph_free(sf);
        mpt_graph_free(rewritten);
        mpt_graph_free(typed);
        mpt_graph_free(fwd);
    }
    return 0;
}
