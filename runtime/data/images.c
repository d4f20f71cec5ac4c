/* runtime/data/images.c — decoding PNG and JPEG files and resizing them.
 *
 * Both libraries report errors by longjmp from their error callbacks, their
 * documented way; each decoder keeps its allocations in volatile locals so
 * the landing code can free them. A truncated JPEG is only a warning to
 * libjpeg (it pads the image with gray); we count warnings and refuse the
 * image, as TensorFlow's decoder does.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <jpeglib.h>
#include <png.h>
#include "runtime/data/data_impl.h"

/* Decoding larger images is almost surely a damaged header. */
#define IMAGE_MAX_SIDE 32768

/* ---- PNG ---------------------------------------------------------------- */

typedef struct {
    jmp_buf jb;
    char msg[256];
} png_failure;

static void png_on_error(png_structp png, png_const_charp msg) {
    png_failure *f = png_get_error_ptr(png);
    snprintf(f->msg, sizeof f->msg, "%s", msg);
    longjmp(f->jb, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) {
    /* Warnings (unknown chunks, bad gamma) leave the pixels usable. */
}

/* pixels is RGB8, row-major (h, w, 3); NULL reads the header only. */
static int decode_png(FILE *fp, const char *path, uint8_t **pixels, int *w, int *h,
                      char *err, size_t n) {
    png_failure fail = {.msg = ""};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &fail, png_on_error,
                                             png_on_warning);
    if (!png)
        return mpt_data_fail(err, n, "%s: cannot start the PNG decoder", path);
    png_infop info = png_create_info_struct(png);
    uint8_t *volatile px = NULL;
    png_bytep *volatile rows = NULL;
    if (setjmp(fail.jb)) {
        png_destroy_read_struct(&png, &info, NULL);
        free(px);
        free(rows);
        return mpt_data_fail(err, n, "%s: corrupt PNG file (%s)", path, fail.msg);
    }
    if (!info)
        png_error(png, "out of memory");
    png_init_io(png, fp);
    png_set_user_limits(png, IMAGE_MAX_SIDE, IMAGE_MAX_SIDE);
    png_read_info(png, info);
    int width = (int)png_get_image_width(png, info);
    int height = (int)png_get_image_height(png, info);
    int color = png_get_color_type(png, info);
    if (!pixels) {
        png_destroy_read_struct(&png, &info, NULL);
        *w = width;
        *h = height;
        return 0;
    }
    /* Every color type and bit depth becomes 8-bit RGB; alpha is dropped
     * as decode_png(channels=3) drops it. */
    png_set_expand(png);
    png_set_scale_16(png);
    png_set_strip_alpha(png);
    if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA)
        png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    if (png_get_rowbytes(png, info) != (size_t)width * 3)
        png_error(png, "unexpected row size after conversion to RGB");
    px = malloc((size_t)width * (size_t)height * 3);
    rows = malloc(sizeof *rows * (size_t)height);
    if (!px || !rows)
        png_error(png, "out of memory");
    for (int y = 0; y < height; y++)
        rows[y] = px + (size_t)y * (size_t)width * 3;
    png_read_image(png, rows);
    png_read_end(png, NULL);
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    *pixels = px;
    *w = width;
    *h = height;
    return 0;
}

/* ---- JPEG --------------------------------------------------------------- */

typedef struct {
    struct jpeg_error_mgr mgr; /* first, so the library's pointer is ours */
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX];
} jpeg_failure;

static void jpeg_on_error(j_common_ptr c) {
    jpeg_failure *f = (jpeg_failure *)c->err;
    c->err->format_message(c, f->msg);
    longjmp(f->jb, 1);
}

/* level < 0 is a warning about corrupt data; keep the first one. */
static void jpeg_on_message(j_common_ptr c, int level) {
    jpeg_failure *f = (jpeg_failure *)c->err;
    if (level >= 0)
        return;
    if (c->err->num_warnings++ == 0)
        c->err->format_message(c, f->msg);
}

static int decode_jpeg(FILE *fp, const char *path, uint8_t **pixels, int *w, int *h,
                       char *err, size_t n) {
    struct jpeg_decompress_struct cinfo;
    jpeg_failure fail = {.msg = ""};
    cinfo.err = jpeg_std_error(&fail.mgr);
    fail.mgr.error_exit = jpeg_on_error;
    fail.mgr.emit_message = jpeg_on_message;
    uint8_t *volatile px = NULL;
    if (setjmp(fail.jb)) {
        jpeg_destroy_decompress(&cinfo);
        free(px);
        return mpt_data_fail(err, n, "%s: corrupt JPEG file (%s)", path, fail.msg);
    }
    jpeg_create_decompress(&cinfo);
    jpeg_stdio_src(&cinfo, fp);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        jpeg_destroy_decompress(&cinfo);
        return mpt_data_fail(err, n, "%s: CMYK JPEG files are not supported", path);
    }
    if (cinfo.image_width > IMAGE_MAX_SIDE || cinfo.image_height > IMAGE_MAX_SIDE) {
        jpeg_destroy_decompress(&cinfo);
        return mpt_data_fail(err, n, "%s: image of %ux%u is larger than %d on a side",
                             path, cinfo.image_width, cinfo.image_height, IMAGE_MAX_SIDE);
    }
    if (!pixels) {
        *w = (int)cinfo.image_width;
        *h = (int)cinfo.image_height;
        jpeg_destroy_decompress(&cinfo);
        return 0;
    }
    /* libjpeg-turbo converts grayscale to RGB itself. */
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    int width = (int)cinfo.output_width, height = (int)cinfo.output_height;
    px = malloc((size_t)width * (size_t)height * 3);
    if (!px) {
        snprintf(fail.msg, sizeof fail.msg, "out of memory");
        longjmp(fail.jb, 1);
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = px + (size_t)cinfo.output_scanline * (size_t)width * 3;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
    long warnings = fail.mgr.num_warnings;
    jpeg_destroy_decompress(&cinfo);
    if (warnings > 0) {
        free(px);
        return mpt_data_fail(err, n, "%s: corrupt JPEG file (%s)", path, fail.msg);
    }
    *pixels = px;
    *w = width;
    *h = height;
    return 0;
}

/* ---- either ------------------------------------------------------------ */

int mpt_image_decode_rgb8(const char *path, uint8_t **pixels, int *w, int *h,
                          char *err, size_t n) {
    struct stat st; /* a FIFO would block the open */
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return mpt_data_fail(err, n, "%s: is not a regular file (a pipe, a device or a folder)",
                             path);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return mpt_data_fail(err, n, "%s: cannot open: %s", path, strerror(errno));
    uint8_t sig[8] = {0};
    size_t got = fread(sig, 1, sizeof sig, fp);
    rewind(fp);
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    int rc;
    if (got == 8 && !memcmp(sig, png_sig, 8))
        rc = decode_png(fp, path, pixels, w, h, err, n);
    else if (got >= 3 && sig[0] == 0xff && sig[1] == 0xd8 && sig[2] == 0xff)
        rc = decode_jpeg(fp, path, pixels, w, h, err, n);
    else if (got == 0)
        rc = mpt_data_fail(err, n, "%s: empty file", path);
    else
        rc = mpt_data_fail(err, n, "%s: neither a PNG nor a JPEG file (it does not start "
                           "with their signature)", path);
    fclose(fp);
    return rc;
}

/* src is (sh, sw, c) bytes; dst is (oh, ow, c) floats. Source coordinate of
 * output pixel o is (o + 0.5) * in / out - 0.5, clamped at the edges. */
void mpt_image_resize_bilinear(const uint8_t *src, int sw, int sh, int c,
                               float *dst, int64_t ow, int64_t oh, float scale) {
    double sy_scale = (double)sh / (double)oh, sx_scale = (double)sw / (double)ow;
    for (int64_t oy = 0; oy < oh; oy++) {
        double fy = ((double)oy + 0.5) * sy_scale - 0.5;
        double y0f = floor(fy);
        int y0 = y0f < 0 ? 0 : (int)y0f;
        int y1 = (int)ceil(fy) > sh - 1 ? sh - 1 : (int)ceil(fy);
        if (y1 < 0)
            y1 = 0;
        double ly = fy - y0f;
        for (int64_t ox = 0; ox < ow; ox++) {
            double fx = ((double)ox + 0.5) * sx_scale - 0.5;
            double x0f = floor(fx);
            int x0 = x0f < 0 ? 0 : (int)x0f;
            int x1 = (int)ceil(fx) > sw - 1 ? sw - 1 : (int)ceil(fx);
            if (x1 < 0)
                x1 = 0;
            double lx = fx - x0f;
            const uint8_t *r0 = src + (size_t)y0 * (size_t)sw * (size_t)c;
            const uint8_t *r1 = src + (size_t)y1 * (size_t)sw * (size_t)c;
            float *out = dst + ((size_t)oy * (size_t)ow + (size_t)ox) * (size_t)c;
            for (int k = 0; k < c; k++) {
                double top = r0[x0 * c + k] + (r0[x1 * c + k] - r0[x0 * c + k]) * lx;
                double bot = r1[x0 * c + k] + (r1[x1 * c + k] - r1[x0 * c + k]) * lx;
                out[k] = (float)((top + (bot - top) * ly) * scale);
            }
        }
    }
}
