#include "bench_tensors.h"

#include <random>
#include <utility>

#include "core/dtype.h"

namespace r3::bench {

Tensor random_host(DType dtype, Shape shape, uint32_t seed, float scale) {
  Tensor t = Tensor::empty(dtype, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  if (dtype == DType::F32) {
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
  } else {
    auto* bits = static_cast<uint16_t*>(t.raw_data());
    for (int64_t i = 0; i < t.numel(); ++i) bits[i] = f32_to_bf16(normal(rng));
  }
  return t;
}

Tensor random_fp8_host(Shape shape, uint32_t seed) {
  Tensor t = Tensor::empty(DType::F8_E4M3, std::move(shape));
  std::mt19937 rng(seed);
  auto* bytes = static_cast<uint8_t*>(t.raw_data());
  for (int64_t i = 0; i < t.numel(); ++i) {
    auto code = static_cast<uint8_t>(rng());
    bytes[i] = (code & 0x7F) == 0x7F ? static_cast<uint8_t>(code ^ 1) : code;
  }
  return t;
}

Tensor fp8_scales_host(Shape shape, float scale) {
  shape[shape.size() - 1] = (shape.back() + 127) / 128;
  shape[shape.size() - 2] = (shape[shape.size() - 2] + 127) / 128;
  Tensor t = Tensor::empty(DType::F32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale;
  return t;
}

}  // namespace r3::bench
