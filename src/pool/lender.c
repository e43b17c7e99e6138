/*
 * The lender's side of the protocol (msg.c has the diagram): granting
 * borrow requests, taking segments back, recalling them for a reclaim and
 * waiting for their return.  Lender bookkeeping is under pool->lock.
 */
#include "pool_priv.h"

#include "util/clock.h"
#include "util/log.h"

#include <time.h>

uint32_t ema__pool_lendable_locked(ema__pool_t *pool)
{
    uint32_t nfree = ema__seg_pool_nfree(&pool->arena->pool);
    uint32_t keep  = pool->reserve_segs + pool->withheld;
    return nfree > keep ? nfree - keep : 0;
}


/* Lent segment @s is back (under pool->lock): free again; returns 1 when a
 * recall was waiting for it (the caller passes the count to
 * pool_recalls_answered once the lock is dropped). */
static int pool_seg_back_locked(ema__pool_t *pool, uint32_t s)
{
    int recalled = pool->recalling[s] != 0;
    pool->lent_to[s]   = -1;
    pool->recalling[s] = 0;
    ema__seg_pool_free(&pool->arena->pool, 1, &s);
    return recalled;
}

/* An answer to recalls (a give-back, a refusal, a lost borrower), after
 * its segments' flags were cleared under the lock: @n fewer pending, and
 * one more answer, which makes a waiting reclaim look at its own again. */
static void pool_recalls_answered(ema__pool_t *pool, int n)
{
    atomic_fetch_sub(&pool->recall_pending, n);
    atomic_fetch_add(&pool->recall_answers, 1);
}

static void ema_pool_grant(ema__pool_t *pool, int src, const ema_pool_msg_t *req)
{
    uint32_t want = req->count, k;
    ema_pool_msg_t m;

    pthread_mutex_lock(&pool->lock);
    k = ema__pool_lendable_locked(pool);
    k = (k < want) ? k : want;
    uint32_t *segs   = malloc(sizeof(uint32_t) * (k ? k : 1));
    int64_t *handles = malloc(sizeof(int64_t) * (k ? k : 1));
    if (segs == NULL || handles == NULL ||
        ema__seg_pool_alloc(&pool->arena->pool, k, EMA_SEG_LENT, segs) != EMA_SUCCESS) {
        k = 0;
    }
    for (uint32_t i = 0; i < k; i++) {
        ema_trace("lending segment %u to rank %d", segs[i], src);
        pool->lent_to[segs[i]]  = (int16_t)src;
        pool->granting[segs[i]] = 1; /* not recalled before the grant is out */
        handles[i] = pool->arena->ops->seg_handle(pool->arena, segs[i]);
    }
    uint64_t left = ema__pool_lendable_locked(pool);
    pthread_mutex_unlock(&pool->lock);
    if (k < want) {
        /* ema_mem_stat's bytes_unmet: a peer is short of memory that this
         * rank may hold idle in its own windows */
        atomic_fetch_add(&pool->bytes_unmet, (uint64_t)(want - k) * pool->win->seg_size);
    }

    memset(&m, 0, sizeof(m));
    m.type  = EMA_POOL_MSG_GRANT;
    m.count = k;
    m.token = req->token;
    m.left  = left;
    size_t plen = (size_t)k * (sizeof(uint32_t) + sizeof(int64_t));
    char *payload = malloc(plen ? plen : 1);
    if (payload != NULL) {
        memcpy(payload, segs, (size_t)k * sizeof(uint32_t));
        memcpy(payload + (size_t)k * sizeof(uint32_t), handles, (size_t)k * sizeof(int64_t));
    }
    int sent = payload != NULL && ema__pool_send(pool, src, &m, payload, plen) == EMA_SUCCESS;
    if (!sent) {
        ema_error("cannot answer a borrow request from rank %d: its %u segments stay here", src,
                  k);
    }
    int recalled = 0;
    pthread_mutex_lock(&pool->lock);
    for (uint32_t i = 0; i < k; i++) {
        /* only while still ours to grant: if @src was lost meanwhile, the
         * segment may be granted to another rank now, whose grant is
         * still going out (a recall must not overtake it) */
        if (pool->lent_to[segs[i]] == src) {
            pool->granting[segs[i]] = 0;
        }
        if (!sent && pool->lent_to[segs[i]] == src) { /* (a lost rank's may be back already) */
            recalled += pool_seg_back_locked(pool, segs[i]);
        }
    }
    pthread_mutex_unlock(&pool->lock);
    pool_recalls_answered(pool, recalled);
    free(payload);
    free(segs);
    free(handles);
}

/* A lent segment being taken back (only inside ema__pool_take_back, under
 * pool->lock): marks the segments already checked, so a repeat shows. */
#define EMA_POOL_TAKING ((int16_t)-2)

/* Segment @s of the arena is lent to rank @src (under pool->lock). */
static int seg_lent_to(const ema__pool_t *pool, uint32_t s, int src)
{
    return s < pool->arena->pool.nsegs && pool->lent_to[s] == src;
}

ema_status_t ema__pool_take_back(ema__pool_t *pool, int src, uint32_t count,
                                 const uint32_t *segs)
{
    int recalled = 0;
    uint32_t i;

    pthread_mutex_lock(&pool->lock);
    /* every segment first: lent to the sender, once; else nothing changes */
    for (i = 0; i < count && seg_lent_to(pool, segs[i], src); i++) {
        pool->lent_to[segs[i]] = EMA_POOL_TAKING;
    }
    if (i < count) {
        uint32_t bad = segs[i];
        for (uint32_t j = 0; j < i; j++) {
            pool->lent_to[segs[j]] = (int16_t)src;
        }
        pthread_mutex_unlock(&pool->lock);
        ema_malformed("rank %d gives back segment %u, which it does not hold (or twice), among "
                      "%u: dropped", src, bad, count);
        return EMA_ERR_INVALID_PARAM;
    }
    for (i = 0; i < count; i++) {
        ema_trace("rank %d gave back segment %u%s", src, segs[i],
                  pool->recalling[segs[i]] ? " (recalled)" : "");
        recalled += pool_seg_back_locked(pool, segs[i]);
    }
    pthread_mutex_unlock(&pool->lock);
    pool_recalls_answered(pool, recalled);
    return EMA_SUCCESS;
}

/* The borrower has nowhere to move these recalled segments (no free memory
 * of its own, no lender, no spill tier): they stay lent, and the reclaim
 * waiting for them ends now instead of at its timeout. */
void ema__pool_refused(ema__pool_t *pool, int src, uint32_t count, const uint32_t *segs)
{
    int n = 0;
    uint32_t i;

    pthread_mutex_lock(&pool->lock);
    i = 0;
    while (i < count && seg_lent_to(pool, segs[i], src)) {
        i++;
    }
    if (i < count) {
        uint32_t bad = segs[i];
        pthread_mutex_unlock(&pool->lock);
        ema_malformed("rank %d refuses segment %u, which it does not hold: dropped", src, bad);
        return;
    }
    for (i = 0; i < count; i++) {
        uint32_t s = segs[i];
        if (pool->recalling[s]) { /* not recalled, or refused already: nothing */
            pool->recalling[s]   = 0;
            pool->refused_seg[s] = 1;
            n++;
        }
    }
    pthread_mutex_unlock(&pool->lock);
    ema_debug("rank %d has nowhere to move %d recalled segments: they stay lent", src, n);
    atomic_fetch_add(&pool->recall_refused, n);
    pool_recalls_answered(pool, n);
}

/* A borrow request, answered outside the UCX callback (it sends). */
void ema__pool_borrow_job(void *arg)
{
    ema_pool_job_t *job = arg;
    ema_pool_grant(job->pool, job->src, &job->msg);
    ema__pool_advertise(job->pool);
    free(job);
}

/*
 * Whether a reclaim naps while it waits for the give-backs (EMA_RECLAIM_WAIT).
 * The wait holds two round trips, the invalidation's ACK and the give-back,
 * and a 20 us nap delays whichever arrives during it.  Where the ranks and
 * their progress threads outnumber the cores (the 2-core CI machine runs 4
 * ranks), the nap leaves the core to the borrower that copies; where each
 * has a core, spinning costs nobody a core.  Measured on the H200 (two
 * ranks, ema_perf --op reclaim, launches alternating, session 14): the
 * median 1 GiB reclaim of four sets of 5-8 launches at 0.886-0.956x a
 * copy's speed spinning against 0.883-0.913x napping, ahead in each set
 * (doc/performance.md).  Sessions 10 and 13 saw no difference, lost in
 * launches that were slow for another reason.
 */
static int ema_pool_reclaim_naps(const ema__pool_t *pool)
{
    switch (pool->cfg.reclaim_wait) {
    case EMA_POOL_RECLAIM_WAIT_SPIN:
        return 0;
    case EMA_POOL_RECLAIM_WAIT_NAP:
        return 1;
    default:
        return !ema__xport_cores_plentiful(pool->xp->size, pool->xp->cpus);
    }
}

/*
 * Recall lent segments until @target of them are free and withheld (in
 * addition to those withheld already); waits up to @timeout_ms.
 */
ema_status_t ema__pool_reclaim(ema__pool_t *pool, uint32_t target, uint64_t timeout_ms,
                               unsigned flags, int *withheld_p)
{
    double t0 = ema__now_us();
    uint32_t nsegs = pool->arena->pool.nsegs, sent = 0, idle = 0;
    ema_status_t status = EMA_SUCCESS;
    unsigned nap = ema_pool_reclaim_naps(pool) ? EMA_WAIT_NAP : 0;
    /* what this call recalled, in the order sent (each RECALL's payload) */
    uint32_t *mine = malloc(sizeof(uint32_t) * (nsegs ? nsegs : 1));
    uint32_t mine_pending = 0, mine_refused = 0, counted = 0;
    uint64_t answers_seen = UINT64_MAX;

    /* waits for the borrowers' migrations, which need their windows' locks
     * and may need ours: never under a window's lock */
    EMA_WIN_ASSERT_NONE_LOCKED();
    *withheld_p = 0;
    if (mine == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    pthread_mutex_lock(&pool->lock);
    /* free must cover what earlier calls withheld, even what a refused or
     * timed-out recall left lent, and @target more */
    uint32_t nfree = ema__seg_pool_nfree(&pool->arena->pool);
    uint32_t want  = pool->withheld + target;
    uint32_t have  = nfree > pool->withheld ? nfree - pool->withheld : 0;
    uint32_t need  = want > nfree ? want - nfree : 0;
    if (need > pool->arena->pool.nlent) {
        pthread_mutex_unlock(&pool->lock);
        free(mine);
        ema_debug("reclaim of %u segments: %u free, %u lent, the rest backs own windows",
                  target, have, pool->arena->pool.nlent);
        return EMA_ERR_NO_MEMORY;
    }
    pool->withheld += target; /* stop lending them now */
    *withheld_p = 1;
    pthread_mutex_unlock(&pool->lock);

    /* Recall lent segments, grouped by borrower; one whose grant is still
     * being sent is recalled on a later pass, so the recall cannot overtake
     * the grant.  Then wait for the give-backs of this call's own recalls
     * (mine): an earlier call's recall that timed out, still pending, or
     * refused later, is not this call's to wait for or to fail by (session
     * 14: one timed-out reclaim made every later one, and every grow that
     * reclaims, wait its whole timeout). */
    for (;;) {
        for (int b = 0; b < pool->size && sent < need; b++) {
            uint32_t n = 0;
            pthread_mutex_lock(&pool->lock);
            for (uint32_t s = 0; s < nsegs && sent + n < need; s++) {
                if (pool->lent_to[s] == b && !pool->recalling[s] && !pool->granting[s]) {
                    ema_trace("recalling segment %u from rank %d", s, b);
                    pool->recalling[s]   = 1;
                    pool->refused_seg[s] = 0;
                    mine[sent + n++]     = s;
                }
            }
            if (n > 0) {
                atomic_fetch_add(&pool->recall_pending, (int)n);
            }
            pthread_mutex_unlock(&pool->lock);
            if (n == 0) {
                continue;
            }
            ema_pool_msg_t m;
            memset(&m, 0, sizeof(m));
            m.type  = EMA_POOL_MSG_RECALL;
            m.count = n;
            ema__pool_send(pool, b, &m, mine + sent, (size_t)n * sizeof(uint32_t));
            ema_debug("recalled %u segments from rank %d", n, b);
            sent += n;
        }
        if (timeout_ms != EMA_TIMEOUT_INFINITE &&
            ema__now_us() - t0 > (double)timeout_ms * 1e3) {
            status = EMA_ERR_TIMEOUT;
            if (ema__log_level >= EMA_LOG_DEBUG) {
                pthread_mutex_lock(&pool->lock);
                for (uint32_t s = 0; s < nsegs; s++) {
                    if (pool->recalling[s]) {
                        ema_debug("reclaim timed out: segment %u still with rank %d", s,
                                  pool->lent_to[s]);
                    }
                }
                pthread_mutex_unlock(&pool->lock);
            }
            break;
        }
        /* Every answer (give-back, refusal, a lost borrower) clears its
         * segments' flags under the lock and only then counts itself in
         * recall_answers: so this call's own count is looked at again only
         * when that or what it sent moved, not at every poll.  (It followed
         * recall_pending, whose value a refusal and another call's recall
         * of as many segments could leave unchanged between two polls.) */
        uint64_t answers = atomic_load(&pool->recall_answers);
        if (answers != answers_seen || sent != counted) {
            answers_seen = answers;
            counted      = sent;
            pthread_mutex_lock(&pool->lock);
            mine_pending = mine_refused = 0;
            for (uint32_t i = 0; i < sent; i++) {
                mine_pending += pool->recalling[mine[i]] != 0;
                mine_refused += !pool->recalling[mine[i]] && pool->refused_seg[mine[i]];
            }
            pthread_mutex_unlock(&pool->lock);
        }
        if (sent >= need && mine_pending == 0) {
            break;
        }
        if ((flags & EMA_POOL_RECLAIM_FAIL_FAST) && sent >= need && mine_refused > 0) {
            /* A borrower had nowhere to move some: the reclaim cannot
             * reach @target, and says so at once (ema_reclaim(3)).  What
             * is still pending, segments held with ema_win_acquire above
             * all, moves in the background; waiting for it held the call
             * to its whole timeout, or for ever with EMA_TIMEOUT_INFINITE
             * where the owner releases only after the lender is back (a
             * black-box test, session 23).  A grow's implicit reclaim goes
             * on waiting: it takes whatever comes back. */
            break;
        }
        if (ema__xport_wait_pass(pool->xp, EMA_WAIT_QUICK) == 0) {
            ema__xport_wait_idle(pool->xp, EMA_WAIT_QUICK | nap, &idle);
        } else {
            idle = 0;
        }
        if (sent < need) {
            /* segments given back meanwhile count too */
            pthread_mutex_lock(&pool->lock);
            nfree = ema__seg_pool_nfree(&pool->arena->pool);
            pthread_mutex_unlock(&pool->lock);
            if (nfree >= pool->withheld && mine_pending == 0) {
                break;
            }
        }
    }
    free(mine);
    if (status == EMA_SUCCESS && mine_refused > 0) {
        ema_debug("reclaim: borrowers had nowhere to move %u segments", mine_refused);
        status = EMA_ERR_NO_MEMORY;
    }
    double us = ema__now_us() - t0;
    ema_debug("reclaim of %u segments (%u recalled): %s after %.0f us", target, sent,
              ema_strerror(status), us);
    if (sent > 0) {
        atomic_fetch_add(&pool->reclaims, 1);
        pool->reclaim_last_us = us;
        if (us > pool->reclaim_max_us) {
            pool->reclaim_max_us = us;
        }
    }
    return status;
}


/* Rank @peer is lost (xport/peer.c, a quick job): what this rank lent it
 * comes back, as if given back (a reclaim waiting for it completes), and
 * the peers hear of the lendable memory. */
void ema__pool_peer_lost(void *arg, int peer)
{
    ema__pool_t *pool = arg;
    uint32_t nsegs = pool->arena->pool.nsegs, n = 0;
    int recalled = 0;

    /* one pass under the lock: a give-back from the dying rank handled in
     * between cannot make part of it fail */
    pthread_mutex_lock(&pool->lock);
    for (uint32_t s = 0; s < nsegs; s++) {
        if (pool->lent_to[s] == peer) {
            recalled += pool_seg_back_locked(pool, s);
            n++;
        }
    }
    pthread_mutex_unlock(&pool->lock);
    pool_recalls_answered(pool, recalled);
    if (n > 0) {
        ema_info("rank %d is lost: %u segments lent to it are back", peer, n);
        ema__pool_advertise(pool);
    }
}
