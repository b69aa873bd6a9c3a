"""
The project's default dataset: small integer arithmetic, fully offline and
deterministic (same arguments -> byte-identical files).

Each document is the end-of-text token followed by one equation line, by
default (--format reversed) with zero-padded operands and the sum's digits
units first, so that every 2-digit example is 11 tokens:

    <|endoftext|>07+45=250\n         (7 + 45 = 052, written backwards)

--format plain writes '7+45=52' (the files before issue 57, byte for byte) and
--format padded '07+45=052'.

tokenized with the byte-level tokenizer (ids 0..255 = bytes, 256 = EOT).

Held-out validation: every operand pair belongs to exactly one split, decided
by a fixed hash of the pair (independent of --seed and --op) that puts 10% of
all pairs into the validation part. The unordered pair is hashed, so a+b and
b+a always land in the same split. Train equations are sampled only from the
train part and val equations only from the val part, so no val pair ever
appears in train. Sampling is with replacement (a pair can repeat within a
split).

Outputs (in --out-dir, default data/arithmetic relative to the current
directory):
    train_000000.bin   llm.c token shard with --num-train equations
    val_000000.bin     llm.c token shard with --num-val equations
    sft_train_000000.bin + .mask   SFT split: --num-sft-train equations
    sft_val_000000.bin   + .mask   SFT split: --num-sft-val equations
    tokenizer.bin      llm.c tokenizer file for the byte-level tokenizer

The SFT splits (supervised fine-tuning, read by llmc/data/sft_shards.h) are ordinary
token shards of the same documents plus a loss mask (data_common.write_mask):
one uint8 per token, 1 on the answer digits and the newline, 0 on the EOT and
the prompt:

    <|endoftext|>12+34=   46\\n
    0            000000   111

They use the same held-out split of operand pairs (SFT val pairs never occur
in the pre-training or SFT train data) but their own random stream, so adding
them left the pre-training files byte-identical, and the SFT examples are not
a copy of the pre-training ones. --num-sft-train 0 / --num-sft-val 0 skip
writing that SFT split.

Usage:
    python3 dev/data/arithmetic.py                      # 2-digit addition (the default job)
    python3 dev/data/arithmetic.py --digits 3           # 3-digit addition, much harder
    python3 dev/data/arithmetic.py --op '*' --digits 2  # 2-digit products

The code is split into small pieces: generate_pairs() yields (prompt,
answer) string pairs such as ("482+39=", "521\\n"); pretrain_tokens() and
sft_tokens() turn them into the two kinds of output.
"""

import argparse
import os
import sys
import random
from array import array

from data_common import (BYTE_EOT, byte_tokenizer, write_mask, write_shard,
                         write_tokenizer)

# ----------------------------------------------------------------------------
# the operations

# op symbol -> function computing the result
OPS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,  # operands are ordered so that a >= b
    "*": lambda a, b: a * b,
}

# ----------------------------------------------------------------------------
# the train/val split of operand pairs

VAL_BUCKETS = 10     # pairs are hashed into 10 buckets ...
VAL_BUCKET = 0       # ... and bucket 0 (10% of all pairs) is validation

MASK64 = (1 << 64) - 1


def _mix64(x):
    """splitmix64 finalizer: a fast, well-scrambling 64-bit integer hash.

    Unlike Python's built-in hash() this never changes between runs.
    """
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def pair_split(a, b):
    """Return 'val' or 'train' for the operand pair (a, b).

    The unordered pair is hashed so that (a, b) and (b, a) share a split:
    otherwise the commutative ops would leak val pairs into train as b+a.
    """
    hi, lo = (a, b) if a >= b else (b, a)
    h = _mix64(_mix64(hi + 0x9E3779B97F4A7C15) + lo)
    return "val" if h % VAL_BUCKETS == VAL_BUCKET else "train"


# ----------------------------------------------------------------------------
# examples

FORMATS = ("plain", "padded", "reversed")


def answer_width(op, digits):
    """Digits of the longest possible result: a sum has one more than its operands."""
    return {"+": digits + 1, "-": digits, "*": 2 * digits}[op]


def format_example(a, b, op, fmt="plain", digits=2):
    """The (prompt, answer) strings of one equation.

    plain:    ('482+39=', '521\\n'), numbers as they are written
    padded:   ('482+039=', '0521\\n'), operands and result zero-padded to fixed widths, so
              every example has the same length and each digit a fixed place
    reversed: ('482+039=', '1250\\n'), padded, the result written units first (the order in
              which the carries are computed)
    """
    c = OPS[op](a, b)
    if fmt == "plain":
        return f"{a}{op}{b}=", f"{c}\n"
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {list(FORMATS)}")
    ans = str(c).zfill(answer_width(op, digits))
    if fmt == "reversed":
        ans = ans[::-1]
    return f"{a:0{digits}d}{op}{b:0{digits}d}=", ans + "\n"


def generate_pairs(op, digits, n, seed, split, stream="", fmt="plain"):
    """Yield n (prompt, answer) pairs of the given split ('train' or 'val').

    Operands are uniform in [0, 10**digits); for '-' they are swapped when
    needed so that a >= b (the result is never negative). Pairs that belong
    to the other split are rejected and redrawn. Deterministic in
    (op, digits, n, seed, split, stream); train and val use independent
    streams. `stream` names a further independent stream of the same split
    (the SFT output uses "sft"); the default "" is the pre-training stream.
    """
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; choose one of {sorted(OPS)}")
    if split not in ("train", "val"):
        raise ValueError(f"unknown split {split!r}")
    # a str seed is hashed with SHA-512 by random.seed, so it is stable
    # (the pre-training stream keeps its original seed string, so its files
    # did not change when the SFT stream was added)
    name = f"arithmetic/{seed}/{split}" if not stream else f"arithmetic/{seed}/{stream}/{split}"
    rng = random.Random(name)
    limit = 10 ** digits
    randrange = rng.randrange  # local alias: this loop is the hot path
    # guard against looping forever when a split happens to have no pairs
    # (only possible for tiny operand ranges such as --digits 1)
    max_attempts = 50 * n + 1_000_000
    attempts = 0
    produced = 0
    while produced < n:
        attempts += 1
        if attempts > max_attempts:
            raise RuntimeError(
                f"could not sample {n} {split} pairs for digits={digits} "
                f"(the {split} part of the operand space is too small or empty)")
        a = randrange(limit)
        b = randrange(limit)
        if op == "-" and a < b:
            a, b = b, a
        if pair_split(a, b) != split:
            continue
        produced += 1
        yield format_example(a, b, op, fmt, digits)


# ----------------------------------------------------------------------------
# pre-training output: EOT + prompt + answer, concatenated

def pretrain_tokens(pairs):
    """Tokenize (prompt, answer) pairs into one token stream.

    Each document is [EOT] followed by the UTF-8 bytes of prompt + answer.
    Returns (tokens as array('H'), number of examples, first example text).
    """
    tokens = array("H")
    count = 0
    first = None
    for prompt, answer in pairs:
        text = prompt + answer
        if first is None:
            first = text
        tokens.append(BYTE_EOT)
        # the byte tokenizer's ids are just the UTF-8 bytes (all < 256)
        tokens.extend(text.encode("utf-8"))
        count += 1
    return tokens, count, first


def build_pretrain_split(split, args):
    """Generate one split; returns (tokens, number of examples, first text)."""
    n = args.num_train if split == "train" else args.num_val
    pairs = generate_pairs(args.op, args.digits, n, args.seed, split, fmt=args.format)
    return pretrain_tokens(pairs)


# ----------------------------------------------------------------------------
# SFT output: the same documents plus a loss mask on the answer

def sft_tokens(pairs):
    """Tokenize (prompt, answer) pairs into a token stream and its loss mask.

    Each example is [EOT] + prompt bytes (mask 0) + answer bytes (mask 1: the
    answer digits and the newline). Returns (tokens as array('H'), mask as
    bytearray, number of examples, first example text).
    """
    tokens = array("H")
    mask = bytearray()
    count = 0
    first = None
    for prompt, answer in pairs:
        if first is None:
            first = prompt + answer
        p, a = prompt.encode("utf-8"), answer.encode("utf-8")
        tokens.append(BYTE_EOT)
        tokens.extend(p)
        tokens.extend(a)
        mask += bytes(1 + len(p))
        mask += b"\x01" * len(a)
        count += 1
    return tokens, mask, count, first


def build_sft_split(split, args):
    """Generate one SFT split; returns (tokens, mask, number of examples, first text)."""
    n = args.num_sft_train if split == "train" else args.num_sft_val
    pairs = generate_pairs(args.op, args.digits, n, args.seed, split, stream="sft", fmt=args.format)
    return sft_tokens(pairs)


# ----------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Write the offline arithmetic dataset (llm.c format).")
    p.add_argument("--op", default="+", choices=sorted(OPS),
                   help="operation: '+', '-' (a-b with a>=b) or '*' (default '+')")
    p.add_argument("--digits", type=int, default=2,
                   help="operands are uniform in [0, 10**digits) (default 2)")
    p.add_argument("--format", default="reversed", choices=FORMATS,
                   help="how an example is written: plain (7+45=52), padded (07+45=052) or "
                        "reversed (07+45=250: padded, the result units first) (default reversed)")
    p.add_argument("--seed", type=int, default=1337,
                   help="random seed for sampling (default 1337); the "
                        "train/val split of pairs does not depend on it")
    p.add_argument("--num-train", type=int, default=200000,
                   help="number of training equations (default 200000)")
    p.add_argument("--num-val", type=int, default=2000,
                   help="number of validation equations (default 2000)")
    p.add_argument("--num-sft-train", type=int, default=50000,
                   help="SFT training equations, 0 = no SFT train split (default 50000)")
    p.add_argument("--num-sft-val", type=int, default=2000,
                   help="SFT validation equations, 0 = no SFT val split (default 2000)")
    p.add_argument("--out-dir", default=os.path.join("data", "arithmetic"),
                   help="output directory (default data/arithmetic)")
    args = p.parse_args(argv)
    if not 1 <= args.digits <= 18:
        p.error("--digits must be between 1 and 18")
    if args.num_train < 1 or args.num_val < 1:
        p.error("--num-train and --num-val must be at least 1")
    if args.num_sft_train < 0 or args.num_sft_val < 0:
        p.error("--num-sft-train and --num-sft-val must be at least 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    # generate every split before writing anything, so a failure leaves no
    # half-made dataset behind
    built = {}
    built_sft = {}
    try:
        for split in ("train", "val"):
            built[split] = build_pretrain_split(split, args)
        for split, n in (("train", args.num_sft_train), ("val", args.num_sft_val)):
            if n > 0:
                built_sft[split] = build_sft_split(split, args)
    except (RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for split in ("train", "val"):
        tokens, count, first = built[split]
        path = os.path.join(args.out_dir, f"{split}_000000.bin")
        write_shard(path, tokens)
        print(f"{path}: {len(tokens):,} tokens, {count:,} examples "
              f"(e.g. {first!r})")
    for split, (tokens, mask, count, first) in built_sft.items():
        path = os.path.join(args.out_dir, f"sft_{split}_000000.bin")
        mask_path = os.path.join(args.out_dir, f"sft_{split}_000000.mask")
        # the mask first: a reader that sees the new shard also sees its mask
        write_mask(mask_path, mask)
        write_shard(path, tokens)
        print(f"{path} + .mask: {len(tokens):,} tokens, {count:,} examples, "
              f"{sum(mask):,} answer tokens (e.g. {first!r})")
    tok_path = os.path.join(args.out_dir, "tokenizer.bin")
    vocab = write_tokenizer(tok_path, byte_tokenizer(), BYTE_EOT)
    print(f"{tok_path}: vocab {vocab}, eot {BYTE_EOT} (byte-level tokenizer)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
