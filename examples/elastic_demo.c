/*
 * The elastic-window demo (README command 1).  Four ranks, each with
 * CAP bytes of memory (a stand-in for a GPU):
 *   1. rank 0 fills its own memory, then grows its window to 2.5 x CAP in
 *      three steps, borrowing from ranks 1, 2 and 3;
 *   2. it writes a pattern over the whole window with plain stores;
 *   3. rank 2 needs its memory back and reclaims all of it;
 *   4. rank 0's data is checked, by rank 0 through its base pointer and by
 *      rank 3 through ema_get.
 * After each step rank 0 prints where the bytes of its window live.
 *
 * Run: mpirun -n 4 ./examples/elastic_demo [CAP, default 64M]
 */
#include <ema.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call) do { ema_status_t s_ = (call); if (s_ != EMA_SUCCESS) { \
    fprintf(stderr, "rank %d: %s failed: %s\n", rank, #call, ema_strerror(s_)); \
    exit(1); } } while (0)

static int rank, size;
static ema_win_h stats_win; /* rank 0 gathers every rank's ema_mem_stat here */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double mib(size_t b) { return b / 1048576.0; }

/* Collective: every rank sends its memory statistics to rank 0, which
 * prints one line of the timeline. */
static void timeline(const char *step, ema_win_h win)
{
    ema_mem_stat_t st = {0};
    CHECK(ema_barrier()); /* the step is over everywhere */
    CHECK(ema_mem_stat(&st));
    CHECK(ema_put(stats_win, 0, rank * sizeof(st), &st, sizeof(st)));
    CHECK(ema_win_flush(stats_win, 0));
    CHECK(ema_barrier());
    if (rank == 0) {
        ema_mem_stat_t *all;
        ema_win_stat_t ws = {0};
        size_t dummy;
        CHECK(ema_win_size(stats_win, 0, &dummy));
        all = malloc(size * sizeof(*all));
        CHECK(ema_get(stats_win, 0, 0, all, size * sizeof(*all)));
        CHECK(ema_win_stat(win, &ws));
        printf("%-34s window %6.0f MiB: local %5.0f, borrowed %5.0f, spilled %5.0f |", step,
               mib(ws.size), mib(ws.bytes_local), mib(ws.bytes_borrowed),
               mib(ws.bytes_spilled));
        for (int r = 1; r < size; r++) {
            printf(" r%d lent %3.0f%s", r, mib(all[r].bytes_lent),
                   all[r].bytes_withheld ? " (reclaimed)" : "");
        }
        printf("\n");
        fflush(stdout);
        free(all);
    }
    CHECK(ema_barrier());
}

static size_t moved_bytes;
static int moved_calls;

/* Runs on rank 0's progress thread before a range of its window moves. */
static void on_reclaim(ema_win_h win, size_t offset, size_t len, void *arg)
{
    moved_bytes += len;
    moved_calls++;
}

static uint64_t pattern(size_t i) { return 0x9e3779b97f4a7c15ull * (i + 1); }

int main(int argc, char **argv)
{
    size_t cap = 64u << 20;
    ema_init_params_t params;
    ema_win_h win;
    uint64_t *base;
    void *sbase;

    if (argc > 1) {
        cap = strtoull(argv[1], NULL, 0) << (strchr(argv[1], 'G') ? 30 : strchr(argv[1], 'M') ? 20 : 0);
    }
    memset(&params, 0, sizeof(params));
    params.field_mask    = EMA_INIT_PARAM_FIELD_MEMORY_KIND | EMA_INIT_PARAM_FIELD_DEVICE_MEMORY;
    params.memory_kind   = EMA_MEMORY_KIND_HOST;
    params.device_memory = cap;
    CHECK(ema_init(&params));
    CHECK(ema_world_rank(&rank));
    CHECK(ema_world_size(&size));
    if (size != 4) {
        if (rank == 0) {
            fprintf(stderr, "elastic_demo: run with 4 ranks (mpirun -n 4)\n");
        }
        ema_finalize();
        return 2;
    }

    /* a small window, in the spill-free part of memory, for the timeline */
    CHECK(ema_win_allocate(rank == 0 ? 4096 : 0, NULL, &sbase, &stats_win));

    size_t grown = cap / 2 * 5; /* 2.5 x CAP */
    size_t own   = cap - (2u << 20); /* all of rank 0's memory but the stats segment */
    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = grown};
    CHECK(ema_win_allocate(rank == 0 ? own : 0, &wp, (void **)&base, &win));
    if (rank == 0) {
        printf("elastic_demo: 4 ranks, %.0f MiB of memory each; rank 0's window grows to "
               "%.0f MiB\n\n", mib(cap), mib(grown));
    }
    timeline("1. rank 0 uses its own memory", win);

    /* 1. grow in three steps, as a KV cache would under rising load */
    for (int step = 1; step <= 3; step++) {
        double t0 = now_ms();
        size_t target = own + (grown - own) * step / 3;
        if (rank == 0) {
            CHECK(ema_win_grow(win, target));
        }
        char label[64];
        snprintf(label, sizeof(label), "   grow to %.0f MiB (%.1f ms)", mib(target),
                 now_ms() - t0);
        timeline(label, win);
    }

    /* 2. plain stores over the whole window: borrowed pages behave alike */
    size_t words = grown / sizeof(uint64_t);
    if (rank == 0) {
        for (size_t i = 0; i < words; i++) {
            base[i] = pattern(i);
        }
    }
    timeline("2. rank 0 wrote its pattern", win);

    /* 3. rank 2 takes all of its memory back; rank 0 hears which ranges move */
    double ms = 0;
    if (rank == 0) {
        CHECK(ema_win_set_reclaim_cb(win, on_reclaim, NULL));
    }
    CHECK(ema_barrier());
    if (rank == 2) {
        double t0 = now_ms();
        CHECK(ema_reclaim(cap, 30000));
        ms = now_ms() - t0;
        CHECK(ema_put(stats_win, 0, 4000, &ms, sizeof(ms)));
        CHECK(ema_win_flush(stats_win, 0));
    }
    CHECK(ema_barrier());
    if (rank == 0) {
        CHECK(ema_get(stats_win, 0, 4000, &ms, sizeof(ms)));
    }
    char label[64];
    snprintf(label, sizeof(label), "3. rank 2 reclaimed (%.1f ms)", ms);
    timeline(label, win);
    if (rank == 0) {
        printf("   rank 0 was told of %zu MiB moving, in %d call%s of its reclaim callback\n",
               moved_bytes >> 20, moved_calls, moved_calls == 1 ? "" : "s");
    }

    /* 4. verify: rank 0 through its base pointer, rank 3 through ema_get */
    size_t bad = 0;
    if (rank == 0) {
        for (size_t i = 0; i < words; i++) {
            bad += (base[i] != pattern(i));
        }
    }
    if (rank == 3) {
        size_t chunk = 1u << 20;
        uint64_t *buf = malloc(chunk);
        for (size_t off = 0; off < grown; off += chunk) {
            size_t n = (grown - off < chunk) ? grown - off : chunk;
            CHECK(ema_get(win, 0, off, buf, n));
            for (size_t i = 0; i < n / sizeof(uint64_t); i++) {
                bad += (buf[i] != pattern(off / sizeof(uint64_t) + i));
            }
        }
        free(buf);
    }
    CHECK(ema_barrier());
    if (rank == 0 || rank == 3) {
        printf("4. rank %d checked %.0f MiB: %zu words wrong\n", rank, mib(grown), bad);
        fflush(stdout);
    }
    CHECK(ema_barrier());
    if (rank == 0) {
        if (ema_win_shrink(win, own) != EMA_SUCCESS) {
            bad++;
        }
    }
    timeline("5. rank 0 shrank back", win);
    CHECK(ema_win_free(win));
    CHECK(ema_win_free(stats_win));
    CHECK(ema_finalize());
    if (bad == 0 && (rank == 0 || rank == 3)) {
        printf("rank %d: no byte lost\n", rank);
    }
    return bad ? 1 : 0;
}
