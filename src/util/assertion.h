/*
 * Internal assertions: checks of EMA's own invariants, such as which thread
 * holds which lock (win/win.h's EMA_WIN_ASSERT_*).  A failed one is a bug in
 * EMA, never a bad argument from the caller (those return an ema_status_t):
 * it logs file:line, the function and what was wrong, and aborts.
 *
 * Active by default, so that `make check` and CI run them; compiled out
 * (the condition is type-checked but never evaluated) with -DNDEBUG or
 * -DEMA_DISABLE_ASSERTIONS, which `configure --disable-assertions` adds.
 */
#ifndef EMA_UTIL_ASSERTION_H_
#define EMA_UTIL_ASSERTION_H_

#if defined(NDEBUG) || defined(EMA_DISABLE_ASSERTIONS)
#define EMA_ASSERTIONS 0
#else
#define EMA_ASSERTIONS 1
#endif

/* Log "assertion failed at FILE:LINE in FUNC(): message" and abort(). */
void ema__assert_fail(const char *file, int line, const char *func, const char *fmt, ...)
    __attribute__((noreturn, cold, format(printf, 4, 5)));

/* EMA_ASSERT(cond, fmt, ...): @cond must hold here; the message says what
 * did not.  EMA_ASSERT_AT reports another place (a macro's caller). */
#define EMA_ASSERT_AT(_cond, _file, _line, _func, ...)                        \
    do {                                                                      \
        if (EMA_ASSERTIONS && !(_cond)) {                                     \
            ema__assert_fail((_file), (_line), (_func), __VA_ARGS__);         \
        }                                                                     \
    } while (0)
#define EMA_ASSERT(_cond, ...) EMA_ASSERT_AT(_cond, __FILE__, __LINE__, __func__, __VA_ARGS__)

/*
 * Clang's thread-safety analysis (-Wthread-safety): capability attributes
 * that say which lock a function requires, takes or must not be called
 * with.  They expand to nothing under other compilers (gcc); check with
 *   configure CC=clang CFLAGS='-O2 -Wthread-safety'
 * The run-time assertions above check the same rules on the paths a run
 * takes, whatever the compiler.
 */
#if defined(__clang__)
#define EMA_TSA_(_x) __attribute__((_x))
#else
#define EMA_TSA_(_x)
#endif
#define EMA_CAPABILITY(_name)      EMA_TSA_(capability(_name))
#define EMA_REQUIRES(...)          EMA_TSA_(requires_capability(__VA_ARGS__))
#define EMA_EXCLUDES(...)          EMA_TSA_(locks_excluded(__VA_ARGS__))
#define EMA_ACQUIRE(...)           EMA_TSA_(acquire_capability(__VA_ARGS__))
#define EMA_TRY_ACQUIRE(...)       EMA_TSA_(try_acquire_capability(__VA_ARGS__))
#define EMA_RELEASE(...)           EMA_TSA_(release_capability(__VA_ARGS__))
#define EMA_ASSERT_CAPABILITY(...) EMA_TSA_(assert_capability(__VA_ARGS__))
#define EMA_NO_THREAD_SAFETY_ANALYSIS EMA_TSA_(no_thread_safety_analysis)

#endif
