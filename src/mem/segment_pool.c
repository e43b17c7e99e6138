#include "segment_pool.h"

#include <stdlib.h>
#include <string.h>

ema_status_t ema__seg_pool_init(ema__seg_pool_t *pool, uint32_t nsegs)
{
    pool->state = calloc(nsegs ? nsegs : 1, 1);
    if (pool->state == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&pool->lock, NULL);
    pool->nsegs = nsegs;
    pool->nfree = nsegs;
    pool->nlent = 0;
    return EMA_SUCCESS;
}

void ema__seg_pool_cleanup(ema__seg_pool_t *pool)
{
    free(pool->state);
    pool->state = NULL;
    pthread_mutex_destroy(&pool->lock);
}

ema_status_t ema__seg_pool_alloc(ema__seg_pool_t *pool, uint32_t count, int state,
                                 uint32_t *segs)
{
    uint32_t run = 0, n = 0;

    if (count == 0) {
        return EMA_SUCCESS;
    }
    if (segs == NULL || (state != EMA_SEG_USED && state != EMA_SEG_LENT)) {
        return EMA_ERR_INVALID_PARAM;
    }
    pthread_mutex_lock(&pool->lock);
    if (pool->nfree < count) {
        pthread_mutex_unlock(&pool->lock);
        return EMA_ERR_NO_MEMORY;
    }
    /* first fit for one contiguous run */
    for (uint32_t i = 0; i < pool->nsegs; i++) {
        run = (pool->state[i] == EMA_SEG_FREE) ? run + 1 : 0;
        if (run == count) {
            for (uint32_t k = 0; k < count; k++) {
                segs[k] = i + 1 - count + k;
            }
            n = count;
            break;
        }
    }
    /* fragmented: any free segments, lowest first */
    for (uint32_t i = 0; n < count && i < pool->nsegs; i++) {
        if (pool->state[i] == EMA_SEG_FREE) {
            segs[n++] = i;
        }
    }
    for (uint32_t k = 0; k < count; k++) {
        pool->state[segs[k]] = (uint8_t)state;
    }
    pool->nfree -= count;
    if (state == EMA_SEG_LENT) {
        pool->nlent += count;
    }
    pthread_mutex_unlock(&pool->lock);
    return EMA_SUCCESS;
}

ema_status_t ema__seg_pool_free(ema__seg_pool_t *pool, uint32_t count, const uint32_t *segs)
{
    ema_status_t status = EMA_SUCCESS;

    if (count == 0) {
        return EMA_SUCCESS;
    }
    if (segs == NULL) {
        return EMA_ERR_INVALID_PARAM;
    }
    pthread_mutex_lock(&pool->lock);
    for (uint32_t k = 0; k < count; k++) {
        if (segs[k] >= pool->nsegs || pool->state[segs[k]] == EMA_SEG_FREE) {
            status = EMA_ERR_INVALID_PARAM;
            goto out;
        }
        for (uint32_t j = 0; j < k; j++) {
            if (segs[j] == segs[k]) { /* the same segment twice */
                status = EMA_ERR_INVALID_PARAM;
                goto out;
            }
        }
    }
    for (uint32_t k = 0; k < count; k++) {
        if (pool->state[segs[k]] == EMA_SEG_LENT) {
            pool->nlent--;
        }
        pool->state[segs[k]] = EMA_SEG_FREE;
    }
    pool->nfree += count;
out:
    pthread_mutex_unlock(&pool->lock);
    return status;
}

uint32_t ema__seg_pool_nfree(ema__seg_pool_t *pool)
{
    pthread_mutex_lock(&pool->lock);
    uint32_t n = pool->nfree;
    pthread_mutex_unlock(&pool->lock);
    return n;
}
