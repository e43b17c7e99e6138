/*
 * A rank killed (SIGKILL) at a chosen point, and what the survivors see:
 * each finishes within FAULT_BOUND seconds of the kill, gets
 * EMA_ERR_PEER_LOST where the dead rank was needed, and loses no byte held
 * anywhere else.  Three ranks, each with 8 segments of 1M (run by
 * tests/fault/kill.sh under mpirun's recovery mode):
 *   rank 0: a lender (a 2M part: 6M lendable)
 *   rank 1: a borrower (a 12M part: 8M own, 4M borrowed from rank 0)
 *   rank 2: a third rank (an 8M part: its whole memory, lends nothing)
 * Scenarios (argv[1]), the victim in brackets:
 *   lender      [0] dies while rank 1 holds its memory
 *   borrower    [1] dies holding rank 0's memory
 *   reclaim     [0] dies inside ema_reclaim, while rank 1 moves its segments
 *   migration   [1] dies in its reclaim callback, in the recall rank 0 asked
 *   collective  [2] dies while ranks 0 and 1 wait in ema_barrier
 *   requests    [2] dies while rank 0 keeps non-blocking puts and gets to
 *               it in flight over UCX (EMA_HOST_DIRECT=n): every ema_wait and
 *               ema_test ends, with success or EMA_ERR_PEER_LOST (operations
 *               UCX emulates with the target's help never completed, and the
 *               waits hung: 8 of 8 runs).  The victim serves them from its
 *               main thread (no progress thread) for 0.3 s, then stops 20 ms
 *               before it dies, with the requests of that time in flight:
 *               killed while it wrote a reply into rank 0's shared-memory
 *               receive queue (UCX's sysv and posix), it would leave a slot
 *               taken and never written, and rank 0 would receive nothing
 *               more, from rank 1 either (ema(7) FAULTS; 9 of 40 runs)
 *   grow        [0] dies while rank 1 grows into 2 more of its segments:
 *               granted, not yet mapped (EMA_DEBUG_GROW_MAP_DELAY, 1 s on
 *               rank 1): the grow fails with EMA_ERR_PEER_LOST and the part
 *               keeps its size (it used to succeed with the dead rank's bytes)
 * Each survivor prints "PASS rank R <scenario> <seconds after the kill>" or
 * FAIL lines; the script counts them.
 */
#include <ema.h>

#include "../mpi/common.h" /* T_EXPECT */

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SEG (1u << 20)
static const size_t part_size[3] = {2 * SEG, 12 * SEG, 8 * SEG};
static int rank;
static const char *scenario;
static ema_win_h win;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The victim notes the time (CLOCK_MONOTONIC is one clock on one node). */
static void die(void)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/kill_time", getenv("FAULT_DIR"));
    FILE *f = fopen(path, "w");
    if (f != NULL) {
        fprintf(f, "%.6f\n", now_s());
        fclose(f);
    }
    fprintf(stderr, "KILL rank %d %s\n", rank, scenario);
    fflush(stderr);
    raise(SIGKILL);
}

static double kill_time(void)
{
    char path[512];
    double t = 0;
    snprintf(path, sizeof(path), "%s/kill_time", getenv("FAULT_DIR"));
    FILE *f = fopen(path, "r");
    if (f != NULL) {
        if (fscanf(f, "%lf", &t) != 1) {
            t = 0;
        }
        fclose(f);
    }
    return t;
}

/* The byte at @off of rank @r's part. */
static uint8_t pattern(int r, size_t off)
{
    return (uint8_t)(r * 71 + off / 4096 * 13 + off % 251);
}

static void fill(void)
{
    uint8_t *buf = malloc(part_size[rank]);
    for (size_t o = 0; o < part_size[rank]; o++) {
        buf[o] = pattern(rank, o);
    }
    if (ema_put(win, rank, 0, buf, part_size[rank]) != EMA_SUCCESS) {
        fprintf(stderr, "FAIL rank %d %s: filling its part\n", rank, scenario);
        exit(1);
    }
    free(buf);
}

/* Read rank @r's part segment by segment: each either comes back exactly
 * as written or fails with EMA_ERR_PEER_LOST; returns the lost ones.  A
 * lost segment also fails put and atomics. */
static int verify(int r)
{
    uint8_t *buf = malloc(SEG);
    int lost = 0;
    for (size_t s = 0; s < part_size[r] / SEG; s++) {
        ema_status_t st = ema_get(win, r, s * SEG, buf, SEG);
        if (st == EMA_ERR_PEER_LOST) {
            uint64_t old;
            lost++;
            T_EXPECT(ema_put(win, r, s * SEG, buf, 8) == EMA_ERR_PEER_LOST, "put, segment %zu of "
                  "rank %d", s, r);
            T_EXPECT(ema_fetch_add(win, r, s * SEG, 1, &old) == EMA_ERR_PEER_LOST,
                  "atomic, segment %zu of rank %d", s, r);
            continue;
        }
        T_EXPECT(st == EMA_SUCCESS, "get of segment %zu of rank %d: %s", s, r, ema_strerror(st));
        size_t bad = 0;
        for (size_t o = 0; st == EMA_SUCCESS && o < SEG; o++) {
            bad += buf[o] != pattern(r, s * SEG + o);
        }
        T_EXPECT(bad == 0, "%zu bytes differ in segment %zu of rank %d", bad, s, r);
    }
    free(buf);
    return lost;
}

static void on_recall(ema_win_h w, size_t offset, size_t len, void *arg)
{
    (void)w;
    (void)offset;
    (void)len;
    (void)arg;
    if (strcmp(scenario, "migration") == 0 && rank == 1) {
        die(); /* inside the recall rank 0 asked for, before the move */
    }
}

static void *kill_later(void *arg)
{
    usleep((useconds_t)(intptr_t)arg);
    die();
    return NULL;
}

int main(int argc, char **argv)
{
    int size, victim;
    void *base;
    ema_win_stat_t ws;
    ema_mem_stat_t ms;

    setvbuf(stdout, NULL, _IOLBF, 0);
    scenario = argc > 1 ? argv[1] : "";
    if (!strcmp(scenario, "requests")) {
        setenv("EMA_HOST_DIRECT", "n", 1); /* through UCX, not loads and stores */
    }
    if (!strcmp(scenario, "grow") && getenv("OMPI_COMM_WORLD_RANK") != NULL &&
        !strcmp(getenv("OMPI_COMM_WORLD_RANK"), "1")) {
        setenv("EMA_DEBUG_GROW_MAP_DELAY", "1000000", 1); /* rank 1 maps 1 s late */
    }
    if (!strcmp(scenario, "requests") && getenv("OMPI_COMM_WORLD_RANK") != NULL &&
        !strcmp(getenv("OMPI_COMM_WORLD_RANK"), "2")) {
        setenv("EMA_PROGRESS_THREAD", "n", 1); /* the victim stops serving before it dies */
    }
    if (ema_init(NULL) != EMA_SUCCESS || ema_world_rank(&rank) != EMA_SUCCESS ||
        ema_world_size(&size) != EMA_SUCCESS || size != 3) {
        fprintf(stderr, "FAIL: ema_init, or a world not of 3\n");
        return 1;
    }
    ema_t_rank    = rank; /* for T_EXPECT's lines */
    ema_t_current = scenario;
    victim = (!strcmp(scenario, "lender") || !strcmp(scenario, "reclaim") ||
              !strcmp(scenario, "grow")) ? 0
             : (!strcmp(scenario, "collective") || !strcmp(scenario, "requests")) ? 2 : 1;
    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = 16 * SEG};
    if (ema_win_allocate(rank == 1 ? 8 * SEG : part_size[rank], &wp, &base, &win) !=
            EMA_SUCCESS ||
        ema_barrier() != EMA_SUCCESS ||
        (rank == 1 && ema_win_grow(win, part_size[rank]) != EMA_SUCCESS)) {
        fprintf(stderr, "FAIL rank %d: ema_win_allocate, or rank 1's grow\n", rank);
        return 1;
    }
    ema_win_set_reclaim_cb(win, on_recall, NULL);
    fill();
    ema_win_stat(win, &ws);
    int borrowed = (int)(ws.bytes_borrowed / SEG);
    if (rank == 1 && borrowed != 4) {
        fprintf(stderr, "FAIL rank 1 %s: the setup: %d segments borrowed, not 4\n", scenario,
                borrowed);
        return 1;
    }
    if (ema_barrier() != EMA_SUCCESS) {
        fprintf(stderr, "FAIL rank %d: the first barrier\n", rank);
        return 1;
    }

    double t0 = now_s(), tlost = 0;
    if (rank == victim) {
        if (!strcmp(scenario, "reclaim")) {
            /* the reclaim of what rank 1 borrowed; killed 5 ms into it */
            pthread_t th;
            pthread_create(&th, NULL, kill_later, (void *)(intptr_t)5000);
            ema_reclaim(6 * SEG, 60000);
            usleep(10000000);
        }
        if (!strcmp(scenario, "migration")) {
            for (;;) { /* dies in its reclaim callback (on_recall) */
                ema_progress();
                usleep(100);
            }
        }
        if (!strcmp(scenario, "collective")) {
            usleep(300000); /* the others wait in the barrier */
        }
        if (!strcmp(scenario, "requests")) {
            /* serve rank 0's requests, then leave UCX alone while it keeps
             * more in flight: see the header */
            double t = now_s();
            while (now_s() - t < 0.3) {
                ema_progress();
            }
            usleep(20000);
        }
        if (!strcmp(scenario, "grow")) {
            /* rank 1 has its grant (6 segments lent, not 4) and waits 1 s
             * to map it: die then, however slow the machine */
            double t = now_s();
            do {
                usleep(1000);
                ema_mem_stat(&ms);
            } while (ms.bytes_lent < 6 * SEG && now_s() - t < 10);
            usleep(100000);
        }
        die();
    }

    /* the survivors */
    if (!strcmp(scenario, "migration") && rank == 0) {
        /* recall what rank 1 borrowed; it dies moving it: the memory is
         * back all the same */
        ema_status_t st = ema_reclaim(6 * SEG, 60000);
        T_EXPECT(st == EMA_SUCCESS, "ema_reclaim while the borrower died: %s", ema_strerror(st));
    } else if (!strcmp(scenario, "collective")) {
        ema_status_t st = ema_barrier();
        T_EXPECT(st == EMA_ERR_PEER_LOST, "ema_barrier: %s", ema_strerror(st));
    } else if (!strcmp(scenario, "requests") && rank == 0) {
        /* requests to the victim in flight, waited or tested, until one
         * fails for its death and 0.2 s more */
        enum { K = 32 };
        ema_request_h q[K];
        static uint8_t rbuf[K][SEG / 2];
        int lost = 0, other = 0;
        while (now_s() - t0 < 30 && (!lost || kill_time() == 0 || now_s() - kill_time() < 0.2)) {
            for (int i = 0; i < K; i++) {
                size_t off = (size_t)(i % 8) * SEG + SEG / 4 * (i % 2); /* some span 2 segments */
                ema_status_t st = (i % 2) ? ema_get_nb(win, 2, off, rbuf[i], SEG / 2, &q[i])
                                          : ema_put_nb(win, 2, off, rbuf[i], SEG / 2, &q[i]);
                if (st != EMA_SUCCESS) {
                    q[i] = NULL;
                    lost += st == EMA_ERR_PEER_LOST;
                    other += st != EMA_ERR_PEER_LOST;
                }
            }
            for (int i = 0; i < K; i++) {
                ema_status_t st = EMA_SUCCESS;
                if (q[i] != NULL && (i % 4) == 0) {
                    while ((st = ema_test(q[i])) == EMA_INPROGRESS) {
                    }
                } else if (q[i] != NULL) {
                    st = ema_wait(q[i]);
                }
                lost += st == EMA_ERR_PEER_LOST;
                other += st != EMA_SUCCESS && st != EMA_ERR_PEER_LOST;
            }
        }
        T_EXPECT(lost > 0, "no request to the victim failed with EMA_ERR_PEER_LOST");
        T_EXPECT(other == 0, "%d requests failed with another error", other);
    } else if (!strcmp(scenario, "grow") && rank == 1) {
        ema_status_t st = ema_win_grow(win, part_size[1] + 2 * SEG);
        size_t sz = 0;
        T_EXPECT(st == EMA_ERR_PEER_LOST, "grow while its lender died: %s", ema_strerror(st));
        T_EXPECT(ema_win_size(win, 1, &sz) == EMA_SUCCESS && sz == part_size[1],
                 "the part is %zu bytes after the failed grow, not %zu", sz, part_size[1]);
    } else {
        while (kill_time() == 0 && now_s() - t0 < 60) {
            ema_progress();
            usleep(1000);
        }
    }
    double tk = kill_time();
    T_EXPECT(tk > 0, "the victim never died");
    /* every call that needs the victim fails, promptly */
    ema_status_t st;
    char c = 0;
    for (;;) {
        st = ema_get(win, victim, 0, &c, 1);
        if (st != EMA_SUCCESS || now_s() - tk > 30) {
            break;
        }
        usleep(1000); /* noticed within milliseconds */
    }
    tlost = now_s() - tk;
    T_EXPECT(st == EMA_ERR_PEER_LOST, "get from the victim: %s", ema_strerror(st));
    T_EXPECT(ema_win_flush(win, victim) == EMA_ERR_PEER_LOST, "flush of the victim");
    T_EXPECT(ema_barrier() == EMA_ERR_PEER_LOST, "barrier");

    /* no byte lost elsewhere */
    for (int r = 0; r < 3; r++) {
        if (r == victim) {
            continue;
        }
        int lost = verify(r);
        if (r == 1 && victim == 0 && (!strcmp(scenario, "lender") || !strcmp(scenario, "grow"))) {
            T_EXPECT(lost == 4, "%d segments of rank 1 lost, not the 4 on rank 0", lost);
        } else if (r == 1 && victim == 0) {
            /* the reclaim moved some or all of them before rank 0 died */
            T_EXPECT(lost <= 4, "%d segments of rank 1 lost, more than the 4 on rank 0", lost);
        } else {
            T_EXPECT(lost == 0, "%d segments of rank %d lost", lost, r);
        }
    }
    /* the lender has back what the dead borrower held */
    if (rank == 0 && victim == 1) {
        ema_mem_stat(&ms);
        while (ms.bytes_lent != 0 && now_s() - tk < 30) {
            ema_progress();
            usleep(1000);
            ema_mem_stat(&ms);
        }
        T_EXPECT(ms.bytes_lent == 0, "%zu bytes still lent to the dead rank", ms.bytes_lent);
    }
    /* the own part still takes writes (the byte it holds: the other
     * survivor may be reading it) */
    c = pattern(rank, 0);
    T_EXPECT(ema_put(win, rank, 0, &c, 1) == EMA_SUCCESS, "put to the own part");
    /* No barrier any more: wait for the other survivor's checks through
     * files, so that neither exits (and takes its memory) under the other. */
    char path[512];
    snprintf(path, sizeof(path), "%s/done.%d", getenv("FAULT_DIR"), rank);
    fclose(fopen(path, "w"));
    for (int r = 0; r < 3; r++) {
        snprintf(path, sizeof(path), "%s/done.%d", getenv("FAULT_DIR"), r);
        while (r != victim && access(path, F_OK) != 0 && now_s() - tk < 30) {
            usleep(1000);
        }
    }
    double t = now_s() - tk;
    double bound = getenv("FAULT_BOUND") ? atof(getenv("FAULT_BOUND")) : 10;
    T_EXPECT(t < bound, "finished %.3f s after the kill (bound %.0f s)", t, bound);
    st = ema_finalize();
    T_EXPECT(st == EMA_SUCCESS || st == EMA_ERR_PEER_LOST, "ema_finalize: %s", ema_strerror(st));
    t = now_s() - tk;
    if (ema_t_failures == 0) {
        printf("PASS rank %d %s lost-after %.3f s done-after %.3f s\n", rank, scenario, tlost, t);
    }
    return ema_t_failures != 0;
}
