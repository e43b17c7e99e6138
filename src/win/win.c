#include "win.h"

#include "util/log.h"
#include "util/state.h"

#include <stdlib.h>
#include <string.h>

/* --- the world's arenas ------------------------------------------------- */

ema_status_t ema__win_ctx_init(ema__win_ctx_t *ctx, ema__xport_t *xp, ema__mem_arena_t *arena,
                               int rank, int size)
{
    memset(ctx, 0, sizeof(*ctx));
    ctx->xp       = xp;
    ctx->arena    = arena;
    ctx->rank     = rank;
    ctx->size     = size;
    ctx->seg_size = arena->seg_size;
    ctx->exports  = calloc((size_t)size, sizeof(*ctx->exports));
    if (ctx->exports == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    ema_status_t status = ema__xport_mr_register(xp, arena->base, arena->capacity,
                                                 &ctx->arena_mr);
    if (status != EMA_SUCCESS) {
        free(ctx->exports);
        ctx->exports = NULL;
    }
    return status;
}

ema_status_t ema__win_ctx_blob(ema__win_ctx_t *ctx, void **blob_p, size_t *len_p)
{
    size_t len = sizeof(ema__mem_export_t) + ctx->arena_mr.rkey_len;
    char *blob = malloc(len);
    if (blob == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    ema__mem_arena_export(ctx->arena, (ema__mem_export_t *)blob);
    memcpy(blob + sizeof(ema__mem_export_t), ctx->arena_mr.rkey_buf, ctx->arena_mr.rkey_len);
    *blob_p = blob;
    *len_p  = len;
    return EMA_SUCCESS;
}

ema_status_t ema__win_ctx_connect(ema__win_ctx_t *ctx, void *const *blobs, const size_t *lens)
{
    for (int r = 0; r < ctx->size; r++) {
        if (lens[r] < sizeof(ema__mem_export_t)) {
            ema_error("malformed arena description from rank %d", r);
            return EMA_ERR_BOOTSTRAP;
        }
        memcpy(&ctx->exports[r], blobs[r], sizeof(ema__mem_export_t));
        if (ctx->exports[r].seg_size != ctx->seg_size) {
            ema_error("rank %d uses segments of %lu bytes, rank %d of %zu: set "
                      "EMA_SEGMENT_SIZE alike on every rank", r,
                      (unsigned long)ctx->exports[r].seg_size, ctx->rank, ctx->seg_size);
            return EMA_ERR_INVALID_PARAM;
        }
        ema_status_t status = ema__xport_mr_add_peer(
            ctx->xp, &ctx->arena_mr, r, ctx->exports[r].base,
            (const char *)blobs[r] + sizeof(ema__mem_export_t));
        if (status != EMA_SUCCESS) {
            return status;
        }
    }
    return EMA_SUCCESS;
}

static void ema_win_parts_free(ema__win_ctx_t *ctx, ema__win_part_t *parts)
{
    for (int r = 0; parts != NULL && r < ctx->size; r++) {
        free(parts[r].loc);
        free(parts[r].ranks);
    }
    free(parts);
}

void ema__win_ctx_cleanup(ema__win_ctx_t *ctx)
{
    /* Windows still live at finalize were freed by the runtime first; only
     * the handles kept to detect stale use remain. */
    while (ctx->dead != NULL) {
        struct ema_win *w = ctx->dead;
        ctx->dead = w->next;
        free(w);
    }
    if (ctx->xp != NULL) {
        ema__xport_mr_deregister(ctx->xp, &ctx->arena_mr);
    }
    free(ctx->exports);
    ctx->exports = NULL;
}

/* --- window allocation -------------------------------------------------- */

/* What each rank contributes to the allocation's allgather. */
typedef struct {
    int32_t  status;
    uint32_t nsegs;
    uint64_t size;
    ema__seg_loc_t loc[];
} ema_win_desc_t;

static ema_status_t ema_win_part_set(ema__win_part_t *part, const ema_win_desc_t *d)
{
    part->size  = d->size;
    part->nsegs = d->nsegs;
    part->loc   = malloc(sizeof(*part->loc) * (d->nsegs ? d->nsegs : 1));
    part->ranks = malloc(sizeof(*part->ranks) * (d->nsegs ? d->nsegs : 1));
    if (part->loc == NULL || part->ranks == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    memcpy(part->loc, d->loc, sizeof(*part->loc) * d->nsegs);
    part->nranks = 0;
    for (uint32_t i = 0; i < d->nsegs; i++) {
        int seen = 0;
        for (int k = 0; k < part->nranks; k++) {
            seen |= (part->ranks[k] == d->loc[i].rank);
        }
        if (!seen) {
            part->ranks[part->nranks++] = d->loc[i].rank;
        }
    }
    return EMA_SUCCESS;
}

ema_status_t ema__win_allocate(ema__win_ctx_t *ctx, size_t size, const ema_win_params_t *params,
                               void **base_p, ema_win_h *win_p)
{
    size_t seg = ctx->seg_size, max_size = size;
    ema_status_t status = EMA_SUCCESS, local = EMA_SUCCESS;
    ema__mem_arena_t *arena = ctx->arena;
    uint32_t *segs = NULL, nsegs;
    ema_win_desc_t *desc = NULL;
    struct ema_win *win = NULL;
    void **blobs = NULL;
    size_t *lens = NULL, desc_len;
    uint32_t mapped = 0;

    if (params != NULL && (params->field_mask & EMA_WIN_PARAM_FIELD_MAX_SIZE)) {
        max_size = params->max_size;
    }
    nsegs = (uint32_t)((size + seg - 1) / seg);
    desc_len = sizeof(*desc) + sizeof(ema__seg_loc_t) * nsegs;

    win  = calloc(1, sizeof(*win));
    desc = calloc(1, desc_len);
    segs = calloc(nsegs ? nsegs : 1, sizeof(*segs));
    if (win == NULL || desc == NULL || segs == NULL) {
        local = EMA_ERR_NO_MEMORY;
        goto exchange;
    }
    win->ctx      = ctx;
    win->reserved = ((max_size + seg - 1) / seg) * seg;

    /* 1. take segments from the arena and map them at the part's base */
    local = ema__seg_pool_alloc(&arena->pool, nsegs, EMA_SEG_USED, segs);
    if (local != EMA_SUCCESS) {
        ema_debug("window of %zu bytes needs %u segments, %u free", size, nsegs,
                  ema__seg_pool_nfree(&arena->pool));
        nsegs = 0; /* nothing taken */
        goto exchange;
    }
    if (win->reserved > 0) {
        local = arena->ops->reserve(arena, win->reserved, &win->base);
        if (local != EMA_SUCCESS) {
            goto exchange;
        }
    }
    for (mapped = 0; mapped < nsegs; mapped++) {
        local = arena->ops->map(arena, &ctx->exports[ctx->rank], segs[mapped],
                                arena->ops->seg_handle(arena, segs[mapped]),
                                (char *)win->base + (size_t)mapped * seg);
        if (local != EMA_SUCCESS) {
            goto exchange;
        }
        desc->loc[mapped].rank = ctx->rank;
        desc->loc[mapped].seg  = segs[mapped];
    }

exchange:
    /* 2. every rank learns every part, and whether any rank failed */
    if (desc != NULL) {
        desc->status = local;
        desc->nsegs  = (local == EMA_SUCCESS) ? nsegs : 0;
        desc->size   = size;
        status = ema__xport_allgather(ctx->xp, desc, desc_len, &blobs, &lens);
    } else {
        status = EMA_ERR_NO_MEMORY; /* cannot even tell the others: they will hang */
        ema_error("out of memory in a collective ema_win_allocate");
    }
    if (status != EMA_SUCCESS) {
        goto err_unmap;
    }
    for (int r = 0; r < ctx->size; r++) {
        const ema_win_desc_t *d = blobs[r];
        if (d->status != EMA_SUCCESS) {
            status = (ema_status_t)d->status;
            if (r != ctx->rank) {
                ema_debug("ema_win_allocate failed on rank %d: %s", r, ema_strerror(status));
            }
            goto err_unmap;
        }
    }
    win->parts = calloc((size_t)(unsigned)ctx->size, sizeof(*win->parts));
    if (win->parts == NULL) {
        status = EMA_ERR_NO_MEMORY;
        goto err_unmap;
    }
    for (int r = 0; r < ctx->size; r++) {
        status = ema_win_part_set(&win->parts[r], blobs[r]);
        if (status != EMA_SUCCESS) {
            goto err_unmap;
        }
    }
    ema__xport_free_blobs(ctx->xp, blobs, lens);
    free(desc);
    free(segs);

    win->magic = EMA_WIN_MAGIC;
    win->id    = ctx->next_id++;
    win->next  = ctx->wins;
    ctx->wins  = win;
    *base_p    = (size > 0) ? win->base : NULL;
    *win_p     = win;
    return EMA_SUCCESS;

err_unmap:
    /* Some rank failed: every rank undoes its part, so nothing changes. */
    if (blobs != NULL) {
        ema__xport_free_blobs(ctx->xp, blobs, lens);
    }
    if (win != NULL) {
        ema_win_parts_free(ctx, win->parts);
        if (mapped > 0) {
            arena->ops->unmap(arena, win->base, (size_t)mapped * seg);
        }
        if (win->base != NULL) {
            arena->ops->unreserve(arena, win->base, win->reserved);
        }
    }
    if (local == EMA_SUCCESS && nsegs > 0) {
        ema__seg_pool_free(&arena->pool, nsegs, segs);
    }
    free(segs);
    free(desc);
    free(win);
    return status;
}

ema_status_t ema__win_free(ema__win_ctx_t *ctx, ema_win_h win)
{
    ema__mem_arena_t *arena = ctx->arena;
    ema__win_part_t *own = &win->parts[ctx->rank];
    ema_status_t status;

    /* Complete our own operations, then wait until every rank has, so nobody
     * touches our part once we unmap it. */
    status = ema__xport_flush(ctx->xp);
    if (status != EMA_SUCCESS) {
        return status;
    }
    status = ema__xport_barrier(ctx->xp);
    if (status != EMA_SUCCESS) {
        return status;
    }
    win->magic = EMA_WIN_MAGIC_DEAD;
    for (struct ema_win **pp = &ctx->wins; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == win) {
            *pp = win->next;
            break;
        }
    }
    if (own->nsegs > 0) {
        arena->ops->unmap(arena, win->base, (size_t)own->nsegs * ctx->seg_size);
        for (uint32_t i = 0; i < own->nsegs; i++) {
            if (own->loc[i].rank == ctx->rank) {
                ema__seg_pool_free(&arena->pool, 1, &own->loc[i].seg);
            }
        }
    }
    if (win->base != NULL) {
        arena->ops->unreserve(arena, win->base, win->reserved);
    }
    ema_win_parts_free(ctx, win->parts);
    win->parts = NULL;
    win->base  = NULL;
    win->next  = ctx->dead;
    ctx->dead  = win;
    return EMA_SUCCESS;
}
