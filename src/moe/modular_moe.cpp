#include "moe/modular_moe.h"

#include "moe/expert_kernels.h"

namespace r3::moe {

ModularMoe::ModularMoe(std::unique_ptr<Router> router, std::shared_ptr<PhysicalExperts> experts)
    : MoeBlock(router->layer_id(), std::move(experts)), router_(std::move(router)) {
  R3_CHECK(router_->num_experts() == this->experts().num_logical(), "MoE layer ", layer_id(),
           ": router scores ", router_->num_experts(), " experts, the layer has ",
           this->experts().num_logical());
}

void ModularMoe::forward(backend::Context& ctx, const MoeInput& input, Tensor& out) const {
  backend::Workspace::Scope scope(ctx.workspace());
  const CapturedRouting routing = router_->route(ctx, input);  // captures
  const PhysicalRouting physical = experts().map(ctx.workspace(), routing, input.load_count(layer_id()));
  grouped_experts(ctx, input.experts_rows(), physical, experts(), out, input.experts_dispatcher());
}

}  // namespace r3::moe
