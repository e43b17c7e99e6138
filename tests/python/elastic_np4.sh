#!/bin/sh
# The Python bindings on 4 ranks (mpirun): grow, reclaim and shrink through
# numpy views with the data checked; a pinned view holding off a reclaim;
# reclaim events read by a Python thread while the main thread is blocked
# in ema_barrier (no deadlock: the GIL is released).  16 segments of 1M per
# rank, nothing reserved, spill to host.
. "$top_srcdir/tests/python/env.sh"
py_need_numpy
EMA_DEVICE_MEMORY=16M EMA_SEGMENT_SIZE=1M EMA_LEND_RESERVE=0 EMA_SPILL=host EMA_SPILL_SIZE=64M
export EMA_DEVICE_MEMORY EMA_SEGMENT_SIZE EMA_LEND_RESERVE EMA_SPILL EMA_SPILL_SIZE
. "$top_srcdir/tests/mpi/np4.sh"
np4 --timeout 180 "$py" "$top_srcdir/tests/python/test_elastic_np4.py"
