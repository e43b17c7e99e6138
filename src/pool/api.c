/* Public calls of the lending pool: reclaim and the memory statistics. */
#include "pool_priv.h"

#include "util/log.h"
#include "util/state.h"

#include <stdlib.h>
#include <string.h>

EMA_EXPORT ema_status_t ema_reclaim(size_t bytes, uint64_t timeout_ms)
{
    ema_status_t status = ema__check_ready();
    if (status != EMA_SUCCESS) {
        return status;
    }
    EMA_WIN_ASSERT_NONE_LOCKED(); /* ema__pool_reclaim waits on migrations */
    ema__pool_t *pool = ema__pool_world;
    size_t seg = pool->win->seg_size;
    if (bytes == 0 || bytes > pool->arena->capacity) {
        return EMA_ERR_INVALID_PARAM;
    }
    int withheld;
    status = ema__pool_reclaim(pool, (uint32_t)((bytes + seg - 1) / seg), timeout_ms,
                               EMA_POOL_RECLAIM_FAIL_FAST, &withheld);
    ema__pool_advertise(pool);
    return status;
}

EMA_EXPORT ema_status_t ema_reclaim_release(size_t bytes)
{
    ema_status_t status = ema__check_ready();
    if (status != EMA_SUCCESS) {
        return status;
    }
    ema__pool_t *pool = ema__pool_world;
    size_t seg = pool->win->seg_size;
    size_t n = bytes / seg + (bytes % seg != 0); /* no overflow near SIZE_MAX */
    pthread_mutex_lock(&pool->lock);
    if (bytes == 0 || n > pool->withheld) {
        status = EMA_ERR_INVALID_PARAM;
    } else {
        pool->withheld -= (uint32_t)n;
    }
    pthread_mutex_unlock(&pool->lock);
    if (status == EMA_SUCCESS) {
        ema__pool_advertise(pool);
    }
    return status;
}

EMA_EXPORT ema_status_t ema_mem_stat(ema_mem_stat_t *stat_p)
{
    ema_status_t status = ema__check_ready_out(stat_p);
    if (status != EMA_SUCCESS) {
        return status;
    }
    /* field_mask as in ema_win_stat: output only, every field filled */
    const uint64_t known = EMA_MEM_STAT_FIELD_CAPACITY | EMA_MEM_STAT_FIELD_RESERVE |
                           EMA_MEM_STAT_FIELD_BYTES_FREE | EMA_MEM_STAT_FIELD_BYTES_USED |
                           EMA_MEM_STAT_FIELD_BYTES_LENT | EMA_MEM_STAT_FIELD_BYTES_WITHHELD |
                           EMA_MEM_STAT_FIELD_BYTES_BORROWED | EMA_MEM_STAT_FIELD_BYTES_SPILLED |
                           EMA_MEM_STAT_FIELD_RECLAIMS | EMA_MEM_STAT_FIELD_BYTES_MIGRATED |
                           EMA_MEM_STAT_FIELD_RECLAIM_LAST_US |
                           EMA_MEM_STAT_FIELD_RECLAIM_MAX_US | EMA_MEM_STAT_FIELD_MEMORY_KIND |
                           EMA_MEM_STAT_FIELD_DEVICE | EMA_MEM_STAT_FIELD_BYTES_UNMET;
    ema__pool_t *pool = ema__pool_world;
    size_t seg = pool->win->seg_size;
    ema__seg_pool_t *sp = &pool->arena->pool;
    ema_mem_stat_t st;
    memset(&st, 0, sizeof(st));
    pthread_mutex_lock(&pool->lock);
    pthread_mutex_lock(&sp->lock);
    st.capacity       = pool->arena->capacity;
    st.reserve        = (size_t)pool->reserve_segs * seg;
    st.bytes_free     = (size_t)sp->nfree * seg;
    st.bytes_lent     = (size_t)sp->nlent * seg;
    st.bytes_used     = (size_t)(sp->nsegs - sp->nfree - sp->nlent) * seg;
    st.bytes_withheld = (size_t)pool->withheld * seg;
    pthread_mutex_unlock(&sp->lock);
    pthread_mutex_unlock(&pool->lock);
    st.bytes_borrowed  = (size_t)atomic_load(&pool->borrowed_segs) * seg;
    st.bytes_spilled   = (size_t)atomic_load(&pool->spilled_segs) * seg;
    st.reclaims        = atomic_load(&pool->reclaims);
    st.bytes_migrated  = atomic_load(&pool->win->bytes_migrated);
    st.reclaim_last_us = pool->reclaim_last_us;
    st.reclaim_max_us  = pool->reclaim_max_us;
    st.memory_kind     = pool->arena->ops->kind;
    st.device          = (st.memory_kind == EMA_MEMORY_KIND_CUDA) ? pool->arena->device : -1;
    st.bytes_unmet     = atomic_load(&pool->bytes_unmet);
    st.field_mask = known;
    /* every field up to reserved[], which a later version fills */
    memcpy(stat_p, &st, offsetof(ema_mem_stat_t, reserved));
    return EMA_SUCCESS;
}
