#!/bin/sh
# A lender killed during a grow that borrows from it: see tests/fault/kill.sh
# and test_fault.c.
exec "$top_srcdir/tests/fault/kill.sh" grow
