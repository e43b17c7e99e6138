#!/bin/sh
# test_policy yield on 2 ranks with no progress thread (EMA_PROGRESS_THREAD=n), so that the
# order of the jobs is known: the policy's job that meets rank 1's recall defers to it, the
# recall completes, and the policy runs again by itself.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env DEVICE_MEMORY=8M SPILL=host SPILL_SIZE=64M PROGRESS_THREAD=n
exec "$MPIRUN" --oversubscribe --timeout 120 -x EMA_DEVICE_MEMORY -x EMA_SEGMENT_SIZE \
    -x EMA_LEND_RESERVE -x EMA_SPILL -x EMA_SPILL_SIZE -x EMA_PROGRESS_THREAD \
    -n 2 "$top_builddir/tests/mpi/test_policy" yield
