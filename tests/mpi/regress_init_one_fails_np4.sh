#!/bin/sh
# test_regress init_one_fails on 4 ranks: rank 1's ema_init fails and it
# exits; ranks 0, 2 and 3 must fail at once with EMA_ERR_PEER_LOST (not
# after EMA_BOOT_TIMEOUT, set to 60 s here), and every rank must print its
# line with "ok".
. "$top_srcdir/tests/mpi/np4.sh"
EMA_BOOT_TIMEOUT=60; export EMA_BOOT_TIMEOUT
out=$("$MPIRUN" --oversubscribe --timeout 90 -x EMA_BOOT_TIMEOUT -n 4 \
      "$top_builddir/tests/mpi/test_regress" init_one_fails 2>&1)
rc=$?
echo "$out"
n=$(echo "$out" | grep -c "^init_one_fails rank [0-3]: .*: ok$")
echo "mpirun exit status $rc, $n of 4 ranks ok"
if [ "$rc" -ne 0 ] || [ "$n" -ne 4 ]; then
    echo "FAIL: test_regress init_one_fails"
    exit 1
fi
echo "PASS: test_regress init_one_fails"
