/* codegen/cpu/gemm.c — compiles GEMM kernels and drives them over threads
 * and cache blocks.
 *
 * The generated code (gemm_gen.c) does everything per element: packing with
 * dtype conversion, the register-blocked k loop, the epilogue and the store.
 * This file chooses the blocking and walks the classic loop nest
 *
 *   for jc in N by nc:            B panel kc x nc   (L3)
 *     for pc in K by kc:          pack B
 *       for ic in M by mc:        pack A, mc x kc   (L2)
 *         macro-kernel            B sliver kc x nr  (L1), C tile in registers
 *
 * A kernel has two register tiles: the wide one, and for AVX-512 f32 a
 * narrow one (28 x 16; 10 x 16 with a gathered A), compiled by
 * mpt_cpu_gemm_prepare or when first needed, for N that would leave most
 * of a 32-wide tile empty (N = 10: a classifier's logits).
 *
 * Each thread owns a range of N (or of M when N is narrow) whose
 * boundaries fall on register tiles, hence on distinct cache lines of C.
 * Partial sums between k blocks live in C itself when C is f32 and nothing
 * else reads it meanwhile; otherwise in a per-thread f32 scratch block. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/cpu_internal.h"

typedef struct {
    void *a, *b;
    size_t a_bytes, b_bytes;
    void *fill;        /* one sliver of a source operand, before packing */
    size_t fill_bytes;
    float *scratch;
    size_t scratch_floats;
} thread_buf;

/* One register tile's generated functions and its cache blocks. */
typedef struct {
    mpt_cpu_gemm_shape s;
    int kc, mc, nc;
    mpt_cpu_pack_fn pack_a, pack_b;
    mpt_cpu_macro_fn macro;
} variant;

enum { WIDE, NARROW };
enum { NARROW_MR = 28, NARROW_NR = 16 };

struct mpt_cpu_gemm {
    mpt_cpu_gemm_desc d;
    mpt_cpu_jit *jit;
    /* WIDE is compiled up front; NARROW (AVX-512 f32: 28 x 16, for N that
     * leaves most of a 32-wide tile empty) on first use */
    variant v[2];
    int has_narrow, narrow_ok;
    char *ir_text, *asm_text;
    int n_bufs;
    thread_buf *bufs;
    float *ksum; /* split K: the sums of threads 1.. (see run) */
    size_t ksum_floats;
    int split_k_ok; /* MPT_CPU_GEMM_SPLIT_K=0 at compile time turns it off */
};

static int dtype_ok(mpt_dtype dt) {
    switch (dt) {
    case MPT_DT_F32:
    case MPT_DT_F16:
    case MPT_DT_BF16: return 1;
    case MPT_DT_I32:
    case MPT_DT_BOOL:
    case MPT_DT_F64:
    case MPT_DT_COUNT: return 0;
    }
    return 0;
}

static int check_desc(const mpt_cpu_gemm_desc *d, const mpt_cpu_gemm_shape *s, char *err,
                      size_t n) {
    const mpt_dtype dts[3] = {d->a_dt, d->b_dt, d->c_dt};
    for (int i = 0; i < 3; i++) {
        if (!dtype_ok(dts[i])) {
            snprintf(err, n, "CPU GEMM: %s operands are not supported (hint: cast to f32, f16 "
                             "or bf16 first)", mpt_dtype_name(dts[i]));
            return -1;
        }
        if (dts[i] == MPT_DT_F16 && !s->f16c) {
            snprintf(err, n, "CPU GEMM: f16 needs F16C, which this ISA lacks (hint: use "
                             "--policy mixed_bfloat16 or float32 on this CPU)");
            return -1;
        }
    }
    if (d->accumulate && d->c_dt != MPT_DT_F32) {
        snprintf(err, n, "CPU GEMM: C += A x B needs an f32 C, got %s (hint: accumulate "
                         "gradients in f32)", mpt_dtype_name(d->c_dt));
        return -1;
    }
    if (d->n_steps < 0 || d->n_steps > MPT_CPU_EPI_MAX) {
        snprintf(err, n, "CPU GEMM: %d epilogue steps, at most %d fit in one kernel",
                 d->n_steps, MPT_CPU_EPI_MAX);
        return -1;
    }
    if (d->a_tiles && (!s->amx || d->a_gather)) {
        snprintf(err, n, "CPU GEMM: A read a tile at a time needs AMX bf16 tiles");
        return -1;
    }
    if (d->a_pairs && (!d->a_gather || d->a_dt != MPT_DT_BF16 || d->b_dt != MPT_DT_BF16)) {
        snprintf(err, n, "CPU GEMM: A's pairs side by side (a_pairs) needs a gathered bf16 A and "
                         "a bf16 B");
        return -1;
    }
    for (int i = 0; i < d->n_steps; i++) {
        mpt_cpu_epi_op op = d->steps[i].op;
        int has_operand = op == MPT_CPU_EPI_BIAS || op == MPT_CPU_EPI_RESIDUAL ||
                          op == MPT_CPU_EPI_RELU_MASK || op == MPT_CPU_EPI_GELU_GRAD ||
                          op == MPT_CPU_EPI_STORE;
        if (has_operand && !dtype_ok(d->steps[i].dt)) {
            snprintf(err, n, "CPU GEMM: epilogue step %d has a %s operand (hint: f32, f16 or "
                             "bf16)", i, mpt_dtype_name(d->steps[i].dt));
            return -1;
        }
        int low = d->steps[i].dt == MPT_DT_F16 || d->steps[i].dt == MPT_DT_BF16;
        if (op == MPT_CPU_EPI_ROUND && !low) {
            snprintf(err, n, "CPU GEMM: epilogue step %d rounds to %s (hint: f16 or bf16)", i,
                     mpt_dtype_name(d->steps[i].dt));
            return -1;
        }
        if (op == MPT_CPU_EPI_FINITE &&
            (i != d->n_steps - 1 ||
             (d->c_dt != MPT_DT_F32 &&
              (!i || d->steps[i - 1].op != MPT_CPU_EPI_ROUND || d->steps[i - 1].dt != d->c_dt)))) {
            snprintf(err, n, "CPU GEMM: the finite check (epilogue step %d) must be the last step, "
                             "after a ROUND to C's dtype where C is f16 or bf16", i);
            return -1;
        }
        mpt_dtype odt = d->steps[i].odt;
        if (odt != MPT_DT_F32 && odt != MPT_DT_F16 && odt != MPT_DT_BF16) {
            snprintf(err, n, "CPU GEMM: epilogue step %d rounds its operand to %s (hint: f16 "
                             "or bf16, or f32 for none)", i, mpt_dtype_name(odt));
            return -1;
        }
        if ((has_operand || op == MPT_CPU_EPI_ROUND || op == MPT_CPU_EPI_GELU) &&
            (d->steps[i].dt == MPT_DT_F16 || odt == MPT_DT_F16) && !s->f16c) {
            snprintf(err, n, "CPU GEMM: f16 epilogue steps need F16C");
            return -1;
        }
    }
    return 0;
}

static int round_up(int v, int to) { return (v + to - 1) / to * to; }

/* Register tile and cache blocks per ISA. The tile uses all but two or three
 * vector registers for accumulators: 14 x 2 zmm (of 32), 6 x 2 ymm (of 16);
 * narrow: 28 x 1 zmm. mc keeps an mc x kc block of A in L2. */
static void choose_shape(mpt_cpu_jit *j, const mpt_cpu_gemm_desc *d, int narrow, variant *v) {
    mpt_cpu_gemm_shape *s = &v->s;
    s->vl = mpt_cpu_jit_vector_lanes(j);
    s->fma = mpt_cpu_jit_has_fma(j);
    s->f16c = mpt_cpu_jit_has_f16c(j);
    /* a gathered A is widened to f32 element by element: bf16 operands then
     * take the f32 FMA tile (products exact, sums in f32 as on AMX), unless
     * its pairs lie side by side (a_pairs) */
    int bf16 = d->a_dt == MPT_DT_BF16 && d->b_dt == MPT_DT_BF16;
    s->amx = bf16 && !d->a_gather && mpt_cpu_jit_has_amx(j);
    /* vdpbf16ps only where it beats f32 FMAs on widened operands
     * (mpt_cpu_bf16_dot_pays: on a Xeon without AMX it runs at half their
     * rate) */
    s->pair = bf16 && (s->amx || ((!d->a_gather || d->a_pairs) && mpt_cpu_bf16_dot_pays(j, NULL)));
    if (s->amx) {
        /* 2 x 2 tiles of 16 x 16 f32 */
        s->mr = 32;
        s->nr = 32;
    } else if (s->vl == 16 && d->a_gather) {
        /* rows evenly spaced (a_row_step) and 64 or more columns: 7 x 64,
         * the rows on one pointer, four vectors of B a k step for 28 FMAs
         * (ResNet-50 f32 stage 2-3 3x3 convolutions 5-10% faster than
         * 10 x 32); else 10 x 32 */
        int tall = !narrow && d->a_row_step != 0 && d->n_hint > 0 && d->n_hint % 64 == 0;
        s->mr = tall ? MPT_CPU_GATHER_MR_STEP : MPT_CPU_GATHER_MR;
        s->nr = narrow ? NARROW_NR : tall ? 64 : 32;
    } else if (d->a_gather) {
        /* AVX2 gathered: 6 rows of f32 with FMA, whose k step is inline
         * assembly (gemm_asm.c: as IR, LLVM spilled accumulators inside
         * the k loop, 36-40% of the FMA peak); else 4 rows, which fit */
        s->mr = s->vl == 8 && s->fma && d->a_dt == MPT_DT_F32 ? MPT_CPU_GATHER_MR_AVX2 : 4;
        s->nr = 2 * s->vl;
    } else if (s->vl == 16) {
        s->mr = narrow ? NARROW_MR : 14;
        s->nr = narrow ? NARROW_NR : 32;
    } else {
        s->mr = 6;
        s->nr = 2 * s->vl;
    }
    /* AVX-512 f32: a long k block (measured best among 256-1024 on a
     * Sapphire Rapids VM) amortises each tile's C load/store and partial-sum
     * pass; its kc x nr sliver of B then streams from L2, with software
     * prefetch (gemm_gen.c) keeping ahead of the FMAs. */
    int kc_default = s->amx ? 1024 : s->pair ? 512 : s->vl == 16 ? 1024 : 256;
    v->kc = d->kc > 0 ? d->kc : kc_default;
    /* AMX: 4 tiles of 32 rows (128 rows, 256 KiB of A with kc = 1024): best
     * or even with 768 on every shape tried (bf16 C, best of 3 interleaved:
     * 1568x1024x256 +16%, 6272x128x512 +12%, 25088x256x64 +13%, 2048^3
     * +7%, 392x2048x512 and 1568x256x1024 even; 64 rows lost on 2048^3) */
    v->mc = d->mc > 0 ? d->mc : s->amx ? s->mr * 4 : s->mr * (narrow ? 12 : 24);
    v->nc = d->nc > 0 ? d->nc : 2048;
    v->kc = round_up(v->kc, 2); /* pairs never straddle two k blocks */
    v->mc = round_up(v->mc, s->mr);
    v->nc = round_up(v->nc, s->nr);
}

/* Generates, compiles and looks up one variant's three functions. */
static int build_variant(mpt_cpu_gemm *g, int which, char *err, size_t n) {
    variant *v = &g->v[which];
    const mpt_cpu_gemm_desc *desc = &g->d;
    choose_shape(g->jit, desc, which == NARROW, v);
    char prefix[64], name[96];
    snprintf(prefix, sizeof prefix, "mpt_gemm%d", mpt_cpu_jit_next_id(g->jit));
    LLVMModuleRef m = mpt_cpu_jit_module_new(g->jit, prefix);
    mpt_cpu_gemm_generate(g->jit, m, desc, &v->s, prefix);
    int text = desc->keep_text && which == WIDE;
    if (mpt_cpu_jit_add_module(g->jit, m, text ? &g->ir_text : NULL, text ? &g->asm_text : NULL,
                               err, n))
        return -1;
    snprintf(name, sizeof name, "%s_pack_a", prefix);
    if (!(v->pack_a = (mpt_cpu_pack_fn)mpt_cpu_jit_lookup(g->jit, name, err, n)))
        return -1;
    snprintf(name, sizeof name, "%s_pack_b", prefix);
    if (!(v->pack_b = (mpt_cpu_pack_fn)mpt_cpu_jit_lookup(g->jit, name, err, n)))
        return -1;
    snprintf(name, sizeof name, "%s_macro", prefix);
    if (!(v->macro = (mpt_cpu_macro_fn)mpt_cpu_jit_lookup(g->jit, name, err, n)))
        return -1;
    return 0;
}

mpt_cpu_gemm *mpt_cpu_gemm_compile(mpt_cpu_jit *j, const mpt_cpu_gemm_desc *desc, char *err,
                                   size_t n) {
    mpt_cpu_gemm *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, n, "out of memory compiling a CPU GEMM");
        return NULL;
    }
    g->d = *desc;
    g->jit = j;
    choose_shape(j, desc, 0, &g->v[WIDE]);
    if (check_desc(desc, &g->v[WIDE].s, err, n) || build_variant(g, WIDE, err, n))
        goto fail;
    /* gathering, the narrow tile keeps the wide one's rows (MPT_CPU_GATHER_MR row
     * offsets live in registers) */
    g->narrow_ok = g->v[WIDE].s.vl == 16 && !g->v[WIDE].s.pair;
    const char *sk = getenv("MPT_CPU_GEMM_SPLIT_K");
    g->split_k_ok = !(sk && !strcmp(sk, "0"));
    return g;
fail:
    mpt_cpu_gemm_free(g);
    return NULL;
}

static void free_bufs(mpt_cpu_gemm *g) {
    for (int i = 0; i < g->n_bufs; i++) {
        free(g->bufs[i].a);
        free(g->bufs[i].b);
        free(g->bufs[i].scratch);
        free(g->bufs[i].fill);
    }
    free(g->bufs);
    g->bufs = NULL;
    g->n_bufs = 0;
    free(g->ksum);
    g->ksum = NULL;
    g->ksum_floats = 0;
}

void mpt_cpu_gemm_free(mpt_cpu_gemm *g) {
    if (!g)
        return;
    free_bufs(g);
    free(g->ir_text);
    free(g->asm_text);
    free(g);
}

const char *mpt_cpu_gemm_text(const mpt_cpu_gemm *g, const char *what) {
    if (!strcmp(what, "ir"))
        return g->ir_text;
    if (!strcmp(what, "asm"))
        return g->asm_text;
    return NULL;
}

void mpt_cpu_gemm_blocking(const mpt_cpu_gemm *g, int *mr, int *nr, int *kc, int *mc, int *nc) {
    const variant *v = &g->v[WIDE];
    *mr = v->s.mr;
    *nr = v->s.nr;
    *kc = v->kc;
    *mc = v->mc;
    *nc = v->nc;
}

/* ---- running ---- */

typedef struct {
    mpt_cpu_gemm *g;
    const variant *v;
    int64_t M, N, K;
    const char *A, *B;
    char *C;
    int64_t a_sw, a_sk, b_sw, b_sk, ldc;
    int split_n, n_tasks;
    int a_direct; /* AMX reads A's tiles in place (see mpt_cpu_gemm_run) */
    int64_t tiles; /* register tiles along the split dimension */
    int use_scratch;
    int64_t kc;   /* the k block (choose_kc) */
    int64_t ld_s; /* the row stride of partial sums in scratch: nc, or the task's columns */
    mpt_cpu_epilogue_args epi;
    const mpt_cpu_gemm_source *a_src, *b_src;
    const mpt_cpu_gemm_gather *gather; /* A read through offset tables */
} run_ctx;

/* 4-byte cells per k of a kc block, as the generated packers lay them out. */
static int64_t cells_per_k(const variant *v, int64_t kc) {
    if (!v->s.pair)
        return kc;
    return v->s.amx ? round_up((int)((kc + 1) / 2), 16) : (kc + 1) / 2;
}

/* Packs the [wc, kc] window at (w0, k0) of a source operand sliver by
 * sliver: each sliver is filled into the thread's fill buffer (runs along
 * w: kc rows of `width`; along k: `width` rows of kc) and packed from
 * there while it is in cache. */
static void pack_source(const variant *v, mpt_cpu_pack_fn pack, const mpt_cpu_gemm_source *src,
                        int width, int64_t w0, int64_t k0, int64_t wc, int64_t kc,
                        thread_buf *buf, char *dst) {
    if (v->s.amx && pack == v->pack_a && !src->w_runs) {
        /* AMX's A sliver is width rows of kp elements, k contiguous: what
         * a run along k already is, so the source writes it in place. Only
         * k past kc is zeroed: rows past wc give rows of C that are never
         * stored, and rows of a product do not mix. */
        int64_t kp = 2 * cells_per_k(v, kc);
        size_t es = 2, row = (size_t)kp * es;
        src->fill(src->ctx, w0, wc, k0, kc, dst, kp, 1);
        if (kp > kc)
            for (int64_t r = 0; r < wc; r++)
                memset(dst + (size_t)r * row + (size_t)kc * es, 0, (size_t)(kp - kc) * es);
        return;
    }
    size_t sliver = (size_t)(width * cells_per_k(v, kc)) * 4;
    if (v->s.amx && pack == v->pack_b && src->fill_pairs) {
        /* the source writes AMX's B slivers, k in pairs, itself */
        for (int64_t t = 0; t * width < wc; t++) {
            int64_t n = wc - t * width < width ? wc - t * width : width;
            src->fill_pairs(src->ctx, w0 + t * width, n, k0, kc, dst + (size_t)t * sliver, width,
                            2 * cells_per_k(v, kc));
        }
        return;
    }
    /* runs along w are one sliver wide: fill several slivers at once so
     * that each run is longer, as far as the fill buffer holds them */
    int64_t group = src->w_runs ? (int64_t)(buf->fill_bytes / ((size_t)(width * kc) * 4)) : 1;
    if (group < 1)
        group = 1;
    int64_t gw = group * width;
    int64_t sw = src->w_runs ? 1 : kc, sk = src->w_runs ? gw : 1;
    for (int64_t g0 = 0; g0 < wc; g0 += gw) {
        int64_t gn = wc - g0 < gw ? wc - g0 : gw;
        src->fill(src->ctx, w0 + g0, gn, k0, kc, buf->fill, sw, sk);
        for (int64_t t = 0; t * width < gn; t++) {
            int64_t n = gn - t * width < width ? gn - t * width : width;
            pack(buf->fill, sw, sk, t * width, 0, n, kc, dst + (size_t)(g0 / width + t) * sliver);
        }
    }
}

static void run_task(void *vctx, int task, int thread) {
    run_ctx *x = vctx;
    mpt_cpu_gemm *g = x->g;
    const variant *v = x->v;
    thread_buf *buf = &g->bufs[thread];
    int unit = x->split_n ? v->s.nr : v->s.mr;
    int64_t t0 = x->tiles * task / x->n_tasks, t1 = x->tiles * (task + 1) / x->n_tasks;
    int64_t m0 = 0, m1 = x->M, n0 = 0, n1 = x->N;
    int64_t lo = t0 * unit, hi = t1 * unit;
    if (x->split_n) {
        n0 = lo;
        n1 = hi < x->N ? hi : x->N;
    } else {
        m0 = lo;
        m1 = hi < x->M ? hi : x->M;
    }
    if (m0 >= m1 || n0 >= n1)
        return;
    size_t csize = mpt_dtype_size(g->d.c_dt);
    /* In place only where A's elements feed few tiles: with a wide N the
     * packed copy (streamed in once, then hot in L2) beats tile loads
     * pulling A's rows from memory (512 x 512 x 1024: 7% slower in place;
     * N = 64-128: 12% faster, N = 256 even). */
    int a_direct = x->a_direct && n1 - n0 <= 256;
    for (int64_t jc = n0; jc < n1; jc += v->nc) {
        int64_t nc = n1 - jc < v->nc ? n1 - jc : v->nc;
        int64_t pc = 0;
        do {
            int64_t kc = x->K - pc < x->kc ? x->K - pc : x->kc;
            if (x->b_src)
                pack_source(v, v->pack_b, x->b_src, v->s.nr, jc, pc, nc, kc, buf, buf->b);
            else
                v->pack_b(x->B, x->b_sw, x->b_sk, jc, pc, nc, kc, buf->b);
            int first = pc == 0, last = pc + kc >= x->K;
            for (int64_t ic = m0; ic < m1; ic += v->mc) {
                int64_t mc = m1 - ic < v->mc ? m1 - ic : v->mc;
                const void *ap = buf->a;
                int64_t a_row_bytes = 0;
                if (x->gather) {
                    ap = x->gather->row + ic;
                    a_row_bytes = x->gather->tile_stride;
                } else if (a_direct) {
                    ap = (const char *)x->A + (size_t)(ic * x->a_sw + pc) * 2;
                    a_row_bytes = x->a_sw * 2;
                } else if (x->a_src)
                    pack_source(v, v->pack_a, x->a_src, v->s.mr, ic, pc, mc, kc, buf,
                                buf->a);
                else
                    v->pack_a(x->A, x->a_sw, x->a_sk, ic, pc, mc, kc, buf->a);
                /* where partial sums between k blocks live */
                float *acc = x->use_scratch ? buf->scratch + (ic - m0) * x->ld_s
                                            : (float *)(x->C + (ic * x->ldc + jc) * 4);
                int64_t ld_acc = x->use_scratch ? x->ld_s : x->ldc;
                const float *prior = NULL;
                int64_t ldp = 0;
                if (!first) {
                    prior = acc;
                    ldp = ld_acc;
                } else if (g->d.accumulate) {
                    prior = (const float *)(x->C + (ic * x->ldc + jc) * 4);
                    ldp = x->ldc;
                }
                const void *a_base = x->gather ? x->gather->base : NULL;
                const int64_t *a_col = x->gather ? x->gather->col + pc : NULL;
                const int64_t *a_krange =
                    x->gather && x->gather->k_range ? x->gather->k_range + 4 * ic : NULL;
                int64_t k_run = x->gather ? x->gather->k_run : 0;
                /* with C's rows through a table, the final stores add
                 * each row's offset to C's column jc */
                size_t c_at = (size_t)((g->d.c_rows ? 0 : ic * x->ldc) + jc) * csize;
                if (last)
                    v->macro(ap, buf->b, mc, nc, kc, prior, ldp, x->C + c_at, x->ldc, 1, ic, jc,
                             &x->epi, a_row_bytes, a_base, a_col, a_krange, pc, k_run);
                else
                    v->macro(ap, buf->b, mc, nc, kc, prior, ldp, acc, ld_acc, 0, ic, jc,
                             &x->epi, a_row_bytes, a_base, a_col, a_krange, pc, k_run);
            }
            pc += kc;
        } while (pc < x->K);
    }
}

/* Task t of a GEMM split along K: k in [K t / T, K (t+1) / T) (cut at
 * multiples of 32, whole AMX tiles and bf16 pairs), every row and column,
 * into C (t = 0) or its own sums. */
typedef struct {
    const run_ctx *x;
    int n_tasks;
    float *sums;
} ksplit_ctx;

static void ksplit_task(void *vctx, int task, int thread) {
    const ksplit_ctx *kx = vctx;
    run_ctx t = *kx->x;
    int64_t k0 = t.K * task / kx->n_tasks / 32 * 32;
    int64_t k1 = task + 1 < kx->n_tasks ? t.K * (task + 1) / kx->n_tasks / 32 * 32 : t.K;
    size_t ea = mpt_dtype_size(t.g->d.a_dt), eb = mpt_dtype_size(t.g->d.b_dt);
    t.A += (size_t)(k0 * t.a_sk) * ea;
    t.B += (size_t)(k0 * t.b_sk) * eb;
    t.K = k1 - k0;
    t.a_direct = t.a_direct && t.K % 32 == 0;
    if (task) {
        t.C = (char *)(kx->sums + (size_t)(task - 1) * (size_t)(t.M * t.N));
        t.ldc = t.N;
    }
    t.n_tasks = 1;
    if (t.K > 0)
        run_task(&t, 0, thread);
    else if (task) /* nothing of K here: zero sums */
        memset(t.C, 0, (size_t)(t.M * t.N) * 4);
}

static void *alloc64(size_t bytes) {
    return aligned_alloc(64, (bytes + 63) / 64 * 64);
}

/* Per-thread packing and scratch buffers, kept between runs and grown to
 * what variant v needs. */
static int ensure_bufs(mpt_cpu_gemm *g, const variant *v, int64_t kc, int threads,
                       size_t scratch_floats, size_t fill_bytes, char *err, size_t n) {
    if (g->n_bufs < threads) {
        free_bufs(g);
        g->bufs = calloc((size_t)threads, sizeof *g->bufs);
        if (!g->bufs)
            goto oom;
        g->n_bufs = threads;
    }
    size_t cells = (size_t)cells_per_k(v, kc);
    size_t a_bytes = (size_t)v->mc * cells * 4, b_bytes = (size_t)v->nc * cells * 4;
    for (int i = 0; i < threads; i++) {
        thread_buf *b = &g->bufs[i];
        if (b->a_bytes < a_bytes) {
            free(b->a);
            b->a = alloc64(a_bytes);
            b->a_bytes = b->a ? a_bytes : 0;
        }
        if (b->b_bytes < b_bytes) {
            free(b->b);
            b->b = alloc64(b_bytes);
            b->b_bytes = b->b ? b_bytes : 0;
        }
        if (b->scratch_floats < scratch_floats) {
            free(b->scratch);
            b->scratch = alloc64(scratch_floats * 4);
            b->scratch_floats = b->scratch ? scratch_floats : 0;
        }
        if (b->fill_bytes < fill_bytes) {
            free(b->fill);
            b->fill = alloc64(fill_bytes);
            b->fill_bytes = b->fill ? fill_bytes : 0;
        }
        if (!b->a || !b->b || (scratch_floats && !b->scratch) || (fill_bytes && !b->fill))
            goto oom;
    }
    return 0;
oom:
    snprintf(err, n, "out of memory for CPU GEMM buffers (%d threads)", threads);
    return -1;
}

/* Fraction of the computed columns that are real when N is cut in tiles of nr. */
static double n_efficiency(int64_t N, int nr) {
    return (double)N / (double)((N + nr - 1) / nr * nr);
}

static int overlaps(const void *p, const void *base, size_t bytes) {
    const char *c = p, *b = base;
    return p && c >= b && c < b + bytes;
}

int mpt_cpu_gemm_run(mpt_cpu_gemm *g, mpt_pool *pool, int64_t M, int64_t N, int64_t K,
                     const void *A, int64_t lda, const void *B, int64_t ldb, void *C,
                     int64_t ldc, const mpt_cpu_epilogue_args *epi, char *err, size_t n) {
    return mpt_cpu_gemm_run_src(g, pool, M, N, K, NULL, A, lda, NULL, B, ldb, C, ldc, epi, err,
                                n);
}

/* Which variant a run with N columns takes (building NARROW on first need). */
static int pick_variant(mpt_cpu_gemm *g, int64_t N, char *err, size_t n) {
    if (!g->narrow_ok || n_efficiency(N, NARROW_NR) <= n_efficiency(N, g->v[WIDE].s.nr) + 0.1)
        return WIDE;
    if (!g->has_narrow) {
        if (build_variant(g, NARROW, err, n))
            return -1;
        g->has_narrow = 1;
    }
    return NARROW;
}

int mpt_cpu_gemm_prepare(mpt_cpu_gemm *g, int64_t N, char *err, size_t n) {
    return pick_variant(g, N, err, n) < 0 ? -1 : 0;
}

/* The k block of a run. AMX: all of K in one block where B's block for a
 * task's columns (and A's, where A is packed) fit in MPT_CPU_AMX_K_BYTES
 * (1.25 MiB by default, of a core's 2 MiB of L2): every further block
 * stores the f32 partial sums of the whole of C and loads them back, which
 * cost more than the shorter block's cache reuse saves. ResNet-50's 3x3
 * convolutions of stage 3 (K = 1152 = 1024 + 128 with the fixed block):
 * forward 2.6-2.8 -> 1.9 ms at one thread. Otherwise the ISA's kc. */
static int64_t choose_kc(const variant *v, int64_t K, int64_t cols, int a_packed) {
    int64_t kc = v->kc;
    if (!v->s.amx && !a_packed && v->s.vl == 16 && K > kc) {
        /* a gathered A (AVX-512 f32): k blocks of equal length up to 1.5
         * kc, each further block being a pass of partial sums through C:
         * ResNet-50's stage 3 3x3 (K = 1152) in one block, not 1024 + 128
         * (3-4% faster in the whole model's profile, even on the layer
         * alone), stage 4's 2304 in two */
        int64_t nb = (K + kc * 3 / 2 - 1) / (kc * 3 / 2), even = (K + nb - 1) / nb;
        return (even + 1) / 2 * 2;
    }
    if (!v->s.amx || K <= kc)
        return kc;
    const char *env = getenv("MPT_CPU_AMX_K_BYTES");
    int64_t budget = env && *env ? atoll(env) : (int64_t)5 << 18;
    int64_t kw = (K + 31) / 32 * 32;
    if (cols > v->nc)
        cols = v->nc;
    int64_t bytes = kw * 2 * (cols + (a_packed ? v->mc : 0));
    return bytes <= budget ? kw : kc;
}

static int run(mpt_cpu_gemm *g, mpt_pool *pool, int64_t M, int64_t N, int64_t K,
               const mpt_cpu_gemm_source *a_src, const mpt_cpu_gemm_gather *gather,
               const void *A, int64_t lda, const mpt_cpu_gemm_source *b_src, const void *B,
               int64_t ldb, void *C, int64_t ldc, const mpt_cpu_epilogue_args *epi, char *err,
               size_t n) {
    if (M <= 0 || N <= 0)
        return 0;
    if (!gather != !(g->d.a_gather || g->d.a_tiles) ||
        (gather && g->d.a_tiles && (gather->tile_stride <= 0 || K % 32))) {
        snprintf(err, n, "CPU GEMM: %s", gather ? "compiled without a_gather, run with a "
                                                  "gathered A (or A's tiles without a stride, "
                                                  "or K not a multiple of 32)"
                                                : "compiled with a_gather, run without its "
                                                  "offset tables");
        return -1;
    }
    if (K < 0)
        K = 0;
    const mpt_cpu_gemm_desc *d = &g->d;
    if (d->a_pairs && K % 2) {
        /* a pair's second element would be the next row's first */
        snprintf(err, n, "CPU GEMM: A read in pairs (a_pairs) with an odd K = %lld", (long long)K);
        return -1;
    }
    if (d->c_rows && (!epi || !epi->c_row || d->accumulate)) {
        snprintf(err, n, "CPU GEMM: compiled with C's rows through a table, run without one");
        return -1;
    }
    int which = pick_variant(g, N, err, n);
    if (which < 0)
        return -1;
    const variant *v = &g->v[which];
    if ((a_src && !a_src->fill) || (b_src && !b_src->fill && !(v->s.amx && b_src->fill_pairs))) {
        snprintf(err, n, "CPU GEMM: a source operand without a fill for this variant");
        return -1;
    }
    if (d->a_tiles && v->kc % 32) {
        snprintf(err, n, "CPU GEMM: A read a tile at a time needs kc a multiple of 32, not %d",
                 v->kc);
        return -1;
    }
    run_ctx x = {.g = g, .v = v, .M = M, .N = N, .K = K, .A = A, .B = B, .C = C,
                 .a_src = a_src, .b_src = b_src, .gather = gather};
    if (!lda)
        lda = d->trans_a ? M : K;
    if (!ldb)
        ldb = d->trans_b ? K : N;
    x.ldc = ldc ? ldc : N;
    /* element (i, p) of A is A[i*a_sw + p*a_sk]; element (j, p) of B likewise */
    x.a_sw = d->trans_a ? 1 : lda;
    x.a_sk = d->trans_a ? lda : 1;
    x.b_sw = d->trans_b ? ldb : 1;
    x.b_sk = d->trans_b ? 1 : ldb;
    if (epi)
        x.epi = *epi;
    int aliased = 0;
    size_t c_bytes = (size_t)(M * x.ldc) * mpt_dtype_size(d->c_dt);
    for (int i = 0; i < d->n_steps; i++) {
        if (!x.epi.step[i].ld)
            x.epi.step[i].ld = N;
        aliased |= overlaps(x.epi.step[i].ptr, C, c_bytes);
    }
    /* the finite check's column flags start true; the kernel only clears */
    int finite = d->n_steps && d->steps[d->n_steps - 1].op == MPT_CPU_EPI_FINITE;
    if (finite) {
        if (!x.epi.step[d->n_steps - 1].ptr) {
            snprintf(err, n, "CPU GEMM: the finite check was run without its column flags");
            return -1;
        }
        memset((void *)x.epi.step[d->n_steps - 1].ptr, 1, (size_t)N);
    }
    int threads = mpt_pool_threads(pool);
    int64_t n_tiles = (N + v->s.nr - 1) / v->s.nr, m_tiles = (M + v->s.mr - 1) / v->s.mr;
    /* Splitting N makes every thread pack all of A, splitting M all of B:
     * split the one whose redundant packing is smaller, if it has a tile per thread. */
    x.split_n = (M <= N && n_tiles >= threads) || m_tiles < threads;
    /* a gathered A costs nothing to read twice: split N where it divides
     * evenly, so that each thread packs only its share of B */
    if (gather && n_tiles >= threads && n_tiles % threads == 0)
        x.split_n = 1;
    x.tiles = x.split_n ? n_tiles : m_tiles;
    x.n_tasks = x.tiles < threads ? (int)x.tiles : threads;
    /* a task's columns, and the stride of its partial sums' rows */
    int64_t cols = x.split_n ? (n_tiles + x.n_tasks - 1) / x.n_tasks * v->s.nr
                             : n_tiles * v->s.nr;
    x.ld_s = cols < v->nc ? cols : v->nc;
    x.kc = choose_kc(v, K, cols, !gather);

    /* C can hold partial sums only if it is f32, no epilogue operand is
     * read from it after the first k block has overwritten it, and its
     * rows are the GEMM's (through a table, a final store would land on
     * another row's partial sums) */
    x.use_scratch = K > x.kc && (d->c_dt != MPT_DT_F32 || aliased || d->c_rows);

    /* AMX tiles load rows of 32 consecutive k at any row stride, so an A
     * whose k is contiguous can be read without packing when every tile is
     * whole: 32 rows (M % 32 == 0) and 32 k (K and kc multiples of 32, so
     * no tile row reads past its k block). */
    x.a_direct = v->s.amx && !a_src && !gather && x.a_sk == 1 && M % v->s.mr == 0 && K % 32 == 0 &&
                 x.kc % 32 == 0;
    int64_t rows = x.split_n ? M : (m_tiles + x.n_tasks - 1) / x.n_tasks * v->s.mr;
    size_t scratch = x.use_scratch ? (size_t)rows * (size_t)x.ld_s : 0;
    /* a sliver of a source operand: width rows of kc elements, 4 bytes at most */
    int wa = a_src && !gather ? v->s.mr : 0, wb = b_src ? v->s.nr : 0;
    size_t fill = (size_t)(wa > wb ? wa : wb) * (size_t)x.kc * 4;
    /* room for several slivers when runs go along w (pack_source): 256 KiB
     * measured as good as 512 KiB-1 MiB, and far better than one sliver,
     * on the convnet's filter gradients */
    if (fill && (size_t)(256 << 10) > fill)
        fill = (size_t)(256 << 10) / fill * fill;
    if (ensure_bufs(g, v, x.kc, threads, scratch, fill, err, n))
        return -1;
    /* A filter gradient's GEMM (M x N a weight, K the positions): split
     * along N or M, every thread packs all of the other operand; along K,
     * each packs its share of both, and the sums are added after
     * (ResNet-50's 1x1 shapes, 2 threads: 2-37% faster, 64 x 64 x 25088
     * most). */
    if (g->split_k_ok && threads > 1 && d->c_dt == MPT_DT_F32 && d->n_steps == finite && !d->accumulate &&
        !d->c_rows &&
        !a_src && !b_src && !gather && K >= (int64_t)threads * x.kc &&
        K >= 8 * (M > N ? M : N) && M * N <= (1 << 20)) {
        size_t need = (size_t)(threads - 1) * (size_t)(M * N);
        if (g->ksum_floats < need) {
            free(g->ksum);
            g->ksum = alloc64(need * 4);
            g->ksum_floats = g->ksum ? need : 0;
        }
        if (g->ksum) {
            x.split_n = 1;
            x.tiles = n_tiles;
            ksplit_ctx kx = {&x, threads, g->ksum};
            mpt_pool_run(pool, threads, ksplit_task, &kx);
            /* (each task checked its own part; the sums are checked again,
             * since finite parts may add up to an infinity) */
            unsigned char *flag = finite ? (unsigned char *)x.epi.step[d->n_steps - 1].ptr : NULL;
            for (int64_t i = 0; i < M; i++) {
                float *c = (float *)(x.C + (size_t)(i * x.ldc) * 4);
                for (int t = 1; t < threads; t++) {
                    const float *p = g->ksum + (size_t)(t - 1) * (size_t)(M * N) + i * N;
                    for (int64_t j = 0; j < N; j++)
                        c[j] += p[j];
                }
                if (flag)
                    for (int64_t j = 0; j < N; j++)
                        if (!isfinite(c[j]))
                            flag[j] = 0;
            }
            return 0;
        }
    }
    mpt_pool_run(pool, x.n_tasks, run_task, &x);
    return 0;
}

int mpt_cpu_gemm_run_src(mpt_cpu_gemm *g, mpt_pool *pool, int64_t M, int64_t N, int64_t K,
                         const mpt_cpu_gemm_source *a_src, const void *A, int64_t lda,
                         const mpt_cpu_gemm_source *b_src, const void *B, int64_t ldb, void *C,
                         int64_t ldc, const mpt_cpu_epilogue_args *epi, char *err, size_t n) {
    return run(g, pool, M, N, K, a_src, NULL, A, lda, b_src, B, ldb, C, ldc, epi, err, n);
}

int mpt_cpu_gemm_run_gather(mpt_cpu_gemm *g, mpt_pool *pool, int64_t M, int64_t N, int64_t K,
                            const mpt_cpu_gemm_gather *a, const void *B, int64_t ldb, void *C,
                            int64_t ldc, const mpt_cpu_epilogue_args *epi, char *err, size_t n) {
    return run(g, pool, M, N, K, NULL, a, NULL, 0, NULL, B, ldb, C, ldc, epi, err, n);
}

int mpt_cpu_gemm_run_gather_src(mpt_cpu_gemm *g, mpt_pool *pool, int64_t M, int64_t N, int64_t K,
                                const mpt_cpu_gemm_gather *a, const mpt_cpu_gemm_source *b_src,
                                void *C, int64_t ldc, const mpt_cpu_epilogue_args *epi, char *err,
                                size_t n) {
    return run(g, pool, M, N, K, NULL, a, NULL, 0, b_src, NULL, 0, C, ldc, epi, err, n);
}
