#!/usr/bin/env bash
# The number formats and the CPU backend's reduced-precision storage (test/test_precision.cu),
# then the same test built from copies of llmc/ with a deliberate bug each: every one must be
# reported as FAIL by the check that is about it (a test must be seen to fail when the thing it
# checks is broken). The perturbed copies are built with -O1 (faster to compile) and run on the
# group of checks concerned only, two at a time.
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

# perturbation N LABEL FILE OLD NEW GROUP PATTERN: writes $T/N.result, one PASS/FAIL line (and
# details): the copy of llmc/ with OLD replaced by NEW in FILE must fail a check of GROUP whose
# line matches PATTERN
perturbation() {
    local n=$1 label=$2 file=$3 old=$4 new=$5 group=$6 pattern=$7 d="$T/$1"
    mkdir -p "$d/test"
    cp -r llmc "$d/"
    cp test/test_precision.cu "$d/test/"
    if ! python3 - "$d/$file" "$old" "$new" <<'EOF'; then
import sys
path, old, new = sys.argv[1:4]
s = open(path).read()
if s.count(old) != 1: sys.exit(1)
open(path, "w").write(s.replace(old, new))
EOF
        echo "FAIL perturbation '$label': the text to replace is not in $file exactly once" >"$d.result"; return
    fi
    if ! "$CXX" -std=c++17 -O1 -fopenmp -x c++ -DLLMC_CPU "$d/test/test_precision.cu" -o "$d/t" -lm >"$d/build.log" 2>&1; then
        { echo "FAIL perturbation '$label': the perturbed copy does not build"; tail -3 "$d/build.log"; } >"$d.result"; return
    fi
    OMP_NUM_THREADS=1 "$d/t" "$group" >"$d/out" 2>&1
    local rc=$? hits
    hits=$(grep '^FAIL ' "$d/out" | grep -c -- "$pattern")
    if [ "$rc" -ne 0 ] && [ "$hits" -ge 1 ]; then
        echo "PASS perturbation '$label' is caught: $hits FAIL line(s), first: $(grep '^FAIL ' "$d/out" | grep -m1 -- "$pattern" | cut -c6-150)" >"$d.result"
    else
        { echo "FAIL perturbation '$label' went unnoticed (exit $rc, $hits FAIL lines matching '$pattern')"; tail -3 "$d/out"; } >"$d.result"
    fi
}

P=llmc/precision.h
specs=(
    "round_format rounds ties away from zero|$P|u += (1u << (k - 1)) - 1u + ((u >> k) & 1u);|u += (1u << (k - 1));|fp16|ties to even"
    "E4M3 overflows to inf (saturate off)|$P|round_format(x, 3, -6, 448.0f, 1)|round_format(x, 3, -6, 448.0f, 0)|e4m3|overflow"
    "round_bf16 rounds ties up|$P|u += 0x7fffu + ((u >> 16) & 1u);|u += 0x8000u;|bf16|ties to even"
    "subnormals truncated instead of rounded|$P|r = rintf(a * pow2f(m - emin)) * pow2f(emin - m);|r = truncf(a * pow2f(m - emin)) * pow2f(emin - m);|e5m2|underflow"
    "stochastic rounding biased (half the random range)|$P|u += random & 0xffffu;|u += (random & 0xffffu) >> 1;|stochastic|exactly x"
    "the GELU output is not rounded|llmc/cpu/gelu.h|    floatx_round(out, N, ROUND_ACT);|    (void)0;|kernels|floatX outputs"
    "AdamW writes the bf16 parameters rounded to nearest|llmc/cpu/adamw.h|round_bf16_stochastic(p, stochastic_bits(i, seed))|round_bf16(p)|kernels|round_bf16_stochastic"
)
pids=()
for i in "${!specs[@]}"; do
    IFS='|' read -r label file old new group pattern <<<"${specs[$i]}"
    perturbation "$i" "$label" "$file" "$old" "$new" "$group" "$pattern" &
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
