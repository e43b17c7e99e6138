#!/bin/sh
# test_regress held_noprog on 4 ranks, no progress thread: a recall of a held
# segment never blocks ema_progress or ema_barrier; the free segments move at once.
EMA_DEVICE_MEMORY=16M; export EMA_DEVICE_MEMORY
EMA_SEGMENT_SIZE=1M; export EMA_SEGMENT_SIZE
EMA_LEND_RESERVE=0; export EMA_LEND_RESERVE
EMA_SPILL=host; export EMA_SPILL
EMA_SPILL_SIZE=64M; export EMA_SPILL_SIZE
EMA_PROGRESS_THREAD=n; export EMA_PROGRESS_THREAD
. "$top_srcdir/tests/mpi/np4.sh"
np4 --timeout 60 "$top_builddir/tests/mpi/test_regress" held_noprog
