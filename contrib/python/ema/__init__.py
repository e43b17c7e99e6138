"""ema: Python bindings of EMA, elastic memory across the GPUs of one server.

A thin layer over libema (include/ema.h) through ctypes: no compiler, no
torch.  numpy is needed only by View.numpy().  The man pages (ema(7) and
ema_*(3)) are the specification; the docstrings here say how each call is
spelled in Python.

    import ema
    with ema.init(device_memory="256M") as world:          # mpirun -n 4 python3 app.py
        win = ema.Window.allocate(64 << 20, max_size=1 << 30)
        win.grow(512 << 20)                                  # may borrow from peers
        a = win.view(0, 1 << 20, dtype="float32").numpy()    # no copy (host kind)
        win.put((world.rank + 1) % world.size, 0, b"hello")
        win.flush_all(); ema.barrier()
        win.free()

Errors raise ema.EmaError subclasses named after the ema_status_t
(RangeError for EMA_ERR_RANGE, ...).  Blocking calls release the GIL
(ctypes.CDLL); EMA's progress thread never runs Python (ReclaimNotifier).

The library is found through $EMA_LIBRARY, then the source tree's build
folders (., build/, build-gpu/: .libs/libema.so.0), then the system's
(ctypes.util.find_library, libema.so.0).
"""

from . import _lib
from .core import (Buffer, MemoryKind, MemStat, PolicyStat, Request, UnusableBufferError,
                   Window, WinStat, World, barrier, config_text, finalize, info_text, init,
                   is_initialized, mem_stat, memory_kind, parse_size, progress, rank, reclaim,
                   reclaim_release, size, version)
from .errors import ERRORS, EmaError, check, strerror
from .errors import ERRORS as _E

globals().update({cls.__name__: cls for cls in _E.values()})  # one class per status
from .notify import ReclaimEvent, ReclaimNotifier
from .views import DTYPES, CudaView, DType, View, dtype_of

TIMEOUT_INFINITE = None  #: reclaim(timeout_ms=None) waits without a limit
STATUS_NAMES = dict(_lib.STATUS_NAMES)
library_path = _lib.path  #: the libema that was loaded
win_allocate = Window.allocate

__version__ = "0.1.0"

__all__ = [
    "init", "finalize", "is_initialized", "rank", "size", "memory_kind", "barrier", "progress",
    "version", "config_text", "info_text", "reclaim", "reclaim_release", "mem_stat",
    "parse_size", "World", "Window", "win_allocate", "Request", "Buffer", "UnusableBufferError",
    "MemoryKind", "WinStat", "MemStat", "PolicyStat",
    "View", "CudaView", "DType", "DTYPES", "dtype_of", "ReclaimNotifier",
    "ReclaimEvent", "EmaError", "ERRORS", "STATUS_NAMES", "check", "strerror",
    "TIMEOUT_INFINITE", "library_path",
] + [cls.__name__ for cls in ERRORS.values()]
