// Picks the kernel backend. The same host code (llmc/gpt2.h, train_gpt2.cu) calls the same
// function names with the same signatures; only the implementation differs:
//   -DLLMC_CPU : llmc/cpu/*.h   fp32 reference kernels, OpenMP, runs everywhere
//   otherwise  : llmc/cuda/*.cuh  bf16 mixed precision on the GPU (the CUDA backend issue)
#pragma once

#ifdef LLMC_CPU
#ifdef _OPENMP
#include <omp.h>
#endif
#include "cpu/memory.h"
#include "cpu/encoder.h"
#include "cpu/layernorm.h"
#include "cpu/matmul.h"
#include "cpu/attention.h"
#include "cpu/gelu.h"
#include "cpu/residual.h"
#include "cpu/classifier.h"
#include "cpu/global_norm.h"
#include "cpu/adamw.h"
#else
#error "The CUDA backend (llmc/cuda/) is not in the tree yet: build with -DLLMC_CPU (make train_gpt2cpu)."
#endif

static inline int backend_num_threads() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
