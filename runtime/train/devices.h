/* runtime/devices.h — what this machine has (private to runtime/). */
#ifndef MPT_DEVICES_H
#define MPT_DEVICES_H

#include <stdint.h>

typedef struct {
    char name[128];
    char features[256]; /* the ones mptc uses, space-separated */
    int cores;
    int avx2, fma, f16c, avx512f, avx512_bf16;
} mpt_cpu_info;

void mpt_devices_cpu(mpt_cpu_info *out);

#endif
