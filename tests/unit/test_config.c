/* Configuration (src/util/config.h): size parsing with suffixes and bad
 * values, and ema__config_read on a table of this test's own, with values
 * from the environment (set with setenv), defaults, and bad values that fail
 * with one clear log line.  And the spill tier each memory kind gets from
 * EMA_SPILL and EMA_CUDA_SPILL (the pool's table): the cuda kind's is
 * opt-in. */
#include "util/config.h"
#include "runtime/runtime.h"
#include "xport/xport.h"

#include "check_main.h"
#include "log_capture.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SENT ((size_t)0x5e5e5e5e)

EMA_TEST("size", test_parse_size_accepts_plain_numbers_and_suffixes)
{
    static const struct { const char *s; size_t v; } ok[] = {
        {"0", 0},          {"1", 1},           {"4096", 4096},
        {"64K", 65536},    {"64k", 65536},     {"2M", 2u << 20},
        {"2m", 2u << 20},  {"2MB", 2u << 20},  {"2mb", 2u << 20},
        {"1G", 1u << 30},  {"3g", 3ull << 30}, {"1T", 1ull << 40},
        {"1024T", 1ull << 50} /* the largest */,
        {"1048576G", 1ull << 50}, {"1125899906842624", 1ull << 50},
        {" 2M ", 2u << 20},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        size_t v = SENT;
        ck_assert_msg(ema__config_parse_size(ok[i].s, &v) == 0, "'%s' rejected", ok[i].s);
        ck_assert_msg(v == ok[i].v, "'%s' parsed as %zu, expected %zu", ok[i].s, v, ok[i].v);
    }
}
END_TEST

/* Sizes above 1024T (2^50) are no machine's memory: they were accepted and
 * wrapped where they are counted in segments (EMA_LEND_RESERVE=8192T lent
 * everything). */
EMA_TEST("size", test_parse_size_rejects_bad_values_and_leaves_output)
{
    static const char *bad[] = {"",      " ",     "-1",   "+1",     "M",    "K2",   "2X",
                                "2MM",   "2KB5",  "1.5G", "0x10",   "abc",  "2 M x", "1e3",
                                "18446744073709551616",            /* 2^64 */
                                "99999999999999999999999",        /* way over */
                                "16777216T",                      /* 2^64 */
                                "17179869184G",                   /* 2^64 */
                                "18014398509481984K",             /* 2^64 */
                                "1025T", "8192T", "16384T",       /* over 2^50 */
                                "1048577G", "1125899906842625",   /* 2^50 + 1 unit */
                                "18446744073709551615"};          /* SIZE_MAX */
    ck_assert_int_ne(ema__config_parse_size(NULL, &(size_t){0}), 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        size_t v = SENT;
        ck_assert_msg(ema__config_parse_size(bad[i], &v) != 0, "'%s' accepted as %zu", bad[i],
                      v);
        ck_assert_msg(v == SENT, "'%s' rejected but wrote %zu", bad[i], v);
    }
}
END_TEST

/* A module config of this test's own. */
typedef struct {
    size_t   size;
    size_t   seg;
    int      flag;
    unsigned count;
    double   ratio;
    int      mode;
} cfg_t;

static const char *mode_names[] = {"fast", "safe", "off", NULL};
static const ema_config_parser_t mode_parser = EMA_CONFIG_ENUM(mode_names);

static const ema_config_field_t table[] = {
    {"UTEST_SIZE", "256M", "a size", offsetof(cfg_t, size), &ema__config_size},
    {"UTEST_SEG", "auto", "a size or auto", offsetof(cfg_t, seg), &ema__config_size_auto},
    {"UTEST_FLAG", "n", "a bool", offsetof(cfg_t, flag), &ema__config_bool},
    {"UTEST_COUNT", "7", "an unsigned", offsetof(cfg_t, count), &ema__config_uint},
    {"UTEST_RATIO", "0.5", "a double", offsetof(cfg_t, ratio), &ema__config_double},
    {"UTEST_MODE", "safe", "an enum", offsetof(cfg_t, mode), &mode_parser},
    EMA_CONFIG_TABLE_END};

static void clear_env(void)
{
    for (const ema_config_field_t *f = table; f->name != NULL; f++) {
        char var[64];
        snprintf(var, sizeof(var), "EMA_%s", f->name);
        unsetenv(var);
    }
}

EMA_TEST("read", test_read_fills_defaults_when_environment_is_unset)
{
    cfg_t c;
    memset(&c, 0xff, sizeof(c));
    clear_env();
    ck_assert_int_eq(ema__config_read(table, &c), EMA_SUCCESS);
    ck_assert_uint_eq(c.size, 256u << 20);
    ck_assert_uint_eq(c.seg, 0); /* auto */
    ck_assert_int_eq(c.flag, 0);
    ck_assert_uint_eq(c.count, 7);
    ck_assert_double_eq(c.ratio, 0.5);
    ck_assert_int_eq(c.mode, 1);
}
END_TEST

EMA_TEST("read", test_read_takes_values_from_environment)
{
    cfg_t c;
    clear_env();
    setenv("EMA_UTEST_SIZE", "2G", 1);
    setenv("EMA_UTEST_SEG", "64K", 1);
    setenv("EMA_UTEST_FLAG", "yes", 1);
    setenv("EMA_UTEST_COUNT", "4294967295", 1);
    setenv("EMA_UTEST_RATIO", "1e-3", 1);
    setenv("EMA_UTEST_MODE", "OFF", 1);
    ck_assert_int_eq(ema__config_read(table, &c), EMA_SUCCESS);
    ck_assert_uint_eq(c.size, 2ull << 30);
    ck_assert_uint_eq(c.seg, 65536);
    ck_assert_int_eq(c.flag, 1);
    ck_assert_uint_eq(c.count, 4294967295u);
    ck_assert_double_eq_tol(c.ratio, 1e-3, 1e-12);
    ck_assert_int_eq(c.mode, 2);
    static const char *yes[] = {"1", "y", "on", "TRUE"}, *no[] = {"0", "N", "off", "false"};
    for (int i = 0; i < 4; i++) {
        setenv("EMA_UTEST_FLAG", yes[i], 1);
        ck_assert_int_eq(ema__config_read(table, &c), EMA_SUCCESS);
        ck_assert_msg(c.flag == 1, "'%s' is not true", yes[i]);
        setenv("EMA_UTEST_FLAG", no[i], 1);
        ck_assert_int_eq(ema__config_read(table, &c), EMA_SUCCESS);
        ck_assert_msg(c.flag == 0, "'%s' is not false", no[i]);
    }
    setenv("EMA_UTEST_SEG", "AUTO", 1);
    ck_assert_int_eq(ema__config_read(table, &c), EMA_SUCCESS);
    ck_assert_uint_eq(c.seg, 0);
}
END_TEST

/* Run ema__config_read with stderr captured; returns the status. */
static ema_status_t read_capturing(cfg_t *c, char *log, size_t max)
{
    char path[] = "/tmp/ema-test-config.XXXXXX";
    ema_log_capture_t cap;
    ck_assert_int_eq(ema_log_capture_begin(&cap, path), 0);
    ema_status_t s = ema__config_read(table, c);
    ema_log_capture_end(&cap, log, max, 0);
    return s;
}

#define count_lines ema_count_lines

/* With only @var=@val set, reading into @c fails, logging one line into
 * @log. */
static void read_refused_in_one_line(const char *var, const char *val, cfg_t *c, char *log,
                                     size_t max)
{
    clear_env();
    setenv(var, val, 1);
    ck_assert_msg(read_capturing(c, log, max) == EMA_ERR_INVALID_PARAM, "%s='%s' accepted", var,
                  val);
    ck_assert_msg(count_lines(log) == 1, "%s='%s' logged %d lines: %s", var, val,
                  count_lines(log), log);
}

EMA_TEST("read", test_read_bad_value_fails_with_one_line_naming_variable_and_value)
{
    static const struct { const char *var, *val; } bad[] = {
        {"EMA_UTEST_SIZE", "12Q"},  {"EMA_UTEST_SIZE", "-5"},     {"EMA_UTEST_SEG", "autox"},
        {"EMA_UTEST_FLAG", "maybe"}, {"EMA_UTEST_COUNT", "-1"},   {"EMA_UTEST_COUNT", "4294967296"},
        {"EMA_UTEST_COUNT", "7x"},  {"EMA_UTEST_RATIO", "-0.5"}, {"EMA_UTEST_RATIO", "half"},
        {"EMA_UTEST_SIZE", "8192T"}, {"EMA_UTEST_MODE", "turbo"}};
    char log[4096];
    cfg_t c;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        read_refused_in_one_line(bad[i].var, bad[i].val, &c, log, sizeof(log));
        ck_assert_msg(strstr(log, bad[i].var) != NULL, "log does not name %s: %s", bad[i].var,
                      log);
        ck_assert_msg(strstr(log, bad[i].val) != NULL, "log does not show '%s': %s",
                      bad[i].val, log);
    }
    /* the enum's line lists the accepted names */
    ck_assert_ptr_nonnull(strstr(log, "fast"));
    ck_assert_ptr_nonnull(strstr(log, "safe"));
    /* fixed: the same table reads cleanly */
    clear_env();
    ck_assert_int_eq(read_capturing(&c, log, sizeof(log)), EMA_SUCCESS);
    ck_assert_str_eq(log, "");
}
END_TEST

/* Timeouts: nan, inf and huge values meant "no timeout" or overflowed the
 * integer they become; each is now refused with one line and the field keeps
 * its default. */
/* A bad value fails the read, but every other field still gets what the
 * environment sets: ema_config_print (ema_info -c) showed EMA_SPILL=none,
 * EMA_SPILL_SIZE=0 and more after one bad EMA_LEND_RESERVE, since the read
 * stopped at it and left the rest zeroed. */
EMA_TEST("read", test_read_bad_value_leaves_the_other_fields_read)
{
    cfg_t c;
    char log[1024];
    memset(&c, 0, sizeof(c));
    clear_env();
    setenv("EMA_UTEST_SIZE", "12Q", 1);   /* first: bad */
    setenv("EMA_UTEST_FLAG", "yes", 1);
    setenv("EMA_UTEST_COUNT", "9", 1);
    setenv("EMA_UTEST_RATIO", "what", 1); /* bad too: both reported */
    ck_assert_int_eq(read_capturing(&c, log, sizeof(log)), EMA_ERR_INVALID_PARAM);
    ck_assert_msg(count_lines(log) == 2, "2 bad values logged %d lines: %s", count_lines(log),
                  log);
    ck_assert_uint_eq(c.size, 256u << 20); /* its default */
    ck_assert_int_eq(c.flag, 1);
    ck_assert_uint_eq(c.count, 9);
    ck_assert_double_eq(c.ratio, 0.5);     /* its default */
    ck_assert_int_eq(c.mode, 1);           /* unset: the default */
    clear_env();
}
END_TEST

/* A variable named in the skip list is not read, bad or not: ema_init's
 * parameters override it (ema.h). */
EMA_TEST("read", test_read_skip_ignores_the_variables_named)
{
    static const char *const skip[] = {"UTEST_SIZE", NULL};
    cfg_t c;
    clear_env();
    setenv("EMA_UTEST_SIZE", "lots", 1);
    setenv("EMA_UTEST_COUNT", "3", 1);
    ck_assert_int_eq(ema__config_read_skip(table, &c, skip), EMA_SUCCESS);
    ck_assert_uint_eq(c.size, 256u << 20);
    ck_assert_uint_eq(c.count, 3);
    setenv("EMA_UTEST_SIZE", "1M", 1);
    ck_assert_int_eq(ema__config_read_skip(table, &c, skip), EMA_SUCCESS);
    ck_assert_uint_eq(c.size, 256u << 20);
    clear_env();
}
END_TEST

EMA_TEST("read", test_read_double_rejects_nan_inf_negative_and_out_of_range)
{
    static const char *bad[] = {"nan", "NaN", "-nan", "inf", "-inf", "+inf", "infinity",
                                "1e308", "1e309", "1e10", "1000000001", "-1", "-0", "-0.0",
                                "+1", "", " ", ".", "e3", "1e", "2s", "0.5x", "1,5",
                                "0x1p1000", "0x10", "0x1.8p0", "1p3"};
    char log[4096];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cfg_t c;
        read_refused_in_one_line("EMA_UTEST_RATIO", bad[i], &c, log, sizeof(log));
        ck_assert_msg(strstr(log, "EMA_UTEST_RATIO") != NULL, "log: %s", log);
        ck_assert_msg(strstr(log, "1e9") != NULL, "log does not give the bound: %s", log);
        ck_assert_double_eq(c.ratio, 0.5); /* the default, restored */
    }
    static const struct { const char *s; double v; } ok[] = {
        {"0", 0}, {"0.0", 0}, {".5", 0.5}, {"2", 2}, {"1e-3", 1e-3}, {"1e9", 1e9},
        {"1000000000", 1e9}, {" 3", 3}, {"3 ", 3}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        cfg_t c;
        clear_env();
        setenv("EMA_UTEST_RATIO", ok[i].s, 1);
        ck_assert_msg(ema__config_read(table, &c) == EMA_SUCCESS, "'%s' rejected", ok[i].s);
        ck_assert_double_eq_tol(c.ratio, ok[i].v, 1e-12);
    }
}
END_TEST

/* Unsigned numbers: 32 bits, digits only. */
EMA_TEST("read", test_read_uint_rejects_overflow_signs_spaces_and_garbage)
{
    static const char *bad[] = {"4294967296", "18446744073709551616", "99999999999999999999",
                                "-1", "-0", "+1", " 1", "1 ", "", "0x10", "1e3", "1.0", "7x"};
    char log[4096];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cfg_t c;
        read_refused_in_one_line("EMA_UTEST_COUNT", bad[i], &c, log, sizeof(log));
        ck_assert_uint_eq(c.count, 7);
    }
}
END_TEST

/* Booleans and enums match a whole word (any case), nothing more. */
EMA_TEST("read", test_read_bool_and_enum_reject_prefixes_suffixes_and_empty)
{
    static const struct { const char *var, *val; } bad[] = {
        {"EMA_UTEST_FLAG", ""},      {"EMA_UTEST_FLAG", "ye"},   {"EMA_UTEST_FLAG", "yess"},
        {"EMA_UTEST_FLAG", " y"},    {"EMA_UTEST_FLAG", "y "},   {"EMA_UTEST_FLAG", "2"},
        {"EMA_UTEST_FLAG", "-1"},    {"EMA_UTEST_MODE", ""},     {"EMA_UTEST_MODE", "fas"},
        {"EMA_UTEST_MODE", "fastx"}, {"EMA_UTEST_MODE", "0"},    {"EMA_UTEST_MODE", "safe "},
        {"EMA_UTEST_SEG", ""},       {"EMA_UTEST_SEG", "autox"}, {"EMA_UTEST_SEG", "2048T"}};
    char log[4096];
    cfg_t c;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        read_refused_in_one_line(bad[i].var, bad[i].val, &c, log, sizeof(log));
    }
}
END_TEST

EMA_TEST("read", test_print_shows_each_variable_with_value_and_default)
{
    cfg_t c;
    char out[8192] = "";
    clear_env();
    setenv("EMA_UTEST_SIZE", "64K", 1);
    ck_assert_int_eq(ema__config_read(table, &c), EMA_SUCCESS);
    FILE *f = fmemopen(out, sizeof(out) - 1, "w");
    ema__config_print(table, &c, f);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(out, "EMA_UTEST_SIZE=64K"));
    ck_assert_ptr_nonnull(strstr(out, "256M")); /* the default */
    ck_assert_ptr_nonnull(strstr(out, "EMA_UTEST_SEG=auto"));
    ck_assert_ptr_nonnull(strstr(out, "EMA_UTEST_MODE=safe"));
    ck_assert_ptr_nonnull(strstr(out, "fast|safe|off"));
}
END_TEST

/* EMA_SPILL and EMA_CUDA_SPILL, read from the pool's own table. */
static ema__pool_config_t read_pool_cfg(const char *spill, const char *cuda_spill)
{
    ema__pool_config_t c;
    memset(&c, 0x5e, sizeof(c));
    unsetenv("EMA_SPILL");
    unsetenv("EMA_CUDA_SPILL");
    if (spill != NULL) {
        setenv("EMA_SPILL", spill, 1);
    }
    if (cuda_spill != NULL) {
        setenv("EMA_CUDA_SPILL", cuda_spill, 1);
    }
    ck_assert_int_eq(ema__config_read(ema__pool_config_table, &c), EMA_SUCCESS);
    unsetenv("EMA_SPILL");
    unsetenv("EMA_CUDA_SPILL");
    return c;
}

EMA_TEST("spill", test_cuda_spill_is_off_by_default_and_opt_in)
{
    ema__pool_config_t c = read_pool_cfg(NULL, NULL);
    ck_assert_int_eq(c.spill, 1); /* EMA_SPILL=host */
    ck_assert_int_eq(c.cuda_spill, 0);
    ck_assert_int_eq(ema__runtime_spill_tier(&c, EMA_MEMORY_KIND_HOST), EMA_SPILL_TIER_HOST);
    ck_assert_int_eq(ema__runtime_spill_tier(&c, EMA_MEMORY_KIND_CUDA), EMA_SPILL_TIER_NONE);

    static const char *yes[] = {"y", "yes", "1", "on", "TRUE"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        c = read_pool_cfg(NULL, yes[i]);
        ck_assert_msg(c.cuda_spill == 1, "EMA_CUDA_SPILL=%s not read as on", yes[i]);
        ck_assert_int_eq(ema__runtime_spill_tier(&c, EMA_MEMORY_KIND_CUDA),
                         EMA_SPILL_TIER_CUDA_HOST);
        ck_assert_int_eq(ema__runtime_spill_tier(&c, EMA_MEMORY_KIND_HOST), EMA_SPILL_TIER_HOST);
    }
    c = read_pool_cfg(NULL, "n");
    ck_assert_int_eq(ema__runtime_spill_tier(&c, EMA_MEMORY_KIND_CUDA), EMA_SPILL_TIER_NONE);
    /* EMA_SPILL=none wins on every kind */
    c = read_pool_cfg("none", "y");
    ck_assert_int_eq(ema__runtime_spill_tier(&c, EMA_MEMORY_KIND_CUDA), EMA_SPILL_TIER_NONE);
    ck_assert_int_eq(ema__runtime_spill_tier(&c, EMA_MEMORY_KIND_HOST), EMA_SPILL_TIER_NONE);
}
END_TEST

/* The pool's table read with @var=@val refuses it, naming @var. */
static void assert_pool_var_refused(const char *var, const char *val)
{
    char path[] = "/tmp/ema-test-config.XXXXXX", log[1024] = "";
    ema_log_capture_t cap;
    ema__pool_config_t c;
    setenv(var, val, 1);
    ck_assert_int_eq(ema_log_capture_begin(&cap, path), 0);
    ema_status_t s = ema__config_read(ema__pool_config_table, &c);
    ema_log_capture_end(&cap, log, sizeof(log), 0);
    unsetenv(var);
    ck_assert_int_eq(s, EMA_ERR_INVALID_PARAM);
    ck_assert_msg(strstr(log, var) != NULL, "%s not named: %s", var, log);
}

EMA_TEST("spill", test_cuda_spill_bad_value_fails_the_read_naming_it)
{
    assert_pool_var_refused("EMA_CUDA_SPILL", "maybe");
}
END_TEST

/* EMA_RECLAIM_WAIT: auto by default, spin and nap taken, anything else
 * refused with the variable named; auto spins only where each rank and its
 * progress thread have a core (pool/lender.c). */
EMA_TEST("reclaim", test_reclaim_wait_values)
{
    static const struct { const char *val; int want; } ok[] = {
        {NULL, EMA_POOL_RECLAIM_WAIT_AUTO}, {"auto", EMA_POOL_RECLAIM_WAIT_AUTO},
        {"spin", EMA_POOL_RECLAIM_WAIT_SPIN}, {"nap", EMA_POOL_RECLAIM_WAIT_NAP}};
    ema__pool_config_t c;
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        memset(&c, 0x5e, sizeof(c));
        unsetenv("EMA_RECLAIM_WAIT");
        if (ok[i].val != NULL) {
            setenv("EMA_RECLAIM_WAIT", ok[i].val, 1);
        }
        ck_assert_int_eq(ema__config_read(ema__pool_config_table, &c), EMA_SUCCESS);
        ck_assert_int_eq(c.reclaim_wait, ok[i].want);
    }
    assert_pool_var_refused("EMA_RECLAIM_WAIT", "sleep");

    ck_assert_int_eq(ema__xport_cores_plentiful(2, 4), 1);
    ck_assert_int_eq(ema__xport_cores_plentiful(4, 16), 1);
    ck_assert_int_eq(ema__xport_cores_plentiful(4, 2), 0); /* the CI machine */
    ck_assert_int_eq(ema__xport_cores_plentiful(3, 5), 0);
    ck_assert_int_eq(ema__xport_cores_plentiful(1, 0), 0); /* unknown */
}
END_TEST

int main(void)
{
    return ema_check_main("config", CK_ENV);
}
