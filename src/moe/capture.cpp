#include "moe/capture.h"

namespace r3::moe {

CapturedRouting capture(Routing routing, int64_t layer_id, const CaptureSink& sink) {
  if (sink) sink(layer_id, routing.expert_ids, routing.weights);
  return CapturedRouting(std::move(routing));
}

}  // namespace r3::moe
