#!/usr/bin/env python3
"""Compare a parallel run with the single-rank run it must reproduce.

usage: compare_runs.py REF.log REF.bin RUN.log RUN.bin [--tol 1e-5] [--loss-floor X] [--adam-bound LR,STEPS]
                       [--label TEXT]

The logs are the trainer's --log files (step, loss, norm, lr at full precision), the .bin
files its --save checkpoints (llm.c format, version 3, fp32, or version 10 with experts). Checks:
  - every step's loss and gradient norm within tol relative (the norm catches a dropped
    average: Adam is nearly scale-invariant, so the loss alone could miss it);
  - every parameter tensor within tol, norm-wise: |a - b|_2 / |a|_2 <= tol. (The largest
    element-wise difference, relative to the tensor's largest magnitude, is printed too but not
    judged: in a few elements out of ~50,000 the gradient is ~0, Adam divides it by its own
    ~0 square root, and the last-bit differences of a different summation order become
    ~1e-6-sized steps; with 3 ranks that reaches 2e-5 of the tensor's maximum in 1 or 2
    elements while the tensor as a whole agrees to ~5e-7.)
    The key bias (the middle third of qkvb) is left out: softmax ignores a constant added to every score, so the key bias
    has no effect on the loss, its gradient is 0 in exact arithmetic, and Adam turns the
    rounding noise of that 0 into lr-sized steps whose sign depends on the summation order.
    Its difference is printed, not judged.
    The first LayerNorm's bias (ln1b) is judged with its weight, as one module (ln1w and ln1b
    together, |a - b|_2 / |a|_2 over both): its gradient carries the key bias's rounding noise,
    projected: the shift ln1b adds to every token reaches the keys as W_k ln1b, and the gradient
    of that part is W_k^T (sum over tokens of dk) = W_k^T 0 in exact arithmetic. Where the
    query and value parts of an element's gradient nearly cancel, that noise decides the sign
    of Adam's step, and the element moves ~1e-6 differently while the rest agree to ~1e-8;
    ln1b starts at 0, so after a few steps its own norm is only the updates' (~lr sqrt(n)) and
    one such element puts it past 1e-5 (seen: layer 1 channel 12, 7.6e-7 of a norm of 5.9e-2,
    pp 2 x tp 2 + SP, 6 steps). Against the module's norm (ln1w starts at 1) the same element
    is ~3e-8, while a mechanism's error in ln1b (a dropped or doubled reduction: every element
    off by ~lr per step, ~5e-2 in all; one element's whole gradient wrong: ~lr x steps, 6e-3)
    is 2e-3 and 3e-4 of it, far above tol. ln1b's own error is printed, not judged.
  - with --adam-bound LR,STEPS (fine-tuning a trained model, where many gradients are at rounding
    level: the key bias's always, a token the model is almost sure of too): every element,
    the key bias's included, within 2 x LR x sum over t = 1..STEPS of B_t, B_t the largest step
    AdamW can take at t relative to lr (beta1 0.9, beta2 0.95): |m^_t| / sqrt(v^_t) <=
    sqrt(1 - b2^t) / (1 - b1^t) x (1 - b1) / sqrt(1 - b2) x sqrt(sum_{j<t} (b1^2/b2)^j) (Cauchy-
    Schwarz on m_t's sum against v_t's). Two runs whose gradients of one element differ only by
    rounding can move it that far in opposite directions, no farther (lr_t <= LR).
Prints one PASS/FAIL line; exits 1 on FAIL.
"""
import math, operator, struct, sys

def read_log(path):
    rows = []
    for line in open(path):
        s, loss, norm, lr = line.split()
        rows.append((int(s), float(loss), float(norm)))
    return rows

def read_ckpt(path):
    """the tensors of an llm.c checkpoint (version 3) or of a mixture-of-experts one (version 10:
    header[8..10] = E, k, N; the dense MLP's tensors over the L - L/N dense blocks, then the MoE
    blocks' router and experts; doc/expert-parallel.md)"""
    data = open(path, "rb").read()
    h = struct.unpack("256i", data[:1024])
    maxT, V, L, NH, C, Vp = h[2], h[3], h[4], h[5], h[6], h[7]
    E, every = (h[8], h[10]) if h[1] == 10 else (0, 0)
    Lm = L // every if E else 0
    Ld = L - Lm
    shapes = [("wte", Vp * C), ("wpe", maxT * C), ("ln1w", L * C), ("ln1b", L * C), ("qkvw", L * 3 * C * C),
              ("qkvb", L * 3 * C), ("attprojw", L * C * C), ("attprojb", L * C), ("ln2w", L * C), ("ln2b", L * C),
              ("fcw", Ld * 4 * C * C), ("fcb", Ld * 4 * C), ("fcprojw", Ld * C * 4 * C), ("fcprojb", Ld * C),
              ("lnfw", C), ("lnfb", C)]
    if E:
        shapes += [("routerw", Lm * E * C), ("expfcw", Lm * E * 4 * C * C), ("expfcb", Lm * E * 4 * C),
                   ("expfcprojw", Lm * E * C * 4 * C), ("expfcprojb", Lm * E * C)]
    shapes = [(name, size) for name, size in shapes if size > 0]
    n = sum(s for _, s in shapes)
    if len(data) != 1024 + 4 * n:
        sys.exit("compare_runs.py: %s has %d bytes, expected %d" % (path, len(data), 1024 + 4 * n))
    vals = struct.unpack("%df" % n, data[1024:1024 + 4 * n])
    out, off = {}, 0
    for name, size in shapes:
        out[name] = vals[off:off + size]
        off += size
    return out, L, C

def main():
    args = sys.argv[1:]
    tol, label = 1e-5, ""
    if "--tol" in args:
        i = args.index("--tol"); tol = float(args[i + 1]); del args[i:i + 2]
    # --loss-floor X: judge the loss error relative to max(|loss|, X). For RL losses: the
    # policy-gradient loss sums terms of size ~|A| * CE ~ 1 whose advantages cancel within each
    # group (GRPO: they sum to 0), so the loss itself can sit near 0 and a relative error to it
    # says nothing; relative to the size of its terms (X = 1) it does.
    floor = 0.0
    if "--loss-floor" in args:
        i = args.index("--loss-floor"); floor = float(args[i + 1]); del args[i:i + 2]
    bound = None
    if "--adam-bound" in args:
        i = args.index("--adam-bound"); lr, steps = args[i + 1].split(","); del args[i:i + 2]
        b1, b2 = 0.9, 0.95
        B = lambda t: math.sqrt(1 - b2**t) / (1 - b1**t) * (1 - b1) / math.sqrt(1 - b2) * math.sqrt(sum((b1 * b1 / b2)**j for j in range(t)))
        bound = 2 * float(lr) * sum(B(t) for t in range(1, int(steps) + 1))
    if "--label" in args:
        i = args.index("--label"); label = args[i + 1]; del args[i:i + 2]
    ref_log, ref_bin, run_log, run_bin = args
    a, b = read_log(ref_log), read_log(run_log)
    worst_loss = worst_norm = float("inf") if len(a) != len(b) or not a else 0.0
    if len(a) == len(b):
        for (s1, l1, n1), (s2, l2, n2) in zip(a, b):
            worst_loss = max(worst_loss, abs(l1 - l2) / (max(abs(l1), floor) or 1.0))
            worst_norm = max(worst_norm, abs(n1 - n2) / (abs(n1) or 1.0))
    pa, L, C = read_ckpt(ref_bin)
    pb, _, _ = read_ckpt(run_bin)
    worst_param, worst_name, worst_elem, keybias, worst_abs = 0.0, "", 0.0, 0.0, 0.0
    ln1b_alone = 0.0
    if "ln1w" in pa and len(pa["ln1b"]) == len(pb["ln1b"]):
        ln1b_alone = math.dist(pa["ln1b"], pb["ln1b"]) / (math.hypot(*pa["ln1b"]) or 1.0)
    for d in (pa, pb):   # judge the first LayerNorm as one module (see above)
        if "ln1w" in d:
            d["ln1"] = d.pop("ln1w") + d.pop("ln1b")
    for name in pa:
        x, y = pa[name], pb[name]
        if len(x) == len(y) and x:
            worst_abs = max(worst_abs, max(map(abs, map(operator.sub, x, y))))
        if name == "qkvb":   # per layer: [q bias | k bias | v bias], judge q and v only
            keys = [i for i in range(len(x)) if C <= i % (3 * C) < 2 * C]
            keybias = max(abs(x[i] - y[i]) for i in keys)
            judged = [i for i in range(len(x)) if not (C <= i % (3 * C) < 2 * C)]
            x, y = [x[i] for i in judged], [y[i] for i in judged]
        if len(x) != len(y):
            worst_param, worst_name = float("inf"), name
            continue
        # |a - b|_2 / |a|_2 and the largest |a_i - b_i| / max |a_i|, in C loops (math.dist, map)
        norm = math.hypot(*x) or 1.0
        err = math.dist(x, y) / norm
        scale = max(map(abs, x)) or 1.0
        worst_elem = max(worst_elem, max(map(abs, map(operator.sub, x, y))) / scale)
        if err > worst_param:
            worst_param, worst_name = err, name
    ok = worst_loss <= tol and worst_norm <= tol and worst_param <= tol and (bound is None or worst_abs <= bound)
    judged = "" if bound is None else \
        f", largest element difference {worst_abs:.1e} {'<=' if worst_abs <= bound else '>'} AdamW's bound {bound:.1e}"
    print(f"{'PASS' if ok else 'FAIL'} {label}: {len(b)} steps, loss rel err {worst_loss:.1e}, norm rel err "
          f"{worst_norm:.1e}, params rel err {worst_param:.1e} ({worst_name}){judged} [tol {tol:g}; not judged: largest "
          f"element {worst_elem:.1e} of the tensor max, key bias abs diff {keybias:.1e}, ln1b alone {ln1b_alone:.1e}]")
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())
