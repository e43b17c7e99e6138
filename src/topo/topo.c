#include "topo_priv.h"

#include "util/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define EMA_TOPO_CFG(_f) offsetof(ema__topo_config_t, _f)

const ema_config_field_t ema__topo_config_table[] = {
    {"GPU_MAP", "",
     "GPU of each local rank, as a comma-separated list of CUDA ordinals indexed by local "
     "rank (\"0,1,2,3\"; \"0,0\" puts two ranks on GPU 0); empty: local rank modulo the "
     "visible GPUs",
     EMA_TOPO_CFG(gpu_map), &ema__config_string},
    EMA_CONFIG_TABLE_END};

/* NVML reports MB/s (1 NVLink 2.0-4.0 = 25000); we report GB/s. */
#define EMA_TOPO_MBPS_TO_GBPS(_v) ((double)(_v) / 1000.0)

static int topo_numa_index(const ema__topo_t *t, int os)
{
    for (int i = 0; i < t->nnuma; i++) {
        if (t->numa_os[i] == os) {
            return i;
        }
    }
    return -1;
}

static int topo_numa_of_obj(hwloc_obj_t obj)
{
    hwloc_obj_t anc = obj;

    /* I/O objects have no nodeset; their locality is their first normal ancestor's */
    while (anc != NULL && anc->nodeset == NULL) {
        anc = anc->parent;
    }
    if (anc == NULL || hwloc_bitmap_weight(anc->nodeset) != 1) {
        return -1; /* attached to the whole machine, or to several nodes */
    }
    return hwloc_bitmap_first(anc->nodeset);
}

int ema__topo_numa_of_pci(ema__topo_t *t, unsigned domain, unsigned bus, unsigned dev)
{
    hwloc_obj_t pci = hwloc_get_pcidev_by_busid(t->hw, domain, bus, dev, 0);
    return pci != NULL ? topo_numa_of_obj(pci) : -1;
}

void ema__topo_switch_closure(double *bw, const double *to_switch, int n)
{
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) {
            if (i != j && to_switch[i] > 0 && to_switch[j] > 0) {
                bw[i * n + j] = to_switch[i] < to_switch[j] ? to_switch[i] : to_switch[j];
            }
        }
    }
}

static int topo_osdev_index(hwloc_obj_t obj, const char *prefix)
{
    size_t len = strlen(prefix);
    char *end;
    long idx;

    if (obj->name == NULL || strncmp(obj->name, prefix, len) != 0) {
        return -1;
    }
    idx = strtol(obj->name + len, &end, 10);
    if (end == obj->name + len || *end != '\0' || idx < 0 || idx > 4096) {
        return -1;
    }
    return (int)idx;
}

static hwloc_obj_t topo_pci_parent(hwloc_obj_t obj)
{
    for (hwloc_obj_t p = obj->parent; p != NULL; p = p->parent) {
        if (p->type == HWLOC_OBJ_PCI_DEVICE) {
            return p;
        }
        if (p->type != HWLOC_OBJ_OS_DEVICE) {
            break;
        }
    }
    return NULL;
}

/*
 * GPUs as hwloc's NVML and CUDA backends show them.  With both, a GPU is a
 * PCI device with an nvmlN and a cudaN child; NVML's numbering is physical
 * and is the one the NVLinkBandwidth matrix uses, so it wins.  gpu_objs[i]
 * gets the objects the matrix may name for GPU i (nvml, cuda, pci).
 */
static ema_status_t topo_hwloc_gpus(ema__topo_t *t, hwloc_obj_t (**objs_p)[3],
                                    int *have_nvml_p)
{
    hwloc_obj_t (*objs)[3] = NULL;
    hwloc_obj_t osdev = NULL;
    int n_nvml = 0, n_cuda = 0, max_idx = -1;
    const char *prefix;

    while ((osdev = hwloc_get_next_osdev(t->hw, osdev)) != NULL) {
        int i = topo_osdev_index(osdev, "nvml");
        if (i >= 0) {
            n_nvml++;
        } else if ((i = topo_osdev_index(osdev, "cuda")) >= 0) {
            n_cuda++;
        }
    }
    prefix = n_nvml > 0 ? "nvml" : "cuda";
    while ((osdev = hwloc_get_next_osdev(t->hw, osdev)) != NULL) {
        int i = topo_osdev_index(osdev, prefix);
        max_idx = i > max_idx ? i : max_idx;
    }
    *have_nvml_p = n_nvml > 0;
    t->cuda_numbering = n_nvml == 0 && n_cuda > 0;
    if (max_idx < 0) {
        *objs_p = NULL;
        return EMA_SUCCESS;
    }

    /* indexes may have holes (a GPU hidden by a cgroup); keep the numbering */
    t->ngpus = max_idx + 1;
    t->gpus  = calloc((size_t)t->ngpus, sizeof(*t->gpus));
    objs     = calloc((size_t)t->ngpus, sizeof(*objs));
    if (t->gpus == NULL || objs == NULL) {
        goto err_free;
    }
    for (int g = 0; g < t->ngpus; g++) {
        t->gpus[g].numa = -1;
    }
    while ((osdev = hwloc_get_next_osdev(t->hw, osdev)) != NULL) {
        int g = topo_osdev_index(osdev, prefix);
        if (g < 0) {
            continue;
        }
        ema__topo_gpu_t *gpu = &t->gpus[g];
        hwloc_obj_t pci      = topo_pci_parent(osdev);
        const char *model    = hwloc_obj_get_info_by_name(osdev, "GPUModel");
        const char *uuid     = hwloc_obj_get_info_by_name(osdev, "NVIDIAUUID");

        objs[g][0] = osdev;
        objs[g][2] = pci;
        snprintf(gpu->model, sizeof(gpu->model), "%s", model ? model : "NVIDIA GPU");
        snprintf(gpu->uuid, sizeof(gpu->uuid), "%s", uuid ? uuid : "");
        gpu->numa = topo_numa_of_obj(osdev);
        if (pci != NULL) {
            gpu->has_pci = 1;
            gpu->domain  = pci->attr->pcidev.domain;
            gpu->bus     = pci->attr->pcidev.bus;
            gpu->dev     = pci->attr->pcidev.dev;
            /* the cuda OS device of the same GPU, for a matrix that names it */
            for (hwloc_obj_t c = pci->io_first_child; c != NULL; c = c->next_sibling) {
                if (c != osdev && topo_osdev_index(c, "cuda") >= 0) {
                    objs[g][1] = c;
                }
            }
        }
    }
    *objs_p = objs;
    return EMA_SUCCESS;

err_free:
    free(objs);
    free(t->gpus);
    t->gpus  = NULL;
    t->ngpus = 0;
    return EMA_ERR_NO_MEMORY;
}

static int topo_is_nvswitch(hwloc_obj_t obj)
{
    return obj != NULL && obj->subtype != NULL && !strcmp(obj->subtype, "NVSwitch");
}

/* Returns 1 when hwloc had an NVLinkBandwidth matrix and t->bw was filled. */
static int topo_hwloc_matrix(ema__topo_t *t, hwloc_obj_t (*objs)[3])
{
    struct hwloc_distances_s *d = NULL;
    unsigned nr = 1, nsw = 0;
    int *gpu_of = NULL, filled = 0;
    double *to_sw = NULL;

    if (hwloc_distances_get_by_name(t->hw, "NVLinkBandwidth", &nr, &d, 0) != 0 || nr == 0) {
        return 0;
    }
    gpu_of = malloc(d->nbobjs * sizeof(*gpu_of));
    if (gpu_of == NULL) {
        goto out;
    }
    for (unsigned i = 0; i < d->nbobjs; i++) {
        gpu_of[i] = -1;
        nsw += topo_is_nvswitch(d->objs[i]);
        for (int g = 0; g < t->ngpus && gpu_of[i] < 0; g++) {
            for (int k = 0; k < 3; k++) {
                if (objs[g][k] != NULL && objs[g][k] == d->objs[i]) {
                    gpu_of[i] = g;
                }
            }
        }
    }
#if HWLOC_API_VERSION >= 0x00020500
    if (nsw > 0 &&
        hwloc_distances_transform(t->hw, d, HWLOC_DISTANCES_TRANSFORM_TRANSITIVE_CLOSURE, NULL,
                                  0) != 0) {
        ema_warn("hwloc_distances_transform(transitive closure) failed: %m");
        goto out;
    }
#else
    /* hwloc < 2.5 has no transform: the same closure, done here */
    if (nsw > 0) {
        to_sw = calloc((size_t)t->ngpus, sizeof(*to_sw));
        if (to_sw == NULL) {
            goto out;
        }
        for (unsigned i = 0; i < d->nbobjs; i++) {
            for (unsigned k = 0; k < d->nbobjs; k++) {
                if (gpu_of[i] >= 0 && topo_is_nvswitch(d->objs[k])) {
                    to_sw[gpu_of[i]] += EMA_TOPO_MBPS_TO_GBPS(d->values[i * d->nbobjs + k]);
                }
            }
        }
    }
#endif
    for (unsigned i = 0; i < d->nbobjs; i++) {
        for (unsigned j = 0; j < d->nbobjs; j++) {
            int a = gpu_of[i], b = gpu_of[j];
            if (a >= 0 && b >= 0 && a != b) {
                t->bw[a * t->ngpus + b] = EMA_TOPO_MBPS_TO_GBPS(d->values[i * d->nbobjs + j]);
            }
        }
    }
    if (to_sw != NULL) {
        ema__topo_switch_closure(t->bw, to_sw, t->ngpus);
    }
    snprintf(t->source, sizeof(t->source), "hwloc NVLinkBandwidth%s",
             nsw > 0 ? ", NVSwitch transitive closure" : "");
    filled = 1;
out:
    free(to_sw);
    free(gpu_of);
    hwloc_distances_release(t->hw, d);
    return filled;
}

static ema_status_t topo_numa(ema__topo_t *t)
{
    struct hwloc_distances_s *d = NULL;
    unsigned nr = 1;
    int n = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_NUMANODE);

    t->nnuma   = n > 0 ? n : 0;
    t->numa_os = calloc((size_t)(t->nnuma > 0 ? t->nnuma : 1), sizeof(*t->numa_os));
    if (t->numa_os == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    for (int i = 0; i < t->nnuma; i++) {
        t->numa_os[i] = (int)hwloc_get_obj_by_type(t->hw, HWLOC_OBJ_NUMANODE, (unsigned)i)->os_index;
    }
    if (hwloc_distances_get_by_name(t->hw, "NUMALatency", &nr, &d, 0) == 0 && nr > 0) {
        t->numa_dist = calloc((size_t)t->nnuma * (size_t)t->nnuma, sizeof(*t->numa_dist));
        if (t->numa_dist != NULL) {
            for (int i = 0; i < t->nnuma * t->nnuma; i++) {
                t->numa_dist[i] = (i / t->nnuma == i % t->nnuma) ? 10 : 20;
            }
            for (unsigned i = 0; i < d->nbobjs; i++) {
                for (unsigned j = 0; j < d->nbobjs; j++) {
                    int a = topo_numa_index(t, (int)d->objs[i]->os_index);
                    int b = topo_numa_index(t, (int)d->objs[j]->os_index);
                    if (a >= 0 && b >= 0) {
                        t->numa_dist[a * t->nnuma + b] = (int)d->values[i * d->nbobjs + j];
                    }
                }
            }
        }
        hwloc_distances_release(t->hw, d);
    }
    return EMA_SUCCESS;
}

static int topo_find_my_numa(ema__topo_t *t)
{
    hwloc_bitmap_t cpus, nodes;
    int numa = -1;

    if (t->thissystem && (cpus = hwloc_bitmap_alloc()) != NULL) {
        nodes = hwloc_bitmap_alloc();
        /* bound to one node: that one; else where it runs now, which the
         * scheduler may change, but is the best guess for first touch */
        if (nodes != NULL && hwloc_get_cpubind(t->hw, cpus, HWLOC_CPUBIND_PROCESS) == 0) {
            hwloc_cpuset_to_nodeset(t->hw, cpus, nodes);
            if (hwloc_bitmap_weight(nodes) == 1) {
                numa = hwloc_bitmap_first(nodes);
            }
        }
        if (nodes != NULL && numa < 0 &&
            hwloc_get_last_cpu_location(t->hw, cpus, HWLOC_CPUBIND_THREAD) == 0) {
            hwloc_cpuset_to_nodeset(t->hw, cpus, nodes);
            if (hwloc_bitmap_weight(nodes) == 1) {
                numa = hwloc_bitmap_first(nodes);
            }
        }
        hwloc_bitmap_free(nodes);
        hwloc_bitmap_free(cpus);
    }
    if (numa < 0 && t->nnuma == 1) {
        numa = t->numa_os[0];
    }
    return numa;
}

ema_status_t ema__topo_load(ema__topo_t **topo_p)
{
    hwloc_obj_t (*objs)[3] = NULL;
    int have_nvml = 0;
    ema__topo_t *t;
    ema_status_t status;

    if (topo_p == NULL) {
        return EMA_ERR_INVALID_PARAM;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    if (hwloc_topology_init(&t->hw) != 0) {
        ema_error("hwloc_topology_init failed: %m");
        status = EMA_ERR_IO;
        goto err_free;
    }
    /* without this hwloc drops PCI and OS devices, hence every GPU */
    hwloc_topology_set_io_types_filter(t->hw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t->hw) != 0) {
        ema_error("hwloc_topology_load failed: %m");
        status = EMA_ERR_IO;
        goto err_hwloc;
    }
    t->thissystem = hwloc_topology_is_thissystem(t->hw);

    status = topo_numa(t);
    if (status != EMA_SUCCESS) {
        goto err_hwloc;
    }
    t->my_numa = topo_find_my_numa(t);

    status = topo_hwloc_gpus(t, &objs, &have_nvml);
    if (status != EMA_SUCCESS) {
        goto err_numa;
    }
    if (t->ngpus > 0) {
        t->bw = calloc((size_t)t->ngpus * (size_t)t->ngpus, sizeof(*t->bw));
        if (t->bw == NULL) {
            status = EMA_ERR_NO_MEMORY;
            goto err_gpus;
        }
        if (topo_hwloc_matrix(t, objs)) {
            goto out;
        }
    }
    if (have_nvml) {
        /* hwloc's NVML backend ran and saw no active NVLink */
        snprintf(t->source, sizeof(t->source), "hwloc NVML backend: no NVLink");
        goto out;
    }
    if (t->thissystem) {
        /* Debian's and Ubuntu's hwloc have no NVML backend: ask the driver */
        if (ema__topo_probe_nvml(t) == EMA_SUCCESS || ema__topo_probe_cuda(t) == EMA_SUCCESS) {
            goto out;
        }
    }
    if (t->ngpus > 0) {
        snprintf(t->source, sizeof(t->source), "hwloc CUDA backend: no link data");
    } else {
        snprintf(t->source, sizeof(t->source), "none: no GPU");
    }
out:
    free(objs);
    ema_debug("topology: %d gpus, %d numa nodes, source %s", t->ngpus, t->nnuma, t->source);
    *topo_p = t;
    return EMA_SUCCESS;

err_gpus:
    free(objs);
    free(t->gpus);
err_numa:
    free(t->numa_dist);
    free(t->numa_os);
err_hwloc:
    hwloc_topology_destroy(t->hw);
err_free:
    free(t);
    return status;
}

void ema__topo_destroy(ema__topo_t *topo)
{
    if (topo == NULL) {
        return;
    }
    free(topo->bw);
    free(topo->gpus);
    free(topo->numa_dist);
    free(topo->numa_os);
    hwloc_topology_destroy(topo->hw);
    free(topo);
}

int ema__topo_ngpus(const ema__topo_t *topo)
{
    return topo != NULL ? topo->ngpus : 0;
}

double ema__topo_bandwidth(const ema__topo_t *topo, int gpu_a, int gpu_b)
{
    if (topo == NULL || gpu_a < 0 || gpu_b < 0 || gpu_a >= topo->ngpus ||
        gpu_b >= topo->ngpus || gpu_a == gpu_b) {
        return 0.0;
    }
    return topo->bw[gpu_a * topo->ngpus + gpu_b];
}

int ema__topo_gpu_numa(const ema__topo_t *topo, int gpu)
{
    if (topo == NULL || gpu < 0 || gpu >= topo->ngpus) {
        return -1;
    }
    return topo->gpus[gpu].numa;
}

int ema__topo_my_numa(const ema__topo_t *topo)
{
    return topo != NULL ? topo->my_numa : -1;
}

int ema__topo_nnuma(const ema__topo_t *topo)
{
    return topo != NULL ? topo->nnuma : 0;
}

int ema__topo_numa_distance(const ema__topo_t *topo, int numa_a, int numa_b)
{
    int a, b;

    if (topo == NULL || numa_a < 0 || numa_b < 0) {
        return EMA_TOPO_NUMA_UNKNOWN;
    }
    a = topo_numa_index(topo, numa_a);
    b = topo_numa_index(topo, numa_b);
    if (a < 0 || b < 0) {
        return EMA_TOPO_NUMA_UNKNOWN;
    }
    if (topo->numa_dist != NULL) {
        return topo->numa_dist[a * topo->nnuma + b];
    }
    return a == b ? 10 : 20;
}

const char *ema__topo_source(const ema__topo_t *topo)
{
    return topo != NULL ? topo->source : "none: no topology";
}
