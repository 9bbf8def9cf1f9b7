#include "cli/engine_cli_options.h"

#include "cli/option_checks.h"

namespace r3::cli {

void EngineCliOptions::add_to(CLI::App& command) {
  auto& s = engine.scheduler;
  command.add_option("--max-running", s.max_running, "Most sequences in one step (continuous batching)")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
  command.add_option("--max-step-tokens", s.max_step_tokens, "Most tokens in one step (prefill chunks and decodes)")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
  command.add_option("--max-chunk", s.max_chunk, "Most prompt tokens of one sequence per step; 0 = the step budget")
      ->capture_default_str()
      ->check(at_least<int64_t>(0));
  command.add_option("--max-waiting", s.max_waiting, "Most samples waiting for admission")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
  command.add_option("--block-size", engine.block_size, "Positions per KV block")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
  command.add_option("--kv-blocks", engine.kv_blocks,
                     "KV blocks in the pool; 0 = enough for --max-running sequences of the model's length")
      ->capture_default_str()
      ->check(at_least<int64_t>(0));
  command.add_flag("--no-prefix-caching", no_prefix_caching, "Do not reuse KV blocks of earlier prompts");
  command.add_option("--ep", engine.expert_parallel,
                     "Expert-parallel ranks (CPU: threads of this process): each runs its share of the requests "
                     "and a slice of the experts; the scheduler and KV options apply to each rank")
      ->capture_default_str()
      ->check(at_least<int>(1));
}

engine::EngineOptions EngineCliOptions::options() const {
  engine::EngineOptions o = engine;
  o.prefix_caching = !no_prefix_caching;
  return o;
}

}  // namespace r3::cli
