#!/usr/bin/env bash
# Every flag that names a path declares its role (llmc/paths.h): the trainer's flag table
# (llmc/plan/train_args.h: ARG_IN_FILE, ARG_IN_GLOB, ARG_IN_DIR, ARG_OUT_FILE, ARG_STATE_DIR),
# pp_sim's, and collbench's COLLBENCH_PATHS. The checks before any work follow from the role,
# so a path flag without one would escape them. The test walks each program's flag table as its
# --help prints it ("--flag KIND help", KIND the role of a path flag) and fails on a flag whose
# help speaks of a file, directory, glob, shard, checkpoint or path but whose KIND is no role.
# It first shows that it can fail: a made-up line of a path flag without a role must be caught.
set -u
cd "$(dirname "$0")/.."
status=0
python3 - "$@" <<'PY' || status=1
import re, subprocess, sys
ROLES = {"FILE", "GLOB", "DIR", "OUT", "STATE_DIR", "FILE_RW"}
PATHY = re.compile(r"\b(file|files|directory|dir|glob|shards?|checkpoint|path|here)\b", re.I)
LINE = re.compile(r"^  (--[a-z0-9-]+|-[A-Za-z])(?: (\S+))?\s+(.*)$")

def walk(name, text):
    """(flag, kind, help) of every flag line; a wrapped help line joins the flag above it"""
    flags = []
    for l in text.splitlines():
        m = LINE.match(l)
        if m:
            flags.append([m.group(1), m.group(2) or "", m.group(3)])
        elif flags and l.startswith("      "):
            flags[-1][2] += " " + l.strip()
    return flags

def unroled(flags):
    # (a switch, "" , or a number, N or X, takes no path)
    return [f for f, kind, text in flags if kind not in ROLES | {"", "N", "X"} and PATHY.search(text)]

# the test can fail: a path flag without a role is caught, one with a role is not
fake = walk("fake", "  --out S                write the results to this file [none]\n  --in FILE              read this file [none]\n")
if unroled(fake) != ["--out"]:
    print(f"FAIL the flag-role check misses a path flag without a role: {unroled(fake)}")
    sys.exit(1)
print("PASS the flag-role check catches a made-up '--out S ... this file' without a role")

bad = 0
for prog in ["./train_gpt2cpu", "./collbenchcpu", "./pp_simcpu"]:
    try:
        text = subprocess.run([prog, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30).stdout
    except FileNotFoundError:
        print(f"FAIL {prog} is not built")
        bad = 1
        continue
    flags = walk(prog, text)
    paths = [f"{f} {k}" for f, k, _ in flags if k in ROLES]
    missing = unroled(flags)
    if len(flags) < 3:
        print(f"FAIL {prog} --help lists {len(flags)} flags: not the table this test reads")
        bad = 1
    elif missing:
        print(f"FAIL {prog}: flags naming a path without a role: {', '.join(missing)} (declare it in the flag table: llmc/paths.h)")
        bad = 1
    else:
        print(f"PASS {prog}: {len(flags)} flags, every path flag with a role ({', '.join(paths) or 'none'})")
sys.exit(bad)
PY
exit $status
