#include "engine_checks.h"

#include <random>

namespace r3::test {

using engine::Engine;
using engine::EngineOptions;
using engine::FinishReason;
using engine::RequestId;
using engine::RequestParams;

// Runs the engine until every request has finished, gathering the streamed outputs.
EngineResults engine_run_all(Engine& e) {
  EngineResults results;
  for (int guard = 0; e.has_work(); ++guard) {
    EXPECT_LT(guard, 100000) << "the engine made no progress";
    if (guard >= 100000) break;
    for (const auto& out : e.step()) {
      for (const auto& s : out.samples) {
        EngineResult& r = results[{out.id, s.index}];
        r.tokens.insert(r.tokens.end(), s.token_ids.begin(), s.token_ids.end());
        r.logprobs.insert(r.logprobs.end(), s.logprobs.begin(), s.logprobs.end());
        r.top.insert(r.top.end(), s.top_logprobs.begin(), s.top_logprobs.end());
        if (s.finish != FinishReason::kNone) {
          EXPECT_EQ(r.finish, FinishReason::kNone) << "finished twice";
          r.finish = s.finish;
          r.routed = s.routed_experts;
          r.routed_rows = s.routed_rows;
          r.margins = s.routing_margins;
          r.matched_stop = s.matched_stop;
          r.cached_prompt_tokens = s.cached_prompt_tokens;
          r.abort_message = s.abort_message;
        }
      }
    }
  }
  return results;
}

// Prompts of random lengths in [1, 40], half of them starting with a shared 20-token prefix.
EngineResult run_one(engine::Engine& e, const engine::RequestParams& p) {
  const engine::RequestId id = e.submit(p);
  return engine_run_all(e).at({id, 0});
}

std::vector<std::vector<int32_t>> engine_prompts(int count, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> shared(20);
  for (auto& t : shared) t = static_cast<int32_t>(rng() % vocab);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < count; ++i) {
    const int len = 1 + static_cast<int>(rng() % 40);
    std::vector<int32_t> p;
    if (i % 2 == 1) p = shared;
    while (static_cast<int>(p.size()) < len + (i % 2 == 1 ? 20 : 0)) p.push_back(static_cast<int32_t>(rng() % vocab));
    prompts.push_back(std::move(p));
  }
  return prompts;
}

RequestParams greedy_request(std::vector<int32_t> prompt, int64_t max_new) {
  RequestParams p;
  p.prompt = std::move(prompt);
  p.max_new_tokens = max_new;
  p.ignore_eos = true;
  p.return_routed_experts = true;
  return p;
}

// Built as one initializer list: GCC 13 reports a false stringop-overflow on push_back of this
// struct at -O3 (the GPU machine's compiler), which -Werror turns into a failed build.
std::vector<ServingCase> serving_cases() {
  EngineOptions batched;
  batched.scheduler.max_running = 32;
  EngineOptions chunked = batched;
  chunked.scheduler.max_chunk = 3;
  chunked.scheduler.max_step_tokens = 40;
  chunked.block_size = 4;
  EngineOptions no_prefix = chunked;
  no_prefix.prefix_caching = false;
  EngineOptions preempting = batched;
  preempting.block_size = 4;
  preempting.kv_blocks = 24;  // 96 positions for 32 requests of up to 68: constant preemption
  preempting.scheduler.max_chunk = 8;
  return {{"batched", batched}, {"small chunks", chunked}, {"no prefix caching", no_prefix}, {"preemption", preempting}};
}

// `prompts` each run alone (one engine per request, `alone_options`) against all together under
// each of `cases`.
void expect_served_as_alone(models::CausalLM& model, backend::Context& ctx,
                            const std::vector<std::vector<int32_t>>& prompts, const std::vector<int64_t>& max_new,
                            const EngineOptions& alone_options, const std::vector<ServingCase>& cases) {
  std::vector<EngineResult> alone;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    Engine e(model, ctx, alone_options);
    e.submit(greedy_request(prompts[i], max_new[i]));
    alone.push_back(engine_run_all(e).begin()->second);
    ASSERT_EQ(alone.back().finish, FinishReason::kLength);
    ASSERT_EQ(alone.back().routed_rows, static_cast<int64_t>(prompts[i].size() + alone.back().tokens.size()) - 1);
  }
  for (const ServingCase& c : cases) {
    SCOPED_TRACE(c.name);
    Engine e(model, ctx, c.options);
    std::vector<RequestId> ids;
    for (std::size_t i = 0; i < prompts.size(); ++i) ids.push_back(e.submit(greedy_request(prompts[i], max_new[i])));
    const EngineResults together = engine_run_all(e);
    ASSERT_EQ(together.size(), prompts.size());
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      const EngineResult& r = together.at({ids[i], 0});
      EXPECT_EQ(r.tokens, alone[i].tokens) << "request " << i;
      EXPECT_EQ(r.routed, alone[i].routed) << "request " << i;
    }
    const auto stats = e.stats();
    EXPECT_EQ(stats.kv_blocks_free, stats.kv_blocks_total) << "blocks not returned";
    EXPECT_GT(stats.max_batch_sequences, 1);
    // Under expert parallelism the rows did travel to other ranks' experts.
    if (c.options.expert_parallel > 1) {
      EXPECT_GT(stats.expert_rows_exchanged, 0);
    }
    if (std::string(c.name) == "preemption") {
      EXPECT_GT(stats.preemptions, 0);
    }
    if (std::string(c.name) == "small chunks" && e.options().prefix_caching) {
      EXPECT_GT(stats.prefix_blocks_hit, 0);
    }
  }
}

void expect_captured_before_the_failed_map(const moe::RoutingCapturer& capturer, int64_t layer,
                                           const std::vector<int32_t>& expected, int64_t layers, int64_t k) {
  ASSERT_TRUE(capturer.recorded(layer));
  for (int64_t t = 0; t < capturer.tokens(); ++t) {
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(capturer.id(t, layer, j), expected[static_cast<std::size_t>((t * layers + layer) * k + j)]);
    }
  }
  if (layer + 1 < layers) {
    EXPECT_FALSE(capturer.recorded(layer + 1));  // the step stopped at this layer
  }
}

}  // namespace r3::test
