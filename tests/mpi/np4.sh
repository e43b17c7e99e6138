# Sourced by the 4-rank test scripts once they have exported their EMA_*
# variables: skips (exit 77) where configure found no mpirun, and defines
#   np4 [--timeout S] PROGRAM ARGS...
# which runs PROGRAM on 4 ranks under mpirun --timeout (120 s by default),
# oversubscribed (the CI machine has 2 cores), with every EMA_* variable of
# the environment passed on to the ranks.
if [ -z "$MPIRUN" ]; then
    echo "SKIP: no mpirun found by configure (MPIRUN is empty)"
    exit 77
fi

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
