#!/usr/bin/env python3
"""The student's path (doc/syllabus.md) checked against the code, so that it cannot drift:
  - every `FILE:FUNCTION` the syllabus names exists: the file, and the function defined in it
    (a line that starts with its return type at column 0, not a call);
  - every file a row names exists, and each topic's "Lines" is the wc -l of the files it names;
  - the reading budgets: for each strategy of the table "Reading budgets", its set computed from
    the code (test/callgraph.py: what its entry functions reach by the calls its command makes,
    less what the rows above hold), printed file by file, function by function, and its total
    compared with the one the table states (the doc must say what is true); the totals printed
    against the budgets.
Prints PASS/FAIL per check and the totals; exit status 1 if any failed."""
import os
import re
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import callgraph  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SYLLABUS = os.path.join(ROOT, "doc", "syllabus.md")
failures = 0


def report(name, ok, detail=""):
    global failures
    print(f"{'PASS' if ok else 'FAIL'} {name:<66} {detail}")
    if not ok:
        failures += 1


def lines_of(path):
    with open(os.path.join(ROOT, path), errors="replace") as f:
        return sum(1 for _ in f)


def defines(path, function):
    with open(os.path.join(ROOT, path), errors="replace") as f:
        src = f.read()
    return re.search(r"^[A-Za-z_][\w \t\*&:<>,]*\b" + re.escape(function) + r"\s*\(", src, re.M) is not None


text = open(SYLLABUS).read()
# 1. FILE:FUNCTION references, and plain file references, anywhere in the syllabus
refs = sorted(set(re.findall(r"`((?:llmc|test|scripts|dev)/[\w/.-]+\.(?:h|cuh|cu|cpp|sh|py)|\w+\.cu):(\w+)`", text)))
missing = [f"{p}:{fn}" for p, fn in refs if not os.path.exists(os.path.join(ROOT, p)) or not defines(p, fn)]
report(f"the {len(refs)} functions the syllabus names exist", not missing, ", ".join(missing[:5]))
files = sorted(set(re.findall(r"`((?:llmc|test|scripts|dev|doc)/[\w/.-]+\.(?:h|cuh|cu|cpp|sh|py|md))", text)))
gone = [p for p in files if not os.path.exists(os.path.join(ROOT, p))]
report(f"the {len(files)} files the syllabus names exist", not gone, ", ".join(gone[:5]))

# 2. each topic's "Lines": the files its code cell names, counted
topics = 0
wrong = []
for line in text.splitlines():
    if not re.match(r"\| \d+ \|", line):
        continue
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)]
    if len(cells) < 9:
        wrong.append(f"row {cells[1]}: {len(cells) - 2} cells")
        continue
    topics += 1
    named = []
    for path in re.findall(r"`([\w/.-]+\.(?:h|cuh|cu)):\w+`", cells[4]):
        if path not in named and os.path.exists(os.path.join(ROOT, path)):
            named.append(path)
    stated = re.match(r"[\d,]+", cells[7])
    total = sum(lines_of(p) for p in named)
    if not stated or int(stated.group(0).replace(",", "")) != total:
        wrong.append(f"topic {cells[1]}: table {cells[7].split(' ')[0]}, wc -l {total}")
report(f"each of the {topics} topics states the lines of the files it names", topics > 0 and not wrong, "; ".join(wrong[:4]))

# 3. the reading budgets, computed (test/callgraph.py): | strategy | entries | command | lines | budget |.
# Each row's command runs once under the trainer that records its calls (build/callgraph/train_gpt2cpu),
# on the small model of TRACE below; its set is what its entry functions reach by those calls (and
# the types, tables and macros they name), less what the rows above it hold.
TRACE = "--steps 2 --layers 2 --heads 2 --channels 32"
section = text.split("## Reading budgets", 1)
report("the syllabus has a section \"Reading budgets\"", len(section) == 2)
rows = []
if len(section) == 2:
    body = section[1].split("\n## ", 1)[0]
    q = re.search(r'^Q="([^"]*)"', text, re.M)
    for line in body.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) != 5 or not (cells[4].replace(",", "").isdigit() or cells[4] == "none"):
            continue
        entries = re.findall(r"`[\w/.-]+:(\w+)`", cells[1])
        command = cells[2].strip("`").replace("\\|", "|")
        stated = cells[3].replace(",", "")
        budget = int(cells[4].replace(",", "")) if cells[4] != "none" else None   # none: a row read before, counted, not budgeted
        rows.append((cells[0], entries, command, int(stated) if stated.isdigit() else -1, budget))
report("the budget table lists the seven strategies", sum(r[4] is not None for r in rows) == 7,
       f"{sum(r[4] is not None for r in rows)} budgeted rows of {len(rows)}")

traced = os.path.exists(callgraph.BINARY)
report("the trainer that records its calls is built (make build/callgraph/train_gpt2cpu)", traced)
if rows and traced:
    code = callgraph.Code(callgraph.sources())
    env = dict(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    read, files_read, totals, first_edges = set(), set(), [], set()
    for name, entries, command, stated, budget in rows:
        cmd = command.replace("$Q", q.group(1) + " " + TRACE if q else TRACE)
        cmd = cmd.replace("$M", "mpirun --oversubscribe --mca btl self,vader --mca mpi_yield_when_idle 1 -np")
        try:
            edges = callgraph.run_traced(shlex.split(cmd), ROOT, env)
        except Exception as e:   # noqa: BLE001 (the reason is the report)
            report(f"{name}: its command runs traced", False, str(e)[:200])
            continue
        mine = code.reach(entries, edges)
        first_edges = first_edges or edges
        missing = [e for e in entries if not any(i.name == e for i in mine)]
        report(f"{name}: every entry function runs under its command", not missing, ", ".join(missing))
        items = mine - read
        total, new_files = code.cost(items, files_read)
        print(f"   {name}: {total} lines ({budget if budget is not None else 'no'} budget) in {len({i.path for i in items})} files "
              f"({len(new_files)} opened for the first time, the rest read in an earlier row); its set, file:function lines:")
        for path in sorted({i.path for i in items}, key=lambda f: (-sum(i.end - i.start + 1 for i in items if i.path == f), f)):
            its = sorted((i for i in items if i.path == path), key=lambda i: i.start)
            opening = f" + opening comment {code.opening[path]}" if path in new_files else ""
            print(f"      {path}{opening}: " + ", ".join(f"{i.name} {i.end - i.start + 1}" for i in its))
        report(f"{name}: the table states the computed total", stated == total, f"table {stated}, computed {total}")
        totals.append((name, total, budget))
        read |= mine
        files_read |= {i.path for i in mine}
    # the count follows calls: one more call from a row's code to a function it did not reach raises
    # that row's total by the function's lines (shown on the first row: an edge added to its calls)
    if totals:
        entries = rows[0][1]
        base = code.reach(entries, first_edges)
        outside = next(i for i in code.items if i.kind == "function" and i not in base and i.name == "planner_main")
        more = code.reach(entries, first_edges | {(entries[0], outside.name)})
        grew = code.cost(more, set())[0] - code.cost(base, set())[0]
        size = outside.end - outside.start + 1
        report("a call added from a row's entry to a new function raises the row's total", grew >= size,
               f"{rows[0][0]}: +{grew} lines with a call from {entries[0]} to {outside.name} ({size} lines)")
    print(f"{'strategy':<46} {'lines':>6} {'budget':>6}")
    for name, total, budget in totals:
        over = budget is not None and total > budget
        print(f"{name:<46} {total:>6} {budget if budget is not None else 'none':>6}{'   OVER by ' + str(total - budget) if over else ''}")

print(f"{'PASS' if failures == 0 else 'FAIL'}: {failures} failed")
sys.exit(1 if failures else 0)
