#!/bin/sh
# test_policy wait on 2 ranks, first with no progress thread (EMA_PROGRESS_THREAD=n): with
# EMA_WIN_POLICY_FLAG_WAIT, ema_win_advance runs the policy's job itself and returns with
# its group local; without the flag nothing moves.  Then waitthread: the same with the
# progress thread running the job while the advance waits.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env DEVICE_MEMORY=8M LEND_RESERVE=8M SPILL=host SPILL_SIZE=64M PROGRESS_THREAD=n
"$MPIRUN" --oversubscribe --timeout 120 -x EMA_DEVICE_MEMORY -x EMA_SEGMENT_SIZE \
    -x EMA_LEND_RESERVE -x EMA_SPILL -x EMA_SPILL_SIZE -x EMA_PROGRESS_THREAD \
    -n 2 "$top_builddir/tests/mpi/test_policy" wait || exit 1
EMA_PROGRESS_THREAD=y
exec "$MPIRUN" --oversubscribe --timeout 120 -x EMA_DEVICE_MEMORY -x EMA_SEGMENT_SIZE \
    -x EMA_LEND_RESERVE -x EMA_SPILL -x EMA_SPILL_SIZE -x EMA_PROGRESS_THREAD \
    -n 2 "$top_builddir/tests/mpi/test_policy" waitthread
