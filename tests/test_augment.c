/* tests/test_augment.c — image augmentation (runtime/data/augment*.c) and
 * the batch prefetcher (runtime/data/prefetch.c): each layer against pixels
 * worked out by hand, determinism, the prefetcher against the synchronous
 * path, the parser's messages and the data-set check.
 *
 * A factor given as a pair [f, f] makes a draw exact (lo + (hi-lo)*u = lo),
 * so shifts and angles can be fixed through the public API. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "runtime/data/data.h"
#include "tests/check.h"

static char err[2048];

static mpt_augment *parse(const char *text) {
    mpt_augment *a = NULL;
    int rc = mpt_augment_parse(text, &a, err, sizeof err);
    CHECK_MSG(rc == 0 && a, "%s: %s", text, err);
    return a;
}

/* Augments a copy of img (h,w,c) with text as sample `sample` of epoch 0. */
static void augment(const char *text, const float *img, float *out, int64_t h, int64_t w,
                    int64_t c, int64_t sample) {
    mpt_augment *a = parse(text);
    float *scratch = malloc(sizeof(float) * (size_t)(h * w * c));
    memcpy(out, img, sizeof(float) * (size_t)(h * w * c));
    if (a)
        mpt_augment_image(a, out, h, w, c, 7, 0, sample, scratch);
    free(scratch);
    mpt_augment_free(a);
}

static int same(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

static void check_row(const char *text, const float *img, int64_t h, int64_t w,
                      const float *want) {
    float out[16];
    augment(text, img, out, h, w, 1, 0);
    int ok = same(out, want, h * w);
    CHECK_MSG(ok, "%s: got %g %g %g %g, want %g %g %g %g", text, out[0], out[1], out[2],
              out[3], want[0], want[1], want[2], want[3]);
}

/* ---- flips ----------------------------------------------------------------- */

static void test_flip(void) {
    /* 2x3 image, 2 channels: value = 10*y + x + 0.5*channel */
    float img[12], mirror[12], upside[12], out[12];
    for (int y = 0; y < 2; y++)
        for (int x = 0; x < 3; x++)
            for (int k = 0; k < 2; k++) {
                img[(y * 3 + x) * 2 + k] = 10.0f * y + x + 0.5f * k;
                mirror[(y * 3 + (2 - x)) * 2 + k] = 10.0f * y + x + 0.5f * k;
                upside[((1 - y) * 3 + x) * 2 + k] = 10.0f * y + x + 0.5f * k;
            }
    int flipped = 0, kept = 0, vflipped = 0;
    for (int s = 0; s < 64; s++) {
        augment("[random_flip(\"horizontal\")]", img, out, 2, 3, 2, s);
        flipped += same(out, mirror, 12);
        kept += same(out, img, 12);
        augment("[random_flip(mode='vertical')]", img, out, 2, 3, 2, s);
        vflipped += same(out, upside, 12);
    }
    CHECK_MSG(flipped + kept == 64, "horizontal flip gave other images: %d + %d", flipped, kept);
    CHECK_MSG(flipped > 16 && kept > 16, "flipped %d of 64", flipped);
    CHECK_MSG(vflipped > 16 && vflipped < 48, "vertical: flipped %d of 64", vflipped);

    /* horizontal_and_vertical draws each axis on its own: all four occur */
    int seen[4] = {0};
    for (int s = 0; s < 64; s++) {
        augment("random_flip", img, out, 2, 3, 2, s);
        float both[12];
        for (int y = 0; y < 2; y++)
            for (int x = 0; x < 3; x++)
                for (int k = 0; k < 2; k++)
                    both[(y * 3 + x) * 2 + k] = mirror[((1 - y) * 3 + x) * 2 + k];
        seen[0] += same(out, img, 12);
        seen[1] += same(out, mirror, 12);
        seen[2] += same(out, upside, 12);
        seen[3] += same(out, both, 12);
    }
    CHECK_MSG(seen[0] + seen[1] + seen[2] + seen[3] == 64 && seen[0] && seen[1] && seen[2] &&
              seen[3], "orientations %d %d %d %d", seen[0], seen[1], seen[2], seen[3]);
}

/* ---- translation ----------------------------------------------------------- */

static void test_translation(void) {
    const float row[4] = {1, 2, 3, 4}; /* a b c d */
    static const struct {
        const char *fill;
        float right2[4], left3[4]; /* shifted by +2 and by -3 pixels */
    } cases[] = {
        {"reflect", {2, 1, 1, 2}, {4, 4, 3, 2}},  /* ... b a | a b c d | d c b ... */
        {"wrap", {3, 4, 1, 2}, {4, 1, 2, 3}},
        {"constant", {9, 9, 1, 2}, {4, 9, 9, 9}}, /* fill_value=9 */
        {"nearest", {1, 1, 1, 2}, {4, 4, 4, 4}},
    };
    char text[256];
    for (int i = 0; i < 4; i++)
        for (int nearest = 0; nearest < 2; nearest++) {
            const char *interp = nearest ? "nearest" : "bilinear";
            /* along the width: a 1x4 image; width 4 * 0.5 = 2 pixels */
            snprintf(text, sizeof text, "[random_translation([0,0], [0.5,0.5], fill_mode=\"%s\", "
                     "interpolation=\"%s\", fill_value=9)]", cases[i].fill, interp);
            check_row(text, row, 1, 4, cases[i].right2);
            snprintf(text, sizeof text, "[random_translation(0, (-0.75, -0.75), \"%s\", \"%s\", "
                     "None, 9)]", cases[i].fill, interp);
            check_row(text, row, 1, 4, cases[i].left3);
            /* along the height: a 4x1 image */
            snprintf(text, sizeof text, "[random_translation([0.5,0.5], 0, fill_mode=%s, "
                     "interpolation=%s, fill_value=9.0)]", cases[i].fill, interp);
            check_row(text, row, 4, 1, cases[i].right2);
        }

    /* both axes and two channels: down 1, left 2, wrapped */
    float img[32], out[32];
    for (int i = 0; i < 32; i++)
        img[i] = (float)i;
    augment("[random_translation([0.25,0.25], [-0.5,-0.5], fill_mode=\"wrap\")]", img, out, 4, 4,
            2, 3);
    int ok = 1;
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 4; x++)
            for (int k = 0; k < 2; k++)
                ok &= out[(y * 4 + x) * 2 + k] == img[(((y + 3) % 4) * 4 + (x + 2) % 4) * 2 + k];
    CHECK_MSG(ok, "2-D wrapped shift");

    /* half a pixel right, bilinear: neighbours averaged, the reflected
     * edge reads a twice */
    const float half_reflect[4] = {1, 1.5f, 2.5f, 3.5f}, half_constant[4] = {5, 1.5f, 2.5f, 3.5f};
    check_row("[random_translation(0, [0.125,0.125])]", row, 1, 4, half_reflect);
    check_row("[random_translation(0, [0.125,0.125], 'constant', fill_value=9)]", row, 1, 4,
              half_constant);
}

/* ---- rotation -------------------------------------------------------------- */

static void test_rotation(void) {
    float img[16], out[16];
    for (int i = 0; i < 16; i++)
        img[i] = (float)(i + 1);
    /* a quarter turn counter-clockwise: the top-right corner comes to the
     * top left, out[y][x] = in[x][3-y] */
    augment("[random_rotation([0.25,0.25], interpolation=\"nearest\")]", img, out, 4, 4, 1, 0);
    int ok = 1;
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 4; x++)
            ok &= out[y * 4 + x] == img[x * 4 + (3 - y)];
    CHECK_MSG(ok, "quarter turn counter-clockwise (nearest)");
    CHECK(out[0] == 4);
    /* clockwise, bilinear: out[y][x] = in[3-x][y], up to rounding of cos */
    augment("[random_rotation([-0.25,-0.25])]", img, out, 4, 4, 1, 0);
    for (int y = 0; y < 4; y++)
        for (int x = 0; x < 4; x++)
            CHECK_NEAR(out[y * 4 + x], img[(3 - x) * 4 + y], 1e-5, 0);
    /* a half turn of a 3x5 image about its center (2, 1) */
    float wide[15], turned[15];
    for (int i = 0; i < 15; i++)
        wide[i] = (float)i;
    augment("[random_rotation((0.5, 0.5), 'constant', 'nearest')]", wide, turned, 3, 5, 1, 0);
    ok = 1;
    for (int i = 0; i < 15; i++)
        ok &= turned[i] == wide[14 - i];
    CHECK_MSG(ok, "half turn of a 3x5 image");
}

/* ---- contrast -------------------------------------------------------------- */

static void test_contrast(void) {
    /* 3x3, 2 channels, values in [0.3, 0.7]: factors in [0.5, 1.5] never
     * leave [0, 1], so nothing is clipped */
    float img[18], out[18];
    for (int i = 0; i < 18; i++)
        img[i] = 0.3f + 0.4f * (float)((i * 7) % 9) / 8.0f;
    double factors[3];
    for (int s = 0; s < 3; s++) {
        augment("[random_contrast(0.5)]", img, out, 3, 3, 2, s);
        float mean[2] = {0, 0};
        for (int i = 0; i < 18; i++)
            mean[i % 2] += img[i] / 9.0f;
        /* the factor, from a pixel far from its mean (0.3; the mean is 0.5) */
        double f = (out[0] - mean[0]) / (img[0] - mean[0]);
        factors[s] = f;
        CHECK_MSG(f >= 0.5 && f < 1.5, "factor %g", f);
        for (int i = 0; i < 18; i++)
            CHECK_NEAR(out[i], (img[i] - mean[i % 2]) * f + mean[i % 2], 1e-6, 0);
    }
    CHECK(factors[0] != factors[1] && factors[1] != factors[2]);
    /* factor 0 changes nothing but the clip to value_range */
    augment("[random_contrast(0, value_range=[0.4, 0.6])]", img, out, 3, 3, 2, 0);
    for (int i = 0; i < 18; i++)
        CHECK(out[i] == (img[i] < 0.4f ? 0.4f : img[i] > 0.6f ? 0.6f : img[i]));
}

/* ---- determinism ------------------------------------------------------------ */

static void test_determinism(void) {
    enum { H = 6, W = 7, C = 3, N = H * W * C };
    float img[N], a[N], b[N], scratch[N];
    for (int i = 0; i < N; i++)
        img[i] = (float)((i * 37) % 101) / 100.0f;
    mpt_augment *aug = parse("[random_flip(), random_translation(0.2, 0.2), "
                             "random_rotation(0.1), random_contrast(0.3)]");
    CHECK(mpt_augment_count(aug) == 4);
#define RUN(out, seed, epoch, sample)                                                   \
    (memcpy(out, img, sizeof img), mpt_augment_image(aug, out, H, W, C, seed, epoch, sample, \
                                                     scratch))
    RUN(a, 1, 3, 17);
    RUN(b, 1, 3, 17);
    CHECK_MSG(same(a, b, N), "same seed, epoch and sample must give the same image");
    CHECK(!same(a, img, N));
    RUN(b, 1, 4, 17);
    CHECK_MSG(!same(a, b, N), "another epoch must draw again");
    RUN(b, 1, 3, 18);
    CHECK_MSG(!same(a, b, N), "another sample must draw again");
    RUN(b, 2, 3, 17);
    CHECK_MSG(!same(a, b, N), "another seed must draw again");
#undef RUN
    /* seed= of a layer varies its draws */
    mpt_augment *seeded = parse("[random_flip(seed=5), random_translation(0.2, 0.2, seed=5), "
                                "random_rotation(0.1, seed=5), random_contrast(0.3, seed=5)]");
    memcpy(b, img, sizeof img);
    mpt_augment_image(seeded, b, H, W, C, 1, 3, 17, scratch);
    CHECK(!same(a, b, N));
    mpt_augment_free(seeded);
    mpt_augment_free(aug);
}

/* ---- batches and the prefetcher --------------------------------------------- */

static mpt_tensor batch_x(int64_t bs) {
    mpt_tensor t = {.dtype = MPT_DT_F32, .shape = {.rank = 4, .dim = {bs, 8, 8, 3}}};
    t.data = calloc((size_t)(bs * 192), sizeof(float));
    return t;
}

static mpt_tensor batch_y(int64_t bs) {
    mpt_tensor t = {.dtype = MPT_DT_I32, .shape = {.rank = 1, .dim = {bs}}};
    t.data = calloc((size_t)bs, sizeof(int32_t));
    return t;
}

static void test_batches(void) {
    const mpt_shape shape = {.rank = 3, .dim = {8, 8, 3}};
    mpt_dataset *d = NULL;
    CHECK(mpt_data_open("synthetic(samples=50, seed=3)", MPT_DATA_TRAIN, shape, &d, err,
                        sizeof err) == 0);
    mpt_augment *aug = parse("[random_flip(\"horizontal\"), random_translation(0.1, 0.1), "
                             "random_rotation(0.05), random_contrast(0.2)]");
    CHECK(mpt_augment_check(aug, d, err, sizeof err) == 0);
    const int64_t bs = 16, batches = mpt_data_num_batches(d, bs, MPT_DATA_PAD_REMAINDER);
    CHECK(batches == 4);

    /* synchronous, one thread, epoch 1 */
    mpt_tensor sx[4], sy[4];
    int64_t sreal[4];
    mpt_data_shuffle(d, 11, 1);
    for (int64_t b = 0; b < batches; b++) {
        sx[b] = batch_x(bs);
        sy[b] = batch_y(bs);
        CHECK(mpt_augment_batch(aug, d, 11, 1, b, bs, 1, &sx[b], &sy[b], &sreal[b], err,
                                sizeof err) == 0);
    }
    CHECK(sreal[3] == 2);

    /* the prefetcher, three threads, double-buffered as a train loop does */
    mpt_prefetch *p = mpt_prefetch_new(d, bs, aug, 11, 3, err, sizeof err);
    CHECK(p != NULL);
    mpt_tensor px[2] = {batch_x(bs), batch_x(bs)}, py[2] = {batch_y(bs), batch_y(bs)};
    CHECK(mpt_prefetch_start(p, 1, 0, &px[0], &py[0]) == 0);
    CHECK(mpt_prefetch_start(p, 1, 1, &px[1], &py[1]) == -1); /* one in flight */
    for (int64_t b = 0; b < batches; b++) {
        int64_t real = -1;
        CHECK(mpt_prefetch_wait(p, &real, err, sizeof err) == 0);
        if (b + 1 < batches)
            CHECK(mpt_prefetch_start(p, 1, b + 1, &px[(b + 1) % 2], &py[(b + 1) % 2]) == 0);
        CHECK_MSG(real == sreal[b] && same(px[b % 2].data, sx[b].data, bs * 192) &&
                  memcmp(py[b % 2].data, sy[b].data, sizeof(int32_t) * (size_t)bs) == 0,
                  "prefetched batch %lld differs from the synchronous one", (long long)b);
    }
    CHECK(mpt_prefetch_wait(p, NULL, err, sizeof err) == -1); /* nothing started */
    /* a batch error comes back through wait */
    CHECK(mpt_prefetch_start(p, 1, 99, &px[0], &py[0]) == 0);
    CHECK(mpt_prefetch_wait(p, NULL, err, sizeof err) == -1 && strstr(err, "outside"));
    mpt_prefetch_free(p);

    /* a sample's images do not depend on the batch it falls in: sample 7 is
     * row 7 of batch 0 at size 16 and row 2 of batch 1 at size 5 */
    mpt_data_unshuffle(d);
    mpt_tensor x16 = batch_x(16), x5 = batch_x(5);
    CHECK(mpt_augment_batch(aug, d, 11, 2, 0, 16, 2, &x16, NULL, NULL, err, sizeof err) == 0);
    CHECK(mpt_augment_batch(aug, d, 11, 2, 1, 5, 1, &x5, NULL, NULL, err, sizeof err) == 0);
    CHECK(same((float *)x16.data + 7 * 192, (float *)x5.data + 2 * 192, 192));
    CHECK(mpt_data_sample_id(d, 7) == 7);
    mpt_data_shuffle(d, 11, 0);
    int64_t order[50];
    mpt_data_permutation(50, 11, 0, order);
    CHECK(mpt_data_sample_id(d, 7) == order[7]);

    for (int b = 0; b < 4; b++) {
        free(sx[b].data);
        free(sy[b].data);
    }
    for (int b = 0; b < 2; b++) {
        free(px[b].data);
        free(py[b].data);
    }
    free(x16.data);
    free(x5.data);
    mpt_augment_free(aug);
    mpt_data_free(d);
}

/* ---- checks of the data set --------------------------------------------------- */

static void expect_check_error(const char *spec, mpt_shape shape, const char *frag1,
                               const char *frag2) {
    mpt_dataset *d = NULL;
    mpt_augment *aug = parse("[random_flip()]");
    CHECK(mpt_data_open(spec, MPT_DATA_TRAIN, shape, &d, err, sizeof err) == 0);
    if (d) {
        CHECK(mpt_augment_check(aug, d, err, sizeof err) == -1);
        CHECK_MSG(strstr(err, frag1) && strstr(err, frag2), "%s: want '%s' and '%s' in: %s",
                  spec, frag1, frag2, err);
    }
    mpt_augment_free(aug);
    mpt_data_free(d);
}

static void test_check(void) {
    expect_check_error("synthetic(samples=10)", (mpt_shape){.rank = 1, .dim = {784}},
                       "input is [784], not an image", "[28,28,1]");
    expect_check_error("synthetic(samples=10)", (mpt_shape){.rank = 1, .dim = {3072}},
                       "input is [3072]", "[32,32,3]");
    expect_check_error("synthetic(samples=10, dtype=i32)", (mpt_shape){.rank = 1, .dim = {16}},
                       "tokens", "remove augment");
    /* an empty list asks nothing of the data */
    mpt_augment *none = parse("[]");
    mpt_dataset *d = NULL;
    CHECK(mpt_data_open("synthetic(samples=10)", MPT_DATA_TRAIN,
                        (mpt_shape){.rank = 1, .dim = {784}}, &d, err, sizeof err) == 0);
    CHECK(mpt_augment_count(none) == 0 && mpt_augment_check(none, d, err, sizeof err) == 0);
    mpt_augment *flip = parse("random_flip");
    mpt_tensor x = {.dtype = MPT_DT_F32, .shape = {.rank = 2, .dim = {4, 784}}};
    x.data = calloc(4 * 784, sizeof(float));
    CHECK(mpt_augment_batch(flip, d, 1, 0, 0, 4, 0, &x, NULL, NULL, err, sizeof err) == -1);
    free(x.data);
    mpt_augment_free(flip);
    mpt_augment_free(none);
    mpt_data_free(d);
}

/* ---- the parser ------------------------------------------------------------------ */

static void test_parse(void) {
    static const struct {
        const char *text, *frag1, *frag2;
    } bad[] = {
        {"[random_flip(\"sideways\")]", "random_flip: unknown mode 'sideways'",
         "hint: horizontal, vertical or horizontal_and_vertical"},
        {"[random_flp()]", "unknown augmentation 'random_flp'", "did you mean random_flip?"},
        {"[RandomRotation(0.1)]", "unknown augmentation 'RandomRotation'",
         "did you mean random_rotation?"},
        {"[random_zoom(0.1)]", "unknown augmentation 'random_zoom'", "random_contrast"},
        {"[random_crop(24, 24)]", "random_crop is not supported", "use random_translation"},
        {"[random_translation(0.1)]", "random_translation: missing argument width_factor",
         "random_translation(0.1, 0.1)"},
        {"[random_translation(1.5, 0.1)]", "random_translation: height_factor must be",
         "not 1.5"},
        {"[random_translation(0.1, [0.1, 0.2, 0.3])]", "width_factor must be", "[lo, hi]"},
        {"[random_rotation(0.1, fill_mode=\"mirror\")]",
         "random_rotation: unknown fill_mode 'mirror'", "reflect, wrap, constant or nearest"},
        {"[random_rotation(0.1, interpolation=cubic)]", "unknown interpolation cubic",
         "bilinear or nearest"},
        {"[random_contrast(1.5)]", "random_contrast: factor must be", "[0.8, 1.2]"},
        {"[random_contrast(0.2, foo=1)]", "random_contrast: unknown argument 'foo'",
         "factor, value_range, seed"},
        {"[random_contrast(factor=0.2, 0.1)]", "positional argument after a named one", ""},
        {"[random_flip(mode=\"vertical\", mode=\"horizontal\")]", "mode given twice", ""},
        {"[random_flip(\"horizontal\", 1, 2)]", "random_flip: too many arguments", ""},
        {"[random_flip(seed=-1)]", "seed must be a non-negative integer", ""},
        {"[random_flip(\"horizontal\"", "expected ',' or ')' at column 26", "^"},
        {"[random_flip() random_contrast(0.1)]", "expected ',' or ']' at column 16", ""},
        {"[random_flip(), 3]", "expected an augmentation", ""},
        {"random_flip, random_flip(", "expected a number", ""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mpt_augment *a = (mpt_augment *)1;
        int rc = mpt_augment_parse(bad[i].text, &a, err, sizeof err);
        CHECK_MSG(rc == -1 && a == NULL, "%s parsed", bad[i].text);
        CHECK_MSG(strstr(err, bad[i].frag1) && strstr(err, bad[i].frag2),
                  "%s: want '%s' and '%s' in: %s", bad[i].text, bad[i].frag1, bad[i].frag2, err);
    }
    static const struct {
        const char *text;
        int count;
    } good[] = {
        {"[]", 0},
        {"  ", 0},
        {"random_flip", 1},
        {"[random_flip(\"horizontal\"), random_translation(0.1, 0.1), random_rotation(0.05), "
         "random_contrast(0.2)]", 4},
        {"[\n  random_flip('horizontal_and_vertical'),\n  random_rotation((-0.1, 0.2), "
         "'wrap', 'nearest', 42, 0.5),\n]", 2},
        {"random_translation(height_factor=-0.2, width_factor=[0.1, -0.3], seed=None), "
         "random_contrast([0.1, 0.4], [0, 1])", 2},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        mpt_augment *a = parse(good[i].text);
        CHECK_MSG(mpt_augment_count(a) == good[i].count, "%s: %d augmentations", good[i].text,
                  mpt_augment_count(a));
        mpt_augment_free(a);
    }
    CHECK(mpt_augment_count(NULL) == 0);
}

int main(void) {
    test_flip();
    test_translation();
    test_rotation();
    test_contrast();
    test_determinism();
    test_batches();
    test_check();
    test_parse();
    return check_exit("test_augment");
}
