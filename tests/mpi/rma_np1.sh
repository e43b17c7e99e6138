#!/bin/sh
# test_rma on 1 rank, with 64K segments so that transfers cross many segment boundaries.
. "$top_srcdir/tests/mpi/np4.sh"
np_seg64k 1 test_rma
