/*
 * The public window calls past allocation: grow, shrink, free, acquire and
 * release, the reclaim callback, prefetch and statistics.  The window owns
 * its segments; the memory for them comes from, and goes back to, the
 * memory provider that the pool registers (ctx->mem_ops): win never decides
 * who lends.
 */
#include "win.h"

#include "util/clock.h"
#include "util/log.h"
#include "util/state.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int ema_win_no_prefetch(void *arg)
{
    return atomic_load(&((ema_win_h)arg)->prefetching) == 0;
}

EMA_EXPORT ema_status_t ema_win_free(ema_win_h win)
{
    ema_status_t status = ema__win_check_live(win);
    if (status != EMA_SUCCESS) {
        return status;
    }
    ema__win_ctx_t *ctx = win->ctx;
    EMA_WIN_ASSERT_NONE_LOCKED(); /* runs long jobs, which take window locks */
    /* A queued prefetch uses the window: let it run (here too, in case
     * there is no progress thread) before the window goes. */
    ema__xport_wait_until(ctx->xp, EMA_WAIT_LONG, 0, ema_win_no_prefetch, win);
    status = ema__win_free(ctx, win);
    if (status == EMA_SUCCESS || win->magic == EMA_WIN_MAGIC_DEAD) {
        /* its jobs see the window dead; its kept copies go back, also when
         * only the closing barrier failed */
        ema__win_policy_drop(win);
    }
    if (status == EMA_SUCCESS) {
        /* recalls of its segments end; our memory is free again */
        ctx->mem_ops->changed(ctx->mem_arg, EMA_WIN_CHANGED_RELEASED | EMA_WIN_CHANGED_MEMORY);
    }
    return status;
}

/* A live window, and a new size of its own part that grows it (@grow) or
 * shrinks it: EMA_ERR_INVALID_PARAM otherwise. */
static ema_status_t win_resize_check(ema_win_h win, size_t new_size, int grow)
{
    ema_status_t status = ema__win_check_live(win);
    if (status != EMA_SUCCESS) {
        return status;
    }
    size_t cur = atomic_load(&win->parts[win->ctx->rank].size);
    if (grow ? (new_size > win->reserved || new_size < cur) : new_size > cur) {
        return EMA_ERR_INVALID_PARAM;
    }
    return EMA_SUCCESS;
}

EMA_EXPORT ema_status_t ema_win_grow(ema_win_h win, size_t new_size)
{
    ema_status_t status = win_resize_check(win, new_size, 1);
    if (status != EMA_SUCCESS) {
        return status;
    }
    ema__win_ctx_t *ctx   = win->ctx;
    ema__win_part_t *part = &win->parts[ctx->rank];
    size_t seg = ctx->seg_size;

    /* Find the memory first, without holding the window: reclaiming and
     * borrowing wait on peers, whose migrations may need this window. */
    EMA_WIN_ASSERT_NONE_LOCKED();
    uint32_t cur  = atomic_load(&part->nsegs);
    uint32_t need = (uint32_t)((new_size + seg - 1) / seg);
    if (need < cur) {
        /* another thread grew the part past new_size since the checks
         * (calls on one part's size must not race): without this the count
         * wrapped and the grow took every segment it could find */
        return EMA_ERR_STATE;
    }
    uint32_t want = need - cur;
    ema__loc_t *locs = calloc(want ? want : 1, sizeof(*locs));
    int64_t *handles = calloc(want ? want : 1, sizeof(*handles));
    uint32_t got = 0;
    if (locs == NULL || handles == NULL) {
        status = EMA_ERR_NO_MEMORY;
        goto out;
    }
    got = ctx->mem_ops->acquire(ctx->mem_arg, want, -1, EMA_WIN_FROM_LOCAL, locs, handles);
    if (got < want) {
        /* the memory this rank lent comes back first (implicit reclaim),
         * handed to this grow as it comes free: no peer's borrow takes it */
        got += ctx->mem_ops->reclaim_for_self(ctx->mem_arg, want - got, locs + got,
                                              handles + got);
    }
    if (got < want) {
        got += ctx->mem_ops->acquire(ctx->mem_arg, want - got, -1, EMA_WIN_FROM_ANY,
                                     locs + got, handles + got);
    }
    if (got < want) {
        ema_debug("grow of window %u to %zu bytes: found %u of %u segments", win->id,
                  new_size, got, want);
        status = EMA_ERR_NO_MEMORY;
        goto err_release;
    }

    if (ctx->debug_grow_delay_us > 0) {
        usleep(ctx->debug_grow_delay_us); /* EMA_DEBUG_GROW_MAP_DELAY: tests only */
    }
    ema__win_lock(win);
    if (atomic_load(&part->nsegs) != cur || new_size < atomic_load(&part->size)) {
        /* another thread grew or shrank meanwhile (a grow within the last
         * segment changes the size alone): calls on one window's size
         * must not race (ema(7)) */
        ema__win_unlock(win);
        status = EMA_ERR_STATE;
        goto err_release;
    }
    ema__xport_peers_check(ctx->xp); /* without a progress thread, nobody else looks */
    for (uint32_t i = 0; i < want; i++) {
        int r = EMA_LOC_RANK(locs[i]);
        if (r != ctx->rank && ema__xport_peer_lost(ctx->xp, r)) {
            /* a lender died since it granted: its bytes are gone, and a grow
             * never hands out bytes that fail (ema_win_grow(3)) */
            ema_warn("grow of window %u: lender rank %d was lost during the grow", win->id, r);
            ema__win_unlock(win);
            status = EMA_ERR_PEER_LOST;
            goto err_release;
        }
    }
    for (uint32_t i = 0; i < want; i++) {
        status = ema__win_seg_map(win, cur + i, locs[i], handles[i]);
        if (status != EMA_SUCCESS) {
            ema__win_seg_unmap(win, cur, i);
            ema__win_unlock(win);
            goto err_release;
        }
        atomic_store(&part->loc[cur + i], locs[i]);
    }
    atomic_store(&part->nsegs, cur + want);
    atomic_store(&part->size, new_size);
    ctx->mem_ops->mapped(ctx->mem_arg, locs, want);
    /* locs, no longer needed, is the publish's buffer: allocated before
     * the part changed.  A peer not told learns the new size when it
     * addresses it (ema__win_fetch), or from the next publish, which
     * sends it the whole table. */
    status = ema__win_publish(win, cur, want, locs);
    ema__win_unlock(win);
    goto out;

err_release:
    ctx->mem_ops->release(ctx->mem_arg, locs, got);
out:
    free(locs);
    free(handles);
    ctx->mem_ops->changed(ctx->mem_arg, EMA_WIN_CHANGED_MEMORY);
    return status;
}

/* Segments of [first, last] of the own part that are not at home: spilled
 * ones first, then borrowed ones, held ones left out, and with @told only
 * those marked in told[i - first] (the ones the owner heard of).  Called
 * with win->lock held; returns how many, in @idx. */
static uint32_t ema_win_away(ema_win_h win, uint32_t first, uint32_t last, const uint8_t *told,
                             uint32_t *idx) EMA_REQUIRES(win->lock)
{
    EMA_WIN_ASSERT_LOCKED(win);
    ema__win_part_t *part = &win->parts[win->ctx->rank];
    uint32_t n = 0;

    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = first; i <= last; i++) {
            ema__loc_t l = atomic_load(&part->loc[i]) & ~EMA_LOC_MOVING;
            int spilled  = EMA_LOC_TIER(l) == EMA_TIER_SPILL;
            int borrowed = !spilled && EMA_LOC_RANK(l) != win->ctx->rank;
            if ((pass == 0 ? spilled : borrowed) && atomic_load(&win->held[i]) == 0 &&
                (told == NULL || told[i - first])) {
                idx[n++] = i;
            }
        }
    }
    return n;
}

/*
 * Bring segments [first, last] of the own part home, into free local
 * memory, as one migration batch: spilled ones first, then borrowed ones,
 * as far as there is room (nothing is reclaimed or evicted for it).
 * Segments held with ema_win_acquire stay where they are.  The owner's
 * reclaim callback hears of the ranges first, without the window's lock;
 * then only those may move (the second look under the lock keeps the told
 * ones that are still away and unheld), as the policy's job does with
 * MARK_NOTIFIED (policy.c): the window may change while the callback runs
 * (a held segment released, by the callback itself or another thread, or
 * more memory free), and a segment nobody told the owner of must not move.
 * Without a callback the lock is held throughout.  Used by shrink and
 * prefetch; takes win->lock itself.
 */
static void ema_win_bring_home(ema_win_h win, uint32_t first, uint32_t last)
{
    ema__win_ctx_t *ctx   = win->ctx;
    ema__win_part_t *part = &win->parts[ctx->rank];
    uint32_t *idx = NULL, n = 0;
    uint8_t *told = NULL;
    ema__loc_t *locs = NULL;
    int64_t *hdls = NULL;

    EMA_WIN_ASSERT_NONE_LOCKED(); /* the reclaim callback runs without it */
    ema__win_lock(win);
    uint32_t ns = atomic_load(&part->nsegs);
    if (ns == 0 || first >= ns) {
        ema__win_unlock(win);
        return;
    }
    last = (last < ns) ? last : ns - 1;
    uint32_t want = last - first + 1;
    idx  = calloc(want, sizeof(*idx));
    told = calloc(want, 1);
    locs = calloc(want, sizeof(*locs));
    hdls = calloc(want, sizeof(*hdls));
    if (idx == NULL || told == NULL || locs == NULL || hdls == NULL) {
        ema__win_unlock(win);
        goto out;
    }
    ema_reclaim_cb cb = win->reclaim_cb;
    void *cb_arg      = win->reclaim_arg;
    n = ema_win_away(win, first, last, NULL, idx);
    if (n > 0 && cb != NULL) {
        /* those that may move: the first that fit in free memory */
        uint32_t nfree = ctx->mem_ops->local_free(ctx->mem_arg);
        n = (n < nfree) ? n : nfree;
        for (uint32_t i = 0; i < n; i++) {
            told[idx[i] - first] = 1;
        }
        ema__win_unlock(win);
        if (n == 0) {
            goto out;
        }
        ema__win_notify(win, cb, cb_arg, idx, n);
        ema__win_lock(win);
        ns = atomic_load(&part->nsegs);
        n  = (first < ns) ? ema_win_away(win, first, (last < ns) ? last : ns - 1, told, idx)
                          : 0;
    }
    if (n > 0) {
        /* the first got of the list (spilled first) move */
        uint32_t got = ctx->mem_ops->acquire(ctx->mem_arg, n, -1, EMA_WIN_FROM_LOCAL, locs, hdls);
        if (got > 0) {
            ema_debug("window %u: %u of %u segments home", win->id, got, n);
            ema__win_move(win, idx, got, -1, locs, hdls, 0);
        }
    }
    ema__win_unlock(win);
out:
    free(idx);
    free(told);
    free(locs);
    free(hdls);
}

static ema_status_t win_shrink(ema_win_h win, size_t new_size);

EMA_EXPORT ema_status_t ema_win_shrink(ema_win_h win, size_t new_size)
{
    ema_status_t status = win_resize_check(win, new_size, 0);
    if (status == EMA_SUCCESS) {
        status = win_shrink(win, new_size);
    }
    return status;
}

/* Whether a segment of [first, end) of the own part is held (ema_win_acquire). */
static int ema_win_any_held(ema_win_h win, uint32_t first, uint32_t end)
{
    for (uint32_t i = first; i < end; i++) {
        if (atomic_load(&win->held[i]) > 0) {
            return 1;
        }
    }
    return 0;
}

/*
 * ema_win_shrink, its arguments checked.
 *
 * A shrink never cuts into a held segment: when a segment with bytes past
 * @new_size is held with ema_win_acquire, it fails with EMA_ERR_STATE and
 * changes nothing.  Dropping it would unmap memory the holder may be using
 * (plain loads, stores, kernels: what acquire promises to keep in place),
 * and the holder's release of its range, then outside the part, would fail
 * with EMA_ERR_RANGE and leave the count positive for good; a grow would
 * map that index again still "held", never to migrate, and a lender's
 * recall of it would park until the lender's reclaim timed out.  Dropping
 * the counts instead would let a late release (after a grow) take the
 * count of somebody else's acquire.  Counts are per segment, so a kept
 * segment that the new size cuts (its tail leaves the part) refuses too:
 * its holder's range may reach past the new end.  The application releases
 * first, as it would before freeing memory it hands out.
 *
 * An acquire on another thread races with the shrink as with a move: the
 * segments that lose bytes, [cut, cur), are marked MOVING first (the
 * dropped ones by the invalidation, the cut kept one here, in the own
 * table only), then their held counts are read; an acquire counts first,
 * then looks for MOVING (ema_win_hold), so one of the two sees the other.
 * A count seen puts everything back as it was (EMA_ERR_STATE); an acquire
 * that saw the mark waits, holding nothing, and fails with EMA_ERR_RANGE
 * if its range left the part.
 */
static ema_status_t win_shrink(ema_win_h win, size_t new_size)
{
    ema__win_ctx_t *ctx   = win->ctx;
    ema__win_part_t *part = &win->parts[ctx->rank];
    size_t seg            = ctx->seg_size;
    ema_status_t status;

    EMA_WIN_ASSERT_NONE_LOCKED(); /* takes win->lock; ema_win_bring_home */
    ema__win_lock(win);
    if (new_size > atomic_load(&part->size)) {
        /* another thread shrank the part below new_size since the checks:
         * calls on one part's size must not race (ema(7) THREADS); without
         * this the count of segments to drop wrapped, and the shrink waited
         * for ever on an invalidation every peer refused */
        ema__win_unlock(win);
        ema_debug("ema_win_shrink: window %u to %zu bytes: the part shrank to %zu meanwhile: "
                  "nothing changed", win->id, new_size, atomic_load(&part->size));
        return EMA_ERR_STATE;
    }
    uint32_t cur  = atomic_load(&part->nsegs);
    uint32_t keep = (uint32_t)((new_size + seg - 1) / seg);
    uint32_t drop = cur - keep;
    /* the first segment with bytes past new_size: keep - 1 where new_size
     * cuts a segment, keep where it ends on a boundary, cur if nothing goes */
    uint32_t cut = (new_size < atomic_load(&part->size)) ? (uint32_t)(new_size / seg) : cur;
    uint32_t n   = cur - cut;
    if (ema_win_any_held(win, cut, cur)) {
        ema__win_unlock(win);
        ema_debug("ema_win_shrink: window %u to %zu bytes: segments %u..%u are held: nothing "
                  "changed", win->id, new_size, cut, cur - 1);
        return EMA_ERR_STATE;
    }
    /* the locations of [cut, cur), then the publish buffer */
    ema__loc_t *old = calloc(n ? 2 * (size_t)n : 1, sizeof(*old));
    if (old == NULL) {
        ema__win_unlock(win);
        return EMA_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < n; i++) {
        old[i] = atomic_load(&part->loc[cut + i]) & ~EMA_LOC_MOVING;
    }
    /* the cut kept segment: no peer need stop using it, but this rank's
     * acquires must see the shrink (a peer that fetches the table meanwhile
     * gets the mark, and the publish below clears it) */
    for (uint32_t i = cut; i < keep; i++) {
        atomic_fetch_or(&part->loc[i], EMA_LOC_MOVING);
    }
    status = EMA_SUCCESS;
    if (drop > 0) {
        /* nobody may use the dropped segments any more */
        status = ema__win_invalidate(win, keep, drop);
        if (status != EMA_SUCCESS) {
            /* Some rank may not have stopped using them: nothing is
             * dropped, and they go back in service everywhere (left
             * MOVING, every later acquire and operation on them waited
             * for ever) */
            ema_error("ema_win_shrink: invalidating segments %u..%u of window %u failed (%s): "
                      "the part stays as it was", keep, cur - 1, win->id, ema_strerror(status));
        }
    }
    if (status == EMA_SUCCESS && ema_win_any_held(win, cut, cur)) {
        /* acquired while we marked them: the acquire came first */
        ema_debug("ema_win_shrink: window %u to %zu bytes: segments %u..%u acquired meanwhile: "
                  "nothing changed", win->id, new_size, cut, cur - 1);
        status = EMA_ERR_STATE;
    }
    if (status != EMA_SUCCESS) {
        if (n > 0) {
            ema__win_restore(win, &cut, &n, 1, old, old + n);
        }
        ema__win_unlock(win);
        free(old);
        return status;
    }
    if (drop > 0) {
        ema__win_seg_unmap(win, keep, drop);
    }
    atomic_store(&part->size, new_size);
    atomic_store(&part->nsegs, keep);
    /* the cut segment back in service once the size says where the part
     * ends: an acquire that waited on it checks its range again */
    for (uint32_t i = cut; i < keep; i++) {
        atomic_store(&part->loc[i], old[i - cut]);
    }
    ema__win_policy_shrunk(win, keep); /* kept copies past the end go */
    /* peers not told keep the marks, until a later publish sends them the
     * whole table */
    status = ema__win_publish(win, cut, keep - cut, old + n);
    ema__win_wanted_bytes(win); /* forgets the wanted segments dropped */
    ema__win_unlock(win);
    ctx->mem_ops->release(ctx->mem_arg, old + (keep - cut), drop);
    free(old);

    /* What stays should live locally where there is room */
    if (status == EMA_SUCCESS && keep > 0) {
        ema_win_bring_home(win, 0, keep - 1);
    }
    /* recalls of dropped segments end; our memory use changed */
    ctx->mem_ops->changed(ctx->mem_arg, EMA_WIN_CHANGED_RELEASED | EMA_WIN_CHANGED_MEMORY);
    return status;
}

EMA_EXPORT ema_status_t ema_win_set_reclaim_cb(ema_win_h win, ema_reclaim_cb cb, void *arg)
{
    ema_status_t status = ema__win_check_live(win);
    if (status != EMA_SUCCESS) {
        return status;
    }
    EMA_WIN_ASSERT_UNLOCKED(win);
    ema__win_lock(win); /* migrations read it under the lock */
    win->reclaim_cb  = cb;
    win->reclaim_arg = cb ? arg : NULL;
    ema__win_unlock(win);
    return EMA_SUCCESS;
}

/* [offset, offset+len) lies inside @part. */
static int ema_win_range_in(ema__win_part_t *part, size_t offset, size_t len)
{
    size_t size = atomic_load(&part->size);
    return offset <= size && len <= size - offset;
}

/* An acquire's wait on a MOVING segment of its range. */
typedef struct {
    ema__win_part_t     *part;
    _Atomic ema__loc_t  *loc;
    size_t               offset, len;
} ema_win_settle_t;

/* The segment's location is not MOVING, or the range has left the part (a
 * shrink dropped the segment: it stays MOVING until a grow maps it). */
static int ema_win_settled(void *arg)
{
    const ema_win_settle_t *w = arg;
    return !(atomic_load(w->loc) & EMA_LOC_MOVING) ||
           !ema_win_range_in(w->part, w->offset, w->len);
}

/* An acquire's wait for the recalls due when it came (see ema_win_hold). */
typedef struct {
    ema__win_ctx_t *ctx;
    unsigned        passes; /* recall_passes once they are through */
} ema_win_recall_wait_t;

static int ema_win_recalls_passed(void *arg)
{
    const ema_win_recall_wait_t *w = arg;
    return atomic_load(&w->ctx->recalls) == 0 || atomic_load(&w->ctx->callbacks) > 0 ||
           (int)(atomic_load(&w->ctx->recall_passes) - w->passes) >= 0;
}

/* The longest an acquire waits for recalls (a bound, not a figure: a
 * recall's pass is a move of a few milliseconds, or a refusal). */
#define EMA_WIN_RECALL_WAIT_US 1e6

/*
 * A recall queued or running when an acquire comes (a lender waits for it;
 * one parked on a held range was queued again by the release) goes first,
 * as a move in progress does (ema_win_hold).  Without this an owner that
 * releases its part and acquires it again at once, step after step,
 * starves the recall, which finds the part held at each pass, and the
 * lender waits out its timeout.  Only:
 *   - where the progress thread runs recalls: the wait runs quick jobs
 *     only, so neither a recall nor its reclaim callback ever runs inside
 *     ema_win_acquire (without the thread, recalls run in the
 *     application's ema_progress and ema_barrier, and an acquire does not
 *     wait for them);
 *   - for segments [first, last] with a borrowed one (only those are
 *     recalled);
 *   - not while a reclaim callback runs (ctx->callbacks), this thread's
 *     own included: the callback may be one of those very recalls', or
 *     wait for this thread (an application lock held across the acquire);
 *     the recall then parks on the range and, queued again by the
 *     release, runs without a callback the next time, which the next
 *     acquire waits for;
 *   - for at most EMA_WIN_RECALL_WAIT_US.
 * Returns whether it waited: the caller then checks the range again.
 */
static int ema_win_hold_wait_recalls(ema_win_h win, uint32_t first, uint32_t last)
{
    ema__win_ctx_t *ctx   = win->ctx;
    ema__win_part_t *part = &win->parts[ctx->rank];
    int borrowed = 0;

    if (!ctx->progress_thread || atomic_load(&ctx->recalls) == 0 ||
        atomic_load(&ctx->callbacks) > 0) {
        return 0;
    }
    for (uint32_t i = first; i <= last && !borrowed; i++) {
        ema__loc_t l = atomic_load(&part->loc[i]) & ~EMA_LOC_MOVING;
        borrowed = EMA_LOC_RANK(l) != ctx->rank && EMA_LOC_TIER(l) == EMA_TIER_DEVICE;
    }
    if (!borrowed) {
        return 0;
    }
    ema_win_recall_wait_t w = {ctx, 0};
    w.passes = atomic_load(&ctx->recall_passes) + (unsigned)atomic_load(&ctx->recalls);
    ema__xport_wait_until(ctx->xp, EMA_WAIT_QUICK, ema__now_us() + EMA_WIN_RECALL_WAIT_US,
                          ema_win_recalls_passed, &w);
    return 1;
}

static ema_status_t ema_win_hold(ema_win_h win, size_t offset, size_t len, int delta)
{
    ema_status_t status = ema__win_check_live(win);
    if (status != EMA_SUCCESS) {
        return status;
    }
    /* An acquire waits until MOVING clears, which the thread holding
     * win->lock (a move) does: never wait for oneself. */
    EMA_WIN_ASSERT_UNLOCKED(win);
    ema__win_part_t *part = &win->parts[win->ctx->rank];
    size_t seg = win->ctx->seg_size;
    int waited = 0;
    uint32_t first, last;
    if (len == 0) {
        return EMA_ERR_INVALID_PARAM;
    }
    for (;;) {
        if (!ema_win_range_in(part, offset, len)) {
            return EMA_ERR_RANGE;
        }
        first = (uint32_t)(offset / seg);
        last  = (uint32_t)((offset + len - 1) / seg);
        if (delta < 0 || waited || !ema_win_hold_wait_recalls(win, first, last)) {
            break;
        }
        waited = 1; /* the part may have shrunk meanwhile: look again */
    }
    if (delta < 0) {
        for (uint32_t i = first; i <= last; i++) {
            if (atomic_load(&win->held[i]) <= 0) {
                return EMA_ERR_INVALID_PARAM; /* not acquired: change nothing */
            }
        }
        for (uint32_t i = first; i <= last; i++) {
            atomic_fetch_sub(&win->held[i], 1);
        }
        return EMA_SUCCESS;
    }
    /* Count each segment, then look whether it is being moved: the mover
     * (a move, or a shrink) marks MOVING first and reads the counts after
     * (seq_cst on both sides), so one of the two always sees the other.  A
     * segment already being moved is not ours to hold until the move is
     * over: give back every count taken (an acquire that waits holds
     * nothing, so a shrink is not refused for it, and a recall may move
     * the rest meanwhile), wait, and count again from the start.  A shrink
     * marks the segments it drops MOVING and leaves them so, and marks the
     * one it cuts until the new size is stored: once the range is no
     * longer inside the part, the acquire fails, holding nothing.  The
     * range is checked again once all is counted, for an acquire that
     * checked it before a shrink and counts after it (ema_win_shrink). */
    for (;;) {
        uint32_t i, moving = 0;
        for (i = first; i <= last && !moving; i++) {
            atomic_fetch_add(&win->held[i], 1);
            moving = (atomic_load(&part->loc[i]) & EMA_LOC_MOVING) != 0;
        }
        if (!moving && ema_win_range_in(part, offset, len)) {
            return EMA_SUCCESS;
        }
        for (uint32_t j = first; j < i; j++) {
            atomic_fetch_sub(&win->held[j], 1);
        }
        /* a recall that found them held meanwhile parked: no release will
         * wake it */
        win->ctx->mem_ops->changed(win->ctx->mem_arg, EMA_WIN_CHANGED_RELEASED);
        if (!ema_win_range_in(part, offset, len)) {
            return EMA_ERR_RANGE;
        }
        ema_win_settle_t w = {part, &part->loc[i - 1], offset, len};
        ema__xport_wait_until(win->ctx->xp, EMA_WAIT_QUICK, 0, ema_win_settled, &w);
    }
}

EMA_EXPORT ema_status_t ema_win_acquire(ema_win_h win, size_t offset, size_t len)
{
    return ema_win_hold(win, offset, len, 1);
}

EMA_EXPORT ema_status_t ema_win_release(ema_win_h win, size_t offset, size_t len)
{
    ema_status_t status = ema_win_hold(win, offset, len, -1);
    if (status == EMA_SUCCESS) {
        /* recalls waiting for the range look again */
        win->ctx->mem_ops->changed(win->ctx->mem_arg, EMA_WIN_CHANGED_RELEASED);
    }
    return status;
}

/* --- prefetch -------------------------------------------------------------- */

typedef struct {
    ema_win_h    win;
    uint32_t     first, last; /* segments of the own part */
    double       t_call;      /* when ema_win_prefetch queued it (us) */
} ema_win_prefetch_t;

/* On the progress engine; held segments are skipped, not waited for: a
 * hint must not stall the engine behind the application. */
static void ema_win_prefetch_job(void *arg)
{
    ema_win_prefetch_t *job = arg;
    ema__win_ctx_t *ctx     = job->win->ctx;

    EMA_WIN_ASSERT_NONE_LOCKED(); /* a long job: run where no EMA lock is held */
    double t0 = ema__now_us();
    ema_win_bring_home(job->win, job->first, job->last);
    ema_debug("window %u: prefetch job started %.0f us after the call, ran %.0f us",
              job->win->id, t0 - job->t_call, ema__now_us() - t0);
    ctx->mem_ops->changed(ctx->mem_arg, EMA_WIN_CHANGED_MEMORY);
    atomic_fetch_sub(&job->win->prefetching, 1);
    free(job);
}

EMA_EXPORT ema_status_t ema_win_prefetch(ema_win_h win, size_t offset, size_t len)
{
    ema_status_t status = ema__win_check_live(win);
    if (status != EMA_SUCCESS) {
        return status;
    }
    ema__win_part_t *part = &win->parts[win->ctx->rank];
    size_t seg = win->ctx->seg_size, size = atomic_load(&part->size);
    if (offset > size || len > size - offset) {
        return EMA_ERR_RANGE;
    }
    if (len == 0) {
        return EMA_SUCCESS;
    }
    ema_win_prefetch_t *job = malloc(sizeof(*job));
    if (job == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    job->win   = win;
    job->first = (uint32_t)(offset / seg);
    job->last  = (uint32_t)((offset + len - 1) / seg);
    job->t_call = ema__now_us();
    atomic_fetch_add(&win->prefetching, 1);
    ema__xport_defer(win->ctx->xp, EMA_JOB_LONG, ema_win_prefetch_job, job);
    return EMA_SUCCESS;
}

/* ema_win_stat's counts of the own part's locations; 0 if the part was
 * caught between a grow's or a shrink's stores of its segment count and its
 * size (only without the lock). */
static int ema_win_stat_count(ema_win_h win, ema_win_stat_t *st)
{
    ema__win_ctx_t *ctx   = win->ctx;
    ema__win_part_t *part = &win->parts[ctx->rank];
    size_t seg  = ctx->seg_size;
    uint32_t n  = atomic_load(&part->nsegs);
    size_t size = atomic_load(&part->size);

    memset(st, 0, sizeof(*st));
    st->size     = size;
    st->max_size = win->reserved;
    for (uint32_t i = 0; i < n; i++) {
        ema__loc_t l = atomic_load(&part->loc[i]) & ~EMA_LOC_MOVING;
        size_t bytes = seg;
        if (i == n - 1 && size % seg) {
            bytes = size % seg; /* the part's bytes, not the segment's */
        }
        if (EMA_LOC_TIER(l) == EMA_TIER_SPILL) {
            st->bytes_spilled += bytes;
        } else if (EMA_LOC_RANK(l) == ctx->rank) {
            st->bytes_local += bytes;
        } else {
            st->bytes_borrowed += bytes;
        }
    }
    return n == (size + seg - 1) / seg && atomic_load(&part->nsegs) == n &&
           atomic_load(&part->size) == size;
}

/* ema_win_stat's counts and bytes_wanted, under the lock. */
static void ema_win_stat_locked(ema_win_h win, ema_win_stat_t *st) EMA_REQUIRES(win->lock)
{
    ema_win_stat_count(win, st);
    st->bytes_wanted = ema__win_wanted_bytes(win);
}

EMA_EXPORT ema_status_t ema_win_stat(ema_win_h win, ema_win_stat_t *stat_p)
{
    ema_status_t status = ema__win_check_live_out(win, stat_p);
    if (status != EMA_SUCCESS) {
        return status;
    }
    /* field_mask is output only: every field this version knows is filled
     * and named there, whatever the caller left in it (an uninitialised
     * struct works); a later version fills new fields in reserved[]. */
    const uint64_t known = EMA_WIN_STAT_FIELD_SIZE | EMA_WIN_STAT_FIELD_MAX_SIZE |
                           EMA_WIN_STAT_FIELD_BYTES_LOCAL | EMA_WIN_STAT_FIELD_BYTES_BORROWED |
                           EMA_WIN_STAT_FIELD_BYTES_SPILLED | EMA_WIN_STAT_FIELD_MIGRATIONS |
                           EMA_WIN_STAT_FIELD_BYTES_WANTED;
    ema_win_stat_t st;
    EMA_WIN_ASSERT_UNLOCKED(win);
    /* Never behind a migration: one holds the lock for its whole copy (a
     * millisecond per GiB on a GPU), and a caller polling for its end used
     * to sleep on the mutex and wake late.  Without the lock the counts are
     * of the locations as they are (a moving segment at its old place or
     * its new one, never neither: ema(7) MIGRATION), taken again while a
     * grow or shrink is between its stores of the part's segments and size;
     * bytes_wanted is as the last change under the lock left it. */
    int counted = ema__win_trylock(win);
    if (counted) {
        ema_win_stat_locked(win, &st);
        ema__win_unlock(win);
    }
    for (int tries = 0; tries < 3 && !counted; tries++) {
        if ((counted = ema_win_stat_count(win, &st))) {
            st.bytes_wanted = atomic_load(&win->stats.wanted_bytes);
        }
    }
    if (!counted) { /* a grow or shrink keeps changing the part: wait for it */
        ema__win_lock(win);
        ema_win_stat_locked(win, &st);
        ema__win_unlock(win);
    }
    st.migrations = atomic_load(&win->stats.migrations);
    st.field_mask = known;
    /* every field up to reserved[], which a later version fills */
    memcpy(stat_p, &st, offsetof(ema_win_stat_t, reserved));
    return EMA_SUCCESS;
}

