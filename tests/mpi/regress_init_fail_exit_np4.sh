#!/bin/sh
# test_regress init_fail_exit on 4 ranks: every ema_init fails and every
# rank returns 0, so mpirun must exit 0 and every rank's line must come out
# (Open MPI aborted the job when the failed ema_init left PMIx open).
. "$top_srcdir/tests/mpi/np4.sh"
np4_lines --timeout 60 init_fail_exit "^init_fail_exit rank [0-3]: ema_init invalid parameter"
