/* runtime/cli/main.c — the mptc command line: one function per command. */
#include <stdio.h>
#include <string.h>

#include "lang/lang.h"
#include "runtime/cli/cli.h"

#ifndef MPTC_COMMIT
#define MPTC_COMMIT "unknown"
#endif
#define MPTC_VERSION "0.1.0"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} command;

static const command commands[] = {
    {"train", mpt_cmd_train, "train a model: mptc train MODEL.mpt [--policy P] [--epochs N] ..."},
    {"check", mpt_cmd_check, "layers, shapes, parameters, per-layer dtypes, memory, Tensor Core alignment"},
    {"ir", mpt_cmd_ir, "print the graph at a stage, or the kernel plan with --xla --explain"},
    {"ptx", mpt_cmd_ptx, "CUDA source and PTX of every kernel, cuBLASLt calls (NVRTC only, no GPU needed)"},
    {"asm", mpt_cmd_asm, "LLVM IR or host assembly of every CPU kernel: mptc asm MODEL.mpt [--emit llvm|asm]"},
    {"eval", mpt_cmd_eval, "loss and accuracy of saved weights: mptc eval MODEL.mpt --weights F"},
    {"predict", mpt_cmd_predict, "class probabilities: mptc predict MODEL.mpt --weights F --input a.png"},
    {"devices", mpt_cmd_devices, "devices, their features, and which policies are fast on them"},
    {"bench", mpt_cmd_bench, "time training steps across policies, batch sizes and fused/unfused"},
};

static void usage(FILE *f) {
    fprintf(f, "mptc — compiles and trains neural networks described in .mpt files,\n"
               "with Keras-style mixed precision, XLA-style fusion and JIT code generation.\n\n"
               "usage: mptc COMMAND [args]   (mptc COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("mptc %s (commit %s, built %s)\n", MPTC_VERSION, MPTC_COMMIT, __DATE__);
        return 0;
    }
    enum { N = sizeof commands / sizeof commands[0] };
    const char *names[N];
    for (size_t i = 0; i < N; i++) {
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
        names[i] = commands[i].name;
    }
    const char *close = mpt_diag_closest(argv[1], names, N);
    if (close)
        fprintf(stderr, "mptc: unknown command '%s'\n  hint: did you mean '%s'? (`mptc --help` "
                "lists the commands)\n", argv[1], close);
    else
        fprintf(stderr, "mptc: unknown command '%s'\n  hint: `mptc --help` lists the commands\n",
                argv[1]);
    return 2;
}
