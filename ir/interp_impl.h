/* ir/interp_impl.h — private to ir/tensor.c, ir/interp.c and ir/interp_ops.c:
 * the interpreter's value representation and its counter-based hash.
 *
 * Inside the interpreter every value is a row-major array of doubles,
 * already rounded to its node's dtype (see mpt_interp_round). */
#ifndef MPT_IR_INTERP_IMPL_H
#define MPT_IR_INTERP_IMPL_H

#include <stdint.h>

#include "ir/ir.h"

/* splitmix64's step: a bijective 64-bit mixer. The interpreter's random
 * numbers (random_uniform, variable initialisers) are all built from it so
 * that they are pure functions of their arguments, which backends can
 * reproduce bit for bit. */
static inline uint64_t mpt_mix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The hash behind random_uniform (documented in ir/interp.c). */
static inline uint64_t mpt_random_bits(int64_t seed, int32_t counter, int64_t index) {
    uint64_t h = mpt_mix64((uint64_t)seed);
    h = mpt_mix64(h ^ (uint64_t)(uint32_t)counter);
    return mpt_mix64(h ^ (uint64_t)index);
}

/* v rounded to dt: one place, so every op rounds the same way. */
static inline double mpt_interp_round(mpt_dtype dt, double v) {
    if (dt == MPT_DT_F32) return (double)(float)v;
    if (dt == MPT_DT_F64) return v;
    return mpt_round_to(dt, v);
}

/* t's elements widened into dst (numel doubles) / dst's doubles rounded
 * and stored into t. Both in ir/tensor.c. */
void mpt_tensor_load(const mpt_tensor *t, double *dst);
void mpt_tensor_store(mpt_tensor *t, const double *src);

/* Computes node `id` of g into out (numel(node) doubles, unrounded) from
 * the values of its inputs (vals[in[k]]). The caller rounds. Returns 0, or
 * -1 when memory ran out. ir/interp_ops.c. */
int mpt_interp_eval(const mpt_graph *g, int id, double *const *vals, double *out);

/* attention, attention_lse, attention_grad (ir/interp_attn.c), as above. */
int mpt_interp_attention(const mpt_graph *g, const mpt_node *nd, double *const *vals, double *out);

#endif
