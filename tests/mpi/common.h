/*
 * Helpers shared by the multi-rank test programs.  They use only the public
 * API (the programs link libema.la).  Every check that fails prints one line
 * naming the rank, the test and the check, and is counted; main() ends with
 * ema_test_finish(), which prints one PASS/FAIL line and gives the exit code.
 */
#ifndef EMA_TEST_MPI_COMMON_H_
#define EMA_TEST_MPI_COMMON_H_

#include <ema.h>

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

static int         ema_t_rank = -1;
static int         ema_t_size = 0;
static int         ema_t_failures;
static const char *ema_t_current = "setup";

/* Any failure of a call that the test depends on: report and stop this rank. */
#define T_OK(_call)                                                                    \
    do {                                                                               \
        ema_status_t s_ = (_call);                                                     \
        if (s_ != EMA_SUCCESS) {                                                       \
            fprintf(stderr, "FAIL rank %d %s: %s returned %d (%s) at %s:%d\n",         \
                    ema_t_rank, ema_t_current, #_call, (int)s_, ema_strerror(s_),      \
                    __FILE__, __LINE__);                                               \
            fflush(stderr);                                                            \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

/* A status that must be exactly @_want. */
#define T_STATUS(_call, _want)                                                         \
    do {                                                                               \
        ema_status_t s_ = (_call);                                                     \
        if (s_ != (_want)) {                                                           \
            fprintf(stderr, "FAIL rank %d %s: %s returned %d (%s), expected %s at %s:%d\n", \
                    ema_t_rank, ema_t_current, #_call, (int)s_, ema_strerror(s_),      \
                    #_want, __FILE__, __LINE__);                                       \
            ema_t_failures++;                                                          \
        }                                                                              \
    } while (0)

#define T_EXPECT(_cond, ...)                                                           \
    do {                                                                               \
        if (!(_cond)) {                                                                \
            fprintf(stderr, "FAIL rank %d %s: %s: ", ema_t_rank, ema_t_current, #_cond); \
            fprintf(stderr, __VA_ARGS__);                                              \
            fprintf(stderr, " at %s:%d\n", __FILE__, __LINE__);                        \
            ema_t_failures++;                                                          \
        }                                                                              \
    } while (0)

static inline void ema_test_begin(const char *name)
{
    ema_t_current = name;
    if (ema_t_rank == 0) {
        printf("# %s\n", name);
        fflush(stdout);
    }
}

/* ema_init + rank/size; every program starts with this. */
/* A crash prints where it happened (the frames of libema.so and the test as
 * module+offset, for addr2line), then dies of the same signal. */
static void ema_t_crash(int sig)
{
    void *frames[48];
    char head[160];
    int n   = backtrace(frames, 48);
    int len = snprintf(head, sizeof(head), "CRASH rank %d: signal %d in %s; backtrace:\n",
                       ema_t_rank, sig, ema_t_current ? ema_t_current : "?");
    if (write(2, head, (size_t)len) < 0) {
    }
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

static inline void ema_t_catch_crashes(void)
{
    signal(SIGSEGV, ema_t_crash);
    signal(SIGBUS, ema_t_crash);
    signal(SIGABRT, ema_t_crash);
}

static inline void ema_test_init(const char *prog)
{
    ema_t_catch_crashes();
    ema_t_current = prog;
    T_OK(ema_init(NULL));
    T_OK(ema_world_rank(&ema_t_rank));
    T_OK(ema_world_size(&ema_t_size));
}

/*
 * Memory kinds.  On the cuda kind a window's base pointer is a CUDA device
 * pointer: the CPU must not load or store through it.  The helpers below
 * reach this rank's own part through the base pointer on the host kind and
 * through ema_get / ema_put (+ ema_win_flush) to this rank itself on cuda,
 * so every check runs on both kinds.  Kernels over (borrowed) window pages
 * are covered by examples/cuda_window.cu.  Call them after ema_init.
 */
static int ema_t_cuda = -1;

static inline int test_kind_is_cuda(void)
{
    if (ema_t_cuda < 0) {
        ema_mem_stat_t m = {0};
        T_OK(ema_mem_stat(&m));
        ema_t_cuda = (m.memory_kind == EMA_MEMORY_KIND_CUDA);
    }
    return ema_t_cuda;
}

/* How the own part is read in messages: "the base pointer" or "ema_get". */
static inline const char *own_how(void)
{
    return test_kind_is_cuda() ? "ema_get to itself (cuda kind)" : "the base pointer";
}

static inline int t_me(void)
{
    int me = 0;
    T_OK(ema_world_rank(&me));
    return me;
}

/* Copy [off, off+len) of this rank's own part of @win (based at @base) into @buf. */
static inline void own_read(ema_win_h win, const void *base, size_t off, void *buf, size_t len)
{
    if (len == 0) {
        return;
    }
    if (!test_kind_is_cuda()) {
        /* held, as ema(7) asks of loads of a range that may move */
        T_OK(ema_win_acquire(win, off, len));
        memcpy(buf, (const uint8_t *)base + off, len);
        T_OK(ema_win_release(win, off, len));
        return;
    }
    T_OK(ema_get(win, t_me(), off, buf, len));
}

/* Store @len bytes of @buf at @off of this rank's own part; visible to every
 * rank once it returns (flushed on cuda). */
static inline void own_write(ema_win_h win, void *base, size_t off, const void *buf, size_t len)
{
    if (len == 0) {
        return;
    }
    if (!test_kind_is_cuda()) {
        memcpy((uint8_t *)base + off, buf, len);
        return;
    }
    int me = t_me();
    T_OK(ema_put(win, me, off, buf, len));
    T_OK(ema_win_flush(win, me));
}

/* memset of [off, off+len) of the own part. */
static inline void own_memset(ema_win_h win, void *base, size_t off, int byte, size_t len)
{
    if (!test_kind_is_cuda()) {
        memset((uint8_t *)base + off, byte, len);
        return;
    }
    size_t chunk = len < ((size_t)16 << 20) ? len : ((size_t)16 << 20);
    uint8_t *tmp = malloc(chunk ? chunk : 1);
    if (tmp == NULL) {
        fprintf(stderr, "FAIL rank %d: malloc(%zu)\n", ema_t_rank, chunk);
        exit(1);
    }
    memset(tmp, byte, chunk);
    for (size_t o = 0; o < len; o += chunk) {
        own_write(win, base, off + o, tmp, len - o < chunk ? len - o : chunk);
    }
    free(tmp);
}

/*
 * A read-only view of [off, off+len) of the own part: the base pointer
 * itself on the host kind (plain loads), a copy read with ema_get on cuda.
 * The copy lives until the next own_view() call.
 */
static uint8_t *ema_t_view;
static size_t   ema_t_view_len;

static inline const uint8_t *own_view(ema_win_h win, const void *base, size_t off, size_t len)
{
    if (!test_kind_is_cuda()) {
        return (const uint8_t *)base + off;
    }
    if (len > ema_t_view_len) {
        free(ema_t_view);
        ema_t_view = malloc(len);
        if (ema_t_view == NULL) {
            fprintf(stderr, "FAIL rank %d: malloc(%zu)\n", ema_t_rank, len);
            exit(1);
        }
        ema_t_view_len = len;
    }
    own_read(win, base, off, ema_t_view, len);
    return ema_t_view;
}

/* One 64-bit word of the own part: an atomic load / store through the base
 * pointer on host (other ranks may write it meanwhile), ema_get / ema_put on
 * cuda. */
static inline uint64_t own_load_u64(ema_win_h win, const void *base, size_t off)
{
    uint64_t v = 0;
    if (!test_kind_is_cuda()) {
        return __atomic_load_n((const uint64_t *)((const uint8_t *)base + off), __ATOMIC_ACQUIRE);
    }
    own_read(win, base, off, &v, sizeof(v));
    return v;
}

static inline void own_store_u64(ema_win_h win, void *base, size_t off, uint64_t v)
{
    if (!test_kind_is_cuda()) {
        __atomic_store_n((uint64_t *)((uint8_t *)base + off), v, __ATOMIC_RELEASE);
        return;
    }
    own_write(win, base, off, &v, sizeof(v));
}

/*
 * Agree on the result: every rank adds its failure count into rank 0's word
 * through the library itself, so rank 0 prints one line for the whole world.
 * Each rank prints its own verdict too, so a log shows who failed.
 */
static inline int ema_test_finish(const char *prog)
{
    void *base;
    ema_win_h win;
    uint64_t total = 0;

    ema_t_current = "finish";
    T_OK(ema_win_allocate(sizeof(uint64_t), NULL, &base, &win));
    if (ema_t_rank == 0) {
        own_store_u64(win, base, 0, 0);
    }
    T_OK(ema_barrier());
    T_OK(ema_fetch_add(win, 0, 0, (uint64_t)ema_t_failures, NULL));
    T_OK(ema_barrier());
    T_OK(ema_get(win, 0, 0, &total, sizeof(total)));
    T_OK(ema_win_free(win));
    T_OK(ema_finalize());
    if (ema_t_rank == 0) {
        printf("%s %s: %d rank%s, %" PRIu64 " failed check%s\n", total ? "FAIL" : "PASS", prog,
               ema_t_size, ema_t_size == 1 ? "" : "s", total, total == 1 ? "" : "s");
    }
    fflush(stdout);
    return (total || ema_t_failures) ? 1 : 0;
}

/* Deterministic data: splitmix64. */
static inline uint64_t t_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t t_seed(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t s = a * 1000003u + b * 10007u + c + 1;
    t_rand(&s);
    return s;
}

/* The byte a writer @who stores at @offset of a target in phase @phase: every
 * rank can recompute what must be where. */
static inline uint8_t t_byte(int phase, int who, size_t offset)
{
    uint64_t x = (uint64_t)offset * 0x9e3779b97f4a7c15ull + (uint64_t)who * 0x632be59bd9b4e019ull +
                 (uint64_t)phase * 0x85ebca6bull;
    x ^= x >> 29;
    return (uint8_t)(x ^ (x >> 8) ^ 0x5a);
}

static inline void t_fill(uint8_t *buf, size_t len, int phase, int who, size_t offset)
{
    for (size_t i = 0; i < len; i++) {
        buf[i] = t_byte(phase, who, offset + i);
    }
}

/* Index of the first byte that differs from the pattern, or len. */
static inline size_t t_check(const uint8_t *buf, size_t len, int phase, int who, size_t offset)
{
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != t_byte(phase, who, offset + i)) {
            return i;
        }
    }
    return len;
}

/* FNV-1a, 64 bit. */
static inline uint64_t t_checksum(const void *buf, size_t len)
{
    const uint8_t *p = buf;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h = (h ^ p[i]) * 0x100000001b3ull;
    }
    return h;
}

static inline double t_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void *t_malloc(size_t len)
{
    void *p = malloc(len ? len : 1);
    if (p == NULL) {
        fprintf(stderr, "FAIL rank %d: malloc(%zu)\n", ema_t_rank, len);
        exit(1);
    }
    return p;
}

#endif
