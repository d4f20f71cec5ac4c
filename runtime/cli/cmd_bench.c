/* runtime/cli/cmd_bench.c — `mptc bench`: the same model compiled under every
 * combination of precision policy, batch size and fused/unfused, timed on
 * synthetic data, printed as seed 000's table (rows batch sizes, columns
 * policies, ms/step) with the speedups, written as JSON and plotted.
 *
 * A configuration that does not compile, does not fit in memory or fails
 * while running becomes a cell that says so ("OOM", "failed"); the other
 * cells still run. */
#include <cjson/cJSON.h>
#include <ftw.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codegen/cpu/cpu_backend.h"
#include "runtime/cuda/cuda.h"
#include "codegen/kcache.h"
#include "runtime/cli/cli.h"
#include "runtime/data/data.h"

static const mpt_cli_opt bench_opts[] = {
    {"policy", 1, "policies to compare (default: float32,mixed_float16,mixed_bfloat16)"},
    {"batch-sizes", 1, "batch sizes, e.g. 32,64,128 (default: the train block's)"},
    {"compare", 1, "fused,unfused: time the fused plan, the unfused one or both (default: fused)"},
    {"device", 1, "auto | cpu | cuda | interp"},
    {"threads", 1, "CPU worker threads (default: the cores this process may run on)"},
    {"tf32", 0, "CUDA: float32 GEMMs and convolutions on TF32 Tensor Cores (default: fp32)"},
    {"steps", 1, "timed steps per configuration (default 5)"},
    {"warmup", 1, "untimed steps before them (default 1)"},
    {"loss-scale", 1, "dynamic | none | N (default: dynamic for mixed_float16)"},
    {"seed", 1, "seed of the initial weights and the synthetic data (default 1)"},
    {"json", 1, "write every cell as JSON to this file"},
    {"plot", 1, "draw ms/step against batch size into this PNG (needs gnuplot)"},
    {"profile", 0, "per-kernel time table (GFLOP/s or TFLOP/s, GB/s) and time per layer (cpu, cuda)"},
    {"fusion-disable", 1, "fusion patterns the fused plan leaves out, e.g. attention (mptc ir --help)"},
    {"cpu-time", 0, "time steps in the process's CPU clock (every thread's CPU time: other jobs on a shared machine do not count)"},
    {NULL, 0, NULL},
};

#define BENCH_MAX 16 /* per list: policies, batch sizes */

typedef enum { CELL_OK, CELL_OOM, CELL_FAILED } cell_status;

typedef struct {
    const char *policy;
    long batch;
    int fused;
    cell_status status;
    char reason[256];
    double ms_median, ms_min, ms_max;
    double compile_s;   /* the whole pipeline, with an empty kernel cache */
    double recompile_s; /* the backend compiling the same plan again, from that cache */
    int64_t peak_bytes; /* activations (with reuse) + state + one batch of inputs */
    int64_t activation_bytes, state_bytes, input_bytes;
    int kernels;
    double last_loss;
    char backend[16];
} bench_cell;

typedef struct {
    const char *path;
    const char *device, *loss_scale;
    long steps, warmup;
    uint64_t seed;
    char *policies[BENCH_MAX];
    int n_policies;
    long batches[BENCH_MAX];
    int n_batches;
    int variants[2]; /* 1 fused, 0 unfused, in the order asked */
    int n_variants;
    int profile, tf32;
    long threads;
    unsigned fusion_disable;
    int cpu_time;
} bench_cfg;

/* ---- option lists ------------------------------------------------------------ */

static int split_list(const char *opt, const char *text, char **out, int max) {
    int n = 0;
    const char *p = text;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0) {
            fprintf(stderr, "mptc bench: --%s has an empty item in '%s'\n", opt, text);
            goto bad;
        }
        if (n == max) {
            fprintf(stderr, "mptc bench: --%s lists more than %d items\n", opt, max);
            goto bad;
        }
        out[n++] = strndup(p, len);
        p += len + (e ? 1 : 0);
        if (e && !*p) {
            fprintf(stderr, "mptc bench: --%s ends with a comma: '%s'\n", opt, text);
            goto bad;
        }
    }
    return n;
bad:
    for (int i = 0; i < n; i++) free(out[i]);
    return -1;
}

static int parse_cfg(const mpt_cli *c, bench_cfg *b) {
    char *items[BENCH_MAX];
    const char *pol = mpt_cli_get(c, bench_opts, "policy");
    b->n_policies = split_list("policy", pol ? pol : "float32,mixed_float16,mixed_bfloat16",
                               b->policies, BENCH_MAX);
    if (b->n_policies < 0) return -1;
    for (int i = 0; i < b->n_policies; i++) {
        mpt_policy p;
        if (mpt_policy_lookup(b->policies[i], &p) != 0 || p.variable != MPT_DT_F32) {
            fprintf(stderr, "mptc bench: unknown policy '%s'\n"
                            "  hint: use float32, mixed_float16 or mixed_bfloat16\n",
                    b->policies[i]);
            return -1;
        }
    }
    const char *bs = mpt_cli_get(c, bench_opts, "batch-sizes");
    if (bs) {
        int n = split_list("batch-sizes", bs, items, BENCH_MAX);
        if (n < 0) return -1;
        int rc = 0;
        for (int i = 0; i < n; i++) {
            char *end;
            long v = strtol(items[i], &end, 10);
            if (*end || v < 1) {
                fprintf(stderr, "mptc bench: --batch-sizes wants whole numbers >= 1, got '%s'\n",
                        items[i]);
                rc = -1;
            }
            b->batches[i] = v;
            free(items[i]);
        }
        if (rc) return -1;
        b->n_batches = n;
    }
    const char *cmp = mpt_cli_get(c, bench_opts, "compare");
    int n = split_list("compare", cmp ? cmp : "fused", items, BENCH_MAX);
    if (n < 0) return -1;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        int fused = strcmp(items[i], "fused") == 0 || strcmp(items[i], "xla") == 0;
        int unfused = strcmp(items[i], "unfused") == 0 || strcmp(items[i], "no-xla") == 0;
        if (!fused && !unfused) {
            fprintf(stderr, "mptc bench: --compare wants fused and/or unfused, got '%s'\n", items[i]);
            rc = -1;
        } else if (b->n_variants < 2 && (b->n_variants == 0 || b->variants[0] != fused)) {
            b->variants[b->n_variants++] = fused;
        }
        free(items[i]);
    }
    if (rc) return -1;
    long seed = 1;
    if (mpt_cli_long(c, bench_opts, "steps", 1, &b->steps) ||
        mpt_cli_long(c, bench_opts, "warmup", 0, &b->warmup) ||
        mpt_cli_long(c, bench_opts, "seed", 0, &seed))
        return -1;
    b->seed = (uint64_t)seed;
    b->device = mpt_cli_get(c, bench_opts, "device");
    if (mpt_cli_long(c, bench_opts, "threads", 1, &b->threads)) return -1;
    b->loss_scale = mpt_cli_get(c, bench_opts, "loss-scale");
    b->profile = mpt_cli_has(c, bench_opts, "profile");
    b->tf32 = mpt_cli_has(c, bench_opts, "tf32");
    b->cpu_time = mpt_cli_has(c, bench_opts, "cpu-time");
    char err[256];
    if (mpt_fusion_parse_disable(mpt_cli_get(c, bench_opts, "fusion-disable"), &b->fusion_disable, err,
                                 sizeof err)) {
        fprintf(stderr, "mptc bench: --fusion-disable: %s\n", err);
        return -1;
    }
    return 0;
}

/* ---- one configuration ---------------------------------------------------------- */

static void cell_fail(bench_cell *c, const char *why) {
    /* The first line says what happened; hints are for the whole command. */
    const char *p = why;
    while (*p == ' ' || *p == '\n') p++;
    if (strncmp(p, "mptc: ", 6) == 0) p += 6;
    if (strncmp(p, "error: ", 7) == 0) p += 7;
    size_t len = strcspn(p, "\n");
    if (len >= sizeof c->reason) len = sizeof c->reason - 1;
    memcpy(c->reason, p, len);
    c->reason[len] = 0;
    if (!c->reason[0]) snprintf(c->reason, sizeof c->reason, "unknown error");
    c->status = strstr(c->reason, "out of memory") ? CELL_OOM : CELL_FAILED;
}

/* Bytes the kernel says can still be allocated without swapping, or -1. */
static int64_t host_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    long long kb = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : (int64_t)kb * 1024;
}

static int input_index(const mpt_graph *g, const char *name) {
    int id = mpt_graph_find_input(g, name);
    for (int k = 0; k < mpt_graph_n_inputs(g); k++)
        if (mpt_graph_input_node(g, k) == id) return k;
    return -1;
}

/* The synthetic data spec that fits the train step's feeds: inputs of the
 * model's shape (tokens below the embedding's vocabulary), and labels as
 * the loss wants them (class ids, one-hot or regression targets). */
static void synthetic_spec(const mpt_session *s, long batch, uint64_t seed, char *buf, size_t n) {
    const mpt_graph *g = s->train;
    int yk = input_index(g, "y");
    const mpt_node *y = yk >= 0 ? &g->nodes[mpt_graph_input_node(g, yk)] : NULL;
    int out = mpt_graph_find_output(g, "output");
    int64_t classes = 10;
    if (out >= 0) {
        mpt_shape os = g->nodes[g->outputs[out].node].shape;
        if (os.rank >= 1) classes = os.dim[os.rank - 1];
    }
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "synthetic(shape=[");
    for (int d = 0; d < s->model->input_shape.rank; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", d ? "," : "",
                              (long long)s->model->input_shape.dim[d]);
    /* Two batches, made before timing, so no data work overlaps a step. */
    o += (size_t)snprintf(buf + o, n - o, "], samples=%lld, test_samples=1, seed=%llu",
                          (long long)batch * 2, (unsigned long long)seed);
    if (y && s->topts.loss == MPT_LOSS_MEAN_SQUARED_ERROR && y->shape.rank >= 1) {
        o += (size_t)snprintf(buf + o, n - o, ", targets=[");
        for (int d = 1; d < y->shape.rank; d++)
            o += (size_t)snprintf(buf + o, n - o, "%s%lld", d > 1 ? "," : "", (long long)y->shape.dim[d]);
        if (y->shape.rank == 1) o += (size_t)snprintf(buf + o, n - o, "1");
        o += (size_t)snprintf(buf + o, n - o, "]");
    } else {
        o += (size_t)snprintf(buf + o, n - o, ", classes=%lld", (long long)classes);
        if (y && y->dtype == MPT_DT_I32 && y->shape.rank >= 2) { /* a class at every position */
            o += (size_t)snprintf(buf + o, n - o, ", ids=[");
            for (int d = 1; d < y->shape.rank; d++)
                o += (size_t)snprintf(buf + o, n - o, "%s%lld", d > 1 ? "," : "", (long long)y->shape.dim[d]);
            o += (size_t)snprintf(buf + o, n - o, "]");
        }
    }
    if (s->model->input_dtype == MPT_DT_I32) {
        int64_t vocab = 0;
        for (int i = 0; i < g->n_nodes; i++)
            if (g->nodes[i].op == MPT_OP_GATHER && !vocab)
                vocab = g->nodes[g->nodes[i].in[0]].shape.dim[0];
        o += (size_t)snprintf(buf + o, n - o, ", dtype=i32, vocab=%lld", (long long)(vocab ? vocab : 2));
    }
    snprintf(buf + o, n - o, ")");
}

static void free_tensors(mpt_tensor *t, int n) {
    for (int k = 0; k < n; k++) mpt_tensor_free(&t[k]);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Makes the two input batches; 0, or -1 with the cell marked. */
static int make_batches(const bench_cfg *b, mpt_session *s, bench_cell *c, mpt_tensor *in[2]) {
    const mpt_graph *g = s->train;
    int n_in = mpt_graph_n_inputs(g), xk = input_index(g, "x"), yk = input_index(g, "y");
    char spec[512], err[1024];
    if (xk < 0) {
        cell_fail(c, "the train step has no input 'x'");
        return -1;
    }
    for (int j = 0; j < 2; j++) {
        in[j] = calloc((size_t)n_in + 1, sizeof *in[j]);
        for (int k = 0; k < n_in; k++) {
            const mpt_node *nd = &g->nodes[mpt_graph_input_node(g, k)];
            if (mpt_tensor_alloc(&in[j][k], nd->dtype, nd->shape) != 0) {
                cell_fail(c, "out of memory allocating a batch of inputs");
                return -1;
            }
        }
    }
    synthetic_spec(s, c->batch, b->seed, spec, sizeof spec);
    mpt_dataset *d = NULL;
    if (mpt_session_open_data(s, spec, MPT_DATA_TRAIN, &d, err, sizeof err)) {
        cell_fail(c, err);
        return -1;
    }
    int rc = 0;
    for (int j = 0; j < 2 && !rc; j++)
        if (mpt_data_batch(d, j, c->batch, &in[j][xk], yk >= 0 ? &in[j][yk] : NULL, NULL, err,
                           sizeof err)) {
            cell_fail(c, err);
            rc = -1;
        }
    mpt_data_free(d);
    return rc;
}

/* Checks that the step's memory fits the host before touching it: a batch
 * that cannot fit must be reported, not found out by the kernel's OOM killer. */
static int fits_host(mpt_session *s, bench_cell *c) {
    int64_t host = c->state_bytes + 2 * c->input_bytes;
    /* Backends that run on the host also keep the activations there. */
    if (strcmp(s->backend->name, "cuda") != 0) host += c->activation_bytes;
    int64_t avail = host_available_bytes();
    if (avail < 0 || host <= avail) return 1;
    char need[32], have[32];
    snprintf(c->reason, sizeof c->reason, "out of memory: needs %s, the host has %s available",
             mpt_fmt_bytes(host, need, sizeof need), mpt_fmt_bytes(avail, have, sizeof have));
    c->status = CELL_OOM;
    return 0;
}

/* The compiles of one cell run in a private kernel cache, empty at first,
 * so "cold" is cold whatever earlier runs left in the user's cache and
 * "cached" is the same plan compiled again from that cache. */
typedef struct {
    char dir[64];
    char *saved; /* the user's MPTC_CACHE_DIR, or NULL */
    int on;
} private_cache;

static void private_cache_open(private_cache *pc) {
    memset(pc, 0, sizeof *pc);
    if (!mpt_kcache_enabled()) return;
    snprintf(pc->dir, sizeof pc->dir, "/tmp/mptc-bench-XXXXXX");
    if (!mkdtemp(pc->dir)) return;
    const char *old = getenv("MPTC_CACHE_DIR");
    pc->saved = old ? strdup(old) : NULL;
    setenv("MPTC_CACHE_DIR", pc->dir, 1);
    pc->on = 1;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    return remove(path);
}

static void private_cache_close(private_cache *pc) {
    if (!pc->on) return;
    if (pc->saved) setenv("MPTC_CACHE_DIR", pc->saved, 1);
    else unsetenv("MPTC_CACHE_DIR");
    free(pc->saved);
    nftw(pc->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    pc->on = 0;
}

/* seconds of the step clock: wall, or the process's CPU time */
static double step_clock(const bench_cfg *b) {
    if (!b->cpu_time) return mpt_now();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void cell_run(const bench_cfg *b, bench_cell *c) {
    char *diag_text = NULL, err[1024];
    size_t diag_len = 0;
    FILE *diag = open_memstream(&diag_text, &diag_len);
    mpt_compile_opts o = {.path = b->path, .policy = c->policy, .batch_size = c->batch,
                          .xla = c->fused, .device = b->device, .threads = b->threads,
                          .loss_scale = b->loss_scale, .tf32 = b->tf32,
                          .fusion_disable = b->fusion_disable, .diag = diag ? diag : stderr};
    mpt_session *s = NULL;
    mpt_tensor *in[2] = {NULL, NULL}, *out = NULL;
    int n_in = 0, n_out = 0;
    double *ms = calloc((size_t)b->steps, sizeof *ms);

    /* the CPU and CUDA backends profile the plans compiled while this is set */
    mpt_cpu_profile(b->profile ? stdout : NULL);
    mpt_cuda_profile(b->profile ? stdout : NULL);
    private_cache pc;
    private_cache_open(&pc);
    int rc = mpt_session_open(&o, &s);
    mpt_cpu_profile(NULL);
    mpt_cuda_profile(NULL);
    if (diag) fclose(diag);
    if (rc) {
        private_cache_close(&pc);
        cell_fail(c, diag_text && *diag_text ? diag_text : "the model did not compile");
        goto done;
    }
    snprintf(c->backend, sizeof c->backend, "%s", s->backend->name);
    c->compile_s = s->compile_seconds;
    double t0 = mpt_now();
    mpt_exec *again = s->backend->compile(s->train_plan, err, sizeof err);
    c->recompile_s = mpt_now() - t0;
    if (again) s->backend->free(again);
    private_cache_close(&pc);

    mpt_memory_breakdown mb;
    mpt_plan_memory(s->train_plan, &mb);
    c->activation_bytes = mb.activations;
    c->input_bytes = mb.inputs;
    c->state_bytes = 0;
    for (int k = 0; k < s->n_vars; k++) c->state_bytes += (int64_t)mpt_tensor_bytes(&s->vars[k]);
    c->peak_bytes = c->activation_bytes + c->state_bytes + c->input_bytes;
    c->kernels = s->train_plan->n_kernels;
    if (!fits_host(s, c)) goto done;

    if (mpt_session_init_state(s, b->seed)) {
        cell_fail(c, "cannot initialise the model's variables");
        goto done;
    }
    n_in = mpt_graph_n_inputs(s->train);
    if (make_batches(b, s, c, in)) goto done;
    n_out = s->train->n_outputs;
    out = calloc((size_t)n_out + 1, sizeof *out);
    int loss_k = mpt_graph_find_output(s->train, "loss");
    for (long i = 0; i < b->warmup + b->steps; i++) {
        double ts = step_clock(b);
        /* as training does: the next batch uploads while this step runs */
        if (s->backend->stage_next &&
            s->backend->stage_next(s->train_exec, in[(i + 1) % 2], err, sizeof err) < 0) {
            cell_fail(c, err);
            goto done;
        }
        if (s->backend->run(s->train_exec, in[i % 2], s->vars, out, err, sizeof err)) {
            cell_fail(c, err);
            goto done;
        }
        double dt = 1000 * (step_clock(b) - ts);
        if (i >= b->warmup) ms[i - b->warmup] = dt;
        c->last_loss = loss_k >= 0 ? mpt_tensor_get(&out[loss_k], 0) : NAN;
        free_tensors(out, n_out);
    }
    qsort(ms, (size_t)b->steps, sizeof *ms, cmp_double);
    long h = b->steps / 2;
    c->ms_median = b->steps % 2 ? ms[h] : 0.5 * (ms[h - 1] + ms[h]);
    c->ms_min = ms[0];
    c->ms_max = ms[b->steps - 1];
    c->status = CELL_OK;
done:
    for (int j = 0; j < 2; j++)
        if (in[j]) {
            free_tensors(in[j], n_in);
            free(in[j]);
        }
    free(out);
    free(ms);
    free(diag_text);
    mpt_session_free(s);
}

/* ---- the tables ----------------------------------------------------------------- */

static const char *variant_name(int fused) { return fused ? "fused" : "unfused"; }

static bench_cell *cell_at(bench_cell *cells, const bench_cfg *b, int v, int p, int k) {
    return &cells[((size_t)v * (size_t)b->n_policies + (size_t)p) * (size_t)b->n_batches + (size_t)k];
}

static const bench_cell *find_cell(bench_cell *cells, const bench_cfg *b, int fused,
                                   const char *policy, long batch) {
    for (int v = 0; v < b->n_variants; v++)
        for (int p = 0; p < b->n_policies; p++)
            for (int k = 0; k < b->n_batches; k++) {
                const bench_cell *c = cell_at(cells, b, v, p, k);
                if (c->fused == fused && c->batch == batch && strcmp(c->policy, policy) == 0) return c;
            }
    return NULL;
}

static void cell_text(const bench_cell *c, char *buf, size_t n) {
    switch (c->status) {
    case CELL_OK: snprintf(buf, n, "%.1f", c->ms_median); return;
    case CELL_OOM: snprintf(buf, n, "OOM"); return;
    case CELL_FAILED: snprintf(buf, n, "failed"); return;
    }
}

/* t / u as "1.23x", or "-" when either did not run. */
static void ratio_text(const bench_cell *t, const bench_cell *u, char *buf, size_t n) {
    if (t && u && t->status == CELL_OK && u->status == CELL_OK && u->ms_median > 0)
        snprintf(buf, n, "%.2fx", t->ms_median / u->ms_median);
    else
        snprintf(buf, n, "-");
}

static int has_float32(const bench_cfg *b) {
    for (int p = 0; p < b->n_policies; p++)
        if (strcmp(b->policies[p], "float32") == 0) return 1;
    return 0;
}

static void print_tables(bench_cell *cells, const bench_cfg *b) {
    char t[64];
    int f32 = has_float32(b);
    for (int v = 0; v < b->n_variants; v++) {
        int fused = b->variants[v];
        printf("\n%s (%s): median ms/step\n", variant_name(fused), fused ? "--xla" : "--no-xla");
        printf("%-10s", "batch");
        for (int p = 0; p < b->n_policies; p++) printf(" %16s", b->policies[p]);
        if (f32)
            for (int p = 0; p < b->n_policies; p++)
                if (strcmp(b->policies[p], "float32") != 0) {
                    snprintf(t, sizeof t, "f32/%s", strncmp(b->policies[p], "mixed_", 6) == 0
                                                        ? b->policies[p] + 6 : b->policies[p]);
                    printf(" %16s", t);
                }
        printf("\n");
        for (int k = 0; k < b->n_batches; k++) {
            printf("%-10ld", b->batches[k]);
            for (int p = 0; p < b->n_policies; p++) {
                cell_text(cell_at(cells, b, v, p, k), t, sizeof t);
                printf(" %16s", t);
            }
            if (f32) {
                const bench_cell *base = find_cell(cells, b, fused, "float32", b->batches[k]);
                for (int p = 0; p < b->n_policies; p++)
                    if (strcmp(b->policies[p], "float32") != 0) {
                        ratio_text(base, cell_at(cells, b, v, p, k), t, sizeof t);
                        printf(" %16s", t);
                    }
            }
            printf("\n");
        }
        if (f32 && b->n_policies > 1)
            printf("(f32/P: float32 ms over P's ms; above 1.00x the mixed policy is faster)\n");
    }
    if (b->n_variants == 2) {
        printf("\nunfused/fused: speedup from fusion (above 1.00x the fused plan is faster)\n");
        printf("%-10s", "batch");
        for (int p = 0; p < b->n_policies; p++) printf(" %16s", b->policies[p]);
        printf("\n");
        for (int k = 0; k < b->n_batches; k++) {
            printf("%-10ld", b->batches[k]);
            for (int p = 0; p < b->n_policies; p++) {
                ratio_text(find_cell(cells, b, 0, b->policies[p], b->batches[k]),
                           find_cell(cells, b, 1, b->policies[p], b->batches[k]), t, sizeof t);
                printf(" %16s", t);
            }
            printf("\n");
        }
    }
    printf("\n%-16s %8s %-8s %10s %12s %10s %12s %12s %8s\n", "policy", "batch", "variant",
           "ms/step", "samples/s", "cold", "cached", "peak memory", "kernels");
    for (int v = 0; v < b->n_variants; v++)
        for (int p = 0; p < b->n_policies; p++)
            for (int k = 0; k < b->n_batches; k++) {
                const bench_cell *c = cell_at(cells, b, v, p, k);
                char mem[32];
                printf("%-16s %8ld %-8s ", c->policy, c->batch, variant_name(c->fused));
                if (c->status != CELL_OK) {
                    printf("%s: %s\n", c->status == CELL_OOM ? "OOM" : "failed", c->reason);
                    continue;
                }
                printf("%10.2f %12.1f %9.3fs %11.3fs %12s %8d\n", c->ms_median,
                       1000.0 * (double)c->batch / c->ms_median, c->compile_s, c->recompile_s,
                       mpt_fmt_bytes(c->peak_bytes, mem, sizeof mem), c->kernels);
            }
    printf("(cold: the whole pipeline with an empty kernel cache; cached: the backend "
           "compiling the same plan again, from the kernel cache%s)\n",
           mpt_kcache_enabled() ? "" : ", which MPTC_CACHE=0 turns off here");
}

/* ---- JSON and the plot ----------------------------------------------------------- */

static const char *status_name(cell_status st) {
    switch (st) {
    case CELL_OK: return "ok";
    case CELL_OOM: return "oom";
    case CELL_FAILED: return "failed";
    }
    return "failed";
}

static int write_json(const char *path, bench_cell *cells, int n, const bench_cfg *b,
                      const char *model) {
    cJSON *root = cJSON_CreateObject();
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", localtime(&now));
    cJSON_AddStringToObject(root, "model", model);
    cJSON_AddStringToObject(root, "file", b->path);
    cJSON_AddStringToObject(root, "device", b->device ? b->device : "auto");
    cJSON_AddBoolToObject(root, "tf32", b->tf32);
    /* on CUDA: each step one graph launch, or its kernels one by one
     * (MPTC_CUDA_GRAPHS=0, --profile) */
    const char *graphs = getenv("MPTC_CUDA_GRAPHS");
    cJSON_AddBoolToObject(root, "cuda_graphs", !b->profile && !(graphs && !strcmp(graphs, "0")));
    /* the generated kernels' variants the A/B runs of scripts/gpu_run.sh
     * switch: f16/bf16 Tensor Core instruction, fp32 CUDA-core tile */
    const char *wg = getenv("MPTC_CUDA_WGMMA"), *simt = getenv("MPTC_CUDA_SIMT_TILE");
    cJSON_AddStringToObject(root, "cuda_tensor_core",
                            wg && !strcmp(wg, "1") ? "wgmma" : "mma.sync");
    cJSON_AddStringToObject(root, "cuda_simt_tile", simt && !strcmp(simt, "64") ? "64x64" : "wide");
    cJSON_AddStringToObject(root, "date", date);
    cJSON_AddNumberToObject(root, "steps", (double)b->steps);
    cJSON_AddNumberToObject(root, "warmup", (double)b->warmup);
    cJSON *arr = cJSON_AddArrayToObject(root, "cells");
    for (int i = 0; i < n; i++) {
        const bench_cell *c = &cells[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "policy", c->policy);
        cJSON_AddNumberToObject(o, "batch", (double)c->batch);
        cJSON_AddStringToObject(o, "variant", variant_name(c->fused));
        cJSON_AddStringToObject(o, "status", status_name(c->status));
        if (c->backend[0]) cJSON_AddStringToObject(o, "backend", c->backend);
        if (c->status != CELL_OK) {
            cJSON_AddStringToObject(o, "reason", c->reason);
        } else {
            cJSON_AddNumberToObject(o, "ms_per_step", c->ms_median);
            cJSON_AddNumberToObject(o, "ms_min", c->ms_min);
            cJSON_AddNumberToObject(o, "ms_max", c->ms_max);
            cJSON_AddNumberToObject(o, "samples_per_s", 1000.0 * (double)c->batch / c->ms_median);
            if (isfinite(c->last_loss)) cJSON_AddNumberToObject(o, "last_loss", c->last_loss);
            const bench_cell *f = find_cell(cells, b, c->fused, "float32", c->batch);
            if (f && f->status == CELL_OK)
                cJSON_AddNumberToObject(o, "speedup_vs_float32", f->ms_median / c->ms_median);
            const bench_cell *u = find_cell(cells, b, 0, c->policy, c->batch);
            if (c->fused && u && u->status == CELL_OK)
                cJSON_AddNumberToObject(o, "speedup_vs_unfused", u->ms_median / c->ms_median);
        }
        if (c->backend[0]) {
            cJSON_AddNumberToObject(o, "compile_s", c->compile_s);
            cJSON_AddNumberToObject(o, "recompile_s", c->recompile_s);
            cJSON_AddNumberToObject(o, "peak_bytes", (double)c->peak_bytes);
            cJSON_AddNumberToObject(o, "activation_bytes", (double)c->activation_bytes);
            cJSON_AddNumberToObject(o, "state_bytes", (double)c->state_bytes);
            cJSON_AddNumberToObject(o, "input_bytes", (double)c->input_bytes);
            cJSON_AddNumberToObject(o, "kernels", c->kernels);
        }
        cJSON_AddItemToArray(arr, o);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = fopen(path, "w");
    int rc = 0;
    if (!f || fprintf(f, "%s\n", text) < 0) rc = -1;
    if (f && fclose(f) != 0) rc = -1;
    if (rc) fprintf(stderr, "mptc bench: cannot write %s: %m\n  hint: check the directory exists\n", path);
    free(text);
    return rc;
}

static int on_path(const char *prog) {
    const char *path = getenv("PATH");
    if (!path) return 0;
    char *copy = strdup(path), *save = NULL, full[4096];
    int found = 0;
    for (char *d = strtok_r(copy, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        snprintf(full, sizeof full, "%s/%s", *d ? d : ".", prog);
        found = access(full, X_OK) == 0;
    }
    free(copy);
    return found;
}

/* One line per policy and variant: ms/step against batch size. Returns 0
 * when drawn, 1 when skipped for a missing gnuplot, -1 on failure. */
static int write_plot(const char *png, bench_cell *cells, const bench_cfg *b, const char *model) {
    if (!on_path("gnuplot")) {
        fprintf(stderr, "mptc bench: gnuplot is not installed, so no plot was drawn\n"
                        "  hint: apt-get install gnuplot-nox, or plot the --json output\n");
        return 1;
    }
    if (strpbrk(png, "\"\n\\")) {
        fprintf(stderr, "mptc bench: --plot: the file name must not contain quotes, backslashes or newlines\n");
        return -1;
    }
    FILE *gp = popen("gnuplot", "w");
    if (!gp) {
        fprintf(stderr, "mptc bench: cannot start gnuplot: %m\n");
        return -1;
    }
    fprintf(gp, "set terminal png size 900,560\nset output \"%s\"\n", png);
    fprintf(gp, "set title \"mptc bench %s: median ms per training step\" noenhanced\n", model);
    fprintf(gp, "set xlabel \"batch size\"\nset ylabel \"ms/step\"\nset logscale x 2\n"
                "set key left top noenhanced\nset grid\nset datafile missing \"?\"\n");
    fprintf(gp, "$data << EOD\n");
    for (int k = 0; k < b->n_batches; k++) {
        fprintf(gp, "%ld", b->batches[k]);
        for (int v = 0; v < b->n_variants; v++)
            for (int p = 0; p < b->n_policies; p++) {
                const bench_cell *c = cell_at(cells, b, v, p, k);
                if (c->status == CELL_OK) fprintf(gp, " %.6g", c->ms_median);
                else fprintf(gp, " ?");
            }
        fprintf(gp, "\n");
    }
    fprintf(gp, "EOD\nplot");
    int col = 2;
    for (int v = 0; v < b->n_variants; v++)
        for (int p = 0; p < b->n_policies; p++, col++)
            fprintf(gp, "%s $data using 1:%d with linespoints lw 2 title \"%s %s\"", col > 2 ? "," : "",
                    col, b->policies[p], variant_name(b->variants[v]));
    fprintf(gp, "\n");
    int st = pclose(gp);
    if (st != 0) {
        fprintf(stderr, "mptc bench: gnuplot failed drawing %s (status %d)\n", png, st);
        return -1;
    }
    return 0;
}

/* ---- the command ----------------------------------------------------------------- */

int mpt_cmd_bench(int argc, char **argv) {
    mpt_cli c;
    int prc = mpt_cli_parse(&c, "bench",
                            "time training steps across policies, batch sizes and fused/unfused",
                            bench_opts, argc, argv);
    if (prc) return prc == 1 ? 0 : 2;
    if (!c.pos) {
        fprintf(stderr, "mptc bench: no model file given\n"
                        "  hint: mptc bench examples/mlp_small.mpt --batch-sizes 32,64\n");
        return 2;
    }
    bench_cfg b = {.path = c.pos, .steps = 5, .warmup = 1};
    int status = 2, n_cells = 0;
    bench_cell *cells = NULL;
    mpt_model *m = NULL;
    if (parse_cfg(&c, &b)) goto done;

    /* A file that does not parse fails every cell the same way: say it once,
     * with the front end's own file:line:col diagnostics. */
    mpt_lower_opts lo = {.batch_size = 1, .training = 1};
    status = 1;
    if (mpt_lang_load(b.path, &lo, &m, stderr) != 0) goto done;
    if (b.n_batches == 0) {
        b.batches[0] = m->train.batch_size > 0 ? m->train.batch_size : 32;
        b.n_batches = 1;
    }
    n_cells = b.n_variants * b.n_policies * b.n_batches;
    cells = calloc((size_t)n_cells, sizeof *cells);
    printf("mptc bench %s: %d configurations, %ld warmup + %ld timed steps each, synthetic data%s\n",
           m->name, n_cells, b.warmup, b.steps,
           b.cpu_time ? "; ms/step is the process's CPU time (all threads)" : "");
    int n_ok = 0;
    for (int v = 0; v < b.n_variants; v++)
        for (int p = 0; p < b.n_policies; p++)
            for (int k = 0; k < b.n_batches; k++) {
                bench_cell *cl = cell_at(cells, &b, v, p, k);
                cl->policy = b.policies[p];
                cl->batch = b.batches[k];
                cl->fused = b.variants[v];
                /* with --profile the kernel table comes out on stdout
                 * during the run: the line ends first, and its result
                 * comes on one of its own */
                fprintf(stderr, "  %-16s batch %-8ld %-8s ...%s", cl->policy, cl->batch,
                        variant_name(cl->fused), b.profile ? "\n" : "");
                fflush(stderr);
                cell_run(&b, cl);
                fflush(stdout);
                if (b.profile)
                    fprintf(stderr, "  %-16s batch %-8ld %-8s:", cl->policy, cl->batch,
                            variant_name(cl->fused));
                if (cl->status == CELL_OK) {
                    n_ok++;
                    fprintf(stderr, " %.2f ms/step on %s\n", cl->ms_median, cl->backend);
                } else {
                    fprintf(stderr, " %s: %s\n", cl->status == CELL_OOM ? "OOM" : "failed", cl->reason);
                }
            }
    for (int i = 0; i < n_cells; i++)
        if (cells[i].backend[0]) {
            printf("backend: %s%s\n", cells[i].backend,
                   strcmp(cells[i].backend, "interp") == 0
                       ? " (the reference interpreter: exact but slow; fused and unfused run alike)" : "");
            break;
        }
    print_tables(cells, &b);
    status = 0;
    const char *json = mpt_cli_get(&c, bench_opts, "json");
    if (json && write_json(json, cells, n_cells, &b, m->name)) status = 1;
    const char *png = mpt_cli_get(&c, bench_opts, "plot");
    if (png && write_plot(png, cells, &b, m->name) < 0) status = 1;
    if (n_ok == 0) {
        fprintf(stderr, "mptc bench: no configuration ran (see the reasons above)\n"
                        "  hint: try smaller --batch-sizes or another --device\n");
        status = 1;
    }
done:
    for (int i = 0; i < b.n_policies; i++) free(b.policies[i]);
    free(cells);
    mpt_model_free(m);
    return status;
}
