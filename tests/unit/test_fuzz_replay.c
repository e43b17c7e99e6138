/*
 * The fuzz corpus replayed under the normal build (tests/fuzz): every file
 * of tests/fuzz/corpus, and every entry of the corpus as code, through the
 * same entry point as the fuzzer (ema__am_fuzz_one_ex: a fresh world of
 * plain memory, the real dispatch point and handlers, the jobs they queue,
 * the world's invariants).  By name:
 *   valid-*       accepted: nothing logged as malformed, and something
 *                 happened (state or a reply), but for valid-noop-*;
 *   repro-*       dropped as malformed, with no change and no reply;
 *   ends-*        a malformed answer to a live request: dropped as
 *                 malformed (the request ends with nothing);
 *   anything else (what the fuzzer keeps) runs without a crash.
 */
#include "../fuzz/fuzz_world.h"

#include "check_main.h"
#include "xport/xport.h"

#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef EMA_FUZZ_CORPUS
#error "EMA_FUZZ_CORPUS: the corpus directory"
#endif

static int has_prefix(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}

static void replay(const char *name, const uint8_t *data, size_t len, void *arg)
{
    ema_fuzz_result_t r;
    int *counts = arg;

    ck_assert_int_eq(ema__am_fuzz_one_ex(data, len, &r), 0);
    if (has_prefix(name, "valid-")) {
        ck_assert_msg(r.malformed == 0, "%s: %lu malformed", name, r.malformed);
        ck_assert_msg(has_prefix(name, "valid-noop-") || r.changed || r.sends > 0,
                      "%s: accepted, but did nothing", name);
        counts[0]++;
    } else if (has_prefix(name, "repro-")) {
        ck_assert_msg(r.malformed > 0, "%s: not logged as malformed", name);
        ck_assert_msg(!r.changed, "%s: changed the receiver's state", name);
        ck_assert_msg(r.sends == 0, "%s: answered (%d messages)", name, r.sends);
        counts[1]++;
    } else if (has_prefix(name, "ends-")) {
        ck_assert_msg(r.malformed > 0, "%s: not logged as malformed", name);
        counts[2]++;
    } else {
        counts[3]++;
    }
}

EMA_TEST("replay", test_corpus_as_code)
{
    int counts[4] = {0};
    int n = ema_fuzz_corpus(replay, counts);
    ck_assert_int_ge(n, 40);
    ck_assert_int_ge(counts[0], 20);
    ck_assert_int_ge(counts[1], 20);
}
END_TEST

/* Every file of the corpus directory. */
EMA_TEST("replay", test_corpus_files)
{
    int counts[4] = {0};
    DIR *d = opendir(EMA_FUZZ_CORPUS);
    struct dirent *e;
    int files = 0;

    ck_assert_msg(d != NULL, "cannot open %s", EMA_FUZZ_CORPUS);
    while ((e = readdir(d)) != NULL) {
        char path[4096];
        static uint8_t data[1 << 20];
        if (e->d_name[0] == '.') {
            continue;
        }
        snprintf(path, sizeof(path), "%s/%s", EMA_FUZZ_CORPUS, e->d_name);
        FILE *f = fopen(path, "rb");
        ck_assert_msg(f != NULL, "cannot open %s", path);
        size_t len = fread(data, 1, sizeof(data), f);
        fclose(f);
        /* an exact copy: reads past the end are ASan's to see */
        uint8_t *copy = malloc(len ? len : 1);
        ck_assert_ptr_nonnull(copy);
        memcpy(copy, data, len);
        replay(e->d_name, copy, len, counts);
        free(copy);
        files++;
    }
    closedir(d);
    ck_assert_int_ge(files, 40);
}
END_TEST

/* The files hold what the code says (gen_corpus writes them). */
static void same_as_file(const char *name, const uint8_t *data, size_t len, void *arg)
{
    char path[4096];
    uint8_t buf[4096];

    snprintf(path, sizeof(path), "%s/%s", EMA_FUZZ_CORPUS, name);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s missing: run tests/fuzz/gen_corpus %s", path,
                  EMA_FUZZ_CORPUS);
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    ck_assert_msg(n == len && memcmp(buf, data, len) == 0,
                  "%s differs from fuzz_corpus.c: run tests/fuzz/gen_corpus %s", path,
                  EMA_FUZZ_CORPUS);
}

EMA_TEST("replay", test_corpus_files_match_code)
{
    ema_fuzz_corpus(same_as_file, NULL);
}
END_TEST

/* The harness's own edges: empty and short inputs, every id. */
EMA_TEST("replay", test_short_inputs_and_every_id)
{
    uint8_t buf[EMA_FUZZ_HDR + 8] = {0};
    for (size_t len = 0; len <= sizeof(buf); len++) {
        ck_assert_int_eq(ema__am_fuzz_one(buf, len), 0);
    }
    for (int id = 0; id < 256; id++) {
        buf[0] = (uint8_t)id;
        ck_assert_int_eq(ema__am_fuzz_one(buf, sizeof(buf)), 0);
    }
}
END_TEST

static int nheard;

static void count_cb(void *arg, int src, const void *data, size_t len)
{
    (void)arg, (void)src, (void)data, (void)len;
    nheard++;
}

/* ema_finalize closes the dispatch point before it tears down the layers
 * behind the handlers: a peer's late message then reaches none. */
EMA_TEST("replay", test_closed_dispatch_reaches_no_handler)
{
    ema__xport_t x;
    uint64_t word = 0;

    memset(&x, 0, sizeof(x)); /* no UCX worker: the dispatch point alone */
    x.rank = 0;
    x.size = 2;
    ema__xport_set_am_handler(&x, 1, count_cb, NULL);
    ema__xport_am_dispatch(&x, 1, 1, &word, sizeof(word));
    ck_assert_int_eq(nheard, 1);
    ema__xport_am_close(&x);
    ema__xport_am_dispatch(&x, 1, 1, &word, sizeof(word));
    ck_assert_int_eq(nheard, 1);
}
END_TEST

int main(void)
{
    ema_check_tcase_options("replay", 60, NULL, NULL);
    return ema_check_main("fuzz_replay", CK_ENV);
}
