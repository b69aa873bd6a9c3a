// The CUDA backend: every kernel header, and the services the driver calls (device choice,
// checks, cuBLASLt setup, synchronisation, events between compute and communication (event.cuh),
// device name, peak FLOP/s for the MFU, the ceilings --profile measures (ceilings.cuh)).
// Included by llmc/backend.h when LLMC_CPU is not defined.
#pragma once

#ifdef _OPENMP
#include <omp.h>   // host-side loops (and backend_num_threads in llmc/backend.h)
#endif
#include "common.cuh"
#include "device.cuh"
#include "memory.cuh"
#include "event.cuh"
#include "encoder.cuh"
#include "layernorm.cuh"
#include "matmul.cuh"
#include "attention.cuh"
#include "attention_block.cuh"   // the pieces of ring attention (llmc/parallel/cp_ring.h)
#include "rows.cuh"              // and what it moves, fills and sums around them
#include "moe.cuh"               // the pieces of the mixture-of-experts block (llmc/model/moe_block.h)
#include "gelu.cuh"
#include "residual.cuh"
#include "classifier.cuh"
#include "global_norm.cuh"
#include "adamw.cuh"
#include "quantize.cuh"   // block-wise int8/int4 quantisation (ZeRO++: llmc/parallel/dp_zeropp.h)
#include "fp8.cuh"                 // FP8 simulated: absmax, fake quantisation (llmc/model/fp8_linear.h)
#include "ceilings.cuh"            // --profile: the GPU's matmul FLOP/s and copy bandwidth, measured
#include "mfu.h"

// Picks GPU local_rank % (number of GPUs), checks it (device.cuh), then sets up cuBLASLt.
static inline void backend_init(int local_rank) {
    backend_device_init(local_rank);
    cublaslt_setup();
}

// the whole device: every stream (collectives' included); for ordering data between the compute
// stream and a communicator, an event (event.cuh) stops neither side
static inline void backend_synchronize() { cudaCheck(cudaDeviceSynchronize()); }

static inline void backend_shutdown() {
    if (!backend_ready) { return; }
    cudaCheck(cudaDeviceSynchronize());
    cublaslt_teardown();
    backend_ready = 0;
}

static inline const char* backend_device_name() {
    backend_ensure_init();
    return backend_props.name;
}

// Dense peak FLOP/s of this GPU in the build's precision (bf16 tensor cores; fp32 CUDA cores
// for the fp32 build, whose matmuls do not use TF32); 0 when the GPU is not in llmc/cuda/mfu.h.
static inline double backend_peak_flops() {
    backend_ensure_init();
    return device_peak_flops(backend_props.name, FLOATX_IS_BF16);
}
