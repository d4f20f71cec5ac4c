/* runtime/train/train_loop.c — `mptc train` around its epochs (train_epochs.c):
 * the session, the data, a resumed run's checks, the checkpoint at the end
 * (also of a run stopped early), the test evaluation; evaluation over a
 * data set, and --compare-fusion. */
#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cpu/cpu_backend.h"
#include "runtime/cuda/cuda.h"
#include "runtime/dist/dist.h"
#include "runtime/train/tensorboard_impl.h"
#include "runtime/train/train_impl.h"


static int input_index(const mpt_graph *g, const char *name) {
    int id = mpt_graph_find_input(g, name);
    for (int k = 0; k < mpt_graph_n_inputs(g); k++)
        if (mpt_graph_input_node(g, k) == id) return k;
    return -1;
}

static step_io_idx io_of(const mpt_graph *g) {
    return (step_io_idx){input_index(g, "x"), input_index(g, "y"), mpt_graph_find_output(g, "loss"),
                         mpt_graph_find_output(g, "loss_scale"), mpt_graph_find_output(g, "finite"),
                         mpt_graph_find_output(g, "learning_rate")};
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

/* row r's mean |y - out| (squared: (y - out)^2) over its elements */
static double row_error(const mpt_tensor *out, const mpt_tensor *y, int64_t r, int squared) {
    int64_t c = mpt_shape_numel(out->shape) / out->shape.dim[0];
    double e = 0;
    for (int64_t j = 0; j < c; j++) {
        double d = mpt_tensor_get(y, r * c + j) - mpt_tensor_get(out, r * c + j);
        e += squared ? d * d : fabs(d);
    }
    return e / (double)c;
}

/* is row r's true class among its k highest scores (ties counted in)? */
static int row_top_k(const mpt_tensor *out, const mpt_tensor *y, int64_t r, int sparse, int k) {
    int64_t c = out->shape.dim[out->shape.rank - 1], lab = 0, above = 0;
    if (sparse) lab = (int64_t)mpt_tensor_get(y, r);
    else
        for (int64_t j = 1; j < c; j++)
            if (mpt_tensor_get(y, r * c + j) > mpt_tensor_get(y, r * c + lab)) lab = j;
    double mine = lab >= 0 && lab < c ? mpt_tensor_get(out, r * c + lab) : -INFINITY;
    for (int64_t j = 0; j < c; j++) above += mpt_tensor_get(out, r * c + j) > mine;
    return above < k;
}

static const char *const metric_outputs[MPT_N_MET] = {"correct", "abs_error", "sq_error",
                                                      "top_k_correct"};

void mpt_metric_sums_init(mpt_metric_sums *m, const mpt_graph *g, int top_k) {
    memset(m, 0, sizeof *m);
    for (int i = 0; i < MPT_N_MET; i++) m->out[i] = mpt_graph_find_output(g, metric_outputs[i]);
    m->top_k = top_k;
}

void mpt_metric_sums_add(mpt_metric_sums *m, const mpt_tensor *outs, int64_t real) {
    for (int i = 0; i < MPT_N_MET; i++)
        if (m->out[i] >= 0) m->sum[i] += mpt_tensor_get(&outs[m->out[i]], 0);
    m->samples += real;
}

const char *mpt_metric_name(const mpt_metric_sums *m, int i, char *buf, size_t n) {
    static const char *const names[MPT_N_MET] = {"accuracy", "mae", "mse", NULL};
    if (names[i]) snprintf(buf, n, "%s", names[i]);
    else snprintf(buf, n, "top_%d_accuracy", m->top_k);
    return buf;
}

double mpt_metric_mean(const mpt_metric_sums *m, int i) {
    return m->samples ? m->sum[i] / (double)m->samples : NAN;
}

void mpt_metric_line(const mpt_metric_sums *m, const char *prefix, char *buf, size_t n) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < MPT_N_MET && o < n; i++) {
        if (m->out[i] < 0) continue;
        char name[32];
        o += (size_t)snprintf(buf + o, n - o, " - %s%s: %.4f", prefix,
                              mpt_metric_name(m, i, name, sizeof name), mpt_metric_mean(m, i));
    }
}

int mpt_evaluate(mpt_session *s, mpt_dataset *d, mpt_eval_result *res, char *err, size_t n) {
    const mpt_graph *g = s->eval;
    step_io_idx io = io_of(g);
    int n_in = mpt_graph_n_inputs(g), n_out = g->n_outputs, n_var = mpt_graph_n_variables(g);
    mpt_tensor *in = calloc((size_t)n_in + 1, sizeof *in);
    mpt_tensor *out = calloc((size_t)n_out + 1, sizeof *out);
    mpt_tensor *vars = calloc((size_t)n_var + 1, sizeof *vars);
    int out_idx = mpt_graph_find_output(g, "output"), rc = -1;
    mpt_metric_sums *m = &res->metrics;
    mpt_metric_sums_init(m, g, s->topts.metrics.top_k);
    res->loss = NAN;
    if (mpt_session_pull_vars(s, err, n)) goto done;
    for (int k = 0; k < n_var; k++) vars[k] = s->vars[s->eval_var[k]]; /* shared, never updated */
    if (alloc_inputs(g, in)) {
        snprintf(err, n, "out of memory allocating an evaluation batch");
        goto done;
    }
    mpt_data_unshuffle(d);
    int64_t nb = mpt_data_num_batches(d, s->batch_size, MPT_DATA_PAD_REMAINDER);
    double lsum = 0;
    int sparse = s->topts.loss == MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY;
    /* a data-parallel run's ranks take turns at the batches, then add up
     * what they found (every rank holds the same weights) */
    int ranks = s->ranks > 1 ? s->ranks : 1;
    for (int64_t b = ranks > 1 ? mpt_dist_rank() : 0; b < nb; b += ranks) {
        int64_t real = 0;
        if (mpt_data_batch(d, b, s->batch_size, &in[io.x], &in[io.y], &real, err, n)) goto done;
        if (s->backend->run(s->eval_exec, in, vars, out, err, n)) goto done;
        if (real == s->batch_size) {
            lsum += mpt_tensor_get(&out[io.loss], 0) * (double)real;
            mpt_metric_sums_add(m, out, real);
        } else { /* a padded last batch: its real rows, from the output */
            const mpt_tensor *o = &out[out_idx], *y = &in[io.y];
            for (int64_t r = 0; r < real; r++) {
                lsum += row_loss(s->topts.loss, o, y, r);
                if (m->out[MPT_MET_ACCURACY] >= 0) m->sum[MPT_MET_ACCURACY] += row_hit(o, y, r, sparse);
                if (m->out[MPT_MET_MAE] >= 0) m->sum[MPT_MET_MAE] += row_error(o, y, r, 0);
                if (m->out[MPT_MET_MSE] >= 0) m->sum[MPT_MET_MSE] += row_error(o, y, r, 1);
                if (m->out[MPT_MET_TOP_K] >= 0)
                    m->sum[MPT_MET_TOP_K] += row_top_k(o, y, r, sparse, m->top_k);
            }
            m->samples += real;
        }
        free_tensors(out, n_out);
    }
    if (ranks > 1) {
        double sums[MPT_N_MET + 2];
        sums[0] = lsum;
        sums[1] = (double)m->samples;
        for (int i = 0; i < MPT_N_MET; i++) sums[2 + i] = m->sum[i];
        if (mpt_collective_allreduce(sums, MPT_N_MET + 2, MPT_DT_F64, err, n)) goto done;
        lsum = sums[0];
        m->samples = (int64_t)sums[1];
        for (int i = 0; i < MPT_N_MET; i++) m->sum[i] = sums[2 + i];
    }
    res->loss = m->samples ? lsum / (double)m->samples : NAN;
    rc = 0;
done:
    free_tensors(in, n_in);
    free(in);
    free(out);
    free(vars);
    return rc;
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

int mpt_check_labels(const mpt_session *s, const mpt_dataset *d, const char *what,
                     const char *spec) {
    const mpt_graph *g = s->train;
    int y = mpt_graph_find_input(g, "y");
    if (!d || y < 0 || g->nodes[y].dtype != MPT_DT_I32) return 0;
    /* class ids one a sample, or one a position (text: [T] ids) */
    if (mpt_data_label_shape(d).rank && mpt_data_label_dtype(d) != MPT_DT_I32) return 0;
    const mpt_graph *f = s->model->graph;
    if (!f || f->n_outputs < 1) return 0;
    mpt_shape os = f->nodes[f->outputs[0].node].shape;
    int64_t units = os.rank ? os.dim[os.rank - 1] : 1;
    int classes = mpt_data_num_classes(d);
    if (classes <= units) return 0;
    fprintf(stderr, "mptc: the %s labels go up to %d (%s has %d classes), but the model's output "
            "has %lld units: labels from %lld on would count as no class at all\n"
            "  hint: give the model's last layer units=%d, or use data of at most %lld classes\n",
            what, classes - 1, spec, classes, (long long)units, (long long)units, classes,
            (long long)units);
    return -1;
}

static int open_data(const mpt_train_run *r, mpt_session *s, mpt_dataset **train,
                     mpt_dataset **val, mpt_dataset **test) {
    const mpt_train_config *tc = &s->model->train;
    const char *spec = r->data ? r->data : tc->data ? tc->data : "fashion_mnist";
    char err[1024];
    mpt_dataset *all = NULL;
    if (mpt_session_open_data(s, spec, MPT_DATA_TRAIN, &all, err, sizeof err)) {
        fprintf(stderr, "mptc: %s\n", err);
        return -1;
    }
    double split = r->validation_split >= 0 ? r->validation_split : tc->validation_split;
    if (split <= 0) split = mpt_data_spec_validation_split(all);
    /* the train block's validation_data holds with --data too; a
     * --validation-split on the command line replaces it */
    if (tc->validation_data && r->validation_split < 0) {
        *train = all;
        if (mpt_session_open_data(s, tc->validation_data, MPT_DATA_TRAIN, val, err, sizeof err)) {
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
        mpt_session_open_data(s, spec, MPT_DATA_TEST, test, err, sizeof err)) {
        fprintf(stderr, "mptc: %s\n", err);
        return -1;
    }
    if (mpt_check_labels(s, *train, "training", spec) ||
        mpt_check_labels(s, *val, "validation",
                         tc->validation_data && r->validation_split < 0 ? tc->validation_data : spec) ||
        mpt_check_labels(s, *test, "test", spec))
        return -1;
    const mpt_node *x = &s->train->nodes[mpt_graph_find_input(s->train, "x")];
    if (mpt_data_input_dtype(*train) != x->dtype) {
        fprintf(stderr, "mptc: the model's input is %s but the data set '%s' gives %s samples\n"
                        "  hint: %s\n", mpt_dtype_name(x->dtype), spec, mpt_dtype_name(mpt_data_input_dtype(*train)),
                x->dtype == MPT_DT_I32 ? "token models need token data, e.g. text(\"/usr/share/games/fortunes\") or synthetic(dtype=i32, vocab=1000)"
                                       : "this model wants pixel or feature values, e.g. fashion_mnist or synthetic()");
        return -1;
    }
    if (mpt_data_num_batches(*train, s->global_batch, MPT_DATA_DROP_REMAINDER) < 1) {
        fprintf(stderr, "mptc: the training data has %lld samples, fewer than one batch of %ld\n"
                        "  hint: use a smaller --batch-size\n",
                (long long)mpt_data_count(*train), s->global_batch);
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

/* the run's data is text(...): its loss is also shown in bits a byte */
static int is_text(const mpt_train_run *r, const mpt_session *s) {
    const char *spec = r->data ? r->data : s->model->train.data;
    mpt_data_spec ds;
    char err[256];
    if (!spec || mpt_data_spec_parse(spec, &ds, err, sizeof err) != 0) return 0;
    int text = ds.kind == MPT_DATA_TEXT;
    mpt_data_spec_free(&ds);
    return text;
}

/* Keras' TensorBoard layout: DIR/train and DIR/validation, so the
 * dashboard draws each epoch_* tag for both runs on one chart */
/* a rank's own shard of the optimizer state (--shard-optimizer) */
static int is_shard(const mpt_session *s, int k) {
    return strstr(s->train->nodes[mpt_graph_variable_node(s->train, k)].name, "@shard/") != NULL;
}

/* A data-parallel run starts every rank from the same plan and state: the
 * plans are compared (another model file, policy or flag on one rank is
 * an error naming it), then rank 0's state (initialised, resumed or
 * loaded) is sent to every rank, but for the shards of a sharded
 * optimizer, which each rank initialised or loaded for itself. */
static int join_ranks(mpt_session *s) {
    if (s->ranks <= 1) return 0;
    char err[1024];
    char *text = mpt_graph_to_string(s->train);
    uint64_t h = MPT_DIST_HASH_INIT;
    if (text) h = mpt_dist_hash(h, text, strlen(text));
    h = mpt_dist_hash(h, s->backend->name, strlen(s->backend->name));
    free(text);
    if (!text || mpt_dist_same(h, "train step (model, policy, flags or backend)", err, sizeof err)) {
        fprintf(stderr, "mptc: rank %d: %s\n  hint: every rank must run the same command on the "
                "same model file\n", mpt_dist_rank(), text ? err : "out of memory");
        return -1;
    }
    for (int k = 0; k < s->n_vars; k++)
        if (!is_shard(s, k) &&
            mpt_dist_bcast(s->vars[k].data, (int64_t)mpt_tensor_bytes(&s->vars[k]), err,
                           sizeof err)) {
            fprintf(stderr, "mptc: rank %d: sending the state: %s\n", mpt_dist_rank(), err);
            return -1;
        }
    return 0;
}

/* At the end of a data-parallel run: every rank must hold the same state
 * (the graph averages everything that changes it; a difference is a bug
 * or a rank that diverged, and its checkpoint would be wrong) */
static int ranks_agree(mpt_session *s) {
    if (s->ranks <= 1) return 0;
    char err[1024];
    if (mpt_session_pull_vars(s, err, sizeof err)) {
        fprintf(stderr, "mptc: rank %d: %s\n", mpt_dist_rank(), err);
        return -1;
    }
    uint64_t h = MPT_DIST_HASH_INIT;
    for (int k = 0; k < s->n_vars; k++)
        if (!is_shard(s, k)) h = mpt_dist_hash(h, s->vars[k].data, mpt_tensor_bytes(&s->vars[k]));
    if (mpt_dist_same(h, "state at the end of the run", err, sizeof err)) {
        fprintf(stderr, "mptc: rank %d: %s\n  hint: this is a bug in mptc's data parallelism; "
                "rank 0's checkpoint holds rank 0's state\n", mpt_dist_rank(), err);
        return -1;
    }
    return 0;
}

static int open_tensorboard(const char *dir, mpt_tb **train, mpt_tb **val) {
    char path[4096], err[1024];
    snprintf(path, sizeof path, "%s/train", dir);
    if (!(*train = mpt_tb_open(path, err, sizeof err))) goto fail;
    snprintf(path, sizeof path, "%s/validation", dir);
    if (!(*val = mpt_tb_open(path, err, sizeof err))) goto fail;
    return 0;
fail:
    fprintf(stderr, "mptc: --tensorboard: %s\n", err);
    return -1;
}

int mpt_train_main(const mpt_train_run *r) {
    mpt_session *s = NULL;
    mpt_dataset *train = NULL, *val = NULL, *test = NULL;
    mpt_tensor *in = NULL, *in_next = NULL, *out = NULL;
    mpt_train_state R;
    mpt_callbacks cbs = {0};
    mpt_augment *aug = NULL;
    mpt_prefetch *prefetch = NULL;
    mpt_tb *tb_train = NULL, *tb_val = NULL;
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
    if (strcmp(s->backend->name, "cpu") == 0 && s->policy.compute != MPT_DT_F32) {
        double dot = 0;
        const char *bf16 = mpt_cpu_bf16_multiplier(&dot);
        int bf16_fast = bf16 && strcmp(bf16, "f32 FMAs") != 0;
        if (s->policy.compute == MPT_DT_F16)
            fprintf(stderr, "mptc: note: on a CPU, float16 math runs in float32 after conversion "
                    "(F16C): mixed_float16 saves memory here, not time\n  hint: %s\n",
                    bf16_fast ? "mixed_bfloat16 multiplies faster on this CPU (`mptc devices`)"
                              : "expect float32 to be about as fast here; `mptc bench MODEL "
                                "--policy float32,mixed_float16` measures it");
        else if (s->policy.compute == MPT_DT_BF16 && bf16 && !bf16_fast)
            fprintf(stderr, "mptc: note: this CPU multiplies bf16 in f32 FMAs (%s): "
                    "mixed_bfloat16 saves memory here, not time\n  hint: expect float32 to be "
                    "about as fast here; `mptc bench MODEL --policy float32,mixed_bfloat16` "
                    "measures it\n",
                    dot > 0 ? "its vdpbf16ps is slower than them" : "no AMX or AVX512_BF16");
    }
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
        /* --learning-rate on a resumed run is the rate from here on (the
         * checkpoint holds the rate it ran at, a callback's included) */
        int lr = mpt_session_var(s, "optimizer/learning_rate");
        if (lr >= 0 && r->copts.learning_rate > 0)
            mpt_tensor_set(&s->vars[lr], 0, r->copts.learning_rate);
    } else if (r->init_weights) {
        if (mpt_ckpt_load(r->init_weights, s, MPT_CKPT_WEIGHTS, NULL, err, sizeof err)) {
            fprintf(stderr, "mptc: %s\n", err);
            goto done;
        }
    }
    if (join_ranks(s)) goto done;
    if (open_data(r, s, &train, &val, &test)) goto done;
    if (mpt_callbacks_init(&cbs, s, val != NULL)) goto done;
    const char *aug_text = r->augment ? r->augment : tc->augment;
    if (aug_text && (mpt_augment_parse(aug_text, &aug, err, sizeof err) ||
                     mpt_augment_check(aug, train, err, sizeof err))) {
        fprintf(stderr, "mptc: augment: %s\n", err);
        goto done;
    }
    /* rank 0 alone writes the log and the event files (and checkpoints,
     * checkpoint.c); the others' state is the same */
    int writer = mpt_dist_rank() == 0;
    if (writer && r->tensorboard && open_tensorboard(r->tensorboard, &tb_train, &tb_val)) goto done;
    if (writer && r->log_path && !(logf = fopen(r->log_path, "w"))) {
        fprintf(stderr, "mptc: cannot write the log %s: %m\n", r->log_path);
        goto done;
    }

    step_io_idx io = io_of(s->train);
    n_in = mpt_graph_n_inputs(s->train);
    n_out = s->train->n_outputs;
    in = calloc((size_t)n_in + 1, sizeof *in);
    out = calloc((size_t)n_out + 1, sizeof *out);
    if (alloc_inputs(s->train, in)) {
        fprintf(stderr, "mptc: out of memory allocating a batch\n  hint: use a smaller --batch-size\n");
        goto done;
    }
    /* a second batch where the backend can upload it during a step, or
     * a thread can read and augment it */
    if (s->backend->stage_next || aug) {
        in_next = calloc((size_t)n_in + 1, sizeof *in_next);
        if (!in_next || alloc_inputs(s->train, in_next)) {
            fprintf(stderr, "mptc: out of memory allocating a batch\n  hint: use a smaller --batch-size\n");
            goto done;
        }
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
    if (aug && !(prefetch = mpt_prefetch_new(train, s->batch_size, aug, seed, 0, err, sizeof err))) {
        fprintf(stderr, "mptc: %s\n", err);
        goto done;
    }
    int scaling = s->topts.loss_scale.mode != MPT_LS_NONE;
    int tty = isatty(fileno(stdout)) && !r->quiet;
    char cached[96] = "";
    if (s->cache_hits)
        snprintf(cached, sizeof cached, " (%d of %d modules from the kernel cache)", s->cache_hits,
                 s->cache_hits + s->cache_misses);
    int tf32 = r->copts.tf32 && strcmp(s->backend->name, "cuda") == 0;
    char ranks[160] = "";
    if (s->ranks > 1)
        snprintf(ranks, sizeof ranks, " (%d ranks x %ld, %s)", s->ranks, s->batch_size,
                 mpt_dist_mpi_version());
    printf("mptc: %s on %s, policy %s%s, %s, batch %ld%s, compiled in %.0f ms%s\n", s->model->name,
           s->backend->name, s->policy.name, tf32 ? " (f32 GEMMs in TF32)" : "",
           r->copts.xla ? "fused (--xla)" : "unfused (--no-xla)", s->global_batch, ranks,
           1000 * s->compile_seconds, cached);
    int64_t nb = mpt_data_num_batches(train, s->global_batch, MPT_DATA_DROP_REMAINDER);
    if (r->steps_per_epoch > 0 && r->steps_per_epoch < nb) nb = r->steps_per_epoch;
    printf("Train on %lld samples", (long long)mpt_data_count(train));
    if (val) {
        const mpt_train_config *tcv = &s->model->train;
        if (tcv->validation_data && r->validation_split < 0)
            printf(", validate on %lld samples (validation_data %s)", (long long)mpt_data_count(val),
                   tcv->validation_data);
        else
            printf(", validate on %lld samples (split from the training data)",
                   (long long)mpt_data_count(val));
    }
    printf(", %lld step%s per epoch\n", (long long)nb, nb == 1 ? "" : "s");
    if (r->resume_path && resume_mismatch(r, &meta, s->global_batch, nb, seed)) goto done;
    /* The data order depends only on (seed, epoch), so step k of the first
     * run is batch k % nb of epoch k / nb, wherever that run stopped. */
    R = (mpt_train_state){.r = r, .s = s, .train = train, .val = val, .logf = logf, .io = io,
                          .in = in, .in_next = in_next, .out = out, .seed = seed,
                          .epochs = epochs, .max_skipped = max_skipped, .nb = nb,
                          .global = meta.step, .scaling = scaling, .tty = tty,
                          .callbacks = &cbs, .prefetch = prefetch, .aug = aug,
                          .bits_per_byte = is_text(r, s),
                          .tb_train = tb_train, .tb_val = tb_val};
    int how = mpt_train_epochs(&R);
    in = R.in, in_next = R.in_next; /* swapped along the way; freed below */
    if (how == MPT_RUN_FAILED || ranks_agree(s)) goto done;
    /* what was learned is kept however the run ended: a step that was not
     * finite was not applied */
    if (r->save_path) {
        if (mpt_train_save(&R)) goto done;
        if (how == MPT_RUN_DONE) printf("saved %s (step %ld)\n", r->save_path, R.global);
        else
            fprintf(stderr, "mptc: saved %s (step %ld)\n  hint: run the same command with "
                    "--resume %s to go on from there%s\n", r->save_path, R.global, r->save_path,
                    how == MPT_RUN_NONFINITE ? ", with a smaller learning rate" : "");
    } else if (how != MPT_RUN_DONE) {
        fprintf(stderr, "mptc: nothing saved\n  hint: --save FILE keeps the weights of a run "
                "that stops early (and --save-every N during it)\n");
    }
    if (how == MPT_RUN_INTERRUPTED) {
        fprintf(stderr, "mptc: interrupted (%s) after step %ld\n",
                R.signal == SIGTERM ? "SIGTERM" : R.signal == SIGUSR1 ? "SIGUSR1" : "SIGINT", R.global);
        status = 128 + R.signal;
        goto done;
    }
    if (how == MPT_RUN_NONFINITE) goto done;
    if (test) {
        mpt_eval_result te;
        if (mpt_evaluate(s, test, &te, err, sizeof err)) {
            fprintf(stderr, "mptc: test: %s\n", err);
            goto done;
        }
        char line[256];
        mpt_metric_line(&te.metrics, "", line, sizeof line);
        printf("Test: %lld samples - loss: %.4f%s", (long long)mpt_data_count(test), te.loss, line);
        if (R.bits_per_byte) printf(" - bpb: %.3f", te.loss / M_LN2);
        printf("\n");
        if (mpt_train_log_test(&R, &te)) goto done;
    }
    status = 0;
done:
    mpt_prefetch_free(prefetch); /* before the batches it may be filling */
    if (in) free_tensors(in, n_in);
    free(in);
    if (in_next) free_tensors(in_next, n_in);
    free(in_next);
    free(out);
    /* the log's last lines reach the disk only now: a failure is an error */
    if (logf && fclose(logf) != 0 && status == 0) {
        fprintf(stderr, "mptc: cannot write the log %s: %m\n", r->log_path);
        status = 1;
    }
    mpt_callbacks_free(&cbs);
    mpt_augment_free(aug);
    char tb_err[512];
    if ((mpt_tb_close(tb_train, tb_err, sizeof tb_err) || mpt_tb_close(tb_val, tb_err, sizeof tb_err)) &&
        status == 0) {
        fprintf(stderr, "mptc: tensorboard: %s\n", tb_err);
        status = 1;
    }
    mpt_data_free(train);
    mpt_data_free(val);
    mpt_data_free(test);
    mpt_session_free(s);
    return status;
}
