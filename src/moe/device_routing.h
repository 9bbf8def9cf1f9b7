// Routing on the GPU, fused with the capture write: the gate logits of a step's tokens become
// top-k logical expert ids and weights, and the same kernel writes the ids into the step's device
// capture buffer, so what is captured is exactly what the experts are given and nothing is copied
// to the host inside the step.
//
// The rules are those of moe/routing_rule.h, described by plain parameters a kernel can take;
// each token's arithmetic follows the CPU rule's (same operation order, ties to the lower id,
// sums in double), with exp evaluated in double and rounded, so scores agree with the CPU's to
// the last bit or within one rounding.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/context.h"
#include "core/tensor.h"
#include "moe/routing_rule.h"

namespace r3::moe {

// A rule's parameters (RoutingRule::parameters) as the kernel takes them, its correction bias on
// the device. The kernel runs kSoftmaxTopK (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE),
// kSigmoidGroupTopK (DeepSeek-V3, Kimi K2, GLM-4.5), kTopKSoftmax (GPT-OSS) and
// kSoftmaxGroupGreedy (DeepSeek-V2); DeepSeek-V4's sqrt-softplus rules have no kernel yet.
struct DeviceRoutingRule {
  using Kind = RuleKind;
  Kind kind = Kind::kSoftmaxTopK;
  int32_t k = 0;
  bool normalize = false;
  int32_t groups = 1;
  int32_t topk_groups = 1;
  float scaling = 1.0f;
  const float* bias = nullptr;  // device [experts] (kSigmoidGroupTopK)
};

// A host rule's parameters as the device kernel takes them, with its correction bias still on the
// host (the caller uploads it and points rule.bias at the copy). Throws for a rule without a
// device kernel (DeepSeek-V4's rules), naming it.
struct DeviceRuleDescription {
  DeviceRoutingRule rule;
  std::vector<float> bias;  // empty unless rule.kind is kSigmoidGroupTopK
};
DeviceRuleDescription describe_for_device(const RoutingRule& rule);

// Where the ids also go: row t of the step's capture buffer for this layer starts at
// capture + t * row_stride (the buffer is [tokens, moe_layers, k]: row_stride = moe_layers * k,
// capture = base + layer * k). nullptr: no capture (a routing that is not the capture point).
// Each row's routing margin (moe/routing_rule.h; NaN for a replayed row) goes to
// margins[t * margin_stride] when margins is set.
struct DeviceCaptureRows {
  int32_t* capture = nullptr;
  int64_t row_stride = 0;
  float* margins = nullptr;
  int64_t margin_stride = 0;
};

// Most experts a device rule routes over (DeepSeek-V3 and Kimi K2 have 256 and 384).
constexpr int64_t kMaxDeviceExperts = 512;

#if R3_WITH_CUDA
// Throws unless the routing kernel takes `rule` over `experts` experts.
void check_device_routing(const DeviceRoutingRule& rule, int64_t experts);

// logits: device F32 [tokens, experts] (left as is); forced: device [tokens, k] ids to replay or
// nullptr, with replayed: device [tokens] (1 = replay that row) or nullptr (every row replays);
// ids, weights: device [tokens, k]. Forced ids must have been checked on the host.
void route_on_device(backend::Context& ctx, const Tensor& logits, const DeviceRoutingRule& rule,
                     const int32_t* forced, const uint8_t* replayed, int32_t* ids, float* weights,
                     DeviceCaptureRows capture);
#endif

}  // namespace r3::moe
