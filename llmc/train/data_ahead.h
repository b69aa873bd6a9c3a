// Bad data found during the run costs no finished step. Small data is checked whole before step 1
// (llmc/data/token_shards.h); a dataset of more than 2^26 tokens is checked as the run reaches it:
// before each step, the shards the step would move into are read and checked (dataloader_look_ahead).
// Every rank reads the same shards in the same order, so every rank meets a bad one before the
// same step, without asking the others (a rank that did not, its files differing, would leave the
// save waiting: the --comm-timeout watchdog names it): the ranks save the training state
// (--save-state) as it stands after the steps done, and every rank ends naming the shard and the
// way back (fix it, keep its length, --resume: the data position is derived from the shards' lengths).
#pragma once

#include <string>
#include "../common.h"
#include "../tasks/task.h"
#include "train_state.h"
#include "state_save.h"

// Before step `step` (after `step` updates): returns when the data ahead is good, else ends the
// run, the state saved first (collective: every rank finds the same shard at the same step).
static inline void train_data_ahead(TrainState* ts, int step, const Rng* sample_rng) {
    Task* t = ts->task;
    std::string why = t->look_ahead ? t->look_ahead(t) : "";
    if (why.empty()) { return; }   // no collective on the good path: asynchronous workers never wait for each other here
    const char* dir = ts->args->save_state;
    std::string kept = "the " + std::to_string(step) + " steps done are lost (--save-state DIR keeps them)";
    if (dir) {
        int saved = train_state_due(ts, step) || (ts->resumed && step == ts->first_step);   // this step's state is there already
        if (!saved) { train_state_save(ts, step, sample_rng); }
        kept = std::string("the training state is saved in '") + dir + "' (step " + std::to_string(step) +
               "): fix the shard, keeping its number of tokens, then --resume " + dir;
    }
    die("%s: found before step %d, which would read it; %s", why.c_str(), step + 1, kept.c_str());
}
