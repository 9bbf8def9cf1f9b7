#include "moe/capture_binder.h"

#include <vector>

namespace r3::moe {

int64_t check_routing_capture(std::span<MoeBlock* const> layers) {
  const auto count = static_cast<int64_t>(layers.size());
  std::vector<bool> id_seen(layers.size(), false);
  for (MoeBlock* layer : layers) {
    const int64_t id = layer->layer_id();
    R3_CHECK(id >= 0 && id < count && !id_seen[static_cast<std::size_t>(id)], "MoE layer id ", id,
             " is out of range or repeated among ", count, " MoE layers");
    id_seen[static_cast<std::size_t>(id)] = true;
  }
  int64_t with_capture = 0;
  for (MoeBlock* layer : layers) {  // capture sources first, then routers
    if (CaptureSource* source = layer->capture_source()) {
      R3_CHECK(source->layer_id() == layer->layer_id(), "capture source of MoE layer ", layer->layer_id(),
               " reports layer id ", source->layer_id());
      ++with_capture;
      continue;
    }
    if (layer->capture_router() != nullptr) {
      ++with_capture;
      continue;
    }
    const std::string kernel = layer->non_capturing_kernel();
    R3_CHECK(kernel.empty(), "Routed-experts capture is not supported with monolithic MoE kernel ", kernel, ".");
    R3_FAIL("No supported MoE router found for routed-experts capture.");
  }
  R3_CHECK(with_capture == count, "routed-experts capture reaches ", with_capture, " of ", count, " MoE layers");
  return with_capture;
}

}  // namespace r3::moe
