/* runtime/data/augment.c — image augmentation on the host: Keras 3's
 * random_flip, random_translation, random_rotation and random_contrast
 * (parsed by augment_parse.c) applied to the images of each training batch.
 *
 * Images are f32 (h,w,c), pixel (y,x) at (y*w + x)*c. The geometric layers
 * are Keras' affine_transform: output pixel (x,y) reads the input at
 * (a0 x + a1 y + a2, b0 x + b1 y + b2), in pixel units with no half-pixel
 * offset.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "runtime/data/augment_impl.h"

#define TWO_PI 6.283185307179586

/* ---- checking a data set ------------------------------------------------------ */

static int64_t isqrt_exact(int64_t v) {
    int64_t r = (int64_t)llround(sqrt((double)v));
    return r * r == v ? r : 0;
}

int mpt_augment_check(const mpt_augment *a, const mpt_dataset *d, char *err, size_t n) {
    if (mpt_augment_count(a) == 0)
        return 0;
    if (mpt_data_input_dtype(d) != MPT_DT_F32)
        return mpt_data_fail(err, n, "augment: the data set's inputs are tokens (i32), not "
                             "images\n  hint: augmentation works on image data (fashion_mnist, "
                             "images(...), idx(...)); remove augment");
    mpt_shape s = mpt_data_sample_shape(d);
    if (s.rank == 3)
        return 0;
    char shape[96] = "[";
    int64_t numel = 1;
    for (int i = 0; i < s.rank; i++) {
        numel *= s.dim[i];
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", i ? "," : "",
                 (long long)s.dim[i]);
    }
    /* Suggest the square grayscale or RGB image with as many values. */
    int64_t g = isqrt_exact(numel), rgb = numel % 3 ? 0 : isqrt_exact(numel / 3);
    char example[64] = "[height,width,channels]";
    if (g || rgb)
        snprintf(example, sizeof example, "[%lld,%lld,%d]", (long long)(g ? g : rgb),
                 (long long)(g ? g : rgb), g ? 1 : 3);
    return mpt_data_fail(err, n, "augment: the model's input is %s], not an image "
                         "[height,width,channels]\n  hint: give the model an image input, "
                         "e.g. %s", shape, example);
}

/* ---- transforms ---------------------------------------------------------------- */

/* Uniform in [lo, hi): 53 random bits. */
static double uniform(mpt_data_rng *r, double lo, double hi) {
    double u = (double)(mpt_data_rng_next(r) >> 11) * 0x1p-53;
    return lo + (hi - lo) * u;
}

/* The generator of layer k for one sample: a function of the sample's
 * identity only (see data.h, Determinism). */
static void op_rng(mpt_data_rng *r, const aug_op *op, int k, uint64_t seed, int64_t epoch,
                   int64_t sample) {
    uint64_t key = mpt_data_mix64(seed ^ 0x6175676d656e74ull); /* "augment" */
    key = mpt_data_mix64(key + (uint64_t)epoch);
    key = mpt_data_mix64(key + (uint64_t)sample);
    key = mpt_data_mix64(key + (uint64_t)k) ^ mpt_data_mix64(op->seed);
    mpt_data_rng_seed(r, key);
}

/* Keras 3 flips both axes on one draw for "horizontal_and_vertical" (so an
 * image is either flipped both ways or not at all); here each axis has its
 * own draw, as tf.keras 2 did, which gives all four orientations. */
static void flip(float *img, int64_t h, int64_t w, int64_t c, int fh, int fv) {
    for (int64_t y = 0; fh && y < h; y++) {
        float *row = img + y * w * c;
        for (int64_t x = 0; x < w / 2; x++)
            for (int64_t k = 0; k < c; k++) {
                float t = row[x * c + k];
                row[x * c + k] = row[(w - 1 - x) * c + k];
                row[(w - 1 - x) * c + k] = t;
            }
    }
    for (int64_t y = 0; fv && y < h / 2; y++) {
        float *a = img + y * w * c, *b = img + (h - 1 - y) * w * c;
        for (int64_t k = 0; k < w * c; k++) {
            float t = a[k];
            a[k] = b[k];
            b[k] = t;
        }
    }
}

/* Where integer tap i of a row or column of length len reads; -1 for the
 * fill value. reflect is "d c b a | a b c d | d c b a" (period 2 len).
 * Mapping each tap, as Keras' JAX backend does, rather than the coordinate
 * as TensorFlow's kernel does, differs only for wrap in the half pixel past
 * the last one. */
static int64_t tap_outside(int64_t i, int64_t len, fill_mode m) {
    switch (m) {
    case FILL_CONSTANT: return -1;
    case FILL_NEAREST: return i < 0 ? 0 : len - 1;
    case FILL_WRAP: return ((i % len) + len) % len;
    case FILL_REFLECT: {
        int64_t p = ((i % (2 * len)) + 2 * len) % (2 * len);
        return p < len ? p : 2 * len - 1 - p;
    }
    }
    return -1;
}

static inline int64_t tap(int64_t i, int64_t len, fill_mode m) {
    return i >= 0 && i < len ? i : tap_outside(i, len, m);
}

typedef struct {
    double a0, a1, a2, b0, b1, b2;
} affine;

/* floor and round (half away from zero) to integers: libm's floor and
 * round are calls on baseline x86-64, and warp makes four per pixel. */
static int64_t ifloor(double v) {
    int64_t i = (int64_t)v;
    return i - (v < (double)i);
}
static int64_t iround(double v) { return v >= 0 ? ifloor(v + 0.5) : -ifloor(0.5 - v); }

/* The two taps a coordinate reads and the weight of the second; nearest
 * interpolation reads one tap with weight 1 (t1 = t0, f = 0). */
typedef struct {
    int64_t t0, t1;
    float f;
} taps;

static inline taps taps_at(double v, int64_t len, const aug_op *op) {
    if (op->nearest) {
        int64_t t = tap(iround(v), len, op->fill);
        return (taps){t, t, 0};
    }
    int64_t i = ifloor(v);
    return (taps){tap(i, len, op->fill), tap(i + 1, len, op->fill), (float)(v - (double)i)};
}

/* The pixel (h,w,c) tap (tx, ty) reads: fill (c floats) outside. */
static inline const float *texel(const float *in, int64_t w, int64_t c, int64_t tx,
                                 int64_t ty, const float *fill) {
    return tx < 0 || ty < 0 ? fill : in + (ty * w + tx) * c;
}

/* o (c floats) = the bilinear blend of the four taps, as TensorFlow's
 * ImageProjectiveTransform computes it: exact when both weights are 0. */
static inline void blend(const float *in, int64_t w, int64_t c, taps x, taps y,
                         const float *fill, float *o) {
    const float *p00 = texel(in, w, c, x.t0, y.t0, fill), *p01 = texel(in, w, c, x.t1, y.t0, fill);
    const float *p10 = texel(in, w, c, x.t0, y.t1, fill), *p11 = texel(in, w, c, x.t1, y.t1, fill);
    for (int64_t k = 0; k < c; k++) {
        float top = (1 - x.f) * p00[k] + x.f * p01[k];
        float bot = (1 - x.f) * p10[k] + x.f * p11[k];
        o[k] = (1 - y.f) * top + y.f * bot;
    }
}

/* out (h,w,c) from in (h,w,c) through t, as affine_transform does. A pure
 * translation reads the same column taps on every row: they are worked
 * out once (cols, w entries). */
static void warp(const float *in, float *out, int64_t h, int64_t w, int64_t c, affine t,
                 const aug_op *op) {
    float fill_buf[16];
    float *fill = c <= 16 ? fill_buf : malloc(sizeof *fill * (size_t)c);
    for (int64_t k = 0; k < c; k++)
        fill[k] = op->fill_value;
    int shift = t.a0 == 1 && t.a1 == 0 && t.b0 == 0 && t.b1 == 1;
    taps *cols = shift ? malloc(sizeof *cols * (size_t)w) : NULL;
    for (int64_t x = 0; shift && x < w; x++)
        cols[x] = taps_at((double)x + t.a2, w, op);
    for (int64_t y = 0; y < h; y++) {
        taps row = taps_at((double)y + t.b2, h, op);
        for (int64_t x = 0; x < w; x++) {
            double xd = (double)x, yd = (double)y;
            taps tx = shift ? cols[x] : taps_at(t.a0 * xd + t.a1 * yd + t.a2, w, op);
            taps ty = shift ? row : taps_at(t.b0 * xd + t.b1 * yd + t.b2, h, op);
            blend(in, w, c, tx, ty, fill, out + (y * w + x) * c);
        }
    }
    free(cols);
    if (fill != fill_buf)
        free(fill);
}

/* Keras' translation matrix: a shift of (dx, dy) pixels reads (x-dx, y-dy). */
static affine translation(double dx, double dy) { return (affine){1, 0, -dx, 0, 1, -dy}; }

/* Keras' rotation matrix: counter-clockwise by angle about the center
 * ((w-1)/2, (h-1)/2), so a quarter turn of a square moves pixels exactly. */
static affine rotation(double angle, int64_t h, int64_t w) {
    double c = cos(angle), s = sin(angle), wm = (double)(w - 1), hm = (double)(h - 1);
    return (affine){c, -s, (wm - (c * wm - s * hm)) / 2, s, c, (hm - (s * wm + c * hm)) / 2};
}

/* Per channel (x - mean over h,w) * factor + mean, clipped to value_range.
 * Keras clips to its default value_range (0, 255); our pixels are in
 * [0, 1], so that is the default here. */
static void contrast(float *img, int64_t hw, int64_t c, float factor, const float range[2]) {
    /* Pixel-major passes: a channel-major walk strides through memory. */
    double sum_buf[16];
    double *sum = c <= 16 ? sum_buf : malloc(sizeof *sum * (size_t)c);
    float mean_buf[16];
    float *mean = c <= 16 ? mean_buf : malloc(sizeof *mean * (size_t)c);
    for (int64_t k = 0; k < c; k++)
        sum[k] = 0;
    for (int64_t i = 0; i < hw; i++)
        for (int64_t k = 0; k < c; k++)
            sum[k] += img[i * c + k];
    for (int64_t k = 0; k < c; k++)
        mean[k] = (float)(sum[k] / (double)hw);
    for (int64_t i = 0; i < hw; i++)
        for (int64_t k = 0; k < c; k++) {
            float v = (img[i * c + k] - mean[k]) * factor + mean[k];
            img[i * c + k] = v < range[0] ? range[0] : v > range[1] ? range[1] : v;
        }
    if (sum != sum_buf) {
        free(sum);
        free(mean);
    }
}

void mpt_augment_image(const mpt_augment *a, float *img, int64_t h, int64_t w, int64_t c,
                       uint64_t seed, int64_t epoch, int64_t sample, float *scratch) {
    float *cur = img, *other = scratch;
    for (int k = 0; a && k < a->n; k++) {
        const aug_op *op = &a->ops[k];
        mpt_data_rng r;
        op_rng(&r, op, k, seed, epoch, sample);
        affine t;
        switch (op->kind) {
        case AUG_FLIP: {
            /* Keras flips where uniform() <= 0.5. */
            int fh = uniform(&r, 0, 1) <= 0.5, fv = uniform(&r, 0, 1) <= 0.5;
            flip(cur, h, w, c, op->flip_h && fh, op->flip_v && fv);
            continue;
        }
        case AUG_CONTRAST:
            contrast(cur, h * w, c, (float)uniform(&r, op->lo[0], op->hi[0]), op->range);
            continue;
        case AUG_TRANSLATION: {
            double dy = uniform(&r, op->lo[0], op->hi[0]) * (double)h;
            double dx = uniform(&r, op->lo[1], op->hi[1]) * (double)w;
            t = translation(dx, dy);
            break;
        }
        case AUG_ROTATION:
            t = rotation(uniform(&r, op->lo[0], op->hi[0]) * TWO_PI, h, w);
            break;
        }
        warp(cur, other, h, w, c, t, op);
        float *swap = cur;
        cur = other;
        other = swap;
    }
    if (cur != img)
        memcpy(img, cur, sizeof *img * (size_t)(h * w * c));
}

/* ---- batches ----------------------------------------------------------------- */

typedef struct {
    const mpt_augment *a;
    float *x;            /* rows (h,w,c) */
    const int64_t *ids;  /* each row's sample id */
    int64_t rows, h, w, c, epoch;
    uint64_t seed;
    int first, stride;   /* this thread's rows: first, first + stride, ... */
} row_job;

static void *augment_rows(void *arg) {
    row_job *j = arg;
    int64_t size = j->h * j->w * j->c;
    float *scratch = malloc(sizeof *scratch * (size_t)size);
    for (int64_t r = j->first; r < j->rows; r += j->stride)
        mpt_augment_image(j->a, j->x + r * size, j->h, j->w, j->c, j->seed, j->epoch, j->ids[r],
                          scratch);
    free(scratch);
    return NULL;
}

static int default_threads(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long t = cores / 2;
    return t < 1 ? 1 : t > 4 ? 4 : (int)t;
}

/* Rows are dealt round-robin to threads; a thread that cannot start leaves
 * its rows to the calling thread. */
static void augment_rows_parallel(row_job base, int threads) {
    if (threads > base.rows)
        threads = (int)base.rows;
    if (threads < 1)
        threads = 1;
    row_job jobs[64];
    pthread_t tid[64];
    int started[64] = {0};
    if (threads > 64)
        threads = 64;
    for (int t = 0; t < threads; t++) {
        jobs[t] = base;
        jobs[t].first = t;
        jobs[t].stride = threads;
        if (t > 0)
            started[t] = pthread_create(&tid[t], NULL, augment_rows, &jobs[t]) == 0;
    }
    augment_rows(&jobs[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t])
            MPT_DATA_CHECK(pthread_join(tid[t], NULL));
        else
            augment_rows(&jobs[t]);
    }
}

int mpt_augment_batch(const mpt_augment *a, mpt_dataset *d, uint64_t seed, int64_t epoch,
                      int64_t index, int64_t batch_size, int threads, mpt_tensor *x,
                      mpt_tensor *y, int64_t *n_real, char *err, size_t n) {
    int64_t real = 0;
    if (mpt_augment_check(a, d, err, n))
        return -1;
    if (mpt_data_batch(d, index, batch_size, x, y, &real, err, n))
        return -1;
    if (n_real)
        *n_real = real;
    if (mpt_augment_count(a) == 0 || real == 0)
        return 0;
    mpt_shape s = mpt_data_sample_shape(d);
    int64_t *ids = malloc(sizeof *ids * (size_t)real);
    for (int64_t r = 0; r < real; r++)
        ids[r] = mpt_data_sample_id(d, index * batch_size + r);
    row_job job = {.a = a, .x = x->data, .ids = ids, .rows = real, .h = s.dim[0],
                   .w = s.dim[1], .c = s.dim[2], .epoch = epoch, .seed = seed};
    augment_rows_parallel(job, threads > 0 ? threads : default_threads());
    free(ids);
    return 0;
}
