// `r3 bench`: offline throughput of the serving engine on a model folder. Random prompts (sharing
// a prefix when asked) all arrive at once, are decoded greedily to a fixed length with their
// routed experts captured, and the report says how fast that went, how well steps were batched
// and the prefix cache used, and how long a request waited.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/engine_cli_options.h"
#include "cli/model_options.h"
#include "cli/option_checks.h"
#include "cli/synthetic_bench.h"
#include "core/check.h"
#include "core/progress.h"
#include "engine/engine.h"
#include "models/device_decoder.h"

namespace r3::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

struct BenchCommandOptions {
  ModelOptions model;
  EngineCliOptions engine;
  int64_t num_prompts = 64;
  int64_t prompt_len = 128;
  int64_t output_len = 64;
  double shared_prefix = 0;
  uint64_t seed = 0;
  bool json = false;
  std::string synthetic;  // a model shape to make on the GPU instead of --model
  std::string synthetic_weights = "bf16";
  std::vector<int64_t> synthetic_batches = {1, 8, 64, 256};
  int64_t synthetic_context = 1024;  // cached positions per sequence in --synthetic's decode steps
  bool synthetic_engine = false;      // --synthetic's model through the serving engine (and --ep's ranks)

  int64_t prefix_len() const {
    return static_cast<int64_t>(std::llround(shared_prefix * static_cast<double>(prompt_len)));
  }
};

// num_prompts prompts of prompt_len ids in [0, vocab) whose first prefix_len() ids are the same in
// all. Ids are rng() % vocab, not a std:: distribution (whose draws differ between standard
// libraries), so a seed means the same prompts everywhere; the modulo bias is immaterial here.
std::vector<std::vector<int32_t>> make_prompts(const BenchCommandOptions& o, int64_t vocab) {
  std::mt19937_64 rng(o.seed);
  auto next_id = [&] { return static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)); };
  std::vector<int32_t> prefix(static_cast<std::size_t>(o.prefix_len()));
  for (int32_t& id : prefix) id = next_id();
  std::vector<std::vector<int32_t>> prompts(static_cast<std::size_t>(o.num_prompts), prefix);
  for (auto& prompt : prompts) {
    prompt.reserve(static_cast<std::size_t>(o.prompt_len));
    while (static_cast<int64_t>(prompt.size()) < o.prompt_len) prompt.push_back(next_id());
  }
  return prompts;
}

// What the run measured; the engine's own counters are in `stats`.
struct BenchResult {
  int64_t requests = 0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_prompt_tokens = 0;
  double wall_seconds = 0;
  int64_t peak_blocks_in_use = 0;
  double mean_ttft_seconds = 0;     // submit to first output token
  double mean_latency_seconds = 0;  // submit to finish
  engine::EngineStats stats;
};

struct RequestTimes {
  Clock::time_point submitted, first_token, finished;
  bool started = false;
};

// Submits every prompt, then steps the engine until all have finished.
BenchResult run_requests(engine::Engine& eng, std::vector<std::vector<int32_t>> prompts, int64_t output_len) {
  BenchResult result;
  result.requests = static_cast<int64_t>(prompts.size());
  std::unordered_map<engine::RequestId, RequestTimes> times;
  // All requests are submitted before the first step (the caller made the waiting queue long
  // enough): an offline benchmark is a burst arriving at once, the scheduler sees all of it, and
  // a request's latency includes its wait behind the earlier ones.
  const Clock::time_point start = Clock::now();
  for (auto& prompt : prompts) {
    result.prompt_tokens += static_cast<int64_t>(prompt.size());
    engine::RequestParams p;
    p.prompt = std::move(prompt);
    p.sampling.temperature = 0;
    p.max_new_tokens = output_len;
    p.ignore_eos = true;               // every request runs to exactly output_len tokens
    p.return_routed_experts = true;    // capture is the engine's point: its cost counts
    const Clock::time_point now = Clock::now();
    times[eng.submit(std::move(p))].submitted = now;
  }
  {
    Progress progress("bench", static_cast<uint64_t>(result.requests), "requests", 1.0,
                      std::chrono::milliseconds(500), std::chrono::milliseconds(500));
    while (eng.has_work()) {
      const std::vector<engine::RequestOutput> outputs = eng.step();
      const Clock::time_point now = Clock::now();
      uint64_t finished = 0;
      for (const auto& out : outputs) {
        RequestTimes& t = times.at(out.id);
        for (const auto& s : out.samples) {
          result.output_tokens += static_cast<int64_t>(s.token_ids.size());
          if (!s.token_ids.empty() && !t.started) {
            t.first_token = now;
            t.started = true;
          }
          if (s.finish == engine::FinishReason::kNone) continue;
          R3_CHECK(s.finish == engine::FinishReason::kLength, "bench request ", out.id, " ended early (",
                   engine::finish_reason_name(s.finish), s.abort_message.empty() ? "" : ": ", s.abort_message,
                   ")");
          result.cached_prompt_tokens += s.cached_prompt_tokens;
        }
        if (out.finished) {
          t.finished = now;
          ++finished;
        }
      }
      // Blocks held after the step: a sequence that finished in the step has already let go.
      const engine::EngineStats stats = eng.stats();
      result.peak_blocks_in_use = std::max(result.peak_blocks_in_use, stats.kv_blocks_total - stats.kv_blocks_free);
      const double elapsed = seconds_between(start, now);
      progress.set_detail(fmt::format("{:.0f} output tokens/s",
                                      elapsed > 0 ? static_cast<double>(result.output_tokens) / elapsed : 0.0));
      progress.advance(finished);  // also with 0: the rate is redrawn while requests are running
    }
  }
  result.wall_seconds = seconds_between(start, Clock::now());
  result.stats = eng.stats();
  double ttft = 0, latency = 0;
  for (const auto& [id, t] : times) {
    ttft += seconds_between(t.submitted, t.first_token);
    latency += seconds_between(t.submitted, t.finished);
  }
  result.mean_ttft_seconds = ttft / static_cast<double>(times.size());
  result.mean_latency_seconds = latency / static_cast<double>(times.size());
  return result;
}

double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

nlohmann::json to_json(const BenchResult& r) {
  const engine::EngineStats& s = r.stats;
  return {
      {"requests", r.requests},
      {"prompt_tokens", r.prompt_tokens},
      {"output_tokens", r.output_tokens},
      {"wall_seconds", r.wall_seconds},
      {"total_tokens_per_second", ratio(static_cast<double>(r.prompt_tokens + r.output_tokens), r.wall_seconds)},
      {"output_tokens_per_second", ratio(static_cast<double>(r.output_tokens), r.wall_seconds)},
      {"prompt_tokens_computed", s.prompt_tokens_computed},
      {"prompt_tokens_cached", r.cached_prompt_tokens},
      {"prefix_blocks_looked_up", s.prefix_blocks_looked_up},
      {"prefix_blocks_hit", s.prefix_blocks_hit},
      {"prefix_hit_rate",
       ratio(static_cast<double>(s.prefix_blocks_hit), static_cast<double>(s.prefix_blocks_looked_up))},
      {"steps", s.steps},
      {"mean_sequences_per_step", ratio(static_cast<double>(s.batch_sequences_sum), static_cast<double>(s.steps))},
      {"max_sequences_per_step", s.max_batch_sequences},
      {"preemptions", s.preemptions},
      {"peak_kv_blocks_in_use", r.peak_blocks_in_use},
      {"kv_blocks_total", s.kv_blocks_total},
      {"step_seconds", s.step_seconds},
      {"max_step_seconds", s.max_step_seconds},
      {"routed_seconds", s.routed_seconds},
      {"routed_share", ratio(s.routed_seconds, s.step_seconds)},
      {"mean_ttft_seconds", r.mean_ttft_seconds},
      {"mean_latency_seconds", r.mean_latency_seconds},
      {"expert_rows_exchanged", s.expert_rows_exchanged},
      {"expert_weight_bytes_moved", s.expert_weight_bytes_moved},
  };
}

void print_report(const BenchResult& r) {
  const engine::EngineStats& s = r.stats;
  const auto f = [](int64_t v) { return static_cast<double>(v); };
  fmt::print("requests:              {}\n", r.requests);
  fmt::print("prompt tokens:         {}\n", r.prompt_tokens);
  fmt::print("output tokens:         {}\n", r.output_tokens);
  // Computed counts recomputes after preemption too, so computed + cached can exceed the prompts.
  fmt::print("prefill:               {} tokens computed, {} prompt tokens cached; prefix-hit rate {:.1f}% "
             "({} of {} blocks)\n",
             s.prompt_tokens_computed, r.cached_prompt_tokens,
             100 * ratio(f(s.prefix_blocks_hit), f(s.prefix_blocks_looked_up)), s.prefix_blocks_hit,
             s.prefix_blocks_looked_up);
  fmt::print("wall time:             {:.3f} s\n", r.wall_seconds);
  fmt::print("throughput:            {:.1f} tokens/s total, {:.1f} output tokens/s\n",
             ratio(f(r.prompt_tokens + r.output_tokens), r.wall_seconds), ratio(f(r.output_tokens), r.wall_seconds));
  fmt::print("steps:                 {} (sequences per step: mean {:.2f}, max {}; longest {:.1f} ms)\n", s.steps,
             ratio(f(s.batch_sequences_sum), f(s.steps)), s.max_batch_sequences, 1e3 * s.max_step_seconds);
  fmt::print("preemptions:           {}\n", s.preemptions);
  fmt::print("peak KV blocks in use: {} of {}\n", r.peak_blocks_in_use, s.kv_blocks_total);
  fmt::print("routed-experts share:  {:.1f}% of step time ({:.3f} of {:.3f} s)\n",
             100 * ratio(s.routed_seconds, s.step_seconds), s.routed_seconds, s.step_seconds);
  fmt::print("mean time to first token: {:.1f} ms\n", 1e3 * r.mean_ttft_seconds);
  fmt::print("mean request latency:     {:.1f} ms\n", 1e3 * r.mean_latency_seconds);
  if (s.expert_rows_exchanged > 0) {
    fmt::print("expert parallelism:       {} (token, choice) rows sent to another rank's experts\n",
               s.expert_rows_exchanged);
  }
  if (s.expert_weight_bytes_moved > 0) {
    fmt::print("EPLB weight moves:        {:.1f} MB of expert weights sent between ranks\n",
               f(s.expert_weight_bytes_moved) / 1e6);
  }
}

int run_bench(const BenchCommandOptions& options) {
  R3_CHECK(options.synthetic.empty() || options.synthetic_engine || options.engine.engine.expert_parallel == 1,
           "--ep runs requests through the engine's ranks; --synthetic times whole model steps on one device "
           "(add --synthetic-engine to serve its model through the engine)");
  auto ctx = options.model.make_context();
  if (!options.synthetic.empty() && !options.synthetic_engine) {
    return run_synthetic_bench(*ctx, options.synthetic, options.synthetic_weights, options.synthetic_batches,
                               options.synthetic_context, options.json);
  }
  std::unique_ptr<models::CausalLM> model;
  engine::PlaceRank place_rank;
  if (!options.synthetic.empty()) {
    // Every rank makes the same random model (one seed) on its own GPU.
    R3_CHECK(ctx->device() == Device::kCuda, "--synthetic makes its weights on the GPU: add --device cuda");
    models::SyntheticShape shape = models::SyntheticShape::named(options.synthetic);
    shape.fp8 = options.synthetic_weights == "fp8";
    model = models::synthetic_on_device(*ctx, shape);
    place_rank = [shape, &model_options = options.model](int rank) {
      engine::PlacedRank placed;
      placed.ctx = model_options.make_cuda_context(rank % backend::Context::cuda_device_count());
      placed.model = models::synthetic_on_device(*placed.ctx, shape);
      return placed;
    };
  } else {
    R3_CHECK(!options.model.model_dir.empty(), "give --model DIR (or --synthetic NAME with --device cuda)");
    const int ranks = options.engine.engine.expert_parallel;
    model = options.model.load(*ctx, 0, ranks);
    place_rank = options.model.rank_placer(ranks);
  }
  const auto& info = model->info();
  // Checked here with the options' names; the engine checks again with its own.
  const int64_t positions_max = info.max_position_embeddings;
  R3_CHECK(positions_max <= 0 || options.output_len <= positions_max - options.prompt_len, "--prompt-len ",
           options.prompt_len, " + --output-len ", options.output_len,
           " exceeds the model's max_position_embeddings of ", positions_max, " positions");
  engine::EngineOptions engine_options = options.engine.options();
  auto& max_waiting = engine_options.scheduler.max_waiting;
  if (max_waiting < options.num_prompts) {
    spdlog::info("bench: --max-waiting raised from {} to {} so that all prompts queue at once", max_waiting,
                 options.num_prompts);
    max_waiting = options.num_prompts;
  }
  engine::Engine eng(*model, *ctx, engine_options, place_rank);
  const engine::EngineOptions& used = eng.options();  // with the pool size the engine chose
  const int64_t positions = options.prompt_len + options.output_len;
  const int64_t blocks = (positions + used.block_size - 1) / used.block_size;
  R3_CHECK(blocks <= used.kv_blocks, "--prompt-len + --output-len of ", positions, " positions need ", blocks,
           " KV blocks of --block-size ", used.block_size, ", more than the ", used.kv_blocks, " of --kv-blocks");
  spdlog::info("bench: {} prompts of {} tokens ({} shared), {} output tokens each; max {} running, {} KV blocks "
               "of {}, prefix caching {}, {} threads, {} expert-parallel rank(s)",
               options.num_prompts, options.prompt_len, options.prefix_len(), options.output_len,
               used.scheduler.max_running, used.kv_blocks, used.block_size, used.prefix_caching ? "on" : "off",
               ctx->threads().size(), used.expert_parallel);

  const BenchResult result = run_requests(eng, make_prompts(options, info.vocab_size), options.output_len);
  if (options.json) {
    fmt::print("{}\n", to_json(result).dump());
  } else {
    print_report(result);
  }
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto options = std::make_shared<BenchCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Offline throughput of the serving engine: random prompts, all at once, greedy to a fixed length");
  options->model.add_to(*cmd, /*model_required=*/false);
  options->engine.add_to(*cmd);
  cmd->add_option("--synthetic", options->synthetic,
                  "Instead of --model: whole decode steps of this model shape with random weights made on the "
                  "GPU (qwen3-30b-a3b), against the bandwidth floor (needs --device cuda)")
      ->excludes("--model");
  cmd->add_option("--synthetic-weights", options->synthetic_weights,
                  "--synthetic's attention and expert matrices: bf16, or fp8 (e4m3 with a float32 scale per "
                  "128x128 block, as Qwen3-30B-A3B-FP8 is published)")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "fp8"}))
      ->needs("--synthetic");
  cmd->add_option("--synthetic-batches", options->synthetic_batches, "Decode batch sizes of --synthetic")
      ->delimiter(',')
      ->capture_default_str()
      ->check(at_least<int64_t>(1))
      ->needs("--synthetic");
  cmd->add_option("--synthetic-context", options->synthetic_context,
                  "Context of each sequence in --synthetic's decode steps (positions already cached + 1)")
      ->capture_default_str()
      ->check(at_least<int64_t>(1))
      ->needs("--synthetic");
  cmd->add_flag("--synthetic-engine", options->synthetic_engine,
               "Serve --synthetic's model through the engine instead (random prompts of --prompt-len, "
               "--output-len, --ep ranks each making the same model on its GPU): step times as for --model")
      ->needs("--synthetic");
  cmd->add_option("--num-prompts", options->num_prompts, "Requests to run")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
  cmd->add_option("--prompt-len", options->prompt_len, "Tokens per prompt")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
  cmd->add_option("--output-len", options->output_len, "Tokens generated per request (EOS ignored)")
      ->capture_default_str()
      ->check(at_least<int64_t>(1));
  cmd->add_option("--shared-prefix", options->shared_prefix,
                  "Fraction of each prompt that is a prefix common to all prompts")
      ->capture_default_str()
      ->check(in_closed(0.0, 1.0));
  cmd->add_option("--seed", options->seed, "Seed of the random prompt token ids")->capture_default_str();
  cmd->add_flag("--json", options->json, "Print the figures as one JSON object instead of the text report");
  return [options] { return run_bench(*options); };
}

}  // namespace r3::cli
