#!/bin/sh
# test_atomics on 1 rank, with 64K segments so that transfers cross many segment boundaries.
if [ -z "$MPIRUN" ]; then
    echo "SKIP: no mpirun found by configure (MPIRUN is empty)"
    exit 77
fi
EMA_SEGMENT_SIZE=64K; export EMA_SEGMENT_SIZE
EMA_DEVICE_MEMORY=64M; export EMA_DEVICE_MEMORY
exec "$MPIRUN" --oversubscribe --timeout 60 -x EMA_SEGMENT_SIZE -x EMA_DEVICE_MEMORY \
    -n 1 "$top_builddir/tests/mpi/test_atomics"
