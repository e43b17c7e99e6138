#!/bin/sh
# ema_stress on 4 ranks for 15 s: random puts racing grow, shrink and
# reclaim, checked against an exact model ("bytes lost: 0").
if [ -z "$MPIRUN" ]; then
    echo "SKIP: no mpirun found by configure (MPIRUN is empty)"
    exit 77
fi
exec "$MPIRUN" --oversubscribe --timeout 120 -n 4 "$top_builddir/tests/stress/ema_stress" --time 15
