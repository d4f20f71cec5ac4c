/* codegen/cpu/emit_reduce.c — REDUCTION kernels.
 *
 * All reductions of a kernel reduce the same input shape over the same axes,
 * so they share one decomposition into rows (the kept dims) and reduced
 * elements. Two loop orders, picked by where the contiguous dim is:
 *
 *   A (the last dim is reduced: softmax rows, whole-tensor sums): one row at
 *     a time, <W> lanes along the reduced last dim, four vector accumulators
 *     per reduction, a horizontal combine at the end of the row;
 *   B (the last dim is kept: bias gradients, batch statistics): <W> rows at
 *     a time, one lane per row, one vector accumulator walking the reduced
 *     dims; no horizontal step.
 *
 * Accumulation is f32 (i32 for i32/bool inputs) and the result is rounded
 * once to the reduction's dtype; the interpreter accumulates in double, so
 * sums agree within the reduction tolerance of tests/test_cpu_backend.c,
 * while max and all agree exactly.
 *
 * A reduction may read an earlier one's result spread back over the row
 * (x - broadcast(max)); such reductions go in a later pass over the row, and
 * the row values they read are computed before that pass starts. Element
 * outputs that need no reduction are stored during the first pass; the
 * others in a last pass.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/emit.h"

static int is_reduction(mpt_op op) {
    return op == MPT_OP_REDUCE_SUM || op == MPT_OP_REDUCE_MAX || op == MPT_OP_REDUCE_ALL;
}

typedef struct {
    mpt_ce *e;
    mpt_shape s;
    int64_t mask, kept_mask;
    int mode_a;
    int64_t rows, rlen, D; /* D: the last dim (reduced in A, kept in B) */
    int *reds, n_reds;
    int *pass;             /* per node: pass of a reduction / first pass needing it, -1 */
    int n_passes;
    int *elem_out, n_elem; /* element-level outputs */
    int *row_out, n_row;   /* row-level outputs */
    char *seen;
    int *pass_reds;           /* one pass's reductions, room for all of them */
    LLVMValueRef (*pass_acc)[5]; /* their accumulators: 4 vectors and a scalar */
    /* split along the reduced rows (mode S, below) */
    int n_chunks, max_pr, final_elems; /* max_pr: most reductions in one pass */
    int64_t cr, Dk, wb, val_off; /* rows per chunk, kept elements, lanes per block, results' lane */
} red_plan;

static int64_t stride_of(mpt_shape s, int d) {
    int64_t st = 1;
    for (int j = d + 1; j < s.rank; j++) st *= s.dim[j];
    return st;
}

/* sum over the dims d in `which` (ordered as in s) of
 * (i / stride-among-which(d) % dim(d)) * stride-in-s(d); `skip_last` drops
 * the last dim of s from which */
static LLVMValueRef offset_of(mpt_ce *e, mpt_shape s, int64_t which, LLVMValueRef i) {
    LLVMValueRef sum = mpt_ce_i64(e, 0);
    int64_t st = 1;
    int first = -1, last = -1;
    for (int d = 0; d < s.rank; d++)
        if (which >> d & 1) {
            if (first < 0) first = d;
            last = d;
        }
    /* consecutive dims (the batch and spatial dims of a batch norm's
     * statistics, the rows of a bias gradient) are one linear run: a
     * multiply instead of a division per dim in the innermost loop */
    if (first >= 0 && which >> first == ((int64_t)1 << (last - first + 1)) - 1) {
        int64_t is = stride_of(s, last);
        return is == 1 ? i : LLVMBuildMul(e->b, i, mpt_ce_i64(e, is), "");
    }
    for (int d = s.rank - 1; d >= 0; d--) {
        if (!(which >> d & 1)) continue;
        LLVMValueRef q = st == 1 ? i : LLVMBuildUDiv(e->b, i, mpt_ce_i64(e, st), "");
        if (d != first) q = LLVMBuildURem(e->b, q, mpt_ce_i64(e, s.dim[d]), "");
        int64_t is = stride_of(s, d);
        if (is != 1) q = LLVMBuildMul(e->b, q, mpt_ce_i64(e, is), "");
        sum = LLVMBuildAdd(e->b, sum, q, "");
        st *= s.dim[d];
    }
    return sum;
}

/* ---- accumulators ---- */

static LLVMValueRef identity(mpt_ce *e, const mpt_node *r, int is_int, int w) {
    LLVMValueRef el[64], c;
    if (is_int)
        c = LLVMConstInt(e->i32, r->op == MPT_OP_REDUCE_MAX ? (unsigned long long)INT32_MIN
                                 : r->op == MPT_OP_REDUCE_ALL ? 1 : 0, 1);
    else
        c = LLVMConstReal(e->f32, r->op == MPT_OP_REDUCE_MAX ? -INFINITY : 0.0);
    for (int i = 0; i < w; i++) el[i] = c;
    return LLVMConstVector(el, (unsigned)w);
}

static LLVMValueRef combine(mpt_ce *e, const mpt_node *r, int is_int, LLVMValueRef acc, LLVMValueRef x) {
    if (r->op == MPT_OP_REDUCE_SUM)
        return is_int ? LLVMBuildAdd(e->b, acc, x, "") : LLVMBuildFAdd(e->b, acc, x, "");
    if (r->op == MPT_OP_REDUCE_MAX) return mpt_ce_max_nan(e, acc, x, is_int, 0);
    /* reduce_all */
    LLVMValueRef z = LLVMConstNull(LLVMTypeOf(x));
    LLVMValueRef both = LLVMBuildAnd(e->b, LLVMBuildICmp(e->b, LLVMIntNE, acc, z, ""),
                                     LLVMBuildICmp(e->b, LLVMIntNE, x, z, ""), "");
    return LLVMBuildZExt(e->b, both, LLVMTypeOf(x), "");
}

static int input_is_int(const red_plan *rp, int r) {
    return mpt_ce_is_int(rp->e->g->nodes[rp->e->g->nodes[r].in[0]].dtype);
}

/* ---- planning ---- */

/* Pass of each node: reductions go one pass after the latest reduction
 * their input depends on; other nodes carry the latest pass they need. */
static int plan_passes(red_plan *rp) {
    const mpt_graph *g = rp->e->g;
    const mpt_kernel *k = rp->e->k;
    for (int i = 0; i < k->n_nodes; i++) {
        int id = k->nodes[i];
        const mpt_node *nd = &g->nodes[id];
        int need = -1;
        for (int q = 0; q < nd->n_in; q++) {
            int in = nd->in[q];
            if (!rp->e->in_fn[in]) continue;
            int p = rp->pass[in];
            if (p > need) need = p;
        }
        if (is_reduction(nd->op)) {
            /* the input needs reductions up to pass `need`: this one runs after */
            rp->pass[id] = need + 1;
            if (need + 2 > rp->n_passes) rp->n_passes = need + 2;
        } else {
            rp->pass[id] = need;
        }
    }
    return 0;
}

/* Computes, at row level, every value a pass reads through a broadcast of
 * the row (so the value dominates the pass's loops). */
static void precompute_rows(red_plan *rp, int id) {
    mpt_ce *e = rp->e;
    if (!e->in_fn[id] || rp->seen[id]) return;
    rp->seen[id] = 1;
    const mpt_node *nd = &e->g->nodes[id];
    if (nd->op == MPT_OP_BROADCAST && mpt_shape_eq(nd->shape, e->alias_shape) &&
        nd->attr.i[0] == e->alias_mask) {
        mpt_ce_value(e, nd->in[0], e->row_ix);
        return;
    }
    for (int q = 0; q < nd->n_in; q++) precompute_rows(rp, nd->in[q]);
}

/* the reductions of pass p and the element outputs stored in it */
typedef struct {
    red_plan *rp;
    int p;
    LLVMValueRef (*acc)[5]; /* per reduction of the pass: 4 vector accumulators and a scalar one */
    int *reds, n;           /* rp->pass_acc, rp->pass_reds */
    int final_elems;        /* the last pass: element outputs needing reductions */
} pass_ctx;

static void visit(pass_ctx *pc, const mpt_ix *ix, int u) {
    red_plan *rp = pc->rp;
    mpt_ce *e = rp->e;
    int mark = mpt_ce_mark(e);
    for (int i = 0; i < pc->n; i++) {
        int r = pc->reds[i];
        int is_int = input_is_int(rp, r);
        LLVMValueRef x = mpt_ce_value(e, e->g->nodes[r].in[0], ix);
        LLVMTypeRef t = mpt_ce_vec(is_int ? e->i32 : e->f32, ix->w);
        LLVMValueRef a = LLVMBuildLoad2(e->b, t, pc->acc[i][u], "");
        LLVMBuildStore(e->b, combine(e, &e->g->nodes[r], is_int, a, x), pc->acc[i][u]);
    }
    for (int i = 0; i < rp->n_elem; i++) {
        int o = rp->elem_out[i];
        int in_this = pc->final_elems ? rp->pass[o] >= 0 : (pc->p == 0 && rp->pass[o] < 0);
        if (in_this) mpt_ce_store(e, o, ix, mpt_ce_value(e, o, ix));
    }
    mpt_ce_release(e, mark);
}

/* Allocates accumulators of width w, U per reduction, set to the identity. */
static void acc_init(pass_ctx *pc, int w, int U) {
    mpt_ce *e = pc->rp->e;
    for (int i = 0; i < pc->n; i++) {
        int is_int = input_is_int(pc->rp, pc->reds[i]);
        for (int u = 0; u < U; u++) {
            LLVMTypeRef t = mpt_ce_vec(is_int ? e->i32 : e->f32, u == U - 1 && U > 1 ? 1 : w);
            pc->acc[i][u] = mpt_ce_alloca(e, t, "acc");
            LLVMBuildStore(e->b, identity(e, &e->g->nodes[pc->reds[i]], is_int, u == U - 1 && U > 1 ? 1 : w),
                           pc->acc[i][u]);
        }
    }
}

/* the reductions' results, rounded to their dtypes, bound at the row */
static void acc_finish(pass_ctx *pc, int w, int n_vec, int has_scalar) {
    mpt_ce *e = pc->rp->e;
    for (int i = 0; i < pc->n; i++) {
        int r = pc->reds[i];
        const mpt_node *nd = &e->g->nodes[r];
        int is_int = input_is_int(pc->rp, r);
        LLVMTypeRef et = is_int ? e->i32 : e->f32;
        LLVMValueRef v = LLVMBuildLoad2(e->b, mpt_ce_vec(et, w), pc->acc[i][0], "");
        for (int u = 1; u < n_vec; u++)
            v = combine(e, nd, is_int, v, LLVMBuildLoad2(e->b, mpt_ce_vec(et, w), pc->acc[i][u], ""));
        if (has_scalar) {
            /* mode A: fold the lanes into the scalar tail's accumulator */
            LLVMValueRef s = LLVMBuildLoad2(e->b, mpt_ce_vec(et, 1), pc->acc[i][n_vec], "");
            for (int l = 0; l < w; l++) {
                LLVMValueRef x = LLVMBuildExtractElement(e->b, v, LLVMConstInt(e->i32, (unsigned long long)l, 0), "");
                x = LLVMBuildInsertElement(e->b, LLVMGetUndef(mpt_ce_vec(et, 1)), x, LLVMConstInt(e->i32, 0, 0), "");
                s = combine(e, nd, is_int, s, x);
            }
            v = s;
        }
        LLVMValueRef out;
        if (mpt_ce_is_int(nd->dtype)) {
            out = nd->dtype == MPT_DT_BOOL && is_int
                      ? LLVMBuildZExt(e->b, LLVMBuildICmp(e->b, LLVMIntNE, v, LLVMConstNull(LLVMTypeOf(v)), ""), LLVMTypeOf(v), "")
                      : v;
        } else {
            out = is_int ? LLVMBuildSIToFP(e->b, v, mpt_ce_vec(e->f32, LLVMGetVectorSize(LLVMTypeOf(v))), "") : v;
            out = mpt_ce_round_f32(e, nd->dtype, out);
        }
        mpt_ce_bind(e, r, e->row_ix, out);
    }
}

static void gather_pass(pass_ctx *pc, red_plan *rp, int p, int final) {
    memset(pc, 0, sizeof *pc);
    pc->rp = rp;
    pc->p = p;
    pc->final_elems = final;
    pc->acc = rp->pass_acc;
    pc->reds = rp->pass_reds;
    for (int i = 0; i < rp->n_reds && !final; i++)
        if (rp->pass[rp->reds[i]] == p) pc->reds[pc->n++] = rp->reds[i];
    memset(rp->seen, 0, (size_t)rp->e->g->n_nodes);
    for (int i = 0; i < pc->n; i++) precompute_rows(rp, rp->e->g->nodes[pc->reds[i]].in[0]);
    for (int i = 0; i < rp->n_elem; i++) {
        int o = rp->elem_out[i];
        if (final ? rp->pass[o] >= 0 : (p == 0 && rp->pass[o] < 0)) precompute_rows(rp, o);
    }
}

/* Gathers pass p's work into pc; 0 when it is the final pass and no
 * element-level output needs it, so the pass can be skipped. */
static int begin_pass(pass_ctx *pc, red_plan *rp, int p, int final) {
    gather_pass(pc, rp, p, final);
    if (!final) return 1;
    for (int i = 0; i < rp->n_elem; i++)
        if (rp->pass[rp->elem_out[i]] >= 0) return 1;
    return 0;
}

/* ---- mode A: one row at a time, lanes along the reduced last dim ---- */

static void row_a(red_plan *rp, LLVMValueRef row) {
    mpt_ce *e = rp->e;
    int W = e->W;
    mpt_ix rix = mpt_ce_ix(e, MPT_IX_CONTIG, 1, row, 1);
    e->row_ix = &rix;
    LLVMValueRef base = offset_of(e, rp->s, rp->kept_mask, row);
    int64_t last_bit = rp->s.rank ? (int64_t)1 << (rp->s.rank - 1) : 0;
    int64_t outer_mask = rp->mask & ~last_bit;
    int64_t rout = rp->rlen / (rp->D ? rp->D : 1);
    int U = rp->D >= 4 * W ? 4 : 1;
    for (int p = 0; p <= rp->n_passes; p++) {
        int final = p == rp->n_passes;
        pass_ctx pc;
        if (!begin_pass(&pc, rp, p, final)) break;
        acc_init(&pc, W, U + 1); /* U vectors, then the scalar tail's */
        mpt_ce_loop ro;
        mpt_ce_loop_begin(e, &ro, mpt_ce_i64(e, 0), mpt_ce_i64(e, rout), 1, "ro");
        LLVMValueRef eb = LLVMBuildAdd(e->b, base, offset_of(e, rp->s, outer_mask, mpt_ce_loop_iv(e, &ro)), "");
        LLVMValueRef end = mpt_ce_i64(e, rp->D);
        mpt_ce_loop jl;
        LLVMValueRef j0 = mpt_ce_i64(e, 0);
        if (U > 1) {
            mpt_ce_loop_begin(e, &jl, j0, end, (int64_t)U * W, "ju");
            for (int u = 0; u < U; u++) {
                LLVMValueRef at = LLVMBuildAdd(e->b, eb, LLVMBuildAdd(e->b, mpt_ce_loop_iv(e, &jl), mpt_ce_i64(e, u * W), ""), "");
                mpt_ix ix = mpt_ce_ix(e, MPT_IX_CONTIG, W, at, rp->D);
                visit(&pc, &ix, u);
            }
            mpt_ce_loop_end(e, &jl);
            j0 = mpt_ce_loop_iv(e, &jl);
        }
        mpt_ce_loop jv;
        mpt_ce_loop_begin(e, &jv, j0, end, W, "jv");
        mpt_ix ix = mpt_ce_ix(e, MPT_IX_CONTIG, W, LLVMBuildAdd(e->b, eb, mpt_ce_loop_iv(e, &jv), ""), rp->D);
        visit(&pc, &ix, 0);
        mpt_ce_loop_end(e, &jv);
        mpt_ce_loop jt;
        mpt_ce_loop_begin(e, &jt, mpt_ce_loop_iv(e, &jv), end, 1, "jt");
        mpt_ix ix1 = mpt_ce_ix(e, MPT_IX_CONTIG, 1, LLVMBuildAdd(e->b, eb, mpt_ce_loop_iv(e, &jt), ""), rp->D);
        visit(&pc, &ix1, U);
        mpt_ce_loop_end(e, &jt);
        mpt_ce_loop_end(e, &ro);
        if (!final) acc_finish(&pc, W, U, 1);
    }
    for (int i = 0; i < rp->n_row; i++)
        mpt_ce_store(e, rp->row_out[i], &rix, mpt_ce_value(e, rp->row_out[i], &rix));
    e->row_ix = NULL;
}

/* mode B and S: kept elements per block, up to four vectors that divide
 * the kept last dim D (a multiple of W) */
static int64_t block_lanes(const red_plan *rp) {
    int mult = 4;
    while (mult > 1 && rp->D % (mult * rp->e->W)) mult /= 2;
    return (int64_t)mult * rp->e->W;
}

/* ---- mode B: w kept elements at a time, walking the reduced dims ---- */

static void block_b(red_plan *rp, LLVMValueRef k, int w) {
    mpt_ce *e = rp->e;
    int mark = mpt_ce_mark(e);
    mpt_ix rix = mpt_ce_ix(e, MPT_IX_CONTIG, w, k, rp->D);
    e->row_ix = &rix;
    LLVMValueRef base = offset_of(e, rp->s, rp->kept_mask, k);
    for (int p = 0; p <= rp->n_passes; p++) {
        int final = p == rp->n_passes;
        pass_ctx pc;
        if (!begin_pass(&pc, rp, p, final)) break;
        acc_init(&pc, w, 1);
        mpt_ce_loop rl;
        mpt_ce_loop_begin(e, &rl, mpt_ce_i64(e, 0), mpt_ce_i64(e, rp->rlen), 1, "r");
        LLVMValueRef at = LLVMBuildAdd(e->b, base, offset_of(e, rp->s, rp->mask, mpt_ce_loop_iv(e, &rl)), "");
        mpt_ix ix = mpt_ce_ix(e, MPT_IX_CONTIG, w, at, rp->D);
        visit(&pc, &ix, 0);
        mpt_ce_loop_end(e, &rl);
        if (!final) acc_finish(&pc, w, 1, 0);
    }
    for (int i = 0; i < rp->n_row; i++)
        mpt_ce_store(e, rp->row_out[i], &rix, mpt_ce_value(e, rp->row_out[i], &rix));
    e->row_ix = NULL;
    mpt_ce_release(e, mark);
}

/* ---- mode S: split along the reduced rows ----
 *
 * Mode B walks all reduced rows for one block of kept elements, a whole
 * row's stride apart, and with few kept elements (64 channels) there is one
 * block, so one thread. When the kept dims are the trailing ones, mode S
 * cuts the reduced rows into n_chunks fixed chunks (fixed, so results do
 * not depend on the thread count) and runs each pass p in two stages:
 *   partial(p): per chunk, SPLIT_R consecutive rows at a time across the
 *     whole kept row, accumulating into the chunk's partial rows in the
 *     scratch (contiguous reads; the partial rows stay in L1); pass 0 also
 *     stores the element outputs that need no reduction;
 *   finish(p): per block of kept elements, the chunks' partials combined in
 *     chunk order, rounded, stored as the pass's results (and the row
 *     outputs after the last pass);
 * then, if element outputs need the reductions, one last stage over the
 * chunks stores them. Later stages read earlier results from the scratch.
 * Scratch, in 4-byte lanes: n_chunks x max_pr x Dk partials, then
 * n_reds x Dk results. */

enum { SPLIT_R = 4, SPLIT_MAX_CHUNKS = 32, SPLIT_MIN_ROWS = 256, SPLIT_MAX_PASSES = 3 };

/* MPT_CPU_REDUCE_SPLIT=0 keeps every reduction in one function, to compare */
static int split_enabled(void) {
    const char *v = getenv("MPT_CPU_REDUCE_SPLIT");
    return !v || strcmp(v, "0");
}

/* the number of stages, 0 when mode S does not apply */
static int plan_split(red_plan *rp) {
    mpt_ce *e = rp->e;
    int r = rp->s.rank;
    int64_t trail = 0;
    for (int d = r - 1; d >= 0 && !(rp->mask >> d & 1); d--) trail |= (int64_t)1 << d;
    if (rp->mode_a || trail != rp->kept_mask || rp->D % e->W || rp->rlen < SPLIT_MIN_ROWS ||
        rp->n_passes > SPLIT_MAX_PASSES || !split_enabled())
        return 0;
    rp->Dk = rp->rows;
    rp->wb = block_lanes(rp);
    rp->n_chunks = (int)(rp->rlen / 64 < SPLIT_MAX_CHUNKS ? rp->rlen / 64 : SPLIT_MAX_CHUNKS);
    rp->cr = (rp->rlen + rp->n_chunks - 1) / rp->n_chunks;
    rp->max_pr = 0;
    for (int p = 0; p < rp->n_passes; p++) {
        int n = 0;
        for (int i = 0; i < rp->n_reds; i++) n += rp->pass[rp->reds[i]] == p;
        if (n > rp->max_pr) rp->max_pr = n;
    }
    rp->val_off = (int64_t)rp->n_chunks * rp->max_pr * rp->Dk;
    if ((rp->val_off + rp->n_reds * rp->Dk) * 4 > ((int64_t)16 << 20)) return 0;
    rp->final_elems = 0;
    for (int i = 0; i < rp->n_elem; i++) rp->final_elems |= rp->pass[rp->elem_out[i]] >= 0;
    return 2 * rp->n_passes + rp->final_elems;
}

/* <w x et> at lane `off` of the scratch, 4-byte aligned */
static LLVMValueRef scratch_at(mpt_ce *e, LLVMTypeRef et, int w, LLVMValueRef off) {
    LLVMValueRef base = LLVMBuildBitCast(e->b, e->buf[e->red_slot], LLVMPointerType(et, 0), "");
    LLVMValueRef p = LLVMBuildGEP2(e->b, et, base, &off, 1, "");
    return LLVMBuildBitCast(e->b, p, LLVMPointerType(mpt_ce_vec(et, w), 0), "");
}

static LLVMValueRef load4(mpt_ce *e, LLVMTypeRef et, int w, LLVMValueRef off) {
    LLVMValueRef v = LLVMBuildLoad2(e->b, mpt_ce_vec(et, w), scratch_at(e, et, w, off), "");
    LLVMSetAlignment(v, 4);
    return v;
}

static void store4(mpt_ce *e, LLVMTypeRef et, int w, LLVMValueRef off, LLVMValueRef v) {
    LLVMSetAlignment(LLVMBuildStore(e->b, v, scratch_at(e, et, w, off)), 4);
}

static LLVMValueRef add_c(mpt_ce *e, LLVMValueRef v, int64_t c) {
    return c ? LLVMBuildAdd(e->b, v, mpt_ce_i64(e, c), "") : v;
}

/* lanes of a reduction's accumulator, and of its result as registers hold it */
static LLVMTypeRef acc_type(red_plan *rp, int r) { return input_is_int(rp, r) ? rp->e->i32 : rp->e->f32; }
static LLVMTypeRef val_type(red_plan *rp, int r) {
    return mpt_ce_is_int(rp->e->g->nodes[r].dtype) ? rp->e->i32 : rp->e->f32;
}

/* binds the results of the passes before p at the kept block kb */
static void bind_done(red_plan *rp, int p, LLVMValueRef kb) {
    mpt_ce *e = rp->e;
    for (int i = 0; i < rp->n_reds; i++) {
        int r = rp->reds[i];
        if (rp->pass[r] >= p) continue;
        LLVMValueRef off = add_c(e, kb, rp->val_off + i * rp->Dk);
        mpt_ce_bind(e, r, e->row_ix, load4(e, val_type(rp, r), (int)rp->wb, off));
    }
}

/* rows [r, r + R) x kept [kb, kb + wb) of pass p (p = n_passes: the
 * element outputs that need reductions) into the partial rows at poff */
static void split_block(red_plan *rp, int p, LLVMValueRef r, int R, LLVMValueRef kb, LLVMValueRef poff) {
    mpt_ce *e = rp->e;
    int w = (int)rp->wb, final = p == rp->n_passes;
    int mark = mpt_ce_mark(e);
    mpt_ix rix = mpt_ce_ix(e, MPT_IX_CONTIG, w, kb, rp->D);
    e->row_ix = &rix;
    bind_done(rp, p, kb);
    pass_ctx pc;
    gather_pass(&pc, rp, p, final);
    acc_init(&pc, w, 1);
    LLVMValueRef po = LLVMBuildAdd(e->b, poff, kb, "");
    for (int i = 0; i < pc.n; i++)
        LLVMBuildStore(e->b, load4(e, acc_type(rp, pc.reds[i]), w, add_c(e, po, i * rp->Dk)), pc.acc[i][0]);
    for (int q = 0; q < R; q++) {
        LLVMValueRef at = LLVMBuildAdd(e->b, LLVMBuildMul(e->b, add_c(e, r, q), mpt_ce_i64(e, rp->Dk), ""), kb, "");
        mpt_ix ix = mpt_ce_ix(e, MPT_IX_CONTIG, w, at, rp->D);
        visit(&pc, &ix, 0);
    }
    for (int i = 0; i < pc.n; i++) {
        LLVMTypeRef et = acc_type(rp, pc.reds[i]);
        store4(e, et, w, add_c(e, po, i * rp->Dk), LLVMBuildLoad2(e->b, mpt_ce_vec(et, w), pc.acc[i][0], ""));
    }
    e->row_ix = NULL;
    mpt_ce_release(e, mark);
}

/* stage partial(p), or the element stage (p = n_passes): chunks [lo, hi) */
static void split_rows(red_plan *rp, int p, mpt_cpu_fn *out) {
    mpt_ce *e = rp->e;
    out->total = rp->n_chunks;
    out->grain = 1;
    mpt_ce_loop cl, kl;
    mpt_ce_loop_begin(e, &cl, LLVMGetParam(e->fn, 1), LLVMGetParam(e->fn, 2), 1, "chunk");
    LLVMValueRef c = mpt_ce_loop_iv(e, &cl);
    LLVMValueRef r0 = LLVMBuildMul(e->b, c, mpt_ce_i64(e, rp->cr), "");
    LLVMValueRef r1 = add_c(e, r0, rp->cr), rlen = mpt_ce_i64(e, rp->rlen);
    r1 = LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, LLVMIntSGT, r1, rlen, ""), rlen, r1, "");
    LLVMValueRef poff = LLVMBuildMul(e->b, c, mpt_ce_i64(e, (int64_t)rp->max_pr * rp->Dk), "");
    if (p < rp->n_passes) {
        mpt_ce_loop_begin(e, &kl, mpt_ce_i64(e, 0), mpt_ce_i64(e, rp->Dk), rp->wb, "k0");
        for (int i = 0, j = 0; i < rp->n_reds; i++) {
            int r = rp->reds[i];
            if (rp->pass[r] != p) continue;
            LLVMValueRef off = add_c(e, LLVMBuildAdd(e->b, poff, mpt_ce_loop_iv(e, &kl), ""), j++ * rp->Dk);
            store4(e, acc_type(rp, r), (int)rp->wb, off,
                   identity(e, &e->g->nodes[r], input_is_int(rp, r), (int)rp->wb));
        }
        mpt_ce_loop_end(e, &kl);
    }
    /* SPLIT_R rows at a time, then the rest one by one */
    LLVMValueRef from = r0;
    for (int R = SPLIT_R;; R = 1) {
        mpt_ce_loop rl;
        mpt_ce_loop_begin(e, &rl, from, r1, R, R > 1 ? "rows" : "row");
        mpt_ce_loop_begin(e, &kl, mpt_ce_i64(e, 0), mpt_ce_i64(e, rp->Dk), rp->wb, "kb");
        split_block(rp, p, mpt_ce_loop_iv(e, &rl), R, mpt_ce_loop_iv(e, &kl), poff);
        mpt_ce_loop_end(e, &kl);
        mpt_ce_loop_end(e, &rl);
        from = mpt_ce_loop_iv(e, &rl);
        if (R == 1) break;
    }
    mpt_ce_loop_end(e, &cl);
}

/* stage finish(p): kept blocks [lo, hi) */
static void split_finish(red_plan *rp, int p, mpt_cpu_fn *out) {
    mpt_ce *e = rp->e;
    int w = (int)rp->wb;
    out->total = rp->Dk;
    out->grain = rp->wb;
    out->work = rp->Dk * rp->n_chunks;
    mpt_ce_loop kl;
    mpt_ce_loop_begin(e, &kl, LLVMGetParam(e->fn, 1), LLVMGetParam(e->fn, 2), rp->wb, "kb");
    LLVMValueRef kb = mpt_ce_loop_iv(e, &kl);
    int mark = mpt_ce_mark(e);
    mpt_ix rix = mpt_ce_ix(e, MPT_IX_CONTIG, w, kb, rp->D);
    e->row_ix = &rix;
    bind_done(rp, p, kb);
    pass_ctx pc;
    gather_pass(&pc, rp, p, 0);
    acc_init(&pc, w, 1);
    mpt_ce_loop cl;
    mpt_ce_loop_begin(e, &cl, mpt_ce_i64(e, 0), mpt_ce_i64(e, rp->n_chunks), 1, "chunk");
    LLVMValueRef po = LLVMBuildAdd(e->b, LLVMBuildMul(e->b, mpt_ce_loop_iv(e, &cl),
                                                      mpt_ce_i64(e, (int64_t)rp->max_pr * rp->Dk), ""), kb, "");
    for (int i = 0; i < pc.n; i++) {
        int r = pc.reds[i];
        LLVMTypeRef et = acc_type(rp, r);
        LLVMValueRef a = LLVMBuildLoad2(e->b, mpt_ce_vec(et, w), pc.acc[i][0], "");
        LLVMValueRef x = load4(e, et, w, add_c(e, po, i * rp->Dk));
        LLVMBuildStore(e->b, combine(e, &e->g->nodes[r], input_is_int(rp, r), a, x), pc.acc[i][0]);
    }
    mpt_ce_loop_end(e, &cl);
    acc_finish(&pc, w, 1, 0);
    for (int i = 0; i < rp->n_reds; i++) {
        int r = rp->reds[i];
        if (rp->pass[r] == p)
            store4(e, val_type(rp, r), w, add_c(e, kb, rp->val_off + i * rp->Dk), mpt_ce_value(e, r, &rix));
    }
    if (p == rp->n_passes - 1)
        for (int i = 0; i < rp->n_row; i++)
            mpt_ce_store(e, rp->row_out[i], &rix, mpt_ce_value(e, rp->row_out[i], &rix));
    e->row_ix = NULL;
    mpt_ce_release(e, mark);
    mpt_ce_loop_end(e, &kl);
}

/* ---- the kernel ---- */

static int plan(red_plan *rp) {
    mpt_ce *e = rp->e;
    const mpt_graph *g = e->g;
    const mpt_kernel *k = e->k;
    int first = -1;
    for (int i = 0; i < k->n_nodes; i++) {
        int id = k->nodes[i];
        if (!is_reduction(g->nodes[id].op)) continue;
        if (first < 0) first = id;
        else if (!mpt_shape_eq(g->nodes[g->nodes[id].in[0]].shape, g->nodes[g->nodes[first].in[0]].shape) ||
                 g->nodes[id].attr.i[0] != g->nodes[first].attr.i[0]) {
            e->err = "reductions of one kernel must reduce the same shape over the same axes";
            e->err_node = id;
            return -1;
        }
        rp->reds[rp->n_reds++] = id;
    }
    if (first < 0) {
        e->err = "reduction kernel without a reduction";
        return -1;
    }
    rp->s = g->nodes[g->nodes[first].in[0]].shape;
    rp->mask = g->nodes[first].attr.i[0];
    int r = rp->s.rank;
    rp->kept_mask = 0;
    for (int d = 0; d < r; d++)
        if (!(rp->mask >> d & 1)) rp->kept_mask |= (int64_t)1 << d;
    rp->mode_a = r == 0 || (rp->mask >> (r - 1) & 1);
    rp->D = r ? rp->s.dim[r - 1] : 1;
    rp->rows = mpt_shape_numel(g->nodes[first].shape);
    int64_t numel = mpt_shape_numel(rp->s);
    rp->rlen = rp->rows ? numel / rp->rows : 0;
    e->alias_on = 1;
    e->alias_shape = rp->s;
    e->alias_mask = rp->kept_mask;
    for (int i = 0; i < g->n_nodes; i++) rp->pass[i] = -1;
    plan_passes(rp);
    for (int i = 0; i < k->n_outputs; i++) {
        int o = k->outputs[i];
        int64_t n = mpt_shape_numel(g->nodes[o].shape);
        int red = is_reduction(g->nodes[o].op);
        /* with one reduced element per row, shapes tell rows from elements */
        int row_level = rp->rows != numel ? n == rp->rows
                                          : red || mpt_shape_eq(g->nodes[o].shape, g->nodes[first].shape);
        if (row_level) {
            rp->row_out[rp->n_row++] = o;
        } else if (n == numel) {
            rp->elem_out[rp->n_elem++] = o;
        } else {
            e->err = "a reduction kernel's output must have the reduced or the input's shape";
            e->err_node = o;
            return -1;
        }
    }
    for (int i = 0; i < rp->n_reds; i++)
        if (rp->pass[rp->reds[i]] >= 8) {
            e->err = "more than 8 dependent reduction passes in one kernel";
            e->err_node = rp->reds[i];
            return -1;
        }
    return 0;
}

static int rp_alloc(red_plan *rp, mpt_ce *e) {
    const mpt_kernel *k = e->k;
    size_t nn = (size_t)e->g->n_nodes + 1;
    memset(rp, 0, sizeof *rp);
    rp->e = e;
    rp->reds = malloc(((size_t)k->n_nodes + 1) * sizeof(int));
    rp->pass = malloc(nn * sizeof(int));
    rp->elem_out = malloc(((size_t)k->n_outputs + 1) * sizeof(int));
    rp->row_out = malloc(((size_t)k->n_outputs + 1) * sizeof(int));
    rp->seen = calloc(nn, 1);
    rp->pass_reds = malloc(((size_t)k->n_nodes + 1) * sizeof(int));
    rp->pass_acc = malloc(((size_t)k->n_nodes + 1) * sizeof *rp->pass_acc);
    if (!rp->reds || !rp->pass || !rp->elem_out || !rp->row_out || !rp->seen || !rp->pass_reds ||
        !rp->pass_acc) {
        e->err = "out of memory";
        return -1;
    }
    return 0;
}

static void rp_free(red_plan *rp) {
    free(rp->reds);
    free(rp->pass);
    free(rp->elem_out);
    free(rp->row_out);
    free(rp->seen);
    free(rp->pass_reds);
    free(rp->pass_acc);
}

int mpt_ce_reduction_stages(mpt_cpu_jit *j, const mpt_graph *g, const mpt_kernel *k,
                            const char *in_fn, int64_t *scratch_bytes) {
    mpt_ce e;
    memset(&e, 0, sizeof e);
    e.g = g;
    e.k = k;
    e.in_fn = in_fn;
    e.W = mpt_cpu_jit_vector_lanes(j);
    e.err_node = -1;
    red_plan rp;
    int stages = 0;
    if (!rp_alloc(&rp, &e) && !plan(&rp)) stages = plan_split(&rp);
    *scratch_bytes = stages ? (rp.val_off + rp.n_reds * rp.Dk) * 4 : 0;
    rp_free(&rp);
    return stages;
}

int mpt_ce_emit_reduction(mpt_ce *e, mpt_cpu_fn *out) {
    red_plan rp;
    int rc = -1;
    if (rp_alloc(&rp, e) || plan(&rp)) goto done;
    snprintf(out->name, sizeof out->name, "%s", LLVMGetValueName2(e->fn, &(size_t){0}));
    out->work = rp.rows * rp.rlen;
    if (e->red_stage >= 0) {
        int stages = plan_split(&rp);
        if (e->red_slot < 0 || e->red_stage >= stages) {
            e->err = "reduction stage without its split plan";
            goto done;
        }
        int p = e->red_stage / 2;
        if (p == rp.n_passes || e->red_stage % 2 == 0) split_rows(&rp, p, out);
        else split_finish(&rp, p, out);
        rc = e->err ? -1 : 0;
        goto done;
    }
    LLVMValueRef lo = LLVMGetParam(e->fn, 1), hi = LLVMGetParam(e->fn, 2);
    if (rp.mode_a) {
        out->total = rp.rows;
        out->grain = 1;
        mpt_ce_loop rl;
        mpt_ce_loop_begin(e, &rl, lo, hi, 1, "row");
        int mark = mpt_ce_mark(e);
        row_a(&rp, mpt_ce_loop_iv(e, &rl));
        mpt_ce_release(e, mark);
        mpt_ce_loop_end(e, &rl);
    } else if (rp.D % e->W == 0) {
        /* vectors of W kept elements never straddle two rows of D, so the
         * pool may split anywhere on W (a bias gradient is a single row).
         * Blocks of up to four vectors read whole cache lines of each row
         * (a bf16 vector is half a line): ResNet-50's reductions, bf16 batch
         * 8, took 303 ms per step in 4-vector blocks, 312 in 2, 371 in 1 */
        int64_t wb = block_lanes(&rp);
        out->total = rp.rows;
        out->grain = wb;
        mpt_ce_loop vl;
        mpt_ce_loop_begin(e, &vl, lo, hi, wb, "kv");
        block_b(&rp, mpt_ce_loop_iv(e, &vl), wb);
        mpt_ce_loop_end(e, &vl);
    } else {
        /* lo and hi are multiples of D, the kept last dim */
        out->total = rp.rows;
        out->grain = rp.D;
        mpt_ce_loop rl;
        mpt_ce_loop_begin(e, &rl, lo, hi, rp.D, "row");
        LLVMValueRef r0 = mpt_ce_loop_iv(e, &rl);
        LLVMValueRef rend = LLVMBuildAdd(e->b, r0, mpt_ce_i64(e, rp.D), "");
        mpt_ce_loop vl;
        mpt_ce_loop_begin(e, &vl, r0, rend, e->W, "kv");
        block_b(&rp, mpt_ce_loop_iv(e, &vl), e->W);
        mpt_ce_loop_end(e, &vl);
        mpt_ce_loop tl;
        mpt_ce_loop_begin(e, &tl, mpt_ce_loop_iv(e, &vl), rend, 1, "kt");
        block_b(&rp, mpt_ce_loop_iv(e, &tl), 1);
        mpt_ce_loop_end(e, &tl);
        mpt_ce_loop_end(e, &rl);
    }
    rc = e->err ? -1 : 0;
done:
    rp_free(&rp);
    return rc;
}
