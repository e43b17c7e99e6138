# Sourced by the multi-rank test scripts: skips (exit 77) where configure
# found no mpirun, and defines
#   np4_env [NAME=VALUE...]
# which exports the memory most of them use, EMA_DEVICE_MEMORY=16M in
# EMA_SEGMENT_SIZE=1M segments with EMA_LEND_RESERVE=0, then EMA_NAME=VALUE
# for each argument (which may change one of those three), and
#   np4 [--timeout S] PROGRAM ARGS...
# which runs PROGRAM on 4 ranks under mpirun --timeout (120 s by default),
# oversubscribed (the CI machine has 2 cores), with every EMA_* variable of
# the environment passed on to the ranks,
#   np4_lines [--timeout S] MODE REGEX
# which runs tests/mpi/test_regress MODE as np4 does, prints its output, and
# returns 0 only when mpirun exits 0 and 4 lines (one per rank) match REGEX,
# and
#   np_seg64k N PROGRAM
# which runs tests/mpi/PROGRAM on N ranks under mpirun --timeout 60 with
# EMA_SEGMENT_SIZE=64K and EMA_DEVICE_MEMORY=64M (those two passed on), so
# that transfers cross many segment boundaries.
if [ -z "$MPIRUN" ]; then
    echo "SKIP: no mpirun found by configure (MPIRUN is empty)"
    exit 77
fi

np4_env() {
    EMA_DEVICE_MEMORY=16M; export EMA_DEVICE_MEMORY
    EMA_SEGMENT_SIZE=1M; export EMA_SEGMENT_SIZE
    EMA_LEND_RESERVE=0; export EMA_LEND_RESERVE
    for np4_a in "$@"; do
        export "EMA_$np4_a"
    done
}

np4() {
    np4_timeout=120
    if [ "$1" = --timeout ]; then
        np4_timeout=$2
        shift 2
    fi
    np4_x=
    for np4_v in $(env | sed -n 's/^\(EMA_[A-Za-z0-9_]*\)=.*/\1/p'); do
        np4_x="$np4_x -x $np4_v"
    done
    # shellcheck disable=SC2086
    exec "$MPIRUN" --oversubscribe --timeout "$np4_timeout" $np4_x -n 4 "$@"
}

np4_lines() {
    np4_lt=120
    if [ "$1" = --timeout ]; then
        np4_lt=$2
        shift 2
    fi
    np4_out=$( (np4 --timeout "$np4_lt" "$top_builddir/tests/mpi/test_regress" "$1") 2>&1)
    np4_rc=$?
    echo "$np4_out"
    np4_n=$(echo "$np4_out" | grep -c "$2")
    echo "mpirun exit status $np4_rc, $np4_n of 4 ranks' lines match"
    if [ "$np4_rc" -ne 0 ] || [ "$np4_n" -ne 4 ]; then
        echo "FAIL: test_regress $1"
        return 1
    fi
    echo "PASS: test_regress $1"
}

np_seg64k() {
    EMA_SEGMENT_SIZE=64K; export EMA_SEGMENT_SIZE
    EMA_DEVICE_MEMORY=64M; export EMA_DEVICE_MEMORY
    exec "$MPIRUN" --oversubscribe --timeout 60 -x EMA_SEGMENT_SIZE -x EMA_DEVICE_MEMORY \
        -n "$1" "$top_builddir/tests/mpi/$2"
}
