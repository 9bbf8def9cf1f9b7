// Expert parallelism through the engine (EngineOptions::expert_parallel, `--ep N`; on the CPU N
// ranks as threads): every family's requests, spread over 2, 4 and 8 ranks, get the tokens and
// routed experts each gets alone on one rank, on every MoE path, with EPLB replicas and
// rebalancing between steps too; a rank that fails ends the step on every rank with its own
// error, and the group serves again after.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "models/registry.h"
#include "engine_checks.h"
#include "test_support.h"

namespace r3::test {
namespace {

using engine::Engine;
using engine::EngineOptions;
using engine::FinishReason;

// A family, and for DeepSeek-V4 whether its sequences must be split into steps alike (see
// test_engine.cpp's ServedFamily: V4's rows can depend on the split, never on the batch).
struct EpFamily {
  std::string family;
  bool v4 = false;
};

std::vector<ServingCase> ep_cases(const EngineOptions& base) {
  std::vector<ServingCase> cases;
  for (const auto& [name, ranks] : {std::pair{"2 ranks", 2}, {"4 ranks", 4}, {"8 ranks", 8}}) {
    EngineOptions o = base;
    o.expert_parallel = ranks;
    cases.push_back({name, o});
  }
  return cases;
}

class ExpertParallelServing : public testing::TestWithParam<EpFamily> {};

TEST_P(ExpertParallelServing, RequestsSpreadOverRanksGetWhatOneRankGivesThemAlone) {
  auto model = models::load_model(family_dir(GetParam().family));
  const auto prompts = engine_prompts(16, model->info().vocab_size, 5);
  std::vector<int64_t> max_new;
  for (std::size_t i = 0; i < prompts.size(); ++i) max_new.push_back(1 + static_cast<int64_t>(i % 6));
  EngineOptions base;
  if (GetParam().v4) {  // every sequence split into steps as it is alone
    base.scheduler.max_running = 32;
    base.scheduler.max_chunk = 5;
    base.scheduler.max_step_tokens = 32 * 5;
  }
  backend::Context ctx(2);
  expect_served_as_alone(*model, ctx, prompts, max_new, base, ep_cases(base));
}

INSTANTIATE_TEST_SUITE_P(Families, ExpertParallelServing,
                         testing::Values(EpFamily{"qwen3_moe"}, EpFamily{"qwen2_moe"}, EpFamily{"olmoe"},
                                         EpFamily{"mixtral"}, EpFamily{"gpt_oss"}, EpFamily{"glm4_moe"},
                                         EpFamily{"deepseek_v2"}, EpFamily{"deepseek_v3"},
                                         EpFamily{"deepseek_v4", true}, EpFamily{"kimi_linear"},
                                         EpFamily{"kimi_k3"}, EpFamily{"deepseek_v3_fp8"},
                                         EpFamily{"gpt_oss_mxfp4"}),
                         [](const testing::TestParamInfo<EpFamily>& f) { return f.param.family; });

// EPLB under expert parallelism: 8 replicas and a rebalance every 2 steps, planned from every
// rank's loads; each MoE path; outputs as one rank gives them alone, and the experts did move.
class ExpertParallelEplb : public testing::TestWithParam<std::string> {};

TEST_P(ExpertParallelEplb, RebalancingBetweenStepsChangesNoOutput) {
  models::LoadOptions options;
  options.moe_path = moe::parse_moe_path(GetParam());
  options.eplb.redundant_experts = 8;
  options.eplb.window_steps = 2;
  options.eplb.rebalance_every = 2;
  for (const char* family : {"qwen3_moe", "deepseek_v3"}) {
    SCOPED_TRACE(family);
    auto model = models::load_model(family_dir(family), options);
    const auto prompts = engine_prompts(12, model->info().vocab_size, 9);
    std::vector<int64_t> max_new;
    for (std::size_t i = 0; i < prompts.size(); ++i) max_new.push_back(2 + static_cast<int64_t>(i % 5));
    backend::Context ctx(2);
    expect_served_as_alone(*model, ctx, prompts, max_new, {}, ep_cases({}));
    for (moe::MoeBlock* block : model->moe_blocks()) EXPECT_GT(block->experts().placement_version(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, ExpertParallelEplb, testing::Values("modular", "mega", "monolithic"));

// Rank 0 (this thread) fails inside a MoE layer while the others wait for it in the layer's
// all-to-all: the step throws rank 0's own error, on every rank, and nobody hangs; the requests
// then end with the abort, and the group serves the next request as one rank does.
TEST(ExpertParallelEngine, ARankThatFailsEndsTheStepEverywhereAndTheGroupServesOn) {
  auto model = models::load_model(family_dir("qwen3_moe"));
  backend::Context ctx(2);
  EngineOptions options;
  options.expert_parallel = 4;
  Engine e(*model, ctx, options);
  const auto prompts = engine_prompts(8, model->info().vocab_size, 3);
  std::vector<engine::RequestId> ids;
  for (const auto& p : prompts) ids.push_back(e.submit(greedy_request(p, 4)));
  moe::PhysicalExperts& experts = model->moe_blocks().front()->experts();
  const std::thread::id rank0 = std::this_thread::get_id();
  experts.set_map_function([&](int32_t logical, int64_t, int64_t) -> int32_t {
    if (std::this_thread::get_id() == rank0) throw Error("injected failure");
    return logical;
  });
  EXPECT_EQ(error_of([&] { e.step(); }), "injected failure");
  experts.set_map_function({});
  for (const auto id : ids) e.abort(id, "the step failed");
  const EngineResults ended = engine_run_all(e);
  ASSERT_EQ(ended.size(), ids.size());
  for (const auto& [key, r] : ended) {
    EXPECT_EQ(r.finish, FinishReason::kAbort);
    EXPECT_EQ(r.abort_message, "the step failed");
  }
  EXPECT_EQ(e.stats().kv_blocks_free, e.stats().kv_blocks_total);
  Engine one(*model, ctx, {});
  EXPECT_EQ(run_one(e, greedy_request(prompts[2], 5)).tokens, run_one(one, greedy_request(prompts[2], 5)).tokens);
}

// A request goes to a rank with room in its waiting queue, the least busy of those; refused only
// when no rank has room. Here rank 0 holds one request of two samples (its queue of 2 is full)
// and rank 1 one of one sample: the next goes to rank 1, though both hold one request.
TEST(ExpertParallelEngine, RequestsGoToARankWithRoomInItsQueue) {
  auto model = models::load_model(family_dir("qwen3_moe"));
  backend::Context ctx(2);
  EngineOptions options;
  options.expert_parallel = 2;
  options.scheduler.max_waiting = 2;
  Engine e(*model, ctx, options);
  engine::RequestParams two = greedy_request({1, 2, 3}, 3);
  two.n = 2;
  e.submit(two);
  e.submit(greedy_request({4, 5}, 3));
  EXPECT_NO_THROW(e.submit(greedy_request({6, 7}, 3)));
  EXPECT_EQ(e.stats().waiting, 4);
  EXPECT_EQ(e.stats().max_batch_sequences, 0);
  EXPECT_EQ(error_of([&] { e.submit(greedy_request({8}, 3)); }),
            "the waiting queue is full (2 of 2 samples): retry later");
  EXPECT_EQ(engine_run_all(e).size(), 4u);  // every sample of the three requests
  EXPECT_EQ(e.stats().max_batch_sequences, 4);  // the group's first step ran all four samples
}

TEST(ExpertParallelEngine, RankCountsTheModelCannotSplitAreRefused) {
  auto model = models::load_model(family_dir("qwen3_moe"));  // 8 experts
  backend::Context ctx(2);
  EngineOptions options;
  options.expert_parallel = 9;
  EXPECT_EQ(error_of([&] { Engine e(*model, ctx, options); }),
            "--ep 9: each rank needs at least one of the 8 physical experts of a MoE layer");
  options.expert_parallel = 0;
  EXPECT_EQ(error_of([&] { Engine e(*model, ctx, options); }), "--ep must be in [1, 64], got 0");
}

// The command line: `--ep 4` prints what `--ep 1` prints, prompt by prompt, sampled with a seed
// too; a rollout of one rank replayed over four ranks reproduces it.
TEST(ExpertParallelEngine, GenerateWithRanksPrintsWhatOneRankPrints) {
  const std::string args = "generate -q --json --ignore-eos --max-new-tokens 5 --ids 3,17,42,99 --ids 5,6 --ids 7 "
                           "--model " + family_dir("deepseek_v3");
  const CommandResult one = run_r3(args);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const CommandResult four = run_r3(args + " --ep 4");
  ASSERT_EQ(four.exit_code, 0) << four.err;
  EXPECT_EQ(four.out, one.out);
  const CommandResult sampled = run_r3(args + " --temperature 0.9 --seed 5");
  ASSERT_EQ(sampled.exit_code, 0) << sampled.err;
  EXPECT_EQ(run_r3(args + " --temperature 0.9 --seed 5 --ep 3").out, sampled.out);
  TempDir tmp;
  const std::string one_prompt = "generate -q --json --max-new-tokens 6 --ids 3,17,42 --model " + family_dir("deepseek_v3");
  const CommandResult rollout = run_r3(one_prompt);
  ASSERT_EQ(rollout.exit_code, 0) << rollout.err;
  std::ofstream(tmp.path("run.json")) << rollout.out;
  const CommandResult replayed = run_r3(one_prompt + " --ep 4 --replay " + tmp.path("run.json"));
  ASSERT_EQ(replayed.exit_code, 0) << replayed.err;
  EXPECT_EQ(replayed.out, rollout.out);
  const CommandResult bad = run_r3(args + " --ep 17");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--ep 17: each rank needs at least one of the 16 physical experts"), std::string::npos)
      << bad.err;
}

}  // namespace
}  // namespace r3::test
