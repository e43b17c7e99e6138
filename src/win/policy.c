/*
 * The prefetch policy: a sliding window over the groups (layer groups, say)
 * that an application walks in a window's own part, as the EMA paper does
 * for an LLM's layers.  ema_win_set_policy names the groups in walk order
 * and a depth; ema_win_advance(win, g) says the application now works on
 * group g.  The progress engine then, in one long job (like a prefetch's):
 *
 *   1. yields if a lender's recall is queued or running (ctx->recalls): its
 *      moves must not compete with the recall for the window's lock or for
 *      free memory; the recall's end queues the job again;
 *   2. plans, under win->lock: "ahead", the away segments (borrowed or
 *      spilled) of groups g+1..g+depth, nearest first; "behind", the local
 *      segments of the groups in reverse walk order from g-1 (those used
 *      again last), never of the current group nor of a group ahead; held
 *      segments are left out of both (and counted);
 *   3. tells the owner (reclaim callback, without the lock) of the ranges
 *      that may move, then replans and moves only what it told of;
 *   4. takes free local memory for the ahead segments; where it is short,
 *      moves as many behind segments out (to peers, then the spill tier:
 *      ctx->mem_ops, never this rank's own memory), which frees local
 *      memory, and takes that;
 *   5. moves the ahead segments home (ema__win_move), nearest group first.
 *
 * Every move is ema__win_move's migration, so a segment acquired meanwhile
 * stays where it is.  ema_win_advance touches only atomics: a position word
 * and a "queued" flag, tagged with the policy's generation, so an advance
 * that races a replacement applies to the old policy and is ignored.
 */
#include "win.h"

#include "util/clock.h"
#include "util/log.h"
#include "util/sort.h"
#include "util/state.h"

#include <inttypes.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

typedef struct ema__win_policy {
    ema_win_range_t *ranges; /* [count], walk order */
    uint32_t         count;
    uint32_t         gen;
    unsigned         depth;
    unsigned         flags;
    /* EMA_WIN_POLICY_FLAG_READ_ONLY: per segment of the part (nkept of
     * them), the spill-tier copy kept when the policy brought it home
     * (kept[i], where has[i]), and where it went (home[i]): while the
     * segment is still there, leaving again is a remap to kept[i]. */
    ema__loc_t      *kept, *home;
    uint8_t         *has;
    uint32_t         nkept;
} ema__win_policy_t;

#define EMA_WIN_POLICY_FIELDS (EMA_WIN_POLICY_PARAM_FIELD_RANGES | \
                               EMA_WIN_POLICY_PARAM_FIELD_DEPTH |  \
                               EMA_WIN_POLICY_PARAM_FIELD_FLAGS)
#define EMA_WIN_POLICY_FLAGS  (EMA_WIN_POLICY_FLAG_CYCLIC | EMA_WIN_POLICY_FLAG_NO_EVICT | \
                               EMA_WIN_POLICY_FLAG_READ_ONLY | EMA_WIN_POLICY_FLAG_WAIT)

/* Per-segment marks of a plan. */
enum {
    MARK_SEEN     = 1u << 0, /* in the current group or a group ahead */
    MARK_NOTIFIED = 1u << 1  /* the owner heard it may move */
};

/* --- the walk ------------------------------------------------------------- */

/* The groups to keep local after position @pos (0: before group 0, else
 * group pos-1 is current), nearest first, after the current one itself
 * with EMA_WIN_POLICY_FLAG_WAIT; returns how many (at most count), in @g. */
static uint32_t policy_ahead(const ema__win_policy_t *pol, uint64_t pos, uint32_t *g)
{
    uint32_t n = 0, next = (uint32_t)pos; /* the group after the current one */
    uint32_t lim = pol->depth;

    if (pos > 0 && (pol->flags & EMA_WIN_POLICY_FLAG_WAIT)) {
        g[n++] = (uint32_t)(pos - 1); /* the application waits for it: first */
    }
    if (pol->flags & EMA_WIN_POLICY_FLAG_CYCLIC) {
        /* at most every group but the current one */
        uint32_t others = pol->count - (pos > 0 ? 1 : 0);
        lim = (lim < others) ? lim : others;
    }
    for (uint32_t k = 0; k < lim; k++) {
        uint64_t x = (uint64_t)next + k;
        if (x >= pol->count) {
            if (!(pol->flags & EMA_WIN_POLICY_FLAG_CYCLIC)) {
                break;
            }
            x %= pol->count;
        }
        g[n++] = (uint32_t)x;
    }
    return n;
}

/* Every group, those used again last first: the current group g (the
 * plan's marks leave it out), g-1, ..., 0, then count-1 down to the groups
 * ahead (also left out).  That is the order of their next use reversed,
 * cyclic or not: a walk that is not cyclic starts again at group 0, so the
 * groups at its end come back after those just passed. */
static uint32_t policy_behind(const ema__win_policy_t *pol, uint64_t pos, uint32_t *g)
{
    uint32_t n = 0, next = (uint32_t)pos;

    for (uint32_t j = 1; j <= pol->count; j++) {
        g[n++] = (uint32_t)(((uint64_t)next + pol->count - j) % pol->count);
    }
    return n;
}

/* Segments [first, last] of range @r in a part of @ns segments; 0 if none. */
static int policy_segs(const ema_win_range_t *r, size_t seg, uint32_t ns, uint32_t *first,
                       uint32_t *last)
{
    uint64_t f = r->offset / seg, l = (r->offset + r->length - 1) / seg;
    if (ns == 0 || f >= ns) {
        return 0;
    }
    *first = (uint32_t)f;
    *last  = (uint32_t)((l < ns) ? l : ns - 1);
    return 1;
}

static int loc_home(const ema__win_ctx_t *ctx, ema__loc_t l)
{
    return EMA_LOC_TIER(l) == EMA_TIER_DEVICE && EMA_LOC_RANK(l) == ctx->rank;
}

/* --- one run of the policy ------------------------------------------------- */

typedef struct {
    uint32_t *groups;  /* [count] scratch */
    uint8_t  *mark;    /* [nsegs] MARK_* */
    uint32_t *ahead;   /* away segments of the groups ahead, nearest first */
    uint32_t *behind;  /* local segments behind, used again last first */
    uint32_t  nahead, nbehind, nheld, nsegs;
    uint32_t  ncur;    /* of ahead, the first ncur are the current group's (WAIT) */
    uint64_t  ticket;  /* policy_seq when the run started (FLAG_WAIT) */
} policy_plan_t;

/* Fill @p for @pol at @pos; with @only_notified, only segments marked
 * MARK_NOTIFIED by an earlier plan.  Requires win->lock. */
static void policy_plan(ema_win_h win, const ema__win_policy_t *pol, uint64_t pos,
                        policy_plan_t *p, int only_notified) EMA_REQUIRES(win->lock)
{
    EMA_WIN_ASSERT_LOCKED(win);
    ema__win_ctx_t *ctx   = win->ctx;
    ema__win_part_t *part = &win->parts[ctx->rank];
    uint32_t ns = atomic_load(&part->nsegs), first, last;
    if (ns > p->nsegs) {
        ns = p->nsegs; /* grown since the scratch was sized: not planned now */
    }

    p->nahead = p->nbehind = p->nheld = p->ncur = 0;
    for (uint32_t i = 0; i < ns; i++) {
        p->mark[i] &= MARK_NOTIFIED;
    }
    /* the current group is never evicted, nor brought but with FLAG_WAIT
     * (policy_ahead lists it first then): the application is on it */
    int wait = (pol->flags & EMA_WIN_POLICY_FLAG_WAIT) != 0;
    if (pos > 0 && !wait &&
        policy_segs(&pol->ranges[pos - 1], ctx->seg_size, ns, &first, &last)) {
        for (uint32_t i = first; i <= last; i++) {
            p->mark[i] |= MARK_SEEN;
        }
    }
    uint32_t ng = policy_ahead(pol, pos, p->groups);
    for (uint32_t k = 0; k < ng; k++) {
        if (!policy_segs(&pol->ranges[p->groups[k]], ctx->seg_size, ns, &first, &last)) {
            continue;
        }
        for (uint32_t i = first; i <= last; i++) {
            int seen = p->mark[i] & MARK_SEEN;
            p->mark[i] |= MARK_SEEN;
            ema__loc_t l = atomic_load(&part->loc[i]) & ~EMA_LOC_MOVING;
            if (seen || loc_home(ctx, l)) {
                continue;
            }
            if (atomic_load(&win->held[i]) > 0) {
                p->nheld++;
            } else if (!only_notified || (p->mark[i] & MARK_NOTIFIED)) {
                p->ahead[p->nahead++] = i;
            }
        }
        if (k == 0 && wait && pos > 0) {
            p->ncur = p->nahead;
        }
    }
    if (pol->flags & EMA_WIN_POLICY_FLAG_NO_EVICT) {
        return;
    }
    ng = policy_behind(pol, pos, p->groups);
    for (uint32_t k = 0; k < ng; k++) {
        if (!policy_segs(&pol->ranges[p->groups[k]], ctx->seg_size, ns, &first, &last)) {
            continue;
        }
        for (uint32_t i = last + 1; i-- > first;) {
            ema__loc_t l = atomic_load(&part->loc[i]) & ~EMA_LOC_MOVING;
            if ((p->mark[i] & MARK_SEEN) || !loc_home(ctx, l)) {
                continue;
            }
            p->mark[i] |= MARK_SEEN; /* counted once */
            if (atomic_load(&win->held[i]) > 0) {
                p->nheld++;
            } else if (!only_notified || (p->mark[i] & MARK_NOTIFIED)) {
                p->behind[p->nbehind++] = i;
            }
        }
    }
}

/* How many of the behind segments would have to leave for the ahead ones
 * to fit in @nfree free local segments. */
static uint32_t policy_short(const policy_plan_t *p, uint32_t nfree)
{
    uint32_t need = (p->nahead > nfree) ? p->nahead - nfree : 0;
    return (need < p->nbehind) ? need : p->nbehind;
}

/* Whether a lender's recall is queued or running, so that the policy
 * yields.  Only then is the yield noted, for the recall's end to queue the
 * policy again (a flag set on every run made each recall's end requeue
 * every window's policy); noted before the second look, so that a recall
 * ending in between either sees the note or is seen ended here. */
static int policy_yield(ema__win_ctx_t *ctx)
{
    if (atomic_load(&ctx->recalls) == 0) {
        return 0;
    }
    atomic_store(&ctx->policy_yielded, 1);
    return atomic_load(&ctx->recalls) > 0;
}

/* Release the kept copies of segments @first.. of @pol (READ_ONLY). */
static void policy_release_kept(ema_win_h win, ema__win_policy_t *pol, uint32_t first)
    EMA_REQUIRES(win->lock)
{
    EMA_WIN_ASSERT_LOCKED(win);
    for (uint32_t i = first; pol != NULL && pol->has != NULL && i < pol->nkept; i++) {
        if (pol->has[i]) {
            pol->has[i] = 0;
            win->ctx->mem_ops->release(win->ctx->mem_arg, &pol->kept[i], 1);
        }
    }
}

void ema__win_policy_shrunk(ema_win_h win, uint32_t first)
{
    policy_release_kept(win, win->policy, first);
}

/* Segment @i's kept copy, if it is still a copy of what the window holds
 * there (the segment is where the policy brought it); a stale one is
 * released. */
static int policy_kept(ema_win_h win, ema__win_policy_t *pol, uint32_t i)
    EMA_REQUIRES(win->lock)
{
    if (pol->has == NULL || i >= pol->nkept || !pol->has[i]) {
        return 0;
    }
    ema__win_part_t *part = &win->parts[win->ctx->rank];
    if ((atomic_load(&part->loc[i]) & ~EMA_LOC_MOVING) == pol->home[i]) {
        return 1;
    }
    pol->has[i] = 0;
    win->ctx->mem_ops->release(win->ctx->mem_arg, &pol->kept[i], 1);
    return 0;
}

/* Move @idx[0..n) to @loc (with @hdl), with ema__win_move's @flags;
 * returns how many of them moved.  With EMA_WIN_MOVE_KEEP_SPILL the
 * spill-tier memory they leave is kept as their copy (READ_ONLY). */
static uint32_t policy_move(ema_win_h win, uint32_t *idx, uint32_t n, const ema__loc_t *loc,
                            const int64_t *hdl, ema__loc_t *old, unsigned flags)
    EMA_REQUIRES(win->lock)
{
    EMA_WIN_ASSERT_LOCKED(win);
    ema__win_ctx_t *ctx    = win->ctx;
    ema__win_part_t *part  = &win->parts[ctx->rank];
    ema__win_policy_t *pol = win->policy;
    uint32_t *copy = malloc((n ? n : 1) * sizeof(*copy));
    uint32_t moved = 0;

    if (copy == NULL) {
        ctx->mem_ops->release(ctx->mem_arg, loc, n);
        return 0;
    }
    for (uint32_t i = 0; i < n; i++) {
        copy[i] = idx[i];
        old[i]  = atomic_load(&part->loc[idx[i]]) & ~EMA_LOC_MOVING;
    }
    ema__win_move(win, idx, n, -1, loc, hdl, flags); /* sorts idx; releases what did not move */
    for (uint32_t i = 0; i < n; i++) {
        ema__loc_t now = atomic_load(&part->loc[copy[i]]) & ~EMA_LOC_MOVING;
        if (now == old[i]) {
            continue;
        }
        moved++;
        if ((flags & EMA_WIN_MOVE_KEEP_SPILL) && EMA_LOC_RANK(old[i]) == ctx->rank &&
            EMA_LOC_TIER(old[i]) == EMA_TIER_SPILL) {
            if (pol != NULL && pol->has != NULL && copy[i] < pol->nkept) {
                if (pol->has[copy[i]]) { /* an older copy: superseded */
                    ctx->mem_ops->release(ctx->mem_arg, &pol->kept[copy[i]], 1);
                }
                pol->kept[copy[i]] = old[i];
                pol->home[copy[i]] = now;
                pol->has[copy[i]]  = 1;
            } else {
                ctx->mem_ops->release(ctx->mem_arg, &old[i], 1);
            }
        }
    }
    free(copy);
    return moved;
}

/* Move @idx[0..n) (behind, local) back to their kept copies, with no copy;
 * returns how many moved. */
static uint32_t policy_drop_kept(ema_win_h win, ema__win_policy_t *pol, uint32_t *idx,
                                 uint32_t n, ema__loc_t *old) EMA_REQUIRES(win->lock)
{
    ema__win_ctx_t *ctx  = win->ctx;
    ema__mem_arena_t *sp = ctx->tier[EMA_TIER_SPILL];
    ema__loc_t *loc = malloc((n ? n : 1) * sizeof(*loc));
    int64_t *hdl    = malloc((n ? n : 1) * sizeof(*hdl));
    uint32_t moved  = 0;

    if (loc == NULL || hdl == NULL) {
        goto out;
    }
    /* ema__win_move sorts idx and takes the targets in that order: here
     * each target belongs to its segment, so sort first */
    qsort(idx, n, sizeof(*idx), ema__cmp_u32);
    for (uint32_t i = 0; i < n; i++) {
        loc[i]  = pol->kept[idx[i]];
        hdl[i]  = (sp != NULL && sp->ops->seg_handle != NULL)
                      ? sp->ops->seg_handle(sp, EMA_LOC_SEG(loc[i]))
                      : 0;
        /* the kept memory goes back into the window: no longer a copy */
        pol->has[idx[i]] = 0;
    }
    moved = policy_move(win, idx, n, loc, hdl, old, EMA_WIN_MOVE_NO_COPY);
    /* a segment that did not move (held meanwhile) loses its kept copy:
     * ema__win_move released the targets it did not use, so its next
     * eviction copies */
out:
    free(loc);
    free(hdl);
    return moved;
}

/* Free local memory for the ahead segments not yet given any (@got of
 * @p->nahead have some in @loc/@hdl); returns how many have some now. */
static uint32_t policy_take_local(ema__win_ctx_t *ctx, const policy_plan_t *p, uint32_t got,
                                  ema__loc_t *loc, int64_t *hdl)
{
    return got + ctx->mem_ops->acquire(ctx->mem_arg, p->nahead - got, -1, EMA_WIN_FROM_LOCAL,
                                       loc + got, hdl + got);
}

/* The run with @p's ticket is done with its current group: release the
 * advances that wait for it (FLAG_WAIT) and for any run before it. */
static void policy_done(ema_win_h win, const policy_plan_t *p)
{
    uint64_t cur = atomic_load(&win->policy_done);
    while (cur < p->ticket && !atomic_compare_exchange_weak(&win->policy_done, &cur, p->ticket)) {
    }
}

/* Steps 4 and 5 on a plan made under the lock still held. */
static void policy_execute(ema_win_h win, policy_plan_t *p) EMA_REQUIRES(win->lock)
{
    EMA_WIN_ASSERT_LOCKED(win);
    ema__win_ctx_t *ctx = win->ctx;
    uint32_t n = p->nahead + p->nbehind;
    ema__loc_t *loc = calloc(n ? n : 1, sizeof(*loc));
    ema__loc_t *old = calloc(n ? n : 1, sizeof(*old));
    int64_t *hdl    = calloc(n ? n : 1, sizeof(*hdl));
    uint32_t got = 0;

    if (loc == NULL || hdl == NULL || old == NULL) {
        ema_error("out of memory running window %u's prefetch policy", win->id);
        goto out;
    }
    got = policy_take_local(ctx, p, 0, loc, hdl);
    uint32_t out = policy_short(p, got);
    ema__win_policy_t *pol = win->policy;
    if (out > 0 && (pol->flags & EMA_WIN_POLICY_FLAG_READ_ONLY)) {
        /* behind segments with a kept copy leave first, with no copy; the
         * others stay in p->behind for the copying move below */
        uint32_t nk = 0, nu = 0;
        uint32_t *kidx = malloc(out * sizeof(*kidx));
        if (kidx != NULL) {
            for (uint32_t i = 0; i < out; i++) {
                if (policy_kept(win, pol, p->behind[i])) {
                    kidx[nk++] = p->behind[i];
                } else {
                    p->behind[nu++] = p->behind[i];
                }
            }
            uint32_t moved = (nk > 0) ? policy_drop_kept(win, pol, kidx, nk, old) : 0;
            ema_debug("window %u: read-only policy: %u of %u segments to move out have a "
                      "kept copy, %u of them moved back to it", win->id, nk, out, moved);
            atomic_fetch_add(&win->policy_ctr[EMA_WIN_POLICY_CTR_EVICTED],
                             (uint64_t)moved * ctx->seg_size);
            atomic_fetch_add(&win->policy_ctr[EMA_WIN_POLICY_CTR_DROPPED],
                             (uint64_t)moved * ctx->seg_size);
            if (moved > 0) {
                got = policy_take_local(ctx, p, got, loc, hdl);
            }
            free(kidx);
            out = policy_short(p, got);
            out = (out < nu) ? out : nu;
        }
    }
    if (out > 0) {
        ema__loc_t *eloc = loc + p->nahead;
        int64_t *ehdl    = hdl + p->nahead;
        uint32_t e = ctx->mem_ops->acquire(ctx->mem_arg, out, ctx->rank,
                                           EMA_WIN_FROM_PEERS | EMA_WIN_FROM_SPILL, eloc, ehdl);
        if (e < out) {
            ema_debug("window %u: policy found room for %u of %u segments to move out",
                      win->id, e, out);
        }
        uint32_t moved = (e > 0) ? policy_move(win, p->behind, e, eloc, ehdl, old, 0) : 0;
        atomic_fetch_add(&win->policy_ctr[EMA_WIN_POLICY_CTR_EVICTED],
                         (uint64_t)moved * ctx->seg_size);
        if (moved > 0) {
            got = policy_take_local(ctx, p, got, loc, hdl); /* what moved out freed some */
        }
    }
    if (got > 0) {
        /* with FLAG_WAIT the current group moves alone first, and its
         * waiters are released (policy_done) before the groups ahead move */
        unsigned mf  = (pol->flags & EMA_WIN_POLICY_FLAG_READ_ONLY) ? EMA_WIN_MOVE_KEEP_SPILL : 0;
        uint32_t cur = (p->ncur < got) ? p->ncur : got, mcur = 0, moved = 0;
        if (cur > 0) {
            mcur = policy_move(win, p->ahead, cur, loc, hdl, old, mf);
            atomic_fetch_add(&win->policy_ctr[EMA_WIN_POLICY_CTR_PREFETCHED],
                             (uint64_t)mcur * ctx->seg_size); /* counted before the waiter goes */
        }
        policy_done(win, p);
        if (got > cur) {
            moved = policy_move(win, p->ahead + cur, got - cur, loc + cur, hdl + cur, old, mf);
            atomic_fetch_add(&win->policy_ctr[EMA_WIN_POLICY_CTR_PREFETCHED],
                             (uint64_t)moved * ctx->seg_size);
        }
        ema_debug("window %u: policy brought %u of %u segments home (%u of %u of the current "
                  "group)", win->id, mcur + moved, got, mcur, cur);
    }
out:
    free(loc);
    free(old);
    free(hdl);
}

/* The job: a long job, so no EMA lock is held. */
static void policy_job(void *arg)
{
    ema_win_h win       = arg;
    ema__win_ctx_t *ctx = win->ctx;
    policy_plan_t p;
    memset(&p, 0, sizeof(p));

    EMA_WIN_ASSERT_NONE_LOCKED(); /* a long job; the reclaim callback */
    double t0 = ema__now_us();
    double tq = (double)atomic_load(&win->policy_t_queued) * 1e-3;
    atomic_store(&win->policy_queued, 0); /* an advance from now on queues another run */
    /* The ticket this run starts from, read before the position (see
     * ema_win_advance): an advance that waits (FLAG_WAIT) waits for a run
     * with a ticket at least its own to be done with the current group
     * (policy_done), or to end. */
    p.ticket    = atomic_load(&win->policy_seq);
    uint64_t pw = atomic_load(&win->policy_pos);
    if (policy_yield(ctx)) {
        atomic_fetch_add(&win->policy_ctr[EMA_WIN_POLICY_CTR_DEFERRED], 1);
        goto done;
    }
    ema__win_lock(win);
    ema__win_policy_t *pol = win->policy;
    if (win->magic != EMA_WIN_MAGIC || pol == NULL) {
        ema__win_unlock(win);
        goto done;
    }
    atomic_fetch_add(&win->policy_ctr[EMA_WIN_POLICY_CTR_RUNS], 1);
    uint64_t pos = ((uint32_t)(pw >> 32) == pol->gen) ? (uint32_t)pw : 0;
    uint32_t gen = pol->gen;
    p.nsegs  = atomic_load(&win->parts[ctx->rank].nsegs);
    p.groups = malloc(pol->count * sizeof(*p.groups));
    p.mark   = calloc(p.nsegs ? p.nsegs : 1, 1);
    p.ahead  = malloc((p.nsegs ? p.nsegs : 1) * sizeof(*p.ahead));
    p.behind = malloc((p.nsegs ? p.nsegs : 1) * sizeof(*p.behind));
    if (p.groups == NULL || p.mark == NULL || p.ahead == NULL || p.behind == NULL) {
        ema__win_unlock(win);
        ema_error("out of memory running window %u's prefetch policy", win->id);
        goto done;
    }
    policy_plan(win, pol, pos, &p, 0);
    ema_reclaim_cb cb = win->reclaim_cb;
    void *cb_arg      = win->reclaim_arg;
    uint32_t nfree    = ctx->mem_ops->local_free(ctx->mem_arg);
    uint32_t out      = policy_short(&p, nfree);
    uint32_t in       = (p.nahead < nfree + out) ? p.nahead : nfree + out;
    /* what may move is what the owner hears of, and no more */
    for (uint32_t i = 0; i < in; i++) {
        p.mark[p.ahead[i]] |= MARK_NOTIFIED;
    }
    for (uint32_t i = 0; i < out; i++) {
        p.mark[p.behind[i]] |= MARK_NOTIFIED;
    }
    if (cb != NULL && in + out > 0) {
        ema__win_unlock(win);
        memcpy(p.ahead + in, p.behind, out * sizeof(*p.ahead)); /* one list to tell */
        ema__win_notify(win, cb, cb_arg, p.ahead, in + out);
        if (policy_yield(ctx)) {
            atomic_fetch_add(&win->policy_ctr[EMA_WIN_POLICY_CTR_DEFERRED], 1);
            goto done;
        }
        ema__win_lock(win);
        pol = win->policy;
        if (win->magic != EMA_WIN_MAGIC || pol == NULL || pol->gen != gen) {
            ema__win_unlock(win); /* removed or replaced meanwhile: its own job runs */
            goto done;
        }
        pw  = atomic_load(&win->policy_pos);
        pos = ((uint32_t)(pw >> 32) == pol->gen) ? (uint32_t)pw : 0;
        policy_plan(win, pol, pos, &p, 1);
    } else {
        p.nahead = in; /* moves only what was counted above */
        p.nbehind = out;
    }
    atomic_fetch_add(&win->policy_ctr[EMA_WIN_POLICY_CTR_SKIPPED], p.nheld);
    if (p.ncur == 0) {
        /* the current group stays where it is: its waiter goes on now,
         * not after this run's evictions and moves */
        policy_done(win, &p);
    }
    if (p.nahead > 0) {
        policy_execute(win, &p);
    }
    ema__win_unlock(win);
    if (p.nahead > 0) {
        ctx->mem_ops->changed(ctx->mem_arg, EMA_WIN_CHANGED_MEMORY);
    }
    ema_debug("window %u: policy run at group %" PRIu64 ": started %.0f us after queued, "
              "ran %.0f us, %u segments ahead, %u behind", win->id, pos, t0 - tq,
              ema__now_us() - t0, p.nahead, p.nbehind);
done:
    policy_done(win, &p); /* also where nothing moved */
    free(p.groups);
    free(p.mark);
    free(p.ahead);
    free(p.behind);
    atomic_fetch_sub(&win->prefetching, 1);
}

/* Queue @win's job unless one is queued and not started. */
static void policy_queue(ema_win_h win)
{
    if (atomic_exchange(&win->policy_queued, 1) == 0) {
        if (ema__log_level >= EMA_LOG_DEBUG) { /* for the run's debug line only */
            atomic_store(&win->policy_t_queued, (uint64_t)(ema__now_us() * 1e3));
        }
        atomic_fetch_add(&win->prefetching, 1); /* ema_win_free waits for it */
        ema__xport_defer_ref(win->ctx->xp, EMA_JOB_LONG, policy_job, win);
    }
}

void ema__win_recall_begin(ema__win_ctx_t *ctx)
{
    atomic_fetch_add(&ctx->recalls, 1);
}

void ema__win_recall_cancel(ema__win_ctx_t *ctx)
{
    atomic_fetch_sub(&ctx->recalls, 1);
}

void ema__win_recall_end(ema__win_ctx_t *ctx)
{
    if (atomic_fetch_sub(&ctx->recalls, 1) != 1 ||
        atomic_exchange(&ctx->policy_yielded, 0) == 0) {
        return;
    }
    /* walk the list as ema__win_recall does, each window's lock in turn */
    EMA_WIN_ASSERT_NONE_LOCKED();
    for (ema_win_h win = ema__win_list_next(ctx, NULL); win != NULL;
         win = ema__win_list_next(ctx, win)) {
        ema__win_lock(win);
        if (win->magic == EMA_WIN_MAGIC && win->policy != NULL) {
            policy_queue(win);
        }
        ema__win_unlock(win);
    }
}

/* Whether group @word's segments are all in this rank's own memory and
 * not moving (FLAG_WAIT; lock-free: the span array of the policy). */
static int policy_group_home(ema_win_h win, uint64_t word)
{
    ema__win_ctx_t *ctx   = win->ctx;
    ema__win_part_t *part = &win->parts[ctx->rank];
    int home = 0;

    atomic_fetch_add(&win->policy_readers, 1);
    const uint64_t *sp = atomic_load(&win->policy_span);
    if (sp != NULL && sp[0] == (word >> 32)) {
        uint64_t s = sp[(uint32_t)word]; /* word's low half: group + 1 */
        uint32_t first = (uint32_t)(s >> 32), end = (uint32_t)s;
        uint32_t ns = atomic_load(&part->nsegs);
        home = first < end && end <= ns;
        for (uint32_t i = first; home && i < end; i++) {
            ema__loc_t l = atomic_load(&part->loc[i]);
            home = !(l & EMA_LOC_MOVING) && loc_home(ctx, l);
        }
    }
    atomic_fetch_sub(&win->policy_readers, 1);
    return home;
}

/* Free @old, a span swapped out under win->lock, once no advance reads it
 * (called without the lock). */
static void policy_span_retire(ema_win_h win, uint64_t *old)
{
    while (old != NULL && atomic_load(&win->policy_readers) > 0) {
        sched_yield(); /* a reader holds it for a few loads */
    }
    free(old);
}

/* The span array of @pol (FLAG_WAIT) over a part of @seg-byte segments;
 * sp[0], the generation, is set when the policy gets one. */
static uint64_t *policy_span_make(const ema__win_policy_t *pol, size_t seg)
{
    uint64_t *sp = malloc((1 + (size_t)pol->count) * sizeof(*sp));
    if (sp == NULL) {
        return NULL;
    }
    sp[0] = 0;
    for (uint32_t g = 0; g < pol->count; g++) {
        uint32_t first = 0, last = 0;
        policy_segs(&pol->ranges[g], seg, UINT32_MAX, &first, &last);
        sp[1 + g] = ((uint64_t)first << 32) | ((uint64_t)last + 1);
    }
    return sp;
}

/* --- the public calls ------------------------------------------------------ */

static int range_cmp(const void *a, const void *b)
{
    const ema_win_range_t *x = a, *y = b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* @params against the own part of @size bytes: a policy (*pol_p) or,
 * for a removal, NULL.  Nothing changes on error. */
static ema_status_t policy_build(const ema_win_policy_params_t *params, size_t size,
                                 ema__win_policy_t **pol_p)
{
    *pol_p = NULL;
    if (params == NULL) {
        return EMA_SUCCESS;
    }
    uint64_t fm = params->field_mask;
    if ((fm & ~(uint64_t)EMA_WIN_POLICY_FIELDS) || !(fm & EMA_WIN_POLICY_PARAM_FIELD_RANGES)) {
        return EMA_ERR_INVALID_PARAM; /* unknown bits, or no ranges to walk */
    }
    if (params->count == 0) {
        return EMA_SUCCESS;
    }
    unsigned depth = (fm & EMA_WIN_POLICY_PARAM_FIELD_DEPTH) ? params->depth : 1;
    unsigned flags = (fm & EMA_WIN_POLICY_PARAM_FIELD_FLAGS) ? params->flags : 0;
    if (params->ranges == NULL || params->count >= UINT32_MAX || depth == 0 ||
        depth > params->count || (flags & ~(unsigned)EMA_WIN_POLICY_FLAGS)) {
        return EMA_ERR_INVALID_PARAM;
    }
    for (size_t i = 0; i < params->count; i++) {
        const ema_win_range_t *r = &params->ranges[i];
        if (r->length == 0) {
            return EMA_ERR_INVALID_PARAM;
        }
        if (r->offset > size || r->length > size - r->offset) {
            return EMA_ERR_RANGE;
        }
    }
    ema__win_policy_t *pol = calloc(1, sizeof(*pol));
    ema_win_range_t *sorted = malloc(params->count * sizeof(*sorted));
    if (pol == NULL || sorted == NULL) {
        free(pol);
        free(sorted);
        return EMA_ERR_NO_MEMORY;
    }
    memcpy(sorted, params->ranges, params->count * sizeof(*sorted));
    qsort(sorted, params->count, sizeof(*sorted), range_cmp);
    for (size_t i = 1; i < params->count; i++) {
        if (sorted[i].offset < sorted[i - 1].offset + sorted[i - 1].length) {
            free(pol);
            free(sorted);
            return EMA_ERR_INVALID_PARAM; /* groups overlap */
        }
    }
    memcpy(sorted, params->ranges, params->count * sizeof(*sorted)); /* walk order */
    pol->ranges = sorted;
    pol->count  = (uint32_t)params->count;
    pol->depth  = depth;
    pol->flags  = flags;
    *pol_p      = pol;
    return EMA_SUCCESS;
}

static void policy_free(ema__win_policy_t *pol)
{
    if (pol != NULL) {
        free(pol->ranges);
        free(pol->kept);
        free(pol->home);
        free(pol->has);
        free(pol);
    }
}

EMA_EXPORT ema_status_t ema_win_set_policy(ema_win_h win, const ema_win_policy_params_t *params)
{
    ema_status_t status = ema__win_check_live(win);
    if (status != EMA_SUCCESS) {
        return status;
    }
    ema__win_policy_t *pol;
    status = policy_build(params, atomic_load(&win->parts[win->ctx->rank].size), &pol);
    if (status != EMA_SUCCESS) {
        return status;
    }
    if (pol != NULL && (pol->flags & EMA_WIN_POLICY_FLAG_READ_ONLY)) {
        pol->nkept = win->parts[win->ctx->rank].max_segs;
        pol->kept  = calloc(pol->nkept ? pol->nkept : 1, sizeof(*pol->kept));
        pol->home  = calloc(pol->nkept ? pol->nkept : 1, sizeof(*pol->home));
        pol->has   = calloc(pol->nkept ? pol->nkept : 1, 1);
        if (pol->kept == NULL || pol->home == NULL || pol->has == NULL) {
            policy_free(pol);
            return EMA_ERR_NO_MEMORY;
        }
    }
    /* FLAG_WAIT: the groups' segments, for ema_win_advance to look at
     * without the lock; it is also how an advance knows it should wait */
    uint64_t *span = NULL;
    if (pol != NULL && (pol->flags & EMA_WIN_POLICY_FLAG_WAIT) &&
        (span = policy_span_make(pol, win->ctx->seg_size)) == NULL) {
        policy_free(pol);
        return EMA_ERR_NO_MEMORY;
    }
    EMA_WIN_ASSERT_UNLOCKED(win);
    ema__win_lock(win);
    ema__win_policy_t *old = win->policy;
    policy_release_kept(win, old, 0); /* the old policy's copies go back */
    uint32_t gen = (uint32_t)(atomic_load(&win->policy_gc) >> 32) + 1;
    if (pol != NULL) {
        pol->gen = gen;
    }
    win->policy = pol;
    if (span != NULL) {
        span[0] = gen;
    }
    /* swapped under the lock, so that concurrent replacements keep the
     * newest generation's */
    span = atomic_exchange(&win->policy_span, span);
    /* the position first: an advance that sees the new count writes the
     * new generation's position */
    atomic_store(&win->policy_pos, (uint64_t)gen << 32);
    atomic_store(&win->policy_gc, ((uint64_t)gen << 32) | (pol ? pol->count : 0));
    if (pol != NULL) {
        policy_queue(win); /* groups 0..depth-1 come first */
    }
    ema__win_unlock(win);
    policy_span_retire(win, span); /* the old one */
    policy_free(old);
    return EMA_SUCCESS;
}

typedef struct {
    ema_win_h win;
    uint64_t  word;   /* the position advanced to */
    uint64_t  ticket; /* policy_seq taken after storing it */
} policy_wait_t;

static int policy_advanced(void *arg)
{
    const policy_wait_t *w = arg;
    return atomic_load(&w->win->policy_done) >= w->ticket ||
           atomic_load(&w->win->policy_pos) != w->word ||
           (atomic_load(&w->win->policy_gc) >> 32) != (w->word >> 32) ||
           policy_group_home(w->win, w->word);
}

EMA_EXPORT ema_status_t ema_win_advance(ema_win_h win, size_t group)
{
    ema_status_t status = ema__win_check_live(win);
    if (status != EMA_SUCCESS) {
        return status;
    }
    uint64_t gc = atomic_load(&win->policy_gc);
    if ((uint32_t)gc == 0) {
        return EMA_ERR_STATE; /* no policy */
    }
    if (group >= (uint32_t)gc) {
        return EMA_ERR_INVALID_PARAM;
    }
    uint64_t word = (gc & ~0xffffffffull) | (group + 1);
    atomic_store(&win->policy_pos, word);
    /* after the position (seq_cst): a run that reads a ticket >= this one
     * reads this position or a later one */
    uint64_t ticket = atomic_fetch_add(&win->policy_seq, 1) + 1;
    policy_queue(win);
    if (atomic_load(&win->policy_span) == NULL /* no FLAG_WAIT */ ||
        policy_group_home(win, word)) {
        return EMA_SUCCESS;
    }
    /* FLAG_WAIT: until a run from this position is done with the group (or
     * the walk moved on, or the policy changed).  Where no progress thread
     * runs the job, this thread does (a long wait); where one runs, quick
     * steps only, so that no recall and no reclaim callback runs on the
     * application's thread (ema(7) THREADS). */
    EMA_WIN_ASSERT_UNLOCKED(win);
    policy_wait_t w = {win, word, ticket};
    return ema__xport_wait_until(win->ctx->xp,
                                 win->ctx->progress_thread ? EMA_WAIT_QUICK : EMA_WAIT_LONG, 0,
                                 policy_advanced, &w);
}

EMA_EXPORT ema_status_t ema_win_policy_stat(ema_win_h win, ema_win_policy_stat_t *stat_p)
{
    ema_status_t status = ema__win_check_live_out(win, stat_p);
    if (status != EMA_SUCCESS) {
        return status;
    }
    ema__win_ctx_t *ctx   = win->ctx;
    ema__win_part_t *part = &win->parts[ctx->rank];
    size_t seg = ctx->seg_size;
    ema_win_policy_stat_t st;
    uint32_t *groups = NULL;
    memset(&st, 0, sizeof(st));
    st.group = EMA_WIN_POLICY_NO_GROUP;

    EMA_WIN_ASSERT_UNLOCKED(win);
    ema__win_lock(win);
    ema__win_policy_t *pol = win->policy;
    if (pol != NULL && (groups = malloc(pol->count * sizeof(*groups))) == NULL) {
        ema__win_unlock(win);
        return EMA_ERR_NO_MEMORY;
    }
    if (pol != NULL) {
        uint64_t pw  = atomic_load(&win->policy_pos);
        uint64_t pos = ((uint32_t)(pw >> 32) == pol->gen) ? (uint32_t)pw : 0;
        uint32_t ns  = atomic_load(&part->nsegs), first, last;
        size_t size  = atomic_load(&part->size);
        st.count = pol->count;
        st.depth = pol->depth;
        st.group = pos ? (size_t)(pos - 1) : EMA_WIN_POLICY_NO_GROUP;
        uint32_t ng = policy_ahead(pol, pos, groups);
        for (uint32_t k = 0; k < ng; k++) {
            const ema_win_range_t *r = &pol->ranges[groups[k]];
            size_t end = (r->offset + r->length < size) ? r->offset + r->length : size;
            if (r->offset >= end || !policy_segs(r, seg, ns, &first, &last)) {
                continue;
            }
            st.bytes_ahead += end - r->offset;
            for (uint32_t i = first; i <= last; i++) {
                size_t lo = (size_t)i * seg, hi = lo + seg;
                lo = (lo > r->offset) ? lo : r->offset;
                hi = (hi < end) ? hi : end;
                if (hi > lo && loc_home(ctx, atomic_load(&part->loc[i]) & ~EMA_LOC_MOVING)) {
                    st.bytes_ahead_local += hi - lo;
                }
            }
        }
    }
    ema__win_unlock(win);
    free(groups);
    st.bytes_prefetched = atomic_load(&win->policy_ctr[EMA_WIN_POLICY_CTR_PREFETCHED]);
    st.bytes_evicted    = atomic_load(&win->policy_ctr[EMA_WIN_POLICY_CTR_EVICTED]);
    st.skipped_held     = atomic_load(&win->policy_ctr[EMA_WIN_POLICY_CTR_SKIPPED]);
    st.deferred         = atomic_load(&win->policy_ctr[EMA_WIN_POLICY_CTR_DEFERRED]);
    st.runs             = atomic_load(&win->policy_ctr[EMA_WIN_POLICY_CTR_RUNS]);
    st.bytes_dropped    = atomic_load(&win->policy_ctr[EMA_WIN_POLICY_CTR_DROPPED]);
    st.field_mask = EMA_WIN_POLICY_STAT_FIELD_COUNT | EMA_WIN_POLICY_STAT_FIELD_DEPTH |
                    EMA_WIN_POLICY_STAT_FIELD_GROUP | EMA_WIN_POLICY_STAT_FIELD_BYTES_AHEAD |
                    EMA_WIN_POLICY_STAT_FIELD_BYTES_AHEAD_LOCAL |
                    EMA_WIN_POLICY_STAT_FIELD_BYTES_PREFETCHED |
                    EMA_WIN_POLICY_STAT_FIELD_BYTES_EVICTED |
                    EMA_WIN_POLICY_STAT_FIELD_SKIPPED_HELD | EMA_WIN_POLICY_STAT_FIELD_DEFERRED |
                    EMA_WIN_POLICY_STAT_FIELD_RUNS | EMA_WIN_POLICY_STAT_FIELD_BYTES_DROPPED;
    memcpy(stat_p, &st, offsetof(ema_win_policy_stat_t, reserved));
    return EMA_SUCCESS;
}

void ema__win_policy_drop(ema_win_h win)
{
    EMA_WIN_ASSERT_UNLOCKED(win);
    ema__win_lock(win);
    ema__win_policy_t *pol = win->policy;
    policy_release_kept(win, pol, 0);
    win->policy = NULL;
    atomic_store(&win->policy_gc, atomic_load(&win->policy_gc) & ~0xffffffffull);
    uint64_t *span = atomic_exchange(&win->policy_span, NULL);
    ema__win_unlock(win);
    policy_span_retire(win, span);
    policy_free(pol);
}
