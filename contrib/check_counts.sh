# shellcheck shell=bash
# Sourced by contrib/quickstart.sh and contrib/sanitize.sh: the test
# suite's counts, read in the build folder after
#   make check ... >make-check.out 2>&1 || rc=$?

# check_counts RC: sets pass, fail (failed and errors) and skip from
# test-suite.log, printing the failed tests' logs where make check failed
# (RC not 0).  With no test-suite.log (make check stopped before running
# the tests): the end of make-check.out, and pass=0 fail=1, skip empty.
check_counts() {
    if [ -f test-suite.log ]; then
        pass=$(sed -n 's/^# PASS: *//p' test-suite.log)
        fail=$(sed -n 's/^# FAIL: *//p' test-suite.log)
        skip=$(sed -n 's/^# SKIP: *//p' test-suite.log)
        err=$(sed -n 's/^# ERROR: *//p' test-suite.log)
        [ "$1" -ne 0 ] && grep -A40 -E '^(FAIL|ERROR):' test-suite.log | head -200
        pass=${pass:-0} fail=$(( ${fail:-0} + ${err:-0} )) skip=${skip:-0}
    else
        tail -50 make-check.out
        pass=0 fail=1 skip=
    fi
}
