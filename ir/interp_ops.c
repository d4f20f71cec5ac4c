/* ir/interp_ops.c — what every op computes: the reference definition that
 * ir/interp.c drives and every backend is tested against.
 *
 * Each kernel writes its exact (double) result; the driver then rounds it
 * once to the node's dtype. So matmul, conv and reductions accumulate in
 * double and round once, and a f16 add is the exact sum rounded to f16. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/interp_impl.h"

/* row-major strides of s */
static void strides_of(mpt_shape s, int64_t *st) {
    int64_t acc = 1;
    for (int d = s.rank - 1; d >= 0; d--) {
        st[d] = acc;
        acc *= s.dim[d];
    }
}

/* offs[i] = sum_d idx_d(i) * st[d] for every element i of s (row-major):
 * the source offset of each output element for broadcast and transpose, the
 * destination offset of each input element for reductions. */
static int64_t *strided_offsets(mpt_shape s, const int64_t *st) {
    int64_t n = mpt_shape_numel(s);
    int64_t *offs = malloc((n ? (size_t)n : 1) * sizeof *offs);
    if (!offs || n == 0) return offs;
    int64_t idx[MPT_MAX_DIMS] = {0}, off = 0;
    for (int64_t i = 0; i < n; i++) {
        offs[i] = off;
        for (int d = s.rank - 1; d >= 0; d--) { /* odometer */
            off += st[d];
            if (++idx[d] < s.dim[d]) break;
            off -= st[d] * s.dim[d];
            idx[d] = 0;
        }
    }
    return offs;
}

/* ---- elementwise ----------------------------------------------------------- */

static double max_nan(double a, double b) { return (a > b || isnan(a)) ? a : b; }
static double min_nan(double a, double b) { return (a < b || isnan(a)) ? a : b; }

/* Phi(x), the standard normal CDF, exactly as Keras' gelu(approximate=False) */
static double normal_cdf(double x) { return 0.5 * (1.0 + erf(x * M_SQRT1_2)); }

/* out[i] = expr of x = a[i] (and y = b[i]) for every element */
#define MAP1(expr)                                                             \
    do {                                                                       \
        for (int64_t i = 0; i < n; i++) {                                      \
            double x = a[i];                                                   \
            out[i] = (expr);                                                   \
        }                                                                      \
        return 0;                                                              \
    } while (0)
#define MAP2(expr)                                                             \
    do {                                                                       \
        for (int64_t i = 0; i < n; i++) {                                      \
            double x = a[i], y = b[i];                                         \
            out[i] = (expr);                                                   \
        }                                                                      \
        return 0;                                                              \
    } while (0)

/* ---- reductions, argmax ------------------------------------------------------ */

/* out has the input's shape with the dims in `axes` removed */
static int reduce(mpt_op op, mpt_shape in_s, int64_t axes, const double *x, double *out,
                  int64_t out_n) {
    /* destination stride of every input dim: 0 for the reduced ones */
    mpt_shape out_s = {0};
    for (int d = 0; d < in_s.rank; d++)
        if (!(axes >> d & 1)) out_s.dim[out_s.rank++] = in_s.dim[d];
    int64_t ost[MPT_MAX_DIMS], st[MPT_MAX_DIMS];
    strides_of(out_s, ost);
    for (int d = 0, k = 0; d < in_s.rank; d++) st[d] = (axes >> d & 1) ? 0 : ost[k++];
    int64_t *offs = strided_offsets(in_s, st);
    if (!offs) return -1;
    int64_t n = mpt_shape_numel(in_s);
    double init = op == MPT_OP_REDUCE_SUM ? 0.0 : op == MPT_OP_REDUCE_MAX ? -INFINITY : 1.0;
    for (int64_t i = 0; i < out_n; i++) out[i] = init;
    if (op == MPT_OP_REDUCE_SUM)
        for (int64_t i = 0; i < n; i++) out[offs[i]] += x[i];
    else if (op == MPT_OP_REDUCE_MAX)
        for (int64_t i = 0; i < n; i++) out[offs[i]] = max_nan(out[offs[i]], x[i]);
    else
        for (int64_t i = 0; i < n; i++) out[offs[i]] = out[offs[i]] != 0 && x[i] != 0;
    free(offs);
    return 0;
}

/* first maximum along axis wins; NaN never beats an earlier value */
static void argmax(mpt_shape s, int axis, const double *x, double *out) {
    int64_t len = s.dim[axis], inner = 1, outer = 1;
    for (int d = axis + 1; d < s.rank; d++) inner *= s.dim[d];
    for (int d = 0; d < axis; d++) outer *= s.dim[d];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const double *p = x + o * len * inner + i;
            int64_t best = 0;
            for (int64_t k = 1; k < len; k++)
                if (p[k * inner] > p[best * inner]) best = k;
            out[o * inner + i] = (double)best;
        }
}

/* ---- GEMM ------------------------------------------------------------------ */

/* dst [c,r] = src [r,c] transposed */
static double *transposed(const double *src, int64_t r, int64_t c) {
    double *t = malloc((r * c > 0 ? (size_t)(r * c) : 1) * sizeof *t);
    if (!t) return NULL;
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < c; j++) t[j * r + i] = src[i * c + j];
    return t;
}

/* c[j] += a * b[j], j < n: the inner loop of every GEMM-like kernel, unrolled
 * so gcc's SLP vectoriser handles it at -O2 */
static void axpy(int64_t n, double a, const double *restrict b, double *restrict c) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        c[j] += a * b[j];
        c[j + 1] += a * b[j + 1];
        c[j + 2] += a * b[j + 2];
        c[j + 3] += a * b[j + 3];
    }
    for (; j < n; j++) c[j] += a * b[j];
}

/* c0..c3[j] += a0..a3 * b[j], j < n: four rows of C per pass over a row of
 * B, so each b[j] load feeds four multiply-adds */
static void axpy4(int64_t n, const double *a, const double *restrict b, double *restrict c0,
                  double *restrict c1, double *restrict c2, double *restrict c3) {
    double a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
    int64_t j = 0;
    for (; j + 2 <= n; j += 2) {
        double b0 = b[j], b1 = b[j + 1];
        c0[j] += a0 * b0;
        c0[j + 1] += a0 * b1;
        c1[j] += a1 * b0;
        c1[j + 1] += a1 * b1;
        c2[j] += a2 * b0;
        c2[j + 1] += a2 * b1;
        c3[j] += a3 * b0;
        c3[j + 1] += a3 * b1;
    }
    for (; j < n; j++) {
        c0[j] += a0 * b[j];
        c1[j] += a1 * b[j];
        c2[j] += a2 * b[j];
        c3[j] += a3 * b[j];
    }
}

/* c [m,n] = a [m,k] . b [k,n], all row-major and contiguous. Each output
 * element is one double sum over p in increasing order; the blocking only
 * changes when it is computed. Blocks of k keep the panel of b that four
 * rows of c sweep inside the L2 cache. */
static void gemm_nn(int64_t m, int64_t n, int64_t k, const double *a, const double *b,
                    double *c) {
    enum { KB = 128 };
    memset(c, 0, (size_t)(m * n) * sizeof *c);
    for (int64_t p0 = 0; p0 < k; p0 += KB) {
        int64_t p1 = p0 + KB < k ? p0 + KB : k;
        int64_t i = 0;
        for (; i + 4 <= m; i += 4)
            for (int64_t p = p0; p < p1; p++) {
                double a4[4] = {a[i * k + p], a[(i + 1) * k + p], a[(i + 2) * k + p],
                                a[(i + 3) * k + p]};
                axpy4(n, a4, b + p * n, c + i * n, c + (i + 1) * n, c + (i + 2) * n,
                      c + (i + 3) * n);
            }
        for (; i < m; i++)
            for (int64_t p = p0; p < p1; p++) axpy(n, a[i * k + p], b + p * n, c + i * n);
    }
}

/* c [m,n] = op(a) op(b), op transposing where the flag says: a is [m,k]
 * or [k,m], b [k,n] or [n,k] */
static int matmul_2d(int64_t m, int64_t n, int64_t k, int trans_a, int trans_b, const double *a,
                     const double *b, double *c) {
    double *ta = NULL, *tb = NULL;
    if (trans_a && !(ta = transposed(a, k, m))) return -1;
    if (trans_b && !(tb = transposed(b, n, k))) {
        free(ta);
        return -1;
    }
    gemm_nn(m, n, k, ta ? ta : a, tb ? tb : b, c);
    free(ta);
    free(tb);
    return 0;
}

/* matmul is batch_matmul with one batch of rank-2 operands: out is
 * [..., m, n], each batch one matmul_2d of the batch's operand blocks */
static int matmul(const mpt_graph *g, const mpt_node *nd, double *const *vals, double *out) {
    const mpt_node *na = &g->nodes[nd->in[0]];
    int r = nd->shape.rank;
    int64_t m = nd->shape.dim[r - 2], n = nd->shape.dim[r - 1];
    int64_t k = nd->attr.i[0] ? na->shape.dim[r - 2] : na->shape.dim[r - 1];
    int64_t batches = 1;
    for (int d = 0; d < r - 2; d++) batches *= nd->shape.dim[d];
    for (int64_t q = 0; q < batches; q++)
        if (matmul_2d(m, n, k, (int)nd->attr.i[0], (int)nd->attr.i[1], vals[nd->in[0]] + q * m * k,
                      vals[nd->in[1]] + q * k * n, out + q * m * n))
            return -1;
    return 0;
}

/* ---- convolution (NHWC x HWIO) ----------------------------------------------
 * Output pixel (oh, ow) reads input rows oh*sh - ph + kh and columns
 * ow*sw - pw + kw; positions outside the image are zeros. */

typedef struct {
    int64_t n, h, w, c;    /* x */
    int64_t kh, kw, o;     /* filter */
    int64_t oh, ow;        /* y */
    int64_t sh, sw, ph, pw;
} conv_geom;

static conv_geom conv_geometry(mpt_shape x, mpt_shape w, mpt_shape y, const mpt_attr *a) {
    return (conv_geom){x.dim[0], x.dim[1], x.dim[2], x.dim[3], w.dim[0], w.dim[1], w.dim[3],
                       y.dim[1], y.dim[2], a->i[0],  a->i[1],  a->i[2],  a->i[3]};
}

/* y [N,OH,OW,O] = conv(x [N,H,W,C], w [KH,KW,C,O]) */
static void conv2d(const conv_geom *q, const double *x, const double *w, double *y) {
    memset(y, 0, (size_t)(q->n * q->oh * q->ow * q->o) * sizeof *y);
    for (int64_t b = 0; b < q->n; b++)
        for (int64_t i = 0; i < q->oh; i++)
            for (int64_t j = 0; j < q->ow; j++) {
                double *yp = y + ((b * q->oh + i) * q->ow + j) * q->o;
                for (int64_t u = 0; u < q->kh; u++) {
                    int64_t ih = i * q->sh - q->ph + u;
                    if (ih < 0 || ih >= q->h) continue;
                    for (int64_t v = 0; v < q->kw; v++) {
                        int64_t iw = j * q->sw - q->pw + v;
                        if (iw < 0 || iw >= q->w) continue;
                        const double *xp = x + ((b * q->h + ih) * q->w + iw) * q->c;
                        const double *wp = w + (u * q->kw + v) * q->c * q->o;
                        for (int64_t c = 0; c < q->c; c++) axpy(q->o, xp[c], wp + c * q->o, yp);
                    }
                }
            }
}

/* dx [N,H,W,C] from dy [N,OH,OW,O] and w: the transpose of conv2d in x */
static void conv2d_bwd_data(const conv_geom *q, const double *dy, const double *w, double *dx) {
    memset(dx, 0, (size_t)(q->n * q->h * q->w * q->c) * sizeof *dx);
    for (int64_t b = 0; b < q->n; b++)
        for (int64_t i = 0; i < q->oh; i++)
            for (int64_t j = 0; j < q->ow; j++) {
                const double *dyp = dy + ((b * q->oh + i) * q->ow + j) * q->o;
                for (int64_t u = 0; u < q->kh; u++) {
                    int64_t ih = i * q->sh - q->ph + u;
                    if (ih < 0 || ih >= q->h) continue;
                    for (int64_t v = 0; v < q->kw; v++) {
                        int64_t iw = j * q->sw - q->pw + v;
                        if (iw < 0 || iw >= q->w) continue;
                        double *dxp = dx + ((b * q->h + ih) * q->w + iw) * q->c;
                        const double *wp = w + (u * q->kw + v) * q->c * q->o;
                        for (int64_t c = 0; c < q->c; c++) {
                            double s = 0;
                            for (int64_t o = 0; o < q->o; o++) s += dyp[o] * wp[c * q->o + o];
                            dxp[c] += s;
                        }
                    }
                }
            }
}

/* dw [KH,KW,C,O] from x and dy: the transpose of conv2d in w */
static void conv2d_bwd_filter(const conv_geom *q, const double *x, const double *dy, double *dw) {
    memset(dw, 0, (size_t)(q->kh * q->kw * q->c * q->o) * sizeof *dw);
    for (int64_t b = 0; b < q->n; b++)
        for (int64_t i = 0; i < q->oh; i++)
            for (int64_t j = 0; j < q->ow; j++) {
                const double *dyp = dy + ((b * q->oh + i) * q->ow + j) * q->o;
                for (int64_t u = 0; u < q->kh; u++) {
                    int64_t ih = i * q->sh - q->ph + u;
                    if (ih < 0 || ih >= q->h) continue;
                    for (int64_t v = 0; v < q->kw; v++) {
                        int64_t iw = j * q->sw - q->pw + v;
                        if (iw < 0 || iw >= q->w) continue;
                        const double *xp = x + ((b * q->h + ih) * q->w + iw) * q->c;
                        double *dwp = dw + (u * q->kw + v) * q->c * q->o;
                        for (int64_t c = 0; c < q->c; c++) axpy(q->o, xp[c], dyp, dwp + c * q->o);
                    }
                }
            }
}

/* ---- pooling (NHWC) ----------------------------------------------------------
 * Window (oh, ow) covers rows oh*sh - ph .. + win_h - 1 and the same for
 * columns; only positions inside the image take part (padding is never a
 * candidate maximum and never counted in an average). */

typedef struct {
    int64_t n, h, w, c, oh, ow;
    int64_t wh, ww, sh, sw, ph, pw;
} pool_geom;

static pool_geom pool_geometry(mpt_shape x, mpt_shape y, const mpt_attr *a) {
    return (pool_geom){x.dim[0], x.dim[1], x.dim[2], x.dim[3], y.dim[1], y.dim[2],
                       a->i[0],  a->i[1],  a->i[2],  a->i[3],  a->i[4],  a->i[5]};
}

/* the in-image part of window (i, j): rows [*h0, *h1), columns [*w0, *w1) */
static void pool_window(const pool_geom *q, int64_t i, int64_t j, int64_t *h0, int64_t *h1,
                        int64_t *w0, int64_t *w1) {
    int64_t hs = i * q->sh - q->ph, ws = j * q->sw - q->pw;
    *h0 = hs < 0 ? 0 : hs;
    *h1 = hs + q->wh > q->h ? q->h : hs + q->wh;
    *w0 = ws < 0 ? 0 : ws;
    *w1 = ws + q->ww > q->w ? q->w : ws + q->ww;
}

/* op MAX_POOL or AVG_POOL: y [N,OH,OW,C] from x [N,H,W,C]. A window with no
 * pixel in the image (impossible with Keras padding) gives -inf / 0. */
static void pool(mpt_op op, const pool_geom *q, const double *x, double *y) {
    for (int64_t b = 0; b < q->n; b++)
        for (int64_t i = 0; i < q->oh; i++)
            for (int64_t j = 0; j < q->ow; j++) {
                int64_t h0, h1, w0, w1;
                pool_window(q, i, j, &h0, &h1, &w0, &w1);
                double *yp = y + ((b * q->oh + i) * q->ow + j) * q->c;
                for (int64_t c = 0; c < q->c; c++) {
                    double acc = op == MPT_OP_MAX_POOL ? -INFINITY : 0.0;
                    for (int64_t h = h0; h < h1; h++)
                        for (int64_t w = w0; w < w1; w++) {
                            double v = x[((b * q->h + h) * q->w + w) * q->c + c];
                            acc = op == MPT_OP_MAX_POOL ? max_nan(acc, v) : acc + v;
                        }
                    int64_t count = (h1 - h0) * (w1 - w0);
                    yp[c] = op == MPT_OP_MAX_POOL ? acc : count > 0 ? acc / (double)count : 0.0;
                }
            }
}

/* dx [N,H,W,C]: each window's dy goes to the first maximum of its window in
 * row-major order (x may be NULL for avg, which spreads it evenly). */
static void pool_grad(mpt_op op, const pool_geom *q, const double *x, const double *dy,
                      double *dx) {
    memset(dx, 0, (size_t)(q->n * q->h * q->w * q->c) * sizeof *dx);
    for (int64_t b = 0; b < q->n; b++)
        for (int64_t i = 0; i < q->oh; i++)
            for (int64_t j = 0; j < q->ow; j++) {
                int64_t h0, h1, w0, w1;
                pool_window(q, i, j, &h0, &h1, &w0, &w1);
                int64_t count = (h1 - h0) * (w1 - w0);
                if (count <= 0) continue;
                const double *dyp = dy + ((b * q->oh + i) * q->ow + j) * q->c;
                for (int64_t c = 0; c < q->c; c++) {
                    if (op == MPT_OP_AVG_POOL_GRAD) {
                        for (int64_t h = h0; h < h1; h++)
                            for (int64_t w = w0; w < w1; w++)
                                dx[((b * q->h + h) * q->w + w) * q->c + c] +=
                                    dyp[c] / (double)count;
                        continue;
                    }
                    int64_t best = ((b * q->h + h0) * q->w + w0) * q->c + c;
                    for (int64_t h = h0; h < h1; h++)
                        for (int64_t w = w0; w < w1; w++) {
                            int64_t at = ((b * q->h + h) * q->w + w) * q->c + c;
                            if (x[at] > x[best]) best = at;
                        }
                    dx[best] += dyp[c];
                }
            }
}

/* ---- the dispatcher ------------------------------------------------------------ */

int mpt_interp_eval(const mpt_graph *g, int id, double *const *vals, double *out) {
    const mpt_node *nd = &g->nodes[id];
    const mpt_node *na = nd->n_in > 0 ? &g->nodes[nd->in[0]] : NULL;
    const mpt_node *nb = nd->n_in > 1 ? &g->nodes[nd->in[1]] : NULL;
    const double *a = nd->n_in > 0 ? vals[nd->in[0]] : NULL;
    const double *b = nd->n_in > 1 ? vals[nd->in[1]] : NULL;
    const double *c = nd->n_in > 2 ? vals[nd->in[2]] : NULL;
    int64_t n = mpt_shape_numel(nd->shape);
    int64_t st[MPT_MAX_DIMS];

    switch (nd->op) {
    case MPT_OP_INPUT:
    case MPT_OP_VARIABLE:
        return -1; /* fed by the driver, never evaluated */
    case MPT_OP_CONST:
        for (int64_t i = 0; i < n; i++) out[i] = nd->attr.f;
        return 0;
    case MPT_OP_ATTENTION:
    case MPT_OP_ATTENTION_LSE:
    case MPT_OP_ATTENTION_GRAD:
        return mpt_interp_attention(g, nd, vals, out);
    case MPT_OP_REDUCE_SCATTER: case MPT_OP_ALL_GATHER: case MPT_OP_RANK_SLICE:
        return -1; /* ir/interp.c runs them on the ranks */
    case MPT_OP_ALLREDUCE: /* this rank's value; ir/interp.c sums it across the ranks */
        memcpy(out, a, (size_t)n * sizeof *out);
        return 0;
    case MPT_OP_IOTA: {
        int ax = (int)nd->attr.i[0];
        strides_of(nd->shape, st);
        for (int64_t i = 0; i < n; i++) out[i] = (double)(i / st[ax] % nd->shape.dim[ax]);
        return 0;
    }
    case MPT_OP_RANDOM_UNIFORM: {
        /* 24 random bits for f32/f64; f16 and bf16 keep only as many as
         * their significand holds, so the value stays exactly below 1 */
        int keep = nd->dtype == MPT_DT_F16 ? 11 : nd->dtype == MPT_DT_BF16 ? 8 : 24;
        int32_t counter = (int32_t)a[0];
        int64_t at = (int64_t)mpt_collective_get()->rank * nd->attr.i[1];
        for (int64_t i = 0; i < n; i++)
            out[i] = ldexp((double)(mpt_random_bits(nd->attr.i[0], counter, at + i) >> (64 - keep)),
                           -keep);
        return 0;
    }

    case MPT_OP_NEG: MAP1(-x);
    case MPT_OP_ABS: MAP1(fabs(x));
    case MPT_OP_EXP: MAP1(exp(x));
    case MPT_OP_LOG: MAP1(log(x));
    case MPT_OP_SQRT: MAP1(sqrt(x));
    case MPT_OP_RSQRT: MAP1(1.0 / sqrt(x));
    case MPT_OP_RECIP: MAP1(1.0 / x);
    case MPT_OP_SQUARE: MAP1(x * x);
    case MPT_OP_RELU: MAP1(max_nan(x, 0.0)); /* NaN stays NaN, as XLA's max(x, 0) */
    case MPT_OP_SIGMOID: MAP1(1.0 / (1.0 + exp(-x)));
    case MPT_OP_TANH: MAP1(tanh(x));
    case MPT_OP_SIN: MAP1(sin(x));
    case MPT_OP_COS: MAP1(cos(x));
    case MPT_OP_GELU: MAP1(x * normal_cdf(x));
    case MPT_OP_GELU_GRAD: /* Phi(x) + x * phi(x) */
        MAP1(normal_cdf(x) + x * exp(-0.5 * x * x) * (0.5 * M_2_SQRTPI * M_SQRT1_2));
    case MPT_OP_CAST: MAP1(x); /* the driver's rounding to the node's dtype is the cast */
    case MPT_OP_IS_FINITE: MAP1(isfinite(x) ? 1.0 : 0.0);
    case MPT_OP_NOT: MAP1(x == 0);

    case MPT_OP_ADD: MAP2(x + y);
    case MPT_OP_SUB: MAP2(x - y);
    case MPT_OP_MUL: MAP2(x * y);
    case MPT_OP_DIV: MAP2(x / y);
    case MPT_OP_MAX: MAP2(max_nan(x, y));
    case MPT_OP_MIN: MAP2(min_nan(x, y));
    case MPT_OP_POW: MAP2(pow(x, y));
    case MPT_OP_LT: MAP2(x < y);
    case MPT_OP_GT: MAP2(x > y);
    case MPT_OP_EQ: MAP2(x == y);
    case MPT_OP_AND: MAP2(x != 0 && y != 0);
    case MPT_OP_SELECT:
        for (int64_t i = 0; i < n; i++) out[i] = a[i] != 0 ? b[i] : c[i];
        return 0;

    case MPT_OP_REDUCE_SUM:
    case MPT_OP_REDUCE_MAX:
    case MPT_OP_REDUCE_ALL:
        return reduce(nd->op, na->shape, nd->attr.i[0], a, out, n);
    case MPT_OP_ARGMAX:
        argmax(na->shape, (int)nd->attr.i[0], a, out);
        return 0;

    case MPT_OP_BROADCAST:
    case MPT_OP_TRANSPOSE: {
        /* both read the input at strides chosen per output dim */
        int64_t ist[MPT_MAX_DIMS], src[MPT_MAX_DIMS] = {0};
        strides_of(na->shape, ist);
        if (nd->op == MPT_OP_TRANSPOSE) {
            for (int d = 0; d < nd->shape.rank; d++) src[d] = ist[(nd->attr.i[0] >> (4 * d)) & 0xf];
        } else {
            /* input dim k maps to the k-th set bit; a size-1 dim repeats */
            for (int d = 0, k = 0; d < nd->shape.rank; d++)
                if (nd->attr.i[0] >> d & 1) {
                    src[d] = na->shape.dim[k] == 1 ? 0 : ist[k];
                    k++;
                }
        }
        int64_t *offs = strided_offsets(nd->shape, src);
        if (!offs) return -1;
        for (int64_t i = 0; i < n; i++) out[i] = a[offs[i]];
        free(offs);
        return 0;
    }
    case MPT_OP_RESHAPE:
        memcpy(out, a, (size_t)n * sizeof *out);
        return 0;
    case MPT_OP_ONE_HOT: {
        /* an id outside [0, depth) gives a row of zeros, as tf.one_hot */
        int64_t depth = nd->attr.i[0], rows = mpt_shape_numel(na->shape);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t d = 0; d < depth; d++) out[r * depth + d] = a[r] == (double)d;
        return 0;
    }
    case MPT_OP_GATHER: {
        /* an id outside the table gives a row of zeros rather than a fault */
        int64_t v = na->shape.dim[0], d = na->shape.dim[1], rows = mpt_shape_numel(nb->shape);
        for (int64_t r = 0; r < rows; r++) {
            double id_ = b[r];
            int in_range = id_ >= 0 && id_ < (double)v;
            for (int64_t k = 0; k < d; k++) out[r * d + k] = in_range ? a[(int64_t)id_ * d + k] : 0.0;
        }
        return 0;
    }
    case MPT_OP_SCATTER_ADD: {
        /* updates whose id is outside [0, rows) are dropped, matching gather */
        int64_t rows = nd->shape.dim[0], d = nd->shape.dim[1], m = mpt_shape_numel(na->shape);
        memset(out, 0, (size_t)n * sizeof *out);
        for (int64_t r = 0; r < m; r++)
            if (a[r] >= 0 && a[r] < (double)rows) axpy(d, 1.0, b + r * d, out + (int64_t)a[r] * d);
        return 0;
    }
    case MPT_OP_SLICE: {
        /* rows of len * inner elements taken at start * inner of each input row */
        int ax = (int)nd->attr.i[0];
        int64_t inner = 1, len = nd->shape.dim[ax], in_len = na->shape.dim[ax];
        for (int d = ax + 1; d < nd->shape.rank; d++) inner *= nd->shape.dim[d];
        int64_t rows = inner ? n / (len * inner) : 0; /* none when a dim is 0 */
        for (int64_t r = 0; r < rows; r++)
            memcpy(out + r * len * inner, a + (r * in_len + nd->attr.i[1]) * inner,
                   (size_t)(len * inner) * sizeof *out);
        return 0;
    }
    case MPT_OP_CONCAT: {
        /* each output row is a row of in0 followed by a row of in1 */
        int ax = (int)nd->attr.i[0];
        int64_t inner = 1, ra = na->shape.dim[ax], rb = nb->shape.dim[ax];
        for (int d = ax + 1; d < nd->shape.rank; d++) inner *= nd->shape.dim[d];
        int64_t rows = inner ? n / ((ra + rb) * inner) : 0; /* none when a dim is 0 */
        for (int64_t r = 0; r < rows; r++) {
            double *o = out + r * (ra + rb) * inner;
            memcpy(o, a + r * ra * inner, (size_t)(ra * inner) * sizeof *out);
            memcpy(o + ra * inner, b + r * rb * inner, (size_t)(rb * inner) * sizeof *out);
        }
        return 0;
    }

    case MPT_OP_MATMUL:
    case MPT_OP_BATCH_MATMUL:
        return matmul(g, nd, vals, out);
    case MPT_OP_CONV2D: {
        conv_geom q = conv_geometry(na->shape, nb->shape, nd->shape, &nd->attr);
        conv2d(&q, a, b, out);
        return 0;
    }
    case MPT_OP_CONV2D_BWD_DATA: { /* dy, w -> dx */
        conv_geom q = conv_geometry(nd->shape, nb->shape, na->shape, &nd->attr);
        conv2d_bwd_data(&q, a, b, out);
        return 0;
    }
    case MPT_OP_CONV2D_BWD_FILTER: { /* x, dy -> dw */
        conv_geom q = conv_geometry(na->shape, nd->shape, nb->shape, &nd->attr);
        conv2d_bwd_filter(&q, a, b, out);
        return 0;
    }

    case MPT_OP_MAX_POOL:
    case MPT_OP_AVG_POOL: {
        pool_geom q = pool_geometry(na->shape, nd->shape, &nd->attr);
        pool(nd->op, &q, a, out);
        return 0;
    }
    case MPT_OP_MAX_POOL_GRAD: { /* x, dy -> dx */
        pool_geom q = pool_geometry(na->shape, nb->shape, &nd->attr);
        pool_grad(nd->op, &q, a, b, out);
        return 0;
    }
    case MPT_OP_AVG_POOL_GRAD: { /* dy -> dx */
        pool_geom q = pool_geometry(nd->shape, na->shape, &nd->attr);
        pool_grad(nd->op, &q, NULL, a, out);
        return 0;
    }
    case MPT_OP_COUNT:
        break;
    }
    return -1;
}
