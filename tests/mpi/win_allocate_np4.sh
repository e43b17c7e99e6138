#!/bin/sh
# test_win_allocate on 4 ranks, with 64K segments so that transfers cross many segment boundaries.
. "$top_srcdir/tests/mpi/np4.sh"
np_seg64k 4 test_win_allocate
