/*
 * The owner's side of a part's segment table: mapping segments into the
 * part's reserved range, and moving one segment's data to new memory while
 * the base pointer stays where it is.
 */
#include "win.h"

#include "util/log.h"

#include <string.h>

/* The arena whose ops map a location, and the export that describes it. */
static ema__mem_arena_t *ema_win_loc_arena(ema__win_ctx_t *ctx, ema__loc_t loc,
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
    const ema__mem_export_t *exp;
    ema__mem_arena_t *arena = ema_win_loc_arena(win->ctx, loc, &exp);
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
    const ema__mem_export_t *exp;
    ema__mem_arena_t *arena = ema_win_loc_arena(win->ctx, loc, &exp);
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

void ema__win_seg_unmap(ema_win_h win, uint32_t first, uint32_t count)
{
    ema__mem_arena_t *arena = win->ctx->tier[EMA_TIER_DEVICE];
    if (count > 0) {
        arena->ops->unmap(arena, (char *)win->base + (size_t)first * win->ctx->seg_size,
                          (size_t)count * win->ctx->seg_size);
    }
}

/*
 * Move segment idx:
 *  1. map the new memory at a scratch range,
 *  2. copy the segment's bytes into it (nobody writes them: the caller has
 *     invalidated the segment on every rank and told the owner through the
 *     reclaim callback),
 *  3. map the new memory over the old at the same address (MAP_FIXED
 *     replaces the old mapping in one step on the host kind),
 *  4. drop the scratch range.
 */
ema_status_t ema__win_seg_move(ema_win_h win, uint32_t idx, ema__loc_t loc, int64_t handle)
{
    ema__win_ctx_t *ctx = win->ctx;
    ema__mem_arena_t *dev = ctx->tier[EMA_TIER_DEVICE];
    const ema__mem_export_t *exp;
    ema__mem_arena_t *arena = ema_win_loc_arena(ctx, loc, &exp);
    size_t seg = ctx->seg_size;
    void *at = (char *)win->base + (size_t)idx * seg, *scratch = NULL;
    ema_status_t status;

    if (ctx->direct) {
        /* Every rank's memory is mapped here already (and resident): copy
         * through those mappings, then map the new memory in place.  A
         * scratch mapping would cost a page fault per page. */
        char *dst = ctx->peer_base[EMA_LOC_TIER(loc)][EMA_LOC_RANK(loc)] +
                    (size_t)EMA_LOC_SEG(loc) * seg;
        status = dev->ops->copy(dev, dst, at, seg);
        if (status == EMA_SUCCESS) {
            status = arena->ops->map(arena, exp, EMA_LOC_SEG(loc), handle, at);
        }
        if (status == EMA_SUCCESS) {
            win->stats.migrations++;
        }
        return status;
    }
    status = dev->ops->reserve(dev, seg, &scratch);
    if (status != EMA_SUCCESS) {
        return status;
    }
    status = arena->ops->map(arena, exp, EMA_LOC_SEG(loc), handle, scratch);
    if (status != EMA_SUCCESS) {
        goto out;
    }
    status = dev->ops->copy(dev, scratch, at, seg);
    if (status != EMA_SUCCESS) {
        goto out_unmap;
    }
    status = arena->ops->map(arena, exp, EMA_LOC_SEG(loc), handle, at);
out_unmap:
    dev->ops->unmap(dev, scratch, seg);
out:
    dev->ops->unreserve(dev, scratch, seg);
    if (status == EMA_SUCCESS) {
        win->stats.migrations++;
    }
    return status;
}

ema_status_t ema__win_inval_local(ema__win_ctx_t *ctx, ema_win_h win, int part, uint32_t first,
                                  uint32_t count)
{
    ema__win_part_t *p = &win->parts[part];

    for (uint32_t i = first; i < first + count && i < p->max_segs; i++) {
        atomic_fetch_or(&p->loc[i], EMA_LOC_MOVING);
    }
    /* An issue that read the location before the mark is counted in
     * inflight until the operation has been handed to UCX; after that the
     * flush completes it.  So once inflight is 0 and the flush is done, no
     * operation to the old location remains. */
    while (atomic_load(&ctx->inflight) > 0) {
        ema__xport_idle(ctx->xp);
    }
    return ema__xport_flush(ctx->xp);
}

void ema__win_apply_update(ema_win_h win, int part, uint64_t version, size_t size,
                           uint32_t nsegs, uint32_t first, uint32_t count,
                           const ema__loc_t *locs)
{
    ema__win_part_t *p = &win->parts[part];

    if (version <= atomic_load(&p->version) || nsegs > p->max_segs ||
        first + count > p->max_segs) {
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
