// The server of the asynchronous / stale synchronous parameter server (llmc/parallel/dp_ps_async.h):
// a thread of rank 0 that takes the workers' requests as they come, applies their gradients
// (SSP: a clock once all N pushes of it are in; async: each push) and answers with parameters.
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

#include "dp_ps_async_core.h"

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
            { std::lock_guard<std::mutex> lock(a->mu); a->barriers++; }   // every answer counted: the summary may read
            a->barrier_done.notify_all();
        }
    }
    if (!waiting.empty()) { die("--ps-async/--staleness: the server stopped with %zu requests unanswered", waiting.size()); }
}
