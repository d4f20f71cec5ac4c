/* runtime/cuda_lt.c — the CUDA backend's cuBLASLt calls: descriptors,
 * layouts and the heuristic's algorithm, chosen once per GEMM when the step
 * is compiled (the shapes are static), and the pointers set once the
 * step's buffers are placed.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "runtime/cuda_exec.h"

static int lt_type(mpt_dtype dt) {
    return dt == MPT_DT_F16 ? MPT_CUDA_R_16F : dt == MPT_DT_BF16 ? MPT_CUDA_R_16BF : MPT_CUDA_R_32F;
}

/* The alignment every buffer the step places has at least: the memory
 * plan's offsets (ARENA_ALIGN in fusion/plan.c) in arenas cuMemAlloc
 * aligns to 256. cuBLASLt's heuristics assume 256 unless told. */
enum { LT_ALIGN = 64 };

/* Row-major D[M,N] = A B is column-major D^T = B^T A^T: cuBLASLt gets B
 * first, m' = N, n' = M, and the bias runs along its rows (N). This picks
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
    MPT_LT_CHECK(lt->pref_create(&pref), "");
    uint64_t ws = LT_WORKSPACE;
    MPT_LT_CHECK(lt->pref_set_attribute(pref, MPT_LT_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), "");
    uint32_t align = LT_ALIGN;
    for (int a = MPT_LT_PREF_MIN_ALIGNMENT_A_BYTES; a <= MPT_LT_PREF_MIN_ALIGNMENT_D_BYTES; a++)
        MPT_LT_CHECK(lt->pref_set_attribute(pref, a, &align, sizeof align), "");
    mpt_lt_heuristic h;
    int found = 0;
    int st = lt->algo_get_heuristic(x->lt, s->desc, s->la, s->lb, s->ld, s->ld, pref, 1, &h,
                                    &found);
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
    lt->pref_destroy(pref);
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

