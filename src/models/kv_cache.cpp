#include "models/kv_cache.h"

#include "core/check.h"

namespace r3::models {

KvCache::KvCache(int64_t num_layers, int64_t key_width, int64_t value_width, int64_t max_slots,
                 int64_t capacity)
    : num_layers_(num_layers),
      key_width_(key_width),
      value_width_(value_width),
      max_slots_(max_slots),
      capacity_(capacity) {
  R3_CHECK(num_layers > 0 && key_width > 0 && value_width > 0 && max_slots > 0 && capacity > 0,
           "KV cache dimensions must be positive");
  const auto rows = static_cast<std::size_t>(num_layers * max_slots * capacity);
  keys_.assign(rows * static_cast<std::size_t>(key_width), 0.0f);
  values_.assign(rows * static_cast<std::size_t>(value_width), 0.0f);
  lengths_.assign(static_cast<std::size_t>(max_slots), 0);
}

int64_t KvCache::bytes_per_token() const {
  return num_layers_ * (key_width_ + value_width_) * static_cast<int64_t>(sizeof(float));
}

std::size_t KvCache::offset(int64_t layer, int64_t slot, int64_t width) const {
  R3_CHECK(layer >= 0 && layer < num_layers_ && slot >= 0 && slot < max_slots_,
           "KV cache: layer ", layer, " slot ", slot, " out of range");
  return static_cast<std::size_t>(((layer * max_slots_ + slot) * capacity_) * width);
}

float* KvCache::keys(int64_t layer, int64_t slot) {
  return keys_.data() + offset(layer, slot, key_width_);
}

float* KvCache::values(int64_t layer, int64_t slot) {
  return values_.data() + offset(layer, slot, value_width_);
}

void KvCache::set_length(int64_t slot, int64_t length) {
  R3_CHECK(slot >= 0 && slot < max_slots_, "KV cache: slot ", slot, " out of range");
  R3_CHECK(length >= 0 && length <= capacity_, "KV cache: length ", length,
           " exceeds capacity ", capacity_, " tokens");
  lengths_[static_cast<std::size_t>(slot)] = length;
}

}  // namespace r3::models
