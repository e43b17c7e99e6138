#!/bin/sh
# test_elastic nomem on 4 ranks: no spill tier and 2 lendable segments per peer: a grow beyond
# fails with EMA_ERR_NO_MEMORY and leaves the window and every rank's memory unchanged.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env LEND_RESERVE=13M SPILL=none
np4 "$top_builddir/tests/mpi/test_elastic" nomem
