#!/bin/sh
# Rank 1 of 4 with EMA_SPILL=none, the others host: ema_init fails on every
# rank with EMA_ERR_INVALID_PARAM and one line naming EMA_SPILL (it used to
# succeed, with an open(/proc/0/fd/0) error and every peer on the slow
# path), fails again the same way, and succeeds once EMA_SPILL agrees.
# EMA_BOOT_TIMEOUT is short so that a rank left waiting shows as a failure.
EMA_DEVICE_MEMORY=64M; export EMA_DEVICE_MEMORY
EMA_SEGMENT_SIZE=64K; export EMA_SEGMENT_SIZE
EMA_SPILL=host; export EMA_SPILL
EMA_SPILL_SIZE=64M; export EMA_SPILL_SIZE
EMA_BOOT_TIMEOUT=30; export EMA_BOOT_TIMEOUT
. "$top_srcdir/tests/mpi/np4.sh"
np4 --timeout 90 "$top_builddir/tests/mpi/test_settings_mismatch" spill
