#!/bin/sh
# test_policy readonly on 2 ranks (host kind, progress thread): nothing is lent
# (EMA_LEND_RESERVE = the 8M of each rank), so rank 0's window of 7 groups of 2 segments is
# 4 groups local and 3 in its spill tier; EMA_WIN_POLICY_FLAG_READ_ONLY walks it twice:
# spill copies kept on the way home, evictions with no copy on the second walk.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env DEVICE_MEMORY=8M LEND_RESERVE=8M SPILL=host SPILL_SIZE=64M
exec "$MPIRUN" --oversubscribe --timeout 120 -x EMA_DEVICE_MEMORY -x EMA_SEGMENT_SIZE \
    -x EMA_LEND_RESERVE -x EMA_SPILL -x EMA_SPILL_SIZE -n 2 "$top_builddir/tests/mpi/test_policy" readonly
