// models/weights_on_device.h: a host model's weights copied to a device, stacked where a layer
// runs several projections as one.
#include "models/weights_on_device.h"

#include <cstring>

#include "backend/device_memory.h"

namespace r3::models {

namespace {
// A weight published quantized (FP8 with block scales, MXFP4): placed as stored, never widened.
bool stored_quantized(const Tensor& w) { return w.block_scales() != nullptr || w.mx_scales() != nullptr; }

// Host tensors of one width stacked as the rows of one float32 host tensor (each widened exactly).
Tensor stacked_rows(std::initializer_list<const Tensor*> parts) {
  const int64_t cols = (*parts.begin())->rank() == 1 ? 1 : (*parts.begin())->shape().back();
  int64_t rows = 0;
  for (const Tensor* t : parts) rows += t->numel() / cols;
  Tensor out = Tensor::empty(DType::F32, cols == 1 ? Shape{rows} : Shape{rows, cols});
  float* dst = out.data<float>();
  for (const Tensor* t : parts) {
    R3_CHECK(t->is_contiguous() && (t->rank() == 1 ? cols == 1 : t->shape().back() == cols),
             "stacking projections: ", shape_to_string(t->shape()), " does not have ", cols, " columns");
    R3_CHECK(!stored_quantized(*t), "stacking projections: quantized weights stay apart");
    convert_to_f32(t->raw_data(), t->dtype(), static_cast<std::size_t>(t->numel()), dst);
    dst += t->numel();
  }
  return out;
}

// FP8 q, k and v stacked as one FP8 matrix with their scale rows stacked alike, possible when each
// starts and ends on a block-row boundary (Qwen3-30B-A3B-FP8: 4096 + 512 + 512 rows in blocks of
// 128), so that one scale grid serves all three; an undefined tensor otherwise (they then run as
// three projections).
Tensor stacked_fp8_rows(std::initializer_list<const Tensor*> parts) {
  const BlockScales* s0 = (*parts.begin())->block_scales();
  if (s0 == nullptr) return Tensor();
  const int64_t cols = (*parts.begin())->dim(1);
  int64_t rows = 0;
  for (const Tensor* t : parts) {
    const BlockScales* s = t->block_scales();
    if (s == nullptr || t->dtype() != DType::F8_E4M3 || !t->is_contiguous() || t->dim(1) != cols ||
        s->block_rows != s0->block_rows || s->block_cols != s0->block_cols || s->first_row % s->block_rows != 0 ||
        t->dim(0) % s->block_rows != 0) {
      return Tensor();
    }
    rows += t->dim(0);
  }
  const int64_t scale_cols = s0->scales.dim(1);
  Tensor values = Tensor::empty(DType::F8_E4M3, {rows, cols});
  Tensor scales = Tensor::empty(DType::F32, {rows / s0->block_rows, scale_cols});
  auto* dst = static_cast<unsigned char*>(values.raw_data());
  float* scale_dst = scales.data<float>();
  for (const Tensor* t : parts) {
    const BlockScales* s = t->block_scales();
    std::memcpy(dst, t->raw_data(), t->nbytes());
    dst += t->nbytes();
    const int64_t scale_rows = t->dim(0) / s->block_rows;
    std::memcpy(scale_dst, s->scales.data<float>() + (s->first_row / s->block_rows) * scale_cols,
                sizeof(float) * static_cast<std::size_t>(scale_rows * scale_cols));
    scale_dst += scale_rows * scale_cols;
  }
  BlockScales stacked;
  stacked.scales = std::move(scales);
  stacked.block_rows = s0->block_rows;
  stacked.block_cols = s0->block_cols;
  return values.with_block_scales(std::move(stacked));
}
}  // namespace

Tensor on_device(backend::Context& ctx, const Tensor& host, DType dtype) {
  return host.defined() ? backend::to_device_as(ctx, host, dtype) : Tensor();
}

Tensor stacked_on_device(backend::Context& ctx, std::initializer_list<const Tensor*> parts, DType dtype) {
  bool quantized = false;
  for (const Tensor* t : parts) quantized = quantized || stored_quantized(*t);
  if (!quantized) return on_device(ctx, stacked_rows(parts), dtype);
  const Tensor fp8 = stacked_fp8_rows(parts);
  return fp8.defined() ? on_device(ctx, fp8, dtype) : Tensor();
}

SwigluMlp mlp_on_device(backend::Context& ctx, const SwigluMlp& host, DType dtype) {
  return SwigluMlp(on_device(ctx, host.gate(), dtype), on_device(ctx, host.up(), dtype),
                   on_device(ctx, host.down(), dtype), host.limit());
}

}  // namespace r3::models
