// The parameter table (models/parameter_table.h): every family's builder records each weight it
// loads, so the table of a loaded fixture names every checkpoint tensor exactly once, with the
// shape and form the model keeps and the layer and expert it sits in; a name it does not hold
// is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include <unistd.h>

#include <cstring>
#include <sstream>
#include <vector>

#include "io/checkpoint.h"
#include "io/mapped_file.h"
#include "io/process_memory.h"
#include "models/forward_batch.h"
#include "models/registry.h"
#include "test_support.h"

namespace r3 {
namespace {

using models::Parameter;
using models::ParameterForm;
using models::ParameterTable;

class ParameterTableOfFixture : public testing::TestWithParam<std::string> {};

TEST_P(ParameterTableOfFixture, NamesEveryCheckpointTensorOnceWithItsShapeAndSite) {
  const std::string dir = test::family_dir(GetParam());
  const auto model = models::load_model(dir);
  const ParameterTable& table = model->parameters();
  const Checkpoint ckpt = Checkpoint::open(dir);

  // Every tensor of the checkpoint feeds exactly one parameter (ParameterTable::add refuses a
  // second reader), and no parameter reads a tensor the checkpoint lacks.
  EXPECT_EQ(table.stored_names(), ckpt.tensor_names());

  const models::ModelInfo& info = model->info();
  std::map<int64_t, int64_t> expert_parameters_by_layer;
  int64_t fp8_parameters = 0, mxfp4_parameters = 0;
  for (const Parameter& p : table.parameters()) {
    fp8_parameters += p.tensor.dtype() == DType::F8_E4M3 ? 1 : 0;
    mxfp4_parameters += p.form == ParameterForm::kMxfp4 ? 1 : 0;
    SCOPED_TRACE(p.name);
    ASSERT_TRUE(p.tensor.defined());
    EXPECT_EQ(p.stored.front(), p.form == ParameterForm::kMxfp4 ? p.name + "_blocks" : p.name);
    if (p.form != ParameterForm::kMxfp4) {
      EXPECT_EQ(p.shape, ckpt.shape(p.name));
      EXPECT_EQ(p.tensor.shape(), p.shape);
    }
    if (p.form == ParameterForm::kFloat32) {
      EXPECT_EQ(p.tensor.dtype(), DType::F32);
    }
    if (p.form == ParameterForm::kStored) {
      // A projection stays as stored: the checkpoint's dtype (F64 is narrowed to F32), FP8 with
      // its block scales read beside it.
      const bool fp8 = p.tensor.dtype() == DType::F8_E4M3;
      EXPECT_EQ(p.stored.size(), fp8 ? 2u : 1u);
      if (fp8) {
        EXPECT_NE(p.tensor.block_scales(), nullptr);
      }
    }
    if (p.form == ParameterForm::kMxfp4) {
      EXPECT_EQ(p.stored, (std::vector<std::string>{p.name + "_blocks", p.name + "_scales"}));
    }
    EXPECT_GE(p.site.layer, -1);
    EXPECT_LT(p.site.layer, info.num_layers);
    EXPECT_GE(p.site.expert, -1);
    EXPECT_LT(p.site.expert, info.num_experts);
    // A layer's parameters are named under that layer (the site comes from the builder, not from
    // the name; this checks the two agree).
    if (p.site.layer >= 0) {
      EXPECT_NE(p.name.find("layers." + std::to_string(p.site.layer) + "."), std::string::npos);
    }
    if (p.site.expert >= 0) {
      EXPECT_GE(p.site.layer, 0);
      ++expert_parameters_by_layer[p.site.layer];
    }
  }
  // The quantized fixtures' weights are recorded as stored, with the tensors beside them.
  EXPECT_EQ(fp8_parameters > 0, GetParam().ends_with("_fp8"));
  EXPECT_EQ(mxfp4_parameters > 0, GetParam().ends_with("_mxfp4"));
  // Each MoE layer whose experts are stored one by one records gate, up and down of every expert.
  if (!GetParam().starts_with("gpt_oss")) {  // GPT-OSS stores each layer's experts as one stack
    EXPECT_EQ(expert_parameters_by_layer.size(), info.moe_layers.size());
  }
  for (const auto& [layer, count] : expert_parameters_by_layer) {
    EXPECT_NE(std::find(info.moe_layers.begin(), info.moe_layers.end(), layer), info.moe_layers.end()) << layer;
    EXPECT_EQ(count, 3 * info.num_experts) << "layer " << layer;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ParameterTableOfFixture,
                         testing::Values("qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "glm4_moe", "deepseek_v2",
                                         "deepseek_v3", "gpt_oss", "kimi_linear", "deepseek_v4", "kimi_k3",
                                         "qwen3_moe_fp8", "deepseek_v3_fp8", "kimi_linear_fp8", "gpt_oss_mxfp4"));

TEST(ParameterTable, ExpertsOfOneByOneLayoutsAreSitedByExpert) {
  const auto model = models::load_model(test::family_dir("qwen3_moe"));
  const ParameterTable& table = model->parameters();
  const int64_t layer = model->info().moe_layers.front();
  const std::string name = "model.layers." + std::to_string(layer) + ".mlp.experts.3.down_proj.weight";
  const Parameter& p = table.at(name);
  EXPECT_EQ(p.site.layer, layer);
  EXPECT_EQ(p.site.expert, 3);
  EXPECT_EQ(p.form, ParameterForm::kStored);
}

TEST(ParameterTable, FindsAParameterByItsBlockScales) {
  const auto model = models::load_model(test::family_dir("qwen3_moe_fp8"));
  const ParameterTable& table = model->parameters();
  int64_t fp8 = 0;
  for (const Parameter& p : table.parameters()) {
    if (p.stored.size() != 2) continue;
    ++fp8;
    EXPECT_EQ(&table.at(p.stored[1]), &p) << p.stored[1];
  }
  EXPECT_GT(fp8, 0);
}

TEST(ParameterTable, RefusesAnUnknownNameByName) {
  const auto model = models::load_model(test::family_dir("qwen3_moe"));
  EXPECT_EQ(model->parameters().find("model.layers.0.mlp.experts.999.up_proj.weight"), nullptr);
  try {
    (void)model->parameters().at("model.layers.0.mlp.experts.999.up_proj.weight");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown tensor 'model.layers.0.mlp.experts.999.up_proj.weight'"),
              std::string::npos)
        << e.what();
  }
}

TEST(ParameterTable, RefusesATensorReadByTwoParameters) {
  ParameterTable table;
  table.add({"a.weight", {2, 2}, ParameterForm::kStored, {0, -1}, {"a.weight", "a.weight_scale_inv"},
             Tensor::empty(DType::F32, {2, 2})});
  try {
    table.add({"b.weight", {2, 2}, ParameterForm::kStored, {1, -1}, {"b.weight", "a.weight_scale_inv"},
               Tensor::empty(DType::F32, {2, 2})});
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'a.weight_scale_inv' is loaded twice (for 'b.weight', already for 'a.weight')"),
              std::string::npos)
        << what;
  }
  EXPECT_EQ(table.size(), 1u);
  EXPECT_EQ(table.stored_names(), (std::vector<std::string>{"a.weight", "a.weight_scale_inv"}));
}

TEST(ParameterTable, ARelocatedParameterNamesItsNewMemoryAndNothingElseFits) {
  ParameterTable table;
  table.add({"a.weight", {2, 3}, ParameterForm::kFloat32, {0, -1}, {"a.weight"}, Tensor::empty(DType::F32, {2, 3})});
  const Tensor stacked = Tensor::empty(DType::F32, {4, 3});
  table.relocate("a.weight", stacked.rows(2, 4));
  EXPECT_EQ(table.at("a.weight").tensor.data<float>(), stacked.data<float>() + 6);
  const auto error_of = [&](const std::string& name, const Tensor& t) {
    try {
      table.relocate(name, t);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("a.weight", stacked).find("relocating parameter 'a.weight': F32 [4, 3] for F32 [2, 3]"),
            std::string::npos);
  EXPECT_NE(error_of("b.weight", stacked).find("relocating parameter 'b.weight': no parameter of that name"),
            std::string::npos);
}

// The resident kilobytes of this process's mapping that starts at `start` (/proc/self/smaps), or
// -1 when there is none.
int64_t mapping_rss_kb(const void* start) {
  std::ifstream smaps("/proc/self/smaps");
  std::ostringstream want;
  want << std::hex << reinterpret_cast<uintptr_t>(start) << "-";
  std::string line;
  bool in_mapping = false;
  while (std::getline(smaps, line)) {
    if (line.find(" ") != std::string::npos && line.find("-") < line.find(" ") && line.find(":") > line.find(" ")) {
      in_mapping = line.rfind(want.str(), 0) == 0;  // a mapping's header line: "start-end perms ..."
    } else if (in_mapping && line.rfind("Rss:", 0) == 0) {
      return std::stoll(line.substr(4));
    }
  }
  return -1;
}

TEST(ProcessMemory, CountsWhatTheProcessTouchesAndItsPeak) {
  const ProcessMemory before = process_memory();
  EXPECT_GT(before.resident_bytes, 0);
  EXPECT_GE(before.peak_resident_bytes, before.resident_bytes);
  // 64 MiB touched page by page: resident memory grows by about that much.
  std::vector<char> block(64 << 20);
  for (std::size_t i = 0; i < block.size(); i += 4096) block[i] = static_cast<char>(i);
  const ProcessMemory after = process_memory();
  EXPECT_GE(after.resident_bytes - before.resident_bytes, 60 << 20);
  EXPECT_GE(after.peak_resident_bytes, after.resident_bytes);
  EXPECT_EQ(block[4096], static_cast<char>(4096));
}

TEST(MappedFile, ReleasedPagesLeaveTheProcessAndAreReadBackFromTheFile) {
  test::TempDir dir;
  const std::string path = dir.path("pages.bin");
  constexpr std::size_t kBytes = std::size_t{16} << 20;
  std::vector<unsigned char> pattern(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) pattern[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(pattern.data()), static_cast<std::streamsize>(kBytes));
  }
  const MappedFile file(path);
  prefetch(file.data(), file.size());
  EXPECT_GE(mapping_rss_kb(file.data()), static_cast<int64_t>(kBytes / 1024) - 4);

  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  // Only whole pages inside the range go: here all but the first and the last.
  EXPECT_EQ(release_pages(file.data() + 100, kBytes - 200), kBytes - 2 * page);
  EXPECT_LE(mapping_rss_kb(file.data()), static_cast<int64_t>(2 * page / 1024));
  EXPECT_EQ(release_pages(file.data() + 1, page - 2), 0u);  // no whole page inside
  // Nothing is lost: touched again, the pages are read back from the file.
  EXPECT_EQ(std::memcmp(file.data(), pattern.data(), kBytes), 0);
  EXPECT_GE(mapping_rss_kb(file.data()), static_cast<int64_t>(kBytes / 1024) - 4);
}

TEST(ParameterTable, ReleasingTheMappedPagesKeepsWhatTheModelComputes) {
  // What a model placed on a device does with its host model: the checkpoint's pages leave the
  // process; the host model still computes the same bits (its pages come back from the file).
  const auto model = models::load_model(test::family_dir("qwen3_moe"));
  backend::Context ctx(2);
  const auto run = [&] {
    const auto cache = model->make_cache(1, 16);
    return test::float_values(
        test::forward_captured(*model, ctx, models::ForwardBatch::sequence({3, 17, 42, 7, 99}, 0), *cache));
  };
  const std::vector<float> before = run();
  EXPECT_GT(model->parameters().release_mapped_pages(), 0);
  EXPECT_EQ(run(), before);
}

TEST(ParameterTable, AMissingOrMisShapedTensorIsNamedWhenTheModelLoads) {
  // The loader's errors are the checkpoint's: they name the tensor, its expected and found shape.
  test::TempDir dir;
  const std::string src = test::family_dir("qwen3_moe");
  for (const auto& entry : std::filesystem::directory_iterator(src)) {
    std::filesystem::copy(entry.path(), dir.path(entry.path().filename().string()));
  }
  // A config asking for a wider expert than the checkpoint stores: the first expert weight loaded
  // is refused by its checkpoint name.
  const std::string config_path = dir.path("config.json");
  std::string config;
  {
    std::ifstream in(config_path);
    config.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string key = "\"moe_intermediate_size\": ";
  const std::size_t at = config.find(key);
  ASSERT_NE(at, std::string::npos);
  const std::size_t end = config.find_first_of(",}\n", at + key.size());
  config.replace(at + key.size(), end - at - key.size(), "1000");
  {
    std::ofstream out(config_path);
    out << config;
  }
  try {
    (void)models::load_model(dir.path());
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("mlp.experts.0.gate_proj.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("expected [1000, "), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace r3
