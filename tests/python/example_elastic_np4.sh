#!/bin/sh
# examples/python/elastic_numpy.py on 4 ranks: it checks its own data and
# exits non-zero on a mismatch.
. "$top_srcdir/tests/python/env.sh"
py_need_numpy
. "$top_srcdir/tests/mpi/np4.sh"
np4 --timeout 120 "$py" "$top_srcdir/examples/python/elastic_numpy.py"
