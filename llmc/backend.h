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
#include "cpu/attention_block.h"   // the pieces of ring attention (llmc/parallel/cp.h)
#include "cpu/moe.h"               // the pieces of the mixture-of-experts block (llmc/moe.h)
#include "cpu/gelu.h"
#include "cpu/residual.h"
#include "cpu/classifier.h"
#include "cpu/global_norm.h"
#include "cpu/adamw.h"

// Backend services the driver calls; on the CPU there is nothing to set up or wait for.
static inline void backend_init(int local_rank) { (void)local_rank; }
static inline void backend_synchronize() {}
// Events between compute and communication (llmc/cuda/event.cuh): on the CPU a kernel has
// finished when its call returns, so there is nothing to mark or wait for.
typedef struct BackendEventCpu* BackendEvent;   // always NULL
static inline BackendEvent backend_event_create() { return NULL; }
static inline void backend_event_record(BackendEvent e) { (void)e; }
static inline void backend_event_synchronize(BackendEvent e) { (void)e; }
static inline void backend_event_destroy(BackendEvent e) { (void)e; }
static inline void backend_shutdown() {}
static inline const char* backend_device_name() { return "cpu"; }
// Peak dense FLOP/s of the device in the build's precision, 0 when unknown: MFU prints n/a.
static inline double backend_peak_flops() { return 0.0; }
#else
#include "cuda/backend.cuh"   // the same names, on the GPU (llmc/cuda/)
#endif

static inline int backend_num_threads() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
