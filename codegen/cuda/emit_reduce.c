/* codegen/cuda/emit_reduce.c — REDUCTION kernels. Reductions that keep
 * trailing dims (per channel) run in blocks of 32 columns (below,
 * emit_columns); the others one block per output row (the kept dims),
 * threads striding over the reduced elements, each
 * reduction accumulated in f32 (int for i32/bool), combined with warp
 * shuffles and one shared-memory pass. Elementwise prologue ops are
 * computed where the accumulation reads them; epilogue ops at row level
 * after the reductions, or per element when their shape is the input's
 * (softmax's exp(x - max) / sum is one kernel).
 *
 * All reductions of one kernel reduce the same input shape over the same
 * axes, so they share the row decomposition; a later reduction may read an
 * earlier one's result spread back over the row (BROADCAST over the kept
 * dims), which is the row's register value (see mpt_cu_em.alias_*).
 */
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cuda_internal.h"

enum { RED_THREADS = 256 };

static int is_reduction(mpt_op op) {
    return op == MPT_OP_REDUCE_SUM || op == MPT_OP_REDUCE_MAX || op == MPT_OP_REDUCE_ALL ||
           op == MPT_OP_ARGMAX;
}

static int64_t axes_of(const mpt_node *nd) {
    return nd->op == MPT_OP_ARGMAX ? (int64_t)1 << nd->attr.i[0] : nd->attr.i[0];
}

/* "e = base + offset of reduced element r" over shape s, reduced dims mask */
static void element_index(mpt_cu_em *e, mpt_shape s, int64_t mask) {
    char expr[1024] = "base";
    size_t o = 4;
    int64_t rstride = 1;
    for (int d = s.rank - 1; d >= 0; d--) {
        if (!(mask >> d & 1)) continue;
        o += (size_t)snprintf(expr + o, sizeof expr - o, " + (r / %lldLL %% %lldLL) * %lldLL",
                              (long long)rstride, (long long)s.dim[d],
                              (long long)mpt_cu_stride(s, d));
        rstride *= s.dim[d];
    }
    mpt_cu_line(e, "const long long e = %s;", expr);
}

static void row_base(mpt_cu_em *e, mpt_shape s, int64_t mask) {
    char expr[1024] = "0";
    size_t o = 1;
    int64_t kstride = 1;
    for (int d = s.rank - 1; d >= 0; d--) {
        if (mask >> d & 1) continue;
        o += (size_t)snprintf(expr + o, sizeof expr - o, " + (row / %lldLL %% %lldLL) * %lldLL",
                              (long long)kstride, (long long)s.dim[d],
                              (long long)mpt_cu_stride(s, d));
        kstride *= s.dim[d];
    }
    mpt_cu_line(e, "const long long base = %s;", expr);
}

/* Accumulates reduction `id` over the row and leaves its value in var. */
static void reduce_one(mpt_cu_em *e, int id, int64_t rlen, char *var) {
    const mpt_node *nd = &e->g->nodes[id];
    const mpt_node *in = &e->g->nodes[nd->in[0]];
    int ints = mpt_cu_regtype(in->dtype) && mpt_cu_regtype(in->dtype)[0] == 'i';
    const char *at = ints ? "int" : "float";
    const char *init = "0", *comb = NULL, *warp = NULL;
    if (nd->op == MPT_OP_REDUCE_SUM) {
        init = ints ? "0" : "0.f";
        comb = "%s + x";
        warp = "mpt_warp_sum";
    } else if (nd->op == MPT_OP_REDUCE_MAX) {
        init = ints ? "(-2147483647 - 1)" : "__uint_as_float(0xff800000u)";
        comb = ints ? "max(%s, x)" : "fmaxf(%s, x)";
        warp = "mpt_warp_max";
    } else if (nd->op == MPT_OP_REDUCE_ALL) {
        init = "1";
        comb = "%s && x";
        warp = "mpt_warp_and";
    }
    char a[24], x[24];
    mpt_cu_fresh(e, "acc", a);
    if (nd->op == MPT_OP_ARGMAX) {
        /* (value, index) pairs; the first maximum wins ties, as the interpreter */
        mpt_cu_line(e, "float %s = __uint_as_float(0xff800000u); int %s_i = 0x7fffffff;", a, a);
        mpt_cu_line(e, "for (long long r = threadIdx.x; r < %lldLL; r += blockDim.x) {",
                    (long long)rlen);
        e->indent++;
        int mark = mpt_cu_mark(e);
        element_index(e, in->shape, axes_of(nd));
        mpt_cu_value(e, nd->in[0], "e", x);
        mpt_cu_line(e, "if (%s > %s || (%s == %s && (int)r < %s_i)) { %s = %s; %s_i = (int)r; }",
                    x, a, x, a, a, a, x, a);
        mpt_cu_release(e, mark);
        e->indent--;
        mpt_cu_line(e, "}");
        mpt_cu_line(e, "for (int o = 16; o > 0; o >>= 1) {");
        mpt_cu_line(e, "    float ov = __shfl_xor_sync(0xffffffffu, %s, o);", a);
        mpt_cu_line(e, "    int oi = __shfl_xor_sync(0xffffffffu, %s_i, o);", a);
        mpt_cu_line(e, "    if (ov > %s || (ov == %s && oi < %s_i)) { %s = ov; %s_i = oi; }", a, a,
                    a, a, a);
        mpt_cu_line(e, "}");
        mpt_cu_line(e, "if ((threadIdx.x & 31) == 0) { red_f[threadIdx.x >> 5] = %s; "
                       "red_i[threadIdx.x >> 5] = %s_i; }", a, a);
        mpt_cu_line(e, "__syncthreads();");
        mpt_cu_line(e, "if (threadIdx.x == 0) {");
        mpt_cu_line(e, "    for (int w = 1; w < (int)(blockDim.x >> 5); w++)");
        mpt_cu_line(e, "        if (red_f[w] > red_f[0] || (red_f[w] == red_f[0] && "
                       "red_i[w] < red_i[0])) { red_f[0] = red_f[w]; red_i[0] = red_i[w]; }");
        mpt_cu_line(e, "    red_i[32] = red_i[0];");
        mpt_cu_line(e, "}");
        mpt_cu_line(e, "__syncthreads();");
        mpt_cu_fresh(e, "r", var);
        mpt_cu_line(e, "const int %s = red_i[32];", var);
        mpt_cu_line(e, "__syncthreads();");
        return;
    }
    mpt_cu_line(e, "%s %s = %s;", at, a, init);
    mpt_cu_line(e, "for (long long r = threadIdx.x; r < %lldLL; r += blockDim.x) {",
                (long long)rlen);
    e->indent++;
    int mark = mpt_cu_mark(e);
    element_index(e, in->shape, axes_of(nd));
    mpt_cu_value(e, nd->in[0], "e", x);
    char c[64];
    snprintf(c, sizeof c, comb, a);
    mpt_cu_line(e, "{ const %s x = %s; %s = %s; }", at, x, a, c);
    mpt_cu_release(e, mark);
    e->indent--;
    mpt_cu_line(e, "}");
    const char *sh = ints ? "red_i" : "red_f";
    mpt_cu_line(e, "%s = %s(%s);", a, warp, a);
    mpt_cu_line(e, "if ((threadIdx.x & 31) == 0) %s[threadIdx.x >> 5] = %s;", sh, a);
    mpt_cu_line(e, "__syncthreads();");
    mpt_cu_line(e, "if (threadIdx.x < 32) {");
    mpt_cu_line(e, "    %s t = threadIdx.x < (blockDim.x >> 5) ? %s[threadIdx.x] : %s;", at, sh,
                init);
    mpt_cu_line(e, "    t = %s(t);", warp);
    mpt_cu_line(e, "    if (threadIdx.x == 0) %s[32] = t;", sh);
    mpt_cu_line(e, "}");
    mpt_cu_line(e, "__syncthreads();");
    mpt_cu_fresh(e, "r", var);
    const char *rt = mpt_cu_regtype(nd->dtype);
    mpt_cu_line(e, "const %s %s = %s(%s[32]);", rt ? rt : "float", var,
                mpt_cu_round_fn(nd->dtype), sh);
    mpt_cu_line(e, "__syncthreads();");
}

/* Stores the row-level outputs (numel == rows) at "row"; returns whether
 * there are element-level ones (the input's shape). A kernel whose rows
 * are its elements (nothing reduced) stores its non-reductions per element. */
static int store_row_outputs(mpt_cu_em *e, mpt_shape s, int64_t rows) {
    const mpt_kernel *k = e->k;
    const mpt_graph *g = e->g;
    int any_elem = 0, mark = mpt_cu_mark(e);
    for (int o = 0; o < k->n_outputs; o++) {
        int id = k->outputs[o];
        int64_t numel = mpt_shape_numel(g->nodes[id].shape);
        if (numel == rows && !(rows == mpt_shape_numel(s) && !is_reduction(g->nodes[id].op))) {
            char v[24];
            mpt_cu_value(e, id, "row", v);
            mpt_cu_store(e, id, "row", v);
        } else if (numel == mpt_shape_numel(s)) {
            any_elem = 1;
        } else {
            e->err = "a reduction kernel's output must have the reduced or the input's shape";
            e->err_node = id;
        }
    }
    mpt_cu_release(e, mark);
    return any_elem;
}

/* Stores the element-level outputs at "e" (the caller's loop defines it). */
static void store_elem_outputs(mpt_cu_em *e, mpt_shape s, int64_t rows) {
    const mpt_kernel *k = e->k;
    const mpt_graph *g = e->g;
    int mark = mpt_cu_mark(e);
    for (int o = 0; o < k->n_outputs; o++) {
        int id = k->outputs[o];
        if (mpt_shape_numel(g->nodes[id].shape) != mpt_shape_numel(s)) continue;
        if (rows == mpt_shape_numel(s) && is_reduction(g->nodes[id].op)) continue;
        char v[24];
        mpt_cu_value(e, id, "e", v);
        mpt_cu_store(e, id, "e", v);
    }
    mpt_cu_release(e, mark);
}

/* ---- reductions that keep the trailing dims (per channel) ----
 *
 * Input [K1, R, C] reduced over R (a batch norm's sums over [B, H, W] per
 * channel, a bias gradient, global pooling per image). One block per 32
 * consecutive columns: 32 column lanes x 8 row lanes, so each warp reads
 * 32 consecutive elements of a row (coalesced), where one block per column
 * read with a stride of C. With many rows and independent reductions the
 * rows are also split over blockIdx.y: each block leaves its partial sums
 * in `scratch`, and the last block of a column group to finish (a counter
 * per group, reset by that block) combines them and computes the epilogue.
 * Reductions that read an earlier one, or element-level outputs, need the
 * whole column in one block: then there is no split. */

enum { COL_ROW_LANES = 8 };

typedef struct {
    int64_t k1, r, c;
} col_view;

/* The input as [K1, R, C], when the reduced dims are one run with at least
 * 16 kept elements after it. */
static int col_view_of(mpt_shape s, int64_t mask, col_view *v) {
    int d0 = -1, d1 = -1;
    for (int d = 0; d < s.rank; d++) {
        if (!(mask >> d & 1)) continue;
        if (d0 >= 0 && d != d1 + 1) return 0;
        if (d0 < 0) d0 = d;
        d1 = d;
    }
    if (d0 < 0) return 0;
    v->k1 = v->r = v->c = 1;
    for (int d = 0; d < s.rank; d++)
        *(d < d0 ? &v->k1 : d <= d1 ? &v->r : &v->c) *= s.dim[d];
    return v->c >= 16 && v->r > 1;
}

/* Whether node's value, computed in the kernel, reads a reduction of it. */
static int reads_reduction(const mpt_cu_em *e, int node, char *seen) {
    if (!e->in_kernel[node] || seen[node]) return 0;
    seen[node] = 1;
    const mpt_node *nd = &e->g->nodes[node];
    if (is_reduction(nd->op)) return 1;
    for (int i = 0; i < nd->n_in; i++)
        if (reads_reduction(e, nd->in[i], seen)) return 1;
    return 0;
}

typedef struct {
    int id, ints;
    const char *at, *init, *comb, *shared;
    char acc[24], var[24];
} col_red;

static void col_red_of(mpt_cu_em *e, int id, col_red *r) {
    const mpt_node *nd = &e->g->nodes[id];
    const char *rt = mpt_cu_regtype(e->g->nodes[nd->in[0]].dtype);
    r->id = id;
    r->ints = rt && rt[0] == 'i';
    r->at = r->ints ? "int" : "float";
    r->shared = r->ints ? "col_i" : "col_f";
    if (nd->op == MPT_OP_REDUCE_MAX) {
        r->init = r->ints ? "(-2147483647 - 1)" : "__uint_as_float(0xff800000u)";
        r->comb = r->ints ? "max(%s, %s)" : "fmaxf(%s, %s)";
    } else if (nd->op == MPT_OP_REDUCE_ALL) {
        r->init = "1";
        r->comb = "(%s && %s)";
    } else {
        r->init = r->ints ? "0" : "0.f";
        r->comb = "(%s + %s)";
    }
    mpt_cu_fresh(e, "acc", r->acc);
}

static void col_combine(mpt_cu_em *e, const col_red *r, const char *x) {
    char c[96];
    snprintf(c, sizeof c, r->comb, r->acc, x);
    mpt_cu_line(e, "%s = %s;", r->acc, c);
}

/* Sums the 8 row lanes' accumulators into row lane 0's. */
static void col_lanes(mpt_cu_em *e, const col_red *r) {
    mpt_cu_line(e, "%s[ty][tx] = %s;", r->shared, r->acc);
    mpt_cu_line(e, "__syncthreads();");
    mpt_cu_line(e, "if (ty == 0)");
    mpt_cu_line(e, "    for (int t = 1; t < %d; t++) {", COL_ROW_LANES);
    e->indent += 2;
    char x[48];
    snprintf(x, sizeof x, "%s[t][tx]", r->shared);
    col_combine(e, r, x);
    e->indent -= 2;
    mpt_cu_line(e, "    }");
    mpt_cu_line(e, "__syncthreads();");
}

/* Accumulates reductions red[0..n) over rows [lo, hi) of this thread's
 * column, in one pass over the input. */
static void col_pass(mpt_cu_em *e, col_red *red, int n, int64_t C, const char *lo,
                     const char *hi, const mpt_shape *elem_s, int64_t rows) {
    for (int j = 0; j < n; j++)
        mpt_cu_line(e, "%s %s = %s;", red[j].at, red[j].acc, red[j].init);
    mpt_cu_line(e, "if (col)");
    mpt_cu_line(e, "    for (long long r = %s + ty; r < %s; r += %d) {", lo, hi, COL_ROW_LANES);
    e->indent += 2;
    int mark = mpt_cu_mark(e);
    mpt_cu_line(e, "const long long e = base + r * %lldLL;", (long long)C);
    for (int j = 0; j < n; j++) {
        char x[24];
        mpt_cu_value(e, e->g->nodes[red[j].id].in[0], "e", x);
        col_combine(e, &red[j], x);
    }
    /* element-level outputs that read no reduction, in the same read */
    if (elem_s) store_elem_outputs(e, *elem_s, rows);
    mpt_cu_release(e, mark);
    e->indent -= 2;
    mpt_cu_line(e, "    }");
    for (int j = 0; j < n; j++) col_lanes(e, &red[j]);
}

/* Every thread of the column gets lane 0's result, rounded to the node's
 * dtype, bound as the reduction's value at "row". */
static void col_publish(mpt_cu_em *e, col_red *r) {
    const mpt_node *nd = &e->g->nodes[r->id];
    mpt_cu_line(e, "if (ty == 0) %s[0][tx] = %s;", r->shared, r->acc);
    mpt_cu_line(e, "__syncthreads();");
    mpt_cu_fresh(e, "r", r->var);
    const char *rt = mpt_cu_regtype(nd->dtype);
    mpt_cu_line(e, "const %s %s = %s(%s[0][tx]);", rt ? rt : "float", r->var,
                mpt_cu_round_fn(nd->dtype), r->shared);
    mpt_cu_line(e, "__syncthreads();");
    mpt_cu_bind(e, r->id, "row", r->var);
}

/* Row-level outputs by row lane 0 (numel == K1 * C), element-level ones
 * (the input's shape) by every lane over the column's rows. */
static void col_outputs(mpt_cu_em *e, mpt_shape s, int64_t rows, int64_t C, int64_t R,
                        int elem_done) {
    mpt_cu_line(e, "if (ty == 0 && col) {");
    e->indent++;
    int any_elem = store_row_outputs(e, s, rows);
    e->indent--;
    mpt_cu_line(e, "}");
    if (!any_elem || elem_done) return;
    mpt_cu_line(e, "if (col)");
    mpt_cu_line(e, "    for (long long r = ty; r < %lldLL; r += %d) {", (long long)R, COL_ROW_LANES);
    e->indent += 2;
    int m = mpt_cu_mark(e);
    mpt_cu_line(e, "const long long e = base + r * %lldLL;", (long long)C);
    store_elem_outputs(e, s, rows);
    mpt_cu_release(e, m);
    e->indent -= 2;
    mpt_cu_line(e, "    }");
}

static int emit_columns(mpt_cu_em *e, mpt_cuda_kernel_src *out, mpt_shape s, col_view v) {
    const mpt_kernel *k = e->k;
    const mpt_graph *g = e->g;
    col_red *red = calloc((size_t)k->n_nodes, sizeof *red);
    char *seen = calloc((size_t)g->n_nodes, 1);
    if (!red || !seen) {
        free(red), free(seen);
        return -1;
    }
    int n = 0, independent = 1, elem_free = 1; /* element outputs read no reduction */
    int64_t nout = v.k1 * v.c;
    for (int i = 0; i < k->n_nodes; i++) {
        int id = k->nodes[i];
        if (!is_reduction(g->nodes[id].op)) continue;
        memset(seen, 0, (size_t)g->n_nodes);
        independent &= !reads_reduction(e, g->nodes[id].in[0], seen);
        col_red_of(e, id, &red[n++]);
    }
    for (int o = 0; o < k->n_outputs; o++) {
        int id = k->outputs[o];
        if (mpt_shape_numel(g->nodes[id].shape) == nout) continue;
        memset(seen, 0, (size_t)g->n_nodes);
        elem_free &= !reads_reduction(e, id, seen);
    }
    free(seen);
    int64_t cb = (v.c + 31) / 32, groups = v.k1 * cb, split = 1;
    /* independent reductions whose element-level outputs (if any) read
     * none of them can be written in one pass, in slices of the rows */
    int one_pass = independent && elem_free;
    if (one_pass) {
        /* at least 256 rows a block (32 per row lane), about 1024 blocks in
         * all; MPTC_CUDA_SPLIT_ROWS sets another least (the tests split
         * small shapes with it) */
        const char *env = getenv("MPTC_CUDA_SPLIT_ROWS");
        int64_t least = env && atoll(env) > 0 ? atoll(env) : 256;
        int64_t cap = (1024 + groups - 1) / groups;
        split = v.r / least;
        if (split > cap) split = cap;
        if (split < 1) split = 1;
    }
    int64_t parts = (int64_t)n * split * nout; /* floats of partial results */
    if (split > 1) {
        out->scratch_bytes = (size_t)parts * 4;
        out->counter_bytes = (size_t)groups * 4;
    }
    mpt_cu_signature(e, out);
    mpt_sb_printf(e->sb, " {\n");
    e->indent = 1;
    mpt_cu_line(e, "/* input [%lld, %lld, %lld] reduced over the middle: blocks of 32 columns x "
                   "%d row lanes; rows split %lld ways */",
                (long long)v.k1, (long long)v.r, (long long)v.c, COL_ROW_LANES, (long long)split);
    mpt_cu_line(e, "__shared__ float col_f[%d][33];", COL_ROW_LANES);
    mpt_cu_line(e, "__shared__ int col_i[%d][33];", COL_ROW_LANES);
    mpt_cu_line(e, "const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;");
    if (split > 1) {
        mpt_cu_line(e, "__shared__ int last;");
        mpt_cu_line(e, "unsigned *count = counters;");
        mpt_cu_line(e, "const long long r_lo = %lldLL * blockIdx.y / %lldLL;", (long long)v.r,
                    (long long)split);
        mpt_cu_line(e, "const long long r_hi = %lldLL * (blockIdx.y + 1) / %lldLL;",
                    (long long)v.r, (long long)split);
    } else {
        mpt_cu_line(e, "const long long r_lo = 0, r_hi = %lldLL;", (long long)v.r);
    }
    mpt_cu_line(e, "for (long long grp = blockIdx.x; grp < %lldLL; grp += gridDim.x) {",
                (long long)groups);
    e->indent++;
    int mark = mpt_cu_mark(e);
    mpt_cu_line(e, "const long long c = grp %% %lldLL * 32 + tx;", (long long)cb);
    mpt_cu_line(e, "const long long row = grp / %lldLL * %lldLL + c;", (long long)cb,
                (long long)v.c);
    mpt_cu_line(e, "const long long base = grp / %lldLL * %lldLL + c;", (long long)cb,
                (long long)(v.r * v.c));
    mpt_cu_line(e, "const bool col = c < %lldLL;", (long long)v.c);
    if (independent) {
        col_pass(e, red, n, v.c, "r_lo", "r_hi", one_pass ? &s : NULL, nout);
    } else {
        for (int j = 0; j < n; j++) {
            col_pass(e, &red[j], 1, v.c, "r_lo", "r_hi", NULL, nout);
            col_publish(e, &red[j]);
        }
    }
    if (split > 1) {
        /* each block's partials out; the group's last block reads them all */
        for (int j = 0; j < n; j++)
            mpt_cu_line(e, "if (ty == 0 && col) scratch[%lldLL + blockIdx.y * %lldLL + row] = "
                           "%s(%s);",
                        (long long)(j * split * nout), (long long)nout,
                        red[j].ints ? "__int_as_float" : "", red[j].acc);
        mpt_cu_line(e, "__threadfence();");
        mpt_cu_line(e, "__syncthreads();");
        mpt_cu_line(e, "if (threadIdx.x == 0) last = atomicAdd(&count[grp], 1u) == %lldu;",
                    (long long)(split - 1));
        mpt_cu_line(e, "__syncthreads();");
        mpt_cu_line(e, "if (!last) continue;");
        mpt_cu_line(e, "__threadfence();");
        for (int j = 0; j < n; j++) {
            mpt_cu_line(e, "%s = %s;", red[j].acc, red[j].init);
            mpt_cu_line(e, "if (col)");
            mpt_cu_line(e, "    for (int t = ty; t < %lld; t += %d) {", (long long)split,
                        COL_ROW_LANES);
            e->indent += 2;
            char x[160];
            snprintf(x, sizeof x, "%s(__ldcg(&scratch[%lldLL + t * %lldLL + row]))",
                     red[j].ints ? "__float_as_int" : "", (long long)(j * split * nout),
                     (long long)nout);
            col_combine(e, &red[j], x);
            e->indent -= 2;
            mpt_cu_line(e, "    }");
            col_lanes(e, &red[j]);
        }
        mpt_cu_line(e, "if (threadIdx.x == 0) count[grp] = 0u; /* ready for the next launch */");
    }
    if (independent)
        for (int j = 0; j < n; j++) col_publish(e, &red[j]);
    col_outputs(e, s, nout, v.c, v.r, one_pass);
    mpt_cu_release(e, mark);
    e->indent--;
    mpt_cu_line(e, "}");
    mpt_sb_printf(e->sb, "}\n");
    free(red);
    out->block[0] = 32 * COL_ROW_LANES;
    out->grid[0] = groups > 8192 ? 8192 : (unsigned)groups;
    out->grid[1] = (unsigned)split;
    return 0;
}

int mpt_cu_emit_reduction(mpt_cu_em *e, mpt_cuda_kernel_src *out) {
    const mpt_kernel *k = e->k;
    const mpt_graph *g = e->g;
    int first = -1, argmax = 0;
    for (int i = 0; i < k->n_nodes; i++) {
        const mpt_node *nd = &g->nodes[k->nodes[i]];
        if (!is_reduction(nd->op)) continue;
        argmax |= nd->op == MPT_OP_ARGMAX;
        if (first < 0) { first = k->nodes[i]; continue; }
        const mpt_node *f = &g->nodes[first];
        if (!mpt_shape_eq(g->nodes[nd->in[0]].shape, g->nodes[f->in[0]].shape) ||
            axes_of(nd) != axes_of(f)) {
            e->err = "reductions of one kernel must reduce the same shape over the same axes";
            e->err_node = k->nodes[i];
            return 0;
        }
    }
    if (first < 0) {
        e->err = "reduction kernel without a reduction";
        return 0;
    }
    mpt_shape s = g->nodes[g->nodes[first].in[0]].shape;
    int64_t mask = axes_of(&g->nodes[first]);
    int64_t rows = mpt_shape_numel(g->nodes[first].shape);
    int64_t rlen = mpt_shape_numel(s) / (rows ? rows : 1);
    int64_t kept = 0;
    for (int d = 0; d < s.rank; d++)
        if (!(mask >> d & 1)) kept |= (int64_t)1 << d;
    e->alias_on = 1;
    e->alias_shape = s;
    e->alias_mask = kept;
    col_view v;
    if (!argmax && !getenv("MPTC_CUDA_ROW_REDUCE") && col_view_of(s, mask, &v))
        return emit_columns(e, out, s, v);

    mpt_cu_signature(e, out);
    mpt_sb_printf(e->sb, " {\n");
    e->indent = 1;
    mpt_cu_line(e, "/* input %lld rows x %lld reduced elements; one block per row */",
                (long long)rows, (long long)rlen);
    mpt_cu_line(e, "__shared__ float red_f[33];");
    mpt_cu_line(e, "__shared__ int red_i[33];");
    mpt_cu_line(e, "for (long long row = blockIdx.x; row < %lldLL; row += gridDim.x) {",
                (long long)rows);
    e->indent++;
    int mark = mpt_cu_mark(e);
    row_base(e, s, mask);
    for (int i = 0; i < k->n_nodes; i++) {
        int id = k->nodes[i];
        if (!is_reduction(g->nodes[id].op)) continue;
        char v[24];
        reduce_one(e, id, rlen, v);
        mpt_cu_bind(e, id, "row", v);
    }
    /* row-level outputs (numel == rows) by thread 0, element-level ones by all */
    mpt_cu_line(e, "if (threadIdx.x == 0) {");
    e->indent++;
    int any_elem = store_row_outputs(e, s, rows);
    e->indent--;
    mpt_cu_line(e, "}");
    if (any_elem) {
        mpt_cu_line(e, "for (long long r = threadIdx.x; r < %lldLL; r += blockDim.x) {",
                    (long long)rlen);
        e->indent++;
        int m3 = mpt_cu_mark(e);
        element_index(e, s, mask);
        store_elem_outputs(e, s, rows);
        mpt_cu_release(e, m3);
        e->indent--;
        mpt_cu_line(e, "}");
    }
    mpt_cu_release(e, mark);
    e->indent--;
    mpt_cu_line(e, "}");
    mpt_sb_printf(e->sb, "}\n");
    /* a whole-tensor reduction gets one big block; rows get one block each */
    out->block[0] = rows == 1 ? 1024 : RED_THREADS;
    out->grid[0] = rows > 8192 ? 8192 : (unsigned)(rows < 1 ? 1 : rows);
    return 0;
}
