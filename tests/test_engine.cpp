// The serving engine: every request's tokens and routed experts are bit-identical whether it runs
// alone or with others, with small prefill chunks, with prefix caching on or off and under
// preemption; the prefix cache reuses blocks and returns the rows computed with them; sampling
// repeats with a seed whatever the batch; every KV block comes back.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "engine/engine.h"
#include "engine/generator.h"
#include "models/registry.h"
#include "engine_checks.h"
#include "test_support.h"

namespace r3::test {
namespace {

using engine::Engine;
using engine::EngineOptions;
using engine::FinishReason;
using engine::RequestId;
using engine::RequestParams;

// A family, and for DeepSeek-V4 the longest sequence (prompt + outputs) whose rows cannot depend on
// how its prompt was split into steps. V4's indexer picks the top index_topk compressed entries
// the way PyTorch's CPU top-k does over every entry present when the step runs (the reference
// does the same, and HF parity needs it); which of several equal scores it keeps depends on how
// many entries are present, so a row of a compressed-sparse-attention layer at position p can
// differ between two different splits of the same sequence once more than index_topk entries are
// complete (p + 1 >= csa_rate * (index_topk + 1)) and its scores tie at the k-th place; every
// later row of that sequence can then differ too. Below that length every split gives the same
// bits, and at any length the split alone decides: other sequences in the batch never do.
struct ServedFamily {
  std::string family;
  int64_t v4_split_free_tokens = 0;  // 0: not V4, every row is split-independent
};

class EngineServing : public testing::TestWithParam<ServedFamily> {};

TEST_P(EngineServing, EachRequestIsBitIdenticalAloneAndUnderServing) {
  auto model = models::load_model(family_dir(GetParam().family));
  const int64_t vocab = model->info().vocab_size;
  const auto prompts = engine_prompts(32, vocab, 7);
  std::vector<int64_t> max_new;
  for (std::size_t i = 0; i < prompts.size(); ++i) max_new.push_back(1 + static_cast<int64_t>(i % 8));
  if (GetParam().v4_split_free_tokens == 0) {
    backend::Context served(2);
    expect_served_as_alone(*model, served, prompts, max_new, {}, serving_cases());
    // Alone through the engine equals the single-sequence generator (the parity-tested path).
    backend::Context ctx(2);
    Engine e(*model, ctx, {});
    e.submit(greedy_request(prompts[5], max_new[5]));
    const EngineResult alone = engine_run_all(e).begin()->second;
    engine::GenerateOptions g;
    g.max_new_tokens = max_new[5];
    const auto generated = engine::generate(*model, ctx, prompts[5], g);
    EXPECT_EQ(generated.output_ids, alone.tokens);
    EXPECT_EQ(generated.routed_experts.flat(), alone.routed);
    return;
  }
  // V4, long sequences: batched with others, each sequence split the same way as alone (chunks
  // of 5 and a budget that never cuts one short).
  EngineOptions same_split;
  same_split.scheduler.max_running = 32;
  same_split.scheduler.max_chunk = 5;
  same_split.scheduler.max_step_tokens = 32 * 5;
  backend::Context served(2);
  expect_served_as_alone(*model, served, prompts, max_new, same_split, {{"batched, same splits", same_split}});
  // V4, sequences short enough that no split can change a row: every serving case.
  std::vector<std::vector<int32_t>> short_prompts;
  std::vector<int64_t> short_max_new;
  std::mt19937 rng(11);
  const int64_t total = GetParam().v4_split_free_tokens;
  for (int i = 0; i < 32; ++i) {
    const int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(total - 1));
    std::vector<int32_t> p;
    for (int64_t t = 0; t < len; ++t) p.push_back(static_cast<int32_t>(rng() % vocab));
    short_prompts.push_back(std::move(p));
    short_max_new.push_back(1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(total - len)));
  }
  auto cases = serving_cases();
  for (auto& c : cases) {
    c.options.scheduler.max_chunk = std::min<int64_t>(c.options.scheduler.max_chunk == 0 ? 8 : c.options.scheduler.max_chunk, 2);
    if (std::string(c.name) == "preemption") c.options.kv_blocks = 6;  // 24 positions for 32 requests
  }
  expect_served_as_alone(*model, served, short_prompts, short_max_new, {}, cases);
}

// V4's split-free lengths: csa_rate * (index_topk + 1) positions (see ServedFamily): rate 4 and
// top-3 (deepseek_v4, deepseek_v4_yarn), rate 2 and top-2 (deepseek_v4_alt).
std::vector<ServedFamily> engine_families() {
  return {{"qwen3_moe"}, {"qwen2_moe"}, {"olmoe"}, {"mixtral"}, {"gpt_oss"}, {"glm4_moe"}, {"deepseek_v2"},
          {"deepseek_v3"}, {"deepseek_v4", 16}, {"deepseek_v4_alt", 6}, {"deepseek_v4_yarn", 16}, {"kimi_linear"}, {"kimi_linear_alt"},
          {"kimi_k3"}, {"kimi_k3_alt"}, {"deepseek_v3_fp8"}, {"qwen3_moe_fp8"}, {"kimi_linear_fp8"},
          {"deepseek_v4_fp8", 16},
          {"gpt_oss_mxfp4"}};
}

INSTANTIATE_TEST_SUITE_P(Families, EngineServing, testing::ValuesIn(engine_families()),
                         [](const testing::TestParamInfo<ServedFamily>& family) { return family.param.family; });

TEST(EnginePrefixCache, SharedPrefixBlocksAreReusedWithTheirRows) {
  auto model = models::load_model(family_dir("qwen3_moe"));
  backend::Context ctx(2);
  EngineOptions options;
  options.block_size = 16;
  std::vector<int32_t> prefix;
  for (int i = 0; i < 48; ++i) prefix.push_back((i * 37 + 11) % 300);
  std::vector<int32_t> first = prefix, second = prefix;
  first.insert(first.end(), {5, 6, 7});
  second.insert(second.end(), {9, 8});

  Engine warm(*model, ctx, options);
  warm.submit(greedy_request(first, 4));
  engine_run_all(warm);
  const auto before = warm.stats();
  warm.submit(greedy_request(second, 4));
  const EngineResult hit = engine_run_all(warm).begin()->second;
  const auto after = warm.stats();
  EXPECT_EQ(after.prefix_blocks_hit - before.prefix_blocks_hit, 3);
  EXPECT_EQ(hit.cached_prompt_tokens, 48);
  // Only the 2 new prompt tokens ran as prompt work; the rest were decodes.
  EXPECT_EQ(after.prompt_tokens_computed - before.prompt_tokens_computed, 2);

  EngineOptions cold_options = options;
  cold_options.prefix_caching = false;
  Engine cold(*model, ctx, cold_options);
  cold.submit(greedy_request(second, 4));
  const EngineResult fresh = engine_run_all(cold).begin()->second;
  EXPECT_EQ(fresh.cached_prompt_tokens, 0);
  EXPECT_EQ(hit.tokens, fresh.tokens);
  EXPECT_EQ(hit.routed, fresh.routed);  // the cached rows are the ones a cold run computes
  EXPECT_EQ(warm.stats().kv_blocks_free, warm.stats().kv_blocks_total);
}

TEST(EnginePrefixCache, DeepseekV4SaysWhyItIsOff) {
  auto model = models::load_model(family_dir("deepseek_v4"));
  backend::Context ctx(1);
  Engine e(*model, ctx, {});
  EXPECT_FALSE(e.options().prefix_caching);
  EXPECT_NE(e.prefix_caching_off_reason().find("DeepSeek-V4"), std::string::npos) << e.prefix_caching_off_reason();
}

TEST(EngineSampling, SeededSamplesRepeatWhateverTheBatch) {
  auto model = models::load_model(family_dir("qwen3_moe"));
  backend::Context ctx(2);
  RequestParams p = greedy_request({3, 1, 4, 1, 5}, 12);
  p.sampling.temperature = 0.9;
  p.sampling.seed = 1234;
  p.n = 4;
  Engine alone(*model, ctx, {});
  alone.submit(p);
  const EngineResults a = engine_run_all(alone);
  Engine busy(*model, ctx, {});
  for (const auto& other : engine_prompts(8, model->info().vocab_size, 3)) busy.submit(greedy_request(other, 5));
  const RequestId id = busy.submit(p);
  const EngineResults b = engine_run_all(busy);
  std::set<std::vector<int32_t>> distinct;
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(a.at({0, i}).tokens, b.at({id, i}).tokens) << "sample " << i;
    EXPECT_EQ(a.at({0, i}).routed, b.at({id, i}).routed) << "sample " << i;
    distinct.insert(a.at({0, i}).tokens);
  }
  EXPECT_EQ(distinct.size(), 4u) << "n samples of one seed must differ";
}

TEST(EngineSampling, GreedyLogprobIsTheRowMaximumAndTopKOneIsGreedy) {
  auto model = models::load_model(family_dir("qwen3_moe"));
  backend::Context ctx(2);
  RequestParams greedy = greedy_request({17, 42, 7}, 6);
  greedy.logprobs = 3;
  RequestParams top1 = greedy;
  top1.sampling.temperature = 1.5;
  top1.sampling.top_k = 1;
  Engine e(*model, ctx, {});
  const RequestId g = e.submit(greedy), t = e.submit(top1);
  const EngineResults r = engine_run_all(e);
  const EngineResult& gr = r.at({g, 0});
  EXPECT_EQ(r.at({t, 0}).tokens, gr.tokens);
  ASSERT_EQ(gr.logprobs.size(), gr.tokens.size());
  ASSERT_EQ(gr.top.size(), gr.tokens.size());
  for (std::size_t i = 0; i < gr.tokens.size(); ++i) {
    ASSERT_EQ(gr.top[i].size(), 3u);
    EXPECT_EQ(gr.top[i][0].token, gr.tokens[i]);
    EXPECT_EQ(gr.top[i][0].logprob, gr.logprobs[i]);
    EXPECT_GE(gr.top[i][0].logprob, gr.top[i][1].logprob);
    EXPECT_LE(gr.logprobs[i], 0.0f);
  }
}

TEST(EngineSampling, PromptLogprobsFollowTheirPrefix) {
  auto model = models::load_model(family_dir("qwen3_moe"));
  backend::Context ctx(2);
  // The log-probability of prompt token i+1 is that of a greedy/logprob run whose prompt ends at i.
  const std::vector<int32_t> prompt = {17, 42, 7, 99, 3};
  RequestParams p = greedy_request(prompt, 1);
  p.prompt_logprobs = true;
  EngineOptions options;
  options.scheduler.max_chunk = 2;  // the prompt spans three steps
  Engine e(*model, ctx, options);
  e.submit(p);
  std::vector<float> prompt_lp;
  while (e.has_work()) {
    for (const auto& out : e.step()) prompt_lp.insert(prompt_lp.end(), out.prompt_logprobs.begin(), out.prompt_logprobs.end());
  }
  ASSERT_EQ(prompt_lp.size(), prompt.size() - 1);
  for (std::size_t i = 0; i + 1 < prompt.size(); ++i) {
    RequestParams q = greedy_request({prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(i) + 1}, 1);
    q.logprobs = static_cast<int64_t>(model->info().vocab_size);
    Engine one(*model, ctx, {});
    one.submit(q);
    const EngineResult r = engine_run_all(one).begin()->second;
    float expected = NAN;
    for (const auto& t : r.top[0]) {
      if (t.token == prompt[i + 1]) expected = t.logprob;
    }
    EXPECT_EQ(prompt_lp[i], expected) << "prompt token " << i + 1;
  }
}

TEST(EngineResources, AbortAndQueueBound) {
  auto model = models::load_model(family_dir("qwen3_moe"));
  backend::Context ctx(2);
  EngineOptions options;
  options.scheduler.max_waiting = 3;
  options.scheduler.max_running = 2;
  Engine e(*model, ctx, options);
  const RequestId a = e.submit(greedy_request({1, 2, 3}, 50));
  e.submit(greedy_request({4, 5}, 50));
  e.submit(greedy_request({6}, 50));
  EXPECT_EQ(error_of([&] { e.submit(greedy_request({7}, 5)); }),
            "the waiting queue is full (3 of 3 samples): retry later");
  e.step();  // two admitted
  e.step();
  e.abort(a, "client went away");
  bool seen = false;
  for (const auto& out : e.step()) {
    if (out.id != a) continue;
    ASSERT_EQ(out.samples.size(), 1u);
    EXPECT_EQ(out.samples[0].finish, FinishReason::kAbort);
    EXPECT_EQ(out.samples[0].abort_message, "client went away");
    EXPECT_TRUE(out.finished);
    seen = true;
  }
  EXPECT_TRUE(seen);
  engine_run_all(e);
  EXPECT_EQ(e.stats().kv_blocks_free, e.stats().kv_blocks_total);
  EXPECT_EQ(e.stats().running + e.stats().waiting, 0);
}

TEST(EngineResources, BadRequestsAreRefusedWithAReason) {
  auto model = models::load_model(family_dir("qwen3_moe"));
  backend::Context ctx(1);
  Engine e(*model, ctx, {});
  EXPECT_EQ(error_of([&] { e.submit(greedy_request({}, 5)); }), "the prompt is empty");
  EXPECT_EQ(error_of([&] { e.submit(greedy_request({1, 320}, 5)); }),
            "prompt token id 320 is outside the vocabulary [0, 320)");
  EXPECT_EQ(error_of([&] { e.submit(greedy_request({1, 2}, 255)); }),
            "the prompt has 2 tokens and max new tokens is 255: more than the max model length of 256 positions");
  EXPECT_FALSE(e.has_work());
}


// A stop id ends the sample with kStop naming it; routed experts from a start row are the tail
// of the full rows.
TEST(EngineRequests, StopIdsAndRoutedExpertsStart) {
  auto model = models::load_model(family_dir("qwen3_moe"));
  backend::Context ctx(2);
  const std::vector<int32_t> prompt = {17, 42, 7};
  Engine free_run(*model, ctx, {});
  free_run.submit(greedy_request(prompt, 8));
  const EngineResult full = engine_run_all(free_run).begin()->second;
  ASSERT_EQ(full.tokens.size(), 8u);
  // Stop at the first token that appears at output index >= 2 for the first time.
  std::size_t at = 2;
  while (std::find(full.tokens.begin(), full.tokens.begin() + static_cast<std::ptrdiff_t>(at), full.tokens[at]) !=
         full.tokens.begin() + static_cast<std::ptrdiff_t>(at)) {
    ++at;
    ASSERT_LT(at, full.tokens.size()) << "no fresh token to stop at";
  }
  RequestParams p = greedy_request(prompt, 8);
  p.stop_token_ids = {full.tokens[at]};
  p.routed_experts_start = 2;
  Engine e(*model, ctx, {});
  const RequestId id = e.submit(p);
  const EngineResults results = engine_run_all(e);
  ASSERT_EQ(results.size(), 1u);
  const EngineResult& stopped = results.at({id, 0});
  EXPECT_EQ(stopped.finish, FinishReason::kStop);
  EXPECT_EQ(stopped.matched_stop, full.tokens[at]);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + static_cast<std::ptrdiff_t>(at) + 1));
  const int64_t rows = static_cast<int64_t>(prompt.size() + at + 1) - 1;  // prompt + outputs - 1
  EXPECT_EQ(stopped.routed_rows, rows - 2);
  const auto per_row = static_cast<std::ptrdiff_t>(model->info().moe_layers.size()) * model->info().top_k;
  EXPECT_EQ(stopped.routed,
            std::vector<int32_t>(full.routed.begin() + 2 * per_row, full.routed.begin() + rows * per_row));
}


// Replay under serving: a request that replays another's captured routing, batched with free
// requests, in small chunks and under preemption, reproduces that request's tokens and rows.
TEST(EngineReplay, ReplayedRequestsReproduceTheirRunUnderServing) {
  for (const std::string family : {"qwen3_moe", "deepseek_v3", "gpt_oss"}) {
    SCOPED_TRACE(family);
    auto model = models::load_model(family_dir(family));
    backend::Context ctx(2);
    const auto prompts = engine_prompts(6, model->info().vocab_size, 21);
    std::vector<EngineResult> originals;
    for (const auto& p : prompts) {
      Engine e(*model, ctx, {});
      e.submit(greedy_request(p, 6));
      originals.push_back(engine_run_all(e).begin()->second);
    }
    EngineOptions busy;
    busy.block_size = 4;
    busy.kv_blocks = 20;
    busy.scheduler.max_chunk = 3;
    Engine e(*model, ctx, busy);
    std::vector<RequestId> replays;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      RequestParams replay = greedy_request(prompts[i], 6);
      replay.forced_routing = originals[i].routed;
      replays.push_back(e.submit(replay));
      e.submit(greedy_request(engine_prompts(1, model->info().vocab_size, 100 + static_cast<uint32_t>(i))[0], 4));
    }
    const EngineResults results = engine_run_all(e);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      const EngineResult& r = results.at({replays[i], 0});
      EXPECT_EQ(r.finish, FinishReason::kLength) << r.abort_message;
      EXPECT_EQ(r.tokens, originals[i].tokens) << "request " << i;
      EXPECT_EQ(r.routed, originals[i].routed) << "request " << i;
    }
    EXPECT_GT(e.stats().preemptions, 0);
    EXPECT_EQ(e.stats().kv_blocks_free, e.stats().kv_blocks_total);
  }
}


// Aborting a request that waits for admission (while the running ones preempt each other) ends it at
// the next step with kAbort; the others finish as they would have; every block comes back.
TEST(EngineResources, AbortWhileWaitingAmidPreemption) {
  auto model = models::load_model(family_dir("qwen3_moe"));
  backend::Context ctx(2);
  EngineOptions options;
  options.scheduler.max_running = 2;
  options.block_size = 4;
  options.kv_blocks = 7;  // 28 positions: a and b need 14 each by the end, so growth preempts
  Engine e(*model, ctx, options);
  const RequestId a = e.submit(greedy_request({1, 2, 3, 4, 5}, 9));
  const RequestId b = e.submit(greedy_request({6, 7, 8, 9, 10}, 9));
  const RequestId c = e.submit(greedy_request({11, 12}, 3));
  e.step();
  e.abort(c, "never ran");
  const EngineResults finals = engine_run_all(e);
  ASSERT_EQ(finals.size(), 3u);
  EXPECT_EQ(finals.at({c, 0}).finish, FinishReason::kAbort);
  EXPECT_EQ(finals.at({c, 0}).abort_message, "never ran");
  EXPECT_TRUE(finals.at({c, 0}).tokens.empty());
  EXPECT_EQ(finals.at({a, 0}).finish, FinishReason::kLength);
  EXPECT_EQ(finals.at({b, 0}).finish, FinishReason::kLength);
  EXPECT_GT(e.stats().preemptions, 0);
  EXPECT_EQ(e.stats().kv_blocks_free, e.stats().kv_blocks_total);
}

}  // namespace
}  // namespace r3::test
