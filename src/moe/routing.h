// The routing of one step: for each token, the experts it goes to and their weights.
#pragma once

#include <cstdint>
#include <vector>

namespace r3::moe {

struct Routing {
  int64_t tokens = 0;
  int64_t top_k = 0;
  // [tokens, top_k], in the router's selection order. Logical expert ids.
  std::vector<int32_t> expert_ids;
  std::vector<float> weights;

  void resize(int64_t t, int64_t k) {
    tokens = t;
    top_k = k;
    expert_ids.assign(static_cast<std::size_t>(t * k), 0);
    weights.assign(static_cast<std::size_t>(t * k), 0.0f);
  }
};

}  // namespace r3::moe
