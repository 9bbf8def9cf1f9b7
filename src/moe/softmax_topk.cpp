#include "moe/softmax_topk.h"

#include "core/check.h"
#include "ops/topk.h"

namespace r3::moe {

void softmax_topk_route(std::span<float> logits, int64_t k, bool normalize,
                        std::span<const int32_t> forced, int32_t* ids, float* weights) {
  ops::softmax(logits);
  if (forced.empty()) {
    const std::vector<int32_t> chosen = ops::topk_indices(logits, k);
    std::copy(chosen.begin(), chosen.end(), ids);
  } else {
    R3_CHECK(static_cast<int64_t>(forced.size()) == k, "forced routing has ", forced.size(),
             " ids, the router selects ", k);
    std::copy(forced.begin(), forced.end(), ids);
  }
  double sum = 0;
  for (int64_t j = 0; j < k; ++j) sum += logits[static_cast<std::size_t>(ids[j])];
  for (int64_t j = 0; j < k; ++j) {
    const float p = logits[static_cast<std::size_t>(ids[j])];
    weights[j] = normalize ? static_cast<float>(p / sum) : p;
  }
}

}  // namespace r3::moe
