/*
 * Window allocation across ranks: each rank's part has its own size (0
 * included) and every rank sees every size through ema_win_size; puts and
 * gets respect each part's own bounds; several windows live at once and stay
 * isolated; a collective failure (one rank asks for more than its capacity)
 * fails on every rank with EMA_ERR_NO_MEMORY, writes no output, and leaves
 * the memory free for a later allocation.  The capacity is learned at run
 * time (ema_mem_stat): the scripts set EMA_DEVICE_MEMORY=64M, the GPU suite 4G.
 */
#include "common.h"

#define SEG      ((size_t)64 * 1024)

static size_t CAPACITY; /* this rank's capacity (EMA_DEVICE_MEMORY), from ema_mem_stat */

static size_t size_of(int r)
{
    static const size_t sizes[] = {3 * SEG + 5, 0, 1, 2 * 1024 * 1024 + 1};
    return sizes[r % 4];
}

static void test_sizes_differ_per_rank_including_zero(void)
{
    void *base = (void *)1;
    ema_win_h win = NULL;
    size_t mine = size_of(ema_t_rank);

    ema_test_begin(__func__);
    T_OK(ema_win_allocate(mine, NULL, &base, &win));
    T_EXPECT(win != NULL, "no handle");
    T_EXPECT(mine == 0 || base != NULL, "no base for a part of %zu bytes", mine);
    for (int r = 0; r < ema_t_size; r++) {
        size_t sz = 12345;
        T_STATUS(ema_win_size(win, r, &sz), EMA_SUCCESS);
        T_EXPECT(sz == size_of(r), "ema_win_size(rank %d) = %zu, expected %zu", r, sz,
                 size_of(r));
    }
    if (mine > 0) {
        own_memset(win, base, 0, 0x11, mine);
    }
    T_OK(ema_barrier());

    /* each part's own bounds hold for every rank */
    uint8_t buf[16] = {0};
    for (int r = 0; r < ema_t_size; r++) {
        size_t sz = size_of(r);
        T_STATUS(ema_put(win, r, sz, buf, 0), EMA_SUCCESS);
        T_STATUS(ema_put(win, r, sz, buf, 1), EMA_ERR_RANGE);
        T_STATUS(ema_get(win, r, sz, buf, 1), EMA_ERR_RANGE);
        if (sz > 0) {
            uint8_t v = 0;
            T_STATUS(ema_get(win, r, sz - 1, &v, 1), EMA_SUCCESS);
            T_EXPECT(v == 0x11, "last byte of rank %d's part is %#x", r, v);
        }
    }
    T_OK(ema_barrier());
    /* a write at the last byte of the right neighbour's part lands there */
    int t = (ema_t_rank + 1) % ema_t_size;
    if (size_of(t) > 0) {
        uint8_t v = (uint8_t)(0x80 + ema_t_rank);
        T_STATUS(ema_put(win, t, size_of(t) - 1, &v, 1), EMA_SUCCESS);
        T_STATUS(ema_win_flush(win, t), EMA_SUCCESS);
    }
    T_OK(ema_barrier());
    if (mine > 0) {
        int from = (ema_t_rank + ema_t_size - 1) % ema_t_size;
        size_t n = mine == 1 ? 1 : 2;
        const uint8_t *tail = own_view(win, base, mine - n, n);
        T_EXPECT(tail[n - 1] == (uint8_t)(0x80 + from), "last byte is %#x", tail[n - 1]);
        T_EXPECT(mine == 1 || tail[0] == 0x11, "byte before last changed");
    }
    T_OK(ema_win_free(win));
}

static void test_many_windows_are_isolated_and_free_in_any_order(void)
{
    enum { NWIN = 5 };
    ema_win_h wins[NWIN];
    uint8_t *bases[NWIN];
    size_t sz = 2 * SEG + 100;
    static uint8_t buf[SEG];

    ema_test_begin(__func__);
    for (int i = 0; i < NWIN; i++) {
        void *b;
        T_OK(ema_win_allocate(sz, NULL, &b, &wins[i]));
        bases[i] = b;
        own_memset(wins[i], b, 0, 0, sz);
        for (int j = 0; j < i; j++) {
            T_EXPECT(wins[i] != wins[j], "two live windows share a handle");
            T_EXPECT(bases[i] + sz <= bases[j] || bases[j] + sz <= bases[i],
                     "windows %d and %d overlap", i, j);
        }
    }
    T_OK(ema_barrier());
    int t = (ema_t_rank + 1) % ema_t_size;
    for (int i = 0; i < NWIN; i++) {
        memset(buf, 0x30 + i, sizeof(buf));
        T_STATUS(ema_put(wins[i], t, SEG - 50, buf, sizeof(buf)), EMA_SUCCESS);
    }
    for (int i = 0; i < NWIN; i++) {
        T_STATUS(ema_win_flush(wins[i], t), EMA_SUCCESS);
    }
    T_OK(ema_barrier());
    for (int i = 0; i < NWIN; i++) {
        const uint8_t *own = own_view(wins[i], bases[i], 0, sz);
        size_t bad = sz;
        for (size_t k = 0; k < sz && bad == sz; k++) {
            uint8_t want = (k >= SEG - 50 && k < 2 * SEG - 50) ? (uint8_t)(0x30 + i) : 0;
            if (own[k] != want) {
                bad = k;
            }
        }
        T_EXPECT(bad == sz, "window %d: byte %zu is %#x", i, bad, bad < sz ? own[bad] : 0);
    }
    T_OK(ema_barrier());
    /* free in an order other than creation (the same on every rank) */
    static const int order[NWIN] = {2, 0, 4, 1, 3};
    for (int i = 0; i < NWIN; i++) {
        T_OK(ema_win_free(wins[order[i]]));
        size_t s = 77;
        T_STATUS(ema_win_size(wins[order[i]], 0, &s), EMA_ERR_INVALID_HANDLE);
        T_EXPECT(s == 77, "ema_win_size on a freed window wrote its output");
        for (int j = i + 1; j < NWIN; j++) { /* the others still work */
            T_STATUS(ema_win_size(wins[order[j]], ema_t_rank, &s), EMA_SUCCESS);
            T_EXPECT(s == sz, "live window %d has size %zu", order[j], s);
        }
    }
}

/* One rank asks for more than its capacity: everyone gets NO_MEMORY. */
static void over_capacity_round(int greedy, size_t greedy_size)
{
    void *base = (void *)0xb0b0;
    ema_win_h win = (ema_win_h)(uintptr_t)0xb1b1;
    size_t sz = (ema_t_rank == greedy) ? greedy_size : 4096;

    T_STATUS(ema_win_allocate(sz, NULL, &base, &win), EMA_ERR_NO_MEMORY);
    T_EXPECT(base == (void *)0xb0b0, "failed allocation wrote base_p");
    T_EXPECT(win == (ema_win_h)(uintptr_t)0xb1b1, "failed allocation wrote win_p");
}

static void test_one_rank_over_capacity_fails_everywhere_and_leaks_nothing(void)
{
    ema_test_begin(__func__);
    for (int greedy = 0; greedy < ema_t_size; greedy++) {
        over_capacity_round(greedy, CAPACITY + 1);
    }
    over_capacity_round(ema_t_size - 1, 100 * CAPACITY);

    /* nothing was kept: the whole capacity can be allocated on every rank */
    void *base;
    ema_win_h win;
    T_OK(ema_win_allocate(CAPACITY, NULL, &base, &win));
    own_memset(win, base, 0, 1, 1);
    own_memset(win, base, CAPACITY - 1, 2, 1);
    T_EXPECT(own_view(win, base, 0, 1)[0] == 1 && own_view(win, base, CAPACITY - 1, 1)[0] == 2,
             "the first and last byte of a window of the whole capacity do not hold");
    size_t s = 0;
    T_STATUS(ema_win_size(win, (ema_t_rank + 1) % ema_t_size, &s), EMA_SUCCESS);
    T_EXPECT(s == CAPACITY, "neighbour's size %zu", s);

    /* full on one rank: a further small window fails everywhere, then the
     * memory is freed and the same request succeeds */
    over_capacity_round(0, SEG);
    T_OK(ema_win_free(win));
    T_OK(ema_win_allocate(SEG, NULL, &base, &win));
    T_OK(ema_win_free(win));
}

/* One rank passes an invalid argument: every rank gets EMA_ERR_INVALID_PARAM
 * (none waits for the others forever), and nothing is allocated anywhere. */
static void test_one_rank_bad_argument_fails_everywhere_without_hanging(void)
{
    ema_mem_stat_t m0 = {0}, m1 = {0};
    void *base = (void *)(uintptr_t)0xb0b0;
    ema_win_h win = (ema_win_h)(uintptr_t)0xb1b1;
    int bad = ema_t_size - 1;

    ema_test_begin(__func__);
    T_OK(ema_mem_stat(&m0));
    for (int kind = 0; kind < 3; kind++) {
        ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = SEG};
        ema_status_t s;
        if (ema_t_rank != bad) {
            s = ema_win_allocate(SEG, NULL, &base, &win);
        } else if (kind == 0) {
            s = ema_win_allocate(SEG, NULL, &base, NULL); /* no win_p */
        } else if (kind == 1) {
            s = ema_win_allocate(2 * SEG, &wp, &base, &win); /* max_size < size */
        } else {
            wp.field_mask |= 1ull << 40; /* an unknown field */
            s = ema_win_allocate(SEG, &wp, &base, &win);
        }
        T_EXPECT(s == EMA_ERR_INVALID_PARAM, "case %d: rank %d's ema_win_allocate returned %s "
                 "while rank %d passed a bad argument", kind, ema_t_rank, ema_strerror(s), bad);
        T_EXPECT(base == (void *)(uintptr_t)0xb0b0 && win == (ema_win_h)(uintptr_t)0xb1b1,
                 "case %d: a failed allocation wrote base_p or win_p", kind);
    }
    T_OK(ema_barrier());
    T_OK(ema_mem_stat(&m1));
    T_EXPECT(m1.bytes_free == m0.bytes_free && m1.bytes_used == m0.bytes_used,
             "memory changed: free %zu -> %zu, used %zu -> %zu", m0.bytes_free, m1.bytes_free,
             m0.bytes_used, m1.bytes_used);
    /* and the next, valid, allocation works */
    T_OK(ema_win_allocate(SEG, NULL, &base, &win));
    T_OK(ema_win_free(win));
}

static void test_allocation_after_failure_still_moves_data(void)
{
    void *base;
    ema_win_h win;
    uint64_t v = 0xfeed0000u + (uint64_t)ema_t_rank, got = 0;
    int t = (ema_t_rank + 1) % ema_t_size;

    ema_test_begin(__func__);
    over_capacity_round(ema_t_size / 2, CAPACITY + SEG);
    T_OK(ema_win_allocate(SEG, NULL, &base, &win));
    T_STATUS(ema_put(win, t, SEG - 8, &v, 8), EMA_SUCCESS);
    T_STATUS(ema_win_flush(win, t), EMA_SUCCESS);
    T_OK(ema_barrier());
    int from = (ema_t_rank + ema_t_size - 1) % ema_t_size;
    own_read(win, base, SEG - 8, &got, 8);
    T_EXPECT(got == 0xfeed0000u + (uint64_t)from, "got %#" PRIx64, got);
    T_OK(ema_barrier());
    T_OK(ema_win_free(win));
}

int main(void)
{
    ema_test_init("test_win_allocate");
    ema_mem_stat_t m = {0};
    T_OK(ema_mem_stat(&m));
    CAPACITY = m.capacity;
    if (ema_t_rank == 0) {
        printf("# capacity %zu, memory kind %s\n", CAPACITY, test_kind_is_cuda() ? "cuda" : "host");
    }
    test_sizes_differ_per_rank_including_zero();
    test_many_windows_are_isolated_and_free_in_any_order();
    test_one_rank_over_capacity_fails_everywhere_and_leaks_nothing();
    test_one_rank_bad_argument_fails_everywhere_without_hanging();
    test_allocation_after_failure_still_moves_data();
    return ema_test_finish("test_win_allocate");
}
