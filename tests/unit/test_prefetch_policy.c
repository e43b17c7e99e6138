/*
 * The prefetch policy (ema_win_set_policy, ema_win_advance,
 * ema_win_policy_stat) in a world of one: every argument error of their
 * man pages with proof that nothing changed (the policy in place, the
 * window's pattern), and the policy's work over a window half in the host
 * spill tier: the groups ahead come home, the groups behind go out to the
 * spill tier only to make room, and held segments never move.  Without a
 * progress thread (EMA_PROGRESS_THREAD=n) the job runs inside
 * ema_progress(), so each step is deterministic.
 */
#include <ema.h>

#include "check_main.h"
#include "win_check.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SEG     ((size_t)64 * 1024)
#define NSEG    8
#define WSIZE   (NSEG * SEG)

static uint64_t foreign_block[64];
#define FOREIGN_WIN ((ema_win_h)(void *)foreign_block)

static ema_check_heard_t heard; /* what the reclaim callback heard of */

static void note_cb(ema_win_h w, size_t o, size_t l, void *a)
{
    (void)w;
    (void)a;
    ema_check_heard_note(&heard, o, l);
}


/* A window of @size bytes (grown to it, so what does not fit spills),
 * filled with the pattern. */
static ema_win_h win_with_pattern(size_t size, size_t first, uint8_t **base_p)
{
    ema_win_params_t p = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = size};
    void *b;
    ema_win_h w;
    ck_assert_int_eq(ema_win_allocate(first, &p, &b, &w), EMA_SUCCESS);
    if (size > first) {
        ck_assert_int_eq(ema_win_grow(w, size), EMA_SUCCESS);
    }
    for (size_t i = 0; i < size; i++) {
        ((uint8_t *)b)[i] = ema_check_pat(i);
    }
    *base_p = b;
    return w;
}

/* A world of one with @capacity bytes of memory and a window of WSIZE
 * bytes with the pattern, @first of them allocated (the rest grown). */
static ema_win_h start(const char *capacity, size_t first, uint8_t **base_p)
{
    ema_check_env_small_spill(capacity);
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    return win_with_pattern(WSIZE, first, base_p);
}

/* The window still holds its pattern: free it, and finalize. */
static void finish(ema_win_h w, const uint8_t *base)
{
    ema_check_assert_pattern(base, WSIZE);
    ck_assert_int_eq(ema_win_free(w), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}

/* Run the engine until it has nothing left to do. */
static void drain(void)
{
    for (int i = 0; i < 1000 && ema_progress() == EMA_SUCCESS; i++) {
    }
}

static ema_win_policy_stat_t pstat(ema_win_h w)
{
    ema_win_policy_stat_t st;
    memset(&st, 0x5e, sizeof(st));
    ck_assert_int_eq(ema_win_policy_stat(w, &st), EMA_SUCCESS);
    return st;
}

/* NSEG groups of one segment each, in order. */
static ema_win_range_t groups[NSEG];
static ema_win_policy_params_t params(unsigned depth, unsigned flags)
{
    for (size_t i = 0; i < NSEG; i++) {
        groups[i].offset = i * SEG;
        groups[i].length = SEG;
    }
    ema_win_policy_params_t p = {
        .field_mask = EMA_WIN_POLICY_PARAM_FIELD_RANGES | EMA_WIN_POLICY_PARAM_FIELD_DEPTH |
                      EMA_WIN_POLICY_PARAM_FIELD_FLAGS,
        .ranges = groups, .count = NSEG, .depth = depth, .flags = flags};
    return p;
}

EMA_TEST("args", test_policy_calls_before_init_and_with_bad_handles_fail)
{
    ema_win_policy_params_t p = params(2, 0);
    ema_win_policy_stat_t st;
    memset(&st, 0x5e, sizeof(st));
    ck_assert_int_eq(ema_win_set_policy(NULL, &p), EMA_ERR_STATE);
    ck_assert_int_eq(ema_win_advance(FOREIGN_WIN, 0), EMA_ERR_STATE);
    ck_assert_int_eq(ema_win_policy_stat(NULL, &st), EMA_ERR_STATE);
    for (size_t i = 0; i < sizeof(st); i++) {
        ck_assert_uint_eq(((uint8_t *)&st)[i], 0x5e);
    }
    ema_check_env_small_spill("64M");
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_set_policy(NULL, &p), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_set_policy(FOREIGN_WIN, &p), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_advance(NULL, 0), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_advance(FOREIGN_WIN, 0), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_policy_stat(FOREIGN_WIN, &st), EMA_ERR_INVALID_HANDLE);
    uint8_t *base;
    ema_win_h w = win_with_pattern(WSIZE, WSIZE, &base);
    ck_assert_int_eq(ema_win_policy_stat(w, NULL), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_win_set_policy(w, &p), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_free(w), EMA_SUCCESS);
    /* freed, with a policy: the handle is dead for the policy calls too */
    ck_assert_int_eq(ema_win_set_policy(w, &p), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_advance(w, 0), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_policy_stat(w, &st), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_advance(w, 0), EMA_ERR_STATE);
}
END_TEST

/* @p is refused with @want, and the policy in place (depth 3, 8 groups,
 * at group 1) and the window stay as they were. */
static void assert_refused(ema_win_h w, const uint8_t *base, ema_win_policy_params_t p,
                           ema_status_t want)
{
    ck_assert_int_eq(ema_win_set_policy(w, &p), want);
    ema_win_policy_stat_t st = pstat(w);
    ck_assert_uint_eq(st.count, NSEG);
    ck_assert_uint_eq(st.depth, 3);
    ck_assert_uint_eq(st.group, 1);
    ema_check_assert_pattern(base, WSIZE);
}

EMA_TEST("args", test_set_policy_rejects_bad_params_and_keeps_the_policy)
{
    uint8_t *base;
    ema_win_h w = start("64M", WSIZE, &base);
    ema_win_policy_params_t good = params(3, EMA_WIN_POLICY_FLAG_CYCLIC);
    ck_assert_int_eq(ema_win_set_policy(w, &good), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_advance(w, 1), EMA_SUCCESS);
    drain();

    ema_win_policy_params_t p = good;
    p.field_mask |= 1ull << 40; /* unknown field */
    assert_refused(w, base, p, EMA_ERR_INVALID_PARAM);
    p = good;
    p.field_mask = EMA_WIN_POLICY_PARAM_FIELD_DEPTH; /* no ranges */
    assert_refused(w, base, p, EMA_ERR_INVALID_PARAM);
    p = good;
    p.ranges = NULL;
    assert_refused(w, base, p, EMA_ERR_INVALID_PARAM);
    p = good;
    p.depth = 0;
    assert_refused(w, base, p, EMA_ERR_INVALID_PARAM);
    p = good;
    p.depth = NSEG + 1;
    assert_refused(w, base, p, EMA_ERR_INVALID_PARAM);
    p = good;
    p.flags = 1u << 7; /* unknown flag */
    assert_refused(w, base, p, EMA_ERR_INVALID_PARAM);

    ema_win_range_t r[3] = {{4 * SEG, SEG}, {0, SEG}, {0, 0}};
    p = good;
    p.ranges = r;
    p.count  = 3;
    p.depth  = 1;
    r[2] = (ema_win_range_t){SEG, 0}; /* empty group */
    assert_refused(w, base, p, EMA_ERR_INVALID_PARAM);
    r[2] = (ema_win_range_t){4 * SEG + 10, 1}; /* inside the first, walked out of order */
    assert_refused(w, base, p, EMA_ERR_INVALID_PARAM);
    r[2] = (ema_win_range_t){SEG - 1, 2}; /* overlaps the second by one byte */
    assert_refused(w, base, p, EMA_ERR_INVALID_PARAM);
    r[2] = (ema_win_range_t){WSIZE - 10, 11}; /* one byte past the part */
    assert_refused(w, base, p, EMA_ERR_RANGE);
    r[2] = (ema_win_range_t){SIZE_MAX, 2}; /* offset+length wraps */
    assert_refused(w, base, p, EMA_ERR_RANGE);
    r[2] = (ema_win_range_t){2 * SEG, SIZE_MAX}; /* length wraps */
    assert_refused(w, base, p, EMA_ERR_RANGE);

    /* touching groups, any order: fine */
    r[2] = (ema_win_range_t){SEG, SEG};
    ck_assert_int_eq(ema_win_set_policy(w, &p), EMA_SUCCESS);
    ema_win_policy_stat_t st = pstat(w);
    ck_assert_uint_eq(st.count, 3);
    ck_assert_uint_eq(st.group, EMA_WIN_POLICY_NO_GROUP); /* a new walk */
    drain();
    finish(w, base);
}
END_TEST

EMA_TEST("args", test_advance_checks_group_and_policy_and_changes_nothing_on_error)
{
    uint8_t *base;
    ema_win_h w = start("64M", WSIZE, &base);
    ck_assert_int_eq(ema_win_advance(w, 0), EMA_ERR_STATE); /* no policy yet */
    ema_win_policy_stat_t st = pstat(w);
    ck_assert_uint_eq(st.count, 0);
    ck_assert_uint_eq(st.group, EMA_WIN_POLICY_NO_GROUP);
    ck_assert_uint_eq(st.runs, 0);
    ck_assert(st.field_mask & EMA_WIN_POLICY_STAT_FIELD_RUNS);
    for (size_t i = 0; i < sizeof(st.reserved); i++) {
        ck_assert_uint_eq(((uint8_t *)st.reserved)[i], 0x5e); /* never written */
    }

    ema_win_policy_params_t p = params(2, 0);
    ck_assert_int_eq(ema_win_set_policy(w, &p), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_advance(w, 5), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_advance(w, NSEG), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_win_advance(w, SIZE_MAX), EMA_ERR_INVALID_PARAM);
    st = pstat(w);
    ck_assert_uint_eq(st.group, 5);
    ck_assert_uint_eq(st.depth, 2);
    ck_assert_uint_eq(st.bytes_ahead, 2 * SEG); /* groups 6 and 7 */
    drain();
    st = pstat(w);
    ck_assert_uint_ge(st.runs, 1);
    ck_assert_uint_eq(st.bytes_ahead_local, 2 * SEG); /* all local here */
    ck_assert_uint_eq(st.bytes_prefetched, 0);
    ck_assert_uint_eq(st.bytes_evicted, 0);

    /* the last group without CYCLIC: nothing ahead */
    ck_assert_int_eq(ema_win_advance(w, NSEG - 1), EMA_SUCCESS);
    ck_assert_uint_eq(pstat(w).bytes_ahead, 0);

    /* removed: NULL, or count 0 */
    ck_assert_int_eq(ema_win_set_policy(w, NULL), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_advance(w, 0), EMA_ERR_STATE);
    ck_assert_uint_eq(pstat(w).count, 0);
    ck_assert_int_eq(ema_win_set_policy(w, &p), EMA_SUCCESS);
    p.count = 0;
    ck_assert_int_eq(ema_win_set_policy(w, &p), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_advance(w, 0), EMA_ERR_STATE);
    drain();
    finish(w, base);
}
END_TEST

EMA_TEST("work", test_policy_brings_groups_ahead_home_and_spills_groups_behind)
{
    uint8_t *base;
    ema_win_h w = start("256K", 4 * SEG, &base); /* 4 segments: half the window */
    ema_win_stat_t ws;
    ck_assert_int_eq(ema_win_stat(w, &ws), EMA_SUCCESS);
    ck_assert_uint_eq(ws.bytes_local, 4 * SEG);
    ck_assert_uint_eq(ws.bytes_spilled, 4 * SEG);
    ck_assert_int_eq(ema_win_set_reclaim_cb(w, note_cb, NULL), EMA_SUCCESS);

    ema_win_policy_params_t p = params(2, 0);
    ck_assert_int_eq(ema_win_set_policy(w, &p), EMA_SUCCESS);
    drain();
    ema_win_policy_stat_t st = pstat(w);
    ck_assert_uint_eq(st.bytes_ahead_local, 2 * SEG); /* groups 0, 1: local already */
    ck_assert_uint_eq(st.bytes_evicted, 0);

    /* at group 3: 4 and 5 must come home, and only 2 and 1 may leave */
    heard.n = 0;
    ck_assert_int_eq(ema_win_advance(w, 3), EMA_SUCCESS);
    drain();
    st = pstat(w);
    ck_assert_uint_eq(st.bytes_ahead, 2 * SEG);
    ck_assert_uint_eq(st.bytes_ahead_local, 2 * SEG);
    ck_assert_uint_eq(st.bytes_prefetched, 2 * SEG);
    ck_assert_uint_eq(st.bytes_evicted, 2 * SEG);
    ck_assert(!ema_check_heard_overlaps(&heard, 0, SEG));       /* group 0: behind, not needed */
    ck_assert(!ema_check_heard_overlaps(&heard, 3 * SEG, SEG)); /* the current group */
    ck_assert(ema_check_heard_overlaps(&heard, SEG, SEG) &&
              ema_check_heard_overlaps(&heard, 2 * SEG, SEG));
    ck_assert_int_eq(ema_win_stat(w, &ws), EMA_SUCCESS);
    ck_assert_uint_eq(ws.bytes_local, 4 * SEG);
    ck_assert_uint_eq(ws.bytes_spilled, 4 * SEG);
    ema_check_assert_pattern(base, WSIZE);

    /* at group 5 with groups 3 and 4 held: 6 and 7 ahead, but only 0 may
     * leave (3, 4 held; 5 current), so only 6 comes home */
    ck_assert_int_eq(ema_win_acquire(w, 3 * SEG, 2 * SEG), EMA_SUCCESS);
    heard.n = 0;
    ck_assert_int_eq(ema_win_advance(w, 5), EMA_SUCCESS);
    drain();
    st = pstat(w);
    ck_assert_uint_eq(st.bytes_ahead_local, SEG);
    ck_assert_uint_ge(st.skipped_held, 2);
    ck_assert_uint_eq(st.bytes_evicted, 3 * SEG);
    ck_assert(!ema_check_heard_overlaps(&heard, 3 * SEG, 2 * SEG)); /* held: never about to move */
    ck_assert(ema_check_heard_overlaps(&heard, 0, SEG));
    /* the owner writes into what it holds meanwhile: kept */
    for (size_t i = 3 * SEG; i < 5 * SEG; i++) {
        base[i] = (uint8_t)~ema_check_pat(i);
    }
    for (size_t i = 3 * SEG; i < 5 * SEG; i++) {
        ck_assert_uint_eq(base[i], (uint8_t)~ema_check_pat(i));
        base[i] = ema_check_pat(i);
    }
    ck_assert_int_eq(ema_win_release(w, 3 * SEG, 2 * SEG), EMA_SUCCESS);

    /* released: the same position again finishes the job */
    ck_assert_int_eq(ema_win_advance(w, 5), EMA_SUCCESS);
    drain();
    st = pstat(w);
    ck_assert_uint_eq(st.bytes_ahead_local, 2 * SEG);
    ema_check_assert_pattern(base, WSIZE);

    /* NO_EVICT: nothing leaves, so nothing of group 1, 2 comes home */
    ema_win_policy_params_t q = params(2, EMA_WIN_POLICY_FLAG_NO_EVICT);
    ck_assert_int_eq(ema_win_set_policy(w, &q), EMA_SUCCESS);
    uint64_t evicted = pstat(w).bytes_evicted;
    ck_assert_int_eq(ema_win_advance(w, 0), EMA_SUCCESS);
    drain();
    st = pstat(w);
    ck_assert_uint_eq(st.bytes_evicted, evicted);
    ck_assert_uint_lt(st.bytes_ahead_local, 2 * SEG);
    finish(w, base);
}
END_TEST

EMA_TEST("work", test_cyclic_walk_keeps_the_groups_after_the_last_local)
{
    uint8_t *base;
    ema_win_h w = start("256K", 4 * SEG, &base);
    ema_win_policy_params_t p = params(3, EMA_WIN_POLICY_FLAG_CYCLIC);
    ck_assert_int_eq(ema_win_set_policy(w, &p), EMA_SUCCESS);
    /* a few laps: at every step the next three groups (wrapping) are local */
    for (int lap = 0; lap < 2; lap++) {
        for (size_t g = 0; g < NSEG; g++) {
            ck_assert_int_eq(ema_win_advance(w, g), EMA_SUCCESS);
            drain();
            ema_win_policy_stat_t st = pstat(w);
            ck_assert_uint_eq(st.bytes_ahead, 3 * SEG);
            if (st.bytes_ahead_local != 3 * SEG) {
                ck_abort_msg("lap %d group %zu: %zu of %zu bytes ahead local", lap, g,
                             st.bytes_ahead_local, st.bytes_ahead);
            }
        }
    }
    finish(w, base);
}
END_TEST

int main(void)
{
    ema_check_world_of_one();
    return ema_check_main("prefetch_policy", CK_ENV);
}
