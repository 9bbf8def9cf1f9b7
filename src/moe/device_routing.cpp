#include "moe/device_routing.h"

namespace r3::moe {

DeviceRuleDescription describe_for_device(const RoutingRule& rule) {
  RuleParameters p = rule.parameters();
  R3_CHECK(p.kind != RuleKind::kSqrtSoftplusTopK && p.kind != RuleKind::kSqrtSoftplusHash, "routing rule ",
           rule.name(), " has no CUDA kernel yet");
  DeviceRuleDescription d;
  d.rule = {p.kind, p.k, p.normalize, p.groups, p.topk_groups, p.scaling, nullptr};
  d.bias = std::move(p.bias);
  return d;
}

}  // namespace r3::moe
