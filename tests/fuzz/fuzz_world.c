/*
 * A world without PMIx or UCX for the decoders of EMA's active messages
 * (fuzz_world.h says what an input is).  Everything is plain memory: a
 * transport with no worker (its sends go to send_stub), host-kind arenas
 * in malloc'd memory, a window context built field by field as
 * ema__win_ctx_init and ema__win_ctx_connect would leave it, two windows
 * as ema__win_allocate would, and the real pool (ema__pool_init).  The
 * handlers, the jobs they queue, the waiter table and the segment pools are
 * the library's own.  One world per input: nothing carries over.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* MAP_FIXED_NOREPLACE */
#endif
#include "fuzz_world.h"

#include "pool/pool_priv.h"
#include "util/log.h"
#include "win/coherence.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define NR   EMA_FUZZ_RANKS
#define ME   EMA_FUZZ_ME
#define SEG  ((size_t)EMA_FUZZ_SEG)

typedef struct {
    ema__xport_t      xp;
    ema__mem_arena_t  arena, spill;
    ema__win_ctx_t    ctx;
    ema__pool_t       pool;
    struct ema_win   *win[2];
    ema__win_waiter_t w_inval, w_fetch, w_amo;
    uint32_t          acked[NR];
    ema_pool_waiter_t w_grant;
    uint32_t          g_segs[4];
    int64_t           g_handles[4];
    int               sends;
    /* the own parts as built: no message may change them */
    ema__loc_t        own_loc[2][32];
    uint64_t          own_size[2], own_version[2];
    uint32_t          own_nsegs[2];
} fuzz_world_t;

static fuzz_world_t W;

static void fuzz_fail(const char *what)
{
    fprintf(stderr, "fuzz_world: invariant broken: %s\n", what);
    abort();
}

#define CHECK(_cond)                  \
    do {                              \
        if (!(_cond)) {               \
            fuzz_fail(#_cond);        \
        }                             \
    } while (0)

/* Every message the world sends: to a peer, on an id of the library's. */
static ema_status_t send_stub(void *arg, int peer, unsigned id, const void *hdr, size_t hlen,
                              const void *data, size_t len)
{
    CHECK(peer >= 0 && peer < NR && peer != ME);
    CHECK(id == EMA_AM_COLL || id == EMA_AM_WIN || id == EMA_AM_POOL);
    CHECK(hdr != NULL && hlen > 0);
    CHECK(len == 0 || data != NULL);
    W.sends++;
    return EMA_SUCCESS;
}

/* The own arena and spill tier at their fixed addresses (mapped once,
 * filled again for each input). */
static void *fixed_map(uint64_t addr, size_t len)
{
    static void *mapped[2];
    int i = (addr == EMA_FUZZ_BASE) ? 0 : 1;
    if (mapped[i] == NULL) {
        void *p = mmap((void *)(uintptr_t)addr, len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (p != (void *)(uintptr_t)addr) {
            fprintf(stderr, "fuzz_world: cannot map %zu bytes at %#" PRIx64 "\n", len, addr);
            abort();
        }
        mapped[i] = p;
    }
    return mapped[i];
}

static void arena_up(ema__mem_arena_t *a, uint64_t addr, uint32_t nsegs, int fd)
{
    memset(a, 0, sizeof(*a));
    a->ops      = &ema__mem_host_ops;
    a->capacity = nsegs * SEG;
    a->seg_size = SEG;
    a->base     = fixed_map(addr, a->capacity);
    a->fd       = fd;
    a->device   = -1;
    memset(a->base, fd, a->capacity);
    CHECK(ema__seg_pool_init(&a->pool, nsegs) == EMA_SUCCESS);
}

static void arena_down(ema__mem_arena_t *a)
{
    ema__seg_pool_cleanup(&a->pool);
}

/* A part's table: @n locations, @size bytes. */
static void part_set(struct ema_win *w, int r, uint32_t n, const ema__loc_t *locs, size_t size)
{
    ema__win_part_t *p = &w->parts[r];
    for (uint32_t i = 0; i < n; i++) {
        atomic_init(&p->loc[i], locs[i]);
    }
    atomic_init(&p->nsegs, n);
    atomic_init(&p->size, size);
    atomic_init(&p->version, 1);
}

static struct ema_win *win_up(uint32_t id, uint32_t max_segs)
{
    ema__win_ctx_t *c = &W.ctx;
    struct ema_win *w = calloc(1, sizeof(*w));
    CHECK(w != NULL);
    w->magic = EMA_WIN_MAGIC;
    w->id    = id;
    w->ctx   = c;
    w->parts = calloc(NR, sizeof(*w->parts));
    w->held  = calloc(max_segs, sizeof(*w->held));
    CHECK(w->parts != NULL && w->held != NULL);
    pthread_mutex_init(&w->lock, NULL);
    atomic_init(&w->prefetching, 0);
    atomic_init(&w->refs, 1); /* the list's, as ema__win_allocate links it */
    for (int r = 0; r < NR; r++) {
        w->parts[r].max_segs = max_segs;
        w->parts[r].loc      = calloc(max_segs, sizeof(ema__loc_t));
        CHECK(w->parts[r].loc != NULL);
        atomic_init(&w->parts[r].version, 1);
    }
    w->next = c->wins;
    c->wins = w;
    return w;
}

static void win_down(struct ema_win *w)
{
    for (int r = 0; r < NR; r++) {
        free(w->parts[r].loc);
    }
    free(w->parts);
    free(w->held);
    free(w->stats.wanted);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

#define D EMA_TIER_DEVICE
#define S EMA_TIER_SPILL

static void world_up(void)
{
    ema__win_ctx_t *c = &W.ctx;
    ema__xport_t *xp  = &W.xp;
    uint32_t segs[16];

    memset(&W, 0, sizeof(W));

    /* the transport: no worker, so no UCX; the job queues as
     * ema__xport_sched_init sets them (without its look at the cores) */
    xp->rank = ME;
    xp->size = NR;
    xp->efd  = -1;
    xp->idle_mask = 63;
    ema__xport_coll_init(xp);
    pthread_mutex_init(&xp->defer_lock, NULL);
    for (int q = 0; q < 2; q++) {
        xp->defer_head[q] = NULL;
        xp->defer_tail[q] = &xp->defer_head[q];
        atomic_init(&xp->defer_count[q], 0);
    }
    ema__xport_waiters_init(xp);
    xp->send_hook = send_stub;
    ema__xport_set_am_handler(xp, EMA_AM_COLL, ema__xport_coll_am, xp);

    /* the own memory, and every rank's as the modex gives it */
    arena_up(&W.arena, EMA_FUZZ_BASE, EMA_FUZZ_NSEGS, EMA_FUZZ_FD(ME));
    arena_up(&W.spill, EMA_FUZZ_SPILL_BASE, EMA_FUZZ_NSPILL, 200 + ME);
    c->xp                 = xp;
    c->tier[D]            = &W.arena;
    c->tier[S]            = &W.spill;
    c->rank               = ME;
    c->size               = NR;
    c->seg_size           = SEG;
    atomic_init(&c->inflight[0], 0);
    atomic_init(&c->inflight[1], 0);
    atomic_init(&c->epoch, 0);
    pthread_mutex_init(&c->inval_lock, NULL);
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->cpath.lock, NULL);
    for (int t = 0; t < EMA_TIER_MAX; t++) {
        c->exports[t] = calloc(NR, sizeof(ema__mem_export_t));
        CHECK(c->exports[t] != NULL);
    }
    for (int r = 0; r < NR; r++) {
        ema__mem_export_t *e = &c->exports[D][r];
        e->pid      = 1000 + r;
        e->fd       = EMA_FUZZ_FD(r);
        e->base     = (r == ME) ? (uint64_t)(uintptr_t)W.arena.base : (uint64_t)(r + 1) << 32;
        e->capacity = EMA_FUZZ_NSEGS * SEG;
        e->seg_size = SEG;
        if (r != EMA_FUZZ_NOSPILL) {
            e           = &c->exports[S][r];
            e->pid      = 1000 + r;
            e->fd       = 200 + r;
            e->base     = (r == ME) ? (uint64_t)(uintptr_t)W.spill.base
                                    : ((uint64_t)(r + 1) << 32) + (1u << 30);
            e->capacity = EMA_FUZZ_NSPILL * SEG;
            e->seg_size = SEG;
        }
    }
    c->issued  = calloc(NR, sizeof(*c->issued));
    c->flushed = calloc(NR, sizeof(*c->flushed));
    CHECK(c->issued != NULL && c->flushed != NULL);
    ema__win_coherence_init(c);

    /* two windows; the own parts in segments 0-5 of the own arena */
    CHECK(ema__seg_pool_alloc(&W.arena.pool, 6, EMA_SEG_USED, segs) == EMA_SUCCESS);
    W.win[0] = win_up(EMA_FUZZ_WIN0, 8);
    W.win[1] = win_up(EMA_FUZZ_WIN1, 32);
    part_set(W.win[0], 0, 3, (ema__loc_t[]){EMA_LOC(0, D, 0), EMA_LOC(0, D, 1), EMA_LOC(2, D, 4)},
             3 * SEG - 10);
    part_set(W.win[0], ME, 4,
             (ema__loc_t[]){EMA_LOC(ME, D, 0), EMA_LOC(ME, D, 1), EMA_LOC(ME, D, 2),
                            EMA_LOC(ME, D, 3)}, 4 * SEG);
    part_set(W.win[0], 2, 2, (ema__loc_t[]){EMA_LOC(2, D, 0), EMA_LOC(2, S, 1)}, 2 * SEG);
    part_set(W.win[0], 3, 0, NULL, 0);
    part_set(W.win[1], 0, 1, (ema__loc_t[]){EMA_LOC(0, D, 8)}, 100);
    part_set(W.win[1], ME, 2, (ema__loc_t[]){EMA_LOC(ME, D, 4), EMA_LOC(ME, D, 5)}, 2 * SEG);
    part_set(W.win[1], 2, 5,
             (ema__loc_t[]){EMA_LOC(2, D, 10), EMA_LOC(2, D, 11), EMA_LOC(2, D, 12),
                            EMA_LOC(2, D, 13), EMA_LOC(3, D, 5)}, 5 * SEG - 1);
    part_set(W.win[1], 3, 3,
             (ema__loc_t[]){EMA_LOC(3, D, 0), EMA_LOC(3, D, 1),
                            EMA_LOC(3, D, 2) | EMA_LOC_MOVING}, 3 * SEG);
    for (int k = 0; k < 2; k++) {
        ema__win_part_t *p = &W.win[k]->parts[ME];
        for (uint32_t i = 0; i < p->max_segs; i++) {
            W.own_loc[k][i] = atomic_load(&p->loc[i]);
        }
        W.own_size[k]    = atomic_load(&p->size);
        W.own_version[k] = atomic_load(&p->version);
        W.own_nsegs[k]   = atomic_load(&p->nsegs);
    }

    /* the pool: 6 and 7 lent to rank 0 (7 recalled), 8 to rank 2 (its
     * grant still being sent), 9 to rank 3; rank 2's segment 3 granted to
     * this rank and not mapped yet */
    ema__pool_t *pool = &W.pool;
    CHECK(ema__pool_init(pool, c, &W.spill) == EMA_SUCCESS);
    CHECK(ema__seg_pool_alloc(&W.arena.pool, 4, EMA_SEG_LENT, segs) == EMA_SUCCESS);
    CHECK(segs[0] == 6 && segs[3] == 9);
    pool->lent_to[6]   = 0;
    pool->lent_to[7]   = 0;
    pool->lent_to[8]   = 2;
    pool->lent_to[9]   = 3;
    pool->recalling[7] = 1;
    pool->granting[8]  = 1;
    atomic_store(&pool->recall_pending, 1);
    pthread_mutex_lock(&pool->lock);
    pool->advertised = ema__pool_lendable_locked(pool);
    pthread_mutex_unlock(&pool->lock);
    pool->acq     = malloc(4 * sizeof(*pool->acq));
    CHECK(pool->acq != NULL);
    pool->acq_cap = 4;
    pool->nacq    = 1;
    pool->acq[0]  = EMA_LOC(2, D, 3);
    atomic_store(&pool->borrowed_segs, 1);

    /* the live waiters, in the order of their ids */
    atomic_init(&W.w_inval.done, 2);
    W.w_inval.type     = EMA_WIN_MSG_ACK;
    W.w_inval.peer     = -1;
    W.w_inval.per_peer = 2;
    W.w_inval.acked    = W.acked;
    W.acked[2]         = 2;
    atomic_init(&W.w_fetch.done, 0);
    W.w_fetch.type = EMA_WIN_MSG_TABLE_REP;
    W.w_fetch.peer = 2;
    atomic_init(&W.w_amo.done, 0);
    W.w_amo.type = EMA_WIN_MSG_AMO_REP;
    W.w_amo.peer = 3;
    atomic_init(&W.w_grant.done, 0);
    W.w_grant.lender  = 0;
    W.w_grant.want    = 4;
    W.w_grant.segs    = W.g_segs;
    W.w_grant.handles = W.g_handles;
    CHECK(ema__xport_waiter_add(xp, &W.w_inval, EMA_AM_WIN) == EMA_FUZZ_TOK_INVAL);
    CHECK(ema__xport_waiter_add(xp, &W.w_fetch, EMA_AM_WIN) == EMA_FUZZ_TOK_FETCH);
    CHECK(ema__xport_waiter_add(xp, &W.w_amo, EMA_AM_WIN) == EMA_FUZZ_TOK_AMO);
    CHECK(ema__xport_waiter_add(xp, &W.w_grant, EMA_AM_POOL) == EMA_FUZZ_TOK_GRANT);

    /* a collective in progress: rank 0's blob in */
    xp->coll_seq = EMA_FUZZ_COLL_SEQ;
    ema__coll_slot_t *slot = &xp->coll_slot[EMA_FUZZ_COLL_SEQ & 1];
    slot->seq      = EMA_FUZZ_COLL_SEQ;
    slot->count    = 1;
    slot->blobs[0] = strdup("rank 0!");
    slot->lens[0]  = 8;
    CHECK(slot->blobs[0] != NULL);
}

static void world_down(void)
{
    ema__win_ctx_t *c = &W.ctx;
    ema__xport_t *xp  = &W.xp;

    ema__xport_sched_cleanup(xp); /* jobs still queued: their args freed */
    ema__pool_cleanup(&W.pool);
    pthread_mutex_destroy(&W.pool.lock);
    pthread_mutex_destroy(&W.pool.acq_lock);
    pthread_mutex_destroy(&W.pool.advert_lock);
    win_down(W.win[0]);
    win_down(W.win[1]);
    for (int t = 0; t < EMA_TIER_MAX; t++) {
        free(c->exports[t]);
    }
    free(c->issued);
    free(c->flushed);
    pthread_mutex_destroy(&c->amo_lock);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->inval_lock);
    pthread_mutex_destroy(&c->cpath.lock);
    ema__xport_coll_cleanup(xp);
    ema__xport_waiters_cleanup(xp);
    pthread_mutex_destroy(&xp->waiters.lock);
    arena_down(&W.arena);
    arena_down(&W.spill);
}

/* --- the world's state, to prove a message changed nothing --------------- */

typedef struct {
    uint8_t *p;
    size_t   len, cap;
} buf_t;

static void put(buf_t *b, const void *v, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->p   = realloc(b->p, b->cap);
        CHECK(b->p != NULL);
    }
    memcpy(b->p + b->len, v, n);
    b->len += n;
}

#define PUT(_b, _v)                              \
    do {                                         \
        __typeof__(_v) v_ = (_v);                \
        put((_b), &v_, sizeof(v_));              \
    } while (0)

static void snap(buf_t *b)
{
    ema__pool_t *pool = &W.pool;
    ema__xport_t *xp  = &W.xp;

    b->len = 0;
    for (int k = 0; k < 2; k++) {
        for (int r = 0; r < NR; r++) {
            ema__win_part_t *p = &W.win[k]->parts[r];
            PUT(b, (uint64_t)atomic_load(&p->size));
            PUT(b, (uint64_t)atomic_load(&p->version));
            PUT(b, (uint32_t)atomic_load(&p->nsegs));
            for (uint32_t i = 0; i < p->max_segs; i++) {
                PUT(b, (uint64_t)atomic_load(&p->loc[i]));
            }
        }
    }
    PUT(b, atomic_load(&W.ctx.epoch));
    put(b, pool->lent_to, EMA_FUZZ_NSEGS * sizeof(*pool->lent_to));
    put(b, pool->recalling, EMA_FUZZ_NSEGS);
    put(b, pool->granting, EMA_FUZZ_NSEGS);
    put(b, W.arena.pool.state, EMA_FUZZ_NSEGS);
    put(b, W.spill.pool.state, EMA_FUZZ_NSPILL);
    PUT(b, W.arena.pool.nfree);
    PUT(b, W.arena.pool.nlent);
    PUT(b, W.spill.pool.nfree);
    PUT(b, pool->withheld);
    PUT(b, pool->advertised);
    PUT(b, atomic_load(&pool->recall_pending));
    PUT(b, atomic_load(&pool->recall_refused));
    PUT(b, atomic_load(&pool->borrowed_segs));
    PUT(b, atomic_load(&pool->spilled_segs));
    for (int r = 0; r < NR; r++) {
        PUT(b, (uint64_t)atomic_load(&pool->peer_lendable[r]));
    }
    PUT(b, pool->nacq);
    put(b, pool->acq, pool->nacq * sizeof(*pool->acq));
    PUT(b, (int)(pool->parked != NULL));
    /* the waiters */
    const ema__win_waiter_t *ws[] = {&W.w_inval, &W.w_fetch, &W.w_amo};
    for (int i = 0; i < 3; i++) {
        PUT(b, atomic_load(&ws[i]->done));
        PUT(b, ws[i]->value);
        PUT(b, ws[i]->status);
    }
    put(b, W.acked, sizeof(W.acked));
    PUT(b, atomic_load(&W.w_grant.done));
    PUT(b, W.w_grant.count);
    put(b, W.g_segs, sizeof(W.g_segs));
    put(b, W.g_handles, sizeof(W.g_handles));
    /* the collectives */
    PUT(b, xp->coll_seq);
    for (int s = 0; s < 2; s++) {
        ema__coll_slot_t *slot = &xp->coll_slot[s];
        PUT(b, slot->seq);
        PUT(b, slot->count);
        for (int r = 0; r < NR; r++) {
            PUT(b, slot->lens[r]);
            PUT(b, (int)(slot->blobs[r] != NULL));
            if (slot->blobs[r] != NULL) {
                put(b, slot->blobs[r], slot->lens[r]);
            }
        }
    }
    /* jobs left queued, and the memory an atomic writes */
    PUT(b, atomic_load(&xp->defer_count[0]));
    PUT(b, atomic_load(&xp->defer_count[1]));
    put(b, W.arena.base, W.arena.capacity);
    put(b, W.spill.base, W.spill.capacity);
}

/* What must hold after any message, well formed or not. */
static void check_world(void)
{
    ema__win_ctx_t *c = &W.ctx;
    ema__pool_t *pool = &W.pool;
    ema__xport_t *xp  = &W.xp;

    for (int k = 0; k < 2; k++) {
        for (int r = 0; r < NR; r++) {
            ema__win_part_t *p = &W.win[k]->parts[r];
            uint32_t n = atomic_load(&p->nsegs);
            CHECK(n <= p->max_segs);
            CHECK(atomic_load(&p->size) <= (uint64_t)n * SEG);
            for (uint32_t i = 0; i < p->max_segs; i++) {
                CHECK(ema__win_loc_ok(c, atomic_load(&p->loc[i])));
            }
        }
        /* the own part: only this rank changes it */
        ema__win_part_t *own = &W.win[k]->parts[ME];
        CHECK(atomic_load(&own->size) == W.own_size[k]);
        CHECK(atomic_load(&own->version) == W.own_version[k]);
        CHECK(atomic_load(&own->nsegs) == W.own_nsegs[k]);
        for (uint32_t i = 0; i < own->max_segs; i++) {
            CHECK(atomic_load(&own->loc[i]) == W.own_loc[k][i]);
        }
    }
    /* lender bookkeeping against the segment pool */
    uint32_t nlent = 0;
    for (uint32_t s = 0; s < EMA_FUZZ_NSEGS; s++) {
        int16_t to = pool->lent_to[s];
        CHECK(to >= -1 && to < NR && to != ME);
        CHECK((W.arena.pool.state[s] == EMA_SEG_LENT) == (to >= 0));
        CHECK(!pool->recalling[s] || to >= 0);
        nlent += (to >= 0);
    }
    CHECK(nlent == W.arena.pool.nlent);
    CHECK(atomic_load(&pool->recall_pending) >= 0);
    for (int r = 0; r < NR; r++) {
        CHECK(atomic_load(&pool->peer_lendable[r]) <= EMA_FUZZ_NSEGS);
    }
    /* the waiters: never more answers than asked for */
    uint32_t acks = 0;
    for (int r = 0; r < NR; r++) {
        CHECK(W.acked[r] <= W.w_inval.per_peer);
        acks += W.acked[r];
    }
    CHECK(W.acked[ME] == 0);
    CHECK((uint32_t)atomic_load(&W.w_inval.done) == acks);
    CHECK(atomic_load(&W.w_fetch.done) <= 1 && atomic_load(&W.w_amo.done) <= 1);
    CHECK(atomic_load(&W.w_grant.done) <= 1 && W.w_grant.count <= W.w_grant.want);
    for (uint32_t i = 0; i < W.w_grant.count; i++) {
        CHECK(W.g_segs[i] < EMA_FUZZ_NSEGS && W.g_handles[i] == EMA_FUZZ_FD(0));
        for (uint32_t j = 0; j < i; j++) {
            CHECK(W.g_segs[j] != W.g_segs[i]);
        }
    }
    /* a collective counts one blob per peer */
    for (int s = 0; s < 2; s++) {
        ema__coll_slot_t *slot = &xp->coll_slot[s];
        int n = 0;
        for (int r = 0; r < NR; r++) {
            n += (slot->blobs[r] != NULL);
        }
        CHECK(slot->blobs[ME] == NULL);
        CHECK(slot->count < 0 || slot->count == n);
        CHECK(slot->count < NR);
    }
    CHECK(xp->coll_seq == EMA_FUZZ_COLL_SEQ);
}

/* One message (fuzz_world.h's format), and the jobs it queued. */
static void deliver(const uint8_t *data, size_t len)
{
    int32_t src;

    if (len < EMA_FUZZ_HDR) {
        return;
    }
    memcpy(&src, data + 1, sizeof(src));
    if (data[0] == EMA_FUZZ_DESC) {
        ema__win_desc_check(&W.ctx, (int)((uint32_t)src % NR), data + EMA_FUZZ_HDR,
                            len - EMA_FUZZ_HDR);
    } else {
        ema__xport_am_dispatch(&W.xp, data[0], src, data + EMA_FUZZ_HDR, len - EMA_FUZZ_HDR);
    }
    /* the jobs it queued, and theirs (a recall of a segment granted and not
     * mapped queues itself again: a bound) */
    for (int i = 0; i < 8 && ema__xport_run_deferred(&W.xp, EMA_WAIT_LONG) > 0; i++) {
    }
}

int ema__am_fuzz_one_ex(const uint8_t *data, size_t len, ema_fuzz_result_t *res)
{
    static buf_t before, after;

    world_up();
    if (res != NULL) {
        snap(&before);
    }
    unsigned long m0 = atomic_load(&ema__log_malformed);
    if (len >= 1 && data[0] == EMA_FUZZ_SEQ) {
        /* records of [id][rank: 4][length: 2][message], in order */
        size_t at = 1;
        while (len - at >= EMA_FUZZ_HDR + 2) {
            uint16_t n;
            memcpy(&n, data + at + EMA_FUZZ_HDR, sizeof(n));
            size_t body = at + EMA_FUZZ_HDR + 2, mlen = (n < len - body) ? n : len - body;
            /* each message in a buffer of its own size: ASan sees over-reads */
            uint8_t *msg = malloc(EMA_FUZZ_HDR + mlen);
            CHECK(msg != NULL);
            memcpy(msg, data + at, EMA_FUZZ_HDR);
            memcpy(msg + EMA_FUZZ_HDR, data + body, mlen);
            deliver(msg, EMA_FUZZ_HDR + mlen);
            free(msg);
            check_world();
            at = body + mlen;
        }
    } else {
        deliver(data, len);
    }
    check_world();
    if (res != NULL) {
        snap(&after);
        res->changed   = before.len != after.len || memcmp(before.p, after.p, before.len) != 0;
        res->sends     = W.sends;
        res->malformed = atomic_load(&ema__log_malformed) - m0;
    }
    world_down();
    return 0;
}

int ema__am_fuzz_one(const uint8_t *data, size_t len)
{
    return ema__am_fuzz_one_ex(data, len, NULL);
}
