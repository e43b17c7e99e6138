/*
 * Put/get correctness across ranks: sizes from 1 B to the whole part (several
 * MiB), transfers straddling segment boundaries (run with EMA_SEGMENT_SIZE=64K
 * for many of them), random offsets verified by checksum, blocking and
 * non-blocking forms, all ranks writing one target at once, and flush making
 * data visible at the target.  Every transfer is verified twice: by the
 * writer reading it back, and by the target reading its own part through
 * the base pointer (on the cuda kind, where the CPU must not load through
 * it, by an ema_get to itself).  Data are deterministic, so any rank can
 * recompute what must be where.
 */
#include "common.h"

/* EMA_SEGMENT_SIZE in the scripts.  A layout unit only: with larger segments
 * (the cuda kind's default is 64 MiB) every offset stays inside the part and
 * the boundary cases are plain in-segment transfers. */
#define SEG   ((size_t)64 * 1024)
#define PART  ((size_t)6 * 1024 * 1024 + 4321) /* not a whole number of segments */

static ema_win_h win;
static uint8_t  *base;
static uint8_t  *wbuf, *rbuf;

static int right(void) { return (ema_t_rank + 1) % ema_t_size; }
static int left(void)  { return (ema_t_rank + ema_t_size - 1) % ema_t_size; }

static void complete(ema_request_h req, int by_test)
{
    if (!by_test) {
        T_STATUS(ema_wait(req), EMA_SUCCESS);
        return;
    }
    double deadline = t_now() + 30;
    ema_status_t s;
    while ((s = ema_test(req)) == EMA_INPROGRESS) {
        if (t_now() > deadline) {
            T_EXPECT(0, "ema_test still in progress after 30 s");
            exit(1);
        }
    }
    T_STATUS(s, EMA_SUCCESS);
}

/* A put (@get 0) or a get of [off, off+len) of @target's part: blocking
 * (@mode 0), or non-blocking and completed by ema_wait (1) or ema_test (2). */
static void do_rma(int get, int target, size_t off, void *buf, size_t len, int mode)
{
    if (mode == 0) {
        T_STATUS(get ? ema_get(win, target, off, buf, len) : ema_put(win, target, off, buf, len),
                 EMA_SUCCESS);
    } else {
        ema_request_h req = NULL;
        T_OK(get ? ema_get_nb(win, target, off, buf, len, &req)
                 : ema_put_nb(win, target, off, buf, len, &req));
        complete(req, mode == 2);
    }
}

static void do_put(int target, size_t off, const void *buf, size_t len, int mode)
{
    do_rma(0, target, off, (void *)buf, len, mode);
}

static void do_get(int target, size_t off, void *buf, size_t len, int mode)
{
    do_rma(1, target, off, buf, len, mode);
}

/*
 * One collective step: every rank writes [off, off+len) of its right
 * neighbour's part (off random per writer when @off is SIZE_MAX), flushes,
 * reads it back; after a barrier every rank checks what its left neighbour
 * wrote into its own part through the base pointer.
 * mode: 0 blocking, 1 non-blocking + ema_wait, 2 non-blocking + ema_test loop.
 */
static void step(int phase, size_t off, size_t len, int mode)
{
    size_t my_off = off, in_off = off;
    if (off == SIZE_MAX) {
        uint64_t s = t_seed((uint64_t)phase, (uint64_t)ema_t_rank, len);
        my_off = t_rand(&s) % (PART - len + 1);
        s = t_seed((uint64_t)phase, (uint64_t)left(), len);
        in_off = t_rand(&s) % (PART - len + 1);
    }
    t_fill(wbuf, len, phase, ema_t_rank, my_off);
    do_put(right(), my_off, wbuf, len, mode);
    T_STATUS(ema_win_flush(win, right()), EMA_SUCCESS);
    memset(rbuf, 0xee, len);
    do_get(right(), my_off, rbuf, len, mode);
    size_t bad = t_check(rbuf, len, phase, ema_t_rank, my_off);
    T_EXPECT(bad == len, "read back %zu bytes at offset %zu of rank %d: first wrong byte at %zu",
             len, my_off, right(), bad);
    T_OK(ema_barrier());
    bad = t_check(own_view(win, base, in_off, len), len, phase, left(), in_off);
    T_EXPECT(bad == len, "%zu bytes from rank %d at offset %zu: own part wrong at +%zu (%s)",
             len, left(), in_off, bad, own_how());
    T_OK(ema_barrier());
}

static void test_put_get_sizes_1b_to_whole_part_arrive_intact(void)
{
    static const size_t sizes[] = {1, 2, 7, 8, 63, 64, 4095, 4096, 65535, 65536, 65537,
                                   131077, 1048576, 3 * 1048576 + 17, PART};
    ema_test_begin(__func__);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        step(100 + (int)i, SIZE_MAX, sizes[i], (int)(i % 3));
    }
    /* the very ends of the part */
    step(130, 0, 1, 0);
    step(131, PART - 1, 1, 0);
    step(132, PART - 4321, 4321, 1); /* the partial last segment exactly */
    step(133, 0, PART, 2);
}

static void test_put_get_straddling_segment_boundaries_arrive_intact(void)
{
    static const size_t d[] = {1, 8, 4095, SEG / 2, SEG - 1};
    int phase = 200;
    ema_test_begin(__func__);
    for (size_t k = 1; k <= 5; k += 2) {
        for (size_t j = 0; j < sizeof(d) / sizeof(d[0]); j++) {
            size_t off = k * SEG - d[j];
            step(phase, off, 2 * d[j], phase % 3); /* one boundary */
            phase++;
            step(phase, off, SEG + 2 * d[j], phase % 3); /* two boundaries */
            phase++;
        }
    }
    step(phase, SEG, 7 * SEG, 0);                           /* whole segments */
    step(phase + 1, PART - SEG - 4321 - 1, SEG + 4321 + 1, 1); /* into the last */
}

/*
 * Every rank writes a slice of every rank's part: a full-slice base pattern,
 * then random overwrites.  Writer and target replay the same seeded sequence
 * into a shadow and compare checksums: the writer over what it reads back,
 * the target over its own part.
 */
static void replay_slice(uint8_t *shadow, size_t slice, int writer, int target, int nops,
                         size_t *offs, size_t *lens)
{
    uint64_t s = t_seed(300, (uint64_t)writer, (uint64_t)target);
    t_fill(shadow, slice, 300, writer, 0);
    for (int j = 0; j < nops; j++) {
        size_t len = 1 + t_rand(&s) % (slice < 200000 ? slice : 200000);
        size_t off = t_rand(&s) % (slice - len + 1);
        t_fill(shadow + off, len, 301 + j, writer, off);
        if (offs != NULL) {
            offs[j] = off;
            lens[j] = len;
        }
    }
}

static void test_random_offsets_all_to_all_match_checksum(void)
{
    enum { NOPS = 48 };
    size_t slice = PART / (size_t)ema_t_size;
    uint8_t *shadow = t_malloc(slice);
    size_t offs[NOPS], lens[NOPS];

    ema_test_begin(__func__);
    for (int t = 0; t < ema_t_size; t++) {
        size_t at = (size_t)ema_t_rank * slice;
        replay_slice(shadow, slice, ema_t_rank, t, NOPS, offs, lens);
        t_fill(wbuf, slice, 300, ema_t_rank, 0);
        do_put(t, at, wbuf, slice, t % 3);
        T_STATUS(ema_win_flush(win, t), EMA_SUCCESS);
        for (int j = 0; j < NOPS; j++) {
            t_fill(wbuf, lens[j], 301 + j, ema_t_rank, offs[j]);
            do_put(t, at + offs[j], wbuf, lens[j], j % 3);
            /* overlapping puts from one origin are ordered only by a flush */
            T_STATUS(ema_win_flush(win, t), EMA_SUCCESS);
        }
        memset(rbuf, 0, slice);
        do_get(t, at, rbuf, slice, t % 3);
        T_EXPECT(t_checksum(rbuf, slice) == t_checksum(shadow, slice),
                 "slice written into rank %d reads back with a wrong checksum", t);
        /* random sub-range reads */
        uint64_t s = t_seed(399, (uint64_t)ema_t_rank, (uint64_t)t);
        for (int j = 0; j < 16; j++) {
            size_t len = 1 + t_rand(&s) % slice;
            size_t off = t_rand(&s) % (slice - len + 1);
            do_get(t, at + off, rbuf, len, j % 3);
            T_EXPECT(memcmp(rbuf, shadow + off, len) == 0,
                     "get of %zu bytes at +%zu of rank %d's slice differs", len, off, t);
        }
    }
    T_STATUS(ema_win_flush_all(win), EMA_SUCCESS);
    T_OK(ema_barrier());
    for (int w = 0; w < ema_t_size; w++) {
        replay_slice(shadow, slice, w, ema_t_rank, NOPS, NULL, NULL);
        T_EXPECT(t_checksum(own_view(win, base, (size_t)w * slice, slice), slice) ==
                     t_checksum(shadow, slice),
                 "own part: slice of rank %d has a wrong checksum (%s)", w, own_how());
    }
    T_OK(ema_barrier());
    free(shadow);
}

static void test_nonblocking_many_outstanding_complete_by_wait_and_test(void)
{
    enum { NREQ = 24 };
    size_t stride = PART / NREQ;
    ema_request_h reqs[NREQ];
    uint8_t *bufs = t_malloc(stride * NREQ);

    ema_test_begin(__func__);
    /* all outstanding at once; lengths cross segments and need several runs */
    for (int i = 0; i < NREQ; i++) {
        size_t off = (size_t)i * stride, len = stride - (size_t)i * 97;
        t_fill(bufs + off, len, 400, ema_t_rank, off);
        reqs[i] = NULL;
        T_OK(ema_put_nb(win, right(), off, bufs + off, len, &reqs[i]));
        T_EXPECT(reqs[i] != NULL, "ema_put_nb returned no request");
    }
    for (int i = 0; i < NREQ; i++) {
        complete(reqs[i], i % 2);
    }
    T_STATUS(ema_win_flush(win, right()), EMA_SUCCESS);
    T_OK(ema_barrier());
    for (int i = 0; i < NREQ; i++) {
        size_t off = (size_t)i * stride, len = stride - (size_t)i * 97;
        size_t bad = t_check(own_view(win, base, off, len), len, 400, left(), off);
        T_EXPECT(bad == len, "non-blocking put %d from rank %d: own part wrong at +%zu", i,
                 left(), bad);
    }
    memset(bufs, 0, stride * NREQ);
    for (int i = 0; i < NREQ; i++) {
        size_t off = (size_t)i * stride, len = stride - (size_t)i * 97;
        T_OK(ema_get_nb(win, right(), off, bufs + off, len, &reqs[i]));
    }
    for (int i = NREQ - 1; i >= 0; i--) { /* completed out of issue order */
        complete(reqs[i], (i + 1) % 2);
    }
    for (int i = 0; i < NREQ; i++) {
        size_t off = (size_t)i * stride, len = stride - (size_t)i * 97;
        size_t bad = t_check(bufs + off, len, 400, ema_t_rank, off);
        T_EXPECT(bad == len, "non-blocking get %d: wrong at +%zu", i, bad);
    }
    /* zero-length operations still give a request to complete */
    ema_request_h r0 = NULL;
    T_STATUS(ema_put_nb(win, right(), 0, bufs, 0, &r0), EMA_SUCCESS);
    T_STATUS(ema_wait(r0), EMA_SUCCESS);
    r0 = NULL;
    T_STATUS(ema_get_nb(win, right(), PART, bufs, 0, &r0), EMA_SUCCESS);
    complete(r0, 1);
    T_OK(ema_barrier());
    free(bufs);
}

static void test_all_ranks_put_into_one_target_disjoint_slices_intact(void)
{
    size_t slice = PART / (size_t)ema_t_size, chunk = 70001;
    size_t at = (size_t)ema_t_rank * slice;
    int target = ema_t_size - 1;

    ema_test_begin(__func__);
    t_fill(wbuf, slice, 500, ema_t_rank, at);
    for (size_t o = 0, i = 0; o < slice; o += chunk, i++) {
        size_t n = (slice - o < chunk) ? slice - o : chunk;
        do_put(target, at + o, wbuf + o, n, (int)(i % 3));
    }
    T_STATUS(ema_win_flush(win, target), EMA_SUCCESS);
    T_OK(ema_barrier());
    if (ema_t_rank == target) {
        for (int w = 0; w < ema_t_size; w++) {
            size_t wat = (size_t)w * slice;
            size_t bad = t_check(own_view(win, base, wat, slice), slice, 500, w, wat);
            T_EXPECT(bad == slice, "slice of rank %d wrong at +%zu", w, bad);
        }
    }
    for (int w = 0; w < ema_t_size; w++) {
        size_t wat = (size_t)w * slice;
        memset(rbuf, 0, slice);
        do_get(target, wat, rbuf, slice, w % 3);
        size_t bad = t_check(rbuf, slice, 500, w, wat);
        T_EXPECT(bad == slice, "get of the slice of rank %d wrong at +%zu", w, bad);
    }
    T_OK(ema_barrier());
}

/* ema_put returns when the buffer may be reused: overwrite it at once; the
 * target must still see the original data once the writer has flushed. */
static void test_flush_makes_puts_visible_at_target_base(void)
{
    size_t slice = PART / (size_t)ema_t_size;
    size_t lens[] = {8, 1, 65536 + 3, 1048576};

    ema_test_begin(__func__);
    for (int round = 0; round < 2 * ema_t_size; round++) {
        int target = (ema_t_rank + round) % ema_t_size;
        int from   = (ema_t_rank - round % ema_t_size + ema_t_size) % ema_t_size;
        size_t len = lens[round % 4] < slice ? lens[round % 4] : slice;
        size_t at  = (size_t)ema_t_rank * slice, from_at = (size_t)from * slice;
        int phase  = 600 + round;

        t_fill(wbuf, len, phase, ema_t_rank, at);
        if (round % 2 == 0) {
            T_STATUS(ema_put(win, target, at, wbuf, len), EMA_SUCCESS);
        } else {
            ema_request_h req;
            T_OK(ema_put_nb(win, target, at, wbuf, len, &req));
            T_STATUS(ema_wait(req), EMA_SUCCESS);
        }
        memset(wbuf, 0xa5, len); /* reuse the buffer at once */
        if (round < ema_t_size) {
            T_STATUS(ema_win_flush(win, target), EMA_SUCCESS);
        } else {
            T_STATUS(ema_win_flush_all(win), EMA_SUCCESS);
        }
        T_OK(ema_barrier());
        size_t bad = t_check(own_view(win, base, from_at, len), len, phase, from, from_at);
        T_EXPECT(bad == len, "round %d: %zu bytes from rank %d not visible after flush (+%zu)",
                 round, len, from, bad);
        T_OK(ema_barrier());
    }
}

int main(void)
{
    ema_test_init("test_rma");
    void *b = NULL;
    T_OK(ema_win_allocate(PART, NULL, &b, &win));
    base = b;
    wbuf = t_malloc(PART);
    rbuf = t_malloc(PART);
    for (int r = 0; r < ema_t_size; r++) {
        size_t sz = 0;
        T_OK(ema_win_size(win, r, &sz));
        T_EXPECT(sz == PART, "ema_win_size(rank %d) = %zu", r, sz);
    }
    T_OK(ema_barrier());

    test_put_get_sizes_1b_to_whole_part_arrive_intact();
    test_put_get_straddling_segment_boundaries_arrive_intact();
    test_random_offsets_all_to_all_match_checksum();
    test_nonblocking_many_outstanding_complete_by_wait_and_test();
    test_all_ranks_put_into_one_target_disjoint_slices_intact();
    test_flush_makes_puts_visible_at_target_base();

    T_OK(ema_win_free(win));
    free(wbuf);
    free(rbuf);
    return ema_test_finish("test_rma");
}
