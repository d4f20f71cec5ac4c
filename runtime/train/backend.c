/* runtime/train/backend.c — the reference-interpreter backend and backend lookup. */
#include <stdlib.h>
#include <string.h>

#include "codegen/backend.h"
#include "runtime/cuda/cuda.h"
#include "codegen/cpu/cpu_backend.h"

struct mpt_exec {
    const mpt_plan *plan;
};

static int interp_available(char *why, size_t n) { return 1; }

static mpt_exec *interp_compile(const mpt_plan *plan, char *err, size_t n) {
    mpt_exec *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, n, "out of memory");
        return NULL;
    }
    e->plan = plan;
    return e;
}

/* The interpreter rounds every node to its dtype, so running the graph op by
 * op gives exactly what any fused plan of it gives (fusion/ tests that);
 * the plan is kept for --compare-fusion and profiling. */
static int interp_run(mpt_exec *e, const mpt_tensor *inputs, mpt_tensor *vars,
                      mpt_tensor *outputs, char *err, size_t n) {
    return mpt_interp_run(e->plan->g, inputs, vars, outputs, NULL, err, n);
}

static void interp_free(mpt_exec *e) { free(e); }

mpt_backend mpt_backend_interp = {
    .name = "interp",
    .available = interp_available,
    .compile = interp_compile,
    .run = interp_run,
    .free = interp_free,
};

/* auto: the GPU when one is usable, else the CPU JIT, else the interpreter
 * (an LLVM without the host's target). interp stays the reference. */
mpt_backend *mpt_backend_find(const char *name, char *err, size_t n) {
    char why[256] = "";
    if (!name || strcmp(name, "auto") == 0) {
        if (mpt_backend_cuda.available(why, sizeof why)) return &mpt_backend_cuda;
        if (mpt_backend_cpu.available(why, sizeof why)) return &mpt_backend_cpu;
        return &mpt_backend_interp;
    }
    if (strcmp(name, "interp") == 0) return &mpt_backend_interp;
    if (strcmp(name, "cpu") == 0) {
        if (mpt_backend_cpu.available(why, sizeof why)) return &mpt_backend_cpu;
        snprintf(err, n, "--device cpu: %s\n  hint: use --device interp", why);
        return NULL;
    }
    if (strcmp(name, "cuda") == 0) {
        if (mpt_backend_cuda.available(why, sizeof why)) return &mpt_backend_cuda;
        snprintf(err, n, "--device cuda: %s\n  hint: use --device cpu, or `mptc devices` to see what is here", why);
        return NULL;
    }
    snprintf(err, n, "unknown device '%s'\n  hint: use auto, cpu, cuda or interp", name);
    return NULL;
}
