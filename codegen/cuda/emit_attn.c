/* codegen/cuda/emit_attn.c — the fused attention kernels (attention with
 * its attention_lse, the attention_grad ops of one attention; ops.def,
 * ir/interp_attn.c) as generated CUDA C.
 *
 * f16/bf16 heads of multiples of 16 up to 128 go to the Tensor Core
 * kernels of emit_attn_mma.c. The rest (f32, other head sizes) run the
 * SIMT kernels here: one thread per row, every size a constant of the
 * source, no shared memory.
 *   forward:  a thread per query row i of a (batch, head) walks the keys
 *             it sees with the online softmax (running maximum m, sum l,
 *             output acc in registers) and writes o_i = acc / l and
 *             lse_i = m + log l;
 *   backward: a thread per query row writes dq_i (recomputing each
 *             p_ij = exp(s_ij - lse_i)), a thread per key row writes dk_j
 *             and dv_j, FlashAttention-2's formulas
 *             ds = p (d dp - D), D_i = do_i.o_i, d dropout's factor.
 * The scores, the statistics and every sum are f32. Masked scores are
 * -1e9 as in the unfused graph; keys after a causal row are skipped (their
 * p is 0 there). Dropout draws random_uniform's bits (mpt_mix64 of the
 * prelude). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cuda_internal.h"

void mpt_cu_attn_load(char *buf, size_t n, mpt_dtype dt, int p, const char *idx) {
    if (dt == MPT_DT_F32) snprintf(buf, n, "p%d[%s]", p, idx);
    else snprintf(buf, n, "%s(p%d[%s])", dt == MPT_DT_BF16 ? "mpt_b2f" : "mpt_h2f", p, idx);
}

const char *mpt_cu_attn_store_fn(mpt_dtype dt) {
    return dt == MPT_DT_F32 ? "" : dt == MPT_DT_BF16 ? "mpt_f2b" : "mpt_f2h";
}

const char *mpt_cu_attn_row(const mpt_cu_attn *a, char *buf, size_t n, const char *t, int64_t T, int64_t D) {
    if (!a->bthd) snprintf(buf, n, "(bh * %lldLL + %s) * %lldLL", (long long)T, t, (long long)D);
    else
        snprintf(buf, n, "((bh / %lldLL * %lldLL + %s) * %lldLL + bh %% %lldLL) * %lldLL", (long long)a->H,
                 (long long)T, t, (long long)a->H, (long long)a->H, (long long)D);
    return buf;
}

static void line(mpt_cu_attn *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line(mpt_cu_attn *a, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    mpt_sb_printf(a->e->sb, "%*s%s\n", 4 * a->e->indent, "", buf);
}

void mpt_cu_attn_mask_drop(mpt_cu_attn *a) {
    if (a->mask_p < 0)
        line(a, "int vis = %d;", a->mask->attr.f != 0);
    else if (a->mask->shape.rank == 2)
        line(a, "int vis = p%d[b * %lldLL + j] != 0;", a->mask_p, (long long)a->Tk);
    else
        line(a, "int vis = p%d[(b * %lldLL + i) * %lldLL + j] != 0;", a->mask_p, (long long)a->Tq,
             (long long)a->Tk);
    if (a->causal) line(a, "vis = vis && j <= i;");
    if (a->drop_below)
        line(a, "const float dfac = (mpt_mix64(dkey ^ (unsigned long long)((bh * %lldLL + i) * %lldLL + j)) "
                ">> 40) < %lldull ? 0.0f : %.9ef;",
             (long long)a->Tq, (long long)a->Tk, (long long)a->drop_below, a->drop_scale);
    else
        line(a, "const float dfac = 1.0f;");
}

void mpt_cu_attn_drop_key(mpt_cu_attn *a) {
    if (!a->drop_below) return;
    char c[48];
    if (a->counter_p >= 0) snprintf(c, sizeof c, "p%d[0]", a->counter_p);
    else snprintf(c, sizeof c, "%d", (int)a->counter_const);
    line(a, "const unsigned long long dkey = mpt_mix64(mpt_mix64((unsigned long long)%lldLL) ^ "
            "(unsigned long long)(unsigned)(%s));",
         (long long)a->drop_seed, c);
}

/* jend: the keys query row i sees are those before it */
static void key_end(mpt_cu_attn *a) {
    long long tk = (long long)a->Tk;
    if (a->causal) line(a, "const long long jend = i + 1 < %lldLL ? i + 1 : %lldLL;", tk, tk);
    else line(a, "const long long jend = %lldLL;", tk);
}

/* s = scale q_i.k_j, masked to -1e9; regs 1: q_i is in q[], 2: k_j in kr[] */
static void score(mpt_cu_attn *a, int q_p, mpt_dtype q_dt, int k_p, mpt_dtype k_dt, int q_in_regs) {
    char qv[160], kv[160], qi[128], ki[128], row[112];
    snprintf(qi, sizeof qi, "%s + e", mpt_cu_attn_row(a, row, sizeof row, "i", a->Tq, a->E));
    snprintf(ki, sizeof ki, "%s + e", mpt_cu_attn_row(a, row, sizeof row, "j", a->Tk, a->E));
    mpt_cu_attn_load(qv, sizeof qv, q_dt, q_p, qi);
    mpt_cu_attn_load(kv, sizeof kv, k_dt, k_p, ki);
    line(a, "float s = 0.0f;");
    line(a, "for (int e = 0; e < %lld; e++) s += %s * %s;", (long long)a->E, q_in_regs == 1 ? "q[e]" : qv,
         q_in_regs == 2 ? "kr[e]" : kv);
    line(a, "s = vis ? s * %.9ef : -1e9f;", (double)(float)a->scale);
}

static int emit_forward(mpt_cu_attn *a, mpt_cuda_kernel_src *out, int o_node, int lse_node) {
    mpt_cu_em *e = a->e;
    const mpt_node *nd = &e->g->nodes[o_node >= 0 ? o_node : lse_node];
    int qp = e->param_of[nd->in[0]], kp = e->param_of[nd->in[1]];
    mpt_dtype qdt = e->g->nodes[nd->in[0]].dtype, kdt = e->g->nodes[nd->in[1]].dtype;
    int vp = o_node >= 0 ? e->param_of[nd->in[2]] : -1;
    mpt_dtype vdt = o_node >= 0 ? e->g->nodes[nd->in[2]].dtype : MPT_DT_F32;
    int64_t rows = a->B * a->H * a->Tq, Ev = o_node >= 0 ? a->Ev : 0;
    mpt_cu_signature(e, out);
    mpt_sb_printf(e->sb, " {\n");
    e->indent = 1;
    mpt_cu_attn_drop_key(a);
    line(a, "for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < %lldLL; "
            "t += (long long)gridDim.x * blockDim.x) {", (long long)rows);
    e->indent++;
    line(a, "const long long bh = t / %lldLL, i = t %% %lldLL, b = bh / %lldLL;", (long long)a->Tq,
         (long long)a->Tq, (long long)a->H);
    char v[160], qi[128], row[112];
    line(a, "float q[%lld];", (long long)a->E);
    snprintf(qi, sizeof qi, "%s + e", mpt_cu_attn_row(a, row, sizeof row, "i", a->Tq, a->E));
    mpt_cu_attn_load(v, sizeof v, qdt, qp, qi);
    line(a, "for (int e = 0; e < %lld; e++) q[e] = %s;", (long long)a->E, v);
    line(a, "float m = __int_as_float(0xff800000), l = 0.0f; /* -inf */");
    if (Ev) {
        line(a, "float acc[%lld];", (long long)Ev);
        line(a, "for (int e = 0; e < %lld; e++) acc[e] = 0.0f;", (long long)Ev);
    }
    key_end(a);
    line(a, "for (long long j = 0; j < jend; j++) {");
    e->indent++;
    mpt_cu_attn_mask_drop(a);
    score(a, qp, qdt, kp, kdt, 1);
    line(a, "const float mn = fmaxf(m, s), alpha = expf(m - mn), p = expf(s - mn);");
    line(a, "l = l * alpha + p;");
    line(a, "m = mn;");
    if (Ev) {
        line(a, "const float pz = %sp * dfac;", a->zero_masked ? "(vis ? 1.0f : 0.0f) * " : "");
        char vi[128];
        snprintf(vi, sizeof vi, "%s + e", mpt_cu_attn_row(a, row, sizeof row, "j", a->Tk, Ev));
        mpt_cu_attn_load(v, sizeof v, vdt, vp, vi);
        line(a, "for (int e = 0; e < %lld; e++) acc[e] = acc[e] * alpha + pz * %s;", (long long)Ev, v);
    }
    e->indent--;
    line(a, "}");
    if (o_node >= 0) {
        const mpt_node *o = &e->g->nodes[o_node];
        line(a, "const float inv = l > 0.0f ? 1.0f / l : 0.0f;");
        line(a, "for (int e = 0; e < %lld; e++) p%d[%s + e] = %s(acc[e] * inv);", (long long)Ev,
             e->param_of[o_node], mpt_cu_attn_row(a, row, sizeof row, "i", a->Tq, Ev),
             mpt_cu_attn_store_fn(o->dtype));
    }
    if (lse_node >= 0) line(a, "p%d[t] = m + logf(l);", e->param_of[lse_node]);
    e->indent--;
    line(a, "}");
    mpt_sb_printf(e->sb, "}\n");
    out->block[0] = 128;
    out->grid[0] = mpt_cu_grid_for(rows, 128);
    return 0;
}

static int emit_backward(mpt_cu_attn *a, mpt_cuda_kernel_src *out, const int *grad) {
    mpt_cu_em *e = a->e;
    int any = grad[0] >= 0 ? grad[0] : grad[1] >= 0 ? grad[1] : grad[2];
    const mpt_node *nd = &e->g->nodes[any];
    const mpt_graph *g = e->g;
    int qp = e->param_of[nd->in[0]], kp = e->param_of[nd->in[1]], vp = e->param_of[nd->in[2]];
    int op = e->param_of[nd->in[3]], dop = e->param_of[nd->in[4]], lp = e->param_of[nd->in[5]];
    mpt_dtype qdt = g->nodes[nd->in[0]].dtype, kdt = g->nodes[nd->in[1]].dtype,
              vdt = g->nodes[nd->in[2]].dtype, odt = g->nodes[nd->in[3]].dtype,
              dodt = g->nodes[nd->in[4]].dtype;
    long long Tq = a->Tq, Tk = a->Tk, E = a->E, Ev = a->Ev;
    int64_t n = a->B * a->H * (Tq + Tk);
    char v1[160], v2[160], ix[128], row[112];
    mpt_cu_signature(e, out);
    mpt_sb_printf(e->sb, " {\n");
    e->indent = 1;
    mpt_cu_attn_drop_key(a);
    line(a, "for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < %lldLL; "
            "t += (long long)gridDim.x * blockDim.x) {", (long long)n);
    e->indent++;
    line(a, "const long long bh = t / %lldLL, r = t %% %lldLL, b = bh / %lldLL;", Tq + Tk, Tq + Tk,
         (long long)a->H);
    /* a query row: dq_i */
    line(a, "if (r < %lldLL) {", Tq);
    e->indent++;
    line(a, "const long long i = r;");
    line(a, "float q[%lld], dov[%lld], dq[%lld];", E, Ev, E);
    snprintf(ix, sizeof ix, "%s + e", mpt_cu_attn_row(a, row, sizeof row, "i", Tq, E));
    mpt_cu_attn_load(v1, sizeof v1, qdt, qp, ix);
    line(a, "for (int e = 0; e < %lld; e++) q[e] = %s, dq[e] = 0.0f;", E, v1);
    snprintf(ix, sizeof ix, "%s + e", mpt_cu_attn_row(a, row, sizeof row, "i", Tq, Ev));
    mpt_cu_attn_load(v1, sizeof v1, dodt, dop, ix);
    mpt_cu_attn_load(v2, sizeof v2, odt, op, ix);
    line(a, "float D = 0.0f;");
    line(a, "for (int e = 0; e < %lld; e++) dov[e] = %s, D += dov[e] * %s;", Ev, v1, v2);
    line(a, "const float lse = p%d[bh * %lldLL + i];", lp, Tq);
    key_end(a);
    line(a, "for (long long j = 0; j < jend; j++) {");
    e->indent++;
    mpt_cu_attn_mask_drop(a);
    score(a, qp, qdt, kp, kdt, 1);
    line(a, "const float p = expf(s - lse);");
    snprintf(ix, sizeof ix, "%s + e", mpt_cu_attn_row(a, row, sizeof row, "j", Tk, Ev));
    mpt_cu_attn_load(v1, sizeof v1, vdt, vp, ix);
    line(a, "float dp = 0.0f;");
    line(a, "for (int e = 0; e < %lld; e++) dp += dov[e] * %s;", Ev, v1);
    line(a, "const float ds = vis ? p * (dfac * dp - D) * %.9ef : 0.0f;", (double)(float)a->scale);
    snprintf(ix, sizeof ix, "%s + e", mpt_cu_attn_row(a, row, sizeof row, "j", Tk, E));
    mpt_cu_attn_load(v1, sizeof v1, kdt, kp, ix);
    line(a, "for (int e = 0; e < %lld; e++) dq[e] += ds * %s;", E, v1);
    e->indent--;
    line(a, "}");
    if (grad[0] >= 0)
        line(a, "for (int e = 0; e < %lld; e++) p%d[%s + e] = %s(dq[e]);", E, e->param_of[grad[0]],
             mpt_cu_attn_row(a, row, sizeof row, "i", Tq, E), mpt_cu_attn_store_fn(g->nodes[grad[0]].dtype));
    e->indent--;
    line(a, "} else {");
    /* a key row: dk_j, dv_j */
    e->indent++;
    line(a, "const long long j = r - %lldLL;", Tq);
    line(a, "float kr[%lld], vr[%lld], dk[%lld], dv[%lld];", E, Ev, E, Ev);
    snprintf(ix, sizeof ix, "%s + e", mpt_cu_attn_row(a, row, sizeof row, "j", Tk, E));
    mpt_cu_attn_load(v1, sizeof v1, kdt, kp, ix);
    line(a, "for (int e = 0; e < %lld; e++) kr[e] = %s, dk[e] = 0.0f;", E, v1);
    snprintf(ix, sizeof ix, "%s + e", mpt_cu_attn_row(a, row, sizeof row, "j", Tk, Ev));
    mpt_cu_attn_load(v1, sizeof v1, vdt, vp, ix);
    line(a, "for (int e = 0; e < %lld; e++) vr[e] = %s, dv[e] = 0.0f;", Ev, v1);
    line(a, "for (long long i = %s; i < %lldLL; i++) {", a->causal ? "j" : "0", Tq);
    e->indent++;
    mpt_cu_attn_mask_drop(a);
    score(a, qp, qdt, kp, kdt, 2);
    line(a, "const float p = expf(s - p%d[bh * %lldLL + i]);", lp, Tq);
    snprintf(ix, sizeof ix, "%s + e", mpt_cu_attn_row(a, row, sizeof row, "i", Tq, Ev));
    mpt_cu_attn_load(v1, sizeof v1, dodt, dop, ix);
    mpt_cu_attn_load(v2, sizeof v2, odt, op, ix);
    line(a, "float D = 0.0f, dp = 0.0f;");
    line(a, "const float pz = %sp * dfac;", a->zero_masked ? "(vis ? 1.0f : 0.0f) * " : "");
    line(a, "for (int e = 0; e < %lld; e++) {", Ev);
    e->indent++;
    line(a, "const float g = %s;", v1);
    line(a, "D += g * %s;", v2);
    line(a, "dp += g * vr[e];");
    line(a, "dv[e] += pz * g;");
    e->indent--;
    line(a, "}");
    line(a, "const float ds = vis ? p * (dfac * dp - D) * %.9ef : 0.0f;", (double)(float)a->scale);
    snprintf(ix, sizeof ix, "%s + e", mpt_cu_attn_row(a, row, sizeof row, "i", Tq, E));
    mpt_cu_attn_load(v1, sizeof v1, qdt, qp, ix);
    line(a, "for (int e = 0; e < %lld; e++) dk[e] += ds * %s;", E, v1);
    e->indent--;
    line(a, "}");
    if (grad[1] >= 0)
        line(a, "for (int e = 0; e < %lld; e++) p%d[%s + e] = %s(dk[e]);", E, e->param_of[grad[1]],
             mpt_cu_attn_row(a, row, sizeof row, "j", Tk, E), mpt_cu_attn_store_fn(g->nodes[grad[1]].dtype));
    if (grad[2] >= 0)
        line(a, "for (int e = 0; e < %lld; e++) p%d[%s + e] = %s(dv[e]);", Ev, e->param_of[grad[2]],
             mpt_cu_attn_row(a, row, sizeof row, "j", Tk, Ev), mpt_cu_attn_store_fn(g->nodes[grad[2]].dtype));
    e->indent--;
    line(a, "}");
    e->indent--;
    line(a, "}");
    mpt_sb_printf(e->sb, "}\n");
    out->block[0] = 128;
    out->grid[0] = mpt_cu_grid_for(n, 128);
    return 0;
}

int mpt_cu_emit_attention(mpt_cu_em *e, mpt_cuda_kernel_src *out) {
    const mpt_kernel *K = e->k;
    const mpt_graph *g = e->g;
    int fwd = -1, lse = -1, grad[3] = {-1, -1, -1};
    for (int i = 0; i < K->n_nodes; i++) {
        const mpt_node *nd = &g->nodes[K->nodes[i]];
        if (nd->op == MPT_OP_ATTENTION) fwd = K->nodes[i];
        else if (nd->op == MPT_OP_ATTENTION_LSE) lse = K->nodes[i];
        else if (nd->op == MPT_OP_ATTENTION_GRAD) grad[nd->attr.i[0]] = K->nodes[i];
    }
    int backward = fwd < 0 && lse < 0;
    const mpt_node *nd = &g->nodes[backward ? (grad[0] >= 0 ? grad[0] : grad[1] >= 0 ? grad[1] : grad[2])
                                            : fwd >= 0 ? fwd : lse];
    const mpt_node *q = &g->nodes[nd->in[0]], *k = &g->nodes[nd->in[1]];
    int mask_in = nd->op == MPT_OP_ATTENTION ? 3 : nd->op == MPT_OP_ATTENTION_LSE ? 2 : 6;
    int bthd = (int)nd->attr.i[nd->op == MPT_OP_ATTENTION_LSE ? 1 : 6];
    mpt_cu_attn a = {.e = e, .B = q->shape.dim[0], .H = q->shape.dim[bthd ? 2 : 1],
                  .Tq = q->shape.dim[bthd ? 1 : 2], .Tk = k->shape.dim[bthd ? 1 : 2], .E = q->shape.dim[3],
                  .bthd = bthd, .scale = nd->attr.f,
                  .mask = &g->nodes[nd->in[mask_in]], .mask_p = e->param_of[nd->in[mask_in]],
                  .counter_p = -1};
    if (nd->op != MPT_OP_ATTENTION_LSE) a.Ev = g->nodes[nd->in[2]].shape.dim[3];
    /* the attrs: forward causal, zero_masked, f32_out, drop...; gradient which first */
    const mpt_node *an = fwd >= 0 ? &g->nodes[fwd] : nd;
    int base = an->op == MPT_OP_ATTENTION_GRAD ? 1 : 0;
    a.causal = (int)an->attr.i[base];
    if (an->op != MPT_OP_ATTENTION_LSE) {
        a.zero_masked = (int)an->attr.i[base + 1];
        a.drop_seed = an->attr.i[3];
        a.drop_below = an->attr.i[4];
        uint32_t bits = (uint32_t)an->attr.i[5];
        memcpy(&a.drop_scale, &bits, 4);
        int cin = an->in[an->op == MPT_OP_ATTENTION ? 4 : 7];
        a.counter_p = e->param_of[cin];
        a.counter_const = g->nodes[cin].attr.f;
    }
    if (a.E > 128 || a.Ev > 128) {
        e->err = "the SIMT attention kernel holds a head's row in registers: head sizes up to 128";
        e->err_node = nd->in[0];
        return 0;
    }
    if ((backward || fwd >= 0) && mpt_cu_attn_mma_fits(&a, nd, backward))
        return mpt_cu_emit_attention_mma(&a, out, fwd, lse, grad);
    return backward ? emit_backward(&a, out, grad) : emit_forward(&a, out, fwd, lse);
}
