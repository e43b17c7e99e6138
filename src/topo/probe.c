/*
 * The fallbacks for hosts whose hwloc has no NVML backend (Debian, Ubuntu):
 * NVML, else the CUDA driver, both loaded with dlopen so that EMA builds and
 * runs without them.  We declare the few prototypes we call ourselves; the
 * ABI of these entry points (the _v2/_v3 names) is stable across drivers.
 */
#include "topo_priv.h"

#include "util/log.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

/* ---- NVML ------------------------------------------------------------- */

typedef int nvml_return_t; /* nvmlReturn_t: 0 = NVML_SUCCESS */
typedef struct nvml_device_st *nvml_device_t;

typedef struct {
    char         bus_id_legacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pci_device_id; /* (device id << 16) | vendor id */
    unsigned int pci_subsystem_id;
    char         bus_id[32];
} nvml_pci_info_t; /* nvmlPciInfo_t, as nvmlDeviceGetPciInfo_v3 fills it */

#define EMA_NVML_SUCCESS       0
#define EMA_NVML_FEATURE_ON    1
/* NVML_NVLINK_MAX_LINKS is 18 today; the state query fails past the last
 * link, so a larger bound costs nothing and survives the next GPU. */
#define EMA_NVML_MAX_LINKS     32
#define EMA_PCI_VENDOR_NVIDIA  0x10de

typedef struct {
    void *dl;
    nvml_return_t (*init)(void);
    nvml_return_t (*shutdown)(void);
    nvml_return_t (*count)(unsigned int *);
    nvml_return_t (*handle)(unsigned int, nvml_device_t *);
    nvml_return_t (*pci)(nvml_device_t, nvml_pci_info_t *);
    nvml_return_t (*name)(nvml_device_t, char *, unsigned int);
    nvml_return_t (*uuid)(nvml_device_t, char *, unsigned int);
    nvml_return_t (*link_state)(nvml_device_t, unsigned int, int *);
    nvml_return_t (*link_remote)(nvml_device_t, unsigned int, nvml_pci_info_t *);
    nvml_return_t (*link_version)(nvml_device_t, unsigned int, unsigned int *);
} ema_nvml_t;

static int nvml_open(ema_nvml_t *n)
{
    memset(n, 0, sizeof(*n));
    n->dl = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (n->dl == NULL) {
        ema_debug("dlopen(libnvidia-ml.so.1) failed: %s", dlerror());
        return -1;
    }
#define EMA_NVML_SYM(_f, _s) \
    if ((*(void **)&n->_f = dlsym(n->dl, _s)) == NULL) { \
        ema_debug("dlsym(%s) failed in libnvidia-ml", _s); \
        goto err_close; \
    }
    EMA_NVML_SYM(init, "nvmlInit_v2");
    EMA_NVML_SYM(shutdown, "nvmlShutdown");
    EMA_NVML_SYM(count, "nvmlDeviceGetCount_v2");
    EMA_NVML_SYM(handle, "nvmlDeviceGetHandleByIndex_v2");
    EMA_NVML_SYM(pci, "nvmlDeviceGetPciInfo_v3");
    EMA_NVML_SYM(name, "nvmlDeviceGetName");
    EMA_NVML_SYM(uuid, "nvmlDeviceGetUUID");
    EMA_NVML_SYM(link_state, "nvmlDeviceGetNvLinkState");
    EMA_NVML_SYM(link_remote, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    EMA_NVML_SYM(link_version, "nvmlDeviceGetNvLinkVersion");
#undef EMA_NVML_SYM
    return 0;

err_close:
    dlclose(n->dl);
    n->dl = NULL;
    return -1;
}

/*
 * GB/s per direction of one link.  Older drivers number NVLink generations
 * 1-4; newer nvml.h numbers sub-versions (1.0, 2.0, 2.2, 3.0, 3.1, 4.0 = 1..6,
 * 5.0 = 7).  Every generation up to 4.0 moves 25 GB/s per link and direction
 * (1.0: 20); 5.0 doubles it.  hwloc's NVML backend uses the same values.
 */
static double nvml_link_gbps(unsigned version)
{
    if (version == 1) {
        return 20.0;
    }
    if (version >= 2 && version <= 6) {
        return 25.0;
    }
    return version >= 7 ? 50.0 : 0.0;
}

static int nvml_gpu_of_pci(const ema__topo_gpu_t *gpus, int n, const nvml_pci_info_t *p)
{
    for (int g = 0; g < n; g++) {
        if (gpus[g].domain == p->domain && gpus[g].bus == p->bus && gpus[g].dev == p->device) {
            return g;
        }
    }
    return -1;
}

ema_status_t ema__topo_probe_nvml(ema__topo_t *t)
{
    ema__topo_gpu_t *gpus = NULL;
    double *bw = NULL, *to_sw = NULL;
    nvml_device_t *dev = NULL;
    unsigned int count = 0;
    int nlinks = 0, nswitch_links = 0;
    ema_status_t status = EMA_ERR_UNSUPPORTED;
    ema_nvml_t n;

    if (nvml_open(&n) != 0) {
        return EMA_ERR_UNSUPPORTED;
    }
    if (n.init() != EMA_NVML_SUCCESS) {
        ema_debug("nvmlInit_v2 failed: no usable NVIDIA driver");
        goto err_close;
    }
    if (n.count(&count) != EMA_NVML_SUCCESS) {
        ema_debug("nvmlDeviceGetCount_v2 failed");
        goto err_shutdown;
    }
    gpus  = calloc(count ? count : 1, sizeof(*gpus));
    dev   = calloc(count ? count : 1, sizeof(*dev));
    bw    = calloc(count ? (size_t)count * count : 1, sizeof(*bw));
    to_sw = calloc(count ? count : 1, sizeof(*to_sw));
    if (gpus == NULL || dev == NULL || bw == NULL || to_sw == NULL) {
        status = EMA_ERR_NO_MEMORY;
        goto err_free;
    }
    for (unsigned g = 0; g < count; g++) {
        nvml_pci_info_t pci;
        if (n.handle(g, &dev[g]) != EMA_NVML_SUCCESS) {
            ema_debug("nvmlDeviceGetHandleByIndex_v2(%u) failed", g);
            goto err_free;
        }
        gpus[g].numa = -1;
        if (n.pci(dev[g], &pci) == EMA_NVML_SUCCESS) {
            gpus[g].has_pci = 1;
            gpus[g].domain  = pci.domain;
            gpus[g].bus     = pci.bus;
            gpus[g].dev     = pci.device;
            gpus[g].numa    = ema__topo_numa_of_pci(t, pci.domain, pci.bus, pci.device);
        }
        if (n.name(dev[g], gpus[g].model, sizeof(gpus[g].model)) != EMA_NVML_SUCCESS) {
            snprintf(gpus[g].model, sizeof(gpus[g].model), "NVIDIA GPU");
        }
        if (n.uuid(dev[g], gpus[g].uuid, sizeof(gpus[g].uuid)) != EMA_NVML_SUCCESS) {
            gpus[g].uuid[0] = '\0';
        }
    }
    for (unsigned g = 0; g < count; g++) {
        for (unsigned l = 0; l < EMA_NVML_MAX_LINKS; l++) {
            nvml_pci_info_t peer;
            unsigned version = 0;
            int active = 0, p;

            if (n.link_state(dev[g], l, &active) != EMA_NVML_SUCCESS) {
                break; /* past the last link, or no NVLink on this GPU */
            }
            if (active != EMA_NVML_FEATURE_ON ||
                n.link_remote(dev[g], l, &peer) != EMA_NVML_SUCCESS ||
                n.link_version(dev[g], l, &version) != EMA_NVML_SUCCESS) {
                continue;
            }
            p = nvml_gpu_of_pci(gpus, (int)count, &peer);
            if (p >= 0 && p != (int)g) {
                /* each side reports its own end of the link: count it once per row */
                bw[g * count + (unsigned)p] += nvml_link_gbps(version);
                nlinks++;
            } else if (p < 0 && (peer.pci_device_id & 0xffff) == EMA_PCI_VENDOR_NVIDIA) {
                to_sw[g] += nvml_link_gbps(version); /* an NVSwitch */
                nswitch_links++;
            }
        }
    }
    if (nswitch_links > 0) {
        ema__topo_switch_closure(bw, to_sw, (int)count);
    }
    n.shutdown();
    dlclose(n.dl);
    free(dev);
    free(to_sw);

    free(t->gpus);
    free(t->bw);
    t->gpus           = gpus;
    t->bw             = bw;
    t->ngpus          = (int)count;
    t->cuda_numbering = 0;
    if (count == 0) {
        snprintf(t->source, sizeof(t->source), "none: no GPU (nvml found none)");
    } else {
        snprintf(t->source, sizeof(t->source), "nvml (dlopen)%s",
                 nswitch_links > 0 ? ", NVSwitch transitive closure"
                                   : (nlinks == 0 ? ": no NVLink" : ""));
    }
    return EMA_SUCCESS;

err_free:
    free(gpus);
    free(dev);
    free(bw);
    free(to_sw);
err_shutdown:
    n.shutdown();
err_close:
    dlclose(n.dl);
    return status;
}

/* ---- CUDA driver -------------------------------------------------------- */

typedef int cu_result_t; /* CUresult: 0 = CUDA_SUCCESS */
typedef int cu_device_t; /* CUdevice */

#define EMA_CU_P2P_ACCESS_SUPPORTED        2 /* CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED */
#define EMA_CU_P2P_NATIVE_ATOMIC_SUPPORTED 3 /* CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED */

/*
 * CUDA says which pairs reach each other, not how fast.  Native atomics
 * between peers need NVLink (PCIe P2P has none), so such a pair gets the
 * bandwidth of one NVLink, a lower bound; PCIe P2P is not a direct link.
 */
#define EMA_CU_NVLINK_GBPS_ESTIMATE 25.0

ema_status_t ema__topo_probe_cuda(ema__topo_t *t)
{
    cu_result_t (*cu_init)(unsigned int);
    cu_result_t (*cu_count)(int *);
    cu_result_t (*cu_get)(cu_device_t *, int);
    cu_result_t (*cu_name)(char *, int, cu_device_t);
    cu_result_t (*cu_busid)(char *, int, cu_device_t);
    cu_result_t (*cu_p2p)(int *, int, cu_device_t, cu_device_t);
    ema__topo_gpu_t *gpus = NULL;
    cu_device_t *dev = NULL;
    double *bw = NULL;
    int count = 0, npairs = 0;
    void *dl;

    /* never dlclose'd: unloading the driver after cuInit is not supported */
    dl = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        ema_debug("dlopen(libcuda.so.1) failed: %s", dlerror());
        return EMA_ERR_UNSUPPORTED;
    }
    *(void **)&cu_init  = dlsym(dl, "cuInit");
    *(void **)&cu_count = dlsym(dl, "cuDeviceGetCount");
    *(void **)&cu_get   = dlsym(dl, "cuDeviceGet");
    *(void **)&cu_name  = dlsym(dl, "cuDeviceGetName");
    *(void **)&cu_busid = dlsym(dl, "cuDeviceGetPCIBusId");
    *(void **)&cu_p2p   = dlsym(dl, "cuDeviceGetP2PAttribute");
    if (!cu_init || !cu_count || !cu_get || !cu_name || !cu_busid || !cu_p2p) {
        ema_debug("libcuda.so.1 lacks a cuDevice* entry point");
        return EMA_ERR_UNSUPPORTED;
    }
    if (cu_init(0) != 0 || cu_count(&count) != 0) {
        ema_debug("cuInit failed: no usable NVIDIA driver");
        return EMA_ERR_UNSUPPORTED;
    }
    gpus = calloc(count > 0 ? (size_t)count : 1, sizeof(*gpus));
    dev  = calloc(count > 0 ? (size_t)count : 1, sizeof(*dev));
    bw   = calloc(count > 0 ? (size_t)count * (size_t)count : 1, sizeof(*bw));
    if (gpus == NULL || dev == NULL || bw == NULL) {
        goto err_free;
    }
    for (int g = 0; g < count; g++) {
        char busid[32];
        if (cu_get(&dev[g], g) != 0) {
            goto err_free;
        }
        gpus[g].numa = -1;
        if (cu_name(gpus[g].model, (int)sizeof(gpus[g].model), dev[g]) != 0) {
            snprintf(gpus[g].model, sizeof(gpus[g].model), "NVIDIA GPU");
        }
        if (cu_busid(busid, (int)sizeof(busid), dev[g]) == 0 &&
            sscanf(busid, "%x:%x:%x", &gpus[g].domain, &gpus[g].bus, &gpus[g].dev) == 3) {
            gpus[g].has_pci = 1;
            gpus[g].numa = ema__topo_numa_of_pci(t, gpus[g].domain, gpus[g].bus, gpus[g].dev);
        }
    }
    for (int a = 0; a < count; a++) {
        for (int b = 0; b < count; b++) {
            int access = 0, atomics = 0;
            if (a == b || cu_p2p(&access, EMA_CU_P2P_ACCESS_SUPPORTED, dev[a], dev[b]) != 0 ||
                !access) {
                continue;
            }
            if (cu_p2p(&atomics, EMA_CU_P2P_NATIVE_ATOMIC_SUPPORTED, dev[a], dev[b]) == 0 &&
                atomics) {
                bw[a * count + b] = EMA_CU_NVLINK_GBPS_ESTIMATE;
                npairs++;
            }
        }
    }
    free(dev);
    free(t->gpus);
    free(t->bw);
    t->gpus           = gpus;
    t->bw             = bw;
    t->ngpus          = count;
    t->cuda_numbering = 1; /* libcuda enumerates after CUDA_VISIBLE_DEVICES */
    if (count == 0) {
        snprintf(t->source, sizeof(t->source), "none: no GPU (cuda found none)");
    } else {
        snprintf(t->source, sizeof(t->source), "cuda p2p (dlopen)%s",
                 npairs ? ": NVLink pairs estimated at one link" : ": no NVLink");
    }
    return EMA_SUCCESS;

err_free:
    free(gpus);
    free(dev);
    free(bw);
    return EMA_ERR_UNSUPPORTED;
}
