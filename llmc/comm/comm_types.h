// What every file of llmc/comm/ shares (comm.h is the one to read first): the MPI in use, whether
// the device path is built (LLMC_CUDA_COMM), the element types and reduction ops, the Comm
// struct with its traffic counters, and the fatal error naming the call, the rank and the reason.
#pragma once

// With -DUSE_MPI (mpicxx: the Makefile does this when it finds it) the real MPI; without it
// mpi_single.h, MPI for one process: every communicator has size 1, so the same code builds
// and runs on one rank. comm_mpi_available() tells host code which build it is in, without
// an #ifdef (to refuse, say, a multi-rank feature in the build without MPI).
#ifdef USE_MPI
#include <mpi.h>
static inline int comm_mpi_available(void) { return 1; }
#else
#include "mpi_single.h"
static inline int comm_mpi_available(void) { return 0; }
#endif
#include "../common.h"

// the device path: built by nvcc, or by g++ under the CUDA emulator (LLMC_EMU, dev/emu/)
// (only with MPI: without it every communicator has size 1 and no device buffer ever travels,
// so the build needs neither NCCL nor its library)
#if (defined(__CUDACC__) || defined(LLMC_EMU)) && !defined(LLMC_CPU) && !defined(LLMC_CUDA_COMM) && defined(USE_MPI)
#define LLMC_CUDA_COMM 1
#endif
#if defined(LLMC_CUDA_COMM) && !defined(__CUDACC__) && !defined(LLMC_EMU)
#error "LLMC_CUDA_COMM (the device path of llmc/comm/) needs nvcc (or the CUDA emulator, dev/emu/)"
#endif
#ifdef LLMC_CUDA_COMM
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#ifdef LLMC_CUDA_COMM
// device scratch buffers a communicator keeps (an algorithm holds at most 3 at once: Bruck's all-to-all)
#define COMM_SCRATCH_KEPT 4
#endif

typedef enum { COMM_FP32 = 0, COMM_BF16 = 1, COMM_INT32 = 2 } CommType;
// the CommType of the model's floatX (a macro: expanded where the backend's floatX is known)
#define COMM_FLOATX (sizeof(floatX) == 4 ? COMM_FP32 : COMM_BF16)
typedef enum { COMM_SUM = 0, COMM_AVG = 1, COMM_MAX = 2, COMM_MIN = 3 } CommOp;

static inline const char* comm_type_name(CommType t) {
    switch (t) {
        case COMM_FP32: return "fp32";
        case COMM_BF16: return "bf16";
        case COMM_INT32: return "int32";
    }
    return "?";
}
static inline const char* comm_op_name(CommOp op) {
    switch (op) {
        case COMM_SUM: return "sum";
        case COMM_AVG: return "avg";
        case COMM_MAX: return "max";
        case COMM_MIN: return "min";
    }
    return "?";
}
static inline size_t comm_type_size(CommType t) { return t == COMM_BF16 ? 2 : 4; }

typedef struct {
    MPI_Comm mpi;
    int rank;                 // this process's rank in the communicator
    int size;                 // p, the number of ranks
    int world_rank;           // for error messages
    char name[32];            // "world", "dp", ...: for error messages
    int check_args;           // 1: each collective first checks that all ranks passed the same
                              // count, type, op and root (one small uncounted MPI_Allreduce)
    uint64_t bytes_sent;      // added to by every transport call
    uint64_t messages_sent;
#ifdef LLMC_CUDA_COMM
    int device;               // 1: a device communicator (comm_enable_device); 0: host, as in the CPU build
    int staged;               // device buffers travel as host copies over MPI instead of NCCL
    int cuda_device;          // cudaGetDevice() when enabled
    ncclComm_t nccl;          // NULL when staged
    cudaStream_t stream;      // NCCL calls and the native collectives' kernels run here
    void* host_stage[2];      // pinned host copies of device buffers (staged wire): [0] send, [1] recv
    size_t host_stage_bytes[2];
    void* dev_stage[2];       // device copies of host buffers (NCCL wire) and the bf16 -> fp32 widening
    size_t dev_stage_bytes[2];
    int nonblocking;          // c->stream made with cudaStreamNonBlocking: ordered with compute by events only
    void* scratch[COMM_SCRATCH_KEPT];         // device scratch kept for reuse (comm_scratch): buffer,
    size_t scratch_bytes[COMM_SCRATCH_KEPT];  // its size, and whether an algorithm holds it now
    int scratch_busy[COMM_SCRATCH_KEPT];
    uint64_t scratch_mallocs;  // cudaMalloc calls made for scratch (the kept buffers and any beyond them)
#endif
} Comm;

typedef struct { uint64_t bytes, messages; } CommVolume;   // what an algorithm says a rank sends

// Fatal error naming the call, the rank and the reason. Every rank that detects the problem
// reports it; mpirun ends the others when the first one exits.
__attribute__((format(printf, 3, 4), noreturn))
static inline void comm_die(const Comm* c, const char* call, const char* fmt, ...) {
    char reason[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof(reason), fmt, ap);
    va_end(ap);
    die("%s on rank %d of communicator '%s' (size %d): %s", call, c->rank, c->name, c->size, reason);
}
