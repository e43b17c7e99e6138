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
 * (TABLE_REQ/TABLE_REP) before failing with EMA_ERR_RANGE.
 */
#include "win.h"

#include "util/log.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

enum {
    EMA_WIN_MSG_INVAL = 1,
    EMA_WIN_MSG_ACK,
    EMA_WIN_MSG_UPDATE,
    EMA_WIN_MSG_TABLE_REQ,
    EMA_WIN_MSG_TABLE_REP,
    EMA_WIN_MSG_AMO,     /* an atomic for the holder of the word to perform */
    EMA_WIN_MSG_AMO_REP  /* its result */
};

typedef struct {
    uint32_t type;
    uint32_t win_id;
    int32_t  part;
    uint32_t first;
    uint32_t count;
    uint32_t nsegs;
    uint64_t version;
    uint64_t size;
    uint64_t token; /* the waiter's id (xport/waiter.c), echoed back */
    /* AMO: address, operand, swap value; AMO_REP: arg[0] the old value,
     * first the status */
    uint64_t arg[3];
    /* UPDATE / TABLE_REP: count locations follow */
} ema_win_msg_t;

typedef struct {
    ema__win_ctx_t *ctx;
    int             src;
    size_t          len;
    ema_win_msg_t   msg; /* followed by the locations */
} ema_win_job_t;

typedef struct {
    atomic_int done;
    uint64_t   value;  /* AMO_REP: the old value */
    int32_t    status; /* AMO_REP */
} ema_win_waiter_t;

static ema_status_t ema_win_send(ema__win_ctx_t *ctx, int peer, const ema_win_msg_t *msg,
                                 const ema__loc_t *locs, uint32_t nlocs)
{
    return ema__xport_am_send(ctx->xp, peer, EMA_AM_WIN, msg, sizeof(*msg), locs,
                              (size_t)nlocs * sizeof(*locs));
}

/* A reply reaches its waiter: an AMO_REP's result (@m) copied in, and done
 * counted, under the waiter table's lock (the waiter may not outlive it). */
static void ema_win_reply_cb(void *waiter, const void *arg)
{
    ema_win_waiter_t *w    = waiter;
    const ema_win_msg_t *m = arg;
    if (m != NULL) {
        w->value  = m->arg[0];
        w->status = (int32_t)m->first;
    }
    atomic_fetch_add(&w->done, 1);
}

static void ema_win_reply(ema__win_ctx_t *ctx, int src, uint64_t token, const ema_win_msg_t *m)
{
    if (!ema__xport_waiter_call(ctx->xp, token, ema_win_reply_cb, m)) {
        ema_error("reply from rank %d for no waiting request (id %#" PRIx64 "): dropped", src,
                  token);
    }
}

/* Snapshot of the own part's locations [first, first+count). */
static ema__loc_t *ema_win_snapshot(ema_win_h win, uint32_t first, uint32_t count)
{
    ema__win_part_t *p = &win->parts[win->ctx->rank];
    ema__loc_t *locs   = malloc(sizeof(*locs) * (count ? count : 1));
    for (uint32_t i = 0; locs != NULL && i < count; i++) {
        locs[i] = atomic_load(&p->loc[first + i]);
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
    if (a == NULL || raddr < (uintptr_t)a->base ||
        raddr + sizeof(uint64_t) > (uintptr_t)a->base + a->capacity) {
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
    ema_win_waiter_t w;
    ema_win_msg_t m;
    ema_status_t status;

    if (holder == ctx->rank) {
        return ema_win_amo_exec(ctx, tier, raddr, cswap, operand, swap, old);
    }
    atomic_init(&w.done, 0);
    w.status = EMA_SUCCESS;
    w.value  = 0;
    memset(&m, 0, sizeof(m));
    m.type   = EMA_WIN_MSG_AMO;
    m.first  = (uint32_t)tier;
    m.count  = (uint32_t)cswap;
    m.token  = ema__xport_waiter_add(ctx->xp, &w);
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
    ema__xport_wait_flag(ctx->xp, EMA_WAIT_QUICK, &w.done, 1);
    ema_win_in_amo--;
    ema__xport_waiter_del(ctx->xp, m.token);
    *old = w.value;
    return (ema_status_t)w.status;
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
    ema_win_h win = ema__win_find(ctx, m->win_id);

    memset(&reply, 0, sizeof(reply));
    reply.win_id = m->win_id;
    reply.part   = m->part;
    reply.token  = m->token;
    if (m->type == EMA_WIN_MSG_INVAL) {
        if (win != NULL) {
            ema__win_inval_local(ctx, win, m->part, m->first, m->count);
        }
        reply.type = EMA_WIN_MSG_ACK; /* acknowledge even an unknown window */
        ema_win_send(ctx, job->src, &reply, NULL, 0);
    } else if (m->type == EMA_WIN_MSG_TABLE_REQ) {
        ema__loc_t *locs = NULL;
        reply.type = EMA_WIN_MSG_TABLE_REP;
        if (win != NULL && m->part == ctx->rank) {
            ema__win_part_t *p = &win->parts[ctx->rank];
            /* No lock: the owner may hold the window's lock while it waits
             * for this very rank.  A snapshot that changed under us (the
             * version moved) is taken again; a location still marked
             * MOVING stays marked in the requester's cache until the
             * owner's UPDATE arrives. */
            do {
                free(locs);
                reply.version = atomic_load(&p->version);
                reply.size    = atomic_load(&p->size);
                reply.nsegs   = atomic_load(&p->nsegs);
                reply.count   = reply.nsegs;
                locs = ema_win_snapshot(win, 0, reply.count);
            } while (locs != NULL && atomic_load(&p->version) != reply.version);
        }
        ema_win_send(ctx, job->src, &reply, locs, locs ? reply.count : 0);
        free(locs);
    } else if (m->type == EMA_WIN_MSG_AMO) {
        reply.type   = EMA_WIN_MSG_AMO_REP;
        reply.first  = (uint32_t)ema_win_amo_exec(ctx, (int)m->first, m->arg[0], (int)m->count,
                                                  m->arg[1], m->arg[2], &reply.arg[0]);
        ema_win_send(ctx, job->src, &reply, NULL, 0);
    }
    free(job);
}

static void ema_win_am(void *arg, int src, const void *data, size_t len)
{
    ema__win_ctx_t *ctx = arg;
    ema_win_msg_t m;

    if (len < sizeof(m)) {
        ema_error("short window control message from rank %d", src);
        return;
    }
    memcpy(&m, data, sizeof(m));
    const ema__loc_t *locs = (const ema__loc_t *)((const char *)data + sizeof(m));
    if ((m.type == EMA_WIN_MSG_UPDATE || m.type == EMA_WIN_MSG_TABLE_REP) &&
        len < sizeof(m) + (size_t)m.count * sizeof(ema__loc_t)) {
        ema_error("truncated window table from rank %d", src);
        return;
    }

    switch (m.type) {
    case EMA_WIN_MSG_ACK:
        ema_win_reply(ctx, src, m.token, NULL);
        break;
    case EMA_WIN_MSG_UPDATE:
    case EMA_WIN_MSG_TABLE_REP: {
        ema_win_h win = ema__win_find(ctx, m.win_id);
        if (win != NULL && m.part >= 0 && m.part < ctx->size && m.count > 0) {
            ema__win_apply_update(win, m.part, m.version, m.size, m.nsegs, m.first, m.count,
                                  locs);
        } else if (win != NULL && m.part >= 0 && m.part < ctx->size) {
            ema__win_apply_update(win, m.part, m.version, m.size, m.nsegs, 0, 0, NULL);
        }
        if (m.type == EMA_WIN_MSG_TABLE_REP) {
            ema_win_reply(ctx, src, m.token, NULL);
        }
        break;
    }
    case EMA_WIN_MSG_AMO_REP:
        ema_win_reply(ctx, src, m.token, &m);
        break;
    case EMA_WIN_MSG_INVAL:
    case EMA_WIN_MSG_AMO:
    case EMA_WIN_MSG_TABLE_REQ: {
        /* These wait (for in-flight operations, for a consistent table):
         * not inside a UCX callback. */
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
    default:
        ema_error("unknown window control message %u from rank %d", m.type, src);
    }
}

void ema__win_coherence_init(ema__win_ctx_t *ctx)
{
    pthread_mutex_init(&ctx->amo_lock, NULL);
    ctx->amo_by_holder = ctx->tier[EMA_TIER_DEVICE]->ops->kind == EMA_MEMORY_KIND_CUDA;
    ctx->put_flush     = ctx->tier[EMA_TIER_DEVICE]->ops->kind == EMA_MEMORY_KIND_CUDA;
    ema__xport_set_am_handler(ctx->xp, EMA_AM_WIN, ema_win_am, ctx);
}

ema_status_t ema__win_invalidate_runs(ema_win_h win, const uint32_t *first,
                                     const uint32_t *count, uint32_t nruns)
{
    EMA_WIN_ASSERT_LOCKED(win);
    ema__win_ctx_t *ctx = win->ctx;
    ema_win_waiter_t w;
    ema_win_msg_t m;
    ema_status_t status = EMA_SUCCESS;
    int sent = 0;

    atomic_init(&w.done, 0);
    memset(&m, 0, sizeof(m));
    m.type   = EMA_WIN_MSG_INVAL;
    m.win_id = win->id;
    m.part   = ctx->rank;
    m.token  = ema__xport_waiter_add(ctx->xp, &w);
    if (m.token == 0) {
        return EMA_ERR_NO_MEMORY;
    }
    /* every message first, then one wait for all the acknowledgements */
    for (uint32_t k = 0; k < nruns && status == EMA_SUCCESS; k++) {
        m.first = first[k];
        m.count = count[k];
        for (int r = 0; r < ctx->size && status == EMA_SUCCESS; r++) {
            if (r == ctx->rank) {
                continue;
            }
            status = ema_win_send(ctx, r, &m, NULL, 0);
            sent += (status == EMA_SUCCESS);
        }
    }
    for (uint32_t k = 0; k < nruns; k++) {
        ema__win_part_t *p = &win->parts[ctx->rank];
        for (uint32_t i = first[k]; i < first[k] + count[k] && i < p->max_segs; i++) {
            atomic_fetch_or(&p->loc[i], EMA_LOC_MOVING);
        }
    }
    ema_status_t st = ema__win_inval_local(ctx, win, ctx->rank, 0, 0); /* drain and flush */
    ema__xport_wait_flag(ctx->xp, EMA_WAIT_QUICK, &w.done, sent);
    ema__xport_waiter_del(ctx->xp, m.token);
    return (status == EMA_SUCCESS) ? st : status;
}

ema_status_t ema__win_invalidate(ema_win_h win, uint32_t first, uint32_t count)
{
    EMA_WIN_ASSERT_LOCKED(win);
    return ema__win_invalidate_runs(win, &first, &count, 1);
}

ema_status_t ema__win_publish(ema_win_h win, uint32_t first, uint32_t count)
{
    EMA_WIN_ASSERT_LOCKED(win); /* one version at a time */
    ema__win_ctx_t *ctx = win->ctx;
    ema__win_part_t *p  = &win->parts[ctx->rank];
    ema_status_t status = EMA_SUCCESS;
    ema_win_msg_t m;

    memset(&m, 0, sizeof(m));
    m.type    = EMA_WIN_MSG_UPDATE;
    m.win_id  = win->id;
    m.part    = ctx->rank;
    m.version = atomic_fetch_add(&p->version, 1) + 1;
    m.size    = atomic_load(&p->size);
    m.nsegs   = atomic_load(&p->nsegs);
    m.first   = first;
    m.count   = count;
    ema__loc_t *locs = ema_win_snapshot(win, first, count);
    if (locs == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    for (int r = 0; r < ctx->size; r++) {
        if (r != ctx->rank) {
            ema_status_t st = ema_win_send(ctx, r, &m, locs, count);
            status = (status == EMA_SUCCESS) ? st : status;
        }
    }
    free(locs);
    return status;
}

ema_status_t ema__win_fetch(ema_win_h win, int part)
{
    EMA_WIN_ASSERT_UNLOCKED(win);
    ema__win_ctx_t *ctx = win->ctx;
    ema_win_waiter_t w;
    ema_win_msg_t m;

    if (part == ctx->rank) {
        return EMA_SUCCESS; /* the owner's table is always current */
    }
    atomic_init(&w.done, 0);
    memset(&m, 0, sizeof(m));
    m.type   = EMA_WIN_MSG_TABLE_REQ;
    m.win_id = win->id;
    m.part   = part;
    m.token  = ema__xport_waiter_add(ctx->xp, &w);
    if (m.token == 0) {
        return EMA_ERR_NO_MEMORY;
    }
    ema_status_t status = ema_win_send(ctx, part, &m, NULL, 0);
    if (status == EMA_SUCCESS) {
        ema__xport_wait_flag(ctx->xp, EMA_WAIT_QUICK, &w.done, 1);
    }
    ema__xport_waiter_del(ctx->xp, m.token);
    return status;
}
