/* runtime/cli/cmd_eval.c — `mptc eval`: loss and accuracy of saved weights on a
 * data set, through the session's evaluation step (inference-mode layers:
 * no dropout, batch norm on its moving statistics). */
#include <string.h>

#include "runtime/train/train.h"
#include "runtime/cli/cli.h"

static const mpt_cli_opt eval_opts[] = {
    MPT_CLI_COMPILE_OPTS,
    {"weights", 1, "safetensors checkpoint to evaluate (from `mptc train --save`)"},
    {"data", 1, "data spec (default: the train block's data)"},
    {"part", 1, "test | train: which part of the data (default: test when the data has one)"},
    {NULL, 0, NULL},
};

static int pick_part(const char *cmd_part, const char *spec, mpt_data_part *part) {
    if (!cmd_part) {
        *part = mpt_data_has_test(spec) ? MPT_DATA_TEST : MPT_DATA_TRAIN;
        return 0;
    }
    if (strcmp(cmd_part, "test") == 0 && mpt_data_has_test(spec)) *part = MPT_DATA_TEST;
    else if (strcmp(cmd_part, "train") == 0) *part = MPT_DATA_TRAIN;
    else {
        fprintf(stderr, "mptc eval: --part wants test or train, got '%s'%s\n", cmd_part,
                strcmp(cmd_part, "test") == 0 ? " (this data set has no test part)" : "");
        return -1;
    }
    return 0;
}

int mpt_cmd_eval(int argc, char **argv) {
    mpt_cli c;
    int prc = mpt_cli_parse(&c, "eval", "loss and accuracy of saved weights on a data set", eval_opts,
                            argc, argv);
    if (prc) return prc == 1 ? 0 : 2;
    mpt_compile_opts co;
    if (mpt_cli_compile_opts(&c, eval_opts, &co)) return 2;
    const char *weights = mpt_cli_get(&c, eval_opts, "weights");
    if (!weights) {
        fprintf(stderr, "mptc eval: no --weights given\n"
                        "  hint: mptc eval %s --weights model.safetensors\n", co.path);
        return 2;
    }
    mpt_session *s;
    if (mpt_ckpt_open_inference(&co, weights, &s)) return 1;
    const char *tspec = s->model->train.data;
    const char *spec = mpt_cli_get(&c, eval_opts, "data");
    if (!spec) spec = tspec ? tspec : "fashion_mnist";
    mpt_data_part part;
    mpt_dataset *d = NULL;
    char err[1024];
    int status = 1;
    if (pick_part(mpt_cli_get(&c, eval_opts, "part"), spec, &part)) {
        status = 2;
        goto done;
    }
    if (mpt_session_open_data(s, spec, part, &d, err, sizeof err)) {
        fprintf(stderr, "mptc: %s\n", err);
        goto done;
    }
    if (mpt_check_labels(s, d, "evaluation", spec)) goto done;
    printf("mptc: %s on %s, policy %s, batch %ld, weights %s\n", s->model->name, s->backend->name,
           s->policy.name, s->batch_size, weights);
    mpt_eval_result r;
    double t0 = mpt_now();
    if (mpt_evaluate(s, d, &r, err, sizeof err)) {
        fprintf(stderr, "mptc: %s\n", err);
        goto done;
    }
    printf("Evaluate on %lld samples (%s, %s part) in %.2fs\n", (long long)mpt_data_count(d), spec,
           part == MPT_DATA_TEST ? "test" : "train", mpt_now() - t0);
    char line[256];
    mpt_metric_line(&r.metrics, "", line, sizeof line);
    printf("loss: %.4f%s\n", r.loss, line);
    status = 0;
done:
    mpt_data_free(d);
    mpt_session_free(s);
    return status;
}
