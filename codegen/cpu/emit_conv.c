/* codegen/cpu/emit_conv.c — GEMM and CONV kernels: generated prologue loops
 * (operands computed in the kernel, i.e. casts, are materialised into
 * scratch), the GEMM of codegen/cpu/gemm.c as the core, and a generated
 * epilogue loop for whatever the GEMM's own epilogue cannot do exactly.
 *
 * The GEMM's own epilogue takes the exact prefix of the chain root -> op ->
 * op ... (codegen/cpu/emit_epi.c); the epilogue loop does the rest.
 *
 * Convolutions are implicit GEMMs (emit_cols.c: the im2col columns are made
 * a register sliver at a time inside the GEMM's packing, never stored) for
 * the forward pass and the filter gradient; the data gradient is one
 * implicit GEMM per stride phase (mpt_cpu_dgrad_phase), or GEMM + col2im with
 * MPT_CPU_DGRAD=col2im. A 1x1 stride-1 unpadded convolution reads its
 * input as the GEMM operand directly, and its data gradient is one GEMM
 * into dx. MPT_CPU_CONV_EXPLICIT=1 writes the column matrix to memory
 * instead (forward and filter gradient), to compare. With f32 operands the
 * forward and filter-gradient GEMMs read the columns straight from a
 * zero-padded copy of the image (codegen/cpu/emit_gather.c), with no fill
 * or packing; MPT_CPU_CONV_GATHER=0 fills and packs them as for f16/bf16
 * (mpt_cpu_gather_pays says where gathering is chosen).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/emit.h"

static char *kernel_members(const mpt_cpu_cc *cc, const mpt_kernel *k) {
    char *in = calloc((size_t)cc->p->g->n_nodes + 1, 1);
    if (in)
        for (int i = 0; i < k->n_nodes; i++) in[k->nodes[i]] = 1;
    return in;
}

/* Slots for the kernel's inputs and outputs (constants are folded). */
static int common_slots(const mpt_graph *g, mpt_cpu_kx *x) {
    for (int i = 0; i < x->k->n_inputs; i++)
        if (g->nodes[x->k->inputs[i]].op != MPT_OP_CONST && mpt_cpu_kx_slot(x, x->k->inputs[i], 0) < 0)
            return -1;
    for (int i = 0; i < x->k->n_outputs; i++)
        if (mpt_cpu_kx_slot(x, x->k->outputs[i], 0) < 0) return -1;
    return 0;
}

static int64_t bytes_of(const mpt_node *nd) {
    return mpt_shape_numel(nd->shape) * (int64_t)mpt_dtype_size(nd->dtype);
}

/* A GEMM/conv operand: its buffer, or a scratch value a prologue loop fills. */
static int operand_slot(mpt_cpu_cc *cc, mpt_cpu_kx *x, const char *in_k, int id, char *err, size_t n) {
    const mpt_node *nd = &cc->p->g->nodes[id];
    if (!in_k[id]) {
        if (nd->op == MPT_OP_CONST) {
            snprintf(err, n, "kernel %s: a GEMM/conv operand is a constant (hint: the fusion pass "
                     "should have materialised it)", x->k->name);
            return -1;
        }
        return mpt_cpu_kx_slot(x, id, 0);
    }
    int s = mpt_cpu_kx_slot(x, id, bytes_of(nd));
    if (s < 0) return -1;
    memcpy(cc->in_fn, in_k, (size_t)cc->p->g->n_nodes);
    if (mpt_cpu_gen(cc, x, 0, &id, 1, err, n)) return -1;
    x->n_pre = x->n_fns;
    return s;
}

/* No epilogue steps after all: C holds the root again. */
static int drop_chain(mpt_cpu_kx *x, mpt_cpu_gemm_desc *d, int root) {
    d->n_steps = 0;
    for (int i = 0; i < MPT_CPU_EPI_MAX; i++) x->epi_slot[i] = x->epi_node[i] = -1;
    x->n_epi = 0;
    return root;
}

const mpt_cpu_epilogue_args *mpt_cpu_chain_args(const mpt_cpu_kx *x, mpt_cpu_epilogue_args *epi) {
    memset(epi, 0, sizeof *epi);
    for (int i = 0; i < x->n_epi; i++) {
        epi->step[i].ptr = x->epi_slot[i] >= 0 ? x->slots[x->epi_slot[i]] : NULL;
        epi->step[i].scalar = x->epi_scalar[i];
    }
    return x->n_epi ? epi : NULL;
}

/* The loop writing every output but c (the core's), reading c from memory. */
static int epilogue(mpt_cpu_cc *cc, mpt_cpu_kx *x, const char *in_k, int c, char *err, size_t n) {
    int *targets = malloc(((size_t)x->k->n_outputs + 1) * sizeof *targets), nt = 0;
    if (!targets) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    const mpt_graph *g = cc->p->g;
    int ands[MPT_CPU_EPI_MAX], na = 0;
    for (int i = 0; i < x->k->n_outputs; i++) {
        int o = x->k->outputs[i], stored = 0;
        for (int s = 0; s < x->n_epi; s++) stored |= x->epi_node[s] == o;
        if (o == c || stored) continue;
        if (g->nodes[o].op != MPT_OP_REDUCE_ALL) {
            targets[nt++] = o;
            continue;
        }
        /* a column reduce_all (fusion's epilogue reductions) */
        if (na == MPT_CPU_EPI_MAX || (x->and_slot[na] = mpt_cpu_kx_slot(x, o, 0)) < 0) {
            free(targets);
            snprintf(err, n, "kernel %s: too many reductions in one epilogue", x->k->name);
            return -1;
        }
        x->and_bytes[na] = bytes_of(&g->nodes[o]);
        ands[na++] = o;
    }
    x->n_and = na;
    int rc = 0;
    if (nt || na) {
        memcpy(cc->in_fn, in_k, (size_t)g->n_nodes);
        cc->in_fn[c] = 0;
        for (int s = 0; s < x->n_epi; s++)
            if (x->epi_node[s] >= 0) cc->in_fn[x->epi_node[s]] = 0; /* in memory too */
        cc->and_targets = ands;
        cc->n_and = na;
        rc = mpt_cpu_gen(cc, x, 0, targets, nt, err, n);
        cc->and_targets = NULL;
        cc->n_and = 0;
    }
    free(targets);
    return rc;
}

/* Whether a bf16 GEMM's A, K contiguous, is read in place as pairs on
 * vdpbf16ps (desc.a_pairs): where that instruction outruns f32 FMAs and
 * there is no AMX, the pairs are side by side in A's rows already, and
 * interleaving them into slivers cost more than reading them where they
 * are (mlp_cpu bf16, batch 512, forced on the AMX host: the forward GEMMs
 * 5-15% faster, logits' 2x; docs/BENCHMARKS.md). MPT_CPU_GEMM_GATHER=0
 * packs them, to compare. */
static int pairs_in_place(const mpt_cpu_jit *j, const mpt_cpu_gemm_desc *d, int64_t K) {
    const char *env = getenv("MPT_CPU_GEMM_GATHER"); /* 0: packed, to compare */
    return !(env && !strcmp(env, "0")) && d->a_dt == MPT_DT_BF16 && d->b_dt == MPT_DT_BF16 && !d->trans_a &&
           K % 2 == 0 && mpt_cpu_pairs_pay(j);
}

/* Whether a GEMM with N output columns and K products per element reads
 * A in place (mpt_cpu_gemm_run_gather with plain row and column offsets)
 * instead of packing it. MPT_CPU_GEMM_GATHER=0 never, =1 always. */
static int narrow_gather_pays(const mpt_cpu_jit *j, const mpt_cpu_gemm_desc *d, int64_t N, int64_t K) {
    const char *env = getenv("MPT_CPU_GEMM_GATHER");
    if (env && (!strcmp(env, "0") || !strcmp(env, "1"))) return env[0] == '1';
    /* measured on mlp_cpu's logits (f32, 512 x 10 x 1024): 0.65-0.70 ->
     * 0.20 ms. Not for a transposed A (its k runs down columns, a cache line
     * per k: the wgrad 1024 x 10 x 512 was slower) nor bf16 (the AMX tile
     * path was faster), unless in pairs */
    return (N <= 16 && K >= 64 && !d->trans_a && d->a_dt != MPT_DT_BF16) || pairs_in_place(j, d, K);
}

/* A read in place through plain tables (row i at i * lda, column k at
 * k, or transposed): narrow products, and bf16 pairs (pairs_in_place) */
static int plain_gather(const mpt_cpu_cc *cc, mpt_cpu_kx *x, mpt_cpu_gemm_desc *d, char *err, size_t n) {
    int64_t es = (int64_t)mpt_dtype_size(d->a_dt), lda = d->trans_a ? x->M : x->K;
    x->g_row = malloc((size_t)x->M * sizeof *x->g_row);
    x->g_col = malloc((size_t)x->K * sizeof *x->g_col);
    if (!x->g_row || !x->g_col) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    for (int64_t i = 0; i < x->M; i++) x->g_row[i] = i * (d->trans_a ? 1 : lda) * es;
    for (int64_t q = 0; q < x->K; q++) x->g_col[q] = q * (d->trans_a ? lda : 1) * es;
    x->gather = 1;
    d->a_gather = 1;
    d->a_pairs = pairs_in_place(cc->jit, d, x->K);
    d->a_row_step = mpt_cpu_gather_row_step(x->g_row, x->M);
    d->n_hint = x->N;
    return 0;
}

int mpt_cpu_plan_gemm(mpt_cpu_cc *cc, mpt_cpu_kx *x, char *err, size_t n) {
    const mpt_graph *g = cc->p->g;
    const mpt_kernel *k = x->k;
    const mpt_node *nd = &g->nodes[k->root];
    char *in_k = kernel_members(cc, k);
    int rc = -1;
    if (!in_k || common_slots(g, x)) {
        snprintf(err, n, "out of memory");
        goto done;
    }
    mpt_cpu_gemm_desc d;
    memset(&d, 0, sizeof d);
    d.trans_a = (int)nd->attr.i[0];
    d.trans_b = (int)nd->attr.i[1];
    d.keep_text = cc->keep_text;
    int c = mpt_cpu_epi_chain(g, k, in_k, x, &d);
    mpt_cpu_epi_finite(g, k, in_k, x, &d, c);
    const mpt_node *a = &g->nodes[nd->in[0]], *b = &g->nodes[nd->in[1]];
    d.a_dt = a->dtype;
    d.b_dt = b->dtype;
    d.c_dt = g->nodes[c].dtype;
    x->M = nd->shape.dim[0];
    x->N = nd->shape.dim[1];
    x->K = d.trans_a ? a->shape.dim[0] : a->shape.dim[1];
    if ((x->a_slot = operand_slot(cc, x, in_k, nd->in[0], err, n)) < 0) goto done;
    if ((x->b_slot = operand_slot(cc, x, in_k, nd->in[1], err, n)) < 0) goto done;
    x->c_slot = mpt_cpu_kx_slot(x, c, mpt_cpu_kernel_output(k, c) ? 0 : bytes_of(&g->nodes[c]));
    if (x->c_slot < 0) goto done;
    if (narrow_gather_pays(cc->jit, &d, x->N, x->K)) {
        /* a narrow product (a classifier's N = 10 logits): each element of
         * A feeds only N products, so packing it (for a row-major A, a
         * transpose) costs more than the FMAs; the micro-kernel broadcasts
         * A's elements from where they are (the tables also serve a
         * transposed A, which MPT_CPU_GEMM_GATHER=1 forces); or bf16
         * pairs in place */
        if (plain_gather(cc, x, &d, err, n)) goto done;
    }
    if (!(x->gemm = mpt_cpu_cc_gemm(cc, &d, err, n)) || mpt_cpu_gemm_prepare(x->gemm, x->N, err, n))
        goto done;
    char steps[160];
    mpt_cpu_epi_describe(&d, steps, sizeof steps);
    snprintf(x->core, sizeof x->core, "%sgemm M=%lld N=%lld K=%lld A=%s B=%s C=%s trans=%c%c, %d epilogue step%s%s%s%s, writes %%%d",
             x->gather ? "gathered " : "", (long long)x->M, (long long)x->N, (long long)x->K,
             d.a_pairs ? "bf16 (in pairs)" : mpt_dtype_name(d.a_dt),
             mpt_dtype_name(d.b_dt), mpt_dtype_name(d.c_dt), d.trans_a ? 'T' : 'N',
             d.trans_b ? 'T' : 'N', d.n_steps, d.n_steps == 1 ? "" : "s", d.n_steps ? " (" : "", steps,
             d.n_steps ? ")" : "", c);
    rc = epilogue(cc, x, in_k, c, err, n);
done:
    free(in_k);
    return rc;
}

/* The data gradient by phases (the default), or by GEMM + col2im with
 * MPT_CPU_DGRAD=col2im, to compare. Phases won in every dtype once the
 * phase GEMM ran the whole batch: ResNet-50 f32 batch 8, the 3x3 and
 * strided gradients 7.3-16 ms against 12-20 with col2im; convnet64's
 * conv_3 19.2 against 20.3 ms (best of 3). */
static int dgrad_by_phases(void) {
    const char *env = getenv("MPT_CPU_DGRAD");
    return !(env && !strcmp(env, "col2im"));
}

/* What a gathered convolution skips of the padding, for its core text. */
static const char *skip_text(const mpt_cpu_jit *j, const mpt_cpu_kx *x, char *buf, size_t n) {
    static const char *how[] = {"kernel rows in the padding skipped", "padding skipped by segments",
                                "padding skipped by segments, rows (position, image)"};
    if (!x->gather) return "";
    int mr, nr, kc, mc, nc, len = 0;
    mpt_cpu_gemm_blocking(x->gemm, &mr, &nr, &kc, &mc, &nc);
    if (x->g_krange && x->g_skip >= 0 && x->g_skip < MPT_CPU_SKIP_COUNT)
        len = snprintf(buf, n, ", %s (tiles run %d%% of k)", how[x->g_skip], x->g_kpct);
    snprintf(buf + len, n - (size_t)len, ", %d x %d tiles%s", mr, nr,
             x->g_step && mpt_cpu_jit_vector_lanes(j) == 16 ? ", evenly spaced rows on one pointer" : "");
    return buf;
}

int mpt_cpu_plan_conv(mpt_cpu_cc *cc, mpt_cpu_kx *x, char *err, size_t n) {
    const mpt_graph *g = cc->p->g;
    const mpt_kernel *k = x->k;
    const mpt_node *nd = &g->nodes[k->root];
    const mpt_node *i0 = &g->nodes[nd->in[0]], *i1 = &g->nodes[nd->in[1]];
    char *in_k = kernel_members(cc, k);
    int rc = -1;
    if (!in_k || common_slots(g, x)) {
        snprintf(err, n, "out of memory");
        goto done;
    }
    mpt_shape xs, ws, ys;
    if (nd->op == MPT_OP_CONV2D) { xs = i0->shape; ws = i1->shape; ys = nd->shape; }
    else if (nd->op == MPT_OP_CONV2D_BWD_DATA) { xs = nd->shape; ws = i1->shape; ys = i0->shape; }
    else { xs = i0->shape; ws = nd->shape; ys = i1->shape; }
    int64_t *q = x->geom;
    int64_t gv[MPT_G_COUNT] = {xs.dim[0], xs.dim[1], xs.dim[2], xs.dim[3], ws.dim[0], ws.dim[1],
                               ws.dim[3], ys.dim[1], ys.dim[2], nd->attr.i[0], nd->attr.i[1],
                               nd->attr.i[2], nd->attr.i[3]};
    memcpy(q, gv, sizeof gv);
    int64_t P = q[MPT_G_N] * q[MPT_G_OH] * q[MPT_G_OW];
    int64_t KK = q[MPT_G_KH] * q[MPT_G_KW] * q[MPT_G_C];
    int pointwise = q[MPT_G_KH] == 1 && q[MPT_G_KW] == 1 && q[MPT_G_SH] == 1 &&
                    q[MPT_G_SW] == 1 && q[MPT_G_PH] == 0 && q[MPT_G_PW] == 0;
    mpt_cpu_gemm_desc d;
    memset(&d, 0, sizeof d);
    d.keep_text = cc->keep_text;
    x->col_slot = x->acc_slot = x->wt_slot = x->pad_slot = -1;
    if ((x->a_slot = operand_slot(cc, x, in_k, nd->in[0], err, n)) < 0) goto done;
    if ((x->b_slot = operand_slot(cc, x, in_k, nd->in[1], err, n)) < 0) goto done;
    /* a 1x1 stride-1 data gradient is one plain GEMM writing dx [P, C]
     * row-major, so the chain after it (a residual's second gradient, the
     * relu gradient's mask) runs in the GEMM's own epilogue, in registers,
     * as for a matmul; every other convolution's epilogue is a loop */
    int c = k->root;
    if (nd->op == MPT_OP_CONV2D_BWD_DATA && pointwise) c = mpt_cpu_epi_chain(g, k, in_k, x, &d);
    /* A forward convolution takes the steps that work column by column
     * (a bias, an activation, a mixed policy's rounding and its widening
     * cast to f32 for a batch norm) into its GEMM's epilogue too: its rows
     * may be stored out of NHWC order (AMX tiles) but its columns are the
     * channels. Steps reading or writing at C's row stay in the loop. */
    if (nd->op == MPT_OP_CONV2D) {
        c = mpt_cpu_epi_chain(g, k, in_k, x, &d);
        if (mpt_cpu_epi_by_rows(&d)) c = drop_chain(x, &d, k->root);
    }
    int root_out = mpt_cpu_kernel_output(k, c);
    x->c_slot = mpt_cpu_kx_slot(x, c, root_out ? 0 : bytes_of(&g->nodes[c]));
    /* scratch values get slots on nodes of their own: -2 - k keeps them apart */
    if (nd->op == MPT_OP_CONV2D || nd->op == MPT_OP_CONV2D_BWD_FILTER) {
        /* implicit GEMM (conv_cols) unless MPT_CPU_CONV_EXPLICIT asks for
         * the column matrix in memory, to compare the two */
        const char *ex = getenv("MPT_CPU_CONV_EXPLICIT");
        x->implicit = !pointwise && !(ex && *ex && strcmp(ex, "0"));
        if (!pointwise && !x->implicit)
            x->col_slot = mpt_cpu_kx_slot(x, -2, P * KK * (int64_t)mpt_dtype_size(i0->dtype));
        /* f32: gathered from the image (gather_plan), unless
         * MPT_CPU_CONV_GATHER=0 asks for the columns filled and packed */
        int fwd = nd->op == MPT_OP_CONV2D;
        x->planes = x->implicit && !fwd ? mpt_cpu_planes_pay(cc->jit, i0->dtype, i1->dtype, q) : 0;
        x->krow = x->implicit && !x->planes ? mpt_cpu_krow_tiles_pay(cc->jit, i0->dtype, i1->dtype, q, fwd) : 0;
        x->gather = x->implicit && !x->krow && !x->planes &&
                    mpt_cpu_gather_pays(cc->jit, i0->dtype, q[MPT_G_O], q[MPT_G_C],
                                        q[MPT_G_KH] * q[MPT_G_KW] == 1, !fwd, q);
        x->pad_widen = mpt_cpu_gather_widen(cc->jit, x->gather, i0->dtype, i1->dtype,
                                            (fwd ? q[MPT_G_C] : q[MPT_G_N]) % 2 == 0);
        mpt_dtype a_dt = x->pad_widen ? MPT_DT_F32 : i0->dtype;
        d.a_pairs = x->gather && a_dt == MPT_DT_BF16;
        if (x->gather && mpt_cpu_gather_plan(x, fwd, (int64_t)mpt_dtype_size(a_dt), d.a_pairs, err, n))
            goto done;
        if (x->g_il && c != k->root) {
            /* rows through acc, unpermuted into C by a copy of the root's
             * dtype: the chain stays in the loop */
            c = drop_chain(x, &d, k->root);
            x->c_slot = mpt_cpu_kx_slot(x, c, mpt_cpu_kernel_output(k, c) ? 0 : bytes_of(&g->nodes[c]));
        }
        d.a_gather = x->gather;
        d.a_row_step = x->gather ? x->g_step : 0;
        d.n_hint = q[MPT_G_O];
        /* bf16 on AMX: A's tiles read in place from an interleaved copy */
        int pairs_ok = q[MPT_G_SW] == 1 && q[MPT_G_OW] % 2 == 0;
        x->tiles = !x->implicit || x->gather || x->krow || x->planes ? 0
                   : fwd ? mpt_cpu_tiles_pay(cc->jit, i0->dtype, i1->dtype, q[MPT_G_N], q[MPT_G_C],
                                             pairs_ok)
                         : mpt_cpu_wgrad_tiles_pay(cc->jit, i0->dtype, i1->dtype, q[MPT_G_N],
                                                  q[MPT_G_C]);
        int64_t es = (int64_t)mpt_dtype_size(i0->dtype);
        if (x->tiles && (fwd ? mpt_cpu_tiles_plan(x, es, (int64_t)mpt_dtype_size(g->nodes[c].dtype), err, n)
                             : mpt_cpu_wgrad_tiles_plan(x, es, err, n)))
            goto done;
        /* rows in another order than NHWC's: gathered ones through acc,
         * tiles' stored in place (desc.c_rows) */
        if (x->g_il && fwd) x->acc_slot = mpt_cpu_kx_slot(x, -3, bytes_of(nd));
        d.c_rows = x->tiles && fwd;
        if (x->krow && mpt_cpu_krow_tiles_plan(x, fwd, es, err, n)) goto done;
        if (x->planes && mpt_cpu_planes_plan(x, es, err, n)) goto done;
        d.a_tiles = x->tiles != 0 || (x->krow && fwd) || x->planes;
        d.c_dt = g->nodes[c].dtype;
        if (nd->op == MPT_OP_CONV2D) {
            d.a_dt = a_dt;
            d.b_dt = i1->dtype;
            x->M = P; x->N = q[MPT_G_O]; x->K = KK;
        } else {
            /* dw [KK, O] = cols^T [KK, P] x dy [P, O]: A is the column
             * matrix read along its rows (j), B the output gradient as is */
            d.a_dt = a_dt;
            d.b_dt = i1->dtype;
            d.trans_a = !x->gather && !x->tiles && !x->planes;
            x->M = KK; x->N = q[MPT_G_O]; x->K = x->planes ? q[MPT_G_N] * x->planes : P;
            if (x->krow) {
                /* a first layer's: dw^T [O, KH*krow] = dy^T x its kernel rows */
                d.a_dt = i1->dtype;
                d.b_dt = i0->dtype;
                d.c_dt = MPT_DT_F32;
                d.trans_a = x->wt_slot < 0; /* else read from dy^T */
            }
        }
    } else if ((x->dgrad_direct = pointwise)) {
        /* dx [P, C] = dy [P, O] x w^T: no columns to sum, so the GEMM
         * writes dx itself; w [C, O] is transposed once into [O, C] (a
         * plain B packs faster than a transposed one) */
        x->wt_slot = mpt_cpu_kx_slot(x, -4, KK * q[MPT_G_O] * (int64_t)mpt_dtype_size(i1->dtype));
        d.a_dt = i0->dtype;
        d.b_dt = i1->dtype;
        d.c_dt = g->nodes[c].dtype;
        x->M = P; x->N = q[MPT_G_C]; x->K = q[MPT_G_O];
    } else if ((x->dgrad_phased = dgrad_by_phases())) {
        /* by phases (see the data gradient by phases): per phase an implicit GEMM over the
         * phase's columns of dy (conv_cols), for the whole batch, into a
         * buffer scattered to the phase's dx positions; the transposed
         * weights of every phase are laid out once per run */
        int64_t rows = 0;
        for (int64_t rh = 0; rh < q[MPT_G_SH]; rh++)
            for (int64_t rw = 0; rw < q[MPT_G_SW]; rw++) {
                mpt_cpu_dgrad_phase f = mpt_cpu_dgrad_phase_of(q, rh, rw);
                if (f.nqh * f.nqw > rows) rows = f.nqh * f.nqw;
            }
        x->wt_slot = mpt_cpu_kx_slot(x, -4, KK * q[MPT_G_O] * (int64_t)mpt_dtype_size(i1->dtype));
        x->gather = mpt_cpu_gather_pays(cc->jit, i0->dtype, q[MPT_G_C], q[MPT_G_O], 0, 0, q);
        /* a phase's grid points step one dy column at a time along W */
        int pairs_ok = 1;
        for (int64_t rh = 0; rh < q[MPT_G_SH]; rh++)
            for (int64_t rw = 0; rw < q[MPT_G_SW]; rw++) {
                mpt_cpu_dgrad_phase f = mpt_cpu_dgrad_phase_of(q, rh, rw);
                if (f.nqh * f.nqw > 0 && f.th * f.tw > 0 && f.nqw % 2) pairs_ok = 0;
            }
        x->tiles = x->gather ? 0 : mpt_cpu_tiles_pay(cc->jit, i0->dtype, i1->dtype, q[MPT_G_N],
                                                     q[MPT_G_O], pairs_ok);
        int64_t ys = (int64_t)mpt_dtype_size(nd->dtype);
        x->pad_widen = mpt_cpu_gather_widen(cc->jit, x->gather, i0->dtype, i1->dtype, q[MPT_G_O] % 2 == 0);
        mpt_dtype a_dt = x->pad_widen ? MPT_DT_F32 : i0->dtype;
        d.a_pairs = x->gather && a_dt == MPT_DT_BF16;
        if ((x->gather || x->tiles) &&
            mpt_cpu_dgrad_gather_plan(x, (int64_t)mpt_dtype_size(a_dt), x->tiles, ys, err, n))
            goto done;
        /* the GEMM writes dx itself: with stride 1, whose one phase is dx
         * in dx's order unless its rows run image by image (g_il), through
         * ldc; on tiles, or gathered with a stride or image by image,
         * each row at its dx position (desc.c_rows). Else (im2col) a
         * phase's rows go through acc to their dx positions. Gathered,
         * ResNet-50's 1x1 stride-2 data gradients read and wrote acc once
         * more than dx's share of the phase: docs/BENCHMARKS.md */
        x->dgrad_in_place = !x->tiles && !x->g_il && q[MPT_G_SH] == 1 && q[MPT_G_SW] == 1;
        x->dgrad_rows = x->gather && !x->dgrad_in_place;
        if (!x->tiles && !x->dgrad_in_place && !x->dgrad_rows)
            x->acc_slot = mpt_cpu_kx_slot(x, -3, q[MPT_G_N] * rows * q[MPT_G_C] * ys);
        d.a_gather = x->gather;
        d.a_row_step = x->gather ? x->g_step : 0;
        d.n_hint = q[MPT_G_C];
        d.a_tiles = x->tiles != 0;
        d.c_rows = x->tiles || x->dgrad_rows;
        d.a_dt = a_dt;
        d.b_dt = i1->dtype;
        d.c_dt = nd->dtype;
        /* nominal sizes, for the profile's rate: the phases' GEMMs add up to them */
        x->M = P; x->N = q[MPT_G_C]; x->K = q[MPT_G_KH] * q[MPT_G_KW] * q[MPT_G_O];
    } else {
        /* dcols [P, KK] = dy [P, O] x w^T, then summed into dx in f32, some
         * images at a time: the columns are read back while they are still
         * in the last-level cache (K = O is small, so the GEMM is bound by
         * writing them). Each round repacks w, so rounds are not too small;
         * two images keep both threads of col2im busy. */
        int64_t per_image = q[MPT_G_OH] * q[MPT_G_OW] * KK * 4, budget = 16 << 20;
        const char *env = getenv("MPT_CPU_CONV_CHUNK_BYTES");
        if (env && atoll(env) > 0) budget = atoll(env);
        x->chunk = per_image > 0 ? budget / per_image : q[MPT_G_N];
        if (x->chunk < 2) x->chunk = 2;
        if (x->chunk > q[MPT_G_N]) x->chunk = q[MPT_G_N];
        x->col_slot = mpt_cpu_kx_slot(x, -2, x->chunk * per_image);
        /* w [KK, O] transposed once into [O, KK]: the GEMM packs a plain B
         * much faster than a transposed one, and repacks it every round */
        x->wt_slot = mpt_cpu_kx_slot(x, -4, KK * q[MPT_G_O] * (int64_t)mpt_dtype_size(i1->dtype));
        x->acc_slot = mpt_cpu_kx_slot(x, -3, mpt_shape_numel(nd->shape) * 4);
        d.a_dt = i0->dtype;
        d.b_dt = i1->dtype;
        d.c_dt = MPT_DT_F32;
        x->M = P; x->N = KK; x->K = q[MPT_G_O];
    }
    /* a 1x1 stride-1 forward pass or data gradient: x or dy is A as it is,
     * read in place where it multiplies in bf16 pairs */
    if (pointwise && nd->op != MPT_OP_CONV2D_BWD_FILTER && pairs_in_place(cc->jit, &d, x->K) &&
        plain_gather(cc, x, &d, err, n))
        goto done;
    if (x->c_slot < 0 || !(x->gemm = mpt_cpu_cc_gemm(cc, &d, err, n)) ||
        mpt_cpu_gemm_prepare(x->gemm, x->krow && nd->op == MPT_OP_CONV2D_BWD_FILTER ? q[MPT_G_KH] * x->krow : x->N, err, n))
        goto done;
    char skip[160];
    snprintf(x->core, sizeof x->core, "%s via %s%s gemm M=%lld N=%lld K=%lld A=%s B=%s C=%s trans=%c%c%s",
             mpt_op_name(nd->op), pointwise ? "direct" :
             nd->op == MPT_OP_CONV2D_BWD_DATA ? (x->dgrad_phased ? (x->gather ? (x->dgrad_rows ? "phased gathered (rows stored at their dx positions)" : "phased gathered") : x->tiles ? "phased AMX tiles in place" : "phased im2col") : "col2im")
             : x->gather ? "gathered implicit" : x->krow ? "AMX tiles by kernel row" : x->planes ? "AMX tiles from channel planes" : x->tiles ? "AMX tiles in place" : x->implicit ? "implicit" : "im2col",
             x->tiles == 8 ? ", images in 8s" : "", (long long)x->M, (long long)x->N, (long long)x->K, x->pad_widen ? (x->pad_widen == 2 ? "bf16 (an f32 copy)" : "f16 (an f32 copy)") : d.a_pairs ? "bf16 (in pairs)" : mpt_dtype_name(d.a_dt),
             mpt_dtype_name(d.b_dt), mpt_dtype_name(d.c_dt), d.trans_a ? 'T' : 'N', d.trans_b ? 'T' : 'N',
             skip_text(cc->jit, x, skip, sizeof skip));
    if (d.n_steps) {
        char steps[160];
        mpt_cpu_epi_describe(&d, steps, sizeof steps);
        size_t len = strlen(x->core);
        snprintf(x->core + len, sizeof x->core - len, ", %d epilogue step%s (%s), writes %%%d", d.n_steps,
                 d.n_steps == 1 ? "" : "s", steps, c);
    }
    rc = epilogue(cc, x, in_k, c, err, n);
done:
    free(in_k);
    return rc;
}

/* B of a gathered filter gradient: dy's rows [P, O] in the order of the
 * GEMM's k (mpt_cpu_kx.g_perm), a run of columns at a time. */
typedef struct {
    const char *dy;
    const int64_t *perm;
    int64_t O;
    size_t es;
} dy_rows;

static void dy_rows_fill(const void *ctx, int64_t w0, int64_t wc, int64_t k0, int64_t kc, void *dst,
                         int64_t sw, int64_t sk) {
    (void)sw; /* 1: runs go along w */
    const dy_rows *d = ctx;
    for (int64_t k = 0; k < kc; k++)
        memcpy((char *)dst + (size_t)(k * sk) * d->es,
               d->dy + (size_t)(d->perm[k0 + k] * d->O + w0) * d->es, (size_t)wc * d->es);
}

int mpt_cpu_run_core(const mpt_graph *g, mpt_cpu_kx *x, mpt_pool *pool, char *err, size_t n) {
    const mpt_node *nd = &g->nodes[x->k->root];
    void **s = x->slots;
    mpt_cpu_epilogue_args epi;
    const mpt_cpu_epilogue_args *chain = mpt_cpu_chain_args(x, &epi);
    if (x->k->kind == MPT_KERNEL_GEMM) {
        if (x->gather) {
            mpt_cpu_gemm_gather ga = {s[x->a_slot], x->g_row, x->g_col, NULL, 0, 0};
            return mpt_cpu_gemm_run_gather(x->gemm, pool, x->M, x->N, x->K, &ga, s[x->b_slot], 0,
                                           s[x->c_slot], 0, &epi, err, n);
        }
        return mpt_cpu_gemm_run(x->gemm, pool, x->M, x->N, x->K, s[x->a_slot], 0, s[x->b_slot], 0,
                                s[x->c_slot], 0, &epi, err, n);
    }
    const int64_t *q = x->geom;
    if (nd->op == MPT_OP_CONV2D_BWD_DATA && x->dgrad_phased) return mpt_cpu_run_dgrad(g, x, pool, err, n);
    if (nd->op == MPT_OP_CONV2D_BWD_DATA && x->dgrad_direct) {
        mpt_cpu_transpose(pool, s[x->b_slot], s[x->wt_slot], x->N, x->K,
                          mpt_dtype_size(g->nodes[nd->in[1]].dtype));
        mpt_cpu_gemm_gather ga = {s[x->a_slot], x->g_row, x->g_col, NULL, 0, 0};
        if (x->gather)
            return mpt_cpu_gemm_run_gather(x->gemm, pool, x->M, x->N, x->K, &ga, s[x->wt_slot], 0,
                                           s[x->c_slot], 0, &epi, err, n);
        return mpt_cpu_gemm_run(x->gemm, pool, x->M, x->N, x->K, s[x->a_slot], 0, s[x->wt_slot], 0,
                                s[x->c_slot], 0, &epi, err, n);
    }
    if (nd->op == MPT_OP_CONV2D_BWD_DATA) {
        int64_t numel = mpt_shape_numel(nd->shape);
        memset(s[x->acc_slot], 0, (size_t)numel * 4);
        int64_t rows = q[MPT_G_OH] * q[MPT_G_OW], image = q[MPT_G_H] * q[MPT_G_W] * q[MPT_G_C];
        size_t dy_row = (size_t)q[MPT_G_O] * mpt_dtype_size(g->nodes[nd->in[0]].dtype);
        mpt_cpu_transpose(pool, s[x->b_slot], s[x->wt_slot], x->N, x->K,
                          mpt_dtype_size(g->nodes[nd->in[1]].dtype));
        for (int64_t b0 = 0; b0 < q[MPT_G_N]; b0 += x->chunk) {
            int64_t nb = q[MPT_G_N] - b0 < x->chunk ? q[MPT_G_N] - b0 : x->chunk;
            const char *dy = (const char *)s[x->a_slot] + (size_t)(b0 * rows) * dy_row;
            if (mpt_cpu_gemm_run(x->gemm, pool, nb * rows, x->N, x->K, dy, 0, s[x->wt_slot], 0,
                                 s[x->col_slot], 0, NULL, err, n))
                return -1;
            int64_t sub[MPT_G_COUNT];
            memcpy(sub, q, sizeof sub);
            sub[MPT_G_N] = nb;
            mpt_cpu_col2im(pool, s[x->col_slot], (float *)s[x->acc_slot] + b0 * image, sub);
        }
        mpt_cpu_store_f32(nd->dtype, s[x->acc_slot], s[x->c_slot], numel);
        return 0;
    }
    const void *a = s[x->a_slot];
    if (x->krow)
        return mpt_cpu_krow_tiles_run(x, pool, nd->op == MPT_OP_CONV2D, nd->dtype,
                                      mpt_dtype_size(g->nodes[nd->in[0]].dtype), err, n);
    if (x->planes)
        return mpt_cpu_planes_run(x, pool, mpt_dtype_size(g->nodes[nd->in[0]].dtype), err, n);
    if (x->tiles && nd->op == MPT_OP_CONV2D_BWD_FILTER) {
        /* A's tiles from [N/32, HP, WP, C, 32]; dy's rows in k's order */
        mpt_cpu_gemm_gather ga = {mpt_cpu_gather_base(x, pool, s[x->a_slot]), x->g_row, x->g_col,
                                  NULL, 32 * (int64_t)mpt_dtype_size(g->nodes[nd->in[0]].dtype), 0};
        dy_rows dr = {s[x->b_slot], x->g_perm, x->N, mpt_dtype_size(g->nodes[nd->in[1]].dtype)};
        mpt_cpu_gemm_source src = {dy_rows_fill, &dr, 1, NULL};
        return mpt_cpu_gemm_run_gather_src(x->gemm, pool, x->M, x->N, x->K, &ga, &src,
                                           s[x->c_slot], 0, NULL, err, n);
    }
    if (x->tiles) {
        /* rows in (N/IL, position, IL) order, each stored at its NHWC row */
        size_t es = mpt_dtype_size(g->nodes[nd->in[0]].dtype);
        mpt_cpu_gemm_gather ga = {mpt_cpu_gather_base(x, pool, s[x->a_slot]), x->g_row, x->g_col,
                                  NULL, q[MPT_G_C] * (int64_t)es, 0};
        epi.c_row = x->g_crow; /* with the chain's steps, if any */
        return mpt_cpu_gemm_run_gather(x->gemm, pool, x->M, x->N, x->K, &ga, s[x->b_slot], 0,
                                       s[x->c_slot], 0, &epi, err, n);
    }
    if (x->gather) {
        mpt_cpu_gemm_gather ga = {mpt_cpu_gather_base(x, pool, s[x->a_slot]), x->g_row, x->g_col,
                                  x->g_krange, 0,
                                  mpt_cpu_skip_run(x, nd->op == MPT_OP_CONV2D ? q[MPT_G_KW] * q[MPT_G_C]
                                                                      : q[MPT_G_N] * q[MPT_G_OW])};
        if (x->g_perm) {
            dy_rows dr = {s[x->b_slot], x->g_perm, x->N, mpt_dtype_size(g->nodes[nd->in[1]].dtype)};
            mpt_cpu_gemm_source src = {dy_rows_fill, &dr, 1, NULL};
            return mpt_cpu_gemm_run_gather_src(x->gemm, pool, x->M, x->N, x->K, &ga, &src,
                                               s[x->c_slot], 0, NULL, err, n);
        }
        if (!x->g_il)
            return mpt_cpu_gemm_run_gather(x->gemm, pool, x->M, x->N, x->K, &ga, s[x->b_slot], 0,
                                           s[x->c_slot], 0, chain, err, n);
        /* rows in (position, image) order into acc, then NHWC */
        if (mpt_cpu_gemm_run_gather(x->gemm, pool, x->M, x->N, x->K, &ga, s[x->b_slot], 0,
                                    s[x->acc_slot], 0, NULL, err, n))
            return -1;
        mpt_cpu_tiles_unpermute(pool, s[x->acc_slot], s[x->c_slot], q[MPT_G_N],
                                q[MPT_G_OH] * q[MPT_G_OW], (size_t)x->N * mpt_dtype_size(nd->dtype),
                                (int)x->g_il);
        return 0;
    }
    if (x->implicit) {
        int fwd = nd->op == MPT_OP_CONV2D;
        mpt_cpu_conv_cols cc = {q, s[x->a_slot], mpt_dtype_size(g->nodes[nd->in[0]].dtype), fwd};
        mpt_cpu_gemm_source src = {mpt_cpu_cols_fill, &cc, !fwd, NULL};
        return mpt_cpu_gemm_run_src(x->gemm, pool, x->M, x->N, x->K, &src, NULL, 0, NULL,
                                    s[x->b_slot], 0, s[x->c_slot], 0, chain, err, n);
    }
    if (x->col_slot >= 0) {
        mpt_cpu_im2col(pool, s[x->a_slot], s[x->col_slot], mpt_dtype_size(g->nodes[nd->in[0]].dtype), q);
        a = s[x->col_slot];
    }
    return mpt_cpu_gemm_run(x->gemm, pool, x->M, x->N, x->K, a, 0, s[x->b_slot], 0, s[x->c_slot],
                            0, chain, err, n);
}
