#!/usr/bin/env python3
"""The shape of the code the parallel seams set up (doc/design-notes.md, "The parallel seams"),
checked so that it stays that way:
  - train_gpt2.cu's main holds no #if/#ifdef and no MPI call (the plan owns the build and the mesh);
  - the folders' order is declared once (LAYERS below) and doc/architecture.md's layout draws the same;
  - no file of llmc/ (nor train_gpt2.cu) includes a file of a folder above its own;
  - no header includes a file that includes it back, directly or through others (no cycle);
  - every header compiles alone (its own includes are enough; the standard library preloaded,
    headers checked in chains, each in the closure of the next: see below), cached in
    build/layout/ by the content of the header and of everything it includes, so a run where
    nothing changed is cheap;
  - the data-parallel layout takes the root unit from the parameter table (no fixed tensor indices);
  - the trainer stays short enough to read in one sitting (main under 150 lines);
  - no header in llmc/ over 500 lines; no two headers named alike for different things; nothing
    in llmc/parallel/ includes the flag parser; nothing below the planner includes it.
Prints PASS/FAIL per check; exit status 1 if any failed."""
import hashlib
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# The layers, lowest first: a file may include files of its own layer and of the layers below it,
# never of one above. Declared here once; doc/architecture.md's layout block draws them top first.
# A folder ends in "/"; "llmc/*.h" is the files directly in llmc/ other than those named alone.
LAYERS = [
    ["llmc/*.h"],                    # common: errors, RNG, paths, profiler, precision formats, trace
    ["llmc/cpu/", "llmc/cuda/"],     # the kernels, one file per layer on each backend
    ["llmc/backend.h"],              # picks llmc/cpu/ or llmc/cuda/
    ["llmc/comm/"],                  # communicators and collective algorithms
    ["llmc/model/"],                 # GPT-2 in pieces; the three extension points (ops, hooks, step)
    ["llmc/parallel/"],              # one mechanism per file
    ["llmc/data/"],                  # token and SFT shards, the tokenizer
    ["llmc/plan/"],                  # the flags and the parallel plan built from them
    ["llmc/tasks/"],                 # pre-training, SFT, RLVR
    ["llmc/train/"],                 # the training state, guard, reports
    ["llmc/planner/"],               # --plan, --mesh auto
    ["train_gpt2.cu"],               # main
]


def layer_of(path):
    """The index in LAYERS of a repo-relative path, or None when no layer declares it."""
    for i, names in enumerate(LAYERS):
        if path in names:
            return i
    folder = os.path.dirname(path) + "/"
    for i, names in enumerate(LAYERS):
        if folder in names:
            return i
    if folder == "llmc/":
        return 0
    return None
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

# the order, drawn in doc/architecture.md's layout block (top first): the names each line starts with
arch = read("doc/architecture.md")
block = re.search(r"\n## The layout\n.*?\n```\n(.*?)\n```", arch, re.S)
drawn = []
if block:
    for line in block.group(1).split("\n"):
        m = re.match(r"\s*((?:llmc/[\w*./]*|train_gpt2\.cu)(?:,\s*(?:llmc/[\w*./]*|train_gpt2\.cu))*)", line)
        if m:
            drawn.append([n.strip() for n in m.group(1).split(",")])
declared = [names for names in reversed(LAYERS)]
report("doc/architecture.md's layout draws LAYERS, in order", drawn == declared,
       "" if drawn == declared else f"drawn {drawn} declared (top first) {declared}")

# every include goes down or sideways: llmc/'s files and train_gpt2.cu
sources = sorted(graph) + [p for p in ["train_gpt2.cu"]]
undeclared, upward = [], []
for p in sources:
    if layer_of(p) is None:
        undeclared.append(p)
        continue
    deps = graph.get(p)
    if deps is None:   # train_gpt2.cu
        deps = [os.path.normpath(inc) for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', read(p), re.M)
                if os.path.exists(os.path.join(ROOT, inc))]
    for d in deps:
        if layer_of(d) is not None and layer_of(d) > layer_of(p):
            upward.append(f"{p} includes {d} ({LAYERS[layer_of(d)][0]} is above {LAYERS[layer_of(p)][0]})")
report("every file of llmc/ is in a declared layer", not undeclared, ", ".join(undeclared))
report("no file includes one of a higher layer", not upward, "; ".join(upward))
for u in upward:
    print(f"     upward include: {u}")

# every header compiles alone: g++ -fsyntax-only on the header by itself, with the CPU trainer's
# defines (MPI when mpicxx is there). A pass is remembered in build/layout/ under a hash of the
# compiler's command and the text of the header and of every header it includes, so only what
# changed is compiled again. Not compiled here (why): the .cuh files and the NCCL communicators
# (device code: nvcc, the nvcc suite compiles them inside the CUDA programs); matmul_openblas.h when
# pkg-config finds no OpenBLAS (it includes cblas.h); headers that include <mpi.h> when mpicxx is missing.
CUDA_ONLY = {"llmc/comm/comm_nccl.h", "llmc/comm/native_nccl.h"}
cxx = os.environ.get("CXX", "g++")
flags = ["-std=c++17", "-fsyntax-only", "-fopenmp", "-x", "c++", "-DLLMC_CPU"]
mpicxx = shutil.which("mpicxx")
if mpicxx:
    flags += ["-DUSE_MPI", "-DOMPI_SKIP_MPICXX"] + subprocess.run([mpicxx, "--showme:compile"], capture_output=True,
                                                                   text=True).stdout.split()
has_blas = subprocess.run("pkg-config --exists openblas", shell=True).returncode == 0
if has_blas:
    flags += subprocess.run("pkg-config --cflags openblas", shell=True, capture_output=True, text=True).stdout.split()


def closure_of(p):
    seen = set()
    closure(p, seen)
    return seen


def closure(p, seen):
    if p in seen:
        return
    seen.add(p)
    for d in graph.get(p, []):
        closure(d, seen)


headers, skipped = [], []
for p in sorted(graph):
    if p.endswith(".cuh") or p in CUDA_ONLY:
        skipped.append(p)
    elif p == "llmc/cpu/matmul_openblas.h" and not has_blas:
        skipped.append(p)
    elif not mpicxx and re.search(r"^\s*#\s*include\s+<mpi\.h>", read(p), re.M):
        skipped.append(p)
    else:
        headers.append(p)
cache = os.path.join(ROOT, "build", "layout")
os.makedirs(cache, exist_ok=True)
# The C and C++ standard library's headers that llmc/ includes are parsed once, into a precompiled
# header (build/layout/system.h.gch) that every compile loads first, and the headers are compiled in
# chains (below): ~160 s of CPU for one compile per header became ~26 s (54 compiles for 168
# headers), which make test's budget needs. What the preloading gives up: a header
# that forgets `#include <vector>` but gets it from none of ours compiles here; what it keeps is
# the point of the check, a header that needs another of OURS included before it. (<mpi.h> is not
# preloaded: llmc/comm/mpi_single.h is the build without it.)
system = sorted({m for p in headers for m in re.findall(r"^\s*#\s*include\s+<([\w/.]+)>", read(p), re.M)
                 if m not in ("mpi.h", "cblas.h") and not m.startswith(("cuda", "cublas", "nccl"))})
system_h = os.path.join(cache, "system.h")
text = "".join(f"#include <{m}>\n" for m in system)
if not os.path.exists(system_h) or open(system_h).read() != text or not os.path.exists(system_h + ".gch"):
    with open(system_h, "w") as f:
        f.write(text)
    pch = [cxx] + [a for a in flags if a != "-fsyntax-only"]
    pch[pch.index("c++")] = "c++-header"
    subprocess.run(pch + [system_h, "-o", system_h + ".gch"], cwd=ROOT, check=True)
flags += ["-include", system_h, "-Winvalid-pch"]
command = " ".join([cxx] + flags) + "\n" + text


def key_of(p):
    h = hashlib.sha256(command.encode())
    for d in sorted(closure_of(p)):
        h.update(d.encode() + b"\0" + open(os.path.join(ROOT, d), "rb").read() + b"\0")
    return h.hexdigest()


# One compile checks a chain of headers: `#include` X1, X2, ..., Xk, each in the closure of the
# next (what Xi includes, directly or not). Every header before Xi is then something Xi includes
# anyway, so when Xi's body is reached exactly the headers of its own closure have been read, as
# when it is compiled alone (in another order: a header that needed an order of its own includes
# would fail its own check). The chains: the unchecked header that includes the most, then,
# inside its closure, the unchecked one that includes the most, and so on down; a failed chain
# is compiled again one header at a time, so that the error names the header.
def compile_unit(chain):
    unit = "".join(f'#include "{h}"\n' for h in chain)
    r = subprocess.run([cxx] + flags + ["-"], cwd=ROOT, input=unit, capture_output=True, text=True)
    errors = [l for l in r.stderr.split("\n") if "error" in l]
    return r.returncode == 0, (errors[0] if errors else r.stderr.strip().split("\n")[-1])


checked = {p for p in headers if os.path.exists(os.path.join(cache, key_of(p)))}
alone, compiles = [], 0
wanted = set(headers)
while wanted - checked:
    top = max(wanted - checked, key=lambda h: (len(closure_of(h)), h))
    chain = [top]
    while True:
        below = [h for h in closure_of(chain[-1]) - {chain[-1]} if h in wanted and h not in checked and h not in chain]
        if not below:
            break
        chain.append(max(below, key=lambda h: (len(closure_of(h)), h)))
    chain.reverse()   # the deepest first
    compiles += 1
    ok, err = compile_unit(chain)
    results = [(h, ok, err) for h in chain]
    if not ok and len(chain) > 1:   # again one header at a time, so that the error names the header
        results = [(h, *compile_unit([h])) for h in chain]
        compiles += len(chain)
    for h, h_ok, h_err in results:
        checked.add(h)
        if h_ok:
            open(os.path.join(cache, key_of(h)), "w").close()
        else:
            alone.append((h, h_err))
report(f"every header compiles alone ({len(headers)} checked in {compiles} compiles, {len(skipped)} CUDA-only or missing a library)",
       not alone, "; ".join(p for p, _ in alone))
for p, err in alone:
    print(f"     {p}: {err}")

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
