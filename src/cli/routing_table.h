// A compact, human-readable view of routed experts: one line per input position.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/routed_experts.h"

namespace r3::cli {

// `inputs[i]` is the token that was the model input at row i.
std::string format_routing(const engine::RoutedExperts& routed, const std::vector<int64_t>& moe_layers,
                           const std::vector<int32_t>& inputs);

}  // namespace r3::cli
