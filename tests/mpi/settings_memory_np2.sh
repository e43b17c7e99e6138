#!/bin/sh
# Two host-kind ranks, each asking for 60% of the machine's memory: each
# fits alone, together they do not, and the background prefault would drive
# the machine to the OOM killer.  ema_init fails on both ranks with
# EMA_ERR_NO_MEMORY and one line naming EMA_DEVICE_MEMORY, again when
# retried, and succeeds with 64M each.  Nothing is faulted in: the arenas
# are address space until the check has passed.  No huge pages, so the
# attempt takes none.
if [ -z "$MPIRUN" ]; then
    echo "SKIP: no mpirun found by configure (MPIRUN is empty)"
    exit 77
fi
EMA_MEMORY_KIND=host; export EMA_MEMORY_KIND
EMA_HUGEPAGES=n; export EMA_HUGEPAGES
EMA_SEGMENT_SIZE=2M; export EMA_SEGMENT_SIZE
EMA_SPILL_SIZE=64M; export EMA_SPILL_SIZE
EMA_BOOT_TIMEOUT=30; export EMA_BOOT_TIMEOUT
exec "$MPIRUN" --oversubscribe --timeout 90 -x EMA_MEMORY_KIND -x EMA_HUGEPAGES \
    -x EMA_SEGMENT_SIZE -x EMA_SPILL_SIZE -x EMA_BOOT_TIMEOUT \
    -n 2 "$top_builddir/tests/mpi/test_settings_mismatch" memory
