// Replaying a routing: a captured routing reproduces the run bit for bit; a different routing
// changes the outputs and is what capture then returns; bad replay files are clear errors.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/generator.h"
#include "engine/routing_replay.h"
#include "engine/step_runner.h"
#include "models/registry.h"
#include "test_support.h"

namespace r3::test {
namespace {

struct ForwardRun {
  std::vector<float> logits;
  std::vector<int32_t> routed;
};

ForwardRun forward(models::CausalLM& model, const std::vector<int32_t>& ids, const std::vector<int32_t>& forced) {
  ThreadPool pool(2);
  auto cache_owner = model.make_cache(1, static_cast<int64_t>(ids.size()));
  models::ModelCache& cache = *cache_owner;
  engine::StepRunner runner(model, pool, cache, static_cast<int64_t>(ids.size()));
  engine::RoutedExperts routed(static_cast<int64_t>(model.info().moe_layers.size()), model.info().top_k);
  Tensor logits = runner.run({{0, ids, &routed, forced}}, 0, true);
  return {{logits.data<float>(), logits.data<float>() + logits.numel()}, routed.flat()};
}

TEST(Replay, CapturedRoutingReproducesLogitsBitForBit) {
  for (const std::string family : {"qwen3_moe", "qwen2_moe", "mixtral", "olmoe"}) {
    for (const std::string backend : {"modular", "monolithic", "mega"}) {
      models::LoadOptions options;
      options.moe_backend = moe::parse_moe_backend(backend);
      auto model = models::load_model(family_dir(family), options);
      const Reference ref = load_reference(family, 0);
      const std::vector<int32_t> ids(ref.input_ids.begin(), ref.input_ids.end() - 1);
      const ForwardRun free_run = forward(*model, ids, {});
      const ForwardRun replayed = forward(*model, ids, free_run.routed);
      EXPECT_EQ(replayed.logits, free_run.logits) << family << " " << backend;
      EXPECT_EQ(replayed.routed, free_run.routed) << family << " " << backend;

      // A different routing: every id moved to the next expert (still distinct per row).
      std::vector<int32_t> other = free_run.routed;
      for (int32_t& id : other) id = (id + 1) % static_cast<int32_t>(model->info().num_experts);
      const ForwardRun changed = forward(*model, ids, other);
      EXPECT_EQ(changed.routed, other) << family << " " << backend;
      EXPECT_NE(changed.logits, free_run.logits) << family << " " << backend;
    }
  }
}

TEST(Replay, GenerateReplaysItsOwnRoutingThroughTheCli) {
  TempDir tmp;
  const std::string dir = family_dir("qwen2_moe");
  const CommandResult first = run_r3("generate -q --json --ignore-eos --model " + dir +
                                     " --ids 3,14,15,92,65 --max-new-tokens 6");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  std::ofstream(tmp.path("routing.json")) << first.out;
  for (const std::string backend : {"modular", "monolithic", "mega"}) {
    const CommandResult again = run_r3("generate -q --json --ignore-eos --model " + dir + " --moe-backend " + backend +
                                       " --ids 3,14,15,92,65 --max-new-tokens 6 --replay " + tmp.path("routing.json"));
    ASSERT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(nlohmann::json::parse(again.out), nlohmann::json::parse(first.out)) << backend;
  }
}

TEST(Replay, ForwardReplaysADumpBitForBit) {
  TempDir tmp;
  const std::string model = " --model " + family_dir("mixtral") + " --ids 4,8,15,16,23,42";
  ASSERT_EQ(run_r3("forward -q" + model + " --dump " + tmp.path("a.safetensors")).exit_code, 0);
  const CommandResult r = run_r3("forward -q" + model + " --replay " + tmp.path("a.safetensors") + " --dump " +
                                 tmp.path("b.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto a = SafetensorsFile::open(tmp.path("a.safetensors")), b = SafetensorsFile::open(tmp.path("b.safetensors"));
  for (const std::string name : {"logits", "topk_ids", "topk_weights"}) {
    EXPECT_EQ(read_as_f64(*a, name), read_as_f64(*b, name)) << name;
  }
}

TEST(Replay, BadRoutingFilesAreClearErrors) {
  TempDir tmp;
  auto write = [&](const std::string& name, const nlohmann::json& j) {
    std::ofstream(tmp.path(name)) << j.dump();
    return tmp.path(name);
  };
  auto error_of = [&](const std::string& path) -> std::string {
    try {
      engine::load_routing_replay(path, 3, 2, 8);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const nlohmann::json row = {{0, 1}, {2, 3}, {4, 5}};
  EXPECT_EQ(error_of(write("ok.json", {row, row})), "");
  EXPECT_EQ(engine::load_routing_replay(write("obj.json", {{"routed_experts", {row}}}), 3, 2, 8).rows, 1);
  EXPECT_NE(error_of(write("layers.json", {{{0, 1}, {2, 3}}})).find("2 MoE layers, the model has 3"), std::string::npos);
  EXPECT_NE(error_of(write("topk.json", {{{0, 1, 2}, {2, 3, 4}, {4, 5, 6}}})).find("top-3, the model routes top-2"),
            std::string::npos);
  EXPECT_NE(error_of(write("range.json", {{{0, 8}, {2, 3}, {4, 5}}})).find("expert id 8 outside [0, 8)"),
            std::string::npos);
  EXPECT_NE(error_of(write("dup.json", {{{1, 1}, {2, 3}, {4, 5}}})).find("expert 1 appears twice"), std::string::npos);
  EXPECT_NE(error_of(write("ragged.json", {row, {{0, 1}}})).find("row 1 has 1 MoE layers"), std::string::npos);
  EXPECT_NE(error_of(write("empty.json", nlohmann::json::array())).find("non-empty"), std::string::npos);
  std::ofstream(tmp.path("bad.json")) << "[[[0, 1]";
  EXPECT_NE(error_of(tmp.path("bad.json")).find("malformed JSON"), std::string::npos);
  EXPECT_NE(error_of(tmp.path("missing.json")).find("cannot read"), std::string::npos);

  // Through the CLI: too few rows for the requested generation.
  const CommandResult r = run_r3("generate --model " + family_dir("qwen3_moe") + " --ids 1,2 --max-new-tokens 4 --replay " +
                                 tmp.path("ok.json"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("the replayed routing has 2 rows; a prompt of 2 tokens and 4 new tokens need 5"),
            std::string::npos) << r.err;
}

}  // namespace
}  // namespace r3::test
