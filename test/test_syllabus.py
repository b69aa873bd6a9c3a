#!/usr/bin/env python3
"""The student's path (doc/syllabus.md) checked against the code, so that it cannot drift:
  - every `FILE:FUNCTION` the syllabus names exists: the file, and the function defined in it
    (a line that starts with its return type at column 0, not a call);
  - every file a row names exists, and each topic's "Lines" is the wc -l of the files it names;
  - the reading budgets: for each strategy of the table "Reading budgets", the lines of the
    files it lists (wc -l) are summed, printed, compared with the total the table states (the
    doc must say what is true) and with the budget.
Prints PASS/FAIL per check and the totals; exit status 1 if any failed."""
import os
import re
import sys

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

# 3. the reading budgets: | strategy | `file` `file` ... | stated total | budget |
section = text.split("## Reading budgets", 1)
report("the syllabus has a section \"Reading budgets\"", len(section) == 2)
rows = []
if len(section) == 2:
    body = section[1].split("\n## ", 1)[0]
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[3].replace(",", "").isdigit():
            continue
        paths = re.findall(r"`([\w/.-]+)`", cells[1])
        stated = cells[2].replace(",", "")
        rows.append((cells[0], paths, int(stated) if stated.isdigit() else -1, int(cells[3].replace(",", ""))))
report("the budget table lists the six strategies", len(rows) == 6, f"{len(rows)} rows")
print(f"{'strategy':<34} {'files':>5} {'lines':>6} {'budget':>6}")
for name, paths, stated, budget in rows:
    absent = [p for p in paths if not os.path.exists(os.path.join(ROOT, p))]
    total = sum(lines_of(p) for p in paths if p not in absent)
    print(f"{name:<34} {len(paths):>5} {total:>6} {budget:>6}   " + " + ".join(
        f"{os.path.relpath(p, 'llmc') if p.startswith('llmc/') else p} {lines_of(p)}" for p in paths if p not in absent))
    report(f"{name}: every file listed exists", not absent, ", ".join(absent))
    report(f"{name}: the table states the true total", stated == total, f"table {stated}, wc -l {total}")
    report(f"{name}: within its budget", total <= budget, f"{total} <= {budget}")

print(f"{'PASS' if failures == 0 else 'FAIL'}: {failures} failed")
sys.exit(1 if failures else 0)
