/* tests/test_checkpoint.c — safetensors checkpoints (runtime/train/checkpoint.c),
 * read back by an independent reader written here against the format.
 *
 * Without arguments it runs its checks: the layout of a saved file (names,
 * dtypes, shapes, contiguous 8-byte-aligned data, metadata), save/load
 * round trips, --init-weights semantics (weights only, across policies),
 * the mismatch listing, and loads of every truncation and of every header
 * byte flipped, none of which may crash or change the session.
 *
 * It also serves tests/checkpoint.t.sh:
 *   test_checkpoint compare A B [weights]  exit 0 when the tensors (or only
 *                                          the weights) are byte-identical
 *   test_checkpoint images DIR N           N PNG and N JPEG images in each of
 *                                          DIR/dark and DIR/light
 */
#include <cjson/cJSON.h>
#include <stdio.h> /* before jpeglib.h, which needs FILE */
#include <jpeglib.h>
#include <png.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/train/train.h"
#include "tests/check.h"

/* ---- an independent safetensors reader ----------------------------------- */

typedef struct {
    uint8_t *bytes;
    size_t len, header_len;
    cJSON *header;
} st_read;

static int st_load(const char *path, st_read *r) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    r->len = (size_t)ftell(f);
    rewind(f);
    r->bytes = malloc(r->len + 1);
    size_t got = fread(r->bytes, 1, r->len, f);
    fclose(f);
    if (got != r->len || r->len < 8) return -1;
    for (int i = 0; i < 8; i++) r->header_len |= (size_t)r->bytes[i] << (8 * i);
    if (r->header_len > r->len - 8) return -1;
    r->header = cJSON_ParseWithLength((char *)r->bytes + 8, r->header_len);
    return r->header ? 0 : -1;
}

static void st_free(st_read *r) {
    cJSON_Delete(r->header);
    free(r->bytes);
}

/* The data of tensor `name`, or NULL; *n its byte count. */
static const uint8_t *st_data(const st_read *r, const char *name, size_t *n) {
    cJSON *t = cJSON_GetObjectItemCaseSensitive(r->header, name);
    cJSON *o = t ? cJSON_GetObjectItemCaseSensitive(t, "data_offsets") : NULL;
    if (!cJSON_IsArray(o)) return NULL;
    size_t a = (size_t)cJSON_GetArrayItem(o, 0)->valuedouble, b = (size_t)cJSON_GetArrayItem(o, 1)->valuedouble;
    *n = b - a;
    return r->bytes + 8 + r->header_len + a;
}

static const char *st_meta(const st_read *r, const char *key) {
    cJSON *m = cJSON_GetObjectItemCaseSensitive(r->header, "__metadata__");
    cJSON *v = m ? cJSON_GetObjectItemCaseSensitive(m, key) : NULL;
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* ---- helper modes for the shell test ---------------------------------- */

/* A weight, judged by name as docs/CHECKPOINTS.md describes. */
static int named_weight(const st_read *r, const char *name) {
    if (!strncmp(name, "optimizer/", 10) || !strncmp(name, "loss_scale/", 11) || !strncmp(name, "rng/", 4))
        return 0;
    for (const char *p = strchr(name, '/'); p; p = strchr(p + 1, '/')) {
        char prefix[256];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(p - name), name);
        if (cJSON_GetObjectItemCaseSensitive(r->header, prefix)) return 0;
    }
    return 1;
}

static int compare(const char *pa, const char *pb, int weights_only) {
    st_read a, b;
    if (st_load(pa, &a) || st_load(pb, &b)) {
        fprintf(stderr, "compare: cannot read %s or %s as safetensors\n", pa, pb);
        return 2;
    }
    int diff = 0, n = 0;
    cJSON *t;
    for (int pass = 0; pass < 2; pass++) {
        const st_read *x = pass ? &b : &a, *y = pass ? &a : &b;
        cJSON_ArrayForEach(t, x->header) {
            if (!strcmp(t->string, "__metadata__") || (weights_only && !named_weight(x, t->string))) continue;
            size_t nx, ny;
            const uint8_t *dx = st_data(x, t->string, &nx), *dy = st_data(y, t->string, &ny);
            if (!dy) {
                printf("%s only in %s\n", t->string, pass ? pb : pa);
                diff++;
            } else if (!pass && (nx != ny || memcmp(dx, dy, nx))) {
                printf("%s differs\n", t->string);
                diff++;
            }
            n += !pass;
        }
    }
    printf("%d tensors compared, %d differ\n", n, diff);
    st_free(&a);
    st_free(&b);
    return diff ? 1 : 0;
}

/* The same tensors, F32 ones within rtol of the largest |value| of the
 * tensor (max |a - b| <= rtol * max |b|), the others byte for byte: for
 * runs whose only difference is the order of a sum (data parallelism). */
static int close_to(const char *pa, const char *pb, double rtol) {
    st_read a, b;
    if (st_load(pa, &a) || st_load(pb, &b)) {
        fprintf(stderr, "close: cannot read %s or %s as safetensors\n", pa, pb);
        return 2;
    }
    int diff = 0, n = 0;
    cJSON *t;
    cJSON_ArrayForEach(t, a.header) {
        if (!strcmp(t->string, "__metadata__")) continue;
        size_t nx, ny;
        const uint8_t *dx = st_data(&a, t->string, &nx), *dy = st_data(&b, t->string, &ny);
        const char *dt = cJSON_GetStringValue(cJSON_GetObjectItem(t, "dtype"));
        n++;
        if (!dy || nx != ny) {
            printf("%s missing or of another size in %s\n", t->string, pb);
            diff++;
        } else if (dt && !strcmp(dt, "F32")) {
            double worst = 0, big = 0;
            for (size_t i = 0; i < nx / 4; i++) {
                float x, y;
                memcpy(&x, dx + 4 * i, 4);
                memcpy(&y, dy + 4 * i, 4);
                if (fabs((double)x - y) > worst || x != x || y != y) worst = x == x && y == y ? fabs((double)x - y) : INFINITY;
                if (fabs((double)y) > big) big = fabs((double)y);
            }
            if (worst > rtol * big) {
                printf("%s differs: max |a - b| = %.3g, %.3g of its largest |value| %.3g\n",
                       t->string, worst, big > 0 ? worst / big : INFINITY, big);
                diff++;
            }
        } else if (memcmp(dx, dy, nx)) {
            printf("%s differs\n", t->string);
            diff++;
        }
    }
    printf("%d tensors compared within %g, %d differ\n", n, rtol, diff);
    st_free(&a);
    st_free(&b);
    return diff ? 1 : 0;
}

/* Prints how many F32/F16/BF16 values of the file are not finite. */
static int nonfinite(const char *path) {
    st_read a;
    if (st_load(path, &a)) {
        fprintf(stderr, "nonfinite: cannot read %s as safetensors\n", path);
        return 2;
    }
    long long bad = 0;
    cJSON *t;
    cJSON_ArrayForEach(t, a.header) {
        if (!strcmp(t->string, "__metadata__")) continue;
        const char *dt = cJSON_GetStringValue(cJSON_GetObjectItem(t, "dtype"));
        size_t nb;
        const uint8_t *d = st_data(&a, t->string, &nb);
        if (!dt || !d) continue;
        if (!strcmp(dt, "F32"))
            for (size_t i = 0; i + 4 <= nb; i += 4) {
                float f;
                memcpy(&f, d + i, 4);
                bad += !isfinite(f);
            }
        else if (!strcmp(dt, "F16") || !strcmp(dt, "BF16"))
            for (size_t i = 0; i + 2 <= nb; i += 2) {
                unsigned h = d[i] | (unsigned)d[i + 1] << 8;
                bad += !strcmp(dt, "F16") ? (h & 0x7c00) == 0x7c00 : (h & 0x7f80) == 0x7f80;
            }
    }
    printf("%lld\n", bad);
    st_free(&a);
    return 0;
}

/* A w x h RGB image: a flat color with a little texture. */
static void fill_pixels(uint8_t *px, int w, int h, int base, int seed) {
    for (int i = 0; i < w * h * 3; i++) px[i] = (uint8_t)(base + (i * 7 + seed * 13) % 40);
}

static int write_png(const char *path, const uint8_t *px, int w, int h) {
    FILE *f = fopen(path, "wb");
    png_structp p = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(p);
    if (!f || !p || !info || setjmp(png_jmpbuf(p))) {
        if (f) fclose(f);
        return -1;
    }
    png_init_io(p, f);
    png_set_IHDR(p, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(p, info);
    for (int y = 0; y < h; y++) png_write_row(p, (png_const_bytep)(px + y * w * 3));
    png_write_end(p, NULL);
    png_destroy_write_struct(&p, &info);
    return fclose(f);
}

static int write_jpeg(const char *path, const uint8_t *px, int w, int h) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr jerr;
    c.err = jpeg_std_error(&jerr);
    jpeg_create_compress(&c);
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = 3;
    c.in_color_space = JCS_RGB;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 95, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)(px + c.next_scanline * (JDIMENSION)w * 3);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    return fclose(f);
}

/* Two classes a convnet tells apart at once: dark and light images, of
 * sizes other than the model's so the resize runs. */
static int images(const char *dir, int n) {
    static const char *const cls[2] = {"dark", "light"};
    char path[1024];
    mkdir(dir, 0755);
    for (int c = 0; c < 2; c++) {
        snprintf(path, sizeof path, "%s/%s", dir, cls[c]);
        mkdir(path, 0755);
        for (int i = 0; i < n; i++) {
            int w = 10 + i, h = 12 + (i % 3);
            uint8_t *px = malloc((size_t)w * (size_t)h * 3);
            fill_pixels(px, w, h, c ? 200 : 10, i);
            snprintf(path, sizeof path, "%s/%s/img_%d.png", dir, cls[c], i);
            int rc = write_png(path, px, w, h);
            snprintf(path, sizeof path, "%s/%s/img_%d.jpg", dir, cls[c], i);
            rc |= write_jpeg(path, px, w, h);
            free(px);
            if (rc) {
                fprintf(stderr, "images: cannot write %s\n", path);
                return 1;
            }
        }
    }
    return 0;
}

/* ---- the checks ------------------------------------------------------------ */

static const char tiny_src[] =
    "model ckpt_unit {\n"
    "    input features: [6]\n"
    "    dense dense_1(units=5, activation=relu)\n"
    "    batch_norm bn_1\n"
    "    dropout drop(rate=0.5)\n"
    "    dense logits(units=3)\n"
    "    activation predictions(softmax, dtype=float32)\n"
    "}\n"
    "train {\n"
    "    data = synthetic(shape=[6], classes=3, samples=64)\n"
    "    optimizer = adam\n"
    "    batch_size = 4\n"
    "}\n";

static const char wide_src[] =
    "model ckpt_unit {\n"
    "    input features: [6]\n"
    "    dense dense_1(units=7, activation=relu)\n"
    "    dense logits(units=3)\n"
    "}\n"
    "train {\n"
    "    data = synthetic(shape=[6], classes=3, samples=64)\n"
    "    optimizer = sgd(learning_rate=0.1)\n"
    "    batch_size = 4\n"
    "}\n";

static char tmp[] = "/tmp/mptc_ckpt_XXXXXX";

static const char *tmp_path(const char *name, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", tmp, name);
    return buf;
}

static mpt_session *open_model(const char *src, const char *name, const char *policy, uint64_t seed) {
    char path[512];
    FILE *f = fopen(tmp_path(name, path, sizeof path), "w");
    fputs(src, f);
    fclose(f);
    mpt_compile_opts o = {.path = path, .policy = policy, .xla = 1, .device = "interp", .diag = stderr};
    mpt_session *s = NULL;
    if (mpt_session_open(&o, &s) || mpt_session_init_state(s, seed)) return NULL;
    return s;
}

static const char *name_of(const mpt_session *s, int k) {
    return s->train->nodes[mpt_graph_variable_node(s->train, k)].name;
}

static int same_state(const mpt_session *a, const mpt_session *b) {
    for (int k = 0; k < a->n_vars; k++)
        if (memcmp(a->vars[k].data, b->vars[k].data, mpt_tensor_bytes(&a->vars[k]))) return 0;
    return 1;
}

/* A copy of the whole state, to tell whether a failed load touched it. */
static uint8_t *snapshot(const mpt_session *s) {
    size_t total = 0, o = 0;
    for (int k = 0; k < s->n_vars; k++) total += mpt_tensor_bytes(&s->vars[k]);
    uint8_t *b = malloc(total + 1);
    for (int k = 0; k < s->n_vars; k++) {
        memcpy(b + o, s->vars[k].data, mpt_tensor_bytes(&s->vars[k]));
        o += mpt_tensor_bytes(&s->vars[k]);
    }
    return b;
}

static int same_as_snapshot(const mpt_session *s, const uint8_t *snap) {
    uint8_t *now = snapshot(s);
    size_t total = 0;
    for (int k = 0; k < s->n_vars; k++) total += mpt_tensor_bytes(&s->vars[k]);
    int same = !memcmp(now, snap, total);
    free(now);
    return same;
}

/* Fills every variable with a value no initialiser produces. */
static void poison(mpt_session *s) {
    for (int k = 0; k < s->n_vars; k++) memset(s->vars[k].data, 0x5a, mpt_tensor_bytes(&s->vars[k]));
}

static void test_layout(const mpt_session *s, const char *path) {
    st_read r;
    CHECK(st_load(path, &r) == 0);
    CHECK(r.header_len % 8 == 0);
    CHECK(!strcmp(st_meta(&r, "step"), "7") && !strcmp(st_meta(&r, "seed"), "42"));
    CHECK(!strcmp(st_meta(&r, "policy"), "float32") && !strcmp(st_meta(&r, "model"), "ckpt_unit"));
    CHECK(!strcmp(st_meta(&r, "batch_size"), "4") && !strcmp(st_meta(&r, "steps_per_epoch"), "16"));
    size_t end = 0;
    for (int k = 0; k < s->n_vars; k++) {
        cJSON *t = cJSON_GetObjectItemCaseSensitive(r.header, name_of(s, k));
        CHECK_MSG(t != NULL, "%s not in the file", name_of(s, k));
        if (!t) continue;
        cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape"), *o = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
        CHECK(cJSON_GetArraySize(sh) == s->vars[k].shape.rank);
        for (int d = 0; d < s->vars[k].shape.rank; d++)
            CHECK(cJSON_GetArrayItem(sh, d)->valuedouble == (double)s->vars[k].shape.dim[d]);
        CHECK_MSG((size_t)cJSON_GetArrayItem(o, 0)->valuedouble == end, "%s is not contiguous", name_of(s, k));
        end = (size_t)cJSON_GetArrayItem(o, 1)->valuedouble;
        size_t n;
        const uint8_t *d = st_data(&r, name_of(s, k), &n);
        CHECK(n == mpt_tensor_bytes(&s->vars[k]) && !memcmp(d, s->vars[k].data, n));
    }
    CHECK_MSG(end == r.len - 8 - r.header_len, "the data does not fill the file exactly");
    /* the documented names and Keras' layouts */
    const char *dt[][2] = {{"dense_1/kernel", "F32"}, {"bn_1/moving_mean", "F32"}, {"rng/counter", "I32"},
                           {"optimizer/iterations", "I32"}, {"dense_1/kernel/m", "F32"}};
    for (size_t i = 0; i < sizeof dt / sizeof dt[0]; i++) {
        cJSON *t = cJSON_GetObjectItemCaseSensitive(r.header, dt[i][0]);
        cJSON *d = t ? cJSON_GetObjectItemCaseSensitive(t, "dtype") : NULL;
        CHECK_MSG(cJSON_IsString(d) && !strcmp(d->valuestring, dt[i][1]), "%s should be %s", dt[i][0], dt[i][1]);
    }
    cJSON *k = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(r.header, "dense_1/kernel"), "shape");
    CHECK(cJSON_GetArrayItem(k, 0)->valuedouble == 6 && cJSON_GetArrayItem(k, 1)->valuedouble == 5);
    st_free(&r);
}

static void test_round_trip(mpt_session *a, const char *path) {
    mpt_session *b = open_model(tiny_src, "b.mpt", NULL, 2);
    char err[4096];
    CHECK(b && !same_state(a, b));
    mpt_ckpt_meta m = {0};
    CHECK_MSG(mpt_ckpt_load(path, b, MPT_CKPT_ALL, &m, err, sizeof err) == 0, "%s", err);
    CHECK(same_state(a, b));
    CHECK(m.step == 7 && m.seed == 42 && m.batch_size == 4 && m.steps_per_epoch == 16);

    /* weights only: slots, iterations and rng/counter keep their values */
    poison(b);
    CHECK_MSG(mpt_ckpt_load(path, b, MPT_CKPT_WEIGHTS, NULL, err, sizeof err) == 0, "%s", err);
    for (int k = 0; k < b->n_vars; k++) {
        int same = !memcmp(a->vars[k].data, b->vars[k].data, mpt_tensor_bytes(&a->vars[k]));
        int weight = mpt_ckpt_is_weight(b, k);
        CHECK_MSG(same == weight, "%s: %s", name_of(b, k), weight ? "weight not loaded" : "non-weight loaded");
    }
    mpt_session_free(b);
}

static void test_policies(mpt_session *a, const char *path) {
    mpt_session *m = open_model(tiny_src, "m.mpt", "mixed_float16", 3);
    char err[4096];
    CHECK(m != NULL);
    /* the run's state differs (loss scale), so resuming must refuse ... */
    CHECK(mpt_ckpt_load(path, m, MPT_CKPT_ALL, NULL, err, sizeof err) != 0);
    CHECK_MSG(strstr(err, "missing loss_scale/scale F32[]") && strstr(err, "--init-weights"), "%s", err);
    /* ... and the weights transfer, bit for bit */
    CHECK_MSG(mpt_ckpt_load(path, m, MPT_CKPT_WEIGHTS, NULL, err, sizeof err) == 0, "%s", err);
    for (int k = 0; k < m->n_vars; k++) {
        if (!mpt_ckpt_is_weight(m, k)) continue;
        int j = mpt_session_var(a, name_of(m, k));
        CHECK(j >= 0 && !memcmp(a->vars[j].data, m->vars[k].data, mpt_tensor_bytes(&a->vars[j])));
    }
    char back[512];
    mpt_ckpt_meta meta = {.step = 1};
    CHECK(mpt_ckpt_save(tmp_path("m.st", back, sizeof back), m, &meta, err, sizeof err) == 0);
    mpt_session *f = open_model(tiny_src, "f.mpt", "float32", 4);
    CHECK(f && mpt_ckpt_load(back, f, MPT_CKPT_WEIGHTS, NULL, err, sizeof err) == 0);
    for (int k = 0; f && k < f->n_vars; k++)
        if (mpt_ckpt_is_weight(f, k))
            CHECK(!memcmp(a->vars[k].data, f->vars[k].data, mpt_tensor_bytes(&a->vars[k])));
    mpt_session_free(m);
    mpt_session_free(f);
}

static void test_mismatch(mpt_session *a) {
    mpt_session *w = open_model(wide_src, "w.mpt", NULL, 1);
    char path[512], err[4096];
    mpt_ckpt_meta meta = {0};
    CHECK(w && mpt_ckpt_save(tmp_path("w.st", path, sizeof path), w, &meta, err, sizeof err) == 0);
    uint8_t *before = snapshot(a);
    CHECK(mpt_ckpt_load(path, a, MPT_CKPT_WEIGHTS, NULL, err, sizeof err) != 0);
    const char *want[] = {"dense_1/kernel: the file has F32[6,7], the model wants F32[6,5]",
                          "dense_1/bias: the file has F32[7], the model wants F32[5]",
                          "logits/kernel: the file has F32[7,3], the model wants F32[5,3]",
                          "missing bn_1/gamma F32[5]", "missing bn_1/moving_variance F32[5]",
                          "hint: the checkpoint must come from a model"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECK_MSG(strstr(err, want[i]), "no '%s' in:\n%s", want[i], err);
    CHECK_MSG(!strstr(err, "logits/bias"), "logits/bias matches, yet is listed:\n%s", err);
    CHECK_MSG(same_as_snapshot(a, before), "a failed load changed the session");
    CHECK(mpt_ckpt_load(path, a, MPT_CKPT_ALL, NULL, err, sizeof err) != 0);
    CHECK_MSG(strstr(err, "missing rng/counter I32[]") && strstr(err, "missing dense_1/kernel/m F32[6,5]") &&
                  strstr(err, "hint: --resume needs"), "%s", err);
    char apath[512];
    CHECK(mpt_ckpt_load(tmp_path("a.st", apath, sizeof apath), w, MPT_CKPT_WEIGHTS, NULL, err, sizeof err) != 0);
    CHECK_MSG(strstr(err, "unexpected bn_1/moving_mean F32[5]: the model has no such weight") &&
                  !strstr(err, "dense_1/kernel/m") && !strstr(err, "rng/counter"), "%s", err);
    CHECK_MSG(same_as_snapshot(a, before), "a failed load changed the session");
    /* a short buffer keeps whole lines and says how many it left out */
    char small[520];
    CHECK(mpt_ckpt_load(path, a, MPT_CKPT_ALL, NULL, small, sizeof small) != 0);
    CHECK_MSG(strstr(small, "more") && strstr(small, "hint:") && strlen(small) < sizeof small, "%s", small);
    mpt_session_free(w);
    free(before);
}

/* Every truncation and every flipped header byte: an error or a sound
 * load, never a crash; a failed load leaves the state as it was. */
static void test_damage(mpt_session *b, const char *path) {
    st_read r;
    CHECK(st_load(path, &r) == 0);
    char bad[512], err[4096];
    tmp_path("bad.st", bad, sizeof bad);
    uint8_t *snap = snapshot(b);
    int failures = 0, tries = 0;
    for (size_t len = 0; len < r.len; len += len < 8 + r.header_len + 64 ? 1 : 37) {
        unlink(bad); /* rewriting a fresh file is far cheaper than truncating one */
        FILE *f = fopen(bad, "wb");
        fwrite(r.bytes, 1, len, f);
        fclose(f);
        int rc = mpt_ckpt_load(bad, b, MPT_CKPT_ALL, NULL, err, sizeof err);
        tries++;
        failures += rc != 0;
        CHECK_MSG(rc != 0 && err[0], "truncated to %zu bytes, yet it loaded", len);
        CHECK(same_as_snapshot(b, snap));
    }
    CHECK(failures == tries);
    for (size_t i = 0; i < 8 + r.header_len; i++) {
        uint8_t *copy = malloc(r.len);
        memcpy(copy, r.bytes, r.len);
        copy[i] ^= i < 8 ? 0x41 : 0x1b;
        unlink(bad);
        FILE *f = fopen(bad, "wb");
        fwrite(copy, 1, r.len, f);
        fclose(f);
        free(copy);
        if (mpt_ckpt_load(bad, b, MPT_CKPT_ALL, NULL, err, sizeof err) != 0) CHECK(err[0] != 0);
    }
    CHECK(mpt_ckpt_load(tmp_path("absent.st", bad, sizeof bad), b, MPT_CKPT_ALL, NULL, err, sizeof err) != 0);
    CHECK_MSG(strstr(err, "cannot open checkpoint") && strstr(err, "hint:"), "%s", err);
    st_free(&r);
    free(snap);
}

static void test_save_errors(const mpt_session *a) {
    char err[1024];
    mpt_ckpt_meta m = {0};
    CHECK(mpt_ckpt_save("/nonexistent-dir/x.st", a, &m, err, sizeof err) != 0);
    CHECK_MSG(strstr(err, "cannot create checkpoint") && strstr(err, "hint:"), "%s", err);
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "compare")) return compare(argv[2], argv[3], argc > 4 && !strcmp(argv[4], "weights"));
    if (argc == 4 && !strcmp(argv[1], "images")) return images(argv[2], atoi(argv[3]));
    if (argc == 3 && !strcmp(argv[1], "nonfinite")) return nonfinite(argv[2]);
    if (argc == 5 && !strcmp(argv[1], "close")) return close_to(argv[2], argv[3], atof(argv[4]));
    if (argc > 1) {
        fprintf(stderr, "usage: test_checkpoint [compare A B [weights] | close A B RTOL | images DIR N | nonfinite F]\n");
        return 2;
    }
    if (!mkdtemp(tmp)) return 1;
    mpt_session *a = open_model(tiny_src, "a.mpt", NULL, 1);
    CHECK(a != NULL);
    if (a) {
        /* give the state values no initialiser would: a few real steps' worth */
        for (int k = 0; k < a->n_vars; k++)
            for (int64_t i = 0; i < mpt_shape_numel(a->vars[k].shape); i++)
                mpt_tensor_set(&a->vars[k], i, mpt_tensor_get(&a->vars[k], i) + 0.25 * (double)(k + 1) + (double)i / 64);
        char path[512], err[1024];
        mpt_ckpt_meta m = {.step = 7, .seed = 42, .batch_size = 4, .steps_per_epoch = 16};
        CHECK_MSG(mpt_ckpt_save(tmp_path("a.st", path, sizeof path), a, &m, err, sizeof err) == 0, "%s", err);
        test_layout(a, path);
        test_round_trip(a, path);
        test_policies(a, path);
        test_mismatch(a);
        test_damage(a, path);
        test_save_errors(a);
    }
    mpt_session_free(a);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", tmp);
    return check_exit("test_checkpoint");
}
