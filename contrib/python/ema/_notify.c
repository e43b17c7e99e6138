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
 *   progress thread                         Python (any thread)
 *   ---------------                         -------------------
 *   cb(win, off, len, token)
 *     seq = ++next
 *     write(pipe, {seq,token,win,off,len}) -> fd readable, read records
 *   [hold > 0: wait until acked >= seq,       stop using the ranges
 *    at most hold ns]                    <-   ema_py_notify_ack(seq)
 *   returns; the move goes on
 *
 * By default (hold 0) the callback returns at once, so Python hears of a
 * move that may already be under way.  A window watched with a hold makes
 * the callback wait, a bounded time, for Python to acknowledge the record:
 * the holder stops its loads, stores and kernels on the range, then acks,
 * and only then does the range move.  The wait needs no GIL and no lock; if
 * Python does not ack in time (its reader is busy, or it is the thread
 * blocked in the EMA call), the callback returns anyway and the expiry is
 * counted, so a hold can delay EMA but never deadlock it.
 *
 * One pipe per process, made by ema_py_notify_open() and kept to the end:
 * a callback that EMA read just before a window dropped it may still run, so
 * the write end is never closed.  A record (48 bytes) is below PIPE_BUF, so
 * each write is atomic; when the pipe is full the record is dropped and
 * counted, and the reader must then treat every watched range as moved.
 *
 * Needs nothing but libc: it is built by the project's make (into
 * python/_notify.so of the build tree) or by pip (setuptools), and loaded
 * with ctypes.  It does not link libema.  It also holds the destructor of
 * ema.View's DLPack capsules (ema_py_dlpack_capsule_destructor, at the
 * end), which calls four functions of Python's C API, looked up with
 * dlsym in the Python process that loads the helper: no Python header,
 * and no undefined symbol.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#define EMA_PY_EXPORT __attribute__((visibility("default")))
#define EMA_PY_NOTIFY_MAGIC 0x656d61726563ull /* "emarec" */

#define EMA_PY_NOTIFY_TOKENS 4096 /* tokens that may have a hold: 1 .. 4095 */

typedef struct {
    uint64_t magic;  /* EMA_PY_NOTIFY_MAGIC */
    uint64_t seq;    /* 1, 2, ...: what ema_py_notify_ack() acknowledges */
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
static atomic_uint_fast64_t notify_seq, notify_acked, notify_expired;
static atomic_uint_fast64_t notify_hold_ns[EMA_PY_NOTIFY_TOKENS];

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

static uint64_t ema_py_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Wait until Python acknowledged @seq, at most @hold ns. */
static void ema_py_notify_hold(uint64_t seq, uint64_t hold)
{
    const struct timespec nap = {0, 20000}; /* 20 us */
    uint64_t deadline = ema_py_now_ns() + hold;

    while (atomic_load(&notify_acked) < seq) {
        if (ema_py_now_ns() >= deadline) {
            atomic_fetch_add(&notify_expired, 1);
            return;
        }
        nanosleep(&nap, NULL);
    }
}

/* The ema_reclaim_cb: pass it to ema_win_set_reclaim_cb with arg = a token
 * naming the window.  Safe on any thread; keeps errno. */
EMA_PY_EXPORT void ema_py_notify_cb(void *win, size_t offset, size_t len, void *arg)
{
    uint64_t token = (uint64_t)(uintptr_t)arg;
    ema_py_notify_rec_t rec = {EMA_PY_NOTIFY_MAGIC, atomic_fetch_add(&notify_seq, 1) + 1, token,
                               (uint64_t)(uintptr_t)win, offset, len};
    int saved = errno;
    ssize_t n;

    do {
        n = notify_fd[1] >= 0 ? write(notify_fd[1], &rec, sizeof(rec)) : -1;
    } while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof(rec)) {
        atomic_fetch_add(&ema_py_notify_nsent, 1);
        uint64_t hold = token < EMA_PY_NOTIFY_TOKENS ? atomic_load(&notify_hold_ns[token]) : 0;
        if (hold != 0) {
            ema_py_notify_hold(rec.seq, hold);
        }
    } else {
        atomic_fetch_add(&ema_py_notify_ndropped, 1);
    }
    errno = saved;
}

/* Make the callbacks of @token wait up to @hold_ns for an ack (0: never
 * wait).  Returns 0, or -1 for a token that cannot have a hold. */
EMA_PY_EXPORT int ema_py_notify_set_hold(uint64_t token, uint64_t hold_ns)
{
    if (token == 0 || token >= EMA_PY_NOTIFY_TOKENS) {
        return -1;
    }
    atomic_store(&notify_hold_ns[token], hold_ns);
    return 0;
}

/* Python has handled every record up to @seq: their callbacks may return. */
EMA_PY_EXPORT void ema_py_notify_ack(uint64_t seq)
{
    uint64_t cur = atomic_load(&notify_acked);
    while (cur < seq && !atomic_compare_exchange_weak(&notify_acked, &cur, seq)) {
    }
}

/* Holds that ended unacknowledged. */
EMA_PY_EXPORT uint64_t ema_py_notify_expired(void)
{
    return atomic_load(&notify_expired);
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

/*
 * The destructor of a DLPack capsule made by ema.View.__dlpack__.  A capsule
 * that no consumer took (still named "dltensor" or "dltensor_versioned")
 * deletes its tensor; a taken one was renamed "used_..." and its consumer
 * calls the deleter.  A consumer that refuses the capsule (numpy 1.24 does
 * for a bool tensor) drops it with its own exception pending: Python code
 * cannot run then (a ctypes callback's foreign calls raise the pending
 * exception, which was swallowed, so the deleter never ran, the export
 * leaked with its pin, and numpy failed with SystemError).  So, as DLPack's
 * reference destructor does, the pending exception is set aside while the
 * deleter (a ctypes callback of ema.views) runs, and put back after.
 */
typedef struct _object PyObject;

/* Python's C API, looked up in the process (dlsym) rather than linked: the
 * helper links nothing but libc, so a build with -Wl,--no-undefined works,
 * and it loads in a process without Python (the C tests) all the same. */
static struct {
    int   (*is_valid)(PyObject *capsule, const char *name);
    void *(*get_pointer)(PyObject *capsule, const char *name);
    void  (*fetch)(PyObject **type, PyObject **value, PyObject **tb);
    void  (*restore)(PyObject *type, PyObject *value, PyObject *tb);
} ema_py_api;

static int ema_py_api_load(void)
{
    /* under the GIL: one thread at a time gets here */
    if (ema_py_api.restore == NULL) {
        *(void **)&ema_py_api.is_valid    = dlsym(RTLD_DEFAULT, "PyCapsule_IsValid");
        *(void **)&ema_py_api.get_pointer = dlsym(RTLD_DEFAULT, "PyCapsule_GetPointer");
        *(void **)&ema_py_api.fetch       = dlsym(RTLD_DEFAULT, "PyErr_Fetch");
        *(void **)&ema_py_api.restore     = dlsym(RTLD_DEFAULT, "PyErr_Restore");
    }
    return ema_py_api.is_valid != NULL && ema_py_api.get_pointer != NULL &&
           ema_py_api.fetch != NULL && ema_py_api.restore != NULL;
}

typedef struct {
    void    *data;
    int32_t  device_type, device_id;
    int32_t  ndim;
    uint8_t  code, bits;
    uint16_t lanes;
    int64_t *shape, *strides;
    uint64_t byte_offset;
} ema_py_dltensor_t;

typedef struct ema_py_dlmanaged {
    ema_py_dltensor_t dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct ema_py_dlmanaged *self);
} ema_py_dlmanaged_t;

typedef struct ema_py_dlversioned {
    uint32_t major, minor;
    void *manager_ctx;
    void (*deleter)(struct ema_py_dlversioned *self);
    uint64_t flags;
    ema_py_dltensor_t dl_tensor;
} ema_py_dlversioned_t;

EMA_PY_EXPORT void ema_py_dlpack_capsule_destructor(PyObject *capsule)
{
    PyObject *type, *value, *tb;

    if (!ema_py_api_load()) {
        return; /* not in a Python process: nothing can hold a capsule */
    }
    ema_py_api.fetch(&type, &value, &tb);
    if (ema_py_api.is_valid(capsule, "dltensor")) {
        ema_py_dlmanaged_t *m = ema_py_api.get_pointer(capsule, "dltensor");
        if (m != NULL && m->deleter != NULL) {
            m->deleter(m);
        }
    } else if (ema_py_api.is_valid(capsule, "dltensor_versioned")) {
        ema_py_dlversioned_t *m = ema_py_api.get_pointer(capsule, "dltensor_versioned");
        if (m != NULL && m->deleter != NULL) {
            m->deleter(m);
        }
    }
    ema_py_api.restore(type, value, tb);
}
