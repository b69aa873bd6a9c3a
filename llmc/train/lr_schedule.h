// Learning-rate schedule: linear warmup over the first `warmup` steps, then cosine decay
// from lr down to lr * final_frac at the last step. step counts from 0.
#pragma once
#include <math.h>

static inline float lr_at_step(int step, int total_steps, float lr, int warmup, float final_frac) {
    if (step < warmup) { return lr * (float)(step + 1) / (float)warmup; }
    if (total_steps <= warmup + 1) { return lr; }
    float progress = (float)(step - warmup) / (float)(total_steps - 1 - warmup);   // 0 .. 1
    float cosine = 0.5f * (1.0f + cosf(3.14159265358979f * progress));             // 1 .. 0
    float min_lr = lr * final_frac;
    return min_lr + (lr - min_lr) * cosine;
}
