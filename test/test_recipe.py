#!/usr/bin/env python3
"""The default job's recipe is what the docs say it is (issue 57): the table "The recipe" of
doc/training-tasks.md (section "A default job that learns on every seed") lists every flag of
the recipe with today's default and the default before the change. Checked here, without
training (whether the recipe reaches 90% on every seed is scripts/lab_seeds.sh's job):
  - each "today" value is the default `./train_gpt2cpu --help` prints for that flag, and the data
    format's is dev/data/arithmetic.py's default --format;
  - each "before" value is what scripts/lab_seeds.sh passes for its "before" recipe (so the lab
    runs the recipe the doc compares against);
  - the README names the recipe's steps, and the floor the doc derives for the format.
Prints PASS/FAIL per check; exit status 1 if any failed."""
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
failures = 0


def report(name, ok, detail=""):
    global failures
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
    failures += 0 if ok else 1


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def same(a, b):
    try:
        return float(a) == float(b)
    except ValueError:
        return a == b


doc = read("doc/training-tasks.md")
m = re.search(r"^## A default job that learns on every seed.*?(?=^## )", doc, re.S | re.M)
section = m.group(0) if m else ""
report("doc/training-tasks.md has the section \"A default job that learns on every seed\"", bool(section))
rows = re.findall(r"^\| `(--[a-z0-9-]+)`[^|]*\| `?([^|`]+?)`? \| `?([^|`]+?)`? \|", section, re.M)
flags = {f: (today.strip(), before.strip()) for f, today, before in rows}
report("its recipe table lists the flags", len(flags) >= 8 and "--format" in flags, f"{len(flags)} rows")

# today's defaults: the trainer's --help ('--flag X   help text [default]') and arithmetic.py's
trainer = os.path.join(ROOT, "train_gpt2cpu")
helptext = subprocess.run([trainer, "--help"], capture_output=True, text=True).stdout if os.access(trainer, os.X_OK) else ""
report("./train_gpt2cpu --help runs", bool(helptext))
defaults = dict(re.findall(r"^\s+(--[a-z0-9-]+)\s.*\[([^\]]*)\]\s*$", helptext, re.M))
sys.path.insert(0, os.path.join(ROOT, "dev", "data"))
from arithmetic import parse_args  # noqa: E402
defaults["--format"] = parse_args([]).format
wrong = [f"{f}: doc {t}, code {defaults.get(f)}" for f, (t, _) in flags.items() if not same(t, defaults.get(f, "?"))]
report("every flag's default is the one the doc states", flags and not wrong, "; ".join(wrong) or
       ", ".join(f"{f} {t}" for f, (t, _) in flags.items()))

# the lab's "before" recipe: the flags scripts/lab_seeds.sh passes (the format: its --format)
lab = read("scripts/lab_seeds.sh")
m = re.search(r"^\s+before\)$(.*?);;", lab, re.S | re.M)
before = m.group(1) if m else ""
lab_flags = dict(re.findall(r"(--[a-z0-9-]+) ([^\s\"$]+)", before))
wrong = [f"{f}: doc {b}, lab {lab_flags.get(f)}" for f, (_, b) in flags.items() if not same(b, lab_flags.get(f, "?"))]
report("scripts/lab_seeds.sh runs the doc's \"before\" recipe", flags and not wrong, "; ".join(wrong))

# the README's account of the default job
readme = read("README.md")
steps = flags.get("--steps", ("?", "?"))[0]
report(f"README: the default job's example output ends at step {steps}/{steps}",
       bool(re.search(rf"^step +{steps}/{steps} \|", readme, re.M)))
floor = re.search(r"floor of\s+([0-9.]+)", section)
report("README states the floor the doc derives", bool(floor) and re.search(rf"floor of\s+{floor.group(1)}", readme),
       floor.group(1) if floor else "no 'floor of X' in the section")

sys.exit(1 if failures else 0)
