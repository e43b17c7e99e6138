/*
 * What every Check program of tests/unit and tests/topo does around its
 * tests.  Each test names its test case where it is defined:
 *
 *   EMA_TEST("rma", test_put_beyond_part_returns_range)
 *   {
 *       ...
 *   }
 *   END_TEST
 *
 * and main() is one call, ema_check_main("suite", CK_ENV): it puts the
 * tests into their test cases, in the order they are defined (test cases
 * in the order of their first test), runs the suite (automake's harness
 * keeps Check's summary in the test's .log) and returns EXIT_SUCCESS only
 * when every test passed.  A test case that needs its own timeout or
 * fixture says so before that call:
 *
 *   ema_check_tcase_options("init", 20, NULL, NULL);
 */
#ifndef EMA_TESTS_CHECK_MAIN_H_
#define EMA_TESTS_CHECK_MAIN_H_

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EMA_CHECK_MAX_TESTS 128

static struct {
    const char        *tcase;
    const TTest *const *test;
} ema_check_tests[EMA_CHECK_MAX_TESTS];
static int ema_check_ntests;

static inline void ema_check_register(const char *tcase, const TTest *const *test)
{
    if (ema_check_ntests == EMA_CHECK_MAX_TESTS) {
        fprintf(stderr, "check_main.h: more than %d tests\n", EMA_CHECK_MAX_TESTS);
        abort();
    }
    ema_check_tests[ema_check_ntests].tcase = tcase;
    ema_check_tests[ema_check_ntests].test  = test;
    ema_check_ntests++;
}

/* START_TEST(@_name), and the test joins test case @_tcase (a string) of
 * the suite ema_check_main runs.  Registered before main() runs. */
#define EMA_TEST(_tcase, _name)                                                \
    static const TTest *_name;                                                 \
    __attribute__((constructor)) static void _name##_register(void)            \
    {                                                                          \
        ema_check_register(_tcase, &_name);                                    \
    }                                                                          \
    START_TEST(_name)

#define EMA_CHECK_MAX_OPTIONS 16

static struct {
    const char *tcase;
    double      timeout;
    SFun        setup, teardown;
} ema_check_options[EMA_CHECK_MAX_OPTIONS];
static int ema_check_noptions;

/* Test case @tcase runs with timeout @timeout seconds (0: Check's default)
 * and, where @setup or @teardown is not NULL, that checked fixture (after
 * any fixture of ema_check_main_fixture).  Call before ema_check_main. */
static inline void ema_check_tcase_options(const char *tcase, double timeout, SFun setup,
                                           SFun teardown)
{
    if (ema_check_noptions == EMA_CHECK_MAX_OPTIONS) {
        fprintf(stderr, "check_main.h: more than %d test case options\n", EMA_CHECK_MAX_OPTIONS);
        abort();
    }
    ema_check_options[ema_check_noptions].tcase    = tcase;
    ema_check_options[ema_check_noptions].timeout  = timeout;
    ema_check_options[ema_check_noptions].setup    = setup;
    ema_check_options[ema_check_noptions].teardown = teardown;
    ema_check_noptions++;
}

/* The test case @name of @s, created and added to @s on first use. */
static inline TCase *ema_check_tcase(Suite *s, TCase **tcs, const char **names, int *n,
                                     const char *name)
{
    for (int i = 0; i < *n; i++) {
        if (strcmp(names[i], name) == 0) {
            return tcs[i];
        }
    }
    tcs[*n]   = tcase_create(name);
    names[*n] = name;
    suite_add_tcase(s, tcs[*n]);
    return tcs[(*n)++];
}

/* Run every EMA_TEST of this program as suite @suite, printing as @mode
 * says (CK_ENV: as CK_VERBOSITY says, normal by default).  @setup and
 * @teardown, where not NULL, are a checked fixture of every test case. */
static inline int ema_check_main_fixture(const char *suite, enum print_output mode,
                                         SFun setup, SFun teardown)
{
    Suite *s = suite_create(suite);
    TCase *tcs[EMA_CHECK_MAX_TESTS];
    const char *names[EMA_CHECK_MAX_TESTS];
    int ntcs = 0;

    for (int i = 0; i < ema_check_ntests; i++) {
        TCase *tc = ema_check_tcase(s, tcs, names, &ntcs, ema_check_tests[i].tcase);
        tcase_add_test(tc, *ema_check_tests[i].test);
    }
    for (int i = 0; i < ntcs && (setup != NULL || teardown != NULL); i++) {
        tcase_add_checked_fixture(tcs[i], setup, teardown);
    }
    for (int i = 0; i < ema_check_noptions; i++) {
        for (int j = 0; j < ntcs; j++) {
            if (strcmp(names[j], ema_check_options[i].tcase) != 0) {
                continue;
            }
            if (ema_check_options[i].setup != NULL || ema_check_options[i].teardown != NULL) {
                tcase_add_checked_fixture(tcs[j], ema_check_options[i].setup,
                                          ema_check_options[i].teardown);
            }
            if (ema_check_options[i].timeout > 0) {
                tcase_set_timeout(tcs[j], ema_check_options[i].timeout);
            }
        }
    }
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, mode);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

static inline int ema_check_main(const char *suite, enum print_output mode)
{
    return ema_check_main_fixture(suite, mode, NULL, NULL);
}

/* A world of one: nothing a launcher may have left in the environment
 * sends ema_init looking for a PMIx server. */
static inline void ema_check_world_of_one(void)
{
    static const char *const vars[] = {"PMIX_NAMESPACE",    "PMIX_RANK",        "PMIX_SERVER_URI4",
                                       "PMIX_SERVER_URI41", "PMIX_SERVER_URI3", "PMIX_SERVER_URI2",
                                       "PMIX_SERVER_URI21"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        unsetenv(vars[i]);
    }
}

#endif
