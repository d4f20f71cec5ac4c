/* tests/test_kcache.c — the CPU backend's kernel cache (codegen/cpu/jit.c,
 * codegen/kcache.c): a first compile of a train step fills an empty cache,
 * a second compile of the same plan loads every module from it and computes
 * the same bits, an entry cut short, altered or copied from another name is
 * compiled afresh, and MPTC_CACHE=0 leaves the cache alone. */
#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/cpu/cpu_backend.h"
#include "codegen/cpu/cpu_internal.h"
#include "fusion/fusion.h"
#include "ir/ir.h"
#include "lang/lang.h"
#include "tests/check.h"

static char cache_dir[64];

static int count_entries(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/cpu", cache_dir);
    DIR *d = opendir(path);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strlen(e->d_name) > 2 && !strcmp(e->d_name + strlen(e->d_name) - 2, ".o");
    closedir(d);
    return n;
}

enum { CUT, ALTER, COPY };

/* Damages the first entry found (by name order, so the same one each
 * time): CUT to half its size; ALTER one byte in its middle, the size
 * kept (code or a constant changed); COPY the next entry over it (a valid
 * object of another name). 1 when done. */
static int damage_one(int how) {
    char path[128], file[400], other[400];
    snprintf(path, sizeof path, "%s/cpu", cache_dir);
    struct dirent **names = NULL;
    int n = scandir(path, &names, NULL, alphasort), done = 0, first = -1;
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] == '.') continue;
        if (first < 0) {
            first = i;
            continue;
        }
        if (how != COPY) break;
        snprintf(other, sizeof other, "%s/%s", path, names[i]->d_name);
        break;
    }
    if (first >= 0) {
        snprintf(file, sizeof file, "%s/%s", path, names[first]->d_name);
        struct stat st;
        if (how == CUT && stat(file, &st) == 0) done = truncate(file, st.st_size / 2) == 0;
        if (how == ALTER && stat(file, &st) == 0) {
            FILE *f = fopen(file, "r+b");
            if (f && fseek(f, st.st_size / 2, SEEK_SET) == 0) {
                int c = fgetc(f);
                fseek(f, st.st_size / 2, SEEK_SET);
                done = c != EOF && fputc(c ^ 0x40, f) != EOF;
            }
            if (f) fclose(f);
        }
        if (how == COPY && n > 2) {
            char cmd[900];
            snprintf(cmd, sizeof cmd, "cp '%s' '%s'", other, file);
            done = system(cmd) == 0;
        }
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return done;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    return remove(path);
}

/* the step's outputs and new variables after one step from fixed values,
 * as one byte string */
static char *run_once(const mpt_plan *p, size_t *len, int *hits, int *misses) {
    const mpt_graph *g = p->g;
    char err[512];
    int h0, m0, h1, m1;
    mpt_cpu_kcache_stats(&h0, &m0);
    mpt_exec *x = mpt_backend_cpu.compile(p, err, sizeof err);
    mpt_cpu_kcache_stats(&h1, &m1);
    *hits = h1 - h0;
    *misses = m1 - m0;
    CHECK_MSG(x != NULL, "compile: %s", err);
    if (!x) return NULL;
    int ni = mpt_graph_n_inputs(g), nv = mpt_graph_n_variables(g), no = g->n_outputs;
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in), *vars = calloc((size_t)nv + 1, sizeof *vars);
    mpt_tensor *out = calloc((size_t)no + 1, sizeof *out);
    for (int k = 0; k < ni; k++) {
        const mpt_node *nd = &g->nodes[mpt_graph_input_node(g, k)];
        mpt_tensor_alloc(&in[k], nd->dtype, nd->shape);
        int64_t n = mpt_shape_numel(nd->shape);
        for (int64_t i = 0; i < n; i++)
            mpt_tensor_set(&in[k], i, nd->dtype == MPT_DT_I32 ? (double)(i % 10) : 0.01 * (double)(i % 97) - 0.4);
    }
    mpt_init_variables(g, vars, 7);
    int rc = mpt_backend_cpu.run(x, in, vars, out, err, sizeof err);
    CHECK_MSG(rc == 0, "run: %s", err);
    char *bytes = NULL;
    FILE *f = open_memstream(&bytes, len);
    for (int k = 0; rc == 0 && k < no; k++) fwrite(out[k].data, 1, mpt_tensor_bytes(&out[k]), f);
    for (int k = 0; k < nv; k++) fwrite(vars[k].data, 1, mpt_tensor_bytes(&vars[k]), f);
    fclose(f);
    for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    for (int k = 0; k < nv; k++) mpt_tensor_free(&vars[k]);
    for (int k = 0; rc == 0 && k < no; k++) mpt_tensor_free(&out[k]);
    free(in);
    free(vars);
    free(out);
    mpt_backend_cpu.free(x);
    return bytes;
}

static void remove_cache(void) { nftw(cache_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

int main(void) {
    char why[256];
    if (!mpt_backend_cpu.available(why, sizeof why)) {
        printf("skip: %s\n", why);
        return 0;
    }
    snprintf(cache_dir, sizeof cache_dir, "/tmp/mptc-kcache-test-XXXXXX");
    if (!mkdtemp(cache_dir)) return 1;
    atexit(remove_cache);
    setenv("MPTC_CACHE_DIR", cache_dir, 1);
    unsetenv("MPTC_CACHE");

    mpt_lower_opts lo = {.batch_size = 4, .training = 1};
    mpt_model *m = NULL;
    FILE *diag = fopen("/dev/null", "w");
    int bad = mpt_lang_load("tests/models/resblock.mpt", &lo, &m, diag);
    fclose(diag);
    CHECK_MSG(bad == 0, "tests/models/resblock.mpt does not load");
    if (bad) return check_exit("test_kcache");
    char err[512];
    mpt_policy_opts po = {0};
    mpt_policy_lookup("mixed_bfloat16", &po.global);
    mpt_graph *typed = mpt_policy_apply(m->graph, &po, err, sizeof err);
    mpt_train_opts to = {.loss = m->train.loss, .opt = m->train.optimizer,
                         .loss_scale = m->train.loss_scale, .metrics = {.accuracy = 1}};
    to.loss_scale.mode = MPT_LS_NONE;
    mpt_graph *step = typed ? mpt_train_step(typed, &to, err, sizeof err) : NULL;
    CHECK_MSG(step != NULL, "train step: %s", err);
    if (!step) return check_exit("test_kcache");
    mpt_fusion_opts fo;
    mpt_fusion_opts_default(&fo);
    mpt_plan *p = mpt_fuse(step, &fo);

    size_t len1 = 0, len2 = 0, len3 = 0, len4 = 0;
    int hits, misses;
    char *cold = run_once(p, &len1, &hits, &misses);
    int entries = count_entries();
    CHECK_MSG(hits == 0 && misses > 0, "empty cache: %d hits, %d misses", hits, misses);
    CHECK_MSG(entries == misses, "%d modules compiled, %d cache entries", misses, entries);
    int first_misses = misses;

    char *warm = run_once(p, &len2, &hits, &misses);
    CHECK_MSG(hits == first_misses && misses == 0, "warm cache: %d hits (want %d), %d misses",
              hits, first_misses, misses);
    CHECK_MSG(cold && warm && len1 == len2 && memcmp(cold, warm, len1) == 0,
              "a step from cached kernels differs from the compiled ones");

    /* an entry cut short, one with a byte changed, one that is another
     * entry's valid object: each compiled afresh (and replaced), the step
     * the same bits */
    char *mended = NULL;
    const char *hows[] = {"cut short", "altered", "copied from another"};
    for (int how = CUT; how <= COPY; how++) {
        CHECK_MSG(damage_one(how), "no cache entry to damage (%s)", hows[how]);
        free(mended);
        mended = run_once(p, &len3, &hits, &misses);
        CHECK_MSG(hits == first_misses - 1 && misses == 1,
                  "one entry %s: %d hits, %d misses (want %d, 1)", hows[how], hits, misses,
                  first_misses - 1);
        CHECK_MSG(mended && len3 == len1 && memcmp(cold, mended, len1) == 0,
                  "the step after an entry %s differs", hows[how]);
    }

    /* MPTC_CACHE=0: compiled every time, nothing counted or written */
    nftw(cache_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    setenv("MPTC_CACHE", "0", 1);
    char *off = run_once(p, &len4, &hits, &misses);
    CHECK_MSG(hits == 0 && misses == 0 && count_entries() == 0,
              "MPTC_CACHE=0: %d hits, %d misses, %d entries", hits, misses, count_entries());
    CHECK_MSG(off && len4 == len1 && memcmp(cold, off, len1) == 0, "the step without the cache differs");
    unsetenv("MPTC_CACHE");
    printf("train step of tests/models/resblock.mpt: %d modules, all cached on the second compile\n",
           first_misses);

    free(cold);
    free(warm);
    free(mended);
    free(off);
    mpt_plan_free(p);
    mpt_graph_free(step);
    mpt_graph_free(typed);
    mpt_model_free(m);
    return check_exit("test_kcache");
}
