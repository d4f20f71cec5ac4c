/* codegen/cpu/emit_slice.c — slice and concat inside loop kernels.
 *
 * Both read their operands at an offset along one axis. Write the output's
 * linear index i as (o, r): o the row over the dims before the axis, r the
 * place inside that row of len * inner elements (inner: the product of the
 * dims after the axis, len: the output's dim along it). Then
 *   slice  reads its input at o * in_len * inner + start * inner + r;
 *   concat reads in0 at o * la * inner + r where r < la * inner, else in1
 *          at o * lb * inner + r - la * inner.
 *
 * A vector's lanes that stay inside one row of the output's last dim (the
 * index's span divides that dim) share o, since len * inner is a multiple
 * of it: one scalar computation gives a contiguous read. For a concat they
 * must also share the side, which only a concat along the last dim can
 * break: there the lanes are contiguous only when the span divides la as
 * well (then it divides lb too), and go one by one otherwise.
 *
 * A concat computes both operands and selects. Each operand's index is
 * clamped into that operand (r into [0, la*inner - w], r - la*inner into
 * [0, lb*inner - w]), so the side not taken still reads inside its buffer;
 * an operand is a buffer or a cast of one (fusion puts nothing else under
 * an index op), so the discarded read costs one load and faults never.
 */
#include "codegen/cpu/emit.h"

typedef struct {
    int ax, last_axis;
    int64_t inner, row, last; /* row: the output's len * inner; last: its last dim */
} axis_geom;

static axis_geom geom_of(const mpt_node *nd) {
    axis_geom q = {.ax = (int)nd->attr.i[0], .inner = 1};
    for (int d = q.ax + 1; d < nd->shape.rank; d++) q.inner *= nd->shape.dim[d];
    q.row = nd->shape.dim[q.ax] * q.inner;
    q.last = nd->shape.dim[nd->shape.rank - 1];
    q.last_axis = q.ax == nd->shape.rank - 1;
    return q;
}

/* v as an i64 scalar (w == 0) or a splat of w lanes */
static LLVMValueRef k64(mpt_ce *e, int64_t v, int w) {
    return w ? mpt_ce_iconst(e, e->i64, v, w) : mpt_ce_i64(e, v);
}

/* i = o * row + r, for a scalar i (w == 0) or lanes; one row needs no
 * division (an axis-0 slice or concat) */
static void split_row(mpt_ce *e, LLVMValueRef i, int64_t row, int64_t numel, int w,
                      LLVMValueRef *o, LLVMValueRef *r) {
    if (numel == row) {
        *o = k64(e, 0, w);
        *r = i;
        return;
    }
    *o = LLVMBuildUDiv(e->b, i, k64(e, row, w), "");
    *r = LLVMBuildSub(e->b, i, LLVMBuildMul(e->b, *o, k64(e, row, w), ""), "");
}

/* o * stride + off + r */
static LLVMValueRef join(mpt_ce *e, LLVMValueRef o, int64_t stride, int64_t off, LLVMValueRef r,
                         int w) {
    LLVMValueRef at = LLVMBuildMul(e->b, o, k64(e, stride, w), "");
    if (off) at = LLVMBuildAdd(e->b, at, k64(e, off, w), "");
    return LLVMBuildAdd(e->b, at, r, "");
}

/* The index kind for an operand read at `at`: one scalar for a single lane
 * or uniform lanes, a contiguous run, or a lane vector (w_vec > 0). */
static mpt_ix operand_ix(mpt_ce *e, const mpt_ix *ix, LLVMValueRef at, int w_vec, int contig,
                         int64_t span) {
    if (w_vec) {
        mpt_ix g = mpt_ce_ix(e, MPT_IX_GATHER, ix->w, NULL, 0);
        g.vec = at;
        return g;
    }
    if (ix->w == 1) return mpt_ce_ix(e, MPT_IX_CONTIG, 1, at, 1);
    return mpt_ce_ix(e, contig ? MPT_IX_CONTIG : MPT_IX_UNIFORM, ix->w, at, contig ? span : 0);
}

/* lanes inside one row of the output's last dim */
static int in_one_row(const mpt_ix *ix, const axis_geom *q) {
    return ix->kind == MPT_IX_CONTIG && ix->span >= ix->w && q->last % ix->span == 0;
}

LLVMValueRef mpt_ce_slice(mpt_ce *e, int id, const mpt_ix *ix) {
    const mpt_node *nd = &e->g->nodes[id], *in = &e->g->nodes[nd->in[0]];
    axis_geom q = geom_of(nd);
    int64_t in_row = in->shape.dim[q.ax] * q.inner, off = nd->attr.i[1] * q.inner;
    int scalar = ix->w == 1 || ix->kind == MPT_IX_UNIFORM || in_one_row(ix, &q);
    int w_vec = scalar ? 0 : ix->w;
    LLVMValueRef o, r;
    split_row(e, scalar ? ix->base : mpt_ce_ix_lanes(e, ix), q.row, mpt_shape_numel(nd->shape),
              w_vec, &o, &r);
    /* along an inner axis the offset is whole rows of the last dim, so the
     * lanes keep their alignment; along the last it shifts them */
    mpt_ix j = operand_ix(e, ix, join(e, o, in_row, off, r, w_vec), w_vec,
                          ix->kind == MPT_IX_CONTIG, q.last_axis ? 0 : ix->span);
    return mpt_ce_value(e, nd->in[0], &j);
}

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Along the last dim, a vector must not cross from in0 to in1: runs of
 * gcd(la, lb) elements never do. When that is shorter than a vector, the
 * output's rows are asked for instead and the vectors that do cross go
 * lane by lane (mpt_ce_concat), rather than the whole loop one element at
 * a time. */
int64_t mpt_ce_concat_run(const mpt_ce *e, int id) {
    const mpt_node *nd = &e->g->nodes[id];
    axis_geom q = geom_of(nd);
    if (!q.last_axis) return q.last;
    int64_t g = gcd64(e->g->nodes[nd->in[0]].shape.dim[q.ax], e->g->nodes[nd->in[1]].shape.dim[q.ax]);
    return g >= e->W ? g : q.last;
}

LLVMValueRef mpt_ce_concat(mpt_ce *e, int id, const mpt_ix *ix) {
    const mpt_node *nd = &e->g->nodes[id];
    axis_geom q = geom_of(nd);
    int64_t ra = e->g->nodes[nd->in[0]].shape.dim[q.ax] * q.inner, rb = q.row - ra;
    int contig = in_one_row(ix, &q) && (!q.last_axis || ra % ix->span == 0);
    int scalar = ix->w == 1 || ix->kind == MPT_IX_UNIFORM || contig;
    int w_vec = scalar ? 0 : ix->w, reach = contig ? ix->w : 1; /* elements one index reads */
    LLVMValueRef o, r;
    split_row(e, scalar ? ix->base : mpt_ce_ix_lanes(e, ix), q.row, mpt_shape_numel(nd->shape),
              w_vec, &o, &r);
    LLVMValueRef first = LLVMBuildICmp(e->b, LLVMIntSLT, r, k64(e, ra, w_vec), "");
    LLVMValueRef ra_max = k64(e, ra - reach, w_vec), rb_r = LLVMBuildSub(e->b, r, k64(e, ra, w_vec), "");
    LLVMValueRef r_a = LLVMBuildSelect(e->b, LLVMBuildICmp(e->b, LLVMIntSLT, r, ra_max, ""), r, ra_max, "");
    LLVMValueRef r_b = LLVMBuildSelect(e->b, first, k64(e, 0, w_vec), rb_r, "");
    mpt_ix ja = operand_ix(e, ix, join(e, o, ra, 0, r_a, w_vec), w_vec, contig, 0);
    mpt_ix jb = operand_ix(e, ix, join(e, o, rb, 0, r_b, w_vec), w_vec, contig, 0);
    LLVMValueRef va = mpt_ce_value(e, nd->in[0], &ja);
    LLVMValueRef vb = mpt_ce_value(e, nd->in[1], &jb);
    return LLVMBuildSelect(e->b, first, va, vb, "");
}
