/*
 * The owner's side of a part's segment table: mapping segments into the
 * part's reserved range, and moving one segment's data to new memory while
 * the base pointer stays where it is.
 */
#include "win.h"

#include "util/clock.h"
#include "util/log.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* The arena whose ops map a location, and the export that describes it. */
static ema__mem_arena_t *win_loc_arena(ema__win_ctx_t *ctx, ema__loc_t loc,
                                       const ema__mem_export_t **exp_p)
{
    int tier = EMA_LOC_TIER(loc);
    *exp_p = &ctx->exports[tier][EMA_LOC_RANK(loc)];
    /* A peer's segment is mapped with the ops of our own arena of that tier:
     * every rank uses the same memory kind per tier. */
    return ctx->tier[tier] ? ctx->tier[tier] : ctx->tier[EMA_TIER_DEVICE];
}

ema_status_t ema__win_seg_map(ema_win_h win, uint32_t idx, ema__loc_t loc, int64_t handle)
{
    EMA_WIN_ASSERT_LOCKED(win);
    const ema__mem_export_t *exp;
    ema__mem_arena_t *arena = win_loc_arena(win->ctx, loc, &exp);
    return arena->ops->map(arena, exp, EMA_LOC_SEG(loc), handle,
                           (char *)win->base + (size_t)idx * win->ctx->seg_size);
}

void ema__win_seg_copy(ema__win_ctx_t *ctx, ema__loc_t dst, ema__loc_t src, uint32_t count)
{
    size_t seg = ctx->seg_size;
    char *d = ctx->peer_base[EMA_LOC_TIER(dst)][EMA_LOC_RANK(dst)] + (size_t)EMA_LOC_SEG(dst) * seg;
    char *s = ctx->peer_base[EMA_LOC_TIER(src)][EMA_LOC_RANK(src)] + (size_t)EMA_LOC_SEG(src) * seg;
    ctx->tier[EMA_TIER_DEVICE]->ops->copy(ctx->tier[EMA_TIER_DEVICE], d, s, (size_t)count * seg);
}

ema_status_t ema__win_seg_map_many(ema_win_h win, uint32_t idx, ema__loc_t loc, uint32_t count,
                                   int64_t handle)
{
    EMA_WIN_ASSERT_LOCKED(win);
    const ema__mem_export_t *exp;
    ema__mem_arena_t *arena = win_loc_arena(win->ctx, loc, &exp);
    void *at = (char *)win->base + (size_t)idx * win->ctx->seg_size;
    if (arena->ops->map_many == NULL) {
        for (uint32_t i = 0; i < count; i++) {
            ema_status_t st = ema__win_seg_map(win, idx + i, loc + i, handle);
            if (st != EMA_SUCCESS) {
                return st;
            }
        }
        return EMA_SUCCESS;
    }
    return arena->ops->map_many(arena, exp, EMA_LOC_SEG(loc), count, handle, at);
}

ema_status_t ema__win_seg_unmap(ema_win_h win, uint32_t first, uint32_t count)
{
    EMA_WIN_ASSERT_LOCKED(win);
    ema__mem_arena_t *arena = win->ctx->tier[EMA_TIER_DEVICE];
    if (count == 0) {
        return EMA_SUCCESS;
    }
    return arena->ops->unmap(arena, (char *)win->base + (size_t)first * win->ctx->seg_size,
                             (size_t)count * win->ctx->seg_size);
}


/*
 * Move a batch of segments of the own part to new memory where the window's
 * memory is not mapped everywhere (cuda): the data goes device to device on
 * the copy engines, and each window range is unmapped and its new memory
 * mapped at the same address.
 *   1. per run (consecutive window segments whose new memory is consecutive
 *      segments of one rank), where the new memory can be written: our own
 *      arena's mapping, a peer's mirror (ema__win_cpath_seg: mapped once,
 *      kept), both mapped ahead of any migration; else a scratch range
 *      where the peer's segments are mapped for this batch;
 *   2. where the old memory can be read: with EMA_MIGRATE_ALIAS (default)
 *      and every segment's old memory mapped outside the window (our own
 *      arenas, peers' mirrors), there (aliased); else through the window;
 *   3. aliased: every copy queued, then
 *      - without @handover, the window's ranges remapped (one unmap and one
 *        map_many per run) while they run, and one wait for the copies: the
 *        migration costs the copy or the remaps, whichever is longer, not
 *        their sum;
 *      - with @handover (a lender waits for its memory), the ranges are
 *        unmapped while the copies run (an access through the window then
 *        faults rather than reach memory given back), every copy is waited
 *        for, @handover(@ho_arg, n) publishes the new locations and gives
 *        the old memory back, and only then is the new memory mapped, so
 *        the lender waits for the copies and a message;
 *   3'. through the window: copies queued in pieces of EMA_WIN_MOVE_PIECE,
 *      each followed by a mark (copy_mark); with @handover, all waited for,
 *      the ranges unmapped, the hand-over, then the maps; else each piece
 *      remapped once its mark is passed, together with every later piece
 *      of the run whose mark has passed too (copy_mark_done), while the
 *      later copies run.
 * @ok_p counts the segments remapped, from the first (runs are done in
 * order); without a hand-over the rest still map the old memory, with their
 * data.  A remap that fails leaves its range unmapped (said in an error).
 * A copy that fails to queue moves nothing; one that fails on the device
 * is a sticky error of the CUDA context, after which none of its memory is
 * usable, so aliased remaps do not wait for the copies' outcome.
 */
/* Bytes per copy of a migration through the window, each followed by a
 * mark (about 30 us of copy on an H200): small enough that remapping
 * overlaps most of the copying, large enough that queueing a copy and a
 * mark costs little. */
#define EMA_WIN_MOVE_PIECE ((size_t)64 << 20)

typedef struct {
    uint32_t first; /* index into the batch */
    uint32_t count;
    void    *dst;
    void    *scratch;
} ema_win_move_run_t;

/* Split a batch into runs: consecutive window segments whose new memory is
 * consecutive segments of one rank, mappable with one map_many (our own
 * segments whatever their handles, a peer's while they share one). */
static uint32_t ema_win_move_runs(const ema__win_ctx_t *ctx, const uint32_t *idx,
                                  const ema__loc_t *loc, const int64_t *hdl, uint32_t n,
                                  ema_win_move_run_t *runs)
{
    uint32_t nruns = 0;
    for (uint32_t i = 0; i < n;) {
        uint32_t j = i + 1;
        while (j < n && idx[j] == idx[j - 1] + 1 && loc[j] == loc[j - 1] + 1 &&
               (hdl[j] == hdl[i] || EMA_LOC_RANK(loc[i]) == ctx->rank)) {
            j++;
        }
        runs[nruns].first = i;
        runs[nruns].count = j - i;
        nruns++;
        i = j;
    }
    return nruns;
}

/* Where memory @l can be read or written other than through a window:
 * this rank's own tiers are mapped whole at their base; a peer's GPU
 * memory in its mirror (cuda).  NULL: nowhere else. */
static char *ema_win_loc_alias(ema__win_ctx_t *ctx, ema__loc_t l)
{
    int r = EMA_LOC_RANK(l), t = EMA_LOC_TIER(l);
    if (r == ctx->rank) {
        ema__mem_arena_t *a = ctx->tier[t];
        return (a != NULL && a->base != NULL)
                   ? (char *)a->base + (size_t)EMA_LOC_SEG(l) * ctx->seg_size
                   : NULL;
    }
    return (t == EMA_TIER_DEVICE) ? ema__win_cpath_seg(ctx, r, EMA_LOC_SEG(l)) : NULL;
}

/* Unmap the window's segments idx[f..f+c) and map their new memory there. */
static ema_status_t ema_win_remap_range(ema_win_h win, const uint32_t *idx,
                                        const ema__loc_t *loc, const int64_t *hdl, uint32_t f,
                                        uint32_t c, double *t_unmap, double *t_map)
    EMA_REQUIRES(win->lock)
{
    ema__mem_arena_t *dev = win->ctx->tier[EMA_TIER_DEVICE];
    ema_status_t status   = EMA_SUCCESS;
    double tu = ema__now_us(), tm;

    /* cuda cannot map over a mapping; on host MAP_FIXED replaces it in one
     * step, with no moment where the range is unmapped */
    if (dev->ops->kind != EMA_MEMORY_KIND_HOST) {
        status = ema__win_seg_unmap(win, idx[f], c);
    }
    tm = ema__now_us();
    *t_unmap += tm - tu;
    if (status == EMA_SUCCESS) {
        status = ema__win_seg_map_many(win, idx[f], loc[f], c, hdl[f]);
        *t_map += ema__now_us() - tm;
        if (status != EMA_SUCCESS) {
            ema_error("window %u: segments %u..%u are unmapped: mapping their new memory "
                      "failed after the copy", win->id, idx[f], idx[f] + c - 1);
        }
    }
    return status;
}

/* Remap runs[0..nr) (unmap, then map the new memory), in order, until one
 * fails; *@ok_p counts the segments remapped. */
static ema_status_t ema_win_remap_runs(ema_win_h win, const ema_win_move_run_t *runs,
                                       uint32_t nr, const uint32_t *idx, const ema__loc_t *loc,
                                       const int64_t *hdl, uint32_t *ok_p, uint32_t *nbatch,
                                       double *t_unmap, double *t_map) EMA_REQUIRES(win->lock)
{
    ema_status_t status = EMA_SUCCESS;
    for (uint32_t r = 0; r < nr && status == EMA_SUCCESS; r++) {
        status = ema_win_remap_range(win, idx, loc, hdl, runs[r].first, runs[r].count, t_unmap,
                                     t_map);
        (*nbatch)++;
        if (status == EMA_SUCCESS) {
            *ok_p += runs[r].count;
            win->stats.migrations += runs[r].count;
        }
    }
    return status;
}

/*
 * The hand-over's two halves.  First each run's window range is unmapped
 * (on host, put back to PROT_NONE), so that no access through the window
 * can reach the old memory once it is given back: an aliased batch does it
 * while its copies run (they do not read the window), a batch through the
 * window after them.  Returns how many runs, from the first, are unmapped:
 * a run whose unmap fails, and those after it, are not handed over and keep
 * their old memory and data.
 */
static uint32_t ema_win_unmap_runs(ema_win_h win, const ema_win_move_run_t *runs,
                                   uint32_t ready, const uint32_t *idx, double *t_unmap)
    EMA_REQUIRES(win->lock)
{
    ema__mem_arena_t *dev = win->ctx->tier[EMA_TIER_DEVICE];
    size_t seg = win->ctx->seg_size;
    double t   = ema__now_us();
    uint32_t u;

    for (u = 0; u < ready; u++) {
        if (dev->ops->unmap(dev, (char *)win->base + (size_t)idx[runs[u].first] * seg,
                            (size_t)runs[u].count * seg) != EMA_SUCCESS) {
            ema_error("window %u: segments %u..%u keep their old memory: unmapping it "
                      "failed", win->id, idx[runs[u].first],
                      idx[runs[u].first] + runs[u].count - 1);
            break;
        }
    }
    *t_unmap += ema__now_us() - t;
    return u;
}

/* Second half, once every copy is complete: @handover publishes and gives
 * back the @u runs unmapped, then their new memory is mapped.  A map that
 * fails leaves its range unmapped (said in an error); the others are still
 * mapped. */
static ema_status_t ema_win_hand_over(ema_win_h win, const ema_win_move_run_t *runs,
                                      uint32_t u, const uint32_t *idx, const ema__loc_t *loc,
                                      const int64_t *hdl, ema__win_handover_fn handover,
                                      void *ho_arg, uint32_t *ok_p, uint32_t *nbatch,
                                      double *t_map) EMA_REQUIRES(win->lock)
{
    ema_status_t status = EMA_SUCCESS;
    double t;

    if (u == 0) {
        return EMA_ERR_IO; /* said by ema_win_unmap_runs */
    }
    /* The segments have moved once their data is copied: counted just
     * before the hand-over publishes their new locations and gives the
     * old memory back, so that a lender's reclaim that has
     * returned, and anything ordered after it (a barrier), finds them in
     * ema_win_stat, which reads a busy window without its lock.  Counted
     * after the maps, they trailed the lender by the maps' time (about
     * 0.3 ms per run on an H200; test_elastic saw 1 of 4). */
    for (uint32_t r = 0; r < u; r++) {
        win->stats.migrations += runs[r].count;
    }
    handover(ho_arg, runs[u - 1].first + runs[u - 1].count);
    t = ema__now_us();
    for (uint32_t r = 0; r < u; r++) {
        uint32_t f = runs[r].first, c = runs[r].count;
        ema_status_t st = ema__win_seg_map_many(win, idx[f], loc[f], c, hdl[f]);
        (*nbatch)++;
        if (st == EMA_SUCCESS) {
            *ok_p += c;
        } else {
            ema_error("window %u: segments %u..%u are unmapped: mapping their new memory "
                      "failed after the copy", win->id, idx[f], idx[f] + c - 1);
            status = (status == EMA_SUCCESS) ? st : status;
        }
    }
    *t_map += ema__now_us() - t;
    return status;
}

/* The destination of run @run (new memory @l and after): own or mirrored
 * memory where every segment of it is there, else a scratch range mapped
 * now (run->scratch). */
static ema_status_t ema_win_move_dst(ema_win_h win, ema_win_move_run_t *run, ema__loc_t l,
                                     const int64_t *hdl)
{
    ema__win_ctx_t *ctx   = win->ctx;
    ema__mem_arena_t *dev = ctx->tier[EMA_TIER_DEVICE];
    size_t seg = ctx->seg_size, len = (size_t)run->count * seg;
    ema_status_t status = EMA_SUCCESS;
    uint32_t i;

    char *p = ema_win_loc_alias(ctx, l);
    for (i = 1; p != NULL && EMA_LOC_RANK(l) != ctx->rank && i < run->count; i++) {
        if (ema_win_loc_alias(ctx, l + i) != p + (size_t)i * seg) {
            p = NULL;
        }
    }
    if (p != NULL) {
        run->dst = p;
        return EMA_SUCCESS;
    }
    status = dev->ops->reserve(dev, len, &run->scratch);
    if (status != EMA_SUCCESS) {
        run->scratch = NULL;
        return status;
    }
    for (i = 0; i < run->count && status == EMA_SUCCESS; i++) {
        const ema__mem_export_t *exp = &ctx->exports[EMA_LOC_TIER(l)][EMA_LOC_RANK(l)];
        status = dev->ops->map(dev, exp, EMA_LOC_SEG(l) + i, hdl[run->first + i],
                               (char *)run->scratch + (size_t)i * seg);
        if (status != EMA_SUCCESS && i > 0) {
            dev->ops->unmap(dev, run->scratch, (size_t)i * seg);
        }
    }
    if (status != EMA_SUCCESS) {
        dev->ops->unreserve(dev, run->scratch, len);
        run->scratch = NULL;
        return status;
    }
    run->dst = run->scratch;
    return EMA_SUCCESS;
}

ema_status_t ema__win_seg_move_batch(ema_win_h win, const uint32_t *idx, const ema__loc_t *loc,
                                     const int64_t *hdl, uint32_t n, uint32_t *ok_p,
                                     ema__win_handover_fn handover, void *ho_arg)
{
    EMA_WIN_ASSERT_LOCKED(win);
    ema__win_ctx_t *ctx   = win->ctx;
    ema__win_part_t *part = &win->parts[ctx->rank];
    ema__mem_arena_t *dev = ctx->tier[EMA_TIER_DEVICE];
    size_t seg = ctx->seg_size;
    ema_win_move_run_t *runs = calloc(n ? n : 1, sizeof(*runs));
    char **src = calloc(n ? n : 1, sizeof(*src));       /* aliased: old memory */
    uint32_t *prun = calloc(n ? n : 1, sizeof(*prun)); /* per piece: its run, */
    uint32_t *poff = calloc(n ? n : 1, sizeof(*poff)); /* first segment in it, */
    uint32_t *pcnt = calloc(n ? n : 1, sizeof(*pcnt)); /* and segments */
    void **marks = NULL;
    ema_status_t status = EMA_SUCCESS, setup;
    uint32_t nruns = 0, r, i, k, ready, copied = 0, npieces = 0, nbatch = 0, ncopies = 0;
    int aliased = 0, marked = 0, handed = 0;
    double t0 = ema__now_us(), t1 = t0, t2 = t0, t3 = 0, t_wait = 0, t_unmap = 0, t_map = 0;

    *ok_p = 0;
    if (runs == NULL || src == NULL || prun == NULL || poff == NULL || pcnt == NULL) {
        status = EMA_ERR_NO_MEMORY;
        setup  = status;
        ready  = 0;
        goto out;
    }
    nruns = ema_win_move_runs(ctx, idx, loc, hdl, n, runs);

    /* 1. where each run's new memory can be written; runs [0, ready) have
     * a destination: those move, and setup says why the rest could not */
    for (r = 0; r < nruns && status == EMA_SUCCESS; r++) {
        status = ema_win_move_dst(win, &runs[r], loc[runs[r].first], hdl);
    }
    ready  = (status == EMA_SUCCESS) ? nruns : r - 1;
    setup  = status;
    status = EMA_SUCCESS;
    copied = (ready > 0) ? runs[ready - 1].first + runs[ready - 1].count : 0;

    /* 2. where the old memory can be read */
    aliased = ctx->migrate_alias && copied > 0 && dev->ops->copy_start != NULL;
    for (i = 0; aliased && i < copied; i++) {
        src[i]  = ema_win_loc_alias(ctx, atomic_load(&part->loc[idx[i]]) & ~EMA_LOC_MOVING);
        aliased = (src[i] != NULL);
    }

    t1 = ema__now_us();
    if (aliased) {
        /* 3. every copy queued, from the old memory's own mapping (one per
         * stretch contiguous on both sides) */
        for (r = 0; r < ready && status == EMA_SUCCESS; r++) {
            for (uint32_t o = 0; o < runs[r].count && status == EMA_SUCCESS;) {
                uint32_t b = runs[r].first + o, c = 1;
                while (o + c < runs[r].count && src[b + c] == src[b] + (size_t)c * seg) {
                    c++;
                }
                status = dev->ops->copy_start(dev, (char *)runs[r].dst + (size_t)o * seg,
                                              src[b], (size_t)c * seg);
                ncopies++;
                o += c;
            }
        }
        t2 = ema__now_us();
        if (handover != NULL) {
            /* the window's ranges go while the copies run; then the
             * hand-over, then the new memory is mapped */
            uint32_t u = (status == EMA_SUCCESS) ? ema_win_unmap_runs(win, runs, ready, idx,
                                                                     &t_unmap)
                                                 : 0;
            if (dev->ops->copy_wait != NULL) {
                ema_status_t st = dev->ops->copy_wait(dev);
                status = (status == EMA_SUCCESS) ? st : status;
                t_wait = ema__now_us();
            }
            if (status == EMA_SUCCESS) {
                status = ema_win_hand_over(win, runs, u, idx, loc, hdl, handover, ho_arg,
                                           ok_p, &nbatch, &t_map);
                handed = (u > 0);
                t3     = ema__now_us();
            } else if (u > 0) {
                /* a copy failed on the device: a sticky error of the CUDA
                 * context, after which none of its memory is usable */
                ema_error("window %u: a migration's copy failed after %u runs were "
                          "unmapped: their data is lost", win->id, u);
            }
            goto out;
        }
        /* the remaps, while the copies run */
        if (status == EMA_SUCCESS) {
            status = ema_win_remap_runs(win, runs, ready, idx, loc, hdl, ok_p, &nbatch, &t_unmap,
                                        &t_map);
        }
        /* before any scratch range or new memory can be released */
        if (dev->ops->copy_wait != NULL) {
            ema_status_t st = dev->ops->copy_wait(dev);
            status = (status == EMA_SUCCESS) ? st : status;
        }
        goto out;
    }

    /* 3'. the copies through the window, all in flight: one per piece of a
     * run, each followed by a mark where the kind has them, so that the
     * remap of a piece overlaps the copies after it; else one wait for all */
    uint32_t piece = (uint32_t)(EMA_WIN_MOVE_PIECE / seg);
    marked = (dev->ops->copy_start != NULL && dev->ops->copy_mark != NULL);
    marks  = marked ? calloc(n ? n : 1, sizeof(*marks)) : NULL;
    if (piece == 0) {
        piece = 1;
    }
    if (marks == NULL) {
        marked = 0;
    }
    for (r = 0, k = 0; r < ready && status == EMA_SUCCESS; r++) {
        for (uint32_t o = 0; o < runs[r].count && status == EMA_SUCCESS; o += piece) {
            uint32_t c      = (runs[r].count - o < piece) ? runs[r].count - o : piece;
            const void *s   = (char *)win->base + (size_t)(idx[runs[r].first] + o) * seg;
            void *dst       = (char *)runs[r].dst + (size_t)o * seg;
            status = (dev->ops->copy_start != NULL)
                         ? dev->ops->copy_start(dev, dst, s, (size_t)c * seg)
                         : dev->ops->copy(dev, dst, s, (size_t)c * seg);
            if (status == EMA_SUCCESS && marked) {
                status = dev->ops->copy_mark(dev, &marks[k]);
            }
            prun[k] = r;
            poff[k] = o;
            pcnt[k] = c;
            k++;
        }
    }
    npieces = k;
    /* Unmarked copies, any copy left without a mark (a failed copy_mark
     * after its copy_start), and before a hand-over every copy: waited for
     * here, before any scratch range or new memory can be released.  A copy
     * that could not be queued moves nothing: the data stays in the old
     * memory, still mapped (the marks are waited for and freed below). */
    if ((!marked || status != EMA_SUCCESS || handover != NULL) && dev->ops->copy_wait != NULL) {
        ema_status_t st = dev->ops->copy_wait(dev);
        status = (status == EMA_SUCCESS) ? st : status;
    }
    t2 = ema__now_us();
    if (handover != NULL) {
        /* every copy is complete (copy_wait): hand over, then remap */
        for (k = 0; k < npieces; k++) {
            if (marks != NULL && marks[k] != NULL) {
                ema_status_t st = dev->ops->copy_wait_mark(dev, marks[k]);
                status   = (status == EMA_SUCCESS) ? st : status;
                marks[k] = NULL;
            }
        }
        if (status == EMA_SUCCESS && copied > 0) {
            uint32_t u = ema_win_unmap_runs(win, runs, ready, idx, &t_unmap);
            status = ema_win_hand_over(win, runs, u, idx, loc, hdl, handover, ho_arg, ok_p,
                                       &nbatch, &t_map);
            handed = (u > 0);
            t3     = ema__now_us();
        }
    } else {
        /* remap piece by piece as the copies complete, joining the later
         * pieces of the run whose copies are complete too */
        for (k = 0; k < npieces;) {
            uint32_t e = k + 1, c = pcnt[k];
            if (marked && marks[k] != NULL) {
                ema_status_t st = dev->ops->copy_wait_mark(dev, marks[k]);
                status   = (status == EMA_SUCCESS) ? st : status;
                marks[k] = NULL;
            }
            while (status == EMA_SUCCESS && e < npieces && prun[e] == prun[k] && marked &&
                   marks[e] != NULL && dev->ops->copy_mark_done != NULL &&
                   dev->ops->copy_mark_done(dev, marks[e])) {
                status   = dev->ops->copy_wait_mark(dev, marks[e]); /* passed: frees it */
                marks[e] = NULL;
                c += pcnt[e++];
            }
            if (status == EMA_SUCCESS) {
                uint32_t f = runs[prun[k]].first + poff[k];
                status = ema_win_remap_range(win, idx, loc, hdl, f, c, &t_unmap, &t_map);
                nbatch++;
                if (status == EMA_SUCCESS) {
                    *ok_p += c;
                    win->stats.migrations += c;
                }
            }
            k = e;
        }
    }
    /* the marks not waited for (an error stopped the remaps) */
    for (k = 0; marks != NULL && k < npieces; k++) {
        if (marks[k] != NULL) {
            ema_status_t st = dev->ops->copy_wait_mark(dev, marks[k]);
            status = (status == EMA_SUCCESS) ? st : status;
        }
    }

out:
    /* the scratch ranges: after every copy that writes them */
    for (r = 0; runs != NULL && r < ready; r++) {
        if (runs[r].scratch != NULL) {
            dev->ops->unmap(dev, runs[r].scratch, (size_t)runs[r].count * seg);
            dev->ops->unreserve(dev, runs[r].scratch, (size_t)runs[r].count * seg);
        }
    }
    if (runs != NULL) {
        ema_debug("window %u: moved %u of %u segments in %u runs (%s): setup %.0f us, %u "
                  "copies queued %.0f us, copies waited for %.0f us, %s %.0f us, %u remaps: "
                  "unmap %.0f us, map %.0f us", win->id, *ok_p, n, nruns,
                  aliased ? "aliased" : "through the window", t1 - t0,
                  aliased ? ncopies : npieces, t2 - t1,
                  t_wait > 0 ? t_wait - t2 : 0, handed ? "handed over, done after" : "done after",
                  (handed ? t3 : ema__now_us()) - t0, nbatch, t_unmap, t_map);
    }
    free(marks);
    free(runs);
    free(src);
    free(prun);
    free(poff);
    free(pcnt);
    return (status == EMA_SUCCESS) ? setup : status;
}

ema_status_t ema__win_seg_remap_batch(ema_win_h win, const uint32_t *idx, const ema__loc_t *loc,
                                      const int64_t *hdl, uint32_t n, uint32_t *ok_p)
{
    EMA_WIN_ASSERT_LOCKED(win);
    ema_win_move_run_t *runs = calloc(n ? n : 1, sizeof(*runs));
    uint32_t nbatch = 0;
    double t_unmap = 0, t_map = 0;

    *ok_p = 0;
    if (runs == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    uint32_t nruns = ema_win_move_runs(win->ctx, idx, loc, hdl, n, runs);
    ema_status_t status = ema_win_remap_runs(win, runs, nruns, idx, loc, hdl, ok_p, &nbatch,
                                             &t_unmap, &t_map);
    free(runs);
    return status;
}

/* No issue of the old epoch is in flight any more. */
static int ema_win_drained(void *arg)
{
    return atomic_load((atomic_int *)arg) == 0;
}

ema_status_t ema__win_inval_local(ema__win_ctx_t *ctx, ema_win_h win, int part, uint32_t first,
                                  uint32_t count)
{
    if (part == ctx->rank) {
        EMA_WIN_ASSERT_LOCKED(win); /* only the owner's move marks its own part */
    }
    ema__win_part_t *p = &win->parts[part];

    /* [first, first + count) as 64-bit bounds: the sum may wrap in 32 */
    for (uint64_t i = first; i < (uint64_t)first + count && i < p->max_segs; i++) {
        atomic_fetch_or(&p->loc[i], EMA_LOC_MOVING);
    }
    /* An issue that read the location before the mark is counted in
     * inflight until the operation has been handed to UCX (or, for an
     * atomic on cuda, performed by the holder); after that the flush
     * completes it.  Issues count in the epoch they started in: flipping it
     * after the mark, then waiting for the old epoch's count, waits for
     * every issue that may have read the location unmarked, and for none
     * that started later (those see the mark and wait), so a stream of
     * operations from other threads cannot hold the migration back.  Once
     * the count is 0 and the flush is done, no operation to the old
     * location remains.
     *
     * One flip and drain at a time (inval_lock), as SRCU serialises its
     * grace periods: two invalidations running at once on this rank (the
     * progress thread's INVAL job and another thread's: a reclaim's wait
     * or an application wait runs quick jobs too) would flip the epoch
     * twice, and the second would wait for the count the first left, not
     * for the issues counted before its own mark.  An issue in flight then
     * wrote the old memory after the owner's copy (session 14: ema_stress
     * on the H200 lost 1616 bytes, one put).  The drain only spins on the
     * count: under the lock no job runs (its idle steps may look for dead
     * peers, which takes defer_lock, a leaf).  The issues it waits for
     * never wait for an invalidation themselves: they leave the count
     * before any wait that runs jobs (rma.c rma_wait_moving, cuda_path.c
     * rma_cdirect_drain), except a holder-side atomic on cuda, whose wait
     * runs quick jobs but puts INVAL jobs back in the queue
     * (coherence.c ema_win_in_amo). */
    pthread_mutex_lock(&ctx->inval_lock);
    int old = atomic_fetch_xor(&ctx->epoch, 1) & 1;
    ema__xport_wait_until(ctx->xp, EMA_WAIT_NONE, 0, ema_win_drained, &ctx->inflight[old]);
    pthread_mutex_unlock(&ctx->inval_lock);
    return ema__xport_flush(ctx->xp);
}

int ema__win_loc_ok(const ema__win_ctx_t *ctx, ema__loc_t loc)
{
    int rank = EMA_LOC_RANK(loc), tier = EMA_LOC_TIER(loc);

    if ((loc & EMA_LOC_FLAGS & ~EMA_LOC_MOVING) != 0 || rank < 0 || rank >= ctx->size ||
        tier >= EMA_TIER_MAX) {
        return 0;
    }
    /* every rank's tiers, from the modex (capacity 0: no such tier) */
    return EMA_LOC_SEG(loc) < ctx->exports[tier][rank].capacity / ctx->seg_size;
}

int ema__win_update_check(ema_win_h win, int part, uint64_t size, uint32_t nsegs,
                          uint32_t first, uint32_t count, const ema__loc_t *locs)
{
    ema__win_ctx_t *ctx = win->ctx;
    ema__win_part_t *p  = &win->parts[part];

    if (nsegs > p->max_segs || first > p->max_segs || count > p->max_segs - first) {
        ema_malformed("table of rank %d's part of window %u: %u segments, locations %u..%"
                      PRIu64 ", past its %u: dropped", part, win->id, nsegs, first,
                      (uint64_t)first + count, p->max_segs);
        return 0;
    }
    /* an offset below the size must fall in a segment of the part */
    if (size > (uint64_t)nsegs * ctx->seg_size) {
        ema_malformed("table of rank %d's part of window %u: %" PRIu64 " bytes in %u "
                      "segments: dropped", part, win->id, size, nsegs);
        return 0;
    }
    for (uint32_t i = 0; i < count; i++) {
        if (!ema__win_loc_ok(ctx, locs[i])) {
            ema_malformed("table of rank %d's part of window %u: segment %u at %#" PRIx64
                          ", not a segment of any rank's memory: dropped", part, win->id,
                          first + i, (uint64_t)locs[i]);
            return 0;
        }
    }
    return 1;
}

void ema__win_apply_update(ema_win_h win, int part, uint64_t version, size_t size,
                           uint32_t nsegs, uint32_t first, uint32_t count,
                           const ema__loc_t *locs)
{
    ema__win_part_t *p = &win->parts[part];

    /* checked by ema__win_update_check; the bounds again, without a wrap */
    if (version <= atomic_load(&p->version) || nsegs > p->max_segs ||
        first > p->max_segs || count > p->max_segs - first) {
        return; /* stale, or malformed */
    }
    for (uint32_t i = 0; i < count; i++) {
        atomic_store(&p->loc[first + i], locs[i]);
    }
    /* locations first, then the size that makes them reachable */
    atomic_store(&p->nsegs, nsegs);
    atomic_store(&p->size, size);
    atomic_store(&p->version, version);
}
