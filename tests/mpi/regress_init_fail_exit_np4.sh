#!/bin/sh
# test_regress init_fail_exit on 4 ranks: every ema_init fails and every
# rank returns 0, so mpirun must exit 0 and every rank's line must come out
# (Open MPI aborted the job when the failed ema_init left PMIx open).
. "$top_srcdir/tests/mpi/np4.sh"
out=$("$MPIRUN" --oversubscribe --timeout 60 -n 4 "$top_builddir/tests/mpi/test_regress" \
      init_fail_exit 2>&1)
rc=$?
echo "$out"
n=$(echo "$out" | grep -c "^init_fail_exit rank [0-3]: ema_init invalid parameter")
echo "mpirun exit status $rc, $n of 4 ranks reported"
if [ "$rc" -ne 0 ] || [ "$n" -ne 4 ]; then
    echo "FAIL: test_regress init_fail_exit"
    exit 1
fi
echo "PASS: test_regress init_fail_exit"
