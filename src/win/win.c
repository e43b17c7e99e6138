#include "win.h"

#include "util/log.h"
#include "util/state.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__thread struct ema_win *ema__win_lock_held; /* win.h: assertion builds only */

/* --- the world's memory tiers -------------------------------------------- */

ema_status_t ema__win_ctx_init(ema__win_ctx_t *ctx, ema__xport_t *xp, ema__mem_arena_t *arena,
                               ema__mem_arena_t *spill, int rank, int size)
{
    ema_status_t status = EMA_SUCCESS;
    int t;

    memset(ctx, 0, sizeof(*ctx));
    ctx->xp              = xp;
    ctx->tier[EMA_TIER_DEVICE] = arena;
    ctx->tier[EMA_TIER_SPILL]  = spill;
    ctx->rank            = rank;
    ctx->size            = size;
    ctx->seg_size        = arena->seg_size;
    atomic_init(&ctx->inflight[0], 0);
    atomic_init(&ctx->inflight[1], 0);
    atomic_init(&ctx->epoch, 0);
    pthread_mutex_init(&ctx->inval_lock, NULL);
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_mutex_init(&ctx->cpath.lock, NULL);
    for (t = 0; t < EMA_TIER_MAX; t++) {
        ctx->exports[t] = calloc((size_t)(unsigned)size, sizeof(ema__mem_export_t));
        if (ctx->exports[t] == NULL) {
            status = EMA_ERR_NO_MEMORY;
            goto err;
        }
        if (ctx->tier[t] == NULL) {
            continue; /* no spill tier (EMA_SPILL=none) */
        }
        /* cuda: one region per segment, each its own VMM allocation, so
         * that UCX's cuda_ipc can export it (see ema__xport_mr_register) */
        int cuda = ctx->tier[t]->ops->kind == EMA_MEMORY_KIND_CUDA;
        status = ema__xport_mr_register(xp, ctx->tier[t]->base, ctx->tier[t]->capacity,
                                        cuda ? ctx->tier[t]->seg_size : 0, cuda, &ctx->mr[t]);
        if (status != EMA_SUCCESS) {
            goto err;
        }
    }
    ctx->issued  = calloc((size_t)(unsigned)size, sizeof(*ctx->issued));
    ctx->flushed = calloc((size_t)(unsigned)size, sizeof(*ctx->flushed));
    atomic_init(&ctx->issued_all, 0);
    atomic_init(&ctx->flushed_all, 0);
    if (ctx->issued == NULL || ctx->flushed == NULL) {
        status = EMA_ERR_NO_MEMORY;
        goto err;
    }
    ema__win_coherence_init(ctx);
    return EMA_SUCCESS;

err:
    ema__win_ctx_cleanup(ctx);
    return status;
}

/* What every rank must agree on, first in each rank's blob: a rank that
 * differs fails ema_init on every rank, instead of being reached through a
 * slow path or not at all.  The device capacity travels too, to check the
 * world's host memory against the machine's. */
typedef struct {
    uint32_t kind;     /* ema_memory_kind_t of the device tier */
    uint32_t spill;    /* 1: a spill tier (EMA_SPILL=host where the kind has one) */
    uint64_t seg_size; /* EMA_SEGMENT_SIZE, resolved */
    uint64_t capacity; /* EMA_DEVICE_MEMORY, whole segments */
} ema_win_settings_t;

static void ema_win_settings(const ema__win_ctx_t *ctx, ema_win_settings_t *s)
{
    memset(s, 0, sizeof(*s));
    s->kind     = (uint32_t)ctx->tier[EMA_TIER_DEVICE]->ops->kind;
    s->spill    = ctx->tier[EMA_TIER_SPILL] != NULL;
    s->seg_size = ctx->seg_size;
    s->capacity = ctx->tier[EMA_TIER_DEVICE]->capacity;
}

/* Blob: [settings], then for each tier [export][u32 rkey_len][rkey], then
 * [u32 n][n x i32] the device tier's segment handles (cuda; n = 0 on host). */
ema_status_t ema__win_ctx_blob(ema__win_ctx_t *ctx, void **blob_p, size_t *len_p)
{
    size_t len = sizeof(ema_win_settings_t);
    for (int t = 0; t < EMA_TIER_MAX; t++) {
        len += sizeof(ema__mem_export_t) + sizeof(uint32_t) + ctx->mr[t].rkey_len;
    }
    len += ema__win_cpath_blob_len(ctx);
    char *blob = calloc(1, len), *p = blob;
    if (blob == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    ema_win_settings_t set;
    ema_win_settings(ctx, &set);
    memcpy(p, &set, sizeof(set));
    p += sizeof(set);
    for (int t = 0; t < EMA_TIER_MAX; t++) {
        uint32_t rlen = (uint32_t)ctx->mr[t].rkey_len;
        if (ctx->tier[t] != NULL) {
            ema__mem_arena_export(ctx->tier[t], (ema__mem_export_t *)p);
        }
        p += sizeof(ema__mem_export_t);
        memcpy(p, &rlen, sizeof(rlen));
        p += sizeof(rlen);
        if (rlen > 0) { /* no spill tier (EMA_SPILL=none): no key, rkey_buf NULL */
            memcpy(p, ctx->mr[t].rkey_buf, rlen);
        }
        p += rlen;
    }
    ema__win_cpath_blob(ctx, p);
    *blob_p = blob;
    *len_p  = len;
    return EMA_SUCCESS;
}

static const char *ema_win_spill_name(uint32_t spill)
{
    return spill ? "host" : "none";
}

/*
 * Every rank's settings against this rank's.  Every rank sees the same
 * blobs, so where any two ranks differ every rank finds a rank that differs
 * from it and fails: nobody is left waiting.  Before any endpoint is made:
 * a rank that failed and tore its worker down makes a peer's connect to it
 * fail with a transport error instead.
 */
ema_status_t ema__win_ctx_check(ema__win_ctx_t *ctx, void *const *blobs, const size_t *lens)
{
    ema_win_settings_t own, s;
    uint64_t total = 0;

    ema_win_settings(ctx, &own);
    for (int r = 0; r < ctx->size; r++) {
        if (lens[r] < sizeof(s)) {
            ema_error("malformed memory description in the modex");
            return EMA_ERR_BOOTSTRAP;
        }
        memcpy(&s, blobs[r], sizeof(s));
        if (s.kind != own.kind) {
            ema_error("ranks disagree on the memory kind: rank %d uses %s memory, rank %d "
                      "(this one) %s: set EMA_MEMORY_KIND alike on every rank", r,
                      ema__mem_kind_name((ema_memory_kind_t)s.kind), ctx->rank,
                      ema__mem_kind_name((ema_memory_kind_t)own.kind));
            return EMA_ERR_INVALID_PARAM;
        }
        if (s.seg_size != own.seg_size) {
            ema_error("ranks disagree on EMA_SEGMENT_SIZE: rank %d uses segments of %llu "
                      "bytes, rank %d (this one) of %llu: set it alike on every rank", r,
                      (unsigned long long)s.seg_size, ctx->rank,
                      (unsigned long long)own.seg_size);
            return EMA_ERR_INVALID_PARAM;
        }
        if (s.spill != own.spill) {
            ema_error("ranks disagree on EMA_SPILL: rank %d has %s, rank %d (this one) %s: "
                      "set it alike on every rank", r, ema_win_spill_name(s.spill), ctx->rank,
                      ema_win_spill_name(own.spill));
            return EMA_ERR_INVALID_PARAM;
        }
        total += s.capacity;
    }
    /* A host-kind rank's memory is faulted in, whole, in the background
     * after ema_init, so the ranks' memories together must fit the
     * machine (EMA runs on one node): more ends in the OOM killer. */
    if (own.kind == EMA_MEMORY_KIND_HOST && ctx->size > 1) {
        const char *what;
        size_t limit = ema__mem_host_limit(&what);
        if (total > limit) {
            ema_error("the %d ranks' EMA_DEVICE_MEMORY add up to %llu bytes (%.1f GiB), more "
                      "than the %zu bytes (%.1f GiB) of %s (host memory, faulted in at start): "
                      "give each rank at most %zu", ctx->size, (unsigned long long)total,
                      (double)total / (1 << 30), limit, (double)limit / (1 << 30), what,
                      limit / (size_t)ctx->size);
            return EMA_ERR_NO_MEMORY;
        }
    }
    return EMA_SUCCESS;
}

/* Map every rank's tiers for direct access where the memory kind allows;
 * otherwise RMA goes through UCX. */
static ema_status_t win_ctx_attach(ema__win_ctx_t *ctx)
{
    ema__mem_arena_t *dev = ctx->tier[EMA_TIER_DEVICE];
    if (dev->ops->attach == NULL || ctx->no_direct) {
        return EMA_SUCCESS;
    }
    for (int t = 0; t < EMA_TIER_MAX; t++) {
        ctx->peer_base[t] = calloc((size_t)(unsigned)ctx->size, sizeof(char *));
        if (ctx->peer_base[t] == NULL) {
            return EMA_ERR_NO_MEMORY;
        }
        if (ctx->tier[t] == NULL) {
            continue;
        }
        for (int r = 0; r < ctx->size; r++) {
            void *p;
            if (r == ctx->rank) {
                ctx->peer_base[t][r] = ctx->tier[t]->base;
                continue;
            }
            if (ctx->tier[t]->ops->attach(&ctx->exports[t][r], &p) != EMA_SUCCESS) {
                ema_warn("rank %d's memory cannot be mapped here: put and get go through "
                         "ucx active messages instead", r);
                return EMA_SUCCESS; /* direct stays 0 */
            }
            ctx->peer_base[t][r] = p;
        }
    }
    ctx->direct = 1;
    return EMA_SUCCESS;
}

ema_status_t ema__win_ctx_connect(ema__win_ctx_t *ctx, void *const *blobs, const size_t *lens)
{
    ema_status_t status;

    for (int r = 0; r < ctx->size; r++) {
        const char *p = (const char *)blobs[r] + sizeof(ema_win_settings_t);
        const char *end = (const char *)blobs[r] + lens[r];
        for (int t = 0; t < EMA_TIER_MAX; t++) {
            uint32_t rlen;
            if (p + sizeof(ema__mem_export_t) + sizeof(rlen) > end) {
                goto malformed;
            }
            memcpy(&ctx->exports[t][r], p, sizeof(ema__mem_export_t));
            p += sizeof(ema__mem_export_t);
            memcpy(&rlen, p, sizeof(rlen));
            p += sizeof(rlen);
            if (p + rlen > end) {
                goto malformed;
            }
            if (rlen > 0 && ctx->mr[t].memh != NULL) {
                status = ema__xport_mr_add_peer(ctx->xp, &ctx->mr[t], r,
                                                ctx->exports[t][r].base, p, rlen);
                if (status != EMA_SUCCESS) {
                    return status;
                }
            }
            p += rlen;
        }
        status = ema__win_cpath_connect(ctx, r, p, end);
        if (status != EMA_SUCCESS) {
            return status;
        }
    }
    return win_ctx_attach(ctx);

malformed:
    ema_error("malformed memory description in the modex");
    return EMA_ERR_BOOTSTRAP;
}

static void win_release_parts(ema__win_ctx_t *ctx, ema__win_part_t *parts)
{
    for (int r = 0; parts != NULL && r < ctx->size; r++) {
        free((void *)parts[r].loc);
    }
    free(parts);
}

/* A freed window leaves the live list; its tables stay until its last
 * reference goes (ema__win_put).  Under ctx->lock, with the list's
 * reference still held. */
static void win_unlink_locked(ema__win_ctx_t *ctx, struct ema_win *win)
{
    for (struct ema_win **pp = &ctx->wins; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == win) {
            *pp = win->next;
            break;
        }
    }
}

void ema__win_put(ema_win_h win)
{
    if (win == NULL) {
        return;
    }
    int was = atomic_fetch_sub(&win->refs, 1);
    EMA_ASSERT(was > 0, "window %u: a reference dropped that was not taken", win->id);
    if (was != 1) {
        return;
    }
    /* The last reference of a window that is unlinked already (the list
     * holds one while it is linked): no lookup can find it any more, so
     * nobody else reads the tables.  The acquire-release of the count
     * orders every holder's use of them before this free. */
    win_release_parts(win->ctx, win->parts);
    free(win->held);
    win->parts = NULL;
    win->held  = NULL;
}

void ema__win_ctx_cleanup(ema__win_ctx_t *ctx)
{
    /* Windows still live at finalize were freed by the runtime first; only
     * the handles kept to detect stale use remain. */
    while (ctx->dead != NULL) {
        struct ema_win *w = ctx->dead;
        ctx->dead = w->dead_next;
        pthread_mutex_destroy(&w->lock); /* kept alive for ema__win_recall's walk */
        /* NULL once the last reference went (ema__win_put), as it has
         * unless a lookup's holder never dropped it */
        win_release_parts(ctx, w->parts);
        free(w->held);
        free(w);
    }
    ema__win_cpath_cleanup(ctx);
    for (int t = 0; t < EMA_TIER_MAX; t++) {
        for (int r = 0; ctx->peer_base[t] != NULL && r < ctx->size; r++) {
            if (r != ctx->rank && ctx->peer_base[t][r] != NULL) {
                ctx->tier[t]->ops->detach(ctx->peer_base[t][r], ctx->exports[t][r].capacity);
            }
        }
        free(ctx->peer_base[t]);
        ctx->peer_base[t] = NULL;
        ctx->direct = 0;
        if (ctx->xp != NULL) {
            ema__xport_mr_deregister(ctx->xp, &ctx->mr[t]);
        }
        free(ctx->exports[t]);
        ctx->exports[t] = NULL;
    }
    free(ctx->issued);
    free(ctx->flushed);
    ctx->issued  = NULL;
    ctx->flushed = NULL;
    pthread_mutex_destroy(&ctx->lock);
    pthread_mutex_destroy(&ctx->inval_lock);
}

ema_win_h ema__win_find(ema__win_ctx_t *ctx, uint32_t id)
{
    ema_win_h w;
    pthread_mutex_lock(&ctx->lock);
    for (w = ctx->wins; w != NULL && w->id != id; w = w->next) {
    }
    if (w != NULL) {
        /* under ctx->lock, on a linked window: the list's reference is
         * there, so the count is not 0 and the tables are not going */
        int was = atomic_fetch_add(&w->refs, 1);
        EMA_ASSERT(was > 0, "window %u linked without the list's reference", w->id);
    }
    pthread_mutex_unlock(&ctx->lock);
    return w;
}

/* The window after @win in ctx->wins (the first for NULL).  ctx->lock
 * guards the links, not the windows, so a walk that locks each window in
 * turn reads each link under it.  A window unlinked by ema_win_free while a
 * walk stands on it keeps its next link (the dead list has its own,
 * dead_next), so the walk goes on to the windows that followed it; freed
 * windows stay in memory until ema__win_ctx_cleanup and are skipped by
 * their magic. */
ema_win_h ema__win_list_next(ema__win_ctx_t *ctx, ema_win_h win)
{
    pthread_mutex_lock(&ctx->lock);
    ema_win_h next = (win != NULL) ? win->next : ctx->wins;
    pthread_mutex_unlock(&ctx->lock);
    return next;
}

/* --- window allocation ---------------------------------------------------- */

/* What each rank contributes to the allocation's allgather. */
typedef struct {
    int32_t    status;
    uint32_t   nsegs;
    uint32_t   max_segs;
    uint32_t   pad;
    uint64_t   size;
    ema__loc_t loc[];
} ema_win_desc_t;

int ema__win_desc_check(const ema__win_ctx_t *ctx, int r, const void *blob, size_t len)
{
    ema_win_desc_t d;

    if (blob == NULL || len < sizeof(d)) {
        ema_malformed("window allocation: rank %d's description has %zu bytes: the "
                      "allocation fails", r, len);
        return 0;
    }
    memcpy(&d, blob, sizeof(d));
    if (d.status != EMA_SUCCESS) {
        if (!ema__status_known_error(d.status)) {
            ema_malformed("window allocation: rank %d's status %d is not a status: the "
                          "allocation fails", r, d.status);
            return 0;
        }
        return 1;
    }
    if (d.max_segs > EMA_WIN_MAX_SEGS || d.nsegs > d.max_segs ||
        len - sizeof(d) != (size_t)d.nsegs * sizeof(ema__loc_t) ||
        d.size > (uint64_t)d.nsegs * ctx->seg_size) {
        ema_malformed("window allocation: rank %d's description (%u of %u segments, %" PRIu64
                      " bytes, in %zu) is malformed: the allocation fails", r, d.nsegs,
                      d.max_segs, d.size, len);
        return 0;
    }
    for (uint32_t i = 0; i < d.nsegs; i++) {
        ema__loc_t loc;
        memcpy(&loc, (const char *)blob + sizeof(d) + (size_t)i * sizeof(loc), sizeof(loc));
        /* a new part is made of its owner's own memory */
        if (!ema__win_loc_ok(ctx, loc) || (loc & EMA_LOC_FLAGS) != 0 ||
            EMA_LOC_RANK(loc) != r || EMA_LOC_TIER(loc) != EMA_TIER_DEVICE) {
            ema_malformed("window allocation: rank %d's segment %u at %#" PRIx64 ", not a "
                          "segment of its memory: the allocation fails", r, i, (uint64_t)loc);
            return 0;
        }
    }
    return 1;
}

ema_status_t ema__win_allocate(ema__win_ctx_t *ctx, ema_status_t arg, size_t size,
                               const ema_win_params_t *params, void **base_p, ema_win_h *win_p)
{
    ema__mem_arena_t *arena = ctx->tier[EMA_TIER_DEVICE];
    size_t seg = ctx->seg_size, max_size = size;
    ema_status_t status = EMA_SUCCESS, local = EMA_SUCCESS;
    int64_t *handles = NULL;
    uint32_t nsegs, max_segs, mapped = 0;
    ema_win_desc_t *desc = NULL;
    struct ema_win *win = NULL;
    void **blobs = NULL;
    size_t *lens = NULL, desc_len;
    int taken = 0, lock_made = 0, linked = 0;

    EMA_WIN_ASSERT_NONE_LOCKED(); /* collective: waits for every rank */

    int has_max = params != NULL && (params->field_mask & EMA_WIN_PARAM_FIELD_MAX_SIZE);
    if (arg == EMA_SUCCESS && has_max) {
        max_size = params->max_size;
    }
    /* A part's segment counts and indexes are 32-bit wherever it is walked:
     * its tables, ema__loc_t, and the (uint32_t)(offset / seg) of grow,
     * shrink, acquire and prefetch (elastic.c), whose offsets are checked
     * against the part's size, at most max_size.  Refusing a part of more
     * than EMA_WIN_MAX_SEGS segments here keeps every one of those in
     * range, and the tables below affordable (8 bytes a segment on every
     * rank).  max_size >= size (api.c), so this bounds nsegs too. */
    if (arg == EMA_SUCCESS && max_size / seg + (max_size % seg != 0) > EMA_WIN_MAX_SEGS) {
        ema_error("ema_win_allocate: %s %zu is %zu segments of %zu bytes, more than the %u a "
                  "window part may have (a larger EMA_SEGMENT_SIZE allows more)",
                  has_max ? "max_size" : "size", max_size,
                  max_size / seg + (max_size % seg != 0), seg, (unsigned)EMA_WIN_MAX_SEGS);
        arg = EMA_ERR_INVALID_PARAM;
    }
    if (arg != EMA_SUCCESS) {
        size = max_size = 0; /* take nothing; only tell the others */
    }
    nsegs    = (uint32_t)(size / seg + (size % seg != 0)); /* <= EMA_WIN_MAX_SEGS */
    max_segs = (uint32_t)(max_size / seg + (max_size % seg != 0));
    desc_len = sizeof(*desc) + sizeof(ema__loc_t) * nsegs;

    win  = calloc(1, sizeof(*win));
    desc = calloc(1, desc_len);
    handles = calloc(nsegs ? nsegs : 1, sizeof(*handles));
    if (win == NULL || desc == NULL || handles == NULL) {
        local = EMA_ERR_NO_MEMORY;
        goto exchange;
    }
    win->ctx      = ctx;
    atomic_init(&win->refs, 1); /* the list's, from the link on */
    win->reserved = (size_t)max_segs * seg;
    win->held     = calloc(max_segs ? max_segs : 1, sizeof(*win->held));
    win->parts    = calloc((size_t)(unsigned)ctx->size, sizeof(*win->parts));
    if (win->held == NULL || win->parts == NULL) {
        local = EMA_ERR_NO_MEMORY;
        goto exchange;
    }
    pthread_mutex_init(&win->lock, NULL);
    atomic_init(&win->lock_owner, 0);
    lock_made = 1; /* destroyed on error */
    if (arg != EMA_SUCCESS) {
        local = arg;
        goto exchange;
    }

    /* 1. take local segments and map them at the part's base.  Allocation
     * uses local memory only, so that it fails the same way on every rank;
     * ema_win_grow() is what borrows and spills.  The segments come from
     * the memory provider, as a grow's do: it leaves out what ema_reclaim
     * withholds (ema_reclaim(3)) and takes them under its lock, so that no
     * BORROW served meanwhile lends them.  All or none. */
    uint32_t got = ctx->mem_ops->acquire(ctx->mem_arg, nsegs, -1, EMA_WIN_FROM_LOCAL,
                                         desc->loc, handles);
    if (got < nsegs) {
        ema_debug("window of %zu bytes needs %u segments, %u free and not withheld", size,
                  nsegs, got);
        ctx->mem_ops->release(ctx->mem_arg, desc->loc, got);
        local = EMA_ERR_NO_MEMORY;
        goto exchange;
    }
    taken = 1;
    if (win->reserved > 0) {
        local = arena->ops->reserve(arena, win->reserved, &win->base);
        if (local != EMA_SUCCESS) {
            goto exchange;
        }
    }
    for (mapped = 0; mapped < nsegs; mapped++) {
        local = arena->ops->map(arena, &ctx->exports[EMA_TIER_DEVICE][ctx->rank],
                                EMA_LOC_SEG(desc->loc[mapped]), handles[mapped],
                                (char *)win->base + (size_t)mapped * seg);
        if (local != EMA_SUCCESS) {
            goto exchange;
        }
    }
    ctx->mem_ops->mapped(ctx->mem_arg, desc->loc, nsegs);

exchange:
    /* 2. every rank learns every part, and whether any rank failed */
    if (desc == NULL) {
        ema_error("out of memory in a collective ema_win_allocate");
        status = EMA_ERR_NO_MEMORY; /* cannot even tell the others */
        goto err_unmap;
    }
    desc->status   = local;
    desc->nsegs    = (local == EMA_SUCCESS) ? nsegs : 0;
    desc->max_segs = max_segs;
    desc->size     = size;
    status = ema__xport_allgather(ctx->xp, desc, desc_len, &blobs, &lens);
    if (status != EMA_SUCCESS) {
        goto err_unmap;
    }
    for (int r = 0; r < ctx->size; r++) {
        const ema_win_desc_t *d = blobs[r];
        if (!ema__win_desc_check(ctx, r, blobs[r], lens[r])) {
            status = EMA_ERR_TRANSPORT; /* the same on every rank: the same blob */
            goto err_unmap;
        }
        if (d->status != EMA_SUCCESS) {
            status = (ema_status_t)d->status;
            if (status == EMA_ERR_INVALID_PARAM && r != ctx->rank && local == EMA_SUCCESS) {
                ema_warn("ema_win_allocate: rank %d passed an invalid argument; the window "
                         "is not allocated on any rank", r);
            }
            goto err_unmap;
        }
    }
    for (int r = 0; r < ctx->size; r++) {
        const ema_win_desc_t *d = blobs[r];
        ema__win_part_t *part = &win->parts[r];
        part->max_segs = d->max_segs;
        part->loc      = calloc(d->max_segs ? d->max_segs : 1, sizeof(ema__loc_t));
        if (part->loc == NULL) {
            status = EMA_ERR_NO_MEMORY;
            goto err_unmap;
        }
        for (uint32_t i = 0; i < d->nsegs; i++) {
            atomic_init(&part->loc[i], d->loc[i]);
        }
        atomic_init(&part->size, (size_t)d->size);
        atomic_init(&part->nsegs, d->nsegs);
        atomic_init(&part->version, 1);
    }
    if (ctx->debug_link_delay_us > 0) {
        usleep(ctx->debug_link_delay_us); /* EMA_DEBUG_WIN_LINK_DELAY: tests only */
    }
    win->magic = EMA_WIN_MAGIC;
    pthread_mutex_lock(&ctx->lock);
    win->id   = ctx->next_id++;
    win->next = ctx->wins;
    ctx->wins = win;
    pthread_mutex_unlock(&ctx->lock);
    /* Every rank knows the window before any rank uses it.  Otherwise a
     * peer's first grow, migration or table request could reach a rank that
     * is still between the allgather and the list above: it would drop the
     * update and acknowledge the invalidation of a window it does not know,
     * and then read through a stale table (wrong bytes). */
    status = ema__xport_barrier(ctx->xp, EMA_WAIT_QUICK);
    if (status != EMA_SUCCESS) {
        ema_error("ema_win_allocate: the closing barrier failed: %s", ema_strerror(status));
        /* Unlinked as ema_win_free does: a recall or a peer's message may
         * stand on it (windows allocated meanwhile by other threads may
         * sit before it), and such a walk may still lock it, so it goes to
         * the dead list instead of being freed. */
        ema__win_lock(win);
        win->magic = EMA_WIN_MAGIC_DEAD;
        pthread_mutex_lock(&ctx->lock);
        win_unlink_locked(ctx, win);
        pthread_mutex_unlock(&ctx->lock);
        ema__win_unlock(win);
        linked = 1;
        goto err_unmap;
    }
    ema__xport_free_blobs(ctx->xp, blobs, lens);
    free(desc);
    free(handles);
    ctx->mem_ops->changed(ctx->mem_arg, EMA_WIN_CHANGED_MEMORY); /* less of ours free */
    *base_p = (max_size > 0) ? win->base : NULL;
    *win_p  = win;
    return EMA_SUCCESS;

err_unmap:
    /* Some rank failed: every rank undoes its part, so nothing changes. */
    if (blobs != NULL) {
        ema__xport_free_blobs(ctx->xp, blobs, lens);
    }
    if (win != NULL) {
        /* a linked window's tables go with its last reference (below): a
         * message handler that found it before the unlink may still read
         * them (the failed barrier means messages may be in flight) */
        if (!linked) {
            win_release_parts(ctx, win->parts);
            win->parts = NULL;
        }
        if (mapped > 0) {
            arena->ops->unmap(arena, win->base, (size_t)mapped * seg);
        }
        if (win->base != NULL) {
            arena->ops->unreserve(arena, win->base, win->reserved);
        }
        if (!linked) {
            free(win->held);
            win->held = NULL;
        }
        win->base = NULL;
        if (lock_made && !linked) {
            pthread_mutex_destroy(&win->lock);
        }
    }
    if (taken) {
        ctx->mem_ops->release(ctx->mem_arg, desc->loc, nsegs);
    }
    free(handles);
    free(desc);
    if (linked) { /* the handle kept, with its lock, until ema__win_ctx_cleanup */
        pthread_mutex_lock(&ctx->lock);
        win->dead_next = ctx->dead;
        ctx->dead      = win;
        pthread_mutex_unlock(&ctx->lock);
        ema__win_put(win); /* the list's: the tables go unless a lookup holds them */
    } else {
        free(win);
    }
    return status;
}

ema_status_t ema__win_free(ema__win_ctx_t *ctx, ema_win_h win)
{
    ema__win_part_t *own = &win->parts[ctx->rank];
    ema__mem_arena_t *arena = ctx->tier[EMA_TIER_DEVICE];
    ema_status_t status;

    EMA_WIN_ASSERT_NONE_LOCKED(); /* takes win->lock; waits in barriers */
    /* Complete our own operations, then wait until every rank has, so nobody
     * touches our part once we unmap it. */
    status = ema__xport_flush(ctx->xp);
    if (status != EMA_SUCCESS) {
        return status;
    }
    status = ema__xport_barrier(ctx->xp, EMA_WAIT_QUICK);
    if (status != EMA_SUCCESS) {
        return status;
    }
    ema__win_lock(win);
    win->magic = EMA_WIN_MAGIC_DEAD;
    pthread_mutex_lock(&ctx->lock);
    win_unlink_locked(ctx, win); /* no lookup finds it from here on */
    pthread_mutex_unlock(&ctx->lock);

    uint32_t n = atomic_load(&own->nsegs);
    ema__win_seg_unmap(win, 0, n);
    ema__loc_t *locs = malloc(sizeof(*locs) * (n ? n : 1));
    for (uint32_t i = 0; i < n; i++) {
        ema__loc_t loc = atomic_load(&own->loc[i]) & ~EMA_LOC_MOVING;
        if (locs != NULL) {
            locs[i] = loc;
        } else { /* one at a time, without the batch */
            ctx->mem_ops->release(ctx->mem_arg, &loc, 1);
        }
    }
    if (locs != NULL) {
        ctx->mem_ops->release(ctx->mem_arg, locs, n); /* one give-back per lender */
        free(locs);
    }
    if (win->base != NULL) {
        arena->ops->unreserve(arena, win->base, win->reserved);
    }
    free(win->stats.wanted); /* the owner's alone, under the lock */
    win->stats.wanted = NULL;
    win->stats.nwanted = win->stats.wanted_cap = 0;
    win->base = NULL;
    ema__win_unlock(win);
    /* The handle (struct ema_win, with win->lock) stays until
     * ema__win_ctx_cleanup, as for an allocation whose closing barrier
     * failed: a recall walking the list may still lock this window, then
     * sees it dead and skips it (locking a destroyed mutex is undefined),
     * and a stale handle is recognised.
     *
     * The tables (parts, held) go with their last reference: a peer's
     * recall may move its part after the first barrier above, and its INVAL
     * job (the progress thread, or any thread's wait) or UPDATE (a UCX
     * callback) that looked the window up before the unlink still marks or
     * writes parts[src].loc, under the reference ema__win_find gave it.
     * Once unlinked, a lookup finds nothing (a later INVAL is
     * acknowledged, a later UPDATE dropped), so no reference is taken any
     * more; this drops the list's, after this function's own last use of
     * the tables, and whoever drops the last frees them.  Nothing here
     * waits for a holder: a job may run on this very thread, inside a wait
     * above. */
    pthread_mutex_lock(&ctx->lock);
    win->dead_next = ctx->dead;
    ctx->dead      = win;
    pthread_mutex_unlock(&ctx->lock);
    ema__win_put(win);
    /* Borrowed segments went back to their lenders above, each with an
     * active message handled on arrival.  The barrier is all-to-all, and
     * each rank's barrier message to a lender follows its give-backs on the
     * same endpoint, so once the barrier completes on a lender, that lender
     * has its memory back: a window it allocates right after (from its own
     * memory only) finds it free instead of failing with EMA_ERR_NO_MEMORY.
     * A third rank's borrow right after may still meet it as lent for a
     * moment, and then borrows elsewhere. */
    return ema__xport_barrier(ctx->xp, EMA_WAIT_QUICK);
}
