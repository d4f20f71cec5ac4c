/* runtime/data/inputs.c — the values of synthetic samples, and the further
 * inputs of a model of several inputs (data.h, mpt_data_input): which kinds
 * can feed them and what they hold. */
#include <stdio.h>
#include <string.h>
#include "runtime/data/data_impl.h"

float mpt_data_synthetic_centroid(uint64_t key, int64_t numel, int32_t c, int64_t j) {
    uint64_t base = key + (uint64_t)c * (uint64_t)numel;
    uint64_t cw = mpt_data_mix64(base + (uint64_t)(j / 4));
    return (float)((cw >> (16 * (j % 4))) & 0xffff) * (1.0f / 65536.0f) * 2 - 1;
}

/* Each element is half a class centroid in [-1,1) plus half uniform noise,
 * so a model can learn the classes. Tokens are the class's own token at
 * that position half of the time. out is (numel). */
void mpt_data_synthetic_values(uint64_t key, int64_t numel, mpt_dtype dt, int64_t vocab,
                               int64_t sample, int32_t c, void *out) {
    mpt_data_rng r;
    mpt_data_rng_seed(&r, key ^ mpt_data_mix64((uint64_t)sample + 0x51ull));
    uint64_t base = key + (uint64_t)c * (uint64_t)numel;
    if (dt == MPT_DT_I32) {
        int32_t *x = out;
        for (int64_t j = 0; j < numel; j++) {
            uint64_t u = mpt_data_rng_next(&r);
            uint64_t v = (u & 1) ? mpt_data_mix64(base + (uint64_t)j) : u >> 1;
            x[j] = (int32_t)(v % (uint64_t)vocab);
        }
        return;
    }
    /* Each 64-bit draw gives four 16-bit values: generating big inputs
     * (224x224x3 per sample) must not dominate a benchmark step. */
    float *x = out;
    const float unit = 1.0f / 65536.0f;
    for (int64_t j0 = 0; j0 < numel; j0 += 4) {
        uint64_t cw = mpt_data_mix64(base + (uint64_t)(j0 / 4));
        uint64_t nw = mpt_data_rng_next(&r);
        for (int k = 0; k < 4 && j0 + k < numel; k++) {
            float centroid = (float)((cw >> (16 * k)) & 0xffff) * unit * 2 - 1; /* as mpt_data_synthetic_centroid */
            float noise = (float)((nw >> (16 * k)) & 0xffff) * unit * 2 - 1;
            x[j0 + k] = 0.5f * (centroid + noise);
        }
    }
}

int mpt_data_extras_open(const mpt_data_spec *spec, uint64_t key, const mpt_data_input *in,
                         int n_in, mpt_data_extra *ex, char *err, size_t n) {
    for (int k = 0; k < n_in; k++) {
        const mpt_data_input *I = &in[k];
        mpt_data_extra *e = &ex[k];
        *e = (mpt_data_extra){.shape = I->shape, .numel = 1, .dtype = I->dtype};
        for (int d = 0; d < I->shape.rank; d++) e->numel *= I->shape.dim[d];
        switch (spec->kind) {
        case MPT_DATA_SYNTHETIC:
            e->mask = I->mask_only;
            e->vocab = I->vocab ? I->vocab : spec->vocab ? spec->vocab : 1000;
            /* input k + 1's own stream; the first input keeps key itself */
            e->key = mpt_data_mix64(key ^ (0x696e707574ull + (uint64_t)(k + 1)));
            continue;
        case MPT_DATA_TEXT:
            if (I->mask_only) {
                e->ones = 1;
                continue;
            }
            return mpt_data_fail(err, n, "text(...) feeds one input, the byte ids, and a "
                                 "padding mask (all ones: its windows are never padded); "
                                 "the model's input '%s' is neither\n  hint: read '%s' only "
                                 "as a multi_head_attention attention_mask, or train on "
                                 "synthetic(...)", I->name, I->name);
        case MPT_DATA_FASHION_MNIST:
        case MPT_DATA_IMAGES:
        case MPT_DATA_IDX:
        case MPT_DATA_KIND_COUNT:
            break;
        }
        return mpt_data_fail(err, n, "%s(...) has one input a sample, but the model has %d "
                             "inputs ('%s' is the second)\n  hint: train a model of several "
                             "inputs on synthetic(...), which makes every input", 
                             mpt_data_kind_name(spec->kind), n_in + 1, in[0].name);
    }
    return 0;
}

void mpt_data_extra_sample(const mpt_data_extra *e, int64_t sample, int32_t c, void *out) {
    if (e->ones || e->mask) {
        float *x = out;
        int64_t steps = e->shape.dim[e->shape.rank - 1], len = steps;
        if (e->mask) {
            mpt_data_rng r;
            mpt_data_rng_seed(&r, e->key ^ mpt_data_mix64((uint64_t)sample));
            len = 1 + (int64_t)mpt_data_rng_below(&r, (uint64_t)steps);
        }
        for (int64_t j = 0; j < e->numel; j++) x[j] = j % steps < len ? 1.0f : 0.0f;
        return;
    }
    mpt_data_synthetic_values(e->key, e->numel, e->dtype, e->vocab, sample, c, out);
}
