#!/bin/sh
# Fuzz EMA's active-message decoders with libFuzzer (tests/fuzz/README).
#
#   contrib/fuzz.sh [libFuzzer options]     default: -max_total_time=600
#
# Builds tests/fuzz/fuzz_am with clang, ASan and UBSan in an out-of-tree
# build (EMA_FUZZ_BUILD, default build-fuzz/ at the top of the tree), then
# runs it, niced, on tests/fuzz/corpus (read only) and a working corpus of
# its own (build-fuzz/fuzz-corpus).  Crashes land in build-fuzz/fuzz-crashes/;
# add each as tests/fuzz/corpus/repro-<class> once fixed (and as code in
# tests/fuzz/fuzz_corpus.c).  Needs clang with libFuzzer (apt-get install clang).
set -e
top=$(cd "$(dirname "$0")/.." && pwd)
build=${EMA_FUZZ_BUILD:-$top/build-fuzz}
jobs=${EMA_FUZZ_JOBS:-2}

command -v clang >/dev/null || { echo "fuzz.sh: clang not found" >&2; exit 1; }
[ -x "$top/configure" ] || (cd "$top" && autoreconf -fi)
mkdir -p "$build" "$build/fuzz-corpus" "$build/fuzz-crashes"
cd "$build"
[ -f Makefile ] || "$top/configure" CC=clang --enable-fuzz >configure.log
nice make -j"$jobs" tests/fuzz/fuzz_am
[ $# -gt 0 ] || set -- -max_total_time=600
exec nice ./tests/fuzz/fuzz_am -use_value_profile=1 -print_final_stats=1 \
    -artifact_prefix="$build/fuzz-crashes/" "$@" \
    "$build/fuzz-corpus" "$top/tests/fuzz/corpus"
