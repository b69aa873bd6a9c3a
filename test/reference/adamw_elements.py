"""The fp32 AdamW update, element by element: our run against PyTorch fp32 and float64
(doc/gpu-results.md, "What it showed, and what was done": the fp32 updates).

  build/emu/test_gpt2cu --write-inputs DIR          (as scripts/gpu_bundle.sh: the H200 run's inputs)
  python3 test/reference/gpt2.py --model DIR/model.bin --batch DIR/batch.bin --out DIR/ref.bin
  TEST_GPT2_DUMP=DIR build/emu/test_gpt2cu_fp32 --check DIR      (writes DIR/ref.bin.ours; it stops
                                                                  at the next case's missing reference)
  python3 test/reference/adamw_elements.py DIR [--tensors fcw,fcprojw] [--top 6] [--noise 1e-6,3e-6,1e-5,1e-4]
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
     every non-zero gradient element at every step, against the run without: the update error
     that gradient differences of size s (far below the gradient tolerance) make, and how far
     the later steps' own gradients then move (qkvb's column includes the key bias, which
     test_gpt2 leaves out: its gradient is rounding noise only).
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


def run(d, dtype, noise=0.0):
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
    gen = torch.Generator().manual_seed(5)
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
                mhat = m[k] / (1 - b1 ** step)
                vhat = v[k] / (1 - b2 ** step)
                wd = opt["weight_decay"] if decay[k] else 0.0
                p.sub_(lr * (mhat / (vhat.sqrt() + eps) + wd * p))
    final = np.concatenate([params[k].detach().double().reshape(-1).numpy() for k in names])
    offs, o = {}, 0
    for k, shape, _ in layout:
        offs[k] = (o, math.prod(shape))
        o += math.prod(shape)
    return dict(init=init, final=final, grads=np.array(grads), scales=np.array(scales), offs=offs, opt=opt,
                steps=steps, n=n, names=names, decay=decay)


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
        for s in range(t):
            dr += np.abs(a[s] / den - mh * b[s] * gs[s] / (np.maximum(sv, 1e-300) * den ** 2)) * e[s]
        d += np.where(zero, 0.0, lr * np.minimum(dr, 2 * R)) + 2 * UF * (2 * np.abs(p0) + 16 * lr * (R + wd * np.abs(p0)))
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--tensors", default="fcw,fcprojw")
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--noise", default="")
    ap.add_argument("--tol-grad", type=float, default=1e-4)
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
    if args.noise:
        names = [k for k in r64["names"] if r64["offs"][k][1] > 0]
        print("noise: PyTorch fp32 with uniform gradient noise [-s, s] x max|g| of the tensor at every step, "
              "update error against the run without")
        print(f"{'s':>8s} " + " ".join(f"{k:>9s}" for k in names) + "   later grads off (fcw, fcb)")
        for s in (float(x) for x in args.noise.split(",")):
            rn = run(d, torch.float32, noise=s)
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
            print(f"{s:8.0e} " + " ".join(f"{x:9.2e}" for x in errs) + f"   {later[0]:.1e} {later[1]:.1e}")


if __name__ == "__main__":
    main()
