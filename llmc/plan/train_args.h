// The trainer's command line: every flag, its default and its help (llmc/plan/flag_parser.h is
// the parser). The checks of the values and of their combinations are in
// llmc/train/train_args_check.h (parse_train_args reads, then checks); the model, the mesh and the
// task check the rest where they are built, with a message that names the flag.
#pragma once

#include <string.h>
#include "flag_parser.h"
#include "../backend.h"

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
    float init_std;
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
    const char* comm_tuning;    // --comm-algo auto: the tuning file (collbench --autotune; NULL: the formulas choose)
    float bucket_mb;
    const char* trace;
    int profile;
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
    float comm_timeout;         // seconds without progress before a rank gives up (default 600; 0: wait forever)
    const char* on_nan;         // stop or skip
    const char* fault;          // fault injection for the tests: nan:STEP, hang:RANK:STEP, stall:RANK:STEP, kill:RANK:STEP (llmc/train/fault_injection.h)
    // precision and memory (doc/precision.md, doc/memory.md)
    const char* precision;      // fp32, bf16 or fp16 (NULL: the build's own: fp32 on the CPU, bf16 on CUDA)
    const char* loss_scale;     // off, dynamic, or a fixed scale (llmc/train/loss_scale.h)
    float loss_scale_init;      // dynamic: the first scale
    int loss_scale_window;      // dynamic: clean steps before the scale doubles
    const char* fp8;            // off, current or delayed scaling (llmc/model/fp8_linear.h)
    int fp8_history;            // delayed scaling: steps of amax history
    const char* recompute;      // none, selective or full (llmc/model/recompute.h)
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
    // the planner (llmc/planner/planner.h, doc/choosing-a-strategy.md)
    const char* plan;           // all: rank every mesh for --devices; this: the flags' own mesh, every rank's figures (NULL: train)
    const char* mesh;           // auto: the planner picks the mesh for the ranks mpirun started (NULL: the flags' mesh)
    int devices, per_node;      // --plan: devices, and devices per node (0: the machine's)
    const char* machine;        // h100 or cpu: memory, peak FLOP/s and links (NULL: the build's: cpu or h100)
    float device_mem, peak_tflops, efficiency;   // GiB, TFLOP/s per device, share of the peak reached (< 0: the machine's)
    const char* links;          // a file of measured alpha-beta values for the links (collbench), instead of the machine's
    int plan_top;               // --plan all: rows of the ranked table
    const char* plan_check;     // write every rank's measured memory and bytes per communicator here (the planner's test)
} TrainArgs;

// The defaults, then the command line through the table (--help prints the table and exits)
static inline void train_args_read(int argc, char** argv, TrainArgs* a) {
    *a = TrainArgs{};
    a->model = "tiny";
    a->train_data = "data/arithmetic/train_*.bin";
    a->val_data = "data/arithmetic/val_*.bin";
    a->tokenizer = "data/arithmetic/tokenizer.bin";
    // the default job (doc/training-tasks.md, "A default job that learns on every seed"): one
    // 11-token example per row, GPT-2 init scaled to the width (--init-std 0.1), 900 steps
    a->batch = 192; a->seq = 11; a->grad_accum = 1; a->steps = 900;
    a->lr = 4e-3f; a->lr_final_frac = 0.1f; a->warmup = 50;
    a->weight_decay = 0.1f; a->beta1 = 0.9f; a->beta2 = 0.95f; a->eps = 1e-8f; a->clip = 1.0f;
    a->init_std = 0.1f;
    a->seed = 1337;
    a->eval_every = 100; a->eval_batches = 8; a->accuracy = 500;
    a->sample_every = 200; a->sample_len = 48; a->top_k = 0; a->temperature = 1.0f;
    a->tp = 1;
    a->pp = 1; a->pp_schedule = "1f1b";
    a->cp = 1; a->cp_algo = "ring"; a->cp_split = "zigzag";
    a->moe_topk = 1; a->moe_every = 2; a->moe_capacity = -1.0f; a->moe_aux = -1.0f; a->ep = 1;   // -1: not given
    a->dp_mode = "ddp"; a->comm_algo = "ring"; a->bucket_mb = 1.0f; a->ps_servers = 1;
    a->task = "pretrain";
    a->sft_train = "data/arithmetic/sft_train_*.bin";
    a->sft_val = "data/arithmetic/sft_val_*.bin";
    a->prompts = "data/arithmetic/sft_train_*.bin";
    // --max-new 5: a default prompt (7 tokens) + 5 - 1 fits the default --seq 11 (an answer is 4)
    a->group = 8; a->max_new = 5; a->rl_mode = "grpo"; a->reward = "exact"; a->kl = 0.0f;
    a->on_nan = "stop";
    // A hung rank ends the job by default, naming the rank, instead of holding every device until the
    // scheduler's limit: 10 minutes, PyTorch's default for its NCCL collectives, far above the longest
    // time between two progress marks of our jobs (a block's pass, an evaluation, a save: seconds)
    a->comm_timeout = 600.0f;
    a->loss_scale = "off"; a->loss_scale_init = 65536.0f; a->loss_scale_window = 200;
    a->fp8 = "off"; a->fp8_history = 16; a->recompute = "none";
    a->comm_order = "fifo"; a->staleness_bound = -1; a->compress = "none"; a->error_feedback = "on";
    a->device_mem = -1.0f; a->peak_tflops = -1.0f; a->efficiency = -1.0f; a->plan_top = 12;
    ArgSpec specs[] = {
        {"model", ARG_STRING, &a->model, "model size: tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl"},
        {"load", ARG_IN_FILE, &a->load, "start from this checkpoint (llm.c format) instead of --model"},
        {"save", ARG_OUT_FILE, &a->save, "write the model here at the end (and every --save-every steps)"},
        {"save-every", ARG_INT, &a->save_every, "checkpoint interval in steps, 0 = only at the end"},
        {"layers", ARG_INT, &a->layers, "override the preset's number of layers"},
        {"heads", ARG_INT, &a->heads, "override the preset's number of heads"},
        {"channels", ARG_INT, &a->channels, "override the preset's channels"},
        {"max-seq", ARG_INT, &a->max_seq, "override the preset's maximum sequence length"},
        {"vocab", ARG_INT, &a->vocab, "override the preset's vocabulary size"},
        {"train-data", ARG_IN_GLOB, &a->train_data, "training token shards (glob)"},
        {"val-data", ARG_IN_GLOB, &a->val_data, "validation token shards (glob)"},
        {"tokenizer", ARG_IN_FILE, &a->tokenizer, "tokenizer file, to decode samples"},
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
        {"init-std", ARG_FLOAT, &a->init_std, "std of the initial weights (residual projections: / sqrt(2 layers)); GPT-2's is 0.02"},
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
        {"log", ARG_OUT_FILE, &a->log, "write 'step loss norm lr' per step at full precision to this file"},
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
        {"comm-algo", ARG_STRING, &a->comm_algo, "data-parallel collectives: ring (ours, bytes counted), native (MPI/NCCL) or auto (ours, per size)"},
        {"comm-tuning", ARG_IN_FILE, &a->comm_tuning, "--comm-algo auto: the tuning file collbench --autotune wrote (default: the formulas)"},
        {"trace", ARG_OUT_FILE, &a->trace, "write Chrome trace events (Perfetto) of compute and communication here"},
        {"profile", ARG_SWITCH, &a->profile, "after the run, a table per operation: time, FLOPs, bytes, against this machine's roofline"},
        {"task", ARG_STRING, &a->task, "pretrain (next token), sft (loss on answers only) or rlvr (RL with verifiable rewards)"},
        {"sft-train", ARG_IN_GLOB, &a->sft_train, "sft: training examples (token shards + .mask files, glob)"},
        {"sft-val", ARG_IN_GLOB, &a->sft_val, "sft: validation examples for the answer-token loss (glob)"},
        {"shuffle", ARG_SWITCH, &a->shuffle, "sft: read the packed training rows in an order drawn from --seed, not file order"},
        {"prompts", ARG_IN_GLOB, &a->prompts, "rlvr: (prompt, answer) examples, SFT format (glob)"},
        {"group", ARG_INT, &a->group, "rlvr: samples per prompt G (--batch = prompts x G per step)"},
        {"max-new", ARG_INT, &a->max_new, "rlvr: most tokens generated per completion"},
        {"rl-mode", ARG_STRING, &a->rl_mode, "rlvr advantages: grpo (group-normalised), baseline (running mean), top1 (greedy, A = r)"},
        {"reward", ARG_STRING, &a->reward, "rlvr reward: exact, format, or a sum such as exact+format"},
        {"kl", ARG_FLOAT, &a->kl, "rlvr: KL penalty coefficient against a frozen copy of the starting model, 0 = off"},
        {"metrics", ARG_OUT_FILE, &a->metrics, "rlvr: write per-step CSV (reward, accuracy, length, KL, held-out accuracy) here"},
        {"save-state", ARG_STATE_DIR, &a->save_state, "write the training state (every rank's shard + manifest) into this directory"},
        {"save-state-every", ARG_INT, &a->save_state_every, "training-state interval in steps, 0 = only at the end"},
        {"resume", ARG_IN_DIR, &a->resume, "continue the run saved in this state directory (any mesh: resharded)"},
        {"exit-after", ARG_INT, &a->exit_after, "stop after this step as a pre-empted job would (saving the state first), 0 = never"},
        {"comm-timeout", ARG_FLOAT, &a->comm_timeout, "seconds without progress before a rank ends the job naming the rank that hangs (PyTorch's NCCL default), 0 = forever"},
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
        {"ps-log", ARG_OUT_FILE, &a->ps_log, "with --ps-async or --staleness: write 'update seconds steps loss norm workers clocks staleness' per applied update to this file"},
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
        {"links", ARG_IN_FILE, &a->links, "planner: file of 'intra|inter ALPHA_US GB_PER_S' lines (measured with collbench) for the links"},
        {"plan-top", ARG_INT, &a->plan_top, "--plan all: rows of the ranked table"},
        {"plan-check", ARG_OUT_FILE, &a->plan_check, "write every rank's measured memory per category and bytes per communicator (of the second step) to this file"},
        {"fault", ARG_STRING, &a->fault, "tests only: inject a fault in step STEP: nan:STEP (NaN loss scale), hang:RANK:STEP (before it), stall:RANK:STEP (inside it), kill:RANK:STEP"},
    };
    args_parse(argc, argv, specs, (int)(sizeof(specs) / sizeof(specs[0])),
               "Trains GPT-2 (" BACKEND_NAME "). Default: the tiny model on the arithmetic dataset.");
}
