#!/usr/bin/env python3
"""The shape of the code the parallel seams set up (doc/design-notes.md, "The parallel seams"),
checked so that it stays that way:
  - train_gpt2.cu's main holds no #if/#ifdef and no MPI call (the plan owns the build and the mesh);
  - no header includes a file that includes it back, directly or through others (no cycle);
  - the data-parallel layout takes the root unit from the parameter table (no fixed tensor indices);
  - the trainer stays short enough to read in one sitting (main under 150 lines);
  - no header in llmc/ over 500 lines; no two headers named alike for different things; nothing
    in llmc/parallel/ includes the flag parser; nothing below the planner includes it.
Prints PASS/FAIL per check; exit status 1 if any failed."""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
failures = 0


def report(name, ok, detail=""):
    global failures
    print(f"{'PASS' if ok else 'FAIL'} {name:<62} {detail}")
    if not ok:
        failures += 1


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def strip_comments(src):
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


trainer = read("train_gpt2.cu")
m = re.search(r"\nint main\(int argc, char\*\* argv\) \{\n(.*?)\n\}\n", trainer, re.S)
report("train_gpt2.cu has a main", m is not None)
if m:
    body = strip_comments(m.group(1))
    lines = m.group(1).count("\n") + 1
    report("main holds no #if / #ifdef", not re.search(r"^\s*#\s*if", body, re.M))
    calls = sorted(set(re.findall(r"\bMPI_\w+", body)))
    report("main makes no MPI call", not calls, ", ".join(calls))
    report("main is under 150 lines", lines < 150, f"{lines} lines")
report("train_gpt2.cu has no #if / #ifdef at all", not re.search(r"^\s*#\s*if", strip_comments(trainer), re.M))

# the include graph of the repo's own headers (quoted includes, resolved relative to the file)
graph = {}
for d in sorted(os.path.relpath(dp, ROOT) for dp, _, _ in os.walk(os.path.join(ROOT, "llmc"))):
    for name in sorted(os.listdir(os.path.join(ROOT, d))):
        if not name.endswith((".h", ".cuh")):
            continue
        path = os.path.normpath(os.path.join(d, name))
        deps = []
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', read(path), re.M):
            dep = os.path.normpath(os.path.join(d, inc))
            if os.path.exists(os.path.join(ROOT, dep)):
                deps.append(dep)
        graph[path] = deps
cycles = []
state = {}


def visit(node, stack):
    state[node] = 1
    for dep in graph.get(node, []):
        if state.get(dep) == 1:
            cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
        elif dep not in state:
            visit(dep, stack + [dep])
    state[node] = 2


for node in graph:
    if node not in state:
        visit(node, [node])
report(f"no include cycle among the {len(graph)} headers", not cycles, "; ".join(cycles[:3]))

layout = strip_comments(read("llmc/parallel/bucket_layout.h"))
fixed = re.findall(r"\{\s*0\s*,\s*1\s*,\s*14\s*,\s*15\s*\}", layout)
report("the root unit comes from the table, not fixed indices", not fixed)

# the layout a student finds (doc/architecture.md): short headers, names that say what a file is,
# dependencies one way
long = sorted((n, p) for p in graph for n in [sum(1 for _ in open(os.path.join(ROOT, p)))] if n > 500)
report("no header in llmc/ over 500 lines", not long, ", ".join(f"{p} {n}" for n, p in long))
stems = {}
for p in graph:
    stems.setdefault(re.sub(r"\.(h|cuh)$", "", os.path.basename(p)), []).append(os.path.dirname(p))
# one name, one thing: a name may appear twice only as the CPU and CUDA sides of the same thing
# (llmc/cpu/X.h and llmc/cuda/X.cuh, or llmc/X.h and llmc/cuda/X.cuh)
clash = sorted(f"{s} ({', '.join(sorted(d))})" for s, d in stems.items()
               if len(d) > 1 and not (len(d) == 2 and "llmc/cuda" in d and ({"llmc/cpu", "llmc"} & set(d))))
report("no two headers share a name for different things", not clash, "; ".join(clash))
flags = [p for p in graph if p.startswith("llmc/parallel/")
         and {"llmc/plan/train_args.h", "llmc/plan/flag_parser.h"} & set(graph[p])]
report("nothing in llmc/parallel/ includes the flag parser", not flags, ", ".join(flags))
upward = [f"{p} -> {d}" for p in graph if p.startswith(("llmc/model/", "llmc/parallel/", "llmc/comm/", "llmc/cpu/", "llmc/cuda/"))
          for d in graph[p] if d.startswith("llmc/planner/")]
report("the planner is used by nothing below it", not upward, ", ".join(upward))
print(f"{'FAIL' if failures else 'PASS'}: {failures} failed")
sys.exit(1 if failures else 0)
