#include "progress.h"

#include "util/clock.h"
#include "util/config.h"
#include "util/log.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#define EMA_PROGRESS_CFG(_f) offsetof(ema__progress_config_t, _f)

/* The longest the thread stays off the worker for an application (us). */
#define EMA_PROGRESS_FORCE_US 1000.0

const ema_config_field_t ema__progress_config_table[] = {
    {"PROGRESS_THREAD", "y",
     "run a progress thread per rank, so passive-target RMA and control messages "
     "complete while the application computes",
     EMA_PROGRESS_CFG(thread), &ema__config_bool},
    {"PROGRESS_SPIN", "2000",
     "empty polls the progress thread makes before it starts yielding the CPU",
     EMA_PROGRESS_CFG(spin), &ema__config_uint},
    {"PROGRESS_YIELD", "10000",
     "empty polls, each followed by sched_yield, before the progress thread sleeps on "
     "UCX's event fd",
     EMA_PROGRESS_CFG(yield), &ema__config_uint},
    {"PROGRESS_HOLDOFF", "20",
     "microseconds the progress thread leaves the UCX worker alone after an application "
     "thread last used it (0: never); an application that keeps calling EMA progresses the "
     "worker itself, and the thread taking the worker's lock between its calls delays them",
     EMA_PROGRESS_CFG(holdoff), &ema__config_uint},
    EMA_CONFIG_TABLE_END};

unsigned ema__progress_once(ema__progress_t *pg)
{
    ema__xport_peers_check(pg->xp); /* a dead peer, noticed while nobody waits */
    unsigned n = ema__xport_progress(pg->xp);
    n += (unsigned)ema__xport_run_deferred(pg->xp, EMA_WAIT_LONG);
    return n;
}

/* The thread's pass: while an application thread is itself progressing
 * the worker (issuing, or waiting on a request), taking the worker's lock
 * too would only slow it down.  Nor does the thread pounce on the gap
 * between two of the application's calls: a pass over the worker polls
 * every transport (a CUDA event query per stream on the cuda kind) under
 * the lock, and an application issuing its next put found the lock taken
 * at almost every call, about a microsecond each time.  So the thread
 * touches the worker only once no application thread has left it for
 * EMA_PROGRESS_HOLDOFF microseconds; control messages arriving meanwhile
 * are served by the application's own progress. */
static unsigned ema_progress_thread_once(ema__progress_t *pg)
{
    ema__xport_t *xp = pg->xp;
    uint64_t app = atomic_load_explicit(&xp->app_state, memory_order_relaxed);
    double now   = ema__now_us();

    pg->held = (app & EMA_XPORT_APP_MASK) != 0;
    if (!pg->held && pg->cfg.holdoff > 0) {
        uint64_t gen = app / EMA_XPORT_APP_EXIT;
        if (gen != pg->app_gen) {
            pg->app_gen  = gen;
            pg->app_seen = now;
        }
        pg->held = now - pg->app_seen < (double)pg->cfg.holdoff;
    }
    /* Every EMA_PROGRESS_FORCE_US at the latest the thread progresses the
     * worker anyway, held off or not: an application whose calls never
     * wait (operations that complete in place) progresses nothing, and
     * peers' control messages must not wait for its next wait. */
    if (pg->held && now - pg->progressed < EMA_PROGRESS_FORCE_US) {
        ema__xport_peers_check(xp);
        return (unsigned)ema__xport_run_deferred(xp, EMA_WAIT_LONG);
    }
    pg->progressed = now;
    return ema__progress_once(pg);
}

/* A nap while held off: long enough that its wake-ups cost an application
 * sharing the core nothing noticeable, short against the forced pass
 * (EMA_PROGRESS_FORCE_US) and against a borrow (DESIGN: <= 100 us). */
#define EMA_PROGRESS_NAP_US 50

static void ema_progress_nap(void)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = EMA_PROGRESS_NAP_US * 1000L};
    nanosleep(&ts, NULL);
}

static void *ema_progress_main(void *arg)
{
    ema__progress_t *pg = arg;
    /* This thread's own waits (the flushes and sends of the control work it
     * runs) are not an application's: they must not hold it off. */
    ema__xport_app_depth = 1;
    /* Its naps are short: without this the kernel stretches each by the
     * default timer slack, 50 us. */
    prctl(PR_SET_TIMERSLACK, EMA_NAP_TIMER_SLACK_NS, 0, 0, 0);
    ema__xport_t *xp    = pg->xp;
    unsigned idle       = 0;
    struct pollfd pfd   = {.fd = xp->efd, .events = POLLIN};

    while (!atomic_load_explicit(&pg->stop, memory_order_relaxed)) {
        if (ema_progress_thread_once(pg) > 0) {
            idle = 0;
            continue;
        }
        if (++idle < pg->cfg.spin) {
            continue;
        }
        if (idle < pg->cfg.spin + pg->cfg.yield) {
            /* then stay responsive a while longer without holding a core:
             * a borrow or recall often follows recent traffic, and waking
             * from the event fd costs tens of microseconds */
            sched_yield();
            continue;
        }
        if (pg->held) {
            /* The application is on the worker.  Arming the worker to sleep
             * would take the worker's lock and, on the cuda kind, make UCX
             * launch a host callback on each CUDA stream with copies in
             * flight (its event-fd arm), behind the application's own
             * copies.  Nap instead, and look again after each nap. */
            ema_progress_nap();
            continue;
        }
        idle = 0;
        if (xp->efd < 0) {
            ema__xport_idle(xp);
            continue;
        }
        ucs_status_t status = ucp_worker_arm(xp->worker);
        if (status == UCS_ERR_BUSY) {
            continue; /* events arrived meanwhile */
        }
        if (status != UCS_OK) {
            ema__xport_idle(xp);
            continue;
        }
        /* The timeout bounds how long a missed wake-up can stall progress. */
        if (poll(&pfd, 1, 10) < 0 && errno != EINTR) {
            ema_warn("poll(ucx event fd) failed: %m");
        }
    }
    return NULL;
}

ema_status_t ema__progress_start(ema__progress_t *pg, ema__xport_t *xp)
{
    pg->xp       = xp;
    pg->running  = 0;
    pg->app_gen    = 0;
    pg->app_seen   = 0;
    pg->progressed = 0;
    atomic_init(&pg->stop, 0);
    if (!pg->cfg.thread) {
        ema_debug("progress thread disabled: the application must call ema_progress()");
        return EMA_SUCCESS;
    }
    int rc = pthread_create(&pg->thread, NULL, ema_progress_main, pg);
    if (rc != 0) {
        errno = rc;
        ema_error("pthread_create(progress thread) failed: %m");
        return EMA_ERR_NO_RESOURCE;
    }
    pg->running = 1;
    /* mpirun binds each of 1 or 2 ranks to one core by default (Open MPI):
     * the progress thread then runs only in the application's time slices,
     * and what it serves waits for them: a peer's recall, and a world of
     * one's migrations and prefetch policy too.  On the H200, under mpirun
     * --bind-to core, ema_perf's 1 GiB reclaims took 6 times as long (0.13x
     * a copy's speed against 0.85x; doc/performance.md, session 13), and
     * bench/layers' policy, one rank, fell from 0.96x all-local to 0.53x
     * (session 15). */
    if (xp->cpus == 1) {
        ema_warn("this rank may run on one CPU only (its affinity mask or CPU quota), which "
                 "its progress thread shares with the application: recalls, migrations and "
                 "the prefetch policy wait for the application's time slices; give each "
                 "rank 2 CPUs or more (mpirun --bind-to none, or --map-by slot:PE=2)");
    }
    return EMA_SUCCESS;
}

void ema__progress_stop(ema__progress_t *pg)
{
    if (!pg->running) {
        return;
    }
    atomic_store(&pg->stop, 1);
    if (pg->xp->efd >= 0) {
        ucp_worker_signal(pg->xp->worker);
    }
    pthread_join(pg->thread, NULL);
    pg->running = 0;
}
