/*
 * What put and get share inside win: the run a segment table gives for an
 * offset, and the in-flight count by epoch that a migration waits for.
 * Used by rma.c and by the cuda kind's direct path (cuda_path.c).
 */
#ifndef EMA_WIN_RMA_PRIV_H_
#define EMA_WIN_RMA_PRIV_H_

#include "win.h"

typedef enum { EMA_OP_PUT, EMA_OP_GET } ema_op_t;

/* A new aggregate request of a world of @size ranks, held (pending 1)
 * until its operations are issued; NULL out of memory.  Exposed with the
 * next for the unit tests. */
struct ema_request *ema__win_rma_agg_new(ema__xport_t *xp, int size);

/* One operation of an aggregate request, to the rank of @slot, completed
 * with @status (the UCX callback's work). */
void ema__win_rma_agg_done(struct ema_req_slot *slot, ucs_status_t status);

/*
 * Find the run starting at @offset: the rank and tier holding it, the remote
 * address, and how many bytes from there are contiguous in that memory.
 * Returns 0 if the segment is moving; the caller waits and retries.  Must be
 * called with ctx->inflight raised (see ema__win_inval_local).
 */
/* rma_run's answer for a range whose memory, or whose part's owner, is on
 * a lost rank (xport/peer.c): every access fails with EMA_ERR_PEER_LOST. */
#define EMA_RUN_LOST (SIZE_MAX - 1)

static inline size_t rma_run(ema_win_h win, const ema__win_part_t *part, size_t offset,
                             size_t len, int *rank_p, int *tier_p, uint64_t *raddr_p)
{
    ema__win_ctx_t *ctx = win->ctx;
    size_t seg  = ctx->seg_size;
    uint32_t i  = (uint32_t)(offset / seg);
    size_t in   = offset - (size_t)i * seg;
    ema__loc_t loc = atomic_load_explicit(&part->loc[i], memory_order_seq_cst);
    size_t run  = seg - in;

    if (loc & EMA_LOC_MOVING) {
        /* moving, or being removed by a shrink: then the range is gone;
         * or its owner died moving it: then it never clears */
        size_t psize = atomic_load_explicit(&part->size, memory_order_acquire);
        if (ema__xport_peer_lost(ctx->xp, (int)(part - win->parts))) {
            return EMA_RUN_LOST;
        }
        return (offset + len > psize) ? SIZE_MAX : 0;
    }
    if (ema__xport_peer_lost(ctx->xp, EMA_LOC_RANK(loc))) {
        return EMA_RUN_LOST; /* the only copy was on a lost rank */
    }
    ema__loc_t next = loc;
    /* Consecutive segments of one rank make one run, unless each segment is
     * registered on its own (cuda): one UCX operation per key. */
    while (run < len && i + 1 < part->max_segs && ctx->mr[EMA_LOC_TIER(loc)].nreg <= 1) {
        ema__loc_t l = atomic_load_explicit(&part->loc[i + 1], memory_order_relaxed);
        if (l != next + 1) { /* same rank and tier, next segment, not moving */
            break;
        }
        next = l;
        i++;
        run += seg;
    }
    int tier = EMA_LOC_TIER(loc);
    *rank_p  = EMA_LOC_RANK(loc);
    *tier_p  = tier;
    *raddr_p = ctx->mr[tier].bases[*rank_p] + (uint64_t)EMA_LOC_SEG(loc) * seg + in;
    return (run < len) ? run : len;
}

/* An issue counts in the in-flight count of the epoch it started in: an
 * invalidation flips the epoch and waits only for the old one's count, so
 * operations that start later (and see the segments MOVING) cannot keep it
 * waiting, however many threads issue them.  The count must be taken
 * while that epoch is still the current one: an issue that read epoch e,
 * was preempted across a flip and then counted itself in e would be
 * invisible to the next flip (from 1 - e back to e), which waits for
 * 1 - e.  So the epoch is read again after the count (both sequentially
 * consistent: either the flip's drain sees the count or the issue sees
 * the flip), and the count moves if it changed.  The location is read
 * after this, so it sees the mark of every invalidation that does not
 * wait for it. */
static inline int rma_count_in(ema__win_ctx_t *ctx, int ep)
{
    atomic_fetch_add(&ctx->inflight[ep], 1);
    if ((atomic_load(&ctx->epoch) & 1) == ep) {
        return ep;
    }
    atomic_fetch_sub(&ctx->inflight[ep], 1);
    return -1; /* the epoch read is stale: read it again */
}

static inline int rma_in(ema__win_ctx_t *ctx)
{
    int ep;
    while ((ep = rma_count_in(ctx, atomic_load(&ctx->epoch) & 1)) < 0) {
    }
    return ep;
}

static inline void rma_leave(ema__win_ctx_t *ctx, int ep)
{
    atomic_fetch_sub(&ctx->inflight[ep], 1);
}

/* Put or get of @len bytes on the cuda kind's direct path (cuda_path.c):
 * complete when it returns. */
ema_status_t ema__win_rma_cdirect(ema_win_h win, ema_op_t op, int rank, size_t offset,
                                  void *buf, size_t len);

#endif
