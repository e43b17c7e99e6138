/* The segment pool (src/mem/segment_pool.h): contiguous first fit, the
 * fragmented fallback, NO_MEMORY that takes nothing, rejected double frees
 * that change nothing, and the lent count. */
#include "mem/segment_pool.h"

#include "check_main.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#define NSEGS 16
static ema__seg_pool_t pool;

static void setup(void)    { ck_assert_int_eq(ema__seg_pool_init(&pool, NSEGS), EMA_SUCCESS); }
static void teardown(void) { ema__seg_pool_cleanup(&pool); }

static void take(uint32_t count, int state, const uint32_t *want)
{
    uint32_t segs[NSEGS + 1];
    ck_assert_int_eq(ema__seg_pool_alloc(&pool, count, state, segs), EMA_SUCCESS);
    for (uint32_t i = 0; i < count; i++) {
        ck_assert_msg(segs[i] == want[i], "segment %u is %u, expected %u", i, segs[i], want[i]);
    }
}

static void give(uint32_t count, const uint32_t *segs)
{
    ck_assert_int_eq(ema__seg_pool_free(&pool, count, segs), EMA_SUCCESS);
}

/* The whole observable state, to prove that a failed call changed nothing. */
typedef struct { uint32_t nfree, nlent; uint8_t state[NSEGS]; } snap_t;
static snap_t snap(void)
{
    snap_t s;
    s.nfree = ema__seg_pool_nfree(&pool);
    s.nlent = pool.nlent;
    memcpy(s.state, pool.state, NSEGS);
    return s;
}
static void assert_same(const snap_t *a)
{
    snap_t b = snap();
    ck_assert_uint_eq(a->nfree, b.nfree);
    ck_assert_uint_eq(a->nlent, b.nlent);
    ck_assert_msg(memcmp(a->state, b.state, NSEGS) == 0, "segment states changed");
}

EMA_TEST("pool", test_alloc_takes_contiguous_runs_first_fit)
{
    take(3, EMA_SEG_USED, (uint32_t[]){0, 1, 2});
    take(2, EMA_SEG_USED, (uint32_t[]){3, 4});
    give(2, (uint32_t[]){1, 2});              /* hole of 2 at 1..2 */
    take(3, EMA_SEG_USED, (uint32_t[]){5, 6, 7}); /* 3 do not fit the hole */
    take(2, EMA_SEG_USED, (uint32_t[]){1, 2});    /* first fit fills the hole */
    ck_assert_uint_eq(ema__seg_pool_nfree(&pool), NSEGS - 8);
}
END_TEST

EMA_TEST("pool", test_alloc_falls_back_to_fragmented_lowest_first)
{
    uint32_t all[NSEGS];
    for (uint32_t i = 0; i < NSEGS; i++) {
        all[i] = i;
    }
    take(NSEGS, EMA_SEG_USED, all);
    give(4, (uint32_t[]){9, 3, 13, 5}); /* free: 3 5 9 13, no two adjacent */
    take(3, EMA_SEG_USED, (uint32_t[]){3, 5, 9});
    take(1, EMA_SEG_USED, (uint32_t[]){13});
    ck_assert_uint_eq(ema__seg_pool_nfree(&pool), 0);
}
END_TEST

EMA_TEST("pool", test_alloc_beyond_free_returns_no_memory_and_takes_nothing)
{
    uint32_t segs[NSEGS + 1];
    take(10, EMA_SEG_USED, (uint32_t[]){0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
    snap_t before = snap();
    for (uint32_t i = 0; i <= NSEGS; i++) {
        segs[i] = 0xdead;
    }
    ck_assert_int_eq(ema__seg_pool_alloc(&pool, 7, EMA_SEG_USED, segs), EMA_ERR_NO_MEMORY);
    ck_assert_int_eq(ema__seg_pool_alloc(&pool, 7, EMA_SEG_LENT, segs), EMA_ERR_NO_MEMORY);
    ck_assert_int_eq(ema__seg_pool_alloc(&pool, UINT32_MAX, EMA_SEG_USED, segs),
                     EMA_ERR_NO_MEMORY);
    assert_same(&before);
    for (uint32_t i = 0; i <= NSEGS; i++) {
        ck_assert_msg(segs[i] == 0xdead, "output index %u written", i);
    }
    take(6, EMA_SEG_USED, (uint32_t[]){10, 11, 12, 13, 14, 15}); /* exactly what is free */
}
END_TEST

EMA_TEST("pool", test_alloc_bad_state_or_null_output_rejected)
{
    uint32_t segs[4];
    snap_t before = snap();
    ck_assert_int_eq(ema__seg_pool_alloc(&pool, 1, EMA_SEG_FREE, segs), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema__seg_pool_alloc(&pool, 1, 3, segs), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema__seg_pool_alloc(&pool, 1, EMA_SEG_USED, NULL), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema__seg_pool_alloc(&pool, 0, EMA_SEG_USED, segs), EMA_SUCCESS);
    assert_same(&before);
}
END_TEST

EMA_TEST("pool", test_double_free_rejected_and_changes_nothing)
{
    take(4, EMA_SEG_USED, (uint32_t[]){0, 1, 2, 3});
    give(1, (uint32_t[]){2});
    snap_t before = snap();
    ck_assert_int_eq(ema__seg_pool_free(&pool, 1, (uint32_t[]){2}), EMA_ERR_INVALID_PARAM);
    /* one bad index among good ones: none of them is freed */
    ck_assert_int_eq(ema__seg_pool_free(&pool, 3, (uint32_t[]){0, 1, 2}), EMA_ERR_INVALID_PARAM);
    /* the same segment twice in one call */
    ck_assert_int_eq(ema__seg_pool_free(&pool, 2, (uint32_t[]){3, 3}), EMA_ERR_INVALID_PARAM);
    /* out of range, never allocated */
    ck_assert_int_eq(ema__seg_pool_free(&pool, 2, (uint32_t[]){0, NSEGS}), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema__seg_pool_free(&pool, 1, (uint32_t[]){UINT32_MAX}),
                     EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema__seg_pool_free(&pool, 1, (uint32_t[]){9}), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema__seg_pool_free(&pool, 1, NULL), EMA_ERR_INVALID_PARAM);
    assert_same(&before);
    give(3, (uint32_t[]){3, 0, 1});
    ck_assert_uint_eq(ema__seg_pool_nfree(&pool), NSEGS);
}
END_TEST

EMA_TEST("pool", test_lent_segments_are_counted_apart_from_used)
{
    take(2, EMA_SEG_USED, (uint32_t[]){0, 1});
    take(3, EMA_SEG_LENT, (uint32_t[]){2, 3, 4});
    ck_assert_uint_eq(pool.nlent, 3);
    ck_assert_uint_eq(ema__seg_pool_nfree(&pool), NSEGS - 5);
    ck_assert_uint_eq(pool.state[0], EMA_SEG_USED);
    ck_assert_uint_eq(pool.state[3], EMA_SEG_LENT);
    give(2, (uint32_t[]){3, 0}); /* one lent, one used */
    ck_assert_uint_eq(pool.nlent, 2);
    ck_assert_uint_eq(ema__seg_pool_nfree(&pool), NSEGS - 3);
    give(1, (uint32_t[]){1});
    ck_assert_uint_eq(pool.nlent, 2);
    /* a failed free leaves the lent count alone */
    ck_assert_int_eq(ema__seg_pool_free(&pool, 2, (uint32_t[]){2, 3}), EMA_ERR_INVALID_PARAM);
    ck_assert_uint_eq(pool.nlent, 2);
    give(2, (uint32_t[]){2, 4});
    ck_assert_uint_eq(pool.nlent, 0);
    ck_assert_uint_eq(ema__seg_pool_nfree(&pool), NSEGS);
}
END_TEST

EMA_TEST("pool", test_empty_pool_allocates_nothing)
{
    ema__seg_pool_t p0;
    uint32_t seg = 0xdead;
    ck_assert_int_eq(ema__seg_pool_init(&p0, 0), EMA_SUCCESS);
    ck_assert_uint_eq(ema__seg_pool_nfree(&p0), 0);
    ck_assert_int_eq(ema__seg_pool_alloc(&p0, 1, EMA_SEG_USED, &seg), EMA_ERR_NO_MEMORY);
    ck_assert_uint_eq(seg, 0xdead);
    ema__seg_pool_cleanup(&p0);
}
END_TEST

int main(void)
{
    return ema_check_main_fixture("segment_pool", CK_ENV, setup, teardown);
}
