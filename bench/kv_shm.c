/*
 * One page of shared memory for the ranks of the node (EMA's ranks are all
 * on one node), outside EMA on purpose: what lives here must cost EMA
 * nothing.
 *
 *  - The virtual clock (host kind).  Each rank publishes how far its
 *    engine's virtual time has got; a rank waits before a step until every
 *    other rank is within @slack of it.  The ranks then meet each other's
 *    lending and reclaiming at the same virtual time, however the 2-core
 *    machine schedules them.
 *  - The oracle pool: every rank owns @share blocks, the pool holds
 *    nranks * share.  A rank under its share always gets blocks at once
 *    (an instant reclaim): if the pool is short, the ranks over their share
 *    owe the difference and give it back at their next step.  A rank at or
 *    over its share borrows what the pool has free.
 *  - The start time of the wall clock (cuda kind) and the calibration's
 *    figures.
 *
 * The name comes from the launcher's job (PMIX_NAMESPACE), the same on every
 * rank; rank 0 creates the page before a barrier, the others open it after,
 * and rank 0 unlinks it after a second barrier.
 */
#include "kv_serving.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define KV_SHM_SLOTS 8

typedef struct {
    _Atomic uint64_t vt[KV_MAX_RANKS]; /* bits of a double */
    _Atomic uint64_t t0;
    _Atomic uint64_t dbl[KV_SHM_SLOTS][KV_MAX_RANKS];
    pthread_mutex_t  lock;             /* the pool */
    int64_t          share, pool_free;
    int64_t          used[KV_MAX_RANKS], owed[KV_MAX_RANKS];
    int              nranks;
} kv_shm_t;

static kv_shm_t *kv_shm;
static int kv_shm_n;

static uint64_t kv_dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
}

static double kv_bitsd(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof(d));
    return d;
}

static void kv_shm_name(char *buf, size_t len)
{
    const char *ns = getenv("PMIX_NAMESPACE"); /* set by the launcher, not EMA */
    char clean[64];
    size_t k = 0;

    for (; ns != NULL && *ns && k + 1 < sizeof(clean); ns++) {
        char c = *ns;
        clean[k++] = ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
                         ? c : '_';
    }
    clean[k] = '\0';
    if (k == 0) {
        snprintf(clean, sizeof(clean), "p%ld", (long)getpid()); /* a world of one */
    }
    snprintf(buf, len, "/ema_kv_serving.%s", clean);
}

/* Map the page @name into kv_shm: rank 0 (@create) makes it, the others
 * open it.  0, or -1 after saying why. */
static int kv_shm_map(const char *name, int create)
{
    int fd = shm_open(name, create ? O_CREAT | O_RDWR : O_RDWR, 0600);
    if (fd < 0 || (create && ftruncate(fd, sizeof(kv_shm_t)) != 0)) {
        perror("kv_serving: shm_open");
        return -1;
    }
    kv_shm = mmap(NULL, sizeof(kv_shm_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (kv_shm == MAP_FAILED) {
        perror("kv_serving: mmap");
        return -1;
    }
    return 0;
}

int kv_shm_open(int rank, int nranks)
{
    char name[128];

    kv_shm_name(name, sizeof(name));
    kv_shm_n = nranks;
    if (rank == 0) {
        shm_unlink(name); /* a leftover of a killed run with the same name */
        if (kv_shm_map(name, 1) != 0) {
            return -1;
        }
        memset(kv_shm, 0, sizeof(*kv_shm));
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutex_init(&kv_shm->lock, &a);
        pthread_mutexattr_destroy(&a);
        kv_shm->nranks = nranks;
    }
    if (ema_barrier() != EMA_SUCCESS) {
        return -1;
    }
    if (rank != 0 && kv_shm_map(name, 0) != 0) {
        return -1;
    }
    if (ema_barrier() != EMA_SUCCESS) {
        return -1;
    }
    if (rank == 0) {
        shm_unlink(name);
    }
    return 0;
}

void kv_shm_close(void)
{
    if (kv_shm != NULL) {
        munmap(kv_shm, sizeof(kv_shm_t));
        kv_shm = NULL;
    }
}

void kv_vclock_publish(int rank, double vt)
{
    atomic_store(&kv_shm->vt[rank], kv_dbits(vt));
}

double kv_vclock_min_others(int rank)
{
    double m = 1e300;
    for (int r = 0; r < kv_shm_n; r++) {
        if (r != rank) {
            double v = kv_bitsd(atomic_load(&kv_shm->vt[r]));
            m = v < m ? v : m;
        }
    }
    return m;
}

void kv_vclock_wait(int rank, double vt, double slack)
{
    /* the rank furthest behind never waits, so this always ends */
    for (unsigned spins = 0; kv_vclock_min_others(rank) < vt - slack; spins++) {
        if (spins < 16) {
            sched_yield();
        } else {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

void kv_shm_set_t0(double t0)
{
    atomic_store(&kv_shm->t0, kv_dbits(t0));
}

double kv_shm_t0(void)
{
    return kv_bitsd(atomic_load(&kv_shm->t0));
}

void kv_shm_put_double(int slot, int rank, double v)
{
    atomic_store(&kv_shm->dbl[slot][rank], kv_dbits(v));
}

double kv_shm_mean_double(int slot, int nranks)
{
    double s = 0;
    for (int r = 0; r < nranks; r++) {
        s += kv_bitsd(atomic_load(&kv_shm->dbl[slot][r]));
    }
    return s / nranks;
}

/* --- the oracle pool --------------------------------------------------------- */

void kv_pool_init(int nranks, int64_t share)
{
    pthread_mutex_lock(&kv_shm->lock);
    kv_shm->share     = share;
    kv_shm->pool_free = (int64_t)nranks * share;
    pthread_mutex_unlock(&kv_shm->lock);
}

int kv_pool_take(int rank, int64_t n)
{
    kv_shm_t *s = kv_shm;
    int ok = 0;

    pthread_mutex_lock(&s->lock);
    if (s->used[rank] + n <= s->share) {
        /* within its own share: at once, whoever holds the memory now */
        s->used[rank] += n;
        s->pool_free  -= n;
        for (int b = 0; s->pool_free < 0 && b < s->nranks; b++) {
            int64_t over = s->used[b] - s->share - s->owed[b];
            if (b == rank || over <= 0) {
                continue;
            }
            int64_t x = over < -s->pool_free ? over : -s->pool_free;
            /* the borrower owes x: it goes to this rank at once (the pool
             * is overdrawn by x until the borrower frees as much, and
             * kv_pool_put pays the debt before refilling the pool) */
            s->owed[b]   += x;
            s->pool_free += x;
        }
    } else if (s->pool_free >= n) {
        s->used[rank] += n;
        s->pool_free  -= n;
    } else {
        ok = -1;
    }
    pthread_mutex_unlock(&s->lock);
    return ok;
}

void kv_pool_put(int rank, int64_t n)
{
    kv_shm_t *s = kv_shm;

    pthread_mutex_lock(&s->lock);
    s->used[rank] -= n;
    if (s->owed[rank] > 0) {
        /* a debt: those blocks went to the lender already */
        int64_t x = s->owed[rank] < n ? s->owed[rank] : n;
        s->owed[rank] -= x;
        n -= x;
    }
    s->pool_free += n;
    pthread_mutex_unlock(&s->lock);
}

int64_t kv_pool_owed(int rank)
{
    pthread_mutex_lock(&kv_shm->lock);
    int64_t v = kv_shm->owed[rank];
    pthread_mutex_unlock(&kv_shm->lock);
    return v;
}

int64_t kv_pool_used(int rank)
{
    pthread_mutex_lock(&kv_shm->lock);
    int64_t v = kv_shm->used[rank];
    pthread_mutex_unlock(&kv_shm->lock);
    return v;
}
