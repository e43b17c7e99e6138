/*
 * The CUDA driver, never linked: libcuda.so.1 is opened on first use and
 * every entry point is resolved through cuGetProcAddress (cuda_priv.h has
 * the list), so a CUDA build runs on a machine with no GPU or driver (the
 * kind is then simply not usable).  cuda.h supplies the types only.
 */
#define _GNU_SOURCE
#include "cuda_priv.h"

ema__cu_driver_t ema__cu;

static pthread_once_t ema_cu_once = PTHREAD_ONCE_INIT;

const char *ema__cu_errname(CUresult res)
{
    const char *name = NULL;
    if (ema__cu.cuGetErrorName == NULL || ema__cu.cuGetErrorName(res, &name) != CUDA_SUCCESS ||
        name == NULL) {
        return "CUDA_ERROR_UNKNOWN";
    }
    return name;
}

/* The EMA status of a CUresult. */
ema_status_t ema__cu_status(CUresult res)
{
    switch (res) {
    case CUDA_SUCCESS:             return EMA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: return EMA_ERR_NO_MEMORY;
    case CUDA_ERROR_INVALID_VALUE: return EMA_ERR_INVALID_PARAM;
    case CUDA_ERROR_NOT_SUPPORTED: return EMA_ERR_UNSUPPORTED;
    default:                       return EMA_ERR_DEVICE;
    }
}

/*
 * Runs once.  Missing library, missing symbols, cuInit failing or no
 * device are the normal case on machines without a GPU: they are logged at
 * debug level only, and the kind is reported unusable.
 */
static void cu_load(void)
{
    PFN_cuGetProcAddress_v12000 get_proc;
    CUresult res;

    ema__cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (ema__cu.lib == NULL) {
        ema_debug("cuda kind unusable: dlopen(libcuda.so.1) failed: %s", dlerror());
        return;
    }
    get_proc = (PFN_cuGetProcAddress_v12000)dlsym(ema__cu.lib, "cuGetProcAddress_v2");

#define EMA_CUDA_RESOLVE(_name, _abi, _version) \
    { \
        void *fn = NULL; \
        if (get_proc != NULL) { \
            CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND; \
            if (get_proc(#_name, &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found) != \
                    CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS) { \
                fn = NULL; \
            } \
        } \
        if (fn == NULL) { \
            fn = dlsym(ema__cu.lib, #_abi); \
        } \
        if (fn == NULL) { \
            ema_debug("cuda kind unusable: the driver has no " #_name); \
            goto err_close; \
        } \
        ema__cu._name = (PFN_##_name##_##_version)fn; \
    }
    EMA_CUDA_FUNCS(EMA_CUDA_RESOLVE)
#undef EMA_CUDA_RESOLVE

    res = ema__cu.cuInit(0);
    if (res != CUDA_SUCCESS) {
        ema_debug("cuda kind unusable: cuInit() failed: %s", ema__cu_errname(res));
        goto err_close;
    }
    if (ema__cu.cuDriverGetVersion(&ema__cu.version) != CUDA_SUCCESS) {
        ema__cu.version = 0;
    }
    res = ema__cu.cuDeviceGetCount(&ema__cu.ndev);
    if (res != CUDA_SUCCESS || ema__cu.ndev <= 0) {
        ema_debug("cuda kind unusable: no device (%s)", ema__cu_errname(res));
        goto err_close;
    }
    ema_debug("cuda driver %d.%d, %d device(s)", ema__cu.version / 1000,
              (ema__cu.version % 1000) / 10, ema__cu.ndev);
    ema__cu.usable = 1;
    return;

err_close:
    /* Leave the function pointers unusable rather than dangling. */
    dlclose(ema__cu.lib);
    memset(&ema__cu, 0, sizeof(ema__cu));
}

int ema__cuda_usable(void)
{
    pthread_once(&ema_cu_once, cu_load);
    return ema__cu.usable;
}

