#!/usr/bin/env bash
# EMA quick start on Debian 12 / Ubuntu: install what is missing, build, then
#   contrib/quickstart.sh demo   run the 4-rank elastic-window demo (README command 1)
#   contrib/quickstart.sh test   run the whole test suite (README command 2, and CI)
# Builds out of tree in ./build.  Safe to run again: it only installs what is
# missing and rebuilds what changed.
set -euo pipefail

mode=${1:-demo}
case "$mode" in demo|test) ;; *) echo "usage: $0 [demo|test]" >&2; exit 2 ;; esac

top=$(cd "$(dirname "$0")/.." && pwd)
build="$top/build"
jobs=$(nproc 2>/dev/null || echo 2)

# 1. packages: Debian's UCX, hwloc, PMIx, Open MPI (its mpirun serves PMIx),
#    Check, the autotools, and man-db/groff for the man-page test.
pkgs="build-essential autoconf automake libtool pkg-config libucx-dev libhwloc-dev
      libpmix-dev openmpi-bin check man-db groff-base python3 python3-numpy"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "== installing:$missing"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# 2. build
echo "== building in $build"
cd "$top"
if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt Makefile.in ]; then
    autoreconf -fi >/dev/null 2>&1 || autoreconf -fi
fi
mkdir -p "$build"
cd "$build"
if [ ! -f config.status ]; then
    "$top/configure" -q
fi
make -s -j"$jobs" >/dev/null

# mpirun refuses root unless told; more than 2 ranks on few cores needs
# oversubscription.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

if [ "$mode" = demo ]; then
    echo "== mpirun -n 4 examples/elastic_demo"
    exec mpirun --timeout 120 -n 4 ./examples/elastic_demo
fi

# 3. tests: automake hides Check's summaries in the logs; print them.
echo "== make check"
rc=0
make -j"$jobs" check >make-check.out 2>&1 || rc=$?
grep -E '^(PASS|FAIL|SKIP|XFAIL|XPASS|ERROR):' make-check.out || true
# why each skipped test skipped: the first SKIP line of its log
for f in $(sed -n 's/^SKIP: //p' make-check.out); do
    log=${f%.sh}.log
    [ -f "$log" ] && echo "   $(grep -m1 '^SKIP' "$log")"
done
echo "== Check summaries"
find . -name '*.log' ! -name 'test-suite.log' ! -name 'config.log' -print0 |
    xargs -0 grep -h -E '^[0-9]+%: Checks: ' 2>/dev/null || true
if [ -f test-suite.log ]; then
    pass=$(sed -n 's/^# PASS: *//p' test-suite.log)
    fail=$(sed -n 's/^# FAIL: *//p' test-suite.log)
    skip=$(sed -n 's/^# SKIP: *//p' test-suite.log)
    err=$(sed -n 's/^# ERROR: *//p' test-suite.log)
    [ "$rc" -ne 0 ] && grep -A40 -E '^(FAIL|ERROR):' test-suite.log | head -200
    echo "${pass:-0} passed, $(( ${fail:-0} + ${err:-0} )) failed, ${skip:-0} skipped"
else
    tail -50 make-check.out
    echo "0 passed, 1 failed"
fi
exit $rc
