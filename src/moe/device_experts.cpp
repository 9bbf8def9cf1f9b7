#include "moe/device_experts.h"

#include <cstring>

#include "backend/device_memory.h"

namespace r3::moe {

namespace {

// [experts, rows, cols] of `dtype` on the device from each physical expert's matrix `pick(weights)`.
template <typename Pick>
Tensor stacked(backend::Context& ctx, const PhysicalExperts& experts, DType dtype, Pick pick) {
  const Tensor& first = pick(experts.weights(0));
  const int64_t count = experts.num_physical();
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

// [experts, n] F32 biases, or undefined when the experts have none.
template <typename Pick>
Tensor stacked_bias(backend::Context& ctx, const PhysicalExperts& experts, Pick pick) {
  if (!pick(experts.weights(0)).defined()) return Tensor();
  const int64_t n = pick(experts.weights(0)).numel();
  Tensor host = Tensor::empty(DType::F32, {experts.num_physical(), n});
  for (int32_t e = 0; e < experts.num_physical(); ++e) {
    const Tensor& b = pick(experts.weights(e));
    R3_CHECK(b.dtype() == DType::F32 && b.numel() == n, "experts on the device: expert ", e, "'s bias");
    std::memcpy(host.data<float>() + e * n, b.data<float>(), sizeof(float) * static_cast<std::size_t>(n));
  }
  return backend::to_device(ctx, host);
}

}  // namespace

DeviceExperts upload_experts(backend::Context& ctx, const PhysicalExperts& experts, DType dtype) {
  R3_CHECK(dtype == DType::F32 || dtype == DType::BF16, "experts on the device: F32 or BF16, not ", dtype_name(dtype));
  R3_CHECK(experts.num_physical() > 0, "experts on the device: no experts");
  // The device kernels have SwiGLU and GPT-OSS's activation only.
  R3_CHECK(experts.activation().kind != ExpertActivation::Kind::kSitu,
           "experts on the device: the SiTU activation (Kimi K3) has no CUDA kernels yet");
  DeviceExperts d;
  d.gate = stacked(ctx, experts, dtype, [](const SwigluExpertWeights& w) -> const Tensor& { return w.gate; });
  d.up = stacked(ctx, experts, dtype, [](const SwigluExpertWeights& w) -> const Tensor& { return w.up; });
  d.down = stacked(ctx, experts, dtype, [](const SwigluExpertWeights& w) -> const Tensor& { return w.down; });
  d.gate_bias = stacked_bias(ctx, experts, [](const SwigluExpertWeights& w) -> const Tensor& { return w.gate_bias; });
  d.up_bias = stacked_bias(ctx, experts, [](const SwigluExpertWeights& w) -> const Tensor& { return w.up_bias; });
  d.down_bias = stacked_bias(ctx, experts, [](const SwigluExpertWeights& w) -> const Tensor& { return w.down_bias; });
  d.activation = experts.activation();
  return d;
}

}  // namespace r3::moe

namespace r3::moe {

void refresh_experts(backend::Context& ctx, const PhysicalExperts& experts, DeviceExperts& into) {
  DeviceExperts fresh = upload_experts(ctx, experts, into.gate.dtype());
  const auto copy = [&](const Tensor& from, Tensor& to) {
    R3_CHECK(from.defined() == to.defined(), "refresh_experts: the experts gained or lost a bias");
    if (from.defined()) backend::copy_on_device(ctx, from, to);
  };
  copy(fresh.gate, into.gate);
  copy(fresh.up, into.up);
  copy(fresh.down, into.down);
  copy(fresh.gate_bias, into.gate_bias);
  copy(fresh.up_bias, into.up_bias);
  copy(fresh.down_bias, into.down_bias);
}

}  // namespace r3::moe
