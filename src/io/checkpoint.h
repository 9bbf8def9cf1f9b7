// A Hugging Face checkpoint folder: `model.safetensors`, or shards listed by
// `model.safetensors.index.json`. Tensors are loaded by name as float32 for CPU compute;
// F32 tensors are zero-copy views of the mapping, BF16/F16 are converted.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace r3 {

class Checkpoint {
 public:
  // Throws r3::Error when the folder holds no safetensors checkpoint, an index names a missing
  // shard or tensor, or a file is malformed.
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  std::size_t tensor_count() const { return where_.size(); }
  uint64_t total_bytes() const;  // stored bytes of all tensors
  Shape shape(const std::string& name) const;

  // Loads `name` as contiguous float32 of exactly `expected` shape. A missing tensor, a shape
  // mismatch or a non-floating dtype is an error naming the tensor, expected and found.
  Tensor load_f32(const std::string& name, const Shape& expected) const;
  // Loads `name` in its stored dtype (for integer tables), checking the shape.
  Tensor load_raw(const std::string& name, const Shape& expected) const;

  // Called with the stored byte count of each tensor as it is loaded (progress reporting).
  void on_load(std::function<void(uint64_t)> callback) { on_load_ = std::move(callback); }
  // Names never loaded so far, sorted (to warn about weights a model ignored).
  std::vector<std::string> unused() const;

 private:
  const SafetensorsEntry& entry(const std::string& name, const Shape& expected) const;

  std::string dir_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
  std::function<void(uint64_t)> on_load_;
  mutable std::set<std::string> loaded_;
};

}  // namespace r3
