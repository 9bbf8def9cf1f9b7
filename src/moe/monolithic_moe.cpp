#include "moe/monolithic_moe.h"

#include "moe/expert_kernels.h"
#include "ops/linear.h"

namespace r3::moe {

MonolithicMoe::MonolithicMoe(int64_t layer_id, Tensor gate_weight, std::shared_ptr<const RoutingRule> rule,
                             std::shared_ptr<PhysicalExperts> experts, bool can_capture, Tensor gate_bias)
    : MoeBlock(layer_id, std::move(experts)),
      gate_weight_(std::move(gate_weight)),
      rule_(std::move(rule)),
      gate_bias_(std::move(gate_bias)),
      can_capture_(can_capture) {
  R3_CHECK(gate_weight_.rank() == 2 && gate_weight_.dim(0) == this->experts().num_logical(),
           "MoE layer ", layer_id, ": gate must be [num_experts, hidden]");
}

std::string MonolithicMoe::kernel_name() const {
  return "cpu-fused-" + rule_->name() + (can_capture_ ? "" : "-nocapture");
}

namespace {
// Where the non-capturing kernel's routing goes: nowhere. It cannot report its routing, so the
// binder refuses it whenever routed experts are asked for (every engine step).
class Discard final : public CaptureBuffer {
 public:
  void record(int64_t, std::span<const int32_t>, std::span<const float>, std::span<const float>) override {}
};
}  // namespace

void MonolithicMoe::forward(backend::Context& ctx, const MoeInput& input, Tensor& out) const {
  const Tensor& hidden = input.hidden;
  const int64_t tokens = hidden.dim(0), experts_n = gate_weight_.dim(0);
  check_forced_routing(input, tokens, rule_->top_k(), experts_n, layer_id());
  backend::Workspace::Scope scope(ctx.workspace());
  // Routing stage of the fused kernel: the gate's dot products, then the rule, per token.
  Tensor logits = ctx.scratch(DType::F32, {tokens, experts_n});
  ops::linear(ctx, hidden, gate_weight_, gate_bias_.if_defined(), logits);
  Routing routing;
  route_tokens(ctx, *rule_, logits, input, routing);
  // The kernel writes its routing to the capture buffer (when it can), then maps and computes.
  Discard discard;
  const CapturedRouting captured = capture(std::move(routing), layer_id(), can_capture_ ? input.capture : &discard);
  const PhysicalRouting physical = experts().map(ctx.workspace(), captured, input.load_count(layer_id()));
  fused_experts(ctx, input.experts_rows(), physical, experts(), out, input.experts_dispatcher());
}

}  // namespace r3::moe
