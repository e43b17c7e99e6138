#!/bin/sh
# examples/python/cuda_consumer.py in a world of one: a GPU consumer of a
# cuda-kind window view.  Where there is no GPU (CI) or no _gpu_check.so
# (no nvcc), it says SKIP and why (exit 77).  On a GPU machine run it on
# several ranks too (README, section "Python").
. "$top_srcdir/tests/python/env.sh"
exec timeout 120 "$py" "$top_srcdir/examples/python/cuda_consumer.py"
