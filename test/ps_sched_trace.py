"""Reads a --trace of a run with --comm-chunk-kb (llmc/parallel/dp_priority.h) and says, per rank,
what the layer-wise schedule did, from the ORDER of the events only (never their times):
  pull order   the units in the order their first parameter chunk was pulled after each update
  block 0      how many pull chunks the forward of block 0 waited for: the communication thread
               runs one chunk at a time, so block 0 (which needs the root's chunks and its own)
               waits for every chunk up to the last of those. By priority that is the root's and
               block 0's chunks only (the P3 picture: the rest of the pull overlaps the forward);
               fifo pulls the root last, so block 0 waits for the whole pull.
  preempted    pushes of a unit that started while chunks of a unit whose gradients were ready
               earlier were still to go (a chunk of higher priority going first); printed only:
               it depends on when the backward queued the pushes, i.e. on timing
Each rank records its events in the order they happen on each thread (llmc/trace.h): a chunk's
event when the chunk is done, the update's when the update is done. The pulls of an update are
queued after its event and all done before the next update's (the forward waits for them), so the
events between two "AdamW update" events in the file are one update's pull and the next step's
pushes, whatever the timing.
Usage: ps_sched_trace.py TRACE.json [--expect priority|fifo] ; exit 1 when the expectation fails:
  priority  every pull goes root, block 0, 1, ...; block 0 waits for its own and the root's chunks, fewer than all
  fifo      every pull goes block L-1, ..., 0, root (the backward's order); block 0 waits for all of them"""
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


def windows(events, pid):
    """The events of one rank, in file order, cut at each update: [[events after update i], ...]."""
    out = None
    for e in events:
        if e.get("ph") != "X" or e.get("pid") != pid:
            continue
        if e["tid"] == 0 and e["name"] == "AdamW update":
            out = [] if out is None else out
            out.append([])
        elif out is not None:
            out[-1].append(e)
    return out or []


def analyse(events, pid):
    pulls_per_update = []   # per update with a pull: (order of units, chunks block 0 waited for, its own + root's, chunks)
    preempted = 0
    for w in windows(events, pid):
        pulls = [e for e in w if e["tid"] == 1 and e["name"].startswith("pull ")]
        pushes = [e for e in w if e["tid"] == 1 and e["name"].startswith("push ")]
        if pulls:
            order = []
            for p in pulls:
                if unit_key(p["name"]) not in order:
                    order.append(unit_key(p["name"]))
            needed = [i + 1 for i, p in enumerate(pulls) if unit_key(p["name"]) in ("root", "block 0")]
            pulls_per_update.append((order, max(needed) if needed else 0, len(needed), len(pulls)))
        # preemption among the next step's pushes: a chunk of unit B that ran before the last push
        # chunk of a unit A whose first chunk ran earlier (A's gradients were ready first)
        first_seen, last_seen = {}, {}
        for j, p in enumerate(pushes):
            k = unit_key(p["name"])
            first_seen.setdefault(k, j)
            last_seen[k] = j
        for k, j in first_seen.items():
            if any(first_seen[a] < j < last_seen[a] for a in first_seen if a != k):
                preempted += 1
    return pulls_per_update, preempted


def main():
    path = sys.argv[1]
    expect = sys.argv[sys.argv.index("--expect") + 1] if "--expect" in sys.argv else None
    t = json.load(open(path))
    events = t["traceEvents"] if isinstance(t, dict) else t
    pids = sorted(set(e["pid"] for e in events if e.get("ph") == "X"))
    ok = bool(pids)
    for pid in pids:
        pulls, preempted = analyse(events, pid)
        orders = [p[0] for p in pulls]
        common = orders[0] if orders and all(o == orders[0] for o in orders) else None
        waits = sorted(set((p[1], p[2], p[3]) for p in pulls))
        wait_text = ("%d of the %d chunks (the root's and block 0's: %d)" % (waits[0][0], waits[0][2], waits[0][1])
                     if len(waits) == 1 else "varies (%s)" % ", ".join("%d of %d" % (w[0], w[2]) for w in waits))
        print("rank %d: pull order %s after %d updates; the forward of block 0 waited for %s; "
              "%d pushes went ahead of an earlier unit's remaining chunks"
              % (pid, " -> ".join(common) if common else "varies", len(pulls), wait_text, preempted))
        if expect == "priority":
            ok &= (bool(common) and common[:2] == ["root", "block 0"] and
                   common[2:] == ["block %d" % l for l in range(1, len(common) - 1)] and
                   all(needed == own < chunks for _, needed, own, chunks in pulls))
        elif expect == "fifo":
            ok &= (bool(common) and common == ["block %d" % l for l in range(len(common) - 2, -1, -1)] + ["root"] and
                   all(needed == chunks for _, needed, _, chunks in pulls))
        if expect:
            ok &= len(pulls) > 0
    if expect:
        print("expectation (%s): %s" % (expect, "holds" if ok else "FAILS"))
    sys.exit(0 if ok else 1)


main()
