/* codegen/cpu/emit_ranges.c — which k a gathered convolution GEMM skips.
 *
 * A row of a gathered GEMM (an output position of the forward pass, a tap
 * of the filter gradient, a grid point of a data-gradient phase) reads
 * zeros wherever its window lies in the padding. Its nonzero k are a range
 * of kernel rows (each `run` k long) and, within every kernel row, a range
 * of k: the top and bottom padding cut the first, the left and right the
 * second. The micro-kernel runs a tile over the union of its rows' ranges
 * (mpt_cpu_gemm_gather.k_range, gemm_gen.c), so what it skips depends on
 * which rows share a tile:
 *
 *   - ROWS: the GEMM's own row order, whole kernel rows skipped (k_run 0);
 *   - RUNS: the same order, and each kernel row cut to its segment;
 *   - IMAGES: rows in (position, image) order, so that a tile's rows are
 *     images at one position and share both ranges exactly; the output
 *     rows are then permuted back (the forward pass) or scattered in that
 *     order (the data gradient).
 *
 * convnet64's conv_3 (11x11 over a 16x16 image, stride 2) reads zeros in
 * 31% of its nominal k; skipping whole kernel rows in (image, position)
 * order leaves most of the left and right padding in, since its 8 output
 * columns fit in one tile. The cost model counts a tile's k iterations,
 * plus a few per segment for restarting the k loop.
 */
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/emit.h"

/* k iterations a segment's restart costs (the tile's range, its pointers) */
enum { SEGMENT_COST = 6 };

static int64_t tile_cost(const mpt_cpu_krange *r, const int64_t *idx, int64_t n, int64_t run,
                         int by_runs) {
    int64_t h0 = r[idx[0]].h0, h1 = r[idx[0]].h1, s0 = r[idx[0]].s0, s1 = r[idx[0]].s1;
    for (int64_t i = 1; i < n; i++) {
        const mpt_cpu_krange *e = &r[idx[i]];
        h0 = e->h0 < h0 ? e->h0 : h0;
        h1 = e->h1 > h1 ? e->h1 : h1;
        s0 = e->s0 < s0 ? e->s0 : s0;
        s1 = e->s1 > s1 ? e->s1 : s1;
    }
    int64_t h = h1 > h0 ? h1 - h0 : 0, s = s1 > s0 ? s1 - s0 : 0;
    return by_runs ? h * (s + SEGMENT_COST) : h * run;
}

/* Row i of the GEMM in order `how`: its index among r's rows, which are in
 * (image, position) order, nb images of np positions. */
static int64_t row_of(int how, int64_t i, int64_t nb, int64_t np) {
    return how == MPT_CPU_SKIP_IMAGES ? i % nb * np + i / nb : i;
}

int64_t mpt_cpu_krange_cost(const mpt_cpu_krange *r, int64_t nb, int64_t np, int64_t run,
                            int how) {
    int64_t M = nb * np, total = 0, idx[MPT_CPU_GATHER_MR];
    for (int64_t i0 = 0; i0 < M; i0 += MPT_CPU_GATHER_MR) {
        int64_t n = M - i0 < MPT_CPU_GATHER_MR ? M - i0 : MPT_CPU_GATHER_MR;
        for (int64_t i = 0; i < n; i++)
            idx[i] = row_of(how, i0 + i, nb, np);
        total += tile_cost(r, idx, n, run, how != MPT_CPU_SKIP_ROWS);
    }
    return total;
}

int64_t mpt_cpu_krange_nominal(int64_t rows, int64_t k) {
    return (rows + MPT_CPU_GATHER_MR - 1) / MPT_CPU_GATHER_MR * k;
}

int mpt_cpu_krange_choose(const int64_t *cost) {
    const char *env = getenv("MPT_CPU_CONV_SKIP");
    if (env && !strcmp(env, "rows"))
        return MPT_CPU_SKIP_ROWS;
    if (env && !strcmp(env, "runs"))
        return MPT_CPU_SKIP_RUNS;
    if (env && !strcmp(env, "images"))
        return MPT_CPU_SKIP_IMAGES;
    /* segments must save a twentieth to pay for their restarts' branches;
     * the images' order as much again, for permuting the output */
    int how = cost[MPT_CPU_SKIP_RUNS] * 20 < cost[MPT_CPU_SKIP_ROWS] * 19 ? MPT_CPU_SKIP_RUNS
                                                                          : MPT_CPU_SKIP_ROWS;
    if (cost[MPT_CPU_SKIP_IMAGES] * 20 < cost[how] * 19)
        how = MPT_CPU_SKIP_IMAGES;
    return how;
}

void mpt_cpu_krange_write(const mpt_cpu_krange *r, int64_t nb, int64_t np, int64_t run, int how,
                          int64_t *kr) {
    for (int64_t i = 0; i < nb * np; i++, kr += 4) {
        const mpt_cpu_krange *e = &r[row_of(how, i, nb, np)];
        int64_t h1 = e->h1 > e->h0 ? e->h1 : e->h0;
        kr[0] = e->h0 * run;
        kr[1] = h1 * run;
        kr[2] = how == MPT_CPU_SKIP_ROWS ? 0 : e->s0;
        kr[3] = how == MPT_CPU_SKIP_ROWS ? 0 : e->s1 > e->s0 ? e->s1 : e->s0;
    }
}

/* taps over one spatial dim's outputs that fall inside the image */
static int64_t taps_in_image(int64_t size, int64_t k, int64_t stride, int64_t before, int64_t out) {
    int64_t in = 0;
    for (int64_t o = 0; o < out; o++) {
        int64_t lo = o * stride - before, hi = lo + k;
        lo = lo > 0 ? lo : 0;
        hi = hi < size ? hi : size;
        in += hi > lo ? hi - lo : 0;
    }
    return in;
}

double mpt_cpu_conv_inside(const int64_t *q) {
    double all = (double)(q[MPT_G_OH] * q[MPT_G_KH]) * (double)(q[MPT_G_OW] * q[MPT_G_KW]);
    double in = (double)taps_in_image(q[MPT_G_H], q[MPT_G_KH], q[MPT_G_SH], q[MPT_G_PH], q[MPT_G_OH]) *
                (double)taps_in_image(q[MPT_G_W], q[MPT_G_KW], q[MPT_G_SW], q[MPT_G_PW], q[MPT_G_OW]);
    return all > 0 ? in / all : 1;
}
