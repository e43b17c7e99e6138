#!/bin/sh
# test_elastic nolend on 4 ranks: every rank reserves all of its memory, so no peer lends:
# grows spill, into a spill tier of 4 segments, and fail with EMA_ERR_NO_MEMORY once it is
# full.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env LEND_RESERVE=16M SPILL=host SPILL_SIZE=4M
np4 "$top_builddir/tests/mpi/test_elastic" nolend
