#include "moe/router.h"

#include <algorithm>

#include "ops/linear.h"

namespace r3::moe {

std::span<const int32_t> MoeInput::forced_row(int64_t t, int64_t top_k) const {
  return moe::forced_row(forced, replayed, t, top_k);
}

void check_forced_routing(const MoeInput& input, int64_t tokens, int64_t top_k, int64_t num_experts,
                          int64_t layer_id) {
  if (input.forced.empty()) return;
  R3_CHECK(static_cast<int64_t>(input.forced.size()) == tokens * top_k, "replayed routing for MoE layer ",
           layer_id, " has ", input.forced.size(), " ids, expected ", tokens, " tokens x top-", top_k);
  R3_CHECK(input.replayed.empty() || static_cast<int64_t>(input.replayed.size()) == tokens,
           "replay mask has ", input.replayed.size(), " rows for ", tokens, " tokens");
  for (int64_t t = 0; t < tokens; ++t) {
    const std::string problem = forced_row_problem(input.forced_row(t, top_k), num_experts);
    R3_CHECK(problem.empty(), "replayed routing at token ", t, ", MoE layer ", layer_id, ": ", problem);
  }
}

Router::Router(int64_t layer_id, Tensor gate_weight, std::shared_ptr<const RoutingRule> rule, Tensor gate_bias)
    : layer_id_(layer_id), gate_weight_(std::move(gate_weight)), rule_(std::move(rule)), gate_bias_(std::move(gate_bias)) {
  R3_CHECK(gate_weight_.rank() == 2, "router gate must be [num_experts, hidden]");
  R3_CHECK(rule_->top_k() >= 1 && rule_->top_k() <= gate_weight_.dim(0), "top_k ", rule_->top_k(),
           " must be in [1, ", gate_weight_.dim(0), "]");
}

void route_tokens(backend::Context& ctx, const RoutingRule& rule, Tensor& logits, const MoeInput& input,
                  Routing& out) {
  const int64_t tokens = logits.dim(0), experts = logits.dim(1), k = rule.top_k();
  R3_CHECK(static_cast<int64_t>(input.token_ids.size()) == tokens,
           "routing: ", input.token_ids.size(), " token ids for ", tokens, " tokens");
  out = Routing::in(ctx.workspace(), tokens, k);
  const RoutingRows rows{{logits.data<float>(), static_cast<std::size_t>(tokens * experts)},
                         experts,
                         input.token_ids,
                         input.forced,
                         input.replayed,
                         out.expert_ids.data(),
                         out.weights.data(),
                         out.margins.data()};
  ctx.parallel_for(tokens, 8, [&](int64_t begin, int64_t end) { rule.route_rows(rows, begin, end); });
}

Routing Router::compute(backend::Context& ctx, const MoeInput& input) const {
  const int64_t tokens = input.hidden.dim(0);
  check_forced_routing(input, tokens, top_k(), num_experts(), layer_id_);
  Tensor logits = ctx.scratch(DType::F32, {tokens, num_experts()});
  ops::linear(ctx, input.hidden, gate_weight_, gate_bias_.if_defined(), logits);
  Routing out;
  route_tokens(ctx, *rule_, logits, input, out);
  return out;
}

}  // namespace r3::moe
