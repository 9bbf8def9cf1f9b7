#include "gpu/gpu_test_support.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "backend/device_memory.h"

namespace r3::test {

Tensor gpu_random(Shape shape, uint32_t seed, float scale) {
  Tensor t = Tensor::empty(DType::F32, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
  return t;
}

double gpu_relative_error(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale == 0 ? diff : diff / scale;
}

double gpu_relative_error(const Tensor& a, const Tensor& b) {
  return gpu_relative_error(a.data<float>(), b.data<float>(), b.numel());
}

Tensor gpu_ints(backend::Context& gpu, const std::vector<int32_t>& values) {
  return backend::to_device(gpu, Tensor::from(values, {static_cast<int64_t>(values.size())}));
}

}  // namespace r3::test
