#!/usr/bin/env python3
"""Shows that test_kernels catches a wrong kernel: for each perturbation below (a changed
constant, a dropped or rescaled term, an off-by-one range) it builds test/test_kernels.cu
against a perturbed copy of llmc/ in a temporary directory (the tree itself is never
modified), runs it, and prints the FAIL lines. Exits 1 if a perturbation went unnoticed.
Usage: python3 test/perturb_kernels.py [substring of a label ...]
Takes about a minute on 2 cores. The figures are recorded in doc/gpt2-cpu.md."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CXX = ["g++", "-std=c++17", "-O3", "-march=native", "-fopenmp", "-x", "c++", "-DLLMC_CPU"]

# (label, file in llmc/cpu, function whose body is edited, old text, new text): every
# occurrence of old in that function becomes new (old must occur).
PERTURBATIONS = [
    ("gelu bwd: cubic coefficient 0.044715 -> 0.040", "gelu.h", "gelu_backward", "0.044715f", "0.040f"),
    ("gelu bwd: 3*0.044715 -> 3*0.0447 in du/dx only", "gelu.h", "gelu_backward", "3.0f * 0.044715f", "3.0f * 0.0447f"),
    ("gelu bwd: 0.5 (1 + th) scaled by 1.001", "gelu.h", "gelu_backward", "0.5f * (1.0f + th)", "0.5005f * (1.0f + th)"),
    ("gelu fwd: cubic coefficient 0.044715 -> 0.040", "gelu.h", "gelu_forward", "0.044715f", "0.040f"),
    ("layernorm bwd: term - mean(g) dropped", "layernorm.h", "layernorm_backward", " - g_mean - ", " - "),
    ("layernorm bwd: term - xhat mean(g xhat) dropped", "layernorm.h", "layernorm_backward",
     " - xhat * gx_mean);", ");"),
    ("layernorm bwd: mean(g xhat) scaled by 1.001", "layernorm.h", "layernorm_backward",
     "gx_mean /= C;", "gx_mean /= C; gx_mean *= 1.001f;"),
    ("layernorm bwd: dinp overwritten, not accumulated", "layernorm.h", "layernorm_backward", "dx[c] += s", "dx[c] = s"),
    ("layernorm bwd: dweight scaled by 1.001", "layernorm.h", "layernorm_backward",
     "* rstd[i];", "* rstd[i] * 1.001f;"),
    ("layernorm bwd: dbias scaled by 1.001", "layernorm.h", "layernorm_backward",
     "dbias[c] += dy[c];", "dbias[c] += 1.001f * dy[c];"),
    ("layernorm fwd: eps 1e-5 -> 1e-4", "layernorm.h", "layernorm_forward", "1e-5f", "1e-4f"),
    ("attention bwd: dS loop t2 < t (the diagonal keeps dP)", "attention.h", "attention_backward",
     "t2 <= t; t2++) { dst[t2]", "t2 < t; t2++) { dst[t2]"),
    ("attention bwd: row sum of P dP scaled by 1.001", "attention.h", "attention_backward",
     "float rowdot = att_dot(", "float rowdot = 1.001f * att_dot("),
    ("attention bwd: 1/sqrt(hs) left out of dS", "attention.h", "attention_backward",
     "(dst[t2] - rowdot) * scale;", "(dst[t2] - rowdot);"),
    ("attention bwd: dk from k instead of q", "attention.h", "attention_backward",
     "ds, ld, q, C3, T, hs);", "ds, ld, q + C, C3, T, hs);"),
    ("attention bwd: dv from dS instead of P", "attention.h", "attention_backward",
     "C3, p, T, dO, C, T, hs);", "C3, ds, ld, dO, C, T, hs);"),
    ("attention kernel: L^T X without the diagonal (dV, dK)", "attention_kernel.h", "att_lower_tmul",
     "kb[r] = j0 + r;", "kb[r] = j0 + r + 1;"),
    ("attention kernel: L X without the diagonal (out, dQ)", "attention_kernel.h", "att_lower_mul",
     "ke[r] = t0 + r0 + r + 1;", "ke[r] = t0 + r0 + r;"),
    ("attention kernel: softmax sum without its last group of 8", "attention_kernel.h", "att_softmax",
     "sum += inside ? att_load(p + last) : zero;", ""),
    ("attention kernel: products of the second vector scaled by 1.0001", "attention_kernel.h", "att_fma",
     "y1 += x * att_load(b + 8);", "y1 += 1.0001f * x * att_load(b + 8);"),
    ("encoder bwd: dwte overwritten, not accumulated", "encoder.h", "encoder_backward_vocab",
     "dwte_ix[c] += dout_bt[c];", "dwte_ix[c] = dout_bt[c];"),
    ("encoder bwd: batch row 0 skipped", "encoder.h", "encoder_backward_vocab", "int b = 0;", "int b = 1;"),
    ("encoder bwd: dwpe scaled by 1.001", "encoder.h", "encoder_backward_vocab",
     "dwpe_t[c] += dout_bt[c];", "dwpe_t[c] += 1.001f * dout_bt[c];"),
    ("matmul bwd: dinp sums OC-1 output channels", "matmul.h", "matmul_backward_blocked",
     "gemm_blocked(BT, C, OC,", "gemm_blocked(BT, C, OC - 1,"),
    ("matmul bwd: dinp accumulated, not overwritten", "matmul.h", "matmul_backward_blocked",
     "dinp, C, false);", "dinp, C, true);"),
    ("matmul bwd: dweight sums BT-1 rows", "matmul.h", "matmul_backward_blocked",
     "gemm_blocked(OC, C, BT,", "gemm_blocked(OC, C, BT - 1,"),
    ("matmul bwd: dweight overwritten, not accumulated", "matmul.h", "matmul_backward_blocked",
     "dweight, C, true);", "dweight, C, false);"),
    ("matmul bwd: dbias scaled by 1.001", "matmul_kernel.h", "matmul_bias_backward",
     "dbias[o0 + j] += acc[j];", "dbias[o0 + j] += 1.001f * acc[j];"),
    ("matmul bwd: dbias skips row 0", "matmul_kernel.h", "matmul_bias_backward", "int bt = 0;", "int bt = 1;"),
    ("matmul micro-kernel: products scaled by 1.0001", "matmul_kernel.h", "mm_micro_kernel",
     "acc_v[i][0] += ai * b0;", "acc_v[i][0] += 1.0001f * ai * b0;"),
    ("classifier: dlogits' softmax scaled by 1.001", "classifier.h", "fused_classifier",
     "exp_poly(row[v] - maxval) * inv;", "exp_poly(row[v] - maxval) * inv * 1.001f;"),
    ("classifier: dlogits' softmax scaled by 1.0001", "classifier.h", "fused_classifier",
     "exp_poly(row[v] - maxval) * inv;", "exp_poly(row[v] - maxval) * inv * 1.0001f;"),
    ("classifier: one-hot 1 -> 0.999", "classifier.h", "fused_classifier", "1.0f : 0.0f", "0.999f : 0.0f"),
    ("classifier: loss weight left out of dlogits", "classifier.h", "fused_classifier",
     "float scale = dloss * w;", "float scale = dloss;"),
    ("classifier: padded columns not zeroed", "classifier.h", "fused_classifier",
     "for (int v = V; v < Vp; v++) { row[v] = 0.0f; }", ""),
]


def perturb(src, function, old, new):
    """Replace old by new inside the body of `function` (from its signature to the next
    line that is a lone '}')."""
    m = re.search(r"static inline void " + function + r"\(.*?\n}\n", src, re.S)
    if m is None or old not in m.group(0):
        return None
    return src[:m.start()] + m.group(0).replace(old, new) + src[m.end():]


def run(label, tree, file=None, function=None, old=None, new=None):
    os.makedirs(tree)
    shutil.copytree(os.path.join(ROOT, "llmc"), os.path.join(tree, "llmc"))
    os.makedirs(os.path.join(tree, "test"))
    shutil.copy(os.path.join(ROOT, "test", "test_kernels.cu"), os.path.join(tree, "test"))
    if file is not None:
        path = os.path.join(tree, "llmc", "cpu", file)
        with open(path) as f:
            src = perturb(f.read(), function, old, new)
        if src is None:
            return label, None, "perturbation no longer applies: %r not in %s's %s" % (old, file, function)
        with open(path, "w") as f:
            f.write(src)
    exe = os.path.join(tree, "test_kernels")
    build = subprocess.run(CXX + [os.path.join(tree, "test", "test_kernels.cu"), "-o", exe, "-lm"],
                           capture_output=True, text=True)
    if build.returncode != 0:
        return label, None, "does not compile:\n" + build.stderr[-2000:]
    # one thread each, two tests at a time (the thread-independence check sets its own)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([exe], capture_output=True, text=True, env=env)
    fails = [line for line in out.stdout.splitlines() if line.startswith("FAIL ")]
    return label, out.returncode, "\n".join(fails) if fails else out.stdout


def main():
    wanted = sys.argv[1:]
    todo = [p for p in PERTURBATIONS if not wanted or any(w in p[0] for w in wanted)]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        jobs = [pool.submit(run, "unperturbed", os.path.join(tmp, "0"))]
        jobs += [pool.submit(run, p[0], os.path.join(tmp, str(i + 1)), *p[1:]) for i, p in enumerate(todo)]
        missed = 0
        for job in jobs:
            label, rc, text = job.result()
            if label == "unperturbed":
                ok = rc == 0
                print("%s unperturbed kernels pass test_kernels" % ("ok    " if ok else "BROKEN"))
                if not ok:
                    print("   " + text.replace("\n", "\n   "))
                    missed += 1
                continue
            caught = rc is not None and rc != 0 and text.startswith("FAIL ")
            print("%s %s" % ("caught" if caught else "MISSED", label))
            print("   " + text.replace("\n", "\n   "))
            missed += not caught
    print("%d of %d perturbations caught" % (len(todo) - missed, len(todo)) if missed == 0 else
          "%d perturbation(s) NOT caught (or the unperturbed run failed)" % missed)
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
