#!/bin/sh
# test_regress cblock on 4 ranks: an owner holding its borrowed window in a tight loop under a
# mutex its reclaim callback takes too; the callback never runs inside ema_win_acquire and no
# acquire stalls behind it, while the lenders reclaim.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env SPILL=none
np4 --timeout 60 "$top_builddir/tests/mpi/test_regress" cblock
