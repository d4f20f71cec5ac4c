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
 * The gradients' sums (allreduce) go in buckets (fusion/buckets.c, as the
 * CPU backend's do): a bucket's sums are one NCCL group, which NCCL runs
 * as one launch, started once its last member is final, on a stream of
 * their own, so they overlap the rest of the backward pass:
 *
 *   step's stream:  ... member k: copy in_k -> out_k ... last member:
 *                   copy, record `ready` ... kernels ... wait `done`,
 *                   then the first kernel that reads a member
 *   sums' stream:   wait `ready`, group { allreduce out_k in place, ... },
 *                   record `done`
 *
 * The copy is what lets the sums run late: the memory plan may give a
 * member's input buffer to a kernel after it, but its output buffer is
 * left alone until its first reader. MPTC_OVERLAP=0 issues the groups on
 * the step's stream instead (buckets without overlap), and with
 * --bucket-mb 0 as well each sum is one call at its kernel, in and out.
 * reduce_scatter and all_gather (--shard-optimizer) run at their kernels
 * on the step's stream. Plans with collectives are launched kernel by
 * kernel, not as CUDA graphs: NCCL 2.9+ can be captured, but that has not
 * been run on GPUs here.
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

/* The sums' buckets: which bucket each kernel is a member of, and the
 * stream and events that overlap them (comm NULL: the step's stream) */
struct cuda_buckets {
    mpt_buckets bk;
    int *of;               /* per kernel: its bucket, or -1 */
    mpt_cu_stream comm;
    mpt_cu_event *ready, *done; /* per bucket, with comm */
};

void mpt_cuda_coll_free(mpt_exec *x, const mpt_cu_api *cu) {
    struct cuda_buckets *b = x->buckets;
    if (!b) return;
    for (int i = 0; i < b->bk.n && b->ready; i++) {
        if (b->ready[i]) cu->event_destroy(b->ready[i]);
        if (b->done[i]) cu->event_destroy(b->done[i]);
    }
    if (b->comm) cu->stream_destroy(b->comm);
    mpt_buckets_free(&b->bk);
    free(b->of);
    free(b->ready);
    free(b->done);
    free(b);
    x->buckets = NULL;
}

static int plan_buckets(mpt_exec *x, const mpt_cu_api *cu, int64_t bucket_bytes, char *err,
                        size_t n) {
    const char *ov = getenv("MPTC_OVERLAP");
    int overlap = !(ov && !strcmp(ov, "0")) && cu->stream_wait_event;
    if (bucket_bytes == 0) bucket_bytes = MPT_BUCKET_BYTES_DEFAULT;
    if (bucket_bytes < 0 && !overlap) return 0; /* one call a sum, at its kernel */
    struct cuda_buckets *b = calloc(1, sizeof *b);
    if (!b || mpt_plan_buckets(x->plan, bucket_bytes, &b->bk)) {
        free(b);
        snprintf(err, n, "out of memory");
        return -1;
    }
    x->buckets = b;
    if (b->bk.n == 0) {
        mpt_cuda_coll_free(x, cu);
        return 0;
    }
    b->of = malloc(((size_t)x->plan->n_kernels + 1) * sizeof *b->of);
    if (!b->of) goto oom;
    for (int k = 0; k < x->plan->n_kernels; k++) b->of[k] = -1;
    for (int i = 0; i < b->bk.n; i++)
        for (int m = 0; m < b->bk.b[i].n_members; m++) b->of[b->bk.b[i].members[m]] = i;
    if (!overlap) return 0;
    b->ready = calloc((size_t)b->bk.n, sizeof *b->ready);
    b->done = calloc((size_t)b->bk.n, sizeof *b->done);
    if (!b->ready || !b->done) goto oom;
    MPT_CU_CHECK(cu->stream_create(&b->comm, 0), "");
    /* timing off: these events only order the two streams */
    for (int i = 0; i < b->bk.n; i++) {
        MPT_CU_CHECK(cu->event_create(&b->ready[i], MPT_CU_EVENT_DISABLE_TIMING), "");
        MPT_CU_CHECK(cu->event_create(&b->done[i], MPT_CU_EVENT_DISABLE_TIMING), "");
    }
    return 0;
oom:
    snprintf(err, n, "out of memory");
fail:
    mpt_cuda_coll_free(x, cu);
    return -1;
}

int mpt_cuda_coll_alloc(mpt_exec *x, const mpt_cu_api *cu, int64_t bucket_bytes, char *err,
                        size_t n) {
    if (x->coll_pad_bytes) {
        MPT_CU_CHECK(cu->mem_alloc(&x->coll_pad, (size_t)x->coll_pad_bytes),
                     "the GPU is out of memory: use a smaller --batch-size");
        x->device_bytes += x->coll_pad_bytes;
    }
    return nccl.comm && x->stream ? plan_buckets(x, cu, bucket_bytes, err, n) : 0;
fail:
    x->coll_pad = 0;
    return -1;
}

int mpt_cuda_coll_wait(mpt_exec *x, const mpt_cu_api *cu, int i, char *err, size_t n) {
    const struct cuda_buckets *b = x->buckets;
    if (!b || !b->comm) return 0;
    for (int k = 0; k < b->bk.n; k++)
        if (b->bk.b[k].wait_before == i)
            MPT_CU_CHECK(cu->stream_wait_event(x->stream, b->done[k], 0), "");
    return 0;
fail:
    return -1;
}

static void *ptr(mpt_cu_deviceptr p);

/* Step s, a member of bucket bi: its gradient copied where it is summed;
 * after the last member, the bucket's group of sums. */
static int bucket_member(mpt_exec *x, const mpt_cu_api *cu, const mpt_nccl_api *nc, int ki,
                         int bi, const char *hint, char *err, size_t n) {
    const struct cuda_buckets *b = x->buckets;
    const mpt_bucket *bk = &b->bk.b[bi];
    const mpt_graph *g = x->plan->g;
    const mpt_kernel *K = &x->plan->kernels[ki];
    int out = K->root;
    int64_t count = numel(g, out);
    if (count)
        MPT_CU_CHECK(cu->memcpy_dtod_async(x->buf[out], x->buf[g->nodes[out].in[0]],
                                           (size_t)count * mpt_dtype_size(g->nodes[out].dtype), x->stream),
                     hint);
    if (ki != bk->start_after) return 0;
    mpt_cu_stream st = b->comm ? b->comm : x->stream;
    if (b->comm) {
        MPT_CU_CHECK(cu->event_record(b->ready[bi], x->stream), hint);
        MPT_CU_CHECK(cu->stream_wait_event(b->comm, b->ready[bi], 0), hint);
    }
    MPT_NCCL_CHECK(nc->group_start(), hint);
    for (int m = 0; m < bk->n_members; m++) {
        int o = x->plan->kernels[bk->members[m]].root;
        if (numel(g, o))
            MPT_NCCL_CHECK(nc->all_reduce(ptr(x->buf[o]), ptr(x->buf[o]), (size_t)numel(g, o),
                                          MPT_NCCL_FLOAT32, MPT_NCCL_SUM, nccl.comm, st), hint);
    }
    MPT_NCCL_CHECK(nc->group_end(), hint);
    if (b->comm) MPT_CU_CHECK(cu->event_record(b->done[bi], b->comm), hint);
    return 0;
fail:
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
    int bi = x->buckets ? x->buckets->of[s - x->steps] : -1;
    if (bi >= 0) return bucket_member(x, cu, nc, (int)(s - x->steps), bi, hint, err, n);
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
