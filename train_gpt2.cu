// The trainer: args -> model -> data -> training loop. Plain host code for both backends:
//   g++ -x c++ -DLLMC_CPU  -> train_gpt2cpu  (fp32 reference kernels, OpenMP)
//   nvcc                   -> train_gpt2cu   (CUDA kernels, bf16 mixed precision)
// One optimizer step: zero the gradients; for each of grad_accum micro-steps, forward,
// cross-entropy, backward (gradients add up); then clip and AdamW-update.
// --task picks where a step's tokens and loss weights come from (doc/training-tasks.md):
//   pretrain  [X] -> model -> [X_log]: cross-entropy on every next token (llmc/data.h)
//   sft       [X, Y] -> model -> [X_log, Y_log]: cross-entropy on the answer tokens Y only
//             (packed (prompt, answer) examples with a loss mask, llmc/sft.h)
//   rlvr      [X] -> model -> sampled Y -> reward r: policy gradient -A(r) * log p(Y), the
//             completions generated first with a KV cache (llmc/rlvr.h, llmc/generate.h)
// Under mpirun (MPI build) the ranks form a mesh (llmc/parallel/mesh.h) and train data-parallel
// in the mode --dp-mode / --zero choose (llmc/parallel/dp.h); rank 0 prints and saves.
#include "llmc/common.h"
#include "llmc/args.h"
#include "llmc/gpt2.h"
#include "llmc/checkpoint.h"
#include "llmc/data.h"
#include "llmc/tokenizer.h"
#include "llmc/schedule.h"
#include "llmc/sampler.h"
#include "llmc/eval.h"
#include "llmc/sft.h"
#include "llmc/generate.h"
#include "llmc/rlvr.h"
#include "llmc/log.h"
#include "llmc/trace.h"
#ifdef USE_MPI
#include "llmc/parallel/dp.h"
#endif

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
} TrainArgs;

static void parse_train_args(int argc, char** argv, TrainArgs* a) {
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
    a->dp_mode = "ddp"; a->comm_algo = "ring"; a->bucket_mb = 1.0f; a->ps_servers = 1;
    a->task = "pretrain";
    a->sft_train = "data/arithmetic/sft_train_*.bin";
    a->sft_val = "data/arithmetic/sft_val_*.bin";
    a->prompts = "data/arithmetic/sft_train_*.bin";
    a->group = 8; a->max_new = 8; a->rl_mode = "grpo"; a->reward = "exact"; a->kl = 0.0f;
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
    };
    args_parse(argc, argv, specs, (int)(sizeof(specs) / sizeof(specs[0])),
               "Trains GPT-2 (" BACKEND_NAME "). Default: the tiny model on the arithmetic dataset.");
    // checks that need no file
    struct { const char* name; int value; } positive[] = {
        {"batch", a->batch}, {"seq", a->seq}, {"grad-accum", a->grad_accum}, {"steps", a->steps},
        {"eval-batches", a->eval_batches}};
    for (auto& p : positive) { if (p.value <= 0) { die("--%s must be positive, got %d", p.name, p.value); } }
    struct { const char* name; int value; } non_negative[] = {
        {"save-every", a->save_every}, {"layers", a->layers}, {"heads", a->heads}, {"channels", a->channels},
        {"max-seq", a->max_seq}, {"vocab", a->vocab}, {"warmup", a->warmup}, {"eval-every", a->eval_every},
        {"accuracy", a->accuracy}, {"sample-every", a->sample_every}, {"sample-len", a->sample_len},
        {"top-k", a->top_k}, {"threads", a->threads}};
    for (auto& p : non_negative) { if (p.value < 0) { die("--%s must be >= 0, got %d", p.name, p.value); } }
    if (a->batch % a->grad_accum != 0) {
        die("--batch %d is not divisible by --grad-accum %d", a->batch, a->grad_accum);
    }
    if (a->lr < 0 || a->weight_decay < 0 || a->clip < 0 || a->temperature < 0) {
        die("--lr, --weight-decay, --clip and --temperature must be >= 0");
    }
    if (a->beta1 < 0 || a->beta1 >= 1 || a->beta2 < 0 || a->beta2 >= 1) { die("--beta1 and --beta2 must be in [0, 1)"); }
    if (a->eps <= 0) { die("--eps must be positive, got %g", a->eps); }
    if (a->dp < 0) { die("--dp must be >= 0, got %d", a->dp); }
    if (a->zero < 0 || a->zero > 3) { die("--zero must be 0, 1, 2 or 3, got %d", a->zero); }
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

static float validation_loss(GPT2* model, DataLoader* val, int batches) {
    dataloader_reset(val);
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        dataloader_next_batch(val);
        gpt2_forward(model, val->inputs, val->B, val->T);
        sum += gpt2_classifier(model, val->targets, NULL, 0.0f, 0) / ((double)val->B * val->T);
    }
    return (float)(sum / batches);
}

// SFT: the answer-token loss on the validation examples: returns the sum of CE over answer
// tokens and (in *count) their number, for the caller to combine over ranks.
static double sft_validation_loss(GPT2* model, SFTLoader* val, int batches, double* count) {
    sft_loader_reset(val);
    double sum = 0.0;
    *count = 0.0;
    for (int i = 0; i < batches; i++) {
        sft_loader_next_batch(val);
        gpt2_forward(model, val->inputs, val->B, val->T);
        sum += gpt2_classifier(model, val->targets, val->weights, 0.0f, 0);
        for (int j = 0; j < val->B * val->T; j++) { *count += val->weights[j]; }
    }
    return sum;
}

// One sample of `len` tokens from end-of-text, decoded to text. Unlike generate() it does not
// stop at end-of-text or a newline (a sample shows several documents), so it drives the KV
// cache itself: one token per call, each attending over the keys and values cached so far.
static void print_sample(GPT2* model, const Tokenizer* tok, int eot, int len, int top_k, float temperature, Rng* rng) {
    std::vector<float> logits(model->config.padded_vocab_size);
    len = std::min(len, model->config.max_seq_len - 1);
    if (len <= 0) { return; }
    KVCache kv;
    kvcache_init(&kv, model, 1, len, 1);   // one row; the last sampled token is never fed back
    int token = eot, row = 0;
    printf("sample: ");
    for (int pos = 0; pos < len; pos++) {
        gpt2_forward_cached(model, &kv, &token, &row, &pos, 1);
        kvcache_logits_to_host(model, &kv, 0, logits.data());
        token = sample_top_k(logits.data(), model->config.vocab_size, top_k, temperature, rng);
        if (tok) { tokenizer_print(tok, token); } else { printf("%d ", token); }
    }
    printf("\n---\n");
    kvcache_free(&kv);
}

// sum of a value over the data-parallel ranks (a no-op on one rank)
#ifdef USE_MPI
static DataParallel* g_dp = NULL;
static double dp_sum(double x) {
    if (g_dp) { MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, g_dp->comm->mpi); }
    return x;
}
// all-gather n floats from every data-parallel rank, in rank order (a copy on one rank)
static void dp_gather_floats(const float* mine, int n, float* all, void* ctx) {
    (void)ctx;
    if (g_dp) { MPI_Allgather(mine, n, MPI_FLOAT, all, n, MPI_FLOAT, g_dp->comm->mpi); return; }
    memcpy(all, mine, (size_t)n * sizeof(float));
}
#else
static double dp_sum(double x) { return x; }
static void dp_gather_floats(const float* mine, int n, float* all, void* ctx) {
    (void)ctx;
    memcpy(all, mine, (size_t)n * sizeof(float));
}
#endif

enum { TASK_PRETRAIN, TASK_SFT, TASK_RLVR };

int main(int argc, char** argv) {
    int rank = 0, world = 1;
    setvbuf(stdout, NULL, _IOLBF, 0);   // line-buffered, also when piped into a log file
    TrainArgs args;
    parse_train_args(argc, argv, &args);
#ifdef USE_MPI
    // the data-parallel communication thread calls MPI while the main thread computes; the two
    // never call MPI at the same time, which MPI_THREAD_SERIALIZED allows
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    if (provided < MPI_THREAD_SERIALIZED) { die("this MPI library does not support MPI_THREAD_SERIALIZED"); }
    Comm world_comm = comm_init_world(&argc, &argv);
    rank = world_comm.rank;
    world = world_comm.size;
    int use_dp = world > 1 || args.dp > 1 || args.zero > 0 || strcmp(args.dp_mode, "ddp") != 0 || args.offload;
    // one GPU per rank of a node (CUDA build): the node-local rank picks it
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int local_rank = 0;
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_free(&node);
    backend_init(local_rank);
    Mesh mesh;
    if (use_dp) { mesh = mesh_init(&world_comm, args.dp ? args.dp : world, 1, 1, 1); }
#ifdef LLMC_CUDA_COMM
    // the data-parallel collectives move device buffers: NCCL, or host-staged MPI when ranks share a GPU
    if (use_dp) { comm_enable_device(&mesh.dim[MESH_DP], 0); }
#endif
    if (rank != 0) {   // one voice: rank 0 prints; errors still reach stderr from every rank
        if (!freopen("/dev/null", "w", stdout)) { die("cannot silence stdout on rank %d", rank); }
    }
#else
    if (args.dp > 1 || args.zero > 0 || strcmp(args.dp_mode, "ddp") != 0 || args.offload) {
        die("data parallelism (--dp, --dp-mode, --zero, --offload) needs the MPI build: apt-get install libopenmpi-dev, then make");
    }
    int use_dp = 0;
    backend_init(0);
#endif
    int ndp = use_dp ? world : 1;
#ifdef _OPENMP
    if (args.threads > 0) { omp_set_num_threads(args.threads); }
#endif

    // ---- model
    GPT2 model;
    if (args.load) {
        if (args.layers || args.heads || args.channels || args.max_seq || args.vocab) {
            die("--load takes the model's shape from the checkpoint: drop --layers/--heads/--channels/--max-seq/--vocab");
        }
        gpt2_load_checkpoint(&model, args.load);
    } else {
        GPT2Config cfg;
        if (!gpt2_config_preset(args.model, &cfg)) {
            die("unknown --model '%s' (expected tiny, gpt2, gpt2-medium, gpt2-large or gpt2-xl)", args.model);
        }
        if (args.layers) { cfg.num_layers = args.layers; }
        if (args.heads) { cfg.num_heads = args.heads; }
        if (args.channels) { cfg.channels = args.channels; }
        if (args.max_seq) { cfg.max_seq_len = args.max_seq; }
        if (args.vocab) { cfg.vocab_size = args.vocab; cfg.padded_vocab_size = padded_vocab(args.vocab); }
        gpt2_build(&model, &cfg);
        gpt2_init_random(&model, (uint64_t)args.seed);
    }
    const GPT2Config* cfg = &model.config;
    if (args.seq > cfg->max_seq_len) {
        die("--seq %d exceeds the model's maximum sequence length %d", args.seq, cfg->max_seq_len);
    }
    if (args.batch % (args.grad_accum * ndp) != 0) {
        die("--batch %d does not split into %d micro-steps x %d data-parallel ranks", args.batch, args.grad_accum, ndp);
    }
    int B = args.batch / (args.grad_accum * ndp);   // this rank's micro-batch
    int T = args.seq;
    gpt2_allocate_activations(&model, B, T);
#ifdef USE_MPI
    DataParallel dp;
    if (use_dp) {
        DPMode mode = strcmp(args.dp_mode, "naive") == 0 ? DP_NAIVE : strcmp(args.dp_mode, "ps") == 0 ? DP_PS
                    : args.zero == 0 ? DP_DDP : (DPMode)(DP_ZERO1 + args.zero - 1);
        if (mode == DP_PS && args.ps_servers > ndp) {
            die("--ps-servers %d: at most the %d data-parallel ranks can be servers", args.ps_servers, ndp);
        }
        dp_init(&dp, &model, &mesh.dim[MESH_DP], mode, args.offload, strcmp(args.comm_algo, "ring") == 0,
                args.ps_servers, args.bucket_mb);
        g_dp = &dp;
    }
#endif

    // ---- data and tokenizer
    int task = strcmp(args.task, "sft") == 0 ? TASK_SFT : strcmp(args.task, "rlvr") == 0 ? TASK_RLVR : TASK_PRETRAIN;
    DataLoader train, val;
    SFTLoader sft_train, sft_val;
    Tokenizer tokenizer;
    int have_tokenizer = 0, eot = cfg->vocab_size - 1;
    if (!args.bench) {
        FILE* f = args.tokenizer ? fopen(args.tokenizer, "rb") : NULL;
        if (f) {
            fclose(f);
            tokenizer_load(&tokenizer, args.tokenizer);
            if (tokenizer.vocab_size != cfg->vocab_size) {
                die("tokenizer '%s' has %d tokens but the model's vocabulary is %d", args.tokenizer,
                    tokenizer.vocab_size, cfg->vocab_size);
            }
            have_tokenizer = 1;
            eot = tokenizer.eot_token;
        } else {
            printf("note: no tokenizer at '%s': samples print token ids\n", args.tokenizer ? args.tokenizer : "");
        }
        if (task == TASK_PRETRAIN) { dataloader_init(&train, args.train_data, B, T, rank, world, cfg->vocab_size); }
        if (task == TASK_SFT) {
            sft_loader_init(&sft_train, args.sft_train, B, T, rank, ndp, cfg->vocab_size, eot);
            if (args.shuffle) { sft_loader_shuffle(&sft_train, (uint64_t)args.seed); }
            sft_loader_init(&sft_val, args.sft_val, B, T, rank, ndp, cfg->vocab_size, eot);
        } else {
            dataloader_init(&val, args.val_data, B, T, rank, world, cfg->vocab_size);
        }
    }
    // RLVR: prompts with their answers, the sampler, the KV cache, the frozen reference model
    RLState rl;
    GPT2 ref_model;
    int rl_rows = args.batch / ndp;   // this rank's rollouts per step
    if (task == TASK_RLVR) {
        rl.reward = reward_parse(args.reward);
        rl.advantage = Advantage{rl_mode_parse(args.rl_mode), 0.0f, 0};
        rl.beta = args.kl;
        rl.group = args.group;
        rl.seed = (uint64_t)args.seed;
        int greedy = rl.advantage.mode == RL_TOP1;
        rl.gen = GenerateConfig{greedy ? 0.0f : args.temperature, greedy ? 1 : args.top_k, args.max_new, 1};
        rl.examples = sft_load_examples(args.prompts, eot, 0);
        if (rl.examples.empty()) { die("no (prompt, answer) examples in '%s' (python3 dev/data/arithmetic.py writes them)", args.prompts); }
        int longest = 0;
        for (const SFTExample& e : rl.examples) { longest = std::max(longest, (int)e.prompt.size()); }
        if (longest + args.max_new - 1 > T) {
            die("--seq %d is too short for the longest prompt (%d tokens) + --max-new %d - 1", T, longest, args.max_new);
        }
        int cache_T = std::min(cfg->max_seq_len, longest + args.max_new);
        kvcache_init(&rl.kv, &model, rl_rows, cache_T, rl_rows * cache_T);
        rl.ref = NULL;
        if (rl.beta > 0.0f) {   // a frozen copy of the starting point
            if (args.load) { gpt2_load_checkpoint(&ref_model, args.load); }
            else { gpt2_build(&ref_model, cfg); gpt2_init_random(&ref_model, (uint64_t)args.seed); }
            gpt2_allocate_activations(&ref_model, B, T);
            rl.ref = &ref_model;
        }
    }
    std::vector<ArithExample> examples, my_examples;   // my_examples: this rank's share
    if (args.accuracy > 0 && !args.bench) {
        if (cfg->vocab_size == 257) { examples = arith_load_examples(args.val_data, eot, args.accuracy); }
        if (examples.empty()) {
            printf("note: no exact-match accuracy: it needs byte-level 'a+b=c' validation data (dev/data/arithmetic.py)\n");
        }
        for (size_t i = 0; i < examples.size(); i++) {
            if ((int)(i % ndp) == rank) { my_examples.push_back(examples[i]); }
        }
    }

    // ---- what we are about to do
#ifdef USE_MPI
    const char* mpi_note = "MPI build";
#else
    const char* mpi_note = "built without MPI: single rank only";
#endif
    printf("backend      %s, %d threads, %s\n", BACKEND_NAME, backend_num_threads(), mpi_note);
    printf("model        L %d, NH %d, C %d, maxT %d, V %d (padded %d): %zu parameters\n", cfg->num_layers,
           cfg->num_heads, cfg->channels, cfg->max_seq_len, cfg->vocab_size, cfg->padded_vocab_size,
           model.num_parameters);
    printf("batch        %d sequences x %d tokens = %d tokens per step (micro-batch %d, %d micro-steps)\n",
           args.batch, T, args.batch * T, B, args.grad_accum);
    if (task == TASK_PRETRAIN) {
        printf("task         pretrain: cross-entropy on every next token\n");
        printf("data         %s\n", args.bench ? "random tokens (--bench)" : args.train_data);
    } else if (task == TASK_SFT) {
        printf("task         sft: cross-entropy on the answer tokens only\n");
        printf("data         %s: %ld examples packed into %ld rows of %d tokens, %ld skipped (longer than %d tokens)\n",
               args.sft_train, sft_train.num_examples, sft_train.num_rows, T + 1, sft_train.num_skipped, T + 1);
        printf("order        %s\n", args.shuffle ? "rows shuffled once (seeded by --seed)" : "file order");
    } else {
        printf("task         rlvr: %d prompts x %d samples per step, %s advantages, reward '%s', KL coefficient %g\n",
               args.batch / args.group, args.group, args.rl_mode, args.reward, args.kl);
        printf("sampling     %s, at most %d new tokens, stop at newline or end-of-text; %zu prompts from %s\n",
               rl.gen.temperature == 0.0f ? "greedy (top-1)" : "temperature/top-k", args.max_new, rl.examples.size(), args.prompts);
    }
    if (!use_dp) {
        printf("memory       parameters + gradients %.1f MiB, AdamW state %.1f MiB, activations %.1f MiB\n",
               2.0 * model.num_parameters * sizeof(floatX) / 1048576.0,
               2.0 * model.num_parameters * sizeof(float) / 1048576.0, model.acts_bytes / 1048576.0);
    }
#ifdef USE_MPI
    if (use_dp) {
        mesh_print(&mesh);
        dp_print_memory(&dp);
        printf("comm         %s collectives%s\n", dp.use_ring ? "ring (ours: bytes counted)" : "native MPI (bytes not counted)",
               dp.mode == DP_PS ? "; parameter server push/pull (ours: counted)" : "");
    }
    if (args.trace) { MPI_Barrier(MPI_COMM_WORLD); trace_start(); }
#else
    if (args.trace) { trace_start(); }
#endif
    FILE* logf = NULL;
    std::string log_tmp;
    if (args.log && rank == 0) { logf = fopen_tmp_for_write(args.log, &log_tmp); }
    FILE* metricsf = NULL;
    std::string metrics_tmp;
    if (args.metrics && rank == 0) {
        metricsf = fopen_tmp_for_write(args.metrics, &metrics_tmp);
        fprintf(metricsf, "step,reward,accuracy,length,kl,loss,heldout_accuracy\n");
    }
    float heldout = NAN;   // the last held-out accuracy, for the metrics file
    double comm_total = 0.0, exposed_total = 0.0;

    // ---- training
    Rng sample_rng;
    rng_init(&sample_rng, (uint64_t)args.seed + 1);
    Rng bench_rng;
    rng_init(&bench_rng, (uint64_t)args.seed + 2);
    std::vector<int> bench_inputs, bench_targets;
    double flops_per_step = gpt2_flops_per_token(&model, T) * args.batch * T;
    double timed_seconds = 0.0;
    int timed_steps = 0;
    float val_loss = NAN;
    for (int step = 0; step <= args.steps; step++) {
        int last = step == args.steps;
        // evaluation and samples happen before the step (and once after the last one)
        int do_eval = !args.bench && (last || (args.eval_every > 0 && step % args.eval_every == 0));
        int do_sample = !args.bench && args.sample_every > 0 && (step % args.sample_every == 0 || last) && step > 0;
        int do_save = args.save && args.save_every > 0 && step > 0 && step % args.save_every == 0 && !last;
#ifdef USE_MPI
        if (use_dp && (do_eval || do_sample || do_save)) { dp_full_model_begin(&dp); }   // ZeRO-3 gathers
#endif
        if (do_eval) {
            // each rank evaluates its share of the batches and examples; the sums are combined
            const char* what = "";
            if (task == TASK_SFT) {
                double count = 0.0, sum = sft_validation_loss(&model, &sft_val, args.eval_batches, &count);
                val_loss = (float)(dp_sum(sum) / std::max(1.0, dp_sum(count)));
                what = " (answer tokens)";
            } else {
                val_loss = (float)(dp_sum(validation_loss(&model, &val, args.eval_batches)) / ndp);
            }
            if (examples.empty()) {
                printf("val loss%s %.4f\n", what, val_loss);
            } else {
                if (last) { printf("held-out examples, greedy completion:\n"); }
                float mine = my_examples.empty() ? 0.0f : arith_accuracy(&model, my_examples, eot, last ? 8 : 0);
                float acc = (float)(dp_sum((double)mine * my_examples.size()) / examples.size());
                printf("val loss%s %.4f | accuracy %.1f%% (exact match, %d held-out examples)\n", what, val_loss,
                       100.0f * acc, (int)examples.size());
                heldout = acc;
                if (metricsf && last) { fprintf(metricsf, "%d,,,,,,%.6f\n", step, acc); }
            }
        }
        if (do_sample && rank == 0) {
            print_sample(&model, have_tokenizer ? &tokenizer : NULL, eot, std::min(args.sample_len, T - 1),
                         args.top_k, args.temperature, &sample_rng);
        }
        if (do_save && rank == 0) {
            gpt2_save_checkpoint(&model, args.save);
            printf("saved %s (step %d)\n", args.save, step);
        }
#ifdef USE_MPI
        if (use_dp && (do_eval || do_sample || do_save)) { dp_full_model_end(&dp); }
#endif
        if (last) { break; }

        double t0 = wall_seconds();
        // the loss is the mean over this rank's share of the batch; data parallelism averages
        // the ranks' gradients, so the update follows the mean over the global batch
        float dloss = 1.0f / ((float)(args.batch / ndp) * T);
        int Tm = T;   // the sequence length of this step's micro-batches
        double rollout_seconds = 0.0;
        if (task == TASK_SFT) {
            // a mean over the answer tokens of the whole step (all ranks, all micro-steps):
            // every rank counts them in the packed rows, no communication needed
            long n = sft_loader_count_ahead(&sft_train, args.grad_accum);
            dloss = n > 0 ? (float)ndp / (float)n : 0.0f;
        }
        if (task == TASK_RLVR) {
            // sample, score, advantages, loss weights; then the micro-steps train on the rollouts
#ifdef USE_MPI
            if (use_dp) { dp_full_model_begin(&dp); }
#endif
            rl_rollout(&rl, &model, step, args.batch, rank * rl_rows, rl_rows, eot, dp_gather_floats, NULL);
#ifdef USE_MPI
            if (use_dp) { dp_full_model_end(&dp); }
#endif
            if (rl.bad_rewards > 0) {
                printf("warning: the reward function returned a non-finite value for %d of %d samples: counted as 0\n",
                       rl.bad_rewards, args.batch);
            }
            dloss = rl.num_tokens > 0 ? (float)ndp / (float)rl.num_tokens : 0.0f;
            Tm = rl.rb.T;
            rollout_seconds = wall_seconds() - t0;
        }
#ifdef USE_MPI
        if (use_dp) { dp_zero_grad(&dp); } else { gpt2_zero_grad(&model); }
#else
        gpt2_zero_grad(&model);
#endif
        float loss = 0.0f;
        for (int micro = 0; micro < args.grad_accum; micro++) {
#ifdef USE_MPI
            if (use_dp) { dp_micro_step(&dp, micro, args.grad_accum); }
#endif
            const int* inputs;
            const int* targets;
            const float* weights = NULL;   // per-token loss weights (SFT: the answer mask; RL: advantages)
            if (task == TASK_SFT) {
                sft_loader_next_batch(&sft_train);
                inputs = sft_train.inputs;
                targets = sft_train.targets;
                weights = sft_train.weights;
            } else if (task == TASK_RLVR) {
                size_t off = (size_t)micro * B * Tm;
                inputs = rl.rb.inputs.data() + off;
                targets = rl.rb.targets.data() + off;
                weights = rl.weights.data() + off;
            } else if (args.bench) {
                bench_inputs.resize((size_t)B * T + 1);
                for (auto& x : bench_inputs) { x = (int)(rng_u32(&bench_rng) % cfg->vocab_size); }
                bench_targets.assign(bench_inputs.begin() + 1, bench_inputs.end());
                inputs = bench_inputs.data();
                targets = bench_targets.data();
            } else {
                dataloader_next_batch(&train);
                inputs = train.inputs;
                targets = train.targets;
            }
            double tf = trace_now();
            gpt2_forward(&model, inputs, B, Tm);
            loss += gpt2_classifier(&model, targets, weights, dloss, 1) * dloss;
            trace_event("forward", 0, tf);
            double tb = trace_now();
            gpt2_backward(&model);
            trace_event("backward", 0, tb);
        }
        float lr = lr_at_step(step, args.steps, args.lr, args.warmup, args.lr_final_frac);
        float norm;
#ifdef USE_MPI
        if (use_dp) {
            norm = dp_update(&dp, lr, args.beta1, args.beta2, args.eps, args.weight_decay, args.clip);
            loss = (float)(dp_sum(loss) / ndp);
        } else {
            norm = gpt2_update(&model, lr, args.beta1, args.beta2, args.eps, args.weight_decay, args.clip);
        }
#else
        norm = gpt2_update(&model, lr, args.beta1, args.beta2, args.eps, args.weight_decay, args.clip);
#endif
        if (task == TASK_RLVR && rl.beta > 0.0f) { loss = (float)rl.loss; }   // policy-gradient term + beta * KL
        backend_synchronize();
        double dt = wall_seconds() - t0;
        if (!isfinite(loss) || !isfinite(norm)) {
            die("step %d: loss %f, gradient norm %f: training diverged (try a lower --lr)", step + 1, loss, norm);
        }
        if (step > 0) { timed_seconds += dt; timed_steps++; }   // the first step warms caches up
        double peak = backend_peak_flops();
        print_step_line(step + 1, args.steps, loss, norm, lr, dt, (double)args.batch * Tm,
                        peak > 0 ? 100.0 * flops_per_step / dt / (peak * ndp) : -1.0);
        if (logf) { fprintf(logf, "%d %.9g %.9g %.9g\n", step + 1, loss, norm, lr); }
        if (task == TASK_RLVR) {
            printf("       rl | reward %.3f | accuracy %.1f%% | length %.2f | KL %.5f | rollout %.1f ms\n",
                   rl.reward_mean, 100.0 * rl.accuracy, rl.length_mean, rl.kl, rollout_seconds * 1e3);
            if (metricsf) {
                fprintf(metricsf, "%d,%.6f,%.6f,%.4f,%.6g,%.6g,", step, rl.reward_mean, rl.accuracy, rl.length_mean,
                        rl.kl, loss);
                if (!isnan(heldout)) { fprintf(metricsf, "%.6f", heldout); }
                fprintf(metricsf, "\n");
                heldout = NAN;
            }
        }
#ifdef USE_MPI
        if (use_dp) {
            uint64_t sent = dp_step_bytes(&dp), want = dp_formula_bytes(&dp, args.grad_accum);
            char a[32], b[32];
            if (dp.use_ring || dp.mode == DP_PS) {
                printf("     comm | sent %s by this rank (formula %s, %s) | %.1f ms, exposed %.1f ms\n", mib(sent, a),
                       mib(want, b), sent == want ? "equal" : "DIFFERENT", dp.comm_seconds * 1e3, dp.exposed_seconds * 1e3);
            } else {
                printf("     comm | native MPI: bytes not counted (ring formula %s) | %.1f ms, exposed %.1f ms\n",
                       mib(want, b), dp.comm_seconds * 1e3, dp.exposed_seconds * 1e3);
            }
            if (step == 0) { dp_print_peaks(&dp); }
            if (step > 0) { comm_total += dp.comm_seconds; exposed_total += dp.exposed_seconds; }
        }
#endif
    }

    if (timed_steps > 0) {
        double s = timed_seconds / timed_steps;
        char tps[32];
        printf("average step (excluding the first): %.1f ms | %s tok/s | %.1f GFLOP/s | %d threads\n", s * 1e3,
               with_commas(args.batch * T / s, tps, sizeof(tps)), flops_per_step / s * 1e-9, backend_num_threads());
        if (use_dp) {
            double c = comm_total / timed_steps, e = exposed_total / timed_steps;
            printf("communication per step (rank 0): %.1f ms, of which exposed %.1f ms (%.0f%% hidden behind compute)\n",
                   c * 1e3, e * 1e3, c > 0 ? 100.0 * (1.0 - std::min(1.0, e / c)) : 0.0);
        }
    }
    if (logf) { fclose_and_rename(logf, log_tmp, args.log); }
    if (metricsf) { fclose_and_rename(metricsf, metrics_tmp, args.metrics); }
    if (args.save) {
#ifdef USE_MPI
        if (use_dp) { dp_full_model_begin(&dp); }
#endif
        if (rank == 0) {
            gpt2_save_checkpoint(&model, args.save);
            printf("saved %s\n", args.save);
        }
#ifdef USE_MPI
        if (use_dp) { dp_full_model_end(&dp); }
#endif
    }
    if (args.trace) {
        std::string mine = trace_json_events(rank);
#ifdef USE_MPI
        // rank 0 collects every rank's events and writes the one file
        int len = (int)mine.size();
        std::vector<int> lens(world), displs(world);
        MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
        std::vector<char> all;
        if (rank == 0) {
            size_t total = 0;
            for (int r = 0; r < world; r++) { displs[r] = (int)total; total += lens[r]; }
            all.resize(total + 1);
        }
        MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            std::vector<std::string> parts;
            for (int r = 0; r < world; r++) { parts.push_back(std::string(all.data() + displs[r], lens[r])); }
            trace_write_file(args.trace, parts);
            printf("trace: %s (open it in ui.perfetto.dev)\n", args.trace);
        }
#else
        trace_write_file(args.trace, {mine});
        printf("trace: %s (open it in ui.perfetto.dev)\n", args.trace);
#endif
    }
    if (!args.bench) {
        if (task == TASK_PRETRAIN) { dataloader_free(&train); }
        if (task == TASK_SFT) { sft_loader_free(&sft_train); sft_loader_free(&sft_val); }
        else { dataloader_free(&val); }
        if (have_tokenizer) { tokenizer_free(&tokenizer); }
    }
#ifdef USE_MPI
    if (use_dp) { dp_shutdown(&dp); }
#endif
    if (task == TASK_RLVR) {
        kvcache_free(&rl.kv);
        if (rl.ref) { gpt2_free(rl.ref); }
    }
    gpt2_free(&model);
    backend_shutdown();
#ifdef USE_MPI
    if (use_dp) { mesh_free(&mesh); }
    comm_free(&world_comm);
    MPI_Finalize();
#endif
    return 0;
}
