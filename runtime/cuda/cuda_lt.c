/* runtime/cuda/cuda_lt.c — the CUDA backend's cuBLASLt calls: descriptors,
 * layouts and the heuristic's algorithm, chosen once per GEMM when the step
 * is compiled (the shapes are static), and the pointers set once the
 * step's buffers are placed.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/cuda_impl.h"

static int lt_type(mpt_dtype dt) {
    return dt == MPT_DT_F16 ? MPT_CUDA_R_16F : dt == MPT_DT_BF16 ? MPT_CUDA_R_16BF : MPT_CUDA_R_32F;
}

/* The alignment every buffer the step places has at least: the memory
 * plan's offsets (ARENA_ALIGN in fusion/plan.c) in arenas cuMemAlloc
 * aligns to 256. cuBLASLt's heuristics assume 256 unless told. */
enum { LT_ALIGN = 64 };

/* The heuristic's answers, kept for the process per call shape (dtypes,
 * transposes, epilogue, compute type): the same shape in another layer,
 * in the evaluation step or in another session asks cuBLASLt once. */
typedef struct {
    int64_t m, n, k, batch;
    int ta, tb, a_dt, b_dt, d_dt, bias_dt, bias, aux, epilogue, compute;
} lt_key;
typedef struct {
    lt_key key;
    int status, found;
    mpt_lt_algo algo;
} lt_memo;
static lt_memo *memo;
static int n_memo;
static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;

static lt_key key_of(const mpt_lt_call *c, int compute) {
    lt_key k;
    memset(&k, 0, sizeof k); /* padding too: keys are compared with memcmp */
    k.m = c->m, k.n = c->n, k.k = c->k, k.batch = c->batch;
    k.ta = c->trans_a, k.tb = c->trans_b;
    k.a_dt = c->a_dt, k.b_dt = c->b_dt, k.d_dt = c->d_dt, k.bias_dt = c->bias_dt;
    k.bias = c->bias >= 0, k.aux = c->aux >= 0, k.epilogue = c->epilogue, k.compute = compute;
    return k;
}

/* 1 and the answer when the shape was asked before */
static int memo_find(const lt_key *k, int *status, int *found, mpt_lt_algo *algo) {
    int hit = 0;
    pthread_mutex_lock(&memo_lock);
    for (int i = 0; i < n_memo && !hit; i++)
        if (memcmp(&memo[i].key, k, sizeof *k) == 0) {
            *status = memo[i].status, *found = memo[i].found, *algo = memo[i].algo;
            hit = 1;
        }
    pthread_mutex_unlock(&memo_lock);
    return hit;
}

static void memo_add(const lt_key *k, int status, int found, const mpt_lt_algo *algo) {
    pthread_mutex_lock(&memo_lock);
    lt_memo *m = realloc(memo, (size_t)(n_memo + 1) * sizeof *memo);
    if (m) {
        memo = m;
        memo[n_memo++] = (lt_memo){*k, status, found, *algo};
    }
    pthread_mutex_unlock(&memo_lock);
}

void mpt_cuda_lt_forget(void) {
    pthread_mutex_lock(&memo_lock);
    free(memo);
    memo = NULL;
    n_memo = 0;
    pthread_mutex_unlock(&memo_lock);
}

/* Row-major D[M,N] = A B is column-major D^T = B^T A^T: cuBLASLt gets B
 * first, m' = N, n' = M, and the bias runs along its rows (N). A batched
 * call (batch_matmul) sets the batch count and stride on each layout. This picks
 * the algorithm, before any buffer is placed (so a call cuBLASLt cannot
 * take goes to a generated kernel instead): the preference promises
 * LT_ALIGN-byte pointers, and the bias pointer is a stand-in with that
 * alignment until lt_bind sets the real one. */
int mpt_cuda_lt_prepare(mpt_exec *x, const mpt_lt_api *lt, cuda_step *s, char *err, size_t n) {
    const mpt_lt_call *c = &s->call;
    int ta = c->trans_b ? MPT_CUBLAS_OP_T : MPT_CUBLAS_OP_N;
    int tb = c->trans_a ? MPT_CUBLAS_OP_T : MPT_CUBLAS_OP_N;
    int epi = c->epilogue;
    mpt_lt_pref pref = NULL;
    /* f32 operands are multiplied in true fp32 unless --tf32 */
    int compute = c->a_dt == MPT_DT_F32 && x->plan->tf32 ? MPT_CUBLAS_COMPUTE_32F_FAST_TF32
                                                          : MPT_CUBLAS_COMPUTE_32F;
    MPT_LT_CHECK(lt->matmul_desc_create(&s->desc, compute, MPT_CUDA_R_32F), "");
    MPT_LT_CHECK(lt->matmul_desc_set_attribute(s->desc, MPT_LT_DESC_TRANSA, &ta, sizeof ta), "");
    MPT_LT_CHECK(lt->matmul_desc_set_attribute(s->desc, MPT_LT_DESC_TRANSB, &tb, sizeof tb), "");
    MPT_LT_CHECK(lt->matmul_desc_set_attribute(s->desc, MPT_LT_DESC_EPILOGUE, &epi, sizeof epi), "");
    if (c->bias >= 0) {
        void *bp = (void *)(uintptr_t)LT_ALIGN;
        int bt = lt_type(c->bias_dt);
        MPT_LT_CHECK(lt->matmul_desc_set_attribute(s->desc, MPT_LT_DESC_BIAS_POINTER, &bp, sizeof bp), "");
        MPT_LT_CHECK(lt->matmul_desc_set_attribute(s->desc, MPT_LT_DESC_BIAS_DATA_TYPE, &bt, sizeof bt), "");
    }
    if (c->aux >= 0) {
        void *ap = (void *)(uintptr_t)LT_ALIGN;
        int64_t ld = c->n;
        MPT_LT_CHECK(lt->matmul_desc_set_attribute(s->desc, MPT_LT_DESC_AUX_POINTER, &ap, sizeof ap), "");
        MPT_LT_CHECK(lt->matmul_desc_set_attribute(s->desc, MPT_LT_DESC_AUX_LD, &ld, sizeof ld), "");
    }
    /* B^T: [N,K] col-major when B is [K,N] row-major */
    MPT_LT_CHECK(lt->layout_create(&s->la, lt_type(c->b_dt), c->trans_b ? c->k : c->n,
                                   c->trans_b ? c->n : c->k, c->trans_b ? c->k : c->n), "");
    MPT_LT_CHECK(lt->layout_create(&s->lb, lt_type(c->a_dt), c->trans_a ? c->m : c->k,
                                   c->trans_a ? c->k : c->m, c->trans_a ? c->m : c->k), "");
    MPT_LT_CHECK(lt->layout_create(&s->ld, lt_type(c->d_dt), c->n, c->m, c->n), "");
    if (c->batch > 1) {
        /* a batch_matmul: every layout the same count, each matrix of a
         * buffer right after the one before (cuBLASLt's A is our B) */
        int32_t count = (int32_t)c->batch;
        const int64_t stride[3] = {c->k * c->n, c->m * c->k, c->m * c->n};
        const mpt_lt_layout l[3] = {s->la, s->lb, s->ld};
        for (int i = 0; i < 3; i++) {
            MPT_LT_CHECK(lt->layout_set_attribute(l[i], MPT_LT_LAYOUT_BATCH_COUNT, &count,
                                                  sizeof count), "");
            MPT_LT_CHECK(lt->layout_set_attribute(l[i], MPT_LT_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride[i], sizeof stride[i]), "");
        }
    }
    lt_key key = key_of(c, compute);
    mpt_lt_heuristic h;
    memset(&h, 0, sizeof h);
    int found = 0, st = 0;
    if (memo_find(&key, &st, &found, &h.algo)) goto answered;
    MPT_LT_CHECK(lt->pref_create(&pref), "");
    uint64_t ws = LT_WORKSPACE;
    MPT_LT_CHECK(lt->pref_set_attribute(pref, MPT_LT_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "");
    /* Every buffer starts LT_ALIGN-aligned; a batch's later matrices only as
     * aligned as their stride in bytes (40 f16 values: 16 bytes), and an
     * algorithm chosen for more could read them misaligned. In
     * MIN_ALIGNMENT_{A,B,C,D}'s order: cuBLASLt's A (our B), B, C and D. */
    const int64_t bytes[4] = {c->k * c->n * (int64_t)mpt_dtype_size(c->b_dt),
                              c->m * c->k * (int64_t)mpt_dtype_size(c->a_dt),
                              c->m * c->n * (int64_t)mpt_dtype_size(c->d_dt),
                              c->m * c->n * (int64_t)mpt_dtype_size(c->d_dt)};
    for (int a = MPT_LT_PREF_MIN_ALIGNMENT_A_BYTES; a <= MPT_LT_PREF_MIN_ALIGNMENT_D_BYTES; a++) {
        uint32_t align = LT_ALIGN;
        int64_t b = bytes[a - MPT_LT_PREF_MIN_ALIGNMENT_A_BYTES];
        while (c->batch > 1 && align > 1 && b % align) align /= 2;
        MPT_LT_CHECK(lt->pref_set_attribute(pref, a, &align, sizeof align), "");
    }
    st = lt->algo_get_heuristic(x->lt, s->desc, s->la, s->lb, s->ld, s->ld, pref, 1, &h, &found);
    memo_add(&key, st, found, &h.algo);
answered:
    if (st || found < 1) {
        char call[256] = "";
        FILE *f = fmemopen(call, sizeof call - 1, "w");
        if (f) {
            mpt_lt_call_print(c, x->plan->g, f);
            fclose(f);
        }
        snprintf(err, n, "cuBLASLt has no algorithm (%s) for %s",
                 st ? mpt_lt_status_name(st) : "none found", call);
        goto fail;
    }
    s->algo = h.algo;
    if (pref) lt->pref_destroy(pref);
    return 0;
fail:
    if (pref) lt->pref_destroy(pref);
    return -1;
}

void mpt_cuda_lt_release(const mpt_lt_api *lt, cuda_step *s) {
    if (s->desc) lt->matmul_desc_destroy(s->desc);
    if (s->la) lt->layout_destroy(s->la);
    if (s->lb) lt->layout_destroy(s->lb);
    if (s->ld) lt->layout_destroy(s->ld);
    s->desc = NULL;
    s->la = s->lb = s->ld = NULL;
}

/* Once the buffers are placed: the bias and aux pointers, and every
 * pointer checked against the alignment the algorithm was chosen for. */
int mpt_cuda_lt_bind(mpt_exec *x, const mpt_lt_api *lt, cuda_step *s, char *err, size_t n) {
    const mpt_lt_call *c = &s->call;
    const int ids[5] = {c->a, c->b, c->d, c->bias, c->aux};
    for (int i = 0; i < 5; i++)
        if (ids[i] >= 0 && x->buf[ids[i]] % LT_ALIGN) {
            snprintf(err, n, "internal error: %%%d is at a device address not aligned to %d "
                     "bytes, which cuBLASLt was promised\n  hint: run with --no-xla and report "
                     "the model", ids[i], LT_ALIGN);
            return -1;
        }
    if (c->bias >= 0) {
        void *bp = (void *)(uintptr_t)x->buf[c->bias];
        MPT_LT_CHECK(lt->matmul_desc_set_attribute(s->desc, MPT_LT_DESC_BIAS_POINTER, &bp, sizeof bp), "");
    }
    if (c->aux >= 0) {
        void *ap = (void *)(uintptr_t)x->buf[c->aux];
        MPT_LT_CHECK(lt->matmul_desc_set_attribute(s->desc, MPT_LT_DESC_AUX_POINTER, &ap, sizeof ap), "");
    }
    return 0;
fail:
    return -1;
}

