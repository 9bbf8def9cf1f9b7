// A Hugging Face checkpoint folder: `model.safetensors`, or shards listed by
// `model.safetensors.index.json`. Tensors are loaded by name: weight matrices in the dtype the
// file stores (zero-copy views of the mapping), small tensors widened to float32.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/quantization.h"
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
  std::vector<std::string> tensor_names() const;  // sorted
  uint64_t stored_bytes(const std::string& name) const;
  Shape shape(const std::string& name) const;

  // Loads `name` as contiguous float32 of exactly `expected` shape. A missing tensor, a shape
  // mismatch or a non-floating dtype is an error naming the tensor, expected and found.
  Tensor load_f32(const std::string& name, const Shape& expected) const;
  // Loads a weight matrix for the matmul kernels (ops/matmul.h), which read F32, BF16, F16 and
  // block-scaled F8_E4M3: those stay as stored, a zero-copy view of the mapping when aligned (a
  // copy otherwise), so resident memory stays at the file size; F64 is narrowed to F32. Its pages
  // are read in now, so the first step does not pay for them. An F8_E4M3 weight comes with its
  // `<name>_scale_inv` attached (Tensor::block_scales(), widened to F32), as the quantization
  // (set_quantization) describes it; load_f32 of one is its dequantized float32 copy.
  Tensor load_weight(const std::string& name, const Shape& expected) const;
  // Loads `name` in its stored dtype (for integer tables), checking the shape.
  Tensor load_raw(const std::string& name, const Shape& expected) const;

  // Whether the stack of matrices `name` (GPT-OSS's `...mlp.experts.gate_up_proj`) is to be read
  // as MXFP4: the checkpoint holds `<name>_blocks`, or the quantization is "mxfp4" and no entry of
  // modules_to_not_convert covers it (load_mxfp4 then names the missing blocks).
  bool stores_mxfp4(const std::string& name) const;
  // Loads the MXFP4 stack `name` as published: `<name>_blocks` U8 [..., rows, cols / 32, 16] and
  // `<name>_scales` U8 [..., rows, cols / 32] for `expected` = [..., rows, cols] values (cols a
  // multiple of 32), as one F4_E2M1X2 matrix [prod(...) * rows, cols / 2] with its MxScales
  // attached, both zero-copy views of the mapping read in now (Tensor::rows takes one matrix or
  // every other row). Refuses, naming the tensor: blocks or scales missing or of another shape or
  // dtype, a scale of 255 (e8m0's NaN), blocks without the "mxfp4" quantization_config or inside a
  // module it leaves unconverted.
  Tensor load_mxfp4(const std::string& name, const Shape& expected) const;

  // The checkpoint's quantization_config (io/quantization.h). Without one, an F8_E4M3 weight or
  // MXFP4 blocks are refused.
  void set_quantization(WeightQuantization q) { quantization_ = std::move(q); }
  const WeightQuantization& quantization() const { return quantization_; }

  // Called with the stored byte count of each tensor as it is loaded (progress reporting).
  void on_load(std::function<void(uint64_t)> callback) { on_load_ = std::move(callback); }
  // Names never loaded so far, sorted (to warn about weights a model ignored).
  std::vector<std::string> unused() const;
  // The stored tensors read since the last call, in order (a weight's block scales, MXFP4 blocks
  // and scales included): what one load read, for the model's parameter table.
  std::vector<std::string> take_reads() const;

 private:
  const SafetensorsEntry& entry(const std::string& name, const Shape& expected) const;
  // `e` as contiguous float32 (a zero-copy view for aligned F32).
  Tensor widened(const std::string& name, const SafetensorsEntry& e) const;
  // The F8_E4M3 weight `name` (entry `e`, already checked) with its block scales attached.
  Tensor block_scaled(const std::string& name, const SafetensorsEntry& e) const;

  std::string dir_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
  std::function<void(uint64_t)> on_load_;
  WeightQuantization quantization_;
  mutable std::set<std::string> loaded_;
  mutable std::vector<std::string> reads_;
};

}  // namespace r3
