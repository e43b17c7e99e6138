/*
 * A pool of fixed-size segments: which segments of an arena are free, in use
 * by the owner's windows, or lent to a peer.  Allocation prefers one run of
 * contiguous segments so that RMA to a window part can be coalesced.
 * Thread-safe: the owner's API calls and the progress thread both use it.
 */
#ifndef EMA_MEM_SEGMENT_POOL_H_
#define EMA_MEM_SEGMENT_POOL_H_

#include <ema.h>
#include <pthread.h>
#include <stdint.h>

enum {
    EMA_SEG_FREE = 0,
    EMA_SEG_USED = 1, /* backs one of the owner's windows */
    EMA_SEG_LENT = 2  /* backs a peer's window */
};

typedef struct ema__seg_pool {
    pthread_mutex_t lock;
    uint32_t        nsegs;
    uint32_t        nfree;
    uint32_t        nlent;
    uint8_t        *state; /* EMA_SEG_* per segment */
} ema__seg_pool_t;

ema_status_t ema__seg_pool_init(ema__seg_pool_t *pool, uint32_t nsegs);
void         ema__seg_pool_cleanup(ema__seg_pool_t *pool);

/*
 * Take @count free segments and mark them @state.  Tries a single contiguous
 * run first (first fit), then takes any free segments in ascending order.
 * Writes the indices to @segs.  EMA_ERR_NO_MEMORY, with nothing taken, when
 * fewer than @count are free.
 */
ema_status_t ema__seg_pool_alloc(ema__seg_pool_t *pool, uint32_t count, int state,
                                 uint32_t *segs);

/* Return segments to the free state.  EMA_ERR_INVALID_PARAM, changing
 * nothing, if any index is out of range or already free. */
ema_status_t ema__seg_pool_free(ema__seg_pool_t *pool, uint32_t count, const uint32_t *segs);

uint32_t ema__seg_pool_nfree(ema__seg_pool_t *pool);

#endif
