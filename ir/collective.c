/* ir/collective.c — the ranks ALLREDUCE reduces across (mpt_collective in
 * ir/ir.h). One process has one set of ranks, so it is process state: the
 * runtime installs its communicator once, before compiling, and every
 * executor (interpreter, CPU, CUDA) reads it when an ALLREDUCE runs. */
#include <stdio.h>

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
