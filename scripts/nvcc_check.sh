#!/usr/bin/env bash
# Compile every .cu file of the project with nvcc, as CI does, warnings counted as failures. No
# GPU is needed and nothing is run. What "it compiles" means here (make test runs this: built
# optimised for two GPU generations, the same files took over 12 minutes of CPU on 2 cores, most
# of it in the device optimiser cicc, which says nothing about whether the code compiles):
#
# 1. Every .cu file with the CPU backend (-DLLMC_CPU) through nvcc's front end (nvcc -cuda: the
#    preprocessor and cudafe++, which parses the whole file as CUDA C++ and reports its errors
#    and warnings): the driver and the tests stay valid nvcc input for both backends
#    (dev/emu/test_emu.cu is not: it tests the CPU emulator and is built by g++ only). The host
#    code itself is compiled by g++ in the ordinary build (make), with the same warnings.
# 2. The CUDA backend for real (llmc/cuda/, no -DLLMC_CPU): train_gpt2cu (bf16) down to sm_90
#    machine code (ptxas assembles every kernel: it checks the inline PTX and each kernel's shared
#    memory), linked with cuBLASLt, the optimisers of both device passes off. Then every other CUDA program (the
#    trainer in fp32 and with MPI + NCCL, test_gpt2cu in bf16 and fp32, test_generatecu,
#    test_cuda_kernelscu, test_seamscu, every kernel-lab file dev/cuda/*.cu) compiled and linked
#    with the device code unoptimised and stopped at PTX for sm_90 (-Xcicc -O0, code=compute_90):
#    every kernel is parsed, checked and lowered, the optimiser's time is saved. The optimised
#    binaries a GPU runs are make's (make train_gpt2cu test_gpt2cu ..., doc/cuda-backend.md).
# 3. The CUDA build of the collectives (llmc/comm/'s device path: NCCL and staged MPI on device
#    buffers, compiled when nvcc builds without -DLLMC_CPU): each file of COMM_CUDA_FILES
#    compiled and linked with MPI (flags from mpicxx --showme) and NCCL. Set NCCL_HOME when
#    nccl.h and libnccl are not in nvcc's own include and library paths.
# Without an argument nvcc is looked for on PATH and in /usr/local/cuda; without one it prints
# a "skipping" line and exits 0 (make test on a machine with no CUDA toolkit). Prints PASS/FAIL
# per file, in this order; the compiles run NVCC_JOBS at a time (default: one per core).
set -u
NVCC=${1:-$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)}
if ! command -v "$NVCC" >/dev/null 2>&1; then
    if [ $# -ge 1 ]; then echo "FAIL nvcc '$NVCC' not found"; exit 1; fi
    echo "skipping nvcc: not found (install the CUDA toolkit to compile the .cu files with it)"
    exit 0
fi
cd "$(dirname "$0")/.."
R=build/nvcc-check
rm -rf "$R"
mkdir -p "$R"
JOBS=${NVCC_JOBS:-$(nproc 2>/dev/null || echo 2)}

# check PASS-TEXT FAIL-TEXT LOG CMD...: runs CMD in the background (at most JOBS at once); its
# PASS or FAIL line (with the log's first lines) goes to $R/N.result, printed in order at the end.
# A warning in the log is a failure.
n=0
check() {
    local pass=$1 fail=$2 log=$3 res
    shift 3
    n=$((n + 1))
    res=$R/$(printf '%03d' $n).result
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    {
        if "$@" >"$log" 2>&1 && ! grep -q -i "warning" "$log"; then
            echo "PASS $pass" >"$res"
        else
            { echo "FAIL $fail (see $log)"; sed 's/^/    /' "$log" | head -20; } >"$res"
        fi
    } &
}

# --- 1. every .cu file with the CPU backend, through nvcc's front end
flags=(-std=c++17 -x cu -DLLMC_CPU -Xcompiler -fopenmp,-Wall,-Wextra)
for f in $(find . -name '*.cu' -not -path './build/*' -not -path './.git/*' -not -path './dev/cuda/*' -not -path './dev/emu/*' | sed 's|^./||' | sort); do
    name=$(echo "$f" | tr '/.' '__')
    check "nvcc front end accepts $f (CPU backend)" "nvcc front end on $f" "build/nvcc_$name.log" \
        "$NVCC" "${flags[@]}" -cuda "$f" -o "$R/$name.ii"
done

# --- 2. the CUDA backend (llmc/cuda/): the trainer down to machine code, then every other
# program with the device code stopped at PTX (see the top of this file)
full_flags=(-std=c++17 -O0 -Xcicc -O0 -Xptxas -O0 -gencode arch=compute_90,code=sm_90 -Xcompiler -fopenmp,-Wall,-Wextra)
check_flags=(-std=c++17 -O0 -Xcicc -O0 -gencode arch=compute_90,code=compute_90 -Xcompiler -fopenmp,-Wall,-Wextra)
cuda_libs=(-lcublasLt -lcublas)
cuda_build() {   # cuda_build full|ptx NAME SOURCE EXTRA_FLAGS...
    local kind=$1 name=$2 src=$3 what="compiles and links (device code to PTX, unoptimised)"
    shift 3
    local fl=("${check_flags[@]}")
    if [ "$kind" = full ]; then fl=("${full_flags[@]}"); what="builds (sm_90 machine code, unoptimised)"; fi
    check "nvcc CUDA backend $what $src -> build/$name (not run: needs a GPU)" "nvcc CUDA backend build of $src as $name" \
        "build/nvcc_cuda_$name.log" "$NVCC" "${fl[@]}" "$@" "$src" -o "build/$name" "${cuda_libs[@]}"
}
cuda_build full train_gpt2cu train_gpt2.cu
cuda_build ptx test_gpt2cu test/test_gpt2.cu
cuda_build ptx train_gpt2cu_fp32 train_gpt2.cu -DENABLE_FP32
cuda_build ptx test_gpt2cu_fp32 test/test_gpt2.cu -DENABLE_FP32
cuda_build ptx test_generatecu test/test_generate.cu
cuda_build ptx test_cuda_kernelscu test/test_cuda_kernels.cu -Xcompiler -fopenmp
cuda_build ptx test_seamscu test/test_seams.cu
# the multi-rank trainer: MPI + NCCL (as make train_gpt2cu builds it when both are found)
nccl_flags=()
if [ -n "${NCCL_HOME:-}" ]; then nccl_flags=(-I"$NCCL_HOME/include" -L"$NCCL_HOME/lib"); fi
if command -v mpicxx >/dev/null; then
    read -r -a mpi_cflags <<<"$(mpicxx --showme:compile)"
    read -r -a mpi_lflags <<<"$(mpicxx --showme:link)"
    cuda_build ptx train_gpt2cu_mpi train_gpt2.cu -DUSE_MPI -DOMPI_SKIP_MPICXX "${mpi_cflags[@]}" "${nccl_flags[@]}" \
        "${mpi_lflags[@]}" -lnccl
fi
# the kernel lab: each file calls the llmc/cpu reference (OpenMP) and the llmc/cuda kernels
for f in $(find dev/cuda -name '*.cu' 2>/dev/null | sort); do
    cuda_build ptx "dev_$(basename "$f" .cu)" "$f" -Xcompiler -fopenmp
done

# --- 3. the CUDA build of llmc/comm/ (device path), compiled and linked
COMM_CUDA_FILES=(collbench.cu test/test_collectives.cu test/test_collectives_device.cu)
if command -v mpicxx >/dev/null; then
    cflags=(-std=c++17 -O0 -Xcicc -O0 -gencode arch=compute_90,code=compute_90 -DUSE_MPI -DOMPI_SKIP_MPICXX "${mpi_cflags[@]}"
            "${nccl_flags[@]}" -Xcompiler -Wall,-Wextra)
    for f in "${COMM_CUDA_FILES[@]}"; do
        out=build/$(basename "$f" .cu)_cuda
        check "nvcc CUDA comm build compiles and links $f -> $out (not run: needs a GPU)" "nvcc CUDA comm build of $f" \
            "build/nvcc_cuda_$(echo "$f" | tr '/.' '__').log" "$NVCC" "${cflags[@]}" "$f" -o "$out" "${mpi_lflags[@]}" -lnccl
    done
fi
wait
rm -f "$R"/*.ii
fail=0
cat "$R"/*.result
grep -q '^FAIL ' "$R"/*.result && fail=1
command -v mpicxx >/dev/null || echo "SKIP nvcc CUDA comm build: mpicxx not found (apt-get install libopenmpi-dev)"
exit $fail
