#!/usr/bin/env bash
# Bad input (doc/errors.md): the test reads every table of doc/errors.md whose header is
# "| what | ranks | flags | message |" and runs each row on that many MPI ranks, in a scratch
# directory with a small dataset (data/), broken inputs made here from good ones (in/) and an
# output location (out/). Each row must:
#   - end with a non-zero exit from mpirun, within 60 s (no hang);
#   - write, on each rank's stderr (mpirun --tag-output), nothing but one whole line
#     "error: [rank R] ..." naming that rank (at most one per rank, at least one in all), each
#     holding the row's message (literally);
#   - leave out/ as it was: no result, no .tmp.
# A row that does not parse fails, so the doc and the test cannot drift apart. Rows run four at
# a time, each in a directory of its own. ERRORS_ONLY=TEXT runs the rows whose "what" holds TEXT;
# TRAINER=PATH runs another build of the trainer (a perturbed one, to see the test fail). The
# pairs of PERTURBED (below) show that checks can fail: their row, run with that check switched
# off (build/perturbed/train_gpt2cpu), must FAIL.
set -u
cd "$(dirname "$0")/.."
T=build/errors-test
rm -rf "$T"
mkdir -p "$T/in" "$T/out"
WHAT="the bad-input table"
# shellcheck source=test/lib_mpi.sh
source test/lib_mpi.sh   # pass, fail; stops here without MPI

python3 dev/data/arithmetic.py --format plain --out-dir "$T/data" --num-train 3000 --num-val 300 >/dev/null   # the sizes doc/errors.md quotes || { echo "FAIL data generation"; exit 1; }
./train_gpt2cpu --train-data "$T/data/train_*.bin" --val-data "$T/data/val_*.bin" --layers 2 --heads 2 --channels 32 \
    --max-seq 32 --batch 4 --seq 16 --steps 1 --eval-every 0 --accuracy 0 --sample-every 0 --threads 1 \
    --save "$T/in/good.bin" >"$T/good.out" 2>&1 || { echo "FAIL the good checkpoint: $(tail -2 "$T/good.out")"; exit 1; }

# ---- the broken inputs (doc/errors.md lists them); a new row's file is made here
python3 - "$T" <<'EOF'
import os, struct, sys
d = sys.argv[1]
i = f"{d}/in"
good = open(f"{i}/good.bin", "rb").read()
hdr = list(struct.unpack("256i", good[:1024]))
def put(name, data): open(f"{i}/{name}", "wb").write(data)
def with_header(h): return struct.pack("256i", *h) + good[1024:]
# checkpoints
put("ck_magic.bin", struct.pack("<i", 5) + good[4:])
put("ck_version.bin", good[:4] + struct.pack("<i", 4) + good[8:])
put("ck_truncated.bin", good[: len(good) // 2])
put("ck_long.bin", good + b"\0" * 64)
put("ck_short.bin", good[:100])
h = list(hdr); h[5] = 0; put("ck_shape.bin", with_header(h))                                      # 0 heads
h = list(hdr); h[1], h[8], h[9], h[10], h[11] = 10, 2, 3, 1, 0x3f800000; put("ck_moe.bin", with_header(h))   # top-3 of 2
nan = bytearray(good); nan[1024 + 400:1024 + 404] = struct.pack("<f", float("nan")); put("ck_nan.bin", bytes(nan))
put("empty.bin", b"")
os.makedirs(f"{i}/dir")
os.makedirs(f"{i}/shard_dir.bin")
# token shards
shard = open(f"{d}/data/val_000000.bin", "rb").read()
put("shard_magic.bin", struct.pack("<i", 1234) + shard[4:])
put("shard_version.bin", shard[:4] + struct.pack("<i", 7) + shard[8:])
put("shard_negative.bin", shard[:8] + struct.pack("<i", -5) + shard[12:])
put("shard_truncated.bin", shard[: len(shard) - 100])
put("shard_long.bin", shard + b"\0" * 10)
put("shard_short.bin", struct.pack("<3i", 20240520, 1, 20) + b"\0" * (1024 - 12) + struct.pack("<20H", *([65] * 20)))
put("shard_token.bin", struct.pack("<3i", 20240520, 1, 100) + b"\0" * (1024 - 12) + struct.pack("<100H", *([65] * 99 + [300])))
# tokenizers
tok = open(f"{d}/data/tokenizer.bin", "rb").read()
put("tok_magic.bin", struct.pack("<I", 7) + tok[4:])
put("tok_truncated.bin", tok[:1024 + 50])
th = list(struct.unpack("256I", tok[:1024])); th[2], th[3] = 100, 99
put("tok_vocab.bin", struct.pack("256I", *th) + b"".join(bytes([1, 65]) for _ in range(100)))
put("tok_trailing.bin", tok + b"xyz")                                                             # 3 bytes after the tokens
# SFT: a shard without its loss mask, and a mask with the wrong magic
sft = open(f"{d}/data/sft_val_000000.bin", "rb").read()
mask = open(f"{d}/data/sft_val_000000.mask", "rb").read()
put("sftnomask_000000.bin", sft)
put("sftmask_000000.bin", sft)
put("sftmask_000000.mask", struct.pack("<i", 99) + mask[4:])
put("sftnoans_000000.bin", sft)                                                                   # a mask without a 1
put("sftnoans_000000.mask", mask[:1024] + bytes(len(mask) - 1024))
# two training shards, the second's last token outside the vocabulary (found before step 1 only if
# every shard is read up front: a 2-step run never reaches it)
put("late_000000.bin", open(f"{d}/data/train_000000.bin", "rb").read())
put("late_000001.bin", struct.pack("<3i", 20240520, 1, 100) + b"\0" * (1024 - 12) + struct.pack("<100H", *([65] * 99 + [300])))
# more than 2^26 tokens (checked as the run reaches them): three global micro-batches of 4 x 16, a
# shard with token 300 at 199, and 2^26 tokens of 0 that take no disk (sparse)
n0 = 3 * 4 * 16 + 1
put("later_000000.bin", struct.pack("<3i", 20240520, 1, n0) + b"\0" * (1024 - 12) + open(f"{d}/data/train_000000.bin", "rb").read()[1024:1024 + 2 * n0])
put("later_000001.bin", struct.pack("<3i", 20240520, 1, 200) + b"\0" * (1024 - 12) + struct.pack("<200H", *([65] * 199 + [300])))
with open(f"{i}/later_000002.bin", "wb") as f:
    f.write(struct.pack("<3i", 20240520, 1, 1 << 26) + b"\0" * (1024 - 12))
    f.truncate(1024 + 2 * (1 << 26))
put("lshort_000000.bin", open(f"{d}/data/train_000000.bin", "rb").read())                          # a later shard too short
put("lshort_000001.bin", struct.pack("<3i", 20240520, 1, 20) + b"\0" * (1024 - 12) + struct.pack("<20H", *([65] * 20)))
# checkpoint headers that claim another shape than the file holds
h = list(hdr); h[4] = 10**9; put("ck_layers.bin", with_header(h))                                 # 10^9 layers
h = list(hdr); h[4] = 100; put("ck_deep.bin", with_header(h))                                     # 100 layers, 2 in the file
h = list(hdr); h[7] = 131072; put("ck_vocab.bin", with_header(h))                                 # a vocabulary padded to 131072
h = list(hdr); h[5], h[6] = 2, 2147483520; put("ck_channels.bin", with_header(h))                  # 2^31 channels
# inputs that are not regular files (out/fifo, in each row's directory, is another)
put("sftfifo_000000.bin", sft)
os.mkfifo(f"{i}/sftfifo_000000.mask")
# the planner's links files
put("links_good.txt", b"# measured with collbench\nintra 5 25\ninter 30 1\n")
put("links_unit.txt", b"intra 5 25x\n")
put("links_extra.txt", b"intra 5 25\ninter 10 2 7\n")
put("links_twice.txt", b"# measured\nintra 5 25\nintra 6 20\n")
put("links_negative.txt", b"intra -5 25\n")
put("links_empty.txt", b"# nothing measured yet\n\n")
# --comm-tuning files (llmc/comm/tuning.h): good for 2 ranks; a bandwidth "25x"; a size "10k"; a link twice;
# rows that overlap; rows for 4 ranks only; a negative latency
put("tune_good.txt", b"# collbench --autotune\nlink intra 5 25\nallreduce 2 2 0 99999999 ring ring\n")
put("tune_unit.txt", b"link intra 5 25x\nallreduce 2 2 0 99999999 ring ring\n")
put("tune_size.txt", b"allreduce 2 2 0 10k ring ring\n")
put("tune_twice.txt", b"# measured\nlink intra 5 25\nlink intra 6 20\n")
put("tune_overlap.txt", b"allreduce 2 2 0 1000 ring ring\nallreduce 2 2 1000 99999999 ring rabenseifner\n")
put("tune_p4.txt", b"link intra 5 25\nallreduce 4 4 0 99999999 ring ring\n")
put("tune_negative.txt", b"link intra -5 25\nallreduce 2 2 0 99999999 ring ring\n")
EOF
[ $? -eq 0 ] || { echo "FAIL making the broken inputs"; exit 1; }

# training-state directories (the rows under "Training-state directories"): a good state of the
# default model, saved at the end of a 2-step ZeRO-1 run on 2 ranks with the rows' BASE flags, and
# broken copies of it
(cd "$T" && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun --oversubscribe -np 2 \
    "$(realpath ../../train_gpt2cpu)" --train-data 'data/train_*.bin' --val-data 'data/val_*.bin' --batch 4 --seq 16 --steps 2 \
    --eval-every 0 --accuracy 0 --sample-every 0 --threads 1 --zero 1 --save-state in/state >state.out 2>&1) ||
    { echo "FAIL the good training state: $(tail -2 "$T/state.out")"; exit 1; }
S="$T/in/state/step-00000002"
[ -f "$S/manifest" ] || { echo "FAIL the good training state has no $S/manifest"; exit 1; }
bad_state() { rm -rf "$T/in/$1"; cp -r "$T/in/state" "$T/in/$1"; echo "$T/in/$1/step-00000002"; }
# seal STEPDIR: the manifest's checksums recomputed after an edit, as a user who knows the format
# would (then only the cross-checks can tell)
seal() {
    python3 - "$1" <<'EOF'
import sys, zlib
d = sys.argv[1]
lines = open(f"{d}/manifest").read().splitlines(keepends=True)[:-1]   # without its checksum line
for i, l in enumerate(lines):
    name = l.split(" ")[0]
    if name in ("position", "log", "metrics"):
        data = open(f"{d}/{name}", "rb").read()
        lines[i] = f"{name} {len(data)} {zlib.crc32(data):08x}\n"
    if name == "file":   # a rank file: "file rank-NNNNN.bin BYTES CRC32"
        f = l.split(" ")[1]
        data = open(f"{d}/{f}", "rb").read()
        lines[i] = f"file {f} {len(data)} {zlib.crc32(data):x}\n"
body = "".join(lines)
open(f"{d}/manifest", "w").write(body + f"crc32 {zlib.crc32(body.encode()):08x}\n")
EOF
}
rm "$(bad_state st_nolatest)/../latest"
rm "$(bad_state st_nomanifest)/manifest"
B=$(bad_state st_badmanifest); sed -i '1s/.*/llmc training state 9/' "$B/manifest"
B=$(bad_state st_fewfiles); sed -i '/^file rank-00001/d' "$B/manifest"; seal "$B"
rm "$(bad_state st_missing)/rank-00001.bin"
B=$(bad_state st_corrupt); printf '\x55' | dd of="$B/rank-00001.bin" bs=1 seek=3000 conv=notrunc 2>/dev/null
B=$(bad_state st_truncated); truncate -s -8 "$B/rank-00001.bin"
B=$(bad_state st_dirfile); rm "$B/rank-00001.bin"; mkdir "$B/rank-00001.bin"
B=$(bad_state st_badlatest); echo "../../elsewhere" >"$B/../latest"
B=$(bad_state st_fifo); rm "$B/manifest"; mkfifo "$B/manifest"
B=$(bad_state st_world_sealed); sed -i 's/^world 2$/world 4294967298/' "$B/manifest"; seal "$B"   # 2^32 + 2: an int would read 2
B=$(bad_state st_step_sealed); sed -i 's/^step 2$/step -1/' "$B/manifest"; seal "$B"
B=$(bad_state st_latestlines); printf 'step-00000002\ngarbage\nmore garbage\n' >"$B/../latest"
B=$(bad_state st_latestcrlf); printf 'step-00000002\r\n' >"$B/../latest"
B=$(bad_state st_latestesc); printf '\033[2Kstep-00000002\n' >"$B/../latest"
# the manifest, position, log and metrics files edited; "_sealed": and the checksums made to match
B=$(bad_state st_mstep); sed -i 's/^step 2$/step 1/' "$B/manifest"
B=$(bad_state st_mstep_sealed); sed -i 's/^step 2$/step 1/' "$B/manifest"; seal "$B"
B=$(bad_state st_medit); sed -i 's/^tensor wte /tensor wtx /' "$B/manifest"
B=$(bad_state st_mnocrc); sed -i '$d' "$B/manifest"
B=$(bad_state st_logtext); echo hello >"$B/log"
B=$(bad_state st_logtext_sealed); echo hello >"$B/log"; seal "$B"
B=$(bad_state st_posedit); sed -i 's/^data.pos .*/data.pos 0/' "$B/position"
B=$(bad_state st_posstep_sealed); sed -i 's/^trainer.step 2$/trainer.step 1/' "$B/position"; seal "$B"
B=$(bad_state st_metrics); echo "step,reward" >"$B/metrics"
# values that follow from others, edited and sealed (llmc/train/state_manifest.h, state_shards.h): the
# data position one token on, AdamW's t one less, a tensor's offset, the run's identity in the
# position file and in a rank file's header, a NaN and a negative v among a rank file's values
B=$(bad_state st_datapos_sealed); sed -i 's/^data.pos 128$/data.pos 129/' "$B/position"; seal "$B"
B=$(bad_state st_adamw_sealed); sed -i 's/^adamw_t 2$/adamw_t 1/' "$B/manifest"; seal "$B"
B=$(bad_state st_offset_sealed); sed -i 's/^tensor wpe offset \([0-9]*\) /tensor wpe offset 1\1 /' "$B/manifest"; seal "$B"
B=$(bad_state st_identity_sealed); sed -i 's/^trainer.identity .*/trainer.identity 12345/' "$B/position"; seal "$B"
rank_values() {   # FILE KIND INDEX VALUE: one float of a rank file set (KIND 0 the parameters, 2 v: no master weights here)
    python3 - "$@" <<'PY'
import struct, sys
f, kind, i, v = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
b = bytearray(open(f, "rb").read())
h = struct.unpack("<8q", bytes(b[:64]))
at = 64 + 16 * h[5] + 4 * (kind * h[6] + i)
b[at:at + 4] = struct.pack("<f", v)
open(f, "wb").write(bytes(b))
PY
}
B=$(bad_state st_nan_sealed); rank_values "$B/rank-00001.bin" 0 5 nan; seal "$B"
B=$(bad_state st_negv_sealed); rank_values "$B/rank-00000.bin" 2 7 -1; seal "$B"
B=$(bad_state st_rankid_sealed); python3 -c "
import sys; f = sys.argv[1]; b = bytearray(open(f, 'rb').read()); b[56:64] = (12345).to_bytes(8, 'little'); open(f, 'wb').write(bytes(b))" "$B/rank-00001.bin"; seal "$B"
# state directories held by a lock (llmc/train/state_lock.h): by a live process of this host (pid 1),
# by a job on another host, a lock that is no 'HOST PID', a lock that is a directory; a good state
# held by a live process (a resume into it)
mkdir -p "$T/in/st_locked" "$T/in/st_lockother" "$T/in/st_badlock" "$T/in/st_lockdir/lock"
echo "$(hostname) 1" >"$T/in/st_locked/lock"
echo "node7 4242" >"$T/in/st_lockother/lock"
echo "garbage" >"$T/in/st_badlock/lock"
echo "$(hostname) 1" >"$(bad_state st_lockstate)/../lock"
# --save-state directories: a step-K.tmp and a latest of the wrong kind (caught before step 1), a
# step directory a save cannot replace (it holds a directory: the save fails after its step), with
# and without a previous state
mkdir -p "$T/in/st_tmpfile" "$T/in/st_latestdir/latest" "$T/in/st_firstsave/step-00000002/keep"
echo "not a state" >"$T/in/st_tmpfile/step-00000002.tmp"
mkdir -p "$(bad_state st_keeps)/../step-00000001/keep"

# ---- the rows
TRAINER=$(realpath "${TRAINER:-./train_gpt2cpu}")
python3 - "$T" "$TRAINER" "${ERRORS_ONLY:-}" <<'EOF'
import concurrent.futures, os, re, shlex, socket, subprocess, sys, time
scratch, trainer, only = sys.argv[1], sys.argv[2], sys.argv[3]

# The checks can fail: each (perturbation of test/perturbations.py, a row's "what") below runs that
# row with the perturbed trainer (build/perturbed/train_gpt2cpu, LLMC_PERTURB=NAME: that check
# switched off), and the row must then FAIL. To add one: a perturbation there, a line here.
PERTURBED = [
    ("the manifest's checksum not checked", "a manifest line edited"),
    ("a small state file's checksum not checked", "the position file edited"),
    ("the manifest's step not checked against its directory", "the manifest's step changed, its checksums made to match"),
    ("the position's step not checked", "the position file of another step, its checksums made to match"),
    ("the log not checked against the step", "the log replaced by text, its checksums made to match"),
    ("control characters kept in error messages", "`latest` with garbage lines"),
    ("the state directory not checked before the run", "a training-state directory holding a step-K.tmp file"),
    ("inputs not checked to be regular files", "a character device as validation data"),
    ("outputs not compared with the inputs", "a log onto the tokenizer"),
    ("no upper bounds on the flags", "an amax history of 2^31 steps"),
    ("no limits on the model's shape", "a header claiming 10^9 layers"),
    ("memory not checked before it is allocated", "a model no memory holds"),
    ("a checkpoint header not checked against its file", "a header claiming 100 layers of a 2-layer file"),
    ("flags that do nothing accepted", "top-k without experts"),
    ("a links line of any length", "a line with a fourth field"),
    ("a state's numbers read with a sign", "a negative step, its checksums made to match"),
    ("a state's numbers cut to an int", "a world of 2^32 + 2 ranks, its checksums made to match"),
    ("an output's name not checked against the file system's limit", "a save name whose temporary file is too long"),
    ("outputs allowed in /proc and /sys", "a log in /proc"),
    ("inputs allowed inside the state directory", "an input inside the training-state directory"),
    ("a tuning number read up to its first bad character", "a tuning link with a unit"),
    ("tuning rows allowed to overlap", "tuning rows that overlap"),
    ("a tuning file without rows for the job accepted", "a tuning file for 4 ranks on 2"),
    ("a tuning file accepted where auto never runs", "a tuning file auto never reads"),
    ("a live job's lock taken over", "a state directory a live job of this host holds"),
    ("the data position not derived from the step", "the data position one token on, its checksums made to match"),
    ("AdamW's t not derived from the log", "AdamW's t one less, its checksums made to match"),
    ("the tensor lines not checked", "a tensor's offset changed, its checksums made to match"),
    ("the position's run not checked", "the position file of another run, its checksums made to match"),
    ("a rank file's run not checked", "a rank file of another run, its checksums made to match"),
    ("non-finite state values accepted", "a NaN among a rank file's weights, its checksums made to match"),
    ("--profile with nothing to profile accepted", "a profile of one step"),
    ("--mesh auto beside --plan accepted", "--mesh auto beside --plan all"),
    ("the planner's no-answer without an error line", "a plan for 65536 devices"),
    ("OMP_NUM_THREADS not bounded", "OMP_NUM_THREADS of 300 on the planner"),
    ("a tokenizer with trailing bytes accepted", "a tokenizer with bytes after its tokens"),
    ("an SFT mask without an answer accepted", "an SFT training mask without an answer token"),
    ("the shards' tokens not checked up front", "a bad token in a shard the run would reach later"),
    ("the shards ahead not checked at the step's boundary", "a bad token in a shard the run reaches mid-run (a set of more than 2^26 tokens)"),
    ("the shards' sizes not checked up front", "a later shard shorter than one batch"),
]
PERTURBED_BIN, PERTURBED_SRC = "build/perturbed/train_gpt2cpu", "build/perturbed/src"
BASE = shlex.split("--train-data 'data/train_*.bin' --val-data 'data/val_*.bin' --tokenizer data/tokenizer.bin "
                   "--sft-train 'data/sft_train_*.bin' --sft-val 'data/sft_val_*.bin' --prompts 'data/sft_train_*.bin' "
                   "--batch 4 --seq 16 --steps 2 --eval-every 0 --eval-batches 1 --accuracy 0 --sample-every 0 "
                   "--threads 1 --log out/run.log --save out/run.bin")
MPIRUN = ["timeout", "60", "mpirun", "--oversubscribe", "--mca", "btl", "self,vader", "--mca", "mpi_yield_when_idle", "1",
          "--tag-output"]

# every table headed "| what | ranks | flags | message |"; each of its rows must parse
HEADER = ["what", "ranks", "flags", "message"]
rows, bad = [], []
in_table = False
for n, line in enumerate(open("doc/errors.md"), 1):
    line = line.strip()
    if not line.startswith("|"):
        in_table = False
        continue
    cells = [c.strip() for c in line.strip("|").split("|")]
    if [c.lower() for c in cells] == HEADER:
        in_table = True
        continue
    if not in_table and "flags" in line.lower() and "message" in line.lower():
        bad.append(f"line {n}: a table header that is not '| what | ranks | flags | message |': {line}")
    if not in_table or re.fullmatch(r"[-: |]+", line):
        continue
    m = len(cells) == 4 and re.fullmatch(r"\d+", cells[1]) and re.fullmatch(r"`[^`]+`", cells[2]) and re.fullmatch(r"`[^`]+`", cells[3])
    if not m:
        bad.append(f"line {n}: a row that is not '| what | RANKS | `FLAGS` | `MESSAGE` |': {line}")
        continue
    rows.append((n, cells[0], int(cells[1]), cells[2][1:-1], cells[3][1:-1]))
for b in bad:
    print(f"FAIL doc/errors.md {b}")
if only:
    rows = [r for r in rows if only in r[1]]
elif len(rows) < 40:
    print(f"FAIL doc/errors.md has {len(rows)} rows, fewer than 40")

env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

def listing(d):   # what a directory holds, recursively
    out = []
    for root, dirs, files in os.walk(d):
        out += [os.path.relpath(os.path.join(root, x), d) + ("/" if x in dirs else "") for x in dirs + files]
    return sorted(out)

# The variables a row gives the ranks: mpirun -x NAME, or, where test/run_tests.sh has set
# OMPI_MCA_mca_base_env_list (Open MPI refuses the two together, and mpirun would not start at
# all), appended to that list
def ranks_env(extra):
    have = env.get("OMPI_MCA_mca_base_env_list")
    if have is None:
        return [x for k in extra for x in ("-x", k)], dict(env, **extra)
    return [], dict(env, **extra, OMPI_MCA_mca_base_env_list=";".join([have] + [f"{k}={v}" for k, v in extra.items()]))

def run(row, perturbation=None):
    n, what, ranks, flags, message = row
    d = f"{scratch}/rows/{n}" + (f"-p{PERTURBED.index(perturbation)}" if perturbation else "")
    os.makedirs(f"{d}/out/dir")
    os.makedirs(f"{d}/out/busy.bin.tmp")
    open(f"{d}/out/file.txt", "w").write("a file\n")
    os.mkfifo(f"{d}/out/fifo")   # not a regular file (never a real device: a broken check would replace it)
    os.symlink("file.txt", f"{d}/out/link.txt")   # another name of out/file.txt
    os.makedirs(f"{d}/out/held")   # a state directory a live process of this host holds (pid 1: init)
    open(f"{d}/out/held/lock", "w").write(f"{socket.gethostname()} 1\n")
    for x in ("data", "in"):
        os.symlink(f"../../{x}", f"{d}/{x}")
    before = listing(f"{d}/out")
    t0 = time.time()
    words = shlex.split(flags)   # leading NAME=VALUE words: the ranks' environment (mpirun -x NAME)
    assigns = [w for w in words[:next((i for i, w in enumerate(words) if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w)), len(words))]]
    words = words[len(assigns):]
    extra = dict(a.split("=", 1) for a in assigns)
    if perturbation:
        extra["LLMC_PERTURB"] = perturbation[0]
    xs, run_env = ranks_env(extra)
    cmd = MPIRUN + xs + ["-np", str(ranks), os.path.realpath(PERTURBED_BIN) if perturbation else trainer]
    p = subprocess.run(cmd + BASE + words, cwd=d, env=run_env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    secs = time.time() - t0
    open(f"{d}/run.out", "w").write(p.stdout)
    problems, lines, per_rank = [], [], {}
    for l in p.stdout.splitlines():
        m = re.match(r"\[\d+,(\d+)\]<stderr>:(.*)$", l)
        if not m:
            continue
        r, text = int(m.group(1)), m.group(2)
        lines.append(text)
        per_rank[r] = per_rank.get(r, 0) + 1
        if not text.startswith(f"error: [rank {r}] "):
            problems.append(f"rank {r} wrote a line that is not 'error: [rank {r}] ...': {text!r}")
        elif message not in text:
            problems.append(f"rank {r}: {text!r} does not hold the message")
    if p.returncode == 0 or p.returncode == 124 or secs >= 60:
        problems.append(f"exit status {p.returncode} after {secs:.0f} s (want non-zero, under 60 s)")
    if not lines:
        problems.append("no error line on stderr")
    problems += [f"rank {r} wrote {k} lines (want one)" for r, k in per_rank.items() if k > 1]
    after = listing(f"{d}/out")
    if after != before:
        problems.append(f"out/ changed: now {after}")
    return row, problems, lines, secs

# the perturbed runs: the pairs whose row is among the rows run (none when TRAINER is another build)
perturbed = []
src = lambda f: open(f"{PERTURBED_SRC}/{f}").read() if os.path.exists(f"{PERTURBED_SRC}/{f}") else ""
for name, what in PERTURBED if trainer == os.path.realpath("train_gpt2cpu") else []:
    matching = [r for r in rows if r[1] == what]
    missing = [l for l in src("missing.txt").splitlines() if l.startswith(name + ": ")]
    if not matching:
        if not only:
            print(f"FAIL perturbation '{name}': doc/errors.md has no row '{what}'")
    elif not os.access(PERTURBED_BIN, os.X_OK):
        print(f"FAIL perturbation '{name}': {PERTURBED_BIN} is not built (make {PERTURBED_BIN})")
    elif f'    "{name}",' not in src("perturb.h"):
        print(f"FAIL perturbation '{name}' is not in test/perturbations.py (or {PERTURBED_BIN} is out of date)")
    elif missing:
        print(f"FAIL perturbation '{name}': {missing[0][:160]}")
    else:
        perturbed.append((matching[0], (name, what)))

with concurrent.futures.ThreadPoolExecutor(4) as pool:
    checked = pool.map(lambda x: run(*x), perturbed)
    for (n, what, ranks, flags, message), problems, lines, secs in pool.map(run, rows):
        if problems:
            print(f"FAIL bad input '{what}' ({flags}, {ranks} ranks, doc line {n})")
            for x in problems[:4]:
                print(f"     {x}")
            print(f"     wanted: {message}")
        else:
            first = lines[0].split("] ", 1)[1]
            print(f"PASS bad input '{what}' on {ranks} ranks: exit non-zero in {secs:.1f} s, "
                  f"{len(lines)} whole line(s): {first[:90]}")
    for (row, problems, lines, secs), (_, (name, what)) in zip(checked, perturbed):
        if problems:
            print(f"PASS perturbation '{name}' fails row '{what}': {problems[0][:100]}")
        else:
            print(f"FAIL perturbation '{name}' went unnoticed: row '{what}' still passes")
EOF
