/*
 * Moves home (ema_win_prefetch, ema_win_shrink: ema_win_bring_home in
 * src/win/elastic.c) in a world of one: what moves is what the owner's
 * reclaim callback heard of, and no more (ema_win_set_reclaim_cb(3)).  The
 * callback runs without the window's lock, so the window may change while
 * it runs: here the callback itself releases a held segment, which the move
 * must then leave where it is (it was never named), as a shrink or a
 * prefetch leaves any held segment.  Without a progress thread
 * (EMA_PROGRESS_THREAD=n) a prefetch runs inside ema_progress(), so each
 * step is deterministic.
 */
#include <ema.h>

#include "check_main.h"
#include "win_check.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SEG   ((size_t)64 * 1024)
#define NSEG  8
#define WSIZE (NSEG * SEG)

static ema_check_heard_t heard;    /* what the reclaim callback heard of */
static size_t            release_off; /* a held segment it releases, or SIZE_MAX */

static void release_cb(ema_win_h w, size_t o, size_t l, void *a)
{
    (void)a;
    ema_check_heard_note(&heard, o, l);
    if (release_off != SIZE_MAX) {
        /* allowed from the callback (ema_win_set_reclaim_cb(3)) */
        ck_assert_int_eq(ema_win_release(w, release_off, SEG), EMA_SUCCESS);
        release_off = SIZE_MAX;
    }
}


static void drain(void)
{
    for (int i = 0; i < 1000 && ema_progress() == EMA_SUCCESS; i++) {
    }
}

static ema_win_stat_t wstat(ema_win_h w)
{
    ema_win_stat_t ws;
    ck_assert_int_eq(ema_win_stat(w, &ws), EMA_SUCCESS);
    return ws;
}

/* A world of one with 8 segments of memory and a window of 8, the first 4
 * local and the last 4 in the spill tier, with the pattern; the other 4
 * segments of memory free again.  (The grow spills because ema_reclaim
 * withholds the free memory meanwhile.) */
static ema_win_h start(uint8_t **base_p)
{
    ema_win_params_t p = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = WSIZE};
    void *b;
    ema_win_h w;

    ema_check_env_small_spill("512K");
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_allocate(4 * SEG, &p, &b, &w), EMA_SUCCESS);
    ck_assert_int_eq(ema_reclaim(4 * SEG, 1000), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_grow(w, WSIZE), EMA_SUCCESS);
    ck_assert_int_eq(ema_reclaim_release(4 * SEG), EMA_SUCCESS);
    for (size_t i = 0; i < WSIZE; i++) {
        ((uint8_t *)b)[i] = ema_check_pat(i);
    }
    ema_win_stat_t ws = wstat(w);
    ck_assert_uint_eq(ws.bytes_local, 4 * SEG);
    ck_assert_uint_eq(ws.bytes_spilled, 4 * SEG);
    memset(&heard, 0, sizeof(heard));
    release_off = SIZE_MAX;
    *base_p     = b;
    return w;
}

/* Segment 5 (spilled) held, for a callback that releases it when it runs. */
static void hold_5_for_the_callback(ema_win_h w)
{
    ck_assert_int_eq(ema_win_set_reclaim_cb(w, release_cb, NULL), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_acquire(w, 5 * SEG, SEG), EMA_SUCCESS);
    release_off = 5 * SEG;
}

/* The callback ran and released segment 5 without hearing of it, and it
 * stayed spilled, with @local bytes local. */
static void assert_5_unnamed_and_spilled(ema_win_h w, size_t local)
{
    ck_assert_msg(release_off == SIZE_MAX, "the reclaim callback never ran");
    ck_assert(!ema_check_heard_overlaps(&heard, 5 * SEG, SEG));
    ema_win_stat_t ws = wstat(w);
    ck_assert_msg(ws.bytes_spilled == SEG && ws.bytes_local == local,
                  "%zu bytes local, %zu spilled: a segment the callback never heard of "
                  "moved (held when it was told, released by the callback)", ws.bytes_local,
                  ws.bytes_spilled);
}

/* Segment 5 (spilled) is held when the prefetch starts; the callback,
 * told of 4, 6 and 7, releases it.  It must stay spilled, unnamed: only
 * the named ranges may move.  A second prefetch names it and brings it. */
EMA_TEST("home", test_prefetch_moves_only_what_the_callback_heard_of)
{
    uint8_t *base;
    ema_win_h w = start(&base);

    hold_5_for_the_callback(w);
    ck_assert_int_eq(ema_win_prefetch(w, 0, WSIZE), EMA_SUCCESS);
    drain();
    ck_assert(ema_check_heard_overlaps(&heard, 4 * SEG, SEG) &&
              ema_check_heard_overlaps(&heard, 6 * SEG, 2 * SEG));
    assert_5_unnamed_and_spilled(w, 7 * SEG);
    ema_check_assert_pattern(base, WSIZE);

    /* released: a prefetch again names it, and brings it home */
    heard.n = 0;
    ck_assert_int_eq(ema_win_prefetch(w, 0, WSIZE), EMA_SUCCESS);
    drain();
    ck_assert(ema_check_heard_overlaps(&heard, 5 * SEG, SEG));
    ck_assert_uint_eq(wstat(w).bytes_local, WSIZE);
    ema_check_assert_pattern(base, WSIZE);
    ck_assert_int_eq(ema_win_free(w), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

/* The same for a shrink, whose kept segments come home on the caller's
 * thread: segments 4 and 5 kept, 5 held and released by the callback. */
EMA_TEST("home", test_shrink_moves_home_only_what_the_callback_heard_of)
{
    uint8_t *base;
    ema_win_h w = start(&base);

    hold_5_for_the_callback(w);
    ck_assert_int_eq(ema_win_shrink(w, 6 * SEG), EMA_SUCCESS);
    ck_assert(ema_check_heard_overlaps(&heard, 4 * SEG, SEG));
    assert_5_unnamed_and_spilled(w, 5 * SEG);
    ema_check_assert_pattern(base, 6 * SEG);
    ck_assert_int_eq(ema_win_free(w), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

int main(void)
{
    ema_check_world_of_one();
    ema_check_tcase_options("home", 30, NULL, NULL);
    return ema_check_main("move_home", CK_ENV);
}
