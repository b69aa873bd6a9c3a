#!/usr/bin/env bash
# Installs what the build and the tests need on Debian/Ubuntu:
#   g++ and make (build), OpenMP (comes with g++), OpenMPI (mpirun, mpicxx),
#   OpenBLAS (fast CPU matmul), python3 with numpy and PyTorch (the reference check).
# CUDA, NCCL and cuBLAS are not installed here: they come with the CUDA toolkit
# (the CUDA build is skipped with a message when nvcc is absent).
# Run as root, or as a user with sudo.
#   bash scripts/install_deps.sh         # build + tests (what .ci/run uses)
#   bash scripts/install_deps.sh --lab   # also python3-matplotlib, for the labs' plots
set -euo pipefail
packages=(g++ make pkg-config python3 python3-numpy python3-torch libopenmpi-dev openmpi-bin libopenblas-dev)
for arg in "$@"; do
    case "$arg" in
        --lab) packages+=(python3-matplotlib) ;;
        *) echo "error: unknown option '$arg' (expected --lab)" >&2; exit 2 ;;
    esac
done

if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: apt-get not found: this script is for Debian/Ubuntu. Install by hand: ${packages[*]}" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "error: run as root or install sudo" >&2; exit 1; }
    SUDO=sudo
fi
missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install_deps: all packages present (${packages[*]})"
    exit 0
fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install_deps: done"
