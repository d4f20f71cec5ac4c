/* runtime/train/train_epochs.c — the epochs of `mptc train`: batches read one
 * step ahead, Keras-style progress, validation, the JSON-lines log, and the
 * three ways a run ends early: a step whose gradients are not finite
 * (never applied), too many skipped steps under loss scaling, and SIGINT
 * or SIGTERM (the step running finishes, then the run stops). */
#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/dist/dist.h"
#include "runtime/train/tensorboard_impl.h"
#include "runtime/train/train_impl.h"

/* ---- progress ------------------------------------------------------------- */

typedef struct {
    double loss_sum;
    long steps, skipped_total;
    double scale;
    double lr; /* the last step's learning rate */
    int scaling;
    mpt_metric_sums met; /* over the finite steps' examples */
} epoch_stats;

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

static void progress_line(FILE *f, long done, long total, double elapsed, const epoch_stats *st,
                          int final, const char *extra, int bpb) {
    char b[64], t[32];
    bar(b, sizeof b, done, total);
    double ms = st->steps ? 1000.0 * elapsed / (double)st->steps : 0;
    if (final) fmt_time(t, sizeof t, elapsed);
    else fmt_time(t, sizeof t, st->steps ? elapsed / (double)st->steps * (double)(total - done) : 0);
    fprintf(f, "\r%ld/%ld %s - %s%s %.*fms/step - loss: %.4f", done, total, b, final ? "" : "ETA: ", t,
            ms < 10 ? 1 : 0, ms, st->steps ? st->loss_sum / (double)st->steps : 0.0);
    /* a byte-level language model's loss in bits a byte (nats / ln 2) */
    if (bpb) fprintf(f, " - bpb: %.3f", st->steps ? st->loss_sum / (double)st->steps / M_LN2 : 0.0);
    char met[256];
    mpt_metric_line(&st->met, "", met, sizeof met);
    fputs(met, f);
    if (st->scaling) fprintf(f, " - loss_scale: %g - skipped: %ld", st->scale, st->skipped_total);
    if (extra) fputs(extra, f);
    if (final) fputc('\n', f);
    fflush(f);
}

/* ---- the log ------------------------------------------------------------- */

/* One JSON object a line, flushed so a reader can follow the run. A line
 * that cannot be written (a full disk, /dev/full) is an error: -1, said on
 * stderr. */
static int log_obj(FILE *f, const char *path, cJSON *o) {
    int rc = 0;
    if (f) {
        char *s = cJSON_PrintUnformatted(o);
        if (!s || fprintf(f, "%s\n", s) < 0 || fflush(f) != 0 || ferror(f)) {
            fprintf(stderr, "\nmptc: cannot write the log %s: %m\n  hint: check the disk's free "
                    "space, or leave --log out\n", path);
            rc = -1;
        }
        free(s);
    }
    cJSON_Delete(o);
    return rc;
}

/* A loss in the log: a number, or null where it is not finite (JSON has
 * no NaN, and -1 would read as a value). */
static void log_loss(cJSON *o, const char *key, double v) {
    if (isfinite(v)) cJSON_AddNumberToObject(o, key, v);
    else cJSON_AddNullToObject(o, key);
}

/* each metric asked, its name after prefix, its mean over m's examples */
static void log_metrics(cJSON *o, const mpt_metric_sums *m, const char *prefix) {
    for (int i = 0; i < MPT_N_MET; i++) {
        if (m->out[i] < 0) continue;
        char name[32], key[48];
        snprintf(key, sizeof key, "%s%s", prefix, mpt_metric_name(m, i, name, sizeof name));
        log_loss(o, key, mpt_metric_mean(m, i));
    }
}

int mpt_train_log_test(mpt_train_state *R, const mpt_eval_result *test) {
    if (!R->logf) return 0;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "event", "test");
    log_loss(o, "loss", test->loss);
    log_metrics(o, &test->metrics, "");
    return log_obj(R->logf, R->r->log_path, o);
}

static int log_step(mpt_train_state *R, long epoch, const epoch_stats *st, double loss, int finite,
                    int64_t real, double ms) {
    if (!R->logf) return 0;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "event", "step");
    cJSON_AddNumberToObject(o, "epoch", (double)epoch);
    cJSON_AddNumberToObject(o, "step", (double)R->global);
    log_loss(o, "loss", loss);
    cJSON_AddBoolToObject(o, "finite", finite);
    mpt_metric_sums one; /* this step's alone */
    mpt_metric_sums_init(&one, R->s->train, st->met.top_k);
    mpt_metric_sums_add(&one, R->out, real);
    log_metrics(o, &one, "");
    if (R->scaling) {
        cJSON_AddNumberToObject(o, "loss_scale", st->scale);
        cJSON_AddNumberToObject(o, "skipped", (double)st->skipped_total);
    }
    if (R->io.lr >= 0) cJSON_AddNumberToObject(o, "learning_rate", st->lr);
    cJSON_AddNumberToObject(o, "ms", ms);
    return log_obj(R->logf, R->r->log_path, o);
}

static int log_epoch(mpt_train_state *R, long epoch, const epoch_stats *st,
                     const mpt_eval_result *val, double elapsed) {
    if (!R->logf) return 0;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "event", "epoch");
    cJSON_AddNumberToObject(o, "epoch", (double)epoch);
    log_loss(o, "loss", st->steps ? st->loss_sum / (double)st->steps : NAN);
    log_metrics(o, &st->met, "");
    if (val) {
        log_loss(o, "val_loss", val->loss);
        log_metrics(o, &val->metrics, "val_");
    }
    if (R->scaling) {
        cJSON_AddNumberToObject(o, "loss_scale", st->scale);
        cJSON_AddNumberToObject(o, "skipped", (double)st->skipped_total);
    }
    if (R->io.lr >= 0) cJSON_AddNumberToObject(o, "learning_rate", st->lr);
    cJSON_AddNumberToObject(o, "seconds", elapsed);
    cJSON_AddNumberToObject(o, "ms_per_step", st->steps ? 1000 * elapsed / (double)st->steps : 0);
    return log_obj(R->logf, R->r->log_path, o);
}

/* the epoch's logs by Keras' names, for the callbacks */
static void epoch_logs(mpt_epoch_logs *l, const epoch_stats *st, const mpt_eval_result *val) {
    mpt_logs_add(l, "", "loss", st->loss_sum / (double)st->steps);
    for (int pass = 0; pass < 2; pass++) {
        const mpt_metric_sums *m = pass ? (val ? &val->metrics : NULL) : &st->met;
        if (!m) break;
        if (pass) mpt_logs_add(l, "", "val_loss", val->loss);
        for (int i = 0; i < MPT_N_MET; i++) {
            char name[32];
            if (m->out[i] >= 0)
                mpt_logs_add(l, pass ? "val_" : "", mpt_metric_name(m, i, name, sizeof name),
                             mpt_metric_mean(m, i));
        }
    }
    mpt_logs_add(l, "", "learning_rate", st->lr);
}

/* ---- TensorBoard (--tensorboard DIR) -------------------------------------------
 * Keras' tags: batch_* at every step (x: the step), epoch_* at every
 * epoch's end (x: the epoch, from 0) in DIR/train and, for the validation
 * metrics, DIR/validation; each weight's histogram at every epoch's end,
 * or every --histogram-every steps (x: the step). */

static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int tb_failed(mpt_train_state *R) {
    char err[512];
    if (mpt_tb_flush(R->tb_train, err, sizeof err) == 0 &&
        mpt_tb_flush(R->tb_val, err, sizeof err) == 0)
        return 0;
    fprintf(stderr, "\nmptc: --tensorboard: %s\n", err);
    return -1;
}

/* --histogram-grads: the gradient step (mpt_grad_step) on the batch just
 * trained on, at the weights after the step, one histogram a variable.
 * With ranks, each rank's gradient is of its shard of the batch: every
 * rank computes it and the ranks average them (what the step applied),
 * and rank 0, the writer, draws the histograms. */
static int tb_grad_histograms(mpt_train_state *R, int64_t step, double now) {
    mpt_session *s = R->s;
    const mpt_graph *g = s->grads;
    int n_in = mpt_graph_n_inputs(g), n_var = mpt_graph_n_variables(g), rc = -1;
    mpt_tensor *in = calloc((size_t)n_in + 1, sizeof *in);
    mpt_tensor *vars = calloc((size_t)n_var + 1, sizeof *vars);
    mpt_tensor *out = calloc((size_t)g->n_outputs + 1, sizeof *out);
    if (!in || !vars || !out) goto done;
    for (int k = 0; k < n_in; k++) { /* the train step's input of that name */
        int id = mpt_graph_find_input(s->train, g->nodes[mpt_graph_input_node(g, k)].name);
        for (int j = 0; j < mpt_graph_n_inputs(s->train); j++)
            if (mpt_graph_input_node(s->train, j) == id) in[k] = R->in[j];
    }
    for (int k = 0; k < n_var; k++) vars[k] = s->vars[s->grads_var[k]]; /* never updated */
    if (s->backend->push_vars) s->backend->push_vars(s->grads_exec); /* the host's are newer */
    if (s->backend->run(s->grads_exec, in, vars, out, R->err, sizeof R->err)) {
        fprintf(stderr, "\nmptc: --histogram-grads: %s\n", R->err);
        goto done;
    }
    for (int k = 0; k < g->n_outputs; k++) {
        if (out[k].dtype != MPT_DT_F32) continue;
        float *v = (float *)out[k].data;
        int64_t nv = mpt_shape_numel(out[k].shape);
        if (mpt_dist_mean_f32(v, nv, R->err, sizeof R->err)) {
            fprintf(stderr, "\nmptc: --histogram-grads: %s\n", R->err);
            goto done;
        }
        if (R->tb_train) mpt_tb_histogram(R->tb_train, g->outputs[k].name, step, now, v, nv, NULL);
    }
    rc = 0;
done:
    for (int k = 0; out && k < g->n_outputs; k++) mpt_tensor_free(&out[k]);
    free(in);
    free(vars);
    free(out);
    return rc;
}

static int tb_histograms(mpt_train_state *R, int64_t step, double now) {
    mpt_session *s = R->s;
    if (!R->tb_train) /* a rank that does not write: its share of the gradients' mean */
        return s->grads_exec && mpt_dist_size() > 1 && R->r->tensorboard ? tb_grad_histograms(R, step, now) : 0;
    if (mpt_session_pull_vars(s, R->err, sizeof R->err)) {
        fprintf(stderr, "\nmptc: --tensorboard: %s\n", R->err);
        return -1;
    }
    if (s->grads_exec && tb_grad_histograms(R, step, now)) return -1;
    for (int k = 0; k < s->n_vars; k++) {
        if (!mpt_ckpt_is_weight(s, k) || s->vars[k].dtype != MPT_DT_F32) continue;
        const char *name = s->train->nodes[mpt_graph_variable_node(s->train, k)].name;
        mpt_tb_histogram(R->tb_train, name, step, now, (const float *)s->vars[k].data,
                         mpt_shape_numel(s->vars[k].shape), NULL);
    }
    return 0;
}

static int tb_step(mpt_train_state *R, const epoch_stats *st, double loss, int finite,
                   double ms) {
    double now = wall_time();
    int64_t step = R->global;
    long every = R->r->histogram_every;
    if (!R->tb_train) return every > 0 && step % every == 0 ? tb_histograms(R, step, now) : 0;
    mpt_tb *w = R->tb_train;
    if (finite) mpt_tb_scalar(w, "batch_loss", step, now, loss);
    if (R->io.lr >= 0) mpt_tb_scalar(w, "batch_learning_rate", step, now, st->lr);
    if (R->scaling) {
        mpt_tb_scalar(w, "batch_loss_scale", step, now, st->scale);
        mpt_tb_scalar(w, "batch_skipped_steps", step, now, (double)st->skipped_total);
    }
    mpt_tb_scalar(w, "batch_step_time_ms", step, now, ms);
    if (every > 0 && step % every == 0 && tb_histograms(R, step, now)) return -1;
    return 0;
}

static void tb_metrics(mpt_tb *w, const mpt_metric_sums *m, int64_t step, double now) {
    for (int i = 0; i < MPT_N_MET; i++) {
        if (m->out[i] < 0) continue;
        char name[32], tag[48];
        snprintf(tag, sizeof tag, "epoch_%s", mpt_metric_name(m, i, name, sizeof name));
        mpt_tb_scalar(w, tag, step, now, mpt_metric_mean(m, i));
    }
}

static int tb_epoch(mpt_train_state *R, long e, const epoch_stats *st, const mpt_eval_result *val) {
    double now = wall_time();
    if (!R->tb_train) return R->r->histogram_every <= 0 ? tb_histograms(R, e, now) : 0;
    if (st->steps) mpt_tb_scalar(R->tb_train, "epoch_loss", e, now, st->loss_sum / (double)st->steps);
    tb_metrics(R->tb_train, &st->met, e, now);
    if (R->io.lr >= 0) mpt_tb_scalar(R->tb_train, "epoch_learning_rate", e, now, st->lr);
    if (val) {
        mpt_tb_scalar(R->tb_val, "epoch_loss", e, now, val->loss);
        tb_metrics(R->tb_val, &val->metrics, e, now);
    }
    if (R->r->histogram_every <= 0 && tb_histograms(R, e, now)) return -1;
    return tb_failed(R);
}

/* ---- stopping on SIGINT / SIGTERM ----------------------------------------- */

/* The first signal lets the running step finish and ends the run there,
 * keeping what was learned (--save's checkpoint); a second one ends the
 * process at once, as the shell's default would have. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) {
    if (stop_signal) _exit(128 + sig);
    stop_signal = sig;
    static const char msg[] = "\nmptc: stopping after this step (press Ctrl-C again to quit "
                              "at once)\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
}

/* ---- the epochs ------------------------------------------------------------ */

/* The data set's batch (of the step's size) that is this rank's share of
 * global batch b: the ranks take consecutive slices of one shuffled order,
 * so N ranks see, step by step, the rows one process would with N times
 * the batch. */
static int64_t shard(const mpt_train_state *R, int64_t b) {
    return b * R->s->ranks + mpt_dist_rank();
}

/* With augmentation: batch b from the thread that read and augmented it
 * during the step before (or now, for an epoch's first), and batch b + 1
 * started on it. The CUDA upload of the next batch during a step is not
 * used then: the batch is not ready when the step starts. */
static int take_prefetched(mpt_train_state *R, int64_t epoch, int64_t b, int64_t *next_b,
                           int64_t *real) {
    mpt_session *s = R->s;
    if (*next_b == b) {
        if (mpt_prefetch_wait(R->prefetch, real, R->err, sizeof R->err)) {
            fprintf(stderr, "\nmptc: %s\n", R->err);
            return -1;
        }
        mpt_tensor *t = R->in;
        R->in = R->in_next;
        R->in_next = t;
    } else if (mpt_augment_batch(R->aug, R->train, R->seed, epoch, shard(R, b), s->batch_size, 0,
                                 &R->in[R->io.x], &R->in[R->io.y], real, R->err,
                                 sizeof R->err)) {
        fprintf(stderr, "\nmptc: %s\n", R->err);
        return -1;
    }
    *next_b = -1;
    if (b + 1 < R->nb && mpt_prefetch_start(R->prefetch, epoch, shard(R, b + 1), &R->in_next[R->io.x],
                                            &R->in_next[R->io.y]) == 0)
        *next_b = b + 1;
    return 0;
}

/* Reads batch b into R->in: the one read ahead when it is b, else now. */
static int take_batch(mpt_train_state *R, int64_t epoch, int64_t b, int64_t *next_b,
                      int64_t *next_real, int64_t *real) {
    mpt_session *s = R->s;
    if (R->prefetch) return take_prefetched(R, epoch, b, next_b, real);
    if (*next_b == b) {
        mpt_tensor *t = R->in;
        R->in = R->in_next;
        R->in_next = t;
        *real = *next_real;
    } else if (mpt_data_batch(R->train, shard(R, b), s->batch_size, &R->in[R->io.x], &R->in[R->io.y], real,
                              R->err, sizeof R->err)) {
        fprintf(stderr, "\nmptc: %s\n", R->err);
        return -1;
    }
    *next_b = -1;
    /* the next batch, read now and uploaded while this step runs (CUDA);
     * a batch that fails to read is read again, and its error reported,
     * in its own turn */
    if (R->in_next && b + 1 < R->nb &&
        mpt_data_batch(R->train, shard(R, b + 1), s->batch_size, &R->in_next[R->io.x], &R->in_next[R->io.y],
                       next_real, R->err, sizeof R->err) == 0) {
        *next_b = b + 1;
        if (s->backend->stage_next(s->train_exec, R->in_next, R->err, sizeof R->err) < 0) {
            fprintf(stderr, "\nmptc: %s\n", R->err);
            return -1;
        }
    }
    return 0;
}

/* Fault injection for the tests (docs/DECISIONS.md): MPTC_FAULT_INPUT=
 * "RANK:STEP" makes the first input value of that rank's batch at that
 * step (1-based, counted over the run) infinite, an overflow that only
 * one rank of a data-parallel run sees. */
static void plant_fault(mpt_train_state *R) {
    const char *f = getenv("MPTC_FAULT_INPUT");
    long rank, step;
    if (!f || sscanf(f, "%ld:%ld", &rank, &step) != 2) return;
    mpt_tensor *x = &R->in[R->io.x];
    if (rank == mpt_dist_rank() && step == R->global + 1 && x->dtype == MPT_DT_F32 &&
        mpt_shape_numel(x->shape) > 0)
        ((float *)x->data)[0] = INFINITY;
}

static void free_outputs(mpt_train_state *R) {
    for (int k = 0; k < R->s->train->n_outputs; k++) mpt_tensor_free(&R->out[k]);
}

int mpt_train_epochs(mpt_train_state *R) {
    const mpt_train_run *r = R->r;
    mpt_session *s = R->s;
    const step_io_idx *io = &R->io;
    int how = MPT_RUN_DONE, stop = r->max_steps > 0 && R->global >= r->max_steps;
    long consecutive = 0;
    long first_epoch = R->nb > 0 ? (long)(R->global / R->nb) : 0;
    /* SIGUSR1 too: Open MPI's mpirun ends the whole job on SIGINT and
     * SIGTERM (its daemons gone, the ranks cannot agree or save), but
     * forwards SIGUSR1 to every rank: `kill -USR1 <mpirun>` stops a
     * data-parallel run after a step, saved (docs/DATA_PARALLEL.md) */
    struct sigaction sa, int_was, term_was, usr1_was;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    stop_signal = 0;
    sigaction(SIGINT, &sa, &int_was);
    sigaction(SIGTERM, &sa, &term_was);
    sigaction(SIGUSR1, &sa, &usr1_was);
    for (long e = first_epoch; e < R->epochs && !stop; e++) {
        printf("Epoch %ld/%ld\n", e + 1, R->epochs);
        mpt_data_shuffle(R->train, R->seed, e);
        epoch_stats st = {.scaling = R->scaling};
        mpt_metric_sums_init(&st.met, s->train, s->topts.metrics.top_k);
        double t0 = mpt_now(), last_print = 0;
        int64_t b0 = R->global > (long)(e * R->nb) ? R->global - e * R->nb : 0;
        int64_t next_b = -1, next_real = 0; /* the batch in_next holds */
        for (int64_t b = b0; b < R->nb && !stop; b++) {
            int64_t real;
            if (take_batch(R, e, b, &next_b, &next_real, &real)) goto failed;
            real *= s->ranks; /* the step's outputs are the global batch's */
            plant_fault(R);
            double ts = mpt_now();
            if (s->backend->run(s->train_exec, R->in, s->vars, R->out, R->err, sizeof R->err)) {
                fprintf(stderr, "\nmptc: step %ld failed: %s\n", R->global + 1, R->err);
                goto failed;
            }
            double step_ms = 1000 * (mpt_now() - ts);
            R->global++;
            double loss = mpt_tensor_get(&R->out[io->loss], 0);
            int finite = io->finite < 0 || mpt_tensor_get(&R->out[io->finite], 0) != 0;
            /* a loss that is not finite has gradients that are not either */
            finite &= isfinite(loss) != 0;
            st.scale = io->scale >= 0 ? mpt_tensor_get(&R->out[io->scale], 0) : 1;
            if (io->lr >= 0) st.lr = mpt_tensor_get(&R->out[io->lr], 0);
            if (finite) {
                st.loss_sum += loss;
                mpt_metric_sums_add(&st.met, R->out, real);
                st.steps++;
                consecutive = 0;
            } else {
                st.skipped_total++;
                consecutive++;
            }
            int log_failed = log_step(R, e + 1, &st, loss, finite, real, step_ms) ||
                             tb_step(R, &st, loss, finite, step_ms);
            free_outputs(R);
            if (log_failed) goto failed;
            /* without loss scaling one such step ends the run; the graph
             * applied none of it (ir/train.c), so the weights are those
             * of the step before */
            if (!R->scaling && !finite) {
                fprintf(stderr, "\nmptc: step %ld: the %s, so the step was not applied; the run "
                        "stops here with the weights of step %ld\n", R->global,
                        isfinite(loss) ? "gradients are not finite" : isnan(loss)
                                                                          ? "loss became NaN"
                                                                          : "loss became infinite",
                        R->global - 1);
                mpt_report_nonfinite(s, R->in, stderr);
                how = MPT_RUN_NONFINITE;
                break;
            }
            if (R->scaling && consecutive >= R->max_skipped) {
                fprintf(stderr, "\nmptc: %ld consecutive steps were skipped: gradients are not finite "
                        "even at loss scale %g\n", consecutive, st.scale);
                mpt_report_nonfinite(s, R->in, stderr);
                how = MPT_RUN_NONFINITE;
                break;
            }
            if (R->tty && (mpt_now() - last_print > 0.1 || b + 1 == R->nb)) {
                progress_line(stdout, b + 1, R->nb, mpt_now() - t0, &st, 0, NULL, R->bits_per_byte);
                last_print = mpt_now();
            }
            if (r->save_every > 0 && R->global % r->save_every == 0 && r->save_path)
                mpt_train_save(R); /* said on stderr; the run goes on */
            if (r->max_steps > 0 && R->global >= r->max_steps) stop = 1;
            /* the ranks stop after the same step: a signal one caught
             * stops all (mpirun forwards it, but not at the same instant) */
            int sig = s->ranks > 1 ? mpt_dist_max(stop_signal) : stop_signal;
            if (sig < 0) {
                fprintf(stderr, "\nmptc: rank %d: the other ranks cannot be reached after step %ld\n",
                        mpt_dist_rank(), R->global);
                goto failed;
            }
            if (sig) {
                if (!stop_signal) stop_signal = sig;
                how = MPT_RUN_INTERRUPTED;
                stop = 1;
            }
        }
        if (how == MPT_RUN_NONFINITE) break;
        double elapsed = mpt_now() - t0;
        char extra[320] = "";
        mpt_eval_result v;
        int validate = R->val && how == MPT_RUN_DONE;
        if (validate) {
            if (mpt_evaluate(s, R->val, &v, R->err, sizeof R->err)) {
                fprintf(stderr, "\nmptc: validation: %s\n", R->err);
                goto failed;
            }
            char met[256];
            mpt_metric_line(&v.metrics, "val_", met, sizeof met);
            snprintf(extra, sizeof extra, " - val_loss: %.4f%s", v.loss, met);
            if (R->bits_per_byte)
                snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " - val_bpb: %.3f",
                         v.loss / M_LN2);
        }
        progress_line(stdout, st.steps + st.skipped_total, st.steps + st.skipped_total, elapsed, &st,
                      1, extra, R->bits_per_byte);
        if (log_epoch(R, e + 1, &st, validate ? &v : NULL, elapsed) ||
            tb_epoch(R, e, &st, validate ? &v : NULL))
            goto failed;
        if (R->callbacks && how == MPT_RUN_DONE && st.steps > 0) {
            mpt_epoch_logs logs = {0};
            epoch_logs(&logs, &st, validate ? &v : NULL);
            if (mpt_callbacks_epoch_end(R->callbacks, R, e + 1, &logs, &stop)) goto failed;
        }
    }
    if (R->callbacks && how == MPT_RUN_DONE && mpt_callbacks_train_end(R->callbacks, R))
        goto failed;
    R->signal = stop_signal;
    sigaction(SIGINT, &int_was, NULL);
    sigaction(SIGTERM, &term_was, NULL);
    sigaction(SIGUSR1, &usr1_was, NULL);
    return how;
failed:
    R->signal = stop_signal;
    sigaction(SIGINT, &int_was, NULL);
    sigaction(SIGTERM, &term_was, NULL);
    sigaction(SIGUSR1, &usr1_was, NULL);
    return MPT_RUN_FAILED;
}

int mpt_train_save(mpt_train_state *R) {
    const mpt_train_run *r = R->r;
    mpt_ckpt_meta m = {.step = R->global, .seed = R->seed, .batch_size = R->s->global_batch,
                       .steps_per_epoch = R->nb};
    if (mpt_ckpt_save(r->save_path, R->s, &m, R->err, sizeof R->err)) {
        fprintf(stderr, "\nmptc: %s\n", R->err);
        return -1;
    }
    return 0;
}
