#include "moe/capture.h"

#include "core/check.h"

namespace r3::moe {

CapturedRouting capture(Routing routing, int64_t layer_id, CaptureBuffer* buffer) {
  R3_CHECK(buffer != nullptr, "MoE layer ", layer_id,
           " ran without a capture buffer: every step must bring one (engine::StepRunner does)");
  buffer->record(layer_id, routing.expert_ids, routing.weights, routing.margins);
  return CapturedRouting(std::move(routing));
}

}  // namespace r3::moe
