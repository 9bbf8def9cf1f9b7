// Checkpoint folders: single file, sharded with an index, BF16/F16 storage, and clear errors
// naming the tensor, the expected and the found shape.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/context.h"
#include "io/checkpoint.h"
#include "models/registry.h"
#include "test_support.h"

namespace r3::test {
namespace {

namespace fs = std::filesystem;


// All tensors of a fixture checkpoint, each converted to `dtype` (float types only).
std::vector<NamedTensor> fixture_tensors(const std::string& family, DType dtype) {
  auto file = SafetensorsFile::open(family_dir(family) + "/model.safetensors");
  std::vector<NamedTensor> out;
  for (const auto& [name, e] : file->entries()) {
    Tensor src = file->view(name);
    Tensor dst = Tensor::empty(dtype, e.shape);
    std::vector<float> f(static_cast<std::size_t>(src.numel()));
    convert_to_f32(src.raw_data(), src.dtype(), f.size(), f.data());
    for (std::size_t i = 0; i < f.size(); ++i) {
      auto* p = static_cast<uint16_t*>(dst.raw_data());
      if (dtype == DType::BF16) p[i] = f32_to_bf16(f[i]);
      if (dtype == DType::F16) p[i] = f32_to_f16(f[i]);
      if (dtype == DType::F32) dst.data<float>()[i] = f[i];
    }
    out.push_back({name, dst});
  }
  return out;
}

std::vector<float> logits_of(const std::string& dir, const std::vector<int32_t>& ids) {
  auto model = models::load_model(dir);
  backend::Context ctx(2);
  auto cache_owner = model->make_cache(1, static_cast<int64_t>(ids.size()));
  models::ModelCache& cache = *cache_owner;
  Tensor logits = test::forward_captured(*model, ctx, models::ForwardBatch::sequence(ids, 0), cache);
  return {logits.data<float>(), logits.data<float>() + logits.numel()};
}

TEST(Checkpoint, ShardedIndexLoadsTheSameModel) {
  TempDir tmp;
  fs::copy_file(family_dir("qwen3_moe") + "/config.json", tmp.path("config.json"));
  auto tensors = fixture_tensors("qwen3_moe", DType::F32);
  const std::size_t half = tensors.size() / 2;
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  std::vector<NamedTensor> a(tensors.begin(), tensors.begin() + static_cast<long>(half));
  std::vector<NamedTensor> b(tensors.begin() + static_cast<long>(half), tensors.end());
  write_safetensors(tmp.path("model-00001-of-00002.safetensors"), a);
  write_safetensors(tmp.path("model-00002-of-00002.safetensors"), b);
  for (const auto& t : a) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const auto& t : b) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  std::ofstream(tmp.path("model.safetensors.index.json")) << index.dump();

  const std::vector<int32_t> ids = {5, 17, 300, 2, 99};
  EXPECT_EQ(logits_of(tmp.path(), ids), logits_of(family_dir("qwen3_moe"), ids));

  // A shard the index names but the folder lacks.
  fs::remove(tmp.path("model-00002-of-00002.safetensors"));
  const std::string err = error_of([&] { Checkpoint::open(tmp.path()); });
  EXPECT_NE(err.find("model-00002-of-00002.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("missing"), std::string::npos) << err;
}

TEST(Checkpoint, Bf16AndF16CheckpointsLoadAsRoundedFloat32) {
  for (DType dtype : {DType::BF16, DType::F16}) {
    TempDir tmp;
    fs::copy_file(family_dir("mixtral") + "/config.json", tmp.path("config.json"));
    write_safetensors(tmp.path("model.safetensors"), fixture_tensors("mixtral", dtype));
    Checkpoint half = Checkpoint::open(tmp.path());
    Checkpoint full = Checkpoint::open(family_dir("mixtral"));
    const Shape shape = {320, 64};
    Tensor h = half.load_f32("lm_head.weight", shape);
    Tensor f = full.load_f32("lm_head.weight", shape);
    for (int64_t i = 0; i < h.numel(); ++i) {
      const float v = f.data<float>()[i];
      const float rounded = dtype == DType::BF16 ? bf16_to_f32(f32_to_bf16(v)) : f16_to_f32(f32_to_f16(v));
      ASSERT_EQ(h.data<float>()[i], rounded) << dtype_name(dtype) << " element " << i;
    }
    // And the whole model runs from it, close to the float32 checkpoint.
    const std::vector<int32_t> ids = {1, 2, 3, 4};
    const auto a = logits_of(tmp.path(), ids), b = logits_of(family_dir("mixtral"), ids);
    double max_err = 0, max_ref = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      max_err = std::max(max_err, static_cast<double>(std::fabs(a[i] - b[i])));
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(b[i])));
    }
    EXPECT_LT(max_err / max_ref, 0.05) << dtype_name(dtype);
  }
}

TEST(Checkpoint, MissingTensorAndWrongShapeNameTheTensor) {
  Checkpoint ckpt = Checkpoint::open(family_dir("olmoe"));
  std::string err = error_of([&] { ckpt.load_f32("model.layers.9.mlp.gate.weight", {8, 64}); });
  EXPECT_NE(err.find("'model.layers.9.mlp.gate.weight'"), std::string::npos) << err;
  EXPECT_NE(err.find("[8, 64]"), std::string::npos) << err;

  err = error_of([&] { ckpt.load_f32("model.layers.0.mlp.gate.weight", {16, 64}); });
  EXPECT_NE(err.find("'model.layers.0.mlp.gate.weight'"), std::string::npos) << err;
  EXPECT_NE(err.find("has shape [8, 64], expected [16, 64]"), std::string::npos) << err;
}

TEST(Checkpoint, ModelWithAWrongTensorShapeFailsToLoadWithTheName) {
  TempDir tmp;
  fs::copy_file(family_dir("qwen3_moe") + "/config.json", tmp.path("config.json"));
  auto tensors = fixture_tensors("qwen3_moe", DType::F32);
  for (auto& t : tensors) {
    if (t.name == "model.layers.1.mlp.experts.3.up_proj.weight") {
      t.tensor = Tensor::empty(DType::F32, {16, 64});
    }
  }
  write_safetensors(tmp.path("model.safetensors"), tensors);
  const std::string err = error_of([&] { models::load_model(tmp.path()); });
  EXPECT_NE(err.find("model.layers.1.mlp.experts.3.up_proj.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("[16, 64], expected [32, 64]"), std::string::npos) << err;
}

TEST(Checkpoint, FolderWithoutCheckpointIsAClearError) {
  TempDir tmp;
  EXPECT_NE(error_of([&] { Checkpoint::open(tmp.path()); }).find("no checkpoint in"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Checkpoint::open(tmp.path("nope")); }).find("does not exist"),
            std::string::npos);
}

}  // namespace
}  // namespace r3::test
