#!/bin/sh
# tests/fault/test_fault SCENARIO on 3 ranks under mpirun's recovery mode:
# the victim dies by SIGKILL; each of the 2 survivors must print its PASS
# line (within FAULT_BOUND = 10 s + EMA_PEER_TIMEOUT of the kill), and
# no line may say FAIL.  Usage: kill.sh SCENARIO (from the wrappers).
if [ -z "$MPIRUN" ]; then
    echo "SKIP: no mpirun found by configure (MPIRUN is empty)"
    exit 77
fi
# Open MPI 4.1: --enable-recovery (the same as --mca orte_enable_recovery 1)
# keeps the survivors running; without it mpirun kills them all.
if ! "$MPIRUN" --enable-recovery --timeout 10 -n 1 true >/dev/null 2>&1; then
    echo "SKIP: this mpirun has no --enable-recovery: it kills the job when a rank dies"
    exit 77
fi
scenario=$1
EMA_PEER_TIMEOUT=${EMA_PEER_TIMEOUT:-5}
EMA_PROGRESS_THREAD=${EMA_PROGRESS_THREAD:-y}   # the _noprog wrappers: n
export EMA_PROGRESS_THREAD
FAULT_BOUND=$((10 + EMA_PEER_TIMEOUT))
FAULT_DIR=$(mktemp -d)
export EMA_PEER_TIMEOUT FAULT_BOUND FAULT_DIR
trap 'rm -rf "$FAULT_DIR"' EXIT
out=$FAULT_DIR/out
"$MPIRUN" --oversubscribe --enable-recovery --timeout $((FAULT_BOUND + 40)) \
    -x EMA_DEVICE_MEMORY=8M -x EMA_SEGMENT_SIZE=1M -x EMA_LEND_RESERVE=0 -x EMA_SPILL=none \
    -x EMA_PEER_TIMEOUT -x EMA_PROGRESS_THREAD -x FAULT_BOUND -x FAULT_DIR \
    -n 3 "$top_builddir/tests/fault/test_fault" "$scenario" >"$out" 2>&1
rc=$?
cat "$out"
pass=$(grep -c "^PASS rank" "$out")
echo "mpirun exit status $rc; $pass survivors passed"
if ! grep -q "^KILL rank" "$out"; then
    echo "FAIL: the victim did not die where the scenario says"
    exit 1
fi
if grep -q "FAIL" "$out" || [ "$pass" -ne 2 ]; then
    echo "FAIL: $scenario: every survivor must pass"
    exit 1
fi
exit 0
