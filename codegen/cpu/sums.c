/* codegen/cpu/sums.c — the CPU backend's side of data parallelism: a
 * plan's ALLREDUCE kernels sent in buckets (mpt_plan_buckets), each bucket
 * one non-blocking sum across the ranks (mpt_collective_start) started
 * once its last member has run, and finished before the first kernel that
 * reads any member. A bucket of several gradients is staged in a buffer of
 * its own (one copy in, one copy out); a bucket of one is summed in the
 * member's own output buffer. Between kernels the oldest sum in flight is
 * let to progress: MPI moves a non-blocking collective on only inside its
 * calls. */
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/emit.h"

struct mpt_cpu_sums {
    mpt_buckets buckets;
    int n_kernels;
    int *bucket_of;   /* per kernel: its bucket, or -1 */
    int64_t *offset;  /* per kernel: its bytes' offset in its bucket's staging */
    char **staging;   /* per bucket: the members side by side, or NULL (one member) */
    void **req;       /* per bucket: the sum in flight */
    char *started;    /* per bucket: started and not yet finished */
};

void mpt_cpu_sums_free(mpt_cpu_sums *s) {
    if (!s) return;
    for (int b = 0; b < s->buckets.n; b++) free(s->staging[b]);
    mpt_buckets_free(&s->buckets);
    free(s->bucket_of);
    free(s->offset);
    free(s->staging);
    free(s->req);
    free(s->started);
    free(s);
}

int mpt_cpu_sums_new(const mpt_plan *p, int64_t bucket_bytes, mpt_cpu_sums **out) {
    *out = NULL;
    mpt_cpu_sums *s = calloc(1, sizeof *s);
    if (!s || mpt_plan_buckets(p, bucket_bytes, &s->buckets)) goto oom;
    if (s->buckets.n == 0) { /* one process's plan: nothing to do */
        mpt_cpu_sums_free(s);
        return 0;
    }
    size_t nk = (size_t)p->n_kernels + 1, nb = (size_t)s->buckets.n + 1;
    s->n_kernels = p->n_kernels;
    s->bucket_of = malloc(nk * sizeof *s->bucket_of);
    s->offset = calloc(nk, sizeof *s->offset);
    s->staging = calloc(nb, sizeof *s->staging);
    s->req = calloc(nb, sizeof *s->req);
    s->started = calloc(nb, 1);
    if (!s->bucket_of || !s->offset || !s->staging || !s->req || !s->started) goto oom;
    for (int k = 0; k < p->n_kernels; k++) s->bucket_of[k] = -1;
    for (int b = 0; b < s->buckets.n; b++) {
        const mpt_bucket *bk = &s->buckets.b[b];
        int64_t at = 0;
        for (int m = 0; m < bk->n_members; m++) {
            int k = bk->members[m];
            const mpt_node *nd = &p->g->nodes[p->kernels[k].root];
            s->bucket_of[k] = b;
            s->offset[k] = at;
            at += mpt_shape_numel(nd->shape) * (int64_t)mpt_dtype_size(nd->dtype);
        }
        if (bk->n_members > 1 && !(s->staging[b] = malloc((size_t)at + 64))) goto oom;
    }
    *out = s;
    return 0;
oom:
    mpt_cpu_sums_free(s);
    return -1;
}

int mpt_cpu_sums_member(const mpt_cpu_sums *s, int k) { return s && s->bucket_of[k] >= 0; }

static size_t value_bytes(const mpt_graph *g, const mpt_cpu_kx *x) {
    const mpt_node *nd = &g->nodes[x->k->root];
    return (size_t)mpt_shape_numel(nd->shape) * mpt_dtype_size(nd->dtype);
}

int mpt_cpu_sums_run(mpt_cpu_sums *s, const mpt_graph *g, mpt_cpu_kx *kx, int k, char *err,
                     size_t n) {
    int b = s->bucket_of[k];
    const mpt_bucket *bk = &s->buckets.b[b];
    void *in, *out;
    if (mpt_cpu_allreduce_slots(g, &kx[k], &in, &out, err, n)) return -1;
    void *dst = s->staging[b] ? s->staging[b] + s->offset[k] : out;
    if (dst != in) memcpy(dst, in, value_bytes(g, &kx[k]));
    if (k != bk->start_after) return 0;
    const mpt_node *nd = &g->nodes[kx[k].k->root];
    int64_t count = (int64_t)(bk->bytes / (int64_t)mpt_dtype_size(nd->dtype));
    if (mpt_collective_start(s->staging[b] ? (void *)s->staging[b] : out, count, nd->dtype,
                             &s->req[b], err, n))
        return -1;
    s->started[b] = 1;
    return 0;
}

int mpt_cpu_sums_before(mpt_cpu_sums *s, const mpt_graph *g, mpt_cpu_kx *kx, int k, double *prof,
                        char *err, size_t n) {
    for (int b = 0; b < s->buckets.n; b++) {
        const mpt_bucket *bk = &s->buckets.b[b];
        if (!s->started[b] || (k < s->n_kernels && bk->wait_before != k)) continue;
        double t0 = prof ? mpt_now() : 0;
        int rc = mpt_collective_wait(s->req[b], err, n);
        s->req[b] = NULL;
        s->started[b] = 0;
        for (int m = 0; rc == 0 && s->staging[b] && m < bk->n_members; m++) {
            int mk = bk->members[m];
            void *in, *out;
            if (mpt_cpu_allreduce_slots(g, &kx[mk], &in, &out, err, n)) return -1;
            memcpy(out, s->staging[b] + s->offset[mk], value_bytes(g, &kx[mk]));
        }
        /* the wait is the bucket's time, shown on its last member */
        if (prof) prof[bk->start_after] += mpt_now() - t0;
        if (rc) return -1;
    }
    return 0;
}

int mpt_cpu_sums_progress(mpt_cpu_sums *s, char *err, size_t n) {
    for (int b = 0; b < s->buckets.n; b++) {
        if (!s->started[b] || !s->req[b]) continue;
        int done = mpt_collective_test(s->req[b], err, n);
        if (done < 0) return -1;
        if (done) s->req[b] = NULL; /* finished: the wait is then nothing */
        return 0;
    }
    return 0;
}
