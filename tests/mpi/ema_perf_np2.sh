#!/bin/sh
# ema_perf(1) on 2 ranks, host kind, tiny sizes: every op runs, verifies its
# data and exits 0, also with an explicit --iters that does not fill its
# blocks (5 as 2+2+1: a block left empty once reported a false DATA
# MISMATCH on get); a bad option and a world of 1 exit 2.  And ema_info(1)'s
# exit status.
. "$top_srcdir/tests/mpi/np4.sh"
perf="$top_builddir/src/tools/ema_perf"
EMA_DEVICE_MEMORY=64M; export EMA_DEVICE_MEMORY
run() {
    "$MPIRUN" --oversubscribe --timeout 60 -x EMA_DEVICE_MEMORY -n "$@"
}
fail=0
check() { # WANT NAME CMD...
    want=$1 name=$2
    shift 2
    out=$("$@" 2>&1)
    rc=$?
    if [ "$rc" -ne "$want" ]; then
        echo "FAIL: $name: exit $rc, expected $want"
        echo "$out" | tail -5
        fail=1
    else
        echo "ok: $name (exit $rc)"
    fi
}
for n in 1 5 13; do
    check 0 "put,get --iters $n" run 2 "$perf" --csv --op put,get --min 8 --max 4K --iters "$n"
done
check 0 "put,get default iterations" run 2 "$perf" --csv --op put,get --min 8 --max 64 --time 0.02
check 0 "borrow,reclaim,prefetch,kernel" run 2 "$perf" --csv --op borrow,reclaim,prefetch,kernel --max 4K \
    --reclaim-sizes 2M --kernel-size 4M
# a reclaim that spins and one that naps while it waits (EMA_RECLAIM_WAIT;
# auto naps on this 2-core machine), each reclaim's data checked
for w in spin nap; do
    check 0 "reclaim, EMA_RECLAIM_WAIT=$w" run 2 env EMA_RECLAIM_WAIT=$w "$perf" --csv --op reclaim --max 4K \
        --reclaim-sizes 2M,4M
done
check 2 "unknown option" run 2 "$perf" --no-such-option
check 2 "unknown --op" run 2 "$perf" --op nothing
check 2 "unknown word in --op" run 2 "$perf" --op put,foo
check 2 "empty --op" run 2 "$perf" --op ,
check 2 "a world of 1" run 1 "$perf" --op put --min 8 --max 8
check 2 "a bad --min" run 2 "$perf" --min 0
check 2 "--timer events on host" run 2 "$perf" --timer events --op put --min 8 --max 8
check 2 "--raw-mem on host" run 2 "$perf" --raw-mem vmm --op put --min 8 --max 8
# ema_info: a stray argument is refused; output that cannot be written fails
info="$top_builddir/src/tools/ema_info"
check 2 "ema_info with an argument" "$info" -v extra
check 0 "ema_info --help" "$info" --help
check 2 "ema_info --no-such-option" "$info" --no-such-option
if [ -w /dev/full ]; then
    check 1 "ema_info writing to /dev/full" sh -c "'$info' -v > /dev/full"
    check 1 "ema_perf -h writing to /dev/full" sh -c "'$perf' -h > /dev/full"
fi
exit $fail
