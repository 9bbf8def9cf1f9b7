// The CUDA ops against the CPU ops they stand for, on random data: same shapes, results within a
// tolerance set by float32 rounding (cuBLASLt's reduction order differs from the CPU kernel's).
// Built when nvcc is found; run on a GPU machine by bench/gpu.sh (not part of the CPU suite).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/context.h"
#include "backend/device_memory.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"

namespace r3::test {
namespace {

Tensor gpu_random(Shape shape, uint32_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(DType::F32, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
  return t;
}

// A host copy of a host tensor.
Tensor gpu_host_copy(const Tensor& t) {
  Tensor c = Tensor::empty(t.dtype(), t.shape());
  std::memcpy(c.raw_data(), t.raw_data(), t.nbytes());
  return c;
}

// Largest |a - b| over the largest |b|: a relative error of the whole tensor.
double gpu_relative_error(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a.data<float>()[i]) - b.data<float>()[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b.data<float>()[i])));
  }
  return scale == 0 ? diff : diff / scale;
}

class CudaOps : public testing::Test {
 protected:
  void SetUp() override { gpu_ = backend::Context::cuda(0); }
  std::unique_ptr<backend::Context> gpu_;
  backend::Context cpu_{2};
};

TEST_F(CudaOps, DeviceMemoryRoundTrip) {
  const Tensor host = gpu_random({37, 129}, 1);
  const Tensor back = backend::to_host(*gpu_, backend::to_device(*gpu_, host));
  ASSERT_EQ(back.shape(), host.shape());
  EXPECT_EQ(std::memcmp(back.raw_data(), host.raw_data(), host.nbytes()), 0);
  const Tensor zeros = backend::to_host(*gpu_, backend::device_empty(*gpu_, DType::F32, {3, 5}));
  for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(zeros.data<float>()[i], 0.0f);
}

TEST_F(CudaOps, RmsNormMatchesTheCpu) {
  for (const int64_t d : {64, 1024, 4097}) {
    const Tensor x = gpu_random({19, d}, 2, 3.0f), w = gpu_random({d}, 3);
    Tensor want = Tensor::empty(DType::F32, {19, d});
    ops::rms_norm(cpu_, x, &w, 1e-6f, want);
    const Tensor xd = backend::to_device(*gpu_, x), wd = backend::to_device(*gpu_, w);
    Tensor yd = backend::device_empty(*gpu_, DType::F32, {19, d});
    ops::rms_norm(*gpu_, xd, &wd, 1e-6f, yd);
    EXPECT_LT(gpu_relative_error(backend::to_host(*gpu_, yd), want), 1e-6) << "d = " << d;
  }
}

TEST_F(CudaOps, SiluAndMulMatchesTheCpuWithAndWithoutClamp) {
  const Tensor g = gpu_random({33, 771}, 4, 4.0f), u = gpu_random({33, 771}, 5, 4.0f);
  for (const float limit : {INFINITY, 7.0f}) {
    Tensor want = Tensor::empty(DType::F32, {33, 771});
    ops::silu_and_mul(cpu_, g, u, want, limit);
    Tensor out = backend::device_empty(*gpu_, DType::F32, {33, 771});
    ops::silu_and_mul(*gpu_, backend::to_device(*gpu_, g), backend::to_device(*gpu_, u), out, limit);
    EXPECT_LT(gpu_relative_error(backend::to_host(*gpu_, out), want), 1e-6) << "limit " << limit;
  }
}

TEST_F(CudaOps, LinearMatchesTheCpu) {
  struct Case { int64_t m, k, n; bool bias; };
  for (const Case c : {Case{1, 2048, 768, false}, Case{16, 1024, 3072, true}, Case{257, 512, 129, true}}) {
    const Tensor x = gpu_random({c.m, c.k}, 6), w = gpu_random({c.n, c.k}, 7, 0.05f), b = gpu_random({c.n}, 8);
    Tensor want = Tensor::empty(DType::F32, {c.m, c.n});
    ops::linear(cpu_, x, w, c.bias ? &b : nullptr, want);
    const Tensor bd = backend::to_device(*gpu_, b);
    Tensor y = backend::device_empty(*gpu_, DType::F32, {c.m, c.n});
    ops::linear(*gpu_, backend::to_device(*gpu_, x), backend::to_device(*gpu_, w), c.bias ? &bd : nullptr, y);
    EXPECT_LT(gpu_relative_error(backend::to_host(*gpu_, y), want), 1e-5) << c.m << "x" << c.k << "x" << c.n;
  }
}

TEST_F(CudaOps, ResidualAddAndClampMatchTheCpu) {
  const Tensor x = gpu_random({21, 300}, 9, 2.0f), gate = gpu_random({21}, 10, 3.0f), base = gpu_random({21, 300}, 11);
  for (const bool gated : {false, true}) {
    Tensor want = gpu_host_copy(base);
    ops::add_rows(cpu_, x, gated ? &gate : nullptr, want);
    Tensor y = backend::to_device(*gpu_, base);
    const Tensor gd = backend::to_device(*gpu_, gate);
    ops::add_rows(*gpu_, backend::to_device(*gpu_, x), gated ? &gd : nullptr, y);
    EXPECT_LT(gpu_relative_error(backend::to_host(*gpu_, y), want), 1e-6) << (gated ? "gated" : "plain");
  }
  Tensor want = gpu_host_copy(x);
  ops::clamp(cpu_, want, 1.5f);
  Tensor xd = backend::to_device(*gpu_, x);
  ops::clamp(*gpu_, xd, 1.5f);
  const Tensor got = backend::to_host(*gpu_, xd);
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0);
}

TEST_F(CudaOps, OpsWithoutACudaImplementationSayWhichOp) {
  const Tensor table = backend::device_empty(*gpu_, DType::F32, {8, 4});
  Tensor out = backend::device_empty(*gpu_, DType::F32, {2, 4});
  const std::vector<int32_t> ids = {1, 2};
  std::string message;
  try {
    ops::embedding(*gpu_, table, ids, out);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("op 'embedding' has no implementation for device cuda"), std::string::npos) << message;
}

}  // namespace
}  // namespace r3::test
