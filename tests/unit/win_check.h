/*
 * Assertions on windows through the public API, shared by the unit tests
 * of tests/unit.
 */
#ifndef EMA_TESTS_WIN_CHECK_H_
#define EMA_TESTS_WIN_CHECK_H_

#include <ema.h>

#include <check.h>
#include <stdint.h>
#include <stdlib.h>

/* Ranges a reclaim callback heard of (the first 256). */
typedef struct {
    size_t off[256], len[256];
    int    n;
} ema_check_heard_t;

static inline void ema_check_heard_note(ema_check_heard_t *h, size_t off, size_t len)
{
    if (h->n < 256) {
        h->off[h->n] = off;
        h->len[h->n] = len;
        h->n++;
    }
}

/* Whether a range heard of overlaps [off, off+len). */
static inline int ema_check_heard_overlaps(const ema_check_heard_t *h, size_t off, size_t len)
{
    for (int i = 0; i < h->n; i++) {
        if (h->off[i] < off + len && off < h->off[i] + h->len[i]) {
            return 1;
        }
    }
    return 0;
}

/* The byte at @i of the pattern the tests write into a window. */
static inline uint8_t ema_check_pat(size_t i)
{
    return (uint8_t)(i * 29u + 3u);
}

/* [base, base+len) still holds the pattern. */
static inline void ema_check_assert_pattern(const uint8_t *base, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (base[i] != ema_check_pat(i)) {
            ck_abort_msg("window byte %zu changed: %#x, pattern %#x", i, base[i],
                         ema_check_pat(i));
        }
    }
}

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
