// The routing of one step: for each token, the experts it goes to and their weights. Its ids and
// weights live in the step workspace (valid while the MoE layer's workspace scope is open).
#pragma once

#include <cstdint>
#include <span>

#include "backend/workspace.h"

namespace r3::moe {

struct Routing {
  int64_t tokens = 0;
  int64_t top_k = 0;
  // [tokens, top_k], in the router's selection order. Logical expert ids.
  std::span<int32_t> expert_ids;
  std::span<float> weights;
  // [tokens]: each row's routing margin (moe/routing_rule.h), or empty when not computed.
  std::span<float> margins;

  // A zeroed routing of t tokens x k choices (and t margins) taken from `workspace`.
  static Routing in(backend::Workspace& workspace, int64_t t, int64_t k) {
    return {t, k, workspace.array<int32_t>(t * k), workspace.array<float>(t * k), workspace.array<float>(t)};
  }
};

}  // namespace r3::moe
