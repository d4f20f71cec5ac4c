/* codegen/cpu/jit.c — the ORC LLJIT every CPU kernel goes through.
 *
 * One JIT targets one CPU: the host's own name and feature string (so LLVM
 * schedules and selects instructions for exactly this machine), or a named
 * older CPU when a test forces a smaller ISA. Each module is verified, run
 * through the new pass manager's default<O3> pipeline with loop and SLP
 * vectorisation, and then added to the JIT as a thread-safe module. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/ExecutionEngine.h>
#include <llvm-c/Object.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/OrcEE.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <llvm/Config/llvm-config.h>

#include "codegen/cpu/cpu_backend.h"
#include "codegen/cpu/cpu_internal.h"
#include "codegen/kcache.h"

struct mpt_cpu_jit {
    LLVMOrcLLJITRef jit;
    LLVMOrcThreadSafeContextRef tsc;
    LLVMTargetMachineRef tm; /* a twin of the JIT's own: passes and asm output */
    char *triple, *cpu, *features;
    mpt_cpu_isa isa;
    int fma, f16c, bf16_dot, amx;
    double compile_seconds;
    int next_id;
};

int mpt_llvm_check_error(LLVMErrorRef e, const char *stmt, const char *func, const char *file,
                         int line, char *err, size_t n) {
    if (!e)
        return 0;
    char *msg = LLVMGetErrorMessage(e);
    snprintf(err, n, "%s:%d: %s: %s: %s", file, line, func, stmt, msg);
    LLVMDisposeErrorMessage(msg);
    return -1;
}

int mpt_llvm_check_flag(int failed, char *msg, const char *stmt, const char *func,
                        const char *file, int line, char *err, size_t n) {
    if (failed)
        snprintf(err, n, "%s:%d: %s: %s: %s", file, line, func, stmt, msg ? msg : "failed");
    if (msg)
        LLVMDisposeMessage(msg);
    return failed ? -1 : 0;
}

const char *mpt_cpu_isa_name(mpt_cpu_isa isa) {
    switch (isa) {
    case MPT_CPU_ISA_HOST: return "host";
    case MPT_CPU_ISA_SSE: return "sse";
    case MPT_CPU_ISA_AVX2: return "avx2";
    case MPT_CPU_ISA_AVX512: return "avx512";
    }
    return "?";
}

/* 1 if LLVM's feature string ("+avx2,-avx512f,...") enables feature. */
static int has_feature(const char *features, const char *feature) {
    size_t len = strlen(feature);
    for (const char *p = features; (p = strstr(p, feature)) != NULL; p += len) {
        int starts = p > features && p[-1] == '+';
        int ends = p[len] == ',' || p[len] == '\0';
        if (starts && ends)
            return 1;
    }
    return 0;
}

/* Linux hands out AMX tile state only to processes that ask for it
 * (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); the permission is
 * process-wide and asked for once. 0 when granted, else the errno. */
enum { ARCH_REQ_XCOMP_PERM_ = 0x1023, XFEATURE_XTILEDATA_ = 18 };
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static int amx_errno = ENOSYS;

static void request_amx(void) {
#ifdef SYS_arch_prctl
    amx_errno = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_, XFEATURE_XTILEDATA_) ? errno : 0;
#endif
}

/* 1 when the host has AMX-BF16 and the kernel lets this process use it;
 * *why says which of the two failed otherwise. */
static int host_amx(const char *features, const char **why) {
    if (!has_feature(features, "amx-tile") || !has_feature(features, "amx-bf16")) {
        *why = "not on this CPU";
        return 0;
    }
    if (getenv("MPT_CPU_NO_AMX")) {
        *why = "off: MPT_CPU_NO_AMX is set";
        return 0;
    }
    pthread_once(&amx_once, request_amx);
    if (amx_errno) {
        *why = "the kernel refused tile state (arch_prctl); using vdpbf16ps";
        return 0;
    }
    *why = "in use for bf16 GEMM";
    return 1;
}

char *mpt_cpu_host_features(char *buf, size_t n) {
    static const char *const key[] = {"avx2",     "fma",      "f16c",        "avx512f",
                                      "avx512bw", "avx512vl", "avx512bf16", "avx512fp16",
                                      "amx-bf16"};
    char *name = LLVMGetHostCPUName();
    char *features = LLVMGetHostCPUFeatures();
    size_t used = (size_t)snprintf(buf, n, "%s:", name);
    for (size_t i = 0; i < sizeof key / sizeof key[0] && used < n; i++)
        if (has_feature(features, key[i]))
            used += (size_t)snprintf(buf + used, n - used, " %s", key[i]);
    const char *why;
    if (has_feature(features, "amx-bf16") && used < n) {
        host_amx(features, &why);
        snprintf(buf + used, n - used, " (amx %s)", why);
    }
    LLVMDisposeMessage(name);
    LLVMDisposeMessage(features);
    return buf;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Picks the CPU name and features for isa; fails if the host cannot run it. */
static int choose_target(mpt_cpu_jit *j, mpt_cpu_isa isa, char *err, size_t n) {
    char *host_cpu = LLVMGetHostCPUName();
    char *host_features = LLVMGetHostCPUFeatures();
    int host_avx512 = has_feature(host_features, "avx512f") &&
                      has_feature(host_features, "avx512bw") &&
                      has_feature(host_features, "avx512vl");
    int host_avx2 = has_feature(host_features, "avx2") && has_feature(host_features, "fma") &&
                    has_feature(host_features, "f16c");
    int ok = 1;
    switch (isa) {
    case MPT_CPU_ISA_HOST:
        j->isa = host_avx512 ? MPT_CPU_ISA_AVX512
                 : host_avx2 ? MPT_CPU_ISA_AVX2
                             : MPT_CPU_ISA_SSE;
        j->cpu = strdup(host_cpu);
        j->features = strdup(host_features);
        break;
    case MPT_CPU_ISA_AVX512:
        ok = host_avx512;
        j->isa = isa;
        j->cpu = strdup(host_cpu);
        j->features = strdup(host_features);
        break;
    case MPT_CPU_ISA_AVX2:
        ok = host_avx2;
        j->isa = isa;
        j->cpu = strdup("haswell");
        j->features = strdup("");
        break;
    case MPT_CPU_ISA_SSE:
        j->isa = isa;
        j->cpu = strdup("x86-64");
        j->features = strdup("");
        break;
    }
    if (j->isa == MPT_CPU_ISA_AVX512) {
        j->fma = j->f16c = 1;
        j->bf16_dot = has_feature(host_features, "avx512bf16");
        /* a forced AVX512 JIT keeps to vdpbf16ps, so tests can compare the two */
        const char *why;
        j->amx = isa == MPT_CPU_ISA_HOST && host_amx(host_features, &why);
    } else {
        j->fma = j->f16c = j->isa == MPT_CPU_ISA_AVX2;
        j->bf16_dot = 0;
    }
    LLVMDisposeMessage(host_cpu);
    LLVMDisposeMessage(host_features);
    if (!ok) {
        snprintf(err, n,
                 "this CPU cannot run %s code (hint: use the host ISA, or a smaller one)",
                 mpt_cpu_isa_name(isa));
        return -1;
    }
    return 0;
}

static LLVMTargetMachineRef create_tm(mpt_cpu_jit *j, char *err, size_t n) {
    LLVMTargetRef target;
    char *msg;
    MPT_LLVM_TRY_MSG(LLVMGetTargetFromTriple(j->triple, &target, &msg), msg);
    return LLVMCreateTargetMachine(target, j->triple, j->cpu, j->features,
                                   LLVMCodeGenLevelAggressive, LLVMRelocDefault,
                                   LLVMCodeModelJITDefault);
fail:
    return NULL;
}

/* MPTC_PERF_JIT=1: the object layer reports every compiled function to
 * LLVM's perf listener, which writes jit-PID.dump for `perf inject --jit`,
 * so `perf report` names generated kernels (docs/PROFILING.md). The layer
 * is the RTDyld one LLJIT would pick on x86-64 Linux anyway. */
static LLVMOrcObjectLayerRef perf_object_layer(void *ctx, LLVMOrcExecutionSessionRef es,
                                               const char *triple) {
    LLVMOrcObjectLayerRef layer = LLVMOrcCreateRTDyldObjectLinkingLayerWithSectionMemoryManager(es);
    LLVMJITEventListenerRef perf = LLVMCreatePerfJITEventListener();
    if (perf)
        LLVMOrcRTDyldObjectLinkingLayerRegisterJITEventListener(layer, perf);
    else
        fprintf(stderr, "mptc: MPTC_PERF_JIT is set but this LLVM has no perf listener "
                        "(hint: an LLVM built with LLVM_USE_PERF)\n");
    return layer;
}

/* Without F16C (MPTC_CPU_ISA=sse, or an x86-64 host that lacks it) LLVM 14
 * lowers f32 <-> f16 conversions to calls of __gnu_h2f_ieee and
 * __gnu_f2h_ieee, the half passed as a 16-bit integer; x86's libgcc has
 * neither, so every kernel touching an f16 failed to link. They are
 * defined here by the project's own exact conversions (round to nearest
 * even, as F16C's vcvtps2ph with the rounding the generated code asks for).
 * The GEMM epilogue's exact f16/bf16 GELU tables are defined here too, as
 * data symbols, so that cached object code finds them in any process. */
static float jit_h2f(uint16_t h) { return mpt_f16_to_f32(h); }
static uint16_t jit_f2h(float f) { return mpt_f32_to_f16(f); }

static LLVMErrorRef define_symbols(mpt_cpu_jit *j) {
    LLVMJITSymbolFlags fl = {LLVMJITSymbolGenericFlagsExported | LLVMJITSymbolGenericFlagsCallable, 0};
    LLVMJITCSymbolMapPair syms[2] = {
        {LLVMOrcLLJITMangleAndIntern(j->jit, "__gnu_h2f_ieee"),
         {(LLVMOrcExecutorAddress)(uintptr_t)jit_h2f, fl}},
        {LLVMOrcLLJITMangleAndIntern(j->jit, "__gnu_f2h_ieee"),
         {(LLVMOrcExecutorAddress)(uintptr_t)jit_f2h, fl}},
    };
    LLVMErrorRef e =
        LLVMOrcJITDylibDefine(LLVMOrcLLJITGetMainJITDylib(j->jit), LLVMOrcAbsoluteSymbols(syms, 2));
    if (e)
        return e;
    /* the exact f16/bf16 GELU tables (gelu_table.c), data the epilogue reads */
    const char *names[4];
    const void *addrs[4];
    int n_tables = mpt_cpu_gelu_tables(names, addrs);
    LLVMJITCSymbolMapPair tabs[4];
    LLVMJITSymbolFlags data = {LLVMJITSymbolGenericFlagsExported, 0};
    for (int i = 0; i < n_tables; i++)
        tabs[i] = (LLVMJITCSymbolMapPair){LLVMOrcLLJITMangleAndIntern(j->jit, names[i]),
                                          {(LLVMOrcExecutorAddress)(uintptr_t)addrs[i], data}};
    return LLVMOrcJITDylibDefine(LLVMOrcLLJITGetMainJITDylib(j->jit),
                                 LLVMOrcAbsoluteSymbols(tabs, (size_t)n_tables));
}

mpt_cpu_jit *mpt_cpu_jit_new(mpt_cpu_isa isa, char *err, size_t n) {
    mpt_cpu_jit *j = calloc(1, sizeof *j);
    LLVMOrcJITTargetMachineBuilderRef jtmb = NULL;
    LLVMOrcLLJITBuilderRef builder = NULL;
    LLVMOrcDefinitionGeneratorRef gen = NULL;
    if (!j) {
        snprintf(err, n, "out of memory creating the CPU JIT");
        return NULL;
    }
    if (LLVMInitializeNativeTarget() || LLVMInitializeNativeAsmPrinter() ||
        LLVMInitializeNativeAsmParser()) { /* the parser: inline assembly (gemm_gen.c) */
        snprintf(err, n, "LLVM has no native target for this machine (hint: use --device "
                         "interp, or an LLVM built with the X86 target)");
        goto fail;
    }
    if (choose_target(j, isa, err, n))
        goto fail;
    j->triple = LLVMGetDefaultTargetTriple();
    LLVMTargetMachineRef jit_tm = create_tm(j, err, n);
    if (!jit_tm || !(j->tm = create_tm(j, err, n))) {
        if (jit_tm)
            LLVMDisposeTargetMachine(jit_tm);
        goto fail;
    }
    jtmb = LLVMOrcJITTargetMachineBuilderCreateFromTargetMachine(jit_tm);
    builder = LLVMOrcCreateLLJITBuilder();
    LLVMOrcLLJITBuilderSetJITTargetMachineBuilder(builder, jtmb);
    jtmb = NULL;
    const char *perf = getenv("MPTC_PERF_JIT");
    if (perf && *perf && strcmp(perf, "0"))
        LLVMOrcLLJITBuilderSetObjectLinkingLayerCreator(builder, perf_object_layer, NULL);
    LLVMErrorRef e = LLVMOrcCreateLLJIT(&j->jit, builder);
    builder = NULL; /* consumed, also on failure */
    MPT_LLVM_TRY(e);
    /* generated code may call memset/memcpy and libm */
    MPT_LLVM_TRY(LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
        &gen, LLVMOrcLLJITGetGlobalPrefix(j->jit), NULL, NULL));
    LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(j->jit), gen);
    MPT_LLVM_TRY(define_symbols(j));
    j->tsc = LLVMOrcCreateNewThreadSafeContext();
    return j;
fail:
    if (jtmb)
        LLVMOrcDisposeJITTargetMachineBuilder(jtmb);
    if (builder)
        LLVMOrcDisposeLLJITBuilder(builder);
    mpt_cpu_jit_free(j);
    return NULL;
}

void mpt_cpu_jit_free(mpt_cpu_jit *j) {
    if (!j)
        return;
    if (j->jit) {
        LLVMErrorRef e = LLVMOrcDisposeLLJIT(j->jit);
        if (e) {
            char *msg = LLVMGetErrorMessage(e);
            fprintf(stderr, "%s:%d: LLVMOrcDisposeLLJIT: %s\n", __FILE__, __LINE__, msg);
            LLVMDisposeErrorMessage(msg);
        }
    }
    if (j->tsc)
        LLVMOrcDisposeThreadSafeContext(j->tsc);
    if (j->tm)
        LLVMDisposeTargetMachine(j->tm);
    LLVMDisposeMessage(j->triple);
    free(j->cpu);
    free(j->features);
    free(j);
}

mpt_cpu_isa mpt_cpu_jit_isa(const mpt_cpu_jit *j) { return j->isa; }
int mpt_cpu_jit_has_bf16_dot(const mpt_cpu_jit *j) { return j->bf16_dot; }
int mpt_cpu_jit_has_amx(const mpt_cpu_jit *j) { return j->amx; }
int mpt_cpu_jit_has_fma(const mpt_cpu_jit *j) { return j->fma; }
int mpt_cpu_jit_has_f16c(const mpt_cpu_jit *j) { return j->f16c; }
double mpt_cpu_jit_compile_seconds(const mpt_cpu_jit *j) { return j->compile_seconds; }
int mpt_cpu_jit_next_id(mpt_cpu_jit *j) { return j->next_id++; }
LLVMContextRef mpt_cpu_jit_context(mpt_cpu_jit *j) {
    return LLVMOrcThreadSafeContextGetContext(j->tsc);
}

int mpt_cpu_jit_vector_lanes(const mpt_cpu_jit *j) {
    switch (j->isa) {
    case MPT_CPU_ISA_AVX512: return 16;
    case MPT_CPU_ISA_AVX2: return 8;
    case MPT_CPU_ISA_SSE:
    case MPT_CPU_ISA_HOST: return 4;
    }
    return 4;
}

LLVMModuleRef mpt_cpu_jit_module_new(mpt_cpu_jit *j, const char *name) {
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext(name, mpt_cpu_jit_context(j));
    LLVMTargetDataRef dl = LLVMCreateTargetDataLayout(j->tm);
    LLVMSetModuleDataLayout(m, dl);
    LLVMDisposeTargetData(dl);
    LLVMSetTarget(m, j->triple);
    return m;
}

static void add_string_attr(LLVMValueRef fn, const char *key, const char *value) {
    LLVMContextRef c = LLVMGetModuleContext(LLVMGetGlobalParent(fn));
    LLVMAttributeRef a = LLVMCreateStringAttribute(c, key, (unsigned)strlen(key), value,
                                                   (unsigned)strlen(value));
    LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex, a);
}

void mpt_cpu_jit_set_fn_attrs(mpt_cpu_jit *j, LLVMValueRef fn) {
    add_string_attr(fn, "target-cpu", j->cpu);
    add_string_attr(fn, "target-features", j->features);
    /* Without these, CPUs tuned "prefer-256-bit" (Skylake-X and later) split
     * our explicit <16 x float> vectors into two ymm halves. */
    if (j->isa == MPT_CPU_ISA_AVX512) {
        add_string_attr(fn, "min-legal-vector-width", "512");
        add_string_attr(fn, "prefer-vector-width", "512");
    }
}

static char *emit_asm(mpt_cpu_jit *j, LLVMModuleRef m, char *err, size_t n) {
    /* codegen rewrites the IR it is given, so it gets a copy */
    LLVMModuleRef copy = LLVMCloneModule(m);
    LLVMMemoryBufferRef buf = NULL;
    char *msg, *text = NULL;
    MPT_LLVM_TRY_MSG(LLVMTargetMachineEmitToMemoryBuffer(j->tm, copy, LLVMAssemblyFile, &msg,
                                                         &buf),
                     msg);
    size_t len = LLVMGetBufferSize(buf);
    text = malloc(len + 1);
    if (text) {
        memcpy(text, LLVMGetBufferStart(buf), len);
        text[len] = '\0';
    }
    LLVMDisposeMemoryBuffer(buf);
fail:
    LLVMDisposeModule(copy);
    return text;
}

static char *copy_message(char *msg) {
    char *s = strdup(msg);
    LLVMDisposeMessage(msg);
    return s;
}

/* ---- the kernel cache ----
 * A module's object code is a function of its IR, the target (triple, CPU,
 * features), LLVM's version and the pipeline below, so it is kept on disk
 * under a hash of those (codegen/kcache.h, directory cpu/) and a later
 * compile of the same IR loads the object instead of optimising and
 * generating code again. Modules whose IR or assembly is asked for (mptc
 * asm) always go through the pipeline. */
static int cache_hits, cache_misses;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

void mpt_cpu_kcache_stats(int *hits, int *misses) {
    pthread_mutex_lock(&cache_lock);
    *hits = cache_hits;
    *misses = cache_misses;
    pthread_mutex_unlock(&cache_lock);
}

static void cache_count(int hit) {
    pthread_mutex_lock(&cache_lock);
    if (hit) cache_hits++;
    else cache_misses++;
    pthread_mutex_unlock(&cache_lock);
}

#define PIPELINE "default<O3> loop-vectorize slp-vectorize unroll interleave v1"

static void cache_path(mpt_cpu_jit *j, LLVMModuleRef m, char *path, size_t n) {
    char *ir = LLVMPrintModuleToString(m), key[33], dir[512];
    const char *parts[] = {ir, j->triple, j->cpu, j->features, "llvm " LLVM_VERSION_STRING,
                           PIPELINE};
    mpt_kcache_key(parts, (int)(sizeof parts / sizeof *parts), key);
    LLVMDisposeMessage(ir);
    snprintf(path, n, "%s/cpu/%s.o", mpt_kcache_dir(dir, sizeof dir), key);
}

/* hands object code to the JIT, which takes the buffer */
static int add_object(mpt_cpu_jit *j, LLVMMemoryBufferRef obj, char *err, size_t n) {
    MPT_LLVM_TRY(LLVMOrcLLJITAddObjectFile(j->jit, LLVMOrcLLJITGetMainJITDylib(j->jit), obj));
    return 0;
fail:
    return -1;
}

int mpt_cpu_jit_add_module(mpt_cpu_jit *j, LLVMModuleRef m, char **ir_text, char **asm_text,
                           char *err, size_t n) {
    double t0 = now_seconds();
    LLVMPassBuilderOptionsRef opts = LLVMCreatePassBuilderOptions();
    char *msg;
    MPT_LLVM_TRY_MSG(LLVMVerifyModule(m, LLVMReturnStatusAction, &msg), msg);
    char path[1024] = "";
    if (!ir_text && !asm_text && mpt_kcache_enabled()) {
        cache_path(j, m, path, sizeof path);
        size_t len = 0;
        char *bytes = mpt_kcache_read(path, &len);
        LLVMMemoryBufferRef obj = NULL;
        if (bytes) {
            obj = LLVMCreateMemoryBufferWithMemoryRangeCopy(bytes, len, path);
            free(bytes);
            /* an entry that does not parse as an object file (cut short, or
             * not ours) is compiled afresh and replaced */
            char *why = NULL;
            LLVMBinaryRef bin = LLVMCreateBinary(obj, LLVMGetModuleContext(m), &why);
            int ok = bin && LLVMBinaryGetType(bin) == LLVMBinaryTypeELF64L;
            if (bin) LLVMDisposeBinary(bin);
            if (why) LLVMDisposeMessage(why);
            if (!ok) {
                LLVMDisposeMemoryBuffer(obj);
                obj = NULL;
            }
        }
        if (obj) {
            LLVMDisposeModule(m);
            m = NULL;
            if (add_object(j, obj, err, n)) goto fail;
            cache_count(1);
            LLVMDisposePassBuilderOptions(opts);
            j->compile_seconds += now_seconds() - t0;
            return 0;
        }
    }
    LLVMPassBuilderOptionsSetLoopVectorization(opts, 1);
    LLVMPassBuilderOptionsSetSLPVectorization(opts, 1);
    LLVMPassBuilderOptionsSetLoopUnrolling(opts, 1);
    LLVMPassBuilderOptionsSetLoopInterleaving(opts, 1);
    MPT_LLVM_TRY(LLVMRunPasses(m, "default<O3>", j->tm, opts));
    if (ir_text)
        *ir_text = copy_message(LLVMPrintModuleToString(m));
    if (asm_text && !(*asm_text = emit_asm(j, m, err, n)))
        goto fail;
    LLVMDisposePassBuilderOptions(opts);
    opts = NULL;
    if (path[0]) {
        /* object code now, kept for the next compile of this IR */
        LLVMMemoryBufferRef obj = NULL;
        MPT_LLVM_TRY_MSG(LLVMTargetMachineEmitToMemoryBuffer(j->tm, m, LLVMObjectFile, &msg, &obj),
                         msg);
        LLVMDisposeModule(m);
        m = NULL;
        mpt_kcache_write(path, LLVMGetBufferStart(obj), LLVMGetBufferSize(obj));
        if (add_object(j, obj, err, n)) goto fail;
        cache_count(0);
        j->compile_seconds += now_seconds() - t0;
        return 0;
    }
    LLVMOrcThreadSafeModuleRef tsm = LLVMOrcCreateNewThreadSafeModule(m, j->tsc);
    m = NULL;
    LLVMErrorRef e = LLVMOrcLLJITAddLLVMIRModule(j->jit, LLVMOrcLLJITGetMainJITDylib(j->jit), tsm);
    if (e)
        LLVMOrcDisposeThreadSafeModule(tsm);
    MPT_LLVM_TRY(e);
    j->compile_seconds += now_seconds() - t0;
    return 0;
fail:
    if (opts)
        LLVMDisposePassBuilderOptions(opts);
    if (m)
        LLVMDisposeModule(m);
    return -1;
}

void *mpt_cpu_jit_lookup(mpt_cpu_jit *j, const char *name, char *err, size_t n) {
    /* ORC compiles lazily per lookup: the machine code generation is timed here */
    double t0 = now_seconds();
    LLVMOrcExecutorAddress addr = 0;
    MPT_LLVM_TRY(LLVMOrcLLJITLookup(j->jit, &addr, name));
    j->compile_seconds += now_seconds() - t0;
    return (void *)(uintptr_t)addr;
fail:
    return NULL;
}
