#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>

#include "core/checked.h"

#include "engine/engine.h"

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

  // One request through the engine: the whole prompt in one step (its split would otherwise
  // depend on the step budget, and DeepSeek-V4's rows can depend on the split).
  EngineOptions engine_options;
  engine_options.max_model_len = total;
  engine_options.scheduler.max_running = 1;
  engine_options.scheduler.max_step_tokens = std::max<int64_t>(prompt_len, 1);
  engine_options.prefix_caching = false;
  Engine engine(model, ctx, engine_options);
  RequestParams request;
  request.prompt = prompt;
  request.sampling = options.sampling;
  request.max_new_tokens = options.max_new_tokens;
  request.stop_token_ids = options.stop_token_ids;
  request.ignore_eos = true;  // the caller's stop ids are the whole stop rule
  request.return_routed_experts = true;
  if (replay != nullptr) request.forced_routing = replay->ids;
  engine.submit(std::move(request));

  GenerateResult result{prompt, {}, RoutedExperts(static_cast<int64_t>(info.moe_layers.size()), info.top_k), {}};
  auto start = std::chrono::steady_clock::now();
  bool first = true;
  while (engine.has_work()) {
    for (const RequestOutput& out : engine.step()) {
      for (const SampleOutput& s : out.samples) {
        result.output_ids.insert(result.output_ids.end(), s.token_ids.begin(), s.token_ids.end());
        if (s.finish == FinishReason::kAbort) {
          R3_FAIL(replay != nullptr && s.abort_message.rfind("generation went past", 0) == 0 ? replay->path + ": " : "",
                  s.abort_message);
        }
        if (s.finish != FinishReason::kNone) result.routed_experts.assign(s.routed_experts);
      }
    }
    if (first) {
      result.timings.prefill_seconds = seconds_since(start);
      result.timings.prefill_tokens = prompt_len;
      start = std::chrono::steady_clock::now();
      first = false;
    } else {
      ++result.timings.decode_steps;
    }
  }
  result.timings.decode_seconds = seconds_since(start);
  return result;
}

}  // namespace r3::engine
