#!/bin/sh
# The cuda memory kind end to end, on 2 ranks sharing a GPU: test_rma,
# test_atomics and test_win_allocate with EMA_MEMORY_KIND=cuda, then
# examples/cuda_window (kernels over a half-borrowed window) when nvcc built
# it.  Where the kind cannot run (no CUDA build, no GPU or driver, a UCX
# without CUDA), it skips (77) and says why.  contrib/gpu-suite.sh runs the
# whole suite on a GPU machine.
if [ -z "$MPIRUN" ]; then
    echo "SKIP: no mpirun found by configure (MPIRUN is empty)"
    exit 77
fi
EMA_MEMORY_KIND=cuda; export EMA_MEMORY_KIND
EMA_DEVICE_MEMORY=1G; export EMA_DEVICE_MEMORY
UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y; export UCX_CUDA_IPC_ENABLE_GET_ZCOPY # one GPU: see README
# Two ranks: a world of one lists no cuda_ipc (UCX does not use it to reach
# its own process).
info=$("$MPIRUN" --oversubscribe --timeout 60 -x EMA_MEMORY_KIND -x EMA_DEVICE_MEMORY \
    -x UCX_CUDA_IPC_ENABLE_GET_ZCOPY -x LD_LIBRARY_PATH -n 2 \
    "$top_builddir/src/tools/ema_info" 2>&1)
if [ $? -ne 0 ]; then
    why=$(printf '%s\n' "$info" | grep -m1 -E '\] error|failed' | sed 's/^\[ema[^]]*\] *//')
    echo "SKIP: the cuda memory kind cannot run here: ${why:-ema_info failed}"
    exit 77
fi
if ! printf '%s\n' "$info" | grep -q 'cuda_ipc'; then
    echo "SKIP: UCX has no cuda_ipc transport here (a UCX built --with-cuda is needed):"
    printf '%s\n' "$info" | grep -m1 'transports'
    exit 77
fi
rc=0
for t in test_rma test_atomics test_win_allocate; do
    echo "== $t, 2 ranks, cuda"
    "$MPIRUN" --oversubscribe --timeout 180 -x EMA_MEMORY_KIND -x EMA_DEVICE_MEMORY \
        -x UCX_CUDA_IPC_ENABLE_GET_ZCOPY -x LD_LIBRARY_PATH -n 2 \
        "$top_builddir/tests/mpi/$t" || rc=1
done
if [ -x "$top_builddir/examples/cuda_window" ]; then
    echo "== examples/cuda_window, 2 ranks"
    "$MPIRUN" --oversubscribe --timeout 120 -x EMA_MEMORY_KIND -x EMA_DEVICE_MEMORY \
        -x UCX_CUDA_IPC_ENABLE_GET_ZCOPY -x LD_LIBRARY_PATH -n 2 \
        "$top_builddir/examples/cuda_window" || rc=1
fi
exit $rc
