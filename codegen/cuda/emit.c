/* codegen/cuda/emit.c — the element emitter (one expression template per
 * op, composed node by node), LOOP kernels, and the dispatch by kernel kind.
 *
 * The generated code includes no CUDA header: NVRTC ships no cuda_fp16.h of
 * its own (it needs the toolkit's include directory, which a machine with
 * only the driver and libnvrtc lacks), so f16/bf16 are 16-bit words here and
 * their conversions are the PTX instructions themselves (cvt.rn.f16.f32,
 * cvt.f32.f16, cvt.rn.bf16.f32), which is what cuda_fp16.h's intrinsics
 * compile to anyway.
 */
#include <assert.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cuda_internal.h"

/* ---- strings ---- */

void mpt_sb_printf(mpt_sb *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int w = vsnprintf(b->s ? b->s + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (w < 0) { b->oom = 1; return; }
        if ((size_t)w < room) { b->len += (size_t)w; return; }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap - b->len <= (size_t)w) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) { b->oom = 1; return; }
        b->s = s;
        b->cap = cap;
    }
}

char *mpt_sb_take(mpt_sb *b) {
    char *s = b->oom ? NULL : b->s;
    if (b->oom) free(b->s);
    if (s == NULL && !b->oom) s = calloc(1, 1);
    memset(b, 0, sizeof *b);
    return s;
}

/* ---- prelude ---- */

const char mpt_cu_prelude[] =
    "typedef unsigned short mpt_half;  /* IEEE binary16 bits */\n"
    "typedef unsigned short mpt_bf16;  /* bfloat16 bits */\n"
    "typedef unsigned char mpt_bool;\n"
    "/* four elements of a LOOP kernel's vector loop in one load or store */\n"
    "struct __align__(16) mpt_v4f { float x, y, z, w; };\n"
    "struct __align__(16) mpt_v4i { int x, y, z, w; };\n"
    "struct __align__(8) mpt_v2u { unsigned x, y; };\n"
    "__device__ __forceinline__ float mpt_h2f(mpt_half h) {\n"
    "    float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f;\n}\n"
    "__device__ __forceinline__ mpt_half mpt_f2h(float f) {\n"
    "    mpt_half h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h;\n}\n"
    "__device__ __forceinline__ float mpt_b2f(mpt_bf16 h) {\n"
    "    return __uint_as_float(((unsigned)h) << 16);\n}\n"
    "__device__ __forceinline__ mpt_bf16 mpt_f2b(float f) {\n"
    "    mpt_bf16 h; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h;\n}\n"
    "/* 16 bytes from global to shared memory, past the registers and L1;\n"
    " * zeros where !v (no byte is read then). The copies a thread issued\n"
    " * land at its mpt_cp_wait: all but the N groups committed last. */\n"
    "__device__ __forceinline__ void mpt_cp16(void *dst, const void *src, bool v) {\n"
    "    const unsigned d = (unsigned)__cvta_generic_to_shared(dst), n = v ? 16u : 0u;\n"
    "    asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\" :: \"r\"(d), \"l\"(src), \"r\"(n));\n}\n"
    "__device__ __forceinline__ void mpt_cp_commit() { asm volatile(\"cp.async.commit_group ;\" ::); }\n"
    "template <int N> __device__ __forceinline__ void mpt_cp_wait() {\n"
    "    asm volatile(\"cp.async.wait_group %0;\" :: \"n\"(N));\n}\n"
    "/* a value rounded to f16/bf16 and widened back, as the interpreter rounds */\n"
    "__device__ __forceinline__ float mpt_rh(float f) { return mpt_h2f(mpt_f2h(f)); }\n"
    "__device__ __forceinline__ float mpt_rb(float f) { return mpt_b2f(mpt_f2b(f)); }\n"
    "__device__ __forceinline__ int mpt_isfinite(float f) {\n"
    "    return (__float_as_uint(f) & 0x7f800000u) != 0x7f800000u;\n}\n"
    "/* splitmix64, as ir/interp_impl.h's mpt_mix64 */\n"
    "__device__ __forceinline__ unsigned long long mpt_mix64(unsigned long long x) {\n"
    "    unsigned long long z = x + 0x9E3779B97F4A7C15ull;\n"
    "    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;\n"
    "    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;\n"
    "    return z ^ (z >> 31);\n}\n"
    "/* ir/interp_impl.h's mpt_random_bits; its `keep` high bits (24 for f32,\n"
    " * 11 for f16, 8 for bf16) scaled to [0,1), exactly as ir/interp_ops.c */\n"
    "__device__ __forceinline__ float mpt_uniform(long long seed, int counter, long long i, int keep) {\n"
    "    unsigned long long h = mpt_mix64((unsigned long long)seed);\n"
    "    h = mpt_mix64(h ^ (unsigned long long)(unsigned)counter);\n"
    "    h = mpt_mix64(h ^ (unsigned long long)i);\n"
    "    return (float)(h >> (64 - keep)) * __int_as_float((127 - keep) << 23);\n}\n"
    "__device__ __forceinline__ float mpt_warp_sum(float v) {\n"
    "    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "    return v;\n}\n"
    "__device__ __forceinline__ float mpt_warp_max(float v) {\n"
    "    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "    return v;\n}\n"
    "__device__ __forceinline__ int mpt_warp_sum(int v) {\n"
    "    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "    return v;\n}\n"
    "__device__ __forceinline__ int mpt_warp_max(int v) {\n"
    "    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "    return v;\n}\n"
    "__device__ __forceinline__ int mpt_warp_and(int v) {\n"
    "    return __all_sync(0xffffffffu, v);\n}\n";

/* ---- dtypes ---- */

const char *mpt_cu_ctype(mpt_dtype dt) {
    switch (dt) {
    case MPT_DT_F32: return "float";
    case MPT_DT_F16: return "mpt_half";
    case MPT_DT_BF16: return "mpt_bf16";
    case MPT_DT_I32: return "int";
    case MPT_DT_BOOL: return "mpt_bool";
    case MPT_DT_F64: return NULL; /* interpreter only */
    case MPT_DT_COUNT: break;
    }
    assert(!"mpt_cu_ctype: dtype is none of f32 f16 bf16 i32 bool f64");
    return NULL;
}

const char *mpt_cu_regtype(mpt_dtype dt) {
    switch (dt) {
    case MPT_DT_F32: case MPT_DT_F16: case MPT_DT_BF16: return "float";
    case MPT_DT_I32: case MPT_DT_BOOL: return "int";
    case MPT_DT_F64: return NULL;
    case MPT_DT_COUNT: break;
    }
    assert(!"mpt_cu_regtype: dtype is none of f32 f16 bf16 i32 bool f64");
    return NULL;
}

/* The expression reading buffer p at index idx, widened to a register. */
static void load_expr(mpt_dtype dt, int param, const char *idx, char *buf, size_t n) {
    switch (dt) {
    case MPT_DT_F32: case MPT_DT_I32: snprintf(buf, n, "p%d[%s]", param, idx); return;
    case MPT_DT_F16: snprintf(buf, n, "mpt_h2f(p%d[%s])", param, idx); return;
    case MPT_DT_BF16: snprintf(buf, n, "mpt_b2f(p%d[%s])", param, idx); return;
    case MPT_DT_BOOL: snprintf(buf, n, "(int)p%d[%s]", param, idx); return;
    case MPT_DT_F64: case MPT_DT_COUNT: break;
    }
    assert(!"load_expr: dtype is none of f32 f16 bf16 i32 bool");
}

/* Wraps a freshly computed f32 expression so it is rounded to dt. */
const char *mpt_cu_round_fn(mpt_dtype dt) {
    switch (dt) {
    case MPT_DT_F16: return "mpt_rh";
    case MPT_DT_BF16: return "mpt_rb";
    case MPT_DT_F32: case MPT_DT_I32: case MPT_DT_BOOL: case MPT_DT_F64: return "";
    case MPT_DT_COUNT: break;
    }
    assert(!"mpt_cu_round_fn: dtype is none of f32 f16 bf16 i32 bool f64");
    return "";
}

/* ---- the element generators: op -> expression over $0 $1 $2 ---- */

typedef struct {
    const char *f; /* operands in float registers */
    const char *i; /* operands in int registers (i32, bool); NULL: not defined */
} mpt_cu_tmpl;

static const mpt_cu_tmpl elem_tmpl[MPT_OP_COUNT] = {
    [MPT_OP_NEG] = {"(-$0)", "(-$0)"},
    [MPT_OP_ABS] = {"fabsf($0)", "abs($0)"},
    [MPT_OP_EXP] = {"expf($0)", NULL},
    [MPT_OP_LOG] = {"logf($0)", NULL},
    [MPT_OP_SQRT] = {"sqrtf($0)", NULL},
    [MPT_OP_RSQRT] = {"rsqrtf($0)", NULL},
    [MPT_OP_RECIP] = {"(1.f / $0)", NULL},
    [MPT_OP_SQUARE] = {"($0 * $0)", "($0 * $0)"},
    [MPT_OP_RELU] = {"fmaxf($0, 0.f)", "max($0, 0)"},
    [MPT_OP_SIGMOID] = {"(1.f / (1.f + expf(-$0)))", NULL},
    [MPT_OP_TANH] = {"tanhf($0)", NULL},
    [MPT_OP_SIN] = {"sinf($0)", NULL},
    [MPT_OP_COS] = {"cosf($0)", NULL},
    /* exact gelu x * Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2 */
    [MPT_OP_GELU] = {"(0.5f * $0 * (1.f + erff($0 * 0.70710678f)))", NULL},
    /* Phi(x) + x * phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi) */
    [MPT_OP_GELU_GRAD] = {"(0.5f * (1.f + erff($0 * 0.70710678f)) + "
                          "$0 * 0.39894228f * expf(-0.5f * $0 * $0))", NULL},
    [MPT_OP_IS_FINITE] = {"mpt_isfinite($0)", "1"},
    [MPT_OP_NOT] = {NULL, "(!$0)"},
    [MPT_OP_ADD] = {"($0 + $1)", "($0 + $1)"},
    [MPT_OP_SUB] = {"($0 - $1)", "($0 - $1)"},
    [MPT_OP_MUL] = {"($0 * $1)", "($0 * $1)"},
    [MPT_OP_DIV] = {"($0 / $1)", "($0 / $1)"},
    [MPT_OP_MAX] = {"fmaxf($0, $1)", "max($0, $1)"},
    [MPT_OP_MIN] = {"fminf($0, $1)", "min($0, $1)"},
    [MPT_OP_POW] = {"powf($0, $1)", NULL},
    [MPT_OP_LT] = {"($0 < $1)", "($0 < $1)"},
    [MPT_OP_GT] = {"($0 > $1)", "($0 > $1)"},
    [MPT_OP_EQ] = {"($0 == $1)", "($0 == $1)"},
    [MPT_OP_AND] = {NULL, "($0 && $1)"},
    /* $0 is the bool condition; the template is picked by the result type */
    [MPT_OP_SELECT] = {"($0 ? $1 : $2)", "($0 ? $1 : $2)"},
};

/* Substitutes $0..$2 in t with args into buf. */
static void expand(const char *t, char args[][24], char *buf, size_t n) {
    size_t o = 0;
    for (const char *c = t; *c && o + 1 < n; c++) {
        if (c[0] == '$' && c[1] >= '0' && c[1] <= '2') {
            const char *a = args[c[1] - '0'];
            size_t l = strlen(a);
            if (o + l >= n) break;
            memcpy(buf + o, a, l);
            o += l;
            c++;
        } else {
            buf[o++] = *c;
        }
    }
    buf[o] = 0;
}

/* ---- the emitter ---- */

void mpt_cu_line(mpt_cu_em *e, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    mpt_sb_printf(e->sb, "%*s%s\n", 4 * e->indent, "", line);
}

void mpt_cu_fresh(mpt_cu_em *e, const char *prefix, char *var) {
    snprintf(var, 24, "%s%d", prefix, e->tmp++);
}

void mpt_cu_bind(mpt_cu_em *e, int node, const char *idx, const char *var) {
    if (e->n_memo == e->cap_memo) {
        int cap = e->cap_memo ? 2 * e->cap_memo : 64;
        mpt_cu_memo *m = realloc(e->memo, (size_t)cap * sizeof *m);
        if (!m) { e->err = "out of memory"; return; }
        e->memo = m;
        e->cap_memo = cap;
    }
    mpt_cu_memo *m = &e->memo[e->n_memo++];
    m->node = node;
    snprintf(m->idx, sizeof m->idx, "%s", idx);
    snprintf(m->var, sizeof m->var, "%s", var);
}

static const char *memo_find(const mpt_cu_em *e, int node, const char *idx) {
    for (int i = e->n_memo - 1; i >= 0; i--)
        if (e->memo[i].node == node &&
            (strcmp(e->memo[i].idx, "*") == 0 || strcmp(e->memo[i].idx, idx) == 0))
            return e->memo[i].var;
    return NULL;
}

int64_t mpt_cu_stride(mpt_shape s, int d) {
    int64_t st = 1;
    for (int j = d + 1; j < s.rank; j++) st *= s.dim[j];
    return st;
}

/* A float literal that survives inf and nan. */
static void float_lit(double v, char *buf, size_t n) {
    float f = (float)v;
    if (isfinite(f)) {
        /* "128f" is not a C++ literal; "128.f" is */
        char tmp[64];
        snprintf(tmp, sizeof tmp, "%.9g", f);
        snprintf(buf, n, "%s%sf", tmp, strpbrk(tmp, ".e") ? "" : ".");
    } else {
        uint32_t u;
        memcpy(&u, &f, 4);
        snprintf(buf, n, "__uint_as_float(0x%08xu)", u);
    }
}

/* Emits `idx_out = f(idx)` mapping a BROADCAST's output index to its input's. */
static void broadcast_index(mpt_cu_em *e, const mpt_node *nd, const char *idx, char *out) {
    mpt_shape os = nd->shape, is = e->g->nodes[nd->in[0]].shape;
    if (e->alias_on && strcmp(idx, "e") == 0 && mpt_shape_eq(os, e->alias_shape) &&
        nd->attr.i[0] == e->alias_mask) {
        snprintf(out, 24, "row"); /* a reduction kernel's row value, spread over its row */
        return;
    }
    mpt_cu_fresh(e, "j", out);
    if (mpt_shape_numel(is) == 1) { mpt_cu_line(e, "const long long %s = 0;", out); return; }
    char expr[1024] = "0";
    size_t o = 1;
    int j = 0;
    for (int d = 0; d < os.rank; d++) {
        if (!(nd->attr.i[0] >> d & 1)) continue;
        o += (size_t)snprintf(expr + o, sizeof expr - o, " + (%s / %lldLL %% %lldLL) * %lldLL",
                              idx, (long long)mpt_cu_stride(os, d), (long long)os.dim[d],
                              (long long)mpt_cu_stride(is, j));
        j++;
    }
    mpt_cu_line(e, "const long long %s = %s;", out, expr);
}

/* out dim d is in dim perm[d] */
static void transpose_index(mpt_cu_em *e, const mpt_node *nd, const char *idx, char *out) {
    mpt_shape os = nd->shape, is = e->g->nodes[nd->in[0]].shape;
    char expr[1024] = "0";
    size_t o = 1;
    for (int d = 0; d < os.rank; d++) {
        int p = (int)(nd->attr.i[0] >> (4 * d) & 15);
        o += (size_t)snprintf(expr + o, sizeof expr - o, " + (%s / %lldLL %% %lldLL) * %lldLL",
                              idx, (long long)mpt_cu_stride(os, d), (long long)os.dim[d],
                              (long long)mpt_cu_stride(is, p));
    }
    mpt_cu_fresh(e, "j", out);
    mpt_cu_line(e, "const long long %s = %s;", out, expr);
}

static void cast_expr(mpt_dtype from, mpt_dtype to, const char *a, char *buf, size_t n) {
    int ff = mpt_dtype_is_float(from), ft = mpt_dtype_is_float(to);
    if (ff && ft) snprintf(buf, n, "%s", a);
    else if (ff && to == MPT_DT_BOOL) snprintf(buf, n, "(int)(%s != 0.f)", a);
    else if (ff) snprintf(buf, n, "(int)truncf(%s)", a);
    else if (ft) snprintf(buf, n, "(float)%s", a);
    else if (to == MPT_DT_BOOL) snprintf(buf, n, "(int)(%s != 0)", a);
    else snprintf(buf, n, "%s", a);
}

static void fail(mpt_cu_em *e, int node, const char *why, char *var) {
    if (!e->err) { e->err = why; e->err_node = node; }
    snprintf(var, 24, "0");
}

/* lane l's index variable in the vector loop, or -1 */
static int lane_of(const char *idx) {
    if (idx[0] != 'l' || idx[1] < '0' || idx[1] >= '0' + MPT_CU_LANES || idx[2]) return -1;
    return idx[1] - '0';
}

/* In the vector loop, a buffer of the loop's length read at a lane's
 * index: all lanes in one 16-byte (f32, i32), 8-byte (f16, bf16: two
 * half2 words) or 4-byte (bool) load, each lane bound to its element.
 * 0 when this is not such a read. */
static int vec_load(mpt_cu_em *e, int id, const char *idx, char *var) {
    const mpt_node *nd = &e->g->nodes[id];
    int lane = lane_of(idx);
    if (!e->vec_n || lane < 0 || mpt_shape_numel(nd->shape) != e->vec_n) return 0;
    int p = e->param_of[id];
    char w[24], v[MPT_CU_LANES][24];
    mpt_cu_fresh(e, "w", w);
    const char *rt = mpt_cu_regtype(nd->dtype), *f = NULL;
    static const char *comp[] = {"x", "y", "z", "w"};
    switch (nd->dtype) {
    case MPT_DT_F32: case MPT_DT_I32: {
        const char *vt = nd->dtype == MPT_DT_F32 ? "mpt_v4f" : "mpt_v4i";
        mpt_cu_line(e, "const %s %s = *(const %s *)(p%d + l0);", vt, w, vt, p);
        for (int l = 0; l < MPT_CU_LANES; l++) {
            mpt_cu_fresh(e, "v", v[l]);
            mpt_cu_line(e, "const %s %s = %s.%s;", rt, v[l], w, comp[l]);
        }
        break;
    }
    case MPT_DT_F16: f = "mpt_h2f"; /* fall through */
    case MPT_DT_BF16:
        if (!f) f = "mpt_b2f";
        mpt_cu_line(e, "const mpt_v2u %s = *(const mpt_v2u *)(p%d + l0);", w, p);
        for (int l = 0; l < MPT_CU_LANES; l++) {
            mpt_cu_fresh(e, "v", v[l]);
            mpt_cu_line(e, "const float %s = %s((unsigned short)(%s.%s%s));", v[l], f, w,
                        comp[l / 2], l % 2 ? " >> 16" : " & 0xffffu");
        }
        break;
    case MPT_DT_BOOL:
        mpt_cu_line(e, "const unsigned %s = *(const unsigned *)(p%d + l0);", w, p);
        for (int l = 0; l < MPT_CU_LANES; l++) {
            mpt_cu_fresh(e, "v", v[l]);
            mpt_cu_line(e, "const int %s = (int)(%s >> %d & 0xffu);", v[l], w, 8 * l);
        }
        break;
    case MPT_DT_F64: case MPT_DT_COUNT: return 0;
    }
    for (int l = 0; l < MPT_CU_LANES; l++) {
        char li[4] = {'l', (char)('0' + l), 0};
        mpt_cu_bind(e, id, li, v[l]);
    }
    memcpy(var, v[lane], strlen(v[lane]) + 1);
    return 1;
}

void mpt_cu_value(mpt_cu_em *e, int id, const char *idx, char *var) {
    const char *hit = memo_find(e, id, idx);
    if (hit) { snprintf(var, 24, "%s", hit); return; }
    const mpt_node *nd = &e->g->nodes[id];
    const char *rt = mpt_cu_regtype(nd->dtype);
    if (!rt) return fail(e, id, "f64 values exist only in the interpreter", var);
    char expr[2048];
    if (nd->op == MPT_OP_CONST) {
        if (rt[0] == 'f') float_lit(nd->attr.f, expr, sizeof expr);
        else snprintf(expr, sizeof expr, "%lld", (long long)nd->attr.f);
        if (strlen(expr) < 24) { /* a short literal needs no variable */
            memcpy(var, expr, strlen(expr) + 1);
            return;
        }
    } else if (nd->op == MPT_OP_IOTA) {
        int ax = (int)nd->attr.i[0];
        snprintf(expr, sizeof expr, "(%s)(%s / %lldLL %% %lldLL)", rt, idx,
                 (long long)mpt_cu_stride(nd->shape, ax), (long long)nd->shape.dim[ax]);
    } else if (!e->in_kernel[id]) {
        if (e->param_of[id] < 0) return fail(e, id, "value has no buffer", var);
        if (vec_load(e, id, idx, var)) return;
        load_expr(nd->dtype, e->param_of[id], idx, expr, sizeof expr);
    } else if (nd->op == MPT_OP_RANDOM_UNIFORM) {
        char c[24];
        mpt_cu_value(e, nd->in[0], "0", c);
        int keep = nd->dtype == MPT_DT_F16 ? 11 : nd->dtype == MPT_DT_BF16 ? 8 : 24;
        /* a data-parallel rank's slice of the global batch's draws */
        long long at = (long long)mpt_collective_get()->rank * (long long)nd->attr.i[1];
        if (at)
            snprintf(expr, sizeof expr, "mpt_uniform(%lldLL, %s, (%s) + %lldLL, %d)",
                     (long long)nd->attr.i[0], c, idx, at, keep);
        else
            snprintf(expr, sizeof expr, "mpt_uniform(%lldLL, %s, %s, %d)", (long long)nd->attr.i[0],
                     c, idx, keep);
    } else if (nd->op == MPT_OP_BROADCAST || nd->op == MPT_OP_TRANSPOSE) {
        char j[24];
        if (nd->op == MPT_OP_BROADCAST) broadcast_index(e, nd, idx, j);
        else transpose_index(e, nd, idx, j);
        mpt_cu_value(e, nd->in[0], j, var);
        mpt_cu_bind(e, id, idx, var);
        return;
    } else if (nd->op == MPT_OP_RESHAPE) {
        mpt_cu_value(e, nd->in[0], idx, var); /* row-major: same linear index */
        mpt_cu_bind(e, id, idx, var);
        return;
    } else if (nd->op == MPT_OP_CAST) {
        char a[24];
        mpt_cu_value(e, nd->in[0], idx, a);
        char c[1900];
        cast_expr(e->g->nodes[nd->in[0]].dtype, nd->dtype, a, c, sizeof c);
        snprintf(expr, sizeof expr, "%s(%s)", mpt_cu_round_fn(nd->dtype), c);
    } else if (mpt_op_table[nd->op].kind == MPT_KIND_ELEMENTWISE) {
        char args[MPT_MAX_INPUTS][24];
        for (int k = 0; k < nd->n_in; k++) mpt_cu_value(e, nd->in[k], idx, args[k]);
        /* the operands' register type picks the template (select: its values') */
        const mpt_node *op0 = &e->g->nodes[nd->in[nd->op == MPT_OP_SELECT ? 1 : 0]];
        int ints = mpt_cu_regtype(op0->dtype) && mpt_cu_regtype(op0->dtype)[0] == 'i';
        const char *t = ints ? elem_tmpl[nd->op].i : elem_tmpl[nd->op].f;
        if (!t) return fail(e, id, "op has no CUDA element generator for this dtype", var);
        char c[1900];
        expand(t, args, c, sizeof c);
        snprintf(expr, sizeof expr, "%s(%s)", mpt_cu_round_fn(nd->dtype), c);
    } else if (!mpt_cu_value_movement(e, id, idx, expr, sizeof expr)) {
        return fail(e, id, "op cannot be computed element by element in this kernel", var);
    }
    mpt_cu_fresh(e, "v", var);
    mpt_cu_line(e, "const %s %s = %s;", rt, var, expr);
    mpt_cu_bind(e, id, idx, var);
}

void mpt_cu_store(mpt_cu_em *e, int node, const char *idx, const char *value) {
    int p = e->param_of[node];
    switch (e->g->nodes[node].dtype) {
    case MPT_DT_F32: case MPT_DT_I32: mpt_cu_line(e, "p%d[%s] = %s;", p, idx, value); return;
    case MPT_DT_F16: mpt_cu_line(e, "p%d[%s] = mpt_f2h(%s);", p, idx, value); return;
    case MPT_DT_BF16: mpt_cu_line(e, "p%d[%s] = mpt_f2b(%s);", p, idx, value); return;
    case MPT_DT_BOOL: mpt_cu_line(e, "p%d[%s] = (mpt_bool)(%s != 0);", p, idx, value); return;
    case MPT_DT_F64: case MPT_DT_COUNT: break;
    }
    if (!e->err) { e->err = "f64 values exist only in the interpreter"; e->err_node = node; }
}

static int folded(const mpt_node *nd) {
    return nd->op == MPT_OP_CONST || nd->op == MPT_OP_IOTA;
}

int mpt_cu_em_init(mpt_cu_em *e, const mpt_plan *p, int k, mpt_sb *sb,
                   mpt_cuda_kernel_src *out) {
    memset(e, 0, sizeof *e);
    e->g = p->g;
    e->k = &p->kernels[k];
    e->tf32 = p->tf32;
    e->sb = sb;
    e->err_node = -1;
    int nn = p->g->n_nodes;
    e->in_kernel = calloc((size_t)nn, 1);
    e->param_of = malloc((size_t)nn * sizeof *e->param_of);
    out->params = malloc((size_t)(e->k->n_inputs + e->k->n_outputs + 1) * sizeof(int));
    if (!e->in_kernel || !e->param_of || !out->params) return -1;
    for (int i = 0; i < nn; i++) e->param_of[i] = -1;
    for (int i = 0; i < e->k->n_nodes; i++) e->in_kernel[e->k->nodes[i]] = 1;
    out->n_params = 0;
    for (int i = 0; i < e->k->n_inputs; i++) {
        int id = e->k->inputs[i];
        if (folded(&p->g->nodes[id])) continue;
        e->param_of[id] = out->n_params;
        out->params[out->n_params++] = id;
    }
    out->n_inputs = out->n_params;
    for (int i = 0; i < e->k->n_outputs; i++) {
        int id = e->k->outputs[i];
        e->param_of[id] = out->n_params;
        out->params[out->n_params++] = id;
    }
    return 0;
}

void mpt_cu_em_free(mpt_cu_em *e) {
    free(e->in_kernel);
    free(e->param_of);
    free(e->memo);
}

void mpt_cu_signature(mpt_cu_em *e, const mpt_cuda_kernel_src *out) {
    mpt_sb_printf(e->sb, "extern \"C\" __global__ void %s%s%s(", e->launch_bounds,
                  e->launch_bounds[0] ? " " : "", out->name);
    for (int i = 0; i < out->n_params; i++) {
        const mpt_node *nd = &e->g->nodes[out->params[i]];
        const char *ct = mpt_cu_ctype(nd->dtype);
        int in = i < out->n_inputs;
        mpt_sb_printf(e->sb, "%s%s%s* __restrict__ p%d", i ? ",\n    " : "\n    ",
                      in ? "const " : "", ct ? ct : "double", i);
    }
    if (out->scratch_bytes)
        mpt_sb_printf(e->sb, ",\n    float* __restrict__ scratch");
    if (out->counter_bytes)
        mpt_sb_printf(e->sb, ",\n    unsigned* __restrict__ counters");
    mpt_sb_printf(e->sb, ")");
}

unsigned mpt_cu_grid_for(int64_t n, unsigned block) {
    int64_t g = (n + block - 1) / block;
    if (g < 1) g = 1;
    /* enough blocks to fill any current GPU several times; the loop strides */
    if (g > 8192) g = 8192;
    return (unsigned)g;
}

/* ---- LOOP kernels ---- */

/* Stores the lanes' values of an output in one vector store (as vec_load). */
static void vec_store(mpt_cu_em *e, int node, char v[][24]) {
    int p = e->param_of[node];
    switch (e->g->nodes[node].dtype) {
    case MPT_DT_F32: case MPT_DT_I32: {
        const char *vt = e->g->nodes[node].dtype == MPT_DT_F32 ? "mpt_v4f" : "mpt_v4i";
        mpt_cu_line(e, "{ const %s t = {%s, %s, %s, %s}; *(%s *)(p%d + l0) = t; }", vt, v[0], v[1],
                    v[2], v[3], vt, p);
        return;
    }
    case MPT_DT_F16: case MPT_DT_BF16: {
        const char *f = e->g->nodes[node].dtype == MPT_DT_F16 ? "mpt_f2h" : "mpt_f2b";
        mpt_cu_line(e, "{ const mpt_v2u t = {(unsigned)%s(%s) | (unsigned)%s(%s) << 16, "
                       "(unsigned)%s(%s) | (unsigned)%s(%s) << 16}; *(mpt_v2u *)(p%d + l0) = t; }",
                    f, v[0], f, v[1], f, v[2], f, v[3], p);
        return;
    }
    case MPT_DT_BOOL:
        mpt_cu_line(e, "*(unsigned *)(p%d + l0) = (unsigned)(%s != 0) | (unsigned)(%s != 0) << 8 | "
                       "(unsigned)(%s != 0) << 16 | (unsigned)(%s != 0) << 24;",
                    p, v[0], v[1], v[2], v[3]);
        return;
    case MPT_DT_F64: case MPT_DT_COUNT: break;
    }
    if (!e->err) { e->err = "f64 values exist only in the interpreter"; e->err_node = node; }
}

/* The outputs of shape s not yet done (marking them), computed and stored
 * at index variable idx (scalar) or at the lanes l0.. (vector). */
static void loop_body(mpt_cu_em *e, mpt_shape s, const char *done, int vector) {
    const mpt_kernel *k = e->k;
    int mark = mpt_cu_mark(e);
    for (int q = 0; q < k->n_outputs; q++) {
        if (done[q] || !mpt_shape_eq(e->g->nodes[k->outputs[q]].shape, s)) continue;
        if (!vector) {
            char v[24];
            mpt_cu_value(e, k->outputs[q], "i", v);
            mpt_cu_store(e, k->outputs[q], "i", v);
            continue;
        }
        char v[MPT_CU_LANES][24];
        for (int l = 0; l < MPT_CU_LANES; l++) {
            char li[4] = {'l', (char)('0' + l), 0};
            mpt_cu_value(e, k->outputs[q], li, v[l]);
        }
        vec_store(e, k->outputs[q], v);
    }
    mpt_cu_release(e, mark);
}

/* One grid-stride loop per distinct output shape: elementwise values are
 * recomputed where two loops need them, which is cheaper than a second
 * kernel and keeps every output's index space its own. Each thread takes
 * four consecutive elements per iteration, reading every buffer of the
 * loop's length with one vector load (float4-sized for f32, two half2
 * words for f16/bf16) and writing each output with one vector store; the
 * numel % 4 elements left run in a scalar loop after it. Buffers start
 * 64-byte aligned (the memory plan's arenas, cuMemAlloc), so the vectors
 * are aligned. */
int mpt_cu_emit_loop(mpt_cu_em *e, mpt_cuda_kernel_src *out) {
    const mpt_kernel *k = e->k;
    int64_t most = 1;
    char *done = calloc((size_t)k->n_outputs + 1, 1);
    if (!done) return -1;
    mpt_cu_signature(e, out);
    mpt_sb_printf(e->sb, " {\n");
    e->indent = 1;
    mpt_cu_line(e, "const long long step = (long long)gridDim.x * blockDim.x;");
    mpt_cu_line(e, "const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;");
    for (int o = 0; o < k->n_outputs; o++) {
        if (done[o]) continue;
        mpt_shape s = e->g->nodes[k->outputs[o]].shape;
        int64_t numel = mpt_shape_numel(s), vecs = numel / MPT_CU_LANES;
        if (vecs > most) most = vecs; /* threads with work; the tail needs fewer */
        if (vecs > 0) {
            mpt_cu_line(e, "for (long long j = first; j < %lldLL; j += step) {", (long long)vecs);
            e->indent++;
            mpt_cu_line(e, "const long long l0 = j * %d, l1 = l0 + 1, l2 = l0 + 2, l3 = l0 + 3;",
                        MPT_CU_LANES);
            e->vec_n = numel;
            loop_body(e, s, done, 1);
            e->vec_n = 0;
            e->indent--;
            mpt_cu_line(e, "}");
        }
        if (numel % MPT_CU_LANES) {
            mpt_cu_line(e, "for (long long i = %lldLL + first; i < %lldLL; i += step) {",
                        (long long)(vecs * MPT_CU_LANES), (long long)numel);
            e->indent++;
            loop_body(e, s, done, 0);
            e->indent--;
            mpt_cu_line(e, "}");
        }
        for (int q = o; q < k->n_outputs; q++)
            if (mpt_shape_eq(e->g->nodes[k->outputs[q]].shape, s)) done[q] = 1;
    }
    mpt_sb_printf(e->sb, "}\n");
    free(done);
    out->block[0] = 256;
    out->grid[0] = mpt_cu_grid_for(most, 256);
    return 0;
}

/* ---- dispatch ---- */

/* "k3_" + the plan's name made a C identifier, kept short for ptxas */
static char *entry_name(const mpt_kernel *k, int index) {
    char buf[128];
    int o = snprintf(buf, sizeof buf, "k%d_", index);
    for (const char *c = k->name ? k->name : mpt_kernel_kind_name(k->kind); *c && o < 120; c++)
        buf[o++] = isalnum((unsigned char)*c) ? *c : '_';
    buf[o] = 0;
    return strdup(buf);
}

static void header_comment(mpt_sb *sb, const mpt_plan *p, int ki) {
    const mpt_kernel *k = &p->kernels[ki];
    mpt_sb_printf(sb, "/* mptc kernel %d: %s (%s), %d op%s fused:\n", ki,
                  k->name ? k->name : "", mpt_kernel_kind_name(k->kind), k->n_nodes,
                  k->n_nodes == 1 ? "" : "s");
    for (int i = 0; i < k->n_nodes; i++) {
        const mpt_node *nd = &p->g->nodes[k->nodes[i]];
        char sh[64];
        mpt_sb_printf(sb, " *   %%%d = %s %s%s%s%s\n", k->nodes[i], mpt_op_name(nd->op),
                      mpt_dtype_name(nd->dtype), mpt_shape_str(nd->shape, sh, sizeof sh),
                      nd->layer ? "  layer " : "", nd->layer ? nd->layer : "");
    }
    mpt_sb_printf(sb, " */\n");
}

int mpt_cuda_kernel_is_collective(const mpt_plan *p, int k) {
    const mpt_kernel *K = &p->kernels[k];
    return K->kind == MPT_KERNEL_OPAQUE && K->root >= 0 &&
           mpt_op_table[p->g->nodes[K->root].op].kind == MPT_KIND_COLLECTIVE;
}

int mpt_cuda_emit_kernel(const mpt_plan *p, int ki, mpt_cuda_kernel_src *out, char *err,
                         size_t n) {
    memset(out, 0, sizeof *out);
    if (mpt_cuda_kernel_is_collective(p, ki)) {
        snprintf(err, n, "kernel %s: a %s across the ranks is an NCCL call of the executor, not "
                 "a generated kernel", p->kernels[ki].name,
                 mpt_op_name(p->g->nodes[p->kernels[ki].root].op));
        return -1;
    }
    out->grid[0] = out->grid[1] = out->grid[2] = 1;
    out->block[0] = out->block[1] = out->block[2] = 1;
    mpt_sb sb = {0};
    mpt_cu_em e;
    const mpt_kernel *k = &p->kernels[ki];
    out->name = entry_name(k, ki);
    if (mpt_cu_em_init(&e, p, ki, &sb, out) || !out->name) {
        snprintf(err, n, "kernel %s: out of memory", k->name);
        goto fail;
    }
    header_comment(&sb, p, ki);
    mpt_sb_printf(&sb, "%s\n", mpt_cu_prelude);
    int rc = -1;
    switch (k->kind) {
    case MPT_KERNEL_LOOP: rc = mpt_cu_emit_loop(&e, out); break;
    case MPT_KERNEL_REDUCTION: rc = mpt_cu_emit_reduction(&e, out); break;
    case MPT_KERNEL_OPAQUE: rc = mpt_cu_emit_opaque(&e, out); break;
    case MPT_KERNEL_GEMM: case MPT_KERNEL_CONV: rc = mpt_cu_emit_gemm(&e, out); break;
    case MPT_KERNEL_COUNT: break;
    }
    if (e.err) {
        int id = e.err_node;
        snprintf(err, n, "kernel %s: %s (%%%d = %s %s)", k->name, e.err, id,
                 id >= 0 ? mpt_op_name(p->g->nodes[id].op) : "?",
                 id >= 0 ? mpt_dtype_name(p->g->nodes[id].dtype) : "?");
        goto fail;
    }
    if (rc || sb.oom) {
        snprintf(err, n, "kernel %s: out of memory generating CUDA C", k->name);
        goto fail;
    }
    out->source = mpt_sb_take(&sb);
    /* a kernel of more than 256 threads states its block size: ptxas then
     * keeps its registers within what that many threads may hold (a
     * 1024-thread kernel over 64 registers a thread would not launch). At
     * 256 or fewer any count ptxas picks fits; there a bound only made
     * ptxas spill (an average pooling gradient: 48 registers and 16 bytes
     * spilled with one, 0 without) */
    unsigned threads = out->block[0] * out->block[1] * out->block[2];
    const char *at = out->source && !e.launch_bounds[0] && threads > 256
                         ? strstr(out->source, "__global__ void ")
                         : NULL;
    if (at) {
        at += strlen("__global__ void ");
        char lb[48];
        /* one block an SM at least: with the thread count alone ptxas aims
         * at two 1024-thread blocks an SM, 32 registers, and spills */
        int l = snprintf(lb, sizeof lb, "__launch_bounds__(%u, 1) ", threads);
        size_t head = (size_t)(at - out->source), len = strlen(out->source);
        char *s = malloc(len + (size_t)l + 1);
        if (s) {
            memcpy(s, out->source, head);
            memcpy(s + head, lb, (size_t)l);
            memcpy(s + head + (size_t)l, at, len - head + 1);
            free(out->source);
            out->source = s;
        }
    }
    mpt_cu_em_free(&e);
    return out->source ? 0 : -1;
fail:
    free(mpt_sb_take(&sb));
    mpt_cu_em_free(&e);
    mpt_cuda_kernel_src_free(out);
    return -1;
}

int mpt_cuda_output_fill(const mpt_cuda_kernel_src *s, int j) {
    if (j < s->n_inputs) return -1;
    if (s->zero_outputs) return 0;
    return j < 64 && (s->set_true >> j & 1) ? 1 : -1;
}

void mpt_cuda_kernel_src_free(mpt_cuda_kernel_src *s) {
    free(s->name);
    free(s->source);
    free(s->params);
    memset(s, 0, sizeof *s);
}
