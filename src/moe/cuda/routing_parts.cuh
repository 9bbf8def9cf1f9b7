// The routing kernel's per-token work (moe/device_routing.h), shared by the routing kernel
// (sm90_routing.cu) and the monolithic MoE kernel (sm90_monolithic_moe.cu), so both give the same bits. One
// warp per token. The per-expert work (the scores, their exp, bias, each weight's division) runs
// across the lanes, each element with the CPU rule's arithmetic; the steps whose order matters
// for the bits (the double sums) run on lane 0 in the CPU's order; the top-k selections are k
// rounds of a warp argmax (two warp reductions) that prefers the lower id on equal values, which
// is the CPU's stable order. Scores must be finite (NaN logits are outside the contract: the CPU
// and the GPU may then choose differently). Internal to moe/cuda.
#pragma once

#include <cstdint>

#include "moe/device_routing.h"

namespace r3::moe::routing_detail {

using Kind = DeviceRoutingRule::Kind;

// exp in double, rounded: within one rounding of the C library's float exp the CPU rule calls.
__device__ inline float exp_rounded(float x) { return static_cast<float>(exp(static_cast<double>(x))); }

constexpr int kWarp = 32;

// A float's bits as an unsigned key with the float's order (-0 below +0; no NaN).
__device__ inline uint32_t ordered_key(float v) {
  const uint32_t bits = __float_as_uint(v);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// The k best of values[0, n) in order (equal values: lower index first), as the CPU's topk_indices,
// by the whole warp; every lane gets the same out[]. `taken` is scratch of n flags. Lane l owns
// the entries l, l + 32, ...: it alone reads and writes their flags (here and in warp_margin), so
// the rounds need no barrier. Each round: the lane's best untaken entry (the first of equals),
// then two warp reductions, the largest value and the lowest index holding it.
__device__ inline void warp_topk(const float* values, int64_t n, int32_t k, int32_t* out, uint8_t* taken, int lane) {
  for (int64_t i = lane; i < n; i += kWarp) taken[i] = 0;
  for (int32_t r = 0; r < k; ++r) {
    float best = -INFINITY;
    int32_t best_i = -1;
    for (int64_t i = lane; i < n; i += kWarp) {
      if (!taken[i] && (best_i < 0 || values[i] > best)) {
        best = values[i];
        best_i = static_cast<int32_t>(i);
      }
    }
    const uint32_t key = best_i < 0 ? 0u : ordered_key(best);  // 0: below every value (-inf is 0x007fffff)
    const uint32_t top = __reduce_max_sync(0xffffffffu, key);
    const auto chosen = static_cast<int32_t>(
        __reduce_min_sync(0xffffffffu, best_i >= 0 && key == top ? static_cast<uint32_t>(best_i) : 0xffffffffu));
    out[r] = chosen;
    if (chosen % kWarp == lane) taken[chosen] = 1;
  }
  __syncwarp();
}

// A free row's routing margin, as the CPU's choose(): the k-th choice's value minus the best value
// not taken (warp_topk left the choices taken), -inf when every value was taken.
__device__ inline float warp_margin(const float* values, int64_t n, const uint8_t* taken, int32_t last, int lane) {
  float best = -INFINITY;
  for (int64_t i = lane; i < n; i += kWarp) {
    if (!taken[i]) best = fmaxf(best, values[i]);
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, offset));
  return __fsub_rn(values[last], best);
}

// The double sum of v[0, n) in index order, as the CPU's softmax adds it, on lane 0 and given to
// every lane. Unrolled so that the shared-memory loads run ahead of the chain of additions (the
// serial sum over a layer's 128 experts is on every decode layer's critical path).
__device__ inline double index_order_sum(const float* v, int64_t n, int lane) {
  double sum = 0;
  if (lane == 0) {
#pragma unroll 8
    for (int64_t i = 0; i < n; ++i) sum = __dadd_rn(sum, static_cast<double>(v[i]));
  }
  return __shfl_sync(0xffffffffu, sum, 0);
}

// In place, as ops::softmax: max, exp(v - max), the sum in double in index order, v / sum rounded.
__device__ inline void warp_softmax(float* v, int64_t n, int lane) {
  float max_value = -INFINITY;
  for (int64_t i = lane; i < n; i += kWarp) max_value = fmaxf(max_value, v[i]);
  for (int offset = kWarp / 2; offset > 0; offset /= 2) max_value = fmaxf(max_value, __shfl_xor_sync(0xffffffffu, max_value, offset));
  for (int64_t i = lane; i < n; i += kWarp) v[i] = exp_rounded(__fsub_rn(v[i], max_value));
  __syncwarp();
  const double sum = index_order_sum(v, n, lane);
  for (int64_t i = lane; i < n; i += kWarp) v[i] = static_cast<float>(__ddiv_rn(static_cast<double>(v[i]), sum));
  __syncwarp();
}

// weights[j] = scores[ids[j]] / (sum + eps) * scaling, in double, as the CPU's renormalised(): the
// sum in choice order on lane 0, then lane j computes weight j.
__device__ inline void renormalised(const float* scores, int32_t k, const int32_t* ids, float eps, float scaling,
                             float* weights, int lane) {
  double sum = 0;
  if (lane == 0) {
    for (int32_t j = 0; j < k; ++j) sum = __dadd_rn(sum, static_cast<double>(scores[ids[j]]));
  }
  const double denominator = __dadd_rn(__shfl_sync(0xffffffffu, sum, 0), static_cast<double>(eps));
  for (int32_t j = lane; j < k; j += kWarp) {
    weights[j] = static_cast<float>(
        __dmul_rn(__ddiv_rn(static_cast<double>(scores[ids[j]]), denominator), static_cast<double>(scaling)));
  }
}

struct WarpScratch {
  float scores[kMaxDeviceExperts];
  float choice[kMaxDeviceExperts];
  uint8_t taken[kMaxDeviceExperts];
  float group_score[64];
  int32_t ids[kMaxDeviceExperts];  // k <= experts
  int32_t best[2];
};

// Sets the choices of every group outside the rule's topk_groups best w.group_score entries to
// `masked`, as the CPU's mask_ineligible_groups.
__device__ inline void mask_ineligible_groups(WarpScratch& w, const DeviceRoutingRule& rule, int64_t experts, float masked,
                                       int lane) {
  const int64_t group_size = experts / rule.groups;
  int32_t kept[64];
  warp_topk(w.group_score, rule.groups, rule.topk_groups, kept, w.taken, lane);
  for (int64_t e = lane; e < experts; e += kWarp) {
    const int64_t g = e / group_size;
    bool keep = false;
    for (int32_t i = 0; i < rule.topk_groups; ++i) keep = keep || kept[i] == g;
    if (!keep) w.choice[e] = masked;
  }
  __syncwarp();
}

// Routes token t (one warp; every lane calls it): its logits row -> k ids and weights, written
// to ids_out / weights_out [t * k, ...) and to the capture rows, with the row's margin. The logits
// are read with L1-bypassing loads, so a kernel may route logits its other blocks wrote (after
// waiting for them).
__device__ inline void route_token(const float* __restrict__ logits, int64_t t, int64_t experts,
                                   const DeviceRoutingRule& rule, const int32_t* __restrict__ forced,
                                   const uint8_t* __restrict__ replayed, int32_t* __restrict__ ids_out,
                                   float* __restrict__ weights_out, const DeviceCaptureRows& capture, WarpScratch& w,
                                   int lane) {
  float* scores = w.scores;
  float* choice = w.choice;
  int32_t* ids = w.ids;
  const int32_t k = rule.k;
  float* weights = weights_out + t * k;
  for (int64_t e = lane; e < experts; e += kWarp) scores[e] = __ldcg(logits + t * experts + e);
  __syncwarp();
  const bool replay = forced != nullptr && (replayed == nullptr || replayed[t] != 0);
  auto take_forced = [&] {
    for (int32_t j = lane; j < k; j += kWarp) ids[j] = forced[t * k + j];
    __syncwarp();
  };
  float margin = __int_as_float(0x7fc00000);  // NaN: a replayed row was not chosen
  // After the free selection of k among `values`: the row's margin (only computed when kept).
  auto note_margin = [&](const float* values) {
    if (capture.margins != nullptr) margin = warp_margin(values, experts, w.taken, ids[k - 1], lane);
  };

  if (rule.kind == Kind::kSoftmaxTopK) {
    warp_softmax(scores, experts, lane);
    if (replay) {
      take_forced();
    } else {
      warp_topk(scores, experts, k, ids, w.taken, lane);
      note_margin(scores);
    }
    if (rule.normalize) renormalised(scores, k, ids, 0.0f, 1.0f, weights, lane);
    else for (int32_t j = lane; j < k; j += kWarp) weights[j] = scores[ids[j]];
  } else if (rule.kind == Kind::kSigmoidGroupTopK) {
    for (int64_t e = lane; e < experts; e += kWarp) {
      scores[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_rounded(-scores[e])));
      choice[e] = __fadd_rn(scores[e], rule.bias[e]);
    }
    __syncwarp();
    if (replay) {
      take_forced();
    } else {
      // Group score: the sum of its two best choices (best first, as the CPU adds them); the
      // groups outside the best topk_groups are masked.
      const int64_t group_size = experts / rule.groups;
      const int32_t two = group_size < 2 ? static_cast<int32_t>(group_size) : 2;
      for (int32_t g = 0; g < rule.groups; ++g) {
        warp_topk(choice + g * group_size, group_size, two, w.best, w.taken, lane);
        if (lane == 0) {
          float sum = 0.0f;
          for (int32_t i = 0; i < two; ++i) sum = __fadd_rn(sum, choice[g * group_size + w.best[i]]);
          w.group_score[g] = sum;
        }
        __syncwarp();
      }
      mask_ineligible_groups(w, rule, experts, -INFINITY, lane);
      warp_topk(choice, experts, k, ids, w.taken, lane);
      note_margin(choice);
    }
    if (rule.normalize) renormalised(scores, k, ids, 1e-20f, rule.scaling, weights, lane);
    else for (int32_t j = lane; j < k; j += kWarp) weights[j] = __fmul_rn(scores[ids[j]], rule.scaling);
  } else if (rule.kind == Kind::kSoftmaxGroupGreedy) {
    warp_softmax(scores, experts, lane);
    if (replay) {
      take_forced();
    } else {
      for (int64_t e = lane; e < experts; e += kWarp) choice[e] = scores[e];
      __syncwarp();
      if (rule.topk_groups < rule.groups) {
        // Group score: the group's largest probability; the other groups' choices become 0.
        const int64_t group_size = experts / rule.groups;
        for (int32_t g = 0; g < rule.groups; ++g) {
          float m = -INFINITY;
          for (int64_t i = lane; i < group_size; i += kWarp) m = fmaxf(m, choice[g * group_size + i]);
          for (int offset = kWarp / 2; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
          if (lane == 0) w.group_score[g] = m;
        }
        __syncwarp();
        mask_ineligible_groups(w, rule, experts, 0.0f, lane);
      }
      warp_topk(choice, experts, k, ids, w.taken, lane);
      note_margin(choice);
    }
    if (lane == 0) for (int32_t j = 0; j < k; ++j) weights[j] = __fmul_rn(scores[ids[j]], rule.scaling);
  } else {  // kTopKSoftmax
    if (replay) {
      take_forced();
    } else {
      warp_topk(scores, experts, k, ids, w.taken, lane);
      note_margin(scores);
    }
    if (lane == 0) {
      for (int32_t j = 0; j < k; ++j) choice[j] = scores[ids[j]];
    }
    __syncwarp();
    warp_softmax(choice, k, lane);
    if (lane == 0) for (int32_t j = 0; j < k; ++j) weights[j] = choice[j];
  }
  __syncwarp();
  for (int32_t j = lane; j < k; j += kWarp) {
    ids_out[t * k + j] = ids[j];
    if (capture.capture != nullptr) capture.capture[t * capture.row_stride + j] = ids[j];
  }
  if (capture.margins != nullptr && lane == 0) capture.margins[t * capture.margin_stride] = margin;
}


}  // namespace r3::moe::routing_detail
