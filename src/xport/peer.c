/*
 * Lost peers: the one place a rank is marked dead (xp->lost[], an atomic
 * byte per rank), and the checks that find it.  Four sources report a
 * death, whichever comes first:
 *
 *   - the peers' process ids (one node): a pidfd per peer, polled at most
 *     every EMA_PEER_CHECK_US by whichever thread waits or progresses
 *     (ema__xport_peers_check, from every idle wait pass and the progress
 *     thread); a pidfd turns readable when its process exits, zombie or
 *     not;
 *   - UCX, with EMA_UCX_PEER_ERRORS=y: the endpoints are created with
 *     UCP_ERR_HANDLING_MODE_PEER, and their error callback marks the rank
 *     (off by default: UCX 1.13 then drops its shared-memory transports);
 *   - the launcher: a PMIx event handler (boot/boot.c), wired up by the
 *     runtime, for launchers that deliver one;
 *   - and a peer that does not answer a request within EMA_PEER_TIMEOUT
 *     seconds (0: no limit) is treated as lost (ema__xport_wait_peer).
 *
 * Marking is idempotent and safe from any thread, UCX callbacks included:
 * it sets the byte, bumps xp->nlost (which ends waits that depend on any
 * peer) and queues one quick job that runs the pool's hook
 * (ema__xport_on_lost: it takes back what it lent to the rank) outside UCX
 * callbacks; the windows read xp->lost where they reach a rank.
 */
#include "xport.h"

#include "util/clock.h"
#include "util/state.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define EMA_PEER_CHECK_US 2000.0

typedef struct {
    ema__xport_t *xp;
    int           peer;
} ema_lost_job_t;

static void ema_xport_lost_job(void *arg)
{
    ema_lost_job_t *j = arg;
    if (j->xp->lost_cb != NULL) {
        j->xp->lost_cb(j->xp->lost_arg, j->peer);
    }
    free(j); /* a job frees its argument (ema__xport_destroy does, if it never ran) */
}

void ema__xport_mark_lost(ema__xport_t *xp, int peer, const char *why)
{
    if (peer < 0 || peer >= xp->size || peer == xp->rank || xp->lost == NULL) {
        return;
    }
    uint8_t was = atomic_exchange(&xp->lost[peer], 1);
    if (was) {
        return;
    }
    atomic_fetch_add(&xp->nlost, 1);
    if (atomic_load(&ema__state) == EMA_STATE_READY) {
        ema_warn("rank %d is lost (%s): calls that need it return EMA_ERR_PEER_LOST", peer, why);
    } else { /* ema_finalize: a peer that finished first */
        ema_debug("rank %d is gone (%s)", peer, why);
    }
    ema_lost_job_t *j = malloc(sizeof(*j));
    if (j == NULL) {
        return; /* the byte is set: waits end; the hooks' cleanup is lost */
    }
    j->xp   = xp;
    j->peer = peer;
    ema__xport_defer(xp, EMA_JOB_QUICK, ema_xport_lost_job, j);
}

void ema__xport_on_lost(ema__xport_t *xp, ema__lost_cb cb, void *arg)
{
    xp->lost_cb  = cb;
    xp->lost_arg = arg;
}

void ema__xport_peers_init(ema__xport_t *xp)
{
    xp->lost   = calloc((size_t)xp->size, sizeof(*xp->lost));
    xp->pidfd  = malloc(sizeof(int) * (size_t)xp->size);
    xp->pid    = calloc((size_t)xp->size, sizeof(*xp->pid));
    atomic_init(&xp->nlost, 0);
    atomic_init(&xp->next_check_us, 0);
    xp->lost_cb     = NULL;
    xp->lost_arg    = NULL;
    xp->closing     = 0;
    for (int r = 0; xp->pidfd != NULL && r < xp->size; r++) {
        xp->pidfd[r] = -1;
    }
}

void ema__xport_peers_watch(ema__xport_t *xp, int peer, int32_t pid)
{
    if (peer < 0 || peer >= xp->size || peer == xp->rank || xp->pid == NULL || pid <= 0) {
        return;
    }
    xp->pid[peer] = pid;
#ifdef SYS_pidfd_open
    if (xp->pidfd != NULL && xp->pidfd[peer] < 0) {
        xp->pidfd[peer] = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    }
#endif
}

void ema__xport_peers_cleanup(ema__xport_t *xp)
{
    for (int r = 0; xp->pidfd != NULL && r < xp->size; r++) {
        if (xp->pidfd[r] >= 0) {
            close(xp->pidfd[r]);
        }
    }
    free(xp->pidfd);
    free(xp->pid);
    free((void *)xp->lost);
    xp->pidfd = NULL;
    xp->pid   = NULL;
    xp->lost  = NULL;
}

void ema__xport_peers_check(ema__xport_t *xp)
{
    if (xp->pid == NULL) {
        return;
    }
    double now   = ema__now_us();
    uint64_t due = atomic_load_explicit(&xp->next_check_us, memory_order_relaxed);
    if (now < (double)due ||
        !atomic_compare_exchange_strong(&xp->next_check_us, &due,
                                        (uint64_t)(now + EMA_PEER_CHECK_US))) {
        return; /* not yet, or another thread checks now */
    }
    for (int r = 0; r < xp->size; r++) {
        if (r == xp->rank || xp->pid[r] <= 0 || ema__xport_peer_lost(xp, r)) {
            continue;
        }
        if (xp->pidfd[r] >= 0) {
            struct pollfd pfd = {.fd = xp->pidfd[r], .events = POLLIN};
            if (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR))) {
                ema__xport_mark_lost(xp, r, "its process exited");
            }
        } else if (kill((pid_t)xp->pid[r], 0) != 0 && errno == ESRCH) {
            ema__xport_mark_lost(xp, r, "its process is gone");
        }
    }
}

typedef struct {
    ema__xport_t      *xp;
    int                peer;
    unsigned           nlost0;
    ema__wait_cond_cb  cond;
    void              *arg;
    int                lost;
} ema_wait_peer_t;

static int ema_xport_peer_done(void *arg)
{
    ema_wait_peer_t *w = arg;
    if (w->cond(w->arg)) {
        return 1;
    }
    if (w->peer >= 0 ? ema__xport_peer_lost(w->xp, w->peer)
                     : atomic_load(&w->xp->nlost) != w->nlost0) {
        w->lost = 1;
        return 1;
    }
    return 0;
}

ema_status_t ema__xport_wait_peer(ema__xport_t *xp, unsigned mode, int peer,
                                  ema__wait_cond_cb cond, void *arg)
{
    ema_wait_peer_t w = {xp, peer, atomic_load(&xp->nlost), cond, arg, 0};
    if (peer >= 0 && ema__xport_peer_lost(xp, peer) && !cond(arg)) {
        return EMA_ERR_PEER_LOST;
    }
    double deadline = (xp->cfg.peer_timeout > 0 && peer >= 0)
                          ? ema__now_us() + xp->cfg.peer_timeout * 1e6 : 0;
    ema_status_t st = ema__xport_wait_until(xp, mode, deadline, ema_xport_peer_done, &w);
    if (st == EMA_ERR_TIMEOUT) {
        /* After a death, a live peer's silence may be UCX's: a rank killed
         * while writing into a shared-memory receive queue (sysv, posix)
         * leaves a slot taken and never written, and its owner receives
         * nothing after it (ema(7) FAULTS). */
        ema__xport_mark_lost(xp, peer, (atomic_load(&xp->nlost) != 0 && !xp->cfg.peer_errors)
                                           ? "no answer within EMA_PEER_TIMEOUT, perhaps a "
                                             "shared-memory queue blocked by a rank lost "
                                             "before: see ema(7) FAULTS"
                                           : "no answer within EMA_PEER_TIMEOUT");
        return EMA_ERR_PEER_LOST;
    }
    return w.lost ? EMA_ERR_PEER_LOST : EMA_SUCCESS;
}

ema_status_t ema__xport_wait_flag_peer(ema__xport_t *xp, unsigned mode, int peer,
                                       atomic_int *counter, int target)
{
    ema__wait_flag_t f = {counter, target};
    return ema__xport_wait_peer(xp, mode, peer, ema__xport_flag_reached, &f);
}
