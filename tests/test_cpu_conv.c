/* tests/test_cpu_conv.c — the CPU backend's convolutions (forward and
 * both gradients, every path a shape or a setting selects), pooling, argmax
 * and scatter_add against the reference interpreter, in f32, f16 and bf16. */
#include "codegen/cpu/emit.h"
#include "cpu_check.h"

/* ---- convolutions (forward and both gradients), pooling, argmax,
 * scatter_add ---- */

/* y = conv2d(x, w) (relu'd when relu_y), dx and dw from dy, for a k x k
 * kernel with equal pads p; *OH, *OW: the output size */
static mpt_graph *conv_graph(mpt_dtype dt, const char *name, int64_t N, int64_t H, int64_t W,
                             int64_t C, int64_t O, int64_t k, int64_t st, int64_t p, int relu_y,
                             int64_t *OH, int64_t *OW) {
    *OH = mpt_conv_out_size(H, k, st, p, p);
    *OW = mpt_conv_out_size(W, k, st, p, p);
    mpt_graph *g = mpt_graph_new(name);
    int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_4(N, H, W, C)), dt);
    int w = mpt_b_cast(g, mpt_b_input(g, "w", MPT_DT_F32, mpt_shape_4(k, k, C, O)), dt);
    int dy = mpt_b_cast(g, mpt_b_input(g, "dy", MPT_DT_F32, mpt_shape_4(N, *OH, *OW, O)), dt);
    int y = mpt_b_conv2d(g, x, w, st, st, p, p, mpt_shape_4(N, *OH, *OW, O));
    mpt_graph_add_output(g, "y", relu_y ? mpt_b_unary(g, MPT_OP_RELU, y) : y);
    mpt_graph_add_output(g, "dx", mpt_b_conv2d_bwd_data(g, dy, w, st, st, p, p, mpt_shape_4(N, H, W, C)));
    mpt_graph_add_output(g, "dw", mpt_b_conv2d_bwd_filter(g, x, dy, st, st, p, p, mpt_shape_4(k, k, C, O)));
    return g;
}

static void test_conv_and_opaque(void) {
    char what[128];
    for (int d = 0; d < 3; d++) {
        mpt_dtype dt = float_dts[d];
        for (int k = 1; k <= 3; k += 2)
            for (int st = 1; st <= 2; st++) {
                int64_t N = 2, C = 3, O = 5, OH, OW;
                mpt_graph *g = conv_graph(dt, "conv", N, 9, 7, C, O, k, st, k / 2, 1, &OH, &OW);
                snprintf(what, sizeof what, "conv %s k=%d stride=%d", mpt_dtype_name(dt), k, st);
                run_both(g, 1, tol_for(TOL_ACCUM, dt, k * k * (C > O ? C : O) * N * OH * OW), 0, what, k == 3 && st == 2 ? BOTH : FUSED);
                mpt_graph_free(g);
            }
        /* a large strided kernel clipped on both sides of the image, an odd
         * batch split over the pool, and the data gradient by phases, then
         * by GEMM + col2im in several rounds of two images (a tiny chunk
         * budget) */
        {
            int64_t N = 5, C = 4, k = 5, OH, OW;
            for (int col2im = 0; col2im < 2; col2im++) {
                if (col2im) setenv("MPT_CPU_DGRAD", "col2im", 1);
                setenv("MPT_CPU_CONV_CHUNK_BYTES", "1", 1);
                mpt_graph *g = conv_graph(dt, "conv_big", N, 9, 7, C, 6, k, 2, 2, 0, &OH, &OW);
                snprintf(what, sizeof what, "conv %s k=5 stride=2 batch 5 %s", mpt_dtype_name(dt),
                         col2im ? "col2im in rounds" : "phases");
                run_both(g, 1, tol_for(TOL_ACCUM, dt, k * k * C * N * OH * OW), 0, what, FUSED);
                mpt_graph_free(g);
                unsetenv("MPT_CPU_CONV_CHUNK_BYTES");
                unsetenv("MPT_CPU_DGRAD");
            }
        }
        /* a 1x1 kernel with a stride: filled and packed (the default),
         * then gathered, where f16, and bf16 without AMX, widen only the
         * rows and columns that windows read (1x1 stride 2 unpadded;
         * stride 3 with a pixel of padding, which shifts them) */
        for (int v = 0; v < 4; v++) {
            int64_t N = 3, C = 16, st = 2 + v % 2, p = v % 2, OH, OW;
            if (v >= 2) setenv("MPT_CPU_CONV_GATHER", "1", 1);
            mpt_graph *g = conv_graph(dt, "conv_sub", N, 9, 8, C, 24, 1, st, p, 0, &OH, &OW);
            snprintf(what, sizeof what, "conv %s 1x1 stride %lld pad %lld%s", mpt_dtype_name(dt),
                     (long long)st, (long long)p, v >= 2 ? " gathered" : "");
            run_both(g, 1, tol_for(TOL_ACCUM, dt, C * N * OH * OW), 0, what, FUSED);
            mpt_graph_free(g);
            unsetenv("MPT_CPU_CONV_GATHER");
        }
        /* enough channels that K = KH*KW*C = 1200 passes the GEMM's k block
         * and the filter gradient's M covers several groups of slivers: the
         * implicit GEMM's windows cut kernel rows and image edges anywhere
         * (f32, and bf16 without AMX, gather them from the padded image);
         * then filled and packed instead (bf16: in vdpbf16ps pairs, then
         * widened to f32, as where N > 128); then the column matrix in
         * memory */
        for (int cols = 0; cols < 4; cols++) {
            if ((cols == 1 && dt == MPT_DT_F16) || (cols == 3 && dt != MPT_DT_BF16)) continue;
            int64_t N = 3, C = 48, k = 5, OH, OW;
            if (cols == 1 || cols == 3) setenv("MPT_CPU_CONV_GATHER", "0", 1);
            if (cols == 1 && dt == MPT_DT_BF16) setenv("MPT_CPU_BF16_DOT", "1", 1);
            if (cols == 3) setenv("MPT_CPU_BF16_DOT", "0", 1);
            if (cols == 2) setenv("MPT_CPU_CONV_EXPLICIT", "1", 1);
            mpt_graph *g = conv_graph(dt, "conv_wide", N, 11, 10, C, 40, k, 2, 2, 0, &OH, &OW);
            static const char *how[] = {"implicit", "implicit packed", "explicit",
                                        "implicit packed widened"};
            snprintf(what, sizeof what, "conv %s k=5 C=48 %s columns", mpt_dtype_name(dt),
                     how[cols]);
            run_both(g, 1, tol_for(TOL_ACCUM, dt, k * k * C * N * OH * OW), 0, what, FUSED);
            if (cols == 0 && dt == MPT_DT_BF16) {
                /* without AMX every direction gathers (from an f32 copy) */
                char feats[256];
                int amx = strstr(mpt_cpu_host_features(feats, sizeof feats), "amx in use") != NULL;
                char *text = amx ? NULL : plan_text(g, what), *t = text ? text : "";
                CHECK_MSG(amx || (strstr(t, "conv2d via gathered implicit") &&
                                  strstr(t, "conv2d_bwd_filter via gathered implicit") &&
                                  strstr(t, "phased gathered")),
                          "%s: not gathered\n%s", what, t);
                free(text);
            }
            mpt_graph_free(g);
            unsetenv("MPT_CPU_CONV_EXPLICIT");
            unsetenv("MPT_CPU_CONV_GATHER");
            unsetenv("MPT_CPU_BF16_DOT");
        }
        /* bf16 on AMX with a batch of 16s and 32s of channels: A's tiles are
         * read in place from an interleaved padded copy (forward and data
         * gradient), rows in (N/16, position, 16) order. 32 images, K over
         * the k block (1600), stride 2; then 16 images with 49 positions,
         * so the last 32-row tile is half past the end. Then batches of 8
         * (interleave 8, a tile's rows two positions of 8 images): stride 1
         * (forward and data gradient), and stride 2, where only the data
         * gradient's phases (4 grid columns each) step one column. First
         * layers (3 channels): 7x3 and 11x3 kernel rows as tiles (forward
         * where OW is 16); filter gradients with dy transposed (64 filters)
         * or packed, 225 positions leaving an odd pair, no padding; then
         * 32 channels, whose filter gradients (no tiles below a batch of
         * 32) take the kernel rows too. Last, a 1x1 stride-2 convolution
         * of 8 images, whose data gradient has phases without taps (zeros)
         * beside the one its tiles store in place. Then stride-1 filter
         * gradients from channel planes (emit_planes.c): 14 positions a row
         * on a grid 16 wide, a 5x5 kernel of 16 channels over 3 images, and
         * no padding (the grid as wide as the image). */
        if (dt == MPT_DT_BF16) {
            /* N, H, W, C, O, k, stride, pad; kernel rows: 1 first layer, 2 filter
             * gradient; 3: filter gradient from channel planes */
            static const int64_t shapes[15][9] = {
                {32, 9, 7, 64, 64, 5, 2, 2, 0}, {16, 7, 7, 64, 32, 3, 1, 1, 0},
                {8, 6, 10, 64, 32, 3, 1, 1, 0}, {8, 8, 8, 64, 32, 3, 2, 1, 0},
                {2, 9, 31, 3, 40, 7, 2, 3, 1}, {3, 5, 16, 3, 24, 11, 1, 5, 1}, {2, 7, 37, 3, 32, 7, 2, 0, 1},
                {2, 6, 31, 3, 64, 7, 2, 3, 1}, {3, 5, 15, 3, 24, 11, 1, 5, 1},
                {4, 12, 12, 32, 16, 3, 1, 1, 2}, {4, 24, 24, 32, 32, 3, 2, 1, 2},
                {8, 8, 8, 64, 32, 1, 2, 0, 0}, {8, 14, 14, 32, 32, 3, 1, 1, 3},
                {3, 12, 28, 16, 16, 5, 1, 2, 3}, {2, 10, 30, 32, 16, 3, 1, 0, 3}};
            char feats[256];
            int amx = strstr(mpt_cpu_host_features(feats, sizeof feats), "amx in use") != NULL;
            for (int t = 0; t < 15; t++) {
                const int64_t *v = shapes[t];
                int64_t OH, OW;
                mpt_graph *g = conv_graph(dt, "conv_tiles", v[0], v[1], v[2], v[3], v[4], v[5],
                                          v[6], v[7], 1, &OH, &OW);
                snprintf(what, sizeof what, "conv bf16 k=%lld stride=%lld batch %lld AMX tiles",
                         (long long)v[5], (long long)v[6], (long long)v[0]);
                run_both(g, 1, tol_for(TOL_ACCUM, dt, v[5] * v[5] * v[3] * v[0] * OH * OW), 0,
                         what, FUSED);
                if (amx) {
                    /* the plan says which convolutions took which tiles: the
                     * interleave of 8; kernel rows (a first layer's forward
                     * where an output row is whole tiles, filter gradients) */
                    char *text = plan_text(g, what), *t = text ? text : "";
                    int fwd8 = strstr(t, "conv2d via AMX tiles in place, images in 8s") != NULL;
                    int bwd8 = strstr(t, "phased AMX tiles in place, images in 8s") != NULL;
                    int fwd = strstr(t, "conv2d via AMX tiles by kernel row") != NULL;
                    int dw = strstr(t, "conv2d_bwd_filter via AMX tiles by kernel row") != NULL;
                    int planes = strstr(t, "conv2d_bwd_filter via AMX tiles from channel planes") != NULL;
                    CHECK_MSG(v[0] != 8 || (bwd8 && fwd8 == (v[6] == 1)), "%s: by 8s forward %d, "
                              "data gradient %d\n%s", what, fwd8, bwd8, t);
                    CHECK_MSG(dw == (v[8] == 1 || v[8] == 2) && fwd == (v[8] == 1 && OW % 16 == 0) &&
                              planes == (v[8] == 3), "%s: by kernel row forward %d, filter "
                              "gradient %d; from planes %d\n%s", what, fwd, dw, planes, t);
                    free(text);
                }
                mpt_graph_free(g);
            }
        }
        /* stride 3 with an even kernel and unequal pads: the data gradient's
         * phases get 2 or 1 taps per dim and grids of unequal size (bf16 runs
         * it by phases) */
        {
            int64_t N = 3, H = 10, W = 8, C = 5, O = 7, kh = 4, kw = 2, st = 3, ph = 2, pw = 0;
            int64_t OH = mpt_conv_out_size(H, kh, st, ph, 1), OW = mpt_conv_out_size(W, kw, st, pw, 1);
            mpt_graph *g = mpt_graph_new("conv_phases");
            int w = mpt_b_cast(g, mpt_b_input(g, "w", MPT_DT_F32, mpt_shape_4(kh, kw, C, O)), dt);
            int dy = mpt_b_cast(g, mpt_b_input(g, "dy", MPT_DT_F32, mpt_shape_4(N, OH, OW, O)), dt);
            mpt_graph_add_output(g, "dx", mpt_b_conv2d_bwd_data(g, dy, w, st, st, ph, pw, mpt_shape_4(N, H, W, C)));
            snprintf(what, sizeof what, "conv %s 4x2 stride=3 data gradient", mpt_dtype_name(dt));
            run_both(g, 1, tol_for(TOL_ACCUM, dt, kh * kw * O), 0, what, FUSED);
            mpt_graph_free(g);
        }
        mpt_graph *g = mpt_graph_new("opaque");
        mpt_shape xs = mpt_shape_4(2, 7, 9, 3);
        int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, xs), dt);
        int mp = mpt_b_pool(g, MPT_OP_MAX_POOL, x, 2, 2, 2, 2, 0, 0, mpt_shape_4(2, 3, 4, 3));
        int ap = mpt_b_pool(g, MPT_OP_AVG_POOL, x, 3, 3, 2, 2, 1, 1, mpt_shape_4(2, 4, 5, 3));
        mpt_graph_add_output(g, "max_pool", mp);
        mpt_graph_add_output(g, "avg_pool", ap);
        /* overlapping windows with padding (ResNet-50's first pooling):
         * the gradient's ring of input rows wraps while rows are shared */
        int mp3 = mpt_b_pool(g, MPT_OP_MAX_POOL, x, 3, 3, 2, 2, 1, 1, mpt_shape_4(2, 4, 5, 3));
        mpt_graph_add_output(g, "max_pool_3x3", mp3);
        /* dy before g->nodes is read: a new node may move it */
        int n2 = mpt_b_unary(g, MPT_OP_NEG, mp), n3 = mpt_b_unary(g, MPT_OP_NEG, mp3);
        int na = mpt_b_unary(g, MPT_OP_NEG, ap);
        mpt_graph_add_output(g, "max_pool_grad", mpt_b_max_pool_grad(g, x, n2, &g->nodes[mp].attr));
        mpt_graph_add_output(g, "max_pool_3x3_grad", mpt_b_max_pool_grad(g, x, n3, &g->nodes[mp3].attr));
        mpt_graph_add_output(g, "avg_pool_grad", mpt_b_avg_pool_grad(g, na, &g->nodes[ap].attr, xs));
        int v = mpt_b_cast(g, mpt_b_input(g, "v", MPT_DT_F32, mpt_shape_2(9, 10)), dt);
        mpt_graph_add_output(g, "argmax", mpt_b_argmax(g, v, 1));
        mpt_graph_add_output(g, "argmax_axis0", mpt_b_argmax(g, v, 0)); /* strided */
        int ids = mpt_b_input(g, "ids", MPT_DT_I32, mpt_shape_1(9));
        mpt_graph_add_output(g, "scatter_add", mpt_b_scatter_add(g, ids, mpt_b_unary(g, MPT_OP_NEG, v), 12));
        /* rows longer than the 16 lanes of the f32 argmax and more than one
         * task of rows (64) or of scatter_add's columns (16) */
        int w = mpt_b_cast(g, mpt_b_input(g, "w", MPT_DT_F32, mpt_shape_2(150, 37)), dt);
        mpt_graph_add_output(g, "argmax_long", mpt_b_argmax(g, w, 1));
        /* integers 0..9: ties everywhere, the first maximum must win */
        int ties = mpt_b_cast(g, mpt_b_input(g, "ties", MPT_DT_I32, mpt_shape_2(150, 37)), dt);
        mpt_graph_add_output(g, "argmax_ties", mpt_b_argmax(g, ties, 1));
        int ids2 = mpt_b_input(g, "ids2", MPT_DT_I32, mpt_shape_1(150));
        mpt_graph_add_output(g, "scatter_add_wide", mpt_b_scatter_add(g, ids2, w, 40));
        snprintf(what, sizeof what, "opaque %s", mpt_dtype_name(dt));
        run_both(g, 1, tol_for(TOL_EXACT, dt, 1), 0, what, BOTH);
        mpt_graph_free(g);
    }
}

/* Gathered convolutions skip the k of their windows in the padding: whole
 * kernel rows, by segments of each kernel row, or by segments with the
 * rows in (position, image) order (emit_ranges.c). Every way, forced and
 * as chosen, on a large kernel over a small image (most windows cut on
 * every side; the k block of 1024 cuts kernel rows of 7 x 24 taps; 13
 * images and 25 positions leave tiles straddling both), a 5x5 kernel with
 * unequal pads, an f16 first layer (3 channels, gathered, 3-tap
 * segments) and the conv_3-like shape in f16 (gathered from an f32 copy);
 * the plan names the way chosen for the conv_3-like shapes. */
static void test_conv_skip(void) {
    /* N, H, W, C, O, k, stride, pad, dtype */
    static const int64_t shapes[][9] = {{13, 9, 9, 24, 40, 7, 2, 3, 0}, {5, 8, 11, 16, 24, 5, 1, 1, 0},
                                        {3, 13, 12, 3, 16, 5, 2, 2, 1}, {16, 16, 16, 16, 16, 11, 2, 5, 0},
                                        {16, 16, 16, 16, 16, 11, 2, 5, 1}};
    static const char *modes[] = {"rows", "runs", "images", NULL};
    char what[160];
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++)
        for (int m = 0; m < 4; m++) {
            const int64_t *v = shapes[t];
            mpt_dtype dt = v[8] ? MPT_DT_F16 : MPT_DT_F32;
            int64_t OH, OW;
            if (modes[m]) setenv("MPT_CPU_CONV_SKIP", modes[m], 1);
            mpt_graph *g = conv_graph(dt, "conv_skip", v[0], v[1], v[2], v[3], v[4], v[5], v[6],
                                      v[7], 1, &OH, &OW);
            snprintf(what, sizeof what, "conv %s k=%lld stride=%lld pad=%lld skipping %s",
                     mpt_dtype_name(dt), (long long)v[5], (long long)v[6], (long long)v[7],
                     modes[m] ? modes[m] : "as chosen");
            run_both(g, 1, tol_for(TOL_ACCUM, dt, v[5] * v[5] * v[3] * v[0] * OH * OW), 0, what,
                     FUSED);
            if (t >= 3 && !modes[m]) {
                /* 11x11 over 16x16, stride 2: 31% of the windows' taps in the
                 * padding, most of them left and right; f16 gathers from an
                 * f32 copy of the image, the data gradient's too */
                char *text = plan_text(g, what), *p = text ? text : "";
                CHECK_MSG(strstr(p, "conv2d via gathered implicit gemm") &&
                              strstr(p, "rows (position, image)") &&
                              strstr(p, "conv2d_bwd_filter via gathered implicit gemm") &&
                              strstr(strstr(p, "conv2d_bwd_filter via gathered"), "by segments") &&
                              (dt != MPT_DT_F16 ||
                               (strstr(p, "phased gathered") && strstr(p, "A=f16 (an f32 copy)"))),
                          "%s: the plan\n%s", what, p);
                free(text);
            }
            unsetenv("MPT_CPU_CONV_SKIP");
            mpt_graph_free(g);
        }
}

/* The transposes of the data gradients' weights: blocks of 32 source rows
 * split over the pool from 1 MiB, 4x4 (f32) and 8x8 (f16/bf16) tiles with scalar
 * edges, against the definition. */
static void test_transpose(void) {
    static const int64_t sizes[][2] = {{75, 130}, {300, 517}, {512, 512}, {33, 9}, {1, 700}, {700, 1}, {701, 803}};
    mpt_pool *pool = mpt_pool_new(2);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (size_t es = 2; es <= 4; es += 2) {
            int64_t R = sizes[i][0], C = sizes[i][1];
            unsigned char *a = malloc((size_t)(R * C) * es), *b = calloc((size_t)(R * C), es);
            for (int64_t k = 0; k < R * C * (int64_t)es; k++) a[k] = (unsigned char)(k * 7 + k / 251);
            mpt_cpu_transpose(pool, a, b, R, C, es);
            int64_t bad = 0;
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < C; c++)
                    bad += memcmp(b + (size_t)(c * R + r) * es, a + (size_t)(r * C + c) * es, es) != 0;
            CHECK_MSG(bad == 0, "transpose %lldx%lld of %zu-byte elements: %lld wrong", (long long)R,
                      (long long)C, es, (long long)bad);
            free(a);
            free(b);
        }
    mpt_pool_free(pool);
}

/* What an AVX2 CPU runs (MPTC_CPU_ISA=avx2): the gathered tile (6 rows,
 * its k steps as inline assembly: gemm_asm.c) in every direction where a
 * quarter of the taps lie on the padding (5x5 stride 2 over 11x10: 76%
 * inside); where few do (3x3 over 16x16: 92%) the forward and data
 * gradient gathered and the filter gradient filled and packed; in every
 * dtype (more than 32 output columns each way: fewer gather anyway),
 * against the interpreter. */
static void test_conv_avx2(void) {
    char what[128];
    setenv("MPTC_CPU_ISA", "avx2", 1);
    for (int d = 0; d < 3; d++) {
        mpt_dtype dt = float_dts[d];
        for (int packed = 0; packed < 2; packed++) {
            int64_t N = packed ? 2 : 3, C = 48, O = 40, k = packed ? 3 : 5, OH, OW;
            mpt_graph *g = packed ? conv_graph(dt, "conv_avx2", N, 16, 16, C, O, k, 1, 1, 0, &OH, &OW)
                                  : conv_graph(dt, "conv_avx2", N, 11, 10, C, O, k, 2, 2, 0, &OH, &OW);
            snprintf(what, sizeof what, "avx2 conv %s k=%lld %s", mpt_dtype_name(dt), (long long)k,
                     packed ? "packed" : "gathered");
            run_both(g, 1, tol_for(TOL_ACCUM, dt, k * k * C * N * OH * OW), 0, what, FUSED);
            char *text = plan_text(g, what), *t = text ? text : "";
            int fwd = strstr(t, "conv2d via gathered implicit") != NULL,
                wgrad = strstr(t, "conv2d_bwd_filter via gathered implicit") != NULL,
                dgrad = strstr(t, "phased gathered") != NULL;
            CHECK_MSG(fwd && dgrad && wgrad == !packed, "%s: forward %d, data gradient %d, "
                      "filter gradient %d gathered\n%s", what, fwd, dgrad, wgrad, t);
            /* stride 2: each phase's rows stored at their dx positions by the GEMM */
            CHECK_MSG(packed || strstr(t, "rows stored at their dx positions"),
                      "%s: the strided data gradient not stored in place\n%s", what, t);
            free(text);
            mpt_graph_free(g);
        }
    }
    unsetenv("MPTC_CPU_ISA");
}

/* A forward convolution's epilogue chain in its GEMM: out = f32(relu(conv(x,
 * w) + bias)) with every value of dt rounded as the interpreter rounds it
 * (bf16: round, + the bias rounded, relu, round again into an f32 C), on
 * the shapes that take the gathered tile, AMX tiles in place, kernel rows
 * (a first layer) and the direct GEMM (1x1). The bias is not zero (Keras'
 * initial bias is), so a chain that skipped or misplaced it fails. */
static void test_conv_chain(void) {
    static const struct { int64_t N, H, C, O, k, st; } shapes[] = {
        {8, 14, 32, 64, 3, 1}, {8, 16, 64, 64, 1, 1}, {8, 32, 3, 64, 7, 2}, {4, 12, 16, 32, 3, 2}};
    char what[160];
    for (int d = 0; d < 3; d += 2)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            mpt_dtype dt = float_dts[d];
            int64_t N = shapes[si].N, H = shapes[si].H, C = shapes[si].C, O = shapes[si].O;
            int64_t k = shapes[si].k, st = shapes[si].st, p = k / 2;
            int64_t OH = mpt_conv_out_size(H, k, st, p, p);
            mpt_graph *g = mpt_graph_new("conv_chain");
            int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_4(N, H, H, C)), dt);
            int w = mpt_b_cast(g, mpt_b_variable(g, "w", mpt_shape_4(k, k, C, O), MPT_INIT_UNIFORM, 0, 0, 3, 1), dt);
            int bias = mpt_b_variable(g, "bias", mpt_shape_1(O), MPT_INIT_UNIFORM, 0, 0, 3, 1);
            mpt_shape ys = mpt_shape_4(N, OH, OH, O);
            int y = mpt_b_conv2d(g, x, w, (int)st, (int)st, (int)p, (int)p, ys);
            int z = mpt_b_binary(g, MPT_OP_ADD, y, mpt_b_broadcast(g, mpt_b_cast(g, bias, dt), ys, 0x8));
            mpt_graph_add_output(g, "out", mpt_b_cast(g, mpt_b_unary(g, MPT_OP_RELU, z), MPT_DT_F32));
            snprintf(what, sizeof what, "conv chain %s k=%lld stride=%lld C=%lld", mpt_dtype_name(dt),
                     (long long)k, (long long)st, (long long)C);
            run_both(g, 1, tol_for(TOL_ACCUM, dt, k * k * C), 0, what, FUSED);
            char *text = plan_text(g, what), *t = text ? text : "";
            const char *want = dt == MPT_DT_F32 ? "C=f32 trans=NN" : "C=f32 trans=NN";
            const char *steps = dt == MPT_DT_F32 ? "2 epilogue steps (+ bias f32, relu)"
                                                 : "4 epilogue steps (round to bf16, + bias f32 as bf16, relu, round to bf16)";
            CHECK_MSG(strstr(t, want) && strstr(t, steps), "%s: the chain is not in the GEMM's epilogue:\n%s", what, t);
            free(text);
            mpt_graph_free(g);
        }
}

/* f32 convolutions whose gathered rows are evenly spaced (output
 * positions along an image row, channels of a tap): on AVX-512 tiles of
 * such rows read them from one pointer, and a multiple of 64 output
 * columns takes the 7 x 64 tile (gemm.c), 256 of them gathered too. Image
 * rows of 14 and 7 positions (every 7-row tile even; the data gradient of
 * 32 channels on 10 x 32), of 10 (tiles across rows take the pointer a
 * row), stride 2; each direction against the interpreter, and the plan
 * names the tile. */
static void test_conv_even_rows(void) {
    static const int64_t shapes[][8] = {{2, 14, 14, 32, 64, 3, 1, 1}, {2, 6, 10, 64, 256, 3, 1, 1},
                                        {2, 13, 13, 64, 64, 3, 2, 1}};
    char what[128], feats[256];
    int avx512 = strstr(mpt_cpu_host_features(feats, sizeof feats), " avx512bw") && !getenv("MPTC_CPU_ISA");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t *v = shapes[si];
        int64_t OH, OW;
        mpt_graph *g = conv_graph(MPT_DT_F32, "conv_even", v[0], v[1], v[2], v[3], v[4], v[5], v[6],
                                  v[7], 0, &OH, &OW);
        snprintf(what, sizeof what, "conv f32 even rows %lldx%lld C=%lld O=%lld stride=%lld",
                 (long long)OH, (long long)OW, (long long)v[3], (long long)v[4], (long long)v[6]);
        run_both(g, 1, tol_for(TOL_ACCUM, MPT_DT_F32, v[5] * v[5] * v[3] * v[0] * OH * OW), 0, what, FUSED);
        char *text = plan_text(g, what), *t = text ? text : "";
        const char *fwd = strstr(t, "conv2d via gathered implicit");
        const char *line_end = fwd ? strchr(fwd, '\n') : NULL;
        const char *tall = fwd ? strstr(fwd, "7 x 64 tiles, evenly spaced rows on one pointer") : NULL;
        CHECK_MSG(!avx512 || (fwd && tall && (!line_end || tall < line_end)),
                  "%s: the forward pass does not gather on the 7 x 64 tile\n%s", what, t);
        free(text);
        mpt_graph_free(g);
    }
}

/* bf16 where vdpbf16ps pays and there is no AMX (both forced here, on any
 * host with AVX512_BF16): the forward pass and the data gradient read A's
 * channel pairs as one 32-bit broadcast each, from the bf16 image itself
 * (desc.a_pairs), and the filter gradient pairs of images from a copy
 * with images interleaved in twos. K = 1200 over several k blocks of
 * pairs, taps cut by the padding, a batch of 3 (its filter gradient
 * widens); a stride-1 3x3 whose rows run on one pointer (the forward on
 * the 7 x 64 tile); no padding at all (forward and data gradient read the
 * image in place); 3 channels, whose forward taps cannot pair; 256
 * filters, which gather in pairs where f16 or a widened bf16 would pack;
 * a 1x1 (plain GEMMs read in place); and stride 2 with an even batch
 * (every direction in pairs).
 * Each direction against the interpreter, and the plan names the pairs. */
static void test_conv_pairs(void) {
    static const int64_t shapes[][8] = {{3, 11, 10, 48, 40, 5, 2, 2}, {2, 14, 14, 32, 64, 3, 1, 1},
                                        {2, 9, 7, 16, 24, 3, 1, 0}, {2, 9, 9, 3, 16, 3, 1, 1},
                                        {2, 6, 10, 64, 256, 3, 1, 1}, {2, 6, 10, 32, 64, 1, 1, 0},
                                        {2, 9, 8, 16, 24, 3, 2, 1}};
    char what[128], feats[256];
    if (!strstr(mpt_cpu_host_features(feats, sizeof feats), " avx512bf16") || getenv("MPTC_CPU_ISA")) return;
    setenv("MPT_CPU_NO_AMX", "1", 1);
    setenv("MPT_CPU_BF16_DOT", "1", 1);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t *v = shapes[si];
        int64_t OH, OW;
        mpt_graph *g = conv_graph(MPT_DT_BF16, "conv_pairs", v[0], v[1], v[2], v[3], v[4], v[5], v[6],
                                  v[7], 0, &OH, &OW);
        snprintf(what, sizeof what, "conv bf16 pairs %lldx%lld C=%lld O=%lld k=%lld stride=%lld pad=%lld",
                 (long long)OH, (long long)OW, (long long)v[3], (long long)v[4], (long long)v[5],
                 (long long)v[6], (long long)v[7]);
        run_both(g, 1, tol_for(TOL_ACCUM, MPT_DT_BF16, v[5] * v[5] * (v[3] > v[4] ? v[3] : v[4]) * v[0] * OH * OW),
                 0, what, FUSED);
        char *text = plan_text(g, what), *t = text ? text : "";
        int pairs = 0;
        for (const char *at = t; (at = strstr(at, "A=bf16 (in pairs)")); at++) pairs++;
        /* the forward with an even number of channels, the data gradient
         * with an even number of filters, the filter gradient with an
         * even batch; the others widen */
        int pointwise = v[5] == 1, want = (v[3] % 2 == 0) + (v[4] % 2 == 0) + (!pointwise && v[0] % 2 == 0);
        CHECK_MSG(pairs == want && strstr(t, pointwise ? "conv2d_bwd_filter via direct" : "conv2d_bwd_filter via gathered implicit") &&
                      !strstr(t, "A=bf16 (an f32 copy)") == (pointwise || want == 3),
                  "%s: %d GEMMs read pairs, not %d\n%s", what, pairs, want, t);
        free(text);
        mpt_graph_free(g);
    }
    /* a dense layer's products: y = x w and dx = dy w^T read x and dy in
     * place, in pairs (K = 96 and 40); dw = x^T dy packs */
    mpt_graph *g = mpt_graph_new("dense_pairs");
    int x = mpt_b_cast(g, mpt_b_input(g, "x", MPT_DT_F32, mpt_shape_2(37, 96)), MPT_DT_BF16);
    int w = mpt_b_cast(g, mpt_b_input(g, "w", MPT_DT_F32, mpt_shape_2(96, 40)), MPT_DT_BF16);
    int dy = mpt_b_cast(g, mpt_b_input(g, "dy", MPT_DT_F32, mpt_shape_2(37, 40)), MPT_DT_BF16);
    mpt_graph_add_output(g, "y", mpt_b_matmul(g, x, w, 0, 0));
    mpt_graph_add_output(g, "dx", mpt_b_matmul(g, dy, w, 0, 1));
    mpt_graph_add_output(g, "dw", mpt_b_matmul(g, x, dy, 1, 0));
    run_both(g, 1, tol_for(TOL_ACCUM, MPT_DT_BF16, 96 * 37), 0, "dense bf16 pairs", FUSED);
    char *text = plan_text(g, "dense bf16 pairs"), *t = text ? text : "";
    int pairs = 0;
    for (const char *at = t; (at = strstr(at, "A=bf16 (in pairs)")); at++) pairs++;
    CHECK_MSG(pairs == 2, "dense bf16 pairs: %d GEMMs read pairs, not 2\n%s", pairs, t);
    free(text);
    mpt_graph_free(g);
    unsetenv("MPT_CPU_NO_AMX");
    unsetenv("MPT_CPU_BF16_DOT");
}

int main(void) {
    char why[256];
    if (!mpt_backend_cpu.available(why, sizeof why)) {
        printf("skipped: the CPU JIT is not available here: %s\n", why);
        return 77;
    }
    TIMED(test_conv_and_opaque());
    TIMED(test_conv_skip());
    TIMED(test_conv_chain());
    TIMED(test_conv_even_rows());
    TIMED(test_conv_pairs());
    TIMED(test_transpose());
    TIMED(test_conv_avx2());
    return check_exit("test_cpu_conv");
}
