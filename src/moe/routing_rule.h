// How one token's gate logits become its routing: scoring, selection (or a forced routing when
// replaying, or a token-id table for hash layers) and weights. Each family's rule is written
// once here and used by the router object and by the fused kernels alike.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace r3::moe {

// Token t's forced ids in a step's replayed routing [tokens, k] with its replay mask [tokens]
// (empty mask: every row replays), or empty when t routes freely.
inline std::span<const int32_t> forced_row(std::span<const int32_t> forced, std::span<const uint8_t> replayed,
                                           int64_t t, int64_t k) {
  if (forced.empty() || (!replayed.empty() && replayed[static_cast<std::size_t>(t)] == 0)) return {};
  return forced.subspan(static_cast<std::size_t>(t * k), static_cast<std::size_t>(k));
}

// Why one replayed row of expert ids cannot be routed ("expert id 9 outside [0, 8)", "expert 3
// appears twice"), or empty when it can. Replay files, the step runner and the routers share it.
std::string forced_row_problem(std::span<const int32_t> row, int64_t num_experts);

// A step's routing, row by row: the gate logits of every token (overwritten with scores), the
// token ids, the replayed routing, and where the ids, weights and margins go.
//
// A row's routing margin is how far its selection was from changing: the selection score of its
// k-th choice minus the best selection score it left out (the scores the rule's top-k compares:
// probabilities, biased sigmoid or sqrt-softplus scores, or raw logits; experts of groups the rule
// masked out do not count). +inf when nothing eligible was left out; NaN for a row that was not
// chosen by scores (a replayed row, a hash layer's table).
struct RoutingRows {
  std::span<float> logits;                 // [tokens, num_experts]
  int64_t num_experts = 0;
  std::span<const int32_t> token_ids;      // [tokens]
  std::span<const int32_t> forced;         // [tokens, top_k] or empty
  std::span<const uint8_t> replayed;       // [tokens] or empty (see forced_row)
  int32_t* ids = nullptr;                  // [tokens, top_k]
  float* weights = nullptr;                // [tokens, top_k]
  float* margins = nullptr;                // [tokens], or nullptr: not wanted
};

// A rule as plain parameters: what a device kernel takes (moe/device_routing.h), so each rule's
// numbers live in its class alone.
enum class RuleKind : int32_t {
  kSoftmaxTopK,
  kSigmoidGroupTopK,
  kTopKSoftmax,
  kSoftmaxGroupGreedy,
  kSqrtSoftplusTopK,
  kSqrtSoftplusHash,
};
struct RuleParameters {
  RuleKind kind = RuleKind::kSoftmaxTopK;
  int32_t k = 0;
  bool normalize = false;
  int32_t groups = 1, topk_groups = 1;
  float scaling = 1.0f;
  std::vector<float> bias;  // the correction bias (kSigmoidGroupTopK, kSqrtSoftplusTopK), else empty
};

class RoutingRule {
 public:
  virtual ~RoutingRule() = default;
  virtual std::string name() const = 0;
  virtual int64_t top_k() const = 0;
  virtual RuleParameters parameters() const = 0;
  // Routes tokens [begin, end) of the step: one call per chunk of tokens, not per token.
  virtual void route_rows(const RoutingRows& rows, int64_t begin, int64_t end) const = 0;
  // One token: logits (overwritten), its id (hash rules), top_k forced ids or empty; writes top_k
  // ids and weights, and its margin when `margin` is given.
  void route(std::span<float> logits, int32_t token_id, std::span<const int32_t> forced, int32_t* ids,
             float* weights, float* margin = nullptr) const;
};

// The row loop of a rule whose tokens route independently: Derived::route_row(logits, token_id,
// forced, ids, weights, margin) is called inline for each token (margin may be null).
template <typename Derived>
class PerTokenRule : public RoutingRule {
 public:
  void route_rows(const RoutingRows& r, int64_t begin, int64_t end) const final {
    const auto& rule = static_cast<const Derived&>(*this);
    const int64_t k = rule.top_k(), e = r.num_experts;
    for (int64_t t = begin; t < end; ++t) {
      rule.route_row(r.logits.subspan(static_cast<std::size_t>(t * e), static_cast<std::size_t>(e)),
                     r.token_ids[static_cast<std::size_t>(t)], forced_row(r.forced, r.replayed, t, k), r.ids + t * k,
                     r.weights + t * k, r.margins != nullptr ? r.margins + t : nullptr);
    }
  }
};

// Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE: softmax, top-k, optional renormalisation.
class SoftmaxTopK final : public PerTokenRule<SoftmaxTopK> {
 public:
  SoftmaxTopK(int64_t k, bool normalize) : k_(k), normalize_(normalize) {}
  std::string name() const override { return "softmax-topk"; }
  int64_t top_k() const override { return k_; }
  RuleParameters parameters() const override {
    return {RuleKind::kSoftmaxTopK, static_cast<int32_t>(k_), normalize_, 1, 1, 1.0f, {}};
  }
  void route_row(std::span<float> logits, int32_t token_id, std::span<const int32_t> forced, int32_t* ids,
                 float* weights, float* margin) const;

 private:
  int64_t k_;
  bool normalize_;
};

// DeepSeek-V4: scores sqrt(softplus(logit)); selection by top-k of score + correction bias
// (the bias steers selection only); weights = scores at the selection, renormalised, times
// routed_scaling_factor.
class SqrtSoftplusTopK final : public PerTokenRule<SqrtSoftplusTopK> {
 public:
  SqrtSoftplusTopK(int64_t k, std::vector<float> correction_bias, float scaling)
      : k_(k), bias_(std::move(correction_bias)), scaling_(scaling) {}
  std::string name() const override { return "sqrtsoftplus-topk"; }
  int64_t top_k() const override { return k_; }
  RuleParameters parameters() const override {
    return {RuleKind::kSqrtSoftplusTopK, static_cast<int32_t>(k_), true, 1, 1, scaling_, bias_};
  }
  void route_row(std::span<float> logits, int32_t token_id, std::span<const int32_t> forced, int32_t* ids,
                 float* weights, float* margin) const;

 private:
  int64_t k_;
  std::vector<float> bias_;
  float scaling_;
};

// DeepSeek-V4 hash layers: the experts come from a fixed table tid2eid[token_id]; weights as
// SqrtSoftplusTopK.
class SqrtSoftplusHash final : public PerTokenRule<SqrtSoftplusHash> {
 public:
  // table: [vocab, k] expert ids (I64 or I32); table_name names it in errors.
  SqrtSoftplusHash(const Tensor& table, int64_t num_experts, float scaling,
                   const std::string& table_name = "tid2eid");
  std::string name() const override { return "sqrtsoftplus-hash"; }
  int64_t top_k() const override { return k_; }
  RuleParameters parameters() const override {
    return {RuleKind::kSqrtSoftplusHash, static_cast<int32_t>(k_), true, 1, 1, scaling_, {}};
  }
  void route_row(std::span<float> logits, int32_t token_id, std::span<const int32_t> forced, int32_t* ids,
                 float* weights, float* margin) const;

 private:
  int64_t k_;
  std::vector<int32_t> table_;  // [vocab, k]
  float scaling_;
};

// DeepSeek-V3 / Kimi K2 / GLM-4.5: scores sigmoid(logit); choice = score + correction bias;
// only the topk_group groups with the largest sum of their two best choices are eligible;
// top-k of the eligible choices; weights = scores at the selection, optionally renormalised,
// times routed_scaling_factor.
class SigmoidGroupTopK final : public PerTokenRule<SigmoidGroupTopK> {
 public:
  SigmoidGroupTopK(int64_t k, std::vector<float> correction_bias, int64_t num_groups, int64_t topk_groups,
                   bool normalize, float scaling);
  std::string name() const override { return "sigmoid-group-topk"; }
  int64_t top_k() const override { return k_; }
  RuleParameters parameters() const override {
    return {RuleKind::kSigmoidGroupTopK, static_cast<int32_t>(k_), normalize_, static_cast<int32_t>(groups_),
            static_cast<int32_t>(topk_groups_), scaling_, bias_};
  }
  void route_row(std::span<float> logits, int32_t token_id, std::span<const int32_t> forced, int32_t* ids,
                 float* weights, float* margin) const;

 private:
  int64_t k_;
  std::vector<float> bias_;
  int64_t groups_, topk_groups_;
  bool normalize_;
  float scaling_;
};

// DeepSeek-V2: softmax; "greedy" top-k, or "group_limited_greedy": only the topk_group groups
// with the largest single probability are eligible; weights = probabilities at the selection
// times routed_scaling_factor (no renormalisation).
class SoftmaxGroupGreedy final : public PerTokenRule<SoftmaxGroupGreedy> {
 public:
  SoftmaxGroupGreedy(int64_t k, int64_t num_groups, int64_t topk_groups, float scaling);
  std::string name() const override { return "softmax-group-greedy"; }
  int64_t top_k() const override { return k_; }
  RuleParameters parameters() const override {
    return {RuleKind::kSoftmaxGroupGreedy, static_cast<int32_t>(k_), false, static_cast<int32_t>(groups_),
            static_cast<int32_t>(topk_groups_), scaling_, {}};
  }
  void route_row(std::span<float> logits, int32_t token_id, std::span<const int32_t> forced, int32_t* ids,
                 float* weights, float* margin) const;

 private:
  int64_t k_, groups_, topk_groups_;
  float scaling_;
};

// GPT-OSS: top-k of the raw logits, weights = softmax over those k logits.
class TopKSoftmax final : public PerTokenRule<TopKSoftmax> {
 public:
  explicit TopKSoftmax(int64_t k) : k_(k) {}
  std::string name() const override { return "topk-softmax"; }
  int64_t top_k() const override { return k_; }
  RuleParameters parameters() const override {
    return {RuleKind::kTopKSoftmax, static_cast<int32_t>(k_), false, 1, 1, 1.0f, {}};
  }
  void route_row(std::span<float> logits, int32_t token_id, std::span<const int32_t> forced, int32_t* ids,
                 float* weights, float* margin) const;

 private:
  int64_t k_;
};

float sqrt_softplus(float x);

}  // namespace r3::moe
