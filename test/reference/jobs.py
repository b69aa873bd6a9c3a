#!/usr/bin/env python3
"""Runs several reference computations (gpt2.py, rlvr.py) in one Python process, each at most
once for the same inputs.

usage: jobs.py --cache DIR JOB [JOB ...]
  JOB is one command line of gpt2.py or rlvr.py as a single string, e.g.
      "gpt2.py --model m.bin --batch b.bin --out ref.bin --dtype bfloat16"
      "gpt2.py --self-test"

Importing PyTorch takes seconds, so one process runs them all. A result is kept in DIR under a
key made of the scripts' source and the bytes of every input file (the --out path left out): a
job whose key is in DIR only gets its --out file copied (the same inputs again: a second run of
the suite, or the self-test, which has none, when test_reference.sh runs for another build).
Exits non-zero as soon as a job fails (its own message printed).
"""
import hashlib
import os
import shlex
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def key_of(argv):
    h = hashlib.sha256()
    for name in ("gpt2.py", "rlvr.py"):
        h.update(open(os.path.join(HERE, name), "rb").read())
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--out":
            skip = True
            continue
        h.update(a.encode() + b"\0")
        if os.path.isfile(a):
            h.update(open(a, "rb").read())
    return h.hexdigest()[:32]


def main():
    if len(sys.argv) < 3 or sys.argv[1] != "--cache":
        sys.exit(__doc__)
    cache = sys.argv[2]
    os.makedirs(cache, exist_ok=True)
    import gpt2
    import rlvr
    print(f"jobs.py: torch {gpt2.torch.__version__}, {len(sys.argv) - 3} jobs, cache {cache}")
    modules = {"gpt2.py": gpt2, "rlvr.py": rlvr}
    for job in sys.argv[3:]:
        argv = shlex.split(job)
        if not argv or argv[0] not in modules:
            sys.exit(f"jobs.py: a job must start with gpt2.py or rlvr.py: '{job}'")
        key = os.path.join(cache, key_of(argv))
        out = argv[argv.index("--out") + 1] if "--out" in argv else None
        if os.path.exists(key + ".done"):
            if out:
                shutil.copyfile(key + ".bin", out)
            print(f"{job}: the same inputs as before, reference reused")
            continue
        sys.argv = argv
        try:
            modules[argv[0]].main()
        except SystemExit as e:
            if e.code not in (None, 0):
                print(f"jobs.py: '{job}' failed ({e.code})", file=sys.stderr)
                sys.exit(1)
        if out:
            shutil.copyfile(out, key + ".bin")
        open(key + ".done", "w").close()


if __name__ == "__main__":
    main()
