// Synchronous parameter server (Li et al., 2014), the lecture's first data-parallel design.
// Every rank is a worker; ranks 0 .. S-1 of the data-parallel group are also servers. The flat
// parameter vector (Psi elements) is split into S slices (the balanced split of comm.h);
// server s owns slice s: it alone keeps that slice's optimizer state and updates it.
//
//   1. workers compute gradients (the full flat gradient buffer, as in naive DP)
//   2. push:   each worker sends slice s of its gradients to server s; the server sums them
//   3. update: each server averages its slice and runs AdamW on it (the gradient norm for
//              clipping: the servers' squared norms are summed, one small all-reduce)
//   4. pull:   each server sends its updated parameter slice to every worker
//
// Traffic per step (a bytes per element):
//   server: receives (N-1) a Psi/S (push) and sends (N-1) a Psi/S (pull)
//   worker: sends a Psi minus its own slice (push) and receives as much (pull)
// With S = 1 the server's link carries 2 (N-1) a Psi while a worker's carries 2 a Psi: the
// server is the bottleneck, and it grows with N. The counters in the summary show it.
// Memory: servers hold K Psi/S optimizer bytes, the other ranks none.
//
// The push and pull are llmc/comm/ps.h's ps_push / ps_pull (its all-reduce is push + pull):
// p-1 rounds, at round k rank r sends to r+k and receives from r-k, so no two ranks ever wait
// on each other in a cycle. dp.h calls them and runs the servers' update in between; the bytes
// a rank sends are allreduce_parameter_server_volume's (push + pull of the same buffer).
#pragma once

#include "../comm/ps.h"
#include "dp_core.h"
