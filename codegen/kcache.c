/* codegen/kcache.c — see kcache.h. */
#include "codegen/kcache.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *mpt_kcache_dir(char *buf, size_t n) {
    const char *d = getenv("MPTC_CACHE_DIR");
    if (d && *d) snprintf(buf, n, "%s", d);
    else snprintf(buf, n, "%s/.cache/mptc", getenv("HOME") ? getenv("HOME") : "/tmp");
    return buf;
}

int mpt_kcache_enabled(void) {
    const char *e = getenv("MPTC_CACHE");
    return !(e && !strcmp(e, "0"));
}

static uint64_t fnv(uint64_t h, const void *p, size_t len) {
    const unsigned char *c = p;
    for (size_t i = 0; i < len; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

void mpt_kcache_key(const char *const *parts, int n_parts, char out[33]) {
    uint64_t h1 = 0xcbf29ce484222325ull, h2 = 0x84222325cbf29ce4ull;
    for (int i = 0; i < n_parts; i++) {
        h1 = fnv(h1, parts[i], strlen(parts[i]) + 1);
        h2 = fnv(h2 ^ (uint64_t)i, parts[i], strlen(parts[i]) + 1);
    }
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)h1, (unsigned long long)h2);
}

/* The footer: a magic, the length of what precedes it and a 128-bit hash
 * of the entry's file name (its key) and those bytes. Bound to the name so
 * an entry copied over another one's name does not pass. */
enum { FOOTER = 32 };
static const char magic[8] = "mptckc1";

static void footer_of(const char *path, const void *p, size_t len, unsigned char out[FOOTER]) {
    const char *name = strrchr(path, '/');
    name = name ? name + 1 : path;
    uint64_t h1 = fnv(0xcbf29ce484222325ull, name, strlen(name) + 1);
    uint64_t h2 = fnv(0x84222325cbf29ce4ull, name, strlen(name) + 1);
    h1 = fnv(h1, p, len);
    h2 = fnv(h2 ^ (uint64_t)len, p, len);
    uint64_t l = (uint64_t)len;
    memcpy(out, magic, 8);
    memcpy(out + 8, &l, 8);
    memcpy(out + 16, &h1, 8);
    memcpy(out + 24, &h2, 8);
}

/* one note a process, where the first entry that did not match was */
static void note_mismatch(const char *path) {
    static int said;
    if (__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) return;
    fprintf(stderr, "mptc: note: the kernel cache entry %s does not match its checksum "
            "(altered, cut short, or from an older mptc): compiling it again\n", path);
}

char *mpt_kcache_read(const char *path, size_t *len) {
    struct stat st;
    /* a regular file only: a FIFO or device would block or never end */
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (!b) return NULL;
    unsigned char want[FOOTER];
    size_t n = sz >= FOOTER ? (size_t)sz - FOOTER : 0;
    if (sz >= FOOTER) footer_of(path, b, n, want);
    if (sz < FOOTER || memcmp(b + n, want, FOOTER) != 0) {
        note_mismatch(path);
        free(b);
        return NULL;
    }
    b[n] = 0;
    if (len) *len = n;
    return b;
}

int mpt_make_dirs(const char *dir) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *c = buf + 1; *c; c++) {
        if (*c != '/') continue;
        *c = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) return -1;
        *c = '/';
    }
    return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

/* mkdir -p of path's directory */
static int make_parent_dirs(const char *path) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    char *slash = strrchr(buf, '/');
    if (!slash || slash == buf) return 0;
    *slash = 0;
    return mpt_make_dirs(buf);
}

int mpt_kcache_write(const char *path, const void *p, size_t len) {
    if (make_parent_dirs(path)) return -1;
    char tmp[1100];
    static unsigned serial; /* threads of one process write at once */
    snprintf(tmp, sizeof tmp, "%s.%d.%u.tmp", path, (int)getpid(),
             __atomic_fetch_add(&serial, 1, __ATOMIC_RELAXED));
    FILE *f = fopen(tmp, "wb");
    if (!f) return -1;
    unsigned char foot[FOOTER];
    footer_of(path, p, len, foot);
    int ok = fwrite(p, 1, len, f) == len && fwrite(foot, 1, FOOTER, f) == FOOTER;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path)) {
        remove(tmp);
        return -1;
    }
    return 0;
}
