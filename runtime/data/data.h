/* runtime/data/data.h — the data pipeline: data specs, data sets, shuffling and
 * batches.
 *
 * A data spec is the string a .mpt train block or `--data SPEC` gives:
 *
 *   fashion_mnist                      Fashion-MNIST, train 60000 / test 10000,
 *   fashion_mnist(dir="/path")         [28,28,1] pixels scaled to [0,1]
 *   synthetic(shape=[784], classes=10, samples=60000, seed=1)
 *   synthetic(..., targets=[10])       float targets instead of labels
 *   synthetic(..., dtype=i32, vocab=1000)   token inputs in [0,vocab)
 *   synthetic(..., ids=[128])          a class id at every position (a
 *                                      sequence model's labels, as text's)
 *   images("dir", size=[h,w])          Keras' image_dataset_from_directory
 *   idx("images.gz", "labels.gz")      any IDX pair (gzip or plain)
 *   text("path", seq_len=128)          bytes of a text file or folder, for
 *                                      next-byte language modelling
 *
 * Options, all optional:
 *   synthetic  shape= (default: the model's input shape), classes=10,
 *              samples=60000, test_samples=samples/6, seed=1, targets=[...],
 *              dtype=f32|i32, vocab=1000, ids=[...]
 *   images     size=[h,w] (default: the model's input [h,w,c]),
 *              validation_split=0..1, on_error=fatal|skip, seed=1337,
 *              color_mode=rgb|grayscale, cache=auto|true|false
 *   idx        classes= (default: largest label + 1)
 *   text       seq_len= (default: the model's input [T]), test_fraction=0.1
 *
 * Errors. Every function that can fail for a user reason returns -1 (or
 * NULL) and writes into err a message naming the file or the spec, followed
 * by "\n  hint: ..." where there is something to do. The message carries no
 * program name; the CLI prints "mptc: " (or "--data: ") before it.
 *
 * Samples. Inputs are f32 (pixels x/255 in [0,1], synthetic values) or i32
 * (synthetic tokens, text bytes). The caller names the sample shape its
 * model wants; any shape with the same element count is accepted ([784]
 * and [28,28,1] both take Fashion-MNIST). Labels are i32 class ids in
 * [0, classes), or f32 targets of a fixed shape for
 * synthetic(..., targets=[...]), or for text an i32 sequence [T] of ids.
 *
 * Text. The corpus is the bytes b[0..N) of the file, or of every regular
 * file below the folder (recursively, each folder's entries in strcmp
 * order, concatenated with nothing between; hidden entries, files that hold
 * a NUL byte (binary, such as fortune's .dat indexes) and second paths to a
 * file already read (symlinks) are left out). Sample i is the window
 * b[iT .. iT+T] of T+1 bytes, so windows step by T and neighbours share one
 * byte: x = its first T bytes, y = its last T (the next byte at every
 * position), both i32 [T] ids in [0,256). There are W = (N-1)/T windows;
 * the train part is the first floor(W * (1 - test_fraction)), the test
 * part the rest. The corpus is read once per process while any data set
 * uses it.
 */
#ifndef MPT_DATA_H
#define MPT_DATA_H

#include <stddef.h>
#include <stdint.h>
#include "ir/ir.h"

/* ---- specs ------------------------------------------------------------ */

typedef enum {
    MPT_DATA_FASHION_MNIST,
    MPT_DATA_SYNTHETIC,
    MPT_DATA_IMAGES,
    MPT_DATA_IDX,
    MPT_DATA_TEXT,
    MPT_DATA_KIND_COUNT
} mpt_data_kind;

typedef enum {
    MPT_DATA_ON_ERROR_FATAL,
    MPT_DATA_ON_ERROR_SKIP,
} mpt_data_on_error;

typedef enum {
    MPT_DATA_CACHE_AUTO, /* cache decoded images when they fit the budget */
    MPT_DATA_CACHE_ON,
    MPT_DATA_CACHE_OFF,
} mpt_data_cache;

/* The default directory of fashion_mnist and the budget of the image cache. */
#define MPT_DATA_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
#define MPT_DATA_CACHE_BUDGET ((int64_t)1 << 30)

/* A parsed spec. Fields a kind does not use stay zero. Strings are owned. */
typedef struct {
    mpt_data_kind kind;
    char *dir;                /* fashion_mnist, images */
    char *images_path;        /* idx */
    char *labels_path;        /* idx */
    char *text_path;          /* text: a file or a folder */
    int64_t seq_len;          /* text; 0 = the model's input length */
    double test_fraction;     /* text */
    mpt_shape shape;          /* synthetic sample shape; rank 0 = the model's */
    mpt_shape size;           /* images [h,w]; rank 0 = from the model's input */
    mpt_shape targets;        /* synthetic targets; rank 0 = sparse labels */
    mpt_shape ids;            /* synthetic class ids per sample; rank 0 = one */
    int classes;              /* 0 = the kind's default */
    int64_t samples, test_samples;
    uint64_t seed;
    int seed_set;
    mpt_dtype dtype;          /* synthetic input dtype: f32 or i32 */
    int64_t vocab;            /* synthetic i32 tokens are in [0, vocab) */
    double validation_split;  /* images: 0 = none */
    mpt_data_on_error on_error;
    int channels;             /* images: 3 (rgb) or 1 (grayscale) */
    mpt_data_cache cache;
} mpt_data_spec;

/* Parses text into *out (zeroed first). 0, or -1 with a message such as
 * "unknown data set 'foo' (known: fashion_mnist, ...)". */
int mpt_data_spec_parse(const char *text, mpt_data_spec *out, char *err, size_t n);
void mpt_data_spec_free(mpt_data_spec *s);
const char *mpt_data_kind_name(mpt_data_kind k); /* "fashion_mnist", ... */
/* 1 when the spec names a data set with a separate test part
 * (fashion_mnist, synthetic, text), 0 when not or when it does not parse. */
int mpt_data_has_test(const char *spec);

/* ---- data sets --------------------------------------------------------- */

typedef struct mpt_dataset mpt_dataset;

typedef enum { MPT_DATA_TRAIN, MPT_DATA_TEST } mpt_data_part;

/* The inputs of a model of several inputs, in the model's order. The first
 * is fed as a one-input model's is (its shape as sample_shape below, its
 * dtype the data set's own: mpt_data_input_dtype, which the caller checks);
 * the others are fed by name, by the kinds that can:
 *   synthetic  each further input with its own shape and dtype, from its
 *              own stream (seed, input, sample): f32 values half the class
 *              centroid and half noise, i32 ids in [0, vocab) the class's
 *              own id half the time, as the first input; an input read
 *              only as an attention mask is a padding mask instead, 1 for
 *              the first L of its last dim's S steps and 0 after, L drawn
 *              in [1, S] per sample (the same for every row of a [T, S]
 *              mask), so no row is fully masked
 *   text       an attention-mask input is all ones: its windows are never
 *              padded; any other further input is an error
 * fashion_mnist, images and idx hold one input a sample: a further input
 * is an error with a hint. */
#define MPT_DATA_MAX_INPUTS 8
typedef struct {
    const char *name;  /* the model's name for it, for messages */
    mpt_shape shape;   /* without the batch dim */
    mpt_dtype dtype;   /* f32 or i32 */
    int64_t vocab;     /* i32: ids below it (0: the spec's vocab, else 1000) */
    int mask_only;     /* read only as an attention mask (nonzero attends) */
} mpt_data_input;

/* Opens one part of the data set a spec names. sample_shape is the model's
 * input shape without the batch dim (rank 0: the data set's own shape).
 * Files are read once per process while any data set uses them. */
int mpt_data_open(const char *spec, mpt_data_part part, mpt_shape sample_shape,
                  mpt_dataset **out, char *err, size_t n);
int mpt_data_open_spec(const mpt_data_spec *spec, mpt_data_part part,
                       mpt_shape sample_shape, mpt_dataset **out, char *err,
                       size_t n);
/* The same for a model of n_inputs inputs (1 to MPT_DATA_MAX_INPUTS); with
 * one, as mpt_data_open(inputs[0].shape). */
int mpt_data_open_inputs(const char *spec, mpt_data_part part, const mpt_data_input *inputs,
                         int n_inputs, mpt_dataset **out, char *err, size_t n);
int mpt_data_open_spec_inputs(const mpt_data_spec *spec, mpt_data_part part,
                              const mpt_data_input *inputs, int n_inputs, mpt_dataset **out,
                              char *err, size_t n);
void mpt_data_free(mpt_dataset *d);

int64_t mpt_data_count(const mpt_dataset *d);
mpt_shape mpt_data_sample_shape(const mpt_dataset *d); /* as the caller asked */
mpt_dtype mpt_data_input_dtype(const mpt_dataset *d);  /* f32 or i32 */
int mpt_data_n_inputs(const mpt_dataset *d);          /* the inputs each batch fills */
int mpt_data_num_classes(const mpt_dataset *d);
/* Per-sample label shape and dtype: rank 0 i32 for class ids, the f32
 * targets shape of synthetic(..., targets=[...]), or i32 [T] for text (a
 * class id, of 256, per position). */
mpt_shape mpt_data_label_shape(const mpt_dataset *d);
mpt_dtype mpt_data_label_dtype(const mpt_dataset *d);
/* The validation_split the spec itself asked for (images), else 0. */
double mpt_data_spec_validation_split(const mpt_dataset *d);
/* Name of class c: the folder name for images, Fashion-MNIST's names
 * ("T-shirt/top", ...), else "0", "1", ... written into buf. */
const char *mpt_data_class_name(const mpt_dataset *d, int c, char buf[16]);

/* Splits d as Keras' fit(validation_split=f) does, before any shuffling:
 * the first floor(n * (1 - f)) samples in d's file order become *train and
 * the rest *val. d stays valid; the three are freed independently. */
int mpt_data_split(const mpt_dataset *d, double validation_fraction,
                   mpt_dataset **train, mpt_dataset **val, char *err, size_t n);

/* ---- shuffling and batches -------------------------------------------- */

/* Sets the sample order for one epoch: a Fisher-Yates permutation of
 * 0..n-1 drawn from xoshiro256** seeded through splitmix64 with
 * key = mix(mix(seed) + epoch). It depends on (seed, epoch, n) only, so a
 * run resumed at epoch e sees the order the first run would have. */
void mpt_data_shuffle(mpt_dataset *d, uint64_t seed, int64_t epoch);
void mpt_data_unshuffle(mpt_dataset *d); /* back to the file order */
/* The permutation mpt_data_shuffle uses, written into order[0..n). */
void mpt_data_permutation(int64_t n, uint64_t seed, int64_t epoch, int64_t *order);

/* Training drops the last partial batch so every step has the same static
 * shape (Keras would keep it as a smaller batch); evaluation keeps it,
 * padded. */
typedef enum { MPT_DATA_DROP_REMAINDER, MPT_DATA_PAD_REMAINDER } mpt_data_remainder;
int64_t mpt_data_num_batches(const mpt_dataset *d, int64_t batch_size,
                             mpt_data_remainder r);

/* Fills batch `index` of size B in the current order.
 *   x: f32 (or i32 for token data) with B * sample elements, any shape
 *      whose first dim is B, e.g. [B,28,28,1] or [B,784]. x points at
 *      mpt_data_n_inputs(d) tensors, the model's inputs in order (a step's
 *      first INPUTs are the model's, lang/lang.h), each [B, its shape].
 *   y: i32 [B] class ids, or f32 [B,C] one-hot of them, or for synthetic
 *      targets f32 [B, targets...]; for text i32 [B,T] next-byte ids or
 *      f32 [B,T,256] one-hot of them; y may be NULL.
 * A partial last batch is padded with zero inputs and label 0; *n_real
 * (may be NULL) says how many rows are real, so metrics count only them.
 * Image data sets that are not cached decode the next batch on a
 * background thread while the caller works on this one. */
int mpt_data_batch(mpt_dataset *d, int64_t index, int64_t batch_size,
                   mpt_tensor *x, mpt_tensor *y, int64_t *n_real, char *err,
                   size_t n);

/* ---- IDX files (idx.c), also read by `mptc predict` ---- */

/* A decoded IDX file of unsigned bytes, shared by every data set that reads
 * the same path while any of them lives. */
typedef struct mpt_idx_file {
    char *path;
    int refs;
    int rank;
    int64_t dim[4];
    uint8_t *data; /* dim[0] * dim[1] * ... bytes */
} mpt_idx_file;

/* Reads path (gzip or plain) and checks it is an IDX file of unsigned
 * bytes: rank 1 (labels, magic 0x00000801) or, for rank 0, images of rank
 * 3 (magic 0x00000803; ranks 2 and 4 also pass, for other IDX image sets).
 * missing_hint follows "file not found"; damaged_hint follows every
 * error about the file's contents. */
mpt_idx_file *mpt_idx_acquire(const char *path, int rank, const char *missing_hint,
                              const char *damaged_hint, char *err, size_t n);
void mpt_idx_release(mpt_idx_file *f);

/* ---- one image (images.c), also read by `mptc predict` ---- */

/* Decodes one PNG or JPEG file into 8-bit RGB (w*h*3 bytes, caller frees);
 * with pixels NULL it reads and checks only the header. */
int mpt_image_decode_rgb8(const char *path, uint8_t **pixels, int *w, int *h,
                          char *err, size_t n);
/* Bilinear resize with half-pixel centers (tf.image.resize, no antialias)
 * of an 8-bit image with c channels to oh x ow floats scaled by `scale`. */
void mpt_image_resize_bilinear(const uint8_t *src, int sw, int sh, int c,
                               float *dst, int64_t ow, int64_t oh, float scale);

/* ---- augmentation (augment.c) ---- */

/* A list of Keras 3 image preprocessing layers, as the text of a train
 * block's `augment = [...]` or `mptc train --augment TEXT`:
 *
 *   [random_flip("horizontal"), random_translation(0.1, 0.1),
 *    random_rotation(0.05), random_contrast(0.2)]
 *
 *   random_flip(mode="horizontal_and_vertical", seed=None)
 *   random_translation(height_factor, width_factor, fill_mode="reflect",
 *                      interpolation="bilinear", seed=None, fill_value=0.0)
 *   random_rotation(factor, fill_mode="reflect", interpolation="bilinear",
 *                   seed=None, fill_value=0.0)
 *   random_contrast(factor, value_range=[0,1], seed=None)
 *
 * Arguments are positional in Keras' order or named; a factor is a number
 * f (the range [-f, f]; for random_contrast [1-f, 1+f]) or a pair [lo, hi].
 * fill_mode is reflect, wrap, constant or nearest; interpolation bilinear or
 * nearest. The layers run in list order on each training image, f32 HWC
 * with pixels in [0,1]; validation and test batches are never augmented.
 *
 * Determinism. Every random draw is a function of (seed, epoch, the
 * sample's index in the data set's file order, the augmentation's position
 * in the list, its seed=) through splitmix64 and nothing else: not the
 * batch a sample falls in, the thread that augments it, or timing. A run
 * resumed at epoch e, or run with another number of threads, sees the
 * same images as the first run. */
typedef struct mpt_augment mpt_augment;

/* Parses text into *out. 0, or -1 with a message that names the
 * augmentation and argument and says what to write instead. "[]" is a
 * valid, empty list. */
int mpt_augment_parse(const char *text, mpt_augment **out, char *err, size_t n);
void mpt_augment_free(mpt_augment *a);
int mpt_augment_count(const mpt_augment *a); /* 0 for NULL */

/* 0 when d's training batches are images the augmentations can take: f32
 * samples of shape [height,width,channels] (fashion_mnist or idx(...) read
 * as [28,28,1], images(...)); else -1 with a hint (token data; a model whose
 * input is [784] rather than [28,28,1]). An empty list passes anything. */
int mpt_augment_check(const mpt_augment *a, const mpt_dataset *d, char *err, size_t n);

/* Augments one image in place. img is f32 (h,w,c); scratch holds h*w*c
 * floats. sample is the image's index in its data set's file order. */
void mpt_augment_image(const mpt_augment *a, float *img, int64_t h, int64_t w, int64_t c,
                       uint64_t seed, int64_t epoch, int64_t sample, float *scratch);

/* mpt_data_batch, then every real row of x augmented (a may be NULL: no
 * augmentation). x is f32 [B,h,w,c]. threads: how many threads share the
 * rows (0: up to 4, at most half the cores); the result does not depend on
 * it. */
int mpt_augment_batch(const mpt_augment *a, mpt_dataset *d, uint64_t seed, int64_t epoch,
                      int64_t index, int64_t batch_size, int threads, mpt_tensor *x,
                      mpt_tensor *y, int64_t *n_real, char *err, size_t n);

/* The index in d's file order of the sample at `position` of the current
 * order (mpt_data_shuffle's), 0 <= position < mpt_data_count(d). (data.c) */
int64_t mpt_data_sample_id(const mpt_dataset *d, int64_t position);

/* ---- prefetching (prefetch.c) ---- */

/* A worker thread that fills the next training batch (mpt_augment_batch)
 * while the caller runs the current step:
 *
 *   mpt_prefetch_start(p, e, 0, &x[0], &y[0]);
 *   for (b = 0; b < batches; b++) {
 *       mpt_prefetch_wait(p, &real, err, n);              batch b is ready
 *       if (b + 1 < batches) mpt_prefetch_start(p, e, b + 1, &x[(b+1)%2], &y[(b+1)%2]);
 *       step(x[b%2], y[b%2]);
 *   }
 *
 * Between a start and its wait the worker owns x, y and d: the caller must
 * not touch them, nor shuffle d (shuffle for epoch e + 1 after the last
 * wait of epoch e, then start its batch 0). The images are those
 * mpt_augment_batch gives for the same arguments. */
typedef struct mpt_prefetch mpt_prefetch;

/* aug may be NULL (no augmentation); it and d must outlive p. threads as
 * in mpt_augment_batch. NULL with a message when the thread cannot start. */
mpt_prefetch *mpt_prefetch_new(mpt_dataset *d, int64_t batch_size, const mpt_augment *aug,
                               uint64_t seed, int threads, char *err, size_t n);
/* Asks for batch `index` of `epoch` in x and y (y may be NULL) and returns
 * at once. -1 when a batch is already in flight (wait for it first). */
int mpt_prefetch_start(mpt_prefetch *p, int64_t epoch, int64_t index, mpt_tensor *x,
                       mpt_tensor *y);
/* Waits for the batch started last: 0, or -1 with its error. */
int mpt_prefetch_wait(mpt_prefetch *p, int64_t *n_real, char *err, size_t n);
/* Waits for a batch in flight, then stops the thread. NULL is fine. */
void mpt_prefetch_free(mpt_prefetch *p);

#endif
