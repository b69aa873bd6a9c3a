// Picks the kernel backend. The same host code (llmc/model/gpt2.h, train_gpt2.cu) calls the same
// function names with the same signatures; only the implementation differs:
//   -DLLMC_CPU : llmc/cpu/*.h   fp32 reference kernels, OpenMP, runs everywhere
//   otherwise  : llmc/cuda/*.cuh  bf16 mixed precision on the GPU (doc/cuda-backend.md)
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
#include "cpu/kv_cache.h"         // the KV-cache kernels of generation (llmc/model/generate.h)
#include "cpu/attention_block.h"   // the pieces of ring attention (llmc/parallel/cp_ring.h)
#include "cpu/rows.h"              // and what it moves, fills and sums around them
#include "cpu/moe.h"               // the pieces of the mixture-of-experts block (llmc/model/moe_block.h)
#include "cpu/gelu.h"
#include "cpu/residual.h"
#include "cpu/classifier.h"
#include "cpu/classifier_vocab_parallel.h"   // the loss over tp ranks (llmc/parallel/vocab.h)
#include "cpu/global_norm.h"
#include "cpu/adamw.h"
#include "cpu/quantize.h"       // block-wise int8/int4 quantisation (ZeRO++: llmc/parallel/dp_zeropp.h)
#include "cpu/fp8.h"                // FP8 simulated: absmax, fake quantisation (llmc/model/fp8_linear.h)
#include "cpu/ceilings.h"           // --profile: the machine's peak FLOP/s and memory bandwidth, measured

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
// --precision: the CPU backend stores floatX rounded to fp32, bf16 or fp16 (llmc/cpu/memory.h)
static inline int backend_precision() { return cpu_prec.prec; }
static inline void backend_set_precision(int prec) { cpu_prec.prec = prec < 0 ? PREC_FP32 : prec; }
static inline void backend_precision_counting(int on) { cpu_prec.paused = !on; }   // off while --recompute rebuilds
// what rounding to it did over the run: the underflow (non-zero values stored as 0) and overflow
// (finite values stored as inf) that loss scaling is about (doc/precision.md)
static inline void backend_precision_report() {
    if (cpu_prec.prec == PREC_FP32) { return; }
    const char* kinds[2] = {"activations", "gradients"};
    for (int k = 1; k >= 0; k--) {
        double nz = cpu_prec.nonzero[k];
        printf("%s rounding, %-11s %.4f%% of %.3g non-zero values flushed to zero, %.0f finite values overflowed to inf\n",
               precision_name(cpu_prec.prec), kinds[k], nz > 0 ? 100.0 * cpu_prec.flushed[k] / nz : 0.0, nz,
               cpu_prec.overflowed[k]);
    }
}
#else
#include "cuda/backend.cuh"   // the same names, on the GPU (llmc/cuda/)
#include "precision.h"
// --precision on CUDA: the build's floatX (bf16, or fp32 with make PRECISION=FP32); FP16 is
// studied on the CPU backend, which rounds to it (doc/precision.md)
static inline int backend_precision() { return FLOATX_IS_BF16 ? PREC_BF16 : PREC_FP32; }
static inline void backend_precision_report() {}   // the GPU's conversions are not counted
static inline void backend_precision_counting(int on) { (void)on; }
static inline void backend_set_precision(int prec) {
    if (prec >= 0 && prec != backend_precision()) {
        die("--precision %s: this CUDA build stores %s (make PRECISION=FP32 builds fp32, the default build bf16); "
            "--precision fp16 runs on the CPU backend (./train_gpt2cpu --precision fp16)", precision_name(prec),
            precision_name(backend_precision()));
    }
}
#endif

static inline int backend_num_threads() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
