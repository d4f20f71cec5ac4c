/* runtime/train/session.c — the compile pipeline as a flat list of named passes:
 * lower -> policy -> train_step -> fuse -> backend compile, with the verifier
 * after every pass that produced a graph. */
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen/cpu/cpu_backend.h"
#include "runtime/cuda/cuda.h"
#include "runtime/dist/dist.h"
#include "runtime/train/train.h"

const char *mpt_resolve_policy(const char *cli, const char *file) {
    if (cli && *cli) return cli;
    const char *env = getenv("MPTC_AUTO_MIXED_PRECISION");
    if (env && strcmp(env, "1") == 0) return "mixed_float16";
    if (file && *file) return file;
    return "float32";
}

/* A pass produced g: check it, and print it when --dump-after names it. */
static int after_pass(const mpt_compile_opts *o, const char *stage, const mpt_graph *g) {
    char buf[512];
    const char *e = mpt_graph_verify(g, buf, sizeof buf);
    if (e) {
        fprintf(o->diag, "mptc: internal error: the graph after '%s' is malformed: %s\n"
                         "  hint: this is a bug in mptc; run with --dump-after %s to see the graph\n",
                stage, e, stage);
        return -1;
    }
    if (o->dump_after && strcmp(o->dump_after, stage) == 0) mpt_graph_print(g, stdout);
    return 0;
}

static const char *plist_names[MPT_PLIST_COUNT] = {
    [MPT_PLIST_COMPUTE] = "compute", [MPT_PLIST_FLOAT32] = "float32", [MPT_PLIST_FOLLOW] = "follow"};

static int add_move(mpt_session *s, const char *op, mpt_plist to, FILE *diag) {
    mpt_op parsed;
    if (mpt_op_parse(op, &parsed) != 0) {
        fprintf(diag, "mptc: error: cannot move '%s' between policy lists: no such op\n"
                      "  hint: `mptc check MODEL --policy P` prints the lists and their ops\n",
                op);
        return -1;
    }
    s->move_names = realloc(s->move_names, (size_t)(s->n_moves + 1) * sizeof *s->move_names);
    s->move_lists = realloc(s->move_lists, (size_t)(s->n_moves + 1) * sizeof *s->move_lists);
    s->move_names[s->n_moves] = strdup(op);
    s->move_lists[s->n_moves] = to;
    s->n_moves++;
    return 0;
}

/* --policy-move exp=follow,matmul=float32 */
static int parse_cli_moves(mpt_session *s, const char *spec, FILE *diag) {
    char *copy = strdup(spec), *save = NULL;
    int rc = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        int list = -1;
        if (eq) {
            *eq = 0;
            for (int k = 0; k < MPT_PLIST_COUNT; k++)
                if (strcmp(eq + 1, plist_names[k]) == 0) list = k;
        }
        if (list < 0) {
            fprintf(diag, "mptc: error: --policy-move wants OP=compute|float32|follow, got '%s'\n", tok);
            rc = -1;
        } else {
            rc = add_move(s, tok, (mpt_plist)list, diag);
        }
    }
    free(copy);
    return rc;
}

/* --optimizer and --learning-rate over the train block's (docs/LANGUAGE.md:
 * the command line overrides any train setting). --optimizer alone takes
 * that optimizer's Keras defaults, as optimizer="adam" does in Keras;
 * --learning-rate makes the rate a constant, in place of any schedule. */
static int cli_optimizer(const mpt_compile_opts *o, mpt_train_config *tc) {
    char err[2048];
    if (o->optimizer && mpt_optimizer_parse(o->optimizer, tc, err, sizeof err) != 0) {
        fprintf(o->diag, "mptc: error: %s\n", err);
        return -1;
    }
    if (o->learning_rate > 0) {
        tc->optimizer.learning_rate = o->learning_rate;
        tc->optimizer.schedule = (mpt_lr_schedule){.kind = MPT_LR_CONSTANT};
    }
    return 0;
}

static int resolve_loss_scale(const mpt_compile_opts *o, mpt_session *s) {
    mpt_loss_scale_config *ls = &s->topts.loss_scale;
    if (o->loss_scale) {
        char *end;
        double v = strtod(o->loss_scale, &end);
        if (strcmp(o->loss_scale, "dynamic") == 0) ls->mode = MPT_LS_DYNAMIC;
        else if (strcmp(o->loss_scale, "none") == 0) ls->mode = MPT_LS_NONE;
        else if (*end == 0 && v > 0) ls->mode = MPT_LS_FIXED, ls->initial = v;
        else {
            fprintf(o->diag, "mptc: error: --loss-scale wants dynamic, none or a positive number, got '%s'\n",
                    o->loss_scale);
            return -1;
        }
    }
    if (o->loss_scale_period > 0) ls->period = o->loss_scale_period;
    if (ls->mode == MPT_LS_DEFAULT)
        ls->mode = s->policy.compute == MPT_DT_F16 ? MPT_LS_DYNAMIC : MPT_LS_NONE;
    return 0;
}

static mpt_graph *apply_policy(const mpt_compile_opts *o, mpt_session *s, const mpt_model *m,
                               const char ***names, const char ***pols) {
    *names = calloc((size_t)m->n_layers + 1, sizeof **names);
    *pols = calloc((size_t)m->n_layers + 1, sizeof **pols);
    int n = 0;
    for (int i = 0; i < m->n_layers; i++)
        if (m->layers[i].dtype) {
            (*names)[n] = m->layers[i].name;
            (*pols)[n] = m->layers[i].dtype;
            n++;
        }
    mpt_policy_opts po = {.global = s->policy, .n_layers = n, .layer_names = *names,
                          .layer_policies = *pols, .moves = (const char *const *)s->move_names,
                          .move_to = s->move_lists, .n_moves = s->n_moves};
    s->popts = po;
    char err[512];
    mpt_graph *typed = mpt_policy_apply(m->graph, &po, err, sizeof err);
    if (!typed) fprintf(o->diag, "%s: error: %s\n", o->path, err);
    return typed;
}

/* Attention's core as one op (ir/attention.c) before autodiff, so that
 * fusion runs it as one kernel per direction; --no-xla and
 * --fusion-disable=attention keep the unfused ops for comparison. The
 * notes of the train step's forward graph are kept for `mptc ir
 * --explain`. */
static int fuse_attention(const mpt_compile_opts *o, mpt_session *s, mpt_graph **fwd, int keep) {
    const char *refuse = o->fusion_disable & MPT_FUSE_ATTENTION ? "disabled by --fusion-disable=attention"
                                                                : NULL;
    mpt_attention_note *notes;
    int n;
    int layout = !(mpt_session_fusion_disable(o, s->backend ? s->backend->name : o->device) &
                   MPT_FUSE_ATTENTION_LAYOUT);
    mpt_graph *r = mpt_attention_rewrite(*fwd, refuse, layout, &notes, &n);
    if (keep) {
        free(s->attn_notes);
        s->attn_notes = notes;
        s->n_attn_notes = n;
    } else {
        free(notes);
    }
    if (!r) return 0;
    mpt_graph_free(*fwd);
    *fwd = r;
    return after_pass(o, "attention", r);
}

unsigned mpt_session_fusion_disable(const mpt_compile_opts *o, const char *backend) {
    unsigned bits = o->fusion_disable;
    if (backend && strcmp(backend, "cuda") == 0) {
        /* matmuls go to cuBLASLt with the epilogues it has, as XLA sends
         * them to cuBLAS: its kernels outrun the generated Tensor Core tile
         * by far more than one pass of elementwise work over the output
         * costs; without cuBLASLt every GEMM is generated, fully fused */
        if (mpt_cuda_cublaslt(NULL, 0)) bits |= MPT_FUSE_GEMM_EXTRA;
        /* a reduction kernel must not read its own results over many
         * rows: it would run as one block per 32 columns (fusion/split.c) */
        bits |= MPT_FUSE_REDUCTION_CHAIN;
    } else {
        /* the CPU kernels read a head's rows H D floats apart more slowly
         * than the transposes that put them side by side cost (GPT at
         * context 512: 2.5% slower a step on 2 threads) */
        bits |= MPT_FUSE_ATTENTION_LAYOUT;
    }
    return bits;
}

/* The model's inputs are g's first INPUTs, in order, so a batch of every
 * input is a run of the step's input tensors from "x" on. */
static int inputs_first(const mpt_graph *g, const mpt_model *m) {
    if (!g) return 1;
    for (int k = 0; k < m->n_inputs; k++)
        if (k >= mpt_graph_n_inputs(g) ||
            strcmp(g->nodes[mpt_graph_input_node(g, k)].name, m->inputs[k].graph_name) != 0)
            return 0;
    return 1;
}

/* Data-parallel CUDA ranks sum through NCCL: each rank on a GPU of its
 * own (its local rank's), the communicator made from rank 0's id, which
 * MPI carries to the others. Once a process: a later session finds it
 * joined (the executor checks that its ranks are the plan's). */
static int join_nccl(int ranks, FILE *diag) {
    if (mpt_cuda_nccl_joined(NULL, NULL)) return 0;
    if (mpt_dist_size() != ranks) {
        fprintf(diag, "mptc: error: %d data-parallel CUDA ranks, but this process is one of %d\n"
                "  hint: mpirun -np %d mptc train ... starts the ranks\n", ranks,
                mpt_dist_size(), ranks);
        return -1;
    }
    char err[1024];
    if (mpt_cuda_nccl_join(mpt_dist_rank(), ranks, mpt_dist_local_rank(), mpt_dist_bcast, err,
                           sizeof err)) {
        fprintf(diag, "mptc: error: rank %d: %s\n", mpt_dist_rank(), err);
        return -1;
    }
    return 0;
}

int mpt_session_open(const mpt_compile_opts *o, mpt_session **out) {
    *out = NULL;
    mpt_session *s = calloc(1, sizeof *s);
    double t0 = mpt_now();
    char err[8192]; /* room for an NVRTC log */
    int rc = -1;
    const char **names = NULL, **pols = NULL, **enames = NULL, **epols = NULL;
    mpt_graph *etyped = NULL;

    /* The batch size lives in the file's train block, and shapes depend on
     * it, so read the file once to learn it unless the command line says. */
    int ranks = o->ranks > 1 ? o->ranks : 1;
    mpt_lower_opts lo = {.batch_size = o->batch_size > 0 ? o->batch_size / ranks : 1,
                         .training = 1};
    if (lo.batch_size < 1) lo.batch_size = 1;
    if (mpt_lang_load(o->path, &lo, &s->model, o->diag) != 0) goto done;
    long batch = o->batch_size > 0 ? o->batch_size : s->model->train.batch_size;
    if (batch <= 0) batch = 32;
    s->ranks = ranks;
    s->global_batch = batch;
    if (batch % ranks != 0) { /* as Horovod's users multiply, --batch-size is global */
        long lo_b = batch / ranks * ranks, hi_b = lo_b + ranks;
        char alt[64] = "";
        if (lo_b > 0) snprintf(alt, sizeof alt, "%ld or ", lo_b);
        fprintf(o->diag, "mptc: error: the batch of %ld does not split over %d ranks\n"
                "  hint: the batch size is the global batch, shared equally by the ranks: "
                "--batch-size %s%ld\n", batch, ranks, alt, hi_b);
        goto done;
    }
    batch /= ranks;
    if (batch != lo.batch_size) {
        mpt_model_free(s->model);
        s->model = NULL;
        lo.batch_size = batch;
        if (mpt_lang_load(o->path, &lo, &s->model, o->diag) != 0) goto done;
    }
    s->batch_size = batch;
    if (after_pass(o, "lower", s->model->graph)) goto done;

    if (cli_optimizer(o, &s->model->train)) goto done;
    const mpt_train_config *tc = &s->model->train;
    const char *pname = mpt_resolve_policy(o->policy, tc->policy);
    if (mpt_policy_lookup(pname, &s->policy) != 0) {
        fprintf(o->diag, "mptc: error: unknown policy '%s'\n"
                         "  hint: use float32, mixed_float16 or mixed_bfloat16\n", pname);
        goto done;
    }
    if (s->policy.variable != MPT_DT_F32) { /* Keras' float16 / bfloat16 */
        fprintf(o->diag, "mptc: error: policy %s means %s variables, as in Keras, which mptc "
                "does not train\n  hint: --policy mixed_%s computes in %s and keeps float32 "
                "variables\n", pname, pname, pname, pname);
        goto done;
    }
    for (int i = 0; i < tc->n_compute_ops; i++)
        if (add_move(s, tc->compute_ops[i], MPT_PLIST_COMPUTE, o->diag)) goto done;
    for (int i = 0; i < tc->n_float32_ops; i++)
        if (add_move(s, tc->float32_ops[i], MPT_PLIST_FLOAT32, o->diag)) goto done;
    for (int i = 0; i < tc->n_follow_ops; i++)
        if (add_move(s, tc->follow_ops[i], MPT_PLIST_FOLLOW, o->diag)) goto done;
    if (o->moves && parse_cli_moves(s, o->moves, o->diag)) goto done;

    s->typed = apply_policy(o, s, s->model, &names, &pols);
    if (!s->typed || after_pass(o, "policy", s->typed)) goto done;
    if (!o->plan_only) {
        s->backend = mpt_backend_find(o->device ? o->device : "auto", err, sizeof err);
        if (!s->backend) {
            fprintf(o->diag, "mptc: error: %s\n", err);
            goto done;
        }
        if (ranks > 1 && strcmp(s->backend->name, "cuda") == 0 && join_nccl(ranks, o->diag))
            goto done;
    }
    if (o->xla && fuse_attention(o, s, &s->typed, 1)) goto done;

    s->topts = (mpt_train_opts){.loss = tc->loss, .opt = tc->optimizer,
                                .loss_scale = tc->loss_scale, .metrics = tc->metrics,
                                .ranks = ranks, .shard_optimizer = o->shard_optimizer};
    if (resolve_loss_scale(o, s)) goto done;
    s->train = mpt_train_step(s->typed, &s->topts, err, sizeof err);
    if (!s->train) {
        fprintf(o->diag, "%s: error: cannot build the train step: %s\n", o->path, err);
        goto done;
    }
    if (after_pass(o, "train_step", s->train)) goto done;

    if (o->want_eval) {
        mpt_lower_opts le = {.batch_size = batch, .training = 0};
        if (mpt_lang_load(o->path, &le, &s->model_eval, o->diag) != 0) goto done;
        etyped = apply_policy(o, s, s->model_eval, &enames, &epols);
        if (!etyped || after_pass(o, "policy", etyped)) goto done;
        if (o->xla && fuse_attention(o, s, &etyped, 0)) goto done;
        s->eval = mpt_eval_step(etyped, &s->topts, err, sizeof err);
        if (!s->eval) {
            fprintf(o->diag, "%s: error: cannot build the evaluation step: %s\n", o->path, err);
            goto done;
        }
        if (after_pass(o, "eval_step", s->eval)) goto done;
    }

    assert(inputs_first(s->train, s->model) && inputs_first(s->eval, s->model) &&
           "a step's first INPUTs are the model's");

    if (o->want_grads) {
        s->grads = mpt_grad_step(s->typed, &s->topts, err, sizeof err);
        if (!s->grads) {
            fprintf(o->diag, "%s: error: cannot build the gradient step: %s\n", o->path, err);
            goto done;
        }
    }

    mpt_fusion_opts fo;
    mpt_fusion_opts_default(&fo);
    fo.enabled = o->xla;
    fo.disable = mpt_session_fusion_disable(o, s->backend ? s->backend->name : o->device);
    s->train_plan = mpt_fuse(s->train, &fo);
    if (s->eval) s->eval_plan = mpt_fuse(s->eval, &fo);
    if (s->grads) s->grads_plan = mpt_fuse(s->grads, &fo);
    const char *dev = s->backend ? s->backend->name : o->device;
    if (o->tf32 && dev && strcmp(dev, "cuda") != 0 && strcmp(dev, "auto") != 0)
        fprintf(o->diag ? o->diag : stderr, "note: --tf32 applies to CUDA's GEMMs and convolutions; the "
                "%s backend computes float32 in fp32\n", dev);
    if (s->train_plan) s->train_plan->tf32 = o->tf32;
    if (s->eval_plan) s->eval_plan->tf32 = o->tf32;
    if (o->dump_after && strcmp(o->dump_after, "fusion") == 0) mpt_plan_print(s->train_plan, stdout, 1);

    if (o->plan_only) {
        s->compile_seconds = mpt_now() - t0;
        rc = 0;
        goto done;
    }

    /* say what fits before trying, rather than failing half way: host
     * backends allocate the step in this machine's memory, CUDA the train
     * and evaluation steps (the evaluation step reading the train step's
     * variables, each with a cuBLASLt workspace) in the GPU's */
    int cuda = strcmp(s->backend->name, "cuda") == 0;
    int64_t need = mpt_session_step_bytes(s), have = cuda ? mpt_cuda_free_bytes() : mpt_host_available_bytes();
    int64_t extra = 0;
    if (cuda && s->eval_plan) {
        mpt_memory_breakdown m;
        mpt_plan_memory(s->eval_plan, &m);
        extra = m.total - (s->eval->n_updates ? 0 : m.weights + m.optimizer_state);
    }
    if (cuda) extra += 2 * ((int64_t)32 << 20);
    if (have > 0 && need + extra > have) {
        char a[32], b[32];
        /* the evaluation step grows with the batch as the train step does:
         * the train step's share of what is free is the limit it gets */
        int64_t ws = cuda ? 2 * ((int64_t)32 << 20) : 0, room = have - ws;
        long fits = room <= 0 ? 0 : mpt_largest_batch(o, (int64_t)((double)room * (double)need /
                                                                   (double)(need + extra - ws)));
        fprintf(o->diag, "mptc: error: out of memory: the train step needs %s at batch %ld, %s %s %s\n",
                mpt_fmt_bytes(need + extra, a, sizeof a), batch, cuda ? "the GPU has" : "this machine has",
                mpt_fmt_bytes(have, b, sizeof b), cuda ? "free" : "available");
        if (fits > 0) fprintf(o->diag, "  hint: --batch-size %ld fits (`mptc check MODEL --memory SIZE` shows the estimate)\n", fits);
        else fprintf(o->diag, "  hint: the model does not fit even at batch 1; try --policy mixed_bfloat16 or a smaller model\n");
        goto done;
    }
    s->backend->threads = (int)o->threads;
    s->backend->bucket_bytes = o->bucket_mb < 0 ? -1 : (int64_t)(o->bucket_mb * 1048576.0);
    int hits0, misses0;
    mpt_cpu_kcache_stats(&hits0, &misses0);
    s->train_exec = s->backend->compile(s->train_plan, err, sizeof err);
    if (!s->train_exec) {
        fprintf(o->diag, "mptc: error: compiling the train step for %s: %s\n", s->backend->name, err);
        goto done;
    }
    if (s->eval_plan) {
        s->eval_exec = s->backend->compile(s->eval_plan, err, sizeof err);
        if (!s->eval_exec) {
            fprintf(o->diag, "mptc: error: compiling the evaluation step for %s: %s\n",
                    s->backend->name, err);
            goto done;
        }
    }

    if (s->grads_plan) {
        s->grads_exec = s->backend->compile(s->grads_plan, err, sizeof err);
        if (!s->grads_exec) {
            fprintf(o->diag, "mptc: error: compiling the gradient step for %s: %s\n",
                    s->backend->name, err);
            goto done;
        }
    }
    mpt_cpu_kcache_stats(&s->cache_hits, &s->cache_misses);
    s->cache_hits -= hits0;
    s->cache_misses -= misses0;

    s->n_vars = mpt_graph_n_variables(s->train);
    s->vars = calloc((size_t)s->n_vars + 1, sizeof *s->vars);
    for (int k = 0; k < s->n_vars; k++) {
        const mpt_node *n = &s->train->nodes[mpt_graph_variable_node(s->train, k)];
        if (mpt_tensor_alloc(&s->vars[k], n->dtype, n->shape) != 0) {
            char b[32];
            fprintf(o->diag, "mptc: error: out of memory allocating %s (%s)\n"
                             "  hint: try a smaller --batch-size or model\n",
                    n->name, mpt_fmt_bytes((int64_t)mpt_shape_numel(n->shape) *
                                               (int64_t)mpt_dtype_size(n->dtype), b, sizeof b));
            goto done;
        }
    }
    if (s->eval) {
        int ne = mpt_graph_n_variables(s->eval);
        s->eval_var = calloc((size_t)ne + 1, sizeof *s->eval_var);
        for (int k = 0; k < ne; k++) {
            const char *nm = s->eval->nodes[mpt_graph_variable_node(s->eval, k)].name;
            s->eval_var[k] = mpt_session_var(s, nm);
            if (s->eval_var[k] < 0) {
                fprintf(o->diag, "mptc: internal error: evaluation variable %s is not trained\n", nm);
                goto done;
            }
        }
        /* one copy of the variables on the device, the train step's */
        if (s->eval_exec && s->backend->share_vars &&
            s->backend->share_vars(s->eval_exec, s->train_exec, s->eval_var, err, sizeof err) < 0) {
            fprintf(o->diag, "mptc: error: the evaluation step: %s\n", err);
            goto done;
        }
    }
    if (s->grads) {
        int ng = mpt_graph_n_variables(s->grads);
        s->grads_var = calloc((size_t)ng + 1, sizeof *s->grads_var);
        for (int k = 0; k < ng; k++) {
            const char *nm = s->grads->nodes[mpt_graph_variable_node(s->grads, k)].name;
            if ((s->grads_var[k] = mpt_session_var(s, nm)) < 0) {
                fprintf(o->diag, "mptc: internal error: gradient-step variable %s is not trained\n", nm);
                goto done;
            }
        }
        if (s->grads_exec && s->backend->share_vars &&
            s->backend->share_vars(s->grads_exec, s->train_exec, s->grads_var, err, sizeof err) < 0) {
            fprintf(o->diag, "mptc: error: the gradient step: %s\n", err);
            goto done;
        }
    }
    s->compile_seconds = mpt_now() - t0;
    rc = 0;
done:
    free(names);
    free(pols);
    free(enames);
    free(epols);
    mpt_graph_free(etyped);
    if (rc) mpt_session_free(s);
    else *out = s;
    return rc;
}

int64_t mpt_session_step_bytes(const mpt_session *s) {
    mpt_memory_breakdown m;
    mpt_plan_memory(s->train_plan, &m);
    return m.total;
}

int64_t mpt_host_available_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    long long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb < 0 ? -1 : (int64_t)kb * 1024;
}

static int64_t bytes_at(mpt_compile_opts o, long batch) {
    o.batch_size = batch;
    o.plan_only = 1;
    o.dump_after = NULL;
    FILE *devnull = fopen("/dev/null", "w");
    o.diag = devnull ? devnull : o.diag;
    mpt_session *s;
    int rc = mpt_session_open(&o, &s);
    if (devnull) fclose(devnull);
    if (rc) return -1;
    int64_t b = mpt_session_step_bytes(s);
    mpt_session_free(s);
    return b;
}

/* memory grows with the batch: double, then bisect */
long mpt_largest_batch(const mpt_compile_opts *o, int64_t limit) {
    long lo = 0, hi = 1;
    int64_t b;
    while ((b = bytes_at(*o, hi)) >= 0 && b <= limit && hi < (1L << 24)) lo = hi, hi *= 2;
    if (b < 0 && lo == 0) return -1;
    while (hi - lo > 1) {
        long mid = lo + (hi - lo) / 2;
        b = bytes_at(*o, mid);
        if (b >= 0 && b <= limit) lo = mid;
        else hi = mid;
    }
    return lo;
}

static int data_inputs(const mpt_session *s, mpt_data_input *in) {
    const mpt_model *m = s->model;
    for (int k = 0; k < m->n_inputs; k++)
        in[k] = (mpt_data_input){.name = m->inputs[k].name, .shape = m->inputs[k].shape,
                                 .dtype = m->inputs[k].dtype, .vocab = m->inputs[k].vocab,
                                 .mask_only = m->inputs[k].mask_only};
    return m->n_inputs;
}

int mpt_session_open_data(const mpt_session *s, const char *spec, mpt_data_part part,
                          mpt_dataset **out, char *err, size_t n) {
    mpt_data_input in[MPT_MAX_MODEL_INPUTS];
    return mpt_data_open_inputs(spec, part, in, data_inputs(s, in), out, err, n);
}

int mpt_session_open_data_spec(const mpt_session *s, const mpt_data_spec *spec,
                               mpt_data_part part, mpt_dataset **out, char *err, size_t n) {
    mpt_data_input in[MPT_MAX_MODEL_INPUTS];
    return mpt_data_open_spec_inputs(spec, part, in, data_inputs(s, in), out, err, n);
}

int mpt_session_var(const mpt_session *s, const char *name) {
    for (int k = 0; k < s->n_vars; k++)
        if (strcmp(s->train->nodes[mpt_graph_variable_node(s->train, k)].name, name) == 0) return k;
    return -1;
}

int mpt_session_pull_vars(const mpt_session *s, char *err, size_t n) {
    const mpt_backend *b = s->backend;
    if (!b || !b->pull_vars || !s->train_exec) return 0;
    int copied = b->pull_vars(s->train_exec, s->vars, err, n);
    if (copied > 0 && s->eval_exec) b->push_vars(s->eval_exec);
    return copied < 0 ? -1 : 0;
}

int mpt_session_init_state(mpt_session *s, uint64_t seed) {
    return mpt_init_variables(s->train, s->vars, seed);
}

void mpt_session_free(mpt_session *s) {
    if (!s) return;
    if (s->backend) {
        /* the train step's profile table first; freeing it first is safe:
         * an evaluation step sharing its variables is not run again */
        if (s->train_exec) s->backend->free(s->train_exec);
        if (s->eval_exec) s->backend->free(s->eval_exec);
        if (s->grads_exec) s->backend->free(s->grads_exec);
    }
    mpt_plan_free(s->train_plan);
    mpt_plan_free(s->eval_plan);
    mpt_plan_free(s->grads_plan);
    free(s->grads_var);
    mpt_graph_free(s->grads);
    for (int k = 0; k < s->n_vars; k++) mpt_tensor_free(&s->vars[k]);
    free(s->vars);
    free(s->eval_var);
    mpt_graph_free(s->train);
    mpt_graph_free(s->eval);
    mpt_graph_free(s->typed);
    free(s->attn_notes);
    mpt_model_free(s->model);
    mpt_model_free(s->model_eval);
    for (int i = 0; i < s->n_moves; i++) free(s->move_names[i]);
    free(s->move_names);
    free(s->move_lists);
    free(s);
}
