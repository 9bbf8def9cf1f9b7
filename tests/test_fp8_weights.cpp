// FP8 (e4m3) block-scaled weights as published (DeepSeek-V3, Kimi K2, Qwen3 FP8): the matmul
// kernels read the fp8 bytes and their block scales directly, and compute bit for bit what they
// compute on a float32 matrix holding the dequantized values (fp8 * scale, rounded once); a model
// quantized that way runs every MoE path exactly as its dequantized float32 checkpoint does; its
// resident memory stays near the file size; malformed quantized checkpoints are refused by name.
#include <gtest/gtest.h>

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
#include "ops/embedding.h"
#include "ops/linear.h"
#include "ops/matmul.h"
#include "reference_checks.h"
#include "test_support.h"

namespace r3 {
namespace {

// A weight quantized the way published FP8 checkpoints are: per block, scale = amax / 448 (1 for
// an all-zero block) stored in `scale_dtype`, fp8 = e4m3(w / scale).
struct Fp8Weight {
  Tensor fp8;         // F8_E4M3 [rows, cols]
  Tensor scale_inv;   // [ceil(rows / br), ceil(cols / bc)] in the scale dtype
  Tensor dequantized; // F32: decode(fp8) * scale, rounded once
};

Fp8Weight quantize_fp8_block(const Tensor& w, int64_t br, int64_t bc, DType scale_dtype) {
  const int64_t rows = w.dim(0), cols = w.dim(1);
  const int64_t gr = (rows + br - 1) / br, gc = (cols + bc - 1) / bc;
  Fp8Weight q{Tensor::empty(DType::F8_E4M3, {rows, cols}), Tensor::empty(scale_dtype, {gr, gc}),
              Tensor::empty(DType::F32, {rows, cols})};
  const float* src = w.data<float>();
  auto* bytes = static_cast<uint8_t*>(q.fp8.raw_data());
  for (int64_t bi = 0; bi < gr; ++bi) {
    for (int64_t bj = 0; bj < gc; ++bj) {
      float amax = 0;
      for (int64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r) {
        for (int64_t c = bj * bc; c < std::min(cols, (bj + 1) * bc); ++c) amax = std::max(amax, std::fabs(src[r * cols + c]));
      }
      float scale = amax > 0 ? amax / 448.0f : 1.0f;
      if (scale_dtype == DType::BF16) {
        const uint16_t b = f32_to_bf16(scale);
        static_cast<uint16_t*>(q.scale_inv.raw_data())[bi * gc + bj] = b;
        scale = bf16_to_f32(b);
      } else {
        q.scale_inv.data<float>()[bi * gc + bj] = scale;
      }
      for (int64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r) {
        for (int64_t c = bj * bc; c < std::min(cols, (bj + 1) * bc); ++c) {
          const float v = std::clamp(src[r * cols + c] / scale, -448.0f, 448.0f);
          bytes[r * cols + c] = f32_to_f8_e4m3(v);
          q.dequantized.data<float>()[r * cols + c] = f8_e4m3_to_f32(bytes[r * cols + c]) * scale;
        }
      }
    }
  }
  return q;
}

// The FP8 weight as the loader hands it to the kernels: fp8 bytes with F32 block scales attached.
Tensor attached(const Fp8Weight& q, int64_t br, int64_t bc) {
  BlockScales s;
  s.scales = to_f32(q.scale_inv);
  s.block_rows = br;
  s.block_cols = bc;
  return q.fp8.with_block_scales(std::move(s));
}

// matmul_rows on FP8 weights (the dispatched kernel, AVX-512 here when the CPU has it, and the
// portable definition) equals both kernels on the widened float32 copy, bit for bit: K tails of
// every kind, tiles of every size, partial blocks in both directions, row views that start inside
// a block, block widths the vector kernel takes (multiples of 16) and those it leaves to the
// portable one.
TEST(Fp8Matmul, EqualsTheWidenedFloat32CopyBitForBit) {
  RecordProperty("kernel", ops::matmul_kernel_name());
  for (auto [br, bc] : {std::pair<int64_t, int64_t>{16, 16}, {128, 128}, {3, 32}, {16, 48}, {8, 24}, {1, 1}}) {
    for (auto [m, k, n] : {std::tuple{1, 1, 1}, {1, 15, 3}, {2, 16, 5}, {3, 17, 4}, {4, 31, 9}, {5, 33, 16},
                           {7, 100, 17}, {9, 300, 33}, {1, 512, 70}, {6, 129, 130}}) {
      const Tensor x = test::random_normal({m, k}, 31), b = test::random_normal({n}, 33);
      const Fp8Weight q = quantize_fp8_block(test::random_normal({n, k}, 32), br, bc, DType::F32);
      const Tensor w = attached(q, br, bc);
      for (int64_t first : {int64_t{0}, static_cast<int64_t>(n / 3)}) {  // a row view (MLA splits kv_a_proj by rows)
        const ops::WeightMatrix fp8 = ops::WeightMatrix::of(w.rows(first, n));
        const ops::WeightMatrix wide = ops::WeightMatrix::of(q.dequantized.rows(first, n));
        const int64_t rows = n - first;
        for (const float* bias : {static_cast<const float*>(nullptr), static_cast<const float*>(b.data<float>())}) {
          std::vector<float> fast(static_cast<std::size_t>(m * rows)), portable(fast.size()), want(fast.size()),
              want_fast(fast.size());
          ops::matmul_rows(x.data<float>(), m, k, fp8, 0, rows, bias, fast.data(), rows);
          ops::matmul_rows_portable(x.data<float>(), m, k, fp8, 0, rows, bias, portable.data(), rows);
          ops::matmul_rows_portable(x.data<float>(), m, k, wide, 0, rows, bias, want.data(), rows);
          ops::matmul_rows(x.data<float>(), m, k, wide, 0, rows, bias, want_fast.data(), rows);
          for (std::size_t i = 0; i < fast.size(); ++i) {
            const auto where = ::testing::Message() << "block [" << br << ", " << bc << "] m " << m << " k " << k
                                                    << " n " << n << " from row " << first << " element " << i;
            ASSERT_EQ(std::bit_cast<uint32_t>(portable[i]), std::bit_cast<uint32_t>(want[i])) << where;
            ASSERT_EQ(std::bit_cast<uint32_t>(fast[i]), std::bit_cast<uint32_t>(want[i])) << where;
            ASSERT_EQ(std::bit_cast<uint32_t>(want_fast[i]), std::bit_cast<uint32_t>(want[i])) << where;
          }
        }
      }
    }
  }
}

// Every finite e4m3 code (subnormals, +-448, negative zero) through both kernels, each row with
// its own scale, read back one column at a time; and a NaN code makes its outputs NaN in both.
TEST(Fp8Matmul, DecodesEveryCodeLikeTheTable) {
  const int64_t k = 256, n = 4;
  Tensor fp8 = Tensor::empty(DType::F8_E4M3, {n, k});
  Tensor wide = Tensor::empty(DType::F32, {n, k});
  const std::vector<float> scales = {1.0f, 0.0078125f, 3.3e-5f, -0.75f};  // one block per row
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t c = 0; c < k; ++c) {
      auto code = static_cast<uint8_t>((c * 7 + j * 13) % 256);
      if ((code & 0x7F) == 0x7F) code = static_cast<uint8_t>(code - 1);  // +-448 instead of NaN
      static_cast<uint8_t*>(fp8.raw_data())[j * k + c] = code;
      wide.data<float>()[j * k + c] = f8_e4m3_to_f32(code) * scales[static_cast<std::size_t>(j)];
    }
  }
  BlockScales s;
  s.scales = Tensor::from(scales, {n, 1});
  s.block_rows = 1;
  s.block_cols = 256;
  const Tensor w = fp8.with_block_scales(s);
  ASSERT_TRUE(w.block_scales()->plain);  // the vector kernel's short decode
  for (int64_t c = 0; c < k; ++c) {
    Tensor x = Tensor::empty(DType::F32, {1, k});
    x.data<float>()[c] = 1.0f;
    std::vector<float> got(n), want(n), portable(n);
    ops::matmul_rows(x.data<float>(), 1, k, ops::WeightMatrix::of(w), 0, n, nullptr, got.data(), n);
    ops::matmul_rows_portable(x.data<float>(), 1, k, ops::WeightMatrix::of(w), 0, n, nullptr, portable.data(), n);
    ops::matmul_rows_portable(x.data<float>(), 1, k, ops::WeightMatrix::of(wide), 0, n, nullptr, want.data(), n);
    for (std::size_t j = 0; j < static_cast<std::size_t>(n); ++j) {
      ASSERT_EQ(std::bit_cast<uint32_t>(got[j]), std::bit_cast<uint32_t>(want[j])) << "column " << c << " row " << j;
      ASSERT_EQ(std::bit_cast<uint32_t>(portable[j]), std::bit_cast<uint32_t>(want[j])) << "column " << c;
    }
  }
  for (const uint8_t nan : {uint8_t{0x7F}, uint8_t{0xFF}}) {
    static_cast<uint8_t*>(fp8.raw_data())[2 * k + 100] = nan;
    const Tensor with_nan = fp8.with_block_scales(s);  // attaching looks at the values once
    ASSERT_FALSE(with_nan.block_scales()->plain);
    const Tensor x = test::random_normal({2, k}, 51);
    std::vector<float> got(2 * n), portable(2 * n);
    ops::matmul_rows(x.data<float>(), 2, k, ops::WeightMatrix::of(with_nan), 0, n, nullptr, got.data(), n);
    ops::matmul_rows_portable(x.data<float>(), 2, k, ops::WeightMatrix::of(with_nan), 0, n, nullptr, portable.data(),
                              n);
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(std::isnan(got[i]), i % 4 == 2) << i;
      EXPECT_EQ(std::isnan(portable[i]), i % 4 == 2) << i;
    }
  }
}

TEST(Fp8Weights, RowsEmbeddingAndWideningApplyTheScales) {
  const Fp8Weight q = quantize_fp8_block(test::random_normal({20, 40}, 41), 16, 16, DType::BF16);
  const Tensor w = attached(q, 16, 16);
  EXPECT_EQ(test::float_values(to_f32(w)), test::float_values(q.dequantized));
  std::vector<float> row(40);
  row_to_f32(w.rows(7, 20), 10, row.data());  // row 17 of the matrix: second block row
  EXPECT_EQ(row, std::vector<float>(q.dequantized.data<float>() + 17 * 40, q.dequantized.data<float>() + 18 * 40));
  Tensor out = Tensor::empty(DType::F32, {2, 40});
  const std::vector<int32_t> ids = {19, 3};
  ops::cpu::embedding(w, ids, out);
  EXPECT_EQ(std::vector<float>(out.data<float>(), out.data<float>() + 40),
            std::vector<float>(q.dequantized.data<float>() + 19 * 40, q.dequantized.data<float>() + 20 * 40));
  EXPECT_THROW(ops::WeightMatrix::of(q.fp8), Error);  // fp8 without its scales is refused
  EXPECT_THROW((void)w.reshaped({40, 20}), Error);
  EXPECT_NE(test::error_of([&] { (void)test::random_normal({2, 2}, 1).with_block_scales({}); }).find("F8_E4M3"),
            std::string::npos);
}

// ---- Checkpoints quantized as published --------------------------------------------------------

struct Quantization {
  int64_t block_rows, block_cols;
  DType scale_dtype;  // F32 as DeepSeek/Kimi publish, BF16 as Qwen3's FP8 releases
};

// Whether a published FP8 checkpoint of these families quantizes `name`: every projection of the
// decoder layers (attention, dense MLP, experts, shared experts); not the embeddings, lm_head,
// norms, the router gate or its bias.
bool quantized_as_published(const std::string& name, const Shape& shape) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return shape.size() == 2 && ends_with(".weight") && name.rfind("model.layers.", 0) == 0 &&
         !ends_with(".mlp.gate.weight");
}

// Fixture `family` written twice: `fp8` in the published format (F8_E4M3 weights, their
// `weight_scale_inv`, the quantization_config), and `wide` as float32 holding the dequantized
// values with the fixture's own config.
void write_quantized(const std::string& family, const Quantization& quant, const std::string& fp8,
                     const std::string& wide) {
  const std::string src = test::family_dir(family);
  auto file = SafetensorsFile::open(src + "/model.safetensors");
  std::vector<NamedTensor> fp8_tensors, wide_tensors;
  for (const auto& [name, entry] : file->entries()) {
    const Tensor stored = file->view(name);
    if (!quantized_as_published(name, entry.shape)) {
      fp8_tensors.push_back({name, stored});
      wide_tensors.push_back({name, stored});
      continue;
    }
    const Fp8Weight q = quantize_fp8_block(to_f32(stored), quant.block_rows, quant.block_cols, quant.scale_dtype);
    fp8_tensors.push_back({name, q.fp8});
    fp8_tensors.push_back({name + "_scale_inv", q.scale_inv});
    wide_tensors.push_back({name, q.dequantized});
  }
  nlohmann::json config = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  for (const std::string& dir : {fp8, wide}) std::filesystem::create_directories(dir);
  std::ofstream(wide + "/config.json") << config.dump(1);
  config["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"},
                                   {"weight_block_size", {quant.block_rows, quant.block_cols}}};
  if (quant.scale_dtype == DType::F32) config["quantization_config"]["fmt"] = "e4m3";  // DeepSeek's spelling
  std::ofstream(fp8 + "/config.json") << config.dump(1);
  write_safetensors(fp8 + "/model.safetensors", fp8_tensors);
  write_safetensors(wide + "/model.safetensors", wide_tensors);
}

std::string ids_arg(const std::vector<int64_t>& ids) { return test::join(ids); }

struct Fp8Case {
  std::string family;
  Quantization quant;
};

void PrintTo(const Fp8Case& c, std::ostream* os) {
  *os << c.family << " in blocks of [" << c.quant.block_rows << ", " << c.quant.block_cols << "], "
      << dtype_name(c.quant.scale_dtype) << " scales";
}

class Fp8Checkpoint : public ::testing::TestWithParam<Fp8Case> {};

// r3 on the FP8 checkpoint equals r3 on its dequantized float32 twin, bit for bit, on every MoE
// path: forward logits and routed experts (prefill: every tile shape), and greedy generation with
// its routing (decode: one row at a time), with EPLB replicas (copies of the fp8 experts) too.
TEST_P(Fp8Checkpoint, RunsExactlyAsItsDequantizedFloat32Twin) {
  const Fp8Case& c = GetParam();
  const test::TempDir dir;
  write_quantized(c.family, c.quant, dir.path("fp8"), dir.path("wide"));
  const test::Reference ref = test::load_reference(c.family, 0);
  const std::string ids = ids_arg(test::forward_ids(ref)), prompt = ids_arg(test::prompt_ids(ref));
  for (const std::string path : {"modular", "monolithic", "mega"}) {
    std::string dumps[2];
    std::string generated[2];
    for (int i = 0; i < 2; ++i) {
      const std::string model = dir.path(i == 0 ? "fp8" : "wide");
      dumps[i] = dir.path(path + std::to_string(i) + ".safetensors");
      const auto fwd = test::run_r3("forward -q --model " + model + " --ids " + ids + " --moe-path " + path +
                                    " --dump " + dumps[i]);
      ASSERT_EQ(fwd.exit_code, 0) << fwd.err;
      EXPECT_EQ(fwd.err, "") << "every tensor, the block scales too, is used, with no warning";
      const std::string eplb = path == "mega" ? " --eplb-redundant-experts 3 --eplb-rebalance-every 2" : "";
      const auto gen = test::run_r3("generate -q --json --ignore-eos --max-new-tokens 6 --model " + model + " --ids " +
                                    prompt + " --moe-path " + path + eplb);
      ASSERT_EQ(gen.exit_code, 0) << gen.err;
      generated[i] = gen.out;
    }
    auto a = SafetensorsFile::open(dumps[0]), b = SafetensorsFile::open(dumps[1]);
    const std::vector<double> la = test::read_as_f64(*a, "logits"), lb = test::read_as_f64(*b, "logits");
    ASSERT_EQ(la.size(), lb.size());
    for (std::size_t i = 0; i < la.size(); ++i) ASSERT_EQ(la[i], lb[i]) << path << ": logit " << i;
    EXPECT_EQ(test::read_as_i64(*a, "topk_ids"), test::read_as_i64(*b, "topk_ids")) << path;
    EXPECT_EQ(test::read_as_f64(*a, "topk_weights"), test::read_as_f64(*b, "topk_weights")) << path;
    EXPECT_EQ(generated[0], generated[1]) << path;
  }
  // The quantized model stays near the float32 original: a loose sanity check of the quantizer
  // (e4m3 keeps 3 mantissa bits, up to 6% per weight; on these tiny random models the logits
  // move by about 30% of their largest value, as some routing choices flip).
  auto dump = SafetensorsFile::open(dir.path("monolithic0.safetensors"));
  const std::vector<double> logits = test::read_as_f64(*dump, "logits");
  double max_err = 0, max_ref = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    max_err = std::max(max_err, std::fabs(logits[i] - ref.logits[i]));
    max_ref = std::max(max_ref, std::fabs(ref.logits[i]));
  }
  EXPECT_LE(max_err / max_ref, 0.5) << "max |fp8 - float32 reference| = " << max_err;
}

INSTANTIATE_TEST_SUITE_P(
    Families, Fp8Checkpoint,
    ::testing::Values(Fp8Case{"deepseek_v3", {16, 16, DType::F32}},   // kv_a_proj: 24 rows, a partial block
                      Fp8Case{"deepseek_v3", {32, 48, DType::F32}},   // partial blocks in both directions
                      Fp8Case{"qwen3_moe", {16, 16, DType::BF16}},
                      Fp8Case{"qwen3_moe", {8, 24, DType::BF16}}),    // the portable kernel's block widths
    [](const auto& p) {
      return p.param.family + "_" + std::to_string(p.param.quant.block_rows) + "x" +
             std::to_string(p.param.quant.block_cols);
    });

// Resident memory of an FP8 checkpoint stays near its file size: the fp8 bytes are a view of the
// mapping, only the (small) block scales are widened. The model is ~300 MB, so the loader's fixed
// bookkeeping (and, in the sanitizer build, its allocator's quarantine) is small beside it; the
// growth is read as file-backed pages (the mapping) and private pages (everything r3 allocated),
// before and after a forward pass, so a kernel that widened weights on first use would show too.
TEST(Fp8Checkpoint, ResidentMemoryStaysNearTheFileSize) {
  constexpr int64_t kBigHidden = 1024, kBigLayers = 3, kBigExperts = 32, kBigWidth = 1024, kBigVocab = 512;
  const test::TempDir dir;
  const std::string model = dir.path("fp8");
  std::filesystem::create_directories(model);
  const nlohmann::json config = {
      {"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}, {"hidden_size", kBigHidden},
      {"num_hidden_layers", kBigLayers}, {"num_attention_heads", 8}, {"num_key_value_heads", 2}, {"head_dim", 128},
      {"vocab_size", kBigVocab}, {"intermediate_size", 2048}, {"moe_intermediate_size", kBigWidth},
      {"num_experts", kBigExperts}, {"num_experts_per_tok", 4}, {"norm_topk_prob", true}, {"rms_norm_eps", 1e-6},
      {"max_position_embeddings", 512}, {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
      {"quantization_config",
       {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}}}};
  std::ofstream(model + "/config.json") << config.dump(1);
  {
    // Weights drawn straight as fp8 codes (any finite e4m3 value; quantizing 300 MB of normals
    // would only slow the test down) with BF16 block scales near 1/64, as Qwen3's releases store them.
    std::vector<NamedTensor> tensors;
    uint64_t state = 12345;
    auto next = [&] { return (state = state * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; };
    auto add = [&](const std::string& name, Shape shape) {
      if (!quantized_as_published(name, shape)) {
        tensors.push_back({name, test::random_normal(shape, static_cast<uint32_t>(next()))});
        return;
      }
      Tensor fp8 = Tensor::empty(DType::F8_E4M3, shape);
      auto* bytes = static_cast<uint8_t*>(fp8.raw_data());
      for (int64_t i = 0; i < fp8.numel(); ++i) {
        const auto code = static_cast<uint8_t>(next());
        bytes[i] = (code & 0x7F) == 0x7F ? 0 : code;  // 0x7F and 0xFF are e4m3's NaNs
      }
      Tensor scales = Tensor::empty(DType::BF16, {(shape[0] + 127) / 128, (shape[1] + 127) / 128});
      auto* s = static_cast<uint16_t*>(scales.raw_data());
      for (int64_t i = 0; i < scales.numel(); ++i) s[i] = f32_to_bf16(static_cast<float>(1 + next() % 4) / 256.0f);
      tensors.push_back({name, fp8});
      tensors.push_back({name + "_scale_inv", scales});
    };
    add("model.embed_tokens.weight", {kBigVocab, kBigHidden});
    add("lm_head.weight", {kBigVocab, kBigHidden});
    add("model.norm.weight", {kBigHidden});
    for (int64_t l = 0; l < kBigLayers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {kBigHidden});
      add(p + "post_attention_layernorm.weight", {kBigHidden});
      add(p + "self_attn.q_proj.weight", {1024, kBigHidden});
      add(p + "self_attn.k_proj.weight", {256, kBigHidden});
      add(p + "self_attn.v_proj.weight", {256, kBigHidden});
      add(p + "self_attn.o_proj.weight", {kBigHidden, 1024});
      add(p + "self_attn.q_norm.weight", {128});
      add(p + "self_attn.k_norm.weight", {128});
      add(p + "mlp.gate.weight", {kBigExperts, kBigHidden});
      for (int64_t e = 0; e < kBigExperts; ++e) {
        const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
        add(q + "gate_proj.weight", {kBigWidth, kBigHidden});
        add(q + "up_proj.weight", {kBigWidth, kBigHidden});
        add(q + "down_proj.weight", {kBigHidden, kBigWidth});
      }
    }
    write_safetensors(model + "/model.safetensors", tensors);
  }
  test::expect_resident_near_file_size(model);
}

// What the loader refuses, each a one-line error naming the tensor or the key (the CLI's exact
// messages are in tests/malformed, quant-*).
TEST(Fp8Checkpoint, RefusesMalformedQuantization) {
  const auto quant = [](const std::string& body) {
    return WeightQuantization::from_config(HfConfig::parse("{\"quantization_config\": " + body + "}"));
  };
  EXPECT_NE(test::error_of([&] { quant(R"({"quant_method": "awq"})"); }).find("quant_method 'awq' is not supported"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { quant(R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]})"); })
                .find("fmt 'e5m2'"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { quant(R"({"quant_method": "fp8", "activation_scheme": "static",
                                           "weight_block_size": [128, 128]})"); })
                .find("activation_scheme 'static'"),
            std::string::npos);
  for (const char* block : {"[128]", "[0, 128]", "[128, 128, 1]", "[-1, 4]"}) {
    EXPECT_NE(test::error_of([&] { quant(std::string(R"({"quant_method": "fp8", "weight_block_size": )") + block + "}"); })
                  .find("weight_block_size must be"),
              std::string::npos)
        << block;
  }
  EXPECT_NE(test::error_of([&] { quant(R"({"quant_method": "fp8", "weight_block_size": "128"})"); })
                .find("'weight_block_size' must be a list of integers"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { quant(R"({"quant_method": "fp8"})"); }).find("weight_block_size is missing"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { quant(R"({"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "e5m2"})"); })
                .find("scale_fmt 'e5m2' is not supported"),
            std::string::npos);
  EXPECT_TRUE(quant(R"({"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "ue8m0"})").power_of_two_scales);
  EXPECT_FALSE(quant(R"({"quant_method": "fp8", "weight_block_size": [128, 128]})").power_of_two_scales);
  const WeightQuantization q = quant(R"({"quant_method": "fp8", "weight_block_size": [128, 64],
                                         "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate"]})");
  EXPECT_TRUE(q.fp8());
  EXPECT_EQ(q.block_rows, 128);
  EXPECT_EQ(q.block_cols, 64);
  EXPECT_EQ(q.excluded_by("lm_head.weight"), "lm_head");
  EXPECT_EQ(q.excluded_by("model.layers.0.mlp.gate.weight"), "model.layers.0.mlp.gate");
  EXPECT_EQ(q.excluded_by("model.layers.0.mlp.gate_proj.weight"), "");
  EXPECT_FALSE(quant("null").fp8());
}

// The same refusals through the loader, on a quantized fixture with one tensor broken.
TEST(Fp8Checkpoint, LoaderRefusesBrokenScalesByName) {
  const test::TempDir dir;
  write_quantized("qwen3_moe", {16, 16, DType::BF16}, dir.path("fp8"), dir.path("wide"));
  const std::string weight = "model.layers.1.self_attn.k_proj.weight";
  const std::string scale = weight + "_scale_inv";
  auto rewrite = [&](const std::string& name, const std::function<void(std::vector<NamedTensor>&)>& edit,
                     const std::string& config_edit = "") {
    const std::string out = dir.path(name);
    std::filesystem::create_directories(out);
    auto file = SafetensorsFile::open(dir.path("fp8") + "/model.safetensors");
    std::vector<NamedTensor> tensors;
    for (const auto& [n, e] : file->entries()) tensors.push_back({n, file->view(n)});
    edit(tensors);
    write_safetensors(out + "/model.safetensors", tensors);
    nlohmann::json config = nlohmann::json::parse(std::ifstream(dir.path("fp8") + "/config.json"));
    if (config_edit == "drop") config.erase("quantization_config");
    if (config_edit == "exclude") config["quantization_config"]["modules_to_not_convert"] = {"model.layers.1.self_attn"};
    if (config_edit == "ue8m0") config["quantization_config"]["scale_fmt"] = "ue8m0";
    std::ofstream(out + "/config.json") << config.dump(1);
    return test::error_of([&] { models::load_model(out); });
  };
  auto drop = [&](std::vector<NamedTensor>& t) { std::erase_if(t, [&](const NamedTensor& x) { return x.name == scale; }); };
  auto replace = [&](Tensor with) {
    return [&, with](std::vector<NamedTensor>& t) {
      for (auto& x : t) {
        if (x.name == scale) x.tensor = with;
      }
    };
  };
  std::string err = rewrite("missing", drop);
  EXPECT_NE(err.find("tensor '" + weight + "' is stored as F8_E4M3, but the checkpoint has no block scales '" + scale +
                     "' (expected [2, 4] for blocks of [16, 16])"),
            std::string::npos)
      << err;
  err = rewrite("shape", replace(Tensor::empty(DType::F32, {2, 3})));
  EXPECT_NE(err.find("block scales '" + scale + "'"), std::string::npos) << err;
  EXPECT_NE(err.find("have shape [2, 3], expected [2, 4] (weight [32, 64] in blocks of [16, 16])"), std::string::npos)
      << err;
  err = rewrite("dtype", replace(Tensor::empty(DType::I32, {2, 4})));
  EXPECT_NE(err.find("have dtype I32, expected F32, BF16 or F16"), std::string::npos) << err;
  err = rewrite("noconfig", [](auto&) {}, "drop");
  EXPECT_NE(err.find("is stored as F8_E4M3, but " + dir.path("noconfig") + "/config.json has no quantization_config"),
            std::string::npos)
      << err;
  err = rewrite("excluded", [](auto&) {}, "exclude");
  EXPECT_NE(err.find("lists 'model.layers.1.self_attn' in quantization_config.modules_to_not_convert"), std::string::npos)
      << err;
  EXPECT_EQ(err.find('\n'), std::string::npos);
  // scale_fmt "ue8m0" promises powers of two: amax / 448 scales are not.
  err = rewrite("ue8m0", [](auto&) {}, "ue8m0");
  EXPECT_NE(err.find("block scales 'model.layers.0."), std::string::npos) << err;
  EXPECT_NE(err.find("says scale_fmt \"ue8m0\" (positive powers of two)"), std::string::npos) << err;
  // DeepSeek-V4-Flash's name for the scales: <module>.scale beside <module>.weight.
  const auto renamed = [&](std::vector<NamedTensor>& t) {
    for (auto& x : t) {
      if (x.name == scale) x.name = "model.layers.1.self_attn.k_proj.scale";
    }
  };
  EXPECT_EQ(rewrite("module_scale", renamed), "");
}

}  // namespace
}  // namespace r3
