// Events between the compute stream and a communicator's stream (llmc/comm/comm.h, "The device
// path"): the compute thread records an event after the kernels that write what a collective
// will read, and the communicator's stream waits for it (comm_wait_event), so neither host
// thread stops for the other and the GPU keeps the order:
//
//   compute stream   kernels write g -> backend_event_record(e) -> later kernels (not waited for)
//   comm stream                  comm_wait_event(c, e) -> copies, reduce, NCCL on g
//
// The compute stream is the legacy default stream (common.cuh), so an event is recorded there.
// The CPU backend has the same names as no-ops (llmc/backend.h): a CPU kernel has finished when
// its call returns. Split out of backend.cuh so that code using only llmc/comm (its tests) can
// include it without the kernels.
#pragma once

#include "common.cuh"

typedef cudaEvent_t BackendEvent;

// timing off: cheaper to record and wait for
static inline BackendEvent backend_event_create() {
    cudaEvent_t e;
    cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
}
// marks the work issued so far on the compute stream (by any host thread); recording it again
// moves the mark, waits issued before keep the old one
static inline void backend_event_record(BackendEvent e) { cudaCheck(cudaEventRecord(e, 0)); }
// the host waits until the compute stream has reached e
static inline void backend_event_synchronize(BackendEvent e) { cudaCheck(cudaEventSynchronize(e)); }
static inline void backend_event_destroy(BackendEvent e) { cudaCheck(cudaEventDestroy(e)); }
