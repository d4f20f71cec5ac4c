/* lang/lang.c — the front end's entry points: read a file, parse it, check
 * it (names, blocks, shapes, the train block) and lower the model. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "lang/model.h"

/* Model files are hand-written text; anything larger is a mistake. */
enum { MAX_SOURCE_BYTES = 16 << 20 };

static const mpt_loc file_start = {1, 1, 1, 1, 0, 0};

/* Top-level checks that need the whole file: one model, at most one train
 * block, block names unique and distinct from layer types. */
static void check_items(mpt_diag *d, const mpt_ast *file, const mpt_ast **model,
                        const mpt_ast **train) {
    *model = NULL;
    *train = NULL;
    for (int i = 0; i < file->n_kids; i++) {
        const mpt_ast *it = file->kids[i];
        if (it->kind == MPT_AST_MODEL) {
            if (*model)
                mpt_diag_error(d, it->name_loc, "put each model in its own file",
                               "a second model ('%s'; the first is on line %d)", it->name,
                               (*model)->loc.line);
            else
                *model = it;
        } else if (it->kind == MPT_AST_TRAIN) {
            if (*train)
                mpt_diag_error(d, it->loc, "merge the settings into one train block",
                               "a second train block (the first is on line %d)",
                               (*train)->loc.line);
            else
                *train = it;
        } else if (it->kind == MPT_AST_BLOCK) {
            mpt_layer_kind k;
            if (mpt_layer_kind_parse(it->name, &k) == 0)
                mpt_diag_error(d, it->name_loc, NULL, "block '%s' has the name of a layer type",
                               it->name);
            for (int j = 0; j < i; j++) {
                const mpt_ast *o = file->kids[j];
                if (o->kind == MPT_AST_BLOCK && strcmp(o->name, it->name) == 0)
                    mpt_diag_error(d, it->name_loc, NULL, "block '%s' is already defined on line %d",
                                   it->name, o->loc.line);
            }
            for (int p = 0; p < it->n_args; p++)
                for (int q = 0; q < p; q++)
                    if (strcmp(it->args[p]->name, it->args[q]->name) == 0)
                        mpt_diag_error(d, it->args[p]->name_loc, NULL,
                                       "parameter '%s' is listed twice", it->args[p]->name);
        }
    }
    if (!*model)
        mpt_diag_error(d, file_start, "e.g. model m { input x: [784]; dense(units=10) }",
                       "the file has no model block");
}

static mpt_model *build_model(mpt_flat_model *fm, const char *path, const mpt_lower_opts *opts,
                              mpt_train_config *train) {
    mpt_model *m = calloc(1, sizeof *m);
    m->name = strdup(fm->name);
    m->path = strdup(path);
    m->input_shape = fm->inputs[0].shape;
    m->input_dtype = fm->inputs[0].dtype;
    m->n_inputs = fm->n_inputs;
    for (int k = 0; k < fm->n_inputs; k++) {
        const mpt_flat_input *fi = &fm->inputs[k];
        mpt_model_input *mi = &m->inputs[k];
        char graph_name[256];
        snprintf(graph_name, sizeof graph_name, k ? "x/%s" : "x", fi->name);
        *mi = (mpt_model_input){.name = strdup(fi->name), .graph_name = strdup(graph_name),
                                .shape = fi->shape, .dtype = fi->dtype, .vocab = fi->vocab,
                                .mask_only = fi->mask_only, .line = fi->loc.line,
                                .col = fi->loc.col};
    }
    m->train = *train;
    mpt_lower_opts o = opts ? *opts : (mpt_lower_opts){.training = 1};
    if (o.batch_size <= 0) o.batch_size = train->batch_size;
    m->graph = mpt_lower(fm, &o);
    m->n_layers = fm->n_layers;
    m->layers = calloc((size_t)fm->n_layers + 1, sizeof *m->layers);
    for (int i = 0; i < fm->n_layers; i++) {
        const mpt_flat_layer *L = &fm->layers[i];
        mpt_layer_info *li = &m->layers[i];
        li->name = strdup(L->name);
        li->type = strdup(mpt_layer_kind_name(L->kind));
        li->dtype = L->dtype ? strdup(L->dtype) : NULL;
        li->out_shape.rank = L->out.rank + 1;
        li->out_shape.dim[0] = o.batch_size;
        for (int k = 0; k < L->out.rank; k++) li->out_shape.dim[k + 1] = L->out.dim[k];
        li->n_params = L->n_params;
        li->n_trainable = L->n_trainable;
        li->line = L->loc.line;
        li->col = L->loc.col;
    }
    return m;
}

/* The cross-entropy losses read one vector of classes a sample. A dense
 * layer on an input of several dims keeps the leading ones (as Keras'
 * Dense), so a model without flatten before its classifier ends with
 * [h, w, classes], which the loss could only refuse later with no line:
 * said here at the dense layer that kept the dims, or at the output.
 * mptc train refuses the same model without a train block, later. */
static void check_output_for_loss(mpt_diag *d, const mpt_flat_model *fm,
                                  const mpt_train_config *t) {
    if (t->loss != MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY &&
        t->loss != MPT_LOSS_CATEGORICAL_CROSSENTROPY)
        return;
    /* a language model's [steps, vocab] output has a label per step: text
     * data gives them (the loss is then over every position) */
    if (t->data && strncmp(t->data, "text", 4) == 0 && fm->output >= 0 &&
        fm->layers[fm->output].out.rank == 2)
        return;
    if (fm->output < 0 || fm->output >= fm->n_layers || fm->layers[fm->output].out.rank <= 1)
        return;
    const mpt_flat_layer *at = &fm->layers[fm->output];
    for (int i = fm->output; i >= 0; i--) { /* the last dense fed several dims */
        const mpt_flat_layer *L = &fm->layers[i];
        if (L->kind != MPT_L_DENSE || L->n_in < 1) continue;
        mpt_shape in = L->in[0] < 0 ? fm->inputs[MPT_FLAT_INPUT_OF(L->in[0])].shape
                                    : fm->layers[L->in[0]].out;
        if (in.rank > 1) {
            at = L;
            break;
        }
    }
    char out[96], hint[200];
    mpt_shape_str(fm->layers[fm->output].out, out, sizeof out);
    snprintf(hint, sizeof hint, "put flatten (or global_avg_pool2d) before '%s'", at->name);
    mpt_diag_error(d, at->loc, hint,
                   "the model's output is %s a sample, but %s needs one vector of classes a "
                   "sample (a dense layer keeps its input's leading dims, as in Keras)", out,
                   mpt_loss_name(t->loss));
}

static int load(const char *path, const char *src, size_t len, const mpt_lower_opts *opts,
                mpt_model **out, FILE *diag) {
    mpt_diag d = {.path = path, .src = src, .len = len, .out = diag};
    *out = NULL;
    mpt_ast *file = mpt_parse(&d);
    if (d.n_errors) {
        mpt_ast_free(file);
        return d.n_errors;
    }
    const mpt_ast *model_ast, *train_ast;
    check_items(&d, file, &model_ast, &train_ast);
    mpt_flat_model fm = {0};
    if (model_ast) {
        mpt_expand(&d, model_ast, file, &fm);
        if (!d.n_errors) mpt_infer_shapes(&d, &fm);
    }
    mpt_train_config train;
    mpt_train_config_defaults(&train);
    if (train_ast) mpt_train_from_ast(&d, train_ast, &train);
    /* a file with a train block says how it trains: its loss must take
     * the output (a model alone may be built for anything) */
    if (!d.n_errors && model_ast && train_ast) check_output_for_loss(&d, &fm, &train);
    if (!d.n_errors) *out = build_model(&fm, path, opts, &train);
    else mpt_train_config_free(&train);
    mpt_flat_model_free(&fm);
    mpt_ast_free(file);
    return d.n_errors;
}

int mpt_lang_load_string(const char *path, const char *src, const mpt_lower_opts *opts,
                         mpt_model **out, FILE *diag) {
    return load(path, src, strlen(src), opts, out, diag);
}

int mpt_lang_load(const char *path, const mpt_lower_opts *opts, mpt_model **out, FILE *diag) {
    *out = NULL;
    struct stat st; /* before opening: a FIFO would block until a writer comes */
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        if (diag)
            fprintf(diag, "%s: error: the model file is not a regular file (%s)\n", path,
                    S_ISDIR(st.st_mode) ? "a folder" : "a pipe or a device");
        return 1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (diag)
            fprintf(diag, "%s: error: cannot open the model file: %s\n", path, strerror(errno));
        return 1;
    }
    char *buf = malloc(MAX_SOURCE_BYTES + 1);
    size_t len = buf ? fread(buf, 1, MAX_SOURCE_BYTES + 1, f) : 0;
    int read_error = !buf || ferror(f);
    fclose(f);
    if (read_error || len > MAX_SOURCE_BYTES) {
        if (diag)
            fprintf(diag, "%s: error: %s\n", path,
                    read_error ? "cannot read the model file" : "the model file is over 16 MiB");
        free(buf);
        return 1;
    }
    buf[len] = '\0';
    int n = load(path, buf, len, opts, out, diag);
    free(buf);
    return n;
}

void mpt_model_free(mpt_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_layers; i++) {
        free(m->layers[i].name);
        free(m->layers[i].type);
        free(m->layers[i].dtype);
    }
    free(m->layers);
    for (int k = 0; k < m->n_inputs; k++) {
        free(m->inputs[k].name);
        free(m->inputs[k].graph_name);
    }
    mpt_graph_free(m->graph);
    mpt_train_config_free(&m->train);
    free(m->name);
    free(m->path);
    free(m);
}
