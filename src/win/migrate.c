/*
 * Moving a window's segments: the one primitive behind every migration (a
 * lender's recall, a shrink's or a prefetch's move home), for both memory
 * kinds, and what the owner hears of it.
 *
 *   owner B (under win->lock, never dropped)          every other rank
 *   1. skip segments held with ema_win_acquire (they stay; ema(7) MIGRATION)
 *   2. INVAL (coherence.c) ----------------------------> mark MOVING, drain
 *      <----------------------------------------------- ACK
 *   3. copy: host, CPU copy between this rank's mappings of both places,
 *      then one MAP_FIXED per run; cuda, ema__win_seg_move_batch
 *      (segment_table.c): copies queued on the copy engines, each piece
 *      remapped as its copy completes
 *   4. UPDATE (publish) ---------------------------------> new locations
 *   5. the old memory goes back through the memory provider (the pool:
 *      GIVEBACK to lenders, or freed)
 *
 * The memory comes from, and goes back to, ctx->mem_ops: the lending pool
 * (a layer above) registers it, so win decides nothing about who lends.
 */
#include "win.h"

#include "util/clock.h"
#include "util/log.h"
#include "util/sort.h"

#include <stdlib.h>
#include <string.h>

/* Runs of consecutive indices in @idx (sorted): first[] and count[]. */
static uint32_t ema_win_runs(const uint32_t *idx, uint32_t n, uint32_t *first, uint32_t *count)
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

/* The hand-over of a recall (EMA_WIN_MOVE_HANDOVER_FIRST): once the copied
 * segments' window ranges are unmapped (segment_table.c), their new
 * locations go out to every rank and their old memory back to its lenders,
 * before the new memory is mapped in the window.  Until then the owner keeps
 * each segment MOVING, so its own acquires and operations wait for the map;
 * the other ranks never reach a segment through the owner's window range, so
 * they use the new memory at once. */
typedef struct {
    ema_win_h          win;
    const uint32_t    *idx;
    const ema__loc_t  *old, *loc;
    const uint32_t    *first, *count;
    uint32_t           nruns;
    ema__loc_t        *pub;    /* the publish's buffer (room for the batch) */
    uint32_t           handed; /* out: segments handed over, from the first */
    ema_status_t       told;   /* out: the first error telling the peers */
} ema_win_handover_t;

static void ema_win_handover(void *arg, uint32_t ncopied)
{
    ema_win_handover_t *ho = arg;
    ema_win_h win          = ho->win;
    ema__win_ctx_t *ctx    = win->ctx;
    ema__win_part_t *part  = &win->parts[ctx->rank];
    uint32_t left          = ncopied;

    EMA_WIN_ASSERT_LOCKED(win);
    for (uint32_t i = 0; i < ncopied; i++) {
        atomic_store(&part->loc[ho->idx[i]], ho->loc[i] | EMA_LOC_MOVING);
    }
    ctx->mem_ops->mapped(ctx->mem_arg, ho->loc, ncopied);
    for (uint32_t r = 0; r < ho->nruns && left > 0; r++) {
        uint32_t c = (ho->count[r] < left) ? ho->count[r] : left;
        /* MOVING is the owner's alone; a peer not told keeps the marks of
         * the invalidation, so the give-back below is still safe */
        ema_status_t st = ema__win_publish(win, ho->first[r], c, ho->pub);
        ho->told = (ho->told == EMA_SUCCESS) ? st : ho->told;
        left -= c;
    }
    /* counted before the give-back, as the window's migrations are
     * (segment_table.c, ema_win_hand_over): a lender's reclaim that has
     * returned, and what is ordered after it, finds them in ema_mem_stat
     * and the wanted segments forgotten in ema_win_stat.  Counted after
     * the maps, they trailed the lender by 1-3 ms on host. */
    atomic_fetch_add(&ctx->bytes_migrated, (uint64_t)ncopied * ctx->seg_size);
    if (win->stats.nwanted > 0) {
        ema__win_wanted_bytes(win);
    }
    ctx->mem_ops->release(ctx->mem_arg, ho->old, ncopied); /* GIVEBACK now */
    ho->handed = ncopied;
}

ema_status_t ema__win_restore(ema_win_h win, const uint32_t *first, const uint32_t *count,
                              uint32_t nruns, const ema__loc_t *old, ema__loc_t *buf)
{
    EMA_WIN_ASSERT_LOCKED(win);
    ema__win_part_t *part = &win->parts[win->ctx->rank];
    ema_status_t status   = EMA_SUCCESS;
    uint32_t k = 0;

    for (uint32_t r = 0; r < nruns; r++) {
        for (uint32_t i = first[r]; i < first[r] + count[r]; i++) {
            atomic_store(&part->loc[i], old[k++]);
        }
    }
    for (uint32_t r = 0; r < nruns; r++) {
        ema_status_t st = ema__win_publish(win, first[r], count[r], buf);
        status = (status == EMA_SUCCESS) ? st : status;
    }
    return status;
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
 * EMA_ERR_NO_MEMORY when no memory was found for some of the segments (even
 * if telling a peer failed too: that is logged); else the error of an
 * invalidation, a copy or a map (what it stopped stays where it was); or
 * that of telling a peer where the segments are (EMA_ERR_TRANSPORT, logged:
 * the move is done, and that peer keeps them marked MOVING until a later
 * publish sends it the whole table).
 */
ema_status_t ema__win_move(ema_win_h win, uint32_t *idx, uint32_t n, int exclude,
                          const ema__loc_t *targets, const int64_t *handles, unsigned flags)
{
    EMA_WIN_ASSERT_LOCKED(win);
    ema__win_ctx_t *ctx   = win->ctx;
    ema__win_part_t *part = &win->parts[ctx->rank];
    size_t seg = ctx->seg_size;
    ema_status_t status = EMA_SUCCESS, found = EMA_SUCCESS, told = EMA_SUCCESS;
    ema__loc_t *old = calloc(n ? n : 1, sizeof(*old));
    ema__loc_t *loc = calloc(n ? n : 1, sizeof(*loc));
    int64_t *hdl    = calloc(n ? n : 1, sizeof(*hdl));
    uint32_t *first = calloc(n ? n : 1, sizeof(*first));
    uint32_t *count = calloc(n ? n : 1, sizeof(*count));
    ema__loc_t *pub = calloc(n ? n : 1, sizeof(*pub)); /* every publish's, allocated first */
    uint32_t got, nruns, i, k;

    if (old == NULL || loc == NULL || hdl == NULL || first == NULL || count == NULL ||
        pub == NULL) {
        if (targets != NULL) { /* the caller's memory goes back, as for a move */
            ctx->mem_ops->release(ctx->mem_arg, targets, n);
        }
        status = EMA_ERR_NO_MEMORY;
        goto out;
    }
    qsort(idx, n, sizeof(*idx), ema__cmp_u32);
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
        got = ctx->mem_ops->acquire(ctx->mem_arg, n, exclude, EMA_WIN_FROM_ANY, loc, hdl);
        if (got < n) {
            /* the recall path refuses them to the lender (REFUSE): an
             * answer, not a failure of this rank */
            ema_debug("no memory anywhere to move %u of %u segments of window %u", n - got, n,
                      win->id);
            found = EMA_ERR_NO_MEMORY;
            n = got; /* move what we can */
        }
    }

    double tinv = ema__now_us();
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
                ctx->mem_ops->release(ctx->mem_arg, &loc[i], 1);
            }
        }
        n     = k;
        nruns = ema_win_runs(idx, n, first, count);
        if (n == 0) {
            goto out;
        }
        /* 2. invalidate them everywhere, in one round */
        status = ema__win_invalidate_runs(win, first, count, nruns);
        int held = 0;
        for (i = 0; i < n; i++) {
            held |= atomic_load(&win->held[idx[i]]) > 0;
        }
        if (status == EMA_SUCCESS && !held) {
            break;
        }
        /* Back in service everywhere, where they were: acquired while we
         * marked them (ema_win_acquire marks first, then checks MOVING),
         * and the next pass leaves the held ones out; or the round failed,
         * and some rank may not have stopped using the old memory, so no
         * copy and no give-back (the recall path refuses what did not
         * move).  old[] is in the order of idx[], and so of the runs.  A
         * rank that the restore could not tell keeps them marked: no point
         * in a next pass (logged by the publish). */
        told = ema__win_restore(win, first, count, nruns, old, pub);
        if (status != EMA_SUCCESS) {
            ema_error("window %u: invalidating %u segments failed (%s): they stay where they "
                      "are", win->id, n, ema_strerror(status));
        }
        if (status != EMA_SUCCESS || told != EMA_SUCCESS) {
            ctx->mem_ops->release(ctx->mem_arg, loc, n);
            goto out;
        }
    }

    /* 3. copy, and map the new memory at the same addresses */
    uint32_t ok = 0;
    ema_win_handover_t ho = {win, idx, old, loc, first, count, nruns, pub, 0, EMA_SUCCESS};
    double tm0 = ema__now_us(), tm_copy = 0;
    tinv = tm0 - tinv;
    if (flags & EMA_WIN_MOVE_NO_COPY) {
        /* the targets hold the data already: remap only */
        status = ema__win_seg_remap_batch(win, idx, loc, hdl, n, &ok);
    } else if (ctx->direct) {
        /* One copy per run contiguous in the old and the new memory,
         * between this rank's mappings of both (a large memcpy streams past
         * the caches), then one remap per run (one TLB shootdown each).
         * The remap costs the kernel about 80 us per 2 MiB to tear down the
         * old 4 KiB page-table entries; running it on a second thread during
         * the copy was measured no faster on two cores. */
        for (i = 0; i < n;) {
            uint32_t j = i + 1;
            while (j < n && old[j] == old[j - 1] + 1 && loc[j] == loc[j - 1] + 1) {
                j++;
            }
            ema__win_seg_copy(ctx, loc[i], old[i], j - i);
            i = j;
        }
        tm_copy = ema__now_us();
        status  = ema__win_seg_remap_batch(win, idx, loc, hdl, n, &ok);
    } else {
        status = ema__win_seg_move_batch(win, idx, loc, hdl, n, &ok,
                                         (flags & EMA_WIN_MOVE_HANDOVER_FIRST)
                                             ? ema_win_handover : NULL, &ho);
    }
    double tm1 = ema__now_us(), tm2;
    if (ho.handed > 0) {
        /* 4-5 after a hand-over: published and given back already; the
         * remapped segments leave MOVING (one whose map failed is unmapped,
         * said in an error: its data is in the new memory), the rest stay
         * where they were.  Published again, all of it: a TABLE_REP taken
         * while the owner's table said MOVING may reach a rank after the
         * hand-over's UPDATE, and only a later version clears it there. */
        for (i = 0; i < n; i++) {
            atomic_store(&part->loc[idx[i]], (i < ho.handed) ? loc[i] : old[i]);
        }
        told = ho.told;
        for (uint32_t r = 0; r < nruns; r++) {
            ema_status_t st = ema__win_publish(win, first[r], count[r], pub);
            told = (told == EMA_SUCCESS) ? st : told;
        }
        /* bytes_migrated and the wanted segments: done by the hand-over */
        tm2 = ema__now_us();
        ctx->mem_ops->release(ctx->mem_arg, loc + ho.handed, n - ho.handed);
        ok = ho.handed;
    } else {
        /* 4. the new locations (the old ones where a copy failed: that data
         * is intact, still mapped there), in one round of updates */
        for (i = 0; i < n; i++) {
            atomic_store(&part->loc[idx[i]], (i < ok) ? loc[i] : old[i]);
        }
        ctx->mem_ops->mapped(ctx->mem_arg, loc, ok);
        /* a rank not told keeps the marks of the invalidation: it waits
         * instead of using the old memory, so that still goes back */
        for (uint32_t r = 0; r < nruns; r++) {
            ema_status_t st = ema__win_publish(win, first[r], count[r], pub);
            told = (told == EMA_SUCCESS) ? st : told;
        }
        if (win->stats.nwanted > 0) {
            ema__win_wanted_bytes(win); /* forgets the wanted segments that moved */
        }
        /* 5. give the old memory back, one message per lender (but what
         * the caller keeps: EMA_WIN_MOVE_KEEP_SPILL), counted first */
        atomic_fetch_add(&ctx->bytes_migrated, (uint64_t)ok * seg);
        tm2 = ema__now_us();
        if (flags & EMA_WIN_MOVE_KEEP_SPILL) {
            for (i = 0, k = 0; i < ok; i++) {
                if (EMA_LOC_RANK(old[i]) != ctx->rank || EMA_LOC_TIER(old[i]) != EMA_TIER_SPILL) {
                    old[k++] = old[i];
                }
            }
            ctx->mem_ops->release(ctx->mem_arg, old, k);
        } else {
            ctx->mem_ops->release(ctx->mem_arg, old, ok);
        }
        ctx->mem_ops->release(ctx->mem_arg, loc + ok, n - ok);
    }
    ema_debug("moved %u segments of window %u: invalidate %.0f us, copy %.0f us, remap %.0f us, "
              "update %.0f us, give back %.0f us", ok, win->id, tinv,
              tm_copy ? tm_copy - tm0 : tm1 - tm0,
              tm_copy ? tm1 - tm_copy : 0, tm2 - tm1, ema__now_us() - tm2);
out:
    free(old);
    free(loc);
    free(hdl);
    free(first);
    free(count);
    free(pub);
    if (status == EMA_SUCCESS) {
        /* out of memory first: ema__win_recall refuses on it what it found
         * unheld, and would park those segments on a telling error */
        status = (found != EMA_SUCCESS) ? found : told;
    }
    return status;
}

/* @n borrowed segments of @win's own part, @segs of rank @src, were refused
 * to their lender: tell the owner (ema_win_stat's bytes_wanted) until they
 * leave the part.  Called with win->lock held. */
static void ema_win_note_wanted(ema_win_h win, int src, const uint32_t *segs, uint32_t n)
    EMA_REQUIRES(win->lock)
{
    EMA_WIN_ASSERT_LOCKED(win);
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
                break;
            }
            st->wanted     = w;
            st->wanted_cap = cap;
        }
        st->wanted[st->nwanted++] = l;
    }
    ema__win_wanted_bytes(win); /* st->wanted_bytes */
    ema_debug("window %u: %u borrowed segments of rank %d wanted back, nowhere to move them",
              win->id, n, src);
}

size_t ema__win_wanted_bytes(ema_win_h win)
{
    EMA_WIN_ASSERT_LOCKED(win);
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
    atomic_store(&ws->wanted_bytes, bytes);
    return bytes;
}

/*
 * Tell the owner which ranges of @win's part are about to move: its reclaim
 * callback, once per run of consecutive segments in @idx (any order).  Never
 * under the window's lock, so the callback may call any ema_win_* on the
 * window (ema_win_release to let a held range go, ema_win_stat).
 */
void ema__win_notify(ema_win_h win, ema_reclaim_cb cb, void *cb_arg, const uint32_t *idx,
                     uint32_t n)
{
    EMA_WIN_ASSERT_NONE_LOCKED(); /* the callback may call any ema_win_* */
    size_t seg     = win->ctx->seg_size;
    size_t size    = atomic_load(&win->parts[win->ctx->rank].size);
    uint32_t *runs = (cb != NULL && n > 0) ? malloc(n * sizeof(*runs)) : NULL;

    if (runs == NULL) {
        if (cb != NULL && n > 0) {
            ema_error("out of memory telling window %u's owner of %u moving segments", win->id,
                      n);
        }
        return;
    }
    memcpy(runs, idx, n * sizeof(*runs));
    qsort(runs, n, sizeof(*runs), ema__cmp_u32);
    for (uint32_t i = 0; i < n;) {
        uint32_t j = i + 1;
        while (j < n && runs[j] == runs[j - 1] + 1) {
            j++;
        }
        /* ranges of the part: the last segment counts up to its size */
        size_t off = (size_t)runs[i] * seg, len = (size_t)(j - i) * seg;
        if (off < size) {
            len = (len < size - off) ? len : size - off;
            atomic_fetch_add(&win->ctx->callbacks, 1); /* acquires do not wait meanwhile */
            cb(win, off, len, cb_arg);
            atomic_fetch_sub(&win->ctx->callbacks, 1);
        }
        i = j;
    }
    free(runs);
}

/* Indices of the segments of @win's own part that live in @src's memory
 * and are among @segs[0..n) not yet @found.  With @to_move, the ones to
 * move, marked found (1); else the ones the owner has not heard of
 * (@told[k] 0), marked told.  Called with win->lock held. */
static uint32_t ema_win_recall_collect(ema_win_h win, int src, const uint32_t *segs,
                                       uint32_t n, uint8_t *found, uint8_t *told,
                                       int to_move, uint32_t *idx)
    EMA_REQUIRES(win->lock)
{
    EMA_WIN_ASSERT_LOCKED(win);
    ema__win_part_t *part = &win->parts[win->ctx->rank];
    uint32_t ns = atomic_load(&part->nsegs), m = 0;

    for (uint32_t i = 0; i < ns; i++) {
        ema__loc_t l = atomic_load(&part->loc[i]) & ~EMA_LOC_MOVING;
        if (EMA_LOC_RANK(l) != src || EMA_LOC_TIER(l) != EMA_TIER_DEVICE) {
            continue;
        }
        for (uint32_t k = 0; k < n; k++) {
            if (!found[k] && segs[k] == EMA_LOC_SEG(l)) {
                if (to_move) {
                    found[k] = 1;
                    idx[m++] = i;
                } else if (!told[k]) {
                    told[k]  = 1;
                    idx[m++] = i;
                }
                break;
            }
        }
    }
    return m;
}


/*
 * A lender (@src) wants segments @segs[0..n) back: in every window, tell the
 * owner (its reclaim callback) of those it has not heard of, then move the
 * recalled segments of its part elsewhere (never to @src).  @told[k]
 * (in/out): the owner's callback heard of segs[k], by this recall, before;
 * a segment moves only once told, or where the window has no callback when
 * it moves (so a segment that a recall found granted and not yet mapped,
 * and looks at again once mapped, is told of then).  @found[k] (in/out): 0
 * not seen, 1 found in a window here, left as is if nonzero on entry.
 * Out: @held[k] set for a segment that stays because it is held; @refuse
 * gets the segments that had nowhere to go (*@nrefuse_p of them), which the
 * window also counts as wanted (bytes_wanted).
 */
void ema__win_recall(ema__win_ctx_t *ctx, int src, const uint32_t *segs, uint32_t n,
                     uint8_t *told, uint8_t *found, uint8_t *held, uint32_t *refuse,
                     uint32_t *nrefuse_p)
{
    uint32_t *idx  = calloc(n ? n : 1, sizeof(*idx));
    uint32_t *idx2 = calloc(n ? n : 1, sizeof(*idx2));
    uint8_t *unheld = calloc(n ? n : 1, 1);
    uint32_t nrefuse = 0;

    EMA_WIN_ASSERT_NONE_LOCKED(); /* takes each window's lock; the callback */
    if (idx == NULL || idx2 == NULL || unheld == NULL) {
        ema_error("out of memory handling a recall from rank %d", src);
        goto out;
    }
    for (ema_win_h win = ema__win_list_next(ctx, NULL); win != NULL;
         win = ema__win_list_next(ctx, win)) {
        uint32_t m = 0;
        ema__win_lock(win);
        /* The owner hears first, and may release what it held.  Looked at
         * again after each callback, since the window may have changed
         * while it ran without the lock (a segment granted to a grow,
         * mapped meanwhile): the move below, under this same hold of the
         * lock, finds only segments the owner heard of (or, with no
         * callback, had nothing to hear with).  Each pass tells of one
         * segment more at least, so the loop ends. */
        while (win->magic == EMA_WIN_MAGIC && win->reclaim_cb != NULL) {
            ema_reclaim_cb cb = win->reclaim_cb;
            void *cb_arg      = win->reclaim_arg;
            m = ema_win_recall_collect(win, src, segs, n, found, told, 0, idx);
            if (m == 0) {
                break;
            }
            ema__win_unlock(win);
            ema__win_notify(win, cb, cb_arg, idx, m);
            ema__win_lock(win);
        }
        if (win->magic == EMA_WIN_MAGIC) {
            ema__win_part_t *part = &win->parts[ctx->rank];
            m = ema_win_recall_collect(win, src, segs, n, found, told, 1, idx);
            if (m > 0) {
                /* the move gives the old segments back */
                memcpy(idx2, idx, m * sizeof(*idx));
                for (uint32_t i = 0; i < m; i++) {
                    unheld[i] = atomic_load(&win->held[idx2[i]]) == 0;
                }
                ema_status_t st = ema__win_move(win, idx, m, src, NULL, NULL,
                                                EMA_WIN_MOVE_HANDOVER_FIRST);
                /* What did not move: held ones wait for their release;
                 * the others had nowhere to go and are refused, so the
                 * lender stops waiting for them.  "Held" is as the move
                 * found it, not as now: an owner that acquires its part
                 * every step holds it again a few microseconds after each
                 * release, while the move asked every peer for memory in
                 * vain, and a segment judged by its state now would park,
                 * run at the next release, fail the same way, and keep the
                 * lender waiting for its whole EMA_RECLAIM_TIMEOUT (seen on
                 * the H200 in kv_serving: recalls of 2 s, over and over).
                 * Refusing one that the move found memory for but that was
                 * acquired while it ran costs little: the lender stops
                 * waiting, the owner sees it as wanted. */
                uint32_t nref0 = nrefuse;
                for (uint32_t i = 0; i < m; i++) {
                    ema__loc_t l = atomic_load(&part->loc[idx2[i]]) & ~EMA_LOC_MOVING;
                    if (idx2[i] >= atomic_load(&part->nsegs) || EMA_LOC_RANK(l) != src ||
                        EMA_LOC_TIER(l) != EMA_TIER_DEVICE) {
                        continue;
                    }
                    /* refused: no memory for it, or the move failed for
                     * another reason (a failed invalidation, unmap or copy)
                     * while nobody holds it, so no release would ever
                     * wake a parked recall for it */
                    if (unheld[i] && st != EMA_SUCCESS &&
                        (st == EMA_ERR_NO_MEMORY || atomic_load(&win->held[idx2[i]]) == 0)) {
                        refuse[nrefuse++] = EMA_LOC_SEG(l);
                        continue;
                    }
                    /* held before the move, or (the move did not run
                     * out of memory) acquired and released during it:
                     * look again after a release */
                    for (uint32_t k = 0; k < n; k++) {
                        if (segs[k] == EMA_LOC_SEG(l) && found[k] == 1) {
                            held[k] = 1;
                            break;
                        }
                    }
                }
                if (nrefuse > nref0) {
                    ema_win_note_wanted(win, src, refuse + nref0, nrefuse - nref0);
                }
            }
        }
        ema__win_unlock(win);
    }
out:
    *nrefuse_p = nrefuse;
    free(idx);
    free(idx2);
    free(unheld);
    atomic_fetch_add(&ctx->recall_passes, 1); /* acquires waiting for it go on */
}
