/* The topology section of ema_info. */
#include "topo_priv.h"

#include <stdlib.h>

void ema__topo_print(const ema__topo_t *topo, FILE *stream, int nranks, const int *gpu_of_rank,
                     const int *numa_of_rank)
{
    int *order;

    if (topo == NULL || stream == NULL) {
        return;
    }
    fprintf(stream, "# gpus:          %d\n", topo->ngpus);
    fprintf(stream, "# link source:   %s\n", topo->source);
    for (int g = 0; g < topo->ngpus; g++) {
        const ema__topo_gpu_t *gpu = &topo->gpus[g];
        fprintf(stream, "#   gpu %d: %s", g, gpu->model);
        if (gpu->has_pci) {
            fprintf(stream, ", pci %04x:%02x:%02x.0", gpu->domain, gpu->bus, gpu->dev);
        }
        if (gpu->numa >= 0) {
            fprintf(stream, ", numa %d\n", gpu->numa);
        } else {
            fprintf(stream, ", numa unknown\n");
        }
    }
    if (topo->ngpus > 1) {
        int links = 0;
        fprintf(stream, "# link bandwidth, GB/s per direction (- = no direct link):\n#        ");
        for (int b = 0; b < topo->ngpus; b++) {
            char label[16];
            snprintf(label, sizeof(label), "gpu%d", b);
            fprintf(stream, " %7s", label);
        }
        fprintf(stream, "\n");
        for (int a = 0; a < topo->ngpus; a++) {
            fprintf(stream, "#   gpu%-2d", a);
            for (int b = 0; b < topo->ngpus; b++) {
                double bw = ema__topo_bandwidth(topo, a, b);
                if (a == b) {
                    fprintf(stream, " %7s", "x");
                } else if (bw > 0) {
                    fprintf(stream, " %7.0f", bw);
                    links++;
                } else {
                    fprintf(stream, " %7s", "-");
                }
            }
            fprintf(stream, "\n");
        }
        if (links == 0) {
            fprintf(stream, "#   (no NVLink peers)\n");
        }
    } else if (topo->ngpus == 1) {
        fprintf(stream, "#   (one GPU: no NVLink peers)\n");
    }

    fprintf(stream, "# numa nodes:    %d", topo->nnuma);
    if (topo->my_numa >= 0) {
        fprintf(stream, ", this process on %d", topo->my_numa);
    }
    fprintf(stream, "\n");
    if (topo->nnuma > 1) {
        fprintf(stream, "# numa distance %s:\n#        ",
                topo->numa_dist ? "(hwloc NUMALatency)" : "(assumed, hwloc has none)");
        for (int b = 0; b < topo->nnuma; b++) {
            char label[16];
            snprintf(label, sizeof(label), "node%d", topo->numa_os[b]);
            fprintf(stream, " %7s", label);
        }
        fprintf(stream, "\n");
        for (int a = 0; a < topo->nnuma; a++) {
            fprintf(stream, "#  node%-2d", topo->numa_os[a]);
            for (int b = 0; b < topo->nnuma; b++) {
                fprintf(stream, " %7d",
                        ema__topo_numa_distance(topo, topo->numa_os[a], topo->numa_os[b]));
            }
            fprintf(stream, "\n");
        }
    }

    if (nranks <= 0 || gpu_of_rank == NULL) {
        return;
    }
    fprintf(stream, "# rank -> gpu:  ");
    for (int r = 0; r < nranks; r++) {
        if (gpu_of_rank[r] >= 0) {
            fprintf(stream, " %d->%d", r, gpu_of_rank[r]);
        } else {
            fprintf(stream, " %d->none", r);
        }
    }
    fprintf(stream, "\n");
    for (int r = 0; r < nranks; r++) {
        int first = 1, others = 0;
        for (int q = 0; q < nranks; q++) {
            if (gpu_of_rank[r] >= 0 && gpu_of_rank[q] == gpu_of_rank[r] && q != r) {
                first &= q > r;
                others++;
            }
        }
        if (others == 0 || !first) {
            continue; /* one line per shared GPU, at its lowest rank */
        }
        fprintf(stream, "#   note: gpu %d is shared by local ranks", gpu_of_rank[r]);
        for (int q = r; q < nranks; q++) {
            if (gpu_of_rank[q] == gpu_of_rank[r]) {
                fprintf(stream, " %d", q);
            }
        }
        fprintf(stream, "\n");
    }
    if (nranks < 2 || (order = malloc((size_t)nranks * sizeof(*order))) == NULL) {
        fprintf(stream, "# lender order:  (one rank: no lenders)\n");
        return;
    }
    fprintf(stream, "# lender order:  (best first: same gpu, link bandwidth, lendable memory, "
                    "numa distance, rank)\n");
    for (int me = 0; me < nranks; me++) {
        ema__topo_lender_order(topo, gpu_of_rank, numa_of_rank, NULL, nranks, me, order);
        fprintf(stream, "#   rank %d:", me);
        for (int i = 0; i < nranks - 1; i++) {
            fprintf(stream, " %d", order[i]);
        }
        fprintf(stream, "\n");
    }
    free(order);
}
