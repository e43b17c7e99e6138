#include "log.h"
#include "assertion.h"
#include "clock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

ema_log_level_t ema__log_level = EMA_LOG_WARN;
atomic_ulong ema__log_malformed;
static int ema_log_rank = -1;

static const char *ema_log_names[] = {"error", "warn", "info", "debug", "trace"};

void ema__log_set_rank(int rank)
{
    ema_log_rank = rank;
}

void ema__log(ema_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    int saved_errno = errno; /* keep %m meaningful in fmt */
    va_list ap;

    va_start(ap, fmt);
    errno = saved_errno;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    /* One write() per line so that lines of several ranks do not interleave. */
    char out[1200];
    const char *base = strrchr(file, '/');
    int n;
    if (level >= EMA_LOG_DEBUG) {
        /* with the monotonic clock in microseconds: one clock for every
         * process of the machine, so the ranks' lines of one migration can
         * be put in order and timed against each other */
        n = snprintf(out, sizeof(out), "[ema %d:%d %.1f] %s: %s (%s:%d)\n", ema_log_rank,
                     (int)getpid(), ema__now_us(), ema_log_names[level], msg,
                     base ? base + 1 : file, line);
    } else {
        n = snprintf(out, sizeof(out), "[ema %d:%d] %s: %s\n", ema_log_rank, (int)getpid(),
                     ema_log_names[level], msg);
    }
    if (n > (int)sizeof(out)) {
        n = sizeof(out);
    }
    ssize_t w = write(STDERR_FILENO, out, (size_t)n);
    (void)w;
    errno = saved_errno;
}

void ema__assert_fail(const char *file, int line, const char *func, const char *fmt, ...)
{
    char msg[768];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* whatever EMA_LOG_LEVEL says: errors are always logged */
    ema__log(EMA_LOG_ERROR, file, line, "assertion failed at %s:%d in %s(): %s (a bug in EMA)",
             file, line, func, msg);
    abort();
}

void ema__log_malformed_once(atomic_flag *once, const char *file, int line, const char *fmt,
                             ...)
{
    char msg[1024];
    va_list ap;

    atomic_fetch_add(&ema__log_malformed, 1);
    ema_log_level_t level = atomic_flag_test_and_set(once) ? EMA_LOG_DEBUG : EMA_LOG_ERROR;
    if (level > ema__log_level) {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ema__log(level, file, line, "%s%s", msg,
             level == EMA_LOG_ERROR ? " (more of this kind: at debug level)" : "");
}
