/* tests/test_tensorboard.c — TensorBoard event files
 * (runtime/train/tensorboard.c), read back by a TFRecord reader written
 * here against the format.
 *
 * Without arguments it runs its checks: CRC-32C's published check values
 * and TFRecord's mask; every record of a written file framed with correct
 * lengths and CRCs; the bytes of the file_version, a scalar and a
 * histogram Event against bytes derived by hand from the .proto field
 * numbers; the file's name; two writers in one second; NaNs and
 * infinities counted apart; a directory that cannot be made and a file
 * that outgrows its size limit reported with a hint, not a crash.
 *
 * It also serves tests/tensorboard.t.sh:
 *   test_tensorboard --write LOGDIR VALUES  writes known scalars and
 *     histograms into LOGDIR, and the histograms' float32 values into VALUES
 */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/train/tensorboard_impl.h"
#include "tests/check.h"

static char tmp[] = "/tmp/mptc-tb-XXXXXX";

static uint64_t get_le(const uint8_t *p, int k) {
    uint64_t v = 0;
    for (int i = k - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
    *len = b ? fread(b, 1, (size_t)n, f) : 0;
    fclose(f);
    return b;
}

/* The records of f[0..len): their data's offsets and lengths in off/dlen
 * (up to max); each record's length and data CRCs are checked. Returns the
 * count, or -1 at a bad frame. */
static int records(const uint8_t *f, size_t len, size_t *off, size_t *dlen, int max) {
    int k = 0;
    for (size_t pos = 0; pos < len; k++) {
        if (len - pos < 12 || k == max) return -1;
        uint64_t n = get_le(f + pos, 8);
        CHECK_MSG(get_le(f + pos + 8, 4) == mpt_tb_mask_crc(mpt_crc32c(f + pos, 8)), "record %d: length crc", k);
        if (len - pos - 12 < n + 4) return -1;
        CHECK_MSG(get_le(f + pos + 12 + n, 4) == mpt_tb_mask_crc(mpt_crc32c(f + pos + 12, n)), "record %d: data crc", k);
        off[k] = pos + 12;
        dlen[k] = n;
        pos += 12 + n + 4;
    }
    return k;
}

/* expected bytes, built by hand: raw bytes and little-endian doubles */
typedef struct {
    uint8_t b[512];
    size_t n;
} bytes;

static void put(bytes *e, const char *raw, size_t n) {
    memcpy(e->b + e->n, raw, n);
    e->n += n;
}

static void put_double(bytes *e, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    for (int i = 0; i < 8; i++) e->b[e->n++] = (uint8_t)(u >> (8 * i));
}

static void test_crc(void) {
    CHECK(mpt_crc32c("123456789", 9) == 0xE3069283u);
    CHECK(mpt_crc32c("", 0) == 0);
    uint8_t zeros[32] = {0}, ones[32];
    memset(ones, 0xff, sizeof ones);
    /* RFC 3720 (iSCSI) B.4 */
    CHECK(mpt_crc32c(zeros, 32) == 0x8A9136AAu);
    CHECK(mpt_crc32c(ones, 32) == 0x62A8AB43u);
    CHECK(mpt_tb_mask_crc(0) == 0xa282ead8u);
    CHECK(mpt_tb_mask_crc(0x12345678u) == ((0x12345678u >> 15 | 0x12345678u << 17) + 0xa282ead8u));
}

/* The first record is Event{wall_time: now, file_version: "brain.Event:2"};
 * then a scalar, whose bytes are:
 *   Event   09 <1.5>  10 ac 02 (step 300)  2a 0d (summary, 13 bytes)
 *   Summary 0a 0b (value, 11 bytes)
 *   Value   0a 04 "loss"  15 <0.25f = 00 00 80 3e>
 * and a histogram of one 0: of TensorFlow's buckets, only [0, 1e-12),
 * which holds it (the empty ones around it are left out). */
static void test_bytes(void) {
    char err[512], dir[64];
    snprintf(dir, sizeof dir, "%s/bytes", tmp);
    mpt_tb *w = mpt_tb_open(dir, err, sizeof err);
    CHECK_MSG(w != NULL, "%s", err);
    if (!w) return;
    char path[512];
    snprintf(path, sizeof path, "%s", mpt_tb_path(w));
    char want[128];
    snprintf(want, sizeof want, "%s/events.out.tfevents.", dir);
    CHECK_MSG(!strncmp(path, want, strlen(want)) && !strcmp(path + strlen(path) - 2, ".0"), "%s", path);
    CHECK(mpt_tb_scalar(w, "loss", 300, 1.5, 0.25) == 0);
    float zero = 0;
    CHECK(mpt_tb_histogram(w, "h", 0, 2.0, &zero, 1, NULL) == 0);
    CHECK_MSG(mpt_tb_close(w, err, sizeof err) == 0, "%s", err);

    size_t len = 0, off[4], dlen[4];
    uint8_t *f = slurp(path, &len);
    CHECK(f != NULL);
    if (!f) return;
    CHECK_MSG(records(f, len, off, dlen, 4) == 3, "want 3 well-framed records in %s", path);

    CHECK(dlen[0] == 24 && f[off[0]] == 0x09);
    CHECK(!memcmp(f + off[0] + 9, "\x1a\x0d" "brain.Event:2", 15));

    bytes e = {.n = 0};
    put(&e, "\x09", 1);
    put_double(&e, 1.5);
    put(&e, "\x10\xac\x02" "\x2a\x0d" "\x0a\x0b" "\x0a\x04loss" "\x15\x00\x00\x80\x3e", 18);
    CHECK_MSG(dlen[1] == e.n && !memcmp(f + off[1], e.b, e.n), "scalar event: %zu bytes, want %zu", dlen[1], e.n);

    /* histo: 5 doubles (9 bytes each) and 2 packed fields of 1 double (10) = 65 */
    bytes h = {.n = 0};
    const double fields[5] = {0, 0, 1, 0, 0}; /* min, max, num, sum, sum_squares */
    for (int i = 0; i < 5; i++) {
        h.b[h.n++] = (uint8_t)((i + 1) << 3 | 1); /* field i+1, fixed64 */
        put_double(&h, fields[i]);
    }
    put(&h, "\x32\x08", 2); /* bucket_limit, packed, 8 bytes */
    put_double(&h, 1.0e-12);
    put(&h, "\x3a\x08", 2); /* bucket */
    put_double(&h, 1);
    CHECK(h.n == 65);
    bytes ev = {.n = 0};
    put(&ev, "\x09", 1);
    put_double(&ev, 2.0);
    /* step 0 left out; summary 72 bytes, value 70: tag "h", histo 65 */
    put(&ev, "\x2a\x48" "\x0a\x46" "\x0a\x01h" "\x2a\x41", 9);
    put(&ev, (const char *)h.b, h.n);
    CHECK_MSG(dlen[2] == ev.n && !memcmp(f + off[2], ev.b, ev.n), "histogram event: %zu bytes, want %zu", dlen[2], ev.n);
    free(f);
}

/* two writers opened in one second in one directory get two files */
static void test_two_writers(void) {
    char err[512], dir[64];
    snprintf(dir, sizeof dir, "%s/two/a/b", tmp);
    mpt_tb *a = mpt_tb_open(dir, err, sizeof err), *b = mpt_tb_open(dir, err, sizeof err);
    CHECK_MSG(a && b, "%s", err);
    if (a && b) CHECK(strcmp(mpt_tb_path(a), mpt_tb_path(b)) != 0);
    CHECK(mpt_tb_close(a, err, sizeof err) == 0);
    CHECK(mpt_tb_close(b, err, sizeof err) == 0);
    CHECK(mpt_tb_close(NULL, err, sizeof err) == 0);
}

static void test_nonfinite(void) {
    char err[512], dir[64];
    snprintf(dir, sizeof dir, "%s/nonfinite", tmp);
    mpt_tb *w = mpt_tb_open(dir, err, sizeof err);
    CHECK_MSG(w != NULL, "%s", err);
    if (!w) return;
    float v[] = {1, NAN, -2, INFINITY, -INFINITY, 3};
    int64_t bad = -1;
    CHECK(mpt_tb_histogram(w, "v", 1, 1.0, v, 6, &bad) == 0);
    CHECK(bad == 3);
    CHECK(mpt_tb_histogram(w, "v", 2, 1.0, v, 0, &bad) == 0 && bad == 0);
    CHECK(mpt_tb_close(w, err, sizeof err) == 0);
}

static void test_bad_dir(void) {
    char err[512], file[64], dir[96];
    snprintf(file, sizeof file, "%s/file", tmp);
    FILE *f = fopen(file, "w");
    CHECK(f != NULL);
    if (f) fclose(f);
    snprintf(dir, sizeof dir, "%s/sub/dir", file);
    err[0] = 0;
    CHECK(mpt_tb_open(dir, err, sizeof err) == NULL);
    CHECK_MSG(strstr(err, "cannot create directory") && strstr(err, "Not a directory") &&
                  strstr(err, "\n  hint: "), "%s", err);
    err[0] = 0;
    CHECK(mpt_tb_open(file, err, sizeof err) == NULL);
    CHECK_MSG(strstr(err, "Not a directory") && strstr(err, "\n  hint: "), "%s", err);
}

/* A file that cannot grow (RLIMIT_FSIZE stands in for a full disk): the
 * failure reaches flush and close with a hint, later writes are refused.
 * In a child, so the limit stays there. */
static void test_write_error(void) {
    int before = check_failures; /* the child inherits the count so far */
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit r = {.rlim_cur = 4096, .rlim_max = RLIM_INFINITY};
        setrlimit(RLIMIT_FSIZE, &r);
        char err[512], dir[64];
        snprintf(dir, sizeof dir, "%s/full", tmp);
        mpt_tb *w = mpt_tb_open(dir, err, sizeof err);
        CHECK_MSG(w != NULL, "%s", err);
        if (!w) _exit(1);
        float v[4000];
        for (int i = 0; i < 4000; i++) v[i] = (float)(i - 2000) * 0.37f;
        int rc = 0;
        for (int s = 0; s < 8; s++) rc |= mpt_tb_histogram(w, "w", s, 1.0, v, 4000, NULL);
        if (!rc) rc = mpt_tb_flush(w, err, sizeof err);
        CHECK(rc == -1);
        CHECK(mpt_tb_scalar(w, "x", 1, 1.0, 1.0) == -1);
        err[0] = 0;
        CHECK(mpt_tb_close(w, err, sizeof err) == -1);
        CHECK_MSG(strstr(err, "File too large") && strstr(err, "\n  hint: "), "%s", err);
        _exit(check_failures > before ? 1 : 0);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the write-error child failed (status %d)", st);
}

/* --write LOGDIR VALUES: what tests/tensorboard.t.sh reads back with
 * TensorBoard's reader. Scalars: loss = 1/step at steps 1..5 (wall time
 * 1000 + step), acc 0 then 0.5 at steps 0 and 1. Histograms of VALUES'
 * two halves ("w" at steps 1, 2; 3 NaN/inf in the first), an empty one. */
static int write_events(const char *dir, const char *values) {
    enum { N = 5000 };
    static float v[2 * N];
    uint32_t s = 12345;
    for (int i = 0; i < 2 * N; i++) {
        s = s * 1664525u + 1013904223u;
        double u = (double)(s >> 8) / (1 << 24) - 0.5;
        v[i] = (float)(i < N ? 0.1 * u * u * u * 8 : 3.0 + u); /* both signs near 0; all positive */
    }
    v[7] = NAN, v[8] = INFINITY, v[9] = -INFINITY;
    v[10] = 0.0f, v[11] = 1e-30f, v[12] = -1e-30f, v[13] = 1.0f;
    FILE *f = fopen(values, "wb");
    if (!f || fwrite(v, sizeof v[0], 2 * N, f) != 2 * N || fclose(f))
        return fprintf(stderr, "cannot write %s\n", values), 1;
    char err[512];
    mpt_tb *w = mpt_tb_open(dir, err, sizeof err);
    if (!w) return fprintf(stderr, "%s\n", err), 1;
    int rc = 0;
    int64_t bad = 0;
    for (int step = 1; step <= 5; step++) rc |= mpt_tb_scalar(w, "loss", step, 1000 + step, 1.0 / step);
    rc |= mpt_tb_scalar(w, "acc", 0, 1000, 0.0);
    rc |= mpt_tb_scalar(w, "acc", 1, 1001, 0.5);
    rc |= mpt_tb_histogram(w, "w", 1, 1001, v, N, &bad);
    rc |= mpt_tb_histogram(w, "w", 2, 1002, v + N, N, NULL);
    rc |= mpt_tb_histogram(w, "empty", 1, 1001, v, 0, NULL);
    if (bad != 3) fprintf(stderr, "%lld non-finite values counted, want 3\n", (long long)bad), rc = 1;
    if (mpt_tb_close(w, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--write")) return write_events(argv[2], argv[3]);
    if (argc > 1) {
        fprintf(stderr, "usage: test_tensorboard [--write LOGDIR VALUES]\n");
        return 2;
    }
    if (!mkdtemp(tmp)) return 1;
    test_crc();
    test_bytes();
    test_two_writers();
    test_nonfinite();
    test_bad_dir();
    test_write_error();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", tmp);
    return check_exit("test_tensorboard");
}
