/* runtime/dist/dist.h — data parallelism across processes (runtime/dist/):
 * `mpirun -np N mptc train ...` runs N ranks of one plan. MPI launches the
 * ranks and reduces between them; mptc loads it (libmptc_mpi.so, built
 * from mpi_shim.c against the host's MPI) only when a launcher started it
 * with more than one rank, so a plain `mptc` needs no MPI at run time.
 * The gradients' sum is an IR op (ALLREDUCE, ir/train.c); this folder
 * installs the communicator it reduces over (mpt_collective, ir/ir.h).
 * The folder's whole public surface. */
#ifndef MPT_RUNTIME_DIST_H
#define MPT_RUNTIME_DIST_H

#include <stddef.h>
#include <stdint.h>

/* The ranks an MPI launcher (mpirun, mpiexec) said this process is one
 * of: OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_SIZE; 1 without one. */
int mpt_dist_launched_size(void);
/* Joins the run: with a launcher's size > 1, loads libmptc_mpi.so,
 * initialises MPI and installs the collective; otherwise nothing (one
 * process, size 1). 0, or -1 with a message and a hint in err. */
int mpt_dist_init(char *err, size_t n);
int mpt_dist_rank(void);       /* 0 in one process */
int mpt_dist_size(void);       /* 1 in one process */
int mpt_dist_local_rank(void); /* among the ranks of this host */
/* the MPI library's own name and version ("" in one process) */
const char *mpt_dist_mpi_version(void);
/* bytes at buf made rank 0's on every rank. 0, or -1 with err. */
int mpt_dist_bcast(void *buf, int64_t bytes, char *err, size_t n);
/* n f32 values at buf replaced by their mean over the ranks (unchanged in
 * one process). 0, or -1 with err. */
int mpt_dist_mean_f32(float *buf, int64_t n, char *err, size_t len);
/* every rank's v must equal rank 0's: 0, or -1 with err naming each rank
 * whose `what` differs */
int mpt_dist_same(uint64_t v, const char *what, char *err, size_t n);
/* the largest v of every rank (v itself in one process), so the ranks
 * decide together (a signal one rank caught stops all after the same
 * step); -1 when the ranks cannot be reached */
int mpt_dist_max(int v);
/* ends every rank with this exit status (MPI_Abort): a rank that failed
 * must not leave the others waiting in a reduction */
void mpt_dist_abort(int code);
void mpt_dist_finalize(void);

/* FNV-1a over bytes, to compare plans and state across ranks */
uint64_t mpt_dist_hash(uint64_t h, const void *p, size_t n);
#define MPT_DIST_HASH_INIT 1469598103934665603ULL

#endif
