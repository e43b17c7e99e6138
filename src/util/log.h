/* Logging under EMA_LOG_LEVEL.  Messages are lowercase, name the call that
 * failed, and are logged once, where the error is first detected. */
#ifndef EMA_UTIL_LOG_H_
#define EMA_UTIL_LOG_H_

#include <stdarg.h>
#include <stdatomic.h>

typedef enum {
    EMA_LOG_ERROR = 0,
    EMA_LOG_WARN,
    EMA_LOG_INFO,
    EMA_LOG_DEBUG,
    EMA_LOG_TRACE
} ema_log_level_t;

extern ema_log_level_t ema__log_level;

void ema__log(ema_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void ema__log_set_rank(int rank);

#define ema_log_(lvl, ...) \
    do { if ((lvl) <= ema__log_level) ema__log((lvl), __FILE__, __LINE__, __VA_ARGS__); } while (0)
#define ema_error(...) ema_log_(EMA_LOG_ERROR, __VA_ARGS__)
#define ema_warn(...)  ema_log_(EMA_LOG_WARN, __VA_ARGS__)
#define ema_info(...)  ema_log_(EMA_LOG_INFO, __VA_ARGS__)
#define ema_debug(...) ema_log_(EMA_LOG_DEBUG, __VA_ARGS__)
#define ema_trace(...) ema_log_(EMA_LOG_TRACE, __VA_ARGS__)

/* A malformed message from a peer, which the caller then drops: each kind
 * (each call site) is logged at error level the first time, at debug
 * level after, so that a peer sending many cannot flood the log.  Every
 * one is counted in ema__log_malformed (the tests read it). */
extern atomic_ulong ema__log_malformed;
void ema__log_malformed_once(atomic_flag *once, const char *file, int line, const char *fmt,
                             ...) __attribute__((format(printf, 4, 5)));
#define ema_malformed(...)                                                          \
    do {                                                                            \
        static atomic_flag ema_malformed_once_ = ATOMIC_FLAG_INIT;                  \
        ema__log_malformed_once(&ema_malformed_once_, __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

#endif
