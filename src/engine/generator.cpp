#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>

#include "core/checked.h"

#include "engine/finite_logits.h"
#include "engine/step_runner.h"

namespace r3::engine {

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

GenerateResult generate(models::CausalLM& model, backend::Context& ctx, const std::vector<int32_t>& prompt,
                        const GenerateOptions& options) {
  const models::ModelInfo& info = model.info();
  R3_CHECK(!prompt.empty(), "the prompt is empty: give at least one token id");
  R3_CHECK(options.max_new_tokens >= 1, "max new tokens must be >= 1, got ", options.max_new_tokens);
  options.sampling.validate();
  const auto prompt_len = static_cast<int64_t>(prompt.size());
  // The cache is sized for the whole run up front: bound it by the positions the model has.
  const int64_t total = checked_add(prompt_len, options.max_new_tokens, "prompt + max new tokens");
  R3_CHECK(info.max_position_embeddings <= 0 || total <= info.max_position_embeddings, "a prompt of ", prompt_len,
           " tokens + ", options.max_new_tokens, " new tokens exceeds the model's max_position_embeddings of ",
           info.max_position_embeddings);
  const RoutingReplay* replay = options.replay;
  if (replay != nullptr) {
    // Only the prompt's rows are certainly needed: a replayed run that stopped at EOS has
    // prompt + generated - 1 rows, fewer than max_new_tokens allows, and this run stops at the
    // same EOS. More rows than the run can ever use means the file belongs to another run.
    const int64_t usable = prompt_len + options.max_new_tokens - 1;
    R3_CHECK(replay->rows >= prompt_len, replay->path, ": the replayed routing has ", replay->rows,
             " rows, fewer than the ", prompt_len, " prompt tokens");
    R3_CHECK(replay->rows <= usable, replay->path, ": the replayed routing has ", replay->rows,
             " rows, more than the ", usable, " that ", prompt_len, " prompt tokens and ",
             options.max_new_tokens, " new tokens can use (prompt + max-new-tokens - 1)");
  }

  auto cache = model.make_cache(1, total);
  StepRunner runner(model, ctx, *cache, prompt_len);
  Sampler sampler(options.sampling);
  GenerateResult result{prompt, {}, RoutedExperts(static_cast<int64_t>(info.moe_layers.size()), info.top_k), {}};
  auto forced_rows = [&](int64_t first, int64_t count) {
    return replay ? replay->slice(first, count) : std::vector<int32_t>{};
  };

  auto start = std::chrono::steady_clock::now();
  Tensor logits = runner.run({{0, prompt, &result.routed_experts, forced_rows(0, prompt_len)}});
  result.timings.prefill_seconds = seconds_since(start);
  result.timings.prefill_tokens = prompt_len;

  start = std::chrono::steady_clock::now();
  for (;;) {
    check_finite_logits(logits, prompt_len + static_cast<int64_t>(result.output_ids.size()) - 1);
    const int32_t token =
        sampler.next(std::span<const float>(logits.data<float>(), static_cast<std::size_t>(logits.dim(1))));
    result.output_ids.push_back(token);
    const bool stop = std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), token) !=
                      options.stop_token_ids.end();
    if (stop || static_cast<int64_t>(result.output_ids.size()) >= options.max_new_tokens) break;
    // Decode: the new token is the next input; its routing is the next row.
    const int64_t row = prompt_len + static_cast<int64_t>(result.output_ids.size()) - 1;
    R3_CHECK(replay == nullptr || row < replay->rows, replay->path,
             ": generation went past the replayed routing: token ", row, " needs row ", row,
             ", the replay has ", replay->rows, " rows (the replayed run ended there, e.g. at EOS)");
    logits = runner.run({{0, {token}, &result.routed_experts, forced_rows(row, 1)}});
    ++result.timings.decode_steps;
  }
  result.timings.decode_seconds = seconds_since(start);
  return result;
}

}  // namespace r3::engine
