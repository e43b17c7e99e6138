/*
 * Assertions on windows through the public API, shared by the unit tests
 * of tests/unit.
 */
#ifndef EMA_TESTS_WIN_CHECK_H_
#define EMA_TESTS_WIN_CHECK_H_

#include <ema.h>

#include <check.h>

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
