/* codegen/cpu/emit_gather.c — gathered implicit GEMM: a convolution's
 * columns read from the zero-padded image by the micro-kernel itself.
 *
 * The column matrix's element (p, j) is x[b, oh*SH + kh - PH, ow*SW + kw - PW, c],
 * which in an image padded with PH rows and PW columns of zeros in front
 * (and enough behind) is at pos(p) + tap(j): pos(p) = ((b*HP + oh*SH)*WP +
 * ow*SW)*C, tap(j) = (kh*WP + kw)*C + c. The f32 micro-kernel broadcasts
 * A's elements one at a time anyway, so it reads them there
 * (mpt_cpu_gemm_gather) and the columns are neither filled nor packed: the
 * forward GEMM's A is (pos, tap), the filter gradient's (tap, pos).
 */
#include <emmintrin.h>
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/emit.h"

/* Whether a GEMM with n output columns and k_run channels per tap gathers
 * its columns (MPT_CPU_CONV_GATHER=0: never; =1: always). Filling and
 * packing an element of A costs about as much whatever N is, and it then
 * feeds N FMAs: with few output channels it is a large share (convnet64
 * f32, N = 32 to 128: forward, filter and data gradients 10-60% faster
 * gathered), with many it is not, and the gathered tile's 10 rows (against
 * 14 packed) lose: ResNet-50's N >= 256 convolutions ran 5-90% slower
 * gathered, N = 64 3-34% faster, N = 128 even. f16 and bf16 gather from
 * an f32 copy of the padded image (mpt_cpu_kx.pad_widen), so the tile
 * multiplies as in f32 (convnet64 mixed_float16, batch 32: kernels 89.7 ->
 * 72.7 ms a step against packing the f16 columns). bf16 does so wherever
 * the host has no AMX, or for a tap of fewer than 16 channels (an image's first
 * convolution, whose K is too short for AMX tiles to pay for their fill;
 * on AMX such a layer reads kernel rows as tiles instead:
 * mpt_cpu_krow_tiles_pay). Without AMX, vdpbf16ps on filled and packed
 * pairs costs what f32's fill does even where the dot product is fast
 * (convnet64 bf16 on the Xeon VM: 46-62 GFLOP/s a core packed, 112-182
 * gathered); where it is fast the forward and data gradient gather the
 * pairs themselves (mpt_cpu_gather_widen). one_tap: a strided or padded 1x1
 * kernel, whose columns are the image's own pixels, is filled and packed
 * (ResNet-50's 1x1 stride 2 filter gradient 3.7-4.1 ms against 5.3-5.8
 * gathered; docs/BENCHMARKS.md). AVX2: below. */
int mpt_cpu_gather_pays(const mpt_cpu_jit *j, mpt_dtype a_dt, int64_t n, int64_t k_run,
                        int one_tap, int wgrad, const int64_t *q) {
    const char *env = getenv("MPT_CPU_CONV_GATHER");
    if (env && (!strcmp(env, "0") || !strcmp(env, "1")))
        return env[0] == '1';
    /* AVX2 filter gradients only where padding taps or few columns repay
     * it (ResNet-50's stage 3 3x3: 115 ms gathered, 97 packed; the other
     * directions gather as on AVX-512: docs/DECISIONS.md) */
    if (wgrad && mpt_cpu_jit_vector_lanes(j) < 16 && n > 32 && mpt_cpu_conv_inside(q) >= 0.8)
        return 0;
    /* AVX-512: 64 columns at a time on rows an even step apart (the
     * 7 x 64 tile, gemm.c) gather any multiple of 64 (ResNet-50's 3x3 of
     * stages 4-5, N = 256 and 512: 5-10% faster than packed in f32, 10-20%
     * in bf16 pairs, every direction; the widened copies of f16 and bf16
     * were not measured so) */
    int pairs = a_dt == MPT_DT_BF16 && (wgrad ? q[MPT_G_N] : k_run) % 2 == 0 && mpt_cpu_pairs_pay(j);
    int wide_ok = mpt_cpu_jit_vector_lanes(j) == 16 && n % 64 == 0 && (a_dt == MPT_DT_F32 || pairs);
    return (n <= 128 || wide_ok) && !one_tap && (a_dt == MPT_DT_F32 || a_dt == MPT_DT_F16 || k_run < 16 ||
                        (a_dt == MPT_DT_BF16 && !mpt_cpu_jit_has_amx(j)));
}

int mpt_cpu_pairs_pay(const mpt_cpu_jit *j) {
    return mpt_cpu_jit_vector_lanes(j) == 16 && !mpt_cpu_jit_has_amx(j) && mpt_cpu_bf16_dot_pays(j, NULL);
}

/* Where vdpbf16ps pays (mpt_cpu_pairs_pay), a gathered bf16 GEMM reads
 * A's pairs (k, k + 1) as one 32-bit broadcast each (desc.a_pairs): no f32
 * copy, and vdpbf16ps covers two k an instruction. A forward pass's or
 * data gradient's pair is two channels of a tap, side by side in NHWC
 * (pairs_ok: an even number of them), read from the bf16 image itself. A
 * filter gradient's k are positions, a pixel apart: it reads them from a
 * copy with the images interleaved in twos (pairs_ok: an even batch;
 * mpt_cpu_gather_plan), k running over images innermost. */
int mpt_cpu_gather_widen(const mpt_cpu_jit *j, int gather, mpt_dtype a_dt, mpt_dtype b_dt,
                         int pairs_ok) {
    if (!gather || a_dt == MPT_DT_F32) return 0;
    if (a_dt == MPT_DT_BF16 && b_dt == MPT_DT_BF16 && pairs_ok && mpt_cpu_pairs_pay(j)) return 0;
    return a_dt == MPT_DT_BF16 ? 2 : 1;
}


/* The step between a gathered A's consecutive rows that most of its first
 * rows share (desc.a_row_step: tiles of such rows run on one pointer),
 * or 0. Rows along an image row are C elements apart, images of an
 * interleaved order a whole image apart. */
int64_t mpt_cpu_gather_row_step(const int64_t *row, int64_t m) {
    int64_t best = 0, best_n = 0, n = m - 1 < 256 ? m - 1 : 256;
    for (int64_t i = 0; i < n; i++) {
        int64_t d = row[i + 1] - row[i], c = 0;
        if (d <= 0 || d == best) continue;
        for (int64_t j = i; j < n; j++) c += row[j + 1] - row[j] == d;
        if (c > best_n) best = d, best_n = c;
    }
    return 2 * best_n >= n ? best : 0;
}

/* The padded image's slot, where it differs from the image. */
static int gather_pad_slot(mpt_cpu_kx *x, char *err, size_t n) {
    const int64_t *d = x->pad;
    if (d[MPT_CPU_PAD_HP] == d[MPT_CPU_PAD_H] && d[MPT_CPU_PAD_WP] == d[MPT_CPU_PAD_W] && !d[MPT_CPU_PAD_TOP] && !d[MPT_CPU_PAD_LEFT] &&
        !d[MPT_CPU_PAD_IL] && !x->pad_widen)
        return 0;
    x->pad_slot = mpt_cpu_kx_slot(x, -6, d[MPT_CPU_PAD_N] * d[MPT_CPU_PAD_HP] * d[MPT_CPU_PAD_WP] * d[MPT_CPU_PAD_C] * d[MPT_CPU_PAD_ES]);
    if (x->pad_slot < 0) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    return 0;
}

/* The padded image's geometry into x->pad: room for every window, zeros
 * PH rows and PW columns in front; il: the images' interleave (MPT_CPU_PAD_IL). */
static void image_pad(mpt_cpu_kx *x, int64_t es, int64_t il) {
    const int64_t *q = x->geom;
    int64_t need_h = (q[MPT_G_OH] - 1) * q[MPT_G_SH] + q[MPT_G_KH];
    int64_t need_w = (q[MPT_G_OW] - 1) * q[MPT_G_SW] + q[MPT_G_KW];
    int64_t hp = need_h > q[MPT_G_PH] + q[MPT_G_H] ? need_h : q[MPT_G_PH] + q[MPT_G_H];
    int64_t wp = need_w > q[MPT_G_PW] + q[MPT_G_W] ? need_w : q[MPT_G_PW] + q[MPT_G_W];
    int64_t pad[10] = {q[MPT_G_N], q[MPT_G_H], q[MPT_G_W], q[MPT_G_C], q[MPT_G_PH],
                       q[MPT_G_PW], hp, wp, es, il};
    memcpy(x->pad, pad, sizeof pad);
}

/* The taps t in [0, taps) of a window starting at `at` (its first
 * element's index, padding included: at - pad in the image) that fall in
 * the image's [0, size): [*lo, *hi). */
static void taps_inside(int64_t at, int64_t pad, int64_t size, int64_t taps, int64_t *lo,
                        int64_t *hi) {
    *lo = pad - at > 0 ? pad - at : 0;
    *hi = pad + size - at < taps ? pad + size - at : taps;
    if (*hi < *lo) *hi = *lo;
}

/* The output positions o in [0, outs) whose tap t (stride st) falls in the
 * image: 0 <= o*st + t - pad < size. */
static void outs_inside(int64_t t, int64_t st, int64_t pad, int64_t size, int64_t outs,
                        int64_t *lo, int64_t *hi) {
    *lo = pad - t <= 0 ? 0 : (pad - t + st - 1) / st;
    int64_t last = size - 1 + pad - t; /* o*st <= last */
    *hi = last < 0 ? 0 : last / st + 1;
    if (*hi > outs) *hi = outs;
    if (*hi < *lo) *hi = *lo;
}

/* The forward GEMM's rows are output positions, its k the taps (kh, kw, c):
 * a position's kernel rows in the top and bottom padding, and in each row
 * the taps in the left and right padding, are zeros. The filter
 * gradient's rows are taps, its k the positions: a tap's output rows whose
 * kernel row falls in the padding, and in each output row the columns
 * where its kernel column does. Either way emit_ranges.c says which of
 * them the tiles skip, and so the order of rows (forward) or of k (the
 * filter gradient: (oh, n, ow) skipping whole output rows, (oh, ow, n)
 * skipping by segments). */
int mpt_cpu_gather_plan(mpt_cpu_kx *x, int fwd, int64_t es, int pairs, char *err, size_t n) {
    const int64_t *q = x->geom;
    /* a filter gradient in pairs: images interleaved in twos */
    int il = pairs && !fwd ? 2 : 1;
    image_pad(x, es, il == 2 ? 2 : 0);
    if (x->pad_widen && (q[MPT_G_KH] < q[MPT_G_SH] || q[MPT_G_KW] < q[MPT_G_SW])) {
        int64_t rd[4] = {q[MPT_G_SH], q[MPT_G_KH], q[MPT_G_SW], q[MPT_G_KW]};
        memcpy(x->pad_read, rd, sizeof rd);
    }
    int64_t C = q[MPT_G_C], hp = x->pad[MPT_CPU_PAD_HP], wp = x->pad[MPT_CPU_PAD_WP];
    int64_t NB = q[MPT_G_N], OH = q[MPT_G_OH], OW = q[MPT_G_OW], KW = q[MPT_G_KW];
    int64_t P = NB * OH * OW, KK = q[MPT_G_KH] * KW * C, M = fwd ? P : KK;
    int64_t *pos = malloc((size_t)P * 8), *tap = malloc((size_t)KK * 8);
    mpt_cpu_krange *r = malloc((size_t)M * sizeof *r);
    x->g_row = fwd ? pos : tap;
    x->g_col = fwd ? tap : pos;
    x->g_krange = calloc((size_t)M, 32);
    if (!fwd) x->g_perm = malloc((size_t)P * 8);
    if (!pos || !tap || !r || !x->g_krange || (!fwd && !x->g_perm)) {
        free(r);
        snprintf(err, n, "out of memory");
        return -1;
    }
    int64_t run = fwd ? KW * C : NB * OW, cost[MPT_CPU_SKIP_COUNT];
    for (int64_t i = 0; i < M; i++) {
        mpt_cpu_krange *e = &r[i];
        if (fwd) { /* position i in (n, oh, ow) order */
            taps_inside(i / OW % OH * q[MPT_G_SH], q[MPT_G_PH], q[MPT_G_H], q[MPT_G_KH], &e->h0, &e->h1);
            taps_inside(i % OW * q[MPT_G_SW], q[MPT_G_PW], q[MPT_G_W], KW, &e->s0, &e->s1);
            e->s0 *= C, e->s1 *= C;
        } else { /* tap i */
            outs_inside(i / (KW * C), q[MPT_G_SH], q[MPT_G_PH], q[MPT_G_H], OH, &e->h0, &e->h1);
            outs_inside(i / C % KW, q[MPT_G_SW], q[MPT_G_PW], q[MPT_G_W], OW, &e->s0, &e->s1);
            e->s0 *= NB, e->s1 *= NB;
        }
    }
    /* the filter gradient's rows are taps: no images to reorder */
    int64_t nb = fwd ? NB : 1, np = fwd ? OH * OW : KK;
    for (int how = 0; how < MPT_CPU_SKIP_COUNT; how++)
        cost[how] = fwd || how != MPT_CPU_SKIP_IMAGES ? mpt_cpu_krange_cost(r, nb, np, run, how)
                                                      : INT64_MAX / 32;
    int how = mpt_cpu_krange_choose(cost);
    if (!fwd && (how == MPT_CPU_SKIP_IMAGES || il == 2)) how = MPT_CPU_SKIP_RUNS;
    mpt_cpu_krange_write(r, nb, np, run, how, x->g_krange);
    free(r);
    x->g_il = fwd && how == MPT_CPU_SKIP_IMAGES ? NB : 0;
    x->g_skip = how;
    x->g_kpct = (int)(100 * cost[how] / mpt_cpu_krange_nominal(M, fwd ? KK : P));
    for (int64_t i = 0; i < P; i++) {
        /* the forward's row i, or the filter gradient's k i */
        int64_t b, oh, ow;
        if (fwd && x->g_il) b = i % NB, oh = i / NB / OW, ow = i / NB % OW;
        else if (fwd) b = i / (OH * OW), oh = i / OW % OH, ow = i % OW;
        else if (how == MPT_CPU_SKIP_ROWS) oh = i / (NB * OW), b = i / OW % NB, ow = i % OW;
        else oh = i / (NB * OW), ow = i / NB % OW, b = i % NB;
        pos[i] = ((b / il * hp + oh * q[MPT_G_SH]) * wp + ow * q[MPT_G_SW]) * C * il * es + b % il * es;
        if (!fwd) x->g_perm[i] = (b * OH + oh) * OW + ow;
    }
    for (int64_t j = 0; j < KK; j++) {
        int64_t kh = j / (KW * C), kw = j / C % KW, c = j % C;
        tap[j] = ((kh * wp + kw) * C + c) * il * es;
    }
    x->g_step = mpt_cpu_gather_row_step(x->g_row, M);
    return gather_pad_slot(x, err, n);
}

/* x [N, H, W, C] into xp [N, HP, WP, C] at (top, left), zeros around it,
 * padded rows split over the pool's threads. */
typedef struct {
    const int64_t *d; /* PAD_* */
    const char *x;
    char *xp;
    int n_tasks;
    int widen; /* x is f16 (1) or bf16 (2), xp f32 */
    const int64_t *read; /* mpt_cpu_kx.pad_read, or NULL: every element */
} gather_pad;

/* n f16 values, exactly, as f32 */
__attribute__((target("avx2,f16c"))) static void widen_f16c(const uint16_t *s, float *d,
                                                             int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++)
        d[i] = mpt_f16_to_f32(s[i]);
}

/* n bf16 values as f32: each shifted into the upper half, 16 at a time
 * (the scalar loop is not vectorised at -O2) */
__attribute__((target("avx2"))) static void widen_bf16_avx2(const uint16_t *s, float *d,
                                                           int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i lo = _mm256_unpacklo_epi16(_mm256_setzero_si256(), v);
        __m256i hi = _mm256_unpackhi_epi16(_mm256_setzero_si256(), v);
        /* unpack works per 128-bit lane: lo holds elements 0-3 and 8-11 */
        _mm256_storeu_si256((__m256i *)(d + i), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256((__m256i *)(d + i + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
    }
    uint32_t *o = (uint32_t *)d;
    for (; i < n; i++)
        o[i] = (uint32_t)s[i] << 16;
}

/* n f16 (or bf16) values, exactly, as f32 */
static void widen_half(const uint16_t *s, float *d, int64_t n, int bf16) {
    if (bf16 && __builtin_cpu_supports("avx2")) {
        widen_bf16_avx2(s, d, n);
        return;
    }
    if (bf16) {
        uint32_t *o = (uint32_t *)d;
        for (int64_t i = 0; i < n; i++)
            o[i] = (uint32_t)s[i] << 16;
        return;
    }
    if (__builtin_cpu_supports("f16c")) {
        widen_f16c(s, d, n);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        d[i] = mpt_f16_to_f32(s[i]);
}

static void gather_pad_task(void *ctx, int task, int thread) {
    (void)thread;
    const gather_pad *pd = ctx;
    const int64_t *d = pd->d;
    int64_t rows = d[MPT_CPU_PAD_N] * d[MPT_CPU_PAD_HP];
    int64_t lo = rows * task / pd->n_tasks, hi = rows * (task + 1) / pd->n_tasks;
    size_t es = (size_t)d[MPT_CPU_PAD_ES], row = (size_t)(d[MPT_CPU_PAD_WP] * d[MPT_CPU_PAD_C]) * es;
    size_t left = (size_t)(d[MPT_CPU_PAD_LEFT] * d[MPT_CPU_PAD_C]) * es, in = (size_t)(d[MPT_CPU_PAD_W] * d[MPT_CPU_PAD_C]) * es;
    const int64_t *rd = pd->read;
    for (int64_t r = lo; r < hi; r++) {
        int64_t b = r / d[MPT_CPU_PAD_HP], ih = r % d[MPT_CPU_PAD_HP] - d[MPT_CPU_PAD_TOP];
        char *o = pd->xp + (size_t)r * row;
        if (rd && r % d[MPT_CPU_PAD_HP] % rd[0] >= rd[1])
            continue; /* a row no window reads */
        if (ih < 0 || ih >= d[MPT_CPU_PAD_H]) {
            memset(o, 0, row);
            continue;
        }
        memset(o, 0, left);
        int64_t at = (b * d[MPT_CPU_PAD_H] + ih) * d[MPT_CPU_PAD_W] * d[MPT_CPU_PAD_C];
        if (rd && rd[3] < rd[2]) {
            /* only the columns windows read (wp % SW < KW) */
            for (int64_t w = 0; w < d[MPT_CPU_PAD_W]; w++)
                if ((w + d[MPT_CPU_PAD_LEFT]) % rd[2] < rd[3])
                    widen_half((const uint16_t *)pd->x + at + w * d[MPT_CPU_PAD_C],
                               (float *)(o + left) + w * d[MPT_CPU_PAD_C], d[MPT_CPU_PAD_C], pd->widen == 2);
        } else if (pd->widen)
            widen_half((const uint16_t *)pd->x + at, (float *)(o + left), d[MPT_CPU_PAD_W] * d[MPT_CPU_PAD_C],
                      pd->widen == 2);
        else
            memcpy(o + left, pd->x + (size_t)at * es, in);
        memset(o + left + in, 0, row - left - in);
    }
}

/* The same into [N/IL, HP, WP, IL, C] (IL = 8 or 16): a padded row
 * (bi, ih) is WP x IL runs of C elements. */
static void gather_pad_il_task(void *ctx, int task, int thread) {
    (void)thread;
    const gather_pad *pd = ctx;
    const int64_t *d = pd->d;
    int64_t il = d[MPT_CPU_PAD_IL], rows = d[MPT_CPU_PAD_N] / il * d[MPT_CPU_PAD_HP];
    int64_t lo = rows * task / pd->n_tasks, hi = rows * (task + 1) / pd->n_tasks;
    size_t es = (size_t)d[MPT_CPU_PAD_ES], run = (size_t)d[MPT_CPU_PAD_C] * es;
    for (int64_t r = lo; r < hi; r++) {
        int64_t bi = r / d[MPT_CPU_PAD_HP], ih = r % d[MPT_CPU_PAD_HP] - d[MPT_CPU_PAD_TOP];
        char *o = pd->xp + (size_t)(r * d[MPT_CPU_PAD_WP] * il) * run;
        if (ih < 0 || ih >= d[MPT_CPU_PAD_H]) {
            memset(o, 0, (size_t)(d[MPT_CPU_PAD_WP] * il) * run);
            continue;
        }
        for (int64_t wp = 0; wp < d[MPT_CPU_PAD_WP]; wp++, o += il * run) {
            int64_t iw = wp - d[MPT_CPU_PAD_LEFT];
            if (iw < 0 || iw >= d[MPT_CPU_PAD_W]) {
                memset(o, 0, (size_t)il * run);
                continue;
            }
            for (int64_t b = 0; b < il; b++)
                memcpy(o + (size_t)b * run,
                       pd->x + (size_t)(((bi * il + b) * d[MPT_CPU_PAD_H] + ih) * d[MPT_CPU_PAD_W] + iw) * run,
                       run);
        }
    }
}

/* n 16-bit values of a and of b, interleaved: d[2i] = a[i], d[2i + 1] = b[i] */
__attribute__((target("avx2"))) static void interleave_u16_avx2(const uint16_t *a, const uint16_t *b,
                                                                uint16_t *d, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i va = _mm256_loadu_si256((const __m256i *)(a + i));
        __m256i vb = _mm256_loadu_si256((const __m256i *)(b + i));
        __m256i lo = _mm256_unpacklo_epi16(va, vb), hi = _mm256_unpackhi_epi16(va, vb);
        /* per 128-bit lane: lo holds elements 0-3 and 8-11 */
        _mm256_storeu_si256((__m256i *)(d + 2 * i), _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256((__m256i *)(d + 2 * i + 16), _mm256_permute2x128_si256(lo, hi, 0x31));
    }
    for (; i < n; i++) {
        d[2 * i] = a[i];
        d[2 * i + 1] = b[i];
    }
}

/* The same into [N/2, HP, WP, C, 2] (2-byte elements): images 2i and
 * 2i + 1 interleaved element by element, so that a pixel's channel in
 * both is one 32-bit pair (a filter gradient's k in pairs). */
static void gather_pad_pair_task(void *ctx, int task, int thread) {
    (void)thread;
    const gather_pad *pd = ctx;
    const int64_t *d = pd->d;
    int64_t rows = d[MPT_CPU_PAD_N] / 2 * d[MPT_CPU_PAD_HP], C = d[MPT_CPU_PAD_C];
    int64_t lo = rows * task / pd->n_tasks, hi = rows * (task + 1) / pd->n_tasks;
    size_t row = (size_t)(d[MPT_CPU_PAD_WP] * C) * 4, left = (size_t)(d[MPT_CPU_PAD_LEFT] * C) * 4;
    size_t in = (size_t)(d[MPT_CPU_PAD_W] * C) * 4;
    int64_t img = d[MPT_CPU_PAD_H] * d[MPT_CPU_PAD_W] * C;
    for (int64_t r = lo; r < hi; r++) {
        int64_t b2 = r / d[MPT_CPU_PAD_HP], ih = r % d[MPT_CPU_PAD_HP] - d[MPT_CPU_PAD_TOP];
        char *o = pd->xp + (size_t)r * row;
        if (ih < 0 || ih >= d[MPT_CPU_PAD_H]) {
            memset(o, 0, row);
            continue;
        }
        const uint16_t *a = (const uint16_t *)pd->x + (2 * b2 * d[MPT_CPU_PAD_H] + ih) * d[MPT_CPU_PAD_W] * C;
        memset(o, 0, left);
        if (__builtin_cpu_supports("avx2"))
            interleave_u16_avx2(a, a + img, (uint16_t *)(o + left), d[MPT_CPU_PAD_W] * C);
        else
            for (int64_t i = 0; i < d[MPT_CPU_PAD_W] * C; i++) {
                ((uint16_t *)(o + left))[2 * i] = a[i];
                ((uint16_t *)(o + left))[2 * i + 1] = a[img + i];
            }
        memset(o + left + in, 0, row - left - in);
    }
}

/* The same into [N/32, HP, WP, C, 32] (2-byte elements, C a multiple of
 * 8): each position's 32 images x C channels transposed in 8 x 8 blocks. */
static void gather_pad_cm_task(void *ctx, int task, int thread) {
    (void)thread;
    const gather_pad *pd = ctx;
    const int64_t *d = pd->d;
    int64_t rows = d[MPT_CPU_PAD_N] / 32 * d[MPT_CPU_PAD_HP], C = d[MPT_CPU_PAD_C];
    int64_t lo = rows * task / pd->n_tasks, hi = rows * (task + 1) / pd->n_tasks;
    int64_t img = d[MPT_CPU_PAD_H] * d[MPT_CPU_PAD_W] * C;
    for (int64_t r = lo; r < hi; r++) {
        int64_t b32 = r / d[MPT_CPU_PAD_HP], ih = r % d[MPT_CPU_PAD_HP] - d[MPT_CPU_PAD_TOP];
        uint16_t *o = (uint16_t *)pd->xp + r * d[MPT_CPU_PAD_WP] * C * 32;
        for (int64_t wp = 0; wp < d[MPT_CPU_PAD_WP]; wp++, o += C * 32) {
            int64_t iw = wp - d[MPT_CPU_PAD_LEFT];
            if (ih < 0 || ih >= d[MPT_CPU_PAD_H] || iw < 0 || iw >= d[MPT_CPU_PAD_W]) {
                memset(o, 0, (size_t)(C * 32) * 2);
                continue;
            }
            const uint16_t *src = (const uint16_t *)pd->x + ((b32 * 32 * d[MPT_CPU_PAD_H] + ih) * d[MPT_CPU_PAD_W] + iw) * C;
            for (int64_t b0 = 0; b0 < 32; b0 += 8)
                for (int64_t c0 = 0; c0 < C; c0 += 8)
                    mpt_cpu_tr8x8_u16(src + b0 * img + c0, img, o + c0 * 32 + b0, 32);
        }
    }
}

/* The image the gathered GEMM reads: x itself, or its padded copy. */
const void *mpt_cpu_gather_base(mpt_cpu_kx *x, mpt_pool *pool, const void *img) {
    if (x->pad_slot < 0)
        return img;
    gather_pad pd = {x->pad, img, x->slots[x->pad_slot], 1, x->pad_widen,
                     x->pad_read[0] ? x->pad_read : NULL};
    if (x->pad[MPT_CPU_PAD_IL] == 16 || x->pad[MPT_CPU_PAD_IL] == 8)
        mpt_cpu_pool_rows(pool, x->pad[MPT_CPU_PAD_N] / x->pad[MPT_CPU_PAD_IL] * x->pad[MPT_CPU_PAD_HP], &pd.n_tasks,
                          gather_pad_il_task, &pd);
    else if (x->pad[MPT_CPU_PAD_IL] == 2)
        mpt_cpu_pool_rows(pool, x->pad[MPT_CPU_PAD_N] / 2 * x->pad[MPT_CPU_PAD_HP], &pd.n_tasks,
                          gather_pad_pair_task, &pd);
    else if (x->pad[MPT_CPU_PAD_IL] == 32)
        mpt_cpu_pool_rows(pool, x->pad[MPT_CPU_PAD_N] / 32 * x->pad[MPT_CPU_PAD_HP], &pd.n_tasks,
                          gather_pad_cm_task, &pd);
    else
        mpt_cpu_pool_rows(pool, x->pad[MPT_CPU_PAD_N] * x->pad[MPT_CPU_PAD_HP], &pd.n_tasks, gather_pad_task,
                          &pd);
    return pd.xp;
}

int mpt_cpu_tiles_pay(const mpt_cpu_jit *j, mpt_dtype a_dt, mpt_dtype b_dt, int64_t batch,
                      int64_t k_run, int pairs_ok) {
    const char *env = getenv("MPT_CPU_CONV_TILES");
    if (env && !strcmp(env, "0"))
        return 0;
    if (!mpt_cpu_jit_has_amx(j) || a_dt != MPT_DT_BF16 || b_dt != MPT_DT_BF16 || k_run % 32)
        return 0;
    /* MPT_CPU_CONV_TILES=8 takes pairs where a batch of 16s could interleave 16 */
    if (batch % 16 == 0 && !(env && !strcmp(env, "8") && pairs_ok))
        return 16;
    return batch % 8 == 0 && pairs_ok ? 8 : 0;
}

int mpt_cpu_wgrad_tiles_pay(const mpt_cpu_jit *j, mpt_dtype a_dt, mpt_dtype b_dt,
                            int64_t batch, int64_t channels) {
    const char *env = getenv("MPT_CPU_CONV_TILES");
    if (env && !strcmp(env, "0"))
        return 0;
    return mpt_cpu_jit_has_amx(j) && a_dt == MPT_DT_BF16 && b_dt == MPT_DT_BF16 &&
           batch % 32 == 0 && channels % 16 == 0;
}

/* The padded image with il images interleaved (il = 1: as it is), and the
 * tables of a forward convolution's tiles: rows in (N/il, oh, ow, il)
 * order at their window's corner, 32 more for the last tile's second half
 * to read 16 rows past the end; room for K columns. */
int mpt_cpu_tile_tables(mpt_cpu_kx *x, int64_t es, int64_t il, int64_t K, char *err, size_t n) {
    const int64_t *q = x->geom;
    image_pad(x, es, il == 1 ? 0 : il);
    int64_t C = q[MPT_G_C], hp = x->pad[MPT_CPU_PAD_HP], wp = x->pad[MPT_CPU_PAD_WP];
    int64_t OH = q[MPT_G_OH], OW = q[MPT_G_OW], P = q[MPT_G_N] * OH * OW;
    x->g_row = malloc((size_t)(P + 32) * 8);
    x->g_col = malloc((size_t)K * 8);
    if (!x->g_row || !x->g_col) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    for (int64_t i = 0; i < P; i++) {
        int64_t bi = i / (OH * OW * il), p = i / il % (OH * OW), b = i % il;
        int64_t oh = p / OW, ow = p % OW;
        x->g_row[i] = (((bi * hp + oh * q[MPT_G_SH]) * wp + ow * q[MPT_G_SW]) * il + b) * C * es;
    }
    for (int64_t i = P; i < P + 32; i++) x->g_row[i] = x->g_row[0];
    return 0;
}

/* The forward convolution's tables for A read a tile at a time: rows in
 * (N/IL, oh, ow, IL) order, at their corner in the interleaved padded
 * image; columns (kh, kw, c) at their offset from it. With IL = 8 a
 * tile's 16 rows are the 8 images at ow and ow + 1 (ow even). */
int mpt_cpu_tiles_plan(mpt_cpu_kx *x, int64_t es, int64_t ys, char *err, size_t n) {
    const int64_t *q = x->geom;
    int64_t il = x->tiles, C = q[MPT_G_C], KK = q[MPT_G_KH] * q[MPT_G_KW] * C;
    if (mpt_cpu_tile_tables(x, es, il, KK, err, n))
        return -1;
    int64_t wp = x->pad[MPT_CPU_PAD_WP];
    for (int64_t j = 0; j < KK; j++) {
        int64_t kh = j / (q[MPT_G_KW] * C), kw = j / C % q[MPT_G_KW], c = j % C;
        x->g_col[j] = ((kh * wp + kw) * il * C + c) * es;
    }
    /* y's row of each GEMM row, (N/IL, position, IL) -> (N, position) */
    int64_t pos = q[MPT_G_OH] * q[MPT_G_OW], P = q[MPT_G_N] * pos;
    if (!(x->g_crow = malloc((size_t)P * sizeof *x->g_crow))) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    for (int64_t i = 0; i < P; i++) {
        int64_t bi = i / (pos * il), p = i / il % pos, b = i % il;
        x->g_crow[i] = ((bi * il + b) * pos + p) * q[MPT_G_O] * ys;
    }
    return gather_pad_slot(x, err, n);
}

/* The filter gradient's tables for A (the column matrix transposed: rows
 * (kh, kw, c), k the positions) read a tile at a time from the padded
 * image with 32 images innermost, [N/32, HP, WP, C, 32]: a tile row is 32
 * images at one position and channel, and 16 consecutive channels are 64
 * bytes apart. k runs over (N/32, oh, ow, 32); g_perm gives dy's row of
 * each k. */
int mpt_cpu_wgrad_tiles_plan(mpt_cpu_kx *x, int64_t es, char *err, size_t n) {
    const int64_t *q = x->geom;
    image_pad(x, es, 32);
    int64_t C = q[MPT_G_C], hp = x->pad[MPT_CPU_PAD_HP], wp = x->pad[MPT_CPU_PAD_WP];
    int64_t OH = q[MPT_G_OH], OW = q[MPT_G_OW], P = q[MPT_G_N] * OH * OW;
    int64_t KK = q[MPT_G_KH] * q[MPT_G_KW] * C;
    x->g_row = malloc((size_t)(KK + 32) * 8);
    x->g_col = malloc((size_t)P * 8);
    x->g_perm = malloc((size_t)P * 8);
    if (!x->g_row || !x->g_col || !x->g_perm) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    for (int64_t j = 0; j < KK; j++) {
        int64_t kh = j / (q[MPT_G_KW] * C), kw = j / C % q[MPT_G_KW], c = j % C;
        x->g_row[j] = ((kh * wp + kw) * C + c) * 32 * es;
    }
    /* the last tile's second half reads 16 rows past the end */
    for (int64_t j = KK; j < KK + 32; j++) x->g_row[j] = x->g_row[0];
    for (int64_t k = 0; k < P; k++) {
        int64_t b32 = k / (OH * OW * 32), pos = k / 32 % (OH * OW), b = k % 32;
        int64_t oh = pos / OW, ow = pos % OW;
        x->g_col[k] = (((b32 * hp + oh * q[MPT_G_SH]) * wp + ow * q[MPT_G_SW]) * C * 32 + b) * es;
        x->g_perm[k] = ((b32 * 32 + b) * OH + oh) * OW + ow;
    }
    return gather_pad_slot(x, err, n);
}

typedef struct {
    const char *src;
    char *dst;
    int64_t batch, positions;
    size_t row;
    int64_t il;
    int n_tasks;
} unpermute;

static void unpermute_task(void *ctx, int task, int thread) {
    (void)thread;
    const unpermute *u = ctx;
    int64_t lo, hi;
    mpt_cpu_task_rows(u->batch, 1, task, u->n_tasks, &lo, &hi);
    for (int64_t b = lo; b < hi; b++)
        for (int64_t p = 0; p < u->positions; p++)
            memcpy(u->dst + (size_t)(b * u->positions + p) * u->row,
                   u->src + (size_t)((b / u->il * u->positions + p) * u->il + b % u->il) * u->row,
                   u->row);
}

void mpt_cpu_tiles_unpermute(mpt_pool *pool, const void *src, void *dst, int64_t batch,
                             int64_t positions, size_t row_bytes, int il) {
    unpermute u = {src, dst, batch, positions, row_bytes, il, 1};
    mpt_cpu_pool_rows(pool, batch, &u.n_tasks, unpermute_task, &u);
}

/* A data-gradient phase's rows (grid points, images then positions): grid
 * point (i, j) reads dy row i + a - ph for tap a and column j + b - pw for
 * tap b, zeros outside dy. NULL: out of memory. */
static mpt_cpu_krange *phase_ranges(const int64_t *q, const mpt_cpu_dgrad_phase *f) {
    int64_t grid = f->nqh * f->nqw, N = q[MPT_G_N];
    int64_t ph = f->th - 1 - f->q0h, pw = f->tw - 1 - f->q0w;
    mpt_cpu_krange *r = malloc((size_t)(N * grid) * sizeof *r);
    for (int64_t t = 0; r && t < N * grid; t++) {
        int64_t i = t % grid / f->nqw, j = t % f->nqw;
        taps_inside(i, ph, q[MPT_G_OH], f->th, &r[t].h0, &r[t].h1);
        taps_inside(j, pw, q[MPT_G_OW], f->tw, &r[t].s0, &r[t].s1);
        r[t].s0 *= q[MPT_G_O], r[t].s1 *= q[MPT_G_O];
    }
    return r;
}

/* The phases' GEMMs gathered from one zero-padded copy of dy: grid point
 * i of a phase with taps th and padding ph = th-1-q0h reads dy row
 * i + a - ph for tap a, which in a copy with `top` rows of zeros in front
 * (top = the largest ph) is row i + a - ph + top >= 0. Tables of every
 * phase with work, in mpt_cpu_run_dgrad's order (emit_cols.c). */
int mpt_cpu_dgrad_gather_plan(mpt_cpu_kx *x, int64_t es, int tiles, int64_t ys, char *err,
                              size_t n) {
    const int64_t *q = x->geom;
    int64_t N = q[MPT_G_N], O = q[MPT_G_O], OH = q[MPT_G_OH], OW = q[MPT_G_OW];
    int64_t top = 0, left = 0, rows = 0, cols = 0;
    for (int pass = 0; pass < 2; pass++) {
        int64_t hp = top + OH, wp = left + OW;
        for (int64_t rh = 0; rh < q[MPT_G_SH]; rh++)
            for (int64_t rw = 0; rw < q[MPT_G_SW]; rw++) {
                mpt_cpu_dgrad_phase f = mpt_cpu_dgrad_phase_of(q, rh, rw);
                if (f.nqh * f.nqw == 0 || f.th * f.tw == 0) continue;
                int64_t ph = f.th - 1 - f.q0h, pw = f.tw - 1 - f.q0w;
                if (!pass) {
                    top = ph > top ? ph : top;
                    left = pw > left ? pw : left;
                    rows += N * f.nqh * f.nqw;
                    cols += f.th * f.tw * O;
                } else {
                    int64_t eh = f.nqh - 1 + f.th - ph + top, ew = f.nqw - 1 + f.tw - pw + left;
                    hp = eh > hp ? eh : hp;
                    wp = ew > wp ? ew : wp;
                }
            }
        int64_t pad[10] = {N, OH, OW, O, top, left, hp, wp, es, tiles};
        memcpy(x->pad, pad, sizeof pad);
    }
    int64_t hp = x->pad[MPT_CPU_PAD_HP], wp = x->pad[MPT_CPU_PAD_WP];
    /* tiles: the last tile's second half reads 16 rows past the end */
    int64_t *row = malloc((size_t)(rows + 32) * 8), *col = malloc((size_t)(cols + 1) * 8);
    int64_t *kr = calloc((size_t)(rows + 1), 32);
    x->g_row = row;
    x->g_col = col;
    x->g_krange = kr;
    /* each GEMM row's dx position: tiles store their rows there (desc.c_rows),
     * and so do gathered rows of a stride phase or in image-by-image order
     * (mpt_cpu_kx.dgrad_rows) */
    int64_t *crow = x->g_crow = malloc((size_t)rows * 8);
    if (!row || !col || !kr || !crow) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    /* one way of skipping for every phase (the scatter's order) */
    int64_t cost[MPT_CPU_SKIP_COUNT] = {0, 0, 0}, nominal = 0;
    for (int64_t rh = 0; rh < q[MPT_G_SH] && !tiles; rh++)
        for (int64_t rw = 0; rw < q[MPT_G_SW]; rw++) {
            mpt_cpu_dgrad_phase f = mpt_cpu_dgrad_phase_of(q, rh, rw);
            if (f.nqh * f.nqw == 0 || f.th * f.tw == 0) continue;
            mpt_cpu_krange *r = phase_ranges(q, &f);
            if (!r) {
                snprintf(err, n, "out of memory");
                return -1;
            }
            for (int how = 0; how < MPT_CPU_SKIP_COUNT; how++)
                cost[how] += mpt_cpu_krange_cost(r, N, f.nqh * f.nqw, f.tw * O, how);
            nominal += mpt_cpu_krange_nominal(N * f.nqh * f.nqw, f.th * f.tw * O);
            free(r);
        }
    int how = tiles ? MPT_CPU_SKIP_ROWS : mpt_cpu_krange_choose(cost);
    x->g_il = how == MPT_CPU_SKIP_IMAGES ? N : 0;
    x->g_skip = tiles ? -1 : how;
    x->g_kpct = nominal > 0 ? (int)(100 * cost[how] / nominal) : 100;
    for (int64_t rh = 0; rh < q[MPT_G_SH]; rh++)
        for (int64_t rw = 0; rw < q[MPT_G_SW]; rw++) {
            mpt_cpu_dgrad_phase f = mpt_cpu_dgrad_phase_of(q, rh, rw);
            if (f.nqh * f.nqw == 0 || f.th * f.tw == 0) continue;
            int64_t ph = f.th - 1 - f.q0h, pw = f.tw - 1 - f.q0w;
            if (tiles) {
                /* rows in (N/IL, i, j, IL) order, in the interleaved copy */
                for (int64_t bi = 0; bi < N / tiles; bi++)
                    for (int64_t i = 0; i < f.nqh; i++)
                        for (int64_t j = 0; j < f.nqw; j++)
                            for (int64_t b = 0; b < tiles; b++)
                            {
                                *row++ = (((bi * hp + i - ph + top) * wp + j - pw + left) * tiles +
                                          b) * O * es;
                                int64_t ih = (f.q0h + i) * q[MPT_G_SH] + rh - q[MPT_G_PH];
                                int64_t iw = (f.q0w + j) * q[MPT_G_SW] + rw - q[MPT_G_PW];
                                *crow++ = (((bi * tiles + b) * q[MPT_G_H] + ih) * q[MPT_G_W] + iw) *
                                          q[MPT_G_C] * ys;
                            }
                for (int64_t a = 0; a < f.th; a++)
                    for (int64_t bb = 0; bb < f.tw; bb++)
                        for (int64_t o = 0; o < O; o++)
                            *col++ = ((a * wp + bb) * tiles * O + o) * es;
                continue;
            }
            /* taps whose dy row or column is outside dy are zeros */
            int64_t grid = f.nqh * f.nqw;
            mpt_cpu_krange *r = phase_ranges(q, &f);
            if (!r) {
                snprintf(err, n, "out of memory");
                return -1;
            }
            mpt_cpu_krange_write(r, N, grid, f.tw * O, how, kr);
            free(r);
            kr += 4 * N * grid;
            for (int64_t t = 0; t < N * grid; t++) {
                int64_t b = x->g_il ? t % N : t / grid, at = x->g_il ? t / N : t % grid;
                int64_t i = at / f.nqw, j = at % f.nqw;
                *row++ = ((b * hp + i - ph + top) * wp + j - pw + left) * O * es;
                int64_t ih = (f.q0h + i) * q[MPT_G_SH] + rh - q[MPT_G_PH];
                int64_t iw = (f.q0w + j) * q[MPT_G_SW] + rw - q[MPT_G_PW];
                *crow++ = ((b * q[MPT_G_H] + ih) * q[MPT_G_W] + iw) * q[MPT_G_C] * ys;
            }
            for (int64_t a = 0; a < f.th; a++)
                for (int64_t bb = 0; bb < f.tw; bb++)
                    for (int64_t o = 0; o < O; o++) *col++ = ((a * wp + bb) * O + o) * es;
        }
    for (int i = 0; i < 32; i++) row[i] = x->g_row[0];
    x->g_step = mpt_cpu_gather_row_step(x->g_row, rows);
    if (tiles) {
        free(x->g_krange);
        x->g_krange = NULL;
    }
    return gather_pad_slot(x, err, n);
}
