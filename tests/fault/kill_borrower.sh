#!/bin/sh
# A borrower killed: see tests/fault/kill.sh and test_fault.c.
exec "$top_srcdir/tests/fault/kill.sh" borrower
