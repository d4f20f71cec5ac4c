/* runtime/data/data_impl.h — what the files of the data pipeline share among
 * themselves (data.c, dataspec.c, idx.c, images.c, imagedir.c, text.c). Not
 * part of the public surface; callers use runtime/data/data.h.
 */
#ifndef MPT_DATA_IMPL_H
#define MPT_DATA_IMPL_H

#include <pthread.h>
#include <stdarg.h>
#include "runtime/data/data.h"

/* Library calls that fail only on a broken invariant (pthread) go through
 * this check; it names the statement and where it was, then aborts. */
void mpt_data_die(const char *stmt, int rc, const char *func, const char *file,
                  int line);
#define MPT_DATA_CHECK(call)                                                   \
    do {                                                                       \
        int rc_ = (call);                                                      \
        if (rc_ != 0)                                                          \
            mpt_data_die(#call, rc_, __func__, __FILE__, __LINE__);            \
    } while (0)

/* snprintf into err; returns -1 so that `return mpt_data_fail(...)` reads. */
int mpt_data_fail(char *err, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* 1 when the kind has a separate test part (dataspec.c). */
int mpt_data_kind_has_test(mpt_data_kind k);

/* ---- random numbers ---------------------------------------------------- */

/* splitmix64's output function: a bijective 64-bit mix. */
uint64_t mpt_data_mix64(uint64_t x);

/* xoshiro256** (Blackman & Vigna), seeded from splitmix64. */
typedef struct { uint64_t s[4]; } mpt_data_rng;
void mpt_data_rng_seed(mpt_data_rng *r, uint64_t key);
uint64_t mpt_data_rng_next(mpt_data_rng *r);
uint64_t mpt_data_rng_below(mpt_data_rng *r, uint64_t bound); /* unbiased */

/* ---- samples of the generator and of further inputs (inputs.c) -------- */

/* Synthetic values of a sample of class c from the stream key: f32 half
 * the class centroid and half noise, or i32 ids in [0, vocab) that are the
 * class's own half of the time. sample counts from the training part's
 * first sample, so the test part continues its sequence. */
void mpt_data_synthetic_values(uint64_t key, int64_t numel, mpt_dtype dt, int64_t vocab,
                               int64_t sample, int32_t c, void *out);
/* Element j of class c's centroid in [-1, 1), as the values above draw it. */
float mpt_data_synthetic_centroid(uint64_t key, int64_t numel, int32_t c, int64_t j);

/* A further input of a data set (data.h's mpt_data_input): how its values
 * are made. */
typedef struct {
    int ones;          /* text's attention mask: all ones */
    int mask;          /* synthetic padding mask */
    mpt_shape shape;
    int64_t numel;
    mpt_dtype dtype;
    int64_t vocab;
    uint64_t key;      /* its own synthetic stream */
} mpt_data_extra;

/* Checks that spec's kind can feed in[0..n_in) (the inputs after the first)
 * and describes each in ex. key is the first input's synthetic stream. */
int mpt_data_extras_open(const mpt_data_spec *spec, uint64_t key, const mpt_data_input *in,
                         int n_in, mpt_data_extra *ex, char *err, size_t n);
/* Writes the further input's values of sample `sample` of class c. */
void mpt_data_extra_sample(const mpt_data_extra *e, int64_t sample, int32_t c, void *out);

/* ---- image folders (images.c) ------------------------------------------ */

typedef struct mpt_image_set mpt_image_set;

/* Indexes dir as image_dataset_from_directory does, checks headers, and
 * decodes everything into memory when the cache allows. */
mpt_image_set *mpt_images_open(const mpt_data_spec *spec, int64_t h, int64_t w,
                               char *err, size_t n);
void mpt_images_free(mpt_image_set *s);
int64_t mpt_images_count(const mpt_image_set *s);
int mpt_images_num_classes(const mpt_image_set *s);
const char *mpt_images_class_name(const mpt_image_set *s, int c);
int32_t mpt_images_label(const mpt_image_set *s, int64_t i);
int mpt_images_cached(const mpt_image_set *s);
/* Writes sample i as h*w*channels floats in [0,1] (HWC order). */
int mpt_images_sample(mpt_image_set *s, int64_t i, float *out, char *err, size_t n);

/* ---- text corpora (text.c) ---------------------------------------------- */

typedef struct mpt_text_set mpt_text_set;

/* The train or test windows of spec's text; seq_len is the spec's or the
 * model's input [T] (want). The corpus is read at the first open of its
 * path and shared while any set holds it. */
mpt_text_set *mpt_text_open(const mpt_data_spec *spec, mpt_data_part part, mpt_shape want,
                            char *err, size_t n);
void mpt_text_free(mpt_text_set *t);
int64_t mpt_text_count(const mpt_text_set *t);
int64_t mpt_text_seq_len(const mpt_text_set *t);
/* Window i of the part: x (T) input byte ids, y (T) the next byte's ids;
 * either may be NULL. */
void mpt_text_window(const mpt_text_set *t, int64_t i, int32_t *x, int32_t *y);

#endif
