#!/bin/sh
# test_regress early on 4 ranks: rank 2 is slow (300 ms) to make each new window
# known, while rank 0 moves its new window at once; rank 2's gets must be right.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env SPILL=none DEBUG_WIN_LINK_DELAY=300000
np4 --timeout 60 "$top_builddir/tests/mpi/test_regress" early
