#!/bin/sh
# A launcher environment whose PMIx server cannot be reached: ema_init must
# return EMA_ERR_BOOTSTRAP quickly (test_bootstrap_broken checks the status
# and the time) and print exactly one clear error line.  timeout(1) guards
# against a hang; no mpirun is involved.
prog="$top_builddir/tests/mpi/test_bootstrap_broken"
err=$(mktemp "${TMPDIR:-/tmp}/ema-boot.XXXXXX") || exit 99
trap 'rm -f "$err"' EXIT
fail=0
EMA_DEVICE_MEMORY=64M; export EMA_DEVICE_MEMORY
check() { # $1: what, then the PMIX_SERVER_URI4 value
    what=$1
    env PMIX_NAMESPACE=bogus PMIX_RANK=0 PMIX_SERVER_URI4="$2" timeout 30 "$prog" 2>"$err"
    rc=$?
    lines=$(wc -l <"$err")
    echo "--- stderr with $what ($lines line(s)):"
    cat "$err"
    if [ $rc -eq 124 ]; then
        echo "FAIL: ema_init hung with $what"; fail=1
    elif [ $rc -ne 0 ]; then
        echo "FAIL: test_bootstrap_broken exited $rc with $what"; fail=1
    fi
    if [ "$lines" -ne 1 ]; then
        echo "FAIL: $what gave $lines lines on stderr, expected one clear error line"; fail=1
    elif ! grep -qi 'pmix' "$err"; then
        echo "FAIL: the error line with $what does not name PMIx"; fail=1
    fi
}
check "a garbage server URI" garbage
check "a well-formed URI nobody listens on" 'bogus.0;tcp4://127.0.0.1:1'
[ $fail -eq 0 ] && echo "PASS bootstrap_broken"
exit $fail
