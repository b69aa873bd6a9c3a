// Layer-wise scheduling of the data-parallel communication (P3, Jayarajan et al. 2019;
// ByteScheduler, Peng et al. 2019): --comm-chunk-kb K slices the transfers into chunks of K KiB,
// --comm-order priority sends them first layers first.
//
// The mismatch (the lecture "Data Parallelism in LLM Training", "Optimizing PS Architecture via
// Scheduling"):
//   computation order       bp_L -> bp_L-1 -> ... -> bp_1 -> fp_1 -> fp_2 -> ... -> fp_L
//   gradients ready          g_L  ->  g_L-1 -> ... -> g_1
//   parameters needed first                           w_1  ->  w_2 -> ... -> w_L
// First come, first served sends g_L first and w_1 last, so the next forward, which needs w_1
// first, waits for the whole transfer. By priority (layer 0 = root and block 0 highest), w_1
// travels first and the forward of block 0 starts while the last layers' parameters are still
// on the way:
//
//   fifo      comm:  push 5 4 3 2 1 0 r | AdamW | pull 5 4 3 2 1 0 r |
//             comp:  bwd 5 4 3 2 1 0 r         ........wait........  fwd r 0 1 2 3 4 5
//   priority  comm:  push 5 4 3 2 1 0 r | AdamW | pull r 0 1 2 3 4 5 |
//             comp:  bwd 5 4 3 2 1 0 r         .wait. fwd r 0 1 2 ...   (each block waits for its own)
//
// Chunks and preemption: a unit's transfer (a block's slice of each parameter tensor, or the
// root: wte, wpe, lnf) is cut into chunks of at most K KiB; the communication thread picks the
// next chunk only when one is done (dp_core.h's dp_pick_task), so a small high-priority chunk
// that becomes ready while a large low-priority transfer is under way goes before the rest of
// it ("preemption between chunks"). All ranks must run the same chunk at the same time (each is
// a collective): rank 0 picks and broadcasts the ticket, on a communicator of its own.
//
// Two users:
//   --dp-mode ps   (P3) every chunk is one server's range: pushed to it (reduced in the same
//                  order as llmc/comm/ps.h's ps_push), and after the servers' AdamW pulled
//                  from it; the next step's forward waits, block by block, for its own chunks.
//                  Same elements, same servers, same order of sums as the plain parameter
//                  server: the results are bit for bit those of --dp-mode ps (any --ps-servers).
//   --dp-mode ddp  each bucket's all-reduce cut into chunks (ring all-reduce per chunk), sent by
//                  the priority of the bucket's first layer. The update needs every gradient
//                  (the global norm for clipping), so here priority only reorders the backward's
//                  traffic; the ring's sums per chunk differ from one whole-bucket ring, so the
//                  reference for DDP is the same chunking in fifo order.
//
// Cost (alpha-beta; n_c chunks, each also paying the rank-0 broadcast of its ticket, one small
// collective of ~log2 N alpha):
//   ps:  bytes as the plain server: worker a (Psi - own) each way, server (N-1) a Psi/S each way
//        messages: one per chunk and peer instead of one per server and peer: + n_c alpha
//   ddp: sum over chunks c of a ring all-reduce of n_c elements, ~ 2 (N-1)/N a n_c each
//        (ddp_sched_formula_bytes: allreduce_ring_volume per chunk)
// What priority buys (ps): the next forward starts after the root's and block 0's chunks,
//   t_first ~ (a Psi_0 / S)(N-1) beta   instead of   (N-1) a Psi/S beta   (the whole pull),
// with Psi_0 the parameters of the root and block 0; the rest of the pull overlaps the forward.
//
// What is counted (ps), after each update, in chunks rather than milliseconds, so that it is
// the same on every run: the communication thread runs one chunk at a time, so the forward of
// block l can start only once every chunk ahead of its own last one has been pulled. The thread
// numbers the pull chunks in the order it runs them; the step line then says in which order the
// units came and how many chunks the forward of block 0 waited for:
//   priority  root, block 0, 1, ..., L-1: block 0 waits for n_root + n_0 of the n chunks
//   fifo      block L-1, ..., 0, root:    block 0 waits for all n (the root comes last)
// (The milliseconds, from the update to the forward of block 0 and to the last chunk, are printed
// beside them; they depend on the machine's load: scripts/lab_ps.sh compares them.)
#pragma once

#include <string>
#include <vector>
#include "../comm/ps.h"
#include "dp_mode.h"
#include "buckets.h"
#include "dp_ddp.h"   // ddp_update
#include "dp_ps.h"    // ps_formula_bytes

// a contiguous range of the flat buffers, in one unit and one server's slice
typedef struct {
    int unit;        // 0..L-1 a block, L the root
    size_t offset;   // element offset in the model's flat buffers
    size_t count;
    int server;      // the rank that owns it (ps), or -1 (ddp: a ring all-reduce)
} SchedChunk;

struct DPSched {
    int priority;                              // 1: first layers first, 0: first come, first served
    size_t chunk_elems;                        // --comm-chunk-kb in elements
    std::vector<std::vector<SchedChunk>> unit_chunks;   // ps: per unit, its chunks
    std::vector<std::vector<long>> pull_tickets;        // ps: per unit, its pull chunks of this step
    std::vector<int> unit_waited;              // ps: this step's forward has waited for the unit
    int chunks_per_step;                       // chunks sent per step (push + pull, or all-reduce)
    // ps: the pull of the last update, counted by the communication thread as it runs the chunks
    int pulled;                                // its chunks run so far
    std::vector<int> unit_pulled_at;           // per unit: the place of its last chunk in the pull (1..; 0: none yet)
    std::vector<int> pull_order;               // the units, in the order their first chunk ran
    // ps: the previous pull, closed by the update that followed it (the step line and the summary)
    std::vector<int> shown_order;
    int shown_chunks, shown_block0, shown_block0_own;   // its chunks; the chunks block 0 waited for; the root's and block 0's own
    std::vector<int> first_order;              // the first pull's order, and how many pulls had the same
    int first_block0, pulls, orders_alike, block0_alike;
    double update_end;                         // when the servers' AdamW ended (trace clock)
    double first_forward;                      // seconds from update_end to the next forward of block 0 (-1: not seen)
    double last_pull_done;                     // seconds from update_end to the last parameter chunk's arrival
    double shown_first, shown_last;            // the previous update's two figures, for the step line
    double sum_first_forward, sum_last_pull;   // over the steps after the first
    int measured;
    uint64_t bytes_mark, bytes_prev_mark;      // ps: the communicator's count when this and the previous update queued the pulls
};
typedef struct DPSched DPSched;

// the priority of a unit: root first (the embedding starts the forward), then block 0, 1, ...
static inline int sched_unit_priority(const DataParallel* dp, int unit) { return unit == dp->root_unit ? 0 : unit + 1; }

static inline void sched_create(DataParallel* dp, int chunk_kb, int priority) {
    if (chunk_kb <= 0) { return; }
    DPSched* s = new DPSched();
    s->priority = priority;
    s->chunk_elems = std::max((size_t)1, (size_t)chunk_kb * 1024 / sizeof(floatX));
    s->chunks_per_step = 0;
    s->update_end = -1.0;
    s->first_forward = s->last_pull_done = -1.0;
    s->shown_first = s->shown_last = -1.0;
    s->sum_first_forward = s->sum_last_pull = 0.0;
    s->measured = 0;
    s->pulled = 0;
    s->shown_chunks = s->shown_block0 = s->shown_block0_own = 0;
    s->first_block0 = s->pulls = s->orders_alike = s->block0_alike = 0;
    s->bytes_mark = s->bytes_prev_mark = dp->comm->bytes_sent;
    dp->sched = s;
    dp->agree_order = priority;   // fifo: every rank already runs its queue in ticket order
    if (priority) { MPI_Comm_dup(dp->comm->mpi, &dp->order_comm); }
}

static inline void sched_free(DataParallel* dp) {
    if (!dp->sched) { return; }
    if (dp->agree_order) { MPI_Comm_free(&dp->order_comm); }
    delete dp->sched;
    dp->sched = NULL;
}

// ---------------------------------------------------------------------------------------
// The parameter server's chunks (P3)

// a unit's slices cut at the servers' slice boundaries (the plain server's ownership,
// comm_block_offset over Psi) and into chunks of at most chunk_elems
static inline void sched_ps_layout(DataParallel* dp) {
    DPSched* s = dp->sched;
    int S = dp->ps_servers;
    dp_build_layout(dp, 1);   // the units and their slices (buckets.h); the buckets themselves are not used:
    dp->buckets.clear();      // the gradients stay in the model's flat buffer, as the plain server's
    dp->psi_pad = dp->psi;
    s->unit_chunks.assign(dp->num_units, std::vector<SchedChunk>());
    for (int u = 0; u < dp->num_units; u++) {
        for (const Slice& sl : dp->unit_slices[u]) {
            size_t o = sl.flat, end = sl.flat + sl.count;
            while (o < end) {
                int server = 0;
                while (server + 1 < S && comm_block_offset(dp->psi, S, server + 1) <= o) { server++; }
                size_t server_end = comm_block_offset(dp->psi, S, server) + comm_block_count(dp->psi, S, server);
                size_t n = std::min(std::min(end, server_end) - o, s->chunk_elems);
                s->unit_chunks[u].push_back({u, o, n, server});
                o += n;
            }
        }
        s->chunks_per_step += 2 * (int)s->unit_chunks[u].size();
    }
    s->pull_tickets.assign(dp->num_units, std::vector<long>());
    s->unit_waited.assign(dp->num_units, 1);
    s->unit_pulled_at.assign(dp->num_units, 0);
}

// push one chunk: the server receives it from every other rank and adds it to its own, in the
// order of ps_push (round k: from rank server - k), then finishes the average
static inline void sched_push_chunk(DataParallel* dp, const SchedChunk& c) {
    Comm* comm = dp->comm;
    int p = comm->size, r = comm->rank;
    floatX* g = dp->model->grads_memory + c.offset;
    if (r != c.server) { comm_send(comm, g, c.count, COMM_FLOATX, c.server); return; }
    void* inc = comm_scratch(comm, c.count, COMM_FLOATX);
    for (int k = 1; k < p; k++) {
        comm_recv(comm, inc, c.count, COMM_FLOATX, (r - k + p) % p);
        comm_reduce_local(comm, g, inc, c.count, COMM_FLOATX, COMM_AVG);
    }
    comm_avg_finish(comm, g, c.count, COMM_FLOATX, COMM_AVG, p);
    comm_scratch_free(comm, inc);
}

// pull one chunk: the server sends its updated parameters to every other rank
static inline void sched_pull_chunk(DataParallel* dp, const SchedChunk& c) {
    Comm* comm = dp->comm;
    int p = comm->size, r = comm->rank;
    floatX* w = dp->model->params_memory + c.offset;
    if (r != c.server) {
        comm_recv(comm, w, c.count, COMM_FLOATX, c.server);
    } else {
        for (int k = 1; k < p; k++) { comm_send(comm, w, c.count, COMM_FLOATX, (r + k) % p); }
    }
    DPSched* s = dp->sched;   // (the main thread reads what follows only once every pull is done)
    s->last_pull_done = std::max(s->last_pull_done, trace_now() - s->update_end);
    s->pulled++;              // this chunk's place in the pull: the thread runs one chunk at a time
    if (s->unit_pulled_at[c.unit] == 0) { s->pull_order.push_back(c.unit); }
    s->unit_pulled_at[c.unit] = s->pulled;
}

static inline const char* sched_unit_name(const DataParallel* dp, int unit, char* buf, size_t n) {
    if (unit == dp->root_unit) { snprintf(buf, n, "root"); } else { snprintf(buf, n, "block %d", unit); }
    return buf;
}

// a unit's gradients are complete (last micro-step only): its push chunks go to the thread
static inline void sched_ps_unit_done(DataParallel* dp, int unit) {
    if (!dp->sync) { return; }
    DPSched* s = dp->sched;
    std::lock_guard<std::mutex> lock(dp->mu);
    char u[32], name[64];
    for (size_t i = 0; i < s->unit_chunks[unit].size(); i++) {
        const SchedChunk c = s->unit_chunks[unit][i];
        snprintf(name, sizeof(name), "push %s [%zu/%zu]", sched_unit_name(dp, unit, u, sizeof(u)), i + 1, s->unit_chunks[unit].size());
        dp_enqueue_locked(dp, name, [dp, c] { sched_push_chunk(dp, c); }, sched_unit_priority(dp, unit));
    }
}

// The forward of the next step waits for the unit's pulled chunks only; the first unit to wait
// after an update marks how long the forward of the next step was held up.
static inline void sched_wait_unit(DataParallel* dp, int unit) {
    DPSched* s = dp->sched;
    if (s->unit_waited[unit]) { return; }
    for (long t : s->pull_tickets[unit]) { dp_wait(dp, t); }
    s->unit_waited[unit] = 1;
    if (unit == 0 && s->update_end >= 0.0) {   // block 0 may start: the step's first forward computation
        s->first_forward = trace_now() - s->update_end;
    }
}

static inline void sched_forward_begin(void* ctx, ParameterTensors* root) {
    (void)root;
    DataParallel* dp = (DataParallel*)ctx;
    if (dp->root_unit >= 0) { sched_wait_unit(dp, dp->root_unit); }
}
static inline void sched_block_forward_begin(void* ctx, int l, BlockWeights* w) {
    (void)w;
    DataParallel* dp = (DataParallel*)ctx;
    sched_wait_unit(dp, dp_unit_of_layer(dp, l));
    dp->block_start = trace_now();
}
static inline void sched_block_forward_end(void* ctx, int l) { dp_trace_block((DataParallel*)ctx, "forward", l); }
static inline void sched_block_backward_begin(void* ctx, int l, BlockWeights* w, BlockWeights* grads) {
    (void)l; (void)w; (void)grads;
    ((DataParallel*)ctx)->block_start = trace_now();
}
static inline void sched_block_backward_end(void* ctx, int l) {
    DataParallel* dp = (DataParallel*)ctx;
    dp_trace_block(dp, "backward", l);
    sched_ps_unit_done(dp, dp_unit_of_layer(dp, l));
}
static inline void sched_backward_end(void* ctx) {
    DataParallel* dp = (DataParallel*)ctx;
    if (dp->root_unit >= 0) { sched_ps_unit_done(dp, dp->root_unit); }
}

static inline void ps_sched_init(DataParallel* dp) {
    int S = dp->ps_servers;
    sched_ps_layout(dp);
    if (dp->rank < S) { dp_own_flat_range(dp, comm_block_offset(dp->psi, S, dp->rank), comm_block_count(dp->psi, S, dp->rank)); }
    GPT2Hooks h = {};
    h.forward_begin = sched_forward_begin;
    h.block_forward_begin = sched_block_forward_begin;
    h.block_forward_end = sched_block_forward_end;
    h.block_backward_begin = sched_block_backward_begin;
    h.block_backward_end = sched_block_backward_end;
    h.backward_end = sched_backward_end;
    dp_install_hooks(dp, dp->sched->priority ? "parameter server: layer-wise chunks by priority" : "parameter server: layer-wise chunks, fifo", h);
}

static inline void ps_sched_zero_grad(DataParallel* dp) { gpt2_zero_grad(dp->model); }

// The pull of the last update is over: what block 0's forward waited for, kept for the step line.
// The forward of block 0 needs the root's chunks and its own; the thread ran every chunk ahead
// of the last of them first, so it waited for that chunk's place in the pull.
static inline void sched_close_pull(DataParallel* dp) {
    DPSched* s = dp->sched;
    if (s->pulled == 0) { return; }   // the first update: nothing was pulled before it
    int root = dp->root_unit;
    s->shown_order = s->pull_order;
    s->shown_chunks = s->pulled;
    s->shown_block0 = std::max(s->unit_pulled_at[0], root >= 0 ? s->unit_pulled_at[root] : 0);
    s->shown_block0_own = (int)s->unit_chunks[0].size() + (root >= 0 ? (int)s->unit_chunks[root].size() : 0);
    if (s->pulls == 0) { s->first_order = s->shown_order; s->first_block0 = s->shown_block0; }
    s->pulls++;
    s->orders_alike += s->shown_order == s->first_order;
    s->block0_alike += s->shown_block0 == s->first_block0;
    s->pulled = 0;
    s->pull_order.clear();
    for (size_t u = 0; u < s->unit_pulled_at.size(); u++) { s->unit_pulled_at[u] = 0; }
}

// all pushes in -> the servers' AdamW (dp_update_owned, as the plain server) -> every pull
// chunk queued at once, in the order the gradients came (fifo) or by priority; the forward of the
// next step waits for each unit's chunks only when it reaches the unit
static inline float ps_sched_update(DataParallel* dp, float lr, float beta1, float beta2, float eps, float weight_decay,
                                    float grad_clip) {
    DPSched* s = dp->sched;
    float norm = dp_update_owned(dp, lr, beta1, beta2, eps, weight_decay, grad_clip);   // waits for every push
    sched_close_pull(dp);                // the previous update's pull (all done: the forward waited for every unit)
    s->shown_first = s->first_forward;   // and its times
    s->shown_last = s->last_pull_done;
    s->first_forward = s->last_pull_done = -1.0;
    s->update_end = trace_now();
    s->bytes_prev_mark = s->bytes_mark;   // the thread is idle here (every push done, no pull queued): a clean count
    s->bytes_mark = dp->comm->bytes_sent;
    std::vector<int> order;   // the ready order of the backward: blocks L-1 .. 0, then the root
    for (int u = dp->num_units - 1 - (dp->root_unit >= 0); u >= 0; u--) { order.push_back(u); }
    if (dp->root_unit >= 0) { order.push_back(dp->root_unit); }
    std::lock_guard<std::mutex> lock(dp->mu);   // all at once: rank 0 picks among all of them
    char u[32], name[64];
    for (int unit : order) {
        s->pull_tickets[unit].clear();
        s->unit_waited[unit] = 0;
        for (size_t i = 0; i < s->unit_chunks[unit].size(); i++) {
            const SchedChunk c = s->unit_chunks[unit][i];
            snprintf(name, sizeof(name), "pull %s [%zu/%zu]", sched_unit_name(dp, unit, u, sizeof(u)), i + 1, s->unit_chunks[unit].size());
            s->pull_tickets[unit].push_back(dp_enqueue_locked(dp, name, [dp, c] { sched_pull_chunk(dp, c); }, sched_unit_priority(dp, unit)));
        }
    }
    return norm;
}

// evaluation, checkpoints, the training state: every parameter chunk in place
static inline void ps_sched_settle(DataParallel* dp) {
    DPSched* s = dp->sched;
    dp_wait_all(dp);
    for (size_t u = 0; u < s->unit_waited.size(); u++) { s->unit_waited[u] = 1; }
}

static const DPModeOps DP_MODE_PS_SCHED = {
    "parameter server, layer-wise chunks", "ps", 0,        // name, --dp-mode, --zero
    0, 1, "; parameter server push/pull in layer-wise chunks (ours: counted)",
    ps_sched_init, ps_sched_zero_grad, ps_sched_update,
    NULL,                                                 // bucket_ready: the hooks queue the chunks
    ps_sched_settle, NULL,                                // full_model_begin: every pull in place; end: nothing
    ps_formula_bytes, ps_formula_memory,                  // the same bytes and memory as the plain server
    1,                    // owners_disjoint
};

// ---------------------------------------------------------------------------------------
// DDP: each bucket's all-reduce in chunks, by the priority of its first layer

static inline int sched_bucket_priority(const DataParallel* dp, const Bucket* b) {
    int p = 1 << 30;
    for (int u : b->units) { p = std::min(p, sched_unit_priority(dp, u)); }
    return p;
}

static inline void ddp_sched_init(DataParallel* dp) {
    buckets_init(dp, 0);
    bucket_install_hooks(dp, dp->sched->priority ? "data parallel: DDP buckets in chunks by priority" : "data parallel: DDP buckets in chunks, fifo");
    for (const Bucket& b : dp->buckets) { dp->sched->chunks_per_step += (int)ceil_div(b.padded, dp->sched->chunk_elems); }
}

static inline void ddp_sched_allreduce_bucket(DataParallel* dp, int b) {
    Bucket* bk = &dp->buckets[b];
    size_t ce = dp->sched->chunk_elems, n = ceil_div(bk->padded, ce);
    int prio = sched_bucket_priority(dp, bk);
    std::lock_guard<std::mutex> lock(dp->mu);
    char name[64];
    for (size_t i = 0; i < n; i++) {
        size_t o = i * ce, cnt = std::min(ce, bk->padded - o);
        snprintf(name, sizeof(name), "all-reduce bucket %d [%zu/%zu]", b, i + 1, n);
        bk->reduce_ticket = dp_enqueue_locked(dp, name, [dp, bk, o, cnt] { dp_allreduce_avg(dp, bk->grad + o, cnt); }, prio);
    }
}

static inline uint64_t ddp_sched_formula_bytes(const DataParallel* dp, int micro) {
    (void)micro;
    uint64_t bytes = 0;
    size_t ce = dp->sched->chunk_elems;
    for (const Bucket& b : dp->buckets) {
        for (size_t o = 0; o < b.padded; o += ce) {
            bytes += allreduce_ring_volume(std::min(ce, b.padded - o), COMM_FLOATX, dp->N, dp->rank).bytes;
        }
    }
    return bytes;
}

static const DPModeOps DP_MODE_DDP_SCHED = {
    "bucketed DDP, chunks", "ddp", 0,   // name, --dp-mode, --zero
    0, 0, "",                           // reduce_every_micro, always_counted, comm_note
    ddp_sched_init, buckets_zero_grad, ddp_update,
    ddp_sched_allreduce_bucket,
    NULL, NULL,
    ddp_sched_formula_bytes, ddp_formula_memory,
    0,
};

// The parameter server's pulls of step k's update run during step k + 1, so a step's window for
// the byte count is from one update to the next: the previous update's pull and this step's
// push (step 0: its push only). dp_report_step asks here.
static inline void sched_step_bytes(const DataParallel* dp, int step, uint64_t* sent, uint64_t* want) {
    const DPSched* s = dp->sched;
    if (!s || dp->ops != &DP_MODE_PS_SCHED || dp->N == 1) { return; }
    *sent = s->bytes_mark - s->bytes_prev_mark;
    size_t own = dp->rank < dp->ps_servers ? comm_block_count(dp->psi, dp->ps_servers, dp->rank) : 0;
    uint64_t push = (uint64_t)(dp->psi - own) * sizeof(floatX), pull = (uint64_t)(dp->N - 1) * own * sizeof(floatX);
    *want = push + (step > 0 ? pull : 0);
}

// ---------------------------------------------------------------------------------------
// What the scheduling did, printed at start and after each step

static inline void sched_print_plan(const DataParallel* dp) {
    const DPSched* s = dp->sched;
    if (!s) { return; }
    printf("schedule     chunks of %zu KiB, %s: %d chunks per step%s\n", s->chunk_elems * sizeof(floatX) / 1024,
           s->priority ? "by priority (root and block 0 first, P3)" : "first come, first served", s->chunks_per_step,
           s->priority ? ", the order agreed by rank 0's broadcast" : "");
}

// "root, block 0, block 1" (the units of a pull in the order they came)
static inline std::string sched_order_text(const DataParallel* dp, const std::vector<int>& order) {
    std::string out;
    char u[32];
    for (size_t i = 0; i < order.size(); i++) { out += (i ? ", " : "") + std::string(sched_unit_name(dp, order[i], u, sizeof(u))); }
    return out;
}

// the parameter server's pull, after the servers' update (reported one step late: it happens in
// the next step): in which order the units came, how many chunks the forward of block 0 waited
// for (counted), and when block 0 could start and the last chunk arrived (measured)
static inline void sched_report_step(DataParallel* dp, int step) {
    DPSched* s = dp->sched;
    if (!s || dp->ops != &DP_MODE_PS_SCHED || s->shown_first < 0.0 || s->shown_last < 0.0) { return; }
    printf("     sched | the previous update's pull: %s | the forward of block 0 waited for %d of the %d chunks (the root's "
           "and block 0's: %d) | after %.2f ms, the last chunk after %.2f ms\n", sched_order_text(dp, s->shown_order).c_str(),
           s->shown_block0, s->shown_chunks, s->shown_block0_own, s->shown_first * 1e3, s->shown_last * 1e3);
    if (step > 1) { s->sum_first_forward += s->shown_first; s->sum_last_pull += s->shown_last; s->measured++; }
}

// at the end (rank 0 prints): the pulls' order and block 0's wait, counted; the mean times
static inline void sched_print_summary(const DataParallel* dp) {
    const DPSched* s = dp->sched;
    if (!s || dp->ops != &DP_MODE_PS_SCHED || s->pulls == 0) { return; }
    printf("layer-wise pull (%s, %d pulls): %s in %d of them; the forward of block 0 waited for %d of the %d chunks (the "
           "root's and block 0's: %d) in %d of them\n", s->priority ? "priority" : "fifo", s->pulls, sched_order_text(dp, s->first_order).c_str(),
           s->orders_alike, s->first_block0, s->shown_chunks, s->shown_block0_own, s->block0_alike);
    if (s->measured == 0) { return; }
    printf("layer-wise pull (%s, %d steps): the next forward started %.2f ms after the update, the last parameter chunk "
           "arrived after %.2f ms\n", s->priority ? "priority" : "fifo", s->measured, s->sum_first_forward / s->measured * 1e3,
           s->sum_last_pull / s->measured * 1e3);
}
