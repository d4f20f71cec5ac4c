/* runtime/data/data.c — data sets, views, shuffling and batches.
 *
 * A data set is a view [first, first + n) over a shared, reference-counted
 * source (the decoded files, a text corpus or a generator), plus the
 * current sample order. Splitting makes two more views of the same source;
 * nothing is copied.
 *
 * Labels are class ids, ids_per_sample of them per sample: one for the
 * classification kinds, T (one per position) for text. Batches carry them
 * as (B, ids_per_sample) int32 until emit_labels writes the caller's y.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "runtime/data/data_impl.h"

static const char *const fashion_class_names[10] = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

#define FASHION_MISSING "install the data set: apt-get install dataset-fashion-mnist"
#define FASHION_DAMAGED                                                        \
    "the file is damaged; reinstall the data set: apt-get install --reinstall " \
    "dataset-fashion-mnist"
#define IDX_MISSING "check the path given to idx(\"images\", \"labels\")"
#define IDX_DAMAGED "the file is damaged or not an IDX file; download it again"

typedef struct {
    int refs;
    mpt_data_kind kind;
    int64_t n;
    mpt_shape shape; /* the natural sample shape */
    int64_t numel;
    mpt_dtype x_dtype;
    int classes;
    mpt_shape targets; /* rank 0: sparse labels */
    mpt_shape id_shape; /* per-sample shape of the class ids: rank 0, or text's [T] */
    int64_t ids_per_sample;
    double spec_validation_split;
    mpt_idx_file *images, *labels; /* fashion_mnist, idx */
    uint64_t key;                  /* synthetic */
    int64_t offset;                /* synthetic: index of sample 0 */
    int64_t vocab;
    mpt_image_set *imgs;           /* images */
    mpt_text_set *text;            /* text */
    mpt_data_extra extra[MPT_DATA_MAX_INPUTS - 1]; /* the model's further inputs */
    int n_extra;
} data_source;

/* The background decoder of one view (images that are not cached): while
 * the caller trains on batch i it fills batch i + 1. */
typedef enum { PF_IDLE, PF_REQUESTED, PF_BUSY, PF_DONE } pf_state;
typedef struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stop;
    pf_state state;
    int64_t index, batch_size, n_real;
    void *x;         /* batch_size * numel elements */
    int32_t *labels; /* (batch_size, ids_per_sample) */
    int64_t cap;     /* rows x and labels hold */
    int rc;
    char err[1024];
} prefetcher;

struct mpt_dataset {
    data_source *src;
    int64_t first, n;
    mpt_shape shape;
    int64_t *order; /* n entries, or NULL for file order */
    prefetcher *pf;
};

/* ---- helpers shared by the data files ---------------------------------- */

void mpt_data_die(const char *stmt, int rc, const char *func, const char *file,
                  int line) {
    fprintf(stderr, "mptc: internal error: %s failed (%s) in %s at %s:%d\n", stmt,
            strerror(rc), func, file, line);
    abort();
}

int mpt_data_fail(char *err, size_t n, const char *fmt, ...) {
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

uint64_t mpt_data_mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void mpt_data_rng_seed(mpt_data_rng *r, uint64_t key) {
    /* splitmix64's stream: state advances by the golden gamma each draw. */
    for (int i = 0; i < 4; i++)
        r->s[i] = mpt_data_mix64(key + 0x9e3779b97f4a7c15ull * (uint64_t)i);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t mpt_data_rng_next(mpt_data_rng *r) {
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

uint64_t mpt_data_rng_below(mpt_data_rng *r, uint64_t bound) {
    /* Rejecting the top partial range keeps every value equally likely. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t x;
    do
        x = mpt_data_rng_next(r);
    while (x >= limit);
    return x % bound;
}

static int64_t numel_of(mpt_shape s) {
    int64_t n = 1;
    for (int i = 0; i < s.rank; i++)
        n *= s.dim[i];
    return n;
}

static char *shape_str(mpt_shape s, char *buf, size_t n) {
    int len = snprintf(buf, n, "[");
    for (int i = 0; i < s.rank; i++)
        len += snprintf(buf + len, n - (size_t)len, "%s%lld", i ? "," : "", (long long)s.dim[i]);
    snprintf(buf + len, n - (size_t)len, "]");
    return buf;
}

/* The data pipeline only makes f32 and i32 tensors; the others are named
 * for messages about a caller's tensor. */
static const char *dtype_str(mpt_dtype dt) {
    switch (dt) {
    case MPT_DT_F32: return "f32";
    case MPT_DT_F16: return "f16";
    case MPT_DT_BF16: return "bf16";
    case MPT_DT_I32: return "i32";
    case MPT_DT_BOOL: return "bool";
    case MPT_DT_F64: return "f64";
    case MPT_DT_COUNT: break;
    }
    return "?";
}

/* ---- sources ------------------------------------------------------------- */

static void source_release(data_source *s) {
    if (!s || __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    mpt_idx_release(s->images);
    mpt_idx_release(s->labels);
    mpt_images_free(s->imgs);
    mpt_text_free(s->text);
    free(s);
}

/* Images and labels of an IDX pair: counts agree, labels < classes. */
static int open_idx_pair(data_source *s, const char *images, const char *labels,
                         const char *missing, const char *damaged, int classes,
                         char *err, size_t n) {
    if (!(s->images = mpt_idx_acquire(images, 0, missing, damaged, err, n)))
        return -1;
    if (!(s->labels = mpt_idx_acquire(labels, 1, missing, damaged, err, n)))
        return -1;
    if (s->images->dim[0] != s->labels->dim[0])
        return mpt_data_fail(err, n, "%s has %lld images but %s has %lld labels\n  hint: "
                             "the two files must come from the same set", images,
                             (long long)s->images->dim[0], labels,
                             (long long)s->labels->dim[0]);
    s->n = s->images->dim[0];
    int max = 0;
    for (int64_t i = 0; i < s->n; i++)
        if (s->labels->data[i] > max)
            max = s->labels->data[i];
    s->classes = classes ? classes : max + 1;
    if (max >= s->classes) {
        int64_t at = 0;
        while (s->labels->data[at] < s->classes)
            at++;
        return mpt_data_fail(err, n, "%s: label %d of sample %lld is not below %d, the "
                             "number of classes\n  hint: %s", labels, s->labels->data[at],
                             (long long)at, s->classes, damaged);
    }
    /* [N,H,W] images are [H,W,1] samples, as Keras' channels_last wants. */
    s->shape.rank = 0;
    for (int i = 1; i < s->images->rank; i++)
        s->shape.dim[s->shape.rank++] = s->images->dim[i];
    if (s->images->rank == 3)
        s->shape.dim[s->shape.rank++] = 1;
    return 0;
}

static int open_fashion(data_source *s, const mpt_data_spec *spec, mpt_data_part part,
                        char *err, size_t n) {
    const char *prefix = part == MPT_DATA_TEST ? "t10k" : "train";
    char images[4096], labels[4096];
    snprintf(images, sizeof images, "%s/%s-images-idx3-ubyte.gz", spec->dir, prefix);
    snprintf(labels, sizeof labels, "%s/%s-labels-idx1-ubyte.gz", spec->dir, prefix);
    const char *missing = strcmp(spec->dir, MPT_DATA_FASHION_MNIST_DIR)
                              ? "fashion_mnist(dir=...) must hold the four *-ubyte.gz files; "
                                "or " FASHION_MISSING " and leave out dir="
                              : FASHION_MISSING;
    if (open_idx_pair(s, images, labels, missing, FASHION_DAMAGED, 10, err, n))
        return -1;
    if (s->images->rank != 3 || s->images->dim[1] != 28 || s->images->dim[2] != 28)
        return mpt_data_fail(err, n, "%s: Fashion-MNIST images are 28x28, this file's "
                             "are not\n  hint: %s", images, FASHION_DAMAGED);
    return 0;
}

static int open_synthetic(data_source *s, const mpt_data_spec *spec, mpt_data_part part,
                          mpt_shape want, char *err, size_t n) {
    s->shape = spec->shape.rank ? spec->shape : want;
    if (s->shape.rank == 0)
        return mpt_data_fail(err, n, "synthetic: no sample shape\n  hint: give one, as in "
                             "synthetic(shape=[784])");
    s->x_dtype = spec->dtype;
    s->vocab = spec->vocab;
    s->classes = spec->classes ? spec->classes : 10;
    s->targets = spec->targets;
    s->id_shape = spec->ids;
    s->key = mpt_data_mix64(spec->seed ^ 0x73796e7468657469ull);
    /* The test part continues the training part's sample sequence. */
    s->n = part == MPT_DATA_TEST ? spec->test_samples : spec->samples;
    s->offset = part == MPT_DATA_TEST ? spec->samples : 0;
    return 0;
}

static int open_images(data_source *s, const mpt_data_spec *spec, mpt_shape want,
                       char *err, size_t n) {
    char buf[64];
    int64_t h, w;
    if (spec->size.rank == 2) {
        h = spec->size.dim[0];
        w = spec->size.dim[1];
    } else if (want.rank == 3 && want.dim[2] == spec->channels) {
        h = want.dim[0];
        w = want.dim[1];
    } else {
        return mpt_data_fail(err, n, "images: no image size: the model's input %s is not "
                             "[height,width,%d]\n  hint: give one, as in "
                             "images(\"%s\", size=[32,32])",
                             shape_str(want, buf, sizeof buf), spec->channels, spec->dir);
    }
    if (!(s->imgs = mpt_images_open(spec, h, w, err, n)))
        return -1;
    s->n = mpt_images_count(s->imgs);
    s->classes = mpt_images_num_classes(s->imgs);
    s->shape = (mpt_shape){.rank = 3, .dim = {h, w, spec->channels}};
    s->spec_validation_split = spec->validation_split;
    return 0;
}

/* Byte windows [T]: i32 inputs, and a class id of 256 at every position. */
static int open_text(data_source *s, const mpt_data_spec *spec, mpt_data_part part,
                     mpt_shape want, char *err, size_t n) {
    if (!(s->text = mpt_text_open(spec, part, want, err, n)))
        return -1;
    s->n = mpt_text_count(s->text);
    s->shape = (mpt_shape){.rank = 1, .dim = {mpt_text_seq_len(s->text)}};
    s->id_shape = s->shape;
    s->x_dtype = MPT_DT_I32;
    s->classes = 256;
    return 0;
}

static data_source *source_open(const mpt_data_spec *spec, mpt_data_part part,
                                mpt_shape want, char *err, size_t n) {
    data_source *s = calloc(1, sizeof *s);
    s->refs = 1;
    s->kind = spec->kind;
    s->x_dtype = MPT_DT_F32;
    const char *name = mpt_data_kind_name(spec->kind);
    int rc = mpt_data_fail(err, n, "internal error: data kind %d", (int)spec->kind);
    if (part == MPT_DATA_TEST && !mpt_data_kind_has_test(spec->kind)) {
        rc = mpt_data_fail(err, n, "%s(...) has no test part\n  hint: hold out part of "
                           "it with validation_split=0.2 instead", name);
    } else {
        switch (spec->kind) {
        case MPT_DATA_FASHION_MNIST: rc = open_fashion(s, spec, part, err, n); break;
        case MPT_DATA_SYNTHETIC: rc = open_synthetic(s, spec, part, want, err, n); break;
        case MPT_DATA_IMAGES: rc = open_images(s, spec, want, err, n); break;
        case MPT_DATA_IDX:
            rc = open_idx_pair(s, spec->images_path, spec->labels_path, IDX_MISSING,
                               IDX_DAMAGED, spec->classes, err, n);
            break;
        case MPT_DATA_TEXT: rc = open_text(s, spec, part, want, err, n); break;
        case MPT_DATA_KIND_COUNT: break;
        }
    }
    if (rc) {
        source_release(s);
        return NULL;
    }
    s->numel = numel_of(s->shape);
    s->ids_per_sample = numel_of(s->id_shape);
    return s;
}

/* ---- samples -------------------------------------------------------------- */

/* The class of sample i of a classification kind. */
static int32_t source_label(const data_source *s, int64_t i) {
    switch (s->kind) {
    case MPT_DATA_FASHION_MNIST:
    case MPT_DATA_IDX: return s->labels->data[i];
    case MPT_DATA_SYNTHETIC:
        return (int32_t)(mpt_data_mix64(s->key + mpt_data_mix64((uint64_t)(s->offset + i))) %
                         (uint64_t)s->classes);
    case MPT_DATA_IMAGES: return mpt_images_label(s->imgs, i);
    case MPT_DATA_TEXT:
    case MPT_DATA_KIND_COUNT: break;
    }
    return 0;
}

/* out is (ids_per_sample) class ids of sample i. */
static void source_ids(const data_source *s, int64_t i, int32_t *out) {
    if (s->kind == MPT_DATA_TEXT) {
        mpt_text_window(s->text, i, NULL, out);
    } else if (s->kind == MPT_DATA_SYNTHETIC && s->ids_per_sample > 1) {
        /* synthetic(ids=[...]): the sample's class, then one drawn per position */
        out[0] = source_label(s, i);
        for (int64_t j = 1; j < s->ids_per_sample; j++)
            out[j] = (int32_t)(mpt_data_mix64(s->key + mpt_data_mix64((uint64_t)(s->offset + i)) + (uint64_t)j) %
                               (uint64_t)s->classes);
    } else {
        out[0] = source_label(s, i);
    }
}

static float synthetic_centroid(const data_source *s, int32_t c, int64_t j) {
    return mpt_data_synthetic_centroid(s->key, s->numel, c, j);
}

static int source_sample(data_source *s, int64_t i, void *out, char *err, size_t n) {
    switch (s->kind) {
    case MPT_DATA_FASHION_MNIST:
    case MPT_DATA_IDX: {
        const uint8_t *px = s->images->data + i * s->numel;
        float *x = out;
        for (int64_t j = 0; j < s->numel; j++)
            x[j] = (float)px[j] / 255.0f;
        return 0;
    }
    case MPT_DATA_SYNTHETIC:
        mpt_data_synthetic_values(s->key, s->numel, s->x_dtype, s->vocab, s->offset + i,
                                  source_label(s, i), out);
        return 0;
    case MPT_DATA_IMAGES: return mpt_images_sample(s->imgs, i, out, err, n);
    case MPT_DATA_TEXT: mpt_text_window(s->text, i, out, NULL); return 0;
    case MPT_DATA_KIND_COUNT: break;
    }
    return mpt_data_fail(err, n, "internal error: data kind %d", (int)s->kind);
}

/* ---- data sets -------------------------------------------------------- */

static mpt_dataset *view_new(data_source *src, int64_t first, int64_t n, mpt_shape shape) {
    mpt_dataset *d = calloc(1, sizeof *d);
    __atomic_add_fetch(&src->refs, 1, __ATOMIC_ACQ_REL);
    d->src = src;
    d->first = first;
    d->n = n;
    d->shape = shape;
    return d;
}

int mpt_data_open_spec_inputs(const mpt_data_spec *spec, mpt_data_part part,
                              const mpt_data_input *inputs, int n_inputs, mpt_dataset **out,
                              char *err, size_t n) {
    *out = NULL;
    if (n_inputs < 1 || n_inputs > MPT_DATA_MAX_INPUTS)
        return mpt_data_fail(err, n, "internal error: %d model inputs", n_inputs);
    mpt_shape sample_shape = inputs[0].shape;
    data_source *src = source_open(spec, part, sample_shape, err, n);
    if (!src)
        return -1;
    src->n_extra = n_inputs - 1;
    if (mpt_data_extras_open(spec, src->key, inputs + 1, n_inputs - 1, src->extra, err, n)) {
        source_release(src);
        return -1;
    }
    if (sample_shape.rank && numel_of(sample_shape) != src->numel) {
        char a[64], b[64];
        mpt_data_fail(err, n, "%s has samples of shape %s (%lld values) but the model's "
                      "input is %s (%lld values)\n  hint: make the model's input %s, or "
                      "another shape with %lld values", mpt_data_kind_name(spec->kind),
                      shape_str(src->shape, a, sizeof a), (long long)src->numel,
                      shape_str(sample_shape, b, sizeof b), (long long)numel_of(sample_shape),
                      a, (long long)src->numel);
        source_release(src);
        return -1;
    }
    *out = view_new(src, 0, src->n, sample_shape.rank ? sample_shape : src->shape);
    source_release(src);
    return 0;
}

int mpt_data_open_spec(const mpt_data_spec *spec, mpt_data_part part,
                       mpt_shape sample_shape, mpt_dataset **out, char *err, size_t n) {
    mpt_data_input one = {.name = "x", .shape = sample_shape};
    return mpt_data_open_spec_inputs(spec, part, &one, 1, out, err, n);
}

int mpt_data_open_inputs(const char *spec, mpt_data_part part, const mpt_data_input *inputs,
                         int n_inputs, mpt_dataset **out, char *err, size_t n) {
    mpt_data_spec s;
    *out = NULL;
    if (mpt_data_spec_parse(spec, &s, err, n))
        return -1;
    int rc = mpt_data_open_spec_inputs(&s, part, inputs, n_inputs, out, err, n);
    mpt_data_spec_free(&s);
    return rc;
}

int mpt_data_open(const char *spec, mpt_data_part part, mpt_shape sample_shape,
                  mpt_dataset **out, char *err, size_t n) {
    mpt_data_input one = {.name = "x", .shape = sample_shape};
    return mpt_data_open_inputs(spec, part, &one, 1, out, err, n);
}

static void pf_stop(mpt_dataset *d);

void mpt_data_free(mpt_dataset *d) {
    if (!d)
        return;
    pf_stop(d);
    source_release(d->src);
    free(d->order);
    free(d);
}

int64_t mpt_data_count(const mpt_dataset *d) { return d->n; }
mpt_shape mpt_data_sample_shape(const mpt_dataset *d) { return d->shape; }
mpt_dtype mpt_data_input_dtype(const mpt_dataset *d) { return d->src->x_dtype; }
int mpt_data_n_inputs(const mpt_dataset *d) { return 1 + d->src->n_extra; }
int mpt_data_num_classes(const mpt_dataset *d) { return d->src->classes; }
mpt_shape mpt_data_label_shape(const mpt_dataset *d) {
    return d->src->targets.rank ? d->src->targets : d->src->id_shape;
}
mpt_dtype mpt_data_label_dtype(const mpt_dataset *d) {
    return d->src->targets.rank ? MPT_DT_F32 : MPT_DT_I32;
}
double mpt_data_spec_validation_split(const mpt_dataset *d) {
    return d->src->spec_validation_split;
}

const char *mpt_data_class_name(const mpt_dataset *d, int c, char buf[16]) {
    if (c < 0 || c >= d->src->classes)
        return "?";
    if (d->src->kind == MPT_DATA_IMAGES)
        return mpt_images_class_name(d->src->imgs, c);
    if (d->src->kind == MPT_DATA_FASHION_MNIST)
        return fashion_class_names[c];
    snprintf(buf, 16, "%d", c);
    return buf;
}

int mpt_data_split(const mpt_dataset *d, double f, mpt_dataset **train,
                   mpt_dataset **val, char *err, size_t n) {
    *train = *val = NULL;
    if (!(f > 0 && f < 1))
        return mpt_data_fail(err, n, "validation_split must be between 0 and 1 "
                             "(exclusive), not %g", f);
    int64_t k = (int64_t)((double)d->n * (1.0 - f));
    if (k < 1 || k >= d->n)
        return mpt_data_fail(err, n, "validation_split=%g of %lld samples leaves an empty "
                             "%s set\n  hint: use a fraction that leaves samples on both "
                             "sides", f, (long long)d->n, k < 1 ? "training" : "validation");
    *train = view_new(d->src, d->first, k, d->shape);
    *val = view_new(d->src, d->first + k, d->n - k, d->shape);
    return 0;
}

/* ---- order ---------------------------------------------------------- */

void mpt_data_permutation(int64_t n, uint64_t seed, int64_t epoch, int64_t *order) {
    mpt_data_rng r;
    mpt_data_rng_seed(&r, mpt_data_mix64(mpt_data_mix64(seed) + (uint64_t)epoch));
    for (int64_t i = 0; i < n; i++)
        order[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)mpt_data_rng_below(&r, (uint64_t)i + 1);
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

static void pf_quiesce(mpt_dataset *d);

void mpt_data_shuffle(mpt_dataset *d, uint64_t seed, int64_t epoch) {
    pf_quiesce(d);
    if (!d->order)
        d->order = malloc(sizeof *d->order * (size_t)(d->n ? d->n : 1));
    mpt_data_permutation(d->n, seed, epoch, d->order);
}

void mpt_data_unshuffle(mpt_dataset *d) {
    pf_quiesce(d);
    free(d->order);
    d->order = NULL;
}

int64_t mpt_data_num_batches(const mpt_dataset *d, int64_t batch_size,
                             mpt_data_remainder r) {
    if (batch_size <= 0)
        return 0;
    switch (r) {
    case MPT_DATA_DROP_REMAINDER: return d->n / batch_size;
    case MPT_DATA_PAD_REMAINDER: return (d->n + batch_size - 1) / batch_size;
    }
    return 0;
}

/* ---- batches -------------------------------------------------------- */

/* Writes rows of batch `index` into x (bs * numel elements of 4 bytes),
 * the further inputs' rows into extra[j] and labels (bs, ids_per_sample);
 * pads past the end with zeros. */
static int assemble(mpt_dataset *d, int64_t index, int64_t bs, void *x, void *const *extra,
                    int32_t *labels, int64_t *n_real, char *err, size_t n) {
    const data_source *s = d->src;
    int64_t start = index * bs, k = s->ids_per_sample;
    int64_t real = d->n - start < bs ? d->n - start : bs;
    size_t row = sizeof(float) * (size_t)s->numel;
    for (int64_t r = 0; r < real; r++) {
        int64_t i = d->first + (d->order ? d->order[start + r] : start + r);
        if (source_sample(d->src, i, (char *)x + (size_t)r * row, err, n))
            return -1;
        source_ids(d->src, i, labels + r * k);
        for (int j = 0; j < s->n_extra; j++)
            mpt_data_extra_sample(&s->extra[j], s->offset + i, labels[r * k],
                                  (char *)extra[j] + (size_t)(r * s->extra[j].numel) * 4);
    }
    for (int j = 0; j < s->n_extra; j++)
        memset((char *)extra[j] + (size_t)(real * s->extra[j].numel) * 4, 0,
               (size_t)((bs - real) * s->extra[j].numel) * 4);
    memset((char *)x + (size_t)real * row, 0, (size_t)(bs - real) * row);
    memset(labels + real * k, 0, sizeof *labels * (size_t)((bs - real) * k));
    *n_real = real;
    return 0;
}

static void *pf_main(void *arg) {
    mpt_dataset *d = arg;
    prefetcher *pf = d->pf;
    MPT_DATA_CHECK(pthread_mutex_lock(&pf->lock));
    while (!pf->stop) {
        if (pf->state != PF_REQUESTED) {
            MPT_DATA_CHECK(pthread_cond_wait(&pf->cond, &pf->lock));
            continue;
        }
        pf->state = PF_BUSY;
        int64_t index = pf->index, bs = pf->batch_size, n_real = 0;
        MPT_DATA_CHECK(pthread_mutex_unlock(&pf->lock));
        /* Only this thread touches x, labels and err while BUSY. */
        int rc = assemble(d, index, bs, pf->x, NULL, pf->labels, &n_real, pf->err, sizeof pf->err);
        MPT_DATA_CHECK(pthread_mutex_lock(&pf->lock));
        pf->rc = rc;
        pf->n_real = n_real;
        pf->state = PF_DONE;
        MPT_DATA_CHECK(pthread_cond_broadcast(&pf->cond));
    }
    MPT_DATA_CHECK(pthread_mutex_unlock(&pf->lock));
    return NULL;
}

static void pf_wait_idle(prefetcher *pf) {
    while (pf->state == PF_REQUESTED || pf->state == PF_BUSY)
        MPT_DATA_CHECK(pthread_cond_wait(&pf->cond, &pf->lock));
}

/* Lets the worker finish, so the order can change under no one's feet. */
static void pf_quiesce(mpt_dataset *d) {
    prefetcher *pf = d->pf;
    if (!pf)
        return;
    MPT_DATA_CHECK(pthread_mutex_lock(&pf->lock));
    pf_wait_idle(pf);
    pf->state = PF_IDLE;
    MPT_DATA_CHECK(pthread_mutex_unlock(&pf->lock));
}

static void pf_stop(mpt_dataset *d) {
    prefetcher *pf = d->pf;
    if (!pf)
        return;
    MPT_DATA_CHECK(pthread_mutex_lock(&pf->lock));
    pf->stop = 1;
    MPT_DATA_CHECK(pthread_cond_broadcast(&pf->cond));
    MPT_DATA_CHECK(pthread_mutex_unlock(&pf->lock));
    MPT_DATA_CHECK(pthread_join(pf->thread, NULL));
    MPT_DATA_CHECK(pthread_cond_destroy(&pf->cond));
    MPT_DATA_CHECK(pthread_mutex_destroy(&pf->lock));
    free(pf->x);
    free(pf->labels);
    free(pf);
    d->pf = NULL;
}

static void pf_start(mpt_dataset *d) {
    prefetcher *pf = calloc(1, sizeof *pf);
    MPT_DATA_CHECK(pthread_mutex_init(&pf->lock, NULL));
    MPT_DATA_CHECK(pthread_cond_init(&pf->cond, NULL));
    d->pf = pf;
    MPT_DATA_CHECK(pthread_create(&pf->thread, NULL, pf_main, d));
}

/* Batch `index` through the worker, then asks it for index + 1. Called
 * with pf->lock held. */
static int pf_batch(mpt_dataset *d, int64_t index, int64_t bs, void *x, int32_t *labels,
                    int64_t *n_real, char *err, size_t n) {
    prefetcher *pf = d->pf;
    int ready = (pf->state != PF_IDLE) && pf->index == index && pf->batch_size == bs;
    if (!ready) {
        pf_wait_idle(pf);
        if (pf->cap < bs) {
            free(pf->x);
            free(pf->labels);
            pf->x = malloc(sizeof(float) * (size_t)(bs * d->src->numel));
            pf->labels = malloc(sizeof(int32_t) * (size_t)(bs * d->src->ids_per_sample));
            pf->cap = bs;
        }
        pf->index = index;
        pf->batch_size = bs;
        pf->state = PF_REQUESTED;
        MPT_DATA_CHECK(pthread_cond_broadcast(&pf->cond));
    }
    while (pf->state != PF_DONE)
        MPT_DATA_CHECK(pthread_cond_wait(&pf->cond, &pf->lock));
    int rc = pf->rc;
    if (rc == 0) {
        memcpy(x, pf->x, sizeof(float) * (size_t)(bs * d->src->numel));
        memcpy(labels, pf->labels, sizeof(int32_t) * (size_t)(bs * d->src->ids_per_sample));
        *n_real = pf->n_real;
    } else {
        mpt_data_fail(err, n, "%s", pf->err);
    }
    if (rc == 0 && index + 1 < mpt_data_num_batches(d, bs, MPT_DATA_PAD_REMAINDER)) {
        pf->index = index + 1;
        pf->state = PF_REQUESTED;
        MPT_DATA_CHECK(pthread_cond_broadcast(&pf->cond));
    } else {
        pf->state = PF_IDLE;
    }
    return rc;
}

/* Writes labels into y: i32 [B] ids, f32 [B,C] one-hot, or f32 targets. */
static int emit_labels(const mpt_dataset *d, const int32_t *labels, int64_t bs,
                       int64_t real, mpt_tensor *y, char *err, size_t n) {
    const data_source *s = d->src;
    int64_t per = numel_of(y->shape) / (bs ? bs : 1);
    char buf[64];
    if (y->shape.rank < 1 || y->shape.dim[0] != bs || per * bs != numel_of(y->shape))
        return mpt_data_fail(err, n, "internal error: label tensor %s does not start with "
                             "the batch size %lld", shape_str(y->shape, buf, sizeof buf),
                             (long long)bs);
    if (s->targets.rank) {
        int64_t t = numel_of(s->targets);
        if (y->dtype != MPT_DT_F32 || per != t)
            return mpt_data_fail(err, n, "synthetic targets are f32 %s per sample; the "
                                 "model's target tensor is %s %s", shape_str(s->targets, buf,
                                 sizeof buf), dtype_str(y->dtype),
                                 shape_str(y->shape, buf + 32, 32));
        float *out = y->data;
        /* Targets of the sample's own size (float samples) are its class
         * centroid, the sample without its noise: a denoising task for
         * per-pixel models. Others are the one-hot of the label folded
         * onto t slots. Both are functions of the class, so learnable. */
        int denoise = t == s->numel && s->x_dtype == MPT_DT_F32;
        for (int64_t r = 0; r < bs; r++)
            for (int64_t k = 0; k < t; k++)
                out[r * t + k] = r >= real ? 0.0f
                                 : denoise ? synthetic_centroid(s, labels[r], k)
                                           : (k == labels[r] % t ? 1.0f : 0.0f);
        return 0;
    }
    int64_t k = s->ids_per_sample;
    if (y->dtype == MPT_DT_I32 && per == k) {
        memcpy(y->data, labels, sizeof(int32_t) * (size_t)(bs * k));
        return 0;
    }
    if (y->dtype == MPT_DT_F32 && per == k * s->classes) {
        float *out = y->data;
        memset(out, 0, sizeof(float) * (size_t)(bs * per));
        for (int64_t j = 0; j < real * k; j++)
            out[j * s->classes + labels[j]] = 1.0f;
        return 0;
    }
    /* [B] ids or [B,C] one-hot; for text [B,T] and [B,T,C]. */
    mpt_shape ids = {.rank = 1, .dim = {bs}}, hot;
    for (int i = 0; i < s->id_shape.rank; i++)
        ids.dim[ids.rank++] = s->id_shape.dim[i];
    hot = ids;
    hot.dim[hot.rank++] = s->classes;
    char per_sample[48] = "", hint[160] = "use sparse_categorical_crossentropy for class ids";
    char a[64], b[64];
    if (k > 1) {
        snprintf(per_sample, sizeof per_sample, ", %lld per sample", (long long)k);
        snprintf(hint, sizeof hint, "the model must predict a class at every position: an "
                 "output %s, with sparse_categorical_crossentropy", shape_str(hot, b, sizeof b));
    }
    return mpt_data_fail(err, n, "labels are class ids in [0,%d)%s: the model's target must "
                         "be i32 %s or f32 %s, not %s %s\n  hint: %s", s->classes,
                         per_sample, shape_str(ids, a, sizeof a), shape_str(hot, b, sizeof b),
                         dtype_str(y->dtype), shape_str(y->shape, buf, sizeof buf), hint);
}

int mpt_data_batch(mpt_dataset *d, int64_t index, int64_t bs, mpt_tensor *x,
                   mpt_tensor *y, int64_t *n_real, char *err, size_t n) {
    char buf[64];
    int64_t batches = mpt_data_num_batches(d, bs, MPT_DATA_PAD_REMAINDER);
    if (bs <= 0 || index < 0 || index >= batches)
        return mpt_data_fail(err, n, "internal error: batch %lld of size %lld is outside "
                             "the %lld samples", (long long)index, (long long)bs,
                             (long long)d->n);
    if (x->dtype != d->src->x_dtype || x->shape.rank < 1 || x->shape.dim[0] != bs ||
        numel_of(x->shape) != bs * d->src->numel)
        return mpt_data_fail(err, n, "internal error: input tensor %s %s does not hold %lld "
                             "%s samples of %lld values", dtype_str(x->dtype),
                             shape_str(x->shape, buf, sizeof buf), (long long)bs,
                             dtype_str(d->src->x_dtype), (long long)d->src->numel);
    void *extra[MPT_DATA_MAX_INPUTS];
    for (int j = 0; j < d->src->n_extra; j++) {
        const mpt_data_extra *e = &d->src->extra[j];
        const mpt_tensor *t = &x[1 + j];
        if (t->dtype != e->dtype || t->shape.rank < 1 || t->shape.dim[0] != bs ||
            numel_of(t->shape) != bs * e->numel)
            return mpt_data_fail(err, n, "internal error: input tensor %d, %s %s, does not "
                                 "hold %lld %s samples of %lld values", 1 + j,
                                 dtype_str(t->dtype), shape_str(t->shape, buf, sizeof buf),
                                 (long long)bs, dtype_str(e->dtype), (long long)e->numel);
        extra[j] = t->data;
    }
    int32_t *labels = malloc(sizeof *labels * (size_t)(bs * d->src->ids_per_sample));
    int64_t real = 0;
    int rc;
    if (d->src->kind == MPT_DATA_IMAGES && !mpt_images_cached(d->src->imgs)) {
        if (!d->pf)
            pf_start(d);
        MPT_DATA_CHECK(pthread_mutex_lock(&d->pf->lock));
        rc = pf_batch(d, index, bs, x->data, labels, &real, err, n);
        MPT_DATA_CHECK(pthread_mutex_unlock(&d->pf->lock));
    } else {
        rc = assemble(d, index, bs, x->data, extra, labels, &real, err, n);
    }
    if (rc == 0 && y)
        rc = emit_labels(d, labels, bs, real, y, err, n);
    if (rc == 0 && n_real)
        *n_real = real;
    free(labels);
    return rc;
}

/* ---- sample ids (for augment.c) ---------------------------------------- */

int64_t mpt_data_sample_id(const mpt_dataset *d, int64_t position) {
    return d->order ? d->order[position] : position;
}
