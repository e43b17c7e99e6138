/*
 * The engine's core, shared by every thread that waits: the deferred-job
 * queues and the one wait primitive.
 *
 * A job is work that must not run inside a UCX callback (it sends, or
 * waits): quick jobs (answering a peer: an invalidation, a borrow, a table
 * request) may run in any wait; long jobs (migrations: a recall, a
 * prefetch) only in waits that hold no lock of EMA's.  A wait's mode says
 * which it runs, as uv_run's modes say how a loop runs:
 *
 *   EMA_WAIT_XPORT  the UCX worker only (a UCX request of this thread)
 *   EMA_WAIT_NONE   nothing: spin on a local condition (in-flight counts)
 *   EMA_WAIT_QUICK  the worker and quick jobs
 *   EMA_WAIT_LONG   the worker, quick jobs and one long job per pass
 *
 * with EMA_WAIT_NAP added for waits of milliseconds (a reclaim waiting for
 * copies), which then sleep a little once nothing happens.  Every wait has
 * a deadline (0: none) and returns EMA_ERR_TIMEOUT past it.  The progress
 * thread (progress/) runs the same passes, with its own idle policy.
 */
#include "xport.h"

#include "util/clock.h"
#include "util/cpus.h"

#include <sched.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <time.h>

/* A nap of a wait that lasts milliseconds (EMA_WAIT_NAP): leave the CPU
 * to the peers doing the work.  A reclaim naps only where cores are few
 * (EMA_RECLAIM_WAIT, pool/lender.c says why). */
#define EMA_WAIT_NAP_AFTER 256
#define EMA_WAIT_NAP_NS    20000

void ema__xport_idle(ema__xport_t *xp)
{
    /* Spin a while before giving the core away: a yield is a system call,
     * and a waiter that yields at every empty poll hands its core to the
     * progress thread, which then contends for the worker. */
    static __thread unsigned spins;
    if ((++spins & xp->idle_mask) == 0) {
        sched_yield();
    }
}

/*
 * How often a waiter yields (see ema__xport_idle).  Where the ranks and
 * their progress threads outnumber the cores this process may run on, the
 * peer a waiter waits for may need its core: yield every 64 empty polls.
 * Where each has a core, a yield only adds a system call to the wait (a
 * blocking put of 2 MiB over cuda_ipc polls UCX some 60 times, so it made
 * about one yield per operation; on the H200 removing it changed nothing
 * measurable, within the launch-to-launch noise).  Then yield every 4096
 * empty polls, which still lets a stray thread run now and then.  The
 * cores are those of the affinity mask, fewer if a CPU quota grants fewer.
 */
int ema__xport_cores_plentiful(int size, long cpus)
{
    return cpus > 0 && 2L * size <= cpus;
}

unsigned ema__xport_idle_mask(int size, long cpus)
{
    unsigned mask = ema__xport_cores_plentiful(size, cpus) ? 4095u : 63u;
    ema_debug("%ld cores for %d ranks and their progress threads: waiters yield every %u "
              "empty polls", cpus, size, mask + 1);
    return mask;
}

unsigned ema__xport_wait_pass(ema__xport_t *xp, unsigned mode)
{
    unsigned n = 0, base = mode & EMA_WAIT_MODE_MASK;

    if (base != EMA_WAIT_NONE) {
        n += ema__xport_progress(xp);
    }
    if (base == EMA_WAIT_QUICK || base == EMA_WAIT_LONG) {
        n += (unsigned)ema__xport_run_deferred(xp, base);
    }
    return n;
}

void ema__xport_wait_idle(ema__xport_t *xp, unsigned mode, unsigned *idle)
{
    /* a dead peer ends the waits on it: looked for when a pass found
     * nothing to do, not on the passes of a wait that is moving */
    ema__xport_peers_check(xp);
    if ((mode & EMA_WAIT_NAP) && ++*idle > EMA_WAIT_NAP_AFTER) {
        /* The nap lasts what it says: the application thread's timer slack
         * (50 us by default) would stretch 20 us to 70, and a give-back
         * arriving during the nap waits for its end.  The slack is the
         * thread's own setting: put back after the nap. */
        struct timespec ts = {0, EMA_WAIT_NAP_NS};
        int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
        int set   = slack > (int)EMA_NAP_TIMER_SLACK_NS &&
                  prctl(PR_SET_TIMERSLACK, EMA_NAP_TIMER_SLACK_NS, 0, 0, 0) == 0;
        nanosleep(&ts, NULL);
        if (set) {
            prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
        }
    } else {
        ema__xport_idle(xp);
    }
}

ema_status_t ema__xport_wait_until(ema__xport_t *xp, unsigned mode, double deadline_us,
                                   ema__wait_cond_cb cond, void *arg)
{
    unsigned idle = 0;

    while (!cond(arg)) {
        if (deadline_us > 0 && ema__now_us() > deadline_us) {
            return EMA_ERR_TIMEOUT;
        }
        if (ema__xport_wait_pass(xp, mode) > 0) {
            idle = 0;
        } else {
            ema__xport_wait_idle(xp, mode, &idle);
        }
    }
    return EMA_SUCCESS;
}

int ema__xport_flag_reached(void *arg)
{
    const ema__wait_flag_t *f = arg;
    return atomic_load(f->counter) >= f->target;
}

void ema__xport_wait_step(ema__xport_t *xp, unsigned mode)
{
    if (ema__xport_wait_pass(xp, mode) == 0) {
        /* an idle pass like any wait's (a dead peer looked for: with
         * EMA_PROGRESS_THREAD=n nobody else does, and the collectives wait
         * here); one step never naps */
        unsigned idle = 0;
        ema__xport_wait_idle(xp, mode & ~EMA_WAIT_NAP, &idle);
    }
}

void ema__xport_sched_init(ema__xport_t *xp)
{
    xp->cpus      = ema__cpus_usable();
    xp->idle_mask = ema__xport_idle_mask(xp->size, xp->cpus);
    pthread_mutex_init(&xp->defer_lock, NULL);
    for (int q = 0; q < 2; q++) {
        xp->defer_head[q] = NULL;
        xp->defer_tail[q] = &xp->defer_head[q];
        atomic_init(&xp->defer_count[q], 0);
    }
}

void ema__xport_sched_cleanup(ema__xport_t *xp)
{
    for (int q = 0; q < 2; q++) {
        while (xp->defer_head[q] != NULL) {
            ema__defer_t *d   = xp->defer_head[q];
            xp->defer_head[q] = d->next;
            if (d->owned) {
                free(d->arg); /* jobs dropped at teardown: their malloc'ed args */
            }
            free(d);
        }
    }
    pthread_mutex_destroy(&xp->defer_lock);
}

/* Queue @cb(@arg); out of memory, run it in place if @inline_ok, else
 * return EMA_ERR_NO_MEMORY with nothing done. */
static ema_status_t ema_xport_defer(ema__xport_t *xp, unsigned kind, ema__defer_cb cb,
                                   void *arg, int owned, int inline_ok)
{
    int q = (kind == EMA_JOB_QUICK) ? 0 : 1;
    ema__defer_t *d = malloc(sizeof(*d));
    if (d == NULL) {
        if (!inline_ok) {
            ema_error("out of memory queueing deferred work");
            return EMA_ERR_NO_MEMORY;
        }
        ema_error("out of memory queueing deferred work; running it in place");
        cb(arg);
        return EMA_SUCCESS;
    }
    d->cb    = cb;
    d->arg   = arg;
    d->owned = owned;
    d->next  = NULL;
    pthread_mutex_lock(&xp->defer_lock);
    *xp->defer_tail[q] = d;
    xp->defer_tail[q]  = &d->next;
    pthread_mutex_unlock(&xp->defer_lock);
    atomic_fetch_add(&xp->defer_count[q], 1);
    if (xp->efd >= 0) {
        ucp_worker_signal(xp->worker); /* wake a sleeping progress thread */
    }
    return EMA_SUCCESS;
}

static ema__defer_t *ema_xport_defer_pop(ema__xport_t *xp, int q)
{
    ema__defer_t *d;
    if (atomic_load_explicit(&xp->defer_count[q], memory_order_acquire) == 0) {
        return NULL;
    }
    pthread_mutex_lock(&xp->defer_lock);
    d = xp->defer_head[q];
    if (d != NULL) {
        xp->defer_head[q] = d->next;
        if (xp->defer_head[q] == NULL) {
            xp->defer_tail[q] = &xp->defer_head[q];
        }
        atomic_fetch_sub(&xp->defer_count[q], 1);
    }
    pthread_mutex_unlock(&xp->defer_lock);
    return d;
}

void ema__xport_defer(ema__xport_t *xp, unsigned kind, ema__defer_cb cb, void *arg)
{
    (void)ema_xport_defer(xp, kind, cb, arg, 1, 1);
}

ema_status_t ema__xport_try_defer(ema__xport_t *xp, unsigned kind, ema__defer_cb cb, void *arg)
{
    return ema_xport_defer(xp, kind, cb, arg, 1, 0);
}

void ema__xport_defer_ref(ema__xport_t *xp, unsigned kind, ema__defer_cb cb, void *arg)
{
    (void)ema_xport_defer(xp, kind, cb, arg, 0, 1);
}

int ema__xport_run_deferred(ema__xport_t *xp, unsigned mode)
{
    ema__defer_t *d;
    int n = 0;

    /* The quick jobs queued now, not those they queue: a job may put itself
     * back (see ema_win_in_amo in win/coherence.c). */
    int budget = atomic_load(&xp->defer_count[0]);
    while (budget-- > 0 && (d = ema_xport_defer_pop(xp, 0)) != NULL) {
        d->cb(d->arg);
        free(d);
        n++;
    }
    if ((mode & EMA_WAIT_MODE_MASK) == EMA_WAIT_LONG && (d = ema_xport_defer_pop(xp, 1)) != NULL) {
        d->cb(d->arg); /* one long job per call, so quick ones are not starved */
        free(d);
        n++;
    }
    return n;
}
