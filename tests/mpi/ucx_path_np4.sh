#!/bin/sh
# The UCX data path on any machine: with EMA_HOST_DIRECT=n the host kind sends put, get and
# atomics through UCX, and moves migrating segments with the batch used on the cuda kind
# (ema__win_seg_move_batch: copies queued in pieces, each remapped once its mark is passed),
# as a GPU would; a recall gives the old memory back before the remaps). Runs test_rma,
# test_atomics, test_elastic (16 segments of 1M per rank, nothing reserved, spill to host),
# test_borrow_all and 5 s of ema_stress on 4 ranks that way, and test_policy's walk and
# readonly (evictions remapped to kept copies, no copy) on 2.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env HOST_DIRECT=n SPILL=host SPILL_SIZE=64M
rc=0
for prog in test_rma test_atomics "test_elastic default"; do
    echo "== $prog (EMA_HOST_DIRECT=n)"
    # shellcheck disable=SC2086
    "$MPIRUN" --oversubscribe --timeout 120 -x EMA_HOST_DIRECT -x EMA_DEVICE_MEMORY \
        -x EMA_SEGMENT_SIZE -x EMA_LEND_RESERVE -x EMA_SPILL -x EMA_SPILL_SIZE \
        -n 4 "$top_builddir/tests/mpi/"$prog || rc=1
done
# Runs longer than a migration's 64 MiB copy piece: 192M of 2M segments per rank, so a
# reclaim moves up to 96 segments in several pieces.
echo "== test_borrow_all, 192M per rank in 2M segments (EMA_HOST_DIRECT=n)"
EMA_DEVICE_MEMORY=192M EMA_SEGMENT_SIZE=2M "$MPIRUN" --oversubscribe --timeout 120 \
    -x EMA_HOST_DIRECT -x EMA_DEVICE_MEMORY -x EMA_SEGMENT_SIZE -x EMA_LEND_RESERVE -x EMA_SPILL \
    -x EMA_SPILL_SIZE -n 4 "$top_builddir/tests/mpi/test_borrow_all" || rc=1
# The prefetch policy's moves and a recall's hand-over (the give-back before the remaps)
# through the same batch: test_policy's walk on 2 ranks, sized as policy_np2.sh.
echo "== test_policy walk, 2 ranks (EMA_HOST_DIRECT=n)"
EMA_DEVICE_MEMORY=8M "$MPIRUN" --oversubscribe --timeout 120 -x EMA_HOST_DIRECT \
    -x EMA_DEVICE_MEMORY -x EMA_SEGMENT_SIZE -x EMA_LEND_RESERVE -x EMA_SPILL -x EMA_SPILL_SIZE \
    -n 2 "$top_builddir/tests/mpi/test_policy" walk || rc=1
echo "== test_policy readonly, 2 ranks, nothing lent (EMA_HOST_DIRECT=n)"
EMA_DEVICE_MEMORY=8M EMA_LEND_RESERVE=8M "$MPIRUN" --oversubscribe --timeout 120 \
    -x EMA_HOST_DIRECT -x EMA_DEVICE_MEMORY -x EMA_SEGMENT_SIZE -x EMA_LEND_RESERVE -x EMA_SPILL \
    -x EMA_SPILL_SIZE -n 2 "$top_builddir/tests/mpi/test_policy" readonly || rc=1
echo "== ema_stress --time 5 (EMA_HOST_DIRECT=n)"
"$MPIRUN" --oversubscribe --timeout 120 -x EMA_HOST_DIRECT -x EMA_DEVICE_MEMORY \
    -x EMA_SEGMENT_SIZE -x EMA_LEND_RESERVE -x EMA_SPILL -x EMA_SPILL_SIZE -n 4 \
    "$top_builddir/tests/stress/ema_stress" --time 5 || rc=1
exit $rc
