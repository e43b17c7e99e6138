#!/bin/sh
# The manual is the spec (STYLE.md point 10).  This test proves that
#  (a) every ema_* function the built library exports has a page
#      man/man3/<symbol>.3 (a page of its own, or a ".so" redirect to the
#      page of its family);
#  (b) every page in man/man1, man/man3 and man/man7 renders without a
#      single warning from man/groff;
#  (c) every EMA_* variable the library reads (ema_info -c) is described in
#      ema(7) and in the README;
# and ends with one "N passed, N failed" line.
# The automake harness exports top_srcdir and top_builddir; run by hand as
#   top_srcdir=. top_builddir=BUILD sh tests/check_man.sh

top_srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
top_builddir=${top_builddir:-.}
lib="$top_builddir/.libs/libema.so"
info=$(cd "$top_builddir" && pwd)/src/tools/ema_info
mandir="$top_srcdir/man"
pass=0
fail=0

ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# --- (a) every exported symbol has a page ---------------------------------
if [ ! -f "$lib" ]; then
    bad "$lib not found: build the library first"
else
    syms=$(nm -D --defined-only "$lib" | awk '$2 == "T" && $3 ~ /^ema_/ { print $3 }' | sort -u)
    if [ -z "$syms" ]; then
        bad "no exported ema_* symbol found in $lib"
    fi
    for s in $syms; do
        if [ -f "$mandir/man3/$s.3" ]; then
            ok
        else
            bad "exported symbol $s has no page man/man3/$s.3"
        fi
    done
fi

# --- (b) every page renders cleanly ---------------------------------------
# Render from man/ so that ".so man3/x.3" redirects resolve as they do in an
# installed tree.
if command -v man >/dev/null 2>&1; then
    render() { MANWIDTH=80 man --warnings -l -Tutf8 "$1" 2>&1 >/dev/null; }
elif command -v groff >/dev/null 2>&1; then
    render() { groff -man -ww -z -Tutf8 "$1" 2>&1; }
else
    echo "SKIP: neither man nor groff is installed (apt-get install man-db groff-base)"
    exit 77
fi
cd "$mandir" || { echo "FAIL: no $mandir"; exit 1; }
for page in man1/*.1 man3/*.3 man7/*.7; do
    [ -f "$page" ] || continue
    first=$(head -n 1 "$page")
    case "$first" in
    .so\ *)
        target=${first#.so }
        if [ ! -f "$target" ]; then
            bad "$page redirects to missing $target"
            continue
        fi
        ;;
    esac
    out=$(render "$page")
    if [ -n "$out" ]; then
        bad "$page renders with warnings:"
        echo "$out" | sed 's/^/    /'
    else
        ok
    fi
done

# --- (c) every setting is documented --------------------------------------
if [ -x "$info" ]; then
    vars=$("$info" -c 2>/dev/null | grep -o 'EMA_[A-Z0-9_]*' | sort -u)
    [ -n "$vars" ] || bad "ema_info -c listed no EMA_* variable"
    for v in $vars; do
        if grep -q "$v" "$mandir/man7/ema.7" && grep -q "$v" "$top_srcdir/README.md"; then
            ok
        else
            bad "$v is read by the library but not described in both ema(7) and README.md"
        fi
    done
else
    bad "$info not found: build the tools first"
fi

echo "check_man: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
