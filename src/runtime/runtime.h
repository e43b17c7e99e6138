/*
 * The runtime: ema_init/ema_finalize and the world calls.  The only layer
 * that calls every other one; it owns the world's state and wires the layers
 * together in order (boot, mem, xport, win, progress) and apart in reverse.
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
    int    host_direct;   /* host: put/get as loads and stores on mapped peers */
    unsigned debug_link_delay; /* tests: us before a new window is made known */
    int    log_level;
} ema__runtime_config_t;

typedef struct ema__world {
    ema__runtime_config_t cfg;
    ema__boot_t           boot;
    ema__mem_arena_t     *arena;
    ema__mem_arena_t     *spill; /* host spill tier, NULL with EMA_SPILL=none */
    ema__xport_t          xp;
    ema__win_ctx_t        win;
    ema__pool_t           pool;
    ema__progress_t       progress;
    ema__topo_config_t    topo_cfg;
    ema__topo_t          *topo;          /* NULL if hwloc failed */
    int                  *gpu_of_rank;   /* [size], -1: no GPU */
    int                  *numa_of_rank;  /* [size] */
} ema__world_t;

extern const ema_config_field_t ema__runtime_config_table[];

#endif
