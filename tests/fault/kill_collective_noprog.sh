#!/bin/sh
# A collective killed, with no progress thread (EMA_PROGRESS_THREAD=n): the
# survivors' barrier wait itself must find the death (it used to spin until
# mpirun's timeout).  See tests/fault/kill.sh and test_fault.c.
EMA_PROGRESS_THREAD=n
export EMA_PROGRESS_THREAD
exec "$top_srcdir/tests/fault/kill.sh" collective
