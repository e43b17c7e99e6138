/*
 * test_borrow_all: rank 0 grows one window to twice its memory by borrowing
 * from every peer, then the peers take back what they lent, one after
 * another, each giving it up again (ema_reclaim_release) before the next
 * starts, so the data always has somewhere to go.  Prints the timeline and
 * checks every word of rank 0's window after each step: no byte may be lost.
 * This is step 4 of the multi-GPU runs (one rank per GPU); on the host kind
 * it runs in make check.
 *
 *   mpirun -n N test_borrow_all [FACTOR]     (N >= 3, FACTOR default 2)
 *
 * Rank 0 borrows at most what the peers can lend minus the largest single
 * peer's share, so the share of whichever peer reclaims fits in the others:
 * with fewer than 3 ranks that is nothing, and the test reports SKIP.
 */
#include "common.h"

#include <stdlib.h>

#define CHUNK ((size_t)16 << 20) /* bytes per fill / check step */

static uint64_t word(size_t k)
{
    uint64_t x = (uint64_t)k * 0x9e3779b97f4a7c15ull + 0x5bd1e995u;
    return x ^ (x >> 31);
}

/* The pattern into [from, to) of rank 0's part (from a multiple of 8). */
static void fill(ema_win_h win, void *base, size_t from, size_t len)
{
    uint64_t *buf = t_malloc(CHUNK);
    for (size_t off = from; off < len; off += CHUNK) {
        size_t n = (len - off < CHUNK) ? len - off : CHUNK;
        for (size_t i = 0; i < n / 8; i++) {
            buf[i] = word(off / 8 + i);
        }
        own_write(win, base, off, buf, n);
    }
    free(buf);
}

/* Words of [0, len) of rank 0's part that differ from the pattern. */
static size_t check(ema_win_h win, void *base, size_t len, const char *when)
{
    uint64_t *buf = t_malloc(CHUNK);
    size_t bad = 0, first = (size_t)-1;
    for (size_t off = 0; off < len; off += CHUNK) {
        size_t n = (len - off < CHUNK) ? len - off : CHUNK;
        own_read(win, base, off, buf, n);
        for (size_t i = 0; i < n / 8; i++) {
            if (buf[i] != word(off / 8 + i)) {
                if (bad++ == 0) {
                    first = off + i * 8;
                }
            }
        }
    }
    free(buf);
    T_EXPECT(bad == 0, "%s: %zu words of %zu lost, the first at byte %zu", when, bad, len / 8,
             first);
    return bad;
}

/* Every rank's memory statistics, through a window. */
static void gather(ema_mem_stat_t *all)
{
    void *base;
    ema_win_h w;
    ema_mem_stat_t me = {0};
    size_t sz = sizeof(ema_mem_stat_t) * (size_t)ema_t_size;

    T_OK(ema_mem_stat(&me));
    T_OK(ema_win_allocate(sz, NULL, &base, &w));
    for (int r = 0; r < ema_t_size; r++) {
        T_OK(ema_put(w, r, sizeof(me) * (size_t)ema_t_rank, &me, sizeof(me)));
        T_OK(ema_win_flush(w, r));
    }
    T_OK(ema_barrier());
    own_read(w, base, 0, all, sz);
    T_OK(ema_barrier());
    T_OK(ema_win_free(w));
}

static size_t lendable(const ema_mem_stat_t *m)
{
    return (m->bytes_free > m->reserve) ? m->bytes_free - m->reserve : 0;
}

int main(int argc, char **argv)
{
    double factor = (argc > 1) ? atof(argv[1]) : 2.0;
    ema_mem_stat_t *all;
    ema_win_stat_t ws = {0};
    ema_win_h win;
    void *base;

    ema_test_init("test_borrow_all"); /* needs the progress thread (the default) */
    if (!(factor > 1.0)) {
        fprintf(stderr, "usage: test_borrow_all [FACTOR > 1]\n");
        return 2;
    }
    all = t_malloc(sizeof(*all) * (size_t)ema_t_size);
    gather(all);
    size_t cap = all[0].capacity, sum = 0, top = 0;
    for (int r = 1; r < ema_t_size; r++) {
        sum += lendable(&all[r]);
        top = (lendable(&all[r]) > top) ? lendable(&all[r]) : top;
    }
    size_t own    = all[0].bytes_free; /* the reserve is for its own windows too */
    size_t want   = ((size_t)(factor * (double)cap) - own) / 8 * 8; /* whole words */
    size_t borrow = (want < sum - top) ? want : sum - top;
    if (borrow == 0) {
        if (ema_t_rank == 0) {
            printf("SKIP test_borrow_all: %d ranks can lend nothing that the others could take "
                   "back (needs 3 or more)\n", ema_t_size);
        }
        T_OK(ema_finalize());
        return 77;
    }
    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE,
                           .max_size   = own + borrow};
    T_OK(ema_win_allocate(ema_t_rank == 0 ? own : 0, &wp, &base, &win));
    size_t size = own;

    double t0 = t_now();
    if (ema_t_rank == 0) {
        printf("# rank 0: capacity %zu bytes, %zu of them its own; borrowing %zu of the %zu its "
               "%d peers can lend (factor %.2f wants %zu)\n", cap, own, borrow, sum,
               ema_t_size - 1, factor, want);
        fill(win, base, 0, own);
        double g0 = t_now();
        T_OK(ema_win_grow(win, own + borrow)); /* to the new size */
        double g1 = t_now();
        size += borrow;
        fill(win, base, own, size);
        T_OK(ema_win_stat(win, &ws));
        printf("# %8.1f ms  grow by %zu bytes took %.1f ms: window %zu bytes, %zu local, %zu "
               "borrowed, %zu spilled\n", (g0 - t0) * 1e3, borrow, (g1 - g0) * 1e3, ws.size,
               ws.bytes_local, ws.bytes_borrowed, ws.bytes_spilled);
        T_EXPECT(ws.size == size && ws.bytes_borrowed + ws.bytes_spilled == borrow,
                 "after the grow: size %zu, borrowed %zu, spilled %zu", ws.size,
                 ws.bytes_borrowed, ws.bytes_spilled);
        check(win, base, size, "after the grow");
    }
    fflush(stdout);

    for (int r = 1; r < ema_t_size; r++) {
        T_OK(ema_barrier());
        if (ema_t_rank == r) {
            ema_mem_stat_t m = {0};
            T_OK(ema_mem_stat(&m));
            /* ema_reclaim(n) makes n bytes free, counting what is free
             * already: to take back all it lent, ask for free + lent */
            size_t lent = m.bytes_lent, ask = m.bytes_lent + m.bytes_free;
            if (lent == 0) {
                printf("#             rank %d lends nothing\n", r);
            }
            double r0 = t_now();
            if (lent > 0) {
                T_STATUS(ema_reclaim(ask, 60000), EMA_SUCCESS);
            }
            double r1 = t_now();
            T_OK(ema_mem_stat(&m));
            printf("# %8.1f ms  rank %d took back %zu bytes in %.1f ms (%.2f GB/s); it still "
                   "lends %zu\n", (r0 - t0) * 1e3, r, lent, (r1 - r0) * 1e3,
                   (double)lent / (r1 - r0) / 1e9, m.bytes_lent);
            fflush(stdout);
            T_EXPECT(m.bytes_lent == 0, "rank %d still lends %zu bytes", r, m.bytes_lent);
            if (lent > 0) {
                T_STATUS(ema_reclaim_release(ask), EMA_SUCCESS);
            }
        }
        T_OK(ema_barrier());
        if (ema_t_rank == 0) {
            char when[64];
            T_OK(ema_win_stat(win, &ws));
            printf("#             window: %zu local, %zu borrowed, %zu spilled, %" PRIu64
                   " segment moves so far\n", ws.bytes_local, ws.bytes_borrowed,
                   ws.bytes_spilled, ws.migrations);
            snprintf(when, sizeof(when), "after rank %d's reclaim", r);
            check(win, base, size, when);
            T_EXPECT(ws.size == size, "the window shrank to %zu", ws.size);
        }
        fflush(stdout);
    }
    T_OK(ema_barrier());
    if (ema_t_rank == 0) {
        printf("# %8.1f ms  done: every word of %zu bytes checked after each step\n",
               (t_now() - t0) * 1e3, size);
    }
    T_OK(ema_win_free(win));
    free(all);
    return ema_test_finish("test_borrow_all");
}
