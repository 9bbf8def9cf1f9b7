// The routing kernel (moe/device_routing.h): one thread per token, walking its experts in order
// exactly as the CPU rule does. A step routes at most a few thousand tokens over at most 512
// experts, so one thread per token keeps the CPU's sequential selection and sums (and with them
// its tie-breaking) at a cost of microseconds.
#include "backend/cuda/state.h"
#include "moe/device_routing.h"

namespace r3::moe {

namespace {

using Kind = DeviceRoutingRule::Kind;

// exp in double, rounded: within one rounding of the C library's float exp the CPU rule calls.
__device__ inline float exp_rounded(float x) { return static_cast<float>(exp(static_cast<double>(x))); }

// The CPU's topk_indices: insertion by value, equal values keep the lower index first.
__device__ void topk(const float* values, int64_t n, int32_t k, int32_t* out) {
  int32_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = values[i];
    int32_t at = kept;
    while (at > 0 && values[out[at - 1]] < v) --at;
    if (at >= k) continue;
    for (int32_t j = min(kept, k - 1); j > at; --j) out[j] = out[j - 1];
    out[at] = static_cast<int32_t>(i);
    kept = min(kept + 1, k);
  }
}

// In place, as ops::softmax: max, exp(v - max), the sum in double, v / sum rounded.
__device__ void softmax(float* v, int64_t n) {
  float max_value = v[0];
  for (int64_t i = 1; i < n; ++i) max_value = v[i] > max_value ? v[i] : max_value;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    v[i] = exp_rounded(__fsub_rn(v[i], max_value));
    sum = __dadd_rn(sum, static_cast<double>(v[i]));
  }
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(__ddiv_rn(static_cast<double>(v[i]), sum));
}

// weights[j] = scores[ids[j]] / (sum + eps) * scaling, in double, as the CPU's renormalised().
__device__ void renormalised(const float* scores, int32_t k, const int32_t* ids, float eps, float scaling,
                             float* weights) {
  double sum = 0;
  for (int32_t j = 0; j < k; ++j) sum = __dadd_rn(sum, static_cast<double>(scores[ids[j]]));
  const double denominator = __dadd_rn(sum, static_cast<double>(eps));
  for (int32_t j = 0; j < k; ++j) {
    weights[j] = static_cast<float>(
        __dmul_rn(__ddiv_rn(static_cast<double>(scores[ids[j]]), denominator), static_cast<double>(scaling)));
  }
}

__global__ void route_tokens(const float* __restrict__ logits, int64_t tokens, int64_t experts, DeviceRoutingRule rule,
                             const int32_t* __restrict__ forced, const uint8_t* __restrict__ replayed,
                             int32_t* __restrict__ ids_out, float* __restrict__ weights_out, DeviceCaptureRows capture) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= tokens) return;
  float scores[kMaxDeviceExperts], choice[kMaxDeviceExperts];
  const int32_t k = rule.k;
  int32_t* ids = ids_out + t * k;
  float* weights = weights_out + t * k;
  for (int64_t e = 0; e < experts; ++e) scores[e] = logits[t * experts + e];
  const bool replay = forced != nullptr && (replayed == nullptr || replayed[t] != 0);

  if (rule.kind == Kind::kSoftmaxTopK) {
    softmax(scores, experts);
    if (replay) for (int32_t j = 0; j < k; ++j) ids[j] = forced[t * k + j];
    else topk(scores, experts, k, ids);
    if (rule.normalize) renormalised(scores, k, ids, 0.0f, 1.0f, weights);
    else for (int32_t j = 0; j < k; ++j) weights[j] = scores[ids[j]];
  } else if (rule.kind == Kind::kSigmoidGroupTopK) {
    for (int64_t e = 0; e < experts; ++e) {
      scores[e] = __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_rounded(-scores[e])));
      choice[e] = __fadd_rn(scores[e], rule.bias[e]);
    }
    if (replay) {
      for (int32_t j = 0; j < k; ++j) ids[j] = forced[t * k + j];
    } else {
      // Group score: the sum of its two best choices; groups outside the best topk_groups masked.
      const int64_t group_size = experts / rule.groups;
      float group_score[64];
      for (int32_t g = 0; g < rule.groups; ++g) {
        int32_t best[2];
        const int32_t two = group_size < 2 ? static_cast<int32_t>(group_size) : 2;
        topk(choice + g * group_size, group_size, two, best);
        float sum = 0.0f;
        for (int32_t i = 0; i < two; ++i) sum = __fadd_rn(sum, choice[g * group_size + best[i]]);
        group_score[g] = sum;
      }
      int32_t kept[64];
      topk(group_score, rule.groups, rule.topk_groups, kept);
      for (int32_t g = 0; g < rule.groups; ++g) {
        bool keep = false;
        for (int32_t i = 0; i < rule.topk_groups; ++i) keep = keep || kept[i] == g;
        if (!keep) for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e) choice[e] = -INFINITY;
      }
      topk(choice, experts, k, ids);
    }
    if (rule.normalize) renormalised(scores, k, ids, 1e-20f, rule.scaling, weights);
    else for (int32_t j = 0; j < k; ++j) weights[j] = __fmul_rn(scores[ids[j]], rule.scaling);
  } else {  // kTopKSoftmax
    if (replay) for (int32_t j = 0; j < k; ++j) ids[j] = forced[t * k + j];
    else topk(scores, experts, k, ids);
    for (int32_t j = 0; j < k; ++j) weights[j] = scores[ids[j]];
    softmax(weights, k);
  }
  if (capture.capture != nullptr) {
    for (int32_t j = 0; j < k; ++j) capture.capture[t * capture.row_stride + j] = ids[j];
  }
}

}  // namespace

void route_on_device(backend::Context& ctx, const Tensor& logits, const DeviceRoutingRule& rule, const int32_t* forced,
                     const uint8_t* replayed, int32_t* ids, float* weights, DeviceCaptureRows capture) {
  R3_CHECK(logits.rank() == 2 && logits.is_contiguous() && logits.device() == Device::kCuda,
           "routing (cuda): logits must be a [tokens, experts] device tensor");
  const int64_t tokens = logits.dim(0), experts = logits.dim(1);
  R3_CHECK(experts >= 1 && experts <= kMaxDeviceExperts && rule.k >= 1 && rule.k <= experts,
           "routing (cuda): top-", rule.k, " of ", experts, " experts (at most ", kMaxDeviceExperts, ")");
  R3_CHECK(rule.kind != DeviceRoutingRule::Kind::kSigmoidGroupTopK ||
               (rule.bias != nullptr && rule.groups >= 1 && rule.groups <= 64 && experts % rule.groups == 0 &&
                rule.topk_groups >= 1 && rule.topk_groups <= rule.groups),
           "routing (cuda): grouped sigmoid routing needs a bias and 1 to 64 groups dividing ", experts, " experts");
  if (tokens == 0) return;
  constexpr int kThreads = 64;
  route_tokens<<<static_cast<unsigned>((tokens + kThreads - 1) / kThreads), kThreads, 0, ctx.cuda_state().stream>>>(
      logits.data<float>(), tokens, experts, rule, forced, replayed, ids, weights, capture);
  R3_CUDA_CHECK(cudaGetLastError());
}

}  // namespace r3::moe
