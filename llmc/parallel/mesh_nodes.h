// Where the mesh's groups sit: which ranks share a node, and for each dimension whether its
// groups stay inside a node (shared memory; NVLink on a GPU node) or cross the link between
// nodes (TCP here; InfiniBand on a cluster). The lecture's placement rule, checked on the run:
// tensor parallelism, which talks at every layer, inside a node; data and pipeline parallelism,
// which talk once per step or per micro-batch, across nodes.
//
//   2 nodes x 2 ranks, ranks 0 1 | 2 3 (mpirun's default: fill a node, then the next)
//     dp 2 x tp 2 (tp fastest):  tp groups {0,1} {2,3}  inside a node
//                                dp groups {0,2} {1,3}  across nodes
//   the same with mpirun --map-by node (ranks 0 2 | 1 3): the other way round
//
// A node is what MPI calls one: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), the ranks that can
// share memory (scripts/cluster.sh makes several on one machine). On one node it prints nothing.
#pragma once

#include <unistd.h>
#include <string>
#include <vector>
#include "mesh.h"

// Collective over the mesh's world; rank 0 prints.
static inline void mesh_print_nodes(const Mesh* m) {
    const Comm* w = &m->world;
    MPI_Comm local;
    MPI_Comm_split_type(w->mpi, MPI_COMM_TYPE_SHARED, w->rank, MPI_INFO_NULL, &local);
    int local_rank = 0;
    MPI_Comm_rank(local, &local_rank);
    // a node's id: the world rank of its first rank
    int leader = local_rank == 0 ? w->rank : 0;
    MPI_Bcast(&leader, 1, MPI_INT, 0, local);
    MPI_Comm_free(&local);
    std::vector<int> node_of(w->size);
    MPI_Allgather(&leader, 1, MPI_INT, node_of.data(), 1, MPI_INT, w->mpi);
    char host[64] = {0};
    gethostname(host, sizeof(host) - 1);
    std::vector<char> hosts((size_t)w->size * 64);
    MPI_Allgather(host, 64, MPI_CHAR, hosts.data(), 64, MPI_CHAR, w->mpi);

    // each dimension: does any of its groups hold ranks of two nodes?
    int crosses[4];
    for (int d = 0; d < 4; d++) {
        int first = -1, mine = 0;
        std::vector<int> members(m->dim[d].size);
        int me = w->rank;
        MPI_Allgather(&me, 1, MPI_INT, members.data(), 1, MPI_INT, m->dim[d].mpi);
        for (int r : members) {
            if (first < 0) { first = node_of[r]; }
            if (node_of[r] != first) { mine = 1; }
        }
        MPI_Allreduce(&mine, &crosses[d], 1, MPI_INT, MPI_MAX, w->mpi);
    }
    if (w->rank != 0) { return; }
    std::vector<int> leaders;
    for (int r = 0; r < w->size; r++) {
        if (node_of[r] == r) { leaders.push_back(r); }
    }
    if (leaders.size() < 2) { return; }
    std::string list;
    for (int l : leaders) {
        std::string ranks;
        for (int r = 0; r < w->size; r++) {
            if (node_of[r] == l) { ranks += (ranks.empty() ? "" : " ") + std::to_string(r); }
        }
        list += (list.empty() ? "" : ", ") + std::string(&hosts[(size_t)l * 64]) + " (ranks " + ranks + ")";
    }
    printf("nodes        %zu: %s\n", leaders.size(), list.c_str());
    std::string inside, across;
    for (int d = 0; d < 4; d++) {
        if (m->size[d] < 2) { continue; }
        std::string& s = crosses[d] ? across : inside;
        s += (s.empty() ? "" : ", ") + std::string(MESH_NAMES[d]);
    }
    printf("placement    groups inside a node: %s; across nodes (the slow link): %s\n",
           inside.empty() ? "none" : inside.c_str(), across.empty() ? "none" : across.c_str());
}
