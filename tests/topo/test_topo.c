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

/* ---- 8 GPUs, full NVLink mesh, two sockets ------------------------------- */

EMA_TEST("golden", test_mesh_every_gpu_pair_has_two_nvlinks)
{
    ema__topo_t *topo = load_xml("nvlink-mesh-8gpu.xml");

    ck_assert_int_eq(ema__topo_ngpus(topo), 8);
    ck_assert_str_eq(ema__topo_source(topo), "hwloc NVLinkBandwidth");
    for (int a = 0; a < 8; a++) {
        ck_assert_int_eq(ema__topo_gpu_numa(topo, a), a / 4);
        for (int b = 0; b < 8; b++) {
            ck_assert_double_eq_tol(ema__topo_bandwidth(topo, a, b), a == b ? 0.0 : 50.0, 1e-9);
        }
    }
    ck_assert_int_eq(ema__topo_numa_distance(topo, 0, 1), 21);
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("golden", test_mesh_equal_links_prefer_lenders_on_the_same_numa_node)
{
    ema__topo_t *topo = load_xml("nvlink-mesh-8gpu.xml");
    int gpu[8];

    map_identity(topo, 8, gpu);
    check_order(topo, gpu, NULL, NULL, 8, 0, (int[]){1, 2, 3, 4, 5, 6, 7});
    check_order(topo, gpu, NULL, NULL, 8, 5, (int[]){4, 6, 7, 0, 1, 2, 3});
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("golden", test_mesh_more_lendable_memory_beats_numa_distance)
{
    ema__topo_t *topo = load_xml("nvlink-mesh-8gpu.xml");
    size_t lendable[8] = {GB, GB, GB, GB, GB, GB, GB, 8 * GB};
    int gpu[8];

    map_identity(topo, 8, gpu);
    check_order(topo, gpu, NULL, lendable, 8, 0, (int[]){7, 1, 2, 3, 4, 5, 6});
    ema__topo_destroy(topo);
}
END_TEST

/* ---- 8 GPUs behind 4 NVSwitches ------------------------------------------ */

EMA_TEST("golden", test_nvswitch_closure_gives_all_pairs_bandwidth)
{
    ema__topo_t *topo = load_xml("nvswitch-8gpu.xml");

    /* the switches are in the matrix, but they are not GPUs */
    ck_assert_int_eq(ema__topo_ngpus(topo), 8);
    ck_assert_str_eq(ema__topo_source(topo),
                     "hwloc NVLinkBandwidth, NVSwitch transitive closure");
    /* 18 links of 25 GB/s to the switches: every pair gets all 450 */
    for (int a = 0; a < 8; a++) {
        for (int b = 0; b < 8; b++) {
            ck_assert_double_eq_tol(ema__topo_bandwidth(topo, a, b), a == b ? 0.0 : 450.0, 1e-9);
        }
    }
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("golden", test_nvswitch_lenders_tie_on_bandwidth_then_numa_then_rank)
{
    ema__topo_t *topo = load_xml("nvswitch-8gpu.xml");
    size_t lendable[8] = {GB, GB, 2 * GB, GB, GB, GB, GB, GB};
    int gpu[8];

    map_identity(topo, 8, gpu);
    check_order(topo, gpu, NULL, NULL, 8, 6, (int[]){4, 5, 7, 0, 1, 2, 3});
    check_order(topo, gpu, NULL, lendable, 8, 6, (int[]){2, 4, 5, 7, 0, 1, 3});
    ema__topo_destroy(topo);
}
END_TEST

/* ---- 8 GPUs over PCIe only, two sockets ---------------------------------- */

EMA_TEST("golden", test_pcie_only_gpus_have_no_links)
{
    ema__topo_t *topo = load_xml("pcie-2socket-8gpu.xml");

    ck_assert_int_eq(ema__topo_ngpus(topo), 8);
    ck_assert_str_eq(ema__topo_source(topo), "hwloc NVML backend: no NVLink");
    for (int a = 0; a < 8; a++) {
        ck_assert_int_eq(ema__topo_gpu_numa(topo, a), a / 4);
        for (int b = 0; b < 8; b++) {
            ck_assert_double_eq(ema__topo_bandwidth(topo, a, b), 0.0);
        }
    }
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("golden", test_pcie_lenders_follow_numa_distance)
{
    ema__topo_t *topo = load_xml("pcie-2socket-8gpu.xml");
    int gpu[8];

    map_identity(topo, 8, gpu);
    check_order(topo, gpu, NULL, NULL, 8, 0, (int[]){1, 2, 3, 4, 5, 6, 7});
    check_order(topo, gpu, NULL, NULL, 8, 4, (int[]){5, 6, 7, 0, 1, 2, 3});
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("golden", test_pcie_lendable_memory_comes_before_numa_distance)
{
    ema__topo_t *topo = load_xml("pcie-2socket-8gpu.xml");
    size_t lendable[8] = {GB, GB, GB, GB, GB, GB, 2 * GB, GB};
    int gpu[8];

    map_identity(topo, 8, gpu);
    check_order(topo, gpu, NULL, lendable, 8, 0, (int[]){6, 1, 2, 3, 4, 5, 7});
    ema__topo_destroy(topo);
}
END_TEST

/* ---- 4 GPUs with uneven NVLink counts ------------------------------------ */

EMA_TEST("golden", test_uneven_nvlink_counts_give_uneven_bandwidth)
{
    static const double want[4][4] = {
        {0, 100, 50, 25}, {100, 0, 25, 50}, {50, 25, 0, 100}, {25, 50, 100, 0}};
    ema__topo_t *topo = load_xml("nvlink-uneven-4gpu.xml");

    ck_assert_int_eq(ema__topo_ngpus(topo), 4);
    ck_assert_str_eq(ema__topo_source(topo), "hwloc NVLinkBandwidth");
    for (int a = 0; a < 4; a++) {
        ck_assert_int_eq(ema__topo_gpu_numa(topo, a), 0);
        for (int b = 0; b < 4; b++) {
            ck_assert_double_eq_tol(ema__topo_bandwidth(topo, a, b), want[a][b], 1e-9);
        }
    }
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("golden", test_uneven_lenders_ordered_by_link_bandwidth_over_lendable_memory)
{
    ema__topo_t *topo = load_xml("nvlink-uneven-4gpu.xml");
    size_t lendable[4] = {GB, GB, GB, 64 * GB};
    int gpu[4];

    map_identity(topo, 4, gpu);
    check_order(topo, gpu, NULL, NULL, 4, 0, (int[]){1, 2, 3});
    check_order(topo, gpu, NULL, NULL, 4, 1, (int[]){0, 3, 2});
    check_order(topo, gpu, NULL, NULL, 4, 2, (int[]){3, 0, 1});
    check_order(topo, gpu, NULL, NULL, 4, 3, (int[]){2, 1, 0});
    /* the 4-link peer wins even though rank 3 has far more to lend */
    check_order(topo, gpu, NULL, lendable, 4, 0, (int[]){1, 2, 3});
    ema__topo_destroy(topo);
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
    int gpu[4] = {7, 7, 7, 7}, shared = -1;

    ck_assert_int_eq(ema__topo_ngpus(topo), 0);
    ck_assert_str_eq(ema__topo_source(topo), "none: no GPU");
    ck_assert_int_eq(ema__topo_map_ranks(topo, &cfg, 4, gpu, &shared), EMA_SUCCESS);
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(gpu[r], -1);
    }
    ck_assert_int_eq(shared, 0);
    ck_assert_int_eq(ema__topo_numa_distance(topo, 1, 0), 21);
    ck_assert_int_eq(ema__topo_numa_distance(topo, 1, 1), 10);
    /* a map written for a GPU host does not stop a GPU-less one */
    cfg.gpu_map = "0,0,1,1";
    ck_assert_int_eq(ema__topo_map_ranks(topo, &cfg, 4, gpu, &shared), EMA_SUCCESS);
    ck_assert_int_eq(gpu[0], -1);
    ck_assert_int_eq(shared, 0);
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
    int gpu[10], shared = -1;

    ck_assert_int_eq(ema__topo_map_ranks(topo, &cfg, 8, gpu, &shared), EMA_SUCCESS);
    for (int r = 0; r < 8; r++) {
        ck_assert_int_eq(gpu[r], r);
    }
    ck_assert_int_eq(shared, 0);
    ck_assert_int_eq(ema__topo_map_ranks(topo, &cfg, 10, gpu, &shared), EMA_SUCCESS);
    ck_assert_int_eq(gpu[8], 0);
    ck_assert_int_eq(gpu[9], 1);
    ck_assert_int_eq(shared, 1);
    ck_assert_int_eq(ema__topo_default_nranks(topo, &cfg), 8);
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("map", test_cuda_visible_devices_restricts_and_reorders_gpus)
{
    ema__topo_t *topo = load_xml("nvlink-mesh-8gpu.xml");
    ema__topo_config_t cfg = {.gpu_map = ""};
    int gpu[3], shared = -1;

    setenv("CUDA_VISIBLE_DEVICES", "6,2", 1);
    ck_assert_int_eq(ema__topo_map_ranks(topo, &cfg, 3, gpu, &shared), EMA_SUCCESS);
    ck_assert_int_eq(gpu[0], 6);
    ck_assert_int_eq(gpu[1], 2);
    ck_assert_int_eq(gpu[2], 6);
    ck_assert_int_eq(shared, 1);
    ck_assert_int_eq(ema__topo_default_nranks(topo, &cfg), 2);

    /* a UUID prefix, as CUDA accepts it */
    setenv("CUDA_VISIBLE_DEVICES", "GPU-901de003", 1);
    ck_assert_int_eq(ema__topo_map_ranks(topo, &cfg, 1, gpu, NULL), EMA_SUCCESS);
    ck_assert_int_eq(gpu[0], 3);

    /* like CUDA, an invalid entry hides it and everything after it */
    setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
    ck_assert_int_eq(ema__topo_map_ranks(topo, &cfg, 2, gpu, &shared), EMA_SUCCESS);
    ck_assert_int_eq(gpu[0], -1);
    ck_assert_int_eq(gpu[1], -1);
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("map", test_gpu_map_puts_two_ranks_on_one_gpu_and_reports_it)
{
    ema__topo_t *topo = load_xml("nvlink-mesh-8gpu.xml");
    ema__topo_config_t cfg;
    int gpu[2], shared = -1;

    setenv("EMA_GPU_MAP", "0,0", 1);
    ck_assert_int_eq(ema__config_read(ema__topo_config_table, &cfg), EMA_SUCCESS);
    ck_assert_str_eq(cfg.gpu_map, "0,0");
    ck_assert_int_eq(ema__topo_map_ranks(topo, &cfg, 2, gpu, &shared), EMA_SUCCESS);
    ck_assert_int_eq(gpu[0], 0);
    ck_assert_int_eq(gpu[1], 0);
    ck_assert_int_eq(shared, 1);
    ck_assert_int_eq(ema__topo_default_nranks(topo, &cfg), 2);
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("map", test_gpu_map_counts_in_cuda_visible_devices_ordinals)
{
    ema__topo_t *topo = load_xml("nvswitch-8gpu.xml");
    ema__topo_config_t cfg = {.gpu_map = "3, 0"};
    int gpu[2];

    setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7", 1);
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
    ema__topo_t *topo = load_xml("nvswitch-8gpu.xml");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int gpu[8];

    map_identity(topo, 8, gpu);
    ema__topo_print(topo, f, 8, gpu, NULL);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(buf, "# gpus:          8\n"));
    ck_assert_ptr_nonnull(strstr(buf, "hwloc NVLinkBandwidth, NVSwitch transitive closure"));
    ck_assert_ptr_nonnull(strstr(buf, "NVIDIA H100 80GB HBM3, pci 0000:10:00.0, numa 0"));
    ck_assert_ptr_nonnull(strstr(buf, "#   gpu0        x     450     450"));
    ck_assert_ptr_nonnull(strstr(buf, "0->0 1->1 2->2"));
    ck_assert_ptr_nonnull(strstr(buf, "#   rank 6: 4 5 7 0 1 2 3\n"));
    free(buf);
    ema__topo_destroy(topo);
}
END_TEST

EMA_TEST("golden", test_print_reports_a_shared_gpu)
{
    ema__topo_t *topo = load_xml("nvlink-uneven-4gpu.xml");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int gpu[3] = {0, 0, 1};

    ema__topo_print(topo, f, 3, gpu, NULL);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(buf, "gpu 0 is shared by local ranks 0 1\n"));
    ck_assert_ptr_nonnull(strstr(buf, "#   rank 0: 1 2\n"));
    free(buf);
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
