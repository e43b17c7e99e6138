# Sourced by the Python test scripts (tests/python/*.sh), under make check
# (which exports top_srcdir and top_builddir).  It
#  - picks the interpreter: $PYTHON if set, else the first of python3 and
#    /usr/bin/python3 that has numpy (Debian's python3-numpy), else the
#    first python3 found;
#  - runs the package from the source tree: PYTHONPATH=contrib/python, and
#    EMA_LIBRARY, EMA_NOTIFY_LIBRARY, EMA_GPU_CHECK_LIBRARY at the build
#    tree's libraries (nothing needs installing);
#  - skips (exit 77) with the reason when there is no python3.
# Then: py_need_numpy skips unless the interpreter has numpy; "$py" runs it.
: "${top_srcdir:?run by make check}" "${top_builddir:?run by make check}"
py=
py_numpy=no
if [ -n "${PYTHON:-}" ]; then
    if command -v "$PYTHON" >/dev/null 2>&1; then
        py=$PYTHON
        "$py" -c 'import numpy' 2>/dev/null && py_numpy=yes
    fi
else
    for c in python3 /usr/bin/python3; do
        command -v "$c" >/dev/null 2>&1 || continue
        if "$c" -c 'import numpy' 2>/dev/null; then
            py=$c py_numpy=yes
            break
        fi
        [ -n "$py" ] || py=$c
    done
fi
if [ -z "$py" ]; then
    echo "SKIP: no python3 found (PYTHON=${PYTHON:-unset}); Debian: apt-get install python3 python3-numpy"
    exit 77
fi

py_need_numpy() {
    if [ "$py_numpy" != yes ]; then
        echo "SKIP: $py has no numpy (Debian: apt-get install python3-numpy, or set PYTHON)"
        exit 77
    fi
}

PYTHONPATH="$top_srcdir/contrib/python${PYTHONPATH:+:$PYTHONPATH}"
PYTHONUNBUFFERED=1
PYTHONDONTWRITEBYTECODE=1 # the source tree may be read-only (make distcheck)
EMA_LIBRARY="$top_builddir/.libs/libema.so.0"
EMA_NOTIFY_LIBRARY="$top_builddir/python/_notify.so"
export PYTHONPATH PYTHONUNBUFFERED PYTHONDONTWRITEBYTECODE EMA_LIBRARY EMA_NOTIFY_LIBRARY
if [ -f "$top_builddir/python/_gpu_check.so" ]; then
    EMA_GPU_CHECK_LIBRARY="$top_builddir/python/_gpu_check.so"
    export EMA_GPU_CHECK_LIBRARY
fi
echo "# python: $(command -v "$py") ($("$py" -c 'import sys; print(sys.version.split()[0])'), numpy: $py_numpy)"
