#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <span>

namespace r3::engine {

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

GenerateResult generate(const models::DecoderModel& model, ThreadPool& pool,
                        const std::vector<int32_t>& prompt, const GenerateOptions& options) {
  const models::ModelInfo& info = model.info();
  R3_CHECK(!prompt.empty(), "the prompt is empty: give at least one token id");
  R3_CHECK(options.max_new_tokens >= 1, "max new tokens must be >= 1, got ",
           options.max_new_tokens);
  options.sampling.validate();

  const auto prompt_len = static_cast<int64_t>(prompt.size());
  models::KvCache cache = model.make_kv_cache(1, prompt_len + options.max_new_tokens);
  moe::RoutingCapture capture(static_cast<int64_t>(info.moe_layers.size()), info.top_k);
  Sampler sampler(options.sampling);
  GenerateResult result{prompt, {}, RoutedExperts(capture.num_moe_layers(), info.top_k), {}};

  // Prefill: logits for the last prompt token only.
  auto start = std::chrono::steady_clock::now();
  models::ForwardBatch batch = models::ForwardBatch::sequence(prompt, 0);
  batch.logit_rows = {prompt_len - 1};
  capture.begin_step(prompt_len);
  Tensor logits = model.forward(pool, batch, cache, &capture);
  capture.end_step();
  result.routed_experts.append(capture, 0, prompt_len);
  result.timings.prefill_seconds = seconds_since(start);
  result.timings.prefill_tokens = prompt_len;

  start = std::chrono::steady_clock::now();
  for (;;) {
    const int32_t token = sampler.next(std::span<const float>(logits.data<float>(),
                                                              static_cast<std::size_t>(logits.dim(1))));
    result.output_ids.push_back(token);
    const bool stop = std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(),
                                token) != options.stop_token_ids.end();
    if (stop || static_cast<int64_t>(result.output_ids.size()) >= options.max_new_tokens) break;
    // Decode: the new token is the next input; its routing is the next row.
    batch = models::ForwardBatch::sequence({token}, static_cast<int32_t>(cache.length(0)));
    capture.begin_step(1);
    logits = model.forward(pool, batch, cache, &capture);
    capture.end_step();
    result.routed_experts.append(capture, 0, 1);
    ++result.timings.decode_steps;
  }
  result.timings.decode_seconds = seconds_since(start);
  return result;
}

}  // namespace r3::engine
