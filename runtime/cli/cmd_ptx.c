/* runtime/cli/cmd_ptx.c — `mptc ptx`: the CUDA source and PTX of every kernel of
 * the train step, and every cuBLASLt call. Needs NVRTC only, no GPU. */
#include <string.h>

#include "codegen/cuda/cuda.h"
#include "runtime/cli/cli.h"

static const mpt_cli_opt ptx_opts[] = {
    MPT_CLI_COMPILE_OPTS,
    {"arch", 1, "GPU architecture: sm_80, sm_86, sm_89, sm_90 (default sm_90)"},
    {"o", 1, "output directory (default ptx/<model>)"},
    {NULL, 0, NULL},
};

int mpt_cmd_ptx(int argc, char **argv) {
    mpt_cli c;
    int prc = mpt_cli_parse(&c, "ptx", "write the CUDA source and PTX of every kernel (no GPU needed)",
                            ptx_opts, argc, argv);
    if (prc) return prc == 1 ? 0 : 2;
    mpt_compile_opts o;
    if (mpt_cli_compile_opts(&c, ptx_opts, &o)) return 2;
    o.plan_only = 1; /* the plan is what matters here, not an executor */
    o.device = "cuda"; /* the plan a CUDA run would execute */
    const char *arch = mpt_cli_get(&c, ptx_opts, "arch");
    if (!arch) arch = "sm_90";
    mpt_session *s;
    if (mpt_session_open(&o, &s)) return 1;
    char dir[1024];
    const char *outdir = mpt_cli_get(&c, ptx_opts, "o");
    if (!outdir) {
        snprintf(dir, sizeof dir, "ptx/%s", s->model->name);
        outdir = dir;
    }
    char err[1024];
    int rc = mpt_cuda_emit_plan(s->train_plan, arch, outdir, stdout, err, sizeof err);
    if (rc) fprintf(stderr, "mptc ptx: %s\n", err);
    mpt_session_free(s);
    return rc ? 1 : 0;
}
