/* runtime/cli/cli.c — command-line parsing shared by the commands. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cli/cli.h"

static int n_opts(const mpt_cli_opt *opts) {
    int n = 0;
    while (opts[n].name) n++;
    return n;
}

static void usage(FILE *f, const char *cmd, const char *summary, const char *positional,
                  const mpt_cli_opt *opts) {
    fprintf(f, "usage: mptc %s %s [options]\n  %s\n\noptions:\n", cmd, positional ? positional : "",
            summary);
    for (int i = 0; opts[i].name; i++) {
        char left[48];
        snprintf(left, sizeof left, "%s%s%s", opts[i].name[1] ? "--" : "-", opts[i].name,
                 opts[i].takes_value ? " X" : "");
        fprintf(f, "  %-26s %s\n", left, opts[i].help);
    }
}

int mpt_cli_parse(mpt_cli *c, const char *cmd, const char *summary, const mpt_cli_opt *opts,
                  int argc, char **argv) {
    memset(c, 0, sizeof *c);
    c->cmd = cmd;
    int n = n_opts(opts);
    /* every command but `devices` reads a model file */
    c->positional = strcmp(cmd, "devices") == 0 ? NULL : "MODEL.mpt";
    const char *positional = c->positional;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout, cmd, summary, positional, opts);
            return 1;
        }
        int short_opt = a[0] == '-' && a[1] && a[1] != '-' && a[2] == 0; /* -o */
        if (!short_opt && (strncmp(a, "--", 2) != 0 || a[2] == 0)) {
            if (c->pos || !positional) {
                fprintf(stderr, "mptc %s: unexpected argument '%s'\n", cmd, a);
                goto bad;
            }
            c->pos = a;
            continue;
        }
        const char *name = a + (short_opt ? 1 : 2), *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        int k = -1;
        for (int j = 0; j < n; j++)
            if (strlen(opts[j].name) == len && strncmp(opts[j].name, name, len) == 0) k = j;
        if (k < 0) {
            fprintf(stderr, "mptc %s: unknown option '%.*s'\n", cmd, (int)(len + (size_t)(name - a)), a);
            goto bad;
        }
        c->given[k] = 1;
        if (opts[k].takes_value) {
            if (eq) c->value[k] = eq + 1;
            else if (i + 1 < argc) c->value[k] = argv[++i];
            else {
                fprintf(stderr, "mptc %s: option --%s needs a value\n", cmd, opts[k].name);
                goto bad;
            }
        } else if (eq) {
            fprintf(stderr, "mptc %s: option --%s takes no value\n", cmd, opts[k].name);
            goto bad;
        }
    }
    return 0;
bad:
    fprintf(stderr, "  hint: `mptc %s --help` lists the options\n", cmd);
    return 2;
}

static int find(const mpt_cli_opt *opts, const char *name) {
    for (int j = 0; opts[j].name; j++)
        if (strcmp(opts[j].name, name) == 0) return j;
    return -1;
}

const char *mpt_cli_get(const mpt_cli *c, const mpt_cli_opt *opts, const char *name) {
    int k = find(opts, name);
    return k < 0 ? NULL : c->value[k];
}

int mpt_cli_has(const mpt_cli *c, const mpt_cli_opt *opts, const char *name) {
    int k = find(opts, name);
    return k >= 0 && c->given[k];
}

int mpt_cli_long(const mpt_cli *c, const mpt_cli_opt *opts, const char *name, long min,
                 long *out) {
    const char *v = mpt_cli_get(c, opts, name);
    if (!v) return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == 0 || *end || x < min) {
        fprintf(stderr, "mptc %s: --%s wants a whole number >= %ld, got '%s'\n", c->cmd, name, min, v);
        return -1;
    }
    *out = x;
    return 0;
}

int mpt_cli_compile_opts(const mpt_cli *c, const mpt_cli_opt *opts, mpt_compile_opts *o) {
    memset(o, 0, sizeof *o);
    o->diag = stderr;
    o->path = c->pos;
    if (!o->path) {
        fprintf(stderr, "mptc %s: no model file given\n  hint: mptc %s examples/mlp_small.mpt\n", c->cmd,
                c->cmd);
        return -1;
    }
    o->policy = mpt_cli_get(c, opts, "policy");
    o->xla = !mpt_cli_has(c, opts, "no-xla");
    o->tf32 = mpt_cli_has(c, opts, "tf32");
    if (mpt_cli_long(c, opts, "batch-size", 1, &o->batch_size)) return -1;
    if (mpt_cli_long(c, opts, "loss-scale-period", 1, &o->loss_scale_period)) return -1;
    if (mpt_cli_long(c, opts, "threads", 1, &o->threads)) return -1;
    long ranks = 1;
    if (mpt_cli_long(c, opts, "ranks", 1, &ranks)) return -1;
    if (ranks > 4096) {
        fprintf(stderr, "mptc %s: --ranks %ld: at most 4096\n", c->cmd, ranks);
        return -1;
    }
    o->ranks = (int)ranks;
    o->shard_optimizer = mpt_cli_has(c, opts, "shard-optimizer");
    const char *bm = mpt_cli_get(c, opts, "bucket-mb");
    if (bm) {
        char *end;
        o->bucket_mb = strtod(bm, &end);
        if (*end || !(o->bucket_mb >= 0) || o->bucket_mb > 1e6) {
            fprintf(stderr, "mptc %s: --bucket-mb wants a size in MiB >= 0, got '%s'\n", c->cmd, bm);
            return -1;
        }
        if (o->bucket_mb == 0) o->bucket_mb = -1; /* one sum per gradient */
    }
    o->loss_scale = mpt_cli_get(c, opts, "loss-scale");
    o->moves = mpt_cli_get(c, opts, "policy-move");
    o->device = mpt_cli_get(c, opts, "device");
    o->dump_after = mpt_cli_get(c, opts, "dump-after");
    o->optimizer = mpt_cli_get(c, opts, "optimizer");
    const char *lr = mpt_cli_get(c, opts, "learning-rate");
    if (lr) {
        char *end;
        o->learning_rate = strtod(lr, &end);
        if (*end || !(o->learning_rate > 0) || o->learning_rate > 1e6) {
            fprintf(stderr, "mptc %s: --learning-rate wants a positive number, got '%s'\n",
                    c->cmd, lr);
            return -1;
        }
    }
    const char *fd = mpt_cli_get(c, opts, "fusion-disable");
    if (fd) {
        char err[128];
        if (mpt_fusion_parse_disable(fd, &o->fusion_disable, err, sizeof err)) {
            fprintf(stderr, "mptc %s: --fusion-disable: %s\n", c->cmd, err);
            return -1;
        }
    }
    return 0;
}
