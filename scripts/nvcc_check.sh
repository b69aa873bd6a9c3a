#!/usr/bin/env bash
# Compile every .cu file of the project with nvcc, as CI does, warnings counted as failures.
# First every .cu file with the CPU backend (-DLLMC_CPU), which checks that the driver and the
# tests stay valid nvcc input for both backends (dev/emu/test_emu.cu is not: it tests the CPU
# emulator and is built by g++ only). Prints PASS/FAIL per file.
#
# Then the CUDA backend for real (llmc/cuda/, no -DLLMC_CPU): train_gpt2cu and test_gpt2cu in
# bf16 and fp32, compiled for sm_80 and sm_90 and linked with cuBLASLt, and every kernel-lab
# file dev/cuda/*.cu (which is built only this way). Nothing is run: CI has no GPU.
#
# Then the CUDA build of the collectives (llmc/comm/'s device path: NCCL and staged MPI on
# device buffers, compiled when nvcc builds without -DLLMC_CPU): each file of COMM_CUDA_FILES
# is compiled and linked without -DLLMC_CPU, with MPI (flags from mpicxx --showme) and NCCL.
# Nothing is run: CI has no GPU. Set NCCL_HOME when nccl.h and libnccl are not in nvcc's own
# include and library paths.
# Without an argument nvcc is looked for on PATH and in /usr/local/cuda; without one it prints
# a "skipping" line and exits 0 (make test on a machine with no CUDA toolkit).
set -u
NVCC=${1:-$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)}
if ! command -v "$NVCC" >/dev/null 2>&1; then
    if [ $# -ge 1 ]; then echo "FAIL nvcc '$NVCC' not found"; exit 1; fi
    echo "skipping nvcc: not found (install the CUDA toolkit to compile the .cu files with it)"
    exit 0
fi
cd "$(dirname "$0")/.."
mkdir -p build
flags=(-std=c++17 -O1 -x cu -DLLMC_CPU -Xcompiler -fopenmp,-Wall,-Wextra)
fail=0
for f in $(find . -name '*.cu' -not -path './build/*' -not -path './.git/*' -not -path './dev/cuda/*' -not -path './dev/emu/*' | sed 's|^./||' | sort); do
    log=build/nvcc_$(echo "$f" | tr '/.' '__').log
    if "$NVCC" "${flags[@]}" -c "$f" -o build/nvcc_check.o >"$log" 2>&1 && ! grep -q -i "warning" "$log"; then
        echo "PASS nvcc compiles $f"
    else
        echo "FAIL nvcc compiles $f (see $log)"
        sed 's/^/    /' "$log" | head -20
        fail=1
    fi
done
rm -f build/nvcc_check.o

# --- the CUDA backend (llmc/cuda/): the trainer and the model test, bf16 and fp32, linked
cuda_flags=(-std=c++17 -O3 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]
            -Xcompiler -fopenmp,-Wall,-Wextra)
cuda_libs=(-lcublasLt -lcublas)
cuda_build() {   # cuda_build NAME SOURCE EXTRA_FLAGS...
    local name=$1 src=$2; shift 2
    local log=build/nvcc_cuda_$name.log
    if "$NVCC" "${cuda_flags[@]}" "$@" "$src" -o "build/$name" "${cuda_libs[@]}" >"$log" 2>&1 && ! grep -q -i "warning" "$log"; then
        echo "PASS nvcc CUDA backend builds $src -> build/$name (not run: needs a GPU)"
    else
        echo "FAIL nvcc CUDA backend build of $src as $name (see $log)"
        sed 's/^/    /' "$log" | head -20
        fail=1
    fi
}
cuda_build train_gpt2cu train_gpt2.cu
cuda_build test_gpt2cu test/test_gpt2.cu
cuda_build train_gpt2cu_fp32 train_gpt2.cu -DENABLE_FP32
cuda_build test_gpt2cu_fp32 test/test_gpt2.cu -DENABLE_FP32
cuda_build test_generatecu test/test_generate.cu
cuda_build test_cuda_kernelscu test/test_cuda_kernels.cu -Xcompiler -fopenmp
cuda_build test_seamscu test/test_seams.cu
# the multi-rank trainer: MPI + NCCL (as make train_gpt2cu builds it when both are found)
if command -v mpicxx >/dev/null; then
    read -r -a mpi_cflags <<<"$(mpicxx --showme:compile)"
    read -r -a mpi_lflags <<<"$(mpicxx --showme:link)"
    nccl_flags=()
    if [ -n "${NCCL_HOME:-}" ]; then nccl_flags=(-I"$NCCL_HOME/include" -L"$NCCL_HOME/lib"); fi
    cuda_build train_gpt2cu_mpi train_gpt2.cu -DUSE_MPI -DOMPI_SKIP_MPICXX "${mpi_cflags[@]}" "${nccl_flags[@]}" \
        "${mpi_lflags[@]}" -lnccl
fi
# the kernel lab: each file calls the llmc/cpu reference (OpenMP) and the llmc/cuda kernels
for f in $(find dev/cuda -name '*.cu' 2>/dev/null | sort); do
    cuda_build "dev_$(basename "$f" .cu)" "$f" -Xcompiler -fopenmp
done

# --- the CUDA build of llmc/comm/ (device path), compiled and linked
COMM_CUDA_FILES=(collbench.cu test/test_collectives.cu test/test_collectives_device.cu)
if ! command -v mpicxx >/dev/null; then
    echo "SKIP nvcc CUDA comm build: mpicxx not found (apt-get install libopenmpi-dev)"
else
    read -r -a mpi_cflags <<<"$(mpicxx --showme:compile)"
    read -r -a mpi_lflags <<<"$(mpicxx --showme:link)"
    nccl_flags=()
    if [ -n "${NCCL_HOME:-}" ]; then nccl_flags=(-I"$NCCL_HOME/include" -L"$NCCL_HOME/lib"); fi
    cflags=(-std=c++17 -O1 -DUSE_MPI -DOMPI_SKIP_MPICXX "${mpi_cflags[@]}" "${nccl_flags[@]}" -Xcompiler -Wall,-Wextra)
    for f in "${COMM_CUDA_FILES[@]}"; do
        out=build/$(basename "$f" .cu)_cuda
        log=build/nvcc_cuda_$(echo "$f" | tr '/.' '__').log
        if "$NVCC" "${cflags[@]}" "$f" -o "$out" "${mpi_lflags[@]}" -lnccl >"$log" 2>&1 && ! grep -q -i "warning" "$log"; then
            echo "PASS nvcc CUDA comm build compiles and links $f -> $out (not run: needs a GPU)"
        else
            echo "FAIL nvcc CUDA comm build of $f (see $log)"
            sed 's/^/    /' "$log" | head -20
            fail=1
        fi
    done
fi
exit $fail
