// DeepSeek-V4's per-sequence cache. Per layer and slot it keeps every position's shared K=V row
// (attention reads the last `sliding_window` of them), the compressor's per-position projections,
// and the compressed entries emitted so far (one per completed window of `rate` positions); CSA
// layers keep the same for their indexer. An entry depends only on the rows of its window (and
// of the previous window, for CSA), so entries are identical however the positions arrived:
// one prefill, or token by token.
#pragma once

#include <vector>

#include "models/deepseek_v4/v4_spec.h"
#include "models/model_cache.h"

namespace r3::models {

struct CompressorState {
  int64_t width = 0, dim = 0;
  std::vector<float> kv, gate;  // [capacity, width] projections per position
  std::vector<float> entries;   // [capacity / rate, dim]
  int64_t num_entries = 0;
};

struct V4LayerState {
  std::vector<float> kv;  // [capacity, head_dim]
  CompressorState compressor, indexer;
};

class V4Cache final : public ModelCache {
 public:
  V4Cache(const DeepseekV4Spec& spec, int64_t max_slots, int64_t capacity);

  int64_t capacity() const override { return capacity_; }
  int64_t max_slots() const override { return max_slots_; }
  int64_t length(int64_t slot) const override { return lengths_.at(static_cast<std::size_t>(slot)); }
  void set_length(int64_t slot, int64_t length) override;

  V4LayerState& layer(int64_t layer, int64_t slot);

 private:
  int64_t capacity_, max_slots_;
  std::vector<int64_t> rates_;  // per layer, 0 for sliding-only
  std::vector<V4LayerState> states_;  // [layers * slots]
  std::vector<int64_t> lengths_;
};

}  // namespace r3::models
