/* runtime/dist/dist.c — joining a data-parallel run: finding and loading
 * libmptc_mpi.so, MPI's initialisation, and the communicator ALLREDUCE
 * sums over (mpt_collective, ir/ir.h). See dist.h. */
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ir/ir.h"
#include "runtime/dist/dist.h"
#include "runtime/dist/mpi_shim_impl.h"

static const mpt_mpi_shim *mpi;
static int my_rank, my_size = 1, my_local;
static char mpi_version[128];

int mpt_dist_launched_size(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) {
            long n = strtol(v, NULL, 10);
            if (n > 0 && n < INT_MAX) return (int)n;
        }
    }
    return 1;
}

int mpt_dist_rank(void) { return my_rank; }
int mpt_dist_size(void) { return my_size; }
int mpt_dist_local_rank(void) { return my_local; }
const char *mpt_dist_mpi_version(void) { return mpi_version; }

static int collective_sum(void *ctx, void *buf, int64_t n, mpt_dtype dt, char *err, size_t len) {
    (void)ctx;
    return mpi->allreduce_sum(buf, n, dt == MPT_DT_F64, err, len);
}

static int collective_start(void *ctx, void *buf, int64_t n, mpt_dtype dt, void **req, char *err,
                            size_t len) {
    (void)ctx;
    return mpi->iallreduce_sum(buf, n, dt == MPT_DT_F64, req, err, len);
}

static int collective_test(void *ctx, void *req, char *err, size_t len) {
    (void)ctx;
    int done = 0;
    return mpi->test(req, &done, err, len) ? -1 : done;
}

static int collective_wait(void *ctx, void *req, char *err, size_t len) {
    (void)ctx;
    return mpi->wait(req, err, len);
}

static int collective_reduce_scatter(void *ctx, const void *in, void *out, int64_t s, mpt_dtype dt,
                                    char *err, size_t len) {
    (void)ctx;
    return mpi->reduce_scatter(in, out, s, dt == MPT_DT_F64, err, len);
}

static int collective_all_gather(void *ctx, const void *in, void *out, int64_t s, mpt_dtype dt,
                                 char *err, size_t len) {
    (void)ctx;
    return mpi->all_gather(in, out, s, dt == MPT_DT_I32 ? 2 : dt == MPT_DT_F64, err, len);
}

/* MPTC_MPI_SHIM, else lib/ beside the executable or beside its folder
 * (build/mptc and build/tests/test_* find build/lib/) */
static void *open_shim(char *tried, size_t n) {
    const char *env = getenv("MPTC_MPI_SHIM");
    if (env && *env) {
        snprintf(tried, n, "%s", env);
        return dlopen(env, RTLD_NOW | RTLD_GLOBAL);
    }
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        snprintf(tried, n, "libmptc_mpi.so");
        return dlopen("libmptc_mpi.so", RTLD_NOW | RTLD_GLOBAL);
    }
    exe[len] = 0;
    char *dir = dirname(exe);
    static const char *const rel[] = {"lib", "../lib"};
    tried[0] = 0;
    for (size_t i = 0; i < 2; i++) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/%s/libmptc_mpi.so", dir, rel[i]);
        size_t used = strlen(tried);
        snprintf(tried + used, n - used, "%s%s", used ? ", " : "", path);
        /* RTLD_GLOBAL: Open MPI's own plugins resolve libmpi's symbols */
        void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
        if (h) return h;
    }
    return NULL;
}

int mpt_dist_init(char *err, size_t n) {
    int launched = mpt_dist_launched_size();
    if (launched <= 1 || mpi) return 0;
    char tried[2 * PATH_MAX + 64];
    void *h = open_shim(tried, sizeof tried);
    if (!h) {
        snprintf(err, n, "started by mpirun with %d ranks, but MPI cannot be loaded (%s: %s)\n"
                 "  hint: mptc's MPI support is built where MPI is installed: apt-get install "
                 "openmpi-bin libopenmpi-dev, then make", launched, tried, dlerror());
        return -1;
    }
    const mpt_mpi_shim *(*get)(void) = (const mpt_mpi_shim *(*)(void))dlsym(h, "mptc_mpi_shim");
    const mpt_mpi_shim *s = get ? get() : NULL;
    if (!s || s->abi != MPT_MPI_SHIM_ABI) {
        snprintf(err, n, "%s is not this mptc's MPI library (ABI %d, want %d)\n  hint: rebuild "
                 "with make", tried, s ? s->abi : -1, MPT_MPI_SHIM_ABI);
        return -1;
    }
    if (s->init(&my_rank, &my_size, &my_local, err, n) != 0) return -1;
    mpi = s;
    s->version(mpi_version, sizeof mpi_version);
    mpt_collective c = {.rank = my_rank, .size = my_size, .allreduce_sum = collective_sum,
                        .reduce_scatter = collective_reduce_scatter,
                        .all_gather = collective_all_gather};
    /* MPTC_OVERLAP=0: every sum blocking, where its kernel runs (to
     * measure what the overlap gains) */
    const char *ov = getenv("MPTC_OVERLAP");
    if (!(ov && !strcmp(ov, "0"))) {
        c.start = collective_start;
        c.test = collective_test;
        c.wait = collective_wait;
    }
    mpt_collective_set(&c);
    return 0;
}

int mpt_dist_bcast(void *buf, int64_t bytes, char *err, size_t n) {
    if (!mpi || my_size <= 1) return 0;
    return mpi->bcast(buf, bytes, 0, err, n);
}

int mpt_dist_mean_f32(float *buf, int64_t n, char *err, size_t len) {
    if (!mpi || my_size <= 1) return 0;
    if (mpi->allreduce_sum(buf, n, 0, err, len) != 0) return -1;
    for (int64_t i = 0; i < n; i++) buf[i] /= (float)my_size;
    return 0;
}

int mpt_dist_same(uint64_t v, const char *what, char *err, size_t n) {
    if (!mpi || my_size <= 1) return 0;
    uint64_t *all = calloc((size_t)my_size, sizeof *all);
    if (!all) {
        snprintf(err, n, "out of memory comparing the ranks' %s", what);
        return -1;
    }
    int rc = mpi->allgather_u64(v, all, err, n);
    if (rc == 0) {
        size_t used = 0;
        for (int r = 1; r < my_size; r++) {
            if (all[r] == all[0]) continue;
            if (!used) used = (size_t)snprintf(err, n, "rank %d's %s differs from rank 0's", r, what);
            else if (used < n) used += (size_t)snprintf(err + used, n - used, "; so does rank %d's", r);
            rc = -1;
        }
    }
    free(all);
    return rc;
}

int mpt_dist_max(int v) {
    if (!mpi || my_size <= 1) return v;
    char err[256];
    if (mpi->allreduce_max_int(&v, err, sizeof err) != 0) return -1;
    return v;
}

void mpt_dist_abort(int code) {
    if (mpi && my_size > 1) mpi->abort(code);
}

void mpt_dist_finalize(void) {
    if (!mpi) return;
    mpt_collective_set(NULL);
    mpi->finalize();
    mpi = NULL;
}

uint64_t mpt_dist_hash(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ULL;
    }
    return h;
}
