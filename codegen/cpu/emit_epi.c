/* codegen/cpu/emit_epi.c — which ops after a GEMM run in its epilogue.
 *
 * The chain root -> op -> op ... is handed to the GEMM's epilogue (applied
 * to the f32 accumulator in registers, codegen/cpu/gemm_gen.c) as long as
 * each op has a GEMM epilogue step and each value on it has one reader in
 * the kernel. A value the kernel must also write (a transformer MLP's
 * pre-activation, kept for GELU's gradient) is stored by a STORE step on
 * the way. Reshapes are passed through: C is row-major [M, N], and any
 * reshape of it keeps element (row, col) at row * N + col. An f32 chain may
 * end in a cast to f16/bf16, which becomes C's dtype.
 *
 * A chain of f16 or bf16 values (a mixed policy's matmul and the bias and
 * ReLU after it) is exact too: a ROUND step gives the accumulator the value
 * the low-precision node holds, as the interpreter rounds it, and each op
 * after it is done in f32 on such values and rounded again, which is the
 * exact result rounded once (24 bits >= 2p + 2 for p = 11 and 8), as the
 * epilogue loop computes it. ReLU needs no rounding after it (it commutes
 * with rounding), and C's store rounds the last value. Activations that the
 * loop computes in double (sigmoid, tanh) end a low-precision chain; GELU
 * and its derivative are rounded exactly from f32 with a double recompute
 * near rounding midpoints (codegen/cpu/gemm_epi.c, gelu_exact).
 * A bias cast from f32 inside the kernel is read from the f32 variable and
 * rounded once loaded (the step's odt).
 */
#include <stdio.h>

#include "codegen/cpu/emit.h"

int mpt_cpu_kernel_output(const mpt_kernel *k, int id) {
    for (int i = 0; i < k->n_outputs; i++)
        if (k->outputs[i] == id) return 1;
    return 0;
}

/* the only member of k reading id, or -1 */
static int single_consumer(const mpt_graph *g, const mpt_kernel *k, int id) {
    int who = -1, count = 0;
    for (int i = 0; i < k->n_nodes; i++) {
        const mpt_node *nd = &g->nodes[k->nodes[i]];
        for (int q = 0; q < nd->n_in; q++)
            if (nd->in[q] == id) {
                who = k->nodes[i];
                count++;
            }
    }
    return count == 1 ? who : -1;
}

/* C's columns: a matmul's N, a convolution's channels (NHWC) */
static int64_t last_dim(const mpt_node *nd) { return nd->shape.dim[nd->shape.rank - 1]; }

static int float_dt(mpt_dtype dt) { return dt == MPT_DT_F32 || dt == MPT_DT_F16 || dt == MPT_DT_BF16; }
static int low_dt(mpt_dtype dt) { return dt == MPT_DT_F16 || dt == MPT_DT_BF16; }

/* The bias vector a broadcast reads: a tensor outside the kernel of the
 * chain's dtype, or (low-precision chain) a cast to it of an f32 one, which
 * the step reads and rounds. Sets the step's dt and odt; -1 if neither. */
static int bias_source(const mpt_graph *g, const char *in_k, int v, mpt_dtype cd, mpt_cpu_epi_step *st) {
    const mpt_node *vn = &g->nodes[v];
    st->odt = MPT_DT_F32;
    if (in_k[v] && low_dt(cd) && vn->op == MPT_OP_CAST && vn->dtype == cd) {
        st->odt = cd;
        v = vn->in[0];
        vn = &g->nodes[v];
    }
    if (in_k[v] || vn->op == MPT_OP_CONST || !float_dt(vn->dtype) || vn->shape.rank != 1) return -1;
    st->dt = vn->dtype;
    return v;
}

/* Whether broadcast node b spreads a vector along the last of its dims and
 * that dim is C's n columns: the bias C's column index reads. */
static int along_columns(const mpt_node *b, int64_t n) {
    int r = b->shape.rank;
    return r >= 1 && b->attr.i[0] == (int64_t)1 << (r - 1) && b->shape.dim[r - 1] == n;
}

/* A constant 0, or a broadcast of one computed in the kernel */
static int is_zero(const mpt_graph *g, const char *in_k, int v) {
    const mpt_node *vn = &g->nodes[v];
    if (vn->op == MPT_OP_BROADCAST && in_k[v]) vn = &g->nodes[vn->in[0]];
    return vn->op == MPT_OP_CONST && vn->attr.f == 0.0;
}

/* Tries to make consumer u of c (a value of the chain's dtype) a GEMM
 * epilogue step; C has n columns. */
static int map_step(mpt_cpu_kx *x, const mpt_graph *g, const char *in_k, int c, int u,
                    int64_t n, mpt_cpu_gemm_desc *d) {
    const mpt_node *un = &g->nodes[u];
    mpt_dtype cd = g->nodes[c].dtype;
    if (d->n_steps >= MPT_CPU_EPI_MAX || un->dtype != cd) return 0;
    mpt_cpu_epi_step *st = &d->steps[d->n_steps];
    int i = d->n_steps;
    *st = (mpt_cpu_epi_step){.dt = MPT_DT_F32, .odt = MPT_DT_F32};
    /* op -> GEMM epilogue step (f32 approximations: not for a low chain) */
    static const struct { mpt_op op; mpt_cpu_epi_op step; } act[] = {
        {MPT_OP_RELU, MPT_CPU_EPI_RELU}, {MPT_OP_SIGMOID, MPT_CPU_EPI_SIGMOID},
        {MPT_OP_TANH, MPT_CPU_EPI_TANH}, {MPT_OP_GELU, MPT_CPU_EPI_GELU},
    };
    for (size_t a = 0; a < sizeof act / sizeof act[0]; a++)
        if (act[a].op == un->op) {
            /* sigmoid and tanh have no exact low-precision form; GELU
             * rounds its f32 value to cd exactly (gemm_epi.c gelu_exact) */
            if (low_dt(cd) && un->op != MPT_OP_RELU && un->op != MPT_OP_GELU) return 0;
            st->op = act[a].step;
            if (un->op == MPT_OP_GELU) st->odt = cd; /* the result rounded to cd */
            d->n_steps++;
            return 1;
        }
    if (un->op == MPT_OP_SELECT) {
        /* select(gt(r, 0), x, 0) with r read from memory: the relu
         * gradient (a batch norm's backward after a convolution's data
         * gradient); r > 0 is false for NaN as gt is, and the 0 is +0 */
        const mpt_node *cn = &g->nodes[un->in[0]];
        if (low_dt(cd) || un->in[1] != c || !is_zero(g, in_k, un->in[2]) || cn->op != MPT_OP_GT ||
            !in_k[un->in[0]] || !is_zero(g, in_k, cn->in[1]))
            return 0;
        int v = cn->in[0];
        const mpt_node *vn = &g->nodes[v];
        if (in_k[v] || vn->op == MPT_OP_CONST || vn->dtype != MPT_DT_F32 ||
            mpt_shape_numel(vn->shape) != mpt_shape_numel(un->shape))
            return 0;
        st->op = MPT_CPU_EPI_RELU_MASK;
        st->dt = vn->dtype;
        x->epi_slot[i] = mpt_cpu_kx_slot(x, v, 0);
        d->n_steps++;
        return 1;
    }
    if (un->op != MPT_OP_ADD && un->op != MPT_OP_MUL) return 0;
    if (un->in[0] == un->in[1]) return 0;
    int o = un->in[0] == c ? un->in[1] : un->in[0];
    const mpt_node *on = &g->nodes[o];
    if (un->op == MPT_OP_MUL && on->op == MPT_OP_GELU_GRAD && in_k[o] && on->dtype == cd) {
        /* x * gelu_grad(v), v read from memory: the backward pass of GELU,
         * in the f32 math of the forward step (MPT_CPU_EPI_GELU); in a low
         * chain gelu_grad(v) is rounded to cd exactly (odt) and the product
         * of two cd values is exact in f32 */
        int v = on->in[0];
        const mpt_node *vn = &g->nodes[v];
        if (in_k[v] || vn->op == MPT_OP_CONST || !float_dt(vn->dtype)) return 0;
        if (low_dt(cd) && vn->dtype != cd) return 0;
        st->op = MPT_CPU_EPI_GELU_GRAD;
        st->dt = vn->dtype;
        if (low_dt(cd)) st->odt = cd;
        x->epi_slot[i] = mpt_cpu_kx_slot(x, v, 0);
    } else if (un->op == MPT_OP_MUL) {
        /* x * broadcast(const); the constant holds a value of its dtype */
        int src = on->op == MPT_OP_BROADCAST && in_k[o] ? on->in[0] : o;
        if (g->nodes[src].op != MPT_OP_CONST) return 0;
        st->op = MPT_CPU_EPI_SCALE;
        x->epi_scalar[i] = (float)g->nodes[src].attr.f;
    } else if (on->op == MPT_OP_BROADCAST && in_k[o] && along_columns(on, n)) {
        int v = bias_source(g, in_k, on->in[0], cd, st);
        if (v < 0) return 0;
        st->op = MPT_CPU_EPI_BIAS;
        x->epi_slot[i] = mpt_cpu_kx_slot(x, v, 0);
    } else if (!in_k[o] && on->op != MPT_OP_CONST && float_dt(on->dtype)) {
        st->op = MPT_CPU_EPI_RESIDUAL;
        st->dt = on->dtype;
        x->epi_slot[i] = mpt_cpu_kx_slot(x, o, 0);
    } else {
        return 0;
    }
    d->n_steps++;
    return 1;
}

int mpt_cpu_epi_chain(const mpt_graph *g, const mpt_kernel *k, const char *in_k, mpt_cpu_kx *x,
                      mpt_cpu_gemm_desc *d) {
    int c = k->root;
    int64_t n = last_dim(&g->nodes[k->root]);
    for (;;) {
        mpt_dtype cd = g->nodes[c].dtype;
        int low = low_dt(cd);
        if (cd != MPT_DT_F32 && !low) break;
        int u = single_consumer(g, k, c);
        if (u < 0) break;
        int out = mpt_cpu_kernel_output(k, c);
        if (!out && !low && g->nodes[u].op == MPT_OP_CAST && float_dt(g->nodes[u].dtype)) {
            c = u; /* the last step: C's dtype */
            break;
        }
        if (!out && low && g->nodes[u].op == MPT_OP_CAST && g->nodes[u].dtype == MPT_DT_F32) {
            /* widened to f32 (a mixed policy's weight gradient on its way
             * to the f32 variable): the value rounded to cd, stored as an
             * f32 C, is the cast's result exactly */
            if (d->n_steps + 1 >= MPT_CPU_EPI_MAX) break;
            d->steps[d->n_steps++] = (mpt_cpu_epi_step){MPT_CPU_EPI_ROUND, cd, MPT_DT_F32};
            c = u;
            break;
        }
        int pushed = 0;
        if (out) {
            /* c is written here and read on by the chain */
            if (d->n_steps + 1 >= MPT_CPU_EPI_MAX) break;
            int i = d->n_steps;
            int s = mpt_cpu_kx_slot(x, c, 0);
            if (s < 0) break;
            d->steps[d->n_steps++] = (mpt_cpu_epi_step){MPT_CPU_EPI_STORE, cd, MPT_DT_F32};
            x->epi_slot[i] = s;
            x->epi_node[i] = c;
            pushed++;
        }
        if (g->nodes[u].op == MPT_OP_RESHAPE) {
            c = u;
            continue;
        }
        /* the accumulator (or the last step's f32 result) as c's value */
        if (low && g->nodes[u].op != MPT_OP_RELU) {
            if (d->n_steps + 1 >= MPT_CPU_EPI_MAX) {
                d->n_steps -= pushed;
                break;
            }
            d->steps[d->n_steps++] = (mpt_cpu_epi_step){MPT_CPU_EPI_ROUND, cd, MPT_DT_F32};
            pushed++;
        }
        if (!map_step(x, g, in_k, c, u, n, d)) {
            d->n_steps -= pushed;
            break;
        }
        c = u;
    }
    for (int i = d->n_steps; i < MPT_CPU_EPI_MAX; i++) x->epi_slot[i] = x->epi_node[i] = -1;
    x->n_epi = d->n_steps;
    return c;
}

void mpt_cpu_epi_finite(const mpt_graph *g, const mpt_kernel *k, const char *in_k, mpt_cpu_kx *x,
                        mpt_cpu_gemm_desc *d, int c) {
    mpt_dtype cd = g->nodes[c].dtype;
    int64_t n = last_dim(&g->nodes[k->root]);
    if (!float_dt(cd) || d->n_steps + 2 > MPT_CPU_EPI_MAX) return;
    for (int i = 0; i < k->n_outputs; i++) {
        int o = k->outputs[i];
        const mpt_node *on = &g->nodes[o];
        if (on->op != MPT_OP_REDUCE_ALL || on->shape.rank != 1 || on->shape.dim[0] != n) continue;
        /* is_finite read by o alone, of c or of a reshape of it (C's
         * element (row, col) stays at row * n + col, its column col) */
        int f = on->in[0], v;
        if (!in_k[f] || g->nodes[f].op != MPT_OP_IS_FINITE || mpt_cpu_kernel_output(k, f) ||
            single_consumer(g, k, f) != o)
            continue;
        for (v = g->nodes[f].in[0]; v != c && in_k[v] && g->nodes[v].op == MPT_OP_RESHAPE;)
            v = g->nodes[v].in[0];
        if (v != c) continue;
        int s = mpt_cpu_kx_slot(x, o, 0);
        if (s < 0) return;
        if (low_dt(cd)) /* the finite check sees C's rounded value */
            d->steps[d->n_steps++] = (mpt_cpu_epi_step){MPT_CPU_EPI_ROUND, cd, MPT_DT_F32};
        int at = d->n_steps++;
        d->steps[at] = (mpt_cpu_epi_step){MPT_CPU_EPI_FINITE, MPT_DT_F32, MPT_DT_F32};
        x->epi_slot[at] = s;
        x->epi_node[at] = o;
        x->n_epi = d->n_steps;
        return;
    }
}

int mpt_cpu_epi_by_rows(const mpt_cpu_gemm_desc *d) {
    for (int i = 0; i < d->n_steps; i++) {
        mpt_cpu_epi_op op = d->steps[i].op;
        if (op == MPT_CPU_EPI_RESIDUAL || op == MPT_CPU_EPI_RELU_MASK || op == MPT_CPU_EPI_GELU_GRAD ||
            op == MPT_CPU_EPI_STORE || op == MPT_CPU_EPI_FINITE)
            return 1;
    }
    return 0;
}

void mpt_cpu_epi_describe(const mpt_cpu_gemm_desc *d, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < d->n_steps && len < n; i++) {
        const mpt_cpu_epi_step *st = &d->steps[i];
        const char *dt = mpt_dtype_name(st->dt);
        int as = st->odt != st->dt && st->odt != MPT_DT_F32; /* rounded once loaded */
        char what[64];
        switch (st->op) {
        case MPT_CPU_EPI_BIAS:
        case MPT_CPU_EPI_RESIDUAL:
            snprintf(what, sizeof what, "+ %s %s%s%s", st->op == MPT_CPU_EPI_BIAS ? "bias" : "residual",
                     dt, as ? " as " : "", as ? mpt_dtype_name(st->odt) : "");
            break;
        case MPT_CPU_EPI_SCALE: snprintf(what, sizeof what, "* scalar"); break;
        case MPT_CPU_EPI_RELU: snprintf(what, sizeof what, "relu"); break;
        case MPT_CPU_EPI_SIGMOID: snprintf(what, sizeof what, "sigmoid"); break;
        case MPT_CPU_EPI_TANH: snprintf(what, sizeof what, "tanh"); break;
        case MPT_CPU_EPI_GELU: /* f16/bf16: gemm_epi.c's table of exact results */
            snprintf(what, sizeof what, "gelu%s%s%s", st->odt != MPT_DT_F32 ? " to " : "",
                     st->odt != MPT_DT_F32 ? mpt_dtype_name(st->odt) : "",
                     st->odt != MPT_DT_F32 ? " (exact, by table)" : "");
            break;
        case MPT_CPU_EPI_RELU_MASK: snprintf(what, sizeof what, "relu mask %s", dt); break;
        case MPT_CPU_EPI_ROUND: snprintf(what, sizeof what, "round to %s", dt); break;
        case MPT_CPU_EPI_GELU_GRAD:
            snprintf(what, sizeof what, "* gelu_grad %s%s", dt,
                     st->odt != MPT_DT_F32 ? " (exact, by table)" : "");
            break;
        case MPT_CPU_EPI_STORE: snprintf(what, sizeof what, "store %s", dt); break;
        case MPT_CPU_EPI_FINITE: snprintf(what, sizeof what, "finite check"); break;
        }
        int w = snprintf(buf + len, n - len, "%s%s", i ? ", " : "", what);
        len += w > 0 ? (size_t)w : 0;
    }
}
