/*
 * Memory kinds behind one ops table (as libfabric's hmem ops), and the
 * per-rank arena: the memory a rank owns, cut into fixed-size segments that
 * are free, used by the rank's own windows, or lent to a peer.
 *
 * The arena stands in for a GPU's memory.  On the host kind it is a memfd of
 * EMA_DEVICE_MEMORY bytes; on the cuda kind, VMM allocations on the device.
 */
#ifndef EMA_MEM_H_
#define EMA_MEM_H_

#include <ema.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mem/segment_pool.h"

typedef struct ema__mem_arena ema__mem_arena_t;

/* What a peer needs to map one of our segments into its own address space. */
typedef struct ema__mem_export {
    int32_t  pid;      /* owner's process id */
    int32_t  fd;       /* host: the arena memfd in the owner's fd table */
    uint64_t base;     /* owner's arena address (for RMA) */
    uint64_t capacity;
    uint64_t seg_size;
} ema__mem_export_t;

typedef struct ema__mem_ops {
    size_t            size;     /* sizeof(ema__mem_ops_t), for growing the table */
    const char       *name;
    ema_memory_kind_t kind;
    size_t            default_segment_size;
    size_t            granularity; /* segments must be a multiple of this */

    /* Is the kind usable here (driver present, device visible)? */
    int          (*usable)(void);
    ema_status_t (*arena_create)(ema__mem_arena_t *arena);
    void         (*arena_destroy)(ema__mem_arena_t *arena);
    /* Make segments [first, first+count) resident ahead of time. */
    ema_status_t (*prefault)(ema__mem_arena_t *arena, uint32_t first, uint32_t count);
    /* Reserve / release address space for a window part. */
    ema_status_t (*reserve)(ema__mem_arena_t *arena, size_t len, void **addr_p);
    void         (*unreserve)(ema__mem_arena_t *arena, void *addr, size_t len);
    /* The handle a peer needs to map segment @seg of this arena: host, the
     * arena memfd's number; cuda, that segment's exported POSIX fd number.
     * It travels in the lend reply; the peer gets the file with pidfd_getfd
     * (or /proc/<pid>/fd/<n>). */
    int64_t      (*seg_handle)(ema__mem_arena_t *arena, uint32_t seg);
    /* Map segment @seg, whose handle is @handle, of the arena described by
     * @exp (ours or a peer's) at @addr, which lies inside a reserved range. */
    ema_status_t (*map)(ema__mem_arena_t *arena, const ema__mem_export_t *exp,
                        uint32_t seg, int64_t handle, void *addr);
    /* Optional: map @count consecutive segments from @seg on, all behind the
     * same @handle, at @addr in one call (one TLB shootdown, not @count). */
    ema_status_t (*map_many)(ema__mem_arena_t *arena, const ema__mem_export_t *exp,
                             uint32_t seg, uint32_t count, int64_t handle, void *addr);
    /* Unmap whatever is mapped at [addr, addr+len), keeping the reservation. */
    ema_status_t (*unmap)(ema__mem_arena_t *arena, void *addr, size_t len);
    /* Map the whole arena described by @exp (a peer's) for direct loads and
     * stores from this process; NULL where the kind cannot (cuda: device
     * memory is reached through UCX). */
    ema_status_t (*attach)(const ema__mem_export_t *exp, void **addr_p);
    void         (*detach)(void *addr, size_t len);
    /* Copy between any two addresses of this kind (or host memory). */
    ema_status_t (*copy)(ema__mem_arena_t *arena, void *dst, const void *src, size_t len);
    /* Optional: queue a copy (device to device, on the copy engines) and
     * return; copy_wait waits for every copy queued. */
    ema_status_t (*copy_start)(ema__mem_arena_t *arena, void *dst, const void *src, size_t len);
    ema_status_t (*copy_wait)(ema__mem_arena_t *arena);
    /* Optional, with copy_start: a mark behind the copies queued so far
     * (*mark_p), and a wait for the copies before it, which also frees it.
     * A migration remaps what is copied while the copies after it run. */
    ema_status_t (*copy_mark)(ema__mem_arena_t *arena, void **mark_p);
    ema_status_t (*copy_wait_mark)(ema__mem_arena_t *arena, void *mark);
    /* Optional, with copy_mark: 1 if the copies before @mark are complete
     * (the mark stays valid: copy_wait_mark frees it), without waiting. */
    int (*copy_mark_done)(ema__mem_arena_t *arena, void *mark);
    /* Optional (cuda): copies of put and get on the direct path, queued on
     * a stream of their own; rma_copy_wait waits for every one queued. */
    ema_status_t (*rma_copy_start)(ema__mem_arena_t *arena, void *dst, const void *src,
                                   size_t len);
    ema_status_t (*rma_copy_wait)(ema__mem_arena_t *arena);
} ema__mem_ops_t;

struct ema__mem_arena {
    const ema__mem_ops_t *ops;
    size_t                capacity;
    size_t                seg_size;
    void                 *base;   /* the owner's own mapping of the whole arena */
    int                   fd;     /* host kind: the memfd; -1 otherwise */
    int                   device; /* cuda kind: the device ordinal */
    unsigned              flags;  /* EMA_MEM_ARENA_* asked for */
    int                   huge;   /* host: backed by huge pages */
    void                 *priv;   /* kind-specific state */
    ema__seg_pool_t       pool;
};

extern const ema__mem_ops_t ema__mem_host_ops;
#ifdef HAVE_CUDA
extern const ema__mem_ops_t ema__mem_cuda_ops;
#endif

/* The ops of @kind, resolving EMA_MEMORY_KIND_AUTO; NULL if not built. */
const ema__mem_ops_t *ema__mem_ops_get(ema_memory_kind_t kind);
const char           *ema__mem_kind_name(ema_memory_kind_t kind);

/* The most segments an arena may have: 2^28 (1T of 4 KiB segments, 512T
 * of 2 MiB ones).  The pool counts them in uint32_t, sums of two included,
 * and keeps a few bytes per segment (ema__mem_arena_create refuses more). */
#define EMA_MEM_MAX_SEGS (1u << 28)

/* Host memory this process may have: physical memory, or a cgroup's
 * memory limit (v2 memory.max, v1 memory.limit_in_bytes, its own or an
 * ancestor's) where lower.  *@what_p, if not NULL, says which of the two
 * it is.  SIZE_MAX where neither can be read. */
size_t ema__mem_host_limit(const char **what_p);
/* The memory limit of the cgroups listed in @self_cgroup (the format of
 * /proc/self/cgroup), read under @root (/sys/fs/cgroup): v2 memory.max, in
 * the unified hierarchy or the hybrid layout's unified/, and v1
 * memory/.../memory.limit_in_bytes, the lowest of each cgroup and its
 * ancestors; 0 for none.  Separate for the unit tests. */
uint64_t ema__mem_cgroup_limit(const char *self_cgroup, const char *root);
/* MemAvailable of /proc/meminfo, in bytes: what can be faulted in now
 * without swapping; 0 where unknown. */
size_t ema__mem_host_available(void);

/* Arena flags. */
#define EMA_MEM_ARENA_HUGEPAGES 1u /* host: back it with 2 MiB huge pages where
                                      some are reserved; else 4 KiB pages */
#define EMA_MEM_ARENA_HOST_NUMA 2u /* cuda: segments of pinned host memory (on the
                                      GPU's host NUMA node where the driver can),
                                      mapped for the device: the spill tier of
                                      EMA_CUDA_SPILL=y; EMA_ERR_UNSUPPORTED where the
                                      driver cannot */

ema_status_t ema__mem_arena_create(const ema__mem_ops_t *ops, size_t capacity, size_t seg_size,
                                   int device, unsigned flags, ema__mem_arena_t **arena_p);
void         ema__mem_arena_destroy(ema__mem_arena_t *arena);
void         ema__mem_arena_export(const ema__mem_arena_t *arena, ema__mem_export_t *exp);

#endif
