// Loss scaling (Micikevicius et al., "Mixed Precision Training", 2018): FP16 gradients of a
// small loss underflow, its smallest subnormal is 2^-24 = 6e-8, so many gradient values
// become 0 before the optimizer sees them. Multiply the loss by S before the backward (every
// gradient is then S times larger, above the underflow), divide the gradients by S in fp32
// before the update. The mixed-precision iteration, as the lecture draws it:
//
//   master W (fp32) --round--> W (16-bit) --forward--> loss x S --backward--> S * grads (16-bit)
//        ^                                                                          |
//        +---- AdamW( grads / S ) <-- skip the step if any S * grad is inf/NaN <----+
//
// Dynamic scaling picks S without a hyper-parameter search: start high (--loss-scale-init,
// 65536), and
//   overflow (the gradient norm over EVERY rank is inf or NaN)  -> skip the update (AdamW's
//            t and moments unchanged), S = S / 2
//   --loss-scale-window clean steps in a row                   -> S = 2 S
// so S hovers just below the largest scale at which the gradients still fit. With a fixed
// scale (--loss-scale 1024) an overflow still skips the step but S stays.
// Where it acts: this file scales dloss (the gradient every token's loss starts from, so the
// whole backward carries S), GPT2.loss_scale divides the norm and AdamW's gradient factor by S
// (gpt2_update, dp_update_owned), and the norm is the global one: every rank takes the same
// decision. The step line prints S and the steps skipped so far.
#pragma once

#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include "../common.h"
#include "../model/gpt2.h"

typedef struct {
    int on;            // 0: --loss-scale off (S = 1, an overflow is a failure, llmc/train/guard.h)
    int dynamic;       // halve on overflow, double after `window` clean steps
    float scale;       // S
    int window;        // clean steps before S doubles
    int clean;         // clean steps since the last overflow or growth
    int skipped;       // steps skipped for overflow so far
    float min_scale;   // dynamic: below this (1, or the first scale if smaller) the overflow is not the
                       // gradients' scale: the forward pass itself overflows, and the run stops
} LossScaler;

static inline void loss_scale_init(LossScaler* s, const char* mode, float init, int window) {
    memset(s, 0, sizeof(*s));
    s->scale = 1.0f;
    s->window = window;
    if (strcmp(mode, "off") == 0) { return; }
    s->on = 1;
    s->dynamic = strcmp(mode, "dynamic") == 0;
    s->scale = s->dynamic ? init : (float)strtod(mode, NULL);
    s->min_scale = init < 1.0f ? init : 1.0f;
}

// At the step's start: the dloss the backward starts from, times S; the model learns S so that
// its update divides it out, and skips the update when the scaled gradients overflow.
static inline float loss_scale_dloss(LossScaler* s, GPT2* model, float dloss) {
    model->loss_scale = s->scale;
    if (s->on) { model->skip_nonfinite = 1; }
    return dloss * s->scale;
}

// After the update, with the (unscaled) global gradient norm it returned. Returns 1 when the
// step was skipped for overflow (the caller's guard then knows it is not a divergence). Only the
// gradients are judged: a forward pass that overflowed has non-finite gradients too, and a scale
// that keeps falling says so below.
static inline int loss_scale_update(LossScaler* s, int step, float norm) {
    if (!s->on) { return 0; }
    if (isfinite(norm)) {
        if (s->dynamic && ++s->clean >= s->window) { s->scale *= 2.0f; s->clean = 0; }
        return 0;
    }
    s->skipped++;
    s->clean = 0;
    float old = s->scale;
    if (s->dynamic) { s->scale *= 0.5f; }
    printf("step %d: gradients overflow at loss scale %g: update skipped, scale %g (%d skipped so far)\n", step + 1, old,
           s->scale, s->skipped);
    if (s->dynamic && s->scale < s->min_scale) {
        die("step %d: the loss scale fell to %g and the gradients still overflow: not the loss scale's doing, the forward "
            "pass or the model overflows (try --precision bf16, or a lower --lr)", step + 1, s->scale);
    }
    return 1;
}

// " | scale 32768 (2 skipped)" for the step line, "" when off
static inline const char* loss_scale_describe(const LossScaler* s, char* buf, size_t n) {
    if (!s->on) { buf[0] = 0; return buf; }
    snprintf(buf, n, "scale %g (%d skipped) | ", s->scale, s->skipped);
    return buf;
}
