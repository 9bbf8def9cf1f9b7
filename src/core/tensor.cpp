#include "core/tensor.h"

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

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  R3_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "rows [", begin, ", ",
           end, ") out of range for shape ", shape_to_string(shape_));
  Tensor t = *this;
  if (t.storage_ == Storage::kOwned) t.storage_ = Storage::kView;
  t.shape_[0] = end - begin;
  t.data_ = static_cast<unsigned char*>(data_) +
            static_cast<std::size_t>(begin * strides_[0]) * dtype_size(dtype_);
  return t;
}

Tensor Tensor::reshaped(Shape shape) const {
  R3_CHECK(is_contiguous(), "reshape needs a contiguous tensor");
  R3_CHECK(shape_numel(shape) == numel(), "cannot reshape ", shape_to_string(shape_), " to ",
           shape_to_string(shape));
  Tensor t = *this;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

}  // namespace r3
