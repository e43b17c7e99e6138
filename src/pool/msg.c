/*
 * The lending protocol (active messages on EMA_AM_POOL): its messages, and
 * the one point where they arrive.
 *
 * Borrow (B grows a window past its free memory; L is the next lender in
 * B's lender order):
 *   B --BORROW(n, tok)--> L   L takes up to n free, prefaulted, lendable
 *                             segments, marks them lent to B
 *   B <--GRANT(k, segs, handles, left)-- L
 *   B maps each segment into its window and publishes the new table
 *
 * Give back (B shrinks, frees a window, or moved the data elsewhere):
 *   B --GIVEBACK(segs)--> L   L marks them free
 *
 * Reclaim (L wants its memory: ema_reclaim, or its own window grows;
 * lender.c ema__pool_reclaim):
 *   L --RECALL(segs)--> B     B's recall job (borrower.c), per window
 *                             (win/migrate.c ema__win_recall):
 *                             1. the window's reclaim callback hears of the
 *                                ranges (once per recall, no lock held)
 *                             2. new memory: its own free memory, else
 *                                another lender (BORROW/GRANT), else its
 *                                spill tier
 *                             3. ema__win_move: segments held with
 *                                ema_win_acquire stay; the others are
 *                                invalidated on every rank (coherence.c),
 *                                copied, mapped at the same address, and
 *                                published
 *   L <--GIVEBACK(segs)-- B   for what moved (the move releases it)
 *   L <--REFUSE(segs)---- B   for what had nowhere to go: L stops waiting
 *                             (EMA_ERR_NO_MEMORY); B's ema_win_stat counts
 *                             it as bytes_wanted
 *                             held segments: the job parks until the owner
 *                             releases (ema_win_release, shrink, free),
 *                             then runs again from step 2
 *   L waits for every GIVEBACK or REFUSE, or for its timeout.
 *
 * Advertise (whenever a rank's lendable memory changes, pool.c):
 *   X --ADVERT(left)--> every peer   the peers' lender order uses it
 */
#include "pool_priv.h"

#include "util/log.h"

#include <inttypes.h>

ema_status_t ema__pool_send_ucx(void *arg, int peer, const void *hdr, size_t hlen,
                                const void *payload, size_t plen)
{
    return ema__xport_am_send(arg, peer, EMA_AM_POOL, hdr, hlen, payload, plen);
}

/* Every message leaves through pool->send: UCX, or the unit tests'
 * loopback. */
ema_status_t ema__pool_send(ema__pool_t *pool, int peer, const ema_pool_msg_t *m,
                            const void *payload, size_t plen)
{
    return pool->send(pool->send_arg, peer, m, sizeof(*m), payload, plen);
}

void ema__pool_dispatch(void *arg, int src, const void *data, size_t len)
{
    ema__pool_t *pool = arg;
    ema_pool_msg_t m;

    if (src < 0 || src >= pool->size || src == pool->rank) {
        ema_malformed("pool message from rank %d, not a peer: dropped", src);
        return;
    }
    if (len < sizeof(m)) {
        ema_malformed("short pool message from rank %d (%zu bytes): dropped", src, len);
        return;
    }
    memcpy(&m, data, sizeof(m));
    const char *payload = (const char *)data + sizeof(m);
    size_t plen = len - sizeof(m);
    /* what each type carries, exactly (a GRANT: ema__pool_granted) */
    size_t segs_len = (size_t)m.count * sizeof(uint32_t);

    switch (m.type) {
    case EMA_POOL_MSG_GRANT:
        ema__pool_granted(pool, src, &m, payload, plen);
        break;
    case EMA_POOL_MSG_GIVEBACK:
        if (plen != segs_len) {
            ema_malformed("malformed give-back from rank %d: %u segments in %zu bytes: "
                          "dropped", src, m.count, plen);
            return;
        }
        if (ema__pool_take_back(pool, src, m.count, (const uint32_t *)payload) ==
            EMA_SUCCESS) {
            ema__xport_defer_ref(pool->xp, EMA_JOB_QUICK, ema__pool_advertise_job,
                                 pool); /* no send here */
        }
        break;
    case EMA_POOL_MSG_ADVERT:
        if (plen != 0 || m.left > ema__pool_peer_nsegs(pool, src)) {
            ema_malformed("rank %d advertises %" PRIu64 " lendable segments (%zu bytes more), "
                          "more than its arena: dropped", src, m.left, plen);
            return;
        }
        atomic_store(&pool->peer_lendable[src], m.left);
        break;
    case EMA_POOL_MSG_REFUSE:
        if (plen != segs_len) {
            ema_malformed("malformed refusal from rank %d: %u segments in %zu bytes: dropped",
                          src, m.count, plen);
            return;
        }
        ema__pool_refused(pool, src, m.count, (const uint32_t *)payload);
        break;
    case EMA_POOL_MSG_BORROW:
    case EMA_POOL_MSG_RECALL: {
        /* Both send messages: not from inside a UCX callback.  A borrow is a
         * quick job; a recall migrates data and waits on peers: a long one. */
        size_t n = (m.type == EMA_POOL_MSG_RECALL) ? m.count : 0;
        if (plen != n * sizeof(uint32_t)) {
            ema_malformed("malformed %s from rank %d: %zu segments in %zu bytes: dropped",
                          m.type == EMA_POOL_MSG_RECALL ? "recall" : "borrow request", src, n,
                          plen);
            return;
        }
        /* a recall names segments of its sender's arena */
        uint64_t nsegs = ema__pool_peer_nsegs(pool, src);
        for (size_t i = 0; i < n; i++) {
            uint32_t s = ((const uint32_t *)payload)[i];
            if (s >= nsegs) {
                ema_malformed("recall from rank %d of segment %u, past its arena of %" PRIu64
                              ": dropped", src, s, nsegs);
                return;
            }
        }
        ema_pool_job_t *job = calloc(1, sizeof(*job) + n * (sizeof(uint32_t) + 1));
        if (job == NULL) {
            ema_error("out of memory handling a pool message from rank %d", src);
            return;
        }
        job->pool     = pool;
        job->next     = NULL;
        job->src      = src;
        job->told     = (uint8_t *)(job->segs + n); /* none yet (calloc) */
        job->msg      = m;
        memcpy(job->segs, payload, n * sizeof(uint32_t));
        if (m.type == EMA_POOL_MSG_BORROW) {
            ema__xport_defer(pool->xp, EMA_JOB_QUICK, ema__pool_borrow_job, job);
        } else {
            ema_debug("recall of %zu segments from rank %d: queued", n, src);
            ema__win_recall_begin(pool->win); /* prefetch policies yield to it */
            ema__xport_defer(pool->xp, EMA_JOB_LONG, ema__pool_recall_job, job);
        }
        break;
    }
    default:
        ema_malformed("unknown pool message %u from rank %d: dropped", m.type, src);
    }
}
