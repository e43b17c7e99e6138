/*
 * win->lock's owner tracking and assertions (win/win.h): ema__win_lock and
 * ema__win_unlock record the owning thread; EMA_WIN_ASSERT_LOCKED,
 * _UNLOCKED and _NONE_LOCKED check it, and a broken rule (a function that
 * requires the lock called without it, the lock taken twice, two windows'
 * locks at once, an unlock by a thread that does not hold it) aborts with
 * the caller's file:line and function.  Each broken rule runs in a child
 * process.  Built with --disable-assertions (or NDEBUG), only the helpers'
 * locking is tested.
 */
#include <ema.h>

#include "win/win.h"

#include "check_main.h"

#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static struct ema_win w1, w2;

static void win_init(struct ema_win *w, uint32_t id)
{
    memset(w, 0, sizeof(*w));
    w->id = id;
    pthread_mutex_init(&w->lock, NULL);
    atomic_init(&w->lock_owner, 0);
}

static void setup(void)
{
    win_init(&w1, 7);
    win_init(&w2, 8);
}

/* Run @fn in a child process with its stderr captured: it must die of
 * SIGABRT, having logged "assertion failed" at this file, in function
 * @func, with @what in the message. */
static void assert_aborts(void (*fn)(void), const char *func, const char *what)
{
#if EMA_ASSERTIONS
    int fds[2];
    char out[4096];
    size_t len = 0;
    int st;

    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDERR_FILENO);
        signal(SIGABRT, SIG_DFL);
        fn();
        _exit(0); /* survived: the parent fails the test */
    }
    close(fds[1]);
    ssize_t n;
    while (len < sizeof(out) - 1 && (n = read(fds[0], out + len, sizeof(out) - 1 - len)) > 0) {
        len += (size_t)n;
    }
    out[len] = '\0';
    close(fds[0]);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT,
                  "%s did not abort (status %#x): %s", func, st, out);
    ck_assert_msg(strstr(out, "assertion failed at ") != NULL, "no assertion line: %s", out);
    ck_assert_msg(strstr(out, "test_win_lock.c:") != NULL, "no file:line: %s", out);
    char in[128];
    snprintf(in, sizeof(in), " in %s(): ", func);
    ck_assert_msg(strstr(out, in) != NULL, "does not name %s: %s", func, out);
    ck_assert_msg(strstr(out, what) != NULL, "does not say \"%s\": %s", what, out);
#else
    (void)fn, (void)func, (void)what;
#endif
}

EMA_TEST("win_lock", test_lock_records_owner_and_asserts_pass)
{
    EMA_WIN_ASSERT_UNLOCKED(&w1);
    EMA_WIN_ASSERT_NONE_LOCKED();
    ema__win_lock(&w1);
    EMA_WIN_ASSERT_LOCKED(&w1);
    EMA_WIN_ASSERT_UNLOCKED(&w2);
#if EMA_ASSERTIONS
    ck_assert(ema__win_locked_by_self(&w1));
    ck_assert_ptr_eq(ema__win_lock_held, &w1);
#endif
    ema__win_unlock(&w1);
    EMA_WIN_ASSERT_UNLOCKED(&w1);
    EMA_WIN_ASSERT_NONE_LOCKED();
    ck_assert_uint_eq(atomic_load(&w1.lock_owner), 0);
    /* the mutex itself was released: another window's lock, then this one */
    ema__win_lock(&w2);
    ema__win_unlock(&w2);
    ck_assert_int_eq(pthread_mutex_trylock(&w1.lock), 0);
    pthread_mutex_unlock(&w1.lock);
}
END_TEST

static void requires_lock(void)
{
    EMA_WIN_ASSERT_LOCKED(&w1);
}

EMA_TEST("win_lock", test_assert_locked_without_the_lock_aborts)
{
    assert_aborts(requires_lock, "requires_lock", "window 7: requires its lock");
}
END_TEST

static void takes_lock_held(void)
{
    ema__win_lock(&w1);
    EMA_WIN_ASSERT_UNLOCKED(&w1);
}

EMA_TEST("win_lock", test_assert_unlocked_with_the_lock_aborts)
{
    assert_aborts(takes_lock_held, "takes_lock_held", "must not be called with its lock held");
}
END_TEST

static void lock_twice(void)
{
    ema__win_lock(&w1);
    ema__win_lock(&w1); /* would deadlock: the mutex is not recursive */
}

EMA_TEST("win_lock", test_locking_twice_aborts_instead_of_deadlocking)
{
    assert_aborts(lock_twice, "lock_twice", "already holds its lock");
}
END_TEST

static void lock_two_windows(void)
{
    ema__win_lock(&w1);
    ema__win_lock(&w2);
}

EMA_TEST("win_lock", test_two_windows_locks_at_once_abort)
{
    assert_aborts(lock_two_windows, "lock_two_windows",
                  "window 8: locking it while this thread holds window 7's lock");
}
END_TEST

static void unlock_unheld(void)
{
    ema__win_unlock(&w1);
}

EMA_TEST("win_lock", test_unlocking_a_lock_not_held_aborts)
{
    assert_aborts(unlock_unheld, "unlock_unheld", "does not hold");
}
END_TEST

static void none_locked_under_a_lock(void)
{
    ema__win_lock(&w2);
    EMA_WIN_ASSERT_NONE_LOCKED();
}

EMA_TEST("win_lock", test_assert_none_locked_under_a_window_lock_aborts)
{
    assert_aborts(none_locked_under_a_lock, "none_locked_under_a_lock",
                  "this thread holds window 8's");
}
END_TEST

/* Another thread holds w1's lock until told to let go. */
static pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_state; /* 1: locked, 2: let go */

static void *holder_main(void *arg)
{
    ema__win_lock(&w1);
    pthread_mutex_lock(&gate);
    gate_state = 1;
    pthread_cond_broadcast(&gate_cv);
    while (gate_state != 2) {
        pthread_cond_wait(&gate_cv, &gate);
    }
    pthread_mutex_unlock(&gate);
    ema__win_unlock(&w1);
    return arg;
}

static void held_by_another_thread(void)
{
    pthread_t t;
    pthread_create(&t, NULL, holder_main, NULL);
    pthread_mutex_lock(&gate);
    while (gate_state != 1) {
        pthread_cond_wait(&gate_cv, &gate);
    }
    pthread_mutex_unlock(&gate);
    EMA_WIN_ASSERT_UNLOCKED(&w1); /* not this thread's */
    EMA_WIN_ASSERT_NONE_LOCKED();
    EMA_WIN_ASSERT_LOCKED(&w1);   /* aborts: held, but by another thread */
}

EMA_TEST("win_lock", test_ownership_is_per_thread)
{
    assert_aborts(held_by_another_thread, "held_by_another_thread", "requires its lock");
}
END_TEST

int main(void)
{
    return ema_check_main_fixture("win_lock", CK_ENV, setup, NULL);
}
