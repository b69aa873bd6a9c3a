#!/usr/bin/env bash
# The number formats and the CPU backend's reduced-precision storage (test/test_precision.cu),
# then the same test built from a copy of llmc/ that holds deliberate bugs: every one must be
# reported as FAIL by the check that is about it (a test must be seen to fail when the thing it
# checks is broken). The bugs are compiled into one copy, each behind a switch, built once with
# -O1 (faster to compile); each bug is switched on in a run of its group of checks only, two
# runs at a time.
#   bash test/test_precision.sh [BINARY]     (default ./test_precisioncpu, built by make)
set -u
cd "$(dirname "$0")/.."
bin=${1:-./test_precisioncpu}
if [ ! -x "$bin" ]; then echo "FAIL $bin is not built (make test_precisioncpu)"; exit 1; fi
"$bin"
status=$?

T=$(mktemp -d "${TMPDIR:-/tmp}/test_precision.XXXXXX")
trap 'rm -rf "$T"' EXIT
CXX=${CXX:-g++}

# The deliberate bugs, all in ONE copy of llmc/ and test/test_precision.cu, each behind a switch
# written by test/perturbations.py's switched() (FORM stmt: "if (on) { NEW } else { OLD }", expr:
# "(on ? (NEW) : (OLD))"), as it does for the trainer; LLMC_PERTURB=N switches bug N on. One build instead of one per bug; each bug must then fail a check of GROUP whose line
# matches PATTERN.
P=llmc/precision.h
specs=(
    "round_format rounds ties away from zero|$P|stmt|u += (1u << (k - 1)) - 1u + ((u >> k) & 1u);|u += (1u << (k - 1));|fp16|ties to even"
    "E4M3 overflows to inf (saturate off)|$P|expr|round_format(x, 3, -6, 448.0f, 1)|round_format(x, 3, -6, 448.0f, 0)|e4m3|overflow"
    "round_bf16 rounds ties up|$P|stmt|u += 0x7fffu + ((u >> 16) & 1u);|u += 0x8000u;|bf16|ties to even"
    "subnormals truncated instead of rounded|$P|stmt|r = rintf(a * pow2f(m - emin)) * pow2f(emin - m);|r = truncf(a * pow2f(m - emin)) * pow2f(emin - m);|e5m2|underflow"
    "stochastic rounding biased (half the random range)|$P|stmt|u += random & 0xffffu;|u += (random & 0xffffu) >> 1;|stochastic|exactly x"
    "the GELU output is not rounded|llmc/cpu/gelu.h|stmt|floatx_round(out, N, ROUND_ACT);|(void)0;|kernels|floatX outputs"
    "AdamW writes the bf16 parameters rounded to nearest|llmc/cpu/adamw.h|expr|round_bf16_stochastic(p, stochastic_bits(i, seed))|round_bf16(p)|kernels|round_bf16_stochastic"
)
mkdir -p "$T/src/test"
cp -r llmc "$T/src/"
cp test/test_precision.cu "$T/src/test/"
# writes $T/src/missing.txt: the bugs whose OLD text is not in FILE exactly once (each then FAILs)
printf '%s\n' "${specs[@]}" | python3 -c '
import sys
sys.path.insert(0, "test")
from perturbations import switched
root = sys.argv[1]
missing = open(root + "/missing.txt", "w")
for k, spec in enumerate(sys.stdin.read().splitlines()):
    label, path, form, old, new = spec.split("|")[:5]
    text = open(root + "/" + path).read()
    if text.count(old) != 1:
        missing.write("%d\n" % k)
        continue
    open(root + "/" + path, "w").write(text.replace(old, switched(form, old, new, k)))
open(root + "/perturb.h", "w").write(
    "#include <stdlib.h>\n"
    "static inline int llmc_perturbed(int k) {   // LLMC_PERTURB=k: bug k of test/test_precision.sh is on\n"
    "    static const int on = getenv(\"LLMC_PERTURB\") ? atoi(getenv(\"LLMC_PERTURB\")) : -1;\n"
    "    return on == k;\n"
    "}\n")
' "$T/src"
built=1
if ! "$CXX" -std=c++17 -O1 -fopenmp -x c++ -DLLMC_CPU -include "$T/src/perturb.h" "$T/src/test/test_precision.cu" -o "$T/t" -lm >"$T/build.log" 2>&1; then
    built=0
fi

# perturbation N LABEL GROUP PATTERN: writes $T/N.result, one PASS/FAIL line (and details)
perturbation() {
    local n=$1 label=$2 group=$3 pattern=$4 d="$T/$1"
    if grep -qx "$n" "$T/src/missing.txt"; then
        echo "FAIL perturbation '$label': the text to replace is not in its file exactly once" >"$d.result"; return
    fi
    if [ $built = 0 ]; then
        { echo "FAIL perturbation '$label': the perturbed copy does not build"; tail -3 "$T/build.log"; } >"$d.result"; return
    fi
    LLMC_PERTURB=$n OMP_NUM_THREADS=1 "$T/t" "$group" >"$d.out" 2>&1
    local rc=$? hits
    hits=$(grep '^FAIL ' "$d.out" | grep -c -- "$pattern")
    if [ "$rc" -ne 0 ] && [ "$hits" -ge 1 ]; then
        echo "PASS perturbation '$label' is caught: $hits FAIL line(s), first: $(grep '^FAIL ' "$d.out" | grep -m1 -- "$pattern" | cut -c6-150)" >"$d.result"
    else
        { echo "FAIL perturbation '$label' went unnoticed (exit $rc, $hits FAIL lines matching '$pattern')"; tail -3 "$d.out"; } >"$d.result"
    fi
}

pids=()
for i in "${!specs[@]}"; do
    IFS='|' read -r label file form old new group pattern <<<"${specs[$i]}"
    perturbation "$i" "$label" "$group" "$pattern" &
    pids+=($!)
    if [ ${#pids[@]} -ge 2 ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
wait
pfail=0
for i in "${!specs[@]}"; do
    cat "$T/$i.result"
    grep -q '^FAIL ' "$T/$i.result" && pfail=1
done
[ "$status" -eq 0 ] && [ "$pfail" -eq 0 ]
