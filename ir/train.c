/* ir/train.c — the train and eval steps: one graph per step, built from a
 * typed forward graph (see mpt_train_step in ir/ir.h for the contract).
 *
 * The train step, in order:
 *   loss (f32, ir/loss.c) and the accuracy count
 *   scaled = loss * scale                       scale: VARIABLE "loss_scale/scale"
 *   grads  = d scaled / d (trainable variables)  mpt_autodiff
 *   g      = cast(grad, f32) * (1 / scale)       as Keras' get_unscaled_gradients
 *   finite = AND over reduce_all(is_finite(g))   one flag for the whole step
 *   new    = optimizer(g)                        ir/optim.c
 *   every update := select(finite, new, old)
 *   scale, good_steps, skipped updated in the graph (dynamic or fixed)
 *
 * Decisions:
 *  - Variables without a gradient (not on the loss's path) get no update and
 *    no optimizer slots, as Keras skips them.
 *  - A skipped step changes no weight, slot, optimizer/iterations (Keras'
 *    inner optimizer is not called) or batch-norm moving statistic: float
 *    state of the forward graph is gated with the weights so an overflowing
 *    batch cannot poison the moving averages. Integer state of the forward
 *    graph (rng/counter, which feeds dropout) advances even on a skipped
 *    step, so the next step draws fresh masks instead of repeating them.
 *  - Without loss scaling (float32, mixed_bfloat16 by default) the updates
 *    are gated all the same, where Keras applies a non-finite step: a step
 *    whose gradients are not finite must never reach the weights, the
 *    slots or a checkpoint. The runtime stops the run on such a step
 *    (nothing to rescale) and keeps the weights of the step before;
 *    "loss_scale" is 1. The cost: an update can no longer join the kernel
 *    computing its gradient, since it waits for every gradient's check.
 *  - Dynamic scale (Keras' DynamicLossScale, plus a ceiling): on a finite
 *    step good_steps += 1 and, once it reaches period, scale =
 *    min(scale * factor, max_scale) and good_steps = 0; on a non-finite step
 *    scale = max(scale / factor, min_scale), good_steps = 0, skipped += 1.
 *    "skipped" counts every skipped step; the runtime derives consecutive
 *    skips from it. A fixed scale never changes, but its non-finite steps
 *    are still skipped and counted, and good_steps counts finite steps in a
 *    row for the display.
 *  - New state variables follow the model's own, in this order: optimizer
 *    slots (per trainable variable), optimizer/iterations, then the loss
 *    scale's scale, good_steps, skipped.
 */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/train_impl.h"

const char *mpt_loss_name(mpt_loss_kind k) {
    switch (k) {
    case MPT_LOSS_SPARSE_CATEGORICAL_CROSSENTROPY: return "sparse_categorical_crossentropy";
    case MPT_LOSS_CATEGORICAL_CROSSENTROPY: return "categorical_crossentropy";
    case MPT_LOSS_MEAN_SQUARED_ERROR: return "mean_squared_error";
    case MPT_LOSS_COUNT: break;
    }
    return "?";
}

static int check_loss_scale(const mpt_loss_scale_config *c, char *err, size_t errlen) {
    switch (c->mode) {
    case MPT_LS_NONE:
        return 0;
    case MPT_LS_FIXED:
        if (!(c->initial > 0) || !isfinite(c->initial)) {
            snprintf(err, errlen, "loss scale %g must be a positive number (hint: "
                     "--loss-scale dynamic, or a power of two such as 1024)", c->initial);
            return -1;
        }
        return 0;
    case MPT_LS_DYNAMIC:
        if (!(c->initial > 0) || !isfinite(c->initial) || !(c->factor > 1) ||
            !isfinite(c->factor) || c->period < 1 || !(c->min_scale > 0) ||
            !(c->max_scale >= c->min_scale) || !isfinite(c->max_scale)) {
            snprintf(err, errlen,
                     "dynamic loss scale: need initial > 0, factor > 1, period >= 1 and "
                     "0 < min_scale <= max_scale (got initial=%g factor=%g period=%ld "
                     "min=%g max=%g)",
                     c->initial, c->factor, c->period, c->min_scale, c->max_scale);
            return -1;
        }
        return 0;
    case MPT_LS_DEFAULT:
        break;
    }
    snprintf(err, errlen, "internal: loss-scale mode %d is not resolved to none, dynamic or "
             "fixed before building the train step", c->mode);
    return -1;
}

/* Copies fwd's nodes (not its outputs or updates) into a new graph;
 * map[i] is node i's id there, which is i. */
static mpt_graph *copy_nodes(const mpt_graph *fwd, int *map) {
    mpt_graph *g = mpt_graph_new(fwd->name);
    for (int i = 0; i < fwd->n_nodes; i++) map[i] = mpt_graph_copy_node(g, fwd, i, map);
    return g;
}

/* Checks fwd and adds y, the loss and the accuracy count. -1 on a user error. */
/* The metrics' outputs, in this order (mpt_metrics in ir/ir.h) */
enum { MET_CORRECT, MET_ABS, MET_SQ, MET_TOP_K, N_MET };
static const char *const met_names[N_MET] = {"correct", "abs_error", "sq_error", "top_k_correct"};

static int add_loss(mpt_graph *g, const mpt_graph *fwd, const mpt_train_opts *o, int *loss,
                    int *met, int *output, char *err, size_t errlen) {
    int oi = mpt_graph_find_output(fwd, "output");
    if (mpt_graph_find_input(fwd, "x") < 0 || oi < 0) {
        snprintf(err, errlen, "internal: the forward graph needs INPUT \"x\" and the output "
                              "\"output\"");
        return -1;
    }
    if (mpt_graph_find_input(fwd, "y") >= 0) {
        snprintf(err, errlen, "the model already has an input named \"y\", which the train "
                              "step reserves for the labels");
        return -1;
    }
    int li = mpt_graph_find_output(fwd, "logits");
    *output = fwd->outputs[oi].node;
    int logits = li >= 0 ? fwd->outputs[li].node : -1;
    if (o->loss == MPT_LOSS_MEAN_SQUARED_ERROR) logits = -1; /* MSE is on the output */
    mpt_b_layer(g, "loss");
    int y = mpt_train_add_labels(g, o->loss, *output, err, errlen);
    if (y < 0) return -1;
    *loss = mpt_train_loss(g, o->loss, *output, logits, y);
    for (int i = 0; i < N_MET; i++) met[i] = -1;
    const mpt_metrics *m = &o->metrics;
    mpt_b_layer(g, "metrics");
    if (m->accuracy && (met[MET_CORRECT] = mpt_train_correct(g, o->loss, *output, y, err, errlen)) < 0)
        return -1;
    if (m->mae && (met[MET_ABS] = mpt_train_errors(g, o->loss, *output, y, 0, err, errlen)) < 0)
        return -1;
    if (m->mse && (met[MET_SQ] = mpt_train_errors(g, o->loss, *output, y, 1, err, errlen)) < 0)
        return -1;
    if (m->top_k > 0 &&
        (met[MET_TOP_K] = mpt_train_top_k(g, o->loss, *output, y, m->top_k, err, errlen)) < 0)
        return -1;
    return 0;
}

/* value if finite, else old; flag is a bool scalar */
static int gate(mpt_graph *g, int finite, int value, int old) {
    int f = mpt_b_broadcast_to(g, finite, g->nodes[old].shape);
    return mpt_b_select(g, f, value, old);
}

static int all_finite(mpt_graph *g, const int *grads, int n) {
    int acc = -1;
    for (int i = 0; i < n; i++) {
        int ok = mpt_b_unary(g, MPT_OP_IS_FINITE, grads[i]);
        int rank = g->nodes[ok].shape.rank;
        /* one element (a one-filter layer's bias) is a reshape, and a last
         * dim of 1 leaves nothing for the two steps to split: one
         * reduction then (a [1] -> [] reduction is a kernel whose rows are
         * its elements, where the CUDA generator cannot place the ops that
         * read it) */
        if (rank > 0 && mpt_shape_numel(g->nodes[ok].shape) == 1) {
            ok = mpt_b_reshape(g, ok, mpt_shape_scalar());
        } else if (rank > 1 && g->nodes[ok].shape.dim[rank - 1] == 1) {
            ok = mpt_b_reduce(g, MPT_OP_REDUCE_ALL, ok, (1LL << rank) - 1);
        } else {
            /* in two steps, the leading dims first: a whole-tensor reduction
             * is one row, which a backend runs on one core; keeping the last
             * dim lets it split the rows over threads (AND is exact in any
             * order) */
            if (rank > 1) ok = mpt_b_reduce(g, MPT_OP_REDUCE_ALL, ok, (1LL << (rank - 1)) - 1);
            if (rank > 0) ok = mpt_b_reduce(g, MPT_OP_REDUCE_ALL, ok, 1);
        }
        acc = acc < 0 ? ok : mpt_b_binary(g, MPT_OP_AND, acc, ok);
    }
    return acc >= 0 ? acc : mpt_b_scalar(g, MPT_DT_BOOL, 1);
}

/* The loss-scale state's updates (dynamic or fixed). */
static void update_scale(mpt_graph *g, const mpt_loss_scale_config *c, int finite, int scale,
                         int good, int skipped) {
    int zero = mpt_b_scalar(g, MPT_DT_I32, 0);
    int good1 = mpt_b_binary(g, MPT_OP_ADD, good, mpt_b_scalar(g, MPT_DT_I32, 1));
    int skipped1 = mpt_b_binary(g, MPT_OP_ADD, skipped, mpt_b_scalar(g, MPT_DT_I32, 1));
    mpt_graph_add_update(g, skipped, mpt_b_select(g, finite, skipped, skipped1));
    if (c->mode == MPT_LS_FIXED) {
        mpt_graph_add_update(g, good, mpt_b_select(g, finite, good1, zero));
        return;
    }
    double period = c->period > INT32_MAX ? INT32_MAX : (double)c->period;
    int factor = mpt_b_scalar(g, MPT_DT_F32, c->factor);
    int grow = mpt_b_unary(g, MPT_OP_NOT, mpt_b_binary(g, MPT_OP_LT, good1,
                                                       mpt_b_scalar(g, MPT_DT_I32, period)));
    int grown = mpt_b_binary(g, MPT_OP_MIN, mpt_b_binary(g, MPT_OP_MUL, scale, factor),
                             mpt_b_scalar(g, MPT_DT_F32, c->max_scale));
    int shrunk = mpt_b_binary(g, MPT_OP_MAX, mpt_b_binary(g, MPT_OP_DIV, scale, factor),
                              mpt_b_scalar(g, MPT_DT_F32, c->min_scale));
    int if_finite = mpt_b_select(g, grow, grown, scale);
    mpt_graph_add_update(g, scale, mpt_b_select(g, finite, if_finite, shrunk));
    int good_if_finite = mpt_b_select(g, grow, zero, good1);
    mpt_graph_add_update(g, good, mpt_b_select(g, finite, good_if_finite, zero));
}

/* Finishes a step graph: folds reductions of statistics (ir/fold.c) and
 * batch-norm variances into the mean's read (ir/moments.c), drops what
 * nothing reads and verifies. */
static mpt_graph *finish(mpt_graph *g, char *err, size_t errlen) {
    mpt_graph *folded = mpt_fold_reductions(g, NULL);
    mpt_graph_free(g);
    if (folded) {
        mpt_graph *one_read = mpt_fold_variance(folded, NULL);
        mpt_graph_free(folded);
        folded = one_read;
    }
    if (!folded) {
        snprintf(err, errlen, "out of memory building the step graph");
        return NULL;
    }
    mpt_graph *out = mpt_graph_dce(folded, NULL);
    mpt_graph_free(folded);
    char buf[256];
    const char *e = mpt_graph_verify(out, buf, sizeof buf);
    if (e) {
        snprintf(err, errlen, "internal: the step graph does not verify: %s", e);
        mpt_graph_free(out);
        return NULL;
    }
    return out;
}

/* Autodiff, unscaling, the finite check, the optimizer and every gated
 * update. scale is -1 without loss scaling. Returns the finite flag, or
 * -1 with a message. */
static int add_backward(mpt_graph *g, const mpt_graph *fwd, const int *map,
                        const mpt_train_opts *o, int scaled, int scale, int *lr, char *err,
                        size_t errlen) {
    int n_vars = mpt_graph_n_variables(g);
    int *wrt = malloc(((size_t)n_vars + 1) * sizeof *wrt);
    int *grads = malloc(((size_t)n_vars + 1) * sizeof *grads);
    mpt_update *ups = malloc(((size_t)n_vars * 4 + 1) * sizeof *ups);
    int finite = -1, n_wrt = 0;
    if (!wrt || !grads || !ups) {
        snprintf(err, errlen, "out of memory building the train step");
        goto done;
    }
    for (int k = 0; k < n_vars; k++) {
        int v = mpt_graph_variable_node(g, k);
        if (g->nodes[v].attr.i[3] && mpt_dtype_is_float(g->nodes[v].dtype)) wrt[n_wrt++] = v;
    }
    mpt_b_layer(g, "backward");
    if (mpt_autodiff(g, scaled, -1, wrt, n_wrt, grads, err, errlen) != 0) goto done;

    mpt_b_layer(g, "loss_scale");
    int inv = scale >= 0 ? mpt_b_unary(g, MPT_OP_RECIP, scale) : -1;
    int ranks = o->ranks > 1 ? o->ranks : 1;
    if (ranks > 1) { /* the mean over the ranks: the sum times 1/ranks, with the unscale */
        int per_rank = mpt_b_scalar(g, MPT_DT_F32, 1.0 / ranks);
        inv = inv >= 0 ? mpt_b_binary(g, MPT_OP_MUL, inv, per_rank) : per_rank;
    }
    int shard = o->shard_optimizer && ranks > 1;
    /* ZeRO-1: the optimizer works on this rank's shard of each variable
     * (the flattened variable, ceil(n / ranks) values a rank, zero past
     * n), named "<w>@shard" for its slots */
    int *opt_var = malloc(((size_t)n_wrt + 1) * sizeof *opt_var);
    char **names = calloc((size_t)n_wrt + 1, sizeof *names);
    if (!opt_var || !names) {
        snprintf(err, errlen, "out of memory building the train step");
        free(opt_var);
        free(names);
        goto done;
    }
    char *needs_sum = calloc((size_t)n_wrt + 1, 1);
    if (!needs_sum) {
        snprintf(err, errlen, "out of memory building the train step");
        free(opt_var);
        free(names);
        goto done;
    }
    int n = 0; /* compact to the variables that have a gradient */
    for (int i = 0; i < n_wrt; i++) {
        if (grads[i] < 0) continue;
        int g32 = mpt_b_cast(g, grads[i], MPT_DT_F32);
        int sa = ranks > 1 ? mpt_train_scatter_of(g, grads[i]) : -1;
        int sparse = sa >= 0 ? mpt_train_sparse_sum(g, sa, ranks) : -1; /* already summed */
        if (sparse >= 0) g32 = sparse;
        opt_var[n] = wrt[i];
        if (shard) {
            int64_t numel = mpt_shape_numel(g->nodes[wrt[i]].shape);
            int64_t s = (numel + ranks - 1) / ranks;
            mpt_b_layer(g, "allreduce");
            g32 = mpt_b_shard_op(g, sparse >= 0 ? MPT_OP_RANK_SLICE : MPT_OP_REDUCE_SCATTER,
                                 mpt_b_reshape(g, g32, mpt_shape_1(numel)), s);
            mpt_b_layer(g, "optimizer");
            opt_var[n] = mpt_b_shard_op(g, MPT_OP_RANK_SLICE,
                                        mpt_b_reshape(g, wrt[i], mpt_shape_1(numel)), s);
            size_t len = strlen(g->nodes[wrt[i]].name) + 8;
            if ((names[n] = malloc(len))) snprintf(names[n], len, "%s@shard", g->nodes[wrt[i]].name);
            mpt_b_layer(g, "loss_scale");
        }
        needs_sum[n] = ranks > 1 && !shard && sparse < 0;
        wrt[n] = wrt[i];
        grads[n++] = g32;
    }
    /* the ranks' sums (sent in buckets by the backend) */
    if (ranks > 1 && !shard) mpt_train_sum_grads(g, grads, needs_sum, n);
    free(needs_sum);
    for (int i = 0; i < n && inv >= 0; i++)
        grads[i] = mpt_b_binary(g, MPT_OP_MUL, grads[i],
                                mpt_b_broadcast_to(g, inv, g->nodes[grads[i]].shape));
    finite = all_finite(g, grads, n);
    if (shard) { /* each rank checked its shards: finite when every rank says so */
        mpt_b_layer(g, "allreduce");
        int ok = mpt_b_allreduce(g, mpt_b_cast(g, finite, MPT_DT_F32));
        finite = mpt_b_binary(g, MPT_OP_GT, ok, mpt_b_scalar(g, MPT_DT_F32, ranks - 0.5));
    }

    mpt_b_layer(g, "optimizer");
    int n_ups = mpt_optim_build(g, &o->opt, opt_var, shard ? (const char *const *)names : NULL,
                                grads, n, ups, lr);
    /* gated under every policy: see the decisions above */
    mpt_b_layer(g, "loss_scale");
    for (int i = 0; i < n_ups; i++) {
        int value = gate(g, finite, ups[i].value, ups[i].var), var = ups[i].var;
        if (g->nodes[var].op == MPT_OP_RANK_SLICE) { /* a shard: every rank's, gathered */
            int k = 0;
            while (opt_var[k] != var) k++;
            mpt_shape ws = g->nodes[wrt[k]].shape;
            mpt_b_layer(g, "allreduce");
            value = mpt_b_reshape(g, mpt_b_shard_op(g, MPT_OP_ALL_GATHER, value,
                                                    mpt_shape_numel(ws)), ws);
            mpt_b_layer(g, "loss_scale");
            var = wrt[k];
        }
        mpt_graph_add_update(g, var, value);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    free(opt_var);
    for (int i = 0; i < fwd->n_updates; i++) {
        int var = map[fwd->updates[i].var], value = map[fwd->updates[i].value];
        int float_state = mpt_dtype_is_float(g->nodes[var].dtype);
        if (float_state && ranks > 1) value = mpt_train_rank_mean(g, value, ranks);
        mpt_graph_add_update(g, var, float_state ? gate(g, finite, value, var) : value);
    }
done:
    free(wrt);
    free(grads);
    free(ups);
    return finite;
}

mpt_graph *mpt_train_step(const mpt_graph *fwd, const mpt_train_opts *o, char *err,
                          size_t errlen) {
    if (check_loss_scale(&o->loss_scale, err, errlen) != 0) return NULL;
    if (o->shard_optimizer && o->ranks > 1 &&
        (o->opt.clipnorm > 0 || o->opt.global_clipnorm > 0 || o->opt.kind == MPT_OPT_ADAFACTOR)) {
        snprintf(err, errlen, "the sharded optimizer (--shard-optimizer) updates each rank's shard "
                 "of a variable alone, and %s needs the whole of it; not supported yet (hint: "
                 "clipvalue, or train without --shard-optimizer)",
                 o->opt.kind == MPT_OPT_ADAFACTOR ? "adafactor's factored moments"
                 : o->opt.clipnorm > 0 ? "clipnorm" : "global_clipnorm");
        return NULL;
    }
    if (mpt_optim_check(&o->opt, err, errlen) != 0) return NULL;
    int *map = malloc(((size_t)fwd->n_nodes + 1) * sizeof *map);
    if (!map) {
        snprintf(err, errlen, "out of memory building the train step");
        return NULL;
    }
    mpt_graph *g = copy_nodes(fwd, map);
    mpt_train_rank_draws(g, o->ranks);
    int loss, met[N_MET], output;
    if (add_loss(g, fwd, o, &loss, met, &output, err, errlen) != 0) goto fail;

    mpt_b_layer(g, "loss_scale");
    int scale = -1, good = -1, skipped = -1, scaled = loss, scale_out;
    if (o->loss_scale.mode != MPT_LS_NONE) {
        scale = mpt_b_variable_dt(g, "loss_scale/scale", MPT_DT_F32, mpt_shape_scalar(),
                                  MPT_INIT_CONST, o->loss_scale.initial);
        good = mpt_b_variable_dt(g, "loss_scale/good_steps", MPT_DT_I32, mpt_shape_scalar(),
                                 MPT_INIT_ZEROS, 0);
        skipped = mpt_b_variable_dt(g, "loss_scale/skipped", MPT_DT_I32, mpt_shape_scalar(),
                                    MPT_INIT_ZEROS, 0);
        scaled = mpt_b_binary(g, MPT_OP_MUL, loss, scale);
        scale_out = scale;
    } else {
        scale_out = mpt_b_scalar(g, MPT_DT_F32, 1);
    }

    int lr = -1;
    int finite = add_backward(g, fwd, map, o, scaled, scale, &lr, err, errlen);
    if (finite < 0) goto fail;
    if (scale >= 0) {
        mpt_b_layer(g, "loss_scale");
        update_scale(g, &o->loss_scale, finite, scale, good, skipped);
    }
    if (o->ranks > 1) { /* the global batch's loss and metric sums */
        loss = mpt_train_rank_mean(g, loss, o->ranks);
        mpt_b_layer(g, "allreduce");
        for (int i = 0; i < N_MET; i++)
            if (met[i] >= 0) met[i] = mpt_b_allreduce(g, met[i]);
    }
    mpt_b_layer(g, NULL);
    mpt_graph_add_output(g, "loss", loss);
    for (int i = 0; i < N_MET; i++)
        if (met[i] >= 0) mpt_graph_add_output(g, met_names[i], met[i]);
    mpt_graph_add_output(g, "loss_scale", scale_out);
    mpt_graph_add_output(g, "finite", finite);
    mpt_graph_add_output(g, "learning_rate", lr);
    free(map);
    return finish(g, err, errlen);
fail:
    free(map);
    mpt_graph_free(g);
    return NULL;
}

mpt_graph *mpt_grad_step(const mpt_graph *fwd, const mpt_train_opts *o, char *err,
                         size_t errlen) {
    int *map = malloc(((size_t)fwd->n_nodes + 1) * sizeof *map);
    if (!map) {
        snprintf(err, errlen, "out of memory building the gradient step");
        return NULL;
    }
    mpt_graph *g = copy_nodes(fwd, map);
    free(map);
    int loss, met[N_MET], output;
    if (add_loss(g, fwd, o, &loss, met, &output, err, errlen) != 0) goto fail;
    mpt_b_layer(g, "loss_scale");
    int scale = -1, scaled = loss;
    if (o->loss_scale.mode != MPT_LS_NONE) { /* read, as the train step reads it */
        scale = mpt_b_variable_dt(g, "loss_scale/scale", MPT_DT_F32, mpt_shape_scalar(),
                                  MPT_INIT_CONST, o->loss_scale.initial);
        scaled = mpt_b_binary(g, MPT_OP_MUL, loss, scale);
    }
    int n_vars = mpt_graph_n_variables(g), n_wrt = 0;
    int *wrt = malloc(((size_t)n_vars + 1) * sizeof *wrt);
    int *grads = malloc(((size_t)n_vars + 1) * sizeof *grads);
    if (!wrt || !grads) {
        free(wrt);
        free(grads);
        snprintf(err, errlen, "out of memory building the gradient step");
        goto fail;
    }
    for (int k = 0; k < n_vars; k++) {
        int v = mpt_graph_variable_node(g, k);
        if (g->nodes[v].attr.i[3] && mpt_dtype_is_float(g->nodes[v].dtype)) wrt[n_wrt++] = v;
    }
    mpt_b_layer(g, "backward");
    int rc = mpt_autodiff(g, scaled, -1, wrt, n_wrt, grads, err, errlen);
    mpt_b_layer(g, NULL);
    int inv = scale >= 0 ? mpt_b_unary(g, MPT_OP_RECIP, scale) : -1;
    for (int i = 0; rc == 0 && i < n_wrt; i++) {
        if (grads[i] < 0) continue;
        int g32 = mpt_b_cast(g, grads[i], MPT_DT_F32);
        if (inv >= 0) g32 = mpt_b_binary(g, MPT_OP_MUL, g32,
                                         mpt_b_broadcast_to(g, inv, g->nodes[g32].shape));
        char name[512];
        snprintf(name, sizeof name, "grad/%s", g->nodes[wrt[i]].name);
        mpt_graph_add_output(g, name, g32);
    }
    free(wrt);
    free(grads);
    if (rc != 0) goto fail;
    return finish(g, err, errlen);
fail:
    mpt_graph_free(g);
    return NULL;
}

mpt_graph *mpt_eval_step(const mpt_graph *fwd, const mpt_train_opts *o, char *err,
                         size_t errlen) {
    int *map = malloc(((size_t)fwd->n_nodes + 1) * sizeof *map);
    if (!map) {
        snprintf(err, errlen, "out of memory building the eval step");
        return NULL;
    }
    mpt_graph *g = copy_nodes(fwd, map);
    free(map);
    int loss, met[N_MET], output;
    if (add_loss(g, fwd, o, &loss, met, &output, err, errlen) != 0) {
        mpt_graph_free(g);
        return NULL;
    }
    mpt_b_layer(g, NULL);
    mpt_graph_add_output(g, "loss", loss);
    for (int i = 0; i < N_MET; i++)
        if (met[i] >= 0) mpt_graph_add_output(g, met_names[i], met[i]);
    mpt_graph_add_output(g, "output", output);
    return finish(g, err, errlen);
}
