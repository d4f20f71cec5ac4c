/* tests/test_data_images.c — the data pipeline's image folders: PNG and
 * JPEG files of every colour type and depth, written into a fresh
 * temporary directory at run time, read, resized and labelled by folder. */
#include <stdio.h> /* before jpeglib.h, which uses FILE and size_t */
#include <jpeglib.h>
#include <png.h>

#include "tests/data_check.h"

/* ---- image folders ------------------------------------------------------------ */

static void write_png(const char *path, int w, int h, int color, int depth,
                      const uint8_t *rows, int row_bytes) {
    FILE *f = fopen(path, "wb");
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, depth, color, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (color == PNG_COLOR_TYPE_PALETTE) {
        png_color pal[2] = {{0, 0, 0}, {255, 0, 0}};
        png_set_PLTE(png, info, pal, 2);
    }
    png_write_info(png, info);
    for (int y = 0; y < h; y++)
        png_write_row(png, (png_bytep)rows + (size_t)y * (size_t)row_bytes);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    fclose(f);
}

static void write_jpeg(const char *path, int w, int h, int comps, const uint8_t *px) {
    struct jpeg_compress_struct c;
    struct jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_compress(&c);
    FILE *f = fopen(path, "wb");
    jpeg_stdio_dest(&c, f);
    c.image_width = (JDIMENSION)w;
    c.image_height = (JDIMENSION)h;
    c.input_components = comps;
    c.in_color_space = comps == 3 ? JCS_RGB : JCS_GRAYSCALE;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, 95, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = (JSAMPROW)px + (size_t)c.next_scanline * (size_t)(w * comps);
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    fclose(f);
}

/* Class "cats": three red PNGs (RGB, RGBA, palette); class "dogs": two blue
 * JPEGs of different sizes and one gray JPEG. */
static void write_image_folder(const char *dir) {
    char p[600];
    static uint8_t buf[40 * 40 * 4];
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/cats", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/dogs", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    write_bytes(p, "not a class", 11, 0);
    for (int i = 0; i < 16 * 12; i++)
        buf[3 * i] = 255, buf[3 * i + 1] = 0, buf[3 * i + 2] = 0;
    snprintf(p, sizeof p, "%s/cats/a.png", dir);
    write_png(p, 16, 12, PNG_COLOR_TYPE_RGB, 8, buf, 16 * 3);
    for (int i = 0; i < 10 * 10; i++)
        buf[4 * i] = 255, buf[4 * i + 1] = 0, buf[4 * i + 2] = 0, buf[4 * i + 3] = 7;
    snprintf(p, sizeof p, "%s/cats/b.PNG", dir);
    write_png(p, 10, 10, PNG_COLOR_TYPE_RGBA, 8, buf, 10 * 4);
    memset(buf, 0xff, 8 * 8 / 8); /* 1-bit palette, index 1 = red */
    snprintf(p, sizeof p, "%s/cats/c.png", dir);
    write_png(p, 8, 8, PNG_COLOR_TYPE_PALETTE, 1, buf, 1);
    for (int i = 0; i < 40 * 40; i++)
        buf[3 * i] = 0, buf[3 * i + 1] = 0, buf[3 * i + 2] = 255;
    snprintf(p, sizeof p, "%s/dogs/a.jpg", dir);
    write_jpeg(p, 40, 40, 3, buf);
    snprintf(p, sizeof p, "%s/dogs/b.jpeg", dir);
    write_jpeg(p, 7, 5, 3, buf);
    memset(buf, 200, 24 * 24);
    snprintf(p, sizeof p, "%s/dogs/c.jpg", dir);
    write_jpeg(p, 24, 24, 1, buf);
}

/* Checks every sample against the color its class was drawn in. */
static int check_colors(const float *x, const int32_t *y, int64_t n) {
    int ok = 1;
    for (int64_t i = 0; i < n; i++) {
        const float *px = x + i * 8 * 8 * 3;
        for (int k = 0; k < 64; k++) {
            float r = px[3 * k], g = px[3 * k + 1], b = px[3 * k + 2];
            ok &= r >= 0 && r <= 1 && g >= 0 && g <= 1 && b >= 0 && b <= 1;
            if (y[i] == 0)
                ok &= r == 1.0f && g == 0 && b == 0;
            else
                ok &= (fabsf(b - 1) < 0.03f && r < 0.03f) ||
                      (fabsf(r - 200 / 255.0f) < 0.03f && r == g && g == b);
        }
    }
    return ok;
}

static void test_images(void) {
    char dir[400], spec[800], p[600];
    snprintf(dir, sizeof dir, "%s/pets", tmp);
    write_image_folder(dir);
    mpt_dataset *d, *s;
    snprintf(spec, sizeof spec, "images(\"%s\", size=[8,8])", dir);
    CHECK_MSG(mpt_data_open(spec, MPT_DATA_TRAIN, NO_SHAPE, &d, err, sizeof err) == 0, "%s", err);
    if (!d)
        return;
    char buf[16];
    mpt_shape sh = mpt_data_sample_shape(d);
    CHECK(mpt_data_count(d) == 6 && mpt_data_num_classes(d) == 2);
    CHECK(sh.rank == 3 && sh.dim[0] == 8 && sh.dim[1] == 8 && sh.dim[2] == 3);
    CHECK(!strcmp(mpt_data_class_name(d, 0, buf), "cats") &&
          !strcmp(mpt_data_class_name(d, 1, buf), "dogs"));
    static float x[6 * 192], xs[6 * 192];
    int32_t y[6], ys[6];
    int64_t real;
    read_batch(d, 0, 6, x, y, &real);
    CHECK(real == 6 && y[0] + y[1] + y[2] + y[3] + y[4] + y[5] == 3);
    CHECK(check_colors(x, y, 6));

    /* Streaming (cache=false) decodes on the worker thread; it must give
     * the same samples in any order of requests, across shuffles. */
    snprintf(spec, sizeof spec, "images(\"%s\", cache=false)", dir);
    int64_t hwc[3] = {8, 8, 3};
    CHECK_MSG(mpt_data_open(spec, MPT_DATA_TRAIN, shape_of(3, hwc), &s, err, sizeof err) == 0,
              "%s", err);
    if (s) {
        static const int64_t seq[] = {0, 1, 2, 2, 0, 1, 1};
        for (int k = 0; k < 7; k++) {
            if (k == 5) {
                mpt_data_shuffle(s, 4, 1);
                mpt_data_shuffle(d, 4, 1);
            }
            float a[2 * 192], b[2 * 192];
            int32_t ya[2], yb[2];
            read_batch(s, seq[k], 2, a, ya, &real);
            read_batch(d, seq[k], 2, b, yb, &real);
            CHECK(memcmp(a, b, sizeof a) == 0 && ya[0] == yb[0] && ya[1] == yb[1]);
        }
        /* Batch size changes mid-way and a padded last batch. */
        read_batch(s, 1, 4, xs, ys, &real);
        CHECK(real == 2);
        mpt_data_free(s);
    }
    mpt_dataset *tr, *va;
    CHECK(mpt_data_split(d, 0.5, &tr, &va, err, sizeof err) == 0);
    CHECK(mpt_data_count(tr) == 3 && mpt_data_count(va) == 3);
    mpt_data_free(tr);
    mpt_data_free(va);
    mpt_data_free(d);

    /* Grayscale: one channel. */
    snprintf(spec, sizeof spec, "images(\"%s\", size=[4,4], color_mode=grayscale, "
             "validation_split=0.5)", dir);
    CHECK_MSG(mpt_data_open(spec, MPT_DATA_TRAIN, NO_SHAPE, &d, err, sizeof err) == 0, "%s", err);
    if (d) {
        CHECK(mpt_data_sample_shape(d).dim[2] == 1 && mpt_data_spec_validation_split(d) == 0.5);
        mpt_data_free(d);
    }

    /* A 16-bit gray PNG; the bilinear weights of a 2 -> 4 upscale. */
    uint16_t gray16[4] = {0, 0xffff, 0x8080, 0x8080};
    uint8_t be[8];
    for (int i = 0; i < 4; i++)
        be[2 * i] = (uint8_t)(gray16[i] >> 8), be[2 * i + 1] = (uint8_t)gray16[i];
    snprintf(p, sizeof p, "%s/g16.png", tmp);
    write_png(p, 2, 2, PNG_COLOR_TYPE_GRAY, 16, be, 4);
    uint8_t *rgb;
    int w, h;
    CHECK_MSG(mpt_image_decode_rgb8(p, &rgb, &w, &h, err, sizeof err) == 0, "%s", err);
    if (w == 2 && h == 2) {
        CHECK(rgb[0] == 0 && rgb[3] == 255 && rgb[4] == 255 && rgb[6] == 128 && rgb[11] == 128);
        free(rgb);
    }
    uint8_t line[2] = {0, 255};
    float out[4];
    mpt_image_resize_bilinear(line, 2, 1, 1, out, 4, 1, 1.0f);
    CHECK(out[0] == 0 && out[1] == 63.75f && out[2] == 191.25f && out[3] == 255);

    /* Damaged files: fatal names them, skip warns and leaves them out. */
    snprintf(p, sizeof p, "%s/cats/zz_bad.png", dir);
    write_bytes(p, "\x89PNG\r\n\x1a\n garbage garbage", 24, 0);
    snprintf(spec, sizeof spec, "images(\"%s\", size=[8,8])", dir);
    expect_open_error(spec, MPT_DATA_TRAIN, NO_SHAPE, "zz_bad.png: corrupt PNG file", "on_error=skip");
    snprintf(spec, sizeof spec, "images(\"%s\", size=[8,8], on_error=skip)", dir);
    CHECK_MSG(mpt_data_open(spec, MPT_DATA_TRAIN, NO_SHAPE, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d && mpt_data_count(d) == 6);
    mpt_data_free(d);
    remove(p);
    /* A JPEG cut short: its header reads, its data does not. */
    snprintf(p, sizeof p, "%s/dogs/a.jpg", dir);
    FILE *f = fopen(p, "rb");
    static uint8_t jpg[65536];
    size_t len = fread(jpg, 1, sizeof jpg, f);
    fclose(f);
    snprintf(p, sizeof p, "%s/dogs/zz_cut.jpg", dir);
    write_bytes(p, jpg, len - 40, 0);
    snprintf(spec, sizeof spec, "images(\"%s\", size=[8,8])", dir);
    expect_open_error(spec, MPT_DATA_TRAIN, NO_SHAPE, "zz_cut.jpg: corrupt JPEG file", "hint:");
    /* Streaming checks headers only: the batch that holds it fails. */
    snprintf(spec, sizeof spec, "images(\"%s\", size=[8,8], cache=false)", dir);
    CHECK_MSG(mpt_data_open(spec, MPT_DATA_TRAIN, NO_SHAPE, &d, err, sizeof err) == 0, "%s", err);
    if (d) {
        int64_t xd[2] = {7, 192}, yd[1] = {7};
        mpt_tensor xt = tensor(MPT_DT_F32, 2, xd), yt = tensor(MPT_DT_I32, 1, yd);
        CHECK(mpt_data_batch(d, 0, 7, &xt, &yt, NULL, err, sizeof err) == -1);
        CHECK_MSG(strstr(err, "zz_cut.jpg: corrupt JPEG file"), "%s", err);
        free(xt.data);
        free(yt.data);
        mpt_data_free(d);
    }
    snprintf(spec, sizeof spec, "images(\"%s\", size=[8,8], on_error=skip)", dir);
    CHECK_MSG(mpt_data_open(spec, MPT_DATA_TRAIN, NO_SHAPE, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d && mpt_data_count(d) == 6);
    mpt_data_free(d);

    /* Folders that are not image data sets. */
    expect_open_error("images(\"/nonexistent/mptc\", size=[8,8])", MPT_DATA_TRAIN, NO_SHAPE,
                      "/nonexistent/mptc: no such directory", "hint:");
    snprintf(p, sizeof p, "%s/empty", tmp);
    mkdir(p, 0755);
    snprintf(spec, sizeof spec, "images(\"%s\", size=[8,8])", p);
    expect_open_error(spec, MPT_DATA_TRAIN, NO_SHAPE, "has no class subfolders", "hint:");
    snprintf(p, sizeof p, "%s/empty/only", tmp);
    mkdir(p, 0755);
    expect_open_error(spec, MPT_DATA_TRAIN, NO_SHAPE, "found no .png, .jpg or .jpeg images", NULL);
    snprintf(spec, sizeof spec, "images(\"%s\")", dir);
    expect_open_error(spec, MPT_DATA_TRAIN, NO_SHAPE, "no image size", "size=[32,32]");
    snprintf(spec, sizeof spec, "images(\"%s\", size=[8,8])", dir);
    expect_open_error(spec, MPT_DATA_TEST, NO_SHAPE, "has no test part", NULL);
}

int main(void) {
    if (data_tmp_init()) return 1;
    test_images();
    data_tmp_remove();
    return check_exit("test_data_images");
}
