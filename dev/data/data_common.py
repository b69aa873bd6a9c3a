"""
Shared helpers for the dataset preparation scripts in dev/data/.

Everything here writes files in the binary formats used by karpathy's llm.c,
so the data produced by these scripts can be read by llm.c-style loaders
(and vice versa). All integers are little-endian.

Token shard (.bin):
    header: 256 x int32
        [0] = 20240520   magic number
        [1] = 1          version
        [2] = number of tokens in the shard
        [3..255] = 0
    body:   the tokens, one uint16 each

Loss mask (.mask), the companion of an SFT token shard sft_<split>_000000.bin:
    header: 256 x int32
        [0] = 20241123   magic number
        [1] = 1          version
        [2] = number of tokens (must equal the shard's)
        [3..255] = 0
    body:   one uint8 per token of the shard: 1 = train on this token (an
            answer token), 0 = context only (EOT, prompt)

Tokenizer (tokenizer.bin):
    header: 256 x uint32
        [0] = 20240328   magic number
        [1] = 2          version
        [2] = vocab_size
        [3] = id of the end-of-text (EOT) token
        [4..255] = 0
    body:   for each token id 0 .. vocab_size-1:
                one uint8 length L (1..255), then the L bytes of the token

Only the Python standard library is used.
"""

import os
import struct
import sys
from array import array

# ----------------------------------------------------------------------------
# format constants

HEADER_INTS = 256  # both headers are 256 four-byte integers (1024 bytes)

SHARD_MAGIC = 20240520
SHARD_VERSION = 1

MASK_MAGIC = 20241123
MASK_VERSION = 1

TOKENIZER_MAGIC = 20240328
TOKENIZER_VERSION = 2

# the byte-level tokenizer: ids 0..255 are the raw bytes, 256 is end-of-text
BYTE_EOT = 256
BYTE_VOCAB_SIZE = 257
EOT_TEXT = b"<|endoftext|>"


# ----------------------------------------------------------------------------
# small internal helpers

def _atomic_write(path, chunks):
    """Write the byte strings in `chunks` to `path` atomically.

    The data goes to `path + '.tmp'` first and is then renamed over `path`
    with os.replace, so a reader never sees a half-written file and an
    interrupted run never leaves a truncated file under the final name.
    """
    tmp_path = path + ".tmp"
    try:
        with open(tmp_path, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        # do not leave a stale .tmp file behind on failure
        try:
            os.remove(tmp_path)
        except OSError:
            pass
        raise


def _le_bytes(arr):
    """Return the raw bytes of an array.array in little-endian order."""
    if sys.byteorder == "big":
        arr = array(arr.typecode, arr)  # copy, then swap the copy
        arr.byteswap()
    return arr.tobytes()


# ----------------------------------------------------------------------------
# token shards

def write_shard(path, tokens):
    """Write a list (or other iterable) of token ids as an llm.c token shard.

    Every token must satisfy 0 <= t < 65536 because tokens are stored as uint16.
    Returns the number of tokens written.
    """
    if not isinstance(tokens, array) or tokens.typecode != "H":
        tokens = list(tokens)
        if tokens:
            lo, hi = min(tokens), max(tokens)
            if lo < 0 or hi >= 65536:
                raise ValueError(
                    f"token ids must be in [0, 65536) to fit in uint16; "
                    f"got min {lo}, max {hi}")
        tokens = array("H", tokens)
    n = len(tokens)
    if n >= 2**31:
        raise ValueError(f"too many tokens for one shard: {n}")
    header = [0] * HEADER_INTS
    header[0] = SHARD_MAGIC
    header[1] = SHARD_VERSION
    header[2] = n
    header_bytes = struct.pack("<%di" % HEADER_INTS, *header)
    _atomic_write(path, [header_bytes, _le_bytes(tokens)])
    return n


def read_shard(path):
    """Read an llm.c token shard back; returns an array('H') of tokens.

    Used for checks and tests; raises ValueError on a malformed file.
    """
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 4 * HEADER_INTS:
        raise ValueError(f"{path}: file too short for a shard header")
    header = struct.unpack_from("<%di" % HEADER_INTS, data, 0)
    if header[0] != SHARD_MAGIC:
        raise ValueError(f"{path}: bad magic {header[0]}, expected {SHARD_MAGIC}")
    if header[1] != SHARD_VERSION:
        raise ValueError(f"{path}: unsupported version {header[1]}")
    n = header[2]
    body = data[4 * HEADER_INTS:]
    if len(body) != 2 * n:
        raise ValueError(f"{path}: header says {n} tokens, body has "
                         f"{len(body)} bytes")
    tokens = array("H")
    tokens.frombytes(body)
    if sys.byteorder == "big":
        tokens.byteswap()
    return tokens


# ----------------------------------------------------------------------------
# loss masks (the .mask file beside an SFT token shard)

def write_mask(path, mask):
    """Write a loss mask: one value per token of the matching shard, each 0 or 1.

    `mask` is any iterable of 0/1 values (a bytes, array('B') or list).
    Written atomically like write_shard. Returns the number of values written.
    """
    body = bytes(mask)  # raises ValueError for values outside 0..255
    bad = body.translate(None, b"\x00\x01")
    if bad:
        raise ValueError(f"mask values must be 0 or 1; got {bad[0]}")
    n = len(body)
    if n >= 2**31:
        raise ValueError(f"too many mask values for one file: {n}")
    header = [0] * HEADER_INTS
    header[0] = MASK_MAGIC
    header[1] = MASK_VERSION
    header[2] = n
    _atomic_write(path, [struct.pack("<%di" % HEADER_INTS, *header), body])
    return n


def read_mask(path):
    """Read a loss mask back; returns its values as bytes (each 0 or 1).

    Used for checks and tests; raises ValueError on a malformed file.
    """
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 4 * HEADER_INTS:
        raise ValueError(f"{path}: file too short for a mask header")
    header = struct.unpack_from("<%di" % HEADER_INTS, data, 0)
    if header[0] != MASK_MAGIC:
        raise ValueError(f"{path}: bad magic {header[0]}, expected {MASK_MAGIC}")
    if header[1] != MASK_VERSION:
        raise ValueError(f"{path}: unsupported version {header[1]}")
    n = header[2]
    body = data[4 * HEADER_INTS:]
    if len(body) != n:
        raise ValueError(f"{path}: header says {n} values, body has {len(body)} bytes")
    if body.translate(None, b"\x00\x01"):
        raise ValueError(f"{path}: mask values must be 0 or 1")
    return body


# ----------------------------------------------------------------------------
# tokenizer files

def write_tokenizer(path, token_bytes_list, eot):
    """Write an llm.c tokenizer file.

    token_bytes_list[i] is the byte string of token id i; each must be
    1..255 bytes long (the length is stored in one uint8). `eot` is the id of
    the end-of-text token. Returns the vocabulary size.
    """
    vocab_size = len(token_bytes_list)
    if not 0 <= eot < vocab_size:
        raise ValueError(f"eot id {eot} is outside the vocabulary [0, {vocab_size})")
    header = [0] * HEADER_INTS
    header[0] = TOKENIZER_MAGIC
    header[1] = TOKENIZER_VERSION
    header[2] = vocab_size
    header[3] = eot
    parts = [struct.pack("<%dI" % HEADER_INTS, *header)]
    for i, b in enumerate(token_bytes_list):
        b = bytes(b)
        if not 1 <= len(b) <= 255:
            raise ValueError(f"token {i} has length {len(b)}; must be 1..255 bytes")
        parts.append(bytes([len(b)]))
        parts.append(b)
    _atomic_write(path, [b"".join(parts)])
    return vocab_size


def read_tokenizer(path):
    """Read an llm.c tokenizer file; returns (token_bytes_list, eot)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 4 * HEADER_INTS:
        raise ValueError(f"{path}: file too short for a tokenizer header")
    header = struct.unpack_from("<%dI" % HEADER_INTS, data, 0)
    if header[0] != TOKENIZER_MAGIC:
        raise ValueError(f"{path}: bad magic {header[0]}, expected {TOKENIZER_MAGIC}")
    if header[1] != TOKENIZER_VERSION:
        raise ValueError(f"{path}: unsupported version {header[1]}")
    vocab_size, eot = header[2], header[3]
    tokens = []
    pos = 4 * HEADER_INTS
    for _ in range(vocab_size):
        length = data[pos]
        tokens.append(data[pos + 1:pos + 1 + length])
        pos += 1 + length
    if pos != len(data):
        raise ValueError(f"{path}: {len(data) - pos} trailing bytes")
    return tokens, eot


# ----------------------------------------------------------------------------
# the byte-level tokenizer

def byte_tokenizer():
    """Token byte strings of the byte-level tokenizer (vocab 257, EOT 256).

    Ids 0..255 are the single bytes 0x00..0xff; id 256 is b'<|endoftext|>'.
    """
    return [bytes([i]) for i in range(256)] + [EOT_TEXT]


def encode_bytes(text):
    """Encode a str with the byte-level tokenizer: its UTF-8 bytes as ids."""
    return list(text.encode("utf-8"))
