#!/bin/sh
# test_regress granted on 4 ranks: a recall of segments rank 0 was granted and
# has not mapped yet (EMA_DEBUG_GROW_MAP_DELAY, rank 0 only) tells rank 0's
# reclaim callback before they move.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env SPILL=host SPILL_SIZE=64M DEBUG_GROW_MAP_DELAY=1500000
np4 --timeout 60 "$top_builddir/tests/mpi/test_regress" granted
