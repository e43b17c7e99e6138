/*
 * The paged KV cache of one rank, in an EMA window: blocks of 16 tokens, a
 * bitmap of free ones (the lowest free block first, so that the end of the
 * part empties and can be given back), and the owner of each block.
 *
 * How much memory the cache may use depends on the configuration:
 *   static   a part of C bytes, allocated once (EMA_DEVICE_MEMORY = C);
 *   double   a part of 2C, allocated once (EMA_DEVICE_MEMORY = 2C);
 *   oracle   a part of oracle_mult * C allocated once, all local, of which
 *            the rank may use what the shared pool (kv_shm.c) grants: its
 *            share C at once, more while the pool has it; no EMA call;
 *   elastic  a part that follows demand: ema_win_grow when blocks run out
 *            (EMA takes free local memory, then recalls what this rank
 *            lent, then borrows), ema_win_shrink when whole segments at its
 *            end are free, so idle memory can be lent.
 *
 * Reclaim, elastic (the borrower's side; ema(7) MIGRATION):
 *   1. Every step acquires the whole part (ema_win_acquire) before its
 *      loads, stores or kernels and releases it after: a recall that comes
 *      meanwhile waits for the release (one step at most), and an acquire
 *      waits out a move already under way (and lets the recalls queued or
 *      running go first: ema_win_acquire(3)).  So the reclaim callback
 *      (kv_reclaim_cb, on the progress thread) has nothing to stop; it
 *      counts what lenders recalled.
 *   2. If EMA has nowhere to move the recalled segments, the lender's grow
 *      fails and ema_win_stat reports them as bytes_wanted.  A part shrinks
 *      only at its end, so the engine frees that many segments' worth: the
 *      part's free blocks count first, and for the blocks still missing it
 *      preempts the youngest requests, as the oracle pays its debt
 *      (recompute later, generated tokens kept); then it moves the blocks
 *      left past the new end into the holes (compaction), and shrinks the
 *      part.  The lender's next grow then
 *      finds the memory (given back, or free here or at another lender to
 *      move its segments to).  The engine does not grow for giveback_hold_s
 *      afterwards, so that the lender gets there first.
 *
 * The time of every EMA call is added up (kv_cache_take_ema_us): the host
 * kind's virtual clock charges it to the step.
 */
#include "kv_serving.h"
#include "kv_gpu.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define KV_PEAK_BUCKETS 8 /* shrink_after_s in buckets: a sliding peak */

struct kv_cache {
    const kv_params_t *p;
    int         rank, nranks, gpu;
    kv_cfg_t    cfg;
    kv_stats_t *st;
    ema_win_h   win;
    char       *base;
    size_t      seg, blk_bytes, bps; /* segment, block, blocks per segment */
    size_t      c_blocks;            /* C */
    size_t      nsegs, max_segs;     /* the part, in segments */
    size_t      nblk;                /* blocks in the part */
    uint64_t   *freemap;             /* bit set: free block (below nblk) */
    size_t      nwords, low_word;    /* no free bit below low_word */
    size_t      nfree;
    int32_t    *owner;               /* request index, -1 free */
    uint32_t   *seg_used;            /* used blocks per segment */
    double      ema_us;
    /* oracle */
    int64_t     taken;               /* granted by the pool, not allocated */
    /* elastic */
    double      next_grow, backoff, hold_until, wait_start;
    size_t      wanted_credit;
    size_t      gb_segs;             /* a give-back in progress: new size */
    int         gb_pending;
    _Atomic uint64_t cb_bytes;       /* recalled, as the callback said */
    uint64_t    cb_seen;
    pthread_t   engine;
    int         pin_active;          /* the part is acquired (a step) */
    double      gb_now;
    const char *gb_why;              /* "giveback" (a lender's), "shrink" */
    size_t      peak[KV_PEAK_BUCKETS]; /* most blocks in use, per bucket of time */
    size_t      peak_bucket;
    uint64_t    unmet_seen;          /* ema_mem_stat's bytes_unmet, last seen */
    double      demand_until;        /* a peer was short: shrink eagerly until then */
};

static void kv_die(const char *what, ema_status_t s)
{
    fprintf(stderr, "kv_serving: %s: %s\n", what, ema_strerror(s));
    exit(1);
}

#define KV_TIMED(_kc, _stmt) \
    do { \
        double t_ = kv_now(); \
        _stmt; \
        (_kc)->ema_us += (kv_now() - t_) * 1e6; \
    } while (0)

static void kv_reclaim_cb(ema_win_h win, size_t offset, size_t len, void *arg)
{
    kv_cache_t *kc = arg;
    (void)win;
    (void)offset;
    /* our own shrink moves segments home on this thread, between steps;
     * a recall's move waits for the step's release (see the top): only
     * count what lenders asked for */
    if (!pthread_equal(pthread_self(), kc->engine)) {
        atomic_fetch_add(&kc->cb_bytes, len);
    }
}

/* --- the bitmap -------------------------------------------------------------- */

static void kv_bit_set(kv_cache_t *kc, size_t b)
{
    kc->freemap[b / 64] |= 1ull << (b % 64);
    if (b / 64 < kc->low_word) {
        kc->low_word = b / 64;
    }
}

static void kv_bit_clear(kv_cache_t *kc, size_t b)
{
    kc->freemap[b / 64] &= ~(1ull << (b % 64));
}

/* the lowest free block below @limit, or SIZE_MAX */
static size_t kv_lowest_free(kv_cache_t *kc, size_t limit)
{
    for (size_t w = kc->low_word; w < kc->nwords && w * 64 < limit; w++) {
        if (kc->freemap[w] != 0) {
            kc->low_word = w;
            size_t b = w * 64 + (size_t)__builtin_ctzll(kc->freemap[w]);
            return b < limit ? b : SIZE_MAX;
        }
    }
    return SIZE_MAX;
}

static void kv_acquire(kv_cache_t *kc, size_t first_seg, size_t nsegs)
{
    ema_status_t s;
    KV_TIMED(kc, s = ema_win_acquire(kc->win, first_seg * kc->seg, nsegs * kc->seg));
    if (s != EMA_SUCCESS) {
        kv_die("ema_win_acquire", s);
    }
}

static void kv_set_segs(kv_cache_t *kc, size_t nsegs)
{
    size_t nb = nsegs * kc->bps;
    for (size_t b = kc->nblk; b < nb; b++) {
        kc->owner[b] = -1;
        kv_bit_set(kc, b);
        kc->nfree++;
    }
    for (size_t b = nb; b < kc->nblk; b++) { /* shrinking: all free */
        kv_bit_clear(kc, b);
        kc->nfree--;
    }
    size_t old = kc->nsegs;
    for (size_t s = old; s < nsegs; s++) {
        kc->seg_used[s] = 0;
    }
    kc->nblk  = nb;
    kc->nsegs = nsegs;
    if (kc->pin_active && nsegs > old) { /* grown during a step: pin that too */
        kv_acquire(kc, old, nsegs - old);
    }
}

/* --- create ------------------------------------------------------------------ */

kv_cache_t *kv_cache_create(const kv_params_t *p, int rank, int nranks, size_t capacity,
                            kv_stats_t *st)
{
    kv_cache_t *kc = calloc(1, sizeof(*kc));
    ema_mem_stat_t ms = {0}; /* field_mask 0 (where there is one): every field */
    ema_status_t s;

    kc->p = p;
    kc->rank = rank;
    kc->nranks = nranks;
    kc->cfg = p->cfg;
    kc->st = st;
    kc->engine = pthread_self();
    if ((s = ema_mem_stat(&ms)) != EMA_SUCCESS) {
        kv_die("ema_mem_stat", s);
    }
    kc->gpu = ms.memory_kind == EMA_MEMORY_KIND_CUDA;
    /* the segment size: ema.h does not give it, but a window of one byte
     * has one segment of address space (collective, like the rest) */
    {
        void *b;
        ema_win_h w;
        size_t sz;
        ema_win_stat_t ws = {0};
        if ((s = ema_win_allocate(1, NULL, &b, &w)) != EMA_SUCCESS) {
            kv_die("ema_win_allocate", s);
        }
        ema_win_stat(w, &ws);
        sz = ws.max_size;
        ema_win_free(w);
        kc->seg = sz;
    }
    kc->blk_bytes = p->tok_bytes * KV_BLOCK_TOKENS;
    if (kc->seg % kc->blk_bytes != 0) {
        fprintf(stderr, "kv_serving: a KV block (%zu B) must divide the segment (%zu B)\n",
                kc->blk_bytes, kc->seg);
        exit(1);
    }
    kc->bps      = kc->seg / kc->blk_bytes;
    size_t c     = p->kv_mem / kc->seg * kc->seg;
    kc->c_blocks = c / kc->blk_bytes;
    size_t fixed = 0;
    switch (kc->cfg) {
    case KV_CFG_STATIC:  fixed = c; break;
    case KV_CFG_DOUBLE:  fixed = 2 * c; break;
    case KV_CFG_ORACLE:  fixed = (size_t)(p->oracle_mult * (double)c) / kc->seg * kc->seg; break;
    case KV_CFG_ELASTIC: fixed = 0; break;
    default: break;
    }
    if (fixed > capacity) {
        fprintf(stderr, "kv_serving: rank %d: %s needs %zu MiB of EMA_DEVICE_MEMORY, has %zu "
                "MiB\n", rank, kv_cfg_name[kc->cfg], fixed >> 20, capacity >> 20);
        exit(1);
    }
    kc->max_segs = fixed ? fixed / kc->seg : (size_t)nranks * (c / kc->seg);
    size_t maxb  = kc->max_segs * kc->bps;
    kc->nwords   = (maxb + 63) / 64;
    kc->freemap  = calloc(kc->nwords, sizeof(uint64_t));
    kc->owner    = malloc(maxb * sizeof(int32_t));
    kc->seg_used = calloc(kc->max_segs, sizeof(uint32_t));
    kc->backoff  = p->grow_backoff_s;
    kc->wait_start = -1;

    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE,
                           .max_size   = kc->max_segs * kc->seg};
    void *base;
    if ((s = ema_win_allocate(fixed, &wp, &base, &kc->win)) != EMA_SUCCESS) {
        kv_die("ema_win_allocate", s);
    }
    kc->base = base;
    kv_set_segs(kc, fixed / kc->seg);
    if (kc->cfg == KV_CFG_ELASTIC &&
        (s = ema_win_set_reclaim_cb(kc->win, kv_reclaim_cb, kc)) != EMA_SUCCESS) {
        kv_die("ema_win_set_reclaim_cb", s);
    }
    if (kc->cfg == KV_CFG_ORACLE) {
        kv_pool_init(nranks, (int64_t)kc->c_blocks);
    }
    return kc;
}

void kv_cache_destroy(kv_cache_t *kc)
{
    ema_status_t s = ema_win_free(kc->win);
    if (s != EMA_SUCCESS) {
        kv_die("ema_win_free", s);
    }
    free(kc->freemap);
    free(kc->owner);
    free(kc->seg_used);
    free(kc);
}

char *kv_cache_base(kv_cache_t *kc) { return kc->base; }
size_t kv_cache_blk_bytes(kv_cache_t *kc) { return kc->blk_bytes; }
size_t kv_cache_c_blocks(kv_cache_t *kc) { return kc->c_blocks; }
size_t kv_cache_used_blocks(kv_cache_t *kc) { return kc->nblk - kc->nfree; }

double kv_cache_take_ema_us(kv_cache_t *kc)
{
    double v = kc->ema_us;
    kc->ema_us = 0;
    return v;
}

/* free blocks this step may use */
static size_t kv_usable(kv_cache_t *kc)
{
    return kc->nfree;
}

size_t kv_cache_free_blocks(kv_cache_t *kc)
{
    if (kc->cfg == KV_CFG_ORACLE) {
        return (size_t)kc->taken;
    }
    return kv_usable(kc);
}

/* --- elastic grow ------------------------------------------------------------ */

static int kv_grow(kv_cache_t *kc, size_t missing, double now)
{
    size_t segs = (missing + kc->bps - 1) / kc->bps;
    size_t want = kc->nsegs + segs;
    ema_mem_stat_t m0 = {0}, m1 = {0};
    ema_status_t s;
    double t0;

    if (want > kc->max_segs || now < kc->next_grow || now < kc->hold_until) {
        return -1;
    }
    KV_TIMED(kc, ema_mem_stat(&m0));
    t0 = kv_now();
    /* --grow-ahead: headroom, so that the next steps need no grow; where
     * there is not that much, the need alone */
    size_t ahead = want + (size_t)kc->p->grow_ahead;
    ahead = (ahead < kc->max_segs) ? ahead : kc->max_segs;
    s = EMA_ERR_NO_MEMORY;
    if (ahead > want && (s = ema_win_grow(kc->win, ahead * kc->seg)) == EMA_SUCCESS) {
        segs += ahead - want;
        want  = ahead;
    }
    if (s == EMA_ERR_NO_MEMORY) {
        s = ema_win_grow(kc->win, want * kc->seg);
    }
    double us = (kv_now() - t0) * 1e6;
    kc->ema_us += us;
    KV_TIMED(kc, ema_mem_stat(&m1));
    if (s == EMA_SUCCESS) {
        kv_set_segs(kc, want);
        kv_stats_event(kc->st, now, "grow", (double)(segs * kc->seg), us);
        if (m1.bytes_lent < m0.bytes_lent) {
            kv_stats_event(kc->st, now, "recall", (double)(m0.bytes_lent - m1.bytes_lent), us);
        }
        if (kc->wait_start >= 0) {
            kv_stats_event(kc->st, now, "lender_wait", 0, (now - kc->wait_start) * 1e6 + us);
            kc->wait_start = -1;
        } else if (m1.bytes_lent < m0.bytes_lent) {
            kv_stats_event(kc->st, now, "lender_wait", 0, us);
        }
        kc->backoff   = kc->p->grow_backoff_s;
        kc->next_grow = 0;
        return 0;
    }
    if (s != EMA_ERR_NO_MEMORY) {
        kv_die("ema_win_grow", s);
    }
    kv_stats_event(kc->st, now, "grow_fail", (double)(segs * kc->seg), us);
    if (m0.bytes_lent > 0 && segs * kc->seg > m0.bytes_free) {
        /* memory we lent would have served it: a borrower refused (it had
         * nowhere to move it) and will give it back (bytes_wanted) */
        kv_stats_event(kc->st, now, "refusal", (double)(segs * kc->seg), us);
        if (kc->wait_start < 0) {
            kc->wait_start = now;
        }
        /* ask again soon: the borrower answers within a step or two (and
         * gives back again after its hold if it was not enough) */
        kc->next_grow = now + kc->backoff;
        kc->backoff   = fmin(kc->backoff * 2, 8 * kc->p->grow_backoff_s);
    } else {
        /* nobody had memory: every failed grow asks every peer, so ask
         * less and less often (the next success resets it) */
        kc->next_grow = now + kc->backoff;
        kc->backoff   = fmin(kc->backoff * 2, kc->p->grow_backoff_max_s);
    }
    return -1;
}

int kv_cache_reserve(kv_cache_t *kc, size_t n, double now)
{
    switch (kc->cfg) {
    case KV_CFG_ORACLE:
        if ((size_t)kc->taken >= n) {
            return 0;
        }
        if (n > kv_usable(kc)) {
            return -1; /* the part itself is full */
        }
        if (kv_pool_take(kc->rank, (int64_t)n - kc->taken) != 0) {
            return -1;
        }
        kc->taken = (int64_t)n;
        return 0;
    case KV_CFG_ELASTIC:
        if (kv_usable(kc) >= n) {
            if (kc->wait_start >= 0) {
                /* waiting for lent memory, the need went away (requests
                 * finished): the wait is over all the same */
                if (now > kc->wait_start) {
                    kv_stats_event(kc->st, now, "lender_wait", 0, (now - kc->wait_start) * 1e6);
                }
                kc->wait_start = -1;
            }
            return 0;
        }
        return kv_grow(kc, n - kv_usable(kc), now);
    default:
        return kv_usable(kc) >= n ? 0 : -1;
    }
}

uint32_t kv_cache_alloc(kv_cache_t *kc, int32_t owner)
{
    size_t b = kv_lowest_free(kc, kc->nblk);
    if (b == SIZE_MAX) {
        fprintf(stderr, "kv_serving: rank %d: no free block (a scheduler bug)\n", kc->rank);
        exit(1);
    }
    kv_bit_clear(kc, b);
    kc->nfree--;
    kc->owner[b] = owner;
    kc->seg_used[b / kc->bps]++;
    if (kc->cfg == KV_CFG_ORACLE) {
        kc->taken--;
    }
    return (uint32_t)b;
}

void kv_cache_free(kv_cache_t *kc, uint32_t b)
{
    kc->owner[b] = -1;
    kv_bit_set(kc, b);
    kc->nfree++;
    kc->seg_used[b / kc->bps]--;
    if (kc->cfg == KV_CFG_ORACLE) {
        kv_pool_put(kc->rank, 1);
    }
}


/* --- pins ------------------------------------------------------------------- */

void kv_cache_pin(kv_cache_t *kc)
{
    kc->pin_active = 1;
    if (kc->nsegs > 0) {
        kv_acquire(kc, 0, kc->nsegs);
    }
}

void kv_cache_unpin(kv_cache_t *kc)
{
    ema_status_t s;
    if (kc->nsegs > 0) {
        KV_TIMED(kc, s = ema_win_release(kc->win, 0, kc->nsegs * kc->seg));
        if (s != EMA_SUCCESS) {
            kv_die("ema_win_release", s);
        }
    }
    kc->pin_active = 0;
}

/* --- maintenance -------------------------------------------------------------- */

static void kv_shrink_to(kv_cache_t *kc, size_t segs, double now, const char *why)
{
    ema_status_t s;
    double t0;

    t0 = kv_now();
    s = ema_win_shrink(kc->win, segs * kc->seg);
    double us = (kv_now() - t0) * 1e6;
    kc->ema_us += us;
    if (s != EMA_SUCCESS) {
        kv_die("ema_win_shrink", s);
    }
    kv_stats_event(kc->st, now, why, (double)((kc->nsegs - segs) * kc->seg), us);
    kv_set_segs(kc, segs);
}

/* Whether a peer is short of memory now: ema_mem_stat's bytes_unmet rose
 * (it asked this rank to lend and found nothing) within shrink_after_s.
 * Then the give-back of kv_cache_maintain is eager (eager_keep spare
 * segments, the peak of eager_buckets eighths of the window): memory kept
 * idle in this rank's window is out of every peer's reach, since EMA
 * recalls only lent memory.  Otherwise it is calm (shrink_keep, the whole
 * window): memory needed again soon would be recalled from a busy peer,
 * which then preempts.  Host model (doc/kv_serving.md), session 10:
 * elastic / oracle on the rotating load 0.81 calm, 0.94 always eager, 0.93
 * on demand; elastic / static on the stationary one 1.04, 0.84 and 0.88.
 * With session 11's victim choice, on demand: 0.95-0.97 and 1.09.
 * Session 16, C = 256 MiB, 12 seeds: the peak of 2 eighths (0.25 s)
 * instead of 4 gave 0.972 against 0.959 (rotating) and 0.953 against 0.920
 * elastic / double (stationary); 20 seeds of rotating 0.970 against 0.954.
 * 1 eighth was no better (0.969), 8 worse (0.915), so the default is 2. */
static int kv_peer_short(kv_cache_t *kc, double now)
{
    ema_mem_stat_t ms = {0};
    ema_status_t s;

    KV_TIMED(kc, s = ema_mem_stat(&ms));
    if (s != EMA_SUCCESS) {
        kv_die("ema_mem_stat", s);
    }
    if (ms.bytes_unmet > kc->unmet_seen) {
        if (now >= kc->demand_until) {
            kv_stats_event(kc->st, now, "peer_short", (double)(ms.bytes_unmet - kc->unmet_seen), 0);
        }
        kc->unmet_seen   = ms.bytes_unmet;
        kc->demand_until = now + kc->p->shrink_after_s;
    }
    return now < kc->demand_until;
}

/* youngest first: the least work lost */
static int kv_younger(const kv_req_t *a, const kv_req_t *b)
{
    return a->arrive > b->arrive;
}

/* Victims that free @blocks blocks, the youngest requests first (the
 * latest to arrive: least work lost, FCFS kept); returns how many. */
static size_t kv_pick_youngest(kv_cache_t *kc, kv_req_t *rq, size_t blocks, uint32_t *victims,
                               size_t max_victims)
{
    size_t nv = 0, freed = 0;
    while (freed < blocks && nv < max_victims) {
        int32_t best = -1;
        for (size_t b = 0; b < kc->nblk; b++) {
            int32_t r = kc->owner[b];
            if (r < 0 || rq[r].victim) {
                continue;
            }
            if (best < 0 || kv_younger(&rq[r], &rq[best])) {
                best = r;
            }
        }
        if (best < 0) {
            break;
        }
        rq[best].victim = 1;
        victims[nv++] = (uint32_t)best;
        freed += rq[best].nblk;
    }
    for (size_t i = 0; i < nv; i++) {
        rq[victims[i]].victim = 0;
    }
    return nv;
}

size_t kv_cache_maintain(kv_cache_t *kc, kv_req_t *rq, double now, int idle,
                         uint32_t *victims, size_t max_victims)
{
    size_t nv = 0;

    if (kc->cfg == KV_CFG_ORACLE) {
        /* give back the grant not used, then pay any debt: preempt the
         * youngest requests (no copy, no EMA cost: the oracle's hand-over
         * is free and instant) */
        if (kc->taken > 0) {
            kv_pool_put(kc->rank, kc->taken);
            kc->taken = 0;
        }
        int64_t owed = kv_pool_owed(kc->rank);
        if (owed <= 0) {
            return 0;
        }
        return kv_pick_youngest(kc, rq, (size_t)owed, victims, max_victims);
    }
    if (kc->cfg != KV_CFG_ELASTIC) {
        return 0;
    }

    ema_win_stat_t ws = {0};
    ema_status_t s;
    KV_TIMED(kc, s = ema_win_stat(kc->win, &ws));
    if (s != EMA_SUCCESS) {
        kv_die("ema_win_stat", s);
    }
    /* 1. what lenders recalled, as the callback counted it */
    uint64_t cb = atomic_load(&kc->cb_bytes);
    if (cb > kc->cb_seen) {
        kv_stats_event(kc->st, now, "recalled", (double)(cb - kc->cb_seen), 0);
        kc->cb_seen = cb;
    }
    /* 2. memory lenders want back and we had nowhere to move.  What we
     * gave back counts against bytes_wanted until our hold is over: the
     * lender retries within it.  If bytes_wanted is still there then, the
     * memory freed went elsewhere (a busy third rank took back its own, say)
     * and we give back again. */
    if (ws.bytes_wanted == 0 || now >= kc->hold_until) {
        kc->wanted_credit = 0;
    }
    if (ws.bytes_wanted > kc->wanted_credit && !kc->gb_pending && kc->nsegs > 0) {
        size_t k = (ws.bytes_wanted - kc->wanted_credit + kc->seg - 1) / kc->seg;
        k = k < kc->nsegs ? k : kc->nsegs;
        /* The part shrinks by k segments at its end, and compaction moves
         * the blocks past the cut into free ones below it: so only the
         * blocks missing for that are freed, by preempting the youngest
         * requests, as the oracle pays its debt.  (Until session 11 it
         * preempted every owner of k whole segments, those with the fewest
         * owners first, whatever the part had free: in the host model of
         * the cuda preset that was 60% of elastic's preemptions, and
         * elastic/oracle rose from 0.91 to 0.95-0.97 without it.) */
        size_t cut_blocks = k * kc->bps;
        nv = kv_pick_youngest(kc, rq, cut_blocks > kc->nfree ? cut_blocks - kc->nfree : 0,
                              victims, max_victims);
        kc->gb_segs    = kc->nsegs - k;
        kc->gb_pending = 1;
        kc->gb_now     = now;
        kc->gb_why     = "giveback";
        kc->wanted_credit += k * kc->seg;
        kc->hold_until = now + kc->p->giveback_hold_s;
        kv_stats_event(kc->st, now, "wanted", (double)ws.bytes_wanted, 0);
        return nv; /* the engine preempts them, then kv_cache_finish_giveback */
    }
    /* 3. more segments than the blocks in use need (requests finished, or
     * a backlog drained): give the rest back.  Blocks in use are spread
     * over the part, so those past the new end move into free blocks below
     * it first (compaction: a block copy each), then the part shrinks.
     * Without this a part keeps a few long requests' blocks at its end and
     * holds borrowed memory it no longer uses.  Only what the rank has not
     * needed for shrink_after_s (the peak of its blocks in use over that
     * time), and only with nobody waiting: memory given away and needed
     * again soon has to be recalled from a busy peer, which then preempts
     * to give it back - churn that costs both. */
    int eager = kv_peer_short(kc, now);
    size_t used = kc->nblk - kc->nfree;
    double width  = kc->p->shrink_after_s / KV_PEAK_BUCKETS;
    size_t bucket = width > 0 ? (size_t)(now / width) : kc->peak_bucket + KV_PEAK_BUCKETS;
    if (bucket != kc->peak_bucket) {
        for (size_t b = kc->peak_bucket + 1; b <= bucket && b <= kc->peak_bucket + KV_PEAK_BUCKETS;
             b++) {
            kc->peak[b % KV_PEAK_BUCKETS] = 0;
        }
        kc->peak_bucket = bucket;
    }
    if (used > kc->peak[bucket % KV_PEAK_BUCKETS]) {
        kc->peak[bucket % KV_PEAK_BUCKETS] = used;
    }
    size_t peak = 0;
    for (int j = 0; j < (eager ? kc->p->eager_buckets : KV_PEAK_BUCKETS); j++) {
        size_t b = (bucket + KV_PEAK_BUCKETS - (size_t)j) % KV_PEAK_BUCKETS;
        peak = kc->peak[b] > peak ? kc->peak[b] : peak;
    }
    if (!kc->gb_pending && idle) {
        size_t keep = (size_t)(eager ? kc->p->eager_keep : kc->p->shrink_keep);
        size_t need = (peak + kc->bps - 1) / kc->bps + keep;
        if (kc->nsegs >= need + keep + 1) {
            size_t used_segs = kc->nsegs;
            while (used_segs > 0 && kc->seg_used[used_segs - 1] == 0) {
                used_segs--;
            }
            if (used_segs <= need) {
                kv_shrink_to(kc, need, now, "shrink");
            } else {
                kc->gb_segs    = need;
                kc->gb_pending = 1;
                kc->gb_now     = now;
                kc->gb_why     = "shrink";
            }
        }
    }
    return 0;
}

void kv_cache_finish_giveback(kv_cache_t *kc, kv_req_t *rq)
{
    if (!kc->gb_pending) {
        return;
    }
    size_t cut = kc->gb_segs * kc->bps;
    uint32_t *src = malloc((kc->nblk - cut + 1) * sizeof(uint32_t));
    uint32_t *dst = malloc((kc->nblk - cut + 1) * sizeof(uint32_t));
    size_t n = 0;

    kv_cache_pin(kc);
    /* compaction: every block past the cut to the lowest free one below */
    for (size_t b = cut; b < kc->nblk; b++) {
        int32_t r = kc->owner[b];
        if (r < 0) {
            continue;
        }
        size_t f = kv_lowest_free(kc, cut);
        if (f == SIZE_MAX) {
            fprintf(stderr, "kv_serving: rank %d: compaction found no room (a bug)\n", kc->rank);
            exit(1);
        }
        kv_bit_clear(kc, f);
        kc->owner[f] = r;
        kc->seg_used[f / kc->bps]++;
        kc->owner[b] = -1;
        kv_bit_set(kc, b);
        kc->seg_used[b / kc->bps]--;
        for (uint32_t k = 0; k < rq[r].nblk; k++) {
            if (rq[r].blk[k] == b) {
                rq[r].blk[k] = (uint32_t)f;
                break;
            }
        }
        src[n] = (uint32_t)b;
        dst[n] = (uint32_t)f;
        n++;
    }
    if (n > 0) {
        if (kc->gpu) {
            if (kv_gpu_copy_blocks(kc->base, kc->blk_bytes, src, dst, (uint32_t)n) != 0) {
                fprintf(stderr, "kv_serving: %s\n", kv_gpu_error());
                exit(1);
            }
        } else {
            /* charged to the step like an EMA call: elastic's own cost */
            KV_TIMED(kc, for (size_t i = 0; i < n; i++) {
                memcpy(kc->base + dst[i] * kc->blk_bytes, kc->base + src[i] * kc->blk_bytes,
                       kc->blk_bytes);
            });
        }
    }
    kv_cache_unpin(kc);
    free(src);
    free(dst);
    kc->gb_pending = 0;
    kv_stats_event(kc->st, kc->gb_now, "compact", (double)(n * kc->blk_bytes), 0);
    kv_shrink_to(kc, kc->gb_segs, kc->gb_now, kc->gb_why);
}

void kv_cache_mem(kv_cache_t *kc, size_t *size_p, size_t *local_p, size_t *borrowed_p,
                  size_t *lent_p)
{
    if (kc->cfg == KV_CFG_ORACLE) {
        size_t used = (size_t)kv_pool_used(kc->rank) * kc->blk_bytes;
        size_t c    = kc->c_blocks * kc->blk_bytes;
        *size_p     = used;
        *local_p    = used < c ? used : c;
        *borrowed_p = used > c ? used - c : 0;
        *lent_p     = 0;
        return;
    }
    ema_win_stat_t ws = {0};
    ema_mem_stat_t ms = {0}; /* field_mask 0 (where there is one): every field */
    KV_TIMED(kc, ema_win_stat(kc->win, &ws));
    KV_TIMED(kc, ema_mem_stat(&ms));
    *size_p     = ws.size;
    *local_p    = ws.bytes_local;
    *borrowed_p = ws.bytes_borrowed + ws.bytes_spilled;
    *lent_p     = ms.bytes_lent;
}
