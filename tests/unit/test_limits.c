/*
 * Size and value limits, in a world of one (issue 17): each value that used
 * to overflow, wrap or be taken as "no limit" is refused with one error line
 * naming it, the call changes nothing, and a sane value works afterwards.
 *   - ema_win_allocate: a part of more than EMA_WIN_MAX_SEGS segments
 *     (EMA_SEGMENT_SIZE=4K with max_size 2^44 overflowed the heap);
 *   - ema_init: a host arena larger than the machine (EMA_DEVICE_MEMORY=1T),
 *     arenas and spill tiers of more than EMA_MEM_MAX_SEGS segments, a lend
 *     reserve over the capacity, timeouts that are not finite numbers;
 *   - the cgroup memory limit, read from a fake /sys/fs/cgroup tree.
 * Check forks every test, so each test sets its own environment.
 */
#include <ema.h>

#include "mem/mem.h"
#include "win/win.h"

#include "check_main.h"
#include "log_capture.h"
#include "win_check.h"

#include <check.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SENTINEL ((void *)(uintptr_t)0x5e5e5e50)
#define CAP      ((size_t)64 << 20)

static void env_small(const char *seg)
{
    setenv("EMA_MEMORY_KIND", "host", 1);
    setenv("EMA_DEVICE_MEMORY", "64M", 1);
    setenv("EMA_SEGMENT_SIZE", seg, 1);
    setenv("EMA_SPILL_SIZE", "64M", 1);
    setenv("EMA_HUGEPAGES", "n", 1);
    setenv("EMA_LOG_LEVEL", "warn", 1);
}

/* stderr goes to a file between begin and end; end returns what was written. */
static ema_log_capture_t cap;

static void capture_begin(void)
{
    char path[] = "/tmp/ema-test-limits.XXXXXX";
    ck_assert_int_eq(ema_log_capture_begin(&cap, path), 0);
}

static const char *capture_end(void)
{
    static char log[8192];
    ema_log_capture_end(&cap, log, sizeof(log), 1); /* into the test's log too */
    return log;
}

#define count_lines ema_count_lines

/* One line, naming @what. */
static void assert_one_line_naming(const char *log, const char *what)
{
    ck_assert_msg(count_lines(log) == 1, "%d lines, expected one: %s", count_lines(log), log);
    ck_assert_msg(strstr(log, what) != NULL, "the line does not name %s: %s", what, log);
}

static void assert_not_initialised(void);

/* ema_init with @var=@val refused, in one line naming @var, and nothing
 * initialised. */
static void assert_init_refused(const char *var, const char *val)
{
    setenv(var, val, 1);
    capture_begin();
    ema_status_t s = ema_init(NULL);
    const char *log = capture_end();
    ck_assert_msg(s == EMA_ERR_INVALID_PARAM, "%s=%s gave %d (%s)", var, val, s, ema_strerror(s));
    assert_one_line_naming(log, var);
    assert_not_initialised();
}

static void assert_not_initialised(void)
{
    int r = 4242;
    ck_assert_int_eq(ema_world_rank(&r), EMA_ERR_STATE);
    ck_assert_int_eq(r, 4242);
}

/* --- ema_win_allocate ----------------------------------------------------- */

EMA_TEST("win_allocate", test_win_allocate_over_segment_limit_rejected_with_one_line)
{
    static const struct { size_t size, max; const char *name; } bad[] = {
        {4096, (size_t)1 << 44, "max_size"},                  /* 2^32 segments: wrapped to 0 */
        {(size_t)1 << 20, ((size_t)1 << 44) + 4096, "max_size"}, /* wrapped to 1 < 256: overflow */
        {4096, ((size_t)EMA_WIN_MAX_SEGS << 12) + 1, "max_size"}, /* one segment over */
        {((size_t)EMA_WIN_MAX_SEGS << 12) + 1, 0, "size"},    /* no max_size: size is it */
    };
    env_small("4K");
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ema_win_params_t p = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = bad[i].max};
        void *b = SENTINEL;
        ema_win_h w = SENTINEL;
        capture_begin();
        ema_status_t s = ema_win_allocate(bad[i].size, bad[i].max ? &p : NULL, &b, &w);
        const char *log = capture_end();
        ck_assert_msg(s == EMA_ERR_INVALID_PARAM, "size %zu max_size %zu gave %d (%s)",
                      bad[i].size, bad[i].max, s, ema_strerror(s));
        assert_one_line_naming(log, bad[i].name);
        ck_assert_ptr_nonnull(strstr(log, "EMA_SEGMENT_SIZE"));
        ck_assert_ptr_eq(b, SENTINEL);
        ck_assert_ptr_eq(w, SENTINEL);
    }
    ema_check_capacity_free(CAP);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("win_allocate", test_win_allocate_at_segment_limit_works_to_its_end)
{
    size_t max = (size_t)EMA_WIN_MAX_SEGS << 12; /* 1T of 4K segments */
    ema_win_params_t p = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = max};
    ema_win_stat_t st;
    uint64_t v = 0x1122334455667788ull, got = 0;
    void *b = NULL;
    ema_win_h w = NULL;
    env_small("4K");
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_allocate(1 << 20, &p, &b, &w), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_stat(w, &st), EMA_SUCCESS);
    ck_assert_uint_eq(st.max_size, max);
    ck_assert_int_eq(ema_win_grow(w, 2 << 20), EMA_SUCCESS);
    ck_assert_int_eq(ema_put(w, 0, (2 << 20) - 8, &v, 8), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_flush(w, 0), EMA_SUCCESS);
    ck_assert_int_eq(ema_get(w, 0, (2 << 20) - 8, &got, 8), EMA_SUCCESS);
    ck_assert_uint_eq(got, v);
    ck_assert_int_eq(ema_win_grow(w, max + 1), EMA_ERR_INVALID_PARAM);
    ck_assert_int_eq(ema_win_acquire(w, max - 4096, 4096), EMA_ERR_RANGE);
    ck_assert_int_eq(ema_win_shrink(w, 4096), EMA_SUCCESS);
    ck_assert_int_eq(ema_win_free(w), EMA_SUCCESS);
    ema_check_capacity_free(CAP);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

/* --- ema_init: memory against the machine --------------------------------- */

EMA_TEST("init", test_init_host_memory_above_machine_refused_then_init_works)
{
    const char *what;
    size_t limit = ema__mem_host_limit(&what);
    char val[64];
    if (limit > ((size_t)1 << 49)) {
        return; /* the machine's memory cannot be read here: nothing to refuse */
    }
    env_small("2M");
    snprintf(val, sizeof(val), "%zuM", (limit >> 20) + 1024);
    setenv("EMA_DEVICE_MEMORY", val, 1);
    capture_begin();
    ema_status_t s = ema_init(NULL);
    const char *log = capture_end();
    ck_assert_int_eq(s, EMA_ERR_NO_MEMORY);
    assert_one_line_naming(log, "EMA_DEVICE_MEMORY");
    ck_assert_ptr_nonnull(strstr(log, what));
    assert_not_initialised();

    setenv("EMA_DEVICE_MEMORY", "1T", 1); /* the case, on any machine below 1T */
    capture_begin();
    s = ema_init(NULL);
    log = capture_end();
    if (limit < ((size_t)1 << 40)) {
        ck_assert_int_eq(s, EMA_ERR_NO_MEMORY);
        assert_one_line_naming(log, "EMA_DEVICE_MEMORY");
    } else if (s == EMA_SUCCESS) {
        ema_finalize();
        return;
    }

    /* the same through ema_init_params_t: the line names the field */
    ema_init_params_t p = {.field_mask    = EMA_INIT_PARAM_FIELD_DEVICE_MEMORY,
                           .device_memory = limit + ((size_t)1 << 30)};
    setenv("EMA_DEVICE_MEMORY", "64M", 1);
    capture_begin();
    s = ema_init(&p);
    log = capture_end();
    ck_assert_int_eq(s, EMA_ERR_NO_MEMORY);
    assert_one_line_naming(log, "device_memory");
    assert_not_initialised();

    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    ema_check_capacity_free(CAP);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("init", test_init_memory_of_too_many_segments_refused_then_init_works)
{
    static const struct { const char *var, *val; } bad[] = {
        {"EMA_DEVICE_MEMORY", "2T"},   /* 2^29 segments of 4K */
        {"EMA_SPILL_SIZE", "1024T"},   /* 2^38 */
        {"EMA_SPILL_SIZE", "1025G"},   /* just over 2^28 */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        env_small("4K");
        assert_init_refused(bad[i].var, bad[i].val);
    }
    /* no spill tier: its size is not used, so not refused */
    env_small("4K");
    setenv("EMA_SPILL", "none", 1);
    setenv("EMA_SPILL_SIZE", "1024T", 1);
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

/* EMA_LEND_RESERVE=8192T wrapped to 0 segments and lent everything; now it
 * is refused, and a reserve over the capacity that is a valid size (1024T
 * with 4K segments: 2^38 segments, wrapping too) means "lend nothing". */
EMA_TEST("init", test_init_lend_reserve_over_capacity_lends_nothing_and_8192T_refused)
{
    ema_mem_stat_t m;
    env_small("4K");
    setenv("EMA_LEND_RESERVE", "8192T", 1);
    capture_begin();
    ema_status_t s = ema_init(NULL);
    const char *log = capture_end();
    ck_assert_int_eq(s, EMA_ERR_INVALID_PARAM);
    assert_one_line_naming(log, "EMA_LEND_RESERVE");
    assert_not_initialised();

    setenv("EMA_LEND_RESERVE", "1024T", 1);
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    ck_assert_int_eq(ema_mem_stat(&m), EMA_SUCCESS);
    ck_assert_uint_eq(m.capacity, CAP);
    ck_assert_uint_eq(m.reserve, CAP);
    ema_check_capacity_free(CAP);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

EMA_TEST("init", test_init_timeouts_not_finite_or_out_of_range_refused)
{
    static const struct { const char *var, *val; } bad[] = {
        {"EMA_RECLAIM_TIMEOUT", "nan"}, {"EMA_RECLAIM_TIMEOUT", "inf"},
        {"EMA_RECLAIM_TIMEOUT", "-inf"}, {"EMA_RECLAIM_TIMEOUT", "1e308"},
        {"EMA_RECLAIM_TIMEOUT", "-1"},  {"EMA_BOOT_TIMEOUT", "inf"},
        {"EMA_BOOT_TIMEOUT", "1e10"},   {"EMA_BOOT_TIMEOUT", "nan"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        env_small("64K");
        assert_init_refused(bad[i].var, bad[i].val);
        unsetenv(bad[i].var);
    }
    env_small("64K");
    setenv("EMA_RECLAIM_TIMEOUT", "1e9", 1);
    ck_assert_int_eq(ema_init(NULL), EMA_SUCCESS);
    ck_assert_int_eq(ema_finalize(), EMA_SUCCESS);
}
END_TEST

/* --- the cgroup memory limit ---------------------------------------------- */

static char tree[64];

static void put_file(const char *rel, const char *text)
{
    char path[512], dir[512];
    snprintf(path, sizeof(path), "%s/%s", tree, rel);
    snprintf(dir, sizeof(dir), "%s", path);
    for (char *p = dir + strlen(tree) + 1; *p; p++) { /* mkdir -p of the parents */
        if (*p == '/') {
            *p = '\0';
            mkdir(dir, 0700);
            *p = '/';
        }
    }
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static uint64_t limit_of(const char *self)
{
    char path[512];
    put_file("self", self);
    snprintf(path, sizeof(path), "%s/self", tree);
    char root[512];
    snprintf(root, sizeof(root), "%s/sys", tree);
    return ema__mem_cgroup_limit(path, root);
}

EMA_TEST("machine", test_cgroup_limit_is_the_lowest_of_a_cgroup_and_its_ancestors)
{
    snprintf(tree, sizeof(tree), "/tmp/ema-test-cgroup.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tree));

    /* no cgroup file, no limit files */
    ck_assert_uint_eq(ema__mem_cgroup_limit("/nonexistent/cgroup", "/nonexistent"), 0);
    ck_assert_uint_eq(limit_of("0::/a/b\n"), 0);
    /* v2: "max" below, a number above, the root has none */
    put_file("sys/a/b/memory.max", "max\n");
    put_file("sys/a/memory.max", "1073741824\n");
    ck_assert_uint_eq(limit_of("0::/a/b\n"), 1ull << 30);
    put_file("sys/a/b/memory.max", "536870912\n");
    ck_assert_uint_eq(limit_of("0::/a/b\n"), 512ull << 20);
    ck_assert_uint_eq(limit_of("0::/\n"), 0); /* the root: none */
    /* hybrid layout: v2 under unified/ */
    put_file("sys/unified/u/memory.max", "2147483648\n");
    ck_assert_uint_eq(limit_of("0::/u\n"), 2ull << 30);
    /* v1: "no limit" is a huge number; a real one counts */
    put_file("sys/memory/x/memory.limit_in_bytes", "9223372036854771712\n");
    ck_assert_uint_eq(limit_of("4:memory:/x\n0::/\n"), 0);
    put_file("sys/memory/memory.limit_in_bytes", "3221225472\n");
    ck_assert_uint_eq(limit_of("4:memory:/x\n0::/\n"), 3ull << 30);
    /* v1, memory among other controllers, and the lowest of v1 and v2 */
    put_file("sys/memory/y/memory.limit_in_bytes", "4194304\n");
    ck_assert_uint_eq(limit_of("7:cpu,memory:/y\n"), 4ull << 20);
    ck_assert_uint_eq(limit_of("7:cpu,memory:/y\n0::/a/b\n"), 4ull << 20);
    ck_assert_uint_eq(limit_of("4:memory:/x\n0::/a/b\n"), 512ull << 20);
    /* garbage lines are skipped */
    ck_assert_uint_eq(limit_of("garbage\n\n0::/a\n"), 1ull << 30);

    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tree);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

EMA_TEST("machine", test_host_limit_is_at_most_physical_memory)
{
    const char *what = NULL;
    size_t limit = ema__mem_host_limit(&what);
    long pages = sysconf(_SC_PHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
    ck_assert_ptr_nonnull(what);
    ck_assert_uint_gt(limit, 0);
    if (pages > 0 && pg > 0) {
        ck_assert_uint_le(limit, (size_t)pages * (size_t)pg);
    }
}
END_TEST

int main(void)
{
    ema_check_tcase_options("init", 20, NULL, NULL);
    return ema_check_main("limits", CK_ENV);
}
