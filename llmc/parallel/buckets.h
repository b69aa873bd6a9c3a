// The backward hooks of bucketed DDP and ZeRO-1/2 (ZeRO-3 has its own, dp_zero3.h): as the
// backward completes a bucket's last unit (bucket_layout.h), the bucket goes to the
// communication thread, with the collective its mode says (DDP all-reduces, ZeRO reduce-scatters),
// while the backward goes on with the next blocks:
//
//   backward:  block 5  block 4 | block 3  block 2 | block 1  block 0  embed/root
//   comm:                       bucket 0's          bucket 1's          bucket 2's collective
#pragma once

#include "bucket_layout.h"

static inline floatX* bucket_grad_buffer(DataParallel* dp, int unit) {
    Bucket* bk = &dp->buckets[dp->unit_bucket[unit]];
    if (bk->grad == NULL) { bk->grad = dp_take_grad_bucket(dp, bk); }
    return bk->grad;
}

// A bucket whose last unit is done goes to the communication thread: the mode says with
// which collective (bucket_ready: DDP all-reduces, ZeRO reduce-scatters). The count starts
// again for the next backward pass.
static inline void bucket_unit_done(DataParallel* dp, int unit) {
    int b = dp->unit_bucket[unit];
    Bucket* bk = &dp->buckets[b];
    if (--bk->pending > 0) { return; }
    bk->pending = (int)bk->units.size();
    if (dp->sync) { dp->ops->bucket_ready(dp, b); }
}

static inline void bucket_backward_begin(void* ctx, ParameterTensors* root, ParameterTensors* root_grads) {
    (void)root;
    DataParallel* dp = (DataParallel*)ctx;
    if (dp->root_unit >= 0) { dp_root_pointers(dp, bucket_grad_buffer(dp, dp->root_unit), root_grads); }
}
static inline void bucket_block_backward_begin(void* ctx, int l, BlockWeights* w, BlockWeights* grads) {
    (void)w;
    DataParallel* dp = (DataParallel*)ctx;
    int u = dp_unit_of_layer(dp, l);
    dp_block_pointers(dp, u, bucket_grad_buffer(dp, u), grads);
    dp->block_start = trace_now();
}
// the compute track's event for one block's pass ("forward" or "backward"), begun at dp->block_start
static inline void dp_trace_block(const DataParallel* dp, const char* pass, int l) {
    char name[32];
    snprintf(name, sizeof(name), "%s block %d", pass, l);
    trace_event(name, 0, dp->block_start);
}
static inline void bucket_block_backward_end(void* ctx, int l) {
    DataParallel* dp = (DataParallel*)ctx;
    dp_trace_block(dp, "backward", l);
    bucket_unit_done(dp, dp_unit_of_layer(dp, l));
}
static inline void bucket_backward_end(void* ctx) {
    DataParallel* dp = (DataParallel*)ctx;
    // the root's unit is done in the pass that ran the head or the embedding (a pipeline stage's
    // other chunks run passes without them)
    if (dp->root_unit >= 0 && dp->model->root_in_pass && !dp->root_deferred) { bucket_unit_done(dp, dp->root_unit); }
}

// A pipeline stage's root (the tied wte among it) is whole only after the embedding group has
// summed the first and the last stage's parts (llmc/parallel/pp.h), after the step's last
// backward: the pipeline calls this then, and the root's bucket goes to the communication thread.
static inline void dp_root_done(void* ctx) {
    DataParallel* dp = (DataParallel*)ctx;
    if (!dp->root_deferred || dp->root_unit < 0 || dp->buckets.empty()) { return; }
    int sync = dp->sync;
    dp->sync = 1;
    bucket_unit_done(dp, dp->root_unit);
    dp->sync = sync;
}

static inline void bucket_install_hooks(DataParallel* dp, const char* name) {
    GPT2Hooks h = {};
    h.backward_begin = bucket_backward_begin;
    h.block_backward_begin = bucket_block_backward_begin;
    h.block_backward_end = bucket_block_backward_end;
    h.backward_end = bucket_backward_end;
    dp_install_hooks(dp, name, h);
}
