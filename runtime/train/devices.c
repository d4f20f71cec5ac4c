/* runtime/train/devices.c — host CPU features and CUDA devices. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "runtime/train/train.h"

void mpt_devices_cpu(mpt_cpu_info *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "unknown x86-64");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[4096];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *p = strchr(line, ':');
            if (p) {
                p += 1 + (p[1] == ' ');
                p[strcspn(p, "\n")] = 0;
                snprintf(c->name, sizeof c->name, "%s", p);
            }
            break;
        }
    }
    if (f) fclose(f);
    __builtin_cpu_init();
    c->avx2 = __builtin_cpu_supports("avx2");
    c->fma = __builtin_cpu_supports("fma");
    c->avx512f = __builtin_cpu_supports("avx512f");
    c->avx512_bf16 = __builtin_cpu_supports("avx512bf16");
    /* F16C has no __builtin_cpu_supports name in every gcc; cpuid leaf 1 ECX bit 29 */
    unsigned a, b, cx, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(cx), "=d"(d) : "a"(1), "c"(0));
    c->f16c = (cx >> 29) & 1;
    snprintf(c->features, sizeof c->features, "%s%s%s%s%s", c->avx2 ? "avx2 " : "", c->fma ? "fma " : "",
             c->f16c ? "f16c " : "", c->avx512f ? "avx512f " : "", c->avx512_bf16 ? "avx512_bf16" : "");
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    c->cores = n > 0 ? (int)n : 1;
}
