#!/usr/bin/python3
"""PyTorch fp32 reference for the C++/CUDA GPT-2 trainer tests.

Reads an llm.c style checkpoint (model.bin) and a test batch (batch.bin),
then writes ref.bin containing: initial logits, initial loss, initial
gradients, per-step losses and gradient norms for `steps` AdamW updates on
the same batch, and the final parameters. See the usage line below.

    /usr/bin/python3 test/reference/gpt2.py --model M.bin --batch B.bin --out R.bin
    /usr/bin/python3 test/reference/gpt2.py --self-test     (the MoE block against itself, below)

--dtype float32 (default) or float64: every tensor in that dtype. --dtype bfloat16: a bf16
mixed-precision run, as the CUDA bf16 build computes (llmc/cuda/*.cuh: bf16 storage, fp32 math
inside each kernel) and the CPU backend simulates with --precision bf16 (llmc/cpu/memory.h):
  - the parameters are the file's rounded to bf16 (round to nearest even), bf16 tensors;
  - every kernel (embedding, layernorm, linear with its bias, attention, GELU, residual add, LM
    head) reads bf16 tensors, computes in fp32 (a matmul: bf16 products, exact in fp32, summed
    in fp32; layernorm statistics, attention scores and softmax in fp32) and rounds its output
    to bf16 once: forward_bf16 below, each kernel one call of bf16_kernel;
  - the loss is computed in fp32 from the bf16 logits; the backward follows from autograd
    through the same casts: each kernel's input gradients are computed in fp32 and rounded to
    bf16, so the parameter gradients are bf16. A tensor read by two kernels gets its gradient
    as the trainers accumulate it (read the stored bf16 gradient, add the second kernel's fp32
    gradient, round once): the residual stream is widened once for the layernorm and the
    residual add that read it (the add's gradient is a bf16 value; the sum with the
    layernorm's fp32 input gradient is rounded once), and wte is widened once for the LM head
    (whose gradient, computed first, is rounded: round_grad) and the embedding;
  - AdamW keeps fp32 master weights (the bf16 parameters widened), fp32 moments and computes
    the gradient norm in float64 from the bf16 gradients; after each step the parameters are
    the master weights rounded to bf16 STOCHASTICALLY, as the trainers do (llmc/cuda/adamw.cuh,
    llmc/cpu/adamw.h): 16 random bits added below the kept bits, then truncated, the bits from
    the same hash of (element index in its tensor, seed = step * 1000003 + tensor index):
    stochastic_bits below. (Rounding to nearest instead is biased where the steps are smaller
    than half a bf16 ulp: the LayerNorm gains at 1.0 (ulp 2^-7) do not move for the first
    steps under lr 1e-3, and the step losses drift 5e-4 from the trainers'.) The final
    parameters written are the master weights (fp32), whose update from the bf16 initial
    parameters is what the C++ test compares.
  Dense models only (an MoE model is refused: its discrete routing flips on near ties under
  bf16 rounding, see test/test_gpt2.cu).

Model files (magic 20240326, 256 int32 header, then the parameters in table order):
  version 3 (fp32) and 5 (bf16): llm.c's dense GPT-2, header[2..7] = maxT V L NH C Vp.
  version 10 (MoE, fp32): header[2..7] as above, header[8] = E (experts), header[9] = k (top-k),
    header[10] = N (block l is an MoE block iff l % N == N - 1), header[11] = capacity factor cf
    and header[12] = aux coefficient alpha, both float32 bit patterns. Tensors: llm.c's 16, but
    fcw/fcb/fcprojw/fcprojb hold the Ld = L - L/N dense blocks only, then routerw (Lm, E, C),
    expfcw (Lm, E, 4C, C), expfcb (Lm, E, 4C), expfcprojw (Lm, E, C, 4C), expfcprojb (Lm, E, C),
    Lm = L / N; a tensor with no elements is absent. The MoE block:
    softmax router (no bias), top-k by (descending p, then lower expert index), gates p (k = 1)
    or p renormalised over the top k (k >= 2), capacity ceil(cf T k / E) per sequence with the
    assignments taken j = 0 for every token in order, then j = 1, ...; dropped assignments add
    nothing; the Switch auxiliary loss alpha E sum_i f_i P_i per sequence (f: the share of the
    sequence's assignments routed to i before dropping, a constant; P: the mean probability),
    averaged over the sequences and summed over the MoE blocks, is added to the loss.
Batch file (magic 20241121, version 1): header[2..5] = B T steps has_weights, header[8..13] =
  lr beta1 beta2 eps weight_decay grad_clip (float32 bits); then inputs (B*T int32), targets
  (B*T int32), and with has_weights the loss weights (B*T float32).
Output file (magic 20241122, version 1): header[2..6] = B T V steps num_params;
  header[7] = assignments dropped by the capacity in the first forward (all MoE blocks; 0 for a
  dense model), header[8] = the first forward's auxiliary loss (float32 bits; 0 when dense),
  header[9] = the number of MoE blocks Lm (0 when dense). Then float32: initial logits
  (B*T*V), initial loss (cross-entropy + aux), initial gradients (num_params, in file order),
  step losses (steps), gradient norms (steps), final parameters (num_params). A dense model's
  output is byte for byte what it was before the MoE fields existed (the new slots are 0).
  header[10] = the reference's number format: 0 for float32/float64, 1 for bfloat16 (whose
  initial parameters are the model file's rounded to bf16).

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


def param_layout(maxT, V, L, NH, C, Vp, E=0, N=1):
    """(name, shape, weight_decay?) for every tensor, in file order (tensors with no elements,
    e.g. the MoE ones of a dense model, are left out). Ld dense blocks hold fc*, Lm MoE blocks
    the expert tensors; E = 0 is llm.c's table exactly."""
    Lm = L // N if E > 0 else 0
    Ld = L - Lm
    layout = [
        ("wte", (Vp, C), True), ("wpe", (maxT, C), True),
        ("ln1w", (L, C), False), ("ln1b", (L, C), False),
        ("qkvw", (L, 3 * C, C), True), ("qkvb", (L, 3 * C), False),
        ("attprojw", (L, C, C), True), ("attprojb", (L, C), False),
        ("ln2w", (L, C), False), ("ln2b", (L, C), False),
        ("fcw", (Ld, 4 * C, C), True), ("fcb", (Ld, 4 * C), False),
        ("fcprojw", (Ld, C, 4 * C), True), ("fcprojb", (Ld, C), False),
        ("lnfw", (C,), False), ("lnfb", (C,), False),
        ("routerw", (Lm, E, C), True),
        ("expfcw", (Lm, E, 4 * C, C), True), ("expfcb", (Lm, E, 4 * C), False),
        ("expfcprojw", (Lm, E, C, 4 * C), True), ("expfcprojb", (Lm, E, C), False),
    ]
    return [entry for entry in layout if math.prod(entry[1]) > 0]


def is_moe_block(cfg, l):
    E, N = cfg["E"], cfg["N"]
    return E > 0 and l % N == N - 1


def load_model(path, dtype):
    raw = open(path, "rb").read()
    hdr = read_header(raw, path, MODEL_MAGIC, (3, 5, 10))
    version = int(hdr[1])
    maxT, V, L, NH, C, Vp = (int(x) for x in hdr[2:8])
    if min(maxT, V, L, NH, C) <= 0 or Vp < V or C % NH != 0:
        fail(f"{path}: bad config maxT={maxT} V={V} L={L} NH={NH} C={C} Vp={Vp}")
    E, k, N, cf, alpha = 0, 0, 1, 0.0, 0.0
    if version == 10:
        E, k, N = (int(x) for x in hdr[8:11])
        cf, alpha = (float(x) for x in hdr[11:13].view("<f4"))   # float32 bit patterns
        if E <= 0 or not 1 <= k <= E or N <= 0 or L // N == 0 or not cf > 0 or not alpha >= 0:
            fail(f"{path}: bad MoE config E={E} k={k} N={N} cf={cf} alpha={alpha} (L={L})")
    layout = param_layout(maxT, V, L, NH, C, Vp, E, N)
    n = sum(math.prod(shape) for _, shape, _ in layout)
    elem = 2 if version == 5 else 4
    body = raw[HEADER_INTS * 4:]
    if len(body) < n * elem:
        fail(f"{path}: truncated parameters ({len(body)} bytes, need {n * elem})")
    if version != 5:
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
    cfg = dict(maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=Vp, E=E, k=k, N=N, cf=cf, alpha=alpha)
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


def moe_route(p, k, cap):
    """The discrete part of the MoE block, from the probabilities p (G, T, E) of G groups
    (sequences) of T tokens, as numpy (no gradient). Returns
      e     (G, T, k) int64: each token's k experts, by descending p, ties to the lower index
      kept  (G, T, k) bool:  whether assignment (t, j) fits the expert's capacity cap; the
                             assignments of a group are taken j = 0 for t = 0..T-1, then j = 1...
      count (G, E) int64:    assignments per expert before dropping (the aux loss's f)
    The order is spelled out (a sort on the key (-p, index)) rather than left to torch.topk,
    whose order among equal values is not specified."""
    G, T, E = p.shape
    e = np.zeros((G, T, k), dtype=np.int64)
    for g in range(G):
        for t in range(T):
            row = [float(x) for x in p[g, t]]
            e[g, t] = sorted(range(E), key=lambda i: (-row[i], i))[:k]
    kept = np.zeros((G, T, k), dtype=bool)
    count = np.zeros((G, E), dtype=np.int64)
    for g in range(G):
        used = [0] * E
        for j in range(k):
            for t in range(T):
                i = int(e[g, t, j])
                count[g, i] += 1
                if used[i] < cap:
                    used[i] += 1
                    kept[g, t, j] = True
    return e, kept, count


def moe_capacity(cfg, T):
    # as the C++ side computes it: (int)ceil((double)cf * T * k / E)
    return int(math.ceil(cfg["cf"] * T * cfg["k"] / cfg["E"]))


def moe_block(p, cfg, m, x, stats):
    """MoE block m on x (B, T, C), the ln2 output; returns its output (B, T, C), adds the
    block's aux loss and dropped assignments to stats."""
    B, T, C = x.shape
    E, k = cfg["E"], cfg["k"]
    xf = x.reshape(B * T, C)
    probs = (xf @ p["routerw"][m].T).softmax(dim=-1)         # (BT, E), router without bias
    # routing decisions: discrete, from the probabilities' values, no gradient
    pn = probs.detach().reshape(B, T, E).numpy()
    e, kept, count = moe_route(pn, k, moe_capacity(cfg, T))
    # tokens whose top-k (its set or its order) an exact tie of probabilities decides
    top = -np.sort(-pn.reshape(B * T, E), axis=1)[:, :k + 1]
    stats["ties"] += int((top[:, 1:] == top[:, :-1]).any(axis=1).sum())
    e, kept = e.reshape(B * T, k), kept.reshape(B * T, k)
    pk = probs.gather(1, torch.from_numpy(e))                # (BT, k), differentiable
    gates = pk if k == 1 else pk / pk.sum(dim=1, keepdim=True)
    out = torch.zeros_like(xf)
    for i in range(E):
        rows, js = np.nonzero(kept & (e == i))               # each token at most once per expert
        if len(rows) == 0:
            continue
        rows_t = torch.from_numpy(rows)
        h = xf[rows_t]
        f = F.gelu(h @ p["expfcw"][m, i].T + p["expfcb"][m, i], approximate="tanh")
        y = f @ p["expfcprojw"][m, i].T + p["expfcprojb"][m, i]
        out = out.index_add(0, rows_t, gates[rows_t, torch.from_numpy(js)].unsqueeze(1) * y)
    # Switch auxiliary loss per sequence: alpha E sum_i f_i P_i, f constant (before dropping)
    frac = torch.from_numpy(count.astype(np.float64) / (T * k)).to(x.dtype)   # (B, E)
    P = probs.reshape(B, T, E).mean(dim=1)                                  # (B, E)
    aux = cfg["alpha"] * E * (frac * P).sum(dim=1).mean()
    stats["aux"] = stats["aux"] + aux
    stats["dropped"] += int((~kept).sum())
    if "routes" in stats:   # the self-test checks that finite differences keep the routing
        stats["routes"].append((e.copy(), kept.copy()))
    return out.reshape(B, T, C)


def forward(p, cfg, inputs, stats=None):
    """GPT-2 forward pass; returns logits (B, T, V) over the real vocab. With an MoE model,
    stats (a dict, when given) gets "aux" (the auxiliary loss, a tensor with its graph) and
    "dropped" (assignments over capacity, all MoE blocks)."""
    B, T = inputs.shape
    C, NH, V = cfg["C"], cfg["NH"], cfg["V"]
    hs = C // NH
    if stats is None:
        stats = {}
    stats["aux"], stats["dropped"], stats["ties"] = torch.zeros(()), 0, 0
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
        # --- MLP block (dense), or the MoE block ---
        h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
        if is_moe_block(cfg, l):
            x = x + moe_block(p, cfg, l // cfg["N"], h, stats)
        else:
            d = l - (l // cfg["N"] if cfg["E"] > 0 else 0)   # dense block index: MoE blocks skipped
            f = F.gelu(h @ p["fcw"][d].T + p["fcb"][d], approximate="tanh")
            x = x + f @ p["fcprojw"][d].T + p["fcprojb"][d]
    x = layernorm(x, p["lnfw"], p["lnfb"])
    return x @ p["wte"][:V].T                                # tied, no bias


def bf16_kernel(fn, *args):
    """One kernel of the bf16 run: its bf16 tensor inputs widened to fp32, fn computed in fp32,
    the output rounded to bf16 (torch rounds to nearest even). Through autograd the same casts
    round each input's gradient to bf16."""
    return fn(*(a.float() if torch.is_tensor(a) and a.dtype == torch.bfloat16 else a for a in args)).bfloat16()


class _RoundGrad(torch.autograd.Function):
    """Identity forward; the gradient rounded to bf16 (kept fp32) in the backward."""
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g.bfloat16().float()


def round_grad(x):
    return _RoundGrad.apply(x)


def forward_bf16(p, cfg, inputs):
    """forward() as the bf16 build computes it: parameters and activations bf16, each kernel's
    math fp32, its output rounded once. The kernel boundaries are the C++ model's
    (llmc/model/gpt2.h): encoded, ln1, qkv, atty, attproj, residual2, ln2, fch, fch_gelu, fcproj,
    residual3, lnf, logits. Returns the bf16 logits (B, T, V)."""
    if cfg["E"] > 0:
        fail("--dtype bfloat16: dense models only (MoE routing flips on near ties in bf16)")
    B, T = inputs.shape
    C, NH, V = cfg["C"], cfg["NH"], cfg["V"]
    hs = C // NH
    causal = torch.ones(T, T, dtype=torch.bool).tril()

    def linear(h, w, b):   # bias added in fp32 before the one rounding (cuBLASLt's bias epilogue)
        return h @ w.T + b

    def attention(qkv):    # scores, softmax and the weighted sum in fp32; P is never rounded
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return (att @ v).transpose(1, 2).reshape(B, T, C)

    # wte, widened once: d wte = round(round(d of the LM head) + d of the embedding)
    wte = p["wte"].float()
    x = bf16_kernel(lambda wpe: wte[inputs] + wpe[:T], p["wpe"])
    for l in range(cfg["L"]):
        xf = x.float()   # the residual stream, read by ln1 and the residual add
        h = bf16_kernel(layernorm, xf, p["ln1w"][l], p["ln1b"][l])
        qkv = bf16_kernel(linear, h, p["qkvw"][l], p["qkvb"][l])
        y = bf16_kernel(attention, qkv)
        x = bf16_kernel(torch.add, xf, bf16_kernel(linear, y, p["attprojw"][l], p["attprojb"][l]))
        xf = x.float()   # residual2, read by ln2 and the residual add
        h = bf16_kernel(layernorm, xf, p["ln2w"][l], p["ln2b"][l])
        f = bf16_kernel(lambda a: F.gelu(a, approximate="tanh"), bf16_kernel(linear, h, p["fcw"][l], p["fcb"][l]))
        x = bf16_kernel(torch.add, xf, bf16_kernel(linear, f, p["fcprojw"][l], p["fcprojb"][l]))
    x = bf16_kernel(layernorm, x, p["lnfw"], p["lnfb"])
    return bf16_kernel(lambda a: a @ round_grad(wte)[:V].T, x)


def _hash_u32(x):
    """The trainers' 32-bit integer hash (llmc/precision.h prec_hash_u32), on uint32 arrays."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7feb352d)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846ca68b)
    return x ^ (x >> np.uint32(16))


def stochastic_bits(n, seed):
    """The random words of elements 0..n-1 of a tensor for a seed (llmc/precision.h
    stochastic_bits): hash(hash(i ^ seed) + (i >> 32) + 0x9e3779b9 seed), all mod 2^32."""
    i = np.arange(n, dtype=np.uint64)
    seed = np.uint32(seed % 2**32)
    lo, hi = (i & np.uint64(0xffffffff)).astype(np.uint32), (i >> np.uint64(32)).astype(np.uint32)
    with np.errstate(over="ignore"):
        return _hash_u32(_hash_u32(lo ^ seed) + hi + np.uint32(0x9e3779b9) * seed)


def round_bf16_stochastic(x, seed):
    """fp32 tensor -> bf16 tensor: add the 16 low bits of each element's random word to its
    fp32 bits and truncate (inf and NaN kept), as the trainers' AdamW writes parameters."""
    u = x.detach().contiguous().numpy().reshape(-1).view(np.uint32).copy()
    r = stochastic_bits(u.size, seed) & np.uint32(0xffff)
    finite = (u & np.uint32(0x7f800000)) != np.uint32(0x7f800000)
    with np.errstate(over="ignore"):
        u[finite] += r[finite]
    u &= np.uint32(0xffff0000)
    return torch.from_numpy(u.view(np.float32).copy()).reshape(x.shape).to(torch.bfloat16)   # exact: low bits are 0


def loss_fn(logits, targets, weights):
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                         reduction="none")                   # per-token CE
    if weights is None:
        return ce.mean()
    w = weights.reshape(-1)
    return (w * ce).sum() / (w != 0).sum()


def model_loss(p, cfg, inputs, targets, weights, stats, bf16=False):
    """The training loss: cross-entropy, plus the auxiliary loss for an MoE model. bf16: the
    bf16 forward, the loss in fp32 from its bf16 logits."""
    if bf16:
        return loss_fn(forward_bf16(p, cfg, inputs).float(), targets, weights)
    loss = loss_fn(forward(p, cfg, inputs, stats), targets, weights)
    if cfg["E"] > 0:
        loss = loss + stats["aux"]
    return loss


def write_test_model(path, cfg, seed, version=10):
    """A small model file with random weights (numpy only), for the self-test."""
    rng = np.random.default_rng(seed)
    layout = param_layout(cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], cfg["Vp"], cfg["E"], cfg["N"])
    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[:8] = [MODEL_MAGIC, version, cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"], cfg["Vp"]]
    if version == 10:
        hdr[8:11] = [cfg["E"], cfg["k"], cfg["N"]]
        hdr[11:13] = np.array([cfg["cf"], cfg["alpha"]], dtype="<f4").view("<i4")
    tensors = {}
    for name, shape, _ in layout:
        if name.startswith("ln"):
            t = (1.0 if name.endswith("w") else 0.0) + 0.1 * rng.standard_normal(shape)
        elif name == "routerw":
            t = 0.5 * rng.standard_normal(shape)      # large enough for uneven routing
        else:
            t = 0.2 * rng.standard_normal(shape)
        tensors[name] = t.astype("<f4")
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        for name, _, _ in layout:
            f.write(tensors[name].tobytes())
    return tensors


def moe_block_by_token(p, cfg, m, x):
    """The MoE block one token and one assignment at a time, straight from the rules (no
    gradient; for the self-test): returns out (B, T, C), the aux loss, the dropped count."""
    B, T, C = x.shape
    E, k = cfg["E"], cfg["k"]
    cap = moe_capacity(cfg, T)
    out = torch.zeros(B, T, C)
    aux, dropped = 0.0, 0
    for b in range(B):
        probs, chosen, gates = [], [], []
        for t in range(T):
            pt = torch.softmax(p["routerw"][m] @ x[b, t], dim=0)
            order = sorted(range(E), key=lambda i: (-float(pt[i]), i))[:k]
            top = [float(pt[i]) for i in order]
            probs.append(pt)
            chosen.append(order)
            gates.append(top if k == 1 else [v / sum(top) for v in top])
        used, assigned = [0] * E, [0] * E
        for j in range(k):
            for t in range(T):
                i = chosen[t][j]
                assigned[i] += 1
                if used[i] == cap:
                    dropped += 1
                    continue
                used[i] += 1
                h = F.gelu(p["expfcw"][m, i] @ x[b, t] + p["expfcb"][m, i], approximate="tanh")
                out[b, t] += gates[t][j] * (p["expfcprojw"][m, i] @ h + p["expfcprojb"][m, i])
        P = torch.stack(probs).mean(dim=0)
        aux += cfg["alpha"] * E * sum(assigned[i] / (T * k) * float(P[i]) for i in range(E)) / B
    return out, aux, dropped


def self_test():
    """The MoE block on its own, in float64: the routing rules on a hand-made example, the
    file reader, the dropping arithmetic, an E = 1 model against the dense model with the same
    weights, and the gradients of the aux loss and of the whole loss (router included) against
    central finite differences. Returns the exit status."""
    import tempfile
    torch.set_num_threads(1)   # thousands of tiny forwards: a second thread only adds its hand-off (5x slower)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float64)
    failures = []

    def check(ok, what):
        print(f"  {'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            failures.append(what)

    print("gpt2.py --self-test: the MoE block (float64)")
    # 1. routing by hand: ties go to the lower index; capacity 1; j = 0 for every token first
    probs = np.array([[[0.1, 0.4, 0.4, 0.1], [0.25, 0.25, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4]]], dtype=np.float32)
    e, kept, count = moe_route(probs, 2, 1)
    check(e[0].tolist() == [[1, 2], [0, 1], [3, 2]], f"top-2 order with ties -> lower index first: {e[0].tolist()}")
    check(kept[0].tolist() == [[True, True], [True, False], [True, False]],
          f"capacity 1, j = 0 for all tokens before j = 1: kept {kept[0].tolist()}")
    check(count[0].tolist() == [1, 2, 2, 1], f"assignments per expert before dropping: {count[0].tolist()}")
    e, kept, count = moe_route(probs, 1, 2)
    check(e[0, :, 0].tolist() == [1, 0, 3] and kept.all(), "top-1, capacity 2: nothing dropped")
    # priority: (t0, j1) and (t1, j0) both go to expert 1; j = 0 first means t1 keeps its slot
    e, kept, count = moe_route(np.array([[[0.5, 0.3, 0.2], [0.2, 0.7, 0.1]]], dtype=np.float32), 2, 1)
    check(kept[0].tolist() == [[True, False], [True, False]],
          f"capacity 1: (t1, j0) before (t0, j1) on the same expert: kept {kept[0].tolist()}")
    check(moe_capacity(dict(cf=np.float32(1.25).item(), k=2, E=8), 32) == 10 and
          moe_capacity(dict(cf=0.5, k=2, E=4), 32) == 8 and moe_capacity(dict(cf=1.0, k=1, E=3), 7) == 3,
          "capacity ceil(cf T k / E): 10, 8, 3")

    base = dict(maxT=8, V=11, Vp=16, NH=2, C=8)
    cases = [
        ("E 4, k 2, every block, cf 0.5 (drops)", dict(base, L=2, E=4, k=2, N=1, cf=0.5, alpha=0.1), True),
        ("E 3, k 1, every 2nd of 3 blocks, cf 3 (capacity T: no drops)", dict(base, L=3, E=3, k=1, N=2, cf=3.0, alpha=0.3), False),
        ("E 4, k 3, every 2nd of 4 blocks, cf 0.75", dict(base, L=4, E=4, k=3, N=2, cf=0.75, alpha=0.2), True),
    ]
    B, T = 3, 6
    rng = np.random.default_rng(5)
    inputs = torch.from_numpy(rng.integers(0, base["V"], (B, T)))
    targets = torch.from_numpy(rng.integers(0, base["V"], (B, T)))
    with tempfile.TemporaryDirectory() as tmp:
        for ci, (label, cfg_in, must_drop) in enumerate(cases):
            print(f" [{label}]")
            path = os.path.join(tmp, f"moe{ci}.bin")
            write_test_model(path, cfg_in, seed=10 + ci)
            cfg, layout, params, n = load_model(path, torch.float64)
            Lm = cfg["L"] // cfg["N"]
            check(cfg["E"] == cfg_in["E"] and cfg["k"] == cfg_in["k"] and cfg["N"] == cfg_in["N"] and
                  cfg["cf"] == cfg_in["cf"] and cfg["alpha"] == np.float32(cfg_in["alpha"]).item() and
                  len(layout) == (21 if Lm < cfg["L"] else 17) and params["routerw"].shape[0] == Lm,
                  f"version 10 header and layout: {len(layout)} tensors, {n} parameters, Lm {Lm}")
            stats = {"routes": []}
            loss = model_loss(params, cfg, inputs, targets, None, stats)
            routes = stats["routes"]
            cap = moe_capacity(cfg, T)
            # dropped = sum over groups and experts of max(0, assigned - cap)
            expect = 0
            for e, kept in routes:
                for g in range(B):
                    c = np.bincount(e.reshape(B, T, -1)[g].reshape(-1), minlength=cfg["E"])
                    expect += int(np.maximum(c - cap, 0).sum())
            check(stats["dropped"] == expect and (stats["dropped"] > 0) == must_drop,
                  f"dropped {stats['dropped']} assignments (capacity {cap}): the excess over capacity is {expect}")
            # the vectorised block against a token-by-token transcription of the rules
            with torch.no_grad():
                x = torch.randn(B, T, cfg["C"], generator=torch.Generator().manual_seed(ci))
                for m in range(Lm):
                    st = {"aux": torch.zeros(()), "dropped": 0, "ties": 0}
                    out = moe_block(params, cfg, m, x, st)
                    out_ref, aux_ref, dropped_ref = moe_block_by_token(params, cfg, m, x)
                    diff = float((out - out_ref).abs().max())
                    check(diff < 1e-12 and abs(float(st["aux"]) - aux_ref) < 1e-12 and st["dropped"] == dropped_ref,
                          f"MoE block {m} = the token-by-token version: out max diff {diff:.1e}, aux "
                          f"{float(st['aux']):.6f} vs {aux_ref:.6f}, dropped {st['dropped']} vs {dropped_ref}")
            aux = stats["aux"]
            params_list = [params[name] for name, _, _ in layout]
            grads_aux = torch.autograd.grad(aux, [params["routerw"], params["ln2w"], params["qkvw"]],
                                            retain_graph=True)
            grads = dict(zip([name for name, _, _ in layout], torch.autograd.grad(loss, params_list)))

            def value(which):
                st = {"routes": []}
                with torch.no_grad():
                    lo = model_loss(params, cfg, inputs, targets, None, st)
                same = all((a[0] == b[0]).all() and (a[1] == b[1]).all() for a, b in zip(st["routes"], routes))
                return float(st["aux"] if which == "aux" else lo), same

            def fd_check(which, name, grad, idxs, h=1e-6):
                worst, scale, same_all = 0.0, float(grad.abs().max()), True
                flat, gflat = params[name].data.view(-1), grad.reshape(-1)
                for i in idxs:
                    old = float(flat[i])
                    flat[i] = old + h
                    up, same1 = value(which)
                    flat[i] = old - h
                    down, same2 = value(which)
                    flat[i] = old
                    same_all &= same1 and same2
                    worst = max(worst, abs((up - down) / (2 * h) - float(gflat[i])))
                rel = worst / scale if scale > 0 else worst
                check(rel < 1e-6 and scale > 0 and same_all,
                      f"d{which}/d{name:<10} {len(idxs):4d} elements vs finite differences: max err {worst:.2e} "
                      f"(rel {rel:.1e} of max |g| {scale:.2e}){'' if same_all else ' ROUTING CHANGED'}")

            for name, grad in zip(("routerw", "ln2w", "qkvw"), grads_aux):
                numel = grad.numel()
                idxs = range(numel) if numel <= 256 else rng.choice(numel, 64, replace=False)
                fd_check("aux", name, grad, idxs)
            for name, _, _ in layout:
                numel = params[name].numel()
                idxs = range(numel) if name == "routerw" else rng.choice(numel, min(numel, 24), replace=False)
                fd_check("loss", name, grads[name], idxs)

        # 4. E = 1, k = 1, capacity for every token: the MoE model is the dense model (aux = alpha)
        print(" [E 1: the dense model with the expert's weights]")
        cfg1 = dict(base, L=2, E=1, k=1, N=1, cf=1.0, alpha=0.25)
        t1 = write_test_model(os.path.join(tmp, "e1.bin"), cfg1, seed=3)
        dense_cfg = dict(base, L=2, E=0, k=0, N=1, cf=0.0, alpha=0.0)
        td = {name: t1[name] for name, _, _ in param_layout(8, 11, 2, 2, 8, 16)
              if name not in ("fcw", "fcb", "fcprojw", "fcprojb")}
        td.update(fcw=t1["expfcw"][:, 0], fcb=t1["expfcb"][:, 0], fcprojw=t1["expfcprojw"][:, 0],
                  fcprojb=t1["expfcprojb"][:, 0])
        hdr = np.zeros(HEADER_INTS, dtype="<i4")
        hdr[:8] = [MODEL_MAGIC, 3, 8, 11, 2, 2, 8, 16]
        with open(os.path.join(tmp, "dense.bin"), "wb") as f:
            f.write(hdr.tobytes())
            for name, _, _ in param_layout(8, 11, 2, 2, 8, 16):
                f.write(np.ascontiguousarray(td[name], dtype="<f4").tobytes())
        cfg_m, _, p_m, _ = load_model(os.path.join(tmp, "e1.bin"), torch.float64)
        cfg_d, layout_d, p_d, _ = load_model(os.path.join(tmp, "dense.bin"), torch.float64)
        st_m, st_d = {}, {}
        lm, ld = forward(p_m, cfg_m, inputs, st_m), forward(p_d, cfg_d, inputs, st_d)
        check(len(layout_d) == 16 and cfg_d["E"] == 0, "a version 3 file reads as llm.c's 16 tensors")
        check(float((lm - ld).abs().max()) < 1e-12 and st_m["dropped"] == 0 and
              abs(float(st_m["aux"]) - 2 * cfg_m["alpha"]) < 1e-12,
              f"E 1 logits = dense logits (max diff {float((lm - ld).abs().max()):.1e}), "
              f"aux = alpha per block ({float(st_m['aux']):.6f})")
    print(f"gpt2.py --self-test: {'FAILED: ' + '; '.join(failures) if failures else 'passed'}")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description="GPT-2 PyTorch reference (llm.c format)")
    ap.add_argument("--model")
    ap.add_argument("--batch")
    ap.add_argument("--out")
    ap.add_argument("--dtype", choices=("float32", "float64", "bfloat16"), default="float32",
                    help="bfloat16: bf16 storage, fp32 math in each kernel, fp32 master weights (see above)")
    ap.add_argument("--self-test", action="store_true",
                    help="check the MoE block (routing rules, gradients against finite differences) and exit")
    args = ap.parse_args()
    if args.self_test:
        sys.exit(self_test())
    if not (args.model and args.batch and args.out):
        ap.error("--model, --batch and --out are required (or --self-test)")

    torch.set_num_threads(1)   # small tensors: one thread is faster than two (no hand-off)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    bf16 = args.dtype == "bfloat16"
    dtype = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}[args.dtype]
    cdtype = torch.float32 if bf16 else dtype   # the dtype of the math (bf16: inside each kernel), the loss weights, AdamW
    torch.set_default_dtype(cdtype)

    for path in (args.model, args.batch):
        if not os.path.isfile(path):
            fail(f"{path}: no such file")
    cfg, layout, params, num_params = load_model(args.model, dtype)
    B, T, steps, inputs, targets, weights, opt = load_batch(args.batch, cfg["V"], cfg["maxT"])
    inputs = torch.from_numpy(inputs.astype(np.int64))
    targets = torch.from_numpy(targets.astype(np.int64))
    if weights is not None:
        weights = torch.from_numpy(weights.astype(np.float64)).to(cdtype)
    names = [name for name, _, _ in layout]
    decay = {name: d for name, _, d in layout}

    def as_f32(t):
        return t.detach().to(torch.float32).reshape(-1).numpy()

    def grad_of(n):   # a tensor no token reached (an expert with nothing routed) has gradient 0
        if params[n].grad is None:
            params[n].grad = torch.zeros_like(params[n])
        return params[n].grad

    # Initial logits, loss and gradients (this is also step 0 of the loop).
    stats0 = {}
    if bf16:
        logits0 = forward_bf16(params, cfg, inputs).float()
        stats0 = {"aux": torch.zeros(()), "dropped": 0, "ties": 0}
    else:
        logits0 = forward(params, cfg, inputs, stats0)
    loss0 = loss_fn(logits0, targets, weights)
    if cfg["E"] > 0:
        loss0 = loss0 + stats0["aux"]
    loss0.backward()
    init_logits = as_f32(logits0)
    init_loss = float(loss0)
    init_aux, init_dropped = float(stats0["aux"]), stats0["dropped"]
    init_grads = np.concatenate([as_f32(grad_of(n)) for n in names])
    assert not params["wte"].grad[cfg["V"]:].any(), "padded wte rows got gradient"

    # AdamW state. What AdamW updates: the parameters, or (bf16) fp32 master weights
    master = {n: params[n].detach().float().clone() for n in names} if bf16 else {n: params[n] for n in names}
    m = {n: torch.zeros_like(master[n]) for n in names}
    v = {n: torch.zeros_like(master[n]) for n in names}
    b1, b2, eps, lr = opt["beta1"], opt["beta2"], opt["eps"], opt["lr"]
    step_losses, grad_norms = [], []
    for step in range(1, steps + 1):
        if step > 1:  # step 1 reuses the forward/backward done above
            for n in names:
                params[n].grad = None
            loss = model_loss(params, cfg, inputs, targets, weights, {}, bf16)
            loss.backward()
        else:
            loss = loss0
        step_losses.append(float(loss))
        with torch.no_grad():
            # global L2 norm of all gradients, then clipping (no epsilon)
            if bf16:
                norm = math.sqrt(sum(float((grad_of(n).double() ** 2).sum()) for n in names))
            else:
                norm = math.sqrt(sum(float((grad_of(n) ** 2).sum()) for n in names))
            grad_norms.append(norm)
            scale = 1.0
            if opt["grad_clip"] > 0 and norm > opt["grad_clip"]:
                scale = opt["grad_clip"] / norm
            for ti, n in enumerate(names):   # ti: the tensor's index in the table (dense: no MoE tensor before)
                p, g = master[n], params[n].grad.to(master[n].dtype) * scale   # bf16: the gradient widened
                m[n].mul_(b1).add_((1 - b1) * g)
                v[n].mul_(b2).add_((1 - b2) * g * g)
                mhat = m[n] / (1 - b1 ** step)
                vhat = v[n] / (1 - b2 ** step)
                wd = opt["weight_decay"] if decay[n] else 0.0
                # decay uses p before the update
                p.sub_(lr * (mhat / (vhat.sqrt() + eps) + wd * p))
                if bf16:   # the bf16 parameters the next forward reads: the master rounded stochastically
                    params[n].data.copy_(round_bf16_stochastic(p, step * 1000003 + ti))

    final_params = np.concatenate([as_f32(master[n]) for n in names])

    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[:7] = [OUT_MAGIC, 1, B, T, cfg["V"], steps, num_params]
    # MoE (0 for a dense model): dropped assignments and aux loss of the first forward, Lm
    hdr[7] = init_dropped
    hdr[8:9] = np.array([init_aux], dtype="<f4").view("<i4")
    hdr[9] = cfg["L"] // cfg["N"] if cfg["E"] > 0 else 0
    hdr[10] = 1 if bf16 else 0   # the reference's number format (its initial parameters: the file's in bf16)
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(hdr.tobytes())
        for arr in (init_logits, np.array([init_loss]), init_grads,
                    np.array(step_losses), np.array(grad_norms), final_params):
            f.write(np.asarray(arr, dtype="<f4").tobytes())
    os.replace(tmp, args.out)

    print(f"gpt2.py [{args.dtype}] B={B} T={T} V={cfg['V']} L={cfg['L']} C={cfg['C']} "
          f"params={num_params} weights={'yes' if weights is not None else 'no'}")
    if cfg["E"] > 0:
        print(f"  MoE E={cfg['E']} k={cfg['k']} every={cfg['N']} cf={cfg['cf']:g} alpha={cfg['alpha']:g}: "
              f"capacity {moe_capacity(cfg, T)} per sequence, {init_dropped} of "
              f"{B * T * cfg['k'] * (cfg['L'] // cfg['N'])} assignments dropped, aux loss {init_aux:.6f}, "
              f"{stats0['ties']} token routings decided by an exact tie")
    print(f"  initial loss {init_loss:.6f}")
    print("  step losses " + " ".join(f"{x:.4f}" for x in step_losses))
    print("  grad norms  " + " ".join(f"{x:.4f}" for x in grad_norms))
    print(f"  wrote {args.out}")


if __name__ == "__main__":
    main()
