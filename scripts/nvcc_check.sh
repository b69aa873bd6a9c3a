#!/usr/bin/env bash
# Compile every .cu file of the project with nvcc, as CI does, warnings counted as failures. No
# GPU is needed and nothing is run. What "it compiles" means here (make test runs this: built
# optimised for two GPU generations, the same files took over 12 minutes of CPU on 2 cores, most
# of it in the device optimiser cicc, which says nothing about whether the code compiles):
#
# 1. Every .cu file that sections 2 and 3 do not compile (the CPU-only programs and tests) with
#    the CPU backend (-DLLMC_CPU) through nvcc's front end (nvcc -cuda: the preprocessor and
#    cudafe++, which parses the whole file as CUDA C++ and reports its errors and warnings): every
#    .cu file stays valid nvcc input (dev/emu/test_emu.cu is not: it tests the CPU emulator and is
#    built by g++ only). The host code itself is compiled by g++ in the ordinary build (make),
#    with the same warnings.
# 2. The CUDA backend for real (llmc/cuda/, no -DLLMC_CPU), in two depths:
#    - the trainer as make builds it (with MPI + NCCL when mpicxx is found) down to sm_90 machine
#      code (ptxas assembles every kernel: it checks the inline PTX and each kernel's shared
#      memory), linked with cuBLASLt (and MPI, NCCL), both device passes' optimisers off;
#    - every other CUDA program (the trainer without MPI and in fp32, test_gpt2cu in bf16 and
#      fp32, test_generatecu, test_cuda_kernelscu, test_seamscu, every kernel-lab file
#      dev/cuda/*.cu): the whole of nvcc's pipeline, the device code unoptimised and stopped at
#      PTX for sm_90 (-Xcicc -O0, code=compute_90: every kernel parsed, checked and lowered), and
#      the host code (after nvcc's split) checked by g++ with -fsyntax-only: every error and
#      warning g++ gives, without generating host machine code or linking, which was 60% of
#      these builds' time (15 of 27 s for the fp32 trainer). What a link would add is checked
#      elsewhere: the trainer above links every library these programs call (cudart, cuBLASLt,
#      MPI, NCCL), and the emulated builds (make test's emu-* suites) link the same host code.
#    The optimised binaries a GPU runs are make's (make train_gpt2cu test_gpt2cu ..., make
#    gpu-bundle; doc/cuda-backend.md).
# 3. The CUDA build of the collectives (llmc/comm/'s device path: NCCL and staged MPI on device
#    buffers, compiled when nvcc builds without -DLLMC_CPU): dev/collbench/collbench.cu and
#    test/test_collectives_device.cu compiled and linked with MPI (flags from mpicxx --showme) and
#    NCCL, test/test_collectives.cu as the "check" above.
#    Set NCCL_HOME when nccl.h and libnccl are not in nvcc's own include and library paths.
# Alone on 2 cores: 114-121 s, 221-234 s of CPU; with the host code of every program compiled and linked
# and the CPU-backend front end on every file, as before, 161 s and 313 s (2026-11-28).
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

# the files section 2 and 3 compile for the CUDA backend (nvcc's front end included): section 1
# takes the others
cuda_srcs=" train_gpt2.cu test/test_gpt2.cu test/test_generate.cu test/test_cuda_kernels.cu test/test_seams.cu "
if command -v mpicxx >/dev/null; then
    cuda_srcs+="dev/collbench/collbench.cu test/test_collectives.cu test/test_collectives_device.cu "
fi

# --- 1. every other .cu file with the CPU backend, through nvcc's front end
flags=(-std=c++17 -x cu -DLLMC_CPU -Xcompiler -fopenmp,-Wall,-Wextra)
for f in $(find . -name '*.cu' -not -path './build/*' -not -path './.git/*' -not -path './dev/cuda/*' -not -path './dev/emu/*' | sed 's|^./||' | sort); do
    case "$cuda_srcs" in *" $f "*) continue ;; esac
    name=$(echo "$f" | tr '/.' '__')
    check "nvcc front end accepts $f (CPU backend)" "nvcc front end on $f" "build/nvcc_$name.log" \
        "$NVCC" "${flags[@]}" -cuda "$f" -o "$R/$name.ii"
done

# --- 2. the CUDA backend (llmc/cuda/): the trainer down to machine code, then every other
# program with the device code stopped at PTX (see the top of this file)
full_flags=(-std=c++17 -O0 -Xcicc -O0 -Xptxas -O0 -gencode arch=compute_90,code=sm_90 -Xcompiler -fopenmp,-Wall,-Wextra)
ptx_flags=(-std=c++17 -O0 -Xcicc -O0 -gencode arch=compute_90,code=compute_90 -Xcompiler -fopenmp,-Wall,-Wextra)
cuda_libs=(-lcublasLt -lcublas)
cuda_build() {   # cuda_build full|check NAME SOURCE EXTRA_FLAGS...
    local kind=$1 name=$2 src=$3
    shift 3
    if [ "$kind" = full ]; then
        check "nvcc CUDA backend builds (sm_90 machine code, unoptimised) $src -> build/$name (not run: needs a GPU)" \
            "nvcc CUDA backend build of $src as $name" "build/nvcc_cuda_$name.log" \
            "$NVCC" "${full_flags[@]}" "$@" "$src" -o "build/$name" "${cuda_libs[@]}"
    else
        check "nvcc CUDA backend compiles $src as $name (device code to PTX, host code checked by g++; not linked)" \
            "nvcc CUDA backend compile of $src as $name" "build/nvcc_cuda_$name.log" \
            "$NVCC" "${ptx_flags[@]}" -Xcompiler -fsyntax-only -c "$@" "$src" -o "$R/$name.o"
    fi
}
# the trainer as make builds it: with MPI + NCCL where both are found, to machine code and linked
nccl_flags=()
if [ -n "${NCCL_HOME:-}" ]; then nccl_flags=(-I"$NCCL_HOME/include" -L"$NCCL_HOME/lib"); fi
if command -v mpicxx >/dev/null; then
    read -r -a mpi_cflags <<<"$(mpicxx --showme:compile)"
    read -r -a mpi_lflags <<<"$(mpicxx --showme:link)"
    cuda_build full train_gpt2cu_mpi train_gpt2.cu -DUSE_MPI -DOMPI_SKIP_MPICXX "${mpi_cflags[@]}" "${nccl_flags[@]}" \
        "${mpi_lflags[@]}" -lnccl
    cuda_build check train_gpt2cu train_gpt2.cu
else
    cuda_build full train_gpt2cu train_gpt2.cu
fi
cuda_build check test_gpt2cu test/test_gpt2.cu
cuda_build check train_gpt2cu_fp32 train_gpt2.cu -DENABLE_FP32
cuda_build check test_gpt2cu_fp32 test/test_gpt2.cu -DENABLE_FP32
cuda_build check test_generatecu test/test_generate.cu
cuda_build check test_cuda_kernelscu test/test_cuda_kernels.cu -Xcompiler -fopenmp
cuda_build check test_seamscu test/test_seams.cu
# the kernel lab: each file calls the llmc/cpu reference (OpenMP) and the llmc/cuda kernels
for f in $(find dev/cuda -name '*.cu' 2>/dev/null | sort); do
    cuda_build check "dev_$(basename "$f" .cu)" "$f" -Xcompiler -fopenmp
done

# --- 3. the CUDA build of llmc/comm/ (device path): collbench and the device test compiled and
# linked with MPI and NCCL (build/test_collectives_device_cuda is the first program to run on a GPU:
# doc/design-notes.md), the host-buffer test compiled as section 2's "check"
if command -v mpicxx >/dev/null; then
    cflags=(-std=c++17 -O0 -Xcicc -O0 -gencode arch=compute_90,code=compute_90 -DUSE_MPI -DOMPI_SKIP_MPICXX "${mpi_cflags[@]}"
            "${nccl_flags[@]}" -Xcompiler -Wall,-Wextra)
    for f in dev/collbench/collbench.cu test/test_collectives_device.cu; do
        out=build/$(basename "$f" .cu)_cuda
        check "nvcc CUDA comm build compiles and links $f -> $out (not run: needs a GPU)" "nvcc CUDA comm build of $f" \
            "build/nvcc_cuda_$(echo "$f" | tr '/.' '__').log" "$NVCC" "${cflags[@]}" "$f" -o "$out" "${mpi_lflags[@]}" -lnccl
    done
    check "nvcc CUDA comm build compiles test/test_collectives.cu (device code to PTX, host code checked by g++; not linked)" \
        "nvcc CUDA comm compile of test/test_collectives.cu" "build/nvcc_cuda_test_test_collectives_cu.log" \
        "$NVCC" "${cflags[@]}" -Xcompiler -fsyntax-only -c test/test_collectives.cu -o "$R/test_collectives_cuda.o"
fi
wait
rm -f "$R"/*.ii
fail=0
cat "$R"/*.result
grep -q '^FAIL ' "$R"/*.result && fail=1
command -v mpicxx >/dev/null || echo "SKIP nvcc CUDA comm build: mpicxx not found (apt-get install libopenmpi-dev)"
exit $fail
