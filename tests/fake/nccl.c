/* tests/fake/nccl.c — a recording NCCL for the tests of the CUDA backend's
 * data-parallel host side, built into libfakecuda.so beside the recording
 * driver (tests/fake/cuda.c) and named by MPTC_LIBNCCL.
 *
 * Device memory is the driver's host memory. A collective is checked when
 * called and computed when its stream's order says it has run
 * (tests/fake/streams.c: before the stream's next work, at a wait on an
 * event recorded after it, at a synchronisation), so a reader that does
 * not wait for it reads the buffer from before. A communicator of c ranks
 * stands in for c ranks that all hold this process's values (the stand-in
 * of tests/test_dist.c, `twice`, for any c): ncclAllReduce writes c times the value, ncclReduceScatter c times
 * shard `rank` of its [c * count] input, ncclAllGather c copies of its
 * shard. Every call is logged for the test (fake_nccl_log) and checked as
 * the real library would fail it, or worse: buffers in live device
 * allocations, a stream, a communicator this library made, and no stream
 * capture on (mptc launches plans with collectives kernel by kernel).
 * ncclCommInitRank takes only an id ncclGetUniqueId made and records the
 * device of the current context (fake_nccl_state).
 *
 *   FAKE_NCCL_FAIL=N   the N-th collective call (from 1) fails with
 *                      ncclUnhandledCudaError
 *   FAKE_NCCL_LOG=FILE each ncclCommInitRank appends "rank R of C device D
 *                      id HEX" to FILE (tests/cuda_nccl.t.sh: several
 *                      processes under mpirun must hold rank 0's id)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake.h"

/* from tests/fake/cuda.c and tests/fake/streams.c */
int fake_cuda_valid(unsigned long long p, size_t bytes);
int fake_cuda_capturing(void);
void fake_cuda_bad_call(void);
fake_cuda_counts fake_cuda_stats(void);

enum { SUCCESS = 0, UNHANDLED_CUDA_ERROR = 1, INVALID_ARGUMENT = 4, INVALID_USAGE = 5 };
enum { INT32 = 2, FLOAT32 = 7, SUM = 0 };

typedef struct { int rank, nranks; } comm;

static fake_nccl_state S;
static fake_nccl_call *calls;
static int n_calls, n_collectives;
static const char magic[] = "mptc fake nccl id ";

int fake_nccl_log(const fake_nccl_call **out) {
    *out = calls;
    return n_calls;
}
fake_nccl_state fake_nccl_state_get(void) { return S; }

int ncclGetVersion(int *v) {
    *v = 22800; /* 2.28.0 */
    return SUCCESS;
}

const char *ncclGetErrorString(int r) {
    return r == UNHANDLED_CUDA_ERROR ? "unhandled cuda error (test NCCL)"
           : r == INVALID_ARGUMENT   ? "invalid argument (test NCCL)"
                                     : "an error of the test NCCL";
}

int ncclGetUniqueId(void *id) {
    char *p = id;
    memset(p, 0, 128);
    /* the maker's process in it: an id a rank made for itself differs */
    snprintf(p, 128, "%s%d.%lld", magic, (int)getpid(), ++S.unique_ids);
    return SUCCESS;
}

/* ncclUniqueId is 128 bytes passed by value */
typedef struct { char internal[128]; } unique_id;

static int fail(int r) {
    S.failed++;
    fake_cuda_bad_call();
    return r;
}

int ncclCommInitRank(void **out, int nranks, unique_id id, int rank) {
    if (!out || nranks < 1 || rank < 0 || rank >= nranks) return fail(INVALID_ARGUMENT);
    if (strncmp(id.internal, magic, sizeof magic - 1) != 0) return fail(INVALID_ARGUMENT);
    comm *c = malloc(sizeof *c);
    *c = (comm){rank, nranks};
    *out = c;
    S.rank = rank;
    S.nranks = nranks;
    S.device = fake_cuda_stats().current_device;
    memcpy(S.id, id.internal, sizeof S.id);
    S.inits++;
    const char *log = getenv("FAKE_NCCL_LOG");
    FILE *f = log ? fopen(log, "a") : NULL;
    if (f) {
        fprintf(f, "rank %d of %d device %d id ", rank, nranks, S.device);
        for (int i = 0; i < 128; i++) fprintf(f, "%02x", (unsigned char)id.internal[i]);
        fprintf(f, "\n");
        fclose(f);
    }
    return SUCCESS;
}

int ncclCommDestroy(void *c) {
    if (!c) return fail(INVALID_ARGUMENT);
    free(c);
    S.destroys++;
    return SUCCESS;
}

/* logs the call, then checks it; the element size of dtype, or 0 */
static size_t start(int op, const void *send, void *recv, size_t count, int dtype, int redop,
                    void *c, void *stream) {
    calls = realloc(calls, (size_t)(n_calls + 1) * sizeof *calls);
    calls[n_calls++] = (fake_nccl_call){op, (uintptr_t)send, (uintptr_t)recv, count, dtype,
                                        redop, c, stream};
    n_collectives++;
    const char *f = getenv("FAKE_NCCL_FAIL");
    if (f && atoi(f) == n_collectives) return 0;
    if (!c || !stream || fake_cuda_capturing()) return 0;
    if (dtype != FLOAT32 && !(op == FAKE_NCCL_ALL_GATHER && dtype == INT32)) return 0;
    if (op != FAKE_NCCL_ALL_GATHER && redop != SUM) return 0;
    return 4;
}

/* ---- the queue: a call runs when its stream's order says it has
 * (tests/fake/streams.c), so a reader that does not wait for it reads
 * the buffer as it was before ---- */
typedef struct {
    fake_nccl_call c;
    long long nth; /* on its stream, from 1 */
    int done;
} queued;
static queued *q;
static int n_q;
static struct { void *s; long long n; } per_stream[16]; /* calls ever queued there */

static long long *queued_on(void *s) {
    int i = 0;
    while (i < 16 && per_stream[i].s != s) i++;
    for (int k = 0; i == 16 && k < 16; k++) /* a new stream: a free slot */
        if (!per_stream[k].s || per_stream[k].s == &per_stream[k]) i = k;
    if (i == 16) abort();
    per_stream[i].s = s;
    return &per_stream[i].n;
}
long long fake_nccl_queued(void *s) { return *queued_on(s); }
void fake_nccl_forget(void *s) {
    for (int i = 0; i < 16; i++)
        if (per_stream[i].s == s) per_stream[i].s = &per_stream[i], per_stream[i].n = 0;
}

static void compute(const fake_nccl_call *k) {
    const comm *cm = k->comm;
    const float *send = (const float *)(uintptr_t)k->send;
    float *recv = (float *)(uintptr_t)k->recv;
    size_t count = k->count, es = 4;
    if (k->op == FAKE_NCCL_ALL_REDUCE)
        for (size_t i = 0; i < count; i++) recv[i] = (float)cm->nranks * send[i];
    else if (k->op == FAKE_NCCL_REDUCE_SCATTER)
        for (size_t i = 0; i < count; i++) recv[i] = (float)cm->nranks * send[(size_t)cm->rank * count + i];
    else
        for (int r = 0; r < cm->nranks; r++)
            memcpy((char *)recv + (size_t)r * count * es, send, count * es);
}

void fake_nccl_run(void *s, long long upto) {
    for (int i = 0; i < n_q; i++) {
        if (q[i].done || q[i].c.stream != s || (upto >= 0 && q[i].nth > upto)) continue;
        compute(&q[i].c);
        q[i].done = 1;
    }
    int keep = 0; /* the finished ones leave the queue */
    for (int i = 0; i < n_q; i++)
        if (!q[i].done) q[keep++] = q[i];
    n_q = keep;
}

/* queued after its checks: the buffers it reads must be ready on its
 * stream (a copy on another stream into them waited for) */
static int enqueue(void *send, size_t bytes) {
    const fake_nccl_call *k = &calls[n_calls - 1];
    if (!fake_stream_ready(k->stream, (uintptr_t)send, bytes)) return fail(INVALID_USAGE);
    q = realloc(q, (size_t)(n_q + 1) * sizeof *q);
    q[n_q++] = (queued){*k, ++*queued_on(k->stream), 0};
    return SUCCESS;
}

int ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, void *c,
                  void *stream) {
    size_t es = start(FAKE_NCCL_ALL_REDUCE, send, recv, count, dtype, op, c, stream);
    if (!es) return fail(UNHANDLED_CUDA_ERROR);
    if (!fake_cuda_valid((uintptr_t)send, count * es) || !fake_cuda_valid((uintptr_t)recv, count * es))
        return fail(INVALID_ARGUMENT);
    return enqueue((void *)send, count * es);
}

int ncclReduceScatter(const void *send, void *recv, size_t count, int dtype, int op, void *c,
                      void *stream) {
    size_t es = start(FAKE_NCCL_REDUCE_SCATTER, send, recv, count, dtype, op, c, stream);
    if (!es) return fail(UNHANDLED_CUDA_ERROR);
    const comm *cm = c;
    /* the send and receive buffers may overlap only as NCCL's in-place
     * form does (recv = send + rank * count), which mptc does not use */
    const char *s0 = send, *r0 = recv;
    size_t all = (size_t)cm->nranks * count * es;
    if (!fake_cuda_valid((uintptr_t)send, all) || !fake_cuda_valid((uintptr_t)recv, count * es) ||
        (r0 < s0 + all && s0 < r0 + count * es))
        return fail(INVALID_ARGUMENT);
    return enqueue((void *)send, all);
}

int ncclAllGather(const void *send, void *recv, size_t count, int dtype, void *c, void *stream) {
    size_t es = start(FAKE_NCCL_ALL_GATHER, send, recv, count, dtype, -1, c, stream);
    if (!es) return fail(UNHANDLED_CUDA_ERROR);
    const comm *cm = c;
    const char *s0 = send, *r0 = recv;
    size_t all = (size_t)cm->nranks * count * es;
    if (!fake_cuda_valid((uintptr_t)send, count * es) || !fake_cuda_valid((uintptr_t)recv, all) ||
        (r0 < s0 + count * es && s0 < r0 + all))
        return fail(INVALID_ARGUMENT);
    return enqueue((void *)send, count * es);
}

/* A group's calls are one launch in NCCL; here they are logged between
 * the two markers and run as the queue says. Unbalanced ends are bad. */
static int depth;
static int group_mark(int op) {
    calls = realloc(calls, (size_t)(n_calls + 1) * sizeof *calls);
    calls[n_calls++] = (fake_nccl_call){.op = op, .redop = -1};
    return SUCCESS;
}
int ncclGroupStart(void) {
    depth++;
    return group_mark(FAKE_NCCL_GROUP_START);
}
int ncclGroupEnd(void) {
    if (depth == 0) return fail(INVALID_USAGE);
    depth--;
    return group_mark(FAKE_NCCL_GROUP_END);
}
