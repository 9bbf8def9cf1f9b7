// Softmax top-k routing of one token by one warp with the token's scores in registers
// (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE at up to 32 * kSlots experts and k <= 32): the same bits
// as routing_detail::route_token (routing_parts.cuh) for that rule, in fewer trips to shared
// memory on a decode step's critical path. Lane l holds the scores of experts l, l + 32, ...:
// the max, the exps and the divisions run across the lanes with each lane's kSlots in flight
// together; each of the k selection rounds scans registers, not shared memory, and hands the
// chosen id and score to lane r (choice r); the renormalising sum takes the k scores from those
// lanes in choice order. The double sum of the exps runs as a warp tree when no addition can
// round (moe/exact_order_sum.h: a spread below 14.6 between the row's logits), which gives the
// index order's bits; otherwise it runs in index order on lane 0 over a shared-memory row.
// Internal to moe/cuda.
#pragma once

#include <cstdint>

#include "moe/cuda/routing_parts.cuh"
#include "moe/exact_order_sum.h"
#include "moe/device_routing.h"

namespace r3::moe::routing_detail {

// The float whose ordered_key is `key` (ordered_key's inverse).
__device__ inline float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) != 0 ? key & 0x7fffffffu : ~key);
}

// Routes token t under a kSoftmaxTopK rule; every lane of the warp calls it. `row`: shared
// scratch of 32 * kSlots floats for the warp. Arguments as route_token's.
template <int kSlots>
__device__ inline void route_softmax_topk_in_registers(const float* __restrict__ logits, int64_t t, int64_t experts,
                                                       const DeviceRoutingRule& rule, const int32_t* __restrict__ forced,
                                                       const uint8_t* __restrict__ replayed,
                                                       int32_t* __restrict__ ids_out, float* __restrict__ weights_out,
                                                       const DeviceCaptureRows& capture, float* row, int lane) {
  const int32_t k = rule.k;
  float v[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int64_t e = lane + s * kWarp;
    v[s] = e < experts ? __ldcg(logits + t * experts + e) : -INFINITY;
  }
  // Softmax as warp_softmax: max, exp(v - max), the double sum in index order, v / sum rounded.
  float max_value = -INFINITY;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) max_value = fmaxf(max_value, v[s]);
  for (int offset = kWarp / 2; offset > 0; offset /= 2) max_value = fmaxf(max_value, __shfl_xor_sync(0xffffffffu, max_value, offset));
  bool exact = true;  // every exp adds exactly (moe/exact_order_sum.h)
  double lane_sum = 0;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int64_t e = lane + s * kWarp;
    if (e < experts) {
      v[s] = exp_rounded(__fsub_rn(v[s], max_value));
      exact = exact && adds_exactly(v[s]);
      lane_sum = __dadd_rn(lane_sum, static_cast<double>(v[s]));
    }
  }
  double sum;
  if (__all_sync(0xffffffffu, exact) && experts <= kExactSumMaxTerms) {
    // No addition rounds: a tree over the lanes gives the index order's bits in 5 steps, not a
    // chain of `experts` additions on lane 0.
    sum = lane_sum;
    for (int offset = kWarp / 2; offset > 0; offset /= 2) sum = __dadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, offset));
  } else {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int64_t e = lane + s * kWarp;
      if (e < experts) row[e] = v[s];
    }
    __syncwarp();
    sum = index_order_sum(row, experts, lane);
    __syncwarp();  // lane 0 has read the row before it is overwritten with the scores
  }
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int64_t e = lane + s * kWarp;
    if (e < experts) {
      v[s] = static_cast<float>(__ddiv_rn(static_cast<double>(v[s]), sum));
      row[e] = v[s];
    }
  }
  __syncwarp();

  // Lane r < k ends with choice r: its id and score.
  int32_t my_id = 0;
  float my_score = 0.0f;
  float margin = __int_as_float(0x7fc00000);  // NaN: a replayed row was not chosen
  const bool replay = forced != nullptr && (replayed == nullptr || replayed[t] != 0);
  if (replay) {
    if (lane < k) {
      my_id = forced[t * k + lane];
      my_score = row[my_id];
    }
  } else {
    // warp_topk's rounds over registers: the lane's best untaken score (the first of equals),
    // then the largest key and the lowest id holding it.
    uint32_t taken = 0;  // bit s: slot s chosen
    float last = 0.0f;
    for (int32_t r = 0; r < k; ++r) {
      float best = -INFINITY;
      int32_t best_i = -1;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int64_t e = lane + s * kWarp;
        if (e < experts && (taken >> s & 1u) == 0 && (best_i < 0 || v[s] > best)) {
          best = v[s];
          best_i = static_cast<int32_t>(e);
        }
      }
      const uint32_t key = best_i < 0 ? 0u : ordered_key(best);
      const uint32_t top = __reduce_max_sync(0xffffffffu, key);
      const auto chosen = static_cast<int32_t>(
          __reduce_min_sync(0xffffffffu, best_i >= 0 && key == top ? static_cast<uint32_t>(best_i) : 0xffffffffu));
      if (chosen % kWarp == lane) taken |= 1u << (chosen / kWarp);
      last = key_value(top);
      if (lane == r) {
        my_id = chosen;
        my_score = last;
      }
    }
    if (capture.margins != nullptr) {
      // warp_margin: the k-th choice's score minus the best score not taken.
      float best = -INFINITY;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        if (lane + s * kWarp < experts && (taken >> s & 1u) == 0) best = fmaxf(best, v[s]);
      }
      for (int offset = kWarp / 2; offset > 0; offset /= 2) best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, offset));
      margin = __fsub_rn(last, best);
    }
  }

  float weight = my_score;
  if (rule.normalize) {
    // renormalised with eps 0 and scaling 1: the k scores' double sum in choice order.
    double chosen_sum = 0;
    for (int32_t j = 0; j < k; ++j) {
      const float score = __shfl_sync(0xffffffffu, my_score, j);
      if (lane == 0) chosen_sum = __dadd_rn(chosen_sum, static_cast<double>(score));
    }
    const double denominator = __dadd_rn(__shfl_sync(0xffffffffu, chosen_sum, 0), 0.0);
    weight = static_cast<float>(__dmul_rn(__ddiv_rn(static_cast<double>(my_score), denominator), 1.0));
  }
  if (lane < k) {
    ids_out[t * k + lane] = my_id;
    weights_out[t * k + lane] = weight;
    if (capture.capture != nullptr) capture.capture[t * capture.row_stride + lane] = my_id;
  }
  if (capture.margins != nullptr && lane == 0) capture.margins[t * capture.margin_stride] = margin;
}

}  // namespace r3::moe::routing_detail
