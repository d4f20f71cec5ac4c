/* ir/tensor.c — host tensors in their dtype's own storage, the graph's
 * feed/state interface (k-th INPUT, k-th VARIABLE) and variable
 * initialisation.
 *
 * Variable initialisation is a pure function of (seed, variable name,
 * element index): every element draws from mpt_mix64 of those, never from a
 * shared stream, so adding a layer, reordering nodes or changing the batch
 * size leaves every other variable's initial value unchanged, and a backend
 * or a resumed run can reproduce it exactly. */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/interp_impl.h"

int mpt_tensor_alloc(mpt_tensor *t, mpt_dtype dt, mpt_shape s) {
    memset(t, 0, sizeof *t);
    if (dt < 0 || dt >= MPT_DT_COUNT || s.rank < 0 || s.rank > MPT_MAX_DIMS) return -1;
    int64_t n = 1;
    for (int d = 0; d < s.rank; d++) {
        if (s.dim[d] < 0) return -1;
        if (s.dim[d] > 0 && n > INT64_MAX / 8 / s.dim[d]) return -1;
        n *= s.dim[d];
    }
    /* calloc(0) may return NULL; a zero-element tensor still gets a pointer */
    void *p = calloc(n ? (size_t)n : 1, mpt_dtype_size(dt));
    if (!p) return -1;
    t->dtype = dt;
    t->shape = s;
    t->data = p;
    return 0;
}

void mpt_tensor_free(mpt_tensor *t) {
    if (!t) return;
    free(t->data);
    t->data = NULL;
}

size_t mpt_tensor_bytes(const mpt_tensor *t) {
    return (size_t)mpt_shape_numel(t->shape) * mpt_dtype_size(t->dtype);
}

double mpt_tensor_get(const mpt_tensor *t, int64_t i) {
    switch (t->dtype) {
    case MPT_DT_F32: return ((const float *)t->data)[i];
    case MPT_DT_F16: return mpt_f16_to_f32(((const uint16_t *)t->data)[i]);
    case MPT_DT_BF16: return mpt_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case MPT_DT_I32: return ((const int32_t *)t->data)[i];
    case MPT_DT_BOOL: return ((const uint8_t *)t->data)[i] != 0;
    case MPT_DT_F64: return ((const double *)t->data)[i];
    case MPT_DT_COUNT: break;
    }
    assert(!"mpt_tensor_get: not a dtype (f32, f16, bf16, i32, bool, f64)");
    return 0;
}

void mpt_tensor_set(mpt_tensor *t, int64_t i, double v) {
    /* round first, then store: the conversions below are then exact */
    double r = mpt_interp_round(t->dtype, v);
    switch (t->dtype) {
    case MPT_DT_F32: ((float *)t->data)[i] = (float)r; return;
    case MPT_DT_F16: ((uint16_t *)t->data)[i] = mpt_f32_to_f16((float)r); return;
    case MPT_DT_BF16: ((uint16_t *)t->data)[i] = mpt_f32_to_bf16((float)r); return;
    case MPT_DT_I32: ((int32_t *)t->data)[i] = (int32_t)r; return;
    case MPT_DT_BOOL: ((uint8_t *)t->data)[i] = r != 0; return;
    case MPT_DT_F64: ((double *)t->data)[i] = r; return;
    case MPT_DT_COUNT: break;
    }
    assert(!"mpt_tensor_set: not a dtype (f32, f16, bf16, i32, bool, f64)");
}

void mpt_tensor_load(const mpt_tensor *t, double *dst) {
    int64_t n = mpt_shape_numel(t->shape);
    switch (t->dtype) {
    case MPT_DT_F32: {
        const float *s = t->data;
        for (int64_t i = 0; i < n; i++) dst[i] = s[i];
        return;
    }
    case MPT_DT_F64:
        memcpy(dst, t->data, (size_t)n * sizeof(double));
        return;
    case MPT_DT_F16: case MPT_DT_BF16: case MPT_DT_I32: case MPT_DT_BOOL:
        for (int64_t i = 0; i < n; i++) dst[i] = mpt_tensor_get(t, i);
        return;
    case MPT_DT_COUNT: break;
    }
    assert(!"mpt_tensor_load: not a dtype (f32, f16, bf16, i32, bool, f64)");
}

void mpt_tensor_store(mpt_tensor *t, const double *src) {
    int64_t n = mpt_shape_numel(t->shape);
    switch (t->dtype) {
    case MPT_DT_F32: {
        float *d = t->data;
        for (int64_t i = 0; i < n; i++) d[i] = (float)src[i];
        return;
    }
    case MPT_DT_F64:
        memcpy(t->data, src, (size_t)n * sizeof(double));
        return;
    case MPT_DT_F16: case MPT_DT_BF16: case MPT_DT_I32: case MPT_DT_BOOL:
        for (int64_t i = 0; i < n; i++) mpt_tensor_set(t, i, src[i]);
        return;
    case MPT_DT_COUNT: break;
    }
    assert(!"mpt_tensor_store: not a dtype (f32, f16, bf16, i32, bool, f64)");
}

/* ---- the graph's interface: k-th INPUT and k-th VARIABLE ------------------ */

static int count_op(const mpt_graph *g, mpt_op op) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].op == op;
    return n;
}

static int kth_op(const mpt_graph *g, mpt_op op, int k) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == op && k-- == 0) return i;
    return -1;
}

int mpt_graph_n_variables(const mpt_graph *g) { return count_op(g, MPT_OP_VARIABLE); }
int mpt_graph_variable_node(const mpt_graph *g, int k) { return kth_op(g, MPT_OP_VARIABLE, k); }
int mpt_graph_n_inputs(const mpt_graph *g) { return count_op(g, MPT_OP_INPUT); }
int mpt_graph_input_node(const mpt_graph *g, int k) { return kth_op(g, MPT_OP_INPUT, k); }

/* ---- variable initialisation ----------------------------------------------- */

/* FNV-1a: the variable's name becomes part of its random stream's key. */
static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; s && *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* uniform [0, 1) with 53 bits, draw `j` of element `i` of stream `key` */
static double init_uniform(uint64_t key, int64_t i, int j) {
    uint64_t h = mpt_mix64(mpt_mix64(key ^ (uint64_t)i) ^ (uint64_t)j);
    return (double)(h >> 11) * 0x1p-53;
}

/* N(0,1) truncated to [-2, 2] by redrawing, as Keras' TruncatedNormal
 * (Box-Muller on successive draws). After 64 rejections, which happens with
 * probability about 1e-86, the element is 0. */
static double init_truncated_normal(uint64_t key, int64_t i) {
    for (int a = 0; a < 64; a++) {
        double u1 = init_uniform(key, i, 2 * a), u2 = init_uniform(key, i, 2 * a + 1);
        double z = sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
        if (fabs(z) <= 2.0) return z;
    }
    return 0;
}

/* element i of variable node n, before rounding to its dtype; *ok cleared on
 * parameters no initialiser can use */
static double init_value(const mpt_node *n, uint64_t key, int64_t i, int *ok) {
    int64_t fan_in = n->attr.i[1], fan_out = n->attr.i[2];
    int is_float = mpt_dtype_is_float(n->dtype);
    switch (n->attr.i[0]) {
    case MPT_INIT_ZEROS: return 0;
    case MPT_INIT_ONES: return 1;
    case MPT_INIT_CONST: return n->attr.f;
    case MPT_INIT_GLOROT_UNIFORM:
        if (!is_float || fan_in + fan_out <= 0) break;
        return (2 * init_uniform(key, i, 0) - 1) * sqrt(6.0 / (double)(fan_in + fan_out));
    case MPT_INIT_HE_NORMAL:
        if (!is_float || fan_in <= 0) break;
        /* Keras divides by the truncated distribution's own stddev so the
         * result has variance 2 / fan_in */
        return init_truncated_normal(key, i) * sqrt(2.0 / (double)fan_in) /
               0.87962566103423978;
    case MPT_INIT_UNIFORM:
        if (!is_float) break;
        return (2 * init_uniform(key, i, 0) - 1) * n->attr.f;
    case MPT_INIT_FORGET_BIAS: { /* Keras' unit_forget_bias */
        int64_t quarter = mpt_shape_numel(n->shape) / 4;
        return quarter > 0 && i / quarter == 1 ? 1 : 0;
    }
    }
    *ok = 0;
    return 0;
}

/* Keras' Orthogonal: a normal matrix of [max(r, c), min(r, c)] made
 * orthonormal column by column (modified Gram-Schmidt, which is QR with
 * R's diagonal positive, as Keras' q * sign(diag(r))), transposed when
 * rows < cols. */
static int init_orthogonal(const mpt_node *n, uint64_t key, mpt_tensor *t) {
    int64_t cols = n->shape.rank ? n->shape.dim[n->shape.rank - 1] : 1;
    int64_t rows = mpt_shape_numel(n->shape) / (cols ? cols : 1);
    int64_t big = rows > cols ? rows : cols, small = rows > cols ? cols : rows;
    double *q = malloc((size_t)(big * small) * sizeof *q); /* column j at q + j * big */
    if (!q) return -1;
    for (int64_t i = 0; i < big * small; i++) {
        double u1 = init_uniform(key, i, 0), u2 = init_uniform(key, i, 1);
        q[i] = sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2);
    }
    for (int64_t j = 0; j < small; j++) {
        double *v = q + j * big;
        for (int64_t k = 0; k < j; k++) {
            const double *u = q + k * big;
            double dot = 0;
            for (int64_t i = 0; i < big; i++) dot += u[i] * v[i];
            for (int64_t i = 0; i < big; i++) v[i] -= dot * u[i];
        }
        double norm = 0;
        for (int64_t i = 0; i < big; i++) norm += v[i] * v[i];
        norm = sqrt(norm);
        for (int64_t i = 0; i < big; i++) v[i] = norm > 0 ? v[i] / norm : 0;
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            mpt_tensor_set(t, r * cols + c, rows >= cols ? q[c * big + r] : q[r * big + c]);
    free(q);
    return 0;
}

int mpt_init_variables(const mpt_graph *g, mpt_tensor *vars, uint64_t seed) {
    int k = 0;
    for (int id = 0; id < g->n_nodes; id++) {
        const mpt_node *n = &g->nodes[id];
        if (n->op != MPT_OP_VARIABLE) continue;
        mpt_tensor *t = &vars[k++];
        /* reuse a tensor the caller already allocated to this variable */
        int fits = t->data && t->dtype == n->dtype && mpt_shape_eq(t->shape, n->shape);
        if (!fits && mpt_tensor_alloc(t, n->dtype, n->shape) != 0) goto fail;
        uint64_t key = mpt_mix64(seed ^ mpt_mix64(name_hash(n->name)));
        if (n->attr.i[0] == MPT_INIT_ORTHOGONAL) {
            if (!mpt_dtype_is_float(n->dtype) || init_orthogonal(n, key, t) != 0) goto fail;
            continue;
        }
        int ok = 1;
        int64_t numel = mpt_shape_numel(n->shape);
        for (int64_t i = 0; i < numel && ok; i++) mpt_tensor_set(t, i, init_value(n, key, i, &ok));
        if (!ok) goto fail;
    }
    return 0;
fail:
    for (int j = 0; j < k; j++) mpt_tensor_free(&vars[j]);
    return -1;
}
