#include "models/forward_batch.h"

namespace r3::models {

ForwardBatch ForwardBatch::sequence(const std::vector<int32_t>& ids, int32_t start, int32_t slot) {
  ForwardBatch b;
  b.token_ids = ids;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    b.positions.push_back(start + static_cast<int32_t>(i));
    b.slots.push_back(slot);
  }
  return b;
}

}  // namespace r3::models
