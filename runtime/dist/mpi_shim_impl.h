/* runtime/dist/mpi_shim_impl.h — the table of MPI calls mptc makes, between
 * runtime/dist/dist.c and libmptc_mpi.so (mpi_shim.c, the one file built
 * with mpicc). mptc loads the library with dlopen only when mpirun started
 * it, so one binary runs without MPI installed. Bump MPT_MPI_SHIM_ABI
 * when the table changes. */
#ifndef MPT_RUNTIME_DIST_MPI_SHIM_IMPL_H
#define MPT_RUNTIME_DIST_MPI_SHIM_IMPL_H

#include <stddef.h>
#include <stdint.h>

#define MPT_MPI_SHIM_ABI 4

typedef struct {
    int abi; /* MPT_MPI_SHIM_ABI */
    /* MPI_Init_thread (funneled) and the world communicator, with errors
     * returned rather than fatal; this process's rank, the world's size and
     * the rank among the ranks of this host */
    int (*init)(int *rank, int *size, int *local_rank, char *err, size_t n);
    /* in-place MPI_SUM of n floats (f64 = 0) or doubles (f64 = 1) */
    int (*allreduce_sum)(void *buf, int64_t n, int f64, char *err, size_t len);
    /* the same without blocking (MPI_Iallreduce): *req to test and wait
     * on (NULL when it finished at once: a sum past INT_MAX / 2 values
     * runs blocking, in chunks) */
    int (*iallreduce_sum)(void *buf, int64_t n, int f64, void **req, char *err, size_t len);
    int (*test)(void *req, int *done, char *err, size_t len); /* frees req when done */
    int (*wait)(void *req, char *err, size_t len);            /* frees req */
    /* MPI_Reduce_scatter_block (MPI_SUM) of in[size * s] into out[s], and
     * MPI_Allgather of in[s] into out[size * s] (type: 0 float, 1 double,
     * 2 int); s below INT_MAX */
    int (*reduce_scatter)(const void *in, void *out, int64_t s, int f64, char *err, size_t len);
    int (*all_gather)(const void *in, void *out, int64_t s, int type, char *err, size_t len);
    /* in-place MPI_MAX of one int */
    int (*allreduce_max_int)(int *v, char *err, size_t len);
    int (*bcast)(void *buf, int64_t bytes, int root, char *err, size_t len);
    /* every rank's v into all[size] */
    int (*allgather_u64)(uint64_t v, uint64_t *all, char *err, size_t len);
    void (*abort)(int code);
    void (*finalize)(void);
    /* "Open MPI v4.1.4, ..." (MPI_Get_library_version) */
    void (*version)(char *buf, size_t n);
} mpt_mpi_shim;

/* the library's one symbol */
const mpt_mpi_shim *mptc_mpi_shim(void);

#endif
