/* runtime/train/tensorboard.c — TensorBoard event files (API:
 * tensorboard_impl.h).
 *
 * An event file is a sequence of TFRecords, each holding one serialized
 * tensorflow.Event, all little endian:
 *   uint64 length, uint32 masked_crc32c(length), data, uint32 masked_crc32c(data)
 * The messages needed are encoded by hand; the field numbers are those of
 * tensorboard/compat/proto/{event,summary,histogram}.proto:
 *   Event { double wall_time = 1; int64 step = 2; string file_version = 3;
 *           Summary summary = 5; }   Summary { repeated Value value = 1; }
 *   Summary.Value { string tag = 1; oneof { float simple_value = 2;
 *                   HistogramProto histo = 5; } }
 *   HistogramProto { double min = 1, max = 2, num = 3, sum = 4, sum_squares = 5;
 *                    packed repeated double bucket_limit = 6, bucket = 7; } */
#include <assert.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime/train/tensorboard_impl.h"

/* ---- CRC-32C and the histogram edges, made once ---------------------------- */

/* TensorFlow's default histogram edges (tensorflow/core/lib/histogram/
 * histogram.cc): +-1e-12 * 1.1^k up to 1e20, 0, and +-DBL_MAX; 774 a side */
enum { TB_EDGES = 2 * 774 + 3 };

static uint32_t crc_table[256];
static double tb_edge[TB_EDGES];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
    double pos[TB_EDGES];
    int k = 0, e = 0;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1) pos[k++] = v; /* TF's rounding, step by step */
    pos[k++] = DBL_MAX;
    for (int i = k - 1; i >= 0; i--) tb_edge[e++] = -pos[i];
    tb_edge[e++] = 0.0;
    for (int i = 0; i < k; i++) tb_edge[e++] = pos[i];
    assert(e == TB_EDGES && "TensorFlow's edge loop gave another count");
}

uint32_t mpt_crc32c(const void *p, size_t n) {
    pthread_once(&tables_once, tables_init);
    const uint8_t *b = p;
    uint32_t c = ~0u;
    while (n--) c = crc_table[(c ^ *b++) & 0xff] ^ (c >> 8);
    return ~c;
}

/* TFRecord masks its CRCs: a CRC of data that holds CRCs is weak */
uint32_t mpt_tb_mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

/* ---- protobuf encoding ----------------------------------------------------- */

enum { PB_VARINT = 0, PB_FIXED64 = 1, PB_LEN = 2, PB_FIXED32 = 5 };

/* a growing byte buffer; oom is set (and later writes dropped) when it
 * cannot grow */
typedef struct {
    uint8_t *p;
    size_t len, cap;
    int oom;
} pb_buf;

static void pb_bytes(pb_buf *b, const void *s, size_t n) {
    if (b->oom) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) return (void)(b->oom = 1);
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

/* v's k low bytes, little endian, whatever the host's order */
static void put_le(uint8_t *out, uint64_t v, int k) {
    for (int i = 0; i < k; i++) out[i] = (uint8_t)(v >> (8 * i));
}

static size_t varint_size(uint64_t v) { return v < 0x80 ? 1 : 1 + varint_size(v >> 7); }

/* 7 bits a byte, low first; the top bit says "more follow" */
static void pb_varint(pb_buf *b, uint64_t v) {
    uint8_t t[10];
    size_t k = 0;
    for (; v > 0x7f; v >>= 7) t[k++] = (uint8_t)(v | 0x80);
    t[k++] = (uint8_t)v;
    pb_bytes(b, t, k);
}

static void pb_key(pb_buf *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void pb_raw_double(pb_buf *b, double v) {
    uint64_t u;
    uint8_t t[8];
    memcpy(&u, &v, 8);
    put_le(t, u, 8);
    pb_bytes(b, t, 8);
}

static void pb_double(pb_buf *b, int field, double v) {
    pb_key(b, field, PB_FIXED64);
    pb_raw_double(b, v);
}

static void pb_string(pb_buf *b, int field, const void *s, size_t n) {
    pb_key(b, field, PB_LEN);
    pb_varint(b, n);
    pb_bytes(b, s, n);
}

static void pb_packed_doubles(pb_buf *b, int field, const double *v, size_t n) {
    pb_key(b, field, PB_LEN);
    pb_varint(b, 8 * n);
    for (size_t i = 0; i < n; i++) pb_raw_double(b, v[i]);
}

/* ---- the writer ------------------------------------------------------------ */

struct mpt_tb {
    FILE *f;
    char path[4096];
    int err_no;          /* the first failure's errno, 0 while all is well */
    const char *err_op;  /* what failed: "write", "close", "encode" */
    pb_buf val, ev;      /* a Summary.Value, then the Event around it */
    double count[TB_EDGES];                         /* of the buckets of tb_edge */
    double out_edge[TB_EDGES], out_count[TB_EDGES]; /* the buckets written */
};

/* Records the first failure; -1 */
static int tb_fail(mpt_tb *w, const char *op, int err_no) {
    if (!w->err_no) {
        w->err_no = err_no ? err_no : EIO;
        w->err_op = op;
    }
    return -1;
}

/* b's bytes as one record */
static int tb_write_record(mpt_tb *w, const pb_buf *b) {
    if (b->oom) return tb_fail(w, "encode", ENOMEM);
    uint8_t head[12], foot[4];
    put_le(head, b->len, 8);
    put_le(head + 8, mpt_tb_mask_crc(mpt_crc32c(head, 8)), 4);
    put_le(foot, mpt_tb_mask_crc(mpt_crc32c(b->p, b->len)), 4);
    if (fwrite(head, 1, 12, w->f) != 12 || fwrite(b->p, 1, b->len, w->f) != b->len ||
        fwrite(foot, 1, 4, w->f) != 4)
        return tb_fail(w, "write", errno);
    return 0;
}

/* Writes Event { wall_time, step, summary { value: w->val } } as one
 * record. The Summary's bytes are its one field's key and length, then
 * the Value, so they are written in place rather than built apart. A step
 * of 0 is left out, as proto3 leaves out a default. */
static int tb_write_value_event(mpt_tb *w, int64_t step, double wall_time) {
    size_t vlen = w->val.len, slen = 1 + varint_size(vlen) + vlen;
    w->ev.len = 0;
    pb_double(&w->ev, 1, wall_time);
    if (step) {
        pb_key(&w->ev, 2, PB_VARINT);
        pb_varint(&w->ev, (uint64_t)step);
    }
    pb_key(&w->ev, 5, PB_LEN);
    pb_varint(&w->ev, slen);
    pb_key(&w->ev, 1, PB_LEN);
    pb_varint(&w->ev, vlen);
    pb_bytes(&w->ev, w->val.p, vlen);
    w->ev.oom |= w->val.oom;
    return tb_write_record(w, &w->ev);
}

int mpt_tb_scalar(mpt_tb *w, const char *tag, int64_t step, double wall_time, double value) {
    if (w->err_no) return -1;
    w->val.len = 0;
    pb_string(&w->val, 1, tag, strlen(tag));
    /* simple_value is in a oneof: written even when 0, or it reads as unset */
    float f = (float)value;
    uint32_t bits;
    uint8_t t[4];
    memcpy(&bits, &f, 4);
    put_le(t, bits, 4);
    pb_key(&w->val, 2, PB_FIXED32);
    pb_bytes(&w->val, t, 4);
    return tb_write_value_event(w, step, wall_time);
}

/* Why TensorFlow's exponential edges rather than 30 equal buckets between
 * min and max: HistogramProto was made for them, and TensorBoard's
 * histogram and distribution dashboards read them as they read
 * tf.summary.histogram's (data_compat.py drops the empty outer buckets and
 * puts min and max at the ends, then the dashboard rebins to its own 30).
 * Their width is 10% of the value at every magnitude, so one outlier does
 * not crush a layer's weights into one bucket, and the rebinning over
 * steps whose ranges drift stays close to the data. The cost is a binary
 * search of ~1550 edges (11 steps) a value.
 *
 * Bucket i holds [edge[i-1], edge[i]): x's is the first edge greater than
 * x (std::upper_bound, as TensorFlow's Histogram::Add). */
static int tb_bucket(const double *edge, double x) {
    int lo = 0, hi = TB_EDGES;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (edge[mid] > x) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* The buckets written, in out_edge/out_count; returns how many. Runs of
 * empty buckets become one, as TensorFlow's EncodeToProto does (a layer's
 * weights fill a few hundred of the 1551). The empty runs at either end
 * are left out, unlike TensorFlow: readers put min and max at the outer
 * edges, and TensorBoard's Rust data server, which keeps those runs, would
 * draw them as buckets running backwards (from min down to the edge below
 * it). */
static size_t tb_collapse(mpt_tb *w) {
    int first = 0, last = TB_EDGES - 1;
    while (first < TB_EDGES && w->count[first] <= 0) first++;
    while (last >= first && w->count[last] <= 0) last--;
    size_t k = 0;
    w->out_edge[0] = DBL_MAX; /* kept when nothing was counted, as TensorFlow does */
    w->out_count[0] = 0;
    for (int i = first; i <= last;) {
        double end = tb_edge[i], c = w->count[i++];
        if (c <= 0)
            while (i < last && w->count[i] <= 0) end = tb_edge[i++];
        w->out_edge[k] = end;
        w->out_count[k++] = c;
    }
    return k ? k : 1;
}

int mpt_tb_histogram(mpt_tb *w, const char *tag, int64_t step, double wall_time,
                     const float *v, int64_t n, int64_t *nonfinite) {
    if (nonfinite) *nonfinite = 0;
    if (w->err_no) return -1;
    double lo = DBL_MAX, hi = -DBL_MAX, sum = 0, sum_sq = 0, num = 0;
    int64_t bad = 0; /* NaN and +-inf: see tensorboard_impl.h */
    memset(w->count, 0, sizeof w->count);
    for (int64_t i = 0; i < n; i++) {
        double x = v[i];
        if (!isfinite(x)) {
            bad++;
            continue;
        }
        w->count[tb_bucket(tb_edge, x)] += 1;
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
        sum += x;
        sum_sq += x * x;
        num += 1;
    }
    if (nonfinite) *nonfinite = bad;
    if (num == 0) lo = hi = 0; /* rather than TF's DBL_MAX and -DBL_MAX */
    size_t k = tb_collapse(w), packed = 8 * k;
    w->val.len = 0;
    pb_string(&w->val, 1, tag, strlen(tag));
    pb_key(&w->val, 5, PB_LEN); /* histo: 5 doubles, 2 packed fields */
    pb_varint(&w->val, 5 * 9 + 2 * (1 + varint_size(packed) + packed));
    const double field[5] = {lo, hi, num, sum, sum_sq};
    for (int i = 0; i < 5; i++) pb_double(&w->val, i + 1, field[i]);
    pb_packed_doubles(&w->val, 6, w->out_edge, k);
    pb_packed_doubles(&w->val, 7, w->out_count, k);
    return tb_write_value_event(w, step, wall_time);
}

/* ---- opening and closing --------------------------------------------------- */

/* mkdir -p; on failure, the part that could not be made is in *bad
 * (malloc'd) and errno says why */
static int make_dirs(const char *dir, char **bad) {
    char *buf = strdup(dir);
    if (!buf) return -1;
    struct stat st;
    for (char *c = buf + 1;; c++) {
        if (*c != '/' && *c) continue;
        char keep = *c;
        *c = 0;
        if (mkdir(buf, 0777) && errno != EEXIST) break;
        if (keep) {
            *c = keep;
            continue;
        }
        int rc = stat(buf, &st);
        if (rc == 0 && S_ISDIR(st.st_mode)) return free(buf), 0;
        if (rc == 0) errno = ENOTDIR; /* a file of that name */
        break;
    }
    *bad = buf;
    return -1;
}

/* Creates the file under the next free <k>; "x" keeps two writers opened
 * in the same second from sharing one */
static FILE *tb_create(const char *dir, char *path, size_t len) {
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    long long secs = (long long)time(NULL);
    for (int k = 0; k < 1000; k++) {
        if ((size_t)snprintf(path, len, "%s/events.out.tfevents.%010lld.%s.%d.%d", dir, secs, host,
                             (int)getpid(), k) >= len)
            return errno = ENAMETOOLONG, NULL;
        FILE *f = fopen(path, "wbx");
        if (f || errno != EEXIST) return f;
    }
    return NULL;
}

mpt_tb *mpt_tb_open(const char *dir, char *err, size_t n) {
    char *bad = NULL;
    if (!*dir) dir = ".";
    if (make_dirs(dir, &bad)) {
        snprintf(err, n, "%s: cannot create directory %s: %s\n  hint: check that no part of the "
                         "path is a file and that its parent is writable",
                 dir, bad ? bad : dir, strerror(errno));
        free(bad);
        return NULL;
    }
    mpt_tb *w = calloc(1, sizeof *w);
    if (w) w->f = tb_create(dir, w->path, sizeof w->path);
    if (!w || !w->f) {
        snprintf(err, n, "%s: cannot create an event file: %s\n  hint: check that the directory "
                         "is writable and the disk is not full",
                 dir, strerror(w ? errno : ENOMEM));
        free(w);
        return NULL;
    }
    pthread_once(&tables_once, tables_init);
    static const char version[] = "brain.Event:2";
    pb_double(&w->ev, 1, (double)time(NULL));
    pb_string(&w->ev, 3, version, sizeof version - 1);
    /* flushed at once, so TensorBoard sees a valid (if empty) run from the start */
    if (tb_write_record(w, &w->ev) || mpt_tb_flush(w, err, n)) {
        mpt_tb_close(w, err, n);
        return NULL;
    }
    return w;
}

const char *mpt_tb_path(const mpt_tb *w) { return w->path; }

static int tb_report(const mpt_tb *w, char *err, size_t n) {
    if (!w->err_no) return 0;
    if (err && n)
        snprintf(err, n, "%s: cannot %s: %s\n  hint: %s", w->path, w->err_op, strerror(w->err_no),
                 w->err_no == ENOMEM ? "the machine is out of memory"
                                     : "check that the disk is not full; the events written "
                                       "before this one stay readable");
    return -1;
}

int mpt_tb_flush(mpt_tb *w, char *err, size_t n) {
    if (!w->err_no && fflush(w->f)) tb_fail(w, "write", errno);
    return tb_report(w, err, n);
}

int mpt_tb_close(mpt_tb *w, char *err, size_t n) {
    if (!w) return 0;
    mpt_tb_flush(w, NULL, 0);
    if (fclose(w->f) && !w->err_no) tb_fail(w, "close", errno);
    int rc = tb_report(w, err, n);
    free(w->val.p);
    free(w->ev.p);
    free(w);
    return rc;
}
