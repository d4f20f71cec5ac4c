/* tests/test_data.c — the data pipeline: specs, shuffling, synthetic data,
 * IDX files (real and damaged), Fashion-MNIST. Image folders are
 * tests/test_data_images.c's, text tests/test_data_text.c's. Fixtures are
 * written into a fresh temporary directory at run time. */
#include "tests/data_check.h"

/* ---- specs ----------------------------------------------------------- */

static void test_specs(void) {
    mpt_data_spec s;
    CHECK(mpt_data_spec_parse("fashion_mnist", &s, err, sizeof err) == 0);
    CHECK(s.kind == MPT_DATA_FASHION_MNIST && !strcmp(s.dir, MPT_DATA_FASHION_MNIST_DIR));
    mpt_data_spec_free(&s);
    CHECK(mpt_data_spec_parse(" fashion_mnist(dir=\"/x/y\") ", &s, err, sizeof err) == 0);
    CHECK(s.dir && !strcmp(s.dir, "/x/y"));
    mpt_data_spec_free(&s);

    CHECK(mpt_data_spec_parse("synthetic(shape=[32, 32, 3], classes=100, samples=500, "
                              "seed=7, targets=[4])", &s, err, sizeof err) == 0);
    CHECK(s.kind == MPT_DATA_SYNTHETIC && s.shape.rank == 3 && s.shape.dim[2] == 3);
    CHECK(s.classes == 100 && s.samples == 500 && s.seed == 7 && s.targets.dim[0] == 4);
    CHECK(s.test_samples == 83 && s.dtype == MPT_DT_F32);
    mpt_data_spec_free(&s);
    CHECK(mpt_data_spec_parse("synthetic(dtype=i32, vocab=50)", &s, err, sizeof err) == 0);
    CHECK(s.dtype == MPT_DT_I32 && s.vocab == 50 && s.shape.rank == 0);
    mpt_data_spec_free(&s);

    CHECK(mpt_data_spec_parse("images(\"/data/pets\", size=[64,48], validation_split=0.25, "
                              "on_error=skip, color_mode=grayscale, cache=false)", &s, err,
                              sizeof err) == 0);
    CHECK(s.kind == MPT_DATA_IMAGES && !strcmp(s.dir, "/data/pets"));
    CHECK(s.size.dim[0] == 64 && s.size.dim[1] == 48 && s.validation_split == 0.25);
    CHECK(s.on_error == MPT_DATA_ON_ERROR_SKIP && s.channels == 1 &&
          s.cache == MPT_DATA_CACHE_OFF && s.seed == 1337);
    mpt_data_spec_free(&s);
    CHECK(mpt_data_spec_parse("idx(\"a.gz\", \"b.gz\", classes=5)", &s, err, sizeof err) == 0);
    CHECK(!strcmp(s.images_path, "a.gz") && !strcmp(s.labels_path, "b.gz") && s.classes == 5);
    mpt_data_spec_free(&s);
    CHECK(mpt_data_spec_parse("text(\"a.txt\", seq_len=64)", &s, err, sizeof err) == 0);
    CHECK(s.kind == MPT_DATA_TEXT && !strcmp(s.text_path, "a.txt") && s.seq_len == 64 &&
          s.test_fraction == 0.1);
    mpt_data_spec_free(&s);
    CHECK(mpt_data_spec_parse("text(path=\"d\", test_fraction=0.25)", &s, err, sizeof err) == 0);
    CHECK(s.seq_len == 0 && s.test_fraction == 0.25);
    mpt_data_spec_free(&s);

    static const struct { const char *spec, *frag; } bad[] = {
        {"foo", "unknown data set 'foo' (known: fashion_mnist, synthetic(...), "
                "images(\"dir\", size=[h,w]), idx(...), text(\"path\", seq_len=128))"},
        {"", "unknown data set ''"},
        {"synthetic(shape=[784", "expected ',' or ']' at column 21"},
        {"synthetic(shape=[784], classes=10", "expected ',' or ')'"},
        {"synthetic(shapes=[1])", "synthetic: unknown option 'shapes' (known: shape, classes"},
        {"synthetic(shape=784)", "shape must be a list"},
        {"synthetic(shape=[0])", "positive integers"},
        {"synthetic(classes=2.5)", "classes must be an integer"},
        {"synthetic(seed=1, seed=2)", "given twice"},
        {"synthetic(vocab=10)", "vocab= needs dtype=i32"},
        {"synthetic(dtype=f16)", "dtype must be one of f32, i32"},
        {"images(size=[8,8])", "images needs a directory"},
        {"images(\"d\", size=[8])", "size must be [height, width]"},
        {"images(\"d\", validation_split=1.5)", "between 0 and 1"},
        {"images(\"d\", on_error=ignore)", "on_error must be one of fatal, skip"},
        {"images(dir=\"d\", \"x\")", "positional argument after a named one"},
        {"images(\"d", "unterminated string"},
        {"idx(\"a.gz\")", "idx needs two files"},
        {"fashion_mnist(\"a\", \"b\")", "at most 1 positional argument"},
        {"fashion_mnist junk", "unexpected text after the data spec"},
        {"text(seq_len=8)", "text needs a file or a folder\n  hint: text(\"corpus.txt\""},
        {"text(\"a\", seq_len=0)", "seq_len must be a whole number of at least 1, not 0\n"
                                   "  hint: seq_len is how many bytes"},
        {"text(\"a\", seq_len=2.5)", "seq_len must be a whole number of at least 1, not 2.5"},
        {"text(\"a\", test_fraction=1)", "test_fraction must be between 0 and 1 (exclusive), "
                                         "not 1\n  hint:"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = mpt_data_spec_parse(bad[i].spec, &s, err, sizeof err);
        CHECK_MSG(rc == -1, "'%s' parsed", bad[i].spec);
        CHECK_MSG(strstr(err, bad[i].frag), "'%s': want '%s' in: %s", bad[i].spec,
                  bad[i].frag, err);
    }
    /* The caret sits under the column the message names. */
    mpt_data_spec_parse("synthetic(shape=[784", &s, err, sizeof err);
    CHECK_MSG(strstr(err, "\n  synthetic(shape=[784\n                      ^"), "%s", err);

    CHECK(mpt_data_has_test("fashion_mnist") == 1);
    CHECK(mpt_data_has_test("synthetic(shape=[4])") == 1);
    CHECK(mpt_data_has_test("images(\"d\", size=[8,8])") == 0);
    CHECK(mpt_data_has_test("text(\"d\")") == 1);
    CHECK(mpt_data_has_test("nonsense") == 0);
}

/* ---- shuffling ------------------------------------------------------------ */

static void test_permutation(void) {
    enum { N = 1000 };
    static int64_t a[N], b[N], c[N];
    mpt_data_permutation(N, 42, 0, a);
    mpt_data_permutation(N, 42, 0, b);
    CHECK(memcmp(a, b, sizeof a) == 0);
    int seen[N] = {0}, ok = 1;
    for (int i = 0; i < N; i++) {
        if (a[i] < 0 || a[i] >= N || seen[a[i]]++)
            ok = 0;
    }
    CHECK_MSG(ok, "not a permutation");
    mpt_data_permutation(N, 42, 1, c);
    CHECK(memcmp(a, c, sizeof a) != 0);
    mpt_data_permutation(N, 43, 0, c);
    CHECK(memcmp(a, c, sizeof a) != 0);
    int fixed = 0;
    for (int i = 0; i < N; i++)
        fixed += a[i] == i;
    CHECK_MSG(fixed < 20, "%d fixed points: hardly shuffled", fixed);
    /* Pinned, so a change of generator (which would break resumed runs
     * and published results) cannot pass unnoticed. */
    int64_t small[8];
    mpt_data_permutation(8, 1, 0, small);
    static const int64_t golden[8] = {3, 2, 4, 0, 6, 1, 7, 5};
    CHECK_MSG(memcmp(small, golden, sizeof small) == 0,
              "got %lld %lld %lld %lld %lld %lld %lld %lld", (long long)small[0],
              (long long)small[1], (long long)small[2], (long long)small[3],
              (long long)small[4], (long long)small[5], (long long)small[6],
              (long long)small[7]);
    mpt_data_rng r;
    mpt_data_rng_seed(&r, 5);
    int counts[3] = {0};
    for (int i = 0; i < 3000; i++)
        counts[mpt_data_rng_below(&r, 3)]++;
    CHECK(counts[0] > 900 && counts[1] > 900 && counts[2] > 900);
}

/* ---- synthetic ------------------------------------------------------------ */

static void test_synthetic(void) {
    mpt_dataset *a, *b, *c, *t;
    int64_t dims[1] = {16};
    const char *spec = "synthetic(shape=[16], classes=4, samples=100, seed=3)";
    CHECK(mpt_data_open(spec, MPT_DATA_TRAIN, NO_SHAPE, &a, err, sizeof err) == 0);
    CHECK(mpt_data_open(spec, MPT_DATA_TRAIN, shape_of(1, dims), &b, err, sizeof err) == 0);
    CHECK(mpt_data_open("synthetic(shape=[16], classes=4, samples=100, seed=4)",
                        MPT_DATA_TRAIN, NO_SHAPE, &c, err, sizeof err) == 0);
    CHECK(mpt_data_open(spec, MPT_DATA_TEST, NO_SHAPE, &t, err, sizeof err) == 0);
    CHECK(mpt_data_count(a) == 100 && mpt_data_count(t) == 16 && mpt_data_num_classes(a) == 4);
    float xa[32 * 16], xb[32 * 16], xc[32 * 16], xt[32 * 16];
    int32_t ya[32], yb[32], yc[32], yt[32];
    int64_t real;
    read_batch(a, 1, 32, xa, ya, &real);
    read_batch(b, 1, 32, xb, yb, &real);
    read_batch(c, 1, 32, xc, yc, &real);
    read_batch(t, 0, 16, xt, yt, &real);
    CHECK(memcmp(xa, xb, sizeof xa) == 0 && memcmp(ya, yb, sizeof ya) == 0);
    CHECK(memcmp(xa, xc, sizeof xa) != 0);
    CHECK(memcmp(xa, xt, sizeof(float) * 16 * 16) != 0);
    int in_range = 1, hist[4] = {0};
    for (int i = 0; i < 32; i++) {
        in_range &= ya[i] >= 0 && ya[i] < 4;
        if (ya[i] >= 0 && ya[i] < 4)
            hist[ya[i]]++;
    }
    for (int i = 0; i < 32 * 16; i++)
        in_range &= xa[i] >= -1 && xa[i] < 1;
    CHECK(in_range);
    CHECK(hist[0] && hist[1] && hist[2] && hist[3]);
    /* Samples of one class are closer to each other than to other
     * classes': the data can be learned. */
    double same = 0, other = 0;
    int n_same = 0, n_other = 0;
    for (int i = 0; i < 32; i++)
        for (int j = i + 1; j < 32; j++) {
            double dist = 0;
            for (int k = 0; k < 16; k++)
                dist += (xa[i * 16 + k] - xa[j * 16 + k]) * (xa[i * 16 + k] - xa[j * 16 + k]);
            if (ya[i] == ya[j])
                same += dist, n_same++;
            else
                other += dist, n_other++;
        }
    CHECK(n_same && n_other && same / n_same < 0.8 * (other / n_other));

    /* Shuffled batches are the file-order samples at the permutation. */
    int64_t order[100];
    mpt_data_permutation(100, 9, 2, order);
    mpt_data_shuffle(b, 9, 2);
    float all[100 * 16], sh[32 * 16];
    int32_t yall[100], ysh[32];
    for (int i = 0; i < 3; i++)
        read_batch(a, i, 32, all + i * 32 * 16, yall + i * 32, &real);
    read_batch(a, 3, 32, xa, ya, &real);
    CHECK(real == 4);
    memcpy(all + 96 * 16, xa, sizeof(float) * 4 * 16);
    memcpy(yall + 96, ya, sizeof(int32_t) * 4);
    read_batch(b, 2, 32, sh, ysh, &real);
    int same_rows = 1;
    for (int r = 0; r < 32; r++)
        same_rows &= !memcmp(sh + r * 16, all + order[64 + r] * 16, 16 * sizeof(float)) &&
                     ysh[r] == yall[order[64 + r]];
    CHECK(same_rows);
    /* Padding: the last batch of 100 in 32s has 4 real rows, zeros after. */
    read_batch(a, 3, 32, xa, ya, &real);
    int zeros = 1;
    for (int i = 4 * 16; i < 32 * 16; i++)
        zeros &= xa[i] == 0;
    for (int i = 4; i < 32; i++)
        zeros &= ya[i] == 0;
    CHECK(real == 4 && zeros);
    CHECK(mpt_data_num_batches(a, 32, MPT_DATA_DROP_REMAINDER) == 3);
    CHECK(mpt_data_num_batches(a, 32, MPT_DATA_PAD_REMAINDER) == 4);
    CHECK(mpt_data_batch(a, 4, 32, &(mpt_tensor){0}, NULL, NULL, err, sizeof err) == -1);

    /* One-hot labels, wrong tensors, targets, tokens. */
    int64_t x2[2] = {8, 16}, oh[2] = {8, 4}, bad[2] = {8, 5};
    mpt_tensor x = tensor(MPT_DT_F32, 2, x2), y = tensor(MPT_DT_F32, 2, oh);
    mpt_tensor yi = tensor(MPT_DT_I32, 1, oh), yb2 = tensor(MPT_DT_F32, 2, bad);
    CHECK(mpt_data_batch(a, 0, 8, &x, &y, NULL, err, sizeof err) == 0);
    CHECK(mpt_data_batch(a, 0, 8, &x, &yi, NULL, err, sizeof err) == 0);
    int onehot = 1;
    for (int r = 0; r < 8; r++)
        for (int k = 0; k < 4; k++)
            onehot &= ((float *)y.data)[r * 4 + k] == (k == ((int32_t *)yi.data)[r]);
    CHECK(onehot);
    CHECK(mpt_data_batch(a, 0, 8, &x, &yb2, NULL, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "sparse_categorical_crossentropy"), "%s", err);
    mpt_tensor xi = tensor(MPT_DT_I32, 2, x2);
    CHECK(mpt_data_batch(a, 0, 8, &xi, NULL, NULL, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "does not hold 8 f32 samples"), "%s", err);
    free(y.data);
    free(yb2.data);

    mpt_dataset *tg, *tok;
    CHECK(mpt_data_open("synthetic(shape=[16], targets=[3], samples=20)", MPT_DATA_TRAIN,
                        NO_SHAPE, &tg, err, sizeof err) == 0);
    CHECK(mpt_data_label_dtype(tg) == MPT_DT_F32 && mpt_data_label_shape(tg).dim[0] == 3);
    int64_t t3[2] = {8, 3};
    mpt_tensor yt3 = tensor(MPT_DT_F32, 2, t3);
    CHECK(mpt_data_batch(tg, 0, 8, &x, &yt3, NULL, err, sizeof err) == 0);
    float rowsum = 0;
    for (int i = 0; i < 24; i++)
        rowsum += ((float *)yt3.data)[i];
    CHECK(rowsum == 8);
    CHECK(mpt_data_batch(tg, 0, 8, &x, &yi, NULL, err, sizeof err) == -1);
    CHECK(mpt_data_open("synthetic(dtype=i32, vocab=50, samples=20)", MPT_DATA_TRAIN,
                        shape_of(1, dims), &tok, err, sizeof err) == 0);
    CHECK(mpt_data_input_dtype(tok) == MPT_DT_I32);
    CHECK(mpt_data_batch(tok, 0, 8, &xi, &yi, NULL, err, sizeof err) == 0);
    int tokens_ok = 1;
    for (int i = 0; i < 8 * 16; i++)
        tokens_ok &= ((int32_t *)xi.data)[i] >= 0 && ((int32_t *)xi.data)[i] < 50;
    CHECK(tokens_ok);
    expect_open_error("synthetic", MPT_DATA_TRAIN, NO_SHAPE, "no sample shape", "hint:");
    expect_open_error("synthetic(shape=[16])", MPT_DATA_TRAIN, shape_of(1, (int64_t[]){10}),
                      "synthetic has samples of shape [16] (16 values) but the model's "
                      "input is [10] (10 values)", "hint:");
    free(x.data);
    free(xi.data);
    free(yi.data);
    free(yt3.data);
    mpt_data_free(tg);
    mpt_data_free(tok);
    mpt_data_free(a);
    mpt_data_free(b);
    mpt_data_free(c);
    mpt_data_free(t);
}

/* ---- IDX files ----------------------------------------------------------- */

/* A valid little pair: 5 images of 2x3, labels 0..4. */
static void write_pair(const char *images, const char *labels, int gz) {
    uint8_t px[5 * 6], lb[5];
    for (int i = 0; i < 30; i++)
        px[i] = (uint8_t)(i * 8);
    for (int i = 0; i < 5; i++)
        lb[i] = (uint8_t)i;
    write_idx(images, 3, (uint32_t[]){5, 2, 3}, px, sizeof px, gz);
    write_idx(labels, 1, (uint32_t[]){5}, lb, sizeof lb, gz);
}

static void test_idx_errors(void) {
    char spec[1200];
    mpt_dataset *d;
    /* Plain and gzip pairs both read. */
    for (int gz = 0; gz < 2; gz++) {
        write_pair(path_in("img"), path_in("lab"), gz);
        snprintf(spec, sizeof spec, "idx(\"%s\", \"%s\")", path_in("img"), path_in("lab"));
        CHECK_MSG(mpt_data_open(spec, MPT_DATA_TRAIN, NO_SHAPE, &d, err, sizeof err) == 0,
                  "%s", err);
        if (!d)
            continue;
        mpt_shape s = mpt_data_sample_shape(d);
        CHECK(mpt_data_count(d) == 5 && mpt_data_num_classes(d) == 5);
        CHECK(s.rank == 3 && s.dim[0] == 2 && s.dim[1] == 3 && s.dim[2] == 1);
        float x[2 * 6];
        int32_t y[2];
        int64_t real;
        read_batch(d, 1, 2, x, y, &real);
        CHECK(y[0] == 2 && y[1] == 3 && x[0] == 96.0f / 255.0f && x[11] == 184.0f / 255.0f);
        mpt_data_free(d);
    }
    snprintf(spec, sizeof spec, "idx(\"%s\", \"%s\", classes=3)", path_in("img"), path_in("lab"));
    expect_open_error(spec, MPT_DATA_TRAIN, NO_SHAPE, "label 3 of sample 3 is not below 3",
                      path_in("lab"));
    snprintf(spec, sizeof spec, "idx(\"%s\", \"%s\")", path_in("img"), path_in("lab"));
    expect_open_error(spec, MPT_DATA_TEST, NO_SHAPE, "idx(...) has no test part", "hint:");

    /* Fashion-MNIST file names in a temp dir, each damaged one way. */
    char dir[400], fspec[600];
    snprintf(dir, sizeof dir, "%s/fm", tmp);
    mkdir(dir, 0755);
    snprintf(fspec, sizeof fspec, "fashion_mnist(dir=\"%s\")", dir);
    char img[500], lab[500];
    snprintf(img, sizeof img, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(lab, sizeof lab, "%s/train-labels-idx1-ubyte.gz", dir);
    expect_open_error(fspec, MPT_DATA_TRAIN, NO_SHAPE, "train-images-idx3-ubyte.gz: file not found",
                      "apt-get install dataset-fashion-mnist");

    enum { N = 4 };
    static uint8_t px[N * 28 * 28];
    uint8_t lb[N] = {9, 0, 0, 3};
    write_idx(img, 3, (uint32_t[]){N, 28, 28}, px, sizeof px, 1);
    write_idx(lab, 1, (uint32_t[]){N}, lb, sizeof lb, 1);
    CHECK_MSG(mpt_data_open(fspec, MPT_DATA_TRAIN, NO_SHAPE, &d, err, sizeof err) == 0, "%s", err);
    mpt_data_free(d);
    expect_open_error(fspec, MPT_DATA_TEST, NO_SHAPE, "t10k-images-idx3-ubyte.gz: file not found",
                      NULL);

    /* Labels where images belong: wrong magic. */
    write_idx(img, 1, (uint32_t[]){N}, lb, sizeof lb, 1);
    expect_open_error(fspec, MPT_DATA_TRAIN, NO_SHAPE, "not an IDX image file of unsigned bytes "
                      "(magic 0x00000801, expected 0x00000803)", "apt-get install --reinstall");
    /* A float IDX file (type 0x0d). */
    uint8_t flt[16] = {0, 0, 0x0d, 1, 0, 0, 0, 2};
    write_bytes(img, flt, sizeof flt, 1);
    expect_open_error(fspec, MPT_DATA_TRAIN, NO_SHAPE, "magic 0x00000d01", img);
    /* Not gzip and not IDX: zlib passes it through; the magic is wrong. */
    write_bytes(img, "hello, world, not idx", 21, 0);
    expect_open_error(fspec, MPT_DATA_TRAIN, NO_SHAPE, "not an IDX image file", img);
    /* Fewer pixels than the header promises. */
    write_idx(img, 3, (uint32_t[]){N, 28, 28}, px, sizeof px - 100, 1);
    expect_open_error(fspec, MPT_DATA_TRAIN, NO_SHAPE, "truncated: the file ends after 3036 of "
                      "the 3136 bytes of the data", img);
    /* More than it promises. */
    write_idx(img, 3, (uint32_t[]){N - 1, 28, 28}, px, sizeof px, 1);
    expect_open_error(fspec, MPT_DATA_TRAIN, NO_SHAPE, "wrong length: more data after", img);
    /* A zero dim; a header cut short. */
    write_idx(img, 3, (uint32_t[]){N, 0, 28}, px, 0, 1);
    expect_open_error(fspec, MPT_DATA_TRAIN, NO_SHAPE, "header dim 1 is 0", img);
    uint8_t cut[6] = {0, 0, 0x08, 3, 0, 0};
    write_bytes(img, cut, sizeof cut, 1);
    expect_open_error(fspec, MPT_DATA_TRAIN, NO_SHAPE, "truncated", "of the header");
    /* A gzip stream cut in half, and one with a flipped byte. */
    write_idx(img, 3, (uint32_t[]){N, 28, 28}, px, sizeof px, 1);
    FILE *f = fopen(img, "rb");
    static uint8_t gzbuf[8192];
    size_t len = fread(gzbuf, 1, sizeof gzbuf, f);
    fclose(f);
    write_bytes(img, gzbuf, len / 2, 0);
    expect_open_error(fspec, MPT_DATA_TRAIN, NO_SHAPE, img, "hint:");
    CHECK_MSG(strstr(err, "truncated") || strstr(err, "corrupt gzip"), "%s", err);
    gzbuf[len - 6] ^= 0xff; /* inside the CRC32 trailer */
    write_bytes(img, gzbuf, len, 0);
    expect_open_error(fspec, MPT_DATA_TRAIN, NO_SHAPE, "corrupt gzip data", img);
    /* Images 27x28; counts that disagree; a label of 12. */
    write_idx(img, 3, (uint32_t[]){N, 27, 28}, px, N * 27 * 28, 1);
    expect_open_error(fspec, MPT_DATA_TRAIN, NO_SHAPE, "Fashion-MNIST images are 28x28", NULL);
    write_idx(img, 3, (uint32_t[]){N, 28, 28}, px, sizeof px, 1);
    write_idx(lab, 1, (uint32_t[]){N - 1}, lb, N - 1, 1);
    expect_open_error(fspec, MPT_DATA_TRAIN, NO_SHAPE, "has 4 images but", "has 3 labels");
    lb[2] = 12;
    write_idx(lab, 1, (uint32_t[]){N}, lb, N, 1);
    expect_open_error(fspec, MPT_DATA_TRAIN, NO_SHAPE, "label 12 of sample 2 is not below 10",
                      lab);
    /* A directory where a file should be. */
    remove(lab);
    mkdir(lab, 0755);
    expect_open_error(fspec, MPT_DATA_TRAIN, NO_SHAPE, "is a directory", lab);
}

/* ---- Fashion-MNIST ---------------------------------------------------------- */

/* The first label of the training set, read straight from the file. */
static int first_train_label(void) {
    gzFile f = gzopen(MPT_DATA_FASHION_MNIST_DIR "/train-labels-idx1-ubyte.gz", "rb");
    uint8_t head[9];
    int got = gzread(f, head, 9);
    gzclose(f);
    return got == 9 ? head[8] : -1;
}

static void test_fashion_mnist(void) {
    if (access(MPT_DATA_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("note: %s missing, the Fashion-MNIST checks are skipped\n",
               MPT_DATA_FASHION_MNIST_DIR);
        return;
    }
    mpt_dataset *train, *test, *flat, *tr, *val;
    int64_t flat_dims[1] = {784};
    CHECK_MSG(mpt_data_open("fashion_mnist", MPT_DATA_TRAIN, NO_SHAPE, &train, err, sizeof err) == 0,
              "%s", err);
    CHECK(mpt_data_open("fashion_mnist", MPT_DATA_TEST, NO_SHAPE, &test, err, sizeof err) == 0);
    CHECK(mpt_data_open("fashion_mnist", MPT_DATA_TRAIN, shape_of(1, flat_dims), &flat, err,
                        sizeof err) == 0);
    if (!train || !test || !flat)
        return;
    mpt_shape s = mpt_data_sample_shape(train);
    CHECK(mpt_data_count(train) == 60000 && mpt_data_count(test) == 10000);
    CHECK(s.rank == 3 && s.dim[0] == 28 && s.dim[1] == 28 && s.dim[2] == 1);
    CHECK(mpt_data_sample_shape(flat).rank == 1 && mpt_data_num_classes(train) == 10);
    char buf[16];
    CHECK(!strcmp(mpt_data_class_name(train, 9, buf), "Ankle boot"));

    enum { B = 256 };
    static float x[B * 784], xf[B * 784];
    int32_t y[B], yf[B];
    int64_t real;
    read_batch(train, 0, B, x, y, &real);
    read_batch(flat, 0, B, xf, yf, &real);
    int first = first_train_label();
    CHECK_MSG(first == 9 && y[0] == first, "first label %d, file says %d", y[0], first);
    CHECK(memcmp(x, xf, sizeof x) == 0 && memcmp(y, yf, sizeof y) == 0);
    float lo = 1, hi = 0;
    int labels_ok = 1;
    for (int i = 0; i < B * 784; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    for (int i = 0; i < B; i++)
        labels_ok &= y[i] >= 0 && y[i] < 10;
    CHECK_MSG(lo == 0.0f && hi == 1.0f, "pixels in [%g, %g]", lo, hi);
    CHECK(labels_ok);

    /* The last 20% is the validation set, taken before shuffling. */
    CHECK(mpt_data_split(train, 0.2, &tr, &val, err, sizeof err) == 0);
    CHECK(mpt_data_count(tr) == 48000 && mpt_data_count(val) == 12000);
    static float xv[B * 784], xt[B * 784];
    int32_t yv[B], yt[B];
    read_batch(val, 0, B, xv, yv, &real);
    read_batch(train, 48000 / B, B, xt, yt, &real); /* 48000 = 187.5 batches */
    CHECK(memcmp(xv, xt + 128 * 784, sizeof(float) * 128 * 784) == 0);
    mpt_dataset *a, *b;
    CHECK(mpt_data_split(train, 1.0, &a, &b, err, sizeof err) == -1 && !a && !b);
    CHECK(mpt_data_split(train, 0.99999, &a, &b, err, sizeof err) == -1);
    CHECK_MSG(strstr(err, "leaves an empty training set"), "%s", err);

    /* Evaluation pads the test set's last batch: 10000 = 3 * 3000 + 1000. */
    CHECK(mpt_data_num_batches(test, 3000, MPT_DATA_PAD_REMAINDER) == 4);
    int64_t xd[4] = {3000, 28, 28, 1}, yd[1] = {3000};
    mpt_tensor xt4 = tensor(MPT_DT_F32, 4, xd), yt1 = tensor(MPT_DT_I32, 1, yd);
    CHECK(mpt_data_batch(test, 3, 3000, &xt4, &yt1, &real, err, sizeof err) == 0);
    CHECK(real == 1000 && ((float *)xt4.data)[1000 * 784] == 0);
    free(xt4.data);
    free(yt1.data);
    expect_open_error("fashion_mnist", MPT_DATA_TRAIN, shape_of(1, (int64_t[]){100}),
                      "fashion_mnist has samples of shape [28,28,1] (784 values)", "[100]");
    mpt_data_free(tr);
    mpt_data_free(val);
    mpt_data_free(train);
    mpt_data_free(test);
    mpt_data_free(flat);
}

int main(void) {
    if (data_tmp_init()) return 1;
    test_specs();
    test_permutation();
    test_synthetic();
    test_idx_errors();
    test_fashion_mnist();
    data_tmp_remove();
    return check_exit("test_data");
}
