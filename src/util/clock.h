/* A monotonic clock in microseconds, for timeouts and debug timings. */
#ifndef EMA_UTIL_CLOCK_H_
#define EMA_UTIL_CLOCK_H_

#include <time.h>

static inline double ema__now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

#endif
