// The machine the planner plans for: memory per device, peak FLOP/s and the share of it the
// kernels reach, devices per node, and the two links (inside a node, between nodes) as
// alpha-beta pairs: a message of n bytes takes alpha + n / bandwidth. --machine h100 (SXM nodes
// of 8) or cpu (this machine's cores and memory shared by the ranks), each figure overridden by
// its flag, the links by a file collbench measured (--links).
#pragma once

#include <ctype.h>
#include <algorithm>
#include <string>
#include <vector>
#include "../common.h"
#include "../plan/train_args.h"

typedef struct {
    std::string name;
    double mem;                // bytes per device
    double peak, eff;          // FLOP/s per device, and the share the kernels reach
    int per_node;
    double alpha[2], bw[2];    // seconds per message, bytes per second: [0] inside a node, [1] between
    int inter_shared;          // 1: the link between nodes is the node's (one network card), shared by
                               // the node's devices that cross at once; 0: each device has its own
    int cores;                 // cpu: the cores the devices share
} Machine;

// A links file (collbench measures the values), read as strictly as the flags: each line
// "intra|inter ALPHA_US GB_PER_S" (blank lines and # comments aside), each number whole ("25x"
// is not 25), each link at most once; an error names the file and the line. The inter line may
// end in "shared": the bandwidth is the node's link, which its devices share when they cross at
// once (a node with one network card, as scripts/cluster.sh makes); without it each device has
// a link of that bandwidth to itself (H100 nodes: a 400 Gb/s card per GPU).
static inline void machine_read_links(Machine* m, const char* path) {
    FILE* f = fopen_or_die(path, "r");
    std::string text;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof(buf), f)) > 0) { text.append(buf, got); }
    fclose(f);
    int line_no = 0, first[2] = {0, 0};
    for (size_t at = 0; at < text.size();) {
        size_t end = text.find('\n', at);
        if (end == std::string::npos) { end = text.size(); }
        std::string line = text.substr(at, end - at);
        at = end + 1;
        line_no++;
        std::vector<std::string> words;
        for (size_t i = 0; i < line.size();) {
            while (i < line.size() && isspace((unsigned char)line[i])) { i++; }
            size_t j = i;
            while (j < line.size() && !isspace((unsigned char)line[j])) { j++; }
            if (j > i) { words.push_back(line.substr(i, j - i)); }
            i = j;
        }
        if (words.empty() || words[0][0] == '#') { continue; }
        double v[2] = {-1.0, -1.0};
        for (int i = 0; i < 2 && i + 1 < (int)words.size(); i++) {
            char* e = NULL;
            v[i] = strtod(words[i + 1].c_str(), &e);
            if (*e != 0 || !isfinite(v[i])) { v[i] = -1.0; }
        }
        int k = words[0] == "inter";
        bool shared = k == 1 && words.size() == 4 && words[3] == "shared";
        if ((words.size() != 3 && !shared) || (words[0] != "intra" && words[0] != "inter") || !(v[0] >= 0) || !(v[1] > 0)) {
            die("--links '%s', line %d: '%s' is not 'intra|inter ALPHA_US GB_PER_S' or 'inter ALPHA_US GB_PER_S shared' "
                "(alpha >= 0 us, bandwidth > 0 GB/s)", path, line_no, line.c_str());
        }
        if (k == 1) { m->inter_shared = shared; }
        if (first[k]) { die("--links '%s', line %d: the %s link again (first on line %d)", path, line_no, words[0].c_str(), first[k]); }
        first[k] = line_no;
        m->alpha[k] = v[0] * 1e-6;
        m->bw[k] = v[1] * 1e9;
    }
    if (!first[0] && !first[1]) { die("--links '%s' has no 'intra|inter ALPHA_US GB_PER_S' line", path); }
}

static inline Machine machine_from_args(const TrainArgs* a, int devices) {
    Machine m;
#ifdef LLMC_CPU
    const char* name = a->machine ? a->machine : "cpu";
#else
    const char* name = a->machine ? a->machine : "h100";
#endif
    m.name = name;
    m.cores = 0;
    m.inter_shared = 0;
    if (strcmp(name, "h100") == 0) {   // H100 SXM 80 GB nodes of 8: NVLink 4 (~360 GB/s a direction reached), 400 Gb/s NDR per GPU
        m.mem = 80.0 * 1073741824.0;
        m.peak = 989e12;   // bf16 dense
        m.eff = 0.40;
        m.per_node = 8;
        m.alpha[0] = 5e-6; m.bw[0] = 360e9;
        m.alpha[1] = 10e-6; m.bw[1] = 45e9;
    } else {   // this machine: the devices are ranks sharing its cores and memory, one "node"
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE), cores = sysconf(_SC_NPROCESSORS_ONLN);
        m.cores = cores > 0 ? (int)cores : 1;
        m.mem = (double)pages * page / std::max(1, devices);
        m.peak = 10e9 * std::min(1.0, (double)m.cores / std::max(1, devices));   // fp32 GFLOP/s of a core, shared
        m.eff = 1.0;
        m.per_node = std::max(1, devices);
        m.alpha[0] = m.alpha[1] = 30e-6; m.bw[0] = m.bw[1] = 2e9;   // shared-memory MPI (measure with collbench: --links)
    }
    if (a->device_mem > 0) { m.mem = a->device_mem * 1073741824.0; }
    if (a->peak_tflops > 0) {
        m.peak = a->peak_tflops * 1e12;
        if (m.cores) { m.peak *= std::min(1.0, (double)m.cores / std::max(1, devices)); }   // a core's peak, shared by the ranks
    }
    if (a->efficiency > 0) { m.eff = a->efficiency; }
    if (a->per_node > 0) { m.per_node = a->per_node; }
    if (a->links) { machine_read_links(&m, a->links); }
    return m;
}
