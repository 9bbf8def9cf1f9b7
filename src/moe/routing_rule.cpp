#include "moe/routing_rule.h"

#include "core/checked.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/checked.h"
#include "ops/topk.h"

namespace r3::moe {

namespace {

// Per-thread scratch for one row (choice scores, group scores): the rules run per token inside
// the routers' parallel loops, so they borrow a buffer that grows to the widest row once per
// thread instead of allocating per token (a warmed-up step allocates nothing).
template <typename T = float>
std::span<T> row_scratch(std::size_t n) {
  thread_local std::vector<T> scratch;
  if (scratch.size() < n) scratch.resize(n);
  return {scratch.data(), n};
}

// The top-k of the selection scores (or the forced ids), and the row's margin when asked (see
// RoutingRows): masked experts hold -inf or, for DeepSeek-V2's rule, 0, below every eligible score.
void choose(std::span<const float> selection_scores, int64_t k, std::span<const int32_t> forced, int32_t* ids,
            float* margin) {
  if (forced.empty()) {
    ops::topk_indices(selection_scores, {ids, static_cast<std::size_t>(k)});
    if (margin != nullptr) {
      float best_left_out = -INFINITY;
      for (std::size_t e = 0; e < selection_scores.size(); ++e) {
        if (std::find(ids, ids + k, static_cast<int32_t>(e)) == ids + k) {
          best_left_out = std::max(best_left_out, selection_scores[e]);
        }
      }
      *margin = selection_scores[static_cast<std::size_t>(ids[k - 1])] - best_left_out;
    }
  } else {
    R3_CHECK(static_cast<int64_t>(forced.size()) == k, "forced routing has ", forced.size(),
             " ids, the router selects ", k);
    std::copy(forced.begin(), forced.end(), ids);
    if (margin != nullptr) *margin = std::numeric_limits<float>::quiet_NaN();
  }
}

// Sets the choices of every group outside the `keep` best group scores to `masked`.
void mask_ineligible_groups(std::span<float> group_scores, int64_t keep, std::span<float> choice, float masked) {
  const std::size_t groups = group_scores.size(), group_size = choice.size() / groups;
  const std::span<int32_t> kept = row_scratch<int32_t>(static_cast<std::size_t>(keep));
  ops::topk_indices(group_scores, kept);
  for (std::size_t g = 0; g < groups; ++g) {
    if (std::find(kept.begin(), kept.end(), static_cast<int32_t>(g)) == kept.end()) {
      std::fill(choice.begin() + static_cast<std::ptrdiff_t>(g * group_size),
                choice.begin() + static_cast<std::ptrdiff_t>((g + 1) * group_size), masked);
    }
  }
}

// weights[j] = scores[ids[j]] / (sum + eps) * scaling.
void renormalised(std::span<const float> scores, int64_t k, const int32_t* ids, float eps, float scaling,
                  float* weights) {
  double sum = 0;
  for (int64_t j = 0; j < k; ++j) sum += scores[static_cast<std::size_t>(ids[j])];
  for (int64_t j = 0; j < k; ++j) {
    weights[j] = static_cast<float>(scores[static_cast<std::size_t>(ids[j])] / (sum + eps) * scaling);
  }
}

}  // namespace

std::string forced_row_problem(std::span<const int32_t> row, int64_t num_experts) {
  for (const int32_t id : row) {
    if (id < 0 || id >= num_experts) return detail::concat("expert id ", id, " outside [0, ", num_experts, ")");
    if (std::count(row.begin(), row.end(), id) != 1) return detail::concat("expert ", id, " appears twice");
  }
  return "";
}

void RoutingRule::route(std::span<float> logits, int32_t token_id, std::span<const int32_t> forced, int32_t* ids,
                        float* weights, float* margin) const {
  const RoutingRows one{logits, static_cast<int64_t>(logits.size()), {&token_id, 1}, forced, {}, ids, weights, margin};
  route_rows(one, 0, 1);
}

float sqrt_softplus(float x) {
  // torch softplus (beta 1, threshold 20): x itself above the threshold.
  const double sp = x > 20.0f ? static_cast<double>(x) : std::log1p(std::exp(static_cast<double>(x)));
  return static_cast<float>(std::sqrt(sp));
}

void SoftmaxTopK::route_row(std::span<float> logits, int32_t, std::span<const int32_t> forced, int32_t* ids,
                        float* weights, float* margin) const {
  ops::softmax(logits);
  choose(logits, k_, forced, ids, margin);
  if (normalize_) {
    renormalised(logits, k_, ids, 0.0f, 1.0f, weights);
  } else {
    for (int64_t j = 0; j < k_; ++j) weights[j] = logits[static_cast<std::size_t>(ids[j])];
  }
}

void SqrtSoftplusTopK::route_row(std::span<float> logits, int32_t, std::span<const int32_t> forced, int32_t* ids,
                             float* weights, float* margin) const {
  R3_CHECK(bias_.size() == logits.size(), "routing: correction bias has ", bias_.size(), " entries for ",
           logits.size(), " experts");
  const std::span<float> biased = row_scratch(logits.size());
  for (std::size_t e = 0; e < logits.size(); ++e) {
    logits[e] = sqrt_softplus(logits[e]);
    biased[e] = logits[e] + bias_[e];
  }
  choose(biased, k_, forced, ids, margin);
  renormalised(logits, k_, ids, 1e-20f, scaling_, weights);
}

SigmoidGroupTopK::SigmoidGroupTopK(int64_t k, std::vector<float> correction_bias, int64_t num_groups,
                                   int64_t topk_groups, bool normalize, float scaling)
    : k_(k), bias_(std::move(correction_bias)), groups_(num_groups), topk_groups_(topk_groups),
      normalize_(normalize), scaling_(scaling) {
  const auto experts = static_cast<int64_t>(bias_.size());
  R3_CHECK(groups_ >= 1 && experts % groups_ == 0, "routing: ", experts, " experts do not split into n_group ",
           groups_, " groups");
  R3_CHECK(topk_groups_ >= 1 && topk_groups_ <= groups_, "routing: topk_group ", topk_groups_,
           " must be in [1, n_group = ", groups_, "]");
  R3_CHECK(k_ <= topk_groups_ * (experts / groups_), "routing: top-", k_, " cannot be chosen from ", topk_groups_,
           " groups of ", experts / groups_, " experts");
}

void SigmoidGroupTopK::route_row(std::span<float> logits, int32_t, std::span<const int32_t> forced, int32_t* ids,
                             float* weights, float* margin) const {
  const auto experts = static_cast<int64_t>(logits.size());
  R3_CHECK(static_cast<int64_t>(bias_.size()) == experts, "routing: correction bias has ", bias_.size(),
           " entries for ", experts, " experts");
  const int64_t group_size = experts / groups_;
  const std::span<float> scratch = row_scratch(logits.size() + static_cast<std::size_t>(groups_));
  const std::span<float> choice = scratch.first(logits.size());
  for (std::size_t e = 0; e < logits.size(); ++e) {
    logits[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    choice[e] = logits[e] + bias_[e];
  }
  if (forced.empty()) {
    // Group score: the sum of the group's two best choices (its only one if a group has one).
    const std::span<float> group_score = scratch.subspan(logits.size(), static_cast<std::size_t>(groups_));
    for (int64_t g = 0; g < groups_; ++g) {
      std::span<const float> members(choice.data() + g * group_size, static_cast<std::size_t>(group_size));
      int32_t best[2];
      const std::span<int32_t> two(best, static_cast<std::size_t>(std::min<int64_t>(2, group_size)));
      ops::topk_indices(members, two);
      float sum = 0;
      for (int32_t i : two) sum += members[static_cast<std::size_t>(i)];
      group_score[static_cast<std::size_t>(g)] = sum;
    }
    mask_ineligible_groups(group_score, topk_groups_, choice, -INFINITY);
  }
  choose(choice, k_, forced, ids, margin);
  if (normalize_) {
    renormalised(logits, k_, ids, 1e-20f, scaling_, weights);
  } else {
    for (int64_t j = 0; j < k_; ++j) weights[j] = logits[static_cast<std::size_t>(ids[j])] * scaling_;
  }
}

SoftmaxGroupGreedy::SoftmaxGroupGreedy(int64_t k, int64_t num_groups, int64_t topk_groups, float scaling)
    : k_(k), groups_(num_groups), topk_groups_(topk_groups), scaling_(scaling) {
  R3_CHECK(groups_ >= 1 && topk_groups_ >= 1 && topk_groups_ <= groups_, "routing: topk_group ", topk_groups_,
           " must be in [1, n_group = ", groups_, "]");
}

void SoftmaxGroupGreedy::route_row(std::span<float> logits, int32_t, std::span<const int32_t> forced, int32_t* ids,
                               float* weights, float* margin) const {
  ops::softmax(logits);
  const auto experts = static_cast<int64_t>(logits.size());
  R3_CHECK(experts % groups_ == 0, "routing: ", experts, " experts do not split into ", groups_, " groups");
  const std::span<float> scratch = row_scratch(logits.size() + static_cast<std::size_t>(groups_));
  const std::span<float> choice = scratch.first(logits.size());
  std::copy(logits.begin(), logits.end(), choice.begin());
  if (forced.empty() && topk_groups_ < groups_) {
    const int64_t group_size = experts / groups_;
    const std::span<float> group_max = scratch.subspan(logits.size(), static_cast<std::size_t>(groups_));
    for (int64_t g = 0; g < groups_; ++g) {
      group_max[static_cast<std::size_t>(g)] = *std::max_element(choice.begin() + g * group_size, choice.begin() + (g + 1) * group_size);
    }
    mask_ineligible_groups(group_max, topk_groups_, choice, 0.0f);  // 0 as transformers
  }
  choose(choice, k_, forced, ids, margin);
  for (int64_t j = 0; j < k_; ++j) weights[j] = logits[static_cast<std::size_t>(ids[j])] * scaling_;
}

void TopKSoftmax::route_row(std::span<float> logits, int32_t, std::span<const int32_t> forced, int32_t* ids,
                        float* weights, float* margin) const {
  choose(logits, k_, forced, ids, margin);
  for (int64_t j = 0; j < k_; ++j) weights[j] = logits[static_cast<std::size_t>(ids[j])];
  ops::softmax({weights, static_cast<std::size_t>(k_)});
}

SqrtSoftplusHash::SqrtSoftplusHash(const Tensor& table, int64_t num_experts, float scaling,
                                   const std::string& table_name)
    : scaling_(scaling) {
  const std::string what = "hash routing table '" + table_name + "'";
  R3_CHECK(table.rank() == 2, what, " must be [vocab, top_k]");
  R3_CHECK(table.dtype() == DType::I64 || table.dtype() == DType::I32, what, " must be I64 or I32");
  R3_CHECK(table.is_contiguous(), what, " must be contiguous");
  k_ = table.dim(1);
  // The element count and byte size, checked: the table's bytes are exactly numel * width.
  const int64_t count = checked_mul(table.dim(0), k_, "hash routing table size");
  const std::size_t width = table.dtype() == DType::I64 ? 8 : 4;
  R3_CHECK(checked_mul(static_cast<std::size_t>(count), width, "hash routing table bytes") == table.nbytes(),
           what, ": ", table.nbytes(), " bytes for ", count, " entries");
  const auto* bytes = static_cast<const unsigned char*>(table.raw_data());
  table_.reserve(static_cast<std::size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    int64_t id = 0;
    if (table.dtype() == DType::I64) {
      std::memcpy(&id, bytes + 8 * i, 8);
    } else {
      int32_t v;
      std::memcpy(&v, bytes + 4 * i, 4);
      id = v;
    }
    R3_CHECK(id >= 0 && id < num_experts, what, ": token ", i / k_, " lists ", id,
             ", not an expert id in [0, ", num_experts, ")");
    table_.push_back(static_cast<int32_t>(id));
  }
  // A token's experts must be distinct: a repeated one would run twice for that token, and
  // capture would report a routing no top-k selection can produce.
  for (int64_t token = 0; token < table.dim(0); ++token) {
    const auto first = table_.begin() + token * k_, last = first + k_;
    for (auto it = first; it != last; ++it) {
      R3_CHECK(std::find(first, it, *it) == it, what, ": token ", token, " lists expert ", *it, " twice");
    }
  }
}

void SqrtSoftplusHash::route_row(std::span<float> logits, int32_t token_id, std::span<const int32_t> forced,
                             int32_t* ids, float* weights, float* margin) const {
  for (float& v : logits) v = sqrt_softplus(v);
  if (forced.empty()) {
    const auto row = static_cast<std::size_t>(token_id) * static_cast<std::size_t>(k_);
    R3_CHECK(row + static_cast<std::size_t>(k_) <= table_.size(), "hash routing: token ", token_id,
             " outside the table");
    std::copy_n(table_.begin() + static_cast<std::ptrdiff_t>(row), k_, ids);
    if (margin != nullptr) *margin = std::numeric_limits<float>::quiet_NaN();  // a table, not scores
  } else {
    choose(logits, k_, forced, ids, margin);
  }
  renormalised(logits, k_, ids, 1e-20f, scaling_, weights);
}

}  // namespace r3::moe
