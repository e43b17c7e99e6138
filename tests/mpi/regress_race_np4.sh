#!/bin/sh
# test_regress race on 4 ranks for RACE_SECONDS (20 s by default): fresh windows
# grown, prefetched, shrunk and reclaimed while third ranks read them, every byte checked.
. "$top_srcdir/tests/mpi/np4.sh"
np4_env SPILL=host SPILL_SIZE=64M
: "${RACE_SECONDS:=20}"
np4 --timeout $((RACE_SECONDS + 60)) "$top_builddir/tests/mpi/test_regress" race "$RACE_SECONDS"
