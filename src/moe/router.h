// A router turns hidden states into a Routing: a linear gate, then a RoutingRule per token
// (scores, a selection or a forced routing when replaying, weights). In the modular path the
// router is also the capture point: route() records its logical ids in the step's capture buffer
// before anyone can map them.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "core/tensor.h"
#include "backend/context.h"
#include "moe/capture.h"
#include "moe/dispatcher.h"
#include "moe/expert_loads.h"
#include "moe/routing_rule.h"

namespace r3::moe {

// What a MoE layer routes on: the hidden states, the step's token ids (hash routing needs
// them), and an optional forced routing [tokens, top_k] to replay, on the rows `replayed` marks.
struct MoeInput {
  const Tensor& hidden;                // F32 [tokens, hidden]
  std::span<const int32_t> token_ids;  // [tokens]
  std::span<const int32_t> forced;     // [tokens, top_k] or empty
  std::span<const uint8_t> replayed = {};  // [tokens]; empty: every row of `forced` replays
  CaptureBuffer* capture = nullptr;        // the step's capture buffer (moe/capture.h)
  ExpertLoads* loads = nullptr;            // the step's per-expert token counts, or nullptr
  std::span<const uint8_t> padding = {};   // [tokens]; 1 = padding row (not counted); empty: none
  // Where the routed pairs' rows go to their experts and come back (moe/dispatcher.h): nullptr is
  // this device; an expert-parallel rank's all-to-all otherwise (moe/ep).
  const Dispatcher* dispatcher = nullptr;
  // What the routed experts multiply, when it is not `hidden` (Kimi K3's latent MoE routes on the
  // hidden state and runs its experts on a down-projection of it): F32 [tokens, expert width].
  // The experts' output then has the experts' width too.
  const Tensor* experts_input = nullptr;

  const Tensor& experts_rows() const { return experts_input != nullptr ? *experts_input : hidden; }
  const Dispatcher& experts_dispatcher() const { return dispatcher != nullptr ? *dispatcher : local_dispatcher(); }

  // Where MoE layer `layer_id`'s EPLB map counts this step's tokens.
  LoadCount load_count(int64_t layer_id) const {
    return {loads ? loads->layer(layer_id) : std::span<int64_t>{}, padding};
  }

  // Token t's forced ids, or empty when it routes freely.
  std::span<const int32_t> forced_row(int64_t t, int64_t top_k) const;
};

class Router {
 public:
  // gate_weight: F32 [num_experts, hidden]; gate_bias: F32 [num_experts] or undefined.
  Router(int64_t layer_id, Tensor gate_weight, std::shared_ptr<const RoutingRule> rule, Tensor gate_bias = Tensor());

  int64_t layer_id() const { return layer_id_; }
  int64_t num_experts() const { return gate_weight_.dim(0); }
  int64_t top_k() const { return rule_->top_k(); }
  std::string name() const { return rule_->name(); }
  const Tensor& gate_weight() const { return gate_weight_; }
  const Tensor& gate_bias() const { return gate_bias_; }  // undefined when the gate has none
  const RoutingRule& rule() const { return *rule_; }

  // Forced ids replace the rule's selection (replay); weights then come from the router's own
  // scores at those ids. Checks forced ids are in range and distinct within a row. The routing
  // lives in the context's workspace: call inside the MoE layer's workspace scope.
  Routing compute(backend::Context& ctx, const MoeInput& input) const;
  // compute() followed by the capture point (the modular path).
  CapturedRouting route(backend::Context& ctx, const MoeInput& input) const {
    return capture(compute(ctx, input), layer_id_, input.capture);
  }

 private:
  int64_t layer_id_;
  Tensor gate_weight_;
  std::shared_ptr<const RoutingRule> rule_;
  Tensor gate_bias_;
};

// Runs `rule` over gate logits [tokens, num_experts] (overwritten), writing `out` (taken from the
// context's workspace).
void route_tokens(backend::Context& ctx, const RoutingRule& rule, Tensor& logits, const MoeInput& input,
                  Routing& out);

// Checks the replayed rows of input.forced [tokens, top_k]: ids within [0, num_experts), distinct
// in each row.
void check_forced_routing(const MoeInput& input, int64_t tokens, int64_t top_k, int64_t num_experts,
                          int64_t layer_id);

}  // namespace r3::moe
