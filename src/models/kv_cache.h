// Key/value cache: for every layer and sequence slot, rows of keys and values by position.
// Contiguous per (layer, slot) up to a fixed capacity; the engine's paged cache will replace the
// storage behind the same accessors.
#pragma once

#include <cstdint>
#include <vector>

#include "models/model_cache.h"

namespace r3::models {

class KvCache final : public ModelCache {
 public:
  // key_width / value_width: floats per position per layer (num_kv_heads * head_dim for GQA).
  KvCache(int64_t num_layers, int64_t key_width, int64_t value_width, int64_t max_slots,
          int64_t capacity);

  int64_t capacity() const override { return capacity_; }
  int64_t max_slots() const override { return max_slots_; }
  int64_t key_width() const { return key_width_; }
  int64_t value_width() const { return value_width_; }
  // Bytes one cached position costs across all layers.
  int64_t bytes_per_token() const;

  // Rows of (layer, slot): row p at keys(layer, slot) + p * key_width().
  float* keys(int64_t layer, int64_t slot);
  float* values(int64_t layer, int64_t slot);

  // Positions [0, length) of a slot hold valid rows.
  int64_t length(int64_t slot) const override { return lengths_.at(static_cast<std::size_t>(slot)); }
  void set_length(int64_t slot, int64_t length) override;

 private:
  std::size_t offset(int64_t layer, int64_t slot, int64_t width) const;

  int64_t num_layers_, key_width_, value_width_, max_slots_, capacity_;
  std::vector<float> keys_;
  std::vector<float> values_;
  std::vector<int64_t> lengths_;
};

}  // namespace r3::models
