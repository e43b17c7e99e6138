#!/bin/sh
# test_elastic default on 4 ranks: grow past capacity, base pointer, explicit and implicit
# reclaim, acquire/release, puts and gets racing a migration, argument checks. 16 segments of
# 1M per rank, nothing reserved, spill to host.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env SPILL=host SPILL_SIZE=64M
np4 "$top_builddir/tests/mpi/test_elastic" default
