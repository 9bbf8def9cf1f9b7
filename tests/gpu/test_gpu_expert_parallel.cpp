// Expert parallelism on the GPU (engine/engine.h with a PlaceRank; moe/ep's dispatcher over the
// in-process transport, the device MoE layer dispatching through it): ranks that share one GPU,
// each with its own placed model, give every request the tokens and routed experts one rank gives
// it. Batch-invariant contexts on both sides, since the ranks' steps hold other requests than one
// rank's steps; the ranks' experts run on the rows kernels, which one rank takes under batch
// invariance too.
#include <gtest/gtest.h>

#include <string>

#include "backend/context.h"
#include "engine/engine.h"
#include "models/device_decoder.h"
#include "models/registry.h"
#include "engine_checks.h"
#include "test_support.h"

namespace r3::test {
namespace {

engine::PlacedRank placed_on_gpu0(const std::string& family) {
  engine::PlacedRank placed;
  placed.ctx = backend::Context::cuda(0);
  placed.ctx->set_batch_invariant(true);
  placed.model = models::place_on_device(*placed.ctx, models::load_model(family_dir(family)), DType::F32);
  return placed;
}

TEST(GpuExpertParallel, RanksSharingAGpuGiveOneRanksTokensAndRoutedExperts) {
  for (const std::string family : {"qwen3_moe", "deepseek_v3", "gpt_oss", "kimi_k3"}) {
    engine::PlacedRank one = placed_on_gpu0(family);
    const auto prompts = engine_prompts(10, one.model->info().vocab_size, 5);
    engine::EngineOptions options;
    options.scheduler.max_running = 4;  // requests come and go: steps of changing sizes
    engine::Engine alone(*one.model, *one.ctx, options);
    for (std::size_t i = 0; i < prompts.size(); ++i) alone.submit(greedy_request(prompts[i], 2 + static_cast<int64_t>(i % 4)));
    const EngineResults want = engine_run_all(alone);
    for (const int ranks : {2, 4}) {
      SCOPED_TRACE(family + ", " + std::to_string(ranks) + " ranks");
      engine::PlacedRank first = placed_on_gpu0(family);
      engine::EngineOptions o = options;
      o.expert_parallel = ranks;
      engine::Engine group(*first.model, *first.ctx, o, [&](int) { return placed_on_gpu0(family); });
      for (std::size_t i = 0; i < prompts.size(); ++i) group.submit(greedy_request(prompts[i], 2 + static_cast<int64_t>(i % 4)));
      const EngineResults got = engine_run_all(group);
      ASSERT_EQ(got.size(), want.size());
      for (const auto& [id, result] : want) {
        EXPECT_EQ(got.at(id).tokens, result.tokens) << "request " << id.first << " sample " << id.second;
        EXPECT_EQ(got.at(id).routed, result.routed) << "request " << id.first << " sample " << id.second;
      }
      EXPECT_GT(group.stats().expert_rows_exchanged, 0);  // pairs did travel between the ranks
    }
  }
}

TEST(GpuExpertParallel, GpuRanksNeedAPlacementAndRefuseEplbForNow) {
  engine::PlacedRank one = placed_on_gpu0("qwen3_moe");
  engine::EngineOptions options;
  options.expert_parallel = 2;
  EXPECT_THROW(engine::Engine(*one.model, *one.ctx, options), Error);  // no place_rank
  models::LoadOptions with_replicas;
  with_replicas.eplb.redundant_experts = 2;
  auto gpu = backend::Context::cuda(0);
  auto balanced = models::place_on_device(*gpu, models::load_model(family_dir("qwen3_moe"), with_replicas), DType::F32);
  EXPECT_THROW(engine::Engine(*balanced, *gpu, options, [](int) { return placed_on_gpu0("qwen3_moe"); }), Error);
}

}  // namespace
}  // namespace r3::test
