#!/usr/bin/env bash
# --profile: its accounting against the model's counts (test_profilecpu), then the table the
# trainer prints for 3 steps of the tiny model: the operations' ms plus "other" add up to the
# step's, the shares to 100%, the rows' bounds to the roofline line's bound, and step / bound
# to the printed ratio (each within the printed digits).
set -u
cd "$(dirname "$0")/.."
fail=0
./test_profilecpu || fail=1
out=$(./train_gpt2cpu --steps 3 --batch 8 --seq 32 --eval-every 0 --accuracy 0 --sample-every 0 --threads 2 --profile 2>&1)
echo "$out" | sed -n '/^profile: /,/^roofline/p'
echo "$out" | awk '
    /^profile: / { table = 1; next }
    table && /^operation/ { next }
    table && /^other / { other_ms = $2; other_share = $3; next }
    table && /^step / { step_ms = $2; table = 0; next }
    table && /^roofline/ { table = 0 }
    table && NF >= 5 {   # an operation row: name (1-2 words), part, calls, ms, share, ... bound ms
        for (i = 1; i <= NF; i++) if ($i ~ /^(fwd|bwd|update|comm)$/) break
        ms += $(i + 2); share += $(i + 3); rows++
        if ($i != "comm") { bound += $(i + 9); brows++ }
        next }
    /^roofline/ { for (i = 1; i <= NF; i++) { if ($i == "bound") pb = $(i + 1); if ($i ~ /x$/ && $i + 0 > 0) ratio = $i + 0 } }
    END {
        bad = 0
        if (rows < 20) { print "FAIL the table has " rows " operation rows (expected the step'"'"'s 20 or more)"; bad = 1 }
        d = ms + other_ms - step_ms
        if (d < -0.006 * (rows + 2) || d > 0.006 * (rows + 2)) { printf "FAIL operations %.2f + other %.2f != step %.2f ms\n", ms, other_ms, step_ms; bad = 1 }
        else printf "PASS operations %.2f ms + other %.2f ms = step %.2f ms\n", ms, other_ms, step_ms
        s = share + other_share
        if (s < 100 - 0.06 * (rows + 1) || s > 100 + 0.06 * (rows + 1)) { printf "FAIL shares sum to %.1f%%\n", s; bad = 1 }
        else printf "PASS shares sum to %.1f%%\n", s
        d = bound - pb
        if (pb <= 0 || d < -0.006 * brows || d > 0.006 * brows) { printf "FAIL rows'"'"' bounds %.2f != roofline bound %.2f ms\n", bound, pb; bad = 1 }
        else printf "PASS rows'"'"' bounds sum to the roofline bound, %.2f ms\n", pb
        r = step_ms / pb
        if (ratio <= 0 || r - ratio > 0.006 || ratio - r > 0.006) { printf "FAIL printed ratio %.2f != step / bound %.3f\n", ratio, r; bad = 1 }
        else printf "PASS step / bound = %.2fx, as printed\n", ratio
        exit bad }' || fail=1
[ $fail = 0 ] && echo "profile: all passed" || echo "profile: FAILED"
exit $fail
