// What the engine needs from any model's per-sequence cache (KV rows, compressor state, ...):
// sequence slots, how many positions each holds, and the capacity. Each model family has its
// own cache type behind this interface.
#pragma once

#include <cstdint>

namespace r3::models {

class ModelCache {
 public:
  virtual ~ModelCache() = default;
  virtual int64_t capacity() const = 0;   // positions per slot
  virtual int64_t max_slots() const = 0;
  // Positions [0, length) of a slot are cached.
  virtual int64_t length(int64_t slot) const = 0;
  virtual void set_length(int64_t slot, int64_t length) = 0;
  void clear(int64_t slot) { set_length(slot, 0); }
};

}  // namespace r3::models
