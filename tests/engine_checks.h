// The serving engine's exactness checks, shared by the CPU suite (test_engine.cpp) and the GPU
// one (gpu/test_gpu_parity.cpp): run requests through an engine and gather what streamed out,
// and check every request is bit-identical alone and served with others.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "backend/context.h"
#include "engine/engine.h"
#include "models/causal_lm.h"
#include "moe/routing_capturer.h"

namespace r3::test {

// What one sample ended with.
struct EngineResult {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<engine::TokenLogprob>> top;
  std::vector<int32_t> routed;
  int64_t routed_rows = 0;
  std::vector<float> margins;  // with return_routing_margins
  engine::FinishReason finish = engine::FinishReason::kNone;
  int32_t matched_stop = -1;
  int64_t cached_prompt_tokens = 0;
  std::string abort_message;
};
using EngineResults = std::map<std::pair<engine::RequestId, int64_t>, EngineResult>;

// Runs the engine until every request has finished, gathering the streamed outputs.
EngineResults engine_run_all(engine::Engine& e);
// Submits `p` alone to `e`, runs it to the end and returns what its first sample ended with.
EngineResult run_one(engine::Engine& e, const engine::RequestParams& p);

// Prompts of random lengths in [1, 40], half of them starting with a shared 20-token prefix.
std::vector<std::vector<int32_t>> engine_prompts(int count, int64_t vocab, uint32_t seed);

// Greedy, EOS ignored, routed experts returned.
engine::RequestParams greedy_request(std::vector<int32_t> prompt, int64_t max_new);

struct ServingCase {
  const char* name;
  engine::EngineOptions options;
};
// Batched; small prefill chunks; the same without prefix caching; constant preemption.
std::vector<ServingCase> serving_cases();

// `prompts` each run alone (one engine per request, `alone_options`) against all together under
// each of `cases`, on ctx: tokens and routed experts equal, every block returned.
void expect_served_as_alone(models::CausalLM& model, backend::Context& ctx,
                            const std::vector<std::vector<int32_t>>& prompts, const std::vector<int64_t>& max_new,
                            const engine::EngineOptions& alone_options, const std::vector<ServingCase>& cases);

// After a step stopped by a failing EPLB map in MoE layer `layer`: the capturer holds that
// layer's logical ids, equal to `expected` ([T, layers, k] rows of an unbroken run), and not the
// next layer's (capture happens before the map).
void expect_captured_before_the_failed_map(const moe::RoutingCapturer& capturer, int64_t layer,
                                           const std::vector<int32_t>& expected, int64_t layers, int64_t k);

}  // namespace r3::test
