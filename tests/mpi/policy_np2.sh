#!/bin/sh
# test_policy walk on 2 ranks (host kind, progress thread): rank 0 walks a window of 7 groups of
# 2 segments, 4 groups in its own memory (EMA_DEVICE_MEMORY=8M in 1M segments) and 3 borrowed
# from rank 1, with the prefetch policy at depth 2, group 0 held; then rank 1 reclaims all it
# lent while rank 0 walks on (the data moves to rank 0's spill tier).
. "$top_srcdir/tests/mpi/np4.sh"
np4_env DEVICE_MEMORY=8M SPILL=host SPILL_SIZE=64M
exec "$MPIRUN" --oversubscribe --timeout 120 -x EMA_DEVICE_MEMORY -x EMA_SEGMENT_SIZE \
    -x EMA_LEND_RESERVE -x EMA_SPILL -x EMA_SPILL_SIZE -n 2 "$top_builddir/tests/mpi/test_policy" walk
