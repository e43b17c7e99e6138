#!/bin/sh
# test_borrow_all on 4 ranks: rank 0 grows a window to twice its memory by borrowing from
# every peer, the peers take their memory back one after another, and every word of the
# window is checked after each step. 16 segments of 1M per rank, nothing reserved, no spill.
EMA_DEVICE_MEMORY=16M; export EMA_DEVICE_MEMORY
EMA_SEGMENT_SIZE=1M; export EMA_SEGMENT_SIZE
EMA_LEND_RESERVE=0; export EMA_LEND_RESERVE
EMA_SPILL=none; export EMA_SPILL
. "$top_srcdir/tests/mpi/np4.sh"
np4 --timeout 60 "$top_builddir/tests/mpi/test_borrow_all" 2
