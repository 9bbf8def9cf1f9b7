// Tensor: a typed, shaped view of memory on a device, plus a shared owner that keeps the memory
// alive when someone must.
//
// Storage says where the memory came from: owned (Tensor::empty, freed with the last copy),
// mapped (a zero-copy view of an mmap'ed checkpoint, kept alive by the mapping), or a view (of
// another tensor, or of a step workspace, which outlives the step's tensors by construction and
// so needs no owner: making such a tensor allocates nothing). Strides are in elements; ops in
// src/ops expect contiguous tensors and say so.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace r3 {

enum class Storage { kOwned, kMapped, kView };

struct BlockScales;
struct MxScales;

std::string shape_to_string(const Shape& shape);  // "[2, 3]"
int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::U16; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }

class Tensor {
 public:
  Tensor() = default;

  // Owned, zero-filled, contiguous host memory.
  static Tensor empty(DType dtype, Shape shape);
  // Contiguous view of memory kept alive by `owner` (or by whoever made it, when null).
  static Tensor view(DType dtype, Shape shape, void* data, std::shared_ptr<const void> owner,
                     Storage storage = Storage::kView, Device device = Device::kCpu);
  // Owned contiguous copy of `values` with the given shape.
  template <typename T>
  static Tensor from(const std::vector<T>& values, Shape shape) {
    R3_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()),
             "Tensor::from: ", values.size(), " values do not fill shape ", shape_to_string(shape));
    Tensor t = empty(dtype_of<T>(), std::move(shape));
    std::copy(values.begin(), values.end(), t.data<T>());
    return t;
  }

  // False for a default-constructed tensor (an absent optional weight).
  bool defined() const { return data_ != nullptr; }
  // This tensor, or nullptr when undefined: for optional operands such as biases.
  const Tensor* if_defined() const { return defined() ? this : nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  Storage storage() const { return storage_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int axis) const;
  int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const { return strides_ == contiguous_strides(shape_); }

  void* raw_data() { return data_; }
  const void* raw_data() const { return data_; }

  template <typename T>
  T* data() {
    R3_CHECK(dtype_ == dtype_of<T>(), "tensor holds ", dtype_name(dtype_), ", asked for ",
             dtype_name(dtype_of<T>()));
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* data() const {
    return const_cast<Tensor*>(this)->data<T>();
  }

  // Whether another tensor (a view, a copy of this handle) still holds this tensor's memory, so
  // that writing it would change what someone else reads. False for an unowned view.
  bool storage_shared() const { return owner_.use_count() > 1; }
  // View of rows [begin, end) along axis 0 (shares the owner, and the block scales: the view
  // remembers which row of the scaled matrix is its first).
  Tensor rows(int64_t begin, int64_t end) const;
  // View of rows begin, begin + step, ... below end: a strided view (not contiguous; each row
  // still is). GPT-OSS interleaves its experts' gate and up rows in one matrix, so gate and up are
  // such views of the mapped MXFP4 bytes. MXFP4 scales are sliced alike; block scales (FP8) cannot
  // follow a step and refuse one.
  Tensor rows(int64_t begin, int64_t end, int64_t step) const;
  // Same memory, new contiguous shape with the same element count (not for block-scaled tensors,
  // whose scales belong to their matrix shape).
  Tensor reshaped(Shape shape) const;
  // The same contiguous bytes read as another dtype and shape of the same byte count (U8 blocks of
  // a checkpoint as F4_E2M1X2 values); nothing may be attached yet.
  Tensor reinterpreted(DType dtype, Shape shape) const;

  // The scales of a block-quantized weight (FP8 e4m3 with `weight_scale_inv`), or nullptr when the
  // stored values are the values. See BlockScales.
  const BlockScales* block_scales() const { return block_scales_.get(); }
  // This rank-2 F8_E4M3 tensor (same memory) with `scales` attached; checks the scales cover it
  // and reads the values once (BlockScales::plain): they must not change afterwards.
  Tensor with_block_scales(BlockScales scales) const;

  // The scales of an MXFP4 matrix (F4_E2M1X2), or nullptr. See MxScales.
  const MxScales* mx_scales() const { return mx_scales_.get(); }
  // This rank-2 F4_E2M1X2 tensor (same memory, rows contiguous) with its e8m0 scales attached
  // (U8 [rows, ceil(cols / 32)], rows contiguous); checks they cover it.
  Tensor with_mx_scales(Tensor scales) const;

 private:
  DType dtype_ = DType::F32;
  Device device_ = Device::kCpu;
  Storage storage_ = Storage::kOwned;
  Shape shape_;
  Shape strides_;
  void* data_ = nullptr;
  std::shared_ptr<const void> owner_;
  std::shared_ptr<const BlockScales> block_scales_;
  std::shared_ptr<const MxScales> mx_scales_;
};

// Block scales of a weight matrix stored quantized, as published FP8 checkpoints store them:
// `<name>.weight` in F8_E4M3 and `<name>.weight_scale_inv`, one scale per block of block_rows x
// block_cols elements (the last blocks of a row or column may be partial). Element (r, c) of the
// matrix is decode(value(r, c)) * scales[(first_row + r) / block_rows][c / block_cols], a product
// rounded once to float32.
//
// Why the scales ride on the Tensor: every consumer of a weight (WeightMatrix for the matmul
// kernels, the experts' banks, embeddings, widening for the few weights read element by element)
// already receives one Tensor per weight from Checkpoint::load_weight. Attaching the scales there
// lets all of them take FP8 weights without new parameters or any knowledge of files, keeps the
// weight itself a zero-copy view of the mapped FP8 bytes, and survives copies (EPLB replicas) and
// row views (MLA splits kv_a_proj by rows) without a separate tensor to carry along.
struct BlockScales {
  Tensor scales;  // F32 [ceil(matrix rows / block_rows), ceil(cols / block_cols)], contiguous
  int64_t block_rows = 0, block_cols = 0;
  int64_t first_row = 0;  // row of the scaled matrix that is row 0 of the tensor holding these
  // Set by Tensor::with_block_scales: no byte of the matrix is the e4m3 NaN and every scale times
  // 2^120 is finite, which lets the vector kernel decode more cheaply and fold a power of two into
  // the scale (ops/cpu/matmul_avx512.cpp) with the same bits.
  bool plain = false;

  // The scale of element (row, col) of the tensor holding these scales.
  float at(int64_t row, int64_t col) const {
    return static_cast<const float*>(scales.raw_data())[((first_row + row) / block_rows) * scales.dim(1) +
                                                        col / block_cols];
  }
};

// Microscaling (OCP MX) scales of an MXFP4 weight matrix, as GPT-OSS's checkpoints store them
// beside the packed values (`*_blocks` U8 [..., rows, cols / 32, 16], `*_scales` U8 [..., rows,
// cols / 32]): one e8m0 byte per block of 32 consecutive values of a row. Value c of row r is
// e2m1(nibble c) * 2^(scales[r][c / 32] - 127): an exact float32 (e2m1 has two significant bits,
// and 0.5 * 2^-127 is still a float32 subnormal), or +-inf where it exceeds float32's range, and
// NaN for the e8m0 NaN, 255 (checkpoints holding it are refused at load).
//
// Like BlockScales they ride on the weight Tensor, so the expert banks, EPLB replicas and row views
// carry them without new parameters. Unlike FP8's, they stay e8m0 bytes (a view of the mapped
// file, like the values): widened to float32 they would add a quarter of the blocks' size to
// resident memory. The kernels decode one scale per 32 values, so the bytes cost nothing there.
struct MxScales {
  static constexpr int64_t kBlock = 32;  // values per scale
  Tensor scales;  // U8 [rows, ceil(cols / 32)], rows contiguous (strided when the matrix is)
};

// The shape of the values `t` holds: its shape, with the last dimension doubled for F4_E2M1X2.
Shape value_shape(const Tensor& t);

// Row `row` of a rank-2 floating tensor as float32 (value_shape(t)[1] floats): the stored values
// widened exactly, times their block scale (one float32 rounding) when the tensor has block
// scales, or e2m1 times 2^(scale - 127) for MXFP4.
void row_to_f32(const Tensor& t, int64_t row, float* dst);
// A contiguous float32 copy of a rank-1 or rank-2 floating tensor (block or MXFP4 scales applied),
// or the tensor itself when it is F32 already.
Tensor to_f32(const Tensor& t);
// An owned contiguous copy of a tensor whose rows are contiguous (a strided row view included),
// with the same scales attached (shared: they are never written).
Tensor contiguous_copy(const Tensor& t);

}  // namespace r3
