/*
 * Assertions on windows through the public API, shared by the unit tests
 * of tests/unit.
 */
#ifndef EMA_TESTS_WIN_CHECK_H_
#define EMA_TESTS_WIN_CHECK_H_

#include <ema.h>

#include <check.h>
#include <stdlib.h>

/* The environment of a small world of one whose windows spill: @capacity
 * bytes of memory in 64 KiB segments, 8 MiB of host spill, nothing kept
 * back from lending, no progress thread (the test drives progress), and
 * only errors logged.  Set before ema_init. */
static inline void ema_check_env_small_spill(const char *capacity)
{
    setenv("EMA_DEVICE_MEMORY", capacity, 1);
    setenv("EMA_SEGMENT_SIZE", "64K", 1);
    setenv("EMA_SPILL", "host", 1);
    setenv("EMA_SPILL_SIZE", "8M", 1);
    setenv("EMA_LEND_RESERVE", "0", 1);
    setenv("EMA_PROGRESS_THREAD", "n", 1);
    setenv("EMA_LOG_LEVEL", "error", 1);
}

/* All of this rank's @capacity bytes are free: one window of all of them
 * fits (and is freed again). */
static inline void ema_check_capacity_free(size_t capacity)
{
    void *b;
    ema_win_h w;
    ck_assert_int_eq(ema_win_allocate(capacity, NULL, &b, &w), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_free(w), EMA_SUCCESS);
}

#endif
