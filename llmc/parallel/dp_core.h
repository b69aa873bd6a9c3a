// What every data-parallel mode shares: its state (DataParallel), the memory accounting, the
// communication thread, and the wrappers around the collectives. The modes themselves are
// tables of functions (DPModeOps, dp_mode.h); the gradient buckets are in bucket_layout.h.
//
// The communication thread plays the role of a CUDA communication stream: the compute thread
// enqueues a collective as soon as its bucket is ready and goes on with the backward; the
// thread runs the collectives one after another; dp_wait blocks only when a result is needed.
// Time spent blocked in dp_wait is the "exposed" communication time.
// MPI is called from this thread only (plus the compute thread while the queue is idle), which
// MPI_THREAD_SERIALIZED allows.
// Order on the GPU, without stopping either thread: dp_enqueue records an event on the compute
// stream after the kernels that wrote the task's inputs, and the thread makes the
// communicator's stream wait for it (comm_wait_event) before it runs the task; each collective
// returns with its stream synchronised, so a completed ticket means the results are in place.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>
#include "../model/gpt2.h"
#include "../trace.h"
#include "../comm/native.h"
#include "../comm/ring.h"
#include "../comm/auto.h"
#include "mesh.h"

// memory categories of the table printed at start
enum { MEM_PARAMS, MEM_GRADS, MEM_MASTER, MEM_OPTIM, MEM_ACTS, MEM_COMM, MEM_NCAT };
static const char* MEM_NAMES[MEM_NCAT] = {"parameters", "gradients", "master weights", "optimizer m, v",
                                          "activations", "comm buffers"};

typedef struct {
    int tensor;      // index into the parameter table
    size_t flat;     // element offset in the table-ordered flat buffer
    size_t count;
    size_t packed;   // element offset inside its bucket
} Slice;

typedef struct {
    std::vector<Slice> slices;
    std::vector<int> units;       // in ready order
    size_t count;                 // real elements
    size_t padded;                // count rounded up to a multiple of N
    size_t shard;                 // padded / N: the block this rank owns starts at rank * shard
    floatX* grad;                 // packed gradients of the whole bucket (NULL while not alive)
    floatX* grad_shard;           // ZeRO-2/3: this rank's block of the averaged gradients
    floatX* param_full;           // packed parameters of the whole bucket (all-gather target)
    floatX* param_shard;          // ZeRO-3: this rank's block of the parameters
    float *m, *v, *master;        // optimizer state of the owned range (host memory with --offload)
    int pending;                  // units whose backward has not finished yet
    long reduce_ticket, gather_ticket;
} Bucket;

// one contiguous run of parameters this rank updates, all inside one tensor
typedef struct {
    int tensor;
    floatX* param;
    floatX* grad;
    float *m, *v, *master;
    size_t n;
    size_t flat;    // where the run starts in the model's flat buffer (the training state maps it to the full model)
} OptSegment;

// The ranks that hold the other shards of this rank's replica (tensor parallelism's tp group:
// llmc/parallel/tp.h). The update needs them twice: the gradient norm is a sum over the whole
// model, so the squared norms of the shards are summed over the group (replicated tensors
// counted once, from tp rank 0); and a gradient that is a partial sum over the group
// (sequence parallelism's layernorms) is completed before the norm and AdamW. NULL functions:
// no such group (a rank holds the whole model).
typedef struct {
    void* ctx;
    void (*complete_grads)(void* ctx, int tensor, floatX* grad, size_t n);   // make [grad, grad + n) whole
    double (*sum_norm)(void* ctx, double sq);                                // sum over the group
} ShardGroup;

// Tensors another group owns: expert parallelism (llmc/parallel/ep.h) keeps E/ep experts per
// rank, so the data-parallel ranks hold DIFFERENT expert weights and must not average them.
// The dp layer leaves the expert tensors out of its buckets (skip_experts) and the owner brings
// their gradients to completion over its own group (the replicas of the same experts) before
// the update; their segments then join the gradient norm, summed over the owner's group, and
// AdamW here, so that one clip factor scales the whole model.
typedef struct {
    void* ctx;
    void (*reduce)(void* ctx);                  // make the owned gradients whole (NULL: none owned)
    double (*sum_norm)(void* ctx, double sq);   // the owned part of the squared norm, summed over the owners
    std::vector<OptSegment> segments;           // the owned tensors: parameters, gradients, m, v, master
} ExpertOwners;

typedef struct DataParallel {
    // configuration
    const struct DPModeOps* ops;       // the mode: dp_naive.h, dp_ddp.h, dp_ps.h, dp_zero.h, dp_zero3.h, dp_zeropp.h
    const struct DPOptimizerOps* opt;  // the optimizer state on the device, or on the host (offload.h)
    int offload;                  // ZeRO-1/2 with the optimizer state and update on the host
    int use_ring;                 // 1: our ring collectives (counted), 0: the native MPI ones
    int comm_auto;                //   with use_ring: auto's choice per call instead of the ring (--comm-algo auto)
    int ps_servers;
    size_t bucket_bytes;
    Comm* comm;                   // the data-parallel group
    int N, rank;
    GPT2* model;
    ShardGroup shards;            // the other shards of this replica (tensor and pipeline parallelism)
    int skip_experts;             // expert parallelism: the expert tensors are not this layer's (experts)
    ExpertOwners experts;
    int root_deferred;            // pipeline: the root's gradients are whole only after the embedding
                                  // group's sum, which then calls dp_root_done (buckets.h)
    // layout (buckets.h): units 0 .. nl-1 are the stage's blocks (local index), then the root
    std::vector<Bucket> buckets;
    int num_units, root_unit;              // root_unit = nl, or -1 when the stage holds no tensor outside the blocks
    int one_unit_per_bucket;               // ZeRO-3: a bucket per block (and one for the root)
    std::vector<int> unit_bucket;          // unit -> bucket
    std::vector<size_t> unit_offset;       // unit -> element offset inside its bucket
    std::vector<std::vector<Slice>> unit_slices;   // unit -> its slices (packed = offset in bucket)
    size_t psi, psi_pad;
    // parameter server / naive: the flat buffers of the model; the owned block (PS servers)
    size_t own_flat_offset, own_flat_count;
    float *flat_m, *flat_v, *flat_master;
    // what this rank's optimizer updates (and, with --offload, a host buffer for its gradients)
    std::vector<OptSegment> segments;
    float* offload_scratch;
    // state of the current optimizer step
    int sync;                     // 1: this micro-step communicates (the last one, or always for ZeRO-2/3)
    int materialized;             // ZeRO-3: full parameters gathered for evaluation / saving
    GPT2Hooks hooks;              // the placement hooks this mode installed in the model's chain
    long (*gather_params)(struct DataParallel* dp, int b, int who, floatX* full);   // ZeRO-3: start bucket b's all-gather (dp_zero3.h)
    struct ZeroPP* zeropp;        // ZeRO++ on ZeRO-3 (llmc/parallel/dp_zeropp.h), NULL without it
    struct DPSched* sched;        // layer-wise scheduling of chunks (llmc/parallel/dp_priority.h), NULL without it
    struct PSAsync* async;        // the asynchronous / stale synchronous server (llmc/parallel/dp_ps_async.h), NULL without it
    struct DPCompress* compress;  // gradient compression (llmc/parallel/dp_compress.h), NULL without it
    // the communication thread
    int threads;                  // its OpenMP team (the reductions it runs): the trainer's --threads
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> tasks;
    std::deque<std::string> task_names;
    std::deque<BackendEvent> task_events;    // per queued task: the compute stream's event at enqueue
    std::deque<int> task_prio;               // per queued task: its priority (lower goes first; 0 for all but dp_priority.h's chunks)
    std::deque<long> task_ticket;            // per queued task: its ticket
    std::vector<char> done;                  // per ticket: finished (tasks may finish out of ticket order)
    int agree_order;              // 1: the tasks run by priority, in an order rank 0 picks and broadcasts (dp_priority.h)
    MPI_Comm order_comm;          //    on a communicator of its own (the main thread's collectives use dp->comm's)
    std::vector<BackendEvent> spare_events;  // events of finished tasks, recorded again by later ones
    long enqueued, completed;
    int stop;
    double block_start;           // trace: when the current block's backward began
    std::deque<long> in_flight;   // ZeRO-2/3: tickets of the gradient buckets being reduced
    // measurements
    double comm_seconds, exposed_seconds;   // per step, reset by dp_zero_grad
    uint64_t step_bytes_start;
    size_t mem_live[MEM_NCAT], mem_peak[MEM_NCAT], host_live;
    std::mutex pool_mu;
    std::vector<std::pair<size_t, void*>> pool;   // released transient buffers, reused by size
} DataParallel;

// A data-parallel mode is a table of functions (the tables: dp_mode.h), and so is where its
// optimizer state lives (on the device, dp_mode.h, or in host memory, offload.h).
struct DPModeOps {
    const char* name;            // as the memory table prints it
    const char* flag;            // --dp-mode ...
    int zero;                    // ... with --zero ...
    int reduce_every_micro;      // 1: every micro-step communicates (no full gradient buffer to accumulate in)
    int always_counted;          // 1: its collectives are ours whatever --comm-algo says (bytes counted)
    const char* comm_note;       // appended to the "comm" line printed at start
    void (*init)(DataParallel* dp);        // buffers, optimizer state, segments, hooks
    void (*zero_grad)(DataParallel* dp);   // start of a step
    float (*update)(DataParallel* dp, float lr, float beta1, float beta2, float eps, float weight_decay,
                    float grad_clip);      // after the last backward; returns the norm before clipping
    void (*bucket_ready)(DataParallel* dp, int b);   // a bucket's gradients are complete (NULL: no buckets)
    void (*full_model_begin)(DataParallel* dp);      // evaluation, sampling, saving need every
    void (*full_model_end)(DataParallel* dp);        // parameter (NULL: they are always there)
    uint64_t (*formula_bytes)(const DataParallel* dp, int micro);       // sent per step (N > 1)
    void (*formula_memory)(const DataParallel* dp, size_t out[MEM_NCAT]);   // bytes per category
    int owners_disjoint;         // 1: each rank updates its own part (ZeRO, servers): the norm is summed over the
                                 // ranks, each rank saves its part (llmc/train/train_state.h); 0: every rank all of it
};
typedef struct DPModeOps DPModeOps;

struct DPOptimizerOps {
    const char* name;
    float* (*alloc)(DataParallel* dp, int cat, size_t n);   // zeroed state for n parameters, counted
    void (*seed_master)(float* master, const floatX* params, size_t n);   // fp32 master weights
    void (*prepare)(DataParallel* dp);   // once the segments are known (NULL: nothing to do)
    void (*adamw)(DataParallel* dp, const OptSegment* s, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int t, float grad_scale, unsigned int seed);
    void (*release)(float* p);
};
typedef struct DPOptimizerOps DPOptimizerOps;

static inline int dp_has_master(const DataParallel* dp) { return BACKEND_MASTER_WEIGHTS || dp->offload; }

// the range of a bucket this rank updates: the whole bucket (DDP) or its block (ZeRO-1/2/3)
static inline void bucket_owned(const DataParallel* dp, const Bucket* b, int stage, size_t* lo, size_t* n, size_t* hi) {
    *lo = stage >= 1 ? (size_t)dp->rank * b->shard : 0;
    *n = stage >= 1 ? b->shard : b->count;
    *hi = std::min(*lo + *n, b->count);
}

// ---------------------------------------------------------------------------------------
// memory: every allocation of the DP layer is counted in a category

static inline void* dp_alloc(DataParallel* dp, int cat, size_t bytes) {
    void* p = device_malloc(bytes);
    dp->mem_live[cat] += bytes;
    if (dp->mem_live[cat] > dp->mem_peak[cat]) { dp->mem_peak[cat] = dp->mem_live[cat]; }
    return p;
}
static inline void dp_free(DataParallel* dp, int cat, void* p, size_t bytes) {
    if (!p) { return; }
    device_free(p);
    dp->mem_live[cat] -= bytes;
}
// Transient buffers (ZeRO-2's in-flight gradient buckets, ZeRO-3's gathered blocks, the
// all-gather buffers): released buffers are kept and reused, as a caching allocator does;
// mem_live counts only the ones in use, mem_peak the most at any time.
static inline floatX* dp_take(DataParallel* dp, int cat, size_t n, int zero) {
    size_t bytes = n * sizeof(floatX);
    void* p = NULL;
    {
        std::lock_guard<std::mutex> guard(dp->pool_mu);
        for (size_t i = 0; i < dp->pool.size(); i++) {
            if (dp->pool[i].first == bytes) { p = dp->pool[i].second; dp->pool.erase(dp->pool.begin() + i); break; }
        }
        dp->mem_live[cat] += bytes;
        if (dp->mem_live[cat] > dp->mem_peak[cat]) { dp->mem_peak[cat] = dp->mem_live[cat]; }
    }
    if (!p) { p = device_malloc(bytes); }
    if (zero) { device_memset_zero(p, bytes); }
    return (floatX*)p;
}
static inline void dp_give(DataParallel* dp, int cat, floatX* p, size_t n) {
    std::lock_guard<std::mutex> guard(dp->pool_mu);
    dp->pool.push_back({n * sizeof(floatX), (void*)p});
    dp->mem_live[cat] -= n * sizeof(floatX);
}

// ---------------------------------------------------------------------------------------
// the communication thread

// Which queued task runs next (called with the lock held; returns its index in the queue).
// First come, first served, unless the tasks carry priorities (layer-wise scheduling,
// dp_priority.h): then the lowest priority value first, the earlier ticket among equals. The
// ranks must run the same task at the same time (a chunk is a collective), but a task may be
// queued on one rank and not yet on another: rank 0 picks among its own and broadcasts the
// ticket, the others wait until they have queued it too (every rank queues the same tasks in the
// same order, so a ticket names the same task everywhere: Horovod's coordinator, in one line).
// Preemption happens here, between chunks: a small high-priority chunk queued while a large
// low-priority transfer is under way goes next, before the transfer's remaining chunks.
static inline size_t dp_pick_task(DataParallel* dp, std::unique_lock<std::mutex>& lock) {
    if (!dp->agree_order) { return 0; }
    long ticket = 0;
    if (dp->rank == 0) {
        size_t best = 0;
        for (size_t i = 1; i < dp->tasks.size(); i++) {
            if (dp->task_prio[i] < dp->task_prio[best]) { best = i; }   // ties: the earlier ticket (queue order)
        }
        ticket = dp->task_ticket[best];
    }
    lock.unlock();   // the compute thread goes on queueing while the ranks agree
    MPI_Bcast(&ticket, 1, MPI_LONG, 0, dp->order_comm);
    lock.lock();
    for (;;) {
        for (size_t i = 0; i < dp->tasks.size(); i++) {
            if (dp->task_ticket[i] == ticket) { return i; }
        }
        dp->cv.wait(lock);   // rank 0 is ahead: this rank's compute thread has not queued it yet
    }
}

static inline void dp_thread_main(DataParallel* dp) {
#ifdef _OPENMP
    omp_set_num_threads(dp->threads);   // a new thread starts with OMP_NUM_THREADS (or all cores), not --threads
#endif
    comm_bind_thread(dp->comm);   // a new thread starts on GPU 0: use the communicator's
    for (;;) {
        std::function<void()> task;
        std::string name;
        BackendEvent inputs_ready;
        long ticket;
        {
            std::unique_lock<std::mutex> lock(dp->mu);
            dp->cv.wait(lock, [dp] { return dp->stop || !dp->tasks.empty(); });
            if (dp->tasks.empty()) {
                for (BackendEvent e : dp->spare_events) { backend_event_destroy(e); }
                dp->spare_events.clear();
                return;
            }
            size_t i = dp_pick_task(dp, lock);
            task = dp->tasks[i];
            name = dp->task_names[i];
            inputs_ready = dp->task_events[i];
            ticket = dp->task_ticket[i];
            dp->tasks.erase(dp->tasks.begin() + i);
            dp->task_names.erase(dp->task_names.begin() + i);
            dp->task_events.erase(dp->task_events.begin() + i);
            dp->task_prio.erase(dp->task_prio.begin() + i);
            dp->task_ticket.erase(dp->task_ticket.begin() + i);
        }
        double t0 = trace_now();
        // The communicator's stream (not this thread) waits until the compute stream has run the
        // kernels launched before the enqueue; later compute kernels are not waited for. The
        // communicator's stream is a blocking one (comm_enable_device's default), which CUDA
        // also orders after all earlier compute work: required as long as a task
        // launches compute-stream work of its own that its collective reads (ZeRO-3's gather
        // copies the shard into place first). The event carries the order once the stream is
        // non-blocking (comm_enable_device(c, staged, 1)) and compute and communication overlap.
        comm_wait_event(dp->comm, inputs_ready);
        task();
        double dt = trace_now() - t0;
        trace_event(name.c_str(), 1, t0);
        {
            std::lock_guard<std::mutex> lock(dp->mu);
            dp->spare_events.push_back(inputs_ready);   // the wait above is issued: free to record again
            dp->comm_seconds += dt;
            dp->done[ticket] = 1;
            dp->completed++;
        }
        dp->cv.notify_all();
    }
}

// Enqueue a collective; returns its ticket. The buffers it reads were written by kernels
// already launched on the compute stream: an event recorded there now marks them, and the
// communication thread's stream waits for it (dp_thread_main). Neither thread blocks (the
// device-wide synchronisation this replaces stopped the compute thread for every bucket). On
// the CPU backend the event is a no-op: the data are complete when the kernels return.
// (priority: lower goes first when the order is agreed by priority, dp_pick_task; else ignored)
static inline long dp_enqueue_locked(DataParallel* dp, const char* name, std::function<void()> task, int priority) {
    BackendEvent e;
    if (dp->spare_events.empty()) {
        e = backend_event_create();
    } else {
        e = dp->spare_events.back();
        dp->spare_events.pop_back();
    }
    backend_event_record(e);
    dp->tasks.push_back(task);
    dp->task_names.push_back(name);
    dp->task_events.push_back(e);
    long ticket = ++dp->enqueued;
    dp->task_prio.push_back(priority);
    dp->task_ticket.push_back(ticket);
    if (dp->done.size() <= (size_t)ticket) { dp->done.resize(2 * (size_t)ticket + 64, 0); }
    dp->cv.notify_all();
    return ticket;
}
static inline long dp_enqueue(DataParallel* dp, const char* name, std::function<void()> task) {
    std::lock_guard<std::mutex> lock(dp->mu);
    return dp_enqueue_locked(dp, name, task, 0);
}

// Blocks until the task with this ticket has completed. No event is needed on the way back:
// every collective synchronises the communicator's stream before it returns, so a completed
// task's results are on the device, and device work a task itself launched on the compute
// stream (ZeRO-2's accumulation of the reduced block) comes before whatever the compute thread
// launches after this returns. (Recording an event on the communicator's stream after each task
// and making the compute stream wait for it would let dp_wait return at once, but the tasks also
// do host work: MPI on the staged wire, buffers handed back to the pool.)
static inline void dp_wait(DataParallel* dp, long ticket) {
    double t0 = trace_now();
    std::unique_lock<std::mutex> lock(dp->mu);
    if (ticket <= 0 || dp->done[ticket]) { return; }
    dp->cv.wait(lock, [dp, ticket] { return dp->done[ticket] != 0; });
    lock.unlock();
    double dt = trace_now() - t0;
    dp->exposed_seconds += dt;
    trace_event("wait for communication", 0, t0);
}
static inline void dp_wait_all(DataParallel* dp) {
    double t0 = trace_now();
    std::unique_lock<std::mutex> lock(dp->mu);
    if (dp->completed == dp->enqueued) { return; }
    dp->cv.wait(lock, [dp] { return dp->completed == dp->enqueued; });
    lock.unlock();
    dp->exposed_seconds += trace_now() - t0;
    trace_event("wait for communication", 0, t0);
}
// run a collective now (enqueue + wait): all MPI calls go through the thread
static inline void dp_run(DataParallel* dp, const char* name, std::function<void()> task) {
    dp_wait(dp, dp_enqueue(dp, name, task));
}

// ---------------------------------------------------------------------------------------
// collectives on floatX buffers of the DP group: our ring (counted byte for byte by the
// transport) or the native MPI call (not counted: MPI picks its own algorithm)

static inline void compress_allreduce(DataParallel* dp, floatX* buf, size_t n);   // dp_compress.h
static inline void dp_allreduce_avg(DataParallel* dp, floatX* buf, size_t n) {
    if (dp->compress) { compress_allreduce(dp, buf, n); return; }   // --compress: all-gather of payloads
    if (dp->comm_auto) { allreduce_auto(dp->comm, buf, buf, n, COMM_FLOATX, COMM_AVG); }
    else if (dp->use_ring) { allreduce_ring(dp->comm, buf, buf, n, COMM_FLOATX, COMM_AVG); }
    else { allreduce_native(dp->comm, buf, buf, n, COMM_FLOATX, COMM_AVG); }
}
// in place: rank r's averaged block lands at buf + r * n / N (n a multiple of N)
static inline void dp_reduce_scatter_avg(DataParallel* dp, floatX* buf, size_t n) {
    floatX* mine = buf + (size_t)dp->rank * (n / dp->N);
    if (dp->comm_auto) { reduce_scatter_auto(dp->comm, buf, mine, n, COMM_FLOATX, COMM_AVG); }
    else if (dp->use_ring) { reduce_scatter_ring(dp->comm, buf, mine, n, COMM_FLOATX, COMM_AVG); }
    else { reduce_scatter_native(dp->comm, buf, mine, n, COMM_FLOATX, COMM_AVG); }
}
// in place: rank r's block at buf + r * n / N goes to everyone
static inline void dp_allgather(DataParallel* dp, floatX* buf, size_t n) {
    floatX* mine = buf + (size_t)dp->rank * (n / dp->N);
    if (dp->comm_auto) { allgather_auto(dp->comm, mine, buf, n, COMM_FLOATX); }
    else if (dp->use_ring) { allgather_ring(dp->comm, mine, buf, n, COMM_FLOATX); }
    else { allgather_native(dp->comm, mine, buf, n, COMM_FLOATX); }
}
