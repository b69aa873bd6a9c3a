// Causal multi-head self-attention, the names the model calls (llmc/model/ops.h):
// attention_forward and attention_backward (formulas in llmc/cpu/attention.h). inp (B,T,3C)
// holds q | k | v; head h uses channels h*hs .. (h+1)*hs-1 of each; scale = 1/sqrt(hs).
// Two implementations of flash attention (the T x T matrix is never stored; the state saved for
// the backward is lse, the logsumexp of each row's scaled scores, B*NH*T floats):
//   attention_flash_tc.cuh   on tensor cores: the bf16 build, head sizes 16, 32, 64, 16-byte
//                            aligned tensors (every GPT-2 size)
//   attention_flash.cuh      on CUDA cores, fp32: the fp32 build, and every other case
// Both save the same lse, so either backward fits either forward. Generation's forward over a
// KV cache: attention_cached.cuh. The kernel lab (dev/cuda/attention_forward.cu,
// attention_backward.cu) sets these beside a naive version and one that stores the T x T
// probabilities (dev/cuda/attention_materialized.cuh).
#pragma once

#include "attention_flash.cuh"
#include "attention_flash_tc.cuh"
#include "attention_cached.cuh"

// the names the model calls: tensor cores when they apply (bf16 build, hs 16/32/64, aligned),
// else the CUDA-core flash kernels. Both save the same lse, so either backward fits either forward.
static inline void attention_forward(floatX* out, float* att, const floatX* inp, int B, int T, int C, int NH) {
    PROFILE_OP("attention", OP_FWD, cost_attention_forward(B, T, C, (double)attention_state_size(B, T, NH)));
    if (attention_tc_supported(C, NH, out, inp, inp)) {
        attention_forward_flash_tc(out, att, inp, B, T, C, NH);
    } else {
        attention_forward_flash(out, att, inp, B, T, C, NH);
    }
}
static inline void attention_backward(floatX* dinp, const floatX* dout, const floatX* inp, const float* att,
                                      int B, int T, int C, int NH) {
    PROFILE_OP("attention", OP_BWD, cost_attention_backward(B, T, C, (double)attention_state_size(B, T, NH)));
    if (attention_tc_supported(C, NH, dinp, dout, inp)) {
        attention_backward_flash_tc(dinp, dout, inp, att, B, T, C, NH);
    } else {
        attention_backward_flash(dinp, dout, inp, att, B, T, C, NH);
    }
}
