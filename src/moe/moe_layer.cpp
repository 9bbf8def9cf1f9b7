#include "moe/moe_layer.h"

namespace r3::moe {

MoeLayer::MoeLayer(int64_t moe_layer_id, std::unique_ptr<Router> router, SwigluExperts experts)
    : moe_layer_id_(moe_layer_id), router_(std::move(router)), experts_(std::move(experts)) {
  R3_CHECK(router_ != nullptr, "MoE layer ", moe_layer_id_, " has no router");
  R3_CHECK(router_->num_experts() == experts_.num_experts(), "MoE layer ", moe_layer_id_,
           ": router scores ", router_->num_experts(), " experts but the layer has ",
           experts_.num_experts());
}

void MoeLayer::forward(ThreadPool& pool, const Tensor& hidden, RoutingCapture* capture,
                       Tensor& out) const {
  Routing routing;
  router_->route(pool, hidden, routing);
  if (capture != nullptr) capture->record(moe_layer_id_, routing.expert_ids, routing.weights);
  experts_.forward(pool, hidden, routing, out);
}

}  // namespace r3::moe
