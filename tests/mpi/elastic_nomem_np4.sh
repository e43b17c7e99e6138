#!/bin/sh
# test_elastic nomem on 4 ranks: no spill tier and 2 lendable segments per peer: a grow beyond
# fails with EMA_ERR_NO_MEMORY and leaves the window and every rank's memory unchanged.
if [ -z "$MPIRUN" ]; then
    echo "SKIP: no mpirun found by configure (MPIRUN is empty)"
    exit 77
fi
EMA_DEVICE_MEMORY=16M; export EMA_DEVICE_MEMORY
EMA_SEGMENT_SIZE=1M; export EMA_SEGMENT_SIZE
EMA_LEND_RESERVE=13M; export EMA_LEND_RESERVE
EMA_SPILL=none; export EMA_SPILL
exec "$MPIRUN" --oversubscribe --timeout 120 -x EMA_DEVICE_MEMORY -x EMA_SEGMENT_SIZE -x EMA_LEND_RESERVE -x EMA_SPILL \
    -n 4 "$top_builddir/tests/mpi/test_elastic" nomem
