// EPLB on the GPU: replicas and rebalancing with the map and the load counts on the device give
// the CPU's tokens, routed experts and, step after step, the CPU's placements (which are planned
// from the counted loads, so equal placements mean equal counts); and capture happens before the
// map, as on the CPU (tests/test_moe_paths.cpp's CaptureOrder): with the map replaced by one that
// throws, the step fails and the capture buffer already holds that layer's logical ids.
#include <gtest/gtest.h>

#include "backend/context.h"
#include "engine/engine.h"
#include "engine/step_runner.h"
#include "models/device_decoder.h"
#include "models/registry.h"
#include "engine_checks.h"
#include "reference_checks.h"
#include "test_support.h"

namespace r3::test {
namespace {

moe::EplbOptions replicas_rebalanced_every_step() {
  moe::EplbOptions eplb;
  eplb.redundant_experts = 3;
  eplb.rebalance_every = 1;
  eplb.window_steps = 4;
  return eplb;
}

std::unique_ptr<models::CausalLM> load_with(const std::string& family, const moe::EplbOptions& eplb) {
  models::LoadOptions options;
  options.eplb = eplb;
  return models::load_model(family_dir(family), options);
}

std::vector<std::vector<int32_t>> placements(models::CausalLM& model) {
  std::vector<std::vector<int32_t>> all;
  for (moe::MoeBlock* block : model.moe_blocks()) all.push_back(block->experts().placement().physical_to_logical());
  return all;
}

TEST(GpuEplb, ReplicasAndRebalancingGiveTheCpusTokensRoutingAndPlacements) {
  for (const std::string family : {"qwen3_moe", "deepseek_v3", "gpt_oss", "kimi_k3"}) {
    SCOPED_TRACE(family);
    auto cpu_model = load_with(family, replicas_rebalanced_every_step());
    backend::Context cpu(2);
    auto gpu = backend::Context::cuda(0);
    auto gpu_model = models::place_on_device(*gpu, load_with(family, replicas_rebalanced_every_step()), DType::F32);
    const auto prompts = engine_prompts(12, cpu_model->info().vocab_size, 3);
    engine::EngineOptions options;
    options.scheduler.max_running = 5;  // requests come and go: steps of changing sizes
    engine::Engine on_cpu(*cpu_model, cpu, options), on_gpu(*gpu_model, *gpu, options);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      on_cpu.submit(greedy_request(prompts[i], 3 + static_cast<int64_t>(i % 5)));
      on_gpu.submit(greedy_request(prompts[i], 3 + static_cast<int64_t>(i % 5)));
    }
    const EngineResults want = engine_run_all(on_cpu), got = engine_run_all(on_gpu);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [id, result] : want) {
      EXPECT_EQ(got.at(id).tokens, result.tokens) << "request " << id.first << " sample " << id.second;
      EXPECT_EQ(got.at(id).routed, result.routed) << "request " << id.first << " sample " << id.second;
    }
    EXPECT_GT(on_gpu.stats().steps, 5);
    const auto cpu_placements = placements(*cpu_model), gpu_placements = placements(*gpu_model);
    EXPECT_EQ(gpu_placements, cpu_placements);
    // The placements moved: rebalancing ran from the counted loads.
    auto initial = load_with(family, replicas_rebalanced_every_step());
    EXPECT_NE(gpu_placements, placements(*initial));
  }
}

// The rows a GPU step of `ids` captures, [T, layers, k], with the step runner's capture.
std::vector<int32_t> gpu_rows(models::CausalLM& model, backend::Context& gpu, const std::vector<int32_t>& ids) {
  auto cache = model.make_cache(1, static_cast<int64_t>(ids.size()));
  engine::StepRunner runner(model, gpu, *cache, static_cast<int64_t>(ids.size()));
  engine::RoutedExperts routed(static_cast<int64_t>(model.info().moe_layers.size()), model.info().top_k);
  runner.run({{0, ids, &routed, {}}});
  return routed.flat();
}

void expect_capture_before_map(const std::string& family, int64_t layer, const moe::EplbOptions& eplb) {
  SCOPED_TRACE(family + " layer " + std::to_string(layer) + " redundant experts " +
               std::to_string(eplb.redundant_experts));
  auto gpu = backend::Context::cuda(0);
  auto model = models::place_on_device(*gpu, load_with(family, eplb), DType::F32);
  const int64_t layers = static_cast<int64_t>(model->info().moe_layers.size()), k = model->info().top_k;
  const Reference ref = load_reference(family, 0);
  const std::vector<int32_t> ids(ref.input_ids.begin(), ref.input_ids.end() - 1);
  const std::vector<int32_t> expected = gpu_rows(*model, *gpu, ids);
  model->moe_blocks()[static_cast<std::size_t>(layer)]->experts().set_map_function(
      [](int32_t, int64_t, int64_t) -> int32_t { throw Error("EPLB map called"); });
  auto cache = model->make_cache(1, static_cast<int64_t>(ids.size()));
  engine::StepRunner runner(*model, *gpu, *cache, static_cast<int64_t>(ids.size()));
  EXPECT_THROW(runner.run({{0, ids, nullptr, {}}}), Error);
  expect_captured_before_the_failed_map(runner.capturer(), layer, expected, layers, k);
}

TEST(GpuCaptureOrder, CaptureHoldsLogicalIdsBeforeTheEplbMapRuns) {
  for (const std::string family : {"qwen3_moe", "deepseek_v3", "kimi_k3"}) {
    for (const int64_t layer : {0, 1}) {  // MoE layer indices (DeepSeek-V3's first layer is dense)
      expect_capture_before_map(family, layer, {});
      expect_capture_before_map(family, layer, replicas_rebalanced_every_step());
    }
  }
}

}  // namespace
}  // namespace r3::test
