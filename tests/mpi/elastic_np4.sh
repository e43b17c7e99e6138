#!/bin/sh
# test_elastic default on 4 ranks: grow past capacity, base pointer, explicit and implicit
# reclaim, acquire/release, puts and gets racing a migration, argument checks. 16 segments of
# 1M per rank, nothing reserved, spill to host.
EMA_DEVICE_MEMORY=16M; export EMA_DEVICE_MEMORY
EMA_SEGMENT_SIZE=1M; export EMA_SEGMENT_SIZE
EMA_LEND_RESERVE=0; export EMA_LEND_RESERVE
EMA_SPILL=host; export EMA_SPILL
EMA_SPILL_SIZE=64M; export EMA_SPILL_SIZE
. "$top_srcdir/tests/mpi/np4.sh"
np4 "$top_builddir/tests/mpi/test_elastic" default
