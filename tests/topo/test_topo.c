/*
 * Topology tests over golden hwloc XML files (the *.xml files here, written by
 * make_golden.py), loaded through HWLOC_XMLFILE as a user would.  Each checks
 * the bandwidth matrix and the lender orders that follow from it.
 */
#include "topo/topo.h"
#include "topo/topo_priv.h"

#include "../unit/check_main.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef EMA_TOPO_XMLDIR
#define EMA_TOPO_XMLDIR "tests/topo"
#endif

#define GB (1024ul * 1024 * 1024)

static ema__topo_t *load_xml(const char *file)
{
    const char *srcdir = getenv("top_srcdir");
    char path[4096];
    ema__topo_t *topo = NULL;

    if (srcdir != NULL) {
        snprintf(path, sizeof(path), "%s/tests/topo/%s", srcdir, file);
    } else {
        snprintf(path, sizeof(path), "%s/%s", EMA_TOPO_XMLDIR, file);
    }
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "golden topology %s is missing", path);
    fclose(f);
    setenv("HWLOC_XMLFILE", path, 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    unsetenv("EMA_GPU_MAP");
    ck_assert_int_eq(ema__topo_load(&topo), EMA_SUCCESS);
    ck_assert_ptr_nonnull(topo);
    return topo;
}

static void check_order(const ema__topo_t *topo, const int *gpu_of_rank, const int *numa_of_rank,
                        const size_t *lendable, int nranks, int me, const int *expected)
{
    int order[64];
    char got[256] = "", want[256] = "";

    ema__topo_lender_order(topo, gpu_of_rank, numa_of_rank, lendable, nranks, me, order);
    for (int i = 0; i < nranks - 1; i++) {
        snprintf(got + strlen(got), sizeof(got) - strlen(got), " %d", order[i]);
        snprintf(want + strlen(want), sizeof(want) - strlen(want), " %d", expected[i]);
    }
    ck_assert_msg(!strcmp(got, want), "rank %d lender order:%s, expected:%s", me, got, want);
}

static void map_identity(const ema__topo_t *topo, int nranks, int *gpu_of_rank)
{
    ema__topo_config_t cfg = {.gpu_map = ""};
    int shared = -1;
    ck_assert_int_eq(ema__topo_map_ranks(topo, &cfg, nranks, gpu_of_rank, &shared), EMA_SUCCESS);
    ck_assert_int_eq(shared, 0);
}

/* A golden topology, seen through CUDA_VISIBLE_DEVICES=@visible. */
static ema__topo_t *load_visible(const char *file, const char *visible)
{
    ema__topo_t *topo = load_xml(file); /* which unsets CUDA_VISIBLE_DEVICES */
    setenv("CUDA_VISIBLE_DEVICES", visible, 1);
    return topo;
}

/* A golden topology, with rank r on GPU r of its @n (as map_identity). */
static ema__topo_t *load_mapped(const char *file, int n, int *gpu)
{
    ema__topo_t *topo = load_xml(file);
    map_identity(topo, n, gpu);
    return topo;
}

/* The golden topology @file has @n GPUs, its links come from @source, GPU
 * a sits on NUMA node @numa[a] (not checked where @numa is NULL), and the
 * bandwidth from GPU a to GPU b is @bw[a * n + b], or, where @bw is NULL,
 * @link (0 from a GPU to itself): within 1e-9, or exactly where @exact.
 * Returns the topology. */
static ema__topo_t *load_links(const char *file, int n, const char *source, const int *numa,
                               const double *bw, double link, int exact)
{
    ema__topo_t *topo = load_xml(file);

    ck_assert_int_eq(ema__topo_ngpus(topo), n);
    ck_assert_str_eq(ema__topo_source(topo), source);
    for (int a = 0; a < n; a++) {
        if (numa != NULL) {
            ck_assert_int_eq(ema__topo_gpu_numa(topo, a), numa[a]);
        }
        for (int b = 0; b < n; b++) {
            double want = (bw != NULL) ? bw[a * n + b] : (a == b ? 0.0 : link);
            if (exact) {
                ck_assert_double_eq(ema__topo_bandwidth(topo, a, b), want);
            } else {
                ck_assert_double_eq_tol(ema__topo_bandwidth(topo, a, b), want, 1e-9);
            }
        }
    }
    return topo;
}

/* A lender order to expect: rank @me's, given @lendable (NULL: none). */
typedef struct {
    int           me;
    const size_t *lendable;
    int           order[8];
} want_order_t;

/* On the golden topology @file, its @n GPUs mapped one per rank, each
 * @want[0..nwant) holds (check_order). */
static void check_orders(const char *file, int n, const want_order_t *want, int nwant)
{
    int gpu[8];
    ema__topo_t *topo = load_mapped(file, n, gpu);

    for (int i = 0; i < nwant; i++) {
        check_order(topo, gpu, NULL, want[i].lendable, n, want[i].me, want[i].order);
    }
    ema__topo_destroy(topo);
}

/* Mapping @nranks local ranks with @cfg succeeds, puts rank @first + k on
 * GPU @want[k] for each k < @nwant, and says whether a GPU is shared as
 * @shared does; then @cfg gives @ndefault local ranks by default (each not
 * checked where -1). */
static void check_map(const ema__topo_t *topo, const ema__topo_config_t *cfg, int nranks,
                      int first, const int *want, int nwant, int shared, int ndefault)
{
    int gpu[16], sh = -1;

    ck_assert_int_eq(ema__topo_map_ranks(topo, cfg, nranks, gpu, &sh), EMA_SUCCESS);
    for (int k = 0; k < nwant; k++) {
        ck_assert_int_eq(gpu[first + k], want[k]);
    }
    if (shared != -1) {
        ck_assert_int_eq(sh, shared);
    }
    if (ndefault != -1) {
        ck_assert_int_eq(ema__topo_default_nranks(topo, cfg), ndefault);
    }
}

/* Each string of @want, up to NULL, is in @buf; then @buf is freed. */
static void assert_printed(char *buf, const char *const *want)
{
    for (; *want != NULL; want++) {
        ck_assert_ptr_nonnull(strstr(buf, *want));
    }
    free(buf);
}

/* What ema__topo_print writes for @nranks ranks on GPUs @gpu (malloc'ed). */
static char *print_topo(const ema__topo_t *topo, int nranks, const int *gpu)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ema__topo_print(topo, f, nranks, gpu, NULL);
    fclose(f);
    return buf;
}

/* The NUMA node of each of 8 GPUs on two sockets, four per socket. */
static const int two_sockets[8] = {0, 0, 0, 0, 1, 1, 1, 1};

/* ---- 8 GPUs, full NVLink mesh, two sockets ------------------------------- */

EMA_TEST("golden", test_mesh_every_gpu_pair_has_two_nvlinks)
{
    ema__topo_t *topo =
        load_links("nvlink-mesh-8gpu.xml", 8, "hwloc NVLinkBandwidth", two_sockets, NULL, 50.0, 0);

    ck_assert_int_eq(ema__topo_numa_distance(topo, 0, 1), 21);
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("golden", test_mesh_equal_links_prefer_lenders_on_the_same_numa_node)
{
    check_orders("nvlink-mesh-8gpu.xml", 8, (const want_order_t[]){
        {0, NULL, {1, 2, 3, 4, 5, 6, 7}},
        {5, NULL, {4, 6, 7, 0, 1, 2, 3}}}, 2);
}
END_TEST

EMA_TEST("golden", test_mesh_more_lendable_memory_beats_numa_distance)
{
    const size_t lendable[8] = {GB, GB, GB, GB, GB, GB, GB, 8 * GB};

    check_orders("nvlink-mesh-8gpu.xml", 8, (const want_order_t[]){
        {0, lendable, {7, 1, 2, 3, 4, 5, 6}}}, 1);
}
END_TEST

/* ---- 8 GPUs behind 4 NVSwitches ------------------------------------------ */

EMA_TEST("golden", test_nvswitch_closure_gives_all_pairs_bandwidth)
{
    /* the switches are in the matrix, but they are not GPUs; 18 links of
     * 25 GB/s to the switches: every pair gets all 450 */
    ema__topo_destroy(load_links("nvswitch-8gpu.xml", 8,
                                 "hwloc NVLinkBandwidth, NVSwitch transitive closure", NULL, NULL,
                                 450.0, 0));
}
END_TEST

EMA_TEST("golden", test_nvswitch_lenders_tie_on_bandwidth_then_numa_then_rank)
{
    const size_t lendable[8] = {GB, GB, 2 * GB, GB, GB, GB, GB, GB};

    check_orders("nvswitch-8gpu.xml", 8, (const want_order_t[]){
        {6, NULL, {4, 5, 7, 0, 1, 2, 3}},
        {6, lendable, {2, 4, 5, 7, 0, 1, 3}}}, 2);
}
END_TEST

/* ---- 8 GPUs over PCIe only, two sockets ---------------------------------- */

EMA_TEST("golden", test_pcie_only_gpus_have_no_links)
{
    ema__topo_destroy(load_links("pcie-2socket-8gpu.xml", 8, "hwloc NVML backend: no NVLink",
                                 two_sockets, NULL, 0.0, 1));
}
END_TEST

EMA_TEST("golden", test_pcie_lenders_follow_numa_distance)
{
    check_orders("pcie-2socket-8gpu.xml", 8, (const want_order_t[]){
        {0, NULL, {1, 2, 3, 4, 5, 6, 7}},
        {4, NULL, {5, 6, 7, 0, 1, 2, 3}}}, 2);
}
END_TEST

EMA_TEST("golden", test_pcie_lendable_memory_comes_before_numa_distance)
{
    const size_t lendable[8] = {GB, GB, GB, GB, GB, GB, 2 * GB, GB};

    check_orders("pcie-2socket-8gpu.xml", 8, (const want_order_t[]){
        {0, lendable, {6, 1, 2, 3, 4, 5, 7}}}, 1);
}
END_TEST

/* ---- 4 GPUs with uneven NVLink counts ------------------------------------ */

EMA_TEST("golden", test_uneven_nvlink_counts_give_uneven_bandwidth)
{
    static const double want[4][4] = {
        {0, 100, 50, 25}, {100, 0, 25, 50}, {50, 25, 0, 100}, {25, 50, 100, 0}};

    ema__topo_destroy(load_links("nvlink-uneven-4gpu.xml", 4, "hwloc NVLinkBandwidth",
                                 (const int[]){0, 0, 0, 0}, &want[0][0], 0, 0));
}
END_TEST

EMA_TEST("golden", test_uneven_lenders_ordered_by_link_bandwidth_over_lendable_memory)
{
    const size_t lendable[4] = {GB, GB, GB, 64 * GB};

    check_orders("nvlink-uneven-4gpu.xml", 4, (const want_order_t[]){
        {0, NULL, {1, 2, 3}},
        {1, NULL, {0, 3, 2}},
        {2, NULL, {3, 0, 1}},
        {3, NULL, {2, 1, 0}},
        /* the 4-link peer wins even though rank 3 has far more to lend */
        {0, lendable, {1, 2, 3}}}, 5);
}
END_TEST

EMA_TEST("golden", test_shared_gpu_rank_is_the_first_lender)
{
    ema__topo_t *topo = load_xml("nvlink-uneven-4gpu.xml");
    int gpu[5] = {0, 1, 2, 3, 0};

    check_order(topo, gpu, NULL, NULL, 5, 0, (int[]){4, 1, 2, 3});
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("golden", test_nvml_fallback_switch_closure_matches_hwloc)
{
    /* what the NVML fallback computes from per-GPU link sums: GPU 2 has only
     * 12 links up, so every pair with it gets its 300, others keep 450, and
     * a direct link between GPUs without switch links is left alone */
    double to_sw[4] = {450, 450, 300, 0};
    double bw[16] = {0};
    bw[3 * 4 + 0] = bw[0 * 4 + 3] = 25;

    ema__topo_switch_closure(bw, to_sw, 4);
    ck_assert_double_eq(bw[0 * 4 + 1], 450);
    ck_assert_double_eq(bw[1 * 4 + 0], 450);
    ck_assert_double_eq(bw[0 * 4 + 2], 300);
    ck_assert_double_eq(bw[2 * 4 + 1], 300);
    ck_assert_double_eq(bw[0 * 4 + 3], 25);
    ck_assert_double_eq(bw[1 * 4 + 3], 0);
    ck_assert_double_eq(bw[0 * 4 + 0], 0);
}
END_TEST

/* ---- a host with no GPU --------------------------------------------------- */

EMA_TEST("golden", test_no_gpu_host_reports_no_gpu_and_maps_ranks_to_none)
{
    ema__topo_t *topo = load_xml("no-gpu.xml");
    ema__topo_config_t cfg = {.gpu_map = ""};

    ck_assert_int_eq(ema__topo_ngpus(topo), 0);
    ck_assert_str_eq(ema__topo_source(topo), "none: no GPU");
    check_map(topo, &cfg, 4, 0, (const int[]){-1, -1, -1, -1}, 4, 0, -1);
    ck_assert_int_eq(ema__topo_numa_distance(topo, 1, 0), 21);
    ck_assert_int_eq(ema__topo_numa_distance(topo, 1, 1), 10);
    /* a map written for a GPU host does not stop a GPU-less one */
    cfg.gpu_map = "0,0,1,1";
    check_map(topo, &cfg, 4, 0, (const int[]){-1}, 1, 0, -1);
    /* but a malformed one is refused there too */
    int gpu[4], sh = -1;
    cfg.gpu_map = "a,b";
    ck_assert_int_eq(ema__topo_map_ranks(topo, &cfg, 4, gpu, &sh), EMA_ERR_INVALID_PARAM);
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("golden", test_no_gpu_host_orders_lenders_by_numa_distance_first)
{
    ema__topo_t *topo = load_xml("no-gpu.xml");
    int gpu[4] = {-1, -1, -1, -1}, numa[4] = {0, 1, 0, 1};
    size_t lendable[4] = {GB, 16 * GB, GB, 2 * GB};

    check_order(topo, gpu, numa, NULL, 4, 0, (int[]){2, 1, 3});
    check_order(topo, gpu, numa, NULL, 4, 3, (int[]){1, 0, 2});
    /* lendable memory only breaks ties between equally near nodes */
    check_order(topo, gpu, numa, lendable, 4, 0, (int[]){2, 1, 3});
    check_order(topo, gpu, numa, lendable, 4, 2, (int[]){0, 1, 3});
    ema__topo_destroy(topo);
}
END_TEST

/* ---- rank -> GPU ---------------------------------------------------------- */

EMA_TEST("map", test_ranks_map_to_gpus_by_local_rank_and_wrap_when_more_ranks)
{
    ema__topo_t *topo = load_xml("nvlink-mesh-8gpu.xml");
    ema__topo_config_t cfg = {.gpu_map = ""};

    check_map(topo, &cfg, 8, 0, (const int[]){0, 1, 2, 3, 4, 5, 6, 7}, 8, 0, -1);
    check_map(topo, &cfg, 10, 8, (const int[]){0, 1}, 2, 1, 8);
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("map", test_cuda_visible_devices_restricts_and_reorders_gpus)
{
    ema__topo_t *topo = load_visible("nvlink-mesh-8gpu.xml", "6,2");
    ema__topo_config_t cfg = {.gpu_map = ""};
    int gpu[3];

    check_map(topo, &cfg, 3, 0, (const int[]){6, 2, 6}, 3, 1, 2);

    /* a UUID prefix, as CUDA accepts it */
    setenv("CUDA_VISIBLE_DEVICES", "GPU-901de003", 1);
    ck_assert_int_eq(ema__topo_map_ranks(topo, &cfg, 1, gpu, NULL), EMA_SUCCESS);
    ck_assert_int_eq(gpu[0], 3);

    /* like CUDA, an invalid entry hides it and everything after it */
    setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
    check_map(topo, &cfg, 2, 0, (const int[]){-1, -1}, 2, -1, -1);
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("map", test_gpu_map_puts_two_ranks_on_one_gpu_and_reports_it)
{
    ema__topo_t *topo = load_xml("nvlink-mesh-8gpu.xml");
    ema__topo_config_t cfg;

    setenv("EMA_GPU_MAP", "0,0", 1);
    ck_assert_int_eq(ema__config_read(ema__topo_config_table, &cfg), EMA_SUCCESS);
    ck_assert_str_eq(cfg.gpu_map, "0,0");
    check_map(topo, &cfg, 2, 0, (const int[]){0, 0}, 2, 1, 2);
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("map", test_gpu_map_counts_in_cuda_visible_devices_ordinals)
{
    ema__topo_t *topo = load_visible("nvswitch-8gpu.xml", "4,5,6,7");
    ema__topo_config_t cfg = {.gpu_map = "3, 0"};
    int gpu[2];

    ck_assert_int_eq(ema__topo_map_ranks(topo, &cfg, 2, gpu, NULL), EMA_SUCCESS);
    ck_assert_int_eq(gpu[0], 7);
    ck_assert_int_eq(gpu[1], 4);
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("map", test_gpu_map_rejects_bad_maps_and_leaves_output_alone)
{
    static const char *bad[] = {"0,9", "a,b", "0,", "0", "-1,0", "0;1"};
    ema__topo_t *topo = load_xml("nvlink-mesh-8gpu.xml");

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ema__topo_config_t cfg = {.gpu_map = bad[i]};
        int gpu[2] = {42, 42}, shared = 42;
        ck_assert_msg(ema__topo_map_ranks(topo, &cfg, 2, gpu, &shared) == EMA_ERR_INVALID_PARAM,
                      "EMA_GPU_MAP='%s' was accepted", bad[i]);
        ck_assert_int_eq(gpu[0], 42);
        ck_assert_int_eq(gpu[1], 42);
        ck_assert_int_eq(shared, 42);
    }
    ema__topo_destroy(topo);
}
END_TEST

/* ---- ema_info ------------------------------------------------------------- */

EMA_TEST("golden", test_print_shows_matrix_source_map_and_lender_orders)
{
    int gpu[8];
    ema__topo_t *topo = load_mapped("nvswitch-8gpu.xml", 8, gpu);

    assert_printed(print_topo(topo, 8, gpu), (const char *const[]){
        "# gpus:          8\n",
        "hwloc NVLinkBandwidth, NVSwitch transitive closure",
        "NVIDIA H100 80GB HBM3, pci 0000:10:00.0, numa 0",
        "#   gpu0        x     450     450",
        "0->0 1->1 2->2",
        "#   rank 6: 4 5 7 0 1 2 3\n", NULL});
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("golden", test_print_reports_a_shared_gpu)
{
    ema__topo_t *topo = load_xml("nvlink-uneven-4gpu.xml");

    assert_printed(print_topo(topo, 3, (const int[]){0, 0, 1}), (const char *const[]){
        "gpu 0 is shared by local ranks 0 1\n", "#   rank 0: 1 2\n", NULL});
    ema__topo_destroy(topo);
}
END_TEST

/* ---- this machine ---------------------------------------------------------- */

EMA_TEST("host", test_this_host_loads_and_names_its_link_source)
{
    ema__topo_t *topo = NULL;

    unsetenv("HWLOC_XMLFILE");
    ck_assert_int_eq(ema__topo_load(&topo), EMA_SUCCESS);
    ck_assert_int_ge(ema__topo_ngpus(topo), 0);
    ck_assert_int_ge(ema__topo_nnuma(topo), 1);
    ck_assert(strlen(ema__topo_source(topo)) > 0);
    if (ema__topo_ngpus(topo) == 0) {
        ck_assert_ptr_nonnull(strstr(ema__topo_source(topo), "none: no GPU"));
    }
    ema__topo_destroy(topo);
}
END_TEST

int main(void)
{
    return ema_check_main("topo", CK_NORMAL);
}
