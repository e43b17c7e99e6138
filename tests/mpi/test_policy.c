/*
 * The prefetch policy across ranks (ema_win_set_policy, ema_win_advance,
 * ema_win_policy_stat), 2 ranks: rank 0 walks a window whose part is half
 * in its own memory and half borrowed from rank 1.  Host kind in make check
 * (tests/mpi/policy_np2.sh, policy_yield_np2.sh); the cuda kind with its
 * spill tier in contrib/gpu-suite.sh --cuda-spill.  The own part is read and
 * written through common.h's own_* helpers: plain loads and stores on host,
 * ema_get / ema_put to itself on cuda.
 *
 *   walk     (progress thread) the next `depth` groups become local at every
 *            step, groups behind leave only to make room, a group held with
 *            ema_win_acquire is never named to the reclaim callback nor
 *            moved (the owner's stores into it survive), and a walk that
 *            goes on while rank 1 reclaims everything it lent completes the
 *            reclaim with no byte lost.
 *   readonly EMA_WIN_POLICY_FLAG_READ_ONLY over a part half in the spill tier:
 *            groups brought home keep their spill copies, and leave again
 *            with no copy (bytes_dropped); the copies go with the policy.
 *   wait     (EMA_PROGRESS_THREAD=n) EMA_WIN_POLICY_FLAG_WAIT over a part half
 *            in the spill tier: without the flag an advance moves nothing
 *            (no thread runs the job); with it ema_win_advance runs the job
 *            itself and returns with its (spilled) group local, another
 *            moved out for room, at each of 7 steps; data intact.
 *   waitthread  the same with the progress thread running the job (no
 *            control step).
 *   yield    (EMA_PROGRESS_THREAD=n) the policy's job that meets a lender's
 *            recall defers (deferred counter), the recall completes first,
 *            then the policy runs again on its own and finishes its work.
 *
 * Every check is on real outcomes: policy and window statistics, the data
 * pattern of the whole part (rank 0's loads, rank 1's gets), and rank 1's
 * memory statistics.
 */
#include "common.h"

#include <stdatomic.h>
#include <time.h>

#define NGROUP    7
#define GSEGS     2  /* segments per group */
#define DEPTH     2
#define LIMIT_S   20.0

static size_t SEG;

static uint64_t wpat(size_t word, uint64_t seed)
{
    return (word + 1) * 0x9e3779b97f4a7c15ull ^ seed;
}

/* p points at the word of byte offset @from */
static void fill_at(uint64_t *p, size_t from, size_t to, uint64_t seed)
{
    for (size_t w = from / 8; w < to / 8; w++) {
        p[w - from / 8] = wpat(w, seed);
    }
}

/* Words of [from, to) that differ from the pattern (p points at the word
 * of byte offset @from); reports the first. */
static size_t check_at(const uint64_t *p, size_t from, size_t to, uint64_t seed,
                       const char *what)
{
    size_t bad = 0;
    for (size_t w = from / 8; w < to / 8; w++) {
        uint64_t v = p[w - from / 8];
        if (v != wpat(w, seed)) {
            if (bad++ == 0) {
                T_EXPECT(0, "%s: word at byte %zu is %#" PRIx64 ", expected %#" PRIx64, what,
                         w * 8, v, wpat(w, seed));
            }
        }
    }
    return bad;
}

/* The pattern into [from, to) of this rank's own part of @w: stores
 * through the base pointer on the host kind, ema_put to itself on cuda
 * (common.h own_write). */
static void fill(ema_win_h w, uint64_t *base, size_t from, size_t to, uint64_t seed)
{
    uint64_t *tmp = malloc(to - from);
    T_EXPECT(tmp != NULL, "malloc(%zu)", to - from);
    if (tmp == NULL) {
        return;
    }
    fill_at(tmp, from, to, seed);
    own_write(w, base, from, tmp, to - from);
    free(tmp);
}

/* check_at() of [from, to) of the own part: plain loads on the host kind,
 * an ema_get to itself on cuda (common.h own_view). */
static size_t check(ema_win_h w, const uint64_t *base, size_t from, size_t to, uint64_t seed,
                    const char *what)
{
    const uint64_t *p = (const uint64_t *)own_view(w, base, from, to - from);
    return check_at(p, from, to, seed, what);
}

/* check() of [0, size) of @w's own part under ema_win_acquire: the policy's
 * job may still be moving segments (ema(7): loads of a range that may move
 * are made while it is held). */
static size_t check_held(ema_win_h w, const uint64_t *p, size_t size, uint64_t seed,
                         const char *what)
{
    T_OK(ema_win_acquire(w, 0, size));
    size_t bad = check(w, p, 0, size, seed, what);
    T_OK(ema_win_release(w, 0, size));
    return bad;
}

/* ranges the reclaim callback heard of, and whether one overlapped the
 * range that must never move */
static size_t never_lo, never_hi;
static atomic_int never_named, heard;

static void on_move(ema_win_h w, size_t off, size_t len, void *arg)
{
    (void)w;
    (void)arg;
    atomic_fetch_add(&heard, 1);
    if (off < never_hi && never_lo < off + len) {
        atomic_fetch_add(&never_named, 1);
    }
}

static ema_win_policy_stat_t pstat(ema_win_h w)
{
    ema_win_policy_stat_t st;
    T_OK(ema_win_policy_stat(w, &st));
    return st;
}

static ema_win_stat_t wstat(ema_win_h w)
{
    ema_win_stat_t st;
    T_OK(ema_win_stat(w, &st));
    return st;
}

static int noprog;

/* Poll until the groups ahead are all local (without a progress thread,
 * running the engine); 1 if they became so. */
static int wait_ahead_local(ema_win_h w, ema_win_policy_stat_t *st)
{
    double t0 = t_now();
    do {
        if (noprog) {
            ema_progress();
        }
        *st = pstat(w);
        if (st->bytes_ahead_local == st->bytes_ahead) {
            return 1;
        }
        if (!noprog) {
            usleep(500);
        }
    } while (t_now() - t0 < LIMIT_S);
    return 0;
}

/* Rank 0's window: 4 groups in its own memory, 3 borrowed from rank 1
 * (which keeps 2 segments free, room for what the policy moves out), or,
 * with @spilled (nothing lent), in rank 0's spill tier. */
static ema_win_h setup_away(uint64_t **base_p, size_t *size_p, int spilled)
{
    ema_mem_stat_t ms;
    T_OK(ema_mem_stat(&ms));
    size_t cap  = ms.capacity;
    size_t size = (size_t)NGROUP * GSEGS * SEG;
    ema_win_params_t p = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = size};
    void *b;
    ema_win_h w;
    T_OK(ema_win_allocate(ema_t_rank == 0 ? cap : 0, &p, &b, &w));
    if (ema_t_rank == 0) {
        T_OK(ema_win_grow(w, size));
        fill(w, b, 0, size, 1);
        ema_win_stat_t ws = wstat(w);
        T_EXPECT(ws.bytes_local == cap &&
                     (spilled ? ws.bytes_spilled : ws.bytes_borrowed) == size - cap,
                 "setup: local %zu borrowed %zu spilled %zu of %zu (expected the rest %s)",
                 ws.bytes_local, ws.bytes_borrowed, ws.bytes_spilled, size,
                 spilled ? "spilled" : "borrowed");
    }
    T_OK(ema_barrier());
    *base_p = b;
    *size_p = size;
    return w;
}

static ema_win_h setup(uint64_t **base_p, size_t *size_p)
{
    return setup_away(base_p, size_p, 0);
}

static void set_policy(ema_win_h w, unsigned flags)
{
    ema_win_range_t r[NGROUP];
    for (size_t g = 0; g < NGROUP; g++) {
        r[g].offset = g * GSEGS * SEG;
        r[g].length = GSEGS * SEG;
    }
    ema_win_policy_params_t pp = {
        .field_mask = EMA_WIN_POLICY_PARAM_FIELD_RANGES | EMA_WIN_POLICY_PARAM_FIELD_DEPTH |
                      EMA_WIN_POLICY_PARAM_FIELD_FLAGS,
        .ranges = r, .count = NGROUP, .depth = DEPTH, .flags = flags};
    T_OK(ema_win_set_policy(w, &pp));
}

/* One walk over the groups: at each, the next DEPTH groups become local;
 * the current group's data is read under ema_win_acquire. */
static void walk(ema_win_h w, uint64_t *base, const char *what, uint64_t seed0)
{
    char msg[96];
    for (size_t g = 0; g < NGROUP; g++) {
        ema_win_policy_stat_t st;
        T_OK(ema_win_advance(w, g));
        int ok = wait_ahead_local(w, &st);
        T_EXPECT(ok, "%s, group %zu: %zu of %zu bytes ahead local after %.0f s (group %zu, "
                 "evicted %" PRIu64 ", skipped held %" PRIu64 ")", what, g, st.bytes_ahead_local,
                 st.bytes_ahead, LIMIT_S, st.group, st.bytes_evicted, st.skipped_held);
        size_t want = (NGROUP - 1 - g < DEPTH ? NGROUP - 1 - g : DEPTH) * GSEGS * SEG;
        T_EXPECT(st.group == g && st.bytes_ahead == want, "%s: group %zu ahead %zu, want %zu",
                 what, st.group, st.bytes_ahead, want);
        size_t off = g * GSEGS * SEG, len = GSEGS * SEG;
        T_OK(ema_win_acquire(w, off, len));
        snprintf(msg, sizeof(msg), "%s, group %zu read at its step", what, g);
        check(w, base, off, off + len, g == 0 ? seed0 : 1, msg);
        T_OK(ema_win_release(w, off, len));
    }
}

static void test_walk(void)
{
    uint64_t *base;
    size_t size;
    ema_test_begin("walk: ahead local, behind out, held stays, reclaim completes");
    ema_win_h w = setup(&base, &size);
    if (ema_t_rank == 0) {
        size_t gb = GSEGS * SEG;
        T_OK(ema_win_set_reclaim_cb(w, on_move, NULL));
        /* group 0 held for two walks: behind most of the time, never moved */
        never_lo = 0;
        never_hi = gb;
        T_OK(ema_win_acquire(w, 0, gb));
        set_policy(w, 0);
        walk(w, base, "first walk", 1);
        /* the owner stores into what it holds, the policy working meanwhile */
        fill(w, base, 0, gb, 2);
        walk(w, base, "second walk", 2);
        ema_win_policy_stat_t st = pstat(w);
        T_EXPECT(st.bytes_prefetched > 0 && st.bytes_evicted > 0 && st.skipped_held > 0,
                 "after two walks: prefetched %" PRIu64 " evicted %" PRIu64
                 " skipped held %" PRIu64, st.bytes_prefetched, st.bytes_evicted,
                 st.skipped_held);
        T_EXPECT(atomic_load(&never_named) == 0 && atomic_load(&heard) > 0,
                 "the held group was named %d times to the reclaim callback (of %d)",
                 atomic_load(&never_named), atomic_load(&heard));
        check(w, base, 0, gb, 2, "held group 0, stored into while the policy ran");
        fill(w, base, 0, gb, 1);
        T_OK(ema_win_release(w, 0, gb));
        ema_win_stat_t ws = wstat(w);
        ema_mem_stat_t ms;
        T_OK(ema_mem_stat(&ms));
        T_EXPECT(ws.bytes_local == ms.capacity && ws.bytes_borrowed == size - ms.capacity,
                 "after the walks: local %zu borrowed %zu spilled %zu", ws.bytes_local,
                 ws.bytes_borrowed, ws.bytes_spilled);
    }
    T_OK(ema_barrier());
    if (ema_t_rank == 1) {
        uint64_t *buf = malloc(size);
        T_OK(ema_get(w, 0, 0, buf, size));
        check_at(buf, 0, size, 1, "rank 1's get of rank 0's part after the walks");
        free(buf);
    }
    T_OK(ema_barrier());

    /* rank 1 takes back everything it lent while rank 0 keeps walking */
    if (ema_t_rank == 1) {
        ema_mem_stat_t ms;
        T_OK(ema_mem_stat(&ms));
        T_EXPECT(ms.bytes_lent > 0, "rank 1 lends nothing before its reclaim");
        double t0 = t_now();
        T_STATUS(ema_reclaim(ms.bytes_free + ms.bytes_lent, 20000), EMA_SUCCESS);
        printf("# rank 1 reclaimed %zu bytes in %.1f ms while rank 0 walked\n", ms.bytes_lent,
               (t_now() - t0) * 1e3);
        T_OK(ema_mem_stat(&ms));
        T_EXPECT(ms.bytes_lent == 0, "rank 1 still lends %zu bytes", ms.bytes_lent);
    } else {
        double t0 = t_now();
        ema_win_stat_t ws;
        size_t g = 0;
        do {
            T_OK(ema_win_advance(w, g));
            g = (g + 1) % NGROUP;
            usleep(2000);
            ws = wstat(w);
        } while (ws.bytes_borrowed > 0 && t_now() - t0 < LIMIT_S);
        T_EXPECT(ws.bytes_borrowed == 0, "still %zu bytes borrowed from the reclaiming rank",
                 ws.bytes_borrowed);
    }
    T_OK(ema_barrier());
    if (ema_t_rank == 0) {
        check_held(w, base, size, 1, "rank 0's part after rank 1's reclaim");
        walk(w, base, "walk over the spill tier", 1);
        check_held(w, base, size, 1, "rank 0's part after the last walk");
    }
    T_OK(ema_barrier());
    if (ema_t_rank == 1) {
        ema_mem_stat_t ms;
        T_OK(ema_mem_stat(&ms));
        T_OK(ema_reclaim_release(ms.bytes_withheld));
    }
    T_OK(ema_win_free(w));
}

static void test_yield(void)
{
    uint64_t *base;
    size_t size;
    ema_test_begin("yield: the policy defers to a lender's recall");
    ema_win_h w = setup(&base, &size);
    ema_mem_stat_t ms;
    if (ema_t_rank == 0) {
        set_policy(w, EMA_WIN_POLICY_FLAG_CYCLIC);
        ema_win_policy_stat_t st;
        T_EXPECT(wait_ahead_local(w, &st), "first groups not local");
        while (ema_progress() == EMA_SUCCESS) {
        }
    }
    T_OK(ema_barrier());
    if (ema_t_rank == 1) {
        T_OK(ema_mem_stat(&ms));
        T_STATUS(ema_reclaim(ms.bytes_free + ms.bytes_lent, 20000), EMA_SUCCESS);
        T_OK(ema_mem_stat(&ms));
        T_EXPECT(ms.bytes_lent == 0, "rank 1 still lends %zu bytes", ms.bytes_lent);
    } else {
        /* The RECALL waits in this rank's transport until it progresses:
         * the job queued by the advance runs first in the next
         * ema_progress, finds the recall queued, and defers. */
        usleep(300 * 1000);
        ema_win_policy_stat_t st0 = pstat(w), st;
        T_OK(ema_win_advance(w, NGROUP - 2)); /* ahead: the last group and group 0 */
        double t0 = t_now();
        ema_win_stat_t ws;
        do {
            ema_progress();
            ws = wstat(w);
        } while (ws.bytes_borrowed > 0 && t_now() - t0 < LIMIT_S);
        st = pstat(w);
        T_EXPECT(ws.bytes_borrowed == 0, "the recall did not complete: %zu bytes borrowed",
                 ws.bytes_borrowed);
        T_EXPECT(st.deferred > st0.deferred, "the policy never deferred (runs %" PRIu64
                 " -> %" PRIu64 ")", st0.runs, st.runs);
        /* the recall's end queued the policy again: no new advance needed */
        T_EXPECT(wait_ahead_local(w, &st), "after the recall: %zu of %zu bytes ahead local",
                 st.bytes_ahead_local, st.bytes_ahead);
        T_EXPECT(st.runs > st0.runs, "the policy did not run again after the recall");
        check_held(w, base, size, 1, "rank 0's part after the recall");
    }
    T_OK(ema_barrier());
    T_OK(ema_win_free(w));
    if (ema_t_rank == 1) {
        /* withheld memory backs none of rank 1's own windows (ema_reclaim(3)):
         * give it back for the windows of the tests after this one */
        T_OK(ema_mem_stat(&ms));
        T_OK(ema_reclaim_release(ms.bytes_withheld));
    }
}

/* EMA_WIN_POLICY_FLAG_READ_ONLY, with nothing lent (EMA_LEND_RESERVE = the
 * capacity): rank 0's part is 4 groups local and 3 in its spill tier.  The
 * first walk brings the spilled groups home and keeps their spill copies;
 * the second, from group 0 again, moves them out with no copy (remapped to
 * their copies: bytes_dropped), and the data reads back intact throughout.
 * The copies count in ema_mem_stat's bytes_spilled until the policy goes. */
static void test_readonly(void)
{
    ema_test_begin("readonly: spill copies kept, evictions with no copy");
    uint64_t *base;
    size_t size;
    ema_mem_stat_t ms;
    ema_win_h w = setup_away(&base, &size, 1);
    if (ema_t_rank == 0) {
        ema_win_stat_t ws;
        set_policy(w, EMA_WIN_POLICY_FLAG_READ_ONLY);
        walk(w, base, "first walk", 1);
        ema_win_policy_stat_t st1 = pstat(w);
        walk(w, base, "second walk", 1);
        ema_win_policy_stat_t st = pstat(w);
        T_EXPECT(st.bytes_prefetched > st1.bytes_prefetched && st.bytes_dropped > 0 &&
                     st.bytes_dropped <= st.bytes_evicted,
                 "after two walks: prefetched %" PRIu64 " evicted %" PRIu64 " dropped %" PRIu64,
                 st.bytes_prefetched, st.bytes_evicted, st.bytes_dropped);
        T_EXPECT(st.bytes_dropped > st1.bytes_dropped,
                 "the second walk moved nothing out with no copy (dropped %" PRIu64
                 " after the first walk, %" PRIu64 " after the second)", st1.bytes_dropped,
                 st.bytes_dropped);
        ws = wstat(w);
        T_OK(ema_mem_stat(&ms));
        T_EXPECT(ms.bytes_spilled > ws.bytes_spilled,
                 "with the policy: the spill tier holds %zu bytes, the window %zu: no copy kept",
                 ms.bytes_spilled, ws.bytes_spilled);
        check_held(w, base, size, 1, "rank 0's part after the walks");
        T_OK(ema_win_set_policy(w, NULL));
        ws = wstat(w);
        T_OK(ema_mem_stat(&ms));
        T_EXPECT(ms.bytes_spilled == ws.bytes_spilled,
                 "policy removed: the spill tier holds %zu bytes, the window %zu",
                 ms.bytes_spilled, ws.bytes_spilled);
        check_held(w, base, size, 1, "rank 0's part after the policy went");
    }
    T_OK(ema_barrier());
    T_OK(ema_win_free(w));
}

/* A walk of two groups, @h then @g, depth 1, not cyclic, with @flags: at
 * group g nothing is ahead, so bytes_ahead is group g's alone under
 * FLAG_WAIT (and none without it), and h is behind, to leave for room. */
static void set_pair(ema_win_h w, size_t h, size_t g, unsigned flags)
{
    ema_win_range_t r[2] = {{h * GSEGS * SEG, GSEGS * SEG}, {g * GSEGS * SEG, GSEGS * SEG}};
    ema_win_policy_params_t pp = {
        .field_mask = EMA_WIN_POLICY_PARAM_FIELD_RANGES | EMA_WIN_POLICY_PARAM_FIELD_DEPTH |
                      EMA_WIN_POLICY_PARAM_FIELD_FLAGS,
        .ranges = r, .count = 2, .depth = 1, .flags = flags};
    T_OK(ema_win_set_policy(w, &pp));
}

static void test_wait(int thread)
{
    ema_test_begin(thread ? "wait, with the progress thread: ema_win_advance returns with "
                            "its group local"
                          : "wait: ema_win_advance returns with its group local");
    uint64_t *base;
    size_t size;
    ema_win_h w = setup_away(&base, &size, 1);
    if (ema_t_rank == 0) {
        ema_win_policy_stat_t st, st0;
        /* groups 0-3 are local, 4-6 spilled; each step brings group g home
         * in place of group h, so the next pair's g is away again */
        static const size_t pairs[][2] = {{0, 4}, {1, 5}, {2, 6}, {3, 0}, {4, 1}, {5, 2}, {6, 3}};
        if (!thread) {
            /* the control: without the flag nothing runs the job here */
            set_pair(w, 0, 4, 0);
            T_OK(ema_win_advance(w, 1));
            st = pstat(w);
            T_EXPECT(st.bytes_prefetched == 0 && st.bytes_evicted == 0,
                     "no flag, no progress thread: the advance moved %" PRIu64 " bytes home "
                     "and %" PRIu64 " out", st.bytes_prefetched, st.bytes_evicted);
        }
        for (size_t k = 0; k < sizeof(pairs) / sizeof(pairs[0]); k++) {
            size_t h = pairs[k][0], g = pairs[k][1];
            set_pair(w, h, g, EMA_WIN_POLICY_FLAG_WAIT);
            st0 = pstat(w);
            T_OK(ema_win_advance(w, 1));
            st = pstat(w); /* no polling: the advance ran the job, or waited for it */
            T_EXPECT(st.group == 1 && st.bytes_ahead == GSEGS * SEG &&
                         st.bytes_ahead_local == st.bytes_ahead &&
                         st.bytes_prefetched - st0.bytes_prefetched == GSEGS * SEG &&
                         st.bytes_evicted - st0.bytes_evicted == GSEGS * SEG,
                     "group %zu (after %zu): the advance returned with %zu of its %zu bytes "
                     "local, %" PRIu64 " moved home, %" PRIu64 " out", g, h,
                     st.bytes_ahead_local, st.bytes_ahead,
                     st.bytes_prefetched - st0.bytes_prefetched,
                     st.bytes_evicted - st0.bytes_evicted);
            /* at once again: the group is home, nothing to wait for */
            T_OK(ema_win_advance(w, 1));
            size_t off = g * GSEGS * SEG, len = GSEGS * SEG;
            T_OK(ema_win_acquire(w, off, len));
            check(w, base, off, off + len, 1, "a group read after its advance");
            T_OK(ema_win_release(w, off, len));
        }
        T_OK(ema_win_set_policy(w, NULL));
        check_held(w, base, size, 1, "rank 0's part after the walks");
    }
    T_OK(ema_barrier());
    T_OK(ema_win_free(w));
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "walk";
    ema_test_init("test_policy");
    noprog = strcmp(mode, "yield") == 0 || strcmp(mode, "wait") == 0;
    if (ema_t_size != 2) {
        fprintf(stderr, "test_policy: run on 2 ranks\n");
        return 1;
    }
    {
        void *b;
        ema_win_h w;
        T_OK(ema_win_allocate(1, NULL, &b, &w));
        ema_win_stat_t ws = wstat(w);
        SEG = ws.max_size;
        T_OK(ema_win_free(w));
    }
    if (strcmp(mode, "walk") == 0) {
        test_walk();
    } else if (strcmp(mode, "wait") == 0) {
        test_wait(0);
    } else if (strcmp(mode, "waitthread") == 0) {
        test_wait(1);
    } else if (noprog) {
        test_yield();
    } else if (strcmp(mode, "readonly") == 0) {
        test_readonly();
    } else {
        fprintf(stderr, "test_policy: unknown mode %s\n", mode);
        return 1;
    }
    return ema_test_finish("test_policy");
}
