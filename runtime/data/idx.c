/* runtime/data/idx.c — the IDX files MNIST and Fashion-MNIST ship in.
 *
 * Layout (big-endian): magic 00 00 TT RR (TT = 0x08 unsigned byte, RR =
 * rank), then RR u32 dims, then dim0 * dim1 * ... bytes. Files may be gzip
 * compressed; zlib's gzread reads plain files unchanged.
 *
 * Every header field is checked against what follows it, so a damaged file
 * gets a message naming it rather than a crash or garbage samples. A file
 * is decoded once and shared while any data set holds it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>
#include "runtime/data/data_impl.h"

/* Larger than any IDX set we expect; it stops a corrupt header from asking
 * for an absurd allocation. */
#define IDX_MAX_BYTES ((int64_t)1 << 36)

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static mpt_idx_file **registry;
static int registry_len, registry_cap;

static int damaged(char *err, size_t n, const char *path, const char *hint,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int damaged(char *err, size_t n, const char *path, const char *hint,
                   const char *fmt, ...) {
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return mpt_data_fail(err, n, "%s: %s\n  hint: %s", path, what, hint);
}

/* Reads exactly len bytes; -1 with a message if the stream ends early or
 * is corrupt. */
static int read_exact(gzFile f, void *buf, int64_t len, const char *path,
                      const char *hint, const char *what, char *err, size_t n) {
    uint8_t *p = buf;
    int64_t done = 0;
    while (done < len) {
        unsigned chunk = (unsigned)(len - done > (1 << 30) ? 1 << 30 : len - done);
        int got = gzread(f, p + done, chunk);
        if (got < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            return damaged(err, n, path, hint, "corrupt gzip data while reading %s (%s)",
                           what, msg);
        }
        if (got == 0)
            break;
        done += got;
    }
    if (done < len) {
        int zerr;
        const char *msg = gzerror(f, &zerr);
        if (zerr != Z_OK && zerr != Z_STREAM_END)
            return damaged(err, n, path, hint, "corrupt gzip data while reading %s (%s)",
                           what, msg);
        return damaged(err, n, path, hint,
                       "truncated: the file ends after %lld of the %lld bytes of %s",
                       (long long)done, (long long)len, what);
    }
    return 0;
}

static uint32_t be32(const uint8_t *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

static mpt_idx_file *idx_read(const char *path, int rank, const char *missing_hint,
                              const char *hint, char *err, size_t n) {
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            mpt_data_fail(err, n, "%s: file not found\n  hint: %s", path, missing_hint);
        else
            mpt_data_fail(err, n, "%s: %s\n  hint: %s", path, strerror(errno), missing_hint);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        mpt_data_fail(err, n, "%s: is a directory, not an IDX file\n  hint: %s", path,
                      missing_hint);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) { /* a FIFO or device would block, or never end */
        mpt_data_fail(err, n, "%s: is not a regular file (a pipe or a device?)\n  hint: %s", path,
                      missing_hint);
        return NULL;
    }
    gzFile f = gzopen(path, "rb");
    if (!f) {
        mpt_data_fail(err, n, "%s: cannot open: %s\n  hint: check the file's permissions",
                      path, strerror(errno));
        return NULL;
    }
    mpt_idx_file *idx = calloc(1, sizeof *idx);
    uint8_t head[4 + 4 * 4];
    if (read_exact(f, head, 4, path, hint, "the header", err, n))
        goto fail;
    uint32_t magic = be32(head);
    int want_magic_rank = rank == 1 ? 1 : 3;
    int file_rank = head[3];
    int rank_ok = rank == 1 ? file_rank == 1 : file_rank >= 2 && file_rank <= 4;
    if (head[0] != 0 || head[1] != 0 || head[2] != 0x08 || !rank_ok) {
        damaged(err, n, path, hint,
                "not an IDX %s file of unsigned bytes (magic 0x%08x, expected 0x%08x)",
                rank == 1 ? "label" : "image", (unsigned)magic, 0x800u | want_magic_rank);
        goto fail;
    }
    idx->rank = file_rank;
    if (read_exact(f, head + 4, 4 * file_rank, path, hint, "the header", err, n))
        goto fail;
    int64_t total = 1;
    for (int i = 0; i < file_rank; i++) {
        idx->dim[i] = be32(head + 4 + 4 * i);
        if (idx->dim[i] == 0) {
            damaged(err, n, path, hint, "header dim %d is 0", i);
            goto fail;
        }
        if (idx->dim[i] > IDX_MAX_BYTES / total) {
            damaged(err, n, path, hint, "header dims ask for more than %lld bytes",
                    (long long)IDX_MAX_BYTES);
            goto fail;
        }
        total *= idx->dim[i];
    }
    /* deflate cannot compress more than 1032:1, so a promise beyond that is
     * a damaged header, found before allocating for it. */
    if (total / 1032 > st.st_size) {
        damaged(err, n, path, hint, "truncated: the header promises %lld bytes of data, more "
                "than a %lld-byte file can hold", (long long)total, (long long)st.st_size);
        goto fail;
    }
    /* A plain file's length can be checked before reading it all. */
    if (gzdirect(f) && st.st_size != 4 + 4 * file_rank + total) {
        damaged(err, n, path, hint, "%s: the header promises %lld bytes of data but the "
                "file has %lld",
                st.st_size < 4 + 4 * file_rank + total ? "truncated" : "wrong length",
                (long long)total, (long long)(st.st_size - 4 - 4 * file_rank));
        goto fail;
    }
    idx->data = malloc((size_t)total);
    if (!idx->data) {
        mpt_data_fail(err, n, "%s: out of memory for %lld bytes", path, (long long)total);
        goto fail;
    }
    if (read_exact(f, idx->data, total, path, hint, "the data", err, n))
        goto fail;
    uint8_t extra;
    int more = gzread(f, &extra, 1);
    if (more != 0) {
        if (more > 0)
            damaged(err, n, path, hint, "wrong length: more data after the %lld bytes "
                    "the header promises", (long long)total);
        else
            damaged(err, n, path, hint, "corrupt gzip data at the end of the file (%s)",
                    gzerror(f, &(int){0}));
        goto fail;
    }
    gzclose(f);
    idx->path = strdup(path);
    return idx;
fail:
    gzclose(f);
    free(idx->data);
    free(idx);
    return NULL;
}

mpt_idx_file *mpt_idx_acquire(const char *path, int rank, const char *missing_hint,
                              const char *damaged_hint, char *err, size_t n) {
    MPT_DATA_CHECK(pthread_mutex_lock(&registry_lock));
    for (int i = 0; i < registry_len; i++)
        if (!strcmp(registry[i]->path, path) && (registry[i]->rank == 1) == (rank == 1)) {
            registry[i]->refs++;
            MPT_DATA_CHECK(pthread_mutex_unlock(&registry_lock));
            return registry[i];
        }
    /* Reading under the lock keeps two threads from decoding the same file. */
    mpt_idx_file *f = idx_read(path, rank, missing_hint, damaged_hint, err, n);
    if (f) {
        f->refs = 1;
        if (registry_len == registry_cap) {
            registry_cap = registry_cap ? 2 * registry_cap : 4;
            registry = realloc(registry, sizeof *registry * (size_t)registry_cap);
        }
        registry[registry_len++] = f;
    }
    MPT_DATA_CHECK(pthread_mutex_unlock(&registry_lock));
    return f;
}

void mpt_idx_release(mpt_idx_file *f) {
    if (!f)
        return;
    MPT_DATA_CHECK(pthread_mutex_lock(&registry_lock));
    if (--f->refs == 0) {
        for (int i = 0; i < registry_len; i++)
            if (registry[i] == f)
                registry[i] = registry[--registry_len];
        free(f->path);
        free(f->data);
        free(f);
    }
    if (registry_len == 0) {
        free(registry);
        registry = NULL;
        registry_cap = 0;
    }
    MPT_DATA_CHECK(pthread_mutex_unlock(&registry_lock));
}
