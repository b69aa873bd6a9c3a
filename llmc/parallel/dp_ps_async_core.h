// The asynchronous / stale synchronous parameter server (llmc/parallel/dp_ps_async.h): the
// messages between the workers and the server, the state both sides keep, and the transport.
//
// Messages go over a communicator of our own (MPI_Comm_dup of the dp group), from the worker
// (main thread) and the server (rank 0's second thread) at once: MPI_THREAD_MULTIPLE (plan_init
// asks for it). The Comm objects are not used here: they are not thread-safe.
//
// The trainer computes a step's mean loss (plan_mean) only after the update, so a worker's loss
// for clock c travels with its next message (the next push, the final barrier or its goodbye);
// the server's log (--ps-log) is written at the end, once every loss is in.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>
#include "dp_mode.h"

enum { PSA_PUSH = 1, PSA_BARRIER = 2, PSA_DONE = 3 };   // what a worker's request is
enum { PSA_TAG_REQUEST = 23101, PSA_TAG_GRAD, PSA_TAG_REPLY, PSA_TAG_PARAMS };

// A worker's request (H = sizeof bytes): a push (then its gradient follows), the barrier that
// evaluation and checkpoints need (every worker at the same version), or its goodbye.
typedef struct {
    int kind, worker;
    int clock;         // push: this worker's step (from 0); barrier, done: steps pushed so far
    int version;       // the version of the parameters the gradient was computed on
    int want;          // push: answer with parameters of a version >= want (SSP; 0: async)
    int loss_clock;    // the step whose mean loss this request carries (-1: none)
    float loss;        //   (the trainer knows it only after the update: it comes one message late)
    float lr, beta1, beta2, eps, weight_decay, grad_clip, loss_scale;
    int pad;
} PSAMessage;

// The server's answer (R = sizeof bytes), then the parameters
typedef struct {
    int version;       // updates applied
    int step;          // AdamW's t on the server (updates not skipped)
    float norm;        // the gradient norm of the last update
    int pad;
} PSAReply;

// One update the server applied: which gradients, how stale, when (for --ps-log and the summary)
typedef struct {
    double seconds;              // since the server started
    float norm;
    std::vector<int> workers;    // in the order they were summed
    std::vector<int> clocks;     // each gradient's clock (its worker's step)
    std::vector<int> staleness;  // version at apply - version computed on
} PSAUpdate;

// A segment of the server's flat buffers with what the update needs to know about its tensor
// (read at init: the server thread never touches the model, which the trainer frees first)
typedef struct {
    OptSegment s;
    int counted, decay;
} PSASegment;

struct PSAsync {
    int async;                 // 1: --ps-async; 0: SSP with bound S
    int S;
    int N;
    MPI_Comm mpi;              // our own communicator over the dp group
    // the worker (every rank, main thread)
    int clock;                 // steps pushed
    int version;               // the version of the parameters this worker holds
    int pushed_since_barrier;  // 1: the parameters may differ between workers
    int barriers_sent;
    int loss_clock;            // the last step whose loss is not sent yet (-1: none)
    float loss;
    floatX* stage;             // CUDA: the host copy a message goes through (NULL on the CPU backend)
    // the server (rank 0, its own thread)
    std::thread thread;
    floatX *params, *grad;     // its parameters; the gradient an update applies (SSP: the sum)
    float *m, *v, *master;
    float* norm_scratch;
    std::vector<PSASegment> segments;
    std::vector<floatX*> slots;            // SSP: push of worker w of clock c at [(c % (S+1)) * N + w]
    std::vector<PSAMessage> slot_msg;      //   its request
    std::vector<int> slot_clock;           //   the clock it holds (-1: free)
    int sversion, sstep;                   // updates applied, AdamW steps taken
    float last_norm;
    floatX* sstage;                        // CUDA: host copies of what the server receives and sends
    floatX* pstage;
    int pstage_version;                    //   the version pstage holds (-1: none)
    uint64_t server_bytes;                 // sent by the server (to ranks 1 .. N-1)
    long answers_remote;                   // its answers to ranks 1 .. N-1
    int barriers;                          // barriers completed (every answer sent and counted)
    int held;                              // --straggler hold:RANK: served only when no other worker can move (-1: none)
    std::vector<int> bound_waits;          // per worker: its pushes the bound held back (not answered on arrival)
    int max_ahead;                         // the most steps a worker was let go on ahead of the slowest
    double t0;
    // records (the server writes them; the main thread reads them once the server is idle)
    std::mutex mu;
    std::condition_variable barrier_done;     // the server counted a barrier's answers (ps_async_summary waits on it)
    std::vector<PSAUpdate> updates;
    std::vector<std::vector<float>> losses;   // [worker][clock]
    std::vector<int> pushes;
    std::vector<double> first_push, last_push;
};

// The build without MPI (llmc/comm/mpi_single.h) never runs this mode: plan_init refuses
// --dp-mode ps there. Two stand-ins let it compile.
#ifndef USE_MPI
#define MPI_ANY_SOURCE (-1)
static inline int MPI_Test(MPI_Request*, int* flag, MPI_Status*) { *flag = 1; return MPI_SUCCESS; }
static inline int MPI_Iprobe(int, int, MPI_Comm, int* flag, MPI_Status*) { *flag = 0; return MPI_SUCCESS; }
#endif

#ifdef LLMC_CPU
static const int PSA_STAGED = 0;   // the CPU backend's buffers are host memory: MPI reads and writes them
#else
static const int PSA_STAGED = 1;   // device buffers go through a host copy (MPI here is not CUDA-aware)
#endif

// ---------------------------------------------------------------------------------------
// Transport: blocking sends, and receives that poll (MPI_Test, then a 50 us sleep) instead of
// spinning, so that a worker held back by the staleness bound, or the idle server, leaves the
// core to the ranks that compute. Bytes to another rank are added to *counter.

static inline int psa_count(size_t bytes) {
    if (bytes > (size_t)INT32_MAX) { die("--ps-async/--staleness: a message of %zu bytes is over MPI's int count (a smaller model)", bytes); }
    return (int)bytes;
}
static inline void psa_send(const PSAsync* a, const void* buf, size_t bytes, int dst, int tag, uint64_t* counter, int me) {
    MPI_Send(buf, psa_count(bytes), MPI_BYTE, dst, tag, a->mpi);
    if (dst != me) { *counter += bytes; }
}
static inline void psa_wait(MPI_Request* req, MPI_Status* st) {
    for (;;) {
        int flag = 0;
        MPI_Test(req, &flag, st);
        if (flag) { return; }
        usleep(50);
    }
}
static inline void psa_recv_poll(const PSAsync* a, void* buf, size_t bytes, int src, int tag, MPI_Status* st) {
    MPI_Request req;
    MPI_Irecv(buf, psa_count(bytes), MPI_BYTE, src, tag, a->mpi, &req);
    psa_wait(&req, st);
}
// The next request to the server, from any rank but `skip` (-1: from any, in the order they
// come). A rank's requests stay queued in MPI until received, so skipping one is to probe the
// others (MPI_Iprobe, each in turn) and receive from the first that has one.
static inline void psa_recv_request(const PSAsync* a, PSAMessage* h, int skip, MPI_Status* st) {
    if (skip < 0) { psa_recv_poll(a, h, sizeof(*h), MPI_ANY_SOURCE, PSA_TAG_REQUEST, st); return; }
    for (;;) {
        for (int w = 0; w < a->N; w++) {
            int flag = 0;
            if (w != skip) { MPI_Iprobe(w, PSA_TAG_REQUEST, a->mpi, &flag, MPI_STATUS_IGNORE); }
            if (flag) {
                MPI_Recv(h, (int)sizeof(*h), MPI_BYTE, w, PSA_TAG_REQUEST, a->mpi, st);
                return;
            }
        }
        usleep(50);
    }
}
// a device buffer of n floatX: straight from/to it on the CPU backend, through stage on CUDA
static inline void psa_send_dev(const PSAsync* a, const floatX* dev, size_t n, floatX* stage, int dst, int tag,
                                uint64_t* counter, int me) {
    const void* p = dev;
    if (PSA_STAGED) { copy_device_to_host(stage, dev, n * sizeof(floatX)); p = stage; }
    psa_send(a, p, n * sizeof(floatX), dst, tag, counter, me);
}
static inline void psa_recv_dev(const PSAsync* a, floatX* dev, size_t n, floatX* stage, int src, int tag) {
    MPI_Recv(PSA_STAGED ? (void*)stage : (void*)dev, psa_count(n * sizeof(floatX)), MPI_BYTE, src, tag, a->mpi,
             MPI_STATUS_IGNORE);
    if (PSA_STAGED) { copy_host_to_device(dev, stage, n * sizeof(floatX)); }
}
