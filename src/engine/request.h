// What a caller asks of the engine for one request, and what it gets back step by step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/logprobs.h"
#include "engine/sampler.h"

namespace r3::engine {

using RequestId = int64_t;

struct RequestParams {
  std::vector<int32_t> prompt;  // token ids
  SamplingParams sampling;      // temperature, top-p, top-k, min-p, seed
  int64_t max_new_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // ends the sample after emitting one (the model's EOS too, unless ignore_eos)
  bool ignore_eos = false;
  int64_t n = 1;  // samples of this prompt; sample i draws with sample_seed(seed, i)
  // Log-probabilities of the model's raw distribution: -1 none, 0 the sampled token's, k > 0
  // also the k most likely tokens of each step.
  int64_t logprobs = -1;
  bool prompt_logprobs = false;  // the log-probability of each prompt token after its prefix
  bool return_routed_experts = false;
  int64_t routed_experts_start = 0;  // first row returned
  // Also each returned row's routing margin per MoE layer (moe/routing_rule.h).
  bool return_routing_margins = false;
  // Replay: [rows, MoE layers, top_k] logical ids forced while token `row` is the input. Rows
  // must cover the prompt; a sample that needs a row beyond them ends with kAbort.
  std::vector<int32_t> forced_routing;
};

enum class FinishReason { kNone, kLength, kStop, kAbort };
const char* finish_reason_name(FinishReason reason);

// What one sample produced since the last output of its request (streaming), and at the end
// its finish reason and (when asked) the routed experts of every row from routed_experts_start.
struct SampleOutput {
  int64_t index = 0;  // sample index in [0, n)
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;                         // with logprobs >= 0: one per token
  std::vector<std::vector<TokenLogprob>> top_logprobs;  // with logprobs > 0: one list per token
  FinishReason finish = FinishReason::kNone;
  int32_t matched_stop = -1;  // kStop: the token that stopped it
  std::string abort_message;  // kAbort: why
  // Final output only: ids [rows, MoE layers, top_k], rows = prompt + outputs - 1 - start.
  std::vector<int32_t> routed_experts;
  int64_t routed_rows = 0;
  // With return_routing_margins: [routed_rows, MoE layers], the rows of routed_experts.
  std::vector<float> routing_margins;
  int64_t cached_prompt_tokens = 0;  // final output only: prompt tokens served by the prefix cache
};

struct RequestOutput {
  RequestId id = 0;
  std::vector<SampleOutput> samples;  // the samples that progressed this step
  // First output only, with prompt_logprobs: entry i is the log-probability of prompt token i + 1.
  std::vector<float> prompt_logprobs;
  bool finished = false;  // every sample has finished
};

}  // namespace r3::engine
