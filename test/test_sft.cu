// Tests of the SFT data loader (llmc/data/sft_shards.h), host only. Modes:
//   ./test_sftcpu                      unit checks on small shards it writes into build/sft-test/:
//                                      packed rows of a hand-made set, weights = mask shifted by
//                                      one, skipped examples, data-parallel split (nranks 2, 3)
//                                      against the single-rank batch, count_ahead, wrap-around
//   ./test_sftcpu --make-bad DIR       writes one malformed SFT file set per error case into DIR
//   ./test_sftcpu --load PATTERN T B [NRANKS]   sft_loader_init on it (dies on bad input), prints counts
//   ./test_sftcpu --examples PATTERN            sft_load_examples on it (dies on bad input)
//   ./test_sftcpu --check-arith PATTERN         every example of dev/data/arithmetic.py's SFT
//                                      output is "<eot>a+b=" + "(a+b)\n" (its digits in either
//                                      order: --format reversed writes the units first); the
//                                      loader packs them all
// Prints PASS/FAIL per check; exits 1 if any failed. test/test_sft.sh runs every mode.
#include <vector>
#include <algorithm>
#include <string>
#include <sys/stat.h>
#include "../llmc/common.h"
#include "../llmc/data/sft_shards.h"
#include "../llmc/rand.h"

static int failures = 0;

static void report(const char* name, int ok, const std::string& detail = "") {
    printf("%s %-62s %s\n", ok ? "PASS" : "FAIL", name, detail.c_str());
    if (!ok) { failures++; }
}

static void mkdir_p(const std::string& dir) {
    std::string cur;
    for (size_t i = 0; i <= dir.size(); i++) {
        if (i == dir.size() || dir[i] == '/') {
            if (!cur.empty()) { mkdir(cur.c_str(), 0755); }
        }
        if (i < dir.size()) { cur += dir[i]; }
    }
}

// ---------------------------------------------------------------------------------------------
// writers (the formats of llmc/data/sft_shards.h, with knobs to break them)

static void write_shard(const std::string& path, const std::vector<int>& tokens, int magic = SHARD_MAGIC) {
    FILE* f = fopen_or_die(path.c_str(), "wb");
    int header[256] = {0};
    header[0] = magic; header[1] = 1; header[2] = (int)tokens.size();
    fwrite_or_die(header, sizeof(int), 256, f, path.c_str());
    for (int t : tokens) { uint16_t u = (uint16_t)t; fwrite_or_die(&u, 2, 1, f, path.c_str()); }
    fclose(f);
}

// count < 0: the true count; drop: values left out of the body (a truncated file)
static void write_mask(const std::string& path, const std::vector<int>& mask, int magic = SFT_MASK_MAGIC,
                       int version = SFT_MASK_VERSION, int count = -1, int drop = 0) {
    FILE* f = fopen_or_die(path.c_str(), "wb");
    int header[256] = {0};
    header[0] = magic; header[1] = version; header[2] = count < 0 ? (int)mask.size() : count;
    fwrite_or_die(header, sizeof(int), 256, f, path.c_str());
    for (size_t i = 0; i + drop < mask.size(); i++) { uint8_t u = (uint8_t)mask[i]; fwrite_or_die(&u, 1, 1, f, path.c_str()); }
    fclose(f);
}

// an SFT file pair: stem + "_000000.bin" / ".mask"
static void write_sft(const std::string& stem, const std::vector<int>& tokens, const std::vector<int>& mask) {
    write_shard(stem + "_000000.bin", tokens);
    write_mask(stem + "_000000.mask", mask);
}

// ---------------------------------------------------------------------------------------------
// unit checks

static const int HE = 50, HV = 51;   // the hand-made set's EOT and vocabulary

// Packed rows of the hand-made set, written out by hand (T = 7, rows of 8 tokens).
static const int HAND_ROWS = 4, HAND_W = 8;
static const int hand_rows[HAND_ROWS][HAND_W] = {
    {HE, 1, 2, 3, 4, 5, HE, HE},      // ex1 (6 tokens) + pad: ex2 (3) does not fit in the 2 left
    {HE, 6, 7, HE, HE, HE, HE, HE},   // ex2 + pad (ex3 skipped: 10 tokens > 8; ex4 needs a full row)
    {HE, 2, 3, 4, 5, 6, 7, 8},        // ex4, exactly T+1 tokens
    {HE, 9, HE, 3, 4, HE, HE, HE},    // ex5 + ex6 + pad
};
static const int hand_mask[HAND_ROWS][HAND_W] = {
    {0, 0, 0, 0, 1, 1, 0, 0},
    {0, 0, 1, 0, 0, 0, 0, 0},
    {0, 0, 1, 1, 1, 1, 1, 1},
    {0, 1, 0, 0, 1, 0, 0, 0},
};
// weights of each row's T targets: the mask shifted by one, written out by hand too
static const float hand_weights[HAND_ROWS][HAND_W - 1] = {
    {0, 0, 0, 1, 1, 0, 0},
    {0, 1, 0, 0, 0, 0, 0},
    {0, 1, 1, 1, 1, 1, 1},
    {1, 0, 0, 1, 0, 0, 0},
};

static void write_hand_set(const std::string& dir) {
    // file a: ex1, ex2, ex3 (too long); file b: ex4, ex5, ex6
    write_sft(dir + "/sft_a", {HE, 1, 2, 3, 4, 5, HE, 6, 7, HE, 1, 1, 1, 1, 1, 1, 1, 1, 2},
              {0, 0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1});
    write_sft(dir + "/sft_b", {HE, 2, 3, 4, 5, 6, 7, 8, HE, 9, HE, 3, 4},
              {0, 0, 1, 1, 1, 1, 1, 1, 0, 1, 0, 0, 1});
}

// Does the loader's current batch row b equal hand row r (inputs, targets, weights)?
static int batch_row_is_hand(const SFTLoader* dl, int b, int r) {
    for (int t = 0; t < dl->T; t++) {
        size_t i = (size_t)b * dl->T + t;
        if (dl->inputs[i] != hand_rows[r][t] || dl->targets[i] != hand_rows[r][t + 1] ||
            dl->weights[i] != hand_weights[r][t]) { return 0; }
    }
    return 1;
}

static void test_hand(const std::string& dir) {
    write_hand_set(dir);
    std::string pat = dir + "/sft_*.bin";
    SFTLoader dl;
    sft_loader_init(&dl, pat.c_str(), 1, HAND_W - 1, 0, 1, HV, HE);
    char d[200];
    snprintf(d, sizeof(d), "%ld examples, %ld skipped, %ld rows", dl.num_examples, dl.num_skipped, dl.num_rows);
    report("hand set: 5 examples packed, the 10-token one skipped, 4 rows",
           dl.num_examples == 5 && dl.num_skipped == 1 && dl.num_rows == HAND_ROWS, d);
    int rows_ok = dl.num_rows == HAND_ROWS;
    for (int r = 0; rows_ok && r < HAND_ROWS; r++) {
        for (int t = 0; t < HAND_W; t++) {
            if (dl.rows[r * HAND_W + t] != hand_rows[r][t] || dl.row_mask[r * HAND_W + t] != hand_mask[r][t]) { rows_ok = 0; }
        }
    }
    report("hand set: packed rows and their masks exactly as written by hand", rows_ok);
    // B = 1: batch k is row k; inputs row[0..T-1], targets row[1..T], weights mask[1..T]
    int batches_ok = 1, count_ok = 1;
    for (int k = 0; k < HAND_ROWS + 2; k++) {
        long ahead = sft_loader_count_ahead(&dl, 1);
        sft_loader_next_batch(&dl);
        int r = k % HAND_ROWS;   // wraps to row 0 after the last row
        if (!batch_row_is_hand(&dl, 0, r)) { batches_ok = 0; }
        long got = 0;
        for (int t = 0; t < dl.T; t++) { got += (long)dl.weights[t]; }
        if (ahead != got) { count_ok = 0; }
    }
    report("hand set: batches = rows, weights = mask shifted by one, wrap to row 0", batches_ok);
    report("hand set: count_ahead(1) = weights delivered, each batch", count_ok);
    sft_loader_reset(&dl);
    long all = sft_loader_count_ahead(&dl, HAND_ROWS);
    report("hand set: count_ahead over all rows = 2+1+6+2 answer targets", all == 11, std::to_string(all));
    sft_loader_next_batch(&dl);
    report("hand set: reset goes back to row 0", batch_row_is_hand(&dl, 0, 0));
    sft_loader_free(&dl);

    // 3 ranks x B = 1 on 4 rows: a global micro-batch is rows 0..2; then only row 3 is left,
    // so the next one starts again at row 0
    int wrap_ok = 1;
    long ahead2[3];
    for (int rank = 0; rank < 3; rank++) {
        sft_loader_init(&dl, pat.c_str(), 1, HAND_W - 1, rank, 3, HV, HE);
        ahead2[rank] = sft_loader_count_ahead(&dl, 2);
        for (int k = 0; k < 3; k++) {
            sft_loader_next_batch(&dl);
            if (!batch_row_is_hand(&dl, 0, rank)) { wrap_ok = 0; }
        }
        sft_loader_free(&dl);
    }
    report("hand set, 3 ranks: rank r reads row r; tail row 3 skipped, restart at 0", wrap_ok);
    report("hand set, 3 ranks: count_ahead(2) = 2 x (rows 0..2) = 2 x 9 on every rank",
           ahead2[0] == 18 && ahead2[1] == 18 && ahead2[2] == 18,
           std::to_string(ahead2[0]) + " " + std::to_string(ahead2[1]) + " " + std::to_string(ahead2[2]));
}

// A random set (examples of 2..20 tokens, some longer than T+1 = 17) over two files.
static void write_random_set(const std::string& dir, long* answer_tokens_kept) {
    Rng rng;
    rng_init(&rng, 1234);
    *answer_tokens_kept = 0;
    for (int file = 0; file < 2; file++) {
        std::vector<int> tok, mask;
        for (int e = 0; e < 150; e++) {
            int len = 2 + (int)(rng_u32(&rng) % 19);      // 2..20
            int ans = 1 + (int)(rng_u32(&rng) % (len - 1));   // 1..len-1 answer tokens
            tok.push_back(256);
            mask.push_back(0);
            for (int i = 1; i < len; i++) {
                tok.push_back((int)(rng_u32(&rng) % 256));
                mask.push_back(i >= len - ans ? 1 : 0);
            }
            if (len <= 17) { *answer_tokens_kept += ans; }
        }
        write_sft(dir + "/sft_" + std::to_string(file), tok, mask);
    }
}

// Advance a single-rank loader (batch nranks*B) and each rank's loader (batch B) by one
// micro-batch: 1 when rank r's inputs, targets and weights are rows r*B..r*B+B-1 of the
// single-rank batch. Adds the answer tokens the ranks delivered to *delivered.
static int next_batches_match(SFTLoader* single, std::vector<SFTLoader>& ranks, int B, int T, long* delivered) {
    int same = 1;
    sft_loader_next_batch(single);
    for (size_t r = 0; r < ranks.size(); r++) {
        sft_loader_next_batch(&ranks[r]);
        size_t n = (size_t)B * T, off = r * n;
        for (size_t i = 0; i < n; i++) {
            if (ranks[r].inputs[i] != single->inputs[off + i] || ranks[r].targets[i] != single->targets[off + i] ||
                ranks[r].weights[i] != single->weights[off + i]) { same = 0; }
            *delivered += (long)ranks[r].weights[i];
        }
    }
    return same;
}

static void test_random(const std::string& dir) {
    long kept_answers;
    write_random_set(dir, &kept_answers);
    std::string pat = dir + "/sft_*.bin";
    const int T = 16;
    SFTLoader one;
    sft_loader_init(&one, pat.c_str(), 1, T, 0, 1, 257, 256);
    long row_answers = 0;
    int pad_ok = 1;
    for (long r = 0; r < one.num_rows; r++) {
        row_answers += one.row_answers[r];
        if (one.rows[r * (T + 1)] != 256 || one.row_mask[r * (T + 1)] != 0) { pad_ok = 0; }
    }
    char d[200];
    snprintf(d, sizeof(d), "%ld examples, %ld skipped, %ld rows, %ld answer tokens", one.num_examples,
             one.num_skipped, one.num_rows, row_answers);
    report("random set: every answer token of every kept example is a target", row_answers == kept_answers &&
           one.num_examples + one.num_skipped == 300 && one.num_skipped > 0, d);
    report("random set: every row starts with EOT (mask 0)", pad_ok);
    sft_loader_free(&one);

    for (int B = 1; B <= 2; B++) {
        for (int nranks = 2; nranks <= 3; nranks++) {
            SFTLoader single;
            sft_loader_init(&single, pat.c_str(), nranks * B, T, 0, 1, 257, 256);
            std::vector<SFTLoader> ranks(nranks);
            for (int r = 0; r < nranks; r++) { sft_loader_init(&ranks[r], pat.c_str(), B, T, r, nranks, 257, 256); }
            long G = (long)nranks * B, per_pass = single.num_rows / G;
            int steps = (int)(2 * per_pass + 3);   // past the wrap-around twice
            int same = 1, ahead_ok = 1, wrap_ok = 1;
            std::vector<long> ahead1(steps), ahead3(steps), delivered(steps, 0);
            for (int s = 0; s < steps; s++) {
                ahead1[s] = sft_loader_count_ahead(&single, 1);
                ahead3[s] = sft_loader_count_ahead(&single, 3);
                for (int r = 0; r < nranks; r++) {
                    if (sft_loader_count_ahead(&ranks[r], 1) != ahead1[s] || sft_loader_count_ahead(&ranks[r], 3) != ahead3[s]) { ahead_ok = 0; }
                }
                same &= next_batches_match(&single, ranks, B, T, &delivered[s]);
                // the single-rank batch is rows start..start+G-1, start = (s mod passes) * G
                long start = (s % per_pass) * G;
                for (long b = 0; b < G; b++) {
                    for (int t = 0; t < T; t++) {
                        size_t row = (size_t)(start + b) * (T + 1);
                        size_t i = (size_t)b * T + t;
                        if (single.inputs[i] != single.rows[row + t] || single.targets[i] != single.rows[row + t + 1] ||
                            single.weights[i] != (float)single.row_mask[row + t + 1]) { wrap_ok = 0; }
                    }
                }
            }
            for (int s = 0; s < steps; s++) {
                if (ahead1[s] != delivered[s]) { ahead_ok = 0; }
                if (s + 3 <= steps && ahead3[s] != delivered[s] + delivered[s + 1] + delivered[s + 2]) { ahead_ok = 0; }
            }
            char name[200];
            snprintf(name, sizeof(name), "B=%d, %d ranks: union of ranks' batches = single-rank batch", B, nranks);
            report(name, same, std::to_string(steps) + " steps");
            snprintf(name, sizeof(name), "B=%d, %d ranks: batches are consecutive rows, restart at 0", B, nranks);
            report(name, wrap_ok, std::to_string(single.num_rows) + " rows, " + std::to_string(per_pass) + " per pass");
            snprintf(name, sizeof(name), "B=%d, %d ranks: count_ahead(1,3) = weights delivered, all ranks", B, nranks);
            report(name, ahead_ok);
            sft_loader_free(&single);
            for (int r = 0; r < nranks; r++) { sft_loader_free(&ranks[r]); }
        }
    }
    // the examples reader on the same files: prompt = mask-0 tokens, answer = mask-1 tokens
    std::vector<SFTExample> ex = sft_load_examples(pat.c_str(), 256, 0);
    std::vector<SFTExample> ex5 = sft_load_examples(pat.c_str(), 256, 5);
    int ok = ex.size() == 300 && ex5.size() == 5;
    for (size_t i = 0; ok && i < 5; i++) { ok = ex5[i].prompt == ex[i].prompt && ex5[i].answer == ex[i].answer; }
    for (size_t i = 0; ok && i < ex.size(); i++) { ok = !ex[i].prompt.empty() && ex[i].prompt[0] == 256 && !ex[i].answer.empty(); }
    report("sft_load_examples: all 300 (max 0), the first 5 (max 5), prompt starts with EOT", ok,
           std::to_string(ex.size()) + " examples");
}

// --shuffle: the same rows (tokens, masks, answer counts) in a seeded order, the same order on
// every rank, so a data-parallel run still reads what the single-rank run reads.
static std::vector<std::vector<int>> row_keys(const SFTLoader* dl) {
    const size_t W = (size_t)dl->T + 1;
    std::vector<std::vector<int>> keys((size_t)dl->num_rows);
    for (long r = 0; r < dl->num_rows; r++) {
        std::vector<int>& k = keys[(size_t)r];
        int answers = 0;
        for (size_t t = 0; t < W; t++) { k.push_back(dl->rows[r * W + t]); }
        for (size_t t = 0; t < W; t++) { k.push_back(dl->row_mask[r * W + t]); answers += t > 0 ? dl->row_mask[r * W + t] : 0; }
        k.push_back(dl->row_answers[r]);
        k.push_back(answers);   // row_answers[r] must still be row r's count
    }
    return keys;
}

static void test_shuffle(const std::string& dir) {
    std::string pat = dir + "/sft_*.bin";   // the random set of test_random
    const int T = 16;
    SFTLoader plain, a, a2, b;
    sft_loader_init(&plain, pat.c_str(), 1, T, 0, 1, 257, 256);
    sft_loader_init(&a, pat.c_str(), 1, T, 0, 1, 257, 256);
    sft_loader_init(&a2, pat.c_str(), 1, T, 0, 1, 257, 256);
    sft_loader_init(&b, pat.c_str(), 1, T, 0, 1, 257, 256);
    sft_loader_shuffle(&a, 7);
    sft_loader_shuffle(&a2, 7);
    sft_loader_shuffle(&b, 8);
    std::vector<std::vector<int>> kp = row_keys(&plain), ka = row_keys(&a), ka2 = row_keys(&a2), kb = row_keys(&b);
    long moved = 0;
    for (size_t r = 0; r < kp.size(); r++) { moved += kp[r] != ka[r]; }
    int counts_ok = 1;
    for (const std::vector<int>& k : ka) { counts_ok &= k[k.size() - 2] == k[k.size() - 1]; }
    std::vector<std::vector<int>> sp = kp, sa = ka;
    std::sort(sp.begin(), sp.end());
    std::sort(sa.begin(), sa.end());
    report("shuffle: the same rows, masks and answer counts, in another order", sp == sa && counts_ok && moved > (long)kp.size() / 2,
           std::to_string(moved) + " of " + std::to_string(kp.size()) + " rows moved");
    report("shuffle: the same seed gives the same order, another seed another", ka == ka2 && ka != kb);
    sft_loader_free(&plain); sft_loader_free(&a); sft_loader_free(&a2); sft_loader_free(&b);

    const int B = 2, nranks = 2;
    SFTLoader single;
    sft_loader_init(&single, pat.c_str(), nranks * B, T, 0, 1, 257, 256);
    sft_loader_shuffle(&single, 7);
    std::vector<SFTLoader> ranks(nranks);
    for (int r = 0; r < nranks; r++) {
        sft_loader_init(&ranks[r], pat.c_str(), B, T, r, nranks, 257, 256);
        sft_loader_shuffle(&ranks[r], 7);
    }
    int same = 1;
    for (int s = 0; s < 10; s++) {
        for (int r = 0; r < nranks; r++) { same &= sft_loader_count_ahead(&ranks[r], 2) == sft_loader_count_ahead(&single, 2); }
        long delivered = 0;
        same &= next_batches_match(&single, ranks, B, T, &delivered);
    }
    report("shuffle, B=2, 2 ranks: union of ranks' batches = single-rank batch, same count_ahead", same);
    sft_loader_free(&single);
    for (int r = 0; r < nranks; r++) { sft_loader_free(&ranks[r]); }
}

// ---------------------------------------------------------------------------------------------
// malformed inputs, one file set per case: DIR/<case>_000000.{bin,mask}

static void make_bad(const std::string& dir) {
    mkdir_p(dir);
    const int E = 256;
    std::vector<int> tok = {E, '1', '+', '2', '=', '3', '\n', E, '2', '+', '2', '=', '4', '\n'};
    std::vector<int> mask = {0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 1};
    // write_sft(stem(...)) adds "_000000.bin"/".mask"; the single-file writers add it by hand
    auto stem = [&](const char* name) { return dir + "/" + name; };
    write_sft(stem("good"), tok, mask);
    write_shard(stem("nomask") + "_000000.bin", tok);
    write_shard(stem("badmagic") + "_000000.bin", tok);
    write_mask(stem("badmagic") + "_000000.mask", mask, 12345);
    write_shard(stem("badversion") + "_000000.bin", tok);
    write_mask(stem("badversion") + "_000000.mask", mask, SFT_MASK_MAGIC, 2);
    write_shard(stem("count") + "_000000.bin", tok);
    write_mask(stem("count") + "_000000.mask", mask, SFT_MASK_MAGIC, SFT_MASK_VERSION, 13);
    write_shard(stem("truncated") + "_000000.bin", tok);
    write_mask(stem("truncated") + "_000000.mask", mask, SFT_MASK_MAGIC, SFT_MASK_VERSION, -1, 3);
    std::vector<int> m2 = mask; m2[5] = 2;
    write_sft(stem("value"), tok, m2);
    std::vector<int> m3 = mask; m3[7] = 1;
    write_sft(stem("eotmask"), tok, m3);
    std::vector<int> t4(tok.begin() + 1, tok.end()), m4(mask.begin() + 1, mask.end());
    write_sft(stem("noeot"), t4, m4);
    std::vector<int> t5 = tok; t5[3] = 300;
    write_sft(stem("vocab"), t5, mask);
    write_sft(stem("empty"), {}, {});
    std::vector<int> m6 = mask; m6[13] = 0;   // "4" answer, then "\n" as prompt: mask 0 after 1
    write_sft(stem("afteranswer"), tok, m6);
    std::vector<int> m7 = mask; m7[12] = m7[13] = 0;   // the second example has no answer
    write_sft(stem("noanswer"), tok, m7);
    write_shard(stem("shardmagic") + "_000000.bin", tok, 777);
    write_mask(stem("shardmagic") + "_000000.mask", mask);
    printf("wrote the malformed SFT files into %s\n", dir.c_str());
}

// ---------------------------------------------------------------------------------------------
// the arithmetic SFT output of dev/data/arithmetic.py

static int parse_digits(const std::vector<int>& v, size_t* i, long* out) {
    size_t s = *i;
    *out = 0;
    while (*i < v.size() && v[*i] >= '0' && v[*i] <= '9') { *out = *out * 10 + (v[*i] - '0'); (*i)++; }
    return *i > s;
}

// the digits before the newline read units first (--format reversed: "250\n" is 52)
static long reversed_digits(const std::vector<int>& ans) {
    long v = 0;
    for (size_t k = ans.size() - 1; k-- > 0;) { v = v * 10 + (ans[k] - '0'); }
    return v;
}

static void check_arith(const char* pattern) {
    std::vector<SFTExample> ex = sft_load_examples(pattern, 256, 0);
    long bad = 0, answer_tokens = 0;
    std::string first_bad;
    for (const SFTExample& e : ex) {
        size_t i = 1;
        long a, b, c;
        std::vector<int> ans = e.answer;
        size_t j = 0;
        int ok = e.prompt.size() >= 5 && e.prompt[0] == 256 && parse_digits(e.prompt, &i, &a) && i < e.prompt.size() &&
                 e.prompt[i++] == '+' && parse_digits(e.prompt, &i, &b) && i + 1 == e.prompt.size() && e.prompt[i] == '=' &&
                 parse_digits(ans, &j, &c) && j + 1 == ans.size() && ans[j] == '\n' &&
                 (c == a + b || reversed_digits(ans) == a + b);
        answer_tokens += (long)e.answer.size();
        if (!ok) {
            bad++;
            if (first_bad.empty()) {
                for (size_t k = 1; k < e.prompt.size(); k++) { first_bad += (char)e.prompt[k]; }
                first_bad += "|";
                for (int t : e.answer) { first_bad += t == '\n' ? std::string("\\n") : std::string(1, (char)t); }
            }
        }
    }
    std::string shown;
    if (!ex.empty()) {
        for (size_t k = 1; k < ex[0].prompt.size(); k++) { shown += (char)ex[0].prompt[k]; }
        shown += "' + '";
        for (int t : ex[0].answer) { shown += t == '\n' ? std::string("\\n") : std::string(1, (char)t); }
    }
    report("arithmetic SFT examples: prompt '<eot>a+b=', answer '(a+b)\\n' (digits either way)", !ex.empty() && bad == 0,
           std::to_string(ex.size()) + " examples, e.g. '" + shown + "'" + (bad ? ", first bad " + first_bad : ""));
    SFTLoader dl;
    sft_loader_init(&dl, pattern, 8, 64, 0, 1, 257, 256);
    long row_answers = 0;
    for (long r = 0; r < dl.num_rows; r++) { row_answers += dl.row_answers[r]; }
    char d[200];
    snprintf(d, sizeof(d), "%ld examples in %ld rows of 65, %ld skipped, %ld answer tokens", dl.num_examples,
             dl.num_rows, dl.num_skipped, row_answers);
    report("arithmetic SFT: T=64 packs every example and every answer token",
           dl.num_examples == (long)ex.size() && dl.num_skipped == 0 && row_answers == answer_tokens, d);
    sft_loader_free(&dl);
}

int main(int argc, char** argv) {
    if (argc >= 3 && strcmp(argv[1], "--make-bad") == 0) {
        make_bad(argv[2]);
        return 0;
    }
    if (argc >= 5 && strcmp(argv[1], "--load") == 0) {
        SFTLoader dl;
        sft_loader_init(&dl, argv[2], atoi(argv[4]), atoi(argv[3]), 0, argc >= 6 ? atoi(argv[5]) : 1, 257, 256);
        printf("%ld examples, %ld skipped, %ld rows\n", dl.num_examples, dl.num_skipped, dl.num_rows);
        sft_loader_free(&dl);
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "--examples") == 0) {
        std::vector<SFTExample> ex = sft_load_examples(argv[2], 256, 0);
        printf("%zu examples\n", ex.size());
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "--check-arith") == 0) {
        check_arith(argv[2]);
        return failures ? 1 : 0;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--make-bad DIR | --load PATTERN T B [NRANKS] | --examples PATTERN | --check-arith PATTERN]\n", argv[0]);
        return 2;
    }
    mkdir_p("build/sft-test/hand");
    mkdir_p("build/sft-test/random");
    test_hand("build/sft-test/hand");
    test_random("build/sft-test/random");
    test_shuffle("build/sft-test/random");
    return failures ? 1 : 0;
}
