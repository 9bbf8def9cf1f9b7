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

class DeviceCapturedRouting;
class DevicePhysicalRouting;
class DeviceExpertMap;
class PhysicalExperts;

// A MoE layer's routing of a step on the device, past its capture point: the logical ids
// [tokens, k] and weights [tokens, k] (device) that route_on_device wrote, having written the ids
// into the step's capture rows in the same kernel (unless the step captures nothing: a benchmark
// measuring capture's cost). Only route_on_device makes one; the EPLB map takes nothing else, and
// the experts take only the map's DevicePhysicalRouting. So on the GPU, as with CapturedRouting on
// the CPU, no path can remap ids to replicas or run experts before the capture write.
class DeviceCapturedRouting {
 public:
  const int32_t* ids() const { return ids_; }
  const float* weights() const { return weights_; }
  int64_t tokens() const { return tokens_; }
  int64_t k() const { return k_; }

 private:
  DeviceCapturedRouting(const int32_t* ids, const float* weights, int64_t tokens, int64_t k)
      : ids_(ids), weights_(weights), tokens_(tokens), k_(k) {}
  friend DeviceCapturedRouting route_on_device(backend::Context& ctx, const Tensor& logits,
                                               const DeviceRoutingRule& rule, const int32_t* forced,
                                               const uint8_t* replayed, int32_t* ids, float* weights,
                                               DeviceCaptureRows capture);
  const int32_t* ids_;
  const float* weights_;
  int64_t tokens_, k_;
};

// The same routing with each pair's physical expert: what the experts take. It comes out of the
// EPLB map (DeviceExpertMap::map, or map_on_host for a map function a test put in place), or,
// for a layer without replicas, from the captured routing itself (its logical experts are its
// physical ones). The weights stay the routing's.
class DevicePhysicalRouting {
 public:
  const int32_t* ids() const { return ids_; }
  const float* weights() const { return weights_; }
  int64_t tokens() const { return tokens_; }
  int64_t k() const { return k_; }
  // A layer without EPLB: its physical experts are its logical ones.
  static DevicePhysicalRouting without_replicas(const DeviceCapturedRouting& captured) {
    return {captured.ids(), captured.weights(), captured.tokens(), captured.k()};
  }

 private:
  DevicePhysicalRouting(const int32_t* ids, const float* weights, int64_t tokens, int64_t k)
      : ids_(ids), weights_(weights), tokens_(tokens), k_(k) {}
  friend class DeviceExpertMap;
  friend DevicePhysicalRouting map_on_host(backend::Context& ctx, const PhysicalExperts& experts,
                                           const DeviceCapturedRouting& captured, int32_t* physical);
  const int32_t* ids_;
  const float* weights_;
  int64_t tokens_, k_;
};

#if R3_WITH_CUDA
// Throws unless the routing kernel takes `rule` over `experts` experts.
void check_device_routing(const DeviceRoutingRule& rule, int64_t experts);

// logits: device F32 [tokens, experts] (left as is); forced: device [tokens, k] ids to replay or
// nullptr, with replayed: device [tokens] (1 = replay that row) or nullptr (every row replays);
// ids, weights: device [tokens, k], written. Forced ids must have been checked on the host.
// Returns the routing in ids and weights, captured.
DeviceCapturedRouting route_on_device(backend::Context& ctx, const Tensor& logits, const DeviceRoutingRule& rule,
                                      const int32_t* forced, const uint8_t* replayed, int32_t* ids, float* weights,
                                      DeviceCaptureRows capture);
#endif

}  // namespace r3::moe
