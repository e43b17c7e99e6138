#!/bin/sh
# test_regress init_retry on 4 ranks: 40 failed ema_init calls, then a valid one.
. "$top_srcdir/tests/mpi/np4.sh"
np4 --timeout 90 "$top_builddir/tests/mpi/test_regress" init_retry
