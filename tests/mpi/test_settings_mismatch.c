/*
 * Settings every rank must share, and the memory of the world against the
 * machine's, are checked once every rank's are known (the address exchange
 * of ema_init).  A world that fails the check fails ema_init on every rank,
 * promptly (EMA_BOOT_TIMEOUT is far away), with one error line per rank
 * naming the setting, leaves the library uninitialised, fails the same way
 * when called again, and initialises once the settings are fixed:
 *
 *   test_settings_mismatch spill    rank 1 has EMA_SPILL=none, the others host
 *   test_settings_mismatch segment  rank 1 has EMA_SEGMENT_SIZE=128K, the others 64K
 *   test_settings_mismatch memory   every rank asks for 60% of the machine's
 *                                   memory: each fits, together they do not
 *
 * A rank learns its rank from the launcher's environment (PMIX_RANK) before
 * ema_init, to take its odd value.  The script passes the common values.
 */
#include "common.h"
#include "../unit/log_capture.h"

#include <fcntl.h>

/* ema_init with stderr captured into @log; returns the status. */
static ema_status_t init_capturing(char *log, size_t max, double *secs_p)
{
    char path[] = "/tmp/ema-test-mismatch.XXXXXX";
    ema_log_capture_t cap;
    if (ema_log_capture_begin(&cap, path) != 0) {
        fprintf(stderr, "FAIL: mkstemp/dup: %m\n");
        exit(1);
    }
    double t0 = t_now();
    ema_status_t s = ema_init(NULL);
    *secs_p = t_now() - t0;
    ema_log_capture_end(&cap, log, max, 1); /* for the test's log */
    return s;
}

#define count_lines ema_count_lines

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "spill";
    const char *env_rank = getenv("PMIX_RANK");
    int rank = env_rank ? atoi(env_rank) : 0;
    const char *var, *odd, *fixed, *named;
    ema_status_t want;
    char big[64];

    ema_t_catch_crashes();
    ema_t_rank = rank; /* for the FAIL lines, before ema_init */
    if (strcmp(mode, "spill") == 0) {
        var = "EMA_SPILL", odd = (rank == 1) ? "none" : NULL, fixed = "host";
        named = "EMA_SPILL", want = EMA_ERR_INVALID_PARAM;
    } else if (strcmp(mode, "segment") == 0) {
        var = "EMA_SEGMENT_SIZE", odd = (rank == 1) ? "128K" : NULL, fixed = "64K";
        named = "EMA_SEGMENT_SIZE", want = EMA_ERR_INVALID_PARAM;
    } else if (strcmp(mode, "memory") == 0) {
        long pages = sysconf(_SC_PHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
        size_t mib = (size_t)pages * (size_t)pg / 10 * 6 >> 20;
        snprintf(big, sizeof(big), "%zuM", mib);
        var = "EMA_DEVICE_MEMORY", odd = big, fixed = "64M";
        named = "EMA_DEVICE_MEMORY", want = EMA_ERR_NO_MEMORY;
    } else {
        fprintf(stderr, "usage: test_settings_mismatch spill|segment|memory\n");
        return 2;
    }
    if (odd != NULL) {
        setenv(var, odd, 1);
    }

    /* twice: a failed ema_init leaves the process able to call it again */
    for (int round = 1; round <= 2; round++) {
        char log[8192];
        double secs;
        int r = 4242;
        ema_t_current = round == 1 ? "test_mismatch_fails_init_on_every_rank"
                                   : "test_mismatch_fails_init_again_the_same_way";
        ema_status_t s = init_capturing(log, sizeof(log), &secs);
        T_STATUS(s, want);
        T_EXPECT(secs < 20.0, "ema_init took %.1f s to fail", secs);
        T_EXPECT(count_lines(log) == 1, "%d lines on stderr, expected one: %s",
                 count_lines(log), log);
        T_EXPECT(strstr(log, named) != NULL, "the error does not name %s: %s", named, log);
        T_STATUS(ema_world_rank(&r), EMA_ERR_STATE);
        T_EXPECT(r == 4242, "ema_world_rank wrote its output");
        if (s == EMA_SUCCESS) {
            ema_finalize();
            break;
        }
    }

    /* fixed: the world forms, and works (ema_test_finish counts the
     * failures above too) */
    setenv(var, fixed, 1);
    ema_test_init("test_settings_mismatch");
    ema_test_begin("test_fixed_settings_initialise");
    return ema_test_finish("test_settings_mismatch");
}
