/* runtime/cli/cmd_ir.c — `mptc ir`: the graph at a chosen stage, or the kernel
 * plan with every fusion and every refusal explained. */
#include <string.h>

#include "runtime/cli/cli.h"

static const mpt_cli_opt ir_opts[] = {
    MPT_CLI_COMPILE_OPTS,
    {"stage", 1, "lower | policy | train_step | eval_step (default train_step)"},
    {"explain", 0, "print the kernel plan: every kernel's ops and every refused fusion"},
    {NULL, 0, NULL},
};

int mpt_cmd_ir(int argc, char **argv) {
    mpt_cli c;
    int prc = mpt_cli_parse(&c, "ir", "print the IR at a stage, or the kernel plan", ir_opts, argc, argv);
    if (prc) return prc == 1 ? 0 : 2;
    mpt_compile_opts o;
    if (mpt_cli_compile_opts(&c, ir_opts, &o)) return 2;
    const char *stage = mpt_cli_get(&c, ir_opts, "stage");
    if (!stage) stage = "train_step";
    static const char *stages[] = {"lower", "policy", "train_step", "eval_step"};
    int ok = 0;
    for (size_t i = 0; i < sizeof stages / sizeof *stages; i++) ok |= strcmp(stage, stages[i]) == 0;
    if (!ok) {
        fprintf(stderr, "mptc ir: unknown stage '%s'\n  hint: lower, policy, train_step or eval_step\n", stage);
        return 2;
    }
    o.want_eval = strcmp(stage, "eval_step") == 0;
    o.plan_only = 1; /* the graphs and the plan, no executor */
    mpt_session *s;
    if (mpt_session_open(&o, &s)) return 1;
    if (mpt_cli_has(&c, ir_opts, "explain") || mpt_cli_has(&c, ir_opts, "xla") ||
        mpt_cli_has(&c, ir_opts, "no-xla")) {
        mpt_plan_print(o.want_eval ? s->eval_plan : s->train_plan, stdout,
                       mpt_cli_has(&c, ir_opts, "explain"));
        if (mpt_cli_has(&c, ir_opts, "explain") && s->n_attn_notes) {
            printf("attention (%d):\n", s->n_attn_notes);
            for (int i = 0; i < s->n_attn_notes; i++) {
                const mpt_attention_note *a = &s->attn_notes[i];
                if (a->reason) printf("  @%s unfused: %s\n    found %s\n", a->layer, a->reason, a->what);
                else printf("  @%s fused (an attention kernel, an attention_grad kernel): %s\n", a->layer, a->what);
            }
        }
    } else {
        const mpt_graph *g = strcmp(stage, "lower") == 0    ? s->model->graph
                             : strcmp(stage, "policy") == 0 ? s->typed
                             : strcmp(stage, "eval_step") == 0 ? s->eval
                                                               : s->train;
        mpt_graph_print(g, stdout);
    }
    mpt_session_free(s);
    return 0;
}
