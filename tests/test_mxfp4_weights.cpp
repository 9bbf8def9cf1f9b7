// MXFP4 weights as GPT-OSS publishes its experts (e2m1 values two per byte, one e8m0 scale per 32
// values): the matmul kernels read the packed bytes and their scales directly, and compute bit for
// bit what they compute on a float32 matrix holding the dequantized values (e2m1 * 2^(scale - 127),
// one float32 product); a GPT-OSS checkpoint in the published layout runs every MoE path exactly as
// its dequantized float32 twin does; its resident memory stays near the file size; malformed
// MXFP4 checkpoints are refused by name.
//
// The values are checked against this file's own reading of the format (the OCP MX spec and
// transformers' integrations/mxfp4.py), not against r3's tables.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <tuple>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "ops/matmul.h"
#include "reference_checks.h"
#include "test_support.h"

namespace r3 {
namespace {

// e2m1 as the OCP MX spec defines it: bit 3 the sign, bits 2-1 the exponent (bias 1), bit 0 the
// mantissa; exponent 0 is subnormal (m * 0.5).
float mx_spec_e2m1(uint8_t nibble) {
  const int e = (nibble >> 1) & 3, m = nibble & 1;
  const float magnitude = e == 0 ? 0.5f * static_cast<float>(m) : std::ldexp(1.0f + 0.5f * static_cast<float>(m), e - 1);
  return (nibble & 8) != 0 ? -magnitude : magnitude;
}

// A weight as transformers' convert_moe_packed_tensors computes it: lut[nibble] times 2^(scale -
// 127) (torch.ldexp), exact in float32 until it overflows. 255 is e8m0's NaN.
float mx_spec_value(uint8_t nibble, uint8_t scale) {
  if (scale == 255) return std::numeric_limits<float>::quiet_NaN();
  return mx_spec_e2m1(nibble) * std::ldexp(1.0f, scale - 127);
}

// An MXFP4 matrix [rows, cols] and the float32 matrix of its values.
struct MxMatrix {
  Tensor packed;  // F4_E2M1X2 [rows, cols / 2], scales attached
  Tensor wide;    // F32 [rows, cols]
};

MxMatrix mx_from_bytes(const std::vector<uint8_t>& bytes, const std::vector<uint8_t>& scales, int64_t rows,
                       int64_t cols) {
  const int64_t groups = (cols + 31) / 32;
  Tensor packed = Tensor::empty(DType::F4_E2M1X2, {rows, cols / 2});
  Tensor scale_bytes = Tensor::empty(DType::U8, {rows, groups});
  std::copy(bytes.begin(), bytes.end(), static_cast<uint8_t*>(packed.raw_data()));
  std::copy(scales.begin(), scales.end(), scale_bytes.data<uint8_t>());
  Tensor wide = Tensor::empty(DType::F32, {rows, cols});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t byte = bytes[static_cast<std::size_t>(r * cols / 2 + c / 2)];
      const uint8_t nibble = c % 2 == 0 ? byte & 0xF : byte >> 4;  // value 2i: low nibble of byte i
      wide.data<float>()[r * cols + c] = mx_spec_value(nibble, scales[static_cast<std::size_t>(r * groups + c / 32)]);
    }
  }
  return {packed.with_mx_scales(scale_bytes), wide};
}

// Every byte value, scales drawn from [lo, hi].
MxMatrix random_mx(int64_t rows, int64_t cols, uint32_t seed, int lo = 112, int hi = 136) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(static_cast<std::size_t>(rows * cols / 2)), scales(static_cast<std::size_t>(rows * ((cols + 31) / 32)));
  for (auto& b : bytes) b = static_cast<uint8_t>(rng() % 256);
  for (auto& s : scales) s = static_cast<uint8_t>(lo + static_cast<int>(rng() % static_cast<uint32_t>(hi - lo + 1)));
  return mx_from_bytes(bytes, scales, rows, cols);
}

// Rows [first, end) every `step` of a float32 matrix, as a contiguous copy.
Tensor mx_wide_rows(const Tensor& wide, int64_t first, int64_t end, int64_t step) {
  return contiguous_copy(wide.rows(first, end, step));
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << what << ", element " << i;
  }
}

TEST(Mxfp4Format, E2m1AndE8m0DecodeAsPublished) {
  // transformers' FP4_VALUES (integrations/mxfp4.py), indexed by the nibble.
  const std::vector<float> fp4_values = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  for (uint8_t n = 0; n < 16; ++n) {
    EXPECT_EQ(std::bit_cast<uint32_t>(f4_e2m1_to_f32(n)), std::bit_cast<uint32_t>(fp4_values[n])) << int(n);
    EXPECT_EQ(std::bit_cast<uint32_t>(mx_spec_e2m1(n)), std::bit_cast<uint32_t>(fp4_values[n])) << int(n);
    EXPECT_EQ(f4_e2m1_to_f32(static_cast<uint8_t>(n | 0xF0)), fp4_values[n]) << "only the low nibble counts";
  }
  for (int s = 0; s < 255; ++s) {
    EXPECT_EQ(e8m0_to_f32(static_cast<uint8_t>(s)), static_cast<float>(std::ldexp(1.0, s - 127))) << s;
  }
  EXPECT_EQ(e8m0_to_f32(0), 0x1p-127f);  // a float32 subnormal, exact
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  EXPECT_EQ(dtype_size(DType::F4_E2M1X2), 1u);
  EXPECT_THROW(dtype_from_name("F4_E2M1X2"), Error) << "safetensors files never name it: r3 makes it from U8 blocks";
}

// matmul_rows on MXFP4 weights (the dispatched kernel, AVX-512 here when the CPU has it, and the
// portable definition) equals both kernels on the float32 matrix of the values, bit for bit: K
// tails of every kind (partial 16-lane steps and partial 32-value scale blocks), tiles of every
// size, row views from inside the matrix, and strided row views (GPT-OSS's interleaved gate and up).
TEST(Mxfp4Matmul, EqualsTheWidenedFloat32CopyBitForBit) {
  RecordProperty("kernel", ops::matmul_kernel_name());
  for (auto [m, k, n] : {std::tuple{1, 2, 1}, {1, 16, 3}, {2, 18, 5}, {3, 30, 4}, {4, 32, 9}, {5, 34, 16},
                         {7, 64, 17}, {9, 96, 33}, {1, 100, 70}, {6, 290, 130}, {2, 512, 8}, {8, 48, 12}}) {
    const Tensor x = test::random_normal({m, k}, 61), b = test::random_normal({n}, 63);
    const MxMatrix w = random_mx(n, k, 62);
    for (auto [first, step] : {std::pair<int64_t, int64_t>{0, 1}, {n / 3, 1}, {1, 2}, {0, 2}, {0, 3}}) {
      if (first >= n) continue;
      const Tensor view = w.packed.rows(first, n, step);
      const Tensor wide = mx_wide_rows(w.wide, first, n, step);
      const ops::WeightMatrix mx = ops::WeightMatrix::of(view), f32 = ops::WeightMatrix::of(wide);
      const int64_t rows = view.dim(0);
      for (const float* bias : {static_cast<const float*>(nullptr), static_cast<const float*>(b.data<float>())}) {
        std::vector<float> fast(static_cast<std::size_t>(m * rows)), portable(fast.size()), want(fast.size()),
            want_fast(fast.size());
        ops::matmul_rows(x.data<float>(), m, k, mx, 0, rows, bias, fast.data(), rows);
        ops::matmul_rows_portable(x.data<float>(), m, k, mx, 0, rows, bias, portable.data(), rows);
        ops::matmul_rows_portable(x.data<float>(), m, k, f32, 0, rows, bias, want.data(), rows);
        ops::matmul_rows(x.data<float>(), m, k, f32, 0, rows, bias, want_fast.data(), rows);
        const std::string where = "m " + std::to_string(m) + " k " + std::to_string(k) + " n " + std::to_string(n) +
                                  " rows from " + std::to_string(first) + " step " + std::to_string(step);
        expect_same_bits(portable, want, where + ", portable");
        expect_same_bits(fast, want, where + ", " + ops::matmul_kernel_name());
        expect_same_bits(want_fast, want, where + ", float32");
      }
      // Output rows [n0, n1) of a task alone give the same bits as within the whole.
      if (rows > 2) {
        std::vector<float> part(static_cast<std::size_t>(m * (rows - 1))), whole(static_cast<std::size_t>(m * rows));
        ops::matmul_rows(x.data<float>(), m, k, mx, 1, rows, nullptr, part.data(), rows - 1);
        ops::matmul_rows(x.data<float>(), m, k, mx, 0, rows, nullptr, whole.data(), rows);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 1; j < rows; ++j) {
            ASSERT_EQ(std::bit_cast<uint32_t>(part[static_cast<std::size_t>(i * (rows - 1) + j - 1)]),
                      std::bit_cast<uint32_t>(whole[static_cast<std::size_t>(i * rows + j)]));
          }
        }
      }
    }
  }
}

// Every nibble under scales from e8m0's smallest (2^-127, a subnormal) to 2^125, read back one
// column at a time through both kernels; a NaN scale (255) makes its row's outputs NaN in both,
// and scales beyond float32's range give infinite weights, as the float32 copy holds them.
TEST(Mxfp4Matmul, DecodesEveryNibbleAndScale) {
  const int64_t k = 64, n = 8;
  const std::vector<uint8_t> row_scales = {0, 1, 2, 100, 127, 128, 200, 252};
  std::vector<uint8_t> bytes(static_cast<std::size_t>(n * k / 2)), scales;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < k / 2; ++i) bytes[static_cast<std::size_t>(j * k / 2 + i)] = static_cast<uint8_t>((i * 37 + j * 11) % 256);
    scales.push_back(row_scales[static_cast<std::size_t>(j)]);
    scales.push_back(static_cast<uint8_t>(252 - row_scales[static_cast<std::size_t>(j)]));  // the second block
  }
  const MxMatrix w = mx_from_bytes(bytes, scales, n, k);
  for (const float v : test::float_values(w.wide)) ASSERT_TRUE(std::isfinite(v));
  for (int64_t c = 0; c < k; ++c) {
    Tensor x = Tensor::empty(DType::F32, {1, k});
    x.data<float>()[c] = 1.0f;
    std::vector<float> got(n), portable(n), want(n);
    ops::matmul_rows(x.data<float>(), 1, k, ops::WeightMatrix::of(w.packed), 0, n, nullptr, got.data(), n);
    ops::matmul_rows_portable(x.data<float>(), 1, k, ops::WeightMatrix::of(w.packed), 0, n, nullptr, portable.data(), n);
    ops::matmul_rows_portable(x.data<float>(), 1, k, ops::WeightMatrix::of(w.wide), 0, n, nullptr, want.data(), n);
    expect_same_bits(got, want, "column " + std::to_string(c));
    expect_same_bits(portable, want, "column " + std::to_string(c) + ", portable");
    for (int64_t j = 0; j < n; ++j) EXPECT_EQ(got[static_cast<std::size_t>(j)], w.wide.data<float>()[j * k + c]);
  }
  // Beyond float32: 6 * 2^(253 - 127) and 2 * 2^(254 - 127) overflow, as they do in torch.ldexp.
  const uint8_t pattern[8] = {0x71, 0x45, 0x00, 0x8F, 0x21, 0x33, 0x77, 0x12};
  std::vector<uint8_t> big_bytes(32);
  for (std::size_t i = 0; i < big_bytes.size(); ++i) big_bytes[i] = pattern[i % 8];
  const MxMatrix big = mx_from_bytes(big_bytes, {253, 254}, 1, 64);
  EXPECT_EQ(test::float_values(to_f32(big.packed)), test::float_values(big.wide));
  EXPECT_EQ(big.wide.data<float>()[0], 0x1p125f) << "0.5 * 2^126";
  EXPECT_EQ(big.wide.data<float>()[1], INFINITY) << "6 * 2^126";
  EXPECT_EQ(big.wide.data<float>()[6], -INFINITY) << "-6 * 2^126";
  EXPECT_EQ(big.wide.data<float>()[9], 0x1p126f) << "1 * 2^126";
  EXPECT_EQ(big.wide.data<float>()[32 + 1], INFINITY) << "6 * 2^127";
  EXPECT_EQ(big.wide.data<float>()[32 + 9], 0x1p127f) << "1 * 2^127, the largest power of two";
  // A NaN scale: its row's outputs are NaN in both kernels, the other rows' are not (moderate
  // scales: weights near 2^125 would overflow the sums).
  const MxMatrix moderate = random_mx(n, k, 72);
  std::vector<uint8_t> nan_scales(static_cast<const uint8_t*>(moderate.packed.mx_scales()->scales.raw_data()),
                                  static_cast<const uint8_t*>(moderate.packed.mx_scales()->scales.raw_data()) + 2 * n);
  nan_scales[2 * 5 + 1] = 255;
  const MxMatrix with_nan = mx_from_bytes(
      std::vector<uint8_t>(static_cast<const uint8_t*>(moderate.packed.raw_data()),
                           static_cast<const uint8_t*>(moderate.packed.raw_data()) + n * k / 2),
      nan_scales, n, k);
  const Tensor x = test::random_normal({2, k}, 71);
  std::vector<float> got(2 * n), portable(2 * n);
  ops::matmul_rows(x.data<float>(), 2, k, ops::WeightMatrix::of(with_nan.packed), 0, n, nullptr, got.data(), n);
  ops::matmul_rows_portable(x.data<float>(), 2, k, ops::WeightMatrix::of(with_nan.packed), 0, n, nullptr,
                            portable.data(), n);
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(std::isnan(got[i]), i % n == 5) << i;
    EXPECT_EQ(std::isnan(portable[i]), i % n == 5) << i;
  }
}

TEST(Mxfp4Weights, ViewsCopiesAndWideningKeepTheScales) {
  const MxMatrix w = random_mx(10, 96, 81);
  EXPECT_EQ(value_shape(w.packed), Shape({10, 96}));
  EXPECT_EQ(test::float_values(to_f32(w.packed)), test::float_values(w.wide));
  // Every other row (GPT-OSS's up rows): a strided view, its scales sliced alike.
  const Tensor odd = w.packed.rows(1, 10, 2);
  EXPECT_FALSE(odd.is_contiguous());
  EXPECT_EQ(value_shape(odd), Shape({5, 96}));
  std::vector<float> row(96);
  row_to_f32(odd, 3, row.data());  // row 7
  EXPECT_EQ(row, std::vector<float>(w.wide.data<float>() + 7 * 96, w.wide.data<float>() + 8 * 96));
  EXPECT_EQ(test::float_values(to_f32(odd)), test::float_values(mx_wide_rows(w.wide, 1, 10, 2)));
  // A replica's copy: contiguous, its own bytes, the same values.
  const Tensor copy = contiguous_copy(odd);
  EXPECT_TRUE(copy.is_contiguous());
  EXPECT_NE(copy.raw_data(), odd.raw_data());
  EXPECT_EQ(test::float_values(to_f32(copy)), test::float_values(to_f32(odd)));
  EXPECT_EQ(test::float_values(to_f32(copy.rows(2, 5, 2))), test::float_values(mx_wide_rows(w.wide, 5, 10, 4)));
  // What is refused.
  EXPECT_THROW(ops::WeightMatrix::of(Tensor::empty(DType::F4_E2M1X2, {4, 16})), Error) << "values without scales";
  EXPECT_THROW((void)w.packed.reshaped({20, 24}), Error);
  EXPECT_NE(test::error_of([&] { (void)w.packed.rows(0, 10).with_mx_scales(Tensor::empty(DType::U8, {10, 2})); })
                .find("do not cover a [10, 96] matrix in blocks of 32 values (expected U8 [10, 3])"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { (void)Tensor::empty(DType::F4_E2M1X2, {10, 48}).with_mx_scales(Tensor::empty(DType::F32, {10, 3})); })
                .find("MXFP4 scales F32"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { (void)test::random_normal({2, 2}, 1).with_mx_scales(Tensor::empty(DType::U8, {2, 1})); })
                .find("F4_E2M1X2"),
            std::string::npos);
  EXPECT_THROW(convert_to_f32(w.packed.raw_data(), DType::F4_E2M1X2, 4, row.data()), Error) << "values need scales";
  BlockScales fp8_scales;
  fp8_scales.scales = Tensor::from(std::vector<float>{1, 1}, {2, 1});
  fp8_scales.block_rows = 2;
  fp8_scales.block_cols = 4;
  const Tensor fp8 = Tensor::empty(DType::F8_E4M3, {4, 4}).with_block_scales(fp8_scales);
  EXPECT_NE(test::error_of([&] { (void)fp8.rows(0, 4, 2); }).find("cannot be viewed every 2 rows"), std::string::npos);
}

// ---- GPT-OSS checkpoints in the published MXFP4 layout ------------------------------------------

// One row of values quantized the way tools/make_reference.py writes MXFP4 (and OpenAI's
// quantizer, triton's downcast_to_mxfp with its default rounding up of the scale): per 32
// values, the smallest power of two 2^e with amax <= 6 * 2^e (e = 0 for an all-zero block),
// stored as e + 127; each value / 2^e rounded to the nearest e2m1, ties to the even code.
void mx_quantize_row(const float* v, int64_t cols, uint8_t* bytes, uint8_t* scales) {
  static constexpr float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int64_t g = 0; g * 32 < cols; ++g) {
    float amax = 0;
    for (int64_t c = g * 32; c < std::min(cols, (g + 1) * 32); ++c) amax = std::max(amax, std::fabs(v[c]));
    int e = 0;
    if (amax > 0) {
      int p = 0;
      const float mant = std::frexp(amax, &p);  // amax = mant * 2^p, mant in [0.5, 1); 6 * 2^e = 0.75 * 2^(e + 3)
      e = mant <= 0.75f ? p - 3 : p - 2;
    }
    scales[g] = static_cast<uint8_t>(e + 127);
    for (int64_t c = g * 32; c < std::min(cols, (g + 1) * 32); ++c) {
      const float a = std::fabs(std::ldexp(v[c], -e));
      int best = 0;
      for (int i = 1; i < 8; ++i) {
        const float d = std::fabs(a - kGrid[i]), best_d = std::fabs(a - kGrid[best]);
        if (d < best_d || (d == best_d && i % 2 == 0)) best = i;
      }
      const auto code = static_cast<uint8_t>(best | (std::signbit(v[c]) ? 8 : 0));
      bytes[c / 2] = static_cast<uint8_t>(c % 2 == 0 ? (bytes[c / 2] & 0xF0) | code : (bytes[c / 2] & 0x0F) | (code << 4));
    }
  }
}

// A fused GPT-OSS expert stack as transformers stores it unquantized, [E, in, out], written as
// published: blocks [E, out, in / 32, 16] and scales [E, out, in / 32] (output-major), and the
// dequantized values in the unquantized layout, for the float32 twin.
struct MxStack {
  Tensor blocks, scales, dequantized;
};

MxStack mx_quantize_stack(const Tensor& stored) {
  const int64_t experts = stored.dim(0), in = stored.dim(1), out = stored.dim(2), groups = in / 32;
  MxStack q{Tensor::empty(DType::U8, {experts, out, groups, 16}), Tensor::empty(DType::U8, {experts, out, groups}),
            Tensor::empty(DType::F32, {experts, in, out})};
  const Tensor f = to_f32(stored.reshaped({experts * in, out}));
  std::vector<float> row(static_cast<std::size_t>(in));
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) row[static_cast<std::size_t>(i)] = f.data<float>()[(e * in + i) * out + o];
      uint8_t* bytes = q.blocks.data<uint8_t>() + (e * out + o) * in / 2;
      uint8_t* scales = q.scales.data<uint8_t>() + (e * out + o) * groups;
      mx_quantize_row(row.data(), in, bytes, scales);
      for (int64_t i = 0; i < in; ++i) {
        const uint8_t nibble = i % 2 == 0 ? bytes[i / 2] & 0xF : bytes[i / 2] >> 4;
        const float value = mx_spec_value(nibble, scales[i / 32]);
        q.dequantized.data<float>()[(e * in + i) * out + o] = value;
        // Rounded to the nearest e2m1: within half the widest step of the grid (2 at 4..6), times
        // the block's scale, of the original.
        EXPECT_LE(std::fabs(value - row[static_cast<std::size_t>(i)]), std::ldexp(1.0f, scales[i / 32] - 127));
      }
    }
  }
  return q;
}

bool mx_is_expert_stack(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with(".mlp.experts.gate_up_proj") || ends_with(".mlp.experts.down_proj");
}

// The published quantization_config of openai/gpt-oss-20b and -120b.
nlohmann::json mx_published_config() {
  return {{"quant_method", "mxfp4"},
          {"modules_to_not_convert",
           {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}};
}

// The gpt_oss fixture written twice: `mx` as OpenAI publishes GPT-OSS (experts as blocks and
// scales, quantization_config), `wide` as float32 holding the dequantized values.
void write_mx_gpt_oss(const std::string& mx, const std::string& wide) {
  const std::string src = test::family_dir("gpt_oss");
  auto file = SafetensorsFile::open(src + "/model.safetensors");
  std::vector<NamedTensor> mx_tensors, wide_tensors;
  for (const auto& [name, entry] : file->entries()) {
    const Tensor stored = file->view(name);
    if (!mx_is_expert_stack(name)) {
      mx_tensors.push_back({name, stored});
      wide_tensors.push_back({name, stored});
      continue;
    }
    const MxStack q = mx_quantize_stack(stored);
    mx_tensors.push_back({name + "_blocks", q.blocks});
    mx_tensors.push_back({name + "_scales", q.scales});
    wide_tensors.push_back({name, q.dequantized});
  }
  nlohmann::json config = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  for (const std::string& dir : {mx, wide}) std::filesystem::create_directories(dir);
  std::ofstream(wide + "/config.json") << config.dump(1);
  config["quantization_config"] = mx_published_config();
  std::ofstream(mx + "/config.json") << config.dump(1);
  write_safetensors(mx + "/model.safetensors", mx_tensors);
  write_safetensors(wide + "/model.safetensors", wide_tensors);
}

// r3 on the MXFP4 checkpoint equals r3 on its dequantized float32 twin, bit for bit, on every MoE
// path with and without EPLB replicas (copies of the strided MXFP4 experts, re-placed every two
// steps): forward logits and routed experts (prefill: every tile shape), and greedy generation
// with its routing (decode: one row at a time).
TEST(Mxfp4Checkpoint, RunsExactlyAsItsDequantizedFloat32Twin) {
  const test::TempDir dir;
  write_mx_gpt_oss(dir.path("mx"), dir.path("wide"));
  {
    auto loaded = models::load_model(dir.path("mx"));  // the experts really are MXFP4
    const Checkpoint ckpt = Checkpoint::open(dir.path("mx"));
    EXPECT_TRUE(ckpt.contains("model.layers.1.mlp.experts.down_proj_blocks"));
    EXPECT_FALSE(ckpt.contains("model.layers.1.mlp.experts.down_proj"));
  }
  const test::Reference ref = test::load_reference("gpt_oss", 0);
  const std::string ids = test::join(test::forward_ids(ref)), prompt = test::join(test::prompt_ids(ref));
  for (const std::string path : {"modular", "monolithic", "mega"}) {
    for (const std::string eplb : {"", " --eplb-redundant-experts 3 --eplb-rebalance-every 2"}) {
      std::string dumps[2], generated[2];
      for (int i = 0; i < 2; ++i) {
        const std::string model = dir.path(i == 0 ? "mx" : "wide");
        dumps[i] = dir.path(path + std::to_string(eplb.size()) + "_" + std::to_string(i) + ".safetensors");
        const auto fwd = test::run_r3("forward -q --model " + model + " --ids " + ids + " --moe-path " + path + eplb +
                                      " --dump " + dumps[i]);
        ASSERT_EQ(fwd.exit_code, 0) << fwd.err;
        EXPECT_EQ(fwd.err, "") << "every tensor, the scales too, is used, with no warning";
        const auto gen = test::run_r3("generate -q --json --ignore-eos --max-new-tokens 6 --model " + model +
                                      " --ids " + prompt + " --moe-path " + path + eplb);
        ASSERT_EQ(gen.exit_code, 0) << gen.err;
        generated[i] = gen.out;
      }
      const std::string what = path + eplb;
      auto a = SafetensorsFile::open(dumps[0]), b = SafetensorsFile::open(dumps[1]);
      const std::vector<double> la = test::read_as_f64(*a, "logits"), lb = test::read_as_f64(*b, "logits");
      ASSERT_EQ(la.size(), lb.size());
      for (std::size_t i = 0; i < la.size(); ++i) ASSERT_EQ(la[i], lb[i]) << what << ": logit " << i;
      EXPECT_EQ(test::read_as_i64(*a, "topk_ids"), test::read_as_i64(*b, "topk_ids")) << what;
      EXPECT_EQ(test::read_as_f64(*a, "topk_weights"), test::read_as_f64(*b, "topk_weights")) << what;
      EXPECT_EQ(generated[0], generated[1]) << what;
    }
  }
  // The quantized model stays near the float32 original: a loose check of the quantizer (e2m1
  // keeps one mantissa bit, so a weight moves by up to a third of its block's largest value; on
  // this tiny random model the logits move by about 46% of their largest value, as some routing
  // choices flip). The quantizer's own bound is checked in mx_quantize_stack.
  auto dump = SafetensorsFile::open(dir.path("monolithic0_0.safetensors"));
  const std::vector<double> logits = test::read_as_f64(*dump, "logits");
  double max_err = 0, max_ref = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    max_err = std::max(max_err, std::fabs(logits[i] - ref.logits[i]));
    max_ref = std::max(max_ref, std::fabs(ref.logits[i]));
  }
  std::printf("MXFP4 gpt_oss: max |logit - float32 reference| / max |reference| = %.3f\n", max_err / max_ref);
  EXPECT_LE(max_err / max_ref, 0.75) << "max |mxfp4 - float32 reference| = " << max_err;
}

// Resident memory of an MXFP4 GPT-OSS checkpoint stays near its file size: the packed experts and
// their scales are views of the mapping (the unquantized GPT-OSS path widens its experts into
// float32 copies; done for MXFP4, that would be 8 times the blocks' bytes). ~270 MB, so the
// loader's bookkeeping is small beside it; file-backed and private pages are read apart, before
// and after a forward pass.
TEST(Mxfp4Checkpoint, ResidentMemoryStaysNearTheFileSize) {
  constexpr int64_t kMxHidden = 1024, kMxLayers = 5, kMxExperts = 32, kMxWidth = 1024, kMxVocab = 512;
  const test::TempDir dir;
  const std::string model = dir.path("mx");
  std::filesystem::create_directories(model);
  const nlohmann::json config = {
      {"architectures", {"GptOssForCausalLM"}}, {"model_type", "gpt_oss"}, {"hidden_size", kMxHidden},
      {"num_hidden_layers", kMxLayers}, {"num_attention_heads", 8}, {"num_key_value_heads", 2}, {"head_dim", 64},
      {"vocab_size", kMxVocab}, {"intermediate_size", kMxWidth}, {"num_local_experts", kMxExperts},
      {"num_experts_per_tok", 4}, {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 512}, {"sliding_window", 16},
      {"attention_bias", true}, {"layer_types", std::vector<std::string>(kMxLayers, "full_attention")},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 150000.0}}},
      {"quantization_config", mx_published_config()}};
  std::ofstream(model + "/config.json") << config.dump(1);
  {
    std::vector<NamedTensor> tensors;
    uint64_t state = 777;
    auto next = [&] { return (state = state * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; };
    auto add = [&](const std::string& name, Shape shape) {
      tensors.push_back({name, test::random_normal(shape, static_cast<uint32_t>(next()))});
    };
    // Packed values drawn as random bytes (quantizing 500 M normals would only slow the test down),
    // scales near 2^-5.
    auto add_mx = [&](const std::string& name, int64_t rows, int64_t cols) {
      Tensor blocks = Tensor::empty(DType::U8, {kMxExperts, rows, cols / 32, 16});
      Tensor scales = Tensor::empty(DType::U8, {kMxExperts, rows, cols / 32});
      for (int64_t i = 0; i < blocks.numel(); ++i) blocks.data<uint8_t>()[i] = static_cast<uint8_t>(next());
      for (int64_t i = 0; i < scales.numel(); ++i) scales.data<uint8_t>()[i] = static_cast<uint8_t>(120 + next() % 3);
      tensors.push_back({name + "_blocks", blocks});
      tensors.push_back({name + "_scales", scales});
    };
    add("model.embed_tokens.weight", {kMxVocab, kMxHidden});
    add("lm_head.weight", {kMxVocab, kMxHidden});
    add("model.norm.weight", {kMxHidden});
    for (int64_t l = 0; l < kMxLayers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {kMxHidden});
      add(p + "post_attention_layernorm.weight", {kMxHidden});
      for (const auto& [proj, rows] : {std::pair<std::string, int64_t>{"q_proj", 512}, {"k_proj", 128}, {"v_proj", 128}}) {
        add(p + "self_attn." + proj + ".weight", {rows, kMxHidden});
        add(p + "self_attn." + proj + ".bias", {rows});
      }
      add(p + "self_attn.o_proj.weight", {kMxHidden, 512});
      add(p + "self_attn.o_proj.bias", {kMxHidden});
      add(p + "self_attn.sinks", {8});
      add(p + "mlp.router.weight", {kMxExperts, kMxHidden});
      add(p + "mlp.router.bias", {kMxExperts});
      add_mx(p + "mlp.experts.gate_up_proj", 2 * kMxWidth, kMxHidden);
      add(p + "mlp.experts.gate_up_proj_bias", {kMxExperts, 2 * kMxWidth});
      add_mx(p + "mlp.experts.down_proj", kMxHidden, kMxWidth);
      add(p + "mlp.experts.down_proj_bias", {kMxExperts, kMxHidden});
    }
    write_safetensors(model + "/model.safetensors", tensors);
  }
  test::expect_resident_near_file_size(model);
}

TEST(Mxfp4Checkpoint, QuantizationConfigAndUnconvertedModules) {
  const auto quant = [](const std::string& body) {
    return WeightQuantization::from_config(HfConfig::parse("{\"quantization_config\": " + body + "}"));
  };
  const WeightQuantization q = quant(mx_published_config().dump());
  EXPECT_TRUE(q.mxfp4());
  EXPECT_FALSE(q.fp8());
  // The published globs: `*` runs over any characters, whole module names only.
  EXPECT_EQ(q.excluded_by("model.layers.17.self_attn.q_proj.weight"), "model.layers.*.self_attn");
  EXPECT_EQ(q.excluded_by("model.layers.3.mlp.router.weight"), "model.layers.*.mlp.router");
  EXPECT_EQ(q.excluded_by("model.embed_tokens.weight"), "model.embed_tokens");
  EXPECT_EQ(q.excluded_by("lm_head.weight"), "lm_head");
  EXPECT_EQ(q.excluded_by("model.layers.3.mlp.experts.gate_up_proj"), "");
  EXPECT_EQ(q.excluded_by("model.layers.3.self_attn_extra.weight"), "");
  const WeightQuantization some = quant(R"({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.1*"]})");
  EXPECT_EQ(some.excluded_by("model.layers.1.mlp.experts.down_proj"), "model.layers.1*");
  EXPECT_EQ(some.excluded_by("model.layers.12.mlp.experts.down_proj"), "model.layers.1*");
  EXPECT_EQ(some.excluded_by("model.layers.2.mlp.experts.down_proj"), "");
  EXPECT_NE(test::error_of([&] { quant(R"({"quant_method": "mxfp8"})"); })
                .find("quant_method 'mxfp8' is not supported (r3 runs block-scaled \"fp8\" and GPT-OSS's \"mxfp4\""),
            std::string::npos);
}

// The refusals through the loader, on the quantized fixture with one thing broken; each a single
// line naming the tensor or key (the CLI's exact messages are in tests/malformed, quant-mxfp4-*).
TEST(Mxfp4Checkpoint, LoaderRefusesBrokenTensorsByName) {
  const test::TempDir dir;
  write_mx_gpt_oss(dir.path("mx"), dir.path("wide"));
  const std::string stack = "model.layers.1.mlp.experts.down_proj";
  const std::string blocks = stack + "_blocks", scales = stack + "_scales";
  auto rewrite = [&](const std::string& name, const std::function<void(std::vector<NamedTensor>&)>& edit,
                     const std::function<void(nlohmann::json&)>& config_edit = {}) {
    const std::string out = dir.path(name);
    std::filesystem::create_directories(out);
    auto file = SafetensorsFile::open(dir.path("mx") + "/model.safetensors");
    std::vector<NamedTensor> tensors;
    for (const auto& [n, e] : file->entries()) tensors.push_back({n, file->view(n)});
    edit(tensors);
    write_safetensors(out + "/model.safetensors", tensors);
    nlohmann::json config = nlohmann::json::parse(std::ifstream(dir.path("mx") + "/config.json"));
    if (config_edit) config_edit(config);
    std::ofstream(out + "/config.json") << config.dump(1);
    const std::string err = test::error_of([&] { models::load_model(out); });
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
    return err;
  };
  auto drop = [&](const std::string& what) {
    return [what](std::vector<NamedTensor>& t) { std::erase_if(t, [&](const NamedTensor& x) { return x.name == what; }); };
  };
  auto replace = [&](const std::string& what, Tensor with) {
    return [what, with](std::vector<NamedTensor>& t) {
      for (auto& x : t) {
        if (x.name == what) x.tensor = with;
      }
    };
  };
  auto at = [&](const std::string& name) { return " in " + dir.path(name) + "/model.safetensors"; };
  std::string err = rewrite("missing_scales", drop(scales));
  EXPECT_NE(err.find("MXFP4 blocks '" + blocks + "' have no scales '" + scales +
                     "' in the checkpoint (expected U8 [8, 64, 1]: one e8m0 exponent per 32 values)"),
            std::string::npos)
      << err;
  err = rewrite("scale_shape", replace(scales, Tensor::empty(DType::U8, {8, 64, 2})));
  EXPECT_NE(err.find("MXFP4 scales '" + scales + "'" + at("scale_shape") +
                     " have shape [8, 64, 2], expected [8, 64, 1] (one per 32 values of blocks [8, 64, 1, 16])"),
            std::string::npos)
      << err;
  err = rewrite("scale_dtype", replace(scales, Tensor::empty(DType::F32, {8, 64, 1})));
  EXPECT_NE(err.find("MXFP4 scales '" + scales + "'" + at("scale_dtype") + " have dtype F32, expected U8 (e8m0 exponents)"),
            std::string::npos)
      << err;
  err = rewrite("block_shape", replace(blocks, Tensor::empty(DType::U8, {8, 64, 2, 8})));
  EXPECT_NE(err.find("tensor '" + blocks + "'" + at("block_shape") + " has shape [8, 64, 2, 8], expected [8, 64, 1, 16]"),
            std::string::npos)
      << err;
  err = rewrite("block_dtype", replace(blocks, Tensor::empty(DType::U16, {8, 64, 1, 16})));
  EXPECT_NE(err.find("MXFP4 blocks '" + blocks + "'" + at("block_dtype") +
                     " have dtype U16, expected U8 (two e2m1 values per byte)"),
            std::string::npos)
      << err;
  {
    auto file = SafetensorsFile::open(dir.path("mx") + "/model.safetensors");
    Tensor nan = contiguous_copy(file->view(scales));
    nan.data<uint8_t>()[(5 * 64 + 17) * 1 + 0] = 255;
    err = rewrite("nan_scale", replace(scales, nan));
  }
  EXPECT_NE(err.find("MXFP4 scales '" + scales + "'" + at("nan_scale") +
                     " hold 255 (e8m0's NaN) at [5, 17, 0]: those 32 weights would be NaN"),
            std::string::npos)
      << err;
  err = rewrite("no_config", [](auto&) {}, [](nlohmann::json& c) { c.erase("quantization_config"); });
  EXPECT_NE(err.find("tensor 'model.layers.0.mlp.experts.gate_up_proj_blocks'" + at("no_config") +
                     " holds MXFP4 blocks, but " + dir.path("no_config") +
                     "/config.json has no quantization_config (quant_method \"mxfp4\")"),
            std::string::npos)
      << err;
  err = rewrite("fp8_config", [](auto&) {}, [](nlohmann::json& c) {
    c["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {16, 16}}};
  });
  EXPECT_NE(err.find("holds MXFP4 blocks, but " + dir.path("fp8_config") +
                     "/config.json's quantization_config is quant_method \"fp8\", not \"mxfp4\""),
            std::string::npos)
      << err;
  err = rewrite("excluded", [](auto&) {}, [](nlohmann::json& c) {
    c["quantization_config"]["modules_to_not_convert"].push_back("model.layers.1.mlp");
  });
  EXPECT_NE(err.find("tensor 'model.layers.1.mlp.experts.gate_up_proj_blocks'" + at("excluded") +
                     " holds MXFP4 blocks, but " + dir.path("excluded") +
                     "/config.json lists 'model.layers.1.mlp' in quantization_config.modules_to_not_convert"),
            std::string::npos)
      << err;
  // The float32 twin's plain experts under an mxfp4 config: the blocks transformers expects are missing.
  err = rewrite("plain", [&](std::vector<NamedTensor>& t) {
    auto twin = SafetensorsFile::open(dir.path("wide") + "/model.safetensors");
    t.clear();
    for (const auto& [n, e] : twin->entries()) t.push_back({n, contiguous_copy(twin->view(n))});
  });
  EXPECT_NE(err.find("is missing tensor 'model.layers.0.mlp.experts.gate_up_proj_blocks' (expected shape [8, 64, 2, 16])"),
            std::string::npos)
      << err;
  // ... while a config that leaves the experts unconverted loads them as they are.
  EXPECT_EQ(rewrite("plain_excluded", [&](std::vector<NamedTensor>& t) {
              auto twin = SafetensorsFile::open(dir.path("wide") + "/model.safetensors");
              t.clear();
              for (const auto& [n, e] : twin->entries()) t.push_back({n, contiguous_copy(twin->view(n))});
            }, [](nlohmann::json& c) { c["quantization_config"]["modules_to_not_convert"].push_back("model.layers.*.mlp.experts"); }),
            "");
  err = rewrite("width", [](auto&) {}, [](nlohmann::json& c) { c["intermediate_size"] = 16; });
  EXPECT_NE(err.find(dir.path("width") + "/config.json: MXFP4 experts need 'intermediate_size' to be a multiple of 32 "
                                         "(one e8m0 scale per 32 values), got 16"),
            std::string::npos)
      << err;
  // An mxfp4 config on a family without GPT-OSS's experts.
  const std::string qwen = test::copy_model_with_config("qwen3_moe", dir, "qwen", "quantization_config",
                                                        mx_published_config().dump());
  err = test::error_of([&] { models::load_model(qwen); });
  EXPECT_NE(err.find(qwen + "/config.json: quantization_config.quant_method 'mxfp4' stores GPT-OSS's fused experts "
                            "(gate_up_proj_blocks, down_proj_blocks); qwen3_moe has no such experts"),
            std::string::npos)
      << err;
}

}  // namespace
}  // namespace r3
