/* codegen/cpu/opaque_index.c — the OPAQUE kernels that index: scatter_add
 * (an embedding's gradient) and argmax (an accuracy metric), as C over the
 * pool, bit-identical to the interpreter (ir/interp_ops.c).
 *
 * scatter_add sums in double in the order of the updates and rounds once,
 * as the interpreter does; a task owns a range of columns of the table, so
 * the order of every sum is the updates' whatever the threads, and no two
 * tasks write one element. The operands are read in their own dtype:
 * widening both to double first, then the table, took 0.85 ms of a 2-thread
 * gpt_tiny step at context 512 for a [2048, 128] gradient into [256, 128].
 *
 * argmax is the first maximum, NaN never winning (a NaN is never greater),
 * f16/bf16 widened exactly; a task is a block of rows. For f32 rows with
 * the axis last (the usual logits), the maximum of the row comes first, in
 * 16 lanes that vectorize, then the first index holding it: the same
 * answer as the scalar scan, since the first maximum holds the largest
 * value and no NaN passes `>`.
 */
#include <stdlib.h>

#include "codegen/cpu/emit.h"

/* ---- scatter_add: out [rows, d] = sum over r of b[r, :] into row ids[r] ---- */

enum { SA_COLS = 16 }; /* columns a task: 128 bytes of double, a cache line pair */

typedef struct {
    const int64_t *row; /* the table row of each update, -1 where dropped */
    int64_t m, d;
    mpt_tensor b, out;
    double *acc; /* [rows, d] */
    int64_t rows;
} sa_job;

static void sa_task(void *ctx, int task, int thread) {
    (void)thread;
    const sa_job *j = ctx;
    int64_t c0 = (int64_t)task * SA_COLS, c1 = c0 + SA_COLS < j->d ? c0 + SA_COLS : j->d;
    for (int64_t r = 0; r < j->rows; r++)
        for (int64_t k = c0; k < c1; k++) j->acc[r * j->d + k] = 0;
    const float *bf = j->b.dtype == MPT_DT_F32 ? j->b.data : NULL;
    const uint16_t *bb = j->b.dtype == MPT_DT_BF16 ? j->b.data : NULL;
    for (int64_t r = 0; r < j->m; r++) {
        if (j->row[r] < 0) continue;
        double *dst = j->acc + j->row[r] * j->d;
        if (bf)
            for (int64_t k = c0; k < c1; k++) dst[k] += (double)bf[r * j->d + k];
        else if (bb)
            for (int64_t k = c0; k < c1; k++) dst[k] += (double)mpt_bf16_to_f32(bb[r * j->d + k]);
        else
            for (int64_t k = c0; k < c1; k++) dst[k] += mpt_tensor_get(&j->b, r * j->d + k);
    }
    mpt_tensor out = j->out;
    float *of = out.dtype == MPT_DT_F32 ? out.data : NULL;
    for (int64_t r = 0; r < j->rows; r++)
        for (int64_t k = c0; k < c1; k++) {
            if (of) of[r * j->d + k] = (float)j->acc[r * j->d + k];
            else mpt_tensor_set(&out, r * j->d + k, j->acc[r * j->d + k]);
        }
}

int mpt_cpu_run_scatter_add(const mpt_node *nd, const mpt_node *na, const mpt_node *nb,
                            const void *ids, const void *upd, void *out, mpt_pool *pool,
                            char *err, size_t n) {
    sa_job j = {.m = mpt_shape_numel(na->shape), .d = nd->shape.dim[1], .rows = nd->shape.dim[0]};
    j.b = (mpt_tensor){nb->dtype, nb->shape, (void *)upd};
    j.out = (mpt_tensor){nd->dtype, nd->shape, out};
    int64_t *row = malloc((size_t)(j.m > 0 ? j.m : 1) * sizeof *row);
    j.acc = malloc((size_t)(j.rows * j.d > 0 ? j.rows * j.d : 1) * sizeof *j.acc);
    if (!row || !j.acc) {
        free(row);
        free(j.acc);
        snprintf(err, n, "scatter_add: out of memory for a [%lld, %lld] table",
                 (long long)j.rows, (long long)j.d);
        return -1;
    }
    /* an id outside [0, rows) is dropped, as gather reads it as zeros */
    mpt_tensor t = {na->dtype, na->shape, (void *)ids};
    for (int64_t r = 0; r < j.m; r++) {
        double a = mpt_tensor_get(&t, r);
        row[r] = a >= 0 && a < (double)j.rows ? (int64_t)a : -1;
    }
    j.row = row;
    int tasks = (int)((j.d + SA_COLS - 1) / SA_COLS);
    if (tasks > 0) mpt_pool_run(pool, tasks, sa_task, &j);
    free(row);
    free(j.acc);
    return 0;
}

/* ---- argmax along an axis ---- */

enum { AM_ROWS = 64 }; /* outer rows a task */

typedef struct {
    mpt_tensor in, out;
    int64_t len, inner, outer;
} am_job;

/* the first index of a row's maximum: its value first, in 16 lanes, then
 * where it is (-inf rows and all-NaN rows: index 0, as the scan gives) */
static int64_t row_argmax_f32(const float *restrict p, int64_t len) {
    float lane[16];
    for (int l = 0; l < 16; l++) lane[l] = p[0];
    int64_t k = 0;
    for (; k + 16 <= len; k += 16)
        for (int l = 0; l < 16; l++) lane[l] = p[k + l] > lane[l] ? p[k + l] : lane[l];
    float m = p[0];
    for (int l = 0; l < 16; l++) m = lane[l] > m ? lane[l] : m;
    for (; k < len; k++) m = p[k] > m ? p[k] : m;
    for (k = 0; k < len; k++)
        if (p[k] == m) return k;
    return 0; /* p[0] is NaN and nothing beats it */
}

static void am_task(void *ctx, int task, int thread) {
    (void)thread;
    const am_job *j = ctx;
    mpt_tensor out = j->out;
    int64_t o0 = (int64_t)task * AM_ROWS, o1 = o0 + AM_ROWS < j->outer ? o0 + AM_ROWS : j->outer;
    const float *f = j->in.dtype == MPT_DT_F32 ? j->in.data : NULL;
    for (int64_t o = o0; o < o1; o++)
        for (int64_t i = 0; i < j->inner; i++) {
            int64_t at = o * j->len * j->inner + i, best = 0;
            if (f && j->inner == 1) {
                best = row_argmax_f32(f + at, j->len);
            } else if (f) {
                const float *p = f + at;
                for (int64_t k = 1; k < j->len; k++)
                    if (p[k * j->inner] > p[best * j->inner]) best = k;
            } else {
                double bv = mpt_tensor_get(&j->in, at);
                for (int64_t k = 1; k < j->len; k++) {
                    double v = mpt_tensor_get(&j->in, at + k * j->inner);
                    if (v > bv) best = k, bv = v;
                }
            }
            mpt_tensor_set(&out, o * j->inner + i, (double)best);
        }
}

void mpt_cpu_run_argmax(const mpt_node *nd, const mpt_node *na, const void *src, void *dst,
                        mpt_pool *pool) {
    int axis = (int)nd->attr.i[0];
    am_job j = {.in = {na->dtype, na->shape, (void *)src}, .out = {nd->dtype, nd->shape, dst},
                .len = na->shape.dim[axis], .inner = 1, .outer = 1};
    for (int d = axis + 1; d < na->shape.rank; d++) j.inner *= na->shape.dim[d];
    for (int d = 0; d < axis; d++) j.outer *= na->shape.dim[d];
    if (j.len <= 0) return;
    int tasks = (int)((j.outer + AM_ROWS - 1) / AM_ROWS);
    if (tasks > 0) mpt_pool_run(pool, tasks, am_task, &j);
}
