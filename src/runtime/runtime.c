#include "runtime.h"

#include <inttypes.h>

#include "util/config.h"
#include "util/log.h"
#include "util/state.h"
#include "topo/topo.h"

#include <stdlib.h>
#include <string.h>

#define EMA_RT_CFG(_f) offsetof(ema__runtime_config_t, _f)

static const char *ema_kind_names[]  = {"auto", "host", "cuda", NULL};
static const char *ema_level_names[] = {"error", "warn", "info", "debug", "trace", NULL};
static const char *ema_cpath_names[] = {"auto", "ucx", "direct", NULL}; /* EMA_CUDA_PATH_* */
static const ema_config_parser_t ema_cpath_parser = EMA_CONFIG_ENUM(ema_cpath_names);
static const ema_config_parser_t ema_kind_parser  = EMA_CONFIG_ENUM(ema_kind_names);
static const ema_config_parser_t ema_level_parser = EMA_CONFIG_ENUM(ema_level_names);

const ema_config_field_t ema__runtime_config_table[] = {
    {"MEMORY_KIND", "auto",
     "memory kind of each rank's memory: cuda where a GPU is usable, else host",
     EMA_RT_CFG(memory_kind), &ema_kind_parser},
    {"DEVICE_MEMORY", "1G",
     "capacity of each rank's memory (its arena): the memory a GPU would have",
     EMA_RT_CFG(device_memory), &ema__config_size},
    {"SEGMENT_SIZE", "auto",
     "size of the segments windows are made of and lent in (auto: 2M on host, "
     "256M on cuda, where remapping a segment, unmap + map + set-access, costs about 46 us "
     "on an H200 whatever its size, 80-110 us inside a migration)",
     EMA_RT_CFG(segment_size), &ema__config_size_auto},
    {"HUGEPAGES", "y",
     "host kind: back each rank's memory with 2 MiB huge pages when enough are reserved "
     "(vm.nr_hugepages) and segments are a multiple of 2M, else 4 KiB pages: a reclaim then "
     "costs about the copy, without the teardown of 512 page-table entries per 2 MiB",
     EMA_RT_CFG(hugepages), &ema__config_bool},
    {"HOST_DIRECT", "y",
     "host kind: put, get and atomics as loads and stores on peers' mapped memory; n sends "
     "them through UCX as on the cuda kind (slower: for testing that path on any machine)",
     EMA_RT_CFG(host_direct), &ema__config_bool},
    {"MIGRATE_ALIAS", "y",
     "a migration reads the old memory through this rank's own mapping of it (its own "
     "arenas, the mirrors of peers' GPU memory) and remaps the window's ranges while the "
     "copies run; n reads it through the window and remaps each piece after its copy",
     EMA_RT_CFG(migrate_alias), &ema__config_bool},
    {"CUDA_PATH", "auto",
     "cuda kind: how put and get reach GPU memory: ucx (UCX's cuda_ipc), direct (EMA maps "
     "peers' segments and copies with the copy engines), or auto: direct where a probe at "
     "ema_init finds UCX not zero-copy to a peer, or slower than the copy engines",
     EMA_RT_CFG(cuda_path), &ema_cpath_parser},
    {"DEBUG_WIN_LINK_DELAY", "0",
     "testing only: microseconds each rank sleeps inside ema_win_allocate after the exchange, "
     "before the new window is known to it (widens a race for the regression tests)",
     EMA_RT_CFG(debug_link_delay), &ema__config_uint},
    {"DEBUG_GROW_MAP_DELAY", "0",
     "testing only: microseconds ema_win_grow sleeps after it found its memory (borrowed "
     "segments granted), before it maps it (widens a race for the regression tests)",
     EMA_RT_CFG(debug_grow_delay), &ema__config_uint},
    {"LOG_LEVEL", "warn", "log level: error, warn, info, debug or trace",
     EMA_RT_CFG(log_level), &ema_level_parser},
    EMA_CONFIG_TABLE_END};

/* Every module's table and where its values go in the world: init reads
 * them, ema_config_print() prints them, the typo check knows their names. */
static const struct {
    const ema_config_field_t *table;
    size_t                    offset;
} ema_config_modules[] = {
    {ema__runtime_config_table, offsetof(ema__world_t, cfg)},
    {ema__boot_config_table, offsetof(ema__world_t, boot.cfg)},
    {ema__xport_config_table, offsetof(ema__world_t, xp.cfg)},
    {ema__progress_config_table, offsetof(ema__world_t, progress.cfg)},
    {ema__topo_config_table, offsetof(ema__world_t, topo_cfg)},
    {ema__pool_config_table, offsetof(ema__world_t, pool.cfg)},
};
#define EMA_NMODULES (sizeof(ema_config_modules) / sizeof(ema_config_modules[0]))

static ema__world_t ema_world;

static ema_status_t runtime_read_config(ema__world_t *w, const ema_init_params_t *params)
{
    const ema_config_field_t *tables[EMA_NMODULES + 1];
    const char *skip[4];
    size_t nskip = 0;
    ema_status_t status = EMA_SUCCESS;

    /* A field set in @params overrides its variable, which is then not read
     * at all: a bad value there fails nothing (ema.h). */
    if (params != NULL) {
        if (params->field_mask & EMA_INIT_PARAM_FIELD_MEMORY_KIND) {
            skip[nskip++] = "MEMORY_KIND";
        }
        if (params->field_mask & EMA_INIT_PARAM_FIELD_DEVICE_MEMORY) {
            skip[nskip++] = "DEVICE_MEMORY";
        }
        if (params->field_mask & EMA_INIT_PARAM_FIELD_SEGMENT_SIZE) {
            skip[nskip++] = "SEGMENT_SIZE";
        }
    }
    skip[nskip] = NULL;
    /* every table, so that every bad variable is reported in one run */
    for (size_t m = 0; m < EMA_NMODULES; m++) {
        if (ema__config_read_skip(ema_config_modules[m].table,
                                  (char *)w + ema_config_modules[m].offset,
                                  skip) != EMA_SUCCESS) {
            status = EMA_ERR_INVALID_PARAM;
        }
        tables[m] = ema_config_modules[m].table;
    }
    tables[EMA_NMODULES] = NULL;
    ema__log_level = (ema_log_level_t)w->cfg.log_level;
    ema__config_warn_unknown(tables); /* a misspelt name too, in the same run */
    if (status != EMA_SUCCESS) {
        return status;
    }

    if (params != NULL) {
        if (params->field_mask & EMA_INIT_PARAM_FIELD_MEMORY_KIND) {
            w->cfg.memory_kind = params->memory_kind;
        }
        if (params->field_mask & EMA_INIT_PARAM_FIELD_DEVICE_MEMORY) {
            w->cfg.device_memory = params->device_memory;
        }
        if (params->field_mask & EMA_INIT_PARAM_FIELD_SEGMENT_SIZE) {
            w->cfg.segment_size = params->segment_size;
        }
    }
    return EMA_SUCCESS;
}

ema__spill_tier_t ema__runtime_spill_tier(const ema__pool_config_t *cfg, ema_memory_kind_t kind)
{
    if (!cfg->spill) {
        return EMA_SPILL_TIER_NONE;
    }
    if (kind != EMA_MEMORY_KIND_CUDA) {
        return EMA_SPILL_TIER_HOST;
    }
    return cfg->cuda_spill ? EMA_SPILL_TIER_CUDA_HOST : EMA_SPILL_TIER_NONE;
}

/*
 * The spill tier (w->spill), or none.  A spilled segment is mapped into the
 * window's range.  On the host kind the tier is a host arena: address
 * space until a window spills into it.  On the cuda kind the range is a
 * CUDA VMM reservation, so only VMM memory goes there: with
 * EMA_CUDA_SPILL=y (experimental) a cuda arena of pinned host memory, all
 * of it allocated now; where the driver cannot make it, no spill tier.
 */
static ema_status_t runtime_spill_create(ema__world_t *w, const ema__mem_ops_t *ops)
{
    ema__spill_tier_t tier = ema__runtime_spill_tier(&w->pool.cfg, ops->kind);
    const ema__mem_ops_t *spill_ops = &ema__mem_host_ops;
    size_t size = w->pool.cfg.spill_size;
    ema_status_t status;

    if (tier == EMA_SPILL_TIER_NONE) {
        if (w->pool.cfg.spill) {
            ema_info("EMA_SPILL=host on the cuda memory kind: no spill tier unless "
                     "EMA_CUDA_SPILL=y (which pins it at ema_init)");
        }
        w->pool.cfg.spill = 0;
        return EMA_SUCCESS;
    }
    if (size < w->arena->seg_size) {
        ema_error("EMA_SPILL_SIZE %zu is smaller than one segment (%zu); set EMA_SPILL=none "
                  "for no spill tier", size, w->arena->seg_size);
        return EMA_ERR_INVALID_PARAM;
    }
    if (tier == EMA_SPILL_TIER_CUDA_HOST) {
#ifdef HAVE_CUDA
        spill_ops = &ema__mem_cuda_ops;
#endif
        /* Pinned when made: the node's ranks together must fit what the
         * host can give now, or the OOM killer, not cuMemCreate, answers. */
        size_t avail = ema__mem_host_available();
        size_t nlocal = (w->boot.local_size > 0) ? (size_t)w->boot.local_size : 1;
        if (avail != 0 && size / w->arena->seg_size * w->arena->seg_size > avail / nlocal) {
            ema_error("EMA_CUDA_SPILL=y pins each rank's EMA_SPILL_SIZE (%zu bytes) of host "
                      "memory at ema_init: %zu ranks here need more than the %zu bytes "
                      "available (MemAvailable): lower EMA_SPILL_SIZE", size, nlocal, avail);
            return EMA_ERR_NO_MEMORY;
        }
    }
    status = ema__mem_arena_create(spill_ops, size, w->arena->seg_size, w->arena->device,
                                   (tier == EMA_SPILL_TIER_CUDA_HOST) ? EMA_MEM_ARENA_HOST_NUMA
                                                                      : 0,
                                   &w->spill);
    if (status == EMA_ERR_UNSUPPORTED && tier == EMA_SPILL_TIER_CUDA_HOST) {
        ema_info("EMA_CUDA_SPILL=y: the CUDA driver cannot map host memory for the GPU through "
                 "VMM here (needs a 12.2+ driver; EMA_LOG_LEVEL=debug says why): no spill tier");
        w->spill          = NULL;
        w->pool.cfg.spill = 0;
        return EMA_SUCCESS;
    }
    if (status != EMA_SUCCESS) {
        ema_error("the spill tier (EMA_SPILL_SIZE %zu bytes of address space) could not be "
                  "made: %s; lower EMA_SPILL_SIZE or set EMA_SPILL=none", size,
                  ema_strerror(status));
        w->spill = NULL;
        return status;
    }
    if (tier == EMA_SPILL_TIER_CUDA_HOST) {
        ema_info("EMA_CUDA_SPILL=y: a spill tier of %zu bytes of pinned host "
                 "memory, mapped for GPU %d", w->spill->capacity, w->arena->device);
    }
    return EMA_SUCCESS;
}

static void runtime_topo_cleanup(ema__world_t *w)
{
    if (w->topo != NULL) {
        ema__topo_destroy(w->topo);
    }
    free(w->gpu_of_rank);
    free(w->numa_of_rank);
    w->topo         = NULL;
    w->gpu_of_rank  = NULL;
    w->numa_of_rank = NULL;
}

static ema_status_t runtime_topo_setup(ema__world_t *w)
{
    int shared = 0;

    /* unknown topology: ranks may share the GPUs the driver shows */
    w->gpu_shared = w->boot.size > 1;
    if (ema__topo_load(&w->topo) != EMA_SUCCESS) {
        ema_warn("no topology (hwloc failed): lenders are ordered by lendable memory only");
        w->topo = NULL;
        return EMA_SUCCESS;
    }
    w->gpu_of_rank  = calloc((size_t)w->boot.size, sizeof(int));
    w->numa_of_rank = calloc((size_t)w->boot.size, sizeof(int));
    if (w->gpu_of_rank == NULL || w->numa_of_rank == NULL) {
        runtime_topo_cleanup(w);
        return EMA_ERR_NO_MEMORY;
    }
    ema_status_t status = ema__topo_map_ranks(w->topo, &w->topo_cfg, w->boot.size,
                                              w->gpu_of_rank, &shared);
    if (status != EMA_SUCCESS) {
        runtime_topo_cleanup(w);
        return status;
    }
    w->gpu_shared = shared;
    if (shared && w->boot.rank == 0) {
        ema_info("several ranks share a GPU, each with its own EMA_DEVICE_MEMORY");
    }
    return EMA_SUCCESS;
}

/* Every rank's NUMA node, once the world is connected. */
static ema_status_t runtime_topo_exchange(ema__world_t *w)
{
    void **blobs;
    size_t *lens;
    int32_t numa = (w->topo != NULL) ? ema__topo_my_numa(w->topo) : -1;

    if (w->topo == NULL) {
        return EMA_SUCCESS;
    }
    ema_status_t status = ema__xport_allgather(&w->xp, &numa, sizeof(numa), &blobs, &lens);
    if (status != EMA_SUCCESS) {
        return status;
    }
    for (int r = 0; r < w->boot.size; r++) {
        int32_t v = -1;
        if (lens[r] == sizeof(v)) {
            memcpy(&v, blobs[r], sizeof(v));
        }
        w->numa_of_rank[r] = v;
    }
    ema__xport_free_blobs(&w->xp, blobs, lens);
    w->pool.topo         = w->topo;
    w->pool.gpu_of_rank  = w->gpu_of_rank;
    w->pool.numa_of_rank = w->numa_of_rank;
    return EMA_SUCCESS;
}

static ema_status_t runtime_check_params(const ema_init_params_t *params)
{
    const uint64_t known = EMA_INIT_PARAM_FIELD_MEMORY_KIND |
                           EMA_INIT_PARAM_FIELD_DEVICE_MEMORY |
                           EMA_INIT_PARAM_FIELD_SEGMENT_SIZE;
    if (params == NULL) {
        return EMA_SUCCESS;
    }
    /* logged as ema_init's other parameter errors are: a failed ema_init
     * is rare and fatal to most programs, so the line costs nothing */
    if (params->field_mask & ~known) {
        ema_error("ema_init: unknown field_mask bits 0x%" PRIx64,
                  (uint64_t)(params->field_mask & ~known));
        return EMA_ERR_INVALID_PARAM;
    }
    if ((params->field_mask & EMA_INIT_PARAM_FIELD_MEMORY_KIND) &&
        (params->memory_kind < EMA_MEMORY_KIND_AUTO || params->memory_kind > EMA_MEMORY_KIND_CUDA)) {
        ema_error("ema_init: memory_kind %d is not an ema_memory_kind_t", (int)params->memory_kind);
        return EMA_ERR_INVALID_PARAM;
    }
    if ((params->field_mask & EMA_INIT_PARAM_FIELD_DEVICE_MEMORY) && params->device_memory == 0) {
        ema_error("ema_init: device_memory is 0");
        return EMA_ERR_INVALID_PARAM;
    }
    return EMA_SUCCESS;
}

/*
 * Sizes that depend on the memory kind, checked before anything is created:
 * a rank's memory of more than EMA_MEM_MAX_SEGS segments (the pool counts
 * them in 32 bits), and a host-kind memory larger than the machine's.  The
 * check is per rank against the whole machine (or its cgroup's limit); the
 * ranks' sum once every rank's is known (ema__win_ctx_check, in ema_modex).
 * The spill tier is address space until a window spills into it, never
 * faulted in ahead, so only its segment count is checked.
 */
static ema_status_t ema_check_sizes(const ema__world_t *w, const ema__mem_ops_t *ops,
                                    const ema_init_params_t *params)
{
    int by_params = params != NULL && (params->field_mask & EMA_INIT_PARAM_FIELD_DEVICE_MEMORY);
    const char *cap_name = by_params ? "device_memory (ema_init_params_t)" : "EMA_DEVICE_MEMORY";
    int seg_by_params = params != NULL && (params->field_mask & EMA_INIT_PARAM_FIELD_SEGMENT_SIZE);
    const char *seg_name = seg_by_params ? "segment_size (ema_init_params_t)" : "EMA_SEGMENT_SIZE";
    size_t seg = w->cfg.segment_size ? w->cfg.segment_size : ops->default_segment_size;
    size_t cap = w->cfg.device_memory;

    /* as ema__mem_arena_create checks them, but naming the setting */
    if (seg % ops->granularity != 0) {
        ema_error("%s %zu is not a multiple of the %s kind's granularity (%zu)", seg_name, seg,
                  ops->name, ops->granularity);
        return EMA_ERR_INVALID_PARAM;
    }
    if (cap < seg) {
        ema_error("%s %zu is smaller than one segment (%s %zu)", cap_name, cap,
                  w->cfg.segment_size ? seg_name : "the kind's default segment size", seg);
        return EMA_ERR_INVALID_PARAM;
    }
    if (seg != 0 && cap / seg > EMA_MEM_MAX_SEGS) {
        ema_error("%s %zu is %zu segments of %zu bytes, more than the %u a rank's memory may "
                  "have: raise EMA_SEGMENT_SIZE", cap_name, cap, cap / seg, seg,
                  (unsigned)EMA_MEM_MAX_SEGS);
        return EMA_ERR_INVALID_PARAM;
    }
    if (ema__runtime_spill_tier(&w->pool.cfg, ops->kind) != EMA_SPILL_TIER_NONE && seg != 0 &&
        w->pool.cfg.spill_size / seg > EMA_MEM_MAX_SEGS) {
        ema_error("EMA_SPILL_SIZE %zu is %zu segments of %zu bytes, more than the %u a spill "
                  "tier may have: raise EMA_SEGMENT_SIZE or lower EMA_SPILL_SIZE",
                  w->pool.cfg.spill_size, w->pool.cfg.spill_size / seg, seg,
                  (unsigned)EMA_MEM_MAX_SEGS);
        return EMA_ERR_INVALID_PARAM;
    }
    if (ops->kind == EMA_MEMORY_KIND_HOST) {
        const char *what;
        size_t limit = ema__mem_host_limit(&what);
        if (cap > limit) {
            ema_error("%s %zu (%.1f GiB) is more than the %zu bytes (%.1f GiB) of %s: a "
                      "host-kind rank's memory is host memory, faulted in at start", cap_name,
                      cap, (double)cap / (1 << 30), limit, (double)limit / (1 << 30), what);
            return EMA_ERR_NO_MEMORY;
        }
        size_t avail = ema__mem_host_available();
        if (avail != 0 && cap > avail) {
            ema_warn("%s %zu (%.1f GiB) is more than the %zu bytes (%.1f GiB) of memory "
                     "available now (MemAvailable): faulting it in may swap, or wake the OOM "
                     "killer", cap_name, cap, (double)cap / (1 << 30), avail,
                     (double)avail / (1 << 30));
        }
    }
    return EMA_SUCCESS;
}

/* The modex blob: [u32 address length][UCX worker address][win layer blob]. */
/* The launcher reports a lost process (PMIx's thread). */
static void runtime_peer_lost(void *arg, int rank)
{
    ema__xport_mark_lost(arg, rank, "the launcher reports it gone");
}

static ema_status_t runtime_modex(ema__world_t *w)
{
    void *wblob = NULL, **blobs = NULL, **addrs = NULL, **wblobs = NULL;
    size_t wlen = 0, *lens = NULL, *wlens = NULL;
    ema_status_t status;
    char *blob;
    uint32_t alen = (uint32_t)w->xp.address_len;

    status = ema__win_ctx_blob(&w->win, &wblob, &wlen);
    if (status != EMA_SUCCESS) {
        return status;
    }
    size_t len = sizeof(alen) + alen + wlen;
    blob = malloc(len);
    if (blob == NULL) {
        free(wblob);
        return EMA_ERR_NO_MEMORY;
    }
    memcpy(blob, &alen, sizeof(alen));
    memcpy(blob + sizeof(alen), w->xp.address, alen);
    memcpy(blob + sizeof(alen) + alen, wblob, wlen);
    free(wblob);

    status = ema__boot_exchange(&w->boot, blob, len, &blobs, &lens);
    free(blob);
    if (status != EMA_SUCCESS) {
        return status;
    }
    addrs  = calloc((size_t)w->boot.size, sizeof(*addrs));
    wblobs = calloc((size_t)w->boot.size, sizeof(*wblobs));
    wlens  = calloc((size_t)w->boot.size, sizeof(*wlens));
    if (addrs == NULL || wblobs == NULL || wlens == NULL) {
        status = EMA_ERR_NO_MEMORY;
        goto out;
    }
    for (int r = 0; r < w->boot.size; r++) {
        memcpy(&alen, blobs[r], sizeof(alen));
        if (lens[r] < sizeof(alen) + alen) {
            ema_error("malformed modex entry from rank %d", r);
            status = EMA_ERR_BOOTSTRAP;
            goto out;
        }
        addrs[r]  = (char *)blobs[r] + sizeof(alen);
        wblobs[r] = (char *)blobs[r] + sizeof(alen) + alen;
        wlens[r]  = lens[r] - sizeof(alen) - alen;
    }
    /* settings that must agree first, while no rank has connected: then
     * every rank fails alike, and none fails connecting to one gone */
    status = ema__win_ctx_check(&w->win, wblobs, wlens);
    if (status == EMA_SUCCESS) {
        status = ema__xport_connect(&w->xp, addrs);
    }
    if (status == EMA_SUCCESS) {
        status = ema__win_ctx_connect(&w->win, wblobs, wlens);
    }
    if (status == EMA_SUCCESS) {
        /* a peer's death, from its pid (one node) or the launcher */
        for (int r = 0; r < w->boot.size; r++) {
            ema__xport_peers_watch(&w->xp, r, w->win.exports[EMA_TIER_DEVICE][r].pid);
        }
        ema__boot_watch(&w->boot, runtime_peer_lost, &w->xp);
    }
out:
    free(addrs);
    free(wblobs);
    free(wlens);
    ema__boot_free_blobs(&w->boot, blobs, lens);
    return status;
}

EMA_EXPORT ema_status_t ema_init(const ema_init_params_t *params)
{
    ema__world_t *w = &ema_world;
    const ema__mem_ops_t *ops;
    ema_status_t status;
    int expected = EMA_STATE_NONE;

    if (!atomic_compare_exchange_strong(&ema__state, &expected, EMA_STATE_INITING)) {
        return EMA_ERR_STATE; /* initialised, finalised, or another thread inside */
    }
    status = runtime_check_params(params);
    if (status != EMA_SUCCESS) {
        goto err_state;
    }
    memset(w, 0, sizeof(*w));
    status = runtime_read_config(w, params);
    if (status != EMA_SUCCESS) {
        goto err_state;
    }

    status = ema__boot_init(&w->boot);
    if (status != EMA_SUCCESS) {
        /* abandon: PMIx may be up (a failed PMIx_Get, several nodes), and
         * must then be closed at exit (boot_fini); no exchange (singleton) */
        goto err_boot;
    }
    ema__log_set_rank(w->boot.rank);

    ops = ema__mem_ops_get((ema_memory_kind_t)w->cfg.memory_kind);
    if (ops == NULL) {
        ema_error("memory kind '%s' is not supported by this build (configure --with-cuda)",
                  ema__mem_kind_name((ema_memory_kind_t)w->cfg.memory_kind));
        status = EMA_ERR_UNSUPPORTED;
        goto err_boot;
    }
    if (!ops->usable()) {
        ema_error("memory kind '%s' is not usable here (no GPU or driver)", ops->name);
        status = EMA_ERR_UNSUPPORTED;
        goto err_boot;
    }
    status = ema_check_sizes(w, ops, params);
    if (status != EMA_SUCCESS) {
        goto err_boot;
    }
    /* Which GPU each rank uses, and where ranks sit, for the lender order.
     * One node: world rank r is local rank r. */
    status = runtime_topo_setup(w);
    if (status != EMA_SUCCESS) {
        goto err_boot;
    }
    int device = (w->gpu_of_rank != NULL && w->gpu_of_rank[w->boot.rank] >= 0)
                     ? w->gpu_of_rank[w->boot.rank]
                     : w->boot.local_rank;
    status = ema__mem_arena_create(ops, w->cfg.device_memory,
                                   w->cfg.segment_size ? w->cfg.segment_size
                                                       : ops->default_segment_size,
                                   device, w->cfg.hugepages ? EMA_MEM_ARENA_HUGEPAGES : 0,
                                   &w->arena);
    if (status != EMA_SUCCESS) {
        goto err_topo;
    }
    /* A reserve at or above the capacity lends nothing (ema(7)); as the
     * capacity, its count of segments (a uint32_t in the pool, added to
     * the withheld ones) cannot wrap to a small one, which lent everything
     * (EMA_LEND_RESERVE=8192T did, with 2 MiB segments). */
    if (w->pool.cfg.lend_reserve > w->arena->capacity) {
        w->pool.cfg.lend_reserve = w->arena->capacity;
    }

    status = runtime_spill_create(w, ops);
    if (status != EMA_SUCCESS) {
        goto err_arena;
    }

    /* UCX turns cuda_ipc's zero-copy GET off where it sees no NVLink, as
     * between ranks that share one GPU, and gets then run at a fraction of
     * a copy's speed: turn it on there, unless the user set it. */
    if (ops->kind == EMA_MEMORY_KIND_CUDA && w->gpu_shared &&
        getenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY") == NULL) {
        setenv("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "y", 0);
        ema_debug("ranks share a GPU: UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y");
    }
    w->xp.request_size = sizeof(struct ema_request);
    status = ema__xport_create(&w->xp, w->boot.rank, w->boot.size);
    if (status != EMA_SUCCESS) {
        goto err_spill;
    }
    status = ema__win_ctx_init(&w->win, &w->xp, w->arena, w->spill, w->boot.rank,
                               w->boot.size);
    if (status != EMA_SUCCESS) {
        goto err_xport;
    }
    w->win.no_direct = !w->cfg.host_direct;
    w->win.migrate_alias = w->cfg.migrate_alias;
    w->win.cpath.cfg = w->cfg.cuda_path;
    w->win.debug_link_delay_us = w->cfg.debug_link_delay;
    w->win.debug_grow_delay_us = w->cfg.debug_grow_delay;
    status = runtime_modex(w);
    if (status != EMA_SUCCESS) {
        goto err_win;
    }
    status = ema__pool_init(&w->pool, &w->win, w->spill);
    if (status != EMA_SUCCESS) {
        goto err_win;
    }
    status = runtime_topo_exchange(w);
    if (status != EMA_SUCCESS) {
        goto err_pool;
    }
    status = ema__progress_start(&w->progress, &w->xp);
    if (status != EMA_SUCCESS) {
        goto err_pool;
    }
    /* recalls run on it: an acquire may wait for them (ema_win_hold) */
    w->win.progress_thread = w->progress.running;
    /* The cuda kind: probe each peer through UCX and EMA's direct path,
     * choose (EMA_CUDA_PATH), and warn where no path is zero-copy. */
    status = ema__win_cuda_path_select(&w->win);
    if (status != EMA_SUCCESS) {
        ema__progress_stop(&w->progress);
        goto err_pool;
    }
    ema__pool_start(&w->pool);
    ema__win_world = &w->win;
    ema_debug("world of %d ready: %s memory, %zu bytes in segments of %zu, ucx %s",
              w->boot.size, ops->name, w->arena->capacity, w->arena->seg_size,
              w->xp.transports);
    atomic_store(&ema__state, EMA_STATE_READY);
    return EMA_SUCCESS;

err_pool:
    ema__xport_am_close(&w->xp); /* as ema_finalize */
    ema__pool_cleanup(&w->pool);
err_win:
    ema__xport_am_close(&w->xp);
    ema__win_ctx_cleanup(&w->win);
err_xport:
    /* the PMIx handler's argument is &w->xp: off before xp goes */
    ema__boot_unwatch(&w->boot);
    ema__xport_destroy(&w->xp);
err_spill:
    ema__mem_arena_destroy(w->spill);
    w->spill = NULL;
err_arena:
    ema__mem_arena_destroy(w->arena);
    w->arena = NULL;
err_topo:
    runtime_topo_cleanup(w);
err_boot:
    ema__boot_abandon(&w->boot, status);
err_state:
    atomic_store(&ema__state, EMA_STATE_NONE);
    return status;
}

EMA_EXPORT ema_status_t ema_finalize(void)
{
    ema__world_t *w = &ema_world;
    ema_status_t status = ema__check_ready();
    if (status != EMA_SUCCESS) {
        return status;
    }
    /* EMA_STATS: the memory as the application left it, before the
     * windows it did not free go */
    if (w->pool.cfg.stats) {
        ema__pool_print_stats(&w->pool, stderr);
    }
    /* Windows the application did not free: free them collectively, in the
     * order every rank created them (the list is newest first). */
    while (w->win.wins != NULL) {
        ema_win_h last = w->win.wins;
        while (last->next != NULL) {
            last = last->next;
        }
        ema_status_t st = ema_win_free(last);
        if (st != EMA_SUCCESS) {
            /* a peer is gone or the transport failed: the others cannot be
             * freed collectively either; the process's exit releases them */
            ema_error("ema_finalize: freeing window %u failed (%s); leaving the rest",
                      last->id, ema_strerror(st));
            break;
        }
    }
    status = ema__xport_flush(&w->xp);
    if (status == EMA_SUCCESS) {
        status = ema__xport_barrier(&w->xp, EMA_WAIT_QUICK);
    }
    atomic_store(&ema__state, EMA_STATE_FINALIZED);
    ema__win_world = NULL;
    ema__progress_stop(&w->progress);
    ema__boot_unwatch(&w->boot);
    /* a peer's late message (after a window free that failed, say) must not
     * reach the pool's or the windows' state once they are gone: the
     * endpoints' teardown in ema__xport_destroy still progresses the worker */
    ema__xport_am_close(&w->xp);
    ema__pool_cleanup(&w->pool);
    ema__win_ctx_cleanup(&w->win);
    ema__xport_destroy(&w->xp);
    ema__mem_arena_destroy(w->arena);
    ema__mem_arena_destroy(w->spill);
    w->arena = NULL;
    w->spill = NULL;
    runtime_topo_cleanup(w);
    ema__boot_finalize(&w->boot);
    return status;
}

EMA_EXPORT ema_status_t ema_world_rank(int *rank_p)
{
    ema_status_t status = ema__check_ready_out(rank_p);
    if (status == EMA_SUCCESS) {
        *rank_p = ema_world.boot.rank;
    }
    return status;
}

EMA_EXPORT ema_status_t ema_world_size(int *size_p)
{
    ema_status_t status = ema__check_ready_out(size_p);
    if (status == EMA_SUCCESS) {
        *size_p = ema_world.boot.size;
    }
    return status;
}

EMA_EXPORT ema_status_t ema_barrier(void)
{
    ema_status_t status = ema__check_ready();
    if (status != EMA_SUCCESS) {
        return status;
    }
    /* Without a progress thread only the application runs migrations;
     * in a barrier it cannot call ema_progress, so the barrier's waits run
     * them (it holds no lock of EMA's here). */
    return ema__xport_barrier(&ema_world.xp,
                              ema_world.progress.running ? EMA_WAIT_QUICK : EMA_WAIT_LONG);
}

EMA_EXPORT ema_status_t ema_progress(void)
{
    ema_status_t status = ema__check_ready();
    if (status != EMA_SUCCESS) {
        return status;
    }
    /* an application thread on the worker, as in a wait */
    ema__xport_app_enter(&ema_world.xp);
    unsigned n = ema__progress_once(&ema_world.progress);
    ema__xport_app_leave(&ema_world.xp);
    return n ? EMA_SUCCESS : EMA_INPROGRESS;
}

EMA_EXPORT ema_status_t ema_config_print(FILE *stream)
{
    if (stream == NULL) {
        return EMA_ERR_INVALID_PARAM;
    }
    ema__world_t *tmp = calloc(1, sizeof(*tmp)); /* the world's config fields, not ours */
    if (tmp == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    /* Values as the environment sets them now; a bad value shows its default
     * and is reported. */
    for (size_t m = 0; m < EMA_NMODULES; m++) {
        void *opts = (char *)tmp + ema_config_modules[m].offset;
        ema__config_read(ema_config_modules[m].table, opts);
        ema__config_print(ema_config_modules[m].table, opts, stream);
    }
    free(tmp);
    return EMA_SUCCESS;
}

/* The topology part of ema_info_print.  Works before ema_init: then no
 * world exists, so show the local ranks a launch would have (EMA_GPU_MAP's
 * length, else one per visible GPU).  EMA_ERR_INVALID_PARAM where a
 * topology setting (EMA_GPU_MAP) is malformed or does not fit the local
 * ranks, as ema_init would fail: the rest is printed, without the map of
 * ranks to GPUs, and the log says why (ema_info -t exited 0 so). */
static ema_status_t runtime_info_topology(FILE *stream, int ready)
{
    ema_status_t status = EMA_SUCCESS;
    ema__topo_config_t cfg;
    ema__topo_t *topo;
    int nranks, *gpu_of_rank;

    if (ema__topo_load(&topo) != EMA_SUCCESS) {
        fprintf(stream, "# topology:      (hwloc failed, see the log)\n");
        return EMA_SUCCESS;
    }
    if (ema__config_read(ema__topo_config_table, &cfg) != EMA_SUCCESS) {
        cfg.gpu_map = "";
        status      = EMA_ERR_INVALID_PARAM;
    }
    nranks = ready ? ema_world.boot.local_size : ema__topo_default_nranks(topo, &cfg);
    gpu_of_rank = calloc((size_t)nranks, sizeof(*gpu_of_rank));
    if (!ready) {
        fprintf(stream, "# topology:      before ema_init, %d local rank%s assumed\n", nranks,
                nranks == 1 ? "" : "s");
    }
    ema_status_t mapped = (gpu_of_rank == NULL)
                              ? EMA_ERR_NO_MEMORY
                              : ema__topo_map_ranks(topo, &cfg, nranks, gpu_of_rank, NULL);
    if (mapped == EMA_SUCCESS) {
        ema__topo_print(topo, stream, nranks, gpu_of_rank, NULL);
    } else {
        ema__topo_print(topo, stream, 0, NULL, NULL);
        if (mapped == EMA_ERR_INVALID_PARAM) {
            status = mapped;
        }
    }
    free(gpu_of_rank);
    ema__topo_destroy(topo);
    return status;
}

EMA_EXPORT ema_status_t ema_info_print(FILE *stream, unsigned flags)
{
    ema__world_t *w = &ema_world;
    int ready = (ema__check_ready() == EMA_SUCCESS);

    /* Bits 4-7 are reserved for later parts, so that EMA_INFO_ALL keeps
     * meaning everything; flags that name no part would print nothing and
     * succeed, which hides a caller's mistake. */
    const unsigned parts = EMA_INFO_VERSION | EMA_INFO_TOPOLOGY | EMA_INFO_WORLD |
                           EMA_INFO_TRANSPORT;

    if (stream == NULL || (flags & ~(unsigned)EMA_INFO_ALL) || !(flags & parts)) {
        return EMA_ERR_INVALID_PARAM;
    }
    if (flags & EMA_INFO_VERSION) {
        unsigned maj, min, rel;
        ucp_get_version(&maj, &min, &rel);
        fprintf(stream, "# ema version:   %s\n", ema_version_string());
        fprintf(stream, "# ucx version:   %u.%u.%u\n", maj, min, rel);
#ifdef HAVE_CUDA
        fprintf(stream, "# cuda kind:     built\n");
#else
        fprintf(stream, "# cuda kind:     not built (configure --with-cuda)\n");
#endif
    }
    ema_status_t status = EMA_SUCCESS;
    if (flags & EMA_INFO_TOPOLOGY) {
        status = runtime_info_topology(stream, ready);
    }
    if (flags & EMA_INFO_WORLD) {
        if (!ready) {
            fprintf(stream, "# world:         (not initialized)\n");
        } else {
            fprintf(stream, "# world:         %d rank%s, this is rank %d (%s)\n", w->boot.size,
                    w->boot.size == 1 ? "" : "s", w->boot.rank,
                    w->boot.singleton ? "singleton, no launcher" : "PMIx");
            fprintf(stream, "# memory kind:   %s\n", w->arena->ops->name);
            fprintf(stream, "# capacity:      %zu bytes in %u segments of %zu bytes%s\n",
                    w->arena->capacity, w->arena->pool.nsegs, w->arena->seg_size,
                    w->arena->huge ? ", on 2 MiB huge pages" : "");
            fprintf(stream, "# progress:      %s\n",
                    w->progress.running ? "thread" : "application (ema_progress)");
        }
    }
    if (flags & EMA_INFO_TRANSPORT) {
        if (!ready) {
            fprintf(stream, "# transports:    (not initialized)\n");
        } else {
            fprintf(stream, "# transports:    %s\n",
                    w->xp.transports[0] ? w->xp.transports : "(none reported)");
            ema__win_cpath_print(&w->win, stream);
        }
    }
    return status;
}
