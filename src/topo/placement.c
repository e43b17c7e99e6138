/* Which GPU each local rank uses, and in which order a rank asks for loans. */
#include "topo_priv.h"

#include "util/log.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <stdlib.h>
#include <string.h>

/*
 * The GPUs CUDA_VISIBLE_DEVICES leaves, in CUDA's order: indexes or GPU-UUID
 * prefixes.  Like CUDA, stop at the first entry that names no GPU (so "-1"
 * or "" hide them all), and ignore a repeated one.  Returns the count.
 */
static int topo_visible(const ema__topo_t *t, int *visible)
{
    const char *cvd = t->cuda_numbering ? NULL : getenv("CUDA_VISIBLE_DEVICES");
    int n = 0;

    if (cvd == NULL) {
        for (int g = 0; g < t->ngpus; g++) {
            visible[n++] = g;
        }
        return n;
    }
    while (*cvd != '\0' && n < t->ngpus) {
        char tok[128];
        size_t len = strcspn(cvd, ",");
        int g = -1;

        while (len > 0 && isspace((unsigned char)*cvd)) {
            cvd++;
            len--;
        }
        snprintf(tok, sizeof(tok), "%.*s", (int)(len < sizeof(tok) ? len : sizeof(tok) - 1), cvd);
        for (size_t i = strlen(tok); i > 0 && isspace((unsigned char)tok[i - 1]); i--) {
            tok[i - 1] = '\0';
        }
        if (tok[0] != '\0' && strspn(tok, "0123456789") == strlen(tok)) {
            long v = strtol(tok, NULL, 10);
            g = v < t->ngpus ? (int)v : -1;
        } else if (!strncmp(tok, "GPU-", 4) && strlen(tok) > 4) {
            for (int k = 0; k < t->ngpus && g < 0; k++) {
                if (!strncmp(t->gpus[k].uuid, tok, strlen(tok))) {
                    g = k;
                }
            }
        }
        if (g < 0) {
            break; /* MIG-..., an index out of range, or a UUID we do not know */
        }
        for (int k = 0; k < n; k++) {
            if (visible[k] == g) {
                g = -1;
            }
        }
        if (g < 0) {
            break;
        }
        visible[n++] = g;
        cvd += len;
        if (*cvd == ',') {
            cvd++;
        }
    }
    return n;
}

/* Parse EMA_GPU_MAP into map[] (up to max entries); -1 if malformed. */
static int topo_parse_map(const char *str, int *map, int max)
{
    int n = 0;

    while (*str != '\0') {
        char *end;
        long v;

        while (isspace((unsigned char)*str)) {
            str++;
        }
        if (!isdigit((unsigned char)*str)) {
            return -1;
        }
        errno = 0;
        v = strtol(str, &end, 10);
        if (errno != 0 || v > 4096) {
            return -1;
        }
        if (map != NULL && n < max) {
            map[n] = (int)v;
        }
        n++;
        str = end;
        while (isspace((unsigned char)*str)) {
            str++;
        }
        if (*str == ',') {
            str++;
            if (*str == '\0') {
                return -1;
            }
        } else if (*str != '\0') {
            return -1;
        }
    }
    return n;
}

int ema__topo_default_nranks(const ema__topo_t *topo, const ema__topo_config_t *cfg)
{
    int *visible, n;

    if (cfg != NULL && cfg->gpu_map != NULL && cfg->gpu_map[0] != '\0') {
        n = topo_parse_map(cfg->gpu_map, NULL, 0);
        if (n > 0) {
            return n;
        }
    }
    if (topo == NULL || topo->ngpus == 0 ||
        (visible = malloc((size_t)topo->ngpus * sizeof(*visible))) == NULL) {
        return 1;
    }
    n = topo_visible(topo, visible);
    free(visible);
    return n > 0 ? n : 1;
}

ema_status_t ema__topo_map_ranks(const ema__topo_t *topo, const ema__topo_config_t *cfg,
                                 int nranks, int *gpu_of_rank, int *shared_p)
{
    int *visible = NULL, *map = NULL, *out = NULL;
    int nvis = 0, shared = 0, n = 0;
    ema_status_t status = EMA_SUCCESS;
    const char *gpu_map = cfg != NULL ? cfg->gpu_map : NULL;

    if (topo == NULL || nranks <= 0 || gpu_of_rank == NULL) {
        return EMA_ERR_INVALID_PARAM;
    }
    out = malloc((size_t)nranks * sizeof(*out));
    if (out == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    if (topo->ngpus > 0) {
        visible = malloc((size_t)topo->ngpus * sizeof(*visible));
        if (visible == NULL) {
            status = EMA_ERR_NO_MEMORY;
            goto out;
        }
        nvis = topo_visible(topo, visible);
    }

    /* a malformed map is refused everywhere, a GPU-less host included */
    if (gpu_map != NULL && gpu_map[0] != '\0') {
        n = topo_parse_map(gpu_map, NULL, 0);
    }
    if (n < 0) {
        ema_error("invalid EMA_GPU_MAP '%s' (expected GPU numbers like 0,1,2,3)", gpu_map);
        status = EMA_ERR_INVALID_PARAM;
        goto out;
    }
    if (gpu_map != NULL && gpu_map[0] != '\0' && topo->ngpus == 0) {
        /* the host kind stands in for GPUs here; a map made for a GPU host
         * must not stop the same launch script from running */
        ema_warn("EMA_GPU_MAP '%s' ignored: this host has no GPU", gpu_map);
        gpu_map = NULL;
    }
    if (gpu_map != NULL && gpu_map[0] != '\0') {
        if (n < nranks) {
            ema_error("EMA_GPU_MAP '%s' has %d entries for %d local ranks", gpu_map, n, nranks);
            status = EMA_ERR_INVALID_PARAM;
            goto out;
        }
        map = malloc((size_t)n * sizeof(*map));
        if (map == NULL) {
            status = EMA_ERR_NO_MEMORY;
            goto out;
        }
        topo_parse_map(gpu_map, map, n);
        for (int r = 0; r < nranks; r++) {
            if (map[r] >= nvis) {
                ema_error("EMA_GPU_MAP entry %d for local rank %d: only %d GPU%s visible", map[r],
                          r, nvis, nvis == 1 ? " is" : "s are");
                status = EMA_ERR_INVALID_PARAM;
                goto out;
            }
            out[r] = visible[map[r]];
        }
    } else {
        for (int r = 0; r < nranks; r++) {
            out[r] = nvis > 0 ? visible[r % nvis] : -1;
        }
    }

    for (int r = 0; r < nranks && !shared; r++) {
        for (int q = r + 1; q < nranks; q++) {
            if (out[r] >= 0 && out[r] == out[q]) {
                /* allowed: one GPU can host several ranks, each with its own arena */
                ema_info("local ranks %d and %d share gpu %d", r, q, out[r]);
                shared = 1;
                break;
            }
        }
    }
    memcpy(gpu_of_rank, out, (size_t)nranks * sizeof(*out));
    if (shared_p != NULL) {
        *shared_p = shared;
    }
out:
    free(map);
    free(visible);
    free(out);
    return status;
}

typedef struct {
    int    rank;
    double bw;       /* DBL_MAX: same GPU */
    size_t lendable;
    int    numa_dist;
} ema_topo_lender_t;

static int topo_numa_of_rank(const ema__topo_t *t, const int *gpu_of_rank,
                             const int *numa_of_rank, int r)
{
    if (numa_of_rank != NULL) {
        return numa_of_rank[r];
    }
    return gpu_of_rank[r] >= 0 ? ema__topo_gpu_numa(t, gpu_of_rank[r]) : -1;
}

/* Returns 1 if a is the worse lender (goes after b). */
static int topo_lender_after(const ema_topo_lender_t *a, const ema_topo_lender_t *b,
                             int numa_first)
{
    if (numa_first && a->numa_dist != b->numa_dist) {
        return a->numa_dist > b->numa_dist;
    }
    if (a->bw != b->bw) {
        return a->bw < b->bw;
    }
    if (a->lendable != b->lendable) {
        return a->lendable < b->lendable;
    }
    if (a->numa_dist != b->numa_dist) {
        return a->numa_dist > b->numa_dist;
    }
    return a->rank > b->rank;
}

void ema__topo_lender_order(const ema__topo_t *topo, const int *gpu_of_rank,
                            const int *numa_of_rank, const size_t *lendable, int nranks,
                            int me, int *order)
{
    ema_topo_lender_t *l;
    int n = 0, my_gpu, my_numa;

    if (topo == NULL || gpu_of_rank == NULL || order == NULL || me < 0 || me >= nranks) {
        return;
    }
    l = malloc((size_t)nranks * sizeof(*l));
    if (l == NULL) {
        /* still a valid order: by rank */
        for (int r = 0; r < nranks; r++) {
            if (r != me) {
                order[n++] = r;
            }
        }
        return;
    }
    my_gpu  = gpu_of_rank[me];
    my_numa = topo_numa_of_rank(topo, gpu_of_rank, numa_of_rank, me);
    for (int r = 0; r < nranks; r++) {
        if (r == me) {
            continue;
        }
        ema_topo_lender_t c;
        c.rank      = r;
        c.bw        = (my_gpu >= 0 && gpu_of_rank[r] == my_gpu)
                          ? DBL_MAX /* no link to cross at all */
                          : ema__topo_bandwidth(topo, my_gpu, gpu_of_rank[r]);
        c.lendable  = lendable != NULL ? lendable[r] : 0;
        c.numa_dist = ema__topo_numa_distance(
            topo, my_numa, topo_numa_of_rank(topo, gpu_of_rank, numa_of_rank, r));
        /* insertion sort: a few ranks per host */
        int i = n++;
        while (i > 0 && topo_lender_after(&l[i - 1], &c, my_gpu < 0)) {
            l[i] = l[i - 1];
            i--;
        }
        l[i] = c;
    }
    for (int i = 0; i < n; i++) {
        order[i] = l[i].rank;
    }
    free(l);
}
