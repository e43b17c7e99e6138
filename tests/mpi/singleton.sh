#!/bin/sh
# A program started without any launcher is a world of one (test_singleton).
# Drop anything a launcher may have left in the environment.
for v in $(env | sed -n 's/^\(PMIX_[A-Za-z0-9_]*\)=.*/\1/p; s/^\(OMPI_COMM_WORLD[A-Za-z0-9_]*\)=.*/\1/p'); do
    unset "$v"
done
EMA_SEGMENT_SIZE=64K; export EMA_SEGMENT_SIZE
EMA_DEVICE_MEMORY=64M; export EMA_DEVICE_MEMORY
exec timeout 30 "$top_builddir/tests/mpi/test_singleton"
