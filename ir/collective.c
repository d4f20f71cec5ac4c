/* ir/collective.c — the ranks ALLREDUCE reduces across (mpt_collective in
 * ir/ir.h). One process has one set of ranks, so it is process state: the
 * runtime installs its communicator once, before compiling, and every
 * executor (interpreter, CPU, CUDA) reads it when an ALLREDUCE runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

static const mpt_collective one_process = {.rank = 0, .size = 1};
static mpt_collective current = {.rank = 0, .size = 1};

void mpt_collective_set(const mpt_collective *c) { current = c ? *c : one_process; }

const mpt_collective *mpt_collective_get(void) { return &current; }

int mpt_collective_allreduce(void *buf, int64_t n, mpt_dtype dt, char *err, size_t len) {
    if (current.size <= 1 || n == 0) return 0;
    if (dt != MPT_DT_F32 && dt != MPT_DT_F64) {
        snprintf(err, len, "allreduce of %s values: only f32 and f64 are reduced across ranks",
                 mpt_dtype_name(dt));
        return -1;
    }
    if (!current.allreduce_sum) {
        snprintf(err, len, "internal: %d ranks but no allreduce installed", current.size);
        return -1;
    }
    return current.allreduce_sum(current.ctx, buf, n, dt, err, len);
}

int mpt_collective_start(void *buf, int64_t n, mpt_dtype dt, void **req, char *err, size_t len) {
    *req = NULL;
    if (current.size <= 1 || n == 0) return 0;
    if (!current.start || (dt != MPT_DT_F32 && dt != MPT_DT_F64))
        return mpt_collective_allreduce(buf, n, dt, err, len);
    return current.start(current.ctx, buf, n, dt, req, err, len);
}

int mpt_collective_test(void *req, char *err, size_t len) {
    if (!req) return 1;
    return current.test(current.ctx, req, err, len);
}

int mpt_collective_wait(void *req, char *err, size_t len) {
    if (!req) return 0;
    return current.wait(current.ctx, req, err, len);
}

void mpt_collective_rank_slice(const void *in, int64_t n, void *out, int64_t s, mpt_dtype dt) {
    size_t es = mpt_dtype_size(dt);
    int64_t start = (int64_t)current.rank * s, have = n - start;
    if (have > s) have = s;
    if (have < 0) have = 0;
    if (have) memcpy(out, (const char *)in + (size_t)start * es, (size_t)have * es);
    memset((char *)out + (size_t)have * es, 0, (size_t)(s - have) * es);
}

int mpt_collective_reduce_scatter(const void *in, int64_t n, void *out, int64_t s, mpt_dtype dt,
                                  char *err, size_t len) {
    if (current.size <= 1) {
        mpt_collective_rank_slice(in, n, out, s, dt);
        return 0;
    }
    if (!current.reduce_scatter || (dt != MPT_DT_F32 && dt != MPT_DT_F64)) {
        snprintf(err, len, "internal: %d ranks but no reduce_scatter of %s installed", current.size,
                 mpt_dtype_name(dt));
        return -1;
    }
    size_t es = mpt_dtype_size(dt), all = (size_t)current.size * (size_t)s;
    if ((int64_t)all < n) {
        snprintf(err, len, "internal: shards of %lld for %lld values over %d ranks", (long long)s,
                 (long long)n, current.size);
        return -1;
    }
    char *padded = calloc(all, es);
    if (!padded) {
        snprintf(err, len, "out of memory for a reduce_scatter of %lld values", (long long)n);
        return -1;
    }
    memcpy(padded, in, (size_t)n * es);
    int rc = current.reduce_scatter(current.ctx, padded, out, s, dt, err, len);
    free(padded);
    return rc;
}

int mpt_collective_all_gather(const void *in, int64_t s, void *out, int64_t n, mpt_dtype dt,
                              char *err, size_t len) {
    size_t es = mpt_dtype_size(dt);
    if (current.size <= 1) { /* rank 0's shard is all there is */
        int64_t have = s < n ? s : n;
        memcpy(out, in, (size_t)have * es);
        memset((char *)out + (size_t)have * es, 0, (size_t)(n - have) * es);
        return 0;
    }
    if (!current.all_gather || (dt != MPT_DT_F32 && dt != MPT_DT_F64 && dt != MPT_DT_I32)) {
        snprintf(err, len, "internal: %d ranks but no all_gather of %s installed", current.size,
                 mpt_dtype_name(dt));
        return -1;
    }
    size_t all = (size_t)current.size * (size_t)s;
    char *whole = malloc(all * es + 1);
    if (!whole) {
        snprintf(err, len, "out of memory for an all_gather of %lld values", (long long)n);
        return -1;
    }
    int rc = current.all_gather(current.ctx, in, whole, s, dt, err, len);
    if (rc == 0) memcpy(out, whole, (size_t)(n < (int64_t)all ? n : (int64_t)all) * es);
    free(whole);
    return rc;
}
