#!/bin/sh
# test_elastic held on 4 ranks: a peer's ema_get past rank 0's size (a table lookup) while a
# lender's reclaim waits on a range rank 0 holds with ema_win_acquire must not hang. Run
# alone: a failure is a hang, and the rank that sees it ends the job.
EMA_DEVICE_MEMORY=16M; export EMA_DEVICE_MEMORY
EMA_SEGMENT_SIZE=1M; export EMA_SEGMENT_SIZE
EMA_LEND_RESERVE=0; export EMA_LEND_RESERVE
EMA_SPILL=host; export EMA_SPILL
EMA_SPILL_SIZE=64M; export EMA_SPILL_SIZE
. "$top_srcdir/tests/mpi/np4.sh"
np4 "$top_builddir/tests/mpi/test_elastic" held
