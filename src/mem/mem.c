#include "mem.h"

#include "util/log.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *ema__mem_kind_name(ema_memory_kind_t kind)
{
    switch (kind) {
    case EMA_MEMORY_KIND_AUTO: return "auto";
    case EMA_MEMORY_KIND_HOST: return "host";
    case EMA_MEMORY_KIND_CUDA: return "cuda";
    }
    return "unknown";
}

const ema__mem_ops_t *ema__mem_ops_get(ema_memory_kind_t kind)
{
    switch (kind) {
    case EMA_MEMORY_KIND_AUTO:
#ifdef HAVE_CUDA
        if (ema__mem_cuda_ops.usable()) {
            return &ema__mem_cuda_ops;
        }
#endif
        return &ema__mem_host_ops;
    case EMA_MEMORY_KIND_HOST:
        return &ema__mem_host_ops;
    case EMA_MEMORY_KIND_CUDA:
#ifdef HAVE_CUDA
        return &ema__mem_cuda_ops;
#else
        return NULL;
#endif
    }
    return NULL;
}

ema_status_t ema__mem_arena_create(const ema__mem_ops_t *ops, size_t capacity, size_t seg_size,
                                   int device, unsigned flags, ema__mem_arena_t **arena_p)
{
    ema__mem_arena_t *arena;
    ema_status_t status;

    if (seg_size == 0 || (seg_size % ops->granularity) != 0) {
        ema_error("segment size %zu is not a multiple of the %s granularity %zu", seg_size,
                  ops->name, ops->granularity);
        return EMA_ERR_INVALID_PARAM;
    }
    if (capacity < seg_size) {
        ema_error("device memory %zu is smaller than one segment (%zu)", capacity, seg_size);
        return EMA_ERR_INVALID_PARAM;
    }
    if (capacity / seg_size > EMA_MEM_MAX_SEGS) {
        /* the runtime names the variable first; this guards the casts below */
        ema_error("%s memory of %zu bytes is %zu segments of %zu, more than %u", ops->name,
                  capacity, capacity / seg_size, seg_size, (unsigned)EMA_MEM_MAX_SEGS);
        return EMA_ERR_INVALID_PARAM;
    }
    capacity -= capacity % seg_size; /* whole segments only */

    arena = calloc(1, sizeof(*arena));
    if (arena == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    arena->ops      = ops;
    arena->capacity = capacity;
    arena->seg_size = seg_size;
    arena->fd       = -1;
    arena->device   = device;
    arena->flags    = flags;

    status = ema__seg_pool_init(&arena->pool, (uint32_t)(capacity / seg_size));
    if (status != EMA_SUCCESS) {
        goto err_free;
    }
    status = ops->arena_create(arena);
    if (status != EMA_SUCCESS) {
        goto err_pool;
    }
    ema_debug("%s arena: %zu bytes in %u segments of %zu%s", ops->name, capacity,
              arena->pool.nsegs, seg_size, arena->huge ? ", 2 MiB huge pages" : "");
    *arena_p = arena;
    return EMA_SUCCESS;

err_pool:
    ema__seg_pool_cleanup(&arena->pool);
err_free:
    free(arena);
    return status;
}

void ema__mem_arena_destroy(ema__mem_arena_t *arena)
{
    if (arena == NULL) {
        return;
    }
    arena->ops->arena_destroy(arena);
    ema__seg_pool_cleanup(&arena->pool);
    free(arena);
}

void ema__mem_arena_export(const ema__mem_arena_t *arena, ema__mem_export_t *exp)
{
    memset(exp, 0, sizeof(*exp));
    exp->pid      = (int32_t)getpid();
    exp->fd       = arena->fd;
    exp->base     = (uint64_t)(uintptr_t)arena->base;
    exp->capacity = arena->capacity;
    exp->seg_size = arena->seg_size;
}
