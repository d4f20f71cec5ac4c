/* tests/test_attention_mma.c — the Tensor Core attention kernels
 * (codegen/cuda/emit_attn_mma.c) on the host emulator (tests/cuda_emu.h)
 * against the interpreter's definition (ir/interp_attn.c), and through
 * NVRTC for sm_80 and sm_90 where libnvrtc is.
 *
 * Each case is one attention built as IR (attention, attention_lse and the
 * three attention_grads, as autodiff emits them) in f16 or bf16: causal
 * and not, no mask, a padding mask with fully masked rows, a [Tq, Tk]
 * mask, dropout; head sizes 16, 32, 64 and 128 (E and Ev apart, either
 * larger), lengths that are not multiples of the kernels' 64-row blocks,
 * one query, fewer keys than a block, enough keys that the forward reuses
 * its stages, cross attentions (Tq != Tk, causal too) and an f32 output
 * (with an f32 do), and the [B,T,H,D] layout (bthd) multi_head_attention
 * gives the op. Forward and backward kernel of each must
 * be on Tensor Cores (mma.sync), and every output within the tolerance
 * tests/cpu_check.h states for them (TOL_MMA). The CPU backend's attention
 * kernels run every case too, in both layouts, within the same bounds.
 */
#include "codegen/cuda/cuda.h"
#include "codegen/cuda/driver.h"
#include "cpu_check.h"
#include "cuda_emu.h"

typedef struct {
    const char *name;
    mpt_dtype dt;
    int64_t B, H, Tq, Tk, E, Ev;
    int causal, mask_rank, zero_masked, dropout, f32_out;
    int bthd; /* q, k, v, o, do and the gradients [B,T,H,D], as multi_head_attention's are */
} mma_case;

/* mask_rank 0: none (a constant); 2: padding [B, Tk], sample 0 fully
 * masked, sample 1 not at all (the rewrite zeroes such rows' probabilities: zero_masked); 3: a
 * [B, Tq, Tk] mask that leaves every row a key */
static const mma_case cases[] = {
    {"f16_causal_16", MPT_DT_F16, 2, 2, 70, 70, 16, 16, 1, 0, 0, 0, 0, 0},
    {"bf16_padding_cross_32", MPT_DT_BF16, 3, 2, 37, 70, 32, 32, 0, 2, 1, 0, 0, 0},
    {"f16_dropout_causal_padding_64", MPT_DT_F16, 3, 2, 70, 70, 64, 64, 1, 2, 1, 1, 0, 0},
    {"bf16_pairs_128_64_f32_out", MPT_DT_BF16, 2, 1, 33, 45, 128, 64, 0, 3, 0, 0, 1, 0},
    /* causal with fewer queries than keys: key blocks past the last query */
    {"f16_causal_cross_keys_past_q_32", MPT_DT_F16, 1, 2, 20, 150, 32, 32, 1, 0, 0, 0, 0, 0},
    /* one query, three key blocks (the forward's stages reused), heads of 128 with dropout */
    {"bf16_one_query_dropout_128", MPT_DT_BF16, 2, 1, 1, 150, 128, 128, 0, 3, 0, 1, 0, 0},
    /* fewer keys than a block, three query blocks, Ev > E */
    {"f16_causal_short_keys_16_48", MPT_DT_F16, 1, 1, 150, 40, 16, 48, 1, 0, 0, 0, 0, 0},
    /* the [B,T,H,D] layout: rows of a head H D apart */
    {"f16_causal_64_bthd", MPT_DT_F16, 2, 3, 70, 70, 64, 64, 1, 0, 0, 0, 0, 1},
    {"bf16_padding_cross_32_16_f32_out_bthd", MPT_DT_BF16, 3, 2, 37, 70, 32, 16, 0, 2, 1, 0, 1, 1},
};
#define N_CASES ((int)(sizeof cases / sizeof *cases))

/* f32, which the CUDA backend runs on its SIMT kernels: the CPU kernels
 * alone, whose f32 paths read q, k and v in place in [B,H,T,D] */
static const mma_case cpu_cases[] = {
    {"f32_causal_32", MPT_DT_F32, 2, 2, 70, 70, 32, 32, 1, 0, 0, 0, 0, 0},
    {"f32_padding_cross_64_16", MPT_DT_F32, 3, 2, 37, 70, 64, 16, 0, 2, 1, 0, 0, 0},
    {"f32_causal_32_bthd", MPT_DT_F32, 2, 2, 70, 70, 32, 32, 1, 0, 0, 0, 0, 1},
    {"f32_dropout_pairs_48_bthd", MPT_DT_F32, 2, 2, 33, 45, 48, 48, 0, 3, 0, 1, 0, 1},
};
#define N_CPU_CASES ((int)(sizeof cpu_cases / sizeof *cpu_cases))

/* the mask inputs (as f32, compared > 0.5 in the graph) */
static void plant_mask(const mma_case *c, mpt_tensor *m) {
    int64_t n = mpt_shape_numel(m->shape);
    for (int64_t x = 0; x < n; x++) {
        double v;
        if (c->mask_rank == 2) { /* a prefix of each sample's keys: none in sample 0, all in 1 */
            int64_t b = x / c->Tk, j = x % c->Tk, len = b == 0 ? 0 : c->Tk - (b - 1) * 11;
            v = j < len;
        } else { /* every row sees its key i % Tk and about two thirds of the others */
            int64_t j = x % c->Tk, i = x / c->Tk % c->Tq;
            v = j == i % c->Tk || (x * 7) % 3 != 0;
        }
        mpt_tensor_set(m, x, v);
    }
}

static mpt_graph *build(const mma_case *c) {
    mpt_graph *g = mpt_graph_new(c->name);
#define ROWS4(t, d) (c->bthd ? mpt_shape_4(c->B, t, c->H, d) : mpt_shape_4(c->B, c->H, t, d))
    mpt_shape sq = ROWS4(c->Tq, c->E), sk = ROWS4(c->Tk, c->E), sv = ROWS4(c->Tk, c->Ev), so = ROWS4(c->Tq, c->Ev);
#undef ROWS4
    int q = mpt_b_cast(g, mpt_b_input(g, "q", MPT_DT_F32, sq), c->dt);
    int k = mpt_b_cast(g, mpt_b_input(g, "k", MPT_DT_F32, sk), c->dt);
    int v = mpt_b_cast(g, mpt_b_input(g, "v", MPT_DT_F32, sv), c->dt);
    /* do in the output's dtype, as autodiff gives it: f32 with f32_out */
    int dout = mpt_b_input(g, "do", MPT_DT_F32, so);
    if (!c->f32_out) dout = mpt_b_cast(g, dout, c->dt);
    mpt_shape sm = c->mask_rank == 3 ? (mpt_shape){3, {c->B, c->Tq, c->Tk}} : mpt_shape_2(c->B, c->Tk);
    int mask = c->mask_rank == 0
                   ? mpt_b_const(g, MPT_DT_BOOL, sm, 1)
                   : mpt_b_binary(g, MPT_OP_GT, mpt_b_input(g, "mask", MPT_DT_F32, sm),
                                  mpt_b_const(g, MPT_DT_F32, sm, 0.5));
    int counter = mpt_b_input(g, "counter", MPT_DT_I32, mpt_shape_scalar());
    /* dropout at rate 0.5 (ir/attention.c: the threshold of 24 random bits, 1 / (1 - rate)) */
    float two = 2.0f;
    uint32_t two_bits;
    memcpy(&two_bits, &two, 4);
    double scale = 1.0 / sqrt((double)c->E);
    mpt_attr a = {.i = {c->causal, c->zero_masked, c->f32_out, 1234, c->dropout ? 1 << 23 : 0,
                        c->dropout ? two_bits : 0, c->bthd},
                  .f = scale};
    int o = mpt_b_attention(g, (int[]){q, k, v, mask, counter}, &a);
    int lse = mpt_b_attention_lse(g, q, k, mask, c->causal, c->bthd, scale);
    mpt_graph_add_output(g, "o", o);
    mpt_graph_add_output(g, "lse", lse);
    mpt_attr ga = {.i = {0, c->causal, c->zero_masked, a.i[3], a.i[4], a.i[5], c->bthd}, .f = scale};
    static const char *names[3] = {"dq", "dk", "dv"};
    for (int w = 0; w < 3; w++) {
        ga.i[0] = w;
        mpt_graph_add_output(g, names[w], mpt_b_attention_grad(g, (int[]){q, k, v, o, dout, lse, mask, counter}, &ga));
    }
    char err[256];
    const char *bad = mpt_graph_verify(g, err, sizeof err);
    CHECK_MSG(bad == NULL, "%s: %s", c->name, bad);
    return g;
}

/* |got - ref| within TOL_MMA of the compute dtype, scaled by the output's
 * largest magnitude (lse: an f32 sum, the f32 accumulation entry; its
 * -1e9 of fully masked rows left out of the scale) */
static void check_output(const mma_case *c, const mpt_tensor *got, const mpt_tensor *ref, int lse,
                         const char *what) {
    double max_ref = 0, max_err = 0;
    int64_t n = mpt_shape_numel(ref->shape);
    for (int64_t i = 0; i < n; i++) {
        double r = fabs(mpt_tensor_get(ref, i));
        if (r < 1e8) max_ref = fmax(max_ref, r);
    }
    tol t;
    if (lse) {
        t = tol_for(TOL_ACCUM, MPT_DT_F32, c->E);
        t.atol *= fmax(1, max_ref);
    } else if (c->dt == MPT_DT_F32) { /* f32 sums of up to Tk terms (the CPU's only) */
        t = tol_for(TOL_ACCUM, MPT_DT_F32, c->Tk > c->Tq ? c->Tk : c->Tq);
        t.atol *= max_ref;
    } else {
        t = tol_for(TOL_MMA, c->dt, 1);
        t.atol *= max_ref;
    }
    for (int64_t i = 0; i < n; i++)
        max_err = fmax(max_err, fabs(mpt_tensor_get(got, i) - mpt_tensor_get(ref, i)));
    if (getenv("MPTC_TEST_VERBOSE"))
        printf("%s: max |error| %.3g, %.3g of max |ref| %.3g\n", what, max_err, max_err / fmax(max_ref, 1e-30),
               max_ref);
    compare(got, ref, t, what);
}

typedef struct {
    mpt_graph *g;
    mpt_plan *p;
    mpt_tensor *vals;
    mpt_cuda_kernel_src src[2];
    int n;
} mma_run;

/* the case's graph on the interpreter and the CPU backend, its two
 * attention kernels emitted for CUDA (cuda 0: not) */
static void prepare(const mma_case *c, mma_run *r, int cuda) {
    memset(r, 0, sizeof *r);
    r->g = build(c);
    mpt_fusion_opts fo;
    mpt_fusion_opts_default(&fo);
    r->p = mpt_fuse(r->g, &fo);
    int ni = mpt_graph_n_inputs(r->g);
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in), outs[8] = {0};
    r->vals = calloc((size_t)r->g->n_nodes, sizeof *r->vals);
    emu_fill_inputs(r->g, in, 7);
    for (int k = 0; k < ni; k++) {
        const mpt_node *nd = &r->g->nodes[mpt_graph_input_node(r->g, k)];
        if (strcmp(nd->name, "mask") == 0) plant_mask(c, &in[k]);
        if (strcmp(nd->name, "counter") == 0) mpt_tensor_set(&in[k], 0, 3);
        /* q in [-3, 3), key j's row growing from [-1, 1) to [-3, 3): the
         * scores spread over several units and tend to grow along the
         * keys, so rows' maxima move from one key block to the next and
         * the online softmax's rescaling shows */
        int is_q = strcmp(nd->name, "q") == 0, is_k = strcmp(nd->name, "k") == 0;
        for (int64_t i = 0; (is_q || is_k) && i < mpt_shape_numel(nd->shape); i++) {
            double j = (double)(i / c->E % c->Tk);
            mpt_tensor_set(&in[k], i, (is_q ? 3 : 1 + 2 * j / c->Tk) * mpt_tensor_get(&in[k], i));
        }
    }
    char err[1024];
    mpt_interp_opts io = {.on_node = emu_capture, .ctx = r->vals};
    int rc = mpt_interp_run(r->g, in, NULL, outs, &io, err, sizeof err);
    CHECK_MSG(rc == 0, "%s: interpreter: %s", c->name, err);
    /* the CPU backend's kernels (codegen/cpu/attention*.c) on the same
     * inputs, each output against the interpreter's within the same
     * tolerance: they multiply in f32, closer than the Tensor Cores */
    mpt_exec *x = rc == 0 ? mpt_backend_cpu.compile(r->p, err, sizeof err) : NULL;
    CHECK_MSG(rc != 0 || x != NULL, "%s: CPU compile: %s", c->name, err);
    mpt_tensor cpu[8] = {0};
    if (x && mpt_backend_cpu.run(x, in, NULL, cpu, err, sizeof err) == 0) {
        for (int k = 0; k < r->g->n_outputs; k++) {
            char what[200];
            snprintf(what, sizeof what, "%s: CPU %s", c->name, r->g->outputs[k].name);
            check_output(c, &cpu[k], &outs[k], strcmp(r->g->outputs[k].name, "lse") == 0, what);
            mpt_tensor_free(&cpu[k]);
        }
    } else if (x) {
        CHECK_MSG(0, "%s: CPU run: %s", c->name, err);
    }
    if (x) mpt_backend_cpu.free(x);
    for (int k = 0; rc == 0 && k < r->g->n_outputs; k++) mpt_tensor_free(&outs[k]);
    for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    free(in);
    for (int k = 0; cuda && rc == 0 && k < r->p->n_kernels && r->n < 2; k++) {
        const mpt_kernel *kn = &r->p->kernels[k];
        mpt_op op = r->g->nodes[kn->root].op;
        if (kn->kind != MPT_KERNEL_OPAQUE || (op != MPT_OP_ATTENTION && op != MPT_OP_ATTENTION_GRAD))
            continue;
        int e = mpt_cuda_emit_kernel(r->p, k, &r->src[r->n], err, sizeof err);
        CHECK_MSG(e == 0, "%s: emit: %s", c->name, err);
        if (e) continue;
        CHECK_MSG(r->src[r->n].tensor_cores && strstr(r->src[r->n].source, "mma.sync.aligned.m16n8k16"),
                  "%s: %s is not on Tensor Cores", c->name, r->src[r->n].name);
        r->n++;
    }
    CHECK_MSG(!cuda || r->n == 2, "%s: %d attention kernels, want 2 (forward, backward)", c->name, r->n);
}

/* kernel x of r on the emulator, its outputs against the interpreter's */
static void run_kernel(const mma_case *c, mma_run *r, emu_module *em, int at, int x) {
    const mpt_cuda_kernel_src *s = &r->src[x];
    char err[1024];
    void **args = calloc((size_t)s->n_params + 1, sizeof *args);
    void **maps = calloc((size_t)s->n_params + 1, sizeof *maps);
    size_t *lens = calloc((size_t)s->n_params + 1, sizeof *lens);
    for (int j = 0; j < s->n_params; j++) {
        const mpt_node *nd = &r->g->nodes[s->params[j]];
        size_t bytes = (size_t)mpt_shape_numel(nd->shape) * mpt_dtype_size(nd->dtype);
        args[j] = emu_buffer(bytes, &maps[j], &lens[j]);
        if (j < s->n_inputs) memcpy(args[j], r->vals[s->params[j]].data, bytes);
        else memset(args[j], 0xff, bytes); /* NaN: an element left unwritten fails */
    }
    int lr = emu_launch(em, at, args, err, sizeof err);
    CHECK_MSG(lr == 0, "%s: %s: %s", c->name, s->name, err);
    for (int j = s->n_inputs; lr == 0 && j < s->n_params; j++) {
        const mpt_tensor *ref = &r->vals[s->params[j]];
        mpt_tensor got = {ref->dtype, ref->shape, args[j]};
        const mpt_node *nd = &r->g->nodes[s->params[j]];
        char what[200];
        snprintf(what, sizeof what, "%s: %s %s", c->name, s->name,
                 nd->op == MPT_OP_ATTENTION_GRAD ? (const char *[]){"dq", "dk", "dv"}[nd->attr.i[0]]
                 : nd->op == MPT_OP_ATTENTION    ? "o"
                                                 : "lse");
        check_output(c, &got, ref, nd->op == MPT_OP_ATTENTION_LSE, what);
    }
    for (int j = 0; j < s->n_params; j++) munmap(maps[j], lens[j]);
    free(args);
    free(maps);
    free(lens);
}

/* NVRTC for arch: mma.sync of the dtype and ldmatrix in the PTX, no
 * spills, and the launch fits (a block an SM at least) */
static void check_nvrtc(const mma_case *c, const mpt_cuda_kernel_src *s, const char *arch) {
    const char *mma = c->dt == MPT_DT_F16 ? "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
                                          : "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32";
    mpt_cuda_binary bin = {0};
    char err[4096];
    int cr = mpt_cuda_compile(s->source, s->name, arch, &bin, err, sizeof err);
    CHECK_MSG(cr == 0, "%s %s: NVRTC: %s", s->name, arch, err);
    if (cr) return;
    const char *why = "";
    int blocks = mpt_cuda_blocks_per_sm(arch, s->block[0], bin.regs,
                                        s->shared_bytes + (unsigned)bin.static_smem, &why);
    CHECK_MSG(strstr(bin.ptx, mma) && strstr(bin.ptx, "ldmatrix.sync.aligned.m8n8.x4"),
              "%s %s: no %s in the PTX", s->name, arch, mma);
    CHECK_MSG(bin.regs > 0 && bin.spill_stores == 0 && bin.spill_loads == 0 && blocks >= 1,
              "%s %s: %d registers, %d bytes spilled, %d blocks an SM (%s)", s->name, arch,
              bin.regs, bin.spill_stores, blocks, why);
    if (getenv("MPTC_TEST_VERBOSE")) {
        int nm = 0;
        for (const char *q = bin.ptx; (q = strstr(q, "mma.sync")); q++) nm++;
        printf("%s %s: %d registers, %u B shared, %d blocks an SM (%s), %d mma.sync in the PTX\n",
               s->name, arch, bin.regs, s->shared_bytes, blocks, why, nm);
    }
    mpt_cuda_binary_free(&bin);
}

int main(void) {
    /* the emulator fails a cp.async and another warp's ldmatrix on the same
     * shared bytes with no barrier between (tests/cuda_host.hpp): the
     * stages' reuse races no result shows here */
    setenv("MPTH_RACE", "1", 0);
    for (int c = 0; c < N_CPU_CASES; c++) {
        mma_run r;
        prepare(&cpu_cases[c], &r, 0);
        for (int i = 0; r.vals && i < r.g->n_nodes; i++) mpt_tensor_free(&r.vals[i]);
        free(r.vals);
        mpt_plan_free(r.p);
        mpt_graph_free(r.g);
    }
    mma_run runs[N_CASES];
    mpt_cuda_kernel_src all[2 * N_CASES];
    int n_all = 0;
    for (int c = 0; c < N_CASES; c++) {
        prepare(&cases[c], &runs[c], 1);
        for (int x = 0; x < runs[c].n; x++) all[n_all++] = runs[c].src[x];
    }
    /* one host build of every kernel (one g++ run a core) */
    emu_module em;
    char err[2048];
    int built = n_all > 0 && emu_build(&em, all, n_all, err, sizeof err) == 0;
    CHECK_MSG(built, "emulator build: %s", err);
    for (int c = 0, at = 0; built && c < N_CASES; c++)
        for (int x = 0; x < runs[c].n; x++) run_kernel(&cases[c], &runs[c], &em, at++, x);
    if (built) emu_free(&em);
    char why[256];
    int nvrtc = mpt_cuda_nvrtc(why, sizeof why) != NULL;
    if (!nvrtc) printf("note: NVRTC not checked: %s\n", why);
    /* each kernel for one architecture (suite time): the first two cases'
     * forward for sm_80 and backward for sm_90, the last two's the other
     * way round, so f16 and bf16, forward and backward, meet both */
    static const char *archs[] = {"sm_80", "sm_90"};
    for (int c = 0; nvrtc && c < N_CASES; c++)
        for (int x = 0; x < runs[c].n; x++)
            check_nvrtc(&cases[c], &runs[c].src[x], archs[(c / 2 + x) % 2]);
    for (int c = 0; c < N_CASES; c++) {
        for (int x = 0; x < runs[c].n; x++) mpt_cuda_kernel_src_free(&runs[c].src[x]);
        for (int i = 0; runs[c].vals && i < runs[c].g->n_nodes; i++) mpt_tensor_free(&runs[c].vals[i]);
        free(runs[c].vals);
        mpt_plan_free(runs[c].p);
        mpt_graph_free(runs[c].g);
    }
    return check_exit("test_attention_mma");
}
