#!/bin/sh
# test_elastic noprog on 4 ranks, with no progress thread (EMA_PROGRESS_THREAD=n): a lender's
# explicit reclaim, and a lender's own grow (implicit reclaim), while the borrower waits in
# ema_barrier, whose waits must run the migration. 16 segments of 1M per rank, spill to host.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env SPILL=host SPILL_SIZE=64M PROGRESS_THREAD=n
np4 "$top_builddir/tests/mpi/test_elastic" noprog
