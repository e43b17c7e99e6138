/*
 * The cuda memory kind's private header: the CUDA driver's entry points,
 * loaded on first use (cuda_driver.c), shared with the arena (cuda.c).
 */
#ifndef EMA_MEM_CUDA_PRIV_H_
#define EMA_MEM_CUDA_PRIV_H_

#include "mem.h"

#include "util/log.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

/* The VMM granularity of the H200 (and every recent data-centre GPU); the
 * real one is checked against the segment size in arena_create. */
#define EMA_CUDA_GRANULARITY (2ul << 20)

/* --- the driver, loaded on first use ------------------------------------ */

/* One entry per driver call: the name given to cuGetProcAddress, and the
 * exported (ABI) name to dlsym when the driver predates cuGetProcAddress_v2. */
#define EMA_CUDA_FUNCS(_F) \
    _F(cuInit, cuInit, PFN_cuInit_v2000) \
    _F(cuDriverGetVersion, cuDriverGetVersion, PFN_cuDriverGetVersion_v2020) \
    _F(cuGetErrorName, cuGetErrorName, PFN_cuGetErrorName_v6000) \
    _F(cuDeviceGetCount, cuDeviceGetCount, PFN_cuDeviceGetCount_v2000) \
    _F(cuDeviceGet, cuDeviceGet, PFN_cuDeviceGet_v2000) \
    _F(cuDeviceGetAttribute, cuDeviceGetAttribute, PFN_cuDeviceGetAttribute_v2000) \
    _F(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000) \
    _F(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, \
       PFN_cuDevicePrimaryCtxRelease_v11000) \
    _F(cuCtxSetCurrent, cuCtxSetCurrent, PFN_cuCtxSetCurrent_v4000) \
    _F(cuMemGetInfo, cuMemGetInfo_v2, PFN_cuMemGetInfo_v3020) \
    _F(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, \
       PFN_cuMemGetAllocationGranularity_v10020) \
    _F(cuMemAddressReserve, cuMemAddressReserve, PFN_cuMemAddressReserve_v10020) \
    _F(cuMemAddressFree, cuMemAddressFree, PFN_cuMemAddressFree_v10020) \
    _F(cuMemCreate, cuMemCreate, PFN_cuMemCreate_v10020) \
    _F(cuMemRelease, cuMemRelease, PFN_cuMemRelease_v10020) \
    _F(cuMemMap, cuMemMap, PFN_cuMemMap_v10020) \
    _F(cuMemUnmap, cuMemUnmap, PFN_cuMemUnmap_v10020) \
    _F(cuMemSetAccess, cuMemSetAccess, PFN_cuMemSetAccess_v10020) \
    _F(cuMemExportToShareableHandle, cuMemExportToShareableHandle, \
       PFN_cuMemExportToShareableHandle_v10020) \
    _F(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, \
       PFN_cuMemImportFromShareableHandle_v10020) \
    _F(cuStreamCreate, cuStreamCreate, PFN_cuStreamCreate_v2000) \
    _F(cuStreamDestroy, cuStreamDestroy_v2, PFN_cuStreamDestroy_v4000) \
    _F(cuStreamSynchronize, cuStreamSynchronize, PFN_cuStreamSynchronize_v2000) \
    _F(cuMemcpyAsync, cuMemcpyAsync, PFN_cuMemcpyAsync_v4000) \
    _F(cuEventCreate, cuEventCreate, PFN_cuEventCreate_v2000) \
    _F(cuEventRecord, cuEventRecord, PFN_cuEventRecord_v2000) \
    _F(cuEventSynchronize, cuEventSynchronize, PFN_cuEventSynchronize_v2000) \
    _F(cuEventDestroy, cuEventDestroy_v2, PFN_cuEventDestroy_v4000)

#define EMA_CUDA_FIELD(_name, _abi, _type) _type _name;
typedef struct {
    void *lib;
    int   usable;  /* driver loaded, cuInit done, at least one device */
    int   ndev;
    int   version; /* cuDriverGetVersion */
    EMA_CUDA_FUNCS(EMA_CUDA_FIELD)
} ema__cu_driver_t;
#undef EMA_CUDA_FIELD

/* The driver's entry points: valid once ema__cuda_usable() returned 1. */
extern ema__cu_driver_t ema__cu;

/* A driver call, logged once where it fails. */
#define EMA_CU_CALL(_res, _call, ...) \
    do { \
        (_res) = ema__cu._call(__VA_ARGS__); \
        if ((_res) != CUDA_SUCCESS) { \
            ema_error(#_call "() failed: %s", ema__cu_errname(_res)); \
        } \
    } while (0)

/* Load the driver once (thread-safe); 1 if a device is usable. */
int          ema__cuda_usable(void);
const char  *ema__cu_errname(CUresult res);
ema_status_t ema__cu_status(CUresult res);

#endif
