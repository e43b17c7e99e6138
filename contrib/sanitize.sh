#!/usr/bin/env bash
# Build EMA with sanitizers and run the test suite under them.
#   contrib/sanitize.sh [asan|tsan] [--subset | --tests="T..."] [--jobs=N]
# asan (default): -fsanitize=address,undefined, in ./build-asan; leaks on
#                 (LeakSanitizer), suppressions in contrib/sanitize/lsan.supp.
# tsan:           -fsanitize=thread, in ./build-tsan; suppressions in
#                 contrib/sanitize/tsan.supp.
# --subset:       only the tests listed in $subset below (see doc/sanitizers.md).
# --tests="T...": only these tests (make check TESTS="T..."), e.g.
#                 --tests=tests/mpi/regress_init_retry_np4.sh
# UCX's memory hooks are off (they patch malloc/mmap, which the sanitizers
# own too).  Python tests run the interpreter with the sanitizer runtime
# preloaded (python itself is not instrumented; LeakSanitizer is off there,
# CPython's own allocations at exit would drown anything else).
# Prints `N passed, N failed` and every sanitizer report line found in the
# test logs; exits nonzero if a test failed or a report was found.
# Needs what contrib/quickstart.sh installs (run that once first).
set -euo pipefail

usage() { echo "usage: $0 [asan|tsan] [--subset | --tests=\"T...\"] [--jobs=N]" >&2; exit 2; }
kind=asan subset_only=no jobs=2 only=
for arg in "$@"; do
    case "$arg" in
    asan|tsan) kind=$arg ;;
    --subset)  subset_only=yes ;;
    --tests=*) only=${arg#*=} ;;
    --jobs=*)  jobs=${arg#*=} ;;
    *)         usage ;;
    esac
done

top=$(cd "$(dirname "$0")/.." && pwd)
supp="$top/contrib/sanitize"
build="$top/build-$kind"

# The subset: unit tests, RMA and atomics on 2 ranks, the elastic suite on
# 4 ranks, the Python API.  About a third of the suite's time.
subset="tests/unit/test_config tests/unit/test_segment_pool tests/unit/test_status
        tests/unit/test_api_args tests/unit/test_api_args_elastic tests/unit/test_limits
        tests/unit/test_stat_fields tests/unit/test_lend_protocol tests/unit/test_win_lock
        tests/mpi/rma_np2.sh tests/mpi/atomics_np2.sh tests/mpi/elastic_np4.sh
        tests/python/api_np1.sh"

case $kind in
asan)
    san="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
    rtlibs="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
    ;;
tsan)
    san="-fsanitize=thread"
    rtlibs="$(gcc -print-file-name=libtsan.so)"
    ;;
esac
cflags="-O1 -g -fno-omit-frame-pointer $san"

# PMIx where pkg-config knows none (as in contrib/quickstart.sh)
pmix_env=()
if ! pkg-config --exists pmix 2>/dev/null; then
    for d in /usr/lib/x86_64-linux-gnu/pmix2 /usr/lib/aarch64-linux-gnu/pmix2 /usr/lib/pmix2; do
        if [ -f "$d/include/pmix.h" ]; then
            pmix_env=("PMIX_CFLAGS=-I$d/include" "PMIX_LIBS=-L$d/lib -Wl,-rpath,$d/lib -lpmix")
            break
        fi
    done
fi

cd "$top"
if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt Makefile.in ]; then
    autoreconf -fi >/dev/null 2>&1 || autoreconf -fi
fi
mkdir -p "$build"
cd "$build"
if [ ! -f config.status ] || ! grep -qF -- "$san" config.status; then
    echo "== configure in $build: CFLAGS=LDFLAGS=\"$cflags\""
    env "${pmix_env[@]}" "$top/configure" -q CFLAGS="$cflags" LDFLAGS="$cflags"
fi
echo "== make -j$jobs"
make -s -j"$jobs" >/dev/null

# Sanitizer settings.  halt_on_error: the first report ends the program
# (the test fails); log lines go to stderr, hence into tests/**/*.log.
export ASAN_OPTIONS="verify_asan_link_order=0:halt_on_error=1:abort_on_error=0:detect_leaks=1:detect_odr_violation=0:strict_string_checks=1:check_initialization_order=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
# UCX's memory hooks off: no malloc hooks, no mmap patching (names checked with
# UCX 1.13: libucm's MEM_ MALLOC_HOOKS, MMAP_HOOK_MODE; it has no UCX_MEM_EVENTS).
export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none
# hwloc's PCI plugin (hwloc_pci.so) is dlopen'ed and dlclose'd at each
# topology load, and takes libpciaccess with it: the memory libpciaccess's
# globals still point to (pci_system_init's pci_sys and its device array)
# then looks leaked, from frames LeakSanitizer cannot name ("<unknown
# module>"), hence cannot suppress.  Keeping libpciaccess loaded (preloaded)
# keeps that memory reachable and any real leak there symbolized (and
# suppressed by name in lsan.supp).  Not a leak of EMA.  (ASan's
# verify_asan_link_order=0 lets it come before the ASan runtime.)
pciaccess=$(ls /usr/lib/*-linux-gnu/libpciaccess.so.0 /usr/lib64/libpciaccess.so.0 2>/dev/null | head -n 1 || true)
[ -n "$pciaccess" ] && export LD_PRELOAD="$pciaccess${LD_PRELOAD:+:$LD_PRELOAD}"
# Check's per-test timeout (4 s by default) times 10: the sanitizers slow
# the unit tests (TSan, test_limits' windows at the segment limit: >4 s).
export CK_TIMEOUT_MULTIPLIER=${CK_TIMEOUT_MULTIPLIER:-10}
# mpirun as root, 4 ranks on 2 cores
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

# Python: the interpreter with the sanitizer runtime preloaded (tests/python/
# env.sh takes $PYTHON).
# The interpreter env.sh would pick: the first of python3, /usr/bin/python3
# with numpy, else python3.
py=
for c in python3 /usr/bin/python3; do
    c=$(command -v "$c" 2>/dev/null) || continue
    if "$c" -c 'import numpy' 2>/dev/null; then py=$c; break; fi
    [ -n "$py" ] || py=$c
done
if [ -n "$py" ]; then
    cat >"$build/python-san" <<EOF
#!/bin/sh
# python3 with the $kind runtime preloaded (written by contrib/sanitize.sh)
LD_PRELOAD="$rtlibs\${LD_PRELOAD:+:\$LD_PRELOAD}" \\
ASAN_OPTIONS="\$ASAN_OPTIONS:detect_leaks=0:verify_asan_link_order=0" \\
exec "$py" "\$@"
EOF
    chmod +x "$build/python-san"
    export PYTHON="$build/python-san"
fi

tests=()
if [ -n "$only" ]; then
    tests=(TESTS="$only")
    echo "== make check TESTS=\"$only\""
elif [ "$subset_only" = yes ]; then
    tests=(TESTS="$(echo $subset)")
    echo "== make check (subset: $(echo $subset))"
else
    # The whole suite but kv_serving_np4.sh: its latency bound (elastic's
    # cold-rank TTFT p99 <= 2x static + 50 ms) fails with both UCX memory
    # hooks off, sanitizer or not (doc/sanitizers.md); run it with --tests.
    # Under TSan also but test_fuzz_replay: its world maps the arenas at
    # fixed addresses (tests/fuzz/fuzz_world.h, 0x500000000000), which
    # fall in TSan's own ranges ("mmap at bad address"); the normal and
    # the ASan suites replay the corpus.
    skip='tests/mpi/kv_serving_np4.sh'
    [ "$kind" = tsan ] && skip="$skip tests/unit/test_fuzz_replay"
    all=$(printf 'print-tests:\n\t@echo $(TESTS)\n' | make -s -f Makefile -f - print-tests)
    tests=(TESTS="$(printf '%s\n' $all | grep -v -x -F "$(printf '%s\n' $skip)" | tr '\n' ' ')")
    echo "== make check (all but $skip)"
fi
find tests -name '*.log' -delete 2>/dev/null || true
rm -f test-suite.log
start=$(date +%s)
rc=0
make -j"$jobs" check "${tests[@]}" >make-check.out 2>&1 || rc=$?
grep -E '^(PASS|FAIL|SKIP|XFAIL|XPASS|ERROR):' make-check.out || true
echo "== make check took $(( $(date +%s) - start )) s"

# Sanitizer reports in the test logs.
pattern='ERROR: AddressSanitizer|runtime error:|WARNING: ThreadSanitizer|ERROR: LeakSanitizer|SUMMARY: (Address|Thread|Leak|UndefinedBehavior)Sanitizer'
reports=$(find tests -name '*.log' -print0 | xargs -0 grep -H -E "$pattern" 2>/dev/null || true)
nrep=0
if [ -n "$reports" ]; then
    nrep=$(printf '%s\n' "$reports" | wc -l)
    echo "== sanitizer reports ($nrep lines):"
    printf '%s\n' "$reports"
fi
. "$top/contrib/check_counts.sh"
check_counts "$rc"
echo "$kind: $pass passed, $fail failed, ${skip:-0} skipped, $nrep sanitizer report lines"
[ "$rc" -eq 0 ] && [ "$fail" -eq 0 ] && [ "$nrep" -eq 0 ]
