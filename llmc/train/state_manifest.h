// The manifest of a training state (llmc/train/train_state.h): what was saved, by which mesh,
// for which model and run, one "KEY VALUE" line each, written last by rank 0:
//   llmc training state 2                the format
//   step, adamw_t, world, has_master,    the step saved after, AdamW's t, the ranks that wrote,
//   parameters                           whether master weights are in, the full model's size
//   config L .. NH .. C .. (cf, aux: hex bits of two floats)   the model's shape
//   mesh, backend, run, steps            the mesh and backend it ran on; the flags that decide
//                                        the remaining steps (a resumed run must give the same)
//   tensor NAME offset .. tp-split ..    each tensor's place in the full model and its split
//   file rank-00003.bin BYTES CRC32      each rank file, rank order
//   position|log|metrics BYTES CRC32     each small file
//   crc32 XXXXXXXX                       the CRC-32 of every byte before this line
// manifest_read checks all of it, and the small files against it, before anything is used: the
// step of the directory's name, of the manifest, of the position file, and the log's lines.
#pragma once

#include <string>
#include <vector>
#include "../common.h"
#include "../model/gpt2.h"
#include "../plan/train_args.h"
#include "../tasks/task.h"
#include "../plan/parallel_plan.h"
#include "state_files.h"

// A manifest read and checked, with the small files it vouches for
typedef struct {
    std::string dir, step_dir;        // the state directory, and the step directory latest names
    int step, adamw_t, world, has_master;
    uint64_t identity;                // the run's (llmc/train/train_state.h)
    std::vector<std::string> tensors; // the "tensor ..." lines, in order
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

// AdamW's t follows from the log: one update per step but those whose gradient norm was not
// finite (--on-nan skip, a loss-scale overflow: no AdamW, t unchanged)
static inline void state_check_adamw_t(const Manifest* mf) {
    int skipped = 0;
    for (size_t at = 0; at < mf->log.size();) {
        size_t nl = mf->log.find('\n', at);
        double loss = 0, norm = 0;
        char nb[32] = "";
        if (sscanf(mf->log.c_str() + at, "%*d %lf %31s", &loss, nb) == 2) { norm = strtod(nb, NULL); skipped += !isfinite(norm); }
        at = nl == std::string::npos ? mf->log.size() : nl + 1;
    }
    if (mf->adamw_t != mf->step - skipped) {
        die("'%s/manifest': AdamW t %d, but %d steps with %d skipped (a norm not finite in the log) make t %d: the manifest "
            "was edited", mf->step_dir.c_str(), mf->adamw_t, mf->step, skipped, mf->step - skipped);
    }
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

// The manifest's text, read back by manifest_read: `files` holds each rank file's size and
// CRC-32 (rank order), `small` the position, log and metrics texts.
// Tensor i's line: its place in the full model and how the mesh splits it (checked on resume
// against the model the config builds)
static inline std::string state_tensor_line(const GPT2* m, int i) {
    const ParamInfo* p = &m->full_info[i];
    std::string shape;
    for (int d = 0; d < p->ndim; d++) { shape += (d ? "x" : "") + std::to_string(p->full[d]); }
    static const char* sets[] = {"all", "dense", "moe"};
    char buf[256];
    snprintf(buf, sizeof(buf), "%s offset %zu numel %zu shape %s tp-split %s layers %s%s", p->name, p->offset, p->numel,
             p->numel ? shape.c_str() : "-", shard_name(p->shard), p->layered ? sets[p->layers] : "-", p->experts ? " ep-split experts" : "");
    return buf;
}

static inline std::string manifest_text(const Plan* plan, const TrainArgs* a, int step, int has_master, uint64_t identity,
                                        const std::vector<unsigned long long>& files, const std::string* const small[3]) {
    const GPT2* m = plan->model;
    int nranks = plan->world_size;
    const GPT2Config* c = &m->config;
    char buf[512];
    snprintf(buf, sizeof(buf),
             "llmc training state 2\nstep %d\nadamw_t %d\nworld %d\nhas_master %d\nparameters %zu\nidentity %016llx\n"
             "config L %d NH %d C %d maxT %d V %d Vp %d E %d k %d N %d cf %x aux %x\n",
             step, m->step, nranks, has_master, m->num_parameters_full, (unsigned long long)identity, c->num_layers, c->num_heads, c->channels,
             c->max_seq_len, c->vocab_size, c->padded_vocab_size, c->num_experts, c->moe_topk, c->moe_every,
             (unsigned)float_bits(c->moe_capacity), (unsigned)float_bits(c->moe_aux));
    std::string mtext = buf;
    mtext += "mesh " + state_mesh_text(plan) + "\nbackend " + BACKEND_NAME + "\nrun " + state_run_text(a) + "\nsteps " +
             std::to_string(a->steps) + "\n";
    // each tensor's place in the full model and how the mesh splits it (for the reader: the rank files
    // address the full model, so loading needs none of this)
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { mtext += "tensor " + state_tensor_line(m, i) + "\n"; }
    for (int r = 0; r < nranks; r++) {
        snprintf(buf, sizeof(buf), "file rank-%05d.bin %llu %llx\n", r, files[2 * r], files[2 * r + 1]);
        mtext += buf;
    }
    static const char* names[3] = {"position", "log", "metrics"};
    for (int k = 0; k < 3; k++) {   // each small file's size and CRC-32, then the manifest's own checksum
        snprintf(buf, sizeof(buf), "%s %zu %08x\n", names[k], small[k]->size(), crc32_update(0, small[k]->data(), small[k]->size()));
        mtext += buf;
    }
    return mtext + state_crc_line(mtext);
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
    auto id = mf.kv.find("identity");
    if (id == mf.kv.end() || id->second.size() != 16 || strspn(id->second.c_str(), "0123456789abcdef") != 16) {
        die("'%s' has no valid 'identity' line (16 hex digits: the run it belongs to)", p);
    }
    mf.identity = strtoull(id->second.c_str(), NULL, 16);
    for (size_t at = 0; at < text.size();) {   // the tensor lines, in order (parse_lines keeps one per key)
        size_t nl = text.find('\n', at);
        if (text.compare(at, 7, "tensor ") == 0) { mf.tensors.push_back(text.substr(at + 7, nl - at - 7)); }
        at = nl + 1;
    }
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
    unsigned long long pid = position_get(&mf.pos, "trainer.identity", ppath.c_str());
    if (pid != mf.identity) {
        die("'%s' belongs to run %016llx, the manifest to run %016llx: files of two runs mixed", ppath.c_str(), pid,
            (unsigned long long)mf.identity);
    }
    mf.log = state_text_read(&mf, "log");
    state_check_log(mf.log, mf.step, mf.step_dir + "/log");
    state_check_adamw_t(&mf);
    mf.metrics = state_text_read(&mf, "metrics");
    return mf;
}
