// Single-sequence generation: one prefill over the prompt, then one decode step per new token
// through the KV cache, collecting the routed experts of every input token. With a replayed
// routing, row i of it is forced while token i is the model input.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/context.h"
#include "engine/routed_experts.h"
#include "engine/routing_replay.h"
#include "engine/sampler.h"
#include "models/causal_lm.h"

namespace r3::engine {

struct GenerateOptions {
  int64_t max_new_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // generation ends after emitting one of these
  const RoutingReplay* replay = nullptr;
};

struct GenerateTimings {
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_steps = 0;
};

struct GenerateResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;
  RoutedExperts routed_experts;  // rows = prompt + output - 1
  GenerateTimings timings;
};

GenerateResult generate(models::CausalLM& model, backend::Context& ctx, const std::vector<int32_t>& prompt,
                        const GenerateOptions& options);

}  // namespace r3::engine
