#!/usr/bin/env bash
# CPU benchmark: one training step of GPT-2 124M (12 layers, 12 heads, 768 channels, vocab
# 50257 padded to 50304) at batch 4 x sequence 64, on all cores and on one core; the
# speed-up of all cores over one is measured in the same run. Random tokens, no data needed.
# The all-cores run has --profile: its table of operations (build/bench_cpu_profile.txt) and
# the step's distance from this machine's roofline, printed beside the step time.
# Usage: scripts/bench_cpu.sh [steps]   (default 4; the first step is a warm-up, not timed)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-4}
cores=$(nproc)
mkdir -p build
echo "GPT-2 124M training step, batch 4 x 64 tokens, $steps steps, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for threads in "$cores" 1; do
    echo "--- $threads thread(s)"
    profile=""
    if [ "$threads" = "$cores" ]; then profile=--profile; fi
    OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads ./train_gpt2cpu --model gpt2 --bench --batch 4 --seq 64 \
        --steps "$steps" --threads "$threads" $profile | tee "build/bench_cpu_$threads.log" | grep -E '^(step|average|model|backend)'
done
sed -n '/^profile: /,/^roofline/p' "build/bench_cpu_$cores.log" > build/bench_cpu_profile.txt
ms() { sed -nE 's/^average step.*: ([0-9.]+) ms.*/\1/p' "build/bench_cpu_$1.log"; }
all=$(ms "$cores"); one=$(ms 1)
roof=$(sed -nE 's/^roofline .*takes ([0-9.]+)x.*/\1/p' "build/bench_cpu_$cores.log")
echo
sed -n '/^profile      ceilings/p' "build/bench_cpu_$cores.log"
printf "%-12s %10s %12s %24s\n" "threads" "ms/step" "tokens/s" "step / roofline bound"
awk -v c="$cores" -v a="$all" -v o="$one" -v r="$roof" 'BEGIN {
    printf "%-12d %10.0f %12.0f %23.2fx\n", c, a, 256000 / a, r
    printf "%-12d %10.0f %12.0f\n", 1, o, 256000 / o
    printf "speed-up of %d threads over 1: %.2fx\n", c, o / a }'

# The matmul alone, our kernel against OpenBLAS (when the build found it), same shapes.
if [ -x ./bench_matmul ]; then
    echo
    echo "--- matmul: GPT-2 124M shapes, ours vs OpenBLAS ($cores threads)"
    OMP_NUM_THREADS=$cores ./bench_matmul
fi
