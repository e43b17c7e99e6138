#!/bin/sh
# test_elastic spill on 4 ranks: a reserve of 13M of 16M leaves each peer 2 lendable segments,
# so grows spill; shrink gives spilled segments back before borrowed ones.
EMA_DEVICE_MEMORY=16M; export EMA_DEVICE_MEMORY
EMA_SEGMENT_SIZE=1M; export EMA_SEGMENT_SIZE
EMA_LEND_RESERVE=13M; export EMA_LEND_RESERVE
EMA_SPILL=host; export EMA_SPILL
EMA_SPILL_SIZE=64M; export EMA_SPILL_SIZE
. "$top_srcdir/tests/mpi/np4.sh"
np4 "$top_builddir/tests/mpi/test_elastic" spill
