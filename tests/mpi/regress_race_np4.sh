#!/bin/sh
# test_regress race on 4 ranks for RACE_SECONDS (20 s by default): fresh windows
# grown, prefetched, shrunk and reclaimed while third ranks read them, every byte checked.
EMA_DEVICE_MEMORY=16M; export EMA_DEVICE_MEMORY
EMA_SEGMENT_SIZE=1M; export EMA_SEGMENT_SIZE
EMA_LEND_RESERVE=0; export EMA_LEND_RESERVE
EMA_SPILL=host; export EMA_SPILL
EMA_SPILL_SIZE=64M; export EMA_SPILL_SIZE
: "${RACE_SECONDS:=20}"
. "$top_srcdir/tests/mpi/np4.sh"
np4 --timeout $((RACE_SECONDS + 60)) "$top_builddir/tests/mpi/test_regress" race "$RACE_SECONDS"
