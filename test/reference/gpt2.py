#!/usr/bin/python3
"""PyTorch fp32 reference for the C++/CUDA GPT-2 trainer tests.

Reads an llm.c style checkpoint (model.bin) and a test batch (batch.bin),
then writes ref.bin containing: initial logits, initial loss, initial
gradients, per-step losses and gradient norms for `steps` AdamW updates on
the same batch, and the final parameters. See the usage line below.

    /usr/bin/python3 test/reference/gpt2.py --model M.bin --batch B.bin --out R.bin

Only the standard library, numpy and torch are used.
"""
import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

MODEL_MAGIC, BATCH_MAGIC, OUT_MAGIC = 20240326, 20241121, 20241122
HEADER_INTS = 256


def fail(msg):
    print(f"gpt2.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def read_header(raw, path, magic, versions):
    if len(raw) < HEADER_INTS * 4:
        fail(f"{path}: truncated header ({len(raw)} bytes)")
    hdr = np.frombuffer(raw, dtype="<i4", count=HEADER_INTS)
    if hdr[0] != magic:
        fail(f"{path}: bad magic {hdr[0]} (expected {magic})")
    if hdr[1] not in versions:
        fail(f"{path}: unsupported version {hdr[1]} (expected one of {versions})")
    return hdr


def param_layout(maxT, V, L, NH, C, Vp):
    """(name, shape, weight_decay?) for every tensor, in file order."""
    return [
        ("wte", (Vp, C), True), ("wpe", (maxT, C), True),
        ("ln1w", (L, C), False), ("ln1b", (L, C), False),
        ("qkvw", (L, 3 * C, C), True), ("qkvb", (L, 3 * C), False),
        ("attprojw", (L, C, C), True), ("attprojb", (L, C), False),
        ("ln2w", (L, C), False), ("ln2b", (L, C), False),
        ("fcw", (L, 4 * C, C), True), ("fcb", (L, 4 * C), False),
        ("fcprojw", (L, C, 4 * C), True), ("fcprojb", (L, C), False),
        ("lnfw", (C,), False), ("lnfb", (C,), False),
    ]


def load_model(path, dtype):
    raw = open(path, "rb").read()
    hdr = read_header(raw, path, MODEL_MAGIC, (3, 5))
    version = int(hdr[1])
    maxT, V, L, NH, C, Vp = (int(x) for x in hdr[2:8])
    if min(maxT, V, L, NH, C) <= 0 or Vp < V or C % NH != 0:
        fail(f"{path}: bad config maxT={maxT} V={V} L={L} NH={NH} C={C} Vp={Vp}")
    layout = param_layout(maxT, V, L, NH, C, Vp)
    n = sum(math.prod(shape) for _, shape, _ in layout)
    elem = 4 if version == 3 else 2
    body = raw[HEADER_INTS * 4:]
    if len(body) < n * elem:
        fail(f"{path}: truncated parameters ({len(body)} bytes, need {n * elem})")
    if version == 3:
        flat = np.frombuffer(body, dtype="<f4", count=n)
    else:  # bf16: the upper 16 bits of an fp32
        bits = np.frombuffer(body, dtype="<u2", count=n).astype(np.uint32) << 16
        flat = bits.view(np.float32)
    params, off = {}, 0
    for name, shape, _ in layout:
        size = math.prod(shape)
        t = torch.from_numpy(flat[off:off + size].astype(np.float64)).reshape(shape)
        params[name] = torch.nn.Parameter(t.to(dtype))
        off += size
    cfg = dict(maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=Vp)
    return cfg, layout, params, n


def load_batch(path, V, maxT):
    raw = open(path, "rb").read()
    hdr = read_header(raw, path, BATCH_MAGIC, (1,))
    B, T, steps, has_w = (int(x) for x in hdr[2:6])
    # slots 8..13 hold float32 bit patterns
    lr, b1, b2, eps, wd, clip = (float(x) for x in hdr[8:14].view("<f4"))
    if B <= 0 or T <= 0 or T > maxT or steps < 0 or has_w not in (0, 1):
        fail(f"{path}: bad header B={B} T={T} steps={steps} has_weights={has_w} (maxT={maxT})")
    need = B * T * (2 + has_w) * 4
    body = raw[HEADER_INTS * 4:]
    if len(body) < need:
        fail(f"{path}: truncated data ({len(body)} bytes, need {need})")
    ints = np.frombuffer(body, dtype="<i4", count=2 * B * T)
    inputs, targets = ints[:B * T].reshape(B, T), ints[B * T:].reshape(B, T)
    for name, a in (("inputs", inputs), ("targets", targets)):
        if a.min() < 0 or a.max() >= V:
            fail(f"{path}: {name} out of range [0, {V})")
    weights = None
    if has_w:
        weights = np.frombuffer(body, dtype="<f4", count=B * T, offset=2 * B * T * 4).reshape(B, T)
        if np.count_nonzero(weights) == 0:
            fail(f"{path}: all loss weights are zero")
    opt = dict(lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd, grad_clip=clip)
    return B, T, steps, inputs, targets, weights, opt


def layernorm(x, w, b):
    # biased variance, eps 1e-5, same as nn.LayerNorm
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def forward(p, cfg, inputs):
    """GPT-2 forward pass; returns logits (B, T, V) over the real vocab."""
    B, T = inputs.shape
    C, NH, V = cfg["C"], cfg["NH"], cfg["V"]
    hs = C // NH
    x = p["wte"][inputs] + p["wpe"][:T]                      # (B, T, C)
    causal = torch.ones(T, T, dtype=torch.bool).tril()      # True = may attend
    for l in range(cfg["L"]):
        # --- attention block ---
        h = layernorm(x, p["ln1w"][l], p["ln1b"][l])
        qkv = h @ p["qkvw"][l].T + p["qkvb"][l]              # (B, T, 3C)
        q, k, v = qkv.split(C, dim=-1)
        # (B, T, C) -> (B, NH, T, hs): head h owns columns h*hs..(h+1)*hs-1
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)      # (B, NH, T, T)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)       # heads concatenated
        x = x + y @ p["attprojw"][l].T + p["attprojb"][l]
        # --- MLP block ---
        h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
        f = F.gelu(h @ p["fcw"][l].T + p["fcb"][l], approximate="tanh")
        x = x + f @ p["fcprojw"][l].T + p["fcprojb"][l]
    x = layernorm(x, p["lnfw"], p["lnfb"])
    return x @ p["wte"][:V].T                                # tied, no bias


def loss_fn(logits, targets, weights):
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                         reduction="none")                   # per-token CE
    if weights is None:
        return ce.mean()
    w = weights.reshape(-1)
    return (w * ce).sum() / (w != 0).sum()


def main():
    ap = argparse.ArgumentParser(description="GPT-2 PyTorch reference (llm.c format)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    args = ap.parse_args()

    torch.set_num_threads(2)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    dtype = torch.float32 if args.dtype == "float32" else torch.float64
    torch.set_default_dtype(dtype)

    for path in (args.model, args.batch):
        if not os.path.isfile(path):
            fail(f"{path}: no such file")
    cfg, layout, params, num_params = load_model(args.model, dtype)
    B, T, steps, inputs, targets, weights, opt = load_batch(args.batch, cfg["V"], cfg["maxT"])
    inputs = torch.from_numpy(inputs.astype(np.int64))
    targets = torch.from_numpy(targets.astype(np.int64))
    if weights is not None:
        weights = torch.from_numpy(weights.astype(np.float64)).to(dtype)
    names = [name for name, _, _ in layout]
    decay = {name: d for name, _, d in layout}

    def as_f32(t):
        return t.detach().to(torch.float32).reshape(-1).numpy()

    # Initial logits, loss and gradients (this is also step 0 of the loop).
    logits0 = forward(params, cfg, inputs)
    loss0 = loss_fn(logits0, targets, weights)
    loss0.backward()
    init_logits = as_f32(logits0)
    init_loss = float(loss0)
    init_grads = np.concatenate([as_f32(params[n].grad) for n in names])
    assert not params["wte"].grad[cfg["V"]:].any(), "padded wte rows got gradient"

    # AdamW state
    m = {n: torch.zeros_like(params[n]) for n in names}
    v = {n: torch.zeros_like(params[n]) for n in names}
    b1, b2, eps, lr = opt["beta1"], opt["beta2"], opt["eps"], opt["lr"]
    step_losses, grad_norms = [], []
    for step in range(1, steps + 1):
        if step > 1:  # step 1 reuses the forward/backward done above
            for n in names:
                params[n].grad = None
            loss = loss_fn(forward(params, cfg, inputs), targets, weights)
            loss.backward()
        else:
            loss = loss0
        step_losses.append(float(loss))
        with torch.no_grad():
            # global L2 norm of all gradients, then clipping (no epsilon)
            norm = math.sqrt(sum(float((params[n].grad ** 2).sum()) for n in names))
            grad_norms.append(norm)
            scale = 1.0
            if opt["grad_clip"] > 0 and norm > opt["grad_clip"]:
                scale = opt["grad_clip"] / norm
            for n in names:
                p, g = params[n], params[n].grad * scale
                m[n].mul_(b1).add_((1 - b1) * g)
                v[n].mul_(b2).add_((1 - b2) * g * g)
                mhat = m[n] / (1 - b1 ** step)
                vhat = v[n] / (1 - b2 ** step)
                wd = opt["weight_decay"] if decay[n] else 0.0
                # decay uses p before the update
                p.sub_(lr * (mhat / (vhat.sqrt() + eps) + wd * p))

    final_params = np.concatenate([as_f32(params[n]) for n in names])

    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[:7] = [OUT_MAGIC, 1, B, T, cfg["V"], steps, num_params]
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(hdr.tobytes())
        for arr in (init_logits, np.array([init_loss]), init_grads,
                    np.array(step_losses), np.array(grad_norms), final_params):
            f.write(np.asarray(arr, dtype="<f4").tobytes())
    os.replace(tmp, args.out)

    print(f"gpt2.py [{args.dtype}] B={B} T={T} V={cfg['V']} L={cfg['L']} C={cfg['C']} "
          f"params={num_params} weights={'yes' if weights is not None else 'no'}")
    print(f"  initial loss {init_loss:.6f}")
    print("  step losses " + " ".join(f"{x:.4f}" for x in step_losses))
    print("  grad norms  " + " ".join(f"{x:.4f}" for x in grad_norms))
    print(f"  wrote {args.out}")


if __name__ == "__main__":
    main()
