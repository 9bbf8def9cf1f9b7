// What the engine needs from any model's per-sequence cache (KV rows, compressor state, ...):
// sequences, how many positions each holds, and the capacity. Each model family has its
// own cache type behind this interface.
#pragma once

#include <cstdint>

namespace r3::models {

class ModelCache {
 public:
  virtual ~ModelCache() = default;
  virtual int64_t capacity() const = 0;   // positions per sequence
  virtual int64_t max_seqs() const = 0;
  // Positions [0, length) of a sequence are cached.
  virtual int64_t length(int64_t seq) const = 0;
  virtual void set_length(int64_t seq, int64_t length) = 0;
  void clear(int64_t seq) { set_length(seq, 0); }
};

}  // namespace r3::models
