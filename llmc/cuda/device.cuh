// Device choice and checks (split out of backend.cuh so that memory.cuh, which allocates, can
// include it: every llmc/cuda/*.cuh header compiles on its own). backend_init (backend.cuh)
// calls backend_device_init and then sets up cuBLASLt; backend_ensure_init only picks the
// device (cuBLASLt sets itself up on the first matmul).
#pragma once

#include "common.cuh"

static int backend_ready = 0;
static cudaDeviceProp backend_props;

__global__ void backend_probe_kernel() {}

// Picks GPU local_rank % (number of GPUs) and checks that this binary can run on it.
static inline void backend_device_init(int local_rank) {
    if (backend_ready) { return; }
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        die("no CUDA device available (%s): this is the GPU build; run it on a machine with an NVIDIA GPU and "
            "driver, or use the CPU build (make train_gpt2cpu)", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    }
    int device = local_rank % count;
    cudaCheck(cudaSetDevice(device));
    cudaCheck(cudaGetDeviceProperties(&backend_props, device));
    int cc = backend_props.major * 10 + backend_props.minor;
#ifndef ENABLE_FP32
    if (cc < 80) {
        die("GPU %d (%s) has compute capability %d.%d; the bf16 build needs 8.0 or newer (Ampere, Ada, Hopper, ...): "
            "build with 'make PRECISION=FP32 train_gpt2cu' for this GPU", device, backend_props.name,
            backend_props.major, backend_props.minor);
    }
#endif
    // a kernel launch fails when the binary holds no code for this GPU (built for other GPU_ARCH)
    backend_probe_kernel<<<1, 1>>>();
    err = cudaGetLastError();
    if (err == cudaSuccess) { err = cudaDeviceSynchronize(); }
    if (err != cudaSuccess) {
        die("cannot run kernels on GPU %d (%s, compute capability %d.%d): %s; rebuild for it with "
            "'make GPU_ARCH=%d train_gpt2cu'", device, backend_props.name, backend_props.major, backend_props.minor,
            cudaGetErrorString(err), cc);
    }
    backend_ready = 1;
}

// device 0 if nobody called backend_init
static inline void backend_ensure_init() {
    if (!backend_ready) { backend_device_init(0); }
}
