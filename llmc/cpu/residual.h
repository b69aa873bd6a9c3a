// Residual connection: out = inp1 + inp2.
// Its backward is the identity into both branches (d inp1 = d inp2 = dout), so the model
// needs no kernel for it: gpt2_backward keeps one gradient buffer for the residual stream
// and lets both branches read it (see "dresidual" in llmc/model/gpt2.h).
#pragma once

#include "round.h"   // floatx_round: outputs stored in the --precision format

static inline void residual_forward(float* out, const float* inp1, const float* inp2, size_t N) {
    PROFILE_OP("residual", OP_FWD, cost_residual_forward((double)N));
    #pragma omp parallel for
    for (size_t i = 0; i < N; i++) { out[i] = inp1[i] + inp2[i]; }
    floatx_round(out, N, ROUND_ACT);
}
