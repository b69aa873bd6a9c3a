#!/usr/bin/env python3
"""A multi-rank bf16 run against the single-rank one (test_emu_dp.sh, test_emu_tp.sh say why
these tolerances): every step's loss within 2^-9 relative, every gradient norm within 2^-8;
optionally the step-1 loss within --step1 (data parallelism: the forward runs on the same
parameters) and the final parameters per tensor, norm-wise, within 2^-6 (--params; the key bias
left out, test/compare_runs.py says why). Without --params their largest error is printed only.

usage: judge_bf16.py REF RUN LABEL [--step1 TOL] [--params]
REF and RUN name a --log file and a --save checkpoint: REF.log, REF.bin. Prints one PASS/FAIL line."""
import math, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_runs import read_log, read_ckpt

args = sys.argv[1:]
step1 = None
judge_params = "--params" in args
if judge_params: args.remove("--params")
if "--step1" in args:
    i = args.index("--step1"); step1 = float(args[i + 1]); del args[i:i + 2]
ref, run, label = args
TOL_LOSS, TOL_NORM, TOL_PARAM = 2.0 ** -9, 2.0 ** -8, 2.0 ** -6
a, b = read_log(ref + ".log"), read_log(run + ".log")
if len(a) != len(b) or not a:
    print(f"FAIL {label}: {len(b)} logged steps, want {len(a)}"); sys.exit(1)
rel = lambda x, y: abs(x - y) / (abs(x) or 1.0)
loss1 = rel(a[0][1], b[0][1])
loss = max(rel(x[1], y[1]) for x, y in zip(a, b))
norm = max(rel(x[2], y[2]) for x, y in zip(a, b))
pa, L, C = read_ckpt(ref + ".bin")
pb, _, _ = read_ckpt(run + ".bin")
param, pname = 0.0, ""
for name in pa:
    x, y = pa[name], pb[name]
    if name == "qkvb":   # the key bias has no effect on the loss (compare_runs.py): q and v only
        keep = [i for i in range(len(x)) if not (C <= i % (3 * C) < 2 * C)]
        x, y = [x[i] for i in keep], [y[i] for i in keep]
    err = math.sqrt(sum((u - v) ** 2 for u, v in zip(x, y))) / (math.sqrt(sum(u * u for u in x)) or 1.0)
    if err > param:
        param, pname = err, name
ok = loss <= TOL_LOSS and norm <= TOL_NORM
parts = []
if step1 is not None:
    ok = ok and loss1 <= step1
    parts.append(f"step-1 loss {loss1:.1e} (tol {step1:g})")
parts.append(f"losses {loss:.1e} (tol 2^-9)")
parts.append(f"grad norms {norm:.1e} (tol 2^-8)")
if judge_params:
    ok = ok and param <= TOL_PARAM
    parts.append(f"params {param:.1e} in {pname} (tol 2^-6)")
else:
    parts.append(f"params {param:.1e} in {pname} (not judged)")
print(f"{'PASS' if ok else 'FAIL'} {label}: " + ", ".join(parts))
sys.exit(0 if ok else 1)
