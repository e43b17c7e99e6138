"""Reclaim events, delivered to Python without Python in EMA's threads.

EMA calls a window's reclaim callback (ema_win_set_reclaim_cb(3)) on its
progress thread, before a range of the owner's part moves (a lender's
reclaim, the owner's shrink, a prefetch).  That thread must never take the
GIL, so the callback is not Python: it is ema_py_notify_cb of the small C
helper _notify.so (_notify.c), which writes a record to a pipe and returns.
ReclaimNotifier reads the pipe: poll it with read(), select on fileno(), or
await it with asyncio (wait()).

    n = ema.ReclaimNotifier()
    n.watch(win)
    ...
    for ev in n.read(timeout=0):          # or: loop.add_reader(n.fileno(), ...)
        drop_cache_range(ev.offset, ev.nbytes)

By default an event arrives after the callback has returned, so the move
may already be under way when Python sees it.  What that means for an
unpinned View: loads meanwhile read the old or the new copy (the same bytes,
unless peers put into the range), but a plain store may land in the old copy
and be lost, and on the cuda kind a kernel still reading the range when its
old mapping goes faults.  Put and get need no care.

watch(win, hold=seconds) closes that gap: the callback then waits, at most
hold seconds and without the GIL, until Python acknowledges the event
(ack()).  The holder reads the event, stops its stores and kernels on the
range (synchronises its CUDA stream), acks, and only then does the range
move.  If no ack comes in time (no thread reads the queue, or the only
reader is the thread blocked in the EMA call that moves the range) the
callback returns anyway and counts the expiry (expired): a hold delays EMA,
a lender's reclaim included, by at most that long per event, and never
deadlocks it.  Keep holds short (milliseconds) and read the queue from its
own thread.

    n.watch(win, hold=0.05)
    def reader():                          # a thread of its own
        while True:
            evs = n.read(timeout=None)
            for ev in evs:
                engine.stop_using(ev.offset, ev.nbytes)   # e.g. stream.synchronize()
            n.ack(evs)                     # now the ranges may move

Where _notify.so is missing (no C compiler when the package was installed),
mode is "poll": a Python thread polls ema_win_stat's migrations counter of
each watched window every poll_interval seconds and reports, after the
fact, that the window moved (offset 0, nbytes its size).  Same interface.
"""

import asyncio
import ctypes
import os
import select
import struct
import threading
import weakref
from dataclasses import dataclass
from typing import Optional

from . import _lib
from .core import Window, _Closing, check
from .errors import EmaError

_REC = struct.Struct("=QQQQQQ")  # magic, seq, token, win, offset, len (_notify.c)
_HOLD_TOKENS = 4096  # tokens below this may have a hold (_notify.c)
_MAGIC = 0x656D61726563

_helper = None


def load_helper():
    """The _notify helper (ctypes.CDLL), or None where it was not built."""
    global _helper
    if _helper is None:
        path = _lib.find_helper("_notify", "EMA_NOTIFY_LIBRARY")
        if path is None:
            _helper = False
        else:
            h = ctypes.CDLL(path)
            h.ema_py_notify_open.restype = ctypes.c_int
            h.ema_py_notify_sent.restype = ctypes.c_uint64
            h.ema_py_notify_dropped.restype = ctypes.c_uint64
            h.ema_py_notify_record_size.restype = ctypes.c_size_t
            h.ema_py_notify_set_hold.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
            h.ema_py_notify_set_hold.restype = ctypes.c_int
            h.ema_py_notify_ack.argtypes = [ctypes.c_uint64]
            h.ema_py_notify_ack.restype = None
            h.ema_py_notify_expired.restype = ctypes.c_uint64
            if h.ema_py_notify_record_size() != _REC.size:
                raise ImportError("ema: %s: record size %d, expected %d"
                                  % (path, h.ema_py_notify_record_size(), _REC.size))
            h.path = path
            _helper = h
    return _helper or None


@dataclass(frozen=True)
class ReclaimEvent:
    """[offset, offset+nbytes) of this rank's part of window is about to
    move (pipe mode) or has moved (poll mode).  window is None if the
    Window object is gone; seq numbers the events of the process (pipe
    mode; 0 in poll mode), for ack()."""
    window: Optional[Window]
    offset: int
    nbytes: int
    handle: int
    seq: int = 0

    def overlaps(self, view):
        """True if the event's range meets the View's."""
        return view.window is self.window and view.overlaps(self.offset, self.nbytes)


class ReclaimNotifier(_Closing):
    """The reclaim-event queue.  mode: None (pipe where _notify.so is
    found, else poll), "pipe" or "poll".  In pipe mode there is one queue
    per process (the helper's pipe), so every call returns the same object;
    each poll-mode notifier is its own, with its own polling thread."""

    _instance = None
    _lock = threading.Lock()

    def __new__(cls, mode=None, poll_interval=0.01):
        if mode not in (None, "pipe", "poll"):
            raise ValueError("mode must be None, 'pipe' or 'poll'")
        if mode == "poll" or load_helper() is None:
            self = super().__new__(cls)
            self._setup(mode, poll_interval)
            return self
        with cls._lock:
            if cls._instance is None or cls._instance._closed:
                self = super().__new__(cls)
                self._setup(mode, poll_interval)
                cls._instance = self
            return cls._instance

    def _setup(self, mode, poll_interval):
        helper = load_helper() if mode in (None, "pipe") else None
        if mode == "pipe" and helper is None:
            raise RuntimeError("ema.ReclaimNotifier: _notify.so was not built (no C compiler "
                               "at install time?); use mode='poll' or set EMA_NOTIFY_LIBRARY")
        self._closed = False
        self._pending = b""
        self._tokens = {}  # token -> weakref(Window)
        self._next = 1
        self._poll_dropped = 0
        self._last_seq = 0
        if helper is not None:
            self.mode = "pipe"
            self._helper = helper
            fd = helper.ema_py_notify_open()
            if fd < 0:
                raise OSError(-fd, "ema_py_notify_open: " + os.strerror(-fd))
            self._rfd = fd
            self._cb = ctypes.cast(helper.ema_py_notify_cb, ctypes.c_void_p).value
        else:
            self.mode = "poll"
            self._rfd, self._wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self.poll_interval = poll_interval
            self._seen = {}  # token -> migrations last seen
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._poll_loop, name="ema-reclaim-poll",
                                            daemon=True)
            self._thread.start()

    # -- registration ----------------------------------------------------------

    def watch(self, win, hold=None):
        """Report the moves of this rank's part of win (replaces any reclaim
        callback of the window).  hold (seconds, pipe mode): make each move
        wait up to that long for ack() of its event."""
        if not isinstance(win, Window):
            raise TypeError("ema.ReclaimNotifier.watch: win must be an ema.Window, not %s"
                            % type(win).__name__)
        token = self._token_of(win)
        if token is None:
            token = self._next
            self._next += 1
            self._tokens[token] = weakref.ref(win)
        if self.mode == "pipe":
            ns = 0 if not hold else int(hold * 1e9)
            if ns < 0:
                raise ValueError("hold must not be negative")
            if self._helper.ema_py_notify_set_hold(token, ns) != 0 and ns:
                raise ValueError("ema.ReclaimNotifier: at most %d windows can have a hold"
                                 % (_HOLD_TOKENS - 1))
            check(_lib.lib.ema_win_set_reclaim_cb(win._handle(), self._cb, token),
                  "ema_win_set_reclaim_cb")
        else:
            if hold:
                raise ValueError("ema.ReclaimNotifier: hold needs the pipe mode (_notify.so)")
            self._seen[token] = win.stat().migrations
        return self

    def unwatch(self, win):
        """Stop reporting win's moves.  Events already queued still come."""
        token = self._token_of(win)
        if token is None:
            return
        if self.mode == "pipe":
            check(_lib.lib.ema_win_set_reclaim_cb(win._handle(), None, None),
                  "ema_win_set_reclaim_cb")
            self._helper.ema_py_notify_set_hold(token, 0)
        else:
            self._seen.pop(token, None)

    def _token_of(self, win):
        for t, ref in self._tokens.items():
            if ref() is win:
                return t
        return None

    # -- reading ---------------------------------------------------------------

    def fileno(self):
        """A file descriptor that is readable when events are queued."""
        return self._rfd

    @property
    def dropped(self):
        """Events lost because the queue was full (treat every watched range
        as moved when this grows)."""
        if self.mode == "pipe":
            return int(self._helper.ema_py_notify_dropped())
        return self._poll_dropped

    def read(self, timeout=0):
        """The queued events (a list, maybe empty).  Waits up to timeout
        seconds for the first (None: until one comes; 0: not at all)."""
        if not self._pending and timeout != 0:
            select.select([self._rfd], [], [], timeout)
        data = self._pending
        while True:
            try:
                chunk = os.read(self._rfd, 4096 // _REC.size * _REC.size)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        whole = len(data) - len(data) % _REC.size
        self._pending = data[whole:]
        out = []
        for magic, seq, token, h, off, n in _REC.iter_unpack(data[:whole]):
            if magic != _MAGIC:
                raise RuntimeError("ema.ReclaimNotifier: bad record (magic 0x%x)" % magic)
            ref = self._tokens.get(token)
            out.append(ReclaimEvent(ref() if ref else None, off, n, h, seq))
            self._last_seq = max(self._last_seq, seq)
        return out

    def ack(self, events=None):
        """Acknowledge events (a list, or one), or, by default, every event
        read so far: the moves held for them (watch(hold=...)) go on."""
        if self.mode != "pipe":
            return
        if events is None:
            seq = self._last_seq
        elif isinstance(events, ReclaimEvent):
            seq = events.seq
        else:
            seq = max((e.seq for e in events), default=0)
        if seq:
            self._helper.ema_py_notify_ack(seq)

    @property
    def expired(self):
        """Holds that ended without an ack (pipe mode)."""
        return int(self._helper.ema_py_notify_expired()) if self.mode == "pipe" else 0

    async def wait(self):
        """Await the next events (asyncio); returns a non-empty list."""
        while True:
            ev = self.read(0)
            if ev:
                return ev
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            loop.add_reader(self._rfd, lambda: fut.done() or fut.set_result(None))
            try:
                await fut
            finally:
                loop.remove_reader(self._rfd)

    # -- poll mode -------------------------------------------------------------

    def _poll_loop(self):
        while not self._stop.wait(self.poll_interval):
            for token, last in list(self._seen.items()):
                ref = self._tokens.get(token)
                win = ref() if ref else None
                try:
                    st = win.stat() if win is not None and not win.freed else None
                except EmaError:
                    st = None
                if st is None:
                    self._seen.pop(token, None)
                    continue
                if st.migrations != last:
                    self._seen[token] = st.migrations
                    rec = _REC.pack(_MAGIC, 0, token, win.handle, 0, st.size)
                    try:
                        os.write(self._wfd, rec)
                    except BlockingIOError:
                        self._poll_dropped += 1

    def close(self):
        """Stop watching every window (the pipe itself lives on)."""
        if self._closed:
            return
        for token, ref in list(self._tokens.items()):
            win = ref()
            if win is not None and not win.freed:
                try:
                    self.unwatch(win)
                except EmaError:
                    pass
        self._tokens.clear()
        if self.mode == "poll":
            self._stop.set()
            self._thread.join()
            os.close(self._rfd)
            os.close(self._wfd)
        self._closed = True

    def __repr__(self):
        return "<ema.ReclaimNotifier %s fd %d, %d watched>" % (self.mode, self._rfd,
                                                               len(self._tokens))
