#!/usr/bin/python3
"""PyTorch fp32 reference for the RLVR loss (llmc/tasks/rlvr_rollouts.h), written from the definitions.

Reads the policy (model.bin), the frozen reference model (ref_model.bin) and a rollout case
(rows of prompt + sampled completion tokens, one reward per row, the advantage mode and the
KL coefficient beta, written by test_gpt2 --write-inputs), and writes the loss and its
gradient with respect to every parameter of the policy:

    A_i  = (r_i - mean_group) / (std_group + 1e-4)        mode grpo (population std)
    A_i  = r_i                                            mode top1
    J    = 1/N sum_i sum_{t in completion i} [ -A_i log p(y_t) + beta * k3_t ]
    k3_t = exp(l_t) - l_t - 1,  l_t = log p_ref(y_t) - log p(y_t)

N is the number of completion tokens. Each row runs through the model on its own (batch 1,
no padding), so the C++ side's padding of rows to one length is checked as well.

    /usr/bin/python3 test/reference/rlvr.py --model M.bin --ref-model R.bin --case C.bin --out O.bin
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2 import HEADER_INTS, fail, forward, load_model, read_header  # noqa: E402

CASE_MAGIC, OUT_MAGIC = 20241124, 20241125
GRPO, BASELINE, TOP1 = 0, 1, 2


def load_case(path):
    raw = open(path, "rb").read()
    hdr = read_header(raw, path, CASE_MAGIC, (1,))
    rows, G, mode = int(hdr[2]), int(hdr[3]), int(hdr[4])
    beta = float(hdr[5:6].view("<f4")[0])
    body = np.frombuffer(raw, dtype="<i4", offset=HEADER_INTS * 4)
    pos, prompts, completions = 0, [], []
    for _ in range(rows):
        plen, clen = int(body[pos]), int(body[pos + 1])
        pos += 2
        prompts.append([int(x) for x in body[pos:pos + plen]])
        pos += plen
        completions.append([int(x) for x in body[pos:pos + clen]])
        pos += clen
    rewards = body[pos:pos + rows].view("<f4").astype(np.float64)
    if len(rewards) != rows:
        fail(f"{path}: truncated")
    return G, mode, beta, prompts, completions, rewards


def advantages(rewards, G, mode):
    r = torch.tensor(rewards)
    if mode == GRPO:
        groups = r.view(-1, G)
        mean = groups.mean(dim=1, keepdim=True)
        std = groups.std(dim=1, unbiased=False, keepdim=True)
        return ((groups - mean) / (std + 1e-4)).reshape(-1)
    if mode == BASELINE:   # the first step: the baseline is the batch mean
        return r - r.mean()
    return r


def completion_logp(params, cfg, prompt, completion):
    """log p(y_t) of each completion token, the row alone through the model."""
    seq = torch.tensor([prompt + completion])
    logits = forward(params, cfg, seq[:, :-1])[0]            # (len-1, V)
    logp = torch.log_softmax(logits, dim=-1)
    start = len(prompt) - 1                                  # position predicting completion[0]
    targets = seq[0, len(prompt):]
    return logp[start:start + len(completion)].gather(1, targets[:, None])[:, 0]


def main():
    ap = argparse.ArgumentParser(description="RLVR loss reference (PyTorch autograd)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--ref-model", required=True)
    ap.add_argument("--case", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)   # small tensors: one thread is faster than two (no hand-off)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    for path in (args.model, args.ref_model, args.case):
        if not os.path.isfile(path):
            fail(f"{path}: no such file")
    cfg, layout, params, num_params = load_model(args.model, torch.float32)
    _, _, ref_params, _ = load_model(args.ref_model, torch.float32)
    G, mode, beta, prompts, completions, rewards = load_case(args.case)
    adv = advantages(rewards, G, mode).to(torch.float32)
    assert torch.isfinite(adv).all(), "non-finite advantage"

    N = sum(len(c) for c in completions)
    total = torch.zeros(())
    for i, (p, c) in enumerate(zip(prompts, completions)):
        lp = completion_logp(params, cfg, p, c)
        total = total - adv[i] * lp.sum()
        if beta > 0:
            with torch.no_grad():
                lr = completion_logp(ref_params, cfg, p, c)
            l = lr - lp
            total = total + beta * (torch.exp(l) - l - 1).sum()
    loss = total / N
    loss.backward()
    names = [name for name, _, _ in layout]
    grads = np.concatenate([params[n].grad.detach().reshape(-1).numpy() for n in names])

    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[:4] = [OUT_MAGIC, 1, num_params, N]
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(hdr.tobytes())
        f.write(np.array([float(loss)], dtype="<f4").tobytes())
        f.write(grads.astype("<f4").tobytes())
    os.replace(tmp, args.out)
    print(f"rlvr.py: {len(prompts)} rows, G={G}, mode={mode}, beta={beta}, N={N}: loss {float(loss):.6f}")


if __name__ == "__main__":
    main()
