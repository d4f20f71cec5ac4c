/* tests/fake/streams.c — the recording driver's order between streams.
 *
 * The driver (tests/fake/cuda.c) runs kernels and copies at once, in the
 * order they are issued, which is one order the real device may choose.
 * NCCL calls (tests/fake/nccl.c) are the exception: they are queued on
 * their stream and run only when an order requires it:
 *   - before the next work issued on the same stream (stream order);
 *   - when another stream waits on an event recorded after them
 *     (cuStreamWaitEvent);
 *   - at any synchronisation (cuCtxSynchronize, cuEventSynchronize, a
 *     synchronous copy, which waits for every blocking stream).
 * So a step that reads a sum on another stream without waiting for it
 * reads the value from before the sum, and the test's comparison with the
 * interpreter fails: the late side of the race is the one the fake takes.
 * The early side is checked instead of run: an NCCL call that reads a
 * buffer copied into on another stream must come after a wait on an event
 * recorded after that copy (fake_stream_ready), else it is a bad call.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fake.h"

enum { MAX_STREAMS = 16 };

typedef unsigned long long devptr;

/* from tests/fake/nccl.c: runs the calls queued on stream s, the first
 * `upto` ever queued there (-1: all) */
void fake_nccl_run(void *s, long long upto);
long long fake_nccl_queued(void *s);
void fake_nccl_forget(void *s);

typedef struct {
    void *s;
    long long last;                /* the sequence number of its latest work */
    long long waited[MAX_STREAMS]; /* per other stream: the latest work it waited for */
} stream;

typedef struct {
    devptr dst;
    size_t bytes;
    int stream;
    long long seq;
} write_rec;

static stream streams[MAX_STREAMS];
static int n_streams;
static long long seq;
static write_rec *writes;
static int n_writes;

/* the stream's index (NULL: the legacy default stream, index 0) */
static int index_of(void *s) {
    for (int i = 0; i < n_streams; i++)
        if (streams[i].s == s) return i;
    for (int i = 0; i < n_streams; i++) /* a destroyed stream's slot */
        if (streams[i].s == (void *)&streams[i]) {
            streams[i].s = s;
            return i;
        }
    if (n_streams == MAX_STREAMS) abort();
    memset(&streams[n_streams], 0, sizeof streams[n_streams]);
    streams[n_streams].s = s;
    return n_streams++;
}

/* work issued on s: what NCCL queued there runs first */
void fake_stream_work(void *s) {
    fake_nccl_run(s, -1);
    streams[index_of(s)].last = ++seq;
}

/* a copy or memset into [dst, dst + bytes) issued on s */
void fake_stream_write(void *s, devptr dst, size_t bytes) {
    fake_stream_work(s);
    writes = realloc(writes, (size_t)(n_writes + 1) * sizeof *writes);
    writes[n_writes++] = (write_rec){dst, bytes, index_of(s), seq};
}

void fake_stream_record(fake_mark *m, void *s) {
    int i = index_of(s);
    *m = (fake_mark){i, streams[i].last, fake_nccl_queued(s)};
}

void fake_stream_wait(void *s, const fake_mark *m) {
    fake_nccl_run(streams[m->stream].s, m->nccl);
    int i = index_of(s);
    if (m->seq > streams[i].waited[m->stream]) streams[i].waited[m->stream] = m->seq;
    for (int k = 0; k < n_streams; k++) /* and what that stream had waited for */
        if (streams[m->stream].waited[k] > streams[i].waited[k])
            streams[i].waited[k] = streams[m->stream].waited[k];
}

/* a stream destroyed: its work runs, and its slot is free (an address
 * malloc gives again is another stream) */
void fake_stream_forget(void *s) {
    fake_nccl_run(s, -1);
    fake_nccl_forget(s);
    for (int i = 0; i < n_streams; i++) {
        if (streams[i].s != s) continue;
        streams[i].s = (void *)&streams[i]; /* never a live stream's address */
        streams[i].last = 0;
        for (int k = 0; k < n_streams; k++) streams[k].waited[i] = 0;
        memset(streams[i].waited, 0, sizeof streams[i].waited);
        for (int w = 0; w < n_writes; w++)
            if (writes[w].stream == i) writes[w--] = writes[--n_writes];
    }
}

/* everything issued so far has finished */
void fake_stream_sync(void) {
    for (int i = 0; i < n_streams; i++) fake_nccl_run(streams[i].s, -1);
    n_writes = 0;
}

/* 1 when work on s may read [p, p + bytes): every copy into it issued on
 * another stream since the last synchronisation is one s waited for */
int fake_stream_ready(void *s, devptr p, size_t bytes) {
    int i = index_of(s);
    for (int w = 0; w < n_writes; w++) {
        const write_rec *r = &writes[w];
        if (r->stream == i || r->dst >= p + bytes || p >= r->dst + r->bytes) continue;
        if (streams[i].waited[r->stream] < r->seq) return 0;
    }
    return 1;
}
