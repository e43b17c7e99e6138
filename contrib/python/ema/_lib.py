"""Loading libema and describing its C API to ctypes.

This is the only module that knows ema.h.  Everything here mirrors
include/ema.h; when the header changes, change this file (the structures are
described once, in STAT_LAYOUTS below).

The GIL: libema is loaded with ctypes.CDLL, never ctypes.PyDLL.  A CDLL
function call releases the GIL for as long as the C function runs, so every
blocking EMA call (ema_barrier, ema_reclaim, ema_wait, ema_win_grow,
ema_win_shrink, ema_win_free, ema_finalize, ...) lets the process's other
Python threads run meanwhile.  EMA's own threads (the progress thread) never
call into Python: the reclaim callback registered by ema.ReclaimNotifier is a
C function of the _notify helper (see _notify.c), not a ctypes callback.
"""

import ctypes
import ctypes.util
import glob
import os

# --------------------------------------------------------------------------
# Finding the libraries
# --------------------------------------------------------------------------

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
# contrib/python/ema -> the source tree's top, when run from a checkout
_TOP_DIR = os.path.normpath(os.path.join(_PKG_DIR, "..", "..", ".."))
# build folders the project's scripts use: in-tree, quickstart.sh, gpu-suite.sh
_BUILD_DIRS = [_TOP_DIR, os.path.join(_TOP_DIR, "build"), os.path.join(_TOP_DIR, "build-gpu")]

#: Environment variables read by this package (not by libema).  They are
#: hidden from libema while ema_init runs, which would otherwise warn that
#: they are unknown EMA_* variables.
ENV_VARS = ("EMA_LIBRARY", "EMA_NOTIFY_LIBRARY", "EMA_GPU_CHECK_LIBRARY")


def library_candidates():
    """Paths tried, in order, to load libema (see find_library)."""
    out = []
    env = os.environ.get("EMA_LIBRARY")
    if env:
        return [env]
    for d in _BUILD_DIRS:
        out.append(os.path.join(d, ".libs", "libema.so.0"))
    found = ctypes.util.find_library("ema")
    if found:
        out.append(found)
    out.append("libema.so.0")
    return out


def find_helper(name, env_var):
    """The path of a helper shared object built by the project (name is
    '_notify' or '_gpu_check'), or None.  Order: $env_var; next to this
    package (where pip built it); python/ of the build trees (make)."""
    env = os.environ.get(env_var)
    if env:
        return env
    pats = [os.path.join(_PKG_DIR, name + "*.so")]
    pats += [os.path.join(d, "python", name + ".so") for d in _BUILD_DIRS]
    for pat in pats:
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[0]
    return None


def _load():
    errors = []
    for path in library_candidates():
        if os.sep in path and not os.path.exists(path):
            errors.append("%s: no such file" % path)
            continue
        try:
            # CDLL, not PyDLL: calls release the GIL (see the module docstring)
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(str(e))
    raise ImportError("ema: cannot load libema (set EMA_LIBRARY to the path of libema.so.0):\n  "
                      + "\n  ".join(errors))


lib, path = _load()

# --------------------------------------------------------------------------
# Constants (ema.h)
# --------------------------------------------------------------------------

#: ema_status_t: value -> name.  Values are never renumbered (ema.h).
STATUS_NAMES = {
    0: "EMA_SUCCESS",
    1: "EMA_INPROGRESS",
    -1: "EMA_ERR_INVALID_PARAM",
    -2: "EMA_ERR_INVALID_HANDLE",
    -3: "EMA_ERR_INVALID_RANK",
    -4: "EMA_ERR_RANGE",
    -5: "EMA_ERR_ALIGNMENT",
    -6: "EMA_ERR_STATE",
    -10: "EMA_ERR_NO_MEMORY",
    -11: "EMA_ERR_NO_RESOURCE",
    -12: "EMA_ERR_UNSUPPORTED",
    -20: "EMA_ERR_BOOTSTRAP",
    -21: "EMA_ERR_TRANSPORT",
    -22: "EMA_ERR_PEER_LOST",
    -23: "EMA_ERR_TIMEOUT",
    -24: "EMA_ERR_IO",
    -25: "EMA_ERR_DEVICE",
}
SUCCESS = 0
INPROGRESS = 1

MEMORY_KIND_AUTO = 0
MEMORY_KIND_HOST = 1
MEMORY_KIND_CUDA = 2

INIT_PARAM_FIELD_MEMORY_KIND = 1 << 0
INIT_PARAM_FIELD_DEVICE_MEMORY = 1 << 1
INIT_PARAM_FIELD_SEGMENT_SIZE = 1 << 2
WIN_PARAM_FIELD_MAX_SIZE = 1 << 0
WIN_POLICY_PARAM_FIELD_RANGES = 1 << 0
WIN_POLICY_PARAM_FIELD_DEPTH = 1 << 1
WIN_POLICY_PARAM_FIELD_FLAGS = 1 << 2
WIN_POLICY_FLAG_CYCLIC = 1 << 0
WIN_POLICY_FLAG_NO_EVICT = 1 << 1
WIN_POLICY_FLAG_READ_ONLY = 1 << 2
WIN_POLICY_FLAG_WAIT = 1 << 3
WIN_POLICY_NO_GROUP = ctypes.c_size_t(-1).value

TIMEOUT_INFINITE = (1 << 64) - 1

INFO_VERSION = 1 << 0
INFO_TOPOLOGY = 1 << 1
INFO_WORLD = 1 << 2
INFO_TRANSPORT = 1 << 3
INFO_ALL = 0xFF

# --------------------------------------------------------------------------
# Structures
# --------------------------------------------------------------------------

c_size_t = ctypes.c_size_t
c_uint64 = ctypes.c_uint64


class InitParams(ctypes.Structure):
    _fields_ = [("field_mask", c_uint64), ("memory_kind", ctypes.c_int),
                ("device_memory", c_size_t), ("segment_size", c_size_t)]


class WinParams(ctypes.Structure):
    _fields_ = [("field_mask", c_uint64), ("max_size", c_size_t)]


class WinRange(ctypes.Structure):
    _fields_ = [("offset", c_size_t), ("length", c_size_t)]


class WinPolicyParams(ctypes.Structure):
    _fields_ = [("field_mask", c_uint64), ("ranges", ctypes.POINTER(WinRange)),
                ("count", c_size_t), ("depth", ctypes.c_uint), ("flags", ctypes.c_uint)]


# ema_win_policy_stat_t came after the field_mask change: one layout only.
WIN_POLICY_STAT_FIELDS = [
    ("count", c_size_t), ("depth", ctypes.c_uint), ("group", c_size_t),
    ("bytes_ahead", c_size_t), ("bytes_ahead_local", c_size_t),
    ("bytes_prefetched", c_uint64), ("bytes_evicted", c_uint64),
    ("skipped_held", c_uint64), ("deferred", c_uint64), ("runs", c_uint64),
    ("bytes_dropped", c_uint64),
]


# The statistics structures: their data fields, in ema.h's order.  THE place
# to update when ema.h changes them.
WIN_STAT_FIELDS = [
    ("size", c_size_t), ("max_size", c_size_t), ("bytes_local", c_size_t),
    ("bytes_borrowed", c_size_t), ("bytes_spilled", c_size_t), ("migrations", c_uint64),
    ("bytes_wanted", c_size_t),
]
MEM_STAT_FIELDS = [
    ("capacity", c_size_t), ("reserve", c_size_t), ("bytes_free", c_size_t),
    ("bytes_used", c_size_t), ("bytes_lent", c_size_t), ("bytes_withheld", c_size_t),
    ("bytes_borrowed", c_size_t), ("bytes_spilled", c_size_t), ("reclaims", c_uint64),
    ("bytes_migrated", c_uint64), ("reclaim_last_us", ctypes.c_double),
    ("reclaim_max_us", ctypes.c_double), ("memory_kind", ctypes.c_int),
    ("device", ctypes.c_int),
]
# Fields added after the field_mask layout, each in a reserved[] word.
MEM_STAT_LATER = [("bytes_unmet", c_uint64)]
# ABI room: ema.h now puts a uint64_t field_mask (in: fields wanted, 0 = all;
# out: fields written, one bit per field in the order above) before those
# fields and uint64_t reserved[8] after them; libema builds from before that
# change have neither.  Both layouts are described, and the one libema uses
# is detected at the first stat call (detect_stat_layout).  A field added
# later goes at the end of its list here (it takes the place of reserved[0]
# in the field_mask layout, so shrink reserved to match).
_ROOM_HEAD = [("field_mask", c_uint64)]
_ROOM_TAIL = [("reserved", c_uint64 * 8)]


def _struct(name, fields):
    return type(name, (ctypes.Structure,), {"_fields_": fields})


WinPolicyStat = _struct("WinPolicyStat",
                        _ROOM_HEAD + WIN_POLICY_STAT_FIELDS + [("reserved", c_uint64 * 7)])

STAT_LAYOUTS = {
    "plain": (_struct("WinStat", WIN_STAT_FIELDS), _struct("MemStat", MEM_STAT_FIELDS)),
    "field_mask": (_struct("WinStatM", _ROOM_HEAD + WIN_STAT_FIELDS + _ROOM_TAIL),
                   _struct("MemStatM", _ROOM_HEAD + MEM_STAT_FIELDS + MEM_STAT_LATER +
                           [("reserved", c_uint64 * (8 - len(MEM_STAT_LATER)))])),
}
_stat_layout = None


def detect_stat_layout():
    """Which STAT_LAYOUTS entry libema uses: call ema_mem_stat on a buffer
    large enough for either.  With field_mask first (asked as 0 = all fields)
    the first word comes back as the bits written, 2**n - 1, an odd number;
    in the plain layout it is the capacity, a whole number of segments (a
    multiple of 4 KiB, even).  Needs ema_init; returns None before."""
    global _stat_layout
    if _stat_layout is None:
        buf = (c_uint64 * 64)()
        if lib.ema_mem_stat(ctypes.cast(buf, ctypes.c_void_p)) != SUCCESS:
            return None
        _stat_layout = "field_mask" if buf[0] & 1 else "plain"
    return _stat_layout


def stat_structs():
    """(WinStat, MemStat) ctypes structure classes of the layout in use."""
    return STAT_LAYOUTS[detect_stat_layout() or "plain"]


# --------------------------------------------------------------------------
# Prototypes
# --------------------------------------------------------------------------

_vp = ctypes.c_void_p
_st = ctypes.c_int  # ema_status_t
_P = ctypes.POINTER
_PROTOS = {
    "ema_init": (_st, [_P(InitParams)]),
    "ema_finalize": (_st, []),
    "ema_world_rank": (_st, [_P(ctypes.c_int)]),
    "ema_world_size": (_st, [_P(ctypes.c_int)]),
    "ema_barrier": (_st, []),
    "ema_progress": (_st, []),
    "ema_strerror": (ctypes.c_char_p, [_st]),
    "ema_version_string": (ctypes.c_char_p, []),
    "ema_config_print": (_st, [_vp]),
    "ema_info_print": (_st, [_vp, ctypes.c_uint]),
    "ema_win_allocate": (_st, [c_size_t, _P(WinParams), _P(_vp), _P(_vp)]),
    "ema_win_free": (_st, [_vp]),
    "ema_win_size": (_st, [_vp, ctypes.c_int, _P(c_size_t)]),
    "ema_put": (_st, [_vp, ctypes.c_int, c_size_t, _vp, c_size_t]),
    "ema_get": (_st, [_vp, ctypes.c_int, c_size_t, _vp, c_size_t]),
    "ema_put_nb": (_st, [_vp, ctypes.c_int, c_size_t, _vp, c_size_t, _P(_vp)]),
    "ema_get_nb": (_st, [_vp, ctypes.c_int, c_size_t, _vp, c_size_t, _P(_vp)]),
    "ema_wait": (_st, [_vp]),
    "ema_test": (_st, [_vp]),
    "ema_win_flush": (_st, [_vp, ctypes.c_int]),
    "ema_win_flush_all": (_st, [_vp]),
    "ema_fetch_add": (_st, [_vp, ctypes.c_int, c_size_t, c_uint64, _P(c_uint64)]),
    "ema_compare_swap": (_st, [_vp, ctypes.c_int, c_size_t, c_uint64, c_uint64, _P(c_uint64)]),
    "ema_win_grow": (_st, [_vp, c_size_t]),
    "ema_win_shrink": (_st, [_vp, c_size_t]),
    "ema_reclaim": (_st, [c_size_t, c_uint64]),
    "ema_reclaim_release": (_st, [c_size_t]),
    # the callback is passed as a plain C function pointer (of _notify.so),
    # never as a ctypes CFUNCTYPE: see the module docstring
    "ema_win_set_reclaim_cb": (_st, [_vp, _vp, _vp]),
    "ema_win_acquire": (_st, [_vp, c_size_t, c_size_t]),
    "ema_win_release": (_st, [_vp, c_size_t, c_size_t]),
    "ema_win_prefetch": (_st, [_vp, c_size_t, c_size_t]),
    "ema_win_set_policy": (_st, [_vp, _vp]),
    "ema_win_advance": (_st, [_vp, c_size_t]),
    "ema_win_policy_stat": (_st, [_vp, _vp]),
    # the stat structures' layout is chosen at run time: pass a void pointer
    "ema_win_stat": (_st, [_vp, _vp]),
    "ema_mem_stat": (_st, [_vp]),
}

for _name, (_res, _args) in _PROTOS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args

# C stdio, for ema_config_print and ema_info_print into a Python string
_libc = ctypes.CDLL(None)
_libc.open_memstream.restype = _vp
_libc.open_memstream.argtypes = [_P(ctypes.c_char_p), _P(c_size_t)]
_libc.fclose.argtypes = [_vp]
_libc.free.argtypes = [_vp]


def print_to_string(fn, *args):
    """Call fn(FILE *stream, *args) on an in-memory stream; return
    (status, text)."""
    buf = ctypes.c_char_p()
    size = c_size_t()
    stream = _libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not stream:
        raise OSError(ctypes.get_errno(), "open_memstream failed")
    try:
        status = fn(stream, *args)
    finally:
        _libc.fclose(stream)
    text = ctypes.string_at(buf, size.value).decode("utf-8", "replace")
    _libc.free(ctypes.cast(buf, _vp))
    return status, text
