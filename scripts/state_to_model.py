#!/usr/bin/env python3
"""Turn a training-state directory (--save-state DIR) into one llm.c model file.

usage: python3 scripts/state_to_model.py DIR OUT.bin

Reads DIR/latest, the manifest it names, and every rank file (llmc/train/train_state.h describes the
format): each element of a rank file carries its index in the full model, so the mesh that
wrote the state does not matter. The manifest's last line (the CRC-32 of the lines before it) is
checked, each rank file's size and CRC-32 against the manifest, and every parameter must be
covered. The weights written are the master weights when
the state has them (a bf16 run), else the parameters: the fp32 values AdamW updates. The model
file is llm.c's version 3 (fp32), or version 10 for a mixture of experts (doc/expert-parallel.md),
the same bytes the trainer's --save writes for the same weights. Written to OUT.bin.tmp and
renamed when complete.
"""
import os, re, struct, sys, zlib
from array import array

MAGIC_STATE, MAGIC_MODEL = 20261123, 20240326


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    if len(sys.argv) != 3:
        die("usage: state_to_model.py DIR OUT.bin")
    d, out = sys.argv[1], sys.argv[2]
    latest = os.path.join(d, "latest")
    if not os.path.isfile(latest):
        die(f"'{d}' holds no complete training state (no 'latest' file)")
    name = open(latest, "rb").read().decode("latin-1")
    if not re.fullmatch(r"step-\d{8,}\n?", name):
        die(f"'{latest}' must hold one line naming a step directory (step-NNNNNNNN), it holds {name[:64]!r}")
    step_dir = os.path.join(d, name.rstrip("\n"))
    mpath = os.path.join(step_dir, "manifest")
    if not os.path.isfile(mpath):
        die(f"'{latest}' names '{step_dir}', which has no manifest: the state is incomplete")
    text = open(mpath, "rb").read()
    lines = text.decode("utf-8", "replace").splitlines()
    if not lines or lines[0] != "llmc training state 2":
        die(f"'{mpath}' is not a training-state manifest (format 2)")
    body = text[:text.rfind(b"\n", 0, len(text) - 1) + 1]
    if lines[-1] != f"crc32 {zlib.crc32(body):08x}":
        die(f"'{mpath}' is corrupt: its lines do not match its checksum line")
    kv, files = {}, []
    for line in lines[1:-1]:
        key, _, value = line.partition(" ")
        if key == "file":
            files.append(value.split())
        else:
            kv[key] = value
    world, has_master, n = int(kv["world"]), int(kv["has_master"]), int(kv["parameters"])
    if not re.fullmatch(r"[0-9a-f]{16}", kv.get("identity", "")):
        die(f"'{mpath}' has no valid 'identity' line (16 hex digits: the run it belongs to)")
    identity = int(kv["identity"], 16)
    cfg = kv["config"].split()
    c = {cfg[i]: cfg[i + 1] for i in range(0, len(cfg), 2)}
    if len(files) != world:
        die(f"'{mpath}' lists {len(files)} rank files for {world} ranks")
    full = array("f", bytes(4 * n))
    seen = bytearray(n)
    for r, (name, size, crc) in enumerate(files):
        path = os.path.join(step_dir, name)
        data = open(path, "rb").read()
        if len(data) != int(size):
            die(f"'{path}' has {len(data)} bytes, the manifest says {size}")
        if zlib.crc32(data) != int(crc, 16):
            die(f"'{path}' is corrupt: its CRC-32 does not match the manifest's")
        h = struct.unpack_from("<8q", data, 0)
        if h[0] != MAGIC_STATE or h[1] != 1 or h[2] != r or h[3] != world:
            die(f"'{path}': bad header {h[:4]}")
        if h[7] & (2**64 - 1) != identity:   # (read signed: the identity is 64 random bits)
            die(f"'{path}' belongs to run {h[7] & (2**64 - 1):016x}, the manifest to run {identity:016x}: files of two runs mixed")
        nruns, nvalues = h[5], h[6]
        runs = struct.unpack_from(f"<{2 * nruns}Q", data, 64)
        block = 1 if has_master else 0   # the master weights follow the parameters
        start = 64 + 16 * nruns + 4 * block * nvalues
        values = array("f", data[start:start + 4 * nvalues])
        k = 0
        for i in range(nruns):
            f, cnt = runs[2 * i], runs[2 * i + 1]
            full[f:f + cnt] = values[k:k + cnt]
            seen[f:f + cnt] = b"\x01" * cnt
            k += cnt
    if 0 in seen:
        die(f"'{step_dir}': parameter {seen.index(0)} is in no rank file: the state is incomplete")
    E = int(c["E"])
    header = [MAGIC_MODEL, 10 if E > 0 else 3, int(c["maxT"]), int(c["V"]), int(c["L"]), int(c["NH"]), int(c["C"]),
              int(c["Vp"])]
    if E > 0:   # E, k, N, then the capacity factor and the aux coefficient as float32 bits
        header += [E, int(c["k"]), int(c["N"])] + [struct.unpack("<i", struct.pack("<I", int(c[x], 16)))[0] for x in ("cf", "aux")]
    header += [0] * (256 - len(header))
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(full.tobytes())
    os.replace(tmp, out)
    print(f"{out}: {n} parameters from {step_dir} (step {kv['step']}, {world} rank files, mesh {kv['mesh']})")


if __name__ == "__main__":
    main()
