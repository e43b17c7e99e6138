#!/bin/sh
# The Python bindings in a world of one (host kind): every call and its
# errors, views (buffer protocol, DLPack) byte for byte against ema_get,
# pinning, reclaim events, the GIL rule.  8 segments of 1M, spill to host.
. "$top_srcdir/tests/python/env.sh"
py_need_numpy
EMA_MEMORY_KIND=host EMA_DEVICE_MEMORY=8M EMA_SEGMENT_SIZE=1M EMA_LEND_RESERVE=0 \
EMA_SPILL=host EMA_SPILL_SIZE=16M
export EMA_MEMORY_KIND EMA_DEVICE_MEMORY EMA_SEGMENT_SIZE EMA_LEND_RESERVE EMA_SPILL EMA_SPILL_SIZE
exec timeout 120 "$py" "$top_srcdir/tests/python/test_api.py"
