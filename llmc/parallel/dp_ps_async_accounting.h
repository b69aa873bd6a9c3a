// What the asynchronous / stale synchronous parameter server (llmc/parallel/dp_ps_async.h)
// costs, by formula, and what it reports at the end: each worker's step rate, how often the
// bound held it back, the staleness histogram, the bytes against their formulas, --ps-log.
//
// Bytes, a per element (counted on the wire: rank 0's worker talks to its own server thread
// through memory, not counted, as the synchronous server's own slice):
//   worker (rank != 0) per step   H + a Psi (push: a request of H bytes, then the gradient)
//   server per answer             R + a Psi (to ranks 1 .. N-1: one answer per push and barrier)
// Memory: every worker holds the model (parameters, gradients: a Psi each); the server (rank 0)
// also its own parameters and gradient sum (a Psi each), AdamW's m and v (8 Psi), the fp32 master
// weights where the backend keeps them (4 Psi), and for SSP the pushes of up to S + 1 open
// clocks, (S + 1) N a Psi: a worker can push clock c only once clock c - S - 1 is applied.
#pragma once

#include <map>
#include "dp_ps_async_worker.h"

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
    // Every worker has its barrier answer, but the server thread may not yet have counted the last
    // one it sent (a worker can go on as soon as its message arrives): wait until the server has
    // finished the barrier. It is idle then, every worker waiting in the trainer.
    std::unique_lock<std::mutex> lock(a->mu);
    a->barrier_done.wait(lock, [a] { return a->barriers == a->barriers_sent; });
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
