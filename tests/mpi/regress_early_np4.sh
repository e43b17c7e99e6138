#!/bin/sh
# test_regress early on 4 ranks: rank 2 is slow (300 ms) to make each new window
# known, while rank 0 moves its new window at once; rank 2's gets must be right.
EMA_DEVICE_MEMORY=16M; export EMA_DEVICE_MEMORY
EMA_SEGMENT_SIZE=1M; export EMA_SEGMENT_SIZE
EMA_LEND_RESERVE=0; export EMA_LEND_RESERVE
EMA_SPILL=none; export EMA_SPILL
EMA_DEBUG_WIN_LINK_DELAY=300000; export EMA_DEBUG_WIN_LINK_DELAY
. "$top_srcdir/tests/mpi/np4.sh"
np4 --timeout 60 "$top_builddir/tests/mpi/test_regress" early
