// The CUDA ops against the CPU ops they stand for, on random data: same shapes, results within a
// tolerance set by float32 rounding (cuBLASLt's reduction order differs from the CPU kernel's).
// Built when nvcc is found; run on a GPU machine by bench/gpu.sh (not part of the CPU suite).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>

#include "backend/context.h"
#include "backend/device_memory.h"
#include "gpu/gpu_test_support.h"
#include "models/device_step_builder.h"
#include "moe/device_capture.h"
#include "moe/cuda/fused_experts_of_ids.h"
#include "moe/device_experts.h"
#include "moe/device_routing.h"
#include "moe/expert_placement.h"
#include "moe/physical_experts.h"
#include "moe/routing_rule.h"
#include "ops/activation.h"
#include "ops/cuda/dequantize.h"
#include "ops/cuda/linear_mma_rows.h"
#include "ops/cuda/split_bf16.h"
#include "ops/cuda/weight_matrices.h"
#include "ops/cuda/linear_rows.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/kv_write.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"
#include "test_support.h"
#include "ops/rotary.h"

namespace r3::test {
namespace {

// A host copy of a host tensor.
Tensor gpu_host_copy(const Tensor& t) {
  Tensor c = Tensor::empty(t.dtype(), t.shape());
  std::memcpy(c.raw_data(), t.raw_data(), t.nbytes());
  return c;
}

// The bit patterns of a host bf16 tensor.
const uint16_t* gpu_bits(const Tensor& t) { return static_cast<const uint16_t*>(t.raw_data()); }

// A host bf16 tensor widened to float32 (exactly).
Tensor gpu_widened_bf16(const Tensor& t) {
  Tensor f = Tensor::empty(DType::F32, t.shape());
  convert_to_f32(t.raw_data(), t.dtype(), static_cast<std::size_t>(t.numel()), f.data<float>());
  return f;
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

// A CUDA context's step workspace hands out device tensors (zeroed, released by scopes, no
// growth once the largest step has run) and keeps its arrays on the host for step metadata.
TEST_F(CudaOps, WorkspaceTensorsLiveOnTheDevice) {
  backend::Workspace& ws = gpu_->workspace();
  auto step = [&](int64_t rows) {
    backend::Workspace::Scope scope(ws);
    Tensor a = gpu_->scratch(DType::F32, {rows, 256});
    EXPECT_EQ(a.device(), Device::kCuda);
    const std::span<int32_t> meta = ws.array<int32_t>(rows);
    meta[0] = 1;  // host memory: writable here
    ops::rms_norm(*gpu_, a, nullptr, 1e-6f, a);  // a kernel over it: zeros stay zeros
    const Tensor back = backend::to_host(*gpu_, a);
    for (int64_t i = 0; i < back.numel(); ++i) ASSERT_EQ(back.data<float>()[i], 0.0f);
    Tensor b = gpu_->scratch(DType::F32, {rows, 256});
    EXPECT_TRUE(b.data<float>() >= a.data<float>() + rows * 256 || b.data<float>() + rows * 256 <= a.data<float>())
        << "overlapping scratch tensors";
  };
  step(8);
  step(512);
  const int64_t grown = ws.growths();
  for (const int64_t rows : {512, 3, 100}) step(rows);
  EXPECT_EQ(ws.growths(), grown);
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

// The fused residual add + norm gives what the two ops give one after the other, bit for bit:
// the updated residual and the normed rows.
TEST_F(CudaOps, AddRmsNormEqualsTheAddThenTheNorm) {
  for (const int64_t d : {64, 2048, 4097}) {
    const Tensor branch = gpu_random({7, d}, 40, 2.0f), residual = gpu_random({7, d}, 41, 3.0f), w = gpu_random({d}, 42);
    const Tensor bd = backend::to_device(*gpu_, branch), wd = backend::to_device(*gpu_, w);
    Tensor separate_residual = backend::to_device(*gpu_, residual), fused_residual = backend::to_device(*gpu_, residual);
    Tensor separate = backend::device_empty(*gpu_, DType::F32, {7, d}), fused = backend::device_empty(*gpu_, DType::F32, {7, d});
    ops::add_rows(*gpu_, bd, nullptr, separate_residual);
    ops::rms_norm(*gpu_, separate_residual, &wd, 1e-6f, separate);
    ops::cuda::add_rms_norm(*gpu_, bd, fused_residual, &wd, 1e-6f, fused);
    EXPECT_EQ(float_values(backend::to_host(*gpu_, fused_residual)), float_values(backend::to_host(*gpu_, separate_residual)))
        << "d = " << d;
    EXPECT_EQ(float_values(backend::to_host(*gpu_, fused)), float_values(backend::to_host(*gpu_, separate))) << "d = " << d;
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

// Every path of ops::cuda::linear against the CPU's linear over the same weights: float32
// weights through the weight-streaming kernel (up to 8 rows) and cuBLASLt; bfloat16 weights
// through the weight-streaming kernel (1 row), the tensor-core rows kernel (2 to 16 rows: 8- and
// 16-row blocks, partial last blocks) and cuBLASLt (more rows, or shapes the tensor-core rows
// kernel does not take: k = 1001, n = 129).
TEST_F(CudaOps, LinearMatchesTheCpu) {
  struct Case { int64_t m, k, n; bool bias; DType weights; };
  for (const Case c : {Case{1, 2048, 768, false, DType::F32}, Case{5, 2048, 128, true, DType::F32},
                       Case{16, 1024, 3072, true, DType::F32}, Case{257, 512, 129, true, DType::F32},
                       Case{1, 2048, 768, false, DType::BF16}, Case{8, 1024, 3072, true, DType::BF16},
                       Case{2, 2048, 512, false, DType::BF16}, Case{13, 512, 1024, false, DType::BF16},
                       Case{70, 1024, 640, true, DType::BF16}, Case{256, 2048, 512, false, DType::BF16},
                       Case{300, 512, 256, true, DType::BF16}, Case{19, 1001, 129, true, DType::BF16},
                       // Few weight rows: K split into 8 and 4 ranges on the tensor-core rows kernel.
                       Case{6, 4096, 2048, true, DType::BF16}, Case{16, 2048, 5120, false, DType::BF16}}) {
    const Tensor x = gpu_random({c.m, c.k}, 6), b = gpu_random({c.n}, 8);
    Tensor w = Tensor::empty(c.weights, {c.n, c.k});
    backend::convert_matrix(gpu_random({c.n, c.k}, 7, 0.05f), c.weights, w.raw_data());
    Tensor want = Tensor::empty(DType::F32, {c.m, c.n});
    ops::linear(cpu_, x, w, c.bias ? &b : nullptr, want);
    const Tensor bd = backend::to_device(*gpu_, b);
    Tensor y = backend::device_empty(*gpu_, DType::F32, {c.m, c.n});
    ops::linear(*gpu_, backend::to_device(*gpu_, x), backend::to_device(*gpu_, w), c.bias ? &bd : nullptr, y);
    EXPECT_LT(gpu_relative_error(backend::to_host(*gpu_, y), want), 1e-5)
        << c.m << "x" << c.k << "x" << c.n << " " << dtype_name(c.weights);
  }
}

// A random FP8 weight as published checkpoints hold one: e4m3 bytes (every code but the NaNs)
// and a float32 scale per block of br x bc, attached.
Tensor gpu_random_fp8(int64_t rows, int64_t cols, int64_t br, int64_t bc, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensor values = Tensor::empty(DType::F8_E4M3, {rows, cols});
  auto* bytes = static_cast<uint8_t*>(values.raw_data());
  for (int64_t i = 0; i < values.numel(); ++i) {
    uint8_t code = static_cast<uint8_t>(rng());
    if ((code & 0x7F) == 0x7F) code ^= 1;
    bytes[i] = code;
  }
  BlockScales s;
  s.block_rows = br;
  s.block_cols = bc;
  s.scales = Tensor::empty(DType::F32, {(rows + br - 1) / br, (cols + bc - 1) / bc});
  std::uniform_real_distribution<float> scale(1e-4f, 3e-3f);
  for (int64_t i = 0; i < s.scales.numel(); ++i) s.scales.data<float>()[i] = scale(rng);
  return values.with_block_scales(std::move(s));
}

// A random MXFP4 weight as GPT-OSS holds its experts: packed e2m1 pairs and an e8m0 scale per
// 32 values (around 2^-6), attached.
Tensor gpu_random_mxfp4(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  Tensor packed = Tensor::empty(DType::F4_E2M1X2, {rows, cols / 2});
  for (int64_t i = 0; i < packed.numel(); ++i) static_cast<uint8_t*>(packed.raw_data())[i] = static_cast<uint8_t>(rng());
  Tensor scales = Tensor::empty(DType::U8, {rows, (cols + 31) / 32});
  for (int64_t i = 0; i < scales.numel(); ++i) static_cast<uint8_t*>(scales.raw_data())[i] = static_cast<uint8_t>(117 + rng() % 8);
  return packed.with_mx_scales(std::move(scales));
}

// x · wᵀ for an MXFP4 w, which the CPU reads in its experts only: the products of the CPU's
// decode of each row (row_to_f32), summed in double.
Tensor mxfp4_linear_in_double(const Tensor& x, const Tensor& w) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  Tensor want = Tensor::empty(DType::F32, {m, n});
  std::vector<float> row(static_cast<std::size_t>(k));
  for (int64_t j = 0; j < n; ++j) {
    row_to_f32(w, j, row.data());
    for (int64_t i = 0; i < m; ++i) {
      double sum = 0;
      for (int64_t t = 0; t < k; ++t) sum += static_cast<double>(x.data<float>()[i * k + t]) * row[t];
      want.data<float>()[i * n + j] = static_cast<float>(sum);
    }
  }
  return want;
}

// Published quantized weights on the device as they are stored, against the CPU's FP8 and MXFP4
// kernels: the weight-streaming kernel decoding in registers (1 to 16 rows; eight values a load
// or, where blocks are not a power of two of at least 8 wide, one), and larger steps through the matrix decoded
// into float32 scratch for cuBLASLt; partial last blocks, a row range of a weight (MLA splits
// kv_a_proj so), and MLA's kv_b read by the latent attention kernel (through the model tests).
TEST_F(CudaOps, QuantizedLinearMatchesTheCpu) {
  struct Case { int64_t m, k, n, br, bc, first; };
  for (const Case c : {Case{1, 2048, 768, 128, 128, 0}, Case{3, 2048, 512, 128, 128, 0}, Case{16, 1024, 384, 128, 128, 0},
                       Case{40, 1024, 384, 128, 128, 0}, Case{1, 200, 70, 16, 16, 0}, Case{7, 200, 70, 16, 24, 0},
                       Case{2, 100, 33, 7, 12, 0}, Case{33, 100, 33, 7, 12, 0}, Case{2, 256, 40, 16, 16, 24}}) {
    const Tensor x = gpu_random({c.m, c.k}, 16), b = gpu_random({c.n}, 17);
    const Tensor full = gpu_random_fp8(c.first + c.n, c.k, c.br, c.bc, 18);
    const Tensor w = full.rows(c.first, c.first + c.n);
    Tensor want = Tensor::empty(DType::F32, {c.m, c.n});
    ops::linear(cpu_, x, w, &b, want);
    const Tensor bd = backend::to_device(*gpu_, b), wd = backend::to_device(*gpu_, full).rows(c.first, c.first + c.n);
    ASSERT_EQ(wd.dtype(), DType::F8_E4M3);
    Tensor y = backend::device_empty(*gpu_, DType::F32, {c.m, c.n});
    ops::linear(*gpu_, backend::to_device(*gpu_, x), wd, &bd, y);
    EXPECT_LT(gpu_relative_error(backend::to_host(*gpu_, y), want), 1e-5)
        << "FP8 " << c.m << "x" << c.k << "x" << c.n << " blocks " << c.br << "x" << c.bc << " from row " << c.first;
  }
  struct MxCase { int64_t m, k, n; };
  for (const MxCase c : {MxCase{1, 2880, 64}, MxCase{4, 2880, 96}, MxCase{40, 2880, 64}, MxCase{3, 72, 7}}) {
    const Tensor x = gpu_random({c.m, c.k}, 19);
    const Tensor w = gpu_random_mxfp4(c.n, c.k, 20);
    const Tensor want = mxfp4_linear_in_double(x, w);
    const Tensor wd = backend::to_device(*gpu_, w);
    ASSERT_EQ(wd.dtype(), DType::F4_E2M1X2);
    Tensor y = backend::device_empty(*gpu_, DType::F32, {c.m, c.n});
    ops::linear(*gpu_, backend::to_device(*gpu_, x), wd, nullptr, y);
    EXPECT_LT(gpu_relative_error(backend::to_host(*gpu_, y), want), 1e-5) << "MXFP4 " << c.m << "x" << c.k << "x" << c.n;
  }
}

// The weight-streaming kernel with a column's K split over 2 to 8 warps (few weight rows: a
// decode step's o projection, 2048 rows of 4096, or a router's 128) and its FP8 batch-1 variant
// held to 48 registers with the scales from the lanes, against the CPU; row 0's bits the same
// alone and among 3 rows (the split depends on the weight's shape, not on the rows: batch
// invariance).
TEST_F(CudaOps, WeightStreamingRowsSplitOverWarpsMatchTheCpu) {
  struct Case { int64_t k, n; DType weights; };
  for (const Case c : {Case{4096, 2048, DType::BF16}, Case{2048, 128, DType::F32}, Case{1024, 512, DType::BF16},
                       Case{4096, 2048, DType::F8_E4M3}, Case{2048, 5120, DType::F8_E4M3}, Case{2048, 40, DType::F8_E4M3},
                       Case{2048, 5120, DType::BF16}}) {
    const Tensor x = gpu_random({3, c.k}, 31), b = gpu_random({c.n}, 32);
    Tensor w;
    if (c.weights == DType::F8_E4M3) {
      w = gpu_random_fp8(c.n, c.k, 128, 128, 33);
    } else {
      w = Tensor::empty(c.weights, {c.n, c.k});
      backend::convert_matrix(gpu_random({c.n, c.k}, 34, 0.05f), c.weights, w.raw_data());
    }
    const Tensor wd = backend::to_device(*gpu_, w), bd = backend::to_device(*gpu_, b);
    const std::string name = std::to_string(c.k) + "x" + std::to_string(c.n) + " " + std::string(dtype_name(c.weights));
    Tensor alone;  // row 0's result alone
    for (const int64_t m : {1, 3}) {
      const Tensor xm = x.rows(0, m);
      Tensor want = Tensor::empty(DType::F32, {m, c.n});
      ops::linear(cpu_, xm, w, &b, want);
      const Tensor xd = backend::to_device(*gpu_, xm);
      Tensor y = backend::device_empty(*gpu_, DType::F32, {m, c.n});
      ops::cuda::linear_rows(*gpu_, xd, wd, &bd, y);
      const Tensor got = backend::to_host(*gpu_, y);
      EXPECT_LT(gpu_relative_error(got, want), 1e-5) << name << ", " << m << " rows";
      if (m == 1) alone = got;
      else EXPECT_EQ(std::memcmp(alone.raw_data(), got.raw_data(), alone.nbytes()), 0) << name << ": row 0 among 3";
    }
  }
}

// FP8 projections of 5 to 16 rows in a step of reduced precision (a bfloat16 model's) take the
// tensor-core rows kernel: e4m3 widened exactly to bfloat16, each K block's partial sums scaled,
// the activations split as for bfloat16 weights; against the CPU within the bfloat16 rows'
// tolerance. Cases: K split into ranges of whole blocks (few weight rows), a row range of a
// weight, 16-wide blocks (which do not fit and keep the weight-streaming kernel). Which kernel
// ran is checked by bits: the result equals the chosen kernel's own, and without reduced
// precision the weight-streaming kernel's.
TEST_F(CudaOps, Fp8ProjectionsOfFiveToSixteenRowsTakeTheTensorCoresAtReducedPrecision) {
  struct Case { int64_t m, k, n, br, bc, first; bool fits; };
  for (const Case c : {Case{5, 2048, 768, 128, 128, 0, true}, Case{8, 2048, 5120, 128, 128, 0, true},
                       Case{16, 4096, 2048, 128, 128, 0, true}, Case{13, 1024, 384, 128, 128, 128, true},
                       Case{9, 2048, 64, 128, 128, 0, true}, Case{8, 256, 64, 16, 16, 0, false}}) {
    const Tensor x = gpu_random({c.m, c.k}, 21), b = gpu_random({c.n}, 22);
    const Tensor full = gpu_random_fp8(c.first + c.n, c.k, c.br, c.bc, 23);
    Tensor want = Tensor::empty(DType::F32, {c.m, c.n});
    ops::linear(cpu_, x, full.rows(c.first, c.first + c.n), &b, want);
    const Tensor xd = backend::to_device(*gpu_, x), bd = backend::to_device(*gpu_, b);
    const Tensor wd = backend::to_device(*gpu_, full).rows(c.first, c.first + c.n);
    const std::string name = std::to_string(c.m) + "x" + std::to_string(c.k) + "x" + std::to_string(c.n) + " blocks " +
                             std::to_string(c.bc) + " from row " + std::to_string(c.first);
    ASSERT_EQ(ops::cuda::linear_mma_rows_fit(wd), c.fits) << name;
    Tensor y = backend::device_empty(*gpu_, DType::F32, {c.m, c.n});
    Tensor own = backend::device_empty(*gpu_, DType::F32, {c.m, c.n});
    {
      const backend::ReducedPrecisionScope bf16_model(*gpu_, true);
      ops::linear(*gpu_, xd, wd, &bd, y);
      if (c.fits) {
        ops::cuda::linear_mma_rows(*gpu_, xd, wd, bd.data<float>(), own);
      } else {
        ops::cuda::linear_rows(*gpu_, xd, wd, &bd, own);
      }
    }
    const Tensor got = backend::to_host(*gpu_, y);
    EXPECT_LT(gpu_relative_error(got, want), 1e-5) << name;
    EXPECT_EQ(std::memcmp(got.raw_data(), backend::to_host(*gpu_, own).raw_data(), got.nbytes()), 0) << name;
    ops::linear(*gpu_, xd, wd, &bd, y);  // float32 precision: the weight-streaming kernel
    ops::cuda::linear_rows(*gpu_, xd, wd, &bd, own);
    const Tensor exact = backend::to_host(*gpu_, y), streamed = backend::to_host(*gpu_, own);
    EXPECT_EQ(std::memcmp(exact.raw_data(), streamed.raw_data(), exact.nbytes()), 0) << name;
  }
}

// Quantized projections of more than 16 rows in a step of reduced precision (a bfloat16 model's
// batch 64 and 256, and prefill). FP8 up to 256 rows takes the tensor-core rows kernel (the
// result has its bits) within the 5-to-16-row tolerance. More rows, and weights that kernel does
// not take (MXFP4, 16-wide FP8 blocks), are decoded and split into high and low bfloat16 parts
// like the activations: within 3e-5 (both operands keep about 16 bits, against 24 for the weights
// alone), and not the float32 GEMM's bits, so that path ran.
TEST_F(CudaOps, QuantizedStepsOfManyRowsAtReducedPrecisionTakeTheTensorCores) {
  struct Case { int64_t m, k, n, br, bc, first; bool mxfp4; };
  for (const Case c : {Case{17, 2048, 768, 128, 128, 0, false}, Case{64, 2048, 5120, 128, 128, 0, false},
                       Case{256, 4096, 2048, 128, 128, 0, false}, Case{100, 1024, 384, 128, 128, 128, false},
                       Case{300, 2048, 768, 128, 128, 0, false}, Case{40, 256, 64, 16, 16, 0, false},
                       Case{64, 2880, 96, 0, 0, 0, true}}) {
    const Tensor x = gpu_random({c.m, c.k}, 24), b = gpu_random({c.n}, 25);
    const Tensor full = c.mxfp4 ? gpu_random_mxfp4(c.n, c.k, 26) : gpu_random_fp8(c.first + c.n, c.k, c.br, c.bc, 26);
    const Tensor w = full.rows(c.first, c.first + c.n);
    Tensor want;
    if (c.mxfp4) {
      want = mxfp4_linear_in_double(x, w);
      for (int64_t i = 0; i < c.m; ++i) {
        for (int64_t j = 0; j < c.n; ++j) want.data<float>()[i * c.n + j] += b.data<float>()[j];
      }
    } else {
      want = Tensor::empty(DType::F32, {c.m, c.n});
      ops::linear(cpu_, x, w, &b, want);
    }
    const Tensor xd = backend::to_device(*gpu_, x), bd = backend::to_device(*gpu_, b);
    const Tensor wd = backend::to_device(*gpu_, full).rows(c.first, c.first + c.n);
    const std::string name = std::to_string(c.m) + "x" + std::to_string(c.k) + "x" + std::to_string(c.n) +
                             (c.mxfp4 ? " MXFP4" : " FP8 blocks " + std::to_string(c.bc)) + " from row " +
                             std::to_string(c.first);
    const bool mma_rows = !c.mxfp4 && c.m <= 256 && ops::cuda::linear_mma_rows_fit(wd);
    ASSERT_EQ(mma_rows, c.m <= 256 && c.bc == 128) << name;
    auto run = [&](bool reduced) {
      Tensor y = backend::device_empty(*gpu_, DType::F32, {c.m, c.n});
      {
        const backend::ReducedPrecisionScope precision(*gpu_, reduced);
        ops::linear(*gpu_, xd, wd, &bd, y);
      }
      return backend::to_host(*gpu_, y);
    };
    const Tensor got = run(true), float32 = run(false);
    const double error = gpu_relative_error(got, want);
    RecordProperty("relative_error_" + std::to_string(c.m) + "_rows_" + (c.mxfp4 ? "mxfp4" : std::to_string(c.bc)),
                   std::to_string(error));
    EXPECT_LT(error, mma_rows ? 1e-5 : 3e-5) << name;
    EXPECT_LT(gpu_relative_error(float32, want), 1e-5) << name << ", float32";
    EXPECT_NE(std::memcmp(got.raw_data(), float32.raw_data(), got.nbytes()), 0) << name << ": the float32 GEMM ran";
    if (mma_rows) {
      Tensor own = backend::device_empty(*gpu_, DType::F32, {c.m, c.n});
      ops::cuda::linear_mma_rows(*gpu_, xd, wd, bd.data<float>(), own);
      EXPECT_EQ(std::memcmp(got.raw_data(), backend::to_host(*gpu_, own).raw_data(), got.nbytes()), 0) << name;
    }
  }
}

// Quantized weights decoded straight into split bfloat16 parts (the large quantized steps' GEMM)
// give the bits of the float32 decode split afterwards: FP8 with partial blocks of 128 and a row
// range starting inside a block, FP8 blocks of 16, and MXFP4. The low parts are not all zero where
// the values have more than bfloat16's bits (FP8 values times float32 scales); MXFP4 values times
// powers of two fit bfloat16, so theirs are.
TEST_F(CudaOps, QuantizedWeightsDecodeIntoSplitPartsAsTheFloat32DecodeSplits) {
  struct Case { int64_t n, k, br, bc, first; bool mxfp4; };
  for (const Case c : {Case{300, 520, 128, 128, 0, false}, Case{200, 1024, 128, 128, 70, false},
                       Case{96, 256, 16, 16, 0, false}, Case{96, 2880, 0, 0, 0, true}}) {
    const Tensor full = c.mxfp4 ? gpu_random_mxfp4(c.n, c.k, 27) : gpu_random_fp8(c.first + c.n, c.k, c.br, c.bc, 27);
    const Tensor w = backend::to_device(*gpu_, full).rows(c.first, c.first + c.n);
    Tensor decoded = backend::device_empty(*gpu_, DType::F32, {c.n, c.k});
    Tensor want = backend::device_empty(*gpu_, DType::BF16, {2 * c.n, c.k});
    Tensor got = backend::device_empty(*gpu_, DType::BF16, {2 * c.n, c.k});
    ops::cuda::dequantize_matrix(*gpu_, w, decoded);
    ops::cuda::split_rows_bf16(*gpu_, decoded, want);
    ops::cuda::dequantize_matrix_split_bf16(*gpu_, w, got);
    const Tensor got_host = backend::to_host(*gpu_, got), want_host = backend::to_host(*gpu_, want);
    const std::string name = std::to_string(c.n) + "x" + std::to_string(c.k) +
                             (c.mxfp4 ? " MXFP4" : " FP8 blocks " + std::to_string(c.bc)) + " from row " +
                             std::to_string(c.first);
    EXPECT_EQ(std::memcmp(got_host.raw_data(), want_host.raw_data(), got_host.nbytes()), 0) << name;
    const uint16_t* low = gpu_bits(got_host) + c.n * c.k;
    const int64_t nonzero_low = std::count_if(low, low + c.n * c.k, [](uint16_t b) { return (b & 0x7fff) != 0; });
    if (c.mxfp4) {
      EXPECT_EQ(nonzero_low, 0) << name;
    } else {
      EXPECT_GT(nonzero_low, c.n * c.k / 2) << name;
    }
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

TEST_F(CudaOps, EmbeddingOfDeviceIdsMatchesTheCpu) {
  const Tensor f32 = gpu_random({50, 96}, 12);
  Tensor bf16 = Tensor::empty(DType::BF16, {50, 96});
  auto* bits = static_cast<uint16_t*>(bf16.raw_data());
  for (int64_t i = 0; i < f32.numel(); ++i) bits[i] = f32_to_bf16(f32.data<float>()[i]);
  const std::vector<int32_t> ids = {3, 0, 49, 3, 17};
  for (const Tensor* table : {&f32, static_cast<const Tensor*>(&bf16)}) {
    Tensor want = Tensor::empty(DType::F32, {5, 96});
    ops::embedding(cpu_, *table, ids, want);
    const Tensor ids_d = gpu_ints(*gpu_, ids);
    Tensor out = backend::device_empty(*gpu_, DType::F32, {5, 96});
    ops::cuda::embedding_ids_on_device(*gpu_, backend::to_device(*gpu_, *table), ids_d.data<int32_t>(), 5, out);
    const Tensor got = backend::to_host(*gpu_, out);
    EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0) << dtype_name(table->dtype());
  }
}

TEST_F(CudaOps, RotaryOfDevicePositionsMatchesTheCpu) {
  const std::vector<int32_t> positions = {0, 1, 7, 4095, 100000, 33};
  for (const int64_t rotary_dim : {64, 32}) {  // full and partial (head_dim 64)
    const ops::Rotary rotary(rotary_dim, 1e6);
    Tensor want = gpu_random({6, 4, 64}, 13, 2.0f);
    Tensor x = backend::to_device(*gpu_, want);
    rotary.apply(cpu_, want, positions);
    const Tensor pos_d = gpu_ints(*gpu_, positions);
    ops::cuda::rotary_positions_on_device(*gpu_, rotary, x, pos_d.data<int32_t>());
    const Tensor got = backend::to_host(*gpu_, x);
    int64_t unequal = 0;
    for (int64_t i = 0; i < got.numel(); ++i) unequal += got.data<float>()[i] != want.data<float>()[i] ? 1 : 0;
    RecordProperty("rotary_dim_" + std::to_string(rotary_dim) + "_unequal_elements", static_cast<int>(unequal));
    EXPECT_LT(gpu_relative_error(got, want), 1e-6) << "rotary dim " << rotary_dim;
  }
}

// The rows between a GQA layer's fused projection and its attention, in one kernel: from one
// [tokens, q + k + v] row per token, per-head RMSNorm of q and k, a partial rotary (24 of 32
// dims), q to its own tensor, k and v to the pool through the block table; equal to the CPU's
// rms_norm and rotary, and a padding token writes nothing to the pool.
TEST_F(CudaOps, PreparedAttentionRowsMatchTheCpuNormsAndRotary) {
  const int64_t heads = 4, kv_heads = 2, d = 32, block = 4, tokens = 3;
  const int64_t q_width = heads * d, kv_width = kv_heads * d, width = q_width + 2 * kv_width;
  const float eps = 1e-6f;
  const ops::Rotary rotary(24, 1e4);
  const Tensor projected = gpu_random({tokens, width}, 70, 3.0f);
  const Tensor q_norm = gpu_random({d}, 71), k_norm = gpu_random({d}, 72);
  const std::vector<int32_t> positions = {5, 0, 9}, seqs = {0, -1, 1};
  const std::vector<int32_t> tables = {2, 0, 7, 1, 3, 5};  // two sequences, stride 3
  // The CPU: slices of the row, per-head norms, then the rotation.
  Tensor q = Tensor::empty(DType::F32, {tokens * heads, d}), k = Tensor::empty(DType::F32, {tokens * kv_heads, d});
  for (int64_t t = 0; t < tokens; ++t) {
    std::memcpy(q.data<float>() + t * q_width, projected.data<float>() + t * width, q_width * sizeof(float));
    std::memcpy(k.data<float>() + t * kv_width, projected.data<float>() + t * width + q_width, kv_width * sizeof(float));
  }
  ops::rms_norm(cpu_, q, &q_norm, eps, q);
  ops::rms_norm(cpu_, k, &k_norm, eps, k);
  Tensor qh = q.reshaped({tokens, heads, d}), kh = k.reshaped({tokens, kv_heads, d});
  rotary.apply(cpu_, qh, positions);
  rotary.apply(cpu_, kh, positions);

  Tensor keys_d = backend::device_empty(*gpu_, DType::F32, {8 * block, kv_width});
  Tensor values_d = backend::device_empty(*gpu_, DType::F32, {8 * block, kv_width});
  const Tensor seqs_d = gpu_ints(*gpu_, seqs), positions_d = gpu_ints(*gpu_, positions), tables_d = gpu_ints(*gpu_, tables);
  const ops::StepView step{tokens, nullptr, positions_d.data<int32_t>(), seqs_d.data<int32_t>(),
                             tables_d.data<int32_t>(), 3, 10};
  const ops::KvPool pool{keys_d.data<float>(), values_d.data<float>(), kv_width, kv_width, block, 8};
  const Tensor projected_d = backend::to_device(*gpu_, projected);
  const Tensor q_norm_d = backend::to_device(*gpu_, q_norm), k_norm_d = backend::to_device(*gpu_, k_norm);
  const float* p = projected_d.data<float>();
  const ops::AttentionRows rows{p, width, p + q_width, width, p + q_width + kv_width, width,
                                      q_norm_d.data<float>(), k_norm_d.data<float>()};
  Tensor q_d = backend::device_empty(*gpu_, DType::F32, {tokens, heads, d});
  ops::cuda::prepare_attention_rows(*gpu_, rotary, rows, heads, kv_heads, d, eps, step, pool, q_d);
  EXPECT_LT(gpu_relative_error(backend::to_host(*gpu_, q_d), qh), 1e-6);
  const Tensor keys = backend::to_host(*gpu_, keys_d), values = backend::to_host(*gpu_, values_d);
  std::vector<bool> written(8 * block, false);
  for (int64_t t = 0; t < tokens; ++t) {
    if (seqs[t] < 0) continue;
    const int64_t row = tables[seqs[t] * 3 + positions[t] / block] * block + positions[t] % block;
    written[row] = true;
    for (int64_t i = 0; i < kv_width; ++i) {
      EXPECT_NEAR(keys.data<float>()[row * kv_width + i], k.data<float>()[t * kv_width + i], 1e-5) << "token " << t;
      EXPECT_EQ(values.data<float>()[row * kv_width + i], projected.data<float>()[t * width + q_width + kv_width + i])
          << "token " << t;
    }
  }
  for (int64_t row = 0; row < 8 * block; ++row) {
    if (written[row]) continue;
    for (int64_t i = 0; i < kv_width; ++i) ASSERT_EQ(keys.data<float>()[row * kv_width + i], 0.0f) << "pool row " << row;
  }
}

// Three sequences with cached positions, a step mixing decode tokens, a prefill chunk and a padding
// row: the device write puts every row where the CPU's does, and the device attention matches the
// CPU's over the same block tables, for GQA head sizes 64 and 128, with and without sinks and a
// sliding window (one of 70 positions, across the kernel's 32-position tiles).
TEST_F(CudaOps, PagedKvWriteAndAttentionMatchTheCpu) {
  struct Case { int64_t heads, kv_heads, d, window; bool sinks; };
  for (const Case c : {Case{8, 2, 64, 0, false}, Case{4, 4, 128, 0, true}, Case{8, 1, 64, 20, true},
                       Case{16, 4, 128, 7, false}, Case{8, 2, 64, 70, true},
                       Case{64, 8, 64, 70, true}, Case{64, 8, 64, 0, false}}) {  // 448 (token, head) pairs
    const int64_t block = 16, pool_blocks = 40, width = c.kv_heads * c.d, stride = 8;
    // Block tables: distinct blocks, deliberately out of order.
    const std::vector<std::vector<int32_t>> tables = {{5, 9, 2, 30}, {11}, {0, 39, 7, 8, 21, 22, 23}};
    std::vector<int32_t> flat(tables.size() * stride, -1);
    for (std::size_t s = 0; s < tables.size(); ++s) std::copy(tables[s].begin(), tables[s].end(), flat.begin() + s * stride);
    // Step: seq 0 decodes at 37, seq 1 prefills 5..8, a padding row, seq 2 decodes at 100.
    const std::vector<int32_t> seqs = {0, 1, 1, 1, 1, -1, 2}, positions = {37, 5, 6, 7, 8, 0, 100};
    const auto tokens = static_cast<int64_t>(seqs.size());
    Tensor keys = gpu_random({pool_blocks * block, width}, 14), values = gpu_random({pool_blocks * block, width}, 15);
    const Tensor k = gpu_random({tokens, width}, 16), v = gpu_random({tokens, width}, 17);
    const Tensor q = gpu_random({tokens, c.heads, c.d}, 18), sinks = gpu_random({c.heads}, 19);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));

    // Device side first (the host pool is updated in place by the CPU ops below).
    Tensor keys_d = backend::to_device(*gpu_, keys), values_d = backend::to_device(*gpu_, values);
    const Tensor seqs_d = gpu_ints(*gpu_, seqs), positions_d = gpu_ints(*gpu_, positions), tables_d = gpu_ints(*gpu_, flat);
    const ops::StepView step{tokens, nullptr, positions_d.data<int32_t>(), seqs_d.data<int32_t>(), tables_d.data<int32_t>(),
                               stride, 101};
    const ops::KvPool pool{keys_d.data<float>(), values_d.data<float>(), width, width, block, pool_blocks};
    const Tensor k_d = backend::to_device(*gpu_, k), v_d = backend::to_device(*gpu_, v), q_d = backend::to_device(*gpu_, q);
    const Tensor sinks_d = backend::to_device(*gpu_, sinks);
    Tensor out_d = backend::device_empty(*gpu_, DType::F32, {tokens, c.heads, c.d});
    ops::cuda::write_kv_paged(*gpu_, k_d.data<float>(), width, v_d.data<float>(), width, step, pool);
    ops::cuda::paged_attention(*gpu_, q_d, step, pool, c.kv_heads, scale, c.window,
                               c.sinks ? sinks_d.data<float>() : nullptr, out_d);

    std::vector<ops::KvWrite> writes(static_cast<std::size_t>(tokens));
    std::vector<ops::KvWindow> windows(static_cast<std::size_t>(tokens));
    for (int64_t t = 0; t < tokens; ++t) {
      if (seqs[t] < 0) continue;
      const ops::PagedKv kv{keys.data<float>(), values.data<float>(), width, width, block, tables[seqs[t]]};
      writes[t] = {kv, positions[t]};
      windows[t] = {kv, c.window > 0 ? std::max<int64_t>(0, positions[t] - c.window + 1) : 0, positions[t] + 1};
    }
    ops::write_kv(cpu_, k.data<float>(), width, v.data<float>(), width, writes);
    Tensor want = Tensor::empty(DType::F32, {tokens, c.heads, c.d});
    ops::attention(cpu_, q, windows, c.kv_heads, scale, want, c.sinks ? sinks.data<float>() : nullptr);

    const Tensor keys_back = backend::to_host(*gpu_, keys_d), values_back = backend::to_host(*gpu_, values_d);
    EXPECT_EQ(std::memcmp(keys_back.raw_data(), keys.raw_data(), keys.nbytes()), 0) << "key pool, d " << c.d;
    EXPECT_EQ(std::memcmp(values_back.raw_data(), values.raw_data(), values.nbytes()), 0) << "value pool, d " << c.d;
    EXPECT_LT(gpu_relative_error(backend::to_host(*gpu_, out_d), want), 1e-5)
        << c.heads << " heads over " << c.kv_heads << " of " << c.d << ", window " << c.window << (c.sinks ? ", sinks" : "");
  }
}

// A bf16 pool (a bf16 model's): the write stores each row rounded to nearest even, and attention
// over it matches attention over a float32 pool holding the same (widened) values: bit for bit
// on the per-lane kernel (head size 32), within 1e-5 on tensor cores (64 and 128, queries and
// probabilities split into two bf16 parts), with sinks and sliding windows. The prepared
// attention rows (norms, rotary) land in it rounded from the float32 pool's.
TEST_F(CudaOps, BfloatKvPoolsHoldRoundedRowsAndAttendAsTheirWidening) {
  struct Case { int64_t heads, kv_heads, d, window; bool sinks; };
  for (const Case c : {Case{8, 2, 64, 20, true}, Case{16, 4, 128, 0, false}, Case{8, 1, 128, 70, true},
                       Case{4, 2, 128, 0, true}, Case{8, 4, 32, 0, true}}) {
    const int64_t block = 16, pool_blocks = 24, width = c.kv_heads * c.d, stride = 8;
    const std::vector<int32_t> flat = {5, 9, 2, 6, -1, -1, -1, -1, 11, -1, -1, -1, -1, -1, -1, -1,
                                       0, 23, 7, 8, 21, 22, 1, -1};
    const std::vector<int32_t> seqs = {0, 1, 1, -1, 2}, positions = {37, 5, 6, 0, 100};
    const auto tokens = static_cast<int64_t>(seqs.size());
    const Tensor keys = gpu_random({pool_blocks * block, width}, 80), values = gpu_random({pool_blocks * block, width}, 81);
    const Tensor k = gpu_random({tokens, width}, 82), v = gpu_random({tokens, width}, 83);
    const Tensor q_d = backend::to_device(*gpu_, gpu_random({tokens, c.heads, c.d}, 84));
    const Tensor sinks_d = backend::to_device(*gpu_, gpu_random({c.heads}, 85));
    const Tensor seqs_d = gpu_ints(*gpu_, seqs), positions_d = gpu_ints(*gpu_, positions), tables_d = gpu_ints(*gpu_, flat);
    const ops::StepView step{tokens, nullptr, positions_d.data<int32_t>(), seqs_d.data<int32_t>(), tables_d.data<int32_t>(),
                               stride, 101};
    const Tensor k_d = backend::to_device(*gpu_, k), v_d = backend::to_device(*gpu_, v);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));

    Tensor keys16 = backend::to_device_as(*gpu_, keys, DType::BF16), values16 = backend::to_device_as(*gpu_, values, DType::BF16);
    const ops::KvPool pool16{keys16.raw_data(), values16.raw_data(), width, width, block, pool_blocks, true};
    ops::cuda::write_kv_paged(*gpu_, k_d.data<float>(), width, v_d.data<float>(), width, step, pool16);
    Tensor out16 = backend::device_empty(*gpu_, DType::F32, {tokens, c.heads, c.d});
    ops::cuda::paged_attention(*gpu_, q_d, step, pool16, c.kv_heads, scale, c.window,
                               c.sinks ? sinks_d.data<float>() : nullptr, out16);
    // The bf16 pool's rows: the old ones as uploaded, the step's rounded.
    const Tensor keys_back = backend::to_host(*gpu_, keys16), values_back = backend::to_host(*gpu_, values16);
    for (int64_t t = 0; t < tokens; ++t) {
      if (seqs[t] < 0) continue;
      const int64_t row = flat[seqs[t] * stride + positions[t] / block] * block + positions[t] % block;
      for (int64_t i = 0; i < width; ++i) {
        ASSERT_EQ(gpu_bits(keys_back)[row * width + i], f32_to_bf16(k.data<float>()[t * width + i])) << "token " << t;
        ASSERT_EQ(gpu_bits(values_back)[row * width + i], f32_to_bf16(v.data<float>()[t * width + i])) << "token " << t;
      }
    }
    // A float32 pool of the widened bf16 rows: the same attention, bit for bit.
    Tensor keys32 = backend::to_device(*gpu_, gpu_widened_bf16(keys_back));
    Tensor values32 = backend::to_device(*gpu_, gpu_widened_bf16(values_back));
    const ops::KvPool pool32{keys32.data<float>(), values32.data<float>(), width, width, block, pool_blocks};
    Tensor out32 = backend::device_empty(*gpu_, DType::F32, {tokens, c.heads, c.d});
    ops::cuda::paged_attention(*gpu_, q_d, step, pool32, c.kv_heads, scale, c.window,
                               c.sinks ? sinks_d.data<float>() : nullptr, out32);
    const Tensor got = backend::to_host(*gpu_, out16), want = backend::to_host(*gpu_, out32);
    if (c.d == 32) {
      EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()), 0)
          << c.heads << " heads over " << c.kv_heads << " of " << c.d << ", window " << c.window;
    } else {
      EXPECT_LT(gpu_relative_error(got, want), 1e-5)
          << c.heads << " heads over " << c.kv_heads << " of " << c.d << ", window " << c.window;
    }

    // prepare_attention_rows into both pools: the bf16 pool holds the float32 pool's rows rounded.
    const Tensor projected = backend::to_device(*gpu_, gpu_random({tokens, c.heads * c.d + 2 * width}, 86, 3.0f));
    const Tensor norm_d = backend::to_device(*gpu_, gpu_random({c.d}, 87));
    const int64_t row_width = c.heads * c.d + 2 * width;
    const float* p = projected.data<float>();
    const ops::AttentionRows rows{p, row_width, p + c.heads * c.d, row_width, p + c.heads * c.d + width, row_width,
                                        norm_d.data<float>(), norm_d.data<float>()};
    const ops::Rotary rotary(c.d / 2, 1e4);
    Tensor q16 = backend::device_empty(*gpu_, DType::F32, {tokens, c.heads, c.d});
    Tensor q32 = backend::device_empty(*gpu_, DType::F32, {tokens, c.heads, c.d});
    ops::cuda::prepare_attention_rows(*gpu_, rotary, rows, c.heads, c.kv_heads, c.d, 1e-6f, step, pool16, q16);
    ops::cuda::prepare_attention_rows(*gpu_, rotary, rows, c.heads, c.kv_heads, c.d, 1e-6f, step, pool32, q32);
    const Tensor k16 = backend::to_host(*gpu_, keys16), k32 = backend::to_host(*gpu_, keys32);
    const Tensor v16 = backend::to_host(*gpu_, values16), v32 = backend::to_host(*gpu_, values32);
    for (int64_t i = 0; i < k32.numel(); ++i) {
      ASSERT_EQ(gpu_bits(k16)[i], f32_to_bf16(k32.data<float>()[i])) << "key element " << i;
      ASSERT_EQ(gpu_bits(v16)[i], f32_to_bf16(v32.data<float>()[i])) << "value element " << i;
    }
    const Tensor q16_host = backend::to_host(*gpu_, q16), q32_host = backend::to_host(*gpu_, q32);
    EXPECT_EQ(std::memcmp(q16_host.raw_data(), q32_host.raw_data(), q16_host.nbytes()), 0) << "queries";
  }
}

// Attention on tensor cores with each (token, group of heads)'s chunks merged inside the kernel by
// a thread-block cluster (the kernel choice cluster_merge forced always, up to 16 chunks) gives
// the bits of the merge kernel (forced never): groups of 8, 4, 2 and 1 query heads, head dims 64 and 128, sinks, a
// sliding window, a padding row and a prefill's rows, contexts of one chunk up to 16 (and past,
// where the merge kernel runs either way), with and without --batch-invariant.
TEST_F(CudaOps, AttentionChunksMergedInAClusterGiveTheMergeKernelsBits) {
  struct Case { int64_t heads, kv_heads, d, window; bool sinks; };
  for (const Case c : {Case{32, 4, 128, 0, false}, Case{16, 4, 64, 0, true}, Case{8, 4, 128, 300, true},
                       Case{4, 4, 64, 0, false}}) {
    const int64_t block = 16, stride = 128, width = c.kv_heads * c.d;
    // Decodes at 37, 999 and 1999 cached positions, a padding row, a prefill's three rows at
    // 126..128, one more decode at 400.
    const std::vector<int32_t> seqs = {0, 1, 2, -1, 3, 3, 3, 4}, positions = {37, 999, 1999, 0, 126, 127, 128, 400};
    const auto tokens = static_cast<int64_t>(seqs.size());
    std::vector<int32_t> order(5 * stride);
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::shuffle(order.begin(), order.end(), std::mt19937(50));
    const int64_t pool_blocks = static_cast<int64_t>(order.size());
    Tensor keys_d = backend::to_device_as(*gpu_, gpu_random({pool_blocks * block, width}, 51), DType::BF16);
    Tensor values_d = backend::to_device_as(*gpu_, gpu_random({pool_blocks * block, width}, 52), DType::BF16);
    const ops::KvPool pool{keys_d.raw_data(), values_d.raw_data(), width, width, block, pool_blocks, true};
    const Tensor tables_d = gpu_ints(*gpu_, order);
    const Tensor q = gpu_random({tokens, c.heads, c.d}, 53, 3.0f);
    const Tensor sinks_d = backend::to_device(*gpu_, gpu_random({c.heads}, 54));
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    // Every token alone (a decode step of one row: the chunk counts of batch 1), then all together.
    auto attend = [&](int64_t first, int64_t n, bool cluster) {
      gpu_->set_kernel_choice("cluster_merge", cluster ? "always" : "never");  // clusters past one wave too
      const std::vector<int32_t> step_seqs(seqs.begin() + first, seqs.begin() + first + n);
      const std::vector<int32_t> step_positions(positions.begin() + first, positions.begin() + first + n);
      const Tensor seqs_d = gpu_ints(*gpu_, step_seqs), positions_d = gpu_ints(*gpu_, step_positions);
      const ops::StepView step{n, nullptr, positions_d.data<int32_t>(), seqs_d.data<int32_t>(), tables_d.data<int32_t>(),
                                 stride, *std::max_element(step_positions.begin(), step_positions.end()) + 1};
      Tensor step_q_host = Tensor::empty(DType::F32, {n, c.heads, c.d});
      std::memcpy(step_q_host.raw_data(), q.data<float>() + first * c.heads * c.d, step_q_host.nbytes());
      const Tensor step_q = backend::to_device(*gpu_, step_q_host);
      Tensor out_d = backend::device_empty(*gpu_, DType::F32, {n, c.heads, c.d});
      ops::cuda::paged_attention(*gpu_, step_q, step, pool, c.kv_heads, scale, c.window,
                                 c.sinks ? sinks_d.data<float>() : nullptr, out_d);
      gpu_->set_kernel_choice("cluster_merge", "rule");
      return backend::to_host(*gpu_, out_d);
    };
    for (const bool invariant : {false, true}) {
      gpu_->set_batch_invariant(invariant);
      const std::string what = std::to_string(c.heads) + " heads over " + std::to_string(c.kv_heads) + " of " +
                               std::to_string(c.d) + ", window " + std::to_string(c.window) +
                               (c.sinks ? ", sinks" : "") + (invariant ? ", batch invariant" : "");
      for (int64_t t = 0; t < tokens; ++t) {
        if (seqs[t] < 0) continue;
        const Tensor merged = attend(t, 1, true), kernel = attend(t, 1, false);
        EXPECT_EQ(std::memcmp(merged.raw_data(), kernel.raw_data(), merged.nbytes()), 0)
            << what << ", token at " << positions[t] << " alone";
      }
      const Tensor merged = attend(0, tokens, true), kernel = attend(0, tokens, false);
      EXPECT_EQ(std::memcmp(merged.raw_data(), kernel.raw_data(), merged.nbytes()), 0) << what << ", all tokens";
      const float* padding = merged.data<float>() + 3 * c.heads * c.d;
      EXPECT_TRUE(std::all_of(padding, padding + c.heads * c.d, [](float v) { return v == 0.0f; })) << what;
      const float* row = merged.data<float>();
      EXPECT_TRUE(std::all_of(row, row + tokens * c.heads * c.d, [](float v) { return std::isfinite(v); })) << what;
    }
    gpu_->set_batch_invariant(false);
  }
}

// Long windows: decode tokens at 1000, 700 and 129 cached positions (the last over a sliding
// window of 300) and a padding row, GQA 8:1 with head_dim 128 (the 128-bit loads) and 4:1 with
// 64, in both chunkings: 128-position chunks (--batch-invariant) and the longer ones a small step
// gets (several 32-position tiles per warp), over float32 pools and bf16 ones (the tensor-core
// kernel). All match the CPU's attention; with --batch-invariant, a token's output alone equals
// its output in the batch bit for bit.
TEST_F(CudaOps, PagedAttentionOverLongWindowsMatchesTheCpu) {
  struct Case { int64_t heads, kv_heads, d, window; bool bf16; };
  for (const Case c : {Case{16, 2, 128, 0, false}, Case{8, 2, 64, 300, false}, Case{16, 2, 128, 0, true},
                       Case{8, 2, 64, 300, true}}) {
    const int64_t block = 16, stride = 64, width = c.kv_heads * c.d;
    const std::vector<int32_t> seqs = {0, -1, 1, 2}, positions = {999, 0, 699, 128};
    const auto tokens = static_cast<int64_t>(seqs.size());
    // Each sequence's blocks: a shuffled slice of the pool.
    std::vector<int32_t> order(3 * stride);
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::shuffle(order.begin(), order.end(), std::mt19937(40));
    const int64_t pool_blocks = static_cast<int64_t>(order.size());
    // A bf16 pool holds rows rounded to bf16: the CPU then attends over the same values.
    const auto rows = [&](uint32_t seed) {
      Tensor t = gpu_random({pool_blocks * block, width}, seed);
      if (c.bf16) {
        for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = bf16_to_f32(f32_to_bf16(t.data<float>()[i]));
      }
      return t;
    };
    const Tensor keys = rows(41), values = rows(42);
    const Tensor q = gpu_random({tokens, c.heads, c.d}, 43, 3.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    std::vector<ops::KvWindow> windows(static_cast<std::size_t>(tokens));
    std::vector<std::vector<int32_t>> tables(3);
    for (int64_t s = 0; s < 3; ++s) tables[s].assign(order.begin() + s * stride, order.begin() + (s + 1) * stride);
    for (int64_t t = 0; t < tokens; ++t) {
      if (seqs[t] < 0) continue;
      const ops::PagedKv kv{const_cast<float*>(keys.data<float>()), const_cast<float*>(values.data<float>()), width, width,
                            block, tables[seqs[t]]};
      windows[t] = {kv, c.window > 0 ? std::max<int64_t>(0, positions[t] - c.window + 1) : 0, positions[t] + 1};
    }
    Tensor want = Tensor::empty(DType::F32, {tokens, c.heads, c.d});
    ops::attention(cpu_, q, windows, c.kv_heads, scale, want, nullptr);

    const DType pool_dtype = c.bf16 ? DType::BF16 : DType::F32;
    Tensor keys_d = backend::to_device_as(*gpu_, keys, pool_dtype), values_d = backend::to_device_as(*gpu_, values, pool_dtype);
    const Tensor tables_d = gpu_ints(*gpu_, order);
    const ops::KvPool pool{keys_d.raw_data(), values_d.raw_data(), width, width, block, pool_blocks, c.bf16};
    auto attend = [&](const std::vector<int32_t>& step_seqs, const std::vector<int32_t>& step_positions, const Tensor& step_q) {
      const Tensor seqs_d = gpu_ints(*gpu_, step_seqs), positions_d = gpu_ints(*gpu_, step_positions);
      const ops::StepView step{static_cast<int64_t>(step_seqs.size()), nullptr, positions_d.data<int32_t>(),
                                 seqs_d.data<int32_t>(), tables_d.data<int32_t>(), stride,
                                 *std::max_element(step_positions.begin(), step_positions.end()) + 1};
      const Tensor q_d = backend::to_device(*gpu_, step_q);
      Tensor out_d = backend::device_empty(*gpu_, DType::F32, step_q.shape());
      ops::cuda::paged_attention(*gpu_, q_d, step, pool, c.kv_heads, scale, c.window, nullptr, out_d);
      return backend::to_host(*gpu_, out_d);
    };
    for (const bool invariant : {false, true}) {
      gpu_->set_batch_invariant(invariant);
      const Tensor got = attend(seqs, positions, q);
      EXPECT_LT(gpu_relative_error(got, want), 1e-5)
          << c.heads << " heads over " << c.kv_heads << " of " << c.d << ", window " << c.window
          << (invariant ? ", batch invariant" : "") << (c.bf16 ? ", bf16 pool" : "");
      if (invariant) {
        // The last token (seq 2 at 128) alone.
        Tensor q_alone = Tensor::empty(DType::F32, {1, c.heads, c.d});
        std::memcpy(q_alone.raw_data(), q.data<float>() + (tokens - 1) * c.heads * c.d, q_alone.nbytes());
        const Tensor alone = attend({2}, {128}, q_alone);
        EXPECT_EQ(std::memcmp(alone.raw_data(), got.data<float>() + (tokens - 1) * c.heads * c.d, alone.nbytes()), 0)
            << "batch invariance, " << c.heads << " heads of " << c.d << (c.bf16 ? ", bf16 pool" : "");
      }
    }
    gpu_->set_batch_invariant(false);
  }
}

// The routing kernel against the CPU rules it stands for, on random logits with some rows
// replaying a forced routing: ids equal on every row, weights within one rounding (and counted
// when not bit-identical), and the capture rows, written at the layer's place in a [tokens,
// layers, k] buffer, equal to the ids.
TEST_F(CudaOps, RoutingWithCaptureMatchesTheCpuRules) {
  using Kind = moe::DeviceRoutingRule::Kind;
  struct Case {
    const char* name;
    int64_t experts;
    int32_t k;
    std::shared_ptr<const moe::RoutingRule> cpu;
    moe::DeviceRoutingRule device;
  };
  std::vector<float> bias(256);
  std::mt19937 rng(20);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (float& b : bias) b = normal(rng);
  const Tensor bias_d = backend::to_device(*gpu_, Tensor::from(bias, {256}));
  const std::vector<Case> cases = {
      {"softmax-topk, renormalised", 64, 8, std::make_shared<moe::SoftmaxTopK>(8, true), {Kind::kSoftmaxTopK, 8, true}},
      {"softmax-topk", 60, 4, std::make_shared<moe::SoftmaxTopK>(4, false), {Kind::kSoftmaxTopK, 4, false}},
      {"sigmoid-group-topk", 256, 8, std::make_shared<moe::SigmoidGroupTopK>(8, bias, 8, 4, true, 2.5f),
       {Kind::kSigmoidGroupTopK, 8, true, 8, 4, 2.5f, bias_d.data<float>()}},
      {"sigmoid-group-topk, no renormalisation", 256, 6, std::make_shared<moe::SigmoidGroupTopK>(6, bias, 1, 1, false, 1.5f),
       {Kind::kSigmoidGroupTopK, 6, false, 1, 1, 1.5f, bias_d.data<float>()}},
      {"topk-softmax", 32, 4, std::make_shared<moe::TopKSoftmax>(4), {Kind::kTopKSoftmax, 4}},
  };
  const int64_t tokens = 97, layers = 3, layer = 1;
  for (const Case& c : cases) {
    const Tensor logits = gpu_random({tokens, c.experts}, 21, 2.0f);
    // Every third row replays a forced routing: the k last experts, in reverse order.
    std::vector<int32_t> forced(static_cast<std::size_t>(tokens * c.k));
    std::vector<uint8_t> replayed(static_cast<std::size_t>(tokens));
    for (int64_t t = 0; t < tokens; ++t) {
      replayed[t] = t % 3 == 0 ? 1 : 0;
      for (int32_t j = 0; j < c.k; ++j) forced[t * c.k + j] = static_cast<int32_t>(c.experts - 1 - j);
    }
    std::vector<int32_t> want_ids(forced.size());
    std::vector<float> want_weights(forced.size());
    std::vector<float> scratch(logits.data<float>(), logits.data<float>() + logits.numel());
    const std::vector<int32_t> token_ids(static_cast<std::size_t>(tokens), 0);
    c.cpu->route_rows({scratch, c.experts, token_ids, forced, replayed, want_ids.data(), want_weights.data()}, 0, tokens);

    const Tensor logits_d = backend::to_device(*gpu_, logits), forced_d = gpu_ints(*gpu_, forced);
    const Tensor replayed_d = backend::to_device(*gpu_, Tensor::from(replayed, {tokens}));
    Tensor ids_d = backend::device_empty(*gpu_, DType::I32, {tokens, c.k});
    Tensor weights_d = backend::device_empty(*gpu_, DType::F32, {tokens, c.k});
    Tensor capture_d = backend::device_empty(*gpu_, DType::I32, {tokens, layers, c.k});
    moe::route_on_device(*gpu_, logits_d, c.device, forced_d.data<int32_t>(), replayed_d.data<uint8_t>(),
                         ids_d.data<int32_t>(), weights_d.data<float>(),
                         {capture_d.data<int32_t>() + layer * c.k, layers * c.k});
    const Tensor ids = backend::to_host(*gpu_, ids_d), weights = backend::to_host(*gpu_, weights_d);
    const Tensor captured = backend::to_host(*gpu_, capture_d);
    int64_t inexact = 0;
    for (int64_t i = 0; i < tokens * c.k; ++i) {
      ASSERT_EQ(ids.data<int32_t>()[i], want_ids[i]) << c.name << ", token " << i / c.k << " choice " << i % c.k;
      const float w = weights.data<float>()[i];
      EXPECT_NEAR(w, want_weights[i], 1e-6f * std::abs(want_weights[i])) << c.name << ", weight " << i;
      inexact += w != want_weights[i] ? 1 : 0;
      const int64_t t = i / c.k, j = i % c.k;
      ASSERT_EQ(captured.data<int32_t>()[(t * layers + layer) * c.k + j], want_ids[i]) << c.name << ", capture row " << t;
      ASSERT_EQ(captured.data<int32_t>()[(t * layers + 0) * c.k + j], 0) << c.name << ": another layer's row was written";
    }
    RecordProperty(std::string(c.name) + " weights not bit-identical", static_cast<int>(inexact));
    std::printf("%s: %lld of %lld weights not bit-identical to the CPU\n", c.name, static_cast<long long>(inexact),
                static_cast<long long>(tokens * c.k));
  }
}

// The softmax top-k kernel that keeps a token's scores in registers (moe/cuda/routing_in_registers.cuh;
// against the CPU rules in RoutingWithCaptureMatchesTheCpuRules): capture rows equal to the ids, a
// free row's margin set and its ids distinct, equal scores going to the lower id, over 128 and 256
// experts (one and two register blocks a lane), experts not a multiple of 32, k up to 32, logits
// with many exact ties and every third row replaying a forced routing.
TEST_F(CudaOps, RoutingInRegistersCapturesItsIdsAndBreaksTiesLow) {
  using Kind = moe::DeviceRoutingRule::Kind;
  struct Case {
    int64_t experts;
    int32_t k;
    bool normalize;
    bool ties;
    float scale = 2.0f;  // logits' scale: at 2 every exp adds exactly (moe/exact_order_sum.h) and
                         // the softmax sums as a warp tree; at 40 most rows take the serial sum
  };
  const int64_t tokens = 45;
  for (const Case c : {Case{128, 8, true, false}, Case{128, 8, true, true}, Case{256, 8, true, false},
                       Case{256, 6, false, true}, Case{60, 4, false, false}, Case{200, 32, true, true},
                       Case{40, 32, false, false}, Case{128, 8, true, false, 40.0f}, Case{256, 8, false, true, 40.0f},
                       Case{60, 4, true, false, 40.0f}}) {
    Tensor logits = gpu_random({tokens, c.experts}, 22, c.scale);
    if (c.ties) {
      for (int64_t i = 0; i < logits.numel(); ++i) logits.data<float>()[i] = std::round(logits.data<float>()[i]);
    }
    std::vector<int32_t> forced(static_cast<std::size_t>(tokens * c.k));
    std::vector<uint8_t> replayed(static_cast<std::size_t>(tokens));
    for (int64_t t = 0; t < tokens; ++t) {
      replayed[t] = t % 3 == 0 ? 1 : 0;
      for (int32_t j = 0; j < c.k; ++j) forced[t * c.k + j] = static_cast<int32_t>((t + 7 * j) % c.experts);
    }
    const Tensor logits_d = backend::to_device(*gpu_, logits), forced_d = gpu_ints(*gpu_, forced);
    const Tensor replayed_d = backend::to_device(*gpu_, Tensor::from(replayed, {tokens}));
    const moe::DeviceRoutingRule rule{Kind::kSoftmaxTopK, c.k, c.normalize};
    struct Routed {
      Tensor ids, weights, capture, margins;
    };
    auto route = [&] {
      Tensor ids_d = backend::device_empty(*gpu_, DType::I32, {tokens, c.k});
      Tensor weights_d = backend::device_empty(*gpu_, DType::F32, {tokens, c.k});
      Tensor capture_d = backend::to_device(*gpu_, Tensor::from(std::vector<int32_t>(tokens * 2 * c.k, -1), {tokens, 2, c.k}));
      Tensor margins_d = backend::to_device(*gpu_, Tensor::from(std::vector<float>(tokens * 2, -7.0f), {tokens, 2}));
      moe::route_on_device(*gpu_, logits_d, rule, forced_d.data<int32_t>(), replayed_d.data<uint8_t>(),
                           ids_d.data<int32_t>(), weights_d.data<float>(),
                           {capture_d.data<int32_t>() + c.k, 2 * c.k, margins_d.data<float>() + 1, 2});
      return Routed{backend::to_host(*gpu_, ids_d), backend::to_host(*gpu_, weights_d), backend::to_host(*gpu_, capture_d),
                    backend::to_host(*gpu_, margins_d)};
    };
    const Routed registers = route();
    const std::string what = std::to_string(c.experts) + " experts, top-" + std::to_string(c.k) +
                             (c.normalize ? ", renormalised" : "") + (c.ties ? ", ties" : "") +
                             ", scale " + std::to_string(c.scale);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int32_t j = 0; j < c.k; ++j) {
        ASSERT_EQ(registers.capture.data<int32_t>()[(t * 2 + 1) * c.k + j], registers.ids.data<int32_t>()[t * c.k + j])
            << what << ", capture row " << t;
      }
    }
    // The routing happened: a free row's margin is set and its ids are distinct.
    EXPECT_FALSE(std::isnan(registers.margins.data<float>()[1 * 2 + 1])) << what;
    const int32_t* row = registers.ids.data<int32_t>() + 1 * c.k;
    EXPECT_EQ(std::set<int32_t>(row, row + c.k).size(), static_cast<std::size_t>(c.k)) << what;
    if (c.ties && !c.normalize) {
      // Equal scores go to the lower id: along a free row (its weights are its scores), a
      // choice's score never rises, and on an equal score the ids rise.
      const float* w = registers.weights.data<float>() + 1 * c.k;
      for (int32_t j = 1; j < c.k; ++j) {
        EXPECT_LE(w[j], w[j - 1]) << what;
        if (w[j] == w[j - 1]) {
          EXPECT_GT(row[j], row[j - 1]) << what;
        }
      }
    }
  }
}

// The fused experts kernels against a double-precision evaluation of the same experts (the
// CPU's activation per element): float32 and bf16 weights, SwiGLU and GPT-OSS's clamped
// activation with biases, tokens choosing overlapping experts.
TEST_F(CudaOps, FusedExpertsMatchADoubleEvaluation) {
  const int64_t experts = 6, h = 96, k = 3;
  // Three routings: 5 tokens over overlapping experts; 20 and 70 tokens all on experts 1, 2 and
  // 3 (more pairs per expert than one pass of the grouped kernels takes: 70 tokens give 70 pairs
  // per expert, three passes of the tensor cores' widest tiles). Intermediate 40 takes the
  // kernels' 128-bit loads, 36 their element loads; 64 with bf16 weights, the tensor cores (every
  // routing has at least two pairs per expert on average), in 8-pair tiles of which the last of
  // each expert is partly empty.
  // Two tokens take the decode steps' pair-major kernels (no grouping, the combine in the down kernel).
  for (const int64_t inter : {40, 36, 64})
  for (const int64_t tokens : {2, 5, 20, 70}) {
    std::vector<int32_t> ids = {0, 5, 2, 2, 0, 1, 5, 4, 3, 1, 2, 0, 4, 5, 3};
    std::vector<float> weights = {0.5f, 0.3f, 0.2f, 0.9f, 0.05f, 0.05f, 0.4f, 0.4f, 0.2f, 1.0f, 0.0f, 0.0f, 0.25f, 0.5f, 0.25f};
    ids.resize(static_cast<std::size_t>(std::min<int64_t>(tokens, 5) * k));
    weights.resize(ids.size());
    if (tokens > 5) {
      ids.clear();
      weights.clear();
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t j = 0; j < k; ++j) ids.push_back(static_cast<int32_t>(1 + (t + j) % 3));
        for (float w : {0.6f, 0.3f, 0.1f}) weights.push_back(w);
      }
    }
    const Tensor x = gpu_random({tokens, h}, 30), gate = gpu_random({experts, inter, h}, 31, 0.2f),
                 up = gpu_random({experts, inter, h}, 32, 0.2f), down = gpu_random({experts, h, inter}, 33, 0.2f);
    const Tensor gate_b = gpu_random({experts, inter}, 34), up_b = gpu_random({experts, inter}, 35),
                 down_b = gpu_random({experts, h}, 36);
    auto bf16_of = [](const Tensor& t) {
      Tensor b = Tensor::empty(DType::BF16, t.shape());
      auto* bits = static_cast<uint16_t*>(b.raw_data());
      for (int64_t i = 0; i < t.numel(); ++i) bits[i] = f32_to_bf16(t.data<float>()[i]);
      return b;
    };
    auto widened = [](const Tensor& t) {
      std::vector<float> v(static_cast<std::size_t>(t.numel()));
      convert_to_f32(t.raw_data(), t.dtype(), v.size(), v.data());
      return v;
    };
    const moe::ExpertActivation swiglu{}, gpt_oss{moe::ExpertActivation::Kind::kGptOss, 7.0f, 1.702f};
    for (const bool bf16 : {false, true}) {
      for (const bool oss : {false, true}) {
        moe::DeviceExperts dev;
        const Tensor g = bf16 ? bf16_of(gate) : gate, u = bf16 ? bf16_of(up) : up, d = bf16 ? bf16_of(down) : down;
        dev.gate = backend::to_device(*gpu_, g);
        dev.up = backend::to_device(*gpu_, u);
        dev.down = backend::to_device(*gpu_, d);
        if (oss) {
          dev.gate_bias = backend::to_device(*gpu_, gate_b);
          dev.up_bias = backend::to_device(*gpu_, up_b);
          dev.down_bias = backend::to_device(*gpu_, down_b);
        }
        dev.activation = oss ? gpt_oss : swiglu;
        // The oracle, from the same (rounded) weights.
        const std::vector<float> gw = widened(g), uw = widened(u), dw = widened(d);
        Tensor want = Tensor::empty(DType::F32, {tokens, h});
        for (int64_t t = 0; t < tokens; ++t) {
          std::vector<double> acc(static_cast<std::size_t>(h), 0.0);
          for (int64_t j = 0; j < k; ++j) {
            const int64_t e = ids[t * k + j];
            std::vector<float> a(static_cast<std::size_t>(inter));
            for (int64_t i = 0; i < inter; ++i) {
              double gs = 0, us = 0;
              for (int64_t c = 0; c < h; ++c) {
                gs += static_cast<double>(x.data<float>()[t * h + c]) * gw[(e * inter + i) * h + c];
                us += static_cast<double>(x.data<float>()[t * h + c]) * uw[(e * inter + i) * h + c];
              }
              if (oss) {
                gs += gate_b.data<float>()[e * inter + i];
                us += up_b.data<float>()[e * inter + i];
              }
              a[i] = dev.activation(static_cast<float>(gs), static_cast<float>(us));
            }
            for (int64_t c = 0; c < h; ++c) {
              double y = 0;
              for (int64_t i = 0; i < inter; ++i) y += static_cast<double>(a[i]) * dw[(e * h + c) * inter + i];
              if (oss) y += down_b.data<float>()[e * h + c];
              acc[c] += weights[t * k + j] * y;
            }
          }
          for (int64_t c = 0; c < h; ++c) want.data<float>()[t * h + c] = static_cast<float>(acc[c]);
        }
        const Tensor ids_d = gpu_ints(*gpu_, ids), weights_d = backend::to_device(*gpu_, Tensor::from(weights, {tokens, k}));
        Tensor grouping = backend::device_empty(*gpu_, DType::I32, {moe::grouping_ints(experts, tokens * k)});
        Tensor activated = backend::device_empty(*gpu_, DType::F32, {moe::expert_scratch_rows(tokens * k), inter});
        Tensor expert_out = backend::device_empty(*gpu_, DType::F32, {moe::expert_scratch_rows(tokens * k), h});
        Tensor out = backend::device_empty(*gpu_, DType::F32, {tokens, h});
        moe::fused_experts_of_ids(*gpu_, backend::to_device(*gpu_, x), ids_d.data<int32_t>(), weights_d.data<float>(), k,
                                     dev, grouping, activated, expert_out, out);
        // The tensor cores see each activation as two bfloat16 parts (about 16 significant bits).
        const bool tensor_cores = bf16 && inter % 32 == 0;
        EXPECT_LT(gpu_relative_error(backend::to_host(*gpu_, out), want), tensor_cores ? 1e-4 : 1e-5)
            << tokens << " tokens, intermediate " << inter << ", " << (bf16 ? "bf16" : "f32") << (oss ? ", GPT-OSS activation with biases" : ", SwiGLU") << (tensor_cores ? ", tensor cores" : "");
      }
    }
  }
}

// [experts, rows, cols] floats as e4m3 values with a float32 scale per block_rows x block_cols
// block (the block's largest magnitude over 448, as published checkpoints scale), and the
// dequantized floats (each value times its scale, rounded once, as the CPU decodes it).
struct Fp8Quantized {
  Tensor values, scales;
  std::vector<float> dequantized;
};
Fp8Quantized quantize_fp8(const Tensor& w, int64_t block_rows, int64_t block_cols) {
  const int64_t experts = w.dim(0), rows = w.dim(1), cols = w.dim(2);
  const int64_t srows = (rows + block_rows - 1) / block_rows, scols = (cols + block_cols - 1) / block_cols;
  Fp8Quantized q{Tensor::empty(DType::F8_E4M3, {experts, rows, cols}), Tensor::empty(DType::F32, {experts, srows, scols}),
                 std::vector<float>(static_cast<std::size_t>(w.numel()))};
  auto* bytes = static_cast<uint8_t*>(q.values.raw_data());
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t sr = 0; sr < srows; ++sr) {
      for (int64_t sc = 0; sc < scols; ++sc) {
        float top = 0;
        for (int64_t r = sr * block_rows; r < std::min(rows, (sr + 1) * block_rows); ++r) {
          for (int64_t c = sc * block_cols; c < std::min(cols, (sc + 1) * block_cols); ++c) {
            top = std::max(top, std::abs(w.data<float>()[(e * rows + r) * cols + c]));
          }
        }
        const float scale = top / 448.0f;
        q.scales.data<float>()[(e * srows + sr) * scols + sc] = scale;
        for (int64_t r = sr * block_rows; r < std::min(rows, (sr + 1) * block_rows); ++r) {
          for (int64_t c = sc * block_cols; c < std::min(cols, (sc + 1) * block_cols); ++c) {
            const int64_t i = (e * rows + r) * cols + c;
            bytes[i] = f32_to_f8_e4m3(w.data<float>()[i] / scale);
            q.dequantized[static_cast<std::size_t>(i)] = f8_e4m3_to_f32(bytes[i]) * scale;
          }
        }
      }
    }
  }
  return q;
}

// FP8 experts on the device from quantized gate, up and down.
moe::DeviceExperts fp8_device_experts(backend::Context& gpu, const Fp8Quantized& gate, const Fp8Quantized& up,
                                      const Fp8Quantized& down, int64_t block_rows, int64_t block_cols) {
  moe::DeviceExperts dev;
  dev.gate = backend::to_device(gpu, gate.values);
  dev.up = backend::to_device(gpu, up.values);
  dev.down = backend::to_device(gpu, down.values);
  dev.gate_scales = backend::to_device(gpu, gate.scales);
  dev.up_scales = backend::to_device(gpu, up.scales);
  dev.down_scales = backend::to_device(gpu, down.scales);
  dev.block_rows = block_rows;
  dev.block_cols = block_cols;
  return dev;
}

// The fused experts' output for `tokens` rows of x, each with k (id, weight) choices, in double
// over the dequantized weights (the activation rounded to float as the kernels keep it).
Tensor fp8_experts_in_double(const Tensor& x, const std::vector<int32_t>& ids, const std::vector<float>& weights,
                             int64_t k, const Fp8Quantized& gate, const Fp8Quantized& up, const Fp8Quantized& down,
                             int64_t inter) {
  const int64_t tokens = x.dim(0), h = x.dim(1);
  Tensor want = Tensor::empty(DType::F32, {tokens, h});
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> acc(static_cast<std::size_t>(h), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[static_cast<std::size_t>(t * k + j)];
      std::vector<float> a(static_cast<std::size_t>(inter));
      for (int64_t i = 0; i < inter; ++i) {
        double gs = 0, us = 0;
        for (int64_t c = 0; c < h; ++c) {
          const double xv = x.data<float>()[t * h + c];
          gs += xv * gate.dequantized[static_cast<std::size_t>((e * inter + i) * h + c)];
          us += xv * up.dequantized[static_cast<std::size_t>((e * inter + i) * h + c)];
        }
        a[static_cast<std::size_t>(i)] = moe::ExpertActivation{}(static_cast<float>(gs), static_cast<float>(us));
      }
      for (int64_t c = 0; c < h; ++c) {
        double y = 0;
        for (int64_t i = 0; i < inter; ++i) {
          y += static_cast<double>(a[static_cast<std::size_t>(i)]) *
               down.dequantized[static_cast<std::size_t>((e * h + c) * inter + i)];
        }
        acc[static_cast<std::size_t>(c)] += weights[static_cast<std::size_t>(t * k + j)] * y;
      }
    }
    for (int64_t c = 0; c < h; ++c) want.data<float>()[t * h + c] = static_cast<float>(acc[static_cast<std::size_t>(c)]);
  }
  return want;
}

// FP8 experts (e4m3 with 2D block scales) on the tensor cores, as a model placed with bfloat16
// precision runs them, against a double evaluation of the dequantized weights (each e4m3 value
// times its block's scale, rounded once, as the CPU decodes it): blocks of 16 x 32, 32 x 32 and
// 128 x 128 (one partial block each way at these widths), 20 and 70 tokens. Placed for float32
// the same experts keep the weight-streaming rows, within float32 rounding.
TEST_F(CudaOps, Fp8ExpertsOnTensorCoresMatchADoubleEvaluation) {
  const int64_t experts = 6, h = 96, inter = 64, k = 3;
  struct Blocks { int64_t rows, cols; };
  for (const Blocks b : {Blocks{16, 32}, Blocks{32, 32}, Blocks{128, 128}}) {
    const auto quantize = [&](int64_t rows, int64_t cols, uint32_t seed) {
      return quantize_fp8(gpu_random({experts, rows, cols}, seed, 0.2f), b.rows, b.cols);
    };
    const Fp8Quantized gate = quantize(inter, h, 71), up = quantize(inter, h, 72), down = quantize(h, inter, 73);
    for (const int64_t tokens : {20, 70}) {
      std::vector<int32_t> ids;
      std::vector<float> weights;
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t j = 0; j < k; ++j) ids.push_back(static_cast<int32_t>((t + 2 * j) % experts));
        for (float w : {0.6f, 0.3f, 0.1f}) weights.push_back(w);
      }
      const Tensor x = gpu_random({tokens, h}, 74);
      const Tensor want = fp8_experts_in_double(x, ids, weights, k, gate, up, down, inter);
      Tensor by_path[2];  // tensor cores, rows
      for (const bool reduced : {true, false}) {
        const moe::DeviceExperts dev = fp8_device_experts(*gpu_, gate, up, down, b.rows, b.cols);
        const Tensor ids_d = gpu_ints(*gpu_, ids), weights_d = backend::to_device(*gpu_, Tensor::from(weights, {tokens, k}));
        Tensor grouping = backend::device_empty(*gpu_, DType::I32, {moe::grouping_ints(experts, tokens * k)});
        Tensor activated = backend::device_empty(*gpu_, DType::F32, {moe::expert_scratch_rows(tokens * k), inter});
        Tensor expert_out = backend::device_empty(*gpu_, DType::F32, {moe::expert_scratch_rows(tokens * k), h});
        Tensor out = backend::device_empty(*gpu_, DType::F32, {tokens, h});
        {
          const backend::ReducedPrecisionScope precision(*gpu_, reduced);
          moe::fused_experts_of_ids(*gpu_, backend::to_device(*gpu_, x), ids_d.data<int32_t>(),
                                       weights_d.data<float>(), k, dev, grouping, activated, expert_out, out);
        }
        by_path[reduced ? 0 : 1] = backend::to_host(*gpu_, out);
        EXPECT_LT(gpu_relative_error(by_path[reduced ? 0 : 1], want), reduced ? 1e-4 : 1e-5)
            << tokens << " tokens, blocks " << b.rows << " x " << b.cols << (reduced ? ", tensor cores" : ", rows");
      }
      // The two placements took different kernels (their roundings differ somewhere).
      EXPECT_NE(std::memcmp(by_path[0].raw_data(), by_path[1].raw_data(), by_path[0].nbytes()), 0)
          << tokens << " tokens, blocks " << b.rows << " x " << b.cols;
    }
  }
}

// A token's expert output has the same bits whichever kernels run it: alone or with one other
// token (the pair-major kernels of decode steps) and among 37 (grouped by expert), with
// --batch-invariant (which keeps the tensor cores out) and float32 or bf16 weights, over
// 128-bit and element loads. That is what lets a step of any size take either path.
TEST_F(CudaOps, FusedExpertsGiveATokenTheSameBitsOnEveryPath) {
  const int64_t experts = 6, h = 64, k = 3, tokens = 37;
  std::mt19937 rng(7);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> order = {0, 1, 2, 3, 4, 5};
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t j = 0; j < k; ++j) {
      ids.push_back(order[static_cast<std::size_t>(j)]);
      weights.push_back(0.2f + 0.1f * static_cast<float>(j) + 0.01f * static_cast<float>(t));
    }
  }
  const Tensor x = gpu_random({tokens, h}, 60);
  gpu_->set_batch_invariant(true);
  for (const int64_t inter : {40, 36}) {
    for (const DType dtype : {DType::F32, DType::BF16}) {
      moe::DeviceExperts dev;
      dev.gate = backend::to_device_as(*gpu_, gpu_random({experts, inter, h}, 61, 0.2f), dtype);
      dev.up = backend::to_device_as(*gpu_, gpu_random({experts, inter, h}, 62, 0.2f), dtype);
      dev.down = backend::to_device_as(*gpu_, gpu_random({experts, h, inter}, 63, 0.2f), dtype);
      dev.down_bias = backend::to_device(*gpu_, gpu_random({experts, h}, 64));
      // Tokens [first, first + n) through the kernels.
      auto run = [&](int64_t first, int64_t n) {
        const std::vector<int32_t> step_ids(ids.begin() + first * k, ids.begin() + (first + n) * k);
        const std::vector<float> step_weights(weights.begin() + first * k, weights.begin() + (first + n) * k);
        Tensor step_x = Tensor::empty(DType::F32, {n, h});
        std::memcpy(step_x.raw_data(), x.data<float>() + first * h, step_x.nbytes());
        const Tensor ids_d = gpu_ints(*gpu_, step_ids), weights_d = backend::to_device(*gpu_, Tensor::from(step_weights, {n, k}));
        Tensor grouping = backend::device_empty(*gpu_, DType::I32, {moe::grouping_ints(experts, n * k)});
        Tensor activated = backend::device_empty(*gpu_, DType::F32, {moe::expert_scratch_rows(n * k), inter});
        Tensor expert_out = backend::device_empty(*gpu_, DType::F32, {moe::expert_scratch_rows(n * k), h});
        Tensor out = backend::device_empty(*gpu_, DType::F32, {n, h});
        moe::fused_experts_of_ids(*gpu_, backend::to_device(*gpu_, step_x), ids_d.data<int32_t>(),
                                     weights_d.data<float>(), k, dev, grouping, activated, expert_out, out);
        return backend::to_host(*gpu_, out);
      };
      const Tensor all = run(0, tokens);
      for (const int64_t first : {0, 11, 36}) {
        const Tensor alone = run(first, 1);
        EXPECT_EQ(std::memcmp(alone.raw_data(), all.data<float>() + first * h, alone.nbytes()), 0)
            << "token " << first << " alone, intermediate " << inter << ", " << dtype_name(dtype);
      }
      const Tensor two = run(20, 2);
      EXPECT_EQ(std::memcmp(two.raw_data(), all.data<float>() + 20 * h, two.nbytes()), 0)
          << "tokens 20 and 21, intermediate " << inter << ", " << dtype_name(dtype);
    }
  }
  gpu_->set_batch_invariant(false);
}

// FP8 gate/up at one to four tokens with the scales held by the lanes (a hidden size a multiple of
// 256 and at most 32 scale blocks: 512 at blocks of 128 and of 16), and down + combine at one
// token the same way where the expert width fits too (256; 96 does not and takes a load a group),
// match a double evaluation of the dequantized weights.
TEST_F(CudaOps, Fp8ExpertsWithScalesFromTheLanesMatchADoubleEvaluation) {
  const int64_t experts = 4, h = 512, k = 2;
  // (expert width, scale block): down's scales fit the lanes at 256 only.
  for (const std::pair<int64_t, int64_t>& shape : {std::pair<int64_t, int64_t>{96, 128}, {96, 16}, {256, 128}, {256, 16}}) {
    const int64_t inter = shape.first, block = shape.second;
    const auto quantize = [&](int64_t rows, int64_t cols, uint32_t seed) {
      return quantize_fp8(gpu_random({experts, rows, cols}, seed, 0.2f), block, block);
    };
    const Fp8Quantized gate = quantize(inter, h, 81), up = quantize(inter, h, 82), down = quantize(h, inter, 83);
    const moe::DeviceExperts dev = fp8_device_experts(*gpu_, gate, up, down, block, block);
    for (const int64_t tokens : {int64_t{1}, int64_t{3}}) {
      std::vector<int32_t> ids;
      std::vector<float> weights;
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t j = 0; j < k; ++j) ids.push_back(static_cast<int32_t>((t + 3 * j) % experts));
        weights.push_back(0.7f);
        weights.push_back(0.3f);
      }
      const Tensor x = gpu_random({tokens, h}, 84);
      auto run = [&] {
        const Tensor ids_d = gpu_ints(*gpu_, ids), weights_d = backend::to_device(*gpu_, Tensor::from(weights, {tokens, k}));
        Tensor grouping = backend::device_empty(*gpu_, DType::I32, {moe::grouping_ints(experts, tokens * k)});
        Tensor activated = backend::device_empty(*gpu_, DType::F32, {moe::expert_scratch_rows(tokens * k), inter});
        Tensor expert_out = backend::device_empty(*gpu_, DType::F32, {moe::expert_scratch_rows(tokens * k), h});
        Tensor out = backend::device_empty(*gpu_, DType::F32, {tokens, h});
        moe::fused_experts_of_ids(*gpu_, backend::to_device(*gpu_, x), ids_d.data<int32_t>(), weights_d.data<float>(),
                                     k, dev, grouping, activated, expert_out, out);
        return backend::to_host(*gpu_, out);
      };
      const Tensor with_lanes = run();
      const std::string what = std::to_string(tokens) + " tokens, width " + std::to_string(inter) + ", blocks of " +
                               std::to_string(block);
      const Tensor want = fp8_experts_in_double(x, ids, weights, k, gate, up, down, inter);
      EXPECT_LT(gpu_relative_error(with_lanes, want), 1e-5) << what;
    }
  }
}

// Gate/up at one token held to one wave of blocks (the kernel choice gate_up_one_wave forced
// always: two groups of eight in flight a row, six blocks an SM) gives the bits of the default
// kernel (forced never), bfloat16 with biases and the clamped activation, and FP8 with its scales
// from the lanes (blocks of 128) and from a load a group (blocks of 16: 128 blocks a row do not fit
// the lanes), at Qwen3-30B-A3B's expert shape.
TEST_F(CudaOps, GateUpInOneWaveGivesTheSameBits) {
  const int64_t experts = 16, h = 2048, inter = 768, k = 8;
  const std::vector<int32_t> ids = {3, 14, 0, 9, 7, 12, 5, 1};
  const std::vector<float> weights = {0.2f, 0.15f, 0.14f, 0.13f, 0.12f, 0.1f, 0.09f, 0.07f};
  const Tensor x = gpu_random({1, h}, 70);
  const Fp8Quantized gate8 = quantize_fp8(gpu_random({experts, inter, h}, 71, 0.05f), 128, 128),
                     up8 = quantize_fp8(gpu_random({experts, inter, h}, 72, 0.05f), 128, 128),
                     down8 = quantize_fp8(gpu_random({experts, h, inter}, 73, 0.05f), 128, 128);
  const Fp8Quantized gate16 = quantize_fp8(gpu_random({experts, inter, h}, 71, 0.05f), 16, 16),
                     up16 = quantize_fp8(gpu_random({experts, inter, h}, 72, 0.05f), 16, 16),
                     down16 = quantize_fp8(gpu_random({experts, h, inter}, 73, 0.05f), 16, 16);
  moe::DeviceExperts bf16;
  bf16.gate = backend::to_device_as(*gpu_, gpu_random({experts, inter, h}, 74, 0.05f), DType::BF16);
  bf16.up = backend::to_device_as(*gpu_, gpu_random({experts, inter, h}, 75, 0.05f), DType::BF16);
  bf16.down = backend::to_device_as(*gpu_, gpu_random({experts, h, inter}, 76, 0.05f), DType::BF16);
  bf16.gate_bias = backend::to_device(*gpu_, gpu_random({experts, inter}, 77));
  bf16.up_bias = backend::to_device(*gpu_, gpu_random({experts, inter}, 78));
  bf16.down_bias = backend::to_device(*gpu_, gpu_random({experts, h}, 79));
  bf16.activation = moe::ExpertActivation{moe::ExpertActivation::Kind::kGptOss, 7.0f, 1.702f};
  const moe::DeviceExperts fp8 = fp8_device_experts(*gpu_, gate8, up8, down8, 128, 128);
  const moe::DeviceExperts fp8_blocks16 = fp8_device_experts(*gpu_, gate16, up16, down16, 16, 16);
  for (const int kind : {0, 1, 2}) {  // bf16; FP8, scales from the lanes; FP8, a load a group
    const moe::DeviceExperts& dev = kind == 0 ? bf16 : kind == 1 ? fp8 : fp8_blocks16;
    auto run = [&](const char* one_wave) {
      gpu_->set_kernel_choice("gate_up_one_wave", one_wave);
      const Tensor ids_d = gpu_ints(*gpu_, ids);
      const Tensor weights_d = backend::to_device(*gpu_, Tensor::from(weights, {1, k}));
      Tensor grouping = backend::device_empty(*gpu_, DType::I32, {moe::grouping_ints(experts, k)});
      Tensor activated = backend::device_empty(*gpu_, DType::F32, {moe::expert_scratch_rows(k), inter});
      Tensor expert_out = backend::device_empty(*gpu_, DType::F32, {moe::expert_scratch_rows(k), h});
      Tensor out = backend::device_empty(*gpu_, DType::F32, {1, h});
      moe::fused_experts_of_ids(*gpu_, backend::to_device(*gpu_, x), ids_d.data<int32_t>(), weights_d.data<float>(),
                                   k, dev, grouping, activated, expert_out, out);
      gpu_->set_kernel_choice("gate_up_one_wave", "rule");
      return backend::to_host(*gpu_, out);
    };
    const Tensor default_kernel = run("never"), six = run("always");
    const std::string what = kind == 0 ? "bf16" : kind == 1 ? "FP8, scales from the lanes" : "FP8, a load a group";
    EXPECT_EQ(std::memcmp(six.raw_data(), default_kernel.raw_data(), six.nbytes()), 0) << what << ", six blocks an SM";
    const float* v = six.data<float>();
    EXPECT_GT(std::count_if(v, v + h, [](float y) { return y != 0.0f; }), h * 9 / 10) << what;
    if (kind > 0) {
      const Tensor want = kind == 1 ? fp8_experts_in_double(x, ids, weights, k, gate8, up8, down8, inter)
                                    : fp8_experts_in_double(x, ids, weights, k, gate16, up16, down16, inter);
      EXPECT_LT(gpu_relative_error(six, want), 1e-5) << what;
    }
  }
}

// Down + combine at one token with a block's rows all in flight before its wait (the kernel
// choice down_rows_in_flight forced always) gives the bits of the kernel with a block a row (forced
// never): bfloat16 with biases (four rows a block; not taken by rule) and FP8 with the scales from
// the lanes (taken by rule, eight rows a block), at Qwen3-30B-A3B's expert shape with 8 choices and at a
// small one with 3, where bfloat16's expert width of 96 leaves most lanes without a group. Each
// setting runs two tokens in turn, launched as a step launches them (gate/up releasing down early),
// so that a kernel reading the first token's activations for the second's would show. A graph of
// each call shows which kernel ran.
TEST_F(CudaOps, DownWithRowsInFlightGivesTheSameBits) {
  struct Shape {
    int64_t experts, h, inter, k, fp8_block;
  };
  for (const Shape& shape : {Shape{16, 2048, 768, 8, 128}, Shape{6, 64, 96, 3, 0}, Shape{6, 64, 256, 3, 16}}) {
    const int64_t experts = shape.experts, h = shape.h, inter = shape.inter, k = shape.k;
    const bool fp8 = shape.fp8_block > 0;
    std::vector<int32_t> ids;
    std::vector<float> weights;
    for (int64_t j = 0; j < k; ++j) {
      ids.push_back(static_cast<int32_t>((5 * j + 3) % experts));
      weights.push_back(0.3f / static_cast<float>(j + 1));
    }
    const Tensor xs[2] = {gpu_random({1, h}, 90), gpu_random({1, h}, 89)};
    moe::DeviceExperts dev;
    Fp8Quantized gate8, up8, down8;
    if (fp8) {
      const int64_t b = shape.fp8_block;
      gate8 = quantize_fp8(gpu_random({experts, inter, h}, 91, 0.05f), b, b);
      up8 = quantize_fp8(gpu_random({experts, inter, h}, 92, 0.05f), b, b);
      down8 = quantize_fp8(gpu_random({experts, h, inter}, 93, 0.05f), b, b);
      dev = fp8_device_experts(*gpu_, gate8, up8, down8, b, b);
    } else {
      dev.gate = backend::to_device_as(*gpu_, gpu_random({experts, inter, h}, 94, 0.05f), DType::BF16);
      dev.up = backend::to_device_as(*gpu_, gpu_random({experts, inter, h}, 95, 0.05f), DType::BF16);
      dev.down = backend::to_device_as(*gpu_, gpu_random({experts, h, inter}, 96, 0.05f), DType::BF16);
      dev.gate_bias = backend::to_device(*gpu_, gpu_random({experts, inter}, 97));
      dev.up_bias = backend::to_device(*gpu_, gpu_random({experts, inter}, 98));
      dev.down_bias = backend::to_device(*gpu_, gpu_random({experts, h}, 99));
      dev.activation = moe::ExpertActivation{moe::ExpertActivation::Kind::kGptOss, 7.0f, 1.702f};
    }
    const Tensor xs_d[2] = {backend::to_device(*gpu_, xs[0]), backend::to_device(*gpu_, xs[1])};
    const Tensor ids_d = gpu_ints(*gpu_, ids), weights_d = backend::to_device(*gpu_, Tensor::from(weights, {1, k}));
    Tensor grouping = backend::device_empty(*gpu_, DType::I32, {moe::grouping_ints(experts, k)});
    Tensor activated = backend::device_empty(*gpu_, DType::F32, {moe::expert_scratch_rows(k), inter});
    Tensor expert_out = backend::device_empty(*gpu_, DType::F32, {moe::expert_scratch_rows(k), h});
    Tensor out = backend::device_empty(*gpu_, DType::F32, {1, h});
    auto call = [&](const Tensor& x_d) {
      moe::fused_experts_of_ids(*gpu_, x_d, ids_d.data<int32_t>(), weights_d.data<float>(), k, dev, grouping,
                                   activated, expert_out, out);
    };
    // Both tokens' outputs under a setting, and whether the rows-in-flight kernel ran.
    struct Outputs {
      Tensor token[2];
      bool in_flight = false;
    };
    auto run = [&](const char* setting) {
      gpu_->set_kernel_choice("down_rows_in_flight", setting);
      Outputs o;
      for (int t = 0; t < 2; ++t) {
        call(xs_d[t]);
        o.token[t] = backend::to_host(*gpu_, out);
      }
      const std::vector<std::string> kernels = kernels_launched(*gpu_, [&] { call(xs_d[0]); });
      gpu_->set_kernel_choice("down_rows_in_flight", "rule");
      o.in_flight = std::any_of(kernels.begin(), kernels.end(), [](const std::string& name) {
        return name.find("down_and_combine_rows_in_flight") != std::string::npos;
      });
      return o;
    };
    const Outputs row_a_block = run("never"), in_flight = run("always"), by_default = run("rule");
    const std::string what = std::string(fp8 ? "FP8" : "bf16") + ", h " + std::to_string(h) + ", width " +
                             std::to_string(inter) + ", k " + std::to_string(k);
    EXPECT_FALSE(row_a_block.in_flight) << what;
    EXPECT_TRUE(in_flight.in_flight) << what;
    EXPECT_EQ(by_default.in_flight, fp8) << what;
    for (int t = 0; t < 2; ++t) {
      const std::string token = what + ", token " + std::to_string(t);
      const std::size_t bytes = row_a_block.token[t].nbytes();
      EXPECT_EQ(std::memcmp(in_flight.token[t].raw_data(), row_a_block.token[t].raw_data(), bytes), 0) << token;
      EXPECT_EQ(std::memcmp(by_default.token[t].raw_data(), row_a_block.token[t].raw_data(), bytes), 0) << token;
      const float* v = in_flight.token[t].data<float>();
      EXPECT_GT(std::count_if(v, v + h, [](float y) { return y != 0.0f; }), h * 9 / 10) << token;
      if (fp8) {
        const Tensor want = fp8_experts_in_double(xs[t], ids, weights, k, gate8, up8, down8, inter);
        EXPECT_LT(gpu_relative_error(in_flight.token[t], want), 1e-5) << token;
      }
    }
    EXPECT_NE(std::memcmp(in_flight.token[0].raw_data(), in_flight.token[1].raw_data(), in_flight.token[0].nbytes()), 0)
        << what << ": the two tokens' outputs";
  }
}

// The step's device capture buffer: two steps of two MoE layers routed on the device; after each
// step the rows reach the host through the side-stream copy, complete and in [token, layer, k]
// order, and the second step's writes do not disturb the first step's copy.
TEST_F(CudaOps, DeviceCaptureBufferBringsEachStepsRowsToTheHost) {
  const int64_t layers = 2, k = 4, experts = 32;
  moe::DeviceCaptureBuffer buffer(*gpu_, 64, layers, k);
  const moe::DeviceRoutingRule rule{moe::DeviceRoutingRule::Kind::kSoftmaxTopK, static_cast<int32_t>(k), true};
  for (const int64_t tokens : {37, 5}) {
    buffer.begin_step();
    std::vector<std::vector<int32_t>> want(layers);
    for (int64_t l = 0; l < layers; ++l) {
      const Tensor logits = gpu_random({tokens, experts}, static_cast<uint32_t>(40 + 10 * tokens + l));
      const Tensor logits_d = backend::to_device(*gpu_, logits);
      Tensor ids = backend::device_empty(*gpu_, DType::I32, {tokens, k});
      Tensor weights = backend::device_empty(*gpu_, DType::F32, {tokens, k});
      moe::route_on_device(*gpu_, logits_d, rule, nullptr, nullptr, ids.data<int32_t>(), weights.data<float>(),
                           buffer.layer_rows(l));
      const Tensor host_ids = backend::to_host(*gpu_, ids);
      want[l].assign(host_ids.data<int32_t>(), host_ids.data<int32_t>() + tokens * k);
    }
    buffer.end_step(tokens);
    const std::span<const int32_t> rows = buffer.collect();
    ASSERT_EQ(static_cast<int64_t>(rows.size()), tokens * layers * k);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t l = 0; l < layers; ++l) {
        for (int64_t j = 0; j < k; ++j) {
          ASSERT_EQ(rows[(t * layers + l) * k + j], want[l][t * k + j]) << "step of " << tokens << ", token " << t;
        }
      }
    }
  }
}

// Step metadata built once on the host and uploaded in one copy: three consecutive steps (the
// staging buffers alternate) feed the embedding, the rotary and the paged attention kernels,
// whose results equal those from the CPU ops given the same host metadata.
TEST_F(CudaOps, DeviceStepBuilderFeedsTheKernels) {
  models::DeviceStepBuilder builder(*gpu_, 16, 4, 8);
  const Tensor table = gpu_random({40, 64}, 50);
  const Tensor table_d = backend::to_device(*gpu_, table);
  const int64_t block = 4, width = 64;
  Tensor keys = gpu_random({32 * block, width}, 51), values = gpu_random({32 * block, width}, 52);
  Tensor keys_d = backend::to_device(*gpu_, keys), values_d = backend::to_device(*gpu_, values);
  const std::vector<std::vector<int32_t>> tables = {{3, 7, 1}, {}, {30, 2, 9, 10, 11}};
  std::vector<std::span<const int32_t>> spans(tables.begin(), tables.end());
  const ops::Rotary rotary(64, 1e4);
  for (int step = 0; step < 3; ++step) {
    const std::vector<int32_t> ids = {static_cast<int32_t>(step), 39, 12}, positions = {11 - step, 0, 17 + step},
                               seqs = {0, -1, 2};
    const ops::StepView dev = builder.build(ids, positions, seqs, spans);
    ASSERT_EQ(dev.tokens, 3);
    Tensor want = Tensor::empty(DType::F32, {3, 64});
    ops::embedding(cpu_, table, ids, want);
    Tensor got = backend::device_empty(*gpu_, DType::F32, {3, 64});
    ops::cuda::embedding_ids_on_device(*gpu_, table_d, dev.token_ids, 3, got);
    // Rotary over the embedded rows as [3 tokens, 1 head, 64].
    Tensor want_r = want.reshaped({3, 1, 64});
    rotary.apply(cpu_, want_r, positions);
    Tensor got_r = got.reshaped({3, 1, 64});
    ops::cuda::rotary_positions_on_device(*gpu_, rotary, got_r, dev.positions);
    EXPECT_LT(gpu_relative_error(backend::to_host(*gpu_, got), want), 1e-6) << "step " << step;
    // Attention of the rotated rows as queries (1 head of 64) over the pool, via the tables.
    std::vector<ops::KvWindow> windows(3);
    for (int64_t t = 0; t < 3; ++t) {
      if (seqs[t] < 0) continue;
      windows[t] = {{keys.data<float>(), values.data<float>(), width, width, block, tables[seqs[t]]}, 0, positions[t] + 1};
    }
    Tensor want_a = Tensor::empty(DType::F32, {3, 1, 64});
    ops::attention(cpu_, want_r, windows, 1, 0.125f, want_a);
    Tensor got_a = backend::device_empty(*gpu_, DType::F32, {3, 1, 64});
    const ops::KvPool pool{keys_d.data<float>(), values_d.data<float>(), width, width, block, 32};
    ops::cuda::paged_attention(*gpu_, got_r, dev, pool, 1, 0.125f, 0, nullptr, got_a);
    EXPECT_LT(gpu_relative_error(backend::to_host(*gpu_, got_a), want_a), 1e-5) << "step " << step;
  }
}

// A layer's physical experts (4 logical, 2 redundant replicas, GPT-OSS-style biases) stacked
// onto the device: every physical expert's matrices and biases land at its index, bit for bit.
TEST_F(CudaOps, UploadedExpertsAreThePhysicalExpertsStacked) {
  const int64_t h = 24, inter = 10;
  std::vector<moe::SwigluExpertWeights> logical;
  for (uint32_t e = 0; e < 4; ++e) {
    logical.push_back({gpu_random({inter, h}, 60 + e), gpu_random({inter, h}, 70 + e), gpu_random({h, inter}, 80 + e),
                       gpu_random({inter}, 90 + e), gpu_random({inter}, 100 + e), gpu_random({h}, 110 + e)});
  }
  const moe::PhysicalExperts experts(std::move(logical), moe::ExpertPlacement::initial(4, 2));
  const moe::DeviceExperts dev = moe::upload_experts(*gpu_, experts, DType::F32);
  ASSERT_EQ(dev.gate.dim(0), experts.num_physical());
  const Tensor gate = backend::to_host(*gpu_, dev.gate), down = backend::to_host(*gpu_, dev.down);
  const Tensor up_bias = backend::to_host(*gpu_, dev.up_bias);
  for (int32_t p = 0; p < experts.num_physical(); ++p) {
    const moe::SwigluExpertWeights& w = experts.weights(p);
    EXPECT_EQ(std::memcmp(gate.data<float>() + p * inter * h, w.gate.data<float>(), w.gate.nbytes()), 0) << "gate " << p;
    EXPECT_EQ(std::memcmp(down.data<float>() + p * inter * h, w.down.data<float>(), w.down.nbytes()), 0) << "down " << p;
    EXPECT_EQ(std::memcmp(up_bias.data<float>() + p * inter, w.up_bias.data<float>(), w.up_bias.nbytes()), 0)
        << "up bias " << p;
  }
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

// The weight-streaming kernels find an FP8 row's matrix and scale row by 32-bit division
// (ops/cuda/weight_rows.cuh), so a matrix they could not index is refused when it is made.
TEST(CudaWeightMatrices, AnFp8MatrixBeyondTwoToThe31RowsIsRefusedAndOneWithinIsMade) {
  const int64_t too_many = int64_t{1} << 31;
  std::string message;
  try {
    ops::cuda::fp8_matrix(nullptr, nullptr, too_many, 128, too_many, too_many / 128, 1, 0, 128, 128);
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("an FP8 matrix of 2147483648 rows"), std::string::npos) << message;
  const ops::cuda::Fp8Matrix m = ops::cuda::fp8_matrix(nullptr, nullptr, 128 * 768, 2048, 768, 6, 16, 0, 128, 128);
  EXPECT_EQ(m.rows_per_matrix, 768);
  EXPECT_EQ(m.block_rows, 128);
  EXPECT_EQ(m.block_cols_shift, 7);
  // An empty weight (no rows) is made as it was before the check: its kernels never run.
  EXPECT_EQ(ops::cuda::fp8_matrix(nullptr, nullptr, 0, 2048, 0, 0, 16, 0, 128, 128).rows_per_matrix, 0);
}

}  // namespace
}  // namespace r3::test
