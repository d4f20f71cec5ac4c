/* runtime/train_loop.c — epochs, steps, Keras-style progress, validation,
 * test evaluation, the JSON-lines log and the skipped-step guard. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cpu/cpu_backend.h"
#include "runtime/cuda.h"
#include "runtime/checkpoint.h"
#include "runtime/train_loop.h"

typedef struct {
    int x, y;                      /* INPUT order of "x" and "y" */
    int loss, correct, scale, finite;  /* output indices, -1 when absent */
} step_io;

static int input_index(const mpt_graph *g, const char *name) {
    int id = mpt_graph_find_input(g, name);
    for (int k = 0; k < mpt_graph_n_inputs(g); k++)
        if (mpt_graph_input_node(g, k) == id) return k;
    return -1;
}

static step_io io_of(const mpt_graph *g) {
    return (step_io){input_index(g, "x"), input_index(g, "y"), mpt_graph_find_output(g, "loss"),
                     mpt_graph_find_output(g, "correct"), mpt_graph_find_output(g, "loss_scale"),
                     mpt_graph_find_output(g, "finite")};
}

static int alloc_inputs(const mpt_graph *g, mpt_tensor *in) {
    for (int k = 0; k < mpt_graph_n_inputs(g); k++) {
        const mpt_node *n = &g->nodes[mpt_graph_input_node(g, k)];
        if (mpt_tensor_alloc(&in[k], n->dtype, n->shape)) return -1;
    }
    return 0;
}

static void free_tensors(mpt_tensor *t, int n) {
    for (int k = 0; k < n; k++) mpt_tensor_free(&t[k]);
}

/* ---- progress ------------------------------------------------------------- */

static void bar(char *buf, size_t n, long done, long total) {
    int width = 30, fill = total > 0 ? (int)(width * done / total) : width;
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < width && o + 2 < n; i++)
        buf[o++] = i < fill - 1 || (i == fill - 1 && done == total) ? '=' : i == fill - 1 ? '>' : '.';
    snprintf(buf + o, n - o, "]");
}

static void fmt_time(char *buf, size_t n, double sec) {
    if (sec >= 3600) snprintf(buf, n, "%dh%02dm", (int)(sec / 3600), (int)fmod(sec / 60, 60));
    else if (sec >= 60) snprintf(buf, n, "%dm%02ds", (int)(sec / 60), (int)fmod(sec, 60));
    else snprintf(buf, n, "%.0fs", sec);
}

typedef struct {
    double loss_sum, correct_sum;
    long steps, samples, skipped_total;
    double scale;
    int scaling, accuracy;
} epoch_stats;

static void progress_line(FILE *f, long done, long total, double elapsed, const epoch_stats *st,
                          int final, const char *extra) {
    char b[64], t[32];
    bar(b, sizeof b, done, total);
    double ms = st->steps ? 1000.0 * elapsed / (double)st->steps : 0;
    if (final) fmt_time(t, sizeof t, elapsed);
    else fmt_time(t, sizeof t, st->steps ? elapsed / (double)st->steps * (double)(total - done) : 0);
    fprintf(f, "\r%ld/%ld %s - %s%s %.*fms/step - loss: %.4f", done, total, b, final ? "" : "ETA: ", t,
            ms < 10 ? 1 : 0, ms, st->steps ? st->loss_sum / (double)st->steps : 0.0);
    if (st->accuracy)
        fprintf(f, " - accuracy: %.4f", st->samples ? st->correct_sum / (double)st->samples : 0.0);
    if (st->scaling) fprintf(f, " - loss_scale: %g - skipped: %ld", st->scale, st->skipped_total);
    if (extra) fputs(extra, f);
    if (final) fputc('\n', f);
    fflush(f);
}

/* ---- evaluation ------------------------------------------------------------ */

/* Per-row loss from the model's output (probabilities) for the rows of a
 * padded last batch; full batches use the graph's own loss. */
static double row_loss(mpt_loss_kind k, const mpt_tensor *out, const mpt_tensor *y, int64_t r) {
    int64_t c = out->shape.dim[out->shape.rank - 1];
    switch (k) {
    case MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY: {
        int64_t label = (int64_t)mpt_tensor_get(y, r);
        double p = mpt_tensor_get(out, r * c + label);
        return -log(fmin(fmax(p, 1e-7), 1 - 1e-7));
    }
    case MPT_LOSS_CATEGORICAL_CROSSENTROPY: {
        double l = 0;
        for (int64_t j = 0; j < c; j++)
            l -= mpt_tensor_get(y, r * c + j) * log(fmin(fmax(mpt_tensor_get(out, r * c + j), 1e-7), 1 - 1e-7));
        return l;
    }
    case MPT_LOSS_MEAN_SQUARED_ERROR: {
        double l = 0;
        for (int64_t j = 0; j < c; j++) {
            double d = mpt_tensor_get(out, r * c + j) - mpt_tensor_get(y, r * c + j);
            l += d * d;
        }
        return l / (double)c;
    }
    case MPT_LOSS_COUNT: break;
    }
    return NAN;
}

static int row_hit(const mpt_tensor *out, const mpt_tensor *y, int64_t r, int sparse) {
    int64_t c = out->shape.dim[out->shape.rank - 1], best = 0, lab = 0;
    for (int64_t j = 1; j < c; j++)
        if (mpt_tensor_get(out, r * c + j) > mpt_tensor_get(out, r * c + best)) best = j;
    if (sparse) lab = (int64_t)mpt_tensor_get(y, r);
    else
        for (int64_t j = 1; j < c; j++)
            if (mpt_tensor_get(y, r * c + j) > mpt_tensor_get(y, r * c + lab)) lab = j;
    return best == lab;
}

int mpt_evaluate(mpt_session *s, mpt_dataset *d, double *loss, double *accuracy, char *err,
                 size_t n) {
    const mpt_graph *g = s->eval;
    step_io io = io_of(g);
    int n_in = mpt_graph_n_inputs(g), n_out = g->n_outputs, n_var = mpt_graph_n_variables(g);
    mpt_tensor *in = calloc((size_t)n_in + 1, sizeof *in);
    mpt_tensor *out = calloc((size_t)n_out + 1, sizeof *out);
    mpt_tensor *vars = calloc((size_t)n_var + 1, sizeof *vars);
    int out_idx = mpt_graph_find_output(g, "output"), rc = -1;
    if (mpt_session_pull_vars(s, err, n)) goto done;
    for (int k = 0; k < n_var; k++) vars[k] = s->vars[s->eval_var[k]]; /* shared, never updated */
    if (alloc_inputs(g, in)) {
        snprintf(err, n, "out of memory allocating an evaluation batch");
        goto done;
    }
    mpt_data_unshuffle(d);
    int64_t nb = mpt_data_num_batches(d, s->batch_size, MPT_DATA_PAD_REMAINDER);
    double lsum = 0, hits = 0;
    int64_t count = 0;
    int sparse = s->topts.loss == MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY;
    for (int64_t b = 0; b < nb; b++) {
        int64_t real = 0;
        if (mpt_data_batch(d, b, s->batch_size, &in[io.x], &in[io.y], &real, err, n)) goto done;
        if (s->backend->run(s->eval_exec, in, vars, out, err, n)) goto done;
        if (real == s->batch_size) {
            lsum += mpt_tensor_get(&out[io.loss], 0) * (double)real;
            hits += mpt_tensor_get(&out[io.correct], 0);
        } else {
            for (int64_t r = 0; r < real; r++) {
                lsum += row_loss(s->topts.loss, &out[out_idx], &in[io.y], r);
                hits += row_hit(&out[out_idx], &in[io.y], r, sparse);
            }
        }
        count += real;
        free_tensors(out, n_out);
    }
    *loss = count ? lsum / (double)count : NAN;
    *accuracy = count ? hits / (double)count : NAN;
    rc = 0;
done:
    free_tensors(in, n_in);
    free(in);
    free(out);
    free(vars);
    return rc;
}

/* ---- the log ------------------------------------------------------------- */

static void log_obj(FILE *f, cJSON *o) {
    if (f) {
        char *s = cJSON_PrintUnformatted(o);
        fprintf(f, "%s\n", s);
        fflush(f);
        free(s);
    }
    cJSON_Delete(o);
}

/* The policy pass leaves the model's output low only where a layer's dtype=
 * forces it; `mptc check` warns about it, and so does training, which is
 * where the damage shows. */
static void warn_low_precision_output(const mpt_session *s) {
    int out = mpt_graph_find_output(s->typed, "output");
    if (out < 0) return;
    const mpt_node *n = &s->typed->nodes[s->typed->outputs[out].node];
    if (n->dtype != MPT_DT_F16 && n->dtype != MPT_DT_BF16) return;
    fprintf(stderr, "warning: the model's output is %s. Softmax and the loss in 16-bit floats are numerically\n"
                    "  unsafe (they overflow, underflow and lose precision); Keras' guide keeps them float32.\n"
                    "  hint: give the last layer%s%s%s dtype=float32\n",
            mpt_dtype_name(n->dtype), n->layer ? " '" : "", n->layer ? n->layer : "", n->layer ? "'" : "");
}

/* ---- --compare-fusion ------------------------------------------------------- */

/* Largest |a - b| of two tensors; *same says whether their bytes are equal.
 * Equal infinities and two NaNs differ by 0; a NaN against a number by inf. */
static double max_abs_diff(const mpt_tensor *a, const mpt_tensor *b, int *same) {
    *same = 0;
    if (a->dtype != b->dtype || !mpt_shape_eq(a->shape, b->shape)) return INFINITY;
    *same = memcmp(a->data, b->data, mpt_tensor_bytes(a)) == 0;
    double m = 0;
    int64_t n = mpt_shape_numel(a->shape);
    for (int64_t i = 0; i < n; i++) {
        double x = mpt_tensor_get(a, i), y = mpt_tensor_get(b, i);
        double d = x == y || (isnan(x) && isnan(y)) ? 0 : fabs(x - y);
        m = fmax(m, isnan(d) ? INFINITY : d);
    }
    return m;
}

static void diff_line(const mpt_graph *g, int node, const char *label, const mpt_tensor *a,
                      const mpt_tensor *b, int *n_diff) {
    int same;
    double d = max_abs_diff(a, b, &same);
    char shape[64];
    const mpt_node *n = &g->nodes[node];
    printf("    %-44s %s%s  max |diff| %g%s\n", label, mpt_dtype_name(n->dtype),
           mpt_shape_str(n->shape, shape, sizeof shape), d, same ? "" : "  DIFFERENT BITS");
    *n_diff += !same;
}

/* One train step from the current state and the first batch, run by the
 * fused plan and by the unfused plan (one kernel per op) on the reference
 * interpreter. Values inside the step are seen by making every value a
 * fused kernel writes an output of a copy of the graph, and fusing that
 * copy both ways. Returns the exit status: 0 when every value is
 * bit-identical. */
static int compare_fusion(mpt_session *s, const mpt_train_run *r, const mpt_tensor *in) {
    char err[512];
    char *txt = mpt_graph_to_string(s->train);
    mpt_graph *g = mpt_graph_parse(txt, err, sizeof err);
    free(txt);
    if (!g) {
        fprintf(stderr, "mptc: internal error: the train step does not parse back: %s\n", err);
        return 1;
    }
    const mpt_plan *orig = s->train_plan;
    int n_orig_out = g->n_outputs, *added_by = calloc((size_t)g->n_nodes, sizeof *added_by);
    for (int i = 0; i < g->n_outputs; i++) added_by[g->outputs[i].node] = -1;
    for (int k = 0; k < orig->n_kernels; k++)
        for (int j = 0; j < orig->kernels[k].n_outputs; j++) {
            int q = orig->kernels[k].outputs[j];
            if (added_by[q]) continue;
            char name[48];
            snprintf(name, sizeof name, "compare/%%%d", q);
            mpt_graph_add_output(g, name, q);
            added_by[q] = k + 1;
        }
    mpt_fusion_opts fo;
    mpt_fusion_opts_default(&fo);
    fo.disable = mpt_session_fusion_disable(&r->copts, s->backend ? s->backend->name : NULL);
    mpt_plan *fused = mpt_fuse(g, &fo);
    fo.enabled = 0;
    mpt_plan *unfused = mpt_fuse(g, &fo);
    if (fused) fused->tf32 = r->copts.tf32;
    if (unfused) unfused->tf32 = r->copts.tf32;
    int nv = s->n_vars, no = g->n_outputs, n_diff = 0, status = 1;
    mpt_tensor *vars[2], *outs[2];
    for (int v = 0; v < 2; v++) {
        vars[v] = calloc((size_t)nv + 1, sizeof *vars[v]);
        outs[v] = calloc((size_t)no + 1, sizeof *outs[v]);
        for (int k = 0; k < nv; k++) {
            if (mpt_tensor_alloc(&vars[v][k], s->vars[k].dtype, s->vars[k].shape)) {
                fprintf(stderr, "mptc: out of memory copying the state for --compare-fusion\n"
                                "  hint: use a smaller --batch-size or model\n");
                goto done;
            }
            memcpy(vars[v][k].data, s->vars[k].data, mpt_tensor_bytes(&s->vars[k]));
        }
    }
    printf("compare-fusion: %s, policy %s, batch %ld, one step on the reference interpreter\n"
           "  fused plan %d kernels, unfused plan %d kernels\n",
           s->model->name, s->policy.name, s->batch_size, orig->n_kernels, unfused->n_kernels);
    if (fused->n_kernels != orig->n_kernels)
        printf("  note: with its values made outputs the step fuses into %d kernels, not %d\n",
               fused->n_kernels, orig->n_kernels);
    if (mpt_plan_interp_run(fused, in, vars[0], outs[0], err, sizeof err) ||
        mpt_plan_interp_run(unfused, in, vars[1], outs[1], err, sizeof err)) {
        fprintf(stderr, "mptc: compare-fusion: running a plan failed: %s\n", err);
        goto done;
    }
    printf("  step outputs:\n");
    for (int i = 0; i < n_orig_out; i++)
        diff_line(g, g->outputs[i].node, g->outputs[i].name, &outs[0][i], &outs[1][i], &n_diff);
    printf("  kernel outputs (kernels of the fused plan):\n");
    int shown_kernel = -1;
    for (int i = n_orig_out; i < no; i++) {
        int q = g->outputs[i].node, k = added_by[q] - 1;
        char label[160];
        if (k != shown_kernel) printf("   k%d %s\n", k, orig->kernels[k].name);
        shown_kernel = k;
        snprintf(label, sizeof label, "  %%%d %s @%s", q, mpt_op_name(g->nodes[q].op),
                 g->nodes[q].layer ? g->nodes[q].layer : "-");
        diff_line(g, q, label, &outs[0][i], &outs[1][i], &n_diff);
    }
    printf("  variables after the step:\n");
    for (int k = 0; k < nv; k++) {
        int node = mpt_graph_variable_node(g, k);
        diff_line(g, node, g->nodes[node].name, &vars[0][k], &vars[1][k], &n_diff);
    }
    int total = n_orig_out + (no - n_orig_out) + nv;
    if (n_diff) printf("fused and unfused differ in %d of %d values\n", n_diff, total);
    else printf("identical: fused and unfused agree bit for bit in all %d values\n", total);
    status = n_diff ? 1 : 0;
done:
    for (int v = 0; v < 2; v++) {
        for (int k = 0; k < nv; k++) mpt_tensor_free(&vars[v][k]);
        for (int k = 0; k < no; k++) mpt_tensor_free(&outs[v][k]);
        free(vars[v]);
        free(outs[v]);
    }
    free(added_by);
    mpt_plan_free(fused);
    mpt_plan_free(unfused);
    mpt_graph_free(g);
    return status;
}

/* ---- the loop -------------------------------------------------------------- */

static int open_data(const mpt_train_run *r, mpt_session *s, mpt_dataset **train,
                     mpt_dataset **val, mpt_dataset **test) {
    const mpt_train_config *tc = &s->model->train;
    const char *spec = r->data ? r->data : tc->data ? tc->data : "fashion_mnist";
    char err[1024];
    mpt_dataset *all = NULL;
    if (mpt_data_open(spec, MPT_DATA_TRAIN, s->model->input_shape, &all, err, sizeof err)) {
        fprintf(stderr, "mptc: %s\n", err);
        return -1;
    }
    double split = r->validation_split >= 0 ? r->validation_split : tc->validation_split;
    if (split <= 0) split = mpt_data_spec_validation_split(all);
    if (tc->validation_data && !r->data) {
        *train = all;
        if (mpt_data_open(tc->validation_data, MPT_DATA_TRAIN, s->model->input_shape, val, err,
                          sizeof err)) {
            fprintf(stderr, "mptc: validation_data: %s\n", err);
            return -1;
        }
    } else if (split > 0) {
        if (mpt_data_split(all, split, train, val, err, sizeof err)) {
            fprintf(stderr, "mptc: %s\n", err);
            mpt_data_free(all);
            return -1;
        }
        mpt_data_free(all);
    } else {
        *train = all;
    }
    if (!r->no_test && mpt_data_has_test(spec) &&
        mpt_data_open(spec, MPT_DATA_TEST, s->model->input_shape, test, err, sizeof err)) {
        fprintf(stderr, "mptc: %s\n", err);
        return -1;
    }
    const mpt_node *x = &s->train->nodes[mpt_graph_find_input(s->train, "x")];
    if (mpt_data_input_dtype(*train) != x->dtype) {
        fprintf(stderr, "mptc: the model's input is %s but the data set '%s' gives %s samples\n"
                        "  hint: %s\n", mpt_dtype_name(x->dtype), spec, mpt_dtype_name(mpt_data_input_dtype(*train)),
                x->dtype == MPT_DT_I32 ? "token models need token data, e.g. synthetic(dtype=i32, vocab=1000)"
                                       : "this model wants pixel or feature values, e.g. fashion_mnist or synthetic()");
        return -1;
    }
    if (mpt_data_num_batches(*train, s->batch_size, MPT_DATA_DROP_REMAINDER) < 1) {
        fprintf(stderr, "mptc: the training data has %lld samples, fewer than one batch of %ld\n"
                        "  hint: use a smaller --batch-size\n",
                (long long)mpt_data_count(*train), s->batch_size);
        return -1;
    }
    return 0;
}

/* A resumed run continues the data order of the first only when the batch
 * size and the steps per epoch are the same. */
static int resume_mismatch(const mpt_train_run *r, const mpt_ckpt_meta *m, long batch, int64_t nb,
                           uint64_t seed) {
    if (r->seed_set && r->seed != seed)
        fprintf(stderr, "mptc: note: --seed %llu ignored; resuming with the checkpoint's seed %llu\n",
                (unsigned long long)r->seed, (unsigned long long)seed);
    if ((m->batch_size > 0 && m->batch_size != batch) ||
        (m->steps_per_epoch > 0 && m->steps_per_epoch != nb)) {
        fprintf(stderr, "mptc: %s was saved with batch size %ld and %ld steps per epoch; this run has "
                        "%ld and %lld\n  hint: resume with the same --batch-size, --data and "
                        "--steps-per-epoch, or start a new run with --init-weights %s\n",
                r->resume_path, m->batch_size, m->steps_per_epoch, batch, (long long)nb,
                r->resume_path);
        return -1;
    }
    return 0;
}

int mpt_train_main(const mpt_train_run *r) {
    mpt_session *s = NULL;
    mpt_dataset *train = NULL, *val = NULL, *test = NULL;
    mpt_tensor *in = NULL, *out = NULL;
    FILE *logf = NULL;
    int status = 1, n_in = 0, n_out = 0;
    char err[4096]; /* a checkpoint mismatch lists every tensor */

    /* the CPU and CUDA backends time every kernel of the plans compiled
     * while this is set, and print the table when the session is freed */
    mpt_cpu_profile(r->profile ? stdout : NULL);
    mpt_cuda_profile(r->profile ? stdout : NULL);
    int opened = mpt_session_open(&r->copts, &s);
    mpt_cpu_profile(NULL);
    mpt_cuda_profile(NULL);
    if (opened) return 1;
    if (r->profile && strcmp(s->backend->name, "interp") == 0)
        printf("note: --profile times the kernels of --device cpu and cuda; the interpreter runs none\n");
    warn_low_precision_output(s);
    const mpt_train_config *tc = &s->model->train;
    uint64_t seed = r->seed_set ? r->seed : tc->seed ? (uint64_t)tc->seed : 1;
    long epochs = r->epochs > 0 ? r->epochs : tc->epochs > 0 ? tc->epochs : 1;
    long max_skipped = r->max_skipped > 0 ? r->max_skipped : tc->loss_scale.max_skipped > 0 ? tc->loss_scale.max_skipped : 50;
    if (mpt_session_init_state(s, seed)) {
        fprintf(stderr, "mptc: cannot initialise the model's variables\n");
        goto done;
    }
    mpt_ckpt_meta meta = {.seed = seed};
    if (r->resume_path && r->init_weights) {
        fprintf(stderr, "mptc: --resume and --init-weights both given\n  hint: --resume continues a run "
                        "with all its state; --init-weights starts a new run from the weights only\n");
        goto done;
    }
    if (r->resume_path) {
        if (mpt_ckpt_load(r->resume_path, s, MPT_CKPT_ALL, &meta, err, sizeof err)) {
            fprintf(stderr, "mptc: %s\n", err);
            goto done;
        }
        seed = meta.seed;
    } else if (r->init_weights) {
        if (mpt_ckpt_load(r->init_weights, s, MPT_CKPT_WEIGHTS, NULL, err, sizeof err)) {
            fprintf(stderr, "mptc: %s\n", err);
            goto done;
        }
    }
    if (open_data(r, s, &train, &val, &test)) goto done;
    if (r->log_path && !(logf = fopen(r->log_path, "w"))) {
        fprintf(stderr, "mptc: cannot write the log %s: %m\n", r->log_path);
        goto done;
    }

    step_io io = io_of(s->train);
    n_in = mpt_graph_n_inputs(s->train);
    n_out = s->train->n_outputs;
    in = calloc((size_t)n_in + 1, sizeof *in);
    out = calloc((size_t)n_out + 1, sizeof *out);
    if (alloc_inputs(s->train, in)) {
        fprintf(stderr, "mptc: out of memory allocating a batch\n  hint: use a smaller --batch-size\n");
        goto done;
    }
    if (r->compare_fusion) {
        mpt_data_shuffle(train, seed, 0);
        int64_t real;
        if (mpt_data_batch(train, 0, s->batch_size, &in[io.x], &in[io.y], &real, err, sizeof err)) {
            fprintf(stderr, "mptc: %s\n", err);
            goto done;
        }
        status = compare_fusion(s, r, in);
        goto done;
    }
    int scaling = s->topts.loss_scale.mode != MPT_LS_NONE;
    int tty = isatty(fileno(stdout)) && !r->quiet;
    char cached[96] = "";
    if (s->cache_hits)
        snprintf(cached, sizeof cached, " (%d of %d modules from the kernel cache)", s->cache_hits,
                 s->cache_hits + s->cache_misses);
    int tf32 = r->copts.tf32 && strcmp(s->backend->name, "cuda") == 0;
    printf("mptc: %s on %s, policy %s%s, %s, batch %ld, compiled in %.0f ms%s\n", s->model->name,
           s->backend->name, s->policy.name, tf32 ? " (f32 GEMMs in TF32)" : "",
           r->copts.xla ? "fused (--xla)" : "unfused (--no-xla)", s->batch_size,
           1000 * s->compile_seconds, cached);
    int64_t nb = mpt_data_num_batches(train, s->batch_size, MPT_DATA_DROP_REMAINDER);
    if (r->steps_per_epoch > 0 && r->steps_per_epoch < nb) nb = r->steps_per_epoch;
    printf("Train on %lld samples", (long long)mpt_data_count(train));
    if (val) printf(", validate on %lld samples", (long long)mpt_data_count(val));
    printf(", %lld steps per epoch\n", (long long)nb);
    if (r->resume_path && resume_mismatch(r, &meta, s->batch_size, nb, seed)) goto done;
    /* The data order depends only on (seed, epoch), so step k of the first
     * run is batch k % nb of epoch k / nb, wherever that run stopped. */
    long global = meta.step, consecutive = 0;
    long first_epoch = nb > 0 ? (long)(meta.step / nb) : 0;
    int stop = r->max_steps > 0 && global >= r->max_steps;
    for (long e = first_epoch; e < epochs && !stop; e++) {
        printf("Epoch %ld/%ld\n", e + 1, epochs);
        mpt_data_shuffle(train, seed, e);
        epoch_stats st = {.scaling = scaling, .accuracy = io.correct >= 0};
        double t0 = mpt_now(), last_print = 0;
        int64_t b0 = meta.step > (long)(e * nb) ? meta.step - e * nb : 0;
        for (int64_t b = b0; b < nb && !stop; b++) {
            int64_t real;
            if (mpt_data_batch(train, b, s->batch_size, &in[io.x], &in[io.y], &real, err, sizeof err)) {
                fprintf(stderr, "\nmptc: %s\n", err);
                goto done;
            }
            double ts = mpt_now();
            if (s->backend->run(s->train_exec, in, s->vars, out, err, sizeof err)) {
                fprintf(stderr, "\nmptc: step %ld failed: %s\n", global + 1, err);
                goto done;
            }
            double step_ms = 1000 * (mpt_now() - ts);
            global++;
            double loss = mpt_tensor_get(&out[io.loss], 0);
            int finite = io.finite < 0 || mpt_tensor_get(&out[io.finite], 0) != 0;
            st.scale = io.scale >= 0 ? mpt_tensor_get(&out[io.scale], 0) : 1;
            if (finite) {
                st.loss_sum += loss;
                st.correct_sum += io.correct >= 0 ? mpt_tensor_get(&out[io.correct], 0) : 0;
                st.steps++;
                st.samples += real;
                consecutive = 0;
            } else {
                st.skipped_total++;
                consecutive++;
            }
            if (logf) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "event", "step");
                cJSON_AddNumberToObject(o, "epoch", (double)(e + 1));
                cJSON_AddNumberToObject(o, "step", (double)global);
                cJSON_AddNumberToObject(o, "loss", isfinite(loss) ? loss : -1);
                cJSON_AddBoolToObject(o, "finite", finite);
                if (io.correct >= 0)
                    cJSON_AddNumberToObject(o, "accuracy", mpt_tensor_get(&out[io.correct], 0) / (double)real);
                if (scaling) {
                    cJSON_AddNumberToObject(o, "loss_scale", st.scale);
                    cJSON_AddNumberToObject(o, "skipped", (double)st.skipped_total);
                }
                cJSON_AddNumberToObject(o, "ms", step_ms);
                log_obj(logf, o);
            }
            if (!scaling && !isfinite(loss)) {
                fprintf(stderr, "\nmptc: the loss became %s at step %ld\n", isnan(loss) ? "NaN" : "infinite", global);
                mpt_report_nonfinite(s, in, stderr);
                free_tensors(out, n_out);
                goto done;
            }
            if (scaling && consecutive >= max_skipped) {
                fprintf(stderr, "\nmptc: %ld consecutive steps were skipped: gradients are not finite even at loss scale %g\n",
                        consecutive, st.scale);
                mpt_report_nonfinite(s, in, stderr);
                free_tensors(out, n_out);
                goto done;
            }
            free_tensors(out, n_out);
            if (tty && (mpt_now() - last_print > 0.1 || b + 1 == nb)) {
                progress_line(stdout, b + 1, nb, mpt_now() - t0, &st, 0, NULL);
                last_print = mpt_now();
            }
            if (r->save_every > 0 && global % r->save_every == 0 && r->save_path) {
                mpt_ckpt_meta m = {.step = global, .seed = seed, .batch_size = s->batch_size,
                                   .steps_per_epoch = nb};
                if (mpt_ckpt_save(r->save_path, s, &m, err, sizeof err))
                    fprintf(stderr, "\nmptc: %s\n", err);
            }
            if (r->max_steps > 0 && global >= r->max_steps) stop = 1;
        }
        double elapsed = mpt_now() - t0;
        char extra[160] = "";
        double vl = 0, va = 0;
        if (val) {
            if (mpt_evaluate(s, val, &vl, &va, err, sizeof err)) {
                fprintf(stderr, "\nmptc: validation: %s\n", err);
                goto done;
            }
            snprintf(extra, sizeof extra, " - val_loss: %.4f - val_accuracy: %.4f", vl, va);
        }
        progress_line(stdout, st.steps + st.skipped_total, st.steps + st.skipped_total, elapsed, &st, 1, extra);
        if (logf) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "event", "epoch");
            cJSON_AddNumberToObject(o, "epoch", (double)(e + 1));
            cJSON_AddNumberToObject(o, "loss", st.steps ? st.loss_sum / (double)st.steps : -1);
            cJSON_AddNumberToObject(o, "accuracy", st.samples ? st.correct_sum / (double)st.samples : 0);
            if (val) {
                cJSON_AddNumberToObject(o, "val_loss", vl);
                cJSON_AddNumberToObject(o, "val_accuracy", va);
            }
            if (scaling) {
                cJSON_AddNumberToObject(o, "loss_scale", st.scale);
                cJSON_AddNumberToObject(o, "skipped", (double)st.skipped_total);
            }
            cJSON_AddNumberToObject(o, "seconds", elapsed);
            cJSON_AddNumberToObject(o, "ms_per_step", st.steps ? 1000 * elapsed / (double)st.steps : 0);
            log_obj(logf, o);
        }
    }
    if (r->save_path) {
        mpt_ckpt_meta m = {.step = global, .seed = seed, .batch_size = s->batch_size,
                           .steps_per_epoch = nb};
        if (mpt_ckpt_save(r->save_path, s, &m, err, sizeof err)) {
            fprintf(stderr, "mptc: %s\n", err);
            goto done;
        }
        printf("saved %s (step %ld)\n", r->save_path, global);
    }
    if (test) {
        double tl, ta;
        if (mpt_evaluate(s, test, &tl, &ta, err, sizeof err)) {
            fprintf(stderr, "mptc: test: %s\n", err);
            goto done;
        }
        printf("Test: %lld samples - loss: %.4f - accuracy: %.4f\n", (long long)mpt_data_count(test), tl, ta);
        if (logf) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "event", "test");
            cJSON_AddNumberToObject(o, "loss", tl);
            cJSON_AddNumberToObject(o, "accuracy", ta);
            log_obj(logf, o);
        }
    }
    status = 0;
done:
    if (in) free_tensors(in, n_in);
    free(in);
    free(out);
    if (logf) fclose(logf);
    mpt_data_free(train);
    mpt_data_free(val);
    mpt_data_free(test);
    mpt_session_free(s);
    return status;
}
