/* runtime/data/text.c — text("path", seq_len=T): the bytes of a file or a
 * folder, cut into windows for next-byte language modelling.
 *
 * The corpus b[0..N) is the file, or every regular file below the folder
 * (recursively; each folder's entries in strcmp order, a subfolder read
 * where its name sorts) concatenated with nothing between. Left out of a
 * folder: hidden entries, as images(...) skips them; files holding a NUL
 * byte, which are binary (fortune's .dat indexes beside its text files);
 * and a file or folder reached a second time through a link (fortune's
 * .u8 links), which also ends link loops. A file named on its own is read
 * whatever its bytes.
 *
 * Window i is b[iT .. iT+T], T+1 bytes: x = its first T, y = its last T.
 * Windows step by T, so each byte but the first is a target exactly once.
 * The corpus is read once and shared, as IDX files are, by every data set
 * of the process that names the same path: the train and test parts.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "runtime/data/data_impl.h"

/* The whole corpus lives in memory; past this a folder was surely named by
 * mistake (text("/") would read the disk). */
#define TEXT_MAX_BYTES ((int64_t)1 << 32)

#define TEXT_MISSING_HINT                                                      \
    "give a text file or a folder of them; `apt-get install fortunes` gives "   \
    "/usr/share/games/fortunes, a folder of English text"

typedef struct corpus {
    char *path;
    int refs;
    uint8_t *data;
    int64_t n;
    int binary_skipped; /* files of a folder left out for a NUL byte */
} corpus;

struct mpt_text_set {
    corpus *c;
    int64_t first, n; /* windows [first, first + n) of the corpus */
    int64_t seq_len;
};

/* ---- reading ------------------------------------------------------------ */

typedef struct {
    dev_t dev;
    ino_t ino;
} file_id;

typedef struct {
    corpus *c;
    int64_t cap;
    file_id *seen; /* files and folders read so far */
    int n_seen, cap_seen;
} reader;

/* 1 when st's file was read already; else records it. A linear search:
 * corpora are folders of tens or hundreds of files. */
static int seen_before(reader *r, const struct stat *st) {
    for (int i = 0; i < r->n_seen; i++)
        if (r->seen[i].dev == st->st_dev && r->seen[i].ino == st->st_ino)
            return 1;
    if (r->n_seen == r->cap_seen)
        r->seen = realloc(r->seen, sizeof *r->seen *
                                       (size_t)(r->cap_seen = r->cap_seen ? 2 * r->cap_seen : 64));
    r->seen[r->n_seen++] = (file_id){st->st_dev, st->st_ino};
    return 0;
}

static int grow(reader *r, int64_t need, const char *path, char *err, size_t n) {
    if (need > TEXT_MAX_BYTES)
        return mpt_data_fail(err, n, "%s: the text is over %lld bytes\n  hint: text(...) "
                             "keeps the whole corpus in memory; give a smaller file or folder",
                             path, (long long)TEXT_MAX_BYTES);
    if (need <= r->cap)
        return 0;
    int64_t cap = r->cap ? r->cap : 1 << 16;
    while (cap < need)
        cap *= 2;
    uint8_t *data = realloc(r->c->data, (size_t)cap);
    if (!data)
        return mpt_data_fail(err, n, "%s: out of memory for %lld bytes of text", path,
                             (long long)cap);
    r->c->data = data;
    r->cap = cap;
    return 0;
}

/* Appends the file at path (a regular file, size from st) to the corpus;
 * in a folder, one holding a NUL byte is taken back out. Reads to the end
 * rather than to st_size, which a file still being written outgrows. */
static int read_file(reader *r, const char *path, const struct stat *st, int in_folder,
                     char *err, size_t n) {
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return mpt_data_fail(err, n, "%s: cannot open: %s\n  hint: check the file's "
                             "permissions", path, strerror(errno));
    corpus *c = r->c;
    int64_t start = c->n;
    int rc = grow(r, start + st->st_size + 1, path, err, n);
    while (rc == 0) {
        if (c->n == r->cap && (rc = grow(r, r->cap + 1, path, err, n)))
            break;
        ssize_t got = read(fd, c->data + c->n, (size_t)(r->cap - c->n));
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            rc = mpt_data_fail(err, n, "%s: cannot read: %s\n  hint: check the file and "
                               "the disk it is on", path, strerror(errno));
        if (got <= 0)
            break;
        c->n += got;
    }
    close(fd);
    if (rc == 0 && in_folder && memchr(c->data + start, 0, (size_t)(c->n - start))) {
        c->n = start;
        c->binary_skipped++;
    }
    return rc;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int read_path(reader *r, const char *path, int in_folder, char *err, size_t n);

/* Reads the visible entries of dir in strcmp order. */
static int read_dir(reader *r, const char *dir, char *err, size_t n) {
    DIR *d = opendir(dir);
    if (!d)
        return mpt_data_fail(err, n, "%s: cannot open the folder: %s\n  hint: check its "
                             "permissions", dir, strerror(errno));
    char **names = NULL;
    int len = 0, cap = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (len == cap)
            names = realloc(names, sizeof *names * (size_t)(cap = cap ? 2 * cap : 32));
        names[len++] = strdup(e->d_name);
    }
    closedir(d);
    if (len)
        qsort(names, (size_t)len, sizeof *names, cmp_str);
    for (int i = 0; i < len; i++) {
        char *path;
        if (asprintf(&path, "%s/%s", dir, names[i]) < 0)
            abort();
        if (rc == 0)
            rc = read_path(r, path, 1, err, n);
        free(path);
        free(names[i]);
    }
    free(names);
    return rc;
}

/* A file, or a folder's files, appended to the corpus. Links are followed;
 * a dangling one inside a folder names nothing to read and is passed. */
static int read_path(reader *r, const char *path, int in_folder, char *err, size_t n) {
    struct stat st;
    if (stat(path, &st) != 0) {
        if (in_folder && errno == ENOENT)
            return 0;
        if (errno == ENOENT || errno == ENOTDIR)
            return mpt_data_fail(err, n, "%s: no such file or folder\n  hint: "
                                 TEXT_MISSING_HINT, path);
        return mpt_data_fail(err, n, "%s: %s\n  hint: check the path and its permissions", path,
                             strerror(errno));
    }
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) /* a FIFO would block, or never end */
        return mpt_data_fail(err, n, "%s: is not a regular file (a pipe, a socket or a "
                             "device?)\n  hint: text(...) reads files; save the stream to a "
                             "file first%s", path, in_folder ? ", or move it out of the folder" : "");
    if (in_folder && seen_before(r, &st))
        return 0;
    if (S_ISDIR(st.st_mode)) {
        if (!in_folder)
            seen_before(r, &st);
        return read_dir(r, path, err, n);
    }
    return read_file(r, path, &st, in_folder, err, n);
}

static corpus *corpus_read(const char *path, char *err, size_t n) {
    corpus *c = calloc(1, sizeof *c);
    reader r = {.c = c};
    int rc = read_path(&r, path, 0, err, n);
    free(r.seen);
    if (rc) {
        free(c->data);
        free(c);
        return NULL;
    }
    c->path = strdup(path);
    return c;
}

/* ---- sharing ------------------------------------------------------------ */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static corpus **registry;
static int registry_len, registry_cap;

static corpus *corpus_acquire(const char *path, char *err, size_t n) {
    MPT_DATA_CHECK(pthread_mutex_lock(&registry_lock));
    for (int i = 0; i < registry_len; i++)
        if (!strcmp(registry[i]->path, path)) {
            registry[i]->refs++;
            MPT_DATA_CHECK(pthread_mutex_unlock(&registry_lock));
            return registry[i];
        }
    /* Reading under the lock keeps two threads from reading the same text. */
    corpus *c = corpus_read(path, err, n);
    if (c) {
        c->refs = 1;
        if (registry_len == registry_cap)
            registry = realloc(registry, sizeof *registry *
                                             (size_t)(registry_cap = registry_cap ? 2 * registry_cap : 4));
        registry[registry_len++] = c;
    }
    MPT_DATA_CHECK(pthread_mutex_unlock(&registry_lock));
    return c;
}

static void corpus_release(corpus *c) {
    if (!c)
        return;
    MPT_DATA_CHECK(pthread_mutex_lock(&registry_lock));
    if (--c->refs == 0) {
        for (int i = 0; i < registry_len; i++)
            if (registry[i] == c)
                registry[i] = registry[--registry_len];
        free(c->path);
        free(c->data);
        free(c);
    }
    if (registry_len == 0) {
        free(registry);
        registry = NULL;
        registry_cap = 0;
    }
    MPT_DATA_CHECK(pthread_mutex_unlock(&registry_lock));
}

/* ---- windows ------------------------------------------------------------ */

/* seq_len from the spec or the model's input [T]; both must agree. */
static int pick_seq_len(const mpt_data_spec *spec, mpt_shape want, int64_t *T, char *err,
                        size_t n) {
    if (want.rank > 1) {
        char dims[96] = "";
        for (int i = 0; i < want.rank; i++)
            snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", i ? "," : "",
                     (long long)want.dim[i]);
        return mpt_data_fail(err, n, "text: samples are [seq_len] byte ids, but the model's "
                             "input is [%s]\n  hint: give the model an input [T] of token ids "
                             "feeding an embedding", dims);
    }
    if (want.rank == 1 && spec->seq_len && spec->seq_len != want.dim[0])
        return mpt_data_fail(err, n, "text: seq_len=%lld but the model's input is [%lld]\n"
                             "  hint: leave out seq_len= (it defaults to the model's input "
                             "length), or make the input [%lld]", (long long)spec->seq_len,
                             (long long)want.dim[0], (long long)spec->seq_len);
    *T = spec->seq_len ? spec->seq_len : want.rank == 1 ? want.dim[0] : 0;
    if (*T < 1)
        return mpt_data_fail(err, n, "text: no seq_len\n  hint: give one, as in "
                             "text(\"%s\", seq_len=128), or a model whose input is [T]",
                             spec->text_path);
    return 0;
}

/* Windows [first, first + count) of the part, or an error when either part
 * would be empty. */
static int pick_windows(const mpt_data_spec *spec, const corpus *c, int64_t T,
                        mpt_data_part part, int64_t *first, int64_t *count, char *err,
                        size_t n) {
    int64_t windows = c->n > 0 ? (c->n - 1) / T : 0;
    if (windows < 2) {
        char skipped[128] = "";
        if (c->binary_skipped)
            snprintf(skipped, sizeof skipped, " (%d file%s holding NUL bytes left out as "
                     "binary)", c->binary_skipped, c->binary_skipped == 1 ? "" : "s");
        return mpt_data_fail(err, n, "%s: the text has %lld bytes%s, fewer than two windows "
                             "of seq_len+1 = %lld bytes (%lld needed)\n  hint: give more "
                             "text, or a smaller seq_len", spec->text_path, (long long)c->n,
                             skipped, (long long)T + 1, (long long)(2 * T + 1));
    }
    int64_t train = (int64_t)((double)windows * (1.0 - spec->test_fraction));
    if (train < 1 || train >= windows)
        return mpt_data_fail(err, n, "%s: test_fraction=%g of %lld windows leaves an empty "
                             "%s part\n  hint: use a fraction that leaves windows on both "
                             "sides, or a smaller seq_len", spec->text_path,
                             spec->test_fraction, (long long)windows,
                             train < 1 ? "train" : "test");
    *first = part == MPT_DATA_TEST ? train : 0;
    *count = part == MPT_DATA_TEST ? windows - train : train;
    return 0;
}

mpt_text_set *mpt_text_open(const mpt_data_spec *spec, mpt_data_part part, mpt_shape want,
                            char *err, size_t n) {
    int64_t T = 0, first = 0, count = 0;
    /* A missing file is named before a missing seq_len: it is the first
     * thing to fix. */
    corpus *c = corpus_acquire(spec->text_path, err, n);
    if (!c)
        return NULL;
    if (pick_seq_len(spec, want, &T, err, n) ||
        pick_windows(spec, c, T, part, &first, &count, err, n)) {
        corpus_release(c);
        return NULL;
    }
    mpt_text_set *t = malloc(sizeof *t);
    *t = (mpt_text_set){.c = c, .first = first, .n = count, .seq_len = T};
    return t;
}

void mpt_text_free(mpt_text_set *t) {
    if (!t)
        return;
    corpus_release(t->c);
    free(t);
}

int64_t mpt_text_count(const mpt_text_set *t) { return t->n; }
int64_t mpt_text_seq_len(const mpt_text_set *t) { return t->seq_len; }

/* x is (T) byte ids of window i's first T bytes; y, when not NULL, the
 * (T) ids one byte later. */
void mpt_text_window(const mpt_text_set *t, int64_t i, int32_t *x, int32_t *y) {
    const uint8_t *b = t->c->data + (t->first + i) * t->seq_len;
    for (int64_t j = 0; j < t->seq_len; j++) {
        if (x)
            x[j] = b[j];
        if (y)
            y[j] = b[j + 1];
    }
}
