#!/bin/sh
# test_regress order on 4 ranks: lenders with 8, 32 and 16 segments lendable;
# every borrow goes to the one with the most lendable memory now.
EMA_DEVICE_MEMORY=48M; export EMA_DEVICE_MEMORY
EMA_SEGMENT_SIZE=1M; export EMA_SEGMENT_SIZE
EMA_LEND_RESERVE=0; export EMA_LEND_RESERVE
EMA_SPILL=none; export EMA_SPILL
. "$top_srcdir/tests/mpi/np4.sh"
np4 --timeout 60 "$top_builddir/tests/mpi/test_regress" order
