/* codegen/cpu/pool.c — a persistent pthread pool for the CPU kernels.
 *
 * Workers are created once. Each mpt_pool_run publishes a job by bumping a
 * generation counter; workers spin on it for a short while (a training step
 * launches kernels back to back, and a sleeping thread takes tens of
 * microseconds to wake) and then sleep on a condition variable. Tasks are
 * handed out through an atomic counter; the caller works too and then waits
 * for the last worker to finish. Workers take the caller's floating-point
 * control word (MXCSR) for each job, so a job runs alike on every thread. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <xmmintrin.h>

#include "codegen/cpu/cpu.h"

#include <time.h>

/* A waiting thread first spins SPIN_ITERS bare looks (about 33 us here),
 * then yields between looks for up to YIELD_NS, then sleeps. The yields
 * keep it awake through the gaps that small single-threaded kernels leave
 * between parallel ones, while leaving the core to any other runnable
 * thread: a bare spin of 2 ms made a step 5x slower beside a compiler.
 * GPT at context 512 on 2 quiet threads: with the 33 us spin alone the
 * worker slept about 10 times a step and the caller waited on the
 * condition 11 times; the step went from 76.4-83.7 to 74.2-77.4 ms (four
 * runs each, interleaved); beside a compiler on the other core, 164-167
 * against 166-169 ms; the MLP did not move. */
enum { SPIN_ITERS = 1 << 16, YIELD_NS = 400000 };

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

struct mpt_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    /* the published job */
    void (*fn)(void *ctx, int task, int thread);
    void *ctx;
    int n_tasks;
    atomic_int next_task;
    atomic_int busy;       /* workers still inside the current job */
    atomic_uint generation; /* bumped once per job */
    unsigned csr;           /* the caller's MXCSR for the current job */
    atomic_int stop;
};

typedef struct {
    mpt_pool *pool;
    int index;
} worker_arg;

#define PTHREAD_CHECK(stmt)                                                                \
    do {                                                                                   \
        int rc_ = (stmt);                                                                  \
        if (rc_) {                                                                         \
            fprintf(stderr, "%s:%d: %s: %s failed (%d)\n", __FILE__, __LINE__, __func__,   \
                    #stmt, rc_);                                                           \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

static void run_tasks(mpt_pool *p, int thread) {
    int t;
    while ((t = atomic_fetch_add(&p->next_task, 1)) < p->n_tasks)
        p->fn(p->ctx, t, thread);
}

static void *worker_main(void *varg) {
    worker_arg *arg = varg;
    mpt_pool *p = arg->pool;
    int index = arg->index;
    free(arg);
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop) &&
               spins < SPIN_ITERS)
            spins++;
        if (gen == seen && !atomic_load(&p->stop))
            for (int64_t t0 = now_ns(); (gen = atomic_load(&p->generation)) == seen &&
                                        !atomic_load(&p->stop) && now_ns() - t0 < YIELD_NS;)
                sched_yield();
        if (gen == seen && !atomic_load(&p->stop)) {
            PTHREAD_CHECK(pthread_mutex_lock(&p->mu));
            while ((gen = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop))
                PTHREAD_CHECK(pthread_cond_wait(&p->wake, &p->mu));
            PTHREAD_CHECK(pthread_mutex_unlock(&p->mu));
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = gen;
        if (_mm_getcsr() != p->csr) _mm_setcsr(p->csr);
        run_tasks(p, index);
        if (atomic_fetch_sub(&p->busy, 1) == 1) {
            PTHREAD_CHECK(pthread_mutex_lock(&p->mu));
            PTHREAD_CHECK(pthread_cond_signal(&p->done));
            PTHREAD_CHECK(pthread_mutex_unlock(&p->mu));
        }
    }
}

/* The default is the cores this process may run on, not the machine's:
 * under `taskset -c 1` two spinning workers on one core take turns, and a
 * step ran 1.5-2x slower than with one thread. */
static int usable_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 0 ? (int)cores : 1;
}

mpt_pool *mpt_pool_new(int n_threads) {
    if (n_threads <= 0)
        n_threads = usable_cores();
    mpt_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n_threads = n_threads;
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return NULL;
    }
    PTHREAD_CHECK(pthread_mutex_init(&p->mu, NULL));
    PTHREAD_CHECK(pthread_cond_init(&p->wake, NULL));
    PTHREAD_CHECK(pthread_cond_init(&p->done, NULL));
    for (int i = 1; i < n_threads; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (arg) {
            arg->pool = p;
            arg->index = i;
        }
        if (!arg || pthread_create(&p->threads[i], NULL, worker_main, arg)) {
            free(arg);
            p->n_threads = i; /* run with the workers we got */
            break;
        }
    }
    return p;
}

void mpt_pool_free(mpt_pool *p) {
    if (!p)
        return;
    PTHREAD_CHECK(pthread_mutex_lock(&p->mu));
    atomic_store(&p->stop, 1);
    PTHREAD_CHECK(pthread_cond_broadcast(&p->wake));
    PTHREAD_CHECK(pthread_mutex_unlock(&p->mu));
    for (int i = 1; i < p->n_threads; i++)
        PTHREAD_CHECK(pthread_join(p->threads[i], NULL));
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int mpt_pool_threads(const mpt_pool *p) { return p ? p->n_threads : 1; }

void mpt_pool_run(mpt_pool *p, int n_tasks, void (*fn)(void *ctx, int task, int thread),
                  void *ctx) {
    if (!p || p->n_threads == 1 || n_tasks <= 1) {
        for (int t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    p->csr = _mm_getcsr();
    atomic_store(&p->next_task, 0);
    atomic_store(&p->busy, p->n_threads - 1);
    PTHREAD_CHECK(pthread_mutex_lock(&p->mu));
    atomic_fetch_add(&p->generation, 1);
    PTHREAD_CHECK(pthread_cond_broadcast(&p->wake));
    PTHREAD_CHECK(pthread_mutex_unlock(&p->mu));
    run_tasks(p, 0);
    for (int spins = 0; atomic_load(&p->busy) > 0 && spins < SPIN_ITERS; spins++)
        ;
    if (atomic_load(&p->busy) > 0)
        for (int64_t t0 = now_ns(); atomic_load(&p->busy) > 0 && now_ns() - t0 < YIELD_NS;)
            sched_yield();
    if (atomic_load(&p->busy) > 0) {
        PTHREAD_CHECK(pthread_mutex_lock(&p->mu));
        while (atomic_load(&p->busy) > 0)
            PTHREAD_CHECK(pthread_cond_wait(&p->done, &p->mu));
        PTHREAD_CHECK(pthread_mutex_unlock(&p->mu));
    }
}

/* MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6) */
enum { CSR_FTZ_DAZ = 0x8040 };

unsigned mpt_cpu_denormals_begin(int flush) {
    unsigned old = _mm_getcsr();
    unsigned want = flush ? old | CSR_FTZ_DAZ : old & ~(unsigned)CSR_FTZ_DAZ;
    if (want != old) _mm_setcsr(want);
    return old;
}

void mpt_cpu_denormals_end(unsigned old) {
    if (_mm_getcsr() != old) _mm_setcsr(old);
}
