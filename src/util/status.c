#include <ema.h>

#include "state.h"

#include <string.h>

EMA_EXPORT const char *ema_strerror(ema_status_t status)
{
    switch (status) {
    case EMA_SUCCESS:            return "success";
    case EMA_INPROGRESS:         return "operation in progress";
    case EMA_ERR_INVALID_PARAM:  return "invalid parameter";
    case EMA_ERR_INVALID_HANDLE: return "invalid handle";
    case EMA_ERR_INVALID_RANK:   return "invalid rank";
    case EMA_ERR_RANGE:          return "offset or length out of range";
    case EMA_ERR_ALIGNMENT:      return "misaligned atomic offset";
    case EMA_ERR_STATE:          return "invalid state (not initialized, finalized, or busy)";
    case EMA_ERR_NO_MEMORY:      return "out of memory";
    case EMA_ERR_NO_RESOURCE:    return "out of resources";
    case EMA_ERR_UNSUPPORTED:    return "operation not supported";
    case EMA_ERR_BOOTSTRAP:      return "bootstrap (PMIx) failure";
    case EMA_ERR_TRANSPORT:      return "transport (UCX) error";
    case EMA_ERR_PEER_LOST:      return "peer lost";
    case EMA_ERR_TIMEOUT:        return "timed out";
    case EMA_ERR_IO:             return "input/output error";
    case EMA_ERR_DEVICE:         return "device (CUDA) error";
    }
    return "unknown status";
}

int ema__status_known_error(int32_t st)
{
    return st <= EMA_SUCCESS && strcmp(ema_strerror((ema_status_t)st), "unknown status") != 0;
}

EMA_EXPORT const char *ema_version_string(void)
{
#define EMA_STR2_(x) #x
#define EMA_STR_(x) EMA_STR2_(x)
    return EMA_STR_(EMA_VERSION_MAJOR) "." EMA_STR_(EMA_VERSION_MINOR) "." EMA_STR_(
        EMA_VERSION_PATCH);
}
