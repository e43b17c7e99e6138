/*
 * Argument and state validation of every public call of the core API
 * (include/ema.h), in a world of one.  Each test proves the documented error
 * AND that nothing changed: window contents keep their pattern, output
 * parameters keep their sentinel, and the world still works afterwards.
 * Check forks every test, so each test does its own ema_init/ema_finalize.
 */
#include <ema.h>

#include "check_main.h"
#include "win_check.h"

#include <check.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEG        ((size_t)64 * 1024)
#define CAPACITY   ((size_t)64 * 1024 * 1024)
#define WSIZE      (3 * SEG + 100) /* several segments, not a whole number */
#define SENTINEL   0x5e5e5e5e5e5e5e5eull
#define BAD_WIN    ((ema_win_h)(uintptr_t)0x5e5e5e50)
#define BAD_REQ    ((ema_request_h)(uintptr_t)0x5e5e5e40)

/* A handle-sized block of memory that was never a handle. */
static uint64_t foreign_block[64] = {0};
#define FOREIGN_WIN ((ema_win_h)(void *)foreign_block)
#define FOREIGN_REQ ((ema_request_h)(void *)foreign_block)

static void env_small(void)
{
    setenv("EMA_DEVICE_MEMORY", "64M", 1);
    setenv("EMA_SEGMENT_SIZE", "64K", 1);
    setenv("EMA_LOG_LEVEL", "error", 1);
}

static void init_small(void)
{
    env_small();
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
}

static uint8_t pat(size_t i) { return (uint8_t)(i * 31u + 7u); }

/* A window of WSIZE bytes filled with the pattern. */
static ema_win_h win_with_pattern(uint8_t **base_p)
{
    void *b = NULL;
    ema_win_h w = NULL;
    ck_assert_int_eq(ema_win_allocate(WSIZE, NULL, &b, &w), EMA_SUCCESS);
    ck_assert_ptr_nonnull(b);
    for (size_t i = 0; i < WSIZE; i++) {
        ((uint8_t *)b)[i] = pat(i);
    }
    *base_p = b;
    return w;
}

static void assert_pattern(ema_win_h w, const uint8_t *base)
{
    ck_assert_int_eq(ema_win_flush_all(w), EMA_SUCCESS);
    for (size_t i = 0; i < WSIZE; i++) {
        if (base[i] != pat(i)) {
            ck_abort_msg("window byte %zu changed: %#x, pattern %#x", i, base[i], pat(i));
        }
    }
}

static void assert_all_bytes(const uint8_t *buf, size_t len, uint8_t v)
{
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != v) {
            ck_abort_msg("output buffer byte %zu written (%#x)", i, buf[i]);
        }
    }
}

/* ema_init in the small world, then a window with the pattern. */
static ema_win_h init_with_pattern(uint8_t **base_p)
{
    init_small();
    return win_with_pattern(base_p);
}

/* The handle of a window already freed. */
static ema_win_h freed_window(void)
{
    uint8_t *b;
    ema_win_h dead = win_with_pattern(&b);
    ck_assert_int_eq(ema_win_free(dead), EMA_SUCCESS);
    return dead;
}

/* The window kept its pattern; then ema_finalize. */
static void finish_with_pattern(ema_win_h w, const uint8_t *base)
{
    assert_pattern(w, base);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}

/* Put, get, their non-blocking forms, the flush (and with @flush_all the
 * flush of all) and both atomics on rank @rank of @w return @want, and
 * write nothing: not the request, not the buffer, not the old value. */
static void assert_rma_calls_return(ema_win_h w, int rank, int flush_all, ema_status_t want)
{
    uint8_t buf[64];
    uint64_t old = SENTINEL;
    ema_request_h req = BAD_REQ;
    memset(buf, 0xcc, sizeof(buf));
    ck_assert_int_eq(ema_put(w, rank, 0, buf, 8), want);
    ck_assert_int_eq(ema_get(w, rank, 0, buf, 8), want);
    ck_assert_int_eq(ema_put_nb(w, rank, 0, buf, 8, &req), want);
    ck_assert_int_eq(ema_get_nb(w, rank, 0, buf, 8, &req), want);
    ck_assert_ptr_eq(req, BAD_REQ);
    ck_assert_int_eq(ema_win_flush(w, rank), want);
    if (flush_all) {
        ck_assert_int_eq(ema_win_flush_all(w), want);
    }
    ck_assert_int_eq(ema_fetch_add(w, rank, 0, 1, &old), want);
    ck_assert_int_eq(ema_compare_swap(w, rank, 0, 0, 1, &old), want);
    ck_assert_uint_eq(old, SENTINEL);
    assert_all_bytes(buf, sizeof(buf), 0xcc);
}

/* Every call that needs a world, given handles that may be anything: each
 * must return EMA_ERR_STATE and write no output. */
static void assert_every_call_returns_state(ema_win_h w, ema_request_h r)
{
    int i = INT_MIN;
    size_t sz = SENTINEL;
    uint64_t old = SENTINEL;
    void *base = (void *)BAD_WIN;
    ema_win_h wo = BAD_WIN;
    ema_request_h ro = BAD_REQ;
    uint8_t buf[16];
    memset(buf, 0xab, sizeof(buf));

    ck_assert_int_eq(ema_world_rank(&i), EMA_ERR_STATE);
    ck_assert_int_eq(ema_world_size(&i), EMA_ERR_STATE);
    ck_assert_int_eq(i, INT_MIN);
    ck_assert_int_eq(ema_barrier(), EMA_ERR_STATE);
    ck_assert_int_eq(ema_progress(), EMA_ERR_STATE);
    ck_assert_int_eq(ema_win_allocate(4096, NULL, &base, &wo), EMA_ERR_STATE);
    ck_assert_ptr_eq(base, (void *)BAD_WIN);
    ck_assert_ptr_eq(wo, BAD_WIN);
    ck_assert_int_eq(ema_win_free(w), EMA_ERR_STATE);
    ck_assert_int_eq(ema_win_size(w, 0, &sz), EMA_ERR_STATE);
    ck_assert_uint_eq(sz, SENTINEL);
    ck_assert_int_eq(ema_put(w, 0, 0, buf, 8), EMA_ERR_STATE);
    ck_assert_int_eq(ema_get(w, 0, 0, buf, 8), EMA_ERR_STATE);
    ck_assert_int_eq(ema_put_nb(w, 0, 0, buf, 8, &ro), EMA_ERR_STATE);
    ck_assert_int_eq(ema_get_nb(w, 0, 0, buf, 8, &ro), EMA_ERR_STATE);
    ck_assert_ptr_eq(ro, BAD_REQ);
    assert_all_bytes(buf, sizeof(buf), 0xab);
    ck_assert_int_eq(ema_wait(r), EMA_ERR_STATE);
    ck_assert_int_eq(ema_test(r), EMA_ERR_STATE);
    ck_assert_int_eq(ema_win_flush(w, 0), EMA_ERR_STATE);
    ck_assert_int_eq(ema_win_flush_all(w), EMA_ERR_STATE);
    ck_assert_int_eq(ema_fetch_add(w, 0, 0, 1, &old), EMA_ERR_STATE);
    ck_assert_int_eq(ema_compare_swap(w, 0, 0, 0, 1, &old), EMA_ERR_STATE);
    ck_assert_uint_eq(old, SENTINEL);
    ck_assert_int_eq(ema_finalize(), EMA_ERR_STATE);
}

/* Every call given (@w1, @r1), then given (@w2, @r2), returns
 * EMA_ERR_STATE and writes nothing; then ema_init and ema_finalize return
 * @then. */
static void assert_state_then_init(ema_win_h w1, ema_request_h r1, ema_win_h w2,
                                   ema_request_h r2, ema_status_t then)
{
    assert_every_call_returns_state(w1, r1);
    assert_every_call_returns_state(w2, r2);
    ck_assert_int_eq(ema_init(NULL), then);
    ck_assert_int_eq(ema_finalize(), then);
}

/* --- lifecycle ----------------------------------------------------------- */

EMA_TEST("lifecycle", test_every_call_before_init_returns_state_and_writes_nothing)
{
    env_small();
    /* and the library can still be initialised */
    assert_state_then_init(NULL, NULL, FOREIGN_WIN, FOREIGN_REQ, EMA_SUCCESS);
}
END_TEST

EMA_TEST("lifecycle", test_every_call_after_finalize_returns_state_and_writes_nothing)
{
    uint8_t *base;
    ema_request_h req = NULL;
    ema_win_h w = init_with_pattern(&base);
    ck_assert_int_eq(ema_put_nb(w, 0, 0, base + 8, 8, &req), EMA_SUCCESS);
    ck_assert_int_eq(ema_wait(req), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS); /* frees the window too */
    assert_state_then_init(w, req, NULL, NULL, EMA_ERR_STATE);
}
END_TEST

EMA_TEST("lifecycle", test_second_init_returns_state_and_world_keeps_working)
{
    ema_init_params_t p = {.field_mask = EMA_INIT_PARAM_FIELD_DEVICE_MEMORY,
                           .device_memory = 4096};
    uint8_t *base;
    int rank = -1;

    ema_win_h w = init_with_pattern(&base);
    ck_assert_int_eq(ema_init(NULL), EMA_ERR_STATE);
    ck_assert_int_eq(ema_init(&p), EMA_ERR_STATE);
    p.field_mask = 1ull << 40; /* even with bad params: STATE, and nothing happens */
    ck_assert_int_eq(ema_init(&p), EMA_ERR_STATE);
    assert_pattern(w, base);
    ck_assert_int_eq(ema_world_rank(&rank), EMA_SUCCESS);
    ck_assert_int_eq(rank, 0);
    uint64_t v = 0;
    ck_assert_int_eq(ema_get(w, 0, 0, &v, sizeof(v)), EMA_SUCCESS);
    ck_assert_int_eq(memcmp(&v, base, sizeof(v)), 0);
    ck_assert_int_eq(ema_win_free(w), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("lifecycle", test_finalize_frees_live_windows_and_second_finalize_returns_state)
{
    uint8_t *base;
    init_small();
    win_with_pattern(&base);
    win_with_pattern(&base);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_ERR_STATE);
}
END_TEST

EMA_TEST("lifecycle", test_init_unknown_field_mask_bits_rejected_and_init_still_possible)
{
    static const uint64_t bad[] = {1ull << 3, 1ull << 31, 1ull << 63,
                                   EMA_INIT_PARAM_FIELD_DEVICE_MEMORY | (1ull << 5)};
    int rank = 99;
    env_small();
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ema_init_params_t p = {.field_mask = bad[i], .device_memory = CAPACITY};
        ck_assert_msg(ema_init(&p) == EMA_ERR_INVALID_PARAM, "field_mask %#llx accepted",
                      (unsigned long long)bad[i]);
        ck_assert_int_eq(ema_world_rank(&rank), EMA_ERR_STATE); /* not initialised */
        ck_assert_int_eq(rank, 99);
    }
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("lifecycle", test_init_bad_memory_kind_or_zero_capacity_rejected)
{
    ema_init_params_t p = {.field_mask = EMA_INIT_PARAM_FIELD_MEMORY_KIND};
    env_small();
    p.memory_kind = (ema_memory_kind_t)3;
    ck_assert_int_eq(ema_init(&p), EMA_ERR_INVALID_PARAM);
    p.memory_kind = (ema_memory_kind_t)-1;
    ck_assert_int_eq(ema_init(&p), EMA_ERR_INVALID_PARAM);
    p.field_mask    = EMA_INIT_PARAM_FIELD_DEVICE_MEMORY;
    p.device_memory = 0;
    ck_assert_int_eq(ema_init(&p), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_barrier(), EMA_ERR_STATE);
    p.field_mask  = EMA_INIT_PARAM_FIELD_MEMORY_KIND;
    p.memory_kind = EMA_MEMORY_KIND_HOST;
    ck_assert_int_eq(ema_init(&p), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("lifecycle", test_init_cuda_kind_without_gpu_fails_unsupported_and_changes_nothing)
{
    ema_init_params_t p = {.field_mask = EMA_INIT_PARAM_FIELD_MEMORY_KIND,
                           .memory_kind = EMA_MEMORY_KIND_CUDA};
    env_small();
    ema_status_t s = ema_init(&p);
    if (s == EMA_SUCCESS) { /* a machine with a usable GPU */
        ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
        return;
    }
    ck_assert_int_eq(s, EMA_ERR_UNSUPPORTED);
    ck_assert_int_eq(ema_barrier(), EMA_ERR_STATE);
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("lifecycle", test_init_bad_environment_value_rejected_then_init_works)
{
    static const char *bad[] = {"lots", "-1", "64Q", "", "1.5G"};
    env_small();
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        setenv("EMA_DEVICE_MEMORY", bad[i], 1);
        ck_assert_msg(ema_init(NULL) == EMA_ERR_INVALID_PARAM, "EMA_DEVICE_MEMORY='%s' accepted",
                      bad[i]);
        ck_assert_int_eq(ema_barrier(), EMA_ERR_STATE);
    }
    setenv("EMA_DEVICE_MEMORY", "64M", 1);
    setenv("EMA_SEGMENT_SIZE", "64KQ", 1);
    ck_assert_int_eq(ema_init(NULL), EMA_ERR_INVALID_PARAM);
    setenv("EMA_SEGMENT_SIZE", "64K", 1);
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("lifecycle", test_init_params_override_environment_capacity)
{
    ema_init_params_t p = {.field_mask = EMA_INIT_PARAM_FIELD_DEVICE_MEMORY |
                                         EMA_INIT_PARAM_FIELD_SEGMENT_SIZE,
                           .device_memory = 4 * 1024 * 1024, .segment_size = SEG};
    void *b1 = NULL, *b2 = (void *)BAD_WIN;
    ema_win_h w1, w2 = BAD_WIN;
    env_small(); /* the environment says 64M */
    ck_assert_int_eq(ema_init(&p), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_allocate(4 * 1024 * 1024, NULL, &b1, &w1), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_allocate(1, NULL, &b2, &w2), EMA_ERR_NO_MEMORY);
    ck_assert_ptr_eq(b2, (void *)BAD_WIN);
    ck_assert_ptr_eq(w2, BAD_WIN);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

/* A variable that the parameters override is not read: a bad value there
 * failed ema_init until session 21. */
EMA_TEST("lifecycle", test_init_params_override_a_bad_environment_value)
{
    ema_init_params_t p = {.field_mask = EMA_INIT_PARAM_FIELD_SEGMENT_SIZE,
                           .device_memory = 4 * 1024 * 1024, .segment_size = SEG};
    env_small();
    setenv("EMA_DEVICE_MEMORY", "lots", 1);
    setenv("EMA_SEGMENT_SIZE", "64KQ", 1);
    /* EMA_DEVICE_MEMORY is read, and refused */
    ck_assert_int_eq(ema_init(&p), EMA_ERR_INVALID_PARAM);
    p.field_mask |= EMA_INIT_PARAM_FIELD_DEVICE_MEMORY;
    ck_assert_int_eq(ema_init(&p), EMA_SUCCESS);
    ema_mem_stat_t ms = {0};
    ck_assert_int_eq(ema_mem_stat(&ms), EMA_SUCCESS);
    ck_assert_uint_eq(ms.capacity, 4 * 1024 * 1024);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
    env_small();
}
END_TEST

/* --- world --------------------------------------------------------------- */

EMA_TEST("lifecycle", test_world_rank_and_size_reject_null_and_report_world_of_one)
{
    int rank = -7, size = -7;
    init_small();
    ck_assert_int_eq(ema_world_rank(NULL), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_world_size(NULL), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_world_rank(&rank), EMA_SUCCESS);
    ck_assert_int_eq(ema_world_size(&size), EMA_SUCCESS);
    ck_assert_int_eq(rank, 0);
    ck_assert_int_eq(size, 1);
    ck_assert_int_eq(ema_barrier(), EMA_SUCCESS);
    ema_status_t s = ema_progress();
    ck_assert_msg(s == EMA_SUCCESS || s == EMA_INPROGRESS, "ema_progress returned %d", s);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

/* --- window allocation --------------------------------------------------- */

/* The whole capacity is free again; then ema_finalize. */
static void finish_capacity_free(void)
{
    ema_check_capacity_free(CAPACITY);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}

EMA_TEST("windows", test_win_allocate_null_outputs_rejected_and_nothing_taken)
{
    void *b = (void *)BAD_WIN;
    ema_win_h w = BAD_WIN;
    init_small();
    ck_assert_int_eq(ema_win_allocate(4096, NULL, NULL, &w), EMA_ERR_INVALID_PARAM);
    ck_assert_ptr_eq(w, BAD_WIN);
    ck_assert_int_eq(ema_win_allocate(4096, NULL, &b, NULL), EMA_ERR_INVALID_PARAM);
    ck_assert_ptr_eq(b, (void *)BAD_WIN);
    ck_assert_int_eq(ema_win_allocate(CAPACITY, NULL, NULL, NULL), EMA_ERR_INVALID_PARAM);
    finish_capacity_free();
}
END_TEST

EMA_TEST("windows", test_win_allocate_unknown_field_mask_or_small_max_size_rejected)
{
    void *b = (void *)BAD_WIN;
    ema_win_h w = BAD_WIN;
    ema_win_params_t p = {.field_mask = 1ull << 1, .max_size = 1 << 20};
    init_small();
    ck_assert_int_eq(ema_win_allocate(4096, &p, &b, &w), EMA_ERR_INVALID_PARAM);
    p.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE | (1ull << 63);
    ck_assert_int_eq(ema_win_allocate(4096, &p, &b, &w), EMA_ERR_INVALID_PARAM);
    p.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE;
    p.max_size   = 4095;
    ck_assert_int_eq(ema_win_allocate(4096, &p, &b, &w), EMA_ERR_INVALID_PARAM);
    ck_assert_ptr_eq(b, (void *)BAD_WIN);
    ck_assert_ptr_eq(w, BAD_WIN);
    ema_check_capacity_free(CAPACITY);
    p.max_size = 8 * SEG; /* max_size >= size is fine */
    ck_assert_int_eq(ema_win_allocate(4096, &p, &b, &w), EMA_SUCCESS);
    size_t sz = 0;
    ck_assert_int_eq(ema_win_size(w, 0, &sz), EMA_SUCCESS);
    ck_assert_uint_eq(sz, 4096);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("windows", test_win_allocate_over_capacity_returns_no_memory_and_takes_nothing)
{
    static const size_t sizes[] = {CAPACITY + 1, 2 * CAPACITY, (size_t)1 << 40};
    void *b = (void *)BAD_WIN;
    ema_win_h w = BAD_WIN;
    init_small();
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        ck_assert_int_eq(ema_win_allocate(sizes[i], NULL, &b, &w), EMA_ERR_NO_MEMORY);
    }
    /* a size no machine has (a negative size cast to size_t) */
    ema_status_t s = ema_win_allocate(SIZE_MAX, NULL, &b, &w);
    ck_assert_msg(s == EMA_ERR_INVALID_PARAM || s == EMA_ERR_NO_MEMORY,
                  "SIZE_MAX gave %d (%s)", s, ema_strerror(s));
    ck_assert_ptr_eq(b, (void *)BAD_WIN);
    ck_assert_ptr_eq(w, BAD_WIN);
    finish_capacity_free();
}
END_TEST

EMA_TEST("windows", test_win_allocate_zero_size_part_rejects_every_nonempty_access)
{
    void *b = (void *)BAD_WIN;
    ema_win_h w = BAD_WIN;
    size_t sz = SENTINEL;
    uint8_t buf[8] = {0};
    uint64_t old = SENTINEL;
    init_small();
    ck_assert_int_eq(ema_win_allocate(0, NULL, &b, &w), EMA_SUCCESS);
    ck_assert_ptr_ne(w, BAD_WIN);
    ck_assert_int_eq(ema_win_size(w, 0, &sz), EMA_SUCCESS);
    ck_assert_uint_eq(sz, 0);
    ck_assert_int_eq(ema_put(w, 0, 0, buf, 0), EMA_SUCCESS);
    ck_assert_int_eq(ema_put(w, 0, 0, buf, 1), EMA_ERR_RANGE);
    ck_assert_int_eq(ema_get(w, 0, 0, buf, 1), EMA_ERR_RANGE);
    ck_assert_int_eq(ema_fetch_add(w, 0, 0, 1, &old), EMA_ERR_RANGE);
    ck_assert_uint_eq(old, SENTINEL);
    ck_assert_int_eq(ema_win_free(w), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("windows", test_win_free_null_foreign_or_freed_handle_rejected_and_live_window_intact)
{
    uint8_t *base;
    ema_win_h live = init_with_pattern(&base);
    ema_win_h dead = freed_window();
    ck_assert_int_eq(ema_win_free(NULL), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_free(FOREIGN_WIN), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_free(dead), EMA_ERR_INVALID_HANDLE); /* double free */
    assert_pattern(live, base);
    size_t sz = 0;
    ck_assert_int_eq(ema_win_size(live, 0, &sz), EMA_SUCCESS);
    ck_assert_uint_eq(sz, WSIZE);
    ck_assert_int_eq(ema_win_free(live), EMA_SUCCESS);
    finish_capacity_free();
}
END_TEST

EMA_TEST("windows", test_win_size_bad_handle_rank_or_null_output_rejected)
{
    uint8_t *base;
    size_t sz = SENTINEL;
    ema_win_h w = init_with_pattern(&base);
    ema_win_h dead = freed_window();
    ck_assert_int_eq(ema_win_size(NULL, 0, &sz), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_size(FOREIGN_WIN, 0, &sz), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_size(dead, 0, &sz), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_size(w, -1, &sz), EMA_ERR_INVALID_RANK);
    ck_assert_int_eq(ema_win_size(w, 1, &sz), EMA_ERR_INVALID_RANK);
    ck_assert_int_eq(ema_win_size(w, INT_MAX, &sz), EMA_ERR_INVALID_RANK);
    ck_assert_int_eq(ema_win_size(w, INT_MIN, &sz), EMA_ERR_INVALID_RANK);
    ck_assert_uint_eq(sz, SENTINEL);
    ck_assert_int_eq(ema_win_size(w, 0, NULL), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

/* --- put / get ----------------------------------------------------------- */

/* (offset, len) pairs outside a part of WSIZE bytes, overflows included. */
static const struct { size_t off, len; } out_of_range[] = {
    {WSIZE + 1, 0},        {WSIZE, 1},          {WSIZE - 1, 2},
    {0, WSIZE + 1},        {SEG, WSIZE - SEG + 1}, {SIZE_MAX, 1},
    {SIZE_MAX, 0},         {1, SIZE_MAX},       {SIZE_MAX, SIZE_MAX},
    {WSIZE / 2, SIZE_MAX - WSIZE / 2 + 1} /* offset + len wraps to 0 */,
    {WSIZE / 2, SIZE_MAX - WSIZE / 2 + 9} /* wraps to 8 */,
};
#define NOUT (sizeof(out_of_range) / sizeof(out_of_range[0]))

/* For every (offset, len) of out_of_range, the blocking and the
 * non-blocking put (@get 0) or get (@get 1) return EMA_ERR_RANGE and leave
 * the request alone; a get writes nothing to its buffer; the window keeps
 * its pattern. */
static void assert_out_of_range_rejected(int get)
{
    uint8_t *base;
    static uint8_t buf[2 * WSIZE];
    ema_win_h w = init_with_pattern(&base);
    memset(buf, 0xcc, sizeof(buf));
    for (size_t i = 0; i < NOUT; i++) {
        size_t off = out_of_range[i].off, len = out_of_range[i].len;
        ema_request_h req = BAD_REQ;
        if (get) {
            ck_assert_msg(ema_get(w, 0, off, buf, len) == EMA_ERR_RANGE,
                          "ema_get(offset %zu, len %zu) not RANGE", off, len);
            ck_assert_msg(ema_get_nb(w, 0, off, buf, len, &req) == EMA_ERR_RANGE,
                          "ema_get_nb(offset %zu, len %zu) not RANGE", off, len);
        } else {
            /* only the checks read the buffer; a transfer that wrongly starts
             * would read past it, so the status is checked before any damage
             * matters */
            ck_assert_msg(ema_put(w, 0, off, buf, len) == EMA_ERR_RANGE,
                          "ema_put(offset %zu, len %zu) not RANGE", off, len);
            ck_assert_msg(ema_put_nb(w, 0, off, buf, len, &req) == EMA_ERR_RANGE,
                          "ema_put_nb(offset %zu, len %zu) not RANGE", off, len);
        }
        ck_assert_ptr_eq(req, BAD_REQ);
        if (get) {
            assert_all_bytes(buf, sizeof(buf), 0xcc);
        }
    }
    finish_with_pattern(w, base);
}

EMA_TEST("rma", test_put_beyond_part_returns_range_and_writes_nothing)
{
    assert_out_of_range_rejected(0);
}
END_TEST

EMA_TEST("rma", test_get_beyond_part_returns_range_and_writes_nothing_to_buffer)
{
    assert_out_of_range_rejected(1);
}
END_TEST

EMA_TEST("rma", test_put_get_inside_part_edges_succeed)
{
    uint8_t *base, b = 0;
    ema_win_h w = init_with_pattern(&base);
    ck_assert_int_eq(ema_get(w, 0, WSIZE - 1, &b, 1), EMA_SUCCESS);
    ck_assert_uint_eq(b, pat(WSIZE - 1));
    ck_assert_int_eq(ema_put(w, 0, WSIZE, &b, 0), EMA_SUCCESS); /* empty, at the end */
    ck_assert_int_eq(ema_get(w, 0, WSIZE, &b, 0), EMA_SUCCESS);
    ck_assert_int_eq(ema_put(w, 0, WSIZE - 1, &b, 1), EMA_SUCCESS); /* same value back */
    finish_with_pattern(w, base);
}
END_TEST

EMA_TEST("rma", test_rma_bad_rank_returns_invalid_rank_and_changes_nothing)
{
    static const int ranks[] = {-1, 1, 2, INT_MAX, INT_MIN};
    uint8_t *base;
    ema_win_h w = init_with_pattern(&base);
    for (size_t i = 0; i < sizeof(ranks) / sizeof(ranks[0]); i++) {
        assert_rma_calls_return(w, ranks[i], 0, EMA_ERR_INVALID_RANK);
    }
    finish_with_pattern(w, base);
}
END_TEST

EMA_TEST("rma", test_rma_null_foreign_or_freed_window_returns_invalid_handle)
{
    uint8_t *base;
    ema_win_h live = init_with_pattern(&base);
    ema_win_h dead = freed_window();
    /* and values no allocation returns, refused before they are read (a
     * small integer, a misaligned address: these used to fault) */
    ema_win_h bad[] = {NULL, FOREIGN_WIN, dead, (ema_win_h)(uintptr_t)1,
                       (ema_win_h)(uintptr_t)4095, (ema_win_h)((char *)live + 1),
                       /* aligned, below 64 KiB or past user space: these faulted
                        * until session 21 */
                       (ema_win_h)(uintptr_t)0x1000, (ema_win_h)(uintptr_t)0xfff8,
                       (ema_win_h)(uintptr_t)0x8000000000000000ull,
                       (ema_win_h)(uintptr_t)-8};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_rma_calls_return(bad[i], 0, 1, EMA_ERR_INVALID_HANDLE);
    }
    size_t sz = 7;
    ema_win_stat_t ws;
    ck_assert_int_eq(ema_win_size((ema_win_h)(uintptr_t)1, 0, &sz), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_stat((ema_win_h)(uintptr_t)1, &ws), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_grow((ema_win_h)(uintptr_t)1, 4096), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_free((ema_win_h)(uintptr_t)1), EMA_ERR_INVALID_HANDLE);
    ck_assert_uint_eq(sz, 7);
    finish_with_pattern(live, base);
}
END_TEST

EMA_TEST("rma", test_rma_null_buffer_with_length_rejected_and_writes_nothing)
{
    uint8_t *base;
    ema_request_h req = BAD_REQ;
    ema_win_h w = init_with_pattern(&base);
    ck_assert_int_eq(ema_put(w, 0, 0, NULL, 8), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_get(w, 0, 0, NULL, 8), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_put_nb(w, 0, 0, NULL, 8, &req), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_get_nb(w, 0, 0, NULL, 8, &req), EMA_ERR_INVALID_PARAM);
    ck_assert_ptr_eq(req, BAD_REQ);
    finish_with_pattern(w, base);
}
END_TEST

EMA_TEST("rma", test_nonblocking_null_req_p_rejected_and_nothing_transferred)
{
    uint8_t *base, buf[2 * SEG];
    ema_win_h w = init_with_pattern(&base);
    memset(buf, 0xcc, sizeof(buf));
    ck_assert_int_eq(ema_put_nb(w, 0, SEG - 8, buf, sizeof(buf), NULL), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_get_nb(w, 0, SEG - 8, buf, sizeof(buf), NULL), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_put_nb(w, 0, 0, buf, 0, NULL), EMA_ERR_INVALID_PARAM);
    assert_pattern(w, base); /* flush_all inside: nothing was in flight */
    assert_all_bytes(buf, sizeof(buf), 0xcc);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("rma", test_wait_and_test_reject_null_or_foreign_request)
{
    static uint64_t junk[64];
    init_small();
    memset(junk, 0x5a, sizeof(junk));
    ck_assert_int_eq(ema_wait(NULL), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_test(NULL), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_wait(FOREIGN_REQ), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_test(FOREIGN_REQ), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_wait((ema_request_h)(void *)junk), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_test((ema_request_h)(void *)junk), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_wait((ema_request_h)(uintptr_t)1), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_test((ema_request_h)(uintptr_t)1), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_test((ema_request_h)((char *)junk + 3)), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_wait((ema_request_h)(uintptr_t)0x1000), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_test((ema_request_h)(uintptr_t)0xfff8), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_wait((ema_request_h)(uintptr_t)-8), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("rma", test_nonblocking_request_completes_with_success)
{
    uint8_t *base, buf[2 * SEG], in[2 * SEG];
    ema_request_h req = NULL;
    ema_status_t s;
    ema_win_h w = init_with_pattern(&base);
    memset(buf, 0x3c, sizeof(buf));
    ck_assert_int_eq(ema_put_nb(w, 0, SEG - 8, buf, sizeof(buf), &req), EMA_SUCCESS);
    ck_assert_ptr_nonnull(req);
    while ((s = ema_test(req)) == EMA_INPROGRESS) {
    }
    ck_assert_int_eq(s, EMA_SUCCESS);
    ck_assert_int_eq(ema_win_flush(w, 0), EMA_SUCCESS);
    ck_assert_int_eq(ema_get_nb(w, 0, SEG - 8, in, sizeof(in), &req), EMA_SUCCESS);
    ck_assert_int_eq(ema_wait(req), EMA_SUCCESS);
    ck_assert_int_eq(memcmp(in, buf, sizeof(buf)), 0);
    ck_assert_int_eq(memcmp(base + SEG - 8, buf, sizeof(buf)), 0);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

/* --- atomics ------------------------------------------------------------- */

/* init_with_pattern, with the word at @off set to @v. */
static ema_win_h init_with_word(uint8_t **base_p, size_t off, uint64_t v)
{
    ema_win_h w = init_with_pattern(base_p);
    memcpy(*base_p + off, &v, 8);
    return w;
}

/* Both atomics on the word at each of @offs[0..n) return @want (@name in
 * the message) and write no old value. */
static void assert_atomics_return(ema_win_h w, const size_t *offs, size_t n, ema_status_t want,
                                  const char *name)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t old = SENTINEL;
        ck_assert_msg(ema_fetch_add(w, 0, offs[i], 1, &old) == want,
                      "fetch_add at offset %zu not %s", offs[i], name);
        ck_assert_msg(ema_compare_swap(w, 0, offs[i], 0, 1, &old) == want,
                      "compare_swap at offset %zu not %s", offs[i], name);
        ck_assert_uint_eq(old, SENTINEL);
    }
}

EMA_TEST("atomics", test_atomic_misaligned_offset_returns_alignment_and_changes_nothing)
{
    static const size_t offs[] = {1, 2, 3, 4, 5, 6, 7, 9, 12, SEG - 4, SEG + 1, WSIZE - 9};
    uint8_t *base;
    ema_win_h w = init_with_pattern(&base);
    assert_atomics_return(w, offs, sizeof(offs) / sizeof(offs[0]), EMA_ERR_ALIGNMENT, "ALIGNMENT");
    finish_with_pattern(w, base);
}
END_TEST

EMA_TEST("atomics", test_atomic_word_outside_part_returns_range_and_changes_nothing)
{
    /* WSIZE = 3*64K+100 is not a multiple of 8: the aligned word after the
     * last whole one starts inside the part and crosses its end */
    size_t last = (WSIZE - 8) & ~(size_t)7;
    size_t offs[] = {last + 8 /* crosses the end */, (WSIZE + 7) & ~(size_t)7 /* after it */,
                     (SIZE_MAX - 7), (size_t)1 << 60};
    uint8_t *base;
    ema_win_h w = init_with_pattern(&base);
    for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++) {
        ck_assert_msg(offs[i] % 8 == 0, "test bug: offset %zu misaligned", offs[i]);
    }
    assert_atomics_return(w, offs, sizeof(offs) / sizeof(offs[0]), EMA_ERR_RANGE, "RANGE");
    assert_pattern(w, base);
    /* the last whole word is inside */
    uint64_t old = SENTINEL, want;
    memcpy(&want, base + last, 8);
    ck_assert_int_eq(ema_fetch_add(w, 0, last, 0, &old), EMA_SUCCESS);
    ck_assert_uint_eq(old, want);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("atomics", test_fetch_add_returns_old_value_and_accepts_null_old_p)
{
    uint8_t *base;
    uint64_t old = SENTINEL, now;
    ema_win_h w = init_with_word(&base, SEG, 40);
    ck_assert_int_eq(ema_fetch_add(w, 0, SEG, 2, &old), EMA_SUCCESS);
    ck_assert_uint_eq(old, 40);
    ck_assert_int_eq(ema_fetch_add(w, 0, SEG, 100, NULL), EMA_SUCCESS);
    memcpy(&now, base + SEG, 8);
    ck_assert_uint_eq(now, 142);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("atomics", test_compare_swap_replaces_only_when_compare_matches)
{
    uint8_t *base;
    uint64_t old = SENTINEL, now;
    ema_win_h w = init_with_word(&base, 64, 5);
    /* mismatch: old is the current value, nothing replaced */
    ck_assert_int_eq(ema_compare_swap(w, 0, 64, 9, 77, &old), EMA_SUCCESS);
    ck_assert_uint_eq(old, 5);
    memcpy(&now, base + 64, 8);
    ck_assert_msg(now == 5, "compare 9 != 5, yet the word became %llu", (unsigned long long)now);
    /* a mismatch whose value equals the current word must not swap either */
    ck_assert_int_eq(ema_compare_swap(w, 0, 64, 9, 5, &old), EMA_SUCCESS);
    memcpy(&now, base + 64, 8);
    ck_assert_msg(now == 5, "compare 9 != 5, yet the word became %llu", (unsigned long long)now);
    /* match: replaced, old is the previous value */
    old = SENTINEL;
    ck_assert_int_eq(ema_compare_swap(w, 0, 64, 5, 77, &old), EMA_SUCCESS);
    ck_assert_uint_eq(old, 5);
    memcpy(&now, base + 64, 8);
    ck_assert_msg(now == 77, "compare 5 == 5, yet the word is %llu", (unsigned long long)now);
    ck_assert_int_eq(ema_compare_swap(w, 0, 64, 77, 78, NULL), EMA_SUCCESS);
    memcpy(&now, base + 64, 8);
    ck_assert_uint_eq(now, 78);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("rma", test_flush_bad_rank_or_handle_rejected_valid_flush_succeeds)
{
    uint8_t *base;
    ema_win_h w = init_with_pattern(&base);
    ck_assert_int_eq(ema_win_flush(w, -1), EMA_ERR_INVALID_RANK);
    ck_assert_int_eq(ema_win_flush(w, 1), EMA_ERR_INVALID_RANK);
    ck_assert_int_eq(ema_win_flush(NULL, 0), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_flush_all(NULL), EMA_ERR_INVALID_HANDLE);
    ck_assert_int_eq(ema_win_flush(w, 0), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_flush_all(w), EMA_SUCCESS);
    finish_with_pattern(w, base);
}
END_TEST

/* --- calls safe at any time ---------------------------------------------- */

static char *capture(ema_status_t (*fn)(FILE *, unsigned), unsigned flags, ema_status_t *s_p)
{
    static char buf[65536];
    memset(buf, 0, sizeof(buf));
    FILE *f = fmemopen(buf, sizeof(buf) - 1, "w");
    ck_assert_ptr_nonnull(f);
    *s_p = fn(f, flags);
    fclose(f);
    return buf;
}

static ema_status_t config_print_adapter(FILE *f, unsigned flags)
{
    (void)flags;
    return ema_config_print(f);
}

EMA_TEST("always_safe", test_config_print_null_rejected_and_lists_variables_before_init)
{
    ema_status_t s;
    env_small();
    ck_assert_int_eq(ema_config_print(NULL), EMA_ERR_INVALID_PARAM);
    char *out = capture(config_print_adapter, 0, &s);
    ck_assert_int_eq(s, EMA_SUCCESS);
    ck_assert_ptr_nonnull(strstr(out, "EMA_DEVICE_MEMORY=64M"));
    ck_assert_ptr_nonnull(strstr(out, "EMA_SEGMENT_SIZE=64K"));
    ck_assert_ptr_nonnull(strstr(out, "EMA_LOG_LEVEL="));
}
END_TEST

EMA_TEST("always_safe", test_info_print_bad_stream_or_flags_rejected_and_prints_nothing)
{
    static const unsigned bad[] = {0, 1u << 4, 0xf0u, 1u << 8, EMA_INFO_VERSION | (1u << 9),
                                   ~0u};
    ema_status_t s;
    init_small();
    ck_assert_int_eq(ema_info_print(NULL, EMA_INFO_ALL), EMA_ERR_INVALID_PARAM);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *out = capture(ema_info_print, bad[i], &s);
        ck_assert_msg(s == EMA_ERR_INVALID_PARAM, "flags %#x gave %d", bad[i], s);
        ck_assert_msg(out[0] == '\0', "flags %#x printed: %s", bad[i], out);
    }
    char *out = capture(ema_info_print, EMA_INFO_ALL, &s);
    ck_assert_int_eq(s, EMA_SUCCESS);
    ck_assert_ptr_nonnull(strstr(out, ema_version_string()));
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("always_safe", test_info_print_before_init_notes_the_missing_world)
{
    ema_status_t s;
    env_small();
    char *out = capture(ema_info_print, EMA_INFO_VERSION | EMA_INFO_WORLD, &s);
    ck_assert_int_eq(s, EMA_SUCCESS);
    ck_assert_ptr_nonnull(strstr(out, ema_version_string()));
    ck_assert_ptr_nonnull(strstr(out, "not initialized"));
}
END_TEST

/* A malformed EMA_GPU_MAP, which makes ema_init fail, fails the topology
 * part too (ema_info -t exited 0 on it, printing no rank map), and every
 * part asked for is printed all the same. */
EMA_TEST("always_safe", test_info_print_topology_with_malformed_gpu_map_fails)
{
    ema_status_t s;
    env_small();
    setenv("EMA_GPU_MAP", "a,b", 1);
    char *out = capture(ema_info_print, EMA_INFO_VERSION | EMA_INFO_TOPOLOGY, &s);
    ck_assert_int_eq(s, EMA_ERR_INVALID_PARAM);
    ck_assert_ptr_nonnull(strstr(out, ema_version_string()));
    ck_assert_ptr_nonnull(strstr(out, "# topology:"));
    ck_assert_ptr_null(strstr(out, "rank -> gpu"));
    unsetenv("EMA_GPU_MAP");
    out = capture(ema_info_print, EMA_INFO_TOPOLOGY, &s);
    ck_assert_int_eq(s, EMA_SUCCESS);
    ck_assert_ptr_nonnull(strstr(out, "rank -> gpu"));
}
END_TEST

EMA_TEST("always_safe", test_version_string_and_strerror_safe_before_and_after_init)
{
    char want[32];
    snprintf(want, sizeof(want), "%d.%d.%d", EMA_VERSION_MAJOR, EMA_VERSION_MINOR,
             EMA_VERSION_PATCH);
    ck_assert_str_eq(ema_version_string(), want);
    ck_assert_str_eq(ema_strerror(EMA_ERR_STATE), ema_strerror(EMA_ERR_STATE));
    init_small();
    ck_assert_str_eq(ema_version_string(), want);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
    ck_assert_str_eq(ema_version_string(), want);
    ck_assert_ptr_nonnull(ema_strerror(EMA_SUCCESS));
}
END_TEST

int main(void)
{
    ema_check_world_of_one();
    return ema_check_main("api_args", CK_ENV);
}
