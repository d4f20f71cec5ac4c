/* runtime/cli/cmd_asm.c — `mptc asm`: the LLVM IR or host assembly of every CPU
 * kernel of the train step, one file per kernel, each headed by the ops it
 * fuses. */
#include <string.h>

#include "codegen/cpu/cpu_backend.h"
#include "runtime/cli/cli.h"

static const mpt_cli_opt asm_opts[] = {
    MPT_CLI_COMPILE_OPTS,
    {"emit", 1, "llvm (optimised LLVM IR, .ll) or asm (host assembly, .s; the default)"},
    {"o", 1, "output directory (default asm/<model>)"},
    {NULL, 0, NULL},
};

int mpt_cmd_asm(int argc, char **argv) {
    mpt_cli c;
    int prc = mpt_cli_parse(&c, "asm", "write the LLVM IR or assembly of every CPU kernel",
                            asm_opts, argc, argv);
    if (prc) return prc == 1 ? 0 : 2;
    mpt_compile_opts o;
    if (mpt_cli_compile_opts(&c, asm_opts, &o)) return 2;
    o.device = "interp"; /* the plan is what matters here; the CPU code is generated below */
    const char *emit = mpt_cli_get(&c, asm_opts, "emit");
    if (!emit) emit = "asm";
    if (strcmp(emit, "llvm") && strcmp(emit, "asm")) {
        fprintf(stderr, "mptc asm: unknown --emit '%s'\n  hint: use --emit llvm or --emit asm\n", emit);
        return 2;
    }
    mpt_session *s;
    if (mpt_session_open(&o, &s)) return 1;
    char dir[1024];
    const char *outdir = mpt_cli_get(&c, asm_opts, "o");
    if (!outdir) {
        snprintf(dir, sizeof dir, "asm/%s", s->model->name);
        outdir = dir;
    }
    char err[1024];
    int rc = mpt_cpu_emit_plan(s->train_plan, emit, outdir, stdout, err, sizeof err);
    if (rc) fprintf(stderr, "mptc asm: %s\n", err);
    else printf("wrote %d kernels' %s to %s/\n", s->train_plan->n_kernels,
                strcmp(emit, "llvm") ? "assembly" : "LLVM IR", outdir);
    mpt_session_free(s);
    return rc ? 1 : 0;
}
