"""The fp32 AdamW update, element by element: our run against PyTorch fp32 and float64
(doc/gpu-results.md, "What it showed, and what was done": the fp32 updates).

  build/emu/test_gpt2cu --write-inputs DIR          (as scripts/gpu_bundle.sh: the H200 run's inputs)
  python3 test/reference/gpt2.py --model DIR/model.bin --batch DIR/batch.bin --out DIR/ref.bin
  TEST_GPT2_DUMP=DIR build/emu/test_gpt2cu_fp32 --check DIR      (writes DIR/ref.bin.ours; it stops
                                                                  at the next case's missing reference)
  python3 test/reference/adamw_elements.py DIR [--tensors fcw,fcprojw] [--top 6] [--noise 1e-6,3e-6,1e-5,1e-4]
      [--seeds 5,6,7] [--judge] [--perturb wd_x1.1,lr_x1.001,bc1_t+1,no_bc2,eps_in_sqrt,eps_x10]
(test/h200_failures.sh runs these.)

DIR holds the reference check's inputs (model.bin, batch.bin: test_gpt2cu --write-inputs; the
dense model, the pre-training batch) and ref.bin.ours: our initial parameters, each step's
gradients (unclipped) and the final parameters. This script runs the same 10 steps as
test/reference/gpt2.py (clipping, AdamW) in float32 and in float64, keeping each step's gradient,
and prints:
  1. per tensor, the update error norm-wise, |du - du_ref|_2 / |du_ref|_2 (test_gpt2's
     compare_update): ours vs PyTorch fp32 (what the test judges), ours vs float64, PyTorch fp32 vs
     float64; the step-0 gradient difference (max |dg| / max |g|); and test_gpt2's derived bound
     (update_bound: AdamW's first-order sensitivity x the gradient tolerance 1e-4 x the tensor's
     largest |g| at each step, + the fp32 roundings of the step, x2), here along the float64
     trajectory;
  2. for --tensors, the elements carrying most of |du_ours - du_f32|_2^2, with their gradients
     per step (float64), ours and PyTorch fp32's differences from them, and the bound's share;
  3. --noise: PyTorch fp32 again with uniform noise in [-s, s] x the tensor's largest |g| added to
     every non-zero gradient element at every step (one run per --seeds), against the run without:
     the update error that gradient differences of size s (far below the gradient tolerance) make,
     and how far the later steps' own gradients then move (qkvb's column includes the key bias,
     which test_gpt2 leaves out: its gradient is rounding noise only);
  4. --judge: test_gpt2's compare_update_fp32 (elements with d_i > lr left out, at most 10% of a
     tensor; over the rest norm <= 1e-3, |scale| <= 1e-4, |decay| <= 1e-2) on our run, on each noise
     run (the largest figures over the seeds), and on each --perturb run (PyTorch fp32 with its AdamW
     changed: wd_x1.1, lr_x1.001, bc1_t+1, no_bc2, eps_in_sqrt, eps_x10), each against PyTorch fp32.
"""
import argparse
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2 as ref  # noqa: E402

UF = 2.0 ** -24


def run(d, dtype, noise=0.0, seed=5, lr_mul=1.0, wd_mul=1.0, variant=""):
    """The 10 steps; noise: see --noise; lr_mul, wd_mul, variant (bc1_t+1, no_bc2, eps_in_sqrt, eps_x10): a
    perturbed AdamW, as test/h200_failures.sh perturbs the kernel (--perturb)."""
    torch.set_default_dtype(dtype)
    cfg, layout, params, n = ref.load_model(os.path.join(d, "model.bin"), dtype)
    B, T, steps, inputs, targets, weights, opt = ref.load_batch(os.path.join(d, "batch.bin"), cfg["V"], cfg["maxT"])
    inputs = torch.from_numpy(inputs.astype(np.int64))
    targets = torch.from_numpy(targets.astype(np.int64))
    names = [name for name, _, _ in layout]
    decay = {name: dd for name, _, dd in layout}
    init = np.concatenate([params[k].detach().double().reshape(-1).numpy() for k in names])
    m = {k: torch.zeros_like(params[k]) for k in names}
    v = {k: torch.zeros_like(params[k]) for k in names}
    b1, b2, eps, lr = opt["beta1"], opt["beta2"], opt["eps"], opt["lr"]
    lr *= lr_mul
    gen = torch.Generator().manual_seed(seed)
    grads, scales = [], []
    for step in range(1, steps + 1):
        for k in names:
            params[k].grad = None
        loss = ref.model_loss(params, cfg, inputs, targets, None, {}, False)
        loss.backward()
        with torch.no_grad():
            g_all = [params[k].grad if params[k].grad is not None else torch.zeros_like(params[k]) for k in names]
            grads.append(np.concatenate([g.double().reshape(-1).numpy() for g in g_all]))
            if noise > 0:
                g_all = [g + noise * g.abs().max() * (2 * torch.rand(g.shape, generator=gen) - 1) * (g != 0) for g in g_all]
            norm = math.sqrt(sum(float((g ** 2).sum()) for g in g_all))
            scale = opt["grad_clip"] / norm if opt["grad_clip"] > 0 and norm > opt["grad_clip"] else 1.0
            scales.append(scale)
            for k, g0 in zip(names, g_all):
                p, g = params[k], g0 * scale
                m[k].mul_(b1).add_((1 - b1) * g)
                v[k].mul_(b2).add_((1 - b2) * g * g)
                mhat = m[k] / (1 - b1 ** (step + (variant == "bc1_t+1")))
                vhat = v[k] / (1 if variant == "no_bc2" else 1 - b2 ** step)
                wd = wd_mul * opt["weight_decay"] if decay[k] else 0.0
                den = (vhat + eps).sqrt() if variant == "eps_in_sqrt" else vhat.sqrt() + (10 if variant == "eps_x10" else 1) * eps
                p.sub_(lr * (mhat / den + wd * p))
    final = np.concatenate([params[k].detach().double().reshape(-1).numpy() for k in names])
    offs, o = {}, 0
    for k, shape, _ in layout:
        offs[k] = (o, math.prod(shape))
        o += math.prod(shape)
    return dict(init=init, final=final, grads=np.array(grads), scales=np.array(scales), offs=offs, opt=opt,
                steps=steps, n=n, names=names, decay=decay, C=cfg["C"])


def bound_per_element(g, scales, opt, tol_g, decay, p0):
    """test_gpt2's update_bound before the norm: d_i per element (see its comment)."""
    b1, b2, eps, lr = opt["beta1"], opt["beta2"], opt["eps"], opt["lr"]
    wd = opt["weight_decay"] if decay else 0.0
    steps = g.shape[0]
    gs = g * scales[:, None]
    e = tol_g * np.abs(g).max(1) * scales
    zero = (g == 0).all(0)
    d = np.zeros(g.shape[1])
    for t in range(1, steps + 1):
        a = np.array([(1 - b1) * b1 ** (t - 1 - s) for s in range(t)]) / (1 - b1 ** t)
        b = np.array([(1 - b2) * b2 ** (t - 1 - s) for s in range(t)]) / (1 - b2 ** t)
        R = math.sqrt((a ** 2 / b).sum())
        mh = (a[:, None] * gs[:t]).sum(0)
        vh = (b[:, None] * gs[:t] ** 2).sum(0)
        sv = np.sqrt(vh)
        den = sv + eps
        dr = np.zeros_like(mh)
        for s in range(t):   # a gradient exactly 0 at a step is exact there
            dr += np.abs(a[s] / den - mh * b[s] * gs[s] / (np.maximum(sv, 1e-300) * den ** 2)) * e[s] * (gs[s] != 0)
        d += np.where(zero, 0.0, lr * np.minimum(dr, 2 * R)) + 2 * UF * (2 * np.abs(p0) + 16 * lr * (R + wd * np.abs(p0)))
    return d


def judged_elements(r, k):
    """test_gpt2's elements of tensor k: all, but the key bias (the middle third of each layer's qkvb)."""
    o, cnt = r["offs"][k]
    j = np.arange(cnt)
    if k == "qkvb":
        C = r["C"]
        j = j[~((j % (3 * C) >= C) & (j % (3 * C) < 2 * C))]
    return o + j


def judge(side, ref32, k, tol_g=1e-4, left_lr=1.0, left_cap=0.1, tol_norm=1e-3, tol_scale=1e-4, tol_decay=1e-2):
    """test_gpt2's compare_update_fp32 on tensor k: side (a run: its gradients and clip factors give the
    sensitivity, as ours do in the test) against ref32 (PyTorch fp32). Returns (left out, share, norm,
    scale, decay or None, ok)."""
    i = judged_elements(ref32, k)
    opt, steps = ref32["opt"], ref32["steps"]
    per = bound_per_element(side["grads"][:, i], side["scales"], opt, tol_g, ref32["decay"][k], ref32["init"][i])
    keep = ~(per > left_lr * opt["lr"])
    u = (ref32["final"][i] - ref32["init"][i])[keep]
    e = (side["final"][i] - side["init"][i])[keep] - u
    norm, scale = np.linalg.norm(e) / np.linalg.norm(u), (e @ u) / (u @ u)
    share = 1 - keep.mean()
    ok = norm <= tol_norm and abs(scale) <= tol_scale and share <= left_cap
    decay = None
    if ref32["decay"][k]:
        z = -opt["lr"] * opt["weight_decay"] * steps * 0.5 * (ref32["init"][i] + ref32["final"][i])[keep]
        decay = (e @ z) / (z @ z)
        ok = ok and abs(decay) <= tol_decay
    return int((~keep).sum()), share, norm, scale, decay, ok


def print_judged(label, side, ref32, names):
    """one line per tensor: left out (share), norm, scale, decay, and MISS where compare_update_fp32 would"""
    print(f"  {label}")
    misses = []
    for k in names:
        left, share, norm, scale, decay, ok = judge(side, ref32, k)
        dec = "-" if decay is None else f"{decay:+.1e}"
        print(f"    {k:9s} left {left:4d} ({share:6.2%})  norm {norm:.2e}  scale {scale:+.1e}  decay {dec:>8s}  "
              f"{'ok' if ok else 'MISS'}")
        misses += [] if ok else [k]
    print(f"    -> {len(misses)} of {len(names)} tensors MISS{': ' + ' '.join(misses) if misses else ''}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--tensors", default="fcw,fcprojw")
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--noise", default="")
    ap.add_argument("--tol-grad", type=float, default=1e-4)
    ap.add_argument("--seeds", default="5", help="the noise's seeds (comma-separated), one run each")
    ap.add_argument("--judge", action="store_true", help="compare_update_fp32's judgment: of our run, of each --noise "
                    "run, of each --perturb run")
    ap.add_argument("--perturb", default="", help="PyTorch fp32 with its AdamW changed, judged by compare_update_fp32 "
                    "against the unchanged one: any of wd_x1.1,lr_x1.001,bc1_t+1,no_bc2,eps_in_sqrt,eps_x10")
    args = ap.parse_args()
    torch.set_num_threads(1)
    d = args.dir
    r64 = run(d, torch.float64)
    r32 = run(d, torch.float32)
    n, steps = r64["n"], r64["steps"]
    raw = np.fromfile(os.path.join(d, "ref.bin.ours"), dtype="<f4").astype(np.float64)
    if raw.size != (steps + 2) * n:
        sys.exit(f"ref.bin.ours has {raw.size} floats, expected {(steps + 2) * n}")
    ours = dict(init=raw[:n], grads=raw[n:(steps + 1) * n].reshape(steps, n), final=raw[(steps + 1) * n:])
    opt = r64["opt"]
    print(f"lr {opt['lr']:.4g}, b1 {opt['beta1']:.4g}, b2 {opt['beta2']:.4g}, eps {opt['eps']:.3g}, "
          f"wd {opt['weight_decay']:.3g}, {steps} steps; clip factors {' '.join(f'{s:.4f}' for s in r64['scales'])}")
    print(f"{'tensor':10s} {'n':>6s} | update err: ours-f32 ours-f64 f32-f64 | step-0 grad diff /max|g|: ours-f32 "
          f"ours-f64 | bound (tol_g {args.tol_grad:g})")
    want = args.tensors.split(",")
    du_f32 = {}
    for k in r64["names"]:
        o, cnt = r64["offs"][k]
        if cnt == 0:
            continue
        sl = slice(o, o + cnt)
        du = {nm: (r["final"][sl] - r["init"][sl]) for nm, r in (("ours", ours), ("f32", r32), ("f64", r64))}
        du_f32[k] = du["f32"]

        def rel(a, b):
            return np.linalg.norm(du[a] - du[b]) / np.linalg.norm(du[b])
        g64 = r64["grads"][:, sl]
        gmax = np.abs(g64[0]).max()
        e_of = np.abs(ours["grads"][0, sl] - r32["grads"][0, sl]).max()
        e_o64 = np.abs(ours["grads"][0, sl] - g64[0]).max()
        per = bound_per_element(g64, r64["scales"], opt, args.tol_grad, r64["decay"][k], r64["init"][sl])
        bound = 2 * np.linalg.norm(per) / np.linalg.norm(du["f32"])
        print(f"{k:10s} {cnt:6d} | {rel('ours', 'f32'):.2e} {rel('ours', 'f64'):.2e} {rel('f32', 'f64'):.2e} | "
              f"{e_of / gmax:.2e} {e_o64 / gmax:.2e} | {bound:.2e}")
        if k not in want:
            continue
        diff = du["ours"] - du["f32"]
        tot = (diff ** 2).sum()
        order = np.argsort(-diff ** 2)
        share = np.cumsum(diff[order] ** 2) / tot
        g1 = np.abs(g64[0])
        print(f"  {k}: |du_ours - du_f32|_2 = {math.sqrt(tot):.3e}, |du_f32|_2 = {np.linalg.norm(du['f32']):.3e}; the "
              f"largest 1/10/100 elements carry {share[0]:.2f}/{share[min(9, cnt - 1)]:.2f}/{share[min(99, cnt - 1)]:.2f} "
              f"of the square; step-1 |g| quantiles 0/0.1%/50%/max {g1.min():.1e} {np.quantile(g1, 0.001):.1e} "
              f"{np.median(g1):.1e} {g1.max():.1e}")
        for i in order[:args.top]:
            gi = g64[:, i]
            mh_sign = np.sign(gi).sum()
            print(f"  [{i}] du ours {du['ours'][i]:+.4e} f32 {du['f32'][i]:+.4e} f64 {du['f64'][i]:+.4e} "
                  f"(ours - f32 {diff[i]:+.2e}; bound d_i {per[i]:.2e}); signs of g: {int(mh_sign):+d} of {steps}")
            print(f"       g (f64) per step: {' '.join(f'{x:+.2e}' for x in gi)}")
            print(f"       g ours - f64:     {' '.join(f'{x:+.1e}' for x in ours['grads'][:, o + i] - gi)}")
            print(f"       g f32 - f64:      {' '.join(f'{x:+.1e}' for x in r32['grads'][:, o + i] - gi)}")
    names = [k for k in r64["names"] if r64["offs"][k][1] > 0]
    if args.judge:
        # our clip factors, as gpt2_update computes them from our gradients
        norms = np.sqrt((ours["grads"] ** 2).sum(1))
        ours["scales"] = np.where((opt["grad_clip"] > 0) & (norms > opt["grad_clip"]), opt["grad_clip"] / norms, 1.0)
        print("compare_update_fp32 (test_gpt2): elements with d_i > lr left out (at most 10%); over the rest "
              "norm <= 1e-3, |scale| <= 1e-4, |decay| <= 1e-2")
        print_judged("ours against PyTorch fp32", ours, r32, names)
    if args.noise:
        seeds = [int(x) for x in args.seeds.split(",")]
        print("noise: PyTorch fp32 with uniform gradient noise [-s, s] x max|g| of the tensor at every step, "
              "update error against the run without (all elements, norm-wise)")
        print(f"{'s':>8s} {'seed':>4s} " + " ".join(f"{k:>9s}" for k in names) + "   later grads off (fcw, fcb)")
        for s in (float(x) for x in args.noise.split(",")):
            worst = {k: [0, 0.0, 0.0, 0.0] for k in names}
            nmiss = 0
            for seed in seeds:
                rn = run(d, torch.float32, noise=s, seed=seed)
                errs = []
                for k in names:
                    o, cnt = r64["offs"][k]
                    du = rn["final"][o:o + cnt] - rn["init"][o:o + cnt]
                    errs.append(np.linalg.norm(du - du_f32[k]) / np.linalg.norm(du_f32[k]))
                # how far the later steps' own gradients (before the noise) moved from the run without:
                # max over steps 2..10 of max |g - g_without| / max |g_without|, for two tensors
                later = []
                for k in ("fcw", "fcb"):
                    o, cnt = r64["offs"][k]
                    later.append(max(np.abs(rn["grads"][t, o:o + cnt] - r32["grads"][t, o:o + cnt]).max() /
                                     np.abs(r32["grads"][t, o:o + cnt]).max() for t in range(1, steps)))
                print(f"{s:8.0e} {seed:4d} " + " ".join(f"{x:9.2e}" for x in errs) + f"   {later[0]:.1e} {later[1]:.1e}")
                if args.judge:
                    miss = False
                    for k in names:
                        left, share, norm, scale, decay, ok = judge(rn, r32, k)
                        w = worst[k]
                        worst[k] = [max(w[0], left), max(w[1], norm), max(w[2], abs(scale)),
                                    max(w[3], abs(decay or 0.0))]
                        miss |= not ok
                    nmiss += miss
            if args.judge:
                print(f"  judged (compare_update_fp32), s = {s:.0e}, {len(seeds)} seeds: {nmiss} runs with a MISS; "
                      "per tensor the largest over the seeds:")
                for k in names:
                    w = worst[k]
                    n_k = len(judged_elements(r64, k))
                    print(f"    {k:9s} left {w[0]:4d} ({w[0] / n_k:6.2%})  norm {w[1]:.2e}  |scale| {w[2]:.1e}  "
                          f"|decay| {w[3]:.1e}" if r64["decay"][k] else
                          f"    {k:9s} left {w[0]:4d} ({w[0] / n_k:6.2%})  norm {w[1]:.2e}  |scale| {w[2]:.1e}")
    for name in (x for x in args.perturb.split(",") if x):
        kw = {"wd_x1.1": dict(wd_mul=1.1), "lr_x1.001": dict(lr_mul=1.001)}.get(name, dict(variant=name))
        print_judged(f"PyTorch fp32 with {name} against PyTorch fp32", run(d, torch.float32, **kw), r32, names)


if __name__ == "__main__":
    main()
