/* tests/test_attention_fused.c — fused attention (ir/attention.c,
 * ir/interp_attn.c, codegen/cpu/attention.c):
 *
 *   (a) the rewrite: causal, padding and [T, S] masks, cross attention,
 *       dropout become one attention op each; a backend without the
 *       kernel keeps them unfused with its reason;
 *   (b) the ops' definition against the unfused graph on the
 *       interpreter, in f64: forward values and every weight's gradient
 *       (autodiff's attention_grad against autodiff through the primitive
 *       ops), and gradients against central differences;
 *   (c) the plan: one attention kernel forward and one attention_grad
 *       kernel backward per layer, no batch_matmul, and an activation
 *       peak that grows linearly with the context where the unfused
 *       one grows quadratically;
 *   (d) the CPU kernels against the interpreter: two train steps of
 *       rewritten models under float32, mixed_bfloat16 and
 *       mixed_float16, with lengths that are not multiples of the
 *       kernels' blocks and padding masks that leave rows fully masked
 *       (every value finite);
 *   (e) fused against unfused on the CPU: the same two train steps of
 *       the rewritten and the original graph, within the tolerances
 *       below and why; (d) and (e) again for head sizes 16, 32 and 64
 *       over 70 keys (wide_cases);
 *   (f) the synthetic data `mptc bench` feeds a sequence model: a class
 *       id at every position (synthetic(..., ids=[T]));
 * Each kernel's own outputs, on the CPU and on the CUDA emulator, are
 * checked in test_attention_kernels.c.
 * (a), (b) and (d) run with q, k and v read in the projections' [B, T, H,
 * E] (the rewrite's layout, the op's bthd) and after their transposes.
 */
#include "attention_cases.h"
#include "runtime/data/data.h"

/* ---- (a) the rewrite ---- */

static void test_rewrite(void) {
    for (int c = 0; c < 2 * N_CASES; c++) {
        layout = c % 2;
        mpt_model *m = load_src(cases[c / 2].name, cases[c / 2].src, 1);
        if (!m) continue;
        mpt_graph *typed = typed_of(m, "mixed_bfloat16");
        mpt_attention_note note = {0};
        mpt_graph *r = typed ? rewrite(typed, NULL, &note) : NULL;
        CHECK_MSG(r && !note.reason, "%s: not rewritten: %s", cases[c / 2].name, note.reason ? note.reason : "");
        if (r) {
            CHECK(count_op(r, MPT_OP_ATTENTION) == 1 && count_op(r, MPT_OP_BATCH_MATMUL) == 0);
            /* the softmax went with it (the model's own softmax stays) */
            CHECK(count_op(r, MPT_OP_EXP) == count_op(typed, MPT_OP_EXP) - 1 &&
                  count_op(r, MPT_OP_REDUCE_MAX) == count_op(typed, MPT_OP_REDUCE_MAX) - 1);
            CHECK_MSG(count_op(r, MPT_OP_TRANSPOSE) == (layout ? 0 : count_op(typed, MPT_OP_TRANSPOSE)),
                      "%s: layout %d: %d transposes of %d", cases[c / 2].name, layout,
                      count_op(r, MPT_OP_TRANSPOSE), count_op(typed, MPT_OP_TRANSPOSE));
            for (int i = 0; i < r->n_nodes; i++) {
                const mpt_node *a = &r->nodes[i];
                if (a->op != MPT_OP_ATTENTION) continue;
                const mpt_node *mk = &r->nodes[a->in[3]];
                CHECK_MSG(a->attr.i[0] == cases[c / 2].causal, "%s: causal %lld", cases[c / 2].name,
                          (long long)a->attr.i[0]);
                CHECK_MSG(cases[c / 2].mask_rank ? mk->op != MPT_OP_CONST && mk->shape.rank == cases[c / 2].mask_rank
                                             : mk->op == MPT_OP_CONST,
                          "%s: the mask is %s of rank %d", cases[c / 2].name, mpt_op_name(mk->op), mk->shape.rank);
                CHECK(a->attr.i[1] == (cases[c / 2].mask_rank != 0)); /* Keras zeroes masked probabilities */
                CHECK(a->dtype == MPT_DT_F32 && r->nodes[a->in[0]].dtype == MPT_DT_BF16);
                /* with the layout, the op reads the projections' [B, T, H, E]
                 * and no transpose is left before or after it */
                CHECK_MSG(a->attr.i[6] == layout && a->shape.dim[layout ? 2 : 1] == 2,
                          "%s: layout %d: bthd %lld, o [%lld, %lld, %lld, %lld]", cases[c / 2].name, layout,
                          (long long)a->attr.i[6], (long long)a->shape.dim[0], (long long)a->shape.dim[1],
                          (long long)a->shape.dim[2], (long long)a->shape.dim[3]);
            }
        }
        /* a backend without the kernel: the same match, refused, nothing rewritten */
        mpt_attention_note no = {0};
        mpt_graph *none = typed ? rewrite(typed, "no kernel here", &no) : NULL;
        CHECK(none == NULL && no.reason && strcmp(no.reason, "no kernel here") == 0);
        mpt_graph_free(r);
        mpt_graph_free(typed);
        mpt_model_free(m);
    }
    /* dropout goes into the op: rate 0.1 drops where random_uniform's 24
     * bits are below ceil(0.1f 2^24), kept values times 1 / 0.9 in f32;
     * without training the same layer has none */
    static const char *drop = "model m {\n    input x: [6, 8]\n"
                              "    multi_head_attention a(num_heads=2, key_dim=4, dropout=0.1, use_causal_mask=true)\n"
                              "    global_avg_pool1d g\n" HEAD;
    for (int training = 1; training >= 0; training--) {
        mpt_model *m = load_src("dropout", drop, training);
        mpt_graph *typed = m ? typed_of(m, "float32") : NULL;
        mpt_attention_note note = {0};
        mpt_graph *r = typed ? rewrite(typed, NULL, &note) : NULL;
        CHECK_MSG(r && !note.reason, "dropout: %s", note.reason ? note.reason : "");
        CHECK(r && count_op(r, MPT_OP_RANDOM_UNIFORM) == 0);
        for (int i = 0; r && i < r->n_nodes; i++) {
            const mpt_node *a = &r->nodes[i];
            if (a->op != MPT_OP_ATTENTION) continue;
            float scale = 1.0f / 0.9f;
            uint32_t bits;
            memcpy(&bits, &scale, 4);
            CHECK_MSG(a->attr.i[4] == (training ? (int64_t)ceil((double)0.1f * 16777216.0) : 0) &&
                          (!training || a->attr.i[5] == (int64_t)bits),
                      "dropout attrs: below %lld, scale bits %llx", (long long)a->attr.i[4],
                      (long long)a->attr.i[5]);
            CHECK(r->nodes[a->in[4]].op == (training ? MPT_OP_VARIABLE : MPT_OP_CONST));
        }
        mpt_graph_free(r);
        mpt_graph_free(typed);
        mpt_model_free(m);
    }
}

/* ---- (b) the definition against the primitive ops, in f64 ---- */

static mpt_graph *as_f64(const mpt_graph *src) {
    mpt_graph *g = mpt_graph_new(src->name);
    int *map = calloc((size_t)src->n_nodes + 1, sizeof *map);
    for (int i = 0; i < src->n_nodes; i++) {
        map[i] = mpt_graph_copy_node(g, src, i, map);
        if (g->nodes[map[i]].dtype == MPT_DT_F32) g->nodes[map[i]].dtype = MPT_DT_F64;
    }
    for (int k = 0; k < src->n_outputs; k++)
        mpt_graph_add_output(g, src->outputs[k].name, map[src->outputs[k].node]);
    free(map);
    return g;
}

/* g with y = sum(output * w) and outputs y, then d y / d every variable */
static mpt_graph *with_grads(const mpt_graph *fwd, int *n_grads) {
    mpt_graph *g = mpt_graph_new(fwd->name);
    int *map = calloc((size_t)fwd->n_nodes + 1, sizeof *map);
    for (int i = 0; i < fwd->n_nodes; i++) map[i] = mpt_graph_copy_node(g, fwd, i, map);
    int out = map[fwd->outputs[mpt_graph_find_output(fwd, "output")].node];
    free(map);
    mpt_shape os = g->nodes[out].shape;
    int w = mpt_b_input(g, "fd_weights", MPT_DT_F64, os);
    int y = mpt_b_reduce(g, MPT_OP_REDUCE_SUM, mpt_b_binary(g, MPT_OP_MUL, out, w), (1LL << os.rank) - 1);
    int nv = mpt_graph_n_variables(g);
    int *wrt = calloc((size_t)nv + 1, sizeof *wrt), *grads = calloc((size_t)nv + 1, sizeof *grads);
    for (int k = 0; k < nv; k++) wrt[k] = mpt_graph_variable_node(g, k);
    char err[512];
    int rc = mpt_autodiff(g, y, -1, wrt, nv, grads, err, sizeof err);
    CHECK_MSG(rc == 0, "autodiff: %s", err);
    mpt_graph_add_output(g, "y", y);
    *n_grads = 0;
    for (int k = 0; rc == 0 && k < nv; k++) {
        if (!mpt_dtype_is_float(g->nodes[wrt[k]].dtype)) continue; /* dropout's step counter */
        CHECK_MSG(grads[k] >= 0, "no gradient for %s", g->nodes[wrt[k]].name);
        if (grads[k] >= 0) mpt_graph_add_output(g, g->nodes[wrt[k]].name, grads[k]), (*n_grads)++;
    }
    free(wrt);
    free(grads);
    return g;
}

static void fill(const mpt_graph *g, mpt_tensor *in, mpt_tensor *vars) {
    for (int k = 0; k < mpt_graph_n_inputs(g); k++) {
        const mpt_node *nd = &g->nodes[mpt_graph_input_node(g, k)];
        mpt_tensor_alloc(&in[k], nd->dtype, nd->shape);
        for (int64_t i = 0; i < mpt_shape_numel(nd->shape); i++)
            mpt_tensor_set(&in[k], i, strcmp(nd->name, "fd_weights") == 0 ? 0.5 + urand() : 2 * urand() - 1);
    }
    plant_masks(g, in);
    mpt_init_variables(g, vars, 7);
    for (int k = 0; k < mpt_graph_n_variables(g); k++) /* biases off zero */
        for (int64_t i = 0; i < mpt_shape_numel(vars[k].shape); i++)
            mpt_tensor_set(&vars[k], i, mpt_tensor_get(&vars[k], i) + 0.3 * (urand() - 0.5));
}

static double y_of(const mpt_graph *g, const mpt_tensor *in, mpt_tensor *vars) {
    mpt_tensor out[64];
    char err[256];
    if (mpt_interp_run(g, in, vars, out, NULL, err, sizeof err) != 0) return NAN;
    double y = mpt_tensor_get(&out[mpt_graph_find_output(g, "y")], 0);
    for (int k = 0; k < g->n_outputs; k++) mpt_tensor_free(&out[k]);
    return y;
}

static void check_definition(const model_case *c) {
    mpt_model *m = load_src(c->name, c->src, 1);
    if (!m) return;
    mpt_graph *f64 = as_f64(m->graph);
    mpt_attention_note note = {0};
    mpt_graph *fused = rewrite(f64, NULL, &note);
    CHECK_MSG(fused != NULL, "%s in f64: %s", c->name, note.reason ? note.reason : "not rewritten");
    int na = 0, nb = 0;
    mpt_graph *ga = fused ? with_grads(fused, &na) : NULL, *gb = with_grads(f64, &nb);
    if (ga && count_op(ga, MPT_OP_ATTENTION_GRAD) != 3)
        CHECK_MSG(0, "%s: %d attention_grad ops, want 3", c->name, count_op(ga, MPT_OP_ATTENTION_GRAD));
    int ni = mpt_graph_n_inputs(gb), nv = mpt_graph_n_variables(gb);
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in), *vars = calloc((size_t)nv + 1, sizeof *vars);
    mpt_tensor oa[64], ob[64];
    char err[256];
    fill(gb, in, vars);
    if (ga && na == nb && mpt_interp_run(ga, in, vars, oa, NULL, err, sizeof err) == 0) {
        if (mpt_interp_run(gb, in, vars, ob, NULL, err, sizeof err) == 0) {
            /* the same mathematics in f64: only the order of the sums
             * differs (and exp(s - lse) against exp(s - max) / sum) */
            for (int k = 0; k < ga->n_outputs; k++) {
                char what[160];
                snprintf(what, sizeof what, "%s f64 attention op against the primitive ops, %s", c->name,
                         ga->outputs[k].name);
                compare(&oa[k], &ob[k], (tol){1e-12, 1e-9}, what);
            }
            for (int k = 0; k < gb->n_outputs; k++) mpt_tensor_free(&ob[k]);
        }
        /* central differences of y through the attention ops */
        int before = check_failures, checked = 0;
        for (int k = 0; k < nv; k++) {
            int gk = mpt_graph_find_output(ga, ga->nodes[mpt_graph_variable_node(ga, k)].name);
            if (gk < 0) continue; /* not a float variable */
            const mpt_tensor *ad = &oa[gk];
            int64_t n = mpt_shape_numel(vars[k].shape), stride = n > 12 ? n / 12 : 1;
            for (int64_t i = 0; i < n; i += stride) {
                double x0 = mpt_tensor_get(&vars[k], i), step = 1e-6 * (fabs(x0) > 1 ? fabs(x0) : 1);
                mpt_tensor_set(&vars[k], i, x0 + step);
                double yp = y_of(ga, in, vars);
                mpt_tensor_set(&vars[k], i, x0 - step);
                double ym = y_of(ga, in, vars);
                mpt_tensor_set(&vars[k], i, x0);
                double fd = (yp - ym) / (2 * step), got = mpt_tensor_get(ad, i);
                /* the bound test_inputs' gradients use: O(step^2) truncation and the
                 * cancellation of two sums near 1 */
                CHECK_MSG(fabs(fd - got) <= 1e-6 + 1e-5 * fabs(fd), "%s: d y / d %s[%lld]: %.12g, fd %.12g",
                          c->name, ga->nodes[mpt_graph_variable_node(ga, k)].name, (long long)i, got, fd);
                checked++;
                if (check_failures - before > 8) break;
            }
        }
        CHECK(checked > 40);
        for (int k = 0; k < ga->n_outputs; k++) mpt_tensor_free(&oa[k]);
    } else {
        CHECK_MSG(0, "%s: the interpreter failed on the fused gradient graph: %s", c->name, err);
    }
    for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    for (int k = 0; k < nv; k++) mpt_tensor_free(&vars[k]);
    free(in);
    free(vars);
    mpt_graph_free(ga);
    mpt_graph_free(gb);
    mpt_graph_free(fused);
    mpt_graph_free(f64);
    mpt_model_free(m);
}

/* ---- (c) the plan ---- */


static int count_kernels(const mpt_plan *p, mpt_op root) {
    int n = 0;
    for (int k = 0; k < p->n_kernels; k++)
        n += p->kernels[k].kind == MPT_KERNEL_OPAQUE && p->g->nodes[p->kernels[k].root].op == root;
    return n;
}

/* the activation peak of gpt-like causal attention at context t, fused
 * (the rewrite) or not */
static int64_t peak_at(int64_t t, int fused) {
    char src[512];
    snprintf(src, sizeof src,
             "model m {\n    input x: [%lld]\n    embedding e(input_dim=16, output_dim=16)\n"
             "    multi_head_attention a(num_heads=4, key_dim=4, use_causal_mask=true)\n"
             "    global_avg_pool1d g\n    dense out(units=16)\n    activation p(softmax, dtype=float32)\n}\n" TRAIN,
             (long long)t);
    mpt_model *m = load_src("peak", src, 1);
    if (!m) return -1;
    mpt_graph *typed = typed_of(m, "float32"), *r = NULL;
    if (fused && typed) {
        mpt_attention_note note;
        r = rewrite(typed, NULL, &note);
    }
    mpt_graph *step = typed && (r || !fused) ? train_step(r ? r : typed, m, "float32") : NULL;
    int64_t peak = -1;
    if (step) {
        mpt_plan *p = plan_of(step, fused);
        peak = p->peak_bytes;
        if (fused) {
            CHECK(count_kernels(p, MPT_OP_ATTENTION) == 1 && count_kernels(p, MPT_OP_ATTENTION_GRAD) == 1);
            CHECK(count_kernels(p, MPT_OP_BATCH_MATMUL) == 0);
            /* the forward kernel writes the row statistics with o */
            for (int k = 0; k < p->n_kernels; k++) {
                if (p->kernels[k].kind != MPT_KERNEL_OPAQUE) continue;
                mpt_op op = p->g->nodes[p->kernels[k].root].op;
                if (op == MPT_OP_ATTENTION)
                    CHECK(p->kernels[k].n_nodes == 2 && p->kernels[k].n_outputs == 2);
            }
        }
        mpt_plan_free(p);
    }
    mpt_graph_free(step);
    mpt_graph_free(r);
    mpt_graph_free(typed);
    mpt_model_free(m);
    return peak;
}

static void test_plan(void) {
    /* doubling the context doubles a linear peak and quadruples a
     * quadratic one: between 128 and 512 the fused peak may grow at most
     * 4x plus a margin, the unfused one grows past 8x */
    int64_t f128 = peak_at(128, 1), f512 = peak_at(512, 1);
    int64_t u128 = peak_at(128, 0), u512 = peak_at(512, 0);
    CHECK_MSG(f128 > 0 && f512 <= 5 * f128, "fused peak %lld at 128, %lld at 512: not linear",
              (long long)f128, (long long)f512);
    CHECK_MSG(u128 > 0 && u512 > 8 * u128, "unfused peak %lld at 128, %lld at 512: expected quadratic",
              (long long)u128, (long long)u512);
}

/* ---- (d) the CPU kernels against the interpreter ---- */

static mpt_dtype compute_of(const char *policy) {
    return strcmp(policy, "float32") == 0 ? MPT_DT_F32 : strcmp(policy, "mixed_float16") == 0 ? MPT_DT_F16
                                                                                            : MPT_DT_BF16;
}

static void check_backend(const model_case *c, const char *policy) {
    mpt_model *m = load_src(c->name, c->src, 1);
    if (!m) return;
    char what[160];
    snprintf(what, sizeof what, "%s %s", c->name, policy);
    mpt_graph *typed = typed_of(m, policy), *r = NULL, *step = NULL;
    mpt_attention_note note;
    if (typed) r = rewrite(typed, NULL, &note);
    if (r) step = train_step(r, m, policy);
    if (step) {
        /* the table's accumulation tolerance, as test_inputs' attention
         * models: the kernel sums in f32 what the interpreter sums in f64
         * (its exp is a polynomial within 2e-7 of expf) */
        tol t = tol_for(TOL_ACCUM, compute_of(policy), 1);
        t.atol += 1.2e-3 * 2; /* Adam: a step of lr where a gradient is 0 on one side (test_layers) */
        plant = plant_masks;
        run_both(step, 2, t, 0, what, FUSED);
        plant = NULL;
    }
    mpt_graph_free(step);
    mpt_graph_free(r);
    mpt_graph_free(typed);
    mpt_model_free(m);
}

/* ---- (e) fused against unfused on the CPU ---- */

/* two steps of step on the CPU from the same start; outs[s] the loss of
 * step s, vars the variables after */
static int run_cpu(const mpt_graph *step, mpt_tensor *vars, double *loss) {
    char err[512];
    mpt_plan *p = plan_of(step, 1);
    mpt_exec *x = mpt_backend_cpu.compile(p, err, sizeof err);
    CHECK_MSG(x != NULL, "compile: %s", err);
    int ni = mpt_graph_n_inputs(step), no = step->n_outputs, rc = x ? 0 : -1;
    mpt_tensor *in = calloc((size_t)ni + 1, sizeof *in), *out = calloc((size_t)no + 1, sizeof *out);
    mpt_init_variables(step, vars, 42);
    unsigned seed0 = rng_state;
    for (int s = 0; s < 2 && rc == 0; s++) {
        fill_inputs(step, in, 0);
        plant_masks(step, in);
        rc = mpt_backend_cpu.run(x, in, vars, out, err, sizeof err);
        CHECK_MSG(rc == 0, "run: %s", err);
        if (rc == 0) {
            loss[s] = mpt_tensor_get(&out[mpt_graph_find_output(step, "loss")], 0);
            for (int k = 0; k < no; k++) {
                for (int64_t i = 0; i < mpt_shape_numel(out[k].shape); i++)
                    CHECK_MSG(!mpt_dtype_is_float(out[k].dtype) || isfinite(mpt_tensor_get(&out[k], i)),
                              "output %s is not finite", step->outputs[k].name);
                mpt_tensor_free(&out[k]);
            }
        }
        for (int k = 0; k < ni; k++) mpt_tensor_free(&in[k]);
    }
    rng_state = seed0;
    free(in);
    free(out);
    if (x) mpt_backend_cpu.free(x);
    mpt_plan_free(p);
    return rc;
}

static void check_fused_unfused(const model_case *c, const char *policy) {
    mpt_model *m = load_src(c->name, c->src, 1);
    if (!m) return;
    mpt_graph *typed = typed_of(m, policy), *r = NULL;
    mpt_attention_note note;
    if (typed) r = rewrite(typed, NULL, &note);
    mpt_graph *fs = r ? train_step(r, m, policy) : NULL, *us = typed ? train_step(typed, m, policy) : NULL;
    int nv = us ? mpt_graph_n_variables(us) : 0;
    if (fs && us && mpt_graph_n_variables(fs) == nv) {
        mpt_tensor *vf = calloc((size_t)nv + 1, sizeof *vf), *vu = calloc((size_t)nv + 1, sizeof *vu);
        double lf[2], lu[2];
        if (run_cpu(fs, vf, lf) == 0 && run_cpu(us, vu, lu) == 0) {
            /* The unfused graph rounds the scores to f32 and the
             * probabilities to the compute dtype before P.V; the fused
             * kernel keeps both in f32. The loss moves by about what that
             * rounding moves o: a few f32 ulps (float32), and at most
             * twice the half-ulp rounding of each probability, f16's 2^-11
             * and bf16's 2^-9 (seen: 1.4e-4 and 4.3e-4). */
            mpt_dtype dt = compute_of(policy);
            double rtol = dt == MPT_DT_F32 ? 1e-5 : dt == MPT_DT_F16 ? 1e-3 : 4e-3;
            if (getenv("MPT_TEST_VERBOSE"))
                printf("%s %s loss rel diff %.3g %.3g\n", c->name, policy, fabs(lf[0] - lu[0]) / fabs(lu[0]),
                       fabs(lf[1] - lu[1]) / fabs(lu[1]));
            for (int s = 0; s < 2; s++)
                CHECK_MSG(fabs(lf[s] - lu[s]) <= rtol * fabs(lu[s]), "%s %s step %d loss: fused %.9g, unfused %.9g",
                          c->name, policy, s, lf[s], lu[s]);
            /* the weights after two Adam steps: the table's accumulation
             * tolerance and Adam's lr where a gradient is near 0 */
            tol t = tol_for(TOL_ACCUM, dt, 1);
            t.atol += 1.2e-3 * 2;
            for (int k = 0; k < nv; k++) {
                char what[200];
                snprintf(what, sizeof what, "%s %s fused against unfused, variable %s", c->name, policy,
                         us->nodes[mpt_graph_variable_node(us, k)].name);
                compare(&vf[k], &vu[k], t, what);
            }
        }
        for (int k = 0; k < nv; k++) mpt_tensor_free(&vf[k]), mpt_tensor_free(&vu[k]);
        free(vf);
        free(vu);
    }
    mpt_graph_free(fs);
    mpt_graph_free(us);
    mpt_graph_free(r);
    mpt_graph_free(typed);
    mpt_model_free(m);
}

/* ---- (f) synthetic labels at every position ---- */

static void test_synthetic_ids(void) {
    mpt_dataset *d = NULL;
    char err[512];
    int rc = mpt_data_open("synthetic(shape=[6], classes=5, samples=8, dtype=i32, vocab=9, ids=[6])",
                           MPT_DATA_TRAIN, mpt_shape_1(6), &d, err, sizeof err);
    CHECK_MSG(rc == 0, "synthetic ids: %s", err);
    if (rc) return;
    mpt_shape ls = mpt_data_label_shape(d);
    CHECK(ls.rank == 1 && ls.dim[0] == 6 && mpt_data_label_dtype(d) == MPT_DT_I32);
    mpt_tensor x, y;
    mpt_tensor_alloc(&x, MPT_DT_I32, mpt_shape_2(4, 6));
    mpt_tensor_alloc(&y, MPT_DT_I32, mpt_shape_2(4, 6));
    int64_t real = 0;
    rc = mpt_data_batch(d, 0, 4, &x, &y, &real, err, sizeof err);
    CHECK_MSG(rc == 0 && real == 4, "synthetic ids batch: %s", err);
    int in_range = 1, distinct = 0;
    for (int64_t i = 0; i < 24; i++) {
        double v = mpt_tensor_get(&y, i);
        in_range &= v >= 0 && v < 5;
        distinct |= i % 6 && v != mpt_tensor_get(&y, i - 1);
    }
    CHECK_MSG(in_range && distinct, "labels at every position: in [0, 5) and not all one class");
    mpt_tensor_free(&x);
    mpt_tensor_free(&y);
    mpt_data_free(d);
}

int main(void) {
    static const char *policies[] = {"float32", "mixed_bfloat16", "mixed_float16"};
    test_rewrite();
    layout = 1;
    for (int l = 0; l < 2; l++, layout = !layout)
        for (int c = 0; c < N_CASES; c++) check_definition(&cases[c]);
    test_plan();
    test_synthetic_ids();
    for (int c = 0; c < N_CASES; c++)
        for (int p = 0; p < 3; p++) {
            /* the CPU kernels on both layouts (the CPU's own, 0, in (e) and
             * test_examples) */
            layout = p != 1;
            check_backend(&cases[c], policies[p]);
            layout = 0;
            check_fused_unfused(&cases[c], policies[p]);
        }
    /* each policy's loads (f32, f16, bf16) once on the register paths, not
     * every pair (suite time): the causal 32/16 case in f32 and f16, the
     * dropout 64 case in bf16 */
    for (int c = 0; c < N_WIDE; c++)
        for (int p = 0; p < 3; p++) {
            if ((c == 0) != (p != 1)) continue;
            layout = c % 2;
            check_backend(&wide_cases[c], policies[p]);
            check_fused_unfused(&wide_cases[c], policies[p]);
        }
    return check_exit("test_attention_fused");
}
