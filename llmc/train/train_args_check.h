// Every check of the flags that needs no file: each value (train_args_check, and the parameter
// server's options in train_args_check_ps) and each flag given without the one it needs
// (train_args_check_unused). parse_train_args, at the end, reads the command line
// (llmc/plan/train_args.h) and runs them, on every rank before MPI starts. The pipeline's
// schedules (llmc/parallel/pp_schedule.h) and the RL task's modes and rewards
// (llmc/tasks/rlvr_rollouts.h) name the values they accept.
#pragma once

#include <string.h>
#include <string>
#include "../plan/train_args.h"
#include "../tasks/rlvr_rollouts.h"
#include "../parallel/pp_schedule.h"

// --comm-chunk-kb/--comm-order, --ps-async/--staleness/--straggler, --compress/--error-feedback
// (doc/parameter-server.md). A straggler rank that does not exist is checked once the world
// size is known (llmc/train/straggler.h).
static inline void train_args_check_ps(TrainArgs* a) {
    if (a->comm_chunk_kb < 0) { die("--comm-chunk-kb must be >= 0 KiB (0 = whole buffers), got %d", a->comm_chunk_kb); }
    if (strcmp(a->comm_order, "fifo") != 0 && strcmp(a->comm_order, "priority") != 0) {
        die("--comm-order must be fifo or priority, got '%s'", a->comm_order);
    }
    if (strcmp(a->comm_order, "fifo") != 0 && a->comm_chunk_kb == 0) {
        die("--comm-order %s orders chunks: add --comm-chunk-kb K", a->comm_order);
    }
    if (a->comm_chunk_kb > 0 && strcmp(a->dp_mode, "ps") != 0 && !(strcmp(a->dp_mode, "ddp") == 0 && a->zero == 0)) {
        die("--comm-chunk-kb schedules the parameter server's push/pull (--dp-mode ps) or DDP's all-reduce (--dp-mode ddp, "
            "--zero 0), got --dp-mode %s --zero %d", a->dp_mode, a->zero);
    }
    if (a->comm_chunk_kb > 0 && (a->tp > 1 || a->pp > 1 || a->cp > 1 || a->ep > 1)) {
        die("--comm-chunk-kb is built for pure data parallelism: it does not combine with --tp, --pp, --cp or --ep");
    }
    if (a->staleness) {
        const char* end = a->staleness;
        int s = 0;
        if (a->staleness[0] == '-' && parse_count(a->staleness + 1, &s, &end) && *end == 0) {
            die("--staleness must be >= 0 steps (0 = synchronous), got %s", a->staleness);
        }
        if (!parse_count(a->staleness, &s, &end) || *end != 0) {
            if (a->staleness[0] && strspn(a->staleness, "0123456789") == strlen(a->staleness)) {
                die("--staleness %s is more steps than an int holds (at most 2147483647)", a->staleness);
            }
            die("--staleness must be a whole number of steps >= 0, got '%s'", a->staleness);
        }
        a->staleness_bound = s;
    }
    if (a->ps_async && a->staleness) { die("--ps-async has no bound on staleness: drop --staleness %s (or --ps-async for SSP)", a->staleness); }
    if (a->ps_async || a->staleness) {
        const char* what = a->ps_async ? "--ps-async" : "--staleness";
        if (strcmp(a->dp_mode, "ps") != 0) { die("%s is the parameter server's: add --dp-mode ps", what); }
        if (a->ps_servers != 1) { die("%s runs one server (rank 0, on a thread of its own): drop --ps-servers %d", what, a->ps_servers); }
        if (a->tp > 1 || a->pp > 1 || a->cp > 1 || a->ep > 1 || a->moe_experts > 0) {
            die("%s is pure data parallelism: it does not combine with --tp, --pp, --cp, --ep or --moe-experts", what);
        }
        if (a->save_state || a->resume) { die("%s: the training state of a run without a barrier is not saved (drop --save-state/--resume)", what); }
        if (a->eval_every > 0 && a->eval_every < a->steps) {
            die("%s: the workers hold different versions of the parameters mid-run, so evaluation runs at the end only: "
                "add --eval-every 0", what);
        }
        if (strcmp(a->loss_scale, "dynamic") == 0) { die("%s with --loss-scale dynamic is not built: every rank would have to agree on each skipped step", what); }
        if (strcmp(a->task, "rlvr") == 0) { die("%s: --task rlvr's rollouts need every rank at the same step", what); }
        if (a->comm_chunk_kb > 0) { die("%s with --comm-chunk-kb is not built: the asynchronous server takes whole pushes", what); }
        if (strcmp(a->compress, "none") != 0) { die("%s with --compress is not built: compress the synchronous push (drop %s)", what, what); }
    }
    if (a->ps_log && !a->ps_async && !a->staleness) { die("--ps-log is the asynchronous server's log: add --ps-async or --staleness S (with --dp-mode ps)"); }
    if (a->ps_log && a->steps < 2) { die("--ps-log is written with the run's summary, after the timed steps: --steps must be >= 2, got %d", a->steps); }
    if (a->straggler && strncmp(a->straggler, "hold:", 5) == 0) {   // a straggler in order, not in time (dp_ps_async.h)
        const char* r = a->straggler + 5;
        const char* end = r;
        int rank = 0;
        if (!parse_count(r, &rank, &end) || *end != 0) {
            die("--straggler hold:RANK names a rank (a whole number >= 0), got '%s'", a->straggler);
        }
        if (!a->ps_async && !a->staleness) {
            die("--straggler %s holds a rank back at the asynchronous server: add --ps-async or --staleness S (with --dp-mode ps)",
                a->straggler);
        }
    } else if (a->straggler) {
        const char* c = strchr(a->straggler, ':');
        char* end = NULL;
        double ms = c ? strtod(c + 1, &end) : -1.0;
        const char* rank_end = a->straggler;
        int rank = 0;
        int rank_ok = c && (strncmp(a->straggler, "random:", 7) == 0 || (parse_count(a->straggler, &rank, &rank_end) && rank_end == c));
        if (!rank_ok || !end || *end != 0 || !(ms > 0) || !isfinite(ms)) {
            die("--straggler must be RANK:MS or random:MS with MS > 0 milliseconds, or hold:RANK, got '%s'", a->straggler);
        }
        if (ms > 60000.0) {
            die("--straggler %s: %g ms a step is more than a minute, the most a simulated straggler sleeps", a->straggler, ms);
        }
    }
    if (strcmp(a->compress, "none") != 0) {
        const char* c = strchr(a->compress, ':');
        size_t n = c ? (size_t)(c - a->compress) : strlen(a->compress);
        char* end = NULL;
        int sparse = (n == 4 && strncmp(a->compress, "topk", 4) == 0) || (n == 5 && strncmp(a->compress, "randk", 5) == 0);
        int qsgd = n == 4 && strncmp(a->compress, "qsgd", 4) == 0;
        int sign = strcmp(a->compress, "sign") == 0;
        if (!sparse && !qsgd && !sign) { die("--compress must be none, topk:R, randk:R, qsgd:B or sign, got '%s'", a->compress); }
        if (sparse) {
            double r = c ? strtod(c + 1, &end) : -1.0;
            if (!c || *end != 0 || !(r > 0.0 && r <= 1.0)) {
                die("--compress %.*s:R: the ratio R (the fraction of values sent) must be in (0, 1], got '%s'", (int)n, a->compress, a->compress);
            }
        }
        if (qsgd) {
            long b = c ? strtol(c + 1, &end, 10) : -1;
            if (!c || *end != 0 || b < 1 || b > 16) { die("--compress qsgd:B: B must be 1 to 16 bits, got '%s'", a->compress); }
        }
        if (strcmp(a->dp_mode, "ps") != 0 && strcmp(a->dp_mode, "naive") != 0 && !(strcmp(a->dp_mode, "ddp") == 0 && a->zero == 0)) {
            die("--compress compresses the parameter server's push or the all-reduce (--dp-mode ps, naive or ddp): not --zero %d", a->zero);
        }
        if (a->comm_chunk_kb > 0) { die("--compress with --comm-chunk-kb is not built: compression works on whole buckets"); }
        if (a->tp > 1 || a->pp > 1 || a->cp > 1 || a->ep > 1) {
            die("--compress is built for pure data parallelism: it does not combine with --tp, --pp, --cp or --ep");
        }
    }
    if (strcmp(a->error_feedback, "on") != 0 && strcmp(a->error_feedback, "off") != 0) {
        die("--error-feedback must be on or off, got '%s'", a->error_feedback);
    }
}

// Every check that needs no file, on flags already parsed: the trainer runs it once; the planner
// (llmc/planner/search.h) runs it on each candidate's flags, under die_trap_run
static inline void train_args_check(TrainArgs* a) {
    struct { const char* name; int value; } positive[] = {
        {"batch", a->batch}, {"seq", a->seq}, {"grad-accum", a->grad_accum}, {"steps", a->steps},
        {"eval-batches", a->eval_batches}};
    for (auto& p : positive) { if (p.value <= 0) { die("--%s must be positive, got %d", p.name, p.value); } }
    struct { const char* name; int value; } non_negative[] = {
        {"save-every", a->save_every}, {"save-state-every", a->save_state_every}, {"exit-after", a->exit_after}, {"layers", a->layers}, {"heads", a->heads}, {"channels", a->channels},
        {"max-seq", a->max_seq}, {"vocab", a->vocab}, {"warmup", a->warmup}, {"eval-every", a->eval_every},
        {"accuracy", a->accuracy}, {"sample-every", a->sample_every}, {"sample-len", a->sample_len},
        {"top-k", a->top_k}, {"threads", a->threads}};
    for (auto& p : non_negative) { if (p.value < 0) { die("--%s must be >= 0, got %d", p.name, p.value); } }
    // Upper bounds: beyond them a count overflows, a table or a pool of threads cannot be built, or
    // a wait never ends. (A shape the memory cannot hold is refused where the model is built,
    // before it is allocated: llmc/model/gpt2.h, gpt2_check_fits; the model's own limits are there too.)
    static const long cores = sysconf(_SC_NPROCESSORS_ONLN);   // once: the planner runs these checks per candidate
    struct { const char* name; double value, most; const char* why; } most[] = {
        {"threads", (double)a->threads, (double)std::max(256L, cores), "more threads than cores only wait for each other"},
        {"vocab", (double)a->vocab, 65536, "token ids are 16-bit in the shards"},
        {"batch", (double)a->batch, 1 << 20, "sequences per step"},
        {"seq", (double)a->seq, 1 << 20, "tokens per sequence"},
        {"moe-experts", (double)a->moe_experts, 1024, "DeepSeek-V3 routes among 256"},
        {"fp8-history", (double)a->fp8_history, 1024, "steps of amax history: Transformer Engine's default is 1024"},
        {"bucket-mb", (double)a->bucket_mb, 65536, "MiB of gradients per bucket"},
        {"comm-timeout", (double)a->comm_timeout, 1e6, "seconds; 0 waits forever"},
        {"devices", (double)a->devices, 1 << 20, "the largest clusters have about 10^5"},
        {"per-node", (double)a->per_node, 1024, "devices in one node"}};
    for (auto& m : most) {
        if (m.value > m.most) {
            auto num = [](double x) { char s[32]; snprintf(s, sizeof(s), x == floor(x) && fabs(x) < 1e15 ? "%.0f" : "%g", x); return std::string(s); };
            die("--%s %s is more than %s, the most this trainer serves (%s)", m.name, num(m.value).c_str(), num(m.most).c_str(), m.why);
        }
    }
    // --threads 0 takes OMP_NUM_THREADS (its first number: "8,2" is nested parallelism), bounded the same
    const char* omp = a->threads == 0 ? getenv("OMP_NUM_THREADS") : NULL;
    if (omp) {
        int n = 0;
        const char* end = omp;
        double most_threads = (double)std::max(256L, cores);
        if (!parse_count(omp, &n, &end) || (*end != 0 && *end != ',') || n < 1 || n > most_threads || (omp[0] == '0' && omp[1] != 0 && omp[1] != ',')) {
            die("OMP_NUM_THREADS='%.40s' (which --threads 0 takes) must be a whole number of threads from 1 to %.0f, as --threads", omp, most_threads);
        }
    }
    if ((double)a->batch * a->seq > (double)(1 << 27)) {
        die("--batch %d x --seq %d = %.0f tokens per step is more than 2^27 = 134217728 (eight times Llama 3 405B's 16M)",
            a->batch, a->seq, (double)a->batch * a->seq);
    }
    if (a->batch % a->grad_accum != 0) {
        die("--batch %d is not divisible by --grad-accum %d", a->batch, a->grad_accum);
    }
    if (!(a->init_std > 0)) { die("--init-std must be > 0"); }
    if (a->lr < 0 || a->weight_decay < 0 || a->clip < 0 || a->temperature < 0) {
        die("--lr, --weight-decay, --clip and --temperature must be >= 0");
    }
    if (a->beta1 < 0 || a->beta1 >= 1 || a->beta2 < 0 || a->beta2 >= 1) { die("--beta1 and --beta2 must be in [0, 1)"); }
    if (a->eps <= 0) { die("--eps must be positive, got %g", a->eps); }
    if (a->dp < 0) { die("--dp must be >= 0, got %d", a->dp); }
    if (a->tp < 1) { die("--tp must be >= 1, got %d", a->tp); }
    if (a->sp && a->tp < 2) { die("--sp splits the sequence over the tensor-parallel ranks: it needs --tp 2 or more"); }
    if (a->sp && a->seq % a->tp != 0) { die("--sp: the sequence length %d is not divisible by --tp %d", a->seq, a->tp); }
    if (a->zero < 0 || a->zero > 3) { die("--zero must be 0, 1, 2 or 3, got %d", a->zero); }
    if (a->pp < 1) { die("--pp must be >= 1, got %d", a->pp); }
    if (pp_schedule_parse(a->pp_schedule) < 0) {
        die("--pp-schedule must be gpipe, 1f1b, interleaved or zb-h1, got '%s'", a->pp_schedule);
    }
    if (a->pp_chunks < 0) { die("--pp-chunks must be >= 1, got %d", a->pp_chunks); }
    if (a->pp_chunks == 0) { a->pp_chunks = pp_schedule_parse(a->pp_schedule) == PP_INTERLEAVED ? 2 : 1; }
    if (a->pp_chunks > 1 && pp_schedule_parse(a->pp_schedule) != PP_INTERLEAVED) {
        die("--pp-chunks %d: several model chunks per stage are the interleaved schedule's (--pp-schedule interleaved)", a->pp_chunks);
    }
    if ((a->pp_split || a->pp_print || a->pp_chunks > 1 || strcmp(a->pp_schedule, "1f1b") != 0) && a->pp < 2) {
        die("--pp-schedule, --pp-chunks, --pp-split and --pp-print shape a pipeline: they need --pp 2 or more");
    }
    if (a->pp > 1) {
        std::string err = pp_schedule_check(pp_schedule_parse(a->pp_schedule), a->pp, a->grad_accum, a->pp_chunks);
        if (!err.empty()) { die("--pp %d --pp-schedule %s --grad-accum %d: %s", a->pp, a->pp_schedule, a->grad_accum, err.c_str()); }
        if (strcmp(a->task, "rlvr") == 0) {
            die("--task rlvr samples its rollouts with the whole model on each rank: it does not run with --pp (use --tp or --dp)");
        }
        if (a->sp && pp_schedule_parse(a->pp_schedule) == PP_ZBH1) {
            die("--pp-schedule zb-h1 with --sp is not built: the weight pass would gather the sequence-parallel inputs and "
                "output gradients again; use --tp without --sp, or another schedule");
        }
        if (a->zero == 3) {
            die("--zero 3 with --pp is not built: ZeRO-3 gathers a stage's weights per layer in its hooks, which the "
                "pipeline's passes over chunks and micro-batches would have to drive; use --zero 1 or 2");
        }
    }
    if (a->cp < 1) { die("--cp must be >= 1, got %d", a->cp); }
    if (strcmp(a->cp_algo, "ring") != 0 && strcmp(a->cp_algo, "allgather") != 0 && strcmp(a->cp_algo, "alltoall") != 0) {
        die("--cp-algo must be ring, allgather or alltoall, got '%s'", a->cp_algo);
    }
    if (strcmp(a->cp_split, "zigzag") != 0 && strcmp(a->cp_split, "plain") != 0) {
        die("--cp-split must be zigzag or plain, got '%s'", a->cp_split);
    }
    if (a->cp > 1) {
        int zigzag = strcmp(a->cp_split, "zigzag") == 0, parts = zigzag ? 2 * a->cp : a->cp;
        if (a->seq % parts != 0) {
            die("--cp %d --cp-split %s: the sequence length %d is not divisible by %d (%s)", a->cp, a->cp_split, a->seq, parts,
                zigzag ? "2 cp chunks, two per rank" : "cp blocks");
        }
        if (a->sp && (a->seq / a->cp) % a->tp != 0) {
            die("--sp with --cp %d: a rank's %d tokens per sequence are not divisible by --tp %d", a->cp, a->seq / a->cp, a->tp);
        }
        if (strcmp(a->task, "rlvr") == 0) {
            die("--task rlvr samples its rollouts with whole sequences on each rank: it does not run with --cp (use --tp or --dp)");
        }
    }
    if (a->moe_experts < 0 || a->moe_topk < 1 || a->moe_every < 1 || a->ep < 1) {
        die("--moe-experts must be >= 0, --moe-topk, --moe-every and --ep >= 1 (got %d, %d, %d, %d)", a->moe_experts, a->moe_topk,
            a->moe_every, a->ep);
    }
    if ((a->moe_capacity != -1.0f && !(a->moe_capacity > 0.0f)) || (a->moe_aux != -1.0f && !(a->moe_aux >= 0.0f))) {
        die("--moe-capacity must be > 0 and --moe-aux >= 0 (got %g, %g)", a->moe_capacity, a->moe_aux);
    }
    if (a->moe_experts > 0 && a->moe_topk > a->moe_experts) {
        die("--moe-topk %d: a token cannot go to more than the %d experts (--moe-experts)", a->moe_topk, a->moe_experts);
    }
    if (a->ep > 1 && a->moe_experts > 0 && a->moe_experts % a->ep != 0) {
        die("--ep %d does not divide the %d experts (--moe-experts): each expert-parallel rank holds E/ep of them", a->ep,
            a->moe_experts);
    }
    if (a->moe_experts > 0 || a->ep > 1) {   // (an MoE checkpoint is checked again once it is read)
        if (a->pp > 1) { die("--pp with a mixture of experts is not built: the aux loss of every stage would have to reach the step's loss"); }
        if (a->cp > 1) { die("--cp with a mixture of experts is not built: a routing group is a whole sequence, which cp splits"); }
        if (a->sp) { die("--sp with a mixture of experts is not built: the experts take whole tokens, not the sequence-parallel split"); }
    }
    if (a->ep > 1) {
        if (a->zero == 3) { die("--ep with --zero 3 is not built: ZeRO-3 shards the parameters it gathers per block; expert weights are ep's (use --zero 1 or 2)"); }
        if (strcmp(a->task, "rlvr") == 0) { die("--task rlvr samples with the whole model on each rank: it does not run with --ep (each rank holds E/ep experts)"); }
    }
    if (strcmp(a->dp_mode, "naive") != 0 && strcmp(a->dp_mode, "ddp") != 0 && strcmp(a->dp_mode, "ps") != 0) {
        die("--dp-mode must be naive, ddp or ps, got '%s'", a->dp_mode);
    }
    if (a->zero > 0 && strcmp(a->dp_mode, "ddp") != 0) {
        die("--zero %d shards the state of bucketed data parallelism: it does not combine with --dp-mode %s", a->zero, a->dp_mode);
    }
    if (a->shuffle && strcmp(a->task, "sft") != 0) { die("--shuffle reorders SFT examples: it needs --task sft, got --task %s", a->task); }
    if (a->offload && (a->zero < 1 || a->zero > 2)) { die("--offload needs --zero 1 or --zero 2 (ZeRO-Offload), got --zero %d", a->zero); }
    if (strcmp(a->comm_algo, "ring") != 0 && strcmp(a->comm_algo, "native") != 0 && strcmp(a->comm_algo, "auto") != 0) {
        die("--comm-algo must be ring, native or auto, got '%s'", a->comm_algo);
    }
    if (strcmp(a->comm_algo, "auto") == 0 && (strcmp(a->dp_mode, "ddp") != 0 || a->zero != 0 || strcmp(a->compress, "none") != 0)) {
        die("--comm-algo auto is built for --dp-mode ddp without --zero and --compress (their byte formulas assume the ring)");
    }
    if (a->comm_tuning && strcmp(a->comm_algo, "auto") != 0) { die("--comm-tuning is read by --comm-algo auto only"); }
    if (!(a->bucket_mb > 0)) { die("--bucket-mb must be positive, got %g", a->bucket_mb); }
    if (a->ps_servers < 1) { die("--ps-servers must be >= 1, got %d", a->ps_servers); }
    if (!(a->comm_timeout >= 0.0f)) { die("--comm-timeout must be >= 0 seconds, got %g", a->comm_timeout); }
    if (a->comm_timeout > 0.0f && a->comm_timeout < 1.0f) {   // the watchdogs trade marks every 0.25 s (llmc/train/guard.h)
        die("--comm-timeout %g s is shorter than the 1 s the watchdog needs to hear from the other ranks (0 = wait forever)",
            a->comm_timeout);
    }
    if (strcmp(a->on_nan, "stop") != 0 && strcmp(a->on_nan, "skip") != 0) { die("--on-nan must be stop or skip, got '%s'", a->on_nan); }
    if (a->precision && strcmp(a->precision, "fp32") != 0 && strcmp(a->precision, "bf16") != 0 && strcmp(a->precision, "fp16") != 0) {
        die("--precision must be fp32, bf16 or fp16, got '%s'", a->precision);
    }
    if (strcmp(a->loss_scale, "off") != 0 && strcmp(a->loss_scale, "dynamic") != 0) {
        char* end;
        double v = strtod(a->loss_scale, &end);
        if (*end != 0 || !(v > 0) || !isfinite(v)) { die("--loss-scale must be off, dynamic or a positive scale, got '%s'", a->loss_scale); }
    }
    if (!(a->loss_scale_init > 0) || !isfinite(a->loss_scale_init)) { die("--loss-scale-init must be a positive scale, got %g", a->loss_scale_init); }
    if (a->loss_scale_window < 1) { die("--loss-scale-window must be >= 1, got %d", a->loss_scale_window); }
    if (strcmp(a->fp8, "off") != 0 && strcmp(a->fp8, "current") != 0 && strcmp(a->fp8, "delayed") != 0) {
        die("--fp8 must be off, current or delayed, got '%s'", a->fp8);
    }
    if (a->fp8_history < 1) { die("--fp8-history must be >= 1, got %d", a->fp8_history); }
    if (strcmp(a->recompute, "none") != 0 && strcmp(a->recompute, "selective") != 0 && strcmp(a->recompute, "full") != 0) {
        die("--recompute must be none, selective or full, got '%s'", a->recompute);
    }
    if (strcmp(a->recompute, "none") != 0 && pp_schedule_parse(a->pp_schedule) == PP_ZBH1) {
        die("--recompute %s does not combine with --pp-schedule zb-h1: its split backward reads a layer's activations twice, "
            "apart (the input half, then the weight half), which one recomputed block cannot serve; use 1f1b", a->recompute);
    }
    if (a->hpz < 0) { die("--hpz must be >= 0 (ranks per group, 0 = off), got %d", a->hpz); }
    if (a->qgz != 0 && a->qgz != 4 && a->qgz != 8) { die("--qgz must be 0, 4 or 8 bits, got %d", a->qgz); }
    if ((a->qwz || a->hpz || a->qgz) && a->zero != 3) {
        die("--qwz, --hpz and --qgz are ZeRO++: they change ZeRO-3's collectives and need --zero 3 (got --zero %d)", a->zero);
    }
    train_args_check_ps(a);   // the parameter server's optimisations (above)
    if (a->plan && strcmp(a->plan, "all") != 0 && strcmp(a->plan, "this") != 0) { die("--plan must be all or this, got '%s'", a->plan); }
    if (a->mesh && strcmp(a->mesh, "auto") != 0) { die("--mesh must be auto (or left out: the mesh of --dp/--tp/--pp/--cp), got '%s'", a->mesh); }
    if (a->mesh && a->plan) {
        die("--mesh auto picks the mesh of a training run, and --plan %s trains nothing: drop --mesh (--plan all ranks every mesh)", a->plan);
    }
    if (a->mesh && (a->dp || a->tp > 1 || a->pp > 1 || a->cp > 1 || a->ep > 1 || a->sp || a->zero)) {
        die("--mesh auto chooses --dp, --tp, --pp, --cp, --ep, --sp and --zero itself: drop them");
    }
    if (a->machine && strcmp(a->machine, "h100") != 0 && strcmp(a->machine, "cpu") != 0) { die("--machine must be h100 or cpu, got '%s'", a->machine); }
    if (a->devices < 0 || a->per_node < 0 || a->plan_top < 1) { die("--devices and --per-node must be >= 0, --plan-top >= 1"); }
    if (a->device_mem != -1.0f && !(a->device_mem > 0)) { die("--device-mem must be a positive number of GiB, got %g", a->device_mem); }
    if (a->peak_tflops != -1.0f && !(a->peak_tflops > 0)) { die("--peak-tflops must be positive, got %g", a->peak_tflops); }
    if (a->efficiency != -1.0f && !(a->efficiency > 0 && a->efficiency <= 1)) { die("--efficiency must be in (0, 1], got %g", a->efficiency); }
    if (a->save_state_every > 0 && !a->save_state) { die("--save-state-every %d needs --save-state DIR", a->save_state_every); }
    if (a->exit_after > 0 && a->exit_after >= a->steps) { die("--exit-after %d must be below --steps %d", a->exit_after, a->steps); }
    if (a->exit_after > 0 && !a->save_state) { die("--exit-after %d stops the run to continue it later: add --save-state DIR", a->exit_after); }
    if (strcmp(a->task, "pretrain") != 0 && strcmp(a->task, "sft") != 0 && strcmp(a->task, "rlvr") != 0) {
        die("--task must be pretrain, sft or rlvr, got '%s'", a->task);
    }
    rl_mode_parse(a->rl_mode);
    reward_parse(a->reward);
    if (a->group < 1) { die("--group must be >= 1, got %d", a->group); }
    if (a->max_new < 1) { die("--max-new must be >= 1, got %d", a->max_new); }
    if (!(a->kl >= 0.0f)) { die("--kl must be >= 0, got %g", a->kl); }
    if (strcmp(a->task, "rlvr") == 0) {
        if (a->batch % a->group != 0) { die("--batch %d (rollouts per step) is not a multiple of --group %d", a->batch, a->group); }
        if (strcmp(a->rl_mode, "top1") == 0 && a->group != 1) {
            die("--rl-mode top1 takes the one greedy sample per prompt: use --group 1 (got %d)", a->group);
        }
        if (strcmp(a->rl_mode, "grpo") == 0 && a->group < 2) {
            die("--rl-mode grpo normalises within a group of samples: --group must be >= 2 (got %d)", a->group);
        }
        if (a->bench) { die("--bench times pre-training steps: drop --task rlvr"); }
    }
}

// Flags that only mean something beside another: given without it they would do nothing, so they
// are refused, as --sp without --tp and the pipeline flags without --pp are. Only the command
// line's own flags are judged (args_given; the planner's candidates are not), and input paths
// (--sft-train, --prompts, ...) are exempt: a launch script may name every dataset for any task.
static inline void train_args_check_unused(const TrainArgs* a) {
    int planner = a->plan || a->mesh, plan_all = a->plan && strcmp(a->plan, "all") == 0;
    int moe = a->moe_experts > 0 || a->load;   // (a dense --load: gpt2_config_from_args refuses the MoE flags)
    int rlvr = strcmp(a->task, "rlvr") == 0;
    struct { const char* flag; int used; const char* needs; } rules[] = {
        {"cp-algo", a->cp > 1 || planner, "--cp 2 or more"},
        {"cp-split", a->cp > 1 || planner, "--cp 2 or more"},
        {"error-feedback", strcmp(a->compress, "none") != 0, "--compress"},
        {"moe-topk", moe, "--moe-experts E"},
        {"moe-every", moe, "--moe-experts E"},
        {"moe-capacity", moe, "--moe-experts E"},
        {"moe-aux", moe, "--moe-experts E"},
        {"fp8-history", strcmp(a->fp8, "delayed") == 0, "--fp8 delayed"},
        {"loss-scale-init", strcmp(a->loss_scale, "dynamic") == 0, "--loss-scale dynamic"},
        {"loss-scale-window", strcmp(a->loss_scale, "dynamic") == 0, "--loss-scale dynamic"},
        {"devices", plan_all, "--plan all (a run's devices are the ranks mpirun starts)"},
        {"plan-top", plan_all, "--plan all"},
        {"per-node", planner, "the planner (--plan or --mesh auto)"},
        {"machine", planner, "the planner (--plan or --mesh auto)"},
        {"device-mem", planner, "the planner (--plan or --mesh auto)"},
        {"peak-tflops", planner, "the planner (--plan or --mesh auto)"},
        {"efficiency", planner, "the planner (--plan or --mesh auto)"},
        {"links", planner, "the planner (--plan or --mesh auto)"},
        {"ps-servers", strcmp(a->dp_mode, "ps") == 0, "--dp-mode ps"},
        {"bucket-mb", strcmp(a->dp_mode, "ddp") == 0, "--dp-mode ddp (buckets)"},
        {"save-every", a->save != NULL, "--save FILE"},
        {"group", rlvr, "--task rlvr"},
        {"max-new", rlvr, "--task rlvr"},
        {"rl-mode", rlvr, "--task rlvr"},
        {"reward", rlvr, "--task rlvr"},
        {"kl", rlvr, "--task rlvr"},
        {"metrics", rlvr, "--task rlvr (its per-step CSV)"},
    };
    for (auto& r : rules) {
        if (args_given(r.flag) && !r.used) { die("--%s does nothing without %s: add that, or drop --%s", r.flag, r.needs, r.flag); }
    }
    // --profile records every step but the first (llmc/profile.h): a run of fewer has nothing to show
    int last = a->exit_after > 0 && a->exit_after < a->steps ? a->exit_after : a->steps;
    if (a->profile && a->plan) { die("--profile times training steps, and --plan %s trains none: drop --profile", a->plan); }
    if (a->profile && last < 2 && !a->resume) {
        die("--profile records every step but the first (it warms the caches), and this run does %d: give --steps 2 or more", last);
    }
}

static inline void parse_train_args(int argc, char** argv, TrainArgs* a) {
    die_set_rank_from_launcher();   // a bad flag under mpirun: "error: [rank R] ..." before MPI starts
    train_args_read(argc, argv, a);
    train_args_check(a);
    train_args_check_unused(a);
}
