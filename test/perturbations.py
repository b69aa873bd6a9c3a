#!/usr/bin/env python3
"""The trainer's deliberate bugs, all in ONE build: each test that compares a parallel run with
one rank must be seen to FAIL when the thing it checks is broken. Building one perturbed
trainer per bug costs a full compile each (about 40 s of CPU, 24 times); here every bug below
is compiled into one copy of the sources, each behind a switch, and the environment variable
LLMC_PERTURB=NAME turns one of them on at run time. With LLMC_PERTURB unset the copy computes
exactly what the real trainer computes.

  python3 test/perturbations.py --out DIR    copy train_gpt2.cu and llmc/ into DIR with every
                                             perturbation below applied in its switched form;
                                             DIR/perturb.h (force-included by the build) holds
                                             the switch; DIR/missing.txt lists the ones whose
                                             text was not found (the tests then FAIL them)
  python3 test/perturbations.py --list       the names, one per line

The Makefile builds the copy as build/perturbed/train_gpt2cpu; test/lib_mpi.sh's perturbed_build
NAME runs it with LLMC_PERTURB=NAME. A perturbation is written as the edit a person would make:
in FILE, OLD becomes NEW. Its form says how the switch wraps it:
  stmt  OLD is one or more whole statements: if (on) { NEW } else { OLD }
  expr  OLD is an expression:                (on ? (NEW) : (OLD))
AT, when given, is a longer text that holds OLD once and is itself found once in FILE (OLD alone
would be ambiguous). To add one: a line below, then use its name in the suite that catches it.
"""
import os
import shutil
import sys

# (name, file, form, old, new[, at]); the name is what the suite prints
PERTURBATIONS = [
    # test/test_tp.sh
    ("f backward: all-reduce dropped", "llmc/parallel/tp.h", "stmt",
     'tp_allreduce(tp, "TP f backward: all-reduce", dx_full, tp_full_count(at, C), COMM_FLOATX, COMM_SUM);',
     "(void)dx_full;"),
    ("loss: local max instead of the max over tp", "llmc/parallel/vocab.h", "stmt",
     'tp_allreduce(tp, "vocab loss: all-reduce max", maxes, (size_t)N, COMM_FP32, COMM_MAX);', "(void)maxes;"),
    # (these two change nothing where tp divides the padded vocabulary: only the tp 3 case sees them)
    ("vocab shard placed at t Vp/tp", "llmc/model/params_shard.h", "expr",
     "t * (size_t)tp_vocab_rows((int)rows, (int)tp) + r", "t * (rows / tp) + r"),
    ("loss given the checkpoint Vp, not the run vocabulary", "llmc/model/gpt2.h", "expr",
     "gpt2_run_vocab(model)", "model->config.padded_vocab_size",
     "dloss, model->config.vocab_size, gpt2_run_vocab(model), write_dlogits);"),
    # test/test_pp.sh
    ("embedding group: dwte not summed", "llmc/parallel/pp.h", "expr",
     "pp->p > 1 && (m->place.has_embedding || m->place.has_head)", "0"),
    ("a received activation gradient ignored", "llmc/parallel/pp.h", "expr",
     "model->bufs.dresidual", "model->bufs.dln", "copy_device_to_device(model->bufs.dresidual, pp->grad_recv,"),
    # test/test_cp.sh
    ("the merge without the max correction", "llmc/cpu/attention_block.h", "expr",
     "expf(*la - m)", "*la == -INFINITY ? 0.0f : 1.0f"),
    ("the merge without the max correction", "llmc/cpu/attention_block.h", "expr",
     "expf(lb - m)", "lb == -INFINITY ? 0.0f : 1.0f"),
    ("a ring that skips its last step", "llmc/parallel/cp_ring.h", "expr",
     "cp->cp", "cp->cp - 1", "for (int j = 0; j < cp->cp; j++) {   // step j: the block of rank - j"),
    # test/test_moe.sh
    ("expert gradients averaged over all dp ranks", "llmc/parallel/ep.h", "expr",
     "&ep->edp", "ep->dp_comm", "Comm* group = &ep->edp;"),
    ("a combine that ignores the gate weights", "llmc/model/moe_block.h", "stmt",
     "moe_combine(out, r->yret, r->slot_d, r->gates_d, N, k, C, 0);",
     "moe_combine(out, r->yret, r->slot_d, NULL, N, k, C, 0);"),
    # test/test_compress.sh
    ("no residual update", "llmc/parallel/compress_codec.h", "stmt",
     "for (size_t i = 0; i < n; i++) { e[i] = a[i] - d[i]; }", "for (size_t i = 0; i < n; i++) { e[i] = 0.0f; }"),
    ("sum in another order", "llmc/parallel/dp_compress.h", "expr", "(blk + t) % N", "(blk + t - 1) % N"),
    # test/test_mixed_precision.sh
    ("no 1/S", "llmc/model/gpt2.h", "expr",
     "((grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f) / model->loss_scale",
     "((grad_clip > 0.0f && norm > grad_clip) ? grad_clip / norm : 1.0f)"),
    ("no skip", "llmc/train/loss_scale.h", "stmt", "if (s->on) { model->skip_nonfinite = 1; }", "(void)0;"),
    # test/test_recompute.sh
    ("selective recomputation skips the GELU", "llmc/model/recompute.h", "stmt",
     "if (dense) { gelu_forward(b->fch_gelu, b->fch, (size_t)at->B * at->T * H); }", "(void)dense;"),
    ("full recomputation skips the MLP", "llmc/model/recompute.h", "expr", "dense", "!dense",
     "if (dense) {\n            MLPActs mlp = {b->fch, b->fch_gelu, b->fcproj};"),
    # test/test_state.sh
    ("data position not restored", "llmc/train/state_load.h", "stmt", "task->set_position(task, &pos, ppath.c_str());", ""),
    ("AdamW t not restored", "llmc/train/state_load.h", "stmt", "m->step = mf.adamw_t;", ""),
    ("AdamW m not restored", "llmc/train/state_load.h", "expr", "KIND_M", "KIND_V", "int kinds[3] = {KIND_M,"),
    # test/test_errors.sh (its PERTURBED list): a check of a training-state directory switched off
    ("the manifest's checksum not checked", "llmc/train/state_manifest.h", "expr",
     "text.compare(last + 1, std::string::npos, state_crc_line(text.substr(0, last + 1))) != 0", "0"),
    ("a small state file's checksum not checked", "llmc/train/state_manifest.h", "expr", "text.size() != bytes || crc != hash", "0"),
    ("the manifest's step not checked against its directory", "llmc/train/state_manifest.h", "expr", "mf.step != dir_step", "0"),
    ("the position's step not checked", "llmc/train/state_manifest.h", "expr", "pstep != mf.step", "0"),
    ("the log not checked against the step", "llmc/train/state_manifest.h", "stmt",
     'state_check_log(mf.log, mf.step, mf.step_dir + "/log");', ""),
    ("control characters kept in error messages", "llmc/common.h", "expr", "escape_controls(raw)", "std::string(raw)"),
    ("the state directory not checked before the run", "llmc/paths.h", "stmt", "path_check_state_dir(f.flag, f.path);", ""),
    # test/test_errors.sh: the other bad-input checks switched off
    ("inputs not checked to be regular files", "llmc/common.h", "stmt", "check_regular_file_or_die(path);", "",
     "if (mode[0] == 'r') { check_regular_file_or_die(path); }"),
    ("inputs not checked to be regular files", "llmc/paths.h", "expr", "stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)", "0"),
    # test/test_errors.sh: the checks of issue 56 (paths by their roles, the tuning file, the lock)
    ("an output's name not checked against the file system's limit", "llmc/paths.h", "expr", "(long)(name + suffix) > most", "0"),
    ("outputs allowed in /proc and /sys", "llmc/paths.h", "expr", "fs.f_type == 0x9fa0 || fs.f_type == 0x62656572", "0"),
    ("inputs allowed inside the state directory", "llmc/paths.h", "expr", "s->role == PATH_STATE_DIR && path_inside(x.resolved, s->path)", "0"),
    ("a tuning number read up to its first bad character", "llmc/comm/tuning.h", "expr", "*end == 0 && isfinite(*v)", "isfinite(*v)"),
    ("tuning rows allowed to overlap", "llmc/comm/tuning.h", "expr", "!(r.hi < o.lo || o.hi < r.lo)", "0"),
    ("a tuning file without rows for the job accepted", "llmc/comm/auto.h", "expr", "!missing.empty()", "0"),
    ("a tuning file accepted where auto never runs", "llmc/plan/parallel_plan.h", "expr", "a->comm_tuning && plan->mesh.dp_cp.size < 2", "0"),
    ("a live job's lock taken over", "llmc/train/state_lock.h", "expr", "holder != host || kill((pid_t)pid, 0) == 0 || errno != ESRCH || attempt > 0", "attempt > 0"),
    ("outputs not compared with the inputs", "llmc/paths.h", "expr", "same_file(o, x)", "0"),
    ("no upper bounds on the flags", "llmc/train/train_args_check.h", "expr", "m.value > m.most", "0"),
    ("no limits on the model's shape", "llmc/model/gpt2_build.h", "expr", "l.value > l.most", "0"),
    ("memory not checked before it is allocated", "llmc/model/gpt2_build.h", "expr", "bytes > have", "0"),
    ("a checkpoint header not checked against its file", "llmc/model/checkpoint.h", "expr", "size != need", "0"),
    ("flags that do nothing accepted", "llmc/train/train_args_check.h", "expr", "args_given(r.flag) && !r.used", "0"),
    ("a links line of any length", "llmc/planner/machine.h", "expr", "words.size() != 3", "words.size() < 3"),
    ("a state's numbers read with a sign", "llmc/tasks/task.h", "expr", 'strspn(s.c_str(), "0123456789") != s.size()', "0"),
    ("a state's numbers cut to an int", "llmc/tasks/task.h", "expr", "v > 2147483647ULL", "0"),
    ("the data position not derived from the step", "llmc/tasks/pretrain.h", "expr", "shard != want_shard || at != want", "0"),
    ("AdamW's t not derived from the log", "llmc/train/state_manifest.h", "expr", "mf->adamw_t != mf->step - skipped", "0"),
    ("the tensor lines not checked", "llmc/train/state_load.h", "expr", "mf.tensors[i] != want", "0"),
    ("the position's run not checked", "llmc/train/state_manifest.h", "expr", "pid != mf.identity", "0"),
    ("a rank file's run not checked", "llmc/train/state_shards.h", "expr", "(uint64_t)h[7] != mf->identity", "0"),
    ("non-finite state values accepted", "llmc/train/state_shards.h", "expr", "!isfinite(v[i]) || (is_v && v[i] < 0.0f)", "0"),
    ("--profile with nothing to profile accepted", "llmc/train/train_args_check.h", "expr", "a->profile && last < 2 && !a->resume", "0"),
    ("--mesh auto beside --plan accepted", "llmc/train/train_args_check.h", "expr", "a->mesh && a->plan", "0"),
    ("the planner's no-answer without an error line", "llmc/planner/planner.h", "stmt",
     'if (!best) { die("--plan all: no mesh of %d devices runs this model and batch (the lines above say why, and what would)", devices); }',
     "if (!best) { return 1; }"),
    ("OMP_NUM_THREADS not bounded", "llmc/train/train_args_check.h", "expr", "omp", "0", "if (omp) {"),
    ("a tokenizer with trailing bytes accepted", "llmc/data/tokenizer.h", "expr", "size != end", "0"),
    ("an SFT mask without an answer accepted", "llmc/data/sft_shards.h", "expr", "memchr(mask->data(), 1, n) == NULL", "0"),
    ("the shards' tokens not checked up front", "llmc/data/token_shards.h", "expr", "total <= DATALOADER_CHECK_ALL_TOKENS", "0"),
    ("the shards ahead not checked at the step's boundary", "llmc/train/data_ahead.h", "expr", 't->look_ahead ? t->look_ahead(t) : ""', '""'),
    ("the shards' sizes not checked up front", "llmc/data/token_shards.h", "expr", "n < need", "0"),
    # test/test_planner.sh
    ("ZeRO-2 keeps the whole gradient", "llmc/parallel/dp_accounting.h", "stmt",
     "dp_formula_rows(dp, out, a * dp->psi, a * dp->psi_pad / dp->N, dp->psi_pad / dp->N);",
     "dp_formula_rows(dp, out, a * dp->psi, a * dp->psi_pad, dp->psi_pad / dp->N);"),
    ("the pipeline sends one micro-batch fewer", "llmc/parallel/pp_accounting.h", "stmt",
     "return (uint64_t)pp->m * (fwd + bwd) * X * a;", "return (uint64_t)(pp->m - 1) * (fwd + bwd) * X * a;"),
    # test/test_zeropp.sh
    ("dequantise without the scale", "llmc/cpu/quantize.h", "stmt", "return (float)q * scale;", "return (float)q;"),
    # test/test_ps_sched.sh
    ("priority ignored", "llmc/parallel/dp_core.h", "expr", "dp->task_prio[i] < dp->task_prio[best]", "0"),
    ("push summed in another order", "llmc/parallel/dp_priority.h", "stmt",
     "comm_recv(comm, inc, c.count, COMM_FLOATX, (r - k + p) % p);", "comm_recv(comm, inc, c.count, COMM_FLOATX, (r + k) % p);"),
    # test/test_ps_async.sh: the pushes summed 1, 2, ..., N-1 (the loop runs w = N-1 down to 1)
    ("sum order", "llmc/parallel/dp_ps_async_server.h", "expr", "k + w", "k + N - w",
     "comm_reduce_local(a->grad, a->slots[k + w], dp->psi, COMM_FLOATX, COMM_AVG);"),
    ("no staleness wait", "llmc/parallel/dp_ps_async_worker.h", "expr", "a->async ? 0 : a->clock + 1 - a->S", "0"),
]


def names():
    seen = []
    for p in PERTURBATIONS:
        if p[0] not in seen:
            seen.append(p[0])
    return seen


def switched(form, old, new, k):
    on = "llmc_perturbed(%d)" % k
    if form == "stmt":
        return "if (%s) { %s } else { %s }" % (on, new, old)
    if form == "expr":
        return "(%s ? (%s) : (%s))" % (on, new, old)
    raise ValueError("form must be stmt or expr, not " + form)


def write(out):
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    shutil.copytree("llmc", os.path.join(out, "llmc"))
    shutil.copy("train_gpt2.cu", out)
    all_names = names()
    missing = []
    for p in PERTURBATIONS:
        name, path, form, old, new = p[:5]
        at = p[5] if len(p) > 5 else old
        k = all_names.index(name)
        full = os.path.join(out, path)
        text = open(full).read()
        if text.count(at) != 1 or at.count(old) != 1:
            missing.append("%s: '%s' is not in %s exactly once" % (name, at.replace("\n", "\\n"), path))
            continue
        text = text.replace(at, at.replace(old, switched(form, old, new, k)))
        open(full, "w").write(text)
    with open(os.path.join(out, "perturb.h"), "w") as f:
        f.write("// written by test/perturbations.py: which deliberate bug is on (LLMC_PERTURB=NAME)\n")
        f.write("#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n")
        f.write("static const char* const llmc_perturb_names[] = {\n")
        for n in all_names:
            f.write('    "%s",\n' % n.replace("\\", "\\\\").replace('"', '\\"'))
        f.write("};\n")
        f.write("static inline int llmc_perturb_parse() {\n"
                "    const char* s = getenv(\"LLMC_PERTURB\");\n"
                "    if (s == NULL || *s == 0) { return -1; }\n"
                "    for (int k = 0; k < (int)(sizeof(llmc_perturb_names) / sizeof(llmc_perturb_names[0])); k++) {\n"
                "        if (strcmp(s, llmc_perturb_names[k]) == 0) { return k; }\n"
                "    }\n"
                "    fprintf(stderr, \"error: LLMC_PERTURB='%s': no such perturbation (test/perturbations.py --list)\\n\", s);\n"
                "    exit(2);\n"
                "}\n"
                "static inline int llmc_perturbed(int k) {\n"
                "    static const int on = llmc_perturb_parse();\n"
                "    return on == k;\n"
                "}\n")
    with open(os.path.join(out, "missing.txt"), "w") as f:
        for m in missing:
            f.write(m + "\n")
    for m in missing:
        print("perturbations.py: " + m, file=sys.stderr)


def main():
    out = os.path.abspath(sys.argv[2]) if len(sys.argv) == 3 and sys.argv[1] == "--out" else None
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    if sys.argv[1:] == ["--list"]:
        print("\n".join(names()))
    elif out:
        write(out)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
