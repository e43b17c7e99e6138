#!/bin/sh
# test_regress order on 4 ranks: lenders with 8, 32 and 16 segments lendable;
# every borrow goes to the one with the most lendable memory now.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env DEVICE_MEMORY=48M SPILL=none
np4 --timeout 60 "$top_builddir/tests/mpi/test_regress" order
