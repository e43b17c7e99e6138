#!/bin/sh
# test_regress held_noprog on 4 ranks, no progress thread: a recall of a held
# segment never blocks ema_progress or ema_barrier; the free segments move at once.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env SPILL=host SPILL_SIZE=64M PROGRESS_THREAD=n
np4 --timeout 60 "$top_builddir/tests/mpi/test_regress" held_noprog
