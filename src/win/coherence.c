/*
 * Coherence of the cached segment tables (active messages on EMA_AM_WIN).
 *
 * Moving segment i of rank B's part (B is the owner):
 *
 *   B                               every other rank R
 *   |-- INVAL(win, B, i..j, tok) -->|  mark i..j MOVING in R's cache; new
 *   |   (B marks its own cache)     |  RMA to them waits; wait until no issue
 *   |                               |  is in flight; flush R's worker
 *   |<------------ ACK(tok) --------|
 *   |  copy i..j to the new memory, map it at the same address
 *   |-- UPDATE(win, B, version, size, locs) -->|  clears MOVING
 *
 * So an operation from R lands wholly in the old copy before it is copied,
 * or wholly in the new one.  A grown part is published with UPDATE alone; a
 * rank that sees an offset past its cached size asks the owner
 * (TABLE_REQ/TABLE_REP) before failing with EMA_ERR_RANGE.  A rank an
 * UPDATE could not reach gets the whole table with the next one
 * (ema__win_publish).
 *
 * Every message is checked before it changes anything (ema_win_am, and
 * ema__win_update_check in segment_table.c): a peer invalidates, updates
 * and answers for its own part only; runs, sizes and locations must fit the
 * part's table and the world's memory; a reply must answer a live request
 * of this layer, of its type, from the rank asked.  Anything else is
 * logged once per kind and dropped, except that a malformed answer to a
 * live request (a table, an atomic's result) still ends that request:
 * with nothing applied, or with EMA_ERR_TRANSPORT.
 */
#include "coherence.h"

#include "util/log.h"
#include "util/state.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ema__win_ctx_t *ctx;
    int             src;
    size_t          len;
    ema_win_msg_t   msg;
} ema_win_job_t;

static ema_status_t ema_win_send(ema__win_ctx_t *ctx, int peer, const ema_win_msg_t *msg,
                                 const ema__loc_t *locs, uint32_t nlocs)
{
    return ema__xport_am_send(ctx->xp, peer, EMA_AM_WIN, msg, sizeof(*msg), locs,
                              (size_t)nlocs * sizeof(*locs));
}

typedef struct {
    const ema_win_msg_t *m;
    int                  src;
    int                  valid;  /* the reply's own fields are well formed */
    int                  why;    /* out: 0 taken, else why not (EMA_WIN_REPLY_*) */
} ema_win_reply_arg_t;

enum {
    EMA_WIN_REPLY_TAKEN = 0,
    EMA_WIN_REPLY_TYPE,     /* not the type of reply the request awaits */
    EMA_WIN_REPLY_PEER,     /* not from the rank asked */
    EMA_WIN_REPLY_REPEATED  /* more than the request awaits */
};

/* A reply reaches its waiter: an AMO_REP's result copied in, and done
 * counted, under the waiter table's lock (the waiter may not outlive it). */
static void ema_win_reply_cb(void *waiter, const void *arg)
{
    ema__win_waiter_t *w   = waiter;
    ema_win_reply_arg_t *a = (ema_win_reply_arg_t *)arg;
    const ema_win_msg_t *m = a->m;

    if (m->type != w->type) {
        a->why = EMA_WIN_REPLY_TYPE;
        return;
    }
    if (w->peer >= 0 && a->src != w->peer) {
        a->why = EMA_WIN_REPLY_PEER;
        return;
    }
    if (w->type == EMA_WIN_MSG_ACK) {
        if (w->acked[a->src] >= w->per_peer) {
            a->why = EMA_WIN_REPLY_REPEATED;
            return;
        }
        w->acked[a->src]++;
    } else if (atomic_load(&w->done) > 0) {
        a->why = EMA_WIN_REPLY_REPEATED;
        return;
    }
    if (w->type == EMA_WIN_MSG_AMO_REP) {
        w->value  = a->valid ? m->arg[0] : 0;
        w->status = a->valid ? (int32_t)m->first : EMA_ERR_TRANSPORT;
    }
    atomic_fetch_add(&w->done, 1);
    a->why = EMA_WIN_REPLY_TAKEN;
}

/* Hand a reply to the request waiting for it; @valid 0: its fields are
 * malformed (already logged), and the request ends with nothing. */
static void ema_win_reply(ema__win_ctx_t *ctx, int src, const ema_win_msg_t *m, int valid)
{
    ema_win_reply_arg_t a = {m, src, valid, EMA_WIN_REPLY_TAKEN};

    if (!ema__xport_waiter_call(ctx->xp, m->token, EMA_AM_WIN, ema_win_reply_cb, &a)) {
        ema_malformed("window reply (type %u) from rank %d for no waiting request "
                      "(id %#" PRIx64 "): dropped", m->type, src, m->token);
    } else if (a.why == EMA_WIN_REPLY_TYPE) {
        ema_malformed("window reply (type %u) from rank %d answers a request of another "
                      "type: dropped", m->type, src);
    } else if (a.why == EMA_WIN_REPLY_PEER) {
        ema_malformed("window reply (type %u) from rank %d, which was not asked: dropped",
                      m->type, src);
    } else if (a.why == EMA_WIN_REPLY_REPEATED) {
        ema_malformed("window reply (type %u) from rank %d repeated: dropped", m->type, src);
    }
}

/* An atomic's status as the holder sends it: EMA_SUCCESS or an error. */
static int ema_win_status_ok(uint32_t first)
{
    int32_t st = (int32_t)first;
    if (!ema__status_known_error(st)) {
        ema_malformed("atomic's answer with status %d, not a status: the atomic fails", st);
        return 0;
    }
    return 1;
}

/* The word [@raddr, @raddr + 8) lies in arena @a (no wrap). */
static int ema_win_amo_in(const ema__mem_arena_t *a, uint64_t raddr)
{
    uint64_t base = (uintptr_t)a->base;
    return raddr >= base && raddr - base <= a->capacity &&
           a->capacity - (raddr - base) >= sizeof(uint64_t);
}

/* The own part's locations [first, first+count) into @locs, masked with
 * @keep. */
static void ema_win_snapshot_into(ema_win_h win, uint32_t first, uint32_t count,
                                  ema__loc_t keep, ema__loc_t *locs)
{
    ema__win_part_t *p = &win->parts[win->ctx->rank];
    for (uint32_t i = 0; i < count; i++) {
        locs[i] = atomic_load(&p->loc[first + i]) & keep;
    }
}

/* The same, into memory of its own (NULL: out of memory). */
static ema__loc_t *ema_win_snapshot(ema_win_h win, uint32_t first, uint32_t count,
                                    ema__loc_t keep)
{
    ema__loc_t *locs = malloc(sizeof(*locs) * (count ? count : 1));
    if (locs != NULL) {
        ema_win_snapshot_into(win, first, count, keep, locs);
    }
    return locs;
}

/* Perform an atomic on a word of this rank's own memory of tier @tier, with
 * the kind's copy (cuMemcpy on cuda: the CPU cannot touch device memory). */
static ema_status_t ema_win_amo_exec(ema__win_ctx_t *ctx, int tier, uint64_t raddr, int cswap,
                                     uint64_t operand, uint64_t swap, uint64_t *old)
{
    ema__mem_arena_t *a;
    uint64_t v = 0, nv;
    ema_status_t status;

    if (tier < 0 || tier >= EMA_TIER_MAX) {
        return EMA_ERR_INVALID_PARAM;
    }
    a = ctx->tier[tier];
    if (a == NULL || !ema_win_amo_in(a, raddr)) {
        ema_error("atomic at %#" PRIx64 " outside this rank's memory of tier %d", raddr, tier);
        return EMA_ERR_RANGE;
    }
    pthread_mutex_lock(&ctx->amo_lock);
    status = a->ops->copy(a, &v, (const void *)(uintptr_t)raddr, sizeof(v));
    nv     = cswap ? ((v == operand) ? swap : v) : v + operand;
    if (status == EMA_SUCCESS && nv != v) {
        status = a->ops->copy(a, (void *)(uintptr_t)raddr, &nv, sizeof(nv));
    }
    pthread_mutex_unlock(&ctx->amo_lock);
    *old = v;
    return status;
}

/* Set while this thread waits for an atomic's answer: it then holds
 * ctx->inflight (so that no migration copies the word before the holder has
 * performed the atomic), and an invalidation run in its wait loop would wait
 * for that count forever.  Such a job is put back for the progress thread or
 * a later wait loop. */
static __thread int ema_win_in_amo;

ema_status_t ema__win_amo(ema__win_ctx_t *ctx, int holder, int tier, uint64_t raddr, int cswap,
                          uint64_t operand, uint64_t swap, uint64_t *old)
{
    ema__win_waiter_t w;
    ema_win_msg_t m;
    ema_status_t status;

    if (holder == ctx->rank) {
        return ema_win_amo_exec(ctx, tier, raddr, cswap, operand, swap, old);
    }
    memset(&w, 0, sizeof(w));
    atomic_init(&w.done, 0);
    w.type   = EMA_WIN_MSG_AMO_REP;
    w.peer   = holder;
    w.status = EMA_SUCCESS;
    w.value  = 0;
    memset(&m, 0, sizeof(m));
    m.type   = EMA_WIN_MSG_AMO;
    m.first  = (uint32_t)tier;
    m.count  = (uint32_t)cswap;
    m.token  = ema__xport_waiter_add(ctx->xp, &w, EMA_AM_WIN);
    m.arg[0] = raddr;
    m.arg[1] = operand;
    m.arg[2] = swap;
    if (m.token == 0) {
        return EMA_ERR_NO_MEMORY;
    }
    status = ema_win_send(ctx, holder, &m, NULL, 0);
    if (status != EMA_SUCCESS) {
        ema__xport_waiter_del(ctx->xp, m.token);
        return status;
    }
    ema_win_in_amo++;
    status = ema__xport_wait_flag_peer(ctx->xp, EMA_WAIT_QUICK, holder, &w.done, 1);
    ema_win_in_amo--;
    ema__xport_waiter_del(ctx->xp, m.token);
    *old = w.value;
    return (status == EMA_SUCCESS) ? (ema_status_t)w.status : status;
}

/* An invalidation's run [first, first+count) fits @win's table of @part
 * (64-bit arithmetic: first + count may wrap in 32 bits). */
static int ema_win_inval_fits(ema_win_h win, const ema_win_msg_t *m)
{
    uint32_t max = win->parts[m->part].max_segs;
    if (m->first > max || m->count > max - m->first) {
        ema_malformed("invalidation of segments %u..%" PRIu64 " of rank %d's part of window "
                      "%u, which has %u: dropped", m->first, (uint64_t)m->first + m->count,
                      m->part, m->win_id, max);
        return 0;
    }
    return 1;
}

/* A request (INVAL, TABLE_REQ, AMO) from @src, checked before it is
 * queued, so that a malformed one neither runs nor is answered. */
static int ema_win_request_ok(ema__win_ctx_t *ctx, int src, const ema_win_msg_t *m)
{
    if (m->type == EMA_WIN_MSG_INVAL) {
        /* only the owner moves a part's segments, and only it clears the
         * marks (UPDATE): a peer's invalidation of another part, this
         * rank's own above all, would leave it MOVING for ever */
        if (m->part != src) {
            ema_malformed("invalidation of rank %d's part from rank %d: dropped", m->part, src);
            return 0;
        }
        ema_win_h win = ema__win_find(ctx, m->win_id);
        int ok = win == NULL || ema_win_inval_fits(win, m); /* unknown: acknowledged */
        ema__win_put(win);
        return ok;
    }
    if (m->type == EMA_WIN_MSG_TABLE_REQ) {
        if (m->part != ctx->rank) {
            ema_malformed("table request from rank %d for rank %d's part, not this rank's: "
                          "dropped", src, m->part);
            return 0;
        }
        return 1;
    }
    /* EMA_WIN_MSG_AMO: a word of this rank's memory of that tier */
    if (m->first >= EMA_TIER_MAX || ctx->tier[m->first] == NULL || m->count > 1) {
        ema_malformed("atomic from rank %d on tier %u (compare-and-swap %u): dropped", src,
                      m->first, m->count);
        return 0;
    }
    const ema__mem_arena_t *a = ctx->tier[m->first];
    if (!ema_win_amo_in(a, m->arg[0]) || ((m->arg[0] - (uintptr_t)a->base) & 7) != 0) {
        ema_malformed("atomic from rank %d at %#" PRIx64 ", not an aligned word of this "
                      "rank's memory of tier %u: dropped", src, m->arg[0], m->first);
        return 0;
    }
    return 1;
}

/* Quick jobs: run by the progress thread or any waiting loop. */
static void ema_win_job(void *arg)
{
    ema_win_job_t *job  = arg;
    ema__win_ctx_t *ctx = job->ctx;
    ema_win_msg_t *m    = &job->msg;
    ema_win_msg_t reply;

    if (m->type == EMA_WIN_MSG_INVAL && ema_win_in_amo) {
        ema__xport_defer(ctx->xp, EMA_JOB_QUICK, ema_win_job, job); /* see ema_win_in_amo */
        return;
    }
    /* A reference to its tables until the end of the job: the owner may
     * free the window meanwhile (ema__win_put, win.h) */
    ema_win_h win = ema__win_find(ctx, m->win_id);

    memset(&reply, 0, sizeof(reply));
    reply.win_id = m->win_id;
    reply.part   = m->part;
    reply.token  = m->token;
    if (m->type == EMA_WIN_MSG_INVAL) {
        /* checked when it came (ema_win_request_ok); the window may have
         * become known since */
        if (win != NULL && !ema_win_inval_fits(win, m)) {
            ema__win_put(win);
            free(job);
            return;
        }
        if (win != NULL) {
            ema__win_inval_local(ctx, win, m->part, m->first, m->count);
        }
        ema__win_put(win); /* before the send: it may progress, and wait */
        win = NULL;
        reply.type = EMA_WIN_MSG_ACK; /* acknowledge even an unknown window */
        ema_win_send(ctx, job->src, &reply, NULL, 0);
    } else if (m->type == EMA_WIN_MSG_TABLE_REQ) {
        ema__loc_t *locs = NULL;
        reply.type = EMA_WIN_MSG_TABLE_REP;
        if (win != NULL && m->part == ctx->rank) {
            ema__win_part_t *p = &win->parts[ctx->rank];
            /* No lock: the owner may hold the window's lock while it waits
             * for this very rank.  A snapshot that changed under us (the
             * version moved) is taken again, and so is one caught inside a
             * grow or a shrink, between its stores of the segment count
             * and the size (the requester accepts no size past the
             * segments); a location still marked MOVING stays marked in
             * the requester's cache until the owner's UPDATE arrives. */
            do {
                free(locs);
                reply.version = atomic_load(&p->version);
                reply.size    = atomic_load(&p->size);
                reply.nsegs   = atomic_load(&p->nsegs);
                reply.count   = reply.nsegs;
                locs = ema_win_snapshot(win, 0, reply.count, ~(ema__loc_t)0);
            } while (locs != NULL && (atomic_load(&p->version) != reply.version ||
                                      reply.size > (uint64_t)reply.nsegs * ctx->seg_size));
        }
        ema__win_put(win); /* the snapshot is a copy */
        win = NULL;
        ema_win_send(ctx, job->src, &reply, locs, locs ? reply.count : 0);
        free(locs);
    } else if (m->type == EMA_WIN_MSG_AMO) {
        reply.type   = EMA_WIN_MSG_AMO_REP;
        reply.first  = (uint32_t)ema_win_amo_exec(ctx, (int)m->first, m->arg[0], (int)m->count,
                                                  m->arg[1], m->arg[2], &reply.arg[0]);
        ema_win_send(ctx, job->src, &reply, NULL, 0);
    }
    ema__win_put(win); /* an AMO's: it names no window */
    free(job);
}

/* The one entry point of EMA_AM_WIN (a UCX callback, through
 * ema__xport_am_dispatch): the sender, the length and the type, then each
 * message's fields, before anything changes. */
static void ema_win_am(void *arg, int src, const void *data, size_t len)
{
    ema__win_ctx_t *ctx = arg;
    ema_win_msg_t m;

    if (src < 0 || src >= ctx->size || src == ctx->rank) {
        ema_malformed("window control message from rank %d, not a peer: dropped", src);
        return;
    }
    if (len < sizeof(m)) {
        ema_malformed("short window control message from rank %d (%zu bytes): dropped", src,
                      len);
        return;
    }
    memcpy(&m, data, sizeof(m));
    const ema__loc_t *locs = (const ema__loc_t *)((const char *)data + sizeof(m));
    if (m.type < EMA_WIN_MSG_INVAL || m.type > EMA_WIN_MSG_AMO_REP) {
        ema_malformed("unknown window control message %u from rank %d: dropped", m.type, src);
        return;
    }
    /* a table carries exactly its locations; the others nothing */
    size_t want = sizeof(m);
    if (m.type == EMA_WIN_MSG_UPDATE || m.type == EMA_WIN_MSG_TABLE_REP) {
        want += (size_t)m.count * sizeof(ema__loc_t);
    }
    if (len != want) {
        ema_malformed("window control message %u from rank %d of %zu bytes, not %zu: dropped",
                      m.type, src, len, want);
        return;
    }

    switch (m.type) {
    case EMA_WIN_MSG_ACK:
        ema_win_reply(ctx, src, &m, 1);
        break;
    case EMA_WIN_MSG_UPDATE:
    case EMA_WIN_MSG_TABLE_REP: {
        /* a window this rank does not know (freed here already): nothing
         * to apply; a table request still ends */
        ema_win_h win = ema__win_find(ctx, m.win_id);
        int valid = 1;
        if (m.part != src) {
            ema_malformed("window table (type %u) of rank %d's part from rank %d, which does "
                          "not own it: dropped", m.type, m.part, src);
            valid = 0;
        } else if (win != NULL) {
            valid = ema__win_update_check(win, m.part, m.size, m.nsegs, m.first, m.count,
                                          locs);
        }
        if (valid && win != NULL) {
            ema__win_apply_update(win, m.part, m.version, m.size, m.nsegs, m.first, m.count,
                                  m.count > 0 ? locs : NULL);
        }
        ema__win_put(win);
        if (m.type == EMA_WIN_MSG_TABLE_REP) {
            ema_win_reply(ctx, src, &m, valid);
        }
        break;
    }
    case EMA_WIN_MSG_AMO_REP:
        ema_win_reply(ctx, src, &m, ema_win_status_ok(m.first));
        break;
    case EMA_WIN_MSG_INVAL:
    case EMA_WIN_MSG_AMO:
    case EMA_WIN_MSG_TABLE_REQ: {
        /* These wait (for in-flight operations, for a consistent table):
         * not inside a UCX callback. */
        if (!ema_win_request_ok(ctx, src, &m)) {
            return;
        }
        ema_win_job_t *job = malloc(sizeof(*job));
        if (job == NULL) {
            ema_error("out of memory handling a window control message");
            return;
        }
        job->ctx = ctx;
        job->src = src;
        job->len = len;
        job->msg = m;
        ema__xport_defer(ctx->xp, EMA_JOB_QUICK, ema_win_job, job);
        break;
    }
    }
}

void ema__win_coherence_init(ema__win_ctx_t *ctx)
{
    pthread_mutex_init(&ctx->amo_lock, NULL);
    ctx->amo_by_holder = ctx->tier[EMA_TIER_DEVICE]->ops->kind == EMA_MEMORY_KIND_CUDA;
    ctx->put_flush     = ctx->tier[EMA_TIER_DEVICE]->ops->kind == EMA_MEMORY_KIND_CUDA;
    ema__xport_set_am_handler(ctx->xp, EMA_AM_WIN, ema_win_am, ctx);
}

/* An invalidation round is over: every peer acknowledged, or is lost (a
 * lost rank reads nothing any more, so the move need not wait for it). */
typedef struct {
    ema__win_ctx_t    *ctx;
    ema__win_waiter_t *w;
    int                sent;
} ema_win_acks_t;

static int ema_win_acks_in(void *arg)
{
    ema_win_acks_t *a = arg;
    ema__xport_t *xp  = a->ctx->xp;
    int in = 1;

    if (atomic_load(&a->w->done) >= a->sent) {
        return 1;
    }
    if (atomic_load(&xp->nlost) == 0) {
        return 0;
    }
    pthread_mutex_lock(&xp->waiters.lock); /* the replies count under it */
    for (int r = 0; r < a->ctx->size && in; r++) {
        in = r == a->ctx->rank || ema__xport_peer_lost(xp, r) || a->w->acked[r] >= a->w->per_peer;
    }
    pthread_mutex_unlock(&xp->waiters.lock);
    return in;
}

ema_status_t ema__win_invalidate_runs(ema_win_h win, const uint32_t *first,
                                     const uint32_t *count, uint32_t nruns)
{
    EMA_WIN_ASSERT_LOCKED(win);
    ema__win_ctx_t *ctx = win->ctx;
    ema__win_waiter_t w;
    ema_win_msg_t m;
    ema_status_t status = EMA_SUCCESS;
    int sent = 0;

    memset(&w, 0, sizeof(w));
    atomic_init(&w.done, 0);
    w.type     = EMA_WIN_MSG_ACK;
    w.peer     = -1;
    w.per_peer = nruns;
    w.acked    = calloc((size_t)(unsigned)ctx->size, sizeof(*w.acked));
    memset(&m, 0, sizeof(m));
    m.type   = EMA_WIN_MSG_INVAL;
    m.win_id = win->id;
    m.part   = ctx->rank;
    m.token  = (w.acked != NULL) ? ema__xport_waiter_add(ctx->xp, &w, EMA_AM_WIN) : 0;
    if (m.token == 0) {
        free(w.acked);
        return EMA_ERR_NO_MEMORY;
    }
    /* every message first, then one wait for all the acknowledgements */
    for (uint32_t k = 0; k < nruns && status == EMA_SUCCESS; k++) {
        m.first = first[k];
        m.count = count[k];
        for (int r = 0; r < ctx->size && status == EMA_SUCCESS; r++) {
            if (r == ctx->rank || ema__xport_peer_lost(ctx->xp, r)) {
                continue;
            }
            status = ema_win_send(ctx, r, &m, NULL, 0);
            sent += (status == EMA_SUCCESS);
            if (status == EMA_ERR_PEER_LOST) {
                status = EMA_SUCCESS; /* it died meanwhile: it owes nothing */
            }
        }
    }
    for (uint32_t k = 0; k < nruns; k++) {
        ema__win_part_t *p = &win->parts[ctx->rank];
        for (uint32_t i = first[k]; i < first[k] + count[k] && i < p->max_segs; i++) {
            atomic_fetch_or(&p->loc[i], EMA_LOC_MOVING);
        }
    }
    ema_status_t st = ema__win_inval_local(ctx, win, ctx->rank, 0, 0); /* drain and flush */
    ema_win_acks_t acks = {ctx, &w, sent};
    ema_status_t wst = ema__xport_wait_until(ctx->xp, EMA_WAIT_QUICK, 0, ema_win_acks_in, &acks);
    st = (st == EMA_SUCCESS) ? wst : st;
    ema__xport_waiter_del(ctx->xp, m.token);
    free(w.acked);
    return (status == EMA_SUCCESS) ? st : status;
}

ema_status_t ema__win_invalidate(ema_win_h win, uint32_t first, uint32_t count)
{
    EMA_WIN_ASSERT_LOCKED(win);
    return ema__win_invalidate_runs(win, &first, &count, 1);
}

ema_status_t ema__win_publish(ema_win_h win, uint32_t first, uint32_t count, ema__loc_t *buf)
{
    EMA_WIN_ASSERT_LOCKED(win); /* one version at a time */
    ema__win_ctx_t *ctx = win->ctx;
    ema__win_part_t *p  = &win->parts[ctx->rank];
    ema_status_t status = EMA_SUCCESS;
    ema_win_msg_t m, whole;

    /* An UPDATE is sent by the thread moving the segments (win->lock):
     * MOVING in the owner's table then only keeps the owner's own acquires
     * off a window range not yet remapped (migrate.c ema_win_handover);
     * the new location itself is ready for every other rank.  The message
     * is whole before the version moves, and nothing here can run out of
     * memory (the caller's @buf): a version is spent only on an UPDATE
     * that goes out. */
    ema_win_snapshot_into(win, first, count, ~(ema__loc_t)EMA_LOC_MOVING, buf);
    memset(&m, 0, sizeof(m));
    m.type    = EMA_WIN_MSG_UPDATE;
    m.win_id  = win->id;
    m.part    = ctx->rank;
    m.size    = atomic_load(&p->size);
    m.nsegs   = atomic_load(&p->nsegs);
    m.first   = first;
    m.count   = count;
    m.version = atomic_fetch_add(&p->version, 1) + 1;
    /* A peer applies any newer version, and an UPDATE's size and segment
     * count with only the locations of its range: on top of a version it
     * missed (a grow's new segments, a move's new places, the marks of an
     * invalidation to clear), a ranged UPDATE would give it a size whose
     * segments it has no locations for (zeroes: rank 0's first segment),
     * or leave marks that nothing clears.  So a peer a send failed to
     * reach is marked behind, and gets the whole table, [0, nsegs), until
     * one reaches it.  Each peer's UPDATEs leave in version order (under
     * win->lock, one send completed before the next, on one ordered
     * endpoint), so a peer not behind missed none.  The whole table is
     * sent from the owner's table itself, stable under win->lock (only its
     * holder writes it), as a TABLE_REP is: MOVING marks included.  A mark
     * there is a segment this same hold of the lock publishes again before
     * it ends (the other runs of a move, or a hand-over's range until its
     * remap: migrate.c), so the peer waits a moment instead of reading old
     * memory.  Segments past nsegs (a shrink's) are not sent: past the
     * size, a peer never reads them. */
    whole       = m;
    whole.first = 0;
    whole.count = m.nsegs;
    for (int r = 0; r < ctx->size; r++) {
        if (r == ctx->rank || ema__xport_peer_lost(ctx->xp, r)) {
            continue;
        }
        ema__win_part_t *q = &win->parts[r];
        ema_status_t st;
        if (q->behind) {
            st = ema_win_send(ctx, r, &whole, (const ema__loc_t *)p->loc, whole.count);
        } else {
            st = ema_win_send(ctx, r, &m, buf, count);
        }
        if (st == EMA_SUCCESS) {
            q->behind = 0;
            continue;
        }
        if (st == EMA_ERR_PEER_LOST) {
            continue; /* died meanwhile: it reads nothing any more */
        }
        q->behind = 1;
        if (status == EMA_SUCCESS) {
            ema_error("window %u: telling rank %d of the part's version %" PRIu64 " (%" PRIu64
                      " bytes; %u segments from %u) failed (%s): it keeps the one it had "
                      "until a later version reaches it, with the whole table", win->id, r,
                      m.version, m.size, count, first, ema_strerror(st));
            status = st;
        }
    }
    return status;
}

ema_status_t ema__win_fetch(ema_win_h win, int part)
{
    EMA_WIN_ASSERT_UNLOCKED(win);
    ema__win_ctx_t *ctx = win->ctx;
    ema__win_waiter_t w;
    ema_win_msg_t m;

    if (part == ctx->rank) {
        return EMA_SUCCESS; /* the owner's table is always current */
    }
    memset(&w, 0, sizeof(w));
    atomic_init(&w.done, 0);
    w.type   = EMA_WIN_MSG_TABLE_REP;
    w.peer   = part;
    memset(&m, 0, sizeof(m));
    m.type   = EMA_WIN_MSG_TABLE_REQ;
    m.win_id = win->id;
    m.part   = part;
    m.token  = ema__xport_waiter_add(ctx->xp, &w, EMA_AM_WIN);
    if (m.token == 0) {
        return EMA_ERR_NO_MEMORY;
    }
    ema_status_t status = ema_win_send(ctx, part, &m, NULL, 0);
    if (status == EMA_SUCCESS) {
        status = ema__xport_wait_flag_peer(ctx->xp, EMA_WAIT_QUICK, part, &w.done, 1);
    }
    ema__xport_waiter_del(ctx->xp, m.token);
    return status;
}
