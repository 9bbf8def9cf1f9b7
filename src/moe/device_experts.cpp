#include "moe/device_experts.h"

#include <cstring>

#include "backend/device_memory.h"

namespace r3::moe {

namespace {

// [experts, rows, cols] on the device from each physical expert's matrix `pick(weights)`.
template <typename Pick>
Tensor stacked(backend::Context& ctx, const PhysicalExperts& experts, Pick pick) {
  const Tensor& first = pick(experts.weights(0));
  const int64_t count = experts.num_physical();
  Tensor host = Tensor::empty(first.dtype(), {count, first.dim(0), first.dim(1)});
  auto* dst = static_cast<unsigned char*>(host.raw_data());
  for (int32_t e = 0; e < count; ++e) {
    const Tensor& m = pick(experts.weights(e));
    R3_CHECK(m.dtype() == first.dtype() && m.shape() == first.shape() && m.is_contiguous(),
             "experts on the device: expert ", e, " holds ", dtype_name(m.dtype()), " ", shape_to_string(m.shape()),
             ", expert 0 ", dtype_name(first.dtype()), " ", shape_to_string(first.shape()));
    std::memcpy(dst + static_cast<std::size_t>(e) * m.nbytes(), m.raw_data(), m.nbytes());
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

DeviceExperts upload_experts(backend::Context& ctx, const PhysicalExperts& experts) {
  R3_CHECK(experts.num_physical() > 0, "experts on the device: no experts");
  DeviceExperts d;
  d.gate = stacked(ctx, experts, [](const SwigluExpertWeights& w) -> const Tensor& { return w.gate; });
  d.up = stacked(ctx, experts, [](const SwigluExpertWeights& w) -> const Tensor& { return w.up; });
  d.down = stacked(ctx, experts, [](const SwigluExpertWeights& w) -> const Tensor& { return w.down; });
  d.gate_bias = stacked_bias(ctx, experts, [](const SwigluExpertWeights& w) -> const Tensor& { return w.gate_bias; });
  d.up_bias = stacked_bias(ctx, experts, [](const SwigluExpertWeights& w) -> const Tensor& { return w.up_bias; });
  d.down_bias = stacked_bias(ctx, experts, [](const SwigluExpertWeights& w) -> const Tensor& { return w.down_bias; });
  d.activation = experts.activation();
  return d;
}

}  // namespace r3::moe
