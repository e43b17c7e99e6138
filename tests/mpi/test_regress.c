/*
 * Regression tests for the defects a black-box pass found (issue 12), on 4
 * ranks of the host kind.  Each scenario failed before its fix:
 *
 *   test_regress init_retry   (any settings)
 *       test_init_succeeds_after_many_failed_inits
 *         40 ema_init calls failing with a bad segment size, then a valid
 *         one: it used to fail with a bootstrap, timeout or transport error.
 *   test_regress init_fail_exit   (the script checks mpirun's exit)
 *       every rank's ema_init fails (EMA_DEVICE_MEMORY=1K), and the program
 *       prints one line and returns 0: mpirun must exit 0 with all four
 *       lines.  Open MPI used to abort the job ("exited without calling
 *       finalize"), killing the ranks that had not printed yet, since the
 *       PMIx connection stayed open after the failed ema_init.
 *   test_regress init_one_fails   (the script checks every rank's line)
 *       rank 1's ema_init fails (EMA_DEVICE_MEMORY=1K) before the others'
 *       have begun, and it exits; its must return EMA_ERR_INVALID_PARAM and
 *       the other ranks' must fail with EMA_ERR_PEER_LOST, all within 30 s
 *       (EMA_BOOT_TIMEOUT=60): they failed with EMA_ERR_BOOTSTRAP and a
 *       log line that did not say a rank had left, then (CI, 2026-12)
 *       with EMA_ERR_TIMEOUT after 60 s where rank 1 left before they
 *       entered the fence.
 *   test_regress held_noprog  (EMA_PROGRESS_THREAD=n, spill host)
 *       test_recall_of_held_segment_never_blocks_progress
 *         rank 0 holds one borrowed segment of four; the lender reclaims:
 *         the three free segments move at once, the held one once released,
 *         and rank 0's ema_progress and ema_barrier keep returning (they
 *         used to block for ever).  The reclaim callback runs once, in
 *         rank 0's own ema_progress, and may call ema_win_stat.
 *   test_regress order        (EMA_SPILL=none, no reserve)
 *       test_lender_order_follows_current_lendable_memory
 *         lenders with 8, 32 and 16 segments lendable: the first borrow goes
 *         to the one with 32, later ones follow each lender's current figure
 *         (they used to follow what the borrower last heard, or the rank).
 *   test_regress early        (EMA_DEBUG_WIN_LINK_DELAY on rank 2 only)
 *       test_window_used_before_every_rank_knows_it
 *         rank 0 shrinks and regrows a new window into borrowed memory
 *         before a slow rank 2 has made the window known: rank 2's gets used
 *         to read the old locations (wrong bytes).
 *   test_regress cblock       (EMA_SPILL=none, no reserve, the progress thread)
 *       test_acquire_never_runs_or_waits_behind_a_callback
 *         rank 0 holds its borrowed window with ema_win_acquire in a tight
 *         loop under an application mutex that its reclaim callback takes
 *         too, while the lenders reclaim: the callback must never run on
 *         the main thread inside ema_win_acquire (a self-deadlock), and an
 *         acquire must not wait out its 1 s bound for a recall whose
 *         callback waits for that mutex (both happened in e61948b).
 *   test_regress granted      (EMA_DEBUG_GROW_MAP_DELAY on rank 0 only, the progress thread)
 *       test_recall_of_granted_segments_tells_the_owner_before_they_move
 *         rank 0's grow borrows two segments of rank 1 (the only rank with
 *         free memory) and waits 1.5 s before it maps them; rank 1
 *         reclaims them meanwhile.  The recall waits for
 *         the map, then moves them: the reclaim callback must hear of them
 *         first, as of any recalled range (it used to be skipped: the
 *         recall counted as told once it had looked, before the map).
 *   test_regress race [SECONDS] (default 20)
 *       test_moves_racing_third_rank_reads_lose_no_byte
 *         rounds of a freshly allocated window that rank 0 grows, prefetches,
 *         shrinks and regrows while rank 1 reclaims and ranks 2 and 3 read it
 *         with ema_get, every byte checked.
 */
#include "common.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <unistd.h>

static size_t SEG;
static ema_win_h ctl;     /* per rank: [0] a flag, [64..] its ema_mem_stat_t */
static void *ctl_base;
#define CTL_SIZE  4096
#define CTL_FLAG  0
#define CTL_STAT  64
#define LIMIT_S   10.0    /* bound on every wait for asynchronous state */

static void ctl_setup(void)
{
    ema_win_stat_t ws = {0};
    T_OK(ema_win_allocate(CTL_SIZE, NULL, &ctl_base, &ctl));
    own_memset(ctl, ctl_base, 0, 0, CTL_SIZE);
    /* max_size defaults to the size rounded up to whole segments */
    T_OK(ema_win_stat(ctl, &ws));
    SEG = ws.max_size;
    T_OK(ema_barrier());
}

/* Every rank's ema_mem_stat, taken after a barrier. */
static void gather(ema_mem_stat_t *st)
{
    ema_mem_stat_t m = {0};
    T_OK(ema_mem_stat(&m));
    own_write(ctl, ctl_base, CTL_STAT, &m, sizeof(m));
    T_OK(ema_barrier());
    for (int r = 0; r < ema_t_size; r++) {
        T_OK(ema_get(ctl, r, CTL_STAT, &st[r], sizeof(st[r])));
    }
    T_OK(ema_barrier());
}

static uint64_t wpat(uint64_t seed, size_t word)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + (uint64_t)word * 0xd1b54a32d192ed03ull;
    return t_rand(&s);
}

/* Fill [from, to) of the own part with the pattern of @seed: plain stores on
 * the host kind, puts through a host buffer on cuda (own_write). */
static void fill_own(ema_win_h win, void *base, size_t from, size_t to, uint64_t seed)
{
    enum { CHUNK = 1 << 20 };
    uint64_t *tmp = malloc(CHUNK);
    if (tmp == NULL) {
        fprintf(stderr, "FAIL rank %d: malloc(%d)\n", ema_t_rank, CHUNK);
        exit(1);
    }
    for (size_t o = from; o < to; o += CHUNK) {
        size_t n = to - o < CHUNK ? to - o : CHUNK;
        for (size_t w = 0; w < n / 8; w++) {
            tmp[w] = wpat(seed, o / 8 + w);
        }
        own_write(win, base, o, tmp, n);
    }
    free(tmp);
}

/* Offset of the first word of [from, to) of @buf (which starts at @from)
 * that differs from the pattern, or SIZE_MAX. */
static size_t check_buf(const uint64_t *buf, size_t from, size_t to, uint64_t seed)
{
    for (size_t o = from; o < to; o += 8) {
        if (buf[(o - from) / 8] != wpat(seed, o / 8)) {
            return o;
        }
    }
    return SIZE_MAX;
}

static size_t check_remote(ema_win_h win, int rank, size_t from, size_t to, uint64_t seed)
{
    uint64_t *buf = t_malloc(to - from);
    ema_status_t s = ema_get(win, rank, from, buf, to - from);
    size_t bad = (s == EMA_SUCCESS) ? check_buf(buf, from, to, seed) : from;
    free(buf);
    return bad;
}

/* ------------------------------------------------------------------------ */

static void test_init_succeeds_after_many_failed_inits(void)
{
    ema_init_params_t p;
    memset(&p, 0, sizeof(p));
    p.field_mask   = EMA_INIT_PARAM_FIELD_SEGMENT_SIZE;
    p.segment_size = 12345; /* not a multiple of the page size */
    int bad = 0;
    for (int i = 0; i < 40; i++) {
        ema_status_t s = ema_init(&p);
        bad += (s != EMA_ERR_INVALID_PARAM);
        if (s == EMA_SUCCESS) {
            ema_finalize();
            break;
        }
    }
    ema_test_init("test_init_succeeds_after_many_failed_inits");
    ema_test_begin("test_init_succeeds_after_many_failed_inits");
    T_EXPECT(bad == 0, "%d of 40 inits with a bad segment size did not fail with "
             "EMA_ERR_INVALID_PARAM", bad);
    /* the world works: a ring of puts */
    void *base;
    ema_win_h win;
    T_OK(ema_win_allocate(4096, NULL, &base, &win));
    uint64_t v = 0xabc0 + (uint64_t)ema_t_rank, got = 0;
    T_OK(ema_put(win, (ema_t_rank + 1) % ema_t_size, 0, &v, sizeof(v)));
    T_OK(ema_win_flush_all(win));
    T_OK(ema_barrier());
    T_OK(ema_get(win, ema_t_rank, 0, &got, sizeof(got)));
    int from = (ema_t_rank + ema_t_size - 1) % ema_t_size;
    T_EXPECT(got == 0xabc0 + (uint64_t)from, "ring put from rank %d read %#" PRIx64, from, got);
    T_OK(ema_barrier());
    T_OK(ema_win_free(win));
}

/* ------------------------------------------------------------------------ */

/* ema_progress calls for @secs seconds (or until rank @flag_rank's flag is
 * set, if >= 0); returns the longest call, in seconds. */
static double progress_for(double secs, int flag_rank)
{
    double t_end = t_now() + secs, longest = 0;
    while (t_now() < t_end) {
        double t0 = t_now();
        ema_status_t s = ema_progress();
        double dt = t_now() - t0;
        longest = dt > longest ? dt : longest;
        T_EXPECT(s == EMA_SUCCESS || s == EMA_INPROGRESS, "ema_progress returned %d", (int)s);
        if (flag_rank >= 0) {
            uint64_t f = 0;
            T_OK(ema_get(ctl, flag_rank, CTL_FLAG, &f, sizeof(f)));
            if (f) {
                break;
            }
        }
    }
    return longest;
}

/* The reclaim callback (ema(7) MIGRATION): how often it ran, on which
 * thread, and whether ema_win_stat from inside it returned (the callback
 * runs without the window's lock). */
static struct {
    int       calls;
    int       stat_ok;
    int       other_thread;
    pthread_t main;
    size_t    bytes;
} cbinfo;

static void held_cb(ema_win_h win, size_t offset, size_t len, void *arg)
{
    ema_win_stat_t ws;
    (void)offset;
    (void)arg;
    cbinfo.calls++;
    cbinfo.bytes += len;
    cbinfo.stat_ok += (ema_win_stat(win, &ws) == EMA_SUCCESS);
    cbinfo.other_thread += !pthread_equal(pthread_self(), cbinfo.main);
}

static void test_recall_of_held_segment_never_blocks_progress(void)
{
    ema_mem_stat_t st[64], m = {0};
    void *wb, *bb;
    ema_win_h win, ballast;
    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = 8 * SEG};

    ema_test_begin("test_recall_of_held_segment_never_blocks_progress");
    T_OK(ema_mem_stat(&m));
    /* rank 0 fills its own memory, so its window grows into a peer's */
    T_OK(ema_win_allocate(ema_t_rank == 0 ? m.bytes_free : 0, NULL, &bb, &ballast));
    T_OK(ema_win_allocate(0, &wp, &wb, &win));
    size_t size = 4 * SEG;
    if (ema_t_rank == 0) {
        T_OK(ema_win_grow(win, size));
        fill_own(win, wb, 0, size, 7);
        T_OK(ema_win_acquire(win, 0, SEG)); /* the first segment, held */
        cbinfo.main = pthread_self();
        T_OK(ema_win_set_reclaim_cb(win, held_cb, NULL));
    }
    T_OK(ema_barrier());
    gather(st);
    int L = -1;
    for (int r = 1; r < ema_t_size; r++) {
        if (st[r].bytes_lent > 0) {
            L = (L < 0 || st[r].bytes_lent > st[L].bytes_lent) ? r : L;
        }
    }
    T_EXPECT(L > 0 && st[L].bytes_lent == size, "rank 0's 4 segments are not all lent by one "
             "rank (largest lender %d)", L);
    if (L < 0) {
        goto out;
    }
    size_t take = st[L].bytes_free + st[L].bytes_lent;
    if (ema_t_rank == L) {
        double t0 = t_now();
        T_STATUS(ema_reclaim(take, 400), EMA_ERR_TIMEOUT);
        double dt = t_now() - t0;
        T_EXPECT(dt < 5.0, "ema_reclaim(timeout 400 ms) took %.2f s", dt);
        T_OK(ema_mem_stat(&m));
        /* the three free segments came back at once; the held one did not */
        T_EXPECT(m.bytes_lent == SEG, "lent %zu after the reclaim, expected only the held "
                 "segment (%zu)", m.bytes_lent, SEG);
    } else {
        double longest = progress_for(1.5, -1);
        T_EXPECT(longest < 0.5, "an ema_progress call took %.2f s while a reclaim waited on "
                 "a held segment", longest);
    }
    T_OK(ema_barrier()); /* must return on rank 0 too */
    if (ema_t_rank == 0) {
        size_t bad = check_buf(wb, 0, size, 7);
        T_EXPECT(bad == SIZE_MAX, "owner's word at %zu wrong while held", bad);
        ema_win_stat_t ws = {0};
        T_OK(ema_win_stat(win, &ws));
        T_EXPECT(ws.bytes_borrowed == size, "borrowed %zu, expected %zu", ws.bytes_borrowed,
                 size);
        /* no progress thread: the callback ran inside this thread's
         * ema_progress, once for the recall (held range included), without
         * the window's lock (ema_win_stat from it returned) */
        T_EXPECT(cbinfo.calls >= 1 && cbinfo.bytes >= size && cbinfo.stat_ok == cbinfo.calls &&
                 cbinfo.other_thread == 0, "reclaim callback: %d calls, %zu bytes, %d stats "
                 "returned, %d on another thread", cbinfo.calls, cbinfo.bytes, cbinfo.stat_ok,
                 cbinfo.other_thread);
        T_OK(ema_win_release(win, 0, SEG)); /* the parked recall moves it, no second call */
    }
    own_store_u64(ctl, ctl_base, CTL_FLAG, 0);
    T_OK(ema_barrier());
    if (ema_t_rank == L) {
        /* released: the held segment moves and comes back */
        double t0 = t_now();
        do {
            ema_progress();
            T_OK(ema_mem_stat(&m));
        } while (m.bytes_lent > 0 && t_now() - t0 < LIMIT_S);
        T_EXPECT(m.bytes_lent == 0, "still lent %zu bytes %.0f s after the release",
                 m.bytes_lent, LIMIT_S);
        own_store_u64(ctl, ctl_base, CTL_FLAG, 1);
        if (m.bytes_withheld > 0) {
            T_STATUS(ema_reclaim_release(m.bytes_withheld), EMA_SUCCESS);
        }
    } else {
        progress_for(LIMIT_S + 1, L);
    }
    T_OK(ema_barrier());
    if (ema_t_rank == 0) {
        size_t bad = check_buf(wb, 0, size, 7);
        T_EXPECT(bad == SIZE_MAX, "owner's word at %zu wrong after the move", bad);
        T_EXPECT(cbinfo.calls == 1, "the reclaim callback ran %d times for one recall",
                 cbinfo.calls);
    } else {
        size_t bad = check_remote(win, 0, 0, size, 7);
        T_EXPECT(bad == SIZE_MAX, "rank %d read a wrong word at %zu after the move",
                 ema_t_rank, bad);
    }
out:
    T_OK(ema_barrier());
    T_OK(ema_win_free(win));
    T_OK(ema_win_free(ballast));
}

/* ------------------------------------------------------------------------ */

/* Which rank lent more since @before: the single lender of a one-segment
 * borrow. */
static int lender_since(const ema_mem_stat_t *before, const ema_mem_stat_t *now)
{
    int who = -1, n = 0;
    for (int r = 0; r < ema_t_size; r++) {
        if (now[r].bytes_lent > before[r].bytes_lent) {
            who = r;
            n++;
        }
    }
    return (n == 1) ? who : -1 - n;
}

static void grow_one_and_check(ema_win_h win, size_t *size, size_t by, int expect,
                               const char *why)
{
    ema_mem_stat_t a[64], b[64];
    gather(a);
    if (ema_t_rank == 0) {
        *size += by;
        T_OK(ema_win_grow(win, *size));
    }
    T_OK(ema_barrier()); /* the lenders' stats after the grow */
    gather(b);
    if (ema_t_rank == 0) {
        int got = lender_since(a, b);
        T_EXPECT(got == expect, "%s: lent by rank %d, expected rank %d (before: free %zu %zu "
                 "%zu %zu, lent %zu %zu %zu %zu; after: lent %zu %zu %zu %zu)", why, got, expect,
                 a[0].bytes_free, a[1].bytes_free, a[2].bytes_free, a[3].bytes_free,
                 a[0].bytes_lent, a[1].bytes_lent, a[2].bytes_lent, a[3].bytes_lent,
                 b[0].bytes_lent, b[1].bytes_lent, b[2].bytes_lent, b[3].bytes_lent);
    }
}

static void test_lender_order_follows_current_lendable_memory(void)
{
    ema_mem_stat_t m = {0};
    void *bb, *wb;
    ema_win_h ballast, win;
    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE};

    ema_test_begin("test_lender_order_follows_current_lendable_memory");
    if (ema_t_size != 4) {
        goto skip;
    }
    T_OK(ema_mem_stat(&m));
    size_t nfree = m.bytes_free / SEG;
    static const size_t keep[4] = {0, 8, 32, 16}; /* segments each rank leaves lendable */
    if (nfree < 33) {
        T_EXPECT(0, "needs 33 free segments, has %zu (EMA_DEVICE_MEMORY)", nfree);
        goto skip;
    }
    wp.max_size = 64 * SEG;
    T_OK(ema_win_allocate((nfree - keep[ema_t_rank]) * SEG, NULL, &bb, &ballast));
    T_OK(ema_win_allocate(0, &wp, &wb, &win));
    T_OK(ema_barrier());
    size_t size = 0;
    grow_one_and_check(win, &size, SEG, 2, "first borrow (8, 32, 16 lendable)");
    /* rank 2 lends 17 more, then has 14 left: rank 3's 16 come first */
    grow_one_and_check(win, &size, 17 * SEG, 2, "17 more");
    grow_one_and_check(win, &size, SEG, 3, "after rank 2 lent 18 of 32");
    /* rank 1 frees most of its memory: it becomes the best lender */
    if (ema_t_rank == 1) {
        T_OK(ema_win_shrink(ballast, 0));
    }
    T_OK(ema_barrier());
    grow_one_and_check(win, &size, SEG, 1, "after rank 1 freed its memory");
    T_OK(ema_barrier());
    T_OK(ema_win_free(win));
    T_OK(ema_win_free(ballast));
skip:
    T_OK(ema_barrier());
}

/* ------------------------------------------------------------------------ */

static void test_window_used_before_every_rank_knows_it(void)
{
    void *wb;
    ema_win_h win;
    ema_mem_stat_t m = {0};
    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = 8 * SEG};
    size_t size = 4 * SEG;

    ema_test_begin("test_window_used_before_every_rank_knows_it");
    T_OK(ema_win_allocate(ema_t_rank == 0 ? size : 0, &wp, &wb, &win));
    if (ema_t_rank == 0) {
        /* at once, while rank 2 may still be inside ema_win_allocate */
        fill_own(win, wb, 0, size, 1);
        T_OK(ema_win_shrink(win, 0));
        T_OK(ema_mem_stat(&m));
        T_OK(ema_reclaim(m.bytes_free, 1000)); /* keep own memory out of the grow */
        T_OK(ema_win_grow(win, size));
        fill_own(win, wb, 0, size, 2);
        T_OK(ema_reclaim_release(m.bytes_free));
        ema_win_stat_t ws = {0};
        T_OK(ema_win_stat(win, &ws));
        T_EXPECT(ws.bytes_local == 0, "the regrown window is %zu bytes local", ws.bytes_local);
    }
    T_OK(ema_barrier());
    /* a peer's cached size of the part is current after a barrier that
     * follows the grow (ema_win_size(3)) */
    size_t seen = 0;
    T_OK(ema_win_size(win, 0, &seen));
    T_EXPECT(seen == size, "rank %d sees rank 0's part as %zu bytes after the barrier, not %zu",
             ema_t_rank, seen, size);
    if (ema_t_rank != 0) {
        size_t bad = check_remote(win, 0, 0, size, 2);
        T_EXPECT(bad == SIZE_MAX, "rank %d read a wrong word at %zu of a window rank 0 moved "
                 "before rank %d knew it", ema_t_rank, bad, ema_t_rank);
    }
    T_OK(ema_barrier());
    T_OK(ema_win_free(win));
}

/* ------------------------------------------------------------------------ */

static void test_moves_racing_third_rank_reads_lose_no_byte(double secs)
{
    ema_mem_stat_t m = {0};
    void *bb;
    ema_win_h ballast;
    uint64_t reads = 0, bytes = 0, moves = 0, rounds = 0;
    size_t wrong = 0;

    ema_test_begin("test_moves_racing_third_rank_reads_lose_no_byte");
    T_OK(ema_mem_stat(&m));
    size_t nfree = m.bytes_free / SEG;
    /* rank 0 keeps 4 segments of its own free: its windows live half away */
    T_OK(ema_win_allocate(ema_t_rank == 0 && nfree > 4 ? (nfree - 4) * SEG : 0, NULL, &bb,
                          &ballast));
    double t_end = t_now() + secs;
    uint64_t seed = 100;
    for (;;) {
        uint64_t go = (ema_t_rank == 0) ? (t_now() < t_end) : 0;
        if (ema_t_rank == 0) {
            own_store_u64(ctl, ctl_base, CTL_FLAG + 8, go);
        }
        T_OK(ema_barrier());
        T_OK(ema_get(ctl, 0, CTL_FLAG + 8, &go, sizeof(go)));
        T_OK(ema_barrier());
        if (!go) {
            break;
        }
        seed++;
        rounds++;
        size_t keep = 4 * SEG, full = 8 * SEG;
        void *wb;
        ema_win_h win;
        ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = full};
        T_OK(ema_win_allocate(0, &wp, &wb, &win));
        if (ema_t_rank == 0) {
            T_OK(ema_win_grow(win, full)); /* 4 local, 4 borrowed */
            fill_own(win, wb, 0, full, seed);
        }
        own_store_u64(ctl, ctl_base, CTL_FLAG, 0);
        T_OK(ema_barrier());
        double t_round = t_now() + 0.5;
        uint64_t st = t_seed(seed, (uint64_t)ema_t_rank, 3);
        if (ema_t_rank == 0) {
            /* moves: shrink (the rest comes home), regrow (borrowed), prefetch */
            while (t_now() < t_round) {
                T_OK(ema_win_shrink(win, keep));
                T_OK(ema_win_grow(win, full));
                /* plain stores into memory that rank 1's reclaims may be
                 * moving: held, as ema(7) says (a store into a range while
                 * it moves may be lost).  Unheld, a word of the fill was
                 * lost in 1 of about 40 runs (CI's ASan suite, session 23:
                 * "owner's word at 7340096 wrong", in the refilled half). */
                T_OK(ema_win_acquire(win, keep, full - keep));
                fill_own(win, wb, keep, full, seed);
                T_OK(ema_win_release(win, keep, full - keep));
                T_OK(ema_win_prefetch(win, 0, full));
                if (t_rand(&st) % 2) {
                    T_OK(ema_win_shrink(ballast, 0));
                    T_OK(ema_win_prefetch(win, 0, full));
                    usleep(1000);
                    ema_status_t s = ema_win_grow(ballast, (nfree > 4 ? nfree - 4 : 0) * SEG);
                    T_EXPECT(s == EMA_SUCCESS || s == EMA_ERR_NO_MEMORY, "ballast regrow %d",
                             (int)s);
                }
                moves++;
            }
            own_store_u64(ctl, ctl_base, CTL_FLAG, 1);
        } else {
            uint64_t stop = 0;
            uint64_t *buf = t_malloc(keep);
            while (!stop) {
                if (ema_t_rank == 1) {
                    /* the lender takes back what it can, then lends again */
                    ema_mem_stat_t mm = {0};
                    T_OK(ema_mem_stat(&mm));
                    ema_status_t s = ema_reclaim(mm.bytes_free + mm.bytes_lent, 200);
                    T_EXPECT(s == EMA_SUCCESS || s == EMA_ERR_TIMEOUT || s == EMA_ERR_NO_MEMORY,
                             "ema_reclaim returned %d", (int)s);
                    T_OK(ema_mem_stat(&mm));
                    if (mm.bytes_withheld > 0) {
                        T_OK(ema_reclaim_release(mm.bytes_withheld));
                    }
                    usleep(2000);
                }
                /* every rank but 0 reads the kept range, every word checked */
                size_t off = (size_t)(t_rand(&st) % (keep / 8)) * 8;
                size_t len = 8 + (size_t)(t_rand(&st) % ((keep - off) / 8)) * 8;
                if (t_rand(&st) % 4 == 0) {
                    off = 0;
                    len = keep;
                }
                T_OK(ema_get(win, 0, off, buf, len));
                size_t bad = check_buf(buf, off, off + len, seed);
                if (bad != SIZE_MAX) {
                    if (wrong++ < 3) {
                        T_EXPECT(0, "round %" PRIu64 ": rank %d read a wrong word at %zu",
                                 rounds, ema_t_rank, bad);
                    }
                }
                reads++;
                bytes += len;
                T_OK(ema_get(ctl, 0, CTL_FLAG, &stop, sizeof(stop)));
            }
            free(buf);
        }
        T_OK(ema_barrier());
        if (ema_t_rank != 0) {
            size_t bad = check_remote(win, 0, 0, keep, seed);
            T_EXPECT(bad == SIZE_MAX, "round %" PRIu64 ": after the moves rank %d read a wrong "
                     "word at %zu", rounds, ema_t_rank, bad);
        } else {
            size_t bad = check_buf(wb, 0, full, seed);
            T_EXPECT(bad == SIZE_MAX, "round %" PRIu64 ": owner's word at %zu wrong", rounds,
                     bad);
        }
        T_OK(ema_barrier());
        T_OK(ema_win_free(win));
    }
    T_OK(ema_win_free(ballast));
    T_OK(ema_mem_stat(&m));
    printf("# rank %d: %" PRIu64 " rounds, %" PRIu64 " move loops, %" PRIu64 " bytes migrated, "
           "%" PRIu64 " checked gets (%" PRIu64 " bytes), %zu wrong\n", ema_t_rank, rounds, moves,
           m.bytes_migrated, reads, bytes, wrong);
    fflush(stdout);
}

/* ------------------------------------------------------------------------ */

static pthread_mutex_t cb_mu;
static pthread_t       cb_main;
static atomic_int      cb_calls, cb_on_main, cb_edeadlk;

static void cblock_cb(ema_win_h win, size_t offset, size_t len, void *arg)
{
    (void)win;
    (void)offset;
    (void)len;
    (void)arg;
    atomic_fetch_add(&cb_calls, 1);
    if (pthread_equal(pthread_self(), cb_main)) {
        atomic_fetch_add(&cb_on_main, 1);
    }
    int r = pthread_mutex_lock(&cb_mu); /* an engine's scheduler lock */
    if (r == EDEADLK) {
        atomic_fetch_add(&cb_edeadlk, 1);
        return;
    }
    if (r == 0) {
        pthread_mutex_unlock(&cb_mu);
    }
}

static void test_acquire_never_runs_or_waits_behind_a_callback(void)
{
    enum { ROUNDS = 3, NSEG = 4 };
    ema_mem_stat_t m = {0};
    ema_win_h ballast, win;
    void *bb, *wb;
    pthread_mutexattr_t a;

    ema_test_begin("test_acquire_never_runs_or_waits_behind_a_callback");
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK);
    pthread_mutex_init(&cb_mu, &a);
    cb_main = pthread_self();
    T_OK(ema_mem_stat(&m));
    /* rank 0's own memory is all ballast: its window lives in peers' */
    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = NSEG * SEG};
    T_OK(ema_win_allocate(ema_t_rank == 0 ? m.bytes_free : 0, NULL, &bb, &ballast));
    T_OK(ema_win_allocate(0, &wp, &wb, &win));
    size_t size = NSEG * SEG;
    if (ema_t_rank == 0) {
        T_STATUS(ema_win_grow(win, size), EMA_SUCCESS);
        T_OK(ema_win_set_reclaim_cb(win, cblock_cb, NULL));
        fill_own(win, wb, 0, size, 77);
    }
    T_OK(ema_barrier());
    double maxacq = 0, maxrec = 0;
    long nacq = 0;
    for (int r = 0; r < ROUNDS; r++) {
        if (ema_t_rank == 0) {
            double t0 = t_now();
            while (t_now() - t0 < 1.0) {
                pthread_mutex_lock(&cb_mu);
                double ta = t_now();
                T_OK(ema_win_acquire(win, 0, size));
                double d = t_now() - ta;
                maxacq = d > maxacq ? d : maxacq;
                nacq++;
                T_OK(ema_win_release(win, 0, size));
                pthread_mutex_unlock(&cb_mu);
            }
        } else {
            usleep(200000);
            memset(&m, 0, sizeof(m));
            T_OK(ema_mem_stat(&m));
            if (m.bytes_lent > 0) {
                double t0 = t_now();
                ema_status_t s = ema_reclaim(m.bytes_free + m.bytes_lent, 5000);
                double d = t_now() - t0;
                maxrec = d > maxrec ? d : maxrec;
                T_EXPECT(s == EMA_SUCCESS || s == EMA_ERR_NO_MEMORY,
                         "rank %d's reclaim: %s", ema_t_rank, ema_strerror(s));
                memset(&m, 0, sizeof(m));
                T_OK(ema_mem_stat(&m));
                if (m.bytes_withheld > 0) {
                    T_OK(ema_reclaim_release(m.bytes_withheld));
                }
            }
        }
        T_OK(ema_barrier());
    }
    if (ema_t_rank == 0) {
        printf("# rank 0: %ld acquires, longest %.1f ms; %d callbacks, %d on the main thread, "
               "%d EDEADLK\n", nacq, maxacq * 1e3, atomic_load(&cb_calls),
               atomic_load(&cb_on_main), atomic_load(&cb_edeadlk));
        T_EXPECT(atomic_load(&cb_calls) > 0, "no reclaim callback ran: not the intended setup");
        T_EXPECT(atomic_load(&cb_on_main) == 0 && atomic_load(&cb_edeadlk) == 0,
                 "%d callbacks ran on the main thread (%d EDEADLK): inside ema_win_acquire",
                 atomic_load(&cb_on_main), atomic_load(&cb_edeadlk));
        T_EXPECT(maxacq < 0.5, "an acquire took %.3f s: it waited for a recall whose callback "
                 "waited for the acquiring thread", maxacq);
        uint64_t *buf = t_malloc(size);
        own_read(win, wb, 0, buf, size);
        size_t bad = check_buf(buf, 0, size, 77);
        free(buf);
        T_EXPECT(bad == SIZE_MAX, "owner's word at %zu wrong after the recalls", bad);
    } else if (maxrec > 0) {
        printf("# rank %d: longest reclaim %.1f ms\n", ema_t_rank, maxrec * 1e3);
        T_EXPECT(maxrec < 2.0, "rank %d's reclaim took %.3f s", ema_t_rank, maxrec);
    }
    fflush(stdout);
    T_OK(ema_barrier());
    T_OK(ema_win_free(win));
    T_OK(ema_win_free(ballast));
    pthread_mutex_destroy(&cb_mu);
}

/* ------------------------------------------------------------------------ */

/* The reclaim callback of rank 0's window: the bytes it heard of, and the
 * bytes borrowed when it first ran (the range had not moved yet). */
static atomic_int    gr_calls;
static atomic_size_t gr_bytes;
static size_t        gr_borrowed_first = SIZE_MAX;

static void granted_cb(ema_win_h win, size_t offset, size_t len, void *arg)
{
    ema_win_stat_t ws;
    (void)offset;
    (void)arg;
    if (atomic_fetch_add(&gr_calls, 1) == 0 && ema_win_stat(win, &ws) == EMA_SUCCESS) {
        gr_borrowed_first = ws.bytes_borrowed;
    }
    atomic_fetch_add(&gr_bytes, len);
}

/* CPU seconds of this process, all threads. */
static double t_cpu(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) {
        return 0;
    }
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
           ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) * 1e-6;
}

static void test_recall_of_granted_segments_tells_the_owner_before_they_move(void)
{
    ema_mem_stat_t m = {0};
    ema_win_h ballast, win;
    void *bb, *wb;
    size_t size = 2 * SEG;
    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = size};

    ema_test_begin("test_recall_of_granted_segments_tells_the_owner_before_they_move");
    T_OK(ema_mem_stat(&m));
    /* every rank's memory but rank 1's is all ballast: rank 0's grow
     * borrows from rank 1, and the recall moves the data to the spill tier
     * (no other rank lends, so none sees a lent segment but rank 1) */
    T_OK(ema_win_allocate(ema_t_rank != 1 ? m.bytes_free : 0, NULL, &bb, &ballast));
    T_OK(ema_win_allocate(0, &wp, &wb, &win));
    if (ema_t_rank == 0) {
        T_OK(ema_win_set_reclaim_cb(win, granted_cb, NULL));
    }
    T_OK(ema_barrier());
    if (ema_t_rank == 0) {
        /* EMA_DEBUG_GROW_MAP_DELAY: granted, then 1.5 s before the map */
        double t0 = t_now(), c0 = t_cpu();
        T_OK(ema_win_grow(win, size));
        double wall = t_now() - t0, cpu = t_cpu() - c0;
        T_EXPECT(wall > 1.0, "the grow took %.2f s: EMA_DEBUG_GROW_MAP_DELAY not set", wall);
        /* the grow sleeps, and the recall that came meanwhile waits parked
         * for the map: it does not spin on the progress thread (it did,
         * the whole 1.5 s, near a core's worth) */
        printf("# rank 0: %.0f ms of CPU during the %.0f ms grow\n", cpu * 1e3, wall * 1e3);
        T_EXPECT(cpu < 0.5 * wall, "rank 0 used %.0f ms of CPU during its %.0f ms grow: the "
                 "recall of its granted segments spins instead of parking", cpu * 1e3,
                 wall * 1e3);
    } else if (ema_t_rank == 1) {
        /* the lender sees its segments lent, and reclaims them at once,
         * while rank 0 has them granted and not mapped */
        double t0 = t_now();
        do {
            memset(&m, 0, sizeof(m));
            T_OK(ema_mem_stat(&m));
        } while (m.bytes_lent == 0 && t_now() - t0 < 1.0);
        T_EXPECT(m.bytes_lent == size, "rank 1 lends %zu bytes 1 s into rank 0's grow, not "
                 "%zu", m.bytes_lent, size);
        if (m.bytes_lent > 0) {
            t0 = t_now();
            T_STATUS(ema_reclaim(m.bytes_free + m.bytes_lent, 10000), EMA_SUCCESS);
            double dt = t_now() - t0;
            printf("# rank %d: reclaim of %zu lent bytes took %.0f ms\n", ema_t_rank,
                   m.bytes_lent, dt * 1e3);
            /* not the intended setup unless the recall came before the map */
            T_EXPECT(dt > 0.5, "the reclaim took %.0f ms: it did not wait for the map",
                     dt * 1e3);
            memset(&m, 0, sizeof(m));
            T_OK(ema_mem_stat(&m));
            T_EXPECT(m.bytes_lent == 0, "rank %d still lends %zu bytes", ema_t_rank,
                     m.bytes_lent);
            if (m.bytes_withheld > 0) {
                T_OK(ema_reclaim_release(m.bytes_withheld));
            }
        }
    }
    T_OK(ema_barrier());
    if (ema_t_rank == 0) {
        ema_win_stat_t ws = {0};
        T_OK(ema_win_stat(win, &ws));
        printf("# rank 0: %d callbacks, %zu bytes heard, %zu borrowed at the first; "
               "%" PRIu64 " segments migrated, %zu bytes spilled\n", atomic_load(&gr_calls),
               atomic_load(&gr_bytes), gr_borrowed_first, ws.migrations, ws.bytes_spilled);
        T_EXPECT(ws.migrations == 2 && ws.bytes_spilled == size, "%" PRIu64 " segments "
                 "migrated, %zu bytes spilled: not the 2 recalled", ws.migrations,
                 ws.bytes_spilled);
        T_EXPECT(atomic_load(&gr_bytes) == size, "the reclaim callback heard of %zu bytes of "
                 "the %zu recalled: the recall moved segments it was granted but had not "
                 "mapped without telling the owner", atomic_load(&gr_bytes), size);
        T_EXPECT(gr_borrowed_first == size, "at the callback %zu bytes were borrowed, not "
                 "%zu: it ran after the move", gr_borrowed_first, size);
    }
    fflush(stdout);
    T_OK(ema_barrier());
    T_OK(ema_win_free(win));
    T_OK(ema_win_free(ballast));
}

int main(int argc, char **argv)
{
    const char *mode = (argc > 1) ? argv[1] : "";

    if (strcmp(mode, "init_retry") == 0) {
        test_init_succeeds_after_many_failed_inits();
        return ema_test_finish("test_regress init_retry");
    }
    if (strcmp(mode, "init_fail_exit") == 0) {
        setenv("EMA_DEVICE_MEMORY", "1K", 1);
        ema_status_t s = ema_init(NULL);
        const char *r  = getenv("OMPI_COMM_WORLD_RANK");
        printf("init_fail_exit rank %s: ema_init %s\n", r ? r : "?", ema_strerror(s));
        return (s == EMA_ERR_INVALID_PARAM) ? 0 : 1;
    }
    if (strcmp(mode, "init_one_fails") == 0) {
        /* rank 1's ema_init fails before the exchange and it exits: the
         * others' fail at once with EMA_ERR_PEER_LOST, not at the end of
         * EMA_BOOT_TIMEOUT (the script sets 60 s) with EMA_ERR_BOOTSTRAP
         * (before session 21) or EMA_ERR_TIMEOUT */
        const char *r = getenv("OMPI_COMM_WORLD_RANK");
        int me = r ? atoi(r) : -1;
        if (me == 1) {
            /* no head start for the others: before 2026-12-06 rank 1 left
             * without taking part in the exchange, and where it left before
             * they entered the fence (CI, with a 1 s head start), Open MPI
             * 4.1's server never ended it and they failed after
             * EMA_BOOT_TIMEOUT.  It now joins the exchange with its error,
             * so the timing no longer matters. */
            setenv("EMA_DEVICE_MEMORY", "1K", 1);
        } else {
            /* the others are slow to come: rank 1's failed ema_init waits
             * for them, then returns its own error */
            usleep(300000);
        }
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        ema_status_t s = ema_init(NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        ema_status_t want = (me == 1) ? EMA_ERR_INVALID_PARAM : EMA_ERR_PEER_LOST;
        printf("init_one_fails rank %d: ema_init %s in %.1f s: %s\n", me, ema_strerror(s), dt,
               s == want && dt < 30 ? "ok" : "WRONG");
        if (s == EMA_SUCCESS) {
            ema_finalize();
        }
        return (s == want && dt < 30) ? 0 : 1;
    }
    if (strcmp(mode, "early") == 0) {
        /* rank 2 is slow to make a new window known */
        const char *r = getenv("OMPI_COMM_WORLD_RANK");
        if (r == NULL || atoi(r) != 2) {
            unsetenv("EMA_DEBUG_WIN_LINK_DELAY");
        }
    }
    if (strcmp(mode, "granted") == 0) {
        /* rank 0 is slow to map what its grow borrowed */
        const char *r = getenv("OMPI_COMM_WORLD_RANK");
        if (r == NULL || atoi(r) != 0) {
            unsetenv("EMA_DEBUG_GROW_MAP_DELAY");
        }
    }
    ema_test_init("test_regress");
    ctl_setup();
    if (strcmp(mode, "held_noprog") == 0) {
        test_recall_of_held_segment_never_blocks_progress();
    } else if (strcmp(mode, "order") == 0) {
        test_lender_order_follows_current_lendable_memory();
    } else if (strcmp(mode, "early") == 0) {
        test_window_used_before_every_rank_knows_it();
    } else if (strcmp(mode, "cblock") == 0) {
        test_acquire_never_runs_or_waits_behind_a_callback();
    } else if (strcmp(mode, "granted") == 0) {
        test_recall_of_granted_segments_tells_the_owner_before_they_move();
    } else if (strcmp(mode, "race") == 0) {
        test_moves_racing_third_rank_reads_lose_no_byte(argc > 2 ? atof(argv[2]) : 20.0);
    } else {
        fprintf(stderr, "usage: %s init_retry|init_fail_exit|init_one_fails|held_noprog|order|early|cblock|granted|race\n",
                argv[0]);
        return 2;
    }
    T_OK(ema_barrier());
    T_OK(ema_win_free(ctl));
    return ema_test_finish(mode);
}
