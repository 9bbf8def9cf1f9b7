#include "moe/capture.h"

#include <algorithm>
#include <vector>

#include "core/check.h"

namespace r3::moe {

void CaptureBuffer::record_layers(int64_t routed, int64_t layers, int64_t tokens, int64_t top_k,
                                  std::span<const int32_t> ids, std::span<const float> weights,
                                  std::span<const float> margins) {
  R3_CHECK(routed >= 0 && routed <= layers && static_cast<int64_t>(ids.size()) >= layers * tokens * top_k &&
               static_cast<int64_t>(weights.size()) >= routed * tokens * top_k &&
               static_cast<int64_t>(margins.size()) >= layers * tokens,
           "capture: ", routed, " of ", layers, " layers of ", tokens, " tokens x top-", top_k, " from shorter buffers");
  std::vector<int32_t> layer_ids(static_cast<std::size_t>(tokens * top_k));
  std::vector<float> layer_margins(static_cast<std::size_t>(tokens));
  for (int64_t j = 0; j < routed; ++j) {
    for (int64_t t = 0; t < tokens; ++t) {
      std::copy_n(ids.data() + (t * layers + j) * top_k, top_k, layer_ids.data() + t * top_k);
      layer_margins[static_cast<std::size_t>(t)] = margins[static_cast<std::size_t>(t * layers + j)];
    }
    record(j, layer_ids, weights.subspan(static_cast<std::size_t>(j * tokens * top_k), layer_ids.size()),
           layer_margins);
  }
}

CapturedRouting capture(Routing routing, int64_t layer_id, CaptureBuffer* buffer) {
  R3_CHECK(buffer != nullptr, "MoE layer ", layer_id,
           " ran without a capture buffer: every step must bring one (engine::StepRunner does)");
  buffer->record(layer_id, routing.expert_ids, routing.weights, routing.margins);
  return CapturedRouting(std::move(routing));
}

}  // namespace r3::moe
