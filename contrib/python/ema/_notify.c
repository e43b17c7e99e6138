/*
 * _notify: reclaim events for Python without Python in EMA's threads.
 *
 * EMA calls a window's reclaim callback (ema_win_set_reclaim_cb(3)) on its
 * progress thread, or inside ema_win_shrink, before a range of the owner's
 * part moves.  A ctypes callback there would take the GIL, and the progress
 * thread must never wait for Python.  So the callback is this C function:
 * it writes one fixed-size record per call into a non-blocking pipe and
 * returns.  Python reads the pipe's other end when it likes (selectors,
 * asyncio, a thread): ema.ReclaimNotifier.
 *
 *   progress thread                       Python
 *   ---------------                       ------
 *   cb(win, off, len, token)
 *     write(pipe, {token,win,off,len})  ->  fd readable -> read records
 *   returns (no lock, no GIL, no malloc)
 *
 * One pipe per process, made by ema_py_notify_open() and kept to the end:
 * a callback that EMA read just before a window dropped it may still run, so
 * the write end is never closed.  A record (40 bytes) is below PIPE_BUF, so
 * each write is atomic; when the pipe is full the record is dropped and
 * counted (ema_py_notify_dropped), and the reader must then treat every
 * watched range as moved.
 *
 * Needs nothing but libc: it is built by the project's make (libtool) or by
 * pip (setuptools), and loaded with ctypes.  It does not link libema.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#define EMA_PY_EXPORT __attribute__((visibility("default")))
#define EMA_PY_NOTIFY_MAGIC 0x656d61726563ull /* "emarec" */

typedef struct {
    uint64_t magic;  /* EMA_PY_NOTIFY_MAGIC */
    uint64_t token;  /* the callback's arg: Python's id of the window */
    uint64_t win;    /* the ema_win_h */
    uint64_t offset; /* the range about to move */
    uint64_t len;
} ema_py_notify_rec_t;

static pthread_once_t notify_once = PTHREAD_ONCE_INIT;
static int notify_fd[2] = {-1, -1};
static int notify_errno;
/* Exported so that a test can read them without a call (holding the GIL). */
EMA_PY_EXPORT atomic_uint_fast64_t ema_py_notify_nsent, ema_py_notify_ndropped;

static void ema_py_notify_init(void)
{
    if (pipe2(notify_fd, O_NONBLOCK | O_CLOEXEC) != 0) {
        notify_errno = errno;
        notify_fd[0] = notify_fd[1] = -1;
    }
}

/* The read end of the process's event pipe (made at the first call), or
 * -errno if it could not be made. */
EMA_PY_EXPORT int ema_py_notify_open(void)
{
    pthread_once(&notify_once, ema_py_notify_init);
    return notify_fd[0] >= 0 ? notify_fd[0] : -notify_errno;
}

/* The ema_reclaim_cb: pass it to ema_win_set_reclaim_cb with arg = a token
 * naming the window.  Safe on any thread; keeps errno. */
EMA_PY_EXPORT void ema_py_notify_cb(void *win, size_t offset, size_t len, void *arg)
{
    ema_py_notify_rec_t rec = {EMA_PY_NOTIFY_MAGIC, (uint64_t)(uintptr_t)arg,
                               (uint64_t)(uintptr_t)win, offset, len};
    int saved = errno;
    ssize_t n;

    do {
        n = notify_fd[1] >= 0 ? write(notify_fd[1], &rec, sizeof(rec)) : -1;
    } while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof(rec)) {
        atomic_fetch_add(&ema_py_notify_nsent, 1);
    } else {
        atomic_fetch_add(&ema_py_notify_ndropped, 1);
    }
    errno = saved;
}

/* Records written, and records dropped (pipe full or not open), so far. */
EMA_PY_EXPORT uint64_t ema_py_notify_sent(void)
{
    return atomic_load(&ema_py_notify_nsent);
}

EMA_PY_EXPORT uint64_t ema_py_notify_dropped(void)
{
    return atomic_load(&ema_py_notify_ndropped);
}

/* sizeof(ema_py_notify_rec_t), for the reader to check its layout. */
EMA_PY_EXPORT size_t ema_py_notify_record_size(void)
{
    return sizeof(ema_py_notify_rec_t);
}
