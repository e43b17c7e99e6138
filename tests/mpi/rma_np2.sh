#!/bin/sh
# test_rma on 2 ranks, with 64K segments so that transfers cross many segment boundaries.
. "$top_srcdir/tests/mpi/np4.sh"
np_seg64k 2 test_rma
