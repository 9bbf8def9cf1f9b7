#include "core/tensor.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>

#include "core/checked.h"

namespace r3 {

std::string shape_to_string(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n) || d < 0) {
      R3_CHECK(d >= 0, "negative dimension in shape ", shape_to_string(shape));
      R3_FAIL("element count of shape ", shape_to_string(shape), " overflows");
    }
  }
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

Tensor Tensor::empty(DType dtype, Shape shape) {
  const auto bytes = checked_mul(static_cast<std::size_t>(shape_numel(shape)), dtype_size(dtype),
                                 "bytes of a tensor");  // shape_numel refuses negative and overflowing shapes
  R3_CHECK(bytes <= static_cast<std::size_t>(PTRDIFF_MAX), "tensor of shape ", shape_to_string(shape), " is too large");
  // operator new[] with value-init gives zeroed, suitably aligned memory for every dtype.
  std::shared_ptr<unsigned char[]> storage(new unsigned char[bytes == 0 ? 1 : bytes]());
  Tensor t;
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.data_ = storage.get();
  t.owner_ = std::shared_ptr<const void>(storage, storage.get());
  return t;
}

Tensor Tensor::view(DType dtype, Shape shape, void* data, std::shared_ptr<const void> owner, Storage storage,
                    Device device) {
  Tensor t;
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = storage;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.owner_ = std::move(owner);
  return t;
}

int64_t Tensor::dim(int axis) const {
  R3_CHECK(axis >= 0 && axis < rank(), "axis ", axis, " out of range for shape ",
           shape_to_string(shape_));
  return shape_[static_cast<std::size_t>(axis)];
}

Tensor Tensor::rows(int64_t begin, int64_t end) const { return rows(begin, end, 1); }

Tensor Tensor::rows(int64_t begin, int64_t end, int64_t step) const {
  R3_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0] && step >= 1, "rows [", begin, ", ",
           end, ") step ", step, " out of range for shape ", shape_to_string(shape_));
  R3_CHECK(step == 1 || block_scales_ == nullptr, "the block-scaled ", dtype_name(dtype_), " matrix ",
           shape_to_string(shape_), " cannot be viewed every ", step, " rows (its scales cover row blocks)");
  Tensor t = *this;
  if (t.storage_ == Storage::kOwned) t.storage_ = Storage::kView;
  if (block_scales_) {
    auto shifted = std::make_shared<BlockScales>(*block_scales_);
    shifted->first_row += begin;
    t.block_scales_ = std::move(shifted);
  }
  if (mx_scales_) {  // one scale row per matrix row: the same rows of the scales
    auto sliced = std::make_shared<MxScales>(*mx_scales_);
    sliced->scales = sliced->scales.rows(begin, end, step);
    t.mx_scales_ = std::move(sliced);
  }
  t.shape_[0] = (end - begin + step - 1) / step;
  t.strides_[0] = strides_[0] * step;
  t.data_ = static_cast<unsigned char*>(data_) +
            static_cast<std::size_t>(begin * strides_[0]) * dtype_size(dtype_);
  return t;
}

Tensor Tensor::reshaped(Shape shape) const {
  R3_CHECK(is_contiguous(), "reshape needs a contiguous tensor");
  R3_CHECK(shape_numel(shape) == numel(), "cannot reshape ", shape_to_string(shape_), " to ",
           shape_to_string(shape));
  R3_CHECK(block_scales_ == nullptr || shape == shape_, "cannot reshape the block-scaled ", dtype_name(dtype_),
           " matrix ", shape_to_string(shape_), " to ", shape_to_string(shape));
  R3_CHECK(mx_scales_ == nullptr || shape == shape_, "cannot reshape the MXFP4 matrix ", shape_to_string(shape_), " to ",
           shape_to_string(shape));
  Tensor t = *this;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::reinterpreted(DType dtype, Shape shape) const {
  R3_CHECK(is_contiguous() && block_scales_ == nullptr && mx_scales_ == nullptr,
           "reinterpreting needs a contiguous tensor with nothing attached");
  R3_CHECK(static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype) == nbytes() &&
               reinterpret_cast<uintptr_t>(data_) % dtype_size(dtype) == 0,
           "cannot read the ", nbytes(), " bytes of a ", dtype_name(dtype_), " ", shape_to_string(shape_), " tensor as ",
           dtype_name(dtype), " ", shape_to_string(shape));
  Tensor t = *this;
  t.dtype_ = dtype;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::with_block_scales(BlockScales scales) const {
  R3_CHECK(dtype_ == DType::F8_E4M3, "block scales apply to F8_E4M3 weights, not ", dtype_name(dtype_));
  R3_CHECK(rank() == 2 && is_contiguous(), "block scales need a contiguous matrix, got ", shape_to_string(shape_));
  R3_CHECK(scales.block_rows > 0 && scales.block_cols > 0 && scales.first_row >= 0, "block scales: block [",
           scales.block_rows, ", ", scales.block_cols, "] at row ", scales.first_row);
  R3_CHECK(scales.scales.dtype() == DType::F32 && scales.scales.rank() == 2 && scales.scales.is_contiguous() &&
               scales.scales.dim(0) * scales.block_rows >= scales.first_row + shape_[0] &&
               scales.scales.dim(1) == (shape_[1] + scales.block_cols - 1) / scales.block_cols,
           "block scales ", dtype_name(scales.scales.dtype()), " ", shape_to_string(scales.scales.shape()),
           " do not cover a ", shape_to_string(shape_), " matrix in blocks of [", scales.block_rows, ", ",
           scales.block_cols, "]");
  R3_CHECK(scales.scales.device() == device_, "block scales on another device than their matrix");
  bool plain = device_ == Device::kCpu;  // the device kernels do not use it, and cannot be read here
  if (plain) {
    const auto* bytes = static_cast<const uint8_t*>(data_);
    for (int64_t i = 0, n = numel(); i < n && plain; ++i) plain = (bytes[i] & 0x7F) != 0x7F;
    const float* s = scales.scales.data<float>();
    for (int64_t i = 0, n = scales.scales.numel(); i < n && plain; ++i) plain = std::isfinite(s[i] * 0x1p120f);
  }
  scales.plain = plain;
  Tensor t = *this;
  t.block_scales_ = std::make_shared<const BlockScales>(std::move(scales));
  return t;
}

Tensor Tensor::with_mx_scales(Tensor scales) const {
  R3_CHECK(dtype_ == DType::F4_E2M1X2, "MXFP4 scales apply to F4_E2M1X2 weights, not ", dtype_name(dtype_));
  R3_CHECK(rank() == 2 && strides_[1] == 1, "MXFP4 scales need a matrix with contiguous rows, got ",
           shape_to_string(shape_));
  const int64_t groups = (2 * shape_[1] + MxScales::kBlock - 1) / MxScales::kBlock;
  R3_CHECK(scales.dtype() == DType::U8 && scales.rank() == 2 && scales.strides()[1] == 1 && scales.dim(0) == shape_[0] &&
               scales.dim(1) == groups,
           "MXFP4 scales ", dtype_name(scales.dtype()), " ", shape_to_string(scales.shape()), " do not cover a [",
           shape_[0], ", ", 2 * shape_[1], "] matrix in blocks of ", MxScales::kBlock, " values (expected U8 [",
           shape_[0], ", ", groups, "])");
  Tensor t = *this;
  t.mx_scales_ = std::make_shared<const MxScales>(MxScales{std::move(scales)});
  return t;
}

Shape value_shape(const Tensor& t) {
  Shape shape = t.shape();
  if (t.dtype() == DType::F4_E2M1X2 && !shape.empty()) shape[shape.size() - 1] *= 2;
  return shape;
}

namespace {

// Row `row` of an MXFP4 matrix: e2m1 * 2^(scale - 127), one float32 product per value.
void mx_row_to_f32(const Tensor& t, int64_t row, float* dst) {
  const MxScales* s = t.mx_scales();
  R3_CHECK(s != nullptr, "row_to_f32: F4_E2M1X2 ", shape_to_string(t.shape()), " without its MXFP4 scales");
  const auto* bytes = static_cast<const uint8_t*>(t.raw_data()) + row * t.strides()[0];
  const auto* scales = static_cast<const uint8_t*>(s->scales.raw_data()) + row * s->scales.strides()[0];
  for (int64_t c = 0; c < 2 * t.dim(1); ++c) {
    const uint8_t byte = bytes[c / 2];
    dst[c] = f4_e2m1_to_f32(c % 2 == 0 ? byte & 0xF : byte >> 4) * e8m0_to_f32(scales[c / MxScales::kBlock]);
  }
}

bool rows_contiguous(const Tensor& t) { return t.rank() == 2 && t.strides()[1] == 1; }

}  // namespace

void row_to_f32(const Tensor& t, int64_t row, float* dst) {
  R3_CHECK(t.rank() == 2 && (t.is_contiguous() || (t.dtype() == DType::F4_E2M1X2 && rows_contiguous(t))) &&
               row >= 0 && row < t.dim(0),
           "row_to_f32: row ", row, " of ", shape_to_string(t.shape()));
  if (t.dtype() == DType::F4_E2M1X2) return mx_row_to_f32(t, row, dst);
  const int64_t cols = t.dim(1);
  const auto* src = static_cast<const unsigned char*>(t.raw_data()) +
                    static_cast<std::size_t>(row * cols) * dtype_size(t.dtype());
  convert_to_f32(src, t.dtype(), static_cast<std::size_t>(cols), dst);
  if (const BlockScales* s = t.block_scales()) {
    for (int64_t c = 0; c < cols; ++c) dst[c] = dst[c] * s->at(row, c);
  }
}

Tensor to_f32(const Tensor& t) {
  if (t.dtype() == DType::F4_E2M1X2) {
    R3_CHECK(rows_contiguous(t), "to_f32: F4_E2M1X2 ", shape_to_string(t.shape()), " is not a matrix of contiguous rows");
    Tensor out = Tensor::empty(DType::F32, value_shape(t));
    for (int64_t r = 0; r < t.dim(0); ++r) mx_row_to_f32(t, r, out.data<float>() + r * out.dim(1));
    return out;
  }
  R3_CHECK(t.is_contiguous() && is_floating(t.dtype()), "to_f32: needs a contiguous floating tensor, got ",
           dtype_name(t.dtype()), " ", shape_to_string(t.shape()));
  if (t.dtype() == DType::F32) return t;
  Tensor out = Tensor::empty(DType::F32, t.shape());
  if (t.block_scales() == nullptr || t.rank() != 2) {
    R3_CHECK(t.block_scales() == nullptr, "to_f32: block scales on a rank-", t.rank(), " tensor");
    convert_to_f32(t.raw_data(), t.dtype(), static_cast<std::size_t>(t.numel()), out.data<float>());
    return out;
  }
  for (int64_t r = 0; r < t.dim(0); ++r) row_to_f32(t, r, out.data<float>() + r * t.dim(1));
  return out;
}

Tensor contiguous_copy(const Tensor& t) {
  R3_CHECK(t.device() == Device::kCpu && (t.is_contiguous() || rows_contiguous(t)),
           "contiguous_copy: needs a host tensor whose rows are contiguous, got ", shape_to_string(t.shape()));
  Tensor c = Tensor::empty(t.dtype(), t.shape());
  if (t.is_contiguous()) {
    std::memcpy(c.raw_data(), t.raw_data(), t.nbytes());
  } else {
    const std::size_t row_bytes = static_cast<std::size_t>(t.dim(1)) * dtype_size(t.dtype());
    for (int64_t r = 0; r < t.dim(0); ++r) {
      std::memcpy(static_cast<unsigned char*>(c.raw_data()) + static_cast<std::size_t>(r) * row_bytes,
                  static_cast<const unsigned char*>(t.raw_data()) +
                      static_cast<std::size_t>(r * t.strides()[0]) * dtype_size(t.dtype()),
                  row_bytes);
    }
  }
  if (t.block_scales() != nullptr) return c.with_block_scales(*t.block_scales());
  if (t.mx_scales() != nullptr) return c.with_mx_scales(t.mx_scales()->scales);
  return c;
}

}  // namespace r3
