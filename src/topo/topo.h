/*
 * Topology: the GPUs of this host, the NUMA node each is attached to, and the
 * NVLink bandwidth between them, plus the two decisions built on that: which
 * GPU each local rank uses, and in which order a rank asks its peers to lend.
 *
 * Where the link matrix comes from, best first:
 *  1. hwloc's "NVLinkBandwidth" distances (hwloc built with its NVML backend);
 *     on NVSwitch systems hwloc reports GPU->switch links, so the matrix goes
 *     through the transitive closure to give GPU->GPU bandwidth.
 *  2. NVML, loaded with dlopen: NVLink state and remote PCI device per link.
 *     Debian's and Ubuntu's hwloc have no NVML backend, so this is the usual
 *     path on real GPU hosts.
 *  3. CUDA's P2P attributes (libcuda loaded with dlopen): which pairs can
 *     reach each other, not how fast; see topo.c.
 * An XML topology (HWLOC_XMLFILE) describes another machine, so the dlopen
 * fallbacks are used only when hwloc says the topology is this system.
 *
 * Uses only util and hwloc.  Nothing here is on a fast path.
 */
#ifndef EMA_TOPO_H_
#define EMA_TOPO_H_

#include <ema.h>

#include "util/config.h"

#include <stddef.h>
#include <stdio.h>

typedef struct ema__topo_config {
    const char *gpu_map; /* EMA_GPU_MAP: "" = by local rank */
} ema__topo_config_t;

extern const ema_config_field_t ema__topo_config_table[];

typedef struct ema__topo ema__topo_t;

/* Discover the host (or HWLOC_XMLFILE's machine).  Release with
 * ema__topo_destroy().  Fails only when hwloc itself fails. */
ema_status_t ema__topo_load(ema__topo_t **topo_p);
void         ema__topo_destroy(ema__topo_t *topo);

int    ema__topo_ngpus(const ema__topo_t *topo);
/* GB/s of the direct link between two GPUs (NVSwitch: through the switches);
 * 0 = no link, and 0 for a == b, which is not a link. */
double ema__topo_bandwidth(const ema__topo_t *topo, int gpu_a, int gpu_b);
/* OS index of the NUMA node @a gpu is attached to; -1 unknown. */
int    ema__topo_gpu_numa(const ema__topo_t *topo, int gpu);
/* NUMA node this process runs on; -1 unknown (unbound across several nodes,
 * or an XML topology of another machine with several nodes). */
int    ema__topo_my_numa(const ema__topo_t *topo);
int    ema__topo_nnuma(const ema__topo_t *topo);
/* Relative distance, 10 = local (ACPI SLIT scale); hwloc's NUMALatency where
 * known, else 10/20; EMA_TOPO_NUMA_UNKNOWN when either node is -1. */
#define EMA_TOPO_NUMA_UNKNOWN 255
int    ema__topo_numa_distance(const ema__topo_t *topo, int numa_a, int numa_b);
/* "hwloc NVLinkBandwidth", "hwloc NVLinkBandwidth, NVSwitch transitive
 * closure", "nvml (dlopen)", "cuda p2p (dlopen)", "none: no GPU", ... */
const char  *ema__topo_source(const ema__topo_t *topo);

/*
 * gpu_of_rank[local_rank] for @a nranks local ranks: by local rank over the
 * GPUs CUDA_VISIBLE_DEVICES leaves visible, or as EMA_GPU_MAP lists (CUDA
 * ordinals as the process sees them, after CUDA_VISIBLE_DEVICES).  Values are
 * topology GPU indexes, -1 when there is no GPU.  *shared_p (may be NULL) is
 * set when two ranks share a GPU.  EMA_ERR_INVALID_PARAM on a bad map.
 */
ema_status_t ema__topo_map_ranks(const ema__topo_t *topo, const ema__topo_config_t *cfg,
                                 int nranks, int *gpu_of_rank, int *shared_p);

/* Local ranks to show before ema_init: EMA_GPU_MAP's length, else one per
 * visible GPU, else 1. */
int ema__topo_default_nranks(const ema__topo_t *topo, const ema__topo_config_t *cfg);

/*
 * Order the other ranks as lenders for rank @a me: a rank on the same GPU
 * first (no link to cross), then highest link bandwidth, then most lendable
 * bytes, then nearest NUMA node, then lowest rank.  When @a me has no GPU the
 * NUMA distance comes first.  numa_of_rank and lendable may be NULL (then the
 * GPUs' NUMA nodes are used, and lendable does not count).  order gets
 * nranks-1 entries.
 */
void ema__topo_lender_order(const ema__topo_t *topo, const int *gpu_of_rank,
                            const int *numa_of_rank, const size_t *lendable, int nranks,
                            int me, int *order);

/* GPUs, link matrix with its source, NUMA nodes, rank->GPU map and each
 * rank's lender order, for ema_info.  numa_of_rank may be NULL. */
void ema__topo_print(const ema__topo_t *topo, FILE *stream, int nranks, const int *gpu_of_rank,
                     const int *numa_of_rank);

#endif
