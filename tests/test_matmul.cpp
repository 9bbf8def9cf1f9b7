// The matmul kernel (ops/matmul.h) behind every projection: its vectorised variant equals the
// portable definition bit for bit for every weight dtype and shape edge, it is accurate against
// a double-precision loop, and a row's result never depends on the other rows or the threads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>

#include "backend/context.h"
#include "test_support.h"
#include "ops/cpu/dot.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/matmul.h"

namespace r3::ops {
namespace {

// `source` rounded to `dtype` (F32, BF16 or F16), stored in that dtype.
Tensor narrowed(const Tensor& source, DType dtype) {
  if (dtype == DType::F32) return source;
  Tensor t = Tensor::empty(dtype, source.shape());
  auto* out = static_cast<uint16_t*>(t.raw_data());
  for (int64_t i = 0; i < source.numel(); ++i) {
    const float v = source.data<float>()[i];
    out[i] = dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
  }
  return t;
}

std::vector<float> widened(const Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  convert_to_f32(t.raw_data(), t.dtype(), out.size(), out.data());
  return out;
}

using test::float_values;

// The fixed-order dot product and scaled add (ops/cpu/dot.h) that attention runs on, row by row and
// over runs of rows: the dispatched variant equals the portable definition bit for bit at every
// tail length.
TEST(FixedOrderVectors, DispatchedEqualsPortableBitForBit) {
  RecordProperty("kernel", cpu_has_avx512() ? "avx512" : "portable");
  for (int64_t n : {0, 1, 7, 15, 16, 17, 31, 32, 33, 64, 100, 512, 513}) {
    const Tensor a = test::random_normal({n + 1}, 21), b = test::random_normal({n + 1}, 22);
    ASSERT_EQ(std::bit_cast<uint32_t>(dot(a.data<float>(), b.data<float>(), n)),
              std::bit_cast<uint32_t>(dot_portable(a.data<float>(), b.data<float>(), n)))
        << "dot of length " << n;
    std::vector<float> fast(b.data<float>(), b.data<float>() + n + 1), portable = fast;
    add_scaled(0.37f, a.data<float>(), fast.data(), n);
    add_scaled_portable(0.37f, a.data<float>(), portable.data(), n);
    for (std::size_t i = 0; i < fast.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(fast[i]), std::bit_cast<uint32_t>(portable[i]))
          << "add_scaled of length " << n << ", element " << i;
    }
  }
  // Runs of rows as attention reads them: 5 rows of d floats, `stride` apart.
  for (int64_t d : {1, 16, 33, 64, 128}) {
    const int64_t rows = 5, stride = d + 7;
    const Tensor q = test::random_normal({d}, 23), kv = test::random_normal({rows * stride}, 24),
                 p = test::random_normal({rows}, 25);
    std::vector<float> fast(rows), portable(rows);
    dot_rows(q.data<float>(), kv.data<float>(), stride, rows, d, 0.125f, fast.data());
    dot_rows_portable(q.data<float>(), kv.data<float>(), stride, rows, d, 0.125f, portable.data());
    for (std::size_t i = 0; i < fast.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(fast[i]), std::bit_cast<uint32_t>(portable[i])) << "dot_rows d " << d << " row " << i;
    }
    std::vector<float> out_fast(q.data<float>(), q.data<float>() + d), out_portable = out_fast;
    add_scaled_rows(p.data<float>(), kv.data<float>(), stride, rows, d, out_fast.data());
    add_scaled_rows_portable(p.data<float>(), kv.data<float>(), stride, rows, d, out_portable.data());
    for (std::size_t i = 0; i < out_fast.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(out_fast[i]), std::bit_cast<uint32_t>(out_portable[i]))
          << "add_scaled_rows d " << d << " element " << i;
    }
  }
}

class MatmulDtype : public ::testing::TestWithParam<DType> {};

// matmul_rows runs the machine's fastest kernel (AVX-512 where the CPU has it).
TEST_P(MatmulDtype, DispatchedKernelEqualsPortableDefinitionBitForBit) {
  RecordProperty("kernel", matmul_kernel_name());
  const DType dtype = GetParam();
  // K values around the 16-lane width (tails of every length), M and N around the 4x4 tiles.
  for (auto [m, k, n] : {std::tuple{1, 1, 1}, {1, 15, 3}, {2, 16, 5}, {3, 17, 4}, {4, 31, 9}, {5, 33, 16},
                         {7, 100, 17}, {9, 1024, 33}, {1, 512, 70}}) {
    Tensor x = test::random_normal({m, k}, 11), w = narrowed(test::random_normal({n, k}, 12), dtype), b = test::random_normal({n}, 13);
    const WeightMatrix wm = WeightMatrix::of(w);
    for (const float* bias : {static_cast<const float*>(nullptr), static_cast<const float*>(b.data<float>())}) {
      std::vector<float> fast(static_cast<std::size_t>(m * n)), portable(fast.size());
      matmul_rows(x.data<float>(), m, k, wm, 0, n, bias, fast.data(), n);
      matmul_rows_portable(x.data<float>(), m, k, wm, 0, n, bias, portable.data(), n);
      for (std::size_t i = 0; i < fast.size(); ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(fast[i]), std::bit_cast<uint32_t>(portable[i]))
            << "m " << m << " k " << k << " n " << n << " element " << i << (bias ? " with bias" : "");
      }
    }
  }
}

TEST_P(MatmulDtype, LinearMatchesDoubleLoopOverTheStoredWeights) {
  const DType dtype = GetParam();
  backend::Context ctx(2);
  for (auto [m, k, n] : {std::tuple{1, 64, 320}, {19, 64, 8}, {33, 100, 37}, {5, 7, 3}}) {
    Tensor x = test::random_normal({m, k}, 1), w = narrowed(test::random_normal({n, k}, 2), dtype), b = test::random_normal({n}, 3);
    const std::vector<float> wv = widened(w);  // the exact values the kernel multiplies by
    Tensor y = Tensor::empty(DType::F32, {m, n});
    linear(ctx, x, w, &b, y);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double want = b.data<float>()[j];
        for (int p = 0; p < k; ++p) want += double(x.data<float>()[i * k + p]) * wv[static_cast<std::size_t>(j * k + p)];
        ASSERT_NEAR(y.data<float>()[i * n + j], want, 1e-5 * (1 + std::fabs(want))) << i << "," << j;
      }
    }
  }
}

TEST_P(MatmulDtype, RowsDoNotDependOnOtherRowsOrThreads) {
  const DType dtype = GetParam();
  Tensor x = test::random_normal({40, 96}, 4), w = narrowed(test::random_normal({50, 96}, 5), dtype);
  backend::Context two(2), three(3);
  Tensor all = Tensor::empty(DType::F32, {40, 50}), all3 = Tensor::empty(DType::F32, {40, 50});
  linear(two, x, w, nullptr, all);
  linear(three, x, w, nullptr, all3);
  EXPECT_EQ(float_values(all), float_values(all3));
  Tensor one = Tensor::empty(DType::F32, {1, 50});
  for (int64_t r : {0, 17, 38, 39}) {
    linear(two, x.rows(r, r + 1), w, nullptr, one);
    EXPECT_EQ(float_values(one), std::vector<float>(all.data<float>() + r * 50, all.data<float>() + r * 50 + 50)) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MatmulDtype, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

TEST(Matmul, RefusesOtherWeightDtypes) {
  Tensor w = Tensor::empty(DType::I32, {2, 2});
  EXPECT_THROW(WeightMatrix::of(w), Error);
  EXPECT_THROW(WeightMatrix::of(Tensor::empty(DType::F32, {4})), Error);
}

TEST(Embedding, WidensStoredRowsExactly) {
  Tensor table = narrowed(test::random_normal({10, 24}, 7), DType::BF16);
  const std::vector<float> all = widened(table);
  const std::vector<int32_t> ids = {3, 0, 9, 3};
  Tensor out = Tensor::empty(DType::F32, {4, 24});
  backend::Context ctx(1);
  embedding(ctx, table, ids, out);
  for (std::size_t t = 0; t < ids.size(); ++t) {
    for (int d = 0; d < 24; ++d) {
      ASSERT_EQ(out.data<float>()[t * 24 + d], all[static_cast<std::size_t>(ids[t] * 24 + d)]);
    }
  }
  const std::vector<int32_t> bad = {10};
  Tensor one = Tensor::empty(DType::F32, {1, 24});
  EXPECT_THROW(embedding(ctx, table, bad, one), Error);
}

}  // namespace
}  // namespace r3::ops
