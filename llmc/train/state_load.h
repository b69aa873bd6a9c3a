// Resuming from a training state (llmc/train/train_state.h), on the mesh that saved it or on
// any other: the model first (its shape and parameters, train_state_model), then, once the plan
// and the task exist, the optimizer's state, AdamW's t, the data position, the sampling RNG,
// the loss scale and the log (train_state_init). Every rank reads every rank file and keeps the
// values its own place and segments need (llmc/train/state_shards.h).
#pragma once

#include <string>
#include <vector>
#include <unistd.h>
#include "../common.h"
#include "../model/gpt2.h"
#include "../plan/train_args.h"
#include "../tasks/task.h"
#include "loss_scale.h"
#include "../plan/parallel_plan.h"
#include "train_state.h"
#include "state_manifest.h"
#include "state_shards.h"

// The model: from the state with --resume (its shape, its parameters cut to this rank's place),
// else as the flags say (llmc/plan/train_args.h).
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
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {   // each tensor where the config's model puts it
        std::string want = state_tensor_line(model, i);
        if (i >= (int)mf.tensors.size() || mf.tensors[i] != want) {
            die("'%s/manifest': tensor line %d is '%.80s', the model of its config has '%s'", mf.step_dir.c_str(), i + 1,
                i < (int)mf.tensors.size() ? mf.tensors[i].c_str() : "(none)", want.c_str());
        }
    }
    if ((int)mf.tensors.size() != NUM_PARAMETER_TENSORS) {
        die("'%s/manifest' has %zu tensor lines, the model %d", mf.step_dir.c_str(), mf.tensors.size(), NUM_PARAMETER_TENSORS);
    }
    // an fp32 run continues from the master weights of a bf16 state; a bf16 run from the
    // rounded parameters the saved run used (its master weights come in train_state_init)
    std::vector<float> full = state_full(&mf, BACKEND_MASTER_WEIGHTS ? KIND_PARAMS : KIND_MASTER);
    gpt2_set_parameters_from_full(model, full.data());
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
    if (!a->resume) {   // a new run: its identity, drawn on rank 0, for every rank's files
        unsigned long long id = 0;
        if (plan->rank == 0) {
            FILE* r = fopen("/dev/urandom", "rb");
            if (!r || fread(&id, sizeof(id), 1, r) != 1) { id = (unsigned long long)(wall_seconds() * 1e9) ^ ((unsigned long long)getpid() << 32); }
            if (r) { fclose(r); }
        }
        MPI_Bcast(&id, 1, MPI_UNSIGNED_LONG_LONG, 0, plan->world.mpi);
        ts->identity = id;
        return;
    }
    Manifest mf = manifest_read(a->resume);
    ts->identity = mf.identity;   // kept: the resumed run's states are the same run's
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
