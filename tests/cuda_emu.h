/* tests/cuda_emu.h — runs mptc's generated CUDA C on the host (g++ and
 * tests/cuda_host.hpp), for tests on machines without a GPU.
 *
 * emu_build writes every kernel of a list into C++ files, each in a
 * namespace of its own, with its inline PTX rewritten into calls to the
 * host definitions (asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f))
 * becomes mpth_cvt_rn_f16_f32(h, f)), compiles them into a shared object
 * and loads it. emu_launch runs kernel i over its grid with the given
 * pointers. A kernel's host build depends only on its code (its source,
 * the kernel's name aside; the launch's grid, block and dynamic shared
 * memory are arguments): one met before in this process, in another plan
 * or twice in one list, is not compiled again, and the shared objects
 * stay loaded until the process ends.
 * emu_buffer gives memory with an inaccessible page right after it, so a
 * read or write past the end of a buffer stops the test at that access.
 * The kernels are compiled with -fsanitize=alignment where g++ can link
 * it: a vector load or store (float4, a half2 pair) from an address its
 * type does not align, which a GPU refuses ("misaligned address"), stops
 * the test at that access too.
 */
#ifndef MPTC_TESTS_CUDA_EMU_H
#define MPTC_TESTS_CUDA_EMU_H

#include <ctype.h>
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "codegen/cuda/cuda.h"
#include "codegen/cuda/cuda_internal.h"

/* A kernel's host build: runs it over grid dims[0..2] x block dims[3..5]
 * with dims[6] bytes of dynamic shared memory, on the pointers args. 0, or
 * -1 with the reason in err. */
typedef int (*emu_entry)(void **args, const unsigned dims[7], char *err, unsigned long n);

typedef struct {
    int n;
    emu_entry *run;      /* kernel i's host build */
    unsigned (*dims)[7]; /* and its launch: grid, block, dynamic shared bytes */
} emu_module;

/* ---- rewriting inline PTX ---- */

/* Copies the C expression at *p up to a ',' ':' or ')' at depth 0. */
static const char *emu_expr(const char *p, char *out, size_t n) {
    int depth = 0;
    size_t o = 0;
    while (*p && !(depth == 0 && (*p == ',' || *p == ':' || *p == ')'))) {
        if (*p == '(' || *p == '[') depth++;
        if (*p == ')' || *p == ']') depth--;
        if (o + 1 < n) out[o++] = *p;
        p++;
    }
    out[o] = 0;
    return p;
}

/* Rewrites the asm statement starting at s ("asm"); appends the call to
 * out and returns the text after the statement, or NULL if it cannot be
 * parsed. */
static const char *emu_asm(const char *s, FILE *out) {
    const char *p = s + 3;
    while (isspace((unsigned char)*p)) p++;
    if (strncmp(p, "volatile", 8) == 0) p += 8;
    while (isspace((unsigned char)*p)) p++;
    if (*p++ != '(') return NULL;
    while (isspace((unsigned char)*p)) p++;
    if (*p++ != '"') return NULL;
    fputs("mpth_", out);
    if (*p == '"') fputs("nop", out); /* asm("" : "+f"(x)): only ties x, as wgmma's kernel does */
    while (*p && *p != ' ' && *p != ';' && *p != '"')
        fputc(*p == '.' || *p == ':' ? '_' : *p, out), p++;
    while (*p && *p != '"') p++; /* the operand template: its order is the operands' */
    if (*p++ != '"') return NULL;
    fputc('(', out);
    int first = 1;
    for (;;) {
        while (isspace((unsigned char)*p)) p++;
        if (*p == ')') break;
        if (*p == ':' || *p == ',') { p++; continue; }
        if (*p != '"') return NULL;
        p = strchr(p + 1, '"'); /* the constraint */
        if (!p) return NULL;
        p++;
        while (isspace((unsigned char)*p)) p++;
        if (*p != '(') continue; /* a clobber ("memory") */
        p++;
        char e[256];
        p = emu_expr(p, e, sizeof e);
        if (*p++ != ')') return NULL;
        fprintf(out, "%s%s", first ? "" : ", ", e);
        first = 0;
    }
    fputc(')', out);
    return p + 1; /* past the asm's ')'; its ';' follows */
}

/* Writes src with every asm statement rewritten, and a dynamic shared
 * memory declaration pointed at cuda_host.hpp's. 0, or -1. */
static int emu_rewrite(const char *src, FILE *out) {
    const char *p = src, *dyn = "extern __shared__ __align__(16) unsigned char mpt_smem[];";
    for (;;) {
        const char *d = strstr(p, dyn), *a0 = strstr(p, "asm");
        if (d && (!a0 || d < a0)) {
            fwrite(p, 1, (size_t)(d - p), out);
            fputs("unsigned char *const mpt_smem = mpth_dyn_smem;", out);
            p = d + strlen(dyn);
            continue;
        }
        const char *a = strstr(p, "asm");
        while (a && ((a > src && (isalnum((unsigned char)a[-1]) || a[-1] == '_')) ||
                     isalnum((unsigned char)a[3]) || a[3] == '_'))
            a = strstr(a + 3, "asm");
        if (!a) { fputs(p, out); return 0; }
        fwrite(p, 1, (size_t)(a - p), out);
        p = emu_asm(a, out);
        if (!p) return -1;
    }
}

/* src with "static unsigned long long NAME_stamp; mpth_fresh(&NAME, sizeof
 * NAME, &NAME_stamp);" after each static shared
 * declaration ("__shared__ [__align__(N)] T NAME[..];" on a line of its
 * own), so that each block finds its shared arrays full of 0xff, as a GPU
 * leaves them full of whatever was there; malloc'd, NULL when out of
 * memory or for a declaration of another form */
static char *emu_fresh_shared(const char *src) {
    size_t cap = strlen(src) * 2 + 1024, o = 0;
    char *r = malloc(cap);
    if (!r) return NULL;
    for (const char *p = src; *p;) {
        const char *nl = strchr(p, '\n'), *end = nl ? nl + 1 : p + strlen(p);
        size_t len = (size_t)(end - p);
        if (o + len * 6 + 128 > cap) { /* the line, and the name 4 times after it */
            char *g = realloc(r, cap = cap * 2 + len * 6 + 128);
            if (!g) { free(r); return NULL; }
            r = g;
        }
        memcpy(r + o, p, len);
        o += len;
        const char *sh = strstr(p, "__shared__ ");
        if (sh && sh < end && !(sh - p >= 7 && strncmp(sh - 7, "extern ", 7) == 0)) {
            /* the name: the identifier before the first '[' or the ';' */
            const char *stop = sh;
            while (stop < end && *stop != '[' && *stop != ';') stop++;
            const char *b = stop;
            while (b > sh && (isalnum((unsigned char)b[-1]) || b[-1] == '_')) b--;
            if (stop == end || b == stop) { free(r); return NULL; }
            int nl = (int)(stop - b);
            o += (size_t)sprintf(r + o, "static unsigned long long %.*s_stamp; "
                                 "mpth_fresh(&%.*s, sizeof %.*s, &%.*s_stamp);\n",
                                 nl, b, nl, b, nl, b, nl, b);
        }
        p = end;
    }
    r[o] = 0;
    return r;
}

/* ---- building ---- */

static int emu_uses_fibers(const char *src) {
    return strstr(src, "__syncthreads") || strstr(src, "__shfl") || strstr(src, "_sync(") ||
           strstr(src, "mma.sync") || strstr(src, "wgmma");
}

/* The host builds of this process, by code: the kernel's source without
 * its leading comment, its name replaced by "@" (the name it is compiled
 * under is mpth_kernel_N, N its place in the file). */
typedef struct {
    unsigned long long hash;
    char *code;
    emu_entry run;
} emu_built;
static emu_built *emu_lib;
static int emu_lib_n, emu_lib_cap;
/* codes asked for and not built yet (emu_add), with a kernel's name for
 * messages and whether it runs as fibers */
typedef struct {
    char *code, *name;
    int fibers;
} emu_todo;
static emu_todo *emu_pending;
static int emu_pending_n, emu_pending_cap;
/* codes compiled so far */
static long emu_kernels_compiled;

/* src with each name in it replaced by to and, when skip_comment, without
 * its leading comment; malloc'd (NULL when out of memory) */
static char *emu_renamed(const char *src, const char *name, const char *to, int skip_comment) {
    if (skip_comment && strncmp(src, "/*", 2) == 0 && strstr(src, "*/")) src = strstr(src, "*/") + 2;
    size_t ln = strlen(name), lt = strlen(to), n = 0, o = 0;
    for (const char *p = ln ? strstr(src, name) : NULL; p; p = strstr(p + ln, name)) n++;
    char *c = (char *)malloc(strlen(src) + n * lt + 1);
    if (!c) return NULL;
    while (*src) {
        if (ln && strncmp(src, name, ln) == 0) {
            memcpy(c + o, to, lt);
            o += lt;
            src += ln;
        } else {
            c[o++] = *src++;
        }
    }
    c[o] = 0;
    return c;
}

static char *emu_code(const char *src, const char *name) { return emu_renamed(src, name, "@", 1); }

static unsigned long long emu_hash(const char *s) {
    unsigned long long h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* the index in emu_lib of code, or -1 */
static int emu_lib_find(const char *code, unsigned long long h) {
    for (int j = 0; j < emu_lib_n; j++)
        if (emu_lib[j].hash == h && strcmp(emu_lib[j].code, code) == 0) return j;
    return -1;
}

static void emu_free(emu_module *m) {
    free(m->run);
    free(m->dims);
    memset(m, 0, sizeof *m);
}

/* "-fsanitize=alignment" where g++ builds a shared object with it, else ""
 * (said once) */
static const char *emu_sanitize(void) {
    static int known, ok;
    if (!known) {
        known = 1;
        ok = system("echo 'int f(int *p) { return *p; }' | g++ -x c++ -fPIC -shared "
                    "-fsanitize=alignment - -o /dev/null > /dev/null 2>&1") == 0;
        if (!ok) printf("note: g++ cannot link -fsanitize=alignment (libubsan); the kernels' "
                        "vector accesses are not checked for alignment\n");
    }
    return ok ? "-fsanitize=alignment" : "";
}

/* Queues the codes of k[0..n) that are neither built nor queued. 0, or -1
 * when out of memory. */
static int emu_add(const mpt_cuda_kernel_src *k, int n) {
    for (int i = 0; i < n; i++) {
        char *code = emu_code(k[i].source, k[i].name);
        if (!code) return -1;
        unsigned long long h = emu_hash(code);
        int seen = emu_lib_find(code, h) >= 0;
        for (int j = 0; !seen && j < emu_pending_n; j++) seen = strcmp(emu_pending[j].code, code) == 0;
        if (seen) {
            free(code);
            continue;
        }
        if (emu_pending_n == emu_pending_cap) {
            int c = emu_pending_cap ? 2 * emu_pending_cap : 256;
            emu_todo *g = (emu_todo *)realloc(emu_pending, (size_t)c * sizeof *g);
            if (!g) { free(code); return -1; }
            emu_pending = g;
            emu_pending_cap = c;
        }
        char *name = strdup(k[i].name);
        if (!name) { free(code); return -1; }
        emu_pending[emu_pending_n++] = (emu_todo){code, name, emu_uses_fibers(k[i].source)};
    }
    return 0;
}

static void emu_pending_clear(void) {
    for (int i = 0; i < emu_pending_n; i++) {
        free(emu_pending[i].code);
        free(emu_pending[i].name);
    }
    emu_pending_n = 0;
}

/* Compiles the queued codes into one shared object, from C++ files of at
 * most 48 kernels (at least one file per core) compiled side by side, one
 * per core, loads it for good and adds the codes to emu_lib. 0, or -1 with
 * the reason. */
static int emu_build_pending(char *err, size_t en) {
    int n = emu_pending_n;
    if (n == 0) return 0;
    char dir[PATH_MAX], path[PATH_MAX + 32], inc[PATH_MAX];
    snprintf(dir, sizeof dir, "/tmp/mptc-emu-XXXXXX");
    if (!mkdtemp(dir)) {
        snprintf(err, en, "mkdtemp failed");
        return -1;
    }
    /* the header beside this file */
    char here[PATH_MAX];
    snprintf(here, sizeof here, "%s", __FILE__);
    char *slash = strrchr(here, '/');
    if (slash) *slash = 0;
    else snprintf(here, sizeof here, ".");
    if (!realpath(here, inc)) { snprintf(err, en, "%.300s: no such directory", here); return -1; }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int jobs = cores < 1 ? 1 : cores > 16 ? 16 : (int)cores;
    int parts = (n + 47) / 48;
    if (parts < jobs) parts = jobs < n ? jobs : n;
    for (int part = 0; part < parts; part++) {
        snprintf(path, sizeof path, "%s/k%d.cpp", dir, part);
        FILE *f = fopen(path, "w");
        if (!f) { snprintf(err, en, "cannot write %.300s", path); return -1; }
        /* the prelude once, then each kernel without it */
        fprintf(f, "#include \"cuda_host.hpp\"\n");
        emu_rewrite(mpt_cu_prelude, f);
        for (int i = part; i < n; i += parts) {
            char entry[32];
            snprintf(entry, sizeof entry, "mpth_kernel_%d", i);
            char *named = emu_renamed(emu_pending[i].code, "@", entry, 0);
            char *body = named ? emu_fresh_shared(named) : NULL;
            free(named);
            char *pre = body ? strstr(body, mpt_cu_prelude) : NULL;
            if (pre) memmove(pre, pre + strlen(mpt_cu_prelude), strlen(pre + strlen(mpt_cu_prelude)) + 1);
            fprintf(f, "namespace mpk%d {\n", i);
            int bad = !body || emu_rewrite(body, f);
            free(body);
            if (bad) {
                fclose(f);
                snprintf(err, en, "kernel %s: an asm statement or a __shared__ declaration "
                         "cuda_emu.h cannot parse", emu_pending[i].name);
                return -1;
            }
            fprintf(f, "}\nextern \"C\" int mpth_run_%d(void **a, const unsigned *d, char *err, "
                       "unsigned long n) {\n"
                       "    return mpth_launch(mpth_thunk(mpk%d::%s), a, dim3{d[0], d[1], d[2]}, "
                       "dim3{d[3], d[4], d[5]}, d[6], %d, err, n);\n}\n",
                    i, i, entry, emu_pending[i].fibers);
        }
        fclose(f);
    }
    /* cd dir; ls k*.cpp | xargs -P jobs (g++ -c kN.cpp) && g++ -shared k*.o */
    size_t cap = strlen(dir) + strlen(inc) + 1024;
    char *cmd = (char *)malloc(cap);
    if (!cmd) { snprintf(err, en, "out of memory"); return -1; }
    snprintf(cmd, cap,
             "cd '%s' && ls k*.cpp | xargs -P %d -I@ sh -c 'g++ -std=c++17 -O1 -w -fPIC %s "
             "-fno-sanitize-recover=all -I\"%s\" -c @ -o @.o > @.log 2>&1 || touch failed' && "
             "[ ! -e failed ] && g++ -shared %s k*.o -o k.so > log 2>&1",
             dir, jobs, emu_sanitize(), inc, emu_sanitize());
    int rc = system(cmd);
    free(cmd);
    if (rc != 0) {
        char line[600] = "";
        for (int part = 0; part <= parts && !line[0]; part++) {
            if (part < parts) snprintf(path, sizeof path, "%s/k%d.cpp.log", dir, part);
            else snprintf(path, sizeof path, "%s/log", dir);
            FILE *l = fopen(path, "r");
            if (!l) continue;
            while (fgets(line, sizeof line, l) && !strstr(line, "error")) line[0] = 0;
            fclose(l);
        }
        /* the directory is kept for reading */
        snprintf(err, en, "g++ failed on the generated kernels (%.200s): %.600s", dir, line);
        return -1;
    }
    snprintf(path, sizeof path, "%s/k.so", dir);
    /* loaded for good: later plans run these builds too */
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        snprintf(err, en, "dlopen %.300s: %.300s", path, dlerror());
        return -1;
    }
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    if (system(path)) {}
    if (emu_lib_n + n > emu_lib_cap) {
        int c = (emu_lib_n + n) * 2;
        emu_built *g = (emu_built *)realloc(emu_lib, (size_t)c * sizeof *g);
        if (!g) { snprintf(err, en, "out of memory"); return -1; }
        emu_lib = g;
        emu_lib_cap = c;
    }
    for (int i = 0; i < n; i++) {
        char sym[32];
        snprintf(sym, sizeof sym, "mpth_run_%d", i);
        emu_entry run = (emu_entry)dlsym(so, sym);
        if (!run) { snprintf(err, en, "%s not in the shared object", sym); return -1; }
        emu_lib[emu_lib_n++] = (emu_built){emu_hash(emu_pending[i].code), emu_pending[i].code, run};
        emu_pending[i].code = NULL; /* emu_lib's now */
    }
    emu_kernels_compiled += n;
    emu_pending_clear();
    return 0;
}

/* Gives m the host builds of k[0..n), compiling the codes this process has
 * not built yet (and any queued by emu_add). 0, or -1 with the reason. */
static int emu_build(emu_module *m, const mpt_cuda_kernel_src *k, int n, char *err, size_t en) {
    memset(m, 0, sizeof *m);
    m->run = (emu_entry *)calloc((size_t)n + 1, sizeof *m->run);
    m->dims = (unsigned(*)[7])calloc((size_t)n + 1, sizeof *m->dims);
    if (!m->run || !m->dims || emu_add(k, n)) {
        emu_free(m);
        snprintf(err, en, "out of memory");
        return -1;
    }
    if (emu_build_pending(err, en)) {
        emu_pending_clear();
        emu_free(m);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char *code = emu_code(k[i].source, k[i].name);
        int j = code ? emu_lib_find(code, emu_hash(code)) : -1;
        free(code);
        if (j < 0) {
            snprintf(err, en, "kernel %s: no host build", k[i].name);
            emu_free(m);
            return -1;
        }
        m->run[i] = emu_lib[j].run;
        unsigned d[7] = {k[i].grid[0], k[i].grid[1], k[i].grid[2], k[i].block[0],
                         k[i].block[1], k[i].block[2], k[i].shared_bytes};
        memcpy(m->dims[i], d, sizeof d);
    }
    m->n = n;
    return 0;
}

static inline int emu_launch(emu_module *m, int i, void **args, char *err, size_t en) {
    return m->run[i](args, m->dims[i], err, en);
}

/* ---- test data ---- */

/* An interpreter on_node hook: a copy of every node's value into
 * ((mpt_tensor *)ctx)[id], the kernels' reference values. */
static inline int emu_capture(void *ctx, const mpt_graph *g, int id, const mpt_tensor *v) {
    (void)g;
    mpt_tensor *vals = (mpt_tensor *)ctx;
    if (mpt_tensor_alloc(&vals[id], v->dtype, v->shape)) return 1;
    memcpy(vals[id].data, v->data, mpt_tensor_bytes(v));
    return 0;
}

/* Inputs of g into in[] (allocated here): floats in [-1, 1), i32 (class or
 * token ids) in [0, 4), below every example's smallest class count. */
static inline void emu_fill_inputs(const mpt_graph *g, mpt_tensor *in, unsigned seed) {
    for (int k = 0; k < mpt_graph_n_inputs(g); k++) {
        const mpt_node *nd = &g->nodes[mpt_graph_input_node(g, k)];
        mpt_tensor_alloc(&in[k], nd->dtype, nd->shape);
        for (int64_t i = 0; i < mpt_shape_numel(nd->shape); i++) {
            seed = seed * 1103515245u + 12345u;
            double u = (double)((seed >> 8) & 0xffffff) / 16777216.0;
            mpt_tensor_set(&in[k], i, nd->dtype == MPT_DT_I32 ? floor(u * 4) : 2 * u - 1);
        }
    }
}

/* ---- guarded buffers ---- */

/* bytes of memory ending right before an inaccessible page, 64-byte
 * aligned as the memory plan aligns (so up to 63 bytes of slack remain) */
static inline void *emu_buffer(size_t bytes, void **map, size_t *map_len) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t body = (bytes + 63) / 64 * 64;
    size_t len = (body + page - 1) / page * page + page;
    char *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) return NULL;
    mprotect(b + len - page, page, PROT_NONE);
    *map = b;
    *map_len = len;
    return b + len - page - body;
}

#endif
