/* runtime/cli/cmd_train.c — `mptc train`: the training loop with Keras-style
 * progress, validation, test evaluation and a JSON-lines log. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/cli/cli.h"
#include "runtime/cuda/cuda.h"
#include "runtime/data/data.h"
#include "runtime/dist/dist.h"
#include "runtime/train/train.h"

static const mpt_cli_opt train_opts[] = {
    MPT_CLI_COMPILE_OPTS,
    {"epochs", 1, "epochs (default: the train block's)"},
    {"steps-per-epoch", 1, "cut every epoch to N steps"},
    {"max-steps", 1, "stop after N steps in all"},
    {"seed", 1, "seed of initialisation, shuffling and dropout (default 1)"},
    {"data", 1, "data spec: fashion_mnist, synthetic(...), images(\"dir\", size=[h,w])"},
    {"validation-split", 1, "fraction of the training data held out (default: the train block's)"},
    {"max-skipped", 1, "stop after N consecutive skipped steps (default 50)"},
    {"log", 1, "write one JSON object per step and epoch to this file"},
    {"save", 1, "write a safetensors checkpoint here at the end"},
    {"save-every", 1, "also save every N steps"},
    {"resume", 1, "continue the run saved in this checkpoint"},
    {"init-weights", 1, "load model weights (only) from a safetensors file"},
    {"no-test", 0, "skip the test-set evaluation at the end"},
    {"quiet", 0, "print only the epoch lines"},
    {"profile", 0, "per-kernel time table (GFLOP/s or TFLOP/s, GB/s) and time per layer at the end (cpu, cuda)"},
    {"compare-fusion", 0, "run one step fused and unfused from the same state, print the differences, exit"},
    {"augment", 1, "image augmentation over the train block's: \"random_flip('horizontal'), random_rotation(0.05)\""},
    {"tensorboard", 1, "write TensorBoard event files to DIR/train and DIR/validation"},
    {"histogram-every", 1, "with --tensorboard: weight histograms every N steps (default: each epoch's end)"},
    {"histogram-grads", 0, "with --tensorboard: gradient histograms too (compiles a gradient step)"},
    {NULL, 0, NULL},
};

/* Under mpirun with several ranks: joins them (runtime/dist/), trains
 * with the batch shared, and ends every rank when one fails, so none is
 * left waiting in a reduction. Rank 0 alone prints progress; every rank's
 * errors reach stderr. */
static int train_ranks(mpt_train_run *r) {
    if (r->copts.ranks > 1 && r->copts.ranks != mpt_dist_launched_size()) {
        fprintf(stderr, "mptc train: --ranks %d, but this is %d process%s\n  hint: mpirun -np %d "
                "mptc train ... starts the ranks (and --ranks is then not needed)\n",
                r->copts.ranks, mpt_dist_launched_size(),
                mpt_dist_launched_size() == 1 ? "" : "es of an mpirun", r->copts.ranks);
        return 2;
    }
    if (mpt_dist_launched_size() <= 1) return mpt_train_main(r);
    char err[4096];
    if (mpt_dist_init(err, sizeof err)) {
        fprintf(stderr, "mptc train: %s\n", err);
        return 1;
    }
    r->copts.ranks = mpt_dist_size();
    if (mpt_dist_rank() != 0 && !freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "mptc train: rank %d: cannot silence its output: %m\n", mpt_dist_rank());
        mpt_dist_abort(1);
        return 1;
    }
    int status = mpt_train_main(r);
    fflush(stdout);
    fflush(stderr);
    /* a signal's stop is every rank's, after the same step (they agreed
     * on it): they end together; any other failure ends the others */
    if (status != 0 && status < 128) {
        fprintf(stderr, "mptc train: rank %d of %d stopped with status %d; ending every rank\n",
                mpt_dist_rank(), mpt_dist_size(), status);
        mpt_dist_abort(status);
    }
    mpt_cuda_nccl_leave(); /* CUDA ranks' communicator, before MPI's end */
    mpt_dist_finalize();
    return status;
}

int mpt_cmd_train(int argc, char **argv) {
    mpt_cli c;
    int prc = mpt_cli_parse(&c, "train", "train a model (Keras-style progress, validation, test)",
                            train_opts, argc, argv);
    if (prc) return prc == 1 ? 0 : 2;
    mpt_train_run r;
    memset(&r, 0, sizeof r);
    if (mpt_cli_compile_opts(&c, train_opts, &r.copts)) return 2;
    r.copts.want_eval = 1;
    long v = 0;
    r.seed = 1;
    if (mpt_cli_long(&c, train_opts, "seed", 0, &v)) return 2;
    if (mpt_cli_has(&c, train_opts, "seed")) r.seed = (uint64_t)v, r.seed_set = 1;
    if (mpt_cli_long(&c, train_opts, "epochs", 1, &r.epochs)) return 2;
    if (mpt_cli_long(&c, train_opts, "steps-per-epoch", 1, &r.steps_per_epoch)) return 2;
    if (mpt_cli_long(&c, train_opts, "max-steps", 1, &r.max_steps)) return 2;
    if (mpt_cli_long(&c, train_opts, "max-skipped", 1, &r.max_skipped)) return 2;
    if (mpt_cli_long(&c, train_opts, "save-every", 1, &r.save_every)) return 2;
    r.data = mpt_cli_get(&c, train_opts, "data");
    const char *vs = mpt_cli_get(&c, train_opts, "validation-split");
    r.validation_split = -1;
    if (vs) {
        char *end;
        r.validation_split = strtod(vs, &end);
        if (*end || r.validation_split < 0 || r.validation_split >= 1) {
            fprintf(stderr, "mptc train: --validation-split wants a fraction in [0, 1), got '%s'\n", vs);
            return 2;
        }
    }
    r.log_path = mpt_cli_get(&c, train_opts, "log");
    r.save_path = mpt_cli_get(&c, train_opts, "save");
    r.resume_path = mpt_cli_get(&c, train_opts, "resume");
    r.init_weights = mpt_cli_get(&c, train_opts, "init-weights");
    r.no_test = mpt_cli_has(&c, train_opts, "no-test");
    r.quiet = mpt_cli_has(&c, train_opts, "quiet");
    r.profile = mpt_cli_has(&c, train_opts, "profile");
    r.compare_fusion = mpt_cli_has(&c, train_opts, "compare-fusion");
    r.augment = mpt_cli_get(&c, train_opts, "augment");
    r.tensorboard = mpt_cli_get(&c, train_opts, "tensorboard");
    if (mpt_cli_long(&c, train_opts, "histogram-every", 1, &r.histogram_every)) return 2;
    r.histogram_grads = mpt_cli_has(&c, train_opts, "histogram-grads");
    if ((r.histogram_grads || r.histogram_every) && !r.tensorboard) {
        fprintf(stderr, "mptc train: --histogram-every and --histogram-grads write to --tensorboard DIR\n"
                        "  hint: add --tensorboard logs/\n");
        return 2;
    }
    r.copts.want_grads = r.histogram_grads;
    return train_ranks(&r);
}
