#include "moe/mega_moe.h"

#include "moe/expert_kernels.h"

namespace r3::moe {

void MegaExperts::forward(backend::Context& ctx, const Tensor& hidden, Routing routing, CaptureBuffer* buffer,
                          LoadCount load, const Dispatcher& dispatcher, Tensor& out) const {
  const CapturedRouting captured = capture(std::move(routing), layer_id_, buffer);
  const PhysicalRouting physical = experts_.map(ctx.workspace(), captured, load);
  fused_experts(ctx, hidden, physical, experts_, out, dispatcher);
}

MegaMoe::MegaMoe(std::unique_ptr<Router> gate, std::shared_ptr<PhysicalExperts> experts)
    : MoeBlock(gate->layer_id(), std::move(experts)), gate_(std::move(gate)), mega_(layer_id(), this->experts()) {
  R3_CHECK(gate_->num_experts() == this->experts().num_logical(), "MoE layer ", layer_id(),
           ": gate scores ", gate_->num_experts(), " experts, the layer has ",
           this->experts().num_logical());
}

void MegaMoe::forward(backend::Context& ctx, const MoeInput& input, Tensor& out) const {
  backend::Workspace::Scope scope(ctx.workspace());
  mega_.forward(ctx, input.experts_rows(), gate_->compute(ctx, input), input.capture, input.load_count(layer_id()),
                input.experts_dispatcher(), out);
}

}  // namespace r3::moe
