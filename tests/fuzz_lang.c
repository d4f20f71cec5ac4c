/* tests/fuzz_lang.c — a libFuzzer target for the front of the pipeline:
 * parse, check, lower, the policy (float32 and mixed_float16), the train
 * and evaluation steps, fusion and the memory plan, on whatever bytes it is
 * given as a .mpt file. Every input must end in a model or in diagnostics;
 * an abort, a crash or what AddressSanitizer and UBSan catch is a failure.
 *
 * Built with clang's -fsanitize=fuzzer,address,undefined over lang/, ir/
 * and fusion/ only (the Makefile's $(BUILD)/fuzz/fuzz_lang); run briefly
 * on tests/fuzz/ and the examples by tests/fuzz.t.sh in `make test`, and
 * as long as one likes by hand:
 *   build/fuzz/fuzz_lang -max_total_time=600 tests/fuzz examples */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion/fusion.h"
#include "ir/ir.h"
#include "lang/lang.h"

static FILE *devnull;

static void steps_of(const mpt_model *m, const char *policy) {
    char err[512];
    mpt_policy_opts po = {0};
    if (mpt_policy_lookup(policy, &po.global)) return;
    mpt_graph *typed = mpt_policy_apply(m->graph, &po, err, sizeof err);
    if (!typed) return;
    mpt_train_opts to = {.loss = m->train.loss, .opt = m->train.optimizer,
                         .loss_scale = m->train.loss_scale, .metrics = {.accuracy = 1}};
    if (strcmp(policy, "mixed_float16") == 0) to.loss_scale.mode = MPT_LS_DYNAMIC;
    mpt_graph *steps[2] = {mpt_train_step(typed, &to, err, sizeof err),
                           mpt_eval_step(typed, &to, err, sizeof err)};
    for (int i = 0; i < 2; i++) {
        if (!steps[i]) continue;
        mpt_fusion_opts fo;
        mpt_fusion_opts_default(&fo);
        for (unsigned cut = 0; cut < 2; cut++) {
            fo.disable = cut ? MPT_FUSE_REDUCTION_CHAIN | MPT_FUSE_GEMM_EXTRA : 0;
            mpt_plan *p = mpt_fuse(steps[i], &fo);
            mpt_memory_breakdown mb;
            mpt_plan_memory(p, &mb);
            mpt_plan_print(p, devnull, 1);
            mpt_plan_free(p);
        }
        mpt_graph_free(steps[i]);
    }
    mpt_graph_free(typed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!devnull) devnull = fopen("/dev/null", "w");
    if (size > 1 << 16) return 0; /* a model file is text of a few KB */
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = 0;
    mpt_lower_opts lo = {.batch_size = 2, .training = 1};
    mpt_model *m = NULL;
    if (mpt_lang_load_string("fuzz.mpt", src, &lo, &m, devnull) == 0 && m) {
        steps_of(m, "float32");
        steps_of(m, "mixed_float16");
    }
    mpt_model_free(m);
    free(src);
    return 0;
}
