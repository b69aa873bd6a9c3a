"""Tests of the dataset scripts in dev/data/: the arithmetic generator is deterministic,
writes valid llm.c files, its equations are right in each format (reversed, the default:
'07+45=250', every example 11 tokens; padded; plain, the format before issue 57, byte for byte
what it wrote then) and its validation pairs never appear in training; its SFT splits (shard + loss mask) mask exactly the answers, keep the held-out pairs
out, and left the pre-training files unchanged; the tinyshakespeare script fails fast with a
clear message when it is offline.
Prints PASS/FAIL lines; exits 1 if any failed."""
import hashlib
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "dev", "data")
sys.path.insert(0, DATA)
from data_common import read_mask, read_shard, read_tokenizer, write_mask  # noqa: E402

failures = 0


def report(name, ok, detail=""):
    global failures
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
    failures += 0 if ok else 1


def generate(out_dir, *extra):
    cmd = [sys.executable, os.path.join(DATA, "arithmetic.py"), "--out-dir", out_dir,
           "--num-train", "5000", "--num-val", "500", "--num-sft-train", "2000", "--num-sft-val", "500", *extra]
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
               for f in ("train_000000.bin", "val_000000.bin", "tokenizer.bin", "sft_train_000000.bin",
                         "sft_train_000000.mask", "sft_val_000000.bin", "sft_val_000000.mask"))
    report("arithmetic.py is deterministic (byte-identical files)", same)

    token_list, eot = read_tokenizer(os.path.join(a, "tokenizer.bin"))
    report("byte tokenizer: 257 tokens, eot 256, token i is byte i",
           len(token_list) == 257 and eot == 256 and all(token_list[i] == bytes([i]) for i in range(256)))

    train = equations(read_shard(os.path.join(a, "train_000000.bin")), 256)
    val = equations(read_shard(os.path.join(a, "val_000000.bin")), 256)
    report("shards hold the requested number of equations", len(train) == 5000 and len(val) == 500,
           f"{len(train)} train, {len(val)} val")

    def parse(e, fmt="reversed"):
        lhs, rhs = e.rstrip("\n").split("=")
        x, y = lhs.split("+")
        return int(x), int(y), int(rhs[::-1] if fmt == "reversed" else rhs)
    wrong = [e for e in train + val if not e.endswith("\n") or parse(e)[0] + parse(e)[1] != parse(e)[2]]
    report("every equation is correct and ends in a newline", not wrong, f"{len(wrong)} wrong")
    def canonical(x, y, fmt):
        """the text the generator must write for x + y in each format"""
        if fmt == "plain":
            return f"{x}+{y}={x + y}\n"
        s = f"{x + y:03d}"
        return f"{x:02d}+{y:02d}={s[::-1] if fmt == 'reversed' else s}\n"
    wrong = [e for e in train + val if e != canonical(*parse(e)[:2], "reversed")]
    report("default format reversed: zero-padded operands, the 3-digit sum units first ('07+45=250')",
           not wrong and all(len(e) == 10 for e in train + val),
           f"{len(wrong)} wrong" + (f", e.g. {wrong[0]!r}" if wrong else f", e.g. {train[0]!r}"))
    for fmt in ("padded", "plain"):
        r = generate(os.path.join(tmp, fmt), "--format", fmt)
        docs = equations(read_shard(os.path.join(tmp, fmt, "train_000000.bin")), 256) if r.returncode == 0 else []
        same_pairs = [parse(e, fmt)[:2] for e in docs] == [parse(e)[:2] for e in train]
        wrong = [e for e in docs if e != canonical(*parse(e, fmt)[:2], fmt) or sum(parse(e, fmt)[:2]) != parse(e, fmt)[2]]
        report(f"--format {fmt}: the same pairs in the same order, each written right", docs and same_pairs and not wrong,
               f"{len(wrong)} wrong" + (f", e.g. {docs[0]!r}" if docs else ""))
    pairs = lambda docs: {tuple(sorted(parse(e)[:2])) for e in docs}  # noqa: E731
    overlap = pairs(train) & pairs(val)
    report("no validation pair (in either order) appears in training", not overlap, f"{len(overlap)} shared")

    r = generate(os.path.join(tmp, "c"), "--digits", "0")
    report("arithmetic.py rejects --digits 0", r.returncode != 0)
    r = generate(os.path.join(tmp, "c"), "--num-sft-train", "-1")
    report("arithmetic.py rejects --num-sft-train -1", r.returncode != 0)

    # --- the SFT splits: sft_<split>_000000.bin (token shard) + .mask (one 0/1 per token)
    def sft_examples(path):
        """[(prompt text, answer text, mask ok)] of an SFT shard and its mask."""
        tokens, mask = read_shard(path), read_mask(path[:-4] + ".mask")
        if len(tokens) != len(mask) or not tokens or tokens[0] != 256:
            return None
        out, i = [], 0
        while i < len(tokens):
            j = i + 1
            while j < len(tokens) and tokens[j] != 256:
                j += 1
            toks, m = tokens[i + 1:j].tolist(), mask[i + 1:j]
            k = m.find(1) if 1 in m else len(m)
            ok = mask[i] == 0 and all(v == 0 for v in m[:k]) and all(v == 1 for v in m[k:])
            out.append((bytes(toks[:k]).decode(), bytes(toks[k:]).decode(), ok))
            i = j
        return out

    lengths_ok = all(len(read_shard(os.path.join(a, f"sft_{s}_000000.bin"))) ==
                     len(read_mask(os.path.join(a, f"sft_{s}_000000.mask"))) for s in ("train", "val"))
    report("SFT: mask length == shard length, both splits", lengths_ok)
    sft_train = sft_examples(os.path.join(a, "sft_train_000000.bin"))
    sft_val = sft_examples(os.path.join(a, "sft_val_000000.bin"))
    report("SFT: shards start with EOT, hold the requested number of examples",
           sft_train is not None and sft_val is not None and len(sft_train) == 2000 and len(sft_val) == 500,
           f"{len(sft_train or [])} train, {len(sft_val or [])} val")
    sft_train, sft_val = sft_train or [], sft_val or []

    def sft_right(p, ans, ok):
        """mask 1 exactly on the answer: the prompt 'a+b=' is mask 0, the answer '(a+b)\n' mask 1"""
        try:
            x, y = p[:-1].split("+")
            return ok and p.endswith("=") and ans == canonical(int(x), int(y), "reversed").split("=")[1] and \
                x.isdigit() and y.isdigit()
        except ValueError:
            return False
    wrong = [e for e in sft_train + sft_val if not sft_right(*e)]
    report("SFT: mask 0 on EOT + 'a+b=', mask 1 exactly on the answer digits (reversed) + newline", not wrong,
           f"{len(wrong)} wrong" + (f", e.g. {wrong[0]!r}" if wrong else f", e.g. {sft_train[0][:2]!r}"))
    sft_pairs = lambda ex: {tuple(sorted(map(int, p[:-1].split("+")))) for p, _, _ in ex}  # noqa: E731
    shared = sft_pairs(sft_val) & (pairs(train) | sft_pairs(sft_train))
    leaked = sft_pairs(sft_train) & pairs(val)
    report("SFT: no SFT val pair in pre-training or SFT train, no pre-training val pair in SFT train",
           not shared and not leaked, f"{len(shared)} + {len(leaked)} shared")
    report("SFT: its own random stream (not a copy of the pre-training equations)",
           [p + ans for p, ans, _ in sft_train[:100]] != train[:100])

    # the pre-training files are what they were before the SFT splits existed: the same bytes
    # with the SFT output off, and the digests of the files this generator wrote before it had one
    r = generate(os.path.join(tmp, "nosft"), "--num-sft-train", "0", "--num-sft-val", "0")
    same = r.returncode == 0 and all(
        open(os.path.join(a, f), "rb").read() == open(os.path.join(tmp, "nosft", f), "rb").read()
        for f in ("train_000000.bin", "val_000000.bin", "tokenizer.bin"))
    none = not any(f.startswith("sft_") for f in os.listdir(os.path.join(tmp, "nosft")))
    report("pre-training files identical with the SFT output off (which writes no sft_ file)", same and none)
    # --format plain is the format before issue 57: the bytes it wrote then
    digest = lambda f: hashlib.sha256(open(os.path.join(tmp, "plain", f), "rb").read()).hexdigest()[:16]  # noqa: E731
    report("--format plain: pre-training files byte-identical to the generator's output before SFT was added",
           digest("train_000000.bin") == "a20df2ee215bda4e" and digest("val_000000.bin") == "183d20c209202255",
           f"sha256 {digest('train_000000.bin')}, {digest('val_000000.bin')}")

    # write_mask / read_mask: round trip, 0/1 only, atomic (no .tmp left behind)
    mpath = os.path.join(tmp, "m.mask")
    write_mask(mpath, [0, 1, 1, 0])
    try:
        write_mask(mpath, [0, 2])
        rejected = False
    except ValueError:
        rejected = True
    report("write_mask/read_mask: round trip, value 2 rejected, old file kept, no .tmp",
           read_mask(mpath) == b"\x00\x01\x01\x00" and rejected and not os.path.exists(mpath + ".tmp"))

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
