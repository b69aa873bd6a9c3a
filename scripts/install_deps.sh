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
#   bash scripts/install_deps.sh --auto    # never prompts (make test, make train call it so):
#       installs as root or with sudo that needs no password; otherwise prints the command to
#       run and fails
set -euo pipefail
auto=0
train=0
lab=0
for arg in "$@"; do
    case "$arg" in
        --auto) auto=1 ;;
        --train) train=1 ;;
        --lab) lab=1 ;;
        *) echo "error: unknown option '$arg' (expected --auto, --train, --lab)" >&2; exit 2 ;;
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

if [ ${#missing[@]} -eq 0 ]; then
    echo "install_deps: all present (g++, make, python3$([ $train = 1 ] || echo ", OpenMPI, OpenBLAS, PyTorch")$([ $train = 1 ] || [ "$(id -u)" != 0 ] || echo ", iproute2")$([ $lab = 0 ] || echo ", matplotlib"))"
    exit 0
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
