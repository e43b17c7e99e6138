#!/usr/bin/env bash
# EMA quick start on Debian 12 / Ubuntu: install what is missing, build, then
#   contrib/quickstart.sh demo   run the 4-rank elastic-window demo (README command 1)
#   contrib/quickstart.sh test   run the whole test suite (README command 2, and CI)
# Builds out of tree in ./build.  Safe to run again: it only installs what is
# missing and rebuilds what changed.
#
# GPU mode, on by itself where `nvidia-smi -L` lists a GPU and nvcc is on PATH
# or in /usr/local/cuda/bin (--gpu / --no-gpu, or EMA_QUICKSTART_GPU=yes|no|auto,
# force it): UCX with CUDA comes from pip's libucx-cu13 wheel (libucx-cu12
# where the driver's CUDA is 12.x), unpacked in ./build/ucx-wheel; EMA is
# built against it with --with-cuda in ./build-gpu.  Then demo also runs
# examples/cuda_window on 2 ranks, and test also runs contrib/gpu-suite.sh.
# With no package index, hand over a wheel downloaded elsewhere:
# --ucx-wheel=FILE, EMA_UCX_WHEEL=FILE, or any libucx_cu1*.whl in ./.whl/.
set -euo pipefail

usage() {
    echo "usage: $0 [demo|test] [--gpu|--no-gpu] [--ucx-wheel=FILE]" >&2
    exit 2
}
mode=demo
gpu=${EMA_QUICKSTART_GPU:-auto}
wheel=${EMA_UCX_WHEEL:-}
wheel_from=${EMA_UCX_WHEEL:+EMA_UCX_WHEEL}
for arg in "$@"; do
    case "$arg" in
    demo|test)     mode=$arg ;;
    --gpu)         gpu=yes ;;
    --no-gpu)      gpu=no ;;
    --ucx-wheel=*) wheel=${arg#*=}; wheel_from=--ucx-wheel ;;
    *)             usage ;;
    esac
done
case "$gpu" in
yes|no|auto) ;;
*) echo "$0: EMA_QUICKSTART_GPU must be yes, no or auto, not '$gpu'" >&2; exit 2 ;;
esac
# EMA warns of EMA_* variables it does not know, and gpu-suite forwards them.
unset EMA_QUICKSTART_GPU EMA_UCX_WHEEL

top=$(cd "$(dirname "$0")/.." && pwd)
build="$top/build"
jobs=$(nproc 2>/dev/null || echo 2)

# 0. a GPU?  Silent where there is none (CI): the host steps below are all.
gpu_list=""
if command -v nvidia-smi >/dev/null 2>&1; then
    gpu_list=$(timeout 30 nvidia-smi -L 2>/dev/null | grep '^GPU [0-9]' || true)
fi
nvcc=$(command -v nvcc 2>/dev/null || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ "$gpu" = auto ]; then
    gpu=no
    if [ -n "$gpu_list" ] && [ -n "$nvcc" ]; then
        gpu=yes
    elif [ -n "$gpu_list" ]; then
        echo "== a GPU is here but no nvcc (on PATH or in /usr/local/cuda/bin): host build only;"
        echo "   install the CUDA toolkit for the GPU build (or --no-gpu to silence this)"
    fi
fi
if [ "$gpu" = yes ]; then
    # The wheel that matches the driver: libucx-cu12 for a CUDA 12.x driver,
    # else libucx-cu13.
    cuda_drv=""
    [ -n "$gpu_list" ] &&
        cuda_drv=$(timeout 30 nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -n 1)
    case "$cuda_drv" in 12.*) cu=12 ;; *) cu=13 ;; esac
    ucx_pkg=libucx-cu$cu
    if [ -n "$gpu_list" ]; then
        echo "== GPU mode: $(printf '%s\n' "$gpu_list" | wc -l) GPU(s), driver CUDA ${cuda_drv:-unknown}, nvcc ${nvcc:-none}"
        printf '   %s\n' "$gpu_list"
    else
        echo "== GPU mode forced, but nvidia-smi lists no GPU here: EMA is built with CUDA,"
        echo "   and the GPU programs will skip or fail for want of a GPU and driver; nvcc: ${nvcc:-none}"
    fi
    [ -n "$nvcc" ] && case ":$PATH:" in *":${nvcc%/nvcc}:"*) ;; *) PATH=${nvcc%/nvcc}:$PATH ;; esac
    uw="$build/ucx-wheel"     # the wheel, unpacked; pip's download in $uw/download
    if [ -n "$wheel" ]; then
        [ -f "$wheel" ] || { echo "$0: UCX wheel $wheel ($wheel_from) does not exist" >&2; exit 2; }
        wheel=$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")
    else
        # .whl/ (git-ignored): the wheel for this driver first, else any.
        wheel=$(ls "$top"/.whl/libucx_cu$cu-*.whl 2>/dev/null | sort -V | tail -n 1 || true)
        [ -z "$wheel" ] && wheel=$(ls "$top"/.whl/libucx_cu1*.whl 2>/dev/null | sort -V | tail -n 1 || true)
        if [ -n "$wheel" ]; then
            wheel_from="found in .whl/"
        else
            wheel=$(ls "$uw"/download/libucx_cu$cu-*.whl 2>/dev/null | sort -V | tail -n 1 || true)
            [ -n "$wheel" ] && wheel_from="downloaded by an earlier run"
        fi
    fi
fi

# 1. packages: Debian's UCX, hwloc, PMIx, Open MPI (its mpirun serves PMIx),
#    Check, the autotools, and man-db/groff for the man-page test.
pkgs="build-essential autoconf automake libtool pkg-config libucx-dev libhwloc-dev
      libpmix-dev openmpi-bin check man-db groff-base python3 python3-numpy"
# GPU mode with no wheel at hand downloads one with pip.
if [ "$gpu" = yes ] && [ -z "$wheel" ] && ! python3 -m pip --version >/dev/null 2>&1; then
    pkgs="$pkgs python3-pip"
fi
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "== installing:$missing"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    if ! { $sudo apt-get update -qq && \
           $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null; }; then
        # A GPU machine with no package index (the UCX comes from the
        # wheel) may still have what the build needs: go on, and let
        # configure name what is really missing.
        [ "$gpu" = yes ] || exit 1
        echo "== could not install:$missing (no package index?); going on: in GPU mode UCX"
        echo "   comes from the wheel, and configure says what else is missing"
    fi
fi

# PMIx where pkg-config knows none (Ubuntu's libpmix keeps its headers
# under .../pmix2 without a pmix.pc): its flags, for configure.
pmix_env=()
if ! pkg-config --exists pmix 2>/dev/null; then
    for d in /usr/lib/x86_64-linux-gnu/pmix2 /usr/lib/aarch64-linux-gnu/pmix2 /usr/lib/pmix2; do
        if [ -f "$d/include/pmix.h" ]; then
            pmix_env=("PMIX_CFLAGS=-I$d/include" "PMIX_LIBS=-L$d/lib -Wl,-rpath,$d/lib -lpmix")
            pmix_dir=$d
            break
        fi
    done
fi

# 2. build
echo "== building in $build"
cd "$top"
if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt Makefile.in ] ||
   [ -n "$(find config/m4 -name 'ema_*.m4' -newer configure 2>/dev/null)" ]; then
    autoreconf -fi >/dev/null 2>&1 || autoreconf -fi
fi
mkdir -p "$build"
cd "$build"
# Without a system UCX (a GPU machine with no package index), the host
# build is left out and the host demo runs from the GPU build, with the
# wheel's UCX (which serves host memory as well).
host_build=yes
if [ "$gpu" = yes ] && ! pkg-config --exists ucx 2>/dev/null; then
    host_build=no
    echo "   no system UCX (libucx-dev): the host demo runs from the GPU build"
fi
if [ "$host_build" = yes ]; then
    if [ ! -f config.status ]; then
        env "${pmix_env[@]}" "$top/configure" -q
    fi
    make -s -j"$jobs" >/dev/null
fi

# 2b. GPU mode: UCX with CUDA from the wheel, and EMA built against it.
if [ "$gpu" = yes ]; then
    mkdir -p "$uw"
    if [ -z "$wheel" ]; then
        echo "== downloading $ucx_pkg with pip into $uw/download"
        if ! python3 -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
                --progress-bar off -q -d "$uw/download" "$ucx_pkg" >"$uw/pip.log" 2>&1; then
            cat "$uw/pip.log"
            echo "$0: pip could not download $ucx_pkg (no package index here?)." >&2
            echo "  On a machine with one:  python3 -m pip download --no-deps $ucx_pkg" >&2
            echo "  then hand the .whl over: --ucx-wheel=FILE, EMA_UCX_WHEEL=FILE or $top/.whl/" >&2
            exit 1
        fi
        wheel=$(ls "$uw"/download/libucx_cu$cu-*.whl | sort -V | tail -n 1)
        wheel_from="downloaded by pip"
    fi
    echo "== UCX wheel: $wheel ($wheel_from)"
    case "$(basename "$wheel")" in
    libucx_cu$cu-*) ;;
    *) echo "   note: the driver's CUDA ${cuda_drv:-(unknown)} calls for $ucx_pkg" ;;
    esac
    ucx="$uw/libucx"
    stamp="$(basename "$wheel") $(wc -c <"$wheel")"
    if [ "$(cat "$uw/.unpacked" 2>/dev/null)" != "$stamp" ]; then
        rm -rf "$uw/.unpacked" "$ucx" "$uw"/libucx_cu1*.libs "$uw"/libucx_cu1*.dist-info
        python3 -m zipfile -e "$wheel" "$uw"
        chmod -R a+x "$ucx/bin" 2>/dev/null || true   # zipfile keeps no modes
        [ ! -e "$ucx/lib" ] && [ -d "$ucx/lib64" ] && ln -s lib64 "$ucx/lib"
        if [ ! -f "$ucx/lib/libucp.so" ] || [ ! -f "$ucx/lib/pkgconfig/ucx.pc" ]; then
            echo "$0: $(basename "$wheel") has no libucx/lib/libucp.so or ucx.pc: not a UCX wheel?" >&2
            exit 1
        fi
        # The .pc and libtool .la files name the prefix the wheel was built
        # in (prefix = /__w/...): point them at this copy.
        old=$(sed -n 's/^prefix *= *//p' "$ucx/lib/pkgconfig/ucx.pc" | head -n 1)
        if [ -n "$old" ] && [ "$old" != "$ucx" ]; then
            old_re=$(printf '%s' "$old" | sed 's/[][\\.*^$|]/\\&/g')
            sed -i "s|$old_re|$ucx|g" "$ucx"/lib/pkgconfig/*.pc \
                $(ls "$ucx"/lib/*.la "$ucx"/lib/ucx/*.la 2>/dev/null)
        fi
        rm -f "$top/build-gpu/config.status"    # a new UCX: configure again
        echo "$stamp" >"$uw/.unpacked"
    fi
    ucx_ver=$(PKG_CONFIG_PATH="$ucx/lib/pkgconfig" pkg-config --modversion ucx)
    echo "   UCX $ucx_ver in $ucx (lib/, modules in lib/ucx/)"
    if [ "$mode" = demo ]; then
        # (test mode: gpu-suite configures and builds build-gpu itself)
        gbuild="$top/build-gpu"
        echo "== building with CUDA in $gbuild"
        mkdir -p "$gbuild"
        cd "$gbuild"
        if [ ! -f config.status ] || ! grep -qF -- "--with-ucx=$ucx" config.status; then
            echo "   $top/configure --with-cuda --with-ucx=$ucx"
            env "${pmix_env[@]}" "$top/configure" -q --with-cuda --with-ucx="$ucx"
        fi
        make -s -j"$jobs" >/dev/null
        cd "$build"
    fi
fi

# mpirun refuses root unless told; more than 2 ranks on few cores needs
# oversubscription.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

if [ "$mode" = demo ] && [ "$gpu" != yes ]; then
    echo "== mpirun -n 4 examples/elastic_demo"
    exec mpirun --timeout 120 -n 4 ./examples/elastic_demo
fi

# GPU mode from here on.  count NAME CMD...: passed (0), skipped (77) or failed.
npass=0 nfail=0 nskip=0
count() {
    local name=$1 rc
    shift
    rc=0
    "$@" || rc=$?
    case $rc in
    0)  npass=$((npass + 1)) ;;
    77) nskip=$((nskip + 1)); echo "== $name: SKIPPED (no usable GPU: see its SKIP line above)" ;;
    *)  nfail=$((nfail + 1))
        echo "== $name: FAILED (exit $rc$( { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && echo ', timed out'))" ;;
    esac
}

if [ "$mode" = demo ]; then
    # The host demo keeps Debian's UCX; only cuda_window gets the wheel's.
    cuda_env=(env EMA_MEMORY_KIND=cuda UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y
              "LD_LIBRARY_PATH=$ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
    echo "== mpirun -n 4 examples/elastic_demo"
    if [ "$host_build" = yes ]; then
        count "host demo" mpirun --timeout 120 -n 4 ./examples/elastic_demo
    else
        count "host demo" env EMA_MEMORY_KIND=host \
            "LD_LIBRARY_PATH=$ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
            mpirun --timeout 120 -n 4 -x EMA_MEMORY_KIND -x LD_LIBRARY_PATH \
            "$top/build-gpu/examples/elastic_demo"
    fi
    echo "== mpirun -n 2 examples/cuda_window (build-gpu, EMA_MEMORY_KIND=cuda, UCX $ucx_ver from the wheel)"
    [ -z "$gpu_list" ] && echo "   (nvidia-smi lists no GPU here: expect SKIP or a failure)"
    cd "$top/build-gpu"
    if [ -x examples/cuda_window ]; then
        count "cuda demo" "${cuda_env[@]}" mpirun --timeout 120 -n 2 --bind-to none -x LD_LIBRARY_PATH \
            -x EMA_MEMORY_KIND -x UCX_CUDA_IPC_ENABLE_GET_ZCOPY ./examples/cuda_window
    else
        echo "   examples/cuda_window was not built (configure found no nvcc)"
        nfail=$((nfail + 1))
    fi
    echo "demos: $npass passed, $nfail failed, $nskip skipped (host elastic_demo, cuda_window)"
    [ "$nfail" -eq 0 ]
    exit
fi

# 3. tests: automake hides Check's summaries in the logs; print them.
echo "== make check"
rc=0
[ "$host_build" = yes ] ||
    echo "   no host build to check (no system UCX: apt-get install libucx-dev): counted as failed"
make -j"$jobs" check >make-check.out 2>&1 || rc=$?
grep -E '^(PASS|FAIL|SKIP|XFAIL|XPASS|ERROR):' make-check.out || true
# why each skipped test skipped: the first SKIP line of its log
for f in $(sed -n 's/^SKIP: //p' make-check.out); do
    log=${f%.sh}.log
    [ -f "$log" ] && echo "   $(grep -m1 '^SKIP' "$log")"
done
echo "== Check summaries"
find . -name '*.log' ! -name 'test-suite.log' ! -name 'config.log' -print0 |
    xargs -0 grep -h -E '^[0-9]+%: Checks: ' 2>/dev/null || true
. "$top/contrib/check_counts.sh"
check_counts "$rc"
echo "$pass passed, $fail failed${skip:+, $skip skipped}"
[ "$gpu" = yes ] || exit $rc

# 4. GPU mode: the GPU suite, against the wheel's UCX, in ./build-gpu.
host_line="host make check: ${pass:-0} passed, $(( ${fail:-0} + ${err:-0} )) failed, ${skip:-0} skipped"
[ -f test-suite.log ] || host_line="host make check: 0 passed, 1 failed"
echo "== contrib/gpu-suite.sh --with-ucx=$ucx --build-dir=$top/build-gpu (UCX $ucx_ver from the wheel)"
[ -z "$gpu_list" ] && echo "   (nvidia-smi lists no GPU here: the GPU steps will skip or fail)"
grc=0
mkdir -p "$top/build-gpu"
cd "$top/build-gpu"   # its log and ema_perf.csv go here (or to $OUT)
rm -f "${OUT:-.}/gpu-suite.log"
# (LD_LIBRARY_PATH for the wheel's ucx_info too, whose RUNPATH is the wheel's build machine's)
LD_LIBRARY_PATH="$ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$top/contrib/gpu-suite.sh" --with-ucx="$ucx" ${pmix_dir:+--with-pmix=$pmix_dir} \
    --build-dir="$top/build-gpu" --jobs="$jobs" || grc=$?
gpu_line=$(grep -a '^gpu-suite: [0-9]* passed' "${OUT:-.}/gpu-suite.log" 2>/dev/null | tail -n 1 | sed 's/ (log:.*//')
[ -n "$gpu_line" ] || gpu_line="gpu-suite: 0 passed, 1 failed, 0 skipped (no summary; exit $grc)"
read -r hp hf hs < <(printf '%s\n' "$host_line" | sed 's/.*: \([0-9]*\) passed, \([0-9]*\) failed\(, \([0-9]*\) skipped\)\{0,1\}/\1 \2 \4/')
read -r gp gf gs < <(printf '%s\n' "$gpu_line" | sed 's/.*: \([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped.*/\1 \2 \3/')
echo "== $host_line; $gpu_line"
echo "$(( hp + gp )) passed, $(( hf + gf )) failed, $(( ${hs:-0} + ${gs:-0} )) skipped"
[ "$rc" -eq 0 ] && [ "$grc" -eq 0 ]
