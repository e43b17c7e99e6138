#!/bin/sh
# bench/kv_serving on 4 ranks for 0.5 s per mode: the benchmark runs, serves requests in all
# three modes and prints its ratios (its figures are in the README, not checked here).
if [ -z "$MPIRUN" ]; then
    echo "SKIP: no mpirun found by configure (MPIRUN is empty)"
    exit 77
fi
EMA_DEVICE_MEMORY=32M; export EMA_DEVICE_MEMORY
EMA_LEND_RESERVE=0; export EMA_LEND_RESERVE
EMA_SPILL=none; export EMA_SPILL
out=$("$MPIRUN" --oversubscribe --timeout 60 -x EMA_DEVICE_MEMORY -x EMA_LEND_RESERVE -x EMA_SPILL \
    -n 4 "$top_builddir/bench/kv_serving" --time 0.5) || { echo "$out"; exit 1; }
echo "$out"
for mode in static elastic double; do
    echo "$out" | grep -Eq "^$mode +[0-9.]+ " || { echo "FAIL: no $mode row"; exit 1; }
    echo "$out" | grep -Eq "^$mode +0\.0 " && { echo "FAIL: $mode served nothing"; exit 1; }
done
echo "$out" | grep -q "elastic / static" || { echo "FAIL: no ratio line"; exit 1; }
exit 0
