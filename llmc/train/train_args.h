// The trainer's command line: every flag, its default and its help, and the checks that need no
// file (llmc/train/flag_parser.h is the parser). The model, the mesh and the task each check the rest
// where they are built, with a message that names the flag.
#pragma once

#include <string.h>
#include "flag_parser.h"
#include "../backend.h"
#include "../tasks/rlvr_rollouts.h"
#include "../model/checkpoint.h"
#include "../parallel/pp_schedule.h"

typedef struct {
    const char* model;
    const char* load;
    const char* save;
    int save_every;
    int layers, heads, channels, max_seq, vocab;
    const char* train_data;
    const char* val_data;
    const char* tokenizer;
    int batch, seq, grad_accum, steps;
    float lr, lr_final_frac;
    int warmup;
    float weight_decay, beta1, beta2, eps, clip;
    int seed;
    int eval_every, eval_batches, accuracy;
    int sample_every, sample_len, top_k;
    float temperature;
    int threads;
    int bench;
    const char* log;
    // data parallelism
    int dp, zero, ps_servers, offload;
    // tensor and sequence parallelism
    int tp, sp;
    // pipeline parallelism
    int pp, pp_chunks, pp_print;
    int cp;
    // mixture of experts and expert parallelism
    int moe_experts, moe_topk, moe_every, ep;
    float moe_capacity, moe_aux;
    const char* cp_algo;        // ring, allgather or alltoall (llmc/parallel/cp.h)
    const char* cp_split;       // zigzag or plain
    const char* pp_schedule;
    const char* pp_split;
    const char* dp_mode;
    const char* comm_algo;
    float bucket_mb;
    const char* trace;
    // training tasks
    const char* task;
    const char* sft_train;
    const char* sft_val;
    int shuffle;
    const char* prompts;
    int group, max_new;
    const char* rl_mode;
    const char* reward;
    float kl;
    const char* metrics;
    // training state and failures (llmc/train/train_state.h, llmc/train/guard.h)
    const char* save_state;     // directory of the sharded training state
    int save_state_every;       // steps between saves (0: only at the end)
    const char* resume;         // continue the run saved in this directory
    int exit_after;             // stop after this step, as a pre-empted job would (0: never)
    float comm_timeout;         // seconds without progress before a rank gives up (0: wait forever)
    const char* on_nan;         // stop or skip
    const char* fault;          // fault injection for the tests: nan:STEP, hang:RANK:STEP, stall:RANK:STEP, kill:RANK:STEP (llmc/train/fault_injection.h)
    // precision and memory (doc/precision.md, doc/memory.md)
    const char* precision;      // fp32, bf16 or fp16 (NULL: the build's own: fp32 on the CPU, bf16 on CUDA)
    const char* loss_scale;     // off, dynamic, or a fixed scale (llmc/train/loss_scale.h)
    float loss_scale_init;      // dynamic: the first scale
    int loss_scale_window;      // dynamic: clean steps before the scale doubles
    const char* fp8;            // off, current or delayed scaling (llmc/model/fp8.h)
    int fp8_history;            // delayed scaling: steps of amax history
    const char* recompute;      // none, selective or full (llmc/model/gpt2.h)
    int qwz;                    // ZeRO++: block-wise int8 weight all-gather
    int hpz;                    // ZeRO++: secondary weight partition over groups of this many ranks (0: off)
    int qgz;                    // ZeRO++: gradient reduce-scatter quantised to 4 or 8 bits (0: off)
    // the parameter server's optimisations (doc/parameter-server.md)
    int comm_chunk_kb;          // layer-wise scheduling: push/pull and all-reduce in chunks of this many KiB (0: whole buffers)
    const char* comm_order;     // fifo or priority: the order the chunks go in (llmc/parallel/dp_priority.h)
    int ps_async;               // asynchronous parameter server: every push applied as it comes (llmc/parallel/dp_ps_async.h)
    const char* staleness;      // stale synchronous parallel: a worker at most S steps ahead of the slowest (NULL: off)
    int staleness_bound;        // --staleness parsed (-1: not given)
    const char* straggler;      // RANK:MS, random:MS or hold:RANK: a slow worker (llmc/train/straggler.h)
    const char* ps_log;         // the asynchronous server's log: one line per applied update (NULL: none)
    const char* compress;       // none, topk:R, randk:R, qsgd:B or sign (llmc/parallel/dp_compress.h)
    const char* error_feedback; // on or off: keep what compression did not send for the next step
    // the planner (llmc/planner/search.h, doc/choosing-a-strategy.md)
    const char* plan;           // all: rank every mesh for --devices; this: the flags' own mesh, every rank's figures (NULL: train)
    const char* mesh;           // auto: the planner picks the mesh for the ranks mpirun started (NULL: the flags' mesh)
    int devices, per_node;      // --plan: devices, and devices per node (0: the machine's)
    const char* machine;        // h100 or cpu: memory, peak FLOP/s and links (NULL: the build's: cpu or h100)
    float device_mem, peak_tflops, efficiency;   // GiB, TFLOP/s per device, share of the peak reached (< 0: the machine's)
    const char* links;          // a file of measured alpha-beta values for the links (collbench), instead of the machine's
    int plan_top;               // --plan all: rows of the ranked table
    const char* plan_check;     // write every rank's measured memory and bytes per communicator here (the planner's test)
} TrainArgs;

static inline void train_args_check_ps(TrainArgs* a);
static inline void train_args_check(TrainArgs* a);
static inline void train_args_check_unused(const TrainArgs* a);

static inline void parse_train_args(int argc, char** argv, TrainArgs* a) {
    die_set_rank_from_launcher();   // a bad flag under mpirun: "error: [rank R] ..." before MPI starts
    *a = TrainArgs{};
    a->model = "tiny";
    a->train_data = "data/arithmetic/train_*.bin";
    a->val_data = "data/arithmetic/val_*.bin";
    a->tokenizer = "data/arithmetic/tokenizer.bin";
    a->batch = 32; a->seq = 64; a->grad_accum = 1; a->steps = 1600;
    a->lr = 4e-3f; a->lr_final_frac = 0.1f; a->warmup = 50;
    a->weight_decay = 0.1f; a->beta1 = 0.9f; a->beta2 = 0.95f; a->eps = 1e-8f; a->clip = 1.0f;
    a->seed = 1337;
    a->eval_every = 200; a->eval_batches = 8; a->accuracy = 500;
    a->sample_every = 400; a->sample_len = 48; a->top_k = 0; a->temperature = 1.0f;
    a->tp = 1;
    a->pp = 1; a->pp_schedule = "1f1b";
    a->cp = 1; a->cp_algo = "ring"; a->cp_split = "zigzag";
    a->moe_topk = 1; a->moe_every = 2; a->moe_capacity = -1.0f; a->moe_aux = -1.0f; a->ep = 1;   // -1: not given
    a->dp_mode = "ddp"; a->comm_algo = "ring"; a->bucket_mb = 1.0f; a->ps_servers = 1;
    a->task = "pretrain";
    a->sft_train = "data/arithmetic/sft_train_*.bin";
    a->sft_val = "data/arithmetic/sft_val_*.bin";
    a->prompts = "data/arithmetic/sft_train_*.bin";
    a->group = 8; a->max_new = 8; a->rl_mode = "grpo"; a->reward = "exact"; a->kl = 0.0f;
    a->on_nan = "stop";
    a->loss_scale = "off"; a->loss_scale_init = 65536.0f; a->loss_scale_window = 200;
    a->fp8 = "off"; a->fp8_history = 16; a->recompute = "none";
    a->comm_order = "fifo"; a->staleness_bound = -1; a->compress = "none"; a->error_feedback = "on";
    a->device_mem = -1.0f; a->peak_tflops = -1.0f; a->efficiency = -1.0f; a->plan_top = 12;
    ArgSpec specs[] = {
        {"model", ARG_STRING, &a->model, "model size: tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl"},
        {"load", ARG_STRING, &a->load, "start from this checkpoint (llm.c format) instead of --model"},
        {"save", ARG_STRING, &a->save, "write the model here at the end (and every --save-every steps)"},
        {"save-every", ARG_INT, &a->save_every, "checkpoint interval in steps, 0 = only at the end"},
        {"layers", ARG_INT, &a->layers, "override the preset's number of layers"},
        {"heads", ARG_INT, &a->heads, "override the preset's number of heads"},
        {"channels", ARG_INT, &a->channels, "override the preset's channels"},
        {"max-seq", ARG_INT, &a->max_seq, "override the preset's maximum sequence length"},
        {"vocab", ARG_INT, &a->vocab, "override the preset's vocabulary size"},
        {"train-data", ARG_STRING, &a->train_data, "training token shards (glob)"},
        {"val-data", ARG_STRING, &a->val_data, "validation token shards (glob)"},
        {"tokenizer", ARG_STRING, &a->tokenizer, "tokenizer file, to decode samples"},
        {"batch", ARG_INT, &a->batch, "global batch: sequences per optimizer step, over all ranks and micro-steps"},
        {"seq", ARG_INT, &a->seq, "sequence length T"},
        {"grad-accum", ARG_INT, &a->grad_accum, "micro-steps per optimizer step"},
        {"steps", ARG_INT, &a->steps, "optimizer steps"},
        {"lr", ARG_FLOAT, &a->lr, "peak learning rate"},
        {"lr-final-frac", ARG_FLOAT, &a->lr_final_frac, "cosine decay ends at lr * this"},
        {"warmup", ARG_INT, &a->warmup, "linear warmup steps"},
        {"weight-decay", ARG_FLOAT, &a->weight_decay, "AdamW weight decay (2-D weights only)"},
        {"beta1", ARG_FLOAT, &a->beta1, "AdamW beta1"},
        {"beta2", ARG_FLOAT, &a->beta2, "AdamW beta2"},
        {"eps", ARG_FLOAT, &a->eps, "AdamW epsilon"},
        {"clip", ARG_FLOAT, &a->clip, "clip the global gradient norm to this, 0 = off"},
        {"seed", ARG_INT, &a->seed, "seed of the initial weights and of sampling"},
        {"eval-every", ARG_INT, &a->eval_every, "validation interval in steps, 0 = only at the end"},
        {"eval-batches", ARG_INT, &a->eval_batches, "validation batches per evaluation"},
        {"accuracy", ARG_INT, &a->accuracy, "held-out arithmetic examples for exact-match accuracy, 0 = off"},
        {"sample-every", ARG_INT, &a->sample_every, "sample text every N steps, 0 = never"},
        {"sample-len", ARG_INT, &a->sample_len, "tokens per sample"},
        {"top-k", ARG_INT, &a->top_k, "sample from the k most likely tokens, 0 = all, 1 = greedy"},
        {"temperature", ARG_FLOAT, &a->temperature, "sampling temperature, 0 = greedy"},
        {"threads", ARG_INT, &a->threads, "CPU threads (OpenMP), 0 = OMP_NUM_THREADS or all cores"},
        {"bench", ARG_SWITCH, &a->bench, "benchmark: random tokens, no data files, timing summary"},
        {"log", ARG_STRING, &a->log, "write 'step loss norm lr' per step at full precision to this file"},
        {"dp", ARG_INT, &a->dp, "data-parallel ranks, 0 = all the ranks mpirun started"},
        {"tp", ARG_INT, &a->tp, "tensor-parallel ranks (Megatron): the matrices, heads and vocabulary split tp ways"},
        {"sp", ARG_SWITCH, &a->sp, "sequence parallelism with --tp: layernorms and residuals on T/tp tokens per rank"},
        {"pp", ARG_INT, &a->pp, "pipeline-parallel stages: the layers split over pp ranks (micro-batches = --grad-accum)"},
        {"pp-schedule", ARG_STRING, &a->pp_schedule, "pipeline schedule: gpipe, 1f1b, interleaved or zb-h1"},
        {"pp-chunks", ARG_INT, &a->pp_chunks, "interleaved: model chunks v per stage (default 2)"},
        {"pp-split", ARG_STRING, &a->pp_split, "layers per stage, comma-separated (e.g. 2,4), instead of the even split"},
        {"cp", ARG_INT, &a->cp, "context-parallel ranks: each holds T/cp tokens of every sequence (ring attention)"},
        {"cp-algo", ARG_STRING, &a->cp_algo, "context-parallel attention: ring, allgather (Llama 3) or alltoall (Ulysses)"},
        {"cp-split", ARG_STRING, &a->cp_split, "which tokens a cp rank holds: zigzag (chunks r and 2cp-1-r) or plain"},
        {"moe-experts", ARG_INT, &a->moe_experts, "mixture of experts: E expert MLPs in every --moe-every-th block, 0 = dense"},
        {"moe-topk", ARG_INT, &a->moe_topk, "experts per token k (1 = Switch Transformer)"},
        {"moe-every", ARG_INT, &a->moe_every, "every N-th block is an MoE block (blocks N-1, 2N-1, ...)"},
        {"moe-capacity", ARG_FLOAT, &a->moe_capacity, "capacity factor: an expert takes ceil(factor T k / E) tokens of a sequence (1.25, or --load's)"},
        {"moe-aux", ARG_FLOAT, &a->moe_aux, "coefficient of the Switch load-balancing loss, 0 = off (0.01, or --load's)"},
        {"ep", ARG_INT, &a->ep, "expert-parallel ranks: the experts split over ep of the data-parallel ranks"},
        {"pp-print", ARG_SWITCH, &a->pp_print, "print the pipeline schedule as a timeline (F/B/W by micro-batch, one row per stage)"},
        {"dp-mode", ARG_STRING, &a->dp_mode, "naive (one all-reduce), ddp (bucketed, overlapped), ps (parameter server)"},
        {"zero", ARG_INT, &a->zero, "ZeRO stage 0-3 (1: optimizer state, 2: + gradients, 3: + parameters sharded)"},
        {"bucket-mb", ARG_FLOAT, &a->bucket_mb, "gradient bucket size in MiB (ddp, ZeRO-1/2)"},
        {"ps-servers", ARG_INT, &a->ps_servers, "parameter-server mode: ranks 0..S-1 are servers"},
        {"offload", ARG_SWITCH, &a->offload, "ZeRO-Offload: optimizer state and update in host memory (--zero 1 or 2)"},
        {"comm-algo", ARG_STRING, &a->comm_algo, "data-parallel collectives: ring (ours, bytes counted) or native (MPI/NCCL)"},
        {"trace", ARG_STRING, &a->trace, "write Chrome trace events (Perfetto) of compute and communication here"},
        {"task", ARG_STRING, &a->task, "pretrain (next token), sft (loss on answers only) or rlvr (RL with verifiable rewards)"},
        {"sft-train", ARG_STRING, &a->sft_train, "sft: training examples (token shards + .mask files, glob)"},
        {"sft-val", ARG_STRING, &a->sft_val, "sft: validation examples for the answer-token loss (glob)"},
        {"shuffle", ARG_SWITCH, &a->shuffle, "sft: read the packed training rows in an order drawn from --seed, not file order"},
        {"prompts", ARG_STRING, &a->prompts, "rlvr: (prompt, answer) examples, SFT format (glob)"},
        {"group", ARG_INT, &a->group, "rlvr: samples per prompt G (--batch = prompts x G per step)"},
        {"max-new", ARG_INT, &a->max_new, "rlvr: most tokens generated per completion"},
        {"rl-mode", ARG_STRING, &a->rl_mode, "rlvr advantages: grpo (group-normalised), baseline (running mean), top1 (greedy, A = r)"},
        {"reward", ARG_STRING, &a->reward, "rlvr reward: exact, format, or a sum such as exact+format"},
        {"kl", ARG_FLOAT, &a->kl, "rlvr: KL penalty coefficient against a frozen copy of the starting model, 0 = off"},
        {"metrics", ARG_STRING, &a->metrics, "rlvr: write per-step CSV (reward, accuracy, length, KL, held-out accuracy) here"},
        {"save-state", ARG_STRING, &a->save_state, "write the training state (every rank's shard + manifest) into this directory"},
        {"save-state-every", ARG_INT, &a->save_state_every, "training-state interval in steps, 0 = only at the end"},
        {"resume", ARG_STRING, &a->resume, "continue the run saved in this state directory (any mesh: resharded)"},
        {"exit-after", ARG_INT, &a->exit_after, "stop after this step as a pre-empted job would (saving the state first), 0 = never"},
        {"comm-timeout", ARG_FLOAT, &a->comm_timeout, "seconds a rank waits for another before it ends the job, 0 = forever"},
        {"on-nan", ARG_STRING, &a->on_nan, "a non-finite loss or gradient norm: stop (name the step and tensor) or skip the update"},
        {"precision", ARG_STRING, &a->precision, "number format of parameters, activations and gradients: fp32, bf16 or fp16 (CPU: all three, simulated; CUDA: the build's)"},
        {"loss-scale", ARG_STRING, &a->loss_scale, "loss scaling: off, dynamic (halve on overflow, double after --loss-scale-window clean steps) or a fixed scale"},
        {"loss-scale-init", ARG_FLOAT, &a->loss_scale_init, "dynamic loss scaling: the first scale"},
        {"loss-scale-window", ARG_INT, &a->loss_scale_window, "dynamic loss scaling: clean steps before the scale doubles"},
        {"fp8", ARG_STRING, &a->fp8, "FP8 matmuls (simulated): off, current (per-tensor scale from this tensor) or delayed (from an amax history)"},
        {"fp8-history", ARG_INT, &a->fp8_history, "--fp8 delayed: steps of amax history the scale is taken from"},
        {"recompute", ARG_STRING, &a->recompute, "activation recomputation: none, selective (attention probabilities, GELU output from its kept input) or full (each block from its input)"},
        {"qwz", ARG_SWITCH, &a->qwz, "ZeRO++ qwZ (with --zero 3): weights all-gathered as block-wise int8 with scales"},
        {"hpz", ARG_INT, &a->hpz, "ZeRO++ hpZ (with --zero 3): a secondary weight partition within groups of N ranks (a node), 0 = off"},
        {"comm-chunk-kb", ARG_INT, &a->comm_chunk_kb, "layer-wise scheduling (--dp-mode ps or ddp): send gradients and parameters in chunks of K KiB, layer by layer (0 = whole buffers)"},
        {"comm-order", ARG_STRING, &a->comm_order, "with --comm-chunk-kb: fifo (as they become ready) or priority (the first layers first, P3)"},
        {"ps-async", ARG_SWITCH, &a->ps_async, "asynchronous parameter server (--dp-mode ps): no barrier, the server applies every push as it comes"},
        {"staleness", ARG_STRING, &a->staleness, "stale synchronous parameter server (--dp-mode ps): a worker runs at most S steps ahead of the slowest (0 = synchronous)"},
        {"ps-log", ARG_STRING, &a->ps_log, "with --ps-async or --staleness: write 'update seconds steps loss norm workers clocks staleness' per applied update to this file"},
        {"straggler", ARG_STRING, &a->straggler, "slow a worker down: RANK:MS (MS ms more every step), random:MS (every step one random rank, seeded), or hold:RANK (the asynchronous server serves RANK last: the same schedule every run)"},
        {"compress", ARG_STRING, &a->compress, "gradient compression (--dp-mode naive, ddp or ps): none, topk:R, randk:R (R in (0,1]), qsgd:B (B in 1..16 bits) or sign"},
        {"error-feedback", ARG_STRING, &a->error_feedback, "with --compress: on (keep what was not sent for the next step) or off"},
        {"qgz", ARG_INT, &a->qgz, "ZeRO++ qgZ (with --zero 3): gradients reduce-scattered as 4- or 8-bit blocks over all-to-all, 0 = off"},
        {"plan", ARG_STRING, &a->plan, "the planner, no training: all (every mesh for --devices, ranked) or this (the flags' mesh: every rank's memory and bytes)"},
        {"mesh", ARG_STRING, &a->mesh, "auto: the planner picks dp, tp, pp, cp, ZeRO, schedule, recomputation and micro-batches for the ranks started"},
        {"devices", ARG_INT, &a->devices, "--plan all: the number of devices to plan for (default 8)"},
        {"per-node", ARG_INT, &a->per_node, "planner: devices per node (0: the machine's, 8 for h100)"},
        {"machine", ARG_STRING, &a->machine, "planner: h100 (SXM nodes: 80 GiB, 989 TFLOP/s bf16, NVLink + 400 Gb/s) or cpu (this machine)"},
        {"device-mem", ARG_FLOAT, &a->device_mem, "planner: memory per device in GiB (default: the machine's)"},
        {"peak-tflops", ARG_FLOAT, &a->peak_tflops, "planner: peak TFLOP/s per device (default: the machine's)"},
        {"efficiency", ARG_FLOAT, &a->efficiency, "planner: the share of the peak the kernels reach (default: the machine's; calibrate from one run)"},
        {"links", ARG_STRING, &a->links, "planner: file of 'intra|inter ALPHA_US GB_PER_S' lines (measured with collbench) for the links"},
        {"plan-top", ARG_INT, &a->plan_top, "--plan all: rows of the ranked table"},
        {"plan-check", ARG_STRING, &a->plan_check, "write every rank's measured memory per category and bytes per communicator (of the second step) to this file"},
        {"fault", ARG_STRING, &a->fault, "tests only: inject a fault in step STEP: nan:STEP (NaN loss scale), hang:RANK:STEP (before it), stall:RANK:STEP (inside it), kill:RANK:STEP"},
    };
    args_parse(argc, argv, specs, (int)(sizeof(specs) / sizeof(specs[0])),
               "Trains GPT-2 (" BACKEND_NAME "). Default: the tiny model on the arithmetic dataset.");
    train_args_check(a);
    train_args_check_unused(a);
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
    if ((double)a->batch * a->seq > (double)(1 << 27)) {
        die("--batch %d x --seq %d = %.0f tokens per step is more than 2^27 = 134217728 (eight times Llama 3 405B's 16M)",
            a->batch, a->seq, (double)a->batch * a->seq);
    }
    if (a->batch % a->grad_accum != 0) {
        die("--batch %d is not divisible by --grad-accum %d", a->batch, a->grad_accum);
    }
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
    if (strcmp(a->comm_algo, "ring") != 0 && strcmp(a->comm_algo, "native") != 0) {
        die("--comm-algo must be ring or native, got '%s'", a->comm_algo);
    }
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
    train_args_check_ps(a);   // the parameter server's optimisations (below)
    if (a->plan && strcmp(a->plan, "all") != 0 && strcmp(a->plan, "this") != 0) { die("--plan must be all or this, got '%s'", a->plan); }
    if (a->mesh && strcmp(a->mesh, "auto") != 0) { die("--mesh must be auto (or left out: the mesh of --dp/--tp/--pp/--cp), got '%s'", a->mesh); }
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

// The model the flags ask for: a checkpoint (--load), or a preset (--model) with overrides,
// initialised from --seed. `place` says which shard of it this rank holds (the plan's
// plan_place: the whole model until tensor or pipeline parallelism split it); it is asked once
// the shape is known.
typedef GPT2Place (*PlaceFn)(void* ctx, const GPT2Config* cfg);

// The model's shape the flags ask for (every check of them): a checkpoint's (--load; *version
// its format) or a preset's with overrides. The planner (llmc/planner/search.h) needs no more.
static inline GPT2Config gpt2_config_from_args(const TrainArgs* a, int* version) {
    if (a->load) {
        if (a->layers || a->heads || a->channels || a->max_seq || a->vocab) {
            die("--load takes the model's shape from the checkpoint: drop --layers/--heads/--channels/--max-seq/--vocab");
        }
        GPT2Config c = gpt2_read_checkpoint_config(a->load, version);
        const char* moe_flags[] = {"moe-topk", "moe-every", "moe-capacity", "moe-aux"};
        for (const char* f : moe_flags) {
            if (!gpt2_is_moe(&c) && args_given(f)) {
                die("--load '%s' is a dense checkpoint (version %d): --%s does nothing; drop it", a->load, *version, f);
            }
        }
        if (a->moe_experts > 0 && !gpt2_is_moe(&c)) {
            die("--load '%s' is a dense checkpoint (version %d): --moe-experts %d does not apply; drop it, or start a new MoE "
                "model with --model", a->load, *version, a->moe_experts);
        }
        if (a->moe_experts > 0 && (a->moe_experts != c.num_experts || a->moe_topk != c.moe_topk || a->moe_every != c.moe_every)) {
            die("--load '%s' holds %d experts, top-%d, every %d blocks: --moe-experts %d --moe-topk %d --moe-every %d do not "
                "match (drop them to take the file's)", a->load, c.num_experts, c.moe_topk, c.moe_every, a->moe_experts,
                a->moe_topk, a->moe_every);
        }
        if (gpt2_is_moe(&c) && a->moe_capacity > 0.0f) { c.moe_capacity = a->moe_capacity; }   // given: the run's setting
        if (gpt2_is_moe(&c) && a->moe_aux >= 0.0f) { c.moe_aux = a->moe_aux; }
        if (a->ep > 1 && !gpt2_is_moe(&c)) { die("--ep %d: '%s' is a dense model, it has no experts to split", a->ep, a->load); }
        if (a->ep > 1 && c.num_experts % a->ep != 0) {
            die("--ep %d does not divide the %d experts of '%s'", a->ep, c.num_experts, a->load);
        }
        return c;
    }
    *version = 0;
    GPT2Config cfg;
    if (!gpt2_config_preset(a->model, &cfg)) {
        die("unknown --model '%s' (expected tiny, gpt2, gpt2-medium, gpt2-large or gpt2-xl)", a->model);
    }
    if (a->layers) { cfg.num_layers = a->layers; }
    if (a->heads) { cfg.num_heads = a->heads; }
    if (a->channels) { cfg.channels = a->channels; }
    if (a->max_seq) { cfg.max_seq_len = a->max_seq; }
    if (a->vocab) { cfg.vocab_size = a->vocab; cfg.padded_vocab_size = padded_vocab(a->vocab); }
    if (a->moe_experts > 0) {
        cfg.num_experts = a->moe_experts;
        cfg.moe_topk = a->moe_topk;
        cfg.moe_every = a->moe_every;
        cfg.moe_capacity = a->moe_capacity > 0.0f ? a->moe_capacity : 1.25f;
        cfg.moe_aux = a->moe_aux >= 0.0f ? a->moe_aux : 0.01f;
    } else if (a->ep > 1) {
        die("--ep %d splits the experts of a mixture of experts: add --moe-experts E", a->ep);
    }
    gpt2_check_config(&cfg);
    return cfg;
}

static inline void gpt2_from_args(GPT2* model, const TrainArgs* a, PlaceFn place, void* ctx) {
    int version;
    GPT2Config cfg = gpt2_config_from_args(a, &version);
    GPT2Place p = place(ctx, &cfg);
    if (a->load) {
        gpt2_load_checkpoint_config(model, a->load, &p, &cfg, version);
        return;
    }
    gpt2_build_shard(model, &cfg, &p);
    gpt2_init_random(model, (uint64_t)a->seed);
}
