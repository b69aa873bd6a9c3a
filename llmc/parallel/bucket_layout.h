// Gradient buckets: how bucketed DDP and ZeRO-1/2/3 lay the parameters out in buffers that one
// collective moves whole, and what each rank keeps of every bucket (its shard).
//
// Units. The backward pass finishes the gradients one block at a time, last block first, and
// the tensors outside the blocks (wte, wpe, lnfw, lnfb) last of all: wte is also the LM head,
// and its gradient is complete only after the encoder's backward. So the parameters fall into
// units, read off the parameter table (llmc/model/params.h):
//   unit l  (l = 0 .. nl-1)  the stage's l-th block (llmc/model/params.h's local layer index): slice l
//                            of every layered tensor
//   unit nl ("root")         every tensor outside the blocks that this rank holds, in table order
// ready in the order nl-1, ..., 1, 0, root. On one rank holding the whole model: L + 1 units,
// the root = wte, wpe, lnfw, lnfb. An interleaved pipeline stage (llmc/parallel/pp.h) runs its
// v chunks in separate backward passes: a bucket then never spans two chunks, and the root gets
// a bucket of its own, so that every bucket is complete at the end of one pass.
//
// Buckets. A bucket is a run of consecutive units in that order, up to --bucket-mb (ZeRO-3: one
// unit each); its gradients live packed in one contiguous buffer (each unit's tensors one after
// another), so one collective moves the whole bucket:
//
//   ready order ->   unit 5   unit 4 | unit 3   unit 2 | unit 1   unit 0   root
//                    [  bucket 0    ]  [  bucket 1    ]  [     bucket 2          ] 0-pad
//
// The backward writes straight into the bucket: the placement hooks (buckets.h, dp_zero3.h) give
// the passes (llmc/model/gpt2.h) pointers into it instead of into the model's flat gradient
// buffer, which is freed. Every bucket is padded with zeros to a multiple of the number of
// ranks N, so each rank owns an equal block of it, its shard:
//
//   bucket of P = N shard values:  | rank 0's shard | rank 1's shard | ... | rank N-1's shard |
//                                  [0, shard)        [shard, 2 shard)      [(N-1) shard, P)
// Psi_pad = sum of the padded bucket sizes.
#pragma once

#include <algorithm>
#include "dp_mode.h"

// ---------------------------------------------------------------------------------------
// The layout

static inline int dp_unit_of_layer(const DataParallel* dp, int l) { return gpt2_place_local(&dp->model->place, l); }

static inline void dp_build_layout(DataParallel* dp, int one_unit_per_bucket) {
    GPT2* model = dp->model;
    const ParamInfo* info = model->param_info;
    int nl = gpt2_local_layers(model);   // the stage's layers (all its chunks)
    int per_chunk = gpt2_slot_layers(model), chunked = model->place.chunks > 1;
    dp->unit_slices.assign(nl, std::vector<Slice>());
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (!info[i].layered || info[i].numel == 0 || (dp->skip_experts && info[i].experts)) { continue; }
        if (table_block_tensor(i) < 0) { die("parameter table: '%s' is layered but not a BlockWeights tensor", info[i].name); }
        size_t n = info[i].numel / (size_t)info[i].shape[0];   // one block's slice
        for (int l = 0; l < nl; l++) {
            int slice = param_local_slice(&info[i], &model->place, l);   // -1: the block has none (MoE / dense)
            if (slice < 0) { continue; }
            std::vector<Slice>& unit = dp->unit_slices[l];
            size_t packed = unit.empty() ? 0 : unit.back().packed + unit.back().count;
            unit.push_back({i, info[i].offset + (size_t)slice * n, n, packed});
        }
    }
    std::vector<Slice> root;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (info[i].layered || info[i].numel == 0) { continue; }
        size_t packed = root.empty() ? 0 : root.back().packed + root.back().count;
        root.push_back({i, info[i].offset, info[i].numel, packed});
    }
    dp->root_unit = root.empty() ? -1 : nl;
    if (!root.empty()) { dp->unit_slices.push_back(root); }
    dp->num_units = (int)dp->unit_slices.size();
    dp->one_unit_per_bucket = one_unit_per_bucket;
    // ready order: nl-1 .. 0, then the root
    std::vector<int> order;
    for (int l = nl - 1; l >= 0; l--) { order.push_back(l); }
    if (dp->root_unit >= 0) { order.push_back(dp->root_unit); }
    dp->unit_bucket.assign(dp->num_units, -1);
    dp->unit_offset.assign(dp->num_units, 0);
    dp->buckets.clear();
    int prev_chunk = -1;
    for (int u : order) {
        size_t n = 0;
        for (const Slice& s : dp->unit_slices[u]) { n += s.count; }
        int chunk = u == dp->root_unit ? -1 : u / per_chunk;
        bool fits = !dp->buckets.empty() && !one_unit_per_bucket &&
                    (dp->buckets.back().count + n) * sizeof(floatX) <= dp->bucket_bytes &&
                    (!(chunked || dp->root_deferred) || chunk == prev_chunk);
        prev_chunk = chunk;
        if (!fits) { dp->buckets.push_back(Bucket{}); }
        Bucket* b = &dp->buckets.back();
        dp->unit_bucket[u] = (int)dp->buckets.size() - 1;
        dp->unit_offset[u] = b->count;
        for (Slice s : dp->unit_slices[u]) {
            s.packed += b->count;
            b->slices.push_back(s);
        }
        b->units.push_back(u);
        b->count += n;
    }
    dp->psi_pad = 0;
    for (Bucket& b : dp->buckets) {
        b.pending = (int)b.units.size();
        b.padded = ceil_div(b.count, dp->N) * dp->N;
        b.shard = b.padded / dp->N;
        dp->psi_pad += b.padded;
    }
}

// pointers of a unit's tensors inside a packed bucket buffer: a block's BlockWeights, or the
// root's fields of ParameterTensors
static inline void dp_block_pointers(DataParallel* dp, int unit, floatX* bucket_base, BlockWeights* w) {
    size_t base = dp->unit_offset[unit];
    for (const Slice& s : dp->unit_slices[unit]) {
        *block_tensor(w, table_block_tensor(s.tensor)) = bucket_base + base + s.packed;
    }
}
static inline void dp_root_pointers(DataParallel* dp, floatX* bucket_base, ParameterTensors* p) {
    size_t base = dp->unit_offset[dp->root_unit];
    for (const Slice& s : dp->unit_slices[dp->root_unit]) { *param_tensor(p, s.tensor) = bucket_base + base + s.packed; }
}

// copy between the table-ordered flat buffer and a packed bucket, over the bucket range
// [lo, hi) (to_packed = 1: flat -> packed)
static inline void dp_copy_range(const Bucket* b, floatX* flat, floatX* packed, size_t lo, size_t hi, int to_packed) {
    for (const Slice& s : b->slices) {
        size_t a = std::max(lo, s.packed), e = std::min(hi, s.packed + s.count);
        if (a >= e) { continue; }
        floatX* f = flat + s.flat + (a - s.packed);
        floatX* p = packed + a;
        if (to_packed) { copy_device_to_device(p, f, (e - a) * sizeof(floatX)); }
        else { copy_device_to_device(f, p, (e - a) * sizeof(floatX)); }
    }
}

// ---------------------------------------------------------------------------------------
// What each bucket keeps, by ZeRO stage (0: DDP):
//   gradients    the whole bucket (stages 0, 1), or this rank's block only (2, 3: the whole
//                bucket exists only while its reduce-scatter is in flight)
//   parameters   the model's flat buffer (0-2), or this rank's block only (3)
//   optimizer    m, v (and master weights) of the range this rank updates: the whole bucket
//                (0), or its block (1-3)
// and the segments the update walks. The model's flat gradient buffer goes.
static inline void buckets_layout(DataParallel* dp, int stage) { dp_build_layout(dp, stage == 3); }   // ZeRO-3: a bucket per unit

static inline void buckets_init(DataParallel* dp, int stage) {
    GPT2* model = dp->model;
    size_t a = sizeof(floatX);
    buckets_layout(dp, stage);
    for (Bucket& b : dp->buckets) {
        size_t lo, n, hi;
        bucket_owned(dp, &b, stage, &lo, &n, &hi);
        if (stage <= 1) {
            b.grad = (floatX*)dp_alloc(dp, MEM_GRADS, b.padded * a);
            device_memset_zero(b.grad, b.padded * a);
        } else {
            b.grad_shard = (floatX*)dp_alloc(dp, MEM_GRADS, b.shard * a);
            device_memset_zero(b.grad_shard, b.shard * a);
        }
        // a packed copy of the parameters of the owned range, to seed shards and masters
        floatX* packed = dp_take(dp, MEM_COMM, b.padded, 1);
        dp_copy_range(&b, model->params_memory, packed, lo, hi, 1);
        if (stage == 3) {
            b.param_shard = (floatX*)dp_alloc(dp, MEM_PARAMS, b.shard * a);
            copy_device_to_device(b.param_shard, packed + lo, b.shard * a);
        }
        b.m = dp->opt->alloc(dp, MEM_OPTIM, n);
        b.v = dp->opt->alloc(dp, MEM_OPTIM, n);
        if (dp_has_master(dp)) {
            b.master = dp->opt->alloc(dp, MEM_MASTER, n);
            dp->opt->seed_master(b.master, packed + lo, n);
        }
        dp_give(dp, MEM_COMM, packed, b.padded);
        for (const Slice& s : b.slices) {
            size_t x = std::max(lo, s.packed), e = std::min(hi, s.packed + s.count);
            if (x >= e) { continue; }
            OptSegment seg;
            seg.tensor = s.tensor;
            seg.n = e - x;
            seg.param = stage == 3 ? b.param_shard + (x - lo) : model->params_memory + s.flat + (x - s.packed);
            seg.grad = stage <= 1 ? b.grad + x : b.grad_shard + (x - lo);
            seg.m = b.m + (x - lo);
            seg.v = b.v + (x - lo);
            seg.master = b.master ? b.master + (x - lo) : NULL;
            seg.flat = s.flat + (x - s.packed);
            dp->segments.push_back(seg);
        }
    }
    gpt2_release_grads(model);
    dp->mem_live[MEM_GRADS] -= dp->psi * a;
}

// the gradients that persist between steps: the whole bucket (DDP, ZeRO-1) or this rank's
// block (ZeRO-2/3)
static inline void buckets_zero_grad(DataParallel* dp) {
    for (Bucket& b : dp->buckets) {
        if (b.grad_shard) { device_memset_zero(b.grad_shard, b.shard * sizeof(floatX)); }
        else if (b.grad) { device_memset_zero(b.grad, b.padded * sizeof(floatX)); }
    }
}

// ---------------------------------------------------------------------------------------
// ZeRO-2 and ZeRO-3 keep no gradient bucket between steps: one is taken (zeroed) when its
// first unit starts its backward, and given back once reduce-scattered (DDP and ZeRO-1 keep all
// buckets for the whole run). At most DP_MAX_IN_FLIGHT such buckets wait for their
// reduce-scatter: if communication falls behind, the backward waits instead of allocating more
// (else ZeRO-2 would, at worst, hold as much gradient memory as DDP).
#define DP_MAX_IN_FLIGHT 2
static inline floatX* dp_take_grad_bucket(DataParallel* dp, Bucket* bk) {
    while ((int)dp->in_flight.size() >= DP_MAX_IN_FLIGHT) {
        dp_wait(dp, dp->in_flight.front());
        dp->in_flight.pop_front();
    }
    return dp_take(dp, MEM_GRADS, bk->padded, 1);
}
