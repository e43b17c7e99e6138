/*
 * The lending protocol (active messages on EMA_AM_POOL).
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
 * Reclaim (L wants its memory: ema_reclaim, or its own window grows):
 *   L --RECALL(segs)--> B     B, in its progress thread, per window:
 *                             1. calls the window's reclaim callback
 *                                (once per recall, without the lock)
 *                             2. picks new memory for the segments not held
 *                                with ema_win_acquire: its own free memory,
 *                                else another lender, else its spill tier
 *                             3. invalidates them on every rank
 *                                (win/coherence.c), copies them, maps the
 *                                new memory at the same address, publishes
 *                             4. held ones: the job parks until a release
 *                                (ema__pool_unpark), then goes on from 2
 *   L <--GIVEBACK(segs)-- B
 *   L waits for every GIVEBACK, or for its timeout.
 *
 * Lendable memory (each rank, whenever its own figure changes):
 *   R --ADVERT(left)--> every peer   for the peers' lender order
 */
#include "pool.h"

#include "topo/topo.h"
#include "util/clock.h"
#include "util/log.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

enum {
    EMA_POOL_MSG_BORROW = 1,
    EMA_POOL_MSG_GRANT,
    EMA_POOL_MSG_GIVEBACK,
    EMA_POOL_MSG_RECALL,
    EMA_POOL_MSG_REFUSE, /* recalled segments the borrower has nowhere to move */
    EMA_POOL_MSG_ADVERT  /* the sender's lendable segments changed (left) */
};

typedef struct {
    uint32_t type;
    uint32_t count;
    uint64_t token;
    uint64_t left;   /* GRANT, ADVERT: lendable segments the sender has left */
    /* GRANT: count x uint32 segs, count x int64 handles; GIVEBACK/RECALL/
     * REFUSE: count x uint32 segs */
} ema_pool_msg_t;

typedef struct {
    atomic_int done;
    uint32_t   want;
    uint32_t   count;
    uint32_t  *segs;
    int64_t   *handles;
} ema_pool_waiter_t;

typedef struct ema_pool_job {
    ema__pool_t         *pool;
    struct ema_pool_job *next;     /* parked: see ema_pool_park */
    int                  src;
    int                  notified; /* RECALL: the owner's callback has run */
    ema_pool_msg_t       msg;
    uint32_t             segs[];
} ema_pool_job_t;

ema__pool_t *ema__pool_world;

static ema_status_t ema_pool_send(ema__pool_t *pool, int peer, const ema_pool_msg_t *m,
                                  const void *payload, size_t plen)
{
    return ema__xport_am_send(pool->xp, peer, EMA_AM_POOL, m, sizeof(*m), payload, plen);
}

/* Lendable now: free segments beyond the reserve and the withheld ones.
 * Called with pool->lock held. */
static uint32_t ema_pool_lendable_locked(ema__pool_t *pool)
{
    uint32_t nfree = ema__seg_pool_nfree(&pool->arena->pool);
    uint32_t keep  = pool->reserve_segs + pool->withheld;
    return nfree > keep ? nfree - keep : 0;
}

/*
 * Borrowers order lenders by their lendable memory (ema(7) LENDER ORDER),
 * so each rank tells every peer when its own figure changes: after a call
 * or job that took or freed segments.  Sends are serialised, so a peer never
 * keeps an older figure sent late.  A grant also carries the figure, to
 * the borrower.
 */
void ema__pool_advertise(ema__pool_t *pool)
{
    ema_pool_msg_t m;

    if (pool->size <= 1) {
        return;
    }
    pthread_mutex_lock(&pool->advert_lock);
    pthread_mutex_lock(&pool->lock);
    uint64_t left = ema_pool_lendable_locked(pool);
    pthread_mutex_unlock(&pool->lock);
    if (left != pool->advertised) {
        pool->advertised = left;
        memset(&m, 0, sizeof(m));
        m.type = EMA_POOL_MSG_ADVERT;
        m.left = left;
        for (int r = 0; r < pool->size; r++) {
            if (r != pool->rank && ema_pool_send(pool, r, &m, NULL, 0) != EMA_SUCCESS) {
                ema_debug("cannot tell rank %d of %" PRIu64 " lendable segments", r, left);
            }
        }
    }
    pthread_mutex_unlock(&pool->advert_lock);
}

static void ema_pool_advertise_job(void *arg)
{
    ema__pool_advertise(arg);
}

/* Segments granted by peers and not yet in a window table: a recall for
 * one of them must wait until it is mapped. */
static void ema_pool_acq_add(ema__pool_t *pool, const ema__loc_t *locs, uint32_t n)
{
    pthread_mutex_lock(&pool->acq_lock);
    if (pool->nacq + n > pool->acq_cap) {
        size_t cap = (pool->nacq + n) * 2;
        ema__loc_t *a = realloc(pool->acq, cap * sizeof(*a));
        if (a == NULL) {
            pthread_mutex_unlock(&pool->acq_lock);
            ema_error("out of memory tracking granted segments: a recall of them may "
                      "wait for its timeout");
            return;
        }
        pool->acq     = a;
        pool->acq_cap = cap;
    }
    memcpy(pool->acq + pool->nacq, locs, n * sizeof(*locs));
    pool->nacq += n;
    pthread_mutex_unlock(&pool->acq_lock);
}

void ema__pool_acq_done(ema__pool_t *pool, const ema__loc_t *locs, uint32_t n)
{
    pthread_mutex_lock(&pool->acq_lock);
    for (uint32_t k = 0; k < n; k++) {
        for (size_t i = 0; i < pool->nacq; i++) {
            if (pool->acq[i] == locs[k]) {
                pool->acq[i] = pool->acq[--pool->nacq];
                break;
            }
        }
    }
    pthread_mutex_unlock(&pool->acq_lock);
}

static int ema_pool_acq_has(ema__pool_t *pool, ema__loc_t loc)
{
    int found = 0;
    pthread_mutex_lock(&pool->acq_lock);
    for (size_t i = 0; i < pool->nacq && !found; i++) {
        found = (pool->acq[i] == loc);
    }
    pthread_mutex_unlock(&pool->acq_lock);
    return found;
}

/* --- lender side ---------------------------------------------------------- */

static void ema_pool_grant(ema__pool_t *pool, int src, const ema_pool_msg_t *req)
{
    uint32_t want = req->count, k;
    ema_pool_msg_t m;

    pthread_mutex_lock(&pool->lock);
    k = ema_pool_lendable_locked(pool);
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
    uint64_t left = ema_pool_lendable_locked(pool);
    pthread_mutex_unlock(&pool->lock);

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
    if (payload == NULL || ema_pool_send(pool, src, &m, payload, plen) != EMA_SUCCESS) {
        ema_error("cannot answer a borrow request from rank %d", src);
    }
    pthread_mutex_lock(&pool->lock);
    for (uint32_t i = 0; i < k; i++) {
        pool->granting[segs[i]] = 0;
    }
    pthread_mutex_unlock(&pool->lock);
    free(payload);
    free(segs);
    free(handles);
}

static void ema_pool_take_back(ema__pool_t *pool, int src, uint32_t count, const uint32_t *segs)
{
    int recalled = 0;

    pthread_mutex_lock(&pool->lock);
    for (uint32_t i = 0; i < count; i++) {
        uint32_t s = segs[i];
        if (s >= pool->arena->pool.nsegs || pool->lent_to[s] != src) {
            ema_error("rank %d gives back segment %u it does not hold", src, s);
            continue;
        }
        pool->lent_to[s] = -1;
        ema_trace("rank %d gave back segment %u%s", src, s,
                  pool->recalling[s] ? " (recalled)" : "");
        if (pool->recalling[s]) {
            pool->recalling[s] = 0;
            recalled++;
        }
        ema__seg_pool_free(&pool->arena->pool, 1, &s);
    }
    pthread_mutex_unlock(&pool->lock);
    atomic_fetch_sub(&pool->recall_pending, recalled);
}

/* The borrower has nowhere to move these recalled segments (no free memory
 * of its own, no lender, no spill tier): they stay lent, and the reclaim
 * waiting for them ends now instead of at its timeout. */
static void ema_pool_refused(ema__pool_t *pool, int src, uint32_t count, const uint32_t *segs)
{
    int n = 0;

    pthread_mutex_lock(&pool->lock);
    for (uint32_t i = 0; i < count; i++) {
        uint32_t s = segs[i];
        if (s < pool->arena->pool.nsegs && pool->lent_to[s] == src && pool->recalling[s]) {
            pool->recalling[s] = 0;
            n++;
        }
    }
    pthread_mutex_unlock(&pool->lock);
    ema_debug("rank %d has nowhere to move %d recalled segments: they stay lent", src, n);
    atomic_fetch_add(&pool->recall_refused, n);
    atomic_fetch_sub(&pool->recall_pending, n);
}

/* --- borrower side ------------------------------------------------------- */

static void ema_pool_recall_job(void *arg);

static void ema_pool_borrow_job(void *arg)
{
    ema_pool_job_t *job = arg;
    ema_pool_grant(job->pool, job->src, &job->msg);
    ema__pool_advertise(job->pool);
    free(job);
}

static void ema_pool_am(void *arg, int src, const void *data, size_t len)
{
    ema__pool_t *pool = arg;
    ema_pool_msg_t m;

    if (len < sizeof(m)) {
        ema_error("short pool message from rank %d", src);
        return;
    }
    memcpy(&m, data, sizeof(m));
    const char *payload = (const char *)data + sizeof(m);
    size_t plen = len - sizeof(m);

    switch (m.type) {
    case EMA_POOL_MSG_GRANT: {
        ema_pool_waiter_t *w = (ema_pool_waiter_t *)(uintptr_t)m.token;
        uint32_t k = m.count;
        if (plen < (size_t)k * (sizeof(uint32_t) + sizeof(int64_t)) || k > w->want) {
            ema_error("malformed grant from rank %d", src);
            k = 0;
        }
        memcpy(w->segs, payload, (size_t)k * sizeof(uint32_t));
        memcpy(w->handles, payload + (size_t)k * sizeof(uint32_t), (size_t)k * sizeof(int64_t));
        w->count = k;
        /* Tracked from the moment they are ours: a recall of one of them
         * (sent after this grant) must find it, mapped or about to be. */
        for (uint32_t i = 0; i < k; i++) {
            ema__loc_t loc = EMA_LOC(src, EMA_TIER_DEVICE, w->segs[i]);
            ema_pool_acq_add(pool, &loc, 1);
            ema_trace("granted segment %u by rank %d", w->segs[i], src);
        }
        atomic_store(&pool->peer_lendable[src], m.left);
        atomic_store(&w->done, 1);
        break;
    }
    case EMA_POOL_MSG_GIVEBACK:
        if (plen >= (size_t)m.count * sizeof(uint32_t)) {
            ema_pool_take_back(pool, src, m.count, (const uint32_t *)payload);
            ema__xport_defer(pool->xp, 1, ema_pool_advertise_job, pool); /* no send here */
        }
        break;
    case EMA_POOL_MSG_ADVERT:
        atomic_store(&pool->peer_lendable[src], m.left);
        break;
    case EMA_POOL_MSG_REFUSE:
        if (plen >= (size_t)m.count * sizeof(uint32_t)) {
            ema_pool_refused(pool, src, m.count, (const uint32_t *)payload);
        }
        break;
    case EMA_POOL_MSG_BORROW:
    case EMA_POOL_MSG_RECALL: {
        /* Both send messages: not from inside a UCX callback.  A borrow is a
         * quick job; a recall migrates data and waits on peers: a long one. */
        size_t n = (m.type == EMA_POOL_MSG_RECALL) ? m.count : 0;
        if (plen < n * sizeof(uint32_t)) {
            ema_error("malformed pool message from rank %d", src);
            return;
        }
        ema_pool_job_t *job = malloc(sizeof(*job) + n * sizeof(uint32_t));
        if (job == NULL) {
            ema_error("out of memory handling a pool message from rank %d", src);
            return;
        }
        job->pool     = pool;
        job->next     = NULL;
        job->src      = src;
        job->notified = 0;
        job->msg      = m;
        memcpy(job->segs, payload, n * sizeof(uint32_t));
        if (m.type == EMA_POOL_MSG_BORROW) {
            ema__xport_defer(pool->xp, 1, ema_pool_borrow_job, job);
        } else {
            ema__xport_defer(pool->xp, 0, ema_pool_recall_job, job);
        }
        break;
    }
    default:
        ema_error("unknown pool message %u from rank %d", m.type, src);
    }
}

/* Ask @lender for up to @want segments; returns how many it granted. */
static uint32_t ema_pool_borrow_from(ema__pool_t *pool, int lender, uint32_t want,
                                     uint32_t *segs, int64_t *handles)
{
    ema_pool_waiter_t w;
    ema_pool_msg_t m;

    atomic_init(&w.done, 0);
    w.want    = want;
    w.count   = 0;
    w.segs    = segs;
    w.handles = handles;
    memset(&m, 0, sizeof(m));
    m.type  = EMA_POOL_MSG_BORROW;
    m.count = want;
    m.token = (uint64_t)(uintptr_t)&w;
    if (ema_pool_send(pool, lender, &m, NULL, 0) != EMA_SUCCESS) {
        return 0;
    }
    ema__win_wait_flag(pool->win, &w.done, 1);
    return w.count;
}

void ema__pool_giveback(ema__pool_t *pool, int lender, uint32_t count, const uint32_t *segs)
{
    for (uint32_t i = 0; i < count && ema__log_level >= EMA_LOG_TRACE; i++) {
        ema_trace("giving back segment %u to rank %d", segs[i], lender);
    }
    ema_pool_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type  = EMA_POOL_MSG_GIVEBACK;
    m.count = count;
    if (ema_pool_send(pool, lender, &m, segs, (size_t)count * sizeof(uint32_t)) != EMA_SUCCESS) {
        ema_error("cannot give %u segments back to rank %d", count, lender);
    }
}

/* Peers in the order to ask them for memory (never @exclude): the
 * topology's order (a rank on the same GPU, then link bandwidth, then the
 * most lendable memory last heard of, then NUMA distance); without a
 * topology, the most lendable memory, then the nearest rank. */
static int ema_pool_order(ema__pool_t *pool, int exclude, int *order)
{
    int n = 0;
    if (pool->topo != NULL) {
        size_t *lendable = malloc(sizeof(size_t) * (size_t)pool->size);
        int *all = malloc(sizeof(int) * (size_t)pool->size);
        if (lendable != NULL && all != NULL) {
            for (int r = 0; r < pool->size; r++) {
                lendable[r] = (size_t)atomic_load(&pool->peer_lendable[r]) * pool->win->seg_size;
            }
            ema__topo_lender_order(pool->topo, pool->gpu_of_rank, pool->numa_of_rank, lendable,
                                   pool->size, pool->rank, all);
            for (int i = 0; i < pool->size - 1; i++) {
                if (all[i] != exclude) {
                    order[n++] = all[i];
                }
            }
        }
        free(lendable);
        free(all);
        if (n > 0 || pool->size <= 1) {
            return n;
        }
    }
    for (int r = 0; r < pool->size; r++) {
        if (r != pool->rank && r != exclude) {
            order[n++] = r;
        }
    }
    for (int i = 1; i < n; i++) { /* insertion sort: small worlds */
        int r = order[i], j = i;
        uint64_t lr = atomic_load(&pool->peer_lendable[r]);
        int dr = abs(r - pool->rank);
        while (j > 0) {
            int q = order[j - 1];
            uint64_t lq = atomic_load(&pool->peer_lendable[q]);
            if (lq > lr || (lq == lr && abs(q - pool->rank) <= dr)) {
                break;
            }
            order[j] = q;
            j--;
        }
        order[j] = r;
    }
    return n;
}

/*
 * Find memory for @want segments: the own arena (free, not withheld), then
 * peers in lender order (never @exclude), then the spill tier.  Fills locs
 * and handles; returns how many were found.
 */
uint32_t ema__pool_acquire_segs(ema__pool_t *pool, uint32_t want, int exclude, unsigned sources,
                                ema__loc_t *locs, int64_t *handles)
{
    uint32_t got = 0, n;
    uint32_t *segs = malloc(sizeof(uint32_t) * (want ? want : 1));
    int *order = malloc(sizeof(int) * (size_t)(pool->size > 1 ? pool->size : 1));

    if (segs == NULL || order == NULL) {
        goto out;
    }
    /* 1. own free memory */
    if (!(sources & EMA_POOL_FROM_LOCAL)) {
        goto peers;
    }
    pthread_mutex_lock(&pool->lock);
    uint32_t nfree = ema__seg_pool_nfree(&pool->arena->pool);
    n = nfree > pool->withheld ? nfree - pool->withheld : 0;
    n = n < want ? n : want;
    if (n > 0 && ema__seg_pool_alloc(&pool->arena->pool, n, EMA_SEG_USED, segs) == EMA_SUCCESS) {
        for (uint32_t i = 0; i < n; i++) {
            locs[got]    = EMA_LOC(pool->rank, EMA_TIER_DEVICE, segs[i]);
            handles[got] = pool->arena->ops->seg_handle(pool->arena, segs[i]);
            got++;
        }
    }
    pthread_mutex_unlock(&pool->lock);

peers:
    /* 2. peers, best first */
    if (!(sources & EMA_POOL_FROM_PEERS)) {
        goto spill;
    }
    int npeers = ema_pool_order(pool, exclude, order);
    for (int i = 0; i < npeers && got < want; i++) {
        n = ema_pool_borrow_from(pool, order[i], want - got, segs, handles + got);
        for (uint32_t k = 0; k < n; k++) {
            locs[got + k] = EMA_LOC(order[i], EMA_TIER_DEVICE, segs[k]);
        }
        got += n;
        atomic_fetch_add(&pool->borrowed_segs, n);
    }

spill:
    /* 3. the host spill tier */
    if (got < want && pool->spill != NULL && (sources & EMA_POOL_FROM_SPILL)) {
        n = ema__seg_pool_nfree(&pool->spill->pool);
        n = n < want - got ? n : want - got;
        if (n > 0 && ema__seg_pool_alloc(&pool->spill->pool, n, EMA_SEG_USED, segs) ==
                         EMA_SUCCESS) {
            for (uint32_t i = 0; i < n; i++) {
                locs[got]    = EMA_LOC(pool->rank, EMA_TIER_SPILL, segs[i]);
                handles[got] = pool->spill->ops->seg_handle(pool->spill, segs[i]);
                got++;
            }
            atomic_fetch_add(&pool->spilled_segs, n);
        }
    }
out:
    free(segs);
    free(order);
    return got;
}

/* Give back the memory behind @loc, wherever it is. */
void ema__pool_release_loc(ema__pool_t *pool, ema__loc_t loc)
{
    uint32_t s = EMA_LOC_SEG(loc);
    int r = EMA_LOC_RANK(loc);

    ema__pool_acq_done(pool, &loc, 1);
    if (EMA_LOC_TIER(loc) == EMA_TIER_SPILL) {
        ema__seg_pool_free(&pool->spill->pool, 1, &s);
        atomic_fetch_sub(&pool->spilled_segs, 1);
    } else if (r == pool->rank) {
        pthread_mutex_lock(&pool->lock);
        ema__seg_pool_free(&pool->arena->pool, 1, &s);
        pthread_mutex_unlock(&pool->lock);
    } else {
        ema__pool_giveback(pool, r, 1, &s);
        atomic_fetch_sub(&pool->borrowed_segs, 1);
    }
}

/* Release the memory behind @old[0..n), batching the give-backs per lender. */
static void ema_pool_release_many(ema__pool_t *pool, const ema__loc_t *old, uint32_t n)
{
    uint32_t *segs = malloc(sizeof(uint32_t) * (n ? n : 1));
    uint8_t *done  = calloc(n ? n : 1, 1);

    for (uint32_t i = 0; segs != NULL && done != NULL && i < n; i++) {
        int r = EMA_LOC_RANK(old[i]);
        if (done[i] || EMA_LOC_TIER(old[i]) != EMA_TIER_DEVICE || r == pool->rank) {
            continue;
        }
        uint32_t k = 0;
        for (uint32_t j = i; j < n; j++) {
            if (!done[j] && EMA_LOC_TIER(old[j]) == EMA_TIER_DEVICE &&
                EMA_LOC_RANK(old[j]) == r) {
                segs[k++] = EMA_LOC_SEG(old[j]);
                done[j]   = 1;
            }
        }
        ema__pool_giveback(pool, r, k, segs);
        atomic_fetch_sub(&pool->borrowed_segs, k);
    }
    for (uint32_t i = 0; i < n; i++) {
        if (done == NULL || !done[i]) {
            ema__pool_release_loc(pool, old[i]);
        }
    }
    free(segs);
    free(done);
}

/* Remap a batch of window segments to their new memory, one mmap per run
 * contiguous on both sides; ok counts the segments remapped, from the
 * first. */
typedef struct {
    ema_win_h         win;
    const uint32_t   *idx;
    const ema__loc_t *loc;
    const int64_t    *hdl;
    uint32_t          n;
    uint32_t          ok;
    ema_status_t      status;
} ema_pool_remap_t;

static void ema_pool_remap_main(ema_pool_remap_t *rm)
{
    for (uint32_t i = 0; i < rm->n;) {
        uint32_t j = i + 1;
        while (j < rm->n && rm->idx[j] == rm->idx[j - 1] + 1 &&
               rm->loc[j] == rm->loc[j - 1] + 1 && rm->hdl[j] == rm->hdl[i]) {
            j++;
        }
        rm->status = ema__win_seg_map_many(rm->win, rm->idx[i], rm->loc[i], j - i, rm->hdl[i]);
        if (rm->status != EMA_SUCCESS) {
            break;
        }
        rm->ok += j - i;
        i = j;
    }
}

/* Runs of consecutive indices in @idx (sorted): first[] and count[]. */
static uint32_t ema_pool_runs(const uint32_t *idx, uint32_t n, uint32_t *first, uint32_t *count)
{
    uint32_t nruns = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (nruns > 0 && idx[i] == first[nruns - 1] + count[nruns - 1]) {
            count[nruns - 1]++;
        } else {
            first[nruns] = idx[i];
            count[nruns] = 1;
            nruns++;
        }
    }
    return nruns;
}

static int ema_pool_cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/*
 * Move segments @idx[0..n) of @win's own part to other memory, as one batch:
 * one round of invalidations, the copies, one round of updates, and one
 * give-back per lender, so moving many segments costs the copy time plus a
 * few round trips.  Targets are @targets (with @handles) or, if NULL, found
 * anywhere but at @exclude.  Called with win->lock held, which it never
 * drops.  Segments that moved or went away meanwhile are skipped, and so
 * are segments held with ema_win_acquire: a migration never waits for the
 * application (ema(7) MIGRATION), so it can run in any thread, the
 * application's own ema_progress and ema_barrier included.  The caller
 * looks at the table afterwards to see what did not move.  Returns
 * EMA_ERR_NO_MEMORY when no memory was found for some of the segments.
 */
ema_status_t ema__pool_migrate_batch(ema__pool_t *pool, ema_win_h win, uint32_t *idx,
                                     uint32_t n, int exclude, const ema__loc_t *targets,
                                     const int64_t *handles)
{
    ema__win_part_t *part = &win->parts[pool->rank];
    size_t seg = pool->win->seg_size;
    ema_status_t status = EMA_SUCCESS, found = EMA_SUCCESS;
    ema__loc_t *old = calloc(n ? n : 1, sizeof(*old));
    ema__loc_t *loc = calloc(n ? n : 1, sizeof(*loc));
    int64_t *hdl    = calloc(n ? n : 1, sizeof(*hdl));
    uint32_t *first = calloc(n ? n : 1, sizeof(*first));
    uint32_t *count = calloc(n ? n : 1, sizeof(*count));
    uint32_t got, nruns, i, k;

    if (old == NULL || loc == NULL || hdl == NULL || first == NULL || count == NULL) {
        status = EMA_ERR_NO_MEMORY;
        goto out;
    }
    qsort(idx, n, sizeof(*idx), ema_pool_cmp_u32);
    if (targets == NULL) {
        /* held segments stay: find memory for the others only */
        for (i = 0, k = 0; i < n; i++) {
            if (atomic_load(&win->held[idx[i]]) == 0) {
                idx[k++] = idx[i];
            }
        }
        n = k;
    }
    for (i = 0; i < n; i++) {
        old[i] = atomic_load(&part->loc[idx[i]]) & ~EMA_LOC_MOVING;
    }
    if (targets != NULL) {
        memcpy(loc, targets, n * sizeof(*loc));
        memcpy(hdl, handles, n * sizeof(*hdl));
        got = n;
    } else {
        got = ema__pool_acquire_segs(pool, n, exclude, EMA_POOL_FROM_ANY, loc, hdl);
        if (got < n) {
            /* the recall path refuses them to the lender (REFUSE): an
             * answer, not a failure of this rank */
            ema_debug("no memory anywhere to move %u of %u segments of window %u", n - got, n,
                      win->id);
            found = EMA_ERR_NO_MEMORY;
            n = got; /* move what we can */
        }
    }

    for (;;) {
        /* 1. drop the segments that moved, went away or are held */
        for (i = 0, k = 0; i < n; i++) {
            if (idx[i] < atomic_load(&part->nsegs) &&
                (atomic_load(&part->loc[idx[i]]) & ~EMA_LOC_MOVING) == old[i] &&
                atomic_load(&win->held[idx[i]]) == 0) {
                idx[k] = idx[i];
                old[k] = old[i];
                loc[k] = loc[i];
                hdl[k] = hdl[i];
                k++;
            } else {
                ema__pool_release_loc(pool, loc[i]);
            }
        }
        n     = k;
        nruns = ema_pool_runs(idx, n, first, count);
        if (n == 0) {
            goto out;
        }
        /* 2. invalidate them everywhere, in one round */
        status = ema__win_invalidate_runs(win, first, count, nruns);
        int held = 0;
        for (i = 0; i < n; i++) {
            held |= atomic_load(&win->held[idx[i]]) > 0;
        }
        if (status != EMA_SUCCESS || !held) {
            break;
        }
        /* Acquired while we marked them (ema_win_acquire marks first, then
         * checks MOVING): back in service everywhere, and the next pass
         * leaves the held ones out. */
        for (i = 0; i < n; i++) {
            atomic_store(&part->loc[idx[i]], old[i]);
        }
        for (uint32_t r = 0; r < nruns; r++) {
            ema__win_publish(win, first[r], count[r]);
        }
    }

    /* 3. copy, and map the new memory at the same addresses */
    uint32_t ok = 0;
    double tm0 = ema__now_us(), tm_copy = 0;
    if (pool->win->direct) {
        /* One copy per run contiguous in the old and the new memory,
         * between this rank's mappings of both (a large memcpy streams past
         * the caches), then one remap per run (one TLB shootdown each).
         * The remap costs the kernel about 80 us per 2 MiB to tear down the
         * old 4 KiB page-table entries; running it on a second thread during
         * the copy was measured no faster on two cores. */
        ema_pool_remap_t rm = {win, idx, loc, hdl, n, 0, EMA_SUCCESS};
        for (i = 0; i < n;) {
            uint32_t j = i + 1;
            while (j < n && old[j] == old[j - 1] + 1 && loc[j] == loc[j - 1] + 1) {
                j++;
            }
            ema__win_seg_copy(pool->win, loc[i], old[i], j - i);
            i = j;
        }
        tm_copy = ema__now_us();
        ema_pool_remap_main(&rm);
        ok     = rm.ok;
        status = rm.status;
        win->stats.migrations += ok;
    } else {
        status = ema__win_seg_move_batch(win, idx, loc, hdl, n, &ok);
    }
    double tm1 = ema__now_us();
    /* 4. the new locations (the old ones where a copy failed: that data is
     * intact, still mapped there), in one round of updates */
    for (i = 0; i < n; i++) {
        atomic_store(&part->loc[idx[i]], (i < ok) ? loc[i] : old[i]);
    }
    ema__pool_acq_done(pool, loc, ok);
    for (uint32_t r = 0; r < nruns; r++) {
        ema__win_publish(win, first[r], count[r]);
    }
    if (win->stats.nwanted > 0) {
        ema__pool_wanted_bytes(win); /* forgets the wanted segments that moved */
    }
    /* 5. give the old memory back, one message per lender */
    double tm2 = ema__now_us();
    ema_pool_release_many(pool, old, ok);
    ema_pool_release_many(pool, loc + ok, n - ok);
    atomic_fetch_add(&pool->bytes_migrated, (uint64_t)ok * seg);
    ema_debug("moved %u segments of window %u: copy %.0f us, remap %.0f us, update %.0f us, "
              "give back %.0f us", ok, win->id, tm_copy ? tm_copy - tm0 : tm1 - tm0,
              tm_copy ? tm1 - tm_copy : 0, tm2 - tm1, ema__now_us() - tm2);
out:
    free(old);
    free(loc);
    free(hdl);
    free(first);
    free(count);
    return (status == EMA_SUCCESS) ? found : status;
}

/* @n borrowed segments of @win's own part, @segs of rank @src, were refused
 * to their lender: tell the owner (ema_win_stat's bytes_wanted) until they
 * leave the part.  Called with win->lock held. */
static void ema_pool_note_wanted(ema_win_h win, int src, const uint32_t *segs, uint32_t n)
{
    ema__win_stats_t *st = &win->stats;

    for (uint32_t k = 0; k < n; k++) {
        ema__loc_t l = EMA_LOC(src, EMA_TIER_DEVICE, segs[k]);
        uint32_t i;
        for (i = 0; i < st->nwanted && st->wanted[i] != l; i++) {
        }
        if (i < st->nwanted) {
            continue; /* refused again: counted once */
        }
        if (st->nwanted == st->wanted_cap) {
            uint32_t cap = st->wanted_cap ? 2 * st->wanted_cap : 16;
            ema__loc_t *w = realloc(st->wanted, cap * sizeof(*w));
            if (w == NULL) {
                ema_warn("out of memory noting segments wanted back: bytes_wanted is short");
                return;
            }
            st->wanted     = w;
            st->wanted_cap = cap;
        }
        st->wanted[st->nwanted++] = l;
    }
    ema_debug("window %u: %u borrowed segments of rank %d wanted back, nowhere to move them",
              win->id, n, src);
}

size_t ema__pool_wanted_bytes(ema_win_h win)
{
    ema__win_stats_t *ws  = &win->stats;
    ema__win_part_t *part = &win->parts[win->ctx->rank];
    size_t seg  = win->ctx->seg_size, size = atomic_load(&part->size), bytes = 0;
    uint32_t n  = atomic_load(&part->nsegs);

    for (uint32_t k = 0; k < ws->nwanted;) {
        uint32_t i;
        for (i = 0; i < n; i++) {
            if ((atomic_load(&part->loc[i]) & ~EMA_LOC_MOVING) == ws->wanted[k]) {
                break;
            }
        }
        if (i == n) { /* shrunk, moved home or to another lender */
            ws->wanted[k] = ws->wanted[--ws->nwanted];
            continue;
        }
        /* the part's bytes, as bytes_borrowed: the last segment may be cut */
        bytes += (i == n - 1 && size % seg) ? size % seg : seg;
        k++;
    }
    return bytes;
}

/*
 * Tell the owner which ranges of @win's part are about to move: its reclaim
 * callback, once per run of consecutive segments in @idx (ascending).  Never
 * under the window's lock, so the callback may call any ema_win_* on the
 * window (ema_win_release to let a held range go, ema_win_stat).
 */
void ema__pool_notify(ema_win_h win, ema_reclaim_cb cb, void *cb_arg, const uint32_t *idx,
                      uint32_t n)
{
    size_t seg = win->ctx->seg_size;

    for (uint32_t i = 0; cb != NULL && i < n;) {
        uint32_t j = i + 1;
        while (j < n && idx[j] == idx[j - 1] + 1) {
            j++;
        }
        cb(win, (size_t)idx[i] * seg, (size_t)(j - i) * seg, cb_arg);
        i = j;
    }
}

/* Indices of the segments of @win's own part that live in @src's memory
 * and are among @segs[0..n) not yet @found (then marked found 1 if @mark).
 * Called with win->lock held. */
static uint32_t ema_pool_recall_collect(ema__pool_t *pool, ema_win_h win, int src,
                                        const uint32_t *segs, uint32_t n, uint8_t *found,
                                        int mark, uint32_t *idx)
{
    ema__win_part_t *part = &win->parts[pool->rank];
    uint32_t ns = atomic_load(&part->nsegs), m = 0;

    for (uint32_t i = 0; i < ns; i++) {
        ema__loc_t l = atomic_load(&part->loc[i]) & ~EMA_LOC_MOVING;
        if (EMA_LOC_RANK(l) != src || EMA_LOC_TIER(l) != EMA_TIER_DEVICE) {
            continue;
        }
        for (uint32_t k = 0; k < n; k++) {
            if (!found[k] && segs[k] == EMA_LOC_SEG(l)) {
                found[k] = mark ? 1 : 0;
                idx[m++] = i;
                break;
            }
        }
    }
    return m;
}

/* Park a recall whose segments are held with ema_win_acquire until the
 * owner releases something (ema__pool_unpark), unless a release came since
 * the job started (@gen): then it runs again at once. */
static void ema_pool_park(ema__pool_t *pool, ema_pool_job_t *job, uint64_t gen)
{
    pthread_mutex_lock(&pool->lock);
    if (atomic_load(&pool->release_gen) == gen) {
        job->next    = pool->parked;
        pool->parked = job;
        job          = NULL;
    }
    pthread_mutex_unlock(&pool->lock);
    if (job != NULL) {
        ema__xport_defer(pool->xp, 0, ema_pool_recall_job, job);
    }
}

void ema__pool_unpark(ema__pool_t *pool)
{
    atomic_fetch_add(&pool->release_gen, 1);
    pthread_mutex_lock(&pool->lock);
    ema_pool_job_t *job = pool->parked;
    pool->parked = NULL;
    pthread_mutex_unlock(&pool->lock);
    while (job != NULL) {
        ema_pool_job_t *next = job->next;
        ema__xport_defer(pool->xp, 0, ema_pool_recall_job, job);
        job = next;
    }
}

/*
 * A lender wants these segments back: move the data (one batch per
 * window), give them back.  Segments held with ema_win_acquire stay (the
 * others of the batch move now); the job parks until the owner releases,
 * then looks again.  So the job never waits for the application, and runs
 * as well from the application's own ema_progress or ema_barrier.
 */
static void ema_pool_recall_job(void *arg)
{
    ema_pool_job_t *job = arg;
    ema__pool_t *pool   = job->pool;
    ema__win_ctx_t *ctx = pool->win;
    uint64_t gen        = atomic_load(&pool->release_gen);
    uint32_t n          = job->msg.count, retry = 0, nheld = 0;
    uint8_t *found      = calloc(n ? n : 1, 1);
    uint8_t *held       = calloc(n ? n : 1, 1);
    uint32_t *idx       = calloc(n ? n : 1, sizeof(*idx));
    uint32_t *idx2      = calloc(n ? n : 1, sizeof(*idx2));
    uint32_t *refuse    = calloc(n ? n : 1, sizeof(*refuse));
    uint32_t nrefuse    = 0;

    if (found == NULL || held == NULL || idx == NULL || idx2 == NULL || refuse == NULL) {
        ema_error("out of memory handling a recall from rank %d", job->src);
        goto out;
    }
    /* Segments granted to us but not yet in a window table come back later.
     * Look them up BEFORE scanning the windows: a grow stores a segment in
     * its table, then drops it from the granted set, so a segment absent
     * from the set now is either mapped (and the scan finds it) or given
     * back.  Checked after the scan, a grow that mapped it in between would
     * be missed, and the lender would wait out its whole timeout. */
    for (uint32_t k = 0; k < n; k++) {
        if (ema_pool_acq_has(pool, EMA_LOC(job->src, EMA_TIER_DEVICE, job->segs[k]))) {
            found[k] = 2;
        }
    }
    pthread_mutex_lock(&ctx->lock);
    ema_win_h win = ctx->wins;
    pthread_mutex_unlock(&ctx->lock);
    for (; win != NULL; win = win->next) {
        uint32_t m = 0;
        if (!job->notified) {
            /* the owner hears first, and may release what it held */
            pthread_mutex_lock(&win->lock);
            ema_reclaim_cb cb = win->reclaim_cb;
            void *cb_arg      = win->reclaim_arg;
            if (win->magic == EMA_WIN_MAGIC && cb != NULL) {
                m = ema_pool_recall_collect(pool, win, job->src, job->segs, n, found, 0, idx);
            }
            pthread_mutex_unlock(&win->lock);
            ema__pool_notify(win, cb, cb_arg, idx, m);
        }
        pthread_mutex_lock(&win->lock);
        if (win->magic == EMA_WIN_MAGIC) {
            ema__win_part_t *part = &win->parts[pool->rank];
            m = ema_pool_recall_collect(pool, win, job->src, job->segs, n, found, 1, idx);
            if (m > 0) {
                /* the migration gives the old segments back */
                memcpy(idx2, idx, m * sizeof(*idx));
                ema_status_t st = ema__pool_migrate_batch(pool, win, idx, m, job->src, NULL,
                                                          NULL);
                /* What did not move: held ones wait for their release;
                 * the others had nowhere to go and are refused, so the
                 * lender stops waiting for them. */
                uint32_t nref0 = nrefuse;
                for (uint32_t i = 0; i < m; i++) {
                    ema__loc_t l = atomic_load(&part->loc[idx2[i]]) & ~EMA_LOC_MOVING;
                    if (idx2[i] >= atomic_load(&part->nsegs) || EMA_LOC_RANK(l) != job->src ||
                        EMA_LOC_TIER(l) != EMA_TIER_DEVICE) {
                        continue;
                    }
                    if (st == EMA_ERR_NO_MEMORY && atomic_load(&win->held[idx2[i]]) == 0) {
                        refuse[nrefuse++] = EMA_LOC_SEG(l);
                    } else {
                        /* held (or acquired and released during the
                         * move): look again after a release */
                        for (uint32_t k = 0; k < n; k++) {
                            if (job->segs[k] == EMA_LOC_SEG(l) && found[k] == 1) {
                                held[k] = 1;
                                nheld++;
                                break;
                            }
                        }
                    }
                }
                if (nrefuse > nref0) {
                    ema_pool_note_wanted(win, job->src, refuse + nref0, nrefuse - nref0);
                }
            }
        }
        pthread_mutex_unlock(&win->lock);
    }
    int granted = 0;
    for (uint32_t k = 0; k < n; k++) {
        if (found[k] == 2 || held[k]) {
            /* granted to a grow or a migration of ours that had not mapped
             * it yet: look again once it has; held: after a release */
            granted |= (found[k] == 2);
            job->segs[retry++] = job->segs[k];
        } else if (!found[k]) {
            /* not ours any more: given back already, or on its way */
            ema_debug("recalled segment %u of rank %d is not mapped here", job->segs[k],
                      job->src);
        }
    }
    if (nheld > 0) {
        ema_debug("recall from rank %d: %u segments held with ema_win_acquire move once "
                  "released", job->src, nheld);
    }
    if (nrefuse > 0) {
        ema_pool_msg_t m;
        memset(&m, 0, sizeof(m));
        m.type  = EMA_POOL_MSG_REFUSE;
        m.count = nrefuse;
        ema_pool_send(pool, job->src, &m, refuse, (size_t)nrefuse * sizeof(uint32_t));
    }
    ema__pool_advertise(pool); /* the data may have moved into our own memory */
out:
    free(found);
    free(held);
    free(idx);
    free(idx2);
    free(refuse);
    if (retry > 0) {
        job->msg.count = retry;
        job->notified  = 1; /* the owner heard of them once */
        if (granted) {
            ema__xport_defer(pool->xp, 0, ema_pool_recall_job, job);
        } else {
            ema_pool_park(pool, job, gen);
        }
        return;
    }
    free(job);
}

/* --- lender: reclaim ------------------------------------------------------ */

/*
 * Recall lent segments until @target of them are free and withheld (in
 * addition to those withheld already); waits up to @timeout_ms.
 */
ema_status_t ema__pool_reclaim(ema__pool_t *pool, uint32_t target, uint64_t timeout_ms,
                               int *withheld_p)
{
    double t0 = ema__now_us();
    int refused0 = atomic_load(&pool->recall_refused);
    uint32_t nsegs = pool->arena->pool.nsegs, sent = 0, idle = 0;
    ema_status_t status = EMA_SUCCESS;
    uint32_t *segs = malloc(sizeof(uint32_t) * (nsegs ? nsegs : 1));

    *withheld_p = 0;
    if (segs == NULL) {
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
        free(segs);
        ema_debug("reclaim of %u segments: %u free, %u lent, the rest backs own windows",
                  target, have, pool->arena->pool.nlent);
        return EMA_ERR_NO_MEMORY;
    }
    pool->withheld += target; /* stop lending them now */
    *withheld_p = 1;
    pthread_mutex_unlock(&pool->lock);

    /* Recall lent segments, grouped by borrower; one whose grant is still
     * being sent is recalled on a later pass, so the recall cannot overtake
     * the grant.  Then wait for the give-backs. */
    while (sent < need || atomic_load(&pool->recall_pending) > 0) {
        for (int b = 0; b < pool->size && sent < need; b++) {
            uint32_t n = 0;
            pthread_mutex_lock(&pool->lock);
            for (uint32_t s = 0; s < nsegs && sent + n < need; s++) {
                if (pool->lent_to[s] == b && !pool->recalling[s] && !pool->granting[s]) {
                    ema_trace("recalling segment %u from rank %d", s, b);
                    pool->recalling[s] = 1;
                    segs[n++] = s;
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
            ema_pool_send(pool, b, &m, segs, (size_t)n * sizeof(uint32_t));
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
        if (sent >= need && atomic_load(&pool->recall_pending) == 0) {
            break;
        }
        if (ema__xport_progress(pool->xp) + ema__xport_run_deferred(pool->xp, 1) == 0) {
            /* A reclaim waits for copies that take milliseconds: leave the
             * CPU to the borrowers doing them (the machine may have fewer
             * cores than threads) after a short spin. */
            if (++idle > 256) {
                struct timespec ts = {0, 20000};
                nanosleep(&ts, NULL);
            }
        } else {
            idle = 0;
        }
        if (sent < need) {
            /* segments given back meanwhile count too */
            pthread_mutex_lock(&pool->lock);
            nfree = ema__seg_pool_nfree(&pool->arena->pool);
            pthread_mutex_unlock(&pool->lock);
            if (nfree >= pool->withheld && atomic_load(&pool->recall_pending) == 0) {
                break;
            }
        }
    }
    free(segs);
    int refused = atomic_load(&pool->recall_refused) - refused0;
    if (status == EMA_SUCCESS && refused > 0) {
        ema_debug("reclaim: borrowers had nowhere to move %d segments", refused);
        status = EMA_ERR_NO_MEMORY;
    }
    double us = ema__now_us() - t0;
    if (sent > 0) {
        atomic_fetch_add(&pool->reclaims, 1);
        pool->reclaim_last_us = us;
        if (us > pool->reclaim_max_us) {
            pool->reclaim_max_us = us;
        }
    }
    return status;
}

/* --- setup --------------------------------------------------------------- */

#define EMA_POOL_CFG(_f) offsetof(ema__pool_config_t, _f)
static const char *ema_spill_names[] = {"none", "host", NULL};
static const ema_config_parser_t ema_spill_parser = EMA_CONFIG_ENUM(ema_spill_names);

const ema_config_field_t ema__pool_config_table[] = {
    {"LEND_RESERVE", "0", "memory of each rank that is never lent to peers",
     EMA_POOL_CFG(lend_reserve), &ema__config_size},
    {"SPILL", "host",
     "where a window grows when no peer can lend: host (a host-memory spill tier) or none",
     EMA_POOL_CFG(spill), &ema_spill_parser},
    {"SPILL_SIZE", "4G", "capacity of each rank's host spill tier (address space until used)",
     EMA_POOL_CFG(spill_size), &ema__config_size},
    {"STATS", "n", "print each rank's memory statistics at ema_finalize",
     EMA_POOL_CFG(stats), &ema__config_bool},
    {"RECLAIM_TIMEOUT", "2",
     "seconds a window's grow waits for the memory it lent to come back (implicit reclaim)",
     EMA_POOL_CFG(reclaim_timeout), &ema__config_double},
    EMA_CONFIG_TABLE_END};

static void ema_pool_prefault_job(void *arg);

typedef struct {
    ema__pool_t *pool;
    uint32_t     next;
} ema_pool_prefault_t;

/* Fault the arena in, 8 segments a step, so that a borrow finds its memory
 * resident (a first touch costs milliseconds per 2 MiB) while the progress
 * thread stays responsive between steps. */
static void ema_pool_prefault_job(void *arg)
{
    ema_pool_prefault_t *pf = arg;
    ema__pool_t *pool = pf->pool;
    uint32_t nsegs = pool->arena->pool.nsegs;
    uint32_t n = (nsegs - pf->next < 8) ? nsegs - pf->next : 8;

    if (n > 0 && pool->arena->ops->prefault != NULL) {
        pool->arena->ops->prefault(pool->arena, pf->next, n);
    }
#ifdef MADV_POPULATE_WRITE
    /* And the page tables of our mappings of the peers' arenas, which put,
     * get and migrations write through: a fault per 4 KiB page otherwise. */
    for (int r = 0; n > 0 && pool->win->direct && r < pool->size; r++) {
        char *b = pool->win->peer_base[EMA_TIER_DEVICE][r];
        if (r != pool->rank && b != NULL) {
            madvise(b + (size_t)pf->next * pool->win->seg_size, (size_t)n * pool->win->seg_size,
                    MADV_POPULATE_WRITE);
        }
    }
#endif
    pf->next += n;
    if (pf->next < nsegs) {
        ema__xport_defer(pool->xp, 0, ema_pool_prefault_job, pf);
    } else {
        free(pf);
    }
}

ema_status_t ema__pool_init(ema__pool_t *pool, ema__win_ctx_t *win, ema__mem_arena_t *spill)
{
    uint32_t nsegs = win->tier[EMA_TIER_DEVICE]->pool.nsegs;

    pool->win   = win;
    pool->xp    = win->xp;
    pool->arena = win->tier[EMA_TIER_DEVICE];
    pool->spill = spill;
    pool->rank  = win->rank;
    pool->size  = win->size;
    pool->reserve_segs = (uint32_t)((pool->cfg.lend_reserve + win->seg_size - 1) / win->seg_size);
    pthread_mutex_init(&pool->lock, NULL);
    pthread_mutex_init(&pool->acq_lock, NULL);
    pthread_mutex_init(&pool->advert_lock, NULL);
    pool->parked  = NULL;
    atomic_init(&pool->release_gen, 0);
    pool->acq     = NULL;
    pool->nacq    = 0;
    pool->acq_cap = 0;
    pool->lent_to       = malloc(sizeof(int16_t) * nsegs);
    pool->recalling     = calloc(nsegs, 1);
    pool->granting      = calloc(nsegs, 1);
    pool->peer_lendable = calloc((size_t)(unsigned)pool->size, sizeof(*pool->peer_lendable));
    if (pool->lent_to == NULL || pool->recalling == NULL || pool->granting == NULL ||
        pool->peer_lendable == NULL) {
        ema__pool_cleanup(pool);
        return EMA_ERR_NO_MEMORY;
    }
    for (uint32_t s = 0; s < nsegs; s++) {
        pool->lent_to[s] = -1;
    }
    for (int r = 0; r < pool->size; r++) {
        uint64_t cap = win->exports[EMA_TIER_DEVICE][r].capacity / win->seg_size;
        atomic_init(&pool->peer_lendable[r], cap > pool->reserve_segs ? cap - pool->reserve_segs : 0);
    }
    /* what every peer assumes of us until we say otherwise */
    pool->advertised = atomic_load(&pool->peer_lendable[pool->rank]);
    atomic_init(&pool->recall_pending, 0);
    atomic_init(&pool->recall_refused, 0);
    ema__xport_set_am_handler(pool->xp, EMA_AM_POOL, ema_pool_am, pool);
    win->changed_cb  = ema_pool_advertise_job;
    win->changed_arg = pool;
    ema__pool_world = pool;
    return EMA_SUCCESS;
}

void ema__pool_start(ema__pool_t *pool)
{
    ema_pool_prefault_t *pf = malloc(sizeof(*pf));
    if (pf != NULL) {
        pf->pool = pool;
        pf->next = 0;
        ema__xport_defer(pool->xp, 0, ema_pool_prefault_job, pf);
    }
}

void ema__pool_cleanup(ema__pool_t *pool)
{
    while (pool->parked != NULL) { /* recalls still waiting for a release */
        ema_pool_job_t *job = pool->parked;
        pool->parked = job->next;
        free(job);
    }
    free(pool->lent_to);
    free(pool->recalling);
    free(pool->granting);
    pool->granting = NULL;
    free(pool->acq);
    pool->acq = NULL;
    free((void *)pool->peer_lendable);
    pool->lent_to       = NULL;
    pool->recalling     = NULL;
    pool->peer_lendable = NULL;
    ema__pool_world     = NULL;
}

void ema__pool_print_stats(ema__pool_t *pool, FILE *stream)
{
    size_t seg = pool->win->seg_size;
    ema__seg_pool_t *sp = &pool->arena->pool;
    fprintf(stream,
            "[ema %d] stats: capacity %zu, free %zu, lent %zu, withheld %zu, borrowed %zu, "
            "spilled %zu bytes; %lu reclaims (last %.0f us, max %.0f us), %lu bytes migrated\n",
            pool->rank, pool->arena->capacity, (size_t)ema__seg_pool_nfree(sp) * seg,
            (size_t)sp->nlent * seg, (size_t)pool->withheld * seg,
            (size_t)atomic_load(&pool->borrowed_segs) * seg,
            (size_t)atomic_load(&pool->spilled_segs) * seg,
            (unsigned long)atomic_load(&pool->reclaims), pool->reclaim_last_us,
            pool->reclaim_max_us, (unsigned long)atomic_load(&pool->bytes_migrated));
}
