/* tests/cuda_host.hpp — the CUDA C that mptc generates, run on the host.
 *
 * tests/cuda_emu.h compiles a plan's generated kernels with g++ against
 * this header, so that their index arithmetic, tiling, barriers, warp
 * shuffles and Tensor Core fragment layouts are checked against the
 * interpreter on a machine without a GPU. Only the inline PTX differs from
 * what NVRTC compiles: cuda_emu.h rewrites each `asm("op.a.b ..." : outs :
 * ins)` into a call `mpth_op_a_b(outs..., ins...)`, defined below from the
 * PTX ISA's description of the instruction.
 *
 * Threads of a block run as fibers when the kernel uses
 * __syncthreads, warp shuffles, votes or mma.sync; a barrier switches to
 * the next fiber until every live thread of the block (or warp) has
 * arrived. Kernels without them run thread after thread. Blocks run one
 * after another, so __shared__ arrays are function statics and atomics are
 * plain read-modify-writes. A barrier no thread can pass, or a shuffle or
 * vote with lanes missing, is reported as an error.
 */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#if !defined(__x86_64__)
#error "tests/cuda_host.hpp switches fibers with x86-64 code"
#endif

struct dim3 {
    unsigned x, y, z;
};

/* a cp.async copy issued and not yet landed */
struct mpth_copy {
    unsigned dst, n; /* shared address; bytes read (the rest of 16 are zeros) */
    const unsigned char *src;
    int group;
    unsigned long long at; /* the barrier interval it was issued in (mpth_epoch) */
};

enum { MPTH_COPIES = 64 };

/* a wgmma.mma_async issued and not yet waited for */
struct mpth_wgmma {
    float *d[128];           /* the thread's N / 2 accumulators */
    int n, ta, tb, bf16, group;
    unsigned long long da, db;
};

enum { MPTH_WGMMAS = 8 };

struct mpth_thread {
    dim3 tid;
    int lane, warp, done;
    void *sp; /* saved stack pointer while switched out */
    mpth_copy copies[MPTH_COPIES];
    int n_copies, group; /* group: the one copies issued now belong to */
    mpth_wgmma wgmmas[MPTH_WGMMAS];
    int n_wgmmas, wg_group;
    int idx;                       /* linear thread index */
    unsigned landed[MPTH_COPIES];  /* 16-byte granules its cp.async wrote, not yet fenced */
    int n_landed;
};

enum { MPTH_WARPS = 32, MPTH_SLOTS = 10, MPTH_STACK = 64 * 1024 };

struct mpth_state {
    /* dynamic shared memory (extern __shared__) first, so that its shared
     * addresses, offsets from here, are below 228 KiB as on a GPU (a
     * wgmma descriptor holds 18 bits of one) */
    alignas(16) unsigned char dyn_smem[228 * 1024];
    /* per 16 bytes of it: 1 + the thread whose cp.async wrote them and
     * has not executed fence.proxy.async since, else 0 */
    unsigned short unfenced[228 * 1024 / 16];
    unsigned dyn_bytes; /* the launch's dynamic shared memory: the rest is off limits */
    /* a block's threads run last first (MPTH_REVERSE=1): between two
     * barriers a thread then reads shared or global memory before the
     * lower-numbered threads write it, so a missing barrier that index
     * order hides shows */
    int reverse;
    /* cp.async copies land as they are issued (MPTH_CP_EARLY=1) instead of
     * at the issuing thread's wait_group. A GPU may land them anywhere in
     * between: landing late shows a read before the wait; landing early
     * shows a stage overwritten while another warp still reads it (a
     * missing barrier before the copies), which landing late never does,
     * since the copies then land only after the barriers that follow. */
    int cp_early;
    /* shared-memory race checks (MPTH_RACE=1), see mpth_race_read */
    int race;
    unsigned long long block_serial; /* blocks run so far, this one included */
    dim3 grid, block, bidx;
    mpth_thread *cur;
    int fibers;
    void *sched_sp;
    int live, arrived;
    unsigned long long gen, progress;
    int wlive[MPTH_WARPS], warrived[MPTH_WARPS];
    unsigned long long wgen[MPTH_WARPS];
    unsigned wslot[MPTH_WARPS][32][MPTH_SLOTS];
    const char *error;
};

static mpth_state mpth;

#define threadIdx (mpth.cur->tid)
#define blockIdx (mpth.bidx)
#define blockDim (mpth.block)
#define gridDim (mpth.grid)
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
struct __align__(16) float4 { float x, y, z, w; }; /* the wide fp32 kernel's shared reads */

static void mpth_fail(const char *why) {
    if (!mpth.error) mpth.error = why;
}

/* ---- scheduling ---- */

/* mpth_switch(&save, to): saves the callee-saved registers on this stack
 * and its pointer in save, then continues on the stack `to` (one saved the
 * same way, or a new fiber's, see mpth_run_block). No signal mask is
 * touched, unlike swapcontext, which makes a system call every switch. */
extern "C" void mpth_switch(void **save, void *to);
asm(".text\n"
    ".type mpth_switch, @function\n"
    "mpth_switch:\n"
    "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n"
    "    pushq %r13\n    pushq %r14\n    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n    popq %r14\n    popq %r13\n"
    "    popq %r12\n    popq %rbx\n    popq %rbp\n"
    "    ret\n"
    ".size mpth_switch, .-mpth_switch\n");

static void mpth_yield(void) {
    if (!mpth.fibers) return mpth_fail("a barrier in a kernel run without fibers");
    mpth_switch(&mpth.cur->sp, mpth.sched_sp);
}

static void __syncthreads(void) {
    if (mpth.error) return;
    unsigned long long g = mpth.gen;
    mpth.progress++;
    if (++mpth.arrived >= mpth.live) {
        mpth.arrived = 0;
        mpth.gen++;
        return;
    }
    while (mpth.gen == g && !mpth.error) mpth_yield();
}

/* every live lane of the calling thread's warp; all 32 must be live */
static void mpth_warp_sync(void) {
    if (mpth.error) return;
    int w = mpth.cur->warp;
    if (mpth.wlive[w] != 32) return mpth_fail("a warp-wide operation with lanes missing");
    unsigned long long g = mpth.wgen[w];
    mpth.progress++;
    if (++mpth.warrived[w] >= mpth.wlive[w]) {
        mpth.warrived[w] = 0;
        mpth.wgen[w]++;
        return;
    }
    while (mpth.wgen[w] == g && !mpth.error) mpth_yield();
}

/* ---- bit casts, atomics, integer min/max ---- */

static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
template <class T> static inline T atomicAdd(T *p, T v) { T old = *p; *p = old + v; return old; }
/* blocks run one after another, so a block sees every earlier block's
 * writes: the fence orders nothing more, and an L2 load is a load */
static inline void __threadfence() {}
template <class T> static inline T __ldcg(const T *p) { return *p; }

/* ---- warp shuffles and votes ---- */

template <class T> static T __shfl_xor_sync(unsigned mask, T v, int o) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    if (mask != 0xffffffffu) mpth_fail("__shfl_xor_sync with a partial mask");
    int w = mpth.cur->warp, l = mpth.cur->lane;
    memcpy(&mpth.wslot[w][l][0], &v, 4);
    mpth_warp_sync();
    T r;
    memcpy(&r, &mpth.wslot[w][(l ^ o) & 31][0], 4);
    mpth_warp_sync();
    return r;
}

static int __all_sync(unsigned mask, int v) {
    if (mask != 0xffffffffu) mpth_fail("__all_sync with a partial mask");
    int w = mpth.cur->warp, l = mpth.cur->lane, all = 1;
    mpth.wslot[w][l][0] = v != 0;
    mpth_warp_sync();
    for (int i = 0; i < 32; i++) all &= (int)mpth.wslot[w][i][0];
    mpth_warp_sync();
    return all;
}

/* ---- the inline PTX, as the PTX ISA defines it ---- */

static float mpth_h2f(unsigned short h) {
    return (float)*(const _Float16 *)&h;
}

static float mpth_b2f(unsigned short h) { return __uint_as_float((unsigned)h << 16); }

static void mpth_cvt_f32_f16(float &d, unsigned short h) { d = mpth_h2f(h); }

/* round to nearest even; NaN becomes the canonical 0x7fff */
static void mpth_cvt_rn_f16_f32(unsigned short &d, float f) {
    if (std::isnan(f)) { d = 0x7fff; return; }
    _Float16 h = (_Float16)f;
    memcpy(&d, &h, 2);
}

static void mpth_cvt_rn_bf16_f32(unsigned short &d, float f) {
    unsigned u = __float_as_uint(f);
    if (std::isnan(f)) { d = 0x7fff; return; }
    d = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* f32 to TF32 (10 explicit mantissa bits in a 32-bit register, the low 13
 * zero): round to nearest, ties away from zero; NaN and infinity kept */
static void mpth_cvt_rna_tf32_f32(unsigned &d, float f) {
    unsigned u = __float_as_uint(f);
    if (!std::isfinite(f)) { d = u; return; }
    d = (u + 0x1000u) & ~0x1fffu;
}

/* Shared-space addresses are 32 bits: offsets from this module's own
 * static data, where every __shared__ array (a function static here) lies. */
static inline size_t __cvta_generic_to_shared(const void *p) {
    return (size_t)(unsigned)((const char *)p - (const char *)&mpth);
}
static inline const unsigned char *mpth_shared(unsigned a) {
    return (const unsigned char *)&mpth + (int)a;
}

/* Dynamic shared memory (extern __shared__): cuda_emu.h points a kernel's
 * declaration here. A GPU gives a block the bytes its launch asked for,
 * and an access past them fails ("out of range shared address"): here the
 * copies, ldmatrix and wgmma check their addresses against mpth.dyn_bytes
 * (addresses of static __shared__ arrays lie above dyn_smem and are not
 * checked), and each block starts with the 4 KiB past them filled with
 * 0xff (a NaN in every float type) and fails if it wrote there. */
static unsigned char *const mpth_dyn_smem = mpth.dyn_smem;
enum { MPTH_CANARY = 4096 };
static inline bool mpth_dyn_ok(unsigned a, unsigned len) {
    return a >= sizeof mpth.dyn_smem || a + len <= mpth.dyn_bytes;
}
/* A shared array's first use in a block fills it with 0xff: a GPU gives
 * a block shared memory holding whatever the last block on that SM left,
 * so a value read before the block wrote it reads NaN (or -1) here. The
 * dynamic shared memory is filled the same way at each block's start. */
/* (stamp: the array's own, the block that last filled it) */
static void mpth_fresh(const void *at, size_t bytes, unsigned long long *stamp) {
    if (*stamp == mpth.block_serial) return;
    *stamp = mpth.block_serial;
    memset((void *)at, 0xff, bytes);
}
static inline unsigned mpth_canary_len(void) {
    unsigned rest = (unsigned)sizeof mpth.dyn_smem - mpth.dyn_bytes;
    return rest < MPTH_CANARY ? rest : MPTH_CANARY;
}

/* Races on the dynamic shared memory between warps (MPTH_RACE=1): per
 * 16 bytes, the barrier interval (block and barrier generation) of the
 * last ldmatrix reads and the warps that made them, and of the last
 * cp.async aimed there and its warp. Warps here run nearly in step, and a
 * cp.async lands at its wait, after the barriers that follow it, so a copy
 * overwriting what another warp still reads gives the right numbers; on a
 * GPU the copy may land at once. Hence: a cp.async and an ldmatrix of
 * another warp on the same bytes with no barrier between them (in either
 * order, or while the copy is in flight) fail. Plain loads and stores of
 * the kernel are not seen. */
enum { MPTH_GRANULES = 228 * 1024 / 16 };
static unsigned long long mpth_rd_at[MPTH_GRANULES], mpth_wr_at[MPTH_GRANULES];
static unsigned mpth_rd_warps[MPTH_GRANULES];
static unsigned char mpth_wr_warp[MPTH_GRANULES];
static inline unsigned long long mpth_epoch(void) {
    return mpth.block_serial << 32 | (mpth.gen & 0xffffffffu);
}
static void mpth_race_read(unsigned a) {
    if (!mpth.race || a >= sizeof mpth.dyn_smem) return;
    unsigned g = a / 16, w = (unsigned)mpth.cur->warp;
    unsigned long long ep = mpth_epoch();
    if (mpth_wr_at[g] == ep && mpth_wr_warp[g] != w)
        return mpth_fail("ldmatrix reads shared memory another warp's cp.async writes with no "
                         "barrier between");
    if (mpth_rd_at[g] != ep) mpth_rd_at[g] = ep, mpth_rd_warps[g] = 0;
    mpth_rd_warps[g] |= 1u << w;
}
/* a cp.async to a issued (since: the interval it was issued in) or landing */
static void mpth_race_write(unsigned a, unsigned long long since) {
    if (!mpth.race || a >= sizeof mpth.dyn_smem) return;
    unsigned g = a / 16, w = (unsigned)mpth.cur->warp;
    if (mpth_rd_at[g] >= since && (mpth_rd_warps[g] & ~(1u << w)))
        return mpth_fail("cp.async overwrites shared memory another warp read with no barrier "
                         "between");
    mpth_wr_at[g] = mpth_epoch();
    mpth_wr_warp[g] = (unsigned char)w;
}

/* copy c of thread t writes its 16 bytes */
static void mpth_cp_land(mpth_thread *t, const mpth_copy &c) {
    mpth_race_write(c.dst, c.at);
    unsigned char *d = (unsigned char *)mpth_shared(c.dst);
    memcpy(d, c.src, c.n);
    memset(d + c.n, 0, 16 - c.n);
    /* a kernel that never fences (mma.sync) fills its list and
     * stops recording: only wgmma reads the marks */
    if (c.dst < sizeof mpth.dyn_smem && t->n_landed < MPTH_COPIES) {
        t->landed[t->n_landed++] = c.dst / 16;
        mpth.unfenced[c.dst / 16] = (unsigned short)(t->idx + 1);
    }
}

/* cp.async.cg.shared.global [dst], [src], 16, n: queued, and done when the
 * thread waits for its group, so a kernel that reads the stage before its
 * mpt_cp_wait reads what was there before (or at once: mpth.cp_early). */
static void mpth_cp_async_cg_shared_global(unsigned dst, const void *src, unsigned n) {
    mpth_thread *t = mpth.cur;
    if (dst % 16 || (uintptr_t)src % 16) return mpth_fail("cp.async: an address not 16-byte aligned");
    if (n > 16) return mpth_fail("cp.async: source size over 16");
    if (!mpth_dyn_ok(dst, 16))
        return mpth_fail("cp.async: a destination past the launch's dynamic shared memory");
    const mpth_copy c{dst, n, (const unsigned char *)src, t->group, mpth_epoch()};
    if (mpth.cp_early) return mpth_cp_land(t, c);
    mpth_race_write(dst, c.at);
    if (t->n_copies == MPTH_COPIES) return mpth_fail("cp.async: too many copies in flight");
    t->copies[t->n_copies++] = c;
}
static void mpth_cp_async_commit_group(void) { mpth.cur->group++; }
/* every committed group but the newest `newest` lands */
static void mpth_cp_async_wait_group(int newest) {
    mpth_thread *t = mpth.cur;
    int kept = 0;
    for (int i = 0; i < t->n_copies; i++) {
        mpth_copy c = t->copies[i];
        if (c.group < t->group - newest) mpth_cp_land(t, c);
        else t->copies[kept++] = c;
    }
    t->n_copies = kept;
}

template <class T> static inline void __stcg(T *p, T v) { *p = v; }

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8j..8j+7 give
 * the addresses of the 8 rows (8 x 16 bits each) of matrix j. Lane l
 * receives in register j row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1
 * of matrix j, the lower column in the low half; with .trans, column l / 4
 * at rows 2 (l % 4) and 2 (l % 4) + 1, the lower row in the low half. */
static void mpth_ldmatrix(bool trans, unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3,
                          unsigned addr) {
    int w = mpth.cur->warp, l = mpth.cur->lane;
    if (addr % 16) mpth_fail("ldmatrix: a row address not 16-byte aligned");
    if (!mpth_dyn_ok(addr, 16))
        mpth_fail("ldmatrix: a row past the launch's dynamic shared memory");
    mpth_race_read(addr);
    mpth.wslot[w][l][0] = addr;
    mpth_warp_sync();
    unsigned *r[4] = {&r0, &r1, &r2, &r3};
    for (int j = 0; j < 4; j++) {
        unsigned short half[2];
        for (int i = 0; i < 2; i++) {
            int row = trans ? 2 * (l % 4) + i : l / 4, col = trans ? l / 4 : 2 * (l % 4) + i;
            memcpy(&half[i], mpth_shared(mpth.wslot[w][8 * j + row][0]) + 2 * col, 2);
        }
        *r[j] = (unsigned)half[0] | (unsigned)half[1] << 16;
    }
    mpth_warp_sync();
}
static void mpth_ldmatrix_sync_aligned_m8n8_x4_shared_b16(unsigned &r0, unsigned &r1, unsigned &r2,
                                                           unsigned &r3, unsigned addr) {
    mpth_ldmatrix(false, r0, r1, r2, r3, addr);
}
static void mpth_ldmatrix_sync_aligned_m8n8_x4_trans_shared_b16(unsigned &r0, unsigned &r1,
                                                                 unsigned &r2, unsigned &r3,
                                                                 unsigned addr) {
    mpth_ldmatrix(true, r0, r1, r2, r3, addr);
}

/* Lane l's accumulators of an m16n8kK mma: d0, d1 row g, columns 2t and
 * 2t + 1; d2, d3 row g + 8 (lane = 4 g + t), each plus the K products of
 * A(row, k) B(k, column) summed in f32 in order of k. */
template <class FA, class FB>
static void mpth_mma_sum(int l, int K, FA A, FB B, float &d0, float &d1, float &d2, float &d3) {
    int g = l >> 2, t = l & 3;
    float *d[4] = {&d0, &d1, &d2, &d3};
    for (int i = 0; i < 4; i++) {
        int r = g + 8 * (i >> 1), c = 2 * t + (i & 1);
        float acc = *d[i];
        for (int k = 0; k < K; k++) acc += A(r, k) * B(k, c);
        *d[i] = acc;
    }
}

/* mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 D, A, B, C
 * with D = C (the kernels pass their accumulators as "+f"). Lane = 4 g + t.
 * A (16x16, row major): register r holds row g + 8 (r & 1), columns
 * 2t + 8 (r >> 1) and the next, the lower column in the low half.
 * B (16x8, column major): register r holds rows 2t + 8 r and the next of
 * column g. C/D (16x8): d0, d1 are row g, columns 2t, 2t + 1; d2, d3 row
 * g + 8. Products are exact in f32; the sum is f32. */
static void mpth_mma(float (*to_f)(unsigned short), float &d0, float &d1, float &d2, float &d3,
                     unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                     unsigned b1) {
    int w = mpth.cur->warp, l = mpth.cur->lane;
    unsigned *s = mpth.wslot[w][l];
    s[0] = a0, s[1] = a1, s[2] = a2, s[3] = a3, s[4] = b0, s[5] = b1;
    mpth_warp_sync();
    auto A = [&](int r, int k) {
        unsigned reg = mpth.wslot[w][(r % 8) * 4 + (k % 8) / 2][(r / 8) + 2 * (k / 8)];
        return to_f((unsigned short)(k & 1 ? reg >> 16 : reg & 0xffff));
    };
    auto B = [&](int k, int n) {
        unsigned reg = mpth.wslot[w][n * 4 + (k % 8) / 2][4 + k / 8];
        return to_f((unsigned short)(k & 1 ? reg >> 16 : reg & 0xffff));
    };
    mpth_mma_sum(l, 16, A, B, d0, d1, d2, d3);
    mpth_warp_sync();
}

static void mpth_mma_sync_aligned_m16n8k16_row_col_f32_f16_f16_f32(
    float &d0, float &d1, float &d2, float &d3, unsigned a0, unsigned a1, unsigned a2,
    unsigned a3, unsigned b0, unsigned b1) {
    mpth_mma(mpth_h2f, d0, d1, d2, d3, a0, a1, a2, a3, b0, b1);
}

static void mpth_mma_sync_aligned_m16n8k16_row_col_f32_bf16_bf16_f32(
    float &d0, float &d1, float &d2, float &d3, unsigned a0, unsigned a1, unsigned a2,
    unsigned a3, unsigned b0, unsigned b1) {
    mpth_mma(mpth_b2f, d0, d1, d2, d3, a0, a1, a2, a3, b0, b1);
}

/* mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 D, A, B, C with D =
 * C. Lane = 4 g + t. A (16x8, row major): a0 row g column t, a1 row g + 8
 * column t, a2 row g column t + 4, a3 row g + 8 column t + 4. B (8x8,
 * column major): b0 row t, b1 row t + 4, of column g. C/D as m16n8k16's.
 * Products of two TF32 values are exact in f32; the sum is f32. */
static void mpth_mma_sync_aligned_m16n8k8_row_col_f32_tf32_tf32_f32(
    float &d0, float &d1, float &d2, float &d3, unsigned a0, unsigned a1, unsigned a2,
    unsigned a3, unsigned b0, unsigned b1) {
    int w = mpth.cur->warp, l = mpth.cur->lane;
    unsigned *s = mpth.wslot[w][l];
    s[0] = a0, s[1] = a1, s[2] = a2, s[3] = a3, s[4] = b0, s[5] = b1;
    mpth_warp_sync();
    auto A = [&](int r, int k) {
        return __uint_as_float(mpth.wslot[w][(r % 8) * 4 + k % 4][r / 8 + 2 * (k / 4)]);
    };
    auto B = [&](int k, int n) { return __uint_as_float(mpth.wslot[w][n * 4 + k % 4][4 + k / 4]); };
    mpth_mma_sum(l, 8, A, B, d0, d1, d2, d3);
    mpth_warp_sync();
}

/* ---- wgmma (sm_90) ----
 *
 * wgmma.mma_async reads A and B from shared memory through 64-bit matrix
 * descriptors: start address >> 4 (bits 0-13), leading byte offset >> 4
 * (16-29), stride byte offset >> 4 (32-45), base offset (49-51) and
 * swizzle mode (62-63), both 0 here (the canonical layout without swizzle).
 * A core matrix is 8 rows of 16 bytes (8 elements), contiguous; the
 * leading byte offset separates core matrices along k, the stride byte
 * offset those along m or n. Without the transpose flag an operand is
 * K-major (a core matrix row runs along k), with it MN-major (along m or n).
 * wgmma reads through the async proxy: 16 bytes a cp.async wrote are
 * visible to it only once the writing thread has executed
 * fence.proxy.async (a barrier then shows them to the other warpgroups);
 * stores by the threads themselves are not tracked.
 * The thread's accumulators are the m64nN D fragment: warp w of the
 * warpgroup holds rows 16 w + g (+ 8), and d[4 j + h] is column 8 j + 2 q4
 * + (h & 1) of row + 8 (h >> 1) (lane = 4 g + q4).
 *
 * Each thread computes its own fragment, when it waits for the group
 * (wgmma.wait_group): a kernel that overwrites a stage or reads the
 * accumulators before waiting computes from what is there then.
 * wgmma.fence is not modelled. */
static void mpth_nop(...) {}
static void mpth_wgmma_fence_sync_aligned(void) {}
/* the thread's cp.async writes become visible to wgmma (the async proxy) */
static void mpth_fence_proxy_async_shared__cta(void) {
    mpth_thread *t = mpth.cur;
    for (int i = 0; i < t->n_landed; i++)
        if (mpth.unfenced[t->landed[i]] == t->idx + 1) mpth.unfenced[t->landed[i]] = 0;
    t->n_landed = 0;
}
static void mpth_wgmma_commit_group_sync_aligned(void) { mpth.cur->wg_group++; }

static float mpth_wg_elem(unsigned long long desc, int trans, int mn, int k, int bf16) {
    if (desc >> 49 & 7) { mpth_fail("wgmma: a descriptor with a base offset"); return 0; }
    if (desc >> 62) { mpth_fail("wgmma: a swizzled descriptor (not modelled)"); return 0; }
    unsigned start = (unsigned)(desc & 0x3fff) << 4, lbo = (unsigned)(desc >> 16 & 0x3fff) << 4;
    unsigned sbo = (unsigned)(desc >> 32 & 0x3fff) << 4;
    unsigned a = start + (unsigned)(mn >> 3) * sbo + (unsigned)(k >> 3) * lbo +
                 (trans ? (unsigned)(k & 7) * 16 + (unsigned)(mn & 7) * 2
                        : (unsigned)(mn & 7) * 16 + (unsigned)(k & 7) * 2);
    if (a + 2 > sizeof mpth.dyn_smem || !mpth_dyn_ok(a, 2)) {
        mpth_fail("wgmma: an operand outside the launch's dynamic shared memory");
        return 0;
    }
    if (mpth.unfenced[a / 16]) {
        mpth_fail("wgmma: reads shared memory a cp.async wrote with no fence.proxy.async since");
        return 0;
    }
    unsigned short h;
    memcpy(&h, mpth_shared(a), 2);
    return bf16 ? mpth_b2f(h) : mpth_h2f(h);
}

static void mpth_wgmma_run(const mpth_wgmma &w) {
    int l = mpth.cur->lane, wr = 16 * (mpth.cur->warp % 4) + (l >> 2), q4 = l & 3;
    for (int i = 0; i < w.n && !mpth.error; i++) {
        int r = wr + 8 * ((i >> 1) & 1), c = 8 * (i >> 2) + 2 * q4 + (i & 1);
        float acc = *w.d[i];
        for (int k = 0; k < 16; k++)
            acc += mpth_wg_elem(w.da, w.ta, r, k, w.bf16) * mpth_wg_elem(w.db, w.tb, c, k, w.bf16);
        *w.d[i] = acc;
    }
}

/* every committed group but the newest `newest` completes */
static void mpth_wgmma_wait_group_sync_aligned(int newest) {
    mpth_thread *t = mpth.cur;
    int kept = 0;
    for (int i = 0; i < t->n_wgmmas; i++) {
        if (t->wgmmas[i].group < t->wg_group - newest) mpth_wgmma_run(t->wgmmas[i]);
        else t->wgmmas[kept++] = t->wgmmas[i];
    }
    t->n_wgmmas = kept;
}

/* wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T {d}, da, db, 1, 1, 1, ta, tb:
 * the N / 2 accumulators, the descriptors, the transpose flags */
template <int N, class... A> static void mpth_wgmma_issue(int bf16, A &&...a) {
    static_assert(sizeof...(A) == N / 2 + 4, "wgmma: N / 2 accumulators and 4 operands");
    void *p[] = {(void *)&a...};
    mpth_thread *t = mpth.cur;
    if (t->n_wgmmas == MPTH_WGMMAS) return mpth_fail("wgmma: too many in flight");
    mpth_wgmma &w = t->wgmmas[t->n_wgmmas++];
    w.n = N / 2;
    for (int i = 0; i < N / 2; i++) w.d[i] = (float *)p[i];
    w.da = *(unsigned long long *)p[N / 2];
    w.db = *(unsigned long long *)p[N / 2 + 1];
    w.ta = *(int *)p[N / 2 + 2];
    w.tb = *(int *)p[N / 2 + 3];
    w.bf16 = bf16;
    w.group = t->wg_group;
}
#define MPTH_WGMMA(n)                                                                             \
    template <class... A> static void mpth_wgmma_mma_async_sync_aligned_m64n##n##k16_f32_f16_f16( \
        A &&...a) {                                                                               \
        mpth_wgmma_issue<n>(0, a...);                                                             \
    }                                                                                             \
    template <class... A>                                                                         \
    static void mpth_wgmma_mma_async_sync_aligned_m64n##n##k16_f32_bf16_bf16(A &&...a) {         \
        mpth_wgmma_issue<n>(1, a...);                                                             \
    }
MPTH_WGMMA(32)
MPTH_WGMMA(64)
MPTH_WGMMA(128)

/* ---- launching ---- */

/* the kernel being launched, and its arguments */
static void (*mpth_body_fn)(void **);
static void **mpth_body_args;

static void mpth_body(void) { mpth_body_fn(mpth_body_args); }

/* a fiber starts here (mpth_switch's ret) and ends by switching away */
static void mpth_fiber_main(void) {
    mpth_body();
    mpth_thread *t = mpth.cur;
    if (t->n_copies) mpth_fail("a thread ended with cp.async copies in flight");
    if (t->n_wgmmas) mpth_fail("a thread ended with wgmma.mma_async in flight");
    t->done = 1;
    mpth.live--;
    mpth.wlive[t->warp]--;
    mpth.progress++;
    /* a barrier the remaining threads already all wait at opens */
    if (mpth.arrived > 0 && mpth.arrived >= mpth.live) mpth.arrived = 0, mpth.gen++;
    mpth_switch(&t->sp, mpth.sched_sp);
    abort(); /* never resumed */
}

static int mpth_run_block_(int n, mpth_thread *th, char *stacks);
static int mpth_run_block(int n, mpth_thread *th, char *stacks) {
    unsigned char *tail = mpth.dyn_smem + mpth.dyn_bytes;
    mpth.block_serial++;
    memset(mpth.dyn_smem, 0xff, mpth.dyn_bytes);
    memset(tail, 0xff, mpth_canary_len());
    int rc = mpth_run_block_(n, th, stacks);
    for (unsigned i = 0; rc == 0 && i < mpth_canary_len(); i++)
        if (tail[i] != 0xff) {
            mpth.error = "a write past the launch's dynamic shared memory";
            rc = -1;
        }
    return rc;
}

static int mpth_run_block_(int n, mpth_thread *th, char *stacks) {
    memset(mpth.unfenced, 0, sizeof mpth.unfenced);
    mpth.live = n;
    mpth.arrived = 0;
    for (int w = 0; w < MPTH_WARPS; w++) mpth.wlive[w] = 0, mpth.warrived[w] = 0;
    for (int i = 0; i < n; i++) {
        mpth.wlive[th[i].warp]++;
        th[i].done = 0;
        th[i].n_copies = th[i].group = 0;
        th[i].n_wgmmas = th[i].wg_group = th[i].n_landed = 0;
        if (!mpth.fibers) continue;
        /* what mpth_switch pops: six registers, then the address it
         * returns to; the stack is then 8 past a 16-byte boundary, as
         * after a call */
        void **sp = (void **)(stacks + (size_t)(i + 1) * MPTH_STACK) - 8;
        for (int r = 0; r < 6; r++) sp[r] = nullptr;
        sp[6] = (void *)mpth_fiber_main;
        sp[7] = nullptr;
        th[i].sp = sp;
    }
    /* thread j runs i-th: in index order, or last first (MPTH_REVERSE=1) */
    const int rev = mpth.reverse;
    if (!mpth.fibers) {
        for (int i = 0; i < n && !mpth.error; i++) {
            mpth.cur = &th[rev ? n - 1 - i : i];
            mpth_body();
        }
        return mpth.error ? -1 : 0;
    }
    while (mpth.live > 0 && !mpth.error) {
        unsigned long long before = mpth.progress;
        for (int i = 0; i < n && !mpth.error; i++) {
            const int j = rev ? n - 1 - i : i;
            if (th[j].done) continue;
            mpth.cur = &th[j];
            mpth_switch(&mpth.sched_sp, th[j].sp);
        }
        if (mpth.progress == before && mpth.live > 0) mpth_fail("a barrier no thread can pass");
    }
    return mpth.error ? -1 : 0;
}

/* mpth_thunk(kernel): a function calling kernel with its pointer
 * arguments taken from an array */
template <class... A, std::size_t... I>
static void mpth_call(void (*f)(A...), void **a, std::index_sequence<I...>) {
    f((A)a[I]...);
}
template <auto F> struct mpth_thunk_of;
template <class... A, void (*F)(A...)> struct mpth_thunk_of<F> {
    static void run(void **a) { mpth_call(F, a, std::index_sequence_for<A...>{}); }
};
#define mpth_thunk(f) (&mpth_thunk_of<&f>::run)

/* Runs f over grid x block with the pointer arguments a. 0, or -1 with
 * the reason in err. */
static int mpth_launch(void (*f)(void **), void **a, dim3 grid, dim3 block, unsigned dyn,
                       int fibers, char *err, unsigned long n) {
    int nt = (int)(block.x * block.y * block.z);
    if (nt < 1 || nt > 32 * MPTH_WARPS) {
        snprintf(err, n, "block of %d threads", nt);
        return -1;
    }
    if (dyn > sizeof mpth.dyn_smem) {
        snprintf(err, n, "%u bytes of dynamic shared memory", dyn);
        return -1;
    }
    mpth.dyn_bytes = dyn;
    const char *rev = getenv("MPTH_REVERSE");
    mpth.reverse = rev && rev[0] == '1';
    const char *early = getenv("MPTH_CP_EARLY");
    mpth.cp_early = early && early[0] == '1';
    const char *race = getenv("MPTH_RACE");
    mpth.race = race && race[0] == '1';
    mpth.grid = grid;
    mpth.block = block;
    mpth.fibers = fibers;
    mpth.error = nullptr;
    mpth_body_fn = f;
    mpth_body_args = a;
    mpth_thread *th = (mpth_thread *)calloc((size_t)nt, sizeof *th);
    char *stacks = fibers ? (char *)aligned_alloc(64, (size_t)nt * MPTH_STACK) : nullptr;
    if (!th || (fibers && !stacks)) {
        free(th);
        snprintf(err, n, "out of memory");
        return -1;
    }
    for (int i = 0; i < nt; i++) {
        th[i].tid = dim3{(unsigned)i % block.x, (unsigned)i / block.x % block.y,
                         (unsigned)i / (block.x * block.y)};
        th[i].lane = i % 32;
        th[i].warp = i / 32;
        th[i].idx = i;
    }
    int rc = 0;
    for (unsigned z = 0; z < grid.z && rc == 0; z++)
        for (unsigned y = 0; y < grid.y && rc == 0; y++)
            for (unsigned x = 0; x < grid.x && rc == 0; x++) {
                mpth.bidx = dim3{x, y, z};
                rc = mpth_run_block(nt, th, stacks);
            }
    if (rc) snprintf(err, n, "block (%u,%u,%u): %s", mpth.bidx.x, mpth.bidx.y, mpth.bidx.z,
                     mpth.error);
    free(th);
    free(stacks);
    return rc;
}
