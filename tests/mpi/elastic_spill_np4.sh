#!/bin/sh
# test_elastic spill on 4 ranks: a reserve of 13M of 16M leaves each peer 2 lendable segments,
# so grows spill; shrink gives spilled segments back before borrowed ones.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env LEND_RESERVE=13M SPILL=host SPILL_SIZE=64M
np4 "$top_builddir/tests/mpi/test_elastic" spill
