/*
 * The cuda memory kind: a rank's arena is device memory made of CUDA VMM
 * allocations, one per segment, mapped side by side into one reserved
 * virtual range.  Each segment is exported ahead of time as a POSIX fd, so
 * lending one costs the borrower only an import and a map:
 *
 *   lender (arena_create)             borrower (map)
 *   1. cuMemCreate(seg_size)
 *   2. cuMemMap at base + i*seg_size
 *   3. cuMemExportToShareableHandle
 *      -> fd, kept open                4. pidfd_getfd(lender pid, fd)
 *                                      5. cuMemImportFromShareableHandle
 *                                      6. cuMemMap + cuMemSetAccess at the
 *                                         window address (the import is
 *                                         kept: cuda_import)
 *
 * The driver is never linked: libcuda.so.1 is opened on first use and every
 * entry point is resolved through cuGetProcAddress, so a CUDA build runs on
 * a machine with no GPU or driver (the kind is then simply not usable).
 * cuda.h supplies the types only.
 *
 * Every op makes the arena's primary context current first: the ops are
 * called from the application threads and from the progress thread, and
 * cuCtxSetCurrent is a thread-local store.
 *
 * With EMA_MEM_ARENA_HOST_NUMA (the spill tier, EMA_CUDA_SPILL=y) the
 * segments are VMM allocations of pinned host memory instead (CUDA 12.2+):
 * on the GPU's host NUMA node, else on the host without a node where the
 * driver allows only that.  They are mapped, and mapped into windows, with
 * device access only, so kernels read them through the window's range; the
 * copies reach them by unified addressing, as device memory.  Such an
 * arena is never lent: its segments are exported only where the driver
 * allows it, and a peer reaches them through UCX.
 */
#define _GNU_SOURCE
#include "cuda_priv.h"

#include "util/clock.h"

#include <signal.h>
#include <stdatomic.h>

/* --- the arena ------------------------------------------------------------ */

/* The arena's copy streams. */
enum {
    CUDA_STREAM_MIGRATE, /* for copy: migrations */
    CUDA_STREAM_RMA,     /* for rma_copy: put and get on the direct path, never
                            behind a migration's copies */
    CUDA_NSTREAMS
};

typedef struct {
    CUdevice                      dev;
    CUcontext                     ctx;      /* the device's primary context, retained */
    CUstream                      streams[CUDA_NSTREAMS];
    size_t                        gran;     /* the real VMM granularity */
    CUmemAllocationHandleType     htypes;   /* requested at cuMemCreate */
    CUmemLocationType             loc_type; /* where the segments live: DEVICE, or
                                               HOST_NUMA / HOST (EMA_MEM_ARENA_HOST_NUMA) */
    int                           loc_id;   /* the device, or the host NUMA node */
    uint32_t                      nsegs;
    uint32_t                      ncreated; /* segments with a handle, mapped at base */
    CUmemGenericAllocationHandle *handles;
    int                          *fds;      /* exported POSIX fds, -1 if none */
    /* Peers' segments imported so far, each kept until destroy (see
     * cuda_import): [nimports] of [cap_imports], under import_lock. */
    struct cuda_import           *imports;
    uint32_t                      nimports, cap_imports;
    pthread_mutex_t               import_lock;
    /* At debug level: a migration's copies timed on the GPU (cuda_copy_timing_*) */
    CUevent                       dbg_ev[2];
    atomic_int                    dbg_armed; /* a thread times its copies */
    double                        dbg_t0;    /* when its first copy was queued */
} ema_cuda_arena_t;

typedef struct cuda_import {
    int32_t                      pid;    /* the peer */
    int64_t                      handle; /* its exported fd */
    CUmemGenericAllocationHandle h;      /* ours */
} cuda_import_t;

/* The alignment of every range segments are mapped in (the arena's own,
 * the windows', the mirrors'): a segment where the segment size is a
 * multiple of the granularity, so that each mapping is aligned alike;
 * else the granularity. */
static size_t cuda_seg_align(const ema__mem_arena_t *arena, const ema_cuda_arena_t *ca)
{
    return (ca->gran != 0 && arena->seg_size % ca->gran == 0) ? arena->seg_size : ca->gran;
}

static ema_status_t cuda_ctx_set(ema_cuda_arena_t *ca)
{
    CUresult res;
    EMA_CU_CALL(res, cuCtxSetCurrent, ca->ctx);
    return ema__cu_status(res);
}

static void cuda_access_desc(const ema_cuda_arena_t *ca, CUmemAccessDesc *acc)
{
    memset(acc, 0, sizeof(*acc));
    acc->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc->location.id   = (int)ca->dev;
    acc->flags         = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

/* cuMemMap + cuMemSetAccess of @h at @addr; undoes the map on failure. */
static ema_status_t cuda_map_handle(ema_cuda_arena_t *ca, void *addr, size_t len,
                                    CUmemGenericAllocationHandle h)
{
    CUdeviceptr ptr = (CUdeviceptr)(uintptr_t)addr;
    CUmemAccessDesc acc;
    CUresult res;

    EMA_CU_CALL(res, cuMemMap, ptr, len, 0, h, 0);
    if (res != CUDA_SUCCESS) {
        return ema__cu_status(res);
    }
    cuda_access_desc(ca, &acc);
    EMA_CU_CALL(res, cuMemSetAccess, ptr, len, &acc, 1);
    if (res != CUDA_SUCCESS) {
        ema__cu.cuMemUnmap(ptr, len);
        return ema__cu_status(res);
    }
    return EMA_SUCCESS;
}

static void cuda_prop(const ema_cuda_arena_t *ca, CUmemAllocationHandleType htypes,
                      CUmemAllocationProp *prop)
{
    memset(prop, 0, sizeof(*prop));
    prop->type                 = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type        = ca->loc_type;
    prop->location.id          = ca->loc_id;
    prop->requestedHandleTypes = htypes;
}

static int cuda_attr(ema_cuda_arena_t *ca, CUdevice_attribute attr)
{
    int v = 0;
    if (ema__cu.cuDeviceGetAttribute(&v, attr, ca->dev) != CUDA_SUCCESS) {
        return 0;
    }
    return v;
}

/* Create segment @i, map it at its place in the arena and export it. */
static ema_status_t cuda_seg_create(ema__mem_arena_t *arena, ema_cuda_arena_t *ca,
                                    uint32_t i)
{
    CUmemGenericAllocationHandle h;
    CUmemAllocationProp prop;
    ema_status_t status;
    CUresult res;
    int fd = -1;

    cuda_prop(ca, ca->htypes, &prop);
    res = ema__cu.cuMemCreate(&h, arena->seg_size, &prop, 0);
    if (res != CUDA_SUCCESS && (ca->htypes & CU_MEM_HANDLE_TYPE_FABRIC)) {
        /* Fabric handles need an IMEX channel; without one the driver
         * refuses them.  POSIX fds are all a single node needs. */
        ema_debug("cuMemCreate() with fabric handles failed (%s): using posix fds only",
                  ema__cu_errname(res));
        ca->htypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        cuda_prop(ca, ca->htypes, &prop);
        res = ema__cu.cuMemCreate(&h, arena->seg_size, &prop, 0);
    }
    if (res != CUDA_SUCCESS) {
        int host = ca->loc_type != CU_MEM_LOCATION_TYPE_DEVICE;
        ema_error("cuMemCreate(%zu) for %s segment %u of %u failed: %s%s", arena->seg_size,
                  host ? "host" : "device", i, ca->nsegs, ema__cu_errname(res),
                  (res != CUDA_ERROR_OUT_OF_MEMORY) ? ""
                  : host ? " (EMA_SPILL_SIZE exceeds the host memory the driver can pin)"
                         : " (EMA_DEVICE_MEMORY exceeds the free device memory)");
        return ema__cu_status(res);
    }
    status = cuda_map_handle(ca, (char *)arena->base + (size_t)i * arena->seg_size,
                             arena->seg_size, h);
    if (status != EMA_SUCCESS) {
        goto err_release;
    }
    if (ca->htypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        EMA_CU_CALL(res, cuMemExportToShareableHandle, &fd, h,
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (res != CUDA_SUCCESS) {
            status = ema__cu_status(res);
            goto err_unmap;
        }
        /* Keep it out of exec'd children; peers take it with pidfd_getfd. */
        fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    ca->handles[i] = h;
    ca->fds[i]     = fd;
    return EMA_SUCCESS;

err_unmap:
    ema__cu.cuMemUnmap((CUdeviceptr)(uintptr_t)((char *)arena->base +
                                               (size_t)i * arena->seg_size),
                      arena->seg_size);
err_release:
    ema__cu.cuMemRelease(h);
    return status;
}

static void cuda_arena_destroy(ema__mem_arena_t *arena)
{
    ema_cuda_arena_t *ca = arena->priv;

    if (ca == NULL) {
        return;
    }
    if (ca->ctx != NULL) {
        ema__cu.cuCtxSetCurrent(ca->ctx);
    }
    for (uint32_t i = 0; i < ca->ncreated; i++) {
        ema__cu.cuMemUnmap((CUdeviceptr)(uintptr_t)((char *)arena->base +
                                                   (size_t)i * arena->seg_size),
                          arena->seg_size);
        /* Peers' mappings of a lent segment keep its memory alive. */
        ema__cu.cuMemRelease(ca->handles[i]);
        if (ca->fds[i] >= 0) {
            close(ca->fds[i]);
        }
    }
    /* Peers' segments: the memory lives on while a mapping of ours does */
    for (uint32_t i = 0; i < ca->nimports; i++) {
        ema__cu.cuMemRelease(ca->imports[i].h);
    }
    ca->nimports = 0;
    if (arena->base != NULL) {
        ema__cu.cuMemAddressFree((CUdeviceptr)(uintptr_t)arena->base, arena->capacity);
        arena->base = NULL;
    }
    for (int i = 0; i < CUDA_NSTREAMS; i++) {
        if (ca->streams[i] != NULL) {
            ema__cu.cuStreamDestroy(ca->streams[i]);
        }
    }
    for (int i = 0; i < 2; i++) {
        if (ca->dbg_ev[i] != NULL) {
            ema__cu.cuEventDestroy(ca->dbg_ev[i]);
        }
    }
    if (ca->ctx != NULL) {
        ema__cu.cuDevicePrimaryCtxRelease(ca->dev);
    }
    free(ca->imports);
    pthread_mutex_destroy(&ca->import_lock);
    free(ca->handles);
    free(ca->fds);
    free(ca);
    arena->priv = NULL;
}

/* Whether segments of @seg_size can be created where @ca says (a trial
 * allocation of one granule, released at once); sets ca->gran. */
static ema_status_t cuda_loc_try(ema_cuda_arena_t *ca, size_t seg_size)
{
    CUmemGenericAllocationHandle h;
    CUmemAllocationProp prop;
    CUresult res;

    cuda_prop(ca, ca->htypes, &prop);
    res = ema__cu.cuMemGetAllocationGranularity(&ca->gran, &prop,
                                                CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (res == CUDA_SUCCESS && (ca->gran == 0 || seg_size % ca->gran != 0)) {
        ema_debug("host vmm memory (location type %d): granularity %zu does not divide the "
                  "segment size %zu", (int)ca->loc_type, ca->gran, seg_size);
        return EMA_ERR_UNSUPPORTED;
    }
    if (res == CUDA_SUCCESS) {
        res = ema__cu.cuMemCreate(&h, ca->gran, &prop, 0);
    }
    if (res != CUDA_SUCCESS) {
        ema_debug("host vmm memory (location type %d, id %d, handle types %#x): %s",
                  (int)ca->loc_type, ca->loc_id, (unsigned)ca->htypes, ema__cu_errname(res));
        return (res == CUDA_ERROR_OUT_OF_MEMORY) ? EMA_ERR_NO_MEMORY : EMA_ERR_UNSUPPORTED;
    }
    ema__cu.cuMemRelease(h);
    return EMA_SUCCESS;
}

/* The host NUMA node of the calling CPU, or 0. */
static int cuda_cpu_node(void)
{
    unsigned cpu = 0, node = 0;
    return (syscall(SYS_getcpu, &cpu, &node, NULL) == 0) ? (int)node : 0;
}

/*
 * EMA_MEM_ARENA_HOST_NUMA: where the driver can put host memory that the
 * device maps through VMM, nearest first:
 *   1. HOST_NUMA, on the GPU's NUMA node (else the calling CPU's), with
 *      POSIX fd handles, then without (CUDA 12.2+ drivers);
 *   2. HOST, no node and no handles (the driver's other host location).
 * EMA_ERR_UNSUPPORTED, reasons logged at debug level, where neither works.
 */
static ema_status_t cuda_host_location(ema_cuda_arena_t *ca, size_t seg_size)
{
    ema_status_t status = EMA_ERR_UNSUPPORTED;
    int numa = -1;

    if (ema__cu.version < 12020) {
        ema_debug("host vmm memory needs a CUDA 12.2 driver or newer, this one is %d.%d",
                  ema__cu.version / 1000, ema__cu.version % 1000 / 10);
        return EMA_ERR_UNSUPPORTED;
    }
    if (cuda_attr(ca, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)) {
        if (ema__cu.cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, ca->dev) !=
                CUDA_SUCCESS || numa < 0) {
            numa = cuda_cpu_node();
        }
        ca->loc_type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
        ca->loc_id   = numa;
        ca->htypes   = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        status = cuda_loc_try(ca, seg_size);
        if (status == EMA_ERR_UNSUPPORTED) {
            ca->htypes = CU_MEM_HANDLE_TYPE_NONE;
            status = cuda_loc_try(ca, seg_size);
        }
    } else {
        ema_debug("device %d reports no host NUMA vmm support", (int)ca->dev);
    }
    if (status == EMA_ERR_UNSUPPORTED) {
        ca->loc_type = CU_MEM_LOCATION_TYPE_HOST; /* handles must be none there */
        ca->loc_id   = 0;
        ca->htypes   = CU_MEM_HANDLE_TYPE_NONE;
        status = cuda_loc_try(ca, seg_size);
    }
    if (status == EMA_SUCCESS) {
        ema_debug("host vmm memory: location %s %d, handles %s",
                  ca->loc_type == CU_MEM_LOCATION_TYPE_HOST_NUMA ? "host numa node" : "host",
                  ca->loc_id, ca->htypes ? "posix fd" : "none");
    }
    return status;
}

static ema_status_t cuda_arena_create(ema__mem_arena_t *arena)
{
    ema_cuda_arena_t *ca;
    CUmemAllocationProp prop;
    CUdeviceptr base;
    ema_status_t status;
    CUresult res;
    int ordinal;

    if (!ema__cuda_usable()) {
        ema_error("memory kind 'cuda' is not usable here (no GPU or driver)");
        return EMA_ERR_UNSUPPORTED;
    }
    ca = calloc(1, sizeof(*ca));
    if (ca == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    arena->priv = ca;
    arena->fd   = -1;
    pthread_mutex_init(&ca->import_lock, NULL);
    ca->nsegs   = (uint32_t)(arena->capacity / arena->seg_size);
    ca->handles = calloc(ca->nsegs, sizeof(*ca->handles));
    ca->fds     = malloc(sizeof(*ca->fds) * ca->nsegs);
    if (ca->handles == NULL || ca->fds == NULL) {
        status = EMA_ERR_NO_MEMORY;
        goto err;
    }
    for (uint32_t i = 0; i < ca->nsegs; i++) {
        ca->fds[i] = -1;
    }

    /* arena->device is the local rank until a topology layer picks a GPU. */
    ordinal = (arena->device < 0 ? 0 : arena->device) % ema__cu.ndev;
    EMA_CU_CALL(res, cuDeviceGet, &ca->dev, ordinal);
    if (res != CUDA_SUCCESS) {
        status = ema__cu_status(res);
        goto err;
    }
    arena->device = ordinal;
    EMA_CU_CALL(res, cuDevicePrimaryCtxRetain, &ca->ctx, ca->dev);
    if (res != CUDA_SUCCESS) {
        ca->ctx = NULL;
        status = ema__cu_status(res);
        goto err;
    }
    status = cuda_ctx_set(ca);
    if (status != EMA_SUCCESS) {
        goto err;
    }
    if (arena->flags & EMA_MEM_ARENA_HOST_NUMA) {
        /* the host spill tier: never lent, so handles are optional */
        status = cuda_host_location(ca, arena->seg_size);
        if (status != EMA_SUCCESS) {
            goto err;
        }
        goto streams;
    }
    if (!cuda_attr(ca, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) ||
        !cuda_attr(ca, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)) {
        ema_error("device %d does not support cuda vmm with posix fd handles", ordinal);
        status = EMA_ERR_UNSUPPORTED;
        goto err;
    }
    ca->loc_type = CU_MEM_LOCATION_TYPE_DEVICE;
    ca->loc_id   = (int)ca->dev;
    ca->htypes   = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    if (cuda_attr(ca, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)) {
        ca->htypes |= CU_MEM_HANDLE_TYPE_FABRIC;
    }

    cuda_prop(ca, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, &prop);
    EMA_CU_CALL(res, cuMemGetAllocationGranularity, &ca->gran, &prop,
                CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (res != CUDA_SUCCESS) {
        status = ema__cu_status(res);
        goto err;
    }
    if (ca->gran == 0 || arena->seg_size % ca->gran != 0) {
        ema_error("segment size %zu is not a multiple of device %d's vmm granularity %zu: "
                  "set EMA_SEGMENT_SIZE to a multiple", arena->seg_size, ordinal, ca->gran);
        status = EMA_ERR_INVALID_PARAM;
        goto err;
    }

streams:
    for (int i = 0; i < CUDA_NSTREAMS; i++) {
        EMA_CU_CALL(res, cuStreamCreate, &ca->streams[i], CU_STREAM_NON_BLOCKING);
        if (res != CUDA_SUCCESS) {
            ca->streams[i] = NULL;
            status = ema__cu_status(res);
            goto err;
        }
    }
    /* a debug line's events: without them, no line, and nothing else
     * changes (the timing looks at dbg_ev[0]; a lone dbg_ev[1] goes with
     * the arena) */
    if (ema__log_level >= EMA_LOG_DEBUG) {
        if (ema__cu.cuEventCreate(&ca->dbg_ev[1], CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
            ca->dbg_ev[1] = NULL;
        } else if (ema__cu.cuEventCreate(&ca->dbg_ev[0], CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
            ca->dbg_ev[0] = NULL;
        }
        if (ca->dbg_ev[0] == NULL) {
            ema_debug("cuda: no events to time migrations' copies with");
        }
    }
    /* Aligned as every window range (cuda_seg_align).  Tried in session 12
     * against the launches where a migration's copies into this range ran
     * at 1.65 TB/s instead of 2.07 (a 1 GiB reclaim at 0.70x a copy's speed
     * instead of 0.90x): it did not remove them (H200, 7 launches each;
     * doc/performance.md). */
    EMA_CU_CALL(res, cuMemAddressReserve, &base, arena->capacity, cuda_seg_align(arena, ca), 0,
                0);
    if (res != CUDA_SUCCESS) {
        status = ema__cu_status(res);
        goto err;
    }
    arena->base = (void *)(uintptr_t)base;

    /* Lenders create and export every segment now, so a borrow later costs
     * the borrower one import and one map, and the lender nothing. */
    for (ca->ncreated = 0; ca->ncreated < ca->nsegs; ca->ncreated++) {
        status = cuda_seg_create(arena, ca, ca->ncreated);
        if (status != EMA_SUCCESS) {
            goto err;
        }
    }
    ema_debug("cuda arena of %s memory for device %d: %zu bytes at %p, granularity %zu, "
              "handles %s", (ca->loc_type == CU_MEM_LOCATION_TYPE_DEVICE) ? "device" : "host",
              ordinal, arena->capacity, arena->base, ca->gran,
              (ca->htypes & CU_MEM_HANDLE_TYPE_FABRIC) ? "posix fd + fabric"
              : ca->htypes ? "posix fd" : "none");
    return EMA_SUCCESS;

err:
    cuda_arena_destroy(arena);
    return status;
}

static ema_status_t cuda_prefault(ema__mem_arena_t *arena, uint32_t first, uint32_t count)
{
    /* cuMemCreate allocates physical memory: nothing is ever faulted in. */
    return EMA_SUCCESS;
}

static size_t cuda_round(const ema_cuda_arena_t *ca, size_t len)
{
    return (len + ca->gran - 1) / ca->gran * ca->gran;
}

static ema_status_t cuda_reserve(ema__mem_arena_t *arena, size_t len, void **addr_p)
{
    ema_cuda_arena_t *ca = arena->priv;
    CUdeviceptr ptr;
    ema_status_t status;
    CUresult res;

    status = cuda_ctx_set(ca);
    if (status != EMA_SUCCESS) {
        return status;
    }
    EMA_CU_CALL(res, cuMemAddressReserve, &ptr, cuda_round(ca, len), cuda_seg_align(arena, ca),
                0, 0);
    if (res != CUDA_SUCCESS) {
        return (res == CUDA_ERROR_OUT_OF_MEMORY) ? EMA_ERR_NO_RESOURCE : ema__cu_status(res);
    }
    *addr_p = (void *)(uintptr_t)ptr;
    return EMA_SUCCESS;
}

static void cuda_unreserve(ema__mem_arena_t *arena, void *addr, size_t len)
{
    ema_cuda_arena_t *ca = arena->priv;
    CUresult res;

    if (cuda_ctx_set(ca) == EMA_SUCCESS) {
        EMA_CU_CALL(res, cuMemAddressFree, (CUdeviceptr)(uintptr_t)addr,
                    cuda_round(ca, len));
        (void)res;
    }
}

static int64_t cuda_seg_handle(ema__mem_arena_t *arena, uint32_t seg)
{
    ema_cuda_arena_t *ca = arena->priv;
    return (seg < ca->ncreated) ? ca->fds[seg] : -1;
}

/* A peer's exported fd, duplicated into our fd table. */
static ema_status_t cuda_peer_fd(int32_t pid, int64_t handle, int *fd_p)
{
    int pidfd, fd;

    pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (pidfd < 0) {
        ema_error("pidfd_open(%d) to map a peer's segment failed: %m", (int)pid);
        return (errno == ESRCH) ? EMA_ERR_PEER_LOST : EMA_ERR_IO;
    }
    fd = (int)syscall(SYS_pidfd_getfd, pidfd, (int)handle, 0);
    if (fd < 0) {
        int err = errno;
        if (err == EPERM) {
            ema_error("pidfd_getfd(pid %d, fd %d) failed: %m: importing a peer's gpu memory "
                      "needs ptrace permission over the peer (same user and "
                      "kernel.yama.ptrace_scope=0, or CAP_SYS_PTRACE)",
                      (int)pid, (int)handle);
        } else {
            ema_error("pidfd_getfd(pid %d, fd %d) failed: %m", (int)pid, (int)handle);
        }
        close(pidfd);
        return (err == ESRCH) ? EMA_ERR_PEER_LOST : (err == EPERM) ? EMA_ERR_UNSUPPORTED
                                                                    : EMA_ERR_IO;
    }
    close(pidfd);
    *fd_p = fd;
    return EMA_SUCCESS;
}

/* The cache entry of @pid's segment @handle, or -1.  Requires import_lock. */
static int64_t cuda_import_find(const ema_cuda_arena_t *ca, int32_t pid, int64_t handle)
{
    for (uint32_t i = 0; i < ca->nimports; i++) {
        if (ca->imports[i].pid == pid && ca->imports[i].handle == handle) {
            return i;
        }
    }
    return -1;
}

/*
 * Peer @pid's segment exported as fd @handle, as a handle of ours: imported
 * on first use and kept until the arena is destroyed.  A window's mapping
 * and the direct path's mirror then share one import, a later map of the
 * same segment (a borrow again, a migration's remap) skips the fd and the
 * import (about 0.75 ms, doc/performance.md), and an unmap never drops the
 * last hold on an imported allocation (a 1 GiB prefetch's unmap of four
 * such mappings: 274 us with the hold dropped, 179 us kept, on an H200,
 * doc/performance.md).  The memory is the peer's arena, alive for the
 * peer's life anyway: keeping the import costs no memory.
 */
static ema_status_t cuda_import(ema_cuda_arena_t *ca, int32_t pid, int64_t handle,
                                CUmemGenericAllocationHandle *h_p)
{
    CUmemGenericAllocationHandle h, dead = 0;
    ema_status_t status = EMA_SUCCESS;
    int found = 0, gone = 0, kept = 0;
    CUresult res;
    int fd;

    pthread_mutex_lock(&ca->import_lock);
    int64_t i = cuda_import_find(ca, pid, handle);
    if (i >= 0) {
        /* A dead peer's memory is not mapped anew, as when every map
         * imported (pidfd_open: ESRCH); its entry goes. */
        if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
            dead = ca->imports[i].h;
            ca->imports[i] = ca->imports[--ca->nimports];
            gone = 1;
        } else {
            *h_p  = ca->imports[i].h;
            found = 1;
        }
    }
    pthread_mutex_unlock(&ca->import_lock);
    if (gone) {
        ema__cu.cuMemRelease(dead); /* its mappings, if any, keep the memory */
        ema_error("pid %d, whose GPU segment is to be mapped, is gone", (int)pid);
        return EMA_ERR_PEER_LOST;
    }
    if (found) {
        return EMA_SUCCESS;
    }

    /* The fd and the import (about 0.75 ms) outside the lock, so that maps
     * of other segments go on meanwhile. */
    status = cuda_peer_fd(pid, handle, &fd);
    if (status != EMA_SUCCESS) {
        return status;
    }
    EMA_CU_CALL(res, cuMemImportFromShareableHandle, &h, (void *)(uintptr_t)fd,
                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fd); /* the imported handle holds the memory */
    if (res != CUDA_SUCCESS) {
        return ema__cu_status(res);
    }
    pthread_mutex_lock(&ca->import_lock);
    if ((i = cuda_import_find(ca, pid, handle)) >= 0) {
        *h_p  = ca->imports[i].h; /* another thread imported it meanwhile */
        found = 1;
    }
    if (!found && ca->nimports == ca->cap_imports) {
        uint32_t cap = ca->cap_imports ? 2 * ca->cap_imports : 64;
        cuda_import_t *n = realloc(ca->imports, cap * sizeof(*n));
        if (n != NULL) {
            ca->imports     = n;
            ca->cap_imports = cap;
        }
    }
    if (!found && ca->nimports < ca->cap_imports) {
        ca->imports[ca->nimports++] = (cuda_import_t){pid, handle, h};
        *h_p = h;
        kept = 1;
    } else if (!found) {
        status = EMA_ERR_NO_MEMORY;
    }
    pthread_mutex_unlock(&ca->import_lock);
    if (!kept) {
        ema__cu.cuMemRelease(h); /* a duplicate, or no room to keep it */
    }
    return status;
}

static ema_status_t cuda_map(ema__mem_arena_t *arena, const ema__mem_export_t *exp,
                             uint32_t seg, int64_t handle, void *addr)
{
    ema_cuda_arena_t *ca = arena->priv;
    CUmemGenericAllocationHandle h = 0;
    ema_status_t status;

    status = cuda_ctx_set(ca);
    if (status != EMA_SUCCESS) {
        return status;
    }
    if (exp->pid == (int32_t)getpid()) {
        /* Our own segment: the arena keeps its handle until destroy, and a
         * released handle's memory lives on while any mapping remains. */
        if (seg >= ca->ncreated) {
            ema_error("segment %u is outside this rank's arena of %u", seg, ca->ncreated);
            return EMA_ERR_INVALID_PARAM;
        }
        return cuda_map_handle(ca, addr, arena->seg_size, ca->handles[seg]);
    }

    if (exp->seg_size != arena->seg_size) {
        ema_error("peer %d uses segments of %lu bytes, this rank %zu", (int)exp->pid,
                  (unsigned long)exp->seg_size, arena->seg_size);
        return EMA_ERR_INVALID_PARAM;
    }
    status = cuda_import(ca, exp->pid, handle, &h);
    if (status != EMA_SUCCESS) {
        return status;
    }
    status = cuda_map_handle(ca, addr, arena->seg_size, h);
    if (status != EMA_SUCCESS) {
        ema_error("mapping segment %u of pid %d at %p failed", seg, (int)exp->pid, addr);
    }
    return status;
}

/* @count consecutive segments: our own are mapped one cuMemMap each and
 * given access with one cuMemSetAccess for the whole run (the access call
 * is the larger part of a map's cost); a peer's segment each has its own
 * exported fd, so a peer's run is one segment. */
static ema_status_t cuda_map_many(ema__mem_arena_t *arena, const ema__mem_export_t *exp,
                                  uint32_t seg, uint32_t count, int64_t handle, void *addr)
{
    ema_cuda_arena_t *ca = arena->priv;
    size_t ss = arena->seg_size;
    CUmemAccessDesc acc;
    ema_status_t status;
    CUresult res;
    uint32_t i;

    if (count == 1 || exp->pid != (int32_t)getpid()) {
        if (count != 1) {
            ema_error("a run of %u segments of pid %d: a peer's are mapped one by one", count,
                      (int)exp->pid);
            return EMA_ERR_INVALID_PARAM;
        }
        return cuda_map(arena, exp, seg, handle, addr);
    }
    status = cuda_ctx_set(ca);
    if (status != EMA_SUCCESS) {
        return status;
    }
    if (seg + count > ca->ncreated) {
        ema_error("segments %u..%u are outside this rank's arena of %u", seg, seg + count - 1,
                  ca->ncreated);
        return EMA_ERR_INVALID_PARAM;
    }
    for (i = 0; i < count; i++) {
        EMA_CU_CALL(res, cuMemMap, (CUdeviceptr)(uintptr_t)((char *)addr + (size_t)i * ss), ss,
                    0, ca->handles[seg + i], 0);
        if (res != CUDA_SUCCESS) {
            status = ema__cu_status(res);
            goto err;
        }
    }
    cuda_access_desc(ca, &acc);
    EMA_CU_CALL(res, cuMemSetAccess, (CUdeviceptr)(uintptr_t)addr, (size_t)count * ss, &acc, 1);
    if (res == CUDA_SUCCESS) {
        return EMA_SUCCESS;
    }
    status = ema__cu_status(res);
err:
    while (i-- > 0) {
        ema__cu.cuMemUnmap((CUdeviceptr)(uintptr_t)((char *)addr + (size_t)i * ss), ss);
    }
    return status;
}

static ema_status_t cuda_unmap(ema__mem_arena_t *arena, void *addr, size_t len)
{
    ema_cuda_arena_t *ca = arena->priv;
    ema_status_t status;
    CUresult res;

    status = cuda_ctx_set(ca);
    if (status != EMA_SUCCESS) {
        return status;
    }
    /* One call covers a run of whole mappings; should the driver refuse a
     * run that spans several allocations, unmap them one by one. */
    res = ema__cu.cuMemUnmap((CUdeviceptr)(uintptr_t)addr, len);
    if (res == CUDA_SUCCESS) {
        return EMA_SUCCESS;
    }
    if (len <= arena->seg_size || len % arena->seg_size != 0) {
        ema_error("cuMemUnmap(%p, %zu) failed: %s", addr, len, ema__cu_errname(res));
        return ema__cu_status(res);
    }
    status = EMA_SUCCESS;
    for (size_t off = 0; off < len; off += arena->seg_size) {
        res = ema__cu.cuMemUnmap((CUdeviceptr)(uintptr_t)((char *)addr + off), arena->seg_size);
        if (res != CUDA_SUCCESS && status == EMA_SUCCESS) {
            ema_error("cuMemUnmap(%p, %zu) failed: %s", (char *)addr + off, arena->seg_size,
                      ema__cu_errname(res));
            status = ema__cu_status(res);
        }
    }
    return status;
}

/*
 * Debug level only: how long a migration's copies ran on the GPU, and how
 * long before that they were not running.  The first thread to queue a
 * migration's copy (copy_start) while no other is timed owns the timing:
 * an event before its first copy and after each of its copies, and its
 * wait for them (copy_wait, or the last copy_wait_mark) logs the time
 * between the events (the copies' run) and the time since the first was
 * queued.  The difference is an upper bound of the wait to start: it also
 * holds the queueing and the host's own work before the wait where that is
 * longer than the copies.  Copies of other threads meanwhile are not
 * timed; a batch whose wait never comes (an error) is timed together with
 * the same thread's next one.  Session 13 found with it that a 1 GiB
 * reclaim's slow launches (0.70x a copy's speed instead of 0.90x) are
 * copies that start 115-167 us late and then run at full speed
 * (doc/performance.md).
 */
static __thread const ema_cuda_arena_t *cuda_timing_owner;

/* Before a migration's copy is queued: the batch's start, unless one is
 * timed already (this thread's: it goes on; another's: not timed). */
static void cuda_copy_timing_start(ema_cuda_arena_t *ca)
{
    int idle = 0;

    if (ca->dbg_ev[0] == NULL || cuda_timing_owner == ca ||
        !atomic_compare_exchange_strong(&ca->dbg_armed, &idle, 1)) {
        return;
    }
    cuda_timing_owner = ca;
    ca->dbg_t0 = ema__now_us();
    ema__cu.cuEventRecord(ca->dbg_ev[0], ca->streams[CUDA_STREAM_MIGRATE]);
}

/* After it is queued: the batch's end so far. */
static void cuda_copy_timing_queued(ema_cuda_arena_t *ca)
{
    if (cuda_timing_owner == ca) {
        ema__cu.cuEventRecord(ca->dbg_ev[1], ca->streams[CUDA_STREAM_MIGRATE]);
    }
}

static void cuda_copy_timing_report(ema_cuda_arena_t *ca)
{
    float ms = 0;

    if (cuda_timing_owner != ca || ema__cu.cuEventQuery(ca->dbg_ev[1]) != CUDA_SUCCESS) {
        return; /* not this thread's, or copies of the batch still run */
    }
    double host = ema__now_us() - ca->dbg_t0;
    if (ema__cu.cuEventElapsedTime(&ms, ca->dbg_ev[0], ca->dbg_ev[1]) == CUDA_SUCCESS) {
        ema_debug("cuda: a migration's copies ran %.0f us on the gpu and were done %.0f us "
                  "after the first was queued (up to %.0f us not running)", ms * 1e3, host,
                  host - ms * 1e3 > 0 ? host - ms * 1e3 : 0);
    }
    cuda_timing_owner = NULL;
    atomic_store(&ca->dbg_armed, 0);
}

/* Queue a copy on stream @which (CUDA_STREAM_*), then, with @wait, wait
 * for everything queued on it (else cuda_stream_wait does, later). */
static ema_status_t cuda_stream_copy(ema__mem_arena_t *arena, int which, void *dst,
                                     const void *src, size_t len, int wait)
{
    ema_cuda_arena_t *ca = arena->priv;
    ema_status_t status = cuda_ctx_set(ca);
    CUresult res;

    if (status != EMA_SUCCESS) {
        return status;
    }
    /* a migration's copies (copy_start) are timed at debug level; the
     * synchronous ones (an atomic's word) are not */
    int timed = (which == CUDA_STREAM_MIGRATE && !wait);
    if (timed) {
        cuda_copy_timing_start(ca);
    }
    EMA_CU_CALL(res, cuMemcpyAsync, (CUdeviceptr)(uintptr_t)dst,
                (CUdeviceptr)(uintptr_t)src, len, ca->streams[which]);
    if (timed && res == CUDA_SUCCESS) {
        cuda_copy_timing_queued(ca);
    }
    if (res == CUDA_SUCCESS && wait) {
        EMA_CU_CALL(res, cuStreamSynchronize, ca->streams[which]);
    }
    return ema__cu_status(res);
}

static ema_status_t cuda_stream_wait(ema__mem_arena_t *arena, int which)
{
    ema_cuda_arena_t *ca = arena->priv;
    ema_status_t status = cuda_ctx_set(ca);
    CUresult res;

    if (status != EMA_SUCCESS) {
        return status;
    }
    EMA_CU_CALL(res, cuStreamSynchronize, ca->streams[which]);
    if (which == CUDA_STREAM_MIGRATE && res == CUDA_SUCCESS) {
        cuda_copy_timing_report(ca);
    }
    return ema__cu_status(res);
}

/* Synchronous: unified addressing lets one cuMemcpy reach local, borrowed
 * and host memory alike.  Migrations queue theirs with copy_start and wait
 * once (ema__win_seg_move_batch). */
static ema_status_t cuda_copy(ema__mem_arena_t *arena, void *dst, const void *src,
                              size_t len)
{
    return cuda_stream_copy(arena, CUDA_STREAM_MIGRATE, dst, src, len, 1);
}

static ema_status_t cuda_copy_start(ema__mem_arena_t *arena, void *dst, const void *src,
                                    size_t len)
{
    return cuda_stream_copy(arena, CUDA_STREAM_MIGRATE, dst, src, len, 0);
}

static ema_status_t cuda_copy_wait(ema__mem_arena_t *arena)
{
    return cuda_stream_wait(arena, CUDA_STREAM_MIGRATE);
}

/* A mark is an event recorded on the copy stream; created per mark (about
 * a microsecond), since migrations may run on several threads at once. */
static ema_status_t cuda_copy_mark(ema__mem_arena_t *arena, void **mark_p)
{
    ema_cuda_arena_t *ca = arena->priv;
    ema_status_t status = cuda_ctx_set(ca);
    CUevent ev;
    CUresult res;

    *mark_p = NULL;
    if (status != EMA_SUCCESS) {
        return status;
    }
    EMA_CU_CALL(res, cuEventCreate, &ev, CU_EVENT_DISABLE_TIMING);
    if (res != CUDA_SUCCESS) {
        return ema__cu_status(res);
    }
    EMA_CU_CALL(res, cuEventRecord, ev, ca->streams[CUDA_STREAM_MIGRATE]);
    if (res != CUDA_SUCCESS) {
        ema__cu.cuEventDestroy(ev);
        return ema__cu_status(res);
    }
    *mark_p = ev;
    return EMA_SUCCESS;
}

static ema_status_t cuda_copy_wait_mark(ema__mem_arena_t *arena, void *mark)
{
    ema_cuda_arena_t *ca = arena->priv;
    ema_status_t status = cuda_ctx_set(ca);
    CUresult res;

    if (mark == NULL) {
        return (status == EMA_SUCCESS) ? cuda_copy_wait(arena) : status;
    }
    if (status == EMA_SUCCESS) {
        EMA_CU_CALL(res, cuEventSynchronize, (CUevent)mark);
        status = ema__cu_status(res);
        if (status == EMA_SUCCESS) {
            cuda_copy_timing_report(ca);
        }
    }
    ema__cu.cuEventDestroy((CUevent)mark);
    return status;
}

static int cuda_copy_mark_done(ema__mem_arena_t *arena, void *mark)
{
    ema_cuda_arena_t *ca = arena->priv;
    if (mark == NULL || cuda_ctx_set(ca) != EMA_SUCCESS) {
        return 0;
    }
    /* CUDA_ERROR_NOT_READY: not yet; an error is seen by copy_wait_mark */
    return ema__cu.cuEventQuery((CUevent)mark) == CUDA_SUCCESS;
}

/* The direct path's copies (put and get, src/win/cuda_path.c): queued on
 * their own stream, so a put never waits behind a migration's gigabytes,
 * and waited for together.  A wait also completes copies queued by other
 * threads meanwhile, which is harmless. */
static ema_status_t cuda_rma_copy_start(ema__mem_arena_t *arena, void *dst, const void *src,
                                        size_t len)
{
    return cuda_stream_copy(arena, CUDA_STREAM_RMA, dst, src, len, 0);
}

static ema_status_t cuda_rma_copy_wait(ema__mem_arena_t *arena)
{
    return cuda_stream_wait(arena, CUDA_STREAM_RMA);
}

const ema__mem_ops_t ema__mem_cuda_ops = {
    .size                 = sizeof(ema__mem_ops_t),
    .name                 = "cuda",
    .kind                 = EMA_MEMORY_KIND_CUDA,
    /* EMA_SEGMENT_SIZE=auto on cuda.  bench/vmm_costs on an H200: a
     * segment's remap costs about 46 us per mapping (cuMemUnmap 17-25 us,
     * cuMemMap 1.4 us, cuMemSetAccess 25-47 us) whatever its size, and
     * inside EMA 80-110 us (debug log), while a copy moves 128 MiB in 65 us.  A
     * migration remaps while it copies (segment_table.c), so it runs at the
     * copy's speed once the remaps of a GiB take less than its copy: with
     * 128 MiB segments they took 650-780 us against a 520 us copy, with
     * 256 MiB 370-470 us.  ema_perf, 3 launches each (doc/performance.md):
     * prefetch of 4 GiB 0.64-0.79x a copy's speed with 128 MiB, 0.93-0.94x
     * with 256 MiB and 512 MiB; of 1 GiB 0.52-0.63x, 0.73-0.84x, 0.85-0.86x.
     * 256 MiB keeps lending fine enough for GPUs of tens of GiB. */
    .default_segment_size = 256ul << 20,
    .granularity          = EMA_CUDA_GRANULARITY,
    .usable               = ema__cuda_usable,
    .arena_create         = cuda_arena_create,
    .arena_destroy        = cuda_arena_destroy,
    .prefault             = cuda_prefault,
    .reserve              = cuda_reserve,
    .unreserve            = cuda_unreserve,
    .seg_handle           = cuda_seg_handle,
    .map                  = cuda_map,
    .unmap                = cuda_unmap,
    .map_many             = cuda_map_many,
    .copy                 = cuda_copy,
    .copy_start           = cuda_copy_start,
    .copy_wait            = cuda_copy_wait,
    .copy_mark            = cuda_copy_mark,
    .copy_wait_mark       = cuda_copy_wait_mark,
    .copy_mark_done       = cuda_copy_mark_done,
    .rma_copy_start       = cuda_rma_copy_start,
    .rma_copy_wait        = cuda_rma_copy_wait,
};
