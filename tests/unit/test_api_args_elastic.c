/*
 * Argument and state validation of the elastic calls of include/ema.h
 * (grow, shrink, reclaim, reclaim_release, set_reclaim_cb, acquire/release,
 * win_stat, mem_stat), in a world of one, against the ERRORS sections of
 * their man pages: each error comes with proof that nothing changed (stats
 * equal before and after, window pattern intact, outputs not written).
 */
#include <ema.h>

#include "check_main.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SEG      ((size_t)64 * 1024)
#define WSIZE    (3 * SEG + 100)
#define MAXSIZE  (8 * SEG)

static uint64_t foreign_block[64];
#define FOREIGN_WIN ((ema_win_h)(void *)foreign_block)

static void cb(ema_win_h w, size_t o, size_t l, void *a) { (void)w; (void)o; (void)l; (void)a; }

static void env_small(void)
{
    setenv("EMA_DEVICE_MEMORY", "64M", 1);
    setenv("EMA_SEGMENT_SIZE", "64K", 1);
    setenv("EMA_LOG_LEVEL", "error", 1);
}

static uint8_t pat(size_t i) { return (uint8_t)(i * 13u + 5u); }

static ema_win_h win_with_pattern(uint8_t **base_p)
{
    ema_win_params_t p = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = MAXSIZE};
    void *b;
    ema_win_h w;
    ck_assert_int_eq(ema_win_allocate(WSIZE, &p, &b, &w), EMA_SUCCESS);
    for (size_t i = 0; i < WSIZE; i++) {
        ((uint8_t *)b)[i] = pat(i);
    }
    *base_p = b;
    return w;
}

/* ema_init, a window of the pattern, and the memory's statistics then. */
static ema_win_h init_with_pattern(uint8_t **base_p, ema_mem_stat_t *before)
{
    env_small();
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    ema_win_h w = win_with_pattern(base_p);
    ck_assert_int_eq(ema_mem_stat(before), EMA_SUCCESS);
    return w;
}

static void assert_unchanged(ema_win_h w, const uint8_t *base, const ema_mem_stat_t *before)
{
    size_t sz = 0;
    ema_mem_stat_t now = {0};
    ck_assert_int_eq(ema_win_size(w, 0, &sz), EMA_SUCCESS);
    ck_assert_uint_eq(sz, WSIZE);
    for (size_t i = 0; i < WSIZE; i++) {
        if (base[i] != pat(i)) {
            ck_abort_msg("window byte %zu changed", i);
        }
    }
    ck_assert_int_eq(ema_mem_stat(&now), EMA_SUCCESS);
    ck_assert_uint_eq(now.bytes_free, before->bytes_free);
    ck_assert_uint_eq(now.bytes_used, before->bytes_used);
    ck_assert_uint_eq(now.bytes_lent, before->bytes_lent);
    ck_assert_uint_eq(now.bytes_withheld, before->bytes_withheld);
    ck_assert_uint_eq(now.bytes_borrowed, before->bytes_borrowed);
}

static void assert_elastic_calls_return_state(ema_win_h w)
{
    ema_win_stat_t ws = {0};
    ema_mem_stat_t ms = {0};
    memset(&ws, 0x5e, sizeof(ws));
    memset(&ms, 0x5e, sizeof(ms));
    ck_assert_int_eq(ema_win_grow(w, 2 * SEG), EMA_ERR_STATE);
    ck_assert_int_eq(ema_win_shrink(w, 0), EMA_ERR_STATE);
    ck_assert_int_eq(ema_reclaim(SEG, 0), EMA_ERR_STATE);
    ck_assert_int_eq(ema_reclaim_release(SEG), EMA_ERR_STATE);
    ck_assert_int_eq(ema_win_set_reclaim_cb(w, cb, NULL), EMA_ERR_STATE);
    ck_assert_int_eq(ema_win_acquire(w, 0, 8), EMA_ERR_STATE);
    ck_assert_int_eq(ema_win_release(w, 0, 8), EMA_ERR_STATE);
    ck_assert_int_eq(ema_win_prefetch(w, 0, 8), EMA_ERR_STATE);
    ck_assert_int_eq(ema_win_stat(w, &ws), EMA_ERR_STATE);
    ck_assert_int_eq(ema_mem_stat(&ms), EMA_ERR_STATE);
    for (size_t i = 0; i < sizeof(ws); i++) {
        ck_assert_uint_eq(((uint8_t *)&ws)[i], 0x5e);
    }
    for (size_t i = 0; i < sizeof(ms); i++) {
        ck_assert_uint_eq(((uint8_t *)&ms)[i], 0x5e);
    }
}

EMA_TEST("elastic", test_elastic_calls_before_init_and_after_finalize_return_state)
{
    uint8_t *base;
    env_small();
    assert_elastic_calls_return_state(NULL);
    assert_elastic_calls_return_state(FOREIGN_WIN);
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    ema_win_h w = win_with_pattern(&base);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
    assert_elastic_calls_return_state(w);
}
END_TEST

EMA_TEST("elastic", test_elastic_calls_reject_null_foreign_or_freed_window)
{
    uint8_t *base, *b2;
    ema_mem_stat_t before = {0};
    ema_win_stat_t ws = {0};
    env_small();
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    ema_win_h w = win_with_pattern(&base);
    ema_win_h dead = win_with_pattern(&b2);
    ck_assert_int_eq(ema_win_free(dead), EMA_SUCCESS);
    ck_assert_int_eq(ema_mem_stat(&before), EMA_SUCCESS);
    ema_win_h bad[] = {NULL, FOREIGN_WIN, dead};
    for (int i = 0; i < 3; i++) {
        memset(&ws, 0x5e, sizeof(ws));
        ck_assert_int_eq(ema_win_grow(bad[i], 4 * SEG), EMA_ERR_INVALID_HANDLE);
        ck_assert_int_eq(ema_win_shrink(bad[i], 0), EMA_ERR_INVALID_HANDLE);
        ck_assert_int_eq(ema_win_set_reclaim_cb(bad[i], cb, NULL), EMA_ERR_INVALID_HANDLE);
        ck_assert_int_eq(ema_win_acquire(bad[i], 0, 8), EMA_ERR_INVALID_HANDLE);
        ck_assert_int_eq(ema_win_release(bad[i], 0, 8), EMA_ERR_INVALID_HANDLE);
        ck_assert_int_eq(ema_win_prefetch(bad[i], 0, 8), EMA_ERR_INVALID_HANDLE);
        ck_assert_int_eq(ema_win_stat(bad[i], &ws), EMA_ERR_INVALID_HANDLE);
        ck_assert_uint_eq(((uint8_t *)&ws)[0], 0x5e);
    }
    assert_unchanged(w, base, &before);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("elastic", test_grow_past_max_size_or_below_size_and_shrink_above_size_rejected)
{
    uint8_t *base;
    ema_mem_stat_t before = {0};
    ema_win_h w = init_with_pattern(&base, &before);
    ck_assert_int_eq(ema_win_grow(w, MAXSIZE + 1), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_win_grow(w, SIZE_MAX), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_win_grow(w, WSIZE - 1), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_win_shrink(w, WSIZE + 1), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_win_shrink(w, SIZE_MAX), EMA_ERR_INVALID_PARAM);
    assert_unchanged(w, base, &before);
    /* the valid forms work */
    size_t sz = 0;
    ck_assert_int_eq(ema_win_grow(w, MAXSIZE), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_size(w, 0, &sz), EMA_SUCCESS);
    ck_assert_uint_eq(sz, MAXSIZE);
    for (size_t i = 0; i < WSIZE; i++) {
        ck_assert_msg(base[i] == pat(i), "grow lost byte %zu", i);
    }
    ck_assert_int_eq(ema_win_shrink(w, 10), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_size(w, 0, &sz), EMA_SUCCESS);
    ck_assert_uint_eq(sz, 10);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("elastic", test_reclaim_zero_or_over_capacity_and_release_unwithheld_rejected)
{
    uint8_t *base;
    ema_mem_stat_t before = {0};
    ema_win_h w = init_with_pattern(&base, &before);
    ck_assert_int_eq(ema_reclaim(0, EMA_TIMEOUT_INFINITE), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_reclaim(before.capacity + 1, 1000), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_reclaim(SIZE_MAX, 1000), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_reclaim_release(0), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_reclaim_release(SEG), EMA_ERR_INVALID_PARAM); /* nothing withheld */
    assert_unchanged(w, base, &before);
    /* more than free + lent: the rest backs this rank's window */
    ck_assert_int_eq(ema_reclaim(before.capacity, 1000), EMA_ERR_NO_MEMORY);
    assert_unchanged(w, base, &before);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

/* Withheld memory backs none of this rank's new windows (ema_reclaim(3)):
 * an allocation that needs it fails with EMA_ERR_NO_MEMORY and changes
 * nothing; one that fits beside it succeeds; released, it is usable again.
 * ema_win_allocate took its segments from the arena directly and used
 * withheld memory (found by a new-user program, session 20). */
EMA_TEST("elastic", test_allocate_does_not_use_withheld_memory)
{
    uint8_t *base;
    ema_mem_stat_t before = {0}, m = {0};
    ema_win_h w = init_with_pattern(&base, &before), w2 = NULL;
    void *b2 = (void *)1;

    ck_assert_int_eq(ema_reclaim(before.bytes_free, 1000), EMA_SUCCESS);
    ck_assert_int_eq(ema_mem_stat(&m), EMA_SUCCESS);
    ck_assert_uint_eq(m.bytes_withheld, before.bytes_free);
    ck_assert_int_eq(ema_win_allocate(SEG, NULL, &b2, &w2), EMA_ERR_NO_MEMORY);
    ck_assert_ptr_eq(w2, NULL);
    ck_assert_int_eq(ema_mem_stat(&m), EMA_SUCCESS);
    ck_assert_uint_eq(m.bytes_used, before.bytes_used);
    ck_assert_uint_eq(m.bytes_free, before.bytes_free);
    /* withhold all but 2 segments: 2 fit, 3 do not */
    ck_assert_int_eq(ema_reclaim_release(2 * SEG), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_allocate(3 * SEG, NULL, &b2, &w2), EMA_ERR_NO_MEMORY);
    ck_assert_int_eq(ema_win_allocate(2 * SEG, NULL, &b2, &w2), EMA_SUCCESS);
    ck_assert_int_eq(ema_mem_stat(&m), EMA_SUCCESS);
    ck_assert_uint_eq(m.bytes_free, m.bytes_withheld); /* withheld: still free, unused */
    ck_assert_int_eq(ema_win_free(w2), EMA_SUCCESS);
    ck_assert_int_eq(ema_reclaim_release(before.bytes_free - 2 * SEG), EMA_SUCCESS);
    assert_unchanged(w, base, &before);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

static size_t named_bytes;
static void count_named(ema_win_h w, size_t o, size_t l, void *a)
{
    (void)w; (void)o; (void)a;
    named_bytes += l;
}

/* A shrink names to the reclaim callback only what will move home
 * (ema_win_set_reclaim_cb(3)), and it does so on the calling thread, before
 * it returns: with the own memory all withheld nothing can come home, so
 * nothing is named; with 2 segments released, 2 are named and come home.
 * The cap on what is named counted withheld segments as free until
 * session 20 (a prefetch and the policy share it). */
EMA_TEST("elastic", test_shrink_names_only_what_withheld_memory_lets_move)
{
    uint8_t *base;
    ema_mem_stat_t before = {0}, m = {0};
    ema_win_h w = init_with_pattern(&base, &before);
    ema_win_stat_t ws = {0};

    ck_assert_int_eq(ema_reclaim(before.bytes_free, 1000), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_grow(w, MAXSIZE), EMA_SUCCESS); /* spilled: nothing else */
    ck_assert_int_eq(ema_win_stat(w, &ws), EMA_SUCCESS);
    ck_assert_uint_eq(ws.bytes_spilled, MAXSIZE - 4 * SEG);
    ck_assert_int_eq(ema_win_set_reclaim_cb(w, count_named, NULL), EMA_SUCCESS);
    named_bytes = 0;
    ck_assert_int_eq(ema_win_shrink(w, 7 * SEG), EMA_SUCCESS);
    ck_assert_uint_eq(named_bytes, 0);
    ck_assert_int_eq(ema_win_stat(w, &ws), EMA_SUCCESS);
    ck_assert_uint_eq(ws.bytes_spilled, 3 * SEG);
    ck_assert_int_eq(ema_reclaim_release(2 * SEG), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_shrink(w, 6 * SEG), EMA_SUCCESS);
    ck_assert_uint_eq(named_bytes, 2 * SEG);
    ck_assert_int_eq(ema_win_stat(w, &ws), EMA_SUCCESS);
    ck_assert_uint_eq(ws.bytes_spilled, 0);
    ck_assert_uint_eq(ws.bytes_local, 6 * SEG);
    for (size_t i = 0; i < WSIZE; i++) {
        ck_assert_msg(base[i] == pat(i), "byte %zu changed", i);
    }
    ck_assert_int_eq(ema_mem_stat(&m), EMA_SUCCESS);
    ck_assert_int_eq(ema_reclaim_release(m.bytes_withheld), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("elastic", test_acquire_release_outside_part_zero_length_or_unacquired_rejected)
{
    uint8_t *base;
    ema_mem_stat_t before = {0};
    ema_win_h w = init_with_pattern(&base, &before);
    ck_assert_int_eq(ema_win_acquire(w, WSIZE, 1), EMA_ERR_RANGE);
    ck_assert_int_eq(ema_win_acquire(w, 0, WSIZE + 1), EMA_ERR_RANGE);
    ck_assert_int_eq(ema_win_acquire(w, SIZE_MAX, 1), EMA_ERR_RANGE);
    ck_assert_int_eq(ema_win_acquire(w, 1, SIZE_MAX), EMA_ERR_RANGE);
    ck_assert_int_eq(ema_win_release(w, WSIZE, 1), EMA_ERR_RANGE);
    ck_assert_int_eq(ema_win_prefetch(w, WSIZE, 1), EMA_ERR_RANGE);
    ck_assert_int_eq(ema_win_prefetch(w, 0, WSIZE + 1), EMA_ERR_RANGE);
    ck_assert_int_eq(ema_win_prefetch(w, SIZE_MAX, 1), EMA_ERR_RANGE);
    ck_assert_int_eq(ema_win_prefetch(w, 1, SIZE_MAX), EMA_ERR_RANGE);
    ck_assert_int_eq(ema_win_prefetch(w, 0, 0), EMA_SUCCESS); /* a hint of nothing */
    ck_assert_int_eq(ema_win_prefetch(w, 0, WSIZE), EMA_SUCCESS); /* all local: nothing moves */
    ck_assert_int_eq(ema_win_acquire(w, 0, 0), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_win_release(w, 0, 0), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_win_release(w, 0, 8), EMA_ERR_INVALID_PARAM); /* never acquired */
    /* acquire one segment, release a range that also covers an unacquired one:
     * rejected, and nothing is released (the first release still works) */
    ck_assert_int_eq(ema_win_acquire(w, 0, 8), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_release(w, 0, SEG + 8), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_win_release(w, 0, 8), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_release(w, 0, 8), EMA_ERR_INVALID_PARAM);
    /* nesting is counted */
    ck_assert_int_eq(ema_win_acquire(w, SEG, 2 * SEG), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_acquire(w, SEG, 2 * SEG), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_release(w, SEG, 2 * SEG), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_release(w, SEG, 2 * SEG), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_release(w, SEG, 2 * SEG), EMA_ERR_INVALID_PARAM);
    assert_unchanged(w, base, &before);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

/* A shrink that would cut into a segment held with ema_win_acquire fails
 * with EMA_ERR_STATE and changes nothing.  Dropped, the holder's memory
 * would be unmapped under it, and its release of the range (then outside
 * the part) would fail with EMA_ERR_RANGE, leaving the segment counted as
 * held for good: a grow maps that index again still "held", so it never
 * migrates, and a lender's recall of it waits out the reclaim's timeout.
 * Holds are counted per segment: a held segment refuses a shrink that
 * cuts into it even where the held range itself ends before the new size. */
EMA_TEST("elastic", test_shrink_into_a_held_segment_rejected)
{
    uint8_t *base;
    ema_mem_stat_t before = {0};
    ema_win_h w = init_with_pattern(&base, &before);
    size_t sz = 0;

    ck_assert_int_eq(ema_win_acquire(w, 2 * SEG + 8, 16), EMA_SUCCESS); /* segment 2 */
    ck_assert_int_eq(ema_win_shrink(w, SEG), EMA_ERR_STATE);
    ck_assert_int_eq(ema_win_shrink(w, 0), EMA_ERR_STATE);
    ck_assert_int_eq(ema_win_shrink(w, 2 * SEG), EMA_ERR_STATE);
    ck_assert_int_eq(ema_win_shrink(w, 2 * SEG + 4), EMA_ERR_STATE);   /* into the range */
    ck_assert_int_eq(ema_win_shrink(w, 2 * SEG + 100), EMA_ERR_STATE); /* past it, same segment */
    assert_unchanged(w, base, &before);
    ck_assert_int_eq(ema_win_release(w, 2 * SEG + 8, 16), EMA_SUCCESS);

    /* the last segment, partly in the part: a shrink inside it */
    ck_assert_int_eq(ema_win_acquire(w, 3 * SEG, 8), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_shrink(w, 3 * SEG + 50), EMA_ERR_STATE);
    assert_unchanged(w, base, &before);
    ck_assert_int_eq(ema_win_shrink(w, WSIZE), EMA_SUCCESS); /* to its size: cuts nothing */
    ck_assert_int_eq(ema_win_release(w, 3 * SEG, 8), EMA_SUCCESS);
    assert_unchanged(w, base, &before);

    /* held segments below the new end are no obstacle; the release works */
    ck_assert_int_eq(ema_win_acquire(w, 0, 2 * SEG), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_shrink(w, 2 * SEG), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_size(w, 0, &sz), EMA_SUCCESS);
    ck_assert_uint_eq(sz, 2 * SEG);
    for (size_t i = 0; i < 2 * SEG; i++) {
        ck_assert_msg(base[i] == pat(i), "shrink lost byte %zu", i);
    }
    ck_assert_int_eq(ema_win_release(w, 0, 2 * SEG), EMA_SUCCESS);
    /* grown again, the segments past 2 * SEG are not held */
    ck_assert_int_eq(ema_win_grow(w, WSIZE), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_release(w, 2 * SEG, 8), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_win_release(w, 3 * SEG, 8), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_win_shrink(w, 0), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("elastic", test_stat_calls_reject_null_output_and_report_the_window)
{
    uint8_t *base;
    ema_win_stat_t ws = {0};
    ema_mem_stat_t ms = {0};
    env_small();
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    ema_win_h w = win_with_pattern(&base);
    ck_assert_int_eq(ema_win_stat(w, NULL), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_mem_stat(NULL), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_win_set_reclaim_cb(w, cb, NULL), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_set_reclaim_cb(w, NULL, NULL), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_stat(w, &ws), EMA_SUCCESS);
    ck_assert_uint_eq(ws.size, WSIZE);
    ck_assert_uint_ge(ws.max_size, MAXSIZE);
    ck_assert_uint_eq(ws.bytes_borrowed, 0);
    ck_assert_uint_ge(ws.bytes_local, WSIZE);
    ck_assert_int_eq(ema_mem_stat(&ms), EMA_SUCCESS);
    ck_assert_uint_eq(ms.capacity, (size_t)64 << 20);
    ck_assert_uint_ge(ms.bytes_used, WSIZE);
    ck_assert_uint_eq(ms.bytes_lent, 0);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

int main(void)
{
    ema_check_world_of_one();
    return ema_check_main("api_args_elastic", CK_ENV);
}
