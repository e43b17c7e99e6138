#!/bin/sh
# test_borrow_all on 4 ranks: rank 0 grows a window to twice its memory by borrowing from
# every peer, the peers take their memory back one after another, and every word of the
# window is checked after each step. 16 segments of 1M per rank, nothing reserved, no spill.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env SPILL=none
np4 --timeout 60 "$top_builddir/tests/mpi/test_borrow_all" 2
