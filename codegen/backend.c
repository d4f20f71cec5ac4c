/* codegen/backend.c — what the executors share beside their interface
 * (codegen/backend.h): a monotonic clock and byte counts for people. */
#include <stdio.h>
#include <time.h>

#include "codegen/backend.h"

double mpt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *mpt_fmt_bytes(int64_t bytes, char *buf, size_t n) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, u++;
    if (u == 0) snprintf(buf, n, "%lld B", (long long)bytes);
    else snprintf(buf, n, "%.1f %s", v, unit[u]);
    return buf;
}
