#!/bin/sh
# test_elastic nolend on 4 ranks: every rank reserves all of its memory, so no peer lends:
# grows spill, into a spill tier of 4 segments, and fail with EMA_ERR_NO_MEMORY once it is
# full.
EMA_DEVICE_MEMORY=16M; export EMA_DEVICE_MEMORY
EMA_SEGMENT_SIZE=1M; export EMA_SEGMENT_SIZE
EMA_LEND_RESERVE=16M; export EMA_LEND_RESERVE
EMA_SPILL=host; export EMA_SPILL
EMA_SPILL_SIZE=4M; export EMA_SPILL_SIZE
. "$top_srcdir/tests/mpi/np4.sh"
np4 "$top_builddir/tests/mpi/test_elastic" nolend
