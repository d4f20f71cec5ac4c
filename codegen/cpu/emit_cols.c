/* codegen/cpu/emit_cols.c — a convolution's columns for the GEMM and
 * its data gradient by stride phases: the implicit im2col matrix filled a
 * register sliver at a time (mpt_cpu_conv_cols, for the forward pass and the
 * filter gradient wherever the columns are not gathered), and the data
 * gradient as one GEMM per stride phase (mpt_cpu_run_dgrad), the dx
 * positions of phases that have no taps zeroed in one pass. Planned by
 * emit_conv.c. */
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/emit.h"

/* ---- implicit GEMM: the im2col matrix, a window at a time ----
 * Element (p, j) of a convolution's column matrix, p = (b, oh, ow) an
 * output position and j = (kh, kw, c) a tap and channel, is
 * x[b, oh*SH + kh - PH, ow*SW + kw - PW, c], or 0 outside the image. The
 * GEMM asks for it a register sliver at a time (mpt_cpu_gemm_source) and
 * packs it while it is in L1, so the [P, KH*KW*C] matrix is never written
 * to memory and read back. */

/* Elements (p, j0) .. (p, j0 + n - 1) to dst, p = (b, oh, ow) and j0 =
 * (kh, o) with o = kw*C + c, one kernel row at a time: the taps of a row
 * are consecutive in the image, so each row is one copy with zeros where it
 * leaves the image. */
static void cols_run(const mpt_cpu_conv_cols *cc, int64_t b, int64_t oh, int64_t ow, int64_t kh,
                     int64_t o, int64_t n, char *dst) {
    const int64_t *q = cc->q;
    int64_t C = q[MPT_G_C], KW = q[MPT_G_KW], row = KW * C;
    int64_t iw0 = ow * q[MPT_G_SW] - q[MPT_G_PW];
    /* offsets o inside a kernel row that fall in the image */
    int64_t in_lo = (iw0 < 0 ? -iw0 : 0) * C;
    int64_t in_hi = (q[MPT_G_W] - iw0 < KW ? q[MPT_G_W] - iw0 : KW) * C;
    size_t es = cc->es;
    while (n > 0) {
        int64_t span = row - o < n ? row - o : n, end = o + span;
        int64_t ih = oh * q[MPT_G_SH] + kh - q[MPT_G_PH];
        int64_t lo = o > in_lo ? o : in_lo, hi = end < in_hi ? end : in_hi;
        if (ih < 0 || ih >= q[MPT_G_H] || hi <= lo) {
            memset(dst, 0, (size_t)span * es);
        } else {
            int64_t src = ((b * q[MPT_G_H] + ih) * q[MPT_G_W] + iw0) * C + lo;
            if (lo > o) memset(dst, 0, (size_t)(lo - o) * es);
            memcpy(dst + (size_t)(lo - o) * es, cc->x + (size_t)src * es, (size_t)(hi - lo) * es);
            if (end > hi) memset(dst + (size_t)(hi - o) * es, 0, (size_t)(end - hi) * es);
        }
        dst += (size_t)span * es;
        n -= span;
        kh++;
        o = 0;
    }
}

/* mpt_cpu_fill_fn, runs along j: the GEMM passes sk = 1 when k is j
 * (forward) and sw = 1 when w is j (filter gradient), so each row of the
 * window is a run of consecutive j, for consecutive p (decoded once, then
 * stepped). */
void mpt_cpu_cols_fill(const void *ctx, int64_t w0, int64_t wc, int64_t k0, int64_t kc, void *dst,
                      int64_t sw, int64_t sk) {
    const mpt_cpu_conv_cols *cc = ctx;
    const int64_t *q = cc->q;
    int64_t OH = q[MPT_G_OH], OW = q[MPT_G_OW], row = q[MPT_G_KW] * q[MPT_G_C];
    int64_t p0 = cc->p_is_w ? w0 : k0, np = cc->p_is_w ? wc : kc;
    int64_t j0 = cc->p_is_w ? k0 : w0, nj = cc->p_is_w ? kc : wc;
    size_t step = (size_t)(cc->p_is_w ? sw : sk) * cc->es;
    int64_t b = p0 / (OH * OW), oh = p0 / OW % OH, ow = p0 % OW, kh = j0 / row, o = j0 % row;
    char *d = dst;
    for (int64_t i = 0; i < np; i++, d += step) {
        cols_run(cc, b, oh, ow, kh, o, nj, d);
        if (++ow == OW) {
            ow = 0;
            if (++oh == OH) {
                oh = 0;
                b++;
            }
        }
    }
}

void mpt_cpu_pool_rows(mpt_pool *pool, int64_t rows, int *n_tasks,
                       void (*fn)(void *ctx, int task, int thread), void *ctx) {
    int64_t threads = mpt_pool_threads(pool);
    *n_tasks = (int)(rows < 4 * threads ? rows : 4 * threads);
    if (*n_tasks <= 1) {
        *n_tasks = 1;
        fn(ctx, 0, 0);
    } else {
        mpt_pool_run(pool, *n_tasks, fn, ctx);
    }
}

/* ---- the data gradient by phases ----
 * dx[ih] sums dy[oh] * w[kh] over oh*SH + kh - PH = ih (one spatial dim
 * shown). With r = (ih + PH) mod SH only the taps kh = r + SH*t take part,
 * and oh = (ih + PH - r) / SH - t: the dx positions of one phase r form a
 * grid q = (ih + PH - r) / SH on which dx is a stride-1 convolution of dy
 * with those taps. Each phase is then an im2col of dy and a GEMM whose K is
 * taps x O, so no [P, KH*KW*C] column matrix is written and summed back
 * (col2im), and every dx element comes out of one GEMM, rounded once. */
static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

mpt_cpu_dgrad_phase mpt_cpu_dgrad_phase_of(const int64_t *q, int64_t rh, int64_t rw) {
    mpt_cpu_dgrad_phase f;
    f.th = rh < q[MPT_G_KH] ? (q[MPT_G_KH] - rh + q[MPT_G_SH] - 1) / q[MPT_G_SH] : 0;
    f.tw = rw < q[MPT_G_KW] ? (q[MPT_G_KW] - rw + q[MPT_G_SW] - 1) / q[MPT_G_SW] : 0;
    f.q0h = -floor_div(rh - q[MPT_G_PH], q[MPT_G_SH]);
    f.q0w = -floor_div(rw - q[MPT_G_PW], q[MPT_G_SW]);
    int64_t q1h = floor_div(q[MPT_G_H] - 1 + q[MPT_G_PH] - rh, q[MPT_G_SH]);
    int64_t q1w = floor_div(q[MPT_G_W] - 1 + q[MPT_G_PW] - rw, q[MPT_G_SW]);
    f.nqh = q1h >= f.q0h ? q1h - f.q0h + 1 : 0;
    f.nqw = q1w >= f.q0w ? q1w - f.q0w + 1 : 0;
    return f;
}

/* The columns of a phase for nb images: tap (a, b) of grid point (qh, qw)
 * reads dy[qh - (th-1) + a, qw - (tw-1) + b], i.e. a stride-1 im2col of dy
 * padded by th-1 - q0h (which may be negative) over the phase's grid. */
static void dgrad_cols_geom(const int64_t *q, const mpt_cpu_dgrad_phase *f, int64_t nb, int64_t *sub) {
    int64_t v[MPT_G_COUNT] = {nb, q[MPT_G_OH], q[MPT_G_OW], q[MPT_G_O], f->th, f->tw, q[MPT_G_C],
                              f->nqh, f->nqw, 1, 1, f->th - 1 - f->q0h, f->tw - 1 - f->q0w};
    memcpy(sub, v, sizeof v);
}

/* The phase's B [th*tw*O, C]: row (a, b, o) is w[rh + SH*(th-1-a), rw + SW*(tw-1-b), :, o]. */
static void dgrad_weights(mpt_pool *pool, const int64_t *q, const char *w, char *wt, size_t es) {
    int64_t C = q[MPT_G_C], O = q[MPT_G_O];
    for (int64_t rh = 0; rh < q[MPT_G_SH]; rh++)
        for (int64_t rw = 0; rw < q[MPT_G_SW]; rw++) {
            mpt_cpu_dgrad_phase f = mpt_cpu_dgrad_phase_of(q, rh, rw);
            for (int64_t a = 0; a < f.th; a++)
                for (int64_t b = 0; b < f.tw; b++, wt += (size_t)(O * C) * es) {
                    int64_t kh = rh + q[MPT_G_SH] * (f.th - 1 - a), kw = rw + q[MPT_G_SW] * (f.tw - 1 - b);
                    mpt_cpu_transpose(pool, w + (size_t)((kh * q[MPT_G_KW] + kw) * C * O) * es, wt, C,
                                      O, es);
                }
        }
}

/* The GEMM's rows (out, not in place) to their dx positions. */
typedef struct {
    const int64_t *q;
    const mpt_cpu_dgrad_phase *f;
    int64_t rh, rw, nb;
    const char *out;
    char *dx;
    size_t es;
    int tiles; /* IL: out's rows in (N/IL, i, j, IL) order (mpt_cpu_kx.tiles), or 0 */
    int n_tasks;
} dgrad_scatter;

static void dgrad_scatter_task(void *ctx, int task, int thread) {
    (void)thread;
    const dgrad_scatter *s = ctx;
    const int64_t *q = s->q;
    const mpt_cpu_dgrad_phase *f = s->f;
    size_t row = (size_t)q[MPT_G_C] * s->es;
    int64_t rows = s->nb * f->nqh, lo = rows * task / s->n_tasks, hi = rows * (task + 1) / s->n_tasks;
    int64_t il = s->tiles;
    for (int64_t r = lo; r < hi; r++) {
        int64_t b = r / f->nqh, i = r % f->nqh;
        int64_t ih = (f->q0h + i) * q[MPT_G_SH] + s->rh - q[MPT_G_PH];
        for (int64_t j = 0; j < f->nqw; j++) {
            int64_t iw = (f->q0w + j) * q[MPT_G_SW] + s->rw - q[MPT_G_PW];
            char *dp = s->dx + (size_t)((b * q[MPT_G_H] + ih) * q[MPT_G_W] + iw) * row;
            int64_t src = il ? ((b / il * f->nqh + i) * f->nqw + j) * il + b % il
                             : r * f->nqw + j;
            memcpy(dp, s->out + (size_t)src * row, row);
        }
    }
}

static void dgrad_scatter_run(mpt_pool *pool, dgrad_scatter *s) {
    mpt_cpu_pool_rows(pool, s->nb * s->f->nqh, &s->n_tasks, dgrad_scatter_task, s);
}

/* The dx positions of the phases with no taps (a stride larger than the
 * kernel along a dim: (ih + PH) mod SH >= KH, or the same along w) to
 * zero, in one pass over dx in memory order: an image row with no taps
 * whole, else the runs of its positions with none. Each such phase went
 * through dgrad_scatter before, a memset a position, phase by phase: a
 * 1x1 stride-2 data gradient (56x56x256 bf16, batch 8) spent 0.95 of its
 * 2.4 ms zeroing there. */
typedef struct {
    const int64_t *q;
    char *dx;
    size_t es;
    int n_tasks;
} dgrad_zeros;

static void dgrad_zeros_task(void *ctx, int task, int thread) {
    (void)thread;
    const dgrad_zeros *z = ctx;
    const int64_t *q = z->q;
    int64_t H = q[MPT_G_H], W = q[MPT_G_W], rows = q[MPT_G_N] * H;
    int64_t lo = rows * task / z->n_tasks, hi = rows * (task + 1) / z->n_tasks;
    size_t pos = (size_t)q[MPT_G_C] * z->es;
    for (int64_t r = lo; r < hi; r++) {
        char *row = z->dx + (size_t)(r * W) * pos;
        if ((r % H + q[MPT_G_PH]) % q[MPT_G_SH] >= q[MPT_G_KH]) {
            memset(row, 0, (size_t)W * pos);
            continue;
        }
        for (int64_t iw = 0; iw < W;) {
            int64_t end = iw;
            while (end < W && (end + q[MPT_G_PW]) % q[MPT_G_SW] >= q[MPT_G_KW]) end++;
            if (end > iw) memset(row + (size_t)iw * pos, 0, (size_t)(end - iw) * pos);
            iw = end + 1;
        }
    }
}

/* The k_run of a gathered GEMM whose kernel rows are `run` k long: run
 * where its rows skip the padding by segments, else 0. */
int64_t mpt_cpu_skip_run(const mpt_cpu_kx *x, int64_t run) {
    return x->g_krange && x->g_skip > MPT_CPU_SKIP_ROWS ? run : 0;
}

int mpt_cpu_run_dgrad(const mpt_graph *g, mpt_cpu_kx *x, mpt_pool *pool, char *err, size_t n) {
    const mpt_node *nd = &g->nodes[x->k->root];
    const int64_t *q = x->geom;
    void **s = x->slots;
    size_t es_dy = mpt_dtype_size(g->nodes[nd->in[0]].dtype);
    size_t es_w = mpt_dtype_size(g->nodes[nd->in[1]].dtype), es_dx = mpt_dtype_size(nd->dtype);
    dgrad_weights(pool, q, s[x->b_slot], s[x->wt_slot], es_w);
    const char *wt = s[x->wt_slot];
    const void *base = x->gather || x->tiles ? mpt_cpu_gather_base(x, pool, s[x->a_slot]) : NULL;
    const int64_t *g_row = x->g_row, *g_col = x->g_col, *g_kr = x->g_krange, *g_crow = x->g_crow;
    if (q[MPT_G_SH] > q[MPT_G_KH] || q[MPT_G_SW] > q[MPT_G_KW]) {
        dgrad_zeros z = {q, s[x->c_slot], es_dx, 1};
        mpt_cpu_pool_rows(pool, q[MPT_G_N] * q[MPT_G_H], &z.n_tasks, dgrad_zeros_task, &z);
    }
    for (int64_t rh = 0; rh < q[MPT_G_SH]; rh++)
        for (int64_t rw = 0; rw < q[MPT_G_SW]; rw++) {
            mpt_cpu_dgrad_phase f = mpt_cpu_dgrad_phase_of(q, rh, rw);
            int64_t K = f.th * f.tw * q[MPT_G_O], grid = f.nqh * f.nqw;
            if (grid > 0) {
                /* the whole batch in one GEMM: its columns are never stored */
                int64_t nb = q[MPT_G_N];
                dgrad_scatter sc = {q, &f, rh, rw, nb, NULL, s[x->c_slot], es_dx,
                                   x->tiles ? x->tiles : (int)x->g_il, 1};
                int in_place = x->tiles || x->dgrad_in_place || x->dgrad_rows;
                void *rows_to = s[in_place ? x->c_slot : x->acc_slot];
                sc.out = rows_to;
                if (K > 0 && (x->gather || x->tiles)) {
                    mpt_cpu_gemm_gather ga = {base, g_row, g_col, g_kr,
                                              x->tiles ? q[MPT_G_O] * (int64_t)es_dy : 0,
                                              mpt_cpu_skip_run(x, f.tw * q[MPT_G_O])};
                    /* each row stored at its dx position (desc.c_rows) */
                    mpt_cpu_epilogue_args epi;
                    memset(&epi, 0, sizeof epi);
                    epi.c_row = g_crow;
                    int by_rows = x->tiles || x->dgrad_rows;
                    if (mpt_cpu_gemm_run_gather(x->gemm, pool, nb * grid, q[MPT_G_C], K, &ga, wt,
                                                0, rows_to, 0, by_rows ? &epi : NULL, err, n))
                        return -1;
                    g_row += nb * grid;
                    if (g_kr) g_kr += 4 * nb * grid;
                    if (g_crow) g_crow += nb * grid;
                    g_col += K;
                } else if (K > 0) {
                    int64_t sub[MPT_G_COUNT];
                    dgrad_cols_geom(q, &f, nb, sub);
                    mpt_cpu_conv_cols cc = {sub, s[x->a_slot], es_dy, 1};
                    mpt_cpu_gemm_source src = {mpt_cpu_cols_fill, &cc, 0, NULL};
                    if (mpt_cpu_gemm_run_src(x->gemm, pool, nb * grid, q[MPT_G_C], K, &src, NULL,
                                             0, NULL, wt, 0, rows_to, 0, NULL, err, n))
                        return -1;
                }
                /* the GEMM's rows to dx where it did not store them there
                 * (a phase with no taps: dgrad_zeros) */
                if (K > 0 && !in_place) dgrad_scatter_run(pool, &sc);
            }
            wt += (size_t)(K * q[MPT_G_C]) * es_w;
        }
    return 0;
}
