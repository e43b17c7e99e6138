/*
 * kv_serving: LLM serving's KV cache under skewed load, three ways, side by
 * side in one run (host kind; the model of DESIGN.md's last goal):
 *
 *   static   each rank serves from its own memory only (C bytes);
 *   elastic  the same C bytes each, and a rank that runs out grows its KV
 *            window into idle peers' memory (ema_win_grow borrows); a peer
 *            that gets busy takes its memory back (implicit reclaim), and
 *            where the borrower has nowhere to move it, the borrower's
 *            engine preempts requests to give it back (bytes_wanted);
 *   double   each rank has 2C bytes of its own: the upper bound.
 *
 *   EMA_DEVICE_MEMORY=64M EMA_LEND_RESERVE=0 EMA_SPILL=none \
 *       mpirun --oversubscribe -n 4 -x EMA_DEVICE_MEMORY -x EMA_LEND_RESERVE -x EMA_SPILL \
 *       bench/kv_serving [--time S] [--rate R] [--skew F] [--step-us U] [--seed N]
 *                        [--per-rank]
 *
 * (EMA_SPILL=none: on GPUs the spill tier is host memory across PCIe, so
 * elastic should borrow peers' memory only; with spill on, the columns show
 * how much went there.)
 *
 * Each rank runs one serving engine.  Requests arrive by a Poisson process,
 * rank 0 getting --skew of them and the others sharing the rest.  A
 * request needs KV blocks (one block = 2 MiB) for its prompt and its output
 * tokens, paged as in vLLM (anywhere in the KV window); it is admitted, in
 * arrival order, when its blocks can be found, and then decodes one token
 * per step.  A step takes --step-us whatever
 * the batch (decoding streams the weights: a larger batch is almost free),
 * plus one pass that reads and writes a word per 4 KiB of every admitted
 * request's KV blocks (its attention reads them, wherever they live).  So
 * the memory a rank can hold KV in bounds its batch, hence its throughput.
 *
 * EMA_DEVICE_MEMORY is 2C per rank.  static and elastic each first put C
 * of it in a ballast window, leaving C; static never grows past its free
 * local memory, elastic lets ema_win_grow borrow.  When ema_win_stat says
 * lenders want bytes back that EMA had nowhere to move (bytes_wanted), the
 * elastic engine preempts its youngest requests (they start over later, as
 * vLLM's recompute preemption), moves the KV blocks left in the window's
 * tail into the freed ones, shrinks, and borrows nothing for 12 steps, so
 * the lender's retry finds the memory.  Every rank replays the
 * same arrivals in each mode.  Printed: completed requests per second (all
 * ranks, and rank 0's alone), p50
 * and p99 latency (arrival to last token; a request still queued or
 * decoding at the end counts with its wait so far), most bytes rank 0
 * borrowed (or spilled), requests preempted (all ranks; --per-rank: each
 * rank's throughput and preemptions); then
 * elastic / static and elastic / double.  Goals (DESIGN.md): >= 1.5x static
 * throughput, >= 0.98x double's, p99 <= 1.1x static's.
 */
#include <ema.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCK   ((size_t)2 << 20) /* a KV block: one host segment */
#define MAXREQ  65536
#define MODES   3

static const char *mode_name[MODES] = {"static", "elastic", "double"};

typedef struct {
    double   arrive;  /* seconds from the mode's start */
    uint32_t blocks;  /* KV blocks for prompt + output */
    uint32_t steps;   /* output tokens */
    /* during the run */
    int32_t  admitted; /* 1: holds its blocks, blk[] */
    uint32_t blk[8];   /* its KV blocks: indices in the KV window, anywhere */
    uint32_t done;    /* steps decoded */
    double   latency; /* seconds, once complete */
} req_t;

static int rank, size;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, ema_status_t s)
{
    fprintf(stderr, "kv_serving rank %d: %s: %s\n", rank, what, ema_strerror(s));
    exit(1);
}
#define CHECK(_call) do { ema_status_t s_ = (_call); if (s_ != EMA_SUCCESS) die(#_call, s_); } while (0)

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double urand(uint64_t *s) { return (double)(rnd(s) >> 11) / 9007199254740992.0; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/*
 * The KV window: blocks [0, nblk) of the own part, paged as in vLLM: a
 * request's blocks can be anywhere, the lowest free ones first.  The part
 * grows by the blocks missing when too few are free, and shrinks back over
 * free blocks at its end, so what a rank borrowed goes back as soon as its
 * tail empties.
 */
typedef struct {
    ema_win_h win;
    char     *base;
    size_t    max_blocks;
    size_t    nblk;      /* blocks in the part */
    size_t    nfree;     /* free blocks among them */
    int32_t  *owner;     /* [max_blocks]: request holding the block, -1 free */
    int       mode;
    size_t    local_cap; /* static, double: never grow past this many bytes */
    unsigned  step;      /* decode steps so far */
    unsigned  retry_at;  /* no grow before this step: the last one failed */
    unsigned  hold_until; /* no grow before this step: we just gave memory back */
} kv_t;

/* Give @r its blocks, growing the part by what is missing; 0, or -1 if
 * the memory is not there. */
static int kv_alloc(kv_t *kv, req_t *rq, int32_t r)
{
    uint32_t n = rq[r].blocks;
    if (kv->nfree < n) {
        size_t want = kv->nblk + (n - kv->nfree);
        if (want > kv->max_blocks || (kv->mode != 1 && want * BLOCK > kv->local_cap)) {
            return -1;
        }
        /* A failed grow asks every peer (about a millisecond): like a real
         * engine, wait for memory to free up here or a few steps for it to
         * free up elsewhere before asking again. */
        if (kv->step < kv->retry_at || kv->step < kv->hold_until) {
            return -1;
        }
        ema_status_t s = ema_win_grow(kv->win, want * BLOCK);
        if (s == EMA_ERR_NO_MEMORY) {
            kv->retry_at = kv->step + 10;
            return -1;
        }
        if (s != EMA_SUCCESS) {
            die("ema_win_grow", s);
        }
        for (size_t b = kv->nblk; b < want; b++) {
            kv->owner[b] = -1;
        }
        kv->nfree += want - kv->nblk;
        kv->nblk = want;
    }
    for (size_t b = 0, k = 0; k < n; b++) {
        if (kv->owner[b] < 0) {
            kv->owner[b] = r;
            rq[r].blk[k++] = (uint32_t)b;
        }
    }
    kv->nfree -= n;
    rq[r].admitted = 1;
    return 0;
}

static void kv_shrink_tail(kv_t *kv)
{
    size_t keep = kv->nblk;
    while (keep > 0 && kv->owner[keep - 1] < 0) {
        keep--;
    }
    if (keep < kv->nblk) {
        CHECK(ema_win_shrink(kv->win, keep * BLOCK));
        kv->nfree -= kv->nblk - keep;
        kv->nblk = keep;
    }
}

static void kv_release(kv_t *kv, req_t *rq, int32_t r)
{
    for (uint32_t k = 0; k < rq[r].blocks; k++) {
        kv->owner[rq[r].blk[k]] = -1;
    }
    kv->nfree += rq[r].blocks;
    rq[r].admitted = 0;
    kv->retry_at = 0; /* local memory changed: worth asking again */
    kv_shrink_tail(kv);
}

/*
 * A lender wants @wanted bytes back that EMA had nowhere to move
 * (ema_win_stat's bytes_wanted): free the last blocks of the part, as an
 * engine does under memory pressure.  Preempt the youngest requests (they
 * lose the least work; they start over when admitted again) until the
 * blocks left below the cut can hold every block above it, move those down
 * (a copy of each block, as a real engine's KV compaction), and shrink.
 * Returns how many requests were preempted.
 */
static size_t kv_give_back(kv_t *kv, req_t *rq, size_t head, size_t next, size_t wanted)
{
    size_t drop = (wanted + BLOCK - 1) / BLOCK;
    size_t cut  = kv->nblk > drop ? kv->nblk - drop : 0;
    size_t above = 0, free_below = 0, preempted = 0;

    for (size_t b = 0; b < kv->nblk; b++) {
        if (b >= cut && kv->owner[b] >= 0) {
            above++;
        } else if (b < cut && kv->owner[b] < 0) {
            free_below++;
        }
    }
    for (size_t i = next; i > head && free_below < above; i--) {
        int32_t r = (int32_t)(i - 1);
        if (!rq[r].admitted) {
            continue;
        }
        for (uint32_t k = 0; k < rq[r].blocks; k++) {
            uint32_t b = rq[r].blk[k];
            kv->owner[b] = -1;
            if (b >= cut) {
                above--;
            } else {
                free_below++;
            }
        }
        kv->nfree += rq[r].blocks;
        rq[r].admitted = 0;
        rq[r].done     = 0;
        preempted++;
    }
    /* compaction: every block still above the cut moves to a free one below */
    for (size_t b = cut, f = 0; b < kv->nblk; b++) {
        int32_t r = kv->owner[b];
        if (r < 0) {
            continue;
        }
        while (kv->owner[f] >= 0) {
            f++;
        }
        memcpy(kv->base + f * BLOCK, kv->base + b * BLOCK, BLOCK);
        for (uint32_t k = 0; k < rq[r].blocks; k++) {
            if (rq[r].blk[k] == b) {
                rq[r].blk[k] = (uint32_t)f;
            }
        }
        kv->owner[f] = r;
        kv->owner[b] = -1;
    }
    kv_shrink_tail(kv);
    /* and leave the memory to the lender that asked for it (it retries
     * its grow within 10 steps) before borrowing again */
    kv->hold_until = kv->step + 12;
    return preempted;
}

/* One mode, on every rank; returns this rank's completed count. */
static size_t run_mode(int mode, req_t *rq, size_t nrq, double T, double step_s, size_t cap,
                       double *lat, size_t *nlat, size_t *max_borrowed, size_t *max_spilled,
                       size_t *preempted)
{
    ema_win_h ballast = NULL;
    void *bb;
    kv_t kv;

    /* static and elastic keep C of their 2C in a ballast window */
    if (mode != 2) {
        CHECK(ema_win_allocate(cap / 2, NULL, &bb, &ballast));
        memset(bb, 0, cap / 2); /* resident, like model weights */
    }
    memset(&kv, 0, sizeof(kv));
    kv.mode       = mode;
    kv.max_blocks = (size_t)size * cap / BLOCK;
    kv.local_cap  = (mode == 2) ? cap : cap / 2;
    kv.owner      = malloc(kv.max_blocks * sizeof(*kv.owner));
    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE,
                           .max_size   = kv.max_blocks * BLOCK};
    void *base;
    CHECK(ema_win_allocate(0, &wp, &base, &kv.win));
    kv.base = base;
    for (size_t i = 0; i < nrq; i++) {
        rq[i].admitted = 0;
        rq[i].done     = 0;
    }
    *nlat = 0;
    *max_borrowed = *max_spilled = *preempted = 0;
    size_t next = 0, head = 0, completed = 0; /* next to arrive; oldest not complete */
    CHECK(ema_barrier());
    double t0 = now_s();
    for (;;) {
        double t = now_s() - t0;
        if (t >= T) {
            break;
        }
        while (next < nrq && rq[next].arrive <= t) {
            next++;
        }
        /* admit in arrival order: FCFS, no overtaking */
        for (size_t i = head; i < next; i++) {
            if (rq[i].admitted || rq[i].done == rq[i].steps) {
                continue;
            }
            if (kv_alloc(&kv, rq, (int32_t)i) != 0) {
                break;
            }
        }
        /* one decode step: attention over every admitted request's KV */
        uint64_t sink = 0;
        for (size_t i = head; i < next; i++) {
            if (!rq[i].admitted) {
                continue;
            }
            for (uint32_t k = 0; k < rq[i].blocks; k++) {
                volatile uint64_t *p = (volatile uint64_t *)(kv.base + (size_t)rq[i].blk[k] * BLOCK);
                for (size_t w = 0; w < BLOCK / 8; w += 512) {
                    sink += p[w];
                    p[w] = sink;
                }
            }
        }
        (void)sink;
        struct timespec ts = {0, (long)(step_s * 1e9)};
        nanosleep(&ts, NULL);
        kv.step++;
        double tn = now_s() - t0;
        for (size_t i = head; i < next; i++) {
            if (!rq[i].admitted) {
                continue;
            }
            if (++rq[i].done == rq[i].steps) {
                rq[i].latency = tn - rq[i].arrive;
                lat[(*nlat)++] = rq[i].latency;
                kv_release(&kv, rq, (int32_t)i);
                completed++;
            }
        }
        while (head < next && rq[head].done == rq[head].steps) {
            head++;
        }
        ema_win_stat_t ws = {0};
        CHECK(ema_win_stat(kv.win, &ws));
        /* bytes_wanted counts the lender's own segments until they move,
         * which its retry does: what we released meanwhile is not counted
         * off, so answer again only once the hold is over */
        if (ws.bytes_wanted > 0 && kv.step >= kv.hold_until) {
            *preempted += kv_give_back(&kv, rq, head, next, ws.bytes_wanted);
            CHECK(ema_win_stat(kv.win, &ws));
        }
        if (ws.bytes_borrowed > *max_borrowed) {
            *max_borrowed = ws.bytes_borrowed;
        }
        if (ws.bytes_spilled > *max_spilled) {
            *max_spilled = ws.bytes_spilled;
        }
    }
    /* requests that arrived but did not finish count with what they waited
     * so far (a lower bound): a queue that never drains shows in p99 */
    for (size_t i = head; i < next; i++) {
        if (rq[i].done < rq[i].steps) {
            lat[(*nlat)++] = T - rq[i].arrive;
        }
    }
    CHECK(ema_barrier());
    CHECK(ema_win_free(kv.win));
    if (ballast != NULL) {
        CHECK(ema_win_free(ballast));
    }
    free(kv.owner);
    return completed;
}

/* Every rank's @n doubles into rank 0's @all (through a window). */
static void gather(const double *mine, size_t n, double *all)
{
    void *base;
    ema_win_h w;
    CHECK(ema_win_allocate(rank == 0 ? n * sizeof(double) * (size_t)size : 0, NULL, &base, &w));
    CHECK(ema_put(w, 0, (size_t)rank * n * sizeof(double), mine, n * sizeof(double)));
    CHECK(ema_win_flush(w, 0));
    CHECK(ema_barrier());
    if (rank == 0) {
        memcpy(all, base, n * sizeof(double) * (size_t)size);
    }
    CHECK(ema_barrier());
    CHECK(ema_win_free(w));
}

int main(int argc, char **argv)
{
    double T = 3.0, rate = 0, skew = 0.7, step_us = 2000;
    uint64_t seed = 1;
    int per_rank = 0;

    for (int i = 1; i < argc; i++) {
        const char *v = (i + 1 < argc) ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--per-rank")) {
            per_rank = 1;
            continue;
        }
        if (v != NULL && !strcmp(argv[i], "--time")) T = atof(v);
        else if (v != NULL && !strcmp(argv[i], "--rate")) rate = atof(v);
        else if (v != NULL && !strcmp(argv[i], "--skew")) skew = atof(v);
        else if (v != NULL && !strcmp(argv[i], "--step-us")) step_us = atof(v);
        else if (v != NULL && !strcmp(argv[i], "--seed")) seed = strtoull(v, NULL, 10);
        else {
            fprintf(stderr, "usage: mpirun -n N kv_serving [--time S] [--rate R] [--skew F] "
                            "[--step-us U] [--seed N] [--per-rank]\n");
            return 2;
        }
        i++;
    }
    CHECK(ema_init(NULL));
    CHECK(ema_world_rank(&rank));
    CHECK(ema_world_size(&size));
    ema_mem_stat_t ms = {0};
    CHECK(ema_mem_stat(&ms));
    size_t cap = ms.capacity / BLOCK * BLOCK; /* 2C */
    if (size < 2 || ms.memory_kind != EMA_MEMORY_KIND_HOST || cap < 8 * BLOCK) {
        if (rank == 0) {
            printf("SKIP kv_serving: needs 2 or more ranks, the host kind and "
                   "EMA_DEVICE_MEMORY of 16M or more (2 ranks %d, kind %s, capacity %zu)\n",
                   size, ms.memory_kind == EMA_MEMORY_KIND_HOST ? "host" : "cuda", cap);
        }
        ema_finalize();
        return 77;
    }
    /* The load: requests of 2..8 blocks, 20..60 tokens; by default rank 0
     * alone is offered about 3x what C can hold at once. */
    double step_s = step_us * 1e-6, mean_steps = 40, mean_blocks = 5;
    double c_reqs = (double)(cap / 2 / BLOCK) / mean_blocks; /* requests C holds */
    if (rate <= 0) {
        rate = 3.0 * c_reqs / (mean_steps * step_s) / skew;
    }
    double my_rate = rate * ((rank == 0) ? skew : (1 - skew) / (size - 1));
    req_t *rq = calloc(MAXREQ, sizeof(*rq));
    double *lat = calloc(MAXREQ, sizeof(double));
    uint64_t s = seed * 1000003u + (uint64_t)rank;
    size_t nrq = 0;
    for (double t = 0; nrq < MAXREQ;) {
        t += -log(1.0 - urand(&s)) / my_rate;
        if (t >= T) {
            break;
        }
        rq[nrq].arrive = t;
        rq[nrq].blocks = 2 + (uint32_t)(rnd(&s) % 7);
        rq[nrq].steps  = 20 + (uint32_t)(rnd(&s) % 41);
        nrq++;
    }
    if (rank == 0) {
        printf("# kv_serving: %d ranks, C = %zu MiB of KV memory each (2C in double), blocks "
               "of 2 MiB, step %.0f us, %.1f s per mode\n", size, cap / 2 >> 20, step_us, T);
        printf("# load: %.0f requests/s, %.0f%% at rank 0 (%zu of its arrivals), requests of "
               "2-8 blocks and 20-60 tokens\n", rate, skew * 100, nrq);
        printf("%-8s %10s %10s %10s %10s %12s %12s %10s\n", "mode", "req/s", "r0_req/s", "p50_ms",
               "p99_ms", "r0_borrowed", "r0_spilled", "preempted");
    }

    double res[MODES][3];
    /* per rank: completed, borrowed, latencies, spilled, preempted, NQ quantiles */
    enum { NQ = 4096, HDR = 5 };
    double *mine = calloc(HDR + NQ, sizeof(double));
    double *all  = calloc((size_t)size * (HDR + NQ), sizeof(double));
    double *l    = calloc((size_t)size * NQ + 1, sizeof(double));
    for (int m = 0; m < MODES; m++) {
        size_t nlat, borrowed, spilled, preempted;
        size_t done = run_mode(m, rq, nrq, T, step_s, cap, lat, &nlat, &borrowed, &spilled,
                               &preempted);
        qsort(lat, nlat, sizeof(double), cmp_double);
        mine[0] = (double)done;
        mine[1] = (double)borrowed;
        mine[2] = (double)nlat;
        mine[3] = (double)spilled;
        mine[4] = (double)preempted;
        for (size_t i = 0; i < NQ; i++) {
            mine[HDR + i] = (nlat == 0) ? 0 : lat[i * nlat / NQ]; /* quantile sample */
        }
        gather(mine, HDR + NQ, all);
        if (rank != 0) {
            continue;
        }
        /* all ranks' latencies: each rank's quantile sample, thinned in
         * proportion to how many latencies it had */
        double total = 0, nall = 0;
        size_t nl = 0;
        for (int r = 0; r < size; r++) {
            total += all[(size_t)r * (HDR + NQ)];
            nall  += all[(size_t)r * (HDR + NQ) + 2];
        }
        for (int r = 0; r < size && nall > 0; r++) {
            const double *a = all + (size_t)r * (HDR + NQ);
            size_t k = (size_t)((double)NQ * a[2] / nall + 0.5);
            for (size_t i = 0; i < k && i < NQ; i++) {
                l[nl++] = a[HDR + i * NQ / k];
            }
        }
        qsort(l, nl, sizeof(double), cmp_double);
        res[m][0] = total / T;
        res[m][1] = nl ? l[nl / 2] * 1e3 : 0;
        res[m][2] = nl ? l[nl * 99 / 100] * 1e3 : 0;
        if (per_rank) {
            for (int r = 0; r < size; r++) {
                const double *a = all + (size_t)r * (HDR + NQ);
                printf("#   %s, rank %d: %.1f req/s, %.0f preempted\n", mode_name[m], r,
                       a[0] / T, a[4]);
            }
        }
        double npre = 0;
        for (int r = 0; r < size; r++) {
            npre += all[(size_t)r * (HDR + NQ) + 4];
        }
        printf("%-8s %10.1f %10.1f %10.1f %10.1f %8.0f MiB %8.0f MiB %10.0f\n", mode_name[m],
               res[m][0], all[0] / T, res[m][1], res[m][2], all[1] / 1048576.0,
               all[3] / 1048576.0, npre);
        fflush(stdout);
    }
    free(mine);
    free(all);
    free(l);
    if (rank == 0) {
        printf("# elastic / static: throughput %.2fx (goal >= 1.5), p99 %.2fx (goal <= 1.1)\n",
               res[1][0] / res[0][0], res[1][2] / res[0][2]);
        printf("# elastic / double: throughput %.2fx (goal >= 0.98)\n", res[1][0] / res[2][0]);
    }
    free(rq);
    free(lat);
    CHECK(ema_finalize());
    return 0;
}
