/*
 * bench/layers: the prefetch policy against an all-local window, as the
 * EMA paper's layer-group experiment.  Rank 0 walks L layers (32 by
 * default), each reading its own slice of a window and doing @ops
 * multiply-adds per 8-byte word, over three windows of the same size:
 *
 *   local    all in rank 0's own memory (the reference);
 *   none     half in rank 0's memory, half borrowed from rank 1 (with 2
 *            ranks) or in rank 0's host spill tier (1 rank, EMA_SPILL=host),
 *            no policy;
 *   policy   the same elastic window with ema_win_set_policy (depth D,
 *            cyclic): each layer is acquired, then ema_win_advance(layer).
 *
 * It prints one CSV row per arithmetic intensity: the median pass time of
 * each and the ratios local/none and local/policy (1.0 = as fast as all
 * local).  Every layer checks every word against its pattern; a mismatch
 * fails the run.  On the host kind borrowed memory is the peer's shared
 * memory, as fast as one's own, so the ratios are about 1.0 (the policy
 * costs the copies it makes, on CPUs the compute shares); the curve that
 * matters is on GPUs (the cuda kind, bench/layers_gpu.cu, timed with CUDA
 * events), where borrowed or spilled memory is remote.
 *
 * Run (README "bench/layers"):
 *   EMA_DEVICE_MEMORY=64M EMA_SEGMENT_SIZE=1M mpirun -n 2 -x EMA_DEVICE_MEMORY \
 *       -x EMA_SEGMENT_SIZE bench/layers [options]
 * Options: --layers N (32)  --layer-bytes B (window/2 = capacity/2 must hold
 * the local half: default capacity/2/N rounded to segments, at least one
 * segment)  --ops LIST (0,1,4,16,64)  --depth D (2)  --passes P (5)
 * --reads R (1)  --read-only  --wait  --csv FILE (stdout).  The last CSV
 * column, policy_acquire_ms, is the time per pass the policy's walk spent
 * in ema_win_acquire (waiting for a layer still moving).
 */
#include <ema.h>

#include "layers_gpu.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_OPS 32

#define CHECK(_call)                                                                  \
    do {                                                                              \
        ema_status_t s_ = (_call);                                                    \
        if (s_ != EMA_SUCCESS) {                                                      \
            fprintf(stderr, "layers: %s failed: %s (%s:%d)\n", #_call, ema_strerror(s_), \
                    __FILE__, __LINE__);                                              \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

static int      rank, nranks, cuda;
static size_t   nlayers = 32, layer_bytes, seg;
static unsigned depth   = 2;
static unsigned pflags  = EMA_WIN_POLICY_FLAG_CYCLIC; /* --read-only adds READ_ONLY */
static int      passes  = 5;
static int      reads   = 1; /* --reads: kernel passes over each layer's slice */
static int      ops[MAX_OPS], nops;
static uint64_t mismatches;
static double   acquire_ms; /* time spent in ema_win_acquire (waiting for a move) */
static volatile double sink;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* One layer on the CPU: check each word, then @k multiply-adds on it. */
static void host_layer(const uint64_t *p, size_t w0, size_t n, int k)
{
    double acc = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = p[i];
        mismatches += (v != layers_pat(w0 + i));
        double x = (double)(v & 0xffff);
        for (int j = 0; j < k; j++) {
            x = x * 1.0000001 + 0.5;
        }
        acc += x;
    }
    sink += acc;
}

static void fill(char *base, size_t len)
{
    if (cuda) {
        if (layers_gpu_fill(base, 0, len) != 0) {
            fprintf(stderr, "layers: %s\n", layers_gpu_error());
            exit(1);
        }
        return;
    }
    for (size_t w = 0; w < len / 8; w++) {
        ((uint64_t *)base)[w] = layers_pat(w);
    }
}

/* One pass over every layer; the milliseconds it took (CUDA events on
 * the cuda kind). */
static double pass(ema_win_h win, char *base, int k, int policy)
{
    double t0 = now_ms(), ms = 0;
    if (cuda && layers_gpu_timer_start() != 0) {
        fprintf(stderr, "layers: %s\n", layers_gpu_error());
        exit(1);
    }
    for (size_t l = 0; l < nlayers; l++) {
        size_t off = l * layer_bytes;
        if (policy) {
            CHECK(ema_win_advance(win, l));
        }
        /* the layer is held while it is computed: no migration moves it */
        double ta = now_ms();
        CHECK(ema_win_acquire(win, off, layer_bytes));
        acquire_ms += now_ms() - ta;
        for (int r = 0; r < reads; r++) { /* data reuse: a GEMM's tiles, say */
            if (cuda) {
                if (layers_gpu_layer(base, off, layer_bytes, k, &mismatches) != 0) {
                    fprintf(stderr, "layers: %s\n", layers_gpu_error());
                    exit(1);
                }
            } else {
                host_layer((const uint64_t *)(base + off), off / 8, layer_bytes / 8, k);
            }
        }
        CHECK(ema_win_release(win, off, layer_bytes));
    }
    if (cuda) {
        if (layers_gpu_timer_stop(&ms) != 0) {
            fprintf(stderr, "layers: %s\n", layers_gpu_error());
            exit(1);
        }
        return ms;
    }
    return now_ms() - t0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Passes median_pass times (at most 64), and runs in all (one to warm up). */
#define LAYERS_MAX_PASSES 64
static int timed_passes(void)
{
    return passes < LAYERS_MAX_PASSES ? passes : LAYERS_MAX_PASSES;
}

/* The median of @passes passes, after one to warm up. */
static double median_pass(ema_win_h win, char *base, int k, int policy)
{
    double t[LAYERS_MAX_PASSES];
    int n = timed_passes();
    pass(win, base, k, policy);
    for (int i = 0; i < n; i++) {
        t[i] = pass(win, base, k, policy);
    }
    qsort(t, (size_t)n, sizeof(*t), cmp_d);
    return t[n / 2];
}

static void set_policy(ema_win_h win, int on)
{
    if (!on) {
        CHECK(ema_win_set_policy(win, NULL));
        return;
    }
    ema_win_range_t *r = calloc(nlayers, sizeof(*r));
    for (size_t l = 0; l < nlayers; l++) {
        r[l].offset = l * layer_bytes;
        r[l].length = layer_bytes;
    }
    ema_win_policy_params_t p = {
        .field_mask = EMA_WIN_POLICY_PARAM_FIELD_RANGES | EMA_WIN_POLICY_PARAM_FIELD_DEPTH |
                      EMA_WIN_POLICY_PARAM_FIELD_FLAGS,
        .ranges = r, .count = nlayers, .depth = depth, .flags = pflags};
    CHECK(ema_win_set_policy(win, &p));
    free(r);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: mpirun -n 2 bench/layers [--layers N] [--layer-bytes B] [--ops LIST]\n"
            "                                [--depth D] [--passes P] [--reads R] [--read-only]\n"
            "                                [--wait]\n"
            "                                [--csv FILE]\n"
            "  rank 0 walks N layers (32) of B bytes, each checked word by word and put\n"
            "  through LIST (0,1,4,16,64) multiply-adds per 8-byte word, over a window\n"
            "  all local, then half borrowed from rank 1 (with -n 1 and EMA_SPILL=host:\n"
            "  half spilled) without and with the prefetch policy (depth D, 2).  One CSV\n"
            "  row per intensity: median of P (5) passes, ratio = local time / time.\n"
            "  --reads R: each layer reads its slice R times (1), as a kernel that\n"
            "  reuses its data does.  --read-only: the policy with\n"
            "  EMA_WIN_POLICY_FLAG_READ_ONLY (the walk only reads: layers leave for\n"
            "  their kept spill copies with no copy).  --wait: with\n"
            "  EMA_WIN_POLICY_FLAG_WAIT (ema_win_advance waits for the layer to be\n"
            "  local instead of the kernel reading it where it is).\n"
            "  Memory: EMA_DEVICE_MEMORY must hold the whole window (N*B) on rank 0.\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *csv = NULL, *oplist = "0,1,4,16,64";
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--layers") == 0) {
            nlayers = strtoull(argv[++i], NULL, 0);
        } else if (i + 1 < argc && strcmp(argv[i], "--layer-bytes") == 0) {
            layer_bytes = strtoull(argv[++i], NULL, 0);
        } else if (i + 1 < argc && strcmp(argv[i], "--ops") == 0) {
            oplist = argv[++i];
        } else if (i + 1 < argc && strcmp(argv[i], "--depth") == 0) {
            depth = (unsigned)strtoul(argv[++i], NULL, 0);
        } else if (i + 1 < argc && strcmp(argv[i], "--passes") == 0) {
            passes = atoi(argv[++i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--reads") == 0) {
            reads = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--read-only") == 0) {
            pflags |= EMA_WIN_POLICY_FLAG_READ_ONLY;
        } else if (strcmp(argv[i], "--wait") == 0) {
            pflags |= EMA_WIN_POLICY_FLAG_WAIT;
        } else if (i + 1 < argc && strcmp(argv[i], "--csv") == 0) {
            csv = argv[++i];
        } else {
            usage();
        }
    }
    for (const char *s = oplist; *s && nops < MAX_OPS;) {
        ops[nops++] = (int)strtol(s, (char **)&s, 0);
        s += (*s == ',');
    }
    if (nlayers < 2 || passes < 1 || depth < 1 || depth > nlayers || nops == 0 || reads < 1) {
        usage();
    }

    CHECK(ema_init(NULL));
    CHECK(ema_world_rank(&rank));
    CHECK(ema_world_size(&nranks));
    ema_mem_stat_t ms;
    CHECK(ema_mem_stat(&ms));
    cuda = ms.memory_kind == EMA_MEMORY_KIND_CUDA;
    {
        void *b;
        ema_win_h w;
        ema_win_stat_t ws;
        CHECK(ema_win_allocate(1, NULL, &b, &w));
        CHECK(ema_win_stat(w, &ws));
        seg = ws.max_size;
        CHECK(ema_win_free(w));
    }
    if (layer_bytes == 0) {
        layer_bytes = ms.capacity / 2 / nlayers / seg * seg;
        layer_bytes = layer_bytes ? layer_bytes : seg;
    }
    layer_bytes = (layer_bytes + seg - 1) / seg * seg; /* whole segments: one layer each */
    size_t total = nlayers * layer_bytes, half = total / 2 / seg * seg;
    if (rank == 0 && total > ms.capacity) {
        fprintf(stderr, "layers: the window (%zu layers of %zu bytes) exceeds EMA_DEVICE_MEMORY "
                "(%zu): raise it or lower --layer-bytes\n", nlayers, layer_bytes, ms.capacity);
        exit(2);
    }
    if (cuda && rank == 0 && layers_gpu_init(ms.device) != 0) {
        fprintf(stderr, "layers: cuda kind: %s\n", layers_gpu_error());
        exit(1);
    }
    FILE *out = stdout;
    if (rank == 0 && csv != NULL && (out = fopen(csv, "w")) == NULL) {
        perror(csv);
        exit(1);
    }

    /* the reference: all local */
    void *bl, *be, *bb;
    ema_win_h wl, we, ballast;
    CHECK(ema_win_allocate(rank == 0 ? total : 0, NULL, &bl, &wl));
    double t_local[MAX_OPS];
    if (rank == 0) {
        fill(bl, total);
        for (int i = 0; i < nops; i++) {
            t_local[i] = median_pass(wl, bl, ops[i], 0);
        }
    }
    CHECK(ema_barrier());
    CHECK(ema_win_free(wl));

    /* the elastic window: a ballast takes all but half of the window's
     * bytes of rank 0's memory, so the other half is borrowed (spilled) */
    size_t cap = ms.capacity / seg * seg;
    size_t ballast_bytes = (rank == 0) ? cap - half : 0;
    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = total};
    CHECK(ema_win_allocate(ballast_bytes, NULL, &bb, &ballast));
    CHECK(ema_win_allocate(rank == 0 ? half : 0, &wp, &be, &we));
    ema_win_stat_t ws = {0};
    if (rank == 0) {
        CHECK(ema_win_grow(we, total));
        fill(be, total);
        CHECK(ema_win_stat(we, &ws));
        fprintf(stderr, "# layers: %s kind, %zu layers of %zu bytes, window %zu local + %zu "
                "borrowed + %zu spilled, depth %u%s%s, %d read%s per layer, median of %d passes\n",
                cuda ? "cuda" : "host", nlayers, layer_bytes, ws.bytes_local,
                ws.bytes_borrowed, ws.bytes_spilled, depth,
                (pflags & EMA_WIN_POLICY_FLAG_READ_ONLY) ? ", read-only" : "",
                (pflags & EMA_WIN_POLICY_FLAG_WAIT) ? ", wait" : "", reads,
                reads > 1 ? "s" : "", timed_passes());
        const char *tier = ws.bytes_borrowed ? "borrowed" : "spilled";
        fprintf(out, "kind,away,layers,layer_bytes,depth,ops_per_word,flop_per_byte,local_ms,"
                "none_ms,policy_ms,ratio_none,ratio_policy,policy_moved_mb_per_pass,"
                "mismatches,reads,policy_acquire_ms\n");
        for (int i = 0; i < nops; i++) {
            set_policy(we, 0);
            double t_none = median_pass(we, be, ops[i], 0);
            set_policy(we, 1);
            ema_win_policy_stat_t p0, p1;
            CHECK(ema_win_policy_stat(we, &p0));
            acquire_ms   = 0;
            double t_pol = median_pass(we, be, ops[i], 1);
            double t_acq = acquire_ms / (timed_passes() + 1);
            CHECK(ema_win_policy_stat(we, &p1));
            double moved = (double)(p1.bytes_prefetched - p0.bytes_prefetched +
                                    p1.bytes_evicted - p0.bytes_evicted) /
                           (1 << 20) / (timed_passes() + 1);
            fprintf(out, "%s,%s,%zu,%zu,%u,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.1f,%" PRIu64 ",%d,%.3f\n",
                    cuda ? "cuda" : "host", tier, nlayers, layer_bytes, depth, ops[i],
                    2.0 * reads * ops[i] / 8, t_local[i], t_none, t_pol, t_local[i] / t_none,
                    t_local[i] / t_pol, moved, mismatches, reads, t_acq);
            fflush(out);
        }
        set_policy(we, 0);
        if (mismatches != 0) {
            fprintf(stderr, "layers: FAIL: %" PRIu64 " words differ from their pattern\n",
                    mismatches);
        }
    }
    CHECK(ema_barrier());
    CHECK(ema_win_free(we));
    CHECK(ema_win_free(ballast));
    if (cuda && rank == 0) {
        layers_gpu_fini();
    }
    if (out != stdout) {
        fclose(out);
    }
    CHECK(ema_finalize());
    return mismatches ? 1 : 0;
}
