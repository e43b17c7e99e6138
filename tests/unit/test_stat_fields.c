/*
 * The field_mask of ema_win_stat_t and ema_mem_stat_t, in a world of one
 * (see ema_win_stat(3)): output only, whatever the caller left in it the
 * call fills every field this version knows and names them there, and
 * never writes reserved[]; a failed call writes nothing.  The bit
 * values are ABI: they are checked here so that none is ever renumbered.
 */
#include <ema.h>

#include "check_main.h"

#include <check.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SEG     ((size_t)64 * 1024)
#define WSIZE   (3 * SEG + 100)
#define MAXSIZE (8 * SEG)
#define CAP     ((size_t)64 << 20)
#define JUNK    0x5e
#define JUNK64  0x5e5e5e5e5e5e5e5eull

#define WIN_ALL ((1ull << 7) - 1)  /* the 7 fields of ema_win_stat_t */
#define MEM_ALL ((1ull << 15) - 1) /* the 15 fields of ema_mem_stat_t */

static ema_win_h win;

static void setup(void)
{
    setenv("EMA_DEVICE_MEMORY", "64M", 1);
    setenv("EMA_SEGMENT_SIZE", "64K", 1);
    setenv("EMA_LOG_LEVEL", "error", 1);
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    ema_win_params_t p = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = MAXSIZE};
    void *base;
    ck_assert_int_eq(ema_win_allocate(WSIZE, &p, &base, &win), EMA_SUCCESS);
}

static void teardown(void)
{
    ck_assert_int_eq(ema_win_free(win), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}

/* Every byte of [from, to) of *p still holds JUNK. */
static int untouched(const void *p, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        if (((const uint8_t *)p)[i] != JUNK) {
            return 0;
        }
    }
    return 1;
}

#define FIELD_UNTOUCHED(s, f) untouched(&(s), offsetof(__typeof__(s), f), \
                                        offsetof(__typeof__(s), f) + sizeof((s).f))

/* Every field of @wsp filled, as the window of setup has them. */
static void assert_win_stat_filled(const ema_win_stat_t *wsp)
{
    const ema_win_stat_t ws = *wsp;
    ck_assert_uint_eq(ws.field_mask, WIN_ALL);
    ck_assert_uint_eq(ws.size, WSIZE);
    ck_assert_uint_ge(ws.max_size, MAXSIZE);
    ck_assert_uint_eq(ws.bytes_local, WSIZE);
    ck_assert_uint_eq(ws.bytes_borrowed, 0);
    ck_assert_uint_eq(ws.bytes_spilled, 0);
    ck_assert_uint_eq(ws.migrations, 0);
    ck_assert_uint_eq(ws.bytes_wanted, 0);
    ck_assert(FIELD_UNTOUCHED(ws, reserved));
}

EMA_TEST("field_mask", test_stat_field_bits_and_layout_never_change)
{
    ck_assert_uint_eq(offsetof(ema_win_stat_t, field_mask), 0);
    ck_assert_uint_eq(offsetof(ema_mem_stat_t, field_mask), 0);
    ck_assert_uint_eq(EMA_WIN_STAT_FIELD_SIZE, 1ull << 0);
    ck_assert_uint_eq(EMA_WIN_STAT_FIELD_MAX_SIZE, 1ull << 1);
    ck_assert_uint_eq(EMA_WIN_STAT_FIELD_BYTES_LOCAL, 1ull << 2);
    ck_assert_uint_eq(EMA_WIN_STAT_FIELD_BYTES_BORROWED, 1ull << 3);
    ck_assert_uint_eq(EMA_WIN_STAT_FIELD_BYTES_SPILLED, 1ull << 4);
    ck_assert_uint_eq(EMA_WIN_STAT_FIELD_MIGRATIONS, 1ull << 5);
    ck_assert_uint_eq(EMA_WIN_STAT_FIELD_BYTES_WANTED, 1ull << 6);
    ck_assert_uint_eq(EMA_MEM_STAT_FIELD_CAPACITY, 1ull << 0);
    ck_assert_uint_eq(EMA_MEM_STAT_FIELD_RESERVE, 1ull << 1);
    ck_assert_uint_eq(EMA_MEM_STAT_FIELD_BYTES_FREE, 1ull << 2);
    ck_assert_uint_eq(EMA_MEM_STAT_FIELD_BYTES_USED, 1ull << 3);
    ck_assert_uint_eq(EMA_MEM_STAT_FIELD_BYTES_LENT, 1ull << 4);
    ck_assert_uint_eq(EMA_MEM_STAT_FIELD_BYTES_WITHHELD, 1ull << 5);
    ck_assert_uint_eq(EMA_MEM_STAT_FIELD_BYTES_BORROWED, 1ull << 6);
    ck_assert_uint_eq(EMA_MEM_STAT_FIELD_BYTES_SPILLED, 1ull << 7);
    ck_assert_uint_eq(EMA_MEM_STAT_FIELD_RECLAIMS, 1ull << 8);
    ck_assert_uint_eq(EMA_MEM_STAT_FIELD_BYTES_MIGRATED, 1ull << 9);
    ck_assert_uint_eq(EMA_MEM_STAT_FIELD_RECLAIM_LAST_US, 1ull << 10);
    ck_assert_uint_eq(EMA_MEM_STAT_FIELD_RECLAIM_MAX_US, 1ull << 11);
    ck_assert_uint_eq(EMA_MEM_STAT_FIELD_MEMORY_KIND, 1ull << 12);
    ck_assert_uint_eq(EMA_MEM_STAT_FIELD_DEVICE, 1ull << 13);
    ck_assert_uint_eq(EMA_MEM_STAT_FIELD_BYTES_UNMET, 1ull << 14);
    /* the room for later fields is at the end */
    ck_assert_uint_ge(sizeof(((ema_win_stat_t *)0)->reserved), 8 * sizeof(uint64_t));
    /* bytes_unmet took reserved[0] of the first layout: the size stays */
    ck_assert_uint_ge(sizeof(((ema_mem_stat_t *)0)->reserved), 7 * sizeof(uint64_t));
    ck_assert_uint_eq(offsetof(ema_mem_stat_t, reserved) - offsetof(ema_mem_stat_t, bytes_unmet),
                      sizeof(uint64_t));
    ck_assert_uint_eq(offsetof(ema_win_stat_t, reserved) + sizeof(((ema_win_stat_t *)0)->reserved),
                      sizeof(ema_win_stat_t));
    ck_assert_uint_eq(offsetof(ema_mem_stat_t, reserved) + sizeof(((ema_mem_stat_t *)0)->reserved),
                      sizeof(ema_mem_stat_t));
}
END_TEST

EMA_TEST("field_mask", test_win_stat_zero_mask_fills_every_field_and_reports_them)
{
    ema_win_stat_t ws;
    memset(&ws, JUNK, sizeof(ws));
    ws.field_mask = 0;
    ck_assert_int_eq(ema_win_stat(win, &ws), EMA_SUCCESS);
    assert_win_stat_filled(&ws);
}
END_TEST

EMA_TEST("field_mask", test_win_stat_ignores_field_mask_on_input_and_fills_every_field)
{
    /* an uninitialised struct (junk in field_mask) gets every field */
    static const uint64_t inputs[] = {EMA_WIN_STAT_FIELD_SIZE, (1ull << 63) | (1ull << 7),
                                      ~0ull, JUNK64};
    for (size_t k = 0; k < sizeof(inputs) / sizeof(inputs[0]); k++) {
        ema_win_stat_t ws;
        memset(&ws, JUNK, sizeof(ws));
        ws.field_mask = inputs[k];
        ck_assert_int_eq(ema_win_stat(win, &ws), EMA_SUCCESS);
        assert_win_stat_filled(&ws);
    }
}
END_TEST

EMA_TEST("field_mask", test_win_stat_failure_leaves_field_mask_alone)
{
    ema_win_stat_t ws;
    memset(&ws, JUNK, sizeof(ws));
    ws.field_mask = EMA_WIN_STAT_FIELD_SIZE;
    ck_assert_int_eq(ema_win_stat(NULL, &ws), EMA_ERR_INVALID_HANDLE);
    ck_assert_uint_eq(ws.field_mask, EMA_WIN_STAT_FIELD_SIZE);
    ck_assert_uint_eq(ws.size, JUNK64);
}
END_TEST

EMA_TEST("field_mask", test_mem_stat_zero_mask_fills_every_field_and_reports_them)
{
    ema_mem_stat_t ms;
    memset(&ms, JUNK, sizeof(ms));
    ms.field_mask = 0;
    ck_assert_int_eq(ema_mem_stat(&ms), EMA_SUCCESS);
    ck_assert_uint_eq(ms.field_mask, MEM_ALL);
    ck_assert_uint_eq(ms.capacity, CAP);
    ck_assert_uint_le(ms.reserve, CAP);
    ck_assert_uint_eq(ms.bytes_free + ms.bytes_used + ms.bytes_lent, CAP);
    ck_assert_uint_ge(ms.bytes_used, WSIZE);
    ck_assert_uint_eq(ms.bytes_lent, 0);
    ck_assert_uint_eq(ms.bytes_withheld, 0);
    ck_assert_uint_eq(ms.bytes_borrowed, 0);
    ck_assert_uint_eq(ms.bytes_spilled, 0);
    ck_assert_uint_eq(ms.reclaims, 0);
    ck_assert_uint_eq(ms.bytes_migrated, 0);
    ck_assert(ms.reclaim_last_us == 0.0 && ms.reclaim_max_us == 0.0);
    ck_assert(ms.memory_kind == EMA_MEMORY_KIND_HOST || ms.memory_kind == EMA_MEMORY_KIND_CUDA);
    if (ms.memory_kind == EMA_MEMORY_KIND_HOST) {
        ck_assert_int_eq(ms.device, -1);
    } else {
        ck_assert_int_ge(ms.device, 0);
    }
    ck_assert(FIELD_UNTOUCHED(ms, reserved));
}
END_TEST

EMA_TEST("field_mask", test_mem_stat_ignores_field_mask_on_input_and_fills_every_field)
{
    ema_mem_stat_t ms, all = {0};
    memset(&ms, JUNK, sizeof(ms));
    ms.field_mask = EMA_MEM_STAT_FIELD_CAPACITY | EMA_MEM_STAT_FIELD_DEVICE | (1ull << 40);
    ck_assert_int_eq(ema_mem_stat(&ms), EMA_SUCCESS);
    ck_assert_int_eq(ema_mem_stat(&all), EMA_SUCCESS);
    ck_assert_uint_eq(ms.field_mask, MEM_ALL);
    ck_assert_uint_eq(all.field_mask, MEM_ALL);
    ck_assert_uint_eq(ms.capacity, CAP);
    ck_assert_uint_eq(ms.reserve, all.reserve);
    ck_assert_uint_eq(ms.bytes_free + ms.bytes_used + ms.bytes_lent, CAP);
    ck_assert(ms.memory_kind == all.memory_kind);
    ck_assert_int_eq(ms.device, all.device);
    ck_assert(FIELD_UNTOUCHED(ms, reserved));
}
END_TEST

int main(void)
{
    ema_check_world_of_one();
    return ema_check_main_fixture("stat_fields", CK_ENV, setup, teardown);
}
