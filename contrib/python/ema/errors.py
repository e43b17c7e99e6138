"""Exceptions: one class per ema_status_t error, all subclasses of EmaError.

Every failed EMA call raises the class of its status.  The exception carries
the status name (``e.name``, e.g. ``"EMA_ERR_RANGE"``), its value
(``e.code``), the C call that failed (``e.call``) and ema_strerror's text.
A few also derive from the matching Python exception, so generic code can
catch them: InvalidParamError is a ValueError, TimeoutError a TimeoutError.
"""

from . import _lib


class EmaError(Exception):
    """An EMA call failed.  Attributes: code (int), name (the ema_status_t
    name), call (the C function), message (ema_strerror)."""

    code = None
    name = None

    def __init__(self, code=None, call=None, message=None):
        if code is None:
            code = type(self).code
        self.code = code
        self.name = _lib.STATUS_NAMES.get(code, "EMA_ERR_%d" % code if code is not None else "?")
        self.call = call
        self.message = message if message is not None else strerror(code)
        where = "%s: " % call if call else ""
        super().__init__("%s%s (%s, %s)" % (where, self.message, self.name, code))


def strerror(code):
    """ema_strerror(code): a static string naming the status."""
    s = _lib.lib.ema_strerror(int(code))
    return s.decode() if s else "unknown status %d" % code


def _camel(name):
    parts = name[len("EMA_ERR_"):].split("_")
    return "".join(p.capitalize() for p in parts) + "Error"


#: status value -> exception class
ERRORS = {}
_EXTRA_BASES = {"EMA_ERR_INVALID_PARAM": (ValueError,), "EMA_ERR_TIMEOUT": (TimeoutError,)}
for _code, _name in sorted(_lib.STATUS_NAMES.items(), reverse=True):
    if _code >= 0:
        continue
    _cls = type(_camel(_name), (EmaError,) + _EXTRA_BASES.get(_name, ()),
                {"code": _code, "name": _name, "__module__": __name__,
                 "__doc__": "%s: %s." % (_name, strerror(_code))})
    ERRORS[_code] = _cls
    globals()[_cls.__name__] = _cls

__all__ = ["EmaError", "strerror", "check", "ERRORS"] + [c.__name__ for c in ERRORS.values()]


def check(status, call=None):
    """Return status if it is EMA_SUCCESS or EMA_INPROGRESS, else raise the
    exception of its class."""
    if status >= 0:
        return status
    cls = ERRORS.get(status, EmaError)
    raise cls(status, call)
