/* runtime/cli/cmd_predict.c — `mptc predict`: class probabilities of saved
 * weights for PNG/JPEG images and IDX records, one tab-separated line per
 * sample, through the session's evaluation step.
 *
 * Images are prepared as images("dir") prepares them for training: decoded
 * to RGB, reduced to luma for one-channel models, resized bilinearly to the
 * model's input and scaled to [0,1]. IDX records are scaled by 1/255 as
 * fashion_mnist and idx(...) data are. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/train/train.h"
#include "runtime/cli/cli.h"
#include "runtime/data/data.h"

static const mpt_cli_opt predict_opts[] = {
    MPT_CLI_COMPILE_OPTS,
    {"weights", 1, "safetensors checkpoint (from `mptc train --save`)"},
    {"input", 1, "FILE... PNG/JPEG images, or idx:PATH[:N] (the first N records of an IDX "
                 "image file, gzip or plain); repeatable"},
    {"output", 1, "write the table here instead of standard output"},
    {"data", 1, "data spec whose class names label the output (default: the train block's)"},
    {NULL, 0, NULL},
};

/* One sample: an image file, or record `record` of an IDX file. */
typedef struct {
    const char *path;
    mpt_idx_file *idx;
    int64_t record;
} input_ref;

typedef struct {
    input_ref *in;
    int n, cap;
    const char **idx_specs; /* "idx:..." arguments, in order, for messages */
    mpt_idx_file **files;
    int n_files;
} input_list;

static void inputs_add(input_list *l, input_ref r) {
    if (l->n == l->cap) l->in = realloc(l->in, sizeof *l->in * (size_t)(l->cap = l->cap ? 2 * l->cap : 16));
    l->in[l->n++] = r;
}

static void inputs_free(input_list *l) {
    for (int i = 0; i < l->n_files; i++) mpt_idx_release(l->files[i]);
    free(l->files);
    free(l->in);
}

/* idx:PATH or idx:PATH:N */
static int add_idx(input_list *l, const char *arg, int64_t numel) {
    char *path = strdup(arg + 4), *colon = strrchr(path, ':'), *end = NULL;
    long long limit = -1;
    if (colon && colon[1]) {
        limit = strtoll(colon + 1, &end, 10);
        if (*end == 0 && limit >= 0) *colon = 0;
        else limit = -1;
    }
    char err[1024];
    mpt_idx_file *f = mpt_idx_acquire(path, 0, "check the path after idx:",
                                      "the file is damaged or not an IDX image file", err, sizeof err);
    free(path);
    if (!f) {
        fprintf(stderr, "mptc: --input %s: %s\n", arg, err);
        return -1;
    }
    l->files = realloc(l->files, sizeof *l->files * (size_t)(l->n_files + 1));
    l->files[l->n_files++] = f;
    int64_t rec = 1;
    for (int d = 1; d < f->rank; d++) rec *= f->dim[d];
    if (rec != numel) {
        fprintf(stderr, "mptc: --input %s: records have %lld values, the model's input has %lld\n"
                        "  hint: pass an IDX file of the data the model was trained on\n",
                arg, (long long)rec, (long long)numel);
        return -1;
    }
    int64_t n = limit >= 0 && limit < f->dim[0] ? limit : f->dim[0];
    for (int64_t r = 0; r < n; r++) inputs_add(l, (input_ref){arg, f, r});
    return 0;
}

/* Takes every --input (and the file names after it, up to the next
 * option) out of argv, so the shared parser sees the rest. */
static void take_inputs(int *argc, char **argv, const char ***files, int *n_files) {
    int out = 0, taking = 0;
    *files = calloc((size_t)*argc + 1, sizeof **files);
    *n_files = 0;
    for (int i = 0; i < *argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--input") == 0) {
            taking = 1;
            continue;
        }
        if (strncmp(a, "--input=", 8) == 0) {
            (*files)[(*n_files)++] = a + 8;
            taking = 1;
            continue;
        }
        if (strncmp(a, "--", 2) == 0) taking = 0;
        else if (taking) {
            (*files)[(*n_files)++] = a;
            continue;
        }
        argv[out++] = argv[i];
    }
    *argc = out;
}

/* ---- images ---------------------------------------------------------------- */

typedef struct {
    int64_t h, w;
    int c;
} geometry;

/* The image size a model input takes: [h,w,c] with c 1 or 3, [h,w] gray,
 * or a flat [n] that is a square gray (n = s*s) or RGB (n = 3*s*s) image. */
static int input_geometry(mpt_shape in, geometry *g) {
    if (in.rank == 3 && (in.dim[2] == 1 || in.dim[2] == 3)) *g = (geometry){in.dim[0], in.dim[1], (int)in.dim[2]};
    else if (in.rank == 2) *g = (geometry){in.dim[0], in.dim[1], 1};
    else if (in.rank == 1) {
        int64_t s1 = (int64_t)llround(sqrt((double)in.dim[0])), s3 = (int64_t)llround(sqrt((double)in.dim[0] / 3));
        if (s1 * s1 == in.dim[0]) *g = (geometry){s1, s1, 1};
        else if (3 * s3 * s3 == in.dim[0]) *g = (geometry){s3, s3, 3};
        else return -1;
    } else return -1;
    return 0;
}

static int fill_image(const char *path, geometry g, float *x, char *err, size_t n) {
    uint8_t *rgb;
    int w, h;
    if (mpt_image_decode_rgb8(path, &rgb, &w, &h, err, n)) return -1;
    if (g.c == 1)
        /* ITU-R BT.601 luma, as images(..., color_mode=grayscale) computes it */
        for (int64_t p = 0; p < (int64_t)w * h; p++)
            rgb[p] = (uint8_t)(0.299 * rgb[3 * p] + 0.587 * rgb[3 * p + 1] + 0.114 * rgb[3 * p + 2] + 0.5);
    mpt_image_resize_bilinear(rgb, w, h, g.c, x, g.w, g.h, 1.0f / 255.0f);
    free(rgb);
    return 0;
}

static int fill_row(const input_ref *r, geometry g, int64_t numel, float *x, char *err, size_t n) {
    if (!r->idx) return fill_image(r->path, g, x, err, n);
    const uint8_t *src = r->idx->data + (size_t)(r->record * numel);
    for (int64_t i = 0; i < numel; i++) x[i] = (float)src[i] / 255.0f;
    return 0;
}

/* ---- class names -------------------------------------------------------------- */

/* Names from the data set the model was trained on, when it has real ones
 * (an image folder's subfolders, Fashion-MNIST's classes); NULL otherwise. */
static mpt_dataset *names_source(const mpt_session *s, const char *spec_text, int classes) {
    mpt_data_spec spec;
    char err[1024];
    mpt_dataset *d = NULL;
    if (!spec_text) return NULL;
    if (mpt_data_spec_parse(spec_text, &spec, err, sizeof err) == 0 &&
        (spec.kind == MPT_DATA_IMAGES || spec.kind == MPT_DATA_FASHION_MNIST)) {
        spec.cache = MPT_DATA_CACHE_OFF; /* headers only: we want the folder names */
        mpt_data_part part = spec.kind == MPT_DATA_FASHION_MNIST ? MPT_DATA_TEST : MPT_DATA_TRAIN;
        if (mpt_data_open_spec(&spec, part, s->model->input_shape, &d, err, sizeof err))
            fprintf(stderr, "mptc: note: class names unavailable (%s); printing class numbers\n", err);
        else if (mpt_data_num_classes(d) != classes) {
            fprintf(stderr, "mptc: note: %s has %d classes, the model %d; printing class numbers\n",
                    spec_text, mpt_data_num_classes(d), classes);
            mpt_data_free(d);
            d = NULL;
        }
    }
    mpt_data_spec_free(&spec);
    return d;
}

static const char *class_name(const mpt_dataset *d, int c, char buf[16]) {
    if (d) return mpt_data_class_name(d, c, buf);
    snprintf(buf, 16, "%d", c);
    return buf;
}

/* ---- the command ------------------------------------------------------------- */

/* Runs the eval step over every input in batches; writes one line per
 * input: index, input, top class, its name, then the probabilities. */
static int predict(mpt_session *s, const input_list *l, geometry g, const char *names_spec, FILE *out) {
    const mpt_graph *eg = s->eval;
    int n_in = mpt_graph_n_inputs(eg), n_out = eg->n_outputs, n_var = mpt_graph_n_variables(eg);
    int x_id = mpt_graph_find_input(eg, "x"), out_idx = mpt_graph_find_output(eg, "output"), xi = -1;
    mpt_tensor *in = calloc((size_t)n_in + 1, sizeof *in), *res = calloc((size_t)n_out + 1, sizeof *res);
    mpt_tensor *vars = calloc((size_t)n_var + 1, sizeof *vars);
    int64_t B = s->batch_size, numel = mpt_shape_numel(s->model->input_shape);
    int rc = -1;
    char err[1024], nb[16];
    for (int k = 0; k < n_var; k++) vars[k] = s->vars[s->eval_var[k]];
    for (int k = 0; k < n_in; k++) {
        const mpt_node *nd = &eg->nodes[mpt_graph_input_node(eg, k)];
        if (mpt_graph_input_node(eg, k) == x_id) xi = k;
        if (mpt_tensor_alloc(&in[k], nd->dtype, nd->shape)) {
            fprintf(stderr, "mptc: out of memory allocating a batch\n  hint: use a smaller --batch-size\n");
            goto done;
        }
    }
    const mpt_shape os = eg->nodes[eg->outputs[out_idx].node].shape;
    int classes = (int)(mpt_shape_numel(os) / B);
    mpt_dataset *names = names_source(s, names_spec, classes);
    fprintf(out, "index\tinput\tclass\tname");
    for (int c = 0; c < classes; c++) fprintf(out, "\t%s", class_name(names, c, nb));
    fputc('\n', out);
    for (int64_t b0 = 0; b0 < l->n; b0 += B) {
        int64_t real = l->n - b0 < B ? l->n - b0 : B;
        float *x = in[xi].data;
        memset(x, 0, mpt_tensor_bytes(&in[xi])); /* padding rows */
        for (int64_t r = 0; r < real; r++)
            if (fill_row(&l->in[b0 + r], g, numel, x + r * numel, err, sizeof err)) {
                fprintf(stderr, "mptc: %s\n", err);
                goto names_done;
            }
        if (s->backend->run(s->eval_exec, in, vars, res, err, sizeof err)) {
            fprintf(stderr, "mptc: prediction failed: %s\n", err);
            goto names_done;
        }
        for (int64_t r = 0; r < real; r++) {
            const input_ref *ir = &l->in[b0 + r];
            int best = 0;
            for (int c = 1; c < classes; c++)
                if (mpt_tensor_get(&res[out_idx], r * classes + c) > mpt_tensor_get(&res[out_idx], r * classes + best))
                    best = c;
            fprintf(out, "%lld\t%s", (long long)(b0 + r), ir->path);
            if (ir->idx) fprintf(out, "#%lld", (long long)ir->record);
            fprintf(out, "\t%d\t%s", best, class_name(names, best, nb));
            for (int c = 0; c < classes; c++) fprintf(out, "\t%.6f", mpt_tensor_get(&res[out_idx], r * classes + c));
            fputc('\n', out);
        }
        for (int k = 0; k < n_out; k++) mpt_tensor_free(&res[k]);
    }
    rc = 0;
names_done:
    for (int k = 0; k < n_out; k++) mpt_tensor_free(&res[k]);
    mpt_data_free(names);
done:
    for (int k = 0; k < n_in; k++) mpt_tensor_free(&in[k]);
    free(in);
    free(res);
    free(vars);
    return rc;
}

int mpt_cmd_predict(int argc, char **argv) {
    const char **files;
    int n_files;
    take_inputs(&argc, argv, &files, &n_files);
    mpt_cli c;
    input_list l = {0};
    mpt_session *s = NULL;
    FILE *out = stdout;
    int status = 2;
    int prc = mpt_cli_parse(&c, "predict", "class probabilities for images or IDX records",
                            predict_opts, argc, argv);
    if (prc == 1)
        printf("\ninputs: --input takes every argument up to the next option, so put MODEL.mpt\n"
               "  first. Images are decoded to RGB (luma for one-channel models), resized\n"
               "  bilinearly to the model's input and scaled to [0,1], as images(\"dir\") does;\n"
               "  idx:PATH[:N] reads the first N records (all without :N), scaled by 1/255.\n"
               "output: a tab-separated table, one header line, then one line per sample:\n"
               "  index, input (idx records as PATH#record), top class, its name, then the\n"
               "  model's output per class (probabilities when the model ends in softmax).\n"
               "  Names come from the --data spec or the train block's data (image folder\n"
               "  names, Fashion-MNIST's classes); otherwise they are class numbers.\n");
    if (prc) {
        status = prc == 1 ? 0 : 2;
        goto done;
    }
    mpt_compile_opts co;
    if (mpt_cli_compile_opts(&c, predict_opts, &co)) goto done;
    const char *weights = mpt_cli_get(&c, predict_opts, "weights");
    if (!weights || n_files == 0) {
        fprintf(stderr, "mptc predict: %s\n  hint: mptc predict %s --weights model.safetensors "
                        "--input a.png b.jpg idx:images.gz:10\n",
                !weights ? "no --weights given" : "no --input given", co.path);
        goto done;
    }
    status = 1;
    /* The model's input decides how inputs are read; the file says it, so
     * peek at it through a cheap load before compiling. */
    mpt_model *peek = NULL;
    mpt_lower_opts lo = {.batch_size = 1, .training = 0};
    if (mpt_lang_load(co.path, &lo, &peek, stderr)) goto done;
    mpt_shape ishape = peek->input_shape;
    mpt_dtype idt = peek->input_dtype;
    int n_model_inputs = peek->n_inputs;
    mpt_model_free(peek);
    if (n_model_inputs > 1) {
        fprintf(stderr, "mptc predict: %s has %d inputs, but predict reads one a sample (an "
                        "image or an IDX record)\n  hint: evaluate it on data that feeds every "
                        "input: mptc eval %s --weights %s --data \"synthetic(...)\"\n",
                co.path, n_model_inputs, co.path, weights);
        goto done;
    }
    geometry g = {0};
    int64_t numel = mpt_shape_numel(ishape);
    char sb[96];
    for (int i = 0; i < n_files; i++) {
        if (strncmp(files[i], "idx:", 4) == 0) {
            if (add_idx(&l, files[i], numel)) goto done;
            continue;
        }
        char err[1024];
        int w, h;
        if (input_geometry(ishape, &g)) {
            fprintf(stderr, "mptc: %s: the model's input %s is not an image ([h,w,c] with c 1 or 3, "
                            "[h,w], or a flat square)\n  hint: use --input idx:FILE for other data\n",
                    files[i], mpt_shape_str(ishape, sb, sizeof sb));
            goto done;
        }
        if (mpt_image_decode_rgb8(files[i], NULL, &w, &h, err, sizeof err)) {
            fprintf(stderr, "mptc: %s\n  hint: --input takes PNG or JPEG files, or idx:PATH[:N]\n", err);
            goto done;
        }
        inputs_add(&l, (input_ref){files[i], NULL, 0});
    }
    if (idt != MPT_DT_F32) {
        fprintf(stderr, "mptc: %s takes %s inputs; predict reads images and IDX pixels only\n",
                co.path, mpt_dtype_name(idt));
        goto done;
    }
    if (l.n == 0) {
        fprintf(stderr, "mptc predict: the inputs hold no samples\n");
        goto done;
    }
    /* one padded batch for a few inputs instead of the training batch */
    if (co.batch_size <= 0) co.batch_size = l.n < 256 ? l.n : 256;
    if (mpt_ckpt_open_inference(&co, weights, &s)) goto done;
    const char *opath = mpt_cli_get(&c, predict_opts, "output");
    if (opath && !(out = fopen(opath, "w"))) {
        fprintf(stderr, "mptc: cannot write %s: %m\n", opath);
        out = stdout;
        goto done;
    }
    const char *names = mpt_cli_get(&c, predict_opts, "data");
    if (predict(s, &l, g, names ? names : s->model->train.data, out) == 0) status = 0;
    if (out != stdout && fclose(out) != 0) {
        fprintf(stderr, "mptc: cannot write %s: %m\n", opath);
        status = 1;
    }
    out = stdout;
done:
    if (out != stdout) fclose(out);
    mpt_session_free(s);
    inputs_free(&l);
    free(files);
    return status;
}
