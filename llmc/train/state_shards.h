// A rank's shard of the training state (llmc/train/train_state.h has the picture): what this
// rank's optimizer updates, each element addressed by its index in the FULL model, so that a rank
// file does not depend on the mesh that wrote it and any mesh reads it back:
//   tensor_full_runs      the full model's runs that hold a piece of a local tensor (a tp shard,
//                         a stage's blocks, a rank's experts)
//   state_segments        what this rank holds of the optimizer, and whether its copy is the saved one
//   state_file_read       one rank file, checked against the manifest
//   state_full            one kind (parameters, master weights, m or v) of the whole model, from
//                         every rank file
//   state_fill_segments   this rank's part of it, into its segments: resharding is resuming
#pragma once

#include <string>
#include <vector>
#include "../common.h"
#include "../model/gpt2.h"
#include "../plan/parallel_plan.h"
#include "state_manifest.h"

// a rank file: header int64[8], runs, values (llmc/train/train_state.h)
#define TRAIN_STATE_MAGIC 20261123
#define TRAIN_STATE_FORMAT 1
#define TRAIN_STATE_KINDS 4   // parameters, master weights, m, v
enum { KIND_PARAMS, KIND_MASTER, KIND_M, KIND_V };

typedef struct { uint64_t full, n; } StateRun;   // elements [full, full + n) of the full model

// ---------------------------------------------------------------------------------------
// Where a rank's elements sit in the full model.

// Runs of the full model holding elements [a, a + n) of tensor i's local shard, in local order.
// A local row (the innermost dimension, cols/tp of them for a row-split tensor) is contiguous
// in the full tensor; neighbouring rows merge when they are neighbours there too (all of a
// whole tensor is one run). The padding rows of a vocab shard past Vp (llmc/model/params.h:
// tp_vocab_rows) have no place in the full model and get no run: they are the shard's last
// rows, so the runs hold the first (returned) count of the n elements, and the rest is padding,
// zero, neither written nor read.
static inline size_t tensor_full_runs(const GPT2* m, int i, size_t a, size_t n, std::vector<StateRun>* out) {
    const ParamInfo* p = &m->param_info[i];
    const GPT2Place* place = &m->place;
    size_t nl, ne, rows, cols;
    param_slice_geometry(p, &nl, &ne, &rows, &cols);
    size_t lexp = p->experts ? ne / (size_t)place->ep : 1;
    size_t lrows = param_local_rows(p, place, rows), real = param_real_rows(p, place, rows);
    size_t lcols = p->shard == SHARD_ROWS ? cols / (size_t)place->tp : cols;
    size_t k = 0, end = a + n, base_full = m->full_info[i].offset, mapped = 0;
    for (size_t l = 0; l < nl && k < end; l++) {
        for (size_t e = 0; e < lexp && k < end; e++) {
            if (k + lrows * lcols <= a) { k += lrows * lcols; continue; }   // the whole (layer, expert) is before a
            size_t base = param_full_index(p, place, l, e, 0, 0) - param_full_in_slice(p, place, rows, cols, 0, 0);
            for (size_t r = 0; r < lrows && k < end; r++, k += lcols) {
                size_t lo = std::max(k, a), hi = std::min(k + lcols, end);
                if (lo >= hi || r >= real) { continue; }
                mapped += hi - lo;
                uint64_t f = base_full + base + param_full_in_slice(p, place, rows, cols, r, 0) + (lo - k);
                if (!out->empty() && out->back().full + out->back().n == f) { out->back().n += hi - lo; }
                else { out->push_back({f, hi - lo}); }
            }
        }
    }
    return mapped;
}

// ---------------------------------------------------------------------------------------
// What this rank holds of the optimizer: its segments, where their state lives, whether it
// writes them.

typedef struct {
    OptSegment s;
    int on_host;   // m, v, master in host memory (ZeRO-Offload)
    int write;     // this rank's copy is the one saved
} StateSegment;

static inline std::vector<StateSegment> state_segments(Plan* plan) {
    GPT2* m = plan->model;
    if (!plan->use_dp && m->m_memory == NULL) { gpt2_allocate_optimizer(m); }   // as the first update would
    if (plan->use_dp) { dp_settle(&plan->dp); }   // the layer-wise pulls (dp_priority.h) in place before anything is read or written
    std::vector<OptSegment> segs = plan_opt_segments(plan);
    std::vector<StateSegment> out;
    if (!plan->use_dp) {   // one rank: it writes everything
        for (const OptSegment& s : segs) { out.push_back({s, 0, 1}); }
        return out;
    }
    const DataParallel* dp = &plan->dp;
    int mine = dp->ops->owners_disjoint || dp->rank == 0;
    int expert_replica0 = plan->nep > 1 ? plan->ep.edp.rank == 0 : dp->rank == 0;
    for (size_t i = 0; i < segs.size(); i++) {   // data parallelism's segments, then the experts'
        int experts = i >= dp->segments.size();
        out.push_back({segs[i], experts ? 0 : dp->offload, (experts ? expert_replica0 : mine) && dp_segment_counted(m, segs[i].tensor)});
    }
    return out;
}

// one kind of a segment's state, to or from host floats
static inline void state_segment_get(const StateSegment* g, int kind, float* host) {
    const OptSegment* s = &g->s;
    if (kind == KIND_PARAMS) { copy_floats_to_host(host, s->param, s->n); return; }
    const float* src = kind == KIND_MASTER ? s->master : kind == KIND_M ? s->m : s->v;
    if (g->on_host) { memcpy(host, src, s->n * sizeof(float)); }
    else { copy_device_to_host(host, src, s->n * sizeof(float)); }
}
static inline void state_segment_set(const StateSegment* g, int kind, const float* host) {
    const OptSegment* s = &g->s;
    float* dst = kind == KIND_MASTER ? s->master : kind == KIND_M ? s->m : s->v;
    if (g->on_host) { memcpy(dst, host, s->n * sizeof(float)); }
    else { copy_host_to_device(dst, host, s->n * sizeof(float)); }
}

// ---------------------------------------------------------------------------------------
// Reading a rank file: checked against the manifest's size and checksum, then its runs.

typedef struct {
    std::vector<StateRun> runs;
    std::vector<float> values;   // kinds x nvalues
    uint64_t nvalues;
    int has_master;
} StateFile;

static inline StateFile state_file_read(const Manifest* mf, int r) {
    char name[64];
    unsigned long long bytes = 0, hash = 0;
    if (sscanf(mf->files[r].c_str(), "%63s %llu %llx", name, &bytes, &hash) != 3) {
        die("'%s/manifest': bad file line '%s'", mf->step_dir.c_str(), mf->files[r].c_str());
    }
    std::string path = mf->step_dir + "/" + name;
    if (is_dir(path)) { die("'%s' is a directory, expected a rank file", path.c_str()); }
    FILE* f = fopen_or_die(path.c_str(), "rb");
    long size = file_size_or_die(f, path.c_str());
    if ((unsigned long long)size != bytes) {
        die("'%s' has %ld bytes, the manifest says %llu%s", path.c_str(), size, bytes, (unsigned long long)size < bytes ? ": truncated" : "");
    }
    std::vector<char> all((size_t)size);
    fread_or_die(all.data(), 1, all.size(), f, path.c_str());
    fclose(f);
    if (crc32_update(0, all.data(), all.size()) != hash) { die("'%s' is corrupt: its checksum does not match the manifest's", path.c_str()); }
    int64_t h[8];
    if (all.size() < sizeof(h)) { die("'%s': too short for a header", path.c_str()); }
    memcpy(h, all.data(), sizeof(h));
    if (h[0] != TRAIN_STATE_MAGIC || h[1] != TRAIN_STATE_FORMAT || h[2] != r || h[3] != mf->world || h[4] != mf->has_master) {
        die("'%s': header (magic %lld, format %lld, rank %lld of %lld) is not rank %d of this state's %d", path.c_str(),
            (long long)h[0], (long long)h[1], (long long)h[2], (long long)h[3], r, mf->world);
    }
    if ((uint64_t)h[7] != mf->identity) {
        die("'%s' belongs to run %016llx, the manifest to run %016llx: files of two runs mixed", path.c_str(),
            (unsigned long long)(uint64_t)h[7], (unsigned long long)mf->identity);
    }
    StateFile sf;
    sf.has_master = (int)h[4];
    sf.nvalues = (uint64_t)h[6];
    uint64_t nruns = (uint64_t)h[5], kinds = 3 + (uint64_t)sf.has_master;
    if (sizeof(h) + nruns * sizeof(StateRun) + kinds * sf.nvalues * sizeof(float) != all.size()) {
        die("'%s': %llu runs and %llu values do not fill its %zu bytes", path.c_str(), (unsigned long long)nruns,
            (unsigned long long)sf.nvalues, all.size());
    }
    sf.runs.resize(nruns);
    memcpy(sf.runs.data(), all.data() + sizeof(h), nruns * sizeof(StateRun));
    sf.values.resize(kinds * sf.nvalues);
    memcpy(sf.values.data(), all.data() + sizeof(h) + nruns * sizeof(StateRun), sf.values.size() * sizeof(float));
    uint64_t total = 0;
    for (const StateRun& run : sf.runs) {
        if (run.full + run.n > mf->num_parameters) { die("'%s': a run [%llu, +%llu) is outside the model's %zu parameters", path.c_str(), (unsigned long long)run.full, (unsigned long long)run.n, mf->num_parameters); }
        total += run.n;
    }
    if (total != sf.nvalues) { die("'%s': its runs hold %llu values, its header says %llu", path.c_str(), (unsigned long long)total, (unsigned long long)sf.nvalues); }
    // as --load refuses a checkpoint with a NaN: every value finite, and AdamW's v (a mean of squares) >= 0
    static const char* kinds_named[2][4] = {{"parameters", "m", "v", ""}, {"parameters", "master weights", "m", "v"}};
    for (uint64_t k = 0; k < kinds; k++) {
        const float* v = sf.values.data() + k * sf.nvalues;
        int is_v = k == kinds - 1;
        for (uint64_t i = 0; i < sf.nvalues; i++) {
            if (!isfinite(v[i]) || (is_v && v[i] < 0.0f)) {
                die("'%s': its %s value %llu is %g: a state holds finite values%s", path.c_str(), kinds_named[sf.has_master][k],
                    (unsigned long long)i, v[i], is_v ? " and v >= 0" : "");
            }
        }
    }
    return sf;
}

// The whole model's values of one kind, from every rank file. A bf16 state's parameters are the
// rounded ones the run used; with no master weights in the state, KIND_MASTER reads the
// parameters (an fp32 run's parameters are its master weights).
static inline std::vector<float> state_full(const Manifest* mf, int kind) {
    std::vector<float> full(mf->num_parameters, 0.0f);
    std::vector<unsigned char> seen(mf->num_parameters, 0);
    for (int r = 0; r < mf->world; r++) {
        StateFile sf = state_file_read(mf, r);
        int k = kind == KIND_MASTER && !sf.has_master ? KIND_PARAMS : kind;
        int block = k == KIND_PARAMS ? 0 : k == KIND_MASTER ? 1 : k - 1 + sf.has_master;
        const float* v = sf.values.data() + (size_t)block * sf.nvalues;
        for (const StateRun& run : sf.runs) {
            memcpy(full.data() + run.full, v, run.n * sizeof(float));
            if (memchr(seen.data() + run.full, 1, run.n)) {   // a replica is written once
                die("'%s': rank file %d holds parameters [%llu, +%llu) that another rank file holds too", mf->step_dir.c_str(), r,
                    (unsigned long long)run.full, (unsigned long long)run.n);
            }
            memset(seen.data() + run.full, 1, run.n);
            v += run.n;
        }
    }
    for (size_t i = 0; i < full.size(); i++) {
        if (!seen[i]) { die("'%s': no rank file holds parameter %zu of %zu: the state is incomplete", mf->step_dir.c_str(), i, full.size()); }
    }
    return full;
}

// One kind for every segment of this rank, cut from the full values.
static inline void state_fill_segments(const std::vector<StateSegment>& segs, GPT2* m, int kind, const std::vector<float>& full) {
    std::vector<float> host;
    std::vector<StateRun> runs;
    for (const StateSegment& g : segs) {
        if (kind == KIND_MASTER && !g.s.master) { continue; }
        runs.clear();
        tensor_full_runs(m, g.s.tensor, g.s.flat - m->param_info[g.s.tensor].offset, g.s.n, &runs);
        host.assign(g.s.n, 0.0f);   // what no run fills: vocab padding (tp_vocab_rows), zero
        size_t k = 0;
        for (const StateRun& r : runs) { memcpy(host.data() + k, full.data() + r.full, r.n * sizeof(float)); k += r.n; }
        state_segment_set(&g, kind, host.data());
    }
}
