#!/bin/sh
# bench/kv_serving.py, the driver that users run (doc/kv_serving.md, Commands), on 4 ranks,
# host kind, at a small scale (C = 256 KiB in 8 segments, 6 s phases, about 1 s of wall time a
# run): static and elastic, one seed, rotating load.
#   1. With --deadline 1 it makes one run, stops, exits 3 and says one run is left.
#   2. The same command without a deadline makes only the run left, exits 0, and writes
#      summary.csv with both configurations' rows (4 ranks each, class "all" among them) and
#      results.md with the elastic / static ratio and zero corrupted K/V elements.
. "$top_srcdir/tests/mpi/np4.sh"
command -v python3 >/dev/null 2>&1 || { echo "SKIP: no python3"; exit 77; }

out=${TMPDIR:-/tmp}/kv_driver_np4.$$
trap 'rm -rf "$out" "$out.log"' EXIT
# OUT first, the driver's options after it, kv_serving's after "--" (this order failed
# until session 21: argparse wanted OUT right before "--")
drive() {
    python3 "$top_srcdir/bench/kv_serving.py" "$out" --kind host --build "$top_builddir" \
        --mpirun "$MPIRUN" --timeout 120 --kv-mem 256K --seg 32K --tok-bytes 128 \
        --model 8.827,0,0.12875,29.392 --scenarios rotating --configs static,elastic \
        --seeds 1 --no-plots "$@" -- --phase 6 --warmup 2 --drain 3 >"$out.log" 2>&1
}
fail() { cat "$out.log"; echo "FAIL: $*"; exit 1; }

drive --deadline 1
rc=$?
[ $rc -eq 3 ] || fail "--deadline 1: exit $rc, not 3"
grep -q "^1 runs left" "$out.log" || fail "--deadline 1: no '1 runs left' line"
[ "$(ls "$out"/runs/rotating/*/s1/summary_r*.csv | wc -l)" -eq 4 ] ||
    fail "--deadline 1: not exactly one run on disk"
echo "--deadline 1: one run made, exit 3"

drive
rc=$?
[ $rc -eq 0 ] || fail "second call: exit $rc"
[ "$(grep -c '^\[' "$out.log")" -eq 1 ] || fail "second call: did not make exactly the run left"
rows=$(grep -c '^rotating,\(static\|elastic\),1,[0-3],all,' "$out/summary.csv")
[ "$rows" -eq 8 ] || fail "summary.csv: $rows whole-run rows (class all), not 8"
grep -q '^| elastic / static, hot-phase throughput | [0-9]' "$out/results.md" ||
    fail "results.md: no elastic / static ratio"
bad=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "corrupt") k = i; next }
               { s += $k } END { print s + 0 }' "$out/summary.csv")
[ "$bad" = 0 ] || fail "summary.csv: $bad corrupted K/V elements"
python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))["rotating"]
assert j["static"]["seeds"] == [1] and j["elastic"]["seeds"] == [1], j["static"]["seeds"]
assert j["ratio_seeds"]["elastic / static"] == [1]' "$out/results.json" ||
    fail "results.json: no seeds for the per-seed figures"
echo "second call: the run left made, exit 0; $(grep '^| elastic / static, hot-phase' "$out/results.md")"
exit 0
