/* runtime/cuda/cuda_nccl.c — data-parallel ranks on CUDA: the process's
 * NCCL communicator, and a plan's collective kernels (ir/ops.def's
 * COLLECTIVE ops) as NCCL calls and device copies on the step's stream.
 *
 * A rank computes on one GPU, its local rank's (modulo the host's
 * devices), and NCCL sums between the GPUs, as Horovod and PyTorch DDP do:
 * MPI (runtime/dist/) starts the ranks and carries rank 0's NCCL id to the
 * others, NCCL moves the gradients. The ops keep ir/collective.c's
 * meaning, over a communicator of c ranks with this process as rank r:
 *
 *   allreduce       out[n] = the sum of every rank's in[n]       ncclAllReduce
 *   reduce_scatter  out[s] = shard r of that sum, in[n] read as the padded
 *                   [c * s] (zeros past n)                       ncclReduceScatter
 *   all_gather      out[n] = every rank's in[s] in rank order, cut at n
 *                   (zeros past c * s)                           ncclAllGather
 *   rank_slice      out[s] = in[r * s, r * s + s), zeros past n  device copies
 *
 * Where n is not c * s, the padded [c * s] value lives in one region of the
 * plan's (coll_pad), which the collectives share since they run one after
 * another on the stream. In one process (c = 1, r = 0) the same calls give
 * ir/collective.c's one-process values: the sum is the value itself, the
 * shard is the first s values.
 *
 * The collectives run on the step's stream between its kernels, so a sum
 * waits for the kernel before it and the kernels after it wait for the
 * sum: no overlap with the backward pass yet (the CPU backend's sums
 * overlap it; on CUDA that wants a stream of their own and events). Plans
 * with collectives are launched kernel by kernel, not as CUDA graphs:
 * NCCL 2.9+ can be captured, but that has not been run on GPUs here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/cuda_impl.h"

/* The communicator: one a process, as the ranks are (mpt_collective, ir/ir.h) */
static struct {
    mpt_nccl_comm comm;
    int rank, size;
    mpt_cu_device dev;
    mpt_cu_context ctx; /* the device's primary context, held while joined */
} nccl;

int mpt_cuda_nccl_joined(int *rank, int *size) {
    if (rank) *rank = nccl.comm ? nccl.rank : 0;
    if (size) *size = nccl.comm ? nccl.size : 1;
    return nccl.comm != NULL;
}

int mpt_cuda_nccl_join(int rank, int size, int local_rank, mpt_cuda_bcast_fn bcast, char *err,
                       size_t n) {
    if (nccl.comm) {
        if (nccl.rank == rank && nccl.size == size) return 0;
        snprintf(err, n, "internal: joining NCCL as rank %d of %d, already rank %d of %d", rank,
                 size, nccl.rank, nccl.size);
        return -1;
    }
    char why[512];
    const mpt_nccl_api *nc = mpt_cuda_nccl(why, sizeof why);
    if (!nc) {
        snprintf(err, n, "data-parallel CUDA ranks sum their gradients through NCCL, which cannot "
                 "be loaded: %s\n  hint: install NCCL 2 (Debian's libnccl2, or the CUDA "
                 "toolkit's), add its directory to LD_LIBRARY_PATH or name the file in "
                 "MPTC_LIBNCCL; or train the ranks on the CPUs with --device cpu", why);
        return -1;
    }
    const mpt_cu_api *cu = mpt_cuda_driver(0, err, n);
    if (!cu) return -1;
    mpt_cuda_device_info d;
    int count = mpt_cuda_devices(&d, 1, why, sizeof why);
    if (count <= 0) {
        snprintf(err, n, "rank %d has no CUDA device: %s\n  hint: --device cpu", rank, why);
        return -1;
    }
    /* modulo: ranks that each see only their own GPU (CUDA_VISIBLE_DEVICES
     * set per rank) all take their device 0 */
    int ordinal = local_rank % count;
    char hint[256];
    snprintf(hint, sizeof hint, "NCCL_DEBUG=INFO says why; NCCL needs a GPU for each rank, and "
             "rank %d (local rank %d) took device %d of the %d this host shows it", rank,
             local_rank, ordinal, count);
    mpt_cuda_set_device(ordinal);
    MPT_CU_CHECK(cu->device_get(&nccl.dev, ordinal), "check nvidia-smi");
    MPT_CU_CHECK(cu->primary_ctx_retain(&nccl.ctx, nccl.dev), "another process may own the GPU");
    /* NCCL runs on the context current on this thread */
    MPT_CU_CHECK(cu->ctx_set_current(nccl.ctx), "");
    mpt_nccl_unique_id id;
    memset(&id, 0, sizeof id);
    if (rank == 0)
        MPT_NCCL_CHECK(nc->get_unique_id(&id), "NCCL_DEBUG=INFO says why (a network interface "
                       "NCCL can use: NCCL_SOCKET_IFNAME)");
    if (bcast(&id, (int64_t)sizeof id, err, n)) goto fail;
    MPT_NCCL_CHECK(nc->comm_init_rank(&nccl.comm, size, id, rank), hint);
    nccl.rank = rank;
    nccl.size = size;
    return 0;
fail:
    nccl.comm = NULL;
    if (nccl.ctx) cu->primary_ctx_release(nccl.dev);
    nccl.ctx = NULL;
    return -1;
}

void mpt_cuda_nccl_leave(void) {
    if (!nccl.comm) return;
    const mpt_nccl_api *nc = mpt_cuda_nccl(NULL, 0);
    const mpt_cu_api *cu = mpt_cuda_driver(0, NULL, 0);
    if (!nc || !cu) return;
    nc->comm_destroy(nccl.comm);
    cu->primary_ctx_release(nccl.dev);
    memset(&nccl, 0, sizeof nccl);
}

static int64_t numel(const mpt_graph *g, int id) { return mpt_shape_numel(g->nodes[id].shape); }

/* the bytes of the [c * s] padded value step ki needs, 0 where n = c * s */
static int64_t pad_bytes(const mpt_graph *g, const mpt_kernel *K) {
    const mpt_node *nd = &g->nodes[K->root];
    int64_t s, whole, es = (int64_t)mpt_dtype_size(nd->dtype);
    if (nd->op == MPT_OP_REDUCE_SCATTER) s = numel(g, K->root), whole = numel(g, nd->in[0]);
    else if (nd->op == MPT_OP_ALL_GATHER) s = numel(g, nd->in[0]), whole = numel(g, K->root);
    else return 0;
    /* fewer ranks than shards (one process running a plan of several):
     * NCCL reads or writes the first c * s values in place */
    return (int64_t)nccl.size * s > whole ? (int64_t)nccl.size * s * es : 0;
}

int mpt_cuda_coll_prepare(mpt_exec *x, const mpt_cu_api *cu, cuda_step *s, int ki, char *err,
                          size_t n) {
    const mpt_plan *p = x->plan;
    const mpt_kernel *K = &p->kernels[ki];
    const mpt_node *nd = &p->g->nodes[K->root];
    mpt_dtype dt = nd->dtype;
    const mpt_collective *c = mpt_collective_get();
    if (K->n_nodes != 1 || nd->n_in != 1) {
        snprintf(err, n, "internal: kernel %s fuses %d ops into its %s", K->name, K->n_nodes,
                 mpt_op_name(nd->op));
        return -1;
    }
    if (!nccl.comm) {
        snprintf(err, n, "kernel %s: the plan's %s runs across ranks, but this process has "
                 "joined no NCCL communicator\n  hint: data-parallel CUDA ranks are started "
                 "by mpirun -np N mptc train ...", K->name, mpt_op_name(nd->op));
        return -1;
    }
    /* the rank the plan's random draws were generated for (emit.c) is
     * the one whose shards NCCL hands over */
    if ((c->rank != nccl.rank || c->size != nccl.size)) {
        snprintf(err, n, "internal: kernel %s: NCCL's rank %d of %d is not the ranks' %d of %d",
                 K->name, nccl.rank, nccl.size, c->rank, c->size);
        return -1;
    }
    int ok = dt == MPT_DT_F32 || nd->op == MPT_OP_RANK_SLICE ||
             (nd->op == MPT_OP_ALL_GATHER && dt == MPT_DT_I32);
    if (!ok) {
        snprintf(err, n, "kernel %s: a %s of %s values: NCCL's sums here are of f32 (and "
                 "all_gather's of i32)", K->name, mpt_op_name(nd->op), mpt_dtype_name(dt));
        return -1;
    }
    if (!x->stream || !cu->memcpy_dtod_async) {
        snprintf(err, n, "kernel %s: the CUDA driver lacks streams or cuMemcpyDtoDAsync, which "
                 "NCCL's calls need\n  hint: update the NVIDIA driver", K->name);
        return -1;
    }
    s->coll = 1;
    s->src.params = malloc(2 * sizeof *s->src.params);
    if (!s->src.params) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    s->src.params[0] = nd->in[0];
    s->src.params[1] = K->root;
    s->src.n_params = 2;
    s->src.n_inputs = 1;
    int64_t pad = pad_bytes(p->g, K);
    if (pad > x->coll_pad_bytes) x->coll_pad_bytes = pad;
    x->graphs = 0;
    return 0;
}

int mpt_cuda_coll_alloc(mpt_exec *x, const mpt_cu_api *cu, char *err, size_t n) {
    if (!x->coll_pad_bytes) return 0;
    MPT_CU_CHECK(cu->mem_alloc(&x->coll_pad, (size_t)x->coll_pad_bytes),
                 "the GPU is out of memory: use a smaller --batch-size");
    x->device_bytes += x->coll_pad_bytes;
    return 0;
fail:
    x->coll_pad = 0;
    return -1;
}

static void *ptr(mpt_cu_deviceptr p) { return (void *)(uintptr_t)p; }

int mpt_cuda_coll_launch(mpt_exec *x, const mpt_cu_api *cu, const cuda_step *s, char *err,
                         size_t n) {
    const mpt_graph *g = x->plan->g;
    const mpt_kernel *K = &x->plan->kernels[s - x->steps];
    const mpt_node *nd = &g->nodes[K->root];
    const mpt_nccl_api *nc = mpt_cuda_nccl(err, n);
    int in = nd->in[0], out = K->root;
    int64_t es = (int64_t)mpt_dtype_size(nd->dtype);
    int dt = nd->dtype == MPT_DT_I32 ? MPT_NCCL_INT32 : MPT_NCCL_FLOAT32;
    mpt_cu_deviceptr a = x->buf[in], b = x->buf[out];
    mpt_cu_stream st = x->stream;
    char hint[400];
    snprintf(hint, sizeof hint, "kernel %d %s across %d ranks; NCCL_DEBUG=INFO says more",
             (int)(s - x->steps), K->name, nccl.size);
    if (nd->op == MPT_OP_RANK_SLICE) {
        int64_t sh = numel(g, out), whole = numel(g, in), start = (int64_t)nccl.rank * sh;
        int64_t have = whole - start < sh ? whole - start : sh;
        if (have < 0) have = 0;
        if (have)
            MPT_CU_CHECK(cu->memcpy_dtod_async(b, a + (mpt_cu_deviceptr)(start * es),
                                               (size_t)(have * es), st), hint);
        if (sh > have)
            MPT_CU_CHECK(cu->memset_d8_async(b + (mpt_cu_deviceptr)(have * es), 0,
                                             (size_t)((sh - have) * es), st), hint);
        return 0;
    }
    if (!nc) return -1;
    if (nd->op == MPT_OP_ALLREDUCE) {
        if (numel(g, out))
            MPT_NCCL_CHECK(nc->all_reduce(ptr(a), ptr(b), (size_t)numel(g, out), dt, MPT_NCCL_SUM,
                                          nccl.comm, st), hint);
        return 0;
    }
    int padded = pad_bytes(g, K) > 0;
    if (nd->op == MPT_OP_REDUCE_SCATTER) {
        int64_t sh = numel(g, out), whole = numel(g, in);
        if (padded) { /* in[n], then zeros to c * s */
            MPT_CU_CHECK(cu->memcpy_dtod_async(x->coll_pad, a, (size_t)(whole * es), st), hint);
            MPT_CU_CHECK(cu->memset_d8_async(x->coll_pad + (mpt_cu_deviceptr)(whole * es), 0,
                                             (size_t)((nccl.size * sh - whole) * es), st), hint);
            a = x->coll_pad;
        }
        MPT_NCCL_CHECK(nc->reduce_scatter(ptr(a), ptr(b), (size_t)sh, dt, MPT_NCCL_SUM, nccl.comm,
                                          st), hint);
        return 0;
    }
    /* all_gather: [c * s] gathered, cut at n or followed by zeros to n */
    int64_t sh = numel(g, in), whole = numel(g, out), got = (int64_t)nccl.size * sh;
    MPT_NCCL_CHECK(nc->all_gather(ptr(a), ptr(padded ? x->coll_pad : b), (size_t)sh, dt,
                                  nccl.comm, st), hint);
    if (padded)
        MPT_CU_CHECK(cu->memcpy_dtod_async(b, x->coll_pad, (size_t)(whole * es), st), hint);
    else if (got < whole)
        MPT_CU_CHECK(cu->memset_d8_async(b + (mpt_cu_deviceptr)(got * es), 0,
                                         (size_t)((whole - got) * es), st), hint);
    return 0;
fail:
    return -1;
}
