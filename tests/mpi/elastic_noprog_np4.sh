#!/bin/sh
# test_elastic noprog on 4 ranks, with no progress thread (EMA_PROGRESS_THREAD=n): a lender's
# explicit reclaim, and a lender's own grow (implicit reclaim), while the borrower waits in
# ema_barrier, whose waits must run the migration. 16 segments of 1M per rank, spill to host.
EMA_DEVICE_MEMORY=16M; export EMA_DEVICE_MEMORY
EMA_SEGMENT_SIZE=1M; export EMA_SEGMENT_SIZE
EMA_LEND_RESERVE=0; export EMA_LEND_RESERVE
EMA_SPILL=host; export EMA_SPILL
EMA_SPILL_SIZE=64M; export EMA_SPILL_SIZE
EMA_PROGRESS_THREAD=n; export EMA_PROGRESS_THREAD
. "$top_srcdir/tests/mpi/np4.sh"
np4 "$top_builddir/tests/mpi/test_elastic" noprog
