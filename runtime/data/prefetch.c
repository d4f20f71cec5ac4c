/* runtime/data/prefetch.c — a worker thread that assembles and augments the
 * next training batch while the caller runs the current step.
 *
 * One request at a time: start hands the worker (epoch, index, x, y), wait
 * takes its result back. The worker calls mpt_augment_batch, so a batch is
 * the same whether prefetched or not; its draws depend on the sample only
 * (data.h, Determinism), never on which thread made it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "runtime/data/data_impl.h"

typedef enum { PREFETCH_IDLE, PREFETCH_REQUESTED, PREFETCH_BUSY, PREFETCH_DONE } prefetch_state;

struct mpt_prefetch {
    mpt_dataset *d;
    const mpt_augment *aug;
    uint64_t seed;
    int64_t batch_size;
    int threads;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stop;
    prefetch_state state;
    /* the request, written by start while IDLE */
    int64_t epoch, index;
    mpt_tensor *x, *y;
    /* the result, written by the worker while BUSY */
    int rc;
    int64_t n_real;
    char err[1024];
};

static void *prefetch_main(void *arg) {
    mpt_prefetch *p = arg;
    MPT_DATA_CHECK(pthread_mutex_lock(&p->lock));
    while (!p->stop || p->state == PREFETCH_REQUESTED) {
        if (p->state != PREFETCH_REQUESTED) {
            MPT_DATA_CHECK(pthread_cond_wait(&p->cond, &p->lock));
            continue;
        }
        p->state = PREFETCH_BUSY;
        MPT_DATA_CHECK(pthread_mutex_unlock(&p->lock));
        /* While BUSY only this thread touches the request and the result. */
        p->n_real = 0;
        p->rc = mpt_augment_batch(p->aug, p->d, p->seed, p->epoch, p->index, p->batch_size,
                                  p->threads, p->x, p->y, &p->n_real, p->err, sizeof p->err);
        MPT_DATA_CHECK(pthread_mutex_lock(&p->lock));
        p->state = PREFETCH_DONE;
        MPT_DATA_CHECK(pthread_cond_broadcast(&p->cond));
    }
    MPT_DATA_CHECK(pthread_mutex_unlock(&p->lock));
    return NULL;
}

mpt_prefetch *mpt_prefetch_new(mpt_dataset *d, int64_t batch_size, const mpt_augment *aug,
                               uint64_t seed, int threads, char *err, size_t n) {
    mpt_prefetch *p = calloc(1, sizeof *p);
    p->d = d;
    p->aug = aug;
    p->seed = seed;
    p->batch_size = batch_size;
    p->threads = threads;
    MPT_DATA_CHECK(pthread_mutex_init(&p->lock, NULL));
    MPT_DATA_CHECK(pthread_cond_init(&p->cond, NULL));
    int rc = pthread_create(&p->thread, NULL, prefetch_main, p);
    if (rc) {
        mpt_data_fail(err, n, "cannot start the batch prefetch thread (%s)\n  hint: the "
                      "system is out of threads or memory", strerror(rc));
        MPT_DATA_CHECK(pthread_cond_destroy(&p->cond));
        MPT_DATA_CHECK(pthread_mutex_destroy(&p->lock));
        free(p);
        return NULL;
    }
    return p;
}

int mpt_prefetch_start(mpt_prefetch *p, int64_t epoch, int64_t index, mpt_tensor *x,
                       mpt_tensor *y) {
    MPT_DATA_CHECK(pthread_mutex_lock(&p->lock));
    int idle = p->state == PREFETCH_IDLE;
    if (idle) {
        p->epoch = epoch;
        p->index = index;
        p->x = x;
        p->y = y;
        p->state = PREFETCH_REQUESTED;
        MPT_DATA_CHECK(pthread_cond_broadcast(&p->cond));
    }
    MPT_DATA_CHECK(pthread_mutex_unlock(&p->lock));
    return idle ? 0 : -1;
}

int mpt_prefetch_wait(mpt_prefetch *p, int64_t *n_real, char *err, size_t n) {
    MPT_DATA_CHECK(pthread_mutex_lock(&p->lock));
    if (p->state == PREFETCH_IDLE) {
        MPT_DATA_CHECK(pthread_mutex_unlock(&p->lock));
        return mpt_data_fail(err, n, "internal error: waited for a batch that was not started");
    }
    while (p->state != PREFETCH_DONE)
        MPT_DATA_CHECK(pthread_cond_wait(&p->cond, &p->lock));
    int rc = p->rc;
    if (rc)
        mpt_data_fail(err, n, "%s", p->err);
    else if (n_real)
        *n_real = p->n_real;
    p->state = PREFETCH_IDLE;
    MPT_DATA_CHECK(pthread_mutex_unlock(&p->lock));
    return rc;
}

void mpt_prefetch_free(mpt_prefetch *p) {
    if (!p)
        return;
    MPT_DATA_CHECK(pthread_mutex_lock(&p->lock));
    p->stop = 1;
    MPT_DATA_CHECK(pthread_cond_broadcast(&p->cond));
    MPT_DATA_CHECK(pthread_mutex_unlock(&p->lock));
    MPT_DATA_CHECK(pthread_join(p->thread, NULL));
    MPT_DATA_CHECK(pthread_cond_destroy(&p->cond));
    MPT_DATA_CHECK(pthread_mutex_destroy(&p->lock));
    free(p);
}
