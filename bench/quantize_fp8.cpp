// Writes the FP8 version of a checkpoint folder, quantized the way fine-grained FP8 releases are
// (DeepSeek-V3, Kimi K2, Qwen3-FP8; tools/make_reference.py --quantize fp8 is the same rule in
// torch): every 2-D `model.layers.*.weight` except router gates (`*.gate.weight`) becomes F8_E4M3
// with `<name>_scale_inv` F32 [ceil(rows / R), ceil(cols / C)], scale = block amax / 448 (1 for an
// all-zero block) and each value e4m3(w / scale) rounded to nearest even; embeddings, norms, router
// gates and lm_head are copied as they are. config.json gains the quantization_config.
//
//   build/r3_quantize_fp8 --model DIR --out DIR [--block-size 128,128]
//
// `make bench` uses it for the FP8 twin of the benchmark checkpoint (one model.safetensors).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/check.h"
#include "io/safetensors.h"

namespace r3 {
namespace {

namespace fs = std::filesystem;

bool quantized_as_published(const std::string& name, const SafetensorsEntry& e) {
  const auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return e.shape.size() == 2 && name.rfind("model.layers.", 0) == 0 && ends_with(".weight") &&
         !ends_with(".gate.weight");
}

std::vector<float> widened(const Tensor& t) {
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const auto u = static_cast<std::size_t>(i);
    switch (t.dtype()) {
      case DType::F32: out[u] = t.data<float>()[i]; break;
      case DType::BF16: out[u] = bf16_to_f32(static_cast<const uint16_t*>(t.raw_data())[i]); break;
      case DType::F16: out[u] = f16_to_f32(static_cast<const uint16_t*>(t.raw_data())[i]); break;
      default: R3_FAIL("quantize_fp8: weight of dtype ", dtype_name(t.dtype()), " (expected F32, BF16 or F16)");
    }
  }
  return out;
}

// w [rows, cols] -> (e4m3 codes, scales [ceil(rows / R), ceil(cols / C)]).
std::pair<Tensor, Tensor> quantize(const Tensor& w, int64_t R, int64_t C) {
  const int64_t rows = w.dim(0), cols = w.dim(1), grid_rows = (rows + R - 1) / R, grid_cols = (cols + C - 1) / C;
  const std::vector<float> values = widened(w);
  Tensor codes = Tensor::empty(DType::F8_E4M3, {rows, cols});
  Tensor scales = Tensor::empty(DType::F32, {grid_rows, grid_cols});
  for (int64_t br = 0; br < grid_rows; ++br) {
    for (int64_t bc = 0; bc < grid_cols; ++bc) {
      const int64_t r1 = std::min(rows, (br + 1) * R), c1 = std::min(cols, (bc + 1) * C);
      float amax = 0;
      for (int64_t r = br * R; r < r1; ++r) {
        for (int64_t c = bc * C; c < c1; ++c) amax = std::max(amax, std::fabs(values[static_cast<std::size_t>(r * cols + c)]));
      }
      const float scale = amax > 0 ? amax / 448.0f : 1.0f;
      scales.data<float>()[br * grid_cols + bc] = scale;
      for (int64_t r = br * R; r < r1; ++r) {
        for (int64_t c = bc * C; c < c1; ++c) {
          const float q = std::clamp(values[static_cast<std::size_t>(r * cols + c)] / scale, -448.0f, 448.0f);
          static_cast<uint8_t*>(codes.raw_data())[r * cols + c] = f32_to_f8_e4m3(q);
        }
      }
    }
  }
  return {std::move(codes), std::move(scales)};
}

std::vector<std::string> safetensors_files(const std::string& dir) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (!fs::exists(index)) return {(fs::path(dir) / "model.safetensors").string()};
  std::ifstream in(index);
  const auto map = nlohmann::json::parse(in).at("weight_map");
  std::vector<std::string> files;
  for (const auto& [name, file] : map.items()) files.push_back((fs::path(dir) / file.get<std::string>()).string());
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

int run(const std::string& model, const std::string& out, int64_t R, int64_t C) {
  R3_CHECK(R > 0 && C > 0, "--block-size: two positive sizes, e.g. 128,128");
  fs::create_directories(out);
  std::vector<std::shared_ptr<const SafetensorsFile>> files;
  std::vector<NamedTensor> tensors;
  int quantized = 0;
  for (const std::string& path : safetensors_files(model)) {
    files.push_back(SafetensorsFile::open(path));
    for (const auto& [name, entry] : files.back()->entries()) {
      Tensor stored = files.back()->view(name);
      if (!quantized_as_published(name, entry)) {
        tensors.push_back({name, std::move(stored)});
        continue;
      }
      auto [codes, scales] = quantize(stored, R, C);
      tensors.push_back({name, std::move(codes)});
      tensors.push_back({name + "_scale_inv", std::move(scales)});
      if (++quantized % 100 == 0) fmt::print(stderr, "quantize_fp8: {} weights\n", quantized);
    }
  }
  write_safetensors((fs::path(out) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  std::ifstream config_in(fs::path(model) / "config.json");
  R3_CHECK(config_in.good(), model, "/config.json: cannot be read");
  nlohmann::json config = nlohmann::json::parse(config_in);
  config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                   {"weight_block_size", {R, C}}};
  std::ofstream(fs::path(out) / "config.json") << config.dump(2) << "\n";
  for (const char* extra : {"generation_config.json", "tokenizer.json", "tokenizer_config.json"}) {
    if (fs::exists(fs::path(model) / extra)) {
      fs::copy_file(fs::path(model) / extra, fs::path(out) / extra, fs::copy_options::overwrite_existing);
    }
  }
  fmt::print(stderr, "quantize_fp8: {} weights to e4m3 in blocks of [{}, {}], written to {}\n", quantized, R, C, out);
  return 0;
}

}  // namespace
}  // namespace r3

int main(int argc, char** argv) {
  CLI::App app{"the FP8 (block-scaled e4m3) version of a checkpoint folder, as fine-grained FP8 releases store it"};
  std::string model, out;
  std::vector<int64_t> block{128, 128};
  app.add_option("--model", model, "checkpoint folder (config.json, model.safetensors or shards)")->required();
  app.add_option("--out", out, "folder to write")->required();
  app.add_option("--block-size", block, "weight_block_size ROWS,COLS")->delimiter(',')->expected(2);
  CLI11_PARSE(app, argc, argv);
  try {
    return r3::run(model, out, block[0], block[1]);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
