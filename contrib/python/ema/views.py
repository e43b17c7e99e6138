"""Views: a range of a window part as an array, with no copy.

Window.view(offset=0, nbytes=None, dtype=None, pin=False, shape=None) returns a View of
[offset, offset+nbytes) of this rank's own part, at its fixed address
(borrowed and spilled pages included: they are mapped there).

* On the host kind, v.numpy() is an array of the view's dtype and shape.
  The View is also a ctypes array over that memory, so it exports the
  buffer protocol: numpy.frombuffer(v, dtype), bytes(v), file.readinto(v),
  sock.send(v); but with ctypes' element types (numpy.asarray(v) shows
  float16 and bfloat16 as uint16, complex64 as pairs of float32, and
  memoryview(v) needs .cast("B") before indexing), and such arrays are not
  counted in v.exports and do not keep a pin past close().
* On every kind it exports DLPack (__dlpack__, __dlpack_device__):
  numpy.from_dlpack(v) (host), torch.from_dlpack(v), cupy.from_dlpack(v).
  Both the versioned (DLPack 1.0, asked for with max_version) and the
  older unversioned capsule ("dltensor") are made, by hand, with ctypes.
* On the cuda kind it also has __cuda_array_interface__ (version 3).

Pinning (ema_win_acquire(3)).  A View made with pin=True holds its range
with ema_win_acquire until close(), the end of its with-block, or its
garbage collection; every array made from it (numpy() or DLPack) keeps it
alive, so the range cannot move while any consumer still has it, and
close() raises BufferError, changing nothing, while such an array lives.
Pin for as long as kernels or CPU code use the memory directly, and no
longer: a lender's reclaim of a pinned segment waits, and times out
(EMA_ERR_TIMEOUT at the lender) while the pin lasts, so a long-lived pinned
KV-cache tensor blocks every reclaim of the memory under it.  For such long-lived tensors keep the view unpinned
(pin=False, the default) and listen for reclaim events (ema.ReclaimNotifier):
an event says that a range is about to move, and the holder must stop plain
loads, stores and kernels on it.  Watched with a hold, the move waits until
the holder acknowledges the event; without one it may already be under way.
Or pin a short-lived view around each use, or go through put/get, which need
no care.  See ema_win_set_reclaim_cb(3) and ema.notify.

A View must not outlive its range: close views before shrinking the part
below them or freeing the window (free() closes them; arrays made from them
then point at unmapped memory).  A pinned view's segments cannot be shrunk
away: shrink() raises StateError, changing nothing, until it is closed.
"""

import ctypes
import functools
import threading
from collections import namedtuple

from . import _lib
from .core import MemoryKind, _Closing, _State, check, is_initialized, parse_size
from .errors import RangeError

# --------------------------------------------------------------------------
# Element types
# --------------------------------------------------------------------------

#: name: DLPack type code, bits, array-interface typestr, ctypes element
#: (None where ctypes has none: the buffer protocol then shows raw words)
DType = namedtuple("DType", "name code bits typestr ctype")
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_COMPLEX, _DL_BOOL = 0, 1, 2, 4, 5, 6
_TABLE = [
    DType("uint8", _DL_UINT, 8, "|u1", ctypes.c_uint8),
    DType("int8", _DL_INT, 8, "|i1", ctypes.c_int8),
    DType("uint16", _DL_UINT, 16, "<u2", ctypes.c_uint16),
    DType("int16", _DL_INT, 16, "<i2", ctypes.c_int16),
    DType("uint32", _DL_UINT, 32, "<u4", ctypes.c_uint32),
    DType("int32", _DL_INT, 32, "<i4", ctypes.c_int32),
    DType("uint64", _DL_UINT, 64, "<u8", ctypes.c_uint64),
    DType("int64", _DL_INT, 64, "<i8", ctypes.c_int64),
    DType("float16", _DL_FLOAT, 16, "<f2", None),
    DType("bfloat16", _DL_BFLOAT, 16, "<V2", None),
    DType("float32", _DL_FLOAT, 32, "<f4", ctypes.c_float),
    DType("float64", _DL_FLOAT, 64, "<f8", ctypes.c_double),
    DType("complex64", _DL_COMPLEX, 64, "<c8", None),
    DType("complex128", _DL_COMPLEX, 128, "<c16", None),
    DType("bool", _DL_BOOL, 8, "|b1", ctypes.c_bool),
]
DTYPES = {d.name: d for d in _TABLE}
_ALIASES = {
    "u1": "uint8", "i1": "int8", "u2": "uint16", "i2": "int16", "u4": "uint32", "i4": "int32",
    "u8": "uint64", "i8": "int64", "f2": "float16", "f4": "float32", "f8": "float64",
    "c8": "complex64", "c16": "complex128", "b1": "bool", "?": "bool", "b": "int8", "B": "uint8",
    "half": "float16", "float": "float32", "double": "float64", "bf16": "bfloat16",
    "byte": "uint8", "long": "int64", "int": "int32", "short": "int16",
    "cfloat": "complex64", "cdouble": "complex128",
}
_CTYPES = {ctypes.c_uint8: "uint8", ctypes.c_int8: "int8", ctypes.c_uint16: "uint16",
           ctypes.c_int16: "int16", ctypes.c_uint32: "uint32", ctypes.c_int32: "int32",
           ctypes.c_uint64: "uint64", ctypes.c_int64: "int64", ctypes.c_float: "float32",
           ctypes.c_double: "float64", ctypes.c_bool: "bool", ctypes.c_char: "uint8"}


def dtype_of(spec):
    """A DType from None (uint8), a name ('float32', 'f4', '<f4',
    'bfloat16'), a numpy dtype or scalar type, a torch dtype or a ctypes
    type.  Big-endian types are refused."""
    if spec is None:
        return DTYPES["uint8"]
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, type) and spec in _CTYPES:
        return DTYPES[_CTYPES[spec]]
    if isinstance(spec, type) and getattr(spec, "__module__", "") == "numpy":
        import numpy
        spec = numpy.dtype(spec)
    name = spec if isinstance(spec, str) else getattr(spec, "name", None) or str(spec)
    if getattr(spec, "byteorder", "=") == ">":
        raise ValueError("big-endian dtype %r: EMA windows hold little-endian data" % (spec,))
    name = name.strip()
    if name.startswith("torch."):
        name = name[len("torch."):]
    if name[:1] in "<|=":
        name = name[1:]
    elif name[:1] == ">":
        raise ValueError("big-endian dtype %r: EMA windows hold little-endian data" % (spec,))
    name = _ALIASES.get(name, name)
    try:
        return DTYPES[name]
    except KeyError:
        raise TypeError("unsupported dtype %r (one of: %s)" % (spec, ", ".join(DTYPES))) from None


def _buffer_ctype(dt):
    """The ctypes element the buffer protocol shows for dt."""
    if dt.ctype is not None:
        return dt.ctype
    if dt.name in ("float16", "bfloat16"):
        return ctypes.c_uint16
    return {"complex64": ctypes.c_float, "complex128": ctypes.c_double}[dt.name] * 2


# --------------------------------------------------------------------------
# DLPack (dlpack.h, v0.8 unversioned and v1.0 versioned)
# --------------------------------------------------------------------------

KDL_CPU, KDL_CUDA = 1, 2


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", _Deleter)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _Deleter), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


DLPACK_VERSION = (1, 0)
_NAME = b"dltensor"
_NAME_VERSIONED = b"dltensor_versioned"

# What each live export keeps alive, by the address of its managed tensor:
# (managed struct, shape and strides arrays, the View).  The deleter, called
# by the consumer when it is done (or by the capsule destructor when nobody
# consumed the capsule), drops the entry.  Both callbacks run on the
# consumer's thread, which holds the GIL or takes it; EMA never calls them.
_EXPORTS = {}

# Guards every View's _exports count, and close()'s look at it: a count is
# dropped on whichever thread lets an array go (a consumer's, or the
# garbage collector's inside any allocation), and "+= 1" is no atomic step.
# Reentrant: the collector may run a drop on a thread that holds it.
_EXPORTS_LOCK = threading.RLock()


def _count_export(view, n):
    with _EXPORTS_LOCK:
        view._exports += n


def _delete(addr):
    entry = _EXPORTS.pop(addr, None)
    if entry is not None:
        _count_export(entry[-1], -1)


_deleter = _Deleter(_delete)

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _capsule_destructor_fn(capsule):
    # a capsule never consumed (still named "dltensor[_versioned]"): the
    # producer deletes its tensor; a consumed one was renamed "used_..."
    # Only where the _notify helper is missing: Python cannot run with the
    # exception of a consumer that refused the capsule pending, so such an
    # export then leaks (with its pin); the helper's C destructor does not.
    try:
        for name in (_NAME, _NAME_VERSIONED):
            if _capsule_is_valid(capsule, name):
                _delete(_capsule_get_pointer(capsule, name))
    except Exception:  # interpreter shutdown: nothing left to release
        pass


_capsule_destructor = _CapsuleDestructor(_capsule_destructor_fn)
_destructor_addr = None


def _destructor():
    """The capsules' destructor: the _notify helper's C function, which
    keeps a consumer's pending exception; else the ctypes one above."""
    global _destructor_addr
    if _destructor_addr is None:
        addr = None
        try:
            from .notify import load_helper
            h = load_helper()
            if h is not None:
                addr = ctypes.cast(h.ema_py_dlpack_capsule_destructor, ctypes.c_void_p).value
        except (AttributeError, ImportError, OSError):
            pass  # a helper built before it had one
        _destructor_addr = addr or ctypes.cast(_capsule_destructor, ctypes.c_void_p).value
    return _destructor_addr


def _export(view, versioned):
    ndim = len(view.shape)
    shape = (ctypes.c_int64 * max(ndim, 1))(*view.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))()
    step = 1
    for i in range(ndim - 1, -1, -1):  # compact row-major, in elements
        strides[i] = step
        step *= view.shape[i]
    m = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    t = m.dl_tensor
    t.data = view.ptr
    t.device = DLDevice(*view.__dlpack_device__())
    t.ndim = ndim
    t.dtype = DLDataType(view.dtype.code, view.dtype.bits, 1)
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    m.deleter = _deleter
    if versioned:
        m.version = DLPackVersion(*DLPACK_VERSION)
        m.flags = 0  # writable, not a copy
    addr = ctypes.addressof(m)
    m.manager_ctx = addr
    _EXPORTS[addr] = (m, shape, strides, view)
    _count_export(view, 1)
    try:
        return _capsule_new(addr, _NAME_VERSIONED if versioned else _NAME, _destructor())
    except BaseException:
        _delete(addr)
        raise


# --------------------------------------------------------------------------
# View
# --------------------------------------------------------------------------


class _ArrayExport:
    """A numpy() array's hold on its view, counted in View.exports until the
    array (and every array made from it) is gone."""

    __slots__ = ("view",)

    def __init__(self, view):
        self.view = view
        _count_export(view, 1)

    def __del__(self):
        _count_export(self.view, -1)


class View(_Closing):
    """A range of this rank's own window part (Window.view()).

    Attributes: window, offset, nbytes, dtype (a DType), shape, ptr (the
    address: host memory, or a device pointer on the cuda kind), kind
    (MemoryKind), pinned.  On the host kind a View is a ctypes array and
    exports the buffer protocol.  Use it as a context manager, or close()
    it, to drop a pin at a known time."""

    __hash__ = object.__hash__  # ctypes arrays are unhashable; views are not

    def _setup(self, win, offset, nbytes, dtype, shape, kind, pinned):
        self.window = win
        self.offset = offset
        self.nbytes = nbytes
        self.dtype = dtype
        self.shape = shape
        self.ptr = win.base + offset
        self.kind = kind
        self.pinned = pinned
        self._exports = 0
        self._closed = False
        win._views.add(self)

    @property
    def closed(self):
        return self._closed

    @property
    def exports(self):
        """Arrays made from this view that are still alive: its numpy()
        arrays, and the DLPack exports that consumers still hold."""
        return self._exports

    def _check_closable(self, who):
        if not self._closed and self.pinned and self._exports:
            raise BufferError("%s: %d array(s) made from a pinned view (numpy() or DLPack) are "
                              "alive; drop them first" % (who, self._exports))

    def close(self):
        """Drop the pin (ema_win_release) and mark the view closed.  Raises
        BufferError, changing nothing, while arrays made from a pinned view
        (numpy(), or a DLPack consumer's) are alive: they would lose the pin
        and could read memory that a shrink then unmaps."""
        with _EXPORTS_LOCK:  # no export counted between the look and the unpin
            if self._closed:
                return
            self._check_closable("ema.View.close")
            self._unpin()

    def _unpin(self):
        self._closed = True
        if self.pinned:
            self.pinned = False
            if is_initialized() and not self.window.freed:
                self.window.release(self.offset, self.nbytes)

    def _window_gone(self):
        self._closed = True
        self.pinned = False

    def __del__(self):
        if getattr(self, "pinned", False):
            try:
                self._unpin()
            except Exception:
                pass

    def overlaps(self, offset, nbytes):
        """True if [offset, offset+nbytes) of the part meets this view."""
        return offset < self.offset + self.nbytes and self.offset < offset + nbytes

    # -- DLPack --------------------------------------------------------------

    def __dlpack_device__(self):
        if self.kind == MemoryKind.CUDA:
            return (KDL_CUDA, max(_State.device or 0, 0))
        return (KDL_CPU, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of the view, with no copy.  Keeps the view (and
        its pin) alive until the consumer releases the tensor.  stream is
        accepted and ignored: EMA's puts are complete once flushed, and
        kernels of the caller's on other streams are the caller's to
        synchronise.  A versioned (1.0) capsule is made when max_version
        allows it; else the unversioned one (numpy 1.24 asks no version)."""
        with _EXPORTS_LOCK:  # not closed by another thread before it counts
            if self._closed:
                raise BufferError("ema.View: closed")
            if copy:
                raise BufferError("ema.View: DLPack export never copies (copy=True)")
            if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
                raise BufferError("ema.View: the data is on device %r, not %r"
                                  % (self.__dlpack_device__(), tuple(dl_device)))
            versioned = max_version is not None and tuple(max_version)[0] >= DLPACK_VERSION[0]
            return _export(self, versioned)

    # -- host helpers --------------------------------------------------------

    def numpy(self):
        """A numpy array over the view's memory (host kind; no copy).  The
        array keeps the view, and its pin, alive.  Raises BufferError once
        the view is closed.  (The buffer protocol of a closed view,
        memoryview(v) or np.asarray(v), cannot refuse, as the view is a
        ctypes array: its memory may be unmapped; do not use it.)"""
        import numpy
        # the array's base is a fresh buffer over the same memory that holds
        # an _ArrayExport: the view (and its pin) lives, and close() refuses,
        # until the array and every array made from it are gone
        with _EXPORTS_LOCK:  # not closed by another thread before it counts
            if self._closed:
                raise BufferError("ema.View: closed")
            if self.kind != MemoryKind.HOST:
                raise TypeError("ema.View.numpy: the cuda kind's memory is on the GPU: use "
                                "__dlpack__ or __cuda_array_interface__")
            if self.dtype.name == "bfloat16":
                raise TypeError("numpy has no bfloat16")
            buf = (ctypes.c_uint8 * self.nbytes).from_address(self.ptr)
            buf._ema_export = _ArrayExport(self)
        return numpy.frombuffer(buf, dtype=numpy.dtype(self.dtype.typestr)).reshape(self.shape)

    def __repr__(self):
        state = " closed" if self._closed else (" pinned" if self.pinned else "")
        return "<ema.View [%d, %d) %s%s %s at 0x%x%s>" % (
            self.offset, self.offset + self.nbytes, self.dtype.name, list(self.shape),
            self.kind.name.lower(), self.ptr, state)


class CudaView(View):
    """A View on the cuda kind: device memory, no buffer protocol."""

    @property
    def __cuda_array_interface__(self):
        if self._closed:
            raise BufferError("ema.View: closed")
        return {"shape": tuple(self.shape), "typestr": self.dtype.typestr,
                "data": (self.ptr, False), "version": 3, "strides": None, "stream": None}


@functools.lru_cache(maxsize=256)
def _host_class(ctype, shape):
    t = ctype
    for d in reversed(shape[1:]):
        t = t * d
    return type("HostView", (View, ctypes.Array), {"_type_": t, "_length_": shape[0],
                                                    "__module__": __name__})


def make_view(win, offset, nbytes, dtype, shape, pin):
    if win.freed:
        check(-2, "ema.Window.view")
    offset = parse_size(offset, "offset")
    part = win.size()
    if offset > part:
        raise RangeError(-4, "ema.Window.view")
    nbytes = part - offset if nbytes is None else nbytes
    nbytes = parse_size(nbytes if nbytes is not None else -1, "nbytes")
    if offset + nbytes > part:
        raise RangeError(-4, "ema.Window.view")
    if nbytes == 0:
        raise ValueError("ema.Window.view: an empty range")
    dt = dtype_of(dtype)
    item = dt.bits // 8
    if offset % item:
        raise ValueError("offset %d is not aligned to %s (%d bytes)" % (offset, dt.name, item))
    if shape is None:
        if nbytes % item:
            raise ValueError("nbytes %d is not a multiple of %s's %d bytes" % (nbytes, dt.name, item))
        shape = (nbytes // item,)
    else:
        shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        count = 1
        for s in shape:
            if s < 0:
                raise ValueError("negative dimension in shape %r" % (shape,))
            count *= s
        if not shape or count * item != nbytes:
            raise ValueError("shape %r of %s does not hold %d bytes" % (shape, dt.name, nbytes))
    kind = _State.kind
    if pin:
        check(_lib.lib.ema_win_acquire(win.handle, offset, nbytes), "ema_win_acquire")
    try:
        if kind == MemoryKind.CUDA:
            v = CudaView()
        else:
            v = _host_class(_buffer_ctype(dt), shape).from_address(win.base + offset)
        v._setup(win, offset, nbytes, dt, shape, kind, bool(pin))
    except BaseException:
        if pin:
            win.release(offset, nbytes)
        raise
    return v
