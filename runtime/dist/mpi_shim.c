/* runtime/dist/mpi_shim.c — libmptc_mpi.so: the MPI calls of a
 * data-parallel run (mpi_shim.h), the only code built against mpi.h. The
 * Makefile builds it with mpicc where MPI is installed; mptc dlopens it
 * under mpirun (runtime/dist/dist.c). Every call returns MPI's error text
 * instead of aborting: the world communicator's handler is
 * MPI_ERRORS_RETURN. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime/dist/mpi_shim_impl.h"

static int failed(int rc, const char *what, char *err, size_t n) {
    if (rc == MPI_SUCCESS) return 0;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "error %d", rc);
    snprintf(err, n, "%s: %s", what, text);
    return -1;
}

static int shim_init(int *rank, int *size, int *local_rank, char *err, size_t n) {
    int provided = 0, rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (failed(rc, "MPI_Init_thread", err, n)) return -1;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (failed(MPI_Comm_rank(MPI_COMM_WORLD, rank), "MPI_Comm_rank", err, n) ||
        failed(MPI_Comm_size(MPI_COMM_WORLD, size), "MPI_Comm_size", err, n))
        return -1;
    MPI_Comm node;
    if (failed(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, *rank, MPI_INFO_NULL,
                                   &node), "MPI_Comm_split_type", err, n))
        return -1;
    rc = MPI_Comm_rank(node, local_rank);
    MPI_Comm_free(&node);
    return failed(rc, "MPI_Comm_rank", err, n);
}

static int shim_allreduce_sum(void *buf, int64_t n, int f64, char *err, size_t len) {
    size_t es = f64 ? sizeof(double) : sizeof(float);
    for (int64_t at = 0; at < n;) { /* counts are ints: in chunks */
        int64_t c = n - at > INT_MAX / 2 ? INT_MAX / 2 : n - at;
        int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + (size_t)at * es, (int)c,
                               f64 ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (failed(rc, "MPI_Allreduce", err, len)) return -1;
        at += c;
    }
    return 0;
}

static int shim_iallreduce_sum(void *buf, int64_t n, int f64, void **req, char *err, size_t len) {
    *req = NULL;
    if (n > INT_MAX / 2) return shim_allreduce_sum(buf, n, f64, err, len);
    MPI_Request *r = malloc(sizeof *r);
    if (!r) return shim_allreduce_sum(buf, n, f64, err, len);
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, f64 ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM,
                            MPI_COMM_WORLD, r);
    if (failed(rc, "MPI_Iallreduce", err, len)) {
        free(r);
        return -1;
    }
    *req = r;
    return 0;
}

static int shim_test(void *req, int *done, char *err, size_t len) {
    *done = 0;
    int rc = MPI_Test((MPI_Request *)req, done, MPI_STATUS_IGNORE);
    if (failed(rc, "MPI_Test", err, len)) return -1;
    if (*done) free(req);
    return 0;
}

static int shim_wait(void *req, char *err, size_t len) {
    int rc = MPI_Wait((MPI_Request *)req, MPI_STATUS_IGNORE);
    free(req);
    return failed(rc, "MPI_Wait", err, len);
}

static int shim_reduce_scatter(const void *in, void *out, int64_t s, int f64, char *err,
                               size_t len) {
    if (s > INT_MAX) {
        snprintf(err, len, "MPI_Reduce_scatter_block: a shard of %lld values", (long long)s);
        return -1;
    }
    return failed(MPI_Reduce_scatter_block(in, out, (int)s, f64 ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM,
                                           MPI_COMM_WORLD),
                  "MPI_Reduce_scatter_block", err, len);
}

static int shim_all_gather(const void *in, void *out, int64_t s, int type, char *err, size_t len) {
    if (s > INT_MAX) {
        snprintf(err, len, "MPI_Allgather: a shard of %lld values", (long long)s);
        return -1;
    }
    MPI_Datatype t = type == 2 ? MPI_INT : type == 1 ? MPI_DOUBLE : MPI_FLOAT;
    return failed(MPI_Allgather(in, (int)s, t, out, (int)s, t, MPI_COMM_WORLD), "MPI_Allgather",
                  err, len);
}

static int shim_allreduce_max_int(int *v, char *err, size_t len) {
    return failed(MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD),
                  "MPI_Allreduce", err, len);
}

static int shim_bcast(void *buf, int64_t bytes, int root, char *err, size_t len) {
    for (int64_t at = 0; at < bytes;) {
        int64_t c = bytes - at > INT_MAX / 2 ? INT_MAX / 2 : bytes - at;
        int rc = MPI_Bcast((char *)buf + at, (int)c, MPI_BYTE, root, MPI_COMM_WORLD);
        if (failed(rc, "MPI_Bcast", err, len)) return -1;
        at += c;
    }
    return 0;
}

static int shim_allgather_u64(uint64_t v, uint64_t *all, char *err, size_t len) {
    return failed(MPI_Allgather(&v, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD),
                  "MPI_Allgather", err, len);
}

static void shim_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

static void shim_finalize(void) {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
}

static void shim_version(char *buf, size_t n) {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(v, &len) != MPI_SUCCESS) len = 0;
    v[len < (int)sizeof v ? len : (int)sizeof v - 1] = 0;
    for (char *p = v; *p; p++) /* the first line */
        if (*p == '\n' || *p == ',') *p = 0;
    snprintf(buf, n, "%s", v);
}

static const mpt_mpi_shim shim = {
    .abi = MPT_MPI_SHIM_ABI,
    .init = shim_init,
    .allreduce_sum = shim_allreduce_sum,
    .iallreduce_sum = shim_iallreduce_sum,
    .test = shim_test,
    .wait = shim_wait,
    .reduce_scatter = shim_reduce_scatter,
    .all_gather = shim_all_gather,
    .allreduce_max_int = shim_allreduce_max_int,
    .bcast = shim_bcast,
    .allgather_u64 = shim_allgather_u64,
    .abort = shim_abort,
    .finalize = shim_finalize,
    .version = shim_version,
};

const mpt_mpi_shim *mptc_mpi_shim(void) { return &shim; }
