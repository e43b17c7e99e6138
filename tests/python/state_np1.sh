#!/bin/sh
# The Python bindings before init, across a failed and a good init, and
# after finalize (a process initialises EMA once, so this is its own
# process); and EMA_ERR_BOOTSTRAP from a launcher that cannot be reached.
# Needs no numpy.
. "$top_srcdir/tests/python/env.sh"
EMA_DEVICE_MEMORY=8M EMA_SEGMENT_SIZE=1M
export EMA_DEVICE_MEMORY EMA_SEGMENT_SIZE
exec timeout 120 "$py" "$top_srcdir/tests/python/test_state.py"
