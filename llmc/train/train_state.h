// The training state: what a run needs to stop and go on exactly where it was, on the same mesh
// or on another one (doc/training-state.md). This file says what it is and when it is saved;
// the code is in:
//   state_save.h       train_state_save: every rank its file, then rank 0 the manifest; all or nothing
//   state_load.h       train_state_model, train_state_init: resuming, on any mesh
//   state_shards.h     where a rank's values sit in the full model; the rank files read back
//   state_manifest.h   the manifest, its format and every check of a state directory
//   state_files.h      checksummed writes, directories, text files
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
//   rank file: header int64[8] = [magic, format, rank, world, has_master, nruns, nvalues, identity]
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
// position file, and the log's lines 1..step) before any of it is used. A state belongs to one
// run: the run's identity (64 random bits drawn at its start, kept by every resume) is in the
// manifest, the position file and every rank file's header, so files of two runs never mix even
// when their checksums were made to match. And every value that follows from others is checked
// against them: AdamW's t is the step less the steps whose norm the log shows not finite
// (skipped), the data position is where that many micro-batches from the start of the shards end,
// each tensor line is the place its model puts it, m, v and the weights are finite and v >= 0.
//
// Resuming on any mesh: every rank reads every file's runs, puts the values at their full
// indices, and keeps what its own place (tp shard, stage, experts) and its own segments
// (ZeRO block, server slice) need: resharding is the same code as resuming. Cost: each rank
// reads the whole state once (16 bytes per parameter with master weights, 12 without).
// (test/optimizer_state.h is the single-file optimizer state of one whole model, used by test_gpt2.)
#pragma once

#include <string>
#include "../common.h"
#include "../plan/train_args.h"
#include "model_from_args.h"
#include "../tasks/task.h"
#include "loss_scale.h"
#include "../plan/parallel_plan.h"

// What the trainer holds of it: the run it saves, and where a resumed run starts.
typedef struct {
    Plan* plan;
    Task* task;
    const TrainArgs* args;
    LossScaler* scaler;     // --loss-scale: S, its clean-step count and the steps skipped travel with the state
    int first_step;         // the loop starts here: 0, or the saved step with --resume
    int resumed;
    std::string log;        // the --log lines so far (rank 0), saved with the state
    uint64_t identity;      // the run's: drawn at its start, kept across resumes, in every file of its state
} TrainState;

// Whether the state is saved before step `step` (after `step` updates): every
// --save-state-every steps, at --exit-after, and at the end.
static inline int train_state_due(const TrainState* ts, int step) {
    const TrainArgs* a = ts->args;
    if (!a->save_state || (ts->resumed && step == ts->first_step)) { return 0; }
    return step == a->steps || (a->exit_after > 0 && step == a->exit_after) || (a->save_state_every > 0 && step > 0 && step % a->save_state_every == 0);
}
