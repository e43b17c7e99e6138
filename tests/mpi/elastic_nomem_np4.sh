#!/bin/sh
# test_elastic nomem on 4 ranks: no spill tier and 2 lendable segments per peer: a grow beyond
# fails with EMA_ERR_NO_MEMORY and leaves the window and every rank's memory unchanged.
EMA_DEVICE_MEMORY=16M; export EMA_DEVICE_MEMORY
EMA_SEGMENT_SIZE=1M; export EMA_SEGMENT_SIZE
EMA_LEND_RESERVE=13M; export EMA_LEND_RESERVE
EMA_SPILL=none; export EMA_SPILL
. "$top_srcdir/tests/mpi/np4.sh"
np4 "$top_builddir/tests/mpi/test_elastic" nomem
