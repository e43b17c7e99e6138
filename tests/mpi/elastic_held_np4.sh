#!/bin/sh
# test_elastic held on 4 ranks: a peer's ema_get past rank 0's size (a table lookup) while a
# lender's reclaim waits on a range rank 0 holds with ema_win_acquire must not hang. Run
# alone: a failure is a hang, and the rank that sees it ends the job.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env SPILL=host SPILL_SIZE=64M
np4 "$top_builddir/tests/mpi/test_elastic" held
