"""The world, windows, one-sided operations and requests.

The semantics are those of the C calls: see ema(7) and each call's man page
(ema_win_allocate(3), ema_put(3), ...).  This module only adapts them:
sizes are ints (or strings such as "256M"), buffers are any object with the
buffer protocol, and errors are exceptions (ema.errors).

Every call goes through ctypes.CDLL, which releases the GIL while the C
function runs: a thread blocked in barrier(), reclaim(), Request.wait(),
Window.grow(), shrink(), free() or finalize() does not stop the others.
"""

import atexit
import ctypes
import enum
import os
import threading
import weakref
from dataclasses import fields as _dc_fields
from typing import Optional

from . import _lib
from .errors import check

_L = _lib.lib

# --------------------------------------------------------------------------
# Argument helpers
# --------------------------------------------------------------------------

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(value, what="size"):
    """An int >= 0 from an int or a string like "4096", "256M", "2G", "1KiB"
    (the suffixes of the EMA_* variables).  Raises TypeError or ValueError."""
    if isinstance(value, bool):
        raise TypeError("%s must be an int or a size string, not bool" % what)
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        s = value.strip().upper()
        for tail in ("IB", "B"):
            if s.endswith(tail) and len(s) > len(tail):
                s = s[: -len(tail)]
                break
        unit = s[-1:] if s[-1:] in _SUFFIX else ""
        num = s[: len(s) - len(unit)]
        if not num.isdigit():
            raise ValueError("%s: cannot parse %r as a size" % (what, value))
        n = int(num) * _SUFFIX[unit]
    elif hasattr(value, "__index__"):
        n = value.__index__()
    else:
        raise TypeError("%s must be an int or a size string, not %s" % (what, type(value).__name__))
    if n < 0:
        raise ValueError("%s must not be negative (%d)" % (what, n))
    if n >= 1 << 64:
        raise ValueError("%s is too large (%d)" % (what, n))
    return n


def _u64(value, what):
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError("%s must be an int, not %s" % (what, type(value).__name__))
    v = value.__index__()
    if not 0 <= v < 1 << 64:
        raise ValueError("%s must be in [0, 2**64) (%d)" % (what, v))
    return v


def _rank(value):
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError("rank must be an int, not %s" % type(value).__name__)
    v = value.__index__()
    if not -(1 << 31) <= v < 1 << 31:
        raise ValueError("rank out of range (%d)" % v)
    return v


class _PyBuffer(ctypes.Structure):
    # Py_buffer (Include/pybuffer.h), stable since Python 3.3
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p),
                ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
                ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p),
                ("internal", ctypes.c_void_p)]


_PyObject_GetBuffer = ctypes.pythonapi.PyObject_GetBuffer
_PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_PyObject_GetBuffer.restype = ctypes.c_int
_PyBuffer_Release = ctypes.pythonapi.PyBuffer_Release
_PyBuffer_Release.argtypes = [ctypes.POINTER(_PyBuffer)]
_PyBUF_SIMPLE = 0
_PyBUF_WRITABLE = 1


class UnusableBufferError(BufferError, ValueError):
    """A buffer EMA cannot use: not contiguous, or read-only where EMA must
    write.  Both a BufferError and a ValueError: the exporters disagree on
    which one they raise (numpy ValueError, memoryview and bytes
    BufferError), so one type is raised for all, and ``except ValueError``
    (the README's rule for bad arguments) catches it."""


class Buffer:
    """Holds the buffer of a Python object (PEP 3118) for as long as EMA may
    read or write it: the address and length of a contiguous buffer, with no
    copy.  The object cannot be resized meanwhile.  Raises TypeError for an
    object without the buffer protocol, UnusableBufferError (a BufferError
    and a ValueError) for a non-contiguous or (when writable) read-only
    one."""

    __slots__ = ("_view", "addr", "nbytes", "_held")

    def __init__(self, obj, writable):
        self._view = _PyBuffer()
        self._held = False
        flags = _PyBUF_WRITABLE if writable else _PyBUF_SIMPLE
        try:
            _PyObject_GetBuffer(obj, ctypes.byref(self._view), flags)
        except TypeError:
            raise TypeError("a bytes-like object is required, not %s" % type(obj).__name__) from None
        except (BufferError, ValueError) as e:
            raise UnusableBufferError("%s: %s" % (type(obj).__name__, e)) from None
        self._held = True
        self.addr = self._view.buf or 0
        self.nbytes = self._view.len

    def release(self):
        if self._held:
            self._held = False
            _PyBuffer_Release(ctypes.byref(self._view))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        self.release()


class _Closing:
    """``with`` closes it on exit: the objects whose end is close()
    (views.View, notify.ReclaimNotifier)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --------------------------------------------------------------------------
# The world
# --------------------------------------------------------------------------


class MemoryKind(enum.IntEnum):
    """ema_memory_kind_t."""
    AUTO = _lib.MEMORY_KIND_AUTO
    HOST = _lib.MEMORY_KIND_HOST
    CUDA = _lib.MEMORY_KIND_CUDA


def _memory_kind(value):
    if isinstance(value, str):
        try:
            return MemoryKind[value.strip().upper()]
        except KeyError:
            raise ValueError("memory_kind must be 'auto', 'host' or 'cuda', not %r" % value) from None
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError("memory_kind must be a str or MemoryKind, not %s" % type(value).__name__)
    return value.__index__()  # out of range values are libema's to refuse


class _State:
    lock = threading.Lock()
    initialized = False
    finalized = False
    windows = weakref.WeakValueDictionary()  # handle (int) -> Window
    kind = None
    device = None
    finalize_at_exit = True


class World:
    """Returned by init(); a context manager whose exit calls finalize()."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if _State.initialized and not _State.finalized:
            finalize()

    @property
    def rank(self):
        return rank()

    @property
    def size(self):
        return size()

    def __repr__(self):
        if _State.initialized and not _State.finalized:
            return "<ema.World rank %d of %d, %s>" % (rank(), size(), _State.kind.name.lower())
        return "<ema.World (not initialised)>"


def _finalize_at_exit():
    if _State.initialized and not _State.finalized and _State.finalize_at_exit:
        try:
            finalize()
        except Exception:
            pass


def init(memory_kind=None, device_memory=None, segment_size=None, finalize_at_exit=True):
    """ema_init(3): join the ema world.  Collective over the job: under
    mpirun the world is the PMIx job; a process started with no launcher is
    a world of one.  Each argument given overrides its EMA_* variable:
    memory_kind ('auto', 'host', 'cuda' or a MemoryKind), device_memory (the
    capacity in bytes, or "256M"), segment_size (0: the kind's default).
    Returns a World; ``with ema.init(...):`` finalizes on exit.  A process
    initialises EMA at most once.  With finalize_at_exit (the default) an
    interpreter that exits without finalize() calls it then (as mpi4py
    does): it is collective, so every rank must exit normally."""
    p = _lib.InitParams()
    if memory_kind is not None:
        p.field_mask |= _lib.INIT_PARAM_FIELD_MEMORY_KIND
        p.memory_kind = _memory_kind(memory_kind)
    if device_memory is not None:
        p.field_mask |= _lib.INIT_PARAM_FIELD_DEVICE_MEMORY
        p.device_memory = parse_size(device_memory, "device_memory")
    if segment_size is not None:
        p.field_mask |= _lib.INIT_PARAM_FIELD_SEGMENT_SIZE
        p.segment_size = parse_size(segment_size, "segment_size")
    hidden = {k: os.environ.pop(k) for k in _lib.ENV_VARS if k in os.environ}
    try:
        check(_L.ema_init(ctypes.byref(p)), "ema_init")
    finally:
        os.environ.update(hidden)
    with _State.lock:
        _State.initialized = True
        _State.finalize_at_exit = bool(finalize_at_exit)
    atexit.register(_finalize_at_exit)
    st = mem_stat()
    _State.kind = MemoryKind(st.memory_kind)
    _State.device = st.device
    return World()


def finalize():
    """ema_finalize(3): leave the world; collective.  Frees every window
    still allocated; Window objects and their views are dead afterwards."""
    status = _L.ema_finalize()
    # on any error but EMA_ERR_STATE the library is finalised all the same
    # (ema_finalize(3))
    if status != -6 and _State.initialized:
        with _State.lock:
            _State.finalized = True
            for w in list(_State.windows.values()):
                w._dead()
    check(status, "ema_finalize")


def is_initialized():
    """True between a successful init() and finalize()."""
    return _State.initialized and not _State.finalized


def rank():
    """ema_world_rank(3): this process's rank."""
    r = ctypes.c_int()
    check(_L.ema_world_rank(ctypes.byref(r)), "ema_world_rank")
    return r.value


def size():
    """ema_world_size(3): the number of processes in the world."""
    n = ctypes.c_int()
    check(_L.ema_world_size(ctypes.byref(n)), "ema_world_size")
    return n.value


def memory_kind():
    """The memory kind in use, MemoryKind.HOST or MemoryKind.CUDA."""
    if not is_initialized():
        check(-6, "memory_kind")
    return _State.kind


def barrier():
    """ema_barrier(3): block until every rank has called it (collective).
    The GIL is released while it waits."""
    check(_L.ema_barrier(), "ema_barrier")


def progress():
    """ema_progress(3): progress from this thread; True if anything
    progressed.  Needed only with EMA_PROGRESS_THREAD=n."""
    return check(_L.ema_progress(), "ema_progress") == _lib.SUCCESS


def version():
    """ema_version_string(3)."""
    return _L.ema_version_string().decode()


def config_text():
    """ema_config_print(3) as a string: every EMA_* variable with its value,
    default and help."""
    status, text = _lib.print_to_string(_L.ema_config_print)
    check(status, "ema_config_print")
    return text


def info_text(flags=_lib.INFO_ALL):
    """ema_info_print(3) as a string (flags: ema._lib.INFO_* bits)."""
    status, text = _lib.print_to_string(_L.ema_info_print, flags)
    check(status, "ema_info_print")
    return text


def reclaim(nbytes, timeout_ms=None):
    """ema_reclaim(3): take back memory this rank lent until nbytes of its
    capacity are free, and withhold it until reclaim_release().  Waits at
    most timeout_ms (None: no limit), with the GIL released.  Raises
    ema.TimeoutError (what came back stays withheld) or NoMemoryError."""
    t = _lib.TIMEOUT_INFINITE if timeout_ms is None else _u64(timeout_ms, "timeout_ms")
    check(_L.ema_reclaim(parse_size(nbytes, "nbytes"), t), "ema_reclaim")


def reclaim_release(nbytes):
    """ema_reclaim_release(3): let nbytes withheld by reclaim() be lent again."""
    check(_L.ema_reclaim_release(parse_size(nbytes, "nbytes")), "ema_reclaim_release")


def _to_dataclass(cls, st):
    # a field the library's layout lacks (field_mask, a later field) is None
    return cls(**{f.name: getattr(st, f.name, None) for f in _dc_fields(cls)})


def _stat_dataclass(name, fields, doc, later=()):
    from dataclasses import make_dataclass
    types = {"c_double": float}
    spec = [(n, types.get(t.__name__, int)) for n, t in fields]
    spec += [(n, Optional[types.get(t.__name__, int)], None) for n, t in later]
    spec.append(("field_mask", Optional[int], None))
    cls = make_dataclass(name, spec, frozen=True)
    cls.__doc__ = doc
    cls.__module__ = __name__
    cls.asdict = lambda self: {f.name: getattr(self, f.name) for f in _dc_fields(self)}
    return cls


WinStat = _stat_dataclass(
    "WinStat", _lib.WIN_STAT_FIELDS,
    "ema_win_stat_t: where the bytes of this rank's part live (ema_win_stat(3)). "
    "field_mask is the bits of the fields written where ema.h has it, else None.")
MemStat = _stat_dataclass(
    "MemStat", _lib.MEM_STAT_FIELDS,
    "ema_mem_stat_t: this rank's memory and its lending (ema_mem_stat(3)). "
    "field_mask is the bits of the fields written where ema.h has it, else None; "
    "bytes_unmet is None with a libema from before it.", later=_lib.MEM_STAT_LATER)


PolicyStat = _stat_dataclass(
    "PolicyStat", _lib.WIN_POLICY_STAT_FIELDS,
    "ema_win_policy_stat_t: a window part's prefetch policy and what it did "
    "(ema_win_policy_stat(3)); group is None before the first advance().")


def mem_stat():
    """ema_mem_stat(3): a MemStat snapshot of this rank's memory."""
    _lib.detect_stat_layout()
    st = _lib.stat_structs()[1]()
    check(_L.ema_mem_stat(ctypes.byref(st)), "ema_mem_stat")
    return _to_dataclass(MemStat, st)


# --------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------


class Request:
    """A non-blocking put or get (Window.put_nb / get_nb).  Keeps the
    buffer held until the operation completes.  Complete it with wait(), or
    with test() until it returns True, before finalize()."""

    def __init__(self, handle, buf, what):
        self._h = handle
        self._buf = buf
        self._what = what

    @property
    def done(self):
        return self._h is None

    def _complete(self, status, call):
        self._h = None
        self._buf.release()
        check(status, call)

    def wait(self):
        """ema_wait(3): block (GIL released) until the operation completes;
        raise its error, if any."""
        if self._h is None:
            return
        self._complete(_L.ema_wait(self._h), "ema_wait(%s)" % self._what)

    def test(self):
        """ema_test(3): True once complete (raising its error, if any);
        False while in progress."""
        if self._h is None:
            return True
        s = _L.ema_test(self._h)
        if s == _lib.INPROGRESS:
            return False
        self._complete(s, "ema_test(%s)" % self._what)
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.wait()

    def __del__(self):
        # a request must be completed before its buffer goes; never leak one
        if getattr(self, "_h", None) is not None and is_initialized():
            try:
                self.wait()
            except Exception:
                pass


# --------------------------------------------------------------------------
# Windows
# --------------------------------------------------------------------------


class _Acquired:
    """The range held by Window.acquire(); release() or the with-block's
    exit lets it go."""

    def __init__(self, win, offset, nbytes):
        self.win, self.offset, self.nbytes = win, offset, nbytes
        self._held = True

    def release(self):
        if self._held:
            self._held = False
            self.win.release(self.offset, self.nbytes)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Window:
    """An EMA window (ema_win_allocate(3)).  Make one with
    Window.allocate() (collective).  ``with`` frees it on exit, which is
    collective too: every rank must leave the block."""

    def __init__(self, handle, base):
        self._h = handle
        self.base = base  #: the address of this rank's part; never moves
        self._views = weakref.WeakSet()
        with _State.lock:
            _State.windows[handle] = self

    @classmethod
    def allocate(cls, size, max_size=None):
        """Collective: this rank's part is size bytes and may grow to
        max_size (default: size, rounded to segments)."""
        p = _lib.WinParams()
        n = parse_size(size, "size")
        if max_size is not None:
            p.field_mask = _lib.WIN_PARAM_FIELD_MAX_SIZE
            p.max_size = parse_size(max_size, "max_size")
        base = ctypes.c_void_p()
        h = ctypes.c_void_p()
        check(_L.ema_win_allocate(n, ctypes.byref(p), ctypes.byref(base), ctypes.byref(h)),
              "ema_win_allocate")
        return cls(h.value, base.value or 0)

    # -- identity and life ---------------------------------------------------

    @property
    def handle(self):
        """The ema_win_h as an int (0 once freed)."""
        return self._h or 0

    def _handle(self):
        # a freed window passes NULL, which libema refuses with
        # EMA_ERR_INVALID_HANDLE: the same error as in C
        return self._h

    def _dead(self):
        for v in list(self._views):
            v._window_gone()
        self._h = None

    @property
    def freed(self):
        return self._h is None

    def free(self):
        """ema_win_free(3): collective; completes outstanding operations.
        Views of the window are closed (their pins dropped) first; arrays
        made from them must not be used afterwards.  While a pinned view
        still has arrays alive (numpy() arrays, or DLPack consumers' from
        from_dlpack), the pin cannot be dropped: free raises BufferError on
        this rank before calling ema_win_free, and closes and frees nothing
        here.  Since free is collective, drop such arrays on every rank
        before calling it."""
        h = self._handle()
        views = list(self._views)
        from .views import _EXPORTS_LOCK
        with _EXPORTS_LOCK:
            # every view looked at before any is closed: a refusal changes nothing
            for v in views:
                v._check_closable("ema.Window.free")
            for v in views:
                v.close()
        check(_L.ema_win_free(h), "ema_win_free")
        with _State.lock:
            _State.windows.pop(h, None)
        self._dead()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._h is not None and is_initialized():
            self.free()

    def __repr__(self):
        if self._h is None:
            return "<ema.Window (freed)>"
        return "<ema.Window 0x%x base 0x%x>" % (self._h, self.base)

    # -- sizes and statistics ------------------------------------------------

    def size(self, rank=None):
        """ema_win_size(3): the size of rank's part (default: this rank's)."""
        r = _own_rank() if rank is None else _rank(rank)
        n = ctypes.c_size_t()
        check(_L.ema_win_size(self._handle(), r, ctypes.byref(n)), "ema_win_size")
        return n.value

    def stat(self):
        """ema_win_stat(3): a WinStat of this rank's part."""
        _lib.detect_stat_layout()
        st = _lib.stat_structs()[0]()
        check(_L.ema_win_stat(self._handle(), ctypes.byref(st)), "ema_win_stat")
        return _to_dataclass(WinStat, st)

    def grow(self, new_size):
        """ema_win_grow(3): grow this rank's part (not collective).  The base
        does not move; new bytes come from free local memory, lent memory
        taken back, peers, then the spill tier.  GIL released."""
        check(_L.ema_win_grow(self._handle(), parse_size(new_size, "new_size")), "ema_win_grow")

    def shrink(self, new_size):
        """ema_win_shrink(3): shrink this rank's part, keeping the data of
        the first new_size bytes.  StateError, changing nothing, while a
        segment past new_size is acquired (a pinned view).  GIL released."""
        check(_L.ema_win_shrink(self._handle(), parse_size(new_size, "new_size")),
              "ema_win_shrink")

    # -- one-sided operations ------------------------------------------------

    def put(self, rank, offset, buf):
        """ema_put(3): write the bytes of buf (any bytes-like object) to
        rank's part at offset.  Visible at the target after flush()."""
        with Buffer(buf, writable=False) as b:
            check(_L.ema_put(self._handle(), _rank(rank), parse_size(offset, "offset"),
                             b.addr, b.nbytes), "ema_put")

    def get(self, rank, offset, out):
        """ema_get(3): read rank's part at offset.  out is a writable
        bytes-like object, filled and returned, or a byte count, for which a
        new bytearray is returned."""
        if isinstance(out, int) and not isinstance(out, bool):
            out = bytearray(parse_size(out, "nbytes"))
        with Buffer(out, writable=True) as b:
            check(_L.ema_get(self._handle(), _rank(rank), parse_size(offset, "offset"),
                             b.addr, b.nbytes), "ema_get")
        return out

    def put_nb(self, rank, offset, buf):
        """ema_put_nb(3): start a put; returns a Request.  buf must not
        change before the request completes."""
        return self._start_nb(_L.ema_put_nb, "put", rank, offset, Buffer(buf, writable=False))

    def get_nb(self, rank, offset, out):
        """ema_get_nb(3): start a get into the writable buffer out; returns a
        Request.  out holds the data once it completes."""
        return self._start_nb(_L.ema_get_nb, "get", rank, offset, Buffer(out, writable=True))

    def _start_nb(self, fn, what, rank, offset, b):
        """fn, ema_put_nb or ema_get_nb (what: "put" or "get"), on the held
        Buffer b: a Request that keeps b until it completes, or b released
        and the error raised."""
        req = ctypes.c_void_p()
        try:
            check(fn(self._handle(), _rank(rank), parse_size(offset, "offset"), b.addr, b.nbytes,
                     ctypes.byref(req)), "ema_%s_nb" % what)
        except BaseException:
            b.release()
            raise
        return Request(req.value, b, what)

    def flush(self, rank):
        """ema_win_flush(3): complete at rank every put and get this rank
        issued to its part."""
        check(_L.ema_win_flush(self._handle(), _rank(rank)), "ema_win_flush")

    def flush_all(self):
        """ema_win_flush_all(3)."""
        check(_L.ema_win_flush_all(self._handle()), "ema_win_flush_all")

    def fetch_add(self, rank, offset, value):
        """ema_fetch_add(3): atomically add value to the 64-bit word at
        offset (8-byte aligned); return the previous value."""
        old = ctypes.c_uint64()
        check(_L.ema_fetch_add(self._handle(), _rank(rank), parse_size(offset, "offset"),
                               _u64(value, "value"), ctypes.byref(old)), "ema_fetch_add")
        return old.value

    def compare_swap(self, rank, offset, compare, value):
        """ema_compare_swap(3): replace the word at offset with value if it
        equals compare; return the previous value."""
        old = ctypes.c_uint64()
        check(_L.ema_compare_swap(self._handle(), _rank(rank), parse_size(offset, "offset"),
                                  _u64(compare, "compare"), _u64(value, "value"),
                                  ctypes.byref(old)), "ema_compare_swap")
        return old.value

    # -- holding and moving ranges -------------------------------------------

    def acquire(self, offset, nbytes):
        """ema_win_acquire(3): pin [offset, offset+nbytes) of this rank's
        part: its segments are not moved until released.  Returns an object
        whose release() (or a with-block's exit) calls release().  Hold
        ranges briefly: a held range delays its lender's reclaims."""
        o, n = parse_size(offset, "offset"), parse_size(nbytes, "nbytes")
        check(_L.ema_win_acquire(self._handle(), o, n), "ema_win_acquire")
        return _Acquired(self, o, n)

    def release(self, offset, nbytes):
        """ema_win_release(3): release a range acquired with acquire()."""
        check(_L.ema_win_release(self._handle(), parse_size(offset, "offset"),
                                 parse_size(nbytes, "nbytes")), "ema_win_release")

    def prefetch(self, offset, nbytes):
        """ema_win_prefetch(3): a hint to bring the range into this rank's
        own memory; returns at once."""
        check(_L.ema_win_prefetch(self._handle(), parse_size(offset, "offset"),
                                  parse_size(nbytes, "nbytes")), "ema_win_prefetch")

    def set_policy(self, ranges, depth=1, cyclic=False, evict=True, read_only=False,
                   wait=False):
        """ema_win_set_policy(3): the order in which this rank walks its part,
        as (offset, length) groups, e.g. one per layer group; the progress
        engine keeps the depth groups after the current one local, moving
        groups behind the walk out only where local memory is short (never
        with evict=False).  cyclic: after the last group comes the first.
        read_only: the walk never writes the groups (weights): a group
        brought home from the spill tier keeps its spill copy and leaves
        again with no copy (a write to it may be lost).  wait: advance(g)
        returns once group g is local (or the policy's run for it ended
        without moving it), for compute that reads a group several times.
        ranges=None or [] removes the policy.  Never moves held ranges
        (acquire(), pinned views)."""
        if ranges is None or len(ranges) == 0:
            check(_L.ema_win_set_policy(self._handle(), None), "ema_win_set_policy")
            return
        arr = (_lib.WinRange * len(ranges))()
        for i, r in enumerate(ranges):
            try:
                off, length = r
            except (TypeError, ValueError):
                raise TypeError("ranges[%d] must be an (offset, length) pair, not %r" % (i, r))
            arr[i].offset = parse_size(off, "offset")
            arr[i].length = parse_size(length, "length")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError("depth must be an int of at least 1, not %r" % (depth,))
        p = _lib.WinPolicyParams()
        p.field_mask = (_lib.WIN_POLICY_PARAM_FIELD_RANGES | _lib.WIN_POLICY_PARAM_FIELD_DEPTH |
                        _lib.WIN_POLICY_PARAM_FIELD_FLAGS)
        p.ranges = arr
        p.count = len(ranges)
        p.depth = depth
        p.flags = ((_lib.WIN_POLICY_FLAG_CYCLIC if cyclic else 0) |
                   (0 if evict else _lib.WIN_POLICY_FLAG_NO_EVICT) |
                   (_lib.WIN_POLICY_FLAG_READ_ONLY if read_only else 0) |
                   (_lib.WIN_POLICY_FLAG_WAIT if wait else 0))
        check(_L.ema_win_set_policy(self._handle(), ctypes.byref(p)), "ema_win_set_policy")

    def advance(self, group):
        """ema_win_advance(3): this rank now works on group `group` of the
        policy; returns at once (the progress engine does the moves), or
        with set_policy(wait=True) once the group is local."""
        if isinstance(group, bool) or not isinstance(group, int) or group < 0:
            raise ValueError("group must be a non-negative int, not %r" % (group,))
        check(_L.ema_win_advance(self._handle(), group), "ema_win_advance")

    def policy_stat(self):
        """ema_win_policy_stat(3): a PolicyStat of this part's policy."""
        st = _lib.WinPolicyStat()
        check(_L.ema_win_policy_stat(self._handle(), ctypes.byref(st)), "ema_win_policy_stat")
        ps = _to_dataclass(PolicyStat, st)
        if ps.group == _lib.WIN_POLICY_NO_GROUP:
            from dataclasses import replace
            ps = replace(ps, group=None)
        return ps

    def view(self, offset=0, nbytes=None, dtype=None, pin=False, shape=None):
        """A View of [offset, offset+nbytes) of this rank's own part, with
        no copy (default: from offset to the part's end), of dtype (a name,
        numpy or torch dtype; default uint8) and shape (default 1-d).
        pin=True holds the range with ema_win_acquire while the view lives.
        See ema.views for the interfaces and when to pin."""
        from .views import make_view
        return make_view(self, offset, nbytes, dtype, shape, pin)


def _own_rank():
    return rank()
