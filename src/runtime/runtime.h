/*
 * The runtime: ema_init/ema_finalize and the world calls.  The only layer
 * that calls every other one; it owns the world's state.
 *
 * ema_init wires the layers together in this order (runtime.c):
 *  1. config: every module's table, then the ema_init_params_t overrides;
 *  2. boot: rank, size, local rank (PMIx, or a world of one);
 *  3. topo: the topology and which GPU each rank uses;
 *  4. mem: the rank's arena on that GPU, then the host spill tier;
 *  5. xport: the UCX context and worker;
 *  6. win: the window context, then the modex (one PMIx exchange of
 *     worker addresses and win blobs) that connects both to every peer;
 *  7. pool, which registers as the windows' memory provider; then topo's
 *     NUMA exchange (an allgather), which hands the topology to the pool
 *     for the lender order;
 *  8. progress: the progress thread; last, the pool's prefault job.
 * A failed ema_init undoes the steps it made in reverse, except that PMIx
 * stays up for the next try (ema__boot_abandon).  ema_finalize frees the
 * windows left, flushes, and takes the layers apart in reverse: progress,
 * pool, win, xport, mem (arena, then spill), topo, boot (PMIx too).
 */
#ifndef EMA_RUNTIME_H_
#define EMA_RUNTIME_H_

#include <ema.h>

#include "util/config.h"

#include "boot/boot.h"
#include "mem/mem.h"
#include "pool/pool.h"
#include "topo/topo.h"
#include "progress/progress.h"
#include "win/win.h"
#include "xport/xport.h"

typedef struct ema__runtime_config {
    int    memory_kind;   /* ema_memory_kind_t */
    size_t device_memory;
    size_t segment_size;  /* 0: the kind's default */
    int    hugepages;     /* host: try huge pages for the arena */
    int    cuda_path;     /* EMA_CUDA_PATH_*: put/get on the cuda kind */
    int    host_direct;   /* host: put/get as loads and stores on mapped peers */
    int    migrate_alias; /* migrations read old memory outside the window */
    unsigned debug_link_delay; /* tests: us before a new window is made known */
    unsigned debug_grow_delay; /* tests: us between a grow's memory and its map */
    int    log_level;
} ema__runtime_config_t;

typedef struct ema__world {
    ema__runtime_config_t cfg;
    ema__boot_t           boot;
    ema__mem_arena_t     *arena;
    ema__mem_arena_t     *spill; /* host spill tier, NULL with EMA_SPILL=none (and on
                                    the cuda kind without EMA_CUDA_SPILL=y) */
    ema__xport_t          xp;
    ema__win_ctx_t        win;
    ema__pool_t           pool;
    ema__progress_t       progress;
    ema__topo_config_t    topo_cfg;
    ema__topo_t          *topo;          /* NULL if hwloc failed */
    int                  *gpu_of_rank;   /* [size], -1: no GPU */
    int                  *numa_of_rank;  /* [size] */
    int                   gpu_shared;    /* two ranks use one GPU (or no topology and
                                            more than one rank: assumed) */
} ema__world_t;

extern const ema_config_field_t ema__runtime_config_table[];

/* Which spill tier a rank of memory kind @kind gets from @cfg (EMA_SPILL,
 * EMA_CUDA_SPILL): none; the host kind's arena; or, on the cuda kind with
 * EMA_CUDA_SPILL=y, a cuda arena of host memory (EMA_MEM_ARENA_HOST_NUMA).
 * Separate for the unit tests. */
typedef enum {
    EMA_SPILL_TIER_NONE,
    EMA_SPILL_TIER_HOST,
    EMA_SPILL_TIER_CUDA_HOST,
} ema__spill_tier_t;
ema__spill_tier_t ema__runtime_spill_tier(const ema__pool_config_t *cfg, ema_memory_kind_t kind);

#endif
