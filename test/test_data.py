"""Tests of the dataset scripts in dev/data/: the arithmetic generator is deterministic,
writes valid llm.c files, its equations are right and its validation pairs never appear in
training; the tinyshakespeare script fails fast with a clear message when it is offline.
Prints PASS/FAIL lines; exits 1 if any failed."""
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "dev", "data")
sys.path.insert(0, DATA)
from data_common import read_shard, read_tokenizer  # noqa: E402

failures = 0


def report(name, ok, detail=""):
    global failures
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
    failures += 0 if ok else 1


def generate(out_dir, *extra):
    cmd = [sys.executable, os.path.join(DATA, "arithmetic.py"), "--out-dir", out_dir,
           "--num-train", "5000", "--num-val", "500", *extra]
    return subprocess.run(cmd, capture_output=True, text=True)


def equations(tokens, eot):
    """Split a token stream into its documents' text."""
    docs, cur = [], None
    for t in tokens:
        if t == eot:
            if cur is not None:
                docs.append(bytes(cur).decode())
            cur = []
        elif cur is not None:
            cur.append(t)
    if cur:
        docs.append(bytes(cur).decode())
    return docs


with tempfile.TemporaryDirectory() as tmp:
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    ra, rb = generate(a), generate(b)
    report("arithmetic.py runs", ra.returncode == 0 and rb.returncode == 0, ra.stderr.strip()[:200])
    same = all(open(os.path.join(a, f), "rb").read() == open(os.path.join(b, f), "rb").read()
               for f in ("train_000000.bin", "val_000000.bin", "tokenizer.bin"))
    report("arithmetic.py is deterministic (byte-identical files)", same)

    token_list, eot = read_tokenizer(os.path.join(a, "tokenizer.bin"))
    report("byte tokenizer: 257 tokens, eot 256, token i is byte i",
           len(token_list) == 257 and eot == 256 and all(token_list[i] == bytes([i]) for i in range(256)))

    train = equations(read_shard(os.path.join(a, "train_000000.bin")), 256)
    val = equations(read_shard(os.path.join(a, "val_000000.bin")), 256)
    report("shards hold the requested number of equations", len(train) == 5000 and len(val) == 500,
           f"{len(train)} train, {len(val)} val")

    def parse(e):
        lhs, rhs = e.rstrip("\n").split("=")
        x, y = lhs.split("+")
        return int(x), int(y), int(rhs)
    wrong = [e for e in train + val if not e.endswith("\n") or parse(e)[0] + parse(e)[1] != parse(e)[2]]
    report("every equation is correct and ends in a newline", not wrong, f"{len(wrong)} wrong")
    pairs = lambda docs: {tuple(sorted(parse(e)[:2])) for e in docs}  # noqa: E731
    overlap = pairs(train) & pairs(val)
    report("no validation pair (in either order) appears in training", not overlap, f"{len(overlap)} shared")

    r = generate(os.path.join(tmp, "c"), "--digits", "0")
    report("arithmetic.py rejects --digits 0", r.returncode != 0)

    # offline (or without tiktoken) tinyshakespeare must fail fast with one clear line
    t0 = time.time()
    r = subprocess.run([sys.executable, os.path.join(DATA, "tinyshakespeare.py")], capture_output=True, text=True,
                       cwd=tmp, timeout=120)
    dt = time.time() - t0
    if r.returncode == 0:
        report("tinyshakespeare.py (this machine is online: it succeeded)", True)
    else:
        msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        report("tinyshakespeare.py offline: exit 1, one clear line, no hang",
               r.returncode == 1 and msg.startswith("error:") and dt < 90, f"{dt:.1f}s: {msg[:110]}")

sys.exit(1 if failures else 0)
