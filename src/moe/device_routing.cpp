#include "moe/device_routing.h"

namespace r3::moe {

DeviceRuleDescription describe_for_device(const RoutingRule& rule) {
  DeviceRuleDescription d;
  d.rule.k = static_cast<int32_t>(rule.top_k());
  if (const auto* r = dynamic_cast<const SoftmaxTopK*>(&rule)) {
    d.rule.kind = DeviceRoutingRule::Kind::kSoftmaxTopK;
    d.rule.normalize = r->normalize();
  } else if (const auto* s = dynamic_cast<const SigmoidGroupTopK*>(&rule)) {
    d.rule.kind = DeviceRoutingRule::Kind::kSigmoidGroupTopK;
    d.rule.normalize = s->normalize();
    d.rule.groups = static_cast<int32_t>(s->num_groups());
    d.rule.topk_groups = static_cast<int32_t>(s->topk_groups());
    d.rule.scaling = s->scaling();
    d.bias = s->correction_bias();
  } else if (const auto* g = dynamic_cast<const SoftmaxGroupGreedy*>(&rule)) {
    d.rule.kind = DeviceRoutingRule::Kind::kSoftmaxGroupGreedy;
    d.rule.groups = static_cast<int32_t>(g->num_groups());
    d.rule.topk_groups = static_cast<int32_t>(g->topk_groups());
    d.rule.scaling = g->scaling();
  } else if (dynamic_cast<const TopKSoftmax*>(&rule) != nullptr) {
    d.rule.kind = DeviceRoutingRule::Kind::kTopKSoftmax;
  } else {
    R3_FAIL("routing rule ", rule.name(), " has no CUDA kernel yet");
  }
  return d;
}

}  // namespace r3::moe
