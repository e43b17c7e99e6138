#!/bin/sh
# bench/kv_serving on 4 ranks, host kind, virtual clock: four short runs, one seed, and the
# invariants they must keep whatever the machine (doc/kv_serving.md; no ratio goals here):
#   - no corrupted K/V element in any run (every step reads and checks all of them);
#   - rotating load, idle peers: elastic serves the hot rank at least as well as static;
#   - all busy (nothing to borrow): elastic within 5% of static, the whole node;
#   - rotating: the cold ranks' TTFT and TPOT p99 (worst rank) in elastic at most 2x static's
#     + 50 ms, in the first run or in one more (see below): a lender that waits long for its
#     memory fails it (the GPU goal is 1.05x; on 2 loaded cores the lender's wait for a
#     give-back is a few steps of real scheduling).
# C = 1 MiB of KV memory per rank in 64 KiB segments, 64 B of K/V per token.
EMA_SEGMENT_SIZE=64K; export EMA_SEGMENT_SIZE
EMA_SPILL=none; export EMA_SPILL
EMA_MEMORY_KIND=host; export EMA_MEMORY_KIND
EMA_DEVICE_MEMORY=1M; export EMA_DEVICE_MEMORY
. "$top_srcdir/tests/mpi/np4.sh"

out=${TMPDIR:-/tmp}/kv_serving_np4.$$
trap 'rm -rf "$out"' EXIT
fail=0

run() { # scenario config EMA_LEND_RESERVE
    EMA_LEND_RESERVE=$3; export EMA_LEND_RESERVE
    ( np4 --timeout 120 "$top_builddir/bench/kv_serving" --scenario "$1" --config "$2" \
        --seed 1 --kv-mem 1M --phase 10 --warmup 4 --drain 10 --quiet --out "$out/$1_$2" ) \
        >"$out.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ] || [ "$(ls "$out/$1_$2"/summary_r*.csv 2>/dev/null | wc -l)" -ne 4 ]; then
        cat "$out.log"
        echo "FAIL: kv_serving --scenario $1 --config $2 exited $rc"
        fail=1
    fi
}

# column $2 of the rows of class $1, over the 4 ranks: "sum", "mean" or "max" ($3)
col() { # dir class column op
    awk -F, -v cl="$2" -v c="$3" -v op="$4" '
        FNR == 1 { for (i = 1; i <= NF; i++) if ($i == c) k = i; next }
        $5 == cl { v = $k + 0; s += v; n++; if (n == 1 || v > m) m = v }
        END { if (op == "sum") print s; else if (op == "max") print m; else print (n ? s / n : 0) }
    ' "$1"/summary_r*.csv
}

mkdir -p "$out"
run rotating static 1M
run rotating elastic 0
run allbusy static 1M
run allbusy elastic 0
rm -f "$out.log"
[ $fail -eq 0 ] || exit 1

for d in "$out"/*; do
    bad=$(col "$d" all corrupt max)
    echo "$(basename "$d"): corrupted K/V elements $bad"
    [ "$bad" = 0 ] || { echo "FAIL: $(basename "$d") read corrupted K/V"; fail=1; }
done

s=$(col "$out/rotating_static" hot tokens_s mean)
e=$(col "$out/rotating_elastic" hot tokens_s mean)
echo "rotating, hot-phase tokens/s per rank: static $s, elastic $e"
awk -v s="$s" -v e="$e" 'BEGIN { exit !(e >= s) }' ||
    { echo "FAIL: elastic served the hot ranks less than static"; fail=1; }

s=$(col "$out/allbusy_static" all tokens_s sum)
e=$(col "$out/allbusy_elastic" all tokens_s sum)
echo "all busy, node tokens/s: static $s, elastic $e"
awk -v s="$s" -v e="$e" 'BEGIN { r = e / s; exit !(r >= 0.95 && r <= 1.05) }' ||
    { echo "FAIL: all busy, elastic not within 5% of static"; fail=1; }

# The cold ranks' latency is the one figure here that the machine moves: the virtual clock
# charges each EMA call its wall time, and on 2 cores shared with other jobs a lender's wait
# for a give-back now and then takes hundreds of ms of real scheduling.  So a miss runs the
# elastic case once more (a new run, the same seed), and it fails only if both runs miss:
# a lender that really waits too long misses every time.
cold_ok() { # elastic-run-dir: 0 when both p99s are within the bound
    ok=0
    for m in ttft_p99 tpot_p99; do
        s=$(col "$out/rotating_static" cold $m max)
        e=$(col "$1" cold $m max)
        echo "rotating, cold ranks' $m (s, worst rank): static $s, elastic $e"
        awk -v s="$s" -v e="$e" 'BEGIN { exit !(e <= 2 * s + 0.05) }' ||
            { echo "   above 2x static + 50 ms"; ok=1; }
    done
    return $ok
}
if ! cold_ok "$out/rotating_elastic"; then
    echo "cold-rank latency missed once (load average: $(cut -d' ' -f1-3 /proc/loadavg)); the elastic run again:"
    mv "$out/rotating_elastic" "$out/rotating_elastic.1"
    run rotating elastic 0
    rm -f "$out.log"
    [ $fail -eq 0 ] || exit 1
    bad=$(col "$out/rotating_elastic" all corrupt max)
    [ "$bad" = 0 ] || { echo "FAIL: the second rotating_elastic read corrupted K/V"; fail=1; }
    cold_ok "$out/rotating_elastic" ||
        { echo "FAIL: elastic's cold ranks' p99 above 2x static + 50 ms in two runs"; fail=1; }
fi
exit $fail
