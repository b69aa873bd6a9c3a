#!/usr/bin/env bash
# Every binary depends on its build configuration (Makefile: build/config/NAME.flags), so that
# a change of configuration rebuilds it and nothing else does:
#   - train_gpt2cpu built with NO_MPI=1 (what make train gives before MPI is installed) is
#     rebuilt by a plain make, now with MPI; a second make rebuilds nothing;
#   - a test binary that does not use MPI is not rebuilt when MPI comes;
#   - OPENBLAS=1 rebuilds train_gpt2cpu with OpenBLAS; PRECISION=FP32 changes train_gpt2cu's
#     configuration (the CUDA build itself is not run here).
# In a copy of the sources under build/config-test: the other suites run the tree's binaries.
set -u
cd "$(dirname "$0")/.."
T=build/config-test
status=0
pass() { echo "PASS build config: $1"; }
fail() { echo "FAIL build config: $1"; status=1; }

if ! command -v mpicxx >/dev/null; then
    echo "FAIL build config: needs mpicxx (apt-get install libopenmpi-dev, or scripts/install_deps.sh)"
    exit 1
fi
rm -rf "$T"
mkdir -p "$T"
cp -r Makefile ./*.cu llmc dev test scripts "$T"/
cd "$T" || exit 1
# a make test NO_MPI=1 (or -j) above us must not reach the makes below
unset MAKEFLAGS MFLAGS MAKELEVEL

# mk LOG ARGS...: make ARGS, its output in LOG. Every make here builds with CPU_OPT=-O0: what is
# checked is which configuration rebuilds what, not the code (unoptimised, a build takes a third
# of the time); the same CPU_OPT throughout, so it is no change of configuration itself.
mk() { local log=$1; shift; make --no-print-directory CPU_OPT=-O0 "$@" >"$log" 2>&1 || { echo "make $* failed:"; tail -5 "$log"; }; }
has_mpi() { readelf -d "$1" | grep -q 'NEEDED.*libmpi'; }   # linked with MPI's library
stamp() { stat -c %y "$1"; }

mk nompi.log train_gpt2cpu test_sftcpu NO_MPI=1
if [ -x train_gpt2cpu ] && ! has_mpi train_gpt2cpu; then
    pass "NO_MPI=1 builds train_gpt2cpu without MPI"
else
    fail "NO_MPI=1: train_gpt2cpu missing or with MPI (see $T/nompi.log)"
fi
before=$(stamp train_gpt2cpu)
sft_before=$(stamp test_sftcpu)

mk mpi.log train_gpt2cpu test_sftcpu
if [ "$(stamp train_gpt2cpu)" != "$before" ] && has_mpi train_gpt2cpu &&
   grep -q "train_gpt2cpu: the build configuration changed" mpi.log; then
    pass "MPI found: make rebuilds train_gpt2cpu, now with MPI (linked with libmpi)"
else
    fail "MPI found: train_gpt2cpu was not rebuilt with MPI (see $T/mpi.log)"
fi
if [ "$(stamp test_sftcpu)" = "$sft_before" ]; then
    pass "MPI found: test_sftcpu (no MPI in it) is not rebuilt"
else
    fail "MPI found: test_sftcpu was rebuilt although its configuration does not involve MPI"
fi

before=$(stamp train_gpt2cpu)
mk again.log train_gpt2cpu test_sftcpu
if [ "$(stamp train_gpt2cpu)" = "$before" ] && ! grep -q -- "-o train_gpt2cpu" again.log; then
    pass "same configuration: a second make rebuilds nothing"
else
    fail "same configuration: train_gpt2cpu was rebuilt (see $T/again.log)"
fi

if pkg-config --exists openblas 2>/dev/null; then
    before=$(stamp train_gpt2cpu)
    mk blas.log train_gpt2cpu OPENBLAS=1
    if [ "$(stamp train_gpt2cpu)" != "$before" ] && grep -q -- "-DLLMC_OPENBLAS .* -o train_gpt2cpu" blas.log; then
        pass "OPENBLAS=1 rebuilds train_gpt2cpu with OpenBLAS"
    else
        fail "OPENBLAS=1 did not rebuild train_gpt2cpu (see $T/blas.log)"
    fi
else
    echo "skipping OPENBLAS=1: pkg-config finds no openblas (apt-get install libopenblas-dev)"
fi

mk bf16.log build/config/train_gpt2cu.flags PRECISION=BF16
bf16=$(cat build/config/train_gpt2cu.flags)
mk fp32.log build/config/train_gpt2cu.flags PRECISION=FP32
if [ "$(cat build/config/train_gpt2cu.flags)" != "$bf16" ] && grep -q -- "-DENABLE_FP32" build/config/train_gpt2cu.flags; then
    pass "PRECISION=FP32 changes train_gpt2cu's configuration (-DENABLE_FP32)"
else
    fail "PRECISION=FP32 left build/config/train_gpt2cu.flags unchanged"
fi
exit $status
