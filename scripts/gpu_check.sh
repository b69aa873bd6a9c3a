#!/usr/bin/env bash
# One command on a machine that has both the CUDA toolkit and a GPU: make the bundle for this GPU
# (make gpu-bundle, scripts/gpu_bundle.sh: every CUDA program, the reference files, the data), then
# run all of it (build/gpu-bundle/run.sh --all: the quick check, the kernel lab, the MPI trainer
# where mpirun is found). On a cluster, make the bundle on the login node and run it in the GPU
# job instead (README, "On a GPU"): compiling costs a short GPU slot several minutes.
#   bash scripts/gpu_check.sh             results in build/gpu-bundle/results/ (summary.txt,
#                                         gpu-results.md: paste it into doc/gpu-results.md)
# Exit status 0 only when every check passed; without a GPU, one line that says so.
set -u
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q "^GPU "; then
    echo "gpu_check: no usable GPU here (nvidia-smi missing or finds none); make gpu-bundle builds the check without one"
    exit 1
fi
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
GPU_ARCHS=${GPU_ARCHS:-$arch} make gpu-bundle || exit 1
exec bash build/gpu-bundle/run.sh --all "$@"
