#include "moe/ep/expert_weights_wire.h"

#include <cstring>

#include "core/check.h"

namespace r3::moe::ep {

namespace {

enum class ScaleKind : uint8_t { kNone, kBlock, kMx };

// A tensor of more dimensions than a weight has is a corrupt message, not a weight.
constexpr int32_t kMaxRank = 4;
// Nor is a scale block wider than any checkpoint's (128 x 128 as published).
constexpr int64_t kMaxBlock = int64_t{1} << 20;

void put(Buffer& out, const void* p, std::size_t bytes) {
  const auto* b = static_cast<const std::byte*>(p);
  out.insert(out.end(), b, b + bytes);
}
template <typename T>
void put(Buffer& out, T v) {
  put(out, &v, sizeof v);
}

void put_tensor(Buffer& out, const Tensor& t) {
  put<uint8_t>(out, t.defined() ? 1 : 0);
  if (!t.defined()) return;
  const Tensor packed = t.is_contiguous() ? t : contiguous_copy(t);  // rows packed; scales attached
  put<uint8_t>(out, static_cast<uint8_t>(packed.dtype()));
  put<int32_t>(out, static_cast<int32_t>(packed.rank()));
  for (int64_t d : packed.shape()) put<int64_t>(out, d);
  put(out, packed.raw_data(), packed.nbytes());
  if (const BlockScales* s = packed.block_scales()) {
    // Only the block rows this matrix touches, re-based so that its first row stays inside the
    // first of them at the same offset.
    const int64_t first_block = s->first_row / s->block_rows;
    const int64_t end_block = (s->first_row + packed.dim(0) + s->block_rows - 1) / s->block_rows;
    const int64_t cols = s->scales.dim(1);
    put<uint8_t>(out, static_cast<uint8_t>(ScaleKind::kBlock));
    put<int64_t>(out, s->block_rows);
    put<int64_t>(out, s->block_cols);
    put<int64_t>(out, s->first_row - first_block * s->block_rows);
    put<int64_t>(out, end_block - first_block);
    put<int64_t>(out, cols);
    put(out, s->scales.data<float>() + first_block * cols,
        sizeof(float) * static_cast<std::size_t>((end_block - first_block) * cols));
  } else if (const MxScales* mx = packed.mx_scales()) {
    const Tensor scales = contiguous_copy(mx->scales);
    put<uint8_t>(out, static_cast<uint8_t>(ScaleKind::kMx));
    put<int64_t>(out, scales.dim(0));
    put<int64_t>(out, scales.dim(1));
    put(out, scales.raw_data(), scales.nbytes());
  } else {
    put<uint8_t>(out, static_cast<uint8_t>(ScaleKind::kNone));
  }
}

// Bytes a tensor takes in a message, at most (its values, its scales, the headers).
std::size_t tensor_bytes(const Tensor& t) {
  if (!t.defined()) return 1;
  std::size_t bytes = 64 + t.nbytes();
  if (const BlockScales* s = t.block_scales()) bytes += 64 + s->scales.nbytes();
  if (const MxScales* mx = t.mx_scales()) bytes += 64 + static_cast<std::size_t>(mx->scales.numel());
  return bytes;
}

}  // namespace

std::size_t expert_bytes(const SwigluExpertWeights& w) {
  std::size_t bytes = sizeof(int32_t);
  for (const Tensor* t : {&w.gate, &w.up, &w.down, &w.gate_bias, &w.up_bias, &w.down_bias}) bytes += tensor_bytes(*t);
  return bytes;
}

void append_expert(Buffer& out, int32_t slot, const SwigluExpertWeights& w) {
  put<int32_t>(out, slot);
  for (const Tensor* t : {&w.gate, &w.up, &w.down, &w.gate_bias, &w.up_bias, &w.down_bias}) put_tensor(out, *t);
}

ExpertReader::ExpertReader(const Buffer& message, int source) : message_(message), source_(source) {}

void ExpertReader::read(void* dst, std::size_t bytes) {
  R3_CHECK(bytes <= message_.size() - at_, "EPLB: the expert weights from rank ", source_, " end after ",
           message_.size(), " bytes, inside an expert");
  std::memcpy(dst, message_.data() + at_, bytes);
  at_ += bytes;
}

Tensor ExpertReader::tensor() {
  if (value<uint8_t>() == 0) return Tensor();
  const auto dtype = value<uint8_t>();
  R3_CHECK(dtype <= static_cast<uint8_t>(DType::F4_E2M1X2), "EPLB: the expert weights from rank ", source_,
           " hold an unknown dtype (", static_cast<int>(dtype), ")");
  const auto rank = value<int32_t>();
  R3_CHECK(rank >= 1 && rank <= kMaxRank, "EPLB: the expert weights from rank ", source_, " hold a tensor of rank ",
           rank);
  Shape shape;
  for (int32_t i = 0; i < rank; ++i) {
    shape.push_back(value<int64_t>());
    R3_CHECK(shape.back() >= 0 && static_cast<uint64_t>(shape.back()) <= message_.size(), "EPLB: the expert weights from rank ",
             source_, " hold a dimension of ", shape.back());
  }
  // The dims are each at most the message's size; the product must be too before allocating.
  std::size_t count = 1;
  for (int64_t d : shape) {
    R3_CHECK(d == 0 || count <= message_.size() / static_cast<std::size_t>(d), "EPLB: the expert weights from rank ",
             source_, " hold a ", shape_to_string(shape), " tensor larger than the message");
    count *= static_cast<std::size_t>(d);
  }
  R3_CHECK(count * dtype_size(static_cast<DType>(dtype)) <= message_.size() - at_, "EPLB: the expert weights from rank ",
           source_, " end inside a ", shape_to_string(shape), " tensor");
  Tensor t = Tensor::empty(static_cast<DType>(dtype), shape);
  read(t.raw_data(), t.nbytes());
  const auto kind = static_cast<ScaleKind>(value<uint8_t>());
  if (kind == ScaleKind::kBlock) {
    BlockScales s;
    s.block_rows = value<int64_t>();
    s.block_cols = value<int64_t>();
    s.first_row = value<int64_t>();
    R3_CHECK(s.block_rows > 0 && s.block_rows <= kMaxBlock && s.block_cols > 0 && s.block_cols <= kMaxBlock &&
                 s.first_row >= 0 && s.first_row < s.block_rows,
             "EPLB: the expert weights from rank ", source_, " hold blocks of [", s.block_rows, ", ", s.block_cols,
             "] from row ", s.first_row);
    const auto rows = value<int64_t>(), cols = value<int64_t>();
    R3_CHECK(rows >= 0 && cols >= 0 && static_cast<uint64_t>(rows) <= message_.size() &&
                 static_cast<uint64_t>(cols) <= message_.size() &&
                 (cols == 0 || static_cast<std::size_t>(rows) <= (message_.size() - at_) / sizeof(float) / static_cast<std::size_t>(cols)),
             "EPLB: the expert weights from rank ", source_, " hold block scales of [", rows, ", ", cols,
             "] past the message's end");
    s.scales = Tensor::empty(DType::F32, {rows, cols});
    read(s.scales.raw_data(), s.scales.nbytes());
    return t.with_block_scales(std::move(s));  // checks that they cover the matrix
  }
  if (kind == ScaleKind::kMx) {
    const auto rows = value<int64_t>(), cols = value<int64_t>();
    R3_CHECK(rows >= 0 && cols >= 0 && static_cast<uint64_t>(rows) <= message_.size() &&
                 (cols == 0 || static_cast<std::size_t>(rows) <= (message_.size() - at_) / static_cast<std::size_t>(cols)),
             "EPLB: the expert weights from rank ", source_, " hold MXFP4 scales of [", rows, ", ", cols,
             "] past the message's end");
    Tensor scales = Tensor::empty(DType::U8, {rows, cols});
    read(scales.raw_data(), scales.nbytes());
    return t.with_mx_scales(std::move(scales));  // checks that they cover the matrix
  }
  R3_CHECK(kind == ScaleKind::kNone, "EPLB: the expert weights from rank ", source_, " hold an unknown scale kind (",
           static_cast<int>(kind), ")");
  return t;
}

std::pair<int32_t, SwigluExpertWeights> ExpertReader::next() {
  const auto slot = value<int32_t>();
  SwigluExpertWeights w;
  w.gate = tensor();
  w.up = tensor();
  w.down = tensor();
  w.gate_bias = tensor();
  w.up_bias = tensor();
  w.down_bias = tensor();
  R3_CHECK(w.gate.defined() && w.up.defined() && w.down.defined(), "EPLB: an expert from rank ", source_,
           " without its gate, up or down matrix");
  return {slot, std::move(w)};
}

}  // namespace r3::moe::ep
