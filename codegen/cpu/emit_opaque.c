/* codegen/cpu/emit_opaque.c — OPAQUE kernels (max/avg pooling and their
 * gradients; scatter_add and argmax in opaque_index.c, batch_matmul in
 * batch_matmul.c) as plain C loops, and the im2col/col2im data movement of
 * the convolutions.
 *
 * These ops are rare next to the GEMMs around them, so they are not
 * generated: each computes as ir/interp_ops.c defines the op (double sums,
 * first maximum wins, windows never count padding) and rounds once to the
 * node's dtype, so the results are bit-identical to the interpreter's.
 * Pooling reads its operands in their own dtype and runs an image per task
 * over the pool (ResNet-50's first pooling is 6.4M values at batch 8).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

#include "codegen/cpu/emit.h"

/* ---- pooling: typed loads, one image per task over the pool ----
 * Values are read exactly (f16/bf16 widen exactly to f32), max pooling
 * compares them as the interpreter does (the first NaN wins; the gradient
 * goes to the first maximum) and stores the winning input value itself,
 * and sums (average pooling, a position that several windows share in a
 * gradient) are taken in double and rounded once. Rows of C channels are
 * widened as they are read, so the only image-sized scratch is a
 * gradient's double sums, kept from one run to the next (ResNet-50's first
 * pooling: 6.4M values at batch 8; widening whole images and allocating
 * their scratch every run cost 35 ms forward). */

typedef struct {
    mpt_op op;
    int64_t q[12]; /* n, h, w, c, oh, ow, win_h, win_w, sh, sw, ph, pw */
    mpt_dtype x_dt, dy_dt, out_dt;
    const void *x, *dy; /* forward: x; gradients: x (max only) and dy */
    void *out;
    double **scratch;   /* per thread */
} pool_job;

/* n values of dtype dt from element `at` of p, widened exactly */
static void load_run(mpt_dtype dt, const void *p, int64_t at, int64_t n, double *dst) {
    switch (dt) {
    case MPT_DT_F32:
        for (int64_t i = 0; i < n; i++) dst[i] = ((const float *)p)[at + i];
        return;
    case MPT_DT_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint32_t bits = (uint32_t)((const uint16_t *)p)[at + i] << 16;
            float f;
            memcpy(&f, &bits, 4);
            dst[i] = f;
        }
        return;
    case MPT_DT_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = mpt_f16_to_f32(((const uint16_t *)p)[at + i]);
        return;
    case MPT_DT_F64: case MPT_DT_I32: case MPT_DT_BOOL: case MPT_DT_COUNT: break;
    }
    mpt_tensor t = {dt, mpt_shape_1(at + n), (void *)p};
    for (int64_t i = 0; i < n; i++) dst[i] = mpt_tensor_get(&t, at + i);
}

/* the same into floats, for the dtypes f32 holds exactly (is_f32_exact);
 * inline, as store_exact_f32 below, so that the conversion loops are
 * compiled inside the pooling kernels' target clones (a call compiled for
 * baseline x86-64 kept them SSE2: bf16 max pooling forward 15-24% slower) */
static int is_f32_exact(mpt_dtype dt) { return dt == MPT_DT_F32 || dt == MPT_DT_BF16 || dt == MPT_DT_F16; }

static inline void load_run_f32(mpt_dtype dt, const void *p, int64_t at, int64_t n, float *dst) {
    if (dt == MPT_DT_F32) {
        memcpy(dst, (const float *)p + at, (size_t)n * sizeof *dst);
    } else if (dt == MPT_DT_BF16) {
        const uint16_t *s = (const uint16_t *)p + at;
        uint32_t *d = (uint32_t *)dst;
        for (int64_t i = 0; i < n; i++) d[i] = (uint32_t)s[i] << 16;
    } else {
        for (int64_t i = 0; i < n; i++) dst[i] = mpt_f16_to_f32(((const uint16_t *)p)[at + i]);
    }
}

/* The same without a copy where dt is f32: a pointer to the n floats,
 * in p itself or widened into buf. */
static inline const float *run_f32(mpt_dtype dt, const void *p, int64_t at, int64_t n,
                                   float *buf) {
    if (dt == MPT_DT_F32) return (const float *)p + at;
    load_run_f32(dt, p, at, n, buf);
    return buf;
}

/* n floats that dt holds exactly (values read from a dt tensor) */
static inline void store_exact_f32(mpt_dtype dt, void *out, int64_t at, const float *v,
                                   int64_t n) {
    if (dt == MPT_DT_F32) memcpy((float *)out + at, v, (size_t)n * sizeof *v);
    else if (dt == MPT_DT_BF16)
        for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[at + i] = mpt_cpu_bf16_of(v[i]);
    else
        for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[at + i] = mpt_f32_to_f16(v[i]);
}

/* The hot loops here are plain C; the binary targets baseline x86-64, so
 * these are also compiled for x86-64-v3 (AVX2) and v4 (AVX-512) and the
 * dynamic linker picks one at load (GCC target clones, ifunc). */
#define HOST_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

/* v rounded to bf16 through f32, vectorized: whether f32 held every
 * value exactly (then each was rounded once) */
HOST_CLONES
static int store_bf16_via_f32(uint16_t *restrict o, const double *restrict v, int64_t n) {
    int inexact = 0;
    for (int64_t i = 0; i < n; i++) {
        float f = (float)v[i];
        o[i] = mpt_cpu_bf16_of(f);
        inexact |= (double)f != v[i];
    }
    return !inexact;
}

/* n doubles, each rounded once to dt, to element `at` of out: a value that
 * f32 holds exactly is converted from f32 (one rounding), any other
 * through the exact path */
HOST_CLONES
static void store_rounded(mpt_dtype dt, void *out, int64_t at, const double *v, int64_t n) {
    mpt_tensor t = {dt, mpt_shape_1(at + n), out};
    if (dt == MPT_DT_F32) {
        for (int64_t i = 0; i < n; i++) ((float *)out)[at + i] = (float)v[i];
        return;
    }
    /* all through f32, then the few that f32 does not hold exactly again
     * through the exact path */
    if (dt == MPT_DT_BF16 && store_bf16_via_f32((uint16_t *)out + at, v, n)) return;
    for (int64_t i = 0; i < n; i++) {
        float f = (float)v[i];
        if ((double)f == v[i] && dt == MPT_DT_BF16) continue;
        if ((double)f == v[i] && dt == MPT_DT_F16) ((uint16_t *)out)[at + i] = mpt_f32_to_f16(f);
        else mpt_tensor_set(&t, at + i, v[i]);
    }
}

/* the in-image part of pool window (i, j): rows [h0, h1), columns [w0, w1) */
static void window(const int64_t *q, int64_t i, int64_t j, int64_t *h0, int64_t *h1, int64_t *w0,
                   int64_t *w1) {
    int64_t hs = i * q[8] - q[10], ws = j * q[9] - q[11];
    *h0 = hs < 0 ? 0 : hs;
    *h1 = hs + q[6] > q[1] ? q[1] : hs + q[6];
    *w0 = ws < 0 ? 0 : ws;
    *w1 = ws + q[7] > q[2] ? q[2] : ws + q[7];
}

static double max_nan(double a, double b) { return (a > b || isnan(a)) ? a : b; }

/* scratch per thread, in doubles: a gradient's image of dx sums, then
 * (every op) room for four rows of C values and C positions */
static int max_grad_rows(const pool_job *jb) {
    const int64_t *q = jb->q;
    return jb->op == MPT_OP_MAX_POOL_GRAD && is_f32_exact(jb->x_dt) &&
           q[1] * q[2] * q[3] < INT32_MAX && q[6] > 0;
}

static size_t pool_scratch(const pool_job *jb) {
    const int64_t *q = jb->q;
    size_t image = (size_t)(q[1] * q[2] * q[3]), rows = 4 * (size_t)q[3] + 8;
    if (jb->op == MPT_OP_MAX_POOL || jb->op == MPT_OP_AVG_POOL) return rows;
    /* max pooling's gradient keeps only the input rows its windows are on */
    if (max_grad_rows(jb)) return (size_t)(q[6] * q[2] * q[3]) + rows;
    return image + rows;
}

HOST_CLONES
static void max_pool_image_f32(const pool_job *jb, int64_t b, double *scr) {
    const int64_t *q = jb->q;
    int64_t C = q[3], image = q[1] * q[2] * C;
    float *acc = (float *)scr, *row = acc + C;
    for (int64_t i = 0; i < q[4]; i++)
        for (int64_t j = 0; j < q[5]; j++) {
            int64_t h0, h1, w0, w1;
            window(q, i, j, &h0, &h1, &w0, &w1);
            for (int64_t c = 0; c < C; c++) acc[c] = -INFINITY;
            for (int64_t h = h0; h < h1; h++)
                for (int64_t w = w0; w < w1; w++) {
                    const float *xr = run_f32(jb->x_dt, jb->x, b * image + (h * q[2] + w) * C, C, row);
                    for (int64_t c = 0; c < C; c++) {
                        float a = acc[c], v = xr[c];
                        acc[c] = (a > v || a != a) ? a : v;
                    }
                }
            store_exact_f32(jb->out_dt, jb->out, ((b * q[4] + i) * q[5] + j) * C, acc, C);
        }
}

HOST_CLONES
static void pool_fwd_image(const pool_job *jb, int64_t b, double *scr) {
    const int64_t *q = jb->q;
    int64_t C = q[3], image = q[1] * q[2] * C;
    int is_max = jb->op == MPT_OP_MAX_POOL;
    if (is_max && is_f32_exact(jb->x_dt) && jb->out_dt == jb->x_dt) {
        max_pool_image_f32(jb, b, scr);
        return;
    }
    double *acc = scr, *row = scr + C;
    for (int64_t i = 0; i < q[4]; i++)
        for (int64_t j = 0; j < q[5]; j++) {
            int64_t h0, h1, w0, w1;
            window(q, i, j, &h0, &h1, &w0, &w1);
            for (int64_t c = 0; c < C; c++) acc[c] = is_max ? -INFINITY : 0.0;
            for (int64_t h = h0; h < h1; h++)
                for (int64_t w = w0; w < w1; w++) {
                    load_run(jb->x_dt, jb->x, b * image + (h * q[2] + w) * C, C, row);
                    if (is_max)
                        for (int64_t c = 0; c < C; c++) acc[c] = max_nan(acc[c], row[c]);
                    else
                        for (int64_t c = 0; c < C; c++) acc[c] += row[c];
                }
            int64_t count = (h1 - h0) * (w1 - w0);
            if (!is_max)
                for (int64_t c = 0; c < C; c++) acc[c] = count > 0 ? acc[c] / (double)count : 0.0;
            store_rounded(jb->out_dt, jb->out, ((b * q[4] + i) * q[5] + j) * C, acc, C);
        }
}

/* strictly greater replaces, so a NaN never does, as in the interpreter;
 * written with masks on the bits so that the compiler vectorizes it */
static void first_max_step(float *best_v, int32_t *restrict best_at, const float *row, int32_t at,
                           int64_t C) {
    int32_t *restrict bv = (int32_t *)best_v;      /* the floats' bits */
    const int32_t *restrict rb = (const int32_t *)row;
    for (int64_t c = 0; c < C; c++) {
        union { int32_t i; float f; } r = {.i = rb[c]}, v = {.i = bv[c]};
        int32_t m = -(int32_t)(r.f > v.f);
        bv[c] = (r.i & m) | (v.i & ~m);
        best_at[c] = ((at + (int32_t)c) & m) | (best_at[c] & ~m);
    }
}

/* max pooling's dx of one image for x in a dtype f32 holds: the first
 * maximum of each window tracked in floats with 32-bit positions, so the
 * search vectorizes. The dx sums (double, rounded once as the interpreter
 * does) live in a ring of win_h input rows: the windows of output row i
 * cover input rows from i*sh - ph on, so every row above that is complete,
 * is rounded and stored, and its slot is cleared for a row further down.
 * The ring stays in cache where a whole image of doubles (6.4 MB for
 * ResNet-50's first pooling) did not. */
HOST_CLONES
static void max_pool_grad_image_f32(const pool_job *jb, int64_t b, double *scr) {
    const int64_t *q = jb->q;
    int64_t C = q[3], W = q[2], image = q[1] * W * C, out = q[4] * q[5] * C, R = q[6];
    int64_t row_len = W * C;
    double *ring = scr, *dy = ring + R * row_len;
    float *best_v = (float *)(dy + C), *row = best_v + C;
    int32_t *best_at = (int32_t *)(row + C);
    memset(ring, 0, (size_t)(R * row_len) * sizeof *ring);
    int64_t done = 0; /* input rows [0, done) stored */
    for (int64_t i = 0; i < q[4]; i++) {
        int64_t top = i * q[8] - q[10];
        for (; done < top && done < q[1]; done++) {
            double *r = ring + (done % R) * row_len;
            store_rounded(jb->out_dt, jb->out, b * image + done * row_len, r, row_len);
            memset(r, 0, (size_t)row_len * sizeof *r);
        }
        for (int64_t j = 0; j < q[5]; j++) {
            int64_t h0, h1, w0, w1;
            window(q, i, j, &h0, &h1, &w0, &w1);
            if (h1 <= h0 || w1 <= w0) continue;
            load_run(jb->dy_dt, jb->dy, b * out + (i * q[5] + j) * C, C, dy);
            load_run_f32(jb->x_dt, jb->x, b * image + (h0 * W + w0) * C, C, best_v);
            int32_t at0 = (int32_t)(((h0 % R) * W + w0) * C);
            for (int64_t c = 0; c < C; c++) best_at[c] = at0 + (int32_t)c;
            for (int64_t h = h0; h < h1; h++)
                for (int64_t w = h == h0 ? w0 + 1 : w0; w < w1; w++) {
                    const float *xr = run_f32(jb->x_dt, jb->x, b * image + (h * W + w) * C, C, row);
                    first_max_step(best_v, best_at, xr, (int32_t)(((h % R) * W + w) * C), C);
                }
            for (int64_t c = 0; c < C; c++) ring[best_at[c]] += dy[c];
        }
    }
    for (; done < q[1]; done++) { /* rows past the last window come out as zeros */
        double *r = ring + (done % R) * row_len;
        store_rounded(jb->out_dt, jb->out, b * image + done * row_len, r, row_len);
        memset(r, 0, (size_t)row_len * sizeof *r);
    }
}

/* dx of one image: each window's dy to the first maximum (max) or spread
 * evenly (avg), summed in double and rounded at the end */
HOST_CLONES
static void pool_grad_image(const pool_job *jb, int64_t b, double *scr) {
    const int64_t *q = jb->q;
    int64_t C = q[3], image = q[1] * q[2] * C, out = q[4] * q[5] * C;
    double *dx = scr, *dy = dx + image, *best_v = dy + C, *row = best_v + 2 * C;
    int64_t *best_at = (int64_t *)(best_v + C);
    int is_max = jb->op == MPT_OP_MAX_POOL_GRAD;
    if (max_grad_rows(jb)) {
        max_pool_grad_image_f32(jb, b, scr);
        return;
    }
    memset(dx, 0, (size_t)image * sizeof *dx);
    for (int64_t i = 0; i < q[4]; i++)
        for (int64_t j = 0; j < q[5]; j++) {
            int64_t h0, h1, w0, w1;
            window(q, i, j, &h0, &h1, &w0, &w1);
            int64_t count = (h1 - h0) * (w1 - w0);
            if (count <= 0) continue;
            load_run(jb->dy_dt, jb->dy, b * out + (i * q[5] + j) * C, C, dy);
            if (!is_max) {
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++) {
                        double *d = dx + (h * q[2] + w) * C;
                        for (int64_t c = 0; c < C; c++) d[c] += dy[c] / (double)count;
                    }
                continue;
            }
            /* the first maximum: strictly greater replaces, so a NaN never
             * does, as in the interpreter */
            for (int64_t h = h0; h < h1; h++)
                for (int64_t w = w0; w < w1; w++) {
                    int64_t at = (h * q[2] + w) * C;
                    load_run(jb->x_dt, jb->x, b * image + at, C, row);
                    int first = h == h0 && w == w0;
                    for (int64_t c = 0; c < C; c++)
                        if (first || row[c] > best_v[c]) {
                            best_v[c] = row[c];
                            best_at[c] = at + c;
                        }
                }
            for (int64_t c = 0; c < C; c++) dx[best_at[c]] += dy[c];
        }
    store_rounded(jb->out_dt, jb->out, b * image, dx, image);
}

static void pool_task(void *ctx, int task, int thread) {
    const pool_job *jb = ctx;
    if (jb->op == MPT_OP_MAX_POOL || jb->op == MPT_OP_AVG_POOL)
        pool_fwd_image(jb, task, jb->scratch[thread]);
    else
        pool_grad_image(jb, task, jb->scratch[thread]);
}

/* per-thread scratch kept from run to run: a fresh multi-megabyte block
 * per run costs its page faults every time */
static struct {
    double **v;
    size_t per;
    int threads;
} pool_cache;

void mpt_cpu_opaque_release(void) {
    mpt_cpu_attention_release();
    for (int t = 0; t < pool_cache.threads; t++) free(pool_cache.v[t]);
    free(pool_cache.v);
    memset(&pool_cache, 0, sizeof pool_cache);
}

static double **pool_scratch_get(int threads, size_t per) {
    if (pool_cache.v && pool_cache.threads >= threads && pool_cache.per >= per) return pool_cache.v;
    mpt_cpu_opaque_release();
    pool_cache.v = calloc((size_t)threads, sizeof *pool_cache.v);
    if (!pool_cache.v) return NULL;
    pool_cache.threads = threads;
    pool_cache.per = per;
    for (int t = 0; t < threads; t++)
        if (!(pool_cache.v[t] = malloc((per + 1) * sizeof(double)))) {
            mpt_cpu_opaque_release();
            return NULL;
        }
    return pool_cache.v;
}

static int run_pool(mpt_pool *pool, pool_job *jb, char *err, size_t n, const char *name) {
    double **scr = pool_scratch_get(mpt_pool_threads(pool), pool_scratch(jb));
    if (!scr) {
        snprintf(err, n, "kernel %s: out of memory for pooling scratch", name);
        return -1;
    }
    jb->scratch = scr;
    mpt_pool_run(pool, (int)jb->q[0], pool_task, jb);
    return 0;
}

static void pool_geom(mpt_shape xs, mpt_shape ys, const mpt_attr *a, int64_t *q) {
    int64_t v[12] = {xs.dim[0], xs.dim[1], xs.dim[2], xs.dim[3], ys.dim[1], ys.dim[2],
                     a->i[0],   a->i[1],   a->i[2],   a->i[3],   a->i[4],   a->i[5]};
    memcpy(q, v, sizeof v);
}

static int slot_of(const mpt_cpu_kx *x, int node) {
    for (int s = 0; s < x->n_slots; s++)
        if (x->slot_node[s] == node) return s;
    return -1;
}

/* a node's buffer in x, or NULL (a constant) */
static void *kx_data(const void *ctx, int node) {
    const mpt_cpu_kx *x = ctx;
    int s = slot_of(x, node);
    return s < 0 ? NULL : x->slots[s];
}

int mpt_cpu_allreduce_slots(const mpt_graph *g, mpt_cpu_kx *x, void **in, void **out, char *err,
                            size_t n) {
    const mpt_node *nd = &g->nodes[x->k->root];
    int sa = slot_of(x, nd->in[0]), so = slot_of(x, x->k->root);
    if (sa < 0 || so < 0) {
        snprintf(err, n, "kernel %s: an operand has no buffer", x->k->name);
        return -1;
    }
    *in = x->slots[sa];
    *out = x->slots[so];
    return 0;
}

int mpt_cpu_allreduce_start(const mpt_graph *g, mpt_cpu_kx *x, void **req, char *err, size_t n) {
    const mpt_node *nd = &g->nodes[x->k->root];
    void *in, *out;
    *req = NULL;
    if (mpt_cpu_allreduce_slots(g, x, &in, &out, err, n)) return -1;
    if (out != in) memcpy(out, in, (size_t)mpt_shape_numel(nd->shape) * mpt_dtype_size(nd->dtype));
    return mpt_collective_start(out, mpt_shape_numel(nd->shape), nd->dtype, req, err, n);
}

int mpt_cpu_run_opaque(const mpt_graph *g, mpt_cpu_kx *x, mpt_pool *pool, char *err, size_t n) {
    int id = x->k->root;
    const mpt_node *nd = &g->nodes[id];
    if (nd->op == MPT_OP_ATTENTION || nd->op == MPT_OP_ATTENTION_LSE || nd->op == MPT_OP_ATTENTION_GRAD)
        return mpt_cpu_run_attention(g, x->k, kx_data, x, x->amx, pool, err, n);
    const mpt_node *na = &g->nodes[nd->in[0]];
    const mpt_node *nb = nd->n_in > 1 ? &g->nodes[nd->in[1]] : NULL;
    int sa = slot_of(x, nd->in[0]), sb = nb ? slot_of(x, nd->in[1]) : -1, so = slot_of(x, id);
    if (sa < 0 || (nb && sb < 0) || so < 0) {
        snprintf(err, n, "kernel %s: an operand has no buffer (a constant operand of %s)",
                 x->k->name, mpt_op_name(nd->op));
        return -1;
    }
    if (nd->op == MPT_OP_MAX_POOL || nd->op == MPT_OP_AVG_POOL || nd->op == MPT_OP_MAX_POOL_GRAD ||
        nd->op == MPT_OP_AVG_POOL_GRAD) {
        pool_job jb = {.op = nd->op, .out_dt = nd->dtype, .out = x->slots[so]};
        if (nd->op == MPT_OP_AVG_POOL_GRAD) { /* dy -> dx */
            pool_geom(nd->shape, na->shape, &nd->attr, jb.q);
            jb.dy_dt = na->dtype;
            jb.dy = x->slots[sa];
        } else {
            pool_geom(na->shape, nb ? nb->shape : nd->shape, &nd->attr, jb.q);
            jb.x_dt = na->dtype;
            jb.x = x->slots[sa];
            if (nb) { /* max_pool_grad: x, dy -> dx */
                jb.dy_dt = nb->dtype;
                jb.dy = x->slots[sb];
            }
        }
        return run_pool(pool, &jb, err, n, x->k->name);
    }
    if (nd->op == MPT_OP_REDUCE_SCATTER || nd->op == MPT_OP_ALL_GATHER ||
        nd->op == MPT_OP_RANK_SLICE) { /* the sharded optimizer's moves (ir/collective.c) */
        int64_t in_n = mpt_shape_numel(na->shape), out_n = mpt_shape_numel(nd->shape);
        if (nd->op == MPT_OP_RANK_SLICE) {
            mpt_collective_rank_slice(x->slots[sa], in_n, x->slots[so], out_n, nd->dtype);
            return 0;
        }
        if (nd->op == MPT_OP_REDUCE_SCATTER)
            return mpt_collective_reduce_scatter(x->slots[sa], in_n, x->slots[so], out_n,
                                                 nd->dtype, err, n);
        return mpt_collective_all_gather(x->slots[sa], in_n, x->slots[so], out_n, nd->dtype, err, n);
    }
    if (nd->op == MPT_OP_ALLREDUCE) { /* this rank's value, then the sum across ranks */
        void *req = NULL;
        if (mpt_cpu_allreduce_start(g, x, &req, err, n)) return -1;
        return mpt_collective_wait(req, err, n);
    }
    if (nd->op == MPT_OP_BATCH_MATMUL)
        return mpt_cpu_run_batch_matmul(nd, na, nb, x->slots[sa], x->slots[sb], x->slots[so],
                                        pool, err, n);
    if (nd->op == MPT_OP_ARGMAX) {
        mpt_cpu_run_argmax(nd, na, x->slots[sa], x->slots[so], pool);
        return 0;
    }
    if (nd->op == MPT_OP_SCATTER_ADD)
        return mpt_cpu_run_scatter_add(nd, na, nb, x->slots[sa], x->slots[sb], x->slots[so], pool,
                                       err, n);
    snprintf(err, n, "kernel %s: %s is not an opaque op the CPU backend runs alone (hint: "
             "it belongs in a LOOP/REDUCTION/GEMM kernel)", x->k->name, mpt_op_name(nd->op));
    return -1;
}

/* ---- convolution data movement ----
 * Both run over the pool: im2col splits the output rows (every row of cols
 * is written by one task), col2im splits the images (every element of dx
 * is summed by one task, in the same order as one thread would). */

typedef struct {
    const char *x;
    char *cols;
    const float *dcols;
    float *dx;
    size_t es;
    const int64_t *q;
    int64_t units;
    int n_tasks;
} conv_move;

static void im2col_rows(const conv_move *m, int64_t r0, int64_t r1) {
    const int64_t *q = m->q;
    int64_t C = q[MPT_G_C], OH = q[MPT_G_OH], OW = q[MPT_G_OW];
    size_t row_bytes = (size_t)(C * q[MPT_G_KW]) * m->es, cb = (size_t)C * m->es;
    for (int64_t r = r0; r < r1; r++) {
        int64_t b = r / (OH * OW), i = r / OW % OH, j = r % OW;
        char *cp = m->cols + (size_t)r * (size_t)q[MPT_G_KH] * row_bytes;
        int64_t iw0 = j * q[MPT_G_SW] - q[MPT_G_PW];
        /* the kernel row's columns in the image: one copy, zeros around it */
        int64_t v0 = iw0 < 0 ? -iw0 : 0, v1 = q[MPT_G_W] - iw0;
        if (v1 > q[MPT_G_KW]) v1 = q[MPT_G_KW];
        for (int64_t u = 0; u < q[MPT_G_KH]; u++, cp += row_bytes) {
            int64_t ih = i * q[MPT_G_SH] - q[MPT_G_PH] + u;
            if (ih < 0 || ih >= q[MPT_G_H] || v1 <= v0) {
                memset(cp, 0, row_bytes);
                continue;
            }
            if (v0 > 0) memset(cp, 0, (size_t)v0 * cb);
            memcpy(cp + (size_t)v0 * cb,
                   m->x + (size_t)(((b * q[MPT_G_H] + ih) * q[MPT_G_W] + iw0 + v0) * C) * m->es,
                   (size_t)(v1 - v0) * cb);
            if (v1 < q[MPT_G_KW]) memset(cp + (size_t)v1 * cb, 0, (size_t)(q[MPT_G_KW] - v1) * cb);
        }
    }
}

static void col2im_images(const conv_move *m, int64_t b0, int64_t b1) {
    const int64_t *q = m->q;
    int64_t C = q[MPT_G_C];
    for (int64_t b = b0; b < b1; b++) {
        const float *cp = m->dcols + b * q[MPT_G_OH] * q[MPT_G_OW] * q[MPT_G_KH] * q[MPT_G_KW] * C;
        for (int64_t i = 0; i < q[MPT_G_OH]; i++)
            for (int64_t j = 0; j < q[MPT_G_OW]; j++)
                for (int64_t u = 0; u < q[MPT_G_KH]; u++) {
                    int64_t ih = i * q[MPT_G_SH] - q[MPT_G_PH] + u;
                    for (int64_t v = 0; v < q[MPT_G_KW]; v++, cp += C) {
                        int64_t iw = j * q[MPT_G_SW] - q[MPT_G_PW] + v;
                        if (ih < 0 || ih >= q[MPT_G_H] || iw < 0 || iw >= q[MPT_G_W]) continue;
                        float *dp = m->dx + ((b * q[MPT_G_H] + ih) * q[MPT_G_W] + iw) * C;
                        for (int64_t c = 0; c < C; c++) dp[c] += cp[c];
                    }
                }
    }
}

static void conv_move_task(void *ctx, int task, int thread) {
    const conv_move *m = ctx;
    int64_t lo = m->units * task / m->n_tasks, hi = m->units * (task + 1) / m->n_tasks;
    if (m->cols) im2col_rows(m, lo, hi);
    else col2im_images(m, lo, hi);
}

static void conv_move_run(mpt_pool *pool, conv_move *m) {
    int threads = mpt_pool_threads(pool);
    m->n_tasks = (int)(m->units < 4 * threads ? m->units : 4 * threads);
    if (m->n_tasks <= 1) conv_move_task(m, 0, 0);
    else mpt_pool_run(pool, m->n_tasks, conv_move_task, m);
}

void mpt_cpu_im2col(mpt_pool *pool, const void *x, void *cols, size_t es, const int64_t *q) {
    conv_move m = {.x = x, .cols = cols, .es = es, .q = q,
                   .units = q[MPT_G_N] * q[MPT_G_OH] * q[MPT_G_OW], .n_tasks = 1};
    conv_move_run(pool, &m);
}

void mpt_cpu_col2im(mpt_pool *pool, const float *dcols, float *dx, const int64_t *q) {
    conv_move m = {.dcols = dcols, .dx = dx, .q = q, .units = q[MPT_G_N], .n_tasks = 1};
    conv_move_run(pool, &m);
}

/* 8 x 8 (2-byte elements) or 4 x 4 (4-byte) blocks, transposed in SSE2
 * registers (every x86-64 has them): both sides then move 16 bytes at a
 * time. A strip of 8 (4) columns is done over all rows before the next,
 * so dst is written as 8 (4) sequential streams: element by element, with
 * the row stride of dst a multiple of 4 KiB, every line of a block fell in
 * one L1 set and was evicted between its partial writes (2048 x 512 bf16:
 * 4.3 ms, 4.1 ns an element). Edges go element by element. */
void mpt_cpu_pairs32_u16(const uint16_t *a, const uint16_t *b, uint16_t *o) {
    for (int i = 0; i < 4; i++) {
        __m128i x = _mm_loadu_si128((const __m128i *)a + i), y = _mm_loadu_si128((const __m128i *)b + i);
        _mm_storeu_si128((__m128i *)o + 2 * i, _mm_unpacklo_epi16(x, y));
        _mm_storeu_si128((__m128i *)o + 2 * i + 1, _mm_unpackhi_epi16(x, y));
    }
}

void mpt_cpu_tr8x8_u16(const uint16_t *src, int64_t ss, uint16_t *dst, int64_t ds) {
    __m128i x[8], y[8], z[8];
    for (int i = 0; i < 8; i++) x[i] = _mm_loadu_si128((const __m128i *)(src + i * ss));
    for (int i = 0; i < 4; i++) {
        y[2 * i] = _mm_unpacklo_epi16(x[2 * i], x[2 * i + 1]);
        y[2 * i + 1] = _mm_unpackhi_epi16(x[2 * i], x[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++)
        for (int h = 0; h < 2; h++) {
            z[4 * i + 2 * h] = _mm_unpacklo_epi32(y[4 * i + h], y[4 * i + h + 2]);
            z[4 * i + 2 * h + 1] = _mm_unpackhi_epi32(y[4 * i + h], y[4 * i + h + 2]);
        }
    /* z[0..3]: columns (0,1) (2,3) (4,5) (6,7) of rows 0-3; z[4..7] of rows 4-7 */
    for (int j = 0; j < 4; j++) {
        _mm_storeu_si128((__m128i *)(dst + (2 * j) * ds), _mm_unpacklo_epi64(z[j], z[4 + j]));
        _mm_storeu_si128((__m128i *)(dst + (2 * j + 1) * ds), _mm_unpackhi_epi64(z[j], z[4 + j]));
    }
}

/* Source rows [r_lo, r_hi) of a transpose, TR_ROWS at a time: every
 * column strip of a block reads the same TR_ROWS lines, which stay in L1
 * from one strip to the next (a whole-height strip at a time read each
 * line four times from L2: 2048 x 512 f32 went at 4.4 GB/s). */
enum { TR_ROWS = 32 };

static void transpose_u16(const uint16_t *src, uint16_t *dst, int64_t rows, int64_t cols,
                          int64_t r_lo, int64_t r_hi) {
    int64_t R = rows / 8 * 8, C = cols / 8 * 8;
    for (int64_t rb = r_lo; rb < r_hi && rb < R; rb += TR_ROWS) {
        int64_t re = rb + TR_ROWS < r_hi ? rb + TR_ROWS : r_hi;
        re = re < R ? re : R;
        for (int64_t c0 = 0; c0 < C; c0 += 8)
            for (int64_t r0 = rb; r0 < re; r0 += 8)
                mpt_cpu_tr8x8_u16(src + r0 * cols + c0, cols, dst + c0 * rows + r0, rows);
    }
    for (int64_t r = r_lo; r < r_hi; r++)
        for (int64_t c = r < R ? C : 0; c < cols; c++)
            dst[c * rows + r] = src[r * cols + c];
}

static void transpose_u32(const uint32_t *src, uint32_t *dst, int64_t rows, int64_t cols,
                          int64_t r_lo, int64_t r_hi) {
    int64_t R = rows / 4 * 4, C = cols / 4 * 4;
    for (int64_t rb = r_lo; rb < r_hi && rb < R; rb += TR_ROWS) {
        int64_t re = rb + TR_ROWS < r_hi ? rb + TR_ROWS : r_hi;
        re = re < R ? re : R;
        for (int64_t c0 = 0; c0 < C; c0 += 4)
            for (int64_t r0 = rb; r0 < re; r0 += 4) {
                __m128 x[4];
                for (int i = 0; i < 4; i++)
                    x[i] = _mm_loadu_ps((const float *)(src + (r0 + i) * cols + c0));
                _MM_TRANSPOSE4_PS(x[0], x[1], x[2], x[3]);
                for (int j = 0; j < 4; j++)
                    _mm_storeu_ps((float *)(dst + (c0 + j) * rows + r0), x[j]);
            }
    }
    for (int64_t r = r_lo; r < r_hi; r++)
        for (int64_t c = r < R ? C : 0; c < cols; c++)
            dst[c * rows + r] = src[r * cols + c];
}

typedef struct {
    const void *src;
    void *dst;
    int64_t rows, cols;
    size_t esize;
    int n_tasks;
} transpose_job;

/* a task's rows: whole blocks of TR_ROWS, so that no two tasks write the
 * same 64-byte line of dst */
static void transpose_task(void *ctx, int task, int thread) {
    (void)thread;
    const transpose_job *t = ctx;
    int64_t lo, hi;
    mpt_cpu_task_rows(t->rows, TR_ROWS, task, t->n_tasks, &lo, &hi);
    if (t->esize == 4)
        transpose_u32(t->src, t->dst, t->rows, t->cols, lo, hi);
    else
        transpose_u16(t->src, t->dst, t->rows, t->cols, lo, hi);
}

void mpt_cpu_transpose(mpt_pool *pool, const void *src, void *dst, int64_t rows, int64_t cols,
                       size_t esize) {
    transpose_job t = {src, dst, rows, cols, esize, 1};
    /* below 1 MiB a second thread saved nothing, or lost (256 x 1024 bf16:
     * 0.65 ms alone, 0.95 split) */
    if (!pool || rows * cols * (int64_t)esize < (1 << 20))
        transpose_task(&t, 0, 0);
    else
        mpt_cpu_pool_rows(pool, (rows + TR_ROWS - 1) / TR_ROWS, &t.n_tasks, transpose_task, &t);
}

void mpt_cpu_store_f32(mpt_dtype dt, const float *src, void *dst, int64_t n) {
    switch (dt) {
    case MPT_DT_F32: memmove(dst, src, (size_t)n * 4); return;
    case MPT_DT_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = mpt_f32_to_f16(src[i]);
        return;
    case MPT_DT_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = mpt_f32_to_bf16(src[i]);
        return;
    case MPT_DT_I32: case MPT_DT_BOOL: case MPT_DT_F64: case MPT_DT_COUNT: break;
    }
}
