/*
 * The in-flight count by epoch (win/rma_priv.h rma_in, win/segment_table.c
 * ema__win_inval_local): an invalidation returns only once every RMA issue
 * that may have read the invalidated locations before its mark is out of
 * flight, also when two invalidations run at once on the rank.  Before the
 * fix of session 14 the second of two overlapping invalidations flipped the
 * epoch back and waited for the other epoch's count, which was 0, so an
 * issue counted before either went on writing the old memory after the
 * owner's copy (ema_stress on the H200 lost 1616 bytes, one put).
 *
 * The world here is a stub: no UCX (the flush is a no-op without a worker),
 * one peer part of 4 segments whose locations the invalidations mark.
 */
#include <ema.h>

#include "util/clock.h"
#include "win/rma_priv.h"
#include "xport/xport.h"

#include "check_main.h"

#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NSEGS 4

static ema__xport_t xp;
static ema__win_ctx_t ctx;
static struct ema_win win;
static ema__win_part_t parts[2];
static _Atomic ema__loc_t locs[NSEGS];

static void setup(void)
{
    memset(&xp, 0, sizeof(xp));
    xp.rank      = 0;
    xp.size      = 2;
    xp.efd       = -1;
    xp.idle_mask = 63; /* no worker, no peers' pids: waits only spin */
    memset(&ctx, 0, sizeof(ctx));
    ctx.xp   = &xp;
    ctx.rank = 0;
    ctx.size = 2;
    atomic_init(&ctx.inflight[0], 0);
    atomic_init(&ctx.inflight[1], 0);
    atomic_init(&ctx.epoch, 0);
    pthread_mutex_init(&ctx.inval_lock, NULL);
    memset(&win, 0, sizeof(win));
    memset(parts, 0, sizeof(parts));
    win.ctx            = &ctx;
    win.parts          = parts;
    parts[1].max_segs  = NSEGS;
    parts[1].loc       = locs;
    for (int i = 0; i < NSEGS; i++) {
        atomic_init(&locs[i], (ema__loc_t)(100 + i));
    }
}

static void teardown(void)
{
    pthread_mutex_destroy(&ctx.inval_lock);
}

typedef struct {
    uint32_t   first;
    atomic_int done;
} inval_arg_t;

static void *inval_thread(void *arg)
{
    inval_arg_t *a = arg;
    ck_assert_int_eq(ema__win_inval_local(&ctx, &win, 1, a->first, 1), EMA_SUCCESS);
    atomic_store(&a->done, 1);
    return NULL;
}

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

EMA_TEST("inval", test_overlapping_invalidations_wait_for_an_issue_counted_before_both)
{
    inval_arg_t a = {.first = 0}, b = {.first = 1};
    pthread_t ta, tb;

    atomic_init(&a.done, 0);
    atomic_init(&b.done, 0);
    int ep = rma_in(&ctx); /* a put that has read its location: in flight */
    ck_assert_int_eq(ep, 0);

    ck_assert_int_eq(pthread_create(&ta, NULL, inval_thread, &a), 0);
    double t0 = ema__now_us();
    while ((atomic_load(&ctx.epoch) & 1) == ep && ema__now_us() - t0 < 5e6) {
        nap_ms(1); /* until the first invalidation has flipped */
    }
    ck_assert_msg((atomic_load(&ctx.epoch) & 1) != ep, "the first invalidation never flipped");
    ck_assert_int_eq(pthread_create(&tb, NULL, inval_thread, &b), 0);

    nap_ms(100);
    /* neither may return while the issue from before both marks is in flight */
    ck_assert_int_eq(atomic_load(&a.done), 0);
    ck_assert_msg(atomic_load(&b.done) == 0,
                  "the second invalidation returned with an earlier issue in flight");
    ck_assert(atomic_load(&locs[0]) & EMA_LOC_MOVING);

    rma_leave(&ctx, ep);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    ck_assert_int_eq(atomic_load(&a.done), 1);
    ck_assert_int_eq(atomic_load(&b.done), 1);
    ck_assert(atomic_load(&locs[1]) & EMA_LOC_MOVING);
    ck_assert_int_eq(atomic_load(&ctx.inflight[0]) + atomic_load(&ctx.inflight[1]), 0);
}
END_TEST

EMA_TEST("inval", test_an_issue_counts_in_the_epoch_current_after_its_count)
{
    /* after each flip, an issue counts in the new epoch, and an invalidation
     * with nothing in flight returns at once */
    for (int k = 0; k < 4; k++) {
        int cur = atomic_load(&ctx.epoch) & 1;
        int ep  = rma_in(&ctx);
        ck_assert_int_eq(ep, cur);
        ck_assert_int_eq(atomic_load(&ctx.inflight[ep]), 1);
        rma_leave(&ctx, ep);
        ck_assert_int_eq(ema__win_inval_local(&ctx, &win, 1, (uint32_t)k, 1), EMA_SUCCESS);
        ck_assert_int_ne(atomic_load(&ctx.epoch) & 1, cur);
    }
}
END_TEST

EMA_TEST("inval", test_an_issue_preempted_across_a_flip_counts_again)
{
    /* an issue read epoch 0, then an invalidation flipped it before the
     * issue counted itself: its count in 0 would be invisible to the next
     * flip (1 to 0, which waits for 1), so it is taken back */
    int stale = atomic_load(&ctx.epoch) & 1;
    ck_assert_int_eq(ema__win_inval_local(&ctx, &win, 1, 0, 1), EMA_SUCCESS);
    ck_assert_int_eq(rma_count_in(&ctx, stale), -1);
    ck_assert_int_eq(atomic_load(&ctx.inflight[0]) + atomic_load(&ctx.inflight[1]), 0);
    /* read again, it counts in the current epoch, which the next
     * invalidation waits for */
    int ep = rma_in(&ctx);
    ck_assert_int_eq(ep, 1 - stale);
    ck_assert_int_eq(atomic_load(&ctx.inflight[ep]), 1);
    rma_leave(&ctx, ep);
}
END_TEST

int main(void)
{
    ema_check_tcase_options("inval", 30, setup, teardown);
    return ema_check_main("inval", CK_ENV);
}
