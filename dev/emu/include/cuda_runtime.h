// cuda_runtime.h as the emulator sees it (dev/emu/README.md): the toolkit's own header, read
// by g++ as host C++, then the device side of CUDA (threadIdx, __syncthreads, shuffles, the
// PTX instructions the project uses, ...) from cuda_emu.h. g++ finds this file first because
// the emulator build puts dev/emu/include before the toolkit's include directory.
#pragma once
#ifndef LLMC_EMU
#define LLMC_EMU 1
#endif
// __shared__ variables become static: the blocks of a launch run one after the other on one
// host thread, so one copy serves each block in turn (cuda_emu.h poisons it per block).
#undef __shared__   // a toolkit header included earlier may have defined it (as nothing)
#define __shared__ static
#include_next <cuda_runtime.h>
#include "../cuda_emu.h"
