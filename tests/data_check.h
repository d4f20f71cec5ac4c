/* tests/data_check.h — what the data pipeline's tests share: a fresh
 * temporary directory for their fixtures, writers of IDX files, and the
 * expectations of a failed open and a read batch (test_data,
 * test_data_images, test_data_text). */
#ifndef MPTC_TESTS_DATA_CHECK_H
#define MPTC_TESTS_DATA_CHECK_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "runtime/data/data_impl.h"
#include "tests/check.h"

static char tmp[256];
static char err[2048];

static inline char *path_in(const char *name) {
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 512, "%s/%s", tmp, name);
    return p;
}

static inline mpt_tensor tensor(mpt_dtype dt, int rank, const int64_t *dims) {
    mpt_tensor t = {.dtype = dt, .shape = {.rank = rank}};
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= t.shape.dim[i] = dims[i];
    t.data = calloc((size_t)n, 4);
    return t;
}

static inline mpt_shape shape_of(int rank, const int64_t *dims) {
    mpt_shape s = {.rank = rank};
    for (int i = 0; i < rank; i++)
        s.dim[i] = dims[i];
    return s;
}

static const mpt_shape NO_SHAPE = {0};

/* Opens spec and expects failure with a message containing each of the
 * given fragments. */
static inline void expect_open_error(const char *spec, mpt_data_part part, mpt_shape shape,
                                     const char *frag1, const char *frag2) {
    mpt_dataset *d = NULL;
    int rc = mpt_data_open(spec, part, shape, &d, err, sizeof err);
    CHECK_MSG(rc == -1 && d == NULL, "spec %s opened", spec);
    CHECK_MSG(strstr(err, frag1) != NULL, "spec %s: '%s' not in: %s", spec, frag1, err);
    if (frag2)
        CHECK_MSG(strstr(err, frag2) != NULL, "spec %s: '%s' not in: %s", spec, frag2, err);
    mpt_data_free(d);
}

static inline void write_bytes(const char *path, const void *data, size_t n, int gz) {
    if (gz) {
        gzFile f = gzopen(path, "wb");
        gzwrite(f, data, (unsigned)n);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        fwrite(data, 1, n, f);
        fclose(f);
    }
}

/* An IDX file of unsigned bytes: magic 00 00 08 rank, dims, data. */
static inline void write_idx(const char *path, int rank, const uint32_t *dims,
                             const uint8_t *data, size_t len, int gz) {
    size_t head = 4 + 4 * (size_t)rank;
    uint8_t *buf = malloc(head + len);
    buf[0] = buf[1] = 0;
    buf[2] = 0x08;
    buf[3] = (uint8_t)rank;
    for (int i = 0; i < rank; i++)
        for (int b = 0; b < 4; b++)
            buf[4 + 4 * i + b] = (uint8_t)(dims[i] >> (24 - 8 * b));
    memcpy(buf + head, data, len);
    write_bytes(path, buf, head + len, gz);
    free(buf);
}

static inline int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *f) {
    return remove(p);
}

/* batch `index` of bs samples of d into x (bs x the sample's elements)
 * and y; *real: the samples that are not padding */
static inline void read_batch(mpt_dataset *d, int64_t index, int64_t bs, float *x, int32_t *y,
                              int64_t *real) {
    int64_t numel = 1;
    mpt_shape s = mpt_data_sample_shape(d);
    for (int i = 0; i < s.rank; i++)
        numel *= s.dim[i];
    int64_t xd[2] = {bs, numel}, yd[1] = {bs};
    mpt_tensor xt = tensor(mpt_data_input_dtype(d), 2, xd), yt = tensor(MPT_DT_I32, 1, yd);
    int rc = mpt_data_batch(d, index, bs, &xt, &yt, real, err, sizeof err);
    CHECK_MSG(rc == 0, "batch %lld: %s", (long long)index, err);
    memcpy(x, xt.data, sizeof(float) * (size_t)(bs * numel));
    memcpy(y, yt.data, sizeof(int32_t) * (size_t)bs);
    free(xt.data);
    free(yt.data);
}

/* tmp: a fresh directory under $TMPDIR (or /tmp); 0, or -1 when none
 * could be made */
static inline int data_tmp_init(void) {
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(tmp, sizeof tmp, "%s/mptc_data_XXXXXX", base);
    if (mkdtemp(tmp)) return 0;
    perror("mkdtemp");
    return -1;
}

/* removes tmp and everything the test wrote into it */
static inline void data_tmp_remove(void) { nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

#endif
