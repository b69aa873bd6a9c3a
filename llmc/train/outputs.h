// The trainer's paths, checked before MPI starts, before any work: every flag of the table
// (llmc/plan/train_args.h) that names a path declares its role there (ARG_IN_FILE, ARG_IN_GLOB,
// ARG_IN_DIR, ARG_OUT_FILE, ARG_STATE_DIR), and llmc/paths.h's paths_check derives the checks
// from the roles, for every declared path, given or default, whether or not this run's task
// reads it (a path named as an input is never written):
//   inputs    regular files (the tuning file, a glob's shards and their masks, the checkpoint);
//             --resume a directory
//   outputs   writable where they are named, within the file system's limits, not in /proc or
//             /sys (rank 0 writes the files and checks them; every rank writes into --save-state)
//   distinct  no output the same file as an input or another output, or inside a state
//             directory; no input inside the state directory the job writes
// `--log data/arithmetic/val_000000.bin` would replace a validation shard with a log, and
// `--save run.bin --log run.bin` would leave whichever file is written last.
#pragma once

#include <string>
#include <vector>
#include "../common.h"
#include "../paths.h"
#include "../plan/flag_parser.h"

// rank: this process's rank from the launcher's environment (die's; -1 for one process)
static inline void train_paths_check(int rank) {
    std::vector<PathFlag> flags;
    for (const ArgPath& p : *args_paths()) { flags.push_back({p.flag.c_str(), p.role, *p.dest}); }
    paths_check(flags, rank <= 0);
}
