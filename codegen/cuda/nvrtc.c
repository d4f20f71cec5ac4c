/* codegen/cuda/nvrtc.c — CUDA C to PTX (and cubin) through NVRTC, with a
 * disk cache, and `mptc ptx`'s per-plan output.
 *
 * One compile for sm_XY yields PTX, the cubin and ptxas' -v report
 * (registers, spills) in the program log; compute_XY yields PTX only.
 * Cache entries are keyed by a 128-bit hash of (source, arch, options,
 * NVRTC version), so a new NVRTC or a changed generator never reads stale
 * code.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codegen/cuda/cuda_internal.h"
#include "codegen/kcache.h"
#include "runtime/cuda.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *mpt_cuda_cache_dir(char *buf, size_t n) { return mpt_kcache_dir(buf, n); }

int mpt_cuda_arch_check(const char *arch, char *err, size_t n) {
    int v = 0;
    if ((sscanf(arch, "sm_%d", &v) == 1 || sscanf(arch, "compute_%d", &v) == 1) && v >= 80)
        return 0;
    snprintf(err, n, "unsupported CUDA architecture '%s' (hint: use sm_80, sm_86, sm_89, sm_90 "
             "or compute_90; generated kernels need sm_80+ for bf16 and mma.sync)", arch);
    return -1;
}


static void parse_ptxas(mpt_cuda_binary *b) {
    b->regs = b->spill_stores = b->spill_loads = -1;
    if (!b->log) return;
    const char *u = strstr(b->log, "Used ");
    if (u) sscanf(u, "Used %d registers", &b->regs);
    const char *s = strstr(b->log, "bytes spill stores");
    if (s) {
        while (s > b->log && s[-1] == ' ') s--;
        while (s > b->log && s[-1] >= '0' && s[-1] <= '9') s--;
        sscanf(s, "%d bytes spill stores, %d bytes spill loads", &b->spill_stores,
               &b->spill_loads);
    }
}

int mpt_cuda_compile(const char *src, const char *name, const char *arch,
                     mpt_cuda_binary *out, char *err, size_t n) {
    memset(out, 0, sizeof *out);
    double t0 = now();
    mpt_nvrtc_program prog = NULL;
    if (mpt_cuda_arch_check(arch, err, n)) return -1;
    const mpt_nvrtc_api *nv = mpt_cuda_nvrtc(err, n);
    if (!nv) return -1;
    int cubin = strncmp(arch, "sm_", 3) == 0;
    char archopt[64];
    snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
    const char *opts[] = {archopt, "-std=c++17", "--ptxas-options=-v"};
    int n_opts = cubin ? 3 : 2;
    int major = 0, minor = 0;
    MPT_NVRTC_CHECK(nv->version(&major, &minor), "reinstall the CUDA toolkit's NVRTC");

    char ver[32], key[33];
    snprintf(ver, sizeof ver, "nvrtc %d.%d", major, minor);
    const char *parts[] = {src, arch, ver, opts[1], cubin ? opts[2] : ""};
    mpt_kcache_key(parts, (int)(sizeof parts / sizeof *parts), key);
    char dir[512], base[700], path[800];
    mpt_kcache_dir(dir, sizeof dir);
    snprintf(base, sizeof base, "%s/%s", dir, key);
    int use_cache = mpt_kcache_enabled();
    snprintf(path, sizeof path, "%s.ptx", base);
    out->ptx = use_cache ? mpt_kcache_read(path, &out->ptx_len) : NULL;
    if (out->ptx && cubin) {
        snprintf(path, sizeof path, "%s.cubin", base);
        out->cubin = mpt_kcache_read(path, &out->cubin_len);
    }
    if (out->ptx && (!cubin || out->cubin)) {
        snprintf(path, sizeof path, "%s.log", base);
        out->log = mpt_kcache_read(path, NULL);
        parse_ptxas(out);
        out->cache_hit = 1;
        out->seconds = now() - t0;
        return 0;
    }
    mpt_cuda_binary_free(out);

    MPT_NVRTC_CHECK(nv->create_program(&prog, src, name, 0, NULL, NULL),
                    "NVRTC could not take the program; is the source empty?");
    mpt_nvrtc_result rc = nv->compile_program(prog, n_opts, opts);
    size_t len = 0;
    MPT_NVRTC_CHECK(nv->get_program_log_size(prog, &len), "NVRTC is broken; reinstall it");
    out->log = calloc(len + 1, 1);
    if (!out->log) goto oom;
    MPT_NVRTC_CHECK(nv->get_program_log(prog, out->log), "NVRTC is broken; reinstall it");
    if (rc != 0) {
        snprintf(err, n, "NVRTC failed to compile %s for %s: %s\n%s(hint: this is a bug in "
                 "mptc's CUDA generator; report it with the .cu file from `mptc ptx`)",
                 name, arch, nv->get_error_string(rc), out->log);
        goto fail;
    }
    MPT_NVRTC_CHECK(nv->get_ptx_size(prog, &out->ptx_len), "NVRTC is broken; reinstall it");
    out->ptx = malloc(out->ptx_len + 1);
    if (!out->ptx) goto oom;
    MPT_NVRTC_CHECK(nv->get_ptx(prog, out->ptx), "NVRTC is broken; reinstall it");
    out->ptx[out->ptx_len] = 0;
    out->ptx_len = strlen(out->ptx);
    if (cubin) {
        MPT_NVRTC_CHECK(nv->get_cubin_size(prog, &out->cubin_len),
                        "this NVRTC cannot emit cubin; use compute_XY for PTX only");
        out->cubin = malloc(out->cubin_len ? out->cubin_len : 1);
        if (!out->cubin) goto oom;
        MPT_NVRTC_CHECK(nv->get_cubin(prog, out->cubin), "NVRTC is broken; reinstall it");
    }
    nv->destroy_program(&prog);
    parse_ptxas(out);
    /* a cache that cannot be written only costs time: say nothing */
    if (use_cache) {
        snprintf(path, sizeof path, "%s.log", base);
        mpt_kcache_write(path, out->log, strlen(out->log));
        if (cubin) {
            snprintf(path, sizeof path, "%s.cubin", base);
            mpt_kcache_write(path, out->cubin, out->cubin_len);
        }
        /* the PTX last: its presence is what a reader checks first */
        snprintf(path, sizeof path, "%s.ptx", base);
        mpt_kcache_write(path, out->ptx, out->ptx_len);
    }
    out->seconds = now() - t0;
    return 0;
oom:
    snprintf(err, n, "out of memory compiling %s", name);
fail:
    if (prog) nv->destroy_program(&prog);
    mpt_cuda_binary_free(out);
    return -1;
}

void mpt_cuda_binary_free(mpt_cuda_binary *b) {
    free(b->ptx);
    free(b->cubin);
    free(b->log);
    memset(b, 0, sizeof *b);
}

static int write_text(const char *dir, const char *name, const char *ext, const char *text,
                      char *err, size_t n) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f)) {
        snprintf(err, n, "cannot write %s: %s (hint: check that -o names a writable directory)",
                 path, strerror(errno));
        if (f) fclose(f);
        return -1;
    }
    return 0;
}

int mpt_cuda_emit_plan(const mpt_plan *p, const char *arch, const char *outdir,
                       FILE *report, char *err, size_t n) {
    if (mpt_cuda_arch_check(arch, err, n)) return -1;
    if (outdir && mpt_make_dirs(outdir)) {
        snprintf(err, n, "cannot create %s: %s (hint: pick another -o directory)", outdir,
                 strerror(errno));
        return -1;
    }
    int n_lt = 0, n_gen = 0;
    double secs = 0;
    for (int i = 0; i < p->n_kernels; i++) {
        const mpt_kernel *k = &p->kernels[i];
        if (k->kind == MPT_KERNEL_GEMM) {
            mpt_lt_call call;
            const char *why = mpt_cuda_match_lt(p->g, k, &call);
            if (!why) {
                if (report) {
                    fprintf(report, "kernel %d %s: ", i, k->name);
                    mpt_lt_call_print(&call, p->g, report);
                    fputc('\n', report);
                }
                n_lt++;
                continue;
            }
            if (report) fprintf(report, "kernel %d %s: generated, not cuBLASLt: %s\n", i,
                                k->name, why);
        }
        mpt_cuda_kernel_src src;
        if (mpt_cuda_emit_kernel(p, i, &src, err, n)) return -1;
        mpt_cuda_binary bin;
        if (mpt_cuda_compile(src.source, src.name, arch, &bin, err, n)) {
            mpt_cuda_kernel_src_free(&src);
            return -1;
        }
        int rc = 0;
        if (outdir) {
            rc = write_text(outdir, src.name, "cu", src.source, err, n);
            if (!rc) rc = write_text(outdir, src.name, "ptx", bin.ptx, err, n);
        }
        if (report && !rc) {
            fprintf(report, "kernel %d %s: %s grid (%u,%u", i, src.name,
                    src.tensor_cores ? "mma.sync" : "cuda-core", src.grid[0], src.grid[1]);
            if (src.grid[2] > 1) fprintf(report, ",%u: split-K", src.grid[2]);
            fprintf(report, ") block %u", src.block[0]);
            if (src.shared_bytes) fprintf(report, ", %u B shared", src.shared_bytes);
            if (src.scratch_bytes) fprintf(report, ", %zu B scratch", src.scratch_bytes);
            if (bin.regs >= 0)
                fprintf(report, ", %d registers, %d bytes spilled", bin.regs,
                        bin.spill_stores);
            fprintf(report, "%s\n", bin.cache_hit ? " (cached)" : "");
        }
        secs += bin.seconds;
        n_gen++;
        mpt_cuda_binary_free(&bin);
        mpt_cuda_kernel_src_free(&src);
        if (rc) return -1;
    }
    if (report) {
        char dir[512];
        fprintf(report, "%d kernels: %d generated for %s (%.2f s in NVRTC), %d cuBLASLt "
                "calls; cache %s\n", p->n_kernels, n_gen, arch, secs, n_lt,
                mpt_cuda_cache_dir(dir, sizeof dir));
    }
    return 0;
}
