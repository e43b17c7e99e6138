/* The topology object, shared by the files of src/topo only. */
#ifndef EMA_TOPO_PRIV_H_
#define EMA_TOPO_PRIV_H_

#include "topo.h"

#include <hwloc.h>

typedef struct ema__topo_gpu {
    int          numa;        /* OS index, -1 unknown */
    int          has_pci;
    unsigned     domain, bus, dev;
    char         model[96];
    char         uuid[96];    /* "GPU-..." where known, for CUDA_VISIBLE_DEVICES */
} ema__topo_gpu_t;

struct ema__topo {
    hwloc_topology_t hw;
    int              thissystem;    /* not an XML file of another machine */
    int              ngpus;
    ema__topo_gpu_t *gpus;
    double          *bw;            /* ngpus x ngpus, GB/s, 0 on the diagonal */
    /* GPU indexes are CUDA ordinals, so CUDA_VISIBLE_DEVICES has already been
     * applied (hwloc's CUDA backend and libcuda enumerate after it); NVML and
     * hwloc's NVML backend see every GPU. */
    int              cuda_numbering;
    int              nnuma;
    int             *numa_os;       /* nnuma OS indexes */
    int             *numa_dist;     /* nnuma x nnuma, NULL when hwloc has none */
    int              my_numa;
    char             source[128];
};

/* The dlopen fallbacks (probe.c).  On success they replace gpus/bw/ngpus and
 * set source; on failure they leave @a t as it was. */
ema_status_t ema__topo_probe_nvml(ema__topo_t *t);
ema_status_t ema__topo_probe_cuda(ema__topo_t *t);

/* Common helpers (topo.c). */
int  ema__topo_numa_of_pci(ema__topo_t *t, unsigned domain, unsigned bus, unsigned dev);
/* NVSwitch systems report GPU->switch links: GPU i reaches GPU j at the
 * smaller of their total bandwidths to the switches, as hwloc's transitive
 * closure computes it. */
void ema__topo_switch_closure(double *bw, const double *to_switch, int n);

#endif
