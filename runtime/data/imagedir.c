/* runtime/data/imagedir.c — a folder of images as a data set, the way Keras'
 * image_dataset_from_directory reads one.
 *
 * DIR's subfolders, sorted by name, are the classes 0..C-1; every .png,
 * .jpg and .jpeg file below a class folder (recursively, hidden entries
 * skipped) is a sample of that class. As Keras does with shuffle=True, the
 * file list is shuffled once with the spec's seed (default 1337), so a
 * validation split taken from its end holds every class.
 *
 * Samples are decoded, converted to RGB (or grayscale), resized bilinearly
 * to [h,w] and scaled to [0,1]. When the decoded set fits the cache budget
 * everything is decoded at open, which also finds every damaged file up
 * front; otherwise only headers are checked at open and samples are decoded
 * on demand (data.c does that on a background thread).
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "runtime/data/data_impl.h"

typedef struct {
    char *path;
    int32_t label;
} image_file;

struct mpt_image_set {
    image_file *files;
    int64_t n, cap;
    char **classes;
    int n_classes;
    int64_t h, w;
    int c;
    mpt_data_on_error on_error;
    float *cache;     /* n * h * w * c floats, or NULL */
    uint8_t *warned;  /* per file: its failure was reported */
    pthread_mutex_t warn_lock;
};

#define SKIP_HINT "  hint: fix or delete the file, or add on_error=skip to the data spec " \
                  "to skip unreadable images"

static int has_image_ext(const char *name) {
    const char *dot = strrchr(name, '.');
    if (!dot)
        return 0;
    return !strcasecmp(dot, ".png") || !strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg");
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The visible entries of dir, sorted by name; caller frees. */
static char **list_dir(const char *dir, int *count, char *err, size_t n) {
    DIR *d = opendir(dir);
    if (!d) {
        mpt_data_fail(err, n, "%s: %s\n  hint: images(\"DIR\") wants a folder with one "
                      "subfolder of images per class", dir,
                      errno == ENOENT ? "no such directory" : strerror(errno));
        return NULL;
    }
    char **names = NULL;
    int len = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (len == cap)
            names = realloc(names, sizeof *names * (size_t)(cap = cap ? 2 * cap : 16));
        names[len++] = strdup(e->d_name);
    }
    closedir(d);
    if (len)
        qsort(names, (size_t)len, sizeof *names, cmp_str);
    *count = len;
    return names ? names : calloc(1, sizeof *names);
}

static void free_names(char **names, int count) {
    for (int i = 0; i < count; i++)
        free(names[i]);
    free(names);
}

static char *join(const char *a, const char *b) {
    char *s;
    if (asprintf(&s, "%s/%s", a, b) < 0)
        abort();
    return s;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static void add_file(mpt_image_set *s, char *path, int32_t label) {
    if (s->n == s->cap)
        s->files = realloc(s->files, sizeof *s->files * (size_t)(s->cap = s->cap ? 2 * s->cap : 64));
    s->files[s->n++] = (image_file){path, label};
}

/* Adds the images below dir, in sorted order, with the given label. */
static int collect(mpt_image_set *s, const char *dir, int32_t label, int depth,
                   char *err, size_t n) {
    int count;
    char **names = list_dir(dir, &count, err, n);
    if (!names)
        return -1;
    int rc = 0;
    for (int i = 0; i < count && !rc; i++) {
        char *path = join(dir, names[i]);
        if (is_dir(path)) {
            /* Symlink loops end here rather than in a stack overflow. */
            if (depth < 32)
                rc = collect(s, path, label, depth + 1, err, n);
            free(path);
        } else if (has_image_ext(names[i])) {
            add_file(s, path, label);
        } else {
            free(path);
        }
    }
    free_names(names, count);
    return rc;
}

static void warn_skip(const char *msg) {
    fprintf(stderr, "mptc: warning: %s; skipped (on_error=skip)\n", msg);
}

/* Decodes file i into out (h*w*c floats in [0,1]). */
static int decode_sample(const mpt_image_set *s, int64_t i, float *out, char *err,
                         size_t n) {
    uint8_t *rgb;
    int w, h;
    if (mpt_image_decode_rgb8(s->files[i].path, &rgb, &w, &h, err, n))
        return -1;
    if (s->c == 1) {
        /* ITU-R BT.601 luma, as rgb_to_grayscale computes it. */
        for (int64_t p = 0; p < (int64_t)w * h; p++)
            rgb[p] = (uint8_t)(0.299 * rgb[3 * p] + 0.587 * rgb[3 * p + 1] +
                               0.114 * rgb[3 * p + 2] + 0.5);
    }
    mpt_image_resize_bilinear(rgb, w, h, s->c, out, s->w, s->h, 1.0f / 255.0f);
    free(rgb);
    return 0;
}

/* Drops the files whose ok[] is 0, keeping the order of the rest. */
static void drop_failed(mpt_image_set *s, const uint8_t *ok, size_t sample) {
    int64_t j = 0;
    for (int64_t i = 0; i < s->n; i++) {
        if (ok[i]) {
            if (s->cache && j != i)
                memmove(s->cache + (size_t)j * sample, s->cache + (size_t)i * sample,
                        sizeof(float) * sample);
            s->files[j++] = s->files[i];
        } else {
            free(s->files[i].path);
        }
    }
    s->n = j;
}

/* Decodes every file into the cache, or without one checks every header;
 * bad files are fatal or skipped according to on_error. */
static int check_files(mpt_image_set *s, char *err, size_t n) {
    size_t sample = (size_t)(s->h * s->w * s->c);
    uint8_t *ok = malloc((size_t)s->n);
    int rc = 0;
    for (int64_t i = 0; i < s->n && !rc; i++) {
        char msg[1024];
        int w, h;
        ok[i] = 1;
        int bad = s->cache ? decode_sample(s, i, s->cache + (size_t)i * sample, msg, sizeof msg)
                           : mpt_image_decode_rgb8(s->files[i].path, NULL, &w, &h, msg,
                                                   sizeof msg);
        if (!bad)
            continue;
        ok[i] = 0;
        if (s->on_error == MPT_DATA_ON_ERROR_SKIP)
            warn_skip(msg);
        else
            rc = mpt_data_fail(err, n, "%s\n" SKIP_HINT, msg);
    }
    if (!rc)
        drop_failed(s, ok, sample);
    free(ok);
    return rc;
}

static void shuffle_files(mpt_image_set *s, uint64_t seed) {
    mpt_data_rng r;
    mpt_data_rng_seed(&r, seed);
    for (int64_t i = s->n - 1; i > 0; i--) {
        int64_t j = (int64_t)mpt_data_rng_below(&r, (uint64_t)i + 1);
        image_file t = s->files[i];
        s->files[i] = s->files[j];
        s->files[j] = t;
    }
}

mpt_image_set *mpt_images_open(const mpt_data_spec *spec, int64_t h, int64_t w,
                               char *err, size_t n) {
    mpt_image_set *s = calloc(1, sizeof *s);
    s->h = h;
    s->w = w;
    s->c = spec->channels;
    s->on_error = spec->on_error;
    MPT_DATA_CHECK(pthread_mutex_init(&s->warn_lock, NULL));
    int count;
    char **names = list_dir(spec->dir, &count, err, n);
    if (!names)
        goto fail;
    for (int i = 0; i < count; i++) {
        char *path = join(spec->dir, names[i]);
        if (is_dir(path)) {
            s->classes = realloc(s->classes, sizeof *s->classes * (size_t)(s->n_classes + 1));
            s->classes[s->n_classes] = strdup(names[i]);
            if (collect(s, path, s->n_classes, 0, err, n)) {
                s->n_classes++;
                free(path);
                free_names(names, count);
                goto fail;
            }
            s->n_classes++;
        }
        free(path);
    }
    free_names(names, count);
    if (s->n_classes == 0) {
        mpt_data_fail(err, n, "%s: has no class subfolders\n  hint: put each class's "
                      "images in a subfolder named after it: %s/cats/1.png, %s/dogs/2.jpg",
                      spec->dir, spec->dir, spec->dir);
        goto fail;
    }
    if (s->n == 0) {
        mpt_data_fail(err, n, "%s: found no .png, .jpg or .jpeg images in its %d class "
                      "folder%s\n  hint: images go one level or more below the class "
                      "folders: %s/%s/1.png", spec->dir, s->n_classes,
                      s->n_classes == 1 ? "" : "s", spec->dir, s->classes[0]);
        goto fail;
    }
    shuffle_files(s, spec->seed);
    int64_t bytes = s->n * h * w * s->c * (int64_t)sizeof(float);
    int cache = spec->cache == MPT_DATA_CACHE_ON ||
                (spec->cache == MPT_DATA_CACHE_AUTO && bytes <= MPT_DATA_CACHE_BUDGET);
    if (cache && !(s->cache = malloc((size_t)bytes))) {
        mpt_data_fail(err, n, "%s: out of memory caching %lld bytes of images\n  hint: "
                      "add cache=false to the data spec", spec->dir, (long long)bytes);
        goto fail;
    }
    if (check_files(s, err, n))
        goto fail;
    if (s->n == 0) {
        mpt_data_fail(err, n, "%s: every image was unreadable and skipped", spec->dir);
        goto fail;
    }
    s->warned = calloc((size_t)s->n, 1);
    return s;
fail:
    mpt_images_free(s);
    return NULL;
}

void mpt_images_free(mpt_image_set *s) {
    if (!s)
        return;
    for (int64_t i = 0; i < s->n; i++)
        free(s->files[i].path);
    free(s->files);
    for (int i = 0; i < s->n_classes; i++)
        free(s->classes[i]);
    free(s->classes);
    free(s->cache);
    free(s->warned);
    MPT_DATA_CHECK(pthread_mutex_destroy(&s->warn_lock));
    free(s);
}

int64_t mpt_images_count(const mpt_image_set *s) { return s->n; }
int mpt_images_num_classes(const mpt_image_set *s) { return s->n_classes; }
const char *mpt_images_class_name(const mpt_image_set *s, int c) { return s->classes[c]; }
int32_t mpt_images_label(const mpt_image_set *s, int64_t i) { return s->files[i].label; }
int mpt_images_cached(const mpt_image_set *s) { return s->cache != NULL; }

int mpt_images_sample(mpt_image_set *s, int64_t i, float *out, char *err, size_t n) {
    size_t sample = (size_t)(s->h * s->w * s->c);
    if (s->cache) {
        memcpy(out, s->cache + (size_t)i * sample, sizeof(float) * sample);
        return 0;
    }
    char msg[1024];
    if (decode_sample(s, i, out, msg, sizeof msg) == 0)
        return 0;
    /* Its header read well at open: skip means a blank sample here,
     * because the sample count is already fixed. */
    if (s->on_error == MPT_DATA_ON_ERROR_SKIP) {
        MPT_DATA_CHECK(pthread_mutex_lock(&s->warn_lock));
        if (!s->warned[i]) {
            s->warned[i] = 1;
            warn_skip(msg);
        }
        MPT_DATA_CHECK(pthread_mutex_unlock(&s->warn_lock));
        memset(out, 0, sizeof(float) * sample);
        return 0;
    }
    return mpt_data_fail(err, n, "%s\n" SKIP_HINT, msg);
}
