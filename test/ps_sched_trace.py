"""Reads a --trace of a run with --comm-chunk-kb (llmc/parallel/dp_sched.h) and says, per rank,
what the layer-wise schedule did:
  pull order   the units in the order their first parameter chunk was pulled after each update
  overlap      updates after which the forward of block 0 started before the last parameter
               chunk had arrived (the P3 picture), of the updates followed by a forward
  preempted    pushes of a unit that started while chunks of a unit whose gradients were ready
               earlier were still to go (a chunk of higher priority going first)
Usage: ps_sched_trace.py TRACE.json [--expect priority|fifo] ; exit 1 when the expectation fails."""
import json
import re
import sys


def unit_key(name):
    m = re.match(r"(push|pull|all-reduce) (block (\d+)|root|bucket (\d+))", name)
    if not m:
        return None
    if m.group(2) == "root":
        return "root"
    return "block %s" % m.group(3) if m.group(3) is not None else "bucket %s" % m.group(4)


def analyse(events, pid):
    ev = sorted((e for e in events if e.get("ph") == "X" and e.get("pid") == pid), key=lambda e: e["ts"])
    updates = [e for e in ev if e["tid"] == 0 and e["name"] == "AdamW update"]
    fwd0 = [e for e in ev if e["tid"] == 0 and e["name"] == "forward block 0"]
    pulls = [e for e in ev if e["tid"] == 1 and e["name"].startswith("pull ")]
    pushes = [e for e in ev if e["tid"] == 1 and e["name"].startswith("push ")]
    orders, overlap, followed = [], 0, 0
    for i, u in enumerate(updates):
        end_u = u["ts"] + u["dur"]
        nxt = updates[i + 1]["ts"] if i + 1 < len(updates) else float("inf")
        mine = [p for p in pulls if end_u <= p["ts"] < nxt]
        order = []
        for p in mine:
            k = unit_key(p["name"])
            if k not in order:
                order.append(k)
        if order:
            orders.append(order)
        f = [e for e in fwd0 if end_u <= e["ts"] < nxt]
        if f and mine and i + 1 < len(updates):   # a training step follows (not the final evaluation, after everything settled)
            followed += 1
            if f[0]["ts"] < max(p["ts"] + p["dur"] for p in mine):
                overlap += 1
    # preemption: a push chunk of unit B that ran before the last push chunk of a unit A whose
    # first chunk ran earlier (A's gradients were ready first)
    preempted = 0
    first_seen, last_seen = {}, {}
    step_pushes = []
    for i, u in enumerate(updates):
        start = updates[i - 1]["ts"] + updates[i - 1]["dur"] if i else 0
        step_pushes.append([p for p in pushes if start <= p["ts"] < u["ts"]])
    for group in step_pushes:
        first_seen, last_seen = {}, {}
        for j, p in enumerate(group):
            k = unit_key(p["name"])
            first_seen.setdefault(k, j)
            last_seen[k] = j
        for k, j in first_seen.items():
            if any(first_seen[a] < j < last_seen[a] for a in first_seen if a != k):
                preempted += 1
    return orders, overlap, followed, preempted


def main():
    path = sys.argv[1]
    expect = sys.argv[sys.argv.index("--expect") + 1] if "--expect" in sys.argv else None
    t = json.load(open(path))
    events = t["traceEvents"] if isinstance(t, dict) else t
    pids = sorted(set(e["pid"] for e in events if e.get("ph") == "X"))
    ok = True
    for pid in pids:
        orders, overlap, followed, preempted = analyse(events, pid)
        common = orders[0] if orders and all(o == orders[0] for o in orders) else None
        print("rank %d: pull order %s; forward of block 0 before the last parameter chunk after %d of %d updates; "
              "%d pushes went ahead of an earlier unit's remaining chunks"
              % (pid, " -> ".join(common) if common else "varies", overlap, followed, preempted))
        if expect == "priority":
            ok &= bool(common) and common[0] == "root" and common[1] == "block 0" and followed > 0 and overlap == followed
        elif expect == "fifo":
            ok &= bool(common) and common[-1] == "root" and overlap == 0
    if expect:
        print("expectation (%s): %s" % (expect, "holds" if ok else "FAILS"))
    sys.exit(0 if ok else 1)


main()
