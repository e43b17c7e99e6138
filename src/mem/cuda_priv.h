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

/* One entry per driver call: the name given to cuGetProcAddress, the
 * exported (ABI) name to dlsym when the driver predates cuGetProcAddress_v2,
 * and the version in the name of its type, PFN_<name>_<version>. */
#define EMA_CUDA_FUNCS(_F) \
    _F(cuInit, cuInit, v2000) \
    _F(cuDriverGetVersion, cuDriverGetVersion, v2020) \
    _F(cuGetErrorName, cuGetErrorName, v6000) \
    _F(cuDeviceGetCount, cuDeviceGetCount, v2000) \
    _F(cuDeviceGet, cuDeviceGet, v2000) \
    _F(cuDeviceGetAttribute, cuDeviceGetAttribute, v2000) \
    _F(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, v7000) \
    _F(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, v11000) \
    _F(cuCtxSetCurrent, cuCtxSetCurrent, v4000) \
    _F(cuMemGetInfo, cuMemGetInfo_v2, v3020) \
    _F(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, v10020) \
    _F(cuMemAddressReserve, cuMemAddressReserve, v10020) \
    _F(cuMemAddressFree, cuMemAddressFree, v10020) \
    _F(cuMemCreate, cuMemCreate, v10020) \
    _F(cuMemRelease, cuMemRelease, v10020) \
    _F(cuMemMap, cuMemMap, v10020) \
    _F(cuMemUnmap, cuMemUnmap, v10020) \
    _F(cuMemSetAccess, cuMemSetAccess, v10020) \
    _F(cuMemExportToShareableHandle, cuMemExportToShareableHandle, v10020) \
    _F(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, v10020) \
    _F(cuStreamCreate, cuStreamCreate, v2000) \
    _F(cuStreamDestroy, cuStreamDestroy_v2, v4000) \
    _F(cuStreamSynchronize, cuStreamSynchronize, v2000) \
    _F(cuMemcpyAsync, cuMemcpyAsync, v4000) \
    _F(cuEventCreate, cuEventCreate, v2000) \
    _F(cuEventRecord, cuEventRecord, v2000) \
    _F(cuEventSynchronize, cuEventSynchronize, v2000) \
    _F(cuEventQuery, cuEventQuery, v2000) \
    _F(cuEventDestroy, cuEventDestroy_v2, v4000) \
    _F(cuEventElapsedTime, cuEventElapsedTime, v2000)

#define EMA_CUDA_FIELD(_name, _abi, _version) PFN_##_name##_##_version _name;
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
