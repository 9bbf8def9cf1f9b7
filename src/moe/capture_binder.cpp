#include "moe/capture_binder.h"

#include <vector>

namespace r3::moe {

int64_t bind_routing_capture(std::span<MoeBlock* const> layers, const CaptureSink& sink) {
  const auto count = static_cast<int64_t>(layers.size());
  std::vector<bool> bound(layers.size(), false), id_seen(layers.size(), false);
  for (MoeBlock* layer : layers) {
    const int64_t id = layer->layer_id();
    R3_CHECK(id >= 0 && id < count && !id_seen[static_cast<std::size_t>(id)], "MoE layer id ", id,
             " is out of range or repeated among ", count, " MoE layers");
    id_seen[static_cast<std::size_t>(id)] = true;
  }
  int64_t bound_count = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {  // capture sources first
    if (CaptureSource* source = layers[i]->capture_source()) {
      R3_CHECK(source->layer_id() == layers[i]->layer_id(), "capture source of MoE layer ",
               layers[i]->layer_id(), " reports layer id ", source->layer_id());
      source->set_capture(sink);
      bound[i] = true;
      ++bound_count;
    }
  }
  for (std::size_t i = 0; i < layers.size(); ++i) {  // then routers
    if (bound[i]) continue;
    if (Router* router = layers[i]->capture_router()) {
      router->set_capture(sink);
      bound[i] = true;
      ++bound_count;
      continue;
    }
    const std::string kernel = layers[i]->non_capturing_kernel();
    R3_CHECK(kernel.empty(), "Routed-experts capture is not supported with monolithic MoE kernel ",
             kernel, ".");
    R3_FAIL("No supported MoE router found for routed-experts capture.");
  }
  R3_CHECK(bound_count == count, "routed-experts capture bound ", bound_count, " of ", count,
           " MoE layers");
  return bound_count;
}

ScopedCaptureBinding::ScopedCaptureBinding(std::vector<MoeBlock*> layers, const CaptureSink& sink)
    : layers_(std::move(layers)) {
  bind_routing_capture(layers_, sink);
}

ScopedCaptureBinding::~ScopedCaptureBinding() {
  for (MoeBlock* layer : layers_) {
    if (CaptureSource* source = layer->capture_source()) source->set_capture(nullptr);
    if (Router* router = layer->capture_router()) router->set_capture(nullptr);
  }
}

}  // namespace r3::moe
