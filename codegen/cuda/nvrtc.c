/* codegen/cuda/nvrtc.c — CUDA C to PTX (and cubin) through NVRTC, with a
 * disk cache, and `mptc ptx`'s per-plan output.
 *
 * One compile for sm_XY yields PTX, the cubin and ptxas' -v report
 * (registers, spills) in the program log; compute_XY yields PTX only.
 * Cache entries are keyed by a 128-bit hash of (source, arch, options,
 * NVRTC version), so a new NVRTC or a changed generator never reads stale
 * code.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codegen/cuda/cuda_internal.h"
#include "codegen/kcache.h"
#include "codegen/cuda/driver.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *mpt_cuda_cache_dir(char *buf, size_t n) { return mpt_kcache_dir(buf, n); }

int mpt_cuda_arch_check(const char *arch, char *err, size_t n) {
    int v = 0;
    if ((sscanf(arch, "sm_%d", &v) == 1 || sscanf(arch, "compute_%d", &v) == 1) && v >= 80)
        return 0;
    snprintf(err, n, "unsupported CUDA architecture '%s' (hint: use sm_80, sm_86, sm_89, sm_90 "
             "or compute_90; generated kernels need sm_80+ for bf16 and mma.sync)", arch);
    return -1;
}

/* A ptxas line (C7xxx) about wgmma or warpgroup sync: ptxas serialized the
 * wgmmas ("Potential Performance Loss") or made a warpgroup.wait or
 * warpgroup.arrive of its own, because registers a wgmma reads or writes
 * were used while it was in flight. */
static int is_wgmma_note(const char *line, const char *end) {
    size_t len = (size_t)(end - line);
    return memmem(line, len, "(C7", 3) &&
           (memmem(line, len, "wgmma", 5) || memmem(line, len, "warpgroup", 9) ||
            memmem(line, len, "GMMA", 4));
}

/* the note at or after p: its start, and *end its end */
static const char *next_wgmma_note(const char *p, const char **end) {
    for (; p && *p; p = *end + (**end != 0)) {
        *end = strchr(p, '\n');
        if (!*end) *end = p + strlen(p);
        if (is_wgmma_note(p, *end)) return p;
    }
    return NULL;
}

const char *mpt_cuda_wgmma_note(const mpt_cuda_binary *b, char *buf, size_t n) {
    const char *end, *p = next_wgmma_note(b->log, &end);
    if (!p || n == 0) return NULL;
    const char *c = strstr(p, "(C7");
    if (c && c < end) p = c;
    const char *fn = strstr(p, " in function");
    if (fn && fn < end) end = fn;
    snprintf(buf, n, "%.*s", (int)(end - p), p);
    return buf;
}

int mpt_cuda_blocks_per_sm(const char *arch, unsigned threads, int regs, unsigned shared,
                           const char **limit) {
    /* per SM: shared memory, threads, blocks (the CUDA programming guide's
     * table of compute capabilities); 64 K registers on each */
    int v = 80;
    if (sscanf(arch, "sm_%d", &v) != 1) sscanf(arch, "compute_%d", &v);
    long sm_shared = 167936, sm_threads = 2048, sm_blocks = 32;
    if (v == 86 || v == 87 || v == 89)
        sm_shared = v == 87 ? 167936 : 102400, sm_threads = 1536, sm_blocks = v == 89 ? 24 : 16;
    else if (v >= 90) sm_shared = 233472;
    long warps = ((long)threads + 31) / 32, best = sm_blocks;
    *limit = "blocks";
    if (threads && sm_threads / ((long)warps * 32) < best)
        best = sm_threads / (warps * 32), *limit = "threads";
    if (regs > 0) { /* allocated per warp, 256 at a time */
        long per_warp = ((long)regs * 32 + 255) / 256 * 256;
        long fit = 65536 / (per_warp * warps);
        if (fit < best) best = fit, *limit = "registers";
    }
    if (shared) { /* and 1 KiB the system reserves per block */
        long per_block = (long)shared + 1024;
        if (sm_shared / per_block < best) best = sm_shared / per_block, *limit = "shared memory";
    }
    return (int)best;
}

static void parse_ptxas(mpt_cuda_binary *b) {
    b->regs = b->spill_stores = b->spill_loads = -1;
    b->wgmma_serial = b->static_smem = 0;
    if (!b->log) return;
    const char *sm = strstr(b->log, " bytes smem");
    if (sm) {
        while (sm > b->log && sm[-1] >= '0' && sm[-1] <= '9') sm--;
        b->static_smem = atoi(sm);
    }
    const char *end;
    for (const char *p = next_wgmma_note(b->log, &end); p; p = next_wgmma_note(end, &end))
        b->wgmma_serial++;
    const char *u = strstr(b->log, "Used ");
    if (u) sscanf(u, "Used %d registers", &b->regs);
    const char *s = strstr(b->log, "bytes spill stores");
    if (s) {
        while (s > b->log && s[-1] == ' ') s--;
        while (s > b->log && s[-1] >= '0' && s[-1] <= '9') s--;
        sscanf(s, "%d bytes spill stores, %d bytes spill loads", &b->spill_stores,
               &b->spill_loads);
    }
}

/* src without its leading comment, name replaced by "@" (malloc'd), so that
 * kernels differing only there compare equal */
static char *code_of(const char *src, const char *name) {
    if (strncmp(src, "/*", 2) == 0) {
        const char *end = strstr(src, "*/");
        if (end) src = end + 2;
    }
    size_t ln = strlen(name), len = strlen(src);
    char *c = malloc(len + 1), *o = c;
    if (!c) return NULL;
    while (*src) {
        if (ln && strncmp(src, name, ln) == 0) {
            *o++ = '@';
            src += ln;
        } else {
            *o++ = *src++;
        }
    }
    *o = 0;
    return c;
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* text with every `from` replaced by `to` (malloc'd) */
static char *renamed(const char *text, const char *from, const char *to) {
    size_t lf = strlen(from), lt = strlen(to), count = 0;
    for (const char *p = strstr(text, from); p; p = strstr(p + lf, from)) count++;
    char *r = malloc(strlen(text) + count * (lt > lf ? lt - lf : 0) + 1), *o = r;
    if (!r) return NULL;
    for (const char *p; (p = strstr(text, from)); text = p + lf) {
        memcpy(o, text, (size_t)(p - text));
        o += p - text;
        memcpy(o, to, lt);
        o += lt;
    }
    strcpy(o, text);
    return r;
}

/* ptx (compiled under the name `from`) as it reads under `to` (malloc'd).
 * C++ mangles a function's statics as _ZZ<length><name>E...: the length
 * goes with the name. */
static char *rename_ptx(const char *ptx, const char *from, const char *to) {
    char mf[300], mt[300];
    snprintf(mf, sizeof mf, "%zu%s", strlen(from), from);
    snprintf(mt, sizeof mt, "%zu%s", strlen(to), to);
    char *once = renamed(ptx, mf, mt);
    char *r = once ? renamed(once, from, to) : NULL;
    free(once);
    return r;
}

/* The PTX declares `.entry NAME(` and the cubin (if any) holds "NAME\0". */
static int entry_matches(const mpt_cuda_binary *b, const char *name) {
    char decl[300];
    snprintf(decl, sizeof decl, ".entry %s(", name);
    return strstr(b->ptx, decl) &&
           (!b->cubin || memmem(b->cubin, b->cubin_len, name, strlen(name) + 1));
}

int mpt_cuda_compile(const char *src, const char *name, const char *arch,
                     mpt_cuda_binary *out, char *err, size_t n) {
    memset(out, 0, sizeof *out);
    out->same_as = -1;
    double t0 = now();
    mpt_nvrtc_program prog = NULL;
    if (mpt_cuda_arch_check(arch, err, n)) return -1;
    /* wgmma exists only on sm_90's arch-specific target (sm_90a), whose
     * code runs on sm_90 GPUs alone */
    char arch_a[32];
    if (strstr(src, "wgmma.mma_async")) {
        if (strcmp(arch, "sm_90") && strcmp(arch, "compute_90") && strcmp(arch, "sm_90a") &&
            strcmp(arch, "compute_90a")) {
            snprintf(err, n, "kernel %s uses wgmma, which needs sm_90 (an H100), not %s (hint: "
                     "unset MPTC_CUDA_WGMMA, or --arch sm_90)", name, arch);
            return -1;
        }
        snprintf(arch_a, sizeof arch_a, "%s%s", arch, arch[strlen(arch) - 1] == 'a' ? "" : "a");
        arch = arch_a;
    }
    const mpt_nvrtc_api *nv = mpt_cuda_nvrtc(err, n);
    if (!nv) return -1;
    int cubin = strncmp(arch, "sm_", 3) == 0;
    char archopt[64];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
    int major = 0, minor = 0;
    MPT_NVRTC_CHECK(nv->version(&major, &minor), "reinstall the CUDA toolkit's NVRTC");
    /* -minimal (NVRTC 12.4 on) leaves out the texture, device-runtime and
     * host API declarations, which no generated kernel uses; parsing them
     * was about a tenth of a small kernel's compile (mlp_small's 28
     * kernels, NVRTC 13.0: 56 -> 51 ms of CPU each) */
    const char *minimal = major > 12 || (major == 12 && minor >= 4) ? "-minimal" : "";
    const char *opts[4] = {archopt, "-std=c++17"};
    int n_opts = 2;
    if (cubin) opts[n_opts++] = "--ptxas-options=-v";
    if (*minimal) opts[n_opts++] = minimal;

    /* the key is the code without its name and header: a kernel compiled
     * under another name (a renamed layer, a repeated block in another
     * model) is read back under that name, its PTX renamed */
    char ver[32], key[33];
    snprintf(ver, sizeof ver, "nvrtc %d.%d", major, minor);
    char *code = code_of(src, name);
    if (!code) goto oom;
    const char *parts[] = {code, arch, ver, opts[1], cubin ? "--ptxas-options=-v" : "", minimal};
    mpt_kcache_key(parts, (int)(sizeof parts / sizeof *parts), key);
    free(code);
    char dir[512], base[700], path[800];
    mpt_kcache_dir(dir, sizeof dir);
    snprintf(base, sizeof base, "%s/%s", dir, key);
    int use_cache = mpt_kcache_enabled();
    snprintf(path, sizeof path, "%s.ptx", base);
    out->ptx = use_cache ? mpt_kcache_read(path, &out->ptx_len) : NULL;
    if (out->ptx && cubin) {
        snprintf(path, sizeof path, "%s.cubin", base);
        out->cubin = mpt_kcache_read(path, &out->cubin_len);
    }
    char *entry = NULL;
    if (out->ptx && (!cubin || out->cubin)) {
        snprintf(path, sizeof path, "%s.name", base);
        entry = mpt_kcache_read(path, NULL);
    }
    /* Two processes compiling the same code under different names at once
     * (tests run side by side) may leave the name of one beside the PTX or
     * cubin of the other: an entry whose files disagree is compiled again. */
    if (entry && !entry_matches(out, entry)) {
        free(entry);
        entry = NULL;
    }
    if (entry) {
        snprintf(path, sizeof path, "%s.log", base);
        out->log = mpt_kcache_read(path, NULL);
        if (strcmp(entry, name) != 0) {
            char *ptx = rename_ptx(out->ptx, entry, name);
            if (!ptx) {
                free(entry);
                goto oom;
            }
            free(out->ptx);
            out->ptx = ptx;
            out->ptx_len = strlen(ptx);
            out->entry = entry;
        } else {
            free(entry);
        }
        parse_ptxas(out);
        out->cache_hit = 1;
        out->seconds = now() - t0;
        return 0;
    }
    mpt_cuda_binary_free(out);

    MPT_NVRTC_CHECK(nv->create_program(&prog, src, name, 0, NULL, NULL),
                    "NVRTC could not take the program; is the source empty?");
    mpt_nvrtc_result rc = nv->compile_program(prog, n_opts, opts);
    size_t len = 0;
    MPT_NVRTC_CHECK(nv->get_program_log_size(prog, &len), "NVRTC is broken; reinstall it");
    out->log = calloc(len + 1, 1);
    if (!out->log) goto oom;
    MPT_NVRTC_CHECK(nv->get_program_log(prog, out->log), "NVRTC is broken; reinstall it");
    if (rc != 0) {
        snprintf(err, n, "NVRTC failed to compile %s for %s: %s\n%s(hint: this is a bug in "
                 "mptc's CUDA generator; report it with the .cu file from `mptc ptx`)",
                 name, arch, nv->get_error_string(rc), out->log);
        goto fail;
    }
    MPT_NVRTC_CHECK(nv->get_ptx_size(prog, &out->ptx_len), "NVRTC is broken; reinstall it");
    out->ptx = malloc(out->ptx_len + 1);
    if (!out->ptx) goto oom;
    MPT_NVRTC_CHECK(nv->get_ptx(prog, out->ptx), "NVRTC is broken; reinstall it");
    out->ptx[out->ptx_len] = 0;
    out->ptx_len = strlen(out->ptx);
    if (cubin) {
        MPT_NVRTC_CHECK(nv->get_cubin_size(prog, &out->cubin_len),
                        "this NVRTC cannot emit cubin; use compute_XY for PTX only");
        out->cubin = malloc(out->cubin_len ? out->cubin_len : 1);
        if (!out->cubin) goto oom;
        MPT_NVRTC_CHECK(nv->get_cubin(prog, out->cubin), "NVRTC is broken; reinstall it");
    }
    nv->destroy_program(&prog);
    parse_ptxas(out);
    /* a cache that cannot be written only costs time: say nothing */
    if (use_cache) {
        snprintf(path, sizeof path, "%s.log", base);
        mpt_kcache_write(path, out->log, strlen(out->log));
        if (cubin) {
            snprintf(path, sizeof path, "%s.cubin", base);
            mpt_kcache_write(path, out->cubin, out->cubin_len);
        }
        snprintf(path, sizeof path, "%s.name", base);
        mpt_kcache_write(path, name, strlen(name));
        /* the PTX last: its presence is what a reader checks first */
        snprintf(path, sizeof path, "%s.ptx", base);
        mpt_kcache_write(path, out->ptx, out->ptx_len);
    }
    out->seconds = now() - t0;
    return 0;
oom:
    snprintf(err, n, "out of memory compiling %s", name);
fail:
    if (prog) nv->destroy_program(&prog);
    mpt_cuda_binary_free(out);
    return -1;
}

/* The worker threads of mpt_cuda_compile_all take kernels in index order;
 * a failure stops them taking more, and the lowest failing index reports. */
typedef struct {
    int count, next, failed; /* failed: lowest failing index, count if none */
    const int *leaders;      /* the kernels to compile (the first of each code) */
    int n_leaders;
    const char *const *srcs, *const *names;
    const char *arch;
    mpt_cuda_binary *out;
    char *err;
    size_t n;
    pthread_mutex_t lock;
} compile_queue;

static void *compile_worker(void *arg) {
    compile_queue *q = arg;
    char err[8192];
    for (;;) {
        pthread_mutex_lock(&q->lock);
        int t = q->failed < q->count ? q->n_leaders : q->next++;
        pthread_mutex_unlock(&q->lock);
        if (t >= q->n_leaders) return NULL;
        int i = q->leaders[t];
        if (mpt_cuda_compile(q->srcs[i], q->names[i], q->arch, &q->out[i], err, sizeof err)) {
            pthread_mutex_lock(&q->lock);
            if (i < q->failed) {
                q->failed = i;
                snprintf(q->err, q->n, "%s", err);
            }
            pthread_mutex_unlock(&q->lock);
        }
    }
}

int mpt_cuda_compile_jobs(void) {
    const char *e = getenv("MPTC_COMPILE_JOBS");
    int jobs = e && *e ? atoi(e) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    return jobs < 1 ? 1 : jobs > 64 ? 64 : jobs;
}

/* out[i] as a copy of out[j], j's code under i's name */
static int copy_binary(mpt_cuda_binary *o, const mpt_cuda_binary *from, int j,
                       const char *from_name, const char *name) {
    *o = *from;
    o->same_as = j;
    o->cache_hit = 0;
    o->seconds = 0;
    o->ptx = rename_ptx(from->ptx, from_name, name);
    o->log = from->log ? strdup(from->log) : NULL;
    /* the function in the cubin: from's own name, or the one from's
     * cache entry was compiled under */
    o->entry = strdup(from->entry ? from->entry : from_name);
    o->cubin = from->cubin ? malloc(from->cubin_len ? from->cubin_len : 1) : NULL;
    if (o->cubin) memcpy(o->cubin, from->cubin, from->cubin_len);
    if (o->ptx) o->ptx_len = strlen(o->ptx);
    return !o->ptx || !o->entry || (from->log && !o->log) || (from->cubin && !o->cubin);
}

int mpt_cuda_compile_all(int count, const char *const *srcs, const char *const *names,
                         const char *arch, mpt_cuda_binary *out, char *err, size_t n) {
    memset(out, 0, sizeof *out * (size_t)(count > 0 ? count : 0));
    if (count <= 0) return 0;
    if (mpt_cuda_arch_check(arch, err, n) || !mpt_cuda_nvrtc(err, n)) return -1;
    /* the first kernel of each code is compiled; same[i] is that kernel */
    char **code = calloc((size_t)count, sizeof *code);
    uint64_t *hash = calloc((size_t)count, sizeof *hash);
    int *same = calloc((size_t)count, sizeof *same);
    int *leaders = calloc((size_t)count, sizeof *leaders);
    int n_leaders = 0, rc = -1;
    if (!code || !hash || !same || !leaders) goto oom;
    for (int i = 0; i < count; i++) {
        if (!(code[i] = code_of(srcs[i], names[i]))) goto oom;
        hash[i] = fnv1a(code[i]);
        same[i] = i;
        for (int j = 0; j < i; j++)
            if (same[j] == j && hash[j] == hash[i] && strcmp(code[j], code[i]) == 0) {
                same[i] = j;
                break;
            }
        if (same[i] == i) leaders[n_leaders++] = i;
    }
    compile_queue q = {.count = count, .failed = count, .leaders = leaders,
                       .n_leaders = n_leaders, .srcs = srcs, .names = names, .arch = arch,
                       .out = out, .err = err, .n = n};
    pthread_mutex_init(&q.lock, NULL);
    int jobs = mpt_cuda_compile_jobs();
    if (jobs > n_leaders) jobs = n_leaders;
    pthread_t th[64];
    int started = 0;
    /* NVRTC compiles separate programs on separate threads; a thread that
     * cannot start leaves its share to the others (and to this one) */
    for (int t = 1; t < jobs; t++)
        if (pthread_create(&th[started], NULL, compile_worker, &q) == 0) started++;
    compile_worker(&q);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    pthread_mutex_destroy(&q.lock);
    if (q.failed < count) goto done;
    for (int i = 0; i < count; i++) {
        out[i].same_as = -1;
        if (same[i] != i && copy_binary(&out[i], &out[same[i]], same[i], names[same[i]],
                                        names[i]))
            goto oom;
    }
    rc = 0;
    goto done;
oom:
    snprintf(err, n, "out of memory compiling %d CUDA kernels", count);
done:
    for (int i = 0; code && i < count; i++) free(code[i]);
    free(code);
    free(hash);
    free(same);
    free(leaders);
    if (rc)
        for (int i = 0; i < count; i++) mpt_cuda_binary_free(&out[i]);
    return rc;
}

void mpt_cuda_binary_free(mpt_cuda_binary *b) {
    free(b->ptx);
    free(b->cubin);
    free(b->log);
    free(b->entry);
    memset(b, 0, sizeof *b);
    b->same_as = -1;
}

static int write_text(const char *dir, const char *name, const char *ext, const char *text,
                      char *err, size_t n) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f)) {
        snprintf(err, n, "cannot write %s: %s (hint: check that -o names a writable directory)",
                 path, strerror(errno));
        if (f) fclose(f);
        return -1;
    }
    return 0;
}

int mpt_cuda_emit_plan(const mpt_plan *p, const char *arch, const char *outdir,
                       FILE *report, char *err, size_t n) {
    if (mpt_cuda_arch_check(arch, err, n)) return -1;
    if (outdir && mpt_make_dirs(outdir)) {
        snprintf(err, n, "cannot create %s: %s (hint: pick another -o directory)", outdir,
                 strerror(errno));
        return -1;
    }
    /* every generated kernel's source first, then all compiled at once */
    int nk = p->n_kernels, n_lt = 0, n_gen = 0, rc = -1;
    mpt_cuda_kernel_src *src = calloc((size_t)nk + 1, sizeof *src);
    mpt_cuda_binary *bin = calloc((size_t)nk + 1, sizeof *bin);
    const char **srcs = calloc((size_t)nk + 1, sizeof *srcs);
    const char **names = calloc((size_t)nk + 1, sizeof *names);
    int *gen = calloc((size_t)nk + 1, sizeof *gen); /* kernel index of each compile */
    mpt_lt_call *calls = calloc((size_t)nk + 1, sizeof *calls);
    const char **why = calloc((size_t)nk + 1, sizeof *why);
    if (!src || !bin || !srcs || !names || !gen || !calls || !why) {
        snprintf(err, n, "out of memory emitting the plan's kernels");
        goto done;
    }
    int n_coll = 0;
    for (int i = 0; i < nk; i++) {
        const mpt_kernel *k = &p->kernels[i];
        if (mpt_cuda_kernel_is_collective(p, i)) { /* NCCL's, at run time */
            n_coll++;
            continue;
        }
        if (mpt_cuda_lt_candidate(p->g, k)) {
            why[i] = mpt_cuda_match_lt(p->g, k, &calls[i]);
            if (!why[i]) {
                n_lt++;
                continue;
            }
        }
        if (mpt_cuda_emit_kernel(p, i, &src[n_gen], err, n)) goto done;
        srcs[n_gen] = src[n_gen].source;
        names[n_gen] = src[n_gen].name;
        gen[n_gen++] = i;
    }
    double t0 = now();
    if (mpt_cuda_compile_all(n_gen, srcs, names, arch, bin, err, n)) goto done;
    double wall = now() - t0, secs = 0;
    int n_code = 0, n_mma = 0, n_tf32 = 0, n_split = 0, n_phased = 0, n_flags = 0, n_wg = 0,
        n_serial = 0, n_attn = 0, n_attn_tc = 0;
    size_t scratch = 0, counters = 0, summed = 0; /* the largest of each, and the sum */
    for (int j = 0; j < n_gen; j++) {
        n_code += bin[j].same_as < 0;
        const mpt_kernel *kj = &p->kernels[gen[j]];
        mpt_op root = kj->root >= 0 ? p->g->nodes[kj->root].op : MPT_OP_COUNT;
        int attn = root == MPT_OP_ATTENTION || root == MPT_OP_ATTENTION_GRAD;
        n_attn += attn;
        n_attn_tc += attn && src[j].tensor_cores;
        n_mma += src[j].tensor_cores && !attn;
        n_tf32 += src[j].tf32;
        n_split += src[j].grid[2] > 1;
        n_phased += src[j].phases > 0;
        n_flags += src[j].set_true != 0;
        n_wg += src[j].wgmma;
        n_serial += bin[j].wgmma_serial > 0;
        if (src[j].scratch_bytes > scratch) scratch = src[j].scratch_bytes;
        if (src[j].counter_bytes > counters) counters = src[j].counter_bytes;
        summed += src[j].scratch_bytes + src[j].counter_bytes;
    }
    for (int j = 0, i = 0; i < nk; i++) {
        const mpt_kernel *k = &p->kernels[i];
        /* why a GEMM (or a 1x1 convolution) is not cuBLASLt's */
        int lt_able = (k->kind != MPT_KERNEL_CONV && mpt_cuda_lt_candidate(p->g, k)) ||
                      (k->kind == MPT_KERNEL_CONV && (!why[i] || !strstr(why[i], "not a GEMM")));
        if (report && lt_able) {
            fprintf(report, "kernel %d %s: ", i, k->name);
            if (!why[i]) {
                mpt_lt_call_print(&calls[i], p->g, report);
                if (p->tf32 && calls[i].a_dt == MPT_DT_F32) fputs(" compute=TF32", report);
                fputc('\n', report);
                continue;
            }
            fprintf(report, "generated, not cuBLASLt: %s\n", why[i]);
        }
        if (report && mpt_cuda_kernel_is_collective(p, i))
            fprintf(report, "kernel %d %s: %s across the ranks: NCCL calls or device copies of "
                    "the executor, not generated\n", i, k->name,
                    mpt_op_name(p->g->nodes[k->root].op));
        if (j >= n_gen || gen[j] != i) continue;
        const mpt_cuda_kernel_src *s = &src[j];
        const mpt_cuda_binary *b = &bin[j++];
        if (outdir && (write_text(outdir, s->name, "cu", s->source, err, n) ||
                       write_text(outdir, s->name, "ptx", b->ptx, err, n)))
            goto done;
        secs += b->seconds;
        if (!report) continue;
        fprintf(report, "kernel %d %s: %s grid (%u,%u", i, s->name,
                s->tf32      ? "mma.sync tf32"
                : s->wgmma   ? "wgmma"
                : s->tensor_cores ? "mma.sync"
                                  : "cuda-core",
                s->grid[0],
                s->grid[1]);
        if (s->grid[2] > 1) fprintf(report, ",%u: split-K", s->grid[2]);
        fprintf(report, ") block %u", s->block[0]);
        if (s->tile_m) fprintf(report, ", tile %dx%d", s->tile_m, s->tile_n);
        if (s->phases) fprintf(report, ", %d phases", s->phases);
        if (s->shared_bytes) fprintf(report, ", %u B shared", s->shared_bytes);
        if (s->scratch_bytes) fprintf(report, ", %zu B scratch", s->scratch_bytes);
        if (s->counter_bytes) fprintf(report, ", %zu B counters", s->counter_bytes);
        if (s->set_true)
            fprintf(report, ", %d reduce_all in the epilogue (flags set true before it)",
                    __builtin_popcountll(s->set_true));
        if (b->regs >= 0)
            fprintf(report, ", %d registers, %d bytes spilled", b->regs, b->spill_stores);
        if (b->regs >= 0 && b->cubin) {
            const char *why;
            int blocks = mpt_cuda_blocks_per_sm(arch, s->block[0] * s->block[1] * s->block[2],
                                                b->regs, s->shared_bytes + b->static_smem, &why);
            fprintf(report, ", %d block%s an SM (%s)", blocks, blocks == 1 ? "" : "s", why);
        }
        char note[256];
        if (mpt_cuda_wgmma_note(b, note, sizeof note))
            fprintf(report, "; ptxas serialized its wgmma: %s", note);
        if (b->same_as >= 0)
            fprintf(report, " (the code of kernel %d)", gen[b->same_as]);
        fprintf(report, "%s\n", b->cache_hit ? " (cached)" : "");
    }
    if (report) {
        char dir[512];
        int lt_tc = 0; /* cuBLASLt calls on Tensor Cores: 16-bit operands, or TF32 */
        for (int i = 0; i < nk; i++) {
            const mpt_kernel *k = &p->kernels[i];
            if (mpt_cuda_lt_candidate(p->g, k) && !why[i])
                lt_tc += calls[i].a_dt != MPT_DT_F32 || p->tf32;
        }
        fprintf(report, "%d kernels: %d generated for %s, %d different (%.2f s in NVRTC, "
                "%.2f s on %d threads), %d cuBLASLt calls (%d on Tensor Cores)", nk,
                n_gen, arch, n_code, secs, wall,
                mpt_cuda_compile_jobs() < n_code ? mpt_cuda_compile_jobs() : n_code, n_lt, lt_tc);
        if (n_coll) fprintf(report, ", %d collectives (NCCL)", n_coll);
        fprintf(report, "; cache %s\n", mpt_cuda_cache_dir(dir, sizeof dir));
        fprintf(report, "generated GEMMs and convolutions: %d on Tensor Cores (%d TF32), %d "
                "split along k, %d strided data gradients by phase, %d with a reduce_all in "
                "the epilogue; scratch and counters (split-K, split reductions) %.1f MiB, "
                "shared by every kernel (%.1f MiB if each had its own)\n", n_mma, n_tf32,
                n_split, n_phased, n_flags,
                (double)(scratch + counters) / (1 << 20), (double)summed / (1 << 20));
        if (n_wg)
            fprintf(report, "%d of them use sm_90's wgmma (MPTC_CUDA_WGMMA=1; compiled for "
                    "sm_90a); %d serialized by ptxas%s\n", n_wg, n_serial,
                    n_serial ? " (hint: a register a wgmma uses is touched while it runs; see "
                               "their lines above)" : "");
        else if (n_mma > n_tf32 && strncmp(arch, "sm_90", 5) == 0)
            fprintf(report, "the f16/bf16 ones use mma.sync; MPTC_CUDA_WGMMA=1 generates sm_90's "
                    "wgmma instead (opt-in)\n");
        if (n_attn)
            fprintf(report, "fused attention: %d kernels, %d on Tensor Cores (mma.sync), %d one "
                    "thread a row (f32, or head sizes not multiples of 16 up to 128)\n", n_attn,
                    n_attn_tc, n_attn - n_attn_tc);
        if (outdir)
            fprintf(report, "wrote the CUDA source and PTX of the %d generated kernels to %s/ "
                    "(cuBLASLt's %d calls have neither; their lines above name them)\n", n_gen,
                    outdir, n_lt);
    }
    rc = 0;
done:
    for (int j = 0; src && bin && j < n_gen; j++) {
        mpt_cuda_binary_free(&bin[j]);
        mpt_cuda_kernel_src_free(&src[j]);
    }
    free(src);
    free(bin);
    free(srcs);
    free(names);
    free(gen);
    free(calls);
    free(why);
    return rc;
}
