#!/bin/sh
# test_regress init_one_fails on 4 ranks: rank 1's ema_init fails, 0.3 s
# before the others' begin, and it exits; ranks 0, 2 and 3 must fail at
# once with EMA_ERR_PEER_LOST (not after EMA_BOOT_TIMEOUT, set to 60 s
# here), and every rank must print its line with "ok".
. "$top_srcdir/tests/mpi/np4.sh"
EMA_BOOT_TIMEOUT=60; export EMA_BOOT_TIMEOUT
np4_lines --timeout 90 init_one_fails "^init_one_fails rank [0-3]: .*: ok$"
