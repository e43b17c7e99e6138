#!/bin/sh
# Rank 1 of 2 with EMA_SEGMENT_SIZE=128K, rank 0 with 64K: ema_init fails on
# both ranks with EMA_ERR_INVALID_PARAM and one line naming
# EMA_SEGMENT_SIZE, again when retried, and succeeds once the sizes agree.
if [ -z "$MPIRUN" ]; then
    echo "SKIP: no mpirun found by configure (MPIRUN is empty)"
    exit 77
fi
EMA_DEVICE_MEMORY=64M; export EMA_DEVICE_MEMORY
EMA_SEGMENT_SIZE=64K; export EMA_SEGMENT_SIZE
EMA_BOOT_TIMEOUT=30; export EMA_BOOT_TIMEOUT
exec "$MPIRUN" --oversubscribe --timeout 90 -x EMA_DEVICE_MEMORY -x EMA_SEGMENT_SIZE \
    -x EMA_BOOT_TIMEOUT -n 2 "$top_builddir/tests/mpi/test_settings_mismatch" segment
