#include "models/deepseek_v4/v4_cache.h"

#include <algorithm>

#include "core/check.h"

namespace r3::models {

namespace {
void size_compressor(CompressorState& c, int64_t width, int64_t dim, int64_t capacity, int64_t rate) {
  c.width = width;
  c.dim = dim;
  c.kv.assign(static_cast<std::size_t>(capacity * width), 0.0f);
  c.gate.assign(static_cast<std::size_t>(capacity * width), 0.0f);
  c.entries.assign(static_cast<std::size_t>(capacity / rate * dim), 0.0f);
}
}  // namespace

V4Cache::V4Cache(const DeepseekV4Spec& spec, int64_t max_slots, int64_t capacity)
    : capacity_(capacity), max_slots_(max_slots), lengths_(static_cast<std::size_t>(max_slots), 0) {
  R3_CHECK(max_slots > 0 && capacity > 0, "cache dimensions must be positive");
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    const V4AttentionKind kind = spec.layer_kinds[static_cast<std::size_t>(l)];
    rates_.push_back(kind == V4AttentionKind::kCompressed ? spec.csa_rate
                     : kind == V4AttentionKind::kHeavy    ? spec.hca_rate
                                                          : 0);
    for (int64_t s = 0; s < max_slots; ++s) {
      V4LayerState state;
      state.kv.assign(static_cast<std::size_t>(capacity * spec.head_dim), 0.0f);
      if (kind == V4AttentionKind::kCompressed) {
        size_compressor(state.compressor, 2 * spec.head_dim, spec.head_dim, capacity, spec.csa_rate);
        size_compressor(state.indexer, 2 * spec.index_head_dim, spec.index_head_dim, capacity, spec.csa_rate);
      } else if (kind == V4AttentionKind::kHeavy) {
        size_compressor(state.compressor, spec.head_dim, spec.head_dim, capacity, spec.hca_rate);
      }
      states_.push_back(std::move(state));
    }
  }
}

void V4Cache::set_length(int64_t slot, int64_t length) {
  R3_CHECK(slot >= 0 && slot < max_slots_, "cache: slot ", slot, " out of range");
  R3_CHECK(length >= 0 && length <= capacity_, "cache: length ", length, " exceeds capacity ", capacity_, " tokens");
  lengths_[static_cast<std::size_t>(slot)] = length;
  // Entries of windows that reach past the new length are no longer valid.
  for (std::size_t l = 0; l < rates_.size(); ++l) {
    if (rates_[l] == 0) continue;
    V4LayerState& s = layer(static_cast<int64_t>(l), slot);
    s.compressor.num_entries = std::min(s.compressor.num_entries, length / rates_[l]);
    s.indexer.num_entries = std::min(s.indexer.num_entries, length / rates_[l]);
  }
}

V4LayerState& V4Cache::layer(int64_t layer, int64_t slot) {
  R3_CHECK(layer >= 0 && layer < static_cast<int64_t>(rates_.size()) && slot >= 0 && slot < max_slots_,
           "cache: layer ", layer, " slot ", slot, " out of range");
  return states_[static_cast<std::size_t>(layer * max_slots_ + slot)];
}

}  // namespace r3::models
