/*
 * ema_stress: random puts racing random grow, shrink and reclaim, checked
 * against an exact model.
 *
 *   mpirun -n 4 tests/stress/ema_stress [--time S] [--seed N] [--verbose]
 *
 * Every rank owns one part of one elastic window.  The part's size moves
 * between MIN_SIZE and MAX_SIZE; MAX_SIZE is larger than the rank's own
 * memory (EMA_DEVICE_MEMORY), so growing borrows from peers, takes lent
 * memory back (implicit reclaim) or spills to host memory.
 *
 * Ownership of the bytes, which makes the model exact:
 *  - Only a part's owner changes its size.
 *  - Each part is cut into stripes of STRIPE bytes; stripe k of every part
 *    is written only by rank k % size.  Stripe boundaries do not line up
 *    with segment boundaries, so puts cross segments.
 *  - Each 8-byte word a rank writes encodes (writer, part, sequence number,
 *    word index); the writer keeps the sequence number of the last put to
 *    each word it owns, 0 for "never written since the part grew over it",
 *    whose expected content is 0: the owner zeroes new bytes (with puts to
 *    itself) right after each grow.
 *
 * The run is a series of epochs, separated by ema_barrier():
 *   A. resize: each owner may grow (EMA_ERR_NO_MEMORY is a legal outcome)
 *      or shrink its part, zeroes what it grew, and announces its size by
 *      putting it into every rank's part of a small control window (the
 *      sizes ema_win_size() returns are a cached view and are only compared
 *      with the announced ones).  Rank 0 announces the stop flag the same
 *      way.  Writers drop the model of words past a shrunk size.
 *   B. puts: every rank writes random ranges (8 B .. 256 KiB, blocking and
 *      non-blocking, in its own stripes of every part, its own included),
 *      plus puts that are partly or wholly out of range, which must fail
 *      with EMA_ERR_RANGE and write nothing.  Meanwhile some ranks run
 *      ema_reclaim(random bytes, random timeout) in a second thread, so
 *      migrations race with the puts; the bytes are then released.
 *      Everything is waited for and flushed before the barrier.
 *   C. verify (every VERIFY_EVERY epochs and at the end): each rank reads
 *      its stripes of every part with ema_get / ema_get_nb and compares
 *      them with its model; the owner also reads its whole part through its
 *      base pointer (under ema_win_acquire) and checks that every word is 0
 *      or consistent (writer = the stripe's owner, part, word index).  On
 *      the cuda memory kind (EMA_MEMORY_KIND=cuda in the environment; the
 *      default here is host) the base pointer is device memory, so the
 *      owner makes that scan with ema_get to itself instead.
 *
 * Options: --time S (default 10), --seed N, --verbose (one line per grow,
 * shrink and reclaim), --no-range-puts (no out-of-range puts: they make
 * ranks fetch tables from owners; a way to tell bugs apart).
 *
 * At the end rank 0 prints the totals and "bytes lost: N": the bytes of
 * every word found different from the model (must be 0).  The exit status
 * is non-zero if any byte was lost, any call failed unexpectedly, or a
 * grow, shrink or reclaim took unboundedly long (see SLOW_S).
 */
#include <ema.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------------------- */
/* Parameters                                                                 */
/* ------------------------------------------------------------------------- */

#define DEF_DEVICE_MEMORY (32ull << 20)
#define DEF_SEGMENT_SIZE  (1ull << 20)
#define DEF_SEGMENT_CUDA  (2ull << 20)   /* cuda: the VMM granularity */
#define MIN_SIZE          (3ull << 20)   /* smallest size of a part */
#define MAX_SIZE          (48ull << 20)  /* largest: 1.5x a rank's memory */
#define STRIPE            (320ull << 10) /* write-ownership unit, not a segment multiple */
#define MAX_PUT           (256ull << 10)
#define NB_SLOTS          16             /* non-blocking puts in flight */
#define VERIFY_EVERY      4
#define GET_CHUNK         (STRIPE)
#define MAX_RANKS         64

#define CTRL_SIZES   0                   /* uint64[MAX_RANKS]: announced sizes */
#define CTRL_STOP    (8 * MAX_RANKS)     /* uint64: stop flag */
#define CTRL_SEED    (CTRL_STOP + 8)     /* uint64: the seed, from rank 0 */
#define CTRL_STATS   4096                /* stats_t[size] at rank 0 */
#define CTRL_BYTES   (CTRL_STATS + MAX_RANKS * sizeof(stats_t))

#define WORDS_PER_STRIPE (STRIPE / 8)

/* ------------------------------------------------------------------------- */
/* State                                                                      */
/* ------------------------------------------------------------------------- */

typedef struct {
    uint64_t epochs, puts, puts_nb, bytes_put, range_puts, gets, bytes_verified;
    uint64_t grows, grows_nomem, shrinks, reclaim_calls, reclaim_ok, reclaim_timeout;
    uint64_t reclaim_nomem, stale_sizes, words_checked, bad_words, bad_bytes, errors;
    uint64_t max_borrowed, max_spilled, max_size_seen;
    /* from ema_mem_stat at the end */
    uint64_t bytes_migrated, lib_reclaims, reclaim_max_us;
    uint64_t slow_ops, max_op_us;
    uint64_t pad[3];
} stats_t;

static int       rank, nranks;
static int       verbose;
static int       range_puts = 1;   /* --no-range-puts turns them off */
static stats_t   st;
static ema_win_h win, ctrl;
static uint64_t *base;            /* own part of win; host kind: CPU loads through it */
static int       kind_cuda;       /* cuda memory kind: base is device memory */
static size_t    sizes[MAX_RANKS]; /* announced sizes of every part */
static size_t    my_size;          /* own part's size, ahead of the announcement */
static size_t    cap_bytes, seg_bytes;
static uint32_t *model[MAX_RANKS]; /* my stripes of each part: last seq, 0 = zero */
static uint64_t  next_seq = 1;
static int       reported;         /* mismatch lines printed */

static uint64_t rng_state;
static double   t_start;

/* Contract 5: a reclaim finishes within a bounded time (copy time plus a few
 * round trips).  A grow or shrink (which may reclaim implicitly or migrate)
 * taking longer than SLOW_S, or an ema_reclaim overrunning its own timeout
 * by SLOW_S, is an error. */
#define SLOW_S 5.0

static uint64_t rnd(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rnd_range(uint64_t lo, uint64_t hi) /* [lo, hi] */
{
    return lo + rnd() % (hi - lo + 1);
}

static double rnd_unit(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Note how long a grow, shrink or reclaim took (@allowed: its own timeout);
 * report and count slow ones. */
static void note_op(const char *what, size_t a, size_t b, ema_status_t s, double t0,
                    double allowed, uint64_t *slow, uint64_t *max_us)
{
    double dt = now_s() - t0;
    if ((uint64_t)(dt * 1e6) > *max_us) {
        *max_us = (uint64_t)(dt * 1e6);
    }
    if (dt > allowed + SLOW_S) {
        (*slow)++;
        fprintf(stderr, "ema_stress: rank %d: slow %s(%zu -> %zu): %.2f s (%s), at %.2f s\n",
                rank, what, a, b, dt, ema_strerror(s), t0 - t_start);
        fflush(stderr);
    }
}

/* A status other than EMA_SUCCESS from @what (at @line): report it, then
 * count it (the run goes on) or, with @fatal, stop this rank. */
static void check_status(ema_status_t s, const char *what, int line, int fatal)
{
    if (s == EMA_SUCCESS) {
        return;
    }
    fprintf(stderr, "ema_stress: rank %d: %s failed: %d (%s) at line %d%s\n", rank, what, (int)s,
            ema_strerror(s), line, fatal ? "; aborting" : "");
    fflush(stderr);
    if (fatal) {
        exit(2);
    }
    st.errors++;
}

/* An unexpected status: report and count; the run goes on. */
#define EXPECT_OK(_call) check_status((_call), #_call, __LINE__, 0)

/* A failure that leaves the ranks unable to stay in step: stop this rank
 * (mpirun then stops the others). */
#define MUST(_call) check_status((_call), #_call, __LINE__, 1)

/* ------------------------------------------------------------------------- */
/* Words and the model                                                        */
/* ------------------------------------------------------------------------- */

static inline uint64_t enc(int writer, int part, uint64_t seq, uint64_t idx)
{
    return ((uint64_t)(writer & 0xff) << 56) | ((uint64_t)(part & 0xff) << 48) |
           ((seq & 0xffffff) << 24) | (idx & 0xffffff);
}

static inline int stripe_owner(uint64_t idx) { return (int)((idx / WORDS_PER_STRIPE) % nranks); }

/* Index of word @idx (a word of one of my stripes) in my model of a part. */
static inline uint64_t model_index(uint64_t idx)
{
    uint64_t k = idx / WORDS_PER_STRIPE;
    return (k / nranks) * WORDS_PER_STRIPE + idx % WORDS_PER_STRIPE;
}

static inline uint64_t expected(int part, uint64_t idx)
{
    uint32_t seq = model[part][model_index(idx)];
    return seq ? enc(rank, part, seq, idx) : 0;
}

static uint64_t new_seq(void)
{
    if ((next_seq & 0xffffff) == 0) {
        next_seq++; /* never encode a zero sequence */
    }
    return next_seq++;
}

static void report_bad(const char *how, int part, uint64_t idx, uint64_t want, uint64_t got)
{
    st.bad_words++;
    st.bad_bytes += 8;
    if (reported++ < 20) {
        fprintf(stderr,
                "ema_stress: rank %d: %s: part %d word %" PRIu64 " (offset %" PRIu64
                ", segment %" PRIu64 "): expected %016" PRIx64 " got %016" PRIx64
                " (writer %d part %d seq %" PRIu64 " idx %" PRIu64 ")\n",
                rank, how, part, idx, idx * 8, idx * 8 / seg_bytes, want, got,
                (int)(got >> 56), (int)((got >> 48) & 0xff), (got >> 24) & 0xffffff,
                got & 0xffffff);
        fflush(stderr);
    }
}

/* ------------------------------------------------------------------------- */
/* Phase A: resize and announce                                               */
/* ------------------------------------------------------------------------- */

static void zero_range(size_t from, size_t to)
{
    static uint64_t zeros[(1u << 20) / 8];
    while (from < to) {
        size_t n = to - from < sizeof(zeros) ? to - from : sizeof(zeros);
        EXPECT_OK(ema_put(win, rank, from, zeros, n));
        from += n;
    }
    EXPECT_OK(ema_win_flush(win, rank));
}

static void note_win_stat(void)
{
    ema_win_stat_t ws = {0};
    EXPECT_OK(ema_win_stat(win, &ws));
    if (ws.size != my_size) {
        fprintf(stderr, "ema_stress: rank %d: ema_win_stat size %zu, expected %zu\n", rank,
                ws.size, my_size);
        st.errors++;
    }
    if (ws.bytes_borrowed > st.max_borrowed) {
        st.max_borrowed = ws.bytes_borrowed;
    }
    if (ws.bytes_spilled > st.max_spilled) {
        st.max_spilled = ws.bytes_spilled;
    }
    if (ws.size > st.max_size_seen) {
        st.max_size_seen = ws.size;
    }
}

static void resize(void)
{
    size_t cur = my_size;
    double r = rnd_unit();

    if (r < 0.4 && cur < MAX_SIZE) {
        /* grow: often a little, sometimes to the top */
        size_t to = (rnd_unit() < 0.3) ? MAX_SIZE : cur + rnd_range(8, (MAX_SIZE - cur) / 2 + 8);
        to = to > MAX_SIZE ? MAX_SIZE : to;
        to &= ~(size_t)7;
        if (to <= cur) {
            return;
        }
        double t0 = now_s();
        ema_status_t s = ema_win_grow(win, to);
        note_op("ema_win_grow", cur, to, s, t0, 0, &st.slow_ops, &st.max_op_us);
        if (s == EMA_SUCCESS) {
            st.grows++;
            zero_range(cur, to);
            my_size = to;
        } else if (s == EMA_ERR_NO_MEMORY) {
            st.grows_nomem++;
        } else {
            fprintf(stderr, "ema_stress: rank %d: ema_win_grow(%zu -> %zu) failed: %s\n", rank,
                    cur, to, ema_strerror(s));
            st.errors++;
        }
        if (verbose) {
            printf("[%d] grow %zu -> %zu: %s\n", rank, cur, to, ema_strerror(s));
        }
    } else if (r < 0.75 && cur > MIN_SIZE) {
        size_t to = rnd_range(MIN_SIZE, cur - 8) & ~(size_t)7;
        double t0 = now_s();
        ema_status_t s = ema_win_shrink(win, to);
        note_op("ema_win_shrink", cur, to, s, t0, 0, &st.slow_ops, &st.max_op_us);
        if (s == EMA_SUCCESS) {
            st.shrinks++;
            my_size = to;
        } else {
            fprintf(stderr, "ema_stress: rank %d: ema_win_shrink(%zu -> %zu) failed: %s\n",
                    rank, cur, to, ema_strerror(s));
            st.errors++;
        }
        if (verbose) {
            printf("[%d] shrink %zu -> %zu: %s\n", rank, cur, to, ema_strerror(s));
        }
    }
    note_win_stat();
}

/* Collective: announce sizes (and rank 0's stop flag); returns the flag. */
static int announce(int stop)
{
    uint64_t v = my_size, old[MAX_RANKS], ctl[MAX_RANKS + 1];

    for (int r = 0; r < nranks; r++) {
        EXPECT_OK(ema_put(ctrl, r, CTRL_SIZES + 8 * (size_t)rank, &v, 8));
        if (rank == 0) {
            uint64_t f = (uint64_t)stop;
            EXPECT_OK(ema_put(ctrl, r, CTRL_STOP, &f, 8));
        }
    }
    MUST(ema_win_flush_all(ctrl));
    MUST(ema_barrier());
    MUST(ema_get(ctrl, rank, 0, ctl, sizeof(ctl)));
    memcpy(old, sizes, sizeof(old));
    for (int p = 0; p < nranks; p++) {
        sizes[p] = ctl[p];
        /* the part may have shrunk: what I wrote past the new end is gone,
         * and reads as 0 (zeroed by the owner) if the part grows again */
        for (uint64_t i = sizes[p] / 8; i < old[p] / 8; i++) {
            if (stripe_owner(i) == rank) {
                model[p][model_index(i)] = 0;
            }
        }
        size_t cached;
        EXPECT_OK(ema_win_size(win, p, &cached));
        if (cached != sizes[p]) {
            st.stale_sizes++;
            if (verbose) {
                printf("[%d] ema_win_size(%d) = %zu, announced %zu\n", rank, p, cached,
                       sizes[p]);
            }
        }
    }
    return (int)ctl[MAX_RANKS];
}

/* ------------------------------------------------------------------------- */
/* Phase B: puts, with reclaims in a second thread                            */
/* ------------------------------------------------------------------------- */

typedef struct {
    ema_request_h req;
    int           busy;
    uint64_t     *buf;
} nb_slot_t;

static nb_slot_t slots[NB_SLOTS];
static uint64_t *blk_buf;

static void slot_wait(nb_slot_t *s)
{
    if (s->busy) {
        EXPECT_OK(ema_wait(s->req));
        s->busy = 0;
    }
}

static nb_slot_t *slot_get(void)
{
    for (int i = 0; i < NB_SLOTS; i++) {
        if (slots[i].busy) {
            ema_status_t t = ema_test(slots[i].req);
            if (t != EMA_INPROGRESS) {
                slots[i].busy = 0;
                if (t != EMA_SUCCESS) {
                    fprintf(stderr, "ema_stress: rank %d: non-blocking put failed: %s\n", rank,
                            ema_strerror(t));
                    st.errors++;
                }
            }
        }
        if (!slots[i].busy) {
            return &slots[i];
        }
    }
    nb_slot_t *s = &slots[rnd() % NB_SLOTS];
    slot_wait(s);
    return s;
}

/* A length in words, log-uniform in [1, max_words]. */
static uint64_t rnd_words(uint64_t max_words)
{
    int bits = 0;
    while ((1ull << (bits + 1)) <= max_words) {
        bits++;
    }
    uint64_t b = rnd_range(0, (uint64_t)bits);
    uint64_t n = (1ull << b) + rnd() % (1ull << b);
    return n > max_words ? max_words : n;
}

/* One put of my words into @part; updates the model if it was issued. */
static void one_put(int part)
{
    size_t psize = sizes[part];
    uint64_t nwords_part = psize / 8;
    uint64_t nstripes = (nwords_part + WORDS_PER_STRIPE - 1) / WORDS_PER_STRIPE;
    /* my stripes in [0, nstripes): rank, rank + n, ... */
    if (nstripes <= (uint64_t)rank) {
        return;
    }
    uint64_t mine = (nstripes - 1 - rank) / nranks + 1;
    uint64_t k = (uint64_t)rank + nranks * (rnd() % mine);
    uint64_t s0 = k * WORDS_PER_STRIPE;
    uint64_t s1 = s0 + WORDS_PER_STRIPE < nwords_part ? s0 + WORDS_PER_STRIPE : nwords_part;
    uint64_t n = rnd_words(s1 - s0 < MAX_PUT / 8 ? s1 - s0 : MAX_PUT / 8);
    uint64_t first = s0 + rnd() % (s1 - s0 - n + 1);
    uint64_t seq = new_seq();
    int nb = rnd() & 1;
    nb_slot_t *slot = nb ? slot_get() : NULL;
    uint64_t *buf = nb ? slot->buf : blk_buf;

    for (uint64_t i = 0; i < n; i++) {
        buf[i] = enc(rank, part, seq, first + i);
    }
    ema_status_t s;
    if (nb) {
        s = ema_put_nb(win, part, first * 8, buf, n * 8, &slot->req);
        if (s == EMA_SUCCESS) {
            slot->busy = 1;
            st.puts_nb++;
        }
    } else {
        s = ema_put(win, part, first * 8, buf, n * 8);
    }
    if (s != EMA_SUCCESS) {
        fprintf(stderr, "ema_stress: rank %d: put of %" PRIu64 " bytes at %" PRIu64
                " to part %d (size %zu) failed: %s\n", rank, n * 8, first * 8, part, psize,
                ema_strerror(s));
        st.errors++;
        return; /* not written: the model stays */
    }
    st.puts++;
    st.bytes_put += n * 8;
    for (uint64_t i = 0; i < n; i++) {
        model[part][model_index(first + i)] = (uint32_t)seq;
    }
}

/* A put that is partly or wholly past the end of @part: must fail with
 * EMA_ERR_RANGE and write nothing.  Partly-inside puts are made only where
 * the last stripe is mine, so a wrongly written byte shows in my model. */
static void range_put(int part)
{
    size_t psize = sizes[part];
    uint64_t nw = psize / 8;
    uint64_t first, n = rnd_words(MAX_PUT / 8);
    ema_status_t s;

    if (nw > 0 && stripe_owner(nw - 1) == rank && (rnd() & 1)) {
        /* straddles the end: [first, nw) is in my last stripe */
        uint64_t in_last = nw - ((nw - 1) / WORDS_PER_STRIPE) * WORDS_PER_STRIPE;
        n = n < 2 ? 2 : n;
        uint64_t back = 1 + rnd() % (n - 1 < in_last ? n - 1 : in_last);
        first = nw - back;
    } else {
        first = nw + rnd() % (MAX_SIZE / 8 - nw + 1);
    }
    for (uint64_t i = 0; i < n; i++) {
        blk_buf[i] = enc(rank, part, 0xdead, first + i);
    }
    if (rnd() & 1) {
        s = ema_put(win, part, first * 8, blk_buf, n * 8);
    } else {
        ema_request_h req;
        s = ema_put_nb(win, part, first * 8, blk_buf, n * 8, &req);
        if (s == EMA_SUCCESS) {
            s = ema_wait(req);
        }
    }
    if (s != EMA_ERR_RANGE) {
        fprintf(stderr, "ema_stress: rank %d: out-of-range put [%" PRIu64 ", %" PRIu64
                ") to part %d of %zu bytes returned %s, not EMA_ERR_RANGE\n", rank, first * 8,
                (first + n) * 8, part, psize, ema_strerror(s));
        st.errors++;
    }
    st.range_puts++;
}

typedef struct {
    size_t   bytes;
    uint64_t timeout_ms;
    double   delay_s, hold_s;
    uint64_t calls, ok, timeouts, nomem, errors, slow, max_us; /* added to st after the join */
} reclaim_job_t;

static void *reclaim_thread(void *arg)
{
    reclaim_job_t *job = arg;
    struct timespec ts = {0, (long)(job->delay_s * 1e9)};
    nanosleep(&ts, NULL);
    double t0 = now_s();
    ema_status_t s = ema_reclaim(job->bytes, job->timeout_ms);
    note_op("ema_reclaim", job->bytes, (size_t)job->timeout_ms, s, t0, job->timeout_ms / 1e3, &job->slow, &job->max_us);
    job->calls++;
    if (s == EMA_SUCCESS || s == EMA_ERR_TIMEOUT) {
        if (s == EMA_SUCCESS) {
            job->ok++;
        } else {
            job->timeouts++;
        }
        /* hold it a moment, as a user of the memory would */
        ts.tv_nsec = (long)(job->hold_s * 1e9);
        nanosleep(&ts, NULL);
        ema_status_t r = ema_reclaim_release(job->bytes);
        if (r != EMA_SUCCESS) {
            fprintf(stderr, "ema_stress: rank %d: ema_reclaim_release(%zu) failed: %s\n", rank,
                    job->bytes, ema_strerror(r));
            job->errors++;
        }
    } else if (s == EMA_ERR_NO_MEMORY) {
        job->nomem++; /* the memory backs this rank's own windows */
    } else {
        fprintf(stderr, "ema_stress: rank %d: ema_reclaim(%zu, %" PRIu64 ") failed: %s\n", rank,
                job->bytes, job->timeout_ms, ema_strerror(s));
        job->errors++;
    }
    if (verbose) {
        printf("[%d] reclaim %zu bytes (timeout %" PRIu64 " ms): %s\n", rank, job->bytes,
               job->timeout_ms, ema_strerror(s));
    }
    return NULL;
}

static void put_phase(void)
{
    pthread_t th;
    reclaim_job_t job;
    int reclaiming = rnd_unit() < 0.5;

    if (reclaiming) {
        /* mostly what can be reclaimed (free + lent), sometimes more */
        ema_mem_stat_t ms = {0};
        size_t segs = cap_bytes / seg_bytes;
        EXPECT_OK(ema_mem_stat(&ms));
        if (rnd_unit() < 0.7 && ms.bytes_free + ms.bytes_lent >= seg_bytes) {
            segs = (ms.bytes_free + ms.bytes_lent) / seg_bytes;
        }
        job.bytes = (size_t)rnd_range(1, segs) * seg_bytes - (rnd() & 1 ? rnd() % seg_bytes : 0);
        job.timeout_ms = (rnd_unit() < 0.2) ? 20 + rnd() % 50 : 1000 + rnd() % 4000;
        job.delay_s = rnd_unit() * 0.005;
        job.hold_s = rnd_unit() * 0.002;
        job.calls = job.ok = job.timeouts = job.nomem = job.errors = job.slow = job.max_us = 0;
        if (pthread_create(&th, NULL, reclaim_thread, &job) != 0) {
            reclaiming = 0;
        }
    }
    int nputs = (int)rnd_range(16, 96);
    for (int i = 0; i < nputs; i++) {
        int part = (int)(rnd() % nranks);
        if (range_puts && rnd_unit() < 0.05) {
            range_put(part);
        } else {
            one_put(part);
        }
    }
    for (int i = 0; i < NB_SLOTS; i++) {
        slot_wait(&slots[i]);
    }
    if (reclaiming) {
        pthread_join(th, NULL);
        st.reclaim_calls += job.calls;
        st.reclaim_ok += job.ok;
        st.reclaim_timeout += job.timeouts;
        st.reclaim_nomem += job.nomem;
        st.errors += job.errors;
        st.slow_ops += job.slow;
        st.max_op_us = job.max_us > st.max_op_us ? job.max_us : st.max_op_us;
    }
    MUST(ema_win_flush_all(win));
    MUST(ema_barrier());
}

/* ------------------------------------------------------------------------- */
/* Phase C: verify                                                            */
/* ------------------------------------------------------------------------- */

static uint64_t *get_buf[2];

static void check_words(int part, uint64_t first, uint64_t n, const uint64_t *buf)
{
    for (uint64_t i = 0; i < n; i++) {
        uint64_t want = expected(part, first + i);
        if (buf[i] != want) {
            report_bad("ema_get", part, first + i, want, buf[i]);
        }
    }
    st.words_checked += n;
    st.bytes_verified += n * 8;
}

static void verify(void)
{
    /* 1. my stripes of every part, through ema_get / ema_get_nb */
    for (int part = 0; part < nranks; part++) {
        uint64_t nw = sizes[part] / 8;
        for (uint64_t s0 = (uint64_t)rank * WORDS_PER_STRIPE; s0 < nw;
             s0 += (uint64_t)nranks * WORDS_PER_STRIPE) {
            uint64_t n = nw - s0 < WORDS_PER_STRIPE ? nw - s0 : WORDS_PER_STRIPE;
            ema_status_t s;
            if (rnd() & 1) {
                s = ema_get(win, part, s0 * 8, get_buf[0], n * 8);
            } else {
                ema_request_h req;
                s = ema_get_nb(win, part, s0 * 8, get_buf[0], n * 8, &req);
                if (s == EMA_SUCCESS) {
                    s = ema_wait(req);
                }
            }
            st.gets++;
            if (s != EMA_SUCCESS) {
                fprintf(stderr, "ema_stress: rank %d: get of part %d at %" PRIu64 " failed: %s\n",
                        rank, part, s0 * 8, ema_strerror(s));
                st.errors++;
                continue;
            }
            check_words(part, s0, n, get_buf[0]);
        }
    }

    /* 2. the whole own part, through the base pointer (host) or ema_get to
     *    itself (cuda: the CPU must not load device memory) */
    uint64_t nw = sizes[rank] / 8;
    if (nw > 0) {
        EXPECT_OK(ema_win_acquire(win, 0, sizes[rank]));
        for (uint64_t i = 0; i < nw; i++) {
            if (kind_cuda && i % WORDS_PER_STRIPE == 0) {
                uint64_t n = nw - i < WORDS_PER_STRIPE ? nw - i : WORDS_PER_STRIPE;
                ema_status_t s = ema_get(win, rank, i * 8, get_buf[1], n * 8);
                if (s != EMA_SUCCESS) {
                    fprintf(stderr, "ema_stress: rank %d: get of its own part at %" PRIu64
                            " failed: %s\n", rank, i * 8, ema_strerror(s));
                    st.errors++;
                    memset(get_buf[1], 0, n * 8);
                }
            }
            uint64_t v = kind_cuda ? get_buf[1][i % WORDS_PER_STRIPE] : base[i];
            if (v == 0) {
                continue;
            }
            int w = (int)(v >> 56);
            if (w != stripe_owner(i) || (int)((v >> 48) & 0xff) != rank ||
                (v & 0xffffff) != (i & 0xffffff) || ((v >> 24) & 0xffffff) == 0) {
                report_bad("base pointer", rank, i, enc(stripe_owner(i), rank, 0, i), v);
            }
        }
        EXPECT_OK(ema_win_release(win, 0, sizes[rank]));
    }
    MUST(ema_barrier());
}

/* ------------------------------------------------------------------------- */
/* main                                                                       */
/* ------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: ema_stress [--time SECONDS] [--seed N] [--verbose] "
                    "[--no-range-puts]\n");
}

int main(int argc, char **argv)
{
    double duration = 10;
    uint64_t seed = 0;
    int have_seed = 0;
    ema_init_params_t ip;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--time") && i + 1 < argc) {
            duration = strtod(argv[++i], NULL);
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 0);
            have_seed = 1;
        } else if (!strcmp(argv[i], "--verbose") || !strcmp(argv[i], "-v")) {
            verbose = 1;
        } else if (!strcmp(argv[i], "--no-range-puts")) {
            range_puts = 0;
        } else {
            usage();
            return 2;
        }
    }

    /* Memory kind, memory and segment size: the environment wins, else these
     * defaults (host memory). */
    memset(&ip, 0, sizeof(ip));
    if (getenv("EMA_MEMORY_KIND") == NULL) {
        ip.field_mask  = EMA_INIT_PARAM_FIELD_MEMORY_KIND;
        ip.memory_kind = EMA_MEMORY_KIND_HOST;
    }
    if (getenv("EMA_DEVICE_MEMORY") == NULL) {
        ip.field_mask   |= EMA_INIT_PARAM_FIELD_DEVICE_MEMORY;
        ip.device_memory = DEF_DEVICE_MEMORY;
    }
    if (getenv("EMA_SEGMENT_SIZE") == NULL) {
        const char *kind = getenv("EMA_MEMORY_KIND");
        ip.field_mask  |= EMA_INIT_PARAM_FIELD_SEGMENT_SIZE;
        ip.segment_size = (kind == NULL || strcmp(kind, "host") == 0) ? DEF_SEGMENT_SIZE
                                                                      : DEF_SEGMENT_CUDA;
    }
    MUST(ema_init(&ip));
    MUST(ema_world_rank(&rank));
    MUST(ema_world_size(&nranks));
    if (nranks > MAX_RANKS || nranks > 255) {
        if (rank == 0) {
            fprintf(stderr, "ema_stress: at most %d ranks\n", MAX_RANKS);
        }
        ema_finalize();
        return 2;
    }
    ema_mem_stat_t ms = {0};
    MUST(ema_mem_stat(&ms));
    cap_bytes = ms.capacity;
    kind_cuda = (ms.memory_kind == EMA_MEMORY_KIND_CUDA);

    /* the control window first, so it lives in local memory */
    void *cbase;
    MUST(ema_win_allocate(CTRL_BYTES, NULL, &cbase, &ctrl));
    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = MAX_SIZE};
    MUST(ema_win_allocate(MIN_SIZE, &wp, (void **)&base, &win));
    {
        /* the segment size: the control part's reservation, rounded to one */
        ema_win_stat_t ws = {0};
        MUST(ema_win_stat(ctrl, &ws));
        seg_bytes = ws.max_size;
    }
    my_size = MIN_SIZE;

    /* rank 0 picks the seed and tells everyone */
    if (rank == 0) {
        if (!have_seed) {
            seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
        }
        for (int r = 0; r < nranks; r++) {
            MUST(ema_put(ctrl, r, CTRL_SEED, &seed, 8));
        }
        MUST(ema_win_flush_all(ctrl));
    }
    MUST(ema_barrier());
    MUST(ema_get(ctrl, rank, CTRL_SEED, &seed, 8));
    rng_state = seed ^ (0x632be59bd9b4e019ull * (uint64_t)(rank + 1));
    if (rank == 0) {
        printf("ema_stress: %d ranks, %zu MiB of memory each, parts of %llu..%llu MiB, "
               "%.0f s, seed %" PRIu64 "\n", nranks, cap_bytes >> 20, MIN_SIZE >> 20,
               MAX_SIZE >> 20, duration, seed);
        fflush(stdout);
    }

    /* the model, and buffers */
    uint64_t model_words = ((MAX_SIZE / 8 + WORDS_PER_STRIPE - 1) / WORDS_PER_STRIPE / nranks + 1) *
                           WORDS_PER_STRIPE;
    for (int p = 0; p < nranks; p++) {
        model[p] = calloc(model_words, sizeof(uint32_t));
        if (model[p] == NULL) {
            fprintf(stderr, "ema_stress: out of memory\n");
            exit(2);
        }
        sizes[p] = MIN_SIZE;
    }
    blk_buf = malloc(MAX_PUT);
    get_buf[0] = malloc(GET_CHUNK);
    get_buf[1] = malloc(GET_CHUNK);
    for (int i = 0; i < NB_SLOTS; i++) {
        slots[i].buf = malloc(MAX_PUT);
    }
    /* the initial part's content is undefined: zero it */
    zero_range(0, MIN_SIZE);
    MUST(ema_barrier());

    double t0 = now_s();
    int stop = 0;
    t_start = t0;
    for (;;) {
        resize();
        stop = announce(rank == 0 && now_s() - t0 >= duration);
        if (stop) {
            break;
        }
        put_phase();
        st.epochs++;
        if (st.epochs % VERIFY_EVERY == 0) {
            verify();
        }
        if (verbose && rank == 0) {
            printf("[0] epoch %" PRIu64 " done at %.1f s\n", st.epochs, now_s() - t0);
            fflush(stdout);
        }
    }
    verify(); /* the final check, at the sizes just announced */

    /* gather the statistics at rank 0 */
    MUST(ema_mem_stat(&ms));
    st.bytes_migrated = ms.bytes_migrated;
    st.lib_reclaims   = ms.reclaims;
    st.reclaim_max_us = (uint64_t)ms.reclaim_max_us;
    MUST(ema_put(ctrl, 0, CTRL_STATS + (size_t)rank * sizeof(stats_t), &st, sizeof(st)));
    MUST(ema_win_flush(ctrl, 0));
    MUST(ema_barrier());
    int rc = 0;
    if (rank == 0) {
        stats_t all[MAX_RANKS], t;
        memset(&t, 0, sizeof(t));
        MUST(ema_get(ctrl, 0, CTRL_STATS, all, (size_t)nranks * sizeof(stats_t)));
        for (int r = 0; r < nranks; r++) {
            uint64_t *a = (uint64_t *)&all[r], *s = (uint64_t *)&t;
            for (size_t i = 0; i < sizeof(t) / 8; i++) {
                s[i] += a[i];
            }
            if (all[r].max_borrowed > t.pad[0]) t.pad[0] = all[r].max_borrowed;
            if (all[r].max_spilled > t.pad[1]) t.pad[1] = all[r].max_spilled;
            if (all[r].reclaim_max_us > t.pad[2]) t.pad[2] = all[r].reclaim_max_us;
        }
        t.max_op_us = 0; /* a maximum, not a sum */
        for (int r = 0; r < nranks; r++) {
            if (all[r].max_op_us > t.max_op_us) t.max_op_us = all[r].max_op_us;
        }
        double el = now_s() - t0;
        printf("epochs:          %" PRIu64 " (%.1f s)\n", all[0].epochs, el);
        printf("puts:            %" PRIu64 " (%" PRIu64 " non-blocking), %" PRIu64
               " out-of-range puts refused\n", t.puts, t.puts_nb, t.range_puts);
        printf("bytes put:       %" PRIu64 " (%.1f MiB)\n", t.bytes_put, t.bytes_put / 1048576.0);
        printf("gets:            %" PRIu64 ", %.1f MiB verified by get, %" PRIu64
               " words checked\n", t.gets, t.bytes_verified / 1048576.0, t.words_checked);
        printf("grows:           %" PRIu64 " (+%" PRIu64 " refused with EMA_ERR_NO_MEMORY)\n",
               t.grows, t.grows_nomem);
        printf("shrinks:         %" PRIu64 "\n", t.shrinks);
        printf("reclaims:        %" PRIu64 " explicit calls (%" PRIu64 " done, %" PRIu64
               " timed out, %" PRIu64 " EMA_ERR_NO_MEMORY); %" PRIu64
               " reclaims by the library (explicit + implicit), longest %.1f ms\n",
               t.reclaim_calls, t.reclaim_ok, t.reclaim_timeout, t.reclaim_nomem,
               t.lib_reclaims, t.pad[2] / 1e3);
        printf("migrated bytes:  %" PRIu64 " (%.1f MiB)\n", t.bytes_migrated,
               t.bytes_migrated / 1048576.0);
        printf("peak per rank:   borrowed %.1f MiB, spilled %.1f MiB\n", t.pad[0] / 1048576.0,
               t.pad[1] / 1048576.0);
        printf("stale sizes:     %" PRIu64 " (ema_win_size differing from the announced size)\n",
               t.stale_sizes);
        printf("slowest op:      %.1f ms (grow, shrink or reclaim); %" PRIu64
               " too slow (over %.0f s, or %.0f s past their timeout)\n",
               t.max_op_us / 1e3, t.slow_ops, SLOW_S, SLOW_S);
        printf("errors:          %" PRIu64 "\n", t.errors);
        printf("bytes lost: %" PRIu64 "\n", t.bad_bytes);
        fflush(stdout);
        rc = (t.bad_bytes > 0 || t.errors > 0 || t.slow_ops > 0) ? 1 : 0;
        uint64_t f = (uint64_t)rc;
        for (int r = 0; r < nranks; r++) {
            MUST(ema_put(ctrl, r, CTRL_STOP, &f, 8));
        }
        MUST(ema_win_flush_all(ctrl));
    }
    MUST(ema_barrier());
    uint64_t f;
    MUST(ema_get(ctrl, rank, CTRL_STOP, &f, 8));
    rc = (int)f;
    MUST(ema_win_free(win));
    MUST(ema_win_free(ctrl));
    MUST(ema_finalize());
    return rc;
}
