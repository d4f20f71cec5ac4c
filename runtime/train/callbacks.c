/* runtime/train/callbacks.c — early_stopping, reduce_lr_on_plateau and
 * model_checkpoint, as Keras 3's EarlyStopping, ReduceLROnPlateau and
 * ModelCheckpoint decide, each decision printed after the epoch's line
 * as Keras prints it with verbose=1.
 *
 * Decisions (docs/DECISIONS.md):
 *  - A monitor the run does not log (val_loss without validation data, a
 *    metric not asked for) is an error before the first step, where
 *    Keras warns every epoch and does nothing.
 *  - reduce_lr_on_plateau sets the state variable
 *    "optimizer/learning_rate", which the compiled step reads; with a
 *    schedule there is none to set, and it is an error (Keras raises).
 *  - Callback state (best value, patience counters) is not saved in
 *    checkpoints, as in Keras; the reduced learning rate is, being state. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/train/train_impl.h"

void mpt_logs_add(mpt_epoch_logs *l, const char *prefix, const char *name, double v) {
    if (l->n >= MPT_MAX_LOGS) return;
    snprintf(l->name[l->n], sizeof l->name[l->n], "%s%s", prefix, name);
    l->value[l->n++] = v;
}

static const double *log_value(const mpt_epoch_logs *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->name[i], name) == 0) return &l->value[i];
    return NULL;
}

static const char *cb_name(mpt_callback_kind k) {
    return k == MPT_CB_EARLY_STOPPING ? "early_stopping"
           : k == MPT_CB_REDUCE_LR    ? "reduce_lr_on_plateau"
                                      : "model_checkpoint";
}

double mpt_session_learning_rate(mpt_session *s) {
    int k = mpt_session_var(s, "optimizer/learning_rate");
    if (k < 0) return -1;
    char err[256];
    if (mpt_session_pull_vars(s, err, sizeof err)) return -1;
    return mpt_tensor_get(&s->vars[k], 0);
}

/* The names the run logs, for the monitor check's hint */
static void known_names(const mpt_session *s, int has_val, char *buf, size_t n) {
    mpt_metric_sums m;
    mpt_metric_sums_init(&m, s->train, s->topts.metrics.top_k);
    size_t o = (size_t)snprintf(buf, n, "loss");
    for (int pass = 0; pass < 1 + has_val && o < n; pass++) {
        if (pass) o += (size_t)snprintf(buf + o, n - o, ", val_loss");
        for (int i = 0; i < MPT_N_MET && o < n; i++) {
            if (m.out[i] < 0) continue;
            char name[32];
            o += (size_t)snprintf(buf + o, n - o, ", %s%s", pass ? "val_" : "",
                                  mpt_metric_name(&m, i, name, sizeof name));
        }
    }
}

static int monitor_known(const mpt_session *s, int has_val, const char *monitor) {
    const char *name = monitor;
    if (strncmp(name, "val_", 4) == 0) {
        if (!has_val) return 0;
        name += 4;
    }
    if (strcmp(name, "loss") == 0) return 1;
    mpt_metric_sums m;
    mpt_metric_sums_init(&m, s->train, s->topts.metrics.top_k);
    for (int i = 0; i < MPT_N_MET; i++) {
        char buf[32];
        if (m.out[i] >= 0 && strcmp(mpt_metric_name(&m, i, buf, sizeof buf), name) == 0) return 1;
    }
    return 0;
}

int mpt_callbacks_init(mpt_callbacks *c, mpt_session *s, int has_val) {
    const mpt_train_config *tc = &s->model->train;
    memset(c, 0, sizeof *c);
    c->lr_var = mpt_session_var(s, "optimizer/learning_rate");
    c->n_vars = s->n_vars;
    for (int i = 0; i < tc->n_callbacks; i++) {
        const mpt_callback_config *cfg = &tc->callbacks[i];
        mpt_callback_state *st = &c->cb[c->n++];
        st->cfg = cfg;
        if (!monitor_known(s, has_val, cfg->monitor)) {
            char names[256];
            known_names(s, has_val, names, sizeof names);
            fprintf(stderr, "%s:%d:%d: error: %s monitors '%s', which this run does not log\n"
                    "  hint: the run logs %s%s\n", s->model->path ? s->model->path : "train",
                    cfg->line, cfg->col, cb_name(cfg->kind), cfg->monitor, names,
                    strncmp(cfg->monitor, "val_", 4) == 0 && !has_val
                        ? "; val_* needs validation_split or validation_data"
                        : "");
            return -1;
        }
        if (cfg->kind == MPT_CB_REDUCE_LR && c->lr_var < 0) {
            fprintf(stderr, "%s:%d:%d: error: reduce_lr_on_plateau cannot change a learning rate "
                    "that a schedule sets (Keras refuses the same)\n  hint: give the optimizer a "
                    "constant learning_rate, or leave the callback out\n",
                    s->model->path ? s->model->path : "train", cfg->line, cfg->col);
            return -1;
        }
        /* Keras' mode auto: max for accuracy-like monitors */
        st->higher_is_better = cfg->mode == MPT_CB_MODE_MAX ||
                               (cfg->mode == MPT_CB_MODE_AUTO &&
                                (strstr(cfg->monitor, "acc") != NULL ||
                                 strncmp(cfg->monitor, "fmeasure", 8) == 0));
        st->best = st->higher_is_better ? -INFINITY : INFINITY;
    }
    return 0;
}

/* Keras' _is_improvement: current beats best by more than min_delta */
static int improved(const mpt_callback_state *st, double current, double min_delta) {
    if (isnan(current)) return 0;
    return st->higher_is_better ? current - min_delta > st->best : current + min_delta < st->best;
}

static int copy_weights(mpt_session *s, mpt_tensor **dst) {
    char err[512];
    if (mpt_session_pull_vars(s, err, sizeof err)) {
        fprintf(stderr, "\nmptc: early_stopping: %s\n", err);
        return -1;
    }
    if (!*dst) {
        *dst = calloc((size_t)s->n_vars + 1, sizeof **dst);
        if (!*dst) return -1;
    }
    for (int k = 0; k < s->n_vars; k++) {
        if (!mpt_ckpt_is_weight(s, k)) continue;
        mpt_tensor *t = &(*dst)[k];
        if (!t->data && mpt_tensor_alloc(t, s->vars[k].dtype, s->vars[k].shape) != 0) return -1;
        memcpy(t->data, s->vars[k].data, mpt_tensor_bytes(t));
    }
    return 0;
}

static void set_learning_rate(mpt_callbacks *c, mpt_session *s, double lr) {
    char err[256];
    if (mpt_session_pull_vars(s, err, sizeof err)) return;
    mpt_tensor_set(&s->vars[c->lr_var], 0, lr);
    if (s->backend->push_vars) {
        s->backend->push_vars(s->train_exec);
        if (s->eval_exec) s->backend->push_vars(s->eval_exec);
    }
}

/* "{epoch}" and "{epoch:02d}" in a checkpoint path, as Keras formats it */
static void format_path(char *buf, size_t n, const char *path, long epoch) {
    size_t o = 0;
    for (const char *p = path; *p && o + 1 < n;) {
        int width = -1;
        if (strncmp(p, "{epoch}", 7) == 0) width = 0, p += 7;
        else if (strncmp(p, "{epoch:0", 8) == 0 && p[8] >= '1' && p[8] <= '9' &&
                 strncmp(p + 9, "d}", 2) == 0)
            width = p[8] - '0', p += 11;
        if (width >= 0) o += (size_t)snprintf(buf + o, n - o, "%0*ld", width, epoch);
        else buf[o++] = *p++;
    }
    buf[o < n ? o : n - 1] = 0;
}

static int checkpoint(mpt_callback_state *st, mpt_train_state *R, long epoch, double current) {
    const mpt_callback_config *cfg = st->cfg;
    char path[1024];
    format_path(path, sizeof path, cfg->filepath, epoch);
    if (cfg->save_best_only) {
        if (!improved(st, current, 0)) {
            printf("Epoch %ld: %s did not improve from %.5f\n", epoch, cfg->monitor, st->best);
            return 0;
        }
        printf("Epoch %ld: %s improved from %.5f to %.5f, saving model to %s\n", epoch,
               cfg->monitor, st->best, current, path);
        st->best = current;
    } else {
        printf("Epoch %ld: saving model to %s\n", epoch, path);
    }
    mpt_ckpt_meta m = {.step = R->global, .seed = R->seed, .batch_size = R->s->batch_size,
                       .steps_per_epoch = R->nb};
    if (mpt_ckpt_save(path, R->s, &m, R->err, sizeof R->err)) {
        fprintf(stderr, "mptc: model_checkpoint: %s\n", R->err);
        return -1;
    }
    return 0;
}

int mpt_callbacks_epoch_end(mpt_callbacks *c, mpt_train_state *R, long epoch,
                            const mpt_epoch_logs *logs, int *stop) {
    for (int i = 0; i < c->n; i++) {
        mpt_callback_state *st = &c->cb[i];
        const mpt_callback_config *cfg = st->cfg;
        const double *v = log_value(logs, cfg->monitor);
        if (!v) continue; /* checked at the start; an epoch cut short logs less */
        double current = *v;
        switch (cfg->kind) {
        case MPT_CB_EARLY_STOPPING:
            if (epoch - 1 < cfg->start_from_epoch) break;
            if (cfg->restore_best_weights && !st->best_weights &&
                copy_weights(R->s, &st->best_weights))
                return -1;
            st->wait++;
            if (improved(st, current, cfg->min_delta)) {
                st->best = current;
                st->best_epoch = epoch;
                if (cfg->restore_best_weights && copy_weights(R->s, &st->best_weights)) return -1;
                st->wait = 0;
                break;
            }
            if (st->wait >= cfg->patience && epoch > 1) {
                printf("Epoch %ld: early stopping (%s has not improved on %.5f for %ld epoch%s)\n",
                       epoch, cfg->monitor, st->best, st->wait, st->wait == 1 ? "" : "s");
                *stop = 1;
            }
            break;
        case MPT_CB_REDUCE_LR:
            if (st->cooldown > 0) {
                st->cooldown--;
                st->wait = 0;
            }
            if (improved(st, current, cfg->min_delta)) {
                st->best = current;
                st->wait = 0;
            } else if (st->cooldown <= 0 && ++st->wait >= cfg->patience) {
                double old = mpt_session_learning_rate(R->s);
                if (old > cfg->min_lr) {
                    double lr = fmax(old * cfg->factor, cfg->min_lr);
                    set_learning_rate(c, R->s, lr);
                    printf("Epoch %ld: ReduceLROnPlateau reducing learning rate to %g.\n", epoch,
                           (double)(float)lr);
                    st->cooldown = cfg->cooldown;
                    st->wait = 0;
                }
            }
            break;
        case MPT_CB_CHECKPOINT:
            if (checkpoint(st, R, epoch, current)) return -1;
            break;
        case MPT_CB_COUNT: break;
        }
    }
    return 0;
}

int mpt_callbacks_train_end(mpt_callbacks *c, mpt_train_state *R) {
    mpt_session *s = R->s;
    for (int i = 0; i < c->n; i++) {
        mpt_callback_state *st = &c->cb[i];
        if (st->cfg->kind != MPT_CB_EARLY_STOPPING || !st->best_weights || !st->best_epoch)
            continue;
        printf("Restoring model weights from the end of the best epoch: %ld.\n", st->best_epoch);
        char err[256];
        if (mpt_session_pull_vars(s, err, sizeof err)) {
            fprintf(stderr, "mptc: early_stopping: %s\n", err);
            return -1;
        }
        for (int k = 0; k < s->n_vars; k++)
            if (st->best_weights[k].data)
                memcpy(s->vars[k].data, st->best_weights[k].data, mpt_tensor_bytes(&s->vars[k]));
        if (s->backend->push_vars) {
            s->backend->push_vars(s->train_exec);
            if (s->eval_exec) s->backend->push_vars(s->eval_exec);
        }
    }
    return 0;
}

void mpt_callbacks_free(mpt_callbacks *c) {
    for (int i = 0; i < c->n; i++) {
        mpt_callback_state *st = &c->cb[i];
        if (!st->best_weights) continue;
        for (int k = 0; k < c->n_vars; k++) mpt_tensor_free(&st->best_weights[k]);
        free(st->best_weights);
        st->best_weights = NULL;
    }
}
