#!/bin/sh
# A rank killed under non-blocking requests to it, over UCX: see
# tests/fault/kill.sh and test_fault.c.
exec "$top_srcdir/tests/fault/kill.sh" requests
