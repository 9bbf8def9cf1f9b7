// Routing margins (moe/routing_rule.h) through the engine: against margins recomputed in float64
// from the Hugging Face reference's router logits (the softmax top-k families on probabilities,
// GPT-OSS on raw logits); never negative on a scored row; NaN on replayed rows; and the rows a
// prefix-cache hit restores carry the margins they were computed with.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "engine/engine.h"
#include "models/registry.h"
#include "engine_checks.h"
#include "test_support.h"

namespace r3::test {
namespace {

// The sample's margins [rows, MoE layers] after running `p` alone.
std::vector<float> margins_of(engine::Engine& e, engine::RequestParams p) {
  p.return_routing_margins = true;
  return run_one(e, p).margins;
}

// Float64 margin of one reference row: `scores` of every expert, top `k`.
double reference_margin(std::vector<double> scores, int64_t k) {
  std::sort(scores.begin(), scores.end(), std::greater<>());
  return scores[static_cast<std::size_t>(k - 1)] - scores[static_cast<std::size_t>(k)];
}

void expect_margins_match_reference(const std::string& family, bool softmax_scores) {
  for (const int index : {0, 1}) {
    SCOPED_TRACE(family + " sequence " + std::to_string(index));
    const Reference ref = load_reference(family, index);
    auto model = models::load_model(family_dir(family));
    backend::Context ctx(2);
    engine::Engine e(*model, ctx);
    const std::vector<int32_t> prompt(ref.input_ids.begin(), ref.input_ids.begin() + ref.prompt_len);
    const std::vector<float> margins =
        margins_of(e, greedy_request(prompt, static_cast<int64_t>(ref.generated.size())));
    ASSERT_EQ(static_cast<int64_t>(margins.size()), ref.tokens * ref.layers);
    for (int64_t t = 0; t < ref.tokens; ++t) {
      for (int64_t l = 0; l < ref.layers; ++l) {
        const double* logits = ref.router_logits.data() + (t * ref.layers + l) * ref.experts;
        std::vector<double> scores(logits, logits + ref.experts);
        if (softmax_scores) {
          const double top = *std::max_element(scores.begin(), scores.end());
          double z = 0;
          for (double& v : scores) z += (v = std::exp(v - top));
          for (double& v : scores) v /= z;
        }
        const double want = reference_margin(scores, ref.top_k);
        const float got = margins[static_cast<std::size_t>(t * ref.layers + l)];
        EXPECT_NEAR(got, want, 1e-4 * std::max(1.0, std::abs(want))) << "row " << t << " MoE layer " << l;
      }
    }
  }
}

TEST(RoutingMargins, SoftmaxFamiliesMatchTheReferenceRouterLogits) {
  for (const std::string family : {"qwen3_moe", "qwen2_moe", "mixtral", "olmoe"}) {
    expect_margins_match_reference(family, true);
  }
}

TEST(RoutingMargins, GptOssMatchesTheReferenceRouterLogits) { expect_margins_match_reference("gpt_oss", false); }

TEST(RoutingMargins, EveryFamilyScoredRowsAreNotNegativeAndReplayedRowsHaveNone) {
  for (const std::string family : {"qwen3_moe", "mixtral", "deepseek_v2", "deepseek_v3", "glm4_moe", "gpt_oss"}) {
    SCOPED_TRACE(family);
    auto model = models::load_model(family_dir(family));
    backend::Context ctx(2);
    engine::Engine e(*model, ctx);
    const std::vector<int32_t> prompt = {5, 9, 2, 7, 1};
    engine::RequestParams free_run = greedy_request(prompt, 4);
    free_run.return_routed_experts = true;
    free_run.return_routing_margins = true;
    const EngineResult last = run_one(e, free_run);
    ASSERT_EQ(last.margins.size(), static_cast<std::size_t>(last.routed_rows) * model->info().moe_layers.size());
    for (const float m : last.margins) EXPECT_GE(m, 0.0f);
    // Replay the prompt's rows: those rows were forced, not chosen.
    engine::RequestParams replay = greedy_request(prompt, 1);
    const auto per_row = static_cast<std::size_t>(model->info().moe_layers.size() * model->info().top_k);
    replay.forced_routing.assign(last.routed.begin(),
                                 last.routed.begin() + static_cast<std::ptrdiff_t>(prompt.size() * per_row));
    const std::vector<float> replayed = margins_of(e, replay);
    ASSERT_EQ(replayed.size(), prompt.size() * model->info().moe_layers.size());
    for (const float m : replayed) EXPECT_TRUE(std::isnan(m));
  }
}

TEST(RoutingMargins, APrefixCacheHitReturnsTheMarginsOfAColdRun) {
  auto model = models::load_model(family_dir("qwen3_moe"));
  backend::Context ctx(2);
  engine::EngineOptions options;
  options.block_size = 4;
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 13; ++i) prompt.push_back(3 + 7 * i % 300);
  engine::Engine cold(*model, ctx, options);
  const std::vector<float> want = margins_of(cold, greedy_request(prompt, 3));
  engine::Engine warm(*model, ctx, options);
  margins_of(warm, greedy_request(prompt, 1));  // fills the prefix cache
  const int64_t hits_before = warm.stats().prefix_blocks_hit;
  const std::vector<float> got = margins_of(warm, greedy_request(prompt, 3));
  EXPECT_GT(warm.stats().prefix_blocks_hit, hits_before);
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace r3::test
