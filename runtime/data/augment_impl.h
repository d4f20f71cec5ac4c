/* runtime/data/augment_impl.h — a parsed augment list, shared by the parser
 * (augment_parse.c) and the transforms (augment.c). Private to
 * runtime/data; callers use runtime/data/data.h.
 */
#ifndef MPT_AUGMENT_IMPL_H
#define MPT_AUGMENT_IMPL_H

#include "runtime/data/data_impl.h"

#define MPT_AUGMENT_MAX_OPS 64

typedef enum { AUG_FLIP, AUG_TRANSLATION, AUG_ROTATION, AUG_CONTRAST } aug_kind;

/* How a tap outside the image is read (Keras' fill_mode). */
typedef enum { FILL_REFLECT, FILL_WRAP, FILL_CONSTANT, FILL_NEAREST } fill_mode;

typedef struct {
    aug_kind kind;
    int flip_h, flip_v;
    /* the ranges draws are uniform in: translation [0] height and [1]
     * width fractions; rotation [0] turns; contrast [0] the factor */
    double lo[2], hi[2];
    fill_mode fill;
    int nearest; /* interpolation="nearest" */
    float fill_value;
    float range[2]; /* random_contrast's value_range */
    uint64_t seed;  /* the layer's seed= plus 1; 0 when None */
} aug_op;

struct mpt_augment {
    int n;
    aug_op ops[MPT_AUGMENT_MAX_OPS];
};

#endif
