// Asynchronous and stale synchronous parameter server (--dp-mode ps --ps-async | --staleness S).
// The synchronous server (dp_ps.h) waits, every step, for the slowest worker: the barrier.
// Here rank 0 runs the server on a THREAD of its own; every rank (rank 0's main thread too) is a
// worker that pushes its gradient and pulls parameters when it is done, without a barrier:
//
//   synchronous (S = 0)            SSP (S = 1)                       asynchronous
//   w0 [ F+B ]....[ F+B ]....      w0 [ F+B ][ F+B ]..[ F+B ]        w0 [ F+B ][ F+B ][ F+B ][ F+B ]
//   w1 [ F+B zzzzz][ F+B zzzzz]    w1 [ F+B zzzzz][ F+B zzzzz]       w1 [ F+B zzzzz][ F+B zzzzz]
//   server        ^ clock 0   ^    server        ^ clock 0  ^ 1      server   ^    ^^   ^    ^   ^
//   (zzz: the straggler; ....: waiting for the others' pushes; ^: an update of the parameters)
//
// The rules. A worker's c-th push (its clock c, from 0) carries its gradient g and the version v
// of the parameters g was computed on (version = number of updates the server has applied).
//   SSP:   the server keeps every push of a clock; when all N pushes of the oldest open clock o
//          are in, it sums them in the synchronous server's order (rank 0's first, then += from
//          ranks N-1, N-2, ..., 1, then / N: llmc/comm/ps.h's ps_push), clips and runs AdamW as
//          dp_update_owned does (same kernels, same per-tensor seeds, its own step counter t):
//          version o + 1. The worker then waits for parameters of a version >= c + 1 - S, so
//          it is never more than S clocks ahead of the slowest, and the gradient of clock c is
//          applied at version c having been computed on v >= c - S: staleness c - v <= S.
//          S = 0 waits for version c + 1: the synchronous parameter server, bit for bit.
//   async: the server applies each push as it arrives (one AdamW step with that gradient and
//          that worker's lr) and answers with the parameters it now has; staleness = the
//          server's version when it applies g - v, unbounded.
//
// Cost (t_w: worker w's compute per step, t_u: one update on the server, t_c: a push + pull):
//   synchronous  step = max_w t_w + t_c + t_u: every step waits for the slowest worker
//   SSP          a worker waits only when it is S clocks ahead of the slowest: a delay shorter
//                than S steps' slack is hidden, a persistent straggler still sets the pace
//                (N steps of every worker per clock), only the overlap of its slow step with
//                the others' next S steps is gained
//   async        worker w runs at 1 / (t_w + t_c + t_u); the server applies N updates per
//                step-time and becomes the bottleneck when N t_u approaches t_w
// Bytes, a per element (counted on the wire: rank 0's worker talks to its own server thread
// through memory, not counted, as the synchronous server's own slice):
//   worker (rank != 0) per step   H + a Psi (push: a request of H bytes, then the gradient)
//   server per answer             R + a Psi (to ranks 1 .. N-1: one answer per push and barrier)
// Memory: every worker holds the model (parameters, gradients: a Psi each); the server (rank 0)
// also its own parameters and gradient sum (a Psi each), AdamW's m and v (8 Psi), the fp32 master
// weights where the backend keeps them (4 Psi), and for SSP the pushes of up to S + 1 open
// clocks, (S + 1) N a Psi: a worker can push clock c only once clock c - S - 1 is applied.
//
// Messages go over a communicator of our own (MPI_Comm_dup of the dp group), from the worker
// (main thread) and the server (rank 0's second thread) at once: MPI_THREAD_MULTIPLE (plan_init
// asks for it). The Comm objects are not used here: they are not thread-safe.
//
// The trainer computes a step's mean loss (plan_mean) only after the update, so a worker's loss
// for clock c travels with its next message (the next push, the final barrier or its goodbye);
// the server's log (--ps-log) is written at the end, once every loss is in.
//
// A straggler without a clock: --straggler hold:RANK (llmc/train/straggler.h). A sleeping straggler
// (RANK:MS) is slow in wall time, so what it does to the schedule depends on the machine's load.
// The held rank is slow in ORDER instead: the server takes its request only when no other
// worker can move, i.e. every other worker waits for an answer (a push the bound holds back, the
// barrier) or has said goodbye (psa_hold_back). That is the worst schedule the rules allow, and
// it is reached on every run:
//   SSP, S    the others push clocks 0 .. S at once, then wait for the held rank at every clock:
//             each of their gradients from clock S on is exactly S stale, and none of them is
//             ever more than S steps ahead of it (the straggler sets the pace)
//   async     nothing waits for the held rank: the others do all their steps before the server
//             takes its first push, which is then (N - 1) x steps updates stale
//   S = 0     the synchronous server, bit for bit, whoever comes last
// The server counts, whatever the straggler, how often the bound held a push back (per worker)
// and how far a worker went on ahead of the slowest: the summary prints them; the test reads
// them and --ps-log, not times.
#pragma once

#include <atomic>
#include <map>
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
    int barriers;                          // barriers completed
    int held;                              // --straggler hold:RANK: served only when no other worker can move (-1: none)
    std::vector<int> bound_waits;          // per worker: its pushes the bound held back (not answered on arrival)
    int max_ahead;                         // the most steps a worker was let go on ahead of the slowest
    double t0;
    // records (the server writes them; the main thread reads them once the server is idle)
    std::mutex mu;
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

// ---------------------------------------------------------------------------------------
// The server

// --straggler hold:RANK: must the held rank's requests wait? Yes while some other worker can still
// move: it has no request waiting here (a push the bound holds back, the barrier) and has not
// said goodbye. Every other worker then sends its next request before the held one is taken.
// (No deadlock: in this mode the workers meet nowhere else between two requests, plan_mean
// returns a worker's own loss, so a worker that cannot move is always waiting here.)
static inline int psa_hold_back(const PSAsync* a, const std::vector<PSAMessage>& waiting, const std::vector<char>& gone) {
    if (a->held < 0) { return 0; }
    std::vector<char> stuck(gone);
    for (const PSAMessage& m : waiting) { stuck[m.worker] = 1; }
    for (int w = 0; w < a->N; w++) {
        if (w != a->held && !stuck[w]) { return 1; }
    }
    return 0;
}

// The answer to worker w's push lets it go on to its next step: how far ahead of the slowest
// worker (steps pushed) is it then? SSP answers only once the slowest is at most S behind.
static inline void psa_note_ahead(PSAsync* a, int w) {
    int slowest = *std::min_element(a->pushes.begin(), a->pushes.end());
    a->max_ahead = std::max(a->max_ahead, a->pushes[w] - slowest);
}

// The parameters to worker w (the answer to its push or barrier)
static inline void psa_answer(DataParallel* dp, int w) {
    PSAsync* a = dp->async;
    PSAReply r = {a->sversion, a->sstep, a->last_norm, 0};
    psa_send(a, &r, sizeof(r), w, PSA_TAG_REPLY, &a->server_bytes, 0);
    if (PSA_STAGED && a->pstage_version != a->sversion) {   // one host copy per version, for every answer
        copy_device_to_host(a->pstage, a->params, dp->psi * sizeof(floatX));
        a->pstage_version = a->sversion;
    }
    psa_send(a, PSA_STAGED ? (const void*)a->pstage : (const void*)a->params, dp->psi * sizeof(floatX), w, PSA_TAG_PARAMS,
             &a->server_bytes, 0);
    if (w != 0) { a->answers_remote++; }
}

// Norm, clipping, AdamW on the server's buffers: dp_update_owned's arithmetic (the norm summed
// per segment in double, the same kernels, seed step * 1000003 + tensor) with the server's t.
static inline float psa_apply(PSAsync* a, const PSAMessage* h) {
    double sq = 0.0;
    for (const PSASegment& g : a->segments) {
        if (!g.counted) { continue; }
        float part;
        global_norm_squared(a->norm_scratch, g.s.grad, g.s.n);
        copy_device_to_host(&part, a->norm_scratch, sizeof(float));
        sq += part;
    }
    float norm = (float)sqrt(sq) / h->loss_scale;
    if (!isfinite(norm)) {   // every worker would have to stop at the same step: without a barrier they cannot
        die("--ps-async/--staleness: update %d of the server: gradient norm %f: training diverged (try a lower --lr; "
            "--on-nan skip is not built for the asynchronous server)", a->sversion + 1, norm);
    }
    float grad_scale = ((h->grad_clip > 0.0f && norm > h->grad_clip) ? h->grad_clip / norm : 1.0f) / h->loss_scale;
    a->sstep += 1;
    for (const PSASegment& g : a->segments) {
        const OptSegment& s = g.s;
        adamw_update(s.param, s.master, s.grad, s.m, s.v, s.n, h->lr, h->beta1, h->beta2, h->eps,
                     g.decay ? h->weight_decay : 0.0f, a->sstep, grad_scale, (unsigned int)(a->sstep * 1000003u + s.tensor));
    }
    return norm;
}

static inline void psa_record(PSAsync* a, float norm, const std::vector<int>& workers, const std::vector<int>& clocks,
                              const std::vector<int>& staleness) {
    std::lock_guard<std::mutex> lock(a->mu);
    a->updates.push_back({wall_seconds() - a->t0, norm, workers, clocks, staleness});
}

// SSP: apply the oldest open clock if all N pushes are in. Returns 1 when it did.
static inline int psa_try_clock(DataParallel* dp) {
    PSAsync* a = dp->async;
    int o = a->sversion, k = (o % (a->S + 1)) * a->N, N = a->N;
    for (int w = 0; w < N; w++) {
        if (a->slot_clock[k + w] != o) { return 0; }
    }
    // the synchronous server's sum (llmc/comm/ps.h ps_push on server 0): its own gradient,
    // then += from ranks N-1, N-2, ..., 1, then the average
    std::vector<int> workers, clocks, staleness;
    comm_copy(a->grad, a->slots[k], dp->psi, COMM_FLOATX);
    workers.push_back(0);
    for (int w = N - 1; w >= 1; w--) {
        comm_reduce_local(a->grad, a->slots[k + w], dp->psi, COMM_FLOATX, COMM_AVG);
        workers.push_back(w);
    }
    comm_avg_finish(a->grad, dp->psi, COMM_FLOATX, COMM_AVG, N);
    for (int w : workers) {
        clocks.push_back(o);
        staleness.push_back(o - a->slot_msg[k + w].version);
    }
    a->last_norm = psa_apply(a, &a->slot_msg[k]);   // lr and the rest: rank 0's request (every worker's is the same)
    a->sversion += 1;
    for (int w = 0; w < N; w++) { a->slot_clock[k + w] = -1; }
    psa_record(a, a->last_norm, workers, clocks, staleness);
    return 1;
}

static inline void psa_server_main(DataParallel* dp) {
    PSAsync* a = dp->async;
#ifdef _OPENMP
    omp_set_num_threads(dp->threads);   // the kernels' OpenMP team: the trainer's --threads
#endif
    comm_bind_thread(dp->comm);         // CUDA: this thread on the rank's GPU
    int N = a->N, done = 0;
    std::vector<PSAMessage> waiting;    // requests not answered yet
    std::vector<char> gone(N, 0);       // the workers that said goodbye
    int at_barrier = 0;
    while (done < N) {
        PSAMessage h;
        MPI_Status st;
        psa_recv_request(a, &h, psa_hold_back(a, waiting, gone) ? a->held : -1, &st);
        int w = st.MPI_SOURCE;
        if (h.worker != w || h.kind < PSA_PUSH || h.kind > PSA_DONE) {
            die("--ps-async/--staleness: the server got a malformed request from rank %d (kind %d, worker %d)", w, h.kind, h.worker);
        }
        if (h.loss_clock >= 0) {
            std::lock_guard<std::mutex> lock(a->mu);
            if ((int)a->losses[w].size() <= h.loss_clock) { a->losses[w].resize(h.loss_clock + 1, NAN); }
            a->losses[w][h.loss_clock] = h.loss;
        }
        if (h.kind == PSA_DONE) { done++; gone[w] = 1; continue; }
        if (h.kind == PSA_BARRIER) {
            waiting.push_back(h);
            at_barrier++;
        } else {   // a push: its gradient follows at once
            {
                std::lock_guard<std::mutex> lock(a->mu);
                double now = wall_seconds() - a->t0;
                if (a->pushes[w] == 0) { a->first_push[w] = now; }
                a->pushes[w]++;
                a->last_push[w] = now;
            }
            if (a->async) {
                psa_recv_dev(a, a->grad, dp->psi, a->sstage, w, PSA_TAG_GRAD);
                int stale = a->sversion - h.version;
                a->last_norm = psa_apply(a, &h);
                a->sversion += 1;
                psa_record(a, a->last_norm, {w}, {h.clock}, {stale});
                psa_note_ahead(a, w);
                psa_answer(dp, w);   // the current parameters, this push's update included
                continue;
            }
            int k = (h.clock % (a->S + 1)) * N + w;
            if (h.clock < a->sversion || h.clock > a->sversion + a->S || a->slot_clock[k] != -1) {
                die("--staleness %d: rank %d pushed clock %d while the server is at clock %d (the bound is broken)", a->S, w,
                    h.clock, a->sversion);
            }
            psa_recv_dev(a, a->slots[k], dp->psi, a->sstage, w, PSA_TAG_GRAD);
            a->slot_msg[k] = h;
            a->slot_clock[k] = h.clock;
            waiting.push_back(h);
            while (psa_try_clock(dp)) {}
            if (h.want > a->sversion) { a->bound_waits[w]++; }   // the bound holds it back: the others must push first
        }
        // answer the pushes whose wanted version is there; the barrier once every worker is at it
        // (then no push can be in flight: all parameters are final until the answers go out)
        for (size_t i = 0; i < waiting.size();) {
            if (waiting[i].kind == PSA_PUSH && waiting[i].want <= a->sversion) {
                psa_note_ahead(a, waiting[i].worker);
                psa_answer(dp, waiting[i].worker);
                waiting.erase(waiting.begin() + (long)i);
            } else {
                i++;
            }
        }
        if (at_barrier == N) {
            if ((int)waiting.size() != N) { die("--ps-async/--staleness: the barrier met %zu requests, want %d", waiting.size(), N); }
            for (const PSAMessage& b : waiting) {
                if (!a->async && b.clock != a->sversion) {
                    die("--staleness: at the barrier rank %d has pushed %d steps, the server applied %d clocks", b.worker, b.clock,
                        a->sversion);
                }
                psa_answer(dp, b.worker);
            }
            waiting.clear();
            at_barrier = 0;
            a->barriers++;
        }
    }
    if (!waiting.empty()) { die("--ps-async/--staleness: the server stopped with %zu requests unanswered", waiting.size()); }
}

// ---------------------------------------------------------------------------------------
// The worker

static inline void psa_request(DataParallel* dp, int kind, int want, float lr, float beta1, float beta2, float eps,
                               float weight_decay, float grad_clip, float loss_scale) {
    PSAsync* a = dp->async;
    PSAMessage h = {kind, dp->rank, a->clock, a->version, want, a->loss_clock, a->loss, lr, beta1, beta2, eps,
                    weight_decay, grad_clip, loss_scale, 0};
    psa_send(a, &h, sizeof(h), 0, PSA_TAG_REQUEST, &dp->comm->bytes_sent, dp->rank);
    a->loss_clock = -1;
}
// the server's answer: the parameters of some version, into the model
static inline PSAReply psa_pull(DataParallel* dp) {
    PSAsync* a = dp->async;
    PSAReply r;
    psa_recv_poll(a, &r, sizeof(r), 0, PSA_TAG_REPLY, MPI_STATUS_IGNORE);
    psa_recv_dev(a, dp->model->params_memory, dp->psi, a->stage, 0, PSA_TAG_PARAMS);
    a->version = r.version;
    dp->model->step = r.step;
    return r;
}

// The mode's update: push the gradient, pull parameters of the version the bound allows
static inline float psa_update(DataParallel* dp, float lr, float beta1, float beta2, float eps, float weight_decay,
                               float grad_clip) {
    PSAsync* a = dp->async;
    double t0 = trace_now();
    int want = a->async ? 0 : a->clock + 1 - a->S;
    psa_request(dp, PSA_PUSH, want, lr, beta1, beta2, eps, weight_decay, grad_clip, dp->model->loss_scale);
    psa_send_dev(a, dp->model->grads_memory, dp->psi, a->stage, 0, PSA_TAG_GRAD, &dp->comm->bytes_sent, dp->rank);
    trace_event("push gradients", 0, t0);
    a->clock++;
    a->pushed_since_barrier = 1;
    double t1 = trace_now();
    PSAReply r = psa_pull(dp);
    trace_event(a->async ? "pull parameters" : "pull parameters (staleness bound)", 0, t1);
    double dt = trace_now() - t0;
    dp->comm_seconds += dt;
    dp->exposed_seconds += dt;   // the worker waits for it: nothing overlaps
    return r.norm;
}

// Every worker at the same version (evaluation, samples, checkpoints, the summary): each sends a
// barrier request; the server answers all of them once all N are in, so every worker then holds
// the same parameters, every update applied. Nothing to do when nothing was pushed since the last.
static inline void psa_barrier(DataParallel* dp) {
    PSAsync* a = dp->async;
    if (!a->pushed_since_barrier) { return; }
    psa_request(dp, PSA_BARRIER, -1, 0, 0, 0, 0, 0, 0, 1.0f);
    a->barriers_sent++;
    psa_pull(dp);
    a->pushed_since_barrier = 0;
}

// ---------------------------------------------------------------------------------------
// The mode's table

// From dp_init (the flags): nothing without --ps-async or --staleness
static inline void ps_async_create(DataParallel* dp, int async, int staleness, int held) {
    if (!async && staleness < 0) { return; }
    PSAsync* a = new PSAsync();
    a->async = async;
    a->S = async ? 0 : staleness;
    a->held = held;   // --straggler hold:RANK (-1: none)
    dp->async = a;
}

static inline float* psa_state(DataParallel* dp, int cat, size_t n) {
    float* p = (float*)dp_alloc(dp, cat, n * sizeof(float));
    device_memset_zero(p, n * sizeof(float));
    return p;
}

// Collective over the dp group: the communicator, the buffers, and on rank 0 the server thread
static inline void ps_async_init(DataParallel* dp) {
    PSAsync* a = dp->async;
    GPT2* m = dp->model;
    size_t psi = dp->psi, xb = psi * sizeof(floatX);
    a->N = dp->N;
    MPI_Comm_dup(dp->comm->mpi, &a->mpi);
    a->clock = a->version = 0;
    a->pushed_since_barrier = 0;
    a->barriers_sent = 0;
    a->loss_clock = -1;
    a->loss = 0.0f;
    a->stage = PSA_STAGED ? (floatX*)malloc(xb) : NULL;
    a->params = a->grad = NULL;
    a->m = a->v = a->master = NULL;
    a->norm_scratch = NULL;
    a->sstage = a->pstage = NULL;
    a->pstage_version = -1;
    a->sversion = a->sstep = 0;
    a->last_norm = 0.0f;
    a->server_bytes = 0;
    a->answers_remote = 0;
    a->barriers = 0;
    if (dp->rank == 0) {
        // the server's parameters start as rank 0's (every rank initialised the same model)
        a->params = (floatX*)dp_alloc(dp, MEM_PARAMS, xb);
        copy_device_to_device(a->params, m->params_memory, xb);
        a->grad = (floatX*)dp_alloc(dp, MEM_GRADS, xb);
        a->m = psa_state(dp, MEM_OPTIM, psi);
        a->v = psa_state(dp, MEM_OPTIM, psi);
        if (dp_has_master(dp)) {
            a->master = psa_state(dp, MEM_MASTER, psi);
            convert_floatX_to_float(a->master, a->params, psi);
        }
        a->norm_scratch = (float*)device_malloc(sizeof(float));
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            const ParamInfo* p = &m->param_info[i];
            if (p->numel == 0 || p->offset >= psi) { continue; }
            size_t s = p->offset, n = std::min(p->numel, psi - s);
            a->segments.push_back({{i, a->params + s, a->grad + s, a->m + s, a->v + s, a->master ? a->master + s : NULL, n, s},
                                   dp_segment_counted(m, i), p->decay});
        }
        int nslots = a->async ? 0 : (a->S + 1) * a->N;
        for (int k = 0; k < nslots; k++) { a->slots.push_back((floatX*)dp_alloc(dp, MEM_GRADS, xb)); }
        a->slot_msg.assign(nslots, PSAMessage{});
        a->slot_clock.assign(nslots, -1);
        if (PSA_STAGED) { a->sstage = (floatX*)malloc(xb); a->pstage = (floatX*)malloc(xb); }
        a->losses.assign(a->N, std::vector<float>());
        a->pushes.assign(a->N, 0);
        a->first_push.assign(a->N, 0.0);
        a->last_push.assign(a->N, 0.0);
        a->bound_waits.assign(a->N, 0);
        a->max_ahead = 0;
    }
    MPI_Barrier(a->mpi);   // every worker has its communicator before the first request
    a->t0 = wall_seconds();
    if (dp->rank == 0) { a->thread = std::thread(psa_server_main, dp); }
    dp_install_hooks(dp, a->async ? "data parallel: asynchronous parameter server" : "data parallel: stale synchronous parameter server",
                     GPT2Hooks{});
}

static inline void ps_async_zero_grad(DataParallel* dp) { gpt2_zero_grad(dp->model); }
static inline void ps_async_full_model_begin(DataParallel* dp) { psa_barrier(dp); }

// plan_mean's loss of the step just done (the worker's own): it goes with the next request
static inline float ps_async_note_loss(DataParallel* dp, float loss) {
    dp->async->loss_clock = dp->async->clock - 1;
    dp->async->loss = loss;
    return loss;
}

static inline uint64_t ps_async_formula_bytes(const DataParallel* dp, int micro) {
    (void)micro;
    return dp->rank == 0 ? 0 : sizeof(PSAMessage) + dp->psi * sizeof(floatX);
}
static inline void ps_async_formula_memory(const DataParallel* dp, size_t out[MEM_NCAT]) {
    const PSAsync* a = dp->async;
    size_t xb = sizeof(floatX) * dp->psi, server = dp->rank == 0 ? 1 : 0;
    size_t slots = a->async ? 0 : (size_t)(a->S + 1) * dp->N;
    dp_formula_rows(dp, out, (1 + server) * xb, (1 + server * (1 + slots)) * xb, server * dp->psi);
}

// ---------------------------------------------------------------------------------------
// The end: the summary (rank 0 prints), the server's log, the shutdown

static inline void psa_write_log(const PSAsync* a, const char* path) {
    std::string tmp;
    FILE* f = fopen_tmp_for_write(path, &tmp);
    fprintf(f, "# update seconds steps loss norm workers clocks staleness (%s, %d workers; steps = %s)\n",
            a->async ? "asynchronous" : "stale synchronous", a->N, a->async ? "updates / N" : "updates");
    for (size_t u = 0; u < a->updates.size(); u++) {
        const PSAUpdate& r = a->updates[u];
        double sum = 0.0;   // the mean of the applied gradients' losses, as plan_mean takes it (a double sum / N)
        std::string ws, cs, ss;
        for (size_t i = 0; i < r.workers.size(); i++) {
            int w = r.workers[i], c = r.clocks[i];
            sum += (size_t)c < a->losses[w].size() ? a->losses[w][c] : NAN;
            ws += (i ? "," : "") + std::to_string(w);
            cs += (i ? "," : "") + std::to_string(c);
            ss += (i ? "," : "") + std::to_string(r.staleness[i]);
        }
        float loss = (float)(sum / (double)r.workers.size());
        double steps = a->async ? (double)(u + 1) / a->N : (double)(u + 1);
        fprintf(f, "%zu %.6f %.6g %.9g %.9g %s %s %s\n", u + 1, r.seconds, steps, loss, r.norm, ws.c_str(), cs.c_str(),
                ss.c_str());
    }
    fclose_and_rename(f, tmp, path);
}

// After the last step, on every rank (plan_print_summary): the barrier (every update applied,
// every loss in), then rank 0 prints each worker's step rate, the staleness histogram and the
// server's bytes, and writes --ps-log.
static inline void ps_async_summary(DataParallel* dp, const char* log_path) {
    PSAsync* a = dp->async;
    psa_barrier(dp);
    // what each worker sent in all (its requests: the pushes' H + a Psi, the barriers' H), on rank 0
    uint64_t mine[2] = {dp->comm->bytes_sent, dp->rank == 0 ? 0 : (uint64_t)a->clock * (sizeof(PSAMessage) + dp->psi * sizeof(floatX))
                                                                   + (uint64_t)a->barriers_sent * sizeof(PSAMessage)};
    std::vector<uint64_t> all(2 * (size_t)dp->N);
    MPI_Gather(mine, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, 0, dp->comm->mpi);
    if (dp->rank != 0) { return; }
    std::lock_guard<std::mutex> lock(a->mu);   // the server is idle now: every worker waits in the trainer
    printf("%s server: %zu updates in %.2f s, %d barrier(s)\n", a->async ? "asynchronous" : "stale synchronous",
           a->updates.size(), a->updates.empty() ? 0.0 : a->updates.back().seconds, a->barriers);
    for (int w = 0; w < a->N; w++) {
        double span = a->last_push[w] - a->first_push[w];
        printf("  worker %d   %d steps, %.2f steps/s (%.1f ms a step, between its first and last push), held back by the bound "
               "%d times%s\n", w, a->pushes[w], span > 0 ? (a->pushes[w] - 1) / span : 0.0,
               a->pushes[w] > 1 ? 1e3 * span / (a->pushes[w] - 1) : 0.0, a->bound_waits[w],
               w == a->held ? " (the held straggler: served last)" : "");
    }
    char bound[32] = "no bound";
    if (!a->async) { snprintf(bound, sizeof(bound), "SSP: at most S = %d", a->S); }
    printf("  ahead      a worker went on at most %d step(s) ahead of the slowest (steps pushed, when the server let it go on; %s)\n",
           a->max_ahead, bound);
    std::map<int, long> hist;
    long total = 0;
    int worst = 0;
    for (const PSAUpdate& r : a->updates) {
        for (int s : r.staleness) { hist[s]++; total++; worst = std::max(worst, s); }
    }
    printf("  staleness  of %ld gradients (updates applied between the version computed on and the apply):", total);
    for (auto& e : hist) { printf(" %d: %ld", e.first, e.second); }
    printf(" | max %d%s\n", worst, a->async ? "" : (worst <= a->S ? " <= S, the bound holds" : " > S: THE BOUND IS BROKEN"));
    uint64_t want = (uint64_t)a->answers_remote * (sizeof(PSAReply) + dp->psi * sizeof(floatX));
    printf("  server     sent %.3f MiB to workers 1..%d (formula %ld answers x (R + a Psi) = %.3f MiB, %s)\n",
           a->server_bytes / 1048576.0, a->N - 1, a->answers_remote, want / 1048576.0, want == a->server_bytes ? "equal" : "DIFFERENT");
    int workers_ok = 1;
    uint64_t sent = 0;
    for (int w = 0; w < a->N; w++) { workers_ok &= all[2 * w] == all[2 * w + 1]; sent += all[2 * w]; }
    printf("  workers    sent %.3f MiB in all (formula per worker: steps x (H + a Psi) + barriers x H, H = %zu bytes: %s on all %d)\n",
           sent / 1048576.0, sizeof(PSAMessage), workers_ok ? "equal" : "DIFFERENT", a->N);
    if (log_path) {
        psa_write_log(a, log_path);
        printf("  log        %s (%zu updates)\n", log_path, a->updates.size());
    }
}

// dp_shutdown: every worker says goodbye (with its last loss), the server thread ends once all
// have, the buffers go. (After gpt2_free: nothing here reads the model.)
static inline void ps_async_free(DataParallel* dp) {
    PSAsync* a = dp->async;
    if (!a) { return; }
    psa_request(dp, PSA_DONE, -1, 0, 0, 0, 0, 0, 0, 1.0f);
    if (dp->rank == 0) {
        a->thread.join();
        dp_free(dp, MEM_PARAMS, a->params, dp->psi * sizeof(floatX));
        dp_free(dp, MEM_GRADS, a->grad, dp->psi * sizeof(floatX));
        for (floatX* s : a->slots) { dp_free(dp, MEM_GRADS, s, dp->psi * sizeof(floatX)); }
        dp_free(dp, MEM_OPTIM, a->m, dp->psi * sizeof(float));
        dp_free(dp, MEM_OPTIM, a->v, dp->psi * sizeof(float));
        dp_free(dp, MEM_MASTER, a->master, dp->psi * sizeof(float));
        device_free(a->norm_scratch);
        free(a->sstage);
        free(a->pstage);
    }
    free(a->stage);
    MPI_Comm_free(&a->mpi);
    delete a;
    dp->async = NULL;
}

static const DPModeOps DP_MODE_PS_ASYNC = {
    "asynchronous / stale synchronous parameter server", "ps", 0,    // name, --dp-mode, --zero
    0, 1, "; parameter server push/pull without a barrier, server on a thread of rank 0 (ours: counted)",
    ps_async_init, ps_async_zero_grad, psa_update,
    NULL,                                          // bucket_ready: no buckets
    ps_async_full_model_begin, NULL,               // the barrier before evaluation, samples, saves
    ps_async_formula_bytes, ps_async_formula_memory,
    0,                    // owners_disjoint: the workers own nothing (the server's state is its own)
};
