// Choosing the execution path of MoE layers (--moe-path) and building a layer for it.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "moe/moe_block.h"

namespace r3::moe {

enum class MoePath {
  kModular,              // router object + grouped GEMMs
  kMonolithic,           // one fused routine that reports its routing (the CPU default: docs/performance.md)
  kMonolithicNoCapture,  // a fused routine that cannot report its routing (start-up error with capture)
  kMega,                 // model-side gate + fused experts module as capture source
};

MoePath parse_moe_path(std::string_view name);  // throws listing the valid names
std::string_view moe_path_name(MoePath path);
std::vector<std::string> moe_path_names();

// An MoE layer with a linear gate and `rule`, on the chosen path.
std::unique_ptr<MoeBlock> make_moe_block(MoePath path, int64_t layer_id, Tensor gate_weight,
                                         std::shared_ptr<const RoutingRule> rule,
                                         std::shared_ptr<PhysicalExperts> experts, Tensor gate_bias = Tensor());

}  // namespace r3::moe
