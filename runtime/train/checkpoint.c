/* runtime/train/checkpoint.c — safetensors save and load (format: checkpoint.h,
 * names and guarantees: docs/CHECKPOINTS.md).
 *
 * Loading checks the whole file before it touches the session: a file that
 * is truncated, corrupt or written for another model changes nothing, and
 * every problem is listed at once, as a compiler lists its errors. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/dist/dist.h"
#include "runtime/train/train.h"

/* safetensors' dtype names */
static const char *st_dtype(mpt_dtype dt) {
    switch (dt) {
    case MPT_DT_F32: return "F32";
    case MPT_DT_F16: return "F16";
    case MPT_DT_BF16: return "BF16";
    case MPT_DT_I32: return "I32";
    case MPT_DT_BOOL: return "BOOL";
    case MPT_DT_F64: return "F64";
    case MPT_DT_COUNT: break;
    }
    return "?";
}

static int st_dtype_parse(const char *s, mpt_dtype *out) {
    for (int d = 0; d < MPT_DT_COUNT; d++)
        if (strcmp(s, st_dtype((mpt_dtype)d)) == 0) {
            *out = (mpt_dtype)d;
            return 0;
        }
    return -1;
}

static const char *var_name(const mpt_session *s, int k) {
    return s->train->nodes[mpt_graph_variable_node(s->train, k)].name;
}

int mpt_ckpt_is_weight(const mpt_session *s, int k) {
    int id = mpt_graph_find_variable(s->model->graph, var_name(s, k));
    return id >= 0 && mpt_dtype_is_float(s->model->graph->nodes[id].dtype);
}

/* ---- the state as a file holds it ----------------------------------------
 * A data-parallel run with a sharded optimizer (ZeRO-1, ir/train.c) holds
 * on each rank only its shard of every optimizer slot: a state variable
 * "<w>@shard/<slot>" of [s] values, shard `rank` of the flattened slot
 * "<w>/<slot>" (w's shape). A checkpoint always holds whole slots, under
 * the names one process uses, so it resumes with or without sharding and
 * with any number of ranks: saving gathers the shards, loading takes this
 * rank's. */
typedef struct {
    const char *name;
    mpt_tensor t;   /* the session's own, or (a shard) the whole slot */
    int shard;      /* 1: t is allocated here, the state variable a shard of it */
    char *owned;    /* the whole slot's name */
} ck_entry;

static void view_free(ck_entry *v, int n) {
    for (int k = 0; v && k < n; k++)
        if (v[k].shard) {
            mpt_tensor_free(&v[k].t);
            free(v[k].owned);
        }
    free(v);
}

/* gather: fill the whole slots from every rank's shard (every rank must
 * call it then, as the collective needs them all) */
static ck_entry *view_open(const mpt_session *s, int gather, char *err, size_t n) {
    ck_entry *v = calloc((size_t)s->n_vars + 1, sizeof *v);
    if (!v) goto oom;
    for (int k = 0; k < s->n_vars; k++) {
        const char *nm = var_name(s, k), *at = strstr(nm, "@shard/");
        v[k].name = nm;
        v[k].t = s->vars[k];
        if (!at) continue;
        char w[512];
        snprintf(w, sizeof w, "%.*s", (int)(at - nm), nm);
        int kw = mpt_session_var(s, w);
        if (kw < 0) {
            snprintf(err, n, "internal: %s shards a slot of %s, which the state lacks", nm, w);
            goto fail;
        }
        size_t len = strlen(nm);
        v[k].shard = 1;
        if (!(v[k].owned = malloc(len))) goto oom;
        snprintf(v[k].owned, len, "%s%s", w, at + 6); /* "<w>/<slot>" */
        v[k].name = v[k].owned;
        if (mpt_tensor_alloc(&v[k].t, s->vars[k].dtype, s->vars[kw].shape)) goto oom;
        if (gather && mpt_collective_all_gather(s->vars[k].data, mpt_shape_numel(s->vars[k].shape),
                                                v[k].t.data, mpt_shape_numel(v[k].t.shape),
                                                s->vars[k].dtype, err, n))
            goto fail;
    }
    return v;
oom:
    snprintf(err, n, "out of memory gathering the sharded optimizer state");
fail:
    view_free(v, s->n_vars);
    return NULL;
}

/* "F32[784,256]" */
static const char *describe(const char *dtype, mpt_shape sh, char *buf, size_t n) {
    char sb[96];
    snprintf(buf, n, "%s%s", dtype, mpt_shape_str(sh, sb, sizeof sb));
    return buf;
}

/* ---- saving ---------------------------------------------------------------- */

static int io_fail(char *err, size_t n, const char *what, const char *path) {
    snprintf(err, n, "cannot %s checkpoint %s: %s\n  hint: check that the directory exists, "
                     "is writable and the disk is not full",
             what, path, strerror(errno));
    return -1;
}

static char *header_json(const mpt_session *s, const ck_entry *view, const mpt_ckpt_meta *m) {
    cJSON *h = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(h, "__metadata__");
    char buf[64];
    /* safetensors metadata is a string-to-string map */
    snprintf(buf, sizeof buf, "%ld", m->step);
    cJSON_AddStringToObject(md, "step", buf);
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)m->seed);
    cJSON_AddStringToObject(md, "seed", buf);
    snprintf(buf, sizeof buf, "%ld", m->batch_size);
    cJSON_AddStringToObject(md, "batch_size", buf);
    snprintf(buf, sizeof buf, "%ld", m->steps_per_epoch);
    cJSON_AddStringToObject(md, "steps_per_epoch", buf);
    cJSON_AddStringToObject(md, "policy", s->policy.name);
    cJSON_AddStringToObject(md, "model", s->model->name);
    cJSON_AddStringToObject(md, "format", "mptc-1");
    int64_t off = 0;
    for (int k = 0; k < s->n_vars; k++) {
        const mpt_tensor *v = &view[k].t;
        cJSON *t = cJSON_AddObjectToObject(h, view[k].name);
        cJSON_AddStringToObject(t, "dtype", st_dtype(v->dtype));
        cJSON *shape = cJSON_AddArrayToObject(t, "shape");
        for (int d = 0; d < v->shape.rank; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)v->shape.dim[d]));
        int64_t bytes = (int64_t)mpt_tensor_bytes(v);
        cJSON *offs = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + bytes)));
        off += bytes;
    }
    char *json = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    return json;
}

/* The rename is durable only once the directory entry is on disk. */
static int fsync_dir_of(const char *path) {
    char *copy = strdup(path);
    int fd = copy ? open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    free(copy);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int mpt_ckpt_save(const char *path, const mpt_session *s, const mpt_ckpt_meta *m, char *err,
                  size_t n) {
    if (mpt_session_pull_vars(s, err, n)) return -1;
    /* every rank gathers the sharded slots, then rank 0 alone writes: in a
     * data-parallel run every rank holds the same state (the others would
     * race it to the same file) */
    ck_entry *view = view_open(s, 1, err, n);
    if (!view) return -1;
    if (mpt_dist_rank() != 0) {
        view_free(view, s->n_vars);
        return 0;
    }
    char *json = header_json(s, view, m);
    if (!json) {
        snprintf(err, n, "out of memory writing the checkpoint header for %s", path);
        view_free(view, s->n_vars);
        return -1;
    }
    /* the data starts 8-byte aligned; safetensors allows trailing spaces */
    size_t jlen = strlen(json), padded = (jlen + 7) & ~(size_t)7;
    size_t tlen = strlen(path) + 5;
    char *tmp = malloc(tlen);
    snprintf(tmp, tlen, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        io_fail(err, n, "create", tmp);
        if (fd >= 0) close(fd);
        free(tmp);
        free(json);
        view_free(view, s->n_vars);
        return -1;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(json, 1, jlen, f) == jlen;
    for (size_t i = jlen; i < padded && ok; i++) ok = fputc(' ', f) != EOF;
    /* tensors are stored in the host's order; every supported host is
     * little-endian, as safetensors requires */
    for (int k = 0; k < s->n_vars && ok; k++) {
        size_t b = mpt_tensor_bytes(&view[k].t);
        ok = fwrite(view[k].t.data, 1, b, f) == b;
    }
    view_free(view, s->n_vars);
    const char *what = "write";
    if (ok && (fflush(f) != 0 || fsync(fd) != 0)) ok = 0, what = "sync";
    if (fclose(f) != 0 && ok) ok = 0, what = "close";
    if (ok && rename(tmp, path) != 0) ok = 0, what = "rename into";
    if (ok && fsync_dir_of(path) != 0) ok = 0, what = "sync the directory of";
    free(json);
    if (!ok) {
        io_fail(err, n, what, strcmp(what, "rename into") ? tmp : path);
        unlink(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

/* ---- listing problems --------------------------------------------------- */

/* Lines go into err while they fit, keeping room for the closing hint;
 * the rest are counted. */
typedef struct {
    char *err;
    size_t n, room;
    int lines, dropped;
} listing;

enum { LISTING_HINT_ROOM = 400 };

static void listing_add(listing *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void listing_add(listing *l, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t used = strlen(l->err);
    l->lines++;
    if (used + strlen(line) + 3 >= l->room) {
        l->dropped++;
        return;
    }
    snprintf(l->err + used, l->n - used, "\n  %s", line);
}

static void listing_end(listing *l, const char *hint) {
    size_t used = strlen(l->err);
    if (l->dropped)
        used += (size_t)snprintf(l->err + used, l->n - used, "\n  ... and %d more", l->dropped);
    if (used < l->n) snprintf(l->err + used, l->n - used, "\n  hint: %s", hint);
}

/* ---- the file's table of contents ----------------------------------------- */

typedef struct {
    const char *name; /* points into the parsed header */
    const char *dtype_name; /* as the file says: safetensors has more than mptc reads */
    int foreign;            /* a dtype mptc does not load (U8, I64, ...) */
    mpt_dtype dtype;
    mpt_shape shape;
    size_t offset, bytes;
    int used;            /* matched to a session variable */
} st_entry;

typedef struct {
    uint8_t *data;
    size_t len;
    cJSON *header;
    const uint8_t *body;
    size_t body_len;
    st_entry *e;
    int n;
} st_file;

static void st_close(st_file *f) {
    cJSON_Delete(f->header);
    free(f->data);
    free(f->e);
}

static int read_all(const char *path, st_file *f, char *err, size_t n) {
    struct stat st;
    /* before opening: opening a FIFO blocks until a writer comes */
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        snprintf(err, n, "checkpoint %s is not a regular file (%s)\n  hint: pass the .safetensors "
                 "file itself", path, S_ISDIR(st.st_mode) ? "a folder" : "a pipe or a device");
        return -1;
    }
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        snprintf(err, n, "cannot open checkpoint %s: %s%s", path, strerror(errno),
                 errno == ENOENT ? "\n  hint: pass a file written by `mptc train --save`"
                                 : "\n  hint: check the file's permissions");
        return -1;
    }
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, n, "checkpoint %s is not a regular file\n  hint: pass the .st file itself, "
                         "not a folder", path);
        fclose(fp);
        return -1;
    }
    f->len = (size_t)st.st_size;
    f->data = malloc(f->len + 1);
    if (!f->data || fread(f->data, 1, f->len, fp) != f->len) {
        snprintf(err, n, "cannot read checkpoint %s: %s", path,
                 f->data ? "short read" : "out of memory");
        fclose(fp);
        return -1;
    }
    fclose(fp);
    return 0;
}

/* A whole non-negative number that a double holds exactly. */
static int json_size(const cJSON *j, size_t *out) {
    if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble > 9007199254740992.0 ||
        j->valuedouble != (double)(int64_t)j->valuedouble)
        return -1;
    *out = (size_t)j->valuedouble;
    return 0;
}

static const char *parse_entry(const cJSON *t, st_entry *e) {
    if (!cJSON_IsObject(t)) return "not an object";
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    if (!cJSON_IsString(dt) || !dt->valuestring[0]) return "missing dtype";
    e->dtype_name = dt->valuestring;
    e->foreign = st_dtype_parse(dt->valuestring, &e->dtype) != 0;
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > MPT_MAX_DIMS) return "bad shape";
    e->shape.rank = cJSON_GetArraySize(shape);
    /* bound the element count as each dim is read, so a forged shape cannot
     * overflow mpt_shape_numel (signed) or its product with the dtype size */
    size_t numel = 1;
    for (int d = 0; d < e->shape.rank; d++) {
        size_t v;
        if (json_size(cJSON_GetArrayItem(shape, d), &v)) return "bad shape";
        if (v && numel > ((size_t)1 << 53) / v) return "bad shape";
        numel *= v;
        e->shape.dim[d] = (int64_t)v;
    }
    size_t a, b;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        json_size(cJSON_GetArrayItem(offs, 0), &a) || json_size(cJSON_GetArrayItem(offs, 1), &b) ||
        a > b)
        return "bad data_offsets";
    if (!e->foreign && b - a != (size_t)mpt_shape_numel(e->shape) * mpt_dtype_size(e->dtype))
        return "data_offsets disagree with the dtype and shape";
    e->offset = a;
    e->bytes = b - a;
    return NULL;
}

static int st_open(const char *path, st_file *f, char *err, size_t n) {
    memset(f, 0, sizeof *f);
    if (read_all(path, f, err, n)) return -1;
    const char *hint = "\n  hint: the file is damaged or not a checkpoint; "
                       "use one written by `mptc train --save`";
    if (f->len < 8) {
        snprintf(err, n, "%s is not a safetensors file: %zu bytes, shorter than its 8-byte header "
                         "length%s", path, f->len, hint);
        return -1;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)f->data[i] << (8 * i);
    if (hlen > f->len - 8) {
        snprintf(err, n, "%s is not a safetensors file or is truncated: its header claims %llu "
                         "bytes, the file has %zu after the length%s",
                 path, (unsigned long long)hlen, f->len - 8, hint);
        return -1;
    }
    f->header = cJSON_ParseWithLength((const char *)f->data + 8, (size_t)hlen);
    if (!cJSON_IsObject(f->header)) {
        snprintf(err, n, "%s: the safetensors header is not a JSON object%s", path, hint);
        return -1;
    }
    f->body = f->data + 8 + hlen;
    f->body_len = f->len - 8 - (size_t)hlen;
    f->e = calloc((size_t)cJSON_GetArraySize(f->header) + 1, sizeof *f->e);
    const cJSON *t;
    size_t need = 0;
    listing l = {.err = err, .n = n, .room = n > LISTING_HINT_ROOM ? n - LISTING_HINT_ROOM : n / 2};
    snprintf(err, n, "%s is damaged:", path);
    cJSON_ArrayForEach(t, f->header) {
        if (strcmp(t->string, "__metadata__") == 0) continue;
        st_entry *e = &f->e[f->n++];
        e->name = t->string;
        const char *problem = parse_entry(t, e);
        if (problem) listing_add(&l, "%s: %s", e->name, problem);
        else if (e->offset + e->bytes > need) need = e->offset + e->bytes;
    }
    if (l.lines) {
        listing_end(&l, "the file is damaged or was not written by mptc; use another checkpoint");
        return -1;
    }
    if (need > f->body_len) {
        snprintf(err, n, "%s is truncated: its tensors need %zu bytes of data, the file holds %zu\n"
                         "  hint: the write was cut short (disk full, copy interrupted); use an "
                         "earlier checkpoint", path, need, f->body_len);
        return -1;
    }
    return 0;
}

static st_entry *st_find(st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->e[i].name, name) == 0) return &f->e[i];
    return NULL;
}

static const char *st_meta(const st_file *f, const char *key) {
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(f->header, "__metadata__");
    const cJSON *v = md ? cJSON_GetObjectItemCaseSensitive(md, key) : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A counter of the metadata: absent is 0; anything but a whole number in
 * [0, 2^40] is -1, so a damaged or forged value cannot steer a resume. */
static long st_meta_long(const st_file *f, const char *key) {
    const char *v = st_meta(f, key);
    if (!v) return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    return *v && !*end && !errno && x >= 0 && x <= (1L << 40) ? x : -1;
}

/* A tensor of the file that is a model weight, judged from the file alone:
 * not optimizer, loss-scale or rng state, and not a slot "<tensor>/m" of
 * another tensor in the file. */
static int st_is_weight(st_file *f, const char *name) {
    static const char *const state[] = {"optimizer/", "loss_scale/", "rng/"};
    for (size_t i = 0; i < sizeof state / sizeof state[0]; i++)
        if (strncmp(name, state[i], strlen(state[i])) == 0) return 0;
    for (const char *p = strchr(name, '/'); p; p = strchr(p + 1, '/'))
        for (int i = 0; i < f->n; i++)
            if (strlen(f->e[i].name) == (size_t)(p - name) && !strncmp(f->e[i].name, name, (size_t)(p - name)))
                return 0;
    return 1;
}

/* Checks variable k against the file and marks its entry used. */
static void match_var(st_file *f, const ck_entry *view, int k, listing *l) {
    const char *nm = view[k].name;
    const mpt_tensor *v = &view[k].t;
    char want[128], have[128];
    describe(st_dtype(v->dtype), v->shape, want, sizeof want);
    st_entry *e = st_find(f, nm);
    /* checkpoints from before the learning rate became state: it keeps
     * the value the session started with */
    if (!e && strcmp(nm, "optimizer/learning_rate") == 0) return;
    if (!e) {
        listing_add(l, "missing %s %s", nm, want);
        return;
    }
    e->used = 1;
    if (e->foreign || e->dtype != v->dtype || !mpt_shape_eq(e->shape, v->shape))
        listing_add(l, "%s: the file has %s, the model wants %s", nm,
                    describe(e->dtype_name, e->shape, have, sizeof have), want);
}

int mpt_ckpt_load(const char *path, mpt_session *s, mpt_ckpt_what what, mpt_ckpt_meta *m,
                  char *err, size_t n) {
    st_file f;
    if (st_open(path, &f, err, n)) {
        st_close(&f);
        return -1;
    }
    const char *fmodel = st_meta(&f, "model"), *fpolicy = st_meta(&f, "policy");
    snprintf(err, n, "%s (model %s, policy %s) does not match %s under policy %s:", path,
             fmodel ? fmodel : "?", fpolicy ? fpolicy : "?", s->model->name, s->policy.name);
    listing l = {.err = err, .n = n, .room = n > LISTING_HINT_ROOM ? n - LISTING_HINT_ROOM : n / 2};
    char verr[256];
    ck_entry *view = view_open(s, 0, verr, sizeof verr);
    if (!view) {
        snprintf(err, n, "%s", verr);
        st_close(&f);
        return -1;
    }
    for (int k = 0; k < s->n_vars; k++)
        if (what == MPT_CKPT_ALL || mpt_ckpt_is_weight(s, k)) match_var(&f, view, k, &l);
    char desc[128];
    for (int i = 0; i < f.n; i++) {
        st_entry *e = &f.e[i];
        if (e->used || (what == MPT_CKPT_WEIGHTS && !st_is_weight(&f, e->name))) continue;
        listing_add(&l, "unexpected %s %s: the model has no such %s", e->name,
                         describe(e->dtype_name, e->shape, desc, sizeof desc),
                         what == MPT_CKPT_ALL ? "state" : "weight");
    }
    if (l.lines) {
        listing_end(&l, what == MPT_CKPT_ALL
                            ? "--resume needs a checkpoint of the same model, policy, optimizer and "
                              "loss scaling; to change them, start a new run with --init-weights FILE"
                            : "the checkpoint must come from a model with the same layer names and "
                              "shapes; the policy may differ");
        st_close(&f);
        view_free(view, s->n_vars);
        return -1;
    }
    static const char *const counters[] = {"step", "batch_size", "steps_per_epoch"};
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        if (st_meta_long(&f, counters[i]) < 0) {
            snprintf(err, n, "%s is damaged: its metadata \"%s\" is not a whole number >= 0\n"
                             "  hint: pass a file written by `mptc train --save`", path, counters[i]);
            st_close(&f);
            view_free(view, s->n_vars);
            return -1;
        }
    for (int k = 0; k < s->n_vars; k++) {
        if (what == MPT_CKPT_WEIGHTS && !mpt_ckpt_is_weight(s, k)) continue;
        const st_entry *e = st_find(&f, view[k].name);
        if (!e) continue; /* the learning rate, above */
        memcpy(view[k].t.data, f.body + e->offset, e->bytes);
        if (view[k].shard) /* this rank's shard of the whole slot */
            mpt_collective_rank_slice(view[k].t.data, mpt_shape_numel(view[k].t.shape),
                                      s->vars[k].data, mpt_shape_numel(s->vars[k].shape),
                                      s->vars[k].dtype);
    }
    view_free(view, s->n_vars);
    if (m) {
        const char *seed = st_meta(&f, "seed");
        m->step = st_meta_long(&f, "step");
        if (seed) m->seed = strtoull(seed, NULL, 10);
        m->batch_size = st_meta_long(&f, "batch_size");
        m->steps_per_epoch = st_meta_long(&f, "steps_per_epoch");
    }
    err[0] = 0;
    st_close(&f);
    return 0;
}

int mpt_ckpt_open_inference(const mpt_compile_opts *o, const char *path, mpt_session **out) {
    mpt_compile_opts co = *o;
    co.want_eval = 1;
    char err[4096];
    *out = NULL;
    mpt_session *s;
    if (mpt_session_open(&co, &s)) return -1;
    /* the seed does not matter: every weight is overwritten below */
    if (mpt_session_init_state(s, 1)) {
        fprintf(stderr, "mptc: cannot initialise the model's variables\n");
        mpt_session_free(s);
        return -1;
    }
    if (mpt_ckpt_load(path, s, MPT_CKPT_WEIGHTS, NULL, err, sizeof err)) {
        fprintf(stderr, "mptc: %s\n", err);
        mpt_session_free(s);
        return -1;
    }
    *out = s;
    return 0;
}
