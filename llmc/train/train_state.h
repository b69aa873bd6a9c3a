// The training state: what a run needs to stop and go on exactly where it was, on the same mesh
// or on another one (doc/training-state.md).
//
//   DIR/latest                     "step-00000005": the newest COMPLETE state (written last)
//   DIR/step-00000005/manifest     the mesh it was saved on, the model, the run's flags, each
//                                  tensor's place and split rule, every other file's size and
//                                  CRC-32, and last a line with the CRC-32 of the lines before it
//   DIR/step-00000005/position     where the run stands: step, the sampling RNG, the task's data
//                                  position (llmc/tasks/task.h: Position)
//   DIR/step-00000005/log          the --log lines written so far (and metrics: the --metrics CSV)
//   DIR/step-00000005/rank-00003.bin   rank 3's shard: parameters, master weights, AdamW m and v
//
// What a rank writes is what its optimizer updates (its OptSegments: llmc/parallel/dp_core.h),
// each element addressed by its index in the FULL model (the llm.c table order), so a file does
// not depend on the mesh that wrote it:
//   rank file: header int64[8] = [magic, format, rank, world, has_master, nruns, nvalues, 0]
//              runs: nruns x (full offset, count), uint64 each
//              values: nvalues floats of the parameters, then of the master weights (if
//              has_master), of m, of v; run after run in each block
// Replicas are written once: bucketed DDP's and naive DP's ranks all update everything, so dp
// rank 0 writes; ZeRO's and the parameter servers' ranks own disjoint parts and each writes its
// own; a tensor every tp rank holds whole is tp rank 0's; the tied wte is the first stage's
// (dp_segment_counted); an expert's replicas over edp are edp rank 0's.
//
// Saving is collective: every rank writes its file into DIR/step-K.tmp/; if any write fails
// (a full disk) the directory is removed and every rank stops, the previous state untouched;
// else rank 0 writes the manifest, renames the directory to DIR/step-K, points DIR/latest at it
// (temporary file + rename) and only then removes the previous step's directory. A crash at any
// moment leaves DIR/latest naming a complete state.
//
// Nothing of a state is trusted unchecked: on resume every file must match its checksum, and the
// files must agree with each other (the step of the directory's name, of the manifest, of the
// position file, and the log's lines 1..step) before any of it is used.
//
// Resuming on any mesh: every rank reads every file's runs, puts the values at their full
// indices, and keeps what its own place (tp shard, stage, experts) and its own segments
// (ZeRO block, server slice) need: resharding is the same code as resuming. Cost: each rank
// reads the whole state once (16 bytes per parameter with master weights, 12 without).
// (test/optimizer_state.h is the single-file optimizer state of one whole model, used by test_gpt2.)
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <string>
#include <vector>
#include "../common.h"
#include "../model/gpt2.h"
#include "train_args.h"
#include "model_from_args.h"
#include "../tasks/task.h"
#include "loss_scale.h"
#include "parallel_plan.h"

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
// Files: writes that report instead of dying (a failed save must clean up on every rank
// first), a checksum, a flat directory removed whole.

typedef struct {
    FILE* f;
    std::string path, err;
    uint64_t hash, bytes;
} StateWriter;

// CRC-32 (IEEE 802.3, as zlib's crc32 and Python's zlib.crc32 compute it): a corrupt rank file
// is caught before its numbers are used
static inline uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
    static uint32_t table[256];
    static int ready = 0;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) { c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1; }
            table[i] = c;
        }
        ready = 1;
    }
    const unsigned char* p = (const unsigned char*)data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) { crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8); }
    return ~crc;
}

static inline void sw_open(StateWriter* w, const std::string& path) {
    w->path = path;
    w->err.clear();
    w->hash = 0;
    w->bytes = 0;
    w->f = fopen(path.c_str(), "wb");
    if (!w->f) { w->err = "cannot create '" + path + "': " + strerror(errno); }
}
static inline void sw_write(StateWriter* w, const void* data, size_t bytes) {
    if (!w->err.empty()) { return; }
    if (fwrite(data, 1, bytes, w->f) != bytes) { w->err = "writing '" + w->path + "' failed: " + strerror(errno); return; }
    w->hash = crc32_update((uint32_t)w->hash, data, bytes);
    w->bytes += bytes;
}
// closes; on any error removes the file. Returns 1 when the file is complete.
static inline int sw_close(StateWriter* w) {
    if (w->f) {
        if (w->err.empty() && (fflush(w->f) != 0 || ferror(w->f))) { w->err = "writing '" + w->path + "' failed: " + strerror(errno); }
        if (fclose(w->f) != 0 && w->err.empty()) { w->err = "closing '" + w->path + "' failed: " + strerror(errno); }
        w->f = NULL;
    }
    if (!w->err.empty()) { unlink(w->path.c_str()); }
    return w->err.empty();
}

static inline void remove_flat_dir(const std::string& dir) {
    DIR* d = opendir(dir.c_str());
    if (!d) { return; }
    while (struct dirent* e = readdir(d)) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) { unlink((dir + "/" + e->d_name).c_str()); }
    }
    closedir(d);
    rmdir(dir.c_str());
}

static inline int is_dir(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

static inline std::string read_text_or_die(const std::string& path) {
    FILE* f = fopen_or_die(path.c_str(), "rb");   // (a directory: named as one)
    std::string s;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof(buf), f)) > 0) { s.append(buf, got); }
    fclose(f);
    return s;
}

// "key value..." lines -> key -> rest of the line (repeated keys: the "file" lines, kept in order)
static inline Position parse_lines(const std::string& text, std::vector<std::string>* files) {
    Position kv;
    size_t at = 0;
    while (at < text.size()) {
        size_t nl = text.find('\n', at);
        std::string line = text.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
        at = nl == std::string::npos ? text.size() : nl + 1;
        size_t sp = line.find(' ');
        if (line.empty() || sp == std::string::npos) { continue; }
        std::string key = line.substr(0, sp), value = line.substr(sp + 1);
        if (key == "file" && files) { files->push_back(value); } else { kv[key] = value; }
    }
    return kv;
}

// ---------------------------------------------------------------------------------------
// The manifest: what was saved, by which mesh, for which model and run.

typedef struct {
    std::string dir, step_dir;        // the state directory, and the step directory latest names
    int step, adamw_t, world, has_master;
    GPT2Config config;
    size_t num_parameters;
    Position kv;                      // every line, by key
    std::vector<std::string> files;   // "rank-00000.bin BYTES HASH", rank order
    Position pos;                     // the position file, checked
    std::string log, metrics;         // the log and metrics files, checked
} Manifest;

// "step-00000005" -> 5; -1 for any other text (the name is written with %08d: one spelling per step)
static inline int state_step_of(const std::string& name) {
    int k;
    const char* end;
    if (name.compare(0, 5, "step-") != 0 || !parse_count(name.c_str() + 5, &k, &end)) { return -1; }
    char want[32];
    snprintf(want, sizeof(want), "step-%08d", k);
    return name == want ? k : -1;
}
// what DIR/latest holds -> the step it names: exactly one line "step-NNNNNNNN"; -1 for anything else
static inline int state_latest_step(const std::string& text) {
    size_t n = text.size() - (!text.empty() && text.back() == '\n');
    return state_step_of(text.substr(0, n));
}

// The manifest's last line: "crc32 XXXXXXXX", the CRC-32 of every byte before it
static inline std::string state_crc_line(const std::string& body) {
    char buf[32];
    snprintf(buf, sizeof(buf), "crc32 %08x\n", crc32_update(0, body.data(), body.size()));
    return buf;
}

// A small file of the state (position, log, metrics): checked against the manifest's line
// "NAME BYTES CRC32" for it
static inline std::string state_text_read(const Manifest* mf, const char* name) {
    std::string path = mf->step_dir + "/" + name;
    auto it = mf->kv.find(name);
    unsigned long long bytes = 0, hash = 0;
    int end = 0;
    if (it == mf->kv.end() || sscanf(it->second.c_str(), "%llu %llx%n", &bytes, &hash, &end) != 2 || it->second[end] != 0) {
        die("'%s/manifest' has no valid '%s BYTES CRC32' line", mf->step_dir.c_str(), name);
    }
    std::string text = read_text_or_die(path);
    uint32_t crc = crc32_update(0, text.data(), text.size());
    if (text.size() != bytes || crc != hash) {
        die("'%s' is corrupt: %zu bytes with CRC-32 %08x, the manifest says %llu bytes with %08llx", path.c_str(),
            text.size(), crc, bytes, hash);
    }
    return text;
}

// The log holds one line per step done, "STEP LOSS NORM LR", steps 1 to the manifest's step
static inline void state_check_log(const std::string& log, int step, const std::string& path) {
    size_t at = 0;
    for (int s = 1; s <= step; s++) {
        size_t nl = log.find('\n', at);
        std::string line = log.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
        int k = 0;
        const char* end = NULL;
        if (nl == std::string::npos || !parse_count(line.c_str(), &k, &end) || k != s || *end != ' ') {
            die("'%s' does not agree with the manifest's step %d: its line %d is '%.40s', expected step %d's line", path.c_str(),
                step, s, line.c_str(), s);
        }
        at = nl + 1;
    }
    if (at != log.size()) { die("'%s' does not agree with the manifest's step %d: it has more than %d lines", path.c_str(), step, step); }
}

static inline std::string state_mesh_text(const Plan* plan) {
    const TrainArgs* a = plan->args;
    char buf[256];
    snprintf(buf, sizeof(buf), "dp %d tp %d pp %d cp %d ep %d | %s zero %d%s | sp %d | pp-schedule %s chunks %d",
             plan->ndp, plan->ntp, plan->npp, plan->ncp, plan->nep, a->dp_mode, a->zero, a->offload ? " offload" : "",
             a->sp, a->pp_schedule, a->pp_chunks);
    return buf;
}

// The flags that decide what the remaining steps compute: a resumed run must give the same
// (a different --lr or --clip is allowed: the run then continues on purpose differently).
static inline std::string state_run_text(const TrainArgs* a) {
    char buf[256];
    snprintf(buf, sizeof(buf), "task %s batch %d seq %d grad-accum %d seed %d", a->task, a->batch, a->seq, a->grad_accum,
             a->seed);
    return buf;
}

static inline Manifest manifest_read(const char* dir) {
    Manifest mf;
    mf.dir = dir;
    if (!is_dir(dir)) { die("--resume '%s': no such directory", dir); }
    std::string latest_path = mf.dir + "/latest";
    if (access(latest_path.c_str(), F_OK) != 0) {
        die("--resume '%s' holds no complete training state (no 'latest' file: the save never finished, or this is "
            "not a state directory)", dir);
    }
    std::string latest = read_text_or_die(latest_path);
    int dir_step = state_latest_step(latest);
    if (dir_step < 0) {
        die("'%s' must hold one line naming a step directory (step-NNNNNNNN), it holds '%.64s'%s", latest_path.c_str(),
            latest.c_str(), latest.size() > 64 ? "..." : "");
    }
    char name[32];
    snprintf(name, sizeof(name), "step-%08d", dir_step);
    latest = name;   // (without its newline)
    mf.step_dir = mf.dir + "/" + latest;
    std::string path = mf.step_dir + "/manifest";
    if (access(path.c_str(), F_OK) != 0) { die("'%s' names '%s', which has no manifest: the state is incomplete", latest_path.c_str(), latest.c_str()); }
    std::string text = read_text_or_die(path);
    const char* p = path.c_str();
    if (text.compare(0, 22, "llmc training state 2\n") != 0) {
        die("'%s' is not a training-state manifest (format 2): it starts '%.21s'", p, text.c_str());
    }
    size_t last = text.size() < 2 ? std::string::npos : text.rfind('\n', text.size() - 2);   // the last line's start - 1
    if (last == std::string::npos || text.back() != '\n' || text.compare(last + 1, 6, "crc32 ") != 0) {
        die("'%s' does not end with its checksum line 'crc32 XXXXXXXX': it is cut short or was edited", p);
    }
    if (text.compare(last + 1, std::string::npos, state_crc_line(text.substr(0, last + 1))) != 0) {
        die("'%s' is corrupt: its lines do not match its checksum line '%s'", p, text.substr(last + 1, 14).c_str());
    }
    mf.kv = parse_lines(text, &mf.files);
    mf.step = position_get_int(&mf.kv, "step", p);
    if (mf.step != dir_step) { die("'%s' says step %d, its directory is %s", p, mf.step, latest.c_str()); }
    mf.adamw_t = position_get_int(&mf.kv, "adamw_t", p);
    mf.world = position_get_int(&mf.kv, "world", p);
    mf.has_master = position_get_int(&mf.kv, "has_master", p);
    mf.num_parameters = (size_t)position_get(&mf.kv, "parameters", p);
    GPT2Config c;
    memset(&c, 0, sizeof(c));
    unsigned cf = 0, aux = 0;
    auto it = mf.kv.find("config");
    // "L 6 NH 4 C 128 maxT 128 V 257 Vp 320 E 0 k 0 N 0 cf HEX aux HEX": each count whole and within an int
    const char* keys[] = {"L", "NH", "C", "maxT", "V", "Vp", "E", "k", "N", "cf", "aux"};
    int* counts[] = {&c.num_layers, &c.num_heads, &c.channels, &c.max_seq_len, &c.vocab_size, &c.padded_vocab_size,
                     &c.num_experts, &c.moe_topk, &c.moe_every};
    unsigned* bits[] = {&cf, &aux};
    std::vector<std::string> w;
    for (size_t at = 0; it != mf.kv.end() && at <= it->second.size();) {
        size_t sp = std::min(it->second.find(' ', at), it->second.size());
        w.push_back(it->second.substr(at, sp - at));
        at = sp + 1;
    }
    int ok = w.size() == 22;
    for (int i = 0; ok && i < 11; i++) {
        const char* v = w[2 * i + 1].c_str();
        const char* end = v;
        char* hex_end = NULL;
        ok = w[2 * i] == keys[i] && (i < 9 ? parse_count(v, counts[i], &end) && *end == 0
                                           : (*bits[i - 9] = (unsigned)strtoul(v, &hex_end, 16), *v && *hex_end == 0 && strlen(v) <= 8));
    }
    if (!ok) { die("'%s': no valid 'config' line", p); }
    c.moe_capacity = bits_float((int)cf);
    c.moe_aux = bits_float((int)aux);
    mf.config = c;
    if ((int)mf.files.size() != mf.world || mf.world < 1) {
        die("'%s' lists %zu rank files for a world of %d ranks: the state is incomplete", p, mf.files.size(), mf.world);
    }
    // the small files: each its checksum, and the step they are for
    std::string ppath = mf.step_dir + "/position";
    mf.pos = parse_lines(state_text_read(&mf, "position"), NULL);
    int pstep = position_get_int(&mf.pos, "trainer.step", ppath.c_str());
    if (pstep != mf.step) { die("'%s' is for step %d, the manifest for step %d", ppath.c_str(), pstep, mf.step); }
    mf.log = state_text_read(&mf, "log");
    state_check_log(mf.log, mf.step, mf.step_dir + "/log");
    mf.metrics = state_text_read(&mf, "metrics");
    return mf;
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
            memset(seen.data() + run.full, 1, run.n);
            v += run.n;
        }
    }
    for (size_t i = 0; i < full.size(); i++) {
        if (!seen[i]) { die("'%s': no rank file holds parameter %zu of %zu: the state is incomplete", mf->step_dir.c_str(), i, full.size()); }
    }
    return full;
}

// ---------------------------------------------------------------------------------------
// The trainer's side.

typedef struct {
    Plan* plan;
    Task* task;
    const TrainArgs* args;
    LossScaler* scaler;     // --loss-scale: S, its clean-step count and the steps skipped travel with the state
    int first_step;         // the loop starts here: 0, or the saved step with --resume
    int resumed;
    std::string log;        // the --log lines so far (rank 0), saved with the state
} TrainState;

// The model: from the state with --resume (its shape, its parameters cut to this rank's place),
// else as the flags say (llmc/train/train_args.h).
static inline void train_state_model(GPT2* model, const TrainArgs* a, PlaceFn place, void* ctx) {
    if (!a->resume) { gpt2_from_args(model, a, place, ctx); return; }
    Manifest mf = manifest_read(a->resume);
    GPT2Config c = mf.config;
    // the same command line with --resume added must work: shape flags are allowed when they match
    struct { const char* flag; int given, saved; } shape[] = {
        {"layers", a->layers, c.num_layers}, {"heads", a->heads, c.num_heads}, {"channels", a->channels, c.channels},
        {"max-seq", a->max_seq, c.max_seq_len}, {"vocab", a->vocab, c.vocab_size}, {"moe-experts", a->moe_experts, c.num_experts}};
    for (auto& s : shape) {
        if (s.given && s.given != s.saved) {
            die("--resume '%s' holds a model with --%s %d, the flags say %d: the state decides the shape (drop the flag)",
                a->resume, s.flag, s.saved, s.given);
        }
    }
    if (a->moe_experts && (a->moe_topk != c.moe_topk || a->moe_every != c.moe_every)) {
        die("--resume '%s' holds top-%d experts every %d blocks, the flags say --moe-topk %d --moe-every %d", a->resume,
            c.moe_topk, c.moe_every, a->moe_topk, a->moe_every);
    }
    if (a->moe_capacity > 0.0f) { c.moe_capacity = a->moe_capacity; }
    if (a->moe_aux >= 0.0f) { c.moe_aux = a->moe_aux; }
    gpt2_check_config(&c);
    if (a->ep > 1 && (!gpt2_is_moe(&c) || c.num_experts % a->ep != 0)) {
        die("--ep %d does not divide the %d experts of the state in '%s'", a->ep, c.num_experts, a->resume);
    }
    GPT2Place p = place(ctx, &c);
    gpt2_build_shard(model, &c, &p);
    if (model->num_parameters_full != mf.num_parameters) {
        die("'%s': the manifest says %zu parameters, its model has %zu", mf.step_dir.c_str(), mf.num_parameters, model->num_parameters_full);
    }
    // an fp32 run continues from the master weights of a bf16 state; a bf16 run from the
    // rounded parameters the saved run used (its master weights come in train_state_init)
    std::vector<float> full = state_full(&mf, BACKEND_MASTER_WEIGHTS ? KIND_PARAMS : KIND_MASTER);
    gpt2_set_parameters_from_full(model, full.data());
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

// After the plan and the task exist. Without --resume: start at step 0. With it: the optimizer
// state of this rank's segments, AdamW's t, the data position, the sampling RNG and the log
// lines so far; the flags that decide the remaining steps must match the saved run's.
static inline void train_state_init(TrainState* ts, Plan* plan, Task* task, const TrainArgs* a, Rng* sample_rng,
                                    LossScaler* scaler) {
    ts->plan = plan;
    ts->task = task;
    ts->args = a;
    ts->scaler = scaler;
    ts->first_step = 0;
    ts->resumed = a->resume != NULL;
    ts->log.clear();
    if (!a->resume) { return; }
    Manifest mf = manifest_read(a->resume);
    const char* mpath = mf.step_dir.c_str();
    std::string run = state_run_text(a), saved = mf.kv.count("run") ? mf.kv["run"] : "";
    if (run != saved) {
        die("--resume '%s': the state was saved by a run with '%s', this one has '%s': give the same --task, --batch, "
            "--seq, --grad-accum and --seed", a->resume, saved.c_str(), run.c_str());
    }
    int saved_steps = position_get_int(&mf.kv, "steps", mpath);
    if (mf.step > a->steps) { die("--resume '%s' is at step %d, past --steps %d", a->resume, mf.step, a->steps); }
    if (saved_steps != a->steps) {   // allowed (a run extended), but the schedule is not the saved run's
        printf("note         --steps %d, the saved run had %d: the learning-rate schedule changes from step %d on\n", a->steps,
               saved_steps, mf.step + 1);
    }
    GPT2* m = plan->model;
    std::vector<StateSegment> segs = state_segments(plan);
    int kinds[3] = {KIND_M, KIND_V, KIND_MASTER};
    for (int kind : kinds) {
        int wanted = kind != KIND_MASTER;
        for (const StateSegment& g : segs) { wanted |= g.s.master != NULL; }
        if (!wanted) { continue; }
        std::vector<float> full = state_full(&mf, kind);
        state_fill_segments(segs, m, kind, full);
    }
    m->step = mf.adamw_t;
    std::string ppath = mf.step_dir + "/position";
    Position pos = mf.pos;   // (checked by manifest_read, as the log and the metrics)
    sample_rng->state = position_get(&pos, "trainer.sample_rng", ppath.c_str());
    task->heldout = bits_float((int)(uint32_t)position_get(&pos, "trainer.heldout_bits", ppath.c_str()));
    if (scaler->on && pos.count("trainer.loss_scale_bits")) {   // a state saved without scaling: S starts afresh
        scaler->scale = bits_float((int)(uint32_t)position_get(&pos, "trainer.loss_scale_bits", ppath.c_str()));
        scaler->clean = position_get_int(&pos, "trainer.loss_scale_clean", ppath.c_str());
        scaler->skipped = position_get_int(&pos, "trainer.loss_scale_skipped", ppath.c_str());
    }
    task->set_position(task, &pos, ppath.c_str());
    ts->log = mf.log;
    const std::string& metrics = mf.metrics;
    if (task->metrics && !metrics.empty()) {   // the saved CSV (with its header) replaces the fresh header
        if (fflush(task->metrics) != 0 || ftruncate(fileno(task->metrics), 0) != 0 || fseek(task->metrics, 0, SEEK_SET) != 0) {
            die("cannot rewrite '%s': %s", task->metrics_tmp.c_str(), strerror(errno));
        }
        fputs(metrics.c_str(), task->metrics);
    }
    ts->first_step = mf.step;
    int same = mf.kv["mesh"] == state_mesh_text(plan) && mf.world == plan->world_size;
    printf("resumed      %s at step %d (AdamW t %d), saved on %d ranks [%s]%s\n", mpath, mf.step, mf.adamw_t, mf.world,
           mf.kv["mesh"].c_str(), same ? "" : ": resharded to this mesh");
    if (mf.kv["backend"] != BACKEND_NAME) {   // bf16 <-> fp32: the fp32 values carry over, the rounding differs
        printf("note         saved by the %s backend, continued on the %s one\n", mf.kv["backend"].c_str(), BACKEND_NAME);
    }
    if (a->load) { printf("note         the weights come from the state; --load '%s' only seeds what the task builds from it (RLVR's reference)\n", a->load); }
}

// Whether the state is saved before step `step` (after `step` updates): every
// --save-state-every steps, at --exit-after, and at the end.
static inline int train_state_due(const TrainState* ts, int step) {
    const TrainArgs* a = ts->args;
    if (!a->save_state || (ts->resumed && step == ts->first_step)) { return 0; }
    return step == a->steps || (a->exit_after > 0 && step == a->exit_after) || (a->save_state_every > 0 && step > 0 && step % a->save_state_every == 0);
}

// What a failed save leaves in DIR: the previous state (the step latest names), or none
static inline std::string state_kept(const std::string& dir, int previous) {
    char buf[64];
    if (previous < 0) { return "no state was saved in '" + dir + "' (it held none before)"; }
    snprintf(buf, sizeof(buf), "' keeps the previous state, step-%08d", previous);
    return "'" + dir + buf;
}

// Every rank's file into DIR/step-K.tmp; all ranks agree on success before anything is published.
static inline void train_state_save(TrainState* ts, int step, const Rng* sample_rng) {
    Plan* plan = ts->plan;
    GPT2* m = plan->model;
    const TrainArgs* a = ts->args;
    MPI_Comm world = plan->world.mpi;
    int rank = plan->rank, nranks = plan->world_size;
    std::string dir = a->save_state;
    char name[32];
    snprintf(name, sizeof(name), "step-%08d", step);
    std::string final_dir = dir + "/" + name, tmp_dir = final_dir + ".tmp";
    double t0 = wall_seconds();
    // 1. rank 0 makes the directories, and tells every rank which state a failed save keeps
    int ok = 1, previous = -1;   // the step of the state DIR holds now (-1: none)
    std::string err, latest = dir + "/latest";
    if (rank == 0) {
        if (access(latest.c_str(), F_OK) == 0) { previous = state_latest_step(read_text_or_die(latest)); }
        if (!is_dir(dir) && mkdir(dir.c_str(), 0755) != 0) { err = "cannot create '" + dir + "': " + strerror(errno); }
        if (DIR* d = opendir(dir.c_str())) {   // step-*.tmp: left by saves that crashed (never published)
            std::vector<std::string> stale;
            while (struct dirent* e = readdir(d)) {
                std::string n = e->d_name;
                if (n.compare(0, 5, "step-") == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0) { stale.push_back(n); }
            }
            closedir(d);
            for (const std::string& n : stale) { remove_flat_dir(dir + "/" + n); }
        }
        if (err.empty() && mkdir(tmp_dir.c_str(), 0755) != 0) { err = "cannot create '" + tmp_dir + "': " + strerror(errno); }
        ok = err.empty();
    }
    int told[2] = {ok, previous};
    MPI_Bcast(told, 2, MPI_INT, 0, world);
    ok = told[0];
    previous = told[1];
    if (!ok) {
        if (rank == 0) { die("saving the training state: %s", err.c_str()); }
        die("saving the training state failed on rank 0");
    }
    // 2. every rank its file
    std::vector<StateSegment> segs = state_segments(plan);
    std::vector<StateRun> runs;
    std::vector<const StateSegment*> mine;
    std::vector<size_t> real;   // of each segment of mine: the first `real` values have runs (the rest: vocab padding)
    for (const StateSegment& g : segs) {
        if (!g.write) { continue; }
        mine.push_back(&g);
        real.push_back(tensor_full_runs(m, g.s.tensor, g.s.flat - m->param_info[g.s.tensor].offset, g.s.n, &runs));
    }
    int has_master = 0;
    for (const StateSegment& g : segs) { has_master |= g.s.master != NULL; }
    MPI_Allreduce(MPI_IN_PLACE, &has_master, 1, MPI_INT, MPI_MAX, world);   // ranks with no segment (PS workers) too
    uint64_t nvalues = 0;
    for (const StateRun& r : runs) { nvalues += r.n; }
    int64_t header[8] = {TRAIN_STATE_MAGIC, TRAIN_STATE_FORMAT, rank, nranks, has_master, (int64_t)runs.size(), (int64_t)nvalues, 0};
    char fname[32];
    snprintf(fname, sizeof(fname), "rank-%05d.bin", rank);
    StateWriter w;
    sw_open(&w, tmp_dir + "/" + fname);
    sw_write(&w, header, sizeof(header));
    sw_write(&w, runs.data(), runs.size() * sizeof(StateRun));
    std::vector<float> host;
    for (int kind = 0; kind < TRAIN_STATE_KINDS; kind++) {
        if (kind == KIND_MASTER && !has_master) { continue; }
        for (size_t j = 0; j < mine.size(); j++) {
            const StateSegment* g = mine[j];
            host.resize(g->s.n);
            // a segment without master weights beside ones with them (fp32 experts next to the offloaded
            // dense part): its parameters are its fp32 master weights
            state_segment_get(g, kind == KIND_MASTER && !g->s.master ? KIND_PARAMS : kind, host.data());
            sw_write(&w, host.data(), real[j] * sizeof(float));
        }
    }
    ok = sw_close(&w);
    // 3. all or nothing
    int all_ok = ok;
    MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, world);
    if (!all_ok) {
        MPI_Barrier(world);   // every rank's file closed (and removed where it failed)
        if (rank == 0) { remove_flat_dir(tmp_dir); }
        MPI_Barrier(world);
        if (!ok) { die("saving the training state: %s; %s", w.err.c_str(), state_kept(dir, previous).c_str()); }
        die("saving the training state failed on another rank (see its message); %s", state_kept(dir, previous).c_str());
    }
    unsigned long long mine_info[2] = {w.bytes, w.hash};
    std::vector<unsigned long long> infos(2 * (size_t)nranks);
    MPI_Gather(mine_info, 2, MPI_UNSIGNED_LONG_LONG, infos.data(), 2, MPI_UNSIGNED_LONG_LONG, 0, world);
    // 4. rank 0: position, log, manifest, then publish
    if (rank == 0) {
        Position pos;
        position_put(&pos, "trainer.step", (unsigned long long)step);   // (checked against the manifest's on resume)
        position_put(&pos, "trainer.sample_rng", sample_rng->state);
        position_put(&pos, "trainer.heldout_bits", (uint32_t)float_bits(ts->task->heldout));   // not yet reported (NaN: none)
        if (ts->scaler->on) {
            position_put(&pos, "trainer.loss_scale_bits", (uint32_t)float_bits(ts->scaler->scale));
            position_put(&pos, "trainer.loss_scale_clean", (unsigned long long)ts->scaler->clean);
            position_put(&pos, "trainer.loss_scale_skipped", (unsigned long long)ts->scaler->skipped);
        }
        ts->task->get_position(ts->task, &pos);
        std::string ptext, mtext;
        for (auto& kv : pos) { ptext += kv.first + " " + kv.second + "\n"; }
        const GPT2Config* c = &m->config;
        char buf[512];
        snprintf(buf, sizeof(buf),
                 "llmc training state 2\nstep %d\nadamw_t %d\nworld %d\nhas_master %d\nparameters %zu\n"
                 "config L %d NH %d C %d maxT %d V %d Vp %d E %d k %d N %d cf %x aux %x\n",
                 step, m->step, nranks, has_master, m->num_parameters_full, c->num_layers, c->num_heads, c->channels,
                 c->max_seq_len, c->vocab_size, c->padded_vocab_size, c->num_experts, c->moe_topk, c->moe_every,
                 (unsigned)float_bits(c->moe_capacity), (unsigned)float_bits(c->moe_aux));
        mtext = buf;
        mtext += "mesh " + state_mesh_text(plan) + "\nbackend " + BACKEND_NAME + "\nrun " + state_run_text(a) + "\nsteps " +
                 std::to_string(a->steps) + "\n";
        // each tensor's place in the full model and how the mesh splits it (for the reader: the rank files
        // address the full model, so loading needs none of this)
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            const ParamInfo* p = &m->full_info[i];
            std::string shape;
            for (int d = 0; d < p->ndim; d++) { shape += (d ? "x" : "") + std::to_string(p->full[d]); }
            static const char* sets[] = {"all", "dense", "moe"};
            snprintf(buf, sizeof(buf), "tensor %s offset %zu numel %zu shape %s tp-split %s layers %s%s\n", p->name, p->offset,
                     p->numel, p->numel ? shape.c_str() : "-", shard_name(p->shard), p->layered ? sets[p->layers] : "-",
                     p->experts ? " ep-split experts" : "");
            mtext += buf;
        }
        for (int r = 0; r < nranks; r++) {
            snprintf(buf, sizeof(buf), "file rank-%05d.bin %llu %llx\n", r, infos[2 * r], infos[2 * r + 1]);
            mtext += buf;
        }
        std::string metrics;   // the --metrics CSV so far (rlvr), continued by a resumed run
        if (ts->task->metrics) {
            fflush(ts->task->metrics);
            metrics = read_text_or_die(ts->task->metrics_tmp);
        }
        const std::string* texts[4] = {&ptext, &ts->log, &metrics, &mtext};
        const char* names[4] = {"position", "log", "metrics", "manifest"};   // the manifest last
        for (int k = 0; k < 3; k++) {   // each small file's size and CRC-32, then the manifest's own checksum
            snprintf(buf, sizeof(buf), "%s %zu %08x\n", names[k], texts[k]->size(), crc32_update(0, texts[k]->data(), texts[k]->size()));
            mtext += buf;
        }
        mtext += state_crc_line(mtext);
        for (int i = 0; i < 4 && err.empty(); i++) {
            sw_open(&w, tmp_dir + "/" + names[i]);
            sw_write(&w, texts[i]->data(), texts[i]->size());
            if (!sw_close(&w)) { err = w.err; }
        }
        if (err.empty()) {
            remove_flat_dir(final_dir);   // the same step saved again (a resumed run)
            if (rename(tmp_dir.c_str(), final_dir.c_str()) != 0) { err = "cannot rename '" + tmp_dir + "': " + strerror(errno); }
        }
        if (err.empty()) {
            sw_open(&w, latest + ".tmp");
            std::string line = std::string(name) + "\n";
            sw_write(&w, line.c_str(), line.size());
            if (!sw_close(&w)) { err = w.err; }
            else if (rename((latest + ".tmp").c_str(), latest.c_str()) != 0) {
                err = "cannot rename '" + latest + ".tmp': " + strerror(errno);
                unlink((latest + ".tmp").c_str());
            }
        }
        if (!err.empty()) {
            remove_flat_dir(tmp_dir);
            if (previous != step) { remove_flat_dir(final_dir); }
            die("saving the training state: %s; %s", err.c_str(), state_kept(dir, previous).c_str());
        }
        if (previous >= 0 && previous != step) {   // (latest named a step directory: nothing else is ever removed)
            char old[32];
            snprintf(old, sizeof(old), "step-%08d", previous);
            remove_flat_dir(dir + "/" + old);
        }
        unsigned long long total = 0;
        for (int r = 0; r < nranks; r++) { total += infos[2 * r]; }
        // each parameter once: 4 bytes of parameters, m, v (and master weights): K = 12 or 16 bytes
        unsigned long long K = 4ull * (3 + has_master), payload = K * m->num_parameters_full;
        printf("saved state  %s (step %d, %d rank files, %.2f MiB = %llu bytes x %zu parameters + %.1f KiB of headers "
               "and index, %.0f ms)\n", final_dir.c_str(), step, nranks, total / 1048576.0, K, m->num_parameters_full,
               (double)(total - payload) / 1024.0, (wall_seconds() - t0) * 1e3);
    }
    MPI_Barrier(world);
}
