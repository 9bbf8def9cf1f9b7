#include "engine/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace r3::engine {

void log_softmax(std::span<const float> logits, std::span<float> out) {
  R3_CHECK(!logits.empty(), "log-softmax of empty logits");
  R3_CHECK(out.size() == logits.size(), "log-softmax output has ", out.size(),
           " entries for ", logits.size(), " logits");
  // The shift by the maximum keeps every exp in (0, 1], so nothing overflows; the terms are
  // differences taken in double, so logits near +-1e30 still give finite results.
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float x : logits) sum += std::exp(static_cast<double>(x) - max_logit);
  // -inf logits are fine (masked tokens get -inf); a NaN anywhere makes the sum NaN.
  R3_CHECK(std::isfinite(max_logit) && std::isfinite(sum),
           "log-softmax needs a finite maximum logit and no NaN");
  const double log_sum = std::log(sum);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    out[i] = static_cast<float>(static_cast<double>(logits[i]) - max_logit - log_sum);
  }
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logprobs, int64_t n) {
  if (n <= 0) return {};
  const auto vocab = static_cast<int64_t>(logprobs.size());
  const auto k = static_cast<std::size_t>(std::min(n, vocab));
  std::vector<int32_t> ids(logprobs.size());
  std::iota(ids.begin(), ids.end(), 0);
  // Ties broken by id so the answer does not depend on the partial sort's internal order.
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                    [&](int32_t a, int32_t b) {
                      return logprobs[a] > logprobs[b] || (logprobs[a] == logprobs[b] && a < b);
                    });
  std::vector<TokenLogprob> top(k);
  for (std::size_t i = 0; i < k; ++i) top[i] = {ids[i], logprobs[ids[i]]};
  return top;
}

}  // namespace r3::engine
