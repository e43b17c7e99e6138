/*
 * Atomics across ranks: concurrent ema_fetch_add on one word sums exactly
 * and hands out distinct old values; ema_compare_swap succeeds only when the
 * compare value matches, lets exactly one of many racing ranks win, and
 * composes into a correct lock-free counter; atomics on words at segment
 * boundaries; old_p may be NULL.
 */
#include "common.h"

#define SEG   ((size_t)64 * 1024)
#define NADD  200

/* Own part layout (uint64_t words): */
#define W_COUNTER   0                     /* fetch_add target */
#define W_CAS       1                     /* compare_swap race word */
#define W_WINNERS   2                     /* how many ranks won the race */
#define W_CASLOOP   3                     /* lock-free counter via CAS */
#define W_OLDS      8                     /* [size * NADD] old values gathered here */
#define PART_BYTES  (2 * SEG + 4096)      /* words at 64K-8, 64K, 128K-8 exist */

static ema_win_h win;
static void *base; /* own part: read and written only through own_*() (common.h) */

static size_t w(size_t word) { return word * sizeof(uint64_t); }

/* Word @word of the own part. */
static uint64_t own_word(size_t word) { return own_load_u64(win, base, w(word)); }

static void zero_own_words(void)
{
    own_memset(win, base, 0, 0, PART_BYTES);
    T_OK(ema_barrier());
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void test_fetch_add_from_all_ranks_sums_and_olds_are_distinct(void)
{
    uint64_t olds[NADD];
    int target = 0;

    ema_test_begin(__func__);
    T_EXPECT(W_OLDS * 8 + (size_t)ema_t_size * NADD * 8 <= PART_BYTES, "part too small");
    zero_own_words();
    for (int i = 0; i < NADD; i++) {
        olds[i] = UINT64_MAX;
        T_STATUS(ema_fetch_add(win, target, w(W_COUNTER), 1, &olds[i]), EMA_SUCCESS);
        T_EXPECT(olds[i] < (uint64_t)ema_t_size * NADD, "old value %" PRIu64 " out of range",
                 olds[i]);
        T_EXPECT(i == 0 || olds[i] > olds[i - 1], "olds of one rank are not increasing");
    }
    /* gather every rank's olds at the target, through the window */
    T_STATUS(ema_put(win, target, w(W_OLDS) + (size_t)ema_t_rank * sizeof(olds), olds,
                     sizeof(olds)), EMA_SUCCESS);
    T_STATUS(ema_win_flush(win, target), EMA_SUCCESS);
    T_OK(ema_barrier());

    uint64_t final = 0;
    T_STATUS(ema_get(win, target, w(W_COUNTER), &final, sizeof(final)), EMA_SUCCESS);
    T_EXPECT(final == (uint64_t)ema_t_size * NADD, "final %" PRIu64 ", expected %d", final,
             ema_t_size * NADD);
    if (ema_t_rank == target) {
        size_t n = (size_t)ema_t_size * NADD;
        uint64_t *all = t_malloc(n * sizeof(uint64_t));
        own_read(win, base, w(W_OLDS), all, n * sizeof(uint64_t));
        qsort(all, n, sizeof(uint64_t), cmp_u64);
        size_t bad = n;
        for (size_t i = 0; i < n && bad == n; i++) {
            if (all[i] != i) {
                bad = i;
            }
        }
        T_EXPECT(bad == n, "the %zu old values are not exactly 0..%zu (first gap at %zu)", n,
                 n - 1, bad);
        free(all);
    }
    T_OK(ema_barrier());
}

static void test_fetch_add_to_every_rank_and_null_old_p(void)
{
    ema_test_begin(__func__);
    zero_own_words();
    for (int t = 0; t < ema_t_size; t++) {
        for (int i = 0; i < 10; i++) {
            T_STATUS(ema_fetch_add(win, t, w(W_COUNTER), 3, NULL), EMA_SUCCESS);
        }
        /* large addend: wraps modulo 2^64 */
        T_STATUS(ema_fetch_add(win, t, w(W_CASLOOP), UINT64_MAX, NULL), EMA_SUCCESS);
    }
    T_OK(ema_barrier());
    uint64_t counter = own_word(W_COUNTER), wrapped = own_word(W_CASLOOP);
    T_EXPECT(counter == (uint64_t)ema_t_size * 30, "own counter %" PRIu64, counter);
    T_EXPECT(wrapped == (uint64_t)0 - (uint64_t)ema_t_size, "own wrapped counter %" PRIu64,
             wrapped);
    T_OK(ema_barrier());
}

static void test_compare_swap_success_and_failure_cases(void)
{
    int t = (ema_t_rank + 1) % ema_t_size;
    size_t my = w(W_OLDS + (size_t)ema_t_rank); /* a word per writer: no race */
    uint64_t old;

    ema_test_begin(__func__);
    zero_own_words();
    /* success: compare matches, old is the previous value, value replaced */
    old = 77;
    T_STATUS(ema_compare_swap(win, t, my, 0, 1000 + (uint64_t)ema_t_rank, &old), EMA_SUCCESS);
    T_EXPECT(old == 0, "successful swap returned old %" PRIu64, old);
    /* failure: compare differs, old is the current value, nothing replaced */
    old = 77;
    T_STATUS(ema_compare_swap(win, t, my, 12345, 5, &old), EMA_SUCCESS);
    T_EXPECT(old == 1000 + (uint64_t)ema_t_rank, "failed swap returned old %" PRIu64, old);
    /* old_p NULL */
    T_STATUS(ema_compare_swap(win, t, my, 1000 + (uint64_t)ema_t_rank, UINT64_MAX, NULL),
             EMA_SUCCESS);
    T_STATUS(ema_win_flush(win, t), EMA_SUCCESS);
    T_OK(ema_barrier());
    int from = (ema_t_rank + ema_t_size - 1) % ema_t_size;
    uint64_t word = own_word(W_OLDS + (size_t)from);
    T_EXPECT(word == UINT64_MAX, "word of rank %d is %" PRIu64, from, word);
    T_OK(ema_barrier());
}

static void test_compare_swap_race_has_exactly_one_winner(void)
{
    ema_test_begin(__func__);
    zero_own_words();
    for (int round = 0; round < 20; round++) {
        int t = round % ema_t_size;
        uint64_t old = 77, mine = ((uint64_t)round << 32) | (uint64_t)(ema_t_rank + 1);
        T_STATUS(ema_compare_swap(win, t, w(W_CAS), 0, mine, &old), EMA_SUCCESS);
        if (old == 0) {
            T_STATUS(ema_fetch_add(win, t, w(W_WINNERS), 1, NULL), EMA_SUCCESS);
        } else {
            T_EXPECT((old & 0xffffffffu) >= 1 && (old & 0xffffffffu) <= (uint64_t)ema_t_size &&
                     (old >> 32) == (uint64_t)round,
                     "loser saw %#" PRIx64 ", not a winner's value", old);
        }
        T_OK(ema_barrier());
        uint64_t winners = 0, word = 0;
        T_STATUS(ema_get(win, t, w(W_WINNERS), &winners, 8), EMA_SUCCESS);
        T_STATUS(ema_get(win, t, w(W_CAS), &word, 8), EMA_SUCCESS);
        T_EXPECT(winners == 1, "round %d: %" PRIu64 " winners", round, winners);
        T_EXPECT(word >> 32 == (uint64_t)round, "round %d: word %#" PRIx64, round, word);
        T_OK(ema_barrier());
        if (ema_t_rank == t) {
            own_store_u64(win, base, w(W_CAS), 0);
            own_store_u64(win, base, w(W_WINNERS), 0);
        }
        T_OK(ema_barrier());
    }
}

static void test_compare_swap_loop_counts_exactly(void)
{
    int target = ema_t_size - 1;
    ema_test_begin(__func__);
    zero_own_words();
    for (int i = 0; i < 100; i++) {
        uint64_t cur = 0, old;
        T_STATUS(ema_get(win, target, w(W_CASLOOP), &cur, 8), EMA_SUCCESS);
        for (int tries = 0;; tries++) {
            T_OK(ema_compare_swap(win, target, w(W_CASLOOP), cur, cur + 1, &old));
            if (old == cur) {
                break;
            }
            cur = old;
            if (tries > 1000000) {
                T_EXPECT(0, "compare-swap loop does not converge");
                exit(1);
            }
        }
    }
    T_OK(ema_barrier());
    if (ema_t_rank == target) {
        uint64_t counter = own_word(W_CASLOOP);
        T_EXPECT(counter == (uint64_t)ema_t_size * 100, "cas counter %" PRIu64, counter);
    }
    T_OK(ema_barrier());
}

static void test_atomics_on_words_at_segment_boundaries(void)
{
    static const size_t offs[] = {SEG - 8, SEG, 2 * SEG - 8, 2 * SEG, PART_BYTES - 8};
    int t = (ema_t_rank + 1) % ema_t_size;
    ema_test_begin(__func__);
    zero_own_words();
    for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++) {
        uint64_t old = 1;
        T_STATUS(ema_fetch_add(win, t, offs[i], 0x0101010101010101ull, &old), EMA_SUCCESS);
        T_EXPECT(old % 0x0101010101010101ull == 0, "word at %zu had %#" PRIx64, offs[i], old);
    }
    T_STATUS(ema_win_flush(win, t), EMA_SUCCESS);
    T_OK(ema_barrier());
    for (size_t i = 0; i < sizeof(offs) / sizeof(offs[0]); i++) {
        uint64_t word = own_word(offs[i] / 8);
        T_EXPECT(word == 0x0101010101010101ull, "own word at %zu is %#" PRIx64, offs[i], word);
    }
    /* the neighbours of each word are untouched */
    T_EXPECT(own_word(SEG / 8 - 2) == 0 && own_word(SEG / 8 + 1) == 0,
             "neighbour words changed");
    T_OK(ema_barrier());
}

int main(void)
{
    void *b;
    ema_test_init("test_atomics");
    T_OK(ema_win_allocate(PART_BYTES, NULL, &b, &win));
    base = b;
    T_EXPECT(((uintptr_t)b % 8) == 0, "base %p is not 8-byte aligned", b);

    test_fetch_add_from_all_ranks_sums_and_olds_are_distinct();
    test_fetch_add_to_every_rank_and_null_old_p();
    test_compare_swap_success_and_failure_cases();
    test_compare_swap_race_has_exactly_one_winner();
    test_compare_swap_loop_counts_exactly();
    test_atomics_on_words_at_segment_boundaries();

    T_OK(ema_win_free(win));
    return ema_test_finish("test_atomics");
}
