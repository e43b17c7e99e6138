/*
 * The borrower's side of the protocol (msg.c has the diagram): the lender
 * order, borrowing, giving back, and recalls.  It is also the windows'
 * memory provider (ema__pool_mem_ops): the window asks it for memory and
 * gives memory back through it, and decides nothing about lenders.
 */
#include "pool_priv.h"

#include "topo/topo.h"
#include "util/log.h"
#include "util/sort.h"

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

/* @locs are mapped, or given back unmapped: they leave the granted set.  A
 * recall parked on one of them looks again (ema__pool_unpark, after they
 * left the set: see ema_pool_park for why no wake-up is lost). */
static void ema_pool_mapped(void *arg, const ema__loc_t *locs, uint32_t n)
{
    ema__pool_t *pool = arg;
    uint32_t gone     = 0;
    pthread_mutex_lock(&pool->acq_lock);
    for (uint32_t k = 0; k < n; k++) {
        for (size_t i = 0; i < pool->nacq; i++) {
            if (pool->acq[i] == locs[k]) {
                pool->acq[i] = pool->acq[--pool->nacq];
                gone++;
                break;
            }
        }
    }
    pthread_mutex_unlock(&pool->acq_lock);
    if (gone > 0) {
        ema__pool_unpark(pool);
    }
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

typedef struct {
    ema__pool_t *pool;
    int          lender;
    uint32_t     n;
    uint32_t     segs[];
} ema_pool_giveback_job_t;

static void ema_pool_giveback(ema__pool_t *pool, int lender, uint32_t count,
                              const uint32_t *segs);

static void ema_pool_giveback_job(void *arg)
{
    ema_pool_giveback_job_t *job = arg;
    ema_pool_giveback(job->pool, job->lender, job->n, job->segs);
    free(job);
}

/* Segments granted to nobody go back to the lender from a quick job (an AM
 * handler must not send). */
static void ema_pool_giveback_later(ema__pool_t *pool, int lender, const uint32_t *segs,
                                    uint32_t n)
{
    ema_pool_giveback_job_t *job = malloc(sizeof(*job) + n * sizeof(uint32_t));
    if (job == NULL) {
        ema_error("out of memory giving %u segments back to rank %d", n, lender);
        return;
    }
    job->pool   = pool;
    job->lender = lender;
    job->n      = n;
    memcpy(job->segs, segs, n * sizeof(uint32_t));
    ema__xport_defer(pool->xp, EMA_JOB_QUICK, ema_pool_giveback_job, job);
}

typedef struct {
    ema__pool_t          *pool;
    int                   src;
    const ema_pool_msg_t *m;
    const char           *payload;
    int                   wellformed;
    int                   taken;    /* the waiter took the segments */
    int                   answered; /* the waiter had its answer already */
} ema_pool_grant_arg_t;

/* Under the waiter table's lock: hand the grant to the borrower waiting for
 * it.  The segments join the granted set before the borrower wakes (it maps
 * them, then drops them from the set: the other order would leave a stale
 * entry that a recall waits on for ever).  Lock order: waiters.lock, then
 * acq_lock. */
static void ema_pool_grant_cb(void *waiter, const void *arg)
{
    ema_pool_waiter_t *w    = waiter;
    ema_pool_grant_arg_t *g = (ema_pool_grant_arg_t *)arg;
    uint32_t k = g->m->count;

    if (w->lender != g->src || atomic_load(&w->done)) {
        g->answered = atomic_load(&w->done);
        return; /* another rank's grant, or a second one: not for this borrow */
    }
    if (!g->wellformed || k > w->want) {
        k = 0; /* malformed: the borrower sees nothing granted */
    } else {
        const uint32_t *segs = (const uint32_t *)g->payload;
        for (uint32_t i = 0; i < k; i++) {
            ema__loc_t loc = EMA_LOC(g->src, EMA_TIER_DEVICE, segs[i]);
            ema_pool_acq_add(g->pool, &loc, 1);
            ema_trace("granted segment %u by rank %d", segs[i], g->src);
        }
        memcpy(w->segs, g->payload, (size_t)k * sizeof(uint32_t));
        memcpy(w->handles, g->payload + (size_t)k * sizeof(uint32_t),
               (size_t)k * sizeof(int64_t));
        g->taken = 1;
        atomic_store(&g->pool->peer_lendable[g->src], g->m->left);
    }
    w->count = k;
    atomic_store(&w->done, 1);
}

/* A GRANT: wake the borrower waiting for it (ema_pool_borrow_from). */
void ema__pool_granted(ema__pool_t *pool, int src, const ema_pool_msg_t *m,
                       const char *payload, size_t plen)
{
    const uint32_t *segs = (const uint32_t *)payload;
    uint64_t nsegs = ema__pool_peer_nsegs(pool, src);
    ema_pool_grant_arg_t g = {pool, src, m, payload, 1, 0, 0};

    /* On the host kind every segment of a lender is behind its arena's
     * memfd, whose number its export gives: a grant naming another of the
     * lender's files is malformed.  (The cuda kind exports a file per
     * segment: not checked here.) */
    const ema__mem_export_t *exp = &pool->win->exports[EMA_TIER_DEVICE][src];
    int host = pool->arena->ops->kind == EMA_MEMORY_KIND_HOST;

    g.wellformed = m->count <= nsegs && m->left <= nsegs &&
                   plen == (size_t)m->count * (sizeof(uint32_t) + sizeof(int64_t));
    for (uint32_t i = 0; g.wellformed && i < m->count; i++) {
        int64_t h;
        memcpy(&h, payload + (size_t)m->count * sizeof(uint32_t) + (size_t)i * sizeof(h),
               sizeof(h));
        g.wellformed = segs[i] < nsegs && (!host || h == exp->fd);
    }
    if (g.wellformed && m->count > 1) {
        /* each segment once: one mapped twice would alias two parts of a
         * window, and its second give-back would be refused */
        uint32_t *sorted = malloc((size_t)m->count * sizeof(uint32_t));
        if (sorted == NULL) {
            g.wellformed = 0;
        } else {
            memcpy(sorted, segs, (size_t)m->count * sizeof(uint32_t));
            qsort(sorted, m->count, sizeof(uint32_t), ema__cmp_u32);
            for (uint32_t i = 1; g.wellformed && i < m->count; i++) {
                g.wellformed = sorted[i] != sorted[i - 1];
            }
            free(sorted);
        }
    }
    if (!g.wellformed) {
        ema_malformed("malformed grant from rank %d (%u segments in %zu bytes): dropped", src,
                      m->count, plen);
    }
    int live = ema__xport_waiter_call(pool->xp, m->token, EMA_AM_POOL, ema_pool_grant_cb, &g);
    if (g.taken || !g.wellformed || m->count == 0) {
        return;
    }
    if (g.answered) {
        /* a second copy of a grant already taken: the segments are the
         * borrower's (given back would free them under it) */
        ema_malformed("grant from rank %d repeated: dropped", src);
        return;
    }
    /* nobody asked this rank for them: back to the lender rather than leak */
    if (ema__xport_peer_lost(pool->xp, src)) {
        /* the borrow gave up on it (EMA_PEER_TIMEOUT): nothing is sent to
         * a lost rank, so they stay lent there (ema(7) EMA_PEER_TIMEOUT) */
        ema_info("grant of %u segments from rank %d, which this rank lost (its borrow timed "
                 "out): they stay lent there", m->count, src);
        return;
    }
    ema_malformed("grant of %u segments from rank %d for no borrow waiting on it%s: given back",
              m->count, src, live ? " (another rank's)" : "");
    ema_pool_giveback_later(pool, src, segs, m->count);
}

/* Ask @lender for up to @want segments; returns how many it granted. */
static uint32_t ema_pool_borrow_from(ema__pool_t *pool, int lender, uint32_t want,
                                     uint32_t *segs, int64_t *handles)
{
    ema_pool_waiter_t w;
    ema_pool_msg_t m;

    atomic_init(&w.done, 0);
    w.lender  = lender;
    w.want    = want;
    w.count   = 0;
    w.segs    = segs;
    w.handles = handles;
    memset(&m, 0, sizeof(m));
    m.type  = EMA_POOL_MSG_BORROW;
    m.count = want;
    m.token = ema__xport_waiter_add(pool->xp, &w, EMA_AM_POOL);
    if (m.token == 0) {
        return 0;
    }
    if (ema__pool_send(pool, lender, &m, NULL, 0) == EMA_SUCCESS &&
        ema__xport_wait_flag_peer(pool->xp, EMA_WAIT_QUICK, lender, &w.done, 1) !=
            EMA_SUCCESS) {
        /* the lender died asking: nothing borrowed (a grant it sent is
         * dropped with its waiter) */
        ema__xport_waiter_del(pool->xp, m.token);
        return 0;
    }
    ema__xport_waiter_del(pool->xp, m.token);
    return w.count;
}

static void ema_pool_giveback(ema__pool_t *pool, int lender, uint32_t count, const uint32_t *segs)
{
    for (uint32_t i = 0; i < count && ema__log_level >= EMA_LOG_TRACE; i++) {
        ema_trace("giving back segment %u to rank %d", segs[i], lender);
    }
    if (ema__xport_peer_lost(pool->xp, lender)) {
        ema_debug("%u segments of lost rank %d dropped, not given back", count, lender);
        return;
    }
    ema_debug("giving back %u segments to rank %d", count, lender);
    ema_pool_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type  = EMA_POOL_MSG_GIVEBACK;
    m.count = count;
    if (ema__pool_send(pool, lender, &m, segs, (size_t)count * sizeof(uint32_t)) != EMA_SUCCESS) {
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

/* Free segments of the own arena that are not withheld: what this rank's
 * windows may take.  Requires pool->lock. */
static uint32_t ema_pool_own_free_locked(ema__pool_t *pool)
{
    uint32_t nfree = ema__seg_pool_nfree(&pool->arena->pool);
    return nfree > pool->withheld ? nfree - pool->withheld : 0;
}

/* Up to @want free segments of the own arena that are not withheld, used
 * by this rank's windows from now on: fills @locs and @handles (@segs is
 * scratch for @want), returns how many.  Requires pool->lock. */
static uint32_t ema_pool_take_own_locked(ema__pool_t *pool, uint32_t want, uint32_t *segs,
                                         ema__loc_t *locs, int64_t *handles)
{
    uint32_t n = ema_pool_own_free_locked(pool);

    n = n < want ? n : want;
    if (n == 0 || ema__seg_pool_alloc(&pool->arena->pool, n, EMA_SEG_USED, segs) != EMA_SUCCESS) {
        return 0;
    }
    for (uint32_t i = 0; i < n; i++) {
        locs[i]    = EMA_LOC(pool->rank, EMA_TIER_DEVICE, segs[i]);
        handles[i] = pool->arena->ops->seg_handle(pool->arena, segs[i]);
    }
    return n;
}

/*
 * Find memory for @want segments: the own arena (free, not withheld), then
 * peers in lender order (never @exclude), then the spill tier.  Fills locs
 * and handles; returns how many were found.
 */
static uint32_t ema_pool_acquire(void *arg, uint32_t want, int exclude, unsigned sources,
                                 ema__loc_t *locs, int64_t *handles)
{
    ema__pool_t *pool = arg;
    uint32_t got = 0, n;
    uint32_t *segs = malloc(sizeof(uint32_t) * (want ? want : 1));
    int *order = malloc(sizeof(int) * (size_t)(pool->size > 1 ? pool->size : 1));

    if (segs == NULL || order == NULL) {
        goto out;
    }
    /* 1. own free memory */
    if (!(sources & EMA_WIN_FROM_LOCAL)) {
        goto peers;
    }
    pthread_mutex_lock(&pool->lock);
    got = ema_pool_take_own_locked(pool, want, segs, locs, handles);
    pthread_mutex_unlock(&pool->lock);

peers:
    /* 2. peers, best first */
    if (!(sources & EMA_WIN_FROM_PEERS)) {
        goto spill;
    }
    int npeers = ema_pool_order(pool, exclude, order);
    for (int i = 0; i < npeers && got < want; i++) {
        if (ema__xport_peer_lost(pool->xp, order[i])) {
            continue;
        }
        n = ema_pool_borrow_from(pool, order[i], want - got, segs, handles + got);
        for (uint32_t k = 0; k < n; k++) {
            locs[got + k] = EMA_LOC(order[i], EMA_TIER_DEVICE, segs[k]);
        }
        got += n;
        atomic_fetch_add(&pool->borrowed_segs, n);
    }

spill:
    /* 3. the host spill tier */
    if (got < want && pool->spill != NULL && (sources & EMA_WIN_FROM_SPILL)) {
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
static void ema_pool_release_loc(ema__pool_t *pool, ema__loc_t loc)
{
    uint32_t s = EMA_LOC_SEG(loc);
    int r = EMA_LOC_RANK(loc);

    ema_pool_mapped(pool, &loc, 1);
    if (EMA_LOC_TIER(loc) == EMA_TIER_SPILL) {
        ema__seg_pool_free(&pool->spill->pool, 1, &s);
        atomic_fetch_sub(&pool->spilled_segs, 1);
    } else if (r == pool->rank) {
        pthread_mutex_lock(&pool->lock);
        ema__seg_pool_free(&pool->arena->pool, 1, &s);
        pthread_mutex_unlock(&pool->lock);
    } else {
        ema_pool_giveback(pool, r, 1, &s);
        atomic_fetch_sub(&pool->borrowed_segs, 1);
    }
}

/* Release the memory behind @old[0..n), batching the give-backs per lender. */
static void ema_pool_release(void *arg, const ema__loc_t *old, uint32_t n)
{
    ema__pool_t *pool = arg;
    /* granted but never mapped (a failed grow, an unused move target):
     * no longer ours, so a recall must not wait for them to be mapped */
    ema_pool_mapped(pool, old, n);
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
        ema_pool_giveback(pool, r, k, segs);
        atomic_fetch_sub(&pool->borrowed_segs, k);
    }
    for (uint32_t i = 0; i < n; i++) {
        if (done == NULL || !done[i]) {
            ema_pool_release_loc(pool, old[i]);
        }
    }
    free(segs);
    free(done);
}

/* Implicit reclaim: take back up to @need segments this rank lent out, and
 * hand what came back to the caller, a grow (@locs, @handles; returns how
 * many).  The reclaim withholds them until they are the caller's: they stop
 * being withheld and become used in one hold of pool->lock, so a BORROW
 * served meanwhile (a quick job, on any thread) cannot lend them away, nor
 * can a migration of this rank's take them, between the reclaim and the
 * grow. */
static uint32_t ema_pool_reclaim_for_self(void *arg, uint32_t need, ema__loc_t *locs,
                                          int64_t *handles)
{
    ema__pool_t *pool = arg;
    EMA_WIN_ASSERT_NONE_LOCKED(); /* ema__win_mem_ops_t: without any window lock */
    pthread_mutex_lock(&pool->lock);
    uint32_t lent = pool->arena->pool.nlent;
    pthread_mutex_unlock(&pool->lock);
    uint32_t n = need < lent ? need : lent, got;
    uint32_t *segs = (n > 0) ? malloc(n * sizeof(*segs)) : NULL;
    if (segs == NULL) {
        return 0;
    }
    uint64_t timeout_ms = (uint64_t)(pool->cfg.reclaim_timeout * 1e3);
    int withheld;
    ema__pool_reclaim(pool, n, timeout_ms, 0, &withheld);
    if (!withheld) {
        free(segs);
        return 0;
    }
    pthread_mutex_lock(&pool->lock);
    pool->withheld -= n; /* what came back is ours to use: taken at once */
    got = ema_pool_take_own_locked(pool, n, segs, locs, handles);
    pthread_mutex_unlock(&pool->lock);
    free(segs);
    return got;
}

/* Park a recall whose segments are held with ema_win_acquire, or granted to
 * this rank and not mapped yet, until the owner releases something or a
 * granted segment leaves the granted set (both ema__pool_unpark), unless
 * one of those came since the job started (@gen): then it runs again at
 * once.  No wake-up is lost: the job read @gen before it looked at the
 * held counts and the granted set; a waker changes those first, then
 * increments release_gen, then takes the parked list under pool->lock.
 * If the waker's lock came first, the job sees the new release_gen here;
 * if the job's came first, the waker finds it on the list. */
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
        ema__xport_defer(pool->xp, EMA_JOB_LONG, ema__pool_recall_job, job);
    } else {
        ema__win_recall_end(pool->win); /* parked: policies need not wait for it */
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
        ema__win_recall_begin(pool->win);
        if (ema__xport_try_defer(pool->xp, EMA_JOB_LONG, ema__pool_recall_job, job) !=
            EMA_SUCCESS) {
            /* Out of memory: a recall run in place here could deadlock,
             * since ema_pool_mapped unparks with a window's lock held.  The
             * rest stay parked for the next wake-up. */
            ema__win_recall_cancel(pool->win);
            ema_pool_job_t *tail = job;
            while (tail->next != NULL) {
                tail = tail->next;
            }
            pthread_mutex_lock(&pool->lock);
            tail->next   = pool->parked;
            pool->parked = job;
            pthread_mutex_unlock(&pool->lock);
            return;
        }
        job = next;
    }
}

/*
 * A lender wants these segments back: in every window the owner hears of
 * them, and the data moves elsewhere (win/migrate.c ema__win_recall),
 * which gives them back.  Segments held with ema_win_acquire stay (the
 * others move now); the job parks until the owner releases, then looks
 * again.  Segments granted to this rank and not mapped yet park it too,
 * until a grow maps them or gives them back (ema_pool_mapped).  So the job
 * never waits for the application, never spins, and runs as well from the
 * application's own ema_progress or ema_barrier.
 */
void ema__pool_recall_job(void *arg)
{
    ema_pool_job_t *job = arg;
    ema__pool_t *pool   = job->pool;
    uint64_t gen        = atomic_load(&pool->release_gen);
    uint32_t n          = job->msg.count, retry = 0, nheld = 0, nrefuse = 0;
    uint8_t *found      = calloc(n ? n : 1, 1);
    uint8_t *held       = calloc(n ? n : 1, 1);
    uint32_t *refuse    = calloc(n ? n : 1, sizeof(*refuse));
    uint32_t ngranted   = 0;

    EMA_WIN_ASSERT_NONE_LOCKED(); /* a long job; ema__win_recall takes the locks */
    ema_debug("recall of %u segments from rank %d: the job starts", n, job->src);

    if (found == NULL || held == NULL || refuse == NULL) {
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
    ema__win_recall(pool->win, job->src, job->segs, n, job->told, found, held, refuse,
                    &nrefuse);
    for (uint32_t k = 0; k < n; k++) {
        if (found[k] == 2 || held[k]) {
            /* granted to a grow or a migration of ours that had not mapped
             * it yet: look again once it has mapped it or given it back
             * (the owner hears of it then: told[k] is still 0); held:
             * after a release (heard of already).  Parked either way. */
            ngranted += (found[k] == 2);
            nheld += held[k];
            job->told[retry]   = job->told[k];
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
    if (ngranted > 0) {
        ema_debug("recall from rank %d: %u segments granted and not mapped yet move once "
                  "mapped", job->src, ngranted);
    }

    if (nrefuse > 0) {
        ema_pool_msg_t m;
        memset(&m, 0, sizeof(m));
        m.type  = EMA_POOL_MSG_REFUSE;
        m.count = nrefuse;
        ema__pool_send(pool, job->src, &m, refuse, (size_t)nrefuse * sizeof(uint32_t));
    }
    ema__pool_advertise(pool); /* the data may have moved into our own memory */
out:
    free(found);
    free(held);
    free(refuse);
    if (retry > 0) {
        job->msg.count = retry; /* told[] as left: the owner hears of each once */
        ema_pool_park(pool, job, gen);
        return;
    }
    free(job);
    ema__win_recall_end(pool->win);
}

static void ema_pool_changed(void *arg, unsigned what)
{
    if (what & EMA_WIN_CHANGED_RELEASED) {
        ema__pool_unpark(arg);
    }
    if (what & EMA_WIN_CHANGED_MEMORY) {
        ema__pool_advertise(arg);
    }
}

/* ema__win_mem_ops_t.local_free */
static uint32_t ema_pool_local_free(void *arg)
{
    ema__pool_t *pool = arg;
    pthread_mutex_lock(&pool->lock);
    uint32_t n = ema_pool_own_free_locked(pool);
    pthread_mutex_unlock(&pool->lock);
    return n;
}

const ema__win_mem_ops_t ema__pool_mem_ops = {
    .acquire          = ema_pool_acquire,
    .release          = ema_pool_release,
    .mapped           = ema_pool_mapped,
    .reclaim_for_self = ema_pool_reclaim_for_self,
    .changed          = ema_pool_changed,
    .local_free       = ema_pool_local_free,
};
