#include "moe/device_experts.h"

#include <cstring>

#include "backend/device_memory.h"

namespace r3::moe {

namespace {

// The physical experts a device holds: [first, first + count) of the layer's.
struct ExpertRange {
  const PhysicalExperts& all;
  int32_t first, count;
  const SwigluExpertWeights& weights(int32_t e) const { return all.weights(first + e); }
};

// [experts, rows, cols] of `dtype` on the device from each physical expert's matrix `pick(weights)`.
template <typename Pick>
Tensor stacked(backend::Context& ctx, const ExpertRange& experts, DType dtype, Pick pick) {
  const Tensor& first = pick(experts.weights(0));
  const int64_t count = experts.count;
  Tensor host = Tensor::empty(dtype, {count, first.dim(0), first.dim(1)});
  auto* dst = static_cast<unsigned char*>(host.raw_data());
  const std::size_t matrix_bytes = static_cast<std::size_t>(first.numel()) * dtype_size(dtype);
  for (int32_t e = 0; e < count; ++e) {
    const Tensor& m = pick(experts.weights(e));
    R3_CHECK(m.shape() == first.shape() && m.is_contiguous(), "experts on the device: expert ", e, " holds ",
             shape_to_string(m.shape()), ", expert 0 ", shape_to_string(first.shape()));
    backend::convert_matrix(m, dtype, dst + static_cast<std::size_t>(e) * matrix_bytes);
  }
  return backend::to_device(ctx, host);
}

// The bytes of a host matrix whose rows are contiguous but may lie apart (GPT-OSS's gate and up
// are every other row of one MXFP4 matrix), packed row after row at dst.
void pack_rows(const Tensor& m, unsigned char* dst) {
  R3_CHECK(m.rank() == 2 && m.strides()[1] == 1, "experts on the device: a matrix with contiguous rows expected, got ",
           shape_to_string(m.shape()));
  const std::size_t size = dtype_size(m.dtype()), row_bytes = static_cast<std::size_t>(m.dim(1)) * size;
  const auto* src = static_cast<const unsigned char*>(m.raw_data());
  for (int64_t r = 0; r < m.dim(0); ++r) {
    std::memcpy(dst + static_cast<std::size_t>(r) * row_bytes, src + static_cast<std::size_t>(r * m.strides()[0]) * size,
                row_bytes);
  }
}

// A quantized matrix kind stacked as published: the values' bytes [experts, rows, stored cols],
// and the scales [experts, ...] (FP8: each expert's own block grid; MXFP4: one row per value row).
struct StackedQuantized {
  Tensor values, scales;
  int64_t block_rows = 0, block_cols = 0;
};

template <typename Pick>
StackedQuantized stacked_quantized(backend::Context& ctx, const ExpertRange& experts, Pick pick) {
  const Tensor& first = pick(experts.weights(0));
  const int64_t count = experts.count, rows = first.dim(0);
  Tensor values = Tensor::empty(first.dtype(), {count, rows, first.dim(1)});
  auto* dst = static_cast<unsigned char*>(values.raw_data());
  const std::size_t matrix_bytes = static_cast<std::size_t>(first.numel()) * dtype_size(first.dtype());
  StackedQuantized out;
  if (first.dtype() == DType::F8_E4M3) {
    const BlockScales& s0 = *first.block_scales();
    out.block_rows = s0.block_rows;
    out.block_cols = s0.block_cols;
    const int64_t scale_rows = (rows + s0.block_rows - 1) / s0.block_rows, scale_cols = s0.scales.dim(1);
    Tensor scales = Tensor::empty(DType::F32, {count, scale_rows, scale_cols});
    for (int32_t e = 0; e < count; ++e) {
      const Tensor& m = pick(experts.weights(e));
      const BlockScales* s = m.block_scales();
      R3_CHECK(m.shape() == first.shape() && m.is_contiguous() && s != nullptr && s->block_rows == s0.block_rows &&
                   s->block_cols == s0.block_cols && s->first_row % s->block_rows == 0,
               "experts on the device: expert ", e, "'s FP8 matrix ", shape_to_string(m.shape()),
               " is not laid out as expert 0's (", shape_to_string(first.shape()), ", blocks from a block's first row)");
      std::memcpy(dst + static_cast<std::size_t>(e) * matrix_bytes, m.raw_data(), matrix_bytes);
      const float* from = s->scales.data<float>() + (s->first_row / s->block_rows) * scale_cols;
      std::memcpy(scales.data<float>() + e * scale_rows * scale_cols, from,
                  sizeof(float) * static_cast<std::size_t>(scale_rows * scale_cols));
    }
    out.scales = backend::to_device(ctx, scales);
  } else {
    const Tensor& s0 = first.mx_scales()->scales;
    Tensor scales = Tensor::empty(DType::U8, {count, rows, s0.dim(1)});
    const std::size_t scale_bytes = static_cast<std::size_t>(rows * s0.dim(1));
    for (int32_t e = 0; e < count; ++e) {
      const Tensor& m = pick(experts.weights(e));
      R3_CHECK(m.shape() == first.shape() && m.mx_scales() != nullptr, "experts on the device: expert ", e,
               "'s MXFP4 matrix ", shape_to_string(m.shape()), " is not laid out as expert 0's");
      pack_rows(m, dst + static_cast<std::size_t>(e) * matrix_bytes);
      pack_rows(m.mx_scales()->scales, static_cast<unsigned char*>(scales.raw_data()) + e * scale_bytes);
    }
    out.scales = backend::to_device(ctx, scales);
  }
  out.values = backend::to_device(ctx, values);
  return out;
}

bool is_quantized(const Tensor& w) {
  return (w.dtype() == DType::F8_E4M3 && w.block_scales() != nullptr) ||
         (w.dtype() == DType::F4_E2M1X2 && w.mx_scales() != nullptr);
}

// [experts, n] F32 biases, or undefined when the experts have none.
template <typename Pick>
Tensor stacked_bias(backend::Context& ctx, const ExpertRange& experts, Pick pick) {
  if (!pick(experts.weights(0)).defined()) return Tensor();
  const int64_t n = pick(experts.weights(0)).numel();
  Tensor host = Tensor::empty(DType::F32, {experts.count, n});
  for (int32_t e = 0; e < experts.count; ++e) {
    const Tensor& b = pick(experts.weights(e));
    R3_CHECK(b.dtype() == DType::F32 && b.numel() == n, "experts on the device: expert ", e, "'s bias");
    std::memcpy(host.data<float>() + e * n, b.data<float>(), sizeof(float) * static_cast<std::size_t>(n));
  }
  return backend::to_device(ctx, host);
}

}  // namespace

DeviceExperts upload_experts(backend::Context& ctx, const PhysicalExperts& layer, DType dtype, ExpertSlice slice) {
  R3_CHECK(dtype == DType::F32 || dtype == DType::BF16, "experts on the device: F32 or BF16, not ", dtype_name(dtype));
  R3_CHECK(layer.num_physical() > 0, "experts on the device: no experts");
  const int32_t count = slice.count < 0 ? static_cast<int32_t>(layer.num_physical()) - slice.first : slice.count;
  R3_CHECK(slice.first >= 0 && count >= 1 && slice.first + count <= layer.num_physical(), "experts on the device: ",
           count, " experts from ", slice.first, " of ", layer.num_physical());
  const ExpertRange experts{layer, slice.first, count};
  DeviceExperts d;
  d.first = slice.first;
  const auto gate = [](const SwigluExpertWeights& w) -> const Tensor& { return w.gate; };
  const auto up = [](const SwigluExpertWeights& w) -> const Tensor& { return w.up; };
  const auto down = [](const SwigluExpertWeights& w) -> const Tensor& { return w.down; };
  const SwigluExpertWeights& first = experts.weights(0);
  if (is_quantized(first.gate)) {
    R3_CHECK(is_quantized(first.up) && is_quantized(first.down) && first.up.dtype() == first.gate.dtype() &&
                 first.down.dtype() == first.gate.dtype(),
             "experts on the device: gate, up and down quantized alike expected");
    StackedQuantized g = stacked_quantized(ctx, experts, gate), u = stacked_quantized(ctx, experts, up),
                     dn = stacked_quantized(ctx, experts, down);
    R3_CHECK(g.block_rows == dn.block_rows && g.block_cols == dn.block_cols && u.block_rows == g.block_rows &&
                 u.block_cols == g.block_cols,
             "experts on the device: gate, up and down with different FP8 blocks");
    d.gate = std::move(g.values);
    d.up = std::move(u.values);
    d.down = std::move(dn.values);
    d.gate_scales = std::move(g.scales);
    d.up_scales = std::move(u.scales);
    d.down_scales = std::move(dn.scales);
    d.block_rows = g.block_rows;
    d.block_cols = g.block_cols;
  } else {
    d.gate = stacked(ctx, experts, dtype, gate);
    d.up = stacked(ctx, experts, dtype, up);
    d.down = stacked(ctx, experts, dtype, down);
  }
  d.gate_bias = stacked_bias(ctx, experts, [](const SwigluExpertWeights& w) -> const Tensor& { return w.gate_bias; });
  d.up_bias = stacked_bias(ctx, experts, [](const SwigluExpertWeights& w) -> const Tensor& { return w.up_bias; });
  d.down_bias = stacked_bias(ctx, experts, [](const SwigluExpertWeights& w) -> const Tensor& { return w.down_bias; });
  d.activation = layer.activation();
  return d;
}

}  // namespace r3::moe
