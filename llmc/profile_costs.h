// What each operation of a training step computes and must move, for --profile's roofline
// (llmc/profile.h). Counted from the shapes: FLOPs as the model counts them, and the values each
// operation has to read and write at least once (its compulsory traffic; a cache miss more is the
// kernel's inefficiency, not the operation's cost). Values are counted in two kinds: floatX
// (parameters, activations, gradients: 4 bytes on the CPU, 2 in CUDA's bf16) and 4-byte ones
// (fp32 statistics and optimizer state, token ids). Shapes: BT tokens, C channels in, OC out,
// N elements.
//
// The FLOPs of the matmuls and of attention are the model's (gpt2_flops_per_token: 6 per
// parameter per token in the matmuls, 2 forward and 4 backward, and 12 L C T for attention, split
// 4 forward and 8 backward; the causal mask lets a kernel skip about half of attention's). Biases,
// layernorms, GELU, softmax and AdamW count their arithmetic by the formula, a tanh or an exp as 1.
#pragma once

// FLOPs, and the values moved: floatX ones read and written, 4-byte ones read and written
typedef struct { double flops, x_read, x_written, f_read, f_written; } OpCost;

// flops; floatX values read and written; 4-byte values read and written
static inline OpCost op_cost(double flops, double x_read, double x_written, double f_read, double f_written) {
    OpCost c = {flops, x_read, x_written, f_read, f_written};
    return c;
}

// embedding: out = wte[token] + wpe[position]; backward adds dout into both rows
static inline OpCost cost_encoder_forward(double BT, double C) { return op_cost(BT * C, 2 * BT * C, BT * C, BT, 0); }
static inline OpCost cost_encoder_backward(double BT, double C) { return op_cost(2 * BT * C, 3 * BT * C, 2 * BT * C, BT, 0); }

// layernorm: mean, variance, normalise, scale and shift (~8 per value); its fp32 mean and rstd
static inline OpCost cost_layernorm_forward(double BT, double C) {
    return op_cost(8 * BT * C, BT * C + 2 * C, BT * C, 0, 2 * BT);
}
// backward: dinp += ..., dweight += ..., dbias += ... (~14 per value)
static inline OpCost cost_layernorm_backward(double BT, double C) {
    return op_cost(14 * BT * C, 3 * BT * C + 3 * C, BT * C + 2 * C, 2 * BT, 0);
}

// out (BT, OC) = inp (BT, C) w^T + bias
static inline OpCost cost_matmul_forward(double BT, double C, double OC, int bias) {
    return op_cost(2 * BT * C * OC, BT * C + OC * C + (bias ? OC : 0), BT * OC, 0, 0);
}
// dinp = dout w (if asked), dweight += dout^T inp and dbias += column sums (if asked)
static inline OpCost cost_matmul_backward(double BT, double C, double OC, int dinp, int dweight, int dbias) {
    double flops = (dinp ? 2 : 0) * BT * C * OC + (dweight ? 2 : 0) * BT * C * OC;
    double rd = BT * OC + (dinp ? OC * C : 0) + (dweight ? BT * C + OC * C : 0) + (dbias ? OC : 0);
    double wr = (dinp ? BT * C : 0) + (dweight ? OC * C : 0) + (dbias ? OC : 0);
    return op_cost(flops, rd, wr, 0, 0);
}

// causal attention on qkv (B, T, 3C); `state` fp32 values saved for the backward
static inline OpCost cost_attention_forward(double B, double T, double C, double state) {
    return op_cost(4 * B * T * T * C, 3 * B * T * C, B * T * C, 0, state);
}
static inline OpCost cost_attention_backward(double B, double T, double C, double state) {
    return op_cost(8 * B * T * T * C, 4 * B * T * C, 3 * B * T * C, state, 0);
}

// GELU, 0.5 x (1 + tanh(k (x + 0.044715 x^3))): 9 per value; its derivative ~18
static inline OpCost cost_gelu_forward(double N) { return op_cost(9 * N, N, N, 0, 0); }
static inline OpCost cost_gelu_backward(double N) { return op_cost(18 * N, 2 * N, N, 0, 0); }

static inline OpCost cost_residual_forward(double N) { return op_cost(N, 2 * N, N, 0, 0); }

// softmax cross-entropy over V of the Vp logits of BT tokens (max, exp, sum, loss, gradient: ~5
// per logit), reading targets (and weights), writing the losses and, for training, dlogits in place
static inline OpCost cost_classifier(double BT, double V, double Vp, int weights, int dlogits) {
    return op_cost(5 * BT * V, BT * Vp, dlogits ? BT * Vp : 0, BT * (weights ? 2 : 1), BT);
}

static inline OpCost cost_global_norm(double N) { return op_cost(2 * N, N, 0, 0, 1); }

// AdamW (llmc/cpu/adamw.h, ~17 per parameter): reads the gradient and the parameter (or its fp32
// master), m and v; writes the parameter (and the master), m and v
static inline OpCost cost_adamw(double N, int master) {
    return op_cost(17 * N, master ? N : 2 * N, N, master ? 3 * N : 2 * N, master ? 3 * N : 2 * N);
}

static inline OpCost cost_zero_grad(double N) { return op_cost(0, 0, N, 0, 0); }
